#!/usr/bin/env python3
"""`shardfeed index` at scale: indexing many files, and a loader's start-up on the index.

1. Local: writes a small Parquet file (pyarrow, 64 rows), hard-links it `--files` times into
   a folder, times `shardfeed index FOLDER -o INDEX` (wall time, peak RSS), then runs a fresh
   `shardfeed bench INDEX --max-batches 1` (shuffled): the process's wall time, its time to the
   first batch and its peak RSS.
2. S3 (moto's server on 127.0.0.1): uploads `--s3-files` copies of the file and times
   `shardfeed index s3://bucket/raw -o INDEX`.

    python3 benches/index_scale.py --bin target/release/shardfeed --files 100000 --s3-files 10000
"""
import argparse, json, os, resource, socket, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor



def timed(cmd, env=None):
    """Run `cmd`; its wall time and peak RSS (MiB, from the children's rusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024, out.stdout


def small_file(path):
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    n = 64
    pq.write_table(pa.table({"id": np.arange(n), "x": np.random.default_rng(0).random(n),
                             "tokens": [list(range(i % 16)) for i in range(n)]}), path)


def local(args, work):
    folder = os.path.join(work, "files")
    os.makedirs(folder)
    for i in range(args.files):
        if i % 50_000 == 0:
            # A file system allows some 65,000 links to one file.
            src = os.path.join(work, f"one-{i}.parquet")
            small_file(src)
        sub = os.path.join(folder, f"d{i // 10000:03d}")
        os.makedirs(sub, exist_ok=True)
        os.link(src, os.path.join(sub, f"part-{i:06d}.parquet"))
    index = os.path.join(work, "index")
    wall, rss, _ = timed([args.bin, "index", folder, "-o", index])
    size = os.path.getsize(os.path.join(index, "manifest.json"))
    # A fresh loader process on the index: shuffled, its first batch, then it stops.
    load_wall, load_rss, out = timed([args.bin, "bench", index, "--batch-size", "32",
                                      "--max-batches", "1", "--json"])
    bench = json.loads(out)
    print(json.dumps({"files": args.files, "index_s": round(wall, 2), "index_peak_rss_mib": round(rss),
                      "manifest_mib": round(size / 2**20, 1),
                      "loader_process_s": round(load_wall, 2),
                      "time_to_first_batch_ms": round(bench["time_to_first_batch_ms"]),
                      "loader_peak_rss_mib": round(bench["peak_rss_bytes"] / 2**20)}), flush=True)


def s3(args, work):
    import boto3
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        src = os.path.join(work, "one-s3.parquet")
        small_file(src)
        body = open(src, "rb").read()
        t = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: client.put_object(Bucket="bench", Key=f"raw/part-{i:06d}.parquet",
                                                      Body=body), range(args.s3_files)))
        upload = time.perf_counter() - t
        options = [f"aws_endpoint={endpoint}", "aws_allow_http=true", "aws_access_key_id=testing",
                   "aws_secret_access_key=testing", "aws_region=us-east-1"]
        cmd = [args.bin, "index", "s3://bench/raw", "-o", os.path.join(work, "s3-index")]
        for o in options:
            cmd += ["--storage-option", o]
        wall, rss, _ = timed(cmd)
        print(json.dumps({"s3_files": args.s3_files, "upload_s": round(upload, 1),
                          "index_s": round(wall, 2), "index_peak_rss_mib": round(rss)}), flush=True)
    finally:
        server.kill()
        server.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/shardfeed")
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--s3-files", type=int, default=10_000)
    p.add_argument("--work", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        if args.files:
            local(args, work)
        if args.s3_files:
            s3(args, work)


if __name__ == "__main__":
    main()
