"""fairseq-interactive with document context: the view of the document
dataset that the task's ``build_dataset_for_inference`` hands fairseq
(:class:`InteractiveDocumentView`) and the document read so far
(:class:`InteractiveDocumentState`)."""

from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np
import torch
from fairseq.data import FairseqDataset

from ctx_fairseq.data.document_dataset import DocumentContextDataset

__all__ = ["InteractiveDocumentView", "InteractiveDocumentState"]


class InteractiveDocumentView(FairseqDataset):
    """One ``fairseq-interactive`` buffer seen through the document's dataset.

    ``full`` is a :class:`DocumentContextDataset` over the previous sentences
    of the current document (kept from earlier buffers) followed by this
    buffer's non-blank lines; item ``i`` of the view is buffer line ``i``
    (``line_to_full[i]`` in ``full``; -1 for a blank line, which only ends a
    document and is never batched). Ids are buffer-local, as
    fairseq-interactive expects."""

    def __init__(self, full: DocumentContextDataset, line_to_full: np.ndarray):
        super().__init__()
        self.full = full
        self.line_to_full = np.asarray(line_to_full, dtype=np.int64)
        self.full_to_line = {int(f): i for i, f in enumerate(self.line_to_full) if f >= 0}

    def __len__(self):
        return len(self.line_to_full)

    def __getitem__(self, i):
        item = self.full[int(self.line_to_full[i])]
        item["id"] = i
        return item

    def collater(self, samples, pad_to_length=None):
        full = [dict(s, id=int(self.line_to_full[s["id"]])) for s in samples]
        batch = self.full.collater(full)
        if batch:
            batch["id"] = torch.tensor([self.full_to_line[int(f)] for f in batch["id"].tolist()])
        return batch

    def _map(self, indices):
        return self.line_to_full[np.asarray(indices, dtype=np.int64)].astype(np.int64)

    def _back(self, full_indices):
        return np.array([self.full_to_line[int(f)] for f in full_indices], dtype=np.int64)

    def num_tokens(self, i):
        return self.full.num_tokens(int(self.line_to_full[i]))

    def num_tokens_vec(self, indices):
        return self.full.num_tokens_vec(self._map(indices))

    def size(self, i):
        return self.full.size(int(self.line_to_full[i]))

    @property
    def sizes(self):
        if self.full is None:
            return np.zeros(len(self), dtype=np.int64)
        return self.full.sizes[np.maximum(self.line_to_full, 0)]

    def ordered_indices(self):
        return np.flatnonzero(self.line_to_full >= 0).astype(np.int64)

    def filter_indices_by_size(self, indices, max_sizes):
        if len(indices) == 0:
            return np.asarray(indices, dtype=np.int64), []
        kept, ignored = self.full.filter_indices_by_size(self._map(indices), max_sizes)
        return self._back(kept), list(self._back(ignored))

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None,
                      required_batch_size_multiple=1):
        if len(indices) == 0:
            return []
        batches = self.full.batch_by_size(self._map(indices), max_tokens=max_tokens,
                                          max_sentences=max_sentences,
                                          required_batch_size_multiple=required_batch_size_multiple)
        return [self._back(b) for b in batches]

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return False

    def set_epoch(self, epoch):
        pass


class InteractiveDocumentState:
    """What ``fairseq-interactive`` needs between buffers: the source
    sentences of the current document, the model's translations of them (for
    target context), a document counter, and the batches expected next (in
    the order fairseq-interactive runs them)."""

    def __init__(self, keep: Optional[int]):
        self.keep = keep  # sentences of context to keep (None: the whole document)
        self.src: List[torch.Tensor] = []
        self.hyp: List[Optional[torch.Tensor]] = []
        self.doc = 0
        self.positions: Dict[int, int] = {}
        self.expected: Deque[Tuple[InteractiveDocumentView, np.ndarray]] = deque()

    def trim(self):
        if self.keep is not None and len(self.src) > self.keep:
            self.src, self.hyp = self.src[-self.keep:], self.hyp[-self.keep:]
