//! Mixtures, packing and their state, end to end on real shards.
//!
//! Documents carry their identity in their tokens: token `t` of document
//! `d` of source `s` is `(s + 1) * 10^8 + d * 10^3 + t`, so every check reads
//! the packed output alone.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use proptest::prelude::*;
use shardfeed_loader::{
    Batch, Loader, LoaderError, MixStop, Mixture, MixtureBuilder, MixtureState, PackMode,
};

use crate::support::*;

/// A document's length: 1 to `max`, seeded.
fn doc_len(source: usize, doc: u64, max: u64) -> u64 {
    shardfeed_format::permute::hash_words(&[source as u64, doc, 0x006c_656e]) % max + 1
}

fn token(source: usize, doc: u64, t: u64) -> i32 {
    ((source as u64 + 1) * 100_000_000 + doc * 1000 + t) as i32
}

/// (source, document, offset) of a token.
fn decode(token: i32) -> (usize, u64, u64) {
    let t = token as u64;
    (
        (t / 100_000_000 - 1) as usize,
        t % 100_000_000 / 1000,
        t % 1000,
    )
}

/// Shard `docs` documents of source `source` (lengths 1 to `max_len`) into
/// `dir/name` with row groups of 16 rows over several shards; returns the URL.
fn token_source(dir: &Path, name: &str, source: usize, docs: u64, max_len: u64) -> String {
    let mut ids = ListBuilder::new(Int32Builder::new());
    for d in 0..docs {
        for t in 0..doc_len(source, d, max_len) {
            ids.values().append_value(token(source, d, t));
        }
        ids.append(true);
    }
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..docs as i64)) as ArrayRef,
        ),
        ("input_ids", Arc::new(ids.finish()) as ArrayRef),
    ])
    .unwrap();
    shard_batch(dir, name, &batch)
}

fn mixture(sources: &[(String, f64)]) -> MixtureBuilder {
    Loader::builder_mixture(sources.iter().map(|(u, w)| (u.clone(), *w)))
        .seed(5)
        .configure(|b| b.decode_threads(2))
}

/// Per batch: the `source` column (unpacked mixtures).
fn sources_of(batch: &Batch) -> Vec<i32> {
    batch.values::<i32>("source").unwrap().to_vec()
}

/// A packed batch's buffers, owned.
#[derive(Clone, Debug, PartialEq)]
struct Packed {
    ids: Vec<i32>,
    pos: Vec<i32>,
    seg: Vec<i32>,
    cu: Vec<i32>,
    src: Vec<i32>,
}

fn packed(batch: &Batch) -> Packed {
    Packed {
        ids: batch.values::<i32>("input_ids").unwrap().to_vec(),
        pos: batch.values::<i32>("position_ids").unwrap().to_vec(),
        seg: batch.values::<i32>("segment_ids").unwrap().to_vec(),
        cu: batch.values::<i32>("cu_seqlens").unwrap().to_vec(),
        src: batch.values::<i32>("source").unwrap().to_vec(),
    }
}

/// Every token of a packed batch is where its document and offset say, and
/// the segment buffers agree with each other.
fn check_packed(b: &Packed, l: usize, pad: i32) {
    assert_eq!(*b.cu.last().unwrap() as usize, b.ids.len());
    for (k, w) in b.cu.windows(2).enumerate() {
        let (a, z) = (w[0] as usize, w[1] as usize);
        assert!(
            a < z && a / l == (z - 1) / l,
            "segment {a}..{z} within one row"
        );
        if b.seg[a] == 0 {
            assert!(b.ids[a..z].iter().all(|&t| t == pad));
            assert_eq!(b.src[k], -1);
            continue;
        }
        for i in a..z {
            let (s, _, t) = decode(b.ids[i]);
            assert_eq!(s as i32, b.src[k], "the segment's source");
            assert_eq!(
                t as i32, b.pos[i],
                "position_ids is the offset in the document"
            );
            assert_eq!(b.seg[i], b.seg[a]);
        }
        let prev = if a % l == 0 { 0 } else { b.seg[a - 1] };
        assert_eq!(b.seg[a], prev + 1, "segment ids count the row's documents");
    }
}

#[test]
fn shares_hold_in_every_window_and_each_source_epoch_has_every_row_once() {
    let tmp = tempdir();
    let web = token_source(tmp.path(), "web", 0, 900, 4);
    let code = token_source(tmp.path(), "code", 1, 500, 4);
    let math = token_source(tmp.path(), "math", 2, 170, 4);
    for weights in [vec![0.6, 0.3, 0.1], vec![0.98, 0.02]] {
        let urls = [&web, &code, &math];
        let sources: Vec<(String, f64)> = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| (urls[i].clone(), w))
            .collect();
        let mut m = mixture(&sources)
            .batch_size(100)
            .mix_stop(MixStop::Never)
            .build()
            .unwrap();
        let (mut order, mut ids) = (vec![], vec![]);
        while order.len() < 30_000 {
            let b = m.next().unwrap().unwrap();
            order.extend(sources_of(&b));
            ids.extend_from_slice(b.values::<i64>("id").unwrap());
        }
        // Shares within 0.2 percentage points over any 10,000 consecutive rows.
        let window = 10_000;
        for (s, w) in weights.iter().enumerate() {
            let mut prefix = vec![0i64];
            for &o in &order {
                prefix.push(prefix.last().unwrap() + i64::from(o == s as i32));
            }
            for start in 0..=order.len() - window {
                let share = (prefix[start + window] - prefix[start]) as f64 / window as f64;
                assert!(
                    (share - w).abs() <= 0.002,
                    "weights {weights:?}: source {s} has share {share} in rows {start}..+{window}"
                );
            }
        }
        // Each source epoch is a permutation of the source's rows.
        for (s, total) in [(0usize, 900usize), (1, 500), (2, 170)]
            .iter()
            .take(weights.len())
        {
            let drawn: Vec<i64> = order
                .iter()
                .zip(&ids)
                .filter(|(o, _)| **o == *s as i32)
                .map(|(_, &id)| id)
                .collect();
            let full = drawn.len() / total;
            assert!(full >= 1 || *s == 1, "source {s} completed an epoch");
            for e in 0..full {
                let mut epoch: Vec<i64> = drawn[e * total..(e + 1) * total].to_vec();
                epoch.sort_unstable();
                assert_eq!(
                    epoch,
                    (0..*total as i64).collect::<Vec<_>>(),
                    "source {s} epoch {e}"
                );
            }
        }
    }
}

/// Columns named in another order than the sources' schema (`input_ids`
/// before `id`): every source's batches hold them in the order given, so
/// rows are laid out column for column (the other sources were given source
/// 0's schema order, and the mixture refused its first batch as "collated
/// differently by two sources").
#[test]
fn columns_given_out_of_schema_order_mix_column_for_column() {
    let tmp = tempdir();
    let web = token_source(tmp.path(), "web", 0, 300, 6);
    let code = token_source(tmp.path(), "code", 1, 200, 6);
    let m = mixture(&[(web, 0.5), (code, 0.5)])
        .columns(["input_ids", "id"])
        .batch_size(32)
        .build()
        .unwrap();
    let mut rows = 0;
    for b in m {
        let b = b.unwrap();
        let names: Vec<&str> = b.columns().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["input_ids", "id", "source"]);
        let (ids, sources) = (b.values::<i64>("id").unwrap(), sources_of(&b));
        let (offsets, tokens) = (
            b.offsets("input_ids").unwrap(),
            b.values::<i32>("input_ids").unwrap(),
        );
        for (r, (&id, &source)) in ids.iter().zip(&sources).enumerate() {
            let doc = &tokens[offsets[r] as usize..offsets[r + 1] as usize];
            let len = doc_len(source as usize, id as u64, 6);
            assert_eq!(doc.len() as u64, len, "row {r}");
            for (t, &tok) in doc.iter().enumerate() {
                assert_eq!(decode(tok), (source as usize, id as u64, t as u64));
            }
        }
        rows += ids.len();
    }
    assert!(rows >= 300, "{rows} rows");
}

#[test]
fn first_exhausted_ends_the_epoch_and_set_weights_applies_from_the_next_batch() {
    let tmp = tempdir();
    let a = token_source(tmp.path(), "a", 0, 400, 3);
    let b = token_source(tmp.path(), "b", 1, 100, 3);
    let sources = vec![(a, 0.5), (b, 0.5)];
    let build = || {
        mixture(&sources)
            .batch_size(20)
            .drop_last(false)
            .build()
            .unwrap()
    };
    let mut m = build();
    // first_exhausted: b's 100 rows run out after about 200 rows.
    let rows: usize = m.by_ref().map(|b| b.unwrap().rows()).sum();
    assert!((199..=201).contains(&rows), "epoch of {rows} rows");
    assert_eq!(m.epoch(), 1);
    // The next epoch: a continues where it was, b starts its next epoch;
    // len() simulates the blending.
    let expected = m.len().unwrap();
    let batches = m.by_ref().inspect(|b| assert!(b.is_ok())).count() as u64;
    assert_eq!(batches, expected);

    // set_weights: the next batch follows the new shares exactly.
    let mut m = build();
    let mut before = vec![];
    for _ in 0..3 {
        before.push(sources_of(&m.next().unwrap().unwrap()));
    }
    m.set_weights(&[0.9, 0.1]).unwrap();
    let saved = m.state();
    assert_eq!(saved.weights, vec![0.9, 0.1]);
    let after: Vec<Vec<i32>> = (0..4)
        .map(|_| sources_of(&m.next().unwrap().unwrap()))
        .collect();
    let ones: usize = after.iter().flatten().filter(|&&s| s == 1).count();
    assert_eq!(ones, 8, "0.1 of the 80 rows after set_weights");
    // Resume after set_weights is exact.
    let mut resumed = build();
    resumed
        .resume(&MixtureState::from_json(&saved.to_json()).unwrap())
        .unwrap();
    let again: Vec<Vec<i32>> = (0..4)
        .map(|_| sources_of(&resumed.next().unwrap().unwrap()))
        .collect();
    assert_eq!(again, after);
}

/// Reassemble documents from packed batches (split mode): the pieces of a
/// document follow each other in the stream.
fn documents(batches: &[Packed]) -> Vec<(usize, u64, Vec<u64>)> {
    let mut docs: Vec<(usize, u64, Vec<u64>)> = vec![];
    for b in batches {
        for (i, &t) in b.ids.iter().enumerate() {
            if b.seg[i] == 0 {
                continue;
            }
            let (s, d, off) = decode(t);
            match docs.last_mut() {
                Some(last) if last.0 == s && last.1 == d && b.pos[i] != 0 => last.2.push(off),
                _ => docs.push((s, d, vec![off])),
            }
        }
    }
    docs
}

#[test]
fn split_packing_keeps_every_token_of_every_document_once_in_order() {
    let tmp = tempdir();
    let l = 64;
    let urls: Vec<String> = (0..3)
        .map(|s| {
            token_source(
                tmp.path(),
                &format!("s{s}"),
                s,
                [300, 200, 90][s],
                3 * l as u64,
            )
        })
        .collect();
    let sources: Vec<(String, f64)> = urls.into_iter().zip([0.6, 0.3, 0.1]).collect();
    let mut m = mixture(&sources)
        .batch_size(4)
        .pack_to(l)
        .drop_last(false)
        .mix_stop(MixStop::AllExhausted)
        .build()
        .unwrap();
    let batches: Vec<Packed> = m.by_ref().map(|b| packed(&b.unwrap())).collect();
    let stats = m.stats();
    assert!(batches.len() > 10);
    // The packer read the documents where they were decoded (the sources
    // handed their rows on uncollated).
    for (s, source) in stats.sources.iter().enumerate() {
        assert!(source.handoff_batches > 0, "source {s}: {source:?}");
    }
    for b in &batches {
        check_packed(b, l, 0);
    }
    // Only the epoch's last row is padded.
    let pads: usize = batches
        .iter()
        .map(|b| b.seg.iter().filter(|&&s| s == 0).count())
        .sum();
    assert!(pads < l);
    let docs = documents(&batches);
    assert_eq!(docs.len() as u64, stats.documents.iter().sum::<u64>());
    let mut seen: HashMap<(usize, u64), u32> = HashMap::new();
    for (s, d, offsets) in &docs {
        let n = doc_len(*s, *d, 3 * l as u64);
        assert_eq!(
            offsets,
            &(0..n).collect::<Vec<_>>(),
            "document {d} of source {s}: every token once, in order"
        );
        *seen.entry((*s, *d)).or_default() += 1;
    }
    // all_exhausted: every source's every document at least once, the
    // smaller sources' repeats only after a whole epoch.
    for (s, n) in [(0, 300u64), (1, 200), (2, 90)] {
        for d in 0..n {
            assert!(
                seen.get(&(s, d)).copied().unwrap_or(0) >= 1,
                "source {s} doc {d}"
            );
        }
    }
}

/// The sources hand their rows to the packer as they lie in the decoded
/// row groups; collated into slabs first (every batch, or one), the packed
/// batches are the same, in split and fit mode.
#[test]
fn packing_from_decoded_rows_equals_packing_from_collated_batches() {
    let tmp = tempdir();
    let l = 48;
    let urls: Vec<String> = (0..2)
        .map(|s| token_source(tmp.path(), &format!("s{s}"), s, [240, 120][s], 3 * l as u64))
        .collect();
    let sources: Vec<(String, f64)> = urls.into_iter().zip([0.7, 0.3]).collect();
    for mode in [PackMode::Split, PackMode::Fit] {
        let run = |failpoints: &str| {
            let failpoints = failpoints.to_string();
            let mut m = mixture(&sources)
                .configure(move |b| match failpoints.as_str() {
                    "" => b,
                    spec => b.failpoints(spec),
                })
                .batch_size(3)
                .pack_to(l)
                .pack_mode(mode)
                .drop_last(false)
                .mix_stop(MixStop::AllExhausted)
                .build()
                .unwrap();
            let batches: Vec<Packed> = m.by_ref().map(|b| packed(&b.unwrap())).collect();
            let handed: Vec<u64> = m
                .stats()
                .sources
                .iter()
                .map(|s| s.handoff_batches)
                .collect();
            (batches, handed)
        };
        let (handed_on, counts) = run("");
        assert!(handed_on.len() > 10, "{mode:?}");
        assert!(counts.iter().all(|&n| n > 0), "{mode:?}: {counts:?}");
        let (collated, counts) = run("handoff=stop");
        assert_eq!(counts, vec![0, 0], "{mode:?}");
        assert_eq!(handed_on, collated, "{mode:?}: every batch collated");
        let (mixed, counts) = run("handoff=stop@1");
        assert!(counts.iter().all(|&n| n > 0), "{mode:?}: {counts:?}");
        assert_eq!(
            handed_on, mixed,
            "{mode:?}: batch 1 of each source collated"
        );
    }
}

#[test]
fn fit_packing_pads_little_and_never_splits_a_short_document() {
    let tmp = tempdir();
    let url = sharded(
        tmp.path(),
        shardfeed_fixtures::Kind::Tokens,
        2500,
        64,
        4 << 20,
    );
    let l = 4096;
    let mut m = mixture(&[(url, 1.0)])
        .batch_size(8)
        .pack_to(l)
        .pack_mode(PackMode::Fit)
        .pack_window(1000)
        .max_segments(Some(16))
        .drop_last(false)
        .build()
        .unwrap();
    let mut docs = 0;
    for b in m.by_ref() {
        let b = packed(&b.unwrap());
        for w in b.cu.windows(2) {
            let (a, z) = (w[0] as usize, w[1] as usize);
            assert_eq!(a / l, (z - 1) / l);
            if b.seg[a] != 0 {
                assert_eq!(
                    b.pos[a], 0,
                    "a document shorter than a row starts its segment"
                );
                assert!(b.seg[a] <= 16, "max_segments");
                docs += 1;
            }
        }
    }
    let stats = m.stats();
    assert_eq!(
        docs, 2500,
        "every document once, none split (all are at most 4096)"
    );
    let padding = stats.padding_tokens as f64 / stats.tokens as f64;
    eprintln!("fit padding {padding}");
    assert!(
        padding < 0.03,
        "fit mode padded {:.2}% of tokens",
        100.0 * padding
    );
}

/// Batches `from..to` of a packed mixture, as owned buffers; the weights
/// change to 0.2/0.3/0.5 before batch `reweigh_at`.
fn run(m: &mut Mixture, from: usize, to: usize, reweigh_at: usize) -> Vec<Packed> {
    (from..to)
        .map(|i| {
            if i == reweigh_at {
                m.set_weights(&[0.2, 0.3, 0.5]).unwrap();
            }
            packed(&m.next().unwrap().unwrap())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Stop after a random number of batches, save, resume in a fresh
    /// mixture: the concatenation equals the uninterrupted run, per rank,
    /// with the weights changed at a random batch before or after the stop.
    #[test]
    fn resume_with_mixing_and_packing_is_exact(
        stop in 1usize..30,
        reweigh_at in 0usize..40,
        world in 1u64..=3,
        fit: bool,
    ) {
        let tmp = tempdir();
        let urls: Vec<String> = (0..3)
            .map(|s| token_source(tmp.path(), &format!("s{s}"), s, 120, 100))
            .collect();
        let sources: Vec<(String, f64)> = urls.into_iter().zip([0.5, 0.3, 0.2]).collect();
        let total = 40;
        for rank in 0..world {
            let build = || {
                let b = mixture(&sources)
                    .batch_size(3)
                    .pack_to(32)
                    .eos_id(Some(7))
                    .mix_stop(MixStop::Never)
                    .rank(rank)
                    .world_size(world);
                let b = if fit { b.pack_mode(PackMode::Fit).pack_window(17) } else { b };
                b.build().unwrap()
            };
            let whole = run(&mut build(), 0, total, reweigh_at);
            let mut first = build();
            let mut parts = run(&mut first, 0, stop, reweigh_at);
            let state = MixtureState::from_json(&first.state().to_json()).unwrap();
            prop_assert!(state.to_json().len() < 4096);
            drop(first);
            let mut second = build();
            second.resume(&state).unwrap();
            parts.extend(run(&mut second, stop, total, reweigh_at));
            prop_assert_eq!(&parts, &whole, "rank {} of {}", rank, world);
        }
    }
}

#[test]
fn a_state_of_other_datasets_or_weights_is_refused_naming_the_change() {
    let tmp = tempdir();
    let a = token_source(tmp.path(), "a", 0, 100, 5);
    let b = token_source(tmp.path(), "b", 1, 100, 5);
    let c = token_source(tmp.path(), "c", 2, 100, 5);
    let mut m = mixture(&[(a.clone(), 0.5), (b.clone(), 0.5)])
        .batch_size(10)
        .build()
        .unwrap();
    m.next().unwrap().unwrap();
    let state = m.state();

    let mut other = mixture(&[(a.clone(), 0.5), (c.clone(), 0.5)])
        .batch_size(10)
        .build()
        .unwrap();
    let err = other.resume(&state).unwrap_err().to_string();
    assert!(err.contains("source 1") && err.contains("dataset"), "{err}");
    assert!(err.contains("allow_changed"), "{err}");
    let mut reweighted = mixture(&[(a.clone(), 0.7), (b.clone(), 0.3)])
        .batch_size(10)
        .build()
        .unwrap();
    let err = reweighted.resume(&state).unwrap_err().to_string();
    assert!(err.contains("weight 0.5 in the state but 0.7"), "{err}");

    // allow_changed: the unchanged source continues, the new one starts afresh.
    other.resume_changed(&state).unwrap();
    let saved = other.state();
    assert_eq!(saved.draw.sources[0].1, state.draw.sources[0].1);
    assert_eq!(saved.draw.sources[1], (0, 0, false));

    // A state file is untrusted: a pack window larger than pack_window, or a
    // weight that is not a share, is refused.
    let mut fit = mixture(&[(a.clone(), 0.5), (b.clone(), 0.5)])
        .batch_size(2)
        .pack_to(16)
        .pack_mode(PackMode::Fit)
        .pack_window(5)
        .mix_stop(MixStop::Never)
        .build()
        .unwrap();
    let mut forged = fit.state();
    forged.window = Some(shardfeed_loader::FitState {
        previous: 1 << 40,
        deferred: vec![],
        emitted: 0,
    });
    let err = fit.resume(&forged).unwrap_err().to_string();
    assert!(err.contains("pack_window"), "{err}");
    let mut forged = fit.state();
    forged.draw.weights = vec![f64::NAN, 1.0];
    let err = fit.resume(&forged).unwrap_err().to_string();
    assert!(err.contains("weight"), "{err}");
    assert!(
        fit.next().unwrap().is_ok(),
        "the mixture goes on after a refusal"
    );

    // Mismatched columns name the source and column.
    let plain = sharded(tmp.path(), shardfeed_fixtures::Kind::Text, 50, 10, 1 << 20);
    let err = mixture(&[(a, 0.5), (plain, 0.5)])
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mixture source 1") && err.contains("input_ids"),
        "{err}"
    );
}

/// The `input_ids` of the next `n` batches of `m`.
fn next_ids(m: &mut Mixture, n: usize) -> Vec<Vec<i32>> {
    (0..n)
        .map(|_| {
            let batch = m.next().unwrap().unwrap();
            batch.values::<i32>("input_ids").unwrap().to_vec()
        })
        .collect()
}

/// A source's order follows its shuffle window, and the window follows the
/// byte budget the sources share: a state is resumed only by sources read in
/// the windows it was saved with (a mixture built with another budget would
/// otherwise go on in another order, reading some rows twice and some not at
/// all). States saved before windows were recorded were read in one
/// loader's default windows, and are checked against those.
#[test]
fn a_state_saved_with_other_shuffle_windows_is_refused_naming_them() {
    let tmp = tempdir();
    let a = token_source(tmp.path(), "a", 0, 200, 5);
    let b = token_source(tmp.path(), "b", 1, 200, 5);
    let build = |window: usize| {
        mixture(&[(a.clone(), 0.5), (b.clone(), 0.5)])
            .batch_size(10)
            .configure(move |l| l.window(window))
            .build()
            .unwrap()
    };
    let mut m = build(2);
    for _ in 0..3 {
        m.next().unwrap().unwrap();
    }
    let state = m.state();
    assert_eq!(state.sources[1].window, Some(2));
    let after = next_ids(&mut m, 4);

    let mut wider = build(3);
    let err = wider.resume(&state).unwrap_err().to_string();
    assert!(
        err.contains("source 0")
            && err.contains("windows of 2 row groups")
            && err.contains("but 3 here"),
        "{err}"
    );
    let err = wider.resume_changed(&state).unwrap_err().to_string();
    assert!(err.contains("windows of 2"), "{err}");
    assert!(
        wider.next().unwrap().is_ok(),
        "the mixture goes on after a refusal"
    );

    let mut same = build(2);
    same.resume(&state).unwrap();
    let again = next_ids(&mut same, 4);
    assert_eq!(again, after, "the same windows continue exactly");

    // A state from before windows were recorded, resumed by a mixture
    // given a window: taken as read in it.
    let mut old = state.clone();
    for s in &mut old.sources {
        (s.window, s.part_rows) = (None, None);
    }
    let text = old.to_json();
    assert!(!text.contains("part_rows"), "{text}");
    let mut old_same = build(2);
    old_same
        .resume(&MixtureState::from_json(&text).unwrap())
        .unwrap();
    assert_eq!(next_ids(&mut old_same, 4), after);
}

/// A mixture's sources shuffled at shard time share the default window's
/// row groups by weight (holding about what one loader holds); a state
/// saved with other windows (each source its own) is resumed by a builder
/// that adopts them, and a state that recorded none was read in the
/// default window of one loader (8), which a default mixture refuses by
/// name and a rebuilt one adopts.
#[test]
fn sources_share_the_default_window_by_weight_and_states_keep_theirs() {
    use shardfeed_loader::{FeedBuilder, FeedState};
    let tmp = tempdir();
    let a = token_source(tmp.path(), "a", 0, 400, 5);
    let b = token_source(tmp.path(), "b", 1, 400, 5);
    let build = |weights: [f64; 2], window: Option<usize>| {
        mixture(&[(a.clone(), weights[0]), (b.clone(), weights[1])])
            .batch_size(10)
            .mix_stop(MixStop::Never)
            .configure(move |l| match window {
                Some(w) => l.window(w),
                None => l,
            })
    };
    let windows = |m: &Mixture| -> Vec<Option<usize>> {
        m.state().sources.iter().map(|s| s.window).collect()
    };
    let mut m = build([0.7, 0.3], None).build().unwrap();
    assert_eq!(windows(&m), [Some(6), Some(2)]);
    assert_eq!(
        windows(&build([0.5, 0.5], None).build().unwrap()),
        [Some(4), Some(4)]
    );
    assert_eq!(
        windows(&build([0.99, 0.01], None).build().unwrap()),
        [Some(8), Some(2)]
    );
    // Sources that hand their rows on uncollated (one list column) hold
    // about a window more: their share is of two thirds of the default.
    let mut handing = build([0.7, 0.3], None)
        .configure(|l| l.columns(["input_ids"]))
        .build()
        .unwrap();
    assert_eq!(windows(&handing), [Some(4), Some(2)]);
    handing.next().unwrap().unwrap();
    assert!(
        handing
            .stats()
            .sources
            .iter()
            .all(|s| s.handoff_batches > 0)
    );
    for _ in 0..5 {
        m.next().unwrap().unwrap();
    }
    let state = m.state();
    let after = next_ids(&mut m, 6);

    // Reweighted, whose default windows are 4 and 4: refused, or rebuilt
    // with the state's 6 and 2, which continue each source where it was.
    let reweighted = build([0.5, 0.5], None);
    let err = reweighted
        .clone()
        .build()
        .unwrap()
        .resume_changed(&state)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("windows of 6 row groups") && err.contains("but 4 here"),
        "{err}"
    );
    let saved = [FeedState::Mixture(Box::new(state.clone()))];
    let adopted = FeedBuilder::Mixture(reweighted)
        .with_order_of(&saved)
        .expect("windows left to the budget adopt the state's");
    let mut fresh = adopted.build().unwrap();
    fresh.restore(&saved, true).unwrap();
    let FeedState::Mixture(now) = fresh.save() else {
        panic!("a mixture's state")
    };
    let now: Vec<_> = now.sources.iter().map(|s| s.window).collect();
    assert_eq!(now, [Some(6), Some(2)]);

    // The state of a mixture saved before windows were recorded (each
    // source then read in windows of 8).
    let mut eight = build([0.7, 0.3], Some(8)).build().unwrap();
    for _ in 0..5 {
        eight.next().unwrap().unwrap();
    }
    let mut old = eight.state();
    let expected = next_ids(&mut eight, 6);
    assert_ne!(expected, after, "windows of 8 read another order");
    for s in &mut old.sources {
        (s.window, s.part_rows) = (None, None);
    }
    let text = old.to_json();
    let err = build([0.7, 0.3], None)
        .build()
        .unwrap()
        .resume(&MixtureState::from_json(&text).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("windows of 8 row groups") && err.contains("but 6 here"),
        "{err}"
    );
    let default = FeedBuilder::Mixture(build([0.7, 0.3], None));
    let parsed = [default.build().unwrap().parse_state(&text).unwrap()];
    let mut rebuilt = default.with_order_of(&parsed).unwrap().build().unwrap();
    rebuilt.restore(&parsed, false).unwrap();
    let ids: Vec<Vec<i32>> = (0..6)
        .map(|_| {
            let batch = rebuilt.next_batch(&mut || false).unwrap().unwrap();
            batch.values::<i32>("input_ids").unwrap().to_vec()
        })
        .collect();
    assert_eq!(ids, expected, "read on in windows of 8");
}

/// Run `old` ranks for `steps` batches each, save, then resume on `new`
/// ranks from all the saved states and run them to the end of the mixture
/// epoch. Across both runs: no token twice, every document seen whole and
/// in order (but the few of the remainder), the exhausted source's every
/// document (but the remainder), and reads even over the new ranks.
fn elastic(old: u64, new: u64, steps: usize) {
    let tmp = tempdir();
    let l = 48;
    let sizes = [900u64, 500, 260];
    let urls: Vec<String> = (0..3)
        .map(|s| token_source(tmp.path(), &format!("s{s}"), s, sizes[s], 2 * l as u64))
        .collect();
    let sources: Vec<(String, f64)> = urls.into_iter().zip([0.5, 0.3, 0.2]).collect();
    let build = |rank, world| {
        // Small windows: a share of the rest holds many of them, as on real
        // data (a piece's first and last windows are read whole).
        mixture(&sources)
            .configure(|b| b.window(2))
            .batch_size(2)
            .pack_to(l)
            .eos_id(Some(-1))
            .drop_last(false)
            .rank(rank)
            .world_size(world)
            .build()
            .unwrap()
    };
    let mut tokens: Vec<(usize, u64, u64)> = Vec::new();
    let mut take = |b: &Packed| {
        for (i, &t) in b.ids.iter().enumerate() {
            if b.seg[i] != 0 && t != -1 {
                tokens.push(decode(t));
            }
        }
    };
    let mut states = Vec::new();
    for rank in 0..old {
        let mut m = build(rank, old);
        for _ in 0..steps {
            take(&packed(&m.next().unwrap().unwrap()));
        }
        states.push(MixtureState::from_json(&m.state().to_json()).unwrap());
    }
    let mut fetched = Vec::new();
    for rank in 0..new {
        let mut m = build(rank, new);
        m.resume_elastic(&states).unwrap();
        // What the plan reads (row groups are fetched whole): measured on the
        // plan, since fetched bytes also count how far the next epoch was
        // read ahead, which depends on timing.
        fetched.push(m.elastic_rows().unwrap().iter().sum::<u64>());
        let batches: Vec<Packed> = m.by_ref().map(|b| packed(&b.unwrap())).collect();
        batches.iter().for_each(&mut take);
        if rank == 0 {
            // A state saved after the elastic resume resumes exactly too.
            let mut m = build(rank, new);
            m.resume_elastic(&states).unwrap();
            let cut = batches.len() / 2;
            let mut again: Vec<Packed> = (0..cut)
                .map(|_| packed(&m.next().unwrap().unwrap()))
                .collect();
            let state = MixtureState::from_json(&m.state().to_json()).unwrap();
            assert!(state.to_json().len() < 4096, "{}", state.to_json().len());
            let mut m = build(rank, new);
            m.resume(&state).unwrap();
            again.extend(m.by_ref().map(|b| packed(&b.unwrap())));
            assert_eq!(
                again, batches,
                "{old} -> {new}: resuming after the elastic resume"
            );
        }
    }
    // No token twice.
    let mut sorted = tokens.clone();
    sorted.sort_unstable();
    let before = sorted.len();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        before,
        "{old} -> {new}: a token was read twice"
    );
    // Documents: whole, but a few (the remainder: fewer than `new` rows per
    // source, and documents whose start was read before the resume and whose
    // rest fell in it).
    let mut docs: HashMap<(usize, u64), Vec<u64>> = HashMap::new();
    for (s, d, t) in sorted {
        docs.entry((s, d)).or_default().push(t);
    }
    let partial = docs
        .iter()
        .filter(|((s, d), offsets)| offsets.len() as u64 != doc_len(*s, *d, 2 * l as u64))
        .count();
    assert!(
        partial <= old as usize * 3,
        "{old} -> {new}: {partial} documents partly read"
    );
    // Some source ran out: all its documents but the remainder were read.
    let complete = (0..3)
        .map(|s| {
            (0..sizes[s])
                .filter(|d| docs.contains_key(&(s, *d)))
                .count() as u64
        })
        .zip(sizes)
        .any(|(seen, n)| seen + 3 * (old + new) >= n);
    assert!(complete, "{old} -> {new}: no source was read to its end");
    let mean = fetched.iter().sum::<u64>() as f64 / new as f64;
    eprintln!("{old} -> {new}: rows read per new rank {fetched:?}");
    for (rank, f) in fetched.iter().enumerate() {
        let ratio = *f as f64 / mean;
        assert!(
            (0.85..=1.15).contains(&ratio),
            "{old} -> {new}: new rank {rank} reads row groups of {f} rows, {ratio:.2} of an even share {fetched:?}"
        );
    }
}

#[test]
fn elastic_resume_splits_the_rest_of_the_epoch_over_the_new_ranks() {
    elastic(4, 2, 25);
    elastic(2, 3, 40);
    elastic(8, 5, 12);
}

/// The mixture's thread: a wait gives up when the caller is interrupted
/// (and the next call waits again), dropping a mixture whose sources are
/// stuck returns, and a source's failure reaches `next()` naming the source,
/// the stage and the shard.
#[test]
fn waits_are_interruptible_and_failures_name_the_source() {
    let tmp = tempdir();
    let a = token_source(tmp.path(), "a", 0, 100, 5);
    let b = token_source(tmp.path(), "b", 1, 100, 5);
    let sources = [(a, 0.5), (b, 0.5)];
    let mut stuck = mixture(&sources)
        .configure(|c| c.failpoints("fetch=block"))
        .batch_size(4)
        .pack_to(8)
        .build()
        .unwrap();
    let mut polls = 0;
    let waited = stuck.next_interruptible(|| {
        polls += 1;
        polls > 3
    });
    assert!(
        matches!(waited, Some(Err(LoaderError::Interrupted))),
        "{waited:?}"
    );
    assert!(matches!(
        stuck.next_interruptible(|| true),
        Some(Err(LoaderError::Interrupted))
    ));
    drop(stuck); // joins the mixture's thread and every source's: returns

    let mut failing = mixture(&sources)
        .configure(|c| c.failpoints("decode=error@1"))
        .batch_size(4)
        .pack_to(8)
        .build()
        .unwrap();
    let err = failing
        .by_ref()
        .find_map(|b| b.err())
        .expect("the injected failure surfaces")
        .to_string();
    assert!(
        err.contains("mixture source") && err.contains("decode") && err.contains("shard"),
        "{err}"
    );
}

/// Eight sources: the state stays under 4 KB, after an elastic resume too.
#[test]
fn a_state_of_eight_sources_stays_under_4_kb() {
    let tmp = tempdir();
    let urls: Vec<String> = (0..3)
        .map(|s| token_source(tmp.path(), &format!("a-longer-source-name-{s}"), s, 200, 40))
        .collect();
    let sources: Vec<(String, f64)> = (0..8)
        .map(|i| (urls[i % 3].clone(), 1.0 + i as f64))
        .collect();
    let build = |rank, world| {
        mixture(&sources)
            .batch_size(4)
            .pack_to(32)
            .mix_stop(MixStop::Never)
            .rank(rank)
            .world_size(world)
            .build()
            .unwrap()
    };
    let states: Vec<MixtureState> = (0..4)
        .map(|rank| {
            let mut m = build(rank, 4);
            for _ in 0..7 {
                m.next().unwrap().unwrap();
            }
            m.state()
        })
        .collect();
    for s in &states {
        assert!(s.to_json().len() < 4096, "{} bytes", s.to_json().len());
    }
    let mut m = build(1, 3);
    m.resume_elastic(&states).unwrap();
    m.next().unwrap().unwrap();
    let after = m.state().to_json();
    eprintln!(
        "8 sources: {} bytes; {} after an elastic resume",
        states[0].to_json().len(),
        after.len()
    );
    assert!(
        after.len() < 4096,
        "{} bytes after an elastic resume",
        after.len()
    );
}

/// Fit mode: a state taken when the current pack window has emitted all its
/// rows but deferred documents to the next one still resumes exactly (the
/// state names the window so that they are drawn again). A case the
/// proptest above found.
#[test]
fn fit_resume_keeps_the_documents_a_finished_window_deferred() {
    let tmp = tempdir();
    let urls: Vec<String> = (0..3)
        .map(|s| token_source(tmp.path(), &format!("s{s}"), s, 120, 100))
        .collect();
    let sources: Vec<(String, f64)> = urls.into_iter().zip([0.5, 0.3, 0.2]).collect();
    let (stop, reweigh_at, total) = (12, 7, 40);
    let build = || {
        mixture(&sources)
            .batch_size(3)
            .pack_to(32)
            .eos_id(Some(7))
            .mix_stop(MixStop::Never)
            .rank(2)
            .world_size(3)
            .pack_mode(PackMode::Fit)
            .pack_window(17)
            .build()
            .unwrap()
    };
    let whole = run(&mut build(), 0, total, reweigh_at);
    let mut first = build();
    let mut parts = run(&mut first, 0, stop, reweigh_at);
    let state = MixtureState::from_json(&first.state().to_json()).unwrap();
    assert!(state.window.is_some(), "the state names the window");
    drop(first);
    let mut second = build();
    second.resume(&state).unwrap();
    parts.extend(run(&mut second, stop, total, reweigh_at));
    assert_eq!(parts, whole);
}

/// A state's blending counts are checked against its weights: counts that
/// do not add up to the rows drawn, or that sit far from a source's share
/// (which would starve the other sources until they caught up), are
/// refused; the counts a real run saves, at every step, resume.
#[test]
fn forged_blending_counts_are_refused() {
    let tmp = tempdir();
    let a = token_source(tmp.path(), "a", 0, 300, 8);
    let b = token_source(tmp.path(), "b", 1, 300, 8);
    let build = || {
        mixture(&[(a.clone(), 3.0), (b.clone(), 1.0)])
            .batch_size(8)
            .build()
            .unwrap()
    };
    let mut m = build();
    let mut states = Vec::new();
    for _ in 0..30 {
        m.next().unwrap().unwrap();
        states.push(m.state());
    }
    for state in &states {
        build().resume(state).unwrap();
    }
    let good = states.last().unwrap().clone();
    let drawn = good.draw.drawn;
    for counts in [
        vec![drawn, 0],
        vec![0, drawn],
        vec![drawn, 1],
        vec![u64::MAX, 2],
    ] {
        let mut forged = good.clone();
        forged.draw.counts = counts.clone();
        let err = build().resume(&forged).unwrap_err();
        assert!(
            matches!(err, LoaderError::BadState { .. }) && err.to_string().contains("counts"),
            "{counts:?}: {err}"
        );
    }
}

/// A packed batch's slabs answer to the byte budget: `batch_size` x
/// `pack_to` whose eight slabs are past four times the budget is refused
/// naming `pack_to`, before any slab is allocated.
#[test]
fn pack_to_past_the_byte_budget_is_refused() {
    let tmp = tempdir();
    let a = token_source(tmp.path(), "a", 0, 50, 8);
    let Err(err) = mixture(&[(a.clone(), 1.0)])
        .batch_size(8)
        .pack_to(1 << 26)
        .build()
    else {
        panic!("pack_to past the byte budget was accepted");
    };
    assert!(
        matches!(
            err,
            LoaderError::BadOption {
                option: "pack_to",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("byte budget"), "{err}");
    // Within the budget it builds.
    mixture(&[(a, 1.0)])
        .batch_size(8)
        .pack_to(4096)
        .build()
        .unwrap();
}

/// `batch` written and sharded into `dir/name` (row groups of 16 rows over
/// several shards); returns the URL.
fn shard_batch(dir: &Path, name: &str, batch: &RecordBatch) -> String {
    let input = dir.join(format!("{name}.parquet"));
    write_parquet(&input, batch);
    let out = dir.join(name);
    let options = shardfeed_preprocess::ShardOptions::default()
        .with_row_group_rows(16)
        .with_shard_size(16 << 10);
    shardfeed_preprocess::shard(&[s(&input)], &s(&out), &options).unwrap();
    s(&out)
}

/// A source with a nullable text column beside its token lists (every
/// fifth text null).
fn text_source(dir: &Path, name: &str, source: usize, docs: u64) -> String {
    let mut ids = ListBuilder::new(Int32Builder::new());
    let mut text = StringBuilder::new();
    let mut tags = ListBuilder::new(StringBuilder::new());
    for d in 0..docs {
        for k in 0..d % 4 {
            tags.values()
                .append_value(format!("t{k}").repeat((d % 3) as usize));
        }
        tags.append(true);
        for t in 0..doc_len(source, d, 9) {
            ids.values().append_value(token(source, d, t));
        }
        ids.append(true);
        if d % 5 == 4 {
            text.append_null();
        } else {
            text.append_value(format!("{source}:{d}:{}", "x".repeat((d % 7) as usize)));
        }
    }
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..docs as i64)) as ArrayRef,
        ),
        ("input_ids", Arc::new(ids.finish()) as ArrayRef),
        ("text", Arc::new(text.finish()) as ArrayRef),
        ("tags", Arc::new(tags.finish()) as ArrayRef),
    ])
    .unwrap();
    shard_batch(dir, name, &batch)
}

/// A mixture batch's rows: (source, id, tokens, text, tags), whatever the
/// layout.
type MixRow = (i32, i64, Vec<i32>, Option<String>, Vec<Vec<u8>>);

fn mix_rows(b: &Batch) -> Vec<MixRow> {
    let ids = b.values::<i64>("id").unwrap();
    let tokens = b.values::<i32>("input_ids").unwrap();
    let texts: Vec<&[u8]> = b.binary("text").unwrap().collect();
    let valid = b.validity("text");
    let tags = b.binary_lists("tags").unwrap();
    (0..b.rows())
        .map(|r| {
            let row_tokens = match (b.offsets("input_ids"), b.lengths("input_ids")) {
                (Some(o), _) => tokens[o[r] as usize..o[r + 1] as usize].to_vec(),
                (None, Some(len)) => {
                    let width = tokens.len() / b.rows();
                    tokens[r * width..r * width + len[r] as usize].to_vec()
                }
                _ => panic!("input_ids is ragged or padded"),
            };
            let text = valid
                .is_none_or(|v| v[r] == 1)
                .then(|| String::from_utf8(texts[r].to_vec()).unwrap());
            let row_tags = tags[r].iter().map(|t| t.to_vec()).collect();
            (sources_of(b)[r], ids[r], row_tokens, text, row_tags)
        })
        .collect()
}

/// A mixture of `sources` in batches of 100 rows that never ends, its
/// sources' options set by `configure`.
fn endless_100(
    sources: &[(String, f64)],
    configure: impl FnOnce(shardfeed_loader::LoaderBuilder) -> shardfeed_loader::LoaderBuilder,
) -> Mixture {
    mixture(sources)
        .batch_size(100)
        .mix_stop(MixStop::Never)
        .configure(configure)
        .build()
        .unwrap()
}

#[test]
fn rows_copied_straight_from_the_sources_equal_rows_staged() {
    // With 8 batches collated ahead, a source keeps the few 64-row batches a
    // 100-row mixture batch draws from, and rows are copied once; with 1 it
    // may keep only one, and rows are staged (70 rows of the first source a
    // batch span two of its batches). The rows, their values (token lists
    // ragged and padded, strings, lists of strings) and their nulls are the
    // same each way.
    let tmp = tempdir();
    let a = text_source(tmp.path(), "a", 0, 700);
    let b = text_source(tmp.path(), "b", 1, 300);
    let sources = vec![(a, 0.7), (b, 0.3)];
    let run = |prefetch: usize, pad: bool| {
        let mut m = endless_100(&sources, |c| {
            let c = c.prefetch(prefetch);
            if pad { c.pad_to(9, 0.0) } else { c }
        });
        let mut rows = Vec::new();
        for _ in 0..25 {
            let batch = m.next().unwrap().unwrap();
            assert_eq!(batch.rows(), 100);
            rows.push(mix_rows(&batch));
        }
        (rows, m.stats().staged_batches)
    };
    let (direct, staged) = run(8, false);
    assert_eq!(staged, 0, "every batch copied straight from the sources");
    let nulls = direct.iter().flatten().filter(|r| r.3.is_none()).count();
    assert!(nulls > 0, "some texts are null");
    for (s, docs) in [(0, 700u64), (1, 300)] {
        for (_, id, tokens, text, tags) in direct.iter().flatten().filter(|r| r.0 == s) {
            let d = *id as u64;
            assert!(d < docs);
            let want: Vec<i32> = (0..doc_len(s as usize, d, 9))
                .map(|t| token(s as usize, d, t))
                .collect();
            assert_eq!(tokens, &want, "source {s} row {d}'s tokens");
            assert_eq!(text.is_none(), d % 5 == 4, "source {s} row {d}'s null");
            let want: Vec<Vec<u8>> = (0..d % 4)
                .map(|k| format!("t{k}").repeat((d % 3) as usize).into_bytes())
                .collect();
            assert_eq!(tags, &want, "source {s} row {d}'s tags");
        }
    }
    let (few, staged) = run(1, false);
    assert!(
        staged > 0,
        "rows staged when a source keeps too many batches"
    );
    assert_eq!(few, direct, "rows staged (few batches ahead)");
    let (padded, staged) = run(8, true);
    assert_eq!(staged, 0, "padded lists copied straight too");
    assert_eq!(padded, direct, "padded lists");
}

/// A source of one nullable `list<int32>` column: `docs` documents, every
/// seventh null.
fn nullable_token_source(dir: &Path, name: &str, source: usize, docs: u64) -> String {
    let mut ids = ListBuilder::new(Int32Builder::new());
    for d in 0..docs {
        if d % 7 == 3 {
            ids.append(false);
            continue;
        }
        for t in 0..doc_len(source, d, 40) {
            ids.values().append_value(token(source, d, t));
        }
        ids.append(true);
    }
    let batch =
        RecordBatch::try_from_iter([("input_ids", Arc::new(ids.finish()) as ArrayRef)]).unwrap();
    shard_batch(dir, name, &batch)
}

/// A mixture batch of one ragged list column: (source, tokens, valid) a row.
fn list_rows(b: &Batch) -> Vec<(i32, Vec<i32>, u8)> {
    let tokens = b.values::<i32>("input_ids").unwrap();
    let offsets = b.offsets("input_ids").unwrap();
    let valid = b
        .validity("input_ids")
        .expect("a nullable column has a mask");
    (0..b.rows())
        .map(|r| {
            let row = tokens[offsets[r] as usize..offsets[r + 1] as usize].to_vec();
            (sources_of(b)[r], row, valid[r])
        })
        .collect()
}

/// Sources of one list column hand their rows to the mixture as they lie in
/// the decoded row groups; the mixture's batches (values, offsets, nulls,
/// sources) are those of rows collated first, whether copied straight or
/// staged, and whether every batch, one or none was handed on.
#[test]
fn rows_read_where_they_were_decoded_equal_rows_collated() {
    let tmp = tempdir();
    let a = nullable_token_source(tmp.path(), "a", 0, 700);
    let b = nullable_token_source(tmp.path(), "b", 1, 300);
    let sources = vec![(a, 0.7), (b, 0.3)];
    let run = |prefetch: usize, failpoints: &'static str| {
        let mut m = endless_100(&sources, |c| {
            let c = c.prefetch(prefetch);
            if failpoints.is_empty() {
                c
            } else {
                c.failpoints(failpoints)
            }
        });
        let rows: Vec<_> = (0..25)
            .map(|_| list_rows(&m.next().unwrap().unwrap()))
            .collect();
        let stats = m.stats();
        let handed: Vec<u64> = stats.sources.iter().map(|s| s.handoff_batches).collect();
        (rows, stats.staged_batches, handed)
    };
    let (handed_on, staged, handed) = run(8, "");
    assert_eq!(staged, 0);
    assert!(handed.iter().all(|&n| n > 0), "{handed:?}");
    let nulls = handed_on.iter().flatten().filter(|r| r.2 == 0).count();
    assert!(nulls > 0, "some rows are null");
    assert!(
        handed_on
            .iter()
            .flatten()
            .filter(|r| r.2 == 0)
            .all(|r| r.1.is_empty())
    );
    let (collated, _, handed) = run(8, "handoff=stop");
    assert_eq!(handed, vec![0, 0]);
    assert_eq!(collated, handed_on, "every batch collated");
    let (mixed, _, _) = run(8, "handoff=stop@2");
    assert_eq!(mixed, handed_on, "batch 2 of each source collated");
    let (few, staged, handed) = run(1, "");
    assert!(
        staged > 0,
        "rows staged when a source keeps too many batches"
    );
    assert!(handed.iter().all(|&n| n > 0), "{handed:?}");
    assert_eq!(few, handed_on, "rows staged from batches handed on");
}
