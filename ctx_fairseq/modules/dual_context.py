r"""Dual Contextual (DC) module (Ampomah, McClean & Hawe, 2021): the Context
Interaction Unit (Eq. 7-9) and the DC encoder/decoder layers.

For a layer input ``r`` (``T x B x d``):

* Eq. 6 (:class:`~ctx_fairseq.modules.local_context.LocalContextUnit`):
  ``l_c = LayerNorm(GLU(conv_f(r)) + r)``.
* Eq. 7: two Feature-Interaction (FI) units, both multi-head attention,
  ``h_l = FI(r, l_c)`` (query ``r``, key/value ``l_c``) and
  ``h_g = FI(r, r)`` (the layer's self-attention). As in the paper, an FI
  unit is ``concat(M_1..M_nh)`` -- the per-head outputs, with **no** output
  projection of its own.
* Eq. 8: ``z^ = [h_l; h_g] W_z + b_z`` with ``W_z in R^{2d x d}``.
* Eq. 9: ``z_f = LayerNorm(z^ + r)``; ``z_f`` feeds the encoder layer's FFN or
  the decoder layer's encoder-decoder attention.

Mapping onto fairseq (no fairseq code copied):

* :class:`DualContextAttention` *is* the layer's ``self_attn``: the DC layers
  only override ``build_self_attention`` and reuse fairseq's whole
  ``TransformerEncoderLayerBase`` / ``TransformerDecoderLayerBase.forward``,
  whose ``residual + dropout(self_attn(x))`` followed by
  ``self_attn_layer_norm`` is exactly Eq. 9.
* ``h_g`` is ``self_attn.global_attn`` and ``h_l`` is ``self_attn.local_attn``,
  both fairseq :class:`MultiheadAttention` (key padding masks, incremental
  key/value caches and beam reordering come from fairseq).
* Eq. 8 is split by rows, ``[h_l; h_g] W_z + b_z = h_l W_z^l + h_g W_z^g + b_z``:
  ``W_z^l`` is ``local_attn.out_proj`` (bias removed) and ``(W_z^g, b_z)`` is
  ``global_attn.out_proj``. So ``z^ = local_attn(r, l_c) + global_attn(r, r)``
  computes Eq. 7-8 exactly, with the paper's parameter count (one ``2d x d``
  aggregation matrix, no separate per-FI ``W_o``), and each MultiheadAttention
  keeps fairseq's fused fast path.

Pre-norm (``--encoder/decoder-normalize-before``): the whole DC module takes
the place of the self-attention sub-layer, so fairseq's convention applies to
it unchanged: ``z_f = r + dropout(DC(LN(r)))`` (pre-norm) versus
``z_f = LN(r + dropout(DC(r)))`` (post-norm, Eq. 9). The Local Context Unit is
internal to the module: it always receives the module's input (``LN(r)`` in
pre-norm, ``r`` in post-norm) and keeps its own residual + LayerNorm of Eq. 6,
so that ``h_l`` attends over normalised keys/values in both modes.

Decoder (causal) side:

* the convolution window is ``t-f+1..t`` (see ``local_context``);
* ``h_l`` and ``h_g`` get the same future mask (``attn_mask``) in a full
  forward pass; in incremental decoding each FI unit caches its keys/values
  (``h_l`` caches projections of ``l_c``) and the Local Context Unit caches the
  last ``f-1`` inputs, so one step sees exactly what the full pass sees.
* every stateful sub-module (both attentions, the Local Context Unit) has its
  own ``reorder_incremental_state``; fairseq's
  ``reorder_incremental_state_scripting`` visits each of them once.

Encoder side: padded positions are excluded from both attentions by the key
padding mask and contribute nothing to the convolution, so a sentence encodes
identically alone or left/right-padded in a batch.
"""

from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from ctx_fairseq.modules.local_context import LocalContextUnit, compute_dtype

__all__ = [
    "DualContextAttention",
    "DCTransformerEncoderLayer",
    "DCTransformerDecoderLayer",
    "attention_head_probs",
]


def attention_head_probs(mha: MultiheadAttention, query: Tensor, key: Tensor,
                         key_padding_mask: Optional[Tensor] = None,
                         attn_mask: Optional[Tensor] = None) -> Tensor:
    """Per-head attention distributions ``alpha^i`` (``B x H x T x S``, float32
    or float64) of a fairseq :class:`MultiheadAttention` without dropout.
    Used by the analyses (Eq. 10-13); fairseq's fast path only returns the
    head-averaged weights."""
    tgt_len, bsz, _ = query.shape
    src_len = key.size(0)
    h, hd = mha.num_heads, mha.head_dim
    q = mha.q_proj(query) * mha.scaling
    k = mha.k_proj(key)
    q = q.reshape(tgt_len, bsz * h, hd).transpose(0, 1)
    k = k.reshape(src_len, bsz * h, hd).transpose(0, 1)
    w = torch.bmm(q, k.transpose(1, 2)).view(bsz, h, tgt_len, src_len)
    if w.dtype not in (torch.float32, torch.float64):
        w = w.float()
    if attn_mask is not None:
        w = w + attn_mask.to(w.dtype)
    if key_padding_mask is not None:
        w = w.masked_fill(key_padding_mask.to(torch.bool)[:, None, None, :], float("-inf"))
    return torch.softmax(w, dim=-1)


class DualContextAttention(nn.Module):
    """The DC module minus its outer residual/LayerNorm (which the fairseq layer
    applies): returns ``z^`` of Eq. 8 for query ``r``.

    Call signature matches :class:`MultiheadAttention` as used by fairseq's
    transformer layers (``key``/``value`` must be the query itself: the DC module
    is a self-attention replacement).

    Args:
        embed_dim: ``d``.
        num_heads: heads of both FI units.
        kernel_size: ``f`` of the Local Context Unit.
        causal: decoder side (causal window + incremental decoding).
        attention_dropout: dropout on both FI units' attention weights.
        dropout: dropout inside the Local Context Unit (on ``r^``).
    """

    def __init__(self, embed_dim: int, num_heads: int, kernel_size: int = 2,
                 causal: bool = False, attention_dropout: float = 0.0, dropout: float = 0.0,
                 q_noise: float = 0.0, qn_block_size: int = 8, export: bool = False):
        super().__init__()
        self.embed_dim = embed_dim
        self.causal = causal
        self.local_context = LocalContextUnit(
            embed_dim, kernel_size=kernel_size, causal=causal, dropout=dropout, export=export
        )
        # h_g = FI(r, r); its out_proj holds (W_z^g, b_z)
        self.global_attn = MultiheadAttention(
            embed_dim, num_heads, dropout=attention_dropout, self_attention=True,
            q_noise=q_noise, qn_block_size=qn_block_size,
        )
        # h_l = FI(r, l_c); its out_proj holds W_z^l (b_z is counted once, above)
        self.local_attn = MultiheadAttention(
            embed_dim, num_heads, kdim=embed_dim, vdim=embed_dim, dropout=attention_dropout,
            q_noise=q_noise, qn_block_size=qn_block_size,
        )
        self.local_attn.out_proj.register_parameter("bias", None)
        self.num_heads = self.global_attn.num_heads
        self.head_dim = self.global_attn.head_dim

    @property
    def kernel_size(self) -> int:
        return self.local_context.kernel_size

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = False,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if static_kv or before_softmax:
            raise ValueError("DualContextAttention: static_kv/before_softmax are not supported")
        if key is not None and key is not query:
            raise ValueError(
                "DualContextAttention replaces self-attention: key/value must be the query "
                "(cross_self_attention is not supported with transformer_dc)"
            )
        r = query
        # Mixed precision: r (float32 under autocast) is cast once to the GEMMs'
        # dtype and that copy feeds the Local Context Unit's window and all five
        # projections of both FI units (autocast would cast it once per
        # projection); l_c leaves its float32 LayerNorm and is cast once for
        # local_attn's key and value projections. Without autocast both casts
        # are no-ops. The values are those autocast's own casts would give.
        dtype = compute_dtype(r)
        r_c = r.to(dtype)
        l_c = self.local_context(r, key_padding_mask, incremental_state, x_cast=r_c)  # Eq. 6
        l_c = l_c.to(dtype)
        h_g, attn = self.global_attn(  # Eq. 7, h_g (+ its share of Eq. 8)
            query=r_c, key=r_c, value=r_c, key_padding_mask=key_padding_mask,
            incremental_state=incremental_state, need_weights=need_weights,
            attn_mask=attn_mask, need_head_weights=need_head_weights,
        )
        h_l, _ = self.local_attn(  # Eq. 7, h_l (+ its share of Eq. 8)
            query=r_c, key=l_c, value=l_c, key_padding_mask=key_padding_mask,
            incremental_state=incremental_state, need_weights=False, attn_mask=attn_mask,
        )
        return h_l + h_g, attn  # Eq. 8: [h_l; h_g] W_z + b_z

    @torch.no_grad()
    def attention_probs(self, query: Tensor, key_padding_mask: Optional[Tensor] = None,
                        attn_mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """``(alpha_g, alpha_l)``: per-head attention distributions of ``h_g`` and
        ``h_l`` (each ``B x H x T x T``) for a full (non-incremental) input."""
        l_c = self.local_context(query, key_padding_mask)
        a_g = attention_head_probs(self.global_attn, query, query, key_padding_mask, attn_mask)
        a_l = attention_head_probs(self.local_attn, query, l_c, key_padding_mask, attn_mask)
        return a_g, a_l

    # fairseq's decoder layer reads/writes ``self_attn``'s buffer for
    # ``prev_self_attn_state``/ONNX export: expose h_g's (the self-attention).
    def _get_input_buffer(self, incremental_state):
        return self.global_attn._get_input_buffer(incremental_state)

    def _set_input_buffer(self, incremental_state, buffer):
        return self.global_attn._set_input_buffer(incremental_state, buffer)


class DCTransformerEncoderLayer(TransformerEncoderLayerBase):
    """Encoder layer whose self-attention sub-layer is the DC module
    (Fig. 2a): ``z_f = LN(DC(r) + r)`` then fairseq's FFN sub-layer."""

    def __init__(self, cfg, dc_kernel_size: int = 2, return_fc: bool = False):
        self.dc_kernel_size = dc_kernel_size  # read by build_self_attention
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        return DualContextAttention(
            embed_dim, cfg.encoder.attention_heads, kernel_size=self.dc_kernel_size,
            causal=False, attention_dropout=cfg.attention_dropout, dropout=cfg.dropout,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            export=cfg.export,
        )


class DCTransformerDecoderLayer(TransformerDecoderLayerBase):
    """Decoder layer whose self-attention sub-layer is the (causal) DC module
    (Fig. 2b): ``z_f = LN(DC(r) + r)`` then encoder-decoder attention and FFN."""

    def __init__(self, cfg, no_encoder_attn: bool = False, dc_kernel_size: int = 2,
                 add_bias_kv: bool = False, add_zero_attn: bool = False):
        if cfg.cross_self_attention:
            raise ValueError("--cross-self-attention is not supported by transformer_dc "
                             "DC decoder layers (--dc-decoder-layers)")
        if add_bias_kv or add_zero_attn:
            raise ValueError("add_bias_kv/add_zero_attn are not supported by DC decoder layers")
        self.dc_kernel_size = dc_kernel_size  # read by build_self_attention
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return DualContextAttention(
            embed_dim, cfg.decoder.attention_heads, kernel_size=self.dc_kernel_size,
            causal=True, attention_dropout=cfg.attention_dropout, dropout=cfg.dropout,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            export=cfg.export,
        )
