"""``ctx-bench --segment-tokens L,...`` with ``--attention-bench`` or
``--decode-bench`` (issue 39, item 8), and the dispatch of the segment modes
(the training bench itself: :mod:`ctx_fairseq.cli.bench_doc2doc`).

``--attention-bench``: one attention module of G-Transformer against fairseq's
``MultiheadAttention`` of the same shape and weights, as the transformer's
layers call it on the same segments. Per ``L``: a batch of ``--max-tokens //
L`` segments of ``L`` tokens (sentences of ``--tgt-len`` tokens, the last
token of each a separator: the group tags of
:func:`~ctx_fairseq.modules.group_attention.source_group_tags`), ``--embed-dim``
and ``--heads``, dropout 0 (the base architecture's attention dropout). Kinds:

* ``self``: encoder self-attention; plain: no mask (the encoder passes none
  when the batch has no padding); group: the ``B x L x L`` group mask;
* ``causal``: decoder self-attention; plain: fairseq's future mask (an
  ``L x L`` float ``-inf`` triangle, as ``buffered_future_mask``); group:
  group and causal mask;
* ``cross``: decoder-encoder attention (``static_kv``); plain: the encoder's
  all-False padding mask; group: the cross group mask;
* ``gated`` (not a like-for-like pair; for the record): the top layers'
  gated self-attention (group + global + gate) against the plain one.

Each is timed for a training pass (forward, then backward of the output's
sum, in training mode: the group attention takes ``F.scaled_dot_product_attention``
as it does when no weights are asked for) and for a forward without
gradients, ``--train-steps`` calls per measurement, the two modules
interleaved over ``--repeats`` rounds (the order alternating each round):
the times are the medians, the ratios the median of the rounds' ratios
(a round's two modules run back to back). The masks are built once
per batch outside the timed part (the model builds them once per pass for all
its layers); their build time is reported apart (``mask_ms``). The ratio
group / plain is issue 39's target (at most 1.10 for ``self``, ``causal`` and
``cross``). ``--device cuda`` runs it on the GPU (synchronised timing),
``--fp16`` with both modules and their inputs in half precision (fairseq's
``--fp16`` model).

``--decode-bench``: fairseq's ``SequenceGenerator`` (beam ``--beam``) on
``--decode-segments`` segments of the training bench's layout, for each
``--archs`` model on segments, with and without the sentence-count frame
(:class:`~ctx_fairseq.tasks.sentence_frame.SentenceFrame`, as the task's
``inference_step`` applies it), and the ``--baseline`` on the same sentences
as sentences. Every run does the same work: without the frame every
hypothesis is forced to the segment's target length ``T`` (``min_len =
max_len``); with it, every sentence to exactly ``--tgt-len - 1`` tokens
(``--doc2doc-min-sentence-len`` = ``--tgt-len - 1``, ``--doc2doc-max-len-a
0 -b`` the same), so ``T`` tokens too; sentences: ``--tgt-len`` tokens each.
Reported: output tokens per second and, per model, the frame's time over the
run without it.
"""

import copy
import statistics
import time
from typing import Dict, List

import torch

from ctx_fairseq.data.contract import task_options
from ctx_fairseq.cli.bench_doc2doc import (
    format_segments,
    parse_lengths,
    run_segments,
    segment_specs,
    sentences_per_segment,
    short_label,
)
from ctx_fairseq.cli.bench_specs import parse_spec, split_specs

__all__ = ["segment_main", "attention_bench", "decode_bench", "ATTENTION_KINDS"]

ATTENTION_KINDS = ("self", "causal", "cross")
DEFAULT_SEGMENT_ARCHS = "transformer,transformer_gtrans"


def _sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _time(fn, n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` calls (CUDA: synchronised)."""
    _sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    _sync()
    return (time.perf_counter() - start) / n


def _segment_tags(bsz: int, length: int, sentence: int, device="cpu") -> torch.Tensor:
    """Group tags of ``bsz`` segments of ``length`` tokens whose sentences have
    ``sentence`` tokens (the last may be shorter), as ``source_group_tags``
    gives them (the separator in the group it ends)."""
    from ctx_fairseq.modules.group_attention import source_group_tags

    tokens = torch.full((bsz, length), 5, dtype=torch.long, device=device)
    tokens[:, sentence - 1::sentence] = 4  # the separator's index here
    tokens[:, -1] = 2
    return source_group_tags(tokens, sep=4, pad=1)


def _pair(kind: str, length: int, args):
    """``(group module, plain module, group call, plain call, mask build)``."""
    from fairseq import utils
    from fairseq.modules import MultiheadAttention

    from ctx_fairseq.modules.group_attention import (
        GatedGroupAttention,
        GroupAttention,
        cross_group_mask,
        self_group_mask,
    )

    e, h = args.embed_dim, args.heads
    # the precision the model trains in: fp32, or fairseq's --fp16 half model (CUDA)
    dev, dtype = torch.device(args.device), torch.float16 if args.fp16 else torch.float32
    bsz = max(1, args.max_tokens // length)
    cross = kind == "cross"
    kw = dict(encoder_decoder_attention=True) if cross else dict(self_attention=True)
    group = (GatedGroupAttention if kind == "gated" else GroupAttention)(e, h, dropout=0.0, **kw)
    plain = MultiheadAttention(e, h, dropout=0.0, **kw)
    plain.load_state_dict({k: v for k, v in group.state_dict().items()
                           if not k.startswith(("global_attn.", "gate."))})
    group, plain = group.to(dev, dtype), plain.to(dev, dtype)
    x = torch.randn(length, bsz, e, device=dev, dtype=dtype, requires_grad=True)
    mem = torch.randn(length, bsz, e, device=dev, dtype=dtype, requires_grad=True) if cross else x
    tags = _segment_tags(bsz, length, args.tgt_len, dev)
    causal = kind in ("causal", "gated")

    def build_mask():
        if cross:
            return cross_group_mask(tags, tags)
        return self_group_mask(tags, causal=causal)

    group.group_mask = build_mask()
    future = (utils.fill_with_neg_inf(torch.zeros(length, length, device=dev)).triu(1).to(dtype)
              if causal else None)
    padding = torch.zeros(bsz, length, dtype=torch.bool, device=dev) if cross else None

    def group_call():
        return group(x, mem, mem, need_weights=False, static_kv=cross)[0]

    def plain_call():
        return plain(x, mem, mem, key_padding_mask=padding, need_weights=False,
                     static_kv=cross, attn_mask=future)[0]

    return group, plain, group_call, plain_call, build_mask


def attention_bench(args, lengths: List[int], kinds=ATTENTION_KINDS, log=print) -> Dict:
    """The attention micro-benchmark (module docstring)."""
    rows = []
    for length in lengths:
        for kind in kinds:
            torch.manual_seed(args.seed)
            group, plain, gcall, pcall, build_mask = _pair(kind, length, args)
            times = {k: [] for k in ("group_train", "plain_train", "group_fwd", "plain_fwd")}

            def train(call):
                return lambda: call().sum().backward()

            for r in range(args.repeats + 1):  # round 0 warms up, untimed
                order = [("group", gcall), ("plain", pcall)]
                for name, call in (order if r % 2 else order[::-1]):
                    mod = group if name == "group" else plain
                    mod.train()
                    t = _time(train(call), args.train_steps)
                    mod.eval()
                    with torch.no_grad():
                        f = _time(call, args.train_steps)
                    if r:
                        times[f"{name}_train"].append(t)
                        times[f"{name}_fwd"].append(f)
            med = {k: statistics.median(v) for k, v in times.items()}
            # each round's group and plain run back to back: the median of the rounds'
            # ratios is robust to load that drifts between rounds
            paired = {m: statistics.median(g / p for g, p in zip(times[f"group_{m}"],
                                                                  times[f"plain_{m}"]))
                      for m in ("train", "fwd")}
            mask_s = _time(build_mask, max(1, args.train_steps))
            bsz = max(1, args.max_tokens // length)
            row = {"segment_tokens": length, "kind": kind, "batch": bsz,
                   **{f"{k}_ms": 1e3 * v for k, v in med.items()},
                   "train_ratio": paired["train"], "forward_ratio": paired["fwd"],
                   "mask_ms": 1e3 * mask_s, "repeats": {k: v for k, v in times.items()}}
            rows.append(row)
            log(f"ctx-bench: attention {kind} @{length}: group/plain train "
                f"{row['train_ratio']:.3f}, forward {row['forward_ratio']:.3f}")
            del group, plain
    return {"attention_bench": rows}


def _generators(model, task, beam: int, total: int):
    """``(plain, framed)`` SequenceGenerators: the first forced to ``total``
    tokens (``</s>`` included), the second bounded by the frame."""
    from fairseq.sequence_generator import SequenceGenerator

    d = task.target_dictionary
    plain = SequenceGenerator([model], d, beam_size=beam, max_len_a=0, max_len_b=total - 1,
                              min_len=total - 1)
    framed = SequenceGenerator([model], d, beam_size=beam, max_len_a=0, max_len_b=total - 1,
                               min_len=1)
    return plain, framed


def _decode_runs(bench, spec: str, framed_too: bool):
    """``[(label, run)]`` of one model: beam search on its batch, with and
    without the frame (a segment model) or as sentences (``framed_too`` False)."""
    from contextlib import nullcontext

    from ctx_fairseq.tasks.sentence_frame import FrameOptions, SentenceFrame

    a = bench.args
    arch, extra = parse_spec(spec)
    torch.manual_seed(a.seed)
    model, task, margs = bench.build(arch, extra)
    model.eval()
    if a.fp16:  # as fairseq-generate --fp16
        model.half()
    sample = bench.sample(model, task, margs, a.seed)
    ni = sample["net_input"]
    n = a.decode_segments if framed_too else a.decode_segments * sentences_per_segment(
        a, a.segment_tokens)
    net_input = {"src_tokens": ni["src_tokens"][:n], "src_lengths": ni["src_lengths"][:n]}
    total = int(sample["target"][:n].ne(task.target_dictionary.pad()).sum(1).max())
    plain, framed = _generators(model, task, a.beam, total)
    runs = []

    def run(gen, frame):
        s = {"net_input": net_input, "id": torch.arange(n)}
        with (SentenceFrame(gen, s, frame[0], frame[1], frame[2]) if frame else nullcontext()):
            hyps = gen.generate([model], s)
        return hyps

    label = spec
    runs.append((f"{label} (no frame)" if framed_too else label, lambda: run(plain, None)))
    if framed_too:
        sep = task_options(task).doc2doc_separator
        opts = FrameOptions(separator=sep, min_sentence_len=a.tgt_len - 1, max_len_a=0.0,
                            max_len_b=a.tgt_len - 1)
        frame = (task.source_dictionary.index(sep), task.target_dictionary.index(sep), opts)
        runs.append((f"{label} (frame)", lambda: run(framed, frame)))
    return runs, n, total, task


@torch.no_grad()
def decode_bench(bench_args, specs: List[str], lengths: List[int], bench_cls,
                 log=print) -> Dict:
    """The decoding benchmark (module docstring): ``specs`` the segment
    models (``--archs``), the baseline on sentences first; ``bench_cls``:
    ctx-bench's ``Bench``."""
    Bench = bench_cls

    rows = []
    for length in lengths:
        a = copy.copy(bench_args)
        a.segment_tokens = length
        bench = Bench(a)
        entries = []
        for i, spec in enumerate([a.baseline] + segment_specs(specs, length)):
            runs, n, total, task = _decode_runs(bench, spec, framed_too=i > 0)
            for label, fn in runs:
                hyps = fn()  # warm-up, and the check that the work is what is claimed
                lengths_out = sorted({int(h[0]["tokens"].numel()) for h in hyps})
                entries.append({"label": label, "fn": fn, "n": n, "tokens": n * total,
                                "output_lengths": lengths_out, "times": []})
        for r in range(a.repeats):
            order = entries[r % len(entries):] + entries[:r % len(entries)]
            for e in order:
                e["times"].append(_time(e["fn"], 1))
        for e in entries:
            t = statistics.median(e["times"])
            rows.append({"segment_tokens": length, "run": e["label"], "sequences": e["n"],
                         "output_tokens": e["tokens"], "output_lengths": e["output_lengths"],
                         "seconds": t, "tokens_per_s": e["tokens"] / t,
                         "seconds_repeats": e["times"]})
        for row in rows:
            if row["segment_tokens"] == length and row["run"].endswith("(frame)"):
                plain = next(x for x in rows if x["segment_tokens"] == length
                             and x["run"] == row["run"][:-len("(frame)")] + "(no frame)")
                row["frame_vs_no_frame"] = row["seconds"] / plain["seconds"]
        log(f"ctx-bench: decoding @{length} done")
    return {"decode_bench": rows, "beam": bench_args.beam}


def format_attention(report: Dict, markdown: bool = False) -> str:
    head = ["L", "kind", "batch", "group train ms", "plain train ms", "train ratio",
            "group fwd ms", "plain fwd ms", "fwd ratio", "mask ms"]
    rows = [[str(r["segment_tokens"]), r["kind"], str(r["batch"]),
             f"{r['group_train_ms']:.2f}", f"{r['plain_train_ms']:.2f}", f"{r['train_ratio']:.3f}",
             f"{r['group_fwd_ms']:.2f}", f"{r['plain_fwd_ms']:.2f}", f"{r['forward_ratio']:.3f}",
             f"{r['mask_ms']:.2f}"] for r in report["attention_bench"]]
    return _table(head, rows, markdown)


def format_decode(report: Dict, markdown: bool = False) -> str:
    head = ["L", "run", "seqs", "output tokens", "s", "tok/s", "frame / no frame"]
    rows = [[str(r["segment_tokens"]), _run_label(r["run"]), str(r["sequences"]),
             str(r["output_tokens"]),
             f"{r['seconds']:.3f}", f"{r['tokens_per_s']:.1f}",
             f"{r['frame_vs_no_frame']:.3f}" if "frame_vs_no_frame" in r else "-"]
            for r in report["decode_bench"]]
    return _table(head, rows, markdown)


def _run_label(run: str) -> str:
    """A decoding run's short name: the model's (``short_label``) and the frame's state."""
    spec, _, frame = run.partition(" (")
    return short_label(spec) + (f" ({frame}" if frame else "")


def _table(head, rows, markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    fmt = lambda c: "  ".join(x.ljust(w) if i == 1 else x.rjust(w)  # noqa: E731
                              for i, (x, w) in enumerate(zip(c, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *[fmt(r) for r in rows]])


def segment_main(a, specs: List[str], parser, log, bench_cls) -> None:
    """ctx-bench's segment modes (module docstrings): ``specs`` as ctx-bench
    has them (the baseline first); ``bench_cls``: ctx-bench's ``Bench``
    (given, not imported: ``cli.bench`` imports this module)."""
    import json

    try:
        lengths = parse_lengths(a.segment_tokens)
    except ValueError as err:
        parser.error(str(err))
    if lengths is None:
        parser.error("--attention-bench and --decode-bench need --segment-tokens")
    if a.attention_bench and a.decode_bench:
        parser.error("--attention-bench and --decode-bench: one at a time")
    if a.decode_segments < 1:
        parser.error("--decode-segments must be >= 1")
    if a.sweep_max_tokens or a.trace:
        parser.error("--segment-tokens cannot be combined with --sweep-max-tokens or --trace")
    seg_specs = split_specs(DEFAULT_SEGMENT_ARCHS) if a.archs is None else specs[1:]
    try:
        for length in lengths:
            sentences_per_segment(a, length)
        if a.attention_bench:
            report = attention_bench(a, lengths, log=log)
            text = format_attention(report, a.markdown)
        elif a.decode_bench:
            report = decode_bench(a, seg_specs, lengths, bench_cls, log=log)
            text = format_decode(report, a.markdown)
        else:
            report = run_segments(a, seg_specs, lengths, bench_cls, log=log)
            text = format_segments(report, a.markdown)
    except ValueError as err:
        parser.error(str(err))
    print(json.dumps(report, indent=2) if a.json else text)

