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
