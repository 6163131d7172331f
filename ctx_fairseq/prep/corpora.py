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
import os
import random
import re
import shutil
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

from ctx_fairseq.prep.common import CorpusStats, collapse_whitespace
from ctx_fairseq.prep.docs import write_documents
from ctx_fairseq.prep.common import ParallelDoc, decode_text_lines
from ctx_fairseq.data.docids import DocFileError as PrepDocsError
from ctx_fairseq.prep.opus import (
    OpusCorpus, OpusOptions, load_opus, read_opus_alignment, read_opus_document)

PROG = "ctx-prep-corpora"

__all__ = [
    "PrepDocsError", "CorpusStats", "OpusCorpus", "load_doc_delimited",
    "load_aligned_sessions", "read_opus_alignment", "read_opus_document", "load_opus",
    "filter_documents", "split_documents", "write_splits", "moses_detokenize",
    "moses_detruecase", "postprocess_generate", "bpe_voita_suite", "cli_main",
]

_WHITESPACE = re.compile(r"\s+")
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


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
            docs[-1][1].append((no, collapse_whitespace(line)))
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


def _aligned_file_names(src_dir: str, tgt_dir: str) -> List[str]:
    """The file names of two directories of line-aligned files, the same in
    both (an error naming the directory otherwise)."""
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
    return names


def _check_markup_pair(stag, ttag, lines, paths, no: int) -> None:
    """Line ``no`` is markup in both files (the same tag) or text in both."""
    (s, t), (sp, tp) = lines, paths
    if (stag is None) != (ttag is None):
        markup, other = (sp, tp) if stag is not None else (tp, sp)
        raise PrepDocsError(markup, no, f"markup line {(s if stag else t).strip()!r}, but "
                                        f"line {no} of {other} is text; expected markup "
                                        "on the same lines in both files")
    if stag is not None and stag[:2] != ttag[:2]:
        (name_s, closing_s), (name_t, closing_t) = stag[:2], ttag[:2]
        raise PrepDocsError(sp, no, f"<{'/' if closing_s else ''}{name_s}> here but "
                                    f"<{'/' if closing_t else ''}{name_t}> on line "
                                    f"{no} of {tp}; expected the same markup")


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
    names = _aligned_file_names(src_dir, tgt_dir)
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
            _check_markup_pair(stag, ttag, (s, t), (sp, tp), no)
            if stag is not None:
                name_s, closing_s, attrs_s = stag
                attrs_t = ttag[2]
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
            s, t = collapse_whitespace(s), collapse_whitespace(t)
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
                           OpusOptions(min_overlap=args.min_overlap, max_gap=args.max_gap,
                                       gap_from=args.gap_from, one_to_one=not args.all_links,
                                       boundary_tags=args.boundary_tag,
                                       require_boundaries=bool(args.boundary_tag),
                                       group_depth=args.group_depth))
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
