"""Document memory batches (``--document-memory``): every sentence of a
batch's documents that a query may see, each once; memory linear in the
document; long documents seen whole (never truncated); chunks carry the
memory they need and stay within --max-tokens."""

import numpy as np
import pytest
import torch

import ctx_fairseq  # noqa: F401
from ctx_fairseq.data.batching import memory_batches
from test_document_task import setup_task, synthetic


def _check_batch(ds, batch, online):
    ni = batch["net_input"]
    ids = batch["id"].numpy()
    qd, qp = ni["query_doc"], ni["query_pos"]
    md, mp = ni["mem_doc"], ni["mem_pos"]
    assert torch.equal(qp, torch.from_numpy(ds.sent_pos[ids]))
    docs = list(dict.fromkeys(ds.doc_index[ids].tolist()))
    # memory: per document, positions 0..last visible, each once, document order
    for k, d in enumerate(docs):
        rows = (md == k).nonzero().flatten()
        assert rows.numel() == 0 or torch.equal(rows, torch.arange(rows[0], rows[-1] + 1))
        pos = mp[rows].tolist()
        last = int(qp[qd == k].max())
        n = last if online else int(ds.doc_len[d])
        assert pos == list(range(n))
        for r, p in zip(rows.tolist(), pos):
            j = int(ds.doc_start[d]) + p
            toks = ni["mem_src_tokens"][r]
            toks = toks[toks.ne(ds.src_dict.pad())]
            assert torch.equal(toks, ds.base.src[j])
            assert int(ni["mem_src_lengths"][r]) == len(ds.base.src[j])
    # the query's own row
    for b, i in enumerate(ids):
        r = int(ni["query_mem_row"][b])
        if r >= 0:
            assert int(md[r]) == int(qd[b]) and int(mp[r]) == int(qp[b])
        else:
            assert online and int(qp[b]) == int(qp[qd == qd[b]].max())
    assert "src_ctx_tokens" not in ni


@pytest.mark.parametrize("online", [True, False])
def test_memory_holds_each_visible_sentence_once(online):
    ds, _, _ = synthetic([1, 4, 7, 2, 9], document_context="online" if online else "offline",
                         document_memory=True)
    ids = ds.ordered_indices()
    batches = ds.batch_by_size(ids, max_tokens=10_000)
    assert len(batches) == 1
    batch = ds.collater([ds[int(i)] for i in batches[0]])
    _check_batch(ds, batch, online)
    s = batch["net_input"]["mem_src_tokens"].size(0)
    assert s == (len(ds) - 5 if online else len(ds))  # linear: one row per sentence


@pytest.mark.parametrize("online", [True, False])
def test_long_document_is_seen_whole_in_chunks_within_max_tokens(online):
    ds, src, _ = synthetic([300, 3], document_context="online" if online else "offline",
                           document_memory=True, max_src_context_tokens=64)
    # with a shared memory a chunk encodes what its sentences can see, so chunks
    # help only under a sentence limit; the whole visible document must fit
    max_tokens = 2600
    batches = memory_batches(ds, ds.ordered_indices(), max_tokens, max_sentences=100)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(ds)))
    assert len(batches) > 1
    for b in batches:
        assert ds.memory_cost(b) <= max_tokens
        batch = ds.collater([ds[int(i)] for i in b])
        _check_batch(ds, batch, online)
        ni = batch["net_input"]
        enc = len(np.union1d(b, ds.memory_rows(b)[1])) * max(
            ni["src_tokens"].size(1), ni["mem_src_tokens"].size(1))
        assert enc <= max_tokens
    # the last sentence of the long document sees all 299 others (no truncation at 64)
    last = [b for b in batches if 299 in b.tolist()][0]
    batch = ds.collater([ds[int(i)] for i in last])
    row = batch["id"].tolist().index(299)
    k = int(batch["net_input"]["query_doc"][row])
    assert int((batch["net_input"]["mem_doc"] == k).sum()) == 299 + (0 if online else 1)


def test_a_sentence_whose_memory_does_not_fit_is_a_clear_error():
    ds, _, _ = synthetic([50], document_context="online", document_memory=True)
    with pytest.raises(ValueError, match="with the document memory it needs takes"):
        memory_batches(ds, ds.ordered_indices(), max_tokens=40)


def test_memory_needs_document_context():
    with pytest.raises(ValueError, match="--document-memory needs --document-context"):
        synthetic([3], document_memory=True)


def test_task_batches_with_target_memory(toy_bin):
    task = setup_task(toy_bin, "--document-context", "online", "--document-memory",
                      "--target-context-size", "1")
    task.load_dataset("train")
    ds = task.datasets["train"]
    itr = task.get_batch_iterator(ds, max_tokens=600, seed=1, disable_iterator_cache=True)
    seen = []
    for batch in itr.next_epoch_itr(shuffle=True):
        ni = batch["net_input"]
        _check_batch(ds, batch, online=True)
        assert ni["mem_tgt_tokens"].size(0) == ni["mem_src_tokens"].size(0)
        for r in range(ni["mem_tgt_tokens"].size(0)):
            d = list(dict.fromkeys(ds.doc_index[batch["id"].numpy()].tolist()))[
                int(ni["mem_doc"][r])]
            j = int(ds.doc_start[d]) + int(ni["mem_pos"][r])
            t = ni["mem_tgt_tokens"][r]
            assert torch.equal(t[t.ne(ds.tgt_dict.pad())], ds.base.tgt[j])
        assert ds.memory_cost(batch["id"].numpy()) <= 600
        seen.extend(batch["id"].tolist())
    assert sorted(seen) == list(range(len(ds)))


def test_precomputed_memory_counts_only_the_batch_and_still_sees_the_whole_document():
    ds, _, _ = synthetic([300, 3], document_context="online", document_memory=True,
                         memory_precomputed=True)
    max_tokens = 120
    batches = memory_batches(ds, ds.ordered_indices(), max_tokens)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(ds)))
    assert len(batches) > 10
    for b in batches:
        assert len(b) * int(np.asarray(ds.base.src_sizes)[b].max()) <= max_tokens
        assert ds.memory_cost(b) <= max_tokens
    last = [b for b in batches if 299 in b.tolist()][0]
    batch = ds.collater([ds[int(i)] for i in last])
    _check_batch(ds, batch, online=True)
    k = int(batch["net_input"]["query_doc"][batch["id"].tolist().index(299)])
    assert int((batch["net_input"]["mem_doc"] == k).sum()) == 299
    with pytest.raises(ValueError, match="--memory-precomputed goes with --document-memory"):
        synthetic([3], memory_precomputed=True)


# ------------------------------------------------------- ablations of the memory
def _memory_blocks(ds, batch):
    """Per batch document (global index): the corpus sentences of its memory
    rows, found by their tokens in the donor document ``ds.memory_donor``."""
    ni = batch["net_input"]
    ids = batch["id"].numpy()
    docs = list(dict.fromkeys(ds.doc_index[ids].tolist()))
    out = {}
    for k, d in enumerate(docs):
        rows = (ni["mem_doc"] == k).nonzero().flatten().tolist()
        out[d] = [(r, int(ni["mem_pos"][r])) for r in rows]
    return out


@pytest.mark.parametrize("online", [True, False])
def test_shuffled_memory_is_another_documents(online):
    """--context-ablation shuffled with --document-memory: each document's
    memory rows are the sentences of another document (its donor; positions
    from the donor's start, the donor's tokens), deterministic for the seed;
    the query is still encoded from its own tokens (rows that are queries of
    the batch share them, the others are extra rows)."""
    sizes = [1, 4, 7, 2, 9, 5, 6, 3]
    mode = "online" if online else "offline"
    ds, _, _ = synthetic(sizes, document_context=mode, document_memory=True,
                         ablation="shuffled", seed=4)
    same, _, _ = synthetic(sizes, document_context=mode, document_memory=True,
                           ablation="shuffled", seed=4)
    other, _, _ = synthetic(sizes, document_context=mode, document_memory=True,
                            ablation="shuffled", seed=5)
    donor = ds.memory_donor
    assert np.array_equal(donor, same.memory_donor)
    assert not np.array_equal(donor, other.memory_donor)
    lens = ds.doc_len
    for d in range(len(sizes)):
        if lens[d] == 1:
            assert donor[d] == d
            continue
        assert donor[d] != d
        need = lens[d] - 1 if online else lens[d]
        assert lens[donor[d]] >= need or lens[donor[d]] == max(
            lens[e] for e in range(len(sizes)) if e != d)
    for b in ds.batch_by_size(ds.ordered_indices(), max_tokens=10_000):
        batch = ds.collater([ds[int(i)] for i in b])
        ni = batch["net_input"]
        ids = batch["id"].numpy()
        state = ni["mem_state_index"].numpy()
        B = len(ids)
        for d, rows in _memory_blocks(ds, batch).items():
            e = int(donor[d])
            last = int(ds.sent_pos[ids[ds.doc_index[ids] == d]].max())
            n = (min(last, int(lens[e])) if online else int(lens[e])) if e != d else \
                (last if online else int(lens[d]))
            assert [p for _, p in rows] == list(range(n))
            for r, p in rows:
                j = int(ds.doc_start[e]) + p  # the donor's sentence
                toks = ni["mem_src_tokens"][r]
                assert torch.equal(toks[toks.ne(ds.src_dict.pad())], ds.base.src[j])
                if state[r] < B:
                    assert ids[state[r]] == j
                else:
                    assert j not in set(ids.tolist())
        # the queries: their own tokens, their own document numbers and positions
        for bq, i in enumerate(ids):
            q = ni["src_tokens"][bq]
            assert torch.equal(q[q.ne(ds.src_dict.pad())], ds.base.src[int(i)])
        assert ds.memory_cost(b) >= (B + len(ni["mem_extra_rows"])) * max(
            ni["src_tokens"].size(1), ni["mem_src_tokens"].size(1))


def test_shuffled_memory_of_a_single_document_is_an_error():
    """A split of one document has no other document's memory to give it: the
    shuffled ablation stops, naming the document (keeping its own memory
    reported the true context's figures as the ablation's); a one-sentence
    document, whose sentence has no context anyway, keeps its own."""
    from ctx_fairseq.errors import InputError

    with pytest.raises(InputError, match=r"one document \('.*', 6 sentences\): nothing to "
                                         r"shuffle"):
        ds, _, _ = synthetic([6], document_context="online", document_memory=True,
                             ablation="shuffled", seed=4)
        ds.memory_donor
    ds, _, _ = synthetic([1], document_context="online", document_memory=True,
                         ablation="shuffled", seed=4)
    assert list(ds.memory_donor) == [0]


def test_random_memory():
    """--context-ablation random with --document-memory: the memory's words
    are random tokens (lengths and special symbols kept, seeded), no memory
    row shares a query's encoding, memory_cost counts them all."""
    ds, _, _ = synthetic([4, 7, 2], document_context="offline", document_memory=True,
                         ablation="random", seed=4)
    ref, _, _ = synthetic([4, 7, 2], document_context="offline", document_memory=True)
    b = ds.batch_by_size(ds.ordered_indices(), max_tokens=10_000)[0]
    batch = ds.collater([ds[int(i)] for i in b])
    plain = ref.collater([ref[int(i)] for i in b])["net_input"]
    ni = batch["net_input"]
    for k in ("mem_doc", "mem_pos", "mem_src_lengths", "mem_doc_rows", "mem_doc_valid"):
        assert torch.equal(ni[k], plain[k])
    special = plain["mem_src_tokens"] < ds.src_dict.nspecial
    assert torch.equal(ni["mem_src_tokens"][special], plain["mem_src_tokens"][special])
    words = ~special
    assert (ni["mem_src_tokens"][words] >= ds.src_dict.nspecial).all()
    assert (ni["mem_src_tokens"][words] != plain["mem_src_tokens"][words]).float().mean() > 0.8
    S, B = ni["mem_src_tokens"].size(0), len(b)
    assert torch.equal(ni["mem_state_index"], torch.arange(B, B + S))
    assert (ni["query_mem_row"] == -1).all()
    assert not np.array_equal(ni["mem_src_key"], plain["mem_src_key"])
    again = ds.collater([ds[int(i)] for i in b])["net_input"]
    assert torch.equal(again["mem_src_tokens"], ni["mem_src_tokens"])
    assert ds.memory_cost(b) == (B + S) * ni["mem_src_tokens"].size(1)
