r"""Jensen-Shannon divergence between the global (``h_g``) and local (``h_l``)
attention distributions of each DC encoder layer (Ampomah et al. 2021,
Sec. 7.2, Eq. 10-13).

For DC encoder layer ``l`` and a (non-pad) query position ``t``:

* Eq. 10: ``alpha_g = max_i alpha_g^i`` and ``alpha_l = max_i alpha_l^i`` over
  the ``n_h`` heads. We read the max as element-wise over heads (for each key
  position the largest weight any head gives it) and renormalise over the key
  positions so that both are distributions again (JS needs distributions).
  ``--head-reduce mean`` (the head average) is offered for comparison.
* Eq. 11-12: ``JS(alpha_g || alpha_l) = 1/2 KL(alpha_g || m) + 1/2 KL(alpha_l || m)``,
  ``m = (alpha_g + alpha_l) / 2``, natural logarithm (so ``0 <= JS <= ln 2``).
* ``dv^l`` is the mean of the per-query JS over all real source tokens of the
  split (token-weighted); Eq. 13: ``E_d`` is the mean of ``dv^l`` over the DC
  encoder layers.

The attention distributions are exactly those of the model's forward pass
(captured with a forward pre-hook on each DC module's input, recomputed
without dropout via
:meth:`ctx_fairseq.modules.dual_context.DualContextAttention.attention_probs`).

Command line (``ctx-dc-jsd``, or ``python -m ctx_fairseq.eval.analyses.dc_jsd``)::

    ctx-dc-jsd DATA_BIN --path ckpt_f2.pt --path ckpt_f3.pt --label f=2 --label f=3 \
        --split test --out-dir jsd/

writes ``jsd/dc_jsd.{md,json,png}``: the per-layer ``dv^l`` and ``E_d`` of each
checkpoint (a table; the JSON; Fig. 4-style plot: (a) ``dv^l`` per layer,
(b) ``E_d`` per model).
"""

import argparse
import math
import os
from typing import Dict, Iterable, List, Optional

import torch
from torch import Tensor

from ctx_fairseq.eval.report_files import print_written, pyplot, save_figure, write_table_files

__all__ = ["js_divergence", "reduce_heads", "DCJSDCollector", "encoder_jsd",
           "jsd_for_checkpoint", "write_outputs", "cli_main"]


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Eq. 11-12 along the last dim (natural log, ``0 log 0 = 0``)."""
    m = 0.5 * (p + q)
    kl_pm = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1)
    kl_qm = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(-1)
    return (0.5 * kl_pm + 0.5 * kl_qm).clamp_min(0.0)


def reduce_heads(alpha: Tensor, how: str = "max") -> Tensor:
    """``B x H x T x S`` -> ``B x T x S`` (Eq. 10), renormalised over ``S``."""
    if how == "max":
        a = alpha.max(dim=1).values
        return a / a.sum(-1, keepdim=True).clamp_min(1e-30)
    if how == "mean":
        return alpha.mean(dim=1)
    raise ValueError(f"--head-reduce: expected 'max' or 'mean', got {how!r}")


class DCJSDCollector:
    """Accumulates ``sum_t JS`` and token counts for every DC encoder layer of
    ``encoder`` while it runs (use as a context manager)."""

    def __init__(self, encoder, head_reduce: str = "max"):
        from ctx_fairseq.modules.dual_context import DualContextAttention

        reduce_heads(torch.ones(1, 1, 1, 1), head_reduce)  # validate early
        self.head_reduce = head_reduce
        self.modules = {}
        for idx, layer in enumerate(encoder.layers):
            attn = getattr(layer, "self_attn", None)
            if isinstance(attn, DualContextAttention):
                self.modules[idx + 1] = attn  # 1-based, as in the paper
        if not self.modules:
            raise ValueError("the model has no DC encoder layers (--dc-encoder-layers none?): "
                             "nothing to measure")
        self.sums = {l: 0.0 for l in self.modules}
        self.counts = {l: 0 for l in self.modules}
        self._handles = []

    def _hook(self, layer_no):
        def hook(module, args, kwargs):
            query = kwargs.get("query", args[0] if args else None)
            kpm = kwargs.get("key_padding_mask")
            a_g, a_l = module.attention_probs(query, kpm)  # B x H x T x T
            js = js_divergence(reduce_heads(a_g.double(), self.head_reduce),
                               reduce_heads(a_l.double(), self.head_reduce))  # B x T
            if kpm is not None:
                real = ~kpm.to(torch.bool)
                self.sums[layer_no] += float(js[real].sum())
                self.counts[layer_no] += int(real.sum())
            else:
                self.sums[layer_no] += float(js.sum())
                self.counts[layer_no] += js.numel()
        return hook

    def __enter__(self):
        for l, m in self.modules.items():
            self._handles.append(m.register_forward_pre_hook(self._hook(l), with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []

    def result(self) -> Dict:
        layers = {l: (self.sums[l] / self.counts[l] if self.counts[l] else float("nan"))
                  for l in self.modules}
        vals = [v for v in layers.values() if not math.isnan(v)]
        return {
            "layers": {str(l): v for l, v in layers.items()},
            "E_d": sum(vals) / len(vals) if vals else float("nan"),
            "num_tokens": max(self.counts.values()),
            "head_reduce": self.head_reduce,
            "log": "natural (max ln 2 = %.4f)" % math.log(2),
        }


@torch.no_grad()
def encoder_jsd(model, batches: Iterable[Dict], head_reduce: str = "max") -> Dict:
    """Run ``model.encoder`` over fairseq ``batches`` (samples with ``net_input``)
    and return per-layer ``dv^l`` and ``E_d``."""
    model.eval()
    device = next(model.parameters()).device
    n_sent = 0
    with DCJSDCollector(model.encoder, head_reduce) as col:
        for sample in batches:
            if not sample or "net_input" not in sample:
                continue
            ni = sample["net_input"]
            model.encoder(ni["src_tokens"].to(device), ni["src_lengths"].to(device))
            n_sent += ni["src_tokens"].size(0)
    res = col.result()
    res["num_sentences"] = n_sent
    return res


def jsd_for_checkpoint(path: str, data: str, split: str = "test", max_tokens: int = 4000,
                       batch_size: Optional[int] = None, max_sentences: Optional[int] = None,
                       head_reduce: str = "max", cpu: bool = False) -> Dict:
    from fairseq import utils

    from ctx_fairseq.eval.checkpoints import restore_checkpoint

    model, task, _cfg = restore_checkpoint(path, data, device="cpu" if cpu else "auto")
    task.load_dataset(split)
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(
        dataset=dataset, max_tokens=max_tokens, max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, seed=1, num_workers=0,
    ).next_epoch_itr(shuffle=False)

    def limited():
        seen = 0
        for sample in itr:
            if max_sentences is not None and seen >= max_sentences:
                break
            if max_sentences is not None and "net_input" in sample:
                keep = max_sentences - seen
                ni = sample["net_input"]
                if ni["src_tokens"].size(0) > keep:
                    sample = {"net_input": {"src_tokens": ni["src_tokens"][:keep],
                                            "src_lengths": ni["src_lengths"][:keep]}}
            seen += sample["net_input"]["src_tokens"].size(0) if "net_input" in sample else 0
            yield sample

    res = encoder_jsd(model, limited(), head_reduce)
    res["path"] = path
    res["split"] = split
    res["kernel_size"] = getattr(model.encoder, "dc_kernel_size", None)
    return res


def format_table(results: List[Dict]) -> str:
    layers = sorted({int(l) for r in results for l in r["layers"]})
    head = ["model", "f"] + [f"dv^{l}" for l in layers] + ["E_d", "tokens"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r["label"], str(r.get("kernel_size"))]
        cells += [f"{r['layers'][str(l)]:.4f}" if str(l) in r["layers"] else "-" for l in layers]
        cells += [f"{r['E_d']:.4f}", str(r["num_tokens"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: List[Dict], png: str) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        ls = sorted(int(l) for l in r["layers"])
        ax1.plot(ls, [r["layers"][str(l)] for l in ls], marker="o", label=r["label"])
    ax1.set_xlabel("encoder layer")
    ax1.set_ylabel("JS(alpha_g || alpha_l)")
    ax1.set_title("(a) divergence per DC encoder layer")
    ax1.legend()
    ax2.bar([r["label"] for r in results], [r["E_d"] for r in results], color="tab:blue")
    ax2.set_ylabel("E_d")
    ax2.set_title("(b) mean divergence E_d")
    save_figure(fig, png)


def write_outputs(results: List[Dict], out_dir: str, prefix: str = "dc_jsd") -> Dict[str, str]:
    markdown = ("# JS divergence between global and local attention (Eq. 10-13)\n\n"
                f"head reduction: {results[0]['head_reduce']}; {results[0]['log']} log\n\n"
                + format_table(results) + "\n")
    return write_table_files(out_dir, prefix, markdown, {"results": results},
                             lambda png: plot(results, png))


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ctx-dc-jsd",
        description="Jensen-Shannon divergence between the global and local attention "
                    "distributions of each DC encoder layer (Ampomah et al. 2021, Eq. 10-13).")
    p.add_argument("data", help="binarized data directory (fairseq-preprocess output)")
    p.add_argument("--path", action="append", required=True,
                   help="checkpoint of a transformer_dc model; repeat to compare models")
    p.add_argument("--label", action="append", default=None,
                   help="label per --path (default: the checkpoint's file name + f)")
    p.add_argument("--split", default="test", help="binarized split to read (default: test)")
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--max-sentences", type=int, default=None,
                   help="use only the first N sentences of the split")
    p.add_argument("--head-reduce", choices=["max", "mean"], default="max",
                   help="Eq. 10 head reduction (default: element-wise max, renormalised)")
    p.add_argument("--out-dir", default=".", help="where to write the table/JSON/PNG")
    p.add_argument("--prefix", default="dc_jsd", help="output file name prefix")
    p.add_argument("--cpu", action="store_true", help="do not use a GPU")
    return p


def cli_main(argv: Optional[List[str]] = None) -> Dict[str, str]:
    args = get_parser().parse_args(argv)
    if args.label is not None and len(args.label) != len(args.path):
        raise SystemExit(f"ctx-dc-jsd: error: --label given {len(args.label)} times but --path "
                         f"{len(args.path)} times; expected one label per checkpoint")
    results = []
    for i, path in enumerate(args.path):
        if not os.path.exists(path):
            raise SystemExit(f"ctx-dc-jsd: error: --path {path}: no such checkpoint")
        r = jsd_for_checkpoint(path, args.data, args.split, args.max_tokens, args.batch_size,
                               args.max_sentences, args.head_reduce, args.cpu)
        r["label"] = (args.label[i] if args.label else
                      f"{os.path.basename(os.path.dirname(os.path.abspath(path)))}/"
                      f"{os.path.basename(path)} (f={r['kernel_size']})")
        results.append(r)
    paths = write_outputs(results, args.out_dir, args.prefix)
    print_written(paths.values(), format_table(results))
    return paths


if __name__ == "__main__":
    cli_main()
