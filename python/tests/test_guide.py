"""The guide's runnable examples (code blocks marked `<!-- runs in CI -->`) run as written:
each chapter's blocks in order, in one fresh folder, with the installed `shardfeed` command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide"
BLOCK = re.compile(r"<!-- runs in CI -->\n```(sh|python)\n(.*?)```", re.S)


def chapters() -> list[Path]:
    return sorted(p for p in GUIDE.glob("*.md") if BLOCK.search(p.read_text()))


def test_the_guide_has_runnable_examples():
    assert {p.name for p in chapters()} >= {"getting-started.md", "sharding.md", "loading.md", "observability.md", "mixtures.md"}


@pytest.mark.parametrize("chapter", chapters(), ids=lambda p: p.name)
def test_a_chapters_examples_run(chapter, tmp_path):
    env = dict(os.environ, PATH=sysconfig.get_path("scripts") + os.pathsep + os.environ["PATH"])
    for i, (language, code) in enumerate(BLOCK.findall(chapter.read_text())):
        command = ["bash", "-euo", "pipefail", "-c", code] if language == "sh" else [sys.executable, "-c", code]
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"{chapter.name}, block {i + 1} ({language}):\n{code}\n{run.stderr}"
