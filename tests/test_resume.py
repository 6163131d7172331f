"""fairseq-train killed and resumed from ``checkpoint_last.pt`` ends with the
weights of an uninterrupted run, bit for bit (``ctx_fairseq.compat``:
fairseq >= 0.12.3 built a resumed run's batches for the epoch it resumed at,
other batches than the uninterrupted run's).

The runs are in-process (``fairseq_cli_utils.train``), one thread, CPU; each
run seeds itself (fairseq-train sets the torch and numpy seeds from
``--seed`` and seeds each update with seed + update number).
"""

import os

import pytest
import torch

import ctx_fairseq  # noqa: F401
from fairseq_cli_utils import TINY_MODEL_ARGS, train

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.exactness]


def _train(data, save, max_update, extra):
    train([data, *TINY_MODEL_ARGS, *extra, "--optimizer", "adam", "--lr", "1e-3",
           "--max-tokens", "500", "--max-update", str(max_update), "--save-dir", save,
           "--save-interval-updates", "4", "--no-progress-bar", "--seed", "1",
           "--num-workers", "0", "--disable-validation"])
    return torch.load(os.path.join(save, "checkpoint_last.pt"), weights_only=False)


def _assert_same_run(a, b):
    assert a["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"]
    assert a["optimizer_history"][-1]["num_updates"] == b["optimizer_history"][-1]["num_updates"]
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["last_optimizer_state"]["state"], b["last_optimizer_state"]["state"]
    assert sa.keys() == sb.keys()
    for p in sa:
        for k in sa[p]:
            assert torch.equal(torch.as_tensor(sa[p][k]), torch.as_tensor(sb[p][k])), (p, k)


RUNS = {
    # 7 updates an epoch: the kill (update 8) is one update into epoch 2
    "transformer": (["--arch", "transformer", "--task", "translation", "--dropout", "0.1"],
                    8, 12),
    # 15 updates an epoch: the kill (update 20) is in epoch 2
    "context_aware": (["--arch", "transformer_context_aware", "--task", "document_translation",
                       "--source-context-size", "1", "--dropout", "0.1"], 20, 24),
    # --context-dropout: an iterator per epoch (draws per epoch)
    "context_dropout": (["--arch", "transformer_context_aware", "--task",
                         "document_translation", "--source-context-size", "1",
                         "--dropout", "0.1", "--context-dropout", "0.3"], 20, 24),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_killed_and_resumed_run_ends_as_an_uninterrupted_run(toy_bin, tmp_path, name):
    extra, kill_at, total = RUNS[name]
    whole = _train(toy_bin, str(tmp_path / "whole"), total, extra)
    part = _train(toy_bin, str(tmp_path / "resumed"), kill_at, extra)
    assert part["extra_state"]["train_iterator"]["epoch"] == 2  # killed in epoch 2
    resumed = _train(toy_bin, str(tmp_path / "resumed"), total, extra)  # checkpoint_last.pt
    assert resumed["optimizer_history"][-1]["num_updates"] == total
    _assert_same_run(whole, resumed)


class _Sized:
    """What ``get_batch_iterator`` reads of a task's config."""
    rebuild_batches = False


def _lengths_dataset(reusable):
    """A LanguagePairDataset of many equally long sentences (ties: the order
    among them is the seeded permutation's), recording ``set_epoch``."""
    from fairseq.data import Dictionary, LanguagePairDataset

    d = Dictionary()
    for w in "abcdef":
        d.add_symbol(w)
    sents = [torch.tensor([d.index("abcdef"[(i + j) % 6]) for j in range(3 + i % 2)] + [d.eos()])
             for i in range(64)]
    sizes = [len(s) for s in sents]

    class Recording(LanguagePairDataset):
        epochs = []

        @property
        def can_reuse_epoch_itr_across_epochs(self):
            return reusable

        def set_epoch(self, epoch):
            self.epochs.append(epoch)
            super().set_epoch(epoch)

    return Recording(sents, sizes, d, sents, sizes, d, shuffle=True)


@pytest.mark.parametrize("reusable", [True, False])
def test_batches_do_not_depend_on_the_start_epoch(reusable):
    """A reusable iterator started at epoch 3 (a resumed run) has the batches
    of one started at epoch 1 (an uninterrupted run), starts at epoch 3 and
    sets the dataset's epoch to 3; an iterator rebuilt every epoch keeps
    fairseq's per-epoch batches (seed + epoch in both runs)."""
    from fairseq.data import data_utils
    from fairseq.tasks import FairseqTask

    def make(epoch):
        task = FairseqTask(_Sized())
        ds = _lengths_dataset(reusable)
        itr = task.get_batch_iterator(ds, max_tokens=40, seed=1, epoch=epoch)
        return itr, ds

    first, _ = make(1)
    third, ds = make(3)
    assert third.epoch == 3 and third.next_epoch_idx == 3 and ds.epochs[-1] == 3
    same = [b.tolist() for b in first.frozen_batches] == [b.tolist() for b in third.frozen_batches]
    if reusable:
        assert same
    else:
        with data_utils.numpy_seed(1 + 3):
            order = ds.ordered_indices()
        assert [i for b in third.frozen_batches for i in b] == order.tolist()
        assert not same  # seed + epoch, as fairseq builds them each epoch
