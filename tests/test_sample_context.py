"""The sampled context size (``--sample-context-size K``; Fernandes et al. 2021,
contextual-mt's option of that name) and the fixed context size of scoring
(``context_size``): per training sentence and epoch a size drawn uniformly from
0..K, seeded like the dropouts, the same on the source and the target side,
the nearest sentences kept; the training split only; clear errors where there
is no bounded context to size."""

import collections

import numpy as np
import pytest
import torch

import ctx_fairseq  # noqa: F401
from test_document_task import setup_task, synthetic

pytestmark = pytest.mark.usefixtures("one_thread")


def _n_sentences(ctx, sep, eos):
    return int(((ctx == sep) | (ctx == eos)).sum())


def test_sizes_uniform_nearest_kept_and_same_on_both_sides():
    ds, _, _ = synthetic([12] * 150, src_context_size=3, tgt_context_size=3,
                         sample_context_size=3, seed=4)
    full, _, _ = synthetic([12] * 150, src_context_size=3, tgt_context_size=3, seed=4)
    eos = ds.src_dict.eos()
    counts = collections.Counter()
    for i in np.flatnonzero(ds.sent_pos >= 3):  # a full window of 3 sentences
        i = int(i)
        item, ref = ds[i], full[i]
        k = ds.context_cap(i)
        counts[k] += 1
        for side in ("src", "tgt"):
            ctx, whole = item[f"{side}_ctx"], ref[f"{side}_ctx"]
            assert _n_sentences(ctx, eos, eos) == k
            # the nearest k sentences: the end of the full context, </s> last
            assert torch.equal(ctx, whole[len(whole) - len(ctx):])
            assert k == 0 or int(ctx[-1]) == eos
    n = sum(counts.values())
    assert set(counts) == {0, 1, 2, 3}
    for k in range(4):  # 1,350 draws: each size 0.25 +- 0.012 (sd)
        assert abs(counts[k] / n - 0.25) < 0.05, counts


def test_seeded_per_epoch_independent_of_order():
    kw = dict(src_context_size=2, sample_context_size=2)
    a, _, _ = synthetic([10] * 20, seed=5, **kw)
    b, _, _ = synthetic([10] * 20, seed=5, **kw)
    c, _, _ = synthetic([10] * 20, seed=6, **kw)
    idx = list(range(len(a)))
    ka = [a.context_cap(i) for i in idx]
    assert ka == [b.context_cap(i) for i in reversed(idx)][::-1]
    assert ka != [c.context_cap(i) for i in idx]
    a.set_epoch(2)
    assert ka != [a.context_cap(i) for i in idx]
    # the dropouts' draws are not changed by the sampled size (a generator of its own)
    d1, _, _ = synthetic([10] * 20, seed=5, src_context_size=2, context_dropout=0.3)
    d2, _, _ = synthetic([10] * 20, seed=5, src_context_size=2, context_dropout=0.3,
                         sample_context_size=2)
    assert [d1.dropout_draws(i)[0] for i in idx] == [d2.dropout_draws(i)[0] for i in idx]


def test_fixed_size_and_sentences_layout():
    """A fixed size N (scoring): every sentence its N nearest; 0 the empty
    context a document's first sentence has. HAN's layout (one row per
    slot) keeps its K slots, the dropped ones empty."""
    ds0, _, _ = synthetic([6, 6], src_context_size=2, context_size=0)
    first = ds0.collater([ds0[0]])["net_input"]
    for i in range(len(ds0)):
        one = ds0.collater([ds0[i]])["net_input"]
        for k in ("src_ctx_tokens", "src_ctx_lengths"):
            assert torch.equal(one[k], first[k])
    assert not ds0.sentences_with_context().any()
    ds1, _, _ = synthetic([6, 6], src_context_size=2, context_size=1,
                          context_layout="sentences")
    batch = ds1.collater([ds1[i] for i in range(len(ds1))])["net_input"]
    present = batch["src_ctx_present"].numpy()
    assert present.shape[1] == 2 and not present[:, 0].any()
    assert present[:, 1].sum() == sum(1 for p in ds1.sent_pos if p > 0)


def test_random_ablation_is_cut_before_the_random_words():
    """The cut counts the separators of the real context; the random words
    (which could equal a break symbol) replace the kept words after it: the
    same lengths and separators as the plain context cut to the same size."""
    kw = dict(src_context_size=2, context_size=1)
    rnd, _, _ = synthetic([8] * 10, ablation="random", **kw)
    plain, _, _ = synthetic([8] * 10, **kw)
    for i in np.flatnonzero(rnd.sent_pos >= 2):
        a, b = rnd.context_tokens(int(i), "src"), plain.context_tokens(int(i), "src")
        assert len(a) == len(b) and torch.equal(a == rnd.eos, b == rnd.eos)
        assert not torch.equal(a, b)


def test_training_split_only_and_options(toy_bin):
    task = setup_task(toy_bin, "--source-context-size", "1", "--sample-context-size", "1")
    task.load_dataset("valid")
    assert task.datasets["valid"].sample_context_size == 0
    task.load_dataset("train", data_selector=None)
    assert task.datasets["train"].sample_context_size == 1


@pytest.mark.parametrize("extra, match", [
    (["--source-context-size", "0"], "sentence-level setting"),
    (["--source-context-size", "1", "--sample-context-size", "2"], "larger than the context size"),
    (["--source-context-size", "1", "--context-direction", "both"], "counts previous sentences"),
    (["--document-context", "online"], "whole-document context"),
])
def test_errors(toy_bin, extra, match):
    args = ["--sample-context-size", "1"] + extra if "--sample-context-size" not in extra \
        else extra
    with pytest.raises(ValueError, match=match):
        setup_task(toy_bin, *args)


def test_fairseq_train_refuses_on_one_line(toy_bin, tmp_path):
    """fairseq-train with --sample-context-size and no context: a one-line
    error, no checkpoint directory written."""
    import subprocess
    import sys

    save = tmp_path / "ckpt"
    r = subprocess.run([sys.executable, "-m", "fairseq_cli.train", toy_bin, "--user-dir",
                        "ctx_fairseq", "--task", "translation", "--arch", "transformer",
                        "--sample-context-size", "1", "--save-dir", str(save),
                        "--max-update", "1"], capture_output=True, text=True)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].endswith(
        "error: unrecognized arguments: --sample-context-size 1")
    assert not save.exists()


def test_fairseq_train_document_task_without_context(toy_bin, tmp_path):
    """The document task with no context: fairseq-train stops before writing
    anything with one line, the task's message, and no traceback
    (ctx_fairseq.errors)."""
    import subprocess
    import sys

    save = tmp_path / "ckpt"
    r = subprocess.run([sys.executable, "-m", "fairseq_cli.train", toy_bin, "--user-dir",
                        "ctx_fairseq", "--task", "document_translation", "--source-context-size",
                        "0", "--sample-context-size", "1", "--arch", "transformer",
                        "--max-tokens", "500", "--save-dir", str(save), "--max-update", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        "train: error: --sample-context-size 1 on a sentence-level setting (--source-context-size "
        "and --target-context-size 0): there is no context to size")
    assert "Traceback" not in r.stderr
    # (fairseq-train makes --save-dir, empty, before the task is set up)
    assert not save.exists() or not any(save.iterdir())


@pytest.mark.parametrize("direction", ["next", "both"])
def test_empty_context_for_any_direction(direction):
    """Size 0 (CXMI's empty context) needs no direction: a checkpoint trained
    with next or both sentences is scored against none (it was refused);
    any larger fixed size still counts previous sentences only."""
    ds, _, _ = synthetic([6, 6], src_context_size=1, direction=direction, context_size=0)
    full, _, _ = synthetic([6, 6], src_context_size=1, direction=direction)
    eos = ds.src_dict.eos()
    assert any(len(full[i]["src_ctx"]) for i in range(len(full)))
    for i in range(len(ds)):
        assert _n_sentences(ds[i]["src_ctx"], eos, eos) == 0
    with pytest.raises(ValueError, match="counts previous sentences"):
        synthetic([6, 6], src_context_size=1, direction=direction, context_size=1)


def test_a_document_memory_samples_its_window(toy_bin):
    """--sample-context-size K with a document memory: per training sentence
    and epoch a window k in 0..K (query_window: the memory sentences at most
    k positions away), drawn as the bounded contexts' sizes are; the memory
    itself is unchanged, and validation gets window K."""
    task = setup_task(toy_bin, "--document-context", "online", "--document-memory",
                      "--sample-context-size", "2")
    task.load_dataset("train", data_selector=None)
    task.load_dataset("valid")
    train, valid = task.datasets["train"], task.datasets["valid"]
    rows = list(range(12))
    batch = train.collater([train[i] for i in rows])
    w = batch["net_input"]["query_window"].tolist()
    ids = batch["id"].tolist()  # the collater's row order
    assert w == [train.context_cap(i) for i in ids] and set(w) <= {0, 1, 2} and len(set(w)) > 1
    assert train.collater([train[i] for i in rows])["net_input"]["query_window"].tolist() == w
    train.set_epoch(2)
    assert [train.context_cap(i) for i in ids] != w  # new draws every epoch
    # outside training the widest window it was trained on, never the whole memory
    assert valid.collater([valid[i] for i in rows])["net_input"]["query_window"].tolist() \
        == [2] * len(rows)


def test_a_windowed_memory_is_translated_at_its_window(toy_bin):
    """fairseq-generate checks the checkpoint's task: a document memory
    trained on windows 0..K must be given K (it reads window K then), not
    read whole at distances it never saw; a bounded context's sampled size is
    training-only and not checked; the rebuilt command line carries K."""
    from ctx_fairseq.tasks.context_options import context_option_args
    from ctx_fairseq.errors import InputError
    trained = {"_name": "document_translation", "context_direction": "prev",
               "document_context": "online", "document_memory": True,
               "sample_context_size": 2}
    whole = setup_task(toy_bin, "--document-context", "online", "--document-memory")
    with pytest.raises(InputError, match=r"--memory-window 0 \(trained with 2: the window"):
        whole.check_context_options(trained)
    for option in ("--sample-context-size", "--memory-window", "--sampled-context-size"):
        # the deprecated name, the window, and the sampled size (the window's default)
        windowed = setup_task(toy_bin, "--document-context", "online", "--document-memory",
                              option, "2")
        windowed.check_context_options(trained)  # the same window: accepted
        with pytest.raises(InputError, match=r"--memory-window 2 \(trained with 0"):
            windowed.check_context_options(dict(trained, sample_context_size=0))
    assert context_option_args(trained)[-2:] == ["--memory-window", "2"]
    bounded = dict(trained, document_context="none", document_memory=False,
                   source_context_size=1, sample_context_size=1)
    setup_task(toy_bin, "--source-context-size", "1").check_context_options(bounded)
    assert "--sample-context-size" not in context_option_args(bounded)
    assert "--memory-window" not in context_option_args(bounded)
