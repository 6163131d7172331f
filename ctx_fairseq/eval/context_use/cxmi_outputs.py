"""ctx-cxmi's outputs: the summary as text (:func:`format_result`), and the
files it writes (``cxmi.json``, ``cxmi.md``, ``tokens.jsonl`` and the
plots, :func:`write_outputs`)."""

import json
import os
import shutil
import tempfile
from typing import Dict, List, Optional

import numpy as np

from ctx_fairseq.eval.report_files import pyplot, save_figure

from ctx_fairseq.eval.context_use.cxmi_classes import breakdown_lines

def _interval_text(iv: Optional[Dict]) -> str:
    if not iv:
        return "-"
    if iv.get("low") is None:
        return "no interval (" + iv.get("note", "") .split(":")[0] + ")"
    return f"[{iv['low']:.4f}, {iv['high']:.4f}]"


def format_result(result: Dict) -> str:
    conds = result["conditions"]
    size = result.get("context_size")
    lines = [f"split {result['split']}: {result['sentences']} sentences in "
             f"{result['documents']} documents, {result['tokens']} target tokens, "
             f"{result['sentences_with_context']} sentences with context; context size "
             f"{'all' if size is None else size} (trained: "
             f"{result.get('trained_context_size')}, sampled 0..{result.get('sample_context_size')})",
             "", "CXMI = mean over sentences of the per-sentence mean token log-probability "
                 "difference (Fernandes et al. 2021), 95 % document block bootstrap interval; "
                 "per token and per sentence (sum) beside it. The headline is none (true "
                 "against empty context); shuffled and random are sensitivity checks.",
             "", "| condition | CXMI (nats) | 95 % interval (documents) | per token | "
                 "per sentence (sum) | per token, sentences with context | log p / token | "
                 "sentences better / worse |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for c in conds:
        e = result[c]
        wc = "-" if e["cxmi_sentences_with_context"] is None \
            else f"{e['cxmi_sentences_with_context']:.4f}"
        lines.append(f"| {c} | {e['cxmi']:.4f} | {_interval_text(e['interval'])} | "
                     f"{e['cxmi_per_token']:.4f} | {e['cxmi_per_sentence_sum']:.4f} | {wc} | "
                     f"{e['logprob_per_token']:.4f} | {e['sentences_better_with_context']} / "
                     f"{e['sentences_worse_with_context']} |")
    lines.append(f"| (true context) | | | | | | {result['logprob_true_per_token']:.4f} | |")
    if result.get("segments"):
        lines.append(f"\ncontext: {result['segments']}")
    if result.get("co_primary"):
        lines.append(f"\nco-primary: {result['co_primary']} (the checkpoint's sentence-level "
                     "path is frozen: against the empty context it measures its adapter, not "
                     "context use)")
    if result.get("none", {}).get("interval", {}).get("note"):
        lines.append(f"\nnote: {result['none']['interval']['note']}")
    if result.get("curve"):
        lines += ["", "CXMI by context size (against the empty context):", "",
                  "| context size | CXMI | 95 % interval |", "|---:|---:|---|"]
        lines += [f"| {p['context_size']} | {p['cxmi']:.4f} | {_interval_text(p['interval'])} |"
                  for p in result["curve"]]
    for note in result["notes"]:
        lines.append(f"\nnote: {note}")
    if result.get("word_classes"):
        lines += ["", f"P-CXMI per word by class ({result['word_class_lang']}), against none "
                      "(95 % document intervals), and per condition:", "",
                  "| class | count | none [interval] | minus all words [interval] | "
                  + " | ".join(conds) + " |",
                  "|---|---:|---|---|" + "---:|" * len(conds)]
        first = result["word_classes"][conds[0]]
        for name, g in first.items():
            vals = []
            for c in conds:
                m = result["word_classes"][c][name]["mean_p_cxmi"]
                vals.append("-" if m is None else f"{m:.4f}")
            head = "-" if g["mean_p_cxmi"] is None else \
                f"{g['mean_p_cxmi']:.4f} {_interval_text(g['interval'])}"
            diff = "-" if g.get("minus_all_words") is None else \
                f"{g['minus_all_words']:.4f} {_interval_text(g['minus_all_words_interval'])}"
            lines.append(f"| {name} | {g['count']} | {head} | {diff} | " + " | ".join(vals)
                         + " |")
        lines += breakdown_lines(result, conds)
    for c in conds:
        tw = result["top_words"][c]
        if not tw:
            continue
        lines += ["", f"top words by mean P-CXMI against {c} (count >= "
                      f"{result['top_words_min_count']}):", "", "| word | count | mean |",
                  "|---|---:|---:|"]
        lines += [f"| {r['word']} | {r['count']} | {r['mean_p_cxmi']:.4f} |" for r in tw]
    return "\n".join(lines)


def _plots(result: Dict, words: List[Dict], hist_png: str, pos_png: str) -> None:
    plt = pyplot()
    conds = result["conditions"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    values = {c: np.array([r["p_cxmi"][c] for r in words]) for c in conds}
    bins = np.histogram_bin_edges(np.concatenate(list(values.values())), bins=50)
    for c in conds:  # the same bins for every condition
        ax.hist(values[c], bins=bins, alpha=0.5, label=f"against {c}")
    ax.set_xlabel("P-CXMI per word (nats)")
    ax.set_ylabel("words")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"P-CXMI, split {result['split']}")
    save_figure(fig, hist_png)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for c in conds:
        rows = result["by_position"][c]
        xs = [int(p) for p in rows]
        ax.plot(xs, [rows[str(p)]["cxmi"] for p in xs], marker="o", label=f"against {c}")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("sentence position in the document (0 = first)")
    ax.set_ylabel("CXMI (nats per target token)")
    ax.legend(fontsize=8)
    ax.set_title(f"CXMI by position, split {result['split']}")
    save_figure(fig, pos_png)


def _curve_plot(result: Dict, png: str) -> None:
    plt = pyplot()
    pts = result["curve"]
    xs = [p["context_size"] for p in pts]
    ys = [p["cxmi"] for p in pts]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(xs, ys, marker="o")
    lo = [p["interval"]["low"] for p in pts]
    if all(v is not None for v in lo):
        hi = [p["interval"]["high"] for p in pts]
        ax.fill_between(xs, lo, hi, alpha=0.25, label="95 % document bootstrap")
        ax.legend(fontsize=8)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xticks(xs)
    ax.set_xlabel("context size (sentences; a document memory: its window)")
    ax.set_ylabel("CXMI against empty context (nats)")
    ax.set_title(f"CXMI by context size, split {result['split']}")
    save_figure(fig, png)


OUTPUT_FILES = ("cxmi.json", "cxmi.md", "tokens.jsonl", "cxmi_hist.png", "cxmi_by_position.png")
CURVE_FILES = ("curve.json", "curve.png")


def write_outputs(result: Dict, words: List[Dict], out_dir: str) -> Dict[str, str]:
    """Every output written into a temporary directory beside ``out_dir``,
    then moved into place: nothing half-written on an error."""
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".cxmi.partial-", dir=out_dir)
    try:
        with open(os.path.join(tmp, "cxmi.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, ensure_ascii=False)
        with open(os.path.join(tmp, "cxmi.md"), "w", encoding="utf-8") as f:
            f.write(format_result(result) + "\n")
        with open(os.path.join(tmp, "tokens.jsonl"), "w", encoding="utf-8") as f:
            for rec in words:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        _plots(result, words, os.path.join(tmp, "cxmi_hist.png"),
               os.path.join(tmp, "cxmi_by_position.png"))
        names = list(OUTPUT_FILES)
        if result.get("curve"):
            with open(os.path.join(tmp, "curve.json"), "w", encoding="utf-8") as f:
                json.dump({k: result[k] for k in ("split", "sentences", "documents",
                                                  "trained_context_size", "curve")}, f, indent=2)
            _curve_plot(result, os.path.join(tmp, "curve.png"))
            names += list(CURVE_FILES)
        paths = {}
        for name in names:
            paths[name] = os.path.join(out_dir, name)
            os.replace(os.path.join(tmp, name), paths[name])
        return paths
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


