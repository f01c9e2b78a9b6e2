"""The type stubs cover the native module's public API, and every public name is documented."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import shardfeed
import shardfeed._native as native

STUB = Path(shardfeed.__file__).with_name("_native.pyi")


def stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def test_every_native_name_and_method_is_in_the_stubs_with_a_docstring():
    tree = stub_tree()
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assigned = {
        t.id
        for n in tree.body
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Name)
    }
    public = {k for k in dir(native) if not k.startswith("_")}
    assert public <= set(defs) | assigned, public - set(defs) - assigned
    for name in public & set(defs):
        assert ast.get_docstring(defs[name]), f"{name} has no docstring in the stubs"
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in public):
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        runtime = {k for k in vars(getattr(native, cls.name)) if not k.startswith("_")}
        assert runtime <= set(methods), f"{cls.name}: {runtime - set(methods)} missing from the stubs"
        for name in runtime:
            assert ast.get_docstring(methods[name]), f"{cls.name}.{name} has no docstring in the stubs"


def test_every_name_the_package_exports_is_documented():
    for name in shardfeed.__all__:
        obj = getattr(shardfeed, name)
        if name == "__version__":
            assert isinstance(obj, str) and obj
            continue
        assert inspect.getdoc(obj), f"shardfeed.{name} has no docstring"
