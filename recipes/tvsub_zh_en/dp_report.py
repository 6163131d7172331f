"""results-dp.md / results-dp.json of the dropped-pronoun study (dp_study.sh):
every seed's run of the TVsub recipe read together.

    python recipes/tvsub_zh_en/dp_report.py --workdir DIR [--models M ...]
        [--resamples 1000] [--seed 0] [--confidence 0.95]

``DIR/seed-N`` is one run per training seed (``run.sh --study``'s work
directory ``DIR/seed-N/study``, or the GPU mode's ``DIR/seed-N``). Per model:
the mean over seeds, each seed's value and an interval of

* BLEU (every reference, sacreBLEU ``--tokenize none``, as run.sh scores it),
* DP recall (overall, without ``3sg-n``, per class) and pronoun precision (all
  sentences, sentences without a restored pronoun), ctx-dp-eval's definitions
  recomputed per sentence from its own functions
  (:mod:`ctx_fairseq.eval.pronouns.dp_eval`) on the test split,
* contrastive accuracy on ctx-dp-suite's suite (items, by class; by swap
  kind, the 1st/2nd-person swaps on their own), with the true context and with
  shuffled context (the sentence-level models: no context),
* CXMI against the empty and against shuffled context (the CXMI split: the
  held-out episodes in the study) and the P-CXMI of the English pronouns of the
  test split's sentences with a restored pronoun,

and paired comparisons of each model against the transformer.

The seed-and-sentence bootstrap (:func:`seed_sentence_bootstrap`)
    Each resample draws the seeds with replacement (as many as there are)
    and the sentences of the split with replacement (as many as there are;
    one draw shared by the drawn seeds: every run translated the same
    sentences), computes the figure of each drawn seed on the drawn sentences
    (a ratio of sums, e.g. recall = credit / items, or BLEU from its n-gram
    statistics) and averages over the drawn seeds. The interval is the
    percentile interval of those averages; resamples whose figure is
    undefined (no item drawn) are left out. It holds both the run-to-run
    spread (which training seed) and the sampling of sentences; with one seed
    it is the sentence bootstrap alone. The point value is the mean over
    seeds of each seed's figure on every sentence. Units are sentences
    (contrastive: records, one per sentence), also on the held-out split,
    whose sentences are grouped in 24 documents: sentences of a document are
    not independent, so those intervals are if anything too narrow.

Paired comparisons against the transformer
    Per seed, ctx-dp-eval's exact McNemar test on the items and its paired
    bootstrap over sentences (``results/M/dp_paired.json``), and run.sh's
    sacreBLEU paired bootstrap of BLEU (``paired_test.json``). Pooled over
    seeds: the same seed-and-sentence bootstrap of the difference (model
    minus transformer of the same seed: the two share their stage-1 model),
    its two-sided p-value ``2 * min(P(delta <= 0), P(delta >= 0))``; and a
    McNemar test of the discordant items summed over seeds, which counts the
    same items once per seed as if independent (optimistic: read the
    bootstrap's p-value, which includes the seeds' spread, first).

With TVsub's dev set split into its two episodes (the checkpoints chosen on
dev-SUB01, the figures on dev-SUB02's 767 sentences), the items of a class are
few, and the intervals are wide; the report says so.
"""

import argparse
import glob
import json
import os
import re
import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SENTENCE_LEVEL = {"sentence", "transformer", "dc", "hybrid"}


# ----------------------------------------------------------------- bootstrap
def _ratio(sums: np.ndarray) -> np.ndarray:
    """The figure of (..., 2) sums: numerator / denominator (nan for 0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sums[..., 1] > 0, sums[..., 0] / np.where(sums[..., 1] > 0,
                                                                  sums[..., 1], 1), np.nan)


def seed_sentence_bootstrap(stats: Sequence[np.ndarray], fn: Callable = _ratio,
                            resamples: int = 1000, seed: int = 0, level: float = 0.95,
                            minus: Optional[Sequence[np.ndarray]] = None) -> Dict:
    """The mean over seeds of ``fn(stats[s].sum(0))`` and its
    seed-and-sentence bootstrap interval (module docstring).

    ``stats``: one ``U x K`` array per seed, row ``u`` the additive statistics
    of unit (sentence) ``u``, the same units in every seed; ``fn`` maps an
    ``R x K`` array of sums to ``R`` figures (nan: undefined). ``minus``: the
    baseline's arrays, seed by seed: the figure is then ``fn(model) -
    fn(baseline)`` on the same draws, and a two-sided p-value is given."""
    stats = [np.asarray(x, dtype=np.float64) for x in stats]
    base = None if minus is None else [np.asarray(x, dtype=np.float64) for x in minus]
    n_seeds, n_units = len(stats), stats[0].shape[0]
    if base is not None and len(base) != n_seeds:
        raise ValueError(f"{len(base)} baseline seeds for {n_seeds} seeds")

    def figures(weights):  # weights: R x U unit counts -> S x R figures
        out = np.stack([fn(weights @ s) for s in stats])
        if base is not None:
            out = out - np.stack([fn(weights @ b) for b in base])
        return out

    per_seed = figures(np.ones((1, n_units)))[:, 0]
    value = float(np.nanmean(per_seed)) if np.isfinite(per_seed).any() else None
    res = {"value": value, "per_seed": [None if not np.isfinite(v) else float(v)
                                        for v in per_seed],
           "seeds": n_seeds, "units": n_units, "interval": None,
           "method": f"seed-and-sentence bootstrap: {resamples} resamples of the {n_seeds} "
                     f"seeds and the {n_units} units, both with replacement, seed {seed}"}
    if n_seeds > 1 and all(np.isfinite(per_seed)):
        res["seed_sd"] = float(np.std(per_seed, ddof=1))
    if n_units == 0 or resamples < 1 or value is None:
        return res
    rng = np.random.default_rng(seed)
    units = rng.integers(0, n_units, size=(resamples, n_units))
    seeds = rng.integers(0, n_seeds, size=(resamples, n_seeds))
    weights = np.zeros((resamples, n_units))
    np.add.at(weights, (np.repeat(np.arange(resamples), n_units), units.ravel()), 1.0)
    per = figures(weights)  # S x R
    draws = per[seeds, np.arange(resamples)[:, None]]  # R x S
    ok = np.isfinite(draws).all(axis=1)
    v = draws[ok].mean(axis=1)
    res["resamples_used"] = int(ok.sum())
    if len(v) == 0:
        return res
    lo, hi = np.percentile(v, [50 * (1 - level), 50 * (1 + level)])
    res["interval"] = [float(lo), float(hi)]
    if base is not None:
        res["p_value"] = min(1.0, 2 * min(float(np.mean(v <= 0)), float(np.mean(v >= 0))))
    return res


# ------------------------------------------------------------------- reading
def seed_dirs(workdir: str) -> Dict[int, str]:
    """``{seed: work directory}``: ``DIR/seed-N/study`` (run.sh --study; ``smoke``: --smoke) or
    ``DIR/seed-N`` (the GPU mode), those with a ``docs/prep.json``."""
    out = {}
    for d in glob.glob(os.path.join(workdir, "seed-*")):
        m = re.fullmatch(r"seed-(\d+)", os.path.basename(d))
        if not m:
            continue
        for w in (os.path.join(d, "study"), os.path.join(d, "smoke"), d):
            if os.path.exists(os.path.join(w, "docs", "prep.json")):
                out[int(m.group(1))] = w
                break
    return dict(sorted(out.items()))


def _load(path):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _refs(work):
    return sorted(glob.glob(os.path.join(work, "docs", "test.ref[0-9]*.en")))


def bleu_stats(work: str, model: str) -> Optional[np.ndarray]:
    """Per sentence sacreBLEU's statistics (hypothesis length, reference
    length, matches 1-4, totals 1-4) of the test translation's H- lines
    against every reference, ``--tokenize none``; None: no translation."""
    from sacrebleu.metrics import BLEU

    from ctx_fairseq.generate_output import read_generate_output

    gen = os.path.join(work, "generate", f"{model}.txt")
    if not os.path.exists(gen):
        return None
    out = read_generate_output(gen, need_references=False)
    hyps = [h for _, h in sorted(zip(out.ids, out.hypotheses))]
    refs = []
    for path in _refs(work):
        with open(path, encoding="utf-8") as f:
            refs.append(f.read().splitlines())
    return np.array(BLEU(tokenize="none")._extract_corpus_statistics(hyps, refs),
                    dtype=np.float64)


def bleu_of(sums: np.ndarray) -> np.ndarray:
    """sacreBLEU's corpus BLEU (default smoothing) of each row of summed statistics."""
    from sacrebleu.metrics import BLEU

    rows = np.atleast_2d(sums)
    return np.array([BLEU.compute_bleu(r[2:6].tolist(), r[6:10].tolist(), int(r[0]), int(r[1]),
                                       smooth_method="exp").score for r in rows])


class DPSplit:
    """The test split's +DP analysis (ctx-dp-eval's per-sentence counts) of
    one work directory."""

    def __init__(self, work: str):
        from ctx_fairseq.eval.pronouns.dp_eval import build_data

        docs = os.path.join(work, "docs")
        self.data, self.n = build_data(os.path.join(docs, "test.zh"),
                                       os.path.join(docs, "test.dp.zh"), _refs(work))
        d = self.data
        self.dp = d.usable & (d.dropped.sum(axis=1) > 0)

    def stats(self, hyp_path: str, n: int) -> Dict[str, tuple]:
        """``{figure: (U x 2 stats, rows)}`` of one translation: recall,
        recall without 3sg-n, per class, precision (all, non-DP)."""
        from ctx_fairseq.eval.pronouns.dp_eval import hypothesis_counts, read_hypotheses
        from ctx_fairseq.eval.pronouns.dropped import CLASSES, NEUTER

        d = self.data
        hyps, _ = read_hypotheses(hyp_path, "the test split", n)
        hyp = hypothesis_counts(hyps)
        use = d.usable[:, None]
        credit = np.minimum(np.clip(hyp - d.overt, 0, None), d.items) * use
        items = d.items * use
        matched = np.minimum(hyp, d.refmax)
        keep = np.array([c != NEUTER for c in CLASSES])
        non_dp = d.usable & (d.dropped.sum(axis=1) == 0)
        out = {
            "recall": (np.stack([credit.sum(1), items.sum(1)], 1),
                       d.usable & (items.sum(1) > 0)),
            "recall_without_neuter": (np.stack([credit[:, keep].sum(1), items[:, keep].sum(1)], 1),
                                      d.usable & (items[:, keep].sum(1) > 0)),
            "precision_all": (np.stack([matched.sum(1), hyp.sum(1)], 1), d.usable),
            "precision_non_dp": (np.stack([matched.sum(1), hyp.sum(1)], 1), non_dp),
        }
        for j, c in enumerate(CLASSES):
            out[f"recall {c}"] = (np.stack([credit[:, j], items[:, j]], 1),
                                  d.usable & (items[:, j] > 0))
        return out


def contrastive_stats(work: str, model: str, run: str) -> Optional[Dict[str, np.ndarray]]:
    """Per suite record: ``{group: (correct, n)}`` of the items (all, per
    class: the reference above every candidate of the item by more than the
    scorer's tie tolerance) and of the candidates per swap kind (pairwise),
    from ctx-score-contrastive's JSON of the suite; None: not scored."""
    from ctx_fairseq.eval.pronouns.dp_suite import KINDS, read_suite_records
    from ctx_fairseq.eval.pronouns.dropped import CLASSES

    path = os.path.join(work, "results", model, "dp_suite", f"contrastive_{run}.json")
    scores = _load(path)
    if scores is None:
        return None
    records = read_suite_records(os.path.join(work, "results", "dp_suite.jsonl"))
    tol = float(scores.get("tie_tolerance", 1e-4))
    groups = ["items"] + [f"class {c}" for c in CLASSES] + [f"swap {k}" for k in KINDS]
    out = {g: np.zeros((len(records), 2)) for g in groups}
    for r, ((lineno, rec), ex) in enumerate(zip(records, scores["examples"])):
        sc = ex["scores"]
        if not str(ex.get("where", "")).endswith(f":{lineno}") or len(sc) != 1 + len(rec["swaps"]):
            raise ValueError(f"{path}: example {ex.get('where')!r} does not match line {lineno} "
                             "of the suite")
        margins: Dict[tuple, float] = {}
        for j, sw in enumerate(rec["swaps"]):
            m = sc[0] - sc[j + 1]
            key = (sw["class"], sw["token_index"])
            margins[key] = min(margins.get(key, m), m)
            out[f"swap {sw['kind']}"][r] += (m > tol, 1)
        for (cls, _), m in margins.items():
            out["items"][r] += (m > tol, 1)
            out[f"class {cls}"][r] += (m > tol, 1)
    return out


def cxmi_stats(work: str, model: str, sub: str, cond: str) -> Optional[np.ndarray]:
    """Per sentence of ctx-cxmi's split (``results/M/SUB/tokens.jsonl``): the
    sentence's mean token log-probability difference against ``cond`` and 1
    (the paper's CXMI is their mean), None: not measured."""
    from report import read_tokens

    words = read_tokens(os.path.join(work, "results", model, sub, "tokens.jsonl"))
    if not words or cond not in words[0]["p_cxmi"]:
        return None
    n = max(r["sentence"] for r in words) + 1
    num, tok = np.zeros(n), np.zeros(n)
    for r in words:
        num[r["sentence"]] += r["p_cxmi"][cond]
        tok[r["sentence"]] += r["tokens"][1] - r["tokens"][0]
    return np.stack([num / np.maximum(tok, 1), np.ones(n)], 1)


def dp_pcxmi_stats(work: str, model: str, dp: np.ndarray) -> Optional[np.ndarray]:
    """Per test sentence the P-CXMI (against the empty context) summed over
    the English pronouns of its reference and their count, the sentences
    without a restored pronoun zero."""
    from ctx_fairseq.eval.context_use.cxmi_classes import sentence_sums
    from report import is_pronoun, read_tokens

    words = read_tokens(os.path.join(work, "results", model, "cxmi_test", "tokens.jsonl"))
    if not words:
        return None
    sums, counts = sentence_sums(words, len(dp), "none",
                                 lambda r: bool(dp[r["sentence"]]) and is_pronoun(r["word"]))
    return np.stack([sums, counts], 1)


# ------------------------------------------------------------------- collect
def collect(workdir: str, models: Optional[List[str]] = None, resamples: int = 1000,
            seed: int = 0, level: float = 0.95) -> Dict:
    dirs = seed_dirs(workdir)
    if not dirs:
        raise SystemExit(f"dp_report.py: error: no DIR/seed-N run under {workdir} (expected "
                         "dp_study.sh's work directory)")
    first = next(iter(dirs.values()))
    prep = _load(os.path.join(first, "docs", "prep.json")) or {}
    if models is None:
        models = ["sentence"] + [m for m in ("transformer", "concat", "context_aware", "zhang2018",
                                             "han", "han_enc", "selective", "dc", "hybrid")
                                 if any(os.path.isdir(os.path.join(w, "results", m))
                                        for w in dirs.values())]
    boot = {"resamples": resamples, "seed": seed, "level": level}
    res = {"workdir": os.path.abspath(workdir), "seeds": list(dirs), "models": {},
           "eval_split": prep.get("eval_split"),
           "chosen_on": ", ".join(prep.get("valid", {}).get("documents") or []),
           "reported_on": ", ".join(prep.get("test", {}).get("documents") or []),
           "reported_on_chosen_set": prep.get("reported_on_chosen_set"),
           "test_sentences": prep.get("test", {}).get("sentences"), "bootstrap": boot}
    have_dp = all(os.path.exists(os.path.join(w, "docs", "test.dp.zh")) for w in dirs.values())
    splits = {s: DPSplit(w) for s, w in dirs.items()} if have_dp else {}
    # the same split in every run (the figures are averaged over them)
    if splits:
        ref = next(iter(splits.values()))
        for s, sp in splits.items():
            if sp.n != ref.n or not np.array_equal(sp.data.items, ref.data.items):
                raise SystemExit(f"dp_report.py: error: seed {s}'s test split differs from seed "
                                 f"{next(iter(splits))}'s; expected every seed on one split")
        res["dp_split"] = {"sentences": ref.n, "dp_sentences": int(ref.dp.sum()),
                           "items": int(ref.data.items[ref.data.usable].sum())}
    per = {}  # model -> figure -> {seed: (stats, rows)}
    for m in models:
        figs: Dict[str, Dict[int, tuple]] = {}
        for s, w in dirs.items():
            b = bleu_stats(w, m)
            if b is not None:
                figs.setdefault("bleu", {})[s] = (b, None)
            if splits and os.path.exists(os.path.join(w, "generate", f"{m}.txt")):
                for k, v in splits[s].stats(os.path.join(w, "generate", f"{m}.txt"),
                                            splits[s].n).items():
                    figs.setdefault(k, {})[s] = v
            for run in ("true", "shuffled"):
                cs = contrastive_stats(w, m, run)
                for g, v in (cs or {}).items():
                    figs.setdefault(f"contrastive {run} {g}", {})[s] = (v, v[:, 1] > 0)
            if m not in SENTENCE_LEVEL:
                for cond in ("none", "shuffled"):
                    c = cxmi_stats(w, m, "cxmi", cond)
                    if c is not None:
                        figs.setdefault(f"cxmi vs {cond}", {})[s] = (c, None)
                if splits:
                    p = dp_pcxmi_stats(w, m, splits[s].dp)
                    if p is not None:
                        figs.setdefault("pronoun p-cxmi in DP sentences", {})[s] = (p, None)
        per[m] = figs
        row = {"seeds": sorted({s for v in figs.values() for s in v}), "figures": {}}
        for k, by_seed in figs.items():
            row["figures"][k] = _boot(k, by_seed, boot)
        row["provenance"] = {s: _load(os.path.join(w, "results", m, "checkpoint.json"))
                             for s, w in dirs.items()}
        res["models"][m] = row
    for m, row in res["models"].items():  # (every model's figures first: the transformer's)
        row["paired"] = _paired(dirs, m, per, boot) if m != "transformer" else None
    return res


def _common_rows(by_seed):
    """Seeds with the figure, and their stats restricted to the rows every
    seed keeps (the rows are the split's, the same in every seed)."""
    seeds = sorted(by_seed)
    rows = None
    for s in seeds:
        r = by_seed[s][1]
        if r is not None:
            rows = r if rows is None else rows & r
    stats = [by_seed[s][0] if rows is None else by_seed[s][0][rows] for s in seeds]
    return seeds, stats


def _boot(name, by_seed, boot, minus=None):
    seeds, stats = _common_rows(by_seed)
    fn = bleu_of if name == "bleu" else _ratio
    out = seed_sentence_bootstrap(stats, fn, boot["resamples"], boot["seed"], boot["level"],
                                  minus=minus)
    out["seed_ids"] = seeds
    return out


#: the figures compared with the transformer's, pooled over seeds
PAIRED = ("bleu", "recall", "recall_without_neuter", "precision_all", "precision_non_dp",
          "contrastive true items", "contrastive true swap person-1/2")


def _paired(dirs, m, per, boot):
    from ctx_fairseq.eval.pronouns.dp_eval import mcnemar_exact

    out = {"per_seed": {}, "pooled": {}}
    for s, w in dirs.items():
        pj = _load(os.path.join(w, "results", m, "dp_paired.json"))
        bj = _load(os.path.join(w, "results", m, "paired_test.json"))
        e = {}
        if pj:
            e["dp"] = {k: {"mcnemar_p": v["mcnemar_p"], "only_transformer": v["only_a"],
                           "only_model": v["only_b"], "recall_delta":
                           v["paired_bootstrap"]["delta"], "bootstrap_p":
                           v["paired_bootstrap"]["p_value"], "interval":
                           v["paired_bootstrap"]["interval"]}
                       for k, v in pj["comparison"].items()}
        if bj:
            e["bleu"] = {"delta": bj["sentences"]["delta"], "p": bj["sentences"]["p_value"]}
        if e:
            out["per_seed"][s] = e
    for k in ("all", "without_neuter"):
        got = [e["dp"][k] for e in out["per_seed"].values() if "dp" in e]
        if got:
            a = sum(g["only_transformer"] for g in got)
            b = sum(g["only_model"] for g in got)
            out["pooled"][f"mcnemar {k}"] = {
                "only_transformer": a, "only_model": b, "p": mcnemar_exact(a, b),
                "seeds": len(got),
                "note": "discordant items summed over seeds: the same items counted once per "
                        "seed as if independent (optimistic)"}
    base = per.get("transformer") or {}
    for k in PAIRED:
        mine, theirs = per[m].get(k) or {}, base.get(k) or {}
        seeds = sorted(set(mine) & set(theirs))
        if not seeds:
            continue
        rows = None
        for s in seeds:
            for r in (mine[s][1], theirs[s][1]):
                if r is not None:
                    rows = r if rows is None else rows & r
        a = {s: (theirs[s][0], rows) for s in seeds}
        b = {s: (mine[s][0], rows) for s in seeds}
        _, sa = _common_rows(a)
        out["pooled"][k] = _boot(k, b, boot, minus=sa)
    return out


# -------------------------------------------------------------------- output
def _f(v, scale=100.0, nd=1):
    return "-" if v is None else f"{scale * v:.{nd}f}"


def _cell(fig, scale=100.0, nd=1):
    if not fig or fig.get("value") is None:
        return "-"
    iv = fig.get("interval")
    seeds = ", ".join(_f(v, scale, nd) for v in fig["per_seed"])
    return (_f(fig["value"], scale, nd)
            + ("" if not iv else f" [{_f(iv[0], scale, nd)}, {_f(iv[1], scale, nd)}]")
            + f" ({seeds})")


COLUMNS = [("BLEU", "bleu", 1.0, 2), ("DP recall %", "recall", 100.0, 1),
           ("without 3sg-n %", "recall_without_neuter", 100.0, 1),
           ("precision %", "precision_all", 100.0, 1),
           ("precision, non-DP %", "precision_non_dp", 100.0, 1),
           ("contrastive items %, true ctx", "contrastive true items", 100.0, 1),
           ("shuffled ctx", "contrastive shuffled items", 100.0, 1),
           ("person 1/2 swaps %, true ctx", "contrastive true swap person-1/2", 100.0, 1),
           ("shuffled ctx", "contrastive shuffled swap person-1/2", 100.0, 1),
           ("CXMI vs empty", "cxmi vs none", 1.0, 4),
           ("CXMI vs shuffled", "cxmi vs shuffled", 1.0, 4),
           ("pronoun P-CXMI, DP sentences", "pronoun p-cxmi in DP sentences", 1.0, 4)]


def markdown(res: Dict) -> str:
    b = res["bootstrap"]
    lines = ["# TVsub zh-en: the dropped-pronoun study over seeds", "",
             f"Seeds {', '.join(map(str, res['seeds']))} (each a whole run: stage 1 included). "
             f"Checkpoints: checkpoint_best.pt, the lowest validation loss, chosen on "
             f"{res['chosen_on'] or 'valid'}; figures reported on {res['reported_on'] or 'test'}"
             + (" (the same set: not held-out figures)" if res.get("reported_on_chosen_set")
                else "") + "; CXMI on the study's held-out training episodes.", ""]
    if res.get("dp_split"):
        d = res["dp_split"]
        lines += [f"The test split: {d['sentences']} sentences, {d['dp_sentences']} with a "
                  f"restored pronoun, {d['items']} items (restored pronouns a reference "
                  "supports)." + (" One episode of dev: expect wide intervals (a class has few "
                                  "items), and read them before any difference."
                                  if res.get("eval_split") == "dev-episodes" else ""), ""]
    lines += ["Each cell: the mean over seeds [the 95% seed-and-sentence bootstrap interval] "
              "(each seed's value).", ""]
    for head in (COLUMNS[:5], COLUMNS[5:9], COLUMNS[9:]):
        lines += ["| model | " + " | ".join(c[0] for c in head) + " |",
                  "|---|" + "---:|" * len(head)]
        for m, r in res["models"].items():
            lines.append(f"| {m} | " + " | ".join(_cell(r["figures"].get(k), sc, nd)
                                                 for _, k, sc, nd in head) + " |")
        lines.append("")
    classes = sorted({k[len("recall "):] for r in res["models"].values() for k in r["figures"]
                      if k.startswith("recall ") and r["figures"][k].get("value") is not None})
    if classes:
        lines += ["DP recall % per class, and contrastive accuracy % of the class's items "
                  "(true context / shuffled context):", "",
                  "| model | " + " | ".join(classes) + " |", "|---|" + "---:|" * len(classes)]
        for m, r in res["models"].items():
            f = r["figures"]
            cells = [f"{_cell(f.get(f'recall {c}'))}; {_cell(f.get(f'contrastive true class {c}'))}"
                     f" / {_cell(f.get(f'contrastive shuffled class {c}'))}" for c in classes]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Against the transformer", "",
              "Per seed: ctx-dp-eval's McNemar p (items only the transformer / only the model "
              "renders) and its paired bootstrap of the recall difference over sentences; "
              "sacreBLEU's paired bootstrap of BLEU. Pooled: the seed-and-sentence bootstrap of "
              "the difference (model minus the transformer of the same seed), mean [95%] and "
              "two-sided p; the McNemar test of the discordant items summed over seeds "
              "(optimistic: the same items once per seed).", "",
              "| model | per seed: DP recall delta %, McNemar p, bootstrap p; BLEU delta, p "
              "| pooled: BLEU delta [95%] p | DP recall delta % [95%] p | without 3sg-n "
              "| contrastive items (true ctx) | McNemar over seeds |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for m, r in res["models"].items():
        pr = r.get("paired")
        if not pr:
            continue
        seeds = []
        for s, e in pr["per_seed"].items():
            dp = (e.get("dp") or {}).get("all") or {}
            bl = e.get("bleu") or {}
            seeds.append(f"seed {s}: {_f(dp.get('recall_delta'))}, "
                         f"{_p(dp.get('mcnemar_p'))}, {_p(dp.get('bootstrap_p'))}; "
                         f"{'-' if bl.get('delta') is None else format(bl['delta'], '.2f')}, "
                         f"{_p(bl.get('p'))}")
        po = pr["pooled"]

        def pooled(k, sc=100.0, nd=1):
            g = po.get(k)
            if not g or g.get("value") is None:
                return "-"
            iv = g.get("interval")
            return (_f(g["value"], sc, nd) + ("" if not iv else
                                               f" [{_f(iv[0], sc, nd)}, {_f(iv[1], sc, nd)}]")
                    + f" p {_p(g.get('p_value'))}")
        mc = po.get("mcnemar all")
        mc_text = "-" if not mc else f"{_p(mc['p'])} ({mc['only_transformer']} / {mc['only_model']})"
        lines.append(f"| {m} | {'; '.join(seeds) or '-'} | {pooled('bleu', 1.0, 2)} "
                     f"| {pooled('recall')} | {pooled('recall_without_neuter')} "
                     f"| {pooled('contrastive true items')} | {mc_text} |")
    lines += ["", "## How the intervals are made", "",
              f"Seed-and-sentence bootstrap ({b['resamples']} resamples, seed {b['seed']}, "
              f"{100 * b['level']:.0f}% percentile): each resample draws the seeds with "
              "replacement and the sentences with replacement (one draw for all the drawn "
              "seeds: every run translated the same sentences), takes each drawn seed's figure "
              "on the drawn sentences and averages them; an interval thus holds the spread "
              "across training seeds and the sampling of sentences. With three seeds the "
              "seed part is coarse (at most 10 distinct seed draws). Contrastive accuracy: "
              "records (sentences) resampled. CXMI: the held-out episodes' sentences resampled "
              "(sentences of a document are not independent: too narrow if anything); pronoun "
              "P-CXMI in DP sentences: the test split's sentences. A model without a value for "
              "some seed is averaged over the seeds it has (listed).",
              "", "## Checkpoints", "",
              "| model | seed | checkpoint | update | valid loss |", "|---|---:|---|---:|---:|"]
    for m, r in res["models"].items():
        for s, c in (r.get("provenance") or {}).items():
            if c:
                vl = c.get("val_loss")
                lines.append(f"| {m} | {s} | `{c['checkpoint']}` | {c.get('num_updates')} "
                             f"| {'-' if vl is None else f'{vl:.4f}'} |")
    return "\n".join(lines) + "\n"


def _p(v):
    return "-" if v is None else (f"{v:.3f}" if v >= 0.001 else "<0.001")


def _write(path: str, text: str) -> None:
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".part", path)


def main(argv=None) -> Dict:
    p = argparse.ArgumentParser(prog="dp_report.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="dp_study.sh's --workdir (DIR/seed-N)")
    p.add_argument("--models", nargs="+", help="the models, in order (default: those with "
                   "results, sentence first)")
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--confidence", type=float, default=0.95)
    args = p.parse_args(argv)
    models = None
    if args.models:
        models = [x for m in args.models for x in m.split()]
        if "sentence" not in models:
            models = ["sentence"] + models
    res = collect(args.workdir, models, args.resamples, args.seed, args.confidence)
    _write(os.path.join(args.workdir, "results-dp.json"), json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    _write(os.path.join(args.workdir, "results-dp.md"), md)
    print(md)
    return res


if __name__ == "__main__":
    main()
