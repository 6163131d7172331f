"""The one context-condition API (issue 26): ``ContextCondition``,
``DocumentContextDataset.with_condition`` and ``task.condition_dataset``.
A condition gives the same batches as the dataset built directly with the
matching options, ``none`` of a document memory isolates every sentence,
sizes are refused where there is no bounded context, and the task's options
are never changed."""

import numpy as np
import pytest

from ctx_fairseq.data.conditions import ContextCondition
from ctx_fairseq.errors import InputError
from test_document_task import setup_task, synthetic


def _equal_batches(a, b, rows):
    ba, bb = a.collater([a[i] for i in rows]), b.collater([b[i] for i in rows])
    ka, kb = ba["net_input"], bb["net_input"]
    assert set(ka) == set(kb)
    for k in ka:
        va, vb = ka[k], kb[k]
        assert np.array_equal(np.asarray(va), np.asarray(vb)), k


def test_condition_values_are_checked():
    assert str(ContextCondition("true", 2)) == "true@2"
    assert ContextCondition("shuffled").ablation == "shuffled"
    assert ContextCondition("none").ablation == "none"
    with pytest.raises(InputError, match="unknown context condition 'empty'"):
        ContextCondition("empty")
    with pytest.raises(InputError, match="takes no size"):
        ContextCondition("none", 0)
    with pytest.raises(InputError, match="integer >= 0"):
        ContextCondition("true", -1)


@pytest.mark.parametrize("kind,size,direct", [
    ("true", None, {}),
    ("true", 1, {"context_size": 1}),
    ("none", None, {"context_size": 0}),
    ("shuffled", None, {"ablation": "shuffled"}),
    ("random", 1, {"ablation": "random", "context_size": 1}),
])
def test_a_bounded_context_condition_is_the_dataset_with_those_options(kind, size, direct):
    ds, _, _ = synthetic([4, 5, 3], src_context_size=2, tgt_context_size=1, seed=3)
    want, _, _ = synthetic([4, 5, 3], src_context_size=2, tgt_context_size=1, seed=3, **direct)
    got = ds.with_condition(ContextCondition(kind, size))
    _equal_batches(got, want, [0, 2, 5, 8, 11])
    assert ds.ablation == "none" and ds.context_size is None  # the original is unchanged


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_none_of_a_document_memory_isolates_every_sentence(mode):
    ds, _, _ = synthetic([4, 5], document_context=mode, document_memory=True)
    none = ds.with_condition("none")
    assert none.isolate_sentences and len(none.doc_start) == len(ds)
    assert none.doc_names[6] == "doc1, sentence 2"
    batch = none.collater([none[i] for i in range(len(none))])
    # nothing of its document is visible to a query: online no memory sentence
    # at all; offline each document's memory is the query itself, which the
    # context layer never shows to itself (same position)
    ni = batch["net_input"]
    if mode == "online":
        assert int(ni["mem_doc_valid"].sum()) == 0
    else:
        assert int(ni["mem_doc_valid"].sum()) == len(ds)
        assert ni["mem_doc_valid"].sum(1).max() == 1
        assert int(ni["mem_pos"].abs().sum()) == 0 and int(ni["query_pos"].abs().sum()) == 0
    true = ds.with_condition("true")
    _equal_batches(true, ds, [0, 1, 2, 3])
    assert "query_window" not in true.collater([true[i] for i in range(4)])["net_input"]


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_a_size_of_a_document_memory_is_its_window(mode):
    """A size N of a document memory keeps the memory as it is and gives
    every query the window N (``query_window``: the memory sentences at most
    N positions away, applied by the context layer); everything else of the
    batch is the true condition's."""
    ds, _, _ = synthetic([4, 5], document_context=mode, document_memory=True)
    rows = [0, 3, 6, 8]
    for n in (0, 2):
        sized = ds.with_condition(ContextCondition("true", n))
        batch = sized.collater([sized[i] for i in rows])["net_input"]
        assert batch["query_window"].tolist() == [n] * len(rows)
        plain = ds.collater([ds[i] for i in rows])["net_input"]
        assert set(batch) - set(plain) == {"query_window"}
        for k, v in plain.items():
            assert np.array_equal(np.asarray(v), np.asarray(batch[k])), k
        has = sized.sentences_with_context()
        assert not has.any() if n == 0 else has.tolist() == ds.sentences_with_context().tolist()
    # a whole-document context without a memory has no size to set
    whole, _, _ = synthetic([4, 5], src_context_size=0, document_context="online")
    with pytest.raises(InputError, match="whole-document context has no bounded context size"):
        whole.with_condition(ContextCondition("true", 1))


def test_the_task_builds_conditions_without_changing_its_options(toy_bin):
    task = setup_task(toy_bin, "--source-context-size", "1")
    before = dict(task.cfg)
    for kind in ("true", "none", "shuffled", "random"):
        ds = task.condition_dataset("valid", ContextCondition(kind))
        assert ds.ablation == ContextCondition(kind).ablation
        assert ds.context_size == (0 if kind == "none" else None)
    assert dict(task.cfg) == before
    assert task.datasets["valid"].ablation == "none"


def test_a_condition_is_for_scoring_and_takes_references_as_target_context(toy_bin):
    ds, _, _ = synthetic([4, 5], src_context_size=1, context_dropout=0.5, coword_dropout=0.2,
                         sample_context_size=1)
    scored = ds.with_condition("shuffled")
    assert (scored.context_dropout, scored.coword_dropout, scored.sample_context_size) == (0, 0, 0)
    task = setup_task(toy_bin, "--source-context-size", "1", "--target-context-size", "1",
                      "--target-context-file", "hyps.txt")
    with pytest.raises(InputError, match="takes the target context from the references"):
        task.condition_dataset("valid", ContextCondition("none"))


def test_context_net_input_is_the_collaters_context_of_one_line(toy_bin):
    task = setup_task(toy_bin, "--document-context", "online", "--document-memory")
    ni = task.context_net_input("valid", [3])
    ds = task.datasets["valid"]
    want = ds.collater([ds[3]])["net_input"]
    assert "src_tokens" not in ni and set(ni) == set(want) - {"src_tokens", "src_lengths",
                                                               "prev_output_tokens"}
    assert "query_doc_tokens" in ni and "mem_src_tokens" in ni
    for k, v in ni.items():
        assert np.array_equal(np.asarray(v), np.asarray(want[k])), k
    with pytest.raises(ValueError, match="one line per call"):
        task.context_net_input("valid", [1, 2])
    with pytest.raises(InputError, match="record says 'nope'"):
        task.context_net_input("valid", [3], doc_ids=["nope"])
