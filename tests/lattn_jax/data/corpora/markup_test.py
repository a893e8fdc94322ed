"""Tests for the documentation-markup extractors (``extractors/markup.py``) on cut real files."""

import gzip
import os

import pytest

from lattn_jax.data.corpora.extractors import get_extractor
from lattn_jax.data.corpora.extractors.common import ExtractError
from lattn_jax.data.corpora.extractors.markup import extract_html
from lattn_jax.data.corpora.extractors.markup import extract_info
from lattn_jax.data.corpora.extractors.markup import extract_man
from lattn_jax.data.corpora.extractors.markup import extract_plain
from lattn_jax.data.corpora.extractors.markup import extract_pod
from lattn_jax.data.corpora.extractors.markup import extract_rst

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _fixture(*parts: str) -> str:
    return os.path.join(FIXTURES, *parts)


def _one(extract, path: str, **options) -> str:
    documents = list(extract(path, **options))
    assert len(documents) == 1
    assert documents[0].name == ""
    assert list(extract(path, **options)) == documents  # deterministic
    return documents[0].text


def _paragraphs(text: str) -> list[str]:
    return text.split("\n\n")


def test_registry_points_here():
    assert get_extractor("html") is extract_html
    assert get_extractor("man") is extract_man
    assert get_extractor("pod") is extract_pod
    assert get_extractor("info") is extract_info
    assert get_extractor("rst") is extract_rst
    assert get_extractor("plain") is extract_plain


class TestHtml:
    def test_sphinx(self):
        text = _one(extract_html, _fixture("html", "sphinx_keyword.html"))
        assert text.startswith("keyword — Testing for Python keywords")
        assert ("This module allows a Python program to determine if a string is a keyword or "
                "soft keyword.") in text
        assert "keyword.iskeyword(s)" in _paragraphs(text)
        for boilerplate in ("Table of Contents", "Previous topic", "Next topic", "This Page",
                            "Report a Bug", "Quick search", "modules |", "Navigation",
                            "Python Software Foundation", "¶", "<", "Theme"):
            assert boilerplate not in text, boilerplate

    def test_javadoc(self):
        text = _one(extract_html, _fixture("html", "javadoc_Runnable.html"))
        assert "Interface Runnable" in _paragraphs(text)
        assert ("The Runnable interface should be implemented by any class whose instances are "
                "intended to be executed by a thread.") in text
        for boilerplate in ("Skip navigation links", "Report a bug", "Oracle", "SEARCH",
                            "Overview", "Help"):
            assert boilerplate not in text, boilerplate

    def test_rustdoc(self):
        text = _one(extract_html, _fixture("html", "rustdoc_fn.swap.html"))
        paragraphs = _paragraphs(text)
        assert paragraphs[0] == "Function std::mem::swap"
        assert "pub fn swap<T>(x: &mut T, y: &mut T)" in paragraphs
        assert ("Swaps the values at two mutable locations, without deinitializing either one."
                in paragraphs)
        # <pre> keeps its lines, as one paragraph
        assert "let mut x = 5;\nlet mut y = 42;\nmem::swap(&mut x, &mut y);" in text
        for boilerplate in ("In std::mem", "Click or press", "source", "Expand description",
                            "Copy item path", "Run"):
            assert boilerplate not in text, boilerplate

    def test_main_and_drop_options(self):
        path = _fixture("html", "rustdoc_fn.swap.html")
        text = _one(extract_html, path, main="//div[contains(@class, 'docblock')]",
                    drop=["h2", ".example-wrap"])
        assert text.startswith("pub fn swap")
        assert "Examples" not in text and "mem::swap(&mut x" not in text
        assert "Function std::mem::swap" not in text
        with pytest.raises(ValueError):
            list(extract_html(path, drop=["div > p"]))

    def test_latin1_meta_charset(self, tmp_path):
        page = ('<html><head><meta http-equiv="Content-Type" content="text/html; '
                'charset=iso-8859-1"><title>t</title></head><body><nav>Home</nav>'
                '<p>Café crème, naïve façade</p><pre>a\n\n  b</pre></body></html>')
        path = tmp_path / "latin1.html"
        path.write_bytes(page.encode("latin-1"))
        assert _one(extract_html, str(path)) == "Café crème, naïve façade\n\na\nb"
        xhtml = tmp_path / "x.xhtml"
        xhtml.write_bytes('<?xml version="1.0" encoding="ISO-8859-15"?>\n<html><body><p>10 €'
                          '</p></body></html>'.encode("iso-8859-15"))
        assert _one(extract_html, str(xhtml)) == "10 €"

    def test_gz_and_corrupt_gz(self, tmp_path):
        with open(_fixture("html", "rustdoc_fn.swap.html"), "rb") as f:
            data = f.read()
        good = tmp_path / "page.html.gz"
        good.write_bytes(gzip.compress(data, mtime=0))
        assert _one(extract_html, str(good)) == _one(
            extract_html, _fixture("html", "rustdoc_fn.swap.html"))
        bad = tmp_path / "broken.html.gz"
        bad.write_bytes(gzip.compress(data, mtime=0)[:200])
        with pytest.raises(ExtractError, match="broken.html.gz"):
            list(extract_html(str(bad)))


class TestMan:
    def test_page(self):
        text = _one(extract_man, _fixture("man", "ldd.1.gz"))
        paragraphs = _paragraphs(text)
        assert paragraphs[:4] == ["NAME", "ldd - print shared object dependencies", "SYNOPSIS",
                                  "ldd [option]... file..."]
        for heading in ("DESCRIPTION", "Security", "OPTIONS", "BUGS", "SEE ALSO"):
            assert heading in paragraphs
        assert ("ldd prints the shared objects (shared libraries) required by each program or "
                "shared object specified on the command line.") in text
        # .TP tag on its own line, then the body
        assert "-v, --verbose\nPrint all information, including," in text
        # .nf block kept line by line
        assert "$ ldd /bin/ls\nlinux-vdso.so.1 (0x00007ffcc3563000)\n" in text
        assert paragraphs[-1] == "pldd(1), sprof(1), ld.so(8), ldconfig(8)"
        for markup in ("\\f", "\\-", ".SH", ".TP", ".B", ".\\\"", "Copyright", "\\(", "\\&"):
            assert markup not in text, markup

    def test_so_redirect_gives_nothing(self):
        assert list(extract_man(_fixture("man", "zustr2stp.3.gz"))) == []

    def test_escapes_and_requests(self, tmp_path):
        page = (".\\\" comment\n.TH X 1\n.de XX\nignored\n..\n.SH \"SEE ALSO\"\n"
                "A \\fBbold\\fP and \\fIitalic\\fR word \\(em with \\(aqquotes\\(aq, \\e, "
                "\\*(lqstring\\*(rq, \\[u00E9]t\\['e] \\s-1small\\s+1 \\%text\\&. \\\" comment\n"
                ".IR file .conf\n.sp\nnext\\c\n.B paragraph\n")
        path = tmp_path / "x.1"
        path.write_text(page)
        assert _one(extract_man, str(path)) == (
            "SEE ALSO\n\nA bold and italic word — with 'quotes', \\, “string”, été small "
            "text. file.conf\n\nnextparagraph")

    def test_corrupt_gz(self, tmp_path):
        bad = tmp_path / "bad.1.gz"
        with open(_fixture("man", "ldd.1.gz"), "rb") as f:
            bad.write_bytes(f.read()[:300])
        with pytest.raises(ExtractError, match="bad.1.gz"):
            list(extract_man(str(bad)))


class TestPod:
    def test_file(self):
        text = _one(extract_pod, _fixture("pod", "perlsyn_cut.pod"))
        paragraphs = _paragraphs(text)
        assert paragraphs[:4] == ["NAME", "perlsyn - Perl syntax", "DESCRIPTION",
                                  "A Perl program consists of a sequence of declarations and "
                                  "statements which run from the top to the bottom. Loops, "
                                  "subroutines, and other control structures allow you to jump "
                                  "around within the code."]
        assert "Declarations" in paragraphs
        assert ("The only things you need to declare in Perl are report formats and "
                "subroutines") in text
        assert "see perltrap for information about how they differ." in text
        assert 'the empty string, "";' in text
        assert "undef $a;\n$a++;" in text  # verbatim kept
        for markup in ("C<", "L<", "X<", "=head", "B<", "=cut"):
            assert markup not in text, markup

    def test_codes_and_commands(self, tmp_path):
        pod = ("#!/usr/bin/perl\nmy $x = 1;\n\n=head1 NAME\n\nB<bold> I<it> C<< $a->b >> "
               "F<f.txt> L<the docs|perlpod> L<perlfunc/open> E<lt>E<gt>E<sol>E<verbar>E<0x41>"
               "E<66> S<a b>X<index>Z<> C<<< x >> y >>>\n\n=begin html\n\n<p>html only</p>\n\n"
               "=end html\n\n=for comment hidden\n\n=for text shown\n\n=over 4\n\n=item *\n\n"
               "Bullet.\n\n=item B<-v>\n\nVerbose.\n\n=back\n\n=cut\n\nsub code { 1 }\n\n"
               "=pod\n\n  verbatim  B<kept>\n\n=cut\n")
        path = tmp_path / "x.pm"
        path.write_text(pod)
        assert _one(extract_pod, str(path)) == (
            "NAME\n\nbold it $a->b f.txt the docs \"open\" in perlfunc <>/|AB a b "
            "x >> y\n\nshown\n\nBullet.\n\n-v\n\nVerbose.\n\nverbatim B<kept>")


class TestInfo:
    def test_file(self):
        text = _one(extract_info, _fixture("info", "standards_cut.info.gz"))
        paragraphs = _paragraphs(text)
        assert paragraphs[0] == "GNU Coding Standards"
        assert "1 About the GNU Coding Standards" in paragraphs
        assert "2 Keeping Free Software Free" in paragraphs
        assert "The GNU Coding Standards were written by Richard Stallman" in text
        for markup in ("\x1f", "File: standards.info", "Node:", "* Menu:", "Tag Table",
                       "Local Variables", "INFO-DIR", "****", "*note", "*Note"):
            assert markup not in text, markup

    def test_not_info(self, tmp_path):
        path = tmp_path / "x.info"
        path.write_text("just text\n")
        with pytest.raises(ExtractError, match="x.info"):
            list(extract_info(str(path)))


class TestRst:
    def test_kernel_file(self):
        text = _one(extract_rst, _fixture("rst", "func-mmap.rst.gz"))
        paragraphs = _paragraphs(text)
        assert paragraphs[:4] == ["V4L2 mmap()", "Name",
                                  "v4l2-mmap - Map device memory into application address space",
                                  "Synopsis"]
        assert "#include <unistd.h>\n#include <sys/mman.h>" in text  # code-block body kept
        assert ("void *mmap( void *start, size_t length, int prot, int flags, int fd, "
                "off_t offset )") in paragraphs  # c:function signature kept
        assert "returned by the driver in the struct\nv4l2_buffer length field" in text
        assert "the desired protection, the\nmmap() function fails." in text
        for markup in (":c:", "``", "SPDX", ".. ", "namespace", "_func-mmap", "***", "===",
                       "#. ", "code-block"):
            assert markup not in text, markup

    def test_toctree_dropped(self):
        assert _one(extract_rst, _fixture("rst", "pci_index.rst")) == "Linux PCI Bus Subsystem"

    def test_inline(self, tmp_path):
        path = tmp_path / "x.rst"
        path.write_text(
            "Title\n=====\n\n:Author: someone\n\n.. _label:\n\n.. a comment\n   continued\n\n"
            "See `the site <https://example.org>`_, :ref:`Some Title\n<label>` and\n"
            ":func:`~os.path.join`, **bold** *it* ``lit`` [#]_.\n\n"
            ".. note::\n   :class: x\n\n   Careful.\n\n.. image:: a.png\n   :alt: pic\n\n"
            "Example::\n\n    code  here\n\n.. |s| replace:: sub\n")
        assert _one(extract_rst, str(path)) == (
            "Title\n\nSee the site, Some Title and\njoin, bold it lit.\n\nCareful.\n\nExample:"
            "\n\ncode here")


class TestPlain:
    def test_gutenberg_footer(self):
        text = _one(extract_plain, _fixture("plain", "chesterton-ball_cut.txt"))
        assert text.startswith("[The Ball and The Cross by G.K. Chesterton 1909]\n\n")
        assert text.endswith("pattern of a cross.")
        for boilerplate in ("END OF THE PROJECT GUTENBERG", "End of Project Gutenberg's",
                            "Produced by"):
            assert boilerplate not in text

    def test_header_and_split(self, tmp_path):
        path = tmp_path / "x.txt"
        path.write_text("The Project Gutenberg eBook of X\n\n*** START OF THE PROJECT "
                        "GUTENBERG EBOOK X ***\n\nOne.\n\n\n\n\nTwo.\n\n\nstill two\n"
                        "*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicense\n")
        assert _one(extract_plain, str(path)) == "One.\n\nTwo.\n\nstill two"
        documents = list(extract_plain(str(path), split="blank_line3"))
        assert [(d.name, d.text) for d in documents] == [("0", "One."),
                                                         ("1", "Two.\n\nstill two")]
        with pytest.raises(ValueError):
            list(extract_plain(str(path), split="chapter"))

    def test_encoding(self, tmp_path):
        path = tmp_path / "x.txt"
        path.write_bytes("Caf\u00e9".encode("latin-1"))
        assert _one(extract_plain, str(path), encoding="latin-1") == "Caf\u00e9"
