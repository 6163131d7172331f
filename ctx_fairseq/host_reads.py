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

import contextlib
import os
import traceback
import warnings
import weakref
from collections import Counter
from typing import List, Optional, Tuple

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


# --------------------------------------------------------------------------- CUDA

#: what torch's sync debug mode warns (``torch.cuda.set_sync_debug_mode("warn")``)
SYNC_WARNING = "synchroniz"
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP_FILES = {os.path.abspath(warnings.__file__), os.path.abspath(contextlib.__file__),
               os.path.abspath(__file__)}


def _short(path: str) -> str:
    """``path`` from its package on (``torch/cuda/__init__.py``, ``fairseq/...``,
    ``ctx_fairseq/...``, ``tests/...``), else its base name."""
    parts = os.path.abspath(path).split(os.sep)
    for anchor in ("ctx_fairseq", "fairseq", "torch", "tests"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)
            return "/".join(parts[i:])
    return os.path.basename(path)


def sync_site(stack) -> Tuple[str, str]:
    """``(site, where)`` of a synchronisation from the Python stack at its
    warning (``traceback.extract_stack()``, innermost last): ``where`` is the
    innermost frame (the Python line that called into torch's C++, as the
    warning's own file and line give it, e.g. ``torch/cuda/__init__.py:1270``),
    ``site`` the innermost frame outside torch (the caller's line: the plugin's,
    fairseq's or the test's own). A synchronisation with no frame outside torch
    has ``site`` ``"torch"``."""
    frames = [f for f in stack if os.path.abspath(f.filename) not in _SKIP_FILES]
    if not frames:
        return "torch", "?"
    where = f"{_short(frames[-1].filename)}:{frames[-1].lineno}"
    for f in reversed(frames):
        if not os.path.abspath(f.filename).startswith(_TORCH_DIR + os.sep):
            return f"{_short(f.filename)}:{f.lineno}", where
    return "torch", where


def site_kind(site: str) -> str:
    """``plugin`` (ctx_fairseq), ``fairseq``, ``torch`` (no frame outside
    torch) or ``harness`` (anything else: the test's or the counter's code)."""
    if site.startswith("ctx_fairseq/"):
        return "plugin"
    if site.startswith("fairseq/"):
        return "fairseq"
    if site == "torch":
        return "torch"
    return "harness"


class SyncCounter:
    """Counts the synchronising CUDA calls while active
    (``torch.cuda.set_sync_debug_mode("warn")``: each warns once), each by its
    site (:func:`sync_site`): ``by_op`` counts ``site <- where`` keys, e.g.
    ``fairseq/criterions/label_smoothed_cross_entropy.py:80 <- torch/_tensor.py:40``.
    The stack of each warning is taken when it is shown (``warnings.showwarning``),
    so a synchronisation inside torch's own Python code (a line of an
    ``__init__.py``) is attributed to the line of the plugin, of fairseq or of
    the test that called it. ``cuda=False``: no sync debug mode (records
    ``warnings.warn`` calls whose message says "synchroniz": the CPU tests of
    the attribution)."""

    def __init__(self, cuda: bool = True):
        self.cuda = cuda
        self.sites: List[Tuple[str, str]] = []

    def __enter__(self):
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if SYNC_WARNING in str(message):
                self.sites.append(sync_site(traceback.extract_stack()[:-1]))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        try:
            if self.cuda:
                torch.cuda.set_sync_debug_mode(0)
        finally:
            self._warnings.__exit__(*exc)

    @property
    def by_op(self) -> Counter:
        return Counter(f"{site} <- {where}" if where != site else site
                       for site, where in self.sites)


def every_step(counts: List[Counter]) -> Counter:
    """The synchronisations that each of several identical steps made: per key,
    the minimum over the steps (``Counter`` intersection). A step's code path
    on one batch is the same every time, so a synchronisation it makes is in
    every step; one that shows in some steps only comes from outside the step's
    code (the garbage collector, the caching allocator, a once-per-process
    initialisation) and is reported apart (:func:`intermittent`), not
    counted against the model."""
    out = counts[0].copy()
    for c in counts[1:]:
        out &= c
    return out


def intermittent(counts: List[Counter]) -> Counter:
    """Per key, the most any one step made beyond :func:`every_step`."""
    common = every_step(counts)
    out: Counter = Counter()
    for c in counts:
        out |= c - common
    return out
