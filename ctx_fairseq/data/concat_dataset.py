"""Concatenation baseline (Tiedemann and Scherrer 2017): the context sentences
are prepended to the sentence itself, for any sentence-level architecture.

:class:`ConcatContextDataset` wraps the task's
:class:`~ctx_fairseq.data.document_dataset.DocumentContextDataset` (built with
the break symbol as context separator), so the context sentences are chosen,
cut and ablated exactly as for the context models:

* source: ``c_1 <brk> c_2 <brk> ... c_N <brk> x </s>`` (``N`` = the previous
  ``--source-context-size`` sentences of the document; none for the first);
* target, ``--target-context-size M > 0`` (the "2-to-2" variant):
  ``t_1 <brk> ... t_M <brk> y </s>``; with ``M = 0`` ("2-to-1"): ``y </s>``.

``net_input`` holds only ``src_tokens``, ``src_lengths`` and
``prev_output_tokens``: the model is a plain sentence-level model. Outside
``net_input`` a batch has ``target_prefix_len`` (per row, the target context
tokens including their breaks), so that a criterion can weight the context
part of the loss and the contrastive scorer scores the current sentence only.

Generation (``generation=True``, the split ``fairseq-generate`` translates):
``target`` is the current sentence alone (what BLEU is computed against) and
``target_prefix`` (right-padded with ``<pad>``) is the target context with its
breaks, which the task forces as the decoder's prefix and strips from the
hypotheses.

Lengths: the concatenated sequence must fit the model's positions, so each
sentence's context is cut (nearest sentences kept, as
:func:`~ctx_fairseq.data.windows.truncate_windows` does) to the room
its own sentence leaves: ``max_source_positions - len(x)`` on the source side;
on the target side ``max_target_positions - len(y)`` in training and
``max_target_positions // 2`` at generation (the hypothesis's length is not
known; the reference's is not used). Sizes and ``num_tokens`` are the
concatenated lengths, so ``--max-tokens`` bounds what the model processes.
"""

from typing import Dict, List, Optional

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils
from fairseq.data.language_pair_dataset import collate as pair_collate


class ConcatContextDataset(FairseqDataset):
    def __init__(self, inner, brk: int, generation: bool = False):
        super().__init__()
        self.inner, self.brk, self.generation = inner, int(brk), bool(generation)
        self.base = inner.base
        self.src_dict, self.tgt_dict = inner.src_dict, inner.tgt_dict
        self.eos = inner.eos
        if inner.separator != self.brk:
            raise ValueError("the context dataset must separate sentences with the break symbol")
        if inner.base.left_pad_target:
            raise ValueError("--concat-context needs right-padded targets (the target context "
                             "is the first part of each row); do not set --left-pad-target")
        self.target_side = "tgt" in inner.windows
        src = np.asarray(self.base.src_sizes, dtype=np.int64)
        self._src_len = src + inner.context_length["src"] if "src" in inner.windows else src
        tgt = np.asarray(self.base.tgt_sizes, dtype=np.int64) if self.base.tgt_sizes is not None \
            else np.zeros(len(src), dtype=np.int64)
        self._tgt_only = tgt
        self._no_prefix = np.zeros(len(src), dtype=np.int64)
        self._tgt_len = tgt + (0 if generation else self._prefix_len)

    @property
    def _prefix_len(self) -> np.ndarray:
        """Per sentence the target context tokens with their breaks (the
        inner dataset's, kept up to date by :meth:`set_target_context`)."""
        return self.inner.context_length["tgt"] if self.target_side else self._no_prefix

    # ----------------------------------------------------------------- items
    def _with_break(self, ctx: torch.Tensor) -> torch.Tensor:
        """``c_1 <brk> ... c_N </s>`` (the context dataset's form) ->
        ``c_1 <brk> ... c_N <brk>``."""
        if ctx.numel() == 0:
            return ctx
        ctx = ctx.clone()
        ctx[-1] = self.brk
        return ctx

    def __getitem__(self, index):
        item = self.inner[index]
        out = {"id": index}
        src = item["source"]
        if "src_ctx" in item:
            src = torch.cat([self._with_break(item["src_ctx"]), src])
        out["source"] = src
        prefix = self._with_break(item["tgt_ctx"]) if "tgt_ctx" in item else \
            torch.empty(0, dtype=torch.long)
        tgt = item.get("target")
        if self.generation:
            out["target"] = tgt
            out["target_prefix"] = prefix
        elif tgt is not None:
            out["target"] = torch.cat([prefix, tgt])
        out["prefix_len"] = int(prefix.numel())
        return out

    def __len__(self):
        return len(self.inner)

    def collater(self, samples, pad_to_length=None):
        if not samples:
            return {}
        b = self.inner.base
        batch = pair_collate(samples, self.src_dict.pad(), self.eos,
                             left_pad_source=b.left_pad_source, left_pad_target=b.left_pad_target,
                             input_feeding=b.input_feeding, pad_to_length=pad_to_length,
                             pad_to_multiple=getattr(b, "pad_to_multiple", 1))
        if not batch:
            return batch
        by_id = {int(s["id"]): s for s in samples}
        ordered = [by_id[i] for i in batch["id"].tolist()]
        batch["target_prefix_len"] = torch.tensor([s["prefix_len"] for s in ordered],
                                                  dtype=torch.long)
        if self.generation:
            batch["target_prefix"] = data_utils.collate_tokens(
                [s["target_prefix"] for s in ordered], self.tgt_dict.pad(), self.eos,
                left_pad=False, pad_to_length=1)
        ids = batch["id"].numpy()
        batch["doc_index"] = torch.from_numpy(self.inner.doc_index[ids])
        batch["sent_pos"] = torch.from_numpy(self.inner.sent_pos[ids])
        return batch

    # ----------------------------------------------------------------- sizes
    def num_tokens(self, index):
        return int(max(self._src_len[index], self._tgt_len[index]))

    def num_tokens_vec(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        return np.maximum(self._src_len[indices], self._tgt_len[indices])

    def size(self, index):
        return (int(self._src_len[index]), int(self._tgt_len[index]))

    @property
    def sizes(self):
        return np.stack([self._src_len, self._tgt_len], axis=1)

    def ordered_indices(self):
        order = (np.random.permutation(len(self)) if self.base.shuffle
                 else np.arange(len(self), dtype=np.int64))
        if self.inner.document_batching:
            return self.inner.ordered_indices()
        return order[np.argsort(self.num_tokens_vec(order), kind="mergesort")]

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None,
                      required_batch_size_multiple=1):
        if self.inner.document_batching:  # whole documents, in order (sequential generation)
            from ctx_fairseq.data.batching import document_batches

            parts = np.stack([self._src_len[indices], np.zeros(len(indices), np.int64),
                              self._tgt_len[indices], np.zeros(len(indices), np.int64)], axis=1)
            return document_batches(np.asarray(indices), self.inner.doc_index, parts,
                                    max_tokens, max_sentences, sides=((0,), (2,)))
        return super().batch_by_size(indices, max_tokens=max_tokens, max_sentences=max_sentences,
                                     required_batch_size_multiple=required_batch_size_multiple)

    def filter_indices_by_size(self, indices, max_sizes):
        return data_utils.filter_paired_dataset_indices_by_size(
            self._src_len, self._tgt_len, indices, max_sizes)

    @property
    def supports_prefetch(self):
        return False

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return self.inner.can_reuse_epoch_itr_across_epochs

    def set_epoch(self, epoch):
        self.inner.set_epoch(epoch)

    # --------------------------------------------------------- for the task
    @property
    def doc_index(self):
        return self.inner.doc_index

    @property
    def document_batching(self):
        return self.inner.document_batching

    @property
    def truncation(self):
        return self.inner.truncation

    @property
    def max_context_tokens(self):
        return self.inner.max_context_tokens

    @property
    def doc_start(self):
        return self.inner.doc_start

    @property
    def doc_names(self):
        return self.inner.doc_names

    @property
    def docids_path(self):
        return self.inner.docids_path

    @property
    def sent_pos(self):
        return self.inner.sent_pos

    def refresh(self) -> None:
        """After the inner dataset's target context was replaced."""
        self.inner.refresh_context_lengths()
        if self.target_side and not self.generation:
            self._tgt_len = self._tgt_only + self._prefix_len

    def set_target_context(self, index: int, tokens: torch.Tensor) -> np.ndarray:
        """One target context sentence changed (e.g. the model's own
        translation of sentence ``index``): the inner dataset's
        :meth:`~ctx_fairseq.data.document_dataset.DocumentContextDataset.set_target_context`,
        and the lengths of the sentences whose context it is; O(context size)."""
        changed = self.inner.set_target_context(index, tokens)
        if self.target_side and not self.generation and len(changed):
            self._tgt_len[changed] = self._tgt_only[changed] + self._prefix_len[changed]
        return changed


def concat_limits(base, max_source_positions: Optional[int], max_target_positions: Optional[int],
                  generation: bool) -> Dict[str, Optional[np.ndarray]]:
    """Per-sentence context limits that leave each sentence room for itself
    (module docstring)."""
    out: Dict[str, Optional[np.ndarray]] = {"src": None, "tgt": None}
    if max_source_positions is not None:
        src = np.asarray(base.src_sizes, dtype=np.int64)
        out["src"] = np.maximum(int(max_source_positions) - src, 0)
    if max_target_positions is not None:
        if generation or base.tgt_sizes is None:
            out["tgt"] = np.full(len(base), int(max_target_positions) // 2, dtype=np.int64)
        else:
            tgt = np.asarray(base.tgt_sizes, dtype=np.int64)
            out["tgt"] = np.maximum(int(max_target_positions) - tgt, 0)
    return out


def strip_prefix(hypos: List[List[dict]], prefix_len: List[int], len_penalty: float = 1.0,
                 normalize: bool = True) -> List[List[dict]]:
    """Hypotheses of a forced target prefix, with the prefix removed: tokens,
    positional scores, attention and alignment of the current sentence only
    (alignment target positions shifted back by the prefix; source positions
    count the concatenated source, as the printed ``S-`` line); the score
    recomputed over those tokens (length-normalised as the generator does)
    and each row re-sorted by it. The beam search itself ranked whole
    sequences, prefix included (see docs/concatenation.md). The new scores are
    summed on the hypotheses' device and read back once for the batch (not
    once per hypothesis)."""
    out, stripped = [], []
    for row, p in zip(hypos, prefix_len):
        new_row = []
        for h in row:
            h = dict(h)
            if p > 0:
                h["tokens"] = h["tokens"][p:]
                h["positional_scores"] = h["positional_scores"][p:]
                att = h.get("attention")
                if torch.is_tensor(att) and att.dim() == 2:
                    h["attention"] = att[:, p:]
                h["alignment"] = _shift_alignment(h.get("alignment"), p)
                stripped.append(h)
            new_row.append(h)
        out.append(new_row)
    if not stripped:
        return out
    totals = torch.stack([h["positional_scores"].sum() for h in stripped]).tolist()
    key = {}  # the score as the float32 tensor holds it (what the rows are sorted by)
    for h, total in zip(stripped, totals):
        n = max(1, int(h["tokens"].numel()))
        score = total / (n ** len_penalty) if normalize else total
        h["score"] = torch.tensor(score)
        key[id(h)] = float(np.float32(score))
    for row, p in zip(out, prefix_len):
        if p > 0:
            row.sort(key=lambda h: -key[id(h)])
    return out


def _shift_alignment(alignment, p: int):
    """fairseq's alignments without the prefix's target positions: hard
    alignments (``(source, target)`` pairs, as a tensor or a list) keep the
    pairs with target >= p, shifted by p; soft ones (one row per target
    token) drop the first p rows."""
    if alignment is None:
        return None
    if torch.is_tensor(alignment):
        if alignment.dim() == 2 and alignment.size(-1) == 2 and not alignment.is_floating_point():
            kept = alignment[alignment[:, 1] >= p]
            return kept - kept.new_tensor([0, p])
        return alignment[p:] if alignment.dim() >= 1 else alignment
    if isinstance(alignment, list):
        if alignment and isinstance(alignment[0], (tuple, list)) and len(alignment[0]) == 2 \
                and all(isinstance(x, int) for x in alignment[0]):
            return [(s, t - p) for s, t in alignment if t >= p]
        return alignment[p:]
    raise ValueError(f"--concat-context: unknown alignment format {type(alignment).__name__}")
