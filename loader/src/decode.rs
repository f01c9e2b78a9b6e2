//! Decoding on threads: check each fetched column chunk against its
//! checksum, then decode the row group's projected columns with the own
//! Parquet reader ([`crate::parquet`]), keeping the segment's rows.

use std::sync::Arc;

use arrow_array::RecordBatch;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use shardfeed_format::{ChunkSum, ShardEntry};

use crate::parquet::{Limits, SparseFile, decode_row_group_at_least};
use crate::plan::Segment;
use crate::shard::{ShardFooter, check_chunk, check_chunk_sum};
use crate::stats::Counters;
use crate::{LoaderError, Result};

/// A shard's checked footer, ready for decoding.
pub(crate) struct FooterInfo {
    pub footer: ShardFooter,
    pub arrow: ArrowReaderMetadata,
}

/// The fetched column chunks of one segment's row group.
pub(crate) struct Fetched {
    pub seq: u64,
    pub segment: Segment,
    pub footer: Arc<FooterInfo>,
    /// `(leaf column, file offset, bytes, checksum)`, one per projected
    /// column chunk: owned bytes, read from the store or a local file; the
    /// checksum when it was computed as the bytes were read.
    pub chunks: Vec<(usize, u64, Bytes, Option<ChunkSum>)>,
}

/// A fetched segment, checked and decoded: its rows, as one or more
/// batches; and the rows after them that decoding produced on the way (the
/// rest of the pages that cover the segment's end), with the row group row
/// they start at, for a later segment of the same row group.
pub(crate) struct DecodedRows {
    pub rows: Vec<RecordBatch>,
    pub beyond: Option<(u32, Vec<RecordBatch>)>,
}

/// Check and decode a fetched segment.
/// No column may decode to more than `byte_budget` bytes.
pub(crate) fn decode(
    fetched: Fetched,
    entry: &ShardEntry,
    roots: &[usize],
    byte_budget: u64,
    counters: &Counters,
) -> Result<DecodedRows> {
    let Fetched {
        segment,
        footer,
        chunks,
        ..
    } = fetched;
    let rg = segment.row_group as usize;
    for (leaf, _, bytes, sum) in &chunks {
        match sum {
            Some(sum) => check_chunk_sum(entry, &footer.footer, rg, *leaf, *sum)?,
            None => check_chunk(entry, &footer.footer, rg, *leaf, bytes)?,
        }
    }
    let file = SparseFile::new(
        entry.bytes,
        chunks
            .into_iter()
            .map(|(_, start, b, _)| (start, b))
            .collect(),
    );
    let limits = Limits {
        max_bytes: usize::try_from(byte_budget).unwrap_or(usize::MAX),
    };
    // Rows past the segment's end are not needed: a prefix of the row
    // group (the own decoders stop after the pages that cover it).
    let rows = footer.footer.metadata.row_group(rg).num_rows() as usize;
    let want = (segment.end as usize).min(rows);
    let (decoded, paths) = decode_row_group_at_least(
        Arc::new(file),
        &footer.arrow,
        rg,
        roots,
        Some(want),
        &limits,
    )
    .map_err(|source| LoaderError::Decode {
        shard: entry.path.clone(),
        row_group: Some(rg),
        source,
    })?;
    counters.add_paths(&paths);
    // Keep the segment's rows [start, end) of the row group; the rows
    // decoded past `end` go back separately.
    let (start, end) = (segment.start as usize, segment.end as usize);
    let mut out = Vec::new();
    let mut beyond = Vec::new();
    let mut at = 0usize;
    for batch in decoded {
        let n = batch.num_rows();
        let (lo, hi) = (start.max(at), end.min(at + n));
        if lo < hi {
            out.push(if lo == at && hi == at + n {
                batch.clone()
            } else {
                batch.slice(lo - at, hi - lo)
            });
        }
        if at + n > end {
            let from = end.max(at);
            beyond.push(batch.slice(from - at, at + n - from));
        }
        at += n;
    }
    if at < want || at > rows {
        return Err(LoaderError::Corrupt {
            shard: entry.path.clone(),
            row_group: Some(rg),
            detail: format!("decoded {at} of the {want} rows asked of {rows}"),
        });
    }
    Ok(DecodedRows {
        rows: out,
        beyond: (!beyond.is_empty()).then_some((segment.end, beyond)),
    })
}
