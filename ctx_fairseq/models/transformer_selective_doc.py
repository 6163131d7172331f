"""``transformer_selective_doc``: selective attention over the whole document
(Maruf, Martins & Haffari, NAACL 2019, "Selective Attention for
Context-aware Neural Machine Translation").

A fairseq Transformer plus one Document-level Context Layer
(:class:`ctx_fairseq.modules.selective_attention.DocumentContextLayer`,
Eq. 3-8) beside the encoder stack (``--context-integration encoder``,
monolingual context, Sec. 3.3) or beside the decoder stack (``decoder``,
bilingual context). This file only wires the module into fairseq; the
equations are in the module.

Inputs (``--task document_translation --document-context online|offline
--document-memory``): each batch carries its documents' memory, every
sentence a query may see, once (``mem_src_tokens``, ``mem_doc``,
``mem_pos``, ``query_doc``, ``query_pos``, ``query_mem_row``; with target
context on, ``mem_tgt_tokens``), see
:meth:`ctx_fairseq.data.document_dataset.DocumentContextDataset.collate_memory`.
No document is truncated: a sentence sees every visible sentence of its
document, and memory grows linearly with the document.

Memory (``--context-memory``):

* ``shared`` (an option, beyond the paper; needs no stage-1 checkpoint): the
  memory comes from this model in the same forward pass, with gradients. Encoder integration: the last encoder layer's states of the
  memory sentences; a memory sentence that is also a query of the batch is
  encoded once (``query_mem_row``). Decoder integration: the memory
  sentences' sources are encoded (queries reused) and their targets decoded
  with teacher forcing; keys are the last decoder layer's source-attention
  outputs (the context vectors), values its output states.
* ``frozen`` (the default, the paper's, Sec. 3.3: "the keys and values
  produced from the pre-trained sentence-level NMT model"; a new run needs
  ``--init-from-sentence-checkpoint``): the same computation by a frozen copy of the
  sentence-level model (``memory_encoder`` / ``memory_decoder``, taken when
  the model is built, i.e. from ``--init-from-sentence-checkpoint`` in stage
  2, never trained, saved in the checkpoint), under ``torch.no_grad`` in eval
  mode; with ``--freeze-sentence-level`` the model's own layers are that
  model and no copy is made. Trade-off: ``frozen`` needs no backward through
  the memory (less memory and time per step, the paper's setting, stable
  keys); ``shared`` adapts the memory to the document model at the cost of a
  backward through it.

Frozen memory cache (the paper stores the frozen model's keys and values):
the states of a sentence under the frozen model depend only on its tokens,
so the model keeps them in a content-addressed LRU cache
(:class:`ctx_fairseq.modules.sentence_cache.SentenceStateCache`,
``model.memory_cache``, shared by the encoder and the decoder): the encoder
memory states keyed on the source tokens (encoder integration's memory; for
decoder integration the memory sources the frozen decoder attends to), and,
for decoder integration, the decoder memory keys and values keyed on the
source and the target tokens. A sentence is encoded once, whatever its
batch, document (identical sentences share one entry) or position; a long
document cut into many chunks does not re-encode its memory for each. On a
miss the frozen model runs without gradients in eval mode on the missing
sentences only, sorted by length, in chunks of ``MEMORY_CHUNK_TOKENS``
padded tokens; entries hold the real tokens' states on the CPU in the
precision they were computed in (the model's: cached == uncached; a
512-dimensional state of a 25-token sentence: 50 KB in float32, 25 KB under
``--fp16``; decoder integration stores three such tensors per sentence:
source states, keys, values); each batch's memory is assembled from them
into the padded ``S x W x C`` tensors on the model's device and dtype
(padding positions 0, masked as before). Keys are 128-bit digests of the
tokens made by the task's collater (``mem_src_key``/``mem_tgt_key``, numpy
arrays that stay on the host): a batch looks its memory up without reading
anything back, copies all its misses' states to the host at once, and
assembles its memory with one host-to-device copy (see
:mod:`ctx_fairseq.modules.sentence_cache`). ``--memory-cache-sentences N``
(default 100000) bounds the number of entries (one per distinct source, plus one per distinct
source-target pair with decoder integration), least recently used out; 0: no
cache (the memory is computed per batch, in chunks). The cache is not a
module or buffer: never saved in a checkpoint, and a ``copy.deepcopy`` of
the model starts with an empty one. It is emptied when weights are loaded
(``load_state_dict``, i.e. a checkpoint restored) or the frozen copies are
(re)made, and whenever the frozen weights are no longer those it was filled
with (moved, cast or changed in place; checked per batch by storage and
version counters). ``set_memory_cache(SentenceStateCache(n, dtype=torch.float16))`` would
store half precision (then cached and uncached memories differ).

With the task's ``--memory-precomputed`` (which requires ``--context-memory
frozen``; checked in :meth:`TransformerSelectiveDocModel.build_model`),
batches count only their own sentences in ``--max-tokens``: what is encoded
with gradients stays bounded by it, and cache misses add forward-only work
(no activations kept), in chunks, once per sentence while it stays cached
(the context layer's trainable projection of the assembled memory stays
linear in the visible document). ``--context-memory frozen`` without
``--memory-precomputed`` still counts the memory in the batch, as a shared
memory is counted.

What does not fit: the batch must hold what its sentences can see (the
task's batching counts the memory in ``--max-tokens`` and cuts documents
into chunks that carry the memory they need); a sentence whose visible
document alone exceeds ``--max-tokens`` is an error there (not with
``--memory-precomputed``, where the memory is not counted).

Choices where the paper is silent:

* Decoder-integration queries ``Q_s``, ``Q_w`` are the last decoder layer's
  source-attention output (Sec. 3.3, Fig. 3); ``r`` (Eq. 7-8) is the decoder
  stack output; the memory's word ``t`` is the state at the input position
  of target word ``t`` (teacher forcing, the ``</s>`` that starts decoding
  is not a word).
* A sentence with no visible context is translated exactly as by the
  sentence-level part (``d = 0``, ``r~ = r``; see the module).
* Incremental decoding: the decoder memory is computed at the first step of
  a batch and kept in the incremental state; beam reordering touches only
  ``query_doc``/``query_pos`` (in ``encoder_out``), never the memory.
* Two-stage training: ``--init-from-sentence-checkpoint`` (stage 1: a
  ``transformer``); ``--freeze-sentence-level`` trains only the context layer.
* An empty memory (online, a batch of first sentences only: ``--batch-size
  1``, fairseq-interactive on a document's first line) runs nothing for the
  memory; every sentence of such a batch is translated by the sentence-level
  part.
* The frozen copies get fresh fairseq incremental-state ids (``deepcopy``
  would copy the decoder's, and beam search, which reorders the incremental
  state of every submodule, would then reorder the decoder's buffers twice).
* Decoder integration reads the last decoder layer's source attention as a
  side output, so with ``--checkpoint-activations`` that one layer is not
  checkpointed (a checkpointed layer computes it without gradients);
  ``--decoder-layerdrop`` (which may skip that layer) and a
  ``--decoder-output-dim`` other than ``--decoder-embed-dim`` are errors.
* ``--doc-sentence-distance N`` (beyond the paper, default 0 = off): a
  learned per-head bias on the sentence-level scores by the signed sentence
  distance clipped to ``[-N, N]`` (recency; see the module docstring).
* ``uses_target_context`` (read by the task) is true for decoder
  integration only; ``context_stats()`` keeps the last forward's info
  detached from the autograd graph.

Training statistics (``--criterion label_smoothed_cross_entropy_ctx``, see
docs/criterion.md; :meth:`TransformerSelectiveDocModel.context_statistics`),
all over the non-padding query tokens (source tokens with encoder
integration, decoder input positions with decoder integration) of the
sentences that have visible context: ``gate`` (mean ``gamma`` of Eq. 7, the
share of the sentence-level representation ``r`` in Eq. 8), ``ctx_mass``
(``1 - gamma``, the share of the document context ``d``), ``ctx_frac`` (the
share of non-padding query tokens whose sentence has visible context),
``sent_support`` / ``sent_visible`` (non-zero sentence weights of Eq. 3 /
visible sentences, per query token and head), ``word_support`` (non-zero
word weights of Eq. 4 per selected (token, head, sentence); not with
``flat-sentence``).
"""

import copy
import logging
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import base_architecture
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import Tensor

from ctx_fairseq.models._fairseq_utils import (
    IterativeDecodingDemo,
    decode_static,
    encode_and_decode,
    load_sentence_checkpoint,
    plain_attention,
    preset,
    set_default,
    tiny_shape,
    to_namespace,
    wrap_layer,
)
from ctx_fairseq.modules.selective_attention import WORD_CAPACITY, DocumentContextLayer
from ctx_fairseq.modules.sentence_cache import (
    SentenceStateCache,
    assemble_rows,
    row_keys,
    to_device,
    weights_signature,
)

logger = logging.getLogger(__name__)

__all__ = ["TransformerSelectiveDocModel", "SelectiveDocEncoder", "SelectiveDocDecoder",
           "memory_state_index", "first_queries_state_index"]

MEMORY_KEYS = ("query_doc", "query_pos", "mem_src_tokens", "mem_src_lengths", "mem_doc",
               "mem_pos", "query_mem_row", "mem_tgt_tokens", "mem_tgt_lengths",
               "mem_tgt_prev_tokens", "mem_encoder_out", "mem_encoder_padding_mask",
               "mem_doc_rows", "mem_doc_valid", "mem_state_index", "mem_extra_rows",
               "mem_src_key", "mem_tgt_key", "query_doc_groups", "mem_doc_rows_by_len",
               "mem_doc_len_order", "mem_doc_span_by_len", "query_doc_sizes", "query_doc_tokens",
               "query_doc_token_counts")
#: follow the beam (one row per query sentence); every other key is per document
QUERY_KEYS = ("query_doc", "query_pos", "query_mem_row")
#: index the batch's rows: dropped when the rows are reordered (the beam), after which
#: the word level runs per query sentence
ROW_INDEX_KEYS = ("query_doc_groups", "query_doc_sizes", "query_doc_tokens",
                  "query_doc_token_counts")
#: frozen memory: padded tokens per no-grad forward of the frozen model
MEMORY_CHUNK_TOKENS = 8192
#: frozen memory: default number of cache entries (``--memory-cache-sentences``)
MEMORY_CACHE_SENTENCES = 100_000


def _context_layer(args, embed_dim: int, heads: int, ffn: int) -> DocumentContextLayer:
    return DocumentContextLayer(
        embed_dim, heads, ffn, attention=args.doc_attention, sentence_attn=args.sentence_attn,
        word_attn=args.word_attn, selective=not args.dense_doc_attention,
        dropout=args.dropout, attention_dropout=args.attention_dropout,
        activation_dropout=getattr(args, "activation_dropout", 0.0) or 0.0,
        activation_fn=getattr(args, "activation_fn", "relu") or "relu",
        sentence_distance=int(getattr(args, "doc_sentence_distance", 0) or 0),
        word_capacity=int(getattr(args, "doc_word_capacity", WORD_CAPACITY) or WORD_CAPACITY))


def _query_layout(doc, T: int, src_width: Optional[int]) -> Dict[str, object]:
    """The context layer's query layout arguments from the collater's keys:
    per document (``query_doc_groups``), on the real source tokens only
    (``query_doc_tokens``, when the queries are the batch's source positions:
    ``T == src_width``), with each document's real rows (host numpy) so that
    no padding row is computed."""
    groups = doc.get("query_doc_groups")
    if groups is None:
        return {}
    tokens, counts = doc.get("query_doc_tokens"), doc.get("query_doc_token_counts")
    if src_width is not None and T == src_width and tokens is not None and counts is not None:
        return {"query_groups": groups, "query_tokens": tokens, "group_rows": counts}
    sizes = doc.get("query_doc_sizes")
    return {"query_groups": groups,
            "group_rows": None if sizes is None else np.asarray(sizes) * T}


def _real_words(tokens: Tensor, dictionary) -> Tensor:
    """True at real words (not padding, ``</s>`` or ``<s>``)."""
    return tokens.ne(dictionary.pad()) & tokens.ne(dictionary.eos()) & tokens.ne(dictionary.bos())


def _align(states: Tensor, width: int, left_pad: bool) -> Tensor:
    """``T x N x C`` padded on the left (or right) -> ``width x N x C``."""
    extra = width - states.size(0)
    if extra <= 0:
        return states
    pad = states.new_zeros(extra, states.size(1), states.size(2))
    return torch.cat([pad, states], 0) if left_pad else torch.cat([states, pad], 0)


def _real_positions(lengths: List[int], width: int, left_pad: bool, device) -> Tensor:
    """Flat positions (into ``len(lengths) x width``) of each row's ``n``
    real tokens, padded on the left or the right; computed on the host."""
    lens = np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(lens) - lens
    within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(starts, lens)
    if left_pad:
        within += np.repeat(width - lens, lens)
    rows = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    return to_device(torch.from_numpy(rows * width + within), device)


def _host_rows(keys) -> List[List[int]]:
    """The collater's ``mem_*_key`` rows (digest, digest, length) as Python
    ints: a numpy array is on the host already (no read); a tensor (inputs
    moved whole to the device) is read back once."""
    return keys.tolist()


def _cut(width: int, n: int, left_pad: bool) -> slice:
    """The ``n`` columns of a ``width``-wide padded batch that hold real tokens
    in some row when the longest row has ``n``."""
    return slice(width - n, width) if left_pad else slice(0, n)


def memory_state_index(query_mem_row, S: int) -> Tuple[np.ndarray, np.ndarray]:
    """``mem_state_index`` (``S``) and ``mem_extra_rows`` (``E``) of a batch
    from its ``query_mem_row`` (``B``, the memory row holding each query
    sentence, -1 if none) and its number of memory rows ``S``, on the host
    (numpy): memory row ``s``'s encoder states are column
    ``mem_state_index[s]`` of the batch's query encodings (``0..B-1``)
    followed by those of the memory rows ``mem_extra_rows`` (the memory
    sentences that are no query of the batch, ``B..B+E-1``), see
    ``DocumentContextDataset.collate_memory``. For whoever changes a batch's
    queries after collation (ctx-bench keeps the first ``n`` sentences of a
    collated batch and its whole memory)."""
    row = np.asarray(query_mem_row, dtype=np.int64)
    source = np.full(S, -1, dtype=np.int64)
    qb = np.flatnonzero(row >= 0)
    source[row[qb]] = qb
    extra = np.flatnonzero(source < 0)
    source[extra] = len(row) + np.arange(len(extra), dtype=np.int64)
    return source, extra.astype(np.int64)


def first_queries_state_index(mem_state_index, n: int) -> Tuple[np.ndarray, np.ndarray]:
    """``mem_state_index``/``mem_extra_rows`` (see :func:`memory_state_index`)
    of a batch cut to its first ``n`` queries, its memory kept whole, from the
    whole batch's ``mem_state_index``, on the host (numpy): a memory row keeps
    the encoding of a kept query it shares (the collater's choice, e.g. not
    with a query whose source CoWord dropout changed), every other row is
    encoded as a memory row (``n..n+E'-1``, in row order). ctx-bench's beam
    search over the first sentences of a training batch."""
    source = np.array(mem_state_index, dtype=np.int64, copy=True)
    extra = np.flatnonzero(source >= n)
    source[extra] = n + np.arange(len(extra), dtype=np.int64)
    return source, extra.astype(np.int64)


def _state_index(query_mem_row: Tensor, S: int) -> Tuple[Tensor, Tensor]:
    """What the collater gives as ``mem_state_index``/``mem_extra_rows``,
    computed from ``query_mem_row`` for inputs built without them (one host
    read per batch), see :func:`memory_state_index`."""
    source, extra = memory_state_index(query_mem_row.cpu().numpy(), S)
    dev = query_mem_row.device
    return torch.from_numpy(source).to(dev), torch.from_numpy(extra).to(dev)


def _row_chunks(n: int, width: int, chunk_tokens: int) -> List[Tuple[int, int]]:
    rows = max(1, chunk_tokens // max(1, width))
    return [(a, min(n, a + rows)) for a in range(0, n, rows)]


def _sentence_level_weights(module, own: bool):
    """The parameters a frozen memory is computed with: a frozen copy's, or
    (``own``: ``--freeze-sentence-level``) the part's own sentence-level ones."""
    for name, p in module.named_parameters():
        if not own or not (name.startswith("context_layer.") or name.startswith("memory_")):
            yield p


def _detached(info: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """The context layer's info, kept for :meth:`context_stats` without its
    autograd graph."""
    return {k: (v.detach() if torch.is_tensor(v) else v) for k, v in info.items()}


def _frozen_source(module, copy_name: str):
    """The frozen sentence-level model that ``--context-memory frozen`` reads:
    the frozen copy, or the module itself when the sentence level is frozen
    (``--freeze-sentence-level``). Anything else would silently read memory
    from trainable weights, so it is an error."""
    copy_ = getattr(module, copy_name)
    if copy_ is not None:
        return copy_
    if getattr(module.args, "freeze_sentence_level", False):
        return module
    raise RuntimeError(
        "--context-memory frozen: the frozen copy of the sentence-level model is missing; build "
        "the model through the document_translation task (which calls finish_setup after "
        "--init-from-sentence-checkpoint) or use --freeze-sentence-level")


class _EvalMode:
    """Run a module in eval mode (no dropout) and restore its mode."""

    def __init__(self, module):
        self.module, self.was = module, module.training

    def __enter__(self):
        self.module.train(False)

    def __exit__(self, *exc):
        self.module.train(self.was)


class SelectiveDocEncoder(TransformerEncoderBase):
    """fairseq's encoder. With encoder integration its output goes through
    the Document-level Context Layer (queries: the output; memory: the
    document's sentences). It also encodes the memory sentences' sources
    (``mem_encoder_out``) and passes the memory inputs on in ``encoder_out``
    for decoder integration."""

    def __init__(self, cfg, dictionary, embed_tokens, args):
        super().__init__(cfg, dictionary, embed_tokens)
        self.args = args
        self.online = args.document_context_mode == "online"
        self.context_layer = None
        if args.context_integration == "encoder":
            self.context_layer = _context_layer(args, cfg.encoder.embed_dim,
                                                cfg.encoder.attention_heads,
                                                cfg.encoder.ffn_embed_dim)
        self.memory_encoder: Optional[TransformerEncoderBase] = None  # frozen copy
        #: frozen memory: the model's cache (not a module: never in the state dict)
        self.memory_cache: Optional[SentenceStateCache] = None
        self.memory_chunk_tokens = MEMORY_CHUNK_TOKENS
        self.record_stats = False
        #: only the statistics (``return_stats``), not the attention weights:
        #: the training statistics (``TransformerSelectiveDocModel.context_statistics``)
        self.record_statistics = False
        self.last_info: Optional[Dict[str, Tensor]] = None

    def _state_index(self, doc: Dict[str, Tensor]) -> Tuple[Tensor, Tensor]:
        source, extra = doc.get("mem_state_index"), doc.get("mem_extra_rows")
        if source is None or extra is None:
            source, extra = _state_index(doc["query_mem_row"], doc["mem_src_tokens"].size(0))
        return source, extra

    def _encode_with_memory(self, src_tokens: Tensor, src_lengths: Tensor,
                            doc: Dict[str, Tensor], return_all_hiddens: bool):
        """Shared memory: the batch's sources and the memory sentences that are
        no query of the batch (``mem_extra_rows``) in one encoder call (one
        set of fairseq's per-call host reads), padded to a common width.
        Returns fairseq's encoder output for the batch's sources (exactly the
        columns and rows of ``src_tokens``) and the states of all of them,
        ``W x (B + E) x C``, ``W = max(source, memory width)``."""
        mem, lengths = doc["mem_src_tokens"], doc["mem_src_lengths"]
        _, extra = self._state_index(doc)
        B, Ls = src_tokens.shape
        W = max(Ls, mem.size(1))
        left = bool(self.args.left_pad_source)

        def pad(t: Tensor) -> Tensor:
            n = W - t.size(1)
            return F.pad(t, (n, 0) if left else (0, n), value=self.padding_idx) if n else t

        full = self.forward_scriptable(
            torch.cat([pad(src_tokens), pad(mem.index_select(0, extra))], 0),
            torch.cat([src_lengths, lengths.index_select(0, extra)]), return_all_hiddens)
        cut = slice(W - Ls, W) if left else slice(0, Ls)
        states = full["encoder_out"][0]
        out = {
            "encoder_out": [states[cut, :B]],
            "encoder_padding_mask": [m[:B, cut] for m in full["encoder_padding_mask"]],
            "encoder_embedding": [e[:B, cut] for e in full["encoder_embedding"]],
            "encoder_states": [x[cut, :B] for x in full["encoder_states"]],
            "fc_results": [x[cut, :B] if x is not None else x for x in full["fc_results"]],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }
        return out, states

    def memory_states(self, src_tokens: Tensor, enc_q: Tensor,
                      doc: Dict[str, Tensor], together: Optional[Tensor] = None
                      ) -> Tuple[Tensor, Tensor]:
        """The memory sentences' last-layer states (``W x S x C``) and tokens
        (``S x W``), padded like the source. ``shared``: a memory sentence that
        is a query of the batch reuses the query's states (``enc_q``), the
        others are encoded here; ``frozen``: the frozen stage-1 encoder (or this
        encoder, when the sentence level is frozen) without gradients, in eval
        mode."""
        mem, lengths = doc["mem_src_tokens"], doc["mem_src_lengths"]
        if mem.size(0) == 0:  # no memory sentence (online: only first sentences); nothing to run
            return enc_q.new_zeros(mem.size(1), 0, enc_q.size(2)), mem
        if self.args.context_memory == "frozen":
            return self.frozen_memory_states(mem, lengths, enc_q, doc.get("mem_src_key")), mem
        left = bool(self.args.left_pad_source)
        width = max(mem.size(1), src_tokens.size(1))
        source, extra = self._state_index(doc)
        padding = (width - mem.size(1), 0) if left else (0, width - mem.size(1))
        if together is not None:  # encoded with the batch (_encode_with_memory)
            return together.index_select(1, source), F.pad(mem, padding, value=self.padding_idx)
        parts = [_align(enc_q, width, left)]
        if extra.numel():  # static: the collater's index
            e_out = TransformerEncoderBase.forward_scriptable(
                self, mem.index_select(0, extra), lengths.index_select(0, extra))
            parts.append(_align(e_out["encoder_out"][0], width, left))
        states = torch.cat(parts, 1).index_select(1, source)
        return states, F.pad(mem, padding, value=self.padding_idx)

    def frozen_memory_states(self, mem: Tensor, lengths: Tensor, like: Tensor,
                             keys: Optional[Tensor] = None) -> Tensor:
        """``--context-memory frozen``: the memory sentences' last-layer
        states (``W x S x C``, ``like``'s dtype) under the frozen sentence-level
        encoder, in eval mode, without gradients. Read from the cache (keyed on
        the source tokens) when the model has one, the misses computed in
        chunks (:meth:`_encode_frozen`); without a cache all are computed in
        chunks."""
        enc = _frozen_source(self, "memory_encoder")
        real = mem.ne(self.padding_idx)
        cache = self.memory_cache
        with torch.no_grad(), _EvalMode(enc):
            if cache is None:
                parts = [TransformerEncoderBase.forward_scriptable(
                    enc, mem[a:b], lengths[a:b])["encoder_out"][0]
                    for a, b in _row_chunks(mem.size(0), mem.size(1), self.memory_chunk_tokens)]
                return torch.cat(parts, 1).to(like.dtype).detach()
            cache.validate("encoder", weights_signature(
                _sentence_level_weights(enc, own=enc is self)))
            if keys is not None:  # the collater's digests and lengths, on the host
                host = _host_rows(keys)
                row_key = [("src", a, b) for a, b, _ in host]
                lens = [n for _, _, n in host]
            else:  # inputs built without them: the tokens themselves
                row_key = row_keys(mem, self.padding_idx, tag="src")
                lens = real.sum(1).tolist()
            left = bool(self.args.left_pad_source)
            entries = cache.fetch(
                row_key, lens,
                lambda rows: self._encode_frozen(enc, mem, lengths, lens, left, rows),
                self.memory_chunk_tokens)
            (states,) = assemble_rows(entries, mem.size(1), left, like.device, like.dtype)
        return states.transpose(0, 1)

    @staticmethod
    def _encode_frozen(enc, mem: Tensor, lengths: Tensor, lens: List[int], left: bool,
                       rows: List[int]) -> Tuple[Tensor]:
        """Cache misses: the states of memory rows ``rows`` at their real
        tokens (``sum x C``), the rows trimmed to their longest (``lens``:
        the real tokens per memory row, on the host)."""
        idx = to_device(torch.tensor(rows, dtype=torch.long), mem.device)
        n = [lens[i] for i in rows]
        tokens = mem.index_select(0, idx)[:, _cut(mem.size(1), max(n), left)]
        out = TransformerEncoderBase.forward_scriptable(enc, tokens, lengths.index_select(0, idx))
        states = out["encoder_out"][0].transpose(0, 1)  # k x w x C
        flat = states.reshape(-1, states.size(-1))
        return (flat.index_select(0, _real_positions(n, states.size(1), left, flat.device)),)

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None,
                **doc):
        if "mem_src_tokens" not in doc or doc["mem_src_tokens"] is None:
            raise ValueError("transformer_selective_doc needs the document memory in each batch: "
                             "--task document_translation --document-context online|offline "
                             "--document-memory")
        together = None
        if self.args.context_memory != "frozen" and doc["mem_src_tokens"].size(0) > 0 \
                and token_embeddings is None and src_lengths is not None:
            out, together = self._encode_with_memory(src_tokens, src_lengths, doc,
                                                     return_all_hiddens)
        else:
            out = self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens,
                                          token_embeddings)
        for key in MEMORY_KEYS:
            if doc.get(key) is not None:
                out[key] = [doc[key]]
        r = out["encoder_out"][0]
        states, mem_tokens = self.memory_states(src_tokens, r, doc, together)
        if self.context_layer is None:  # decoder integration: the decoder attends to these
            out["mem_encoder_out"] = [states]
            out["mem_encoder_padding_mask"] = [mem_tokens.eq(self.padding_idx)]
            return out
        words = states.transpose(0, 1)
        by_length = None  # the source memory's sentences by length, in these columns
        shift = words.size(1) - doc["mem_src_tokens"].size(1)  # columns padded on here
        if all(doc.get(k) is not None for k in ("mem_doc_rows_by_len", "mem_doc_len_order",
                                                 "mem_doc_span_by_len", "mem_doc_rows")) \
                and shift >= 0:
            span = doc["mem_doc_span_by_len"]
            if shift and bool(self.args.left_pad_source):
                span = np.where(span[..., 1:] > span[..., :1], span + shift, span)
            by_length = (doc["mem_doc_rows_by_len"], doc["mem_doc_len_order"], span)
        memory = self.context_layer.project_memory(
            words, words, _real_words(mem_tokens, self.dictionary), doc["mem_doc"],
            doc["mem_pos"], doc.get("mem_doc_rows"), doc.get("mem_doc_valid"),
            by_length=by_length)
        pad_mask = out["encoder_padding_mask"][0] if out["encoder_padding_mask"] else None
        r_tilde, info = self.context_layer(
            r, memory, doc["query_doc"], doc["query_pos"], self.online,
            query_padding_mask=pad_mask, need_weights=self.record_stats,
            return_stats=self.record_stats or self.record_statistics,
            **_query_layout(doc, r.size(0), src_tokens.size(1)))
        out["encoder_out"] = [r_tilde]
        self.last_info = _detached(info)
        return out

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        out = super().reorder_encoder_out(encoder_out, new_order)
        for key in MEMORY_KEYS:
            vals = encoder_out.get(key, [])
            if key in ROW_INDEX_KEYS:
                out.pop(key, None)
            elif vals:
                # the queries follow the beam; the memory is per document and stays
                out[key] = [vals[0].index_select(0, new_order)] if key in QUERY_KEYS else vals
        return out


class _RecordingAttention(MultiheadAttention):
    """fairseq's encoder-decoder attention that keeps its last output (the
    source-attention context vectors, ``T x B x C``) for the context layer."""

    last_output: Optional[Tensor] = None

    def forward(self, *args, **kwargs):
        out, weights = super().forward(*args, **kwargs)
        self.last_output = out
        return out, weights


class _RecordingDecoderLayer(TransformerDecoderLayerBase):
    def build_encoder_attention(self, embed_dim, cfg):
        return _RecordingAttention(
            embed_dim, cfg.decoder.attention_heads, kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout,
            encoder_decoder_attention=True, q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config)


class SelectiveDocDecoder(TransformerDecoderBase):
    """fairseq's decoder; with decoder integration its features go through
    the Document-level Context Layer before the output projection. Queries:
    the last layer's source-attention output; memory: the document's target
    sentences decoded with teacher forcing (keys: the last layer's
    source-attention outputs; values: the decoder output states), computed
    once per batch (at the first step of incremental decoding, then kept in
    the incremental state)."""

    def __init__(self, cfg, dictionary, embed_tokens, args, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.args = args
        self.online = args.document_context_mode == "online"
        self.context_layer = None
        if args.context_integration == "decoder":
            if no_encoder_attn:
                raise ValueError("decoder integration needs the encoder-decoder attention")
            self.context_layer = _context_layer(args, cfg.decoder.embed_dim,
                                                cfg.decoder.attention_heads,
                                                cfg.decoder.ffn_embed_dim)
        self.memory_decoder: Optional[TransformerDecoderBase] = None  # frozen copy
        #: frozen memory: the model's cache (not a module: never in the state dict)
        self.memory_cache: Optional[SentenceStateCache] = None
        self.memory_chunk_tokens = MEMORY_CHUNK_TOKENS
        self.record_stats = False
        #: only the statistics (``return_stats``), not the attention weights:
        #: the training statistics (``TransformerSelectiveDocModel.context_statistics``)
        self.record_statistics = False
        self.last_info: Optional[Dict[str, Tensor]] = None

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        self._layers_built = getattr(self, "_layers_built", 0) + 1
        last = self._layers_built == cfg.decoder.layers
        if getattr(cfg, "context_integration", None) != "decoder" or not last:
            # only the last layer's source attention is read (decoder integration)
            return wrap_layer(TransformerDecoderLayerBase(cfg, no_encoder_attn), cfg)
        layer = _RecordingDecoderLayer(cfg, no_encoder_attn)
        if cfg.checkpoint_activations:
            # the context layer reads the last layer's source attention as a side
            # output; under activation checkpointing it would be computed without
            # gradients (the layer's forward runs under no_grad and is recomputed in
            # the backward), so the last layer is not checkpointed
            return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap)
        return wrap_layer(layer, cfg)

    @staticmethod
    def _last_attention(decoder) -> _RecordingAttention:
        layer = decoder.layers[-1]
        layer = getattr(layer, "_checkpoint_wrapped_module", layer)
        return layer.encoder_attn

    @classmethod
    def _features_and_source_attention(cls, decoder, prev_output_tokens, encoder_out,
                                       *args) -> Tuple[Tensor, Dict, Tensor]:
        """``decoder``'s ``extract_features_scriptable`` and the last layer's
        source-attention output of that very call (``T x B x C``; taken and
        cleared, so that no stale output, nor its graph, is kept)."""
        attn = cls._last_attention(decoder)
        attn.last_output = None
        x, extra = TransformerDecoderBase.extract_features_scriptable(
            decoder, prev_output_tokens, encoder_out, *args)
        out, attn.last_output = attn.last_output, None
        if out is None or out.size(0) != x.size(1) or out.size(1) != x.size(0):
            raise RuntimeError("decoder integration: the last decoder layer's source attention "
                               "did not run for this input")
        return x, extra, out

    @classmethod
    def _memory_features(cls, decoder, prev_output_tokens: Tensor,
                         mem_enc: Dict[str, List[Tensor]]) -> Tuple[Tensor, Tensor]:
        """The teacher-forced pass over the memory's targets: the features
        (``B x T x C``) and the last layer's source-attention output (``T x B
        x C``), as :meth:`_features_and_source_attention` computes them but
        through :func:`~ctx_fairseq.models._fairseq_utils.decode_static`
        (the self-attention padding mask always given: fairseq's pass reads
        ``prev_output_tokens.eq(pad).any()`` back to decide whether to give
        it); fairseq's pass with ``--cross-self-attention``, which
        ``decode_static`` does not take (as transformer_han does)."""
        if decoder.cross_self_attention:
            x, _, out = cls._features_and_source_attention(decoder, prev_output_tokens, mem_enc)
            return x, out
        attn = cls._last_attention(decoder)
        attn.last_output = None
        pad = mem_enc.get("encoder_padding_mask") or [None]
        x = decode_static(decoder, prev_output_tokens, mem_enc["encoder_out"][0], pad[0])
        out, attn.last_output = attn.last_output, None
        if out is None or out.size(0) != x.size(1) or out.size(1) != x.size(0):
            raise RuntimeError("decoder integration: the last decoder layer's source attention "
                               "did not run for this input")
        return x, out

    def memory_states(self, encoder_out: Dict[str, List[Tensor]]) -> Tuple[Tensor, Tensor, Tensor]:
        """Keys (last-layer source-attention outputs), values (decoder output
        states), both ``S x L x C``, and the real-word mask ``S x L`` of the
        memory's target sentences, decoded with teacher forcing."""
        if "mem_tgt_prev_tokens" not in encoder_out:
            raise ValueError("decoder integration needs the target side of the document memory: "
                             "--target-context-size 1 with --document-memory (training: the "
                             "references; generation: --target-context-file FILE or "
                             "--gold-target-context)")
        prev = encoder_out["mem_tgt_prev_tokens"][0]
        if prev.size(0) == 0:  # no memory sentence (online: only first sentences)
            like = encoder_out["mem_encoder_out"][0]
            empty = like.new_zeros(0, prev.size(1), self.embed_dim)
            return empty, empty, _real_words(prev, self.dictionary)
        mem_enc = {"encoder_out": encoder_out["mem_encoder_out"],
                   "encoder_padding_mask": encoder_out["mem_encoder_padding_mask"]}
        # one row per memory sentence, not beam copies: no "beamable" source attention
        if self.args.context_memory == "frozen":
            with plain_attention(self, _frozen_source(self, "memory_decoder")):
                keys, values = self.frozen_memory_states(encoder_out, prev, mem_enc)
            return keys, values, _real_words(prev, self.dictionary)
        with plain_attention(self):
            x, keys = self._memory_features(self, prev, mem_enc)
        return keys.transpose(0, 1), x, _real_words(prev, self.dictionary)

    def frozen_memory_states(self, encoder_out: Dict[str, List[Tensor]], prev: Tensor,
                             mem_enc: Dict[str, List[Tensor]]) -> Tuple[Tensor, Tensor]:
        """``--context-memory frozen``: keys and values (``S x L x C``) of the
        memory's targets under the frozen sentence-level decoder (eval mode, no
        gradients), decoded on the memory sources' frozen encoder states
        (``mem_enc``). Read from the cache (keyed on the source and the target
        tokens) when the model has one, the misses computed in chunks
        (:meth:`_decode_frozen`); without a cache all are computed in chunks."""
        dec = _frozen_source(self, "memory_decoder")
        real = prev.ne(self.padding_idx)
        enc_states = mem_enc["encoder_out"][0]
        src_pad = mem_enc["encoder_padding_mask"][0]
        cache = self.memory_cache
        with torch.no_grad(), _EvalMode(dec):
            if cache is None:
                keys, values = [], []
                for a, b in _row_chunks(prev.size(0), max(prev.size(1), enc_states.size(0)),
                                        self.memory_chunk_tokens):
                    x, k = self._memory_features(
                        dec, prev[a:b], {"encoder_out": [enc_states[:, a:b]],
                                         "encoder_padding_mask": [src_pad[a:b]]})
                    keys.append(k.transpose(0, 1))
                    values.append(x)
                return torch.cat(keys, 0).detach(), torch.cat(values, 0).detach()
            # (the encoder's validation empties everything: these depend on it too)
            cache.validate("decoder", weights_signature(
                _sentence_level_weights(dec, own=dec is self)), tags=("tgt",))
            # the key: the source tokens (where the encoder states are not padding)
            # and the target tokens
            src = encoder_out["mem_src_tokens"][0]
            if src.shape != src_pad.shape:
                raise RuntimeError("frozen memory: mem_src_tokens do not match the memory's "
                                   "encoder states")
            parts = [encoder_out.get(k, [None])[0] for k in ("mem_src_key", "mem_tgt_key")]
            if all(t is not None for t in parts):  # the collater's digests, on the host
                src_rows, tgt_rows = _host_rows(parts[0]), _host_rows(parts[1])
                keys = [("tgt", a, b, c, d) for (a, b, _), (c, d, _) in zip(src_rows, tgt_rows)]
                src_lens = [h[2] for h in src_rows]
                lens = [h[2] for h in tgt_rows]
            else:
                keys = [("tgt",) + s + t for s, t in zip(
                    row_keys(src.masked_fill(src_pad, -1), -1), row_keys(prev, self.padding_idx))]
                lens = real.sum(1).tolist()
                src_lens = (~src_pad).sum(1).tolist()
            left_src = bool(self.args.left_pad_source)
            left_tgt = bool(getattr(self.args, "left_pad_target", False))
            entries = cache.fetch(
                keys, lens,
                lambda rows: self._decode_frozen(dec, prev, enc_states, src_pad, lens, src_lens,
                                                 left_src, left_tgt, rows),
                self.memory_chunk_tokens)
            return assemble_rows(entries, prev.size(1), left_tgt, enc_states.device,
                                 enc_states.dtype)

    @classmethod
    def _decode_frozen(cls, dec, prev: Tensor, enc_states: Tensor, src_pad: Tensor,
                       lens: List[int], src_lens: List[int], left_src: bool, left_tgt: bool,
                       rows: List[int]) -> Tuple[Tensor, Tensor]:
        """Cache misses: keys and values of memory rows ``rows`` at their real
        target positions (``sum x C`` each), sources and targets trimmed to
        their longest (``lens``/``src_lens``: real tokens per row, on the host)."""
        idx = to_device(torch.tensor(rows, dtype=torch.long), prev.device)
        n = [lens[i] for i in rows]
        tokens = prev.index_select(0, idx)[:, _cut(prev.size(1), max(n), left_tgt)]
        cols = _cut(enc_states.size(0), max(src_lens[i] for i in rows), left_src)
        mem_enc = {"encoder_out": [enc_states.index_select(1, idx)[cols]],
                   "encoder_padding_mask": [src_pad.index_select(0, idx)[:, cols]]}
        x, keys = cls._memory_features(dec, tokens, mem_enc)  # k x w x C
        pos = _real_positions(n, x.size(1), left_tgt, x.device)
        C = x.size(-1)
        return (keys.transpose(0, 1).reshape(-1, C).index_select(0, pos),
                x.reshape(-1, C).index_select(0, pos))

    def extract_features(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]],
                         incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                         full_context_alignment: bool = False,
                         alignment_layer: Optional[int] = None,
                         alignment_heads: Optional[int] = None):
        if self.context_layer is None:
            return self.extract_features_scriptable(
                prev_output_tokens, encoder_out, incremental_state, full_context_alignment,
                alignment_layer, alignment_heads)
        x, extra, query = self._features_and_source_attention(  # query: T x B x C
            self, prev_output_tokens, encoder_out, incremental_state, full_context_alignment,
            alignment_layer, alignment_heads)
        cached = incremental_state.get("selective_doc_memory") if incremental_state is not None \
            else None
        if cached is not None:
            memory = cached["memory"]
        else:
            keys, values, words = self.memory_states(encoder_out)
            layout = [encoder_out.get(k, [None])[0] for k in ("mem_doc_rows", "mem_doc_valid")]
            memory = self.context_layer.project_memory(
                keys, values, words, encoder_out["mem_doc"][0], encoder_out["mem_pos"][0],
                *layout)
            if incremental_state is not None:
                incremental_state["selective_doc_memory"] = {"memory": memory}
        pad_mask = prev_output_tokens.eq(self.padding_idx) if incremental_state is None else None
        r_tilde, info = self.context_layer(
            x.transpose(0, 1), memory, encoder_out["query_doc"][0], encoder_out["query_pos"][0],
            self.online, query=query, query_padding_mask=pad_mask,
            need_weights=self.record_stats,
            return_stats=self.record_stats or self.record_statistics,
            **(_query_layout({k: encoder_out.get(k, [None])[0]
                              for k in ("query_doc_groups", "query_doc_sizes")}, x.size(1), None)
               if incremental_state is None else {}))
        self.last_info = _detached(info)
        return r_tilde.transpose(0, 1), extra


@register_model("transformer_selective_doc")
class TransformerSelectiveDocModel(IterativeDecodingDemo, TransformerModel):
    """Selective attention over the whole document (Maruf et al., 2019); see
    the module docstring. Use with ``--task document_translation
    --document-context online|offline --document-memory`` (decoder
    integration: also ``--target-context-size 1``)."""

    #: ctx-demo trains and compares both integrations by default
    demo_archs = ["transformer_selective_doc", "transformer_selective_doc_dec"]
    #: ctx-demo: stage 1 is the sentence-level transformer (two-stage training, Sec. 2.2)
    demo_stage1 = "transformer"
    #: ctx-bench: whole-document batches through the document task (see ctx_fairseq.cli.bench)
    bench_task_args = ["--document-context", "online", "--document-memory"]

    def bench_setting(self) -> str:
        """ctx-bench's label of what it measures: where the memory comes from
        and whether it is encoded in the timed steps. ctx-bench repeats one
        batch (and warms a cache up before measuring), so a cached frozen
        memory is read from the cache, never encoded, in the figures."""
        a = self.args
        parts = [f"{a.context_integration} integration"]
        if a.context_memory == "frozen":
            how = ("read from the cache (warm)" if self.memory_cache is not None else
                   "encoded without gradients every step (no cache)")
            parts.append(f"frozen memory (the paper's; {how}; no stage-1 checkpoint: "
                         "the frozen copies are of the initial weights)")
        else:
            parts.append("shared memory (computed by the model with gradients; beyond the "
                         "paper)")
        if int(getattr(a, "doc_sentence_distance", 0) or 0):
            parts.append(f"--doc-sentence-distance {a.doc_sentence_distance} (beyond the paper)")
        if getattr(a, "dense_doc_attention", False):
            parts.append("dense attention (beyond the paper)")
        return ", ".join(parts)

    @property
    def uses_target_context(self) -> bool:
        """Only decoder integration reads the target memory (the task warns
        about ``--target-context-size`` otherwise)."""
        return self.args.context_integration == "decoder"

    @property
    def context_layout(self) -> Dict[str, str]:
        """What the task's ``--max-tokens`` counts (``MEMORY_LAYOUTS`` of
        :mod:`ctx_fairseq.data.document_dataset`): the frozen memory is
        encoded by the stage-1 model's copy, apart from the batch's sentences
        (a query that is also a memory row is encoded by both), the shared
        one by the model itself, each sentence once."""
        return {"memory": "separate" if self.args.context_memory == "frozen" else "shared"}

    # ------------------------------------------------------------ ctx-demo hooks
    @classmethod
    def demo_reads_target_context(cls, arch: str) -> bool:
        """Decoder integration reads the target memory: translated by two-pass
        iterative decoding (see ``IterativeDecodingDemo``), the first pass by
        the stage-1 sentence-level model (the paper's initialisation)."""
        return preset(arch).context_integration == "decoder"

    @classmethod
    def demo_task_args(cls, arch: str) -> List[str]:
        args = ["--task", "document_translation", "--document-context", "online",
                "--document-memory"]
        if cls.demo_reads_target_context(arch):
            args += ["--target-context-size", "1"]
        return args

    @classmethod
    def demo_train_args(cls, arch: str) -> List[str]:
        """The paper's model: no sentence-distance bias (``--doc-sentence-distance``
        is beyond the paper; on the toy corpus, whose antecedent is the most
        recent entity, it raises pronoun accuracy from about 80%: see
        examples/selective_attention/README.md)."""
        return cls.demo_task_args(arch)

    @classmethod
    def demo_generate_args(cls, arch: str) -> List[str]:
        return cls.demo_task_args(arch)

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--doc-attention", choices=["hierarchical", "flat-sentence",
                                                        "flat-word"],
                            help="hierarchical (Eq. 3-5) or the flat baselines (Eq. 6)")
        parser.add_argument("--sentence-attn", choices=["sparsemax", "softmax"],
                            help="sentence-level normaliser (Eq. 3; default sparsemax)")
        parser.add_argument("--word-attn", choices=["softmax", "sparsemax"],
                            help="word-level normaliser (Eq. 4): softmax (sparse-soft, "
                                 "default) or sparsemax (sparse-sparse)")
        parser.add_argument("--context-integration", choices=["encoder", "decoder"],
                            help="encoder (monolingual) or decoder (bilingual) context")
        parser.add_argument("--context-memory", choices=["shared", "frozen"],
                            help="memory from this model with gradients (shared) or from the "
                                 "frozen stage-1 model (frozen, the paper's)")
        parser.add_argument("--memory-cache-sentences", type=int, metavar="N",
                            help="--context-memory frozen: keep the frozen model's states of "
                                 "up to N memory sentences (entries; least recently used out) "
                                 "in a cache on the CPU (in the model's precision), so that a "
                                 "sentence is encoded once, not in every batch; 0: no cache "
                                 f"(default {MEMORY_CACHE_SENTENCES})")
        parser.add_argument("--doc-sentence-distance", type=int, metavar="N",
                            help="beyond the paper: learned per-head bias on the sentence-level "
                                 "scores by the signed sentence distance (query - memory "
                                 "position, clipped to [-N, N]), for recency; 0: off, the "
                                 "paper's model (default 0)")
        parser.add_argument("--doc-word-capacity", type=int, metavar="K",
                            help="removed (0 is the only value): the word level is streamed, "
                                 "exact and faster than the capacity was; a checkpoint or "
                                 "command line with K > 0 runs the exact word level, with a "
                                 "warning")
        parser.add_argument("--dense-doc-attention", action="store_true",
                            help="kept for old command lines: the streamed word level weights "
                                 "every sentence by its Eq. 3 weight (0 outside the support), "
                                 "so the selective and dense formulations are one computation")
        parser.add_argument("--freeze-sentence-level", action="store_true",
                            help="stage 2: train only the Document-level Context Layer")
        parser.add_argument("--init-from-sentence-checkpoint", type=str, metavar="PATH",
                            help="stage 2: initialise every parameter whose name and shape "
                                 "match from this sentence-level transformer checkpoint")

    @classmethod
    def build_model(cls, args, task):
        args = to_namespace(args)
        selective_doc_base_architecture(args)
        tcfg = getattr(task, "cfg", None)
        mode = getattr(tcfg, "document_context", None) if tcfg is not None else None
        memory = bool(getattr(tcfg, "document_memory", False)) if tcfg is not None else False
        if tcfg is not None and (mode not in ("online", "offline") or not memory):
            raise ValueError("transformer_selective_doc needs --task document_translation "
                             "--document-context online|offline --document-memory")
        args.document_context_mode = str(mode) if mode is not None else "online"
        if int(getattr(args, "doc_word_capacity", 0) or 0) != 0:
            logger.warning(
                f"--doc-word-capacity {args.doc_word_capacity}: the word level's capacity was "
                "removed; the streamed word level is exact and faster: running it (the model's "
                "parameters are the same)")
            args.doc_word_capacity = 0
        if tcfg is not None and bool(getattr(tcfg, "memory_precomputed", False)):
            if args.context_memory != "frozen":
                raise ValueError(
                    "--memory-precomputed (--max-tokens counts only the batch's own sentences, "
                    "not its document memory) needs --context-memory frozen: a shared memory "
                    "is encoded with gradients in every batch, and --max-tokens would not bound "
                    "it. Use --context-memory frozen or drop --memory-precomputed")
            if int(args.memory_cache_sentences) <= 0:
                logger.warning("--memory-precomputed with --memory-cache-sentences 0: every "
                               "batch encodes its whole document memory (without gradients)")
        args.left_pad_source = bool(getattr(tcfg, "left_pad_source", True))
        args.left_pad_target = bool(getattr(tcfg, "left_pad_target", False))
        if args.context_integration == "decoder" and tcfg is not None and \
                int(getattr(tcfg, "target_context_size", 0)) <= 0:
            raise ValueError("--context-integration decoder needs the target side of the "
                             "document memory: --target-context-size 1")
        if args.context_integration == "decoder" and \
                (getattr(args, "decoder_output_dim", None) or args.decoder_embed_dim) \
                != args.decoder_embed_dim:
            raise ValueError("--context-integration decoder needs --decoder-output-dim equal to "
                             "--decoder-embed-dim (the context layer gates the decoder states)")
        if args.context_integration == "decoder" and \
                float(getattr(args, "decoder_layerdrop", 0) or 0) > 0:
            raise ValueError("--context-integration decoder reads the last decoder layer's source "
                             "attention, which --decoder-layerdrop may drop; use "
                             "--decoder-layerdrop 0")
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return SelectiveDocEncoder(TransformerConfig.from_namespace(args), src_dict,
                                   embed_tokens, args)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return SelectiveDocDecoder(cfg, tgt_dict, embed_tokens, args,
                                   no_encoder_attn=cfg.no_cross_attention)

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        self.args = args
        self.memory_cache: Optional[SentenceStateCache] = None
        size = int(getattr(args, "memory_cache_sentences", MEMORY_CACHE_SENTENCES))
        if args.context_memory == "frozen" and size > 0:
            self.set_memory_cache(SentenceStateCache(size))

    # ------------------------------------------------------------ frozen memory cache
    def set_memory_cache(self, cache: Optional[SentenceStateCache]) -> None:
        """Use ``cache`` (or none) for the frozen memory, e.g.
        ``SentenceStateCache(n, dtype=None)`` to keep states in the model's
        precision. A plain attribute of the model, its encoder and its decoder,
        not a module or buffer: never in the state dict."""
        self.memory_cache = cache
        self.encoder.memory_cache = cache
        self.decoder.memory_cache = cache

    def clear_memory_cache(self) -> None:
        if self.memory_cache is not None:
            self.memory_cache.clear()

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's, and the frozen memory cache is emptied (new weights)."""
        self.clear_memory_cache()
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg,
                                           args=args)
        finally:
            self.clear_memory_cache()

    # ------------------------------------------------------------- two stages
    def sentence_level_parameters(self):
        """Everything except the Document-level Context Layer (and frozen copies)."""
        for name, p in self.named_parameters():
            if ".context_layer." not in f".{name}" and "memory_" not in name:
                yield name, p

    def finish_setup(self, init_path: Optional[str], new_run: bool) -> None:
        """Called by the ``document_translation`` task once the model is built:
        stage-2 initialisation (``init_path``), the frozen memory copies (taken
        after it; a checkpoint being restored overwrites them with its own),
        and ``--freeze-sentence-level``."""
        frozen = self.args.context_memory == "frozen"
        if new_run and frozen and not init_path:
            raise ValueError("--context-memory frozen takes the memory from the stage-1 "
                             "sentence-level model: give --init-from-sentence-checkpoint PATH "
                             "(or use --context-memory shared)")
        if init_path:
            load_sentence_checkpoint(self, init_path)
        if frozen and not self.args.freeze_sentence_level:
            self._make_frozen_copies()
        self.clear_memory_cache()
        if self.args.freeze_sentence_level:
            for _, p in self.sentence_level_parameters():
                p.requires_grad_(False)

    def load_sentence_checkpoint(self, path: str):
        return load_sentence_checkpoint(self, path)

    @staticmethod
    def _frozen_copy(part, layer_attr: str, copy_attr: str):
        """A frozen deep copy of ``part`` (encoder or decoder) without its
        context layer, frozen copy or memory cache. fairseq keys incremental state by an id
        each module draws when built, and ``deepcopy`` copies it: the copy's
        attention modules would share the decoder's buffers, and beam search
        (``reorder_incremental_state_scripting`` visits every submodule) would
        reorder them twice. The copy's modules get fresh ids."""
        attrs = (layer_attr, copy_attr, "memory_cache")
        saved = [getattr(part, a) for a in attrs]
        for a in attrs:
            setattr(part, a, None)
        try:
            frozen = copy.deepcopy(part)
        finally:
            for a, v in zip(attrs, saved):
                setattr(part, a, v)
        for module in frozen.modules():
            if hasattr(module, "init_incremental_state"):
                module.init_incremental_state()
        for p in frozen.parameters():
            p.requires_grad_(False)
        return frozen

    def _make_frozen_copies(self) -> None:
        """Frozen copies of the sentence-level encoder (and decoder, for
        decoder integration) as they are now, for ``--context-memory frozen``;
        the memory cache is emptied."""
        self.clear_memory_cache()
        self.encoder.memory_encoder = self._frozen_copy(self.encoder, "context_layer",
                                                        "memory_encoder")
        if self.args.context_integration == "decoder":
            self.decoder.memory_decoder = self._frozen_copy(self.decoder, "context_layer",
                                                            "memory_decoder")

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, **doc):
        return encode_and_decode(self, src_tokens, src_lengths, prev_output_tokens,
                                 return_all_hiddens, features_only, alignment_layer,
                                 alignment_heads, **doc)

    def context_stats(self) -> Dict[str, Any]:
        """The last forward's context statistics (support sizes, gate)."""
        layer = self.encoder if self.encoder.context_layer is not None else self.decoder
        return layer.last_info or {}

    # ------------------------------------------------------ training statistics
    def _context_part(self):
        return self.encoder if self.encoder.context_layer is not None else self.decoder

    def record_context_statistics(self, enabled: bool = True) -> None:
        """Turn the statistics of the Document-level Context Layer on or off
        (``record_statistics``: ``return_stats`` only, no attention weights).
        They are read from ``last_info``, which every forward pass sets (as
        before: :meth:`context_stats`)."""
        self._context_part().record_statistics = bool(enabled)

    def context_statistics(self) -> Dict[str, Tensor]:
        """``[sum, count]`` of the last recorded forward pass (see the module
        docstring): ``gate``, ``ctx_mass``, ``ctx_frac``, ``sent_support``,
        ``sent_visible`` and, when the attention has a word level
        (hierarchical, flat-word), ``word_support``; hierarchical also
        ``word_overflow``: the share of the counted (token, head) pairs whose
        Eq. 3 support held more sentences than the word level's capacity
        (``--doc-word-capacity``; 0 = the word level was exact), summed on the
        device (``word_overflow_sum``) like the others."""
        part = self._context_part()
        attn = part.context_layer.context_attn
        info = part.last_info or {}
        zero = attn.out_proj.weight.new_zeros((), dtype=torch.float64)

        def get(key: str) -> Tensor:
            v = info.get(key)
            return zero if v is None else v.detach().to(torch.float64).reshape(())

        gate_sum, n_ctx, n_tok = get("gate_sum"), get("gate_tokens"), get("query_tokens")
        n_th = get("num_token_heads")
        stats = OrderedDict([
            ("gate", torch.stack([gate_sum, n_ctx])),
            ("ctx_mass", torch.stack([n_ctx - gate_sum, n_ctx])),
            ("ctx_frac", torch.stack([n_ctx, n_tok])),
            ("sent_support", torch.stack([get("sentence_support_sum"), n_th])),
            ("sent_visible", torch.stack([get("visible_sentences_sum"), n_th])),
        ])
        if attn.uses_words:
            stats["word_support"] = torch.stack([get("word_support_sum"),
                                                 get("num_support_pairs")])
        if attn.attention == "hierarchical":
            stats["word_overflow"] = torch.stack([get("word_overflow_sum"), n_th])
        return stats


# --------------------------------------------------------------------------- presets


_default = set_default


def selective_doc_base_architecture(args):
    _default(args, "doc_attention", "hierarchical")
    _default(args, "sentence_attn", "sparsemax")
    _default(args, "word_attn", "softmax")
    _default(args, "context_integration", "encoder")
    _default(args, "context_memory", "frozen")  # the paper's (Sec. 3.3): the stage-1 model's states
    _default(args, "memory_cache_sentences", MEMORY_CACHE_SENTENCES)
    _default(args, "dense_doc_attention", False)
    _default(args, "doc_word_capacity", WORD_CAPACITY)
    _default(args, "doc_sentence_distance", 0)  # beyond the paper; 0 = off
    _default(args, "freeze_sentence_level", False)
    _default(args, "init_from_sentence_checkpoint", None)
    base_architecture(args)


@register_model_architecture("transformer_selective_doc", "transformer_selective_doc")
def transformer_selective_doc(args):
    selective_doc_base_architecture(args)


@register_model_architecture("transformer_selective_doc", "transformer_selective_doc_dec")
def transformer_selective_doc_dec(args):
    """Decoder (bilingual) integration."""
    _default(args, "context_integration", "decoder")
    selective_doc_base_architecture(args)


@register_model_architecture("transformer_selective_doc", "transformer_selective_doc_tiny")
def transformer_selective_doc_tiny(args):
    tiny_shape(args)
    selective_doc_base_architecture(args)
