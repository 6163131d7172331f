"""``--lr-scale-pretrained S``: the parameters loaded from a sentence checkpoint
train at ``S`` times the scheduler's learning rate, the model's new parameters
at the rate itself (G-Transformer's second stage, Bao et al. 2021: the loaded
parameters at 0.2x).

Mechanism: **scaled parameter groups**. fairseq builds one torch parameter
group (``Trainer._build_optimizer``) and its schedulers set one rate for all
groups (``FairseqOptimizer.set_lr``). Installed on import
(:func:`install`), with the option different from 1:

* after fairseq has built the optimizer, its torch optimizer's one group is
  split in two, **pretrained** first, then **new**, each a copy of the group's
  settings plus a key ``lr_scale`` (``S`` and 1.0); an empty group is left out;
* ``FairseqOptimizer.set_lr(lr)`` gives a group with ``lr_scale`` the rate
  ``lr * lr_scale`` (and keeps ``lr`` as its ``unscaled_lr``);
  ``get_lr()`` returns the unscaled rate, so the schedulers, the log's ``lr``
  and ``--stop-min-lr`` see the rate of the schedule; the optimizer's step
  reads each group's own ``lr``;
* ``FairseqOptimizer.load_state_dict`` keeps the scales the run's options give
  (torch would take the checkpoint's), so a resumed run has the same groups at
  the scale it is given; a checkpoint whose groups do not match is an error
  naming both counts.

Groups without ``lr_scale`` (every run with the default 1.0) are set exactly
as fairseq sets them: nothing else changes.

Pretrained parameters: in a run started from a sentence checkpoint (fairseq's
``--finetune-from-model`` or the project's ``--init-from-sentence-checkpoint``;
a resumed run of either keeps its groups), every model parameter except those
the model declares new (``model.new_parameter_names()``, a set of names as
``named_parameters`` gives them; a shared parameter is new when any of its
names is; a model without the method: none is new). The criterion's
parameters, if any, are new.

Wrappers: the groups are split in the torch optimizer the wrapper steps, so
``--fp16 --fp16-no-flatten-grads`` (fp32 copies, one per parameter),
``--memory-efficient-fp16``, ``--bf16``, ``--amp`` and ``--use-bmuf`` work.
Refused, one line each: ``--fp16`` with flattened gradients (fairseq's
default: all parameters are one fp32 tensor, one group), ``--optimizer
composite`` (its own groups and schedulers), ``--ddp-backend fully_sharded``
and ``--zero-sharding os`` (they regroup the parameters), a scale below 0, and
a scale other than 1 without a sentence checkpoint (nothing is pretrained).
"""

import functools
import logging
import math
from typing import Dict, List, Optional, Set

from ctx_fairseq.errors import InputError

__all__ = ["install", "lr_scale_of", "sentence_checkpoint_of", "pretrained_mask",
           "split_param_groups"]

logger = logging.getLogger(__name__)

OPTION = "--lr-scale-pretrained"


def lr_scale_of(cfg) -> float:
    """The run's ``lr_scale_pretrained`` (the task's option; 1.0 where the task
    has none)."""
    value = getattr(getattr(cfg, "task", None), "lr_scale_pretrained", None)
    return 1.0 if value is None else float(value)


def sentence_checkpoint_of(cfg) -> Optional[str]:
    """The sentence checkpoint the run starts from: ``--finetune-from-model``
    or ``--init-from-sentence-checkpoint`` (a model or task option)."""
    path = getattr(getattr(cfg, "checkpoint", None), "finetune_from_model", None)
    for part in ("model", "task"):
        path = path or getattr(getattr(cfg, part, None), "init_from_sentence_checkpoint", None)
    return path or None


def check_options(cfg, scale: float) -> None:
    """The refusals of the module docstring (``scale != 1``)."""
    if not math.isfinite(scale) or scale < 0:
        raise InputError(f"{OPTION} {scale}: expected a finite number >= 0")
    if sentence_checkpoint_of(cfg) is None:
        raise InputError(f"{OPTION} {scale}: the run starts from no sentence checkpoint, so no "
                         f"parameter is pretrained; give --finetune-from-model or "
                         f"--init-from-sentence-checkpoint, or leave {OPTION} at 1")
    common = cfg.common
    if (getattr(common, "fp16", False) and not getattr(common, "bf16", False)
            and not getattr(common, "memory_efficient_fp16", False)
            and not getattr(common, "fp16_no_flatten_grads", False)):
        raise InputError(f"{OPTION} {scale} with --fp16: fairseq flattens all parameters into one "
                         f"fp32 tensor (one group, one rate); add --fp16-no-flatten-grads or use "
                         f"--memory-efficient-fp16")
    optimizer = getattr(getattr(cfg, "optimizer", None), "_name", None)
    if optimizer == "composite":
        raise InputError(f"{OPTION} {scale} with --optimizer composite: the composite optimizer "
                         f"has its own groups and schedulers (its groups' lr_scale); leave "
                         f"{OPTION} at 1")
    dist = cfg.distributed_training
    if getattr(dist, "ddp_backend", None) == "fully_sharded" or \
            getattr(dist, "zero_sharding", "none") == "os":
        raise InputError(f"{OPTION} {scale} with --ddp-backend fully_sharded or --zero-sharding "
                         f"os (they regroup the parameters): not supported; leave {OPTION} at 1")


def pretrained_mask(model, params) -> List[bool]:
    """Per parameter of ``params``: is it a pretrained model parameter (module
    docstring)? Parameters that are not the model's (the criterion's) are
    new."""
    declared: Set[str] = set(model.new_parameter_names()) if hasattr(
        model, "new_parameter_names") else set()
    names: Dict[int, List[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    known = {n for ns in names.values() for n in ns}
    unknown = sorted(declared - known)
    if unknown:
        raise RuntimeError(f"{type(model).__name__}.new_parameter_names() names "
                           f"{len(unknown)} parameter(s) the model does not have, e.g. "
                           f"{unknown[0]!r}")
    return [id(p) in names and not any(n in declared for n in names[id(p)]) for p in params]


def _torch_optimizer_and_sources(optimizer):
    """The torch optimizer that steps, and per parameter of its group the
    model (or criterion) parameter it updates (an fp32 copy's fp16 original)."""
    inner = optimizer._optimizer if type(optimizer).__name__ == "FairseqBMUF" else optimizer
    torch_optimizer = optimizer.optimizer
    if len(torch_optimizer.param_groups) != 1:
        raise RuntimeError(f"{OPTION}: expected the one parameter group fairseq builds, found "
                           f"{len(torch_optimizer.param_groups)}")
    group_params = torch_optimizer.param_groups[0]["params"]
    fp32 = getattr(inner, "fp32_params", None)
    if isinstance(fp32, list):
        originals = {id(p32): p16 for p16, p32 in zip(inner.fp16_params, fp32)}
        sources = [originals.get(id(p), p) for p in group_params]
    else:
        sources = list(group_params)
    return torch_optimizer, sources


def split_param_groups(optimizer, model, scale: float) -> Dict[str, int]:
    """Split ``optimizer``'s one group into pretrained (``lr_scale = scale``)
    and new (``lr_scale = 1``) and set their rates from the current one;
    returns the counts for the log."""
    lr = optimizer.get_lr()
    torch_optimizer, sources = _torch_optimizer_and_sources(optimizer)
    (group,) = torch_optimizer.param_groups
    mask = pretrained_mask(model, sources)
    settings = {k: v for k, v in group.items() if k != "params"}
    pretrained = [p for p, m in zip(group["params"], mask) if m]
    new = [p for p, m in zip(group["params"], mask) if not m]
    torch_optimizer.param_groups = []
    for params, s in ((pretrained, scale), (new, 1.0)):
        if params:
            torch_optimizer.add_param_group({**settings, "params": params, "lr_scale": s})
    optimizer.set_lr(lr)
    return {"pretrained_tensors": len(pretrained), "new_tensors": len(new),
            "pretrained_numel": sum(p.numel() for p in pretrained),
            "new_numel": sum(p.numel() for p in new)}


def _set_lr(self, lr):
    for group in self.param_groups:
        if "lr_scale" in group:
            group["lr"] = lr * group["lr_scale"]
            group["unscaled_lr"] = lr
        else:
            group["lr"] = lr


def _get_lr(self):
    """The schedule's (unscaled) rate: exactly the one ``set_lr`` was given,
    unless a scheduler changed the groups' rates itself (torch's
    ``ReduceLROnPlateau``, behind ``reduce_lr_on_plateau``, multiplies each
    group's ``lr``): then a scaled group's rate divided by its scale."""
    groups = list(self.param_groups)
    group = groups[0]
    if "lr_scale" not in group:
        return group["lr"]
    for g in groups:
        scale = float(g.get("lr_scale", 1.0))
        if scale > 0 and g["lr"] != g.get("unscaled_lr", 0.0) * scale:
            return g["lr"] / scale
    return group["unscaled_lr"]


def _keep_scales(original):
    @functools.wraps(original)
    def load_state_dict(self, state_dict, optimizer_overrides=None):
        groups = list(self.param_groups)
        scales = [g.get("lr_scale") for g in groups]
        saved = state_dict.get("param_groups", []) if isinstance(state_dict, dict) else []
        scaled = any(s is not None for s in scales) or any("lr_scale" in g for g in saved)
        if scaled and len(saved) != len(groups) or scaled and any(
                len(a["params"]) != len(b["params"]) for a, b in zip(saved, groups)):
            raise InputError(
                f"the checkpoint's optimizer state has {len(saved)} parameter group(s) of "
                f"{[len(g['params']) for g in saved]} tensors, this run "
                f"{len(groups)} of {[len(g['params']) for g in groups]} ({OPTION} splits "
                f"pretrained and new parameters): resume with the {OPTION} the run was "
                f"started with (1 or not), or give --reset-optimizer")
        original(self, state_dict, optimizer_overrides)
        for group, scale in zip(self.param_groups, scales):
            if scale is None:
                group.pop("lr_scale", None)
                group.pop("unscaled_lr", None)
            else:
                group["lr_scale"] = scale

    load_state_dict.ctx_fairseq_fixed = True
    return load_state_dict


def _split_after_build(original):
    @functools.wraps(original)
    def _build_optimizer(self):
        scale = lr_scale_of(self.cfg)
        if scale != 1.0:
            check_options(self.cfg, scale)
        original(self)
        if scale != 1.0:
            counts = split_param_groups(self._optimizer, self._model, scale)
            logger.info(
                f"{OPTION} {scale}: {counts['pretrained_tensors']} pretrained tensors "
                f"({counts['pretrained_numel']} parameters) at {scale}x the learning rate, "
                f"{counts['new_tensors']} new ({counts['new_numel']}) at 1x")

    _build_optimizer.ctx_fairseq_fixed = True
    return _build_optimizer


def install() -> None:
    """Patch fairseq's ``FairseqOptimizer.set_lr``/``get_lr``/``load_state_dict``
    and ``Trainer._build_optimizer`` (idempotent; module docstring)."""
    from fairseq.optim import FairseqOptimizer
    from fairseq.trainer import Trainer

    if getattr(Trainer._build_optimizer, "ctx_fairseq_fixed", False):
        return
    FairseqOptimizer.set_lr = _set_lr
    FairseqOptimizer.get_lr = _get_lr
    FairseqOptimizer.load_state_dict = _keep_scales(FairseqOptimizer.load_state_dict)
    Trainer._build_optimizer = _split_after_build(Trainer._build_optimizer)
