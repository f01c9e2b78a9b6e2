#!/usr/bin/env python3
"""How many reads a `bench --trace` run kept in flight: the fraction of the run's fetch time
(first read's start to last read's end) with 0, 1, 2, ... `fetch` spans open, and their median
length.

    shardfeed bench DS --epochs 3 --trace /tmp/run.json && python3 benches/trace_concurrency.py /tmp/run.json
"""
import collections, json, statistics, sys


def main():
    trace = json.load(open(sys.argv[1]))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    spans = [e for e in events if e.get("ph") == "X" and e.get("name") == "fetch"]
    if not spans:
        sys.exit("no fetch spans in the trace")
    edges = sorted([(e["ts"], 1) for e in spans] + [(e["ts"] + e["dur"], -1) for e in spans])
    time_at = collections.Counter()
    last, open_now = edges[0][0], 0
    for t, step in edges:
        time_at[open_now] += t - last
        last, open_now = t, open_now + step
    total = sum(time_at.values())
    print(json.dumps({
        "reads": len(spans),
        "median_read_ms": round(statistics.median(e["dur"] for e in spans) / 1000, 3),
        "fraction_of_time_with_n_in_flight": {n: round(v / total, 3) for n, v in sorted(time_at.items())},
    }))


if __name__ == "__main__":
    main()
