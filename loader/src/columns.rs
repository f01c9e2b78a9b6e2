//! The column contract: which Arrow types the collator takes, and how each
//! projected column is laid out in a batch (values, offsets or lengths,
//! validity), as [`ColumnPlan`]s made once per loader.

use arrow_schema::{DataType, Schema};

use crate::batch::DType;
use crate::error::{LoaderError, Result};
use crate::image::ImageOptions;

/// Alignment of each buffer inside a slab.
pub(crate) const ALIGN: usize = 64;

/// How variable-length list columns are collated.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum ListMode {
    /// Values + offsets.
    #[default]
    Ragged,
    /// Padded or truncated to `to` elements per row, filled with `value`, with lengths.
    Padded {
        /// Elements per row.
        to: usize,
        /// Fill value (converted to the element type).
        value: f64,
    },
}

/// What a column collates as.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    Primitive(DType),
    Bool,
    FixedList(DType, usize),
    List {
        dtype: DType,
        large: bool,
    },
    Bytes {
        large: bool,
        utf8: bool,
    },
    /// Lists of binary or string items, or of lists of fixed-width values
    /// (`list<list<float32>>`): the items' values end to end, as `dtype`
    /// (`U8` for bytes), with row and item offsets (list and item offsets
    /// of either width: the collator reads them off the arrays).
    ListBytes {
        utf8: bool,
        dtype: DType,
    },
    /// Encoded images, decoded into `uint8` pixels (see [`crate::image`]).
    Image {
        large: bool,
    },
}

/// How one projected column is collated.
#[derive(Clone, Debug)]
pub(crate) struct ColumnPlan {
    pub(crate) name: String,
    /// Index of the column in decoded batches.
    pub(crate) source: usize,
    pub(crate) kind: Kind,
    pub(crate) nullable: bool,
}

impl ColumnPlan {
    /// Whether the column collates to a fixed number of bytes per row.
    pub(crate) fn is_fixed_width(&self) -> bool {
        matches!(
            self.kind,
            Kind::Primitive(_) | Kind::Bool | Kind::FixedList(..)
        )
    }

    /// Bytes of values a batch of `rows` takes in this column when that is
    /// fixed (fixed-width columns), else 0.
    pub(crate) fn fixed_bytes(&self, rows: usize) -> usize {
        match self.kind {
            Kind::Primitive(d) => d.size().saturating_mul(rows),
            Kind::Bool => rows,
            Kind::FixedList(d, k) => d.size().saturating_mul(k).saturating_mul(rows),
            _ => 0,
        }
    }

    /// Whether the column holds images to decode.
    pub(crate) fn is_image(&self) -> bool {
        matches!(self.kind, Kind::Image { .. })
    }

    /// Bytes a batch of `rows` needs for this column beyond its values:
    /// offsets or lengths, a validity mask and buffer alignment.
    pub(crate) fn overhead_bytes(&self, rows: usize) -> usize {
        let validity = if self.nullable { rows + ALIGN } else { 0 };
        let offsets = if self.is_fixed_width() || self.is_image() {
            0
        } else {
            (rows + 1) * 8 + ALIGN
        };
        // Item boundaries: 8 bytes an item, counted with the values; the
        // buffer's alignment here.
        let items = if matches!(self.kind, Kind::ListBytes { .. }) {
            ALIGN + 8
        } else {
            0
        };
        ALIGN + validity + offsets + items
    }
}

pub(crate) fn primitive(dt: &DataType) -> Option<DType> {
    Some(match dt {
        DataType::Int8 => DType::I8,
        DataType::Int16 => DType::I16,
        DataType::Int32 | DataType::Date32 | DataType::Time32(_) => DType::I32,
        DataType::Int64
        | DataType::Date64
        | DataType::Time64(_)
        | DataType::Timestamp(_, _)
        | DataType::Duration(_) => DType::I64,
        DataType::UInt8 => DType::U8,
        DataType::UInt16 => DType::U16,
        DataType::UInt32 => DType::U32,
        DataType::UInt64 => DType::U64,
        DataType::Float16 => DType::F16,
        DataType::Float32 => DType::F32,
        DataType::Float64 => DType::F64,
        _ => return None,
    })
}

/// Plan the columns `names` (in that order) of decoded batches with `schema`,
/// or name the first one that cannot be collated.
pub(crate) fn plan_columns(
    schema: &Schema,
    names: &[String],
    images: Option<&ImageOptions>,
) -> Result<Vec<ColumnPlan>> {
    names
        .iter()
        .map(|name| {
            let (source, field) = schema.column_with_name(name).ok_or_else(|| LoaderError::BadOption {
                option: "columns",
                reason: format!("no column named `{name}`"),
            })?;
            let element = |dt: &DataType| primitive(dt);
            if images.is_some_and(|i| i.columns.contains(name)) {
                let large = match field.data_type() {
                    DataType::Binary | DataType::BinaryView => false,
                    DataType::LargeBinary => true,
                    other => {
                        return Err(LoaderError::BadOption {
                            option: "decode_images",
                            reason: format!(
                                "column `{name}` has type {other}; images are decoded from binary columns"
                            ),
                        });
                    }
                };
                return Ok(ColumnPlan {
                    name: field.name().clone(),
                    source,
                    kind: Kind::Image { large },
                    nullable: field.is_nullable(),
                });
            }
            let kind = match field.data_type() {
                DataType::Boolean => Some(Kind::Bool),
                DataType::FixedSizeList(child, n) => element(child.data_type()).map(|d| Kind::FixedList(d, *n as usize)),
                // Fixed-size binary values and decimals as their bytes: `[batch, n]` u8
                // (decimals: 16 or 32 bytes, little-endian two's complement of the
                // unscaled value; the scale is in the schema).
                DataType::FixedSizeBinary(n) => usize::try_from(*n).ok().filter(|&n| n > 0).map(|n| Kind::FixedList(DType::U8, n)),
                DataType::Decimal128(..) => Some(Kind::FixedList(DType::U8, 16)),
                DataType::Decimal256(..) => Some(Kind::FixedList(DType::U8, 32)),
                DataType::List(child) | DataType::LargeList(child) => match child.data_type() {
                    DataType::Binary | DataType::BinaryView | DataType::LargeBinary => Some(Kind::ListBytes { utf8: false, dtype: DType::U8 }),
                    DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => Some(Kind::ListBytes { utf8: true, dtype: DType::U8 }),
                    // Lists of lists of fixed-width values (bounding boxes,
                    // per-token vectors).
                    DataType::List(inner) | DataType::LargeList(inner) | DataType::FixedSizeList(inner, _) => {
                        element(inner.data_type()).map(|dtype| Kind::ListBytes { utf8: false, dtype })
                    }
                    dt => element(dt).map(|dtype| Kind::List {
                        dtype,
                        large: matches!(field.data_type(), DataType::LargeList(_)),
                    }),
                },
                DataType::Binary => Some(Kind::Bytes { large: false, utf8: false }),
                DataType::Utf8 => Some(Kind::Bytes { large: false, utf8: true }),
                DataType::LargeBinary => Some(Kind::Bytes { large: true, utf8: false }),
                DataType::LargeUtf8 => Some(Kind::Bytes { large: true, utf8: true }),
                dt => element(dt).map(Kind::Primitive),
            };
            let kind = kind.ok_or_else(|| LoaderError::BadOption {
                option: "columns",
                reason: format!(
                    "column `{}` has type {} which the collator does not support \
                     (fixed-width values, fixed-size lists and lists of them, lists of lists of fixed-width values, fixed-size binary, decimals, binary, strings and lists of them are); \
                     leave it out of `columns`",
                    field.name(),
                    field.data_type()
                ),
            })?;
            Ok(ColumnPlan {
                name: field.name().clone(),
                source,
                kind,
                nullable: field.is_nullable(),
            })
        })
        .collect()
}
