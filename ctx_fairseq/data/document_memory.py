"""The document memory of a batch (``--document-memory``): which sentences
each document's queries may see, the shuffled and random ablations of it,
its collation into tokens and index tensors, and its cost in ``--max-tokens``.
A mixin of :class:`ctx_fairseq.data.document_dataset.DocumentContextDataset`,
which holds the documents (``doc_start``, ``doc_len``, ``doc_index``,
``sent_pos``) and the options it reads."""

import logging
from typing import Dict, Optional

import numpy as np
import torch
from fairseq.data import data_utils

from ctx_fairseq.data.memory_index import memory_by_length, query_groups
from ctx_fairseq.errors import InputError

logger = logging.getLogger("ctx_fairseq.data.document_dataset")


class DocumentMemoryMixin:
    """The document-memory methods of the dataset (see the module)."""

    def _memory_donors(self) -> np.ndarray:
        """Document memory, shuffled ablation: for each document the other
        document whose memory stands in for its own, uniform over the
        documents long enough to give every sentence as many visible memory
        sentences as its own document does (online: at least ``n - 1``
        sentences, ``n`` the document's length; offline: at least ``n``),
        the longest other documents where none is; deterministic for the
        seed, independent of batching. A one-sentence document (no sentence
        has context) keeps its own memory, as the per-sentence ablation keeps
        a sentence without context empty; a split of one longer document is
        an error (no other document's memory to give it)."""
        n_docs = len(self.doc_start)
        rng = np.random.default_rng([self.seed % (1 << 63), 7919, 2])
        u = rng.random(n_docs)
        lens = self.doc_len
        need = lens - 1 if self.document_context == "online" else lens
        order = np.argsort(lens, kind="stable")
        sorted_lens = lens[order]
        rank = np.empty(n_docs, dtype=np.int64)
        rank[order] = np.arange(n_docs)
        donor = np.arange(n_docs, dtype=np.int64)
        if n_docs < 2:
            if n_docs and lens[0] > 1:
                # keeping its own memory would report the true context's figures as the
                # ablation's: a wrong number, not a weaker one
                raise InputError(
                    f"--context-ablation shuffled with a document memory gives each document "
                    f"the memory of another, and this split has one document "
                    f"({self.doc_names[0]!r}, {int(lens[0])} sentences): nothing to shuffle; "
                    "use a split of two documents or more, or another ablation")
            return donor
        for d in range(n_docs):
            if lens[d] <= 1:
                continue
            # candidates: order[lo:] (d among them, as its length >= its need)
            lo = int(np.searchsorted(sorted_lens, need[d], side="left"))
            count = n_docs - lo - 1
            if count == 0:  # d alone is long enough: the longest of the others
                lo = int(np.searchsorted(sorted_lens, sorted_lens[-2], side="left"))
                count = n_docs - 1 - lo  # (d is last in the order)
            k = lo + min(int(u[d] * count), count - 1)
            if k >= rank[d]:
                k += 1
            donor[d] = order[k]
        return donor

    # ------------------------------------------------------- document memory
    def memory_rows(self, ids: np.ndarray):
        """The document memory of a batch of sentences ``ids`` (see
        :meth:`collate_memory`): ``(docs, mem)``, the batch's documents in
        order of first appearance and the corpus indices of their memory
        sentences (document by document, in document order)."""
        docs, mem, _ = self._memory_sentences(ids)
        return docs, mem

    def _memory_sentences(self, ids: np.ndarray):
        """``(docs, mem, owner)``: :meth:`memory_rows` and, per memory row,
        the (global) document whose memory it is. Without an ablation a
        document's memory is its own sentences (online: those before the
        batch's last sentence of it; offline: all); ``shuffled``: the same
        number of sentences from the start of its donor document
        (:meth:`_memory_donors`; offline the whole donor), so a query at
        position ``p`` sees the donor's sentences before ``p`` (online) or
        all but the donor's ``p``-th (offline: the model never shows a query
        the memory sentence at its own position)."""
        ids = np.asarray(ids, dtype=np.int64)
        docs = list(dict.fromkeys(self.doc_index[ids].tolist()))
        mem, owner = [], []
        for d in docs:
            n = int(self.doc_len[d])
            if self.document_context == "online":
                n = int(self.sent_pos[ids[self.doc_index[ids] == d]].max())
            src = d
            if self.memory_donor is not None and self.memory_donor[d] != d:
                src = int(self.memory_donor[d])
                n = min(n, int(self.doc_len[src])) if self.document_context == "online" \
                    else int(self.doc_len[src])
            start = int(self.doc_start[src])
            mem.append(np.arange(start, start + n, dtype=np.int64))
            owner.append(np.full(n, d, dtype=np.int64))
        if not mem:
            return docs, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return docs, np.concatenate(mem), np.concatenate(owner)

    def _memory_states(self, ids: np.ndarray, mem: np.ndarray,
                       masked: Optional[np.ndarray] = None):
        """``(mem_state_index, mem_extra_rows, query_mem_row)`` (see
        :meth:`collate_memory`): a memory row shares the encoding of the
        batch's query that is the same sentence, unless the query's source
        was changed by CoWord dropout (``masked``: the memory holds the real
        sentence) or the memory's tokens are random (``random`` ablation)."""
        ids = np.asarray(ids, dtype=np.int64)
        B = len(ids)
        col = np.full(len(mem), -1, dtype=np.int64)
        if len(mem) and B and self.ablation != "random":
            order = np.argsort(ids, kind="stable")
            k = np.clip(np.searchsorted(ids[order], mem), 0, B - 1)
            hit = ids[order][k] == mem
            col = np.where(hit, order[k], -1)
            if masked is not None:
                col = np.where(hit & np.asarray(masked, dtype=bool)[order[k]], -1, col)
        qrow = np.full(B, -1, dtype=np.int64)
        shared = np.flatnonzero(col >= 0)[::-1]
        qrow[col[shared]] = shared  # (the first row of a query when there are several)
        extra = np.flatnonzero(col < 0)
        col[extra] = B + np.arange(len(extra), dtype=np.int64)
        return col, extra.astype(np.int64), qrow

    def _query_window(self, ids: np.ndarray) -> Dict[str, torch.Tensor]:
        """``{"query_window": (B,) long}``: each query's largest visible
        distance in sentences, where its context is sized (a scorer's
        ``context_size`` N for every sentence, or ``sample_context_size``'s
        draw per sentence and epoch, :meth:`context_cap`), the document's
        length where it is not; ``{}`` when no sentence is sized (the paper's
        whole document: the batch is as it was)."""
        caps = [self.context_cap(int(i)) for i in ids]
        if all(c is None for c in caps):
            return {}
        whole = int(self.doc_len.max()) if len(self.doc_len) else 0
        return {"query_window": torch.tensor([whole if c is None else c for c in caps],
                                             dtype=torch.long)}

    def _memory_tokens(self, side: str, j: int) -> torch.Tensor:
        """Memory sentence ``j`` of ``side``; under the ``random`` ablation its
        words replaced by random vocabulary tokens (special symbols kept),
        from a generator seeded by the seed, ``j`` and the side (the
        per-sentence ablation's formula, with the memory sentence's index)."""
        t = self._sentences(side)[int(j)].long()
        if self.ablation != "random":
            return t
        d = self.src_dict if side == "src" else self.tgt_dict
        g = torch.Generator().manual_seed(int(self.seed) * 1_000_003 + int(j) * 2 + (side == "tgt"))
        rand = torch.randint(d.nspecial, len(d), t.shape, generator=g)
        return torch.where(t >= d.nspecial, rand, t)

    def collate_memory(self, ids: np.ndarray, dropped: Optional[np.ndarray] = None,
                       masked: Optional[np.ndarray] = None) -> Dict[str, torch.Tensor]:
        """Document memory inputs of a batch whose rows are sentences ``ids``
        (``dropped``: per row, context dropout took its context; ``masked``:
        CoWord dropout changed its source):

        * ``query_doc`` / ``query_pos`` (``B``): batch-local document number
          (0..D-1, order of first appearance) and position in the document;
          ``-1`` for a query whose context was dropped (no document of the
          memory: it sees no memory sentence, exactly as a document's first
          sentence online, and is translated as by the sentence-level model);
        * ``mem_src_tokens`` (``S x Ls``, padded like the source) and
          ``mem_src_lengths``: every sentence of the batch's documents that a
          query of the batch may see (online: the positions before the
          batch's last sentence of that document; offline: all), each once,
          document by document in document order;
        * ``mem_doc`` / ``mem_pos`` (``S``): their document and position;
        * ``query_mem_row`` (``B``): the memory row that holds the query
          sentence itself (-1 if none), so that a model can encode each
          sentence once;
        * the same as index tensors, so that a model needs no host read:
          ``mem_doc_rows`` / ``mem_doc_valid`` (``D x S_max``, ``S_max`` the
          largest memory of a document, at least 1): the memory rows of
          document ``d`` in position order (0 where not valid);
          ``query_doc_groups`` (``D x Bq_max``, :func:`query_groups`): the
          batch rows of each document's query sentences, padded with ``B``,
          and (numpy, on the host) ``query_doc_sizes``, their numbers (the
          collater adds ``query_doc_tokens``, :func:`query_token_groups`, and
          numpy ``query_doc_token_counts``: the real source tokens of each
          document's queries);
          ``mem_doc_rows_by_len``, ``mem_doc_len_order`` and (numpy, on the
          host) ``mem_doc_span_by_len`` (:func:`memory_by_length`): each
          document's memory sentences longest first and the token columns
          they occupy;
          ``mem_state_index`` (``S``) and ``mem_extra_rows`` (``E``): memory
          row ``s``'s encoder states are column ``mem_state_index[s]`` of the
          batch's query encodings (``0..B-1``) followed by those of the memory
          rows ``mem_extra_rows`` (the memory sentences that are no query of
          the batch, ``B..B+E-1``; also a query's sentence whose source CoWord
          dropout changed, and every row under the ``random`` ablation);

        Ablations (:meth:`_memory_sentences`): ``shuffled``, a document's
        memory rows are its donor document's sentences (``mem_doc`` the
        receiving document, ``mem_pos`` the donor's positions); ``random``,
        the memory sentences' words are random tokens (:meth:`_memory_tokens`).
        * ``mem_src_key`` (and with target memory ``mem_tgt_key``): a numpy
          ``S x 3`` int64 array (not a tensor: it stays on the host when the
          batch moves to the device), a 128-bit digest of each memory
          sentence's tokens
          (:func:`ctx_fairseq.digest.sentence_digest`) and
          its number of tokens: the key of the frozen memory's cache,
          computed here where the tokens are, so that the model looks its
          cache up without reading anything back from the device;
        * ``mem_tgt_tokens`` / ``mem_tgt_lengths`` with target memory (target
          context on): the target side of the same sentences (references, or
          ``tgt_context``), padded like the target, and ``mem_tgt_prev_tokens``
          (the same with ``</s>`` moved to the front, fairseq's teacher-forcing
          input).
        """
        ids = np.asarray(ids, dtype=np.int64)
        docs, mem, owner = self._memory_sentences(ids)
        local = {d: k for k, d in enumerate(docs)}
        query_doc = np.array([local[int(d)] for d in self.doc_index[ids]], dtype=np.int64)
        if dropped is not None:
            query_doc = np.where(np.asarray(dropped, dtype=bool), -1, query_doc)
        state, extra, qrow = self._memory_states(ids, mem, masked)
        out = {
            "query_doc": torch.from_numpy(query_doc),
            "query_pos": torch.from_numpy(self.sent_pos[ids].copy()),
            **self._query_window(ids),
            "mem_doc": torch.tensor([local[int(d)] for d in owner], dtype=torch.long),
            "mem_pos": torch.from_numpy(self.sent_pos[mem].copy()),
            "query_mem_row": torch.from_numpy(qrow),
        }
        valid = self._memory_doc_index(out, query_doc, len(ids), len(docs))
        out["mem_state_index"] = torch.from_numpy(state)
        out["mem_extra_rows"] = torch.from_numpy(extra)
        sides = [("src", self.src_dict, self.left_pad_source)]
        if self.tgt_context_size > 0:
            sides.append(("tgt", self.tgt_dict, self.left_pad_target))
        for side, d, left in sides:
            self._collate_memory_side(out, mem, side, d, left, valid)
        return out

    def _memory_doc_index(self, out: Dict[str, torch.Tensor], query_doc: np.ndarray,
                          n_queries: int, n_docs: int) -> np.ndarray:
        """Adds to ``out`` (which holds ``mem_doc``) the per-document index
        tensors of :meth:`collate_memory`: ``mem_doc_rows`` /
        ``mem_doc_valid`` and ``query_doc_groups`` / ``query_doc_sizes``
        (``n_queries`` the batch's rows); returns the validity mask (numpy),
        which :func:`memory_by_length` reads too."""
        mem_doc = out["mem_doc"].numpy()
        counts = np.bincount(mem_doc, minlength=n_docs) if len(mem_doc) else \
            np.zeros(n_docs, dtype=np.int64)
        starts = np.cumsum(counts) - counts
        s_max = max(1, int(counts.max()) if len(counts) else 1)
        slot = np.arange(s_max)[None, :]
        valid = slot < counts[:, None]
        out["mem_doc_rows"] = torch.from_numpy(np.where(valid, starts[:, None] + slot, 0))
        out["mem_doc_valid"] = torch.from_numpy(valid)
        # the query sentences of each document (D x Bq_max, rows in batch order,
        # padded with B): the selective word level's per-document layout
        groups = query_groups(query_doc, n_docs)
        out["query_doc_groups"] = torch.from_numpy(groups)
        out["query_doc_sizes"] = (groups < n_queries).sum(1)  # numpy: it stays on the host
        return valid

    def _collate_memory_side(self, out: Dict[str, torch.Tensor], mem: np.ndarray, side: str,
                             d, left: bool, valid: np.ndarray) -> None:
        """Adds to ``out`` the tokens of the memory sentences ``mem`` on
        ``side`` (``src`` or ``tgt``, dictionary ``d``, left-padded when
        ``left``) as :meth:`collate_memory` describes them: ``mem_{side}_tokens``,
        ``_lengths`` and ``_key``; on the source side the length-sorted layout
        (:func:`memory_by_length`, which reads ``mem_doc_rows`` and ``valid``),
        on the target side ``mem_tgt_prev_tokens``."""
        from ctx_fairseq.digest import sentence_digest

        seqs = {int(j): self._memory_tokens(side, j) for j in mem.tolist()}
        if len(mem):
            toks = data_utils.collate_tokens([seqs[int(j)].long() for j in mem], d.pad(),
                                             d.eos(), left_pad=left,
                                             pad_to_multiple=self.pad_to_multiple)
        else:
            toks = torch.full((0, 1), d.pad(), dtype=torch.long)
        out[f"mem_{side}_tokens"] = toks
        out[f"mem_{side}_lengths"] = torch.tensor([len(seqs[int(j)]) for j in mem],
                                                  dtype=torch.long)
        if side == "src":
            out.update(memory_by_length(out["mem_doc_rows"].numpy(), valid,
                                        out["mem_src_lengths"].numpy(), toks.size(1), left))
        keys = np.zeros((len(mem), 3), dtype=np.int64)
        for r, j in enumerate(mem.tolist()):
            keys[r, :2] = sentence_digest(np.asarray(seqs[j]))
            keys[r, 2] = len(seqs[j])
        out[f"mem_{side}_key"] = keys
        if side == "tgt":  # teacher-forcing input, as fairseq's prev_output_tokens
            out["mem_tgt_prev_tokens"] = (data_utils.collate_tokens(
                [seqs[int(j)].long() for j in mem], d.pad(), d.eos(), left_pad=left,
                move_eos_to_beginning=True, pad_to_multiple=self.pad_to_multiple)
                if len(mem) else toks.clone())

    def memory_cost(self, ids: np.ndarray) -> int:
        """Padded tokens a batch of sentences ``ids`` gives the model with its
        document memory: the encoder side counts the batch's sentences and the
        memory rows that do not share a query's encoding (``mem_extra_rows``:
        without an ablation, the union of the batch's sentences and its memory
        sentences, each encoded once), the decoder side the targets plus, with
        target memory, the memory's targets. With CoWord dropout (training) a
        query's memory row may be encoded apart from the query (see
        :meth:`collate_memory`): every memory row is counted as extra, the
        bound for any draw. A model that encodes its memory apart from the
        queries (layout ``memory``: ``separate``, a frozen memory) gets every
        memory row counted besides the batch's sentences. With
        ``memory_precomputed`` (a frozen memory the model keeps in a cache and
        encodes, without gradients, only on a cache miss) only the batch's own
        sentences count."""
        ids = np.asarray(ids, dtype=np.int64)
        src = np.asarray(self.base.src_sizes, dtype=np.int64)
        dec = 0
        if self.base.tgt_sizes is not None:
            dec = len(ids) * int(np.asarray(self.base.tgt_sizes)[ids].max())
        if self.memory_precomputed:  # the memory is read from a cache, not encoded here
            return max(len(ids) * int(src[ids].max()), dec)
        _, mem, _ = self._memory_sentences(ids)
        if self.coword_dropout > 0 or self.context_layout["memory"] == "separate":
            extra = np.arange(len(mem))
        else:
            extra = self._memory_states(ids, mem)[1]
        rows = np.concatenate([ids, mem[extra]])
        enc = len(rows) * int(src[rows].max())
        if self.tgt_context_size > 0 and len(mem):
            tl = self._target_sizes()
            dec += len(mem) * int(tl[mem].max())
        return max(enc, dec)
