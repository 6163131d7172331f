"""The projected document memory of the selective attention (Maruf et al.
2019) and the layouts of its query rows: the padded document index of a
memory (:func:`memory_layout`), the projected keys and values of a batch's
memory (:class:`ProjectedMemory`), and how the queries are grouped for the
word level, per query sentence or per document (:class:`QueryLayout`).
Static shapes; the host-side indices come from the task's collater."""

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["memory_layout", "ProjectedMemory", "QueryLayout"]


def memory_layout(mem_doc: Tensor, mem_pos: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """The padded document index of a memory, computed on the host (one read
    of ``mem_doc``/``mem_pos`` per batch; the task's collater emits the same
    tensors, ``mem_doc_rows``/``mem_doc_valid``, without it): ``(doc_ids (D,)
    sorted, rows D x S_max long, valid D x S_max bool)``; row ``d`` holds the
    memory rows of document ``doc_ids[d]`` in position order (0 where not
    valid). Sentences of a document must be contiguous and in strictly
    increasing position order (checked)."""
    doc = mem_doc.detach().cpu().numpy()
    pos = mem_pos.detach().cpu().numpy()
    S = len(doc)
    if S > 1:
        new_run = doc[1:] != doc[:-1]
        if not bool(((pos[1:] > pos[:-1]) | new_run).all()):
            raise ValueError("memory sentences of a document must be in strictly "
                             "increasing position order (mem_pos)")
        if int(new_run.sum()) + 1 != len(np.unique(doc)):
            raise ValueError("memory sentences of a document must be contiguous (mem_doc)")
    ids, counts = np.unique(doc, return_counts=True)
    s_max = int(counts.max()) if S else 0
    rows = np.zeros((len(ids), s_max), dtype=np.int64)
    valid = np.zeros((len(ids), s_max), dtype=bool)
    slot = np.searchsorted(ids, doc)
    first = {}
    for s, d in enumerate(slot.tolist()):
        first.setdefault(d, s)
        rows[d, s - first[d]] = s
        valid[d, s - first[d]] = True
    dev = mem_doc.device
    return (torch.from_numpy(ids.astype(np.int64)).to(dev), torch.from_numpy(rows).to(dev),
            torch.from_numpy(valid).to(dev))


@dataclass
class ProjectedMemory:
    """Output of :meth:`HierarchicalContextAttention.project_memory`: the
    projected memory of a batch (each sentence once, ``S`` rows) and its
    padded document index.

    ``doc_ids`` (``D``, sorted): the documents; ``doc_rows``/``doc_valid``
    (``D x S_max``): the memory rows of each document in position order and
    which are real; ``pos``/``has_word`` (``S``), ``word_mask`` (``S x L``);
    per head ``k_s``/``v_s`` (``S x H x d_k``), ``k_w``/``v_w``
    (``S x H x L x d_k``), None where the mode does not use them.
    ``num_sentences``/``max_len``: ``S``/``L``."""

    num_sentences: int
    max_len: int
    doc_ids: Tensor
    doc_rows: Tensor
    doc_valid: Tensor
    pos: Tensor
    has_word: Tensor
    word_mask: Tensor
    k_s: Optional[Tensor] = None
    v_s: Optional[Tensor] = None
    k_w: Optional[Tensor] = None
    v_w: Optional[Tensor] = None
    #: optional (the collater's ``mem_doc_rows_by_len``, ``mem_doc_len_order``,
    #: numpy ``mem_doc_span_by_len``): each document's sentences longest first,
    #: so that the per-document word level reads only the columns they occupy
    by_length: Optional[Tuple[Tensor, Tensor, object]] = None

    @property
    def max_sentences(self) -> int:
        """``S_max``: the padded width of the document index (static)."""
        return self.doc_rows.size(1)


class QueryLayout:
    """How the query rows are arranged for the word level: per query sentence
    (``G = B`` groups of ``M = T`` rows, memory sentences ``rows``; incremental
    decoding) or per document (``query_groups`` ``D x Bq``: ``G = D`` groups of
    ``M = Bq T`` rows, memory sentences ``doc_rows``; one matrix product per
    document), there optionally with each document's sentences longest first
    for the word level (``by_length``: rows, their columns in position order,
    host spans). Static shapes; no host read."""

    def __init__(self, T: int, B: int, rows: Tensor, doc_rows: Tensor,
                 query_groups: Optional[Tensor], by_length=None,
                 query_tokens: Optional[Tensor] = None, group_rows=None):
        self.T, self.B = T, B
        self.groups = query_groups
        self.tokens = query_tokens if query_groups is not None else None
        self.group_rows = group_rows if query_groups is not None else None
        self.order = self.rows_by_len = self.spans = None
        if by_length is not None:
            self.rows_by_len, self.order, self.spans = by_length
        if query_groups is None:
            self.index = rows
            return
        self.index = doc_rows
        if self.tokens is not None:  # the real tokens of each document's queries
            D, Mq = self.tokens.shape
            inv = torch.full((B * T + 1,), D * Mq, dtype=torch.long, device=rows.device)
            inv[self.tokens.reshape(-1)] = torch.arange(D * Mq, device=rows.device)
            self.inv = inv[:B * T]  # each (b, t)'s place in the groups (D*Mq: none)
            return
        D, Bq = query_groups.shape
        inv = torch.full((B + 1,), D * Bq, dtype=torch.long, device=rows.device)
        inv[query_groups.reshape(-1)] = torch.arange(D * Bq, device=rows.device)
        self.inv = inv[:B]  # each batch row's place in the groups (D*Bq: none)

    def group(self, x: Tensor, fill) -> Tensor:
        """``B x F x T x E`` -> ``G x F x M x E`` (rows of no sentence: ``fill``)."""
        if self.groups is None:
            return x
        if self.tokens is not None:
            D, Mq = self.tokens.shape
            F, E = x.size(1), x.size(-1)
            flat = x.transpose(1, 2).reshape(self.B * self.T, F, E)
            flat = torch.cat([flat, flat.new_full((1, F, E), fill)])[self.tokens]  # D x Mq x F x E
            return flat.transpose(1, 2)
        D, Bq = self.groups.shape
        pad = x.new_full((1,) + x.shape[1:], fill)
        x = torch.cat([x, pad])[self.groups]  # D x Bq x F x T x E
        return x.transpose(1, 2).reshape(D, x.size(2), Bq * self.T, x.size(-1))

    def ungroup(self, x: Tensor) -> Tensor:
        """``G x F x M x E`` -> ``B x F x T x E`` (a row in no group: 0)."""
        if self.groups is None:
            return x
        if self.tokens is not None:
            D, Mq = self.tokens.shape
            F, E = x.size(1), x.size(-1)
            flat = x.transpose(1, 2).reshape(D * Mq, F, E)
            flat = torch.cat([flat, flat.new_zeros((1, F, E))])[self.inv]  # B*T x F x E
            return flat.view(self.B, self.T, F, E).transpose(1, 2)
        D, Bq = self.groups.shape
        F, E = x.size(1), x.size(-1)
        x = x.reshape(D, F, Bq, self.T, E).transpose(1, 2).reshape(D * Bq, F, self.T, E)
        return torch.cat([x, x.new_zeros((1,) + x.shape[1:])])[self.inv]
