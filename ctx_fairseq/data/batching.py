"""Batches of a document dataset: the padded cost of a batch, batches of
sentences with their context, of whole documents (cut into chunks that fit),
of sentences with their document memory, and the epoch iterator that shards
batches across workers by whole documents (generation with
``--own-target-context`` only: training takes fairseq's round-robin shards,
so that N workers train as one process with ``--update-freq N``)."""

import math
from typing import Dict, List, Optional, Sequence

import numpy as np
from fairseq.data import data_utils, iterators

#: the columns of a batch's part lengths (source, source context, target,
#: target context) padded together: each side with its context
#: (``DocumentContextDataset.SIDES``)
PART_SIDES = ((0, 1), (2, 3))

def padded_cost(count: int, maxima: Sequence[int], sides: Sequence[Sequence[int]]) -> int:
    """Tokens of the padded tensors of a batch of ``count`` sentences whose
    longest sequence of each part is ``maxima[p]`` (each part is padded
    separately; context tensors are at least one column wide): the larger
    side (encoder or decoder) counts."""
    return max(count * sum(max(int(maxima[p]), 1) for p in side) for side in sides)


def _too_large(index: int, parts: np.ndarray, cost: int, max_tokens, note: str = "") -> ValueError:
    return ValueError(
        f"sentence {index} with its context needs {cost} tokens (source {parts[0]}, source "
        f"context {parts[1]}, target {parts[2]}, target context {parts[3]}){note}, more than "
        f"--max-tokens {max_tokens}; raise --max-tokens or use a smaller context "
        "(--source-context-size / --target-context-size / --max-source-positions)")


def context_batches(indices: np.ndarray, parts: np.ndarray, max_tokens: Optional[int] = None,
                    max_sentences: Optional[int] = None, required_batch_size_multiple: int = 1,
                    sides: Sequence[Sequence[int]] = PART_SIDES,
                    note: str = "") -> List[np.ndarray]:
    """fairseq's greedy batching over ``indices`` (in order) with the padded
    size of every tensor counted (:func:`padded_cost`): sentence, context,
    both sides. A batch that overflows is cut to a multiple of
    ``required_batch_size_multiple`` where possible, as fairseq does; the last
    batch is kept whatever its size. A sentence that alone exceeds
    ``max_tokens`` is an error."""
    max_tokens = math.inf if not max_tokens else max_tokens
    max_sentences = math.inf if not max_sentences else max_sentences
    mult = max(1, int(required_batch_size_multiple or 1))
    parts = np.asarray(parts, dtype=np.int64)
    rows = parts.tolist()
    batches: List[np.ndarray] = []
    start = 0
    maxima = [0, 0, 0, 0]
    members: List[List[int]] = []  # part lengths of the current batch's sentences
    for pos, row in enumerate(rows):
        alone = padded_cost(1, row, sides)
        if alone > max_tokens:
            raise _too_large(int(indices[pos]), row, alone, max_tokens, note)
        new = [max(a, b) for a, b in zip(maxima, row)]
        count = len(members) + 1
        if members and (count > max_sentences or padded_cost(count, new, sides) > max_tokens):
            n = len(members)
            keep = n if n < mult else n - n % mult
            batches.append(indices[start:start + keep])
            start += keep
            members = members[keep:]
            maxima = [max((m[p] for m in members), default=0) for p in range(4)]
            new = [max(a, b) for a, b in zip(maxima, row)]
            if members and padded_cost(len(members) + 1, new, sides) > max_tokens:
                batches.append(indices[start:start + len(members)])  # the carried rest
                start += len(members)
                members, maxima = [], [0, 0, 0, 0]
                new = list(row)
        members.append(row)
        maxima = new
    if start < len(indices):
        batches.append(indices[start:])
    return batches


def document_batches(indices: np.ndarray, doc_index: np.ndarray, num_tokens: np.ndarray,
                     max_tokens: Optional[int] = None, max_sentences: Optional[int] = None,
                     sides: Optional[Sequence[Sequence[int]]] = None,
                     note: str = "") -> List[np.ndarray]:
    """Pack runs of same-document ``indices`` (in the given order) into
    batches of whole documents whose padded size stays within ``max_tokens``
    and ``n_sentences`` within ``max_sentences``; a document too large on its
    own is cut into consecutive chunks that fit. ``num_tokens`` is one length
    per index (padded size ``n_sentences x longest``) or ``len x P`` part
    lengths whose padded sizes are added per side (``sides``, see
    :func:`padded_cost`). A single sentence larger than ``max_tokens`` is an
    error when part lengths are given, and a batch of its own otherwise."""
    indices = np.asarray(indices, dtype=np.int64)
    if len(indices) == 0:
        return []
    max_tokens = math.inf if not max_tokens else max_tokens
    max_sentences = math.inf if not max_sentences else max_sentences
    ntok = np.asarray(num_tokens, dtype=np.int64)
    strict = ntok.ndim == 2
    if not strict:
        ntok = ntok[:, None]
        sides = ((0,),)
    elif sides is None:
        sides = PART_SIDES

    def cost(count, maxima):  # vectorised over candidate batch sizes
        count = np.asarray(count)
        return np.max([count * np.sum([np.maximum(maxima[..., p], 1) for p in side], axis=0)
                       for side in sides], axis=0)

    if strict:
        alone = cost(np.ones(len(ntok), dtype=np.int64), ntok)
        if (alone > max_tokens).any():
            k = int(np.argmax(alone > max_tokens))
            raise _too_large(int(indices[k]), ntok[k].tolist(), int(alone[k]), max_tokens, note)
    doc = doc_index[indices]
    bounds = np.concatenate([[0], np.flatnonzero(doc[1:] != doc[:-1]) + 1, [len(indices)]])
    batches: List[np.ndarray] = []
    cur_start, cur_n = 0, 0
    cur_max = np.zeros(ntok.shape[1], dtype=np.int64)
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        n, run_max = b - a, ntok[a:b].max(axis=0)
        new_max = np.maximum(cur_max, run_max)
        if cur_n and (cost(cur_n + n, new_max) > max_tokens or cur_n + n > max_sentences):
            batches.append(indices[cur_start:a])
            cur_start, cur_n, cur_max = a, 0, np.zeros_like(cur_max)
        if cost(n, run_max) <= max_tokens and n <= max_sentences:
            cur_n, cur_max = cur_n + n, np.maximum(cur_max, run_max)
            continue
        # the document alone does not fit: consecutive chunks (current batch is empty)
        j = a
        while j < b:
            running = np.maximum.accumulate(ntok[j:b], axis=0)
            count = np.arange(1, b - j + 1)
            fits = (cost(count, running) <= max_tokens) & (count <= max_sentences)
            take = max(1, int(np.argmin(fits)) if not fits.all() else b - j)
            batches.append(indices[j:j + take])
            j += take
        cur_start, cur_n, cur_max = b, 0, np.zeros_like(cur_max)
    if cur_n:
        batches.append(indices[cur_start:])
    return batches


def memory_batches(ds, indices: np.ndarray,
                   max_tokens: Optional[int] = None,
                   max_sentences: Optional[int] = None) -> List[np.ndarray]:
    """Document batching for models with a document memory (``ds``: the
    :class:`~ctx_fairseq.data.document_dataset.DocumentContextDataset`, which
    imports this module: no import back): whole documents
    (runs of ``indices``) are packed while :meth:`DocumentContextDataset.memory_cost`
    stays within ``max_tokens``; a document too large is cut into consecutive
    chunks, each of which carries the memory it needs (online: the sentences
    before it; offline: the rest of the document), counted in its cost. A
    sentence that does not fit with the memory it needs is an error: shared
    document memory needs what a sentence can see in one batch."""
    indices = np.asarray(indices, dtype=np.int64)
    if len(indices) == 0:
        return []
    max_tokens = math.inf if not max_tokens else max_tokens
    max_sentences = math.inf if not max_sentences else max_sentences
    doc = ds.doc_index[indices]
    bounds = np.concatenate([[0], np.flatnonzero(doc[1:] != doc[:-1]) + 1, [len(indices)]])
    batches: List[np.ndarray] = []
    cur: List[np.ndarray] = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        run = indices[a:b]
        if cur:
            cand = np.concatenate(cur + [run])
            if len(cand) <= max_sentences and ds.memory_cost(cand) <= max_tokens:
                cur.append(run)
                continue
            batches.append(np.concatenate(cur))
            cur = []
        if len(run) <= max_sentences and ds.memory_cost(run) <= max_tokens:
            cur = [run]
            continue
        j = 0
        while j < len(run):  # chunks; the cost grows with the chunk, find the largest
            take = 0
            while (j + take < len(run) and take + 1 <= max_sentences
                   and ds.memory_cost(run[j:j + take + 1]) <= max_tokens):
                take += 1
            if take == 0:
                i = int(run[j])
                raise ValueError(
                    f"sentence {i} (document {ds.doc_names[ds.doc_index[i]]!r}, position "
                    f"{int(ds.sent_pos[i])}) with the document memory it needs takes "
                    f"{ds.memory_cost(run[j:j + 1])} tokens, more than --max-tokens {max_tokens}; "
                    + _memory_advice(ds))
            batches.append(run[j:j + take])
            j += take
    if cur:
        batches.append(np.concatenate(cur))
    return batches


def _memory_advice(ds) -> str:
    """What to do when a sentence and its document memory exceed --max-tokens."""
    if getattr(ds, "context_layout", {}).get("memory") == "separate":
        # a frozen memory is encoded without gradients, in chunks: it need not count
        return ("add --memory-precomputed: a frozen memory (--context-memory frozen) is encoded "
                "without gradients, in chunks, and read from the model's cache, so that "
                "--max-tokens then counts the batch's own sentences only (the paper's setting "
                "for long documents)")
    return "raise --max-tokens (a shared document memory is encoded in the batch)"


def document_groups(batches: Sequence[np.ndarray], doc_index: np.ndarray) -> List[List[int]]:
    """Group batch numbers so that batches sharing a document are together."""
    parent = list(range(len(batches)))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: Dict[int, int] = {}
    for b, batch in enumerate(batches):
        for d in np.unique(doc_index[np.asarray(batch, dtype=np.int64)]).tolist():
            if d in owner:
                ra, rb = find(owner[d]), find(b)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
            else:
                owner[d] = b
    groups: Dict[int, List[int]] = {}
    for b in range(len(batches)):
        groups.setdefault(find(b), []).append(b)
    return [groups[r] for r in sorted(groups)]


def assign_shards(batches: Sequence[np.ndarray], doc_index: np.ndarray,
                  num_shards: int) -> List[List[int]]:
    """Batch numbers per shard: whole document groups, balanced greedily by
    the number of batches (deterministic, the same on every worker)."""
    shards: List[List[int]] = [[] for _ in range(num_shards)]
    for group in document_groups(batches, doc_index):
        target = min(range(num_shards), key=lambda s: (len(shards[s]), s))
        shards[target].extend(group)
    return shards


class DocumentShardedEpochBatchIterator(iterators.EpochBatchIterator):
    """``EpochBatchIterator`` whose shards hold whole documents.

    fairseq deals the (shuffled) batches out round-robin, so the chunks of one
    document could land on different workers. Here the batches are grouped by
    document, the groups are assigned to shards once (balanced by batch
    count), each shard shuffles its own batches per epoch, and shorter shards
    are padded at the end with empty batches (as fairseq pads its shards), so
    every worker runs the same number of steps.
    """

    def __init__(self, dataset, collate_fn, batch_sampler, doc_index, **kwargs):
        super().__init__(dataset, collate_fn, batch_sampler, **kwargs)
        if callable(batch_sampler):
            raise ValueError("document sharding needs frozen batches (no --rebuild-batches)")
        self._shards = assign_shards(self.frozen_batches, doc_index, self.num_shards)

    def __len__(self):
        return max(len(s) for s in self._shards)

    def shard_batches(self, shard_id: Optional[int] = None) -> List:
        sid = self.shard_id if shard_id is None else shard_id
        return [self.frozen_batches[b] for b in self._shards[sid]]

    def ordered_batches(self, epoch, fix_batches_to_gpus, shuffle):
        batches = self.shard_batches()
        if shuffle:
            with data_utils.numpy_seed(self.seed + epoch + self.shard_id):
                order = np.random.permutation(len(batches))
            batches = [batches[i] for i in order]
        batches = batches + [[]] * (len(self) - len(batches))
        if self._supports_prefetch:
            self.dataset.prefetch([i for s in batches for i in s])
        return batches
