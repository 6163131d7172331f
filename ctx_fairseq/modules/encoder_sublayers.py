"""fairseq's encoder layer cut into its sub-layers, for the encoder layers
of this plugin that add a context sub-layer between them
(:class:`ctx_fairseq.modules.context_gate.ContextAwareEncoderLayer`, Voita et
al. 2018; ``ZhangEncoderLayer`` in ``ctx_fairseq/models/transformer_doc_zhang2018.py``,
Zhang et al. 2018). The code is fairseq's ``TransformerEncoderLayerBase.forward``,
split so that a subclass reuses it instead of re-typing it."""

from typing import Optional

import torch
from torch import Tensor

from ctx_fairseq.modules.local_context import compute_dtype


def attention_bias(attn_mask: Optional[Tensor], x: Tensor) -> Optional[Tensor]:
    """An encoder layer's ``attn_mask`` (1: masked) as fairseq's encoder layer
    turns it into an additive bias: -1e8 (float32) or -1e4, not -inf (which
    gives NaN for a query whose keys are all masked).

    The choice follows the dtype the attention computes in
    (:func:`~ctx_fairseq.modules.local_context.compute_dtype`), not ``x.dtype``
    alone: under autocast ``x`` is float32 while the energies are float16, and
    a -1e8 bias would become ``-inf`` there (fairseq's own layer looks at
    ``x.dtype``; without autocast the two agree)."""
    if attn_mask is None:
        return None
    return attn_mask.masked_fill(attn_mask.to(torch.bool),
                                 -1e8 if compute_dtype(x) == torch.float32 else -1e4)


class EncoderLayerSubLayers:
    """fairseq's ``TransformerEncoderLayerBase.forward`` cut into its two
    sub-layers, for encoder layers that add to it or change one (put before
    ``TransformerEncoderLayerBase`` in the bases; parameter names are
    fairseq's). Each sub-layer is ``x + dropout(f(LN(x)))`` (pre-norm) or
    ``LN(x + dropout(f(x)))`` (post-norm), as in fairseq."""

    def self_attention_sublayer(self, x: Tensor, encoder_padding_mask: Optional[Tensor],
                                attn_mask: Optional[Tensor] = None) -> Tensor:
        """The self-attention sub-layer; ``attn_mask`` is the additive bias
        (:func:`attention_bias`)."""
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask,
                              need_weights=False, attn_mask=attn_mask)
        x = self.residual_connection(self.dropout_module(x), residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        return x

    def ffn_sublayer(self, x: Tensor):
        """The FFN sub-layer, the layer's output: ``x``, or ``(x, fc_result)``
        (the FFN output before dropout and residual) with ``return_fc``."""
        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(x))))
        fc_result = x
        x = self.residual_connection(self.dropout_module(x), residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        if self.return_fc and not torch.jit.is_scripting():
            return x, fc_result
        return x
