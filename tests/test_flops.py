"""FLOPs of fused attention (ctx_fairseq.flops, used by ctx-bench) equal those
of the same attention done with explicit matrix products, on the CPU and for
the CUDA kernels (run on meta tensors), and include the Q K^T and A V
products (quadratic in the sequence length)."""

import collections

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from ctx_fairseq.cli import bench
from ctx_fairseq.flops import FlopCounter, attention_flops

CPU_FUSED = "aten._scaled_dot_product_flash_attention_for_cpu"


class OpNames(TorchDispatchMode):
    """Records the aten ops that run (under any other mode entered later)."""

    def __init__(self):
        super().__init__()
        self.names = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count(fn):
    """FLOPs of fn() plus its backward, the ops that ran, the uncounted ops."""
    with OpNames() as ops, FlopCounter() as counter:
        fn().sum().backward()
    return counter.total, ops.names, counter.uncounted


def explicit_attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5 + mask
    return torch.softmax(scores, dim=-1) @ v


def test_cpu_fused_sdpa_counts_like_explicit_matmuls():
    torch.manual_seed(0)
    b, h, s_q, s_k, d = 2, 3, 7, 9, 8
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for s in (s_q, s_k, s_k))
    mask = torch.triu(torch.full((s_q, s_k), float("-inf")), diagonal=3)
    fused, fused_ops, uncounted = count(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert fused_ops[CPU_FUSED] == 1 and fused_ops[CPU_FUSED + "_backward"] == 1
    assert not uncounted
    explicit, explicit_ops, _ = count(lambda: explicit_attention(q, k, v, mask))
    assert CPU_FUSED not in explicit_ops
    # forward Q K^T and A V, backward two products for each
    assert fused == explicit == 3 * 2 * b * h * s_q * s_k * (d + d)


def multihead_attention_flops(seq_len, explicit):
    from fairseq.modules import MultiheadAttention

    torch.manual_seed(0)
    embed, heads, bsz = 16, 2, 3
    mha = MultiheadAttention(embed, heads, self_attention=True).train()
    # fairseq's own explicit path (projections, bmm, softmax, bmm) instead of
    # F.multi_head_attention_forward's fused scaled_dot_product_attention
    mha.skip_embed_dim_check = explicit
    x = torch.randn(seq_len, bsz, embed, requires_grad=True)
    pad = torch.zeros(bsz, seq_len, dtype=torch.bool)
    flops, ops, uncounted = count(lambda: mha(x, x, x, key_padding_mask=pad, need_weights=False)[0])
    assert (ops[CPU_FUSED] > 0) != explicit and not uncounted
    return flops, bsz, embed


@pytest.mark.parametrize("seq_len", [5, 10])
def test_fairseq_multihead_attention_fused_equals_explicit(seq_len):
    fused, bsz, embed = multihead_attention_flops(seq_len, explicit=False)
    explicit, _, _ = multihead_attention_flops(seq_len, explicit=True)
    assert fused == explicit
    # forward: four d x d projections and Q K^T, A V (heads x head_dim = d);
    # backward twice the forward (input and weight gradients)
    projections = 4 * 2 * bsz * seq_len * embed * embed
    attention = 2 * 2 * bsz * seq_len * seq_len * embed
    assert fused == 3 * (projections + attention)


def test_multihead_attention_flops_grow_quadratically():
    n = 8
    one, bsz, embed = multihead_attention_flops(n, explicit=False)
    two, _, _ = multihead_attention_flops(2 * n, explicit=False)
    # the linear part doubles; what is left is the quadratic attention term:
    # 3 * 4 * b * d * ((2n)^2 - 2 n^2)
    assert two - 2 * one == 3 * 4 * bsz * embed * (4 * n * n - 2 * n * n) > 0


@pytest.mark.parametrize("op", [
    lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[0],
    lambda q, k, v: torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)[0],
    lambda q, k, v: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True)[0],
], ids=["flash", "efficient", "cudnn"])
def test_cuda_fused_attention_counts_like_explicit_matmuls(op):
    """The CUDA kernels' shapes and autograd formulas run on meta tensors;
    their backward counts the four products of the explicit backward, not the
    kernels' recomputation of the scores."""
    b, h, s_q, s_k, d = 2, 4, 8, 11, 16
    q, k, v = (torch.empty(b, h, s, d, device="meta", requires_grad=True) for s in (s_q, s_k, s_k))
    fused, _, uncounted = count(lambda: op(q, k, v))
    mask = torch.zeros(s_q, s_k, device="meta")
    explicit, _, _ = count(lambda: explicit_attention(q, k, v, mask))
    assert not uncounted
    assert fused == explicit == 3 * attention_flops(q.shape, k.shape, v.shape)


def test_attention_ops_without_formula_are_reported():
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(3, 7, 16)
    with torch.no_grad(), FlopCounter() as counter:
        mha(x, x, x, need_weights=False)  # torch's native fast path
    assert counter.uncounted == {"aten._native_multi_head_attention"}


TINY = ["--layers", "2", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32", "--vocab", "64",
        "--src-len", "6", "--tgt-len", "5", "--max-tokens", "40", "--infer-sentences", "3",
        "--beam", "2"]


@pytest.mark.parametrize("arch", ["transformer", "transformer_hybrid"])
def test_bench_counts_fused_attention_like_the_math_backend(arch):
    """ctx-bench's training-step and beam-search FLOPs of a whole model with
    fused attention (fairseq's fast path) equal those with torch's explicit
    (math) attention backend."""
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    b = bench.Bench(bench.get_parser().parse_args(TINY))
    torch.manual_seed(1)
    model, task, margs = b.build(arch, [])
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    entry = {"model": model, "task": task, "crit": crit, "sample": b.sample(model, task, margs, 1)}
    with OpNames() as ops:
        fused_train = b.count_flops(entry)
        fused_infer = b.infer(entry, count_flops=True)
    assert ops.names[CPU_FUSED] > 0 and ops.names[CPU_FUSED + "_backward"] > 0
    with OpNames() as ops, sdpa_kernel(SDPBackend.MATH):
        math_train = b.count_flops(entry)
        math_infer = b.infer(entry, count_flops=True)
    assert CPU_FUSED not in ops.names
    assert fused_train == math_train > 0
    assert fused_infer == math_infer > 0
    assert entry["uncounted_ops"] == set()
