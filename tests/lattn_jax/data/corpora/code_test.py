"""Tests of the source-code extractors (fixture: a module of the networkx wheel)."""

import gzip
import os

import pytest

from lattn_jax.data.corpora.extractors import ExtractError
from lattn_jax.data.corpora.extractors import get_extractor
from lattn_jax.data.corpora.extractors.code import extract_python_docstrings
from lattn_jax.data.corpora.extractors.code import extract_source_code

UNION_FIND = os.path.join(os.path.dirname(__file__), "fixtures", "python", "union_find.py")


def test_docstrings_real_module():
    (doc,) = extract_python_docstrings(UNION_FIND)
    assert doc.name == ""
    paragraphs = doc.text.split("\n\n")
    assert paragraphs[0] == "Union-find data structure."
    headings = [p for p in paragraphs if p.startswith("UnionFind") and "\n" not in p]
    assert headings == ["UnionFind", "UnionFind.__init__", "UnionFind.__getitem__",
                        "UnionFind.__iter__", "UnionFind.to_sets", "UnionFind.union"]
    assert "UnionFind.__getitem__\n\nFind and return the name of the set containing the object." \
        in doc.text
    assert "def " not in doc.text and "self.parents" not in doc.text
    assert list(extract_python_docstrings(UNION_FIND)) == [doc]


def test_docstrings_qualified_names_and_trivial(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        '"""Module doc with words."""\n'
        "import sys\n"
        "def outer():\n"
        '    """Outer function does things."""\n'
        "    def inner():\n"
        '        """Inner helper does more."""\n'
        "class Klass:\n"
        '    """Short."""\n'
        "    def method(self):\n"
        '        """A method that\n\n            keeps indented lines."""\n'
        "    async def later(self):\n"
        "        pass\n"
        "if sys.version_info > (3,):\n"
        "    def conditional():\n"
        '        """Defined under an if block."""\n')
    (doc,) = extract_python_docstrings(str(path))
    assert doc.text == (
        "Module doc with words.\n\nouter\n\nOuter function does things.\n\n"
        "outer.inner\n\nInner helper does more.\n\n"
        "Klass.method\n\nA method that\n\nkeeps indented lines.\n\n"
        "conditional\n\nDefined under an if block.")


def test_docstrings_unparsable_and_binary(tmp_path):
    py2 = tmp_path / "old.py"
    py2.write_text('"""A Python 2 module."""\nprint "hello"\n')
    assert list(extract_python_docstrings(str(py2))) == []
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert list(extract_python_docstrings(str(empty))) == []
    binary = tmp_path / "bin.py"
    binary.write_bytes(b'"""doc"""\x00\x01')
    with pytest.raises(ExtractError, match="bin.py"):
        list(extract_python_docstrings(str(binary)))


def test_source_code_keeps_indentation():
    (doc,) = get_extractor("source_code")(UNION_FIND)
    assert doc.name == ""
    assert "\n    def __init__(self, elements=None):\n" in doc.text
    assert "\n        if elements is None:\n            elements = ()\n" in doc.text
    assert not any(line != line.rstrip() for line in doc.text.split("\n"))


def test_source_code_skips(tmp_path):
    minified = tmp_path / "app.min.js"
    minified.write_text("var a=1;" * 300 + "\n")
    assert list(extract_source_code(str(minified))) == []
    wide = tmp_path / "wide.c"
    wide.write_text(("int x[] = {" + "1, " * 80 + "};\n") * 10)
    assert list(extract_source_code(str(wide))) == []
    binary = tmp_path / "blob.c"
    binary.write_bytes(b"int main() {}\n\x00\x00")
    assert list(extract_source_code(str(binary))) == []
    big = tmp_path / "big.c"
    big.write_text("int x;\n" * 100)
    assert list(extract_source_code(str(big), max_bytes=100)) == []
    assert len(list(extract_source_code(str(big), max_bytes=1000))) == 1
    compressed = tmp_path / "small.c.gz"
    with gzip.open(compressed, "wt") as f:
        f.write("int main(void)\n{\n\treturn 0;  \n}\n\n\n\n")
    (doc,) = extract_source_code(str(compressed))
    assert doc.text == "int main(void)\n{\n\treturn 0;\n}"
    with pytest.raises(ExtractError, match="max_bytes"):
        list(extract_source_code(str(big), max_bytes=0))
