"""Hybrid (local + global) self-attention: Xu, Wong, Yang, Zhang and Chao (ACL 2019),
"Leveraging Local and Global Patterns for Self-Attention Networks".

All of the paper's equations live in :class:`HybridMultiheadAttention`, a subclass
of fairseq's :class:`~fairseq.modules.MultiheadAttention`. It keeps that class's
parameters (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``; the state dicts are
compatible), its incremental key/value cache and ``reorder_incremental_state``, and
its energy computation: the parent's ``before_softmax=True`` path projects Q/K/V,
handles the incremental cache, masks padded keys with ``-inf`` and adds the causal
``attn_mask``. Only the step from the energy to the output is replaced.

Equations (per head; ``H`` is the attention input, ``n`` the length)::

    (1)  xi_i      = Q_i K^T / sqrt(d)                        computed ONCE per head
    (2)  global_i  = softmax(xi_i) V
    (3)  B(xi_i)_j = xi_ij if |i - j| <= m else -inf            (hard band, window m)
         local_i   = softmax(B(xi_i)) V
    (5)  g_i       = sigmoid(w . H_i)                           (no bias, as Eq. 5)
    (4)  out_i     = (1 - g_i) * global_i + g_i * local_i       then out_proj

Modes (``--hybrid-mode``):

``gate``
    The paper's model, Eqs. (1)-(5). Because both patterns multiply the same V and
    ``g_i`` is constant along a row, Eq. (4) is evaluated as
    ``((1 - g_i) P_global + g_i P_local) V`` (one ``torch.lerp`` and a single
    probability-times-V product; identical up to rounding to mixing the outputs).
    With ``--hybrid-gate-per-head`` every head h gets its own gate
    ``g_ih = sigmoid(w_h . H_i)`` (a scalar per token *and* head, ``W`` is
    ``heads x d``) instead of one scalar per token shared by all heads.
``concat``
    Table 1's HYBRID (Concate): ``out_i = W_o [global_i ; local_i]`` with ``W_o`` a
    ``d x 2d`` projection. It is stored as ``out_proj`` (acting on the global half,
    so fairseq weights load unchanged) plus ``local_out_proj`` (``d x d``, no bias,
    acting on the local half); ``[W_g W_l] [x; y] = W_g x + W_l y``.
``local``
    Table 1's LOCAL PATTERN: the local pattern alone, ``softmax(B(xi)) V``.
``gauss-window``, ``gauss-center``, ``gauss-both``
    Table 1's localness baselines, all a Gaussian bias ``G`` added to the energy,
    ``softmax(xi_i + G_i) V``, with ``G_ij = -(p_j - P_i)^2 / (2 sigma_i^2)``,
    ``sigma_i = D_i / 2`` (Yang et al. 2018, Eq. 4-6), ``p_j`` the position of key
    ``j`` in its sentence and ``I_i`` the number of tokens query ``i`` may see
    (the sentence length in the encoder, ``p_i + 1`` in a causal decoder):

    * ``gauss-window`` -- NEIGHBOR (Sperber et al., 2018): the centre is the query
      itself, ``P_i = p_i``; the window is predicted,
      ``D_i = I_i * sigmoid(u_d . tanh(W_d H_i))``.
    * ``gauss-center`` -- LOCAL H (Luong et al., 2015, "local-p"): the centre is
      predicted, ``P_i = I_i * sigmoid(u_p . tanh(W_p H_i))``; the window is
      fixed, ``D = 2m + 1`` (the width of the hard local pattern), no hard cut.
    * ``gauss-both`` -- LOCAL S (Yang et al., 2018): both predicted, with separate
      ``W_p`` and ``W_d`` (Table 1 counts twice the parameters of either).

    The predictors read the attention input ``H_i`` rather than ``Q_i = W_Q H_i``:
    ``W_p Q_i = (W_p W_Q) H_i + const`` so the family of functions is the same, and
    this needs no second query projection. One bias is shared by all heads.

Choices where the paper is silent (tested in tests/test_transformer_hybrid.py):

* **Gate input.** ``H_i`` is the input of the attention module (the layer input
  in fairseq's default post-norm layers, the layer-normed input with
  ``--encoder-normalize-before``), the same tensor Q/K/V are projected from. The
  gate weight starts at zero, so every layer starts as an even mix (g = 0.5).
* **Padding.** Padded keys are masked (``-inf``) in both patterns before the
  softmax; the gate of token i depends only on ``H_i``. fairseq pads a sentence
  contiguously at one end, so the distance between tensor indices equals the
  distance between words, and the band over tensor indices is the band over the
  sentence. A *padded query* whose whole window is padding would give an all
  ``-inf`` row (NaN); outside-band entries are therefore filled with the dtype's
  most negative finite value instead of ``-inf``: for real tokens (whose window
  always holds the token itself) they still get probability exactly 0, and padded
  rows stay finite (their output is ignored, as in fairseq).
* **Decoder.** In decoder layers the band is causal, ``i - m <= j <= i``, and
  incremental decoding uses the parent's key/value cache; the band for a step is a
  slice of a cached mask, never rebuilt per step.
* **Band masks** are built once per (window, causal, device) for the longest
  length seen (grown by doubling) and sliced for every call.
* **Dropout** (``--attention-dropout``) is applied to the probabilities that
  multiply V: to the mixed distribution in ``gate`` mode, to both distributions
  in ``concat`` mode.
* **Softmax precision**: half-precision energies are normalised in float32 (as
  fairseq does); float32/float64 stay in their own precision.
* **Gaussian bias in half precision** (``--fp16``, autocast): ``G`` reaches
  ``-2 (p_j - P_i)^2 / D_i^2``, far below float16's range for long sentences or
  narrow predicted windows (``D_i >= 1e-3``: down to ``-2e6`` per squared word of
  distance). It is computed in float32 and added to the energy **in float32**
  (the energy is upcast for the add, the softmax runs in float32 and only the
  probabilities are cast back). Clamping ``G`` to float16's most negative value
  before a half-precision add is not enough: ``finfo.min + xi`` overflows to
  ``-inf`` for any ``xi < -16``, a row whose keys are all far from a fractional
  predicted centre becomes all ``-inf`` (NaN) or ties at ``finfo.min`` (a
  uniform row where float32 has a peaked one), and a bias of a few thousand
  already rounds the energy to a multiple of 4-8. Tested: float16 / bfloat16
  models and autocast against float32, every Gaussian mode, 200-token sentences
  and vanishing predicted windows. The masks of ``gate``/``concat``/``local`` are
  written with ``masked_fill`` (no add), so ``finfo(dtype).min`` is safe there.
"""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.modules.multihead_attention import MultiheadAttention

from ctx_fairseq.modules.context_statistics import mean_gate_sum, real_tokens

__all__ = [
    "HYBRID_MODES",
    "GAUSSIAN_MODES",
    "HybridAttentionConfig",
    "HybridMultiheadAttention",
    "BandMaskCache",
]

GAUSSIAN_MODES = ("gauss-window", "gauss-center", "gauss-both")
HYBRID_MODES = ("gate", "concat", "local") + GAUSSIAN_MODES


@dataclass(frozen=True)
class HybridAttentionConfig:
    """What a hybrid attention layer computes (see the module docstring)."""

    mode: str = "gate"
    window: int = 1
    gate_per_head: bool = False

    def __post_init__(self):
        if self.mode not in HYBRID_MODES:
            raise ValueError(
                f"--hybrid-mode: unknown mode {self.mode!r}; expected one of "
                f"{', '.join(HYBRID_MODES)}"
            )
        if isinstance(self.window, bool) or not isinstance(self.window, int):
            raise ValueError(
                f"--hybrid-window: expected a non-negative integer m (words on each "
                f"side of the local window), got {self.window!r}"
            )
        if self.window < 0:
            raise ValueError(
                f"--hybrid-window: expected a non-negative integer m (words on each "
                f"side of the local window), got {self.window}"
            )
        if self.gate_per_head and self.mode != "gate":
            raise ValueError(
                f"--hybrid-gate-per-head only applies to --hybrid-mode gate, "
                f"not {self.mode!r}"
            )


class BandMaskCache:
    """Boolean masks of the positions *outside* the local window.

    ``outside[i, j]`` is True when ``|i - j| > m`` (bidirectional) or when
    ``j > i`` or ``i - j > m`` (causal). One square mask per (device) is built for
    the longest length requested so far (capacity doubled when exceeded) and every
    call returns a view ``outside[S - T:S, :S]`` (queries are the last T of the S
    keys, which covers incremental decoding). ``stacked`` returns the same mask
    with an all-False "global" plane in front, shape ``(2, T, S)``, so both
    patterns come out of one ``masked_fill``. ``builds`` counts constructions.
    """

    def __init__(self, window: int, causal: bool):
        self.window = window
        self.causal = causal
        self._masks: Dict[Tuple[str, Optional[int]], Tensor] = {}
        self.builds = 0

    def _build(self, size: int, device: torch.device) -> Tensor:
        idx = torch.arange(size, device=device)
        diff = idx.view(-1, 1) - idx.view(1, -1)  # i - j
        if self.causal:
            outside = (diff < 0) | (diff > self.window)
        else:
            outside = diff.abs() > self.window
        self.builds += 1
        return torch.stack([torch.zeros_like(outside), outside])

    def stacked(self, tgt_len: int, src_len: int, device: torch.device) -> Tensor:
        key = (device.type, device.index)
        mask = self._masks.get(key)
        if mask is None or mask.size(-1) < src_len:
            cap = 64 if mask is None else mask.size(-1)
            while cap < src_len:
                cap *= 2
            mask = self._build(cap, device)
            self._masks[key] = mask
        return mask[:, src_len - tgt_len : src_len, :src_len]

    def outside(self, tgt_len: int, src_len: int, device: torch.device) -> Tensor:
        return self.stacked(tgt_len, src_len, device)[1]


class _PositionPredictor(nn.Module):
    """``I * sigmoid(u . tanh(W H))`` of Yang et al. (2018), one scalar per token."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.score = nn.Linear(embed_dim, 1, bias=False)
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        nn.init.normal_(self.score.weight, std=embed_dim**-0.5)

    def forward(self, h: Tensor) -> Tensor:  # T x B x C -> T x B
        """The sigmoid, float32 (float64 for float64 inputs)."""
        t = torch.tanh(self.proj(h))
        # Precision upcast: the result is scaled by the sentence length (a position
        # in [0, I)), so the d -> 1 score and its sigmoid run in float32: in
        # bfloat16 a sigmoid near 1 has a resolution of 2^-9, i.e. 0.4 words of a
        # 200-word sentence. The d x d projection stays in the compute dtype.
        work = torch.promote_types(t.dtype, torch.float32)
        with torch.autocast(t.device.type, enabled=False):
            s = F.linear(t.to(work), self.score.weight.to(work))
        return torch.sigmoid(s.squeeze(-1))


class HybridMultiheadAttention(MultiheadAttention):
    """Self-attention with local and global patterns from one energy (module docstring).

    Args:
        embed_dim, num_heads, dropout, bias, q_noise, qn_block_size: as fairseq's
            :class:`MultiheadAttention` (self-attention only).
        config: a :class:`HybridAttentionConfig` (mode, window m, per-head gate).
        causal: decoder self-attention (causal band ``i - m <= j <= i``; Gaussian
            lengths count the visible prefix).

    Attributes useful for analysis and tests:
        record_gates: when True, ``last_gate`` keeps the gate of the latest call,
            shape ``T x B x 1`` (or ``T x B x heads``), detached, and
            ``last_gate_padding_mask`` the padding of its queries (``B x T``, True =
            pad; None when the call had none, i.e. every query is a real token).
            :meth:`gate_statistics` reduces them for the training statistics
            (``label_smoothed_cross_entropy_ctx``); the gate analysis
            (``ctx_fairseq.eval.analyses.hybrid_gates``) reads ``last_gate`` itself.
        gate_override: ``None`` (normal) or a float used instead of ``g_i``
            (``0.0`` gives exactly the global pattern, ``1.0`` the local one).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        config: HybridAttentionConfig = HybridAttentionConfig(),
        causal: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        q_noise: float = 0.0,
        qn_block_size: int = 8,
    ):
        super().__init__(
            embed_dim,
            num_heads,
            dropout=dropout,
            bias=bias,
            self_attention=True,
            q_noise=q_noise,
            qn_block_size=qn_block_size,
        )
        self.hybrid = config
        self.mode = config.mode
        self.window = config.window
        self.causal = causal
        # Always take the parent's explicit path (its fused fast path ignores
        # ``before_softmax``); this flag only disables an embed-dim assertion.
        self._set_skip_embed_dim_check()
        self.band_masks = BandMaskCache(config.window, causal)

        self.gate_proj = None
        self.local_out_proj = None
        self.center_predictor = None
        self.window_predictor = None
        if self.mode == "gate":
            n_gates = num_heads if config.gate_per_head else 1
            self.gate_proj = nn.Linear(embed_dim, n_gates, bias=False)
            nn.init.zeros_(self.gate_proj.weight)
        elif self.mode == "concat":
            self.local_out_proj = nn.Linear(embed_dim, embed_dim, bias=False)
            nn.init.xavier_uniform_(self.local_out_proj.weight)
        if self.mode in ("gauss-center", "gauss-both"):
            self.center_predictor = _PositionPredictor(embed_dim)
        if self.mode in ("gauss-window", "gauss-both"):
            self.window_predictor = _PositionPredictor(embed_dim)

        self.record_gates = False
        self.last_gate: Optional[Tensor] = None
        self.last_gate_padding_mask: Optional[Tensor] = None
        self.gate_override: Optional[float] = None

    def extra_repr(self) -> str:
        return (
            f"mode={self.mode}, window={self.window}, causal={self.causal}, "
            f"gate_per_head={self.hybrid.gate_per_head}"
        )

    # ------------------------------------------------------------------ gate
    def gate(self, h: Tensor) -> Tensor:
        """Eq. (5): ``g = sigmoid(W H)``, ``T x B x 1`` (or ``T x B x heads``)."""
        assert self.gate_proj is not None
        if self.gate_override is not None:
            n = self.gate_proj.out_features
            return h.new_full((h.size(0), h.size(1), n), float(self.gate_override))
        return torch.sigmoid(self.gate_proj(h))

    def gate_statistics(self) -> Optional[Tensor]:
        """``[sum, count]`` (float64) of the gate ``g_i`` of Eq. (5) over the
        non-padding query tokens of the latest recorded call (``record_gates``),
        with ``--hybrid-gate-per-head`` averaged over the heads first; None when
        nothing is recorded. The end-of-sentence token counts as a token here
        (the gate analysis of Fig. 3 leaves it out)."""
        g = self.last_gate
        if g is None:
            return None
        mask = real_tokens(g.size(0), g.size(1), g.device, self.last_gate_padding_mask)
        return mean_gate_sum(g, mask)

    # --------------------------------------------------------------- softmax
    @staticmethod
    def _softmax(x: Tensor) -> Tensor:
        if x.dtype in (torch.float16, torch.bfloat16):
            return F.softmax(x, dim=-1, dtype=torch.float32).type_as(x)
        return F.softmax(x, dim=-1)

    # -------------------------------------------------------------- gaussian
    def _gaussian_bias(
        self, h: Tensor, key_padding_mask: Optional[Tensor], bsz: int, tgt_len: int,
        src_len: int, dtype: torch.dtype,
    ) -> Tensor:
        """``G`` of shape ``B x 1 x T x S`` (shared by the heads), in
        ``promote_types(dtype, float32)``: float32 for half-precision energies
        (see "Gaussian bias in half precision" in the module docstring), never
        cast down; finite for every dtype (``D_i >= 1e-3``)."""
        device = h.device
        work = torch.promote_types(dtype, torch.float32)  # half -> float32
        if key_padding_mask is not None and key_padding_mask.size(-1) == src_len:
            real = ~key_padding_mask.to(torch.bool)
            key_pos = (real.cumsum(-1) - 1).clamp_(min=0).to(work)  # B x S
            length = real.sum(-1, keepdim=True).to(work)  # B x 1
        else:  # no padding (or incremental decoding of right-padded targets)
            key_pos = torch.arange(src_len, device=device, dtype=work)
            key_pos = key_pos.unsqueeze(0).expand(bsz, src_len)
            length = torch.full((bsz, 1), float(src_len), device=device, dtype=work)
        query_pos = key_pos[:, src_len - tgt_len :]  # B x T
        visible = query_pos + 1.0 if self.causal else length  # I_i, B x T (or B x 1)

        if self.center_predictor is not None:
            center = visible * self.center_predictor(h).t().to(work)  # B x T
        else:
            center = query_pos
        if self.window_predictor is not None:
            width = visible * self.window_predictor(h).t().to(work)
        else:
            width = torch.full_like(query_pos, float(2 * self.window + 1))
        width = width.clamp(min=1e-3)
        # G_ij = -(p_j - P_i)^2 / (2 sigma_i^2), sigma_i = D_i / 2
        dist = key_pos.unsqueeze(1) - center.unsqueeze(2)  # B x T x S
        bias = -2.0 * dist.pow(2) / width.pow(2).unsqueeze(2)
        return bias.unsqueeze(1)

    def _two_plane_attention(
        self,
        query: Tensor,
        energy: Tensor,
        v: Tensor,
        pad: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
    ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """Modes ``gate`` and ``concat`` of :meth:`forward`: ``(attn, weights,
        local_extra)`` from the scaled energies ``energy`` (``B x H x T x S``)
        and values ``v`` (``B x H x S x Dh``); ``pad`` the padded keys when
        :meth:`forward` folded them into this mask. ``attn`` is ``B x H x T x
        Dh``; ``local_extra`` the band-limited plane's output (``T x B x E``)
        for ``concat``'s second projection, ``None`` for ``gate``."""
        bsz, _, tgt_len, src_len = energy.shape
        very_negative = torch.finfo(energy.dtype).min
        # Eq. (2) and (3) from one masked_fill and one softmax: plane 0 is the
        # global energy, plane 1 the band-limited one. Masked entries get the
        # most negative finite value (exactly zero probability; see docstring).
        mask = self.band_masks.stacked(tgt_len, src_len, query.device)  # 2 x T x S
        if pad is not None:
            mask = mask.unsqueeze(1) | pad.unsqueeze(0)  # 2 x B x T x S
        else:
            mask = mask.unsqueeze(1)  # 2 x 1 x T x S
        logits = energy.unsqueeze(0).masked_fill(mask.unsqueeze(2), very_negative)
        probs = self._softmax(logits)  # 2 x B x H x T x S
        if self.mode == "gate":
            g = self.gate(query)  # T x B x G
            if self.record_gates:
                self.last_gate = g.detach()
                # self-attention: the key padding mask is the queries' own
                # (B x T) in a full pass and in an incremental step (fairseq
                # passes the step's token); None: no query is padding
                self.last_gate_padding_mask = (
                    key_padding_mask.to(torch.bool)
                    if key_padding_mask is not None
                    and key_padding_mask.shape == (bsz, tgt_len) else None)
            g = g.permute(1, 2, 0).unsqueeze(-1).to(probs.dtype)  # B x G x T x 1
            weights = torch.lerp(probs[0], probs[1], g)  # Eq. (4)
            attn_probs = self.dropout_module(weights)
            return torch.matmul(attn_probs, v), weights, None  # B x H x T x Dh
        weights = probs.mean(0)
        attn_probs = self.dropout_module(probs)
        attn2 = torch.matmul(attn_probs, v.unsqueeze(0))  # 2 x B x H x T x Dh
        local_extra = attn2[1].permute(2, 0, 1, 3).reshape(tgt_len, bsz, query.size(2))
        return attn2[0], weights, local_extra

    # --------------------------------------------------------------- forward
    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if need_head_weights:
            need_weights = True
        # Eq. (1), once: the parent projects Q/K/V (using its incremental cache),
        # scales Q by 1/sqrt(d), adds attn_mask and (unless folded into our own
        # mask below, which saves a full pass over the energy) masks padded keys.
        fold_padding = (
            not before_softmax
            and incremental_state is None
            and key_padding_mask is not None
            and self.mode in ("gate", "concat", "local")
        )
        energy, v = super().forward(
            query, key, value,
            key_padding_mask=None if fold_padding else key_padding_mask,
            incremental_state=incremental_state,
            need_weights=False,
            static_kv=static_kv,
            attn_mask=attn_mask,
            before_softmax=True,
        )
        if before_softmax:
            return energy, v
        tgt_len, bsz, embed_dim = query.size()
        heads = self.num_heads
        src_len = energy.size(-1)
        energy = energy.view(bsz, heads, tgt_len, src_len)
        v = v.view(bsz, heads, src_len, self.head_dim)
        very_negative = torch.finfo(energy.dtype).min

        pad: Optional[Tensor] = None  # B x 1 x S, True at padded keys
        if fold_padding:
            assert key_padding_mask is not None
            pad = key_padding_mask.to(torch.bool).unsqueeze(1)

        local_extra: Optional[Tensor] = None
        if self.mode in ("gate", "concat"):
            attn, weights, local_extra = self._two_plane_attention(
                query, energy, v, pad, key_padding_mask)
        else:
            if self.mode == "local":
                mask = self.band_masks.outside(tgt_len, src_len, query.device)  # T x S
                if pad is not None:
                    mask = (mask.unsqueeze(0) | pad).unsqueeze(1)  # B x 1 x T x S
                logits = energy.masked_fill(mask, very_negative)
                weights = self._softmax(logits)
            else:
                bias = self._gaussian_bias(
                    query, key_padding_mask, bsz, tgt_len, src_len, energy.dtype)
                # Stability upcast: half-precision energies are added to the float32
                # bias and normalised in float32 (the softmax upcasts them anyway);
                # a no-op for float32/float64. See the module docstring.
                logits = energy.to(bias.dtype) + bias
                weights = F.softmax(logits, dim=-1).to(energy.dtype)
            attn = torch.matmul(self.dropout_module(weights), v)

        attn = attn.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        out = self.out_proj(attn)
        if local_extra is not None:
            out = out + self.local_out_proj(local_extra)

        attn_weights: Optional[Tensor] = None
        if need_weights:
            attn_weights = weights.transpose(1, 0)  # H x B x T x S
            if not need_head_weights:
                attn_weights = attn_weights.mean(dim=0)
        return out, attn_weights
