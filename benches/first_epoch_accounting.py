#!/usr/bin/env python3
"""Where a fresh process's first epoch goes: how much slower it is than the steady epochs, and
how much of that the fresh memory it touches explains on this host.

For each dataset, `shardfeed bench DS --epochs N --json` runs `--repeat` times in fresh
processes; its report gives each epoch's rows/s, minor page faults and kernel CPU time
(`epoch_minor_faults`, `epoch_system_s`; the first epoch's with the loader's building).
In the same run, a probe measures what one fresh 4 KiB page costs here: it maps anonymous memory
and touches each page once (then the same loop again over the touched pages, to take out the
loop's own cost).

The table gives, medians of the runs: the first and the steady epoch's seconds and their ratio,
the first epoch's extra faults (over a later epoch's) and what they would cost at the probe's
price, and the kernel and user CPU time of the first epoch against a later one's: with every
core busy, extra CPU time is extra wall time.

    python3 benches/first_epoch_accounting.py --bin target/release/shardfeed \\
        --datasets tokens=/tmp/tok/ds,tabular=/tmp/tab/ds,images=/tmp/img/ds

On a virtual machine whose host takes back the guest's free memory (free page reporting, as on
this project's machines), a fresh page costs several microseconds; on a host without it, a
fraction of one.
"""
import argparse, json, mmap, statistics, subprocess, sys, time

BATCH = {"tokens": 64, "tabular": 4096, "images": 32}
PAGE = 4096


def fresh_page_cost_us(mib):
    """Microseconds to fault in one fresh anonymous page, median of three probes."""
    costs = []
    for _ in range(3):
        n = mib << 20
        m = mmap.mmap(-1, n)
        t = time.perf_counter()
        for off in range(0, n, PAGE):
            m[off] = 1
        fresh = time.perf_counter() - t
        t = time.perf_counter()
        for off in range(0, n, PAGE):
            m[off] = 2
        loop = time.perf_counter() - t
        m.close()
        costs.append((fresh - loop) / (n // PAGE) * 1e6)
    return statistics.median(costs)


def run(binary, ds, batch, threads, epochs):
    r = subprocess.run([binary, "bench", ds, "--batch-size", str(batch), "--threads",
                        str(threads), "--epochs", str(epochs), "--json"],
                       check=True, capture_output=True, text=True)
    out = json.loads(r.stdout)
    rows = out["rows"] / out["epochs"]
    secs = [rows / rate for rate in out["epoch_rows_per_s"]]
    later = range(1, len(secs))
    return {
        "first_s": secs[0],
        "steady_s": min(secs[i] for i in later),
        "first_faults": out["epoch_minor_faults"][0],
        "later_faults": statistics.mean(out["epoch_minor_faults"][i] for i in later),
        "first_sys_s": out["epoch_system_s"][0],
        "later_sys_s": statistics.mean(out["epoch_system_s"][i] for i in later),
        "first_user_s": out["epoch_user_s"][0],
        "later_user_s": statistics.mean(out["epoch_user_s"][i] for i in later),
        "peak_rss_mib": out["peak_rss_bytes"] / 2**20,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--datasets", required=True, help="kind=path,... (tokens, tabular, images)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--probe-mib", type=int, default=256)
    args = p.parse_args()
    if args.epochs < 2:
        raise SystemExit("--epochs must be at least 2: a steady epoch to compare with")
    datasets = [e.split("=", 1) for e in args.datasets.split(",")]
    results, probes = {}, []
    for _ in range(args.repeat):
        probes.append(fresh_page_cost_us(args.probe_mib))
        for kind, ds in datasets:
            r = run(args.bin, ds, BATCH[kind.split("-")[0]], args.threads, args.epochs)
            results.setdefault(kind, []).append(r)
            print(json.dumps({"dataset": kind, **r}), flush=True)
    cost = statistics.median(probes)
    print(f"\nfresh page cost on this host: {cost:.2f} us per 4 KiB page "
          f"({cost * 256 / 1000:.2f} ms/MiB), probes {', '.join(f'{c:.2f}' for c in probes)}")
    print(f"medians of {args.repeat} fresh processes, {args.threads} threads\n")
    print("| dataset | first epoch s | steady epoch s | first / steady | extra faults (MiB) | "
          "x fault cost s | first-epoch sys s (later) | first-epoch user s (later) | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        extra = max(0.0, med["first_faults"] - med["later_faults"])
        print(f"| {kind} | {med['first_s']:.3f} | {med['steady_s']:.3f} | "
              f"{med['steady_s'] / med['first_s']:.2f} | {extra:,.0f} ({extra * PAGE / 2**20:.0f}) | "
              f"{extra * cost / 1e6:.3f} | {med['first_sys_s']:.2f} ({med['later_sys_s']:.2f}) | "
              f"{med['first_user_s']:.2f} ({med['later_user_s']:.2f}) | {med['peak_rss_mib']:.0f} |")

if __name__ == "__main__":
    sys.exit(main())
