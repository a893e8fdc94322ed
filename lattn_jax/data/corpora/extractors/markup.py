"""Extractors for documentation markup: HTML, roff man pages, POD, GNU Info, reST, plain text.

Each extractor keeps the prose (and code examples) a reader of the rendered document sees and
drops what a renderer would not show or what is navigation boilerplate: markup, macros, menus,
sidebars, link lists. None of them aims at typographic fidelity (that is what mandoc, pod2text,
info or a browser are for); the aim is readable paragraphs. All follow the contract in
``common``: deterministic ``Document``s with ``normalize_text``-ed text, ``ExtractError`` naming
the file for a file that cannot be parsed.
"""

import codecs
import html.entities
import re
from collections.abc import Iterator, Sequence

import lxml.etree

from lattn_jax.data.corpora.extractors.common import Document
from lattn_jax.data.corpora.extractors.common import ExtractError
from lattn_jax.data.corpora.extractors.common import normalize_text
from lattn_jax.data.corpora.extractors.common import read_bytes
from lattn_jax.data.corpora.extractors.common import read_text

__all__ = [
    "extract_html",
    "extract_info",
    "extract_man",
    "extract_plain",
    "extract_pod",
    "extract_rst",
]


# ---------------------------------------------------------------------------------------------
# HTML

# Elements whose whole subtree is dropped, wherever they are.
_DROP_TAGS = ("script", "style", "noscript", "nav", "header", "footer", "form", "button", "svg",
              "template", "iframe", "object", "embed", "select", "input", "textarea", "map",
              "canvas", "audio", "video", "head", "title")
# class or id tokens (matched as whole tokens) that mark navigation boilerplate. ``sidebar`` and
# ``header`` are deliberately absent: DocBook and Sphinx ``div.sidebar`` boxes are prose, and
# javadoc's ``div.header`` holds the page title (Texinfo's navigation ``div.header`` is matched
# separately, by its next/prev/up links).
_DROP_TOKENS = (
    "sphinxsidebar", "sphinxsidebarwrapper", "related", "footer", "navbar", "navigation",
    "breadcrumb", "breadcrumbs", "toc", "toctree-wrapper", "headerlink", "docnav", "navheader",
    "navfooter", "skip-nav", "sub-nav", "top-nav", "bottom-nav", "nav-panel", "mobile-nav",
    "menu-wrapper", "srclink", "test-arrow", "anchor", "rightside", "out-of-band",
    "notable-traits-tooltiptext", "banner", "searchbox", "search", "shortcontents",
    "contents-heading", "shortcontents-heading", "topbar", "leftnav", "title-anchors",
    "ghlink-after", "copybutton", "hideme", "version_switcher_placeholder",
    "language_switcher_placeholder",
)
_DROP_TAG_SET = frozenset(_DROP_TAGS)
_DROP_TOKEN_SET = frozenset(_DROP_TOKENS)
_DROP_ROLES = frozenset(("navigation", "search", "banner", "contentinfo"))
_KEPT_ASIDES = ("footnote", "sidebar", "topic")
# Texinfo's per-node navigation bar is a div.header with Next/Previous/Up links.
_TEXINFO_NAV = lxml.etree.XPath(
    "boolean(.//a[@rel='next' or @rel='prev' or @rel='previous' or @rel='up'])")
# Main-content containers, tried in this order; the first that matches wins.
_MAIN_XPATHS = tuple(lxml.etree.XPath(x) for x in (
    "//*[@id='main-content']",  # rustdoc
    "//*[@role='main']",  # Sphinx div.body, javadoc main
    "//main",
    "//div[contains(concat(' ', normalize-space(@class), ' '), ' body ')]",  # Sphinx (old)
    "//div[contains(concat(' ', normalize-space(@class), ' '), ' document ')]",
    "//div[contains(concat(' ', normalize-space(@class), ' '), ' contentContainer ')]",
    "//div[@id='content']",  # Erlang
    "//body",
))
# Elements that end a paragraph (blank line) and those that end a line.
_PARAGRAPH_TAGS = frozenset((
    "p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "section", "article",
    "table", "ul", "ol", "dl", "main", "body", "center", "figure", "figcaption", "details",
    "summary", "hr", "address", "caption", "fieldset", "legend", "aside", "dir", "menu",
    "listing", "xmp", "plaintext"))
_LINE_TAGS = frozenset(("li", "tr", "dt", "dd", "br", "thead", "tbody", "tfoot", "option"))
_CELL_TAGS = frozenset(("td", "th"))
_PRE_TAGS = frozenset(("pre", "listing", "xmp", "plaintext"))
_WS = re.compile(r"[ \t\n\r\f]+")
_BLANK_LINES = re.compile(r"\n[ \t\r\f]*\n[ \t\r\f\n]*")
_XML_DECL = re.compile(rb"^\s*<\?xml[^>]*?encoding\s*=\s*[\"']([A-Za-z0-9._:-]+)[\"']")
_META_CHARSET = re.compile(
    rb"<meta\s[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z0-9._:-]+)", re.IGNORECASE)
_CSS_SIMPLE = re.compile(r"^([A-Za-z][A-Za-z0-9]*)?((?:[.#][A-Za-z_][\w-]*)*)$")
_PARSERS: dict[str, lxml.etree.HTMLParser] = {}


def _html_encoding(data: bytes) -> str:
    """The page's declared encoding: BOM, XML declaration or ``<meta charset>``; else UTF-8."""
    if data.startswith(b"\xef\xbb\xbf"):
        return "utf-8"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    head = data[:4096]
    match = _XML_DECL.match(head) or _META_CHARSET.search(head)
    if match:
        name = match.group(1).decode("ascii").lower()
        if name in ("iso-8859-1", "latin1", "latin-1", "us-ascii", "ascii"):
            name = "cp1252"  # what browsers do, and a superset
        try:
            return "utf-8" if name in ("utf8", "utf-8") else codecs.lookup(name).name
        except LookupError:
            return "utf-8"
    return "utf-8"


def _html_parser(encoding: str) -> lxml.etree.HTMLParser:
    parser = _PARSERS.get(encoding)
    if parser is None:
        parser = lxml.etree.HTMLParser(encoding=encoding, remove_comments=True,
                                       remove_pis=True, default_doctype=False)
        _PARSERS[encoding] = parser
    return parser


def _selector_xpath(selector: str) -> lxml.etree.XPath:
    """XPath for a ``drop`` entry: an XPath (``/``, ``.`` or ``(`` first) or a simple CSS selector.

    The simple CSS selectors understood are ``tag``, ``.class``, ``#id`` and their compounds
    (``div.note#x``); anything else must be written as XPath (the ``cssselect`` package, which
    lxml needs for full CSS, is not a dependency).

    Raises:
        ValueError: ``selector`` is neither valid XPath nor a simple CSS selector.
    """
    selector = selector.strip()
    if selector[:1] in ("/", "(") or selector.startswith("./"):
        expr = selector if not selector.startswith("/") else "." + selector
    else:
        match = _CSS_SIMPLE.match(selector)
        if not match or not selector:
            raise ValueError(f"drop selector {selector!r}: not XPath and not a simple CSS "
                             "selector (tag, .class, #id)")
        conditions = []
        for kind, name in re.findall(r"([.#])([\w-]+)", match.group(2)):
            if kind == ".":
                conditions.append(f"contains(concat(' ', normalize-space(@class), ' '), "
                                  f"' {name} ')")
            else:
                conditions.append(f"@id='{name}'")
        expr = f".//{match.group(1) or '*'}" + "".join(f"[{c}]" for c in conditions)
    try:
        return lxml.etree.XPath(expr)
    except lxml.etree.XPathSyntaxError as e:
        raise ValueError(f"drop selector {selector!r}: {e}") from e


def _remove(element) -> None:
    """Remove ``element`` from its tree, keeping its tail text in place."""
    parent = element.getparent()
    if parent is None:
        return
    tail = element.tail
    if tail:
        previous = element.getprevious()
        if previous is not None:
            previous.tail = (previous.tail or "") + tail
        else:
            parent.text = (parent.text or "") + tail
    parent.remove(element)


def _is_boilerplate(element, tag: str) -> bool:
    """Whether ``element`` (an element named ``tag``) is navigation or other non-text."""
    if tag in _DROP_TAG_SET:
        return True
    classes = element.get("class")
    if tag == "aside":
        return not (classes and any(k in classes for k in _KEPT_ASIDES))
    if classes:
        tokens = classes.split()
        if not _DROP_TOKEN_SET.isdisjoint(tokens):
            return True
        if tag == "div" and ("header" in tokens or "contents" == classes.strip()):
            return "contents" == classes.strip() or _TEXINFO_NAV(element)
        if tag == "table" and classes.startswith("index-"):
            return True
    element_id = element.get("id")
    if element_id and element_id in _DROP_TOKEN_SET:
        return True
    role = element.get("role")
    if role and role in _DROP_ROLES:
        return True
    return element.get("hidden") is not None


def _html_text(root) -> str:
    """The text of ``root``: blocks as paragraphs, inline text run together, ``<pre>`` kept.

    Boilerplate (``_is_boilerplate``) subtrees below ``root`` are skipped, their tails kept.
    """
    out: list[str] = []
    pre = 0
    skipped = None
    walker = lxml.etree.iterwalk(root, events=("start", "end"))
    for event, element in walker:
        tag = element.tag
        if not isinstance(tag, str):
            continue
        if event == "start":
            if element is not root and _is_boilerplate(element, tag):
                walker.skip_subtree()
                skipped = element
                continue
            if tag in _PARAGRAPH_TAGS:
                out.append("\n\n")
            elif tag in _LINE_TAGS:
                out.append("\n")
            elif tag in _CELL_TAGS:
                out.append(" ")
            if tag in _PRE_TAGS:
                pre += 1
            text = element.text
            if text:
                out.append(_BLANK_LINES.sub("\n", text) if pre else _WS.sub(" ", text))
        else:
            if element is skipped:
                skipped = None
            else:
                if tag in _PRE_TAGS:
                    pre -= 1
                if tag in _PARAGRAPH_TAGS:
                    out.append("\n\n")
                elif tag in _LINE_TAGS:
                    out.append("\n")
                elif tag in _CELL_TAGS:
                    out.append(" ")
            if element is not root:
                tail = element.tail
                if tail:
                    out.append(_BLANK_LINES.sub("\n", tail) if pre else _WS.sub(" ", tail))
    return "".join(out)


def extract_html(path: str, *, main: str | None = None, drop: Sequence[str] = ()
                 ) -> Iterator[Document]:
    """One document per HTML page (Sphinx, javadoc, rustdoc, Erlang, DocBook, Texinfo, ...).

    The page is decoded by its declared encoding (BOM, XML declaration or ``<meta charset>``;
    UTF-8 when none; Latin-1 read as its superset cp1252). Kept: the main-content subtree, which
    is the elements matching ``main`` if given and matching, else the first of ``#main-content``
    (rustdoc), ``[role=main]`` (Sphinx ``div.body``, javadoc ``main``), ``<main>``, Sphinx
    ``div.body``/``div.document``, javadoc ``div.contentContainer``, Erlang ``div#content``,
    ``<body>``. Dropped inside it: ``script``/``style``/``noscript``/``nav``/``header``/
    ``footer``/``form``/``button``/``svg`` (and other non-text elements), ``aside`` except
    docutils footnotes/sidebars/topics, ``role=navigation|search|banner|contentinfo``, elements
    whose class or id is a navigation token (``sphinxsidebar``, ``related``, ``footer``,
    ``navbar``, ``breadcrumb(s)``, ``toc``, ``toctree-wrapper``, ``headerlink``, ``docnav``,
    rustdoc's ``srclink``/``anchor``/``rightside``, ...; classes ``sidebar`` and ``header`` are
    kept since DocBook sidebars are prose and javadoc's header is the title), Texinfo's
    Next/Previous/Up bars, contents and index tables, and whatever ``drop`` selects.

    Text: block elements (``p``, ``div``, headings, ``pre``, ``table``, ``blockquote``, ...)
    are paragraphs; ``li``/``tr``/``dt``/``dd``/``br`` end a line; table cells are separated by
    a space; inline text is run together with HTML white-space rules (runs of white space are
    one space, no space is added between adjacent inline elements); ``<pre>`` keeps its line
    breaks and is one paragraph (its blank lines are removed; its indentation is lost to
    ``normalize_text``).

    Args:
        path: the page (``.html``, ``.htm``, ``.xhtml``; optionally compressed).
        main: an XPath selecting the main content (all matches are kept, in document order).
        drop: extra elements to drop: XPath expressions (starting with ``/``, ``./`` or ``(``)
            or simple CSS selectors (``tag``, ``.class``, ``#id``, compounds such as
            ``div.note``); full CSS is not supported since ``cssselect`` is not installed.

    Yields:
        ``Document("", text)`` unless the page has no text.

    Raises:
        ExtractError: the page cannot be parsed (or its compressed stream is corrupt).
        ValueError: ``main`` or a ``drop`` entry is not a valid selector.
    """
    drop_xpaths = [_selector_xpath(d) for d in drop]
    try:
        main_xpath = lxml.etree.XPath(main) if main else None
    except lxml.etree.XPathSyntaxError as e:
        raise ValueError(f"main {main!r}: {e}") from e
    data = read_bytes(path)
    if not data.strip():
        return
    try:
        root = lxml.etree.fromstring(data, parser=_html_parser(_html_encoding(data)))
    except (lxml.etree.ParserError, lxml.etree.XMLSyntaxError, ValueError) as e:
        raise ExtractError(f"{path}: unparseable HTML: {e}") from e
    if root is None:
        return
    roots = main_xpath(root) if main_xpath is not None else []
    roots = [r for r in roots if isinstance(r, lxml.etree._Element)]
    if not roots:
        for xpath in _MAIN_XPATHS:
            found = xpath(root)
            if found:
                roots = found[:1]
                break
        else:
            roots = [root]
    parts = []
    for subtree in roots:
        for xpath in drop_xpaths:
            for element in xpath(subtree):
                if isinstance(element, lxml.etree._Element) and element is not subtree:
                    _remove(element)
        parts.append(_html_text(subtree))
    text = normalize_text("\n\n".join(parts))
    if text:
        yield Document("", text)


# ---------------------------------------------------------------------------------------------
# roff man pages

_ROFF_CHARS = {
    "em": "\u2014", "en": "\u2013", "hy": "-", "mi": "-", "aq": "'", "dq": '"', "co": "\u00a9",
    "rg": "\u00ae", "tm": "\u2122", "bu": "\u2022", "lq": "\u201c", "rq": "\u201d",
    "oq": "\u2018", "cq": "\u2019", "ga": "`", "ha": "^", "ti": "~", "pl": "+", "mu": "\u00d7",
    "di": "\u00f7", "de": "\u00b0", "->": "\u2192", "<-": "\u2190", ">=": "\u2265",
    "<=": "\u2264", "!=": "\u2260", "==": "\u2261", "sc": "\u00a7", "dg": "\u2020",
    "ba": "|", "br": "|", "rs": "\\", "sl": "/", "lB": "[", "rB": "]", "lC": "{", "rC": "}",
    "la": "\u27e8", "ra": "\u27e9", "Fo": "\u00ab", "Fc": "\u00bb", "fo": "\u2039",
    "fc": "\u203a", "pd": "\u2202", "if": "\u221e", "+-": "\u00b1", "ct": "\u00a2",
    "Po": "\u00a3", "Eu": "\u20ac", "eu": "\u20ac", "Ye": "\u00a5", "ps": "\u00b6",
    "at": "@", "sh": "#", "Do": "$", "ul": "_", "ru": "_", "fm": "\u2032", "sd": "\u2033",
    "ss": "\u00df", "ae": "\u00e6", "AE": "\u00c6", "o/": "\u00f8", "O/": "\u00d8",
    "'e": "\u00e9", "`e": "\u00e8", "^e": "\u00ea", ":u": "\u00fc", ":o": "\u00f6",
    ":a": "\u00e4", ":U": "\u00dc", ":O": "\u00d6", ":A": "\u00c4", "'a": "\u00e1",
    "`a": "\u00e0", ",c": "\u00e7", "~n": "\u00f1", "'o": "\u00f3", "'i": "\u00ed",
    "'u": "\u00fa", "ci": "\u25cb", "sq": "\u25a1", "OK": "\u2713", "...": "\u2026",
    "char92": "\\", "char46": ".", "char39": "'", "char34": '"', "nbsp": " ", "ua": "\u2191",
    "da": "\u2193", "<>": "\u2194", "tno": "~", "aa": "\u00b4", "'": "\u00b4", "ap": "~",
    "ho": "\u02db", "bq": "\u201e", "Bq": "\u201e", "r!": "\u00a1", "r?": "\u00bf",
}
_ROFF_STRINGS = {"R": "\u00ae", "Tm": "\u2122", "lq": "\u201c", "rq": "\u201d", "Aq": "'",
                 "L\"": "\u201c", "R\"": "\u201d", "C+": "C++", "C`": "\u201c", "C'": "\u201d",
                 "PI": "\u03c0", "Lq": "\u201c", "Rq": "\u201d", "ga": "`", "aq": "'"}
_ROFF_ESCAPE = re.compile(
    r"\\(?:"
    r"(?P<font>f(?:\(..|\[[^\]\n]*\]|.))"
    r"|(?P<size>s(?:[+-]?\d|\([+-]?\d\d|[+-]?\(\d\d|\[[^\]\n]*\]|'[^'\n]*'))"
    r"|\((?P<char2>..)"
    r"|\[(?P<charn>[^\]\n]*)\]"
    r"|\*(?:\((?P<str2>..)|\[(?P<strn>[^\]\n]*)\]|(?P<str1>.))"
    r"|(?P<reg>[nk](?:\(..|\[[^\]\n]*\]|[+-]?.))"
    r"|(?P<quoted>[hvwoXlLbDRSZxMmAC]'[^'\n]*')"
    r"|N'(?P<num>\d+)'"
    r"|(?P<gm>[gmM](?:\(..|\[[^\]\n]*\]|.))"
    r"|\$(?P<arg>.)"
    r"|(?P<other>.)"
    r")")
_ROFF_SIMPLE = {"-": "-", "e": "\\", "E": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ",
                "'": "'", "`": "`", ".": ".", "t": "\t", "_": "_", "?": ""}


def _roff_escape(match: re.Match) -> str:
    group = match.lastgroup
    value = match.group(group)
    if group == "char2" or group == "charn":
        if value.startswith("u") and re.fullmatch(r"u[0-9A-Fa-f]{4,6}(?:_[0-9A-Fa-f]{4,6})*",
                                                  value):
            return "".join(chr(int(v, 16)) for v in value[1:].split("_"))
        return _ROFF_CHARS.get(value, "")
    if group in ("str2", "strn", "str1"):
        return _ROFF_STRINGS.get(value, "")
    if group == "num":
        return chr(int(value)) if int(value) < 0x110000 else ""
    if group == "other":
        return _ROFF_SIMPLE.get(value, "" if value in "&%c:|^)/,{}!zdrupa#\n" else value)
    return ""  # fonts, sizes, registers, motions, macro arguments


def _roff_text(text: str) -> str:
    """``text`` with roff escapes resolved (comments must already be gone)."""
    if "\\" not in text:
        return text
    return _ROFF_ESCAPE.sub(_roff_escape, text)


def _roff_args(line: str) -> list[str]:
    """The arguments of a request line (after its name), split the roff way (quotes group)."""
    args: list[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        current = []
        if line[i] == '"':
            i += 1
            while i < n:
                if line[i] == '"':
                    if i + 1 < n and line[i + 1] == '"':
                        current.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                if line[i] == "\\" and i + 1 < n:
                    current.append(line[i:i + 2])
                    i += 2
                    continue
                current.append(line[i])
                i += 1
        else:
            while i < n and line[i] not in " \t":
                if line[i] == "\\" and i + 1 < n:
                    current.append(line[i:i + 2])
                    i += 2
                    continue
                current.append(line[i])
                i += 1
        args.append("".join(current))
    return args


_COMMENT = re.compile(r'\\".*|\\#.*')
_REQUEST = re.compile(r"^[.'][ \t]*(\S*)[ \t]*(.*)$")
_MDOC_CALLABLE = frozenset(
    "Ac Ad An Ao Ap Aq Ar At Bc Bo Bq Brc Bro Brq Bsx Bx Cm Dc Do Dq Dv Dx Ec Em En Eo Er Ev "
    "Fa Fc Fl Fn Fo Fr Ft Fx Ic Li Lk Ms Mt Nm No Ns Nx Oc Oo Op Ox Pa Pc Pf Po Pq Qc Ql Qo Qq "
    "Sc So Sq St Sx Sy Tn Ux Va Vt Xc Xo Xr".split())
_FONT_ALTERNATING = frozenset(("BR", "BI", "IB", "IR", "RB", "RI"))
_FONT_SINGLE = frozenset(("B", "I", "SM", "SB", "R", "CW", "CR"))
_PARAGRAPH_REQUESTS = frozenset(("PP", "P", "LP", "sp", "HP", "Pp", "Lp", "RS", "RE", "Bl",
                                 "El", "Bd", "Ed", "ne", "bp", "SY", "YS", "in", "ti"))
_IGNORED_BLOCKS = {"de": "..", "de1": "..", "am": "..", "ig": "..", "EQ": ".EN", "PS": ".PE",
                   "GS": ".GE"}


def extract_man(path: str) -> Iterator[Document]:
    """One document per roff man page (``man(7)``, with basic ``mdoc(7)`` support).

    Kept: text lines (filled lines joined with a space), ``.SH``/``.SS`` (and mdoc
    ``.Sh``/``.Ss``) titles as heading paragraphs, the text of font macros (``.B``, ``.I``,
    ``.SM``; ``.BR``/``.IR``/``.RB``/... with their alternating arguments joined without space
    as roff does), ``.TP``/``.IP`` tags on their own line, ``.nf``/``.EX`` blocks line by line,
    ``tbl`` table rows (cells separated by a space), ``.UR``/``.MT`` link text. Dropped: the
    other requests and macros (``.TH``, ``.PD``, ``.ds``, ``.if``, ...), macro definitions
    (``.de``..``..``), ``.ig`` blocks, ``eqn``/``pic`` blocks, comments (``.\\"``, ``\\"``,
    ``\\#``), font/size/motion escapes. Special characters (``\\(em``, ``\\[aq]``, ``\\-``,
    ``\\e``, ``\\*(R``, ...) become their Unicode characters. ``.PP``/``.P``/``.LP``/``.sp``
    and blank lines are paragraph breaks, ``.br`` a line break. A page that is only a ``.so``
    redirection (a link to another page) yields nothing; ``.so`` lines elsewhere are dropped.

    Args:
        path: the page (``.1``..``.9``, ``.3perl``, ...; optionally ``.gz``).

    Yields:
        ``Document("", text)`` unless the page has no text.

    Raises:
        ExtractError: the compressed stream is corrupt.
    """
    lines = read_text(path).split("\n")
    out: list[str] = []
    fill = True
    tag_pending = False  # after .TP the next output line is the tag, then a line break
    heading_pending = False  # .SH alone: the next text line is the heading
    table = 0  # 0: not in a table, 1: in tbl options/format, 2: in tbl data
    join_next = False  # previous line ended with \c
    skip_until: str | None = None
    mdoc = False

    def emit(text: str, *, as_line: bool = False) -> None:
        nonlocal tag_pending, heading_pending, join_next
        if not text.strip():
            return
        if heading_pending:
            out.append("\n\n" + text.strip() + "\n\n")
            heading_pending = False
            return
        if join_next and out:
            out[-1] = out[-1].rstrip(" ")
            join_next = False
        out.append(text)
        if tag_pending:
            out.append("\n")
            tag_pending = False
        else:
            out.append("\n" if as_line or not fill else " ")

    for raw in lines:
        if skip_until is not None:
            if raw.strip().startswith(skip_until) or raw.strip() == skip_until:
                skip_until = None
            continue
        if raw.startswith((".\\\"", "'\\\"", ".\\#", "'\\#")):
            continue
        line = _COMMENT.sub("", raw.replace("\\\\", "\\e")) if "\\" in raw else raw
        if line.endswith("\\c"):
            line = line[:-2]
            continue_after = True
        else:
            continue_after = False
        if line.startswith((".", "'")):
            match = _REQUEST.match(line)
            name, rest = (match.group(1), match.group(2)) if match else ("", "")
            if not name:
                continue
            if name in _IGNORED_BLOCKS:
                skip_until = _IGNORED_BLOCKS[name]
                continue
            if name in ("Dd", "Dt", "Os"):
                mdoc = True
            if name == "TS":
                table = 1
                out.append("\n\n")
                continue
            if name == "TE":
                table = 0
                out.append("\n\n")
                continue
            if name in ("T{", "T}"):
                continue
            args = _roff_args(rest)
            if name in ("SH", "SS", "Sh", "Ss"):
                fill = True
                tag_pending = False
                if args:
                    out.append("\n\n" + " ".join(_roff_text(a) for a in args) + "\n\n")
                else:
                    heading_pending = True
            elif name in _FONT_SINGLE:
                emit(" ".join(_roff_text(a) for a in args))
            elif name in _FONT_ALTERNATING:
                emit("".join(_roff_text(a) for a in args))
            elif name in ("TP", "TQ"):
                out.append("\n\n" if name == "TP" else "\n")
                tag_pending = True
            elif name == "IP":
                out.append("\n\n")
                if args and _roff_text(args[0]).strip() not in ("", "\u2022", "*", "-"):
                    emit(_roff_text(args[0]), as_line=True)
            elif name in _PARAGRAPH_REQUESTS:
                out.append("\n\n")
                if name == "SY" and args:
                    emit(" ".join(_roff_text(a) for a in args))
            elif name in ("br", "Nd", "It"):
                out.append("\n")
                if name == "Nd":
                    emit("- " + " ".join(_roff_text(a) for a in args))
                elif name == "It" and args:
                    emit(" ".join(_roff_text(a) for a in args if a not in _MDOC_CALLABLE),
                         as_line=True)
            elif name in ("nf", "EX", "Vb"):
                out.append("\n\n")
                fill = False
            elif name in ("fi", "EE", "Ve"):
                out.append("\n\n")
                fill = True
            elif name in ("UE", "ME") and args:
                if out:
                    out[-1] = out[-1].rstrip(" ")
                emit("".join(_roff_text(a) for a in args))
            elif name == "OP" and args:
                emit("[" + " ".join(_roff_text(a) for a in args) + "]")
            elif mdoc and (name in _MDOC_CALLABLE or name in ("Nm", "Xr")):
                words = [_roff_text(a) for a in args if a not in _MDOC_CALLABLE]
                if name == "Fl":
                    words = ["-" + w for w in words] or ["-"]
                elif name == "Xr" and len(words) >= 2:
                    words = [f"{words[0]}({words[1]})"] + words[2:]
                emit(" ".join(words))
            continue_after = False  # a request with \c is rare; keep it simple
        else:
            if table == 1:
                if line.rstrip().endswith("."):
                    table = 2
                continue
            text = _roff_text(line)
            if table == 2:
                emit(" ".join(c.strip() for c in text.split("\t")), as_line=True)
            elif not line.strip():
                out.append("\n" if not fill else "\n\n")
            elif fill and line[:1] in (" ", "\t"):
                out.append("\n")
                emit(text)
            else:
                emit(text)
        join_next = continue_after
    if not out:
        return
    text = normalize_text("".join(out))
    if text:
        yield Document("", text)


# ---------------------------------------------------------------------------------------------
# POD

_POD_ENCODING = re.compile(rb"^=encoding[ \t]+(\S+)", re.MULTILINE)
_POD_COMMAND = re.compile(r"^=([a-zA-Z]\S*)[ \t]*(.*)", re.DOTALL)
_POD_CODE_START = re.compile(r"([A-Z])(<+)")
_POD_TEXT_FORMATS = ("text", "txt")


def _pod_entity(name: str) -> str:
    name = name.strip()
    named = {"lt": "<", "gt": ">", "sol": "/", "verbar": "|", "lchevron": "\u00ab",
             "rchevron": "\u00bb"}
    if name in named:
        return named[name]
    try:
        if name.lower().startswith("0x"):
            return chr(int(name, 16))
        if name.startswith("0") and len(name) > 1:
            return chr(int(name, 8))
        if name.isdigit():
            return chr(int(name))
    except (ValueError, OverflowError):
        return ""
    codepoint = html.entities.name2codepoint.get(name)
    return chr(codepoint) if codepoint else ""


def _pod_content(s: str, i: int, count: int) -> tuple[str, int]:
    """Render the formatting codes in ``s`` from ``i`` on.

    ``count`` is 0 for top level (to the end of ``s``), 1 inside a single-bracket code (to the
    first ``>`` that closes no nested code), n > 1 inside an n-bracket code (to white space
    followed by n ``>``). Returns the rendered text and the index after the closer.
    """
    closer = re.compile(r"[ \t\n]+" + ">" * count) if count > 1 else None
    out: list[str] = []
    n = len(s)
    while i < n:
        if count == 1 and s[i] == ">":
            return "".join(out), i + 1
        if closer is not None:
            match = closer.match(s, i)
            if match:
                return "".join(out).strip(), match.end()
        code = _POD_CODE_START.match(s, i)
        if code:
            letter, brackets = code.group(1), code.group(2)
            j = code.end()
            if len(brackets) > 1 and j < n and s[j] in " \t\n":
                text, i = _pod_content(s, j + 1, len(brackets))
            else:
                text, i = _pod_content(s, code.start(2) + 1, 1)
            out.append(_pod_render(letter, text))
            continue
        out.append(s[i])
        i += 1
    return ("".join(out).strip() if count > 1 else "".join(out)), i


def _pod_render(code: str, text: str) -> str:
    """The text a formatting code renders to, given its rendered content."""
    if code in ("X", "Z"):
        return ""
    if code == "E":
        return _pod_entity(text)
    if code == "L":
        if "|" in text:
            return text.split("|", 1)[0]
        if re.match(r"\w+:[^:\s]\S*$", text):
            return text  # a URL
        if "/" in text:
            page, section = text.split("/", 1)
            section = section.strip('"')
            return f'"{section}" in {page}' if page else f'"{section}"'
        return text
    return text


def _pod_format(text: str) -> str:
    """``text`` (an ordinary paragraph or command argument) with its formatting codes rendered."""
    return _pod_content(text, 0, 0)[0] if "<" in text else text


def extract_pod(path: str) -> Iterator[Document]:
    """One document per Perl POD file (``.pod``, or the POD in a ``.pm``/``.pl``).

    Kept: ``=head1``..``=head4`` titles as heading paragraphs, ``=item`` labels (a bare ``*``
    or number label is dropped), ordinary paragraphs with their lines joined and formatting
    codes rendered (``B``/``I``/``C``/``F``/``S`` to their content, ``L<text|link>`` to
    ``text``, ``L<page/section>`` to ``"section" in page``, ``E<..>`` to the character; ``X``
    and ``Z`` dropped; multi-bracket forms ``C<< a->b >>`` understood), verbatim (indented)
    paragraphs as they are, and ``=begin text``/``=for text`` content (or ``:``-prefixed
    formats, which are POD). Dropped: other ``=begin``..``=end`` and ``=for`` formats (html,
    man, latex, ...), the code outside POD (before the first command and from ``=cut`` to the
    next command), ``=pod``/``=over``/``=back``/``=encoding``. The file is decoded by its
    ``=encoding`` (else UTF-8, falling back to Latin-1 if it is not valid UTF-8).

    Args:
        path: the POD file (optionally compressed).

    Yields:
        ``Document("", text)`` unless the file has no POD text.

    Raises:
        ExtractError: the compressed stream is corrupt or the ``=encoding`` is unknown.
    """
    data = read_bytes(path)
    match = _POD_ENCODING.search(data)
    if match:
        encoding = match.group(1).decode("ascii", "replace")
        try:
            source = data.decode(encoding, errors="replace")
        except LookupError as e:
            raise ExtractError(f"{path}: unknown =encoding {encoding!r}") from e
    else:
        try:
            source = data.decode("utf-8")
        except UnicodeDecodeError:
            source = data.decode("latin-1")
    paragraphs: list[list[str]] = []
    in_pod = False
    current: list[str] = []
    for line in source.replace("\r\n", "\n").split("\n"):
        if not in_pod:
            if re.match(r"=[a-zA-Z]", line):
                in_pod = True
            else:
                continue
        if not line.strip():
            if current:
                paragraphs.append(current)
                current = []
            continue
        if not current and line.startswith("=cut"):
            in_pod = False
            continue
        current.append(line)
    if current:
        paragraphs.append(current)

    out: list[str] = []
    skip_format: str | None = None  # inside =begin FORMAT (non-text) until =end FORMAT
    for paragraph in paragraphs:
        first = paragraph[0]
        command = _POD_COMMAND.match(first) if first.startswith("=") else None
        if skip_format is not None:
            if command and command.group(1) == "end":
                if command.group(2).split()[:1] == [skip_format] or not skip_format:
                    skip_format = None
            continue
        if command:
            name = command.group(1)
            argument = " ".join([command.group(2)] + [ln.strip() for ln in paragraph[1:]])
            argument = argument.strip()
            if name.startswith("head") or name == "item":
                if name == "item":
                    argument = re.sub(r"^(?:\*|\d+\.?)(?:\s+|$)", "", argument)
                text = _pod_format(argument).strip()
                if text:
                    out.append(text)
            elif name == "begin":
                fmt = (argument.split() or [""])[0]
                if not (fmt.startswith(":") or fmt.lower() in _POD_TEXT_FORMATS):
                    skip_format = fmt
            elif name == "for":
                parts = argument.split(None, 1)
                fmt = parts[0] if parts else ""
                if (fmt.startswith(":") or fmt.lower() in _POD_TEXT_FORMATS) and len(parts) > 1:
                    out.append(_pod_format(parts[1]))
            continue
        if first[:1] in (" ", "\t"):
            out.append("\n".join(paragraph))
        else:
            out.append(_pod_format(" ".join(ln.strip() for ln in paragraph)))
    text = normalize_text("\n\n".join(out))
    if text:
        yield Document("", text)


# ---------------------------------------------------------------------------------------------
# GNU Info

_INFO_MARKER = re.compile(r"\x00\x08\[[^\x00]*\x00\x08\]")
_INFO_NOTE_SHORT = re.compile(r"\*([Nn])ote[ \n]+([^:*]+?)::")
_INFO_NOTE_LONG = re.compile(r"\*([Nn])ote[ \n]+([^:*]+?):[ \n]+(?:\([^)\n]*\))?[^.,\n]*([.,])")
_INFO_UNDERLINE = re.compile(r"^[ \t]*([*=\-.])\1{2,}[ \t]*$", re.MULTILINE)


def _info_note(match: re.Match) -> str:
    prefix = "See " if match.group(1) == "N" else ""
    tail = match.group(3) if match.re is _INFO_NOTE_LONG else ""
    return prefix + match.group(2) + tail


def extract_info(path: str) -> Iterator[Document]:
    """One document per GNU Info file (a whole manual, or one part of a split manual).

    Kept: the text of every node, nodes separated by a paragraph break; cross references
    (``*Note Label: node.``, ``*note node::``) become their label (``See`` for ``*Note``).
    Dropped: the preamble before the first node, the ``\\x1f`` separators and ``File: ...
    Node: ...`` header lines, ``* Menu:`` blocks (to the end of their node, where Texinfo puts
    them; this also drops index entries), chapter/section underlines (``****``, ``====``,
    ``----``, ``....``), the ``Tag Table``, ``Indirect`` table and ``Local Variables`` blocks,
    and the ``\\0\\b[index\\0\\b]``/image markers.

    Args:
        path: the Info file (optionally ``.gz``).

    Yields:
        ``Document("", text)`` unless the file has no node text.

    Raises:
        ExtractError: the compressed stream is corrupt, or the file has no Info node at all.
    """
    source = read_text(path)
    chunks = source.split("\x1f")
    if len(chunks) < 2:
        if not source.strip():
            return
        raise ExtractError(f"{path}: not a GNU Info file (no node separator)")
    nodes: list[str] = []
    for chunk in chunks[1:]:
        body = chunk.lstrip("\n\x0c")
        if not body.startswith("File:"):
            continue  # Tag Table, Indirect table, End Tag Table, Local Variables
        node = body.split("\n", 1)[1] if "\n" in body else ""
        menu = re.search(r"^\* Menu:", node, re.MULTILINE)
        if menu:
            node = node[:menu.start()]
        node = re.split(r"^Local Variables:", node, maxsplit=1, flags=re.MULTILINE)[0]
        node = _INFO_MARKER.sub("", node)
        node = _INFO_UNDERLINE.sub("", node)
        node = _INFO_NOTE_SHORT.sub(_info_note, node)
        node = _INFO_NOTE_LONG.sub(_info_note, node)
        nodes.append(node)
    text = normalize_text("\n\n".join(nodes))
    if text:
        yield Document("", text)


# ---------------------------------------------------------------------------------------------
# reStructuredText

# Directives whose whole block (arguments, options, body) is dropped.
_RST_DROP_DIRECTIVES = frozenset((
    "toctree", "include", "literalinclude", "image", "only", "index", "raw", "contents",
    "sectnum", "section-numbering", "meta", "kernel-doc", "kernel-feat", "kernel-abi",
    "kernel-include", "kernel-figure", "kernel-render", "graphviz", "digraph", "graph",
    "tabularcolumns", "highlight", "default-role", "role", "class", "cssclass", "title",
    "header", "footer", "target-notes", "math", "automodule", "autoclass", "autofunction",
    "automethod", "autodata", "autoattribute", "autoexception", "autosummary", "module",
    "currentmodule", "py:module", "py:currentmodule", "c:namespace", "c:namespace-push",
    "c:namespace-pop", "cpp:namespace", "ifconfig", "moduleauthor", "sectionauthor",
    "codeauthor", "plot", "doctest-skip", "testsetup", "testcleanup", "csv-table", "cssclass",
    "maxdepth", "rst-class", "container-class",
))
# Directives whose arguments (a language, a file name) are dropped but whose body is kept.
_RST_DROP_ARGS = frozenset(("code-block", "code", "sourcecode", "figure", "container",
                            "list-table", "table", "parsed-literal", "productionlist",
                            "glossary", "hlist", "doctest", "testcode", "testoutput"))
_RST_DIRECTIVE = re.compile(r"^(\s*)\.\.[ \t]+([A-Za-z0-9_:+.-]+)::(?:[ \t]+(.*))?$")
_RST_EXPLICIT = re.compile(r"^(\s*)\.\.(?:[ \t]+(.*))?$")
_RST_FOOTNOTE = re.compile(r"^(\s*)\.\.[ \t]+\[[^\]]+\][ \t]*(.*)$")
_RST_OPTION = re.compile(r"^\s+:[\w .-]+:(?:\s|$)")
_RST_FIELD = re.compile(r"^:(?:[^:`\s][^:`]*):(?:[ \t]|$)")
_RST_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1+\s*$")
_RST_TABLE_BORDER = re.compile(r"^\s*(?:\+[-=+:]+\+|=+(?:[ \t]+=+)+|-+(?:[ \t]+-+)+)\s*$")
_RST_ROLE = re.compile(r":(?:[A-Za-z0-9_.+-]+:)+`((?:[^`\\]|\\.)+)`|`((?:[^`\\]|\\.)+)`:"
                       r"(?:[A-Za-z0-9_.+-]+:)+")
_RST_LITERAL = re.compile(r"``(.+?)``")
_RST_REFERENCE = re.compile(r"`((?:[^`\\]|\\.)+)`__?")
_RST_INTERPRETED = re.compile(r"`((?:[^`\\]|\\.)+)`")
_RST_STRONG = re.compile(r"(?<![\w*\\])\*\*(\S(?:.*?\S)?)\*\*(?![\w*])")
_RST_EMPHASIS = re.compile(r"(?<![\w*\\])\*([^\s*](?:[^*]*?[^\s*\\])?)\*(?![\w*])")
_RST_FOOTNOTE_REF = re.compile(r"\s?\[(?:#[\w-]*|\*|\d+)\]_")
_RST_NAME_REF = re.compile(r"(?<![\w_])([A-Za-z][A-Za-z0-9-]*)__?(?=[\s.,;:!?)'\"]|$)")
_RST_SUBST_DEF = re.compile(r"^\s*\.\.[ \t]+\|[^|]+\|")
_RST_TARGET = re.compile(r"^\s*\.\.[ \t]+_")
_RST_ANON_TARGET = re.compile(r"^\s*__[ \t]+\S")
_RST_AUTO_ENUM = re.compile(r"^(\s*)#\.[ \t]+")


def _rst_role(match: re.Match) -> str:
    text = match.group(1) if match.group(1) is not None else match.group(2)
    target = re.match(r"(.*?)\s*<([^<>]*)>$", text, re.DOTALL)
    if target and target.group(1):
        return target.group(1)
    text = target.group(2) if target else text
    if text.startswith("~"):
        text = re.split(r"[.:]", text[1:])[-1]
    return text.lstrip("!")


def _rst_reference(match: re.Match) -> str:
    text = match.group(1)
    target = re.match(r"(.*?)\s*<([^<>]*)>$", text, re.DOTALL)
    if target:
        return target.group(1) or target.group(2)
    return text


def _rst_inline(text: str) -> str:
    """``text`` with reST inline markup resolved to its displayed text."""
    if "`" in text:
        literals: list[str] = []

        def keep(match: re.Match) -> str:
            literals.append(match.group(1))
            return f"\x00{len(literals) - 1}\x00"

        text = _RST_LITERAL.sub(keep, text)
        text = _RST_ROLE.sub(_rst_role, text)
        text = _RST_REFERENCE.sub(_rst_reference, text)
        text = _RST_INTERPRETED.sub(lambda m: m.group(1), text)
        text = re.sub(r"\x00(\d+)\x00", lambda m: literals[int(m.group(1))], text)
    if "*" in text:
        text = _RST_STRONG.sub(r"\1", text)
        text = _RST_EMPHASIS.sub(r"\1", text)
    if "_" in text:
        text = _RST_FOOTNOTE_REF.sub("", text)
        text = _RST_NAME_REF.sub(r"\1", text)
    if "\\" in text:
        text = re.sub(r"\\([^A-Za-z0-9\s])", r"\1", text)
        text = text.replace("\\ ", "")
    return text


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def extract_rst(path: str) -> Iterator[Document]:
    """One document per reStructuredText file (Linux kernel ``Documentation``, Sphinx sources).

    Kept: paragraphs, lists, section titles (as paragraphs), literal blocks (``::`` blocks,
    ``code-block`` bodies), the bodies of prose directives (``note``, ``warning``, ``seealso``,
    ``versionadded``, domain directives such as ``c:function`` with their signature, ``figure``
    captions, tables, unknown directives) without their option lines, footnote bodies. Inline
    markup becomes its text: ``:role:`x``` -> ``x`` (``Title <target>`` -> ``Title``, ``~a.b`` ->
    ``b``), ```text <url>`_`` -> ``text``, ````x```` -> ``x``, ``**x**``/``*x*`` -> ``x``,
    footnote references dropped; a paragraph-final ``::`` becomes ``:``. Dropped: comments
    (``..`` blocks that are not directives), hyperlink targets, substitution definitions,
    section adornments and table borders, field lists at the margin (``:Author: ...``), and
    the whole block of non-prose directives (``toctree``, ``include``, ``image``, ``only``,
    ``index``, ``raw``, ``contents``, ``kernel-doc``, ``math``, ``csv-table``, ...).

    Args:
        path: the file (``.rst``/``.txt``; optionally compressed).

    Yields:
        ``Document("", text)`` unless the file has no text.

    Raises:
        ExtractError: the compressed stream is corrupt.
    """
    lines = read_text(path).expandtabs(8).split("\n")
    out: list[str] = []
    skip_indent: int | None = None  # skipping a block more indented than this
    options_indent: int | None = None  # dropping option lines right after a kept directive
    literal_indent: int | None = None  # inside a literal block indented more than this
    paragraph: list[str] = []  # prose lines, their inline markup resolved together

    def flush() -> None:
        if paragraph:
            out.append(_rst_inline("\n".join(paragraph)))
            paragraph.clear()

    for line in lines:
        stripped = line.strip()
        indent = _indent(line)
        if skip_indent is not None:
            if not stripped or indent > skip_indent:
                continue
            skip_indent = None
        if options_indent is not None:
            if stripped and indent > options_indent and _RST_OPTION.match(line):
                continue
            options_indent = None
        if literal_indent is not None:
            if not stripped or indent > literal_indent:
                flush()
                out.append(line)
                continue
            literal_indent = None
        if not stripped:
            flush()
            out.append("")
            continue
        directive = _RST_DIRECTIVE.match(line)
        if directive:
            name = directive.group(2).lower()
            argument = directive.group(3) or ""
            if name in _RST_DROP_DIRECTIVES or _RST_SUBST_DEF.match(line):
                skip_indent = indent
                continue
            options_indent = indent
            flush()
            out.append("")
            if argument and name not in _RST_DROP_ARGS:
                out.append(_rst_inline(argument))
                out.append("")
            if name in ("code-block", "code", "sourcecode", "parsed-literal", "productionlist",
                        "doctest", "testcode", "testoutput"):
                literal_indent = indent
            continue
        footnote = _RST_FOOTNOTE.match(line)
        if footnote:
            flush()
            paragraph.append(footnote.group(2))
            continue
        explicit = _RST_EXPLICIT.match(line)
        if explicit or _RST_ANON_TARGET.match(line):
            flush()
            skip_indent = indent  # comment, target or substitution definition
            continue
        if indent == 0 and _RST_FIELD.match(line):
            flush()
            skip_indent = 0
            continue
        if _RST_ADORNMENT.match(stripped) and len(stripped) >= 2 or _RST_TABLE_BORDER.match(line):
            flush()
            out.append("")
            continue
        if stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1:
            line = " ".join(cell.strip() for cell in stripped.strip("|").split("|"))
        elif stripped.startswith("| "):
            line = stripped[2:]
        if stripped.endswith("::"):
            literal_indent = indent
            line = line.rstrip()[:-2]
            line = line.rstrip() if line.endswith(" ") else line + ":"
            if line.strip() and line.strip() != ":":
                paragraph.append(line)
            flush()
            continue
        paragraph.append(_RST_AUTO_ENUM.sub(r"\1", line))
    flush()
    text = normalize_text("\n".join(out))
    if text:
        yield Document("", text)


# ---------------------------------------------------------------------------------------------
# Plain text

_GUTENBERG_START = re.compile(r"^\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG.*$",
                              re.MULTILINE | re.IGNORECASE)
_GUTENBERG_END = re.compile(r"^\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG.*$",
                            re.MULTILINE | re.IGNORECASE)
_GUTENBERG_END_LINE = re.compile(r"\n[ \t]*End of (?:the |this )?Project Gutenberg.*\s*$",
                                 re.IGNORECASE)
_BLANK_RUN3 = re.compile(r"\n(?:[ \t\r\f]*\n){3,}")
_SPLITS = ("file", "blank_line3")


def extract_plain(path: str, *, split: str = "file", encoding: str = "utf-8"
                  ) -> Iterator[Document]:
    """Plain text: the whole file, or the groups of it separated by 3 or more blank lines.

    A Project Gutenberg header (everything up to the ``*** START OF THE/THIS PROJECT
    GUTENBERG ...`` line) and footer (from the ``*** END OF ...`` line on, with a preceding
    ``End of Project Gutenberg's ...`` line) are dropped when present; an NLTK-style first line
    ``[Title by Author Year]`` is text and kept.

    Args:
        path: the file (optionally compressed).
        split: ``"file"``: one document named ``""``; ``"blank_line3"``: one document per group
            of lines separated by runs of >= 3 blank lines, named by its index (``"0"``,
            ``"1"``, ... counting the non-empty ones).
        encoding: the file's encoding (undecodable bytes are dropped).

    Yields:
        The documents, in file order; empty ones are skipped.

    Raises:
        ExtractError: the compressed stream is corrupt.
        ValueError: ``split`` is not one of the above, or ``encoding`` is unknown.
    """
    if split not in _SPLITS:
        raise ValueError(f"split {split!r}: expected one of {', '.join(_SPLITS)}")
    source = read_text(path, encoding).replace("\r\n", "\n")
    start = _GUTENBERG_START.search(source)
    if start:
        source = source[start.end():]
    end = _GUTENBERG_END.search(source)
    if end:
        source = _GUTENBERG_END_LINE.sub("\n", source[:end.start()])
    if split == "file":
        text = normalize_text(source)
        if text:
            yield Document("", text)
        return
    index = 0
    for block in _BLANK_RUN3.split(source):
        text = normalize_text(block)
        if text:
            yield Document(str(index), text)
            index += 1
