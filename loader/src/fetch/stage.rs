//! The fetch stage of one pass: admits segments in plan order within the
//! byte budget, reads their column chunks (a row group's rest reuses its
//! first slice's read), and hands them to the decode threads in plan order.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use futures::{FutureExt, StreamExt};
use shardfeed_format::failpoint::Action;
use shardfeed_format::panic::{message as panic_message, quietly};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Config;
use crate::error::{LoaderError, Result, Stage};
use crate::fetch::FetchContext;
use crate::plan::Segment;
use crate::stage::{Decoded, Fetched, injected};
use crate::stats::Counters;

/// A future polled with its panics kept quiet (they are caught around it).
struct Quiet<F>(F);

impl<F: Future + Unpin> Future for Quiet<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        quietly(|| Pin::new(&mut self.0).poll(cx))
    }
}

/// What the fetch stage of a pass works with.
pub(crate) struct FetchStage {
    pub fetch: Arc<FetchContext>,
    /// The byte budget, in KiB permits, over every pass.
    pub permits: Arc<Semaphore>,
    pub counters: Arc<Counters>,
    pub config: Arc<Config>,
    pub cancel: Arc<AtomicBool>,
    /// The pass's segments from its first window on, by sequence number,
    /// and how each one's read is shared ([`shared_fetches`]).
    pub segments: Vec<(u64, Segment)>,
    pub shares: Vec<Share>,
    pub first_seq: u64,
    /// To the decode threads.
    pub fetched_tx: tokio::sync::mpsc::Sender<Result<(Fetched, OwnedSemaphorePermit)>>,
    /// Set once every segment of the pass (or an error) was sent: a decode
    /// thread that finds the channel closed before then reports that the
    /// fetch stage stopped.
    pub fetched_all: Arc<AtomicBool>,
    /// Where a panic of the stage is reported (to the shuffle stage).
    pub decoded_tx: Sender<Decoded>,
}

impl FetchStage {
    /// Run the stage on `runtime` until the pass is fetched, fails or is
    /// cancelled.
    pub(crate) fn spawn(self, runtime: &tokio::runtime::Runtime) -> tokio::task::JoinHandle<()> {
        let FetchStage {
            fetch,
            permits,
            counters,
            config,
            cancel,
            segments,
            shares,
            first_seq,
            fetched_tx,
            fetched_all,
            decoded_tx,
        } = self;
        let fetched_all_by_work = fetched_all.clone();
        let semaphore = permits;
        // The most permits one row group takes: `needed_units` of them
        // always fit the budget, so a large row group cannot deadlock
        // a window waiting for its last member.
        let total = (config.in_flight_bytes >> 10).clamp(1, u32::MAX as u64) as u32;
        let max_unit = (total as u64 / config.needed_units.max(1)).max(1) as u32;
        // Parts of large row groups: the page maps of the row groups the
        // first two windows read are made side by side (the admission below
        // waits for them one by one, in plan order).
        let warm = {
            // The first part of each such row group, in plan order.
            let mut first: Vec<Segment> = Vec::new();
            for (_, s) in segments.iter().take(2 * config.window.max(1)) {
                if fetch.is_part(*s, config.part_rows)
                    && !first
                        .iter()
                        .any(|f| (f.shard, f.row_group) == (s.shard, s.row_group))
                {
                    first.push(*s);
                }
            }
            let fetch = fetch.clone();
            let limits = crate::parquet::Limits::of_budget(config.byte_budget);
            let cancel = cancel.clone();
            let threads = config.decode_threads.max(1);
            async move {
                futures::stream::iter(first)
                    .for_each_concurrent(threads, |segment| {
                        let fetch = fetch.clone();
                        let cancel = cancel.clone();
                        async move {
                            if cancel.load(Ordering::SeqCst) {
                                return;
                            }
                            // Errors are met again, and reported, by the
                            // segment's own admission.
                            if let Ok(footer) = fetch.footer(segment.shard).await {
                                let _ = fetch.page_maps(segment, &footer, limits).await;
                            }
                        }
                    })
                    .await
            }
        };
        let main = async move {
            // Admission is sequential, in plan order: each segment takes
            // its share of the budget before any later one can, so the
            // segments a window waits for are never starved by later ones.
            let admitted = futures::stream::iter(segments.into_iter().zip(shares)).then(
                |((seq, segment), share)| {
                    let fetch = fetch.clone();
                    let semaphore = semaphore.clone();
                    let counters = counters.clone();
                    let config = config.clone();
                    let cancel = cancel.clone();
                    async move {
                        match config.failpoints.hit("fetch", seq) {
                            None => {}
                            Some(Action::Block) => std::future::pending::<()>().await,
                            Some(Action::Panic) => {
                                panic!("injected panic in the fetch stage (failpoint)")
                            }
                            Some(Action::Stop) => return Err(LoaderError::Closed),
                            Some(action) => {
                                return Err(injected(Stage::Fetch, action, &cancel));
                            }
                        }
                        // Under `on_error="skip"`, an index's file that
                        // changed or went away is handed on as lost, to be
                        // skipped in plan order.
                        let skip = config.on_error == crate::OnError::Skip;
                        let footer = match fetch.footer(segment.shard).await {
                            Ok(footer) => Ok(footer),
                            Err(e) if skip => Err(fetch.lost(segment, e)?),
                            Err(e) => return Err(e),
                        };
                        // A part of a large row group: its pages' maps (made
                        // at the row group's first part) say what it reads.
                        let limits = crate::parquet::Limits::of_budget(config.byte_budget);
                        let (footer, maps) = match footer {
                            Ok(footer) if fetch.is_part(segment, config.part_rows) => {
                                match fetch.page_maps(segment, &footer, limits).await {
                                    Ok(maps) => (Ok(footer), Some(maps)),
                                    Err(e) if skip => (Err(fetch.lost(segment, e)?), None),
                                    Err(e) => return Err(e),
                                }
                            }
                            other => (other, None),
                        };
                        let cost = match (&footer, &maps) {
                            (Ok(footer), Some(maps)) => {
                                fetch.part_cost(footer, segment, maps, max_unit)
                            }
                            (Ok(footer), None) => fetch.segment_cost(footer, segment, max_unit),
                            (Err(_), _) => 1,
                        };
                        let permit = semaphore
                            .clone()
                            .acquire_many_owned(cost)
                            .await
                            .map_err(|_| LoaderError::Closed)?;
                        if let Some(t) = &counters.trace {
                            let held =
                                (total as u64).saturating_sub(semaphore.available_permits() as u64);
                            t.counter("bytes_in_flight", held << 10);
                        }
                        Ok((seq, segment, footer, permit, share, maps))
                    }
                },
            );
            let mut results = std::pin::pin!(
                admitted
                    .map(|admitted| {
                        let fetch = fetch.clone();
                        let config = config.clone();
                        let cancel = cancel.clone();
                        async move {
                            let (seq, segment, footer, permit, share, maps) = admitted?;
                            let read = |footer| {
                                let fetch = fetch.clone();
                                let maps = maps.clone();
                                async move {
                                    match &maps {
                                        Some(maps) => {
                                            fetch.fetch_part(seq, segment, footer, maps).await
                                        }
                                        None => fetch.fetch(seq, segment, footer).await,
                                    }
                                }
                            };
                            let footer = match footer {
                                Ok(footer) => footer,
                                Err(lost) => {
                                    let chunks = Vec::new();
                                    let footer = Err(lost);
                                    return Ok((
                                        Fetched {
                                            seq,
                                            segment,
                                            footer,
                                            chunks,
                                            parts: Vec::new(),
                                        },
                                        permit,
                                    ));
                                }
                            };
                            let skip = config.on_error == crate::OnError::Skip;
                            let shared = match share.from {
                                Some(from) => from.await.ok(),
                                None => None,
                            };
                            let fetched = match shared {
                                Some(chunks) => Ok(Fetched {
                                    seq,
                                    segment,
                                    footer: Ok(footer),
                                    chunks,
                                    parts: Vec::new(),
                                }),
                                None => match config.failpoints.hit("read", seq) {
                                    // The segment's own read (not one it
                                    // was handed): `error`, or `slow`
                                    // (finishing after later reads).
                                    Some(Action::Error) => {
                                        Err(injected(Stage::Read, Action::Error, &cancel))
                                    }
                                    Some(Action::Slow(ms)) => {
                                        tokio::time::sleep(Duration::from_millis(ms)).await;
                                        read(footer).await
                                    }
                                    _ => read(footer).await,
                                },
                            };
                            let fetched = match fetched {
                                Err(e) if skip => fetch.lost(segment, e).map(|lost| Fetched {
                                    seq,
                                    segment,
                                    footer: Err(lost),
                                    chunks: Vec::new(),
                                    parts: Vec::new(),
                                }),
                                other => other,
                            };
                            if let (Ok(f), Some(to)) = (&fetched, share.to)
                                && f.footer.is_ok()
                            {
                                let _ = to.send(f.chunks.clone());
                            }
                            fetched.map(|f| (f, permit))
                        }
                    })
                    // Reads finish in any order (a read that finished
                    // behind a slower one does not hold its slot: on
                    // images both of 2 slots were busy 88% of the time,
                    // not 80%), but are handed on in plan order below.
                    .buffer_unordered(config.io_concurrency)
            );
            // Finished reads wait here for the earlier ones: the decode
            // threads take a window's segments before the next one's
            // (handed on as they finished, later windows' segments went
            // first and a fresh process's first token batch came after
            // 70-130 ms, not 40-55). Their permits bound what waits.
            let mut next = first_seq;
            let mut finished: BTreeMap<u64, (Fetched, OwnedSemaphorePermit)> = BTreeMap::new();
            while let Some(result) = results.next().await {
                let ready = match result {
                    // Cancelled, or a silent stop injected by a failpoint.
                    Err(LoaderError::Closed) => return,
                    // The error itself tells the rest of the pipeline, at once.
                    Err(e) => vec![Err(e)],
                    Ok((fetched, permit)) => {
                        finished.insert(fetched.seq, (fetched, permit));
                        let mut ready = Vec::new();
                        while let Some(item) = finished.remove(&next) {
                            ready.push(Ok(item));
                            next += 1;
                        }
                        ready
                    }
                };
                for result in ready {
                    let failed = result.is_err();
                    Counters::add(&counters.decode_queue, 1);
                    if failed {
                        fetched_all_by_work.store(true, Ordering::SeqCst);
                    }
                    let sending = Instant::now();
                    let sent = fetched_tx.send(result).await;
                    Counters::add_time(&counters.fetch_blocked_out_ns, sending.elapsed());
                    if sent.is_err() || failed {
                        return;
                    }
                }
            }
            fetched_all_by_work.store(true, Ordering::SeqCst);
        };
        let work = async move {
            futures::future::join(warm, main).await;
        };
        let panicked = fetched_all.clone();
        runtime.spawn(async move {
            if let Err(payload) = Quiet(AssertUnwindSafe(Box::pin(work)).catch_unwind()).await {
                panicked.store(true, Ordering::SeqCst);
                let _ = decoded_tx.send((
                    u64::MAX,
                    Err(LoaderError::stage(
                        Stage::Fetch,
                        None,
                        None,
                        format!("panic: {}", panic_message(payload.as_ref())),
                    )),
                    None,
                ));
            }
        })
    }
}

/// A fetched row group's column chunks, handed from one segment to a later
/// one of the same row group.
type SharedChunks = Vec<crate::stage::FetchedChunk>;

/// How one segment's fetch is shared: `to` hands its chunks on to a later
/// segment of the same row group, `from` receives them from an earlier one.
#[derive(Default)]
pub(crate) struct Share {
    to: Option<tokio::sync::oneshot::Sender<SharedChunks>>,
    from: Option<tokio::sync::oneshot::Receiver<SharedChunks>>,
}

/// The shares of a pass's segments, one each: a segment that starts where
/// an earlier segment of the same row group ends (the rest of a row group
/// whose first slice opened the epoch's first window, in the window right
/// after it) reuses that segment's fetched chunks instead of reading the
/// whole row group again. The chunks are passed as the earlier fetch
/// completes; admission is in plan order and the later segment is admitted
/// next to the earlier one's window, so the kept bytes are within the two
/// windows of read-ahead; segments more than `reach` apart are not paired.
/// Should the earlier fetch fail, the later segment reads its row group
/// itself.
pub(crate) fn shared_fetches(segments: &[(u64, Segment)], reach: usize) -> Vec<Share> {
    let mut shares: Vec<Share> = segments.iter().map(|_| Share::default()).collect();
    for (head, tail) in continuations(segments) {
        if tail - head <= reach {
            let (tx, rx) = tokio::sync::oneshot::channel();
            shares[head].to = Some(tx);
            shares[tail].from = Some(rx);
        }
    }
    shares
}

/// The segments that continue an earlier segment of their row group
/// (start where it ends), as `(earlier, later)` indices into `segments`:
/// each earlier segment continued once, by the first later one.
pub(crate) fn continuations(segments: &[(u64, Segment)]) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    let mut open: HashMap<(u32, u32, u32), usize> = HashMap::new();
    for (i, (_, s)) in segments.iter().enumerate() {
        if s.start > 0
            && let Some(head) = open.remove(&(s.shard, s.row_group, s.start))
        {
            pairs.push((head, i));
        }
        open.insert((s.shard, s.row_group, s.end), i);
    }
    pairs
}

#[cfg(test)]
mod tests {
    use crate::plan::Segment;
    use crate::plan::test_segment as seg;

    #[test]
    fn the_rest_of_a_row_group_reuses_its_slices_fetch_within_reach() {
        let segments: Vec<(u64, Segment)> = [
            seg(0, 1, 0, 4),
            seg(0, 2, 0, 3),
            seg(0, 1, 4, 30),
            seg(1, 0, 0, 30),
            seg(0, 2, 3, 30),
            seg(0, 3, 5, 30),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, s)| (i as u64, s))
        .collect();
        let pairs = |reach| {
            let shares = super::shared_fetches(&segments, reach);
            shares
                .iter()
                .map(|s| (s.to.is_some(), s.from.is_some()))
                .collect::<Vec<_>>()
        };
        // 0 hands on to 2 and 1 to 4; a segment starting mid-group with no
        // earlier part (5) reads itself.
        let (no, to, from) = ((false, false), (true, false), (false, true));
        assert_eq!(pairs(3), [to, to, from, no, from, no]);
        // 1 and 4 are 3 apart: out of reach 2.
        assert_eq!(pairs(2), [to, no, from, no, no, no]);
    }
}
