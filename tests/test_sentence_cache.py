"""SentenceStateCache: content-addressed, computes each sentence once, LRU."""

import torch

from ctx_fairseq.modules.sentence_cache import SentenceStateCache, row_keys


def test_cache_computes_each_sentence_once_and_strips_padding():
    pad = 1
    toks = torch.tensor([[1, 5, 6, 2], [7, 8, 9, 2], [1, 5, 6, 2]])
    keys = row_keys(toks, pad)
    assert keys[0] == keys[2] != keys[1]
    calls = []

    def compute(idx):
        calls.append(idx.tolist())
        rows = toks.index_select(0, idx).float()
        return (rows.unsqueeze(-1).expand(-1, -1, 3) * 10,)

    cache = SentenceStateCache(max_sentences=10, dtype=torch.float32)
    pos = [r.ne(pad).nonzero().squeeze(1) for r in toks]
    out = cache.fetch(keys, [3, 4, 3], pos, compute)
    assert out[0][0].shape == (3, 3) and out[1][0].shape == (4, 3)
    assert torch.equal(out[0][0][:, 0], torch.tensor([50.0, 60.0, 20.0]))
    out2 = cache.fetch(keys, [3, 4, 3], pos, compute)
    assert sum(len(c) for c in calls) == 3  # the second fetch computed nothing
    assert all(torch.equal(a[0], b[0]) for a, b in zip(out, out2))
    assert cache.hits == 3 and cache.misses == 3


def test_cache_evicts_least_recently_used():
    cache = SentenceStateCache(max_sentences=2, dtype=torch.float32)
    toks = torch.arange(12).view(4, 3) + 2
    keys = row_keys(toks, 0)
    pos = [torch.arange(3)] * 4

    def compute(idx):
        return (toks.index_select(0, idx).float().unsqueeze(-1),)

    cache.fetch(keys[:2], [3, 3], pos[:2], compute)
    cache.fetch(keys[:1], [3], pos[:1], compute)       # 0 is now the most recent
    cache.fetch(keys[2:3], [3], pos[2:3], compute)     # evicts 1
    assert keys[0] in cache.store and keys[2] in cache.store and keys[1] not in cache.store
    assert len(cache) == 2
