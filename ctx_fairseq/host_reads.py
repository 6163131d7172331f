"""Counting the places where a forward or backward pass reads a tensor back to
the host.

On a GPU every such read stalls the host until the device has finished all the
work queued before it (a ``cudaStreamSynchronize``), so a hot path that does
them per layer, per document or per decoding step becomes host-bound. On the
CPU they cost nothing, which is why they go unnoticed there; this counter
makes them visible on the CPU, where the tests run.

What is counted (``HostReadCounter``):

- the aten ops that read a value back or whose output size depends on the
  data: ``_local_scalar_dense`` (``.item()``, ``bool(t)``, ``int(t)``,
  ``float(t)``, ``if t.any():``), ``nonzero`` (also behind ``torch.where(c)``
  with one argument), ``_unique2`` / ``unique_dim`` / ``unique_consecutive``,
  ``masked_select``, ``repeat_interleave`` with a tensor of repeats and no
  ``output_size``, ``bincount`` without ``minlength`` large enough (counted
  always: its size depends on the data), and indexing with a boolean mask
  (``t[mask]``, ``t[mask] = v``: ``aten.index`` / ``index_put`` with a bool
  index, which runs ``nonzero`` inside);
- ``Tensor.tolist`` and ``Tensor.numpy`` / ``Tensor.cpu`` calls (patched while
  the counter is active: on the CPU they do not reach the dispatcher as copies).

``Tensor.cpu()`` is counted only when its input is not already on the CPU,
as on a GPU (on the CPU it is a no-op and never a read).

Usage::

    with HostReadCounter() as reads:
        loss.backward()
    reads.total, reads.by_op  # int, Counter of op names
"""

from collections import Counter
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_READ_OPS = {
    aten._local_scalar_dense.default: "item",
    aten.nonzero.default: "nonzero",
    aten.nonzero_static.default: None,  # static size: no read
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.masked_select.default: "masked_select",
    aten.bincount.default: "bincount",
}
_READ_PACKETS = {
    aten.repeat_interleave: "repeat_interleave",
}


def _bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in indices if i is not None)


class HostReadCounter(TorchDispatchMode):
    """Counts host reads (see the module docstring) while active."""

    def __init__(self):
        super().__init__()
        self.by_op: Counter = Counter()
        self._saved = {}

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _READ_OPS.get(func)
        if name is not None:
            self.by_op[name] += 1
        elif func.overloadpacket in _READ_PACKETS:
            # repeat_interleave(repeats) or repeat_interleave(self, repeats)
            repeats = (args[0] if func is aten.repeat_interleave.Tensor
                       else args[1] if len(args) > 1 else kwargs.get("repeats"))
            if isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None:
                self.by_op[_READ_PACKETS[func.overloadpacket]] += 1
        elif func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                      aten._index_put_impl_.default):
            if _bool_index(args[1]):
                self.by_op["bool_index"] += 1
        return func(*args, **kwargs)

    def _patch(self, name: str, counted):
        original = getattr(torch.Tensor, name)
        self._saved[name] = original
        counter = self

        def wrapper(t, *a, **k):
            if counted(t, *a, **k):
                counter.by_op[name] += 1
            return original(t, *a, **k)

        setattr(torch.Tensor, name, wrapper)

    def __enter__(self):
        self._patch("tolist", lambda t: True)
        self._patch("numpy", lambda t, *a, **k: True)
        self._patch("cpu", lambda t, *a, **k: t.device.type != "cpu")
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for name, original in self._saved.items():
                setattr(torch.Tensor, name, original)
            self._saved.clear()


def count_host_reads(fn, *args, **kwargs) -> Counter:
    """Runs ``fn(*args, **kwargs)`` under a ``HostReadCounter``; returns its counts."""
    with HostReadCounter() as reads:
        fn(*args, **kwargs)
    return reads.by_op


def describe(counts: Optional[Counter]) -> str:
    if not counts:
        return "0"
    return f"{sum(counts.values())} (" + ", ".join(f"{k} {v}" for k, v in
                                                  counts.most_common()) + ")"
