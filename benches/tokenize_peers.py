#!/usr/bin/env python3
"""`shardfeed shard --tokenizer` against the usual Python paths, same tokenizer, same JSON Lines:

  * tokenizers + pyarrow: the `tokenizers` package's `encode_batch` (its own threads,
    RAYON_NUM_THREADS=--threads) over batches of lines parsed with `json.loads`, ids written
    with pyarrow's ParquetWriter (zstd level 3, list<int32> + num_tokens);
  * datasets: `datasets.load_dataset("json")` + `.map(batched=True, num_proc=--threads)`
    + `.to_parquet` (when `datasets` is installed: `pip install datasets`).

Reports MB of text per second and tokens per second (medians of --repeat interleaved runs),
and the ratio of shardfeed to the fastest peer. With --memory, also shards 4x and 16x
`--memory-budget` of text with shardfeed and reports peak RSS.

    pip install tokenizers==0.22.2 datasets
    python3 benches/tokenize_peers.py --bin target/release/shardfeed --work /tmp/sf-tok --size-mb 200
"""
import argparse, json, os, shutil, statistics, subprocess, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
from text_fixture import documents, train_tokenizer  # noqa: E402


def write_jsonl(path, size_mb, seed=0):
    """Documents (text_fixture's multilingual mix) until `size_mb` MB of text; returns bytes."""
    block = documents(20_000, seed=seed)
    written, i = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size_mb * 1e6:
            for d in block:
                line = json.dumps({"id": i, "text": d}, ensure_ascii=False) + "\n"
                f.write(line)
                written += len(d.encode("utf-8"))
                i += 1
                if written >= size_mb * 1e6:
                    break
    return written


def run_shardfeed(binary, raw, out, tok, threads, extra=()):
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    r = subprocess.run([binary, "shard", raw, "-o", out, "--tokenizer", tok, "--add-eos",
                        "--threads", str(threads), "--json", *extra],
                       check=True, capture_output=True, text=True)
    s = json.loads(r.stdout)
    return time.perf_counter() - t, s["tokens"], s.get("peak_rss_bytes")


def run_pyarrow(raw, out, tok_file, threads):
    """Python path 1, in a child process (fresh, RAYON_NUM_THREADS set)."""
    code = f"""
import json, time, pyarrow as pa, pyarrow.parquet as pq
from tokenizers import Tokenizer
tok = Tokenizer.from_file({tok_file!r}); eos = tok.token_to_id("<|endoftext|>")
t = time.perf_counter(); tokens = 0
schema = pa.schema([("id", pa.int64()), ("input_ids", pa.list_(pa.int32())), ("num_tokens", pa.int32())])
w = pq.ParquetWriter({out!r}, schema, compression="zstd", compression_level=3)
def flush(ids, texts):
    global tokens
    enc = [e.ids + [eos] for e in tok.encode_batch(texts)]
    tokens += sum(len(e) for e in enc)
    w.write_table(pa.table({{"id": ids, "input_ids": enc, "num_tokens": [len(e) for e in enc]}}, schema=schema))
ids, texts = [], []
with open({raw!r}, encoding="utf-8") as f:
    for line in f:
        r = json.loads(line); ids.append(r["id"]); texts.append(r["text"])
        if len(texts) == 8192:
            flush(ids, texts); ids, texts = [], []
if texts: flush(ids, texts)
w.close()
print(json.dumps({{"seconds": time.perf_counter() - t, "tokens": tokens}}))
"""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - t, json.loads(r.stdout.strip().splitlines()[-1])["tokens"]


def run_datasets(raw, out, tok_file, threads, cache):
    code = f"""
import json, time
import datasets
from tokenizers import Tokenizer
datasets.disable_progress_bars()
tok = Tokenizer.from_file({tok_file!r}); eos = tok.token_to_id("<|endoftext|>")
def encode(batch):
    ids = [e.ids + [eos] for e in tok.encode_batch(batch["text"])]
    return {{"input_ids": ids, "num_tokens": [len(i) for i in ids]}}
ds = datasets.load_dataset("json", data_files={raw!r}, split="train", cache_dir={cache!r})
ds = ds.map(encode, batched=True, num_proc={threads}, remove_columns=["text"])
ds.to_parquet({out!r})
print(json.dumps({{"tokens": sum(ds["num_tokens"])}}))
"""
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - t, json.loads(r.stdout.strip().splitlines()[-1])["tokens"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--work", default="/tmp/shardfeed-tokenize")
    p.add_argument("--size-mb", type=float, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--memory", action="store_true", help="also peak RSS at 4x and 16x --memory-budget")
    p.add_argument("--memory-budget-mb", type=int, default=32)
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    tok = os.path.join(args.work, "tokenizer.json")
    if not os.path.exists(tok):
        train_tokenizer(tok)
    raw = os.path.join(args.work, f"docs-{args.size_mb:g}MB.jsonl")
    if not os.path.exists(raw):
        write_jsonl(raw, args.size_mb)
    text_mb = args.size_mb
    try:
        import datasets  # noqa: F401
        have_datasets = True
    except ImportError:
        have_datasets = False
    runs = {"shardfeed": [], "shardfeed --no-shuffle": [], "tokenizers+pyarrow": [], "datasets.map": []}
    tokens = {}
    for i in range(args.repeat):
        s, n, _ = run_shardfeed(args.bin, raw, os.path.join(args.work, "sf"), tok, args.threads)
        runs["shardfeed"].append(s); tokens["shardfeed"] = n
        s, n, _ = run_shardfeed(args.bin, raw, os.path.join(args.work, "sf"), tok, args.threads, ["--no-shuffle"])
        runs["shardfeed --no-shuffle"].append(s); tokens["shardfeed --no-shuffle"] = n
        s, n = run_pyarrow(raw, os.path.join(args.work, "pa.parquet"), tok, args.threads)
        runs["tokenizers+pyarrow"].append(s); tokens["tokenizers+pyarrow"] = n
        if have_datasets:
            s, n = run_datasets(raw, os.path.join(args.work, "hf.parquet"), tok, args.threads,
                                os.path.join(args.work, "hf-cache"))
            runs["datasets.map"].append(s); tokens["datasets.map"] = n
    rows = []
    for name, times in runs.items():
        if not times:
            continue
        med = statistics.median(times)
        rows.append({"tool": name, "seconds": round(med, 2), "text_mb_s": round(text_mb / med, 1),
                     "tokens_s": round(tokens[name] / med), "tokens": tokens[name]})
    counts = {r["tokens"] for r in rows}
    assert len(counts) == 1, f"the tools disagree on the token count: {rows}"
    peers = [r for r in rows if not r["tool"].startswith("shardfeed")]
    fastest = max(peers, key=lambda r: r["text_mb_s"])
    for r in rows:
        r["vs_fastest_peer"] = round(r["text_mb_s"] / fastest["text_mb_s"], 2)
        print(json.dumps(r))
    print(f"\n{text_mb:g} MB of text, {args.threads} threads, medians of {args.repeat}; fastest peer: {fastest['tool']}\n")
    print("| tool | seconds | MB of text/s | tokens/s | vs fastest peer |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tool']} | {r['seconds']} | {r['text_mb_s']} | {r['tokens_s']:,} | {r['vs_fastest_peer']}x |")
    if args.memory:
        budget = args.memory_budget_mb
        print(f"\npeak RSS of `shard --tokenizer --memory-budget {budget}MiB`:\n")
        print("| text | x budget | peak RSS |")
        print("|---|---|---|")
        for factor in (4, 16):
            big = os.path.join(args.work, f"docs-{factor}x.jsonl")
            if not os.path.exists(big):
                write_jsonl(big, factor * budget * 1.048576)
            _, _, rss = run_shardfeed(args.bin, big, os.path.join(args.work, "sf-mem"), tok, args.threads,
                                      ["--memory-budget", f"{budget}MiB"])
            print(f"| {factor * budget} MiB | {factor}x | {rss / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
