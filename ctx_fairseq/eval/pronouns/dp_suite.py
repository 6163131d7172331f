"""ctx-dp-suite: a contrastive suite from the dropped pronouns (issue 38), and
its report by class and by kind of swap.

    ctx-dp-suite build --source S --dp-source D --refs R [R ...] --out suite.jsonl \\
        [--docids F] [--strict]
    ctx-score-contrastive --path CKPT --data BIN --contrastive suite.jsonl \\
        [--bpe subword_nmt --bpe-codes CODES] [--context-ablation shuffled] --out-dir out/
    ctx-dp-suite report --suite suite.jsonl --scores out/contrastive_suite.json [...] \\
        [--json OUT]

``build`` reads the inputs of ``ctx-dp-eval`` (:mod:`ctx_fairseq.eval.pronouns.dp_eval`;
``S`` must be the source side of the split the suite is scored on, as
binarized before BPE: a record's ``id`` is its line, 0-based) and writes the
toy JSON Lines format of ``ctx-score-contrastive`` (``--format toy``, the
default: context comes from the binarized split's real documents, as in
training; with ``--docids`` each record also names its document, which the
scorer checks).

Which items (:func:`suite_items`)
    A sentence and class where the plain source has no pronoun of the class,
    the +DP source restores exactly one, and a reference (the first given,
    in ``--refs`` order, that qualifies) holds exactly one English pronoun of
    the class as a whitespace token of its own: that token is the dropped
    pronoun's translation. Slang (ya, u, em, 'em), ``let's`` and ``y'all`` are
    not swapped.

The swaps (:func:`swaps_for`), one contrastive candidate each, the
reference's other tokens unchanged:

``gender``
    3sg among themselves: he/him/his/himself <-> she/her/hers/herself <->
    it/it/its/itself. ``his`` before a word is a determiner (-> her, its),
    elsewhere a pronoun (-> hers). ``her`` is a swap only before punctuation
    or at the end (an object: -> him, it); before a word it may be a
    determiner or an object, and it is skipped. ``it`` needs its role
    (below): subject -> he, she; object -> him, her.
``plural``
    1pl/3pl/2 among themselves: we/us/our/ours/ourselves <->
    they/them/their/theirs/themselves <-> you/you/your/yours/yourselves
    (a subject ``you`` -> we, they; an object -> us, them; English plural
    verbs agree with all three).
``person-1/2``
    1sg <-> 2: i/me/my/mine/myself <-> you/you/your/yours/yourself. The
    subject pair I/you only where the verb agrees or is changed with it: a
    be-form next to the pronoun changes (am, 'm, was <-> are, 're, were, after
    it or before it in a question: ``am i`` -> ``are you``); a be-form
    elsewhere in the clause (``i really am``, ``aren 't you``) leaves the
    agreement unclear and that swap is not made. Other verbs have the same
    form with I and you. ``yourself`` -> ``myself`` only (singular).

Roles of ``it`` and ``you`` (the tokens around them, no parser)
    *subject* when the next word is an auxiliary or a be-form
    (:data:`AFTER_SUBJECT`), when the previous word is one that inverts
    (``is it``, ``do you``: :data:`INVERTING`) and a word or ``?`` follows
    (``does it ?``, but ``do it .`` is an object), or when it opens a clause
    (first word, or after punctuation or a conjunction) and a word follows;
    else *object* when punctuation, the end or a particle/adverb
    (:data:`AFTER_OBJECT`) follows; else unknown, and the item is skipped.

Records: the toy fields (``id``, ``doc_id``, ``sent_index``, ``phenomenon``,
``distance`` null, ``antecedent_id`` null, ``src``, ``ref``, ``contrastive``)
and ``swaps``, one per contrastive candidate in its order: ``class``, ``to``
(the candidate pronoun's class), ``kind``, ``word``, ``replacement``,
``token_index``, plus ``reference`` (the reference used). The toy format takes
one record per sentence: a sentence with several items gets one record with
every item's candidates, and ``phenomenon`` is its classes joined by ``+``
(the scorer's own table groups by it; ``report`` groups by item).

``report`` reads the scorer's JSON (``contrastive_NAME.json``: each example's
scores, in the suite's order; its ``tie_tolerance``) for each ``--scores``
(e.g. with context and with ``--context-ablation shuffled``, or a context
model and a sentence-level one) and gives, per class, the items whose
reference scores above every candidate of the item by more than the
tolerance (a tie: within it), and per kind of swap (``person-1/2`` on its
own) the pairwise share of candidates the reference beats.
"""

import argparse
import json
import os
import sys
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

from ctx_fairseq.data.json_lines import json_lines
from ctx_fairseq.errors import InputError
from ctx_fairseq.eval.pronouns.dropped import CLASSES, EN_CLASSES, english_counts, english_words

__all__ = ["KINDS", "SKIP_REASONS", "swaps_for", "suite_items", "build_suite", "write_suite",
           "report_suite", "cli_main"]

PROG = "ctx-dp-suite"
KINDS = ("gender", "plural", "person-1/2")

_GENDER = {  # form -> {role: [replacements]}; role None: any
    "he": {None: ["she", "it"]}, "him": {None: ["her", "it"]},
    "his": {"determiner": ["her", "its"], "pronoun": ["hers"]},
    "himself": {None: ["herself", "itself"]},
    "she": {None: ["he", "it"]}, "her": {"object": ["him", "it"]},
    "hers": {None: ["his"]}, "herself": {None: ["himself", "itself"]},
    "it": {"subject": ["he", "she"], "object": ["him", "her"]},
    "its": {None: ["his", "her"]}, "itself": {None: ["himself", "herself"]},
}
_PLURAL_ROWS = [("we", "us", "our", "ours", "ourselves"),
                ("they", "them", "their", "theirs", "themselves"),
                ("you", "you", "your", "yours", "yourselves")]
_PERSON_ROWS = [("i", "me", "my", "mine", "myself"), ("you", "you", "your", "yours", "yourself")]
_BE_1SG = {"am": "are", "'m": "'re", "was": "were"}
_BE_2 = {v: k for k, v in _BE_1SG.items()}
_BE_ANY = set(_BE_1SG) | set(_BE_2) | {"aren", "weren", "ain", "is", "'s", "isn", "wasn"}
#: words after which a pronoun is a subject
AFTER_SUBJECT = frozenset(
    "is 's was are 're were am 'm have 've has had 'd will 'll would can could should must "
    "might may do does did don doesn didn isn wasn aren weren won wouldn couldn shouldn can "
    "cannot gonna wanna got".split())
#: words before a pronoun that make it a subject (questions: is it, do you)
INVERTING = frozenset("is was are were am does do did can could will would should has have "
                      "had must might may".split())
#: words after which (or punctuation, or the end) a pronoun is an object
AFTER_OBJECT = frozenset("to for with from in on at about up out off back away down over "
                         "again now here there too anymore yet then today tonight tomorrow "
                         "anyway".split())
_CONJUNCTIONS = frozenset("and but or so because cause if when that then well".split())
_SLANG = frozenset(["ya", "u", "em", "'em"])
_CLASS_OF_FORM = dict(EN_CLASSES)

SKIP_REASONS = {
    "no_single_token": "no reference has exactly one pronoun of the class",
    "not_own_token": "the pronoun is not a whitespace token of its own",
    "slang": "slang or a clitic (ya, u, em, let's, y'all): not swapped",
    "no_swap": "no swap keeps agreement (role or verb form unclear)",
}


def _word(tokens: Sequence[str], k: int) -> Optional[str]:
    """The normalised word of token ``k`` ('' for punctuation, None outside)."""
    if not 0 <= k < len(tokens):
        return None
    words = english_words(tokens[k])
    return words[0] if len(words) == 1 else ("" if not words else " ".join(words))


def _role(tokens: Sequence[str], k: int) -> Optional[str]:
    """``subject``, ``object`` or None for the pronoun at ``k`` (module docstring)."""
    nxt, prev = _word(tokens, k + 1), _word(tokens, k - 1)
    question = k + 1 < len(tokens) and tokens[k + 1] == "?"
    if nxt in AFTER_SUBJECT or (prev in INVERTING and (nxt or question)):
        return "subject"
    if prev in (None, "") or prev in _CONJUNCTIONS:
        if nxt:
            return "subject"
    if nxt in (None, "") or nxt in AFTER_OBJECT:
        return "object"
    return None


def _clause(tokens: Sequence[str], k: int) -> List[int]:
    """Indices of the tokens of the clause around ``k`` (between punctuation)."""
    lo = k
    while lo > 0 and _word(tokens, lo - 1):
        lo -= 1
    hi = k
    while hi + 1 < len(tokens) and _word(tokens, hi + 1):
        hi += 1
    return list(range(lo, hi + 1))


def _be_change(tokens: Sequence[str], k: int, table: Dict[str, str]) -> Optional[Dict[int, str]]:
    """The verb changes a 1sg <-> 2 subject swap at ``k`` needs ({} when none),
    or None when a be-form elsewhere in the clause leaves agreement unclear."""
    changes = {}
    for j in (k + 1, k - 1):
        w = _word(tokens, j)
        if w in table:
            changes[j] = table[w]
    for j in _clause(tokens, k):
        if j != k and j not in changes and _word(tokens, j) in _BE_ANY:
            return None
    return changes


def _rows_swaps(form: str, rows, kind: str, col: Optional[int] = None) -> List[Tuple[str, str]]:
    """``(replacement, kind)`` from the paradigm ``rows``, in the column of
    ``form`` (``col`` for ``you``, which is a subject and an object)."""
    for row in rows:
        if form in row:
            c = row.index(form) if col is None else col
            return [(other[c], kind) for other in rows if other is not row]
    return []


def swaps_for(tokens: Sequence[str], k: int) -> List[Tuple[Dict[int, str], str]]:
    """The candidates for the pronoun token ``k``: ``(changes, kind)`` with
    ``changes`` token index -> new normalised word (module docstring)."""
    form = _word(tokens, k)
    out: List[Tuple[Dict[int, str], str]] = []
    if form in _GENDER:
        role = _role(tokens, k) if form in ("it", "her") else None
        if form == "his":
            role = "determiner" if _word(tokens, k + 1) else "pronoun"
        for repl in _GENDER[form].get(role, _GENDER[form].get(None, [])):
            out.append(({k: repl}, "gender"))
        return out
    role = _role(tokens, k) if form == "you" else None
    if form != "you" or role is not None:
        col = None if form != "you" else (0 if role == "subject" else 1)
        out += [({k: repl}, kind) for repl, kind in _rows_swaps(form, _PLURAL_ROWS, "plural", col)]
    if form in ("i", "you"):
        if form == "you" and role != "subject":
            if role == "object":
                out.append(({k: "me"}, "person-1/2"))
            return out
        changes = _be_change(tokens, k, _BE_1SG if form == "i" else _BE_2)
        if changes is not None:
            out.append(({k: "you" if form == "i" else "i", **changes}, "person-1/2"))
        return out
    person = _rows_swaps(form, _PERSON_ROWS, "person-1/2")
    return out + [({k: repl}, kind) for repl, kind in person]


def _write_token(raw: str, word: str, truecased: bool) -> str:
    """``word`` in the form of the token it replaces: an escaped apostrophe
    stays escaped, a capital stays capital, I is I in truecased text."""
    if word.startswith("'") and "&apos;" in raw:
        word = "&apos;" + word[1:]
    if word == "i" and truecased:
        return "I"
    return word.capitalize() if raw[:1].isupper() else word


def _pronoun_tokens(tokens: Sequence[str], cls: str) -> Tuple[List[int], bool]:
    """Indices of the tokens that are one pronoun of ``cls``, and whether
    every pronoun of the class is such a token."""
    own = [k for k, t in enumerate(tokens)
           if len(english_words(t)) == 1 and _CLASS_OF_FORM.get(english_words(t)[0]) == cls]
    total = english_counts(" ".join(tokens))[cls]
    return own, len(own) == total


def _line_items(line: str, alignment, refs: Sequence[Tuple[str, List[str]]], k: int,
                skipped: Counter) -> Tuple[Optional[int], List[Tuple[str, int]]]:
    """The reference used for line ``k`` (the first of those where most of
    its items qualify) and its items ``(class, token index)``; the rest are
    counted in ``skipped``."""
    from ctx_fairseq.eval.pronouns.dropped import zh_counts

    overt, dropped = zh_counts(line), alignment.dropped()
    wanted = [c for c in CLASSES if dropped[c] == 1 and overt[c] == 0]
    if not wanted:
        return None, []
    counts = [english_counts(ref[k]) for _, ref in refs]
    best = max(range(len(refs)), key=lambda r: (sum(counts[r][c] == 1 for c in wanted), -r))
    tokens = refs[best][1][k].split()
    items = []
    for c in wanted:
        own, all_own = _pronoun_tokens(tokens, c)
        if counts[best][c] != 1:
            skipped["no_single_token"] += 1
        elif not own or not all_own:
            skipped["not_own_token"] += 1
        elif _word(tokens, own[0]) in _SLANG:
            skipped["slang"] += 1
        elif not swaps_for(tokens, own[0]):
            skipped["no_swap"] += 1
        else:
            items.append((c, own[0]))
    return best, items


def _record(k: int, line: str, ref_name: str, ref_line: str, items) -> dict:
    """The toy-format record of line ``k`` (module docstring)."""
    tokens = ref_line.split()
    truecased = any(ch.isupper() for ch in ref_line)
    ref = " ".join(tokens)
    contrastive, swaps = [], []
    for cls, t in items:
        for changes, kind in swaps_for(tokens, t):
            new = list(tokens)
            for j, word in changes.items():
                new[j] = _write_token(tokens[j], word, truecased)
            text = " ".join(new)
            if text == ref or text in contrastive:
                continue
            contrastive.append(text)
            swaps.append({"class": cls, "to": _CLASS_OF_FORM[changes[t]], "kind": kind,
                          "word": tokens[t], "replacement": new[t], "token_index": t})
    return {"id": k, "doc_id": None, "sent_index": None,
            "phenomenon": "+".join(dict.fromkeys(s["class"] for s in swaps)),
            "distance": None, "antecedent_id": None, "src": " ".join(line.split()), "ref": ref,
            "contrastive": contrastive, "swaps": swaps, "reference": ref_name}


def suite_items(plain: Sequence[str], alignments, refs) -> Tuple[List[dict], Counter]:
    """The records (one per line with an item) and the items skipped, by reason."""
    skipped: Counter = Counter()
    records = []
    for k, (line, a) in enumerate(zip(plain, alignments)):
        if a is None:
            continue
        best, items = _line_items(line, a, refs, k, skipped)
        if items:
            rec = _record(k, line, refs[best][0], refs[best][1][k], items)
            if rec["contrastive"]:
                records.append(rec)
    return records, skipped


def build_suite(source: str, dp_source: str, refs: Sequence[str], docids: Optional[str] = None,
                strict: bool = False) -> Tuple[List[dict], Counter, dict]:
    """``(records, skipped items by reason, counts)`` for the inputs of
    ``ctx-dp-eval``; no record at all is an :class:`InputError`."""
    from ctx_fairseq.data.docids import DocFileError, read_docid_lines
    from ctx_fairseq.eval.pronouns.dp_eval import _same_length, analyse_sources, read_references

    plain, alignments, skipped_lines, insertions = analyse_sources(source, dp_source, strict)
    references = read_references(refs, source, len(plain))
    ids = None
    if docids is not None:
        try:
            ids = read_docid_lines(docids)
        except DocFileError as err:
            raise InputError(f"--docids {err}") from None
        _same_length(docids, ids, source, len(plain), "document id")
    records, skipped = suite_items(plain, alignments, references)
    if not records:
        raise InputError(f"no sentence of {source} / {dp_source} has an item for the suite "
                         f"(skipped items: {dict(skipped) or 'none'}); expected a pronoun the "
                         "+DP source restores, one token of its class in a reference")
    if ids is not None:
        for rec in records:
            k = rec["id"]
            first = k
            while first > 0 and ids[first - 1] == ids[k]:
                first -= 1
            rec["doc_id"], rec["sent_index"] = ids[k], k - first
    counts = {"lines": len(plain), "skipped_lines": len(skipped_lines),
              "non_pronoun_insertions": len(insertions)}
    return records, skipped, counts


def write_suite(records: Sequence[dict], out: str) -> None:
    """JSON Lines, written whole or not at all."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".part"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, out)


# ---------------------------------------------------------------------- report
def _read_json(path: str, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as err:
        raise InputError(f"{what} {path}: cannot read ({err.strerror or err})") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{what} {path}:{err.lineno}: not valid JSON ({err.msg})") from None


def read_suite_records(path: str) -> List[Tuple[int, dict]]:
    """``(line number, record)`` of a suite written by ``build``."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise InputError(f"--suite {path}: cannot read ({err.strerror or err})") from None
    out = []
    for n, rec in json_lines(path, lines, InputError):
        if not isinstance(rec, dict) or "swaps" not in rec or "contrastive" not in rec:
            raise InputError(f"{path}:{n}: expected a record of ctx-dp-suite build (with 'swaps')")
        out.append((n, rec))
    if not out:
        raise InputError(f"{path}: empty suite")
    return out


def _outcome(margin: float, tol: float) -> str:
    return "correct" if margin > tol else "tie" if margin >= -tol else "wrong"


def _tally(groups: Dict[str, Counter]) -> Dict[str, dict]:
    return {k: {"n": sum(v.values()), "correct": v["correct"], "ties": v["tie"],
                "wrong": v["wrong"],
                "accuracy": v["correct"] / sum(v.values()) if sum(v.values()) else None}
            for k, v in groups.items()}


def _score_run(records, path: str) -> dict:
    """One scorer JSON read against the suite's records (module docstring)."""
    result = _read_json(path, "--scores")
    examples = result.get("examples") if isinstance(result, dict) else None
    if not isinstance(examples, list) or len(examples) != len(records):
        raise InputError(f"{path}: {len(examples) if isinstance(examples, list) else 'no'} "
                         f"examples, the suite has {len(records)}; expected "
                         "ctx-score-contrastive's JSON of this suite")
    tol = float(result.get("tie_tolerance", 1e-4))
    by_class, by_kind, by_swap = {}, {}, {}
    for (lineno, rec), ex in zip(records, examples):
        scores = ex.get("scores") or []
        if not str(ex.get("where", "")).endswith(f":{lineno}") or \
                len(scores) != 1 + len(rec["swaps"]):
            raise InputError(f"{path}: example {ex.get('where')!r} does not match line {lineno} "
                             "of the suite; expected ctx-score-contrastive's JSON of this suite")
        items: Dict[Tuple[str, int], float] = {}
        for j, sw in enumerate(rec["swaps"]):
            margin = scores[0] - scores[j + 1]
            key = (sw["class"], sw["token_index"])
            items[key] = min(items.get(key, margin), margin)
            by_kind.setdefault(sw["kind"], Counter())[_outcome(margin, tol)] += 1
            by_swap.setdefault(f"{sw['class']}>{sw['to']}", Counter())[_outcome(margin, tol)] += 1
        for (cls, _), margin in items.items():
            for key in (cls, "all"):
                by_class.setdefault(key, Counter())[_outcome(margin, tol)] += 1
    order = {c: i for i, c in enumerate((*CLASSES, "all"))}
    return {"scores": path, "tie_tolerance": tol,
            "items": _tally({"all": by_class.get("all", Counter())})["all"],
            "by_class": _tally({k: by_class[k] for k in sorted(by_class, key=order.get)
                                if k != "all"}),
            "by_kind": _tally({k: by_kind[k] for k in KINDS if k in by_kind}),
            "by_swap": _tally(dict(sorted(by_swap.items())))}


def report_suite(suite: str, scores: Sequence[str]) -> dict:
    records = read_suite_records(suite)
    return {"suite": suite, "runs": [_score_run(records, p) for p in scores]}


def format_report(rep: dict) -> str:
    runs = rep["runs"]
    head = "| group | n | " + " | ".join(f"{os.path.basename(r['scores'])} %" for r in runs) + " |"
    lines = ["accuracy: items by class (the reference above every candidate of the item), "
             "candidates by kind (pairwise)", "", head, "|---|---:|" + "---:|" * len(runs)]

    def row(name, get):
        first = get(runs[0])
        cells = [("-" if get(r)["accuracy"] is None else f"{100 * get(r)['accuracy']:.1f}")
                 for r in runs]
        lines.append(f"| {name} | {first['n']} | " + " | ".join(cells) + " |")

    row("items", lambda r: r["items"])
    for c in runs[0]["by_class"]:
        row(f"class {c}", lambda r, c=c: r["by_class"][c])
    for k in runs[0]["by_kind"]:
        row(f"swap {k}", lambda r, k=k: r["by_kind"][k])
    return "\n".join(lines)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="A contrastive pronoun suite from the "
                                "pronouns a +DP source restores (toy format of "
                                "ctx-score-contrastive), and its report by class and swap kind.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the suite")
    b.add_argument("--source", required=True, help="plain source of the split (as binarized)")
    b.add_argument("--dp-source", required=True, help="the same with the pronouns restored")
    b.add_argument("--refs", required=True, nargs="+",
                   help="references: plain text or an SGML refset")
    b.add_argument("--docids", help="the split's document ids (records name their document)")
    b.add_argument("--out", required=True, help="the suite (JSON Lines)")
    b.add_argument("--strict", action="store_true",
                   help="a +DP line without all of its plain line's characters is an error")
    r = sub.add_parser("report", help="accuracy by class and swap kind from scorer JSONs")
    r.add_argument("--suite", required=True, help="the suite written by build")
    r.add_argument("--scores", required=True, nargs="+",
                   help="ctx-score-contrastive's contrastive_NAME.json of the suite, one or more")
    r.add_argument("--json", help="write the report here too")
    return p


def cli_main(argv: Optional[Sequence[str]] = None) -> None:
    args = get_parser().parse_args(argv)
    try:
        if args.cmd == "build":
            records, skipped, counts = build_suite(args.source, args.dp_source, args.refs,
                                                   args.docids, args.strict)
            write_suite(records, args.out)
        else:
            rep = report_suite(args.suite, args.scores)
            if args.json:
                os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
                with open(args.json + ".part", "w", encoding="utf-8") as f:
                    f.write(json.dumps(rep, indent=1) + "\n")
                os.replace(args.json + ".part", args.json)
    except (InputError, OSError) as err:
        sys.exit(f"{PROG} {args.cmd}: error: {err}")
    if args.cmd == "report":
        print(format_report(rep))
        return
    swaps = [s for r in records for s in r["swaps"]]
    items = Counter(s["class"] for r in records for s in
                    {(s["class"], s["token_index"]): s for s in r["swaps"]}.values())
    print(f"{PROG}: {len(records)} records ({sum(items.values())} items) from {counts['lines']} "
          f"lines ({counts['skipped_lines']} skipped) -> {args.out}")
    print("  items by class: " + ", ".join(f"{c} {items[c]}" for c in CLASSES if items[c]))
    print("  candidates by kind: " + ", ".join(
        f"{k} {sum(s['kind'] == k for s in swaps)}" for k in KINDS))
    print("  items skipped: " + (", ".join(f"{n} {SKIP_REASONS[r]}" for r, n in
                                           skipped.most_common()) or "none"))


if __name__ == "__main__":
    cli_main()
