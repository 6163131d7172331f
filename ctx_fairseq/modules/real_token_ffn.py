"""fairseq's encoder and decoder layers with their position-wise feed-forward
network (``fc1``, ``fc2``) run on the non-padding positions only, on the CPU.

A document batch holds a document's sentences in document order, so its
sentences are padded to about twice their real tokens; length groups
(``--length-buckets``) leave about 1.4 times on the source side and 1.2
times on the target side, and the FFN is two thirds of a layer's
position-wise products. Each layer's ``forward`` gathers the rows of its
real positions (from the padding mask fairseq passes it: one host read,
which an accelerator would wait for, hence the CPU only:
:func:`~ctx_fairseq.modules.cpu_shortcuts.cpu_shortcuts`) before ``fc1`` and
scatters ``fc2``'s output back, zeros at the padding, which every reader
masks (the self-attention's and the source attention's keys, the loss;
with ``return_fc`` fairseq's ``fc_results`` hold those zeros too). The
real positions' values are those of fairseq's layer (the same products per
row; tested). Everything else is fairseq's layer: the mixin only overrides
``build_fc1``/``build_fc2`` and wraps ``forward``; parameter names and
checkpoints are unchanged. The layers keep the real positions on their
``fc1``/``fc2`` for the length of one forward (set and cleared around
fairseq's ``forward``; activation checkpointing re-enters it and sets them
again), so they are not scriptable with TorchScript (nothing here scripts
them).
"""

from typing import Callable, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from fairseq.modules.quant_noise import quant_noise
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from ctx_fairseq.modules.cpu_shortcuts import cpu_shortcuts

__all__ = ["RealTokenLinear", "RealTokenEncoderLayer", "RealTokenDecoderLayer"]


class RealTokenLinear(nn.Linear):
    """``nn.Linear``; while its layer has set ``rows`` (the flat ``T B``
    positions of the real tokens), ``fc1`` (``scatter=False``) reads only
    those rows of its ``T x B x C`` input and returns ``N x F``, and ``fc2``
    (``scatter=True``) returns its ``N x C`` output put back into a
    ``T x B x C`` tensor of zeros."""

    def __init__(self, in_features: int, out_features: int, scatter: bool):
        super().__init__(in_features, out_features)
        self.scatter = scatter
        self.rows: Optional[Tensor] = None
        self.shape: Optional[Tuple[int, int]] = None

    def forward(self, x: Tensor) -> Tensor:
        if self.rows is None:
            return super().forward(x)
        if not self.scatter:
            return super().forward(x.reshape(-1, x.size(-1)).index_select(0, self.rows))
        y = super().forward(x)
        T, B = self.shape
        out = y.new_zeros(T * B, y.size(-1)).index_copy(0, self.rows, y)
        return out.view(T, B, -1)


class _RealTokenFFN:
    """The mixin: ``fc1``/``fc2`` built as :class:`RealTokenLinear`."""

    def build_fc1(self, input_dim, output_dim, q_noise, qn_block_size):
        return quant_noise(RealTokenLinear(input_dim, output_dim, False), p=q_noise,
                           block_size=qn_block_size)

    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        return quant_noise(RealTokenLinear(input_dim, output_dim, True), p=q_noise,
                           block_size=qn_block_size)

    def _on_real_tokens(self, x: Tensor, padding_mask: Optional[Tensor],
                        run: Callable[[], object]):
        """``run()`` (fairseq's forward) with the FFN on the real positions of
        ``x`` (``T x B x C``; ``padding_mask`` ``B x T``, True = padding)."""
        if padding_mask is None or not cpu_shortcuts(x.device) \
                or x.dim() != 3 \
                or not isinstance(self.fc1, RealTokenLinear) \
                or not isinstance(self.fc2, RealTokenLinear):
            return run()
        T, B = x.shape[:2]
        if tuple(padding_mask.shape) != (B, T):
            return run()
        rows = (~padding_mask.to(torch.bool)).t().reshape(-1).nonzero().squeeze(1)
        if rows.numel() == T * B:  # no padding
            return run()
        self.fc1.rows, self.fc2.rows, self.fc2.shape = rows, rows, (T, B)
        try:
            return run()
        finally:
            self.fc1.rows = self.fc2.rows = self.fc2.shape = None


class RealTokenEncoderLayer(_RealTokenFFN, TransformerEncoderLayerBase):
    """fairseq's encoder layer, its FFN on the real tokens on the CPU."""

    def forward(self, x, encoder_padding_mask: Optional[Tensor],
                attn_mask: Optional[Tensor] = None):
        return self._on_real_tokens(
            x, encoder_padding_mask,
            lambda: TransformerEncoderLayerBase.forward(self, x, encoder_padding_mask, attn_mask))


class RealTokenDecoderLayer(_RealTokenFFN, TransformerDecoderLayerBase):
    """fairseq's decoder layer, its FFN on the real tokens on the CPU (the
    padding mask from ``self_attn_padding_mask``, keyword or positional;
    an incremental step's ``B x 1`` mask alike)."""

    def forward(self, x, *args, **kwargs):
        mask = kwargs.get("self_attn_padding_mask")
        if mask is None and len(args) >= 7:
            mask = args[6]
        return self._on_real_tokens(
            x, mask, lambda: TransformerDecoderLayerBase.forward(self, x, *args, **kwargs))

