"""OPUS corpora for ``ctx-prep-corpora``: XCES sentence alignments
(:func:`read_opus_alignment`), the documents they link
(:func:`read_opus_document`, in zip archives or directories), and the
parallel documents recovered from both (:func:`load_opus`)."""

import gzip
import math
import os
import re
import zipfile
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple
from xml.parsers import expat

from ctx_fairseq.prep.common import CorpusStats, collapse_whitespace
from ctx_fairseq.prep.common import ParallelDoc
from ctx_fairseq.data.docids import DocFileError as PrepDocsError


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
                word = collapse_whitespace("".join(st["w_buf"]))
                if word:
                    st["words"].append(word)
                    token_seen()
        elif tag == "s" and st["cur"] is not None:
            cur = st["cur"]
            text = " ".join(st["words"]) if st["words"] else collapse_whitespace("".join(st["text"]))
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


def _kept_link(link, swap: bool, src, tgt, alignment: str, one_to_one: bool,
               min_overlap: Optional[float]):
    """``(reason, source sentences, source text, target text)`` of one link:
    ``reason`` None when it is kept, else why it is dropped (a count of the
    summary). ``src``/``tgt``: ``(sentences by id, document name)``; a link
    naming a sentence its document does not have is an error."""
    (ssents, sname), (tsents, tname) = src, tgt
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
    s_text = t_text = ""
    if reason is None:
        s_text = " ".join(s.text for s in src_s).strip()
        t_text = " ".join(tsents[i].text for i in tids).strip()
        if not s_text or not t_text:
            reason = "links dropped: empty text"
    return reason, src_s, s_text, t_text


def _run_break(last, first, max_gap: Optional[float], gap_from: str) -> Optional[str]:
    """Why a kept link whose first source sentence is ``first`` does not
    continue the run whose last source sentence is ``last`` (None: it does)."""
    if first.index != last.index + 1:
        return "runs ended: source sentences not adjacent"
    if first.segment != last.segment:
        return "runs ended: boundary element"
    if max_gap is not None:
        a = last.start if gap_from == "start" else last.end
        b = first.start
        if a is None or b is None:
            return "runs ended: time unknown"
        if abs(b - a) > max_gap:
            return f"runs ended: time gap above {max_gap:g}s"
    return None


def _doc_and_group_keys(src_doc: str, used_keys: Dict[str, int], group_depth: int):
    """``(document key, group key)`` of a source document (``used_keys``
    counts the keys given so far: the same source document aligned twice gets
    ``~N``)."""
    key = _doc_key(src_doc)
    n = used_keys.get(key, 0)
    used_keys[key] = n + 1
    if n:
        key = f"{key}~{n}"  # the same source document aligned twice
    parts = key.split("/")
    return key, ("/".join(parts[:group_depth]) if group_depth and len(parts) > 1 else key)


@dataclass(frozen=True)
class OpusOptions:
    """How :func:`load_opus` keeps links and cuts documents (``ctx-prep-corpora
    opus``'s options): a link is kept when both sides are non-empty, it is 1:1
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
    min_overlap: Optional[float] = None
    max_gap: Optional[float] = None
    gap_from: str = "start"
    one_to_one: bool = True
    boundary_tags: Sequence[str] = ()
    require_boundaries: bool = False
    group_depth: int = -1


def _group_sides(group: OpusLinkGroup, src_lang: str, tgt_lang: str, alignment: str):
    """``(source document, target document, swapped)`` of a link group: the
    source is the document under ``src_lang/`` (``fromDoc`` or ``toDoc``;
    OPUS orders the pair alphabetically)."""
    fl, tl = _lang_of(group.from_doc), _lang_of(group.to_doc)
    if (fl, tl) == (src_lang, tgt_lang):
        return group.from_doc, group.to_doc, False
    if (fl, tl) == (tgt_lang, src_lang):
        return group.to_doc, group.from_doc, True
    raise PrepDocsError(alignment, group.line,
                        f"linkGrp {group.from_doc} -> {group.to_doc}: languages "
                        f"{fl}-{tl}; expected {src_lang} and {tgt_lang} (documents "
                        f"under {src_lang}/ and {tgt_lang}/)")


def load_opus(alignment: str, roots: Sequence[str], src_lang: str, tgt_lang: str,
              options: OpusOptions = OpusOptions()) -> OpusCorpus:
    """Aligned documents of an OPUS alignment and its documents (see the
    module docstring), the links kept and the documents cut as ``options``
    says (:class:`OpusOptions`). The source side is the one whose documents
    sit under ``src_lang/`` (``fromDoc`` or ``toDoc``; OPUS orders the pair
    alphabetically)."""
    min_overlap, max_gap, gap_from = options.min_overlap, options.max_gap, options.gap_from
    boundary_tags, group_depth = options.boundary_tags, options.group_depth
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
            src_doc, tgt_doc, swap = _group_sides(group, src_lang, tgt_lang, alignment)
            stats.add("link groups (document pairs)")
            sdata, sname = source.read(src_doc, where)
            tdata, tname = source.read(tgt_doc, where)
            ssents = read_opus_document(sdata, sname, boundary_tags, stats)
            tsents = read_opus_document(tdata, tname, (), stats)
            if options.require_boundaries and boundary_tags and ssents and \
                    max(s.segment for s in ssents.values()) == 0:
                raise PrepDocsError(sname, None, f"no <{'>/<'.join(boundary_tags)}> element; "
                                                 "expected the markup that delimits documents")
            key, gkey = _doc_and_group_keys(src_doc, used_keys, group_depth)
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
                reason, src_s, s_text, t_text = _kept_link(
                    link, swap, (ssents, sname), (tsents, tname), alignment,
                    options.one_to_one, min_overlap)
                if reason is not None:
                    stats.add(reason, where=f"{alignment}:{link.line}")
                    close_run()
                    if prev is not None:
                        stats.add("runs ended by a dropped link")
                    prev = None
                    continue
                first, last = src_s[0], src_s[-1]
                if prev is not None:
                    brk = _run_break(prev[1], first, max_gap, gap_from)
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


