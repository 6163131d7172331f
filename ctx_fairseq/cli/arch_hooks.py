"""What ctx-demo and ctx-bench know of each architecture, beside those tools.

A model file holds its paper's model; how a tool trains, translates or
benchmarks it is the tool's (issue 26). The hooks are keyed by the fairseq
*model* name (``@register_model``); an architecture (a preset) finds its
model's through fairseq's ``ARCH_MODEL_NAME_REGISTRY``. A model without hooks
is sentence-level for both tools: ``fairseq-train`` and ``fairseq-generate``
with the demo's shared options, and a random sentence-level batch in the
benchmark. A plugin adds its own with :func:`register_demo_hooks` and
:func:`register_bench_hooks`.

ctx-demo (:class:`DemoHooks`)
    ``archs``: the architectures the model adds to the demo's default
    ``--archs`` (None: the one named like the model); ``stage1``: a
    sentence-level architecture trained first and the model initialised from
    (``--init-from-sentence-checkpoint``, the papers' two-stage training;
    shared with that architecture's own row); ``train_args`` /
    ``generate_args``: extra command-line arguments (a list, or a function of
    the architecture name), e.g. the document task and its context options;
    ``reads_target_context(arch)``: such an architecture translates by
    two-pass iterative decoding (:meth:`DemoHooks.generate_command`).

ctx-bench (:class:`BenchHooks`)
    ``task_args``: a whole-document model's ``document_translation`` options;
    its batch is then made by the task's own dataset and batching
    (``ctx_fairseq.cli.bench``); ``sample(task, args, batch_size, src_len,
    tgt_len, doc_len, device)``: a training sample of the model's own (e.g.
    with context sentences, :func:`bench_batch`); ``setting(model)``: what
    the row measures (a note under the table, ``setting`` in the JSON).
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = ["DemoHooks", "BenchHooks", "demo_hooks", "bench_hooks", "register_demo_hooks",
           "register_bench_hooks", "default_demo_archs", "bench_batch"]

Args = Union[Sequence[str], Callable[[str], Sequence[str]]]


def never_reads_target_context(arch: str) -> bool:
    """The default: no architecture of the model reads target context."""
    return False


@dataclass(frozen=True)
class DemoHooks:
    """How ctx-demo trains and translates a model's architectures (module
    docstring)."""

    archs: Optional[Sequence[str]] = None
    stage1: Optional[str] = None
    train_args: Args = ()
    generate_args: Args = ()
    reads_target_context: Callable[[str], bool] = never_reads_target_context

    @property
    def two_pass(self) -> bool:
        """Some architectures of the model read target context: translated in
        two passes, so the demo's generate steps of all of them depend on the
        stage-1 model (the first pass)."""
        return self.reads_target_context is not never_reads_target_context

    @staticmethod
    def _args(value: Args, arch: str) -> List[str]:
        return list(value(arch) if callable(value) else value)

    def train_args_for(self, arch: str) -> List[str]:
        return self._args(self.train_args, arch)

    def generate_args_for(self, arch: str) -> List[str]:
        return self._args(self.generate_args, arch)

    def generate_command(self, arch: str, python: str, data: str, ckpt: str, out_dir: str,
                         first_pass: Optional[str] = None) -> Optional[List[str]]:
        """The command whose standard output replaces fairseq-generate's, or
        None for fairseq-generate. An architecture that reads the previous
        target sentences translates the test set by two-pass iterative
        decoding (``ctx_fairseq.cli.iterative_decode``, beam 4): pass 1 by the
        stage-1 sentence-level model when the demo has one (``first_pass``),
        pass 2 by the model with pass 1's translations as the target context
        (never the references)."""
        if not self.reads_target_context(arch):
            return None
        return [python, "-m", "ctx_fairseq.cli.iterative_decode", data, "--path", ckpt,
                "--out-dir", out_dir, "--gen-subset", "test", "--beam", "4",
                "--max-tokens", "8000", *(["--first-pass-path", first_pass] if first_pass else []),
                "--", *self.generate_args_for(arch)]


@dataclass(frozen=True)
class BenchHooks:
    """How ctx-bench builds a model's batch and names its setting (module
    docstring)."""

    task_args: Sequence[str] = ()
    sample: Optional[Callable[..., Dict]] = None
    setting: Optional[Callable[[object], str]] = None


SENTENCE_LEVEL_DEMO = DemoHooks()
SENTENCE_LEVEL_BENCH = BenchHooks()
_DEMO: Dict[str, DemoHooks] = {}
_BENCH: Dict[str, BenchHooks] = {}


def register_demo_hooks(model_name: str, hooks: DemoHooks) -> None:
    _DEMO[model_name] = hooks


def register_bench_hooks(model_name: str, hooks: BenchHooks) -> None:
    _BENCH[model_name] = hooks


def _model_name(arch: str) -> str:
    import ctx_fairseq  # noqa: F401  (registers the plugin's models)
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY

    if arch in ARCH_MODEL_NAME_REGISTRY:
        return ARCH_MODEL_NAME_REGISTRY[arch]
    if arch in MODEL_REGISTRY:
        return arch
    raise KeyError(f"unknown architecture {arch!r}")


def demo_hooks(arch: str) -> DemoHooks:
    """The ctx-demo hooks of architecture (or model) ``arch``."""
    _register_plugin_hooks()
    return _DEMO.get(_model_name(arch), SENTENCE_LEVEL_DEMO)


def bench_hooks(arch: str) -> BenchHooks:
    """The ctx-bench hooks of architecture (or model) ``arch``."""
    _register_plugin_hooks()
    return _BENCH.get(_model_name(arch), SENTENCE_LEVEL_BENCH)


def default_demo_archs() -> List[str]:
    """The sentence-level baseline plus each plugin model's demo architectures
    (``DemoHooks.archs``; default: the architecture named like the model)."""
    from ctx_fairseq._registry import plugin_models

    _register_plugin_hooks()
    archs = ["transformer"]
    for name in plugin_models():
        hooks = _DEMO.get(name, SENTENCE_LEVEL_DEMO)
        archs.extend(hooks.archs if hooks.archs is not None else [name])
    return archs


# ------------------------------------------------------------------ ctx-bench samples


def bench_batch(task, batch_size: int, src_len: int, tgt_len: int, device,
                **context: Tuple[int, int]) -> Dict:
    """ctx-bench: a training batch of ``batch_size`` random sentences of
    ``src_len`` source and ``tgt_len`` target tokens, plus, for each
    ``NAME=(n, length)`` of ``context``, ``NAME_tokens`` (per sentence ``n``
    context sentences of ``length`` tokens, one after the other) and
    ``NAME_lengths``. Every sentence ends with ``</s>``; the tokens are drawn
    in that order from a generator seeded with 1."""
    d = task.target_dictionary
    g = torch.Generator().manual_seed(1)

    def sentences(n: int, length: int) -> Tensor:
        t = torch.randint(d.nspecial, len(d), (batch_size, n, length), generator=g)
        t[:, :, -1] = d.eos()
        return t.view(batch_size, n * length)

    src, tgt = sentences(1, src_len), sentences(1, tgt_len)
    net_input = {"src_tokens": src, "src_lengths": torch.full((batch_size,), src_len),
                 "prev_output_tokens": torch.cat([tgt[:, -1:], tgt[:, :-1]], dim=1)}
    for name, (n, length) in context.items():
        tokens = sentences(n, length)
        net_input[f"{name}_tokens"] = tokens
        net_input[f"{name}_lengths"] = torch.full((batch_size,), tokens.size(1))
    return {"id": torch.arange(batch_size), "nsentences": batch_size,
            "ntokens": batch_size * tgt_len,
            "net_input": {k: v.to(device) for k, v in net_input.items()},
            "target": tgt.to(device)}


def source_context_sample(task, args, batch_size: int, src_len: int, tgt_len: int,
                          doc_len: int, device) -> Dict:
    """A training batch whose sentences each have ``doc_len`` context
    sentences of ``src_len`` tokens (``src_ctx_tokens``; the models with
    ``SourceContextModel``'s forward)."""
    return bench_batch(task, batch_size, src_len, tgt_len, device, src_ctx=(doc_len, src_len))


def han_sample(task, args, batch_size: int, src_len: int, tgt_len: int, doc_len: int,
               device) -> Dict:
    """A training batch in the task's format with ``k`` previous sentences
    (``--han-context-sentences``, 3 by default; ``doc_len`` is not used: the
    HAN's context is its ``k`` sentences) of ``src_len`` source and
    ``tgt_len`` target tokens per sentence, each ended by ``</s>``; with the
    one-row-per-sentence layout the task's collater adds for this model
    (``*_ctx_sentences``, ``*_ctx_present``, built on the CPU)."""
    from ctx_fairseq.modules.han_attention import split_context

    k = int(getattr(args, "han_context_sentences", 3) or 3)
    sample = bench_batch(task, batch_size, src_len, tgt_len, "cpu",
                         src_ctx=(k, src_len), tgt_ctx=(k, tgt_len))
    ni = sample["net_input"]
    d = task.source_dictionary
    for side in ("src", "tgt"):  # the layout the task's collater gives it (on the CPU)
        rows, present = split_context(ni[f"{side}_ctx_tokens"], d.pad(), (d.eos(),),
                                      d.eos(), k, non_words=(d.bos(),))
        ni[f"{side}_ctx_sentences"] = rows.view(batch_size, k, -1)
        ni[f"{side}_ctx_present"] = present
    sample["net_input"] = {n: v.to(device) if torch.is_tensor(v) else v for n, v in ni.items()}
    sample["target"] = sample["target"].to(device)
    return sample


def selective_setting(model) -> str:
    """ctx-bench's label of what a ``transformer_selective_doc`` row
    measures: where the memory comes from and whether it is encoded in the
    timed steps. ctx-bench repeats one batch (and warms a cache up before
    measuring), so a cached frozen memory is read from the cache, never
    encoded, in the figures."""
    a = model.args
    parts = [f"{a.context_integration} integration"]
    if a.context_memory == "frozen":
        how = ("read from the cache (warm)" if model.memory_cache is not None else
               "encoded without gradients every step (no cache)")
        parts.append(f"frozen memory (the paper's; {how}; no stage-1 checkpoint: "
                     "the frozen copies are of the initial weights)")
    else:
        parts.append("shared memory (computed by the model with gradients; beyond the "
                     "paper)")
    if int(getattr(a, "doc_sentence_distance", 0) or 0):
        parts.append(f"--doc-sentence-distance {a.doc_sentence_distance} (beyond the paper)")
    if getattr(a, "dense_doc_attention", False):
        parts.append("dense attention (beyond the paper)")
    return ", ".join(parts)


# ------------------------------------------------------------------ the plugin's models


def _han_task_args(arch: str) -> List[str]:
    from ctx_fairseq.models._fairseq_utils import preset

    k = str(preset(arch).han_context_sentences)
    args = ["--task", "document_translation", "--source-context-size", k]
    if _han_reads_target_context(arch):
        args += ["--target-context-size", k]
    return args


def _han_reads_target_context(arch: str) -> bool:
    """The HAN decoder reads the previous target sentences."""
    from ctx_fairseq.models._fairseq_utils import preset

    return preset(arch).han_side in ("both", "decoder")


def _selective_reads_target_context(arch: str) -> bool:
    """Decoder integration reads the target memory (translated in two passes,
    the first by the stage-1 sentence-level model, the paper's
    initialisation)."""
    from ctx_fairseq.models._fairseq_utils import preset

    return preset(arch).context_integration == "decoder"


def _selective_task_args(arch: str) -> List[str]:
    """The paper's model: no sentence-distance bias (``--doc-sentence-distance``
    is beyond the paper; on the toy corpus, whose antecedent is the most
    recent entity, it raises pronoun accuracy from about 80%: see
    examples/selective_attention/README.md)."""
    args = ["--task", "document_translation", "--document-context", "online",
            "--document-memory"]
    if _selective_reads_target_context(arch):
        args += ["--target-context-size", "1"]
    return args


_registered = False


def _register_plugin_hooks() -> None:
    """The hooks of the plugin's own models (once)."""
    global _registered
    if _registered:
        return
    _registered = True
    from ctx_fairseq.models.transformer_concat import CONCAT_TASK_ARGS
    from ctx_fairseq.models.transformer_doc_zhang2018 import PAPER_CONTEXT_SIZE

    concat = list(CONCAT_TASK_ARGS)
    _DEMO.setdefault("transformer_concat", DemoHooks(
        train_args=concat, generate_args=concat + ["--own-target-context"]))
    # the task's own dataset builds the concatenated sequences
    _BENCH.setdefault("transformer_concat", BenchHooks(
        task_args=["--concat-context", "--source-context-size", "1",
                   "--target-context-size", "1"]))

    voita = ["--task", "document_translation", "--source-context-size", "1"]
    _DEMO.setdefault("transformer_context_aware", DemoHooks(train_args=voita,
                                                            generate_args=voita))
    _BENCH.setdefault("transformer_context_aware", BenchHooks(sample=source_context_sample))

    # the paper's two-step training: step 1 the sentence-level transformer, step 2 the
    # document-level parameters only; --doc-len 2 in the bench is the paper's context
    zhang = ["--task", "document_translation", "--source-context-size", str(PAPER_CONTEXT_SIZE)]
    _DEMO.setdefault("transformer_doc_zhang2018", DemoHooks(
        stage1="transformer", train_args=zhang + ["--freeze-sentence-level"],
        generate_args=zhang))
    _BENCH.setdefault("transformer_doc_zhang2018", BenchHooks(sample=source_context_sample))

    # the joint model (HAN encoder + HAN decoder), the paper's best; stage 1 the
    # sentence-level transformer
    _DEMO.setdefault("transformer_han", DemoHooks(
        archs=["transformer_han"], stage1="transformer", train_args=_han_task_args,
        generate_args=_han_task_args, reads_target_context=_han_reads_target_context))
    _BENCH.setdefault("transformer_han", BenchHooks(sample=han_sample))

    # both integrations; stage 1 the sentence-level transformer (Sec. 2.2); whole-document
    # batches through the document task
    _DEMO.setdefault("transformer_selective_doc", DemoHooks(
        archs=["transformer_selective_doc", "transformer_selective_doc_dec"],
        stage1="transformer", train_args=_selective_task_args,
        generate_args=_selective_task_args,
        reads_target_context=_selective_reads_target_context))
    _BENCH.setdefault("transformer_selective_doc", BenchHooks(
        task_args=["--document-context", "online", "--document-memory"],
        setting=selective_setting))

    # G-Transformer translates the doc2doc task's segments (group tags from the separator);
    # the paper's two stages: fine-tuned from the sentence-level transformer
    gtrans = ["--task", "document_translation", "--doc2doc", "greedy",
              "--source-context-size", "0"]
    _DEMO.setdefault("transformer_gtrans", DemoHooks(
        stage1="transformer", train_args=gtrans, generate_args=gtrans + ["--doc2doc-frame"]))
    _BENCH.setdefault("transformer_gtrans", BenchHooks(task_args=gtrans[2:]))
