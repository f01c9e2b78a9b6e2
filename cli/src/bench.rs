//! `shardfeed bench`: stream a dataset through the loader and report throughput.

use std::time::{Duration, Instant};

use crate::report::Timeline;
use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use shardfeed_format::fault::FaultConfig;
use shardfeed_format::size::parse_size;
use shardfeed_loader::{
    DecodePaths, Loader, Mixing, OnError, PinningMode, SkippedRowGroup, StageStats, Stats,
};

/// Arguments of `bench`.
#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Dataset URL or path.
    pub dataset: String,
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
    /// shard time, else as many as a quarter of the byte budget holds).
    #[arg(long)]
    pub window: Option<usize>,
    /// Batches collated ahead.
    #[arg(long, default_value_t = shardfeed_loader::DEFAULT_PREFETCH_BATCHES)]
    pub prefetch: usize,
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
    /// Simulated step, if any.
    pub step_ms: Option<f64>,
    /// Peak resident memory of the process.
    pub peak_rss_bytes: Option<u64>,
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

/// Stream the dataset and measure.
pub fn measure(args: &BenchArgs) -> Result<BenchReport> {
    let mut builder = Loader::builder(&args.dataset);
    for (key, value) in &args.storage_options {
        builder = builder.storage_option(key, value);
    }
    if args.inject_latency_ms.is_some() || args.inject_failure_rate.is_some() {
        builder = builder.inject_faults(FaultConfig {
            transient_rate: args.inject_failure_rate.unwrap_or(0.0),
            latency: Duration::from_secs_f64(args.inject_latency_ms.unwrap_or(0.0) / 1000.0),
            ..FaultConfig::default()
        });
    }
    let mut builder = builder
        .batch_size(args.batch_size)
        .shuffle(!args.no_shuffle)
        .seed(args.seed)
        .prefetch(args.prefetch)
        .decode_threads(args.threads)
        .byte_budget(parse_size(&args.byte_budget).context("invalid --byte-budget")?)
        .pinning(args.pinning.parse::<PinningMode>()?)
        .on_error(args.on_error.parse::<OnError>()?)
        .max_skipped(args.max_skipped)
        // The bench's consumer does no work: it always waits (the report
        // names the bottleneck instead).
        .slow_warning(None)
        .rank(0)
        .world_size(1);
    if let Some(columns) = &args.columns {
        builder = builder.columns(columns.clone());
    }
    if let Some(window) = args.window {
        builder = builder.window(window);
    }
    if let Some(dir) = &args.cache_dir {
        builder = builder.cache_dir(dir);
    }
    if let Some(limit) = &args.cache_limit {
        builder = builder.cache_limit(parse_size(limit).context("invalid --cache-limit")?);
    }
    if let Some(pad) = args.pad_to {
        builder = builder.pad_to(pad, 0.0);
    }
    if let Some(path) = &args.trace {
        builder = builder.trace(path);
    }
    let mut loader = builder.build()?;
    let step = args.step_ms.map(|ms| Duration::from_secs_f64(ms / 1000.0));
    let mut timeline = args.report.as_ref().map(|_| Timeline::default());
    let started = Instant::now();
    let mut first_epoch = None;
    for epoch in 0..args.epochs {
        if epoch == 1 {
            let stats = loader.stats();
            first_epoch = Some((started.elapsed().as_secs_f64(), stats.wait_ms, stats.rows));
        }
        loader.set_epoch(epoch);
        loop {
            let asked = Instant::now();
            let Some(batch) = loader.next() else {
                break;
            };
            let batch = batch?;
            if let Some(timeline) = timeline.as_mut() {
                let t = started.elapsed().as_secs_f64();
                timeline.batch(t, asked.elapsed().as_secs_f64() * 1e3, batch.rows() as u64);
                if timeline.batches.len() % 10 == 1 {
                    let s = loader.stats();
                    timeline.queues(t, s.decode_queue, s.output_queue);
                }
            }
            if let Some(step) = step {
                // The GPU works on this batch; the loader keeps prefetching.
                std::thread::sleep(step);
            }
            drop(batch);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let stats = loader.stats();
    let report = BenchReport {
        dataset: shardfeed_format::redact::url(&args.dataset),
        rows: stats.rows,
        bytes: stats.bytes,
        batches: stats.batches,
        epochs: args.epochs,
        seconds,
        rows_per_s: stats.rows as f64 / seconds,
        mb_per_s: stats.bytes as f64 / 1e6 / seconds,
        time_to_first_batch_ms: stats.time_to_first_batch_ms,
        wait_fraction: stats.wait_ms / 1000.0 / seconds,
        steady_wait_fraction: match first_epoch {
            Some((t, wait_ms, _)) if seconds > t => {
                (stats.wait_ms - wait_ms) / 1000.0 / (seconds - t)
            }
            _ => stats.wait_ms / 1000.0 / seconds,
        },
        steady_rows_per_s: match first_epoch {
            Some((t, _, rows)) if seconds > t => (stats.rows - rows) as f64 / (seconds - t),
            _ => stats.rows as f64 / seconds,
        },
        step_ms: args.step_ms,
        peak_rss_bytes: shardfeed_preprocess::peak_rss_bytes(),
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
            ("prefetch", args.prefetch.to_string()),
            ("byte budget", args.byte_budget.clone()),
            (
                "pinning",
                format!("{} ({})", args.pinning, report.stats.pinning),
            ),
            (
                "slabs",
                format!("{} x {} bytes", report.stats.slabs, report.stats.slab_bytes),
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

/// Print a report.
pub fn print(report: &BenchReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    println!(
        "{} rows, {} batches in {:.2} s: {:.0} rows/s, {:.1} MB/s; first batch after {:.1} ms",
        report.rows,
        report.batches,
        report.seconds,
        report.rows_per_s,
        report.mb_per_s,
        report.time_to_first_batch_ms
    );
    for skip in &report.skipped {
        println!(
            "skipped shard {} row group {}: {}",
            skip.shard, skip.row_group, skip.error
        );
    }
    if report.epochs > 1 {
        println!(
            "after the first epoch: {:.0} rows/s",
            report.steady_rows_per_s
        );
    }
    if let Some(step) = report.step_ms {
        println!(
            "with a {step} ms step the trainer waited {:.2}% of wall time ({:.2}% after the first epoch)",
            100.0 * report.wait_fraction,
            100.0 * report.steady_wait_fraction
        );
    }
    println!(
        "waits in next(): p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({:.1}% of the time)",
        report.wait_p50_ms,
        report.wait_p95_ms,
        report.wait_p99_ms,
        report.wait_max_ms,
        100.0 * report.stats.wait_fraction
    );
    let busy = |name: &str| report.stages.get(name).map_or(0.0, |s| s.busy_fraction);
    println!(
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
    println!(
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
    println!(
        "slabs: {} x {} ({}), peak RSS {}",
        report.stats.slabs,
        shardfeed_format::size::format_size(report.stats.slab_bytes as u64),
        report.stats.pinning,
        report
            .peak_rss_bytes
            .map(shardfeed_format::size::format_size)
            .unwrap_or_else(|| "unknown".into())
    );
    Ok(())
}
