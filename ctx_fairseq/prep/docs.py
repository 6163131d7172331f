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
from typing import Dict, List, Optional, Sequence, Tuple

# the readers by format (the library entry points above)
from ctx_fairseq.prep.common import (
    LINE_BREAK_RUN,
    WHITESPACE,
    ParallelDoc,
    PrepSummary,
    clean_text,
)
from ctx_fairseq.data.docids import DocFileError as PrepDocsError
from ctx_fairseq.prep.common import read_text_lines as _read_text_lines
from ctx_fairseq.prep.text_docs import load_blank_lines, load_docids, load_tags
from ctx_fairseq.prep.xml_docs import (
    SGML_SETS, WMT_FILE_HINT, ParsedDoc, ParsedSeg, align_docs, check_unique_segids, end_document,
    load_wmt, load_xml, start_document)

PROG = "ctx-prep-docs"
MODES = ("xml", "sgml", "blank-lines", "docids", "tags")

# --------------------------------------------------------------------------
# WMT .sgm (the "fake SGML" of WMT test sets before 2021)

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
# the five entities XML predefines (entities="xml")
_XML_ENTITY = re.compile(r"&(amp|lt|gt|quot|apos);")
_XML_ENTITIES = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}
ENTITY_SETS = ("html", "xml")


def _unescape_entities(text: str, entities: str = "html") -> str:
    """Unescape ``&name;``, ``&#N;`` and ``&#xN;`` (HTML5 entity names). An
    ``&`` that does not start such an entity (``AT&T``, ``a & b``) and unknown
    names (``&foo;``) are kept as they are; unlike ``html.unescape``, names
    without the closing ``;`` (``&copy``) are never unescaped. ``entities="xml"``
    unescapes only the five entities XML predefines (``&amp;``, ``&lt;``,
    ``&gt;``, ``&quot;``, ``&apos;``, as ``xml.sax.saxutils.unescape`` with the
    last two added) and keeps every other one (``&#39;``, ``&nbsp;``) as text."""
    import html.entities

    if entities == "xml":
        return _XML_ENTITY.sub(lambda m: _XML_ENTITIES[m.group(1)], text)

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


def _parse_sgml(path: str, allow_empty: bool,
                entities: str = "html") -> Tuple[List[ParsedDoc], int, int]:
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
    are unescaped with :func:`_unescape_entities` (a bare ``&`` stays ``&``;
    ``entities`` picks its set: ``html`` or only the five of XML, ``xml``);
    a ``<`` that does not start one of those tags is text."""
    if entities not in ENTITY_SETS:
        raise ValueError(f"entities must be one of {ENTITY_SETS}, not {entities!r}")
    lines = _read_text_lines(path)
    docs: List[ParsedDoc] = []
    first_line: Dict[str, int] = {}
    cur: Optional[ParsedDoc] = None
    seg: Optional[Tuple[str, int, List[str]]] = None  # (id, first line, text pieces)
    replaced = 0

    def end_seg() -> None:
        nonlocal seg, replaced
        assert seg is not None and cur is not None
        segid, start, parts = seg
        text, n = clean_text(_unescape_entities("\n".join(parts), entities).strip())
        replaced += n
        if not text and not allow_empty:
            raise PrepDocsError(path, start, f"document {cur.docid}, segment {segid}: empty segment; "
                                "expected text (--allow-empty keeps it as an empty line)")
        cur.segs.append(ParsedSeg(segid, text, start))
        seg = None

    def end_doc(lineno: int) -> None:
        nonlocal cur
        assert cur is not None
        if seg is not None:
            end_seg()
        docs.append(end_document(cur, path, lineno))
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
                raise PrepDocsError(path, lineno, WMT_FILE_HINT)
            if name == "doc":
                if cur is not None:  # </doc>, or a <doc> whose predecessor has no </doc>
                    end_doc(lineno)
                if closing:
                    continue
                attrs = _sgml_attrs(m.group(3))
                cur = start_document(attrs.get("docid", ""), "id" in attrs, path, lineno,
                                     first_line)
            elif name == "seg" and not closing:
                if cur is None:
                    raise PrepDocsError(path, lineno, "<seg> outside any <doc>; "
                                                      "expected segments inside <doc docid=...>")
                segid = _sgml_attrs(m.group(3)).get("id", "")
                if not segid:
                    raise PrepDocsError(path, lineno, f"document {cur.docid}: <seg> without an id "
                                                      'attribute; expected <seg id="...">')
                seg = (segid, lineno, [])
            elif name in SGML_SETS and closing and cur is not None:
                end_doc(lineno)
    if cur is not None:
        end_doc(len(lines))
    if not docs:
        raise PrepDocsError(path, 1, "no <doc> elements found; expected "
                                     '<doc docid="..."> elements with <seg id="..."> inside')
    return docs, len(lines), replaced


def read_sgml_documents(path: str, allow_empty: bool = False,
                        entities: str = "html") -> List[Tuple[str, List[Tuple[str, str]]]]:
    """Read one WMT ``.sgm`` file (``newstest2019-ende-src.en.sgm``, ...)
    tolerantly: ``[(docid, [(segid, text), ...]), ...]`` in file order. See
    :func:`_parse_sgml` for what is tolerated; a ``<doc>`` without docid or
    without segments, duplicate docids, a ``<seg>`` outside a ``<doc>`` or
    without id, duplicate segment ids in a document and (unless
    ``allow_empty``) empty segments raise :class:`PrepDocsError`. ``entities``:
    which entities the text unescapes (:func:`_unescape_entities`)."""
    docs, _, _ = _parse_sgml(path, allow_empty, entities)
    check_unique_segids(path, docs)
    return [(d.docid, [(s.segid, s.text) for s in d.segs]) for d in docs]


def load_sgml(src_sgm: str, tgt_sgm: str, allow_empty: bool = False,
              entities: str = "html") -> Tuple[List[ParallelDoc], int]:
    """Read and align a pair of WMT ``.sgm`` files (a ``srcset`` and a
    ``refset``): the same documents in the same order, each with the same
    segment ids in the same order. Returns (documents, line breaks replaced).
    ``entities``: ``html`` (HTML5 names and numeric references, the default)
    or ``xml`` (the five XML entities only; the sentence-level recipes' text,
    :mod:`ctx_fairseq.prep.recipe_text`)."""
    src_docs, src_lines, n1 = _parse_sgml(src_sgm, allow_empty, entities)
    tgt_docs, tgt_lines, n2 = _parse_sgml(tgt_sgm, allow_empty, entities)
    return align_docs(src_sgm, src_docs, src_lines, tgt_sgm, tgt_docs, tgt_lines), n1 + n2


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
        if not lang or WHITESPACE.search(lang) or "/" in lang or os.sep in lang:
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
            if LINE_BREAK_RUN.search(s) or LINE_BREAK_RUN.search(t):
                raise PrepDocsError(out_prefix, None, f"document {docid}: a sentence contains a "
                                                      "line break; expected one line per sentence")
    paths: Tuple[str, ...] = output_paths(out_prefix, src_lang, tgt_lang)
    rows = ((s, t, docid) for docid, pairs in docs for s, t in pairs)
    if hyp is not None:
        n = sum(len(pairs) for _, pairs in docs)
        if len(hyp) != n:
            raise ValueError(f"hyp has {len(hyp)} lines; expected {n}, one per sentence")
        if any(LINE_BREAK_RUN.search(h) for h in hyp):
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
