"""ctx-prep-docs: turn raw parallel documents into fairseq-preprocess input.

Five input formats (see ``docs/prep_docs.md``):

* ``xml``: IWSLT/mteval-style XML, ``<doc docid=...>`` elements holding
  ``<seg id=...>`` elements, one file per language;
* ``wmt``: WMT test-set XML (WMT21 and later), one file per language pair:
  ``<dataset>``, optional ``<collection>``, ``<doc id=... origlang=...>``
  holding one ``<src lang=...>``, ``<ref lang=... translator=...>`` elements
  and ``<hyp system=...>`` elements, each holding ``<p>`` paragraphs of
  ``<seg id=...>``. ``--ref-translator NAME`` picks the reference (default:
  each document's first ``<ref>``; a document without NAME's reference is an
  error, another reference is never used in its place; a ``<ref>`` without
  ``translator`` takes the one on its ``<src>``). ``--hyp-system NAME`` also
  writes ``PREFIX.hyp.{tgt_lang}``, that system's segments line-aligned with
  the source (empty hypotheses allowed). ``--paragraph-boundaries`` makes
  each paragraph a document with the id ``DOCID.pN`` (N = 1, 2, ... in the
  document). References and hypotheses must have the source's segment ids in
  the same order and paragraphs; ``lang`` attributes must match
  ``--src-lang``/``--tgt-lang`` (``en`` matches ``en_XX``); documents with a
  ``testsuite`` attribute (no references) are skipped. Given such a file,
  ``xml`` mode fails with a message pointing to ``wmt`` mode;
* ``sgml``: the WMT ``.sgm`` pairs used before 2021 (``<srcset>``/``<refset>``,
  ``<doc docid=...>``, ``<seg id=...>``), which are not always well-formed
  XML: read tolerantly (bare ``&`` and ``<`` in text kept, unquoted
  attributes, missing ``</seg>``/``</doc>``), entities unescaped (see
  :func:`_parse_sgml`);
* ``blank-lines``: one sentence per line, a blank line between documents, at
  the same positions in both files;
* ``docids``: one sentence per line plus a file with the document id of each
  line (documents contiguous);
* ``tags``: the IWSLT training files ``train.tags.L1-L2.{L1,L2}``: each talk's
  metadata lines (first non-blank character ``<``: ``<url>``, ``<talkid>``,
  ``<title>``, ...) followed by its transcript, one segment per line; the
  talk id is the ``<talkid>`` (see :func:`load_tags`).

Output, for ``--out-prefix PREFIX``: ``PREFIX.{src_lang}``,
``PREFIX.{tgt_lang}`` and ``PREFIX.docids`` (the document id of each line),
ready for ``fairseq-preprocess --source-lang L1 --target-lang L2 --trainpref
PREFIX`` (plus ``PREFIX.hyp.{tgt_lang}`` for ``wmt --hyp-system``).
Everything is read and validated before anything is written; the files are
written to temporary names in the output directory and renamed into place
only when all of them are complete.

Every problem raises :class:`PrepDocsError`, whose text is
``FILE:LINE: what is wrong / what was expected``.

Library entry points: :func:`read_xml_documents`, :func:`read_sgml_documents`,
:func:`read_docids`, :func:`load_xml`, :func:`load_sgml`, :func:`load_wmt`,
:func:`load_blank_lines`, :func:`load_docids`, :func:`load_tags`,
:func:`write_documents`, :func:`prepare_documents` and :func:`prepare_wmt`.
"""

import argparse
import os
import re
import sys
import tempfile
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ctx_fairseq.data.docids import DocFileError as PrepDocsError
from ctx_fairseq.data.docids import check_docid as _check_docid
from ctx_fairseq.data.docids import read_docid_lines as read_docids
from ctx_fairseq.data.docids import read_lines as _read_lines

PROG = "ctx-prep-docs"
MODES = ("xml", "sgml", "blank-lines", "docids", "tags")

# One document: its id and its sentence pairs (source, target).
ParallelDoc = Tuple[str, List[Tuple[str, str]]]

# Characters that str.splitlines() (and so some readers of our output) treat
# as line boundaries. A sentence must never contain one, or the three output
# files would stop being line-aligned for such readers.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE_BREAK_RUN = re.compile("[ \t]*[" + _LINE_BREAKS + "]+[ \t]*")
_WHITESPACE = re.compile(r"\s")


class PrepSummary(NamedTuple):
    documents: int
    sentences: int
    files: Tuple[str, str, str]  # source, target, docids
    line_breaks_replaced: int  # line breaks inside sentences turned into spaces
    hyp_file: Optional[str] = None  # wmt --hyp-system: PREFIX.hyp.L2
    note: str = ""  # wmt: which references were used, what was skipped


def _clean(text: str) -> Tuple[str, int]:
    """Replace each run of line-break characters (and the blanks around it)
    inside ``text`` by one space; returns the text and the number of runs."""
    return _LINE_BREAK_RUN.subn(" ", text)


# --------------------------------------------------------------------------
# XML


class _Seg(NamedTuple):
    segid: str
    text: str
    line: int


class _Doc(NamedTuple):
    docid: str
    line: int
    segs: List[_Seg]
    end_line: List[int]  # one element: the line of </doc> (filled in when seen)


def _local(tag) -> str:
    """Element name without namespace, lower-cased (``{ns}DOC`` -> ``doc``)."""
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1].lower()


def _feed_xml(path: str, parser, handle, hint=lambda: "") -> int:
    """Feed ``path`` to an incremental XML ``parser`` line by line, calling
    ``handle(lineno)`` after each line (and once at the end); malformed XML
    and unreadable files become :class:`PrepDocsError` naming the line
    (``hint()`` is appended to the malformed-XML message). Returns the number
    of lines read."""
    import xml.etree.ElementTree as ET

    lineno = 0
    try:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                parser.feed(raw)
                handle(lineno)
        parser.close()
        handle(lineno)
    except ET.ParseError as err:
        line, col = err.position if getattr(err, "position", None) else (lineno or 1, 0)
        msg = re.sub(r": line \d+, column \d+$", "", str(err))
        raise PrepDocsError(path, line, f"malformed XML ({msg}, column {col}); "
                                        f"expected well-formed XML{hint()}") from None
    except OSError as err:
        raise PrepDocsError(path, None, f"cannot read: {err.strerror or err}") from None
    return lineno


def _parse_xml(path: str, allow_empty: bool) -> Tuple[List[_Doc], int, int]:
    """Parse and validate one XML file. Returns (documents, number of lines,
    number of line breaks replaced inside segments)."""
    import xml.etree.ElementTree as ET

    docs: List[_Doc] = []
    first_line: Dict[str, int] = {}
    cur: Optional[_Doc] = None
    in_seg: Optional[Tuple[str, int]] = None
    replaced = 0
    root: List[str] = []  # the root element's name, once seen
    parser = ET.XMLPullParser(events=("start", "end"))

    def handle(lineno: int) -> None:
        nonlocal cur, in_seg, replaced
        for event, el in parser.read_events():
            name = _local(el.tag)
            if event == "start" and not root:
                root.append(name)
                if name == "dataset":
                    raise PrepDocsError(path, lineno, _WMT_FILE_HINT)
            if event == "start" and name == "doc":
                if cur is not None:
                    raise PrepDocsError(path, lineno, f"<doc> inside document {cur.docid} "
                                        f"(line {cur.line}); expected </doc> first")
                docid = (el.get("docid") or "").strip()
                if not docid:
                    hint = f"; {_WMT_FILE_HINT}" if el.get("id") is not None else ""
                    raise PrepDocsError(path, lineno, "<doc> without a docid attribute; "
                                                      f'expected <doc docid="...">{hint}')
                _check_docid(docid, path, lineno)
                if docid in first_line:
                    raise PrepDocsError(path, lineno, f"duplicate document id {docid} "
                                        f"(first at line {first_line[docid]}); expected unique docids")
                first_line[docid] = lineno
                cur = _Doc(docid, lineno, [], [lineno])
            elif event == "start" and name == "seg":
                if cur is None:
                    raise PrepDocsError(path, lineno, "<seg> outside any <doc>; "
                                                      "expected segments inside <doc docid=...>")
                if in_seg is not None:
                    raise PrepDocsError(path, lineno, f"document {cur.docid}: <seg> inside "
                                        f"segment {in_seg[0]} (line {in_seg[1]}); expected </seg> first")
                segid = (el.get("id") or "").strip()
                if not segid:
                    raise PrepDocsError(path, lineno, f"document {cur.docid}: <seg> without an id "
                                                      'attribute; expected <seg id="...">')
                in_seg = (segid, lineno)
            elif event == "end" and name == "seg" and cur is not None and in_seg is not None:
                segid, start = in_seg
                text, n = _clean("".join(el.itertext()).strip())
                replaced += n
                if not text and not allow_empty:
                    raise PrepDocsError(path, start, f"document {cur.docid}, segment {segid}: "
                                        "empty segment; expected text (--allow-empty keeps it "
                                        "as an empty line)")
                cur.segs.append(_Seg(segid, text, start))
                in_seg = None
                el.clear()
            elif event == "end" and name == "doc" and cur is not None:
                if not cur.segs:
                    raise PrepDocsError(path, cur.line, f"document {cur.docid} has no segments; "
                                        "expected at least one <seg>")
                cur.end_line[0] = lineno
                docs.append(cur)
                cur = None
                el.clear()

    def sgm_hint() -> str:
        if path.lower().endswith(".sgm") or (root and root[0] in ("srcset", "refset", "tstset")):
            return ("; WMT .sgm files are often not well-formed XML: read them with "
                    "`ctx-prep-docs sgml --src-sgm FILE --tgt-sgm FILE`")
        return ""

    lineno = _feed_xml(path, parser, handle, sgm_hint)
    if not docs:
        raise PrepDocsError(path, 1, "no <doc> elements found; expected "
                                     '<doc docid="..."> elements with <seg id="..."> inside')
    return docs, lineno, replaced


def _check_unique_segids(path: str, docs: Sequence[_Doc]) -> None:
    for doc in docs:
        first: Dict[str, int] = {}
        for seg in doc.segs:
            if seg.segid in first:
                raise PrepDocsError(path, seg.line, f"document {doc.docid}, segment {seg.segid}: "
                                    f"duplicate segment id (first at line {first[seg.segid]}); "
                                    "expected unique segment ids within a document")
            first[seg.segid] = seg.line


def read_xml_documents(path: str, allow_empty: bool = False) -> List[Tuple[str, List[Tuple[str, str]]]]:
    """Read one IWSLT/WMT-style XML file: ``[(docid, [(segid, text), ...]), ...]``
    in file order. Entities are unescaped by the XML parser, surrounding
    whitespace of each segment is stripped and line breaks inside a segment
    become one space. Raises :class:`PrepDocsError` on malformed XML, a
    ``<doc>`` without docid or without segments, duplicate docids, a
    ``<seg>`` outside a ``<doc>`` or without id, duplicate segment ids in a
    document, and (unless ``allow_empty``) empty segments."""
    docs, _, _ = _parse_xml(path, allow_empty)
    _check_unique_segids(path, docs)
    return [(d.docid, [(s.segid, s.text) for s in d.segs]) for d in docs]


def load_xml(src_xml: str, tgt_xml: str, allow_empty: bool = False) -> Tuple[List[ParallelDoc], int]:
    """Read and align a pair of XML files. Both must hold the same documents
    in the same order, and each document the same segment ids in the same
    order. Returns (documents, line breaks replaced inside segments)."""
    src_docs, src_lines, n1 = _parse_xml(src_xml, allow_empty)
    tgt_docs, tgt_lines, n2 = _parse_xml(tgt_xml, allow_empty)
    return _align_docs(src_xml, src_docs, src_lines, tgt_xml, tgt_docs, tgt_lines), n1 + n2


def _align_docs(src_xml: str, src_docs: Sequence[_Doc], src_lines: int, tgt_xml: str,
                tgt_docs: Sequence[_Doc], tgt_lines: int) -> List[ParallelDoc]:
    """Pair the documents of two files (XML or SGML): the same documents in the
    same order, each with the same segment ids in the same order."""
    for i in range(max(len(src_docs), len(tgt_docs))):
        if i >= len(tgt_docs):
            d = src_docs[i]
            raise PrepDocsError(tgt_xml, tgt_lines, f"document {d.docid} ({src_xml}:{d.line}) is "
                                f"missing: {tgt_xml} ends after {len(tgt_docs)} documents, "
                                f"expected {len(src_docs)} as in {src_xml}")
        if i >= len(src_docs):
            d = tgt_docs[i]
            raise PrepDocsError(src_xml, src_lines, f"document {d.docid} ({tgt_xml}:{d.line}) is "
                                f"missing: {src_xml} ends after {len(src_docs)} documents, "
                                f"expected {len(tgt_docs)} as in {tgt_xml}")
        s, t = src_docs[i], tgt_docs[i]
        if s.docid != t.docid:
            raise PrepDocsError(tgt_xml, t.line, f"document {t.docid} is document #{i + 1}; "
                                f"expected document {s.docid} as in {src_xml}:{s.line}")

    docs: List[ParallelDoc] = []
    for s, t in zip(src_docs, tgt_docs):
        for j in range(max(len(s.segs), len(t.segs))):
            if j >= len(t.segs):
                seg = s.segs[j]
                raise PrepDocsError(tgt_xml, t.end_line[0], f"document {t.docid}: segment {seg.segid} "
                                    f"({src_xml}:{seg.line}) is missing: {len(t.segs)} segments, "
                                    f"expected {len(s.segs)} as in {src_xml}")
            if j >= len(s.segs):
                seg = t.segs[j]
                raise PrepDocsError(src_xml, s.end_line[0], f"document {s.docid}: segment {seg.segid} "
                                    f"({tgt_xml}:{seg.line}) is missing: {len(s.segs)} segments, "
                                    f"expected {len(t.segs)} as in {tgt_xml}")
            ss, ts = s.segs[j], t.segs[j]
            if ss.segid != ts.segid:
                raise PrepDocsError(tgt_xml, ts.line, f"document {t.docid}, segment {ts.segid}: "
                                    f"segment #{j + 1} has id {ts.segid}; expected segment id "
                                    f"{ss.segid} as in {src_xml}:{ss.line}")
        docs.append((s.docid, [(a.text, b.text) for a, b in zip(s.segs, t.segs)]))
    # after the alignment check, so that a changed id is reported as a mismatch
    # at the changed line rather than as a duplicate at the next one
    _check_unique_segids(src_xml, src_docs)
    _check_unique_segids(tgt_xml, tgt_docs)
    return docs


# --------------------------------------------------------------------------
# WMT .sgm (the "fake SGML" of WMT test sets before 2021)

_SGML_SETS = ("srcset", "refset", "tstset", "mteval")
_SGML_TAG = re.compile(r"<(/?)([A-Za-z][\w.-]*)((?:\s[^<>]*)?)>")
# tags that end a segment whose </seg> is missing: these always (a segment never
# holds another segment or document) ...
_SGML_STRONG = re.compile(r"<(/?)(seg|doc|dataset)(?=[\s>/])[^<>]*>", re.I)
# ... and these only when the line has no </seg> (else they are text)
_SGML_WEAK = re.compile(r"<(/?)(p|srcset|refset|tstset|mteval)(?=[\s>/])[^<>]*>", re.I)
_SGML_STARTS_WITH_STRUCT = re.compile(r"\s*<(/?)(seg|doc|p|srcset|refset|tstset|mteval|dataset)(?=[\s>/])",
                                      re.I)
_SGML_SEG_CLOSE = re.compile(r"</seg\s*>", re.I)
_SGML_ATTR = re.compile(r"""([A-Za-z_][\w.:-]*)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""")
_ENTITY = re.compile(r"&(?:#([0-9]{1,8})|#[xX]([0-9a-fA-F]{1,8})|([A-Za-z][A-Za-z0-9]{0,31}));")

_WMT_FILE_HINT = ("this looks like a WMT test-set XML file (<dataset> root, WMT21 and later), which holds "
                  "the source, the references and system outputs in one file: use "
                  "`ctx-prep-docs wmt --xml FILE --src-lang L1 --tgt-lang L2 --out-prefix PREFIX`")


def _unescape_entities(text: str) -> str:
    """Unescape ``&name;``, ``&#N;`` and ``&#xN;`` (HTML5 entity names). An
    ``&`` that does not start such an entity (``AT&T``, ``a & b``) and unknown
    names (``&foo;``) are kept as they are; unlike ``html.unescape``, names
    without the closing ``;`` (``&copy``) are never unescaped."""
    import html.entities

    def repl(m: "re.Match") -> str:
        if m.group(3) is not None:
            return html.entities.html5.get(m.group(3) + ";", m.group(0))
        code = int(m.group(1)) if m.group(1) is not None else int(m.group(2), 16)
        if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            return m.group(0)
        return chr(code)

    return _ENTITY.sub(repl, text)


def _sgml_attrs(text: str) -> Dict[str, str]:
    """Attributes of an SGML start tag (names lower-cased; values quoted with
    ``"`` or ``'`` or unquoted; entities unescaped, surrounding blanks stripped)."""
    attrs: Dict[str, str] = {}
    for m in _SGML_ATTR.finditer(text):
        value = next(v for v in m.group(2, 3, 4) if v is not None)
        attrs.setdefault(m.group(1).lower(), _unescape_entities(value).strip())
    return attrs


def _read_text_lines(path: str) -> List[str]:
    """Lines of a UTF-8 file split at ``\\n`` only (so that line numbers are
    those an editor shows); a trailing ``\\r`` is dropped, a byte-order mark too."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise PrepDocsError(path, None, f"cannot read: {err.strerror or err}") from None
    return decode_text_lines(path, raw)


def decode_text_lines(path: str, raw: bytes) -> List[str]:
    """The lines of ``raw``, a UTF-8 file's bytes (``path`` names it in
    errors), as :func:`_read_text_lines` splits them."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise PrepDocsError(path, line, f"not UTF-8 ({err.reason} at byte {err.start}); "
                                        "expected a UTF-8 file") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [x[:-1] if x.endswith("\r") else x for x in lines]


def _parse_sgml(path: str, allow_empty: bool) -> Tuple[List[_Doc], int, int]:
    """Read one WMT ``.sgm`` file tolerantly. Returns (documents, number of
    lines, number of line breaks replaced inside segments).

    Only ``<doc docid=...>``, ``</doc>``, ``<seg id=...>`` and ``</seg>`` matter;
    other tags (``<p>``, ``<hl>``, the ``<srcset>``/``<refset>`` wrapper) and text
    outside segments are ignored. A segment's text runs to its ``</seg>``, or
    to a ``<seg>``, ``<doc>`` or ``</doc>`` tag before it (the ``</seg>`` is
    missing); when the line has neither, it ends at a ``<p>``, ``</p>`` or
    ``</srcset>``-like tag on the line, or else at the end of the line if the
    next line is blank, starts with one of those tags or does not exist
    (otherwise the segment goes on over the next line). A ``<doc>`` without
    ``</doc>`` ends at the next ``<doc>`` or at the end of the file. Entities
    are unescaped with :func:`_unescape_entities` (a bare ``&`` stays ``&``);
    a ``<`` that does not start one of those tags is text."""
    lines = _read_text_lines(path)
    docs: List[_Doc] = []
    first_line: Dict[str, int] = {}
    cur: Optional[_Doc] = None
    seg: Optional[Tuple[str, int, List[str]]] = None  # (id, first line, text pieces)
    replaced = 0

    def end_seg() -> None:
        nonlocal seg, replaced
        assert seg is not None and cur is not None
        segid, start, parts = seg
        text, n = _clean(_unescape_entities("\n".join(parts)).strip())
        replaced += n
        if not text and not allow_empty:
            raise PrepDocsError(path, start, f"document {cur.docid}, segment {segid}: empty segment; "
                                "expected text (--allow-empty keeps it as an empty line)")
        cur.segs.append(_Seg(segid, text, start))
        seg = None

    def end_doc(lineno: int) -> None:
        nonlocal cur
        assert cur is not None
        if seg is not None:
            end_seg()
        if not cur.segs:
            raise PrepDocsError(path, cur.line, f"document {cur.docid} has no segments; "
                                "expected at least one <seg>")
        cur.end_line[0] = lineno
        docs.append(cur)
        cur = None

    for lineno, line in enumerate(lines, 1):
        pos = 0
        while True:
            if seg is not None:
                close = _SGML_SEG_CLOSE.search(line, pos)
                strong = _SGML_STRONG.search(line, pos)
                if close and (strong is None or close.start() < strong.start()):
                    seg[2].append(line[pos:close.start()])
                    end_seg()
                    pos = close.end()
                    continue
                struct = strong or _SGML_WEAK.search(line, pos)
                if struct:  # </seg> missing: the next structural tag ends the segment
                    seg[2].append(line[pos:struct.start()])
                    end_seg()
                    pos = struct.start()
                    continue
                seg[2].append(line[pos:])
                nxt = lines[lineno] if lineno < len(lines) else None
                if nxt is None or not nxt.strip() or _SGML_STARTS_WITH_STRUCT.match(nxt):
                    end_seg()
                break
            m = _SGML_TAG.search(line, pos)
            if not m:
                break
            pos = m.end()
            closing, name = m.group(1) == "/", m.group(2).lower()
            if name == "dataset" and not closing and not docs and cur is None:
                raise PrepDocsError(path, lineno, _WMT_FILE_HINT)
            if name == "doc":
                if cur is not None:  # </doc>, or a <doc> whose predecessor has no </doc>
                    end_doc(lineno)
                if closing:
                    continue
                attrs = _sgml_attrs(m.group(3))
                docid = attrs.get("docid", "")
                if not docid:
                    hint = f"; {_WMT_FILE_HINT}" if "id" in attrs else ""
                    raise PrepDocsError(path, lineno, "<doc> without a docid attribute; "
                                                      f'expected <doc docid="...">{hint}')
                _check_docid(docid, path, lineno)
                if docid in first_line:
                    raise PrepDocsError(path, lineno, f"duplicate document id {docid} "
                                        f"(first at line {first_line[docid]}); expected unique docids")
                first_line[docid] = lineno
                cur = _Doc(docid, lineno, [], [lineno])
            elif name == "seg" and not closing:
                if cur is None:
                    raise PrepDocsError(path, lineno, "<seg> outside any <doc>; "
                                                      "expected segments inside <doc docid=...>")
                segid = _sgml_attrs(m.group(3)).get("id", "")
                if not segid:
                    raise PrepDocsError(path, lineno, f"document {cur.docid}: <seg> without an id "
                                                      'attribute; expected <seg id="...">')
                seg = (segid, lineno, [])
            elif name in _SGML_SETS and closing and cur is not None:
                end_doc(lineno)
    if cur is not None:
        end_doc(len(lines))
    if not docs:
        raise PrepDocsError(path, 1, "no <doc> elements found; expected "
                                     '<doc docid="..."> elements with <seg id="..."> inside')
    return docs, len(lines), replaced


def read_sgml_documents(path: str, allow_empty: bool = False) -> List[Tuple[str, List[Tuple[str, str]]]]:
    """Read one WMT ``.sgm`` file (``newstest2019-ende-src.en.sgm``, ...)
    tolerantly: ``[(docid, [(segid, text), ...]), ...]`` in file order. See
    :func:`_parse_sgml` for what is tolerated; a ``<doc>`` without docid or
    without segments, duplicate docids, a ``<seg>`` outside a ``<doc>`` or
    without id, duplicate segment ids in a document and (unless
    ``allow_empty``) empty segments raise :class:`PrepDocsError`."""
    docs, _, _ = _parse_sgml(path, allow_empty)
    _check_unique_segids(path, docs)
    return [(d.docid, [(s.segid, s.text) for s in d.segs]) for d in docs]


def load_sgml(src_sgm: str, tgt_sgm: str, allow_empty: bool = False) -> Tuple[List[ParallelDoc], int]:
    """Read and align a pair of WMT ``.sgm`` files (a ``srcset`` and a
    ``refset``): the same documents in the same order, each with the same
    segment ids in the same order. Returns (documents, line breaks replaced)."""
    src_docs, src_lines, n1 = _parse_sgml(src_sgm, allow_empty)
    tgt_docs, tgt_lines, n2 = _parse_sgml(tgt_sgm, allow_empty)
    return _align_docs(src_sgm, src_docs, src_lines, tgt_sgm, tgt_docs, tgt_lines), n1 + n2


# --------------------------------------------------------------------------
# WMT test-set XML (WMT21 and later)


class _WmtSide:
    """One ``<src>``, ``<ref>`` or ``<hyp>`` of a WMT document: its paragraphs
    (only those with segments), each a list of segments (text stripped, not yet
    cleaned of line breaks)."""

    def __init__(self, kind: str, attrs: Dict[str, str], line: int):
        self.kind = kind
        self.attrs = attrs
        self.line = line
        self.end_line = line
        self.paras: List[List[_Seg]] = []
        self.open_para = False  # the last paragraph still takes segments

    def label(self) -> str:
        if self.kind == "ref":
            who = self.attrs.get("translator")
            return f'<ref translator="{who}">' if who is not None else "<ref>"
        if self.kind == "hyp":
            return f'<hyp system="{self.attrs.get("system", "")}">'
        return "<src>"

    def segs(self) -> List[Tuple[int, _Seg]]:
        """(1-based paragraph number, segment) in document order."""
        return [(i, s) for i, para in enumerate(self.paras, 1) for s in para]


class _WmtDoc:
    def __init__(self, docid: str, attrs: Dict[str, str], line: int):
        self.docid = docid
        self.attrs = attrs
        self.line = line
        self.src: Optional[_WmtSide] = None
        self.refs: List[_WmtSide] = []
        self.hyps: List[_WmtSide] = []


class WmtData(NamedTuple):
    docs: List[ParallelDoc]  # source and the selected reference
    hyp: Optional[List[str]]  # the selected system's segment for each line, or None
    line_breaks_replaced: int
    wmt_documents: int  # documents of the file used (before --paragraph-boundaries)
    references: Dict[str, int]  # translator -> documents whose reference it wrote
    testsuite_skipped: int  # documents with a testsuite attribute (no references)


def _same_lang(attr: str, code: str) -> bool:
    """``lang="zh"`` matches ``zh``, ``zh_CN``, ``zh-cn``; ``lang="zh-TW"`` matches ``zh``."""
    a, c = attr.strip().lower().replace("-", "_"), code.lower().replace("-", "_")
    return a == c or a.startswith(c + "_") or c.startswith(a + "_")


def _parse_wmt(path: str) -> List[_WmtDoc]:
    """Parse a WMT test-set XML file into documents with their sides."""
    import xml.etree.ElementTree as ET

    docs: List[_WmtDoc] = []
    first_line: Dict[str, int] = {}
    cur: Optional[_WmtDoc] = None
    side: Optional[_WmtSide] = None
    in_seg: Optional[Tuple[str, int]] = None
    root: List[str] = []
    parser = ET.XMLPullParser(events=("start", "end"))

    def where() -> str:
        return f"document {cur.docid}" if cur is not None else ""

    def handle(lineno: int) -> None:
        nonlocal cur, side, in_seg
        for event, el in parser.read_events():
            name = _local(el.tag)
            if event == "start" and not root:
                root.append(name)
                if name != "dataset":
                    if name in _SGML_SETS:
                        hint = ("this is an mteval/IWSLT-style file with one language per file: use "
                                "`ctx-prep-docs xml` (or `ctx-prep-docs sgml` for WMT .sgm files)")
                    else:
                        hint = "expected a WMT test-set XML file (WMT21 and later)"
                    raise PrepDocsError(path, lineno, f"root element <{name}>; expected <dataset>: {hint}")
            if event == "start":
                if name == "doc":
                    if cur is not None:
                        raise PrepDocsError(path, lineno, f"<doc> inside document {cur.docid} "
                                            f"(line {cur.line}); expected </doc> first")
                    docid = (el.get("id") or "").strip()
                    if not docid:
                        raise PrepDocsError(path, lineno, "<doc> without an id attribute; "
                                                          'expected <doc id="...">')
                    _check_docid(docid, path, lineno)
                    if docid in first_line:
                        raise PrepDocsError(path, lineno, f"duplicate document id {docid} "
                                            f"(first at line {first_line[docid]}); expected unique ids")
                    first_line[docid] = lineno
                    cur = _WmtDoc(docid, dict(el.attrib), lineno)
                elif name in ("src", "ref", "hyp"):
                    if cur is None:
                        raise PrepDocsError(path, lineno, f"<{name}> outside any <doc>; "
                                                          "expected it inside <doc id=...>")
                    if side is not None:
                        raise PrepDocsError(path, lineno, f"{where()}: <{name}> inside {side.label()} "
                                            f"(line {side.line}); expected </{side.kind}> first")
                    side = _WmtSide(name, {k: v.strip() for k, v in el.attrib.items()}, lineno)
                    if name == "src":
                        if cur.src is not None:
                            raise PrepDocsError(path, lineno, f"{where()}: second <src> (first at "
                                                f"line {cur.src.line}); expected one <src> per document")
                        cur.src = side
                    else:
                        (cur.refs if name == "ref" else cur.hyps).append(side)
                elif name == "p" and side is not None:
                    side.open_para = False  # the next segment starts a paragraph
                elif name == "seg":
                    if side is None:
                        raise PrepDocsError(path, lineno, f"{where() or 'file'}: <seg> outside <src>, "
                                                          "<ref> and <hyp>; expected it inside one of them")
                    if in_seg is not None:
                        raise PrepDocsError(path, lineno, f"{where()}: <seg> inside segment {in_seg[0]} "
                                            f"(line {in_seg[1]}); expected </seg> first")
                    segid = (el.get("id") or "").strip()
                    if not segid:
                        raise PrepDocsError(path, lineno, f"{where()}: <seg> without an id attribute "
                                                          f'in {side.label()}; expected <seg id="...">')
                    in_seg = (segid, lineno)
            else:
                if name == "seg" and side is not None and in_seg is not None:
                    if not side.open_para:
                        side.paras.append([])
                        side.open_para = True
                    side.paras[-1].append(_Seg(in_seg[0], "".join(el.itertext()).strip(), in_seg[1]))
                    in_seg = None
                    el.clear()
                elif name == "p" and side is not None:
                    side.open_para = False
                elif name in ("src", "ref", "hyp") and side is not None:
                    side.end_line = lineno
                    side = None
                elif name == "doc" and cur is not None:
                    docs.append(cur)
                    cur = None
                    el.clear()

    _feed_xml(path, parser, handle)  # errors name their own lines; the line count is not needed
    if not docs:
        raise PrepDocsError(path, 1, 'no <doc> elements found; expected <doc id="..."> elements '
                                     "with <src>, <ref> and <seg id=...> inside")
    return docs


def _translator(ref: _WmtSide, src: _WmtSide) -> Optional[str]:
    # some files (wmt21 is-en dev) put the translator on <src> instead of <ref>
    return ref.attrs.get("translator", src.attrs.get("translator"))


def _wmt_check_lang(path: str, doc: _WmtDoc, side: _WmtSide, code: str, flag: str) -> None:
    lang = side.attrs.get("lang", side.attrs.get("language"))
    if lang is not None and not _same_lang(lang, code):
        what = "source" if flag == "--src-lang" else "target"
        raise PrepDocsError(path, side.line, f'document {doc.docid}: {side.label()} has lang="{lang}", '
                            f"but {flag} is {code}; expected the file's {what} language (a WMT "
                            "file translates in one direction; check --src-lang/--tgt-lang)")


def _wmt_align(path: str, doc: _WmtDoc, src: _WmtSide, other: _WmtSide) -> None:
    """``other`` (a reference or hypothesis) must have the segment ids of the
    source, in the same order and in the same paragraphs."""
    a, b = src.segs(), other.segs()
    for j in range(max(len(a), len(b))):
        if j >= len(b):
            p, seg = a[j]
            raise PrepDocsError(path, other.end_line, f"document {doc.docid}, paragraph {p}: segment "
                                f"{seg.segid} (<src> line {seg.line}) is missing in {other.label()}: "
                                f"{len(b)} segments, expected {len(a)} as in <src>")
        if j >= len(a):
            p, seg = b[j]
            raise PrepDocsError(path, seg.line, f"document {doc.docid}, paragraph {p}, segment "
                                f"{seg.segid}: extra segment in {other.label()}: <src> (line {src.line}) "
                                f"has {len(a)} segments, expected as many")
        (pa, sa), (pb, sb) = a[j], b[j]
        if sa.segid != sb.segid:
            raise PrepDocsError(path, sb.line, f"document {doc.docid}, paragraph {pb}, segment {sb.segid}: "
                                f"segment #{j + 1} of {other.label()} has id {sb.segid}; expected "
                                f"segment id {sa.segid} as in <src> line {sa.line}")
        if pa != pb:
            raise PrepDocsError(path, sb.line, f"document {doc.docid}, segment {sb.segid}: in paragraph "
                                f"{pb} of {other.label()}; expected paragraph {pa} as in <src> line "
                                f"{sa.line} (paragraph boundaries must match)")


def _wmt_select(path: str, doc: _WmtDoc, sides: List[_WmtSide], key, wanted: str, what: str,
                flag: str) -> _WmtSide:
    found = [x for x in sides if key(x) == wanted]
    if not found:
        names = ", ".join(sorted({str(key(x)) for x in sides})) or "none"
        raise PrepDocsError(path, doc.line, f"document {doc.docid} has no {what} {wanted} "
                            f"(it has: {names}); expected one in every document: check {flag} "
                            "(no other one is used in its place)")
    if len(found) > 1:
        raise PrepDocsError(path, found[1].line, f"document {doc.docid}: second {found[1].label()} "
                            f"(first at line {found[0].line}); expected one {what} {wanted} per document")
    return found[0]


def load_wmt(xml: str, src_lang: str, tgt_lang: str, ref_translator: Optional[str] = None,
             hyp_system: Optional[str] = None, paragraph_boundaries: bool = False,
             allow_empty: bool = False) -> WmtData:
    """Read a WMT test-set XML file (WMT21 and later: ``<dataset>``, optional
    ``<collection>``, ``<doc id=...>`` holding one ``<src>``, ``<ref>``
    elements and ``<hyp>`` elements, each holding ``<p>`` paragraphs of
    ``<seg id=...>``) and pair the source with one reference per document.

    The reference is the one by ``ref_translator`` (its ``translator``
    attribute, or the ``<src>``'s when the ``<ref>`` has none), or each
    document's first ``<ref>``; a document without it is an error, never
    another reference. ``hyp_system`` also returns that system's segments
    (empty segments allowed). References and hypotheses must have the source's
    segment ids in the same order and paragraphs. Documents with a
    ``testsuite`` attribute (test suites, no references) are skipped. With
    ``paragraph_boundaries`` each paragraph becomes a document with the id
    ``DOCID.pN`` (N = 1, 2, ... within the document)."""
    docs = _parse_wmt(xml)
    out: List[ParallelDoc] = []
    hyp: Optional[List[str]] = [] if hyp_system is not None else None
    references: Dict[str, int] = {}
    out_line: Dict[str, int] = {}
    replaced = skipped = used = 0
    for doc in docs:
        if "testsuite" in doc.attrs:
            skipped += 1
            continue
        used += 1
        src = doc.src
        if src is None or not src.paras:
            raise PrepDocsError(xml, doc.line, f"document {doc.docid} has no <src> segments; "
                                "expected <src> with <seg> elements")
        _wmt_check_lang(xml, doc, src, src_lang, "--src-lang")
        if ref_translator is not None:
            ref = _wmt_select(xml, doc, doc.refs, lambda r: _translator(r, src), ref_translator,
                              "reference by translator", "--ref-translator")
        elif doc.refs:
            ref = doc.refs[0]
        else:
            raise PrepDocsError(xml, doc.line, f"document {doc.docid} has no <ref>; expected a "
                                "reference translation in every document (is this a source-only file?)")
        _wmt_check_lang(xml, doc, ref, tgt_lang, "--tgt-lang")
        who = _translator(ref, src)
        who = who if who is not None else "(no translator attribute)"
        references[who] = references.get(who, 0) + 1
        sides = [ref]
        if hyp_system is not None:
            h = _wmt_select(xml, doc, doc.hyps, lambda x: x.attrs.get("system"), hyp_system,
                            "<hyp> of system", "--hyp-system")
            _wmt_check_lang(xml, doc, h, tgt_lang, "--tgt-lang")
            sides.append(h)
        for other in sides:
            _wmt_align(xml, doc, src, other)
        _check_unique_segids(xml, [_Doc(doc.docid, doc.line, [s for _, s in src.segs()], [doc.line])])

        texts = []
        for side in [src] + sides:
            cleaned = []
            for _, seg in side.segs():
                text, n = _clean(seg.text)
                replaced += n
                if not text and not allow_empty and side.kind != "hyp":
                    raise PrepDocsError(xml, seg.line, f"document {doc.docid}, segment {seg.segid}: "
                                        f"empty segment in {side.label()}; expected text "
                                        "(--allow-empty keeps it as an empty line)")
                cleaned.append(text)
            texts.append(cleaned)
        paras = [p for p, _ in src.segs()]
        groups = [(doc.docid, range(len(paras)))] if not paragraph_boundaries else [
            (f"{doc.docid}.p{p}", [j for j, q in enumerate(paras) if q == p])
            for p in range(1, len(src.paras) + 1)]
        for docid, idx in groups:
            if docid in out_line:
                raise PrepDocsError(xml, doc.line, f"document {doc.docid}: output document id {docid} "
                                    f"is already used by the document at line {out_line[docid]}; "
                                    "expected unique ids")
            out_line[docid] = doc.line
            out.append((docid, [(texts[0][j], texts[1][j]) for j in idx]))
            if hyp is not None:
                hyp.extend(texts[2][j] for j in idx)
    if not out:
        raise PrepDocsError(xml, docs[0].line, f"all {len(docs)} documents are test suites "
                            "(testsuite attribute); expected documents with references")
    return WmtData(out, hyp, replaced, used, references, skipped)


# --------------------------------------------------------------------------
# plain text


def _check_counts(files: Sequence[Tuple[str, List[str]]]) -> None:
    """All files must have as many lines as the first one."""
    ref_path, ref = files[0]
    for path, lines in files[1:]:
        if len(lines) != len(ref):
            short_path, short, long_path, long = (
                (path, lines, ref_path, ref) if len(lines) < len(ref) else (ref_path, ref, path, lines))
            raise PrepDocsError(short_path, max(len(short), 1),
                                f"file ends after {len(short)} lines; expected {len(long)} lines "
                                f"as in {long_path} (line {len(short) + 1} there has no counterpart)")


def load_docids(src: str, tgt: str, docids: str, allow_empty: bool = False) -> Tuple[List[ParallelDoc], int]:
    """Read sentence-aligned ``src``/``tgt`` plus the document id of each line."""
    ids = read_docids(docids)
    src_lines, tgt_lines = _read_lines(src), _read_lines(tgt)
    _check_counts([(docids, ids), (src, src_lines), (tgt, tgt_lines)])
    docs: List[ParallelDoc] = []
    replaced = 0
    for lineno, (docid, s, t) in enumerate(zip(ids, src_lines, tgt_lines), 1):
        if not allow_empty:
            for path, text in ((src, s), (tgt, t)):
                if not text.strip():
                    raise PrepDocsError(path, lineno, f"empty line in document {docid}; expected a "
                                        "sentence (--allow-empty keeps it as an empty line)")
        s, n1 = _clean(s)
        t, n2 = _clean(t)
        replaced += n1 + n2
        if not docs or docs[-1][0] != docid:
            docs.append((docid, []))
        docs[-1][1].append((s, t))
    return docs, replaced


def load_blank_lines(src: str, tgt: str, doc_prefix: str = "doc") -> Tuple[List[ParallelDoc], int]:
    """Read sentence-aligned ``src``/``tgt`` with a blank (or whitespace-only)
    line between documents, at the same positions in both files. Blank lines
    before the first and after the last document are ignored; two blank lines
    in a row would make an empty document and are an error. Documents get the
    ids ``{doc_prefix}00000``, ``{doc_prefix}00001``, ..."""
    if _WHITESPACE.search(doc_prefix):
        raise PrepDocsError("--doc-prefix", None, f"{doc_prefix!r} contains whitespace; "
                                                  "expected one token, e.g. ted.")
    src_lines, tgt_lines = _read_lines(src), _read_lines(tgt)
    _check_counts([(src, src_lines), (tgt, tgt_lines)])
    docs: List[ParallelDoc] = []
    replaced = 0
    cur: Optional[List[Tuple[str, str]]] = None
    blank_since: Optional[int] = None  # first line of the current run of blank lines
    for lineno, (s, t) in enumerate(zip(src_lines, tgt_lines), 1):
        s_blank, t_blank = not s.strip(), not t.strip()
        if s_blank != t_blank:
            if t_blank:
                raise PrepDocsError(tgt, lineno, f"blank line (document break) where {src}:{lineno} "
                                    "has a sentence; expected blank lines at the same positions")
            raise PrepDocsError(tgt, lineno, f"sentence where {src}:{lineno} is a blank line "
                                "(document break); expected blank lines at the same positions")
        if s_blank:
            if blank_since is not None and docs:
                raise PrepDocsError(src, lineno, f"second blank line in a row (from line {blank_since}) "
                                    "makes an empty document; expected exactly one blank line "
                                    "between documents")
            if blank_since is None:
                blank_since = lineno
            cur = None
            continue
        blank_since = None
        if cur is None:
            cur = []
            docs.append((f"{doc_prefix}{len(docs):05d}", cur))
        s, n1 = _clean(s)
        t, n2 = _clean(t)
        replaced += n1 + n2
        cur.append((s, t))
    if not docs:
        raise PrepDocsError(src, 1, "no sentences; expected documents separated by blank lines")
    return docs, replaced


# --------------------------------------------------------------------------
# IWSLT train.tags files

_TAG_TALKID = re.compile(r"<talkid>(.*?)</talkid>", re.I)
_TAG_DOCID = re.compile(r"""<doc\s[^>]*\bdocid\s*=\s*["']([^"']*)["']""", re.I)


def _is_tag_line(line: str) -> bool:
    """A metadata line of a ``train.tags`` file: its first non-blank character
    is ``<`` (the IWSLT README: transcripts are the lines not starting with it)."""
    return line.lstrip().startswith("<")


def _tag_talk_ids(path: str, lines: List[str], start: int, end: int) -> List[Tuple[str, int]]:
    """The talk ids named in the metadata lines ``start..end-1`` (0-based) with
    their 1-based line numbers: the ``<talkid>N</talkid>`` values, or for a
    run without any ``<talkid>``, the ``<doc docid="N">`` values."""
    found = {"talkid": [], "docid": []}  # type: Dict[str, List[Tuple[str, int]]]
    for i in range(start, end):
        for key, pattern in (("talkid", _TAG_TALKID), ("docid", _TAG_DOCID)):
            m = pattern.search(lines[i])
            if m is not None:
                found[key].append((m.group(1).strip(), i + 1))
    ids = found["talkid"] or found["docid"]
    for talkid, line in ids:
        _check_docid(talkid, path, line, "talk id")
    return ids


def load_tags(src: str, tgt: str, allow_empty: bool = False) -> Tuple[List[ParallelDoc], int, List[str]]:
    """Read a pair of IWSLT ``train.tags.L1-L2.{L1,L2}`` files.

    Lines whose first non-blank character is ``<`` are metadata (``<url>``,
    ``<keywords>``, ``<speaker>``, ``<talkid>``, ``<title>``,
    ``<description>``, ``<reviewer>``, ``<translator>``; also ``<doc ...>``
    and ``</doc>`` where a file has them); the other lines are the
    transcript, one segment per line, line-aligned between the files. Each
    run of metadata lines that is followed by transcript lines starts a talk,
    whose id is the run's ``<talkid>`` (or, without one, its
    ``<doc docid=...>``); title and description are metadata, not text.

    Checked: equal line counts, metadata lines at the same lines in both
    files with the same talk ids, one id per talk, unique ids, no transcript
    line before the first talk's metadata, no empty transcript line (unless
    ``allow_empty``). A run naming several talks holds talks without any
    transcript line: they are skipped and their ids returned (the summary
    line counts them); metadata after the last transcript line (``</doc>``)
    is ignored. Returns (documents, line breaks replaced, skipped talk ids)."""
    src_lines, tgt_lines = _read_lines(src), _read_lines(tgt)
    _check_counts([(src, src_lines), (tgt, tgt_lines)])
    n = len(src_lines)
    if n == 0:
        raise PrepDocsError(src, 1, "empty file; expected talks (metadata lines, then transcript lines)")
    for i, (s, t) in enumerate(zip(src_lines, tgt_lines)):
        s_tag, t_tag = _is_tag_line(s), _is_tag_line(t)
        if s_tag != t_tag:
            if s_tag:
                raise PrepDocsError(tgt, i + 1, f"transcript line where {src}:{i + 1} is a metadata "
                                    "line (starts with '<'); expected metadata at the same lines")
            raise PrepDocsError(tgt, i + 1, f"metadata line (starts with '<') where {src}:{i + 1} "
                                "is a transcript line; expected metadata at the same lines")
    docs: List[ParallelDoc] = []
    skipped: List[str] = []
    first_line: Dict[str, int] = {}
    replaced = 0
    i = 0
    while i < n:
        if not _is_tag_line(src_lines[i]):
            raise PrepDocsError(src, i + 1, "transcript line before any talk metadata; expected "
                                "each talk to start with its metadata lines (<url>, <talkid>, ...)")
        start = i
        while i < n and _is_tag_line(src_lines[i]):
            i += 1
        end = i  # metadata lines start..end-1, transcript from end
        s_ids = _tag_talk_ids(src, src_lines, start, end)
        t_ids = _tag_talk_ids(tgt, tgt_lines, start, end)
        if [x for x, _ in s_ids] != [x for x, _ in t_ids]:
            raise PrepDocsError(tgt, (t_ids[0][1] if t_ids else start + 1),
                                f"talk id(s) {', '.join(x for x, _ in t_ids) or 'none'} in the "
                                f"metadata of lines {start + 1}-{end}; expected "
                                f"{', '.join(x for x, _ in s_ids) or 'none'} as in {src}")
        for talkid, line in s_ids:
            if talkid in first_line:
                raise PrepDocsError(src, line, f"duplicate talk id {talkid} (first at line "
                                    f"{first_line[talkid]}); expected unique talk ids")
            first_line[talkid] = line
        if i == n:
            # metadata after the last transcript line: closing tags (</doc>) or
            # talks without text
            skipped.extend(x for x, _ in s_ids)
            break
        if not s_ids:
            raise PrepDocsError(src, start + 1, f"the metadata of lines {start + 1}-{end} names no "
                                "talk (no <talkid>N</talkid> or <doc docid=\"N\">); expected each "
                                "talk's id before its transcript")
        skipped.extend(x for x, _ in s_ids[:-1])
        talkid = s_ids[-1][0]
        pairs: List[Tuple[str, str]] = []
        while i < n and not _is_tag_line(src_lines[i]):
            s, n1 = _clean(src_lines[i].strip())
            t, n2 = _clean(tgt_lines[i].strip())
            replaced += n1 + n2
            if not allow_empty and (not s or not t):
                raise PrepDocsError(src if not s else tgt, i + 1, f"talk {talkid}: empty "
                                    "transcript line; expected text (--allow-empty keeps it as "
                                    "an empty line)")
            pairs.append((s, t))
            i += 1
        docs.append((talkid, pairs))
    if not docs:
        raise PrepDocsError(src, 1, "no transcript lines; expected talks (metadata lines, then "
                                    "transcript lines)")
    return docs, replaced, skipped


# --------------------------------------------------------------------------
# output


def output_paths(out_prefix: str, src_lang: str, tgt_lang: str) -> Tuple[str, str, str]:
    return f"{out_prefix}.{src_lang}", f"{out_prefix}.{tgt_lang}", f"{out_prefix}.docids"


def hyp_output_path(out_prefix: str, tgt_lang: str) -> str:
    """Where ``wmt --hyp-system`` writes the system's segments: ``PREFIX.hyp.L2``."""
    return f"{out_prefix}.hyp.{tgt_lang}"


def _check_outputs(out_prefix: str, src_lang: str, tgt_lang: str, inputs: Sequence[str],
                   with_hyp: bool = False) -> None:
    for flag, lang in (("--src-lang", src_lang), ("--tgt-lang", tgt_lang)):
        if not lang or _WHITESPACE.search(lang) or "/" in lang or os.sep in lang:
            raise PrepDocsError(flag, None, f"bad language code {lang!r}; expected e.g. en")
        if lang == "docids":
            raise PrepDocsError(flag, None, "'docids' would collide with PREFIX.docids")
    if src_lang == tgt_lang:
        raise PrepDocsError("--tgt-lang", None, f"same as --src-lang ({src_lang}); expected two languages")
    if not out_prefix or not os.path.basename(out_prefix):
        raise PrepDocsError("--out-prefix", None, f"{out_prefix!r} names a directory; "
                                                  "expected DIR/NAME, e.g. data/train")
    ins = {os.path.realpath(p) for p in inputs}
    outs = list(output_paths(out_prefix, src_lang, tgt_lang))
    if with_hyp:
        outs.append(hyp_output_path(out_prefix, tgt_lang))
    seen = set()
    for out in outs:
        if os.path.realpath(out) in ins:
            raise PrepDocsError(out, None, "output would overwrite an input file; "
                                           "expected a different --out-prefix")
        if os.path.realpath(out) in seen:
            raise PrepDocsError(out, None, "two outputs would have this name; "
                                           "expected different --src-lang/--tgt-lang")
        seen.add(os.path.realpath(out))


def write_documents(docs: Sequence[ParallelDoc], out_prefix: str, src_lang: str,
                    tgt_lang: str, hyp: Optional[Sequence[str]] = None) -> Tuple[str, ...]:
    """Write ``PREFIX.{src_lang}``, ``PREFIX.{tgt_lang}`` and ``PREFIX.docids``
    (and, given ``hyp``, one line per sentence, ``PREFIX.hyp.{tgt_lang}``).
    Each is written to a temporary file in the output directory; all are
    renamed into place only after all were written. Returns the paths."""
    _check_outputs(out_prefix, src_lang, tgt_lang, (), with_hyp=hyp is not None)
    for docid, pairs in docs:
        for s, t in pairs:
            if _LINE_BREAK_RUN.search(s) or _LINE_BREAK_RUN.search(t):
                raise PrepDocsError(out_prefix, None, f"document {docid}: a sentence contains a "
                                                      "line break; expected one line per sentence")
    paths: Tuple[str, ...] = output_paths(out_prefix, src_lang, tgt_lang)
    rows = ((s, t, docid) for docid, pairs in docs for s, t in pairs)
    if hyp is not None:
        n = sum(len(pairs) for _, pairs in docs)
        if len(hyp) != n:
            raise ValueError(f"hyp has {len(hyp)} lines; expected {n}, one per sentence")
        if any(_LINE_BREAK_RUN.search(h) for h in hyp):
            raise PrepDocsError(out_prefix, None, "a hypothesis contains a line break; "
                                                  "expected one line per sentence")
        paths = paths + (hyp_output_path(out_prefix, tgt_lang),)
        rows = (row + (h,) for row, h in zip(rows, hyp))
    _write_atomic(out_prefix, paths, rows)
    return paths


def _write_atomic(out_prefix: str, paths: Sequence[str], rows) -> None:
    """Write column i of each row as a line of ``paths[i]``: to temporary files
    in the output directory, renamed into place only when all are complete."""
    out_dir = os.path.dirname(os.path.abspath(out_prefix))
    os.makedirs(out_dir, exist_ok=True)
    umask = os.umask(0)
    os.umask(umask)
    temps: List[str] = []
    handles: list = []
    try:
        for path in paths:
            fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
            temps.append(tmp)
            os.chmod(tmp, 0o666 & ~umask)
            handles.append(os.fdopen(fd, "w", encoding="utf-8", newline="\n"))
        for row in rows:
            for h, text in zip(handles, row):
                h.write(text + "\n")
        for h in handles:
            h.close()
        for tmp, path in zip(temps, paths):
            os.replace(tmp, path)
        temps = []
    finally:
        for h in handles:
            h.close()  # no-op when already closed
        for tmp in temps:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def prepare_documents(mode: str, src: str, tgt: str, src_lang: str, tgt_lang: str,
                      out_prefix: str, docids: Optional[str] = None, allow_empty: bool = False,
                      doc_prefix: str = "doc") -> PrepSummary:
    """Read, validate and write one split. ``mode`` is ``xml`` (``src``/``tgt``
    are XML files), ``sgml`` (WMT ``.sgm`` files), ``blank-lines``, ``tags``
    (IWSLT ``train.tags`` files) or ``docids`` (``docids`` names the id file); WMT test-set XML (one file) is
    :func:`prepare_wmt`. Raises :class:`PrepDocsError` before writing anything."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    inputs = [src, tgt] + ([docids] if docids else [])
    _check_outputs(out_prefix, src_lang, tgt_lang, inputs)
    note = ""
    if mode == "xml":
        docs, replaced = load_xml(src, tgt, allow_empty=allow_empty)
    elif mode == "sgml":
        docs, replaced = load_sgml(src, tgt, allow_empty=allow_empty)
    elif mode == "blank-lines":
        docs, replaced = load_blank_lines(src, tgt, doc_prefix=doc_prefix)
    elif mode == "tags":
        docs, replaced, skipped = load_tags(src, tgt, allow_empty=allow_empty)
        if skipped:
            shown = ", ".join(skipped[:10]) + (", ..." if len(skipped) > 10 else "")
            note = (f"{len(skipped)} talk" + ("" if len(skipped) == 1 else "s")
                    + f" without transcript lines skipped: {shown}")
    else:
        if docids is None:
            raise ValueError("docids mode needs the docids file")
        docs, replaced = load_docids(src, tgt, docids, allow_empty=allow_empty)
    paths = write_documents(docs, out_prefix, src_lang, tgt_lang)
    return PrepSummary(len(docs), sum(len(p) for _, p in docs), paths, replaced, note=note)


def prepare_wmt(xml: str, src_lang: str, tgt_lang: str, out_prefix: str,
                ref_translator: Optional[str] = None, hyp_system: Optional[str] = None,
                paragraph_boundaries: bool = False, allow_empty: bool = False) -> PrepSummary:
    """Read, validate and write a WMT test-set XML file (see :func:`load_wmt`):
    ``PREFIX.{src_lang}``, ``PREFIX.{tgt_lang}``, ``PREFIX.docids`` and, with
    ``hyp_system``, ``PREFIX.hyp.{tgt_lang}``. Raises :class:`PrepDocsError`
    before writing anything."""
    _check_outputs(out_prefix, src_lang, tgt_lang, [xml], with_hyp=hyp_system is not None)
    data = load_wmt(xml, src_lang, tgt_lang, ref_translator=ref_translator, hyp_system=hyp_system,
                    paragraph_boundaries=paragraph_boundaries, allow_empty=allow_empty)
    paths = write_documents(data.docs, out_prefix, src_lang, tgt_lang, hyp=data.hyp)
    def docs(n: int) -> str:
        return f"{n} document" + ("" if n == 1 else "s")

    notes = ["reference: " + ", ".join(f"translator {t} ({docs(n)})" for t, n in data.references.items())]
    if paragraph_boundaries:
        notes.append(f"documents are the paragraphs of {docs(data.wmt_documents)}")
    if hyp_system is not None:
        notes.append(f"system {hyp_system} -> {paths[3]}")
    if data.testsuite_skipped:
        notes.append(f"{docs(data.testsuite_skipped)} with a testsuite attribute skipped")
    return PrepSummary(len(data.docs), sum(len(p) for _, p in data.docs), paths[:3],
                       data.line_breaks_replaced, paths[3] if hyp_system is not None else None,
                       "; ".join(notes))


# --------------------------------------------------------------------------
# command line


def get_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--src-lang", required=True, metavar="L1", help="source language code, e.g. en")
    common.add_argument("--tgt-lang", required=True, metavar="L2", help="target language code, e.g. de")
    common.add_argument("--out-prefix", required=True, metavar="PREFIX",
                        help="writes PREFIX.L1, PREFIX.L2 and PREFIX.docids")
    allow = argparse.ArgumentParser(add_help=False)
    allow.add_argument("--allow-empty", action="store_true",
                       help="keep empty segments/lines as empty lines instead of failing")

    p = argparse.ArgumentParser(
        prog=PROG,
        description="Turn parallel documents into fairseq-preprocess input plus a document-id "
        "file: PREFIX.L1, PREFIX.L2 and PREFIX.docids (one id per line). Nothing is written "
        "unless all input validates; errors exit with status 2.",
    )
    sub = p.add_subparsers(dest="mode", required=True,
                           metavar="{xml,wmt,sgml,blank-lines,docids,tags}")
    x = sub.add_parser("xml", parents=[common, allow],
                       help="IWSLT/mteval-style XML, one file per language: "
                       "<doc docid=...> with <seg id=...>")
    x.add_argument("--src-xml", required=True, metavar="FILE")
    x.add_argument("--tgt-xml", required=True, metavar="FILE")
    w = sub.add_parser("wmt", parents=[common, allow],
                       help="WMT test-set XML (WMT21 and later): one file with <src>, <ref> and <hyp>")
    w.add_argument("--xml", required=True, metavar="FILE",
                   help="one language pair's test set, e.g. wmttest2022.en-de.xml")
    w.add_argument("--ref-translator", metavar="NAME",
                   help="use the <ref> with translator=NAME in every document (a document without "
                   "one is an error); default: each document's first <ref>")
    w.add_argument("--hyp-system", metavar="NAME",
                   help="also write PREFIX.hyp.L2: the segments of <hyp system=NAME> "
                   "(a document without one is an error)")
    w.add_argument("--paragraph-boundaries", action="store_true",
                   help="make each <p> paragraph its own document, with the id DOCID.pN (N = 1, 2, ...)")
    g = sub.add_parser("sgml", parents=[common, allow],
                       help="WMT .sgm files before 2021 (srcset/refset), read tolerantly")
    g.add_argument("--src-sgm", required=True, metavar="FILE", help="e.g. newstest2019-ende-src.en.sgm")
    g.add_argument("--tgt-sgm", required=True, metavar="FILE", help="e.g. newstest2019-ende-ref.de.sgm")
    b = sub.add_parser("blank-lines", parents=[common],
                       help="one sentence per line, a blank line between documents")
    b.add_argument("--src", required=True, metavar="FILE")
    b.add_argument("--tgt", required=True, metavar="FILE")
    b.add_argument("--doc-prefix", default="doc",
                   help="document ids are PREFIX00000, PREFIX00001, ... (default: doc)")
    d = sub.add_parser("docids", parents=[common, allow],
                       help="one sentence per line plus the document id of each line")
    d.add_argument("--src", required=True, metavar="FILE")
    d.add_argument("--tgt", required=True, metavar="FILE")
    d.add_argument("--docids", required=True, metavar="FILE")
    t = sub.add_parser("tags", parents=[common, allow],
                       help="IWSLT train.tags.L1-L2.{L1,L2}: each talk's metadata lines (<url>, "
                       "<talkid>, ...) then its transcript; the talk id is the <talkid>")
    t.add_argument("--src", required=True, metavar="FILE", help="e.g. train.tags.en-de.en")
    t.add_argument("--tgt", required=True, metavar="FILE", help="e.g. train.tags.en-de.de")
    return p


def cli_main(argv=None) -> None:
    args = get_parser().parse_args(argv)
    if args.mode == "xml":
        src, tgt, docids = args.src_xml, args.tgt_xml, None
    elif args.mode == "sgml":
        src, tgt, docids = args.src_sgm, args.tgt_sgm, None
    elif args.mode != "wmt":
        src, tgt, docids = args.src, args.tgt, getattr(args, "docids", None)
    try:
        if args.mode == "wmt":
            summary = prepare_wmt(args.xml, args.src_lang, args.tgt_lang, args.out_prefix,
                                  ref_translator=args.ref_translator, hyp_system=args.hyp_system,
                                  paragraph_boundaries=args.paragraph_boundaries,
                                  allow_empty=args.allow_empty)
        else:
            summary = prepare_documents(
                args.mode, src, tgt, args.src_lang, args.tgt_lang, args.out_prefix, docids=docids,
                allow_empty=getattr(args, "allow_empty", False),
                doc_prefix=getattr(args, "doc_prefix", "doc"),
            )
    except PrepDocsError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        sys.exit(2)
    notes = [summary.note] if summary.note else []
    if summary.line_breaks_replaced:
        notes.append(f"{summary.line_breaks_replaced} line breaks inside sentences replaced by spaces")
    note = f" ({'; '.join(notes)})" if notes else ""
    print(f"{PROG}: {summary.documents} documents, {summary.sentences} sentences -> "
          f"{args.out_prefix}.{{{args.src_lang},{args.tgt_lang},docids}}{note}")


if __name__ == "__main__":
    cli_main()
