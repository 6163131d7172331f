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
  random``), cut to N likewise;
* ``previous-k``: each sentence's k nearest previous context sentences (a
  bounded context of previous sentences);
* ``window-k``: a document memory's sentences at most k positions away.

Each is applied as ``condition.apply(spec) -> spec``
(:class:`~ctx_fairseq.data.contract.ContextSpec`).
"""

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

from ctx_fairseq.data.contract import ContextSpec
from ctx_fairseq.errors import InputError

__all__ = ["CONDITIONS", "SIZED", "WRONG_CONTEXT", "ABLATIONS", "COMPARED",
           "ContextCondition"]

#: the conditions that give wrong context on purpose (the sensitivity checks)
WRONG_CONTEXT = ("shuffled", "random")
#: the conditions that must be given a size (``previous-k``, ``window-k``)
SIZED = ("previous", "window")
#: the conditions, one vocabulary for the dataset, the task, ctx-cxmi, the
#: contrastive scorer and the probes: ``true`` and ``none``, the wrong
#: contexts and the sized ones. ``true``, ``shuffled`` and ``random`` may take
#: a size too (``true@k``: ``previous-k`` or ``window-k``, as the spec has a
#: bounded context or a memory; an ablation cut to k sentences)
CONDITIONS = ("true", "none") + WRONG_CONTEXT + SIZED
#: ``--context-ablation``'s choices: no ablation, or a wrong context
ABLATIONS = ("none",) + WRONG_CONTEXT
#: the conditions CXMI compares the true context with: the empty context and
#: the wrong ones
COMPARED = ("none",) + WRONG_CONTEXT


@dataclass(frozen=True)
class ContextCondition:
    """``kind`` (:data:`CONDITIONS`) and ``size``: None, the context as
    trained (a bounded context's whole window, a memory's window); N >= 0,
    each sentence's N nearest previous context sentences (``previous``, a
    bounded context of previous sentences) or a document memory's sentences
    at most N positions away (``window``). ``none`` takes no size (it is
    size 0)."""

    kind: str = "true"
    size: Optional[int] = None

    def __post_init__(self):
        if self.kind not in CONDITIONS:
            raise InputError(f"unknown context condition {self.kind!r}; expected one of "
                             f"{', '.join(CONDITIONS)}")
        if self.size is not None:
            if isinstance(self.size, bool) or int(self.size) != self.size or self.size < 0:
                raise InputError(f"context size must be an integer >= 0, got {self.size!r}")
            if self.kind == "none":
                raise InputError("the 'none' condition is the empty context: it takes no size")
        elif self.kind in SIZED:
            raise InputError(f"the {self.kind!r} condition takes a size: {self.kind}-k")

    @classmethod
    def parse(cls, text: Union[str, "ContextCondition"]) -> "ContextCondition":
        """A condition from its name: ``true``, ``none``, ``shuffled``,
        ``random``, ``previous-k``, ``window-k``, or a kind with ``@k``."""
        if isinstance(text, ContextCondition):
            return text
        text = str(text)
        for sep in ("@", "-"):
            kind, found, size = text.partition(sep)
            if found and size.isdigit():
                return cls(kind, int(size))
        return cls(text)

    @property
    def ablation(self) -> str:
        """The dataset's ``--context-ablation`` for this condition."""
        return self.kind if self.kind in WRONG_CONTEXT else "none"

    def __str__(self) -> str:
        if self.size is None:
            return self.kind
        return f"{self.kind}-{self.size}" if self.kind in SIZED else f"{self.kind}@{self.size}"

    def apply(self, spec: ContextSpec) -> ContextSpec:
        """``spec`` under this condition: its ablation, its bound
        (``context_size``) and, for ``none`` with a whole-document context
        or a memory, every sentence alone in its document. Refused where the
        spec has no such context: a size for a whole-document context
        without a memory, ``previous-k`` for a memory or a whole-document
        context, ``window-k`` without a memory."""
        memory = bool(spec.document_memory)
        whole = memory or spec.whole_document
        if self.kind == "previous" and whole:
            raise InputError(f"context condition {self}: the context is a whole document "
                             "(or its memory), not previous sentences; use window-k for a "
                             "memory")
        if self.kind == "window" and not memory:
            raise InputError(f"context condition {self}: a window bounds a document memory; "
                             "use previous-k for a bounded context")
        if self.size is not None and whole and not memory:
            raise InputError(f"context condition {self}: a whole-document context has no "
                             "bounded context size to set")
        if self.kind == "none":
            return dataclasses.replace(spec, ablation="none",
                                       context_size=None if whole else 0,
                                       isolate_sentences=whole)
        return dataclasses.replace(spec, ablation=self.ablation, context_size=self.size,
                                   isolate_sentences=False)
