"""The recipes' scoring and reports (``python -m ctx_fairseq.eval.scoring.recipe_report COMMAND``).

Sentence-level recipes (``sent_py`` in ``recipes/lib/steps_sentence.sh``):

* ``evaluate``: score one fairseq-generate output against its reference
  file: ``OUT/hyp.tok`` (the H- lines, BPE removed by fairseq-generate),
  ``OUT/hyp.detok`` (sacremoses-detokenised, or a copy when the corpus is
  distributed tokenised), ``OUT/bleu.txt`` and ``OUT/bleu.json``: sacreBLEU
  with its signature and, where the paper reported it, tokenized BLEU
  (``--tok-ref``: the tokenised hypotheses against the tokenised references,
  ``--tokenize none``);
* ``bylength``: ctx-bleu-by-length (DC paper Fig. 5) of several systems,
  each given as ``LABEL|GENERATE_OUTPUT|HYPOTHESES``, bucketed by the BPE
  source (the paper buckets by subword tokens), scored on the hypotheses
  file (the detokenised ones) against the reference file;
* ``summary``: ``WORK/results/summary.{md,json}`` from every scored model
  (``results/DIRECTION/MODEL/bleu.json``), one table per model family, the
  paired bootstrap's p (``paired.json``), the parameters from the training
  logs, the dictionaries' sizes, BLEU by kernel size (Fig. 3,
  ``analysis/kernel_size_bleu.png``), the probing results and the list of
  analysis files.

Document-level recipes (``recipes/lib/steps_context.sh``):

* ``complexity``: Maruf et al. (2019)'s Table 5 as markdown on stdout, one
  row per ``LABEL=TRAIN_LOG:GENERATE_LOG:SAVE_DIR`` (see
  :func:`complexity_table`);
* ``results-table``: every model's scores in one table (``md`` or ``json``
  on stdout) from ``RESULTS/MODEL/*.json`` (see :func:`results_table`).

Bad input (a missing or malformed file or argument) ends in one line,
``PROG: error: MESSAGE``, exit status 2.
"""

import argparse
import json
import os
import re
import statistics
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ctx_fairseq.errors import InputError
from ctx_fairseq.prep.recipe_text import read_sentence_lines, write_lines

__all__ = ["read_hypotheses", "bleu_result", "evaluate", "by_length", "train_params",
           "format_p", "summary", "complexity_table", "results_table", "main"]

PROG = "python -m ctx_fairseq.eval.scoring.recipe_report"


def _load_json(path: str):
    """A JSON file's content; a missing or malformed file is an :class:`InputError`."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not JSON ({err})") from None


def _split_spec(spec: str, sep: str, n: int, what: str, exact: bool = False) -> List[str]:
    """``spec`` split at ``sep`` into ``n`` fields (the last one keeps any
    further ``sep``, unless ``exact``); otherwise an :class:`InputError`
    saying ``what`` was expected."""
    parts = spec.split(sep, n - 1)
    if len(parts) != n or (exact and sep in parts[-1]):
        raise InputError(f"{spec!r}: expected {what}")
    return parts


# --------------------------------------------------------------------------
# sentence-level recipes: scoring


def read_hypotheses(gen: str, ref: str) -> List[str]:
    """The best hypothesis (H- line) of each test sentence in corpus order;
    every sentence of the reference exactly once, no BPE left (checked)."""
    from ctx_fairseq.generate_output import lines_with_bpe, read_generate_output

    n = len(read_sentence_lines(ref))
    try:
        out = read_generate_output(gen)
    except OSError as err:
        raise InputError(f"{gen}: cannot read: {err.strerror or err}") from None
    except ValueError as err:  # the reader's messages name the file and line
        raise InputError(str(err)) from None
    if out.ids != list(range(n)):
        missing = sorted(set(range(n)) - set(out.ids))
        extra = sorted(set(out.ids) - set(range(n)))
        raise InputError(f"{gen}: hypotheses for {len(out.ids)} sentences, the test set ({ref}) "
                         f"has {n}" + (f"; missing ids {missing[:10]}" if missing else "")
                         + (f"; ids outside the test set {extra[:10]}" if extra else ""))
    bpe = lines_with_bpe(out.hypotheses)
    if bpe:
        scheme, idx = next(iter(bpe.items()))
        raise InputError(f"{gen}: {len(idx)} hypotheses still hold {scheme} BPE markers (first: "
                         f"id {idx[0]}: {out.hypotheses[idx[0]]!r}); generate with --remove-bpe")
    return out.hypotheses


def bleu_result(hyps: Sequence[str], refs: Sequence[str], tokenize: Optional[str]) -> Dict:
    """sacreBLEU of ``hyps`` against ``refs``: score (2 decimals), text, signature."""
    from ctx_fairseq.generate_output import bleu_metric

    metric = bleu_metric(tokenize)
    score = metric.corpus_score(list(hyps), [list(refs)])
    return {"score": round(score.score, 2), "text": str(score),
            "signature": str(metric.get_signature()), "tokenize": tokenize or "13a"}


def _write_json(path: str, obj) -> None:
    with open(path + ".part", "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
    os.replace(path + ".part", path)


def evaluate(gen: str, ref: str, lang: str, out: str, title: str, detok: bool,
             tok_ref: Optional[str] = None, tok_label: str = "",
             meta: Sequence[str] = ()) -> Dict:
    """The ``evaluate`` command (see the module); returns bleu.json's content."""
    hyps = read_hypotheses(gen, ref)
    write_lines(os.path.join(out, "hyp.tok"), hyps)
    if detok:
        # the recipes' one detokenizer (no unescaping: moses_tok does not escape)
        from ctx_fairseq.prep.corpora import moses_detokenize

        scored = [moses_detokenize(h, lang) for h in hyps]
        desc = f"sacremoses-detokenised hypotheses vs the untokenised references {ref}"
    else:
        scored = list(hyps)
        desc = f"hypotheses vs the references {ref} as distributed (already tokenised)"
    write_lines(os.path.join(out, "hyp.detok"), scored)
    refs = read_sentence_lines(ref)
    res = {"sentences": len(hyps), "generate_output": gen, "reference": ref,
           "sacrebleu": bleu_result(scored, refs, None), "tokenized_bleu": None}
    for kv in meta:
        key, _, value = kv.partition("=")
        res[key] = value
    lines = [title,
             f"sacreBLEU, {desc} ({len(hyps)} sentences): {res['sacrebleu']['score']:.2f}",
             f"  {res['sacrebleu']['text']}",
             f"  signature: {res['sacrebleu']['signature']}"]
    if tok_ref:
        tok_refs = read_sentence_lines(tok_ref)
        if len(tok_refs) != len(hyps):
            raise InputError(f"{tok_ref} has {len(tok_refs)} lines, the test set {len(hyps)}")
        tok = bleu_result(hyps, tok_refs, "none")
        tok["label"] = tok_label
        res["tokenized_bleu"] = tok
        lines += [f"tokenized BLEU ({tok_label}; the tokenised hypotheses vs the tokenised "
                  f"references {tok_ref}, case-sensitive, sacreBLEU --tokenize none): "
                  f"{tok['score']:.2f}",
                  f"  {tok['text']}", f"  signature: {tok['signature']}"]
    write_lines(os.path.join(out, "bleu.txt"), lines)
    _write_json(os.path.join(out, "bleu.json"), res)
    print("\n".join(lines))
    return res


def by_length(src: str, ref: str, out_dir: str, systems: Sequence[str]) -> Dict[str, str]:
    """The ``bylength`` command (see the module): ctx-bleu-by-length on files
    in fairseq-generate's format, ``OUT/LABEL.by-length-input.txt``: S- the
    BPE source, T- the reference, H- the scored hypothesis (H- scores copied
    from the generate output). Returns ctx-bleu-by-length's output files."""
    from ctx_fairseq.eval.scoring.bleu_by_length import cli_main

    src_lines, refs = read_sentence_lines(src), read_sentence_lines(ref)
    args = []
    for spec in systems:
        label, gen, hyp_file = _split_spec(spec, "|", 3, "LABEL|GENERATE_OUTPUT|HYPOTHESES",
                                           exact=True)
        hyp = read_sentence_lines(hyp_file)
        read_hypotheses(gen, ref)
        if not (len(src_lines) == len(refs) == len(hyp)):
            raise InputError(f"by-length input: {len(src_lines)} sources, {len(refs)} references, "
                             f"{len(hyp)} hypotheses")
        scores: Dict[int, str] = {}
        with open(gen, encoding="utf-8") as f:
            for line in f:
                if line.startswith("H-"):
                    tag, score, _ = line.rstrip("\n").split("\t", 2)
                    scores.setdefault(int(tag[2:]), score)
        out = []
        for i in range(len(src_lines)):
            out += [f"S-{i}\t{src_lines[i]}", f"T-{i}\t{refs[i]}", f"H-{i}\t{scores[i]}\t{hyp[i]}"]
        path = os.path.join(out_dir, f"{label}.by-length-input.txt")
        write_lines(path, out)
        args += ["--system", f"{label}={path}"]
    return cli_main(args + ["--out-dir", out_dir])


# --------------------------------------------------------------------------
# sentence-level recipes: the summary


def train_params(log: str) -> Optional[int]:
    """The parameter count fairseq-train logged last in ``log`` (None: no log
    or no count)."""
    if not os.path.exists(log):
        return None
    found = None
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.search(r"num\. (?:shared )?model params: ([\d,]+)", line)
            if m:
                found = int(m.group(1).replace(",", ""))
    return found


def format_p(p: Optional[float]) -> str:
    """A paired bootstrap's p as the tables show it: 3 decimals, ``<0.001``,
    or ``n/a`` (None: not computed, e.g. too few documents)."""
    return "n/a" if p is None else (f"{p:.3f}" if p >= 0.001 else "<0.001")


def _result_rows(work: str, models: Dict[str, Dict], directions: Sequence[str]) -> List[Dict]:
    rows = []
    for d in directions:
        for mid, info in models.items():
            path = os.path.join(work, "results", d, mid, "bleu.json")
            if not os.path.exists(path):
                continue
            r = _load_json(path)
            tok = r.get("tokenized_bleu")
            paired = os.path.join(work, "results", d, mid, "paired.json")
            if os.path.exists(paired):
                p_text = format_p(_load_json(paired)["sentences"]["p_value"])
            elif mid == "transformer" or mid.endswith("-transformer"):
                p_text = "-"
            else:
                p_text = "not measured"
            rows.append({"direction": d, "model": mid, **info, "p_vs_transformer": p_text,
                         "params": train_params(os.path.join(work, "logs", f"train-{d}.{mid}.log")),
                         "sacrebleu": r["sacrebleu"]["score"],
                         "sacrebleu_signature": r["sacrebleu"]["signature"],
                         "tokenized_bleu": tok["score"] if tok else None,
                         "checkpoint": r.get("checkpoint")})
    return rows


def _dictionaries(work: str) -> Dict[str, int]:
    dicts = {}
    for data in ("bin", "bin-sep"):
        ddir = os.path.join(work, data)
        if not os.path.isdir(ddir):
            continue
        for fn in sorted(os.listdir(ddir)):
            if fn.startswith("dict.") and fn.endswith(".txt"):
                with open(os.path.join(ddir, fn), encoding="utf-8") as f:
                    dicts[f"{data}/{fn}"] = sum(1 for _ in f) + 4  # + fairseq's 4 special symbols
    return dicts


TITLES = {"main": "Main results",
          "kernel": "Enc-DC by CNN kernel size f (DC paper Sec. 7.2, Fig. 3)",
          "layers": "Enc-DC by DC encoder layers (DC paper Sec. 7.3, Table 5)",
          "table1": "Localness baselines (hybrid paper Sec. 4.1, Table 1)"}
FAMILY_ORDER = ["main", "table1", "kernel", "layers"]


def _family_tables(rows: List[Dict], tok_label: str) -> List[str]:
    lines = []
    kinds: List[str] = []
    for r in rows:
        r["kind"], _, r["value"] = r["family"].partition("=")
        if r["kind"] not in kinds:
            kinds.append(r["kind"])
    kinds.sort(key=lambda k: FAMILY_ORDER.index(k) if k in FAMILY_ORDER else len(FAMILY_ORDER))
    for kind in kinds:
        sel = [r for r in rows if r["kind"] == kind]
        if kind == "kernel":
            sel.sort(key=lambda r: int(r["value"]))
        extra = " value |" if kind in ("kernel", "layers") else ""
        lines += [f"## {TITLES.get(kind, kind)}", "",
                  f"| direction | model | label | set-up |{extra} parameters | sacreBLEU |"
                  + (f" tokenized BLEU ({tok_label}) |" if tok_label else "") + " p |",
                  "|---|---|---|---|" + ("---|" if extra else "") + "---:|---:|"
                  + ("---:|" if tok_label else "") + "---:|"]
        for r in sel:
            p = f"{r['params'] / 1e6:.2f}M" if r["params"] else "?"
            tb = "" if not tok_label else (
                f" {r['tokenized_bleu']:.2f} |" if r["tokenized_bleu"] is not None else " - |")
            val = f" {r['value']} |" if extra else ""
            lines.append(f"| {r['direction']} | {r['model']} | {r['label']} | {r['group']} |{val} "
                         f"{p} | {r['sacrebleu']:.2f} |{tb} {r['p_vs_transformer']} |")
        lines.append("")
    return lines


def _kernel_plot(work: str, rows: List[Dict]) -> List[str]:
    """Fig. 3 of the DC paper: BLEU by kernel size (if such runs exist)."""
    kern = sorted(((int(r["value"]), r) for r in rows if r["kind"] == "kernel"),
                  key=lambda x: x[0])
    if not kern:
        return []
    import logging

    # importing fairseq (this package does) sets the root logger to DEBUG
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar([str(k) for k, _ in kern], [r["sacrebleu"] for _, r in kern], color="#4477aa")
    ax.set_xlabel("kernel size f")
    ax.set_ylabel("sacreBLEU")
    ax.set_title("Enc-DC by kernel size (DC paper, Fig. 3)")
    fig.tight_layout()
    os.makedirs(os.path.join(work, "analysis"), exist_ok=True)
    png = os.path.join(work, "analysis", "kernel_size_bleu.png")
    fig.savefig(png + ".part.png", dpi=120)
    plt.close(fig)
    os.replace(png + ".part.png", png)
    return ["BLEU by kernel size (Fig. 3): `analysis/kernel_size_bleu.png`", ""]


# Conneau et al.'s three groups (the DC paper's Table 4, the hybrid paper's Table 3)
PROBING_GROUPS = {"Surface": ("sentence_length", "word_content"),
                  "Syntactic": ("tree_depth", "top_constituents", "bigram_shift"),
                  "Semantic": ("past_present", "subj_number", "obj_number", "odd_man_out",
                               "coordination_inversion")}


def _probing(work: str) -> Tuple[Dict, List[str]]:
    """Probing (DC paper Table 4, hybrid paper Tables 3-4): each model's
    ``analysis/probe/MODEL/probe.json`` and its tables' lines."""
    probe_root = os.path.join(work, "analysis", "probe")
    probes: Dict[str, Dict] = {}
    if os.path.isdir(probe_root):
        for mid in sorted(os.listdir(probe_root)):
            pj = os.path.join(probe_root, mid, "probe.json")
            if os.path.exists(pj):
                probes[mid] = {t["task"]: t for t in _load_json(pj)["tasks"]}
    if not probes:
        return probes, []
    tasks: List[str] = []
    for res in probes.values():
        tasks += [t for t in res if t not in tasks]
    lines = ["## Probing (test accuracy %, majority baseline in brackets)", "",
             "| task | " + " | ".join(probes) + " |",
             "|---|" + "---:|" * len(probes)]
    for t in tasks:
        cells = []
        for mid in probes:
            r = probes[mid].get(t)
            cells.append(f"{100 * r['accuracy']:.2f} ({100 * r['majority_accuracy']:.2f})" if r else "-")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines.append("")
    avg_lines = []
    for g, names in PROBING_GROUPS.items():
        cells = []
        for mid in probes:
            accs = [probes[mid][t]["accuracy"] for t in names if t in probes[mid]]
            cells.append(f"{100 * sum(accs) / len(accs):.2f} ({len(accs)}/{len(names)} tasks)"
                         if accs else "-")
        if any(c != "-" for c in cells):
            avg_lines.append(f"| {g} | " + " | ".join(cells) + " |")
    if avg_lines:
        lines += ["Mean test accuracy % per group of SentEval tasks (the tasks found / the group's):", "",
                  "| group | " + " | ".join(probes) + " |", "|---|" + "---:|" * len(probes)]
        lines += avg_lines + [""]
    return probes, lines


def summary(work: str, name: str, paper: str, model_specs: Sequence[str], directions: str,
            tok_label: str = "", smoke: bool = False, also: Sequence[str] = ()) -> List[str]:
    """The ``summary`` command (see the module): writes
    ``WORK/results/summary.{md,json}``; returns summary.md's lines.
    ``model_specs``: ``ID|LABEL|FAMILY|GROUP``; ``also``: ``FAMILY:ID``, a
    model listed in a second table (e.g. Enc-DC as f=2 of Fig. 3)."""
    models = {}
    for spec in model_specs:
        mid, label, family, group = _split_spec(spec, "|", 4, "ID|LABEL|FAMILY|GROUP", exact=True)
        models[mid] = {"label": label, "family": family, "group": group}
    rows = _result_rows(work, models, directions.split())
    dicts = _dictionaries(work)
    # a model may appear in a second table too (e.g. Enc-DC as f=2 of Fig. 3)
    first = list(rows)
    for spec in reversed(also):
        family, _, mid = spec.partition(":")
        rows[:0] = [dict(r, family=family) for r in first if r["model"] == mid]
    lines = [f"# {name}: results", ""]
    if smoke:
        lines += ["**Smoke run** (a few sentences, a tiny model, a few updates): these numbers "
                  "check the pipeline and mean nothing about the paper.", ""]
    lines += [paper, ""]
    lines += _family_tables(rows, tok_label)
    lines += ["p: sacreBLEU's paired bootstrap (Koehn 2004; ctx_fairseq.eval.scoring.significance, "
              "results/DIRECTION/MODEL/paired.json) of the sacreBLEU score against the same "
              "set-up's transformer, over sentences; - for the transformer itself, not "
              "measured without it in the run.", ""]
    sigs = sorted({r["sacrebleu_signature"] for r in rows})
    if sigs:
        lines += ["sacreBLEU signature(s): " + "; ".join(f"`{s}`" for s in sigs), ""]
    if dicts:
        lines += ["Dictionaries (types incl. fairseq's 4 special symbols): "
                  + ", ".join(f"{k} {v:,}" for k, v in dicts.items()), ""]
    lines += _kernel_plot(work, rows)
    probes, probe_lines = _probing(work)
    lines += probe_lines
    analyses = []
    aroot = os.path.join(work, "analysis")
    if os.path.isdir(aroot):
        for dp, _, fns in sorted(os.walk(aroot)):
            for fn in sorted(fns):
                if fn.endswith((".md", ".tsv", ".png")) and ".part" not in fn:
                    analyses.append(os.path.relpath(os.path.join(dp, fn), work))
    if analyses:
        lines += ["## Analysis files", ""] + [f"- `{p}`" for p in analyses] + [""]
    write_lines(os.path.join(work, "results", "summary.md"), lines)
    _write_json(os.path.join(work, "results", "summary.json"),
                {"recipe": name, "smoke": bool(smoke), "results": rows, "dictionaries": dicts,
                 "probing": probes})
    print("\n".join(lines))
    return lines


# --------------------------------------------------------------------------
# document-level recipes


def _log_lines(path: str) -> List[str]:
    """A log's lines (undecodable bytes replaced); a missing log is an :class:`InputError`."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readlines()
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None


def complexity_table(specs: Sequence[str]) -> List[str]:
    """Maruf et al. (2019)'s Table 5 for each model (``LABEL=TRAIN_LOG:GENERATE_LOG:SAVE_DIR``):
    parameters (counted in SAVE_DIR's best checkpoint, else its last, without
    the frozen copy of the stage-1 model that --context-memory frozen keeps
    for the memory: it is the stage-1 model again, not part of the document
    model), those trained in stage 2 (fairseq's "num. trained"), training
    speed (the train "wps": target tokens per second after BPE) and decoding
    speed (target tokens of the output over the time of every
    fairseq-generate pass: iterative decoding counts both). Speeds depend on
    the machine and the batch sizes: compare models of one run only.
    Returns the markdown lines."""
    import torch

    from ctx_fairseq.safe_load import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    lines = ["| model | parameters (without the frozen memory copy) | trained in this stage "
             "| training speed (target BPE tokens/s, mean) | decoding speed (tokens/s, all passes) |",
             "|---|---:|---:|---:|---:|"]
    for arg in specs:
        what = "LABEL=TRAIN_LOG:GENERATE_LOG:SAVE_DIR"
        label, rest = _split_spec(arg, "=", 2, what)
        if rest.count(":") < 2:
            raise InputError(f"{arg!r}: expected {what}")
        train_log, gen_log, save = rest.split(":", 2)
        trained = "?"
        wps = []
        for line in _log_lines(train_log):
            m = re.search(r"num\. shared model params: ([\d,]+) \(num\. trained: ([\d,]+)\)", line)
            if m:
                trained = m.group(2)
            if re.search(r"\| (train_inner|train) \|", line):
                m = re.search(r"\bwps[= ](\d+(?:\.\d+)?)", line)
                if m:
                    wps.append(float(m.group(1)))
        ckpt = os.path.join(save, "checkpoint_best.pt")
        if not os.path.exists(ckpt):
            ckpt = os.path.join(save, "checkpoint_last.pt")
        if not os.path.exists(ckpt):
            raise InputError(f"{save}: no checkpoint_best.pt or checkpoint_last.pt")
        state = torch.load(ckpt, map_location="cpu", weights_only=True)["model"]
        params = sum(v.numel() for k, v in state.items()
                     if ".memory_encoder." not in f".{k}" and ".memory_decoder." not in f".{k}")
        tokens, seconds = None, 0.0
        for line in _log_lines(gen_log):
            m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s", line)
            if m:
                tokens = int(m.group(2).replace(",", ""))  # the last pass's output
                seconds += float(m.group(3))
        speed = f"{tokens / seconds:.0f}" if tokens and seconds > 0 else "?"
        mean_wps = f"{statistics.mean(wps):.0f}" if wps else "?"
        lines.append(f"| {label} | {params:,} | {trained} | {mean_wps} | {speed} |")
    return lines


SUITE_NAMES = {"pronouns": "pronoun suite", "contrapro": "ContraPro"}
RESULT_COLUMNS = ["tokenized_bleu_sentence_level", "tokenized_bleu_document_level",
                  "sacrebleu_sentence_level", "sacrebleu_document_level", "paired_vs_transformer"]
PAIRED_NOTE = ("sacreBLEU's paired bootstrap (Koehn 2004) of the tokenized BLEU against the "
               "sentence-level transformer: p over sentences and over documents (d-BLEU; null "
               "with fewer than 10 documents)")
CXMI_NOTE = ("ctx-cxmi --conditions shuffled on the test split: the mean over sentences of the "
             "per-sentence mean log-probability with the true context minus with shuffled "
             "context (nats; a sensitivity check beside the paper's CXMI against the empty "
             "context, cxmi.json's none); null: sentence-level, no context")


def _context_measure(model: str, path: str, measure: Callable[[Dict], Tuple[str, object]]):
    """(table cell, JSON record) of a measurement of a context model from its
    file ``path``: ``-`` / None for the sentence-level model (no context to
    remove), ``not measured`` without the file (an earlier version's results),
    else ``measure(the file's JSON)``."""
    if model == "sentence":
        return "-", None
    if not os.path.exists(path):
        return "not measured", "not measured"
    return measure(_load_json(path))


def _paired_cell(pj: Dict) -> Tuple[str, Dict]:
    """The paired bootstrap against the sentence-level transformer (ctx_paired)."""
    docs = pj["documents"] or {}
    ps, pd = pj["sentences"]["p_value"], docs.get("p_value")
    return f"{format_p(ps)} / {format_p(pd)}", {
        "p_sentences": ps, "p_documents": pd, "delta": pj["sentences"]["delta"],
        "documents": docs.get("segments"), "note": docs.get("note") or pj["sentences"].get("note")}


def _cxmi_cell(full: Dict) -> Tuple[str, Dict]:
    """CXMI against shuffled context (ctx_maruf_cxmi)."""
    cx = full["shuffled"]
    if full["documents"] < 2:
        # no other document to take context from (ctx-cxmi refuses it; the step
        # records the count, ctx_cxmi_skipped)
        return "n/a (1 test document)", {
            "cxmi": None, "tokens": (cx or {}).get("tokens"), "reason":
            "the test split has one document: shuffled context has no other document to come from"}
    return f"{cx['cxmi']:.4f}", {"cxmi": cx["cxmi"], "tokens": cx["tokens"]}


def results_table(results: str, fmt: str, specs: Sequence[str]) -> str:
    """Every model's scores in one table, ``fmt`` ``md`` (markdown, with the
    signatures) or ``json`` (the same values, unrounded: ``{"columns": [...],
    "models": {MODEL: {...}}, "signatures": {...}}``), from
    ``RESULTS/MODEL/{tokenized_bleu,sacrebleu}.json``, ``paired.json`` (the
    paired bootstrap against the sentence-level transformer),
    ``contrastive_{pronouns,contrapro}.json`` where a model has them, and
    ``cxmi/cxmi.json`` (CXMI against shuffled context, nats per target token).
    ``specs``: ``MODEL=LABEL``, LABEL the architecture and notes. The model
    ``sentence`` (sentence-level, no context to remove) has "-" for p and
    CXMI; a context model without the file (an earlier version's results)
    "not measured"; a test split of one document "n/a" (no other document for
    the shuffled context: the dataset would take it from the same document,
    or, for a document memory, keep the document's own memory and give
    exactly 0, which is not a measurement). Returns the text to print."""
    if fmt not in ("md", "json"):
        raise InputError(f"format {fmt!r}: expected md or json")
    pairs = [_split_spec(spec, "=", 2, "MODEL=LABEL") for spec in specs]
    suites = [x for x in SUITE_NAMES
              if any(os.path.exists(os.path.join(results, m, f"contrastive_{x}.json")) for m, _ in pairs)]
    rows, table, sigs = [], {}, {}
    for model, label in pairs:
        d = os.path.join(results, model)
        row = [model, label]
        rec = {"architecture": label}
        for prefix in ("tokenized_bleu", "sacrebleu"):
            b = _load_json(os.path.join(d, f"{prefix}.json"))
            for level in ("sentence_level", "document_level"):
                row.append(f"{b[level]['bleu']:.2f}")
                rec[f"{prefix}_{level}"] = b[level]["bleu"]
                sigs.setdefault(prefix, set()).add(b[level]["signature"])
        cell, rec["paired_vs_transformer"] = _context_measure(
            model, os.path.join(d, "paired.json"), _paired_cell)
        row.append(cell)
        for suite in suites:
            path = os.path.join(d, f"contrastive_{suite}.json")
            if os.path.exists(path):
                c = _load_json(path)["overall"]
                acc = "-" if c["accuracy"] is None else f"{100 * c['accuracy']:.1f}"
                row.append(f"{acc} ({c['correct']}/{c['n']}, {c['ties']})")
                rec[f"contrastive_{suite}"] = {k: c[k] for k in ("accuracy", "correct", "n", "ties")}
            else:
                row.append("not scored")
                rec[f"contrastive_{suite}"] = None
        cell, rec["cxmi_shuffled"] = _context_measure(
            model, os.path.join(d, "cxmi", "cxmi.json"), _cxmi_cell)
        row.append(cell)
        rows.append(row)
        table[model] = rec
    if fmt == "json":
        return json.dumps({"columns": RESULT_COLUMNS + [f"contrastive_{x}" for x in suites]
                           + ["cxmi_shuffled"],
                           "paired_vs_transformer": PAIRED_NOTE, "cxmi_shuffled": CXMI_NOTE,
                           "models": table, "signatures": {k: sorted(v) for k, v in sigs.items()}},
                          indent=2, ensure_ascii=False)
    lines = ["| model | architecture | tokenized BLEU | document-level tokenized BLEU | sacreBLEU "
             "| document-level sacreBLEU | p vs transformer (sentences / documents) |"
             + "".join(f" {SUITE_NAMES[x]} accuracy % (correct/n, ties) |" for x in suites)
             + " CXMI vs shuffled context (nats) |",
             "|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(suites) + "---:|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines.append("")
    labels = {"tokenized_bleu": "tokenized BLEU", "sacrebleu": "sacreBLEU"}
    for key, values in sigs.items():
        lines.append(f"- {labels[key]} signature (sentence and document level): "
                     f"{'; '.join(sorted(values))}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# command line


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("evaluate", help="score a fairseq-generate output: OUT/{hyp.tok,hyp.detok,"
                       "bleu.txt,bleu.json}")
    for opt in ("--gen", "--ref", "--lang", "--out-dir", "--title"):
        v.add_argument(opt, required=True)
    v.add_argument("--detok", type=int, required=True)
    v.add_argument("--tok-ref")
    v.add_argument("--tok-label", default="")
    v.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE")
    b = sub.add_parser("bylength", help="BLEU by source length of several systems")
    for opt in ("--src", "--ref", "--out-dir"):
        b.add_argument(opt, required=True)
    b.add_argument("--system", action="append", required=True, metavar="LABEL|GEN|HYP")
    m = sub.add_parser("summary", help="WORK/results/summary.{md,json}")
    m.add_argument("--work", required=True)
    m.add_argument("--name", required=True)
    m.add_argument("--paper", required=True)
    m.add_argument("--model", action="append", default=[], metavar="ID|LABEL|FAMILY|GROUP")
    m.add_argument("--directions", required=True)
    m.add_argument("--tok-label", default="")
    m.add_argument("--smoke", type=int, default=0)
    m.add_argument("--also", action="append", default=[], metavar="FAMILY:ID")
    c = sub.add_parser("complexity", help="Maruf et al.'s Table 5 (markdown on stdout)")
    c.add_argument("specs", nargs="*", metavar="LABEL=TRAIN_LOG:GENERATE_LOG:SAVE_DIR")
    t = sub.add_parser("results-table", help="the document-level models' scores (stdout)")
    t.add_argument("results", metavar="RESULTS_DIR")
    t.add_argument("format", choices=("md", "json"))
    t.add_argument("specs", nargs="*", metavar="MODEL=LABEL")
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    a = get_parser().parse_args(argv)
    try:
        if a.cmd == "evaluate":
            evaluate(a.gen, a.ref, a.lang, a.out_dir, a.title, bool(a.detok), a.tok_ref,
                     a.tok_label, a.meta)
        elif a.cmd == "bylength":
            by_length(a.src, a.ref, a.out_dir, a.system)
        elif a.cmd == "summary":
            summary(a.work, a.name, a.paper, a.model, a.directions, a.tok_label, bool(a.smoke),
                    a.also)
        elif a.cmd == "complexity":
            print("\n".join(complexity_table(a.specs)))
        else:
            print(results_table(a.results, a.format, a.specs))
    except InputError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
