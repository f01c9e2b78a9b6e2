"""The README's quickstarts run as written (the command's, then Python's), on a smaller
generated dataset."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def block(title: str, language: str) -> str:
    """The first ```language block after the heading `title`."""
    text = README.read_text()
    at = text.index(f"## {title}\n")
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, at)
    assert match, f"no {language} block under {title}"
    return match.group(1)


def test_the_quickstarts_run(tmp_path):
    commands = block("Quickstart: the command", "sh")
    # Small data for CI: the same commands on 5 MB.
    commands = commands.replace("--size 50MB", "--size 5MB")
    assert "shardfeed shard raw -o ds" in commands
    env = dict(os.environ, PATH=sysconfig.get_path("scripts") + os.pathsep + os.environ["PATH"])
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert "rows" in run.stdout and (tmp_path / "ds" / "manifest.json").exists()
    python = block("Quickstart: Python (PyTorch)", "python")
    run = subprocess.run(
        [sys.executable, "-c", python + "\nprint(ids.shape, state['epoch'])\n"], cwd=tmp_path,
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert "torch.Size([256, 2048])" in run.stdout, run.stdout
