"""Prometheus metrics of a loader for a trainer's existing metrics endpoint.

    from prometheus_client import REGISTRY, start_http_server
    from shardfeed.metrics import LoaderCollector

    REGISTRY.register(LoaderCollector(loader))
    start_http_server(8000)

The families are those of ``loader.metrics_text()`` (``shardfeed_*``, labelled with the
loader's rank): counters of rows, bytes, batches, requests, retries and skipped row groups,
each stage's busy seconds, and the histogram of waits in ``next()``.
"""

from __future__ import annotations

from typing import Any, Iterator


class LoaderCollector:
    """A ``prometheus_client`` collector reading ``loader.metrics_text()`` at each scrape."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def collect(self) -> Iterator[Any]:
        from prometheus_client.parser import text_string_to_metric_families

        yield from text_string_to_metric_families(self._loader.metrics_text())
