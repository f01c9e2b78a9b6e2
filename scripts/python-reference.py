#!/usr/bin/env python3
"""Write the guide's Python API reference (docs/guide/python-api.md) from the package's
sources: the native module's stubs and the pure-Python modules, read with `ast` (nothing
is imported). `--check` exits 1 when the committed page differs from what would be written."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "shardfeed"
PAGE = ROOT / "docs" / "guide" / "python-api.md"
# (module as users import it, source file, names to document: None for every public one)
MODULES = [
    ("shardfeed", PACKAGE / "_native.pyi", None),
    ("shardfeed", PACKAGE / "__init__.py", ["shard_task", "strings", "rows"]),
    ("shardfeed.torch", PACKAGE / "torch.py", None),
    ("shardfeed.metrics", PACKAGE / "metrics.py", None),
    ("shardfeed.transform", PACKAGE / "transform.py", ["empty"]),
]


def signature(node: ast.FunctionDef) -> str:
    args = ast.unparse(node.args)
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"{node.name}({args}){returns}"


def doc(node: ast.AST) -> str:
    return (ast.get_docstring(node) or "").strip()


def public(name: str) -> bool:
    return not name.startswith("_") or name in ("__init__", "__iter__", "__next__", "__len__")


def render() -> str:
    out = [
        "# Python API reference",
        "",
        "Generated from the package's stubs and sources by `scripts/python-reference.py`",
        "(CI checks it is current). The user guide's chapters show these in use.",
        "",
    ]
    for module, path, names in MODULES:
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            if names is not None and node.name not in names:
                continue
            if not public(node.name):
                continue
            if isinstance(node, ast.FunctionDef):
                out += [f"## `{module}.{node.name}`", "", "```python", signature(node), "```", "", doc(node), ""]
                continue
            bases = ", ".join(ast.unparse(b) for b in node.bases)
            out += [f"## `{module}.{node.name}`" + (f" ({bases})" if bases else ""), "", doc(node), ""]
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and public(item.name):
                    kind = "property" if any(ast.unparse(d) == "property" for d in item.decorator_list) else "method"
                    out += [f"### `{node.name}.{item.name}` ({kind})", "", "```python", signature(item), "```", ""]
                    if doc(item):
                        out += [doc(item), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run scripts/python-reference.py")
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
