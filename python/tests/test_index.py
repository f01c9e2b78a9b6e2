"""Existing Parquet files read in place through an index (`shardfeed index`):
every row exactly once per epoch at world sizes 1 and 3, values equal to
pyarrow's reading of the same files; changed files are errors naming them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardfeed
from conftest import s3_client

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("x", pa.float64()),
        pa.field("tokens", pa.list_(pa.int32())),
        pa.field("text", pa.string()),
    ]
)


def make_table(start: int, n: int) -> pa.Table:
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + n, dtype=np.int64)
    x = [None if i % 11 == 3 else float(v) for i, v in zip(ids, rng.random(n))]
    tokens = [None if i % 13 == 5 else list(range(int(i) % 9)) for i in ids]
    text = [None if i % 17 == 2 else f"row {i} " * int(i % 4) for i in ids]
    return pa.table([ids, x, tokens, text], schema=SCHEMA)


def write_files(folder: Path, writer: str, rows: int, files: int, **options) -> pa.Table:
    """`files` Parquet files of `rows` rows each under `folder`, written by `writer`."""
    folder.mkdir(parents=True, exist_ok=True)
    tables = []
    for f in range(files):
        table = make_table(f * rows, rows)
        tables.append(table)
        path = folder / f"part-{f:03d}.parquet"
        if writer == "pyarrow":
            pq.write_table(table, path, **options)
        elif writer == "polars":
            pl = pytest.importorskip("polars")
            pl.from_arrow(table).write_parquet(path, **options)
        elif writer == "duckdb":
            duckdb = pytest.importorskip("duckdb")
            con = duckdb.connect()
            con.register("t", table)
            con.execute(f"COPY t TO '{path}' (FORMAT parquet, {options.get('duck', 'ROW_GROUP_SIZE 2048')})")
            con.close()
    return pa.concat_tables(tables)


def indexed(tmp_path: Path, table: pa.Table, row_group_size: int) -> str:
    """`table` written by pyarrow as one file of `data/` and indexed: the index's path."""
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(table, data / "part-0.parquet", row_group_size=row_group_size)
    index = str(tmp_path / "index")
    shardfeed.index(str(data), index)
    return index


def expected_rows(table: pa.Table) -> dict[int, tuple]:
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    return {
        i: (cols["x"][k], cols["tokens"][k], cols["text"][k]) for k, i in enumerate(cols["id"])
    }


def read_rows(index: str, world: int = 1, rank: int = 0, **options) -> list[tuple]:
    """Every row a rank gets in one epoch, as (id, x, tokens, text)."""
    out = []
    with shardfeed.Loader(
        index, 97, seed=5, drop_last=False, world_size=world, rank=rank, **options
    ) as loader:
        for batch in loader:
            ids = batch["id"].tolist()
            x, x_valid = batch["x"].tolist(), batch["x.validity"].tolist()
            lists = shardfeed.rows(batch, "tokens")
            lists_valid = batch["tokens.validity"].tolist()
            texts = shardfeed.strings(batch, "text")
            for k, i in enumerate(ids):
                out.append(
                    (
                        i,
                        x[k] if x_valid[k] else None,
                        lists[k].tolist() if lists_valid[k] else None,
                        texts[k],
                    )
                )
    return out


def resumed_ids(index: str, batches: int, **options) -> list[int]:
    """An epoch's ids (as `read_rows` reads it), in two runs: `batches` batches, then the
    rest from a new loader resumed from the first one's state."""
    loader = shardfeed.Loader(index, 97, seed=5, drop_last=False, **options)
    it = iter(loader)
    head = [i for _ in range(batches) for i in next(it)["id"].tolist()]
    state = loader.state_dict()
    loader.close()
    resumed = shardfeed.Loader(index, 97, seed=5, drop_last=False, **options)
    resumed.load_state_dict(state)
    return head + [i for b in resumed for i in b["id"].tolist()]


def check_every_row_once(index: str, table: pa.Table, **options) -> None:
    expected = expected_rows(table)
    n = len(expected)
    got = read_rows(index, **options)
    assert sorted(r[0] for r in got) == sorted(expected)
    for i, *values in got:
        assert tuple(values) == expected[i], f"row {i}"
    # World size 3: ranks split the epoch; padded to a multiple of 3 by
    # wrapping around, as PyTorch's DistributedSampler does.
    ranks = [read_rows(index, world=3, rank=r, **options) for r in range(3)]
    per_rank = -(-n // 3)
    assert [len(r) for r in ranks] == [per_rank] * 3
    ids = [row[0] for r in ranks for row in r]
    assert set(ids) == set(expected)
    assert len(ids) - len(set(ids)) == per_rank * 3 - n
    for r in ranks:
        for i, *values in r:
            assert tuple(values) == expected[i]


WRITERS = [
    pytest.param("pyarrow", 3000, 3, dict(row_group_size=1000), id="pyarrow-snappy-v1-dict"),
    pytest.param(
        "pyarrow",
        700,
        2,
        dict(row_group_size=7, data_page_version="2.0", use_dictionary=False),
        id="pyarrow-v2-plain-rg7",
    ),
    pytest.param("pyarrow", 40, 2, dict(row_group_size=1, compression="zstd"), id="pyarrow-zstd-rg1"),
    pytest.param("pyarrow", 2000, 1, dict(compression="gzip", write_statistics=False), id="pyarrow-gzip"),
    pytest.param("pyarrow", 2000, 1, dict(compression="brotli", write_page_index=True), id="pyarrow-brotli"),
    pytest.param("pyarrow", 2000, 1, dict(compression="lz4"), id="pyarrow-lz4"),
    pytest.param("pyarrow", 2000, 1, dict(compression="none"), id="pyarrow-uncompressed"),
    pytest.param(
        "pyarrow",
        200_000,
        1,
        dict(row_group_size=200_000, column_encoding={"id": "DELTA_BINARY_PACKED"}, use_dictionary=["text"]),
        id="pyarrow-rg200k-delta",
    ),
    pytest.param("polars", 5000, 2, dict(row_group_size=2048), id="polars"),
    pytest.param("duckdb", 5000, 2, {}, id="duckdb"),
]


@pytest.mark.parametrize("writer,rows,files,options", WRITERS)
def test_every_row_once_with_pyarrows_values(tmp_path, writer, rows, files, options):
    table = write_files(tmp_path / "data", writer, rows, files, **options)
    index = str(tmp_path / "index")
    summary = shardfeed.index(str(tmp_path / "data"), index)
    assert summary["files"] == files and summary["rows"] == rows * files
    # Only the index was written: no byte of data copied.
    assert sorted(p.name for p in Path(index).iterdir()) == ["manifest.json"]
    check_every_row_once(index, table)


LARGE_GROUPS = [
    pytest.param(dict(compression="snappy", use_dictionary=["tokens"]), id="snappy-v1-dict"),
    pytest.param(dict(compression="zstd", use_dictionary=False), id="zstd-v1-plain"),
    pytest.param(
        dict(compression="lz4", data_page_version="2.0", use_dictionary=["tokens"]), id="lz4-v2"
    ),
    pytest.param(
        dict(compression="none", write_page_index=True, use_dictionary=["tokens"]),
        id="offset-index",
    ),
]


@pytest.mark.parametrize("options", LARGE_GROUPS)
def test_row_groups_larger_than_the_budget_are_read_in_parts(tmp_path, options):
    """Files of one large row group each, of many small pages: a budget that cannot hold
    two windows of whole row groups reads them in parts (the pages that cover each part,
    checked against the index's page checksums), every row once with pyarrow's values, at
    world sizes 1 and 3, resumable."""
    data = tmp_path / "data"
    table = write_files(
        data, "pyarrow", 40_000, 2, row_group_size=40_000, data_page_size=4096, **options
    )
    index = str(tmp_path / "index")
    # With checksums: every part's pages are checked against them.
    shardfeed.index(str(data), index, checksums=True)
    group = max(
        pq.ParquetFile(p).metadata.row_group(0).total_byte_size for p in sorted(data.iterdir())
    )
    budget = 1 << 20
    assert group > budget // 4
    with shardfeed.Loader(index, 97, byte_budget=budget) as loader:
        part_rows = loader.state_dict()["part_rows"]
    assert 0 < part_rows < 40_000
    check_every_row_once(index, table, byte_budget=budget)
    whole = [r[0] for r in read_rows(index, byte_budget=budget)]
    assert resumed_ids(index, 9, byte_budget=budget) == whole
    # Parts are fetched as the pages that cover them: a few times the files' bytes in an
    # epoch at this tiny budget (parts of ~300 rows, pages of ~1,000), not a row group per
    # part (over 100 times).
    with shardfeed.Loader(index, 97, byte_budget=budget, seed=5) as loader:
        for _ in loader:
            pass
        fetched = loader.stats()["fetched_bytes"]
    files = sum(p.stat().st_size for p in data.iterdir())
    assert fetched < 10 * files
    assert 40_000 // part_rows > 10


def test_parts_and_windows_resume_under_another_byte_budget(tmp_path):
    """An index's parts and windows follow `byte_budget` (parts of 188 rows in windows of 2
    at 8 MB here, 1,500 in windows of 3 at 16 MB): a state resumes under another budget with
    its own, the same batches as the uninterrupted run; a budget that cannot hold them, or
    parts the row groups are not cut into, is refused naming them."""
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for f in range(2):
        ids = [rng.integers(0, 50_000, 200, dtype=np.int32) for _ in range(3000)]
        pq.write_table(
            pa.table({"id": np.arange(f * 3000, (f + 1) * 3000),
                      "t": pa.array(ids, pa.list_(pa.int32()))}),
            data / f"{f}.parquet", row_group_size=3000,
        )
    index = str(tmp_path / "index")
    shardfeed.index(str(data), index)
    order = lambda s: (s["window"], s["part_rows"])  # noqa: E731
    with shardfeed.Loader(index, 16, seed=3, byte_budget="8MB") as small:
        assert order(small.state_dict()) == (2, 188)
        it = iter(small)
        for _ in range(30):
            next(it)
        state = small.state_dict()
        rest = [b["id"].tolist() for b in it]
    with shardfeed.Loader(index, 16, seed=3, byte_budget="16MB") as large:
        assert order(large.state_dict()) == (3, 1500)
        next(iter(large))
        wide = large.state_dict()
        large.load_state_dict(state)
        assert [b["id"].tolist() for b in large] == rest
        assert order(large.state_dict()) == (2, 188)
    with shardfeed.Loader(index, 16, seed=3, byte_budget="8MB") as small:
        with pytest.raises(ValueError, match=r"windows of 3 .*parts of 1500 rows.*byte_budget"):
            small.load_state_dict(wide)
        with pytest.raises(ValueError, match="parts of 11 rows, which"):
            small.load_state_dict(dict(wide, part_rows=11))


def test_globs_update_and_checksums(tmp_path):
    data = tmp_path / "data"
    first = write_files(data / "a", "pyarrow", 500, 2, row_group_size=100)
    index = str(tmp_path / "index")
    assert shardfeed.index(str(data / "a" / "*.parquet"), index)["files"] == 2
    with pytest.raises(FileExistsError, match="already exists"):
        shardfeed.index(str(data / "a"), index)
    # New files are appended; the old entries keep their place.
    (data / "b").mkdir()
    second = make_table(10_000, 300)
    pq.write_table(second, data / "b" / "more.parquet")
    before = json.loads(Path(index, "manifest.json").read_text())["shards"]
    summary = shardfeed.index([str(data / "a"), str(data / "b")], index, update=True)
    assert (summary["files"], summary["added"]) == (3, 1)
    after = json.loads(Path(index, "manifest.json").read_text())["shards"]
    assert after[:2] == before
    check_every_row_once(index, pa.concat_tables([first, second]))
    # Checksums: recorded, then verified.
    checked = str(tmp_path / "checked")
    assert shardfeed.index(str(data / "a"), checked, checksums=True)["checksums"]
    assert shardfeed.verify(checked)["ok"]
    assert shardfeed.inspect(checked)["index"]["checksums"] is True


def test_update_names_the_files_gone_or_changed_since_indexing(tmp_path, caplog):
    """`update` keeps the files it indexed before as they were, and names those its listing
    no longer finds or finds changed (a loader refuses them): in its summary and a warning.
    Files under a base it does not list are not judged."""
    data = tmp_path / "data"
    write_files(data, "pyarrow", 300, 3, row_group_size=100)
    index = str(tmp_path / "index")
    shardfeed.index(str(data), index)
    (data / "part-000.parquet").unlink()
    pq.write_table(make_table(5000, 400), data / "part-001.parquet")  # rewritten: another size
    st = (data / "part-002.parquet").stat()  # touched: the same bytes, a new time
    os.utime(data / "part-002.parquet", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    pq.write_table(make_table(9000, 100), data / "part-003.parquet")  # new
    with caplog.at_level("WARNING"):
        summary = shardfeed.index(str(data), index, update=True)
    assert (summary["files"], summary["added"]) == (4, 1)
    assert [Path(u).name for u in summary["gone"]] == ["part-000.parquet"]
    assert sorted(Path(u).name for u in summary["changed"]) == ["part-001.parquet",
                                                                 "part-002.parquet"]
    assert any("part-000.parquet" in r.getMessage() and "no longer found" in r.getMessage()
               for r in caplog.records)
    # What it says is what a loader meets.
    message = first_error(index)
    assert any(name in message for name in ("part-000", "part-001", "part-002")), message
    # A glob lists only what it matches: the files it leaves out are not gone.
    summary = shardfeed.index(str(data / "part-003*.parquet"), index, update=True)
    assert (summary["added"], summary["gone"]) == (0, [])
    # Another base's listing judges none of these.
    write_files(tmp_path / "other", "pyarrow", 100, 1)
    summary = shardfeed.index(str(tmp_path / "other"), index, update=True)
    assert (summary["added"], summary["gone"], summary["changed"]) == (1, [], [])


def test_a_file_of_another_schema_is_refused_by_name(tmp_path):
    data = tmp_path / "data"
    write_files(data, "pyarrow", 100, 1)
    other = make_table(100, 10).set_column(1, "x", pa.array(["s"] * 10))
    pq.write_table(other, data / "part-zzz.parquet")
    with pytest.raises(shardfeed.ShardfeedError, match=r"part-zzz\.parquet.*column `x`"):
        shardfeed.index(str(data), str(tmp_path / "index"))
    assert not (tmp_path / "index" / "manifest.json").exists()


def test_not_parquet_is_refused_by_name(tmp_path):
    data = tmp_path / "data"
    write_files(data, "pyarrow", 100, 1)
    (data / "broken.parquet").write_bytes(b"PAR1" + b"\0" * 100)
    with pytest.raises(shardfeed.ShardfeedError, match=r"broken\.parquet.*not a Parquet file"):
        shardfeed.index(str(data), str(tmp_path / "index"))


def first_error(index: str, **options) -> str:
    # A file gone is FileNotFoundError; any other change ShardfeedError.
    with pytest.raises((shardfeed.ShardfeedError, FileNotFoundError)) as err:
        with shardfeed.Loader(index, 64, **options) as loader:
            for _ in loader:
                pass
    return str(err.value)


@pytest.mark.parametrize("change", ["rewritten", "truncated", "deleted", "touched"])
def test_a_file_changed_after_indexing_is_an_error_naming_it(tmp_path, change):
    data = tmp_path / "data"
    write_files(data, "pyarrow", 1000, 2, row_group_size=250)
    index = str(tmp_path / "index")
    shardfeed.index(str(data), index)
    victim = data / "part-001.parquet"
    if change == "rewritten":
        pq.write_table(make_table(5000, 1000), victim, row_group_size=250)
    elif change == "truncated":
        victim.write_bytes(victim.read_bytes()[:-100])
    elif change == "deleted":
        victim.unlink()
    else:
        # Same bytes, a new modification time: the fingerprint says changed.
        st = victim.stat()
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    message = first_error(index)
    assert "part-001.parquet" in message
    # Skipped and counted when asked to.
    with shardfeed.Loader(index, 64, on_error="skip", drop_last=False) as loader:
        ids = [i for batch in loader for i in batch["id"].tolist()]
        skipped = loader.stats()["skipped"]
        assert sorted(s["row_group"] for s in skipped) == [0, 1, 2, 3]
        assert all(s["shard"].endswith("part-001.parquet") for s in skipped)
    assert sorted(ids) == list(range(1000))
    assert not shardfeed.verify(index)["ok"]


def test_a_damaged_byte_is_the_checksum_error(tmp_path):
    data = tmp_path / "data"
    write_files(data, "pyarrow", 1000, 1, row_group_size=250, compression="none")
    index = str(tmp_path / "index")
    shardfeed.index(str(data), index, checksums=True)
    victim = data / "part-000.parquet"
    raw = bytearray(victim.read_bytes())
    raw[200] ^= 0xFF
    st = victim.stat()
    victim.write_bytes(bytes(raw))
    # The same size and time: only the checksum can tell.
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    message = first_error(index)
    assert "part-000.parquet" in message and "checksum" in message


@pytest.mark.parametrize("column", ["flag", "id"])
def test_damage_in_a_compressed_page_names_the_column(tmp_path, column):
    """Without checksums, a gzip stream that no longer decompresses is an error naming the
    file, the row group and the column, whether parquet's reader decodes the column for the
    loader (booleans) or the own decoders do (integers, their gzip pages read by parquet's
    page reader)."""
    data = tmp_path / "data"
    data.mkdir()
    n = 4000
    table = pa.table({"id": np.arange(n), "flag": np.arange(n) % 3 == 0})
    pq.write_table(table, data / "part-0.parquet", row_group_size=n, compression="gzip")
    index = str(tmp_path / "index")
    shardfeed.index(str(data), index)
    victim = data / "part-0.parquet"
    chunk = pq.ParquetFile(victim).metadata.row_group(0).column(["id", "flag"].index(column))
    assert chunk.path_in_schema == column
    raw = bytearray(victim.read_bytes())
    # A byte of the gzip stream of the column's last page (past its header): the stream's
    # checksum no longer matches.
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    at = start + chunk.total_compressed_size - 12
    raw[at] ^= 0xFF
    st = victim.stat()
    victim.write_bytes(bytes(raw))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    message = first_error(index, columns=[column])
    assert "part-0.parquet" in message and "row group 0" in message
    assert {"flag": "column flag (parquet's reader)", "id": "column id"}[column] in message
    # The other column reads.
    other = {"flag": "id", "id": "flag"}[column]
    with shardfeed.Loader(index, 64, columns=[other], drop_last=False) as loader:
        assert sum(len(b[other]) for b in loader) == n


MUTATE = r'''
import json, os, random, struct, sys
import shardfeed
data, index, first, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
files = sorted(os.path.join(data, f) for f in os.listdir(data))
for case in range(first, first + count):
    g = random.Random(case)
    path = g.choice(files)
    original = open(path, "rb").read()
    st = os.stat(path)
    raw = bytearray(original)
    (footer,) = struct.unpack("<I", raw[-8:-4])
    end = len(raw) - 8 - footer  # the data: the footer (fingerprinted) stays as it is
    for _ in range(g.randint(1, 3)):
        at = g.randrange(4, end - 8)
        how = g.randrange(4)
        if how == 0:
            raw[at] ^= 1 << g.randrange(8)
        elif how == 1:
            word = g.choice([0xFFFFFFFF, 0x7FFFFFF0, 0x80000000, len(raw) + g.randrange(4096)])
            raw[at:at + 4] = struct.pack("<I", word)
        elif how == 2:
            raw[at:at + 8] = struct.pack("<Q", g.choice([2**63 - 1, 2**40, 2**32 + 7]))
        else:
            k = g.randrange(1, 32)
            raw[at:at + k] = bytes(g.randrange(256) for _ in range(k))
    # The same size and modification time: only the decoders can tell.
    with open(path, "r+b") as f:
        f.write(raw)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    skip = g.random() < 0.4
    options = dict(seed=case, drop_last=False, on_error="skip" if skip else "fail",
                   max_skipped=100)
    if g.random() < 0.3:
        options["columns"] = ["id", g.choice(["x", "tokens", "text"])]
    result = {"case": case, "file": os.path.basename(path), "skip": skip}
    try:
        with shardfeed.Loader(index, g.choice([1, 64, 1000]), **options) as loader:
            result["rows"] = sum(len(b["id"]) for b in loader)
            result["skipped"] = [(s["shard"], s["row_group"]) for s in loader.stats()["skipped"]]
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        with open(path, "r+b") as f:
            f.write(original)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    print(json.dumps(result), flush=True)
'''


def test_mutated_files_read_in_place_end_in_their_rows_or_an_error_naming_them(tmp_path):
    """Bytes of the data of indexed files (no checksums) mutated in place, size and time
    kept (flipped bits, lengths set to extremes, random runs), read through the index with
    every decode path (dictionary, plain, delta; snappy, zstd, gzip, none; V1 and V2 pages;
    nullable lists, strings and floats): each read ends in every row (the values may be
    wrong: nothing can tell without checksums), in an error naming the file and row group,
    or under on_error="skip" in every row but those of the row groups it names. Never a
    panic, never a hang, never rows lost without a word. `SHARDFEED_FUZZ_CASES` sets the
    number of cases (40 in CI; 300 ran clean when it was written)."""
    import subprocess
    import sys

    data = tmp_path / "data"
    data.mkdir()
    rows, group = 3000, 1000
    variants = [
        dict(compression="snappy"),
        dict(compression="zstd", data_page_version="2.0"),
        dict(compression="gzip", use_dictionary=False),
        dict(compression="none", use_dictionary=False, data_page_version="2.0",
             column_encoding={"id": "DELTA_BINARY_PACKED", "text": "DELTA_BYTE_ARRAY"}),
    ]
    for f, options in enumerate(variants):
        pq.write_table(make_table(f * rows, rows), data / f"part-{f:03d}.parquet",
                       row_group_size=group, data_page_size=2048, **options)
    index = str(tmp_path / "index")
    shardfeed.index(str(data), index)
    cases = int(os.environ.get("SHARDFEED_FUZZ_CASES", "40"))
    try:
        out = subprocess.run([sys.executable, "-c", MUTATE, str(data), index, "0", str(cases)],
                             capture_output=True, text=True, timeout=60 + 5 * cases)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a read did not end; the last cases: {(e.stdout or b'')[-600:]!r}")
    assert out.returncode == 0, out.stderr[-2000:]
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(results) == cases
    total = rows * len(variants)
    errors = 0
    for r in results:
        if "error" in r:
            errors += 1
            assert "panic" not in r["error"].lower(), r
            assert r["file"] in r["error"] and "row group" in r["error"], r
        else:
            assert all(shard.endswith(r["file"]) for shard, _ in r["skipped"]), r
            assert r["skip"] or not r["skipped"], r
            assert r["rows"] == total - group * len(r["skipped"]), r
    # The mutations do reach the decoders: most cases are errors or skips.
    assert errors + sum(bool(r.get("skipped")) for r in results) >= cases // 4, results


def test_parts_are_checked_page_by_page(tmp_path):
    """Row groups read in parts (pages, not whole chunks) are checked against the index's
    page checksums: a damaged value in a plain, uncompressed page (which no decoder can
    notice) is the checksum error naming the file and the column, or a counted skip; an
    index without checksums reads the wrong value."""
    data = tmp_path / "data"
    options = dict(row_group_size=40_000, data_page_size=4096, compression="none")
    table = write_files(data, "pyarrow", 40_000, 2, use_dictionary=False, **options)
    checked, plain = str(tmp_path / "checked"), str(tmp_path / "plain")
    shardfeed.index(str(data), checked, checksums=True)
    shardfeed.index(str(data), plain)
    pages = json.loads(Path(checked, "manifest.json").read_text())["shards"][0]["page_checksums"]
    assert pages.count(";") >= 3  # every column of the row group, many pages each
    budget = 1 << 20
    with shardfeed.Loader(checked, 97, byte_budget=budget) as loader:
        assert 0 < loader.state_dict()["part_rows"] < 40_000
    check_every_row_once(checked, table, byte_budget=budget)
    assert shardfeed.verify(checked)["ok"]
    # A page checksum of the index altered: verify finds it (the chunks' sums still hold).
    forged = tmp_path / "forged"
    forged.mkdir()
    manifest = json.loads(Path(checked, "manifest.json").read_text())
    entry = manifest["shards"][0]
    head, tail = entry["page_checksums"][:-1], entry["page_checksums"][-1]
    entry["page_checksums"] = head + ("0" if tail != "0" else "1")
    (forged / "manifest.json").write_text(json.dumps(manifest))
    report = shardfeed.verify(str(forged))
    assert not report["ok"] and "page at byte" in json.dumps(report)
    # Id 45,678 (file 1) made 45,679 where it lies, the file's size and time kept.
    victim = data / "part-001.parquet"
    raw = bytearray(victim.read_bytes())
    at = raw.find(np.int64(45_678).tobytes())
    assert at > 0 and raw.find(np.int64(45_678).tobytes(), at + 1) < 0
    raw[at] += 1
    st = victim.stat()
    victim.write_bytes(bytes(raw))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    message = first_error(checked, byte_budget=budget)
    assert "part-001.parquet" in message and "column `id` page" in message
    assert "checksum" in message
    with shardfeed.Loader(
        checked, 97, byte_budget=budget, on_error="skip", drop_last=False
    ) as loader:
        ids = [i for batch in loader for i in batch["id"].tolist()]
        skipped = loader.stats()["skipped"]
    assert skipped and all(s["shard"].endswith("part-001.parquet") for s in skipped)
    assert 45_678 not in ids and len(ids) < 80_000
    assert len(ids) == len(set(ids))
    # Without checksums nothing can tell: the damaged value is read.
    got = sorted(r[0] for r in read_rows(plain, byte_budget=budget))
    assert 45_678 not in got and got.count(45_679) == 2


def test_lists_of_lists_load_as_each_rows_inner_lists(tmp_path):
    """`list<list<float32>>` (bounding boxes: null rows, empty rows, inner lists of any
    length), `large_list<list<int64>>` and `list<fixed_size_list<float32, 4>>` load as each
    row's inner lists, with pyarrow's values, in place, from shards, and through a mixture of
    the two."""
    n = 3000
    bbox = [None if i % 11 == 3 else
            [[float(i), float(k), 1.5, 2.5][: (i + k) % 5] for k in range(i % 4)] for i in range(n)]
    nested = [[list(range(i % 3 + k)) for k in range(i % 2)] for i in range(n)]
    # Hugging Face's Sequence(Sequence(float32, length=4)): fixed-size inner lists, some
    # null (read as empty), some with a null value (read as zero).
    boxes = [[None if (i + k) % 5 == 0 else [float(k), None if i % 6 == 0 else 2.0, 3.0, 4.0]
              for k in range(i % 3)] for i in range(n)]
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "bbox": pa.array(bbox, pa.list_(pa.list_(pa.float32()))),
        "nested": pa.array(nested, pa.large_list(pa.list_(pa.int64()))),
        "boxes": pa.array(boxes, pa.list_(pa.list_(pa.float32(), 4))),
    })
    want_boxes = [[[] if b is None else [0.0 if v is None else v for v in b] for b in r]
                  for r in boxes]
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(table.slice(0, 1500), data / "a.parquet", row_group_size=300)
    pq.write_table(table.slice(1500), data / "b.parquet", row_group_size=300)
    index, sharded = str(tmp_path / "index"), str(tmp_path / "sharded")
    shardfeed.index(str(data), index)
    shardfeed.shard(str(data), sharded, row_group_rows=256)

    def check(source, batches=None):
        seen = []
        with shardfeed.Loader(source, 64, seed=3, drop_last=False) as loader:
            for k, batch in enumerate(loader):
                if batches is not None and k == batches:
                    break
                assert batch["bbox"].dtype == np.float32 and batch["nested"].dtype == np.int64
                with pytest.raises(shardfeed.ShardfeedError, match="shardfeed.rows"):
                    shardfeed.strings(batch, "bbox")
                valid = batch["bbox.validity"].tolist()
                boxes, lists = shardfeed.rows(batch, "bbox"), shardfeed.rows(batch, "nested")
                for r, i in enumerate(batch["id"].tolist()):
                    got = [b.tolist() for b in boxes[r]] if valid[r] else None
                    assert got == bbox[i], f"row {i}"
                    assert [v.tolist() for v in lists[r]] == nested[i], f"row {i}"
                    got = [b.tolist() for b in shardfeed.rows(batch, "boxes")[r]]
                    assert got == want_boxes[i], f"row {i}"
                    seen.append(i)
        return seen

    assert sorted(check(index)) == list(range(n))
    assert sorted(check(sharded)) == list(range(n))
    assert len(check({index: 0.5, sharded: 0.5}, batches=40)) == 40 * 64


def test_resume_and_a_mixture_with_a_sharded_dataset(tmp_path):
    data = tmp_path / "data"
    table = write_files(data, "pyarrow", 2000, 2, row_group_size=200)
    index = str(tmp_path / "index")
    shardfeed.index(str(data), index)
    whole = [r[0] for r in read_rows(index)]
    assert resumed_ids(index, 7) == whole
    # A mixture of the index and a dataset sharded from the same files.
    sharded = str(tmp_path / "sharded")
    shardfeed.shard(str(data), sharded, row_group_rows=256)
    with shardfeed.Loader({index: 0.5, sharded: 0.5}, 64, columns=["id", "x"], seed=1) as mix:
        ids = [i for _, batch in zip(range(20), mix) for i in batch["id"].tolist()]
    assert len(ids) == 20 * 64 and set(ids) <= set(table.column("id").to_pylist())


def test_elastic_resume_on_an_index_from_2_ranks_to_3(tmp_path):
    data = tmp_path / "data"
    table = write_files(data, "pyarrow", 1500, 2, row_group_size=150)
    index = str(tmp_path / "index")
    shardfeed.index(str(data), index)
    seen, states = [], []
    for rank in range(2):
        loader = shardfeed.Loader(index, 50, seed=9, rank=rank, world_size=2)
        it = iter(loader)
        seen += [i for _ in range(6) for i in next(it)["id"].tolist()]
        states.append(loader.state_dict())
        loader.close()
    for rank in range(3):
        loader = shardfeed.Loader(index, 50, seed=9, rank=rank, world_size=3)
        loader.load_state_dict(states)
        seen += [i for batch in loader for i in batch["id"].tolist()]
    # Every row of the epoch exactly once (3000 rows split evenly: no padding).
    assert sorted(seen) == sorted(table.column("id").to_pylist())


def test_s3_files_indexed_and_read_in_place(tmp_path, moto_s3):
    data = tmp_path / "data"
    table = write_files(data, "pyarrow", 1500, 3, row_group_size=300)
    s3 = s3_client(moto_s3)
    for f in sorted(data.iterdir()):
        s3.upload_file(str(f), "test-bucket", f"raw/{f.name}")
    s3.put_object(Bucket="test-bucket", Key="raw/_SUCCESS", Body=b"")
    index = str(tmp_path / "index")
    summary = shardfeed.index("s3://test-bucket/raw", index, storage_options=moto_s3)
    assert summary["files"] == 3 and summary["bases"] == ["s3://test-bucket/raw"]
    expected = expected_rows(table)
    got = read_rows(index, storage_options=moto_s3)
    assert sorted(r[0] for r in got) == sorted(expected)
    assert all(tuple(v) == expected[i] for i, *v in got)
    # Replaced after indexing: the ETag differs, the read is refused by name.
    s3.put_object(Bucket="test-bucket", Key="raw/part-001.parquet", Body=(data / "part-000.parquet").read_bytes())
    message = first_error(index, storage_options=moto_s3)
    assert "part-001.parquet" in message and "changed since it was indexed" in message


def test_an_index_cannot_point_outside_its_bases(tmp_path):
    data = tmp_path / "data"
    write_files(data, "pyarrow", 100, 1)
    index = tmp_path / "index"
    shardfeed.index(str(data), str(index))
    manifest = json.loads((index / "manifest.json").read_text())
    forgeries = [
        ("../secret.parquet", None),
        ("a/../../secret.parquet", None),
        ("/etc/passwd", None),
        ("part-000.parquet", "https://user:hunter2@example.com/data"),
        ("part-000.parquet", "s3://bucket/data?X-Amz-Signature=hunter2"),
    ]
    for path, base in forgeries:
        forged = json.loads(json.dumps(manifest))
        forged["shards"][0]["path"] = path
        if base:
            forged["index"]["bases"][0] = base
        (index / "manifest.json").write_text(json.dumps(forged))
        with pytest.raises(shardfeed.ShardfeedError) as err:
            shardfeed.Loader(str(index), 10)
        assert "hunter2" not in str(err.value)


class FakeHub:
    """The two Hub endpoints `index hf://` uses (a revision's commit, a commit's file tree,
    paged two files at a time) and `resolve/` range reads, on 127.0.0.1, over real Parquet
    files. Repositories: `org/public`, and `org/private`, which wants `Bearer hf_secret`."""

    def __init__(self, root: Path):
        import hashlib
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.commits: dict[str, dict[str, bytes]] = {}
        self.refs: dict[tuple[str, str], str] = {}
        self.resolve_auth: list[str | None] = []
        # Answers the API gives before its real ones, one a request: an HTTP status, or "reset".
        self.api_faults: list[int | str] = []
        # Set to another FakeHub: `resolve/` redirects there (the Hub's CDN), by another host name.
        self.cdn: FakeHub | None = None
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code, body=b"", headers=()):
                self.send_response(code)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                from urllib.parse import parse_qs, unquote, urlparse

                url = urlparse(self.path)
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                auth = self.headers.get("Authorization")
                if parts[:2] == ["api", "datasets"]:
                    repo = "/".join(parts[2:4])
                elif parts[:1] == ["datasets"]:
                    repo = "/".join(parts[1:3])
                else:
                    return self.reply(404)
                if hub.cdn is not None and parts[3:4] == ["resolve"]:
                    port = hub.cdn.server.server_address[1]
                    return self.reply(302, headers=[("Location", f"http://localhost:{port}{self.path}")])
                if repo == "org/private" and auth != "Bearer hf_secret" and hub.cdn is None and not hub.is_cdn:
                    return self.reply(401, b'{"error":"Invalid credentials"}')
                if parts[:2] == ["api", "datasets"] and hub.api_faults:
                    fault = hub.api_faults.pop(0)
                    if fault == "reset":
                        self.close_connection = True
                        return self.connection.close()
                    return self.reply(fault, b'{"error":"injected"}', [("Retry-After", "0")])
                if parts[:2] == ["api", "datasets"] and parts[4] == "revision":
                    sha = hub.refs.get((repo, "/".join(parts[5:])))
                    if sha is None:
                        return self.reply(404)
                    return self.reply(200, json.dumps({"id": repo, "sha": sha}).encode())
                if parts[:2] == ["api", "datasets"] and parts[4] == "tree":
                    sha, folder = parts[5], "/".join(parts[6:])
                    files = sorted(p for p in hub.commits[sha] if p.startswith(folder))
                    page = int(parse_qs(url.query).get("cursor", ["0"])[0])
                    body = json.dumps(
                        [{"type": "file", "path": p, "size": len(hub.commits[sha][p]), "oid": "x"}
                         for p in files[page : page + 2]]
                    ).encode()
                    headers = []
                    if page + 2 < len(files):
                        host = f"http://{self.headers['Host']}"
                        headers.append(("Link", f'<{host}{url.path}?recursive=true&cursor={page + 2}>; rel="next"'))
                    return self.reply(200, body, headers)
                if parts[3] == "resolve":
                    hub.resolve_auth.append(auth)
                    sha, path = parts[4], "/".join(parts[5:])
                    data = hub.commits.get(sha, {}).get(path)
                    if data is None:
                        return self.reply(404)
                    meta = [("ETag", '"' + hashlib.md5(data).hexdigest() + '"'),
                            ("Last-Modified", "Mon, 01 Dec 2025 00:00:00 GMT"),
                            ("Accept-Ranges", "bytes")]
                    rng = self.headers.get("Range")
                    if rng:
                        start, end = rng.removeprefix("bytes=").split("-")
                        start, end = int(start), min(int(end), len(data) - 1)
                        meta.append(("Content-Range", f"bytes {start}-{end}/{len(data)}"))
                        return self.reply(206, data[start : end + 1], meta)
                    return self.reply(200, data, meta)
                return self.reply(404)

        self.is_cdn = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def push(self, repo: str, sha: str, files: dict[str, bytes], ref: str = "main") -> None:
        self.commits[sha] = files
        self.refs[(repo, ref)] = sha
        self.refs[(repo, sha)] = sha

    def close(self):
        self.server.shutdown()


def parquet_bytes(table: pa.Table, **options) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **options)
    return sink.getvalue().to_pybytes()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    hub = FakeHub(tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield hub
    hub.close()


def test_hf_datasets_indexed_at_a_pinned_commit(tmp_path, hub):
    first = [make_table(i * 400, 400) for i in range(3)]
    files = {f"data/train-{i:05d}-of-00003.parquet": parquet_bytes(t, row_group_size=100)
             for i, t in enumerate(first)}
    files["README.md"] = b"# a dataset card"
    files["data/test-00000-of-00001.parquet"] = parquet_bytes(make_table(9000, 50))
    hub.push("org/public", "a" * 40, files)
    index = str(tmp_path / "index")
    summary = shardfeed.index("hf://datasets/org/public/data/train-*.parquet", index)
    assert summary["files"] == 3 and summary["bases"] == [f"hf://datasets/org/public@{'a' * 40}/data"]
    expected = expected_rows(pa.concat_tables(first))
    got = read_rows(index)
    assert sorted(r[0] for r in got) == sorted(expected)
    assert all(tuple(v) == expected[i] for i, *v in got)
    # Resume mid-epoch.
    assert resumed_ids(index, 4) == [r[0] for r in got]
    # A push to main changes what a new index reads, not what the old one reads.
    hub.push("org/public", "b" * 40, {"data/train-00000-of-00001.parquet": parquet_bytes(make_table(50_000, 10))})
    assert sorted(r[0] for r in read_rows(index)) == sorted(expected)
    newer = str(tmp_path / "newer")
    assert shardfeed.index("hf://datasets/org/public/data/train-*.parquet", newer)["rows"] == 10
    # An explicit revision.
    pinned = str(tmp_path / "pinned")
    assert shardfeed.index(f"hf://datasets/org/public@{'a' * 40}/data", pinned)["files"] == 4
    assert all(a is None for a in hub.resolve_auth)


def test_hf_api_rate_limits_and_failures_are_retried(tmp_path, hub):
    """429s, 5xx answers and a reset connection from the Hub's API (the revision, the pages of
    the file tree) are asked again with backoff: the index is whole (the first failed it)."""
    tables = [make_table(i * 200, 200) for i in range(5)]
    hub.push("org/public", "d" * 40, {f"train-{i}.parquet": parquet_bytes(t) for i, t in enumerate(tables)})
    hub.api_faults = [429, 503, "reset", 500]
    index = str(tmp_path / "index")
    assert shardfeed.index("hf://datasets/org/public", index)["files"] == 5
    assert hub.api_faults == []
    assert sorted(r[0] for r in read_rows(index)) == list(range(1000))
    # What stays refused is refused at once: a 404 is not asked again.
    hub.api_faults = [404, 429]
    with pytest.raises(shardfeed.ShardfeedError, match="not found on the Hub"):
        shardfeed.index("hf://datasets/org/public", str(tmp_path / "again"))
    assert hub.api_faults == [429]


def test_hf_private_datasets_need_a_token_that_is_never_shown(tmp_path, hub, monkeypatch):
    data = make_table(0, 300)
    hub.push("org/private", "c" * 40, {"train.parquet": parquet_bytes(data)})
    index = str(tmp_path / "index")
    with pytest.raises(shardfeed.ShardfeedError, match=r"hf://datasets/org/private.*HF_TOKEN") as err:
        shardfeed.index("hf://datasets/org/private", index)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(shardfeed.ShardfeedError, match="refused the token") as err:
        shardfeed.index("hf://datasets/org/private", index)
    assert "hf_wrong" not in str(err.value)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert shardfeed.index("hf://datasets/org/private", index)["rows"] == 300
    assert "hf_secret" not in Path(index, "manifest.json").read_text()
    assert sorted(r[0] for r in read_rows(index)) == list(range(300))
    assert set(hub.resolve_auth) == {"Bearer hf_secret"}
    # Without the token, the loader's reads are refused, naming the file, not the token.
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(PermissionError, match=r"train\.parquet.*401") as err:
        shardfeed.Loader(index, 64)
    assert "hf_secret" not in str(err.value)


def test_hf_redirects_to_another_host_do_not_carry_the_token(tmp_path, hub, monkeypatch):
    """The Hub answers `resolve/` with a redirect to its CDN: the bytes come from there, and
    the token stays with the endpoint it was given for."""
    cdn = FakeHub(tmp_path)
    cdn.is_cdn = True
    try:
        data = make_table(0, 200)
        for h in (hub, cdn):
            h.push("org/private", "d" * 40, {"train.parquet": parquet_bytes(data)})
        hub.cdn = cdn
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        index = str(tmp_path / "index")
        assert shardfeed.index("hf://datasets/org/private", index)["rows"] == 200
        assert sorted(r[0] for r in read_rows(index)) == list(range(200))
        assert cdn.resolve_auth and all(a is None for a in cdn.resolve_auth)
    finally:
        cdn.close()


def test_struct_fields_of_hugging_face_images_as_columns(tmp_path):
    """`image: struct<bytes, path>` as Hugging Face `datasets` writes it: its fields are
    columns of their own (`image.bytes`, `image.path`), null where the struct is, and
    `decode_images` decodes `image.bytes`."""
    import io

    from PIL import Image

    def jpeg(i):
        out = io.BytesIO()
        Image.new("RGB", (40 + i, 30), (i * 20 % 256, 80, 160)).save(out, format="JPEG")
        return out.getvalue()

    n = 40
    images = [None if i % 9 == 4 else {"bytes": jpeg(i % 7), "path": f"img/{i}.jpg"} for i in range(n)]
    messages = [[{"role": "user", "content": f"q{i}"}] for i in range(n)]
    table = pa.table({"id": pa.array(range(n), pa.int64()), "image": images, "messages": messages})
    index = indexed(tmp_path, table, 16)
    seen = {}
    with shardfeed.Loader(index, 8, columns=["id", "image.path", "image.bytes"], drop_last=False) as loader:
        for batch in loader:
            assert set(batch) >= {"image.bytes", "image.path", "image.path.validity"}
            paths = shardfeed.strings(batch, "image.path")
            blobs = shardfeed.strings(batch, "image.bytes", encoding=None)
            for i, p, b in zip(batch["id"].tolist(), paths, blobs):
                seen[i] = (p, b)
    assert seen == {i: (im["path"], im["bytes"]) if im else (None, None) for i, im in enumerate(images)}
    # Naming the struct loads its fields, the same values.
    with shardfeed.Loader(index, 8, columns=["id", "image"], drop_last=False) as loader:
        whole = {}
        for batch in loader:
            assert "image" not in batch and {"image.bytes", "image.path"} <= set(batch)
            for i, p, b in zip(batch["id"].tolist(), shardfeed.strings(batch, "image.path"),
                               shardfeed.strings(batch, "image.bytes", encoding=None)):
                whole[i] = (p, b)
    assert whole == seen
    # Decoded in the loader, straight from the struct's field, named by its path or by the
    # struct: the same pixels.
    def decoded(columns, images):
        with shardfeed.Loader(index, 8, columns=columns, decode_images=images, image_size=24,
                              crop="center", on_error="skip", drop_last=False, seed=1) as loader:
            return {i: px.copy() for b in loader for i, px in zip(b["id"].tolist(), b["image.bytes"])}

    by_path = decoded(["id", "image.bytes"], "image.bytes")
    by_struct = decoded(["id", "image"], "image")
    assert {p.shape for p in by_path.values()} == {(24, 24, 3)}
    assert by_path.keys() == by_struct.keys() == set(range(n))
    assert all((by_path[i] == by_struct[i]).all() for i in by_path)
    # Slabs sized for the decoded images of a struct's field (8 x 64 x 64 x 3 bytes a batch,
    # past the smallest slab), as for an image column of its own: no batch outside the pool.
    with shardfeed.Loader(index, 8, columns=["id", "image"], decode_images="image", image_size=64,
                          on_error="skip", drop_last=False) as loader:
        assert sum(len(b["id"]) for b in loader) == n
        stats = loader.stats()
    assert stats["oversize_batches"] == 0 and stats["slab_bytes"] >= 8 * 64 * 64 * 3
    # A list of structs loads as a list per field (`messages.role`: list<string>), the
    # items' bytes in `.value_offsets`; shuffled, in a mixture with a sharded copy, and
    # resumed mid-epoch.
    want = {i: ([m["role"] for m in ms], [m["content"] for m in ms]) for i, ms in enumerate(messages)}

    def lists(loader, limit=None):
        got = []
        for _, batch in zip(range(limit or 10**9), loader):
            assert {"messages.role.offsets", "messages.role.value_offsets"} <= set(batch)
            got += zip(batch["id"].tolist(), zip(shardfeed.strings(batch, "messages.role"),
                                                 shardfeed.strings(batch, "messages.content")))
        return got

    with shardfeed.Loader(index, 8, seed=3, drop_last=False) as loader:  # every column
        got = lists(loader)
        batch = next(iter(loader))
        split = shardfeed.rows(batch, "messages.role")
        assert [[bytes(item).decode() for item in row] for row in split] == \
            shardfeed.strings(batch, "messages.role")
    assert {i: tuple(v) for i, v in got} == {i: tuple(v) for i, v in want.items()}
    assert len(got) == n
    sharded = str(tmp_path / "sharded")
    shardfeed.shard(str(tmp_path / "data"), sharded, row_group_rows=16)
    with shardfeed.Loader({index: 0.5, sharded: 0.5}, 8, columns=["id", "messages"], seed=1) as mix:
        for i, (roles, contents) in lists(mix, 12):
            assert (roles, contents) == want[i]
    with shardfeed.Loader(index, 8, columns=["id", "messages"], seed=4) as loader:
        first = lists(loader, 2)
        state = loader.state_dict()
        rest = lists(loader)
    with shardfeed.Loader(index, 8, columns=["id", "messages"], seed=4) as again:
        again.load_state_dict(state)
        assert lists(again) == rest
    assert sorted(i for i, _ in first + rest) == list(range(n - n % 8))
    # A row transform sees a list of strings as each item's bytes.
    def count(row, rng):
        return {"id": row["id"], "roles": np.int64(len(row["messages.role"]))}

    with shardfeed.Loader(index, 8, columns=["id", "messages.role"], row_transform=count,
                          drop_last=False) as loader:
        counts = {i: c for b in loader for i, c in zip(b["id"].tolist(), b["roles"].tolist())}
    assert counts == {i: len(want[i][0]) for i in range(n)}


def test_narrower_integers_and_floats_are_widened(tmp_path):
    """Files of int32 and int64 (and float32 and float64) index as int64 (float64); each
    file's values read widened. Other differences stay refused."""
    data = tmp_path / "data"
    data.mkdir()
    narrow = pa.table({"id": pa.array(range(0, 500), pa.int32()),
                       "x": pa.array([i / 4 for i in range(500)], pa.float32())})
    wide = pa.table({"id": pa.array(range(500, 900), pa.int64()),
                     "x": pa.array([i / 4 for i in range(500, 900)], pa.float64())})
    pq.write_table(narrow, data / "a.parquet", row_group_size=100)
    pq.write_table(wide, data / "b.parquet", row_group_size=100)
    index = str(tmp_path / "index")
    shardfeed.index(str(data), index)
    schema = {f["name"]: f["data_type"] for f in json.loads(Path(index, "manifest.json").read_text())["schema"]["fields"]}
    assert schema == {"id": "Int64", "x": "Float64"}
    got = {}
    with shardfeed.Loader(index, 64, drop_last=False, seed=2) as loader:
        for batch in loader:
            assert batch["id"].dtype == np.int64 and batch["x"].dtype == np.float64
            got.update(zip(batch["id"].tolist(), batch["x"].tolist()))
    assert got == {i: i / 4 for i in range(900)}
    pq.write_table(pa.table({"id": pa.array([1], pa.uint32()), "x": pa.array([1.0])}), data / "c.parquet")
    with pytest.raises(shardfeed.ShardfeedError, match=r"c\.parquet.*column `id` is UInt32"):
        shardfeed.index(str(data), str(tmp_path / "other"))


def test_a_map_loads_as_a_list_per_entry_field(tmp_path):
    """`map<string, int32>` as pyarrow writes it: `attrs.key` (lists of strings) and
    `attrs.value` (lists of int32), null where the map is, equal to pyarrow's reading."""
    n = 60
    maps = [None if i % 7 == 3 else [(f"k{i}-{j}", i * 10 + j) for j in range(i % 4)]
            for i in range(n)]
    table = pa.table({"id": pa.array(range(n), pa.int64()),
                      "attrs": pa.array(maps, pa.map_(pa.string(), pa.int32()))})
    index = indexed(tmp_path, table, 25)
    seen = {}
    with shardfeed.Loader(index, 8, seed=2, drop_last=False) as loader:
        for batch in loader:
            keys = shardfeed.strings(batch, "attrs.key")
            values = shardfeed.rows(batch, "attrs.value")
            valid = batch["attrs.value.validity"]
            for i, row_id in enumerate(batch["id"].tolist()):
                seen[row_id] = None if keys[i] is None else list(zip(keys[i], values[i].tolist()))
                assert bool(valid[i]) == (keys[i] is not None)
    assert seen == {i: m for i, m in enumerate(maps)}


def test_lists_of_strings_of_every_offset_width(tmp_path):
    """`list<string>`, `large_list<large_string>` and `list<binary>` read back as written,
    nulls and empty lists included."""
    n = 50
    rows = [None if i % 6 == 5 else [f"w{i}-{j}" * (j + 1) for j in range(i % 4)] for i in range(n)]
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "small": pa.array(rows, pa.list_(pa.string())),
        "large": pa.array(rows, pa.large_list(pa.large_string())),
        "blobs": pa.array([None if r is None else [s.encode() for s in r] for r in rows],
                          pa.list_(pa.binary())),
    })
    index = indexed(tmp_path, table, 20)
    seen = {}
    with shardfeed.Loader(index, 8, seed=1, drop_last=False) as loader:
        for batch in loader:
            small, large = shardfeed.strings(batch, "small"), shardfeed.strings(batch, "large")
            blobs = shardfeed.strings(batch, "blobs", encoding=None)
            for i, row_id in enumerate(batch["id"].tolist()):
                assert small[i] == large[i]
                assert blobs[i] == (None if small[i] is None else [s.encode() for s in small[i]])
                seen[row_id] = small[i]
    assert seen == dict(enumerate(rows))


def test_slabs_hold_the_batches_of_compressible_token_lists(tmp_path):
    """Token lists that compress well on disk (an index's input bytes are its files', not what
    they decode to): the slabs are sized from the footer's decoded sizes, and no batch is made
    outside the pool."""
    n = 4000
    tokens = [[(i + j) % 50 for j in range(400 + i % 200)] for i in range(n)]
    table = pa.table({"id": pa.array(range(n), pa.int64()),
                      "tokens": pa.array(tokens, pa.list_(pa.int32()))})
    index = indexed(tmp_path, table, 1000)
    with shardfeed.Loader(index, 256, seed=1) as loader:
        assert sum(len(b["id"]) for b in loader) == n - n % 256
        stats = loader.stats()
    assert stats["oversize_batches"] == 0, stats["slab_bytes"]


def test_slabs_grow_for_batches_past_the_estimate(tmp_path):
    """Dictionary-encoded strings in place decode far past what the footer says: the pool's
    slabs grow for the first such batch (within the budget), and no batch is made outside it;
    the values are the messages written."""
    n = 6000
    messages = [[{"role": "user", "content": "q" * (50 + i % 300)},
                 {"role": "assistant", "content": "a" * (100 + i % 700)}] for i in range(n)]
    index = indexed(tmp_path, pa.table({"id": pa.array(range(n), pa.int64()),
                                        "messages": messages}), 2000)
    with shardfeed.Loader(index, 256, seed=1, drop_last=False) as loader:
        seen = {}
        for batch in loader:
            for i, content in zip(batch["id"].tolist(), shardfeed.strings(batch, "messages.content")):
                seen[i] = content
        stats = loader.stats()
    assert stats["oversize_batches"] == 0 and stats["slab_bytes"] > 64 << 10
    assert seen == {i: [m["content"] for m in ms] for i, ms in enumerate(messages)}


def test_index_retries_a_flaky_stores_reads(tmp_path, moto_s3):
    """A 503, a reset connection and a body cut short while footers are read are retried: the
    index is whole and reads every row (it failed on the first of them before)."""
    from fault_proxy import Fault, FaultProxy

    data = tmp_path / "data"
    table = write_files(data, "pyarrow", 1200, 3, row_group_size=300)
    s3 = s3_client(moto_s3)
    for f in sorted(data.iterdir()):
        s3.upload_file(str(f), "test-bucket", f"flaky/{f.name}")
    proxy = FaultProxy.before(
        moto_s3,
        [
            Fault("GET", "part-000.parquet", "503"),
            Fault("GET", "part-001.parquet", "reset"),
            Fault("GET", "part-002.parquet", "cut"),
        ],
    )
    try:
        index = str(tmp_path / "index")
        flaky = proxy.options(moto_s3)
        summary = shardfeed.index("s3://test-bucket/flaky", index, storage_options=flaky)
        assert sorted(a for _, _, a in proxy.injected) == ["503", "cut", "reset"], proxy.injected
    finally:
        proxy.close()
    assert summary["files"] == 3
    expected = expected_rows(table)
    got = read_rows(index, storage_options=moto_s3)
    assert sorted(r[0] for r in got) == sorted(expected)
    assert all(tuple(v) == expected[i] for i, *v in got)
