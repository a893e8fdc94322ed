"""Docstrings show their shell examples as written: a line ending in a single backslash inside
a non-raw docstring is a Python line continuation, so `--help` (absl prints the binary's module
docstring) and pydoc showed the usage examples' continued lines joined into one (14 binaries
until 2026-12-04). Write `\\` at the end of such a line, or use a raw docstring."""

import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRS = ("lattn_jax", "pallas_kernels", "experiments", "benchmarks", "configs", "tests")


def _docstrings(path):
    """``(name, source text)`` of every module, class and function docstring in ``path``."""
    with open(path) as f:
        src = f.read()
    if "\\\n" not in src:  # no line ends in a backslash: nothing to find (most files)
        return
    lines = src.split("\n")
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                v = first.value
                text = "\n".join(lines[v.lineno - 1:v.end_lineno])[v.col_offset:]
                yield getattr(node, "name", "<module>"), text


def test_no_line_continuation_inside_docstrings():
    bad = []
    for d in DIRS:
        for path in sorted(glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)):
            for name, seg in _docstrings(path):
                if seg[:1] in "rRbB":
                    continue
                for line in seg.split("\n"):
                    if line.endswith("\\") and not line.endswith("\\\\"):
                        bad.append(f"{os.path.relpath(path, ROOT)}: {name}: {line.strip()}")
    assert not bad, "a single trailing backslash joins the lines:\n" + "\n".join(bad)


def test_the_models_shape_letters_are_defined_where_it_returns_them():
    # LanguageModel.__call__ returned logits [B, T, S] without saying what S is (newcomer
    # report): its docstring names the legend (lattn_jax.typing) and defines S there.
    from lattn_jax import model  # noqa: PLC0415 (imports jax)
    from lattn_jax import typing as shapes  # noqa: PLC0415
    doc = model.LanguageModel.__call__.__doc__
    assert ":mod:`lattn_jax.typing`" in doc, doc[:400]
    assert "``S`` the vocabulary size (``model_config.vocab_size``)" in doc, doc[:400]
    assert "S     vocabulary size" in shapes.__doc__  # the legend agrees
