//! Large binary and string values of a Parquet input read as views of their
//! pages, then copied once into the arrays the rest of `shard` takes.
//!
//! parquet's reader builds a `Binary` or `Utf8` array by appending each
//! value to a buffer that grows page by page: every growth copies the
//! values read so far into fresh memory, so a batch of large values (images,
//! documents) is copied one and a half times on average, into memory faulted
//! in for it. Read as `BinaryView` or `Utf8View` instead, a `PLAIN` page's
//! values stay in the page and the array holds views of them; [`unview`] then
//! copies them once into a buffer of their exact size. On the blob set of
//! docs/performance-notes.md, `shard --no-shuffle` took 12% less CPU and wall time.
//! Only the columns whose values are large take this path (those
//! `BinaryColumns` stores as they are or writes without a dictionary): short
//! values sit inside their views, and would be copied twice for nothing.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, BinaryViewArray, GenericBinaryArray, GenericStringArray, OffsetSizeTrait,
    RecordBatch, StructArray,
};
use arrow_buffer::{Buffer, NullBuffer, OffsetBuffer};
use arrow_schema::{ArrowError, DataType, Field, Fields, Schema, SchemaRef};
use parquet::schema::types::ColumnPath;

/// `schema` with the binary and string fields at `paths` (top-level fields,
/// or fields of structs) as views; `None` where none of them is there.
pub(crate) fn viewed_schema(schema: &SchemaRef, paths: &[ColumnPath]) -> Option<SchemaRef> {
    if paths.is_empty() {
        return None;
    }
    let mut any = false;
    let fields: Vec<Field> = (schema.fields().iter())
        .map(|f| viewed_field(f, &mut Vec::new(), paths, &mut any))
        .collect();
    any.then(|| Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())))
}

/// `field` (at `path`, its parents' names) with its type as a view where
/// `paths` names it, and its struct children's likewise.
fn viewed_field(
    field: &Field,
    path: &mut Vec<String>,
    paths: &[ColumnPath],
    any: &mut bool,
) -> Field {
    path.push(field.name().clone());
    let named = || paths.iter().any(|p| p.parts() == path.as_slice());
    let data_type = match field.data_type() {
        DataType::Binary | DataType::LargeBinary if named() => {
            *any = true;
            DataType::BinaryView
        }
        DataType::Utf8 | DataType::LargeUtf8 if named() => {
            *any = true;
            DataType::Utf8View
        }
        DataType::Struct(children) => DataType::Struct(
            children
                .iter()
                .map(|c| viewed_field(c, path, paths, any))
                .collect::<Fields>(),
        ),
        other => other.clone(),
    };
    path.pop();
    field.clone().with_data_type(data_type)
}

/// `batch`, read with a [`viewed_schema`], as the same rows in `schema` (the
/// file's own): each view column copied once into an array of its type.
pub(crate) fn unview(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    let columns = (batch.columns().iter().zip(schema.fields()))
        .map(|(column, field)| unview_array(column, field.data_type()))
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns)
}

/// `array` as an array of `data_type` (views copied into offsets and bytes,
/// a struct's children likewise; other arrays as they are).
fn unview_array(array: &ArrayRef, data_type: &DataType) -> Result<ArrayRef, ArrowError> {
    Ok(match (array.data_type(), data_type) {
        (DataType::BinaryView, DataType::Binary) => binary::<i32>(array.as_binary_view())?,
        (DataType::BinaryView, DataType::LargeBinary) => binary::<i64>(array.as_binary_view())?,
        (DataType::Utf8View, DataType::Utf8) => string::<i32>(array)?,
        (DataType::Utf8View, DataType::LargeUtf8) => string::<i64>(array)?,
        (DataType::Struct(_), DataType::Struct(fields)) => {
            let parent = array.as_struct();
            let children = (parent.columns().iter().zip(fields))
                .map(|(child, field)| unview_array(child, field.data_type()))
                .collect::<Result<Vec<_>, _>>()?;
            Arc::new(StructArray::try_new(
                fields.clone(),
                children,
                parent.nulls().cloned(),
            )?)
        }
        _ => array.clone(),
    })
}

/// The values of `array` copied into one buffer of their total size: its
/// offsets, bytes and nulls.
fn copied<O: OffsetSizeTrait>(
    array: &BinaryViewArray,
) -> Result<(OffsetBuffer<O>, Buffer, Option<NullBuffer>), ArrowError> {
    // A view's low 32 bits are its value's length (a null's is 0, and its
    // value is not copied).
    let total: u64 = array.views().iter().map(|&v| u64::from(v as u32)).sum();
    let too_large = || {
        ArrowError::ComputeError(format!(
            "{total} bytes of values in one batch, past what {} offsets address",
            std::mem::size_of::<O>() * 8
        ))
    };
    let capacity = usize::try_from(total)
        .ok()
        .filter(|&t| O::from_usize(t).is_some())
        .ok_or_else(too_large)?;
    let mut values = Vec::with_capacity(capacity);
    let mut offsets = Vec::with_capacity(array.len() + 1);
    offsets.push(O::usize_as(0));
    for i in 0..array.len() {
        if array.is_valid(i) {
            values.extend_from_slice(array.value(i));
        }
        // At most `capacity` bytes, which fit `O` (checked above).
        offsets.push(O::usize_as(values.len()));
    }
    Ok((
        OffsetBuffer::new(offsets.into()),
        Buffer::from_vec(values),
        array.nulls().cloned(),
    ))
}

/// A binary array of `array`'s values.
fn binary<O: OffsetSizeTrait>(array: &BinaryViewArray) -> Result<ArrayRef, ArrowError> {
    let (offsets, values, nulls) = copied::<O>(array)?;
    Ok(Arc::new(GenericBinaryArray::<O>::try_new(
        offsets, values, nulls,
    )?))
}

/// A string array of `array`'s values (a `Utf8View` array).
fn string<O: OffsetSizeTrait>(array: &ArrayRef) -> Result<ArrayRef, ArrowError> {
    let views = array.as_string_view();
    let (offsets, values, nulls) = copied::<O>(&views.clone().to_binary_view())?;
    // SAFETY: every value of a `StringViewArray` is valid UTF-8 (its
    // invariant; parquet's reader checks each value it reads as a string),
    // and the bytes are those values one after another, with an offset at
    // each value's start and end: valid UTF-8, split at char boundaries.
    Ok(Arc::new(unsafe {
        GenericStringArray::<O>::new_unchecked(offsets, values, nulls)
    }))
}

#[cfg(test)]
mod tests {
    use arrow_schema::{DataType, Field, Fields, Schema};
    use parquet::schema::types::ColumnPath;

    use super::*;

    /// Only the binary and string fields named become views (in structs
    /// too); nothing named, or only other types named: no schema.
    #[test]
    fn only_the_named_binary_and_string_fields_become_views() {
        let image = Fields::from(vec![
            Field::new("bytes", DataType::LargeBinary, true),
            Field::new("path", DataType::Utf8, true),
        ]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("text", DataType::LargeUtf8, false),
            Field::new("tag", DataType::Utf8, true),
            Field::new("image", DataType::Struct(image), true),
        ]));
        let named = |p: &[&str]| ColumnPath::new(p.iter().map(|s| s.to_string()).collect());
        let viewed = viewed_schema(
            &schema,
            &[named(&["text"]), named(&["image", "bytes"]), named(&["id"])],
        )
        .unwrap();
        let types: Vec<&DataType> = viewed.fields().iter().map(|f| f.data_type()).collect();
        assert_eq!(types[0], &DataType::Int64);
        assert_eq!(types[1], &DataType::Utf8View);
        assert_eq!(types[2], &DataType::Utf8);
        let DataType::Struct(children) = types[3] else {
            panic!("{:?}", types[3]);
        };
        assert_eq!(children[0].data_type(), &DataType::BinaryView);
        assert_eq!(children[1].data_type(), &DataType::Utf8);
        assert_eq!(viewed.field(1).name(), "text");
        assert!(viewed.field(3).is_nullable() && !viewed.field(1).is_nullable());
        assert!(viewed_schema(&schema, &[]).is_none());
        assert!(viewed_schema(&schema, &[named(&["id"]), named(&["image"])]).is_none());
    }
}
