"""Every compiled module ships a stub (.pyi) that names each of its public functions,
classes and constants, so type checkers and IDEs see the whole kernel API."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (ROOT / "cyext").glob("_*.pyx"))


def test_every_compiled_module_is_listed() -> None:
    assert MODULES == ["_bloom", "_countmin", "_hashing", "_ingest", "_native", "_pack", "_score"]


@pytest.mark.parametrize("name", MODULES)
def test_the_stub_names_every_public_name(name: str) -> None:
    module = importlib.import_module(f"grudge_stream._cyext.{name}")
    stub = Path(module.__file__).with_name(f"{name}.pyi")
    assert stub.exists(), f"{name} is installed without its stub"
    tree = ast.parse(stub.read_text())
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
        elif isinstance(node, ast.Assign):
            declared.update(t.id for t in node.targets if isinstance(t, ast.Name))
    public = {n for n in dir(module) if not n.startswith("_")
              and getattr(getattr(module, n), "__module__", module.__name__) in (module.__name__, None)
              and not isinstance(getattr(module, n), type(module))}
    # numpy and other imports the kernel module holds are not its API.
    public = {n for n in public if n not in {"np", "cnp"}}
    assert public - declared == set(), f"{name}.pyi lacks {sorted(public - declared)}"
