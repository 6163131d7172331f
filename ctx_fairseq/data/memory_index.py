"""The index tensors of a batch's document memory, built on the host by the
collater so that a model's path stays static-shaped: each document's query
rows and query tokens, and its memory sentences by length."""

from typing import Dict

import numpy as np
import torch

def memory_by_length(doc_rows: np.ndarray, valid: np.ndarray, lengths: np.ndarray, width: int,
                     left_pad: bool) -> Dict[str, object]:
    """Each document's memory sentences ordered by length (longest first), so
    that a block of consecutive ones spans few token columns: the selective
    word level reads only the columns its block's sentences occupy
    (:mod:`ctx_fairseq.modules.word_attention`).

    ``doc_rows``/``valid`` (``D x S_max``): the padded document index;
    ``lengths`` (``S``): tokens per memory row; ``width``: the padded width of
    the memory's tokens (left- or right-padded). Returns
    ``mem_doc_rows_by_len`` (``D x S_max`` tensor: memory rows, longest first,
    the invalid entries last), ``mem_doc_len_order`` (``D x S_max`` tensor: the
    column of each of them in position order, a permutation per document) and
    ``mem_doc_span_by_len`` (``D x S_max x 2`` numpy, it stays on the host: the
    token columns ``[start, end)`` each occupies; ``(width, 0)`` for an
    invalid entry)."""
    D, s_max = doc_rows.shape
    lens = np.where(valid, lengths[doc_rows] if len(lengths) else 0, -1)
    order = np.argsort(-lens, axis=1, kind="stable")
    rows = np.take_along_axis(doc_rows, order, axis=1)
    n = np.take_along_axis(lens, order, axis=1)
    span = np.empty((D, s_max, 2), dtype=np.int64)
    ok = n >= 0
    span[..., 0] = np.where(ok, width - n if left_pad else 0, width)
    span[..., 1] = np.where(ok, width if left_pad else n, 0)
    return {"mem_doc_rows_by_len": torch.from_numpy(np.ascontiguousarray(rows)),
            "mem_doc_len_order": torch.from_numpy(np.ascontiguousarray(order)),
            "mem_doc_span_by_len": span}


def query_token_groups(groups: np.ndarray, lengths: np.ndarray, width: int,
                       left_pad: bool) -> np.ndarray:
    """The real (non-padding) query tokens of each document of a batch:
    ``D x M_max`` int64, row ``d`` the flat positions ``b * width + t`` of the
    tokens of the query sentences ``groups[d]`` (:func:`query_groups`), padded
    with ``B * width``. ``lengths``: tokens per batch row; ``width``: the
    padded width of the batch's source (left- or right-padded). The selective
    word level then computes no padded query row."""
    B = len(lengths)
    parts = []
    for row in groups:
        rows = row[row < B]
        if len(rows) == 0:
            parts.append(np.zeros(0, dtype=np.int64))
            continue
        lens = np.asarray(lengths, dtype=np.int64)[rows]
        ends = np.cumsum(lens)
        k = np.arange(int(ends[-1]), dtype=np.int64)
        which = np.searchsorted(ends, k, side="right")
        t = k - (ends - lens)[which]
        t = t + (width - lens[which]) if left_pad else t
        parts.append(rows[which] * width + t)
    out = np.full((len(groups), max([1] + [len(x) for x in parts])), B * width, dtype=np.int64)
    for d, x in enumerate(parts):
        out[d, :len(x)] = x
    return out


def query_groups(query_doc: np.ndarray, num_docs: int) -> np.ndarray:
    """The query sentences of each document of a batch: ``D x Bq_max`` int64,
    row ``d`` the batch rows ``b`` with ``query_doc[b] == d`` in batch order,
    padded with ``B`` (``Bq_max`` >= 1). Rows with ``query_doc`` -1 (context
    dropped) or outside ``0..D-1`` are in no group. The document-memory
    models' per-document layout (one matrix product per document and memory
    block, see :mod:`ctx_fairseq.modules.selective_attention`), built here on
    the host so that the model reads nothing back from the device."""
    query_doc = np.asarray(query_doc, dtype=np.int64)
    B, D = len(query_doc), int(num_docs)
    ok = (query_doc >= 0) & (query_doc < D)
    counts = np.bincount(query_doc[ok], minlength=D) if D else np.zeros(0, dtype=np.int64)
    width = max(1, int(counts.max()) if D else 1)
    out = np.full((D, width), B, dtype=np.int64)
    if ok.any():
        rows = np.flatnonzero(ok)
        order = rows[np.argsort(query_doc[rows], kind="stable")]
        docs = query_doc[order]
        starts = np.cumsum(counts) - counts
        out[docs, np.arange(len(order)) - starts[docs]] = order
    return out


def length_buckets(src_lens: np.ndarray, tgt_lens: np.ndarray, max_buckets: int,
                   src_width: int, tgt_width: int, multiple: int = 1,
                   left_pad_target: bool = False) -> Dict[str, object]:
    """The batch's rows in at most ``max_buckets`` groups of similar length
    (``--length-buckets``): a document batch holds a document's sentences in
    document order, so its tensors are padded to its longest sentence, on
    TVsub about 2.2 times the real tokens; fairseq's own batches, sorted by
    length, have almost no padding. A model runs its sentence-level layers
    per group, each padded only to its own longest row
    (:mod:`ctx_fairseq.models.transformer_selective_doc`).

    The rows are sorted by (source, target) length and cut into contiguous
    groups minimising the padded tokens, sum over groups of rows x (longest
    source + longest target), by dynamic programming (exact for the sorted
    order). ``src_lens``/``tgt_lens`` (``B``): tokens per row;
    ``src_width``/``tgt_width``: the batch's padded widths (a group's width
    is its longest row rounded up to ``multiple``, at most the batch's).
    Returns ``query_bucket_rows`` (``B`` long tensor: the rows, group after
    group), ``query_bucket_restore`` (``B`` long tensor: the position of each
    row in that order), ``query_bucket_shape`` (``K x 3`` numpy int64,
    rows, source width, target width per group: it stays on the host) and
    ``query_bucket_target_index`` (long tensor, one entry per real target
    token): the position of each real target token in the groups' layout,
    each group's ``rows x target width`` positions row by row, group after
    group (``left_pad_target``: a row's tokens at the end of its width), so
    that a decoder computes its output layer on the real tokens only."""
    src = np.asarray(src_lens, dtype=np.int64)
    tgt = np.asarray(tgt_lens, dtype=np.int64)
    n = len(src)
    order = np.lexsort((tgt, src))
    s, t = src[order], tgt[order]
    k_max = max(1, min(int(max_buckets), n))
    inf = np.iinfo(np.int64).max // 4
    best = np.full((k_max + 1, n + 1), inf, dtype=np.int64)
    best[0, 0] = 0
    cut = np.zeros((k_max + 1, n + 1), dtype=np.int64)
    for j in range(1, n + 1):
        # the longest source and target of rows i..j-1, for every i < j
        width = (np.maximum.accumulate(s[:j][::-1])[::-1]
                 + np.maximum.accumulate(t[:j][::-1])[::-1])
        cost = (j - np.arange(j)) * width
        for k in range(1, k_max + 1):
            total = best[k - 1, :j] + cost
            i = int(np.argmin(total))
            best[k, j], cut[k, j] = total[i], i
    k = int(np.argmin(best[1:, n])) + 1  # the fewest groups among the cheapest
    bounds = [n]
    while k > 0:
        bounds.append(int(cut[k, bounds[-1]]))
        k -= 1
    bounds = bounds[::-1]

    def rounded(x: int, full: int) -> int:
        m = max(1, int(multiple))
        return min(full, -(-max(1, x) // m) * m)

    shape = np.array([[b - a, rounded(int(s[a:b].max()), src_width),
                       rounded(int(t[a:b].max()), tgt_width)]
                      for a, b in zip(bounds[:-1], bounds[1:])], dtype=np.int64).reshape(-1, 3)
    restore = np.empty(n, dtype=np.int64)
    restore[order] = np.arange(n, dtype=np.int64)
    # each row's first position in the groups' layout and its width
    widths = np.repeat(shape[:, 2], shape[:, 0])
    starts = np.concatenate([[0], np.cumsum(widths)[:-1]]).astype(np.int64)
    if left_pad_target:
        starts = starts + widths - t
    within = np.arange(int(t.sum()), dtype=np.int64) - np.repeat(np.cumsum(t) - t, t)
    target_index = np.repeat(starts, t) + within
    return {"query_bucket_rows": torch.from_numpy(order.astype(np.int64)),
            "query_bucket_restore": torch.from_numpy(restore),
            "query_bucket_shape": shape,
            "query_bucket_target_index": torch.from_numpy(target_index)}
