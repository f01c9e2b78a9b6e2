//! Parts of large row groups. An index's row groups are its writers'
//! (pyarrow's, Spark's and DuckDB's hold 128 MB to 1 GB); where the byte
//! budget cannot hold what two shuffle windows of them touch, the plan cuts
//! them into parts ([`crate::plan::PlanOptions::part_rows`]). A part is
//! fetched as its columns' dictionary pages and the data pages that cover
//! its rows ([`crate::parquet::pagemap`]), so memory follows the part, not
//! the row group, and the first batch does not wait for a whole row group.
//!
//! Each row group's page maps are made once per loader (from the offset
//! index where the writer wrote one, else from the page headers) and kept
//! for later parts and epochs.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::error::{LoaderError, Result};
use crate::parquet::pagemap::{self, ChunkMap, chunk_range};
use crate::parquet::{LeafPart, Limits, projection};
use crate::plan::Segment;
use crate::stage::{Fetched, FooterInfo};

use super::{FetchContext, decoded_bytes, mapped_read, permits};

/// The page maps of a row group's projected leaves: `None` for a leaf read
/// whole (a column of several leaves, or one whose pages cannot be cut).
pub(crate) type RowGroupMaps = Arc<Vec<(usize, Option<ChunkMap>)>>;

/// The page maps kept take at most this share of the byte budget (a cut
/// is 16 bytes: a 1 GB row group of 40 columns of 1 MiB pages has 40,000).
const KEPT_MAPS_BUDGET_SHARE: u64 = 64;

/// The longest offset index read (16 to 30 bytes per page: 64 MiB is
/// millions of pages).
const MAX_OFFSET_INDEX: u64 = 64 << 20;

/// The least page maps' bytes kept, whatever the budget.
const MIN_KEPT_MAPS: u64 = 1 << 20;

/// Page maps by (shard, row group), made once each, kept within a share of
/// the byte budget (oldest dropped first; a dropped map is made again when
/// a later part needs it).
#[derive(Default)]
pub(crate) struct MapCache {
    cells: Mutex<MapCells>,
}

#[derive(Default)]
struct MapCells {
    cells: HashMap<(u32, u32), Arc<tokio::sync::OnceCell<RowGroupMaps>>>,
    /// Keys in insertion order, with their maps' bytes once made.
    order: VecDeque<((u32, u32), u64)>,
    bytes: u64,
}

impl MapCache {
    fn cell(&self, key: (u32, u32)) -> Arc<tokio::sync::OnceCell<RowGroupMaps>> {
        let mut kept = self.cells.lock().expect("map cache lock");
        if let Some(cell) = kept.cells.get(&key) {
            return cell.clone();
        }
        let cell = Arc::new(tokio::sync::OnceCell::new());
        kept.cells.insert(key, cell.clone());
        kept.order.push_back((key, 0));
        cell
    }

    /// Count `maps`, made for `key`, and drop the oldest maps while the
    /// kept ones pass `limit` bytes (never the one just made).
    fn made(&self, key: (u32, u32), maps: &RowGroupMaps, limit: u64) {
        let size: u64 = maps
            .iter()
            .filter_map(|(_, m)| m.as_ref())
            .map(|m| (m.cuts.len() as u64).saturating_mul(16))
            .fold(64, u64::saturating_add);
        let mut kept = self.cells.lock().expect("map cache lock");
        let MapCells {
            cells,
            order,
            bytes,
        } = &mut *kept;
        if let Some(entry) = order.iter_mut().find(|(k, s)| *k == key && *s == 0) {
            entry.1 = size;
            *bytes = bytes.saturating_add(size);
        }
        while *bytes > limit && order.front().is_some_and(|(k, _)| *k != key) {
            let (old, size) = order.pop_front().expect("a front entry");
            cells.remove(&old);
            *bytes = bytes.saturating_sub(size);
        }
    }
}

impl FetchContext {
    /// Whether `segment` is a part of a row group cut into parts of at
    /// most `part_rows` rows.
    pub(crate) fn is_part(&self, segment: Segment, part_rows: u64) -> bool {
        part_rows > 0
            && self
                .entry(segment.shard)
                .row_groups
                .get(segment.row_group as usize)
                .is_some_and(|&rows| rows > part_rows)
    }

    /// The page maps of `segment`'s row group, made at its first part.
    pub(crate) async fn page_maps(
        self: &Arc<Self>,
        segment: Segment,
        footer: &Arc<FooterInfo>,
        limits: Limits,
    ) -> Result<RowGroupMaps> {
        let key = (segment.shard, segment.row_group);
        let cell = self.maps_kept.cell(key);
        cell.get_or_try_init(|| async {
            let this = self.clone();
            let footer = footer.clone();
            let handle = tokio::runtime::Handle::current();
            let maps = tokio::task::spawn_blocking(move || {
                this.make_maps(&handle, segment, &footer, limits)
            })
            .await
            .map_err(|e| LoaderError::Io {
                op: format!("map the pages of {}", self.entry(segment.shard).path),
                source: std::io::Error::other(e.to_string()),
            })??;
            let limit = (limits.max_bytes as u64 / KEPT_MAPS_BUDGET_SHARE).max(MIN_KEPT_MAPS);
            self.maps_kept.made(key, &maps, limit);
            Ok(maps)
        })
        .await
        .cloned()
    }

    /// [`FetchContext::page_maps`], on a blocking thread: its reads wait on
    /// `handle`.
    fn make_maps(
        &self,
        handle: &tokio::runtime::Handle,
        segment: Segment,
        footer: &FooterInfo,
        limits: Limits,
    ) -> Result<RowGroupMaps> {
        let entry = self.entry(segment.shard);
        let g = segment.row_group as usize;
        let rg = footer.footer.metadata.row_group(g);
        let rows = u64::try_from(rg.num_rows()).unwrap_or(0);
        let data_end = entry.bytes.saturating_sub(entry.footer_len);
        let corrupt = |detail: String| LoaderError::Corrupt {
            shard: entry.path.clone(),
            row_group: Some(g),
            detail,
        };
        let (leaves, _) = projection(&footer.arrow, &self.roots);
        let descr = footer.footer.metadata.file_metadata().schema_descr();
        let root_of = |leaf: usize| descr.get_column_root_idx(leaf);
        let read = |at: u64, len: u64| -> Result<Bytes> {
            let end = at
                .checked_add(len)
                .filter(|&end| end <= data_end)
                .ok_or_else(|| corrupt(format!("bytes {at}+{len} lie outside the file's data")))?;
            let mut parts = handle.block_on(self.read_ranges(
                segment.shard,
                std::iter::once(at..end).collect(),
                None,
                vec![false],
            ))?;
            Ok(parts.remove(0).0)
        };
        let mut maps = Vec::with_capacity(leaves.len());
        for &leaf in &leaves {
            let chunk = rg.column(leaf);
            let single = leaves
                .iter()
                .filter(|&&l| root_of(l) == root_of(leaf))
                .count()
                == 1;
            if !single {
                maps.push((leaf, None));
                continue;
            }
            let range = chunk_range(chunk, data_end).ok_or_else(|| {
                corrupt(format!("column chunk {leaf} lies outside the file's data"))
            })?;
            // An offset index longer than its chunk or than
            // `MAX_OFFSET_INDEX` is not read (the page headers are).
            let index_bound = (range.end - range.start).min(MAX_OFFSET_INDEX);
            let from_index = match (chunk.offset_index_offset(), chunk.offset_index_length()) {
                (Some(at), Some(len)) if at >= 0 && len > 0 && len as u64 <= index_bound => {
                    read(at as u64, len as u64).ok().and_then(|bytes| {
                        pagemap::from_offset_index(chunk, range.clone(), rows, &bytes).ok()
                    })
                }
                _ => None,
            };
            let map = match from_index {
                Some(map) => Some(map),
                None => pagemap::walk(chunk, range, rows, &limits, &mut |at, len| {
                    read(at, len).map_err(|e| e.to_string())
                })
                .map_err(&corrupt)?,
            };
            maps.push((leaf, map));
        }
        Ok(Arc::new(maps))
    }

    /// Budget permits (KiB) a part takes: per leaf, the larger of the bytes
    /// fetched (dictionary and covering pages, or the whole chunk) and their
    /// share of what the chunk decodes to; at least one, at most `max_unit`.
    pub(crate) fn part_cost(
        &self,
        footer: &FooterInfo,
        segment: Segment,
        maps: &RowGroupMaps,
        max_unit: u32,
    ) -> u32 {
        let rg = footer.footer.metadata.row_group(segment.row_group as usize);
        let bytes = maps
            .iter()
            .map(|(leaf, map)| {
                let chunk = rg.column(*leaf);
                let whole = chunk.compressed_size().max(0) as u64;
                let fetched = map.as_ref().map_or(whole, |map| {
                    let (data, _) = map.cover(segment.start as u64, segment.end as u64);
                    map.dict.as_ref().map_or(0, |d| d.end - d.start) + (data.end - data.start)
                });
                let decoded =
                    (decoded_bytes(chunk) as u128 * fetched as u128 / whole.max(1) as u128) as u64;
                fetched.max(decoded)
            })
            .fold(0, u64::saturating_add);
        permits(bytes, max_unit)
    }

    /// Fetch the pages of a part: per leaf, its dictionary page and the data
    /// pages that cover the part's rows (placed right after the dictionary,
    /// as [`LeafPart::chunk`] says), or its whole chunk.
    pub(crate) async fn fetch_part(
        &self,
        seq: u64,
        segment: Segment,
        footer: Arc<FooterInfo>,
        maps: &RowGroupMaps,
    ) -> Result<Fetched> {
        let entry = self.entry(segment.shard);
        let g = segment.row_group as usize;
        let rg = footer.footer.metadata.row_group(g);
        let rows = rg.num_rows().max(0) as usize;
        let data_end = entry.bytes.saturating_sub(entry.footer_len);
        let (a, b) = (segment.start as u64, segment.end as u64);
        // (leaf, where its bytes go, the file range read)
        let mut reads: Vec<(usize, u64, std::ops::Range<u64>)> = Vec::new();
        let mut parts = Vec::with_capacity(maps.len());
        for (leaf, map) in maps.iter() {
            let chunk = rg.column(*leaf);
            let part = match map {
                None => {
                    let range =
                        chunk_range(chunk, data_end).ok_or_else(|| LoaderError::Corrupt {
                            shard: entry.path.clone(),
                            row_group: Some(g),
                            detail: format!("column chunk {leaf} lies outside the file's data"),
                        })?;
                    let data_origin = chunk.data_page_offset().max(0) as u64;
                    reads.push((*leaf, range.start, range));
                    LeafPart {
                        leaf: *leaf,
                        chunk: chunk.clone(),
                        first: 0,
                        rows,
                        data_origin,
                    }
                }
                Some(map) => {
                    let (data, held) = map.cover(a, b);
                    let data_at = match &map.dict {
                        Some(dict) => {
                            reads.push((*leaf, dict.start, dict.clone()));
                            dict.end
                        }
                        None => data.start,
                    };
                    let dict_len = map.dict.as_ref().map_or(0, |d| d.end - d.start);
                    let whole = chunk.compressed_size().max(1) as u128;
                    let len = dict_len + (data.end - data.start);
                    reads.push((*leaf, data_at, data.clone()));
                    let part_chunk = chunk
                        .clone()
                        .into_builder()
                        .set_dictionary_page_offset(map.dict.as_ref().map(|d| d.start as i64))
                        .set_data_page_offset(data_at as i64)
                        .set_total_compressed_size(len as i64)
                        .set_num_values(
                            (chunk.num_values().max(0) as u128 * len as u128 / whole) as i64 + 1,
                        )
                        .set_offset_index_offset(None)
                        .set_offset_index_length(None)
                        .set_column_index_offset(None)
                        .set_column_index_length(None)
                        .build()
                        .map_err(|source| LoaderError::Decode {
                            shard: entry.path.clone(),
                            row_group: Some(g),
                            source,
                        })?;
                    LeafPart {
                        leaf: *leaf,
                        chunk: part_chunk,
                        first: held.start as usize,
                        rows: (held.end - held.start) as usize,
                        data_origin: data.start,
                    }
                }
            };
            parts.push(part);
        }
        let mappable: Vec<bool> = reads
            .iter()
            .map(|(leaf, _, _)| mapped_read(rg, *leaf))
            .collect();
        let ranges = reads.iter().map(|(_, _, r)| r.clone()).collect();
        let bytes = self
            .read_ranges(segment.shard, ranges, None, mappable)
            .await?;
        let chunks = reads
            .into_iter()
            .zip(bytes)
            .map(|((leaf, at, _), (bytes, _))| (leaf, at, bytes, None))
            .collect();
        Ok(Fetched {
            seq,
            segment,
            footer: Ok(footer),
            chunks,
            parts,
        })
    }
}
