#!/usr/bin/env python3
"""Sequence packing on a 3-source mixture (weights 0.6/0.3/0.1) of token datasets, each
read by a fresh process, interleaved:

  * packed: `shardfeed bench --mix ... --pack-to L` (split mode: input_ids, position_ids,
    segment_ids, cu_seqlens and source, collated in the loader);
  * unpacked: the same mixture without packing (`bench --mix ...`: ragged token batches);
  * python-packing: `shardfeed.Loader({...}, batch_size=...)` unpacked, then packing in
    Python as LLM training scripts do: numpy concatenate (with an eos after each document)
    and cut into [B, L] rows (input_ids only: less work than the packed loader does);
  * packed-single: the largest source alone, packed (`bench URL --pack-to L`);
  * plain: the same source through the plain loader (`bench URL`, batches of 64 documents):
    packed-single / plain is what packing itself costs, packed / plain what the mixture of
    three adds;
  * plain-matched: the plain loader again, its batches holding about as many tokens as a
    packed batch (B x L over the source's mean document length): a loader's cost per batch
    (the hand-over to the consumer) is then the same on both sides of the ratio.

Reports tokens per second (medians of --repeat runs, the order rotated each time) and the
ratios.

    python3 benches/pack_peers.py --bin target/release/shardfeed --work /tmp/sf-pack --size 400MB
"""
import argparse, json, os, statistics, subprocess, sys, time

PYTHON_PACK = r"""
import sys, time, json
import numpy as np
import shardfeed
sources, batch, length, threads, eos, limit = json.loads(sys.argv[1])
loader = shardfeed.Loader(sources, batch_size=64, columns=["input_ids"], threads=threads,
                          drop_last=False, mix_stop="never" if limit else "first_exhausted")
t = time.perf_counter()
buffer = np.empty(0, dtype=np.int32)
tokens = 0
rows = 0
for b in loader:
    values, offsets = b["input_ids"], b["input_ids.offsets"]
    # An eos after each document, then append to the carry-over and cut.
    with_eos = np.insert(values, offsets[1:], eos)
    buffer = np.concatenate([buffer, with_eos])
    n = len(buffer) // (batch * length)
    for k in range(n):
        packed = buffer[k * batch * length:(k + 1) * batch * length].reshape(batch, length)
        tokens += packed.size
        rows += batch
    buffer = buffer[n * batch * length:]
    if limit and tokens >= limit:
        break
print(json.dumps({"seconds": time.perf_counter() - t, "tokens": tokens}))
"""


def run(cmd, env=None):
    r = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(r.stdout)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--size", default="400MB", help="size of the largest source (0.6)")
    p.add_argument("--pack-to", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1,
                   help="with more than 1: as many tokens as that many epochs (mixtures with "
                        "--mix-stop never and --max-batches): the steady state")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    total_mb = float(a.size.rstrip("MB"))
    urls = []
    for i, share in enumerate([0.6, 0.3, 0.1]):
        ds = os.path.join(a.work, f"src{i}")
        if not os.path.exists(os.path.join(ds, "manifest.json")):
            raw = os.path.join(a.work, f"raw{i}")
            subprocess.run([a.bin, "generate", "tokens", "-o", raw, "--size",
                            f"{total_mb * share / 0.6:.0f}MB", "--seed", str(i + 1)],
                           check=True, capture_output=True)
            subprocess.run([a.bin, "shard", raw, "-o", ds, "--json"], check=True,
                           capture_output=True)
        urls.append(ds)
    weights = dict(zip(urls, [0.6, 0.3, 0.1]))
    mix = [arg for u, w in weights.items() for arg in ("--mix", f"{u}={w}")]
    common = ["--threads", str(a.threads), "--columns", "input_ids", "--json"]
    eos = 0
    stop = []
    limit = 0
    if a.epochs > 1:
        # One epoch's batches and tokens, then N times as many with mix_stop never.
        probe = run([a.bin, "bench", *mix, "--pack-to", str(a.pack_to), "--eos-id", str(eos),
                     "--batch-size", str(a.batch_size), *common])
        unprobe = run([a.bin, "bench", *mix, "--batch-size", "64", *common])
        limit = a.epochs * probe["stats"]["tokens"]
        stop = ["--mix-stop", "never"]
    pack_stop = stop + (["--max-batches", str(a.epochs * probe["batches"])] if stop else [])
    unpack_stop = stop + (["--max-batches", str(a.epochs * unprobe["batches"])] if stop else [])
    epochs = ["--epochs", str(a.epochs)]
    # The largest source's mean document length, for the plain loader's matched batches.
    one = run([a.bin, "bench", urls[0], "--batch-size", "64", *common])
    mean_doc = (one["bytes"] - 8 * one["rows"]) / 4 / one["rows"]
    matched = max(1, round(a.batch_size * a.pack_to / mean_doc))
    print(f"mean document: {mean_doc:.0f} tokens; plain-matched batches of {matched}",
          file=sys.stderr)
    runs = {
        "packed": lambda: run([a.bin, "bench", *mix, "--pack-to", str(a.pack_to), "--eos-id",
                               str(eos), "--batch-size", str(a.batch_size), *pack_stop,
                               *common]),
        "unpacked": lambda: run([a.bin, "bench", *mix, "--batch-size", "64", *unpack_stop,
                                 *common]),
        "python-packing": lambda: run([sys.executable, "-c", PYTHON_PACK,
                                       json.dumps([weights, a.batch_size, a.pack_to,
                                                   a.threads, eos, limit])]),
        "packed-single": lambda: run([a.bin, "bench", urls[0], "--pack-to", str(a.pack_to),
                                      "--eos-id", str(eos), "--batch-size", str(a.batch_size),
                                      *epochs, *common]),
        "plain": lambda: run([a.bin, "bench", urls[0], "--batch-size", "64", *epochs,
                              *common]),
        "plain-matched": lambda: run([a.bin, "bench", urls[0], "--batch-size", str(matched),
                                      *epochs, *common]),
    }
    results = {k: [] for k in runs}
    names = list(runs)
    for rep in range(a.repeat):
        # Rotate the order: a process that follows another pays for the
        # memory the kernel must clear again, so no tool always goes first.
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            r = runs[name]()
            if name in ("packed", "unpacked", "packed-single"):
                results[name].append(r["tokens_per_s"])
            elif name == "python-packing":
                results[name].append(r["tokens"] / r["seconds"])
            else:
                # Ragged int32 tokens: collated bytes less the offsets (8 bytes a row).
                results[name].append((r["bytes"] - 8 * r["rows"]) / 4 / r["seconds"])
    med = {k: statistics.median(v) for k, v in results.items()}
    print(json.dumps({"tokens_per_s": med, "runs": results}, indent=1))
    print(f"packed / unpacked mixture: {med['packed'] / med['unpacked']:.2f}")
    print(f"packed / python packing:   {med['packed'] / med['python-packing']:.2f}")
    print(f"packed-single / plain:     {med['packed-single'] / med['plain']:.2f}")
    print(f"packed / plain loader:     {med['packed'] / med['plain']:.2f}")
    print(f"packed-single / plain-matched: {med['packed-single'] / med['plain-matched']:.2f}")
    print(f"packed / plain-matched:        {med['packed'] / med['plain-matched']:.2f}")


if __name__ == "__main__":
    main()
