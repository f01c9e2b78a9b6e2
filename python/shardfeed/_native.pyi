"""Type stubs of the native module (see the ``shardfeed`` package docs)."""

from os import PathLike
from types import TracebackType
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

__version__: str

class ShardfeedError(Exception):
    """A failure other than a missing file, a permission problem or a bad option."""

Batch = dict[str, np.ndarray]
Size = int | str

class Loader:
    """Streams a dataset's batches for this rank; see the package docs."""

    def __init__(
        self,
        url: str | Mapping[str, float],
        batch_size: int,
        columns: Sequence[str] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        epoch: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = True,
        pad_to: int | None = None,
        pad_value: float = 0,
        prefetch: int | None = None,
        threads: int | None = None,
        storage_options: dict[str, str] | Sequence[tuple[str, str]] | None = None,
        cache_dir: str | PathLike[str] | None = None,
        *,
        cache_limit: Size | None = None,
        window: int | None = None,
        byte_budget: Size | None = None,
        pinning: str = "auto",
        io_concurrency: int | None = None,
        inject_latency_ms: float | None = None,
        inject_failure_rate: float | None = None,
        on_error: str = "fail",
        max_skipped: int | None = None,
        trace: str | PathLike[str] | None = None,
        slow_warning: tuple[float, int] | None = (0.25, 500),
        pack_to: int | None = None,
        pack_mode: str = "split",
        pack_column: str | None = None,
        eos_id: int | None = None,
        pad_id: int = 0,
        pack_window: int | None = None,
        max_segments: int | None = None,
        mix_stop: str = "first_exhausted",
        read_batch: int | None = None,
        decode_images: str | Sequence[str] | None = None,
        image_size: int | tuple[int, int] | None = None,
        crop: str = "random_resized",
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = False,
        channels_first: bool = False,
        max_image_pixels: int | None = None,
        decode_niceness: int | None = None,
        mapped_reads: bool = True,
        transform: Callable[[dict[str, np.ndarray], np.random.Generator], dict[str, np.ndarray]]
        | None = None,
        transform_threads: int | None = None,
        transform_processes: int | None = None,
        row_transform: Callable[[dict[str, Any], np.random.Generator], dict[str, Any]] | None = None,
        filter: Callable[[dict[str, Any]], bool] | None = None,
        transform_slabs: int = 0,
    ) -> None:
        """Build a loader; ``ValueError`` names a bad option.

        ``transform=fn`` (``shardfeed.Loader`` only): ``fn(batch, rng) -> batch`` runs on
        ``transform_threads`` threads (default: half the cores, 1 to 8; numpy releases the GIL)
        or in ``transform_processes`` spawned worker processes fed through shared memory (for
        GIL-bound Python; ``fn`` must be picklable), after collation; batches come back in plan
        order. ``rng`` is seeded from (seed, epoch, rank, batch index): the same for any number
        of threads or processes and after a resume. ``state_dict()`` is after the last batch
        delivered. A transform's exception, a worker that dies, or an output that is not a dict
        of numeric arrays raises ``ShardfeedError`` naming the batch (with the traceback);
        ``stats()["transform"]`` has the stage's busy fraction and latencies.
        ``filter=fn(row) -> bool`` and ``row_transform=fn(row, rng) -> row`` run per row (a
        row: a dict of numpy scalars and array views, None where null) on the same workers,
        before ``transform``; rows are collated back (equal shapes stacked, 1-D arrays of other
        lengths as values + ``.offsets``, str and bytes as UTF-8 bytes + ``.offsets``, lists of
        bytes, str or arrays as values + ``.offsets`` + ``.value_offsets``). Rows filtered out leave their batch smaller (every
        rank keeps its number of batches), counted in ``stats()["transform"]["filtered_rows"]``.
        A transform's outputs are copied once into slabs of the pool (pinned when it is) that
        ``transform_slabs`` adds for them (set by ``shardfeed.Loader``: twice the batches in
        flight; fewer when the pool would pass 4x ``byte_budget``); an output that finds none
        spare stays as the function made it (``stats()["transform"]["unpinned_batches"]``).

        ``url`` is a dataset or an index (``shardfeed.index``). ``columns``: the columns to
        read (default all); a field of a struct column is named by its path
        (``"image.bytes"``) and comes as a column of its own, and a struct named whole
        comes as all its fields.

        ``url`` may be a dict of datasets to weights (shares of rows): a
        mixture, blended exactly and deterministically (each next row from the
        source furthest below its share). ``mix_stop``: ``"first_exhausted"``
        (an epoch ends when a source runs out), ``"all_exhausted"`` (smaller
        sources repeat), ``"never"``. Every source must have the columns read,
        with the same types; batches get a ``source`` column.

        ``pack_to=L`` packs a token-list column (``pack_column``, default the
        only list column) into rows of exactly ``L`` tokens: ``input_ids``,
        ``position_ids`` (offset in the document), ``segment_ids`` (1, 2, ...
        per document of a row, 0 on padding) ``[B, L]`` int32, ``cu_seqlens``
        (segment boundaries in the flattened batch, padding runs included, for
        variable-length attention) and ``source`` (each segment's source, -1
        for padding). ``pack_mode="split"`` cuts documents at row ends (no
        padding; ``eos_id`` appended to each); ``"fit"`` places whole
        documents best-fit within ``pack_window`` documents (default 1000) and
        pads with ``pad_id``, at most ``max_segments`` per row.

        ``on_error="skip"`` leaves out a damaged row group (checksum mismatch,
        undecodable pages) instead of failing: the batches that held its rows
        are shorter, the same ones on every rank and after a resume, and
        ``stats()["skipped"]`` names it; past ``max_skipped`` (default 10) row
        groups the loader fails.

        ``decode_images`` names binary columns of encoded images (JPEG, PNG,
        WebP), or image structs with a binary ``bytes`` field (Hugging Face's
        ``image``, whose ``image.bytes`` is decoded): they are decoded, cropped, resized and flipped on the loader's
        threads into ``uint8`` ``[B, H, W, 3]`` (``[B, 3, H, W]`` with
        ``channels_first``) of ``image_size`` (default 224). ``crop``:
        ``"random_resized"`` (torchvision's ``RandomResizedCrop`` with
        ``scale`` and ``ratio``), ``"center"`` (``Resize`` + ``CenterCrop``) or
        ``"resize"`` (the whole image, stretched). ``flip`` flips half the
        images horizontally. Crops and flips are a function of (seed, epoch,
        row): the same with any thread count and after a resume. An image that
        does not decode (or has more than ``max_image_pixels``, default 40
        million) is an error naming shard, row group and row, or, with
        ``on_error="skip"``, its row is left out and named in
        ``stats()["skipped_images"]``.

        ``decode_niceness`` (0 to 19, default 6; Linux): how much lower the
        decode threads' scheduling priority is than the thread that starts an
        epoch, so that the one shuffle and one collate thread get short cores
        first; 0 schedules every stage alike.

        ``mapped_reads`` (default ``True``): read the byte-array and list
        column chunks (images, texts, token ids) of a local dataset's shards through a read-only
        mapping of each file, one copy fewer than ``pread``; a shard truncated or
        rewritten while it is read is an error naming it either way. Mapped
        reads install a ``SIGBUS`` handler once per process (chaining to the
        one before it): pass ``False`` where another component must own it.

        ``inject_latency_ms`` / ``inject_failure_rate`` read the dataset through
        a fault-injecting store (as ``shardfeed bench --inject-*``), for tests
        and benchmarks of remote behaviour.
        """
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...
    def __len__(self) -> int:
        """Batches per epoch for this rank (the same on every rank)."""
    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``, from its start."""
    @property
    def epoch(self) -> int:
        """The current epoch."""
    @property
    def pinning(self) -> str:
        """``"cuda"`` when slabs are page-locked, else ``"page-aligned"``."""
    def state_dict(self) -> dict[str, Any]:
        """Where the loader is (under 1 KB as JSON; a mixture's under 4 KB for 8 sources)."""
    def load_state_dict(
        self, state: dict[str, Any] | Sequence[dict[str, Any]], allow_changed: bool = False
    ) -> None:
        """Continue exactly where ``state`` was taken; ``ValueError`` if the
        state belongs to another dataset or order (naming what differs).

        A list of every rank's ``state_dict()`` from a job with another world
        size resumes elastically: the rest of the epoch is split over the new
        ranks, each row (and token) read once across both runs, except fewer
        than ``world_size`` rows per dataset and epoch. The one state of a
        single-rank job, given as it is, resumes so too. ``allow_changed=True``
        (mixtures) starts sources whose dataset or weight changed afresh. A loader whose
        ``window`` was left to ``byte_budget`` takes the state's window and an index's parts
        (a mixture's: each source's; the order follows them), so a job resumes under another
        ``byte_budget`` (or, for a mixture, other weights)."""
    def set_weights(self, weights: Mapping[str, float] | Sequence[float]) -> None:
        """Change a mixture's weights from the next batch on (recorded in the state)."""
    def stats(self) -> dict[str, Any]:
        """Counters: rows, bytes, batches, time to first batch, waits (``wait``: p50/p95/p99/max
        since start, ``wait_epoch``: this epoch), ``wait_fraction``, ``stages`` (busy fractions),
        ``bottleneck``, busy times, retries."""
    def metrics_text(self) -> str:
        """The counters in Prometheus's text format (``shardfeed_*``, ``rank`` label)."""
    def close(self) -> None:
        """Stop every thread and release the pool; held batches stay valid."""
    def __enter__(self) -> Loader: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

class SlabView:
    """The ``base`` of every batch array: keeps its slab leased."""

    @property
    def slab_address(self) -> int:
        """Address of the slab's first byte (page-locked when ``Loader.pinning == "cuda"``)."""
    @property
    def slab_bytes(self) -> int:
        """Bytes of the slab (the batch's arrays lie within them)."""
    @property
    def batch_index(self) -> int:
        """The batch's index in its epoch for this rank."""
    @property
    def shared(self) -> tuple[int, int, int, int] | None:
        """``(pid, fd, slab id, slab bytes)`` when the slab lies in memory other processes of
        this user can map (``/proc/<pid>/fd/<fd>``; the slabs of ``transform_processes``),
        else ``None``."""

def shard(
    inputs: str | Sequence[str],
    output: str,
    *,
    shard_size: Size | None = None,
    row_group_rows: int | None = None,
    row_group_size: Size | None = None,
    zstd_level: int | None = None,
    shuffle: bool | None = None,
    seed: int = 0,
    memory_budget: Size | None = None,
    threads: int = 0,
    overwrite: bool = False,
    format: str | None = None,
    storage_options: dict[str, str] | Sequence[tuple[str, str]] | None = None,
    temp_dir: str | PathLike[str] | None = None,
    task_index: int | None = None,
    num_tasks: int | None = None,
    stage: str = "both",
    wait_timeout: float = 3600.0,
    tokenizer: str | PathLike[str] | None = None,
    text_column: str = "text",
    tokens_column: str = "input_ids",
    add_eos: bool = False,
    eos_token: str | None = None,
    keep_text: bool = False,
    strict: bool = False,
    max_columns: int | None = None,
    follow_links: bool = False,
) -> dict[str, Any]:
    """Shard inputs into a dataset; returns the summary ``shardfeed shard --json`` prints.

    Rows are shuffled globally unless ``shuffle=False`` (seeded by ``seed``).
    With ``task_index`` and ``num_tasks``: that task of a split run (see
    ``shard_task``), which shuffles across tasks only with ``shuffle=True``.
    With ``tokenizer`` (a Hugging Face ``tokenizer.json``): ``text_column`` is
    encoded (the same ids as the ``tokenizers`` package's ``encode_batch``)
    into ``tokens_column`` (``list<int32>``) plus ``num_tokens``; ``add_eos``
    appends the end-of-text id; null texts are skipped and counted unless
    ``strict=True``. ``max_columns`` admits more columns than the memory
    budget holds (about 64 KiB each while writing); ``follow_links`` reads what
    a folder's symbolic links lead to outside it (skipped and listed by
    default). Bounds: docs/LIMITS.md.
    """

def commit(output: str, *, storage_options: dict[str, str] | None = None) -> dict[str, Any]:
    """Write the manifest once every task finished; raises ShardfeedError naming missing tasks."""

def index(
    inputs: str | list[str],
    output: str,
    *,
    checksums: bool = False,
    update: bool = False,
    overwrite: bool = False,
    concurrency: int = 64,
    storage_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write an index at ``output`` over existing Parquet files, read where they lie.

    ``inputs``: local files, folders (their ``*.parquet`` files), globs, ``s3://``,
    ``gs://``, ``az://`` and ``http(s)://`` prefixes and globs, or Hugging Face Hub datasets
    (``hf://datasets/ORG/NAME[@REV]/PATH_GLOB``, pinned to the revision's commit). Only footers are read; every
    file must share one schema (a column may be nullable in some files only). ``checksums``
    reads every byte once and records checksums the loader then verifies; ``update`` adds
    files not yet in the index at ``output``, keeping its entries and order, and names the
    files it lists that its inputs' listing no longer finds or finds changed (``gone``,
    ``changed``: kept as indexed, refused by loaders); ``overwrite`` replaces what ``output``
    holds. ``Loader(output)`` then reads the files in place. Returns the summary: ``index``,
    ``files``, ``added``, ``rows``, ``bytes``, ``row_groups``, ``bases``, ``checksums``,
    ``gone``, ``changed``.
    """

def inspect(
    url: str,
    *,
    storage_options: dict[str, str] | None = None,
    images: bool = False,
    sample: int = 10000,
) -> dict[str, Any]:
    """The dataset's summary, as ``shardfeed inspect --json`` prints it; with ``images=True``
    also ``"images"``: per binary column, image formats, size ranges and unreadable rows over
    the first ``sample`` rows (0: all)."""

def verify(
    url: str, *, threads: int = 0, storage_options: dict[str, str] | None = None
) -> dict[str, Any]:
    """Check every shard against the manifest; the report has ``"ok"`` and ``"problems"``."""

def cli_main(argv: list[str]) -> int:
    """Run the ``shardfeed`` command with ``argv`` (the program's name first); its exit code."""
