"""FLOPs counting that treats fused and explicit attention alike.

``torch.utils.flop_counter.FlopCounterMode`` counts matrix products
(``mm``, ``addmm``, ``bmm``, ...) and has formulas for the CUDA fused attention
kernels, but none for the CPU one: on the CPU, ``F.scaled_dot_product_attention``
(which fairseq's ``MultiheadAttention`` reaches through
``F.multi_head_attention_forward`` when it needs no attention weights)
dispatches ``aten._scaled_dot_product_flash_attention_for_cpu`` forward and
``aten._scaled_dot_product_flash_attention_for_cpu_backward`` backward, and
their ``Q K^T`` and ``A V`` products counted zero, while the same attention
done with explicit ``bmm`` (fairseq's incremental and encoder-decoder path,
or a plugin module) was counted.

:data:`ATTENTION_FLOP_FORMULAS` counts every fused scaled-dot-product
attention op as the explicit computation it replaces:

* forward: ``Q K^T`` and ``A V``, i.e. ``2 b h s_q s_k (d_qk + d_v)``;
* backward: the four products of the two ``bmm`` backwards
  (``dA = dO V^T``, ``dV = A^T dO``, ``dQ = dS K``, ``dK = dS^T Q``), twice the
  forward. torch's own formula for the CUDA kernels adds a fifth product for
  the kernels' recomputation of the scores; that is an implementation cost
  the explicit path does not have, so it is not counted here, and a model
  costs the same FLOPs on the CPU and on CUDA, fused or not.

Softmax, masking, scaling and dropout are not counted, for fused and explicit
attention alike (``FlopCounterMode`` counts no element-wise ops).
"""

import re
from typing import Callable, Dict, Set

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


def attention_flops(query_shape, key_shape, value_shape) -> int:
    """FLOPs of ``softmax(Q K^T) V`` for ``(b, h, s, d)`` shaped Q, K and V.

    Key and value may have fewer heads than the query (grouped-query
    attention); they are broadcast to the query's heads, as an explicit
    computation would.
    """
    b, h, s_q, d_qk = query_shape
    b_k, h_kv, s_k, d_k = key_shape
    b_v, h_v, s_v, d_v = value_shape
    if not (b == b_k == b_v and h_kv == h_v and d_qk == d_k and s_k == s_v and h % h_kv == 0):
        raise ValueError(f"attention_flops: incompatible shapes q={tuple(query_shape)}, "
                         f"k={tuple(key_shape)}, v={tuple(value_shape)}")
    scores = 2 * b * h * s_q * s_k * d_qk  # Q K^T
    mix = 2 * b * h * s_q * s_k * d_v      # A V
    return scores + mix


def attention_backward_flops(query_shape, key_shape, value_shape) -> int:
    """FLOPs of the gradients of Q, K and V: two products per forward product."""
    return 2 * attention_flops(query_shape, key_shape, value_shape)


def _forward_formula(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return attention_flops(query_shape, key_shape, value_shape)


def _backward_formula(grad_out_shape, query_shape, key_shape, value_shape, *args,
                      out_shape=None, **kwargs) -> int:
    return attention_backward_flops(query_shape, key_shape, value_shape)


def _ops(names):
    return [getattr(aten, n) for n in names if hasattr(aten, n)]


# Every op below takes (query, key, value, ...) forward and
# (grad_out, query, key, value, ...) backward, in the (b, h, s, d) layout.
_FORWARD_OPS = _ops([
    "_scaled_dot_product_flash_attention_for_cpu",      # CPU
    "_scaled_dot_product_flash_attention",              # CUDA
    "_scaled_dot_product_efficient_attention",          # CUDA
    "_scaled_dot_product_cudnn_attention",              # CUDA
    "_scaled_dot_product_fused_attention_overrideable",  # other backends (XPU, ...)
])
_BACKWARD_OPS = _ops([
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable_backward",
])

#: ``custom_mapping`` for ``FlopCounterMode``: fused attention ops -> formula.
ATTENTION_FLOP_FORMULAS: Dict[object, Callable] = {
    **{op: _forward_formula for op in _FORWARD_OPS},
    **{op: _backward_formula for op in _BACKWARD_OPS},
}

# Fused ops that do attention arithmetic: any op of this name that runs
# without a formula is reported by FlopCounter.uncounted.
_ATTENTION_OP = re.compile(r"attention|_transformer_encoder_layer_fwd")


class _UncountedOps(TorchDispatchMode):
    def __init__(self, registry, found: Set[str]):
        super().__init__()
        self.registry, self.found = registry, found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        if packet not in self.registry and _ATTENTION_OP.search(str(packet)):
            self.found.add(str(packet))
        return func(*args, **(kwargs or {}))


class FlopCounter:
    """``FlopCounterMode`` with :data:`ATTENTION_FLOP_FORMULAS`, as a context
    manager: ``total`` is the FLOPs counted, ``uncounted`` the names of
    attention ops that ran with no formula (counted as zero)."""

    def __init__(self):
        self.mode = FlopCounterMode(display=False, custom_mapping=ATTENTION_FLOP_FORMULAS)
        self.uncounted: Set[str] = set()
        self._watch = None

    def __enter__(self):
        self.mode.__enter__()
        self._watch = _UncountedOps(self.mode.flop_registry, self.uncounted)
        self._watch.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self._watch.__exit__(*exc)
        finally:
            self._watch = None
            self.mode.__exit__(*exc)
        return False

    @property
    def total(self) -> int:
        return self.mode.get_total_flops()


def counted_op_names() -> Set[str]:
    """Profiler names (``aten::mm``, ...) of the ops :class:`FlopCounter` counts."""
    registry = FlopCounterMode(display=False, custom_mapping=ATTENTION_FLOP_FORMULAS).flop_registry
    return {"aten::" + str(op).split(".", 1)[1] for op in registry
            if isinstance(op, torch._ops.OpOverloadPacket) and str(op).startswith("aten.")}
