"""ctx-dp-eval: how well a translation renders the pronouns a pro-drop source
leaves out (issue 38).

    ctx-dp-eval --source S --dp-source D --refs R [R ...] --hyp H --json OUT \\
        [--hyp-b H2] [--strict] [--bootstrap 1000] [--seed 0] [--confidence 0.95]

``S`` is the plain source and ``D`` the same with the dropped pronouns restored
(TVsub's ``*_oracle_dp_src``; the recipe's ``docs/test.zh`` and
``docs/test.dp.zh``), one sentence a line. Each ``R`` is plain text (one
reference, one line a sentence) or an SGML refset (``<refset>`` with
``<DOC><seg id=N>``: all its references, read by
:func:`ctx_fairseq.prep.tvsub.parse_refset`). ``H`` is plain text or
``fairseq-generate`` output (its ``D-`` lines where it has them, else its
``H-`` lines; ids are lines of ``S``, 0-based; generate with ``--remove-bpe``:
BPE markers are an error). The restored pronouns, their classes and the
English normalisation are those of :mod:`ctx_fairseq.eval.pronouns.dropped`.

Definitions, per sentence ``s`` and class ``c`` (``overt``: the plain
source's Chinese pronouns of ``c``; ``dropped``: the pronouns of ``c`` that
``D`` restores; ``ref_k``, ``hyp``: English pronouns of ``c`` in reference
``k`` and in the hypothesis):

items
    ``min(dropped, max(0, max_k(ref_k - overt)))``: a restored pronoun is an
    item only where some reference supports it, that is has more pronouns of
    its class than the source has overtly (one more per item). The others are
    *unsupported* (the translator used a noun, a name, another construction),
    counted per class and not scored.
credit
    ``min(max(hyp - overt, 0), items)``: the hypothesis's pronouns of the
    class beyond the overt ones, at most the items.
recall
    sum of credit / sum of items: overall, per class, and overall without
    ``3sg-n`` (Chinese 它 is the most often restored pronoun, and an
    expletive English *it* makes it nearly free).
precision
    BLEU-style clipping: ``matched = min(hyp, max_k ref_k)``, precision = sum
    of matched / sum of hyp, over all sentences (``precision_all``) and over
    the sentences where ``D`` restores no pronoun (``precision_non_dp``): a
    system that puts pronouns everywhere loses precision there.

A DP sentence (``dp_sentences``) is one where ``D`` restores at least one
pronoun (supported or not). Lines whose +DP line does not hold every
character of the plain line in order are skipped (listed in
``skipped_lines``) and left out of every figure; ``--strict`` makes the first
one an error. Inserted pieces that are no pronoun are listed in
``non_pronoun_insertions`` and not scored.

Intervals
    Percentile bootstrap over sentences (``--bootstrap`` resamples, default
    1000, ``--seed``, ``--confidence`` 0.95): recall over the sentences with
    items (of the class, for a class), precision over its sentences; each
    statistic draws from its own seeded generator, so the figures do not
    depend on which others are computed.

Two systems (``--hyp-b``)
    The JSON gets ``system_b`` (the same scores) and ``comparison``: an
    exact McNemar test on the items (an item of ``(s, c)`` is right for a
    system when its credit reaches it: the first ``credit`` items of the
    pair are right, so ``A`` alone is right on ``max(0, credit_A -
    credit_B)`` of them; the two-sided p-value is the binomial probability,
    with p = 1/2, of a split of the discordant items as uneven as the one
    seen; no scipy), and a paired bootstrap over the sentences with items
    (both systems on the same resamples; the interval of ``recall_B -
    recall_A``, and the two-sided p-value ``2 * min(P(delta <= 0), P(delta >=
    0))``, at most 1), overall and without ``3sg-n``.

Bad input is one line, ``ctx-dp-eval: error: FILE...``, naming the file (and
the line where one is at fault): files of different lengths, a hypothesis
file without some ids, an unreadable file.
"""

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from math import comb
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ctx_fairseq.errors import InputError
from ctx_fairseq.eval.pronouns.dropped import CLASSES, NEUTER, align, english_counts, zh_counts

__all__ = ["DPData", "read_lines", "read_references", "read_hypotheses", "analyse_sources",
           "build_data", "score_system", "compare_systems", "mcnemar_exact", "evaluate",
           "cli_main"]

PROG = "ctx-dp-eval"
_GENERATE_LINE = re.compile(r"^[STHDP]-\d+\t")


def read_lines(path: str, what: str) -> List[str]:
    """The lines of a UTF-8 text file; a problem is an :class:`InputError`
    naming the option and the file."""
    from ctx_fairseq.prep.tvsub import TvsubError, read_lines as tvsub_lines

    try:
        return tvsub_lines(path)
    except TvsubError as err:
        raise InputError(f"{what} {err}") from None


def _same_length(path: str, lines: Sequence[str], source: str, n: int, what: str) -> None:
    if len(lines) != n:
        where = (f"{path}:{len(lines) + 1}: no {what} for line {len(lines) + 1} of {source}"
                 if len(lines) < n else f"{path}:{n + 1}: a line beyond the last of {source}")
        raise InputError(f"{where} ({path} has {len(lines)} lines, {source} {n}); expected "
                         f"one {what} per source line")


def _is_sgml(lines: Sequence[str]) -> bool:
    head = next((x.strip() for x in lines if x.strip()), "")
    return head.lower().startswith(("<refset", "<doc", "<tstset", "<srcset"))


def read_references(paths: Sequence[str], source: str, n: int) -> List[Tuple[str, List[str]]]:
    """``(name, lines)`` of every reference: a plain file is one, an SGML
    refset all of its ``sysid`` s (``FILE:SYSID``). Each must have ``n`` lines."""
    from ctx_fairseq.prep.tvsub import TvsubError, parse_refset

    refs: List[Tuple[str, List[str]]] = []
    for path in paths:
        lines = read_lines(path, "--refs")
        if _is_sgml(lines):
            try:
                refset = parse_refset(path)
            except TvsubError as err:
                raise InputError(f"--refs {err}") from None
            for sysid, ref in zip(refset.sysids, refset.refs):
                if len(ref) != n:
                    raise InputError(f"{path}: reference {sysid or '-'} has {len(ref)} segments, "
                                     f"{source} {n} lines; expected one segment per source line")
                refs.append((f"{path}:{sysid}", ref))
        else:
            _same_length(path, lines, source, n, "reference")
            refs.append((path, lines))
    return refs


def read_hypotheses(path: str, source: str, n: int) -> Tuple[List[str], str]:
    """``(hypotheses, kind)``: plain text (one line a sentence) or
    fairseq-generate output (ids 0..n-1, each once; ``D-`` lines where there
    are any, else ``H-``)."""
    from ctx_fairseq.generate_output import lines_with_bpe, read_generate_output

    lines = read_lines(path, "--hyp")
    if not any(_GENERATE_LINE.match(x) for x in lines):
        _same_length(path, lines, source, n, "hypothesis")
        hyps, kind = lines, "plain"
    else:
        try:
            out = read_generate_output(path, need_references=False)
        except ValueError as err:
            raise InputError(str(err)) from None
        got = set(out.ids)
        missing = [i for i in range(n) if i not in got]
        if missing:
            raise InputError(f"{path}: no hypothesis for sentence id {missing[0]} (line "
                             f"{missing[0] + 1} of {source}; {len(missing)} of {n} ids missing); "
                             "expected fairseq-generate output of the whole split")
        extra = [i for i in out.ids if i >= n]
        if extra:
            raise InputError(f"{path}: sentence id {extra[0]} is beyond {source} ({n} lines, ids "
                             f"0..{n - 1}); expected the output of this split")
        hyps = out.detokenized if out.detokenized is not None else out.hypotheses
        kind = "fairseq-generate " + ("D- lines" if out.detokenized is not None else "H- lines")
    bpe = lines_with_bpe(hyps)
    if bpe:
        scheme, idx = next(iter(bpe.items()))
        raise InputError(f"{path}: {scheme} BPE markers in the hypothesis of line {idx[0] + 1} "
                         f"({len(idx)} lines); expected words (fairseq-generate --remove-bpe)")
    return hyps, kind


@dataclass
class DPData:
    """Per sentence and class (columns in :data:`CLASSES` order): ``overt``,
    ``dropped``, ``refmax`` (the largest reference count), ``items``
    (supported); ``usable`` the lines not skipped; the reports' lists."""
    overt: np.ndarray
    dropped: np.ndarray
    refmax: np.ndarray
    items: np.ndarray
    usable: np.ndarray
    skipped: List[dict]
    insertions: List[dict]
    references: List[str]


def analyse_sources(source: str, dp_source: str, strict: bool = False):
    """``(plain lines, alignments, skipped, insertions)``: the alignment of
    each line pair (None: skipped), the skipped lines and the non-pronoun
    insertions as report entries (1-based lines)."""
    plain = read_lines(source, "--source")
    dp = read_lines(dp_source, "--dp-source")
    if not plain:
        raise InputError(f"{source}: empty file; expected one sentence a line")
    _same_length(dp_source, dp, source, len(plain), "+DP line")
    alignments, skipped, insertions = [], [], []
    for k, (p, d) in enumerate(zip(plain, dp), 1):
        a = align(p, d)
        if a is None:
            msg = (f"{dp_source}:{k}: the +DP line does not hold every character of line {k} "
                   f"of {source} in order")
            if strict:
                raise InputError(msg + " (--strict)")
            skipped.append({"line": k, "reason": msg, "source": p, "dp_source": d})
        else:
            insertions += [{"line": k, "text": x.text, "token": x.token} for x in a.other]
        alignments.append(a)
    return plain, alignments, skipped, insertions


def build_data(source: str, dp_source: str, refs: Sequence[str], strict: bool = False
               ) -> Tuple[DPData, int]:
    """The counts of every sentence (:class:`DPData`) and the sentence count."""
    plain, alignments, skipped, insertions = analyse_sources(source, dp_source, strict)
    n = len(plain)
    references = read_references(refs, source, n)
    cols = len(CLASSES)
    overt = np.array([[zh_counts(p)[c] for c in CLASSES] for p in plain], dtype=np.int64)
    dropped = np.zeros((n, cols), dtype=np.int64)
    for k, a in enumerate(alignments):
        if a is not None:
            dropped[k] = [a.dropped()[c] for c in CLASSES]
    ref_counts = np.array([[[english_counts(line)[c] for c in CLASSES] for line in ref]
                           for _, ref in references], dtype=np.int64)
    refmax = ref_counts.max(axis=0)
    items = np.minimum(dropped, np.clip(refmax - overt, 0, None))
    usable = np.array([a is not None for a in alignments])
    return DPData(overt, dropped, refmax, items, usable, skipped, insertions,
                  [name for name, _ in references]), n


def hypothesis_counts(hyps: Sequence[str]) -> np.ndarray:
    return np.array([[english_counts(h)[c] for c in CLASSES] for h in hyps], dtype=np.int64)


# ------------------------------------------------------------------- statistics
def _ratio(num: float, den: float) -> Optional[float]:
    return float(num) / float(den) if den else None


def _resample_sums(n: int, resamples: int, seed: int):
    """Seeded bootstrap index blocks over ``n`` rows (at most 100 resamples a block)."""
    rng = np.random.default_rng(seed)
    done = 0
    while done < resamples:
        size = min(100, resamples - done)
        yield rng.integers(0, n, size=(size, n))
        done += size


def bootstrap_interval(num: np.ndarray, den: np.ndarray, resamples: int, seed: int,
                       level: float) -> Optional[List[float]]:
    """Percentile interval of ``sum(num) / sum(den)`` over rows drawn with
    replacement (resamples with a zero denominator are left out)."""
    if len(num) == 0 or den.sum() == 0 or resamples < 1:
        return None
    values = []
    for idx in _resample_sums(len(num), resamples, seed):
        d, m = den[idx].sum(axis=1), num[idx].sum(axis=1)
        values.append(m[d > 0] / d[d > 0])
    v = np.concatenate(values)
    lo, hi = np.percentile(v, [50 * (1 - level), 50 * (1 + level)])
    return [float(lo), float(hi)]


def _stat(num: np.ndarray, den: np.ndarray, rows: np.ndarray, boot: dict) -> dict:
    """Value, numerator, denominator, rows and interval of a ratio of per-row sums."""
    num, den = num[rows], den[rows]
    return {"value": _ratio(num.sum(), den.sum()), "numerator": int(num.sum()),
            "denominator": int(den.sum()), "sentences": int(rows.sum()),
            "interval": bootstrap_interval(num, den, boot["resamples"], boot["seed"],
                                           boot["level"])}


def _class_scores(data: DPData, credit, matched, hyp, non_dp, boot) -> Dict[str, dict]:
    out = {}
    for j, c in enumerate(CLASSES):
        rows = data.usable & (data.items[:, j] > 0)
        rec = _stat(credit[:, j], data.items[:, j], rows, boot)
        prec = _stat(matched[:, j], hyp[:, j], data.usable, boot)
        prec_non = _stat(matched[:, j], hyp[:, j], non_dp, boot)
        out[c] = {"restored": int(data.dropped[data.usable, j].sum()),
                  "items": rec["denominator"],
                  "unsupported": int((data.dropped - data.items)[data.usable, j].sum()),
                  "credit": rec["numerator"], "recall": rec["value"],
                  "recall_interval": rec["interval"],
                  "hypothesis_pronouns": prec["denominator"], "matched": prec["numerator"],
                  "precision": prec["value"], "precision_interval": prec["interval"],
                  "precision_non_dp": prec_non["value"]}
    return out


def score_system(data: DPData, hyp: np.ndarray, boot: dict) -> dict:
    """Recall, precision and their intervals (module docstring) of one system."""
    credit = np.minimum(np.clip(hyp - data.overt, 0, None), data.items)
    matched = np.minimum(hyp, data.refmax)
    keep = np.array([c != NEUTER for c in CLASSES])
    non_dp = data.usable & (data.dropped.sum(axis=1) == 0)
    with_items = data.usable & (data.items.sum(axis=1) > 0)
    with_items_nn = data.usable & (data.items[:, keep].sum(axis=1) > 0)
    rec = _stat(credit.sum(axis=1), data.items.sum(axis=1), with_items, boot)
    rec_nn = _stat(credit[:, keep].sum(axis=1), data.items[:, keep].sum(axis=1), with_items_nn,
                   boot)
    p_all = _stat(matched.sum(axis=1), hyp.sum(axis=1), data.usable, boot)
    p_non = _stat(matched.sum(axis=1), hyp.sum(axis=1), non_dp, boot)
    return {
        "recall": rec["value"], "recall_interval": rec["interval"], "credit": rec["numerator"],
        "recall_without_neuter": rec_nn["value"],
        "recall_without_neuter_interval": rec_nn["interval"],
        "precision_all": p_all["value"], "precision_all_interval": p_all["interval"],
        "hypothesis_pronouns": p_all["denominator"], "matched": p_all["numerator"],
        "precision_non_dp": p_non["value"], "precision_non_dp_interval": p_non["interval"],
        "hypothesis_pronouns_non_dp": p_non["denominator"],
        "by_class": _class_scores(data, credit, matched, hyp, non_dp, boot),
    }


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: ``2 * P(X <= min(b, c))``, ``X ~
    Binomial(b + c, 1/2)``, at most 1 (1 when there is no discordant item)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def _paired_bootstrap(credit_a, credit_b, items, rows, boot) -> dict:
    ca, cb, it = credit_a[rows], credit_b[rows], items[rows]
    observed = _ratio(cb.sum() - ca.sum(), it.sum())
    if not rows.any() or it.sum() == 0 or boot["resamples"] < 1:
        return {"delta": observed, "interval": None, "p_value": None}
    deltas = []
    for idx in _resample_sums(len(it), boot["resamples"], boot["seed"]):
        d = it[idx].sum(axis=1)
        deltas.append((cb[idx].sum(axis=1) - ca[idx].sum(axis=1))[d > 0] / d[d > 0])
    v = np.concatenate(deltas)
    lo, hi = np.percentile(v, [50 * (1 - boot["level"]), 50 * (1 + boot["level"])])
    p = min(1.0, 2 * min(float(np.mean(v <= 0)), float(np.mean(v >= 0))))
    return {"delta": observed, "interval": [float(lo), float(hi)], "p_value": p}


def compare_systems(data: DPData, hyp_a: np.ndarray, hyp_b: np.ndarray, boot: dict) -> dict:
    """McNemar on the items and the paired bootstrap of recall (module
    docstring), overall and without ``3sg-n``; B minus A."""
    out = {}
    keep = np.array([c != NEUTER for c in CLASSES])
    use = data.usable[:, None]
    credit_a = np.minimum(np.clip(hyp_a - data.overt, 0, None), data.items) * use
    credit_b = np.minimum(np.clip(hyp_b - data.overt, 0, None), data.items) * use
    for name, cols in (("all", np.ones(len(CLASSES), dtype=bool)), ("without_neuter", keep)):
        items, ca, cb = (data.items * use)[:, cols], credit_a[:, cols], credit_b[:, cols]
        only_a, only_b = int(np.clip(ca - cb, 0, None).sum()), int(np.clip(cb - ca, 0, None).sum())
        rows = data.usable & (items.sum(axis=1) > 0)
        out[name] = {"items": int(items.sum()), "only_a": only_a, "only_b": only_b,
                     "both": int(np.minimum(ca, cb).sum()),
                     "mcnemar_p": mcnemar_exact(only_a, only_b),
                     "paired_bootstrap": _paired_bootstrap(ca.sum(axis=1), cb.sum(axis=1),
                                                           items.sum(axis=1), rows, boot)}
    return out


def evaluate(source: str, dp_source: str, refs: Sequence[str], hyp: str,
             hyp_b: Optional[str] = None, strict: bool = False,
             boot: Optional[dict] = None) -> dict:
    """The whole report (the JSON of ``ctx-dp-eval``)."""
    boot = boot or {"resamples": 1000, "seed": 0, "level": 0.95}
    if not 0 < boot["level"] < 1:
        raise InputError(f"--confidence {boot['level']}: expected a number between 0 and 1")
    if boot["resamples"] < 0:
        raise InputError(f"--bootstrap {boot['resamples']}: expected a number >= 0")
    data, n = build_data(source, dp_source, refs, strict)
    hyps, kind = read_hypotheses(hyp, source, n)
    counts_a = hypothesis_counts(hyps)
    u = data.usable
    report = {
        "source": source, "dp_source": dp_source, "references": data.references,
        "hypothesis": hyp, "hypothesis_format": kind, "sentences": n,
        "scored_sentences": int(u.sum()), "skipped": len(data.skipped),
        "skipped_lines": data.skipped,
        "dp_sentences": int((u & (data.dropped.sum(axis=1) > 0)).sum()),
        "item_sentences": int((u & (data.items.sum(axis=1) > 0)).sum()),
        "restored": int(data.dropped[u].sum()), "items": int(data.items[u].sum()),
        "unsupported_items": int((data.dropped - data.items)[u].sum()),
        "overt_source_pronouns": int(data.overt[u].sum()),
        "non_pronoun_insertions": len(data.insertions),
        "non_pronoun_insertion_list": data.insertions,
        **score_system(data, counts_a, boot),
        "bootstrap": {**boot, "unit": "sentence"},
    }
    if hyp_b is not None:
        hyps_b, kind_b = read_hypotheses(hyp_b, source, n)
        counts_b = hypothesis_counts(hyps_b)
        report["system_b"] = {"hypothesis": hyp_b, "hypothesis_format": kind_b,
                              **score_system(data, counts_b, boot)}
        report["comparison"] = compare_systems(data, counts_a, counts_b, boot)
    return report


# ---------------------------------------------------------------------- output
def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _interval(iv: Optional[Sequence[float]]) -> str:
    return "" if not iv else f" [{100 * iv[0]:.1f}, {100 * iv[1]:.1f}]"


def format_report(r: dict) -> str:
    """The text summary printed by the command."""
    lines = [
        f"{r['sentences']} sentences, {r['skipped']} skipped; {r['dp_sentences']} with a restored "
        f"pronoun ({r['restored']} restored: {r['items']} items supported by a reference, "
        f"{r['unsupported_items']} unsupported); {r['non_pronoun_insertions']} non-pronoun "
        "insertions",
        f"recall {_pct(r['recall'])}{_interval(r['recall_interval'])}, without 3sg-n "
        f"{_pct(r['recall_without_neuter'])}{_interval(r['recall_without_neuter_interval'])}",
        f"precision {_pct(r['precision_all'])}{_interval(r['precision_all_interval'])}, on "
        f"sentences without a restored pronoun {_pct(r['precision_non_dp'])}"
        f"{_interval(r['precision_non_dp_interval'])}",
        "", "| class | items | unsupported | recall % | precision % |", "|---|---:|---:|---:|---:|"]
    for c, v in r["by_class"].items():
        lines.append(f"| {c} | {v['items']} | {v['unsupported']} | {_pct(v['recall'])} | "
                     f"{_pct(v['precision'])} |")
    if "comparison" in r:
        for name, v in r["comparison"].items():
            pb = v["paired_bootstrap"]
            lines.append(f"B - A ({name}): only A {v['only_a']}, only B {v['only_b']}, McNemar "
                         f"p = {v['mcnemar_p']:.4g}; recall delta {_pct(pb['delta'])}"
                         f"{_interval(pb['interval'])}, bootstrap p = "
                         f"{'-' if pb['p_value'] is None else format(pb['p_value'], '.4g')}")
    return "\n".join(lines)


def write_json(report: dict, path: str) -> None:
    """The report, written whole or not at all."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".part"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Recall and precision of the pronouns a pro-drop source leaves "
        "out (the +DP source restores them); definitions in the module docstring "
        "(ctx_fairseq/eval/pronouns/dp_eval.py) and docs/evaluation.md.")
    p.add_argument("--source", required=True, metavar="S", help="plain source, one sentence a line")
    p.add_argument("--dp-source", required=True, metavar="D",
                   help="the same with the dropped pronouns restored (TVsub *_oracle_dp_src)")
    p.add_argument("--refs", required=True, nargs="+", metavar="R",
                   help="references: plain text (one each) or an SGML refset (all its references)")
    p.add_argument("--hyp", required=True, metavar="H",
                   help="translation: plain text or fairseq-generate output")
    p.add_argument("--hyp-b", metavar="H2", help="a second system: McNemar and paired bootstrap")
    p.add_argument("--json", required=True, metavar="OUT", help="the report (JSON)")
    p.add_argument("--strict", action="store_true",
                   help="a +DP line without all of its plain line's characters is an error")
    p.add_argument("--bootstrap", type=int, default=1000, help="resamples (default 1000; 0: none)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--confidence", type=float, default=0.95, help="interval level (0.95)")
    return p


def cli_main(argv: Optional[Sequence[str]] = None) -> None:
    args = get_parser().parse_args(argv)
    boot = {"resamples": args.bootstrap, "seed": args.seed, "level": args.confidence}
    try:
        report = evaluate(args.source, args.dp_source, args.refs, args.hyp, args.hyp_b,
                          args.strict, boot)
        write_json(report, args.json)
    except (InputError, OSError) as err:
        sys.exit(f"{PROG}: error: {err}")
    print(format_report(report))
    for s in report["skipped_lines"]:
        print(f"skipped: {s['reason']}")
    print(f"-> {args.json}")


if __name__ == "__main__":
    cli_main()
