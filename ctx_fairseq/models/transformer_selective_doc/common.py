"""Constants and helpers of ``transformer_selective_doc`` (the package's
docstring): the batch keys of the document memory, the context layer's
construction, the query layout, aligning and cutting padded states, the
memory's state index and the frozen copies' source."""

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ctx_fairseq.modules.selective_attention import WORD_CAPACITY, DocumentContextLayer
from ctx_fairseq.modules.sentence_cache import to_device


#: ``--length-buckets``: the batch's rows in groups of similar length
#: (:func:`ctx_fairseq.data.memory_index.length_buckets`)
BUCKET_KEYS = ("query_bucket_rows", "query_bucket_restore", "query_bucket_shape",
               "query_bucket_target_index")
MEMORY_KEYS = ("query_doc", "query_pos", "mem_src_tokens", "mem_src_lengths", "mem_doc",
               "mem_pos", "query_mem_row", "mem_tgt_tokens", "mem_tgt_lengths",
               "mem_tgt_prev_tokens", "mem_encoder_out", "mem_encoder_padding_mask",
               "mem_doc_rows", "mem_doc_valid", "mem_state_index", "mem_extra_rows",
               "mem_src_key", "mem_tgt_key", "query_doc_groups", "mem_doc_rows_by_len",
               "mem_doc_len_order", "mem_doc_span_by_len", "query_doc_sizes", "query_doc_tokens",
               "query_doc_token_counts", "query_window") + BUCKET_KEYS
#: follow the beam (one row per query sentence); every other key is per document
QUERY_KEYS = ("query_doc", "query_pos", "query_mem_row", "query_window")
#: index the batch's rows: dropped when the rows are reordered (the beam), after which
#: the word level runs per query sentence
ROW_INDEX_KEYS = ("query_doc_groups", "query_doc_sizes", "query_doc_tokens",
                  "query_doc_token_counts") + BUCKET_KEYS
#: frozen memory: padded tokens per no-grad forward of the frozen model
MEMORY_CHUNK_TOKENS = 8192
#: frozen memory: default number of cache entries (``--memory-cache-sentences``)
MEMORY_CACHE_SENTENCES = 100_000


def context_layer(args, embed_dim: int, heads: int, ffn: int) -> DocumentContextLayer:
    return DocumentContextLayer(
        embed_dim, heads, ffn, attention=args.doc_attention, sentence_attn=args.sentence_attn,
        word_attn=args.word_attn, selective=not args.dense_doc_attention,
        dropout=args.dropout, attention_dropout=args.attention_dropout,
        activation_dropout=getattr(args, "activation_dropout", 0.0) or 0.0,
        activation_fn=getattr(args, "activation_fn", "relu") or "relu",
        sentence_distance=int(getattr(args, "doc_sentence_distance", 0) or 0),
        word_capacity=int(getattr(args, "doc_word_capacity", WORD_CAPACITY) or WORD_CAPACITY))


def init_context_part(part, args, side: str, shape) -> None:
    """What the encoder and the decoder both keep, set in their ``__init__``
    after fairseq's: the model's options, online/offline, the context layer
    where the integration is on this ``side`` (``encoder`` / ``decoder``;
    ``shape``: ``cfg.encoder`` / ``cfg.decoder``), the frozen memory's cache
    (the model's; not a module, so never in the state dict) and the
    recording switches."""
    part.args = args
    part.online = args.document_context_mode == "online"
    part.context_layer = None
    if args.context_integration == side:
        part.context_layer = context_layer(args, shape.embed_dim, shape.attention_heads,
                                           shape.ffn_embed_dim)
    part.memory_cache = None  # Optional[SentenceStateCache]
    part.memory_chunk_tokens = MEMORY_CHUNK_TOKENS
    part.record_stats = False
    #: only the statistics (``return_stats``), not the attention weights: the training
    #: statistics (``TransformerSelectiveDocModel.context_statistics``)
    part.record_statistics = False
    part.last_info = None  # Optional[Dict[str, Tensor]]


def query_layout(doc, T: int, src_width: Optional[int]) -> Dict[str, object]:
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


def real_words(tokens: Tensor, dictionary) -> Tensor:
    """True at real words (not padding, ``</s>`` or ``<s>``)."""
    return tokens.ne(dictionary.pad()) & tokens.ne(dictionary.eos()) & tokens.ne(dictionary.bos())


def align_states(states: Tensor, width: int, left_pad: bool) -> Tensor:
    """``T x N x C`` padded on the left (or right) -> ``width x N x C``."""
    extra = width - states.size(0)
    if extra <= 0:
        return states
    pad = states.new_zeros(extra, states.size(1), states.size(2))
    return torch.cat([pad, states], 0) if left_pad else torch.cat([states, pad], 0)


def real_positions(lengths: List[int], width: int, left_pad: bool, device) -> Tensor:
    """Flat positions (into ``len(lengths) x width``) of each row's ``n``
    real tokens, padded on the left or the right; computed on the host."""
    lens = np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(lens) - lens
    within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(starts, lens)
    if left_pad:
        within += np.repeat(width - lens, lens)
    rows = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    return to_device(torch.from_numpy(rows * width + within), device)


def host_rows(keys) -> List[List[int]]:
    """The collater's ``mem_*_key`` rows (digest, digest, length) as Python
    ints: a numpy array is on the host already (no read); a tensor (inputs
    moved whole to the device) is read back once."""
    return keys.tolist()


def cut_slice(width: int, n: int, left_pad: bool) -> slice:
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


def state_index(query_mem_row: Tensor, S: int) -> Tuple[Tensor, Tensor]:
    """What the collater gives as ``mem_state_index``/``mem_extra_rows``,
    computed from ``query_mem_row`` for inputs built without them (one host
    read per batch), see :func:`memory_state_index`."""
    source, extra = memory_state_index(query_mem_row.cpu().numpy(), S)
    dev = query_mem_row.device
    return torch.from_numpy(source).to(dev), torch.from_numpy(extra).to(dev)


def row_chunks(n: int, width: int, chunk_tokens: int) -> List[Tuple[int, int]]:
    rows = max(1, chunk_tokens // max(1, width))
    return [(a, min(n, a + rows)) for a in range(0, n, rows)]


def sentence_level_weights(module, own: bool):
    """The parameters a frozen memory is computed with: a frozen copy's, or
    (``own``: ``--freeze-sentence-level``) the part's own sentence-level ones."""
    for name, p in module.named_parameters():
        if not own or not (name.startswith("context_layer.") or name.startswith("memory_")):
            yield p


def detached(info: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """The context layer's info, kept for :meth:`context_stats` without its
    autograd graph."""
    return {k: (v.detach() if torch.is_tensor(v) else v) for k, v in info.items()}


def frozen_source(module, copy_name: str):
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


class EvalMode:
    """Run a module in eval mode (no dropout) and restore its mode."""

    def __init__(self, module):
        self.module, self.was = module, module.training

    def __enter__(self):
        self.module.train(False)

    def __exit__(self, *exc):
        self.module.train(self.was)


def length_groups(doc) -> Optional[List[Tuple[Tensor, int, int]]]:
    """The batch's length groups (``--length-buckets``, the collater's
    ``query_bucket_rows``/``query_bucket_shape``): ``(rows, source width,
    target width)`` per group, or None when the batch has no groups or one
    (the batch then runs as it is). The widths are host integers: no read
    from the device."""
    shape, rows = doc.get("query_bucket_shape"), doc.get("query_bucket_rows")
    if shape is None or rows is None or len(shape) < 2:
        return None
    out, start = [], 0
    for count, src_width, tgt_width in np.asarray(shape).tolist():
        out.append((rows[start:start + count], int(src_width), int(tgt_width)))
        start += count
    return out


def ungroup(parts: List[Tensor], batch_dim: int, widths: Dict[int, Tuple[int, bool]],
            restore: Tensor) -> Tensor:
    """Per-group tensors (:func:`length_groups`) back to one batch: each
    padded with zeros along the dimensions ``widths`` (``dim: (full width,
    left-padded)``) to the batch's width, concatenated along ``batch_dim``,
    and put back in batch order (``restore``: the collater's
    ``query_bucket_restore``)."""
    padded = []
    for p in parts:
        spec = [0, 0] * p.dim()
        for dim, (full, left) in widths.items():
            extra = full - p.size(dim)
            k = 2 * (p.dim() - 1 - dim)  # F.pad counts from the last dimension
            spec[k + (0 if left else 1)] = extra
        padded.append(torch.nn.functional.pad(p, spec) if any(spec) else p)
    return torch.cat(padded, batch_dim).index_select(batch_dim, restore)
