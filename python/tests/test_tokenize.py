"""`shard(tokenizer=...)`: ids identical to the Python `tokenizers` package's `encode_batch`
with the same (trained) tokenizer file, and the tokenized dataset loads and resumes like any
token dataset."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardfeed

tokenizers = pytest.importorskip("tokenizers")

from text_fixture import documents, train_tokenizer  # noqa: E402

DOCS = 10_000


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenize")
    tok_file = root / "tokenizer.json"
    train_tokenizer(str(tok_file))
    docs = documents(DOCS, seed=3)
    raw = root / "docs.jsonl"
    with open(raw, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, "text": d}, ensure_ascii=False) + "\n")
    out = root / "ds"
    summary = shardfeed.shard(str(raw), str(out), tokenizer=str(tok_file), add_eos=True,
                              threads=2, row_group_size="256KiB", shard_size="1MiB")
    return tok_file, docs, out, summary


def read_shards(out) -> pa.Table:
    manifest = json.load(open(out / "manifest.json"))
    return pa.concat_tables([pq.read_table(out / s["path"]) for s in manifest["shards"]])


def test_ids_equal_the_python_package_encode_batch(tokenized):
    tok_file, docs, out, summary = tokenized
    tok = tokenizers.Tokenizer.from_file(str(tok_file))
    eos = tok.token_to_id("<|endoftext|>")
    expected = [e.ids for e in tok.encode_batch(docs)]
    # The documents exercise what they should: unseen scripts fall back to bytes,
    # and empty documents give no ids.
    byte_ids = {tok.token_to_id(f"<0x{b:02X}>") for b in range(256)}
    assert sum(1 for ids in expected for t in ids if t in byte_ids) > 1000
    assert any(d == "" for d in docs) and any(len(d) > 1000 for d in docs)
    table = read_shards(out)
    assert table.num_rows == DOCS
    by_id = dict(zip(table["id"].to_pylist(), table["input_ids"].to_pylist()))
    counts = dict(zip(table["id"].to_pylist(), table["num_tokens"].to_pylist()))
    mismatched = [i for i in range(DOCS) if by_id[i] != expected[i] + [eos]]
    assert not mismatched, f"{len(mismatched)} documents differ, first {mismatched[:5]}"
    assert all(counts[i] == len(by_id[i]) for i in range(DOCS))
    # Exactly one eos per document, at its end.
    assert all(ids.count(eos) == 1 and ids[-1] == eos for ids in by_id.values())
    total = sum(len(e) + 1 for e in expected)
    assert summary["tokens"] == total
    info = shardfeed.inspect(str(out))
    assert info["tokens"] == total
    assert info["options"]["tokenizer"]["eos_id"] == eos
    assert info["options"]["tokenizer"]["vocab_size"] == tok.get_vocab_size()


def rows_of(batch) -> dict[int, list[int]]:
    values, offsets = batch["input_ids"], batch["input_ids.offsets"]
    return {int(i): values[offsets[k]:offsets[k + 1]].tolist() for k, i in enumerate(batch["id"])}


def test_the_tokenized_dataset_loads_and_resumes(tokenized):
    _, _, out, _ = tokenized
    table = read_shards(out)
    expected = dict(zip(table["id"].to_pylist(), table["input_ids"].to_pylist()))
    loader = shardfeed.Loader(str(out), 64, seed=9, drop_last=False, columns=["id", "input_ids"])
    seen: dict[int, list[int]] = {}
    state, after = None, []
    for k, batch in enumerate(loader):
        rows = rows_of(batch)
        assert not (rows.keys() & seen.keys())
        seen.update(rows)
        if k == 40:
            state = loader.state_dict()
        elif k > 40:
            after.append(sorted(rows))
    assert seen == expected  # every document exactly once, its ids intact
    resumed = shardfeed.Loader(str(out), 64, seed=9, drop_last=False, columns=["id", "input_ids"])
    resumed.load_state_dict(state)
    assert [sorted(rows_of(b)) for b in resumed] == after


def test_the_tokenized_dataset_packs_with_one_eos_at_each_document_end(tokenized):
    tok_file, docs, out, summary = tokenized
    eos = tokenizers.Tokenizer.from_file(str(tok_file)).token_to_id("<|endoftext|>")
    length = 128
    options = dict(batch_size=8, pack_to=length, seed=4, drop_last=False, threads=2)
    packed = shardfeed.Loader(str(out), **options)
    batches = [{k: v.copy() for k, v in b.items()} for b in packed]
    ids = np.concatenate([b["input_ids"].reshape(-1) for b in batches])
    pos = np.concatenate([b["position_ids"].reshape(-1) for b in batches])
    seg = np.concatenate([b["segment_ids"].reshape(-1) for b in batches])
    real = seg != 0
    assert real.sum() == summary["tokens"]  # every token once
    # Split the stream into documents where positions restart: each ends with
    # its only eos.
    ids, pos = ids[real], pos[real]
    starts = np.flatnonzero(pos == 0)
    assert len(starts) == DOCS
    for a, z in zip(starts, list(starts[1:]) + [len(ids)]):
        doc = ids[a:z]
        assert doc[-1] == eos and (doc == eos).sum() == 1
    # Resume mid-epoch continues with the same packed rows.
    again = shardfeed.Loader(str(out), **options)
    for _ in range(25):
        next(again)
    state = again.state_dict()
    resumed = shardfeed.Loader(str(out), **options)
    resumed.load_state_dict(state)
    rest = [b["input_ids"].copy() for b in resumed]
    assert all((a == b["input_ids"]).all() for a, b in zip(rest, batches[25:]))
    assert len(rest) == len(batches) - 25
