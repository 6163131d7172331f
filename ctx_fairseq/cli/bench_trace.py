"""``ctx-bench --trace``: what one training step of a whole-document model
costs on the accelerator's path, counted on the CPU (no GPU needed).

Each ``--archs`` model and the ``--baseline`` are built and given their
batch as ctx-bench builds them (the document task's own batching at
``--max-tokens``, ``--doc-batch``), in float32, and one training step
(forward, label-smoothed cross-entropy, backward) runs with the CPU's
shortcuts off (:func:`ctx_fairseq.modules.cpu_shortcuts.accelerator_path`:
what a GPU runs) and a frozen memory's cache emptied first (cold: the
memory is encoded in the step, as in the first epoch). Reported per model:

* ``step_flops`` and ``flops_per_target_token`` (forward and backward,
  :class:`ctx_fairseq.flops.FlopCounter`), and ``flops_ratio``: per target
  token, against the baseline's step;
* ``peak_live_gb``: the step's peak of live tensors (:class:`LiveBytes`;
  the gradients among them) plus the parameters and Adam's two moments
  (float32);
With ``--path CKPT --data DIR [--split test]`` a trained checkpoint is
traced instead, on every batch of the split (the task's batching at
``--max-tokens``), the figures summed over the batches (no baseline).

* per context layer (``context_layers``), its memory projection, forward and
  backward run again alone on the inputs the step gave it: ``aten_ops``
  (dispatched ops that launch a kernel: views and metadata ops are not
  counted; a fused op counts once), ``flops``, and for the hierarchical word
  level ``word_flops_executed`` (the selected sentences' forward and
  backward) against ``word_flops_selected``, the work on the selected
  sentences' real words (``12 w d`` per selected (query token, head,
  sentence) of ``w`` words: 4 forward, 8 backward; the backward's
  recomputation of the scores is overhead, not work), and
  ``selected_share``: the share of the visible (query token, head,
  sentence) triples that Eq. 3's sparsemax gives a weight.
"""

import contextlib
import json
import os
import weakref
from typing import Dict, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LiveBytes", "OpCounter", "trace", "trace_main", "format_trace"]

aten = torch.ops.aten
#: ops that launch no kernel (besides views): allocation and aliasing
_NO_KERNEL = {aten.detach, aten.alias, aten.empty, aten.empty_strided, aten.lift_fresh,
              aten._unsafe_view, aten.set_, aten.resize_}


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the tensors ops produce that are alive at once (a
    tensor counts until its Python object is collected; a storage once)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.held = {}

    def _release(self, key):
        self.live -= self.held.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                key = (st.data_ptr(), st.nbytes())
                if key[1] == 0 or key in self.held:
                    continue
                self.held[key] = key[1]
                self.live += key[1]
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._release, key)
        return out


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched that launch a kernel (``total``;
    ``by_op`` per op): views and :data:`_NO_KERNEL` are not counted."""

    def __init__(self):
        super().__init__()
        self.total = 0
        self.by_op: Dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket not in _NO_KERNEL:
            self.total += 1
            name = func.overloadpacket.__name__
            self.by_op[name] = self.by_op.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _detached(x):
    if isinstance(x, torch.Tensor):
        return x.detach().requires_grad_(x.requires_grad and x.is_floating_point())
    return x


class _Calls:
    """Records the calls of the context layers' ``project_memory`` and
    ``forward`` during a step (their inputs, detached), and of the selected
    sentences' word level during a layer's re-run."""

    def __init__(self):
        self.layers: List[Dict] = []
        self.words: List[tuple] = []

    @contextlib.contextmanager
    def recording(self):
        from ctx_fairseq.modules import selective_attention as sa

        cls = sa.DocumentContextLayer
        proj, fwd, words = cls.project_memory, cls.forward, sa.selected_word_attention
        calls = self

        def project_memory(layer, *a, **k):
            calls.layers.append({"layer": layer, "project": ([_detached(x) for x in a],
                                                             {n: _detached(v) for n, v in
                                                              k.items()})})
            return proj(layer, *a, **k)

        def forward(layer, r, memory, *a, **k):
            calls.layers[-1]["forward"] = (_detached(r), [_detached(x) for x in a],
                                           {n: _detached(v) for n, v in k.items()})
            return fwd(layer, r, memory, *a, **k)

        def selected(*a, **k):
            calls.words.append(([_detached(x) for x in a], dict(k)))
            return words(*a, **k)

        cls.project_memory, cls.forward, sa.selected_word_attention = \
            project_memory, forward, selected
        try:
            yield self
        finally:
            cls.project_memory, cls.forward, sa.selected_word_attention = proj, fwd, words


def _layer_alone(call: Dict) -> Dict:
    """One context layer's memory projection, forward and backward on the
    inputs the step gave it: ops, FLOPs, and the word level's work."""
    from ctx_fairseq.flops import FlopCounter

    layer = call["layer"]
    pa, pk = call["project"]
    r, fa, fk = call["forward"]
    with torch.no_grad():
        out = layer(r, layer.project_memory(*pa, **pk), *fa, **fk)[0]
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
    ops, inner = OpCounter(), _Calls()  # (inner: the word level's calls of this run)
    with inner.recording(), ops, FlopCounter() as flops:
        out = layer(r, layer.project_memory(*pa, **pk), *fa, **fk)[0]
        out.backward(grad)
    row = {"aten_ops": ops.total, "flops": float(flops.total),
           "ops_by_kind": dict(sorted(ops.by_op.items(), key=lambda x: -x[1])[:12])}
    if inner.words:
        row.update(_word_level(inner.words))
    with torch.no_grad():
        info = layer(r, layer.project_memory(*pa, **pk), *fa,
                     **dict(fk, return_stats=True))[1]
    if "visible_sentences_sum" in info:
        row["selected_sum"] = float(info["sentence_support_sum"])
        row["visible_sum"] = float(info["visible_sentences_sum"])
        row["selected_share"] = row["selected_sum"] / max(1.0, row["visible_sum"])
    return row


def _word_level(words: List[tuple]) -> Dict:
    """Executed FLOPs of the selected sentences' word level (forward and
    backward, run again alone) and the work on their real words."""
    from ctx_fairseq.flops import FlopCounter
    from ctx_fairseq.modules.selected_word_attention import selected_word_attention

    executed = selected = 0.0
    for args, kwargs in words:
        q, k, v, weight, index, word_mask = args[:6]
        x = [t.detach().requires_grad_() for t in (q, k, v, weight)]
        with FlopCounter() as flops:
            out, _ = selected_word_attention(*x, index, word_mask, *args[6:], **kwargs)
            out.sum().backward()
        executed += float(flops.total)
        real = word_mask.sum(1)[index].to(torch.float64)  # G x J: each sentence's words
        on = (weight != 0).to(torch.float64)
        # the work: 4 w d forward (scores, values), 8 w d backward (g . v, dq, dk, dv);
        # the backward's recomputed scores are overhead, not work
        selected += 12.0 * q.size(-1) * float((on * real[:, None, None, :]).sum())
    return {"word_flops_executed": executed, "word_flops_selected": selected,
            "word_flops_ratio": executed / selected if selected else None}


def _step(bench, entry, calls: _Calls) -> Dict:
    """One cold training step under the counters; its context layers recorded."""
    from ctx_fairseq.flops import FlopCounter

    model, crit, sample = entry["model"], entry["crit"], entry["sample"]
    if getattr(model, "memory_cache", None) is not None:
        model.clear_memory_cache()  # cold: the memory is encoded in the step
    model.train()
    model.zero_grad(set_to_none=True)
    live = LiveBytes()
    with calls.recording(), live, FlopCounter() as flops:
        loss, _, _ = crit(model, sample)
        loss.backward()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    tokens = int(sample["target"].ne(entry["task"].target_dictionary.pad()).sum())
    return {"step_flops": float(flops.total), "target_tokens": tokens,
            "flops_per_target_token": float(flops.total) / tokens,
            # the gradients are in the step's live tensors; Adam keeps two moments
            "peak_live_gb": (live.peak + 3 * params) / 2 ** 30,
            "batch_sentences": int(sample["nsentences"])}


def trace(bench, specs: List[str], log=print) -> Dict:
    """The ``--trace`` report over ``specs`` (the baseline first)."""
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    from ctx_fairseq.cli.bench_specs import memory_sentences, parse_spec
    from ctx_fairseq.modules.cpu_shortcuts import accelerator_path

    a = bench.args
    rows = []
    for label in specs:
        arch, extra = parse_spec(label)
        torch.manual_seed(a.seed)
        model, task, margs = bench.build(arch, extra)
        entry = {"model": model, "task": task, "sample": bench.sample(model, task, margs, a.seed),
                 "crit": LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False,
                                                            label_smoothing=0.1)}
        calls = _Calls()
        with accelerator_path():
            row = {"arch": label, **_step(bench, entry, calls),
                   "memory_sentences": memory_sentences(entry["sample"])}
            row["context_layers"] = [_layer_alone(c) for c in list(calls.layers)
                                     if "forward" in c]
        rows.append(row)
        log(f"ctx-bench --trace: {label}: {row['step_flops'] / 1e9:.1f} GFLOP, "
            f"{row['target_tokens']} target tokens"
            + "".join(f"; context layer: {c['aten_ops']} ops" for c in row["context_layers"]))
        del model, entry
    base = rows[0]["flops_per_target_token"]
    for row in rows:
        row["flops_ratio"] = row["flops_per_target_token"] / base
    return {"mode": "trace", "device": "cpu (the accelerator's path)", "shape": bench.shape(),
            "precision": "fp32", "results": rows}


def format_trace(report: Dict) -> str:
    """A Markdown table of :func:`trace`'s report."""
    lines = ["| arch | batch sentences | memory sentences | target tokens | GFLOP/step | "
             "FLOPs ratio | peak GB | context-layer ops | word FLOPs / selected | "
             "selected share |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        layers = r["context_layers"]
        ops = " + ".join(str(c["aten_ops"]) for c in layers) or "-"
        wr = " + ".join(f"{c['word_flops_ratio']:.2f}" for c in layers
                        if c.get("word_flops_ratio")) or "-"
        share = " + ".join(f"{100 * c['selected_share']:.1f} %" for c in layers
                           if "selected_share" in c) or "-"
        ratio = "-" if r["flops_ratio"] is None else f"{r['flops_ratio']:.3f}"
        lines.append(f"| `{r['arch']}` | {r['batch_sentences']} | {r['memory_sentences'] or '-'} "
                     f"| {r['target_tokens']} | {r['step_flops'] / 1e9:.1f} | {ratio} | "
                     f"{r['peak_live_gb']:.2f} | {ops} | {wr} | {share} |")
    return "\n".join(lines) + "\n"


def _sum_layers(rows: List[Dict]) -> Dict:
    """The context-layer rows of several batches, summed (the share pooled)."""
    out = {"aten_ops": sum(r["aten_ops"] for r in rows), "flops": sum(r["flops"] for r in rows)}
    for key in ("word_flops_executed", "word_flops_selected"):
        if any(key in r for r in rows):
            out[key] = sum(r.get(key, 0.0) for r in rows)
    if out.get("word_flops_selected"):
        out["word_flops_ratio"] = out["word_flops_executed"] / out["word_flops_selected"]
    if any("selected_sum" in r for r in rows):
        out["selected_share"] = sum(r["selected_sum"] for r in rows) / max(
            1.0, sum(r["visible_sum"] for r in rows))
    return out


def trace_checkpoint(path: str, data: str, split: str, max_tokens: int, log=print) -> Dict:
    """``--trace --path``: a trained checkpoint on every batch of its data's
    ``split`` (the task's own batching at ``max_tokens``): the batches'
    training steps (forward and backward, cold memory) on the accelerator's
    path, summed; per context layer the ops, FLOPs, word-level work and
    selected share over all batches."""
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    from ctx_fairseq.eval.checkpoints import restore_checkpoint
    from ctx_fairseq.modules.cpu_shortcuts import accelerator_path

    model, task, _ = restore_checkpoint(path, data)
    task.load_dataset(split)
    itr = task.get_batch_iterator(task.dataset(split), max_tokens=max_tokens, seed=1,
                                  disable_iterator_cache=True).next_epoch_itr(shuffle=False)
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    torch.manual_seed(1)  # the training steps' dropout: the same figures on every run
    steps, layers = [], []
    for sample in itr:
        entry = {"model": model, "task": task, "sample": sample, "crit": crit}
        calls = _Calls()
        with accelerator_path():
            steps.append(_step(None, entry, calls))
            layers.append([_layer_alone(c) for c in list(calls.layers) if "forward" in c])
    tokens = sum(s["target_tokens"] for s in steps)
    row = {"arch": f"{model.args.arch if hasattr(model, 'args') else type(model).__name__} "
                   f"({os.path.basename(path)}, {split})",
           "batches": len(steps), "batch_sentences": sum(s["batch_sentences"] for s in steps),
           "memory_sentences": None, "target_tokens": tokens,
           "step_flops": sum(s["step_flops"] for s in steps), "flops_ratio": None,
           "peak_live_gb": max(s["peak_live_gb"] for s in steps),
           "context_layers": [_sum_layers([b[i] for b in layers if len(b) > i])
                              for i in range(max((len(b) for b in layers), default=0))]}
    row["flops_per_target_token"] = row["step_flops"] / max(1, tokens)
    log(f"ctx-bench --trace: {row['arch']}: {len(steps)} batches")
    return {"mode": "trace", "device": "cpu (the accelerator's path)", "checkpoint": path,
            "data": data, "split": split, "precision": "fp32", "results": [row]}


def trace_main(a, bench, specs: List[str], parser, log) -> None:
    """``ctx-bench --trace``'s run and output (``a``: ctx-bench's arguments)."""
    if a.device != "cpu" or a.fp16 or a.sweep_max_tokens:
        parser.error("--trace counts on the CPU in float32: no --device cuda, --fp16 or "
                     "--sweep-max-tokens")
    if bool(a.path) != bool(a.data):
        parser.error("--path and --data go together (a checkpoint and its data directory)")
    try:
        if a.path:
            report = trace_checkpoint(a.path, a.data, a.split, a.max_tokens, log)
        else:
            report = trace(bench, specs, log)
    except (ValueError, OSError) as err:
        parser.error(str(err))
    print(json.dumps(report, indent=2) if a.json else format_trace(report))
