"""Counting the places where a forward or backward pass reads a tensor back to
the host.

On a GPU every such read stalls the host until the device has finished all the
work queued before it (a ``cudaStreamSynchronize``), so a hot path that does
them per layer, per document or per decoding step becomes host-bound. On the
CPU they cost nothing, which is why they go unnoticed there; this counter
makes them visible on the CPU, where the tests run. The model runs on the CPU
as it would on a GPU: every tensor of the hot path (the model's, the batch's)
stands for a device tensor.

What is counted (``HostReadCounter``; the key in ``by_op`` in brackets):

- the aten ops that read a value back or whose output size depends on the
  data: ``_local_scalar_dense`` (``item``: ``.item()``, ``bool(t)``,
  ``int(t)``, ``float(t)``, ``if t.any():``, a tensor as a Python index),
  ``nonzero`` (also behind ``torch.where(c)`` with one argument and
  ``argwhere``), ``_unique2`` / ``_unique`` / ``unique_dim`` /
  ``unique_consecutive`` / ``unique_dim_consecutive`` (``unique``),
  ``masked_select``, ``equal`` / ``allclose`` (``equal``: they return a
  Python bool), ``repeat_interleave`` with a tensor of repeats and no
  ``output_size``, ``bincount`` (always: its size depends on the data, and on
  CUDA it reads the maximum even with ``minlength``), and indexing with a
  boolean mask (``bool_index``: ``t[mask]``, ``t[mask] = v``: ``aten.index`` /
  ``index_put`` with a bool index, which runs ``nonzero`` inside);
- ``Tensor.cpu()`` and ``Tensor.to("cpu")`` / ``.to(torch.device("cpu"))``
  (``cpu``): on a GPU, a device-to-host copy that waits for the device. On
  the CPU they are no-ops that never reach the dispatcher, so they are
  counted at the Python call (patched while the counter is active), whatever
  the tensor's device: in the hot path every tensor stands for a device
  tensor. ``.to(other.device)`` cannot be told from a no-op on the CPU and is
  not counted;
- ``Tensor.tolist()`` (``tolist``) and ``Tensor.numpy()`` (``numpy``, also
  behind ``np.asarray(t)``): on a GPU ``numpy()`` needs a host tensor, so a
  call on a hot-path tensor stands for the ``.cpu().numpy()`` it would be.

Reads of *host tensors* are not counted, as they cost nothing on a GPU
either: the result of a counted ``.cpu()``; the result of
``torch._shape_as_tensor`` (``torch.onnx.operators.shape_as_tensor``: a
tensor's shape as a CPU tensor, which fairseq's sinusoidal positional
embedding reads on every call); and, transitively, the outputs of every op
whose tensor inputs are all host tensors. So ``t.cpu().numpy()``,
``t.cpu().tolist()``, ``int(t.cpu()[0])`` or ``(t.cpu() + 1).tolist()``
count one read (the copy), as on a GPU.

Not counted, because they do not read back: host-to-device copies (on a GPU
a copy from pageable memory also synchronises: the CUDA tests count those,
``tests/test_cuda.py``), operations on 0-dim tensors mixed with device
tensors, ``len(t)``, ``t.shape``. The counter's own cases are in
``tests/test_host_reads.py``.

Usage::

    with HostReadCounter() as reads:
        loss.backward()
    reads.total, reads.by_op  # int, Counter of op names
"""

import weakref
from collections import Counter
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten


def _op(packet: str, overload: str = "default"):
    """``aten.<packet>.<overload>``, or None where this torch has no such op."""
    return getattr(getattr(aten, packet, None), overload, None)


_READ_OPS = {op: name for op, name in (
    (_op("_local_scalar_dense"), "item"),
    (_op("nonzero"), "nonzero"),
    (_op("_unique2"), "unique"),
    (_op("_unique"), "unique"),
    (_op("unique_dim"), "unique"),
    (_op("unique_consecutive"), "unique"),
    (_op("unique_dim_consecutive"), "unique"),
    (_op("masked_select"), "masked_select"),
    (_op("bincount"), "bincount"),
    (_op("equal"), "equal"),
    (_op("allclose"), "equal"),
) if op is not None}
_INDEX_OPS = {op for op in (_op("index", "Tensor"), _op("index_put"), _op("index_put_"),
                            _op("_index_put_impl_")) if op is not None}


def _bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in indices if i is not None)


def _is_cpu(x) -> bool:
    return isinstance(x, (str, torch.device)) and torch.device(x).type == "cpu"


class HostReadCounter(TorchDispatchMode):
    """Counts host reads (see the module docstring) while active."""

    def __init__(self):
        super().__init__()
        self.by_op: Counter = Counter()
        self._saved = {}  # patched Tensor methods
        self._functions = []  # patched functions: (module, name, original)
        self._host = set()  # ids of the tensors on the host (results of counted copies)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def _on_host(self, t) -> bool:
        return isinstance(t, torch.Tensor) and id(t) in self._host

    def _mark_host(self, t) -> None:
        if id(t) not in self._host:
            self._host.add(id(t))
            weakref.finalize(t, self._host.discard, id(t))

    def _count(self, func, args, kwargs) -> Optional[str]:
        name = _READ_OPS.get(func)
        if name is not None:
            return name
        if func.overloadpacket is aten.repeat_interleave:
            # repeat_interleave(repeats) or repeat_interleave(self, repeats)
            repeats = (args[0] if func is aten.repeat_interleave.Tensor
                       else args[1] if len(args) > 1 else kwargs.get("repeats"))
            if isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None:
                return "repeat_interleave"
        elif func in _INDEX_OPS and _bool_index(args[1]):
            return "bool_index"
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        host = bool(inputs) and all(self._on_host(x) for x in inputs)
        name = self._count(func, args, kwargs)
        if name is not None and not host:
            self.by_op[name] += 1
        out = func(*args, **kwargs)
        if host:  # computed from host tensors only: the result is on the host too
            for x in tree_flatten(out)[0]:
                if isinstance(x, torch.Tensor):
                    self._mark_host(x)
        return out

    def _patch(self, name: str, counted):
        """Wraps ``Tensor.<name>``: a call counts where ``counted(t, ...)``
        and ``t`` is not a host tensor."""
        original = getattr(torch.Tensor, name)
        self._saved[name] = original
        counter, key = self, "cpu" if name == "to" else name

        def wrapper(t, *a, **k):
            read = counted(t, *a, **k) and not counter._on_host(t)
            out = original(t, *a, **k)
            if read:
                counter.by_op[key] += 1
                if isinstance(out, torch.Tensor):  # a copy on the host
                    if out is t:  # a no-op on the CPU: the copy a GPU would make
                        out = t.view_as(t)
                    counter._mark_host(out)
            return out

        setattr(torch.Tensor, name, wrapper)

    def __enter__(self):
        self._patch("tolist", lambda t: True)
        self._patch("numpy", lambda t, *a, **k: True)
        self._patch("cpu", lambda t, *a, **k: True)
        self._patch("to", lambda t, *a, **k: any(_is_cpu(x) for x in (*a, *k.values())))
        import torch.onnx.operators as onnx_operators

        shape_as_tensor = torch._shape_as_tensor

        def host_shape(t):  # the shape is on the host: reading it is free
            out = shape_as_tensor(t)
            self._mark_host(out)
            return out

        for owner in (torch, onnx_operators):
            for name in ("_shape_as_tensor", "shape_as_tensor"):
                if getattr(owner, name, None) is shape_as_tensor:
                    self._functions.append((owner, name, shape_as_tensor))
                    setattr(owner, name, host_shape)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for name, original in self._saved.items():
                setattr(torch.Tensor, name, original)
            for owner, name, original in self._functions:
                setattr(owner, name, original)
            self._saved.clear()
            self._functions.clear()


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
