//! `shardfeed bench`: stream a dataset through the loader and report throughput.

use std::time::{Duration, Instant};

use crate::report::Timeline;
use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use shardfeed_format::size::parse_size;
use shardfeed_loader::{
    Batch, DecodePaths, Feed, FeedBuilder, FeedStats, LoaderOptions, Mixing, MixtureStats,
    SkippedRowGroup, StageStats, Stats,
};

/// Arguments of `bench`.
#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Dataset URL or path (optional with --mix).
    #[arg(required_unless_present = "mix")]
    pub dataset: Option<String>,
    /// Rows per batch.
    #[arg(long, default_value_t = 256)]
    pub batch_size: usize,
    /// Columns to read, comma separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub columns: Option<Vec<String>>,
    /// Decode threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Epochs to stream.
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Simulated training step: sleep this many milliseconds after each batch,
    /// and report the fraction of wall time spent waiting for data.
    #[arg(long)]
    pub step_ms: Option<f64>,
    /// Pad list columns to this length (default: ragged values + offsets).
    #[arg(long)]
    pub pad_to: Option<usize>,
    /// Read in order instead of shuffling.
    #[arg(long)]
    pub no_shuffle: bool,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Row groups per shuffle window (default: 8 for a dataset shuffled at
    /// shard time, which `--mix` sources share by weight, at least 2 each,
    /// and a source of one list column two thirds of it (`--pack-to`: 5);
    /// else as many as a quarter of the byte budget holds). Given, every
    /// `--mix` source's.
    #[arg(long)]
    pub window: Option<usize>,
    /// Batches collated ahead (default: as many as 128 MiB hold, 2 to 16, fewer where 4x the byte budget holds fewer slabs).
    #[arg(long)]
    pub prefetch: Option<usize>,
    /// Bytes of row groups in flight, e.g. 256MiB.
    #[arg(long, default_value = "1GiB")]
    pub byte_budget: String,
    /// Slab allocation: auto, cuda or off.
    #[arg(long, default_value = "auto")]
    pub pinning: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Add this much latency (milliseconds) to every storage read, through
    /// the object store path (local shards are then not memory-mapped).
    #[arg(long)]
    pub inject_latency_ms: Option<f64>,
    /// Fail this fraction of storage reads with a transient error.
    #[arg(long)]
    pub inject_failure_rate: Option<f64>,
    /// An object store option (repeatable).
    #[arg(long = "storage-option", value_name = "KEY=VALUE", value_parser = crate::storage_option)]
    pub storage_options: Vec<(String, String)>,
    /// Cache remote shards in this folder.
    #[arg(long)]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Size limit of the cache, e.g. 100GB.
    #[arg(long)]
    pub cache_limit: Option<String>,
    /// Copy local column chunks out with `pread` instead of reading them
    /// through a mapping of each shard.
    #[arg(long)]
    pub pread: bool,
    /// What to do with a damaged row group: `fail` (default) or `skip` (left
    /// out, named in the report and a warning; see --max-skipped).
    #[arg(long, default_value = "fail")]
    pub on_error: String,
    /// With `--on-error skip`: row groups that may be skipped before the run fails.
    #[arg(long, default_value_t = shardfeed_loader::DEFAULT_MAX_SKIPPED)]
    pub max_skipped: u64,
    /// Write a trace of the pipeline to this file (Chrome trace-event JSON:
    /// open it in ui.perfetto.dev or chrome://tracing).
    #[arg(long)]
    pub trace: Option<std::path::PathBuf>,
    /// Write one self-contained HTML page to this file: rows/s over time,
    /// the wait of each batch, each stage's busy and blocked time, queue
    /// depths, and the run's settings.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
    /// Blend datasets by weight (shares of rows), URL=WEIGHT; repeatable.
    /// With the positional dataset too, it is the first source (weight 1).
    #[arg(long = "mix", value_name = "URL=WEIGHT", value_parser = mix_source)]
    pub mix: Vec<(String, f64)>,
    /// When a mixture's epoch ends: first_exhausted, all_exhausted or never
    /// (then stop after --max-batches).
    #[arg(long, default_value = "first_exhausted")]
    pub mix_stop: String,
    /// Pack the token-list column into rows of this many tokens.
    #[arg(long)]
    pub pack_to: Option<usize>,
    /// split (documents cut at row ends) or fit (whole documents best-fit, padded).
    #[arg(long, default_value = "split")]
    pub pack_mode: String,
    /// Token appended after every packed document.
    #[arg(long)]
    pub eos_id: Option<i32>,
    /// Documents per best-fit window (--pack-mode fit).
    #[arg(long)]
    pub pack_window: Option<usize>,
    /// Stop after this many batches (in all).
    #[arg(long)]
    pub max_batches: Option<u64>,
    /// Decode the images of these binary columns (comma separated) into
    /// uint8 [B, H, W, 3] pixels.
    #[arg(long, value_delimiter = ',')]
    pub decode_images: Option<Vec<String>>,
    /// Decoded image size: N (square) or HxW.
    #[arg(long, default_value = "224")]
    pub image_size: String,
    /// random_resized, center or resize.
    #[arg(long, default_value = "random_resized")]
    pub crop: String,
    /// Flip half the decoded images horizontally.
    #[arg(long)]
    pub flip: bool,
    /// With --decode-images: measure the image decoder alone (the ceiling):
    /// read the column's bytes into memory first, then decode them to RGB on
    /// --threads threads, without cropping, resizing or collating.
    #[arg(long, requires = "decode_images")]
    pub decode_only: bool,
    /// Build a new loader for every epoch after the first, resumed from the
    /// last one's state, as a trainer that rebuilds its loader in the same
    /// process does (an elastic restart, an evaluation loader in between):
    /// each epoch is then a first pass of a loader, its build included in
    /// its time, in a process whose memory is no longer fresh. The report's
    /// rows, bytes, batches and wait fractions count every loader; its
    /// stats, stages and wait percentiles are the last loader's (no
    /// --trace: each loader would write its own).
    #[arg(long, conflicts_with_all = ["mix", "pack_to", "decode_only", "trace"])]
    pub rebuild_each_epoch: bool,
}

/// What `bench --decode-only` measured.
#[derive(Serialize)]
pub struct DecodeOnlyReport {
    /// Images decoded.
    pub images: u64,
    /// Threads decoding.
    pub threads: usize,
    /// Seconds spent decoding (reading excluded).
    pub seconds: f64,
    /// Images per second.
    pub images_per_s: f64,
    /// Encoded megabytes per second.
    pub mb_per_s: f64,
}

/// Decode every image of the `--decode-images` columns on `--threads`
/// threads, after reading them into memory.
pub fn decode_only(args: &BenchArgs) -> Result<DecodeOnlyReport> {
    let url = args.dataset.as_deref().context("name a dataset")?;
    let columns = args.decode_images.clone().unwrap_or_default();
    let mut plain = args.clone();
    plain.decode_images = None;
    plain.flip = false;
    plain.crop = LoaderOptions::default().crop;
    plain.columns = Some(columns.clone());
    let options = LoaderOptions {
        drop_last: false,
        shuffle: false,
        ..loader_options(&plain, vec![(url.to_string(), 1.0)])?
    };
    let FeedBuilder::Loader(builder) = options.feed_builder()? else {
        bail!("one dataset makes a plain loader");
    };
    let mut loader = builder.build()?;
    let mut values: Vec<Vec<u8>> = Vec::new();
    for batch in &mut loader {
        let batch = batch?;
        for c in &columns {
            values.extend(batch.binary(c).into_iter().flatten().map(<[u8]>::to_vec));
        }
    }
    drop(loader);
    let threads = if args.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        args.threads
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    let failures: usize = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut decoder = shardfeed_loader::ImageDecoder::new(
                        shardfeed_loader::DEFAULT_MAX_IMAGE_PIXELS,
                    );
                    let mut failed = 0;
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(v) = values.get(i) else {
                            return failed;
                        };
                        failed += decoder.decode(v).is_err() as usize;
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("decode thread"))
            .sum()
    });
    let seconds = started.elapsed().as_secs_f64();
    if failures > 0 {
        anyhow::bail!("{failures} of {} images did not decode", values.len());
    }
    let bytes: usize = values.iter().map(Vec::len).sum();
    Ok(DecodeOnlyReport {
        images: values.len() as u64,
        threads,
        seconds,
        images_per_s: values.len() as f64 / seconds,
        mb_per_s: bytes as f64 / 1e6 / seconds,
    })
}

/// `224` or `160x224`: (height, width).
fn image_size(text: &str) -> Result<(u32, u32)> {
    let parse = |s: &str| {
        s.trim()
            .parse::<u32>()
            .with_context(|| format!("invalid --image-size {text:?}: expected N or HxW"))
    };
    match text.split_once(['x', 'X']) {
        Some((h, w)) => Ok((parse(h)?, parse(w)?)),
        None => {
            let n = parse(text)?;
            Ok((n, n))
        }
    }
}

fn mix_source(text: &str) -> Result<(String, f64), String> {
    let (url, weight) = text
        .rsplit_once('=')
        .ok_or_else(|| "expected URL=WEIGHT".to_string())?;
    let weight: f64 = weight
        .trim()
        .parse()
        .map_err(|_| format!("{weight:?} is not a number"))?;
    Ok((url.to_string(), weight))
}

/// What `bench` measured.
#[derive(Serialize)]
pub struct BenchReport {
    /// Dataset streamed.
    pub dataset: String,
    /// Rows yielded.
    pub rows: u64,
    /// Bytes of collated batches yielded.
    pub bytes: u64,
    /// Batches yielded.
    pub batches: u64,
    /// Epochs streamed.
    pub epochs: u64,
    /// Wall time.
    pub seconds: f64,
    /// Rows per second.
    pub rows_per_s: f64,
    /// Collated MB (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// From the first `next()` to the first batch.
    pub time_to_first_batch_ms: f64,
    /// Fraction of wall time spent waiting in `next()`.
    pub wait_fraction: f64,
    /// The same, after the first epoch (start-up and the first shuffle
    /// windows excluded); with `--epochs 1`, equal to `wait_fraction`.
    pub steady_wait_fraction: f64,
    /// Rows per second after the first epoch: the rate a long training run
    /// sees once buffers and the allocator are warm; with `--epochs 1`, equal
    /// to `rows_per_s`.
    pub steady_rows_per_s: f64,
    /// Rows per second of each epoch, in order (`steady_rows_per_s` is
    /// their mean after the first; peers' "best later pass" is their max).
    pub epoch_rows_per_s: Vec<f64>,
    /// Minor page faults of the process during each epoch, the first with
    /// the loader's building (part of what a fresh process pays): the fresh
    /// memory the first epoch touches, which later epochs reuse. Empty where
    /// `getrusage` is not available.
    pub epoch_minor_faults: Vec<u64>,
    /// CPU seconds the kernel spent for the process during each epoch
    /// (page faults, reads from the page cache, thread wake-ups).
    pub epoch_system_s: Vec<f64>,
    /// CPU seconds in user mode during each epoch (all threads).
    pub epoch_user_s: Vec<f64>,
    /// Simulated step, if any.
    pub step_ms: Option<f64>,
    /// Peak resident memory of the process.
    pub peak_rss_bytes: Option<u64>,
    /// Anonymous memory of the process in transparent huge pages at the end
    /// (Linux): 0 unless the system's policy is `always` or
    /// `MIMALLOC_ALLOW_THP=1` is set (the loader advises none).
    pub huge_page_bytes: Option<u64>,
    /// Column chunks decoded by each path (the own decoders, or parquet's reader).
    pub decode_paths: DecodePaths,
    /// Row groups skipped as damaged (`--on-error skip`).
    pub skipped: Vec<SkippedRowGroup>,
    /// How well batches mixed the dataset's row groups.
    pub mixing: Mixing,
    /// Median wait in `next()`, in milliseconds (all epochs).
    pub wait_p50_ms: f64,
    /// 95th percentile wait in `next()`, in milliseconds.
    pub wait_p95_ms: f64,
    /// 99th percentile wait in `next()`, in milliseconds.
    pub wait_p99_ms: f64,
    /// Longest wait in `next()`, in milliseconds.
    pub wait_max_ms: f64,
    /// Each stage's busy fraction.
    pub stages: std::collections::BTreeMap<String, StageStats>,
    /// The stage the trainer waited on, or `trainer` when the loader kept ahead.
    pub bottleneck: String,
    /// The loader's counters.
    pub stats: Stats,
}

/// The loader options of `args` over `sources` (one: a plain loader).
fn loader_options(args: &BenchArgs, sources: Vec<(String, f64)>) -> Result<LoaderOptions> {
    let images = args.decode_images.is_some();
    Ok(LoaderOptions {
        sources,
        storage_options: args.storage_options.clone(),
        inject_latency_ms: args.inject_latency_ms,
        inject_failure_rate: args.inject_failure_rate,
        batch_size: args.batch_size,
        shuffle: !args.no_shuffle,
        seed: args.seed,
        threads: args.threads,
        byte_budget: parse_size(&args.byte_budget).context("invalid --byte-budget")?,
        pinning: args.pinning.clone(),
        on_error: args.on_error.clone(),
        max_skipped: args.max_skipped,
        // The bench's consumer does no work: it always waits (the report
        // names the bottleneck instead).
        slow_warning: None,
        rank: Some(0),
        world_size: Some(1),
        columns: args.columns.clone(),
        window: args.window,
        prefetch: args.prefetch,
        cache_dir: args.cache_dir.clone(),
        cache_limit: args
            .cache_limit
            .as_deref()
            .map(|l| parse_size(l).context("invalid --cache-limit"))
            .transpose()?,
        mapped_reads: !args.pread,
        pad_to: args.pad_to,
        decode_images: args.decode_images.clone(),
        image_size: images.then(|| image_size(&args.image_size)).transpose()?,
        crop: args.crop.clone(),
        flip: args.flip,
        trace: args.trace.clone(),
        mix_stop: args.mix_stop.clone(),
        pack_to: args.pack_to,
        pack_mode: args.pack_mode.clone(),
        eos_id: args.eos_id,
        pack_window: args.pack_window,
        ..LoaderOptions::default()
    })
}

/// What streaming a feed measured, before a report is made of it.
struct Run {
    /// The feed, after its last batch.
    feed: Box<dyn Feed>,
    /// Wall time.
    seconds: f64,
    /// Epochs begun.
    epochs: u64,
    /// When the second epoch began, the wait and rows before it.
    first_epoch: Option<(f64, f64, u64)>,
    epoch_rows_per_s: Vec<f64>,
    epoch_usage: Vec<Usage>,
    /// What the feeds dropped by --rebuild-each-epoch counted.
    dropped: Totals,
}

impl Run {
    /// Counts over the run, every feed together.
    fn totals(&self) -> Totals {
        self.dropped.plus(&self.feed.feed_stats())
    }
}

/// Stream `args.epochs` epochs of the feed `builder` makes (the whole run at
/// most `--max-batches` batches), handing each batch to `on_batch` with the
/// seconds since the start, the milliseconds `next()` took, and the feed.
/// The one loop of `bench`, for plain loaders and mixtures alike.
fn run(
    builder: &FeedBuilder,
    args: &BenchArgs,
    mut on_batch: impl FnMut(&Batch, f64, f64, &dyn Feed),
) -> Result<Run> {
    // The first epoch's faults and CPU time count from here: building the
    // loader (the manifest, a footer) is part of what a fresh process pays,
    // and what ran before in the same process (`demo`'s shard) is not.
    let usage_at_start = Usage::now();
    let mut feed = builder.build()?;
    let step = args.step_ms.map(|ms| millis("--step-ms", ms)).transpose()?;
    let started = Instant::now();
    let mut first_epoch = None;
    let mut epoch_rows_per_s = Vec::new();
    let mut epoch_usage: Vec<Usage> = Vec::new();
    let mut dropped = Totals::default();
    let mut streamed = 0u64;
    let limit_reached = |streamed: u64| args.max_batches.is_some_and(|n| streamed >= n);
    let mut epochs = 0;
    for epoch in 0..args.epochs {
        if limit_reached(streamed) {
            break;
        }
        epochs += 1;
        let epoch_started = started.elapsed().as_secs_f64();
        let usage_before = if epoch == 0 {
            usage_at_start
        } else {
            Usage::now()
        };
        if epoch > 0 && args.rebuild_each_epoch {
            let state = feed.save();
            dropped = dropped.plus(&feed.feed_stats());
            drop(feed);
            feed = builder.build()?;
            feed.restore(&[state], false)?;
        }
        let before = dropped.plus(&feed.feed_stats());
        if epoch == 1 {
            first_epoch = Some((epoch_started, before.wait_ms, before.rows));
        }
        feed.go_to_epoch(epoch)?;
        while !limit_reached(streamed) {
            let asked = Instant::now();
            let Some(batch) = feed.next_batch(&mut || false) else {
                break;
            };
            let batch = batch?;
            let t = started.elapsed().as_secs_f64();
            on_batch(
                &batch,
                t,
                asked.elapsed().as_secs_f64() * 1e3,
                feed.as_ref(),
            );
            if let Some(step) = step {
                // The GPU works on this batch; the loader keeps prefetching.
                std::thread::sleep(step);
            }
            drop(batch);
            streamed += 1;
        }
        let elapsed = started.elapsed().as_secs_f64() - epoch_started;
        if elapsed > 0.0 {
            let rows = dropped.plus(&feed.feed_stats()).rows - before.rows;
            epoch_rows_per_s.push(rows as f64 / elapsed);
        }
        if let (Some(before), Some(after)) = (usage_before, Usage::now()) {
            epoch_usage.push(after.since(&before));
        }
    }
    Ok(Run {
        feed,
        seconds: started.elapsed().as_secs_f64(),
        epochs,
        first_epoch,
        epoch_rows_per_s,
        epoch_usage,
        dropped,
    })
}

/// What `bench` measured: a plain loader's report, or a mixture's.
pub enum Report {
    /// One dataset.
    Loader(Box<BenchReport>),
    /// `--mix` or `--pack-to`.
    Mixture(Box<MixReport>),
}

/// Stream the dataset (or the mixture `--mix` / `--pack-to` make) and
/// measure: one loop ([`run`]) for both, each with its report.
pub fn measure(args: &BenchArgs) -> Result<Report> {
    if args.mix.is_empty() && args.pack_to.is_none() {
        measure_loader(args).map(|r| Report::Loader(Box::new(r)))
    } else {
        mixture_report(args).map(|r| Report::Mixture(Box::new(r)))
    }
}

/// Print `report` (as JSON with `json`).
pub fn print(report: &Report, json: bool) -> Result<()> {
    match report {
        Report::Loader(r) => print_loader(r, json),
        Report::Mixture(r) => print_mix(r, json),
    }
}

/// Stream one dataset and measure.
fn measure_loader(args: &BenchArgs) -> Result<BenchReport> {
    let url = args
        .dataset
        .as_deref()
        .context("name a dataset, or sources with --mix")?;
    let builder = loader_options(args, vec![(url.to_string(), 1.0)])?.feed_builder()?;
    let mut timeline = args.report.as_ref().map(|_| Timeline::default());
    let run = run(&builder, args, |batch, t, asked_ms, feed| {
        if let Some(timeline) = timeline.as_mut() {
            timeline.batch(t, asked_ms, batch.rows() as u64);
            if timeline.batches.len() % 10 == 1
                && let FeedStats::Loader(s) = feed.feed_stats()
            {
                timeline.queues(t, s.decode_queue, s.output_queue);
            }
        }
    })?;
    let FeedStats::Loader(stats) = run.feed.feed_stats() else {
        bail!("a plain loader was built");
    };
    let stats = *stats;
    let all = run.totals();
    let (seconds, first_epoch) = (run.seconds, run.first_epoch);
    let (epoch_rows_per_s, epoch_usage) = (run.epoch_rows_per_s, run.epoch_usage);
    let loader = run.feed;
    let report = BenchReport {
        dataset: shardfeed_format::redact::url(url),
        rows: all.rows,
        bytes: all.bytes,
        batches: all.batches,
        epochs: args.epochs,
        seconds,
        rows_per_s: all.rows as f64 / seconds,
        mb_per_s: all.bytes as f64 / 1e6 / seconds,
        time_to_first_batch_ms: stats.time_to_first_batch_ms,
        wait_fraction: all.wait_ms / 1000.0 / seconds,
        steady_wait_fraction: match first_epoch {
            Some((t, wait_ms, _)) if seconds > t => {
                (all.wait_ms - wait_ms) / 1000.0 / (seconds - t)
            }
            _ => all.wait_ms / 1000.0 / seconds,
        },
        steady_rows_per_s: match first_epoch {
            Some((t, _, rows)) if seconds > t => (all.rows - rows) as f64 / (seconds - t),
            _ => all.rows as f64 / seconds,
        },
        epoch_rows_per_s,
        epoch_minor_faults: epoch_usage.iter().map(|u| u.minor_faults).collect(),
        epoch_system_s: epoch_usage.iter().map(|u| u.system_s).collect(),
        epoch_user_s: epoch_usage.iter().map(|u| u.user_s).collect(),
        step_ms: args.step_ms,
        peak_rss_bytes: shardfeed_preprocess::peak_rss_bytes(),
        huge_page_bytes: shardfeed_preprocess::huge_page_bytes(),
        decode_paths: stats.decode_paths,
        skipped: stats.skipped.clone(),
        mixing: stats.mixing.clone(),
        wait_p50_ms: stats.wait.p50_ms,
        wait_p95_ms: stats.wait.p95_ms,
        wait_p99_ms: stats.wait.p99_ms,
        wait_max_ms: stats.wait.max_ms,
        stages: stats.stages.clone(),
        bottleneck: stats.bottleneck.clone(),
        stats,
    };
    // The trace file is finished when its loader is dropped: a write error
    // (a full disk) fails the run.
    let trace = loader.trace_outcome();
    drop(loader);
    if let Some(error) = trace.as_ref().and_then(|t| t.error()) {
        bail!("--trace: {error}");
    }
    if let (Some(path), Some(timeline)) = (&args.report, &timeline) {
        let settings = [
            ("dataset", report.dataset.clone()),
            ("batch size", args.batch_size.to_string()),
            ("decode threads", args.threads.to_string()),
            ("epochs", args.epochs.to_string()),
            ("shuffle", (!args.no_shuffle).to_string()),
            ("seed", args.seed.to_string()),
            (
                "window",
                args.window.map_or("auto".into(), |w| w.to_string()),
            ),
            (
                "prefetch",
                args.prefetch.map_or("auto".into(), |p| p.to_string()),
            ),
            ("byte budget", args.byte_budget.clone()),
            (
                "pinning",
                format!("{} ({})", args.pinning, report.stats.pinning),
            ),
            (
                "slabs",
                format!(
                    "{} of up to {} x {} bytes",
                    report.stats.slabs_made, report.stats.slabs, report.stats.slab_bytes
                ),
            ),
            (
                "step",
                args.step_ms.map_or("none".into(), |s| format!("{s} ms")),
            ),
            ("shardfeed", env!("CARGO_PKG_VERSION").to_string()),
        ]
        .map(|(k, v)| (k.to_string(), v));
        std::fs::write(path, crate::report::html(&report, timeline, &settings))
            .with_context(|| format!("cannot write --report {}", path.display()))?;
    }
    Ok(report)
}

/// Counts summed over the loaders of a run (`--rebuild-each-epoch`).
#[derive(Clone, Copy, Default)]
struct Totals {
    rows: u64,
    bytes: u64,
    batches: u64,
    wait_ms: f64,
}

impl Totals {
    /// These counts and a feed's.
    fn plus(self, stats: &FeedStats) -> Totals {
        Totals {
            rows: self.rows + stats.rows(),
            bytes: self.bytes + stats.bytes(),
            batches: self.batches + stats.batches(),
            wait_ms: self.wait_ms + stats.wait_ms(),
        }
    }
}

/// The process's CPU time and minor page faults (`getrusage`), all threads.
#[derive(Clone, Copy)]
struct Usage {
    user_s: f64,
    system_s: f64,
    minor_faults: u64,
}

impl Usage {
    /// So far in this process; `None` where `getrusage` fails.
    fn now() -> Option<Usage> {
        let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage writes a `rusage` into the pointer it is given,
        // which points at one; the result is read only when it succeeded.
        let u = unsafe {
            if libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) != 0 {
                return None;
            }
            u.assume_init()
        };
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Some(Usage {
            user_s: secs(u.ru_utime),
            system_s: secs(u.ru_stime),
            minor_faults: u64::try_from(u.ru_minflt).unwrap_or(0),
        })
    }

    /// What was spent between `before` and `self`.
    fn since(&self, before: &Usage) -> Usage {
        Usage {
            user_s: self.user_s - before.user_s,
            system_s: self.system_s - before.system_s,
            minor_faults: self.minor_faults.saturating_sub(before.minor_faults),
        }
    }
}

/// `ms` milliseconds, the value of `option`: finite and not negative.
fn millis(option: &str, ms: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| {
        anyhow::anyhow!("{option} {ms}: must be a finite number of milliseconds, not negative")
    })
}

/// `writeln!` into a `String` (formatting into a `String` cannot fail).
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

/// Write `text` to standard output; an error (a closed pipe, a full disk
/// behind a redirect) is returned, not a panic and not lost.
pub fn emit(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("cannot write the report to standard output")
}

/// Print a report.
fn print_loader(report: &BenchReport, json: bool) -> Result<()> {
    if json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(report)?));
    }
    // Lines go to `out`, written at the end (a write error is the run's).
    let mut out = String::new();
    say!(
        out,
        "{} rows, {} batches in {:.2} s: {:.0} rows/s, {:.1} MB/s; first batch after {:.1} ms",
        report.rows,
        report.batches,
        report.seconds,
        report.rows_per_s,
        report.mb_per_s,
        report.time_to_first_batch_ms
    );
    for skip in &report.skipped {
        say!(
            out,
            "skipped shard {} row group {}: {}",
            skip.shard,
            skip.row_group,
            skip.error
        );
    }
    if report.epochs > 1 {
        say!(
            out,
            "after the first epoch: {:.0} rows/s",
            report.steady_rows_per_s
        );
    }
    if let (Some(first), Some(faults)) = (
        report.epoch_system_s.first(),
        report.epoch_minor_faults.first(),
    ) {
        let later = report.epoch_minor_faults.len().saturating_sub(1);
        let after = if later == 0 {
            String::new()
        } else {
            format!(
                "; later epochs: {:.0} faults, {:.2} s each",
                report.epoch_minor_faults.iter().skip(1).sum::<u64>() as f64 / later as f64,
                report.epoch_system_s.iter().skip(1).sum::<f64>() / later as f64,
            )
        };
        say!(
            out,
            "first epoch: {faults} page faults (fresh memory), {first:.2} s in the kernel{after}"
        );
    }
    if let Some(step) = report.step_ms {
        say!(
            out,
            "with a {step} ms step the trainer waited {:.2}% of wall time ({:.2}% after the first epoch)",
            100.0 * report.wait_fraction,
            100.0 * report.steady_wait_fraction
        );
    }
    say!(
        out,
        "waits in next(): p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({:.1}% of the time)",
        report.wait_p50_ms,
        report.wait_p95_ms,
        report.wait_p99_ms,
        report.wait_max_ms,
        100.0 * report.stats.wait_fraction
    );
    let busy = |name: &str| report.stages.get(name).map_or(0.0, |s| s.busy_fraction);
    say!(
        out,
        "bottleneck: {} (busy: fetch {:.0}%, decode {:.0}% per thread, shuffle {:.0}%, collate {:.0}%)",
        match report.bottleneck.as_str() {
            "trainer" => "none, the loader keeps ahead of the consumer".to_string(),
            stage => format!("the {stage} stage"),
        },
        100.0 * busy("fetch"),
        100.0 * busy("decode"),
        100.0 * busy("shuffle"),
        100.0 * busy("collate"),
    );
    say!(
        out,
        "mixing: {:.1} row groups per batch, windows of {} row groups (~{:.0} rows){}",
        report.mixing.row_groups_per_batch,
        report.mixing.window_row_groups,
        report.mixing.window_rows,
        if report.mixing.shuffled_at_shard_time {
            ""
        } else {
            "; the dataset is in input order"
        }
    );
    say!(
        out,
        "read buffers: {} made, {} held; {} read through mappings",
        report.stats.read_buffers_made,
        shardfeed_format::size::format_size(report.stats.read_buffer_bytes),
        shardfeed_format::size::format_size(report.stats.mapped_bytes)
    );
    say!(
        out,
        "slabs: {} made of up to {} x {} ({}), peak RSS {}",
        report.stats.slabs_made,
        report.stats.slabs,
        shardfeed_format::size::format_size(report.stats.slab_bytes as u64),
        report.stats.pinning,
        report
            .peak_rss_bytes
            .map(shardfeed_format::size::format_size)
            .unwrap_or_else(|| "unknown".into())
    );
    emit(&out)
}

/// What `bench --mix` / `--pack-to` measured.
#[derive(Serialize)]
pub struct MixReport {
    /// The sources and their weights.
    pub sources: Vec<(String, f64)>,
    /// Rows yielded (packed rows when packing, else documents).
    pub rows: u64,
    /// Batches yielded.
    pub batches: u64,
    /// Mixture epochs streamed.
    pub epochs: u64,
    /// Wall time.
    pub seconds: f64,
    /// Rows per second.
    pub rows_per_s: f64,
    /// Tokens per second (packed tokens, padding excluded; unpacked: the
    /// tokens of the list column read).
    pub tokens_per_s: f64,
    /// Share of the packed tokens that are padding.
    pub padding_fraction: f64,
    /// Documents drawn from each source, as shares of all.
    pub shares: Vec<f64>,
    /// From the first `next()` to the first batch.
    pub time_to_first_batch_ms: f64,
    /// Peak resident memory of the process.
    pub peak_rss_bytes: Option<u64>,
    /// The mixture's counters (each source's loader's among them).
    pub stats: MixtureStats,
}

/// Stream a mixture (or one packed dataset) and measure.
fn mixture_report(args: &BenchArgs) -> Result<MixReport> {
    let mut sources = args.mix.clone();
    if let Some(url) = &args.dataset {
        sources.insert(0, (url.clone(), 1.0));
    }
    let builder = LoaderOptions {
        mixture: true,
        ..loader_options(args, sources.clone())?
    }
    .feed_builder()?;
    if args.mix_stop == "never" && args.max_batches.is_none() {
        anyhow::bail!("--mix-stop never needs --max-batches");
    }
    let packing = args.pack_to.is_some();
    let mut tokens = 0u64;
    let run = run(&builder, args, |batch, _, _, _| {
        if !packing {
            // Unpacked: count the tokens of the list columns read.
            for column in batch.columns() {
                if let shardfeed_loader::ColumnLayout::Ragged { values, .. } = &column.layout {
                    tokens += values.len() as u64;
                }
            }
        }
    })?;
    let (seconds, epochs) = (run.seconds, run.epochs);
    let FeedStats::Mixture(stats) = run.feed.feed_stats() else {
        bail!("a mixture was built");
    };
    let stats = *stats;
    if packing {
        tokens = stats.tokens - stats.padding_tokens;
    }
    let documents: u64 = stats.documents.iter().sum();
    Ok(MixReport {
        sources: sources
            .iter()
            .map(|(u, w)| (shardfeed_format::redact::url(u), *w))
            .collect(),
        rows: stats.rows,
        batches: stats.batches,
        epochs,
        seconds,
        rows_per_s: stats.rows as f64 / seconds,
        tokens_per_s: tokens as f64 / seconds,
        padding_fraction: stats.padding_tokens as f64 / stats.tokens.max(1) as f64,
        shares: stats
            .documents
            .iter()
            .map(|&d| d as f64 / documents.max(1) as f64)
            .collect(),
        time_to_first_batch_ms: stats.first_batch_s * 1e3,
        peak_rss_bytes: shardfeed_preprocess::peak_rss_bytes(),
        stats,
    })
}

/// Print a mixture report.
fn print_mix(report: &MixReport, json: bool) -> Result<()> {
    if json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(report)?));
    }
    // Lines go to `out`, written at the end (a write error is the run's).
    let mut out = String::new();
    say!(
        out,
        "{} rows, {} batches in {:.2} s: {:.0} rows/s, {:.0} tokens/s; first batch after {:.1} ms",
        report.rows,
        report.batches,
        report.seconds,
        report.rows_per_s,
        report.tokens_per_s,
        report.time_to_first_batch_ms
    );
    for ((url, weight), share) in report.sources.iter().zip(&report.shares) {
        say!(
            out,
            "  {url}: weight {weight}, {:.2}% of documents",
            100.0 * share
        );
    }
    if report.stats.tokens > 0 {
        say!(
            out,
            "packed {} tokens, {:.2}% padding",
            report.stats.tokens,
            100.0 * report.padding_fraction
        );
    }
    say!(
        out,
        "consumer waited {:.2} s; peak RSS {}",
        report.stats.wait_s,
        report
            .peak_rss_bytes
            .map(shardfeed_format::size::format_size)
            .unwrap_or_else(|| "unknown".into())
    );
    emit(&out)
}
