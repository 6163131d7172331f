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

Entries are kept on the CPU in half precision by default (a 512-dimensional
state of a 25-token sentence is 25 KB), least recently used first out when
``max_sentences`` is reached. The cache is not saved with checkpoints and is
emptied when the frozen weights are (re)loaded.
"""

from collections import OrderedDict
from typing import Callable, Hashable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["SentenceStateCache", "row_keys"]


def row_keys(tokens: Tensor, pad: int, *others: Tensor) -> List[Hashable]:
    """One key per row: the row's non-padding tokens (with those of the same
    row of ``others``)."""
    rows = [tokens] + list(others)
    lists = [[r[r.ne(pad)].tolist() for r in t.cpu()] for t in rows]
    return [tuple(tuple(lst[i]) for lst in lists) for i in range(tokens.size(0))]


class SentenceStateCache:
    """``key -> tuple of tensors (length x C)`` with LRU eviction.

    :meth:`fetch` returns the states of every requested key, computing the
    missing ones with ``compute(indices) -> tuple of (N x L x C) tensors``
    (``indices`` into the request) in chunks of at most ``chunk`` rows."""

    def __init__(self, max_sentences: int = 100_000, dtype: torch.dtype = torch.float16,
                 device: str = "cpu"):
        self.max_sentences = int(max_sentences)
        self.dtype, self.device = dtype, torch.device(device)
        self.store: "OrderedDict[Hashable, Tuple[Tensor, ...]]" = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self.store)

    def clear(self) -> None:
        self.store.clear()

    def fetch(self, keys: Sequence[Hashable], lengths: Sequence[int], positions: Sequence[Tensor],
              compute: Callable[[Tensor], Tuple[Tensor, ...]], chunk: int = 64
              ) -> List[Tuple[Tensor, ...]]:
        """States of each key (each a tuple of ``length x C`` tensors).

        ``positions[i]`` are the row positions (within the padded row that
        ``compute`` returns) that hold sentence ``i``'s states, so that
        padding is left out of what is stored."""
        out: List[Optional[Tuple[Tensor, ...]]] = [None] * len(keys)
        missing = []
        for i, k in enumerate(keys):
            hit = self.store.get(k) if self.max_sentences > 0 else None
            if hit is not None:
                self.store.move_to_end(k)
                out[i] = hit
                self.hits += 1
            else:
                missing.append(i)
        self.misses += len(missing)
        for start in range(0, len(missing), chunk):
            idx = missing[start:start + chunk]
            with torch.no_grad():
                states = compute(torch.tensor(idx, dtype=torch.long))
            for j, i in enumerate(idx):
                entry = tuple(s[j].index_select(0, positions[i].to(s.device))
                              .to(self.device, self.dtype) for s in states)
                out[i] = entry
                if self.max_sentences > 0:
                    self.store[keys[i]] = entry
                    if len(self.store) > self.max_sentences:
                        self.store.popitem(last=False)
        return out  # type: ignore[return-value]
