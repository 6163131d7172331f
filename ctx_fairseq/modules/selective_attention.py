r"""Selective (hierarchical sparsemax) attention over the whole document and the
Document-level Context Layer of Maruf, Martins & Haffari (2019), "Selective
Attention for Context-aware Neural Machine Translation", Sec. 3.1-3.3.

Equations -> code (per head ``h``; ``d_k = C / H``; queries are scaled by
``1/sqrt(d_k)`` before the dot products, which is Eq. 3/4/6's division):

* Eq. 3, ``alpha_s = sparsemax(Q_s K_s^T / sqrt(d_k))``: ``q_s_proj`` (queries,
  one per query *token*), ``k_s_proj`` applied to the sentence vectors (mean over
  the real words of ``mem_keys``; Sec. 3.3), :func:`masked_normalize` with
  sparsemax (:class:`_Sparsemax`) over the sentences visible to the query sentence
  (``sentence_attn="softmax"`` is the ablation).
* Eq. 4, ``alpha_w^j = sparsemax|softmax(Q_w K_w^{jT} / sqrt(d_k))``: ``q_w_proj``,
  ``k_w_proj`` applied to the word vectors ``mem_keys``; normalised over the
  real words of sentence ``j`` only (``word_attn``: "softmax" = sparse-soft,
  "sparsemax" = sparse-sparse).
* Eq. 5, ``alpha_hier^j = alpha_s(j) alpha_w^j``; value reading
  ``alpha_hier V_w`` with ``v_proj`` applied to ``mem_values``; heads are
  concatenated and projected by ``out_proj`` (``W^O``, H-MULTIHEAD).
* Eq. 6 (flat attention, softmax): ``attention="flat-sentence"`` uses
  ``q_s_proj``/``k_s_proj`` and values ``V(mean of the real words of
  mem_values)``; ``attention="flat-word"`` uses ``q_w_proj``/``k_w_proj``/``v_proj``
  over all real words of all visible sentences (one softmax per query token).
  Only the projections a mode uses are created (hierarchical: all five;
  flat-sentence: Q_s, K_s, V; flat-word: Q_w, K_w, V), so no parameter is
  left without a gradient.
* Eq. 7-8 (:class:`ContextGating`): ``gamma = sigmoid(W_r r + W_d d)``,
  ``r~ = gamma * r + (1 - gamma) * d``.
* Sec. 3.1 and footnote 2 (:class:`DocumentContextLayer`):
  ``d = LN(FFN(LN(dropout(ContextAttention(q)))))`` -- each sub-layer followed
  by a LayerNorm, *no* residual connections.

Choices where the paper is silent:

* **Visibility.** Memory sentence ``s`` is visible to query sentence ``b`` iff
  same document, ``s`` has at least one real word, and ``mem_pos[s] <
  query_pos[b]`` (online) or ``mem_pos[s] != query_pos[b]`` (offline). The
  current sentence is never visible, later ones never online. With a
  per-query window ``query_window`` (``(B,)`` long, from the collater: a
  scorer's ``--context-size N`` or ``--sample-context-size K``'s draw; not in
  the paper, which reads the whole document) only the sentences at most
  ``query_window[b]`` positions away stay visible: ``0 < query_pos[b] -
  mem_pos[s] <= w`` online, ``0 < |query_pos[b] - mem_pos[s]| <= w``
  offline; ``w = 0`` is the empty context. Masking is exact:
  :func:`masked_normalize` fills disallowed scores with the dtype's lowest
  finite value ``torch.finfo(dtype).min`` (no ``-inf``/``1e9`` that would
  overflow in half precision; sparsemax and softmax both give exactly 0
  there, with zero gradient, as long as the row has one allowed entry: tested
  against the unmasked sub-vector); a row with no allowed entry is filled
  with zeros, normalised, and its output replaced by 0, so the gradient of
  such a row is exactly 0 (finite).
* **No context.** A query sentence with no visible sentence (first sentence
  online, one-sentence documents, a document absent from the memory) gets an
  attention output of exactly 0 (the ``W^O`` bias is not added), and
  :class:`DocumentContextLayer` bypasses it: ``d = 0`` and ``r~ = r`` exactly
  (``torch.where``), i.e. it is translated as by the sentence-level model. When
  no query of a batch has context, every parameter still gets an (all-zero)
  gradient, so DDP without ``find_unused_parameters`` does not fail.
* **Gate biases.** ``W_r`` and ``W_d`` have no bias: Eq. 7 writes none (unlike
  the gate of Voita et al. 2018, which writes ``b_g``) and we follow it
  literally; the one case where a constant preference for ``r`` would matter
  (no context) is handled exactly by the bypass rule instead.
* **Projection biases / init.** The five input projections and ``W^O`` have
  biases and fairseq ``MultiheadAttention``'s init (xavier_uniform with gain
  ``1/sqrt(2)`` for the input projections, plain xavier_uniform and zero bias
  for ``W^O``). Sentence vectors are the mean of the real words *before*
  projection; since the projections are affine, ``V(mean(words)) =
  mean(V(words))``.
* **Dropout.** ``attention_dropout`` on the final attention weights
  (``alpha_hier`` / the flat weights), ``dropout`` on the attention output and
  the FFN output, ``activation_dropout`` inside the FFN (fairseq's placement).
* **Padding.** Padded / non-real positions of ``mem_keys``/``mem_values`` are
  zeroed before projection and masked out of every normalisation, and each
  query token is independent of the others, so a query sentence's output does
  not depend on the padding of other query or memory sentences.

Beyond the paper (off by default, paper-faithful): **sentence-distance bias**
(``sentence_distance=N``, the model's ``--doc-sentence-distance N``; 0 = off,
no parameter is created). A learned per-head bias ``beta_h`` (``distance_bias``,
``(2N+1) x H``, initialised to zero) indexed by the signed sentence distance
``clip(query_pos - mem_pos, -N, N)`` is added to the sentence-level scores::

    score_h(b, s) = q_s . k_s / sqrt(d_k) + beta_h[clip(query_pos[b] - mem_pos[s], -N, N)]

before the Eq. 3 normaliser (hierarchical), before the Eq. 6 softmax
(flat-sentence), and for flat-word to the score of every word of sentence
``s``. Why: recency. The sentence keys (mean of the word vectors) carry no
information about where a sentence is, so content-only sentence attention
cannot prefer the most recent of several candidate sentences (e.g. a
pronoun's antecedent is the most recent matching noun, earlier ones being
distractors); the paper has no sentence-position information. Online only
positive distances occur (visible sentences precede the query); distance 0
is the sentence itself and is never visible, so its entry is never used.
Visibility is unchanged (the bias is added before the masking). The
bias is computed as a ``B x H x 1 x S_max`` tensor
(broadcast over query tokens), smaller than the sentence score tensor, and
the selective and dense paths share it (``_sentence_weights``), so they still
agree in value and gradient. A zero bias gives exactly the model without it.

Memory layout and cost (static shapes; the one host read: the number of
selected sentences on the accelerator's path, below).
:meth:`HierarchicalContextAttention.project_memory` projects the memory once
per batch, each sentence once (``S`` rows, never copied per query sentence),
and keeps a padded document index ``D x S_max`` (``doc_rows``: the memory
rows of each document in position order; ``doc_valid``). The task's collater
emits that index (``mem_doc_rows``/``mem_doc_valid``, numpy on the CPU);
without it :func:`memory_layout` computes it from ``mem_doc``/``mem_pos``
with one host read per batch (the module's standalone use, the tests).
:meth:`forward` maps each query sentence to its document's row of the index
(``searchsorted``; a document absent from the memory has no valid entry),
computes the visibility on the device (``B x S_max``, elementwise), pads the
index to whole blocks of ``word_block`` sentences, and arranges the queries
in groups (:class:`QueryLayout`): per document when the collater's
``query_doc_groups`` are given (training, scoring, the encoder in
generation), else per query sentence (incremental decoding, whose rows
follow the beam). Eq. 3 is one matrix product of each group's queries with
its sentence keys and one masked sparsemax over ``G x H x M x S_max``
(float32 at least). Sparsemax is this module's own (:class:`_Sparsemax`, the
same values as ``entmax.sparsemax`` with a backward of static shape).

Word level (Eq. 4-5; Eq. 6 flat-word). On an accelerator (where
:func:`ctx_fairseq.modules.cpu_shortcuts.cpu_shortcuts` is off), in the
per-document layout, the hierarchical word level runs over the selected
sentences only (:func:`ctx_fairseq.modules.selected_word_attention.selected_word_attention`:
one host read per pass, which sizes their list); otherwise it is streamed
over blocks of memory sentences by
:func:`ctx_fairseq.modules.word_attention.streamed_word_attention`
(each module's docstring has the equations and gradients). No tensor pairs
every query token with every word of its document; memory is linear in the
document. Sentences outside the Eq. 3 support have weight 0 and a zero
sparsemax Jacobian, so weighting every sentence equals restricting to the
support: exact, and ``selective`` (``--dense-doc-attention`` off) and the
dense setting are one computation. With the collater's
``mem_doc_rows_by_len`` and host spans, a block reads only the token columns
its sentences occupy. A sentence's result does not depend on which other
documents share its batch (tested bitwise in float32 on the CPU). FLOPs and
memory as formulas: docs/transformer_selective_doc.md.

Decoder integration / incremental decoding: queries are independent per
position and the module keeps no state across steps, so a decoder computes
``project_memory(...)`` once per batch of documents and calls :meth:`forward`
with the current step's query (``1 x B x C``) every step. Beam search reorders
only ``query_doc``/``query_pos`` (``index_select(0, new_order)``,
:meth:`HierarchicalContextAttention.reorder_queries`); the memory is per
document and is never reordered.
"""

import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from fairseq import utils
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout

from ctx_fairseq.modules.context_statistics import mean_gate_sum, real_tokens
from ctx_fairseq.modules.cpu_shortcuts import cpu_shortcuts
from ctx_fairseq.modules.selected_word_attention import selected_word_attention
from ctx_fairseq.modules.selective_memory import (
    ProjectedMemory, QueryLayout, memory_layout)
from ctx_fairseq.modules.sparsemax import (
    NORMALIZERS, masked_normalize)
from ctx_fairseq.modules.word_attention import (
    streamed_word_attention,
    word_block_for,
)

__all__ = [
    "masked_normalize",
    "memory_layout",
    "ProjectedMemory",
    "HierarchicalContextAttention",
    "ContextGating",
    "DocumentContextLayer",
]

ATTENTION_TYPES = ("hierarchical", "flat-sentence", "flat-word")
#: the keyword arguments of :meth:`HierarchicalContextAttention.forward` that
#: describe the queries' layout (the collater's index tensors)
QUERY_LAYOUT = ("query_groups", "query_tokens", "group_rows", "query_window")
#: the keyword arguments of :class:`HierarchicalContextAttention` for its word
#: level (block and tile sizes) and the kept ones of old configurations
WORD_LEVEL_OPTIONS = ("selective", "word_capacity", "word_block", "tile_elems")
#: the removed opt-in capacity of the word level (``--doc-word-capacity``): 0 is the
#: only value (the streamed word level is exact and faster than the capacity was)
WORD_CAPACITY = 0


class HierarchicalContextAttention(nn.Module):
    r"""Multi-head context attention over a document memory (Eq. 3-6).

    Args:
        embed_dim: ``C`` (query dim and output dim), ``C = H * d_k``.
        num_heads: ``H``.
        attention: "hierarchical" (Eq. 3-5), "flat-sentence" or "flat-word" (Eq. 6).
        sentence_attn: Eq. 3 normaliser, "sparsemax" (paper) or "softmax" (ablation).
        word_attn: Eq. 4 normaliser, "softmax" (sparse-soft) or "sparsemax"
            (sparse-sparse).
        (From ``attention_dropout`` on, by keyword only; the last four are the
        word level's options, :data:`WORD_LEVEL_OPTIONS`.)
        selective: kept for old configurations (``--dense-doc-attention``):
            the streamed word level weights every sentence by its Eq. 3
            weight, 0 outside the support, so both settings are one
            computation.
        attention_dropout: dropout on the final attention weights.
        kdim / vdim: feature dims of ``mem_keys`` / ``mem_values`` (default ``C``).
        sentence_distance: ``N`` > 0: learned per-head bias on the sentence
            scores by the signed sentence distance clipped to ``[-N, N]``
            (beyond the paper, see the module docstring); 0 (default): off.
        word_capacity: 0, the only value (the opt-in capacity was removed).
        word_block: memory sentences per block of the streamed word level
            (:mod:`ctx_fairseq.modules.word_attention`; fixed, never derived
            from the batch); None: the device's default
            (:data:`ctx_fairseq.modules.word_attention.WORD_BLOCK`).
        tile_elems: about how many score elements one tile of the word level
            holds (forward and backward); None: the device's default
            (:data:`ctx_fairseq.modules.word_attention.TILE_ELEMS`).

    Shapes: ``query`` ``T x B x C``; ``query_doc``/``query_pos`` ``(B,)`` long;
    ``mem_keys`` ``S x L x kdim``, ``mem_values`` ``S x L x vdim``,
    ``mem_word_mask`` ``S x L`` (True = real word), ``mem_doc``/``mem_pos``
    ``(S,)`` long.
    """

    def __init__(self, embed_dim: int, num_heads: int, attention: str = "hierarchical",
                 sentence_attn: str = "sparsemax", word_attn: str = "softmax", *,
                 attention_dropout: float = 0.0, kdim: Optional[int] = None,
                 vdim: Optional[int] = None, sentence_distance: int = 0, **word_level):
        super().__init__()
        unknown = set(word_level) - set(WORD_LEVEL_OPTIONS)
        if unknown:
            raise TypeError(
                f"HierarchicalContextAttention: unexpected arguments {sorted(unknown)}; it takes "
                "attention, sentence_attn, word_attn, attention_dropout, kdim, vdim, "
                f"sentence_distance and the word level's {', '.join(WORD_LEVEL_OPTIONS)}")
        selective = bool(word_level.get("selective", True))
        word_capacity = word_level.get("word_capacity", WORD_CAPACITY)
        word_block, tile_elems = word_level.get("word_block"), word_level.get("tile_elems")
        if attention not in ATTENTION_TYPES:
            raise ValueError(f"attention: expected one of {ATTENTION_TYPES}, got {attention!r}")
        if sentence_attn not in NORMALIZERS or word_attn not in NORMALIZERS:
            raise ValueError(f"sentence_attn/word_attn: expected one of {NORMALIZERS}, "
                             f"got {sentence_attn!r}/{word_attn!r}")
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if int(word_capacity) != 0:
            raise ValueError(
                f"word_capacity {word_capacity}: the word level's capacity (--doc-word-capacity) "
                "was removed; the streamed word level is exact and faster (0 is the only value)")
        if (word_block is not None and int(word_block) < 1) or (
                tile_elems is not None and int(tile_elems) < 1):
            raise ValueError(f"word_block and tile_elems must be >= 1, got {word_block}, "
                             f"{tile_elems}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.attention = attention
        self.sentence_attn = sentence_attn
        self.word_attn = word_attn
        self.selective = selective
        self.word_capacity = 0
        self.word_block = int(word_block) if word_block else None  # None: the device's
        self.tile_elems = int(tile_elems) if tile_elems else None  # None: the device's default
        self.uses_sentences = attention in ("hierarchical", "flat-sentence")
        self.uses_words = attention in ("hierarchical", "flat-word")
        self.sentence_distance = int(sentence_distance)
        if self.sentence_distance < 0:
            raise ValueError(f"sentence_distance must be >= 0, got {sentence_distance}")

        if self.uses_sentences:
            self.q_s_proj = nn.Linear(embed_dim, embed_dim)  # W^{Q_s}
            self.k_s_proj = nn.Linear(self.kdim, embed_dim)  # W^{K_s}
        if self.uses_words:
            self.q_w_proj = nn.Linear(embed_dim, embed_dim)  # W^{Q_w}
            self.k_w_proj = nn.Linear(self.kdim, embed_dim)  # W^{K_w}
        self.v_proj = nn.Linear(self.vdim, embed_dim)  # W^{V_w}
        self.out_proj = nn.Linear(embed_dim, embed_dim)  # W^O
        if self.sentence_distance > 0:  # beyond the paper: beta_h[clip(distance)]
            self.distance_bias = nn.Parameter(
                torch.zeros(2 * self.sentence_distance + 1, num_heads))
        self.dropout_module = FairseqDropout(attention_dropout, module_name=self.__class__.__name__)
        self.reset_parameters()

    def block_for(self, device: torch.device) -> int:
        """Memory sentences per block of the word level on ``device``."""
        return word_block_for(device, self.word_block)

    def reset_parameters(self):
        gain = 1 / math.sqrt(2)
        for name in ("q_s_proj", "k_s_proj", "q_w_proj", "k_w_proj", "v_proj"):
            if hasattr(self, name):
                nn.init.xavier_uniform_(getattr(self, name).weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.constant_(self.out_proj.bias, 0.0)
        if self.sentence_distance > 0:
            nn.init.zeros_(self.distance_bias)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"attention={self.attention}, sentence_attn={self.sentence_attn}, "
                f"word_attn={self.word_attn}, selective={self.selective}, "
                f"sentence_distance={self.sentence_distance}, word_block={self.word_block}")

    # ------------------------------------------------------------------ memory
    def project_memory(self, mem_keys: Tensor, mem_values: Tensor, mem_word_mask: Tensor,
                       mem_doc: Tensor, mem_pos: Tensor, doc_rows: Optional[Tensor] = None,
                       doc_valid: Optional[Tensor] = None,
                       by_length: Optional[Tuple[Tensor, Tensor, object]] = None
                       ) -> ProjectedMemory:
        """Projects the document memory once (reused by every query / decoding step).

        ``by_length`` (optional, with ``doc_rows``; the collater's
        ``mem_doc_rows_by_len``, ``mem_doc_len_order`` and host numpy
        ``mem_doc_span_by_len``, in the columns of ``mem_keys``): each
        document's sentences longest first; the per-document word level then
        reads only the token columns each block of them occupies.

        ``mem_keys``: ``S x L x kdim`` (key source: words for K_w, their mean
        over real words for K_s); ``mem_values``: ``S x L x vdim``;
        ``mem_word_mask``: ``S x L`` bool, True = real word (no BOS/EOS/pad);
        ``mem_doc``/``mem_pos``: ``(S,)``. Sentences of one document must be
        contiguous and in increasing ``mem_pos`` order.

        ``doc_rows``/``doc_valid`` (``D x S_max``, the collater's
        ``mem_doc_rows``/``mem_doc_valid``; documents numbered ``0..D-1`` as in
        ``mem_doc``/``query_doc``): the padded document index. Without them
        it is computed here by :func:`memory_layout` (one host read)."""
        if mem_keys.dim() != 3 or mem_values.shape[:2] != mem_keys.shape[:2]:
            raise ValueError("mem_keys/mem_values: expected S x L x C tensors of equal S, L")
        S, L = mem_keys.shape[:2]
        if mem_word_mask.shape != (S, L) or mem_doc.shape != (S,) or mem_pos.shape != (S,):
            raise ValueError("mem_word_mask: S x L; mem_doc, mem_pos: (S,)")
        if doc_rows is None:
            doc_ids, doc_rows, doc_valid = memory_layout(mem_doc, mem_pos)
        else:
            if doc_valid is None or doc_valid.shape != doc_rows.shape:
                raise ValueError("doc_rows/doc_valid: D x S_max tensors")
            doc_ids = torch.arange(doc_rows.size(0), device=doc_rows.device)
        H, hd = self.num_heads, self.head_dim
        wmask = mem_word_mask.to(torch.bool)
        m3 = wmask.unsqueeze(-1)
        keys = mem_keys.masked_fill(~m3, 0.0)
        same = mem_values is mem_keys or (
            mem_values.data_ptr() == mem_keys.data_ptr() and mem_values.dtype == mem_keys.dtype
            and mem_values.shape == mem_keys.shape and mem_values.stride() == mem_keys.stride())
        values = keys if same else mem_values.masked_fill(~m3, 0.0)
        n_words = wmask.sum(1, keepdim=True).clamp(min=1).to(keys.dtype)
        mem = ProjectedMemory(S, L, doc_ids, doc_rows, doc_valid.to(torch.bool), mem_pos,
                              wmask.any(1), wmask)
        if by_length is not None:
            rows_l, order_l, span_l = by_length
            if rows_l.shape != doc_rows.shape or order_l.shape != doc_rows.shape \
                    or tuple(span_l.shape) != tuple(doc_rows.shape) + (2,):
                raise ValueError("by_length: D x S_max rows and order, D x S_max x 2 spans")
            mem.by_length = by_length
        if self.uses_sentences:
            k_sent = keys.sum(1) / n_words  # mean over the real words (Sec. 3.3)
            mem.k_s = self.k_s_proj(k_sent).view(S, H, hd)
            if self.attention == "flat-sentence":
                v_sent = values.sum(1) / n_words
                mem.v_s = self.v_proj(v_sent).view(S, H, hd)
        if self.uses_words:
            mem.k_w = self.k_w_proj(keys).view(S, L, H, hd).transpose(1, 2).contiguous()
            mem.v_w = self.v_proj(values).view(S, L, H, hd).transpose(1, 2).contiguous()
        return mem

    @staticmethod
    def reorder_queries(query_doc: Tensor, query_pos: Tensor,
                        new_order: Tensor) -> Tuple[Tensor, Tensor]:
        """Beam search: only the query metadata follows the beam; the memory is
        per document and stays as it is."""
        return query_doc.index_select(0, new_order), query_pos.index_select(0, new_order)

    def query_layout(self, memory: ProjectedMemory, query_doc: Tensor, query_pos: Tensor,
                     online: bool, query_window: Optional[Tensor] = None
                     ) -> Tuple[Tensor, Tensor, Tensor]:
        """Each query sentence's memory sentences (static shapes, no host read):
        ``rows`` (``B x S_max``, memory rows of its document in position order),
        ``valid`` (real entries) and ``vis`` (visible: valid, at least one real
        word, and before the query (online) / not the query (offline), and
        with ``query_window`` at most that many positions away)."""
        D = memory.doc_ids.numel()
        slot = torch.searchsorted(memory.doc_ids, query_doc).clamp(max=max(D - 1, 0))
        found = memory.doc_ids[slot] == query_doc  # a document absent from the memory
        rows = memory.doc_rows[slot]
        valid = memory.doc_valid[slot] & found.unsqueeze(1)
        mp = memory.pos[rows]
        qp = query_pos.unsqueeze(1)
        rel = mp < qp if online else mp != qp
        if query_window is not None:
            rel = rel & ((qp - mp).abs() <= query_window.unsqueeze(1))
        return rows, valid, valid & rel & memory.has_word[rows]

    # ----------------------------------------------------------------- forward
    def forward(self, query: Tensor, memory: ProjectedMemory, query_doc: Tensor,
                query_pos: Tensor, online: bool, query_padding_mask: Optional[Tensor] = None,
                need_weights: bool = False, need_word_weights: bool = False,
                return_stats: bool = False, **layout) -> Tuple[Tensor, Dict[str, Tensor]]:
        """Context attention for ``query`` (``T x B x C``) over ``memory``.

        ``query_window`` (``(B,)`` long, optional): each query's largest
        visible distance in sentences (see the module docstring).

        ``query_tokens`` (``D x M_max``, with ``query_groups``; the collater's
        ``query_doc_tokens``): the flat positions ``b T + t`` of each
        document's real query tokens, padded with ``B T``: the word level then
        runs on those rows only (a padding row's output is 0). ``group_rows``
        (host numpy ``D``; ``query_doc_token_counts``, or ``query_doc_sizes``
        times ``T``): each document's real rows, so that no tile computes
        padding rows.

        ``query_groups`` (``D x Bq_max`` long, the collater's
        ``query_doc_groups``; :meth:`group_queries` without one): the batch
        rows of the query sentences of each document of the memory's index,
        padded with ``B``; the word level then runs per document (one matrix
        product per document and block of memory sentences). Without it
        (incremental decoding, whose queries follow the beam) it runs per query
        sentence. Both are exact; which one runs depends on the call, never on
        the batch's other documents.

        Returns ``(out, info)``: ``out`` is ``T x B x C`` (exactly 0 for query
        sentences with no visible context sentence); ``info`` always holds
        ``has_context`` (``(B,)`` bool) and, on request:

        * ``need_weights``: ``sent_weights`` ``B x H x T x S_max`` and
          ``sent_index`` ``B x S_max`` (long): column ``j`` of row ``b`` is memory
          row ``sent_index[b, j]`` (the ``j``-th memory sentence of ``b``'s
          document, in position order; -1 and weight 0 past its end).
          ``S_max`` is the width of the memory's document index (the largest
          document memory of the batch).
          Weights are ``alpha_s`` (hierarchical), the flat sentence weights, or
          for flat-word the word weights summed per sentence.
        * ``need_word_weights`` (hierarchical / flat-word): ``word_weights``
          ``B x H x T x S_max x L``: weight of word column ``l`` of memory
          sentence ``sent_index[b, j]`` (``alpha_hier`` before dropout).
        * ``return_stats``: ``sentence_support`` (mean number of nonzero
          ``alpha_s`` per (query token, head), over real query tokens with
          context), ``word_support`` (mean number of nonzero word weights per
          selected (token, head, sentence), same tokens; for flat-word the
          number of nonzero word weights per (token, head, visible sentence);
          absent for flat-sentence), ``visible_sentences`` (mean per such
          token), and the counts ``num_token_heads``, ``num_support_pairs``;
          the sums behind the three means are ``sentence_support_sum``,
          ``visible_sentences_sum`` and ``word_support_sum`` (so that means can
          be pooled exactly across batches: sum / count); hierarchical:
          ``word_overflow_sum``, 0 (kept for the logs of the removed
          capacity: the word level is exact).
          ``query_padding_mask`` (``B x T``, True = pad) only serves these
          statistics.
        """
        unknown = set(layout) - set(QUERY_LAYOUT)
        if unknown:
            raise TypeError(f"context attention: unexpected arguments {sorted(unknown)}; besides "
                            "query_padding_mask, need_weights, need_word_weights and "
                            f"return_stats it takes the query layout's {', '.join(QUERY_LAYOUT)}")
        T, B, C = query.shape
        if query_doc.shape != (B,) or query_pos.shape != (B,):
            raise ValueError("query_doc/query_pos: expected (B,) tensors")
        want_word_w = need_word_weights and self.uses_words
        info: Dict[str, Tensor] = {}
        if memory.num_sentences == 0 or memory.max_sentences == 0:  # nothing to attend to
            out, has_context, a_s, rows, valid, a_w, st = self._no_memory(
                query, memory, want_word_w, return_stats)
        else:
            out, has_context, a_s, rows, valid, a_w, st = self._attend(
                query, memory, query_doc, query_pos, online, query_padding_mask,
                need_weights or return_stats, want_word_w, return_stats, layout)
        info["has_context"] = has_context
        if need_weights:
            info["sent_weights"] = a_s.detach()
            info["sent_index"] = torch.where(valid.to(torch.bool), rows,
                                             torch.full_like(rows, -1))
        if want_word_w:
            info["word_weights"] = a_w
        if st is not None:
            self._stats_info(info, st)
        return out, info

    def _no_memory(self, query: Tensor, memory: ProjectedMemory, want_word_w: bool,
                   return_stats: bool):
        """The static output of a memory without sentences: 0, no context."""
        T, B, C = query.shape
        out = query.new_zeros(T, B, C)
        if torch.is_grad_enabled():
            # keep every parameter in the graph (exactly zero gradient), so that
            # DDP without find_unused_parameters does not stall on such a batch
            out = out + 0.0 * sum(p.sum() for p in self.parameters() if p.requires_grad)
        rows = torch.zeros(B, 0, dtype=torch.long, device=query.device)
        return (out, torch.zeros(B, dtype=torch.bool, device=query.device),
                query.new_zeros(B, self.num_heads, T, 0), rows, rows,
                query.new_zeros(B, self.num_heads, T, 0, memory.max_len) if want_word_w
                else None,
                query.new_zeros(6, dtype=torch.float64) if return_stats else None)

    def _whole_blocks(self, memory: ProjectedMemory, rows: Tensor, valid: Tensor, vis: Tensor,
                      grouped: bool):
        """The query sentences' memory index padded to whole blocks of the word
        level (a sentence's result must not depend on the batch's ``S_max``),
        with the memory's document index and its order by length alike:
        ``(rows, valid, vis, doc_rows, by_length)``."""
        s_real = memory.max_sentences
        extra = -s_real % self.block_for(rows.device)
        doc_rows = memory.doc_rows
        by_len = memory.by_length if grouped else None
        if extra:
            rows, valid, vis = (nn.functional.pad(x, (0, extra)) for x in (rows, valid, vis))
            doc_rows = nn.functional.pad(doc_rows, (0, extra)) if grouped else doc_rows
            if by_len is not None:
                rows_l, order_l, span_l = by_len
                order_l = torch.cat([order_l, torch.arange(
                    s_real, s_real + extra, device=order_l.device).expand(order_l.size(0), -1)],
                    1)
                span_l = np.concatenate([span_l, np.broadcast_to(
                    np.array([memory.max_len, 0]), (span_l.shape[0], extra, 2))], 1)
                by_len = (nn.functional.pad(rows_l, (0, extra)), order_l, span_l)
        return rows, valid, vis, doc_rows, by_len

    def _attend(self, query: Tensor, memory: ProjectedMemory, query_doc: Tensor,
                query_pos: Tensor, online: bool, query_padding_mask: Optional[Tensor],
                want_sent: bool, want_word_w: bool, return_stats: bool, layout: Dict):
        """Eq. 3-6 for a memory with sentences: ``(out, has_context, alpha_s,
        rows, valid, word weights, statistics)`` (see :meth:`forward`)."""
        T, B, C = query.shape
        H, hd, s_real = self.num_heads, self.head_dim, memory.max_sentences
        groups = layout.get("query_groups")
        rows, valid, vis = self.query_layout(memory, query_doc, query_pos, online,
                                             layout.get("query_window"))
        rows, valid, vis, doc_rows, by_len = self._whole_blocks(memory, rows, valid, vis,
                                                                groups is not None)
        s_max = rows.size(1)
        has_context = vis.any(1)
        bias = self._distance_bias(query_pos, memory, rows)  # B x H x 1 x S_max or None
        if groups is not None and groups.size(0) != doc_rows.size(0):
            raise ValueError(f"query_groups: {groups.size(0)} documents, the memory "
                             f"index {doc_rows.size(0)}")
        lay = QueryLayout(T, B, rows, doc_rows, groups, by_len, layout.get("query_tokens"),
                          layout.get("group_rows"))
        vis_g = lay.group(vis[:, None, None, :].expand(B, 1, T, s_max), False)
        bias_g = lay.group(bias.expand(B, H, T, s_max), 0.0) if bias is not None else None
        q_s = q_w = None
        if self.uses_sentences:
            q_s = lay.group((self.q_s_proj(query) * self.scaling).view(T, B, H, hd).permute(
                1, 2, 0, 3), 0.0)
        if self.uses_words:
            q_w = lay.group((self.q_w_proj(query) * self.scaling).view(T, B, H, hd).permute(
                1, 2, 0, 3), 0.0)
        if self.attention == "hierarchical":
            o, a_g, nnz = self._hierarchical(q_s, q_w, memory, lay, vis_g, bias_g, return_stats)
        elif self.attention == "flat-sentence":
            o, a_g, nnz = self._flat_sentence(q_s, memory, lay, vis_g, bias_g)
        else:
            o, a_g, nnz = self._flat_word(q_w, memory, lay, vis_g, bias_g, want_sent)
        a_s = lay.ungroup(a_g.detach()) if want_sent else None  # B x H x T x S_max
        st = None
        if return_stats:
            real_tok = (~query_padding_mask.to(torch.bool) if query_padding_mask is not None
                        else torch.ones(B, T, dtype=torch.bool, device=query.device))
            tok = real_tok & has_context.unsqueeze(1)  # B x T: tokens counted in stats
            st = self._stats(vis, tok, a_s != 0, lay.ungroup(nnz) if nnz is not None else None,
                             torch.zeros_like(tok.unsqueeze(1).expand(B, H, T)))
        if want_sent:
            a_s = a_s[..., :s_real]
        rows, valid, vis = rows[:, :s_real], valid[:, :s_real], vis[:, :s_real]
        a_w = None
        if want_word_w:
            a_w = self._dense_word_weights(lay.ungroup(q_w), memory, rows, a_s, vis,
                                           bias[..., :s_real] if bias is not None else None)
        o = lay.ungroup(o).permute(2, 0, 1, 3)  # T x B x H x d
        out = self.out_proj(o.reshape(T, B, C)).masked_fill(~has_context.view(1, B, 1), 0.0)
        return out, has_context, a_s, rows, valid, a_w, st

    def _stats_info(self, info: Dict[str, Tensor], st: Tensor) -> None:
        """The statistics' means, sums and counts into ``info`` (:meth:`forward`)."""
        n_th, n_pairs = st[0].clamp(min=1), st[3].clamp(min=1)
        info["sentence_support"] = st[1] / n_th
        info["visible_sentences"] = st[2] / n_th
        info["num_token_heads"] = st[0]
        info["sentence_support_sum"] = st[1]
        info["visible_sentences_sum"] = st[2]
        if self.uses_words:
            info["word_support"] = st[4] / n_pairs
            info["num_support_pairs"] = st[3]
            info["word_support_sum"] = st[4]
        if self.attention == "hierarchical":
            info["word_overflow_sum"] = st[5]

    # ------------------------------------------------------------ pieces
    def _stats(self, vis: Tensor, tok: Tensor, sent_sel: Tensor,
               pair_words: Optional[Tensor], overflow: Optional[Tensor] = None) -> Tensor:
        """``[token-heads, sum sentence support, sum visible, support pairs, sum
        word support, overflowing token-heads]`` over the counted tokens ``tok``
        (``B x T``); ``sent_sel`` ``B x H x T x S`` (support of the sentence
        weights), ``pair_words`` ``B x H x T x K`` (non-zero word weights per
        selected sentence, 0 elsewhere), ``overflow`` ``B x H x T`` bool."""
        H = self.num_heads
        w = tok.unsqueeze(1).to(torch.float64)  # B x 1 x T
        supp = sent_sel.sum(-1).to(torch.float64) * w
        n_vis = vis.sum(1).to(torch.float64).view(-1, 1, 1)
        zero = w.new_zeros(())
        return torch.stack([
            w.sum() * H,
            supp.sum(),
            (n_vis * w).sum() * H,
            supp.sum() if pair_words is not None else zero,
            ((pair_words.sum(-1).to(torch.float64) * w).sum() if pair_words is not None
             else zero),
            (overflow.to(torch.float64) * w).sum() if overflow is not None else zero,
        ]).detach()

    def _distance_bias(self, query_pos: Tensor, memory: ProjectedMemory,
                       rows: Tensor) -> Optional[Tensor]:
        """Beyond the paper: ``beta_h[clip(query_pos - mem_pos, -N, N)]``,
        ``B x H x 1 x S_max`` (broadcast over the query tokens); None when off."""
        if self.sentence_distance <= 0:
            return None
        n = self.sentence_distance
        dist = (query_pos.unsqueeze(1) - memory.pos[rows]).clamp(-n, n) + n  # B x S_max
        return self.distance_bias[dist].permute(0, 2, 1).unsqueeze(2)

    def _sentence_weights(self, qs: Tensor, memory: ProjectedMemory, lay: "QueryLayout",
                          vis_g: Tensor, bias_g: Optional[Tensor], kind: str) -> Tensor:
        """Eq. 3 / Eq. 6 (flat-sentence) over each group's memory sentences
        (``G x H x M x S_max``), normalised and kept in float32 at least (Eq. 5
        and the support test read it)."""
        # matmul of contiguous operands, not einsum: einsum's backward rounds
        # differently with the batch's shapes (a sentence's result must not
        # depend on its batch)
        keys = memory.k_s[lay.index].transpose(1, 2).contiguous()  # G x H x J x d
        scores = torch.matmul(qs, keys.transpose(-1, -2))
        if bias_g is not None:
            scores = scores + bias_g
        return masked_normalize(scores, vis_g, kind, inplace=True,
                                dtype=torch.promote_types(scores.dtype, torch.float32))

    @staticmethod
    def group_queries(memory: ProjectedMemory, query_doc: Tensor) -> Tensor:
        """``query_groups`` for :meth:`forward`, computed on the host (one read;
        the task's collater emits it as ``query_doc_groups``): row ``d`` holds
        the batch rows of the queries of the memory's document ``d``."""
        from ctx_fairseq.data.memory_index import query_groups

        ids = memory.doc_ids.detach().cpu().numpy()
        qd = query_doc.detach().cpu().numpy()
        slot = np.searchsorted(ids, qd) if len(ids) else np.zeros(len(qd), dtype=np.int64)
        ok = (slot < len(ids)) & (ids[np.minimum(slot, max(len(ids) - 1, 0))] == qd) \
            if len(ids) else np.zeros(len(qd), dtype=bool)
        return torch.from_numpy(query_groups(np.where(ok, slot, -1), len(ids))).to(
            query_doc.device)

    def _word_level(self, qw: Tensor, memory: ProjectedMemory, lay: "QueryLayout", weight: Tensor,
                    flat: bool, want_nnz: bool):
        """The streamed word level (:func:`streamed_word_attention`) in layout
        ``lay``: ``(out G x H x M x d, nnz, mass)`` (``nnz``, ``mass`` in the
        layout's column order: position order)."""
        drop = self.dropout_module.p if (self.training or
                                         self.dropout_module.apply_during_inference) else 0.0
        shortcuts = cpu_shortcuts(qw.device)
        if not flat and not shortcuts and lay.groups is not None:
            # the accelerator's per-document layout: the selected sentences only
            # (one host read); incremental decoding (a query token per row) keeps
            # the whole tiles, which read nothing
            out, nnz = selected_word_attention(
                qw, memory.k_w, memory.v_w, weight, lay.index, memory.word_mask,
                word_attn=self.word_attn, chunk_elems=self.tile_elems, dropout=drop,
                want_nnz=want_nnz)
            return out, nnz, None
        index, spans = lay.index, None
        if lay.order is not None:  # each document's sentences longest first
            index, spans = lay.rows_by_len, lay.spans
            weight = weight.gather(-1, lay.order[:, None, None, :].expand_as(weight))
        out, nnz, mass = streamed_word_attention(
            qw, memory.k_w, memory.v_w, weight, index, memory.word_mask, flat=flat,
            word_attn=self.word_attn, block=self.block_for(qw.device),
            tile_elems=self.tile_elems,
            dropout=drop, want_nnz=want_nnz, spans=spans,
            group_rows=lay.group_rows if spans is not None else None,
            compact=shortcuts)
        if lay.order is not None:  # back to position order
            o = lay.order[:, None, None, :]
            if nnz is not None:
                nnz = torch.zeros_like(nnz).scatter_(-1, o.expand_as(nnz), nnz)
            if mass is not None:
                mass = torch.zeros_like(mass).scatter_(-1, o.expand_as(mass), mass)
        return out, nnz, mass

    def _dense_word_weights(self, qw: Tensor, memory: ProjectedMemory, rows: Tensor,
                            alpha_s: Optional[Tensor], vis: Tensor,
                            bias: Optional[Tensor]) -> Tensor:
        """``B x H x T x S_max x L`` word weights (``alpha_hier`` / the flat
        weights; ``qw`` ``B x H x T x d``), for analyses only
        (``need_word_weights``): it pairs every query token with every word of
        its document, which the streamed word level never does."""
        with torch.no_grad():
            B, s_max = rows.shape
            scores = torch.einsum("bhtd,bshld->bhtsl", qw, memory.k_w[rows])
            scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
            words = memory.word_mask[rows].view(B, 1, 1, s_max, -1)
            if self.attention == "flat-word":
                if bias is not None:
                    scores = scores + bias.unsqueeze(-1)
                mask = (vis.view(B, 1, 1, s_max, 1) & words).reshape(B, 1, 1, -1)
                return masked_normalize(scores.reshape(*scores.shape[:3], -1), mask,
                                        "softmax").view_as(scores)
            alpha_w = masked_normalize(scores, words & (alpha_s != 0).unsqueeze(-1),
                                       self.word_attn)
            return alpha_w * alpha_s.unsqueeze(-1)

    def _hierarchical(self, qs: Tensor, qw: Tensor, memory: ProjectedMemory, lay: "QueryLayout",
                      vis_g: Tensor, bias_g: Optional[Tensor], want_stats: bool):
        """Eq. 3-5: the sentence weights (float32), then the streamed word level
        weighted by them (sentences outside the Eq. 3 support have weight 0 and
        a zero sparsemax Jacobian: exact). Returns ``(out, alpha_s, nnz)`` in
        the layout."""
        alpha_s = self._sentence_weights(qs, memory, lay, vis_g, bias_g, self.sentence_attn)
        out, nnz, _ = self._word_level(qw, memory, lay, alpha_s, False, want_stats)
        return out, alpha_s, nnz

    def _flat_sentence(self, qs: Tensor, memory: ProjectedMemory, lay: "QueryLayout",
                       vis_g: Tensor, bias_g: Optional[Tensor]):
        alpha = self._sentence_weights(qs, memory, lay, vis_g, bias_g, "softmax")  # Eq. 6
        v_s = memory.v_s[lay.index].transpose(1, 2).contiguous()  # G x H x J x d
        out = torch.matmul(self.dropout_module(alpha).to(v_s.dtype), v_s)
        return out, alpha, None

    def _flat_word(self, qw: Tensor, memory: ProjectedMemory, lay: "QueryLayout", vis_g: Tensor,
                   bias_g: Optional[Tensor], want_sent: bool):
        """Eq. 6 over every real word of the visible sentences, streamed (one
        softmax per query token, flash-attention style). The sentence term of
        the logits: the distance bias (0 without), ``-inf`` where not visible.
        The sentence weights (each sentence's share) are computed when asked."""
        acc = torch.promote_types(qw.dtype, torch.float32)
        c = torch.zeros((), dtype=acc, device=qw.device).masked_fill(~vis_g, float("-inf"))
        c = c.expand(*qw.shape[:3], vis_g.size(-1))
        if bias_g is not None:
            c = c + bias_g.to(acc)
        out, nnz, mass = self._word_level(qw, memory, lay, c, True, want_sent)
        if mass is None:
            mass = c.new_zeros(())
        return out, mass, nnz


class ContextGating(nn.Module):
    """Eq. 7-8: ``gamma = sigmoid(W_r r + W_d d)``, ``r~ = gamma*r + (1-gamma)*d``.

    ``W_r``, ``W_d`` have no bias (Eq. 7 writes none). Rows with
    ``has_context`` False (``(B,)``) return ``r~ = r`` exactly and ``gamma = 1``."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.w_r = nn.Linear(embed_dim, embed_dim, bias=False)
        self.w_d = nn.Linear(embed_dim, embed_dim, bias=False)
        nn.init.xavier_uniform_(self.w_r.weight)
        nn.init.xavier_uniform_(self.w_d.weight)

    def forward(self, r: Tensor, d: Tensor,
                has_context: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        gamma = torch.sigmoid(self.w_r(r) + self.w_d(d))  # Eq. 7
        r_tilde = gamma * r + (1 - gamma) * d  # Eq. 8
        if has_context is not None:
            keep = has_context.view(1, -1, 1)
            r_tilde = torch.where(keep, r_tilde, r)
            gamma = gamma.masked_fill(~keep, 1.0)
        return r_tilde, gamma


class DocumentContextLayer(nn.Module):
    """Document-level Context Layer (Sec. 3.1, footnote 2) + context gating
    (Eq. 7-8)::

        a  = ContextAttention(query, memory)            # Eq. 3-6
        x  = LayerNorm(dropout(a))                      # no residual
        d  = LayerNorm(dropout(fc2(act_dropout(act(fc1(x))))))  # no residual
        r~ = ContextGating(r, d)                        # Eq. 7-8

    ``r`` (``T x B x C``) is the encoder/decoder stack output; ``query``
    defaults to ``r`` (encoder integration); for decoder integration pass the
    last layer's source-attention output as ``query``. Query sentences with no
    visible context get ``d = 0`` and ``r~ = r`` exactly.
    Args are those of :class:`HierarchicalContextAttention` (incl.
    ``sentence_distance``) plus ``ffn_embed_dim``
    (``F``), ``dropout``, ``activation_dropout``, ``activation_fn``.
    """

    def __init__(self, embed_dim: int, num_heads: int, ffn_embed_dim: int, *,
                 dropout: float = 0.0, activation_dropout: float = 0.0,
                 activation_fn: str = "relu", export: bool = False, **attention):
        super().__init__()
        self.embed_dim = embed_dim
        # (attention, sentence_attn, word_attn, attention_dropout, kdim, vdim,
        # sentence_distance and the word level's options, by keyword)
        self.context_attn = HierarchicalContextAttention(embed_dim, num_heads, **attention)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.attn_layer_norm = LayerNorm(embed_dim, export=export)
        self.activation_fn = utils.get_activation_fn(activation_fn)
        self.activation_dropout_module = FairseqDropout(
            activation_dropout, module_name=self.__class__.__name__)
        self.fc1 = nn.Linear(embed_dim, ffn_embed_dim)
        self.fc2 = nn.Linear(ffn_embed_dim, embed_dim)
        self.final_layer_norm = LayerNorm(embed_dim, export=export)
        self.gate = ContextGating(embed_dim)

    def _context_output(self, a: Tensor) -> Tensor:
        """``LN(dropout(fc2(act_dropout(act(fc1(LN(dropout(a))))))))`` (Sec. 3.1)."""
        x = self.attn_layer_norm(self.dropout_module(a))
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        return self.final_layer_norm(self.dropout_module(self.fc2(x)))

    def _real_tokens(self, a: Tensor, r: Tensor, has_context: Tensor, query_tokens: Tensor,
                     group_rows=None) -> Tuple[Tensor, Tensor, Tensor]:
        """The position-wise part after the attention (layer norms, FFN, Eq. 7-8)
        on the real query tokens only (encoder integration, where the collater
        gives them; any device): ``query_tokens`` (``D x M_max``, the
        collater's ``query_doc_tokens``) holds the flat positions ``b T + t``
        of each document's real tokens, padded with ``B T``; with
        ``group_rows`` (host numpy ``D``, ``query_doc_token_counts``) only
        each document's own count is read, so the rows are exactly the real
        tokens (without it, ``D x M_max`` rows, the padding ones reading a row
        of zeros). A document batch pads its sentences to about twice their
        real tokens; the padding positions keep ``r~ = r`` (``d = 0``,
        ``gamma = 1``), which no reader looks at. A query without a document
        in the memory (context dropout) is in no row: ``r~ = r``. Returns
        ``(r~, d, gamma)``, ``T x B x C``."""
        T, B, C = r.shape
        if group_rows is not None:
            index = torch.cat([query_tokens[d, :int(n)] for d, n in enumerate(group_rows)]
                              + [query_tokens.new_zeros(0)])
        else:
            index = query_tokens.reshape(-1)

        def pick(x: Tensor) -> Tensor:  # T x B x C -> N x C (row B T: zeros)
            flat = x.transpose(0, 1).reshape(B * T, -1)
            return torch.cat([flat, flat.new_zeros(1, flat.size(1))]).index_select(0, index)

        def put(part: Tensor, base: Tensor) -> Tensor:  # N x C into T x B x C
            flat = torch.cat([base.transpose(0, 1).reshape(B * T, -1),
                              base.new_zeros(1, base.size(-1))])
            flat = flat.index_copy(0, index, part.to(flat.dtype))  # row B T: the padding's
            return flat[:B * T].view(B, T, -1).transpose(0, 1)

        with_context = torch.cat([has_context, has_context.new_zeros(1)]).index_select(
            0, torch.div(index, T, rounding_mode="floor"))  # N: the token's sentence's
        d = self._context_output(pick(a)).masked_fill(~with_context.unsqueeze(1), 0.0)
        r_tilde, gamma = self.gate(pick(r).unsqueeze(0), d.unsqueeze(0), with_context)
        return put(r_tilde[0], r), put(d, torch.zeros_like(r)), put(gamma[0], torch.ones_like(r))

    def project_memory(self, mem_keys: Tensor, mem_values: Tensor, mem_word_mask: Tensor,
                       mem_doc: Tensor, mem_pos: Tensor, doc_rows: Optional[Tensor] = None,
                       doc_valid: Optional[Tensor] = None,
                       by_length: Optional[Tuple[Tensor, Tensor, object]] = None
                       ) -> ProjectedMemory:
        """See :meth:`HierarchicalContextAttention.project_memory`."""
        return self.context_attn.project_memory(mem_keys, mem_values, mem_word_mask,
                                                mem_doc, mem_pos, doc_rows, doc_valid,
                                                by_length=by_length)

    def forward(self, r: Tensor, memory: ProjectedMemory, query_doc: Tensor,
                query_pos: Tensor, online: bool, query: Optional[Tensor] = None,
                query_padding_mask: Optional[Tensor] = None, need_weights: bool = False,
                return_stats: bool = False, **options) -> Tuple[Tensor, Dict[str, Tensor]]:
        """``options``: ``need_word_weights`` and the query layout
        (:data:`QUERY_LAYOUT`), by keyword, as
        :meth:`HierarchicalContextAttention.forward` takes them.

        Returns ``(r~, info)``: ``r~`` ``T x B x C``; ``info`` holds the
        attention's info plus ``d`` (context layer output) and ``gate``
        (``gamma``, 1 where bypassed). With ``return_stats`` also (float64)
        ``gate_sum``: the sum of ``gamma`` (Eq. 7, averaged over the model
        dimension) over the non-padding query tokens (``query_padding_mask``)
        of the sentences with context, ``gate_tokens``: the number of those
        tokens, and ``query_tokens``: the number of non-padding query tokens."""
        a, info = self.context_attn(
            r if query is None else query, memory, query_doc, query_pos, online,
            query_padding_mask=query_padding_mask, need_weights=need_weights,
            return_stats=return_stats, **options)
        has_context = info["has_context"]
        if options.get("query_tokens") is not None:  # the real query tokens only
            r_tilde, d, gamma = self._real_tokens(a, r, has_context, options["query_tokens"],
                                                  options.get("group_rows"))
        else:
            d = self._context_output(a).masked_fill(~has_context.view(1, -1, 1), 0.0)
            r_tilde, gamma = self.gate(r, d, has_context)
        info["d"] = d
        info["gate"] = gamma
        if return_stats:
            T, B = r.shape[:2]
            with_ctx = real_tokens(T, B, r.device, query_padding_mask, has_context)
            info["gate_sum"], info["gate_tokens"] = mean_gate_sum(gamma, with_ctx).unbind(0)
            info["query_tokens"] = real_tokens(T, B, r.device, query_padding_mask).sum().to(
                torch.float64)
        return r_tilde, info
