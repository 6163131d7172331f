"""The context a scorer gives a model: one value for every consumer
(ctx-cxmi, the contrastive scorer, the demo), built by the dataset
(:meth:`ctx_fairseq.data.document_dataset.DocumentContextDataset.with_condition`)
and the task (``DocumentTranslationTask.condition_dataset``), so that no
tool forges document ids or changes the task's options to get it.

Conditions (Fernandes et al. 2021 for ``true`` against ``none``; the
ablations are the sensitivity checks of Voita et al. 2018 and Kim et al.
2019, see docs/evaluation.md):

* ``true``: each sentence's own context, as the model was trained (with a
  size N: its N nearest previous context sentences; for a document memory,
  the memory sentences at most N positions away, its window);
* ``none``: the empty context. A bounded context is cut to 0 sentences; a
  whole-document context or a document memory puts each sentence alone in
  its document, so nothing of the document is visible;
* ``shuffled``: the context of another document (``--context-ablation
  shuffled``), cut to N likewise;
* ``random``: random tokens in place of the context (``--context-ablation
  random``), cut to N likewise.
"""

from dataclasses import dataclass
from typing import Dict, Optional

from ctx_fairseq.errors import InputError

__all__ = ["CONDITION_KINDS", "ContextCondition"]

#: the conditions, the empty context and the two ablations included
CONDITION_KINDS = ("true", "none", "shuffled", "random")


@dataclass(frozen=True)
class ContextCondition:
    """``kind`` (:data:`CONDITION_KINDS`) and ``size``: None, the context as
    trained (a bounded context's whole window); N >= 0, each sentence's N
    nearest previous context sentences (a bounded context of previous
    sentences), or a document memory's sentences at most N positions away
    (its window). ``none`` takes no size (it is size 0)."""

    kind: str = "true"
    size: Optional[int] = None

    def __post_init__(self):
        if self.kind not in CONDITION_KINDS:
            raise InputError(f"unknown context condition {self.kind!r}; expected one of "
                             f"{', '.join(CONDITION_KINDS)}")
        if self.size is not None:
            if isinstance(self.size, bool) or int(self.size) != self.size or self.size < 0:
                raise InputError(f"context size must be an integer >= 0, got {self.size!r}")
            if self.kind == "none":
                raise InputError("the 'none' condition is the empty context: it takes no size")

    @property
    def ablation(self) -> str:
        """The dataset's ``--context-ablation`` for this condition."""
        return self.kind if self.kind in ("shuffled", "random") else "none"

    def __str__(self) -> str:
        return self.kind if self.size is None else f"{self.kind}@{self.size}"

    def dataset_args(self, whole_document: bool, memory: bool = False) -> Dict[str, object]:
        """The ``DocumentContextDataset`` arguments that give this condition:
        ``ablation``, ``context_size`` and ``isolate_sentences``.
        ``whole_document``: the dataset reads a whole-document context or a
        document memory (``none`` isolates each sentence); ``memory``: a
        document memory, whose window a size bounds (the memory sentences at
        most N positions away); a whole-document context without one has no
        size to set."""
        if self.size is not None and whole_document and not memory:
            raise InputError(f"context condition {self}: a whole-document context has no "
                             "bounded context size to set")
        if self.kind == "none":
            return {"ablation": "none", "context_size": None if whole_document else 0,
                    "isolate_sentences": bool(whole_document)}
        return {"ablation": self.ablation, "context_size": self.size,
                "isolate_sentences": False}
