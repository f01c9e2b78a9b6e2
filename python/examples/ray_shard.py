"""Shard a dataset with N Ray tasks, then commit (one global shuffle across tasks).

    python3 python/examples/ray_shard.py 'raw/*.parquet' s3://bucket/ds --tasks 64 --shuffle

Each task runs `shardfeed.shard_task(...)`. With --shuffle the tasks exchange rows through the
output store: this example runs two rounds (every task's scatter, then every task's gather),
which works whatever the number of CPUs; `stage="both"` does it in one round when all tasks can
run at once. A failed task is retried by Ray (`max_retries`); re-running a task is idempotent.
`commit` writes the manifest once every task has finished and refuses, naming the missing
tasks, until then.
"""

import argparse

import ray

import shardfeed


@ray.remote(num_cpus=1, max_retries=3)
def shard_task(inputs, output, index, count, shuffle, seed, stage="both"):
    return shardfeed.shard_task(
        inputs, output, index, count, shuffle=shuffle, seed=seed, threads=1, stage=stage
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("inputs", nargs="+")
    p.add_argument("output")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    ray.init()

    def run(stage):
        return ray.get(
            [shard_task.remote(args.inputs, args.output, i, args.tasks, args.shuffle, args.seed, stage)
             for i in range(args.tasks)]
        )

    if args.shuffle:
        run("scatter")
        summaries = run("gather")
    else:
        summaries = run("both")
    print(f"{sum(s['rows'] for s in summaries)} rows from {args.tasks} tasks")
    print(shardfeed.commit(args.output))


if __name__ == "__main__":
    main()
