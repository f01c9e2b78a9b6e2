"""Shared by the benchmark scripts: runs interleaved so that a slow moment of the machine does
not fall on one tool (or setting) only."""


def interleaved(repeat, datasets, items):
    """Yield (kind, dataset path, item) for each repeat, each `kind=path` of the comma-separated
    `datasets` and each item, the items' order rotated by one from one repeat to the next."""
    for i in range(repeat):
        for entry in datasets.split(","):
            kind, ds = entry.split("=", 1)
            k = i % len(items)
            for item in items[k:] + items[:k]:
                yield kind, ds, item


def dataset_files(path):
    """The shard files of the shardfeed dataset at `path`, from its manifest (for an index
    over local files, the files it lists, where they lie)."""
    import json, os
    from urllib.parse import unquote, urlparse
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    bases = [unquote(urlparse(b).path) for b in (manifest.get("index") or {}).get("bases", [])]
    return [os.path.join(bases[s["base"]] if "base" in s else path, s["path"])
            for s in manifest["shards"]]


def warm_page_cache(files):
    """Read each file through once, without dropping what is cached: pages the system evicted
    since (this project's machines run DAMON, which pages out file cache left unused for a
    minute; a round of `first_epoch_peers.py` over three datasets and three tools is longer)
    come back, and a file already cached costs a memory copy."""
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(16 << 20):
                pass


def settle_page_cache(files):
    """Read each file into the page cache afresh: drop its cached pages, then read it in order.

    How fast a cached file is read depends on how its pages came into the cache: `pread` of
    the same 134 MB shard ran at 5.4 GB/s where its pages had come in piecemeal (the file's
    history on this machine) and at 11-14 GB/s once dropped and read again in order, as after
    a copy or a cold read (the kernel then caches it in large folios, fewer pages to look up
    and copy). Settling every tool's files the same way keeps that history out of the
    comparison; every tool then meets what a dataset just read from disk gives."""
    import os
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while os.read(fd, 16 << 20):
                pass
        finally:
            os.close(fd)
