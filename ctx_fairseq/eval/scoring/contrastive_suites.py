"""Readers for contrastive test suites (``ctx-score-contrastive --format``).

Every reader returns a :class:`Suite`: a list of :class:`Example` s, each a
current source sentence with two or more candidate translations, one of them
correct (``Example.correct``), the context sentences the suite gives (previous
sentences, oldest first, source and target side) and, for the report, a
category and an antecedent distance. Text is returned as it is in the files;
``ctx-score-contrastive`` applies the model's tokenizer/BPE
(:mod:`ctx_fairseq.eval.text_units`).

Formats (each has a tiny fixture written by ``tests/test_contrastive_suites.py``):

``toy``
    JSON Lines written by ``ctx-make-toy`` (``test.contrastive.jsonl``; fields in
    :mod:`ctx_fairseq.data.toy_corpus`; ``distance`` may be null when unknown):
    ``id`` is the line of the binarized split, so the context is the record's real document in that split
    (previous and following sentences, as in training); ``ref`` is correct,
    ``contrastive`` lists the wrong targets; category = ``phenomenon``.
``contrapro``
    ContraPro (Müller et al. 2018, en-de): ``FILE`` is ``contrapro.json`` (a JSON
    array; each entry has ``errors`` (each with ``contrastive``), ``ante
    distance``, ``src pronoun``, ``ref pronoun``) and beside it the files of
    ContraPro's ``conversion_scripts/json2text_and_context.pl -c N``:
    ``contrapro.text.{en,de}`` (per entry the reference line, then one line per
    error) and ``contrapro.context.{en,de}`` (N lines per text line, oldest
    first; N is read off the line counts). Near the start of a document the
    script writes lines that are not context (a literal ``null`` for line 0,
    lines from the document's end for negative indices): only the lines after
    the document's start (by the entry's ``segment id``) are used. Category
    ``src:ref`` pronoun, and distances above 3 pooled as ``>3``, as ContraPro's
    ``evaluate.py`` does.
``voita``
    Voita et al. 2019 consistency sets (en-ru; deixis, lexical cohesion,
    ellipsis): a JSON array (their ``*.json``) or JSON Lines of objects with
    ``src`` (context sentences and the current one joined by `` _eos ``),
    ``dst`` (candidates, each with its own target context the same way),
    ``true_ind`` (index of the correct candidate) and optional ``ctx_dist``.
    Category = the file's name (``deixis_test``, ...).
``bawden``
    Bawden et al. 2018 (en-fr; ``json2rawtext.py`` output): ``FILE`` is the prefix
    ``DIR/anaphora``; ``PREFIX.current.{en,fr}`` hold pairs of lines, correct
    first, and ``PREFIX.prev.{en,fr}`` each line's previous sentence (the two
    lines of a pair may have different contexts). Category = the prefix's
    name; no distance (the antecedent is always in the previous sentence).
``lopes``
    Lopes et al. 2020 (en-fr, ``extract_current_and_context.py`` output):
    ``FILE`` is the prefix ``DIR/OpenSubs``; ``PREFIX.current.{src,trg}`` hold
    pairs of lines, correct first; the context is ``PREFIX.cN.context.{src,trg}``
    with ``--suite-context N`` (N lines per current line, oldest first; the
    script writes empty lines when the document is shorter) or
    ``PREFIX.context.{src,trg}`` (one line). ``--suite-json`` (the suite's JSON)
    adds categories and distances: each pair of lines is matched to its JSON
    entry by content (source, correct and contrastive translation), since the
    extraction script does not keep the JSON's order; a pair with no entry is
    an error. Negative distances (unknown) are left out of the distances.

Context lines that are empty at the start of an example's context (the
document starts later) are dropped. ``--suite-langs SRC-TGT`` changes the
file suffixes of ``contrapro`` (default ``en-de``) and ``bawden`` (``en-fr``).
Malformed files raise :class:`SuiteError` naming the file and line.
"""

import collections
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ctx_fairseq.data.json_lines import json_lines

__all__ = ["SuiteError", "Candidate", "Example", "Suite", "FORMATS", "read_suite"]


class SuiteError(ValueError):
    """A test suite that cannot be read as its format says."""


@dataclass
class Candidate:
    target: str
    #: this candidate's own context (oldest first); None: the example's
    src_context: Optional[List[str]] = None
    tgt_context: Optional[List[str]] = None


@dataclass
class Example:
    source: str
    candidates: List[Candidate]
    correct: int = 0
    category: str = ""
    distance: Optional[str] = None
    where: str = ""
    src_context: List[str] = field(default_factory=list)
    tgt_context: Optional[List[str]] = None
    #: toy format: line of the binarized split and its document id
    corpus_line: Optional[int] = None
    doc_id: Optional[str] = None

    def context(self, c: int) -> Tuple[List[str], Optional[List[str]]]:
        cand = self.candidates[c]
        src = cand.src_context if cand.src_context is not None else self.src_context
        tgt = cand.tgt_context if cand.tgt_context is not None else self.tgt_context
        return src, tgt


@dataclass
class Suite:
    format: str
    path: str
    name: str
    examples: List[Example]
    #: previous sentences the suite gives per example (None: the corpus split)
    context_sentences: Optional[int]
    target_context: bool


def _open(path: str):
    if not os.path.isfile(path):
        raise SuiteError(f"{path}: no such file")
    return open(path, encoding="utf-8-sig")


def _lines(path: str) -> List[str]:
    with _open(path) as f:
        return [x.rstrip("\r\n") for x in f]


def _nonempty(path: str, items) -> None:
    if not items:
        raise SuiteError(f"{path}: empty file (no examples)")


def _drop_leading_empty(ctx: Sequence[str]) -> List[str]:
    ctx = list(ctx)
    while ctx and not ctx[0].strip():
        ctx.pop(0)
    return ctx


def _json_records(path: str) -> List[Tuple[int, dict]]:
    """A JSON array or JSON Lines: (line number, object) pairs (for an array,
    the 1-based entry number instead of the line)."""
    return _json_records_kind(path)[0]


def _json_records_kind(path: str) -> Tuple[List[Tuple[int, dict]], bool]:
    """(records, whether the file is a JSON array)."""
    with _open(path) as f:
        text = f.read()
    if not text.strip():
        raise SuiteError(f"{path}: empty file (no examples)")
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SuiteError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err
        out = []
        for i, obj in enumerate(data):
            if not isinstance(obj, dict):
                raise SuiteError(f"{path}: entry {i}: expected a JSON object, got "
                                 f"{type(obj).__name__}")
            out.append((i + 1, obj))
        _nonempty(path, out)
        return out, True
    out = []
    for lineno, obj in json_lines(path, text.splitlines(), SuiteError):
        if not isinstance(obj, dict):
            raise SuiteError(f"{path}:{lineno}: expected a JSON object")
        out.append((lineno, obj))
    _nonempty(path, out)
    return out, False


def _where(path: str, lineno: int, array: bool) -> str:
    return f"{path}: entry {lineno}" if array else f"{path}:{lineno}"


# ----------------------------------------------------------------------- toy
def read_toy(path: str) -> Suite:
    required = ("id", "phenomenon", "distance", "src", "ref", "contrastive")
    examples = []
    for lineno, rec in _json_records(path):
        where = f"{path}:{lineno}"
        missing = [k for k in required if k not in rec]
        if missing:
            raise SuiteError(f"{where}: missing field(s) {', '.join(missing)}")
        if not isinstance(rec["contrastive"], list) or not rec["contrastive"]:
            raise SuiteError(f"{where}: 'contrastive' must list at least one target")
        try:
            line = int(rec["id"])
        except (TypeError, ValueError):
            raise SuiteError(f"{where}: 'id' must be a line number, got {rec['id']!r}") from None
        cands = [Candidate(str(t)) for t in [rec["ref"], *rec["contrastive"]]]
        dist = None if rec["distance"] is None else str(rec["distance"])
        examples.append(Example(str(rec["src"]), cands, 0, str(rec["phenomenon"]),
                                dist, where, corpus_line=line,
                                doc_id=None if rec.get("doc_id") is None else str(rec["doc_id"])))
    seen: Dict[int, str] = {}
    for ex in examples:
        if ex.corpus_line in seen:
            raise SuiteError(f"{ex.where}: id {ex.corpus_line} already used at "
                             f"{seen[ex.corpus_line]}; expected one record per sentence")
        seen[ex.corpus_line] = ex.where
    return Suite("toy", path, _stem(path), examples, None, True)


def _distance(value, where: str) -> Optional[str]:
    """ContraPro-style antecedent distance: distances above 3 pooled as ``>3``
    (as ContraPro's evaluate.py); a missing or negative value (unknown) is None."""
    if value is None:
        return None
    try:
        d = int(value)
    except (TypeError, ValueError):
        raise SuiteError(f"{where}: 'ante distance' must be an integer, got {value!r}") from None
    if d < 0:
        return None
    return ">3" if d > 3 else str(d)


# ------------------------------------------------------------------- ContraPro
def _prefix_of(path: str) -> str:
    return path[:-len(".json")] if path.endswith(".json") else path


def _stem(path: str) -> str:
    base = os.path.basename(path)
    for ext in (".jsonl", ".json"):
        if base.endswith(ext):
            return base[:-len(ext)]
    return base


def _context_blocks(path: str, lines: List[str], per: int, n_text: int) -> List[List[str]]:
    if per * n_text != len(lines):
        raise SuiteError(f"{path}: {len(lines)} lines for {n_text} text lines; expected a whole "
                         "number of context lines per text line")
    return [lines[i * per:(i + 1) * per] for i in range(n_text)]


def read_contrapro(path: str, langs: Tuple[str, str] = ("en", "de")) -> Suite:
    sl, tl = langs
    records, array = _json_records_kind(path)
    prefix = _prefix_of(path)
    files = {k: f"{prefix}.{k.split('_')[0]}.{sl if k.endswith('src') else tl}"
             for k in ("text_src", "text_tgt", "context_src", "context_tgt")}
    for f in files.values():
        if not os.path.isfile(f):
            raise SuiteError(
                f"{f}: no such file. The ContraPro format reads {path} together with the text and "
                f"context files that ContraPro's conversion_scripts/json2text_and_context.pl "
                f"writes ({prefix}.text.{sl}, .text.{tl}, .context.{sl}, .context.{tl}; run it with "
                "-c N for N context sentences); --suite-langs SRC-TGT sets the suffixes")
    text = {k: _lines(files[k]) for k in files}
    n_text = sum(1 + len(r.get("errors") or []) for _, r in records)
    for k in ("text_src", "text_tgt"):
        if len(text[k]) != n_text:
            raise SuiteError(f"{files[k]}: {len(text[k])} lines, but {path} has {n_text} "
                             "candidates (the reference and each error per entry)")
    if len(text["context_src"]) != len(text["context_tgt"]):
        raise SuiteError(f"{files['context_tgt']}: {len(text['context_tgt'])} lines, but "
                         f"{files['context_src']} has {len(text['context_src'])}")
    per = len(text["context_src"]) // n_text if n_text else 0
    ctx_s = _context_blocks(files["context_src"], text["context_src"], per, n_text)
    ctx_t = _context_blocks(files["context_tgt"], text["context_tgt"], per, n_text)
    examples, k = [], 0
    for lineno, rec in records:
        where = _where(path, lineno, array)
        for key in ("errors", "ante distance", "src pronoun", "ref pronoun"):
            if key not in rec:
                raise SuiteError(f"{where}: missing field {key!r}")
        if not isinstance(rec["errors"], list) or not rec["errors"]:
            raise SuiteError(f"{where}: 'errors' must list at least one contrastive translation")
        n = 1 + len(rec["errors"])
        srcs = text["text_src"][k:k + n]
        if len(set(srcs)) != 1:
            raise SuiteError(f"{files['text_src']}:{k + 1}-{k + n}: the lines of {where} should "
                             "all be the same source sentence")
        if "segment id" not in rec:
            raise SuiteError(f"{where}: missing field 'segment id' (needed to know where the "
                             "document starts)")
        try:
            seg = int(rec["segment id"])
        except (TypeError, ValueError):
            raise SuiteError(f"{where}: 'segment id' must be an integer") from None
        # json2text_and_context.pl writes context lines seg-N .. seg-1 (1-based); lines
        # before the document's first one are not context: a literal "null" (line 0)
        # or, by Perl's negative indices, lines from the end of the document
        keep = max(0, min(per, seg - 1))
        cands = [Candidate(text["text_tgt"][k + j], ctx_s[k + j][per - keep:],
                           ctx_t[k + j][per - keep:]) for j in range(n)]
        d = _distance(rec.get("ante distance"), where)
        cat = f"{str(rec['src pronoun']).lower()}:{str(rec['ref pronoun']).lower()}"
        examples.append(Example(srcs[0], cands, 0, cat, d,
                                f"{where} ({files['text_src']}:{k + 1})"))
        k += n
    return Suite("contrapro", path, _stem(path), examples, per, True)


# ------------------------------------------------------------------- Voita 2019
def _split_eos(text: str) -> List[str]:
    parts: List[List[str]] = [[]]
    for tok in str(text).split():
        if tok == "_eos":
            parts.append([])
        else:
            parts[-1].append(tok)
    return [" ".join(p) for p in parts]


def read_voita(path: str) -> Suite:
    records, array = _json_records_kind(path)
    examples, n_ctx = [], 0
    for lineno, rec in records:
        where = _where(path, lineno, array)
        for key in ("src", "dst", "true_ind"):
            if key not in rec:
                raise SuiteError(f"{where}: missing field {key!r}")
        dst = rec["dst"]
        if not isinstance(dst, list) or len(dst) < 2:
            raise SuiteError(f"{where}: 'dst' must list at least two candidate translations")
        ti = rec["true_ind"]
        if isinstance(ti, list):  # a list holding the one index
            if len(ti) != 1:
                raise SuiteError(f"{where}: 'true_ind' must be one index, got {ti!r}")
            ti = ti[0]
        if not isinstance(ti, int) or not 0 <= ti < len(dst):
            raise SuiteError(f"{where}: 'true_ind' {rec['true_ind']!r} is not an index into 'dst' "
                             f"({len(dst)} candidates)")
        src = _split_eos(rec["src"])
        if any(not p for p in src):
            raise SuiteError(f"{where}: 'src' has an empty sentence between ' _eos ' separators")
        cands = []
        for j, d in enumerate(dst):
            parts = _split_eos(d)
            if len(parts) != len(src):
                raise SuiteError(f"{where}: candidate {j} has {len(parts)} sentences (joined by "
                                 f"' _eos '), 'src' has {len(src)}")
            cands.append(Candidate(parts[-1], None, parts[:-1]))
        dist = rec.get("ctx_dist")
        examples.append(Example(src[-1], cands, ti, _stem(path),
                                None if dist is None else str(dist), where, src[:-1], None))
        n_ctx = max(n_ctx, len(src) - 1)
    return Suite("voita", path, _stem(path), examples, n_ctx, True)


# --------------------------------------------------------------------- pairs
def _pairs(current_src: str, current_tgt: str, src: List[str], tgt: List[str],
           ctx_src: List[List[str]], ctx_tgt: List[List[str]], category: str) -> List[Example]:
    if len(src) != len(tgt):
        raise SuiteError(f"{current_tgt}: {len(tgt)} lines, but {current_src} has {len(src)}")
    _nonempty(current_src, src)
    if len(src) % 2:
        raise SuiteError(f"{current_src}: {len(src)} lines; expected pairs of lines (correct "
                         "translation first, then the contrastive one)")
    examples = []
    for i in range(0, len(src), 2):
        if src[i] != src[i + 1]:
            raise SuiteError(f"{current_src}:{i + 1}-{i + 2}: a pair should have the same source "
                             f"sentence, got {src[i]!r} and {src[i + 1]!r}")
        cands = [Candidate(tgt[i + j], _drop_leading_empty(ctx_src[i + j]),
                           _drop_leading_empty(ctx_tgt[i + j])) for j in (0, 1)]
        examples.append(Example(src[i], cands, 0, category, None, f"{current_src}:{i + 1}"))
    return examples


def read_bawden(prefix: str, langs: Tuple[str, str] = ("en", "fr")) -> Suite:
    sl, tl = langs
    f = {k: f"{prefix}.{k.split('_')[0]}.{sl if k.endswith('src') else tl}"
         for k in ("current_src", "current_tgt", "prev_src", "prev_tgt")}
    text = {k: _lines(v) for k, v in f.items()}
    for k in ("prev_src", "prev_tgt"):
        if len(text[k]) != len(text["current_src"]):
            raise SuiteError(f"{f[k]}: {len(text[k])} lines, but {f['current_src']} has "
                             f"{len(text['current_src'])}; expected one previous sentence per line")
    examples = _pairs(f["current_src"], f["current_tgt"], text["current_src"],
                      text["current_tgt"], [[x] for x in text["prev_src"]],
                      [[x] for x in text["prev_tgt"]], os.path.basename(prefix))
    return Suite("bawden", prefix, os.path.basename(prefix), examples, 1, True)


def read_lopes(prefix: str, context: Optional[int] = None, meta: Optional[str] = None) -> Suite:
    cur = {"src": f"{prefix}.current.src", "tgt": f"{prefix}.current.trg"}
    if context is None:
        ctx = {"src": f"{prefix}.context.src", "tgt": f"{prefix}.context.trg"}
        if not os.path.isfile(ctx["src"]):
            found = sorted(x for x in os.listdir(os.path.dirname(prefix) or ".")
                           if x.startswith(os.path.basename(prefix) + ".c")
                           and x.endswith(".context.src"))
            raise SuiteError(f"{ctx['src']}: no such file; give --suite-context N for "
                             f"{prefix}.cN.context.{{src,trg}} (found: {', '.join(found) or 'none'})")
    else:
        ctx = {"src": f"{prefix}.c{context}.context.src", "tgt": f"{prefix}.c{context}.context.trg"}
    src, tgt = _lines(cur["src"]), _lines(cur["tgt"])
    _nonempty(cur["src"], src)
    cs, ct = _lines(ctx["src"]), _lines(ctx["tgt"])
    if len(cs) != len(ct):
        raise SuiteError(f"{ctx['tgt']}: {len(ct)} lines, but {ctx['src']} has {len(cs)}")
    per = len(cs) // len(src)
    if context is not None and per != context:
        raise SuiteError(f"{ctx['src']}: {len(cs)} lines for {len(src)} current lines; expected "
                         f"{context} per line")
    blocks_s = _context_blocks(ctx["src"], cs, per, len(src))
    blocks_t = _context_blocks(ctx["tgt"], ct, per, len(src))
    examples = _pairs(cur["src"], cur["tgt"], src, tgt, blocks_s, blocks_t,
                      os.path.basename(prefix))
    if meta is not None:
        _lopes_metadata(meta, examples, cur["src"])
    return Suite("lopes", prefix, os.path.basename(prefix), examples, per, True)


def _norm(text) -> str:
    return " ".join(str(text).split())


def _lopes_metadata(meta: str, examples: List[Example], current: str) -> None:
    """Categories and distances from the suite's JSON, each pair of lines
    matched to its entry by content (source, correct and contrastive
    translation, white space normalised): the extraction script writes
    examples grouped by document in an order that is not the JSON's."""
    index: Dict[Tuple[str, str, str], List[Tuple[int, dict]]] = collections.defaultdict(list)
    for lineno, r in _json_records(meta):
        src = r.get("src segment", r.get("source"))
        ref = r.get("ref segment", r.get("reference"))
        errs = r.get("errors") or []
        if src is None or ref is None or not errs or "contrastive" not in errs[0]:
            raise SuiteError(f"{meta}: entry {lineno}: expected 'src segment', 'ref segment' and "
                             "'errors' (with 'contrastive') to match it to the text files")
        index[(_norm(src), _norm(ref), _norm(errs[0]["contrastive"]))].append((lineno, r))
    for ex in examples:
        key = (_norm(ex.source), _norm(ex.candidates[0].target), _norm(ex.candidates[1].target))
        if not index.get(key):
            raise SuiteError(f"{ex.where}: no entry of {meta} has this source, correct and "
                             "contrastive translation; is it the JSON these files were extracted "
                             "from?")
        lineno, r = index[key].pop(0)
        if "src pronoun" in r and "ref pronoun" in r:
            ex.category = f"{str(r['src pronoun']).lower()}:{str(r['ref pronoun']).lower()}"
        ex.distance = _distance(r.get("ante distance"), f"{meta}: entry {lineno}")


FORMATS = ("toy", "contrapro", "voita", "bawden", "lopes")


def read_suite(fmt: str, path: str, langs: Optional[Tuple[str, str]] = None,
               context: Optional[int] = None, meta: Optional[str] = None) -> Suite:
    if fmt == "toy":
        return read_toy(path)
    if fmt == "contrapro":
        return read_contrapro(path, langs or ("en", "de"))
    if fmt == "voita":
        return read_voita(path)
    if fmt == "bawden":
        return read_bawden(path, langs or ("en", "fr"))
    if fmt == "lopes":
        return read_lopes(path, context, meta)
    raise SuiteError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
