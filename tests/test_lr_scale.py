"""``--lr-scale-pretrained`` (``ctx_fairseq.optim.lr_scale``): the parameters
loaded from a sentence checkpoint train at a scaled rate, the model's new ones
at the schedule's rate, through fairseq's real Trainer (fairseq-train
in-process, a tiny transformer fine-tuned from the session's sentence
checkpoint with ``--finetune-from-model``, one thread, CPU).

The new parameters are declared by patching ``new_parameter_names`` onto
fairseq's transformer (as transformer_gtrans declares its global layers).
The scale is given by patching ``lr_scale_of`` (the plain translation task
has no ``--lr-scale-pretrained``); the document task's option itself is
given on G-Transformer's second stage (doc2doc segments, transformer_gtrans
fine-tuned from the sentence transformer)."""

import os

import pytest
import torch

import ctx_fairseq  # noqa: F401
from ctx_fairseq.errors import InputError
from ctx_fairseq.optim import lr_scale
from fairseq_cli_utils import TINY_MODEL_ARGS, cli_args

pytestmark = pytest.mark.usefixtures("one_thread")

NEW = {"decoder.layers.1.fc1.weight", "decoder.layers.1.fc1.bias",
       "encoder.layers.0.self_attn.k_proj.weight"}
LR = 1e-3


@pytest.fixture
def declared(monkeypatch):
    from fairseq.models.transformer import TransformerModel

    monkeypatch.setattr(TransformerModel, "new_parameter_names", lambda self: set(NEW),
                        raising=False)


def _argv(data, save, updates, extra=()):
    return [data, "--arch", "transformer", *TINY_MODEL_ARGS, "--share-all-embeddings",
            "--optimizer", "adam", "--lr", str(LR), "--max-tokens", "500", "--dropout", "0",
            "--max-update", str(updates), "--save-dir", save, "--no-progress-bar",
            "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
            "--disable-validation", *extra]


def _train(monkeypatch, argv, scale=None, device="cpu"):
    """Run fairseq-train ``argv`` (with the scale ``scale`` if given, else the
    task's option); returns its Trainer."""
    from fairseq import distributed_utils
    from fairseq.trainer import Trainer
    from fairseq_cli import train as fs_train

    if scale is not None:
        monkeypatch.setattr(lr_scale, "lr_scale_of", lambda cfg: scale)
    made = []

    class Recorded(Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(fs_train, "Trainer", Recorded)
    distributed_utils.call_main(_cfg(argv, device), fs_train.main)
    return made[-1]


def _cfg(argv, device="cpu"):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    return convert_namespace_to_omegaconf(cli_args(options.get_training_parser(), argv, device))


def _expected_groups(trainer):
    """(pretrained, new) tensor counts of the model's trainable parameters."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    mask = lr_scale.pretrained_mask(trainer.model, params)
    return sum(mask), len(mask) - sum(mask)


def _check_rates(trainer, schedule_lr, scale):
    groups = trainer.optimizer.param_groups
    pretrained, new = _expected_groups(trainer)
    assert [len(g["params"]) for g in groups] == [pretrained, new] and new == len(NEW)
    assert trainer.get_lr() == pytest.approx(schedule_lr, rel=1e-12)
    assert groups[0]["lr_scale"] == scale and groups[1]["lr_scale"] == 1.0
    assert groups[0]["lr"] == pytest.approx(scale * schedule_lr, rel=1e-12)
    assert groups[1]["lr"] == pytest.approx(schedule_lr, rel=1e-12)


SCHEDULES = {
    # 3 updates into a 4-update warmup from 1e-4: the rate of update 3
    "inverse_sqrt": (["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4",
                      "--warmup-init-lr", "1e-4"], 1e-4 + 3 * (LR - 1e-4) / 4),
    "fixed": (["--lr-scheduler", "fixed"], LR),
}
PRECISIONS = {"fp32": [], "fp16": ["--fp16", "--fp16-no-flatten-grads"],
              "memory_efficient_fp16": ["--memory-efficient-fp16"]}


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_each_group_rate_after_the_scheduler_stepped(precision, schedule, toy_bin,
                                                     sentence_ckpt, tmp_path, monkeypatch,
                                                     declared):
    if precision == "memory_efficient_fp16" and schedule == "fixed":
        pytest.skip("one schedule is enough for the second fp16 wrapper")
    extra, schedule_lr = SCHEDULES[schedule]
    trainer = _train(monkeypatch, _argv(toy_bin, str(tmp_path), 3,
                                        ["--finetune-from-model", sentence_ckpt, *extra,
                                         *PRECISIONS[precision]]), 0.2, device="cpu")
    assert trainer.get_num_updates() == 3
    _check_rates(trainer, schedule_lr, 0.2)
    if precision != "fp32":
        assert next(trainer.model.parameters()).dtype == torch.float16
        kind = {"fp16": "FP16Optimizer", "memory_efficient_fp16": "MemoryEfficientFP16Optimizer"}
        assert type(trainer.optimizer).__name__ == kind[precision]
    saved = torch.load(os.path.join(str(tmp_path), "checkpoint_last.pt"), weights_only=False)
    groups = saved["last_optimizer_state"]["param_groups"]
    assert [g["lr_scale"] for g in groups] == [0.2, 1.0]
    assert groups[0]["lr"] == pytest.approx(0.2 * schedule_lr, rel=1e-12)


def test_adam_step_is_scaled(toy_bin, sentence_ckpt, tmp_path, monkeypatch, declared):
    """One update from the same checkpoint at scale 1 and 0.25: Adam's first
    step is proportional to the rate, so the pretrained parameters move 0.25x
    as far and the new ones exactly as far."""
    start = torch.load(sentence_ckpt, weights_only=False)["model"]
    moved = {}
    for scale in (1.0, 0.25):
        save = str(tmp_path / str(scale))
        trainer = _train(monkeypatch, _argv(toy_bin, save, 1, [
            "--finetune-from-model", sentence_ckpt, "--lr-scheduler", "fixed"]), scale)
        assert len(trainer.optimizer.param_groups) == (2 if scale != 1.0 else 1)
        state = torch.load(os.path.join(save, "checkpoint_last.pt"), weights_only=False)["model"]
        moved[scale] = {k: state[k].double() - start[k].double() for k in start}
    for k in start:
        if "version" in k or k.endswith("_float_tensor"):
            continue
        full, scaled = moved[1.0][k], moved[0.25][k]
        assert full.abs().max() > 0, k
        if k in NEW:
            assert torch.equal(scaled, full), k
        else:
            ulp = torch.finfo(torch.float32).eps * start[k].abs().max().item()  # storage
            torch.testing.assert_close(scaled, 0.25 * full, rtol=1e-3, atol=4 * ulp,
                                       msg=lambda m, k=k: f"{k}: {m}")


def test_default_scale_changes_nothing(toy_bin, sentence_ckpt, tmp_path, monkeypatch, declared):
    trainer = _train(monkeypatch, _argv(toy_bin, str(tmp_path), 2, [
        "--finetune-from-model", sentence_ckpt]), 1.0)
    (group,) = trainer.optimizer.param_groups
    assert "lr_scale" not in group and "unscaled_lr" not in group and group["lr"] == LR


def test_resume_keeps_the_groups(toy_bin, sentence_ckpt, tmp_path, monkeypatch, declared):
    """Resumed from checkpoint_last.pt (fairseq then ignores
    --finetune-from-model), the run has the same groups, at the scale the
    resumed run is given; resuming without the scale is an error."""
    extra = ["--finetune-from-model", sentence_ckpt, "--lr-scheduler", "inverse_sqrt",
             "--warmup-updates", "4", "--warmup-init-lr", "1e-4"]
    save = str(tmp_path)
    first = _train(monkeypatch, _argv(toy_bin, save, 2, extra), 0.2)
    state = {id(p): n for n, p in first.model.named_parameters()}
    names = [[state[id(p)] for p in g["params"]] for g in first.optimizer.param_groups]
    resumed = _train(monkeypatch, _argv(toy_bin, save, 3, extra), 0.5)
    assert resumed.get_num_updates() == 3
    state = {id(p): n for n, p in resumed.model.named_parameters()}
    assert [[state[id(p)] for p in g["params"]] for g in resumed.optimizer.param_groups] == names
    assert all(len(resumed.optimizer.optimizer.state[p]) for p in resumed.optimizer.params)
    _check_rates(resumed, 1e-4 + 3 * (LR - 1e-4) / 4, 0.5)
    with pytest.raises(InputError, match="parameter group"):
        _train(monkeypatch, _argv(toy_bin, save, 4, extra), 1.0)


@pytest.mark.parametrize("extra, message", [
    ([], "no sentence checkpoint"),
    (["--finetune-from-model", "CKPT", "--fp16"], "--fp16-no-flatten-grads"),
])
def test_refused(extra, message, toy_bin, sentence_ckpt, tmp_path, monkeypatch, declared):
    extra = [sentence_ckpt if a == "CKPT" else a for a in extra]
    with pytest.raises(InputError, match=message):
        _train(monkeypatch, _argv(toy_bin, str(tmp_path), 1, extra), 0.2, device="cpu")


def test_unknown_new_name_is_a_bug(toy_bin, sentence_ckpt, tmp_path, monkeypatch):
    from fairseq.models.transformer import TransformerModel

    monkeypatch.setattr(TransformerModel, "new_parameter_names",
                        lambda self: {"decoder.no_such.weight"}, raising=False)
    with pytest.raises(RuntimeError, match="no_such"):
        _train(monkeypatch, _argv(toy_bin, str(tmp_path), 1,
                                  ["--finetune-from-model", sentence_ckpt]), 0.2)


DOC2DOC = ["--task", "document_translation", "--doc2doc", "greedy", "--doc2doc-max-tokens", "64",
           "--source-context-size", "0"]


def test_document_task_option_with_transformer_gtrans(toy_bin, sentence_ckpt, tmp_path,
                                                      monkeypatch):
    """The real option (the document task's --lr-scale-pretrained) on G-Transformer's
    second stage: doc2doc segments, transformer_gtrans fine-tuned from the sentence
    transformer; its global attentions and gates (new_parameter_names) at the rate,
    everything loaded from the sentence checkpoint at 0.2x."""
    argv = _argv(toy_bin, str(tmp_path), 2, [
        *DOC2DOC, "--finetune-from-model", sentence_ckpt, "--lr-scale-pretrained", "0.2",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4", "--warmup-init-lr", "1e-4"])
    argv[argv.index("transformer")] = "transformer_gtrans"
    assert lr_scale.lr_scale_of(_cfg(argv)) == 0.2
    trainer = _train(monkeypatch, argv)
    model = trainer.model
    new = model.new_parameter_names()
    names = {id(p): n for n, p in model.named_parameters()}
    groups = trainer.optimizer.param_groups
    assert new and {names[id(p)] for p in groups[1]["params"]} == new
    assert not new & {names[id(p)] for p in groups[0]["params"]}
    _check_rates_of(trainer, 1e-4 + 2 * (LR - 1e-4) / 4, 0.2, len(new))


def test_document_task_option_refused_without_checkpoint(toy_bin, tmp_path, monkeypatch):
    argv = _argv(toy_bin, str(tmp_path), 1, [*DOC2DOC, "--lr-scale-pretrained", "0.2"])
    with pytest.raises(InputError, match="no sentence checkpoint"):
        _train(monkeypatch, argv)



def _check_rates_of(trainer, schedule_lr, scale, new):
    groups = trainer.optimizer.param_groups
    assert len(groups) == 2 and len(groups[1]["params"]) == new
    assert trainer.get_lr() == pytest.approx(schedule_lr, rel=1e-12)
    assert [g["lr_scale"] for g in groups] == [scale, 1.0]
    assert groups[0]["lr"] == pytest.approx(scale * schedule_lr, rel=1e-12)
    assert groups[1]["lr"] == pytest.approx(schedule_lr, rel=1e-12)


def test_sentence_checkpoint_options(toy_bin, tmp_path):
    """Either option makes a run one from a sentence checkpoint; neither, none."""
    base = _argv(toy_bin, str(tmp_path), 1, ["--task", "document_translation"])
    base[base.index("transformer")] = "transformer_context_aware"
    assert lr_scale.sentence_checkpoint_of(_cfg(base)) is None
    assert lr_scale.lr_scale_of(_cfg(base)) == 1.0
    for option in ("--init-from-sentence-checkpoint", "--finetune-from-model"):
        assert lr_scale.sentence_checkpoint_of(_cfg([*base, option, "ckpt.pt"])) == "ckpt.pt"


def test_set_lr_and_get_lr():
    """A scaled group's rate is the schedule's times its scale; get_lr gives
    the schedule's rate exactly; a group without lr_scale is set as fairseq sets it."""
    from fairseq.optim.sgd import SGD
    from omegaconf import OmegaConf

    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
    opt = SGD(OmegaConf.create({"lr": [0.1], "momentum": 0.0, "weight_decay": 0.0}), params)
    opt.set_lr(0.3)
    assert [g["lr"] for g in opt.param_groups] == [0.3] and opt.get_lr() == 0.3
    torch_opt = opt.optimizer
    torch_opt.param_groups = []
    torch_opt.add_param_group({"params": params[:2], "lr": 0.1, "lr_scale": 0.2})
    torch_opt.add_param_group({"params": params[2:], "lr": 0.1, "lr_scale": 1.0})
    for lr in (0.3, 7e-4, 1e-9):
        opt.set_lr(lr)
        assert opt.get_lr() == lr
        assert [g["lr"] for g in opt.param_groups] == [lr * 0.2, lr]


def test_a_scheduler_that_sets_the_groups_rates_itself_is_read_back():
    """reduce_lr_on_plateau (torch's ReduceLROnPlateau) multiplies every
    group's rate itself: the scaled groups keep their ratio, and get_lr (the
    logged lr, --stop-min-lr) follows the schedule instead of the rate
    set_lr was last given."""
    from types import SimpleNamespace

    from fairseq.optim.adam import FairseqAdam
    from fairseq.optim.lr_scheduler.reduce_lr_on_plateau import ReduceLROnPlateauLRSchedule

    from ctx_fairseq.optim.lr_scale import split_param_groups

    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    m.new_parameter_names = lambda: {"1.weight", "1.bias"}
    opt = FairseqAdam(SimpleNamespace(lr=[1e-3], adam_betas="(0.9, 0.999)", adam_eps=1e-8,
                                      weight_decay=0.0, use_old_adam=False,
                                      fp16_adam_stats=False, tpu=False), list(m.parameters()))
    sch = ReduceLROnPlateauLRSchedule(
        SimpleNamespace(lr=[1e-3], lr_patience=0, lr_shrink=0.1, lr_threshold=1e-4,
                        warmup_updates=0, warmup_init_lr=-1,
                        maximize_best_checkpoint_metric=False), opt)
    split_param_groups(opt, m, 0.2)
    assert opt.get_lr() == 1e-3
    for epoch, loss in enumerate([1.0, 2.0, 3.0]):
        rate = sch.step(epoch, loss)
        pretrained, new = (g["lr"] for g in opt.param_groups)
        assert rate == pytest.approx(1e-3 * 0.1 ** epoch, rel=1e-12)
        assert opt.get_lr() == pytest.approx(new, rel=1e-12)
        assert pretrained == pytest.approx(0.2 * new, rel=1e-12)
