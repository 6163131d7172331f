"""Sparsemax (Martins & Astudillo 2016) and the masked normalisers of the
selective attention's sentence level (Maruf et al. 2019, Eq. 3 and Eq. 6):
sparsemax or softmax over the allowed entries of each row, exact zeros
elsewhere, with a backward of static shape (no host read on a GPU)."""

from typing import Optional

import torch
from torch import Tensor

from ctx_fairseq.modules.cpu_shortcuts import cpu_shortcuts

__all__ = ["NORMALIZERS", "sparsemax", "masked_normalize"]

NORMALIZERS = ("sparsemax", "softmax")


class _Sparsemax(torch.autograd.Function):
    """Sparsemax over the last dim (Martins & Astudillo 2016), as
    ``entmax.sparsemax`` computes it, with a backward of static shape
    (``entmax``'s indexes its gradient with a boolean mask, a host read per
    call on a GPU)."""

    #: on the CPU (:func:`~ctx_fairseq.modules.cpu_shortcuts.cpu_shortcuts`), the
    #: threshold is first sought among the largest ``TOP`` entries (a partial
    #: sort): exact whenever the support is smaller
    TOP = 64

    @staticmethod
    def forward(ctx, x):
        x = x - x.amax(-1, keepdim=True)
        support = None
        if cpu_shortcuts(x.device) and x.size(-1) > 2 * _Sparsemax.TOP:
            # the support condition k z_k > sum_{j<=k} z_j - 1 holds on a prefix of
            # the sorted entries: when it fails within the top TOP for every row,
            # the threshold is the full sort's, bit for bit (the same partial sums);
            # else (a host read: the CPU only) the full sort
            z, _ = torch.topk(x, _Sparsemax.TOP, dim=-1)
            cs = z.cumsum(-1) - 1
            k = torch.arange(1, _Sparsemax.TOP + 1, device=x.device, dtype=x.dtype)
            support = (k * z > cs).sum(-1, keepdim=True)
            if bool((support >= _Sparsemax.TOP).any()):
                support = None
        if support is None:
            z, _ = torch.sort(x, dim=-1, descending=True)
            cs = z.cumsum(-1) - 1
            k = torch.arange(1, x.size(-1) + 1, device=x.device, dtype=x.dtype)
            support = (k * z > cs).sum(-1, keepdim=True)  # >= 1: the largest entry is in
        tau = cs.gather(-1, support - 1) / support.to(x.dtype)
        # in place on the shifted copy (ours): one buffer for x - max, x - tau
        # and the clamp, not three (the sentence level is B x H x T x S_max)
        out = x.sub_(tau).clamp_(min=0)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        # the Jacobian of the support the output has: S = {i : out_i > 0}.
        # At a tie (an entry within round-off of tau) the sorted count k of
        # the forward and S can differ by that entry (k z_k > cs_k holds while
        # z_k - tau rounds to 0, or the reverse): counting S here keeps the
        # gradient the output's own (it sums to 0 over S, 0 outside), so it
        # depends only on the row's values, not on its width, the order of
        # its entries or which sort found tau. An entry exactly at tau is
        # outside S (weight 0, gradient 0): the tie-break.
        (out,) = ctx.saved_tensors
        on = out != 0  # (out >= 0: the positive entries; a NaN stays a NaN)
        g = grad.masked_fill(~on, 0)
        n = on.sum(-1, keepdim=True).clamp_(min=1)  # >= 1: the largest entry is in
        v = g.sum(-1, keepdim=True) / n.to(g.dtype)
        return torch.where(on, g - v, g)


def sparsemax(x: Tensor) -> Tensor:
    """Sparsemax over the last dim (see :class:`_Sparsemax`)."""
    return _Sparsemax.apply(x)


def masked_normalize(scores: Tensor, mask: Tensor, kind: str,
                     dtype: Optional[torch.dtype] = None, inplace: bool = False) -> Tensor:
    """``kind`` ("sparsemax" | "softmax") over the last dim of ``scores``,
    restricted to ``mask`` (bool, True = allowed, broadcastable to ``scores``).

    Disallowed entries get exactly 0 weight and 0 gradient; a row with no
    allowed entry is all zeros with zero (finite) gradient. Disallowed scores
    are filled with ``torch.finfo(dtype).min`` (dtype-safe, never an overflow
    in half precision; ``exp`` of it and sparsemax's clamp give exactly 0).
    ``dtype``: of the result (and of the computation when wider than the
    scores'); default the scores' dtype. ``inplace``: the scores are the
    caller's own temporary, whose backward does not read them (a matmul's
    output): they are filled in place (one B x H x T x S_max buffer fewer)
    and hold garbage afterwards."""
    row_ok = mask.any(dim=-1, keepdim=True)
    x = scores if dtype is None or dtype == scores.dtype else scores.to(
        torch.promote_types(scores.dtype, dtype))
    if kind == "sparsemax" and x.dtype in (torch.float16, torch.bfloat16):
        # stability: sparsemax's threshold comes from a cumulative sum over the
        # sorted scores, which half precision rounds enough to move the support;
        # the only upcast of the module (softmax accumulates in float32 itself)
        x = x.float()
    if kind not in NORMALIZERS:
        raise ValueError(f"unknown normaliser {kind!r}; expected one of {NORMALIZERS}")
    # a row with no allowed entry: one finite entry (its support is 1; the row
    # is zeroed below), not a row of equal ones whose support is every entry
    first = torch.arange(x.size(-1), device=x.device) == 0
    fill = torch.finfo(x.dtype).min
    # (a converted copy is ours too)
    x = x.masked_fill_(~mask, fill) if inplace or x is not scores else x.masked_fill(~mask, fill)
    x = x.masked_fill_(~row_ok & first, 0.0)  # x is ours from here on
    p = sparsemax(x) if kind == "sparsemax" else torch.softmax(x, dim=-1)
    return p.masked_fill(~row_ok, 0.0).to(scores.dtype if dtype is None else dtype)
