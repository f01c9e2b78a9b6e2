//! Column chunks of large binary and string values (the columns
//! [`BinaryColumns`](crate::encode::BinaryColumns) stores as they are or
//! writes without a dictionary, at the top level or as fields of a
//! top-level struct, as Hugging Face stores an image's bytes),
//! `PLAIN`-encoded here instead of by parquet's writer.
//!
//! parquet's writer appends each value to a page buffer that grows from
//! empty for every page (each doubling copies what it holds), then copies
//! the page again behind its levels: on the image set of
//! docs/performance-notes.md a fifth of `shard`'s CPU. Here a page's rows are
//! found from its values' lengths first, then its values are copied once,
//! into a buffer of its exact size behind its definition levels; the chunk
//! is kept as its pages' headers and bytes ([`PlainChunk`]), which the shard
//! writer hands on to the file without another copy.
//!
//! The chunk is what parquet's writer makes of such a column with the
//! shards' writer properties: definition levels for a nullable value and a
//! nullable struct, V2 `PLAIN` data pages cut once they reach
//! `data_page_size_limit` bytes or `data_page_row_count_limit` rows, each
//! stored compressed only where zstd shrinks it below the V2 ratio threshold
//! (never in a column stored uncompressed), and chunk statistics as parquet
//! computes and truncates them (bytes compared unsigned; a string's bounds
//! cut at a character boundary). Tests in `encode.rs` compare chunks with
//! parquet's.

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_buffer::NullBuffer;
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::basic::{Compression, ConvertedType, Encoding, LogicalType, PageType};
use parquet::column::page::{CompressedPage, Page};
use parquet::column::writer::ColumnCloseResult;
use parquet::data_type::ByteArray;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::ColumnDescPtr;

use crate::dictionary::{Hybrid, compress, page_count};
use crate::pages::{Written, write_pages};
use crate::sums::ChunkSums;

/// A column chunk encoded here: its bytes as its pages' headers and data, in
/// file order, to be handed on to the file as they are.
pub(crate) struct PlainChunk {
    parts: Vec<Bytes>,
    close: ColumnCloseResult,
    sums: ChunkSums,
}

impl PlainChunk {
    /// Bytes the chunk occupies in the file.
    pub(crate) fn bytes_written(&self) -> u64 {
        self.close.bytes_written
    }

    /// Its bytes (in order) and what parquet's writer needs to splice them.
    pub(crate) fn into_parts(self) -> (Vec<Bytes>, ColumnCloseResult, ChunkSums) {
        (self.parts, self.close, self.sums)
    }
}

/// One batch's array of the column, as the byte slices of its values.
#[derive(Clone, Copy)]
enum Values<'a> {
    Binary(&'a arrow_array::BinaryArray),
    LargeBinary(&'a arrow_array::LargeBinaryArray),
    Utf8(&'a arrow_array::StringArray),
    LargeUtf8(&'a arrow_array::LargeStringArray),
}

impl<'a> Values<'a> {
    fn of(array: &'a ArrayRef) -> Option<Self> {
        Some(match array.data_type() {
            DataType::Binary => Values::Binary(array.as_binary::<i32>()),
            DataType::LargeBinary => Values::LargeBinary(array.as_binary::<i64>()),
            DataType::Utf8 => Values::Utf8(array.as_string::<i32>()),
            DataType::LargeUtf8 => Values::LargeUtf8(array.as_string::<i64>()),
            _ => return None,
        })
    }

    fn array(self) -> &'a dyn Array {
        match self {
            Values::Binary(a) => a,
            Values::LargeBinary(a) => a,
            Values::Utf8(a) => a,
            Values::LargeUtf8(a) => a,
        }
    }

    /// Row `i`'s value (empty where it is null).
    fn value(self, i: usize) -> &'a [u8] {
        match self {
            Values::Binary(a) => a.value(i),
            Values::LargeBinary(a) => a.value(i),
            Values::Utf8(a) => a.value(i).as_bytes(),
            Values::LargeUtf8(a) => a.value(i).as_bytes(),
        }
    }
}

/// One batch's part of a leaf column: its values, and the nulls of the
/// struct holding them (`None` for a top-level column, or a struct without
/// nulls).
pub(crate) struct Leaf<'a> {
    pub values: &'a ArrayRef,
    pub outer: Option<NullBuffer>,
}

/// Encode the leaf column `descr` whose parts (one per batch, in row order)
/// are `leaves` here, or `None` where parquet's writer should: a type this
/// module does not write, a column written with a dictionary or another
/// encoding, nulls where its levels have none, no rows. The leaf is a
/// top-level column, or a field of a top-level struct (`levels.0`: the
/// struct adds a definition level); `levels.1`: the value adds one.
pub(crate) fn encode(
    leaves: &[Leaf<'_>],
    levels: (bool, bool),
    descr: &ColumnDescPtr,
    props: &WriterProperties,
    v2_ratio: f64,
) -> Result<Option<PlainChunk>, ParquetError> {
    let path = descr.path();
    let max_def = levels.0 as i16 + levels.1 as i16;
    if props.dictionary_enabled(path)
        || props.writer_version() != WriterVersion::PARQUET_2_0
        || props.encoding(path).is_some_and(|e| e != Encoding::PLAIN)
        || props.bloom_filter_properties(path).is_some()
        || props.statistics_enabled(path) == EnabledStatistics::Page
        || props.write_page_header_statistics(path)
        || props.content_defined_chunking().is_some()
        || descr.max_rep_level() != 0
        || descr.max_def_level() != max_def
    {
        return Ok(None);
    }
    let level = match props.compression(path) {
        Compression::UNCOMPRESSED => None,
        Compression::ZSTD(level) => Some(level.compression_level()),
        _ => return Ok(None),
    };
    let mut parts = Vec::with_capacity(leaves.len());
    for leaf in leaves {
        let Some(values) = Values::of(leaf.values) else {
            return Ok(None);
        };
        let inner = values
            .array()
            .logical_nulls()
            .filter(|n| n.null_count() > 0);
        let outer = leaf.outer.clone().filter(|n| n.null_count() > 0);
        if (!levels.0 && outer.is_some()) || (!levels.1 && inner.is_some()) {
            return Ok(None);
        }
        parts.push(Part {
            values,
            outer,
            inner,
        });
    }
    let rows: usize = parts.iter().map(|p| p.values.array().len()).sum();
    if rows == 0 {
        return Ok(None);
    }
    let chunk = Chunk {
        descr,
        props,
        level,
        v2_ratio,
        outer_level: levels.0,
        max_def,
    };
    chunk.encode(&parts, rows).map(Some)
}

/// A batch's part of the leaf, with the nulls that set its levels.
struct Part<'a> {
    values: Values<'a>,
    /// The struct's nulls (a null struct: level 0).
    outer: Option<NullBuffer>,
    /// The values' nulls.
    inner: Option<NullBuffer>,
}

impl Part<'_> {
    /// Row `i`'s definition level, of at most `max`: 0 under a null
    /// struct, one short of `max` for a null value in a struct, `max` for a
    /// value.
    fn level(&self, i: usize, outer_level: bool, max: i16) -> i16 {
        if self.outer.as_ref().is_some_and(|n| n.is_null(i)) {
            0
        } else if self.inner.as_ref().is_some_and(|n| n.is_null(i)) {
            outer_level as i16
        } else {
            max
        }
    }
}

/// One chunk's settings.
struct Chunk<'a> {
    descr: &'a ColumnDescPtr,
    props: &'a WriterProperties,
    /// zstd's level, `None` for a column stored uncompressed.
    level: Option<i32>,
    v2_ratio: f64,
    /// Whether a struct holding the values adds a definition level.
    outer_level: bool,
    /// The leaf's definition level of a value (0: no levels written).
    max_def: i16,
}

/// The rows of one data page: runs of rows of the arrays, and its counts.
#[derive(Default)]
struct PageRows {
    runs: Vec<(usize, std::ops::Range<usize>)>,
    rows: usize,
    values: usize,
    /// Bytes of its `PLAIN` values (each with its 4-byte length).
    bytes: usize,
}

/// What the chunk's pages add up to, for its metadata.
struct Totals<'a> {
    nulls: u64,
    /// Bytes of the values themselves.
    value_bytes: i64,
    min: Option<&'a [u8]>,
    max: Option<&'a [u8]>,
    def_histogram: [i64; 3],
}

impl Chunk<'_> {
    fn encode(&self, parts: &[Part<'_>], rows: usize) -> Result<PlainChunk, ParquetError> {
        let path = self.descr.path();
        let size_limit = self.props.column_data_page_size_limit(path).max(1);
        let row_limit = self.props.column_data_page_row_count_limit(path).max(1);
        let mut totals = Totals {
            nulls: 0,
            value_bytes: 0,
            min: None,
            max: None,
            def_histogram: [0; 3],
        };
        let mut pages = Vec::new();
        let mut page = PageRows::default();
        for (k, part) in parts.iter().enumerate() {
            let len = part.values.array().len();
            let mut i = 0;
            while i < len {
                let start = i;
                while i < len && page.rows < row_limit && page.bytes < size_limit {
                    if part.level(i, self.outer_level, self.max_def) == self.max_def {
                        page.bytes += 4 + part.values.value(i).len();
                        page.values += 1;
                    }
                    page.rows += 1;
                    i += 1;
                }
                page.runs.push((k, start..i));
                if page.rows >= row_limit || page.bytes >= size_limit {
                    pages.push(self.page(parts, std::mem::take(&mut page), &mut totals)?);
                }
            }
        }
        if page.rows > 0 {
            pages.push(self.page(parts, page, &mut totals)?);
        }
        self.assemble(pages, rows, totals)
    }

    /// The V2 data page of `page`'s rows: definition levels, then each
    /// value's length and bytes, compressed where that pays.
    fn page<'a>(
        &self,
        parts: &[Part<'a>],
        page: PageRows,
        totals: &mut Totals<'a>,
    ) -> Result<CompressedPage, ParquetError> {
        let (outer, max) = (self.outer_level, self.max_def);
        let mut levels = Vec::new();
        if max > 0 {
            let mut def = Hybrid::new(if max > 1 { 2 } else { 1 });
            for (k, run) in &page.runs {
                for i in run.clone() {
                    def.push(parts[*k].level(i, outer, max) as u32, 1);
                }
            }
            def.histogram(&mut totals.def_histogram);
            def.finish(&mut levels);
        }
        let mut buf = Vec::with_capacity(levels.len() + page.bytes);
        buf.extend_from_slice(&levels);
        for (k, run) in &page.runs {
            let part = &parts[*k];
            for i in run.clone() {
                if part.level(i, outer, max) != max {
                    continue;
                }
                let value = part.values.value(i);
                let len = u32::try_from(value.len()).map_err(|_| {
                    ParquetError::General(format!("a value of {} bytes", value.len()))
                })?;
                buf.extend_from_slice(&len.to_le_bytes());
                buf.extend_from_slice(value);
                totals.value_bytes += value.len() as i64;
                if totals.min.is_none_or(|m| value < m) {
                    totals.min = Some(value);
                }
                if totals.max.is_none_or(|m| value > m) {
                    totals.max = Some(value);
                }
            }
        }
        let nulls = page.rows - page.values;
        totals.nulls += nulls as u64;
        let uncompressed = buf.len();
        let mut is_compressed = false;
        if let Some(level) = self.level {
            let compressed = compress(level, &buf[levels.len()..])?;
            if (compressed.len() as f64) < uncompressed as f64 * self.v2_ratio {
                buf.truncate(levels.len());
                buf.extend_from_slice(&compressed);
                is_compressed = true;
            }
        }
        let page = Page::DataPageV2 {
            buf: buf.into(),
            num_values: page_count(page.rows, "values")?,
            encoding: Encoding::PLAIN,
            num_nulls: page_count(nulls, "nulls")?,
            num_rows: page_count(page.rows, "rows")?,
            def_levels_byte_len: page_count(levels.len(), "definition level bytes")?,
            rep_levels_byte_len: 0,
            is_compressed,
            statistics: None,
        };
        Ok(CompressedPage::new(page, uncompressed))
    }

    /// The chunk of `pages`, with the metadata parquet's writer gives it.
    fn assemble(
        &self,
        pages: Vec<CompressedPage>,
        rows: usize,
        totals: Totals<'_>,
    ) -> Result<PlainChunk, ParquetError> {
        let data_pages = pages.len();
        let Written {
            parts,
            data_offset,
            compressed,
            uncompressed,
            ..
        } = write_pages(None, pages)?;
        let bytes_written = parts.iter().map(|p| p.len() as u64).sum();

        let mut builder = ColumnChunkMetaData::builder(self.descr.clone())
            .set_compression(self.props.compression(self.descr.path()))
            .set_encodings(vec![Encoding::PLAIN, Encoding::RLE])
            .set_page_encoding_stats(vec![PageEncodingStats {
                page_type: PageType::DATA_PAGE_V2,
                encoding: Encoding::PLAIN,
                count: i32::try_from(data_pages).map_err(|_| {
                    ParquetError::General(format!("a column chunk of {data_pages} pages"))
                })?,
            }])
            .set_total_compressed_size(compressed as i64)
            .set_total_uncompressed_size(uncompressed as i64)
            .set_num_values(rows as i64)
            .set_data_page_offset(data_offset.unwrap_or(0) as i64);
        if self.props.statistics_enabled(self.descr.path()) != EnabledStatistics::None {
            builder = builder
                .set_statistics(self.statistics(&totals))
                .set_unencoded_byte_array_data_bytes(Some(totals.value_bytes))
                .set_definition_level_histogram((self.max_def > 0).then(|| {
                    totals.def_histogram[..=self.max_def as usize]
                        .to_vec()
                        .into()
                }));
        }
        Ok(PlainChunk {
            sums: ChunkSums::of(&parts),
            parts,
            close: ColumnCloseResult {
                bytes_written,
                rows_written: rows as u64,
                metadata: builder.build()?,
                bloom_filter: None,
                column_index: None,
                offset_index: None,
            },
        })
    }

    /// The chunk's statistics as parquet's writer gives them: the smallest
    /// and largest value (bytes compared unsigned), each cut to
    /// `statistics_truncate_length` bytes (the largest then incremented, so
    /// that it stays an upper bound), and the null count.
    fn statistics(&self, totals: &Totals<'_>) -> Statistics {
        let nulls = Some(totals.nulls);
        let (Some(min), Some(max)) = (totals.min, totals.max) else {
            return Statistics::ByteArray(ValueStatistics::new(None, None, None, nulls, false));
        };
        let limit = self.props.statistics_truncate_length();
        let utf8 = self.descr.logical_type_ref() == Some(&LogicalType::String)
            || self.descr.converted_type() == ConvertedType::UTF8;
        let cut = |data: &[u8], upper: bool| -> (Vec<u8>, bool) {
            let truncated = limit.filter(|&l| data.len() > l).and_then(|l| {
                match (utf8, std::str::from_utf8(data)) {
                    (true, Ok(s)) if upper => increment_utf8_prefix(s, l),
                    (true, Ok(s)) => {
                        let split = (1..=l).rfind(|&x| s.is_char_boundary(x))?;
                        Some(data[..split].to_vec())
                    }
                    _ if upper => increment(data[..l].to_vec()),
                    _ => Some(data[..l].to_vec()),
                }
            });
            match truncated {
                Some(t) => (t, true),
                None => (data.to_vec(), false),
            }
        };
        let (min, min_cut) = cut(min, false);
        let (max, max_cut) = cut(max, true);
        Statistics::ByteArray(
            ValueStatistics::new(
                Some(ByteArray::from(min)),
                Some(ByteArray::from(max)),
                None,
                nulls,
                false,
            )
            .with_max_is_exact(!max_cut)
            .with_min_is_exact(!min_cut),
        )
    }
}

/// `data` (bytes past `length`) cut to at most `length` bytes at a character
/// boundary (at most 3 bytes short of it), its last character that can be
/// incremented without changing its width incremented and what follows it
/// dropped; `None` where none can.
fn increment_utf8_prefix(data: &str, length: usize) -> Option<Vec<u8>> {
    let split = (length.saturating_sub(3)..=length).rfind(|&x| data.is_char_boundary(x))?;
    let prefix = data.get(..split)?;
    for (at, c) in prefix.char_indices().rev() {
        if let Some(next) = char::from_u32(c as u32 + 1)
            && next.len_utf8() == c.len_utf8()
        {
            let mut out = prefix.as_bytes()[..at + c.len_utf8()].to_vec();
            next.encode_utf8(&mut out[at..]);
            return Some(out);
        }
    }
    None
}

/// `data` incremented as a big-endian number, bytes that overflow wrapping
/// to zero; `None` where every byte overflows.
fn increment(mut data: Vec<u8>) -> Option<Vec<u8>> {
    for byte in data.iter_mut().rev() {
        let (next, overflow) = byte.overflowing_add(1);
        *byte = next;
        if !overflow {
            return Some(data);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statistics bounds are cut as parquet's writer cuts them: bytes at the
    /// limit, the upper bound incremented (carrying past 0xff bytes, or
    /// none where all are 0xff); strings at a character boundary, the upper
    /// bound's last character that keeps its width incremented.
    #[test]
    fn bounds_are_cut_as_parquet_cuts_them() {
        assert_eq!(increment(vec![1, 2, 0xff]), Some(vec![1, 3, 0]));
        assert_eq!(increment(vec![0xff, 0xff]), None);
        // "aé" then a 4-byte character: cut to 4 bytes lands inside it.
        let s = "aé\u{1F600}z";
        assert_eq!(increment_utf8_prefix(s, 4), Some("aê".as_bytes().to_vec()));
        // U+007F + 1 is U+0080 (two bytes): the character before is raised.
        assert_eq!(increment_utf8_prefix("b\u{7f}cd", 2), Some(b"c".to_vec()));
        assert_eq!(increment_utf8_prefix("\u{7f}\u{7f}x", 2), None);
    }
}
