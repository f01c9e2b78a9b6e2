//! `shardfeed shard --tokenizer`: text to token ids while sharding, with a
//! small hand-written word-level tokenizer (the test of identical ids against
//! the Python `tokenizers` package, with a trained BPE tokenizer, is in
//! python/tests/test_tokenize.py).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{Array, Int64Array};
use arrow_schema::DataType;

use crate::support::*;

const WORDS: [&str; 6] = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];
const UNK: i32 = 1;
const EOS: i32 = 0;

/// A word-level tokenizer (whitespace pre-tokenizer) over `WORDS`, with
/// `<|endoftext|>` (id 0, special) when `eos` and `<unk>` (id 1).
fn write_tokenizer(path: &Path, eos: bool) {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<|endoftext|>".into(), 0.into());
    vocab.insert("<unk>".into(), 1.into());
    for (i, w) in WORDS.iter().enumerate() {
        vocab.insert((*w).into(), (i + 2).into());
    }
    let added = if eos {
        serde_json::json!([{"id": 0, "content": "<|endoftext|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}])
    } else {
        serde_json::json!([])
    };
    let spec = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    });
    std::fs::write(path, serde_json::to_vec(&spec).unwrap()).unwrap();
}

/// The ids the tokenizer gives `text` (words split on spaces).
fn expected_ids(text: &str) -> Vec<i32> {
    let ids: HashMap<&str, i32> = WORDS
        .iter()
        .enumerate()
        .map(|(i, w)| (*w, i as i32 + 2))
        .collect();
    text.split_whitespace()
        .map(|w| ids.get(w).copied().unwrap_or(UNK))
        .collect()
}

/// `rows` documents (some empty, some with unknown words, every 7th null
/// when `nulls`) as JSON Lines in `files` files; returns the paths and the
/// texts by id.
fn write_documents(
    dir: &Path,
    rows: usize,
    files: usize,
    nulls: bool,
) -> (Vec<String>, HashMap<i64, Option<String>>) {
    std::fs::create_dir_all(dir).unwrap();
    let mut texts = HashMap::new();
    let mut paths = Vec::new();
    for f in 0..files {
        let path = dir.join(format!("docs-{f}.jsonl"));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for id in (f * rows / files)..((f + 1) * rows / files) {
            let text = if nulls && id % 7 == 3 {
                None
            } else if id % 11 == 5 {
                Some(String::new())
            } else {
                let n = 1 + (id * 31) % 40;
                let words: Vec<&str> = (0..n)
                    .map(|k| {
                        if (id + k) % 13 == 0 {
                            "unknownword"
                        } else {
                            WORDS[(id * 7 + k * 3) % WORDS.len()]
                        }
                    })
                    .collect();
                Some(words.join(" "))
            };
            let line = serde_json::json!({"id": id as i64, "text": text});
            writeln!(out, "{line}").unwrap();
            texts.insert(id as i64, text);
        }
        paths.push(s(&path));
    }
    (paths, texts)
}

/// Rows of the dataset at `dir` by id: (ids, num_tokens).
/// The `id` column of `all`.
fn id_column(all: &arrow_array::RecordBatch) -> &Int64Array {
    all.column_by_name("id")
        .unwrap()
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
}

fn tokenized_rows(dir: &Path, column: &str) -> HashMap<i64, (Vec<i32>, i32)> {
    let all = read_all(dir);
    let ids = id_column(&all);
    let lists = all.column_by_name(column).unwrap().as_list::<i32>();
    let counts = all
        .column_by_name("num_tokens")
        .unwrap()
        .as_primitive::<Int32Type>();
    (0..all.num_rows())
        .map(|r| {
            let list = lists.value(r);
            let values = list.as_primitive::<Int32Type>().values().to_vec();
            (ids.value(r), (values, counts.value(r)))
        })
        .collect()
}

fn shard_args(inputs: &[String], out: &Path, tokenizer: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec!["shard".into()];
    args.extend(inputs.iter().cloned());
    args.extend([
        "--output".into(),
        s(out),
        "--tokenizer".into(),
        s(tokenizer),
    ]);
    args.extend(["--row-group-rows", "97", "--shard-size", "16KiB", "--json"].map(String::from));
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

#[test]
fn texts_become_their_ids_with_one_eos_each_in_single_and_split_runs() {
    let tmp = tempdir();
    let tokenizer = tmp.path().join("tokenizer.json");
    write_tokenizer(&tokenizer, true);
    let (inputs, texts) = write_documents(&tmp.path().join("in"), 1200, 3, true);
    let nulls = texts.values().filter(|t| t.is_none()).count() as u64;
    let expected: HashMap<i64, Vec<i32>> = texts
        .iter()
        .filter_map(|(id, t)| t.as_ref().map(|t| (*id, expected_ids(t))))
        .collect();
    let total: u64 = expected.values().map(|v| v.len() as u64 + 1).sum();

    // One run, shuffled (the default), eos appended.
    let single = tmp.path().join("single");
    let run = shardfeed(&shard_args(&inputs, &single, &tokenizer, &["--add-eos"])).success();
    let summary = run.json();
    assert_eq!(summary["null_texts_skipped"], nulls, "{summary}");
    assert_eq!(summary["tokens"], total, "{summary}");
    let rows = tokenized_rows(&single, "input_ids");
    assert_eq!(rows.len(), expected.len());
    for (id, want) in &expected {
        let (got, count) = &rows[id];
        // Exactly one eos, at the end.
        assert_eq!(got.last(), Some(&EOS), "row {id}");
        assert_eq!(got.iter().filter(|&&t| t == EOS).count(), 1, "row {id}");
        assert_eq!(&got[..got.len() - 1], want.as_slice(), "row {id}");
        assert_eq!(*count as usize, got.len(), "row {id}");
    }
    let written = manifest(&single);
    assert_eq!(written.total_tokens, Some(total));
    let record = written
        .options
        .tokenizer
        .clone()
        .expect("tokenizer recorded");
    assert_eq!(record.file, "tokenizer.json");
    assert_eq!(record.eos_id, Some(EOS as u32));
    assert_eq!(record.vocab_size, 8);
    assert_eq!(record.sha256.len(), 64);
    // The text column is gone; the ids and counts took its place.
    let names: Vec<String> = written
        .schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["id", "input_ids", "num_tokens"]);
    let inspect = shardfeed(&["inspect".to_string(), s(&single)]).success();
    assert!(
        inspect.stdout.contains("tokenizer    tokenizer.json"),
        "{}",
        inspect.stdout
    );
    assert!(
        inspect.stdout.contains(&format!("tokens       {total} ")),
        "{}",
        inspect.stdout
    );
    let json = shardfeed(&["inspect".to_string(), s(&single), "--json".into()])
        .success()
        .json();
    assert_eq!(json["tokens"], total);
    assert_eq!(json["options"]["tokenizer"]["eos_id"], EOS);

    // A split run (3 tasks, then commit), text kept, another ids column:
    // the same rows and ids.
    let split = tmp.path().join("split");
    for task in 0..3 {
        let mut args = shard_args(
            &inputs,
            &split,
            &tokenizer,
            &["--add-eos", "--keep-text", "--tokens-column", "ids"],
        );
        args.extend(["--num-tasks", "3", "--task-index"].map(String::from));
        args.push(task.to_string());
        shardfeed(&args).success();
    }
    shardfeed(&["commit", &s(&split)]).success();
    assert_eq!(manifest(&split).total_tokens, Some(total));
    let rows = tokenized_rows(&split, "ids");
    assert_eq!(rows.len(), expected.len());
    for (id, want) in &expected {
        assert_eq!(&rows[id].0[..rows[id].0.len() - 1], want.as_slice());
    }
    let all = read_all(&split);
    assert_eq!(
        all.schema().field_with_name("text").unwrap().data_type(),
        &DataType::Utf8
    );

    // Without --add-eos: the ids alone.
    let plain = tmp.path().join("plain");
    shardfeed(&shard_args(
        &inputs,
        &plain,
        &tokenizer,
        &["--threads", "1"],
    ))
    .success();
    let rows = tokenized_rows(&plain, "input_ids");
    for (id, want) in &expected {
        assert_eq!(&rows[id].0, want, "row {id}");
    }

    // Parquet inputs (the texts sharded as they are) and CSV give the same ids.
    let texts_ds = tmp.path().join("texts");
    let mut args: Vec<String> = vec!["shard".into()];
    args.extend(inputs.iter().cloned());
    args.extend([
        "-o".into(),
        s(&texts_ds),
        "--row-group-rows".into(),
        "200".into(),
    ]);
    shardfeed(&args).success();
    let csv = tmp.path().join("docs.csv");
    let mut lines = vec!["id,text".to_string()];
    for (id, text) in &texts {
        // CSV cannot tell a null from an empty field: the null rows are left out.
        if let Some(t) = text {
            lines.push(format!("{id},{t}"));
        }
    }
    std::fs::write(&csv, lines.join("\n") + "\n").unwrap();
    for (input, name) in [
        (s(&texts_ds.join("shards")), "from-parquet"),
        (s(&csv), "from-csv"),
    ] {
        let out = tmp.path().join(name);
        shardfeed(&shard_args(&[input], &out, &tokenizer, &[])).success();
        let rows = tokenized_rows(&out, "input_ids");
        // CSV reads an empty field as null: those rows are skipped too.
        let empty = |id: &i64| name == "from-csv" && texts[id].as_deref() == Some("");
        let kept = expected.keys().filter(|id| !empty(id)).count();
        assert_eq!(rows.len(), kept, "{name}");
        for (id, want) in expected.iter().filter(|(id, _)| !empty(id)) {
            assert_eq!(&rows[id].0, want, "{name}: row {id}");
        }
    }
}

/// The message of a failed run, and that it left no dataset.
fn refused(args: Vec<String>, out: &Path) -> String {
    let run = shardfeed(&args).failure();
    assert!(
        !out.join("manifest.json").exists(),
        "a failed run left a dataset"
    );
    run.stderr
}

#[test]
fn bad_texts_and_tokenizers_are_refused_naming_the_file_row_or_option() {
    let tmp = tempdir();
    let tokenizer = tmp.path().join("tokenizer.json");
    write_tokenizer(&tokenizer, true);
    let (inputs, _) = write_documents(&tmp.path().join("in"), 100, 1, true);
    let out = tmp.path().join("ds");
    let with = |extra: &[&str]| shard_args(&inputs, &out, &tokenizer, extra);

    let e = refused(with(&["--text-column", "body"]), &out);
    assert!(
        e.contains("--text-column") && e.contains("\"body\"") && e.contains("id, text"),
        "{e}"
    );
    let e = refused(with(&["--text-column", "id"]), &out);
    assert!(e.contains("Int64, not strings"), "{e}");
    // Null texts: refused with --strict, naming the file and row.
    let e = refused(with(&["--strict"]), &out);
    assert!(
        e.contains("docs-0.jsonl") && e.contains("row 3 (from 0)") && e.contains("null text"),
        "{e}"
    );
    // A document past an eighth of the memory budget.
    let big = tmp.path().join("big.jsonl");
    let text = "alpha ".repeat(500_000);
    std::fs::write(
        &big,
        format!("{}\n", serde_json::json!({"id": 0, "text": text})),
    )
    .unwrap();
    let e = refused(
        shard_args(&[s(&big)], &out, &tokenizer, &["--memory-budget", "16MiB"]),
        &out,
    );
    // Its JSON line is past the bound on one value already: refused as it
    // is read, naming the line.
    assert!(
        e.contains("big.jsonl")
            && (e.contains("row 0") || e.contains("line 1"))
            && e.contains("--memory-budget"),
        "{e}"
    );
    // Invalid UTF-8 in a text.
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        b"{\"id\": 0, \"text\": \"ok\"}\n{\"id\": 1, \"text\": \"\xff\xfe\"}\n",
    )
    .unwrap();
    let e = refused(shard_args(&[s(&bad)], &out, &tokenizer, &[]), &out);
    assert!(e.contains("bad.jsonl"), "{e}");
    // Tokenizer files: missing, not a tokenizer, no eos for --add-eos.
    let missing: PathBuf = tmp.path().join("nope.json");
    let e = refused(shard_args(&inputs, &out, &missing, &[]), &out);
    assert!(e.contains("nope.json") && e.contains("cannot read"), "{e}");
    let garbage = tmp.path().join("garbage.json");
    std::fs::write(&garbage, b"{\"model\": 3}").unwrap();
    let e = refused(shard_args(&inputs, &out, &garbage, &[]), &out);
    assert!(
        e.contains("garbage.json") && e.contains("not a valid tokenizer"),
        "{e}"
    );
    let no_eos = tmp.path().join("no-eos.json");
    write_tokenizer(&no_eos, false);
    let e = refused(shard_args(&inputs, &out, &no_eos, &["--add-eos"]), &out);
    assert!(
        e.contains("--eos-token") && e.contains("no-eos.json"),
        "{e}"
    );
    let e = refused(
        shard_args(
            &inputs,
            &out,
            &no_eos,
            &["--add-eos", "--eos-token", "</s>"],
        ),
        &out,
    );
    assert!(e.contains("\"</s>\" is not in its vocabulary"), "{e}");
    // Naming an eos the vocabulary has works without a marked one.
    shardfeed(&shard_args(
        &inputs,
        &out,
        &no_eos,
        &["--add-eos", "--eos-token", "<|endoftext|>"],
    ))
    .success();
}

/// Side files and id ranges: a tokenizer path that is not a regular file is
/// refused before it is read (`/dev/zero` would grow without end); ids of
/// 2^31 and more get an unsigned column, never negative int32 values; an
/// ids column that would clash with `num_tokens` is refused, naming it.
#[test]
fn tokenizer_files_id_ranges_and_column_names_are_checked() {
    let tmp = tempdir();
    let (inputs, texts) = write_documents(&tmp.path().join("in"), 60, 1, false);
    let out = tmp.path().join("ds");
    let e = refused(shard_args(&inputs, &out, Path::new("/dev/zero"), &[]), &out);
    assert!(
        e.contains("/dev/zero") && e.contains("not a regular file"),
        "{e}"
    );
    let tokenizer = tmp.path().join("tokenizer.json");
    write_tokenizer(&tokenizer, true);
    let e = refused(
        shard_args(
            &inputs,
            &out,
            &tokenizer,
            &["--tokens-column", "num_tokens"],
        ),
        &out,
    );
    assert!(
        e.contains("--tokens-column") && e.contains("num_tokens"),
        "{e}"
    );
    // "zeta" at id 2^31 + 5 in a vocabulary of 8 entries.
    let large = tmp.path().join("large-ids.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&tokenizer).unwrap()).unwrap();
    let big = (1u64 << 31) + 5;
    spec["model"]["vocab"]["zeta"] = big.into();
    std::fs::write(&large, serde_json::to_vec(&spec).unwrap()).unwrap();
    shardfeed(&shard_args(&inputs, &out, &large, &[])).success();
    let all = read_all(&out);
    let lists = all.column_by_name("input_ids").unwrap().as_list::<i32>();
    assert_eq!(
        lists.values().data_type(),
        &DataType::UInt32,
        "ids past i32::MAX need an unsigned column"
    );
    let ids = id_column(&all);
    let mut zetas = 0;
    for r in 0..all.num_rows() {
        let got: Vec<u64> = lists
            .value(r)
            .as_primitive::<arrow_array::types::UInt32Type>()
            .values()
            .iter()
            .map(|&v| u64::from(v))
            .collect();
        let want: Vec<u64> = texts[&ids.value(r)]
            .as_deref()
            .unwrap_or("")
            .split_whitespace()
            .map(|w| match w {
                "zeta" => big,
                w => expected_ids(w)[0] as u64,
            })
            .collect();
        zetas += want.iter().filter(|&&v| v == big).count();
        assert_eq!(got, want, "row {}", ids.value(r));
    }
    assert!(zetas > 0, "the documents use the large id");
}

/// Tokenizing a text costs many times its size (the encoding's strings,
/// offsets and masks): long texts take their cost from half the memory
/// budget while they are tokenized, so that texts tokenized at once fit it.
/// A text whose cost alone is past that half is refused naming the budget
/// it needs; below it, the peak RSS of the run (a child process) stays
/// within the budget.
#[test]
fn long_texts_are_tokenized_within_the_memory_budget() {
    let tmp = tempdir();
    let tokenizer = tmp.path().join("tokenizer.json");
    write_tokenizer(&tokenizer, true);
    let docs = tmp.path().join("long.jsonl");
    let mut lines = String::new();
    for id in 0..6 {
        let words: Vec<&str> = (0..120_000).map(|k| WORDS[(k * 7 + id) % 6]).collect();
        lines.push_str(&serde_json::json!({"id": id, "text": words.join(" ")}).to_string());
        lines.push('\n');
    }
    std::fs::write(&docs, lines).unwrap();
    let out = tmp.path().join("ds");
    // ~760 KB texts cost ~95 MB each: past half of a 64 MiB budget.
    let e = refused(
        shard_args(&[s(&docs)], &out, &tokenizer, &["--memory-budget", "64MiB"]),
        &out,
    );
    assert!(
        e.contains("tokenizing it takes") && e.contains("raise --memory-budget"),
        "{e}"
    );
    let budget = 384u64 << 20;
    let run = shardfeed(&shard_args(
        &[s(&docs)],
        &out,
        &tokenizer,
        &["--memory-budget", "384MiB", "--threads", "2"],
    ))
    .success();
    let summary = run.json();
    assert_eq!(summary["rows"], 6);
    let peak = summary["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        peak < budget,
        "peak RSS {} MB under a {} MB budget",
        peak >> 20,
        budget >> 20
    );
}
