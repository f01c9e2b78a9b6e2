//! Where the time goes: wait percentiles, stage fractions and the bottleneck
//! `bench` names, on a slow store (injected latency) and a slow decode (a
//! failpoint that makes each row group's decode take longer).

use shardfeed_fixtures::Kind;

use crate::support::*;

/// `bench --json` of the dataset at `url` on 2 decode threads with `extra`
/// options and failpoints.
fn bench(url: &str, extra: &[&str], failpoints: &str) -> serde_json::Value {
    bench_on(url, "2", extra, failpoints)
}

/// [`bench`] on `threads` decode threads.
fn bench_on(url: &str, threads: &str, extra: &[&str], failpoints: &str) -> serde_json::Value {
    let mut args = vec![
        "bench",
        url,
        "--batch-size",
        "50",
        "--threads",
        threads,
        "--json",
    ];
    args.extend(extra);
    Run::from_command(bin().args(&args).env("SHARDFEED_FAILPOINTS", failpoints))
        .success()
        .json()
}

/// The events of the trace file at `path`.
fn trace_events(path: &std::path::Path) -> Vec<serde_json::Value> {
    let bytes = std::fs::read(path).unwrap();
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "not a JSON array ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    })
}

/// The spans named `name` among a trace's `events`.
fn spans<'a>(events: &'a [serde_json::Value], name: &str) -> Vec<&'a serde_json::Value> {
    events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == name)
        .collect()
}

/// A token dataset of 12 row groups in one shard (in a new folder), and
/// where a trace of it goes.
fn traced_tokens() -> (tempfile::TempDir, String, std::path::PathBuf) {
    let tmp = tempdir();
    let url = sharded(tmp.path(), Kind::Tokens, 600, 50, 1 << 30);
    let trace = tmp.path().join("trace.json");
    (tmp, url, trace)
}

/// The report's waits and stages hold together.
fn check_consistent(report: &serde_json::Value) {
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    let (p50, p95, p99, max) = (
        f(&report["wait_p50_ms"]),
        f(&report["wait_p95_ms"]),
        f(&report["wait_p99_ms"]),
        f(&report["wait_max_ms"]),
    );
    assert!(p50 <= p95 && p95 <= p99 && p99 <= max, "{report}");
    // One rate per epoch, each of rows actually streamed.
    let epochs = report["epoch_rows_per_s"].as_array().unwrap();
    assert_eq!(
        epochs.len() as u64,
        report["epochs"].as_u64().unwrap(),
        "{report}"
    );
    assert!(epochs.iter().all(|r| f(r) > 0.0), "{report}");
    // Each epoch's faults and CPU time, the first with the loader's
    // building: it at least paid for the loader's first buffers.
    for key in ["epoch_minor_faults", "epoch_system_s", "epoch_user_s"] {
        let values = report[key].as_array().unwrap();
        assert_eq!(values.len(), epochs.len(), "{key}: {report}");
        assert!(values.iter().all(|v| f(v) >= 0.0), "{key}: {report}");
    }
    assert!(f(&report["epoch_minor_faults"][0]) > 0.0, "{report}");
    assert!(f(&report["epoch_user_s"][0]) > 0.0, "{report}");
    let stats = &report["stats"];
    // The histogram's sum is the loader's total wait, every call counted.
    assert!(
        (f(&stats["wait"]["total_ms"]) - f(&stats["wait_ms"])).abs() < 1.0,
        "{stats}"
    );
    assert!(
        f(&stats["wait"]["count"]) >= f(&report["batches"]),
        "{stats}"
    );
    for stage in ["fetch", "decode", "shuffle", "collate"] {
        let s = &report["stages"][stage];
        for key in [
            "busy_fraction",
            "blocked_input_fraction",
            "blocked_output_fraction",
        ] {
            let v = f(&s[key]);
            // Up to 1 per worker, and up to 2 where the next epoch's pass (its
            // own workers) overlaps the end of this one.
            assert!((0.0..=2.05).contains(&v), "{stage} {key} = {v}: {report}");
        }
    }
}

#[test]
fn the_bottleneck_is_the_slow_store_or_the_slow_decode() {
    let tmp = tempdir();
    // 12 row groups of tokens.
    let url = sharded(tmp.path(), Kind::Tokens, 600, 50, 1 << 30);

    // Every read waits 1 s: decoding waits on fetching (its busy time is
    // wall time, which a loaded machine stretches: a CI run with other
    // builds beside it decoded these row groups in 55 ms each, against
    // reads of 400 ms when this test waited that long).
    let slow_store = bench(&url, &["--inject-latency-ms", "1000"], "");
    check_consistent(&slow_store);
    assert_eq!(slow_store["bottleneck"], "fetch", "{slow_store}");
    assert!(
        slow_store["stages"]["decode"]["blocked_input_fraction"]
            .as_f64()
            .unwrap()
            > slow_store["stages"]["decode"]["busy_fraction"]
                .as_f64()
                .unwrap(),
        "{slow_store}"
    );

    // Every row group's decode takes 400 ms longer: the decode threads are
    // busy, the stages after them wait for their input.
    let slow_decode = bench(&url, &[], "decode=slow:400");
    check_consistent(&slow_decode);
    assert_eq!(slow_decode["bottleneck"], "decode", "{slow_decode}");
    assert!(
        slow_decode["stages"]["decode"]["busy_fraction"]
            .as_f64()
            .unwrap()
            > 0.5,
        "{slow_decode}"
    );
    // The human report names it in one line.
    let text = Run::from_command(
        bin()
            .args(["bench", &url, "--batch-size", "50", "--threads", "2"])
            .env("SHARDFEED_FAILPOINTS", "decode=slow:400"),
    )
    .success();
    assert!(
        text.stdout.contains("bottleneck: the decode stage"),
        "{}",
        text.stdout
    );
}

/// Read buffers are reused from epoch to epoch, not made afresh for each
/// read, even at a byte budget that holds only part of the dataset: the pool
/// keeps a returned buffer while its buffers hold no more than the budget
/// together. (The pool that kept idle buffers up to a quarter of the budget,
/// counted by capacity, unmapped this dataset's 4 MiB mappings and mapped
/// them again every window: with the pool's limit set back to that quarter,
/// counted by capacity, 64 buffers were made over these three epochs.)
#[test]
fn read_buffers_are_reused_across_epochs_at_a_small_budget() {
    let tmp = tempdir();
    // 20 row groups of 24 images of ~100 KB: chunks of ~2.4 MB, each read
    // into a mapping of its own.
    let url = sharded(tmp.path(), Kind::Images, 480, 24, 1 << 30);
    let report = bench_on(
        &url,
        "2",
        &[
            "--epochs",
            "3",
            "--byte-budget",
            "24MiB",
            "--prefetch",
            "2",
            "--pread",
        ],
        "",
    );
    check_consistent(&report);
    let stats = &report["stats"];
    assert_eq!(stats["mapped_bytes"].as_u64(), Some(0), "{stats}");
    let made = stats["read_buffers_made"].as_u64().unwrap();
    // 60 reads of image chunks: about as many buffers are made as the
    // pipeline holds at once (12-15 in runs here; 64 with the old limit).
    assert!((1..30).contains(&made), "{made} made: {stats}");
    assert!(stats["read_buffer_bytes"].as_u64().unwrap() > 0, "{stats}");
}

/// Reads finish in any order but reach the decode threads in plan order:
/// with one decode thread and the first read the slowest (the reads after it
/// finish first), the trace's decode spans follow the row groups in order.
#[test]
fn reads_reach_the_decoders_in_plan_order_whatever_order_they_finish_in() {
    // Read in order (no shuffle).
    let (_tmp, url, trace) = traced_tokens();
    let report = bench_on(
        &url,
        "1",
        &["--no-shuffle", "--trace", &s(&trace)],
        "read=slow:300@0",
    );
    assert_eq!(report["rows"], 600, "{report}");
    let events = trace_events(&trace);
    let mut decodes = spans(&events, "decode");
    decodes.sort_by(|a, b| {
        a["ts"]
            .as_f64()
            .unwrap()
            .total_cmp(&b["ts"].as_f64().unwrap())
    });
    let order: Vec<u64> = decodes
        .iter()
        .take(12)
        .map(|e| e["args"]["row_group"].as_u64().unwrap())
        .collect();
    assert_eq!(order, (0..12).collect::<Vec<u64>>());
}

#[test]
fn the_trace_has_every_stage_and_its_waits_sum_to_the_loaders() {
    let (_tmp, url, trace) = traced_tokens();
    // Decodes take long enough that both decode threads get row groups.
    let report = bench(
        &url,
        &["--trace", &s(&trace), "--epochs", "2"],
        "decode=slow:30",
    );
    let events = trace_events(&trace);
    let spans = |name: &str| spans(&events, name);
    for name in ["fetch", "decode", "collate batch", "wait"] {
        assert!(!spans(name).is_empty(), "no {name} span");
    }
    // Every decode span names its shard and row group.
    let decodes = spans("decode");
    // 12 row groups in each of 2 epochs (and some of the third, begun ahead).
    assert!(decodes.len() >= 2 * 12, "{}", decodes.len());
    assert!(decodes.iter().all(|e| e["args"]["row_group"].is_u64()));
    let threads: std::collections::HashSet<u64> =
        decodes.iter().map(|e| e["tid"].as_u64().unwrap()).collect();
    // Two decode threads per pass (each epoch's pass starts its own).
    assert!(threads.len() >= 2, "{threads:?}");
    // Threads are named, and the decode queue is a counter track.
    assert!(events.iter().any(|e| {
        e["ph"] == "M"
            && e["args"]["name"]
                .as_str()
                .unwrap()
                .starts_with("shardfeed-decode")
    }));
    for counter in ["decode_queue", "bytes_in_flight"] {
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "C" && e["name"] == counter),
            "no {counter} counter"
        );
    }
    // The consumer's waits add up to the loader's wait time, within 1%.
    let waited_ms: f64 = spans("wait")
        .iter()
        .map(|e| e["dur"].as_f64().unwrap() / 1e3)
        .sum();
    let wait_ms = report["stats"]["wait_ms"].as_f64().unwrap();
    assert!(
        (waited_ms - wait_ms).abs() <= 0.01 * wait_ms + 0.01,
        "spans {waited_ms} ms, stats {wait_ms} ms"
    );
    let dropped = events.last().unwrap();
    assert_eq!(dropped["args"]["dropped"], 0, "{dropped}");
}

/// Run `command`, killing it after `limit`.
fn run_with_limit(command: &mut std::process::Command, limit: std::time::Duration) -> Run {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the browser (apt-get install chromium, or set SHARDFEED_CHROMIUM)");
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("the browser did not finish within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Run::from_output(child.wait_with_output().unwrap())
}

#[test]
fn the_html_report_is_self_contained_and_renders_in_a_headless_browser() {
    let tmp = tempdir();
    let url = sharded(tmp.path(), Kind::Tokens, 600, 50, 1 << 30);
    let html = tmp.path().join("report.html");
    let report = bench(&url, &["--report", &s(&html), "--epochs", "2"], "");
    check_consistent(&report);
    let page = std::fs::read_to_string(&html).unwrap();
    // One file: no scripts, no references to anything outside it.
    for outside in ["<script", "src=", "href=", "url(", "@import"] {
        assert!(!page.contains(outside), "{outside} in the report");
    }
    assert!(
        page.contains(&format!("{} rows", report["rows"])),
        "the summary"
    );
    // A real browser parses it into the four plots and draws them.
    let browser = std::env::var("SHARDFEED_CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
    ];
    let file_url = format!("file://{}", html.display());
    let limit = std::time::Duration::from_secs(90);
    let dom = run_with_limit(
        std::process::Command::new(&browser)
            .args(flags)
            .args(["--dump-dom", &file_url]),
        limit,
    );
    assert!(dom.ok, "{}", dom.stderr);
    assert_eq!(
        dom.stdout.matches("<svg class=\"plot\"").count(),
        4,
        "{}",
        dom.stdout
    );
    assert!(dom.stdout.matches("<polyline class=\"series\"").count() >= 4);
    assert!(dom.stdout.contains("<rect class=\"bar\""));
    let shot = tmp.path().join("report.png");
    let screenshot = run_with_limit(
        std::process::Command::new(&browser).args(flags).args([
            "--window-size=1000,1500",
            &format!("--screenshot={}", shot.display()),
            &file_url,
        ]),
        limit,
    );
    assert!(screenshot.ok, "{}", screenshot.stderr);
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // A blank page of that size compresses to a few KB; plots and text do not.
    assert!(png.len() > 40_000, "{} bytes", png.len());
}

/// `bench --max-batches N` limits the whole run (every epoch together; 0
/// streams nothing), and the files `bench` writes (the trace, the JSON
/// report on stdout) fail the run when they cannot be written (a full
/// disk: `/dev/full`), rather than exit 0 with the output lost.
#[test]
fn bench_limits_the_whole_run_and_fails_when_its_outputs_cannot_be_written() {
    let tmp = tempdir();
    let url = sharded(tmp.path(), Kind::Text, 1000, 50, 8 << 10);
    for (limit, epochs, want) in [("5", "20", 5u64), ("0", "3", 0), ("7", "1", 7)] {
        let report = bench(&url, &["--epochs", epochs, "--max-batches", limit], "");
        assert_eq!(
            report["batches"], want,
            "--epochs {epochs} --max-batches {limit}"
        );
    }
    let full = std::path::Path::new("/dev/full");
    assert!(full.exists(), "the test needs /dev/full");
    let run = shardfeed(&["bench", &url, "--batch-size", "50", "--trace", "/dev/full"]).failure();
    assert!(
        run.stderr.contains("--trace") && run.stderr.contains("/dev/full"),
        "{}",
        run.stderr
    );
    let out = std::fs::OpenOptions::new().write(true).open(full).unwrap();
    let run = Run::from_command(
        bin()
            .args(["bench", &url, "--batch-size", "50", "--json"])
            .stdout(out),
    )
    .failure();
    assert!(run.stderr.contains("standard output"), "{}", run.stderr);
}
