"""Fixes for fairseq behaviour that silently loses data, applied on import.

``fairseq.data.data_utils.batch_by_size`` (fairseq >= 0.12.3 and its forks,
including ``ve-fairseq``) drops the last batch when its size is not a
multiple of ``--required-batch-size-multiple`` (default 8): up to 7 sentences
are skipped in every training epoch and, worse, ``fairseq-generate`` leaves
out test sentences, so BLEU is computed on part of the test set (upstream
issues facebookresearch/fairseq#5036 and #5351). Importing ``ctx_fairseq``
(``--user-dir ctx_fairseq``) restores fairseq 0.12.2's behaviour: the last,
smaller batch is kept. Every index appears in exactly one batch.
"""

import functools

import numpy as np


def _keep_last_batch(original):
    @functools.wraps(original)
    def batch_by_size(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None,
                      max_sentences=None, required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        if len(indices) == 0:
            return []
        batches = original(indices, num_tokens_fn, num_tokens_vec=num_tokens_vec,
                           max_tokens=max_tokens, max_sentences=max_sentences,
                           required_batch_size_multiple=required_batch_size_multiple,
                           fixed_shapes=fixed_shapes)
        if fixed_shapes is None:
            covered = sum(len(b) for b in batches)
            if covered < len(indices):  # batches are consecutive slices of indices
                batches = list(batches) + [indices[covered:]]
        return batches

    batch_by_size.ctx_fairseq_fixed = True
    return batch_by_size


def keep_last_batch() -> None:
    """Patch ``fairseq.data.data_utils.batch_by_size`` (idempotent)."""
    from fairseq.data import data_utils

    if not getattr(data_utils.batch_by_size, "ctx_fairseq_fixed", False):
        data_utils.batch_by_size = _keep_last_batch(data_utils.batch_by_size)
