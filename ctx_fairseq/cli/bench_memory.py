"""ctx-bench's memory figures: the resident bytes of a model and its
optimizer, and the peak of a training step above what was allocated when it
began (CUDA: the caching allocator's counters; CPU: the profiler's memory
timeline). See :mod:`ctx_fairseq.cli.bench`."""

import torch

__all__ = ["resident_bytes", "cpu_step_peak_bytes", "CudaMemoryStats", "step_peak_bytes"]


def _torch_optimizer(opt):
    """The ``torch.optim.Optimizer`` inside fairseq's optimizer wrappers
    (``FP16Optimizer.fp32_optimizer``, ``FairseqOptimizer.optimizer``)."""
    seen = 0
    while not isinstance(opt, torch.optim.Optimizer) and seen < 5:
        opt = getattr(opt, "fp32_optimizer", None) or getattr(opt, "wrapped_optimizer", None) \
            or opt.optimizer
        seen += 1
    return opt


def resident_bytes(model, opt) -> int:
    """Bytes of ``model``'s parameters, their gradients and ``opt``'s state
    (with fairseq's ``--fp16``: its fp32 master weights and their gradients too)."""
    def size(ts):
        return sum(t.numel() * t.element_size() for t in ts if torch.is_tensor(t))

    params = list(model.parameters())
    total = size(params) + size(p.grad for p in params)
    masters = getattr(opt, "fp32_params", None)
    if masters is not None:
        masters = list(masters.values()) if isinstance(masters, dict) else \
            (list(masters) if isinstance(masters, (list, tuple)) else [masters])
        total += size(masters) + size(p.grad for p in masters)
    for state in _torch_optimizer(opt).state.values():
        total += size(state.values())
    return total


def cpu_step_peak_bytes(prof) -> int:
    """The peak of the CPU memory allocated during a profiled step above what
    was allocated when it began, from the profiler's memory timeline: every
    allocation and free at its own time. (Summing each event's *self* memory
    in the order the events start, as this did, counts the frees inside a
    custom autograd function, such as the streamed word level's tiles, at the
    function's start: its tiles never showed in the peak.)"""
    from torch.profiler._memory_profiler import Action

    cur = peak = 0
    # sorted by time, an allocation before a free at the same time (an upper bound)
    for _, action, (key, _), size in prof._memory_profile().timeline:
        if key.device.type != "cpu":
            continue
        if action == Action.CREATE:
            cur += size
            peak = max(peak, cur)
        elif action == Action.DESTROY:
            cur -= size
    return peak


class CudaMemoryStats:
    """The CUDA caching allocator's counters (``step_peak_bytes`` reads them
    through this interface, so the arithmetic is tested on the CPU with a
    fake)."""

    def __init__(self, device):
        self.device = device

    def synchronize(self):
        torch.cuda.synchronize(self.device)

    def reset_peak(self):
        torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def max_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)


def step_peak_bytes(step, stats) -> int:
    """The peak of the memory allocated while ``step()`` runs, above what was
    allocated when it began: what other models (and this one's resident
    tensors) hold before the step is subtracted, so the figure is the step's
    own whatever else is alive on the device."""
    stats.synchronize()
    stats.reset_peak()
    start = stats.allocated()
    step()
    stats.synchronize()
    return stats.max_allocated() - start
