"""A content-addressed cache of per-sentence states of a frozen model.

``transformer_selective_doc --context-memory frozen`` reads its document
memory from the stage-1 sentence-level model, whose parameters never change
(Maruf et al. 2019, Sec. 3.3: "the keys and values produced from the
pre-trained sentence-level NMT model" are stored). The states of a sentence
under such a model depend only on the sentence's tokens (and, for target
memory, on its source and target tokens), so they are cached by content:
each memory sentence is encoded once (without gradients, in eval mode) and
read back whenever a later batch needs it, whatever its split, document or
position. A document longer than a batch therefore costs no re-encoding for
its later chunks, and ``--max-tokens`` only has to bound the sentences
encoded with gradients (``--memory-precomputed`` in the task).

Entries are kept on the CPU in the precision they were computed in by
default (``dtype=None``: the model's, so that cached and uncached memories
are equal; a 512-dimensional state of a 25-token sentence is 50 KB in
float32, 25 KB under ``--fp16``), least recently used first out when
``max_sentences`` is reached.

Host work, not device reads. Keys are 128-bit digests of the sentences'
tokens (:func:`sentence_digest`), computed by the task's collater on the
CPU where the tokens are (``mem_src_key``/``mem_tgt_key``, numpy arrays that
stay on the host), so a batch looks its memory up without reading anything
back (no ``.tolist()`` of the memory, no Python loop over tokens);
:meth:`SentenceStateCache.fetch` copies the states of all of a batch's
misses to the host in one copy, and :func:`assemble_rows` builds the padded
memory with one host-to-device copy (pinned, :func:`to_device`) and an
index computed on the host. (:func:`row_keys`, exact token tuples, is what
inputs without the collater's keys use.)

The cache is not saved with checkpoints (nor
copied by ``copy.deepcopy`` or pickled: a copy starts empty) and is emptied
when the frozen weights are (re)loaded; :meth:`SentenceStateCache.validate`
also empties it when the weights it was filled with have changed (new
storage, dtype or device, or an in-place update).
"""

from collections import OrderedDict
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ctx_fairseq.digest import sentence_digest  # the collater's keys (ctx_fairseq.digest)

__all__ = ["SentenceStateCache", "row_keys", "assemble", "assemble_rows", "sentence_digest",
           "to_device", "weights_signature"]


def to_device(t: Tensor, device) -> Tensor:
    """``t`` (a host tensor) on ``device`` without a synchronisation: on CUDA
    through pinned memory and a non-blocking copy (a copy from pageable memory
    waits for the device); elsewhere ``t`` itself."""
    device = torch.device(device)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    if device != t.device:
        return t.to(device)
    return t


def assemble_rows(entries: Sequence[Tuple[Tensor, ...]], width: int, left_pad: bool,
                  device, dtype: torch.dtype) -> Tuple[Tensor, ...]:
    """The padded ``S x width x C`` tensors (on ``device``, in ``dtype``) of
    ``S`` entries: entry ``i``'s ``n_i`` rows fill the last (``left_pad``) or
    first ``n_i`` positions of row ``i`` (where a padded batch has its real
    tokens), the others are 0. The positions are computed on the host from
    the entries' lengths: one host-to-device copy per kind of state and of the
    index, no read back."""
    import numpy as np

    S = len(entries)
    lens = np.fromiter((e[0].size(0) for e in entries), dtype=np.int64, count=S)
    rows = np.repeat(np.arange(S, dtype=np.int64), lens)
    starts = np.cumsum(lens) - lens
    within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(starts, lens)
    if left_pad:
        within = within + np.repeat(width - lens, lens)
    index = to_device(torch.from_numpy(rows * width + within), device)
    out = []
    for k in range(len(entries[0])):
        host = torch.cat([e[k] for e in entries], 0) if S > 1 else entries[0][k]
        flat = to_device(host, device).to(dtype)
        full = flat.new_zeros(S * width, flat.size(-1))
        full.index_copy_(0, index, flat)
        out.append(full.view(S, width, -1))
    return tuple(out)


def row_keys(tokens: Tensor, pad: int, *others: Tensor, tag: Optional[str] = None
             ) -> List[Hashable]:
    """One key per row: the row's non-padding tokens (with those of the same
    row of ``others``), prefixed by ``tag`` when given (so that entries of
    different kinds never share a key)."""
    lists = [[tuple(x for x in row if x != pad) for row in t.tolist()]
             for t in (tokens,) + others]
    prefix = (tag,) if tag is not None else ()
    return [prefix + tuple(lst[i] for lst in lists) for i in range(tokens.size(0))]


def weights_signature(params) -> Tuple:
    """What identifies the values of ``params`` (an iterable of tensors):
    their storage, dtype and in-place version counters. It changes when the
    weights are loaded (``copy_``), moved or cast, or updated in place."""
    return tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)


def assemble(entries: Sequence[Tuple[Tensor, ...]], mask: Tensor, dtype: torch.dtype
             ) -> Tuple[Tensor, ...]:
    """The padded ``S x W x C`` tensors (on ``mask``'s device, in ``dtype``)
    of ``S`` entries: entry ``i``'s rows fill the positions where ``mask[i]``
    (``S x W``) is true, in order; the other positions are 0. One transfer
    per kind of state."""
    S, W = mask.shape
    out = []
    for k in range(len(entries[0])):
        flat = torch.cat([e[k] for e in entries], 0) if len(entries) > 1 else entries[0][k]
        flat = flat.to(mask.device).to(dtype)
        full = flat.new_zeros(S, W, flat.size(-1))
        full[mask] = flat
        out.append(full)
    return tuple(out)


class SentenceStateCache:
    """``key -> tuple of tensors (length x C)`` with LRU eviction.

    :meth:`fetch` returns the states of every requested key, computing the
    missing ones (each distinct key once) with ``compute``, in chunks of at
    most ``chunk_tokens`` padded tokens (sentences sorted by length).

    ``dtype`` / ``device``: how entries are stored (``None``: as computed).
    ``max_sentences``: the number of entries kept (0: none; :meth:`fetch`
    then computes everything and keeps nothing)."""

    def __init__(self, max_sentences: int = 100_000,
                 dtype: Optional[torch.dtype] = None,
                 device: Optional[str] = "cpu", chunk_tokens: int = 8192):
        self.max_sentences = int(max_sentences)
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else None
        self.chunk_tokens = int(chunk_tokens)
        self.store: "OrderedDict[Hashable, Tuple[Tensor, ...]]" = OrderedDict()
        self.signatures: Dict[str, Tuple] = {}
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self.store)

    def __repr__(self) -> str:
        return (f"SentenceStateCache({len(self)}/{self.max_sentences} entries, dtype={self.dtype}, "
                f"device={self.device}, hits={self.hits}, misses={self.misses})")

    def __getstate__(self):
        """Copies (``copy.deepcopy``, pickle) start empty: the states belong
        to the weights they were computed with, not to a copy that may change."""
        state = dict(self.__dict__)
        state["store"], state["signatures"] = OrderedDict(), {}
        state["hits"] = state["misses"] = 0
        return state

    def clear(self) -> None:
        self.store.clear()
        self.signatures.clear()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for e in self.store.values() for t in e)

    def validate(self, name: str, signature: Hashable,
                 tags: Optional[Sequence[Hashable]] = None) -> None:
        """Empty the cache (or only the entries whose key starts with one of
        ``tags``: those computed with these weights) if the weights called
        ``name`` changed since the last call (see :func:`weights_signature`)."""
        if self.signatures.get(name, signature) != signature:
            if tags is None:
                self.clear()
            else:
                for k in [k for k in self.store if k[0] in tags]:
                    del self.store[k]
        self.signatures[name] = signature

    def _store(self, t: Tensor) -> Tensor:
        if self.device is not None or self.dtype is not None:
            t = t.to(device=self.device or t.device, dtype=self.dtype or t.dtype)
        return t

    def fetch(self, keys: Sequence[Hashable], lengths: Sequence[int],
              compute: Callable[[Tensor], Tuple[Tensor, ...]],
              chunk_tokens: Optional[int] = None) -> List[Tuple[Tensor, ...]]:
        """States of each key (each a tuple of ``lengths[i] x C`` tensors).

        ``compute(indices)`` (``indices`` into the request, a list of ints)
        returns a tuple of tensors ``sum(lengths[indices]) x C``: the states
        of those rows, padding left out, concatenated in the order of
        ``indices``. It runs under ``torch.no_grad``."""
        out: List[Optional[Tuple[Tensor, ...]]] = [None] * len(keys)
        first: Dict[Hashable, int] = {}  # missing key -> first index requesting it
        for i, k in enumerate(keys):
            hit = self.store.get(k) if self.max_sentences > 0 else None
            if hit is not None:
                self.store.move_to_end(k)
                out[i] = hit
                self.hits += 1
            elif k in first:
                self.hits += 1  # computed once for the first row asking for it
            else:
                first[k] = i
        missing = sorted(first.values(), key=lambda i: -int(lengths[i]))
        self.misses += len(missing)
        budget = int(chunk_tokens or self.chunk_tokens)
        start = 0
        computed: List[Tuple[Tensor, ...]] = []
        while start < len(missing):
            rows = max(1, budget // max(1, int(lengths[missing[start]])))
            idx = missing[start:start + rows]
            start += len(idx)
            with torch.no_grad():
                computed.append(compute(list(idx)))
        if computed:  # all of the batch's misses: one copy per kind of state
            states = [self._store(torch.cat([c[k] for c in computed], 0)
                                  if len(computed) > 1 else computed[0][k])
                      for k in range(len(computed[0]))]
            parts = [st.split([int(lengths[i]) for i in missing], 0) for st in states]
            for j, i in enumerate(missing):
                entry = tuple(p[j].clone() for p in parts)
                out[i] = entry
                if self.max_sentences > 0:
                    self.store[keys[i]] = entry
                    if len(self.store) > self.max_sentences:
                        self.store.popitem(last=False)
        for i, k in enumerate(keys):
            if out[i] is None:
                out[i] = out[first[k]]
        return out  # type: ignore[return-value]
