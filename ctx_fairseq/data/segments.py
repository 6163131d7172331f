"""Segments of consecutive sentences of one document, planned from the
sentence-level binaries' sizes and ``{split}.docids`` (no re-binarizing):
what ``--doc2doc`` translates at once.

A segment's length on one side is the sum of its sentences' binarized sizes:
each size counts the sentence's ``</s>``, which becomes the separator inside
a segment and stays ``</s>`` for its last sentence, so the separators and the
final ``</s>`` are included. The limit ``max_tokens`` bounds the longer side.

Two modes (:func:`plan_segments`):

* ``greedy`` (Junczys-Dowmunt 2019, segments of up to about 1,000 subwords):
  from a document's first sentence on, each segment takes consecutive
  sentences while it stays within the limit; the next one starts where it
  stopped. With the corpus-wide cumulative sizes, a segment's end is found by
  two binary searches (``np.searchsorted``), so the plan costs
  O(segments x log sentences), linear in the corpus.
* ``multires`` (Sun et al. 2022, multi-resolution training): a document of
  ``N`` sentences is split, at resolution ``k = 0, 1, 2, ...``, into
  ``min(2**k, N)`` chunks of consecutive sentences of near-equal sentence
  counts (chunk ``j`` of ``c`` holds sentences ``floor(j N / c)`` to
  ``floor((j+1) N / c) - 1``: sizes ``N``, ``N/2``, ... differing by at most
  one), for every ``k`` up to ``ceil(log2 N)``, where each chunk is one
  sentence; all resolutions are used together. The paper leaves open what
  happens to a chunk over the length limit (a whole TED talk): here it is
  split greedily at the limit, and the summary counts such chunks per
  resolution. A resolution is not repeated once a document's chunks are
  single sentences: a 3-sentence document has resolutions 0, 1 and 2, with
  chunks of 3; 1 and 2; 1, 1 and 1 sentences.

In both modes a sentence longer than the limit is a segment alone (counted
as ``over_long``); every sentence of the split is in exactly one segment of
each resolution its document has (greedy: the one resolution, 0).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = ["SEGMENT_MODES", "SegmentPlan", "plan_segments", "document_starts", "segment_lengths"]

SEGMENT_MODES = ("greedy", "multires")


@dataclass
class SegmentPlan:
    """Segments as runs of consecutive sentence ids: segment ``i`` holds
    sentences ``starts[i] .. starts[i] + counts[i] - 1`` (corpus order) of
    document ``doc[i]`` (the index of the document in the split, in order of
    appearance), at resolution ``resolution[i]`` (greedy: 0; multires: ``k``,
    the document split into ``2**k`` chunks). ``summary``: the figures the
    task logs (:meth:`describe`)."""

    starts: np.ndarray
    counts: np.ndarray
    resolution: np.ndarray
    doc: np.ndarray
    mode: str
    max_tokens: int
    summary: Dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.starts)

    def sentence_ids(self, i: int) -> np.ndarray:
        """The corpus sentence ids of segment ``i``, in order."""
        return np.arange(self.starts[i], self.starts[i] + self.counts[i], dtype=np.int64)

    def describe(self) -> str:
        """One line for the log."""
        s = self.summary
        per = ", ".join(f"{k}: {n} segments" + (f" ({c} chunks split at the limit)" if c else "")
                        for k, n, c in zip(s["resolutions"], s["segments_per_resolution"],
                                           s["split_chunks_per_resolution"]))
        return (f"{s['segments']} {self.mode} segments of at most {self.max_tokens} tokens over "
                f"{s['sentences']} sentences in {s['documents']} documents; per resolution "
                f"{per}; {s['over_long']} sentence(s) longer than the limit, each a segment "
                f"alone; mean {s['mean_sentences']:.2f} sentences, longest "
                f"{s['longest']} tokens")


def document_starts(doc_ids: Sequence[str]) -> np.ndarray:
    """The first sentence of each run of equal ids, and the end (``len``)."""
    arr = np.asarray(doc_ids, dtype=object)
    if len(arr) == 0:
        return np.zeros(1, dtype=np.int64)
    first = np.flatnonzero(np.concatenate([[True], arr[1:] != arr[:-1]]))
    return np.append(first, len(arr)).astype(np.int64)


def _greedy_runs(cum_src: np.ndarray, cum_tgt: np.ndarray, lo: int, hi: int,
                 max_tokens: int, over_long: List[int]) -> List[int]:
    """The starts of the greedy segments of sentences ``lo .. hi - 1``
    (``cum_*``: cumulative sizes with a leading 0); a sentence over the
    limit alone (its id appended to ``over_long``)."""
    out = []
    p = lo
    while p < hi:
        e = min(int(np.searchsorted(cum_src, cum_src[p] + max_tokens, side="right")),
                int(np.searchsorted(cum_tgt, cum_tgt[p] + max_tokens, side="right")),
                hi + 1) - 1  # the last e with both sides within the limit: sentences p..e-1
        if e <= p:
            over_long.append(p)
            e = p + 1
        out.append(p)
        p = e
    return out


def plan_segments(src_sizes, tgt_sizes, doc_ids: Sequence[str], mode: str,
                  max_tokens: int) -> SegmentPlan:
    """The segments of a split (module docstring). ``src_sizes`` /
    ``tgt_sizes``: the binarized sentence sizes (``</s>`` included; the
    target None for a split without references: the source alone counts);
    ``doc_ids``: one id per sentence, documents contiguous (as
    :func:`ctx_fairseq.data.docids.read_docids` checked them)."""
    if mode not in SEGMENT_MODES:
        raise ValueError(f"segment mode {mode!r}: expected one of {', '.join(SEGMENT_MODES)}")
    src = np.asarray(src_sizes, dtype=np.int64)
    tgt = src if tgt_sizes is None else np.asarray(tgt_sizes, dtype=np.int64)
    if len(src) != len(tgt) or len(src) != len(doc_ids):
        raise ValueError(f"{len(src)} source sizes, {len(tgt)} target sizes and "
                         f"{len(doc_ids)} document ids: expected one of each per sentence")
    max_tokens = int(max_tokens)
    cum_src = np.concatenate([[0], np.cumsum(src)])
    cum_tgt = np.concatenate([[0], np.cumsum(tgt)])
    bounds = document_starts(doc_ids) if len(src) else np.zeros(1, dtype=np.int64)
    parts: List[tuple] = []  # (starts, counts, resolution, doc) arrays, in order
    over_long: List[int] = []
    split_chunks: Dict[int, int] = {}
    for d in range(len(bounds) - 1):
        lo, hi = int(bounds[d]), int(bounds[d + 1])
        if mode == "greedy":
            runs = _greedy_runs(cum_src, cum_tgt, lo, hi, max_tokens, over_long)
            parts.append(_part(runs, hi, 0, d))
            continue
        for k, a, b in _multires_chunks(lo, hi):
            fits = np.maximum(cum_src[b] - cum_src[a], cum_tgt[b] - cum_tgt[a]) <= max_tokens
            if fits.all():  # the common case, without a loop over the chunks
                n = len(a)
                parts.append((a, b - a, np.full(n, k, np.int64), np.full(n, d, np.int64)))
                continue
            for j in range(len(a)):
                if fits[j]:
                    runs = [int(a[j])]
                else:  # over the limit: split greedily (a lone over-long sentence stays whole)
                    runs = _greedy_runs(cum_src, cum_tgt, int(a[j]), int(b[j]), max_tokens,
                                        over_long if k == 0 else [])
                    split_chunks[k] = split_chunks.get(k, 0) + int(len(runs) > 1)
                parts.append(_part(runs, int(b[j]), k, d))
    cat = (lambda i: np.concatenate([p[i] for p in parts]).astype(np.int64) if parts
           else np.zeros(0, dtype=np.int64))
    starts, counts, res, docs = cat(0), cat(1), cat(2), cat(3)
    plan = SegmentPlan(starts, counts, res, docs, mode, max_tokens)
    plan.summary = _summary(plan, cum_src, cum_tgt, len(bounds) - 1, len(src), over_long,
                            split_chunks)
    return plan


def _part(runs: List[int], end: int, k: int, d: int) -> tuple:
    """The arrays of the segments starting at ``runs`` (the last ending at
    ``end``), of resolution ``k`` and document ``d``."""
    starts = np.asarray(runs, dtype=np.int64)
    counts = np.diff(np.append(starts, end))
    return starts, counts, np.full(len(runs), k, np.int64), np.full(len(runs), d, np.int64)


def _multires_chunks(lo: int, hi: int):
    """``(k, firsts, ends)`` of each resolution ``k`` of the document of
    sentences ``lo .. hi - 1``: its chunks' first sentences and ends
    (module docstring)."""
    n = hi - lo
    k = 0
    while True:
        c = min(2 ** k, n)
        edges = lo + (np.arange(c + 1, dtype=np.int64) * n) // c
        yield k, edges[:-1], edges[1:]
        if c >= n:
            return
        k += 1


def _summary(plan: SegmentPlan, cum_src: np.ndarray, cum_tgt: np.ndarray, documents: int,
             sentences: int, over_long: List[int], split_chunks: Dict[int, int]) -> Dict:
    ends = plan.starts + plan.counts
    lengths = np.maximum(cum_src[ends] - cum_src[plan.starts],
                         cum_tgt[ends] - cum_tgt[plan.starts]) if len(plan) else np.zeros(0)
    resolutions = sorted(set(plan.resolution.tolist())) or [0]
    per = np.bincount(plan.resolution, minlength=max(resolutions) + 1) if len(plan) else [0]
    return {
        "mode": plan.mode, "max_tokens": plan.max_tokens, "documents": int(documents),
        "sentences": int(sentences), "segments": int(len(plan)),
        "resolutions": resolutions,
        "segments_per_resolution": [int(per[k]) for k in resolutions],
        "split_chunks_per_resolution": [int(split_chunks.get(k, 0)) for k in resolutions],
        "split_chunks": int(sum(split_chunks.values())),
        "over_long": len(over_long), "over_long_sentences": [int(i) for i in over_long[:20]],
        "mean_sentences": float(plan.counts.mean()) if len(plan) else 0.0,
        "longest": int(lengths.max()) if len(plan) else 0,
    }


def segment_lengths(plan: SegmentPlan, sizes: Optional[np.ndarray]) -> np.ndarray:
    """Per segment the sum of its sentences' ``sizes`` (one side's length)."""
    if sizes is None:
        return np.zeros(len(plan), dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
    return cum[plan.starts + plan.counts] - cum[plan.starts]
