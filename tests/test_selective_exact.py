"""The selective attention's word level is exact by default: a token's result
does not depend on the formulation the shapes pick (per query sentence or per
token), on the batch it is in, nor on incremental decoding (one token at a
time), also when the Eq. 3 support is larger than any fixed capacity. The
opt-in capacity (``word_capacity`` > 0) is an approximation whose overflow is
counted."""

import pytest
import torch

from ctx_fairseq.modules.selective_attention import WORD_CAPACITY, HierarchicalContextAttention

C, H, S, L = 64, 4, 60, 6


def _memory(m):
    g = torch.Generator().manual_seed(0)
    keys = 0.05 * torch.randn(S, L, C, generator=g, dtype=torch.double)  # near-equal scores
    mask = torch.ones(S, L, dtype=torch.bool)
    mask[7, 3:] = False
    return m.project_memory(keys, keys, mask, torch.zeros(S, dtype=torch.long), torch.arange(S))


def _run(m, q):
    mem = _memory(m)
    qd, qp = torch.zeros(1, dtype=torch.long), torch.tensor([S])  # online: sees all S sentences
    return m(q, mem, qd, qp, True, return_stats=True)


def test_default_has_no_capacity():
    assert WORD_CAPACITY == 0
    with pytest.raises(ValueError, match="word_capacity"):
        HierarchicalContextAttention(C, H, word_capacity=-1)


@pytest.mark.parametrize("dense_elems", [1 << 28, 0])  # per query sentence / per token
def test_one_token_at_a_time_equals_the_whole_sentence(dense_elems):
    torch.manual_seed(0)
    m = HierarchicalContextAttention(C, H, dense_elems=dense_elems).double().eval()
    q = torch.randn(3, 1, C, dtype=torch.double)
    with torch.no_grad():
        full, info = _run(m, q)
        assert float(info["sentence_support"]) > 32  # wider than the old fixed capacity
        assert float(info["word_overflow_sum"]) == 0
        for t in range(3):
            step, _ = _run(m, q[t:t + 1])
            torch.testing.assert_close(step[0], full[t], rtol=0, atol=1e-12)


def test_both_formulations_agree_in_value_and_gradient():
    outs = []
    for dense_elems in (1 << 28, 0):
        torch.manual_seed(0)
        m = HierarchicalContextAttention(C, H, dense_elems=dense_elems).double()
        q = torch.randn(2, 1, C, dtype=torch.double, requires_grad=True)
        out, _ = _run(m, q)
        out.sum().backward()
        outs.append((out.detach(), q.grad, [p.grad for p in m.parameters()]))
    (o1, g1, p1), (o2, g2, p2) = outs
    torch.testing.assert_close(o1, o2, rtol=0, atol=1e-12)
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-12)
    for a, b in zip(p1, p2):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_opt_in_capacity_counts_its_overflow():
    torch.manual_seed(0)
    m = HierarchicalContextAttention(C, H, word_capacity=4, dense_elems=0).double().eval()
    with torch.no_grad():
        _, info = _run(m, torch.randn(2, 1, C, dtype=torch.double))
    assert float(info["word_overflow_sum"]) > 0
