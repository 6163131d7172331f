"""The selective attention in other precisions and against its past: half
precision and autocast against float32, and equality with the previous exact
implementation (read from git)."""


import pytest
import torch

from ctx_fairseq.modules.selective_attention import (
    DocumentContextLayer,
    HierarchicalContextAttention,
)
from ctx_fairseq.modules.sparsemax import masked_normalize
from ctx_fairseq.modules.selective_memory import memory_layout
from selective_attention_utils import (
    EVERY_MODE,
    ONLINE_AND_OFFLINE,
    Mem,
    make_memory,
    make_queries,
    C,
    H,
)


# ------------------------------------------------------------ half precision
@EVERY_MODE
def test_half_precision_matches_float32_on_a_long_document(mode):
    """``model.half()`` (what ``--fp16`` does) on a 120-sentence document with
    sentences without words and queries without context (first sentence, a
    one-sentence document, a document absent from the memory): the layer's
    output and input gradient match float32 within 1e-2 (outputs of scale ~3,
    float16 has 11 bits), are finite, and the rows without context are
    exactly ``r``. bfloat16 (CPU autocast's type, 8 bits): outputs within 5e-2
    (the rounded scores may move a sentence in or out of the sparsemax support,
    so its gradients are not compared)."""
    att, sa, wa = mode
    torch.manual_seed(0)
    layer = DocumentContextLayer(C, H, 16, attention=att, sentence_attn=sa, word_attn=wa)
    mem = make_memory([120, 1, 3], L=9, seed=5, empty=[3, 50, 121])
    spec = [(0, 119), (0, 0), (0, 60), (1, 0), (2, 2), (7, 1)]
    q, qd, qp = make_queries(spec, T=5, seed=6, scale=1.0)
    no_ctx = torch.tensor([False, True, False, True, False, True])
    results = {}
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        layer.to(dt)
        qq = q.to(dt).requires_grad_()
        pm = layer.project_memory(mem.keys.to(dt), mem.values.to(dt), mem.mask, mem.doc, mem.pos)
        out, info = layer(qq, pm, qd, qp, True)
        assert out.dtype == dt and torch.equal(info["has_context"], ~no_ctx)
        assert torch.equal(out[:, no_ctx], qq[:, no_ctx])  # r~ = r exactly
        out.float().sin().sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(qq.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)
        results[dt] = (out.float(), qq.grad.float())
        layer.zero_grad()
    ref_out, ref_grad = results[torch.float32]
    assert ref_out.abs().max() > 1.0
    half_out, half_grad = results[torch.float16]
    assert (half_out - ref_out).abs().max() < 1e-2
    assert (half_grad - ref_grad).abs().max() < 1e-2 * max(1.0, float(ref_grad.abs().max()))
    assert (results[torch.bfloat16][0] - ref_out).abs().max() < 5e-2


def test_masked_normalize_half_precision_fills_are_safe():
    """Float16 scores near the dtype's limits with masked entries and a fully
    masked row: no inf/NaN, exact zeros where masked, sums of 1 elsewhere."""
    scores = torch.tensor([[6e4, -6e4, 3.0, 1.0], [1.0, 2.0, 3.0, 4.0]], dtype=torch.float16)
    mask = torch.tensor([[True, False, True, False], [False, False, False, False]])
    for kind in ("sparsemax", "softmax"):
        x = scores.clone().requires_grad_()
        p = masked_normalize(x, mask, kind)
        assert p.dtype == torch.float16 and torch.isfinite(p).all()
        assert p[0, 1] == 0 and p[0, 3] == 0 and p[1].eq(0).all()
        assert float(p[0].float().sum()) == pytest.approx(1.0, abs=1e-3)
        p.float().pow(2).sum().backward()
        assert torch.isfinite(x.grad).all() and x.grad[1].eq(0).all()


def by_length_from_mask(mem: Mem):
    """``by_length`` for :meth:`project_memory` (the collater's
    ``memory_by_length``, here from the word mask): each document's
    sentences by number of words, longest first, and the columns from their
    first to their last word."""
    import numpy as np

    from ctx_fairseq.modules.selective_memory import memory_layout

    _, rows, valid = memory_layout(mem.doc, mem.pos)
    rows, valid = rows.numpy(), valid.numpy()
    mask = mem.mask.numpy()
    L = mask.shape[1]
    n = mask.sum(1)
    first = np.where(n > 0, mask.argmax(1), L)
    last = np.where(n > 0, L - mask[:, ::-1].argmax(1), 0)
    lens = np.where(valid, n[rows], -1)
    order = np.argsort(-lens, axis=1, kind="stable")
    by = np.take_along_axis(rows, order, 1)
    ok = np.take_along_axis(valid, order, 1)
    span = np.stack([np.where(ok, first[by], L), np.where(ok, last[by], 0)], -1)
    return torch.from_numpy(by), torch.from_numpy(order), span


# ------------------------------------------------- the previous exact version
#: the last commit with the gathered word level (per query sentence, or per
#: token over the whole document: exact, but forming B x H x T x S x L tensors)
PREVIOUS = "32a8736"


def _previous_module():
    import os
    import subprocess
    import types

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        src = subprocess.run(
            ["git", "show", f"{PREVIOUS}:ctx_fairseq/modules/selective_attention.py"],
            cwd=root, capture_output=True, check=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"the previous implementation ({PREVIOUS}) is not in this checkout's git")
    mod = types.ModuleType("previous_selective_attention")
    exec(compile(src, f"{PREVIOUS}:selective_attention.py", "exec"), mod.__dict__)
    return mod


@pytest.mark.parametrize("seed", range(2))
@ONLINE_AND_OFFLINE
@pytest.mark.parametrize("layout", ["sentence", "document", "document-tiny", "by-length",
                                    "by-length-tiny"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@EVERY_MODE
def test_equals_the_previous_implementation(mode, dtype, layout, online, seed):
    """Random batches (sentences without words, one-sentence documents, a
    document absent from the memory, queries without context, i.e. fully
    masked rows, a distance bias): outputs, input and parameter gradients and
    the statistics equal the previous exact implementation (float64: 1e-10;
    float32: 1e-6), per query sentence and per document, with the default
    blocks and with one-sentence blocks and one-row tiles."""
    old = _previous_module()
    att, sa, wa = mode
    torch.manual_seed(seed)
    kw = dict(word_block=1, tile_elems=1) if layout.endswith("tiny") else {}
    if layout == "by-length":
        kw = dict(word_block=2, tile_elems=40)
    m_old = old.HierarchicalContextAttention(C, H, att, sa, wa, sentence_distance=2).to(dtype)
    m_new = HierarchicalContextAttention(C, H, att, sa, wa, sentence_distance=2, **kw).to(dtype)
    with torch.no_grad():
        m_old.distance_bias.normal_()
    m_new.load_state_dict(m_old.state_dict())
    mem = make_memory([5, 1, 7, 3], L=7, seed=seed, empty=[2, 6, 12])
    g = torch.Generator().manual_seed(seed)
    sizes = {0: 5, 1: 1, 2: 7, 3: 3, 9: 2}
    spec = [(d, int(torch.randint(0, sizes[d], (1,), generator=g)))
            for d in (2, 0, 1, 3, 2, 0, 9, 2)]
    q, qd, qp = make_queries(spec, T=3, seed=seed, scale=1.0)
    res = []
    m_exact = old.HierarchicalContextAttention(C, H, att, sa, wa, sentence_distance=2).double()
    m_exact.load_state_dict(m_old.state_dict())
    for m in (m_old, m_new, m_exact):
        dt = torch.float64 if m is m_exact else dtype
        qq = q.to(dt).clone().requires_grad_()
        k = mem.keys.to(dt).clone().requires_grad_()
        v = mem.values.to(dt).clone().requires_grad_()
        if m is m_new and layout.startswith("by-length"):
            pm = m.project_memory(k, v, mem.mask, mem.doc, mem.pos, *memory_layout(
                mem.doc, mem.pos)[1:], by_length=by_length_from_mask(mem))
        else:
            pm = m.project_memory(k, v, mem.mask, mem.doc, mem.pos)
        extra = {}
        if m is m_new and layout != "sentence":
            extra["query_groups"] = m.group_queries(pm, qd)
        out, info = m(qq, pm, qd, qp, online, need_weights=True, return_stats=True, **extra)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=dt)
        (out * w).sum().backward()
        res.append((out, info, [qq.grad, k.grad, v.grad] + [p.grad for p in m.parameters()]))
    (o1, i1, g1), (o2, i2, g2), (o3, _, g3) = res
    tol = 1e-10 if dtype == torch.float64 else 1e-6

    def close(new, ref, exact):
        """``|new - ref| <= tol`` (relative to the tensor's scale above 1), or
        in float32 no further from the float64 result than the previous
        implementation's own rounding (twice it)."""
        assert torch.isfinite(new).all()
        if not new.numel():
            return
        err = float((new - ref).abs().max())
        bound = tol * max(1.0, float(ref.abs().max()))
        if dtype == torch.float32:
            bound = max(bound, 2 * float((ref.double() - exact).abs().max()))
        assert err <= bound, (err, bound)

    assert not i2["has_context"].all() and i2["has_context"].any()
    assert torch.equal(i1["has_context"], i2["has_context"])
    close(o2, o1, o3)
    for a, b, c in zip(g1, g2, g3):
        close(b, a, c)
    # counts of supports: exact in float64; in float32 an entry within
    # round-off of a sparsemax threshold may fall on the other side in one
    # implementation (each such entry moves a count by 1)
    slack = 1e-9 if dtype == torch.float64 else 2.0
    for key in ("sentence_support_sum", "visible_sentences_sum", "word_support_sum",
                "num_token_heads", "num_support_pairs", "word_overflow_sum"):
        if key in i1:
            torch.testing.assert_close(i2[key], i1[key], rtol=0, atol=slack)
    s = min(i1["sent_weights"].size(-1), i2["sent_weights"].size(-1))
    assert i2["sent_weights"].dtype == torch.promote_types(dtype, torch.float32)
    torch.testing.assert_close(i2["sent_weights"][..., :s], i1["sent_weights"][..., :s].to(
        i2["sent_weights"].dtype), rtol=0, atol=tol)


@EVERY_MODE
def test_autocast_matches_float32(mode):
    """``torch.autocast`` (bfloat16 on the CPU; ``--amp``): forward and backward
    run (the gathered word-level kernels compute both passes in the autocast
    dtype), outputs within 5e-2 of float32 (scale ~3), the input gradient
    within 10% relative L2 norm (bfloat16 has 8 bits), all finite."""
    att, sa, wa = mode
    torch.manual_seed(0)
    layer = DocumentContextLayer(C, H, 16, attention=att, sentence_attn=sa, word_attn=wa)
    mem = make_memory([40, 1, 3], L=9, seed=7, empty=[3, 41])
    q, qd, qp = make_queries([(0, 39), (0, 0), (0, 20), (1, 0), (2, 2)], T=4, seed=8, scale=1.0)
    q, keys, values = q.float(), mem.keys.float(), mem.values.float()
    res = []
    for amp in (False, True):
        qq = q.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            pm = layer.project_memory(keys, values, mem.mask, mem.doc, mem.pos)
            out, _ = layer(qq, pm, qd, qp, True)
        out.float().sin().sum().backward()
        assert torch.isfinite(qq.grad).all()
        res.append((out.float(), qq.grad))
        layer.zero_grad()
    (o32, g32), (o16, g16) = res
    assert (o16 - o32).abs().max() < 5e-2
    assert (g16 - g32).norm() / g32.norm() < 0.1
