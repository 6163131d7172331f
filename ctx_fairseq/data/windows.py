"""Context windows: per sentence the ranges of its previous and next context
sentences within its document, and their truncation to the position
limits (the longest sentences dropped first where a window is too long)."""

from typing import Optional

import numpy as np

from ctx_fairseq.errors import InputError

PARTIAL_NONE, PARTIAL_PREV, PARTIAL_NEXT = 0, 1, 2


def context_ranges(doc_start: np.ndarray, doc_end: np.ndarray, k: Optional[int], direction: str):
    """Per sentence the half-open index ranges of the previous and the next
    context sentences (empty ranges where there are none), within the doc."""
    n = len(doc_start)
    idx = np.arange(n, dtype=np.int64)
    empty = idx.copy()
    big = n if k is None else k
    if direction in ("prev", "both") and big > 0:
        p_lo, p_hi = np.maximum(idx - big, doc_start), idx
    else:
        p_lo, p_hi = empty, empty
    if direction in ("next", "both") and big > 0:
        n_lo, n_hi = idx + 1, np.minimum(idx + 1 + big, doc_end)
    else:
        n_lo, n_hi = empty + 1, empty + 1
    return p_lo, p_hi, n_lo, n_hi


def truncate_windows(unit: np.ndarray, window, limit):
    """Cut context windows to at most ``limit`` tokens, nearest sentences first.

    ``limit`` is one number for every sentence, or an array with one per
    sentence (0: no context at all), or None (no limit).

    ``unit[j]`` is the number of tokens sentence ``j`` contributes to a
    context (its tokens plus one separator); ``window`` is ``(p_lo, p_hi,
    n_lo, n_hi)`` per sentence. Sentences are taken in order of distance from
    the current one (previous before next at equal distance: ``-1, +1, -2,
    +2, ...``) while the total fits, and the first one that does not fit ends
    the context, so the kept context is contiguous around the current
    sentence. Where even the nearest sentence does not fit, its ``limit``
    tokens nearest the current sentence are kept (its end for a previous
    sentence, its beginning for a next one).

    Returns ``(window, partial, length, full_length)``: the cut windows, per
    sentence ``PARTIAL_PREV``/``PARTIAL_NEXT`` where only part of the nearest
    sentence is kept, the kept context length and the uncut length (tokens).
    Vectorised: a binary search over the distance, O(n log doc length).
    """
    p_lo, p_hi, n_lo, n_hi = (np.asarray(w, dtype=np.int64) for w in window)
    cs = np.concatenate([[0], np.cumsum(np.asarray(unit, dtype=np.int64))])

    def total(r):
        lo = np.maximum(p_hi - r, p_lo)
        hi = np.minimum(n_lo + r, n_hi)
        return (cs[p_hi] - cs[lo]) + (cs[hi] - cs[n_lo])

    span = np.maximum(p_hi - p_lo, n_hi - n_lo)
    full = total(span)
    partial = np.zeros(len(p_lo), dtype=np.int8)
    if limit is None or not (full > limit).any():
        return (p_lo, p_hi, n_lo, n_hi), partial, full, full
    lo_r, hi_r = np.zeros_like(span), span.copy()
    while (lo_r < hi_r).any():
        mid = (lo_r + hi_r + 1) // 2
        ok = total(mid) <= limit
        lo_r = np.where(ok, mid, lo_r)
        hi_r = np.where(ok, hi_r, mid - 1)
    r = lo_r
    kept = total(r)
    cand = p_hi - r - 1  # the previous sentence at distance r + 1, if it exists
    has_cand = cand >= p_lo
    extra = has_cand & (kept + np.where(has_cand, unit[np.clip(cand, 0, None)], 0) <= limit)
    new_p_lo = np.maximum(p_hi - r - extra, p_lo)
    new_n_hi = np.minimum(n_lo + r, n_hi)
    kept = (cs[p_hi] - cs[new_p_lo]) + (cs[new_n_hi] - cs[n_lo])
    nothing = (kept == 0) & (full > 0)
    none_allowed = np.broadcast_to(np.asarray(limit) <= 0, nothing.shape)
    nothing = nothing & ~none_allowed  # a limit of 0 keeps nothing, not a part
    partial[nothing & (p_hi > p_lo)] = PARTIAL_PREV
    partial[nothing & (p_hi == p_lo)] = PARTIAL_NEXT
    length = np.where(nothing, limit, kept)
    return (new_p_lo, p_hi, n_lo, new_n_hi), partial, length, full


def longest_sentences(unit: np.ndarray, window, partial: np.ndarray, length: np.ndarray,
                      width: int) -> np.ndarray:
    """Per sentence the longest sentence of its (cut) context window, in
    tokens with the separator that ends it (``unit``): the row width a model
    needs that pads each context sentence to its own row; the kept part where
    only part of the nearest sentence is kept (``partial``: ``length``); 0
    without context. ``width`` is the most sentences a window holds per
    direction. Vectorised, O(n x width)."""
    p_lo, p_hi, n_lo, n_hi = (np.asarray(w, dtype=np.int64) for w in window)
    out = np.zeros(len(p_lo), dtype=np.int64)
    unit = np.asarray(unit, dtype=np.int64)
    if len(unit) == 0 or len(out) == 0:
        return out
    for lo, hi in ((p_lo, p_hi), (n_lo, n_hi)):
        for d in range(int(width)):
            j = lo + d
            ok = j < hi
            if not ok.any():
                break
            out = np.where(ok, np.maximum(out, unit[np.where(ok, j, 0)]), out)
    return np.where(np.asarray(partial) != PARTIAL_NONE, np.asarray(length, dtype=np.int64), out)


def check_context_sizes(sample, fixed, src_k, tgt_k, direction: str, document_context: str,
                        memory: bool):
    """``--sample-context-size`` K and a scorer's ``--context-size`` N,
    checked (InputError): ``(K, N)``. Both need a bounded per-sentence context of
    previous sentences, or a document memory (whose window they then bound:
    the memory sentences at most that many positions away, see
    ``DocumentContextDataset.collate_memory``'s ``query_window``); a
    whole-document context without a memory has no size to cut."""
    largest = max(int(src_k), int(tgt_k))
    for name, v in (("--sample-context-size", sample), ("--context-size", fixed)):
        if v is None or (name == "--sample-context-size" and not v):
            continue
        if isinstance(v, bool) or int(v) != v or int(v) < 0:
            raise InputError(f"{name} must be an integer >= 0, got {v!r}")
        if memory:
            continue  # a window of the memory: any size (0: the empty context)
        if document_context != "none":
            raise InputError(
                f"{name} cuts a bounded context of previous sentences (--source-context-size"
                f" / --target-context-size) or a document memory's window; a whole-document "
                f"context (--document-context {document_context}) has no such size "
                "(docs/document_translation.md, 'Sampled context size')")
        if largest == 0:
            raise InputError(f"{name} {v} on a sentence-level setting (--source-context-size"
                             " and --target-context-size 0): there is no context to size")
        if direction != "prev" and not (name == "--context-size" and int(v) == 0):
            # (size 0, the empty context, needs no direction: CXMI's "none")
            raise InputError(f"{name} counts previous sentences (--context-direction prev), "
                             f"got --context-direction {direction}")
        if int(v) > largest:
            raise InputError(f"{name} {v} is larger than the context size "
                             f"({largest} previous sentences)")
    return int(sample or 0), (None if fixed is None else int(fixed))
