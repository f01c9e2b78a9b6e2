#!/usr/bin/env python3
"""`shard` under memory budgets: wall time, CPU time, peak RSS and page faults of builds,
interleaved.

Each build shards each input (default shuffle, or `--no-shuffle`) under each budget, in a fresh
process, `--repeat` rounds with the builds alternating; medians of wall and CPU time and of
faults, the largest peak RSS. With `--budgets 1GiB` (the default budget), an A/B of two builds.
Inputs as `benches/shard_peers.py` generates them (`shardfeed generate KIND --size 300MB
--files 8 -o DIR/KIND/in`).

    python3 benches/shard_budget.py --bins old=OLD,new=NEW --inputs tokens=DIR,images=DIR \\
        --budgets 256MiB,512MiB --repeat 3
"""
import argparse, os, resource, shutil, statistics, subprocess, tempfile, time


def run(binary, inputs, out, budget, shuffle):
    shutil.rmtree(out, ignore_errors=True)
    args = [binary, "shard", inputs, "-o", out, "--memory-budget", budget, "--json"]
    if not shuffle:
        args.append("--no-shuffle")
    t = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(args)} failed ({status})")
    return (time.perf_counter() - t, usage.ru_maxrss * 1024, usage.ru_minflt,
            usage.ru_utime + usage.ru_stime)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bins", required=True, help="NAME=PATH,... (builds to compare)")
    p.add_argument("--inputs", required=True, help="KIND=DIR,... (shard inputs)")
    p.add_argument("--budgets", default="256MiB,512MiB")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-shuffle", action="store_true")
    args = p.parse_args()
    bins = dict(b.split("=", 1) for b in args.bins.split(","))
    inputs = dict(i.split("=", 1) for i in args.inputs.split(","))
    out = os.path.join(tempfile.mkdtemp(), "out")
    print("| input | budget | build | wall s (median) | CPU s (median) | peak RSS MiB (max) | page faults (median) |")
    print("|---|---|---|---|---|---|---|")
    for kind, path in inputs.items():
        for budget in args.budgets.split(","):
            runs = {name: [] for name in bins}
            for _ in range(args.repeat):
                for name, binary in bins.items():
                    runs[name].append(run(binary, path, out, budget, not args.no_shuffle))
            for name, r in runs.items():
                print(f"| {kind} | {budget} | {name} | {statistics.median(x[0] for x in r):.3f} | "
                      f"{statistics.median(x[3] for x in r):.3f} | {max(x[1] for x in r) >> 20} | "
                      f"{statistics.median(x[2] for x in r):,.0f} |")
    shutil.rmtree(os.path.dirname(out), ignore_errors=True)


if __name__ == "__main__":
    main()
