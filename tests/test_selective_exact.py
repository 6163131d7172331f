"""The selective attention's word level is exact and streamed
(:mod:`ctx_fairseq.modules.word_attention`): a token's result does not depend
on the layout (per query sentence or per document), on the blocks and tiles,
on incremental decoding, nor, bitwise, on the other documents of its batch;
its FLOPs are the formula of docs/transformer_selective_doc.md and its memory
grows linearly with the document; its attention dropout's backward is the
gradient of its forward."""

import contextlib

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ctx_fairseq.cli.bench_trace import LiveBytes
from ctx_fairseq.modules.cpu_shortcuts import accelerator_path
from ctx_fairseq.modules.selective_attention import WORD_CAPACITY, HierarchicalContextAttention
from ctx_fairseq.modules.word_attention import _StreamedWordAttention, tile_elems_for

pytestmark = pytest.mark.exactness  # run again under other CPU kernels in CI

C, H, S, L = 64, 4, 60, 6
MODES = [("hierarchical", "sparsemax", "softmax"), ("hierarchical", "sparsemax", "sparsemax"),
         ("hierarchical", "softmax", "softmax"), ("flat-word", "softmax", "softmax"),
         ("flat-sentence", "softmax", "softmax")]
IDS = ["sparse-soft", "sparse-sparse", "soft-soft", "flat-word", "flat-sentence"]


def _memory(m):
    g = torch.Generator().manual_seed(0)
    keys = 0.05 * torch.randn(S, L, C, generator=g, dtype=torch.double)  # near-equal scores
    mask = torch.ones(S, L, dtype=torch.bool)
    mask[7, 3:] = False
    return m.project_memory(keys, keys, mask, torch.zeros(S, dtype=torch.long), torch.arange(S))


def _run(m, q, grouped):
    mem = _memory(m)
    qd, qp = torch.zeros(1, dtype=torch.long), torch.tensor([S])  # online: sees all S sentences
    kw = {"query_groups": m.group_queries(mem, qd)} if grouped else {}
    return m(q, mem, qd, qp, True, return_stats=True, **kw)


def test_the_capacity_is_gone():
    assert WORD_CAPACITY == 0
    with pytest.raises(ValueError, match="removed"):
        HierarchicalContextAttention(C, H, word_capacity=4)


@pytest.mark.parametrize("grouped", [False, True], ids=["per-sentence", "per-document"])
def test_one_token_at_a_time_equals_the_whole_sentence(grouped):
    """Incremental decoding (one query token per step, per query sentence)
    equals the whole sentence's forward in either layout, with a support of
    more than 32 sentences (wider than any old capacity)."""
    torch.manual_seed(0)
    m = HierarchicalContextAttention(C, H).double().eval()
    q = torch.randn(3, 1, C, dtype=torch.double)
    with torch.no_grad():
        full, info = _run(m, q, grouped)
        assert float(info["sentence_support"]) > 32
        assert float(info["word_overflow_sum"]) == 0
        for t in range(3):
            step, _ = _run(m, q[t:t + 1], False)
            torch.testing.assert_close(step[0], full[t], rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_blocks_and_tiles_do_not_change_the_result(mode):
    outs = []
    for block, tile in ((32, 1 << 23), (1, 1), (7, 50), (64, 1 << 10)):
        torch.manual_seed(0)
        m = HierarchicalContextAttention(C, H, *mode, word_block=block, tile_elems=tile).double()
        q = torch.randn(3, 1, C, dtype=torch.double, requires_grad=True)
        out, _ = _run(m, q, True)
        out.sum().backward()
        outs.append((out.detach(), q.grad, [p.grad for p in m.parameters()]))
    for o, g, p in outs[1:]:
        torch.testing.assert_close(o, outs[0][0], rtol=0, atol=1e-12)
        torch.testing.assert_close(g, outs[0][1], rtol=0, atol=1e-12)
        for a, b in zip(p, outs[0][2]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def _batch(docs, C_, seed):
    """A collated batch as the task's collater gives it, for the module: each
    document ``(memory sentences, memory width, query sentences, query width)``
    with random lengths and vectors drawn from its own seed (a document is
    the same in every batch), tokens left-padded to the batch's widths
    (words, then ``</s>`` in the last column), its queries at its end
    (online); returns the module's inputs and the collater's index arguments
    (per-document groups, real query tokens and their counts, the memory by
    length)."""
    from ctx_fairseq.data.memory_index import memory_by_length, query_groups, query_token_groups
    from ctx_fairseq.modules.selective_memory import memory_layout

    L = max(w for _, w, _, _ in docs)
    T = max(w for _, _, _, w in docs)
    keys, mask, doc, pos, qs, q_len, qd, qp, mlen = [], [], [], [], [], [], [], [], []
    for d, spec in enumerate(docs):
        n, width, nq, qw = spec
        g = torch.Generator().manual_seed(seed * 1000 + sum(x * 31 ** i for i, x in enumerate(spec)))
        tok = torch.randint(2, width + 1, (n,), generator=g)
        tok[n // 3] = 1  # a sentence without words (only </s>)
        k = torch.zeros(n, L, C_)
        k[:, L - width:] = torch.randn(n, width, C_, generator=g)
        keys.append(k)
        mlen.append(tok)
        mask.append((torch.arange(L)[None] >= L - tok[:, None]) & (torch.arange(L)[None] < L - 1))
        doc.append(torch.full((n,), d))
        pos.append(torch.arange(n))
        ql = torch.randint(1, qw + 1, (nq,), generator=g)
        qv = torch.zeros(T, nq, C_)
        qv[T - qw:] = torch.randn(qw, nq, C_, generator=g)
        qs.append(qv)
        q_len.append(ql)
        qd.append(torch.full((nq,), d))
        qp.append(torch.arange(n - nq, n) + 1)
    keys, mask, doc, pos = torch.cat(keys), torch.cat(mask), torch.cat(doc), torch.cat(pos)
    q, q_len, qd, qp, mlen = torch.cat(qs, 1), torch.cat(q_len), torch.cat(qd), torch.cat(qp), \
        torch.cat(mlen)
    B = len(q_len)
    pad = torch.arange(T)[None] < T - q_len[:, None]  # B x T, True = padding (left)
    _, rows, valid = memory_layout(doc, pos)
    by = memory_by_length(rows.numpy(), valid.numpy(), mlen.numpy(), L, True)
    groups = query_groups(qd.numpy(), len(docs))
    tokens = query_token_groups(groups, q_len.numpy(), T, True)
    layout = dict(query_groups=torch.from_numpy(groups), query_tokens=torch.from_numpy(tokens),
                  group_rows=(tokens < B * T).sum(1))
    memory = (keys, mask, doc, pos, rows, valid,
              (by["mem_doc_rows_by_len"], by["mem_doc_len_order"], by["mem_doc_span_by_len"]))
    return q, pad, qd, qp, memory, layout


def _float64_layer(mode, q, memory):
    """A float64 layer (C 32, 4 heads, a random distance bias over 2 sentences)
    and float64 copies of the queries and the memory keys that need gradients."""
    torch.manual_seed(0)
    m = HierarchicalContextAttention(32, 4, *mode, sentence_distance=2).double()
    with torch.no_grad():
        m.distance_bias.normal_()
    return (m, q.double().clone().requires_grad_(),
            memory[0].double().clone().requires_grad_())


def _forward(m, q, pad, qd, qp, memory, layout, online=True):
    keys, mask, doc, pos, rows, valid, by_length = memory
    if layout is None:  # per query sentence, every token column
        pm = m.project_memory(keys, keys, mask, doc, pos, rows, valid)
        return m(q, pm, qd, qp, online, query_padding_mask=pad, return_stats=True)
    pm = m.project_memory(keys, keys, mask, doc, pos, rows, valid, by_length=by_length)
    return m(q, pm, qd, qp, online, query_padding_mask=pad, return_stats=True, **layout)


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_collated_layout_equals_per_sentence(mode):
    """The collater's layout (per document, real query tokens only, memory
    sentences by length, each document's own rows and columns) equals the
    per-sentence layout over every column at the real query tokens (values,
    statistics, gradients of the queries and the memory; float64), with
    documents of different sizes and widths."""
    docs = [(50, 9, 6, 7), (7, 4, 3, 5), (20, 14, 9, 3)]
    q, pad, qd, qp, memory, layout = _batch(docs, 32, 5)
    res = []
    for lay in (None, layout):
        m, qq, k = _float64_layer(mode, q, memory)
        out, info = _forward(m, qq, pad, qd, qp, (k,) + memory[1:], lay)
        real = (~pad).t().unsqueeze(-1)  # T x B x 1
        (out * real * torch.randn(out.shape, generator=torch.Generator().manual_seed(1),
                                  dtype=out.dtype)).sum().backward()
        res.append((out * real, info, qq.grad * real, k.grad,
                    [p.grad for p in m.parameters()]))
    (o1, i1, q1, k1, p1), (o2, i2, q2, k2, p2) = res
    torch.testing.assert_close(o2, o1, rtol=0, atol=1e-12)
    torch.testing.assert_close(q2, q1, rtol=0, atol=1e-12)
    torch.testing.assert_close(k2, k1, rtol=0, atol=1e-12)
    for a, b in zip(p1, p2):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)
    for key in ("sentence_support_sum", "visible_sentences_sum", "word_support_sum",
                "num_token_heads", "num_support_pairs"):
        if key in i1:
            torch.testing.assert_close(i2[key], i1[key], rtol=0, atol=1e-9)


@pytest.mark.parametrize("path", ["cpu", "accelerator"])
@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_a_sentence_does_not_depend_on_its_batch_bitwise(mode, path, one_thread):
    """Float32, CPU, head size 16, the collater's layout: the outputs and the
    query gradients of document A's sentences are bitwise the same alone and
    beside documents with more memory sentences, wider memory sentences (L),
    longer queries (T) and more query sentences (the batch's S_max, L, T, B,
    D and the padded widths of every index all change). It assumes what the
    CPU's GEMMs do on one thread: an output row's value does not depend on
    how many rows the product has (a compacted tile's row count follows the
    batch); checked on the default, AVX2 and AVX-512 kernels (CI runs this
    module under ATEN_CPU_CAPABILITY=default too). Both paths: the CPU's
    and the accelerator's (the selected sentences: their list, and its
    chunks, follow the batch)."""
    a = (40, 6, 10, 5)
    res = []
    ctx = accelerator_path if path == "accelerator" else contextlib.nullcontext
    for docs in ([a], [a, (100, 11, 20, 9)], [(3, 15, 2, 12), a, (60, 8, 4, 4)]):
        q, pad, qd, qp, memory, layout = _batch(docs, 64, 7)
        rows_a = (qd == docs.index(a)).nonzero().squeeze(1)
        torch.manual_seed(0)
        m = HierarchicalContextAttention(64, 4, *mode, sentence_distance=3)
        with torch.no_grad():
            m.distance_bias.normal_()
        qq = q.clone().requires_grad_()
        with ctx():
            out, _ = _forward(m, qq, pad, qd, qp, memory, layout)
            real = (~pad[rows_a]).t().unsqueeze(-1)
            (out[:, rows_a] * real).sum().backward()
        T = q.size(0)  # document A's queries: the last 5 positions (left padding)
        res.append(((out[:, rows_a] * real)[T - 5:].detach(),
                    (qq.grad[:, rows_a] * real)[T - 5:]))
    for o, g in res[1:]:
        assert torch.equal(o, res[0][0])
        assert torch.equal(g, res[0][1])


@pytest.mark.parametrize("mode", MODES[:3], ids=IDS[:3])
def test_cpu_path_equals_the_accelerators(mode):
    """On the CPU a tile of the hierarchical word level computes only the
    query rows that give one of its sentences a weight, and skips a tile of
    none (``compact``); the accelerator's path (the CPU's shortcuts off)
    computes the selected sentences only in the collater's per-document
    layout and whole tiles per query sentence (incremental decoding). Values,
    statistics and every gradient (queries, memory, parameters; float64)
    agree to 1e-12, in both layouts, with a window that leaves some queries
    one sentence and a document with an empty sentence; with the sparsemax
    sentence weights the CPU computes fewer FLOPs than whole tiles and more
    than the selected pairs."""
    docs = [(50, 9, 6, 7), (7, 4, 3, 5), (40, 14, 9, 3)]
    q, pad, qd, qp, memory, layout = _batch(docs, 32, 7)
    q = 4 * q  # sharper sentence weights: a few sentences each, as in a trained model
    window = torch.where(torch.arange(len(qd)) % 3 == 0, 1, 1000)
    for lay in (layout, None):
        res = []
        for compact in (False, True):
            m, qq, k = _float64_layer(mode, q, memory)
            keys, mask, doc, pos, rows, valid, by_length = (k,) + memory[1:]
            with (contextlib.nullcontext() if compact else accelerator_path()), \
                    FlopCounterMode(display=False) as fc:
                if lay is None:
                    pm = m.project_memory(keys, keys, mask, doc, pos, rows, valid)
                    out, info = m(qq, pm, qd, qp, True, query_padding_mask=pad,
                                  return_stats=True, query_window=window)
                else:
                    pm = m.project_memory(keys, keys, mask, doc, pos, rows, valid,
                                          by_length=by_length)
                    out, info = m(qq, pm, qd, qp, True, query_padding_mask=pad,
                                  return_stats=True, query_window=window, **lay)
                real = (~pad).t().unsqueeze(-1)
                (out * real * torch.randn(out.shape, generator=torch.Generator().manual_seed(1),
                                          dtype=out.dtype)).sum().backward()
            res.append((out * real, info, qq.grad * real, k.grad,
                        [p.grad for p in m.parameters()], fc.get_total_flops()))
        (o1, i1, q1, k1, p1, f1), (o2, i2, q2, k2, p2, f2) = res
        assert (o1 != 0).any()
        torch.testing.assert_close(o2, o1, rtol=0, atol=1e-12)
        torch.testing.assert_close(q2, q1, rtol=0, atol=1e-12)
        torch.testing.assert_close(k2, k1, rtol=0, atol=1e-12)
        for a, b in zip(p1, p2):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-12)
        for key in ("sentence_support_sum", "word_support_sum", "num_support_pairs"):
            assert float(i1[key]) == float(i2[key]), key
        if mode[1] == "sparsemax" and lay is None:  # against whole tiles
            assert f2 < f1, (f1, f2)
        elif mode[1] == "sparsemax":  # the accelerator's selected pairs: fewer still
            assert f1 < f2, (f1, f2)


def test_context_layer_on_the_real_query_tokens_equals_the_padded_batch():
    """DocumentContextLayer with the collater's ``query_tokens`` runs its
    layer norms, FFN and gate on the real query tokens only: ``r~``, ``d``
    and ``gamma`` at the real tokens, and every gradient, equal the padded
    batch's (float64); the padding keeps ``r~ = r``, and a sentence
    without context keeps ``r~ = r`` exactly."""
    from ctx_fairseq.modules.selective_attention import DocumentContextLayer

    from ctx_fairseq.data.memory_index import query_groups, query_token_groups

    docs = [(30, 9, 6, 7), (7, 4, 3, 5), (20, 14, 9, 3)]
    q, pad, qd, qp, memory, layout = _batch(docs, 32, 3)
    keys, mask, doc, pos, rows, valid, by_length = memory
    qp, qd = qp.clone(), qd.clone()
    qp[0] = 0  # online: the first query sees no sentence (no context)
    qd[7] = -1  # context dropout: a query without a document in the memory
    B, T = pad.shape
    groups = query_groups(qd.numpy(), len(docs))
    tokens = query_token_groups(groups, (~pad).sum(1).numpy(), T, True)
    layout = dict(query_groups=torch.from_numpy(groups), query_tokens=torch.from_numpy(tokens),
                  group_rows=(tokens < B * T).sum(1))
    real = (~pad).t().unsqueeze(-1)
    res = []
    for kind in ("padded", "real tokens", "D x M_max rows"):
        torch.manual_seed(0)
        m = DocumentContextLayer(32, 4, 48).double()
        r = q.double().clone().requires_grad_()
        pm = m.project_memory(keys.double(), keys.double(), mask, doc, pos, rows, valid,
                              by_length=by_length)
        kw = {"padded": dict(query_groups=layout["query_groups"]), "real tokens": layout,
              "D x M_max rows": dict(layout, group_rows=None)}[kind]
        out, info = m(r, pm, qd, qp, True, query_padding_mask=pad, return_stats=True, **kw)
        (out * real * torch.randn(out.shape, generator=torch.Generator().manual_seed(1),
                                  dtype=out.dtype)).sum().backward()
        res.append((out.detach(), info, r.grad, [p.grad for p in m.parameters()]))
        if kind != "padded":
            assert torch.equal(out.detach()[pad.t()], r.detach()[pad.t()])
        for b in (0, 7):  # no context: r~ = r
            assert torch.equal(out.detach()[:, b], r.detach()[:, b])
    o1, i1, g1, p1 = res[0]
    for o2, i2, g2, p2 in res[1:]:
        torch.testing.assert_close(o2 * real, o1 * real, rtol=0, atol=1e-12)
        torch.testing.assert_close(i2["d"] * real, i1["d"] * real, rtol=0, atol=1e-12)
        torch.testing.assert_close(i2["gate"] * real, i1["gate"] * real, rtol=0, atol=1e-12)
        torch.testing.assert_close(g2, g1, rtol=0, atol=1e-12)
        for a, b in zip(p1, p2):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-12)
        for key in ("gate_sum", "gate_tokens", "query_tokens"):
            torch.testing.assert_close(i2[key], i1[key], rtol=0, atol=1e-9)


@pytest.mark.parametrize("word_attn", ["softmax", "sparsemax"])
def test_compacted_dropout_backward_is_the_gradient_through_the_normaliser(word_attn):
    """``compact`` leaves the weights' gradient 0 in a tile's rows without
    weight and draws the dropout mask only where a weight is nonzero: with
    the weights from a sparsemax (as Eq. 3 gives them) ``gradcheck``
    (float64, fixed seed) of the whole passes, several tiles and blocks."""
    from ctx_fairseq.modules.sparsemax import sparsemax

    g = torch.Generator().manual_seed(0)
    G_, H_, M, d, S_, Lw, J = 2, 2, 5, 4, 6, 3, 6
    q = torch.randn(G_, H_, M, d, generator=g, dtype=torch.double, requires_grad=True)
    k = torch.randn(S_, H_, Lw, d, generator=g, dtype=torch.double, requires_grad=True)
    v = torch.randn(S_, H_, Lw, d, generator=g, dtype=torch.double, requires_grad=True)
    x = (3 * torch.randn(G_, H_, M, J, generator=g, dtype=torch.double)).requires_grad_()
    index = torch.tensor([[0, 1, 2, 3, 4, 5], [4, 3, 0, 5, 1, 2]])
    mask = torch.ones(S_, Lw, dtype=torch.bool)
    mask[1, 2] = False

    def f(q, k, v, x, compact=True):
        w = sparsemax(x)
        return _StreamedWordAttention.apply(q, k, v, w, index, mask, False, word_attn, 2, 5,
                                            0.3, 1234, False, None, None, compact)[0]

    w = sparsemax(x.detach())
    assert bool((w == 0).any()) and bool((w.view(G_, H_, M, 3, 2) == 0).all(-1).any())
    out = f(q, k, v, x)
    assert torch.equal(out, f(q, k, v, x))  # the same seed: the same mask
    assert not torch.equal(out, f(q, k, v, x, compact=False))  # its own masks
    assert torch.autograd.gradcheck(f, (q, k, v, x), eps=1e-6, atol=1e-5)


def _layer_inputs(n_sent, B=8, T=6, Lw=8, C_=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(n_sent, Lw, C_, generator=g)
    mask = torch.ones(n_sent, Lw, dtype=torch.bool)
    q = torch.randn(T, B, C_, generator=g)
    qd = torch.zeros(B, dtype=torch.long)
    qp = torch.arange(n_sent - B, n_sent) + 1
    return keys, mask, torch.zeros(n_sent, dtype=torch.long), torch.arange(n_sent), q, qd, qp


@pytest.mark.parametrize("mode", [MODES[0], MODES[3]], ids=["hierarchical", "flat-word"])
def test_flops_are_the_documented_formula(mode):
    """Matrix-product FLOPs of the word level on the accelerator's path
    (docs/transformer_selective_doc.md): hierarchical, the selected pairs
    only (``N``: the nonzero sentence weights, heads counted), forward ``4 N
    L d``, backward ``10 N L d`` (``d`` the head dim); flat-word, whole
    tiles, forward ``4 B T S_pad L C``, backward ``10 B T S_pad L C``
    (scores and ``g . v`` recomputed; dq, dk, dv), ``S_pad`` the memory index
    rounded up to whole blocks. The other products (projections, Eq. 3) do
    not grow with ``L`` this way."""
    B, T, Lw, C_, n = 8, 6, 8, 16, 100
    keys, mask, doc, pos, q, qd, qp = _layer_inputs(n, B, T, Lw, C_)
    res = {}
    for words in (Lw, 2 * Lw):  # the word level's share: the difference in L
        torch.manual_seed(0)
        m = HierarchicalContextAttention(C_, 2, *mode)
        k = torch.cat([keys, keys], 1)[:, :words]  # the same sentence keys (means)
        mk = torch.cat([mask, mask], 1)[:, :words]
        pm_args = (k, k, mk, doc, pos)
        qq = q.clone().requires_grad_()
        with accelerator_path():
            with FlopCounterMode(display=False) as fwd:
                pm = m.project_memory(*pm_args)
                out, info = m(qq, pm, qd, qp, True, query_groups=m.group_queries(pm, qd),
                              need_weights=mode[0] == "hierarchical")  # (flat: a pass more)
            with FlopCounterMode(display=False) as bwd:
                out.sum().backward()
        res[words] = (fwd.get_total_flops(), bwd.get_total_flops())
    if mode[0] == "hierarchical":
        pairs = int((info["sent_weights"] != 0).sum())
        assert 0 < pairs < B * T * 2 * n // 4  # sparsemax: a few sentences each
        per_word = pairs * (C_ // 2)  # N d per memory word column
    else:
        block = m.block_for(torch.device("cuda"))
        s_pad = -(-n // block) * block
        per_word = B * T * s_pad * C_  # B T S_pad C per memory word column
    proj = 2 * n * Lw * C_ * C_ * 2  # K_w and V projections of the extra L columns
    assert res[2 * Lw][0] - res[Lw][0] == 4 * per_word * Lw + proj
    # (the memory is an input without gradient: its projections' backward is
    # their weights' gradient only)
    assert res[2 * Lw][1] - res[Lw][1] == 10 * per_word * Lw + proj


@pytest.mark.parametrize("mode", [MODES[0], MODES[3]], ids=["hierarchical", "flat-word"])
def test_memory_grows_linearly_with_the_document(mode):
    """A small layer (C 16, H 2), 8 query sentences of 6 tokens at the end of
    a document of 100, 300 and 1,000 sentences of 16 words: the peak bytes of
    a forward and backward stay below the documented bound ``24 S L C + 40 B
    H T S_pad + 48 x tile`` (one more float32 tensor of the word scores'
    size, ``4 B H T S L`` bytes, would break it at 1,000 sentences) and grow
    linearly (the slopes per sentence within 1.5x)."""
    peaks = {}
    B, T, Lw, C_, H_ = 8, 6, 16, 16, 2
    for n in (100, 300, 1000):
        keys, mask, doc, pos, q, qd, qp = _layer_inputs(n, B, T, Lw, C_)
        torch.manual_seed(0)
        m = HierarchicalContextAttention(C_, H_, *mode)
        tracker = LiveBytes()
        with tracker:
            qq = q.clone().requires_grad_()
            pm = m.project_memory(keys, keys, mask, doc, pos)
            out, _ = m(qq, pm, qd, qp, True, query_groups=m.group_queries(pm, qd))
            out.sum().backward()
        block = m.block_for(torch.device("cpu"))
        s_pad = -(-n // block) * block
        tile = min(tile_elems_for("cpu", m.tile_elems), B * H_ * T * block * Lw)
        bound = 24 * n * Lw * C_ + 40 * B * H_ * T * s_pad + 48 * tile
        assert tracker.peak <= bound, (n, tracker.peak, bound)
        if n == 1000:
            assert bound < tracker.peak + 4 * B * H_ * T * n * Lw
        peaks[n] = tracker.peak
    slopes = [(peaks[300] - peaks[100]) / 200, (peaks[1000] - peaks[300]) / 700]
    assert max(slopes) <= 1.5 * min(slopes), (peaks, slopes)


@pytest.mark.parametrize("flat", [False, True], ids=["hierarchical", "flat-word"])
@pytest.mark.parametrize("word_attn", ["softmax", "sparsemax"])
def test_dropout_backward_is_the_gradient_of_the_forward(flat, word_attn):
    """With attention dropout the mask is drawn per tile from a seed; the
    backward regenerates it: ``gradcheck`` (float64) of the streamed word
    level with a fixed seed, several tiles and blocks."""
    if flat and word_attn == "sparsemax":
        pytest.skip("flat-word is a softmax")
    g = torch.Generator().manual_seed(0)
    G_, H_, M, d, S_, Lw, J = 2, 2, 3, 4, 5, 3, 4
    q = torch.randn(G_, H_, M, d, generator=g, dtype=torch.double, requires_grad=True)
    k = torch.randn(S_, H_, Lw, d, generator=g, dtype=torch.double, requires_grad=True)
    v = torch.randn(S_, H_, Lw, d, generator=g, dtype=torch.double, requires_grad=True)
    index = torch.tensor([[0, 1, 2, 3], [4, 3, 0, 0]])
    mask = torch.ones(S_, Lw, dtype=torch.bool)
    mask[1, 2] = False
    if flat:
        w = torch.randn(G_, H_, M, J, generator=g, dtype=torch.double)
        w[1, :, :, 2:] = float("-inf")
    else:
        w = torch.rand(G_, H_, M, J, generator=g, dtype=torch.double)
        w[1, :, :, 2:] = 0.0
    w.requires_grad_()

    def f(q, k, v, w):
        return _StreamedWordAttention.apply(q, k, v, w, index, mask, flat, word_attn, 2, 5,
                                            0.3, 1234, False)[0]

    out = f(q, k, v, w)
    assert (out != f(q, k, v, w) * 0).any()  # some weights are kept
    assert torch.equal(out, f(q, k, v, w))  # the same seed: the same mask
    finite_w = not flat  # -inf entries are not differentiable inputs for gradcheck
    if finite_w:
        assert torch.autograd.gradcheck(f, (q, k, v, w), eps=1e-6, atol=1e-5)
    else:
        assert torch.autograd.gradcheck(lambda q, k, v: f(q, k, v, w), (q, k, v),
                                        eps=1e-6, atol=1e-5)


def test_sentences_by_length_read_only_their_columns():
    """The collater's ``memory_by_length`` (left-padded tokens): one long
    sentence among short ones no longer makes every block read its width:
    fewer FLOPs, the same result (float64, 1e-12)."""
    import numpy as np

    from ctx_fairseq.data.memory_index import memory_by_length
    from ctx_fairseq.modules.selective_memory import memory_layout

    n, Lw = 96, 20
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(n, Lw, 16, generator=g, dtype=torch.double)
    tokens = torch.full((n,), 3)
    tokens[5] = Lw  # one long sentence
    # left-padded tokens: words then </s> in the last columns
    mask = (torch.arange(Lw)[None] >= Lw - tokens[:, None]) & (torch.arange(Lw)[None] < Lw - 1)
    doc, pos = torch.zeros(n, dtype=torch.long), torch.arange(n)
    _, rows, valid = memory_layout(doc, pos)
    by = memory_by_length(rows.numpy(), valid.numpy(), tokens.numpy(), Lw, True)
    by_length = (by["mem_doc_rows_by_len"], by["mem_doc_len_order"], by["mem_doc_span_by_len"])
    q = torch.randn(4, 6, 16, generator=g, dtype=torch.double)
    qd, qp = torch.zeros(6, dtype=torch.long), torch.arange(90, 96)
    res = []
    for bl in (None, by_length):
        torch.manual_seed(0)
        m = HierarchicalContextAttention(16, 2).double()
        qq = q.clone().requires_grad_()
        with FlopCounterMode(display=False) as fc:
            pm = m.project_memory(keys, keys, mask, doc, pos, rows, valid, by_length=bl)
            out, _ = m(qq, pm, qd, qp, True, query_groups=m.group_queries(pm, qd))
            out.sum().backward()
        res.append((out.detach(), qq.grad, fc.get_total_flops()))
    torch.testing.assert_close(res[1][0], res[0][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(res[1][1], res[0][1], rtol=0, atol=1e-12)
    assert res[1][2] < 0.7 * res[0][2]
    # the spans and order
    assert by["mem_doc_rows_by_len"][0, 0] == 5
    assert tuple(by["mem_doc_span_by_len"][0, 0]) == (0, Lw)
    assert tuple(by["mem_doc_span_by_len"][0, 1]) == (Lw - 3, Lw)
    assert sorted(by["mem_doc_len_order"][0].tolist()) == list(range(n))
    assert np.array_equal(by["mem_doc_rows_by_len"][0].numpy(),
                          rows[0].numpy()[by["mem_doc_len_order"][0].numpy()])


@pytest.mark.parametrize("scale", [0.01, 1.0, 10.0], ids=["wide-support", "support", "narrow"])
def test_sparsemax_partial_sort_is_the_full_sort_bitwise(scale):
    """On the CPU the sentence sparsemax seeks its threshold among the 64
    largest entries first: the same values bit for bit (and gradients) as
    the full sort, also where the support is wider (the full sort then
    runs) and with masked entries."""
    from ctx_fairseq.modules.sparsemax import _Sparsemax

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 20, 300, generator=g) * scale
    x[0, 0, :, 100:] = torch.finfo(torch.float32).min
    w = torch.randn(x.shape, generator=g)
    res = []
    for top in (_Sparsemax.TOP, 10 ** 9):
        old, _Sparsemax.TOP = _Sparsemax.TOP, top
        try:
            xx = x.clone().requires_grad_()
            out = _Sparsemax.apply(xx)
            (out * w).sum().backward()
            res.append((out.detach(), xx.grad))
        finally:
            _Sparsemax.TOP = old
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
    assert (int((res[0][0] > 0).sum(-1).max()) > 64) == (scale == 0.01)


def _sparsemax_and_grad(x, w):
    from ctx_fairseq.modules.sparsemax import _Sparsemax

    xx = x.clone().requires_grad_()
    out = _Sparsemax.apply(xx)
    (out * w).sum().backward()
    return out.detach(), xx.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparsemax_ties_break_by_the_outputs_support(dtype):
    """Rows built with entries at the threshold (``t + p`` with ``p`` on the
    simplex and zeros: those entries equal tau up to round-off). The forward's
    sorted count and the output's support then disagree on some rows; the
    gradient is the Jacobian of the output's support (it sums to 0 over the
    support, 0 outside), and output and gradient do not depend on the order of
    a row's entries, its width (masked entries added) or the sort that found
    tau (the CPU's partial sort against the full one)."""
    g = torch.Generator().manual_seed(0)
    rows, n = 4000, 8
    p = torch.rand(rows, n, generator=g, dtype=dtype)
    p[:, n // 2:] = 0
    p = p / p.sum(-1, keepdim=True)
    x = p + torch.randn(rows, 1, generator=g, dtype=dtype) * 3
    w = torch.randn(rows, n, generator=g, dtype=dtype)
    out, grad = _sparsemax_and_grad(x, w)
    on = out > 0
    # the sorted count of the forward (its support condition) differs from the
    # output's support on some rows: the test meets real ties
    z, _ = torch.sort(x - x.amax(-1, keepdim=True), dim=-1, descending=True)
    k = torch.arange(1, n + 1, dtype=dtype)
    count = (k * z > z.cumsum(-1) - 1).sum(-1)
    assert int((count != on.sum(-1)).sum()) > 10
    # the Jacobian of the output's support
    v = (w * on).sum(-1, keepdim=True) / on.sum(-1, keepdim=True).to(dtype)
    torch.testing.assert_close(grad, torch.where(on, w - v, torch.zeros_like(w)),
                               rtol=0, atol=0)
    tol = 1e-5 if dtype == torch.float32 else 1e-13
    assert float((grad * on).sum(-1).abs().max()) < tol
    # order, width and sort path: the output bit for bit (so the same support),
    # the gradient up to the round-off of its sum over the row (summed in
    # another order)
    perm = torch.randperm(n, generator=g)
    pad = 3 * 64  # wider than 2 * TOP: the CPU's partial sort
    wide = torch.cat([x[:, perm], torch.full((rows, pad), torch.finfo(dtype).min, dtype=dtype)], -1)
    w_wide = torch.cat([w[:, perm], torch.randn(rows, pad, generator=g, dtype=dtype)], -1)
    out2, grad2 = _sparsemax_and_grad(wide, w_wide)
    assert torch.equal(out2[:, :n], out[:, perm])
    torch.testing.assert_close(grad2[:, :n], grad[:, perm], rtol=0, atol=tol)
    assert not out2[:, n:].any() and not grad2[:, n:].any()


def test_sparsemax_an_entry_exactly_at_the_threshold_is_outside():
    """``[1, 0]``: tau = 0, so the second entry is at the threshold; and
    ``[.5, .5, 0]`` (two tied entries in, one at tau): weight 0 and gradient
    0 for the entry at tau, in any order."""
    for row, expect in (([1.0, 0.0], [1.0, 0.0]), ([0.5, 0.5, 0.0], [0.5, 0.5, 0.0])):
        for perm in ([0, 1, 2][:len(row)], [len(row) - 1] + list(range(len(row) - 1))):
            x = torch.tensor([row], dtype=torch.float64)[:, perm]
            w = torch.arange(1.0, len(row) + 1, dtype=torch.float64)[None]
            out, grad = _sparsemax_and_grad(x, w)
            e = torch.tensor([expect], dtype=torch.float64)[:, perm]
            assert torch.equal(out, e)
            at_tau = e == 0
            assert not grad[at_tau].any()
            assert abs(float(grad[~at_tau].sum())) < 1e-15
