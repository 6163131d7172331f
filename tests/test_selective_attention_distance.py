"""The selective attention's sentence-distance bias (``--doc-sentence-distance``,
beyond the paper): exactly off at zero, against the naive reference, its
effect, gradients, online distances and visibility, and its size."""

from dataclasses import replace

import pytest
import torch

from selective_attention_utils import (
    EVERY_MODE,
    ONLINE_AND_OFFLINE,
    SELECTIVE_AND_DENSE,
    DT,
    MODES,
    make_memory,
    make_queries,
    build,
    run,
    reference,
    DOCS,
    SPEC,
    H,
    forward_backward,
    assert_same_gradients,
)


# ------------------------------------- sentence-distance bias (beyond the paper)
def build_dist(mode, n, selective=True, bias_scale=None, seed=0):
    """``build`` with ``sentence_distance=n``; the other parameters are those of
    ``build(mode)`` (copied), ``distance_bias`` random when ``bias_scale``."""
    ref = build(*mode, selective=selective, seed=seed)
    m = build(*mode, selective=selective, seed=seed, sentence_distance=n)
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


@ONLINE_AND_OFFLINE
@SELECTIVE_AND_DENSE
@EVERY_MODE
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


@ONLINE_AND_OFFLINE
@SELECTIVE_AND_DENSE
@EVERY_MODE
def test_distance_bias_matches_naive_reference(mode, selective, online):
    _, m = build_dist(mode, 2, selective=selective, bias_scale=2.0)
    mem = make_memory(DOCS, empty=(8,))
    q, qd, qp = make_queries(SPEC)
    out, _ = run(m, mem, q, qd, qp, online)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(m, mem, q, qd, qp, online),
                                   rtol=0, atol=1e-12)


@ONLINE_AND_OFFLINE
@SELECTIVE_AND_DENSE
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


@ONLINE_AND_OFFLINE
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


@ONLINE_AND_OFFLINE
@EVERY_MODE
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


@SELECTIVE_AND_DENSE
@EVERY_MODE
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


@ONLINE_AND_OFFLINE
@EVERY_MODE
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
