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
  options through :func:`task_options` only: a :class:`TaskContextOptions`
  that the document task builds from its configuration
  (``DocumentTranslationTask.context_options_for_models``), the defaults
  marked ``document_task=False`` for another fairseq task (its
  ``translation``), or None without a task (tests and tools that build a
  model from its dictionaries). No model reads ``task.cfg``.

The keys a model declares are checked against its ``forward`` by
``tests/test_contract.py`` for every registered architecture.
"""

from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Tuple

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


@dataclass(frozen=True)
class TaskContextOptions:
    """The document task's context options that a model's ``build_model``
    may read (the task's option names; see ``tasks/context_options.py``);
    ``document_task`` False: another fairseq task, which gives no context
    (every option at its default)."""

    document_task: bool = True
    source_context_size: int = 0
    target_context_size: int = 0
    context_direction: str = "prev"
    document_context: str = "none"
    document_memory: bool = False
    memory_precomputed: bool = False
    length_buckets: int = 1
    left_pad_source: bool = True
    left_pad_target: bool = False
    #: ``--context-separator`` as given (None: not set) and its index in the
    #: source dictionary (None: set but not in the dictionary, i.e. ``<unk>``)
    context_separator: Optional[str] = None
    context_separator_index: Optional[int] = None

    @property
    def whole_document(self) -> bool:
        """``--document-context online|offline``."""
        return (self.document_context or "none") != "none"


def task_options(task) -> Optional[TaskContextOptions]:
    """The context options ``task`` gives the models it builds: the
    document task's, the defaults with ``document_task=False`` for another
    fairseq task, None for no task (an object that only carries the
    dictionaries, as tests and tools build models with: the model is checked
    against its own options only). An object with a ``cfg`` that is neither
    is refused (TypeError): its options would be ignored without a word."""
    get = getattr(task, "context_options_for_models", None)
    if callable(get):
        return get()
    if isinstance(task, FairseqTask):
        return TaskContextOptions(document_task=False)
    if getattr(task, "cfg", None) is not None:
        # an object that looks like a task: its options would be silently ignored
        raise TypeError(f"{type(task).__name__} has a cfg but is neither a fairseq task nor "
                        "gives context_options_for_models(): models read a task's context "
                        "options only through the contract (ctx_fairseq.data.contract)")
    return None
