"""Helpers of the selective attention tests (tests/test_selective_attention*.py):
synthetic memories and queries, the module built at a mode, a naive
per-query reference and a dispatch-mode log of tensor sizes."""

import math
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import pytest
import torch
from entmax import sparsemax
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ctx_fairseq.modules.selective_attention import (
    HierarchicalContextAttention,
)

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
#: the parametrizations the tests share, each defined once with its test ids: every
#: mode (``mode``, built with ``build(*mode)``), online and offline visibility
#: (``online``), the selective and the dense computation (``selective``)
EVERY_MODE = pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
ONLINE_AND_OFFLINE = pytest.mark.parametrize("online", [True, False], ids=["online", "offline"])
SELECTIVE_AND_DENSE = pytest.mark.parametrize("selective", [True, False], ids=["selective", "dense"])


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
