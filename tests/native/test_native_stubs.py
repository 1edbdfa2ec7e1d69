"""hvd_elastic/_native.pyi describes exactly what hvd_elastic._native exports."""
import ast
import pathlib

from hvd_elastic import _native as N

STUB = pathlib.Path(__file__).resolve().parents[2] / "hvd_elastic" / "_native.pyi"


def stub_tree():
    return ast.parse(STUB.read_text())


def test_stub_lists_every_exported_name_and_no_other():
    tree = stub_tree()
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    exported = {name for name in dir(N) if not name.startswith("_")}
    assert stubbed == exported


def test_stub_classes_list_every_public_member():
    for node in stub_tree().body:
        if isinstance(node, ast.ClassDef):
            stubbed = {n.name for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
            exported = {m for m in dir(getattr(N, node.name)) if not m.startswith("_")}
            assert stubbed == exported, node.name


def test_every_binding_has_a_docstring():
    for name in dir(N):
        if not name.startswith("_"):
            assert (getattr(N, name).__doc__ or "").strip(), name
