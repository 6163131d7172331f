"""The one context specification (issue 35): built once from the task's
options, the two meanings of the old ``--sample-context-size`` split into
``--sampled-context-size`` (training) and ``--memory-window`` (outside
training) with the old name a deprecated alias, checkpoints trained before
the split scored bit for bit, and the conditions applied to the spec."""

import dataclasses
import json
import logging
import os

import pytest

import ctx_fairseq  # noqa: F401  (registers the task)
from ctx_fairseq.data.conditions import (ABLATIONS, COMPARED, CONDITIONS, SIZED,
                                         ContextCondition)
from ctx_fairseq.data.contract import ContextSpec, previous_sentences, sentence_level
from ctx_fairseq.errors import InputError
from fairseq_cli_utils import generate

HERE = os.path.dirname(os.path.abspath(__file__))
LEGACY = os.path.join(HERE, "fixtures", "legacy_sample_context")


def _task(data, *extra):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--task", "document_translation", "--arch", "transformer", *extra])
    return tasks.setup_task(convert_namespace_to_omegaconf(args).task)


# --------------------------------------------------------------------------- the spec


def test_the_spec_is_frozen_keyword_only_and_has_presets():
    spec = previous_sentences(2, target=1)
    assert (spec.source_context_size, spec.target_context_size) == (2, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.source_context_size = 3
    with pytest.raises(TypeError):
        ContextSpec(True)  # keyword-only
    assert not sentence_level().document_task and not sentence_level().uses_context
    # a docstring (a comment) for every field
    import inspect

    src = inspect.getsource(ContextSpec)
    for f in dataclasses.fields(ContextSpec):
        line = next(i for i, l in enumerate(src.splitlines()) if l.strip().startswith(f.name + ":"))
        assert src.splitlines()[line - 1].strip().startswith("#:") or \
            src.splitlines()[line - 1].strip().startswith("#"), f.name


def test_a_split_that_is_not_trained_on_has_no_training_settings_and_reads_the_window():
    spec = ContextSpec(source_context_size=1, document_context="online", document_memory=True,
                       sampled_context_size=3, memory_window=3, context_dropout=0.2,
                       coword_dropout=0.1)
    train = spec.for_split(training=True)
    assert train == dataclasses.replace(spec, memory_window=None)
    assert train.context_cap() is None  # training: the window is drawn
    # a window given without a sampled size does not reach the training split either
    fixed = dataclasses.replace(spec, sampled_context_size=0)
    assert fixed.for_split(training=True).context_cap() is None
    assert fixed.for_split(training=False).context_cap() == 3
    other = spec.for_split(training=False)
    assert (other.sampled_context_size, other.context_dropout, other.coword_dropout) == (0, 0, 0)
    assert other.context_cap() == 3  # the window outside training
    assert dataclasses.replace(other, isolate_sentences=True).context_cap() is None
    assert dataclasses.replace(other, memory_window=0).context_cap() is None  # whole memory


def test_the_task_builds_its_spec_once_from_its_options(toy_bin):
    task = _task(toy_bin, "--source-context-size", "2", "--context-dropout", "0.1",
                 "--sampled-context-size", "2", "--seed", "7", "--context-ablation",
                 "shuffled")
    spec = task.context_spec
    assert isinstance(spec, ContextSpec)
    assert (spec.source_context_size, spec.sampled_context_size, spec.seed, spec.ablation,
            spec.context_dropout, spec.memory_window) == (2, 2, 7, "shuffled", 0.1, None)
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    assert ds.spec == spec.for_split(training=False)  # not the split trained on


# --------------------------------------------------------------------------- two names


def test_the_deprecated_name_sets_both_meanings_with_a_warning(toy_bin, caplog):
    memory = ["--document-context", "online", "--document-memory"]
    with caplog.at_level(logging.WARNING):
        old = _task(toy_bin, *memory, "--sample-context-size", "2").context_spec
    assert "--sample-context-size 2 is deprecated" in caplog.text
    assert "--memory-window 2 (outside training)" in caplog.text
    new = _task(toy_bin, *memory, "--sampled-context-size", "2").context_spec
    assert (old.sampled_context_size, old.memory_window) == (2, 2) == \
        (new.sampled_context_size, new.memory_window)
    assert old == new
    # the window on its own (generation), and a window other than the sampled size
    gen = _task(toy_bin, *memory, "--memory-window", "2").context_spec
    assert (gen.sampled_context_size, gen.memory_window) == (0, 2)
    assert _task(toy_bin, *memory, "--sampled-context-size", "3",
                 "--memory-window", "1").context_spec.memory_window == 1
    # a bounded context: the deprecated name is the sampled size only
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        bounded = _task(toy_bin, "--source-context-size", "2", "--sample-context-size",
                        "1").context_spec
    assert (bounded.sampled_context_size, bounded.memory_window) == (1, None)
    assert "--memory-window" not in caplog.text


def test_the_two_names_refuse_what_they_cannot_mean(toy_bin):
    memory = ["--document-context", "online", "--document-memory"]
    with pytest.raises(InputError, match="deprecated name of the second"):
        _task(toy_bin, *memory, "--sample-context-size", "2", "--sampled-context-size", "3")
    with pytest.raises(InputError, match="--memory-window bounds a document memory"):
        _task(toy_bin, "--source-context-size", "1", "--memory-window", "2")
    with pytest.raises(InputError, match="--memory-window must be >= 0"):
        _task(toy_bin, *memory, "--memory-window", "-1")


# --------------------------------------------------------------------------- old checkpoints


def _expected():
    with open(os.path.join(LEGACY, "expected.json"), encoding="utf-8") as f:
        return json.load(f)


def _score(name, argv):
    out = generate([os.path.join(LEGACY, "data-bin"), "--task", "document_translation",
                    *argv, "--path", os.path.join(LEGACY, f"{name}.pt"), "--score-reference",
                    "--gen-subset", "test", "--batch-size", "4"])
    return sorted(line for line in out.splitlines() if line.startswith("H-"))


@pytest.mark.parametrize("name, new_argv", [
    ("ctx_aware", ["--source-context-size", "2"]),
    ("selective", ["--source-context-size", "1", "--document-context", "online",
                   "--document-memory", "--memory-window", "2"]),
], ids=["sampled-size", "memory-window"])
def test_a_checkpoint_from_before_the_split_scores_bit_for_bit(name, new_argv, one_thread):
    """Checkpoints trained with ``--sample-context-size`` by the code before
    the split (tests/fixtures/legacy_sample_context/make.py): fairseq-generate
    with the old option and with the new names gives the reference scores the
    old code gave, to the last printed digit; a memory scored without its
    window is refused, naming the new option."""
    exp = _expected()[name]
    assert exp["task"]["sample_context_size"] == 2 and len(exp["H"]) >= 8
    assert _score(name, exp["argv"]) == exp["H"]
    assert _score(name, new_argv) == exp["H"]
    if name == "selective":
        with pytest.raises(InputError, match=r"--memory-window 0 \(trained with 2"):
            _score(name, [a for a in new_argv if a not in ("--memory-window", "2")])


def test_an_old_checkpoint_is_upgraded_before_the_command_lines_overrides(caplog):
    """fairseq applies overrides only to keys a stored configuration has: an
    old checkpoint's configuration gets the two new keys first (compat), so
    ``--memory-window`` reaches fairseq-validate and every tool that restores
    a checkpoint with overrides; loading it warns of no deprecated option."""
    from fairseq import checkpoint_utils

    path = os.path.join(LEGACY, "selective.pt")
    data = os.path.join(LEGACY, "data-bin")
    with caplog.at_level(logging.WARNING):
        _, _, task = checkpoint_utils.load_model_ensemble_and_task(
            [path], arg_overrides={"data": data})
    assert (task.context_spec.memory_window, task.context_spec.sampled_context_size) == (2, 2)
    assert "deprecated" not in caplog.text
    _, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data, "memory_window": 1})
    assert task.context_spec.memory_window == 1
    from ctx_fairseq.eval.checkpoints import restore_checkpoint

    _, task, _ = restore_checkpoint(path, data, {"memory_window": 1}, "cpu")
    assert task.context_spec.memory_window == 1


def test_fairseq_validate_takes_the_window_of_an_old_checkpoint(capsys, one_thread):
    """fairseq-validate builds its task from the checkpoint with the command
    line as overrides: the old checkpoint's window (2) by default, another
    with --memory-window (a different loss: the option reached the task)."""
    from fairseq import options
    from fairseq_cli import validate as fs_validate

    from fairseq_cli_utils import USER_DIR

    def loss(*extra):
        # as fairseq-validate's cli_main: the options given (and only those, with
        # suppress_defaults) override the checkpoint's
        argv = ["--user-dir", USER_DIR, os.path.join(LEGACY, "data-bin"), "--task",
                "document_translation", "--path", os.path.join(LEGACY, "selective.pt"),
                "--valid-subset", "test", "--cpu", "--max-tokens", "400", *extra]
        args = options.parse_args_and_arch(options.get_validation_parser(), argv)
        override = options.parse_args_and_arch(options.get_validation_parser(), argv,
                                               suppress_defaults=True)
        capsys.readouterr()
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        try:  # fairseq-validate resets the root logger onto this test's captured stdout
            fs_validate.main(args, override_args=override)
        finally:
            for h in root.handlers[:]:
                root.removeHandler(h)
            for h in handlers:
                root.addHandler(h)
            root.setLevel(level)
        out = capsys.readouterr()
        import re

        found = re.findall(r"\| loss ([0-9.]+)", out.out + out.err)
        assert found, "fairseq-validate printed no loss"
        return float(found[-1])

    as_trained = loss()
    assert loss("--memory-window", "2") == as_trained
    assert loss("--memory-window", "1") != as_trained


def test_the_old_checkpoints_task_reads_as_the_new_spec():
    import torch

    from ctx_fairseq.data.contract import memory_window, sampled_context_size

    from ctx_fairseq.compat import upgrade_context_options

    for name, window in (("ctx_aware", None), ("selective", 2)):
        state = torch.load(os.path.join(LEGACY, f"{name}.pt"), weights_only=True)
        task = state["cfg"]["task"]
        assert "sampled_context_size" not in task and "memory_window" not in task
        assert sampled_context_size(task) == 2 and memory_window(task) == window
        assert upgrade_context_options(state["cfg"])  # as fairseq loads it
        assert (task["sampled_context_size"], task["memory_window"],
                task["sample_context_size"]) == (2, window, 0)
        assert sampled_context_size(task) == 2 and memory_window(task) == window
        assert not upgrade_context_options(state["cfg"])  # once


# --------------------------------------------------------------------------- conditions


def test_one_vocabulary_of_conditions():
    assert CONDITIONS == ("true", "none", "shuffled", "random", "previous", "window")
    assert set(ABLATIONS) <= set(CONDITIONS) and set(COMPARED) <= set(CONDITIONS)
    assert set(SIZED) <= set(CONDITIONS)
    for text, (kind, size) in {"true": ("true", None), "previous-2": ("previous", 2),
                               "window-3": ("window", 3), "shuffled@1": ("shuffled", 1),
                               "none": ("none", None)}.items():
        cond = ContextCondition.parse(text)
        assert (cond.kind, cond.size) == (kind, size)
        assert str(cond) == text
    with pytest.raises(InputError, match="takes a size"):
        ContextCondition("window")
    with pytest.raises(InputError, match="takes a size: previous-k"):
        ContextCondition.parse("previous")  # parsed, the kind without its size is refused too
    with pytest.raises(InputError, match="unknown context condition"):
        ContextCondition.parse("empty")


def test_conditions_apply_to_the_spec():
    bounded = previous_sentences(3)
    memory = ContextSpec(document_context="online", document_memory=True, memory_window=4)
    whole = ContextSpec(source_context_size=1, document_context="online")
    assert ContextCondition.parse("previous-2").apply(bounded).context_cap() == 2
    assert ContextCondition.parse("none").apply(bounded).context_cap() == 0
    none = ContextCondition.parse("none").apply(memory)
    assert none.isolate_sentences and none.context_cap() is None
    assert ContextCondition.parse("window-2").apply(memory).context_cap() == 2
    assert ContextCondition.parse("true").apply(memory).context_cap() == 4  # its window
    shuffled = ContextCondition.parse("shuffled").apply(bounded)
    assert shuffled.ablation == "shuffled" and shuffled.context_cap() is None
    for text, spec, match in (("window-2", bounded, "bounds a document memory"),
                              ("previous-2", memory, "not previous sentences"),
                              ("previous-1", whole, "not previous sentences"),
                              ("shuffled@1", whole, "no bounded context size")):
        with pytest.raises(InputError, match=match):
            ContextCondition.parse(text).apply(spec)
