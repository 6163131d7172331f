"""The model-task context contract (ctx_fairseq/data/contract.py, issue 26):
models declare what they consume, the task checks it once, and models read
the task's options only through ``task_options``."""

import ast
import os
import types

import pytest
from fairseq import options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer.transformer_legacy import base_architecture
from fairseq_cli_utils import TINY_MODEL_ARGS

import ctx_fairseq  # noqa: F401  (registers the plugin)
from ctx_fairseq._registry import plugin_models
from ctx_fairseq.data.contract import (
    SENTENCE_LEVEL,
    ContextContract,
    ContextSpec,
    contract_of,
    model_contract,
    task_options,
)
from ctx_fairseq.errors import InputError

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ctx_fairseq")


@register_model("_test_kwargs_transformer")
class _KwargsTransformer(TransformerModel):
    """A sentence-level model whose forward swallows any keyword: it takes no
    context because it declares none (a signature proves nothing)."""

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **anything):
        return super().forward(src_tokens, src_lengths, prev_output_tokens)


@register_model_architecture("_test_kwargs_transformer", "_test_kwargs_transformer")
def _kwargs_transformer(args):
    base_architecture(args)


def _dict():
    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")
    return d


def _task(*argv, arch="transformer"):
    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["/dev/null", "--task", "document_translation", "--arch", arch, *argv,
         *TINY_MODEL_ARGS])
    cfg = convert_namespace_to_omegaconf(args)
    d = _dict()
    return DocumentTranslationTask(cfg.task, d, d), cfg


def test_every_plugin_model_declares_a_contract_its_forward_takes():
    import inspect

    declared = {}
    for name, cls in plugin_models().items():
        contract = contract_of(cls)
        declared[name] = contract.inputs
        params = inspect.signature(cls.forward).parameters
        open_ = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
        missing = [k for k in contract.inputs if k not in params]
        assert open_ or not missing, (name, missing)
    # the models that read document context declare it; the sentence-level ones do not
    assert declared["transformer_context_aware"] == ("src_ctx_tokens", "src_ctx_lengths")
    assert declared["transformer_doc_zhang2018"] == ("src_ctx_tokens", "src_ctx_lengths")
    assert {"src_ctx_sentences", "tgt_ctx_present"} <= set(declared["transformer_han"])
    assert {"mem_src_tokens", "query_mem_row"} <= set(declared["transformer_selective_doc"])
    for name in ("transformer_concat", "transformer_dc", "transformer_hybrid"):
        assert declared[name] == (), name


def test_contract_of_a_model_without_one_is_sentence_level_and_a_wrong_one_is_refused():
    assert contract_of(TransformerModel) is SENTENCE_LEVEL
    bad = type("Bad", (), {"context_contract": ("src_ctx_tokens",)})
    with pytest.raises(TypeError, match="must be a ContextContract"):
        contract_of(bad)
    model = types.SimpleNamespace()
    got = model_contract(model)
    assert got.inputs == frozenset() and not got.uses_target_context
    assert got.layout == {"src": "concatenated", "tgt": "concatenated", "memory": "shared"}
    cls = type("M", (), {"context_contract": ContextContract(inputs=("a",)),
                         "context_layout": "sentences", "uses_target_context": True})
    got = model_contract(cls())
    assert got.inputs == {"a"} and got.uses_target_context
    assert got.layout["src"] == got.layout["tgt"] == "sentences"


def test_the_task_refuses_context_for_a_model_that_declares_none_whatever_its_signature():
    task, cfg = _task("--source-context-size", "1", arch="_test_kwargs_transformer")
    with pytest.raises(InputError, match="declares no context_contract"):
        task.build_model(cfg.model)
    task, cfg = _task("--source-context-size", "1", arch="transformer_context_aware")
    model = task.build_model(cfg.model)
    assert contract_of(model).takes("src_ctx_tokens")


def test_concat_context_refuses_a_model_that_declares_context_inputs():
    task, cfg = _task("--concat-context", "--source-context-size", "1",
                      arch="transformer_context_aware")
    with pytest.raises(InputError, match="reads context inputs of its own"):
        task.build_model(cfg.model)


def test_task_options_carry_the_document_tasks_options():
    task, _ = _task("--source-context-size", "2", "--target-context-size", "1",
                    "--context-separator", "w3", "--left-pad-target")
    got = task_options(task)
    assert got == ContextSpec(
        source_context_size=2, target_context_size=1, context_direction="prev",
        document_context="none", document_memory=False, memory_precomputed=False,
        length_buckets=1, left_pad_source=True, left_pad_target=True,
        context_separator="w3", context_separator_index=task.source_dictionary.index("w3"))
    assert got.document_task and not got.whole_document
    task, _ = _task("--context-separator", "not-in-the-dictionary")
    got = task_options(task)
    assert got.context_separator == "not-in-the-dictionary"
    assert got.context_separator_index is None


def test_task_options_of_another_task_and_of_no_task():
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    d = _dict()
    got = task_options(TranslationTask(TranslationConfig(), d, d))
    assert got == ContextSpec(document_task=False)
    assert task_options(types.SimpleNamespace(source_dictionary=d)) is None
    with pytest.raises(TypeError, match="neither a fairseq task"):
        task_options(types.SimpleNamespace(source_dictionary=d, cfg=types.SimpleNamespace()))


def test_the_options_reach_the_models_checks():
    task, cfg = _task("--source-context-size", "2", arch="transformer_han")
    with pytest.raises(ValueError, match="attends to the 3 previous sentences"):
        task.build_model(cfg.model)
    task, cfg = _task("--source-context-size", "0", arch="transformer_doc_zhang2018")
    with pytest.raises(ValueError, match="needs source context"):
        task.build_model(cfg.model)
    task, cfg = _task("--source-context-size", "1", arch="transformer_selective_doc")
    with pytest.raises(ValueError, match="--document-memory"):
        task.build_model(cfg.model)


def _is_task(node) -> bool:
    """``task`` or ``<anything>.task`` (e.g. ``self.task``)."""
    return (isinstance(node, ast.Name) and node.id == "task") or \
        (isinstance(node, ast.Attribute) and node.attr == "task")


def _context_names():
    """The names of the context settings: the spec's fields and the task's
    context options (the deprecated alias included)."""
    import dataclasses

    from ctx_fairseq.data.contract import ContextSpec
    from ctx_fairseq.tasks.document_config import CONTEXT_OPTIONS

    return ({f.name for f in dataclasses.fields(ContextSpec)} | set(CONTEXT_OPTIONS)
            | {"sample_context_size", "sampled_context_size", "memory_window",
               "context_ablation", "context_dropout", "coword_dropout"})


def _reads_task_cfg(tree):
    """Lines where ``task.cfg`` (or ``self.task.cfg``, ``getattr(task,
    "cfg")``) is read, or a context setting through ``task_setting``."""
    out = []
    context = _context_names()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "cfg" and _is_task(node.value):
            out.append(node.lineno)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and \
                len(node.args) >= 2 and _is_task(node.args[0]) and \
                isinstance(node.args[1], ast.Constant) and node.args[1].value == "cfg":
            out.append(node.lineno)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "task_setting" and \
                len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and \
                node.args[1].value in context:
            out.append(node.lineno)
    return out


def _files_reading_task_cfg(package: str):
    bad = []
    for d, _, files in os.walk(os.path.join(ROOT, package)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                with open(path, encoding="utf-8") as fh:
                    bad += [f"{os.path.relpath(path, ROOT)}:{n}"
                            for n in _reads_task_cfg(ast.parse(fh.read()))]
    return bad


def test_eval_and_cli_read_the_context_spec_not_the_task_configuration():
    """eval/ and cli/ read context settings from the task's ContextSpec
    (``task_options``), never from ``task.cfg``; other settings (the
    language pair, the task's name) through ``task_setting``, which a
    context setting's name may not pass through."""
    src = ("a = self.task.cfg.x\nb = getattr(self.task, 'cfg')\n"
           "c = task_setting(task, 'source_lang')\nd = task_setting(task, 'memory_window')\n")
    assert sorted(_reads_task_cfg(ast.parse(src))) == [1, 2, 4]
    assert _files_reading_task_cfg("eval") + _files_reading_task_cfg("cli") == []


def test_no_model_reads_the_task_configuration_and_the_task_reads_no_signature():
    assert sorted(_reads_task_cfg(ast.parse("x = task.cfg.a\ny = getattr(task, 'cfg', None)\n"))) \
        == [1, 2]
    assert _files_reading_task_cfg("models") == []
    for name in os.listdir(os.path.join(ROOT, "tasks")):
        if name.endswith(".py"):
            with open(os.path.join(ROOT, "tasks", name), encoding="utf-8") as fh:
                assert "inspect.signature" not in fh.read(), name
