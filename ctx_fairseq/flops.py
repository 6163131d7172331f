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


# --------------------------------------------------------------------------- the L^2 terms


def attention_step_flops(model, sample, backward: bool = True) -> int:
    """The FLOPs of the attention score and mixing products (``Q K^T`` and
    ``A V``) of one training step of an encoder-decoder ``model`` on
    ``sample``: the terms that grow with the square of the length, which a
    segment of ``L`` tokens pays ``L`` times per token where a sentence pays
    its own length. Counted analytically from the padded batch, as the dense
    kernels compute them (a group or causal mask saves nothing):
    ``4 B S_q S_k E`` forward per attention module (``E`` its query/key
    width summed over the heads), twice that backward (:func:`attention_backward_flops`).
    Every ``MultiheadAttention`` under ``model.encoder`` is a self-attention
    over the source (``S x S``); under ``model.decoder``, one named
    ``encoder_attn`` (and the global attention inside it) reads the source
    (``T x S``), the others are self-attentions (``T x T``). A gated group
    attention counts twice: its group attention and its ``global_attn``.
    ``FlopCounter`` counts the same products (with the model's linear terms);
    ``tests/test_bench_doc2doc.py`` checks that the two agree."""
    from fairseq.modules import MultiheadAttention

    ni = sample["net_input"]
    b, s = ni["src_tokens"].shape
    t = ni["prev_output_tokens"].size(1)
    total = 0
    for part in ("encoder", "decoder"):
        for name, m in getattr(model, part).named_modules():
            if not isinstance(m, MultiheadAttention):
                continue
            if part == "encoder":
                q, k = s, s
            else:
                q, k = (t, s) if ".encoder_attn" in f".{name}" else (t, t)
            total += 4 * b * q * k * m.embed_dim
    return total * (3 if backward else 1)


# --------------------------------------------------------------------------- hardware peaks

#: Dense (no structured sparsity) peak throughput in TFLOP/s of NVIDIA data-centre
#: cards by precision, from NVIDIA's datasheets: ``fp32`` the CUDA cores' FP32,
#: ``tf32`` / ``bf16`` / ``fp16`` the tensor cores' (FP32 accumulation). The
#: datasheets give the tensor-core figures "with sparsity"; the dense peak is half
#: of that. ``None``: the card has no such tensor-core mode (V100, T4: no TF32 or
#: BF16). Matched against ``torch.cuda.get_device_name()`` in order, first match
#: wins (so the PCIe and NVL variants come before the SXM default).
PEAK_TFLOPS = [
    # (name pattern, {precision: dense TFLOP/s})
    (r"H200.*NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),       # SXM
    (r"H100.*NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H100.*PCI", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5}),
    (r"H100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),       # SXM (HBM3)
    (r"A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),       # 40/80 GB
    (r"A30\b", {"fp32": 10.3, "tf32": 82.0, "bf16": 165.0, "fp16": 165.0}),
    (r"A10\b", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    (r"L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0}),
    (r"L4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (r"V100S", {"fp32": 16.4, "tf32": None, "bf16": None, "fp16": 130.0}),
    (r"V100.*PCI", {"fp32": 14.0, "tf32": None, "bf16": None, "fp16": 112.0}),
    (r"V100", {"fp32": 15.7, "tf32": None, "bf16": None, "fp16": 125.0}),         # SXM2
    (r"\bT4\b", {"fp32": 8.1, "tf32": None, "bf16": None, "fp16": 65.0}),
]
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def device_peak_tflops(device_name: str, precision: str):
    """``(peak TFLOP/s, matched pattern)`` of ``device_name`` (as
    ``torch.cuda.get_device_name`` gives it) in ``precision``; ``(None, None)``
    for a card not in :data:`PEAK_TFLOPS`, ``(None, pattern)`` for a known card
    without that precision."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name or ""):
            return peaks.get(precision), pattern
    return None, None


def matmul_precision(fp16: bool, bf16: bool = False) -> str:
    """The precision a CUDA run's matrix products use: ``fp16`` / ``bf16``
    under autocast, else ``tf32`` where torch lets float32 matrix products use
    TF32 (``torch.backends.cuda.matmul.allow_tf32`` or a float32 matmul
    precision below "highest"; off by default, as fairseq-train leaves it),
    else ``fp32``."""
    if fp16:
        return "fp16"
    if bf16:
        return "bf16"
    tf32 = (torch.backends.cuda.matmul.allow_tf32
            or torch.get_float32_matmul_precision() != "highest")
    return "tf32" if tf32 else "fp32"


def mfu(flops: float, seconds: float, peak_tflops) -> Dict[str, float]:
    """Achieved TFLOP/s of ``flops`` done in ``seconds`` and its fraction of
    ``peak_tflops`` (``mfu`` None where no peak is known)."""
    achieved = flops / seconds / 1e12
    return {"tflops": achieved, "mfu": achieved / peak_tflops if peak_tflops else None}
