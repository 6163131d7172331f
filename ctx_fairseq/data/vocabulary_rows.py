"""A checkpoint's tensors with one row per dictionary symbol (embeddings,
output projection) fitted to the dictionaries of the document task, which
adds symbols of its own (``--doc2doc-separator``, ``--concat-break``): here,
on the lowest floor both the task (``build_model``) and the models
(``load_sentence_checkpoint``) read."""

import logging
from typing import Dict, List, Optional

import torch
from torch import Tensor

__all__ = ["VocabularyExtension", "extend_vocabulary"]

logger = logging.getLogger(__name__)


class VocabularyExtension:
    """A sentence checkpoint made before the task added symbols to the
    dictionaries (``--doc2doc``'s separator, ``--concat-context``'s break) has fewer rows in the tensors
    with one row per dictionary symbol: the embeddings and the output
    projection. :meth:`register` gives each such module of ``model`` a
    ``load_state_dict`` pre-hook (torch's
    ``_register_load_state_dict_pre_hook``) that appends the missing rows to
    the checkpoint's tensor before it is copied, so ``--finetune-from-model``
    (and :func:`load_sentence_checkpoint`, which calls :meth:`extend`)
    loads it into any architecture. The new rows are drawn as fairseq
    initialises embeddings, ``normal(0, dim ** -0.5)`` (the padding row is
    an old row, never a new one), from a generator seeded with ``seed``;
    tensors shared by several modules (``--share-all-embeddings``,
    ``--share-decoder-input-output-embed``) get the same rows. A checkpoint
    with any other number of rows is left to fail as it would. Logged once
    per model."""

    def __init__(self, seed: int = 1, refuse: bool = False):
        self.seed = int(seed)
        #: a model restored to translate or score (not a new run): such a
        #: checkpoint is refused, not given random rows
        self.refuse = bool(refuse)
        #: state key -> (the module's parameter, the rows the checkpoint lacks)
        self.keys: Dict[str, tuple] = {}
        self._rows: Dict[int, Tensor] = {}
        self.logged = False

    @classmethod
    def register(cls, model, rows_before: Dict[str, int], rows_now: Dict[str, int],
                 seed: int = 1, refuse: bool = False) -> Optional["VocabularyExtension"]:
        """Hooks on ``model``'s modules with one row per symbol:
        ``rows_before`` / ``rows_now``: the dictionary sizes (``src``,
        ``tgt``) before and after the task added its symbols. None when
        nothing was added. ``refuse``: a checkpoint with the old rows is an
        :class:`~ctx_fairseq.errors.InputError` instead (a model restored to
        translate or score would read a random row)."""
        if all(rows_before[s] == rows_now[s] for s in rows_now):
            return None
        ext = cls(seed, refuse)
        hooked = set()
        # every name of a shared module (--share-all-embeddings: one module, two names),
        # so that extend() finds each key of a plain state dict; one hook per module
        for name, module in model.named_modules(remove_duplicate=False):
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 2:
                continue
            is_embedding = isinstance(module, torch.nn.Embedding)
            if not (is_embedding or name.endswith("output_projection")):
                continue
            side = "src" if name.startswith("encoder") else "tgt"
            if weight.size(0) != rows_now[side] or rows_before[side] == rows_now[side]:
                continue
            prefix = name + "." if name else ""
            ext.keys[prefix + "weight"] = (weight, rows_before[side])
            if id(module) not in hooked:
                hooked.add(id(module))
                module._register_load_state_dict_pre_hook(ext._hook(prefix))
        model._vocabulary_extension = ext
        return ext

    def _new_rows(self, param: Tensor, missing: int, dim: int) -> Tensor:
        rows = self._rows.get(id(param))
        if rows is None:
            g = torch.Generator().manual_seed(self.seed + len(self._rows))
            rows = torch.randn(missing, dim, generator=g) * dim ** -0.5
            self._rows[id(param)] = rows
        return rows

    def extend(self, state_dict: Dict[str, Tensor], prefix: str = "") -> List[str]:
        """The tensors of ``state_dict`` (keys under ``prefix``) with the old
        number of rows, extended in place; returns their keys."""
        done = []
        for key, (param, before) in self.keys.items():
            full = prefix + key
            w = state_dict.get(full)
            if w is None or w.dim() != 2 or w.size(0) != before or \
                    w.size(0) >= param.size(0) or w.size(1) != param.size(1):
                continue
            if self.refuse:
                from ctx_fairseq.errors import InputError

                raise InputError(
                    f"the checkpoint's {full} has {w.size(0)} rows for the {param.size(0)} "
                    "symbols of the dictionaries: it was trained without the symbols the "
                    "task adds (--doc2doc-separator, --concat-break); fine-tune it with them "
                    "first (fairseq-train ... --finetune-from-model CHECKPOINT)")
            new = self._new_rows(param, param.size(0) - w.size(0), w.size(1))
            state_dict[full] = torch.cat([w, new.to(dtype=w.dtype, device=w.device)])
            done.append(full)
        if done and not self.logged:
            self.logged = True
            logger.info(f"the checkpoint has {len(done)} tensor(s) with a row per symbol of a "
                        f"smaller dictionary ({', '.join(done)}): the rows of the symbols the "
                        "task added (--doc2doc-separator) appended, drawn as fairseq draws "
                        "embeddings (normal(0, dim**-0.5))")
        return done

    def _hook(self, prefix: str):
        """The pre-hook of the module at ``prefix`` (relative to the model;
        the hook's own prefix is where the module sits in the state dict
        being loaded, wrappers included)."""
        key = prefix + "weight"

        def hook(state_dict, module_prefix, *unused):
            full = module_prefix + "weight"
            if full in state_dict:
                sub = {key: state_dict[full]}
                if self.extend(sub):
                    state_dict[full] = sub[key]
        return hook


def extend_vocabulary(model, state_dict: Dict[str, Tensor]) -> List[str]:
    """:meth:`VocabularyExtension.extend` of the extension registered on
    ``model`` (by the document task's ``build_model``), or nothing."""
    ext = getattr(model, "_vocabulary_extension", None)
    return ext.extend(state_dict) if ext is not None else []
