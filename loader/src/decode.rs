//! Decoding on threads: check each fetched column chunk against its
//! checksum, then decode the row group's projected columns with the own
//! Parquet reader ([`crate::parquet`]), keeping the segment's rows.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use crossbeam_channel::Sender;
use shardfeed_format::failpoint::Action;
use shardfeed_format::panic::catch;
use shardfeed_format::{Manifest, ShardEntry};
use tokio::sync::OwnedSemaphorePermit;

use crate::config::{Config, OnError};
use crate::error::Stage;
use crate::error::{LoaderError, Result};
use crate::fetch::MappedCheck;
use crate::fetch::stage::continuations;
use crate::parquet::{Limits, SparseFile, decode_row_group_at_least};
use crate::plan::Segment;
use crate::shard::{check_chunk, check_chunk_sum, check_pages};
use crate::stage::{Decoded, DecodedSegment, Fetched, injected};
use crate::stats::Counters;

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
        parts,
        ..
    } = fetched;
    let footer = footer?;
    let rg = segment.row_group as usize;
    let limits = Limits::of_budget(byte_budget);
    if !parts.is_empty() {
        return decode_part(
            segment, footer, chunks, parts, entry, roots, &limits, counters,
        );
    }
    for (leaf, _, bytes, sum) in &chunks {
        match sum {
            Some(sum) => check_chunk_sum(entry, &footer.footer, rg, *leaf, *sum)?,
            None => check_chunk(entry, &footer.footer, rg, *leaf, bytes)?,
        }
    }
    let file = sparse(entry, chunks);
    // Rows past the segment's end are not needed: a prefix of the row
    // group (the own decoders stop after the pages that cover it).
    let rows = footer.footer.metadata.row_group(rg).num_rows() as usize;
    let want = (segment.end as usize).min(rows);
    let decoded = counted(
        entry,
        rg,
        counters,
        decode_row_group_at_least(
            Arc::new(file),
            &footer.arrow,
            rg,
            roots,
            Some(want),
            &limits,
        ),
    )?;
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

/// Check and decode a part of a large row group (see
/// [`crate::fetch`]'s parts): the chunks fetched whole are checked against
/// their checksums, and pages fetched for the part against their pages'
/// checksums, where the index has them.
#[allow(clippy::too_many_arguments)]
fn decode_part(
    segment: Segment,
    footer: Arc<crate::stage::FooterInfo>,
    chunks: Vec<crate::stage::FetchedChunk>,
    parts: Vec<crate::parquet::LeafPart>,
    entry: &ShardEntry,
    roots: &[usize],
    limits: &Limits,
    counters: &Counters,
) -> Result<DecodedRows> {
    let rg = segment.row_group as usize;
    let meta = footer.footer.metadata.row_group(rg);
    for (leaf, at, bytes, _) in &chunks {
        if meta.column(*leaf).byte_range() == (*at, bytes.len() as u64) {
            check_chunk(entry, &footer.footer, rg, *leaf, bytes)?;
            continue;
        }
        // A dictionary page lies where it was read; data pages were read
        // from `data_origin`.
        let origin = parts
            .iter()
            .find(|p| p.leaf == *leaf && p.chunk.data_page_offset() as u64 == *at)
            .map_or(*at, |p| p.data_origin);
        check_pages(entry, &footer.footer, rg, *leaf, origin, bytes)?;
    }
    let file = sparse(entry, chunks);
    let want = segment.start as usize..segment.end as usize;
    let batch = counted(
        entry,
        rg,
        counters,
        crate::parquet::decode_part(
            Arc::new(file),
            &footer.arrow,
            rg,
            roots,
            &parts,
            want,
            limits,
        ),
    )?;
    Ok(DecodedRows {
        rows: vec![batch],
        beyond: None,
    })
}

/// A decode's result, its error naming the shard and row group, the
/// decode paths it took counted.
fn counted<T>(
    entry: &ShardEntry,
    rg: usize,
    counters: &Counters,
    decoded: parquet::errors::Result<(T, crate::parquet::DecodePaths)>,
) -> Result<T> {
    let (decoded, paths) = decoded.map_err(|source| LoaderError::Decode {
        shard: entry.path.clone(),
        row_group: Some(rg),
        source,
    })?;
    counters.add_paths(&paths);
    Ok(decoded)
}

/// The fetched chunks of `entry`'s file, as a file.
fn sparse(entry: &ShardEntry, chunks: Vec<crate::stage::FetchedChunk>) -> SparseFile {
    SparseFile::new(
        entry.bytes,
        chunks
            .into_iter()
            .map(|(_, start, b, _)| (start, b))
            .collect(),
    )
}

/// The decode threads' shared end of the fetch stage's channel.
pub(crate) type FetchedRx =
    Arc<Mutex<tokio::sync::mpsc::Receiver<Result<(Fetched, OwnedSemaphorePermit)>>>>;

/// Whether `error` is about damaged bytes of one row group (what
/// [`OnError::Skip`] skips), rather than storage, options or a bug.
fn is_damage(error: &LoaderError) -> bool {
    matches!(
        error,
        LoaderError::Corrupt {
            row_group: Some(_),
            ..
        } | LoaderError::Decode {
            row_group: Some(_),
            ..
        }
    )
}

/// Rows decoded past a segment's end, kept for the later segment of the same
/// row group that starts there: an epoch's first window is the first slices
/// of its row groups and the rest of each is a later segment, and decoding a
/// slice usually decodes the whole page under it (often the whole chunk).
/// The rest is decoded once, not twice. Which decode thread gets there first
/// decides only whether the later segment finds its rows here or decodes
/// them itself: the same rows either way. At most the first window's rows
/// wait here.
pub(crate) struct Stash {
    /// `(shard, row group, first row)` of the segments that continue an
    /// earlier segment of their row group.
    wanted: HashSet<(u32, u32, u32)>,
    rows: Mutex<HashMap<(u32, u32, u32), Vec<RecordBatch>>>,
}

impl Stash {
    pub(crate) fn new(segments: &[(u64, Segment)]) -> Self {
        let wanted = continuations(segments)
            .into_iter()
            .map(|(_, later)| {
                let s = segments[later].1;
                (s.shard, s.row_group, s.start)
            })
            .collect();
        Stash {
            wanted,
            rows: Mutex::new(HashMap::new()),
        }
    }

    /// Keep `rows` (row group rows from `from` on, decoded for `segment`) if
    /// a later segment starts there.
    fn put(&self, segment: &Segment, from: u32, rows: Vec<RecordBatch>) {
        let key = (segment.shard, segment.row_group, from);
        if self.wanted.contains(&key) {
            self.rows.lock().expect("stash").insert(key, rows);
        }
    }

    /// `segment`'s rows, when an earlier segment decoded all of them.
    fn take(&self, segment: &Segment) -> Option<Vec<RecordBatch>> {
        let key = (segment.shard, segment.row_group, segment.start);
        if !self.wanted.contains(&key) {
            return None;
        }
        let batches = self.rows.lock().expect("stash").remove(&key)?;
        let want = segment.rows() as usize;
        let have: usize = batches.iter().map(|b| b.num_rows()).sum();
        if have < want {
            return None;
        }
        Some(crate::parquet::prefix(batches, want))
    }
}

/// A decode thread of one pass.
pub(crate) struct Decoder {
    pub stash: Arc<Stash>,
    pub rx: FetchedRx,
    pub tx: Sender<Decoded>,
    pub manifest: Arc<Manifest>,
    pub roots: Vec<usize>,
    pub counters: Arc<Counters>,
    pub config: Arc<Config>,
    pub cancel: Arc<AtomicBool>,
    pub schema: SchemaRef,
    /// What is handed on of the decoded columns (fields out of structs).
    pub columns: Arc<crate::select::Columns>,
    pub fetched_all: Arc<AtomicBool>,
    /// Tells a mapped shard that changed under its decoder ([`crate::mapfile`]).
    pub mapped: MappedCheck,
}

/// Lowers the calling thread's scheduling priority by `niceness` (capped
/// at 19, the lowest). Linux only, where the nice value is the thread's own
/// (threads it starts inherit it); elsewhere, or when the call fails,
/// nothing changes.
pub(crate) fn lower_priority(niceness: u8) {
    #[cfg(target_os = "linux")]
    if niceness > 0 {
        // SAFETY: system calls on the calling thread's own id, and its own
        // errno.
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            // -1 is a valid nice value as well as the error return.
            *libc::__errno_location() = 0;
            let current = libc::getpriority(libc::PRIO_PROCESS, tid);
            if current != -1 || *libc::__errno_location() == 0 {
                let lowered = current.saturating_add(i32::from(niceness)).min(19);
                libc::setpriority(libc::PRIO_PROCESS, tid, lowered);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = niceness;
}

impl Decoder {
    /// Decode until the pass ends; a thread that stops before then (without
    /// having sent an error) reports it, so that the segment it held is
    /// never silently missing.
    pub(crate) fn run(self) {
        if let Err(detail) = self.work()
            && !self.cancel.load(Ordering::SeqCst)
        {
            let _ = self.tx.send((
                u64::MAX,
                Err(LoaderError::stage(detail.0, None, None, detail.1)),
                None,
            ));
        }
    }

    /// The decode loop; `Err((stage, what))` when it ends before the pass
    /// does without having sent an error.
    fn work(&self) -> std::result::Result<(), (Stage, &'static str)> {
        loop {
            let waiting = Instant::now();
            let next = self.rx.lock().expect("fetch receiver").blocking_recv();
            Counters::add_time(&self.counters.decode_blocked_in_ns, waiting.elapsed());
            let Some(item) = next else {
                if self.fetched_all.load(Ordering::SeqCst) {
                    return Ok(());
                }
                return Err((
                    Stage::Fetch,
                    "stopped before every segment of the pass was fetched",
                ));
            };
            self.counters.decode_queue.fetch_sub(1, Ordering::Relaxed);
            let started = Instant::now();
            let mut args = crate::trace::Args::None;
            let (seq, result, permit) = match item {
                Ok((fetched, permit)) => {
                    let seq = fetched.seq;
                    args = crate::trace::Args::RowGroup {
                        shard: fetched.segment.shard,
                        row_group: fetched.segment.row_group,
                    };
                    (seq, self.decode(seq, fetched), Some(permit))
                }
                Err(e) => (u64::MAX, Err(e), None),
            };
            Counters::add_time(&self.counters.decode_busy_ns, started.elapsed());
            self.counters.span("decode", started, args);
            if let Some(t) = &self.counters.trace {
                t.counter(
                    "decode_queue",
                    self.counters.decode_queue.load(Ordering::Relaxed),
                );
            }
            let result = match result {
                Err(e) if self.config.on_error == OnError::Skip && is_damage(&e) => {
                    self.skip(e).map(|()| DecodedSegment::Skipped {
                        schema: self.schema.clone(),
                    })
                }
                Err(LoaderError::Closed) => {
                    return Err((
                        Stage::Decode,
                        "a decode thread stopped before the end of the pass",
                    ));
                }
                other => other,
            };
            let failed = result.is_err();
            let sending = Instant::now();
            let sent = self.tx.send((seq, result, permit));
            Counters::add_time(&self.counters.decode_blocked_out_ns, sending.elapsed());
            if sent.is_err() || failed {
                return Ok(());
            }
        }
    }

    /// Check and decode one fetched segment, as stage code.
    fn decode(&self, seq: u64, fetched: Fetched) -> Result<DecodedSegment> {
        let segment = fetched.segment;
        let entry = &self.manifest.shards[segment.shard as usize];
        let action = self.config.failpoints.hit("decode", seq);
        if let Some(Action::Slow(ms)) = action {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let decoded = catch(|| match action {
            None | Some(Action::Slow(_)) => {
                if let Some(rows) = self.stash.take(&segment) {
                    return Ok(rows);
                }
                let decoded = decode(
                    fetched,
                    entry,
                    &self.roots,
                    self.config.byte_budget,
                    &self.counters,
                )?;
                if let Some((from, rows)) = decoded.beyond {
                    self.stash.put(&segment, from, rows);
                }
                Ok(decoded.rows)
            }
            Some(Action::Stop) => Err(LoaderError::Closed),
            Some(action) => Err(injected(Stage::Decode, action, &self.cancel)),
        });
        let named = |detail: String| {
            LoaderError::stage(
                Stage::Decode,
                Some(entry.path.clone()),
                Some(segment.row_group as usize),
                detail,
            )
        };
        // Damage found (or a panic) in a mapped shard that was truncated or
        // rewritten after its chunks were checked (decoded zeros past its
        // new end, or new bytes): that is the error, not the damage, which
        // `on_error="skip"` would skip. (The collator checks again whatever
        // reaches it.)
        if !matches!(decoded, Ok(Ok(_)) | Ok(Err(LoaderError::Closed))) {
            self.mapped.check()?;
        }
        match decoded {
            Ok(Ok(batches)) => batches
                .into_iter()
                .map(|b| self.columns.select(b))
                .collect::<Result<Vec<_>>>()
                .map(DecodedSegment::Rows),
            Ok(Err(LoaderError::Stage {
                stage: Stage::Decode,
                detail,
                ..
            })) => Err(named(detail)),
            Ok(Err(e)) => Err(e),
            Err(message) => Err(named(format!("panic: {message}"))),
        }
    }

    /// Record a skipped row group; an error once more than `max_skipped`
    /// distinct row groups were skipped over the loader's life.
    fn skip(&self, error: LoaderError) -> Result<()> {
        let (shard, row_group) = match &error {
            LoaderError::Corrupt {
                shard, row_group, ..
            }
            | LoaderError::Decode {
                shard, row_group, ..
            } => (shard.clone(), row_group.unwrap_or(0)),
            _ => unreachable!("only damage is skipped"),
        };
        let count = self
            .counters
            .record_skip(&shard, row_group, &error.to_string());
        if count as u64 > self.config.max_skipped {
            return Err(LoaderError::TooManySkipped {
                max: self.config.max_skipped,
                last: Box::new(error),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    /// The calling thread's nice value, as the kernel reports it.
    #[cfg(target_os = "linux")]
    fn nice() -> i32 {
        // SAFETY: a system call on the calling thread's own id.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    /// A thread lowers its own priority only, by the increment asked for,
    /// capped at 19.
    #[cfg(target_os = "linux")]
    #[test]
    fn lower_priority_lowers_the_calling_thread_only() {
        let before = nice();
        let (lowered, capped, unchanged) = std::thread::spawn(|| {
            let base = nice();
            super::lower_priority(0);
            let unchanged = nice() == base;
            super::lower_priority(3);
            let lowered = nice() - base;
            super::lower_priority(19);
            (lowered, nice(), unchanged)
        })
        .join()
        .unwrap();
        assert_eq!(lowered, 3.min(19 - before));
        assert_eq!(capped, 19);
        assert!(unchanged);
        assert_eq!(nice(), before, "the caller's thread is left as it was");
    }

    use arrow_array::{Array, Int64Array, RecordBatch};

    use super::Stash;
    use crate::plan::test_segment as seg;

    fn ids(from: i64, to: i64) -> RecordBatch {
        RecordBatch::try_from_iter([(
            "id",
            Arc::new(Int64Array::from_iter_values(from..to)) as Arc<dyn Array>,
        )])
        .unwrap()
    }

    #[test]
    fn stash_serves_the_rest_of_a_row_group_once() {
        let head = seg(0, 1, 0, 4);
        let tail = seg(0, 1, 4, 30);
        let other = seg(0, 2, 0, 30);
        let stash = Stash::new(&[(0, head), (1, other), (2, tail)]);
        // Nothing kept for a segment no later one continues.
        stash.put(&other, 30, vec![ids(30, 31)]);
        assert!(stash.rows.lock().unwrap().is_empty());
        // Too few rows: the tail decodes itself.
        stash.put(&head, 4, vec![ids(4, 20)]);
        assert!(stash.take(&tail).is_none());
        // The whole rest, in two batches: served once, exactly the tail's rows.
        stash.put(&head, 4, vec![ids(4, 20), ids(20, 30)]);
        let rows = stash.take(&tail).expect("served");
        let got: Vec<i64> = rows
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(got, (4..30).collect::<Vec<_>>());
        assert!(stash.take(&tail).is_none(), "served twice");
        // A tail ending before the row group does keeps only its rows.
        let short = seg(0, 1, 4, 10);
        let stash = Stash::new(&[(0, head), (1, short)]);
        stash.put(&head, 4, vec![ids(4, 30)]);
        let rows = stash.take(&short).expect("served");
        assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 6);
    }
}
