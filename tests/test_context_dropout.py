"""Context dropout and CoWord dropout (``--context-dropout P``,
``--coword-dropout P``; Fernandes et al. 2021): the fractions drawn, seeded per
(seed, epoch, sentence), the dropped sentence's context exactly the empty one
of a document's first sentence (with a document memory: no visible memory
sentence), training split only, ``--max-tokens`` still a bound."""

import os

import numpy as np
import pytest
import torch

import ctx_fairseq  # noqa: F401
from fairseq_cli_utils import TINY_MODEL_ARGS, train
from test_document_task import setup_task, synthetic

pytestmark = pytest.mark.usefixtures("one_thread")

DOCS = [10] * 200  # 2,000 sentences, 1,800 with previous-sentence context


def _draws(ds):
    dropped, masked, words = [], 0, 0
    for i in range(len(ds)):
        item = ds[i]
        dropped.append(item["src_ctx"].numel() == 0)
        src = ds.base.src[i]
        changed = item["source"] != src
        assert (item["source"][changed] == ds.src_dict.unk()).all()
        assert int(item["source"][-1]) == ds.src_dict.eos()  # never the final </s>
        masked += int(changed.sum())
        words += int((src >= ds.src_dict.nspecial).sum())
    return np.array(dropped), masked, words


def test_fractions():
    ds, _, _ = synthetic(DOCS, src_context_size=1, tgt_context_size=1, context_dropout=0.3,
                         coword_dropout=0.2, seed=3)
    dropped, masked, words = _draws(ds)
    has = ds.sent_pos > 0
    assert dropped[~has].all()  # first sentences: no context anyway
    frac = dropped[has].mean()
    assert abs(frac - 0.3) < 0.04, frac  # 1,800 draws: sd 0.011
    assert abs(masked / words - 0.2) < 0.02, masked / words  # ~5,400 words: sd 0.005
    # the target side is dropped with the source side (the whole context)
    for i in np.flatnonzero(has)[:200]:
        item = ds[int(i)]
        assert (item["src_ctx"].numel() == 0) == (item["tgt_ctx"].numel() == 0)


def test_dropped_context_is_a_first_sentence_context():
    """A dropped sentence's collated context equals that of a document's first
    sentence (a row of padding, length 0), whole-document offsets included."""
    ds, _, _ = synthetic([6, 6], src_context_size=1, document_context="online",
                         context_dropout=1.0)
    batch = ds.collater([ds[i] for i in range(len(ds))])
    ni = batch["net_input"]
    assert (ni["src_ctx_lengths"] == 0).all()
    assert (ni["src_ctx_tokens"] == ds.src_dict.pad()).all()
    assert (ni["src_ctx_sent_offsets"] == 0).all()
    ref, _, _ = synthetic([6, 6], src_context_size=1, document_context="online")
    first = ref.collater([ref[0]])["net_input"]
    one = ds.collater([ds[3]])["net_input"]
    for k in ("src_ctx_tokens", "src_ctx_lengths", "src_ctx_sent_offsets"):
        assert torch.equal(one[k], first[k])


def test_seeded_per_epoch_and_independent_of_order():
    kw = dict(src_context_size=1, context_dropout=0.3, coword_dropout=0.2)
    a, _, _ = synthetic(DOCS[:30], seed=5, **kw)
    b, _, _ = synthetic(DOCS[:30], seed=5, **kw)
    c, _, _ = synthetic(DOCS[:30], seed=6, **kw)
    idx = list(range(len(a)))
    sa = [a[i]["source"] for i in idx]
    sb = [b[i]["source"] for i in reversed(idx)][::-1]  # another order
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))
    assert [a.dropout_draws(i)[0] for i in idx] == [b.dropout_draws(i)[0] for i in idx]
    assert [a.dropout_draws(i)[0] for i in idx] != [c.dropout_draws(i)[0] for i in idx]
    e1 = [a.dropout_draws(i)[0] for i in idx]
    a.set_epoch(2)
    e2 = [a.dropout_draws(i)[0] for i in idx]
    assert e1 != e2
    m1 = [b.dropout_draws(i)[1] for i in idx]
    b.set_epoch(2)
    assert any(not np.array_equal(x, y) for x, y in zip(m1, [b.dropout_draws(i)[1] for i in idx]))
    # a new iterator every epoch (data loader workers see the epoch)
    assert not a.can_reuse_epoch_itr_across_epochs
    off, _, _ = synthetic(DOCS[:30], seed=5, src_context_size=1)
    assert off.can_reuse_epoch_itr_across_epochs and off.dropout_draws(3) == (False, None)


def test_max_tokens_still_bounds_the_batches():
    ds, _, _ = synthetic(DOCS[:40], src_context_size=2, tgt_context_size=1,
                         context_dropout=0.3, coword_dropout=0.3)
    batches = ds.batch_by_size(ds.ordered_indices(), max_tokens=120)
    for b in batches:
        batch = ds.collater([ds[int(i)] for i in b])
        ni = batch["net_input"]
        enc = ni["src_tokens"].numel() + ni["src_ctx_tokens"].numel()
        dec = batch["target"].numel() + ni["tgt_ctx_tokens"].numel()
        assert max(enc, dec) <= 120


@pytest.mark.parametrize("online", [True, False])
def test_document_memory(online):
    """Dropped: ``query_doc = -1`` (no document of the memory: no visible
    sentence); CoWord-masked queries: their memory rows hold the real sentence
    and are encoded apart (``mem_extra_rows``), counted by memory_cost."""
    ds, _, _ = synthetic([5, 7, 3, 9], document_context="online" if online else "offline",
                         document_memory=True, context_dropout=0.4, coword_dropout=0.3, seed=2)
    ref, _, _ = synthetic([5, 7, 3, 9], document_context="online" if online else "offline",
                          document_memory=True)
    for b in ds.batch_by_size(ds.ordered_indices(), max_tokens=60):
        items = [ds[int(i)] for i in b]
        batch = ds.collater(items)
        plain = ref.collater([ref[int(i)] for i in b])["net_input"]
        ni = batch["net_input"]
        ids = batch["id"].numpy()
        by_id = {int(s["id"]): s for s in items}
        dropped = np.array([by_id[int(i)]["ctx_dropped"] for i in ids])
        masked = np.array([by_id[int(i)]["coword_masked"] for i in ids])
        qd = ni["query_doc"].numpy()
        assert (qd[dropped] == -1).all()
        assert np.array_equal(qd[~dropped], plain["query_doc"].numpy()[~dropped])
        # the memory is the real one, whatever the draws
        for k in ("mem_src_tokens", "mem_doc", "mem_pos", "mem_doc_rows", "mem_doc_valid"):
            assert torch.equal(ni[k], plain[k])
        state, extra = ni["mem_state_index"].numpy(), ni["mem_extra_rows"].numpy()
        B = len(ids)
        for r in range(len(state)):
            toks = ni["mem_src_tokens"][r]
            if state[r] < B:  # shares a query: that query's unmasked source
                assert not masked[state[r]]
                q = batch["net_input"]["src_tokens"][state[r]]
                assert torch.equal(toks[toks.ne(1)], q[q.ne(1)])
            else:
                assert extra[state[r] - B] == r
        assert not (masked & (ni["query_mem_row"].numpy() >= 0)).any()
        enc_rows = B + len(extra)
        width = max(ni["src_tokens"].size(1), ni["mem_src_tokens"].size(1))
        assert enc_rows * width <= ds.memory_cost(b) <= 60


# ------------------------------------------------------------------------ the task
def test_training_split_only(toy_bin):
    """The task gives the dropout to the split fairseq-train's trainer loads
    (``data_selector`` passed); validation, generation and scoring loads
    (the same split name included) get none."""
    task = setup_task(toy_bin, "--source-context-size", "1", "--context-dropout", "0.3",
                      "--coword-dropout", "0.1")
    task.load_dataset("valid")
    assert not task.datasets["valid"].dropout_active
    task.load_dataset("train")  # e.g. ctx-cxmi on the training split
    assert not task.datasets["train"].dropout_active
    task.load_dataset("train", combine=True, epoch=1, data_selector=None)
    ds = task.datasets["train"]
    assert ds.dropout_active and ds.context_dropout == 0.3 and ds.coword_dropout == 0.1
    with pytest.raises(ValueError, match="probability"):
        setup_task(toy_bin, "--context-dropout", "1.5")


@pytest.mark.parametrize("arch,extra", [
    ("transformer_context_aware", ["--source-context-size", "1"]),
    ("transformer", ["--concat-context", "--source-context-size", "1",
                     "--target-context-size", "1"]),
    ("transformer_selective_doc", ["--document-context", "online", "--document-memory",
                                   "--context-memory", "shared"]),
])
def test_training_runs_with_dropout(arch, extra, toy_bin, tmp_path, monkeypatch):
    """fairseq-train with both dropouts: the training split draws (and drops
    about the share asked for), the validation split never; the option is in
    the checkpoint; a scorer's load of it has none."""
    from ctx_fairseq.data.document_dataset import DocumentContextDataset

    seen = {"draws": 0, "dropped": 0, "valid": 0}
    orig = DocumentContextDataset.dropout_draws

    def counting(self, index, tokens=None):
        out = orig(self, index, tokens)
        seen["draws"] += 1
        seen["dropped"] += int(out[0])
        return out

    orig_getitem = DocumentContextDataset.__getitem__

    def getitem(self, index):
        if not self.dropout_active:
            seen["valid"] += 1
        return orig_getitem(self, index)

    monkeypatch.setattr(DocumentContextDataset, "dropout_draws", counting)
    monkeypatch.setattr(DocumentContextDataset, "__getitem__", getitem)
    save = str(tmp_path / "ckpt")
    common = [toy_bin, "--arch", arch, "--task", "document_translation", *extra,
              *TINY_MODEL_ARGS, "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3",
              "--max-tokens", "500", "--seed", "1", "--num-workers", "0",
              "--no-progress-bar", "--no-epoch-checkpoints", "--log-format", "json"]
    train([*common, "--max-update", "3", "--save-dir", save, "--context-dropout", "0.3",
           "--coword-dropout", "0.1"])
    assert seen["draws"] > 100 and seen["valid"] > 0  # training and validation batches
    assert 0.15 < seen["dropped"] / seen["draws"] < 0.45
    ckpt = os.path.join(save, "checkpoint_last.pt")
    assert os.path.exists(ckpt)
    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(ckpt)
    assert state["cfg"]["task"]["context_dropout"] == 0.3
    # validation of the trained model: dropout on or off at training gives the same
    from ctx_fairseq.eval.scoring.contrastive import load_checkpoint

    model, task, _ = load_checkpoint(ckpt, toy_bin, cuda=False)
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    inner = getattr(ds, "inner", ds)
    assert not inner.dropout_active
    sample = ds.collater([ds[i] for i in range(8)])
    src = sample["net_input"]["src_tokens"]
    assert not (src == task.source_dictionary.unk()).any()
