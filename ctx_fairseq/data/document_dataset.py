"""Sentence-level translation examples that know their document.

:class:`DocumentContextDataset` wraps fairseq's ``LanguagePairDataset`` (one
sentence pair per item, documents contiguous in corpus order) and a list of
document ids (one per sentence, ``{split}.docids``). Every sentence gets its
document number and 0-based position in the document, and each batch carries
the context sentences in ``net_input``:

* ``src_ctx_tokens`` (``B x Tc``): the source context sentences of each
  sentence concatenated in document order, each ended by the separator (by
  default ``</s>``: every binarized sentence already ends with it, so the
  context is simply the sentences one after the other), the whole context
  ended by ``</s>``; padded on the same side as the source (left by default);
  at least one column wide; a sentence without context (first in its document
  with ``prev`` context) is a row of padding only;
* ``src_ctx_lengths`` (``B``): the number of context tokens (0 when empty);
* ``tgt_ctx_tokens`` / ``tgt_ctx_lengths``: the same for target-side context
  (gold references, or the lines of a hypotheses file), padded like the target;
* ``src_ctx_sent_offsets`` (only with whole-document context): for each
  context token the signed offset of its sentence from the current one
  (``-1`` = previous sentence, ``+1`` = next; 0 at padding).

The batch also has ``doc_index`` (document number) and ``sent_pos`` (position
in the document) per sentence, outside ``net_input``.

Context never crosses a document boundary, except on purpose with an
ablation: ``shuffled`` takes each sentence's context from another, random
document position (the context that position really has, so a sentence with
real context gets non-empty context), ``random`` replaces every context word
by a random vocabulary token (sentence lengths and separators kept). Both are
deterministic for a seed. With a document memory (``document_memory``),
``shuffled`` gives each document the memory of another document (as many
sentences from its start; :meth:`DocumentContextDataset._memory_donors`) and
``random`` memory sentences of random tokens, the query itself encoded from
its own tokens in both.

Sampled context size (Fernandes et al. 2021; training split only,
:meth:`DocumentContextDataset.context_cap`): per sentence and epoch a size k
uniform on ``0..sample_context_size``, the sentence keeping its k nearest
previous context sentences; a fixed ``context_size`` N does the same for every
sentence (scoring: ``ctx-cxmi --context-size``). Context dropout (this
repository's) and CoWord dropout (Fernandes et al. 2021, Sec. 5; training split
only, :meth:`DocumentContextDataset.dropout_draws`): with probability
``context_dropout`` a sentence's whole context is dropped, exactly the empty
context a document's first sentence gets (empty ``src_ctx``/``tgt_ctx`` rows;
with a document memory ``query_doc = -1``: no memory sentence is visible);
with probability ``coword_dropout`` each word of the current source is
replaced by ``<unk>`` (special symbols, the final ``</s>`` among them, kept;
a document memory keeps the real sentence). Draws come from a generator per
(seed, epoch, sentence), so they do not depend on the batching. Batch sizes
count the undropped context: dropping only shrinks a batch (with CoWord
dropout and a shared memory, a query's memory row is counted apart).

Document batching (:meth:`DocumentContextDataset.batch_by_size` when
``document_batching`` is on) makes batches of whole consecutive documents
within ``max_tokens`` / ``max_sentences``; a document that does not fit into a
batch on its own is cut into consecutive chunks that each fit.
Distributed workers get fairseq's round-robin shards of these batches (each
batch carries its own context); only generation with
``--own-target-context`` shards them by whole documents
(:class:`DocumentShardedEpochBatchIterator`: all chunks of a document go to
the same worker, which translates them in order).
"""

import logging
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils

# the parts of the dataset by job (each name is imported from where it is defined)
from ctx_fairseq.data.conditions import ABLATIONS, ContextCondition
from ctx_fairseq.data.contract import ContextSpec
from ctx_fairseq.data.batching import (
    PART_SIDES, context_batches, document_batches, memory_batches)
from ctx_fairseq.data.docids import check_docids
from ctx_fairseq.data.document_memory import DocumentMemoryMixin
from ctx_fairseq.data.layouts import (
    DIRECTIONS, DOCUMENT_CONTEXTS, normalise_context_layout)
from ctx_fairseq.data.memory_index import (
    length_buckets, query_token_groups)
from ctx_fairseq.data.windows import (
    PARTIAL_NEXT, PARTIAL_NONE, PARTIAL_PREV, check_context_sizes, context_ranges,
    longest_sentences, truncate_windows)
from ctx_fairseq.errors import InputError

logger = logging.getLogger(__name__)


def check_spec(spec: ContextSpec) -> None:
    """The values of ``spec`` a dataset can be built from (ValueError naming
    the option; the task checks the same options with one-line errors
    before any data is read)."""
    for name, value, allowed in (("--context-direction", spec.context_direction, DIRECTIONS),
                                 ("--context-ablation", spec.ablation, ABLATIONS),
                                 ("--document-context", spec.document_context or "none",
                                  DOCUMENT_CONTEXTS)):
        if value not in allowed:
            raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
    for name, v in (("--source-context-size", spec.source_context_size),
                    ("--target-context-size", spec.target_context_size)):
        if v is None or int(v) < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    if spec.memory_precomputed and not spec.document_memory:
        raise ValueError("--memory-precomputed goes with --document-memory")
    if spec.document_memory and not spec.whole_document:
        raise ValueError("--document-memory needs --document-context online|offline (which "
                         "sentences of the document a sentence may see)")
    buckets = spec.length_buckets
    if buckets is None or int(buckets) < 1:
        raise ValueError(f"--length-buckets must be an integer >= 1, got {buckets!r}")
    if int(buckets) > 1 and not spec.document_memory:
        raise ValueError("--length-buckets groups the sentences of a document-memory batch "
                         "(--document-memory) by length; other batches are already "
                         "sorted by length")
    for name, v in (("--context-dropout", spec.context_dropout),
                    ("--coword-dropout", spec.coword_dropout)):
        if v is None or not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")


def check_context_limits(limits: Optional[Dict[str, object]], n: int) -> Dict[str, object]:
    """``{"src": ..., "tgt": ...}``, each side None (no limit), one number
    >= 1 or ``n`` per-sentence numbers >= 0 (ValueError otherwise)."""
    limits = dict(limits or {})
    out = {side: limits.get(side) for side in ("src", "tgt")}
    for side, v in out.items():
        name = "source" if side == "src" else "target"
        if v is None:
            continue
        if np.ndim(v) == 0 and int(v) < 1:
            raise ValueError(f"maximum {name} context length must be >= 1, got {v!r}")
        if np.ndim(v) == 1 and (len(v) != n or (np.asarray(v) < 0).any()):
            raise ValueError(f"per-sentence maximum {name} context lengths: expected "
                             f"{n} values >= 0")
    return out


class DocumentContextDataset(DocumentMemoryMixin, FairseqDataset):
    """A ``LanguagePairDataset`` with document structure and context inputs.

    Args:
        base: the sentence-level ``LanguagePairDataset`` (corpus order).
        doc_ids: one document id per sentence (strings), documents contiguous.
        spec: the :class:`~ctx_fairseq.data.contract.ContextSpec` (which
            sentences a sentence sees, the ablation, the training-only
            draws, the batching; see its fields). A whole-document context
            overrides the sizes and direction of every side that is on.
        separator: token index ending each context sentence (default eos).
        tgt_context: sequence of target-side token tensors to take target
            context from (default: the references, ``base.tgt``).
        max_context_tokens: ``{"src": ..., "tgt": ...}``, longer contexts
            are cut, nearest sentences first (:func:`truncate_windows`); per
            side one number, or an array with one limit per sentence (0: no
            context; e.g. concatenation leaves each sentence room for
            itself); None or a missing side: no limit.
        docids_path: named in error messages.
        context_layout: how the model lays the context out (``CONTEXT_LAYOUTS``,
            one name or a dict per side; default ``concatenated``); the task
            sets it from the model it builds (:meth:`set_context_layout`).

    Batch sizes count the context as the model processes it: :meth:`num_tokens`
    is the larger of ``source + source context`` and ``target + target
    context`` tokens, and :meth:`batch_by_size` (sentence and document
    batching) bounds the padded tensors, ``B x (max source + max source
    context)`` on the encoder side and likewise on the decoder side, by
    ``--max-tokens``. A context part is the concatenated context's length
    (layout ``concatenated``) or, for a model that encodes every context
    sentence in its own row (layout ``sentences``), ``k x`` the sentence's
    longest context sentence (``k`` the context size; the batch's rows are
    padded to the longest context sentence of the batch: ``B x k x L``).
    :meth:`size` stays the pair of sequence lengths that fairseq compares with
    ``--max-positions`` (a context is a sequence of its own, cut to
    ``max_*_context_tokens``).
    """

    def __init__(self, base, doc_ids: Sequence[str], spec: ContextSpec,
                 separator: Optional[int] = None, tgt_context: Optional[Sequence] = None,
                 max_context_tokens: Optional[Dict[str, object]] = None,
                 docids_path: str = "<docids>", context_layout=None):
        super().__init__()
        #: what :meth:`with_condition` rebuilds the dataset from
        self.spec = spec
        self._rebuild = dict(separator=separator, tgt_context=tgt_context,
                             max_context_tokens=max_context_tokens, docids_path=docids_path)
        self._doc_ids = doc_ids
        limits = check_context_limits(max_context_tokens, len(base))
        check_spec(spec)
        check_docids(doc_ids, docids_path, len(base))
        self.base = base
        self.docids_path = docids_path
        self.src_dict, self.tgt_dict = base.src_dict, base.tgt_dict
        self.left_pad_source, self.left_pad_target = base.left_pad_source, base.left_pad_target
        self.pad_to_multiple = getattr(base, "pad_to_multiple", 1)
        src_context_size, tgt_context_size = spec.source_context_size, spec.target_context_size
        self.src_context_size, self.tgt_context_size = int(src_context_size), int(tgt_context_size)
        direction = spec.context_direction
        document_context = spec.document_context or "none"
        self.direction, self.ablation, self.seed = direction, spec.ablation, int(spec.seed)
        self.document_context = document_context
        self.document_memory = bool(spec.document_memory)
        self.memory_precomputed = bool(spec.memory_precomputed)
        #: document-memory batches: the rows' length groups (collater, see
        #: :func:`ctx_fairseq.data.memory_index.length_buckets`)
        self.length_buckets = int(spec.length_buckets)
        #: training only (the task gives them to the split fairseq-train trains on)
        self.context_dropout = float(spec.context_dropout)
        self.coword_dropout = float(spec.coword_dropout)
        #: sampled context size K (training only) and a fixed context size N (a
        #: scorer's condition, or a memory's window outside training): see
        #: :meth:`context_cap`
        self.sample_context_size, self.context_size = check_context_sizes(
            spec.sampled_context_size, spec.context_cap(), src_context_size, tgt_context_size,
            direction, document_context, spec.document_memory)
        self.document_batching = bool(spec.document_batching) or document_context != "none"
        self.eos = self.src_dict.eos()
        self.separator = self.eos if separator is None else int(separator)
        self.max_context_tokens = limits
        if tgt_context is not None and len(tgt_context) != len(base):
            raise ValueError(f"target context: {len(tgt_context)} lines for {len(base)} sentences")
        self.tgt_context = tgt_context
        if self.tgt_context_size > 0 and tgt_context is None and base.tgt is None:
            raise ValueError("--target-context-size > 0 needs target sentences (references or "
                             "--target-context-file)")
        self.epoch = 1

        # document structure (vectorised)
        n = len(doc_ids)
        arr = np.asarray(doc_ids, dtype=object)
        is_start = np.ones(n, dtype=bool)
        if n > 1:
            is_start[1:] = arr[1:] != arr[:-1]
        self.doc_start = np.flatnonzero(is_start).astype(np.int64)  # per document
        self.doc_len = np.diff(np.append(self.doc_start, n)).astype(np.int64)
        self.doc_names = [str(x) for x in arr[self.doc_start]]
        self.doc_index = np.cumsum(is_start).astype(np.int64) - 1  # per sentence
        self.sent_pos = np.arange(n, dtype=np.int64) - self.doc_start[self.doc_index]
        #: every sentence alone in its document (the ``none`` condition of a
        #: whole-document context or document memory: nothing of it is visible)
        self.isolate_sentences = bool(spec.isolate_sentences)
        if self.isolate_sentences:
            self.doc_names = [f"{self.doc_names[d]}, sentence {p}"
                              for d, p in zip(self.doc_index.tolist(), self.sent_pos.tolist())]
            self.doc_start = np.arange(n, dtype=np.int64)
            self.doc_len = np.ones(n, dtype=np.int64)
            self.doc_index = np.arange(n, dtype=np.int64)
            self.sent_pos = np.zeros(n, dtype=np.int64)
        s_start = self.doc_start[self.doc_index]
        s_end = s_start + self.doc_len[self.doc_index]

        # context windows per side before truncation: (prev_lo, prev_hi, next_lo, next_hi)
        self.full_windows = {}
        for side, k in (("src", self.src_context_size), ("tgt", self.tgt_context_size)):
            if k <= 0 or self.document_memory:  # document memory: no per-sentence context
                continue
            if document_context == "online":
                self.full_windows[side] = context_ranges(s_start, s_end, None, "prev")
            elif document_context == "offline":
                self.full_windows[side] = context_ranges(s_start, s_end, None, "both")
            else:
                self.full_windows[side] = context_ranges(s_start, s_end, k, direction)
        self.donor = self._shuffled_donors() if self.ablation == "shuffled" else None
        #: document memory, shuffled ablation: per document the document whose memory it reads
        self.memory_donor = (self._memory_donors() if self.document_memory
                             and self.ablation == "shuffled" else None)
        self.context_layout = normalise_context_layout(None)
        self.set_context_layout(context_layout)
        self.refresh_context_lengths()

    def with_condition(self, condition) -> "DocumentContextDataset":
        """This dataset (the same sentences, documents and options) under a
        :class:`~ctx_fairseq.data.conditions.ContextCondition` (or its name),
        for scoring (no dropout, no sampled size): the one way every scorer
        gets the empty, a sized, a shuffled or a random context (the
        condition's :meth:`~ctx_fairseq.data.conditions.ContextCondition.apply`
        on this dataset's spec)."""
        cond = ContextCondition.parse(condition)
        return DocumentContextDataset(self.base, self._doc_ids,
                                      cond.apply(self.spec).for_split(training=False),
                                      context_layout=self.context_layout, **self._rebuild)

    @property
    def whole_document(self) -> bool:
        """A whole-document context or document memory (no bounded size)."""
        return self.document_memory or self.document_context != "none"

    @property
    def doc_ids(self) -> Sequence[str]:
        """The document id of every sentence, as given (``{split}.docids``)."""
        return self._doc_ids

    def context_cap(self, index: int) -> Optional[int]:
        """How many previous context sentences sentence ``index`` keeps (the
        nearest ones; None: all its window has). ``context_size`` N (scoring,
        e.g. ``ctx-cxmi --context-size``): N for every sentence, 0 the empty
        context. ``sample_context_size`` K (training split only; Fernandes et
        al. 2021, contextual-mt's ``--sample-context-size``): a size drawn
        uniformly from ``0..K`` per sentence and epoch, from a generator of its
        own seeded like the dropouts (``numpy.random.default_rng([seed, epoch,
        index, 161803])``: reproducible, independent of the batching), the
        same size for the source and the target side (each side keeps at most
        its own ``--*-context-size``)."""
        if self.context_size is not None:
            return self.context_size
        if not self.sample_context_size:
            return None
        rng = np.random.default_rng([self.seed % (1 << 63), int(self.epoch), int(index), 161803])
        return int(rng.integers(0, self.sample_context_size + 1))

    def _keep_last(self, ctx: torch.Tensor, k: Optional[int]) -> torch.Tensor:
        """The last ``k`` sentences of a context ``s_1 SEP ... s_n </s>``
        (each ended by the separator, the last by ``</s>``), the form kept."""
        if k is None:
            return ctx
        if k == 0:
            return ctx[:0]
        ends = torch.nonzero((ctx == self.separator) | (ctx == self.eos)).view(-1)
        if ends.numel() <= k:
            return ctx
        return ctx[int(ends[-k - 1]) + 1:]

    def context_slots(self, side: str) -> int:
        """Context sentences a sentence can have on ``side`` (per direction
        ``k``, twice with ``both``): the rows of the ``sentences`` layout."""
        k = self.src_context_size if side == "src" else self.tgt_context_size
        return k * (2 if self.direction == "both" else 1)

    def set_context_layout(self, layout) -> None:
        """How the model lays the context out (see ``CONTEXT_LAYOUTS``); batch
        sizes count it from now on."""
        layout = normalise_context_layout(layout)
        for side in ("src", "tgt"):
            name = layout[side]
            if name == "sentences" and side in self.full_windows and \
                    self.document_context != "none":
                raise ValueError(
                    f"the model encodes each {side} context sentence in its own row (context "
                    f"layout 'sentences'), which needs a bounded context: --source-context-size "
                    f"/ --target-context-size without --document-context (got "
                    f"--document-context {self.document_context})")
        self.context_layout = layout

    # ----------------------------------------------------------------- context
    def _sentences(self, side: str):
        if side == "src":
            return self.base.src
        return self.tgt_context if self.tgt_context is not None else self.base.tgt

    def _unit_lengths(self, side: str) -> np.ndarray:
        """Tokens each sentence adds to a context: its tokens without a final
        ``</s>``, plus one separator."""
        seqs = self._sentences(side)
        if side == "src" or self.tgt_context is None:
            sizes = np.asarray(self.base.src_sizes if side == "src" else self.base.tgt_sizes,
                               dtype=np.int64)
        else:
            sizes = np.fromiter((len(t) for t in seqs), dtype=np.int64, count=len(seqs))
        ends = np.fromiter((len(seqs[j]) > 0 and int(seqs[j][-1]) == self.eos
                            for j in range(len(sizes))), dtype=bool, count=len(sizes))
        return sizes - ends + 1

    def _unit_length(self, tokens) -> int:
        """:meth:`_unit_lengths` of one sentence."""
        n = len(tokens)
        return n - int(n > 0 and int(tokens[-1]) == self.eos) + 1

    def _window_width(self, side: str) -> int:
        """The most sentences a context window of ``side`` holds per direction."""
        if self.document_context != "none":
            return int(self.doc_len.max()) if len(self.doc_len) else 0
        return self.src_context_size if side == "src" else self.tgt_context_size

    def _longest(self, unit, cut, partial, length, side: str) -> Optional[np.ndarray]:
        """:func:`longest_sentences` where windows are bounded (the ``sentences``
        layout needs them; whole-document windows have no such layout)."""
        if self.document_context != "none":
            return None
        return longest_sentences(unit, cut, partial, length, self._window_width(side))

    def refresh_context_lengths(self) -> None:
        """(Re)compute the cut windows and context lengths of every sentence
        (after replacing ``tgt_context``; to change single sentences of it,
        :meth:`set_target_context` is linear in the changes)."""
        self.windows, self.partial, self.context_length = {}, {}, {}
        self.longest, self.truncation = {}, {}
        self._units, self._full_length = {}, {}
        self._receiver_windows = set()
        for side, win in self.full_windows.items():
            unit = self._unit_lengths(side)
            self._units[side] = unit
            lim = self.max_context_tokens[side]
            if self.donor is not None and lim is not None and np.ndim(lim):
                # per-sentence limits (the room a sentence leaves itself) and an
                # ablation: the donor's window, cut to the receiver's own room
                win = tuple(np.asarray(w)[self.donor] for w in win)
                cut, partial, length, full = truncate_windows(unit, win, lim)
                self.windows[side] = tuple(np.array(w, dtype=np.int64) for w in cut)
                self.partial[side] = partial
                self._receiver_windows.add(side)
                self.context_length[side] = length.astype(np.int64)
                self.longest[side] = self._longest(unit, cut, partial, length, side)
                lost = full - length
                self.truncation[side] = (int((lost > 0).sum()), int(lost.sum()),
                                         int(full.sum()))
                continue
            cut, partial, length, full = truncate_windows(unit, win, lim)
            self.windows[side] = tuple(np.array(w, dtype=np.int64) for w in cut)
            self.partial[side] = partial
            self._full_length[side] = np.array(full, dtype=np.int64)
            anchor = self.donor if self.donor is not None else np.arange(len(length))
            self.context_length[side] = length[anchor].astype(np.int64)
            longest = self._longest(unit, cut, partial, length, side)
            self.longest[side] = None if longest is None else longest[anchor]
            lost = (full - length)[anchor]
            self.truncation[side] = (int((lost > 0).sum()), int(lost.sum()), int(full[anchor].sum()))

    def set_target_context(self, index: int, tokens: torch.Tensor) -> np.ndarray:
        """Make ``tokens`` the target-side sentence ``index`` that contexts
        read (``tgt_context``; e.g. the model's own translation of it, in
        document order) and update the cut windows, lengths and truncation
        counts of exactly the sentences whose context window holds ``index``:
        O(context size) per call, so translating a document sentence by
        sentence stays linear in its length (a whole-document context, whose
        windows grow with the document, is linear per call). The result is
        what :meth:`refresh_context_lengths` computes. Returns the indices
        whose target context changed."""
        if self.tgt_context is None:
            raise ValueError("set_target_context: the dataset reads its target context from the "
                             "references; give it a tgt_context list to change")
        index = int(index)
        self.tgt_context[index] = tokens
        side = "tgt"
        if side not in self.full_windows:  # no per-sentence target context (or document memory)
            return np.zeros(0, dtype=np.int64)
        if self.donor is not None:  # an ablation: any sentence may read any other's context
            self.refresh_context_lengths()
            return np.arange(len(self), dtype=np.int64)
        unit = self._units[side]
        unit[index] = self._unit_length(tokens)
        p_lo, p_hi, n_lo, n_hi = self.full_windows[side]
        d = int(self.doc_index[index])
        start, end = int(self.doc_start[d]), int(self.doc_start[d] + self.doc_len[d])
        width = self._window_width(side)
        # sentence j's previous window is [j - width, j), its next one [j + 1, j + 1 + width)
        cand = np.arange(max(start, index - width), min(end, index + width + 1), dtype=np.int64)
        hit = ((p_lo[cand] <= index) & (index < p_hi[cand])) | \
              ((n_lo[cand] <= index) & (index < n_hi[cand]))
        js = cand[hit]
        if not len(js):
            return js
        win = [np.asarray(w)[js] for w in (p_lo, p_hi, n_lo, n_hi)]
        base = int(min(w.min() for w in win))
        top = int(max(w.max() for w in win))
        local = tuple(w - base for w in win)
        lim = self.max_context_tokens[side]
        if lim is not None and np.ndim(lim):
            lim = np.asarray(lim)[js]
        cut, partial, length, full = truncate_windows(unit[base:top], local, lim)
        longest = self._longest(unit[base:top], cut, partial, length, side)
        count, cut_tokens, total = self.truncation[side]
        old_lost = self._full_length[side][js] - self.context_length[side][js]
        lost = full - length
        self.truncation[side] = (
            count - int((old_lost > 0).sum()) + int((lost > 0).sum()),
            cut_tokens - int(old_lost.sum()) + int(lost.sum()),
            total - int(self._full_length[side][js].sum()) + int(full.sum()))
        for target, value in zip(self.windows[side], cut):
            target[js] = value + base
        self.partial[side][js] = partial
        self.context_length[side][js] = length
        self._full_length[side][js] = full
        if longest is not None:
            self.longest[side][js] = longest
        return js

    def _anchor(self, index: int, side: str) -> int:
        """The position whose context ``index`` gets (itself, or its donor
        under the shuffled ablation)."""
        if self.donor is None or side in getattr(self, "_receiver_windows", ()):
            return index  # (receiver windows already hold the donor's sentences)
        p_lo, p_hi, n_lo, n_hi = self.full_windows[side]
        if (p_hi[index] - p_lo[index]) + (n_hi[index] - n_lo[index]) > 0:
            return int(self.donor[index])
        return index

    def _shuffled_donors(self) -> Optional[np.ndarray]:
        """For each sentence a position in another document whose (real)
        context stands in for its own; uniform over positions that have
        context, deterministic for the seed."""
        if not self.full_windows:
            return None
        p_lo, p_hi, n_lo, n_hi = next(iter(self.full_windows.values()))
        count = (p_hi - p_lo) + (n_hi - n_lo)
        eligible = np.flatnonzero(count > 0)
        n = len(count)
        rng = np.random.default_rng([self.seed, 7919])
        if len(eligible) == 0:
            return np.arange(n, dtype=np.int64)
        d_start = self.doc_start[self.doc_index]
        d_end = d_start + self.doc_len[self.doc_index]
        lo = np.searchsorted(eligible, d_start)
        hi = np.searchsorted(eligible, d_end)
        own = hi - lo
        others = len(eligible) - own
        u = rng.random(n)
        if (others[count > 0] == 0).any():  # a wrong number is worse than an error
            raise InputError(
                f"shuffled context ({self.docids_path or 'the split'}): only one document has "
                "context, so its sentences have no other document to take context from (a "
                "random position of their own document would score the true context's "
                "neighbours as the ablation); score the shuffled condition on a split of two "
                "documents or more")
        pick = np.where(others > 0, np.floor(u * np.maximum(others, 1)).astype(np.int64),
                        np.floor(u * len(eligible)).astype(np.int64))
        pick = np.where((others > 0) & (pick >= lo), pick + own, pick)
        donor = eligible[pick].astype(np.int64)
        return np.where(count > 0, donor, np.arange(n, dtype=np.int64))


    def dropout_draws(self, index: int, tokens=None):
        """Context and CoWord dropout of sentence ``index`` this epoch:
        ``(context dropped, mask)``, ``mask`` (bool, one per token of its
        source ``tokens``, by default the binarized source; None without
        CoWord dropout) marking the tokens replaced by ``<unk>``: a word with
        probability ``coword_dropout``, never a special symbol (the final
        ``</s>`` among them). Drawn from a generator of its own, seeded by the
        seed, the epoch and the index (``numpy.random.default_rng([seed,
        epoch, index, 271828])``): reproducible, independent of the batching
        and its order, new every epoch. ``(False, None)`` when both are off
        (every split but the one fairseq-train trains on)."""
        if not self.context_dropout and not self.coword_dropout:
            return False, None
        rng = np.random.default_rng([self.seed % (1 << 63), int(self.epoch), int(index), 271828])
        drop = bool(rng.random() < self.context_dropout)
        if not self.coword_dropout:
            return drop, None
        toks = np.asarray(self.base.src[index] if tokens is None else tokens)
        return drop, (rng.random(len(toks)) < self.coword_dropout) & \
            (toks >= self.src_dict.nspecial)

    def sentences_with_context(self) -> np.ndarray:
        """Per sentence: does it get any context (bool)? Per-sentence context:
        a non-empty context (after truncation and ablation). Document memory:
        a memory sentence at a position it may see (online: not the first of
        its document; offline: a document of two or more sentences; under the
        shuffled ablation, of the donor)."""
        out = np.zeros(len(self), dtype=bool)
        if self.context_size == 0:  # the empty context for every sentence
            return out
        for length in self.context_length.values():
            out |= np.asarray(length) > 0
        if self.document_memory:
            if self.document_context == "online":
                out |= self.sent_pos > 0
            else:
                donor = (self.memory_donor if self.memory_donor is not None
                         else np.arange(len(self.doc_start)))[self.doc_index]
                n = self.doc_len[donor]
                out |= (n > 1) | ((n == 1) & (self.sent_pos > 0))
        return out

    @property
    def dropout_active(self) -> bool:
        return bool(self.context_dropout or self.coword_dropout)

    def context_indices(self, index: int, side: str = "src") -> List[int]:
        """Corpus indices of the context sentences of ``index`` (in order),
        after truncation (a partially kept sentence is included)."""
        win = self.windows.get(side)
        if win is None:
            return []
        a = self._anchor(index, side)
        p_lo, p_hi, n_lo, n_hi = win
        part = self.partial[side][a]
        if part == PARTIAL_PREV:
            return [int(p_hi[a]) - 1]
        if part == PARTIAL_NEXT:
            return [int(n_lo[a])]
        return list(range(p_lo[a], p_hi[a])) + list(range(n_lo[a], n_hi[a]))

    def _sentence(self, side: str, j: int) -> torch.Tensor:
        return self._sentences(side)[j]

    def context_tokens(self, index: int, side: str = "src") -> torch.Tensor:
        """The 1-D context of one sentence: ``s_1 SEP s_2 SEP ... s_n`` with
        ``SEP`` ending each sentence and ``</s>`` the whole context (with the
        default separator ``</s>`` these coincide); empty without context;
        cut to the maximum context length nearest sentences first."""
        ids = self.context_indices(index, side)
        if not ids:
            return torch.empty(0, dtype=torch.long)
        parts = []
        for j in ids:
            s = self._sentence(side, j).long()
            if s.numel() and s[-1] == self.eos:
                s = s[:-1]
            parts.append(s)
            parts.append(torch.tensor([self.separator], dtype=torch.long))
        ctx = torch.cat(parts)
        ctx[-1] = self.eos
        limit = self._limit(side, self._anchor(index, side))
        part = self.partial[side][self._anchor(index, side)]
        if part == PARTIAL_PREV:  # the end of the previous sentence
            ctx = ctx[-limit:]
        elif part == PARTIAL_NEXT:  # the beginning of the next sentence
            ctx = torch.cat([ctx[:limit - 1], ctx.new_tensor([self.eos])])
        assert limit is None or ctx.numel() <= limit
        # a sampled (training) or fixed (scoring) context size: the nearest sentences, cut
        # before the random ablation (whose tokens could equal a break symbol)
        ctx = self._keep_last(ctx, self.context_cap(index))
        if self.ablation == "random":
            d = self.src_dict if side == "src" else self.tgt_dict
            words = (ctx != self.separator) & (ctx != self.eos)
            g = torch.Generator().manual_seed(int(self.seed) * 1_000_003 + int(index) * 2 + (side == "tgt"))
            rand = torch.randint(d.nspecial, len(d), ctx.shape, generator=g)
            ctx = torch.where(words, rand, ctx)
        return ctx

    def _limit(self, side: str, index: int) -> Optional[int]:
        lim = self.max_context_tokens[side]
        if lim is None or np.ndim(lim) == 0:
            return lim
        return int(lim[index])

    def context_sent_offsets(self, index: int, side: str = "src") -> torch.Tensor:
        """Per context token the signed sentence offset from ``index``."""
        ids = self.context_indices(index, side)
        if not ids:
            return torch.empty(0, dtype=torch.long)
        anchor = self._anchor(index, side)
        part = self.partial[side][anchor]
        if part != PARTIAL_NONE:
            return torch.full((int(self.context_length[side][index]),), ids[0] - anchor,
                              dtype=torch.long)
        lens = []
        for j in ids:
            s = self._sentence(side, j)
            lens.append(int(s.numel()) - (1 if s.numel() and int(s[-1]) == self.eos else 0) + 1)
        return torch.repeat_interleave(torch.tensor([j - anchor for j in ids]), torch.tensor(lens))

    # ------------------------------------------------------------ FairseqDataset
    def __getitem__(self, index):
        item = self.base[index]
        drop, mask = False, None
        if self.dropout_active:  # training split only
            src = item["source"]
            drop, mask = self.dropout_draws(index, src.numpy())
            if mask is not None and mask.any():
                item["source"] = src.masked_fill(torch.from_numpy(mask), self.src_dict.unk())
            item["ctx_dropped"] = drop
            item["coword_masked"] = bool(mask is not None and mask.any())
        empty = torch.empty(0, dtype=torch.long)
        if "src" in self.windows:
            item["src_ctx"] = empty if drop else self.context_tokens(index, "src")
            if self.document_context != "none":
                item["src_ctx_offsets"] = empty if drop else \
                    self.context_sent_offsets(index, "src")
        if "tgt" in self.windows:
            item["tgt_ctx"] = empty if drop else self.context_tokens(index, "tgt")
        return item

    def __len__(self):
        return len(self.base)

    def collate_context(self, items: Sequence[torch.Tensor], side: str) -> Dict[str, torch.Tensor]:
        d = self.src_dict if side == "src" else self.tgt_dict
        left = self.left_pad_source if side == "src" else self.left_pad_target
        toks = data_utils.collate_tokens(list(items), d.pad(), d.eos(), left_pad=left,
                                         pad_to_length=1, pad_to_multiple=self.pad_to_multiple)
        lengths = torch.tensor([t.numel() for t in items], dtype=torch.long)
        out = {f"{side}_ctx_tokens": toks, f"{side}_ctx_lengths": lengths}
        if self.context_layout[side] == "sentences":
            out.update(self.collate_context_sentences(items, side))
        return out

    def collate_context_sentences(self, items: Sequence[torch.Tensor],
                                  side: str) -> Dict[str, torch.Tensor]:
        """The ``sentences`` layout (``CONTEXT_LAYOUTS``) of a batch's contexts,
        built here on the CPU so that the model's forward stays static-shaped
        (no host reads): ``{side}_ctx_sentences`` (``B x k x L``, ``k``
        :meth:`context_slots`, ``L >= 1`` the batch's longest kept context
        sentence) and ``{side}_ctx_present`` (``B x k`` bool). Slot ``k-1`` is
        the nearest sentence; each sentence is right-padded and ended by
        ``</s>`` (the separator replaced); a sentence without words (only
        separator, ``</s>``, ``<s>`` or padding symbols) leaves its slot empty
        (a padding row, ``present`` False) and the others keep the slot of
        their distance, so source and target slot ``j`` are the same previous
        sentence. This is exactly what
        :func:`ctx_fairseq.modules.han_attention.split_context` computes from
        the collated ``B x Tc`` tensor (tested)."""
        d = self.src_dict if side == "src" else self.tgt_dict
        pad, eos, k = d.pad(), d.eos(), self.context_slots(side)
        ends = {eos, self.separator}
        non_words = ends | {d.bos(), pad}
        rows: List[List[Optional[np.ndarray]]] = []
        width = 1
        for t in items:
            toks = np.asarray(t, dtype=np.int64).reshape(-1)
            cut = np.flatnonzero(np.isin(toks, list(ends))) + 1
            sents = [s for s in np.split(toks, cut) if len(s)]
            slots: List[Optional[np.ndarray]] = [None] * k
            for dist, s in enumerate(reversed(sents[-k:] if k else [])):
                if np.isin(s, list(non_words)).all():
                    continue  # no words: the slot stays empty
                s = np.where(np.isin(s, list(ends)), eos, s)
                slots[k - 1 - dist] = s
                width = max(width, len(s))
            rows.append(slots)
        sentences = torch.full((len(items), k, width), pad, dtype=torch.long)
        present = torch.zeros(len(items), k, dtype=torch.bool)
        for b, slots in enumerate(rows):
            for j, s in enumerate(slots):
                if s is not None:
                    sentences[b, j, :len(s)] = torch.from_numpy(s)
                    present[b, j] = True
        return {f"{side}_ctx_sentences": sentences, f"{side}_ctx_present": present}

    def collater(self, samples, pad_to_length=None):
        batch = self.base.collater(samples, pad_to_length=pad_to_length) if pad_to_length \
            else self.base.collater(samples)
        if not batch:
            return batch
        by_id = {int(s["id"]): s for s in samples}
        ordered = [by_id[i] for i in batch["id"].tolist()]
        ids = batch["id"].numpy()
        batch["doc_index"] = torch.from_numpy(self.doc_index[ids])
        batch["sent_pos"] = torch.from_numpy(self.sent_pos[ids])
        ni = batch["net_input"]
        for side in ("src", "tgt"):
            if side in self.windows:
                ni.update(self.collate_context([s[f"{side}_ctx"] for s in ordered], side))
        if self.document_memory:
            dropped = masked = None
            if self.dropout_active:
                dropped = np.array([bool(s.get("ctx_dropped")) for s in ordered])
                masked = np.array([bool(s.get("coword_masked")) for s in ordered])
            ni.update(self.collate_memory(ids, dropped=dropped, masked=masked))
            # the real query tokens of each document (the source's, for a context
            # layer on the encoder side)
            tokens = query_token_groups(ni["query_doc_groups"].numpy(), ni["src_lengths"].numpy(),
                                        ni["src_tokens"].size(1), self.left_pad_source)
            ni["query_doc_tokens"] = torch.from_numpy(tokens)
            ni["query_doc_token_counts"] = (tokens < ni["src_tokens"].numel()).sum(1)  # numpy
            if self.length_buckets > 1:
                if self.context_layout["memory"] != "separate":
                    raise InputError(
                        "--length-buckets: the model encodes its document memory together with "
                        "the batch's sentences (a shared memory); length groups are for a "
                        "memory encoded apart (transformer_selective_doc --context-memory "
                        "frozen)")
                prev = ni.get("prev_output_tokens")
                tgt_lens = (prev.ne(self.tgt_dict.pad()).sum(1).numpy() if prev is not None
                            else np.zeros(len(ids), dtype=np.int64))
                ni.update(length_buckets(
                    ni["src_lengths"].numpy(), tgt_lens, self.length_buckets,
                    ni["src_tokens"].size(1), prev.size(1) if prev is not None else 1,
                    self.pad_to_multiple, bool(self.left_pad_target)))
        if "src" in self.windows and self.document_context != "none":
            offs = data_utils.collate_tokens([s["src_ctx_offsets"] for s in ordered], 0, 0,
                                             left_pad=self.left_pad_source, pad_to_length=1,
                                             pad_to_multiple=self.pad_to_multiple)
            ni["src_ctx_sent_offsets"] = offs
        return batch


    def _target_sizes(self) -> np.ndarray:
        if self.tgt_context is None:
            return np.asarray(self.base.tgt_sizes, dtype=np.int64)
        return np.fromiter((len(t) for t in self.tgt_context), dtype=np.int64,
                           count=len(self.tgt_context))

    # ---------------------------------------------------------------- sizes
    def _part_lengths(self, indices: np.ndarray) -> np.ndarray:
        """``len(indices) x 4``: source, source context, target, target
        context tokens (0 where a part is absent), a context as the model lays
        it out (:attr:`context_layout`): ``concatenated``, its length;
        ``sentences``, ``k x`` its longest sentence (at least one column: a
        row per slot even without context), so that a batch's padded size
        ``B x max`` is the model's ``B x k x L``."""
        indices = np.asarray(indices, dtype=np.int64)
        out = np.zeros((len(indices), 4), dtype=np.int64)
        out[:, 0] = np.asarray(self.base.src_sizes, dtype=np.int64)[indices]
        if self.base.tgt_sizes is not None:
            out[:, 2] = np.asarray(self.base.tgt_sizes, dtype=np.int64)[indices]
        for side, col in (("src", 1), ("tgt", 3)):
            if side not in self.context_length:
                continue
            length = self.context_length[side][indices]
            if self.context_layout[side] == "sentences":
                rows = self.context_slots(side) * np.maximum(self.longest[side][indices], 1)
                length = np.maximum(rows, length)  # (never fewer: rows hold the whole context)
            out[:, col] = length
        return out

    def _layout_note(self) -> str:
        """For error messages: how context parts are counted."""
        rows = [f"{'source' if side == 'src' else 'target'} context as {self.context_slots(side)}"
                " rows of its longest sentence" for side in ("src", "tgt")
                if side in self.context_length and self.context_layout[side] == "sentences"]
        if not rows:
            return ""
        return (f" ({', '.join(rows)}: the model encodes each context sentence in its own row, "
                "padded to the longest)")

    #: which parts are padded together into one side's tensors
    SIDES = PART_SIDES

    def _sides(self):
        """Parts that exist: context tensors are one column even when empty."""
        src = (0, 1) if "src" in self.windows else (0,)
        tgt = (2, 3) if "tgt" in self.windows else (2,)
        return (src, tgt)

    def num_tokens(self, index):
        return int(self.num_tokens_vec(np.array([index]))[0])

    def num_tokens_vec(self, indices):
        p = self._part_lengths(indices)
        return np.maximum(p[:, 0] + p[:, 1], p[:, 2] + p[:, 3])

    def size(self, index):
        return self.base.size(index)

    @property
    def sizes(self):
        return self.base.sizes

    @property
    def supports_prefetch(self):
        return getattr(self.base, "supports_prefetch", False)

    def prefetch(self, indices):
        return self.base.prefetch(indices)

    def filter_indices_by_size(self, indices, max_sizes):
        return self.base.filter_indices_by_size(indices, max_sizes)

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        # dropout draws per epoch: a new iterator (and data loader workers that
        # see this epoch; fairseq's persistent workers keep an old copy)
        return not self.document_batching and not self.dropout_active

    def set_epoch(self, epoch):
        super().set_epoch(epoch)
        self.epoch = int(epoch)
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)

    def ordered_indices(self):
        """Sentence-level: the base order (by length), or with context by
        total length (context included). Document batching: documents in a
        random order that changes every epoch (seeded by the seed and the
        epoch, the same on every worker) when the base shuffles, corpus order
        otherwise; sentences in document order."""
        if not self.document_batching:
            if not self.windows:
                return self.base.ordered_indices()
            order = (np.random.permutation(len(self)) if self.base.shuffle
                     else np.arange(len(self), dtype=np.int64))
            return order[np.argsort(self.num_tokens_vec(order), kind="mergesort")]
        n_docs = len(self.doc_start)
        if self.base.shuffle:
            order = np.random.default_rng([self.seed, self.epoch, 104729]).permutation(n_docs)
        else:
            order = np.arange(n_docs)
        lens = self.doc_len[order]
        starts = np.repeat(self.doc_start[order], lens)
        offsets = np.arange(lens.sum(), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        return (starts + offsets).astype(np.int64)

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None,
                      required_batch_size_multiple=1):
        indices = np.asarray(indices, dtype=np.int64)
        if self.document_memory:
            return memory_batches(self, indices, max_tokens, max_sentences)
        if self.document_batching:
            return document_batches(indices, self.doc_index, self._part_lengths(indices),
                                    max_tokens, max_sentences, sides=self._sides(),
                                    note=self._layout_note())
        if not self.windows:
            return super().batch_by_size(indices, max_tokens=max_tokens,
                                         max_sentences=max_sentences,
                                         required_batch_size_multiple=required_batch_size_multiple)
        return context_batches(indices, self._part_lengths(indices), max_tokens, max_sentences,
                               required_batch_size_multiple, sides=self._sides(),
                               note=self._layout_note())


