r"""The gated context attention of Voita et al. (2018), "Context-Aware Neural
Machine Translation Learns Anaphora Resolution", Sec. 3.

:class:`ContextGate` combines, per position and per dimension,

.. math::

    g_i = \sigma(W_g [c_i^{s}; c_i^{c}] + b_g), \qquad
    c_i = g_i \odot c_i^{s} + (1 - g_i) \odot c_i^{c}

where :math:`c^{s}` is the source self-attention output and :math:`c^{c}` the
attention from the source to the context encoder's output.

:class:`ContextAwareEncoderLayer` is the source encoder's last layer: fairseq's
encoder layer (self-attention, residual, LayerNorm, FFN; pre- or post-norm as
configured) in which the self-attention output is replaced by the gated
combination of self-attention and context attention (both queried by the
layer input, fairseq's ``MultiheadAttention``). Rows whose context is empty
(the first sentence of a document) get :math:`c^{c} = 0` through
``context_keep``; the caller must leave at least one key unmasked per row so
that no softmax runs over keys that are all masked (see
:class:`ctx_fairseq.models.transformer_context_aware.ContextAwareTransformerEncoder`).

Training statistics (``label_smoothed_cross_entropy_ctx``, docs/criterion.md):
with ``record_statistics`` set, the layer keeps, for its last call,
``[sum of g, tokens with context, tokens]`` where ``g`` of a token is its
vector gate averaged over the model dimension, summed over the non-padding
source tokens of the sentences that have context. Sentences without context
are left out of the gate (their ``c^c`` is 0 by construction, so their gate
says nothing about the use of context) but counted in the last element, so
that the share of tokens with context can be reported too.
"""

from typing import Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor, nn

from ctx_fairseq.modules.encoder_sublayers import EncoderLayerSubLayers, attention_bias
from ctx_fairseq.modules.context_statistics import mean_gate_sum, real_tokens

__all__ = ["ContextGate", "ContextAwareEncoderLayer"]


class ContextGate(nn.Module):
    """Vector gate ``g = sigmoid(W_g [c_s; c_c] + b_g)``; returns
    ``(g * c_s + (1 - g) * c_c, g)``."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.proj = nn.Linear(2 * embed_dim, embed_dim)
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, c_s: Tensor, c_c: Tensor) -> Tuple[Tensor, Tensor]:
        g = torch.sigmoid(self.proj(torch.cat([c_s, c_c], dim=-1)))
        return c_c + g * (c_s - c_c), g


class ContextAwareEncoderLayer(EncoderLayerSubLayers, TransformerEncoderLayerBase):
    """fairseq encoder layer + attention to the context encoder's output +
    :class:`ContextGate` (parameter names of the self-attention, FFN and
    LayerNorms are fairseq's, so a sentence-level checkpoint fills them; the
    FFN sub-layer is fairseq's,
    :meth:`~ctx_fairseq.modules.encoder_sublayers.EncoderLayerSubLayers.ffn_sublayer`).

    Set ``record = True`` to keep the last forward's gate (``T x B x C``) and
    context attention (``B x T x Tc``, averaged over heads) in
    ``last_gate`` / ``last_context_attn`` (for analyses; off in training).

    Set ``record_statistics = True`` to keep only the training statistics of
    the last forward in ``last_statistics`` (float64 ``[gate sum, tokens with
    context, tokens]``, see the module docstring); unlike ``record`` it does not
    ask the context attention for its weights (``need_weights`` stays False,
    no ``B x T x Tc`` tensor is kept), and it only reads the detached gate."""

    def __init__(self, cfg, return_fc: bool = False):
        super().__init__(cfg, return_fc=return_fc)
        self.context_attn = MultiheadAttention(
            self.embed_dim, cfg.encoder.attention_heads, dropout=cfg.attention_dropout,
            encoder_decoder_attention=True, q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size)
        self.gate = ContextGate(self.embed_dim)
        self.record = False
        self.last_gate: Optional[Tensor] = None
        self.last_context_attn: Optional[Tensor] = None
        self.record_statistics = False
        self.last_statistics: Optional[Tensor] = None

    def forward(self, x: Tensor, encoder_padding_mask: Optional[Tensor],
                attn_mask: Optional[Tensor] = None, context: Optional[Tensor] = None,
                context_padding_mask: Optional[Tensor] = None,
                context_keep: Optional[Tensor] = None):
        """``x``: ``T x B x C``; ``context``: ``Tc x B x C`` (context encoder
        output); ``context_padding_mask``: ``B x Tc`` (True = ignore; at least
        one False per row); ``context_keep``: ``1 x B x 1``, 0 for rows with
        an empty context (their ``c_c`` is set to 0), else 1."""
        if context is None:
            raise ValueError("ContextAwareEncoderLayer needs the context encoder output")
        attn_mask = attention_bias(attn_mask, x)
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        c_s, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask,
                                need_weights=False, attn_mask=attn_mask)
        c_c, attn = self.context_attn(query=x, key=context, value=context,
                                      key_padding_mask=context_padding_mask,
                                      need_weights=self.record)
        c_s = self.dropout_module(c_s)
        c_c = self.dropout_module(c_c)
        if context_keep is not None:  # in c_c's dtype: no float32 copy under autocast
            c_c = c_c * context_keep.to(c_c.dtype)
        c, g = self.gate(c_s, c_c)
        if self.record:
            self.last_gate = g.detach()
            self.last_context_attn = None if attn is None else attn.detach()
        if self.record_statistics:
            self.last_statistics = self.gate_statistics(g, encoder_padding_mask, context_keep)
        x = self.residual_connection(c, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        return self.ffn_sublayer(x)

    @staticmethod
    @torch.no_grad()
    def gate_statistics(g: Tensor, encoder_padding_mask: Optional[Tensor],
                        context_keep: Optional[Tensor]) -> Tensor:
        """``[sum of the token gates, tokens with context, tokens]`` (float64)
        over the non-padding tokens; ``g``: ``T x B x C``; ``context_keep``:
        ``1 x B x 1`` (0: no context) or None (every sentence has context)."""
        T, B = g.shape[:2]
        real = real_tokens(T, B, g.device, encoder_padding_mask)
        has_context = None if context_keep is None else context_keep.view(B) > 0
        with_ctx = real_tokens(T, B, g.device, encoder_padding_mask, has_context)
        gate_sum, n_ctx = mean_gate_sum(g, with_ctx)
        return torch.stack([gate_sum, n_ctx, real.sum().to(torch.float64)])
