//! Columns named by a path into a struct (`image.bytes`, `meta.source.url`):
//! the struct's top-level column is read and decoded whole, and the named
//! fields are taken out of it as columns of their own, null where the
//! struct (or a struct above) is null. Hugging Face datasets store images
//! as `image: struct<bytes: binary, path: string>`. A path may go through
//! one list of structs (`messages.role` of `list<struct<role, content>>`)
//! or map (`attrs.key`): the field is then a list per row, with the list's
//! offsets and nulls. A struct named whole loads as all its fields.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, StructArray, make_array};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{LoaderError, Result};

/// One output column: which decoded top-level column it comes from, and the
/// child indices down its structs (empty: the column itself).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Selection {
    root: usize,
    path: Vec<usize>,
}

/// The columns a loader hands on, as top-level columns to read and the
/// fields taken out of their structs.
#[derive(Clone, Debug)]
pub(crate) struct Columns {
    /// Top-level columns to read, sorted, each once.
    pub roots: Vec<usize>,
    /// The output columns' schema, in the dataset's order (a struct's
    /// fields in their order, where it stood).
    pub schema: SchemaRef,
    /// Per output column, where it comes from (`root` indexes `roots`).
    selections: Vec<Selection>,
    /// Whether a column comes out of a struct (else the decoded batches are
    /// handed on as they are).
    nested: bool,
}

fn bad(reason: String) -> LoaderError {
    LoaderError::BadOption {
        option: "columns",
        reason,
    }
}

impl Columns {
    /// Resolve `names` (top-level columns, or `a.b` paths into structs)
    /// against `schema`.
    pub(crate) fn resolve(schema: &Schema, names: &[String]) -> Result<Columns> {
        let mut found: Vec<(usize, Vec<usize>, Field)> = Vec::with_capacity(names.len());
        for name in names {
            found.push(resolve_one(schema, name)?);
        }
        let mut keys: Vec<(usize, &Vec<usize>)> = found.iter().map(|(r, p, _)| (*r, p)).collect();
        keys.sort();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            return Err(bad("a column is named twice".into()));
        }
        // A whole struct with one of its own fields, or a field with one
        // of its own: the same bytes twice.
        for (a, b) in keys.iter().zip(keys.iter().skip(1)) {
            if a.0 == b.0 && b.1.starts_with(a.1) {
                return Err(bad(format!(
                    "`{}` and a field inside it are both named",
                    schema.field(a.0).name()
                )));
            }
        }
        found.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let mut roots: Vec<usize> = found.iter().map(|(r, _, _)| *r).collect();
        roots.dedup();
        let nested = found.iter().any(|(_, p, _)| !p.is_empty());
        let selections = found
            .iter()
            .map(|(r, p, _)| Selection {
                root: roots.binary_search(r).expect("a root of the selection"),
                path: p.clone(),
            })
            .collect();
        let fields: Vec<Field> = found.into_iter().map(|(_, _, f)| f).collect();
        Ok(Columns {
            roots,
            schema: Arc::new(Schema::new(fields)),
            selections,
            nested,
        })
    }

    /// Every top-level column of `schema`.
    pub(crate) fn all(schema: &Schema) -> Columns {
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        Columns::resolve(schema, &names).expect("a schema's own columns resolve")
    }

    /// The output columns of a batch decoded from [`Columns::roots`],
    /// widened to the schema's types where an index's file has narrower
    /// ones.
    pub(crate) fn select(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let batch = self.nest(batch)?;
        self.widen(batch)
    }

    /// Columns whose type is narrower than the schema's (an index over
    /// files of `int32` and `int64`) cast to it; dictionaries keep their
    /// keys and widen their values. (The index and the footer check allow
    /// nothing else to differ.)
    fn widen(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let wanted = |c: &ArrayRef, f: &Field| match c.data_type() {
            DataType::Dictionary(_, v) => v.equals_datatype(f.data_type()),
            t => t.equals_datatype(f.data_type()),
        };
        if batch
            .columns()
            .iter()
            .zip(self.schema.fields())
            .all(|(c, f)| wanted(c, f))
        {
            return Ok(batch);
        }
        let columns = batch
            .columns()
            .iter()
            .zip(self.schema.fields())
            // Other differences (a decoder's own representation of the
            // schema's type) go on as they are, as before widening.
            .map(|(c, f)| match wanted(c, f) {
                true => c.clone(),
                false => widened(c, f.data_type()).unwrap_or_else(|| c.clone()),
            })
            .collect::<Vec<ArrayRef>>();
        self.batch_of(columns, "widening columns")
    }

    /// A batch of `columns` under the schema's names, each field typed as
    /// its column is (the decoders may hand a column on as a dictionary of
    /// the file's type: the batch says so).
    fn batch_of(&self, columns: Vec<ArrayRef>, doing: &str) -> Result<RecordBatch> {
        let fields: Vec<Field> = self
            .schema
            .fields()
            .iter()
            .zip(&columns)
            .map(|(f, c)| f.as_ref().clone().with_data_type(c.data_type().clone()))
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| {
            LoaderError::stage(
                crate::error::Stage::Decode,
                None,
                None,
                format!("{doing}: {e}"),
            )
        })
    }

    /// Struct fields taken out as columns of their own.
    fn nest(&self, batch: RecordBatch) -> Result<RecordBatch> {
        if !self.nested {
            return Ok(batch);
        }
        let columns = self
            .selections
            .iter()
            .map(|s| field_of(batch.column(s.root), &s.path))
            .collect::<Result<Vec<ArrayRef>>>()?;
        self.batch_of(columns, "selecting struct fields")
    }
}

/// `array` cast to the wider `to` (integers of one signedness, floats); a
/// dictionary's values widened under its keys. `None` for anything else.
fn widened(array: &ArrayRef, to: &DataType) -> Option<ArrayRef> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    macro_rules! up {
        ($from:ty, $to:ty, $t:ty) => {
            Some(Arc::new(array.as_primitive::<$from>().unary::<_, $to>(|v| v as $t)) as ArrayRef)
        };
    }
    match (array.data_type(), to) {
        (DataType::Dictionary(..), _) => {
            let dictionary = array.as_any_dictionary();
            let values = widened(dictionary.values(), to)?;
            Some(dictionary.with_values(values))
        }
        (DataType::Int8, DataType::Int64) => up!(Int8Type, Int64Type, i64),
        (DataType::Int16, DataType::Int64) => up!(Int16Type, Int64Type, i64),
        (DataType::Int32, DataType::Int64) => up!(Int32Type, Int64Type, i64),
        (DataType::Int8, DataType::Int32) => up!(Int8Type, Int32Type, i32),
        (DataType::Int16, DataType::Int32) => up!(Int16Type, Int32Type, i32),
        (DataType::Int8, DataType::Int16) => up!(Int8Type, Int16Type, i16),
        (DataType::UInt8, DataType::UInt64) => up!(UInt8Type, UInt64Type, u64),
        (DataType::UInt16, DataType::UInt64) => up!(UInt16Type, UInt64Type, u64),
        (DataType::UInt32, DataType::UInt64) => up!(UInt32Type, UInt64Type, u64),
        (DataType::UInt8, DataType::UInt32) => up!(UInt8Type, UInt32Type, u32),
        (DataType::UInt16, DataType::UInt32) => up!(UInt16Type, UInt32Type, u32),
        (DataType::UInt8, DataType::UInt16) => up!(UInt8Type, UInt16Type, u16),
        (DataType::Float32, DataType::Float64) => up!(Float32Type, Float64Type, f64),
        _ => None,
    }
}

/// `names` with every struct among them (a top-level column or a field
/// inside one) replaced by its fields' paths, depth first, in the struct's
/// order: `image` loads as `image.bytes` and `image.path`. A batch holds
/// arrays, and a struct is its fields side by side.
pub(crate) fn expand_structs(schema: &Schema, names: &[String]) -> Result<Vec<String>> {
    fn expand(name: String, field: &Field, out: &mut Vec<String>) {
        // A struct, or a list of structs (a map's entries too): its fields
        // (a list per field: `messages.role`, `attrs.key`).
        match struct_fields(field.data_type()) {
            Some(children) if !children.is_empty() => {
                for child in children {
                    expand(format!("{name}.{}", child.name()), child, out);
                }
            }
            _ => out.push(name),
        }
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let (_, _, field) = resolve_one(schema, name)?;
        expand(name.clone(), &field, &mut out);
    }
    Ok(out)
}

/// The column `decode_images` decodes for `name`: `name.bytes` when `name`
/// is a struct with a binary `bytes` field (Hugging Face's `image:
/// struct<bytes, path>`), else `name`.
pub(crate) fn image_field(schema: &Schema, name: &str) -> String {
    let binary = |f: &Field| {
        matches!(
            f.data_type(),
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView
        )
    };
    match resolve_one(schema, name) {
        Ok((_, _, field)) => match field.data_type() {
            DataType::Struct(children)
                if children.find("bytes").is_some_and(|(_, f)| binary(f)) =>
            {
                format!("{name}.bytes")
            }
            _ => name.to_string(),
        },
        Err(_) => name.to_string(),
    }
}

/// The top-level column `name` (a column, or a path into one) reads.
pub(crate) fn root_of(schema: &Schema, name: &str) -> Option<usize> {
    resolve_one(schema, name).ok().map(|(root, _, _)| root)
}

/// The fields of a struct, or of the structs a list or map holds.
fn struct_fields(data_type: &DataType) -> Option<&arrow_schema::Fields> {
    match data_type {
        DataType::Struct(children) => Some(children),
        DataType::List(item) | DataType::LargeList(item) | DataType::Map(item, _) => {
            match item.data_type() {
                DataType::Struct(children) => Some(children),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `name` as a top-level column, or a path of fields through structs and
/// at most one list of structs or map (the field is then a list).
fn resolve_one(schema: &Schema, name: &str) -> Result<(usize, Vec<usize>, Field)> {
    if let Ok(i) = schema.index_of(name) {
        return Ok((i, Vec::new(), schema.field(i).clone()));
    }
    let known = || {
        schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
    };
    let mut parts = name.split('.');
    let first = parts.next().unwrap_or_default();
    let Ok(root) = schema.index_of(first) else {
        return Err(bad(format!(
            "no column named `{name}`; the dataset has {:?}",
            known()
        )));
    };
    let mut field = schema.field(root).clone();
    let mut nullable = field.is_nullable();
    let mut path = Vec::new();
    // Whether the path went through a list of structs (a large one): the
    // field is then a list of what it names.
    let mut in_list: Option<bool> = None;
    for part in parts {
        if let DataType::List(item) | DataType::LargeList(item) | DataType::Map(item, _) =
            field.data_type()
            && matches!(item.data_type(), DataType::Struct(_))
        {
            if in_list.is_some() {
                return Err(bad(format!(
                    "no column named `{name}`: a path goes through one list of structs, not two"
                )));
            }
            in_list = Some(matches!(field.data_type(), DataType::LargeList(_)));
            field = item.as_ref().clone();
        }
        let DataType::Struct(children) = field.data_type() else {
            return Err(bad(format!(
                "no column named `{name}`: `{}` is {}, not a struct",
                field.name(),
                field.data_type()
            )));
        };
        let Some((i, child)) = children.find(part) else {
            let names: Vec<&str> = children.iter().map(|c| c.name().as_str()).collect();
            return Err(bad(format!(
                "no column named `{name}`: `{}` has fields {names:?}",
                field.name()
            )));
        };
        path.push(i);
        if in_list.is_none() {
            nullable |= child.is_nullable();
        }
        field = child.as_ref().clone();
    }
    if let Some(large) = in_list {
        field = Field::new(name, list_type(field.data_type().clone(), large), nullable);
    }
    Ok((root, path, field.with_name(name).with_nullable(nullable)))
}

/// The type of a list of `item`s, as a path through a list of structs
/// makes it (items nullable: a null struct item makes a null field item).
fn list_type(item: DataType, large: bool) -> DataType {
    let item = Arc::new(Field::new_list_field(item, true));
    if large {
        DataType::LargeList(item)
    } else {
        DataType::List(item)
    }
}

/// The field at `path` of the struct `array`, null where any struct on the
/// way is.
fn field_of(array: &ArrayRef, path: &[usize]) -> Result<ArrayRef> {
    use arrow_array::cast::AsArray;
    use arrow_array::{GenericListArray, OffsetSizeTrait};

    /// `list` with the rest of the path taken in each of its struct items.
    fn through<O: OffsetSizeTrait>(list: &GenericListArray<O>, path: &[usize]) -> Result<ArrayRef> {
        let values = field_of(list.values(), path)?;
        let field = Arc::new(Field::new_list_field(values.data_type().clone(), true));
        let list = GenericListArray::<O>::try_new(
            field,
            list.offsets().clone(),
            values,
            list.nulls().cloned(),
        )
        .map_err(|e| bad(format!("a list of struct fields: {e}")))?;
        Ok(Arc::new(list))
    }

    let mut current = array.clone();
    let mut nulls: Option<NullBuffer> = None;
    for (k, &i) in path.iter().enumerate() {
        if let Some(list) = current.as_list_opt::<i32>() {
            current = through(list, &path[k..])?;
            break;
        }
        if let Some(list) = current.as_list_opt::<i64>() {
            current = through(list, &path[k..])?;
            break;
        }
        if let Some(map) = current.as_map_opt() {
            // A map is a list of its entries (struct<key, value>).
            let entries: ArrayRef = Arc::new(map.entries().clone());
            let list = arrow_array::ListArray::try_new(
                Arc::new(Field::new_list_field(entries.data_type().clone(), false)),
                map.offsets().clone(),
                entries,
                map.nulls().cloned(),
            )
            .map_err(|e| bad(format!("a map's entries: {e}")))?;
            current = through(&list, &path[k..])?;
            break;
        }
        let strukt = current
            .as_any()
            .downcast_ref::<StructArray>()
            .ok_or_else(|| {
                bad(format!(
                    "expected a struct, decoded {}",
                    current.data_type()
                ))
            })?;
        nulls = NullBuffer::union(nulls.as_ref(), strukt.nulls());
        current = strukt.column(i).clone();
    }
    let Some(outer) = nulls else {
        return Ok(current);
    };
    let merged = NullBuffer::union(Some(&outer), current.nulls());
    let data = current
        .to_data()
        .into_builder()
        .nulls(merged)
        .build()
        .map_err(|e| bad(format!("struct field nulls: {e}")))?;
    Ok(make_array(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, Int64Array, StringArray};
    use arrow_buffer::BooleanBuffer;

    fn image_schema() -> Schema {
        let image = DataType::Struct(
            vec![
                Field::new("bytes", DataType::Binary, true),
                Field::new("path", DataType::Utf8, true),
            ]
            .into(),
        );
        Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("image", image, true),
        ])
    }

    #[test]
    fn a_struct_named_loads_as_its_fields() {
        let inner = DataType::Struct(vec![Field::new("url", DataType::Utf8, true)].into());
        let meta = DataType::Struct(
            vec![
                Field::new("source", inner, true),
                Field::new("score", DataType::Float32, true),
            ]
            .into(),
        );
        let mut fields: Vec<Field> = image_schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new("meta", meta, true));
        let schema = Schema::new(fields);
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let got = expand_structs(&schema, &names(&["id", "image", "meta"])).unwrap();
        assert_eq!(
            got,
            names(&[
                "id",
                "image.bytes",
                "image.path",
                "meta.source.url",
                "meta.score"
            ])
        );
        // A field inside a struct expands the same way; plain paths stay.
        let got = expand_structs(&schema, &names(&["meta.source", "image.path"])).unwrap();
        assert_eq!(got, names(&["meta.source.url", "image.path"]));
        // The expanded names resolve.
        let got = expand_structs(&schema, &names(&["image", "meta"])).unwrap();
        assert!(Columns::resolve(&schema, &got).is_ok());
        assert!(expand_structs(&schema, &names(&["nope"])).is_err());
    }

    #[test]
    fn struct_fields_come_out_as_columns_null_where_the_struct_is() {
        let schema = image_schema();
        let names = ["image.path".to_string(), "id".into(), "image.bytes".into()];
        let columns = Columns::resolve(&schema, &names).unwrap();
        assert_eq!(columns.roots, vec![0, 1]);
        let out: Vec<&str> = columns
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(out, ["id", "image.bytes", "image.path"]);
        let DataType::Struct(fields) = schema.field(1).data_type().clone() else {
            unreachable!()
        };
        let image = StructArray::new(
            fields,
            vec![
                Arc::new(BinaryArray::from(vec![Some(&b"a"[..]), Some(b"b"), None])),
                Arc::new(StringArray::from(vec!["x", "y", "z"])),
            ],
            Some(NullBuffer::new(BooleanBuffer::from(vec![
                true, false, true,
            ]))),
        );
        let batch = RecordBatch::try_new(
            Arc::new(schema.clone()),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3])), Arc::new(image)],
        )
        .unwrap();
        let got = columns.select(batch).unwrap();
        let paths = got
            .column(2)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(
            paths.iter().collect::<Vec<_>>(),
            [Some("x"), None, Some("z")]
        );
        let bytes = got
            .column(1)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        assert_eq!(
            bytes.iter().collect::<Vec<_>>(),
            [Some(&b"a"[..]), None, None]
        );
    }

    #[test]
    fn paths_that_do_not_lead_to_a_field_are_refused_by_name() {
        let schema = image_schema();
        let refused = |names: &[&str], says: &str| {
            let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
            let err = Columns::resolve(&schema, &names).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        };
        refused(&["image.size"], "has fields [\"bytes\", \"path\"]");
        refused(&["id.x"], "not a struct");
        refused(&["nothing"], "no column named `nothing`");
        refused(&["image", "image.bytes"], "a field inside it");
        refused(&["id", "id"], "named twice");
    }
}
