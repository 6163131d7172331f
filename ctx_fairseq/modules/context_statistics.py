r"""Statistics a context model records about itself during training, for the
criterion ``label_smoothed_cross_entropy_ctx``
(:mod:`ctx_fairseq.criterions.label_smoothed_cross_entropy_ctx`, keys and
their meaning in docs/criterion.md).

Protocol. A model that has such statistics defines two methods:

``record_context_statistics(enabled: bool)``
    turns recording on or off in the modules that compute the statistics.
    Off by default: a forward pass without it computes nothing extra.
``context_statistics() -> Dict[str, Tensor]``
    after a forward pass made with recording on: ``name -> [sum, count]``
    (a float64 tensor of two elements, detached, on the model's device); the
    statistic is ``sum / count`` over the batch. The names depend only on the
    model's configuration, never on the batch (data-parallel workers must
    send the same keys), so a batch where a statistic is undefined (e.g. no
    sentence has context) reports ``[0, 0]``.

Sums and counts, never means, go to the criterion, so that the logged mean
``sum / count`` pools batches and workers exactly (a mean of means would
weight a batch with few tokens like one with many).

Helpers:

* :func:`real_tokens`: the ``T x B`` mask of the tokens a statistic averages
  over (non-padding; optionally only sentences with context).
* :func:`mean_gate_sum`: ``[sum, count]`` of a gate averaged over its last
  dimension (the model dimension for the vector gates of Voita et al. 2018
  and Maruf et al. 2019, the heads for a per-head hybrid gate) at the masked
  tokens.
* :func:`sum_count`: ``[sum, count]`` as a float64 tensor.
"""

from typing import Optional

import torch
from torch import Tensor

__all__ = ["real_tokens", "mean_gate_sum", "sum_count"]


def sum_count(total, count) -> Tensor:
    """``[total, count]`` as a detached float64 tensor (on the inputs' device
    when they are tensors)."""
    device = next((t.device for t in (total, count) if torch.is_tensor(t)), None)
    parts = [t.detach().to(torch.float64).reshape(()) if torch.is_tensor(t)
             else torch.tensor(float(t), dtype=torch.float64, device=device)
             for t in (total, count)]
    return torch.stack(parts)


def real_tokens(tgt_len: int, bsz: int, device: torch.device,
                padding_mask: Optional[Tensor] = None,
                has_context: Optional[Tensor] = None) -> Tensor:
    """``T x B`` bool: True at the non-padding tokens (``padding_mask``:
    ``B x T``, True = pad; None = no padding) of the sentences with context
    (``has_context``: ``(B,)`` bool; None = every sentence)."""
    if padding_mask is None:
        mask = torch.ones(tgt_len, bsz, dtype=torch.bool, device=device)
    else:
        if padding_mask.shape != (bsz, tgt_len):
            raise ValueError(f"padding mask: expected B x T = {bsz} x {tgt_len}, "
                             f"got {tuple(padding_mask.shape)}")
        mask = ~padding_mask.to(torch.bool).t()
    if has_context is not None:
        mask = mask & has_context.to(torch.bool).view(1, bsz)
    return mask


@torch.no_grad()
def mean_gate_sum(gate: Tensor, mask: Tensor) -> Tensor:
    """``[sum over the masked tokens of mean(gate, -1), number of masked
    tokens]`` (float64). ``gate``: ``T x B x G``; ``mask``: ``T x B`` bool."""
    # float64 sums (exact pooling over batches and workers): accumulated inside the
    # reduction, never a float64 copy of the whole T x B x G gate
    per_token = gate.detach().mean(-1, dtype=torch.float64)
    weight = mask.to(torch.float64)
    return torch.stack([(per_token * weight).sum(), weight.sum()])
