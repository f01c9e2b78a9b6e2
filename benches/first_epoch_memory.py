#!/usr/bin/env python3
"""A fresh process's first epoch: peak RSS, system CPU time and rows/s, per build and budget.

Each build (`--bin`, repeatable, e.g. before and after a change) runs `shardfeed bench DS
--epochs 1` in a new process on each dataset, at the default byte budget and at each
`--budget`, interleaved, `--repeat` times; medians. System time is what the kernel spent for
the process (mostly page faults on fresh memory), from `getrusage` of the child.

    python3 benches/first_epoch_memory.py --bin /tmp/before --bin target/release/shardfeed \\
        --datasets /tmp/sf-ab2/tokens/ds,/tmp/sf-ab2/tabular/ds,/tmp/sf-ab2/images/ds

`--idle S` waits S seconds before each run: on a VM whose host takes back the guest's free
memory after a moment (free page reporting), a process then meets memory the host must fault in
again, as a trainer does that starts on a machine idle for a while; back to back, it reuses what
the previous run just freed.
"""
import argparse, json, os, resource, statistics, subprocess, sys, time


def run_once(binary, ds, threads, budget):
    cmd = [binary, "bench", ds, "--threads", str(threads), "--epochs", "1", "--json"]
    if budget:
        cmd += ["--byte-budget", budget]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"}
    out = json.loads(r.stdout)
    return {
        "rows_per_s": out["rows"] / wall,
        "sys_s": after.ru_stime - before.ru_stime,
        "user_s": after.ru_utime - before.ru_utime,
        "peak_rss_mib": (out["peak_rss_bytes"] or 0) / 2**20,
        "first_batch_ms": out["time_to_first_batch_ms"],
        "slabs": f'{out["stats"].get("slabs_made", out["stats"]["slabs"])}/{out["stats"]["slabs"]}',
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", action="append", required=True)
    p.add_argument("--datasets", required=True, help="comma-separated dataset paths")
    p.add_argument("--budget", action="append", default=["128MiB"],
                   help="byte budgets besides the default (repeatable)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--idle", type=float, default=0.0,
                   help="seconds to wait before each run (0: back to back)")
    args = p.parse_args()
    budgets = [None] + args.budget
    results = {}
    for i in range(args.repeat):
        for ds in args.datasets.split(","):
            for budget in budgets:
                bins = args.bin if i % 2 == 0 else list(reversed(args.bin))
                for b in bins:
                    time.sleep(args.idle)
                    r = run_once(b, ds, args.threads, budget)
                    results.setdefault((ds, budget or "default", b), []).append(r)
                    print(json.dumps({"dataset": ds, "budget": budget or "default", "bin": b, **r}),
                          flush=True)
    print("\n| dataset | byte budget | build | rows/s (wall) | peak RSS MiB | sys s | user s | first batch ms | slabs made/max |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (ds, budget, b), runs in results.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            print(f"| {os.path.basename(os.path.dirname(ds))} | {budget} | {b} | refused: {runs[0]['error'][:90]} | | | | | |")
            continue
        med = {k: statistics.median(r[k] for r in ok)
               for k in ("rows_per_s", "peak_rss_mib", "sys_s", "user_s", "first_batch_ms")}
        print(f"| {os.path.basename(os.path.dirname(ds))} | {budget} | {b} | {med['rows_per_s']:,.0f} | "
              f"{med['peak_rss_mib']:.0f} | {med['sys_s']:.2f} | {med['user_s']:.2f} | "
              f"{med['first_batch_ms']:.0f} | {ok[-1]['slabs']} |")


if __name__ == "__main__":
    sys.exit(main())
