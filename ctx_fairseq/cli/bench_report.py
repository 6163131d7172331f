"""ctx-bench's reports: the table, the Markdown table, the dry run's and the
sweep's (with where each model stops being host-bound). See
:mod:`ctx_fairseq.cli.bench`."""

import json
from typing import Dict, List

__all__ = ["format_markdown", "format_table", "format_dry_run", "sweep_summary", "step_time_fit",
           "format_sweep"]


def _segment_modes(report: Dict, markdown: bool):
    """The report of a segment mode (issue 39: ``--segment-tokens``,
    ``--attention-bench``, ``--decode-bench``) formatted, or None."""
    if "segments" in report:
        from ctx_fairseq.cli.bench_doc2doc import format_segments

        return format_segments(report, markdown)
    if "attention_bench" in report or "decode_bench" in report:
        from ctx_fairseq.cli import bench_attention as ba

        fmt = ba.format_attention if "attention_bench" in report else ba.format_decode
        return fmt(report, markdown)
    return None


def format_markdown(report: Dict) -> str:
    """The results as a Markdown table (for BENCHMARKS.md)."""
    if _segment_modes(report, True) is not None:
        return _segment_modes(report, True)
    if report.get("sweep"):
        return format_sweep(report, markdown=True)
    if report.get("dry_run"):
        return format_dry_run(report, markdown=True)
    head = ["arch", "params", "train tok/s", "train ratio", "FLOPs bound", "ratio / bound",
            "train TFLOP/s", "train MFU", "infer sent/s", "infer ratio", "infer FLOPs bound",
            "infer MFU", "batch sents", "mem sents", "peak MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["results"]:
        infer = r["infer_ratio"] is not None
        lines.append("| " + " | ".join([
            f"`{r['arch']}`", f"{r['params'] / 1e6:.2f}M", f"{r['train_tokens_per_s']:.1f}",
            f"{r['train_ratio']:.3f}", f"{r['flops_ratio_bound']:.3f}",
            f"{r['train_ratio'] / r['flops_ratio_bound']:.3f}",
            _tf(r.get("train_tflops")), _pct(r.get("train_mfu")),
            f"{r['infer_sentences_per_s']:.3f}" if infer else "-",
            f"{r['infer_ratio']:.3f}" if infer else "-",
            f"{r['infer_flops_ratio_bound']:.3f}" if r.get("infer_flops_ratio_bound") else "-",
            _pct(r.get("infer_mfu")), _num(r.get("batch_sentences"), "d"),
            _num(r.get("batch_memory_sentences"), "d"), f"{r['peak_mem_mb']:.0f}",
        ]) + " |")
    return "\n".join(lines + _peak_note(report) + _setting_notes(report))


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _tf(v) -> str:
    """TFLOP/s: two decimals, or two significant digits below 0.1."""
    return "-" if v is None else (f"{v:.2f}" if v >= 0.1 else f"{v:.2g}")


def _pct(v) -> str:
    """MFU as a percentage of the peak ('-': no peak known)."""
    return "-" if v is None else f"{100 * v:.1f}%"


def _peak_note(report: Dict) -> List[str]:
    """What MFU is a fraction of (or why there is none)."""
    if "peak_tflops_source" not in report:
        return []
    peak = report.get("peak_tflops")
    text = (f"MFU: achieved TFLOP/s (counted FLOPs of forward + backward, or of the beam "
            f"search, over the median time) / {peak:g} TFLOP/s, {report['peak_tflops_source']}"
            if peak else f"MFU: -, {report['peak_tflops_source']}")
    step = [f"training step: {report['training_step']}"] if report.get("training_step") else []
    return ["", f"precision: {report.get('precision')}; {text}", *step]


def _setting_notes(report: Dict) -> List[str]:
    """What a row measures where its hooks say (``BenchHooks.setting``), e.g. where
    a document memory comes from."""
    notes = [f"{r['arch']}: {r['setting']}" for r in report["results"] if r.get("setting")]
    return ["", *notes] if notes else []


def _columns(head: List[str], rows: List[List[str]]) -> List[str]:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    fmt = lambda c: "  ".join(x.rjust(w) if i else x.ljust(w)  # noqa: E731
                              for i, (x, w) in enumerate(zip(c, widths)))
    return [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def format_table(report: Dict) -> str:
    if _segment_modes(report, False) is not None:
        return _segment_modes(report, False)
    if report.get("sweep"):
        return format_sweep(report)
    if report.get("dry_run"):
        return format_dry_run(report)
    head = ["arch", "params", "train tok/s", "train ratio", "FLOPs bound", "ratio/bound",
            "TFLOP/s", "MFU", "infer sent/s", "infer ratio", "infer bound", "infer MFU",
            "sents", "mem sents", "peak MB"]
    rows = []
    for r in report["results"]:
        rows.append([
            r["arch"], f"{r['params'] / 1e6:.2f}M", f"{r['train_tokens_per_s']:.0f}",
            f"{r['train_ratio']:.3f}", f"{r['flops_ratio_bound']:.3f}",
            f"{r['train_ratio'] / r['flops_ratio_bound']:.3f}",
            _tf(r.get("train_tflops")), _pct(r.get("train_mfu")),
            "-" if r["infer_ratio"] is None else f"{r['infer_sentences_per_s']:.2f}",
            "-" if r["infer_ratio"] is None else f"{r['infer_ratio']:.3f}",
            f"{r['infer_flops_ratio_bound']:.3f}" if r.get("infer_flops_ratio_bound") else "-",
            _pct(r.get("infer_mfu")), _num(r.get("batch_sentences"), "d"),
            _num(r.get("batch_memory_sentences"), "d"), f"{r['peak_mem_mb']:.0f}",
        ])
    lines = [f"device: {report['device']}", "shape: " + json.dumps(report["shape"]), "",
             *_columns(head, rows)]
    return "\n".join(lines + _peak_note(report) + _setting_notes(report))


def format_dry_run(report: Dict, markdown: bool = False) -> str:
    """``--dry-run``: what each row would measure (nothing is timed)."""
    head = ["arch", "params", "batch sents", "target tokens", "mem sents"]
    rows = [[r["arch"], f"{r['params'] / 1e6:.2f}M", str(r["batch_sentences"]),
             str(r["batch_target_tokens"]), _num(r.get("batch_memory_sentences"), "d")]
            for r in report["results"]]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        lines = [f"device: {report['device']}", "shape: " + json.dumps(report["shape"]), "",
                 *_columns(head, rows)]
    return "\n".join(lines + _setting_notes(report))


def sweep_summary(points: List[Dict]) -> Dict[str, Dict]:
    """Per architecture across a ``--sweep-max-tokens`` sweep: its training
    tokens/s, TFLOP/s and MFU at each ``--max-tokens``, and ``saturates_at``:
    the smallest ``--max-tokens`` at which it trains at 90% or more of its best
    tokens/s in the sweep. Below it the step time grows less than the batch:
    the step is bound by what does not scale with the batch (the host's
    launches, Python, synchronisations), not by the device's arithmetic; a
    model whose best point is the largest batch may not have saturated yet
    (``saturated`` False)."""
    out: Dict[str, Dict] = {}
    for point in points:
        for r in point["results"]:
            d = out.setdefault(r["arch"], {"max_tokens": [], "train_tokens_per_s": [],
                                           "train_tflops": [], "train_mfu": [],
                                           "batch_target_tokens": []})
            d["max_tokens"].append(point["max_tokens"])
            for k in ("train_tokens_per_s", "train_tflops", "train_mfu", "batch_target_tokens"):
                d[k].append(r.get(k))
    for d in out.values():
        best = max(d["train_tokens_per_s"])
        i = next(i for i, v in enumerate(d["train_tokens_per_s"]) if v >= 0.9 * best)
        d["saturates_at"] = d["max_tokens"][i]
        d["saturated"] = i < len(d["max_tokens"]) - 1
        d.update(step_time_fit(d["batch_target_tokens"], d["train_tokens_per_s"]))
    return out


def step_time_fit(tokens: List, tokens_per_s: List[float]) -> Dict:
    """The least-squares line ``step time = fixed + tokens * per_token`` over a
    sweep's points: ``fixed_ms``, the part of a step that does not grow with the
    batch (Python, kernel launches, synchronisations: the host), and
    ``host_half_tokens`` = fixed / per_token, the batch at which the host's part
    is half the step (smaller batches are host-bound). None with fewer than two
    batch sizes or a line that does not rise."""
    none = {"fixed_ms": None, "host_half_tokens": None}
    pts = [(float(t), float(t) / v) for t, v in zip(tokens, tokens_per_s) if t and v]
    if len({t for t, _ in pts}) < 2:
        return none
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    ms = sum(s for _, s in pts) / n
    per_token = (sum((t - mt) * (s - ms) for t, s in pts)
                 / sum((t - mt) ** 2 for t, _ in pts))
    if per_token <= 0:
        return none
    fixed = max(0.0, ms - per_token * mt)
    return {"fixed_ms": 1e3 * fixed, "host_half_tokens": fixed / per_token}


def format_sweep(report: Dict, markdown: bool = False) -> str:
    """A ``--sweep-max-tokens`` report: per architecture and batch, training
    tokens/s, TFLOP/s and MFU; where each stops being host-bound."""
    summary = report["summary"]
    sizes = [p["max_tokens"] for p in report["sweep"]]
    head = ["arch"] + [f"{k} @{m}" for m in sizes for k in ("tok/s", "TFLOP/s", "MFU")] \
        + ["saturates at", "fixed ms", "host half at"]
    rows = []
    for arch, d in summary.items():
        row = [f"`{arch}`" if markdown else arch]
        for tok, tf, u in zip(d["train_tokens_per_s"], d["train_tflops"], d["train_mfu"]):
            row += [f"{tok:.0f}", _tf(tf), _pct(u)]
        row.append(f"{d['saturates_at']}" + ("" if d["saturated"] else " (not yet?)"))
        row += [_num(d.get("fixed_ms"), ".1f"), _num(d.get("host_half_tokens"), ".0f")]
        rows.append(row)
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        lines = [f"device: {report['device']}", "shape: " + json.dumps(report["shape"]), "",
                 *_columns(head, rows)]
    note = ["", "saturates at: the smallest --max-tokens with >= 90% of the model's best "
            "training tokens/s in the sweep (below it the step is host-bound); '(not yet?)': "
            "the best is the largest batch measured. fixed ms: the step time's part that "
            "does not grow with the batch (a line fitted to step time against target "
            "tokens); host half at: the batch (target tokens) where that part is half the step"]
    return "\n".join(lines + note + _peak_note(report["sweep"][0]))
