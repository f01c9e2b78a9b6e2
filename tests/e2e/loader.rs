//! The loader end to end: exactly once, determinism, resume, values, faults.

use std::collections::HashMap;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int32Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use shardfeed_fixtures::Kind;
use shardfeed_loader::{Batch, Loader, LoaderError, LoaderState, PinningMode};

use crate::support::*;

/// Shard `rows` rows of `kind` into `dir/ds` with several shards of uneven row groups.
fn dataset(dir: &Path, kind: Kind, rows: u64, row_group_rows: u64, shard_size: u64) -> String {
    sharded(dir, kind, rows, row_group_rows, shard_size)
}

fn id_batches(loader: &mut Loader) -> Vec<Vec<i64>> {
    loader
        .map(|b| b.unwrap().values::<i64>("id").unwrap().to_vec())
        .collect()
}

#[test]
fn every_row_exactly_once_per_epoch_across_ranks() {
    let tmp = tempdir();
    // 1003 rows: a prime-ish count so that most world and batch sizes leave remainders.
    let url = dataset(tmp.path(), Kind::Text, 1003, 37, 8 << 10);
    let total = 1003u64;
    for world in [1u64, 2, 3, 8] {
        // 300 rows span ~9 row groups: more than two windows of 2.
        for batch_size in [1usize, 7, 17, 300] {
            for shuffle in [false, true] {
                for drop_last in [true, false] {
                    let mut seen: HashMap<i64, u32> = HashMap::new();
                    let mut counts = Vec::new();
                    let builder = |rank| {
                        Loader::builder(&url)
                            .columns(["id"])
                            .batch_size(batch_size)
                            .shuffle(shuffle)
                            .seed(3)
                            .epoch(2)
                            .rank(rank)
                            .world_size(world)
                            .drop_last(drop_last)
                            .window(2)
                            .decode_threads(2)
                    };
                    if drop_last && batch_size as u64 > total / world {
                        // Every batch would be dropped: refused, not an empty epoch.
                        let err = builder(0).build().unwrap_err();
                        assert!(
                            matches!(
                                err,
                                LoaderError::BadOption {
                                    option: "batch_size",
                                    ..
                                }
                            ),
                            "{err}"
                        );
                        continue;
                    }
                    for rank in 0..world {
                        let mut loader = builder(rank).build().unwrap();
                        let batches = id_batches(&mut loader);
                        assert_eq!(
                            batches.len() as u64,
                            loader.len(),
                            "world {world} rank {rank} batch {batch_size} shuffle {shuffle} drop_last {drop_last}"
                        );
                        counts.push(batches.len());
                        for id in batches.into_iter().flatten() {
                            *seen.entry(id).or_default() += 1;
                        }
                    }
                    let case = format!(
                        "world {world} batch {batch_size} shuffle {shuffle} drop_last {drop_last}"
                    );
                    assert!(
                        counts.windows(2).all(|w| w[0] == w[1]),
                        "{case}: batches per rank {counts:?}"
                    );
                    if drop_last {
                        // Documented remainder: N mod W rows across ranks, then each rank's partial batch.
                        let per_rank = total / world;
                        let kept = per_rank / batch_size as u64 * batch_size as u64 * world;
                        assert!(seen.values().all(|&c| c == 1), "{case}: a row twice");
                        assert_eq!(seen.len() as u64, kept, "{case}");
                    } else {
                        assert_eq!(seen.len() as u64, total, "{case}: rows missing");
                        let extra: u64 = seen.values().map(|&c| c as u64 - 1).sum();
                        assert_eq!(
                            extra,
                            total.div_ceil(world) * world - total,
                            "{case}: padding"
                        );
                    }
                }
            }
        }
    }
}

fn collect(url: &str, threads: usize, prefetch: usize, epoch: u64) -> Vec<Vec<i64>> {
    collect_with(url, threads, prefetch, epoch, "")
}

fn collect_with(
    url: &str,
    threads: usize,
    prefetch: usize,
    epoch: u64,
    failpoints: &str,
) -> Vec<Vec<i64>> {
    let mut loader = Loader::builder(url)
        .batch_size(64)
        .seed(11)
        .epoch(epoch)
        .decode_threads(threads)
        .prefetch(prefetch)
        .io_concurrency(threads * 2)
        .failpoints(failpoints)
        .build()
        .unwrap();
    id_batches(&mut loader)
}

/// Windows of 2 row groups over 50: the epoch's first window is sliced (the
/// rest of each of its row groups decoded once and kept for its later
/// segment, or decoded again by whichever thread gets there first): the same
/// batches whatever the threads, every row once; the rest of a sliced row
/// group reuses the bytes its slice fetched (a read of its own would fail).
#[test]
fn sliced_first_window_gives_the_same_rows_whatever_the_threads() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Text, 5000, 100, 16 << 10);
    let run = |threads: usize, failpoints: &str| {
        let mut loader = Loader::builder(&url)
            .batch_size(50)
            .seed(4)
            .window(2)
            .decode_threads(threads)
            .io_concurrency(threads)
            .failpoints(failpoints)
            .build()
            .unwrap();
        id_batches(&mut loader)
    };
    let one = run(1, "");
    assert_eq!(run(3, ""), one);
    // Segments 0 and 1 are the slices of the first window's two row groups,
    // 2 and 3 the rest of each: a read of its own by either fails.
    assert_eq!(run(1, "read=error@2;read=error@3"), one);
    assert_eq!(run(3, "read=error@2;read=error@3"), one);
    let mut all: Vec<i64> = one.into_iter().flatten().collect();
    all.sort();
    assert_eq!(all, (0..5000).collect::<Vec<_>>());
}

/// Slabs of a dataset of fixed-width columns (nullable, bool, fixed-size
/// lists among them) are sized to the batch exactly, not twice it: every
/// batch still fits one (no oversize batch), every row once.
#[test]
fn fixed_width_batches_fit_slabs_of_their_exact_size() {
    use arrow_array::builder::{FixedSizeListBuilder, Float32Builder};
    use arrow_array::{ArrayRef, BooleanArray, Float32Array, Int64Array};
    let tmp = tempdir();
    let rows = 30_000i64;
    let mut list = FixedSizeListBuilder::new(Float32Builder::new(), 3);
    for i in 0..rows {
        list.values().append_slice(&[i as f32, 1.0, -1.0]);
        list.append(true);
    }
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            std::sync::Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef,
        ),
        (
            "x",
            std::sync::Arc::new(Float32Array::from_iter(
                (0..rows).map(|i| (i % 7 != 0).then_some(i as f32)),
            )) as ArrayRef,
        ),
        (
            "flag",
            std::sync::Arc::new(BooleanArray::from_iter((0..rows).map(|i| Some(i % 3 == 0))))
                as ArrayRef,
        ),
        ("v", std::sync::Arc::new(list.finish()) as ArrayRef),
    ])
    .unwrap();
    let input = tmp.path().join("fixed.parquet");
    write_parquet(&input, &batch);
    let url = s(&tmp.path().join("ds"));
    let options = shardfeed_preprocess::ShardOptions::default().with_row_group_rows(4000);
    shardfeed_preprocess::shard(&[s(&input)], &url, &options).unwrap();
    let batch_size = 10_000usize;
    let mut loader = Loader::builder(&url)
        .batch_size(batch_size)
        .seed(5)
        .build()
        .unwrap();
    let mut ids: Vec<i64> = id_batches(&mut loader).into_iter().flatten().collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..rows).collect::<Vec<_>>());
    let stats = loader.stats();
    assert_eq!(stats.oversize_batches, 0);
    // Values: 8 + 4 + 1 + 12 bytes a row; a validity byte for `x`; a few
    // alignment pads.
    let need = batch_size * (8 + 4 + 1 + 12 + 1);
    assert!(
        (need..need + 4096).contains(&stats.slab_bytes),
        "slabs of {} bytes for {need} bytes of values",
        stats.slab_bytes
    );
}

/// A dataset of fixed-width columns only: each pass's first window reaches
/// the collator before it is permuted (the first batches gather from it)
/// and its permuted version replaces it between batches, whenever that is
/// ready: the batches are the same whatever the threads and read-ahead, over
/// epochs, every row once with its own values. Twice: with small row groups,
/// and with row groups whose `y` dictionaries (5,000 distinct floats each)
/// make a window's pass the bound above which the shuffle stage looks values
/// up (`x`'s stay keys; `id` is written as deltas, plain values).
#[test]
fn a_first_window_gathered_before_it_is_permuted_gives_the_same_batches() {
    use arrow_array::{ArrayRef, Float32Array, Float64Array, Int64Array};
    for (rows, group_rows, batch_size) in [(6000i64, 250u64, 64usize), (48_000, 5000, 500)] {
        let tmp = tempdir();
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                std::sync::Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef,
            ),
            (
                "x",
                std::sync::Arc::new(Float32Array::from_iter_values(
                    (0..rows).map(|i| (i % 4096) as f32 * 0.5),
                )) as ArrayRef,
            ),
            (
                "y",
                std::sync::Arc::new(Float64Array::from_iter_values(
                    (0..rows).map(|i| i as f64 * 1.5),
                )) as ArrayRef,
            ),
        ])
        .unwrap();
        let input = tmp.path().join("fixed.parquet");
        write_parquet(&input, &batch);
        let url = s(&tmp.path().join("ds"));
        let options = shardfeed_preprocess::ShardOptions::default()
            .with_row_group_rows(group_rows)
            .with_shard_size(group_rows * 128);
        shardfeed_preprocess::shard(&[s(&input)], &url, &options).unwrap();
        let run = |threads: usize, prefetch: usize| {
            let mut loader = Loader::builder(&url)
                .batch_size(batch_size)
                .seed(3)
                .decode_threads(threads)
                .prefetch(prefetch)
                .build()
                .unwrap();
            let epochs: Vec<Vec<Vec<i64>>> = (0..3)
                .map(|_| {
                    (&mut loader)
                        .map(|b| {
                            let b = b.unwrap();
                            let (ids, xs) = (b.values::<i64>("id").unwrap(), b.values::<f32>("x"));
                            let ys = b.values::<f64>("y").unwrap();
                            for ((id, x), y) in ids.iter().zip(xs.unwrap()).zip(ys) {
                                assert_eq!(*x, (id % 4096) as f32 * 0.5, "row {id}");
                                assert_eq!(*y, *id as f64 * 1.5, "row {id}");
                            }
                            ids.to_vec()
                        })
                        .collect()
                })
                .collect();
            epochs
        };
        let reference = run(1, 2);
        assert_eq!(run(3, 16), reference);
        assert_eq!(run(2, 4), reference);
        // 8 decode threads: the shuffle and collate stages get helper threads.
        assert_eq!(run(8, 4), reference);
        let kept = rows / batch_size as i64 * batch_size as i64;
        for epoch in &reference {
            let mut ids: Vec<i64> = epoch.iter().flatten().copied().collect();
            ids.sort_unstable();
            assert_eq!(ids.len() as i64, kept);
            ids.dedup();
            assert_eq!(ids.len() as i64, kept, "no row twice");
        }
    }
}

/// The nice value of each of this process's threads whose name starts with
/// `prefix` (Linux's `/proc`), and of the calling thread.
#[cfg(target_os = "linux")]
fn thread_nice(prefix: &str) -> (Vec<i32>, i32) {
    let nice_of = |stat: &str| -> i32 {
        // Field 19; the name (field 2, in parentheses) may hold spaces.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split(' ').nth(16).unwrap().parse().unwrap()
    };
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.starts_with(prefix)
            && let Ok(stat) = std::fs::read_to_string(dir.join("stat"))
        {
            found.push(nice_of(&stat));
        }
    }
    let own = nice_of(&std::fs::read_to_string("/proc/thread-self/stat").unwrap());
    (found, own)
}

/// Decode threads run `decode_niceness` below the thread that started the
/// pass (default 6), the other stages at its priority; 0 leaves them all alike.
#[cfg(target_os = "linux")]
#[test]
fn decode_threads_run_at_the_niceness_asked_for() {
    // The decode threads of other tests running in this process would be
    // counted too: the test runs again alone, in a process of its own.
    const ALONE: &str = "SHARDFEED_TEST_ALONE";
    if std::env::var_os(ALONE).is_none() {
        let name = "loader::decode_threads_run_at_the_niceness_asked_for";
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads", "1"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        return;
    }
    let tmp = tempdir();
    // 60 row groups: the read-ahead holds the decode threads in the pass
    // while the first batch is read.
    let url = dataset(tmp.path(), Kind::Text, 6000, 100, 16 << 10);
    for (niceness, expected) in [(None, 6), (Some(0), 0), (Some(2), 2)] {
        let mut builder = Loader::builder(&url)
            .batch_size(10)
            .decode_threads(2)
            .prefetch(2);
        if let Some(n) = niceness {
            builder = builder.decode_niceness(n);
        }
        let mut loader = builder.build().unwrap();
        loader.next().unwrap().unwrap();
        let (decode, own) = thread_nice("shardfeed-decod");
        assert_eq!(decode.len(), 2, "two decode threads alive");
        for n in decode {
            assert_eq!(n, (own + expected).min(19), "niceness {niceness:?}");
        }
        let (collate, _) = thread_nice("shardfeed-colla");
        assert!(!collate.is_empty() && collate.iter().all(|&n| n == own));
    }
    let err = Loader::builder(&url)
        .decode_niceness(20)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("decode_niceness"), "{err}");
}

#[test]
fn order_depends_only_on_seed_epoch_and_rank() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Text, 5000, 100, 16 << 10);
    let a = collect(&url, 1, 1, 0);
    let b = collect(&url, 4, 8, 0);
    assert_eq!(a, b, "thread count or prefetch changed the order");
    // Nor does a first read that takes longer than the seven behind it
    // (8 in flight): the order is the plan's, not the reads'.
    let late = collect_with(&url, 4, 8, 0, "read=slow:200@0");
    assert_eq!(
        a, late,
        "the order in which reads finished changed the order"
    );
    let c = collect(&url, 2, 2, 1);
    assert_ne!(a, c, "epochs must differ");
    let mut sorted: Vec<i64> = c.into_iter().flatten().collect();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 5000 / 64 * 64);
}

#[test]
fn resume_continues_exactly_where_the_state_was_taken() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Text, 3000, 90, 16 << 10);
    let build = || {
        Loader::builder(&url)
            .batch_size(50)
            .seed(9)
            .window(3)
            .decode_threads(2)
            .build()
            .unwrap()
    };
    let mut full = build();
    let epoch0 = id_batches(&mut full);
    let epoch1 = id_batches(&mut full);
    let all: Vec<Vec<i64>> = epoch0.iter().chain(&epoch1).cloned().collect();
    let mut g = shardfeed_format::permute::SplitMix64::new(1);
    for _ in 0..5 {
        let stop = g.below(all.len() as u64) as usize;
        let mut first = build();
        let mut got = Vec::new();
        while got.len() < stop {
            match first.next() {
                Some(b) => got.push(b.unwrap().values::<i64>("id").unwrap().to_vec()),
                None => continue, // epoch boundary
            }
        }
        let state = first.state().to_json();
        assert!(state.len() < 1024, "state is {} bytes", state.len());
        drop(first);
        let mut second = build();
        second
            .resume(&LoaderState::from_json(&state).unwrap())
            .unwrap();
        while got.len() < all.len() {
            match second.next() {
                Some(b) => got.push(b.unwrap().values::<i64>("id").unwrap().to_vec()),
                None => continue,
            }
        }
        assert_eq!(got, all, "resumed after {stop} batches");
    }
    // A state from another configuration is refused, naming what differs.
    let mut other = Loader::builder(&url)
        .batch_size(50)
        .seed(10)
        .window(3)
        .build()
        .unwrap();
    let err = other.resume(&build().state()).unwrap_err();
    assert!(err.to_string().contains("seed"), "{err}");
}

/// A job of `old` ranks stops mid-epoch; one of `new` ranks resumes from
/// all their states: across both, no row twice, and only the documented
/// remainders missing; states saved after it resume exactly too.
#[test]
fn elastic_resume_of_a_plain_loader_reads_each_row_once() {
    let tmp = tempdir();
    let total = 3000u64;
    let url = dataset(tmp.path(), Kind::Text, total, 40, 16 << 10);
    let batch = 20u64;
    let build = |rank, world| {
        Loader::builder(&url)
            .batch_size(batch as usize)
            .seed(4)
            .window(2)
            .rank(rank)
            .world_size(world)
            .decode_threads(2)
            .build()
            .unwrap()
    };
    for (old, new, steps) in [(4u64, 3u64, 13usize), (3, 5, 20), (2, 1, 30)] {
        let mut seen: Vec<i64> = Vec::new();
        let mut states = Vec::new();
        for rank in 0..old {
            let mut l = build(rank, old);
            for _ in 0..steps {
                seen.extend(l.next().unwrap().unwrap().values::<i64>("id").unwrap());
            }
            states.push(LoaderState::from_json(&l.state().to_json()).unwrap());
        }
        let mut lengths = Vec::new();
        for rank in 0..new {
            let mut l = build(rank, new);
            l.resume_elastic(&states).unwrap();
            lengths.push(l.len());
            let rest = id_batches(&mut l);
            assert_eq!(
                rest.len() as u64,
                lengths[0],
                "every new rank yields as many batches"
            );
            if rank == 0 && rest.len() > 2 {
                let mut again = build(rank, new);
                again.resume_elastic(&states).unwrap();
                let head: Vec<Vec<i64>> = (0..2)
                    .map(|_| {
                        again
                            .next()
                            .unwrap()
                            .unwrap()
                            .values::<i64>("id")
                            .unwrap()
                            .to_vec()
                    })
                    .collect();
                let state = LoaderState::from_json(&again.state().to_json()).unwrap();
                let mut resumed = build(rank, new);
                resumed.resume(&state).unwrap();
                let tail = id_batches(&mut resumed);
                assert_eq!(
                    [head, tail].concat(),
                    rest,
                    "{old} -> {new}: a resume after it"
                );
            }
            seen.extend(rest.into_iter().flatten());
        }
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            seen.len(),
            "{old} -> {new}: a row was read twice"
        );
        // Missing: what the old job dropped (total mod old, and each old
        // rank's partial batch), then fewer than `new` rows that do not divide
        // and each new rank's partial batch.
        let missing = total - seen.len() as u64;
        let allowed = total % old + old * (batch - 1) + new + new * (batch - 1);
        assert!(missing <= allowed, "{old} -> {new}: {missing} rows missing");
    }
    // A state file is untrusted: pieces that are not ranges of an old
    // rank's sequence, or too many of them, are refused.
    let mut state = build(0, 1).state();
    let piece = |start, end| shardfeed_loader::Piece {
        rank: 0,
        world: 2,
        start,
        end,
    };
    for pending in [
        vec![(0, vec![piece(10, 5)])],
        vec![(0, vec![piece(0, u64::MAX)])],
        vec![(
            0,
            vec![shardfeed_loader::Piece {
                rank: 3,
                ..piece(0, 1)
            }],
        )],
        (0..100).map(|e| (e, vec![piece(0, 1)])).collect(),
    ] {
        state.pending = pending;
        let err = build(0, 1).resume(&state).unwrap_err().to_string();
        assert!(err.contains("piece") || err.contains("epochs"), "{err}");
    }
}

/// The shards as pyarrow reads them, through an Arrow IPC file it writes.
fn pyarrow_table(url: &str, out: &Path) -> RecordBatch {
    let script = r#"
import json, sys, pyarrow as pa, pyarrow.parquet as pq
m = json.load(open(sys.argv[1] + "/manifest.json"))
t = pa.concat_tables([pq.read_table(sys.argv[1] + "/" + s["path"]) for s in m["shards"]])
with pa.ipc.new_stream(sys.argv[2], t.schema) as w:
    w.write_table(t)
"#;
    let output = python()
        .arg("-c")
        .arg(script)
        .arg(url)
        .arg(s(out))
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "pyarrow failed (.ci/run installs it):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reader =
        arrow_ipc::reader::StreamReader::try_new(std::fs::File::open(out).unwrap(), None).unwrap();
    let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    concat(&batches)
}

fn check_batch_against(
    batch: &Batch,
    table: &RecordBatch,
    index: &HashMap<i64, usize>,
    padded: Option<usize>,
) {
    let ids = batch.values::<i64>("id").unwrap();
    for (i, id) in ids.iter().enumerate() {
        let row = index[id];
        // f: nullable float64.
        let f = table
            .column_by_name("f")
            .unwrap()
            .as_primitive::<Float64Type>();
        assert_eq!(
            batch.validity("f").unwrap()[i] == 1,
            f.is_valid(row),
            "f validity, id {id}"
        );
        if f.is_valid(row) {
            assert_eq!(batch.values::<f64>("f").unwrap()[i], f.value(row));
        } else {
            assert_eq!(batch.values::<f64>("f").unwrap()[i], 0.0);
        }
        // date: int32 days.
        let date = table
            .column_by_name("date")
            .unwrap()
            .as_primitive::<arrow_array::types::Date32Type>();
        assert_eq!(batch.values::<i32>("date").unwrap()[i], date.value(row));
        // ts: zoned timestamp as int64 microseconds.
        let ts = table
            .column_by_name("ts")
            .unwrap()
            .as_primitive::<arrow_array::types::TimestampMicrosecondType>();
        assert_eq!(batch.values::<i64>("ts").unwrap()[i], ts.value(row));
        // flag: nullable bool as u8.
        let flag = table.column_by_name("flag").unwrap().as_boolean();
        assert_eq!(batch.validity("flag").unwrap()[i] == 1, flag.is_valid(row));
        if flag.is_valid(row) {
            assert_eq!(
                batch.values::<u8>("flag").unwrap()[i],
                flag.value(row) as u8
            );
        }
        // s: nullable string; b: nullable binary.
        let strings = table.column_by_name("s").unwrap().as_string::<i32>();
        let (o, v) = (
            batch.offsets("s").unwrap(),
            batch.values::<u8>("s").unwrap(),
        );
        let got = &v[o[i] as usize..o[i + 1] as usize];
        assert_eq!(batch.validity("s").unwrap()[i] == 1, strings.is_valid(row));
        assert_eq!(
            got,
            if strings.is_valid(row) {
                strings.value(row).as_bytes()
            } else {
                b""
            }
        );
        let blobs = table.column_by_name("b").unwrap().as_binary::<i32>();
        let (o, v) = (
            batch.offsets("b").unwrap(),
            batch.values::<u8>("b").unwrap(),
        );
        assert_eq!(
            &v[o[i] as usize..o[i + 1] as usize],
            if blobs.is_valid(row) {
                blobs.value(row)
            } else {
                b""
            }
        );
        // embedding: fixed-size list<float32, 4> as [batch, 4].
        let emb = table
            .column_by_name("embedding")
            .unwrap()
            .as_fixed_size_list();
        let want = emb.value(row);
        let want = want.as_primitive::<Float32Type>();
        assert_eq!(
            &batch.values::<f32>("embedding").unwrap()[i * 4..i * 4 + 4],
            want.values().as_ref()
        );
        // tokens: nullable list<int32>, ragged or padded.
        let tokens = table.column_by_name("tokens").unwrap().as_list::<i32>();
        let want: Vec<i32> = if tokens.is_valid(row) {
            tokens
                .value(row)
                .as_primitive::<Int32Type>()
                .values()
                .to_vec()
        } else {
            vec![]
        };
        match padded {
            None => {
                let (o, v) = (
                    batch.offsets("tokens").unwrap(),
                    batch.values::<i32>("tokens").unwrap(),
                );
                assert_eq!(
                    &v[o[i] as usize..o[i + 1] as usize],
                    want.as_slice(),
                    "tokens of id {id}"
                );
            }
            Some(pad) => {
                let len = batch.lengths("tokens").unwrap()[i] as usize;
                let row_values = &batch.values::<i32>("tokens").unwrap()[i * pad..(i + 1) * pad];
                assert_eq!(len, want.len().min(pad));
                assert_eq!(&row_values[..len], &want[..len]);
                assert!(
                    row_values[len..].iter().all(|&x| x == -1),
                    "padding of id {id}"
                );
            }
        }
    }
}

/// Shards whose dictionaries `shard` wrote in order of use (skewed ids and
/// token lists, 128 KiB pages of keys) and whose pages name different key
/// widths (a float column's first page 10 bits, the next 12) read back
/// through the loader with every row's own values, every row once.
#[test]
fn dictionaries_in_order_of_use_and_pages_of_varying_widths_read_back() {
    use arrow_array::builder::{Int32Builder, ListBuilder};
    use arrow_array::{ArrayRef, Float64Array, Int64Array};
    use std::sync::Arc;
    let rows = 60_000usize;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut unit = || (next() >> 11) as f64 / (1u64 << 53) as f64;
    let zipf: Vec<i64> = (0..rows)
        .map(|_| (3_000f64.powf(unit() * unit()) as i64) * 1_000_003)
        .collect();
    // Rows 0-19,999 of the first row group: 1,000 values; then 3,000.
    let widening: Vec<f64> = (0..rows)
        .map(|i| ((unit() * if i < 20_000 { 1_000.0 } else { 3_000.0 }) as i64) as f64)
        .collect();
    let tokens: Vec<Vec<i32>> = (0..rows)
        .map(|r| {
            (0..1 + r % 64)
                .map(|_| 50_000f64.powf(unit() * unit()) as i32)
                .collect()
        })
        .collect();
    let mut list = ListBuilder::new(Int32Builder::new());
    for row in &tokens {
        list.values().append_slice(row);
        list.append(true);
    }
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..rows as i64)) as ArrayRef,
        ),
        ("zipf", Arc::new(Int64Array::from(zipf.clone()))),
        ("widening", Arc::new(Float64Array::from(widening.clone()))),
        ("tokens", Arc::new(list.finish())),
    ])
    .unwrap();
    let tmp = tempdir();
    let input = tmp.path().join("skewed.parquet");
    write_parquet(&input, &batch);
    let url = s(&tmp.path().join("ds"));
    let options = shardfeed_preprocess::ShardOptions::default()
        .with_row_group_rows(30_000)
        .with_shard_size(1 << 30);
    shardfeed_preprocess::shard(&[s(&input)], &url, &options).unwrap();
    let mut loader = Loader::builder(&url)
        .batch_size(1000)
        .seed(4)
        .drop_last(false)
        .build()
        .unwrap();
    let mut seen = vec![false; rows];
    for batch in &mut loader {
        let batch = batch.unwrap();
        let ids = batch.values::<i64>("id").unwrap();
        let (z, w) = (
            batch.values::<i64>("zipf").unwrap(),
            batch.values::<f64>("widening").unwrap(),
        );
        let (o, t) = (
            batch.offsets("tokens").unwrap(),
            batch.values::<i32>("tokens").unwrap(),
        );
        for (i, &id) in ids.iter().enumerate() {
            let id = id as usize;
            assert!(!seen[id], "row {id} twice");
            seen[id] = true;
            assert_eq!(z[i], zipf[id], "zipf of row {id}");
            assert_eq!(w[i], widening[id], "widening of row {id}");
            assert_eq!(
                &t[o[i] as usize..o[i + 1] as usize],
                tokens[id].as_slice(),
                "tokens of row {id}"
            );
        }
    }
    assert!(seen.iter().all(|&s| s), "every row once");
}

#[test]
fn collated_values_equal_what_pyarrow_reads() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::KitchenSink, 1500, 128, 32 << 10);
    let table = pyarrow_table(&url, &tmp.path().join("table.arrow"));
    let index: HashMap<i64, usize> = table
        .column_by_name("id")
        .unwrap()
        .as_primitive::<Int64Type>()
        .values()
        .iter()
        .enumerate()
        .map(|(r, id)| (*id, r))
        .collect();
    let columns = [
        "id",
        "f",
        "date",
        "ts",
        "flag",
        "s",
        "b",
        "embedding",
        "tokens",
    ];
    for padded in [None, Some(8)] {
        let mut builder = Loader::builder(&url)
            .columns(columns)
            .batch_size(100)
            .seed(2)
            .drop_last(false);
        if let Some(pad) = padded {
            builder = builder.pad_to(pad, -1.0);
        }
        let mut loader = builder.build().unwrap();
        let mut rows = 0;
        for batch in &mut loader {
            let batch = batch.unwrap();
            check_batch_against(&batch, &table, &index, padded);
            rows += batch.rows();
        }
        assert_eq!(rows, 1500);
        if padded.is_some() {
            assert!(
                loader.stats().truncated_rows > 0,
                "some token lists are longer than 8"
            );
        }
    }
    // A struct named whole loads as its fields, null where the struct is.
    let st = table.column_by_name("st").unwrap().as_struct();
    let (a, b) = (
        st.column(0).as_primitive::<Int32Type>(),
        st.column(1).as_string::<i32>(),
    );
    let mut rows = 0;
    for batch in Loader::builder(&url)
        .columns(["id", "st"])
        .batch_size(100)
        .drop_last(false)
        .build()
        .unwrap()
    {
        let batch = batch.unwrap();
        let (valid_a, valid_b) = (
            batch.validity("st.a").unwrap(),
            batch.validity("st.b").unwrap(),
        );
        let (offsets, bytes) = (
            batch.offsets("st.b").unwrap(),
            batch.values::<u8>("st.b").unwrap(),
        );
        for (i, id) in batch.values::<i64>("id").unwrap().iter().enumerate() {
            let row = index[id];
            assert_eq!(
                valid_a[i] == 1,
                st.is_valid(row) && a.is_valid(row),
                "id {id}"
            );
            if valid_a[i] == 1 {
                assert_eq!(batch.values::<i32>("st.a").unwrap()[i], a.value(row));
            }
            assert_eq!(valid_b[i] == 1, st.is_valid(row), "id {id}");
            if st.is_valid(row) {
                let value = &bytes[offsets[i] as usize..offsets[i + 1] as usize];
                assert_eq!(value, b.value(row).as_bytes(), "id {id}");
            }
        }
        rows += batch.rows();
    }
    assert_eq!(rows, 1500);
    // A map loads as a list per entry field (keys: lists of strings,
    // values: lists of int32), null where the map is.
    let map = table.column_by_name("map").unwrap().as_map();
    let (keys, values) = (
        map.keys().as_string::<i32>(),
        map.values().as_primitive::<Int32Type>(),
    );
    let mut rows = 0;
    for batch in Loader::builder(&url)
        .columns(["id", "map"])
        .batch_size(100)
        .drop_last(false)
        .build()
        .unwrap()
    {
        let batch = batch.unwrap();
        // The entry fields as the writer named them (`keys`, `values`).
        let names: Vec<&str> = batch.columns().iter().map(|c| c.name.as_str()).collect();
        let (k, v) = (
            format!("map.{}", map.entries().column_names()[0]),
            format!("map.{}", map.entries().column_names()[1]),
        );
        assert_eq!(names, ["id", k.as_str(), v.as_str()]);
        let got_keys = batch.binary_lists(&k).unwrap();
        let (offsets, got_values) = (batch.offsets(&v).unwrap(), batch.values::<i32>(&v).unwrap());
        let valid = batch.validity(&k).unwrap();
        for (i, id) in batch.values::<i64>("id").unwrap().iter().enumerate() {
            let row = index[id];
            assert_eq!(valid[i] == 1, map.is_valid(row), "id {id}");
            if !map.is_valid(row) {
                continue;
            }
            let (a, b) = (
                map.value_offsets()[row] as usize,
                map.value_offsets()[row + 1] as usize,
            );
            let want_keys: Vec<&[u8]> = (a..b).map(|j| keys.value(j).as_bytes()).collect();
            assert_eq!(got_keys[i], want_keys, "id {id}");
            let want_values: Vec<i32> = (a..b).map(|j| values.value(j)).collect();
            let (x, y) = (offsets[i] as usize, offsets[i + 1] as usize);
            assert_eq!(got_values[x..y], want_values[..], "id {id}");
        }
        rows += batch.rows();
    }
    assert_eq!(rows, 1500);
    // A list of lists of int64: each row's inner lists (`value_offsets` into
    // the values), and the rows' validity, as arrow reads them.
    let nested = table.column_by_name("nested").unwrap().as_list::<i32>();
    let inner = nested.values().as_list::<i32>();
    let leaf = inner.values().as_primitive::<Int64Type>();
    // Whole batches, and batches a filter compacted (every third id left
    // out: the kept rows' inner lists move to close the gaps).
    for third in [false, true] {
        let mut rows = 0;
        let mut builder = Loader::builder(&url)
            .columns(["id", "nested"])
            .batch_size(100)
            .seed(4);
        if third {
            builder =
                builder.filter(|row| row.values::<i64>("id").is_some_and(|id| id[0] % 3 != 0));
        }
        for batch in builder.build().unwrap() {
            let batch = batch.unwrap();
            let (offsets, items) = (
                batch.offsets("nested").unwrap(),
                batch.value_offsets("nested").unwrap(),
            );
            let (values, valid) = (
                batch.values::<i64>("nested").unwrap(),
                batch.validity("nested").unwrap(),
            );
            assert!(batch.binary_lists("nested").is_none(), "not bytes");
            let lists = batch.lists::<i64>("nested").unwrap();
            assert!(batch.lists::<f64>("nested").is_none(), "another type");
            for (i, id) in batch.values::<i64>("id").unwrap().iter().enumerate() {
                let row = index[id];
                assert_eq!(valid[i] == 1, nested.is_valid(row), "id {id}");
                let want: Vec<Vec<i64>> = if nested.is_valid(row) {
                    let (a, b) = (
                        nested.value_offsets()[row] as usize,
                        nested.value_offsets()[row + 1] as usize,
                    );
                    (a..b)
                        .map(|j| {
                            let (x, y) = (
                                inner.value_offsets()[j] as usize,
                                inner.value_offsets()[j + 1] as usize,
                            );
                            leaf.values()[x..y].to_vec()
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                let got: Vec<Vec<i64>> = (offsets[i] as usize..offsets[i + 1] as usize)
                    .map(|j| values[items[j] as usize..items[j + 1] as usize].to_vec())
                    .collect();
                assert_eq!(got, want, "id {id}");
                assert_eq!(lists[i], want, "id {id} through Batch::lists");
                assert!(!third || id % 3 != 0);
            }
            rows += batch.rows();
        }
        assert_eq!(rows, if third { 1000 } else { 1500 });
    }
    let err = Loader::builder(&url).columns(["nope"]).build().unwrap_err();
    assert!(err.to_string().contains("`nope`"), "{err}");
}

#[test]
fn bad_options_are_named() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Text, 100, 10, 4 << 10);
    let cases: Vec<(shardfeed_loader::LoaderBuilder, &str)> = vec![
        (Loader::builder(&url).batch_size(0), "batch_size"),
        (Loader::builder(&url).rank(2).world_size(2), "rank"),
        (Loader::builder(&url).world_size(0), "world_size"),
        (Loader::builder(&url).window(0), "window"),
        (Loader::builder(&url).byte_budget(10), "byte_budget"),
        (Loader::builder(&url).pad_to(0, 0.0), "pad_to"),
    ];
    for (builder, option) in cases {
        let err = builder.build().unwrap_err();
        assert!(matches!(err, LoaderError::BadOption { .. }), "{err}");
        assert!(err.to_string().contains(option), "{err}");
    }
    let err = Loader::builder(&s(&tmp.path().join("missing")))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("manifest.json"), "{err}");
}

/// On a small byte budget the default read-ahead shrinks to a pool the
/// budget bounds, where it was refused by the name of an option the user
/// never set (`prefetch`); a `prefetch` that is set is still refused by
/// name, and one too large for any read-ahead names the budget.
#[test]
fn the_default_prefetch_fits_a_small_byte_budget() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Tokens, 4000, 50, 256 << 10);
    let batch = 1000;
    let slab = Loader::builder(&url)
        .batch_size(batch)
        .build()
        .unwrap()
        .stats()
        .slab_bytes as u64;
    // 4x this budget holds 8 slabs: the default 16 batches ahead need 19.
    let budget = 2 * slab;
    assert!(slab >= 1 << 20 && 19 * slab > 4 * budget, "slab {slab}");
    let mut loader = Loader::builder(&url)
        .batch_size(batch)
        .byte_budget(budget)
        .build()
        .unwrap();
    let ids: Vec<i64> = id_batches(&mut loader).concat();
    assert_eq!(ids.len(), 4000);
    assert!(loader.stats().slabs <= 8, "{:?}", loader.stats().slabs);
    let err = Loader::builder(&url)
        .batch_size(batch)
        .byte_budget(budget)
        .prefetch(16)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("prefetch"), "{err}");
    let err = Loader::builder(&url)
        .batch_size(batch)
        .byte_budget(slab)
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, LoaderError::BadOption { option, .. } if *option == "byte_budget"),
        "{err}"
    );
}

#[test]
fn corrupted_and_missing_shards_are_named_never_decoded() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Tokens, 600, 10, 256 << 10);
    let m = manifest(Path::new(&url));
    assert!(m.shards.len() >= 3);
    let victim = &m.shards[1];
    assert!(victim.row_groups.len() >= 2, "{:?}", victim.row_groups);
    let path = Path::new(&url).join(&victim.path);
    let original = std::fs::read(&path).unwrap();
    // Flip a byte inside the data of the second row group's first column chunk.
    let footer = parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(&bytes::Bytes::from(original.clone()))
        .unwrap();
    let (start, len) = footer.row_group(1).column(1).byte_range();
    let mut bytes = original.clone();
    bytes[(start + len / 2) as usize] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let mut loader = Loader::builder(&url)
        .batch_size(10)
        .shuffle(false)
        .build()
        .unwrap();
    let mut good_rows = 0;
    let err = loop {
        match loader.next() {
            Some(Ok(b)) => good_rows += b.rows(),
            Some(Err(e)) => break e,
            None => panic!("corruption went unnoticed"),
        }
    };
    let text = err.to_string();
    assert!(
        text.contains(&victim.path) && text.contains("row group 1"),
        "{text}"
    );
    // Rows before the damage were delivered intact; none after it.
    assert!(good_rows as u64 <= m.shards[0].rows + victim.row_groups[0]);
    drop(loader);

    std::fs::write(&path, &original).unwrap();
    std::fs::remove_file(Path::new(&url).join(&m.shards[2].path)).unwrap();
    let mut loader = Loader::builder(&url).batch_size(10).build().unwrap();
    let err = loader.find_map(|b| b.err()).expect("a missing shard fails");
    assert!(
        err.to_string().contains(&m.shards[2].path) && err.to_string().contains("missing"),
        "{err}"
    );
}

#[test]
fn images_read_in_place_equal_what_pyarrow_reads() {
    // Image pages are stored uncompressed: the loader's arrays point into the
    // mapped shards until the bytes are copied into slabs.
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Images, 90, 16, 2 << 20);
    let table = pyarrow_table(&url, &tmp.path().join("table.arrow"));
    let ids = table
        .column_by_name("id")
        .unwrap()
        .as_primitive::<Int64Type>();
    let labels = table
        .column_by_name("label")
        .unwrap()
        .as_primitive::<Int32Type>();
    let images = table.column_by_name("image").unwrap().as_binary::<i32>();
    let index: HashMap<i64, usize> = ids
        .values()
        .iter()
        .enumerate()
        .map(|(r, id)| (*id, r))
        .collect();
    let loader = Loader::builder(&url)
        .batch_size(7)
        .seed(5)
        .drop_last(false)
        .build()
        .unwrap();
    let mut seen = 0;
    for batch in loader {
        let batch = batch.unwrap();
        let (offsets, bytes) = (
            batch.offsets("image").unwrap(),
            batch.values::<u8>("image").unwrap(),
        );
        for (i, id) in batch.values::<i64>("id").unwrap().iter().enumerate() {
            let row = index[id];
            assert_eq!(batch.values::<i32>("label").unwrap()[i], labels.value(row));
            let image = &bytes[offsets[i] as usize..offsets[i + 1] as usize];
            assert_eq!(image, images.value(row), "image of id {id}");
            seen += 1;
        }
    }
    assert_eq!(seen, 90);
}

#[test]
fn streaming_uncompressed_pages_keeps_memory_to_the_budget() {
    // Random ~100 KB images: zstd cannot shrink them, so their pages are
    // stored uncompressed and the loader's arrays point straight into the
    // memory-mapped shards until collated. Four times the data must not
    // raise the peak: mapped pages leave the resident set once the arrays
    // pointing at them are dropped, not only once decoded.
    let tmp = tempdir();
    let peak = |rows: u64| {
        let url = dataset(
            &tmp.path().join(rows.to_string()),
            Kind::Images,
            rows,
            16,
            32 << 20,
        );
        let args = [
            "bench",
            &url,
            "--batch-size",
            "8",
            "--threads",
            "2",
            "--byte-budget",
            "16MiB",
            "--window",
            "2",
            "--prefetch",
            "2",
            "--json",
        ];
        let out = shardfeed(&args).success().json();
        assert_eq!(out["rows"].as_u64().unwrap(), rows);
        out["peak_rss_bytes"].as_u64().unwrap()
    };
    let (small, big) = (peak(600), peak(2400));
    eprintln!(
        "peak RSS {} MiB for ~60 MB of images, {} MiB for ~240 MB",
        small >> 20,
        big >> 20
    );
    assert!(
        big < small + (40 << 20),
        "peak RSS grew with the data: {small} -> {big}"
    );
}

/// Neither the loader's buffers nor the command's allocator are advised to
/// use transparent huge pages: under the usual `madvise` policy (or
/// `never`) a `bench` process holds none at its end (with the advice, it
/// held ~300 MiB of them, zeroed 2 MiB at a time; docs/performance-notes.md).
#[test]
fn bench_holds_no_huge_pages_unless_the_system_policy_is_always() {
    let policy =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Tabular, 200_000, 50_000, 64 << 20);
    let out = shardfeed(&[
        "bench",
        &url,
        "--batch-size",
        "1000",
        "--epochs",
        "2",
        "--json",
    ])
    .success()
    .json();
    assert_eq!(out["rows"].as_u64().unwrap(), 400_000);
    let huge = out["huge_page_bytes"].as_u64();
    eprintln!(
        "THP policy {:?}: {huge:?} bytes in huge pages",
        policy.trim()
    );
    if policy.contains("[madvise]") || policy.contains("[never]") {
        assert_eq!(huge, Some(0), "THP policy {policy:?}");
    }
}

/// `bench --rebuild-each-epoch` builds a new loader for each epoch,
/// resumed from the last one's state: each epoch yields its 3,000 rows in
/// 30 batches as one loader's do, and the report counts every loader's.
#[test]
fn bench_rebuilding_the_loader_each_epoch_counts_every_loader() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Tokens, 3000, 500, 256 << 10);
    let run = |rebuild: bool| {
        let mut args = vec![
            "bench",
            &url,
            "--batch-size",
            "100",
            "--epochs",
            "3",
            "--json",
        ];
        if rebuild {
            args.push("--rebuild-each-epoch");
        }
        shardfeed(&args).success().json()
    };
    let (once, rebuilt) = (run(false), run(true));
    for out in [&once, &rebuilt] {
        assert_eq!(out["rows"].as_u64(), Some(9000), "{out}");
        assert_eq!(out["batches"].as_u64(), Some(90), "{out}");
        let epochs = out["epoch_rows_per_s"].as_array().unwrap();
        assert_eq!(epochs.len(), 3);
        assert!(epochs.iter().all(|r| r.as_f64().unwrap() > 0.0));
    }
    assert_eq!(
        rebuilt["stats"]["rows"].as_u64(),
        Some(3000),
        "the stats are the last loader's"
    );
}

#[test]
fn dropping_a_loader_mid_epoch_stops_promptly_and_slabs_are_leased() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Tokens, 2000, 64, 256 << 10);
    let mut loader = Loader::builder(&url)
        .batch_size(32)
        .prefetch(2)
        .pinning(PinningMode::Auto)
        .build()
        .unwrap();
    assert_eq!(loader.stats().pinning, loader.pinning().name());
    let first = loader.next().unwrap().unwrap();
    let second = loader.next().unwrap().unwrap();
    assert_ne!(first.slab().as_ptr(), second.slab().as_ptr());
    // Holding every slab: next() reports it instead of hanging.
    let mut held = vec![first, second];
    let err = loop {
        match loader.next() {
            Some(Ok(b)) => held.push(b),
            Some(Err(e)) => break e,
            None => panic!("epoch ended"),
        }
    };
    assert!(matches!(err, LoaderError::PoolExhausted { .. }), "{err}");
    held.clear();
    assert!(loader.next().unwrap().is_ok(), "slabs came back");
    drop(loader);
}

/// Dropping a loader whose fetch stage is stuck (a failpoint blocks it
/// until cancelled) cancels I/O and joins every thread: `drop` returns.
/// A wait can be interrupted meanwhile, and the pass goes on.
#[test]
fn dropping_a_loader_with_stuck_io_cancels_it_and_returns() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Tokens, 500, 64, 256 << 10);
    let mut loader = Loader::builder(&url)
        .batch_size(32)
        .failpoints("fetch=block")
        .build()
        .unwrap();
    let mut polls = 0;
    let waited = loader.next_interruptible(|| {
        polls += 1;
        polls == 3
    });
    assert!(matches!(waited, Some(Err(LoaderError::Interrupted))));
    drop(loader);
}

#[test]
fn consecutive_epochs_started_ahead_equal_fresh_loaders() {
    // The next epoch's pass starts while the current one finishes; its
    // batches must be exactly those of a loader built for that epoch.
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Text, 1003, 37, 8 << 10);
    let build = |epoch| {
        Loader::builder(&url)
            .columns(["id"])
            .batch_size(10)
            .seed(5)
            .epoch(epoch)
            .window(2)
            .prefetch(2)
            .build()
            .unwrap()
    };
    let mut running = build(0);
    for epoch in 0..4 {
        let got = id_batches(&mut running);
        assert_eq!(got, id_batches(&mut build(epoch)), "epoch {epoch}");
        assert_eq!(running.epoch(), epoch + 1);
    }
    // set_epoch on the epoch already started ahead keeps it; on another, restarts.
    running.set_epoch(4);
    assert_eq!(id_batches(&mut running), id_batches(&mut build(4)));
    running.set_epoch(1);
    assert_eq!(id_batches(&mut running), id_batches(&mut build(1)));
}

/// Elastic resume on many shapes: row-group sizes, batch sizes, old and new
/// world sizes 1-5 and stop points (equal and uneven across old ranks).
/// Every new rank streams to its end without error, all new ranks yield as
/// many batches, and across both runs no row is read twice.
#[test]
fn elastic_resume_streams_on_every_shape() {
    let tmp = tempdir();
    let shapes = [(960u64, 96u64), (1003, 37), (600, 200)];
    for (i, &(total, group)) in shapes.iter().enumerate() {
        let dir = tmp.path().join(i.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let url = dataset(&dir, Kind::Text, total, group, 8 << 10);
        let mut g = shardfeed_format::permute::SplitMix64::new(i as u64 + 1);
        // The reported shape first: 960 rows in row groups of 96, batch 16,
        // seed 11, two ranks stopped after 4, 5 or 6 batches, three new ranks.
        let mut cases: Vec<(usize, u64, u64, u64, Vec<usize>)> = Vec::new();
        if i == 0 {
            for stop in [4, 5, 6] {
                cases.push((16, 11, 2, 3, vec![stop, stop]));
            }
        }
        for _ in 0..8 {
            let batch = [1usize, 7, 16, 33][g.below(4) as usize];
            let old = 1 + g.below(5);
            let new = 1 + g.below(5);
            let seed = g.below(1000);
            let per_rank = (total / old) as usize / batch;
            // Ranks of one job stop at the same step; uneven stops are tried
            // too where the world size changes (the rest is shared out anew).
            let equal = old == new || g.below(2) == 0;
            let first = g.below(per_rank as u64 + 1) as usize;
            let stops = (0..old)
                .map(|_| {
                    if equal {
                        first
                    } else {
                        g.below(per_rank as u64 + 1) as usize
                    }
                })
                .collect();
            cases.push((batch, seed, old, new, stops));
        }
        for (batch, seed, old, new, stops) in cases {
            let build = |rank, world| {
                Loader::builder(&url)
                    .columns(["id"])
                    .batch_size(batch)
                    .seed(seed)
                    .rank(rank)
                    .world_size(world)
                    .decode_threads(1)
                    .build()
                    .unwrap()
            };
            let what = format!(
                "{total} rows in groups of {group}, batch {batch}, seed {seed}, {old} -> {new}, stops {stops:?}"
            );
            let mut seen: Vec<i64> = Vec::new();
            let mut states = Vec::new();
            for rank in 0..old {
                let mut l = build(rank, old);
                for _ in 0..stops[rank as usize] {
                    match l.next() {
                        Some(b) => seen.extend(b.unwrap().values::<i64>("id").unwrap()),
                        None => break,
                    }
                }
                states.push(LoaderState::from_json(&l.state().to_json()).unwrap());
            }
            let mut counts = Vec::new();
            for rank in 0..new {
                let mut l = build(rank, new);
                l.resume_elastic(&states).unwrap();
                let mut n = 0;
                for b in l.by_ref() {
                    let b = b.unwrap_or_else(|e| panic!("{what}: new rank {rank}: {e}"));
                    seen.extend(b.values::<i64>("id").unwrap());
                    n += 1;
                }
                counts.push(n);
            }
            assert!(
                counts.windows(2).all(|w| w[0] == w[1]),
                "{what}: batches per new rank {counts:?}"
            );
            let mut sorted = seen.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), seen.len(), "{what}: a row was read twice");
        }
    }
}

/// Every field of a state is checked against the dataset and the plan
/// before it is used: a forged world size sizes nothing (2^28, 2^40,
/// 2^64 - 1), a position past the epoch's end is refused rather than an
/// empty epoch, pieces that overlap are refused rather than read twice,
/// the last epoch is refused rather than wrapped to 0. Each error names
/// the field.
#[test]
fn forged_state_fields_are_refused_naming_the_field() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Text, 400, 40, 8 << 10);
    let build = |rank, world| {
        Loader::builder(&url)
            .batch_size(10)
            .seed(2)
            .rank(rank)
            .world_size(world)
            .build()
            .unwrap()
    };
    let mut l = build(0, 2);
    for _ in 0..3 {
        l.next().unwrap().unwrap();
    }
    let good = l.state();
    let refused = |states: &[LoaderState], elastic: bool| -> String {
        let mut l = build(0, 2);
        let err = if elastic {
            l.resume_elastic(states)
        } else {
            l.resume(&states[0])
        };
        let err = err.unwrap_err();
        assert!(matches!(err, LoaderError::BadState { .. }), "{err}");
        err.to_string()
    };
    for world in [1u64 << 28, 1 << 40, u64::MAX] {
        let mut forged = good.clone();
        forged.world_size = world;
        let e = refused(&[forged], true);
        assert!(e.contains("ranks") || e.contains("world_size"), "{e}");
    }
    let mut forged = good.clone();
    forged.position = 10_000;
    let e = refused(std::slice::from_ref(&forged), false);
    assert!(
        e.contains("position 10000") && e.contains("past the end"),
        "{e}"
    );
    let mut forged = good.clone();
    forged.epoch = u64::MAX;
    forged.position = 0;
    let e = refused(std::slice::from_ref(&forged), false);
    assert!(e.contains("epoch"), "{e}");
    let piece = |start, end| shardfeed_loader::Piece {
        rank: 1,
        world: 2,
        start,
        end,
    };
    let mut forged = good.clone();
    forged.position = 0;
    forged.pending = vec![(0, vec![piece(0, 100), piece(50, 150)])];
    let e = refused(std::slice::from_ref(&forged), false);
    assert!(e.contains("overlap"), "{e}");
    forged.pending = vec![(0, vec![piece(0, 10)]), (0, vec![piece(20, 30)])];
    let e = refused(std::slice::from_ref(&forged), false);
    assert!(e.contains("epoch 0") && e.contains("twice"), "{e}");
    // An elastic resume checks each old rank's position too.
    let mut other = build(1, 2);
    other.next().unwrap().unwrap();
    let mut second = other.state();
    second.position = 9_999;
    let e = build(0, 3)
        .resume_elastic(&[good.clone(), second])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 1") && e.contains("position 9999"), "{e}");
    // The good state still resumes.
    build(0, 2).resume(&good).unwrap();
}

/// A projection whose column names would meet a buffer's key in a batch
/// dict (`s.offsets` beside the string column `s`, `n.validity` beside the
/// nullable `n`) is refused naming both; either one alone loads.
#[test]
fn columns_named_like_another_columns_buffers_are_refused() {
    use arrow_array::{ArrayRef, Int64Array, StringArray};
    let tmp = tempdir();
    let rows = 50i64;
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            std::sync::Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef,
        ),
        (
            "s",
            std::sync::Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| format!("row {i}")),
            )) as ArrayRef,
        ),
        (
            "s.offsets",
            std::sync::Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i * 7))) as ArrayRef,
        ),
        (
            "n",
            std::sync::Arc::new(Int64Array::from_iter(
                (0..rows).map(|i| (i % 3 != 0).then_some(i)),
            )) as ArrayRef,
        ),
        (
            "n.validity",
            std::sync::Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef,
        ),
    ])
    .unwrap();
    let input = tmp.path().join("in.parquet");
    write_parquet(&input, &batch);
    let out = tmp.path().join("ds");
    shardfeed_preprocess::shard(
        &[s(&input)],
        &s(&out),
        &shardfeed_preprocess::ShardOptions::default(),
    )
    .unwrap();
    let url = s(&out);
    let build = |columns: Option<&[&str]>| {
        let mut b = Loader::builder(&url).batch_size(10);
        if let Some(c) = columns {
            b = b.columns(c.iter().copied());
        }
        b.build()
    };
    for columns in [
        None,
        Some(&["s", "s.offsets"][..]),
        Some(&["id", "n.validity", "n"][..]),
    ] {
        let err = build(columns).unwrap_err();
        assert!(
            matches!(
                err,
                LoaderError::BadOption {
                    option: "columns",
                    ..
                }
            ),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains(".offsets`") || text.contains(".validity`"),
            "{text}"
        );
    }
    for columns in [&["s", "n"][..], &["s.offsets", "n.validity", "id"][..]] {
        let mut l = build(Some(columns)).unwrap();
        let b = l.next().unwrap().unwrap();
        assert_eq!(b.rows(), 10);
    }
}

/// A `map_batch` closure changes batches in place on the collate thread,
/// with draws the same for any number of decode threads and after a resume;
/// its error ends the epoch naming the batch.
#[test]
fn map_batch_runs_in_place_deterministically_and_its_errors_name_the_batch() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Text, 3000, 90, 16 << 10);
    let build = |threads: usize, fail_at: Option<u64>| {
        Loader::builder(&url)
            .batch_size(50)
            .seed(4)
            .decode_threads(threads)
            .map_batch(move |batch, rng| {
                if Some(batch.index()) == fail_at {
                    return Err(format!("no good at {}", batch.index()).into());
                }
                let draw = rng.below(1000) as i64;
                for id in batch.values_mut::<i64>("id").ok_or("no i64 column id")? {
                    *id = *id * 1000 + draw;
                }
                Ok(())
            })
            .build()
            .unwrap()
    };
    let one = id_batches(&mut build(1, None));
    assert_eq!(one, id_batches(&mut build(3, None)));
    let plain = id_batches(
        &mut Loader::builder(&url)
            .batch_size(50)
            .seed(4)
            .build()
            .unwrap(),
    );
    assert_eq!(one.len(), plain.len());
    let mut draws = std::collections::HashSet::new();
    for (mapped, rows) in one.iter().zip(&plain) {
        let draw = mapped[0] % 1000;
        assert!(mapped.iter().all(|m| m % 1000 == draw));
        assert_eq!(mapped.iter().map(|m| m / 1000).collect::<Vec<_>>(), *rows);
        draws.insert(draw);
    }
    assert!(draws.len() > one.len() / 2, "{draws:?}");
    // A resume after 7 batches gives the rest, draws included.
    let mut first = build(2, None);
    for _ in 0..7 {
        first.next().unwrap().unwrap();
    }
    let state = first.state();
    drop(first);
    let mut second = build(2, None);
    second.resume(&state).unwrap();
    assert_eq!(id_batches(&mut second), one[7..].to_vec());
    // The closure's error is the epoch's, naming the batch.
    let mut failing = build(2, Some(5));
    let err = failing
        .find_map(|b| b.err())
        .expect("an error before the end of the epoch");
    assert!(
        err.to_string()
            .contains("map_batch failed on batch 5: no good at 5"),
        "{err}"
    );
}

/// Each batch's rows as (id, the row's tokens if all equal: its draw).
fn drawn_rows(loader: &mut Loader) -> Vec<Vec<(i64, Option<i32>)>> {
    loader.map(|b| drawn_rows_of(b.unwrap())).collect()
}

/// One batch's rows as (id, the row's tokens, all equal: its draw).
fn drawn_rows_of(b: shardfeed_loader::Batch) -> Vec<(i64, Option<i32>)> {
    let ids = b.values::<i64>("id").unwrap();
    let (tokens, offsets) = (
        b.values::<i32>("input_ids").unwrap(),
        b.offsets("input_ids").unwrap(),
    );
    ids.iter()
        .enumerate()
        .map(|(i, &id)| {
            let row = &tokens[offsets[i] as usize..offsets[i + 1] as usize];
            assert!(row.iter().all(|t| Some(t) == row.first()), "{row:?}");
            (id, row.first().copied())
        })
        .collect()
}

/// `filter` drops rows (counted) and leaves every rank its batches;
/// `map_rows` draws follow the row: the same for any thread count, world
/// size and after an elastic resume; their errors name the batch and the
/// row; rows compact right in every layout; a mixture runs the steps on its
/// own batches.
#[test]
fn filter_and_map_rows_follow_the_rows_and_keep_ranks_in_step() {
    let tmp = tempdir();
    let url = dataset(tmp.path(), Kind::Tokens, 2000, 70, 64 << 10);
    let build = |rank: u64, world: u64, threads: usize| {
        Loader::builder(&url)
            .batch_size(32)
            .seed(9)
            .rank(rank)
            .world_size(world)
            .decode_threads(threads)
            .filter(|row| row.values::<i64>("id").is_some_and(|id| id[0] % 3 != 0))
            .map_rows(|row, rng| {
                let id = row.as_row().values::<i64>("id").ok_or("no id")?[0];
                if id == 1_000_001 {
                    return Err("never".into());
                }
                let draw = rng.below(1000) as i32;
                for t in row.values_mut::<i32>("input_ids").ok_or("no input_ids")? {
                    *t = draw;
                }
                Ok(())
            })
            .build()
            .unwrap()
    };
    let mut whole = build(0, 1, 1);
    let one = drawn_rows(&mut whole);
    assert_eq!(one, drawn_rows(&mut build(0, 1, 3)));
    let plain = id_batches(
        &mut Loader::builder(&url)
            .batch_size(32)
            .seed(9)
            .build()
            .unwrap(),
    );
    let thirds = plain.iter().flatten().filter(|id| *id % 3 == 0).count() as u64;
    assert!(thirds > 600, "{thirds}");
    assert_eq!(whole.stats().filtered_rows, thirds);
    assert_eq!(one.len(), plain.len(), "the same number of batches");
    for (got, rows) in one.iter().zip(&plain) {
        let want: Vec<i64> = rows.iter().copied().filter(|id| id % 3 != 0).collect();
        assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), want);
    }
    let draws: std::collections::HashMap<i64, Option<i32>> =
        one.iter().flatten().copied().collect();
    let distinct: std::collections::HashSet<_> = draws.values().collect();
    assert!(distinct.len() > 500, "{}", distinct.len());
    // Rows (id, draw) read once each, none filtered out, each with the
    // draw world size 1 gave it (the tail each world size drops differs).
    let check = |seen: Vec<(i64, Option<i32>)>| {
        let n = seen.len();
        let unique: std::collections::HashMap<i64, Option<i32>> = seen.into_iter().collect();
        assert_eq!(unique.len(), n, "a row read twice");
        assert!(n + 64 >= draws.len(), "{n} of {}", draws.len());
        let wrong = unique
            .iter()
            .filter(|(id, d)| *id % 3 == 0 || draws.get(id).is_some_and(|w| w != *d))
            .count();
        assert_eq!(wrong, 0, "rows filtered in, or with another draw");
    };
    // Two ranks: equal batch counts.
    let ranks: Vec<_> = (0..2).map(|r| drawn_rows(&mut build(r, 2, 2))).collect();
    assert_eq!(ranks[0].len(), ranks[1].len());
    check(ranks.into_iter().flatten().flatten().collect());
    // Elastic 2 -> 3 after 5 batches each.
    let mut seen = Vec::new();
    let mut states = Vec::new();
    for rank in 0..2 {
        let mut l = build(rank, 2, 1);
        for _ in 0..5 {
            seen.extend(drawn_rows_of(l.next().unwrap().unwrap()));
        }
        states.push(l.state());
    }
    for rank in 0..3 {
        let mut l = build(rank, 3, 2);
        l.resume_elastic(&states).unwrap();
        seen.extend(drawn_rows(&mut l).into_iter().flatten());
    }
    check(seen);
    // Row origins, kept in step with the rows a filter keeps: one origin per
    // id, whatever the order.
    let mut origin: HashMap<i64, shardfeed_loader::RowId> = HashMap::new();
    for seed in [1, 2] {
        let loader = Loader::builder(&url)
            .batch_size(32)
            .seed(seed)
            .row_ids(true)
            .filter(|row| row.values::<i64>("id").is_some_and(|id| id[0] % 3 != 0))
            .build()
            .unwrap();
        for b in loader {
            let b = b.unwrap();
            let ids = b.row_ids().expect("row ids asked for");
            assert_eq!(ids.len(), b.rows());
            for (&id, &at) in b.values::<i64>("id").unwrap().iter().zip(ids) {
                assert_eq!(*origin.entry(id).or_insert(at), at, "row {id}");
            }
        }
    }
    assert!(origin.len() > 1300, "{}", origin.len());
    assert!(
        Loader::builder(&url)
            .build()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .row_ids()
            .is_none()
    );
    // A failing row names its batch, its place in it and its shard.
    let mut failing = Loader::builder(&url)
        .batch_size(32)
        .map_rows(|row, _| match row.as_row().values::<i64>("id") {
            Some([77]) => Err("no good at 77".into()),
            _ => Ok(()),
        })
        .build()
        .unwrap();
    let err = failing
        .find_map(|b| b.err())
        .expect("an error in the epoch");
    let text = err.to_string();
    assert!(
        text.contains("map_rows failed on batch ")
            && text.contains(".parquet, row group ")
            && text.contains("no good at 77"),
        "{text}"
    );
    // A mixture runs the steps on its batches, after blending.
    let mut mixture = Loader::builder_mixture([(url.clone(), 1.0)])
        .batch_size(40)
        .configure(|b| {
            b.filter(|row| row.values::<i64>("id").is_some_and(|id| id[0] % 2 == 0))
                .map_batch(|batch, _| {
                    for id in batch.values_mut::<i64>("id").ok_or("no id")? {
                        *id += 1;
                    }
                    Ok(())
                })
        })
        .build()
        .unwrap();
    let mut ids = Vec::new();
    for b in mixture.by_ref() {
        ids.extend_from_slice(b.unwrap().values::<i64>("id").unwrap());
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..1000).map(|i| 2 * i + 1).collect::<Vec<i64>>());
    assert_eq!(mixture.stats().filtered_rows, 1000);
}

/// A filter's rows compact right in every layout: strings, nullable
/// values, padded lists, alike to the rows of the batch unfiltered.
#[test]
fn filter_compacts_bytes_validity_and_padded_lists() {
    let tmp = tempdir();
    let text = dataset(tmp.path(), Kind::Text, 700, 60, 16 << 10);
    let keep = |id: i64| id % 4 == 1 || id % 7 == 0;
    type TextRow = (i64, Option<String>, Option<f64>);
    let rows = |l: &mut Loader| -> Vec<Vec<TextRow>> {
        l.map(|b| {
            let b = b.unwrap();
            let names: Vec<&[u8]> = b.binary("name").unwrap().collect();
            let (nv, sv) = (b.validity("name"), b.validity("score"));
            let scores = b.values::<f64>("score").unwrap();
            b.values::<i64>("id")
                .unwrap()
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    let name = nv
                        .is_none_or(|v| v[i] == 1)
                        .then(|| String::from_utf8(names[i].to_vec()).unwrap());
                    let score = sv.is_none_or(|v| v[i] == 1).then_some(scores[i]);
                    (id, name, score)
                })
                .collect()
        })
        .collect()
    };
    let plain = rows(
        &mut Loader::builder(&text)
            .batch_size(25)
            .seed(3)
            .build()
            .unwrap(),
    );
    let filtered = rows(
        &mut Loader::builder(&text)
            .batch_size(25)
            .seed(3)
            .filter(move |row| keep(row.values::<i64>("id").unwrap()[0]))
            .build()
            .unwrap(),
    );
    assert_eq!(plain.len(), filtered.len());
    assert!(
        plain.iter().flatten().any(|r| r.1.is_none())
            && plain.iter().flatten().any(|r| r.2.is_none())
    );
    for (p, f) in plain.iter().zip(&filtered) {
        let want: Vec<_> = p.iter().filter(|r| keep(r.0)).cloned().collect();
        assert_eq!(*f, want);
    }
    // Padded lists: values and lengths move with their rows.
    let tokens = dataset(&tmp.path().join("t"), Kind::Tokens, 500, 50, 16 << 10);
    let padded = |filter: bool| {
        let mut b = Loader::builder(&tokens)
            .batch_size(20)
            .seed(1)
            .pad_to(8, 0.0);
        if filter {
            b = b.filter(|row| row.values::<i64>("id").unwrap()[0] % 2 == 0);
        }
        let mut out = Vec::new();
        for batch in b.build().unwrap() {
            let batch = batch.unwrap();
            let (ids, values, lengths) = (
                batch.values::<i64>("id").unwrap(),
                batch.values::<i32>("input_ids").unwrap(),
                batch.lengths("input_ids").unwrap(),
            );
            for (i, &id) in ids.iter().enumerate() {
                out.push((id, values[i * 8..i * 8 + 8].to_vec(), lengths[i]));
            }
        }
        out
    };
    let want: Vec<_> = padded(false).into_iter().filter(|r| r.0 % 2 == 0).collect();
    assert_eq!(padded(true), want);
}

/// The README's Rust quickstart is `loader/examples/quickstart.rs` word for
/// word, and that example (built by `cargo test`) runs over a generated
/// dataset `ds`, reading three epochs of full batches.
#[test]
fn the_readme_rust_quickstart_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let at = readme
        .find("## Quickstart: Rust\n")
        .expect("the README's Rust quickstart");
    let block = readme[at..]
        .split_once("```rust\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a rust block")
        .0;
    let example = std::fs::read_to_string(root.join("loader/examples/quickstart.rs")).unwrap();
    let body = example
        .split_once("// README begins\n")
        .and_then(|(_, rest)| rest.split_once("// README ends"))
        .expect("the README's lines in the example")
        .0;
    assert_eq!(
        words(block),
        words(body),
        "README.md and loader/examples/quickstart.rs differ"
    );
    // target/debug/deps/e2e-* -> target/debug/examples/quickstart
    let exe = std::env::current_exe().unwrap();
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples")
        .join(format!("quickstart{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} is missing: `cargo test --workspace` builds the examples",
        binary.display()
    );
    let tmp = tempdir();
    let ds = dataset(tmp.path(), Kind::Tokens, 1000, 100, 64 << 10);
    assert!(ds.ends_with("/ds"), "{ds}");
    let out = std::process::Command::new(&binary)
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Batches of 256 with the last partial one dropped: 3 x 768 rows.
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "rows 2304");
}

/// Expected per id: the tags (None: a null row; a null item reads as empty)
/// and the messages' roles.
type ListRow = (Option<Vec<String>>, Option<Vec<String>>);

/// 600 rows of `tags: list<string>` (null rows, empty lists, null items)
/// and `messages: list<struct<role, content>>`, sharded; and what each id
/// holds.
fn lists_of_strings(dir: &Path) -> (String, HashMap<i64, ListRow>) {
    use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
    use arrow_schema::{DataType, Field, Fields};
    use std::sync::Arc;

    let n = 600i64;
    let mut tags = ListBuilder::new(StringBuilder::new());
    let fields = Fields::from(vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
    ]);
    let mut messages = ListBuilder::new(StructBuilder::from_fields(fields, 0));
    let mut want = HashMap::new();
    for id in 0..n {
        let row_tags: Option<Vec<String>> = match id % 5 {
            0 => None,
            1 => Some(vec![]),
            _ => Some((0..id % 4).map(|k| format!("t{id}-{k}")).collect()),
        };
        match &row_tags {
            None => tags.append(false),
            Some(t) => {
                for (k, tag) in t.iter().enumerate() {
                    // A null item now and then: read back as empty.
                    if id % 7 == 3 && k == 0 {
                        tags.values().append_null();
                    } else {
                        tags.values().append_value(tag);
                    }
                }
                tags.append(true);
            }
        }
        let read_tags = row_tags.map(|t| {
            t.into_iter()
                .enumerate()
                .map(|(k, tag)| {
                    if id % 7 == 3 && k == 0 {
                        String::new()
                    } else {
                        tag
                    }
                })
                .collect()
        });
        let roles: Vec<String> = (0..id % 3)
            .map(|k| ["user", "assistant"][k as usize % 2].to_string())
            .collect();
        for (k, role) in roles.iter().enumerate() {
            let item = messages.values();
            item.field_builder::<StringBuilder>(0)
                .unwrap()
                .append_value(role);
            item.field_builder::<StringBuilder>(1)
                .unwrap()
                .append_value(format!("text {id} {k}"));
            item.append(true);
        }
        messages.append(id % 11 != 4);
        let read_roles = (id % 11 != 4).then_some(roles);
        want.insert(id, (read_tags, read_roles));
    }
    let batch = RecordBatch::try_from_iter(vec![
        (
            "id",
            Arc::new(arrow_array::Int64Array::from_iter_values(0..n)) as arrow_array::ArrayRef,
        ),
        ("tags", Arc::new(tags.finish())),
        ("messages", Arc::new(messages.finish())),
    ])
    .unwrap();
    std::fs::create_dir_all(dir.join("in")).unwrap();
    write_parquet(&dir.join("in/a.parquet"), &batch);
    let out = dir.join("ds");
    let options = shardfeed_preprocess::ShardOptions::default().with_row_group_rows(50);
    shardfeed_preprocess::shard(&[s(&dir.join("in/a.parquet"))], &s(&out), &options).unwrap();
    (s(&out), want)
}

/// Each row of `batch` as (id, tags, roles).
fn list_rows(batch: &Batch) -> Vec<(i64, ListRow)> {
    let text = |items: Vec<&[u8]>| -> Vec<String> {
        items
            .into_iter()
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
            .collect()
    };
    let (tags, roles) = (
        batch.binary_lists("tags").unwrap(),
        batch.binary_lists("messages.role").unwrap(),
    );
    let (tv, rv) = (
        batch.validity("tags").unwrap(),
        batch.validity("messages.role").unwrap(),
    );
    batch
        .values::<i64>("id")
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let t = (tv[i] == 1).then(|| text(tags[i].clone()));
            let r = (rv[i] == 1).then(|| text(roles[i].clone()));
            (id, (t, r))
        })
        .collect()
}

#[test]
fn lists_of_strings_and_of_structs_read_back_shuffled_and_filtered() {
    let tmp = tempdir();
    let (url, want) = lists_of_strings(tmp.path());
    // Shuffled, every column by default (`messages` as its fields).
    let mut seen = HashMap::new();
    for batch in Loader::builder(&url)
        .batch_size(64)
        .seed(5)
        .drop_last(false)
        .build()
        .unwrap()
    {
        let batch = batch.unwrap();
        assert!(batch.value_offsets("messages.content").is_some());
        for (id, row) in list_rows(&batch) {
            assert!(seen.insert(id, row).is_none(), "id {id} twice");
        }
    }
    assert_eq!(seen, want);
    // A filter moves each kept row's items and bytes down with it.
    let keep = |id: i64| id % 3 != 0;
    let mut kept = HashMap::new();
    for batch in Loader::builder(&url)
        .columns(["id", "tags", "messages.role"])
        .batch_size(64)
        .seed(5)
        .drop_last(false)
        .filter(move |row| keep(row.values::<i64>("id").unwrap()[0]))
        .build()
        .unwrap()
    {
        for (id, row) in list_rows(&batch.unwrap()) {
            assert!(kept.insert(id, row).is_none(), "id {id} twice");
        }
    }
    let expected: HashMap<i64, ListRow> = want.into_iter().filter(|(id, _)| keep(*id)).collect();
    assert_eq!(kept, expected);
}
