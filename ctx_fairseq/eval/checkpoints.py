"""One way the evaluation tools restore a checkpoint: the checkpoint's own
task and model options, the given data directory and overrides applied the
way fairseq applies them when it reads the file itself (and checked to have
reached the task: never a silent mismatch), the model in eval mode on the
device asked for."""

import os
from typing import Dict, Optional

import torch

from ctx_fairseq.compat import upgrade_context_options
from ctx_fairseq.errors import InputError
from ctx_fairseq.tasks.context_options import task_setting

__all__ = ["read_checkpoint", "checkpoint_task_name", "restore_checkpoint"]


def read_checkpoint(path: str) -> Dict:
    """The checkpoint's state (CPU), after checking that the file exists."""
    import ctx_fairseq  # noqa: F401  (registers the plugin, allow-lists safe loading)
    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise InputError(f"--path {path}: no such checkpoint")
    return checkpoint_utils.load_checkpoint_to_cpu(path)


def checkpoint_task_name(state: Dict) -> Optional[str]:
    """The ``--task`` a checkpoint was trained with (None if it says none)."""
    cfg = state.get("cfg")
    if cfg is not None and cfg.get("task") is not None:
        return cfg["task"].get("_name", None)
    if state.get("args") is not None:
        return getattr(state["args"], "task", None)
    return None


def restore_checkpoint(path: str, data: str, overrides: Optional[Dict] = None,
                       device: str = "cpu", state: Optional[Dict] = None):
    """``(model, task, cfg)`` of checkpoint ``path`` with ``data`` as its data
    directory and ``overrides`` (task options) applied; ``state``: the state
    already read (:func:`read_checkpoint`). ``device``: ``cpu``, ``cuda``
    (an error without a GPU) or ``auto`` (the GPU when there is one)."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import overwrite_args_by_name

    if device not in ("cpu", "cuda", "auto"):
        raise ValueError(f"device: expected cpu, cuda or auto, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--cuda: no GPU available")
    state = read_checkpoint(path) if state is None else state
    overrides = {"data": data, **(overrides or {})}
    # fairseq applies arg_overrides only when it reads the file itself: apply
    # them to the state read here, as load_checkpoint_to_cpu would
    if state.get("args") is not None:
        for k, v in overrides.items():
            setattr(state["args"], k, v)
    if state.get("cfg") is not None:
        upgrade_context_options(state["cfg"])  # (an old checkpoint: before the overrides)
        overwrite_args_by_name(state["cfg"], overrides)
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides=overrides, state=state)
    for k, v in overrides.items():  # never a silent mismatch
        got = task_setting(task, k)
        if got is not None and str(got) != str(v):
            raise RuntimeError(f"{path}: option {k}={v!r} did not reach the task ({got!r})")
    model = models[0].eval()
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        model = model.cuda()
    return model, task, cfg
