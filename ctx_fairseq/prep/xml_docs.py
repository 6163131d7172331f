"""XML readers of ``ctx-prep-docs``: IWSLT-style XML (``<doc docid>`` with
``<seg id>``), aligned between source and target, and WMT test-set XML
(WMT21 and later: the source, the references and system outputs in one
file)."""

import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ctx_fairseq.prep.common import ParallelDoc, clean_text
from ctx_fairseq.data.docids import DocFileError as PrepDocsError, check_docid

# --------------------------------------------------------------------------
# XML


class ParsedSeg(NamedTuple):
    segid: str
    text: str
    line: int


def start_document(docid: str, has_id: bool, path: str, lineno: int,
                   first_line: Dict[str, int]) -> "ParsedDoc":
    """A ``<doc>`` opened at ``lineno`` of ``path`` (the XML and the SGM
    readers alike): its ``docid`` checked (present, valid, unique in the file:
    ``first_line`` records each document's line), or an error naming the file
    and the line; ``has_id``: the tag has an ``id`` instead (a WMT test-set
    file, named in the error)."""
    if not docid:
        hint = f"; {WMT_FILE_HINT}" if has_id else ""
        raise PrepDocsError(path, lineno, "<doc> without a docid attribute; "
                                          f'expected <doc docid="...">{hint}')
    check_docid(docid, path, lineno)
    if docid in first_line:
        raise PrepDocsError(path, lineno, f"duplicate document id {docid} "
                            f"(first at line {first_line[docid]}); expected unique docids")
    first_line[docid] = lineno
    return ParsedDoc(docid, lineno, [], [lineno])


def end_document(doc: "ParsedDoc", path: str, lineno: int) -> "ParsedDoc":
    """A ``<doc>`` closed at ``lineno`` (both readers): it must hold a
    segment; its last line recorded."""
    if not doc.segs:
        raise PrepDocsError(path, doc.line, f"document {doc.docid} has no segments; "
                            "expected at least one <seg>")
    doc.end_line[0] = lineno
    return doc


class ParsedDoc(NamedTuple):
    docid: str
    line: int
    segs: List[ParsedSeg]
    end_line: List[int]  # one element: the line of </doc> (filled in when seen)


def _local(tag) -> str:
    """Element name without namespace, lower-cased (``{ns}DOC`` -> ``doc``)."""
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1].lower()


def _seg_start(path: str, lineno: int, el, in_seg: Optional[Tuple[str, int]], where: str,
               within: str = "") -> Tuple[str, int]:
    """``(id, line)`` of the ``<seg>`` element ``el`` that starts at line
    ``lineno``, as both XML readers (``<doc><seg>`` files and WMT test sets)
    check it: not inside the segment ``in_seg`` still open, and with an id.
    The errors name ``where`` (the document) and ``within`` (the side that
    holds the segment, if any)."""
    if in_seg is not None:
        raise PrepDocsError(path, lineno, f"{where}: <seg> inside segment {in_seg[0]} "
                            f"(line {in_seg[1]}); expected </seg> first")
    segid = (el.get("id") or "").strip()
    if not segid:
        raise PrepDocsError(path, lineno, f"{where}: <seg> without an id attribute{within}; "
                                          'expected <seg id="...">')
    return segid, lineno


def _read_events(parser, root: List[str]):
    """``(event, element, local name, at_root)`` of each event the pull
    parser ``parser`` has read since last asked, as both XML readers walk
    them: ``at_root`` is true for the start of the root element, whose name
    is then put in ``root`` (empty until then; the readers' messages name the
    kind of file by it)."""
    for event, el in parser.read_events():
        name = _local(el.tag)
        at_root = event == "start" and not root
        if at_root:
            root.append(name)
        yield event, el, name, at_root


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


def _parse_xml(path: str, allow_empty: bool) -> Tuple[List[ParsedDoc], int, int]:
    """Parse and validate one XML file. Returns (documents, number of lines,
    number of line breaks replaced inside segments)."""
    import xml.etree.ElementTree as ET

    docs: List[ParsedDoc] = []
    first_line: Dict[str, int] = {}
    cur: Optional[ParsedDoc] = None
    in_seg: Optional[Tuple[str, int]] = None
    replaced = 0
    root: List[str] = []  # the root element's name, once seen
    parser = ET.XMLPullParser(events=("start", "end"))

    def handle(lineno: int) -> None:
        nonlocal cur, in_seg, replaced
        for event, el, name, at_root in _read_events(parser, root):
            if at_root and name == "dataset":
                raise PrepDocsError(path, lineno, WMT_FILE_HINT)
            if event == "start" and name == "doc":
                if cur is not None:
                    raise PrepDocsError(path, lineno, f"<doc> inside document {cur.docid} "
                                        f"(line {cur.line}); expected </doc> first")
                cur = start_document((el.get("docid") or "").strip(), el.get("id") is not None,
                                     path, lineno, first_line)
            elif event == "start" and name == "seg":
                if cur is None:
                    raise PrepDocsError(path, lineno, "<seg> outside any <doc>; "
                                                      "expected segments inside <doc docid=...>")
                in_seg = _seg_start(path, lineno, el, in_seg, f"document {cur.docid}")
            elif event == "end" and name == "seg" and cur is not None and in_seg is not None:
                segid, start = in_seg
                text, n = clean_text("".join(el.itertext()).strip())
                replaced += n
                if not text and not allow_empty:
                    raise PrepDocsError(path, start, f"document {cur.docid}, segment {segid}: "
                                        "empty segment; expected text (--allow-empty keeps it "
                                        "as an empty line)")
                cur.segs.append(ParsedSeg(segid, text, start))
                in_seg = None
                el.clear()
            elif event == "end" and name == "doc" and cur is not None:
                docs.append(end_document(cur, path, lineno))
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


def check_unique_segids(path: str, docs: Sequence[ParsedDoc]) -> None:
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
    check_unique_segids(path, docs)
    return [(d.docid, [(s.segid, s.text) for s in d.segs]) for d in docs]


def load_xml(src_xml: str, tgt_xml: str, allow_empty: bool = False) -> Tuple[List[ParallelDoc], int]:
    """Read and align a pair of XML files. Both must hold the same documents
    in the same order, and each document the same segment ids in the same
    order. Returns (documents, line breaks replaced inside segments)."""
    src_docs, src_lines, n1 = _parse_xml(src_xml, allow_empty)
    tgt_docs, tgt_lines, n2 = _parse_xml(tgt_xml, allow_empty)
    return align_docs(src_xml, src_docs, src_lines, tgt_xml, tgt_docs, tgt_lines), n1 + n2


def align_docs(src_xml: str, src_docs: Sequence[ParsedDoc], src_lines: int, tgt_xml: str,
                tgt_docs: Sequence[ParsedDoc], tgt_lines: int) -> List[ParallelDoc]:
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
    check_unique_segids(src_xml, src_docs)
    check_unique_segids(tgt_xml, tgt_docs)
    return docs


SGML_SETS = ("srcset", "refset", "tstset", "mteval")

WMT_FILE_HINT = ("this looks like a WMT test-set XML file (<dataset> root, WMT21 and later), which holds "
                  "the source, the references and system outputs in one file: use "
                  "`ctx-prep-docs wmt --xml FILE --src-lang L1 --tgt-lang L2 --out-prefix PREFIX`")


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
        self.paras: List[List[ParsedSeg]] = []
        self.open_para = False  # the last paragraph still takes segments

    def label(self) -> str:
        if self.kind == "ref":
            who = self.attrs.get("translator")
            return f'<ref translator="{who}">' if who is not None else "<ref>"
        if self.kind == "hyp":
            return f'<hyp system="{self.attrs.get("system", "")}">'
        return "<src>"

    def segs(self) -> List[Tuple[int, ParsedSeg]]:
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
        for event, el, name, at_root in _read_events(parser, root):
            if at_root and name != "dataset":
                if name in SGML_SETS:
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
                    check_docid(docid, path, lineno)
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
                    in_seg = _seg_start(path, lineno, el, in_seg, where(), f" in {side.label()}")
            else:
                if name == "seg" and side is not None and in_seg is not None:
                    if not side.open_para:
                        side.paras.append([])
                        side.open_para = True
                    side.paras[-1].append(ParsedSeg(in_seg[0], "".join(el.itertext()).strip(), in_seg[1]))
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
        check_unique_segids(xml, [ParsedDoc(doc.docid, doc.line, [s for _, s in src.segs()], [doc.line])])

        texts = []
        for side in [src] + sides:
            cleaned = []
            for _, seg in side.segs():
                text, n = clean_text(seg.text)
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


