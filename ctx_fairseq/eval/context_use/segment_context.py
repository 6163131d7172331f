"""Context use of segment models (``--doc2doc`` transformers and
``transformer_gtrans``, issue 39): how ``ctx-cxmi`` and
``ctx-score-contrastive`` give such a model its context.

A segment model has no context inputs: what it reads beside a sentence is
the rest of its segment. Both tools score sentence ``i`` as the **last
sentence of a segment** built for it, and compare that with the same
sentence alone (a one-sentence segment, exactly the sentence-level sample)::

    source  c_1 <sep> c_2 <sep> ... c_K <sep> x_i </s>
    target  t_1 <sep> t_2 <sep> ... t_K <sep> y_i </s>

``c_1 .. c_K`` are the K sentences before ``i`` in its document, ``t_1 ..
t_K`` their reference translations, ``<sep>`` the checkpoint's
``--doc2doc-separator`` (the layout of
:class:`~ctx_fairseq.data.segment_dataset.SegmentDataset`). The context part
of the target is a forced prefix: only the tokens of ``y_i </s>`` are scored
(the batch's ``target_prefix_len``, as for the concatenation baseline's
target context; the scorers mask the columns before it).

K, per :class:`~ctx_fairseq.data.conditions.ContextCondition`:

* ``true`` (no size): as many previous sentences of the document as fit with
  the sentence in ``--doc2doc-max-tokens`` on both sides (separators and the
  final ``</s>`` counted, as the segments are planned): the longest segment
  ending at the sentence the model could have been trained on. A size N
  (``previous-N``, ``true@N``; ``ctx-cxmi --context-size N``) keeps at most
  the N nearest of those. A sentence longer than the limit stays alone.
* ``none``: K = 0, the sentence alone.
* ``shuffled``: the previous sentences of another document's position (the
  donor: uniform over the positions of the other documents that have a
  previous sentence, drawn once for the split from the checkpoint's
  ``--seed``; a sentence that has no previous sentence gets none), cut to
  the size and the limit as the true context is, the nearest to the donor
  kept. Both sides come from the donor's document, so source and target
  context stay translations of each other.
* ``random``: the true context's sentences with every token but the
  separators replaced by a random symbol of the dictionary (not a special
  symbol, not the separator), drawn per sentence from the seed; lengths and
  sentence boundaries kept.
* ``window-N`` (a document memory's) is refused.

The choice left open by the issue ("its preceding sentences in the
segment"): a sentence is scored in the segment that ends at it, not in the
greedy segment of the split that happens to hold it, so that every sentence
is scored once, with as much context as the limit allows, and the context
size can be varied.
"""

from typing import List, Optional, Sequence

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils
from fairseq.data.language_pair_dataset import collate as pair_collate

from ctx_fairseq.data.conditions import ContextCondition
from ctx_fairseq.data.contract import task_options
from ctx_fairseq.data.segment_dataset import PairSizes
from ctx_fairseq.errors import InputError

__all__ = ["is_segment_model", "SegmentContextDataset", "segment_condition_dataset",
           "segment_dataset_for", "describe"]


def is_segment_model(task) -> bool:
    """Whether ``task`` translates segments (``--doc2doc greedy|multires``)."""
    spec = task_options(task)
    return str(getattr(spec, "doc2doc", None) or "none") != "none"


def describe(task) -> str:
    """One line: how a segment model is given its context."""
    c = task_options(task)
    return (f"doc2doc segments (--doc2doc {c.doc2doc}): each sentence scored as the last "
            f"sentence of a segment of its previous sentences (at most "
            f"--doc2doc-max-tokens {c.doc2doc_max_tokens} tokens, joined by "
            f"{c.doc2doc_separator}), only its own target tokens counted")


class SegmentContextDataset(PairSizes, FairseqDataset):
    """Every sentence of ``base`` (a ``LanguagePairDataset`` of the split's
    sentences) as the last sentence of a segment of its context (module
    docstring); item ``i`` is sentence ``i``. ``doc_ids``: one document id
    per sentence (contiguous); ``src_sep`` / ``tgt_sep``: the separator's
    index per side; ``max_tokens``: ``--doc2doc-max-tokens``."""

    def __init__(self, base, doc_ids: Sequence[str], src_sep: int, tgt_sep: int,
                 max_tokens: int, condition: ContextCondition = ContextCondition("true"),
                 seed: int = 1, docids_path: str = "<docids>"):
        super().__init__()
        if base.tgt is None:
            raise InputError(f"{docids_path}: the split has no target side; a segment's "
                             "context needs the reference translations of its sentences")
        if base.left_pad_target:
            raise InputError("segment context: the target context is the first part of each "
                             "row; targets must be right-padded (no --left-pad-target)")
        if condition.kind == "window":
            raise InputError(f"context condition {condition}: a window bounds a document "
                             "memory; a segment model's context is its previous sentences "
                             "(previous-k)")
        self.base, self.condition = base, condition
        self.src_sep, self.tgt_sep = int(src_sep), int(tgt_sep)
        self.src_dict, self.tgt_dict = base.src_dict, base.tgt_dict
        self.eos = base.eos
        self.max_tokens, self.seed = int(max_tokens), int(seed)
        self.docids_path = docids_path
        n = len(base)
        if len(doc_ids) != n:
            raise InputError(f"{docids_path}: {len(doc_ids)} document ids for {n} sentences")
        arr = np.asarray([str(d) for d in doc_ids], dtype=object)
        is_start = np.ones(n, dtype=bool)
        if n:
            is_start[1:] = arr[1:] != arr[:-1]
        self.doc_ids = list(arr)
        self.doc_start = np.flatnonzero(is_start).astype(np.int64)
        self.doc_names = [str(x) for x in arr[self.doc_start]]
        self.doc_index = np.cumsum(is_start).astype(np.int64) - 1
        self.sent_pos = np.arange(n, dtype=np.int64) - self.doc_start[self.doc_index]
        self._src_sizes = np.asarray(base.src_sizes, dtype=np.int64)
        self._tgt_sizes = np.asarray(base.tgt_sizes, dtype=np.int64)
        size = 0 if condition.kind == "none" else condition.size
        #: per sentence the position whose previous sentences are its context
        self.donor = self._donors() if condition.kind == "shuffled" else None
        #: per sentence its context sentence ids (oldest first), and whether
        #: the limit (--doc2doc-max-tokens) left out a previous sentence that
        #: the size and the document (or the suite's example) would have given
        fits = [self._fit(i, size) for i in range(n)]
        self.context_ids: List[np.ndarray] = [f[0] for f in fits]
        self.cut_by_limit = np.array([f[1] for f in fits], dtype=bool)
        self.prefix_len = np.array([int(self._tgt_sizes[c].sum()) for c in self.context_ids],
                                   dtype=np.int64)
        ctx_src = np.array([int(self._src_sizes[c].sum()) for c in self.context_ids],
                           dtype=np.int64)
        self.src_sizes = self._src_sizes + ctx_src
        self.tgt_sizes = self._tgt_sizes + self.prefix_len

    # --------------------------------------------------------------- context
    def _donors(self) -> np.ndarray:
        """Per sentence with a previous sentence, a position of another
        document that has one (uniform, seeded); others keep their own."""
        n = len(self.base)
        eligible = np.flatnonzero(self.sent_pos > 0)
        rng = np.random.default_rng([self.seed % (1 << 63), 7919, 39])
        donor = np.arange(n, dtype=np.int64)
        if len(np.unique(self.doc_index[eligible])) < 2:
            raise InputError(f"{self.docids_path}: the shuffled condition takes each "
                             "sentence's context from another document, but fewer than two "
                             "documents have a sentence with a previous one")
        doc_end = np.append(self.doc_start[1:], n)
        lo = np.searchsorted(eligible, self.doc_start[self.doc_index])
        own = np.searchsorted(eligible, doc_end[self.doc_index]) - lo
        others = len(eligible) - own
        pick = np.minimum((rng.random(n) * others).astype(np.int64), others - 1)
        pick = np.where(pick >= lo, pick + own, pick)
        mine = self.sent_pos > 0
        donor[mine] = eligible[pick[mine]]
        return donor

    def _fit(self, i: int, size: Optional[int]):
        """``(ids, cut)``: the context ids of sentence ``i``, the previous
        sentences of its anchor (itself, or its donor), nearest first while
        the segment fits the limit on both sides and there are at most
        ``size``; ``cut``: the limit stopped it."""
        if size == 0 or self.sent_pos[i] == 0:
            return np.zeros(0, dtype=np.int64), False
        a = int(self.donor[i]) if self.donor is not None else i
        first = int(self.doc_start[self.doc_index[a]])
        src, tgt = int(self._src_sizes[i]), int(self._tgt_sizes[i])
        j, cut = a, False
        while j > first and (size is None or a - j < size):
            s, t = src + int(self._src_sizes[j - 1]), tgt + int(self._tgt_sizes[j - 1])
            if max(s, t) > self.max_tokens:
                cut = True
                break
            src, tgt, j = s, t, j - 1
        return np.arange(j, a, dtype=np.int64), cut

    def sentences_with_context(self) -> np.ndarray:
        """Per sentence: does its segment hold a context sentence?"""
        return np.array([len(c) > 0 for c in self.context_ids], dtype=bool)

    def _join(self, parts: List[torch.Tensor], sep: int) -> torch.Tensor:
        out = torch.cat(parts).clone()
        if len(parts) > 1:
            ends = np.cumsum([len(p) for p in parts])[:-1] - 1
            out[torch.from_numpy(ends)] = sep
        return out

    def _randomise(self, seg: torch.Tensor, n_ctx: int, sep: int, d, side: int,
                   index: int) -> torch.Tensor:
        """The first ``n_ctx`` tokens of ``seg`` (the context) made random
        symbols of ``d``, separators kept (``random`` condition)."""
        if n_ctx == 0:
            return seg
        g = np.random.default_rng([self.seed % (1 << 63), int(index), side, 4242])
        pool = np.setdiff1d(np.arange(d.nspecial, len(d)), [sep])
        head = seg[:n_ctx]
        draw = torch.from_numpy(pool[g.integers(0, len(pool), n_ctx)]).to(seg.dtype)
        seg = seg.clone()
        seg[:n_ctx] = torch.where(head.eq(sep), head, draw)
        return seg

    def __getitem__(self, index):
        ids = self.context_ids[index].tolist() + [int(index)]
        items = [self.base[j] for j in ids]
        src = self._join([it["source"] for it in items], self.src_sep)
        tgt = self._join([it["target"] for it in items], self.tgt_sep)
        if self.condition.kind == "random":
            n_src = int(src.numel() - self._src_sizes[index])
            src = self._randomise(src, n_src, self.src_sep, self.src_dict, 0, index)
            tgt = self._randomise(tgt, int(self.prefix_len[index]), self.tgt_sep,
                                  self.tgt_dict, 1, index)
        return {"id": int(index), "source": src, "target": tgt,
                "prefix_len": int(self.prefix_len[index])}

    def __len__(self):
        return len(self.base)

    def collater(self, samples, pad_to_length=None):
        if not samples:
            return {}
        b = self.base
        batch = pair_collate(samples, pad_idx=self.src_dict.pad(), eos_idx=self.eos,
                             left_pad_source=b.left_pad_source, left_pad_target=False,
                             input_feeding=b.input_feeding, pad_to_length=pad_to_length,
                             pad_to_multiple=getattr(b, "pad_to_multiple", 1))
        by_id = {int(s["id"]): s for s in samples}
        batch["target_prefix_len"] = torch.tensor(
            [by_id[i]["prefix_len"] for i in batch["id"].tolist()], dtype=torch.long)
        return batch

    # ----------------------------------------------------------------- sizes
    @property
    def _tgt(self):  # (PairSizes' name for the target lengths)
        return self.tgt_sizes

    def ordered_indices(self):
        order = np.arange(len(self), dtype=np.int64)
        order = order[np.argsort(self.tgt_sizes[order], kind="mergesort")]
        return order[np.argsort(self.src_sizes[order], kind="mergesort")]

    def filter_indices_by_size(self, indices, max_sizes):
        return data_utils.filter_paired_dataset_indices_by_size(
            self.src_sizes, self.tgt_sizes, indices, max_sizes)

    @property
    def supports_prefetch(self):
        return False


def segment_dataset_for(task, base, doc_ids: Sequence[str], docids_path: str,
                        condition: Optional[ContextCondition] = None,
                        generation: bool = False) -> SegmentContextDataset:
    """A :class:`SegmentContextDataset` of a segment model's task over the
    sentence pairs ``base``; ``generation`` (generative accuracy) is
    refused: the context's translation would be a forced prefix of the
    segment decoder, which the document task's segment generation does not
    take."""
    if generation:
        raise InputError("a segment model (--doc2doc) is scored with its context by "
                         "ctx-score-contrastive and ctx-cxmi; generative accuracy (decoding "
                         "the last sentence after a forced context prefix) is not supported "
                         "for it")
    c = task_options(task)
    if c is None or c.doc2doc_separator is None:
        raise InputError("not a segment model: its task has no --doc2doc")
    sep = c.doc2doc_separator
    src_sep, tgt_sep = task.source_dictionary.index(sep), task.target_dictionary.index(sep)
    if src_sep == task.source_dictionary.unk() or tgt_sep == task.target_dictionary.unk():
        raise InputError(f"--doc2doc-separator {sep!r} is not in the checkpoint's dictionaries")
    seed = int(getattr(c, "seed", 1) or 1)
    return SegmentContextDataset(base, doc_ids, src_sep, tgt_sep, int(c.doc2doc_max_tokens),
                                 condition or ContextCondition("true"), seed=seed,
                                 docids_path=docids_path)


def segment_condition_dataset(task, split: str,
                              condition: ContextCondition) -> SegmentContextDataset:
    """Split ``split`` of a segment model (loaded if it is not) under a
    context condition: the sentence pairs of the task's segment dataset, the
    document ids read again from its ``.docids`` (a training split's
    multi-resolution segments hold a sentence more than once)."""
    from ctx_fairseq.data.docids import read_docids

    if split not in task.datasets:
        task.load_dataset(split)
    ds = task.datasets[split]
    base = getattr(ds, "base", ds)
    path = getattr(ds, "docids_path", None)
    if path is None:
        raise InputError(f"split {split!r}: no document ids (a segment model's split is "
                         "loaded with its .docids)")
    return segment_dataset_for(task, base, read_docids(path, expected=len(base)), path,
                               condition)
