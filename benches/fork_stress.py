#!/usr/bin/env python3
"""Fork while the loader's threads run: how often a child deadlocks.

A background thread makes loaders and drops them (their threads start and exit) while the main
thread forks; each child makes a loader and reads one batch. A child not done within 20 s is
counted as hung and killed. An allocator without fork handlers (mimalloc) leaves a lock held by
a parent thread locked forever in the child; the package's extension uses the system allocator,
whose locks are taken around fork.

    pip install ./python && python3 benches/fork_stress.py DATASET --forks 2000
"""
import argparse, json, os, signal, threading, time

import shardfeed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("--forks", type=int, default=1000)
    args = p.parse_args()
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            loader = shardfeed.Loader(args.dataset, 64, seed=3, threads=2)
            next(iter(loader))
            loader.close()

    threading.Thread(target=churn, daemon=True).start()
    hung = 0
    for _ in range(args.forks):
        time.sleep(0.003)
        pid = os.fork()
        if pid == 0:
            try:
                next(iter(shardfeed.Loader(args.dataset, 64, seed=2, threads=2)))
                os._exit(0)
            finally:
                os._exit(1)
        deadline = time.time() + 20
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.time() > deadline:
                hung += 1
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
    stop.set()
    print(json.dumps({"forks": args.forks, "hung": hung}))


if __name__ == "__main__":
    main()
