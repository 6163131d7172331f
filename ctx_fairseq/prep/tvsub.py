"""TVsub zh-en (Wang et al. 2018) as documents, and its multi-reference BLEU.

The corpus (github.com/longyuewangdcu/tvsub; recipe ``recipes/tvsub_zh_en``)
is read in the repository's own layout, from a clone or an extracted copy:

* training: ``data/orignal/train/separated/N.np.tk.qb.es.zh`` (Chinese,
  word-segmented) and ``N.qb.np.tk.lc.en`` (English, lowercased,
  Moses-tokenized, XML entities escaped: ``&apos;``, ``&quot;``, ``@-@``),
  one file pair per TV episode ``N`` (0, 1, 2, ...); the raw ``N.zh``/``N.en``
  are checked for the same number of lines where present. Each episode is one
  document, id ``ep-N``, its lines in episode order.
* dev/test: ``data/processed/{dev,test}/{dev,test}_src`` (segmented Chinese,
  one sentence a line) and ``{dev,test}_trg.sgm``: an SGML refset of
  ``<DOC docid="SUB01" sysid="...">`` blocks of ``<seg id=N> text</seg>``
  (ids 1..n within each block). Every ``sysid`` is one reference; a
  reference's blocks, in file order, give the documents (``SUB01``,
  ``SUB02``) and their sentences in source order. Document ids get the split's
  name (``dev-SUB01``, ``test-SUB01``): dev and test both use ``SUB01``.

Tokenization: as published, nothing is re-tokenized. The references are the
training English's units (checked on the dev set: the same ``&apos;``/
``&quot;``/``@-@`` escaping and ``n &apos;t`` splits, no raw ``'`` or ``"``,
lowercased; see the recipe's README), so the SGML text is taken **as it is**
(entities not unescaped, unlike ``ctx-prep-docs sgml``), only stripped of the
space after ``<seg id=N>``; a reference holding an unescaped ``'``, ``"`` or
``&`` (not an entity) or an upper-case letter is reported (counted, not
changed) by :func:`check_units`.

Validation (every problem a :class:`TvsubError` naming the file and the
counts; nothing is written before everything is read and checked): an
episode whose files differ in line count, an episode file without its pair,
a gap in the episode numbers, a refset with a missing, repeated or
non-numeric seg id, a ``<seg>`` outside a ``<DOC>``, references (sysids)
with other documents or other numbers of sentences than the first, a source
whose line count differs from its references', and a source without its
references (or references without their source).

Output (:func:`prepare`): ``OUT/{train,valid,test}.{zh,en,docids}`` (the
``document_translation`` task's input: ``en`` is the first reference on
valid/test), ``OUT/{valid,test}.ref{K}.en`` (every reference K = 0, 1, ...,
line-aligned), ``OUT/{valid,test}.dp.zh`` (the corpus's +DP source, the
dropped pronouns restored, ``{split}_oracle_dp_src``, line-aligned, where the
input has it) and ``OUT/prep.json`` (what was read: episodes, lines,
references and sysids, which split the test files come from). ``test`` is
the corpus's test set when the input has one, else dev's episodes after the
first, the first being valid (:func:`prepare`: the checkpoint is never
chosen on the sentences it is reported on; said in ``prep.json`` and
printed: ``eval_split``). Everything is written into ``OUT.part`` and
renamed to ``OUT`` when complete.

Scoring (:func:`score`): BLEU as published on TVsub, i.e. multi-reference
BLEU of the tokenized, lowercased hypotheses (fairseq-generate's ``H-``
lines after ``--remove-bpe``) against every reference, sacreBLEU
``--tokenize none`` (multi-bleu.perl's computation) with its signature
(``nrefs:K``); beside it BLEU against the first reference only, and the
document-level BLEU of both (each document's sentences joined into one
segment, per reference; Liu et al. 2020's d-BLEU). ``ctx-doc-bleu`` gives the
single-reference document-level score on the same output too (the recipe
runs both).

Command line::

    python -m ctx_fairseq.prep.tvsub prep --raw TVSUB --out docs [--episodes 0:300]
    python -m ctx_fairseq.prep.tvsub score gen.txt --refs docs/test.ref --docids docs/test.docids --out-dir res
"""

import argparse
import json
import os
import re
import shutil
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ctx_fairseq.errors import InputError

__all__ = ["TvsubError", "Refset", "read_lines", "list_episodes", "read_episodes",
           "parse_refset", "read_eval_split", "check_units", "prepare", "eval_split_note", "score",
           "main", "EVAL_SPLITS"]

TRAIN_DIR = os.path.join("data", "orignal", "train", "separated")
PROCESSED_DIR = os.path.join("data", "processed")
ZH_SUFFIX = ".np.tk.qb.es.zh"
EN_SUFFIX = ".qb.np.tk.lc.en"
RAW_SUFFIXES = (".zh", ".en")
SRC, TGT = "zh", "en"


class TvsubError(ValueError):
    """A problem with the TVsub input; the message names the file and the counts."""


def read_lines(path: str) -> List[str]:
    """The lines of a UTF-8 text file without their line ends (a last line
    without a newline counts; ``\\r`` before the newline is removed)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise TvsubError(f"{path}: cannot read ({err.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise TvsubError(f"{path}:{line}: not UTF-8 ({err.reason})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [x[:-1] if x.endswith("\r") else x for x in lines]


# ----------------------------------------------------------------------------- training

def list_episodes(root: str) -> List[int]:
    """The episode numbers N with a ``N.np.tk.qb.es.zh`` or ``N.qb.np.tk.lc.en``
    file under ROOT/data/orignal/train/separated, sorted; an episode with one of
    the two only, or no episode at all, is an error."""
    d = os.path.join(root, TRAIN_DIR)
    if not os.path.isdir(d):
        raise TvsubError(f"{d}: no such directory (expected a clone of "
                         "github.com/longyuewangdcu/tvsub or its extracted copy)")
    zh, en = set(), set()
    for name in os.listdir(d):
        for suffix, found in ((ZH_SUFFIX, zh), (EN_SUFFIX, en)):
            if name.endswith(suffix) and name[:-len(suffix)].isdigit():
                found.add(int(name[:-len(suffix)]))
    for have, lack, suffix in ((zh, en, EN_SUFFIX), (en, zh, ZH_SUFFIX)):
        missing = sorted(have - lack)
        if missing:
            raise TvsubError(f"{d}: {len(missing)} episode(s) without {suffix} "
                             f"(first: {missing[0]}{suffix}); expected both "
                             f"{ZH_SUFFIX} and {EN_SUFFIX} for every episode")
    if not zh:
        raise TvsubError(f"{d}: no episode files (N{ZH_SUFFIX}, N{EN_SUFFIX})")
    return sorted(zh)


def read_episodes(root: str, first: int = 0, count: Optional[int] = None
                  ) -> List[Tuple[str, List[Tuple[str, str]]]]:
    """Episodes ``first``, ``first + 1``, ... (``count`` of them; None: all
    from ``first``) as documents ``("ep-N", [(zh, en), ...])``. The episode
    numbers must be contiguous from ``first`` (a gap is an error: episode order
    is document order); an episode's files (tokenized pair, and the raw
    ``N.zh``/``N.en`` where present) must have the same number of lines."""
    numbers = list_episodes(root)
    d = os.path.join(root, TRAIN_DIR)
    wanted = [n for n in numbers if n >= first]
    if count is not None:
        if count <= 0:
            raise TvsubError(f"--episodes: {count} episodes asked for; expected at least one")
        wanted = wanted[:count]
        if len(wanted) < count:
            raise TvsubError(f"{d}: {len(wanted)} episodes from {first} on; {count} asked for")
    if not wanted:
        raise TvsubError(f"{d}: no episode numbered {first} or more")
    expected = list(range(wanted[0], wanted[0] + len(wanted)))
    if wanted != expected or wanted[0] != first:
        gap = next((e for e, w in zip(expected, wanted) if e != w), wanted[0])
        raise TvsubError(f"{d}: episode {gap if wanted[0] == first else first} is missing "
                         f"(episodes {wanted[0]}..{wanted[-1]}: {len(wanted)} files); "
                         "expected contiguous episode numbers")
    docs = []
    for n in wanted:
        zh_path = os.path.join(d, f"{n}{ZH_SUFFIX}")
        en_path = os.path.join(d, f"{n}{EN_SUFFIX}")
        zh, en = read_lines(zh_path), read_lines(en_path)
        counts = [(zh_path, len(zh)), (en_path, len(en))]
        for suffix in RAW_SUFFIXES:
            raw = os.path.join(d, f"{n}{suffix}")
            if os.path.exists(raw):
                counts.append((raw, len(read_lines(raw))))
        if len({c for _, c in counts}) != 1:
            raise TvsubError(f"episode {n}: its files differ in line count: "
                             + ", ".join(f"{p} has {c}" for p, c in counts)
                             + "; expected one sentence per line in each")
        if not zh:
            raise TvsubError(f"episode {n}: {zh_path} is empty")
        docs.append((f"ep-{n}", list(zip(zh, en))))
    return docs


# ----------------------------------------------------------------------------- refsets

class Refset(NamedTuple):
    """An SGML refset: ``docs`` the document ids in order, ``lengths`` their
    sentence counts, ``sysids`` the references in order of first appearance,
    ``refs[k][i]`` sentence i (corpus order) of reference k."""
    docs: List[str]
    lengths: List[int]
    sysids: List[str]
    refs: List[List[str]]


_TAG = re.compile(r"<(/?)([A-Za-z]+)([^>]*)>")
_ATTR = re.compile(r"""([A-Za-z_]+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""")


def _attrs(text: str) -> Dict[str, str]:
    return {m.group(1).lower(): next(g for g in m.groups()[1:] if g is not None)
            for m in _ATTR.finditer(text)}


def parse_refset(path: str) -> Refset:
    """Read an SGML refset (see the module docstring). Each ``<seg>`` is on one
    line (as in the corpus); its text is kept as it is, without the spaces
    around it. Missing, repeated, non-numeric or out-of-order seg ids, a seg
    outside a DOC, a DOC without segs, and references that differ in their
    documents or sentence counts are errors naming the file, the document, the
    reference and the counts."""
    blocks: List[Tuple[str, str, int, List[Tuple[int, str]]]] = []  # docid, sysid, line, segs
    current = None
    for lineno, line in enumerate(read_lines(path), 1):
        for m in _TAG.finditer(line):
            closing, tag = m.group(1) == "/", m.group(2).lower()
            if tag == "doc" and not closing:
                if current is not None:
                    raise TvsubError(f"{path}:{lineno}: <DOC> inside the DOC opened at line "
                                     f"{current[2]}; expected </DOC> first")
                a = _attrs(m.group(3))
                if "docid" not in a:
                    raise TvsubError(f"{path}:{lineno}: <DOC> without docid")
                current = (a["docid"], a.get("sysid", ""), lineno, [])
            elif tag == "doc":
                if current is None:
                    raise TvsubError(f"{path}:{lineno}: </DOC> without <DOC>")
                blocks.append(current)
                current = None
            elif tag == "seg" and not closing:
                if current is None:
                    raise TvsubError(f"{path}:{lineno}: <seg> outside a <DOC>")
                a = _attrs(m.group(3))
                sid = a.get("id", "")
                if not sid.isdigit():
                    raise TvsubError(f"{path}:{lineno}: seg id '{sid}' is not a number")
                end = line.find("</seg>", m.end())
                if end < 0:
                    raise TvsubError(f"{path}:{lineno}: <seg id={sid}> without </seg> on its line")
                current[3].append((int(sid), line[m.end():end].strip()))
    if current is not None:
        raise TvsubError(f"{path}:{current[2]}: DOC {current[0]} is not closed (no </DOC>)")
    if not blocks:
        raise TvsubError(f"{path}: no <DOC> with segments; expected an SGML refset")
    by_ref: Dict[str, List[Tuple[str, List[str]]]] = {}
    for docid, sysid, lineno, segs in blocks:
        where = f"{path}:{lineno}: DOC {docid} (sysid {sysid or '-'})"
        if not segs:
            raise TvsubError(f"{where}: no <seg>")
        ids = [s for s, _ in segs]
        seen, repeated = set(), []
        for s in ids:
            if s in seen:
                repeated.append(s)
            seen.add(s)
        if repeated:
            raise TvsubError(f"{where}: seg id {repeated[0]} repeated ({len(ids)} segs, "
                             f"{len(seen)} distinct ids); expected ids 1..{len(ids)} once each")
        missing = sorted(set(range(1, max(ids) + 1)) - seen)
        if missing or min(ids) < 1:
            raise TvsubError(f"{where}: seg id {missing[0] if missing else min(ids)} missing "
                             f"({len(ids)} segs, ids {min(ids)}..{max(ids)}); expected ids "
                             f"1..{len(ids)}")
        if ids != sorted(ids):
            raise TvsubError(f"{where}: seg ids out of order (seg {ids[next(i for i in range(1, len(ids)) if ids[i] < ids[i - 1])]}); "
                             "expected 1..n in order")
        docs = by_ref.setdefault(sysid, [])
        if any(d == docid for d, _ in docs):
            raise TvsubError(f"{where}: a second DOC {docid} of the same reference")
        docs.append((docid, [t for _, t in segs]))
    sysids = list(by_ref)
    first = by_ref[sysids[0]]
    docs_order = [d for d, _ in first]
    lengths = [len(s) for _, s in first]
    for sysid in sysids[1:]:
        other = by_ref[sysid]
        if [d for d, _ in other] != docs_order:
            raise TvsubError(f"{path}: reference {sysid} has documents "
                             f"{', '.join(d for d, _ in other)}, reference {sysids[0]} has "
                             f"{', '.join(docs_order)}; expected the same documents in the same order")
        for (docid, segs), n in zip(other, lengths):
            if len(segs) != n:
                raise TvsubError(f"{path}: DOC {docid}: reference {sysid} has {len(segs)} "
                                 f"sentences, reference {sysids[0]} has {n}; expected references "
                                 "of the same length")
    refs = [[t for _, segs in by_ref[s] for t in segs] for s in sysids]
    return Refset(docs_order, lengths, sysids, refs)


def check_units(lines: Sequence[str]) -> Dict[str, int]:
    """How many lines break the training English's conventions: a raw quote
    or apostrophe (the corpus escapes them), a bare ``&`` (not an entity), an
    upper-case letter (the corpus is lowercased)."""
    bare_amp = re.compile(r"&(?![a-zA-Z]+;|#[0-9]+;|#x[0-9a-fA-F]+;)")
    return {
        "raw_quote_or_apostrophe": sum(1 for x in lines if "'" in x or '"' in x),
        "bare_ampersand": sum(1 for x in lines if bare_amp.search(x)),
        "upper_case": sum(1 for x in lines if any(c.isupper() for c in x if c.isascii())),
        "empty": sum(1 for x in lines if not x.strip()),
    }


def read_eval_split(root: str, split: str, src_name: Optional[str] = None):
    """dev or test: (documents [(docid, [(zh, ref0), ...])], refset, source path,
    refset path), or None when the split has neither a source nor references.
    A source without references (or references without a source), or a
    source whose line count differs from the references', is an error."""
    d = os.path.join(root, PROCESSED_DIR, split)
    src = os.path.join(d, src_name or f"{split}_src")
    sgm = os.path.join(d, f"{split}_trg.sgm")
    has_src, has_sgm = os.path.isfile(src), os.path.isfile(sgm)
    if not has_src and not has_sgm:
        others = sorted(n for n in os.listdir(d) if n.endswith("_src")) if os.path.isdir(d) else []
        if others:
            raise TvsubError(f"{d}: no {os.path.basename(src)} and no {split}_trg.sgm, but "
                             f"{', '.join(others)}; expected a source and its refset")
        return None
    if has_src and not has_sgm:
        raise TvsubError(f"{src}: a source without its references ({sgm}: no such file)")
    if has_sgm and not has_src:
        others = sorted(n for n in os.listdir(d) if n.endswith("_src"))
        hint = (f"; {d} has {', '.join(others)} (the +DP variants: give one with "
                "--test-src/--dev-src NAME to use it)" if others else "")
        raise TvsubError(f"{sgm}: references without their source ({src}: no such file){hint}")
    zh = read_lines(src)
    refset = parse_refset(sgm)
    n = len(refset.refs[0])
    if len(zh) != n:
        raise TvsubError(f"{src} has {len(zh)} lines but {sgm} has {n} sentences per reference "
                         f"({len(refset.sysids)} references; documents "
                         + ", ".join(f"{d} {k}" for d, k in zip(refset.docs, refset.lengths))
                         + "); expected one source line per reference sentence")
    docs, i = [], 0
    for docid, k in zip(refset.docs, refset.lengths):
        if re.search(r"\s", docid):
            raise TvsubError(f"{sgm}: document id '{docid}' contains whitespace")
        docs.append((f"{split}-{docid}", list(zip(zh[i:i + k], refset.refs[0][i:i + k]))))
        i += k
    return docs, refset, src, sgm


# ----------------------------------------------------------------------------- prepare

def _write(path: str, lines) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            if "\n" in line or "\r" in line:
                raise TvsubError(f"{path}: a sentence holds a line break")
            f.write(line + "\n")


EVAL_SPLITS = ("auto", "test", "dev-episodes", "dev")


def _dp_lines(root: str, split: str, n: int) -> Tuple[Optional[str], Optional[List[str]]]:
    """The corpus's +DP source of ``split`` (``{split}_oracle_dp_src``: the
    source with its dropped pronouns restored), line-aligned with the plain
    source, or (None, None) when the input has none. Its lines are copied as
    they are; ``ctx-dp-eval`` aligns them with the plain ones."""
    path = os.path.join(root, PROCESSED_DIR, split, f"{split}_oracle_dp_src")
    if not os.path.isfile(path):
        return None, None
    lines = read_lines(path)
    if len(lines) != n:
        raise TvsubError(f"{path} has {len(lines)} lines but its source has {n}; expected one "
                         "+DP line per source line")
    return path, lines


def _slice_docs(docs, refset, dp, keep):
    """The documents of ``docs`` whose index is in ``keep``, with their
    references and +DP lines: (docs, Refset, dp lines or None)."""
    starts = [0]
    for k in refset.lengths:
        starts.append(starts[-1] + k)
    rows = [i for j in keep for i in range(starts[j], starts[j + 1])]
    sub = Refset(sysids=refset.sysids, docs=[refset.docs[j] for j in keep],
                 lengths=[refset.lengths[j] for j in keep],
                 refs=[[r[i] for i in rows] for r in refset.refs])
    return [docs[j] for j in keep], sub, (None if dp is None else [dp[i] for i in rows])


def prepare(root: str, out: str, first: int = 0, count: Optional[int] = None,
            dev_src: Optional[str] = None, test_src: Optional[str] = None,
            eval_split: str = "auto") -> dict:
    """Read, check and write the splits (see the module docstring); returns the
    summary written to ``OUT/prep.json``. ``eval_split`` (what the test split
    is; the checkpoint is chosen on valid, so the two never share a sentence
    except with ``dev``):

    * ``test``: the corpus's test set (an error without it), valid the whole dev set;
    * ``dev-episodes``: dev's first document (episode) as valid, its other
      documents as test (an error with fewer than two);
    * ``auto`` (default): ``test`` when the input has the test set, else
      ``dev-episodes``;
    * ``dev``: dev as both valid and test (the figures are then those of the
      set the checkpoint was chosen on: said in ``prep.json`` and printed).
    """
    if eval_split not in EVAL_SPLITS:
        raise ValueError(f"eval_split {eval_split}: expected one of {', '.join(EVAL_SPLITS)}")
    train = read_episodes(root, first, count)
    dev = read_eval_split(root, "dev", dev_src)
    if dev is None:
        raise TvsubError(f"{os.path.join(root, PROCESSED_DIR, 'dev')}: no dev_src and "
                         "dev_trg.sgm; expected the dev set (validation)")
    test = (read_eval_split(root, "test", test_src)
            if eval_split in ("auto", "test") else None)
    if eval_split == "test" and test is None:
        raise TvsubError(f"{os.path.join(root, PROCESSED_DIR, 'test')}: no test set "
                         "(test_src, test_trg.sgm), but the test split was asked for")
    chosen = "test" if test is not None else ("dev" if eval_split == "dev" else "dev-episodes")
    dev_dp_path, dev_dp = _dp_lines(root, "dev", len(dev[1].refs[0]))
    parts = {}  # name: (docs, refset, source, refset path, +DP path, +DP lines, from)
    if chosen == "dev-episodes":
        if len(dev[0]) < 2:
            raise TvsubError(f"{dev[3]}: dev has {len(dev[0])} document(s); splitting it into "
                             "its episodes (one to choose the checkpoint, the others to report) "
                             "needs two or more (EVAL_SPLIT=dev reports on the dev set itself)")
        for name, keep in (("valid", [0]), ("test", list(range(1, len(dev[0]))))):
            d, r, dp = _slice_docs(dev[0], dev[1], dev_dp, keep)
            parts[name] = (d, r, dev[2], dev[3], dev_dp_path, dp, "dev")
    else:
        parts["valid"] = (dev[0], dev[1], dev[2], dev[3], dev_dp_path, dev_dp, "dev")
        if test is not None:
            test_dp_path, test_dp = _dp_lines(root, "test", len(test[1].refs[0]))
            parts["test"] = (test[0], test[1], test[2], test[3], test_dp_path, test_dp, "test")
        else:
            parts["test"] = parts["valid"]
    summary = {
        "root": os.path.abspath(root),
        "train": {"episodes": [int(d[3:]) for d, _ in train][:1] + [int(train[-1][0][3:])],
                  "documents": len(train), "sentences": sum(len(p) for _, p in train),
                  "empty_lines": {"zh": sum(1 for _, p in train for s, _ in p if not s.strip()),
                                  "en": sum(1 for _, p in train for _, t in p if not t.strip())}},
        "eval_split": chosen,
        "checkpoint_chosen_on": "valid (" + ", ".join(d for d, _ in parts["valid"][0]) + ")",
        "reported_on_chosen_set": chosen == "dev",
    }
    splits = {"train": (train, None, None)}
    for name, (docs, refset, src, sgm, dp_path, dp, origin) in parts.items():
        splits[name] = (docs, refset, dp)
        summary[name] = {
            "from": origin, "source": src, "refset": sgm, "dp_source": dp_path,
            "documents": [d for d, _ in docs], "lengths": refset.lengths,
            "sentences": len(refset.refs[0]), "references": len(refset.sysids),
            "sysids": refset.sysids,
            "reference_units": [check_units(r) for r in refset.refs],
        }
    tmp = out.rstrip("/") + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        for name, (docs, refset, dp) in splits.items():
            rows = [(s, t, docid) for docid, pairs in docs for s, t in pairs]
            _write(os.path.join(tmp, f"{name}.{SRC}"), (r[0] for r in rows))
            _write(os.path.join(tmp, f"{name}.{TGT}"), (r[1] for r in rows))
            _write(os.path.join(tmp, f"{name}.docids"), (r[2] for r in rows))
            if refset is not None:
                for k, ref in enumerate(refset.refs):
                    _write(os.path.join(tmp, f"{name}.ref{k}.{TGT}"), ref)
            if dp is not None:
                _write(os.path.join(tmp, f"{name}.dp.{SRC}"), dp)
        with open(os.path.join(tmp, "prep.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1, ensure_ascii=False)
            f.write("\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return summary


def eval_split_note(summary: dict) -> str:
    """One line saying what the figures are reported on and what the
    checkpoint was chosen on (printed by prep and by the recipe)."""
    t = summary["test"]
    docs = ", ".join(t["documents"])
    if summary["eval_split"] == "test":
        return f"evaluating on the test set ({docs}); checkpoints chosen on the dev set"
    if summary["eval_split"] == "dev-episodes":
        return (f"evaluating on the dev set's {docs} (the input has no test set); checkpoints "
                f"chosen on {', '.join(summary['valid']['documents'])}")
    return ("evaluating on the dev set (the input has no test set: the test split is a copy of "
            "dev, the set the checkpoints are chosen on: not a held-out figure)")


# ----------------------------------------------------------------------------- scoring

def _read_refs(prefix: str, n: int) -> List[List[str]]:
    """``PREFIX0.en``, ``PREFIX1.en``, ... (``PREFIX`` like ``docs/test.ref``):
    every reference file there, each with ``n`` lines."""
    refs, k = [], 0
    while os.path.exists(f"{prefix}{k}.{TGT}"):
        path = f"{prefix}{k}.{TGT}"
        lines = read_lines(path)
        if len(lines) != n:
            raise TvsubError(f"{path}: {len(lines)} lines; expected {n}, one per sentence of "
                             "the generated split")
        refs.append(lines)
        k += 1
    if not refs:
        raise TvsubError(f"{prefix}0.{TGT}: no such file (expected the references "
                         f"{prefix}0.{TGT}, {prefix}1.{TGT}, ...)")
    return refs


def _bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> dict:
    from sacrebleu.metrics import BLEU

    metric = BLEU(tokenize="none")
    res = metric.corpus_score(list(hyps), [list(r) for r in refs])
    return {"bleu": round(res.score, 2), "precisions": [round(p, 2) for p in res.precisions],
            "bp": round(res.bp, 4), "sys_len": res.sys_len, "ref_len": res.ref_len,
            "signature": str(metric.get_signature())}


def score(generate_output: str, refs_prefix: str, docids_path: str) -> dict:
    """Multi- and single-reference BLEU, sentence and document level, of the
    ``H-`` lines of a fairseq-generate output (BPE removed) against
    ``REFS_PREFIX{K}.en`` (see the module docstring)."""
    from ctx_fairseq.generate_output import lines_with_bpe, read_generate_output

    gen = read_generate_output(generate_output, need_references=False)
    docids = read_lines(docids_path)
    n = len(docids)
    if gen.ids != list(range(n)):
        missing = sorted(set(range(n)) - set(gen.ids))
        raise TvsubError(f"{generate_output}: {len(gen.ids)} hypotheses for the {n} sentences of "
                         f"{docids_path}" + (f" (first missing id: {missing[0]})" if missing else
                                             " (ids outside the split)"))
    if lines_with_bpe(gen.hypotheses):
        raise TvsubError(f"{generate_output}: hypotheses hold BPE units; generate with --remove-bpe")
    refs = _read_refs(refs_prefix, n)
    hyps = [" ".join(h.split()) for h in gen.hypotheses]
    order, groups = [], {}
    for i, d in enumerate(docids):
        if d not in groups:
            order.append(d)
            groups[d] = []
        elif order[-1] != d:
            raise TvsubError(f"{docids_path}:{i + 1}: document {d} is not contiguous")
        groups[d].append(i)

    def join(lines):
        return [" ".join(lines[i] for i in groups[d]) for d in order]

    return {
        "metric": "BLEU on the tokenized, lowercased text (sacreBLEU --tokenize none), "
                  "H- lines after --remove-bpe",
        "sentences": n, "documents": len(order), "references": len(refs),
        "sentence_level": {"all_references": _bleu(hyps, refs),
                           "first_reference": _bleu(hyps, refs[:1])},
        "document_level": {"all_references": _bleu(join(hyps), [join(r) for r in refs]),
                           "first_reference": _bleu(join(hyps), [join(refs[0])])},
    }


def format_score(res: dict) -> str:
    lines = [f"| level | references | BLEU | signature |", "|---|---|---:|---|"]
    for level in ("sentence_level", "document_level"):
        for which in ("all_references", "first_reference"):
            r = res[level][which]
            k = res["references"] if which == "all_references" else 1
            lines.append(f"| {level.replace('_', '-')} | {which.replace('_', ' ')} ({k}) "
                         f"| {r['bleu']:.2f} | {r['signature'].replace('|', chr(92) + '|')} |")
    lines.append("")
    lines.append(f"{res['sentences']} sentences, {res['documents']} documents; {res['metric']}.")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- command line

def _episodes(text: str) -> Tuple[int, Optional[int]]:
    m = re.fullmatch(r"(\d+):(\d*)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text}: expected FIRST:END (END excluded, empty: all)")
    first = int(m.group(1))
    if m.group(2) == "":
        return first, None
    end = int(m.group(2))
    if end <= first:
        raise argparse.ArgumentTypeError(f"{text}: END must be above FIRST")
    return first, end - first


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ctx_fairseq.prep.tvsub",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prep", help="the splits as documents (OUT/{train,valid,test}.*)")
    a.add_argument("--raw", required=True, help="a clone of the TVsub repository or its extracted copy")
    a.add_argument("--out", required=True, help="output directory (written whole or not at all)")
    a.add_argument("--episodes", type=_episodes, default=(0, None), metavar="FIRST:END",
                   help="training episodes FIRST..END-1 (default 0: all)")
    a.add_argument("--dev-src", default=None, help="dev source file name (default dev_src)")
    a.add_argument("--test-src", default=None, help="test source file name (default test_src)")
    a.add_argument("--eval-split", choices=EVAL_SPLITS, default="auto",
                   help="the split written as test: auto (the test set if present, else "
                   "dev-episodes: dev's first episode as valid, the others as test), test, "
                   "dev-episodes, or dev (valid and test both the dev set)")
    s = sub.add_parser("score", help="multi-reference BLEU of a fairseq-generate output")
    s.add_argument("generate_output")
    s.add_argument("--refs", required=True, help="references prefix: PREFIX0.en, PREFIX1.en, ...")
    s.add_argument("--docids", required=True)
    s.add_argument("--out-dir", required=True)
    s.add_argument("--prefix", default="bleu")
    return p


def main(argv=None) -> None:
    args = get_parser().parse_args(argv)
    try:
        if args.cmd == "prep":
            first, count = args.episodes
            s = prepare(args.raw, args.out, first, count, args.dev_src, args.test_src,
                        args.eval_split)
            print(f"prep_tvsub: train {s['train']['documents']} episodes "
                  f"({s['train']['sentences']} sentences); valid = {s['valid']['from']} "
                  f"{', '.join(s['valid']['documents'])} "
                  f"{s['valid']['sentences']} sentences, {s['valid']['references']} reference(s); "
                  f"test = {s['eval_split']} {s['test']['sentences']} sentences, "
                  f"{s['test']['references']} reference(s) -> {args.out}")
            print(f"prep_tvsub: {eval_split_note(s)}")
        else:
            res = score(args.generate_output, args.refs, args.docids)
            os.makedirs(args.out_dir, exist_ok=True)
            for ext, text in (("json", json.dumps(res, indent=1) + "\n"), ("md", format_score(res))):
                path = os.path.join(args.out_dir, f"{args.prefix}.{ext}")
                with open(path + ".part", "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(path + ".part", path)
            sl = res["sentence_level"]
            print(f"BLEU (all {res['references']} references) = {sl['all_references']['bleu']:.2f} "
                  f"{sl['all_references']['signature']}")
            print(f"BLEU (first reference) = {sl['first_reference']['bleu']:.2f}")
            print(f"d-BLEU (all references) = "
                  f"{res['document_level']['all_references']['bleu']:.2f}")
    except (TvsubError, InputError, OSError) as err:
        sys.exit(f"prep_tvsub: error: {err}")


if __name__ == "__main__":
    main()
