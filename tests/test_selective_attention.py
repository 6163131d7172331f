"""Selective attention document-context layer (Maruf et al. 2019, Eq. 3-8):
exact masking, a naive per-query reference, visibility, empty context,
selective == dense and per-sentence == per-document (values and gradients),
per-document cost, padding invariance, sentence keys, gate bypass,
incremental steps and beam reorder, equality with the previous exact
implementation (read from git)."""

import math
from dataclasses import dataclass, replace
from typing import List, Sequence, Tuple

import pytest
import torch
from entmax import sparsemax
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ctx_fairseq.modules.selective_attention import (
    ContextGating,
    DocumentContextLayer,
    HierarchicalContextAttention,
)
from ctx_fairseq.modules.sparsemax import masked_normalize
from ctx_fairseq.modules.selective_memory import memory_layout

DT = torch.float64
C, H = 8, 2

MODES = [  # (attention, sentence_attn, word_attn)
    ("hierarchical", "sparsemax", "softmax"),   # sparse-soft
    ("hierarchical", "sparsemax", "sparsemax"),  # sparse-sparse
    ("hierarchical", "softmax", "softmax"),     # ablation
    ("flat-sentence", "softmax", "softmax"),
    ("flat-word", "softmax", "softmax"),
]
MODE_IDS = ["sparse-soft", "sparse-sparse", "soft-soft", "flat-sentence", "flat-word"]


@dataclass
class Mem:
    keys: torch.Tensor    # S x L x C
    values: torch.Tensor  # S x L x C
    mask: torch.Tensor    # S x L
    doc: torch.Tensor
    pos: torch.Tensor

    def args(self):
        return self.keys, self.values, self.mask, self.doc, self.pos


def make_memory(doc_sizes: Sequence[int], doc_ids: Sequence[int] = None, L: int = 7,
                seed: int = 0, max_words: int = None, empty: Sequence[int] = ()) -> Mem:
    """Column 0 = BOS, then ``n`` real words, then EOS, then padding (all with
    random vectors; only the real words are in the mask). ``empty``: global rows
    with no real word."""
    g = torch.Generator().manual_seed(seed)
    doc_ids = list(doc_ids) if doc_ids is not None else list(range(len(doc_sizes)))
    S = sum(doc_sizes)
    keys = torch.randn(S, L, C, generator=g, dtype=DT)
    values = torch.randn(S, L, C, generator=g, dtype=DT)
    mask = torch.zeros(S, L, dtype=torch.bool)
    hi = min(max_words or L - 2, L - 2)
    for s in range(S):
        if s not in empty:
            n = int(torch.randint(1, hi + 1, (1,), generator=g))
            mask[s, 1:1 + n] = True
    doc = torch.tensor([d for d, n in zip(doc_ids, doc_sizes) for _ in range(n)])
    pos = torch.cat([torch.arange(n) for n in doc_sizes]) if S else torch.zeros(0, dtype=torch.long)
    return Mem(keys, values, mask, doc, pos)


def make_queries(spec: Sequence[Tuple[int, int]], T: int = 3, seed: int = 1, scale: float = 4.0):
    g = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(T, len(spec), C, generator=g, dtype=DT)
    qd = torch.tensor([d for d, _ in spec])
    qp = torch.tensor([p for _, p in spec])
    return q, qd, qp


def build(attention="hierarchical", sentence_attn="sparsemax", word_attn="softmax",
          selective=True, seed=0, **kw) -> HierarchicalContextAttention:
    torch.manual_seed(seed)
    m = HierarchicalContextAttention(C, H, attention=attention, sentence_attn=sentence_attn,
                                     word_attn=word_attn, selective=selective, **kw)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:  # nonzero biases so that bias handling is visible
                p.add_(0.3 * torch.randn_like(p))
    return m.double()


def run(m, mem: Mem, q, qd, qp, online, **kw):
    pm = m.project_memory(*mem.args())
    return m(q, pm, qd, qp, online, **kw)


def visible(mem: Mem, doc: int, pos: int, online: bool, window: int = None) -> List[int]:
    return [s for s in range(mem.keys.size(0))
            if int(mem.doc[s]) == doc and bool(mem.mask[s].any())
            and (int(mem.pos[s]) < pos if online else int(mem.pos[s]) != pos)
            and (window is None or abs(pos - int(mem.pos[s])) <= window)]


def reference(m: HierarchicalContextAttention, mem: Mem, q, qd, qp, online, windows=None):
    """Eq. 3-6 written per (query sentence, token, head) over the visible
    sentences only (no masking tricks)."""
    def lin(layer, x):
        return x @ layer.weight.T + layer.bias

    def norm(kind, x):
        return sparsemax(x, dim=-1) if kind == "sparsemax" else torch.softmax(x, dim=-1)

    T, B, _ = q.shape
    d = m.head_dim
    n_dist = getattr(m, "sentence_distance", 0)
    out = torch.zeros(T, B, C, dtype=DT)
    for b in range(B):
        vis = visible(mem, int(qd[b]), int(qp[b]), online,
                      None if windows is None else int(windows[b]))
        if not vis:
            continue
        words = [mem.mask[j].nonzero().squeeze(1) for j in vis]
        for t in range(T):
            x = q[t, b]
            heads = []
            for h in range(H):
                sl = slice(h * d, (h + 1) * d)
                # optional sentence-distance bias (beyond the paper), per visible sentence
                beta = torch.zeros(len(vis), dtype=DT)
                if n_dist:
                    beta = torch.stack([
                        m.distance_bias[max(-n_dist, min(n_dist, int(qp[b]) - int(mem.pos[j])))
                                        + n_dist, h] for j in vis])
                if m.uses_sentences:
                    qs = lin(m.q_s_proj, x)[sl] / math.sqrt(d)
                    ks = torch.stack([lin(m.k_s_proj, mem.keys[j, w].mean(0))[sl]
                                      for j, w in zip(vis, words)])
                if m.uses_words:
                    qw = lin(m.q_w_proj, x)[sl] / math.sqrt(d)
                if m.attention == "flat-sentence":
                    vs = torch.stack([lin(m.v_proj, mem.values[j, w].mean(0))[sl]
                                      for j, w in zip(vis, words)])
                    heads.append(torch.softmax(ks @ qs + beta, -1) @ vs)
                elif m.attention == "flat-word":
                    kw = torch.cat([lin(m.k_w_proj, mem.keys[j, w])[:, sl]
                                    for j, w in zip(vis, words)])
                    vw = torch.cat([lin(m.v_proj, mem.values[j, w])[:, sl]
                                    for j, w in zip(vis, words)])
                    beta_w = torch.cat([beta[i].expand(len(w)) for i, w in enumerate(words)])
                    heads.append(torch.softmax(kw @ qw + beta_w, -1) @ vw)
                else:
                    a_s = norm(m.sentence_attn, ks @ qs + beta)  # Eq. 3
                    o = torch.zeros(d, dtype=DT)
                    for a_j, j, w in zip(a_s, vis, words):
                        kw = lin(m.k_w_proj, mem.keys[j, w])[:, sl]
                        vw = lin(m.v_proj, mem.values[j, w])[:, sl]
                        o = o + a_j * (norm(m.word_attn, kw @ qw) @ vw)  # Eq. 4-5
                    heads.append(o)
            out[t, b] = lin(m.out_proj, torch.cat(heads))
    return out


class NumelLog(TorchDispatchMode):
    """Largest and total number of elements of the tensors ops produce."""

    def __init__(self):
        super().__init__()
        self.max = 0
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # a view of an existing tensor: no new elements
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.max = max(self.max, t.numel())
                self.total += t.numel()
        return out


# a batch with several documents of different lengths, queries interleaved
DOCS = [4, 1, 6, 3]
SPEC = [(2, 5), (0, 0), (2, 1), (1, 0), (0, 3), (2, 3), (3, 2), (0, 2), (3, 0)]


# ------------------------------------------------------------------ masking
@pytest.mark.parametrize("kind", ["sparsemax", "softmax"])
def test_masked_normalize_exact_zeros_and_empty_rows(kind):
    g = torch.Generator().manual_seed(0)
    scores = (3 * torch.randn(4, 6, generator=g, dtype=DT)).requires_grad_()
    mask = torch.tensor([[1, 1, 0, 1, 0, 1], [0, 0, 0, 0, 0, 0],
                         [0, 0, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    p = masked_normalize(scores, mask, kind)
    def norm(x):
        return sparsemax(x, dim=-1) if kind == "sparsemax" else torch.softmax(x, -1)
    for r in range(4):
        if mask[r].any():
            torch.testing.assert_close(p[r, mask[r]], norm(scores[r, mask[r]]), rtol=0, atol=1e-15)
    assert torch.equal(p[~mask], torch.zeros_like(p[~mask]))
    assert torch.equal(p[1], torch.zeros(6, dtype=DT))
    (p * torch.randn(4, 6, generator=g, dtype=DT)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.equal(scores.grad[~mask], torch.zeros_like(scores.grad[~mask]))


# ------------------------------------------------------- equations vs reference
@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_matches_naive_reference(mode, selective, online):
    att, sa, wa = mode
    m = build(att, sa, wa, selective=selective)
    mem = make_memory(DOCS, empty=(8,))
    q, qd, qp = make_queries(SPEC)
    out, info = run(m, mem, q, qd, qp, online)
    torch.testing.assert_close(out, reference(m, mem, q, qd, qp, online), rtol=0, atol=1e-12)
    want = [bool(visible(mem, int(d), int(p), online)) for d, p in zip(qd, qp)]
    assert info["has_context"].tolist() == want


@pytest.mark.parametrize("grouped", [False, True], ids=["per-query", "grouped"])
@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_query_window_matches_naive_reference(mode, online, grouped):
    """A per-query window (a scorer's --context-size N, --sample-context-size's
    draw for a document memory) keeps the memory sentences at most that many
    positions away, exactly: the reference over those sentences only; window
    0 is the empty context (output 0, no context); gradients stay finite."""
    att, sa, wa = mode
    m = build(att, sa, wa)
    mem = make_memory(DOCS, empty=(8,))
    q, qd, qp = make_queries(SPEC)
    B = qd.numel()
    for windows in (torch.zeros(B, dtype=torch.long), torch.ones(B, dtype=torch.long),
                    torch.arange(B) % 3, torch.full((B,), 1000)):
        pm = m.project_memory(*mem.args())
        qq = q.clone().requires_grad_()
        out, info = group_run(m, pm, qq, qd, qp, online, grouped, query_window=windows)
        torch.testing.assert_close(out, reference(m, mem, q, qd, qp, online, windows),
                                   rtol=0, atol=1e-12)
        want = [bool(visible(mem, int(d), int(p), online, int(w)))
                for d, p, w in zip(qd, qp, windows)]
        assert info["has_context"].tolist() == want
        out.sum().backward()
        assert torch.isfinite(qq.grad).all()
    # a window as large as the document is the paper's whole document, bitwise
    full, _ = run(m, mem, q, qd, qp, online)
    wide, _ = run(m, mem, q, qd, qp, online, query_window=torch.full((B,), 1000))
    assert torch.equal(full, wide)


# ----------------------------------------------------- selective == dense
def group_run(m, pm, q, qd, qp, online, grouped, **kw):
    """``m`` on the queries per query sentence or per document (the collater's
    query groups, here computed on the host)."""
    if grouped:
        kw["query_groups"] = m.group_queries(pm, qd)
    return m(q, pm, qd, qp, online, **kw)


def forward_backward(m, mem: Mem, q, qd, qp, online, grouped=False, **kw):
    """``(out, info, grads)``: ``m`` (:func:`group_run`) on leaf copies of the
    queries and of the memory's keys and values, then the backward pass of a
    fixed random projection of the output (seed 9); ``grads``: the gradients
    of the parameters (by name) and of ``query``, ``keys`` and ``values``."""
    qq = q.clone().requires_grad_()
    keys, values = mem.keys.clone().requires_grad_(), mem.values.clone().requires_grad_()
    pm = m.project_memory(keys, values, mem.mask, mem.doc, mem.pos)
    out, info = group_run(m, pm, qq, qd, qp, online, grouped, **kw)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=DT)
    (out * w).sum().backward()
    grads = {n: p.grad for n, p in m.named_parameters()}
    grads.update(query=qq.grad, keys=keys.grad, values=values.grad)
    return out, info, grads


def assert_same_gradients(g, g_ref):
    """Gradients of the same names as ``g_ref``'s, each finite and equal to
    it (float64, 1e-10)."""
    assert set(g) == set(g_ref)
    for k in g:
        assert torch.isfinite(g[k]).all()
        torch.testing.assert_close(g[k], g_ref[k], rtol=0, atol=1e-10, msg=k)


@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("word_attn", ["softmax", "sparsemax"],
                         ids=["sparse-soft", "sparse-sparse"])
def test_selective_equals_dense_values_and_gradients(word_attn, online):
    """The selective and dense settings, per query sentence and per document,
    with one-sentence blocks and one-row tiles (every tile boundary exercised)
    and with the default blocks: equal values, weights, statistics and
    gradients (float64, 1e-10), and a partial sentence support (the
    comparison is not vacuous)."""
    mem = make_memory([5, 2, 8, 3], L=8, seed=3)
    spec = [(2, 7), (0, 1), (2, 4), (1, 1), (0, 4), (2, 0), (3, 2), (0, 2), (2, 5), (1, 0)]
    q, qd, qp = make_queries(spec, T=4, seed=4)
    pad = torch.zeros(len(spec), 4, dtype=torch.bool)
    pad[1, 3:] = True
    results = []
    for selective, grouped, tiny in ((False, False, False), (True, False, True),
                                     (True, True, True), (True, True, False)):
        kw = dict(word_block=1, tile_elems=1) if tiny else {}
        m = build("hierarchical", "sparsemax", word_attn, selective=selective, **kw)
        results.append(forward_backward(m, mem, q, qd, qp, online, grouped,
                                        query_padding_mask=pad, need_weights=True,
                                        need_word_weights=True, return_stats=True))
    o_d, i_d, g_d = results[0]
    assert 1.0 < float(i_d["sentence_support"]) < float(i_d["visible_sentences"])
    for o, i, g in results[1:]:
        torch.testing.assert_close(o, o_d, rtol=0, atol=1e-10)
        s = min(i["sent_weights"].size(-1), i_d["sent_weights"].size(-1))
        for k in ("sent_weights", "sent_index", "word_weights"):
            torch.testing.assert_close(i[k][:, :, :, :s] if i[k].dim() > 2 else i[k][:, :s],
                                       i_d[k][:, :, :, :s] if i_d[k].dim() > 2 else i_d[k][:, :s],
                                       rtol=0, atol=1e-10)
        for k in ("sentence_support", "word_support", "num_support_pairs", "word_overflow_sum"):
            torch.testing.assert_close(i[k], i_d[k], rtol=0, atol=1e-10)
        assert_same_gradients(g, g_d)


# ------------------------------------------------------------- visibility
@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_visibility_current_and_future_sentences(mode, online):
    att, sa, wa = mode
    m = build(att, sa, wa)
    mem = make_memory([6, 3], L=7, seed=5)
    spec = [(0, 3), (1, 1), (0, 0)]
    q, qd, qp = make_queries(spec, seed=6)
    base, info = run(m, mem, q, qd, qp, online, need_weights=True)

    def perturbed(rows, keys=True):
        mem2 = replace(mem, keys=mem.keys.clone(), values=mem.values.clone())
        for s in rows:
            if keys:
                mem2.keys[s] += 5 * torch.randn(mem.keys.shape[1:], dtype=DT)
            mem2.values[s] += 5 * torch.randn(mem.values.shape[1:], dtype=DT)
        return run(m, mem2, q, qd, qp, online)[0]

    invisible = [3, 4, 5] if online else [3]  # doc 0 rows; query 0 is sentence 3
    out = perturbed(invisible)
    torch.testing.assert_close(out[:, 0], base[:, 0], rtol=0, atol=1e-13)
    # doc 1 unaffected (1e-13, not 0: a tile's compacted row count may follow doc 0)
    torch.testing.assert_close(out[:, 1], base[:, 1], rtol=0, atol=1e-13)
    # the visible sentence with most attention mass: changing its values changes the output
    w = info["sent_weights"][0].sum((0, 1))
    allowed = [j for j in range(6) if (j < 3 if online else j != 3)]
    assert float(w[invisible].abs().sum()) == 0.0
    top = max(allowed, key=lambda j: float(w[j]))
    assert float(w[top]) > 0
    out = perturbed([top], keys=False)
    assert (out[:, 0] - base[:, 0]).abs().max() > 1e-3
    # doc 1 unaffected (1e-13, not 0: a tile's compacted row count may follow doc 0)
    torch.testing.assert_close(out[:, 1], base[:, 1], rtol=0, atol=1e-13)


# ------------------------------------------------------------ empty context
@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_no_context_rows_are_zero_with_finite_gradients(mode, selective):
    att, sa, wa = mode
    m = build(att, sa, wa, selective=selective)
    # doc 0: 3 sentences; doc 1: one sentence; doc 2: sentence 0 has no real word
    mem = make_memory([3, 1, 2], L=6, seed=7, empty=(4,))
    spec = [(0, 0), (0, 2), (1, 0), (2, 1), (7, 0), (0, 1)]  # doc 7 has no memory
    q, qd, qp = make_queries(spec, seed=8)
    q.requires_grad_()
    keys, values = mem.keys.clone().requires_grad_(), mem.values.clone().requires_grad_()
    pm = m.project_memory(keys, values, mem.mask, mem.doc, mem.pos)
    out, info = m(q, pm, qd, qp, True)
    assert info["has_context"].tolist() == [False, True, False, False, False, True]
    for b in (0, 2, 3, 4):
        assert torch.equal(out[:, b], torch.zeros_like(out[:, b]))
    assert out[:, 1].abs().sum() > 0
    out.pow(2).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    for g in (q.grad, keys.grad, values.grad):
        assert torch.isfinite(g).all()
    assert torch.equal(q.grad[:, [0, 2, 3, 4]], torch.zeros_like(q.grad[:, [0, 2, 3, 4]]))
    # a batch where no query has any context: zeros, and every parameter gets a
    # zero gradient (none is left out of the graph, for DDP)
    m.zero_grad(set_to_none=True)
    pm = m.project_memory(*mem.args())
    out, info = m(q.detach()[:, [0, 2, 3]], pm, qd[[0, 2, 3]], qp[[0, 2, 3]], True)
    assert not info["has_context"].any() and torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and not p.grad.any(), name


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_modes_forward_backward_and_parameters(mode):
    att, sa, wa = mode
    m = build(att, sa, wa)
    names = {n.split(".")[0] for n, _ in m.named_parameters()}
    expected = {"hierarchical": {"q_s_proj", "k_s_proj", "q_w_proj", "k_w_proj", "v_proj"},
                "flat-sentence": {"q_s_proj", "k_s_proj", "v_proj"},
                "flat-word": {"q_w_proj", "k_w_proj", "v_proj"}}[att] | {"out_proj"}
    assert names == expected
    mem = make_memory(DOCS)
    q, qd, qp = make_queries(SPEC)
    out, _ = run(m, mem, q, qd, qp, False)
    out.sum().backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


# ------------------------------------------- batch composition and padding
@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_one_document_vs_multi_document_batch(mode, selective, online):
    att, sa, wa = mode
    m = build(att, sa, wa, selective=selective)
    big = make_memory([3, 5, 4], doc_ids=[11, 12, 13], seed=10)
    rows = big.doc == 12
    alone = Mem(big.keys[rows], big.values[rows], big.mask[rows], big.doc[rows], big.pos[rows])
    spec = [(13, 1), (12, 4), (11, 0), (12, 1), (13, 3), (12, 2), (11, 2)]
    q, qd, qp = make_queries(spec, seed=11)
    out_b, info_b = run(m, big, q, qd, qp, online, need_weights=True)
    sel = [1, 3, 5]
    out_a, info_a = run(m, alone, q[:, sel], qd[sel], qp[sel], online, need_weights=True)
    torch.testing.assert_close(out_b[:, sel], out_a, rtol=0, atol=1e-12)
    torch.testing.assert_close(info_b["sent_weights"][sel, :, :, :5], info_a["sent_weights"],
                               rtol=0, atol=1e-12)
    assert torch.equal(info_b["sent_index"][sel, :5], info_a["sent_index"] + 3)


def repad(mem: Mem, L_new: int, shift: int, garbage: float) -> Mem:
    """Same sentences with ``shift`` more columns on the left and padding up to
    ``L_new``; every non-real position holds ``garbage``."""
    S, L, _ = mem.keys.shape
    keys = torch.full((S, L_new, C), garbage, dtype=DT)
    values = torch.full((S, L_new, C), garbage, dtype=DT)
    mask = torch.zeros(S, L_new, dtype=torch.bool)
    keys[:, shift:shift + L] = mem.keys.masked_fill(~mem.mask.unsqueeze(-1), garbage)
    values[:, shift:shift + L] = mem.values.masked_fill(~mem.mask.unsqueeze(-1), garbage)
    mask[:, shift:shift + L] = mem.mask
    return Mem(keys, values, mask, mem.doc, mem.pos)


@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_padding_invariance(mode, selective):
    att, sa, wa = mode
    m = build(att, sa, wa, selective=selective)
    mem = make_memory([4, 3], L=6, seed=12)
    spec = [(0, 3), (1, 1), (0, 1)]
    q, qd, qp = make_queries(spec, T=3, seed=13)
    ref, _ = run(m, mem, q, qd, qp, False)
    # memory left/right padded with garbage (huge values and NaN), queries in a
    # batch with a longer sentence (the short ones padded at the end with garbage)
    q_long = torch.full((7, 4, C), 1e3, dtype=DT)
    q_long[:3, :3] = q
    q_long[:, 3] = torch.randn(7, C, dtype=DT)
    qd4, qp4 = torch.cat([qd, torch.tensor([1])]), torch.cat([qp, torch.tensor([0])])
    pad = torch.zeros(4, 7, dtype=torch.bool)
    pad[:3, 3:] = True
    for garbage, shift in ((1e6, 3), (float("nan"), 0)):
        mem2 = repad(mem, 11, shift, garbage)
        out, _ = run(m, mem2, q_long, qd4, qp4, False, query_padding_mask=pad)
        torch.testing.assert_close(out[:3, :3], ref, rtol=0, atol=1e-12)
        assert torch.isfinite(out).all()


def test_sentence_keys_mean_over_real_words_only():
    for att in ("hierarchical", "flat-sentence"):
        m = build(att, "softmax", "softmax")
        mem = make_memory([3, 2], L=7, seed=14)
        pm = m.project_memory(*mem.args())
        rows = range(mem.keys.size(0))
        mean_k = torch.stack([mem.keys[s, mem.mask[s]].mean(0) for s in rows])
        torch.testing.assert_close(pm.k_s, m.k_s_proj(mean_k).view(-1, H, C // H),
                                   rtol=0, atol=1e-12)
        if att == "flat-sentence":
            mean_v = torch.stack([mem.values[s, mem.mask[s]].mean(0) for s in rows])
            torch.testing.assert_close(pm.v_s, m.v_proj(mean_v).view(-1, H, C // H),
                                       rtol=0, atol=1e-12)
        # BOS / EOS / padding vectors do not enter the sentence keys
        mem2 = replace(mem, keys=mem.keys.masked_fill(~mem.mask.unsqueeze(-1), 50.0))
        pm2 = m.project_memory(*mem2.args())
        torch.testing.assert_close(pm2.k_s, pm.k_s, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ cost
def forward_numel(m, mem, q, qd, qp, online=True, backward=False):
    pm = m.project_memory(*mem.args())
    log = NumelLog()
    with log:
        out, _ = m(q, pm, qd, qp, online)
        if backward:
            out.sum().backward()
    return log


@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_forward_cost_ignores_other_documents(mode, selective):
    """Queries of a 3-sentence document: the work in forward is the same whether
    the batch's memory also holds 30 or 60 other documents (of at most as many
    sentences: the padded document index is ``D x S_max``, and a query's work
    grows with ``S_max``, the batch's largest document, which the task's
    document batching keeps close to the others) or not."""
    att, sa, wa = mode
    m = build(att, sa, wa, selective=selective)
    q, qd, qp = make_queries([(0, 2), (0, 1)], T=4, seed=15)
    small = make_memory([3], doc_ids=[0], L=6, seed=16)
    logs = []
    for big in (0, 30, 60):
        mem = small
        if big:
            other = make_memory([3] * big, doc_ids=range(1, big + 1), L=6, seed=big)
            mem = Mem(*(torch.cat([a, b]) for a, b in zip(small.args(), other.args())))
        with torch.no_grad():
            logs.append(forward_numel(m, mem, q, qd, qp))
    assert len({(lg.max, lg.total) for lg in logs}) == 1


@pytest.mark.parametrize("grouped", [False, True], ids=["per-sentence", "per-document"])
def test_many_documents_no_batch_quadratic_tensor(grouped):
    """30 documents x 8 sentences, every sentence a query: no tensor pairs the
    queries with the whole batch's memory (B x S_total x L would be 240 x 240 x L)."""
    m = build()
    n_docs, n_sent, T, L = 30, 8, 3, 6
    mem = make_memory([n_sent] * n_docs, L=L, seed=17)
    spec = [(d, p) for d in range(n_docs) for p in range(n_sent)]
    q, qd, qp = make_queries(spec, T=T, seed=18)
    pm = m.project_memory(*mem.args())
    log = NumelLog()
    with log:
        out, _ = group_run(m, pm, q, qd, qp, False, grouped)
        out.sum().backward()
    B = len(spec)
    assert log.max < B * T * B * L * C // 10


def test_long_document_300_sentences_linear_per_query():
    m = build(word_attn="sparsemax", tile_elems=1 << 14)
    mem = make_memory([300, 5], L=6, seed=19, max_words=3)
    spec = [(0, p) for p in range(300)] + [(1, p) for p in range(5)]
    q, qd, qp = make_queries(spec, T=4, seed=20)
    q.requires_grad_()
    out, info = run(m, mem, q, qd, qp, True, return_stats=True)
    out.pow(2).sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(out).all()
    assert float(info["sentence_support"]) < float(info["visible_sentences"]) / 10
    # one query at the end of the document: doubling the document doubles the work
    totals = []
    for n in (300, 600):
        mem = make_memory([n], L=6, seed=21, max_words=3)
        q1, qd1, qp1 = make_queries([(0, n - 1)], T=4, seed=22)
        with torch.no_grad():
            totals.append(forward_numel(m, mem, q1, qd1, qp1, online=True).total)
    assert totals[1] / totals[0] < 2.2


@pytest.mark.parametrize("mode", [MODES[0], MODES[1], MODES[4]], ids=["sparse-soft", "sparse-sparse", "flat-word"])
@pytest.mark.parametrize("grouped", [False, True], ids=["per-sentence", "per-document"])
def test_word_level_never_pairs_every_token_with_every_word(mode, grouped):
    """Forward and backward form no tensor of the size of the word scores
    ``B x H x T x S x L``: the largest is one tile (``tile_elems``) or the
    sentence weights' ``B x H x T x S``."""
    att, sa, wa = mode
    n, T, L = 120, 6, 10
    mem = make_memory([n], L=L, seed=23)
    spec = [(0, p) for p in range(100, 120)]
    q, qd, qp = make_queries(spec, T=T, seed=24)
    m = build(att, sa, wa, tile_elems=1 << 12)
    pm = m.project_memory(*mem.args())
    log = NumelLog()
    with log:
        out, _ = group_run(m, pm, q.clone().requires_grad_(), qd, qp, True, grouped)
        out.sum().backward()
    block = m.block_for(torch.device("cpu"))
    B, s_pad = len(spec), -(-n // block) * block
    word_scores = B * H * T * n * L
    assert log.max <= max(B * H * T * s_pad, 2 * m.tile_elems, n * L * C)
    assert log.max * 4 < word_scores


# --------------------------------------------- incremental decoding / beam
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_stepwise_queries_and_beam_reorder(mode):
    att, sa, wa = mode
    m = build(att, sa, wa)
    mem = make_memory(DOCS)
    q, qd, qp = make_queries(SPEC, T=4)
    pm = m.project_memory(*mem.args())
    full, _ = m(q, pm, qd, qp, True)
    for t in range(4):  # one step at a time with the cached projected memory
        step, _ = m(q[t:t + 1], pm, qd, qp, True)
        torch.testing.assert_close(step, full[t:t + 1], rtol=0, atol=1e-12)
    new_order = torch.tensor([2, 0, 0, 5, 1, 8, 8, 3])
    qd2, qp2 = m.reorder_queries(qd, qp, new_order)
    out, _ = m(q.index_select(1, new_order), pm, qd2, qp2, True)
    torch.testing.assert_close(out, full.index_select(1, new_order), rtol=0, atol=1e-12)


def test_memory_order_is_checked():
    m = build()
    mem = make_memory([2, 2])
    bad_doc = mem.doc[[0, 2, 1, 3]]
    with pytest.raises(ValueError, match="contiguous"):
        m.project_memory(mem.keys, mem.values, mem.mask, bad_doc, mem.pos)
    bad_pos = torch.tensor([1, 0, 0, 1])
    with pytest.raises(ValueError, match="position order"):
        m.project_memory(mem.keys, mem.values, mem.mask, mem.doc, bad_pos)


# --------------------------------------------------------- weights / stats
@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
def test_weights_and_statistics(selective):
    m = build(word_attn="sparsemax", selective=selective)
    mem = make_memory(DOCS, L=8, seed=25)
    q, qd, qp = make_queries(SPEC, T=4, seed=26)
    pad = torch.zeros(len(SPEC), 4, dtype=torch.bool)
    pad[0, 2:] = True
    out, info = run(m, mem, q, qd, qp, False, query_padding_mask=pad, need_weights=True,
                    need_word_weights=True, return_stats=True)
    sw, si, ww = info["sent_weights"], info["sent_index"], info["word_weights"]
    ctx = info["has_context"]
    assert sw.shape == (len(SPEC), H, 4, 6) and ww.shape == (len(SPEC), H, 4, 6, 8)
    torch.testing.assert_close(sw[ctx].sum(-1), torch.ones_like(sw[ctx].sum(-1)))
    assert torch.equal(sw[~ctx], torch.zeros_like(sw[~ctx]))
    torch.testing.assert_close(ww.sum(-1), sw)  # Eq. 5: word weights of j sum to alpha_s(j)
    for b, (d, p) in enumerate(SPEC):
        rows = si[b][si[b] >= 0]
        assert (mem.doc[rows] == d).all() and torch.equal(mem.pos[rows], torch.arange(DOCS[d]))
        invisible = [j for j, s in enumerate(rows.tolist()) if s not in visible(mem, d, p, False)]
        assert float(sw[b][..., invisible].abs().sum()) == 0.0
        for j, s in enumerate(rows.tolist()):  # only real words carry weight
            assert not ww[b][:, :, j][..., ~mem.mask[s]].any()
    real = (~pad & ctx.unsqueeze(1)).unsqueeze(1).expand(-1, H, -1)  # B x H x T
    n_supp = (sw != 0).sum(-1)
    torch.testing.assert_close(info["sentence_support"], n_supp[real].double().mean())
    pairs = (sw != 0) & real.unsqueeze(-1)
    torch.testing.assert_close(info["word_support"], (ww != 0).sum(-1)[pairs].double().mean())


# ------------------------------------------------------ context layer + gate
def test_gate_equation_without_bias():
    g = ContextGating(C).double()
    assert g.w_r.bias is None and g.w_d.bias is None
    r, d = torch.randn(3, 2, C, dtype=DT), torch.randn(3, 2, C, dtype=DT)
    out, gamma = g(r, d)
    want_gamma = torch.sigmoid(r @ g.w_r.weight.T + d @ g.w_d.weight.T)
    torch.testing.assert_close(gamma, want_gamma)
    torch.testing.assert_close(out, want_gamma * r + (1 - want_gamma) * d)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_context_layer_bypass_and_no_residual(mode):
    att, sa, wa = mode
    torch.manual_seed(0)
    layer = DocumentContextLayer(C, H, 16, attention=att, sentence_attn=sa, word_attn=wa).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.2 * torch.randn_like(p))
    layer.eval()
    mem = make_memory([3, 1, 4], L=6, seed=27)
    spec = [(0, 0), (0, 2), (1, 0), (2, 3), (2, 0)]
    r, qd, qp = make_queries(spec, T=3, seed=28)
    r.requires_grad_()
    pm = layer.project_memory(*mem.args())
    r_t, info = layer(r, pm, qd, qp, True)
    ctx = info["has_context"]
    assert ctx.tolist() == [False, True, False, True, False]
    # bypass: d = 0 and r~ = r exactly for query sentences without visible context
    assert torch.equal(r_t[:, ~ctx], r[:, ~ctx])
    assert torch.equal(info["d"][:, ~ctx], torch.zeros_like(info["d"][:, ~ctx]))
    assert torch.equal(info["gate"][:, ~ctx], torch.ones_like(info["gate"][:, ~ctx]))
    assert (r_t[:, ctx] - r[:, ctx]).abs().max() > 1e-3
    # d = LN(FFN(LN(attention))) with no residual connection (footnote 2)
    a, _ = layer.context_attn(r, pm, qd, qp, True)
    x = layer.attn_layer_norm(a)
    d = layer.final_layer_norm(layer.fc2(torch.relu(layer.fc1(x))))
    torch.testing.assert_close(info["d"][:, ctx], d[:, ctx], rtol=0, atol=1e-12)
    gamma = torch.sigmoid(layer.gate.w_r(r) + layer.gate.w_d(d))
    torch.testing.assert_close(r_t[:, ctx], (gamma * r + (1 - gamma) * d)[:, ctx],
                               rtol=0, atol=1e-12)
    r_t.pow(2).sum().backward()
    assert torch.isfinite(r.grad).all()
    assert torch.equal(r.grad[:, ~ctx], 2 * r[:, ~ctx].detach())  # d r~/d r = I when bypassed
    for n, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


def test_context_layer_decoder_query_differs_from_r():
    """Decoder integration: the attention query is the source-attention output,
    the gate combines it with the stack output ``r``."""
    torch.manual_seed(1)
    layer = DocumentContextLayer(C, H, 16).double().eval()
    mem = make_memory([4], seed=29)
    r, qd, qp = make_queries([(0, 3)], seed=30)
    query = torch.randn_like(r)
    pm = layer.project_memory(*mem.args())
    out_q, info_q = layer(r, pm, qd, qp, True, query=query)
    out_r, info_r = layer(r, pm, qd, qp, True)
    a, _ = layer.context_attn(query, pm, qd, qp, True)
    d = layer.final_layer_norm(layer.fc2(torch.relu(layer.fc1(layer.attn_layer_norm(a)))))
    torch.testing.assert_close(info_q["d"], d, rtol=0, atol=1e-12)
    assert (out_q - out_r).abs().max() > 1e-3


@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
def test_training_mode_with_dropout_runs(selective):
    torch.manual_seed(2)
    layer = DocumentContextLayer(C, H, 16, word_attn="sparsemax", selective=selective,
                                 dropout=0.2, attention_dropout=0.2,
                                 activation_dropout=0.2).double().train()
    mem = make_memory(DOCS, seed=31)
    r, qd, qp = make_queries(SPEC, seed=32)
    r.requires_grad_()
    out, info = layer(r, layer.project_memory(*mem.args()), qd, qp, False, return_stats=True)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(r.grad).all()
    assert torch.equal(out[:, ~info["has_context"]], r[:, ~info["has_context"]])


# ------------------------------------- sentence-distance bias (beyond the paper)
def build_dist(mode, n, selective=True, bias_scale=None, seed=0):
    """``build`` with ``sentence_distance=n``; the other parameters are those of
    ``build(mode)`` (copied), ``distance_bias`` random when ``bias_scale``."""
    att, sa, wa = mode
    ref = build(att, sa, wa, selective=selective, seed=seed)
    m = build(att, sa, wa, selective=selective, seed=seed, sentence_distance=n)
    missing, unexpected = m.load_state_dict(ref.state_dict(), strict=False)
    assert list(missing) == (["distance_bias"] if n else []) and not unexpected
    if n:
        assert m.distance_bias.shape == (2 * n + 1, H) and not m.distance_bias.any()
        if bias_scale is not None:
            g = torch.Generator().manual_seed(seed + 11)
            with torch.no_grad():
                m.distance_bias.copy_(bias_scale * torch.randn(2 * n + 1, H, generator=g,
                                                               dtype=DT))
    return ref, m


@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_distance_bias_zero_is_exactly_off(mode, selective, online):
    ref, m = build_dist(mode, 3, selective=selective)
    assert not hasattr(ref, "distance_bias") and ref.sentence_distance == 0
    mem = make_memory(DOCS, empty=(8,))
    q, qd, qp = make_queries(SPEC)
    outs, grads = [], []
    for mod in (ref, m):
        qq = q.clone().requires_grad_()
        out, _ = run(mod, mem, qq, qd, qp, online)
        out.pow(2).sum().backward()
        outs.append(out)
        grads.append({n: p.grad for n, p in mod.named_parameters()} | {"query": qq.grad})
    assert torch.equal(outs[0], outs[1])
    for k, g in grads[0].items():
        assert torch.equal(g, grads[1][k]), k
    assert torch.isfinite(grads[1]["distance_bias"]).all()


@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_distance_bias_matches_naive_reference(mode, selective, online):
    _, m = build_dist(mode, 2, selective=selective, bias_scale=2.0)
    mem = make_memory(DOCS, empty=(8,))
    q, qd, qp = make_queries(SPEC)
    out, _ = run(m, mem, q, qd, qp, online)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(m, mem, q, qd, qp, online),
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
def test_distance_bias_large_on_distance_one_selects_previous_sentence(selective, online):
    n = 3
    _, m = build_dist(MODES[0], n, selective=selective)
    with torch.no_grad():
        m.distance_bias[n + 1] = 1e3  # distance +1: the previous sentence
    mem = make_memory([6, 4], L=7, seed=12)
    spec = [(0, 5), (0, 1), (1, 3), (0, 3), (1, 1), (0, 2)]
    q, qd, qp = make_queries(spec, T=3, seed=13)
    _, info = run(m, mem, q, qd, qp, online, need_weights=True, return_stats=True)
    sw, si = info["sent_weights"], info["sent_index"]
    for b, (d, p) in enumerate(spec):
        prev = int(((mem.doc == d) & (mem.pos == p - 1)).nonzero())
        j = si[b].tolist().index(prev)
        want = torch.zeros_like(sw[b])
        want[..., j] = 1.0
        assert torch.equal(sw[b], want), b
    assert float(info["sentence_support"]) == 1.0
    # without the bias the sparsemax support is wider somewhere (the test is not vacuous)
    ref, _ = build_dist(MODES[0], 0, selective=selective)
    assert float(run(ref, mem, q, qd, qp, online, return_stats=True)[1]["sentence_support"]) > 1


@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("word_attn", ["softmax", "sparsemax"],
                         ids=["sparse-soft", "sparse-sparse"])
def test_distance_bias_selective_equals_dense(word_attn, online):
    mem = make_memory([5, 2, 8, 3], L=8, seed=3)
    spec = [(2, 7), (0, 1), (2, 4), (1, 1), (0, 4), (2, 0), (3, 2), (0, 2), (2, 5), (1, 0)]
    q, qd, qp = make_queries(spec, T=4, seed=4)
    results = []
    for selective in (True, False):
        _, m = build_dist(("hierarchical", "sparsemax", word_attn), 2, selective=selective,
                          bias_scale=1.5)
        if selective:  # one-sentence blocks, one-row tiles
            m.word_block = m.tile_elems = 1
        results.append(forward_backward(m, mem, q, qd, qp, online, need_weights=True,
                                        return_stats=True))
    (o_s, i_s, g_s), (o_d, i_d, g_d) = results
    assert 1.0 < float(i_s["sentence_support"]) < float(i_s["visible_sentences"])
    torch.testing.assert_close(o_s, o_d, rtol=0, atol=1e-10)
    torch.testing.assert_close(i_s["sent_weights"], i_d["sent_weights"], rtol=0, atol=1e-10)
    assert "distance_bias" in g_s and g_s["distance_bias"].abs().sum() > 0
    assert_same_gradients(g_s, g_d)


@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_distance_bias_gradients_and_signs(mode, online):
    """Gradients reach ``distance_bias``: online only positive distances
    (rows > N), offline both signs; distance 0 (the sentence itself) never."""
    n = 2
    _, m = build_dist(mode, n, bias_scale=1.0)
    mem = make_memory([6, 4], L=7, seed=14)
    spec = [(0, 5), (0, 1), (1, 3), (0, 3), (1, 0), (0, 0)]
    q, qd, qp = make_queries(spec, T=3, seed=15)
    out, _ = run(m, mem, q, qd, qp, online)
    out.pow(2).sum().backward()
    g = m.distance_bias.grad
    assert torch.isfinite(g).all()
    assert not g[n].any()  # distance 0
    assert g[n + 1:].abs().sum(1).gt(0).all()  # every positive distance (1, 2, clipped 3+)
    if online:
        assert not g[:n].any()
    else:
        assert g[:n].abs().sum(1).gt(0).all()


@pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_distance_bias_online_ignores_nonpositive_distances(mode, selective):
    """Online, the entries for distance <= 0 are never used: huge values there
    change nothing (and the layer never indexes a negative distance)."""
    n = 3
    _, m = build_dist(mode, n, selective=selective, bias_scale=1.0)
    mem = make_memory([6, 4], L=7, seed=16)
    spec = [(0, 5), (0, 1), (1, 3), (0, 3), (1, 0)]
    q, qd, qp = make_queries(spec, T=3, seed=17)
    base, info = run(m, mem, q, qd, qp, True, need_weights=True)
    used = []
    orig = m._distance_bias

    def spy(query_pos, memory, rows):
        bias = orig(query_pos, memory, rows)
        dist = query_pos.unsqueeze(1) - memory.pos[rows]
        vis = (dist > 0) & memory.has_word[rows]
        used.append(dist[vis])
        return bias

    m._distance_bias = spy
    with torch.no_grad():
        m.distance_bias[:n + 1] = 1e4
    out, info2 = run(m, mem, q, qd, qp, True, need_weights=True)
    torch.testing.assert_close(out, base, rtol=0, atol=0)
    torch.testing.assert_close(info2["sent_weights"], info["sent_weights"], rtol=0, atol=0)
    assert used and bool((torch.cat(used) > 0).all())


@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_distance_bias_visibility_unchanged(mode, online):
    """A huge bias on every distance (the current sentence's 0 and the later
    sentences' negative ones included) does not make the current sentence, or
    online the later ones, visible."""
    n = 3
    _, m = build_dist(mode, n)
    with torch.no_grad():
        m.distance_bias.fill_(1e4)
        m.distance_bias[n] = 1e6  # distance 0: the sentence itself
        m.distance_bias[:n] = 1e5  # later sentences
    mem = make_memory([6, 3], L=7, seed=5)
    spec = [(0, 3), (1, 1), (0, 0)]
    q, qd, qp = make_queries(spec, seed=6)
    base, info = run(m, mem, q, qd, qp, online, need_weights=True)
    assert info["has_context"].tolist() == [True, True, not online]
    invisible = [3, 4, 5] if online else [3]
    w = info["sent_weights"][0]
    assert torch.isfinite(w).all() and float(w[..., invisible].abs().sum()) == 0.0
    mem2 = replace(mem, keys=mem.keys.clone(), values=mem.values.clone())
    for s in invisible:
        mem2.keys[s] += 5 * torch.randn(mem.keys.shape[1:], dtype=DT)
        mem2.values[s] += 5 * torch.randn(mem.values.shape[1:], dtype=DT)
    out = run(m, mem2, q, qd, qp, online)[0]
    torch.testing.assert_close(out[:, 0], base[:, 0], rtol=0, atol=1e-13)
    torch.testing.assert_close(out[:, 1], base[:, 1], rtol=0, atol=1e-13)
    if online:
        assert torch.equal(out[:, 2], torch.zeros_like(out[:, 2]))


def test_distance_bias_tensor_not_larger_than_sentence_scores():
    n = 2
    _, m = build_dist(MODES[0], n, bias_scale=1.0)
    mem = make_memory([7], L=6, seed=18)
    q, qd, qp = make_queries([(0, 6), (0, 4)], T=3, seed=19)
    pm = m.project_memory(*mem.args())
    bias = m._distance_bias(qp, pm, pm.doc_rows[qd])
    assert bias.shape == (2, H, 1, 7)  # B x H x 1 x S_max, broadcast over the T = 3 tokens
    assert bias[0, :, 0, 0].tolist() == m.distance_bias[2 * n].tolist()  # distance 6 -> +N
    assert bias[1, :, 0, 6].tolist() == m.distance_bias[n - 2].tolist()  # distance -2


# ------------------------------------------------------------ half precision
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
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
@pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
@pytest.mark.parametrize("layout", ["sentence", "document", "document-tiny", "by-length",
                                    "by-length-tiny"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
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


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
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
