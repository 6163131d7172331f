"""``ctx-bench --segment-tokens 512,1024``: training throughput, peak memory
and the FLOPs bound of models that translate multi-sentence segments (issue
39: plain doc2doc, ``--task document_translation --doc2doc greedy``, and
``transformer_gtrans``) against the sentence-level transformer on the same
tokens.

For each segment length ``L`` in turn (each a full ctx-bench run, its own
models, batches, FLOPs and interleaved repeats; see :mod:`ctx_fairseq.cli.bench`):

* the batch: synthetic documents of random tokens (sentences of ``--src-len``
  / ``--tgt-len`` tokens, each ended by ``</s>``; ``k = floor(L / max(src,
  tgt))`` sentences make a full segment and each document holds ``2 k``
  sentences) are planned into greedy segments of at most ``L`` tokens by the
  task's own planner (:func:`ctx_fairseq.data.segments.plan_segments`), laid
  out by its dataset (:class:`~ctx_fairseq.data.segment_dataset.SegmentDataset`:
  ``x_1 <sep> ... x_k </s>``) and batched by the task's batch iterator with
  fairseq-train's arguments (``--max-tokens``, the positions, the required
  batch-size multiple, the seed): the batch measured is the one with the most
  target tokens. The tokens are drawn below the separator's index, so the
  sentence-level dictionary holds every one of them;
* each ``--archs`` model (default ``transformer,transformer_gtrans``) runs on
  those segments: ``ARCH[--doc2doc greedy --doc2doc-max-tokens L
  --source-context-size 0]`` (the task's options, so the model is built by the
  document task with the separator in its dictionary; the label is the spec
  that reproduces the row). The first is the **doc2doc** reference row;
* the ``--baseline`` (``transformer``) runs on **the same sentences** as
  sentences: the segments' sentences collated by fairseq's
  ``LanguagePairDataset`` (same tokens, each sentence with its own ``</s>``
  where the segment has ``<sep>``), so every row trains on the same number of
  target tokens;
* in the precision the model trains in: fp32 on the CPU (``--fp16`` on CUDA,
  with ``--train-step fairseq`` for fairseq-train's own ``--fp16``).

The summary gives per row its tokens/s and ratio to the sentence row, the
FLOPs bound per target token (``FlopCounter``: every product, the attention's
``L^2`` terms included, on the padded batch), the analytic ``L^2`` part of it
(:func:`ctx_fairseq.flops.attention_step_flops`: ``Q K^T`` and ``A V``) and its
share, the peak memory and its ratio to the sentence row, and for every
segment row after the first its step time over the doc2doc step
(``step_vs_doc2doc``; issue 39's target for G-Transformer: at most 1.25) with
the FLOPs ratio that bounds it. Beam search is not part of this mode
(``--decode-bench`` measures decoding).
"""

import copy
import gc
import json
import math
from typing import Dict, List, Optional

import numpy as np
import torch

from ctx_fairseq.data.contract import task_options
from ctx_fairseq.tasks.context_options import task_setting
from ctx_fairseq.cli.bench_specs import parse_spec, train_batches

__all__ = ["segment_sample", "segment_specs", "short_label", "run_segments", "format_segments",
           "segment_summary", "synthetic_segment_documents", "sentences_per_segment"]

#: what every ``--archs`` spec gets in ``--segment-tokens`` mode
DOC2DOC_OPTIONS = ("--doc2doc", "greedy", "--source-context-size", "0")


def doc2doc_of(task) -> str:
    """The task's ``--doc2doc`` mode (``none`` for a task without it)."""
    spec = task_options(task)
    mode = getattr(spec, "doc2doc", "none") if spec is not None else "none"
    return "none" if mode is None else str(getattr(mode, "value", mode))


def sentences_per_segment(args, length: int) -> int:
    """Sentences of a full greedy segment of at most ``length`` tokens."""
    k = length // max(args.src_len, args.tgt_len)
    if k < 1:
        raise ValueError(f"--segment-tokens {length}: shorter than one sentence "
                         f"(--src-len {args.src_len}, --tgt-len {args.tgt_len})")
    return k


def synthetic_segment_documents(args, length: int, seed: int):
    """``(base, doc_ids)``: a ``LanguagePairDataset`` of documents of ``2 k``
    sentences (``k`` = :func:`sentences_per_segment`), enough for the largest
    batch of ``--max-tokens``, tokens drawn (seeded) from the bench's
    ``--vocab`` words (below the separator's index)."""
    from fairseq.data import Dictionary, LanguagePairDataset

    d = Dictionary()
    for i in range(args.vocab - d.nspecial):
        d.add_symbol(f"w{i}")
    k = sentences_per_segment(args, length)
    seg_tokens = k * max(args.src_len, args.tgt_len)
    docs = math.ceil(max(1, args.max_tokens // seg_tokens) / 2) + 1
    n = docs * 2 * k
    g = torch.Generator().manual_seed(seed)

    def sents(n_tokens):
        t = torch.randint(d.nspecial, args.vocab, (n, n_tokens), generator=g)
        t[:, -1] = d.eos()
        return list(t)

    src, tgt = sents(args.src_len), sents(args.tgt_len)
    base = LanguagePairDataset(src, np.full(n, args.src_len), d, tgt, np.full(n, args.tgt_len),
                               d, shuffle=True)
    return base, [f"d{i // (2 * k)}" for i in range(n)]


def _segment_batch(bench, task, model, margs, length: int, seed: int, separators):
    """``(segments, batch)``: the synthetic documents as the task's segments
    and the indices of the batch measured (the task's batch iterator with
    fairseq-train's arguments; the one with the most target tokens)."""
    from fairseq import utils as fairseq_utils

    from ctx_fairseq.data.segment_dataset import SegmentDataset, check_positions
    from ctx_fairseq.data.segments import document_starts, plan_segments

    a = bench.args
    base, doc_ids = synthetic_segment_documents(a, length, seed)
    plan = plan_segments(base.src_sizes, base.tgt_sizes, doc_ids, "greedy", length)
    names = [doc_ids[int(i)] for i in document_starts(doc_ids)[:-1]]
    ds = SegmentDataset(base, plan, separators[0], separators[1], names, "<bench documents>")
    max_positions = None  # (the sentence row: no segment is its input, none is filtered)
    if model is not None and doc2doc_of(task) != "none":
        check_positions(ds, task_setting(task, "max_source_positions"),
                        task_setting(task, "max_target_positions"), "bench")
        max_positions = fairseq_utils.resolve_max_positions(
            task.max_positions(), model.max_positions(), a.max_tokens)
    batches = train_batches(task, ds, margs, a.max_tokens, seed, max_positions)
    batch = max(batches, key=lambda b: (int(ds.tgt_sizes[b].sum()), -int(b[0])))
    return ds, batch


def segment_sample(bench, task, model, margs, seed: int) -> Dict:
    """The training sample of a row in segment mode: a doc2doc task's model
    gets the segments of its ``--doc2doc-max-tokens``; a sentence-level model
    the same batch's sentences, one by one, at ``--segment-tokens``."""
    from fairseq import utils as fairseq_utils

    if doc2doc_of(task) != "none":
        spec = task_options(task)
        sep = spec.doc2doc_separator
        separators = (task.source_dictionary.index(sep), task.target_dictionary.index(sep))
        ds, batch = _segment_batch(bench, task, model, margs, int(spec.doc2doc_max_tokens),
                                   seed, separators)
        sample = ds.collater([ds[int(i)] for i in batch])
    else:
        length = getattr(bench.args, "segment_tokens", None)
        if not length:
            raise ValueError("a sentence-level row of the segment bench needs --segment-tokens")
        unk = task.source_dictionary.unk()  # (the sizes only: no segment is laid out)
        ds, batch = _segment_batch(bench, task, None, margs, int(length), seed, (unk, unk))
        ids = np.concatenate([ds.sentence_ids(int(i)) for i in batch])
        sample = ds.base.collater([ds.base[int(j)] for j in ids])
    if bench.device.type == "cuda":
        sample = fairseq_utils.move_to_cuda(sample, bench.device)
    return sample


def segment_specs(specs: List[str], length: int) -> List[str]:
    """Each ``--archs`` spec with the doc2doc task's options at ``length``."""
    out = []
    for spec in specs:
        arch, extra = parse_spec(spec)
        opts = [*extra, *DOC2DOC_OPTIONS, "--doc2doc-max-tokens", str(length)]
        out.append(f"{arch}[{' '.join(opts)}]")
    return out


def run_segments(args, specs: List[str], lengths: List[int], bench_cls, log=print) -> Dict:
    """The bench at each segment length in turn (module docstring); ``specs``:
    the ``--archs`` models, the baseline excluded; ``bench_cls``: ctx-bench's
    ``Bench`` (given, not imported: ``cli.bench`` imports this module)."""
    Bench = bench_cls

    points = []
    for length in lengths:
        a = copy.copy(args)
        a.segment_tokens, a.infer_sentences = length, 0
        log(f"ctx-bench: segments of {length} tokens "
            f"({sentences_per_segment(a, length)} sentences)")
        report = Bench(a).run([args.baseline] + segment_specs(specs, length), log=log)
        points.append({"segment_tokens": length, **report})
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    shape = dict(points[0]["shape"], segment_tokens=lengths)
    out = {"device": points[0]["device"], "shape": shape, "precision": points[0]["precision"],
           "segments": points}
    if getattr(args, "dry_run", False):
        out["dry_run"] = True
        return out
    out["summary"] = segment_summary(points)
    return out


def short_label(spec: str) -> str:
    """A row's name in the tables: the architecture and its own options, without
    the doc2doc options every segment row has (the full spec is in the JSON)."""
    arch, extra = parse_spec(spec)
    drop, keep, i = set(DOC2DOC_OPTIONS[::2]) | {"--doc2doc-max-tokens"}, [], 0
    while i < len(extra):
        if extra[i] in drop:
            i += 2
            continue
        keep.append(extra[i])
        i += 1
    name = f"{arch}[{' '.join(keep)}]" if keep else arch
    return f"{name} ({_unit(spec)})"


def _unit(label: str) -> str:
    return "segments" if "--doc2doc" in parse_spec(label)[1] else "sentences"


def segment_summary(points: List[Dict]) -> List[Dict]:
    """One row per model and segment length (module docstring)."""
    rows = []
    for p in points:
        res = p["results"]
        base = res[0]
        seg = [r for r in res if _unit(r["arch"]) == "segments"]
        ref = seg[0] if seg else None
        for r in res:
            tokens = r["batch_target_tokens"]
            att = r.get("train_attention_flops")
            row = {
                "segment_tokens": p["segment_tokens"], "arch": r["arch"], "unit": _unit(r["arch"]),
                "batch_sequences": r["batch_sentences"], "batch_target_tokens": tokens,
                "train_tokens_per_s": r["train_tokens_per_s"],
                "ratio_vs_sentences": r["train_ratio"],
                "flops_per_token": r["train_flops"] / tokens,
                "flops_ratio_bound": r["flops_ratio_bound"],
                "attention_flops_per_token": None if att is None else att / tokens,
                "attention_share": None if att is None else att / r["train_flops"],
                "peak_mem_mb": r["peak_mem_mb"],
                "mem_ratio_vs_sentences": r["peak_mem_mb"] / base["peak_mem_mb"],
                "step_vs_doc2doc": None, "flops_vs_doc2doc": None,
            }
            if ref is not None and row["unit"] == "segments":
                # the same tokens: the step-time ratio is the inverse tokens/s ratio
                row["step_vs_doc2doc"] = ref["train_tokens_per_s"] / r["train_tokens_per_s"]
                row["flops_vs_doc2doc"] = ((r["train_flops"] / tokens)
                                           / (ref["train_flops"] / ref["batch_target_tokens"]))
            rows.append(row)
    return rows


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_segments(report: Dict, markdown: bool = False) -> str:
    """The segment bench's summary as a table (or Markdown)."""
    if report.get("dry_run"):
        head = ["L", "arch", "params", "batch seqs", "target tokens"]
        rows = [[str(p["segment_tokens"]), short_label(r["arch"]), f"{r['params'] / 1e6:.2f}M",
                 str(r["batch_sentences"]), str(r["batch_target_tokens"])]
                for p in report["segments"] for r in p["results"]]
        note = []
    else:
        head = ["L", "arch", "seqs", "tokens", "tok/s", "vs sents", "MFLOP/tok", "FLOPs bound",
                "L^2 share", "peak MB", "mem vs sents", "step vs doc2doc", "FLOPs vs doc2doc"]
        rows = [[str(r["segment_tokens"]), short_label(r["arch"]), str(r["batch_sequences"]),
                 str(r["batch_target_tokens"]), f"{r['train_tokens_per_s']:.0f}",
                 f"{r['ratio_vs_sentences']:.3f}", f"{r['flops_per_token'] / 1e6:.4g}",
                 f"{r['flops_ratio_bound']:.3f}", _f(r["attention_share"], ".1%"),
                 f"{r['peak_mem_mb']:.0f}", f"{r['mem_ratio_vs_sentences']:.2f}",
                 _f(r["step_vs_doc2doc"], ".3f"), _f(r["flops_vs_doc2doc"], ".3f")]
                for r in report["summary"]]
        note = ["", "vs sents: tokens/s over the sentence transformer's on the same tokens; "
                "FLOPs bound: its FLOPs per target token over the row's (L^2 terms included); "
                "L^2 share: the attention products' part of the row's FLOPs; step vs doc2doc: "
                "the row's step time over the first segment row's (G-Transformer target: "
                "<= 1.25)"]
    if markdown:
        rows = [[f"`{c}`" if i == 1 else c for i, c in enumerate(r)] for r in rows]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        fmt = lambda c: "  ".join(x.ljust(w) if i == 1 else x.rjust(w)  # noqa: E731
                                  for i, (x, w) in enumerate(zip(c, widths)))
        lines = [f"device: {report['device']}", "shape: " + json.dumps(report["shape"]), "",
                 fmt(head), fmt(["-" * w for w in widths]), *[fmt(r) for r in rows]]
    return "\n".join(lines + note)


def parse_lengths(text: Optional[str]) -> Optional[List[int]]:
    """``--segment-tokens 512,1024`` -> ``[512, 1024]`` (ValueError on bad input)."""
    if text is None:
        return None
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--segment-tokens {text!r}: expected integers separated by commas")
    if not out or min(out) < 2 or len(set(out)) != len(out):
        raise ValueError(f"--segment-tokens {text!r}: distinct lengths, each at least 2")
    return out
