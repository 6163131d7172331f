"""Allow-list what fairseq checkpoints contain for torch's safe loader.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which only
unpickles tensors, primitive containers and explicitly allow-listed globals.
fairseq checkpoints store the training ``argparse.Namespace`` (``args``, or
inside ``cfg``) and may hold a few more plain-data types, so fairseq's own
``checkpoint_utils.load_checkpoint_to_cpu`` fails. We add exactly those types
with ``torch.serialization.add_safe_globals``; nothing else is allowed, and
safe loading stays on for every other ``torch.load`` in the process.
"""

import argparse
import collections
from typing import List

import torch


def fairseq_checkpoint_globals() -> List[object]:
    """The plain-data classes that fairseq checkpoints are made of."""
    allowed: List[object] = [argparse.Namespace, collections.OrderedDict]
    try:  # fairseq may record omegaconf containers in ``cfg``
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode

        allowed += [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode]
    except ImportError:  # pragma: no cover - omegaconf is a fairseq dependency
        pass
    return allowed


def allow_fairseq_checkpoints() -> None:
    """Register the fairseq checkpoint types as safe globals (idempotent)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:  # torch < 2.4 has no weights-only allow-list to extend
        return
    add(fairseq_checkpoint_globals())
