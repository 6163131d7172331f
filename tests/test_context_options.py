"""The task's declared context options (issue 26,
``ctx_fairseq/tasks/context_options.py``): one list, one validation (the
task's own check calls it), and the command-line form the analysis tools
rebuild a checkpoint's options from (flags as flags)."""

from types import SimpleNamespace

import pytest

from ctx_fairseq.errors import InputError
from ctx_fairseq.tasks.context_options import context_option_args, validate_context_options
from ctx_fairseq.tasks.document_config import CONTEXT_OPTIONS
from ctx_fairseq.tasks.document_config import DocumentTranslationConfig


def _cfg(**kw):
    base = {f.name: f.default for f in DocumentTranslationConfig.__dataclass_fields__.values()
            if not callable(f.default)}
    base.update(kw)
    return SimpleNamespace(**base)


def test_the_defaults_are_valid_and_every_declared_option_exists():
    validate_context_options(_cfg())
    fields = DocumentTranslationConfig.__dataclass_fields__
    assert all(name in fields for name in CONTEXT_OPTIONS)


def test_a_document_memory_takes_a_sampled_window():
    validate_context_options(_cfg(sample_context_size=3, document_context="online",
                                  document_memory=True))


@pytest.mark.parametrize("options,message", [
    ({"context_dropout": 1.5}, "--context-dropout must be a probability"),
    ({"context_dropout": 0.2, "source_context_size": 0}, "--context-dropout without context"),
    ({"length_buckets": 0}, "--length-buckets must be >= 1"),
    ({"length_buckets": 2, "source_context_size": 1}, "--length-buckets groups"),
    ({"sample_context_size": 3, "source_context_size": 1}, "--sample-context-size 3 is larger"),
    ({"sample_context_size": 1, "document_context": "online"},
     "--sample-context-size cuts a bounded context"),
    ({"concat_context_loss_weight": 0.5}, "goes with --concat-context"),
    ({"concat_context": True, "source_context_size": 0, "target_context_size": 0},
     "would add no context"),
    ({"concat_context": True, "source_context_size": 1, "context_direction": "next"},
     "previous sentences only"),
])
def test_each_bad_option_is_one_clear_error(options, message):
    with pytest.raises(InputError, match=message):
        validate_context_options(_cfg(**options))


def test_the_command_line_form_gives_flags_as_flags():
    cfg = {"source_context_size": 0, "target_context_size": 1, "context_direction": "prev",
           "document_context": "online", "document_memory": True, "context_separator": "</s>",
           "concat_context": False, "concat_break": "<brk>", "seed": 3}
    args = context_option_args(cfg)
    assert args == ["--source-context-size", "0", "--target-context-size", "1",
                    "--context-direction", "prev", "--document-context", "online",
                    "--document-memory", "--context-separator", "</s>",
                    "--concat-break", "<brk>"]
    assert context_option_args(None) == []
