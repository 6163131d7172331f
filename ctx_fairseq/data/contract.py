"""The model-task context contract: what a model consumes of the
``document_translation`` task, declared on the model class, and the task
options a model may read, handed to it as one typed object.

Two halves, one per direction:

* **Model -> task.** A model class declares ``context_contract``, a
  :class:`ContextContract` naming the ``net_input`` keys its ``forward``
  reads besides fairseq's (``src_tokens``, ``src_lengths``,
  ``prev_output_tokens``). With it the model may declare
  ``context_layout`` (what ``--max-tokens`` counts for it, see
  :mod:`ctx_fairseq.data.layouts`) and ``uses_target_context``, attributes
  or properties because they may depend on the model's options.
  :func:`model_contract` reads the three for one built model; a model that
  declares nothing (fairseq's sentence-level architectures) takes no
  context. The task checks a built model against its batches once, in
  ``DocumentTranslationTask.build_model``: context options with a model
  that takes none, ``--concat-context`` with one that reads its own context
  inputs, and target context with a model that would not read it are
  refused there.
* **Task -> model.** A model's ``build_model`` reads the task's context
  options through :func:`task_options` only: the :class:`ContextSpec`
  that the document task builds once from its configuration
  (``DocumentTranslationTask.context_spec``), the defaults
  marked ``document_task=False`` for another fairseq task (its
  ``translation``), or None without a task (tests and tools that build a
  model from its dictionaries). No model reads ``task.cfg``.

The keys a model declares are checked against its ``forward`` by
``tests/test_contract.py`` for every registered architecture.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Optional, Tuple

from fairseq.tasks import FairseqTask

from ctx_fairseq.data.layouts import normalise_context_layout


@dataclass(frozen=True)
class ContextContract:
    """What a model class consumes of the document task's batches:
    ``inputs``, the ``net_input`` keys its ``forward`` reads besides
    fairseq's (e.g. ``src_ctx_tokens``, ``src_ctx_lengths``). Empty: a
    sentence-level model."""

    inputs: Tuple[str, ...] = ()

    def takes(self, key: str) -> bool:
        return key in self.inputs


#: the contract of a model that declares none (fairseq's own architectures)
SENTENCE_LEVEL = ContextContract()


@dataclass(frozen=True)
class ModelContext:
    """One built model's side of the contract, as the task checks it."""

    inputs: FrozenSet[str]
    #: ``{"src": ..., "tgt": ..., "memory": ...}`` (:func:`normalise_context_layout`)
    layout: Dict[str, str]
    uses_target_context: bool


def contract_of(model_or_class) -> ContextContract:
    """The :class:`ContextContract` a model (or its class) declares, or
    :data:`SENTENCE_LEVEL`."""
    cls = model_or_class if isinstance(model_or_class, type) else type(model_or_class)
    contract = getattr(cls, "context_contract", None)
    if contract is None:
        return SENTENCE_LEVEL
    if not isinstance(contract, ContextContract):
        raise TypeError(f"{cls.__name__}.context_contract must be a ContextContract, got "
                        f"{contract!r}")
    return contract


def model_contract(model) -> ModelContext:
    """What a built model consumes: its declared inputs, its context layout
    (undeclared: the task's ``B x Tc`` tensors as delivered, a shared
    memory) and whether it reads the target-side context (undeclared: no)."""
    return ModelContext(frozenset(contract_of(model).inputs),
                        normalise_context_layout(getattr(model, "context_layout", None)),
                        bool(getattr(model, "uses_target_context", False)))


@dataclass(frozen=True, kw_only=True)
class ContextSpec:
    """The context specification: every setting that decides which context a
    sentence gets, built once from the document task's configuration
    (:meth:`from_task_config`) and carried
    from there, unchanged or through :meth:`replace`-style steps (a split's
    role, :meth:`for_split`; a scorer's condition,
    :meth:`ctx_fairseq.data.conditions.ContextCondition.apply`), to the
    dataset, the models' builders, generation, ``ctx-cxmi``, the
    contrastive scorer, the probes and ``ctx-bench``. Nothing else carries
    context settings: no consumer reads the task's configuration.

    Keyword-only and frozen, in the style of fairseq2's ``TransformerConfig``;
    :func:`sentence_level` and :func:`previous_sentences` are small presets.
    The checkpoint keeps the values as the task configuration's own plain
    fields (the option names below with ``--``), so nothing here is
    pickled."""

    #: False: another fairseq task (``translation``), which gives no context
    #: (every field at its default)
    document_task: bool = True

    # ---------------------------------------------------- which sentences
    #: ``--source-context-size``: context sentences per direction on the
    #: source side (0: none)
    source_context_size: int = 0
    #: ``--target-context-size``: the same on the target side
    target_context_size: int = 0
    #: ``--context-direction``: ``prev``, ``next`` or ``both``
    context_direction: str = "prev"
    #: ``--document-context``: ``none``, ``online`` (every previous sentence
    #: of the document) or ``offline`` (every other sentence)
    document_context: str = "none"
    #: ``--document-memory``: batches carry the document memory (each
    #: visible sentence once) instead of per-sentence context
    document_memory: bool = False
    #: ``--memory-precomputed``: the model reads the memory from a frozen
    #: model's cache, so batch sizes count only what is encoded with gradients
    memory_precomputed: bool = False
    #: ``--memory-window K``: outside training, a document memory shows each
    #: sentence the memory sentences at most K positions away. None or 0: the
    #: whole memory. Built from the configuration: ``--memory-window``, else
    #: the sampled size K a memory was trained on (it reads the largest
    #: window it saw), else None
    memory_window: Optional[int] = None
    #: a bound N for every sentence (its N nearest previous context
    #: sentences; a memory's window N): a scorer's condition, never an option
    context_size: Optional[int] = None
    #: ``--context-ablation`` or a scorer's condition: ``none``, ``shuffled``
    #: (another document's context) or ``random`` (random tokens)
    ablation: str = "none"
    #: every sentence alone in its document (the ``none`` condition of a
    #: whole-document context or memory); a scorer's condition
    isolate_sentences: bool = False

    # ------------------------------------------------------- training only
    #: ``--sampled-context-size K``: per sentence and epoch a size drawn from
    #: 0..K (Fernandes et al. 2021); with a memory, a window drawn from 0..K.
    #: Zero outside the split fairseq-train trains on (:meth:`for_split`)
    sampled_context_size: int = 0
    #: ``--context-dropout``: probability of dropping a sentence's whole context
    context_dropout: float = 0.0
    #: ``--coword-dropout``: probability of replacing a source word by ``<unk>``
    coword_dropout: float = 0.0
    #: ``--seed``: of the ablations, the draws above and the document order
    seed: int = 1

    # -------------------------------------------------------------- batches
    #: ``--document-batching``: batches of whole documents (implied by a
    #: whole-document context)
    document_batching: bool = False
    #: ``--length-buckets``: a memory batch's sentences in at most N groups
    length_buckets: int = 1
    #: fairseq's ``--left-pad-source``: sources (and source context) padded left
    left_pad_source: bool = True
    #: fairseq's ``--left-pad-target``: targets (and target context) padded left
    left_pad_target: bool = False

    # -------------------------------------------------------------- symbols
    #: ``--context-separator`` as given (None: not set)
    context_separator: Optional[str] = None
    #: the separator's index in the source dictionary (None: not in it)
    context_separator_index: Optional[int] = None
    #: ``--concat-context``: the concatenation baseline (context sentences
    #: prepended to the sequences)
    concat_context: bool = False
    #: ``--concat-break``: the symbol that ends each prepended sentence
    concat_break: str = "<brk>"

    # -------------------------------------------------------------- doc2doc
    #: ``--doc2doc``: ``none`` (sentence by sentence), ``greedy`` or
    #: ``multires``: segments of consecutive sentences translated at once
    #: (:mod:`ctx_fairseq.data.segments`); no context inputs
    doc2doc: str = "none"
    #: ``--doc2doc-max-tokens``: a segment's most tokens (its longer side)
    doc2doc_max_tokens: int = 512
    #: ``--doc2doc-separator`` with ``--doc2doc`` (None without): the symbol
    #: ending each sentence of a segment but the last
    doc2doc_separator: Optional[str] = None
    #: its index in the source dictionary (the target dictionary's may
    #: differ: readers look it up there); None without ``--doc2doc``
    doc2doc_separator_index: Optional[int] = None

    @classmethod
    def from_task_config(cls, cfg, src_dict) -> "ContextSpec":
        """The document task configuration's spec, built once
        (``DocumentTranslationTask.context_spec``; the options are checked
        before, ``tasks/context_options.py::validate_context_options``): the
        separator with its index in the source dictionary (None where it is
        not in it), the two meanings of the deprecated
        ``--sample-context-size`` resolved (:func:`sampled_context_size`,
        :func:`memory_window`). The one place a configuration is read."""
        sep = cfg.context_separator or None
        sep_index = None
        if sep:
            idx = src_dict.index(sep)
            sep_index = idx if idx != src_dict.unk() else None
        return cls(
            source_context_size=int(cfg.source_context_size),
            target_context_size=int(cfg.target_context_size),
            context_direction=str(cfg.context_direction),
            document_context=str(cfg.document_context or "none"),
            document_memory=bool(cfg.document_memory),
            memory_precomputed=bool(cfg.memory_precomputed),
            memory_window=memory_window(cfg),
            ablation=str(cfg.context_ablation or "none"),
            sampled_context_size=sampled_context_size(cfg),
            context_dropout=float(cfg.context_dropout or 0.0),
            coword_dropout=float(cfg.coword_dropout or 0.0),
            seed=int(cfg.seed),
            document_batching=bool(cfg.document_batching),
            length_buckets=int(cfg.length_buckets or 1),
            left_pad_source=bool(cfg.left_pad_source), left_pad_target=bool(cfg.left_pad_target),
            context_separator=sep, context_separator_index=sep_index,
            concat_context=bool(cfg.concat_context), concat_break=str(cfg.concat_break),
            **_doc2doc_fields(cfg, src_dict))

    @property
    def whole_document(self) -> bool:
        """A whole-document context (``--document-context online|offline``)."""
        return (self.document_context or "none") != "none"

    @property
    def uses_context(self) -> bool:
        """Any context at all: a side with context sentences, or a memory."""
        return (self.source_context_size > 0 or self.target_context_size > 0
                or self.document_memory)

    def for_split(self, training: bool) -> "ContextSpec":
        """The spec of one split's dataset: the split fairseq-train trains on
        keeps the training-only settings and reads no window (a memory is
        windowed in training only by the sampled size); every other split
        (validation, generation, scoring) has none of the training-only
        settings and reads the memory's window."""
        if training:  # a memory is windowed in training only by the sampled size
            return dataclasses.replace(self, memory_window=None)
        return dataclasses.replace(self, sampled_context_size=0, context_dropout=0.0,
                                   coword_dropout=0.0)

    def context_cap(self) -> Optional[int]:
        """The bound every sentence's context has outside the sampled size:
        the condition's ``context_size``, else (a memory outside training,
        not isolated) its window, else None (the whole window)."""
        if self.context_size is not None:
            return self.context_size
        if self.document_memory and self.memory_window and not self.isolate_sentences:
            return int(self.memory_window)
        return None


def _cfg_get(cfg, name: str, default: Any = None) -> Any:
    return cfg.get(name, default) if hasattr(cfg, "get") else getattr(cfg, name, default)


def _doc2doc_fields(cfg, src_dict) -> Dict[str, Any]:
    """The spec's doc2doc fields from a task configuration (a configuration
    older than the options: ``none``)."""
    mode = str(_cfg_get(cfg, "doc2doc", "none") or "none")
    out: Dict[str, Any] = {"doc2doc": mode,
                           "doc2doc_max_tokens": int(_cfg_get(cfg, "doc2doc_max_tokens", 512))}
    if mode != "none":
        sep = str(_cfg_get(cfg, "doc2doc_separator", "<sep>"))
        idx = src_dict.index(sep)
        out["doc2doc_separator"] = sep
        out["doc2doc_separator_index"] = idx if idx != src_dict.unk() else None
    return out


def sampled_context_size(cfg) -> int:
    """``--sampled-context-size`` K, or the deprecated ``--sample-context-size``
    (a checkpoint trained before the split stores only that); 0: off."""
    return int(_cfg_get(cfg, "sampled_context_size", 0) or 0) or \
        int(_cfg_get(cfg, "sample_context_size", 0) or 0)


def memory_window(cfg) -> Optional[int]:
    """The window K a document memory reads outside training, 0 for the whole
    memory: ``--memory-window``, else the sampled K the memory was trained on
    (``--sampled-context-size``, or the deprecated ``--sample-context-size``);
    None without a memory, or for a checkpoint older than all three options.
    It changes what the model sees, as the options of :data:`CONTEXT_OPTIONS`
    do."""
    if not _cfg_get(cfg, "document_memory", False):
        return None
    window = _cfg_get(cfg, "memory_window", None)
    if window is not None:
        return int(window)
    if all(_cfg_get(cfg, name, None) is None
           for name in ("sampled_context_size", "sample_context_size")):
        return None
    return sampled_context_size(cfg)


def sentence_level() -> ContextSpec:
    """Another fairseq task's spec: no context."""
    return ContextSpec(document_task=False)


def previous_sentences(n: int = 1, target: int = 0) -> ContextSpec:
    """``n`` previous source sentences (and ``target`` previous target
    sentences), the document task's default shape."""
    return ContextSpec(source_context_size=n, target_context_size=target)


def task_options(task) -> Optional[ContextSpec]:
    """The context options ``task`` gives the models it builds: the
    document task's, the defaults with ``document_task=False`` for another
    fairseq task, None for no task (an object that only carries the
    dictionaries, as tests and tools build models with: the model is checked
    against its own options only). An object with a ``cfg`` that is neither
    is refused (TypeError): its options would be ignored without a word."""
    spec = getattr(task, "context_spec", None)
    if isinstance(spec, ContextSpec):
        return spec
    if isinstance(task, FairseqTask):
        cfg = getattr(task, "cfg", None)
        pads = {k: bool(getattr(cfg, k)) for k in ("left_pad_source", "left_pad_target")
                if getattr(cfg, k, None) is not None}
        return dataclasses.replace(sentence_level(), **pads)
    if getattr(task, "cfg", None) is not None:
        # an object that looks like a task: its options would be silently ignored
        raise TypeError(f"{type(task).__name__} has a cfg but is neither a fairseq task nor "
                        "has a context_spec: models read a task's context "
                        "options only through the contract (ctx_fairseq.data.contract)")
    return None
