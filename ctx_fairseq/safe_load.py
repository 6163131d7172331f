"""Allow-list what fairseq checkpoints contain for torch's safe loader.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which only
unpickles tensors, primitive containers and explicitly allow-listed globals.
fairseq checkpoints store the training ``argparse.Namespace`` (``args``, or
inside ``cfg``) and may hold a few more plain-data types (numpy arrays and
scalars of numeric dtypes, e.g. with ``--eval-bleu``), so fairseq's own
``checkpoint_utils.load_checkpoint_to_cpu`` fails. We add exactly those types
with ``torch.serialization.add_safe_globals``; nothing else is allowed, and
safe loading stays on for every other ``torch.load`` in the process.
"""

import argparse
from typing import List

import torch


def fairseq_checkpoint_globals() -> List[object]:
    """The non-primitive classes that fairseq checkpoints are made of.

    fairseq stores ``cfg`` as plain containers (``OmegaConf.to_container``),
    but with ``--arch``-style training its ``model`` entry (and the legacy
    ``args``) is an ``argparse.Namespace``. Tensors, dicts, lists, numbers,
    strings and ``OrderedDict`` (the model's state dict) are allowed by torch
    already.
    """
    return [argparse.Namespace, *_numpy_globals(), *_broadcast_globals()]


def _broadcast_globals() -> List[object]:
    """fairseq's ``broadcast_object`` (a resumed run's state, sent from rank
    0 to the other workers) pickles the state with each tensor replaced by a
    ``_TensorPlaceholder`` (a frozen dataclass holding one int, the tensor's
    index) and unpickles it with a plain ``torch.load``."""
    try:
        from fairseq.distributed.utils import _TensorPlaceholder
    except ImportError:  # pragma: no cover
        return []
    return [_TensorPlaceholder]


def _numpy_globals() -> List[object]:
    """numpy arrays and scalars of plain numeric dtypes: fairseq stores some
    meters as numpy values (e.g. the BLEU n-gram counts of ``--eval-bleu`` in
    ``extra_state``). Object arrays stay refused: unpickling their items
    would need further globals, which are not allowed."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return []
    core = getattr(np, "_core", None) or getattr(np, "core")
    out = [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype]
    dtypes = getattr(np, "dtypes", None)  # numpy >= 1.25: one class per dtype
    if dtypes is not None:
        for name in ("BoolDType", "Int8DType", "Int16DType", "Int32DType", "Int64DType",
                     "UInt8DType", "UInt16DType", "UInt32DType", "UInt64DType",
                     "Float16DType", "Float32DType", "Float64DType", "LongLongDType",
                     "ULongLongDType", "LongDType", "ULongDType"):
            if hasattr(dtypes, name):
                out.append(getattr(dtypes, name))
    return out


def allow_fairseq_checkpoints() -> None:
    """Register the fairseq checkpoint types as safe globals (idempotent)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:  # torch < 2.4 has no weights-only allow-list to extend
        return
    add(fairseq_checkpoint_globals())
