//! Page maps: where the pages of a column chunk start and which row each
//! starts, so that a part of a large row group (a writer's 128 MB to 1 GB
//! row groups, read in place) is read as the page ranges that cover its
//! rows, not the whole chunk.
//!
//! A map comes from the chunk's offset index when the writer wrote one, or
//! from walking its page headers: V2 pages and pages of flat columns give
//! their rows in the header; V1 pages of a list column (repetition level 1)
//! are decompressed to count the rows their repetition levels start. A V1
//! page may begin inside a row (a writer may split a long row across
//! pages): only pages that begin a row are cuts, so a part's range always
//! starts and ends at row boundaries. Columns nested deeper have no map
//! (their chunks are read whole).
//!
//! Every offset and count read here is untrusted: pages must lie inside
//! their chunk, in order, and hold the row group's rows exactly.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::Encoding;
use parquet::column::page::Page;
use parquet::file::metadata::ColumnChunkMetaData;
use shardfeed_format::thrift::{DATA_PAGE, DATA_PAGE_V2, DICTIONARY_PAGE, Thrift};

use super::Limits;
use super::page::{Pages, v1_levels};
use super::rle::{Bits, low_bits, walk_bits};
use super::sparse::SparseFile;

/// Bytes read at once to parse page headers from (more, up to
/// [`MAX_HEADER`], when statistics make a header longer): the headers of
/// small pages come from one read.
const HEADER_WINDOW: u64 = 64 << 10;

/// Bytes a page header is first parsed from (four times more each time it
/// runs past them).
const HEADER_BYTES: u64 = 1 << 10;

/// The longest page header read.
const MAX_HEADER: u64 = 1 << 20;

/// The pages of one column chunk, as cut points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChunkMap {
    /// The dictionary page: from the chunk's start to its first data page.
    pub dict: Option<Range<u64>>,
    /// `(file offset, row)` of each data page that begins a row, ascending;
    /// the first is the first data page, at row 0.
    pub cuts: Vec<(u64, u64)>,
    /// One past the chunk's last byte.
    pub end: u64,
    /// The row group's rows.
    pub rows: u64,
}

impl ChunkMap {
    /// The bytes of the data pages that hold rows `[a, b)` (`a < b <=
    /// rows`), and the rows those pages hold, `[first, last)`.
    pub(crate) fn cover(&self, a: u64, b: u64) -> (Range<u64>, Range<u64>) {
        let i = self.cuts.partition_point(|c| c.1 <= a).saturating_sub(1);
        let j = self.cuts.partition_point(|c| c.1 < b);
        let (start, first) = self.cuts[i];
        let (end, last) = self.cuts.get(j).copied().unwrap_or((self.end, self.rows));
        (start..end, first..last)
    }

    /// A map from parsed cut points, checked: inside `chunk` (`start..end`
    /// of the file), ascending in offset and row, the first at row 0 and
    /// every row below `rows`.
    fn checked(
        dict: Option<Range<u64>>,
        cuts: Vec<(u64, u64)>,
        chunk: Range<u64>,
        rows: u64,
    ) -> Result<Self, String> {
        let Some(&(first, first_row)) = cuts.first() else {
            return Err("no data pages".into());
        };
        if first_row != 0 || first < chunk.start {
            return Err(format!("the first data page starts at row {first_row}"));
        }
        for pair in cuts.windows(2) {
            if pair[1].0 <= pair[0].0 || pair[1].1 <= pair[0].1 {
                return Err("pages out of order".into());
            }
        }
        let (last, last_row) = cuts[cuts.len() - 1];
        if last >= chunk.end || last_row >= rows {
            return Err(format!(
                "a page at byte {last} (row {last_row}) outside the chunk's {}..{} ({rows} rows)",
                chunk.start, chunk.end
            ));
        }
        if let Some(d) = &dict
            && (d.start != chunk.start || d.end > first)
        {
            return Err("a dictionary page that is not the chunk's first".into());
        }
        Ok(ChunkMap {
            dict,
            cuts,
            end: chunk.end,
            rows,
        })
    }
}

/// The byte range `start..end` of `chunk` in the file, checked: non-negative
/// and inside the file's data (`data_end`).
pub(crate) fn chunk_range(chunk: &ColumnChunkMetaData, data_end: u64) -> Option<Range<u64>> {
    let (start, len) = chunk.byte_range();
    let end = start.checked_add(len)?;
    (end <= data_end).then_some(start..end)
}

/// The map of `chunk` (of a row group of `rows` rows) from its offset index,
/// `bytes` (what the footer's `offset_index_offset` and length point to).
pub(crate) fn from_offset_index(
    chunk: &ColumnChunkMetaData,
    range: Range<u64>,
    rows: u64,
    bytes: &[u8],
) -> Result<ChunkMap, String> {
    let index = parquet::file::page_index::index_reader::decode_offset_index(bytes)
        .map_err(|e| format!("its offset index: {e}"))?;
    let mut cuts = Vec::with_capacity(index.page_locations().len());
    for location in index.page_locations() {
        let offset = u64::try_from(location.offset).map_err(|_| "a negative page offset")?;
        let row = u64::try_from(location.first_row_index).map_err(|_| "a negative row")?;
        cuts.push((offset, row));
    }
    let dict = match (chunk.dictionary_page_offset(), cuts.first()) {
        (Some(_), Some(&(first, _))) if first > range.start => Some(range.start..first),
        _ => None,
    };
    ChunkMap::checked(dict, cuts, range, rows)
}

/// The map of `chunk` (of a row group of `rows` rows, at `range` of the
/// file) from its page headers, read with `read(offset, len)`; `None` for
/// a column whose pages cannot be cut (nested deeper than one list, or
/// levels in an encoding the own decoders do not read).
pub(crate) fn walk<E: From<String>>(
    chunk: &ColumnChunkMetaData,
    range: Range<u64>,
    rows: u64,
    limits: &Limits,
    read: &mut dyn FnMut(u64, u64) -> Result<Bytes, E>,
) -> Result<Option<ChunkMap>, E> {
    let max_rep = chunk.column_descr().max_rep_level();
    if max_rep > 1 {
        return Ok(None);
    }
    let path = chunk.column_path().string();
    let at_page = |at: u64, what: String| format!("column {path}, page at byte {at}: {what}");
    let (mut at, mut row) = (range.start, 0u64);
    let mut dict = None;
    let mut cuts = Vec::new();
    // The bytes last read, from `held.0`: small pages' headers come from one
    // read of many pages.
    let mut held: (u64, Bytes) = (range.start, Bytes::new());
    let mut bytes_at = |at: u64, len: u64, held: &mut (u64, Bytes)| -> Result<Bytes, E> {
        let (from, bytes) = &*held;
        if at >= *from && at + len <= from + bytes.len() as u64 {
            let start = (at - from) as usize;
            return Ok(bytes.slice(start..start + len as usize));
        }
        let fresh = read(at, len.max(HEADER_WINDOW).min(range.end - at))?;
        if (fresh.len() as u64) < len {
            return Err(
                format!("column {path}: {} bytes read of {len} at {at}", fresh.len()).into(),
            );
        }
        *held = (at, fresh.clone());
        Ok(fresh.slice(..len as usize))
    };
    while at < range.end {
        let left = range.end - at;
        let mut window = HEADER_BYTES.min(left);
        let (bytes, header, header_len) = loop {
            let bytes = bytes_at(at, window, &mut held)?;
            let mut thrift = Thrift::new(&bytes);
            let parsed = thrift.page_header().map(|h| (h, thrift.at as u64));
            match parsed {
                Ok((header, len)) => break (bytes, header, len),
                Err(_) if window < left.min(MAX_HEADER) => window = (window * 4).min(left),
                Err(e) => return Err(at_page(at, e).into()),
            }
        };
        let body = u64::try_from(header.compressed)
            .map_err(|_| at_page(at, format!("a page of {} bytes", header.compressed)))?;
        let page_end = at
            .checked_add(header_len)
            .and_then(|e| e.checked_add(body))
            .filter(|&e| e <= range.end)
            .ok_or_else(|| at_page(at, "a page overruns its column chunk".into()))?;
        let count = |n: i32| {
            u64::try_from(n).map_err(|_| at_page(at, format!("a page of {n} rows or values")))
        };
        match header.page_type {
            DICTIONARY_PAGE if cuts.is_empty() && dict.is_none() => dict = Some(at..page_end),
            DICTIONARY_PAGE => return Err(at_page(at, "a second dictionary page".into()).into()),
            DATA_PAGE_V2 => {
                cuts.push((at, row));
                row = row.saturating_add(count(header.num_rows)?);
            }
            DATA_PAGE if max_rep == 0 => {
                cuts.push((at, row));
                row = row.saturating_add(count(header.num_values)?);
            }
            DATA_PAGE => {
                if page_end - at > limits.max_bytes as u64 {
                    return Err(at_page(
                        at,
                        format!(
                            "a page of {} bytes, more than the byte budget",
                            page_end - at
                        ),
                    )
                    .into());
                }
                let page = if page_end - at <= bytes.len() as u64 {
                    bytes.slice(..(page_end - at) as usize)
                } else {
                    bytes_at(at, page_end - at, &mut held)?
                };
                let Some((starts, begins)) =
                    row_starts(chunk, at, page, limits).map_err(|e| E::from(at_page(at, e)))?
                else {
                    return Ok(None);
                };
                if begins {
                    cuts.push((at, row));
                } else if cuts.is_empty() {
                    return Err(at_page(at, "the first page continues a row".into()).into());
                }
                row = row.saturating_add(starts);
            }
            _ => {} // index pages
        }
        at = page_end;
    }
    if row != rows {
        return Err(
            format!("column {path}: its pages hold {row} rows, the footer says {rows}").into(),
        );
    }
    ChunkMap::checked(dict, cuts, range, rows)
        .map(Some)
        .map_err(|e| format!("column {path}: {e}").into())
}

/// The rows a V1 page of a list column starts (repetition levels 0), and
/// whether its first level starts one; `None` when its repetition levels
/// are not RLE. `page` is the page (header and body) at file offset `at`.
fn row_starts(
    chunk: &ColumnChunkMetaData,
    at: u64,
    page: Bytes,
    limits: &Limits,
) -> Result<Option<(u64, bool)>, String> {
    let len = page.len() as i64;
    let one = chunk
        .clone()
        .into_builder()
        .set_dictionary_page_offset(None)
        .set_data_page_offset(at as i64)
        .set_total_compressed_size(len)
        .set_offset_index_offset(None)
        .set_offset_index_length(None)
        .set_column_index_offset(None)
        .set_column_index_length(None)
        .build()
        .map_err(|e| e.to_string())?;
    let file = Arc::new(SparseFile::new(
        at.saturating_add(page.len() as u64),
        vec![(at, page)],
    ));
    let mut pages = Pages::open(file, &one, 1, limits).map_err(|e| e.to_string())?;
    let Some(Page::DataPage {
        buf,
        num_values,
        rep_level_encoding,
        ..
    }) = pages.next_page().map_err(|e| e.to_string())?
    else {
        return Err("not a data page".into());
    };
    if rep_level_encoding != Encoding::RLE {
        return Ok(None);
    }
    let (rep, _, _) = v1_levels(&buf)?;
    let (mut starts, mut begins) = (0u64, false);
    walk_bits(&rep, num_values as usize, |bits| match bits {
        Bits::Run { first, len, value } => {
            if value == 0 {
                starts += len as u64;
                begins |= first == 0;
            }
        }
        Bits::Byte { first, byte, valid } => {
            let zeros = !byte & low_bits(valid);
            starts += zeros.count_ones() as u64;
            begins |= first == 0 && zeros & 1 == 1;
        }
    })?;
    Ok(Some((starts, begins)))
}

#[cfg(test)]
mod tests {
    use super::ChunkMap;

    #[test]
    fn a_part_reads_the_pages_that_begin_its_rows_to_the_cut_after_them() {
        // Pages at bytes 10, 20 (continues a row: no cut), 30, 40; rows 0, 5, 9.
        let map =
            ChunkMap::checked(Some(0..10), vec![(10, 0), (30, 5), (40, 9)], 0..50, 12).unwrap();
        assert_eq!(map.cover(0, 5), (10..30, 0..5));
        assert_eq!(map.cover(4, 6), (10..40, 0..9));
        assert_eq!(map.cover(5, 9), (30..40, 5..9));
        assert_eq!(map.cover(9, 12), (40..50, 9..12));
        assert_eq!(map.cover(0, 12), (10..50, 0..12));
    }

    #[test]
    fn maps_that_contradict_their_chunk_are_refused() {
        let check = |dict, cuts: Vec<(u64, u64)>| ChunkMap::checked(dict, cuts, 0..50, 12);
        assert!(check(None, vec![]).is_err());
        assert!(
            check(None, vec![(0, 1)]).is_err(),
            "first page not at row 0"
        );
        assert!(
            check(None, vec![(0, 0), (20, 5), (10, 7)]).is_err(),
            "out of order"
        );
        assert!(
            check(None, vec![(0, 0), (20, 12)]).is_err(),
            "a row past the row group"
        );
        assert!(
            check(None, vec![(0, 0), (60, 3)]).is_err(),
            "a page past the chunk"
        );
        assert!(
            check(Some(0..20), vec![(10, 0)]).is_err(),
            "dictionary over a data page"
        );
    }
}
