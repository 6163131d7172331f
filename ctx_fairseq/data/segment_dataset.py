"""The ``--doc2doc`` dataset: segments of consecutive sentences
(:mod:`ctx_fairseq.data.segments`) built on the fly from the split's
sentence-level ``LanguagePairDataset`` (the binaries as fairseq-preprocess
wrote them; nothing is re-binarized).

Layout of segment ``i`` (sentences ``s_1 .. s_n``)::

    source  x_1 <sep> x_2 <sep> ... x_n </s>
    target  y_1 <sep> y_2 <sep> ... y_n </s>

each sentence's own ``</s>`` replaced by the separator but the last's, so a
segment's length is the sum of its sentences' sizes and a one-sentence
segment is exactly the sentence-level sample. Batches are fairseq's
(:func:`fairseq.data.language_pair_dataset.collate`): ``net_input`` holds
``src_tokens`` (left-padded as fairseq pads), ``src_lengths`` and
``prev_output_tokens`` (fairseq's shift: ``</s> y_1 <sep> ... y_n``), and
nothing else; ``id`` is the segment's index, :meth:`SegmentDataset.sentence_ids`
maps it back to the corpus sentence ids.

Sizes, ``num_tokens`` (the longer side), ``ordered_indices`` (shuffled,
then sorted by target and source length, as ``LanguagePairDataset`` does)
and the size filter are the segments'. Segments longer than the model's
positions are refused by :func:`check_positions` when the split is loaded,
never truncated.
"""

from typing import Optional, Sequence

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils
from fairseq.data.language_pair_dataset import collate as pair_collate

from ctx_fairseq.data.segments import SegmentPlan, segment_lengths
from ctx_fairseq.errors import InputError

__all__ = ["PairSizes", "SegmentDataset", "check_positions", "find_symbol"]


class PairSizes:
    """fairseq's size methods of a dataset of sentence pairs whose lengths
    are ``self.src_sizes`` and ``self._tgt`` (arrays; the target's zeros
    without targets): a batch's cost is its longer side."""

    def num_tokens(self, index):
        return int(max(self.src_sizes[index], self._tgt[index]))

    def num_tokens_vec(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        return np.maximum(self.src_sizes[indices], self._tgt[indices])

    def size(self, index):
        return (int(self.src_sizes[index]), int(self._tgt[index]))

    @property
    def sizes(self):
        return np.vstack((self.src_sizes, self._tgt)).T


class SegmentDataset(PairSizes, FairseqDataset):
    """Segments of ``plan`` over the sentence pairs ``base``; ``src_sep`` /
    ``tgt_sep``: the separator's index in each dictionary; ``doc_names``:
    the split's document names (in order of appearance), ``docids_path``
    the file they were read from (for messages)."""

    def __init__(self, base, plan: SegmentPlan, src_sep: int, tgt_sep: int,
                 doc_names: Sequence[str], docids_path: str = "<docids>"):
        super().__init__()
        self.base, self.plan = base, plan
        self.src_sep, self.tgt_sep = int(src_sep), int(tgt_sep)
        self.src_dict, self.tgt_dict = base.src_dict, base.tgt_dict
        self.eos = base.eos
        self.doc_names = list(doc_names)
        self.docids_path = docids_path
        self.src_sizes = segment_lengths(plan, base.src_sizes)
        self.tgt_sizes = (segment_lengths(plan, base.tgt_sizes)
                          if base.tgt_sizes is not None else None)
        self._tgt = self.tgt_sizes if self.tgt_sizes is not None else \
            np.zeros(len(plan), dtype=np.int64)

    # ----------------------------------------------------------------- items
    def sentence_ids(self, index: int) -> np.ndarray:
        """The corpus sentence ids of segment ``index``, in order."""
        return self.plan.sentence_ids(index)

    @property
    def doc_index(self) -> np.ndarray:
        """The document (index into :attr:`doc_names`) of each segment."""
        return self.plan.doc

    def _join(self, parts, sep: int, eos: int, side: str, index: int) -> torch.Tensor:
        for j, p in zip(self.sentence_ids(index), parts):
            if p.numel() == 0 or int(p[-1]) != eos:
                raise ValueError(f"{side} sentence {int(j)} does not end with </s>: segments "
                                 "need the binarized sentences as fairseq-preprocess wrote "
                                 "them")
        out = torch.cat(parts)
        if len(parts) > 1:
            ends = np.cumsum([len(p) for p in parts])[:-1] - 1
            out[torch.from_numpy(ends)] = sep
        return out

    def __getitem__(self, index):
        items = [self.base[int(j)] for j in self.sentence_ids(index)]
        out = {"id": index,
               "source": self._join([it["source"] for it in items], self.src_sep,
                                    self.src_dict.eos(), "source", index),
               "target": None}
        if self.base.tgt is not None:
            out["target"] = self._join([it["target"] for it in items], self.tgt_sep,
                                       self.tgt_dict.eos(), "target", index)
        return out

    def __len__(self):
        return len(self.plan)

    def collater(self, samples, pad_to_length=None):
        b = self.base
        return pair_collate(samples, pad_idx=self.src_dict.pad(), eos_idx=self.eos,
                            left_pad_source=b.left_pad_source,
                            left_pad_target=b.left_pad_target,
                            input_feeding=b.input_feeding, pad_to_length=pad_to_length,
                            pad_to_multiple=getattr(b, "pad_to_multiple", 1))

    # ----------------------------------------------------------------- sizes

    def ordered_indices(self):
        if self.base.shuffle:
            indices = np.random.permutation(len(self)).astype(np.int64)
        else:
            indices = np.arange(len(self), dtype=np.int64)
        if self.tgt_sizes is not None:
            indices = indices[np.argsort(self.tgt_sizes[indices], kind="mergesort")]
        return indices[np.argsort(self.src_sizes[indices], kind="mergesort")]

    def filter_indices_by_size(self, indices, max_sizes):
        return data_utils.filter_paired_dataset_indices_by_size(
            self.src_sizes, self.tgt_sizes, indices, max_sizes)

    @property
    def supports_prefetch(self):
        return False


def check_positions(ds: SegmentDataset, max_source: Optional[int], max_target: Optional[int],
                    split: str) -> None:
    """A segment longer than the model's positions is refused (one line
    naming the segment, its document, its sentences and its length); never
    truncated."""
    for side, sizes, limit in (("source", ds.src_sizes, max_source),
                               ("target", ds.tgt_sizes, max_target)):
        if sizes is None or limit is None or not len(sizes):
            continue
        over = np.flatnonzero(sizes > int(limit))
        if len(over):
            i = int(over[0])
            ids = ds.sentence_ids(i)
            raise InputError(
                f"{split}: segment {i} (document {ds.doc_names[ds.plan.doc[i]]!r} of "
                f"{ds.docids_path}, sentences {ids[0]}-{ids[-1]}) has {int(sizes[i])} {side} "
                f"tokens, more than --max-{side}-positions {limit} ({len(over)} such "
                f"segment(s)); segments are never truncated: raise the positions, or lower "
                "--doc2doc-max-tokens (a single sentence that long is too long for the model "
                "at all)")


def check_segments_fit_batches(ds: "SegmentDataset", max_tokens: Optional[int],
                               skip_invalid: bool = False) -> None:
    """A batch of ``max_tokens`` must hold every segment it is given:

    * ``max_tokens`` below the plan's own limit (``--doc2doc-max-tokens``)
      with a segment over it is a configuration error, always refused (fairseq
      would assert, or, where it filters by size, skip a share of the split:
      a training set or a translation with segments missing);
    * otherwise only a single sentence longer than the limit (a segment alone)
      can exceed ``max_tokens``: refused where fairseq would assert (no
      size filter: validation and generation without
      ``--skip-invalid-size-inputs-valid-test``), left to fairseq's filter
      (skipped with its warning, as for sentence-level data) where it filters
      (``skip_invalid``: training, or that option).

    The error is one line naming the longest such segment, its document and
    sentences, and the value to set."""
    if max_tokens is None or not len(ds):
        return
    cost = ds.num_tokens_vec(np.arange(len(ds)))
    over = np.flatnonzero(cost > int(max_tokens))
    if not len(over) or (skip_invalid and int(max_tokens) >= ds.plan.max_tokens):
        return
    i = int(over[np.argmax(cost[over])])
    ids = ds.sentence_ids(i)
    raise InputError(
        f"--max-tokens {max_tokens} (--max-tokens-valid in validation) cannot hold segment "
        f"{i} (document {ds.doc_names[ds.plan.doc[i]]!r} of {ds.docids_path}, sentences "
        f"{ids[0]}-{ids[-1]}): {int(cost[i])} tokens on its longer side ({len(over)} "
        f"segment(s) over it); doc2doc segments reach --doc2doc-max-tokens "
        f"{ds.plan.max_tokens} (a single longer sentence is a segment alone): set the batch "
        f"size to at least {int(cost.max())} tokens")


def find_symbol(dataset, symbol: int) -> Optional[int]:
    """The first sentence of an indexed dataset (one side of the binaries)
    that holds token ``symbol``, or None."""
    buf = getattr(dataset, "_bin_buffer", None)
    index = getattr(dataset, "_index", None)
    if buf is not None and index is not None:  # fairseq's mmap format: one pass over the file
        tokens = np.frombuffer(buf, dtype=index.dtype)
        hits = np.flatnonzero(tokens == symbol)
        if not len(hits):
            return None
        starts = np.asarray(index._pointers, dtype=np.int64) // index.dtype().itemsize
        return int(np.searchsorted(starts, hits[0], side="right") - 1)
    for j in range(len(dataset)):
        if bool((dataset[j] == symbol).any()):
            return j
    return None
