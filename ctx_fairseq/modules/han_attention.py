r"""The Hierarchical Attention Network (HAN) of Miculicich, Ram, Pappas &
Henderson (EMNLP 2018), "Document-Level Neural Machine Translation with
Hierarchical Attention Networks", Sec. 2.

For a query state :math:`h_t` (the final encoder or decoder state of word
:math:`t` of the current sentence) and the states :math:`h^j_i` of the words
of each of the :math:`k` previous sentences :math:`j`:

.. math::

    q_w &= f_w(h_t)                                 && \text{(Eq. 1)} \\
    s^j_t &= \mathrm{MultiHead}_i(q_w, h^j_i)        && \text{(Eq. 2: word level, per sentence)} \\
    q_s &= f_s(h_t)                                 && \text{(Eq. 3)} \\
    d_t &= \mathrm{FFN}(\mathrm{MultiHead}_j(q_s, s^j_t)) && \text{(Eq. 4: sentence level)} \\
    \lambda_t &= \sigma(W_h h_t + W_d d_t)           && \text{(Eq. 5: context gate)} \\
    \tilde h_t &= \lambda_t h_t + (1 - \lambda_t) d_t && \text{(Eq. 6)}

"each layer is followed by a normalisation layer" (Ba et al. 2016).

Mapping onto code (:class:`HierarchicalContextAttention`, no fairseq code
copied; the attentions are fairseq ``MultiheadAttention`` subclasses):

* Eq. 1-2: ``word_attn`` (:class:`HANWordAttention`). ``f_w`` is its query
  projection (a linear map, as the paper's ``f_w``; a separate linear layer
  before it would compose into the same linear map). Every query word
  attends, separately for each context sentence ``j``, to the words of
  ``j``: the ``B`` query rows are repeated ``k`` times, key row ``b*k + j``
  holds sentence ``j`` of row ``b``. Its output, after dropout, goes through
  LayerNorm ``word_norm``: ``s^j_t``.
* Eq. 3-4: ``sent_attn`` (:class:`HANSentenceAttention`), queried by ``h_t``
  (``f_s`` is its query projection), keys and values the ``k`` summaries
  ``s^j_t`` of the same word ``t``. ``FFN`` is the Transformer's
  position-wise feed-forward sub-layer (``fc1``, activation, ``fc2``) with
  its residual connection, followed by LayerNorm ``ffn_norm``: ``d_t =
  LN(u_t + FFN(u_t))``, ``u_t`` the (dropped-out) sentence-level attention
  output.
* Eq. 5-6: ``gate``, one linear map of ``[h_t; d_t]`` (``= W_h h_t + W_d
  d_t + b``), a vector gate (per dimension); ``lambda_t`` weighs the query
  state (the sentence-level representation), ``1 - lambda_t`` the context.
  The gated sum is followed by LayerNorm ``out_norm`` ("each layer is
  followed by a normalisation layer"; the authors' public code does the
  same).
* Multi-head: ``heads`` heads in both attentions (the paper uses the
  Transformer's multi-head attention; default: the model's attention heads).

Choices where the paper is silent (stated in docs/transformer_han.md too):

* Keys of the word level are the **words** of a context sentence: padding,
  ``</s>`` (the sentence end / separator) and ``<s>`` are masked (decoder
  side: the state at the leading ``</s>`` that starts decoding is masked,
  each remaining state is the one at the input position of a target word).
* **Missing context.** A context slot without a sentence (fewer than ``k``
  previous sentences in the document, or a sentence without words) is left
  out of the sentence-level attention; a sentence without any context
  sentence (the first of its document) gets the zero context vector ``d_t =
  0`` and goes through the gate unchanged: ``h~_t = LN(lambda_t h_t)`` with
  ``lambda_t = sigma(W_h h_t + b)``. No softmax ever runs over keys that are
  all masked (one masked key is let through and its result dropped), so
  outputs and gradients stay finite.
* **Detached inputs** (``detach_inputs``, default True, as the authors'
  public code does): the queries of both attentions and the context states
  are cut from the autograd graph, so the HAN trains its own parameters and
  its gradient reaches the sentence-level model only through the gate's
  ``h_t`` (Eq. 5-6). The caller may then compute the context states without
  gradients (cheaper); ``detach_inputs=False`` lets the gradient through
  every path.
* Incremental decoding (decoder side): the word level's keys and values are
  projected once, at the first step, and kept in the incremental state
  (fairseq's static key/value cache); :meth:`HANWordAttention.reorder_incremental_state`
  follows the beam (row ``b`` of the batch owns rows ``b*k .. b*k+k-1`` of
  the cache). The sentence level and the gate depend only on the current
  position, so one step computes exactly what the full pass computes at
  that position.
* Neither attention takes part in fairseq's "beamable" encoder-decoder
  attention (``set_beam_size`` is a no-op): their rows are (sentence,
  context sentence) pairs and (word, sentence) pairs, not beam groups.

:func:`split_context` turns the ``document_translation`` task's concatenated
context (``src_ctx_tokens`` / ``tgt_ctx_tokens``: sentences one after the
other, each ended by the separator, padded on either side) into one row per
context sentence, independent of the padding. It reads sizes back to the
host (``.item()``, boolean masks): the task's collater builds the same rows
on the CPU for ``transformer_han`` (``DocumentContextDataset.
collate_context_sentences``, tested equal), so the model's forward pass uses
this function only for batches that lack them (hand-made ones).
"""

from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules import LayerNorm, MultiheadAttention
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor

__all__ = [
    "HierarchicalContextAttention",
    "HANWordAttention",
    "HANSentenceAttention",
    "split_context",
    "decoder_inputs",
]


class HANSentenceAttention(MultiheadAttention):
    """fairseq's attention with the "beamable" key reduction turned off: its
    batch rows are (word, sentence) pairs, not beam groups."""

    def set_beam_size(self, beam_size):
        return None


class HANWordAttention(HANSentenceAttention):
    """Word-level attention of the HAN: batch row ``b*k + j`` is context
    sentence ``j`` of sentence ``b``. In incremental decoding the projected
    keys and values are kept (``static_kv``); reordering for the beam moves
    the ``k`` rows of each sentence together."""

    def __init__(self, embed_dim: int, heads: int, context_sentences: int,
                 dropout: float = 0.0):
        super().__init__(embed_dim, heads, dropout=dropout, encoder_decoder_attention=True)
        self.context_sentences = int(context_sentences)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        buffer = self._get_input_buffer(incremental_state)
        if not buffer:
            return incremental_state
        k = self.context_sentences
        order = (new_order.unsqueeze(1) * k
                 + torch.arange(k, device=new_order.device).unsqueeze(0)).reshape(-1)
        for name, value in list(buffer.items()):
            if value is not None:
                buffer[name] = value.index_select(0, order)
        return self._set_input_buffer(incremental_state, buffer)

    def has_cache(self, incremental_state) -> bool:
        """Whether the keys and values of this batch were projected already."""
        if incremental_state is None:
            return False
        return "prev_key" in self._get_input_buffer(incremental_state)


class HierarchicalContextAttention(nn.Module):
    """Eq. 1-6 of Miculicich et al. (2018); see the module docstring.

    Args:
        embed_dim: model dimension ``C``.
        heads: attention heads of both levels.
        ffn_dim: inner dimension of the FFN of Eq. 4.
        context_sentences: ``k``, the context slots per sentence.
        dropout / attention_dropout / activation_dropout / activation_fn:
            as in fairseq's Transformer layers.
        detach_inputs: cut queries and context states from the autograd
            graph (see the module docstring).
    """

    def __init__(self, embed_dim: int, heads: int, ffn_dim: int, context_sentences: int,
                 dropout: float = 0.1, attention_dropout: float = 0.0,
                 activation_dropout: float = 0.0, activation_fn: str = "relu",
                 detach_inputs: bool = True):
        super().__init__()
        if context_sentences < 1:
            raise ValueError(f"HAN: context_sentences must be >= 1, got {context_sentences}")
        self.embed_dim, self.k = int(embed_dim), int(context_sentences)
        self.detach_inputs = bool(detach_inputs)
        self.word_attn = HANWordAttention(embed_dim, heads, self.k, dropout=attention_dropout)
        self.word_norm = LayerNorm(embed_dim)
        self.sent_attn = HANSentenceAttention(embed_dim, heads, dropout=attention_dropout,
                                              encoder_decoder_attention=True)
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.ffn_norm = LayerNorm(embed_dim)
        self.activation_fn = utils.get_activation_fn(activation_fn)
        self.gate = nn.Linear(2 * embed_dim, embed_dim)
        self.out_norm = LayerNorm(embed_dim)
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        self.activation_dropout_module = FairseqDropout(activation_dropout,
                                                        module_name=type(self).__name__)
        for lin in (self.fc1, self.fc2, self.gate):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)
        #: keep the last forward's gate and attention weights (analyses; off in training)
        self.record = False
        self.last: Optional[Dict[str, Tensor]] = None

    def forward(self, h: Tensor, context: Optional[Tensor], context_padding_mask: Optional[Tensor],
                present: Tensor, incremental_state=None) -> Tuple[Tensor, Dict[str, Tensor]]:
        """Eq. 1-6 for every query position.

        Args:
            h: ``T x B x C``, the query states (final states of the current
                sentence).
            context: ``L x (B*k) x C``, the word states of the context
                sentences, sentence ``j`` of row ``b`` in column ``b*k + j``
                (slot ``k-1`` the nearest sentence); None in incremental
                decoding once the keys are cached.
            context_padding_mask: ``(B*k) x L``, True where a position is not
                a key word (padding, ``</s>``, ...); None with ``context``.
            present: ``B x k`` bool, True where the slot holds a sentence
                with at least one key word.
            incremental_state: fairseq's incremental state (decoder side).

        Returns ``(h~, info)``: ``h~`` (``T x B x C``, Eq. 6 followed by
        LayerNorm) and ``info`` with ``gate`` (``lambda``, ``T x B x C``)
        and ``has_context`` (``B``).
        """
        T, B, C = h.shape
        k = self.k
        if present.shape != (B, k):
            raise ValueError(f"HAN: present must be B x k = {B} x {k}, got {tuple(present.shape)}")
        present = present.to(torch.bool)
        has_context = present.any(1)
        q = h.detach() if self.detach_inputs else h

        # Eq. 1-2: word level, each query word against each context sentence
        qw = q.unsqueeze(2).expand(T, B, k, C).reshape(T, B * k, C)
        cached = self.word_attn.has_cache(incremental_state)
        if cached:
            key = mask = None
        else:
            if context is None or context_padding_mask is None:
                raise ValueError("HAN: the context states are needed (nothing cached)")
            if context.size(1) != B * k or context_padding_mask.shape != (B * k, context.size(0)):
                raise ValueError(f"HAN: context must be L x (B*k) x C with a (B*k) x L mask; got "
                                 f"{tuple(context.shape)} and {tuple(context_padding_mask.shape)}"
                                 f" for B={B}, k={k}")
            key = context.detach() if self.detach_inputs else context
            # an absent slot lets its first position through (result dropped below)
            absent = ~present.reshape(B * k)
            mask = context_padding_mask.to(torch.bool).clone()
            mask[:, 0] &= ~absent
        s, w_word = self.word_attn(
            query=qw, key=key, value=key, key_padding_mask=mask,
            incremental_state=incremental_state, static_kv=incremental_state is not None,
            need_weights=self.record, need_head_weights=False)
        s = self.word_norm(self.dropout_module(s))
        s = s.view(T, B, k, C) * present.view(1, B, k, 1).to(s.dtype)

        # Eq. 3-4: sentence level over the k summaries of the same word
        keys = s.permute(2, 0, 1, 3).reshape(k, T * B, C)
        s_mask = ~present
        s_mask[:, 0] &= has_context  # no context: one slot through, d_t set to 0 below
        s_mask = s_mask.unsqueeze(0).expand(T, B, k).reshape(T * B, k)
        u, w_sent = self.sent_attn(query=q.reshape(1, T * B, C), key=keys, value=keys,
                                   key_padding_mask=s_mask, need_weights=self.record)
        u = self.dropout_module(u).view(T, B, C)
        f = self.fc2(self.activation_dropout_module(self.activation_fn(self.fc1(u))))
        d = self.ffn_norm(u + self.dropout_module(f))
        d = d * has_context.view(1, B, 1).to(d.dtype)  # no context sentence: d_t = 0

        # Eq. 5-6: context gate
        lam = torch.sigmoid(self.gate(torch.cat([h, d], dim=-1)))
        out = self.out_norm(lam * h + (1 - lam) * d)
        info = {"gate": lam, "has_context": has_context}
        if self.record:
            self.last = {"gate": lam.detach(), "has_context": has_context,
                         "word_attn": None if w_word is None else w_word.detach().view(B, k, T, -1),
                         "sent_attn": None if w_sent is None else w_sent.detach().view(T, B, k)}
        return out, info


# --------------------------------------------------------------------------- inputs


def split_context(tokens: Tensor, pad: int, ends: Sequence[int], eos: int, k: int,
                  non_words: Sequence[int] = ()) -> Tuple[Tensor, Tensor]:
    """One row per context sentence, the ``k`` nearest kept.

    ``tokens`` (``B x Tc``): each row the context sentences of one sentence
    in document order, each ended by one of ``ends`` (the separator, ``</s>``),
    padded with ``pad`` on either side (a row of padding only: no context).

    Returns ``(sentences, present)``. ``sentences`` is ``(B*k) x L``: slot
    ``j`` of row ``b`` in row ``b*k + j``, slot ``k-1`` the nearest (last)
    sentence; each sentence right-padded and ended by ``eos`` (the separator
    replaced); a padding row where the slot is empty. ``present`` (``B x k``
    bool) is True where the slot holds a sentence. A sentence without words
    (only ``ends`` and ``non_words`` symbols, e.g. an empty hypothesis) leaves
    its slot absent; the other sentences keep the slots of their distance, so
    source and target slot ``j`` are always the same previous sentence. ``L >= 1``. The same sentences give the same rows
    whatever the padding side and width.
    """
    if tokens.dim() != 2:
        raise ValueError(f"split_context: expected B x T tokens, got {tuple(tokens.shape)}")
    B, _ = tokens.shape
    dev = tokens.device
    real = tokens.ne(pad)
    end_ids = torch.tensor(sorted(set(int(e) for e in ends)), device=dev)
    is_end = real & torch.isin(tokens, end_ids)
    non_word = torch.isin(tokens, torch.cat([end_ids, torch.tensor(
        [int(x) for x in non_words] + [pad], dtype=torch.long, device=dev)]))
    is_word = real & ~non_word
    # sentence number of every real token within its row (the end belongs to its sentence)
    sid = torch.cumsum(is_end.long(), 1) - is_end.long()
    prev_end = F.pad(is_end[:, :-1], (1, 0), value=False)
    prev_real = F.pad(real[:, :-1], (1, 0), value=False)
    is_start = real & (prev_end | ~prev_real)
    n_sent = torch.where(real, sid, torch.full_like(sid, -1)).max(1).values + 1  # B
    # words per sentence: drop sentences without words
    width = int(n_sent.max().item()) if B else 0
    width = max(width, 1)
    flat = torch.arange(B, device=dev).unsqueeze(1) * width + sid.clamp(max=width - 1)
    words_per = torch.zeros(B * width, dtype=torch.long, device=dev).scatter_add_(
        0, flat[real], is_word[real].long())
    has_words = words_per.view(B, width)
    keep = real & has_words.gather(1, sid.clamp(max=width - 1)).gt(0)
    # the slot is the sentence's distance (0 = nearest), not renumbered after
    # dropping wordless ones, so that source and target slot j stay the same
    # previous sentence
    rel = n_sent.unsqueeze(1) - 1 - sid
    keep = keep & (rel < k)
    slot = (k - 1 - rel).clamp(min=0)
    pos_real = torch.cumsum(real.long(), 1) - 1
    start = torch.cummax(torch.where(is_start, pos_real, torch.full_like(pos_real, -1)), 1).values
    pos = pos_real - start
    L = int(pos[keep].max().item()) + 1 if bool(keep.any()) else 1
    out = torch.full((B * k * L,), pad, dtype=tokens.dtype, device=dev)
    rows = torch.arange(B, device=dev).unsqueeze(1) * k + slot
    index = (rows * L + pos)[keep]
    values = torch.where(is_end, torch.full_like(tokens, eos), tokens)[keep]
    out[index] = values
    present = torch.zeros(B * k, dtype=torch.bool, device=dev)
    present[rows[keep]] = True
    return out.view(B * k, L), present.view(B, k)


def decoder_inputs(sentences: Tensor, pad: int, eos: int) -> Tensor:
    """Teacher-forcing inputs of right-padded target sentences ``y_1 .. y_n
    </s>``: ``</s> y_1 .. y_n`` (fairseq's ``prev_output_tokens``), right-padded;
    a padding row stays padding."""
    n = sentences.ne(pad).sum(1, keepdim=True)
    shifted = F.pad(sentences[:, :-1], (1, 0), value=eos)
    cols = torch.arange(sentences.size(1), device=sentences.device).unsqueeze(0)
    return shifted.masked_fill(cols >= n, pad)
