"""The word-class breakdown of ``ctx-cxmi``'s P-CXMI (:mod:`ctx_fairseq.eval.context_use.cxmi`):
each class per member word and split by repetition from the previous
reference sentence, and its cxmi.md tables."""

import collections
from typing import Dict, List

import numpy as np

from ctx_fairseq.eval.context_use.word_classes import normalise

__all__ = ["class_breakdown", "breakdown_lines", "sentence_sums"]


def class_breakdown(words: List[Dict], m: np.ndarray, pc: np.ndarray, name: str,
                     halves: tuple) -> Dict:
    """A class's mean P-CXMI split two ways: per member word (``by_word``, the
    listed classes only: which pronouns gain or lose) and by whether the word
    is repeated from the previous reference sentence of its document
    (``in_previous_reference`` / ``not_in_previous_reference``, ``halves``: the
    two masks over ``words``; ``</s>`` in neither). A hypothesis this split
    tests: a model that copies words (or, with a source context, their
    translations) from its context gains on the repeated words and loses on
    the others."""
    out = {}
    if name not in ("other", "all words", "</s>"):
        by = collections.defaultdict(list)
        for r, v, k in zip(words, pc, m):
            if k:
                by[normalise(r["word"])].append(v)
        out["by_word"] = [{"word": w, "count": len(v), "mean_p_cxmi": float(np.mean(v))}
                          for w, v in sorted(by.items(), key=lambda x: (-len(x[1]), x[0]))]
    for key, sel in (("in_previous_reference", m & halves[0]),
                     ("not_in_previous_reference", m & halves[1])):
        out[key] = {"count": int(sel.sum()),
                    "mean_p_cxmi": float(pc[sel].mean()) if sel.any() else None}
    return out


def breakdown_lines(result: Dict, conds: List[str]) -> List[str]:
    """Each listed class per member word (count >= the top words' minimum) and
    split by repetition from the previous reference sentence, per condition."""
    first = result["word_classes"][conds[0]]
    min_count = result["top_words_min_count"]

    def val(c, name, key, word=None):
        g = result["word_classes"][c][name]
        if word is None:
            m = g[key]["mean_p_cxmi"]
        else:
            m = next(r["mean_p_cxmi"] for r in g["by_word"] if r["word"] == word)
        return "-" if m is None else f"{m:.4f}"

    lines = []
    for name, g in first.items():
        if "by_word" not in g:
            continue
        lines += ["", f"{name}: mean P-CXMI per word (count >= {min_count}) and by "
                      "repetition from the previous reference sentence of the document:", "",
                  "| word | count | " + " | ".join(conds) + " |",
                  "|---|---:|" + "---:|" * len(conds)]
        for cls in (name, "all words"):
            for key, label in (("in_previous_reference", "in the previous reference sentence"),
                               ("not_in_previous_reference", "not in it")):
                lines.append(f"| ({cls}: {label}) | {first[cls][key]['count']} | "
                             + " | ".join(val(c, cls, key) for c in conds) + " |")
        for r in g["by_word"]:
            if r["count"] >= min_count:
                lines.append(f"| {r['word']} | {r['count']} | "
                             + " | ".join(val(c, name, None, r["word"]) for c in conds) + " |")
    return lines


def sentence_sums(words: List[Dict], n_sentences: int, condition: str, select) -> tuple:
    """Per sentence of the split (``rec["sentence"]``, 0..n_sentences-1) the
    sum of the P-CXMI against ``condition`` of the words ``select(rec)`` keeps
    and their count: ``(sums, counts)``, float arrays of ``n_sentences``; the
    pieces of a mean over a subset of words (``sums.sum() / counts.sum()``)
    that a bootstrap over sentences can resample. ``words``: ``ctx-cxmi``'s
    ``tokens.jsonl`` records."""
    sums = np.zeros(n_sentences)
    counts = np.zeros(n_sentences)
    for r in words:
        if select(r):
            i = r["sentence"]
            sums[i] += r["p_cxmi"][condition]
            counts[i] += 1
    return sums, counts
