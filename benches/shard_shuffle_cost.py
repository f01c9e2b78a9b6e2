#!/usr/bin/env python3
"""What `shard`'s default global shuffle costs: the same inputs sharded with the default
(shuffled) and with --no-shuffle, interleaved, --repeat times; median wall seconds and the ratio.

    python3 benches/shard_shuffle_cost.py --bin target/release/shardfeed --work /tmp/shardfeed-shuffle-cost
"""
import argparse, json, os, shutil, statistics, subprocess, sys, time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--work", default="/tmp/shardfeed-shuffle-cost")
    p.add_argument("--kinds", default="tokens,tabular,images")
    p.add_argument("--size", default="600MB")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--memory-budget", default=None, help="passed to both runs (default: shard's)")
    args = p.parse_args()
    rows = []
    for kind in args.kinds.split(","):
        raw = os.path.join(args.work, kind, "raw")
        if not os.path.exists(raw):
            subprocess.run([args.bin, "generate", kind, "--size", args.size, "--files", "4", "-o", raw],
                           check=True, capture_output=True)
        times = {"shuffled": [], "ordered": []}
        for i in range(args.repeat):
            for name in (("shuffled", "ordered") if i % 2 == 0 else ("ordered", "shuffled")):
                out = os.path.join(args.work, kind, name)
                shutil.rmtree(out, ignore_errors=True)
                # The run before left its output dirty: written back first, so neither run
                # pays for the other's writeback.
                os.sync()
                extra = [] if name == "shuffled" else ["--no-shuffle"]
                if args.memory_budget:
                    extra += ["--memory-budget", args.memory_budget]
                t = time.perf_counter()
                r = subprocess.run([args.bin, "shard", raw, "-o", out, "--threads", str(args.threads), "--json", *extra],
                                   check=True, capture_output=True, text=True)
                times[name].append((time.perf_counter() - t, json.loads(r.stdout)))
        med = {k: statistics.median(t for t, _ in v) for k, v in times.items()}
        summary = times["shuffled"][0][1]
        row = {"dataset": kind, "input_mb": round(summary["input_bytes"] / 1e6),
               "memory_budget": args.memory_budget or "default",
               "shuffled_s": round(med["shuffled"], 2), "no_shuffle_s": round(med["ordered"], 2),
               "ratio": round(med["shuffled"] / med["ordered"], 2),
               "shuffled_peak_rss_mib": round(max(s["peak_rss_bytes"] for _, s in times["shuffled"]) / 2**20)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| dataset | input MB | memory budget | default (shuffled) s | --no-shuffle s | ratio | peak RSS shuffled |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dataset']} | {r['input_mb']} | {r['memory_budget']} | {r['shuffled_s']} | {r['no_shuffle_s']} | {r['ratio']}x | {r['shuffled_peak_rss_mib']} MiB |")


if __name__ == "__main__":
    sys.exit(main())
