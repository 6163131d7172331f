"""SentenceStateCache: content-addressed, computes each sentence once, LRU,
chunks by tokens, emptied when the weights change, copies start empty."""

import copy

import torch

from ctx_fairseq.modules.sentence_cache import (
    SentenceStateCache,
    assemble,
    assemble_rows,
    row_keys,
    sentence_digest,
    weights_signature,
)


def _compute(toks, pad, calls):
    """States of rows ``idx`` at their real tokens: 10 x the token id."""

    def compute(idx):
        calls.append(list(idx))
        rows = toks.index_select(0, torch.tensor(idx, dtype=torch.long))
        return (rows[rows.ne(pad)].float().unsqueeze(-1).expand(-1, 3) * 10,)

    return compute


def test_cache_computes_each_sentence_once_and_strips_padding():
    pad = 1
    toks = torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2], [1, 5, 6, 2]])
    keys = row_keys(toks, pad)
    assert keys[0] == keys[2] != keys[1]
    assert row_keys(toks, pad, tag="src")[0] == ("src", (5, 6, 2))
    calls = []
    cache = SentenceStateCache(max_sentences=10, dtype=torch.float32)
    lengths = toks.ne(pad).sum(1).tolist()
    out = cache.fetch(keys, lengths, _compute(toks, pad, calls))
    assert out[0][0].shape == (3, 3) and out[1][0].shape == (4, 3)
    assert torch.equal(out[0][0][:, 0], torch.tensor([50.0, 60.0, 20.0]))
    assert out[2] is out[0]  # the duplicate row: computed once, one entry
    assert sorted(sum(calls, [])) == [0, 1] and len(cache) == 2
    out2 = cache.fetch(keys, lengths, _compute(toks, pad, calls))
    assert sorted(sum(calls, [])) == [0, 1]  # the second fetch computed nothing
    assert all(torch.equal(a[0], b[0]) for a, b in zip(out, out2))
    assert cache.misses == 2 and cache.hits == 4


def test_cache_default_storage_is_the_computed_precision_on_the_cpu():
    """The states as computed (cached == uncached), on the CPU."""
    toks = torch.tensor([[3, 4, 2]])
    for dtype in (torch.float32, torch.float16):
        cache = SentenceStateCache()
        compute = _compute(toks, 1, [])
        (entry,) = cache.fetch(row_keys(toks, 1), [3],
                               lambda idx: tuple(t.to(dtype) for t in compute(idx)))
        assert entry[0].dtype == dtype and entry[0].device.type == "cpu"
        assert cache.nbytes() == 3 * 3 * dtype.itemsize


def test_cache_evicts_least_recently_used():
    cache = SentenceStateCache(max_sentences=2, dtype=torch.float32)
    toks = torch.arange(12).view(4, 3) + 2
    keys = row_keys(toks, 0)
    compute = _compute(toks, 0, [])  # indices into the request: toks[a:] for keys[a:]
    cache.fetch(keys[:2], [3, 3], compute)
    cache.fetch(keys[:1], [3], compute)       # 0 is now the most recent
    cache.fetch(keys[2:3], [3], _compute(toks[2:], 0, []))     # evicts 1
    assert keys[0] in cache.store and keys[2] in cache.store and keys[1] not in cache.store
    assert len(cache) == 2
    # a request larger than the cache still gets every state
    out = cache.fetch(keys, [3] * 4, compute)
    assert [int(o[0][0, 0]) for o in out] == [20, 50, 80, 110] and len(cache) == 2


def test_disabled_cache_computes_and_keeps_nothing():
    toks = torch.tensor([[3, 4, 2], [3, 4, 2]])
    calls = []
    cache = SentenceStateCache(max_sentences=0, dtype=None, device=None)
    for _ in range(2):
        out = cache.fetch(row_keys(toks, 1), [3, 3], _compute(toks, 1, calls))
        assert out[0] is out[1]
    assert calls == [[0], [0]] and len(cache) == 0


def test_misses_are_computed_in_chunks_of_tokens_longest_first():
    pad = 1
    toks = torch.full((6, 9), pad)
    lengths = [2, 8, 3, 8, 5, 4]
    for i, n in enumerate(lengths):
        toks[i, :n] = torch.arange(n) + 10 * (i + 1)
    calls = []
    cache = SentenceStateCache(dtype=torch.float32, chunk_tokens=16)
    out = cache.fetch(row_keys(toks, pad), lengths, _compute(toks, pad, calls))
    assert calls == [[1, 3], [4, 5, 2], [0]]  # rows x longest <= 16, sorted by length
    for i, n in enumerate(lengths):
        assert torch.equal(out[i][0][:, 0], toks[i, :n].float() * 10)


def test_assemble_rows_pads_like_the_batch():
    entries = [(torch.ones(2, 3), -torch.ones(2, 3)), (2 * torch.ones(3, 3), torch.zeros(3, 3))]
    for left in (True, False):
        full, other = assemble_rows(entries, 4, left, "cpu", torch.float64)
        assert full.dtype == torch.float64 and full.shape == other.shape == (2, 4, 3)
        real = [slice(2, 4), slice(1, 4)] if left else [slice(0, 2), slice(0, 3)]
        for i, (sl, v) in enumerate(zip(real, (1, 2))):
            assert full[i, sl].eq(v).all() and full[i].ne(0).sum() == 3 * (sl.stop - sl.start)
        assert other[0, real[0]].eq(-1).all() and other[0].ne(0).sum() == 6


def test_sentence_digest_is_content_addressed():
    a = sentence_digest([5, 6, 2])
    assert a == sentence_digest(torch.tensor([5, 6, 2]).numpy()) == sentence_digest((5, 6, 2))
    assert a != sentence_digest([5, 6]) and a != sentence_digest([6, 5, 2])
    assert all(isinstance(x, int) and -2 ** 63 <= x < 2 ** 63 for x in a)


def test_assemble_pads_like_the_batch():
    entries = [(torch.ones(2, 3),), (2 * torch.ones(3, 3),)]
    mask = torch.tensor([[False, True, True], [True, True, True]])  # left padding
    (full,) = assemble(entries, mask, torch.float64)
    assert full.dtype == torch.float64 and full.shape == (2, 3, 3)
    assert full[0, 0].eq(0).all() and full[0, 1:].eq(1).all() and full[1].eq(2).all()


def test_validate_empties_the_cache_when_the_weights_change():
    w = torch.nn.Parameter(torch.ones(3))
    cache = SentenceStateCache(dtype=torch.float32)
    toks = torch.tensor([[3, 4, 2]])
    cache.validate("encoder", weights_signature([w]))
    cache.fetch(row_keys(toks, 1), [3], _compute(toks, 1, []))
    cache.validate("encoder", weights_signature([w]))
    assert len(cache) == 1
    with torch.no_grad():
        w.add_(1)  # an in-place update
    cache.validate("encoder", weights_signature([w]))
    assert len(cache) == 0
    cache.fetch(row_keys(toks, 1), [3], _compute(toks, 1, []))
    w.data = w.data.double()  # a cast
    cache.validate("encoder", weights_signature([w]))
    assert len(cache) == 0
    # only the entries of the weights that changed, when tagged
    v = torch.nn.Parameter(torch.ones(3))
    cache.validate("decoder", weights_signature([v]), tags=("tgt",))
    cache.fetch(row_keys(toks, 1, tag="src") + row_keys(toks, 1, tag="tgt"), [3, 3],
                _compute(torch.cat([toks, toks]), 1, []))
    with torch.no_grad():
        v.mul_(2)
    cache.validate("decoder", weights_signature([v]), tags=("tgt",))
    assert [k[0] for k in cache.store] == ["src"]


def test_copies_start_empty():
    toks = torch.tensor([[3, 4, 2]])
    cache = SentenceStateCache(max_sentences=7, dtype=torch.float32)
    cache.fetch(row_keys(toks, 1), [3], _compute(toks, 1, []))
    other = copy.deepcopy(cache)
    assert len(cache) == 1 and len(other) == 0
    assert (other.max_sentences, other.dtype) == (7, torch.float32)
