"""Selective attention document-context layer (Maruf et al. 2019, Eq. 3-8):
exact masking, a naive per-query reference, visibility, empty context,
selective == dense and per-sentence == per-document (values and gradients),
per-document cost, padding invariance, sentence keys, gate bypass,
incremental steps and beam reorder. The sentence-distance bias:
tests/test_selective_attention_distance.py; half precision, autocast and the
previous exact implementation: tests/test_selective_attention_precision.py."""

from dataclasses import replace

import pytest
import torch
from entmax import sparsemax

from ctx_fairseq.modules.selective_attention import (
    ContextGating,
    DocumentContextLayer,
)
from ctx_fairseq.modules.sparsemax import masked_normalize
from selective_attention_utils import (
    EVERY_MODE,
    ONLINE_AND_OFFLINE,
    SELECTIVE_AND_DENSE,
    DT,
    MODES,
    Mem,
    make_memory,
    make_queries,
    build,
    run,
    visible,
    reference,
    NumelLog,
    DOCS,
    SPEC,
    C,
    H,
    group_run,
    forward_backward,
    assert_same_gradients,
)



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
@ONLINE_AND_OFFLINE
@SELECTIVE_AND_DENSE
@EVERY_MODE
def test_matches_naive_reference(mode, selective, online):
    m = build(*mode, selective=selective)
    mem = make_memory(DOCS, empty=(8,))
    q, qd, qp = make_queries(SPEC)
    out, info = run(m, mem, q, qd, qp, online)
    torch.testing.assert_close(out, reference(m, mem, q, qd, qp, online), rtol=0, atol=1e-12)
    want = [bool(visible(mem, int(d), int(p), online)) for d, p in zip(qd, qp)]
    assert info["has_context"].tolist() == want


@pytest.mark.parametrize("grouped", [False, True], ids=["per-query", "grouped"])
@ONLINE_AND_OFFLINE
@EVERY_MODE
def test_query_window_matches_naive_reference(mode, online, grouped):
    """A per-query window (a scorer's --context-size N, --sample-context-size's
    draw for a document memory) keeps the memory sentences at most that many
    positions away, exactly: the reference over those sentences only; window
    0 is the empty context (output 0, no context); gradients stay finite."""
    m = build(*mode)
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
@ONLINE_AND_OFFLINE
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
@ONLINE_AND_OFFLINE
@EVERY_MODE
def test_visibility_current_and_future_sentences(mode, online):
    m = build(*mode)
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
@SELECTIVE_AND_DENSE
@EVERY_MODE
def test_no_context_rows_are_zero_with_finite_gradients(mode, selective):
    m = build(*mode, selective=selective)
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


@EVERY_MODE
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
@ONLINE_AND_OFFLINE
@SELECTIVE_AND_DENSE
@EVERY_MODE
def test_one_document_vs_multi_document_batch(mode, selective, online):
    m = build(*mode, selective=selective)
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


@SELECTIVE_AND_DENSE
@EVERY_MODE
def test_padding_invariance(mode, selective):
    m = build(*mode, selective=selective)
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


@SELECTIVE_AND_DENSE
@EVERY_MODE
def test_forward_cost_ignores_other_documents(mode, selective):
    """Queries of a 3-sentence document: the work in forward is the same whether
    the batch's memory also holds 30 or 60 other documents (of at most as many
    sentences: the padded document index is ``D x S_max``, and a query's work
    grows with ``S_max``, the batch's largest document, which the task's
    document batching keeps close to the others) or not."""
    m = build(*mode, selective=selective)
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
    n, T, L = 120, 6, 10
    mem = make_memory([n], L=L, seed=23)
    spec = [(0, p) for p in range(100, 120)]
    q, qd, qp = make_queries(spec, T=T, seed=24)
    m = build(*mode, tile_elems=1 << 12)
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
@EVERY_MODE
def test_stepwise_queries_and_beam_reorder(mode):
    m = build(*mode)
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
@SELECTIVE_AND_DENSE
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


@EVERY_MODE
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


@SELECTIVE_AND_DENSE
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
