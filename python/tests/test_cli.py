"""The `shardfeed` command installed with the package (`pip install ./python`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig

import pyarrow.parquet as pq

import shardfeed
from conftest import kinds_table


def installed_command() -> str:
    """The console script pip wrote for this interpreter."""
    path = os.path.join(sysconfig.get_path("scripts"), "shardfeed")
    assert os.access(path, os.X_OK), f"pip did not install {path}"
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([installed_command(), *args], capture_output=True, text=True, timeout=300)


def test_the_installed_command_is_the_cli_at_the_package_version():
    out = run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"shardfeed {shardfeed.__version__}"
    # `python -m shardfeed` is the same command.
    module = subprocess.run(
        [sys.executable, "-m", "shardfeed", "--version"], capture_output=True, text=True, timeout=300
    )
    assert module.stdout == out.stdout
    # A command line clap refuses exits 2 naming the argument.
    bad = run("shard", "--no-such-flag")
    assert bad.returncode == 2 and "--no-such-flag" in bad.stderr


def test_the_installed_command_shards_inspects_and_streams(tmp_path):
    table = kinds_table(1000, seed=3)
    pq.write_table(table, tmp_path / "in.parquet")
    out = tmp_path / "ds"
    sharded = run("shard", str(tmp_path / "in.parquet"), "-o", str(out), "--row-group-rows", "100")
    assert sharded.returncode == 0, sharded.stderr
    info = json.loads(run("inspect", str(out), "--json").stdout)
    assert info["rows"] == 1000 and info["row_groups"] == 10
    # What the command wrote, the package reads: every row once.
    ids = []
    for batch in shardfeed.Loader(str(out), 128, columns=["id"], drop_last=False):
        ids += batch["id"].tolist()
    assert sorted(ids) == sorted(table.column("id").to_pylist())
    bench = run("bench", str(out), "--batch-size", "100", "--json")
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout)["rows"] == 1000
    # A failing command exits 1 with its error on stderr, naming the input.
    missing = run("inspect", str(tmp_path / "nowhere"))
    assert missing.returncode == 1 and "nowhere" in missing.stderr
