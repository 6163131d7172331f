"""ctx-prep-corpora: the document structure of the corpora the context papers
used, recovered from their public releases (see ``docs/prep_corpora.md``).

Three readers, each returning aligned documents ``[(docid, [(src, tgt),
...]), ...]`` (the ``ParallelDoc`` of :mod:`ctx_fairseq.prep.docs`):

* :func:`load_doc_delimited` (``doc-delimited``): one sentence per line, a
  line ``<d>`` before each document, one file per language: the format of the
  document-level data Maruf et al. (2019) released (``concatenated_en2de_*``).
* :func:`load_aligned_sessions` (``aligned-sessions``): two directories of
  line-aligned files with the same names, markup on lines of its own
  (``<CHAPTER ID=..>``, ``<SPEAKER ID=.. NAME=..>``, ``<P>``): the Europarl
  source release's session files after its sentence aligner. ``--unit
  speaker``: a document is a speaker turn (Maruf et al. 2019, after Maruf and
  Haffari 2018: "the SPEAKER tag as the document delimiter"); ``--unit
  file``: a document is a file.
* :func:`load_opus` (``opus``): an OPUS XCES sentence alignment
  (``de-en.xml.gz``, ``en-ru.xml.gz``: ``<linkGrp fromDoc toDoc>`` holding
  ``<link xtargets="1 2;1" overlap="0.96"/>``) and the OPUS document files it
  points to (directories or the release's zip files): ``<s id>`` sentences
  made of ``<w>`` tokens (``xml``) or of text (``raw``), OpenSubtitles'
  ``<time id="T1S" value="00:00:01,600"/>`` marks, Europarl's
  ``<CHAPTER>``/``<SPEAKER>`` elements. Documents are runs of consecutive
  kept links of one document pair; a run ends where a link is dropped
  (``--min-overlap``, not 1:1, empty side), where the source sentences are
  not adjacent, at a ``--boundary-tag`` element, and where the time between
  two sentences exceeds ``--max-gap`` seconds (Voita et al. 2018: previous
  sentence as context only within a few seconds).

Then :func:`filter_documents` (``--min-doc-sentences``) and
:func:`split_documents` (random held-out sets, whole groups: an OpenSubtitles
movie never spans two splits). Every boundary is explained in the summary
(counts per reason); nothing is guessed: an input that does not carry the
structure a mode needs is an error naming the file and line
(:class:`~ctx_fairseq.prep.docs.PrepDocsError`).

:func:`postprocess_generate` (``postprocess-generate``) turns
``fairseq-generate`` output of Moses-tokenized (and truecased) data into
detokenized ``D-`` lines for sacreBLEU against the original references
(:func:`moses_detokenize`: the recipes' one detokenizer, which never unescapes);
:func:`bpe_voita_suite` (``bpe-voita-suite``) applies per-language BPE to a
Voita et al. (2019) contrastive test set.
"""

import argparse
import collections
import functools
import gzip
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple
from xml.parsers import expat

from ctx_fairseq.prep.docs import (
    ParallelDoc,
    PrepDocsError,
    decode_text_lines,
    write_documents,
)

PROG = "ctx-prep-corpora"

__all__ = [
    "PrepDocsError", "CorpusStats", "OpusCorpus", "load_doc_delimited",
    "load_aligned_sessions", "read_opus_alignment", "read_opus_document", "load_opus",
    "filter_documents", "split_documents", "write_splits", "moses_detokenize",
    "moses_detruecase", "postprocess_generate", "bpe_voita_suite", "cli_main",
]

_WHITESPACE = re.compile(r"\s+")
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


class CorpusStats:
    """Counts of what a reader kept and dropped, and why; notes for the summary."""

    def __init__(self):
        self.counts: "collections.Counter[str]" = collections.Counter()
        self.examples: Dict[str, str] = {}  # reason -> first FILE:LINE

    def add(self, key: str, n: int = 1, where: Optional[str] = None) -> None:
        self.counts[key] += n
        if where is not None and key not in self.examples:
            self.examples[key] = where

    def to_dict(self) -> Dict:
        return {"counts": dict(sorted(self.counts.items())), "first_examples": dict(self.examples)}

    def lines(self) -> List[str]:
        out = []
        for key, n in sorted(self.counts.items()):
            ex = f" (first: {self.examples[key]})" if key in self.examples else ""
            out.append(f"  {key}: {n}{ex}")
        return out


def _clean_text(text: str) -> str:
    """Surrounding white space stripped, every run of white space (line breaks
    included) one space: one line per sentence whatever the input held."""
    return _WHITESPACE.sub(" ", text).strip()


def _read_lines(path: str) -> List[str]:
    """Lines of a UTF-8 text file (``.gz`` read transparently), split at
    ``\\n`` only; a trailing ``\\r`` and a byte-order mark are dropped."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as err:
        raise PrepDocsError(path, None, f"cannot read: {getattr(err, 'strerror', None) or err}") \
            from None
    return decode_text_lines(path, raw)


# --------------------------------------------------------------------------
# <d>-delimited documents (Maruf et al. 2019's released data)


def _read_doc_delimited(path: str, marker: str) -> List[Tuple[int, List[Tuple[int, str]]]]:
    """Documents of one ``<d>``-delimited file: [(line of the marker, [(line, text)])]."""
    docs: List[Tuple[int, List[Tuple[int, str]]]] = []
    lines = _read_lines(path)
    if not lines:
        raise PrepDocsError(path, None, f"empty file; expected documents, each after a "
                                        f"{marker!r} line")
    for no, line in enumerate(lines, 1):
        text = line.strip()
        if text == marker:
            if docs and not docs[-1][1]:
                raise PrepDocsError(path, no, f"empty document: the {marker!r} of line "
                                              f"{docs[-1][0]} is followed by another; expected at "
                                              "least one sentence per document")
            docs.append((no, []))
        elif not text:
            raise PrepDocsError(path, no, "empty line; expected one sentence per line "
                                          f"(documents are separated by {marker!r} lines)")
        elif not docs:
            raise PrepDocsError(path, no, f"text before the first {marker!r} line; expected "
                                          f"every document to start with a {marker!r} line")
        else:
            docs[-1][1].append((no, _clean_text(line)))
    if not docs[-1][1]:
        raise PrepDocsError(path, docs[-1][0], f"empty document at the end of the file: nothing "
                                               f"follows this {marker!r} line")
    return docs


def load_doc_delimited(src: str, tgt: str, marker: str = "<d>",
                       doc_prefix: str = "doc") -> Tuple[List[ParallelDoc], CorpusStats]:
    """Aligned documents of a ``<d>``-delimited file pair. Both files must
    hold the same number of documents with the same number of sentences each
    (an error names both files' lines otherwise). Document ids are
    ``{doc_prefix}00000``, ``{doc_prefix}00001``, ... in file order."""
    if not marker.strip() or _WHITESPACE.search(marker.strip()):
        raise PrepDocsError("--marker", None, f"{marker!r}: expected one non-blank token")
    marker = marker.strip()
    sdocs = _read_doc_delimited(src, marker)
    tdocs = _read_doc_delimited(tgt, marker)
    for i, ((sl, ss), (tl, ts)) in enumerate(zip(sdocs, tdocs), 1):
        if len(ss) != len(ts):
            raise PrepDocsError(src, sl, f"document {i} has {len(ss)} sentences here and "
                                         f"{len(ts)} in {tgt} (its {marker!r} on line {tl}); "
                                         "expected line-aligned documents")
    if len(sdocs) != len(tdocs):
        raise PrepDocsError(tgt, None, f"{len(tdocs)} documents, but {src} has {len(sdocs)}; "
                                       "expected the same documents in both files")
    docs = []
    stats = CorpusStats()
    for i, ((_, ss), (_, ts)) in enumerate(zip(sdocs, tdocs)):
        docs.append((f"{doc_prefix}{i:05d}", [(s, t) for (_, s), (_, t) in zip(ss, ts)]))
    stats.add("documents read", len(docs))
    stats.add("sentences read", sum(len(p) for _, p in docs))
    return docs, stats


# --------------------------------------------------------------------------
# line-aligned session files with markup lines (Europarl source release)

_TAG_LINE = re.compile(r"^\s*<\s*(/?)\s*([A-Za-z][\w.-]*)(.*)>\s*$")
_ATTR = re.compile(r"([A-Za-z_][\w.-]*)\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s\"'>]+)")


def _parse_tag(line: str) -> Optional[Tuple[str, bool, Dict[str, str]]]:
    """``(NAME, closing, attributes)`` when the line is one markup tag (a line
    starting with ``<`` and a letter or ``/`` and ending with ``>``), else None."""
    m = _TAG_LINE.match(line)
    if not m:
        return None
    attrs = {k.upper(): v.strip("\"'") for k, v in _ATTR.findall(m.group(3))}
    return m.group(2).upper(), bool(m.group(1)), attrs


def _stem(name: str) -> str:
    base = os.path.basename(name)
    for ext in (".gz", ".txt", ".xml"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    return base


def load_aligned_sessions(src_dir: str, tgt_dir: str, unit: str = "speaker",
                          boundary_tags: Sequence[str] = ("SPEAKER", "CHAPTER"),
                          ) -> Tuple[List[ParallelDoc], CorpusStats]:
    """Aligned documents of two directories of line-aligned files (same file
    names; line i of one file translates line i of the other).

    Markup lines (one tag per line) must sit on the same line in both files,
    with the same tag name, and for ``SPEAKER`` the same ``ID``: a mismatch
    is an error naming the file and line. ``unit="speaker"``: each
    ``<SPEAKER>`` line starts a document (a speaker turn) and each other tag in
    ``boundary_tags`` (``<CHAPTER>``) ends the current one; lines outside any
    speaker turn (a chapter's title) form documents of their own, counted in
    the summary. ``unit="file"``: each file is one document (id: the file
    name without ``.txt``/``.gz``). Other tags (``<P>``, ...) are dropped and
    counted. A line pair with one empty side (a sentence the aligner left
    without a translation) is dropped and counted; blank pairs are skipped.
    Document ids (speaker unit): ``SESSION.tNNNN``, NNNN counting the
    session's segments from 0."""
    if unit not in ("speaker", "file"):
        raise ValueError(f"unit must be 'speaker' or 'file', not {unit!r}")
    boundary = {t.upper() for t in boundary_tags}
    for d in (src_dir, tgt_dir):
        if not os.path.isdir(d):
            raise PrepDocsError(d, None, "no such directory; expected a directory of "
                                         "line-aligned files")
    names = sorted(n for n in os.listdir(src_dir) if os.path.isfile(os.path.join(src_dir, n))
                   and not n.startswith("."))
    tnames = sorted(n for n in os.listdir(tgt_dir) if os.path.isfile(os.path.join(tgt_dir, n))
                    and not n.startswith("."))
    if not names:
        raise PrepDocsError(src_dir, None, "no files; expected one file per session/document")
    missing = sorted(set(names) ^ set(tnames))
    if missing:
        where = [f"{n} (only in {src_dir if n in names else tgt_dir})" for n in missing[:5]]
        raise PrepDocsError(tgt_dir, None, f"{len(missing)} file(s) not in both directories: "
                                           f"{', '.join(where)}; expected the same file names")
    stats = CorpusStats()
    docs: List[ParallelDoc] = []
    seen_ids: Dict[str, str] = {}
    for name in names:
        sp, tp = os.path.join(src_dir, name), os.path.join(tgt_dir, name)
        src, tgt = _read_lines(sp), _read_lines(tp)
        if len(src) != len(tgt):
            raise PrepDocsError(tp, None, f"{len(tgt)} lines, but {sp} has {len(src)}; expected "
                                          "line-aligned files (the sentence aligner's output)")
        stem = _stem(name)
        if _WHITESPACE.search(stem) or not stem:
            raise PrepDocsError(sp, None, f"file name {name!r} makes a bad document id; expected "
                                          "a name without white space")
        stats.add("files read")
        segment = 0
        in_speaker = False
        current: List[Tuple[str, str]] = []

        def flush():
            nonlocal current
            if current:
                docid = stem if unit == "file" else f"{stem}.t{segment:04d}"
                if docid in seen_ids:
                    raise PrepDocsError(sp, None, f"document id {docid} also made from "
                                                  f"{seen_ids[docid]}; expected unique file names")
                seen_ids[docid] = sp
                docs.append((docid, current))
                if unit == "speaker" and not in_speaker:
                    stats.add("documents outside speaker turns (e.g. chapter titles)")
                    stats.add("sentences outside speaker turns", len(current))
            current = []

        for no, (s, t) in enumerate(zip(src, tgt), 1):
            stag, ttag = _parse_tag(s), _parse_tag(t)
            if (stag is None) != (ttag is None):
                markup, other = (sp, tp) if stag is not None else (tp, sp)
                raise PrepDocsError(markup, no, f"markup line {(s if stag else t).strip()!r}, but "
                                                f"line {no} of {other} is text; expected markup "
                                                "on the same lines in both files")
            if stag is not None:
                name_s, closing_s, attrs_s = stag
                name_t, closing_t, attrs_t = ttag
                if (name_s, closing_s) != (name_t, closing_t):
                    raise PrepDocsError(sp, no, f"<{'/' if closing_s else ''}{name_s}> here but "
                                                f"<{'/' if closing_t else ''}{name_t}> on line "
                                                f"{no} of {tp}; expected the same markup")
                if unit == "speaker" and name_s in boundary and not closing_s:
                    if name_s == "SPEAKER" and attrs_s.get("ID") != attrs_t.get("ID"):
                        raise PrepDocsError(sp, no, f"SPEAKER ID {attrs_s.get('ID')!r} here but "
                                                    f"{attrs_t.get('ID')!r} on line {no} of {tp}; "
                                                    "expected the same speaker turns")
                    if current or in_speaker:
                        flush()
                        segment += 1
                    in_speaker = name_s == "SPEAKER"
                    stats.add(f"<{name_s}> boundaries")
                else:
                    stats.add(f"markup lines dropped: <{'/' if closing_s else ''}{name_s}>")
                continue
            s, t = _clean_text(s), _clean_text(t)
            if not s and not t:
                stats.add("blank line pairs skipped")
                continue
            if not s or not t:
                stats.add("line pairs with one empty side dropped", where=f"{sp}:{no}")
                continue
            current.append((s, t))
        flush()
    if unit == "speaker" and not stats.counts.get("<SPEAKER> boundaries"):
        raise PrepDocsError(src_dir, None, "no <SPEAKER> line in any file; expected Europarl "
                                           "session files (use --unit file for one document per "
                                           "file)")
    stats.add("documents read", len(docs))
    stats.add("sentences read", sum(len(p) for _, p in docs))
    return docs, stats


# --------------------------------------------------------------------------
# OPUS XCES alignments and documents


@dataclass
class OpusLink:
    src_ids: List[str]  # ids on the fromDoc side, as written
    tgt_ids: List[str]  # ids on the toDoc side
    overlap: Optional[float]
    line: int


@dataclass
class OpusLinkGroup:
    from_doc: str
    to_doc: str
    line: int
    links: List[OpusLink] = field(default_factory=list)


def _open_binary(path: str):
    try:
        f = open(path, "rb")
    except OSError as err:
        raise PrepDocsError(path, None, f"cannot read: {err.strerror or err}") from None
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=f, mode="rb")
    return f


def read_opus_alignment(path: str, chunk_size: int = 1 << 20) -> Iterator[OpusLinkGroup]:
    """The ``<linkGrp>`` elements of an XCES alignment file (``.gz`` or not),
    one at a time (the file is streamed). ``xtargets`` must be
    ``IDS;IDS`` (either side may be empty); ``overlap``, where present, a number."""
    parser = expat.ParserCreate()
    done: List[OpusLinkGroup] = []
    state: Dict[str, Optional[OpusLinkGroup]] = {"group": None}

    def start(name, attrs):
        line = parser.CurrentLineNumber
        if name == "linkGrp":
            if state["group"] is not None:
                raise PrepDocsError(path, line, "<linkGrp> inside another <linkGrp>")
            for a in ("fromDoc", "toDoc"):
                if not attrs.get(a):
                    raise PrepDocsError(path, line, f"<linkGrp> without {a}; expected "
                                                    "fromDoc and toDoc (XCES alignment)")
            state["group"] = OpusLinkGroup(attrs["fromDoc"], attrs["toDoc"], line)
        elif name == "link":
            group = state["group"]
            if group is None:
                raise PrepDocsError(path, line, "<link> outside a <linkGrp>")
            xt = attrs.get("xtargets")
            if xt is None or xt.count(";") != 1:
                raise PrepDocsError(path, line, f"<link> with xtargets={xt!r}; expected "
                                                "'IDS;IDS' (e.g. '1 2;1')")
            a, b = xt.split(";")
            ov = attrs.get("overlap")
            overlap = None
            if ov is not None:
                try:
                    overlap = float(ov)
                except ValueError:
                    raise PrepDocsError(path, line, f"overlap={ov!r}; expected a number") from None
                if math.isnan(overlap):
                    raise PrepDocsError(path, line, f"overlap={ov!r}; expected a number")
            group.links.append(OpusLink(a.split(), b.split(), overlap, line))

    def end(name):
        if name == "linkGrp" and state["group"] is not None:
            done.append(state["group"])
            state["group"] = None

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    f = _open_binary(path)
    try:
        while True:
            try:
                chunk = f.read(chunk_size)
            except (OSError, EOFError) as err:
                raise PrepDocsError(path, None, f"cannot read: {err}") from None
            try:
                parser.Parse(chunk, not chunk)
            except expat.ExpatError as err:
                raise PrepDocsError(path, err.lineno, f"malformed XML ({expat.ErrorString(err.code)},"
                                                      f" column {err.offset}); expected an XCES "
                                                      "alignment file") from None
            while done:
                yield done.pop(0)
            if not chunk:
                break
    finally:
        f.close()


@dataclass
class OpusSentence:
    text: str
    line: int
    index: int  # position in the document (0-based, document order)
    segment: int  # number of boundary elements seen before it
    start: Optional[float] = None  # seconds (OpenSubtitles <time> marks)
    end: Optional[float] = None


_TIME = re.compile(r"^\s*(-?\d+):(\d{1,2}):(\d{1,2})(?:[,.:](\d{1,3}))?\s*$")


def _seconds(value: str) -> Optional[float]:
    m = _TIME.match(value or "")
    if not m:
        return None
    h, mi, s, ms = m.groups()
    sign = -1 if h.startswith("-") else 1
    frac = int(ms) / (10 ** len(ms)) if ms else 0.0
    return sign * (abs(int(h)) * 3600 + int(mi) * 60 + int(s) + frac)


def read_opus_document(data: bytes, name: str, boundary_tags: Sequence[str] = (),
                       stats: Optional[CorpusStats] = None) -> Dict[str, OpusSentence]:
    """Sentences of one OPUS document (its bytes; ``name`` for messages) by id.

    A sentence's text is its ``<w>`` tokens joined by spaces (the ``xml``
    release, tokenized by OPUS), or, without ``<w>``, its text (``raw``).
    ``<time>`` marks (OpenSubtitles): a sentence's ``start`` is the last
    ``...S`` mark before its first word, its ``end`` the first ``...E`` mark
    after its last word; a malformed time value counts as unknown (and is
    counted in ``stats``). Every start of an element named in
    ``boundary_tags`` (``SPEAKER``, ``CHAPTER``; empty or not) begins a new
    segment: sentences record their segment number."""
    boundary = {t.upper() for t in boundary_tags}
    parser = expat.ParserCreate()
    sents: Dict[str, OpusSentence] = {}
    st = {"segment": 0, "last_start": None, "cur": None, "words": [], "text": [], "in_w": 0,
          "w_buf": [], "tokens_since_end": 0, "tentative_end": None}
    awaiting_end: List[OpusSentence] = []

    def start(tag, attrs):
        line = parser.CurrentLineNumber
        if tag.upper() in boundary:
            st["segment"] += 1
        if tag == "s":
            if st["cur"] is not None:
                raise PrepDocsError(name, line, "<s> inside another <s>")
            sid = attrs.get("id")
            if not sid:
                raise PrepDocsError(name, line, "<s> without id; expected OPUS sentence ids")
            if sid in sents:
                raise PrepDocsError(name, line, f"sentence id {sid} used twice (first on line "
                                                f"{sents[sid].line}); expected unique ids")
            st["cur"] = OpusSentence("", line, len(sents), st["segment"], start=st["last_start"])
            sents[sid] = st["cur"]
            st.update(words=[], text=[], tokens_since_end=0, tentative_end=None)
            st["cur_has_token"] = False
        elif tag == "w":
            st["in_w"] += 1
            st["w_buf"] = []
        elif tag == "time":
            tid, value = attrs.get("id", ""), attrs.get("value")
            secs = _seconds(value) if value is not None else None
            if value is not None and secs is None and stats is not None:
                stats.add("malformed <time> values (taken as unknown)", where=f"{name}:{line}")
            kind = tid[-1:].upper()
            cur = st["cur"]
            if kind == "S":
                st["last_start"] = secs
                if cur is not None and not st.get("cur_has_token"):
                    cur.start = secs
            elif kind == "E":
                for s in awaiting_end:
                    s.end = secs
                awaiting_end.clear()
                if cur is not None and st.get("cur_has_token"):
                    st["tentative_end"] = secs
                    st["tokens_since_end"] = 0

    def chars(data):
        if st["in_w"]:
            st["w_buf"].append(data)
        elif st["cur"] is not None:
            st["text"].append(data)
            if data.strip():
                token_seen()

    def token_seen():
        st["cur_has_token"] = True
        st["tokens_since_end"] += 1

    def end(tag):
        if tag == "w":
            st["in_w"] -= 1
            if st["cur"] is not None:
                word = _clean_text("".join(st["w_buf"]))
                if word:
                    st["words"].append(word)
                    token_seen()
        elif tag == "s" and st["cur"] is not None:
            cur = st["cur"]
            text = " ".join(st["words"]) if st["words"] else _clean_text("".join(st["text"]))
            if not st["words"] and text:
                token_seen()
            cur.text = text
            if st["tentative_end"] is not None and st["tokens_since_end"] == 0:
                cur.end = st["tentative_end"]
            else:
                awaiting_end.append(cur)
            st["cur"] = None

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    try:
        parser.Parse(data, True)
    except expat.ExpatError as err:
        raise PrepDocsError(name, err.lineno, f"malformed XML ({expat.ErrorString(err.code)}, "
                                              f"column {err.offset}); expected an OPUS document")
    return sents


class _DocSource:
    """Finds OPUS document files (``fromDoc``/``toDoc`` names such as
    ``en/1925/16641/3215187.xml.gz``) under directories and in zip files: a
    directory is searched for the name with and without ``.gz``; a zip's
    members are matched without the ``.gz`` and with or without the release's
    ``CORPUS/xml/`` (or ``raw/``) prefix."""

    def __init__(self, roots: Sequence[str]):
        self.dirs: List[str] = []
        self.zips: List[Tuple[str, zipfile.ZipFile, Dict[str, str]]] = []
        for root in roots:
            if os.path.isdir(root):
                self.dirs.append(root)
            elif zipfile.is_zipfile(root):
                z = zipfile.ZipFile(root)
                index: Dict[str, str] = {}
                for member in z.namelist():
                    if member.endswith("/"):
                        continue
                    for key in self._keys(member):
                        index.setdefault(key, member)
                self.zips.append((root, z, index))
            else:
                raise PrepDocsError(root, None, "neither a directory nor a zip file; expected "
                                                "where the OPUS documents are")

    @staticmethod
    def _keys(member: str) -> List[str]:
        name = member[:-3] if member.endswith(".gz") else member
        keys = [name]
        for mark in ("/xml/", "/raw/"):
            if mark in name:
                keys.append(name.split(mark, 1)[1])
        return keys

    def read(self, doc: str, where: str) -> Tuple[bytes, str]:
        plain = doc[:-3] if doc.endswith(".gz") else doc
        for d in self.dirs:
            for cand in (doc, plain, plain + ".gz"):
                path = os.path.join(d, cand)
                if os.path.isfile(path):
                    try:
                        if path.endswith(".gz"):
                            with gzip.open(path, "rb") as f:
                                return f.read(), path
                        with open(path, "rb") as f:
                            return f.read(), path
                    except (OSError, EOFError) as err:
                        raise PrepDocsError(path, None, f"cannot read: {err}") from None
        for zpath, z, index in self.zips:
            member = index.get(plain)
            if member is not None:
                data = z.read(member)
                if member.endswith(".gz"):
                    data = gzip.decompress(data)
                return data, f"{zpath}:{member}"
        looked = [*self.dirs, *(z for z, _, _ in self.zips)]
        raise PrepDocsError(where, None, f"document {doc} not found in {', '.join(looked)}; "
                                         "expected the OPUS documents the alignment names")

    def close(self):
        for _, z, _ in self.zips:
            z.close()


class OpusCorpus:
    """What :func:`load_opus` returns: ``docs`` (aligned documents, corpus
    order), ``groups`` (document id -> group, e.g. the movie
    ``1925/16641``), ``stats``."""

    def __init__(self, docs: List[ParallelDoc], groups: Dict[str, str], stats: CorpusStats):
        self.docs, self.groups, self.stats = docs, groups, stats


def _lang_of(doc: str) -> str:
    return doc.replace("\\", "/").split("/", 1)[0]


def _doc_key(doc: str) -> str:
    """``en/1925/16641/3215187.xml.gz`` -> ``1925/16641/3215187``."""
    parts = doc.replace("\\", "/").split("/")[1:] or [doc]
    path = "/".join(parts)
    for ext in (".gz", ".xml"):
        if path.endswith(ext):
            path = path[: -len(ext)]
    return path


def load_opus(alignment: str, roots: Sequence[str], src_lang: str, tgt_lang: str, *,
              min_overlap: Optional[float] = None, max_gap: Optional[float] = None,
              gap_from: str = "start", one_to_one: bool = True,
              boundary_tags: Sequence[str] = (), require_boundaries: bool = False,
              group_depth: int = -1) -> OpusCorpus:
    """Aligned documents of an OPUS alignment and its documents (see the
    module docstring). The source side is the one whose documents sit under
    ``src_lang/`` (``fromDoc`` or ``toDoc``; OPUS orders the pair
    alphabetically). A link is kept when both sides are non-empty, it is 1:1
    (unless ``one_to_one=False``: then the sentences of a side are joined by
    a space) and, given ``min_overlap``, its ``overlap`` is at least that (a
    link without ``overlap`` is then an error). A document is a run of kept
    links of one link group in which each link's first source sentence
    directly follows the previous link's last one, no ``boundary_tags``
    element lies between them and, given ``max_gap``, the two source
    sentences' times differ by at most ``max_gap`` seconds (``gap_from``:
    ``start``: start time to start time; ``end``: end of the previous to start
    of the current; a missing time ends the run). ``require_boundaries``: a
    source document without any ``boundary_tags`` element is an error.
    Groups (for :func:`split_documents`): the source document's path without
    the language and its last ``-group_depth`` parts (default -1:
    ``1925/16641``, the OpenSubtitles movie; a one-part name such as
    Europarl's ``ep-00-01-17`` is its own group); ``group_depth=0``: each
    document made here is its own group."""
    if gap_from not in ("start", "end"):
        raise ValueError(f"gap_from must be 'start' or 'end', not {gap_from!r}")
    if min_overlap is not None and not 0 <= min_overlap <= 1:
        raise PrepDocsError("--min-overlap", None, f"{min_overlap}: expected a value in [0, 1]")
    if max_gap is not None and max_gap < 0:
        raise PrepDocsError("--max-gap", None, f"{max_gap}: expected seconds >= 0")
    source = _DocSource(roots)
    stats = CorpusStats()
    docs: List[ParallelDoc] = []
    groups: Dict[str, str] = {}
    used_keys: Dict[str, int] = {}
    try:
        for group in read_opus_alignment(alignment):
            where = f"{alignment}:{group.line}"
            fl, tl = _lang_of(group.from_doc), _lang_of(group.to_doc)
            if (fl, tl) == (src_lang, tgt_lang):
                src_doc, tgt_doc, swap = group.from_doc, group.to_doc, False
            elif (fl, tl) == (tgt_lang, src_lang):
                src_doc, tgt_doc, swap = group.to_doc, group.from_doc, True
            else:
                raise PrepDocsError(alignment, group.line,
                                    f"linkGrp {group.from_doc} -> {group.to_doc}: languages "
                                    f"{fl}-{tl}; expected {src_lang} and {tgt_lang} (documents "
                                    f"under {src_lang}/ and {tgt_lang}/)")
            stats.add("link groups (document pairs)")
            sdata, sname = source.read(src_doc, where)
            tdata, tname = source.read(tgt_doc, where)
            ssents = read_opus_document(sdata, sname, boundary_tags, stats)
            tsents = read_opus_document(tdata, tname, (), stats)
            if require_boundaries and boundary_tags and ssents and \
                    max(s.segment for s in ssents.values()) == 0:
                raise PrepDocsError(sname, None, f"no <{'>/<'.join(boundary_tags)}> element; "
                                                 "expected the markup that delimits documents")
            key = _doc_key(src_doc)
            n = used_keys.get(key, 0)
            used_keys[key] = n + 1
            if n:
                key = f"{key}~{n}"  # the same source document aligned twice
            parts = key.split("/")
            gkey = "/".join(parts[:group_depth]) if group_depth and len(parts) > 1 else key
            run: List[Tuple[str, str]] = []
            run_no = 0
            prev: Optional[Tuple[OpusSentence, OpusSentence]] = None  # (first, last) src sentence

            def close_run():
                nonlocal run, run_no
                if run:
                    docid = f"{key}.r{run_no:04d}"
                    docs.append((docid, run))
                    groups[docid] = docid if group_depth == 0 else gkey
                    run_no += 1
                run = []

            for link in group.links:
                stats.add("links")
                sids, tids = (link.tgt_ids, link.src_ids) if swap else (link.src_ids, link.tgt_ids)
                for ids, sents, name in ((sids, ssents, sname), (tids, tsents, tname)):
                    for i in ids:
                        if i not in sents:
                            raise PrepDocsError(alignment, link.line,
                                                f"sentence id {i} is not in {name}; expected the "
                                                "ids of the aligned documents")
                reason = None
                if not sids or not tids:
                    reason = "links dropped: an empty side"
                elif one_to_one and (len(sids) > 1 or len(tids) > 1):
                    reason = "links dropped: not 1:1"
                elif min_overlap is not None:
                    if link.overlap is None:
                        raise PrepDocsError(alignment, link.line,
                                            "<link> without an overlap attribute; --min-overlap "
                                            "needs the time-overlap scores of the OpenSubtitles "
                                            "alignments")
                    if link.overlap < min_overlap:
                        reason = f"links dropped: overlap below {min_overlap:g}"
                src_s = [ssents[i] for i in sids]
                if reason is None:
                    order = [s.index for s in src_s]
                    if order != list(range(order[0], order[0] + len(order))):
                        reason = "links dropped: source sentences not contiguous"
                    elif len({s.segment for s in src_s}) > 1:
                        reason = "links dropped: source sentences across a boundary element"
                if reason is None:
                    s_text = " ".join(s.text for s in src_s).strip()
                    t_text = " ".join(tsents[i].text for i in tids).strip()
                    if not s_text or not t_text:
                        reason = "links dropped: empty text"
                if reason is not None:
                    stats.add(reason, where=f"{alignment}:{link.line}")
                    close_run()
                    if prev is not None:
                        stats.add("runs ended by a dropped link")
                    prev = None
                    continue
                first, last = src_s[0], src_s[-1]
                if prev is not None:
                    brk = None
                    if first.index != prev[1].index + 1:
                        brk = "runs ended: source sentences not adjacent"
                    elif first.segment != prev[1].segment:
                        brk = "runs ended: boundary element"
                    elif max_gap is not None:
                        a = prev[1].start if gap_from == "start" else prev[1].end
                        b = first.start
                        if a is None or b is None:
                            brk = "runs ended: time unknown"
                        elif abs(b - a) > max_gap:
                            brk = f"runs ended: time gap above {max_gap:g}s"
                    if brk is not None:
                        stats.add(brk, where=f"{alignment}:{link.line}")
                        close_run()
                run.append((s_text, t_text))
                stats.add("pairs kept")
                prev = (first, last)
            close_run()
    finally:
        source.close()
    stats.add("documents read", len(docs))
    stats.add("sentences read", sum(len(p) for _, p in docs))
    stats.add("sentences with a previous sentence as context",
              sum(len(p) - 1 for _, p in docs))
    return OpusCorpus(docs, groups, stats)


# --------------------------------------------------------------------------
# filtering and splitting


def filter_documents(docs: Sequence[ParallelDoc], min_sentences: int,
                     stats: Optional[CorpusStats] = None) -> List[ParallelDoc]:
    """The documents with at least ``min_sentences`` sentences (Maruf et al.
    2019 keep Europarl documents "longer than 5 sentences": 6)."""
    if min_sentences < 1:
        raise ValueError(f"min_sentences must be >= 1, not {min_sentences}")
    kept = [d for d in docs if len(d[1]) >= min_sentences]
    if stats is not None:
        stats.add(f"documents dropped: fewer than {min_sentences} sentences", len(docs) - len(kept))
        stats.add("sentences dropped with them", sum(len(p) for _, p in docs)
                  - sum(len(p) for _, p in kept))
    return kept


def split_documents(docs: Sequence[ParallelDoc], held_out: Sequence[Tuple[str, int]],
                    seed: int, groups: Optional[Dict[str, str]] = None,
                    stats: Optional[CorpusStats] = None) -> Dict[str, List[ParallelDoc]]:
    """Random held-out splits of whole documents, e.g. ``held_out=[("valid",
    10000), ("test", 10000)]`` (sizes in sentences); everything else is
    ``train``. Groups (default: each document its own) are shuffled with
    ``random.Random(seed)`` (sorted first: the draw depends on the group
    keys and the seed only) and taken one by one: their documents join the
    split in corpus order while the split stays within its size; the first
    document that does not fit closes the split (unless the split is still
    empty: a document longer than the whole split is skipped), and the rest
    of that group is discarded: a group never spans two splits, held-out
    groups never reach ``train``, and a held-out split never exceeds its
    size. Each split keeps corpus order. A split that ends up empty is an
    error (too little data for the sizes asked)."""
    groups = groups or {}
    order: Dict[str, List[int]] = collections.OrderedDict()
    for i, (docid, _) in enumerate(docs):
        order.setdefault(groups.get(docid, docid), []).append(i)
    keys = sorted(order)
    random.Random(seed).shuffle(keys)
    out: Dict[str, List[ParallelDoc]] = {}
    used = set()
    pos = 0
    for name, size in held_out:
        if size < 1:
            raise ValueError(f"{name}: size must be >= 1 sentence, not {size}")
        chosen: List[int] = []
        n = 0
        full = False
        while not full and pos < len(keys):
            key = keys[pos]
            pos += 1
            for i in order[key]:
                used.add(i)
                if full:
                    if stats is not None:
                        stats.add("documents discarded (rest of a held-out group)")
                        stats.add("sentences discarded (rest of a held-out group)", len(docs[i][1]))
                    continue
                if n + len(docs[i][1]) <= size:
                    chosen.append(i)
                    n += len(docs[i][1])
                    full = n == size
                else:
                    full = n > 0  # a document longer than the whole split is skipped
                    if stats is not None:
                        stats.add("documents discarded (rest of a held-out group)")
                        stats.add("sentences discarded (rest of a held-out group)", len(docs[i][1]))
        if not chosen:
            raise PrepDocsError(f"--{name}-sentences", None,
                                f"{size}: no document fits (too little data for the held-out "
                                "sizes); expected more documents or other sizes")
        out[name] = [docs[i] for i in sorted(chosen)]
    train = [d for i, d in enumerate(docs) if i not in used]
    if not train:
        raise PrepDocsError("--seed", None, "no document left for train; expected held-out sizes "
                                            "smaller than the corpus")
    return {"train": train, **out}


def write_splits(splits: Dict[str, List[ParallelDoc]], out_dir: str, src_lang: str,
                 tgt_lang: str) -> List[str]:
    """``out_dir/{split}.{src_lang,tgt_lang,docids}`` for each split: written
    into a temporary directory beside ``out_dir`` and moved into ``out_dir``
    only when every split is complete. Returns the paths written."""
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out_dir))}.", dir=parent)
    written = []
    try:
        for name, docs in splits.items():
            for path in write_documents(docs, os.path.join(tmp, name), src_lang, tgt_lang):
                written.append(os.path.basename(path))
        os.makedirs(out_dir, exist_ok=True)
        for base in written:
            os.replace(os.path.join(tmp, base), os.path.join(out_dir, base))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [os.path.join(out_dir, b) for b in written]


# --------------------------------------------------------------------------
# The recipes' Moses tokenization, and fairseq-generate output of tokenized
# data -> detokenized D- lines

#: XML entities kept as single tokens (Moses' protected patterns)
MOSES_PROTECTED_ENTITIES = r"&(?:amp|lt|gt|quot|apos|#[0-9]+|#[xX][0-9a-fA-F]+);"


@functools.lru_cache(maxsize=None)
def _moses_tokenizer(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang)


def moses_tokenize(text: str, lang: str, aggressive_dash_splits: bool = False) -> str:
    """The recipes' tokenization (``moses_tok`` in ``recipes/lib/recipe.sh``):
    sacremoses without XML escaping (as fairseq's prepare scripts run Moses
    with ``-no-escape``), XML entities already in the text kept whole
    (:data:`MOSES_PROTECTED_ENTITIES`), so that :func:`moses_detokenize` gives
    them back; aggressive dash splits only when asked (Moses ``-a``).
    ``ctx-score-contrastive``/``ctx-probe --tokenizer moses
    --moses-protect-entities`` apply the same to raw test text."""
    return _moses_tokenizer(lang).tokenize(
        text, return_str=True, escape=False, aggressive_dash_splits=aggressive_dash_splits,
        protected_patterns=[MOSES_PROTECTED_ENTITIES])


@functools.lru_cache(maxsize=None)
def _moses_detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang)


@functools.lru_cache(maxsize=None)
def _moses_detruecaser():
    from sacremoses import MosesDetruecaser

    return MosesDetruecaser()


def moses_detruecase(text: str) -> str:
    """sacremoses' ``MosesDetruecaser``: the first word of the sentence (and
    of a title) capitalised."""
    return _moses_detruecaser().detruecase(text, return_str=True)


def moses_detokenize(text: str, lang: str, detruecase: bool = False) -> str:
    """Detokenize one line of Moses-tokenized text in ``lang`` (sacremoses'
    ``MosesDetokenizer``), detruecased first with ``detruecase``.

    The recipes tokenize without XML escaping (``moses_tok`` in
    ``recipes/lib/recipe.sh``: sacremoses ``escape=False``, XML entities in the
    text kept as single tokens), so nothing is unescaped here either: an
    ``&amp;`` or ``&lt;`` in a hypothesis is text, as it was in the corpus
    (sacremoses' default, ``unescape=True``, would turn it into ``&`` / ``<``).
    The sacremoses objects are made once per language."""
    if detruecase:
        text = moses_detruecase(text)
    return _moses_detokenizer(lang).detokenize(text.split(), unescape=False)


def postprocess_generate(gen_in: str, gen_out: str, lang: str, detruecase: bool = False,
                         detokenize: bool = True) -> int:
    """Copy ``fairseq-generate`` output, replacing its ``D-`` lines by the
    ``H-`` hypotheses (BPE already removed by ``--remove-bpe``) detruecased
    (sacremoses' ``MosesDetruecaser``: the first word of each sentence
    capitalised) and/or detokenized (:func:`moses_detokenize`, without
    unescaping: the recipes tokenize without escaping, so ``&amp;`` is text), for
    sacreBLEU against the original references (``ctx-doc-bleu --refs``).
    Returns the number of hypotheses. A hypothesis with BPE markers left is
    an error (run fairseq-generate with ``--remove-bpe``)."""
    lines = _read_lines(gen_in)
    out: List[str] = []
    n = 0
    for no, line in enumerate(lines, 1):
        if line.startswith("D-"):
            continue
        out.append(line)
        if line.startswith("H-"):
            parts = line.split("\t")
            if len(parts) < 3:
                raise PrepDocsError(gen_in, no, "H- line without id, score and text "
                                                "(tab-separated); expected fairseq-generate output")
            text = parts[2]
            if "@@ " in text + " " or "\u2581" in text:
                raise PrepDocsError(gen_in, no, "hypothesis still holds BPE markers; expected "
                                                "fairseq-generate --remove-bpe output")
            if detokenize:
                text = moses_detokenize(text, lang, detruecase=detruecase)
            elif detruecase:
                text = moses_detruecase(text)
            out.append("\t".join(["D-" + parts[0][2:], parts[1], text]))
            n += 1
    if not n:
        raise PrepDocsError(gen_in, None, "no H- lines; expected fairseq-generate output")
    tmp = gen_out + ".part"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(out) + "\n")
    os.replace(tmp, gen_out)
    return n


# --------------------------------------------------------------------------
# Voita et al. (2019) contrastive suites in a model's BPE units


def bpe_voita_suite(in_path: str, out_path: str, src_codes: str, tgt_codes: str) -> int:
    """Copy a Voita et al. (2019) consistency test set (a JSON array whose
    records hold ``src`` and the candidates ``dst``, sentences joined by
    `` _eos ``) with subword-nmt BPE applied to every sentence: ``src_codes``
    to ``src``, ``tgt_codes`` to each candidate (models with one BPE model per
    language, which ``ctx-score-contrastive --bpe`` cannot apply: it takes one
    codes file); ``_eos`` stays whole. Other fields are copied. The output
    keeps the input's file name rules (``ctx-score-contrastive`` names the
    category after the file). Returns the number of records."""
    from subword_nmt.apply_bpe import BPE

    try:
        with open(in_path, encoding="utf-8-sig") as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise PrepDocsError(in_path, err.lineno, f"not JSON ({err.msg}); expected the suite's "
                                                 "JSON array") from None
    except OSError as err:
        raise PrepDocsError(in_path, None, f"cannot read: {err.strerror or err}") from None
    if not isinstance(data, list) or not data:
        raise PrepDocsError(in_path, None, "expected a non-empty JSON array of records")
    bpes = {}
    for side, codes in (("src", src_codes), ("tgt", tgt_codes)):
        try:
            with open(codes, encoding="utf-8") as f:
                bpes[side] = BPE(f, glossaries=["_eos"])
        except OSError as err:
            raise PrepDocsError(codes, None, f"cannot read: {err.strerror or err}") from None

    def apply(side: str, text) -> str:
        if not isinstance(text, str):
            raise PrepDocsError(in_path, None, f"record {i}: expected text, got {text!r}")
        parts = [" ".join(p.split()) for p in f" {text} ".split(" _eos ")]
        return " _eos ".join(bpes[side].process_line(p) for p in parts)

    out = []
    for i, rec in enumerate(data):
        if not isinstance(rec, dict) or "src" not in rec or not isinstance(rec.get("dst"), list):
            raise PrepDocsError(in_path, None, f"record {i}: expected an object with 'src' and a "
                                               "'dst' list")
        rec = dict(rec)
        rec["src"] = apply("src", rec["src"])
        rec["dst"] = [apply("tgt", d) for d in rec["dst"]]
        out.append(rec)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".part"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    os.replace(tmp, out_path)
    return len(out)


# --------------------------------------------------------------------------
# command line


def get_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--src-lang", required=True, metavar="L1")
    common.add_argument("--tgt-lang", required=True, metavar="L2")
    out = common.add_argument_group("output (one of --out-prefix, --out-dir)")
    out.add_argument("--out-prefix", metavar="PREFIX", help="all documents to PREFIX.{L1,L2,docids}")
    out.add_argument("--out-dir", metavar="DIR",
                     help="random held-out splits: DIR/{train,valid,test}.{L1,L2,docids} "
                     "(needs --valid-sentences and --test-sentences)")
    out.add_argument("--valid-sentences", type=int, metavar="N")
    out.add_argument("--test-sentences", type=int, metavar="N")
    out.add_argument("--seed", type=int, default=1, help="split seed (default 1)")
    common.add_argument("--min-doc-sentences", type=int, default=1, metavar="N",
                        help="drop documents with fewer sentences (default 1: keep all; Maruf et "
                        "al. 2019 keep Europarl documents longer than 5 sentences: 6)")
    common.add_argument("--summary", metavar="FILE.json",
                        help="also write the counts (kept, dropped and why) as JSON")

    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    d = sub.add_parser("doc-delimited", parents=[common],
                       help="one sentence per line, a '<d>' line before each document")
    d.add_argument("--src", required=True, metavar="FILE")
    d.add_argument("--tgt", required=True, metavar="FILE")
    d.add_argument("--marker", default="<d>", help="document marker line (default <d>)")
    d.add_argument("--doc-prefix", default="doc")
    a = sub.add_parser("aligned-sessions", parents=[common],
                       help="line-aligned files with markup lines (Europarl source release "
                       "after its sentence aligner)")
    a.add_argument("--src-dir", required=True, metavar="DIR")
    a.add_argument("--tgt-dir", required=True, metavar="DIR")
    a.add_argument("--unit", choices=["speaker", "file"], default="speaker",
                   help="a document is a speaker turn (default) or a file")
    o = sub.add_parser("opus", parents=[common],
                       help="OPUS XCES alignment + OPUS documents (directories or zip files)")
    o.add_argument("--alignment", required=True, metavar="FILE", help="e.g. en-ru.xml.gz")
    o.add_argument("--docs", required=True, action="append", metavar="DIR_OR_ZIP",
                   help="where the documents are (repeat: en.zip, ru.zip, a directory)")
    o.add_argument("--min-overlap", type=float, metavar="R",
                   help="keep links whose overlap attribute is at least R (Voita et al.: 0.9)")
    o.add_argument("--max-gap", type=float, metavar="SECONDS",
                   help="end a document where two sentences' times differ by more (Voita et al.: 7)")
    o.add_argument("--gap-from", choices=["start", "end"], default="start",
                   help="time of the previous sentence: its start (default) or its end")
    o.add_argument("--all-links", action="store_true",
                   help="keep m:n links (sentences joined), not only 1:1")
    o.add_argument("--boundary-tag", action="append", default=[], metavar="NAME",
                   help="an element that starts a new document (Europarl: SPEAKER, CHAPTER)")
    o.add_argument("--group-depth", type=int, default=-1,
                   help="splits keep groups whole: the document path without its last N parts "
                   "(default -1: the OpenSubtitles movie; 0: each document)")
    v = sub.add_parser("bpe-voita-suite",
                       help="a Voita et al. (2019) test set with BPE applied per side")
    v.add_argument("suite", nargs="+", metavar="IN.json")
    v.add_argument("--out-dir", required=True, metavar="DIR",
                   help="writes DIR/NAME.json for each IN/NAME.json")
    v.add_argument("--src-codes", required=True)
    v.add_argument("--tgt-codes", required=True)
    g = sub.add_parser("postprocess-generate",
                       help="fairseq-generate output: D- lines detruecased/detokenized from H-")
    g.add_argument("gen", metavar="GEN")
    g.add_argument("--out", required=True, metavar="FILE")
    g.add_argument("--lang", required=True)
    g.add_argument("--detruecase", action="store_true")
    g.add_argument("--no-detokenize", action="store_true")
    return p


def _run(args) -> List[str]:
    if args.mode == "bpe-voita-suite":
        out = []
        for path in args.suite:
            dest = os.path.join(args.out_dir, os.path.basename(path))
            if os.path.abspath(dest) == os.path.abspath(path):
                raise PrepDocsError(dest, None, "would overwrite its input; expected another "
                                                "--out-dir")
            n = bpe_voita_suite(path, dest, args.src_codes, args.tgt_codes)
            out.append(f"{PROG}: {n} records -> {dest}")
        return out
    if args.mode == "postprocess-generate":
        n = postprocess_generate(args.gen, args.out, args.lang, detruecase=args.detruecase,
                                 detokenize=not args.no_detokenize)
        return [f"{PROG}: {n} hypotheses -> {args.out}"]
    if (args.out_prefix is None) == (args.out_dir is None):
        raise PrepDocsError("--out-prefix/--out-dir", None, "expected exactly one of them")
    if args.out_dir is not None and (args.valid_sentences is None or args.test_sentences is None):
        raise PrepDocsError("--out-dir", None, "needs --valid-sentences N and --test-sentences N")
    if args.src_lang == args.tgt_lang:
        raise PrepDocsError("--tgt-lang", None, f"same as --src-lang ({args.src_lang})")
    groups: Dict[str, str] = {}
    if args.mode == "doc-delimited":
        docs, stats = load_doc_delimited(args.src, args.tgt, args.marker, args.doc_prefix)
    elif args.mode == "aligned-sessions":
        docs, stats = load_aligned_sessions(args.src_dir, args.tgt_dir, args.unit)
    else:
        corpus = load_opus(args.alignment, args.docs, args.src_lang, args.tgt_lang,
                           min_overlap=args.min_overlap, max_gap=args.max_gap,
                           gap_from=args.gap_from, one_to_one=not args.all_links,
                           boundary_tags=args.boundary_tag,
                           require_boundaries=bool(args.boundary_tag),
                           group_depth=args.group_depth)
        docs, stats, groups = corpus.docs, corpus.stats, corpus.groups
    if not docs:
        raise PrepDocsError(getattr(args, "src", None) or getattr(args, "src_dir", None)
                            or args.alignment, None, "no document was kept; expected parallel "
                            "documents (see the counts above)")
    if args.min_doc_sentences > 1:
        docs = filter_documents(docs, args.min_doc_sentences, stats)
        if not docs:
            raise PrepDocsError("--min-doc-sentences", None,
                                f"no document has {args.min_doc_sentences} sentences")
    if args.out_dir is not None:
        splits = split_documents(docs, [("valid", args.valid_sentences),
                                        ("test", args.test_sentences)], args.seed, groups, stats)
        write_splits(splits, args.out_dir, args.src_lang, args.tgt_lang)
        target = f"{args.out_dir}/{{train,valid,test}}.{{{args.src_lang},{args.tgt_lang},docids}}"
    else:
        splits = {"all": docs}
        write_documents(docs, args.out_prefix, args.src_lang, args.tgt_lang)
        target = f"{args.out_prefix}.{{{args.src_lang},{args.tgt_lang},docids}}"
    sizes = {k: {"documents": len(v), "sentences": sum(len(p) for _, p in v)}
             for k, v in splits.items()}
    if args.summary:
        tmp = args.summary + ".part"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"mode": args.mode, "splits": sizes, **stats.to_dict()}, f, indent=1)
            f.write("\n")
        os.replace(tmp, args.summary)
    out = [f"{PROG}: " + ", ".join(f"{k} {v['documents']} documents / {v['sentences']} sentences"
                                   for k, v in sizes.items()) + f" -> {target}"]
    return out + stats.lines()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = get_parser().parse_args(argv)
    try:
        lines = _run(args)
    except PrepDocsError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


def cli_main(argv: Optional[Sequence[str]] = None) -> None:
    """Console script ``ctx-prep-corpora``: exits with status 2 on an input error."""
    rc = main(argv)
    if rc:
        sys.exit(rc)


if __name__ == "__main__":
    cli_main()
