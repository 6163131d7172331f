"""A second device on a CPU-only machine, for tests of the code that moves
batches between the host and the GPU (issue 18, defect 1: a re-collated
batch whose ``id`` stayed on the CPU met GPU indices inside fairseq's
generator, which only a GPU showed).

``Elsewhere`` is a tensor that reports the device ``meta`` (standing for the
GPU) but holds CPU data, so it can be computed with and read back.
``OtherDeviceMode`` (a ``TorchDispatchMode``) makes ``.to(OTHER)``,
``torch.*(..., device=OTHER)`` and every operation on ``Elsewhere`` tensors
produce ``Elsewhere`` tensors, and raises as CUDA does where a plain CPU
tensor of one or more dimensions is mixed with them (e.g. a CPU tensor
indexed by device indices; a device tensor indexed by CPU indices is allowed,
as on CUDA). ``.cpu()`` / ``.to("cpu")`` give plain tensors back; ``.item()``
and ``.tolist()`` read the value, as on a GPU.

A model moved with ``model.to(OTHER)`` inside the mode computes on the CPU
data as a GPU model would, so fairseq's generator and the task's generation
paths run whole on the simulated device, and any tensor they create on the
CPU (or leave there) and mix with the device's raises.

``checked_generator(generator)`` wraps a generator's ``generate`` with an
assertion that the batch it is given (every tensor, ``id`` and ``target``
included), the prefix and the constraints are all on ``OTHER`` (stricter than
fairseq, which fails only where it indexes one of them with device indices).
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

OTHER = torch.device("meta")
aten = torch.ops.aten


class Elsewhere(torch.Tensor):
    """CPU data that says it is on ``OTHER`` (module docstring)."""

    @staticmethod
    def __new__(cls, elem):
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, device=OTHER, requires_grad=elem.requires_grad)
        r.elem = elem
        return r

    def __repr__(self):
        return f"Elsewhere({self.elem!r})"

    def tolist(self):  # a read back to the host, as on a GPU
        return self.elem.tolist()

    def data_ptr(self):  # (a wrapper has no storage of its own: 0 for every tensor)
        return self.elem.data_ptr()

    def numpy(self, *a, **k):
        raise TypeError("can't convert a tensor on another device to numpy; use .cpu() first")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with OtherDeviceMode():
            return func(*args, **(kwargs or {}))


def _is_other(device) -> bool:
    return device is not None and torch.device(device) == OTHER


def _from_data(factory):
    """``torch.tensor`` / ``torch.as_tensor`` with ``device=OTHER``: they copy
    the data to the device below the dispatcher's Python layer (the mode would
    see a meta tensor without data), so they are wrapped while the mode is on."""

    def make(data, *args, device=None, **kwargs):
        if _is_other(device):
            with _not_in_mode():
                return Elsewhere(factory(data, *args, device="cpu", **kwargs))
        return factory(data, *args, device=device, **kwargs)

    return make


class _not_in_mode:
    def __enter__(self):
        from torch.utils._python_dispatch import _pop_mode_temporarily

        self._ctx = _pop_mode_temporarily()
        self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


class OtherDeviceMode(TorchDispatchMode):
    """See the module docstring."""

    def __enter__(self):
        self._saved = {name: getattr(torch, name) for name in ("tensor", "as_tensor")}
        for name, factory in self._saved.items():
            setattr(torch, name, _from_data(factory))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for name, factory in self._saved.items():
                setattr(torch, name, factory)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        to_other = _is_other(kwargs.get("device"))
        if to_other:
            kwargs["device"] = torch.device("cpu")
        seen = {"other": False, "plain": []}

        def unwrap(x):
            if isinstance(x, Elsewhere):
                seen["other"] = True
                return x.elem
            if isinstance(x, torch.Tensor) and x.dim() > 0:
                seen["plain"].append(x)
            return x

        a, k = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        if (func is aten._to_copy.default and seen["other"] and not to_other
                and kwargs.get("device") is not None
                and torch.device(kwargs["device"]).type == "cpu"):
            return func(*a, **k)  # back to the CPU
        if seen["other"] and seen["plain"]:
            if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                        aten._index_put_impl_.default) and isinstance(args[0], Elsewhere):
                pass  # a device tensor indexed by CPU indices: allowed on CUDA
            else:
                raise RuntimeError(f"{func}: expected all tensors to be on the same device, but "
                                   f"found at least two devices, {OTHER} and cpu (a CPU tensor of "
                                   f"shape {tuple(seen['plain'][0].shape)})")
        out = func(*a, **k)
        if func is aten._local_scalar_dense.default:
            return out
        if seen["other"] or to_other:
            return tree_map(lambda x: Elsewhere(x) if isinstance(x, torch.Tensor) else x, out)
        return out


def to_other(sample):
    """Every tensor of ``sample`` on ``OTHER`` (as ``fairseq.utils.move_to_cuda``)."""
    return tree_map(lambda x: Elsewhere(x.clone()) if isinstance(x, torch.Tensor) else x, sample)


def _tensors(x, path="sample"):
    if isinstance(x, torch.Tensor):
        yield path, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _tensors(v, f"{path}[{k!r}]")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _tensors(v, f"{path}[{i}]")


def not_on_other(*named):
    """The paths of the tensors of ``named`` (``(name, value)`` pairs) that are
    not on ``OTHER``."""
    return [p for name, value in named for p, t in _tensors(value, name)
            if not isinstance(t, Elsewhere)]


def checked_generator(generator, calls=None):
    """``generator`` with its ``generate`` checking devices (module docstring);
    ``calls`` (a list), when given, receives the ids of every call."""
    real = generator.generate

    def generate(models, sample, prefix_tokens=None, constraints=None, **kw):
        wrong = not_on_other(("sample", sample), ("prefix_tokens", prefix_tokens),
                             ("constraints", constraints))
        assert not wrong, f"tensors on the CPU reach the generator: {wrong}"
        if calls is not None:
            calls.append(sample["id"].tolist())
        return real(models, sample, prefix_tokens=prefix_tokens, constraints=constraints, **kw)

    generator.generate = generate
    return generator
