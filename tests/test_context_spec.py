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
    assert spec.for_split(training=True) is spec
    assert spec.context_cap() is None  # training: the window is drawn
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


def test_the_old_checkpoints_task_reads_as_the_new_spec():
    import torch

    from ctx_fairseq.data.contract import memory_window, sampled_context_size

    for name, window in (("ctx_aware", None), ("selective", 2)):
        state = torch.load(os.path.join(LEGACY, f"{name}.pt"), weights_only=True)
        task = state["cfg"]["task"]
        assert "sampled_context_size" not in task and "memory_window" not in task
        assert sampled_context_size(task) == 2 and memory_window(task) == window


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
