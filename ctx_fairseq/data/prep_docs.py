"""ctx-prep-docs: turn raw parallel documents into fairseq-preprocess input.

Three input formats (see ``docs/prep_docs.md``):

* ``xml``: IWSLT/WMT-style XML, ``<doc docid=...>`` elements holding
  ``<seg id=...>`` elements, one file per language;
* ``blank-lines``: one sentence per line, a blank line between documents, at
  the same positions in both files;
* ``docids``: one sentence per line plus a file with the document id of each
  line (documents contiguous).

Output, for ``--out-prefix PREFIX``: ``PREFIX.{src_lang}``,
``PREFIX.{tgt_lang}`` and ``PREFIX.docids`` (the document id of each line),
ready for ``fairseq-preprocess --source-lang L1 --target-lang L2 --trainpref
PREFIX``. Everything is read and validated before anything is written; the
three files are written to temporary names in the output directory and
renamed into place only when all of them are complete.

Every problem raises :class:`PrepDocsError`, whose text is
``FILE:LINE: what is wrong / what was expected``.

Library entry points: :func:`read_xml_documents`, :func:`read_docids`,
:func:`load_xml`, :func:`load_blank_lines`, :func:`load_docids`,
:func:`write_documents` and :func:`prepare_documents`.
"""

import argparse
import os
import re
import sys
import tempfile
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

PROG = "ctx-prep-docs"
MODES = ("xml", "blank-lines", "docids")

# One document: its id and its sentence pairs (source, target).
ParallelDoc = Tuple[str, List[Tuple[str, str]]]

# Characters that str.splitlines() (and so some readers of our output) treat
# as line boundaries. A sentence must never contain one, or the three output
# files would stop being line-aligned for such readers.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE_BREAK_RUN = re.compile("[ \t]*[" + _LINE_BREAKS + "]+[ \t]*")
_WHITESPACE = re.compile(r"\s")


class PrepDocsError(ValueError):
    """An input problem: ``path``, 1-based ``line`` (or None) and ``message``."""

    def __init__(self, path: str, line: Optional[int], message: str):
        self.path = path
        self.line = line
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.line is None:
            return f"{self.path}: {self.message}"
        return f"{self.path}:{self.line}: {self.message}"


class PrepSummary(NamedTuple):
    documents: int
    sentences: int
    files: Tuple[str, str, str]  # source, target, docids
    line_breaks_replaced: int  # line breaks inside sentences turned into spaces


def _clean(text: str) -> Tuple[str, int]:
    """Replace each run of line-break characters (and the blanks around it)
    inside ``text`` by one space; returns the text and the number of runs."""
    return _LINE_BREAK_RUN.subn(" ", text)


def _check_docid(docid: str, path: str, line: int, what: str = "document id") -> None:
    if not docid:
        raise PrepDocsError(path, line, f"empty {what}; expected a non-empty id")
    if _WHITESPACE.search(docid):
        raise PrepDocsError(path, line, f"{what} {docid!r} contains whitespace; "
                                        "expected one token (the .docids file has one id per line)")


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


def _parse_xml(path: str, allow_empty: bool) -> Tuple[List[_Doc], int, int]:
    """Parse and validate one XML file. Returns (documents, number of lines,
    number of line breaks replaced inside segments)."""
    import xml.etree.ElementTree as ET

    docs: List[_Doc] = []
    first_line: Dict[str, int] = {}
    cur: Optional[_Doc] = None
    in_seg: Optional[Tuple[str, int]] = None
    replaced = 0
    parser = ET.XMLPullParser(events=("start", "end"))

    def handle(lineno: int) -> None:
        nonlocal cur, in_seg, replaced
        for event, el in parser.read_events():
            name = _local(el.tag)
            if event == "start" and name == "doc":
                if cur is not None:
                    raise PrepDocsError(path, lineno, f"<doc> inside document {cur.docid} "
                                        f"(line {cur.line}); expected </doc> first")
                docid = (el.get("docid") or "").strip()
                if not docid:
                    raise PrepDocsError(path, lineno, "<doc> without a docid attribute; "
                                                      'expected <doc docid="...">')
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
                                        "expected well-formed XML") from None
    except OSError as err:
        raise PrepDocsError(path, None, f"cannot read: {err.strerror or err}") from None
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
    return docs, n1 + n2


# --------------------------------------------------------------------------
# plain text


def _read_lines(path: str) -> List[str]:
    """Lines without their line endings. Line endings are those of Python's
    universal-newline mode (``\\n``, ``\\r\\n``, ``\\r``), as fairseq-preprocess
    reads them; a UTF-8 byte-order mark is dropped."""
    try:
        with open(path, encoding="utf-8-sig", newline=None) as f:
            return [line[:-1] if line.endswith("\n") else line for line in f]
    except UnicodeDecodeError as err:
        raise PrepDocsError(path, None, f"not UTF-8 ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise PrepDocsError(path, None, f"cannot read: {err.strerror or err}") from None


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


def read_docids(path: str) -> List[str]:
    """Read a document-id file (one id per line) and check it: no empty ids,
    no whitespace inside an id, and documents contiguous (an id that comes
    back after another document started is an error naming the line).
    Returns the id of each line."""
    ids = [x.strip() for x in _read_lines(path)]
    if not ids:
        raise PrepDocsError(path, 1, "empty file; expected one document id per line")
    first: Dict[str, int] = {}
    last: Dict[str, int] = {}
    prev = None
    for lineno, docid in enumerate(ids, 1):
        _check_docid(docid, path, lineno)
        if docid != prev and docid in first:
            raise PrepDocsError(path, lineno, f"document {docid} reappears: its lines "
                                f"{first[docid]}-{last[docid]} were followed by document {prev} "
                                f"(from line {first[prev]}); expected each document's lines to be contiguous")
        first.setdefault(docid, lineno)
        last[docid] = lineno
        prev = docid
    return ids


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
# output


def output_paths(out_prefix: str, src_lang: str, tgt_lang: str) -> Tuple[str, str, str]:
    return f"{out_prefix}.{src_lang}", f"{out_prefix}.{tgt_lang}", f"{out_prefix}.docids"


def _check_outputs(out_prefix: str, src_lang: str, tgt_lang: str, inputs: Sequence[str]) -> None:
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
    for out in output_paths(out_prefix, src_lang, tgt_lang):
        if os.path.realpath(out) in ins:
            raise PrepDocsError(out, None, "output would overwrite an input file; "
                                           "expected a different --out-prefix")


def write_documents(docs: Sequence[ParallelDoc], out_prefix: str, src_lang: str,
                    tgt_lang: str) -> Tuple[str, str, str]:
    """Write ``PREFIX.{src_lang}``, ``PREFIX.{tgt_lang}`` and ``PREFIX.docids``.
    Each is written to a temporary file in the output directory; all three are
    renamed into place only after all three were written. Returns the paths."""
    _check_outputs(out_prefix, src_lang, tgt_lang, ())
    for docid, pairs in docs:
        for s, t in pairs:
            if _LINE_BREAK_RUN.search(s) or _LINE_BREAK_RUN.search(t):
                raise PrepDocsError(out_prefix, None, f"document {docid}: a sentence contains a "
                                                      "line break; expected one line per sentence")
    paths = output_paths(out_prefix, src_lang, tgt_lang)
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
        with handles[0] as fs, handles[1] as ft, handles[2] as fd_:
            for docid, pairs in docs:
                for s, t in pairs:
                    fs.write(s + "\n")
                    ft.write(t + "\n")
                    fd_.write(docid + "\n")
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
    return paths


def prepare_documents(mode: str, src: str, tgt: str, src_lang: str, tgt_lang: str,
                      out_prefix: str, docids: Optional[str] = None, allow_empty: bool = False,
                      doc_prefix: str = "doc") -> PrepSummary:
    """Read, validate and write one split. ``mode`` is ``xml`` (``src``/``tgt``
    are XML files), ``blank-lines`` or ``docids`` (``docids`` names the id
    file). Raises :class:`PrepDocsError` before writing anything."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    inputs = [src, tgt] + ([docids] if docids else [])
    _check_outputs(out_prefix, src_lang, tgt_lang, inputs)
    if mode == "xml":
        docs, replaced = load_xml(src, tgt, allow_empty=allow_empty)
    elif mode == "blank-lines":
        docs, replaced = load_blank_lines(src, tgt, doc_prefix=doc_prefix)
    else:
        if docids is None:
            raise ValueError("docids mode needs the docids file")
        docs, replaced = load_docids(src, tgt, docids, allow_empty=allow_empty)
    paths = write_documents(docs, out_prefix, src_lang, tgt_lang)
    return PrepSummary(len(docs), sum(len(p) for _, p in docs), paths, replaced)


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
    sub = p.add_subparsers(dest="mode", required=True, metavar="{xml,blank-lines,docids}")
    x = sub.add_parser("xml", parents=[common, allow],
                       help="IWSLT/WMT-style XML: <doc docid=...> with <seg id=...>")
    x.add_argument("--src-xml", required=True, metavar="FILE")
    x.add_argument("--tgt-xml", required=True, metavar="FILE")
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
    return p


def cli_main(argv=None) -> None:
    args = get_parser().parse_args(argv)
    if args.mode == "xml":
        src, tgt, docids = args.src_xml, args.tgt_xml, None
    else:
        src, tgt, docids = args.src, args.tgt, getattr(args, "docids", None)
    try:
        summary = prepare_documents(
            args.mode, src, tgt, args.src_lang, args.tgt_lang, args.out_prefix, docids=docids,
            allow_empty=getattr(args, "allow_empty", False),
            doc_prefix=getattr(args, "doc_prefix", "doc"),
        )
    except PrepDocsError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        sys.exit(2)
    note = ""
    if summary.line_breaks_replaced:
        note = f" ({summary.line_breaks_replaced} line breaks inside sentences replaced by spaces)"
    print(f"{PROG}: {summary.documents} documents, {summary.sentences} sentences -> "
          f"{args.out_prefix}.{{{args.src_lang},{args.tgt_lang},docids}}{note}")


if __name__ == "__main__":
    cli_main()
