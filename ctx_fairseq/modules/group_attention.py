r"""Group attention and the gated local/global combination of G-Transformer
(Bao, Zhang, Teng, Chen & Luo, ACL 2021, "G-Transformer for Document-level
Machine Translation").

Group tags (the paper's "group tags"): every token of a segment
``x_1 <sep> x_2 <sep> ... x_n </s>`` carries the index of its sentence.

* source token ``t`` (:func:`source_group_tags`):
  ``G_X(t) = cumsum(src == sep)_t - [src_t == sep]``: the ``<sep>`` that ends
  sentence ``i`` belongs to group ``i`` (an exclusive cumulative sum);
* decoder input position ``t`` (:func:`target_group_tags`):
  ``G_Y(t) = cumsum(prev_output_tokens == sep)_t`` (inclusive): position ``t``
  predicts target token ``t``, whose group is the number of ``<sep>`` before it;
* padding gets the tag ``-1`` (never a real group), so that the tag equality
  below excludes padded keys by itself and padded query rows see padded keys
  only (a finite row whose output nothing reads).

Group attention (the paper's ``GroupAttn``): ordinary scaled
dot-product attention whose keys are restricted to the query's group,

.. math::

    \mathrm{GroupAttn}(Q, K, V) = \mathrm{softmax}\Big(\frac{Q K^\top}{\sqrt{d_k}}
        + M\Big) V, \qquad M_{ts} = \begin{cases} 0 & G_Q(t) = G_K(s) \\
        -\infty & \text{otherwise} \end{cases}

used for the encoder self-attention, the causal decoder self-attention (``M``
also masks ``s > t``) and the decoder's cross-attention (``G_Q = G_Y``,
``G_K = G_X``), in every layer. :class:`GroupAttention` is fairseq's
:class:`~fairseq.modules.MultiheadAttention` (same parameters and names,
``q_proj``/``k_proj``/``v_proj``/``out_proj``, so a sentence-level
transformer's weights load unchanged) with its own forward: the boolean mask
``allowed`` (``B x T x S``, True = the key takes part; :func:`self_group_mask`,
:func:`cross_group_mask`) is broadcast over the heads and applied as
``masked_fill(-inf)`` before the softmax, or, when no weights are asked for,
handed to ``F.scaled_dot_product_attention`` in its additive form (0 / -inf,
made once per pass and dtype and shared by the layers, :class:`GroupMask`: a
boolean mask would be converted in every call). The mask
subsumes fairseq's key padding mask and future mask, which the module
therefore ignores.

A row is never all ``-inf``: a self-attention row always sees its own position
(same tag, causal diagonal); a cross-attention row whose group has no source
tokens (a target with more sentences than its source: it cannot happen under
the sentence-count frame, ``--doc2doc-frame``, but a free decoder can do it)
falls back to every real source token (ordinary attention), and a row of an
all-padding source to every key (:func:`cross_group_mask`). So no softmax
produces NaN and the masks are static-shaped (no host reads).

How the mask reaches the module: fairseq's transformer layers call their
attentions with fairseq's arguments only, so the transformer_gtrans
encoder/decoder attach the masks of the current pass to their attentions
for the duration of the pass (:func:`attached_masks`, in the way
``ctx_fairseq.models._fairseq_utils.plain_attention`` sets the beam size) and
detach them after; a :class:`GroupAttention` called outside such a pass is an
error. (Activation checkpointing recomputes a layer outside the pass: the
model refuses ``--checkpoint-activations``.)

Gated combination (the paper's "combined attention" of the top layers):

.. math::

    g = \sigma\big(W [h_{local}; h_{global}] + b\big), \qquad
    h = g \odot h_{local} + (1 - g) \odot h_{global}

with ``h_local`` the group attention, ``h_global`` ordinary multi-head
attention over the whole segment (causal in the decoder's self-attention),
``W in R^{d x 2d}``. The paper says a gate over the concatenation; it does not
say which side ``g`` weights: here ``g`` weights the **local** output, as in
the authors' code (baoguangsheng/g-transformer). :class:`GatedGroupAttention`
is the group attention (its own parameters as above) plus ``global_attn`` (a
fairseq :class:`MultiheadAttention` given fairseq's masks) and ``gate``
(``nn.Linear(2d, d)``, Xavier-uniform weight, zero bias). Only the local
output's attention weights are returned (alignment, ``--print-alignment``).

Incremental decoding: the key/value cache is fairseq's (``prev_key`` /
``prev_value`` in the incremental state, ``B x H x S x d_k``), reordered by the
inherited :meth:`~fairseq.modules.MultiheadAttention.reorder_incremental_state`;
the group attention does not use fairseq's "beamable" encoder-decoder
attention (its keys are kept per hypothesis), ``global_attn`` does. The tags of
the cached keys and the running separator count live in
:class:`GroupTagState`, one per decoder, reordered with the beams.

Word dropout (:func:`word_dropout`): in training, each source and decoder-input
token is replaced by ``<unk>`` with probability ``p``, never a special symbol
(``<s>``, ``<pad>``, ``</s>``, ``<unk>``) nor the separator (the group tags stay
those of the clean segment). The authors' code replaces by a ``<mask>`` symbol
(``--doc-noise-mask``); the dictionaries here have none, ``<unk>`` is what the
project's ``--coword-dropout`` uses. Drawn from torch's global generator, which
fairseq seeds per update: runs are reproducible.
"""

from contextlib import contextmanager
from typing import Dict, Iterable, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import MultiheadAttention

__all__ = [
    "GroupAttention",
    "GatedGroupAttention",
    "GroupMask",
    "GroupTagState",
    "attached_masks",
    "cross_group_mask",
    "self_group_mask",
    "source_group_tags",
    "target_group_tags",
    "word_dropout",
]


# ------------------------------------------------------------------ tags and masks


def source_group_tags(tokens: Tensor, sep: int, pad: int) -> Tensor:
    """``B x S`` long: the sentence index of each source token (exclusive
    cumulative count of separators: a ``<sep>`` is in the group it ends), -1
    on padding."""
    is_sep = tokens.eq(sep)
    tags = is_sep.cumsum(dim=1) - is_sep.long()
    return tags.masked_fill(tokens.eq(pad), -1)


def target_group_tags(prev_output_tokens: Tensor, sep: int, pad: int) -> Tensor:
    """``B x T`` long: the group of the target token each decoder input
    position predicts (inclusive cumulative count of separators), -1 on
    padding."""
    tags = prev_output_tokens.eq(sep).cumsum(dim=1)
    return tags.masked_fill(prev_output_tokens.eq(pad), -1)


def _never_empty(allowed: Tensor, real_keys: Tensor) -> Tensor:
    """A row without any allowed key takes every real key (``real_keys``:
    ``B x 1 x S``), and a row still without one every key: no softmax row is
    all ``-inf``."""
    empty = ~allowed.any(dim=-1, keepdim=True)
    allowed = allowed | (empty & real_keys)
    return allowed | ~allowed.any(dim=-1, keepdim=True)


def self_group_mask(tags: Tensor, causal: bool) -> Tensor:
    """``B x T x T`` bool, True where query ``t`` may attend key ``s``: the same
    group (padding: tag -1, with padding only), and ``s <= t`` if ``causal``.
    Every row holds its own position."""
    allowed = tags.unsqueeze(2) == tags.unsqueeze(1)
    if causal:
        t = tags.size(1)
        allowed = allowed & torch.ones(t, t, dtype=torch.bool, device=tags.device).tril()
    return allowed


def cross_group_mask(query_tags: Tensor, key_tags: Tensor) -> Tensor:
    """``B x T x S`` bool: target position ``t`` attends the source tokens of its
    own group; a group with no source tokens attends every real source token
    (see the module docstring), never an empty row."""
    allowed = query_tags.unsqueeze(2) == key_tags.unsqueeze(1)
    return _never_empty(allowed, key_tags.ge(0).unsqueeze(1))


def word_dropout(tokens: Tensor, p: float, unk: int, nspecial: int, sep: int) -> Tensor:
    """``tokens`` with each word (not a special symbol, not the separator)
    replaced by ``unk`` with probability ``p`` (torch's global generator)."""
    if p <= 0:
        return tokens
    keep = tokens.lt(nspecial) | tokens.eq(sep)
    drop = torch.rand(tokens.shape, device=tokens.device) < p
    return tokens.masked_fill(drop & ~keep, unk)


class GroupMask:
    """One pass's mask, shared by the attentions it is attached to:
    ``allowed`` (``B x T x S`` bool) and, made once per dtype, its additive
    form (``B x 1 x T x S``, 0 / -inf) that ``F.scaled_dot_product_attention``
    takes without converting a boolean mask in every layer."""

    def __init__(self, allowed: Tensor):
        self.allowed = allowed
        self._additive: Dict[torch.dtype, Tensor] = {}

    def additive(self, dtype: torch.dtype) -> Tensor:
        out = self._additive.get(dtype)
        if out is None:
            zeros = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
            out = zeros.masked_fill(~self.allowed, float("-inf")).unsqueeze(1)
            self._additive[dtype] = out
        return out


@contextmanager
def attached_masks(pairs: Iterable[Tuple[Optional[nn.Module], Tensor]]):
    """Attach each ``(attention, allowed)`` mask for the block (a ``None``
    attention is skipped; the attentions given the same ``allowed`` tensor
    share one :class:`GroupMask`) and detach them after, also on error."""
    attached, shared = [], {}
    try:
        for module, mask in pairs:
            if module is not None:
                if id(mask) not in shared:
                    shared[id(mask)] = (mask, GroupMask(mask))
                module.group_mask = shared[id(mask)][1]
                attached.append(module)
        yield
    finally:
        for module in attached:
            module.group_mask = None


# ------------------------------------------------------------------ attention


def _softmax_dtype(x: Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


class GroupAttention(MultiheadAttention):
    """Group attention (module docstring): fairseq's MultiheadAttention with
    the attached ``allowed`` mask (``B x T x S``) in place of its key padding
    and future masks. Same constructor; ``add_bias_kv``, ``add_zero_attn`` and
    xformers are not supported."""

    def __init__(self, embed_dim, num_heads, *args, **kwargs):
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        if self.bias_k is not None or self.add_zero_attn or self.use_xformers:
            raise ValueError("GroupAttention: add_bias_kv, add_zero_attn and xformers "
                             "attention are not supported")
        self.group_mask = None

    @property
    def group_mask(self) -> Optional[GroupMask]:
        """The attached mask (a boolean ``B x T x S`` tensor set here is
        wrapped in a :class:`GroupMask`); None outside a pass."""
        return self._group_mask

    @group_mask.setter
    def group_mask(self, mask) -> None:
        self._group_mask = mask if mask is None or isinstance(mask, GroupMask) \
            else GroupMask(mask)

    def set_beam_size(self, beam_size):
        """Keys are kept per hypothesis (the mask is per query row): fairseq's
        beamable encoder-decoder attention is not used."""
        self.beam_size = 1

    def _heads(self, x: Tensor) -> Tensor:
        """``L x B x C`` -> ``B x H x L x d_k``."""
        length, bsz = x.size(0), x.size(1)
        return x.reshape(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _keys_values(self, query, key, value, incremental_state, static_kv):
        """``(k, v)`` (``B x H x S x d_k``) with fairseq's incremental cache."""
        saved = (self._get_input_buffer(incremental_state)
                 if incremental_state is not None else None)
        if saved is not None and static_kv and "prev_key" in saved:
            return saved["prev_key"], saved["prev_value"]
        src = query if self.self_attention else key
        val = query if self.self_attention else value
        k, v = self._heads(self.k_proj(src)), self._heads(self.v_proj(val))
        if saved is not None and "prev_key" in saved and not static_kv:
            k = torch.cat([saved["prev_key"], k], dim=2)
            v = torch.cat([saved["prev_value"], v], dim=2)
        if incremental_state is not None:
            saved = {} if saved is None else saved
            saved["prev_key"], saved["prev_value"] = k, v
            self._set_input_buffer(incremental_state, saved)
        return k, v

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False,
                attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """fairseq's signature; ``key_padding_mask`` and ``attn_mask`` are
        subsumed by the attached group mask (module docstring)."""
        group = self.group_mask
        if group is None:
            raise RuntimeError("GroupAttention called without a group mask: it runs inside "
                               "the transformer_gtrans encoder/decoder (attached_masks)")
        allowed = group.allowed
        if before_softmax:
            raise NotImplementedError("GroupAttention: before_softmax is not supported")
        tgt_len, bsz, embed_dim = query.shape
        q = self._heads(self.q_proj(query))
        k, v = self._keys_values(query, key, value, incremental_state, static_kv)
        if tuple(allowed.shape) != (bsz, tgt_len, k.size(2)):
            raise RuntimeError(f"GroupAttention: group mask {tuple(allowed.shape)} for "
                               f"{bsz} x {tgt_len} queries and {k.size(2)} keys")
        weights: Optional[Tensor] = None
        if need_weights or need_head_weights:
            energy = torch.matmul(q * self.scaling, k.transpose(2, 3))
            # B x 1 x T x S, broadcast over the heads
            energy = energy.masked_fill(~allowed.unsqueeze(1), float("-inf"))
            # half precision: the softmax in float32, as fairseq's (utils.softmax)
            probs = torch.softmax(energy, dim=-1, dtype=_softmax_dtype(energy)).type_as(energy)
            out = torch.matmul(self.dropout_module(probs), v)
            weights = probs.transpose(0, 1) if need_head_weights else probs.mean(dim=1)
        else:
            drop = self.training or self.dropout_module.apply_during_inference
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=group.additive(q.dtype),
                dropout_p=self.dropout_module.p if drop else 0.0, scale=self.scaling)
        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        return self.out_proj(out), weights


class GatedGroupAttention(GroupAttention):
    """``h = g * GroupAttn + (1 - g) * GlobalAttn``, ``g = sigmoid(W [local;
    global] + b)`` (module docstring). The group attention's parameters are
    this module's own (fairseq's names); ``global_attn`` and ``gate`` are the
    new ones."""

    def __init__(self, embed_dim, num_heads, *args, **kwargs):
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        self.global_attn = MultiheadAttention(embed_dim, num_heads, *args, **kwargs)
        self.gate = nn.Linear(2 * embed_dim, embed_dim)
        nn.init.xavier_uniform_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None,
                need_weights=True, static_kv=False, attn_mask=None, before_softmax=False,
                need_head_weights=False):
        local, weights = super().forward(
            query, key, value, key_padding_mask=key_padding_mask,
            incremental_state=incremental_state, need_weights=need_weights,
            static_kv=static_kv, attn_mask=attn_mask, before_softmax=before_softmax,
            need_head_weights=need_head_weights)
        glob, _ = self.global_attn(query, key, value, key_padding_mask=key_padding_mask,
                                   incremental_state=incremental_state, need_weights=False,
                                   static_kv=static_kv, attn_mask=attn_mask)
        g = torch.sigmoid(self.gate(torch.cat([local, glob], dim=-1)))
        return g * local + (1 - g) * glob, weights


# ------------------------------------------------------------------ decoder state


@with_incremental_state
class GroupTagState(nn.Module):
    """The decoder's group state in incremental decoding: the running
    separator count (``B x 1``) and the tags of the cached self-attention keys
    (``B x S``), reordered with the beams."""

    def step(self, incremental_state, prev_output_tokens: Tensor, sep: int,
             pad: int) -> Tuple[Tensor, Tensor]:
        """``(query_tags B x 1, key_tags B x S)`` for the last token of
        ``prev_output_tokens`` (the whole prefix, as fairseq's generator gives
        it); the state is updated."""
        token = prev_output_tokens[:, -1:]
        state = self.get_incremental_state(incremental_state, "group_tags")
        if state is None:  # first step: nothing cached before this token
            count = prev_output_tokens[:, :-1].eq(sep).sum(dim=1, keepdim=True)
            keys = prev_output_tokens.new_zeros(prev_output_tokens.size(0), 0)
        else:
            count, keys = state["count"], state["key_tags"]
        count = count + token.eq(sep).long()
        query = count.masked_fill(token.eq(pad), -1)
        keys = torch.cat([keys, query], dim=1)
        self.set_incremental_state(incremental_state, "group_tags",
                                   {"count": count, "key_tags": keys})
        return query, keys

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        state = self.get_incremental_state(incremental_state, "group_tags")
        if state is not None:
            self.set_incremental_state(incremental_state, "group_tags", {
                name: value.index_select(0, new_order) for name, value in state.items()})
        return incremental_state
