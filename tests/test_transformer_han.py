"""transformer_han (Miculicich et al. 2018): HAN equations by hand, context
splitting, masking and missing context, padding invariance, incremental
decoding with beam reorder, context never crossing documents, the collater's
layout, host reads and what --max-tokens bounds. Statistics, hooks, the CLIs
(train, generate, iterative decoding, interactive), two-stage initialisation
and contrastive scoring: tests/test_transformer_han_cli.py."""

import os

import pytest
import torch

import ctx_fairseq  # noqa: F401
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from ctx_fairseq.models.transformer_dc import _dummy_dictionary
from ctx_fairseq.modules.han_attention import (
    HierarchicalContextAttention,
    decoder_inputs,
    split_context,
)
from fairseq_cli_utils import (
    TINY_MODEL_ARGS,
)
from han_utils import (
    VOCAB,
    K,
    HAN_ARGS,
    HAN_ENC_ARGS,
    build,
    sentences,
    pad_rows,
    context_row,
    batch,
    single,
    run,
)


# --------------------------------------------------------------------------- the module


def test_split_context_padding_separator_and_nearest_k():
    d = _dummy_dictionary(VOCAB)
    pad, eos, bos = d.pad(), d.eos(), d.bos()
    sep = d.add_symbol("<sep>")
    a, b, c, e = [torch.tensor(x) for x in ([5, 6, eos], [7, eos], [8, 8, 8, eos], [9, eos])]
    rows = [context_row([a, b, c]), context_row([]), context_row([a]),
            context_row([a, b, c, e]), torch.tensor([5, sep, 6, 6, sep, eos, 7, eos])]
    for left in (True, False):
        for extra in (0, 4):
            toks = pad_rows(rows, pad, left, width=max(len(r) for r in rows) + extra)
            s, present = split_context(toks, pad, (eos, sep), eos, 3, non_words=(bos,))
            assert s.shape[0] == 5 * 3
            got = [[x for x in r.tolist() if x != pad] for r in s]
            assert got[0:3] == [[5, 6, eos], [7, eos], [8, 8, 8, eos]]
            assert got[3:6] == [[], [], []]
            assert got[6:9] == [[], [], [5, 6, eos]]  # slot k-1 is the nearest sentence
            assert got[9:12] == [[7, eos], [8, 8, 8, eos], [9, eos]]  # the 3 nearest of 4
            # separator ends a sentence and becomes </s>; a sentence without words leaves
            # its slot empty and the others keep the slots of their distance (so that
            # source and target slot j are the same previous sentence)
            assert got[12:15] == [[6, 6, eos], [], [7, eos]]
            assert present.tolist() == [[True] * 3, [False] * 3, [False, False, True],
                                        [True] * 3, [True, False, True]]
            assert all(r[0] != pad for r, p in zip(s, present.view(-1)) if p)  # right-padded
    assert decoder_inputs(torch.tensor([[5, 6, eos, pad], [pad] * 4]), pad, eos).tolist() == \
        [[eos, 5, 6, pad], [pad] * 4]


def _han(C=8, heads=2, k=3, detach=True):
    torch.manual_seed(0)
    han = HierarchicalContextAttention(C, heads, 16, k, dropout=0.0, detach_inputs=detach)
    with torch.no_grad():
        for p in han.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return han.double().eval()


def _mha(attn, q, k, v, mask):
    """Multi-head attention by hand with the module's parameters (q: 1 x C,
    k/v: n x C, mask: n bool, True = ignore)."""
    H = attn.num_heads
    hd = q.size(-1) // H
    Q = (q @ attn.q_proj.weight.T + attn.q_proj.bias).view(1, H, hd).transpose(0, 1) * hd ** -0.5
    Kp = (k @ attn.k_proj.weight.T + attn.k_proj.bias).view(-1, H, hd).transpose(0, 1)
    Vp = (v @ attn.v_proj.weight.T + attn.v_proj.bias).view(-1, H, hd).transpose(0, 1)
    scores = (Q @ Kp.transpose(1, 2)).masked_fill(mask.view(1, 1, -1), float("-inf"))
    out = (scores.softmax(-1) @ Vp).transpose(0, 1).reshape(1, -1)
    return out @ attn.out_proj.weight.T + attn.out_proj.bias


def _ln(norm, x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)


def test_han_equations_by_hand():
    """Eq. 1-6 for every query word, computed by hand, including a sentence
    with one context sentence and one with none (d = 0, h~ = LN(lambda h))."""
    han = _han()
    C, k = 8, 3
    T, B, L = 4, 3, 5
    g = torch.Generator().manual_seed(3)
    h = torch.randn(T, B, C, generator=g).double()
    ctx = torch.randn(L, B * k, C, generator=g).double()
    mask = torch.rand(B * k, L, generator=g) < 0.3
    mask[:, 1] = False
    present = torch.tensor([[True, True, True], [False, False, True], [False, False, False]])
    mask[~present.view(-1)] = True
    out, info = han(h, ctx, mask, present)
    for b in range(B):
        for t in range(T):
            ht = h[t, b].view(1, C)
            s = []
            for j in range(k):
                if present[b, j]:
                    r = b * k + j
                    s.append(_ln(han.word_norm, _mha(han.word_attn, ht, ctx[:, r], ctx[:, r],
                                                     mask[r])))  # Eq. 1-2
            if s:
                S = torch.cat(s)
                u = _mha(han.sent_attn, ht, S, S, torch.zeros(len(s), dtype=torch.bool))
                f = han.fc2(torch.relu(han.fc1(u)))
                dt = _ln(han.ffn_norm, u + f)  # Eq. 3-4
            else:
                dt = torch.zeros(1, C).double()
            lam = torch.sigmoid(torch.cat([ht, dt], -1) @ han.gate.weight.T + han.gate.bias)
            want = _ln(han.out_norm, lam * ht + (1 - lam) * dt)  # Eq. 5-6
            assert torch.allclose(out[t, b], want[0], atol=1e-10), (b, t)
            assert torch.allclose(info["gate"][t, b], lam[0], atol=1e-12)
    assert info["has_context"].tolist() == [True, True, False]
    assert info["gate"].shape == h.shape  # a vector gate


def test_han_masks_and_missing_context_keep_gradients_finite():
    han = _han(detach=False).float().train()
    C, k, T, B, L = 8, 3, 3, 2, 4
    h = torch.randn(T, B, C, requires_grad=True)
    ctx = torch.randn(L, B * k, C, requires_grad=True)
    present = torch.zeros(B, k, dtype=torch.bool)
    present[0, 2] = True
    mask = torch.ones(B * k, L, dtype=torch.bool)
    mask[2, :2] = False
    out, _ = han(h, ctx, mask, present)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(h.grad).all()
    assert torch.isfinite(ctx.grad).all()
    # only the present sentence's key words receive gradient
    assert ctx.grad[:2, 2].abs().sum() > 0
    assert ctx.grad[2:, 2].abs().sum() == 0 and ctx.grad[:, [0, 1, 3, 4, 5]].abs().sum() == 0
    # masked key words do not change the output
    with torch.no_grad():
        ctx2 = ctx.detach().clone()
        ctx2[2:, 2] += 5.0
        ctx2[:, 3:] += 5.0
        han.eval()
        a, _ = han(h, ctx.detach(), mask, present)
        b, _ = han(h, ctx2, mask, present)
    assert torch.allclose(a, b, atol=1e-6)


def test_detached_inputs_reach_the_model_only_through_the_gate():
    han = _han(detach=True).float()
    h = torch.randn(2, 1, 8, requires_grad=True)
    ctx = torch.randn(3, 3, 8, requires_grad=True)
    present = torch.ones(1, 3, dtype=torch.bool)
    out, info = han(h, ctx, torch.zeros(3, 3, dtype=torch.bool), present)
    out.sum().backward()
    assert ctx.grad is None
    assert h.grad is not None and torch.isfinite(h.grad).all()
    assert han.word_attn.k_proj.weight.grad.abs().sum() > 0  # the HAN itself trains


# --------------------------------------------------------------------------- the model


def test_structure_presets_and_sides():
    for arch, side, dim in (("transformer_han", "both", 512),
                            ("transformer_han_enc", "encoder", 512),
                            ("transformer_han_dec", "decoder", 512),
                            ("transformer_han_tiny", "both", 64)):
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           ["/dev/null", "--arch", arch])
        assert args.han_side == side and args.han_context_sentences == 3
        assert args.encoder_embed_dim == dim
    enc, _ = build(arch="transformer_han_tiny", extra=["--han-side", "encoder"])
    assert enc.encoder.han is not None and enc.decoder.han is None
    assert not enc.uses_target_context
    dec, _ = build(arch="transformer_han_dec")
    assert dec.encoder.han is None and dec.decoder.han is not None and dec.uses_target_context
    both, _ = build(extra=["--han-heads", "4", "--han-ffn-dim", "24"])
    assert both.encoder.han.word_attn.num_heads == 4 and both.decoder.han.fc1.out_features == 24
    names = {n for n, _ in both.named_parameters()}
    assert "encoder.han.gate.weight" in names and "decoder.han.word_attn.k_proj.weight" in names
    # the sentence-level names are fairseq's transformer's
    base, _ = build(arch="transformer", extra=[])
    han_names = {n for n, _ in both.han_parameters()}
    assert names - han_names == {n for n, _ in base.named_parameters()}


def test_full_forward_uses_the_context():
    model, d = build()
    net, parts = batch(d, [3, 3], 1)
    net["src_tokens"][1] = net["src_tokens"][0]
    net["prev_output_tokens"][1] = net["prev_output_tokens"][0]
    out = run(model, net)
    assert torch.isfinite(out).all()
    assert not torch.allclose(out[0], out[1])  # same sentence, different context


@pytest.mark.parametrize("src_left", [True, False])
def test_padding_invariance(src_left):
    """Each sentence with its context gives the same output alone and in a
    batch of longer ones (left/right-padded source, wider context padding,
    sentences with 0-3 previous sentences)."""
    model, d = build()
    net, parts = batch(d, [3, 0, 1, 2, 3], 5, src_left=src_left, extra_width=7)
    full = run(model, net)
    enc = model.encoder(net["src_tokens"], src_ctx_tokens=net["src_ctx_tokens"],
                        tgt_ctx_tokens=net["tgt_ctx_tokens"])
    for b in range(5):
        one = single(parts, b, d.pad(), src_left)
        alone = run(model, one)
        n = one["prev_output_tokens"].size(1)
        assert torch.allclose(full[b, :n], alone[0], atol=1e-9), b
        e1 = model.encoder(one["src_tokens"], src_ctx_tokens=one["src_ctx_tokens"],
                           tgt_ctx_tokens=one["tgt_ctx_tokens"])["encoder_out"][0][:, 0]
        m = e1.size(0)
        got = enc["encoder_out"][0][-m:, b] if src_left else enc["encoder_out"][0][:m, b]
        assert torch.allclose(got, e1, atol=1e-10), b


def test_no_context_rows_pass_through_the_gate_with_zero_context():
    """A first sentence (no context) gets d = 0: its output is LN(lambda h)
    of the sentence-level states, whatever the context width."""
    model, d = build()
    net, parts = batch(d, [0], 7, extra_width=5)
    enc = model.encoder(net["src_tokens"], src_ctx_tokens=net["src_ctx_tokens"],
                        tgt_ctx_tokens=net["tgt_ctx_tokens"])
    plain = model.encoder.forward_scriptable(net["src_tokens"])["encoder_out"][0]
    han = model.encoder.han
    lam = torch.sigmoid(han.gate(torch.cat([plain, torch.zeros_like(plain)], -1)))
    assert torch.allclose(enc["encoder_out"][0], han.out_norm(lam * plain), atol=1e-12)
    with pytest.raises(ValueError, match="no context inputs"):
        model.encoder(net["src_tokens"])
    with pytest.raises(ValueError, match="previous target sentences"):
        model.encoder(net["src_tokens"], src_ctx_tokens=net["src_ctx_tokens"])


def test_context_sentences_are_encoded_alone_by_the_sentence_encoder():
    model, d = build()
    net, parts = batch(d, [2], 9)
    sents, present = model.encoder.split(net["src_ctx_tokens"])
    filled = model.encoder.fill_empty(sents, present)
    assert filled[0].tolist() == [d.eos()] + [d.pad()] * (sents.size(1) - 1)  # an empty slot
    assert torch.equal(filled[1:], sents[1:])
    states = model.encoder.encode_sentences(filled, present, torch.zeros(1, 1, 32).double())
    for j, s in enumerate(parts["sctx"][0]):
        alone = model.encoder.forward_scriptable(s.view(1, -1))["encoder_out"][0][:, 0]
        assert torch.allclose(states[:len(s), K - 2 + j], alone, atol=1e-12)
    assert states[:, 0].abs().sum() == 0 and not present[0, 0]


@pytest.mark.parametrize("grad", [False, True])
def test_context_gradient_option(grad):
    """Default: the previous sentences are encoded and decoded without
    gradients (detached HAN inputs); --han-context-grad keeps them."""
    model, d = build(extra=["--han-context-grad"] if grad else [], double=False)
    model.train()
    net, _ = batch(d, [2, 1], 21)
    enc = model.encoder(net["src_tokens"], src_ctx_tokens=net["src_ctx_tokens"],
                        tgt_ctx_tokens=net["tgt_ctx_tokens"])
    assert enc["han_ctx_src_out"][0].requires_grad == grad
    states, _ = model.decoder.context_states(enc, torch.arange(2))
    assert states.requires_grad == grad
    assert model.encoder.han.detach_inputs != grad and model.decoder.han.detach_inputs != grad
    run(model, net).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("extra", [[], ["--cross-self-attention"]])
def test_decoder_context_is_the_previous_targets_decoded_over_their_sources(extra):
    model, d = build(extra=extra)
    net, parts = batch(d, [2], 11)
    enc = model.encoder(net["src_tokens"], src_ctx_tokens=net["src_ctx_tokens"],
                        tgt_ctx_tokens=net["tgt_ctx_tokens"])
    states, mask = model.decoder.context_states(enc, torch.tensor([0]))
    for j in range(2):
        src, tgt = parts["sctx"][0][j], parts["tctx"][0][j]
        e = model.encoder.forward_scriptable(src.view(1, -1))
        prev = torch.cat([tgt[-1:], tgt[:-1]]).view(1, -1)
        y, _ = model.decoder.extract_features_scriptable(prev, e)
        slot = K - 2 + j
        assert torch.allclose(states[:len(tgt), slot], y[0], atol=1e-10)
        # keys: every decoder input position but the leading </s>
        assert mask[slot, :len(tgt)].tolist() == [True] + [False] * (len(tgt) - 1)
    assert mask[0].all()


@pytest.mark.parametrize("arch", ["transformer_han_tiny", "transformer_han_dec"])
def test_incremental_equals_full_forward_with_beam_reorder(arch):
    """Step-by-step decoding equals the full forward pass, also after the
    batch is reordered and shrunk as beam search does."""
    model, d = build(arch=arch)
    net, parts = batch(d, [3, 1, 0, 2], 13)
    enc = model.encoder(net["src_tokens"], src_ctx_tokens=net["src_ctx_tokens"],
                        tgt_ctx_tokens=net["tgt_ctx_tokens"])
    # expand for a beam of 2, as fairseq does before decoding
    order = torch.arange(4).repeat_interleave(2)
    enc = model.encoder.reorder_encoder_out(enc, order)
    prev = net["prev_output_tokens"].index_select(0, order)
    full, _ = model.decoder(prev, enc)
    # fairseq's SequenceGenerator makes the encoder-decoder attention "beamable";
    # the context sentences must still be decoded one row each
    model.decoder.set_beam_size(2)
    assert torch.allclose(model.decoder(prev, enc)[0], full, atol=1e-12)
    state = {}
    T = prev.size(1)
    steps = []
    for t in range(T):
        o, _ = model.decoder(prev[:, :t + 1], enc, incremental_state=state)
        steps.append(o[:, -1])
    inc = torch.stack(steps, 1)
    real = prev.ne(d.pad())
    # fairseq's incremental attention normalises in float32
    assert torch.allclose(inc[real], full[real], atol=1e-5)
    # reorder mid-way (beam reorder + a finished sentence dropped), continue
    state = {}
    for t in range(2):
        model.decoder(prev[:, :t + 1], enc, incremental_state=state)
    new = torch.tensor([1, 0, 3, 3, 6, 7])
    model.decoder.reorder_incremental_state_scripting(state, new)
    enc2 = model.encoder.reorder_encoder_out(enc, new)
    prev2 = prev.index_select(0, new)
    full2, _ = model.decoder(prev2, enc2)
    for t in range(2, T):
        o, _ = model.decoder(prev2[:, :t + 1], enc2, incremental_state=state)
        r = real.index_select(0, new)[:, t]
        assert torch.allclose(o[:, -1][r], full2[:, t][r], atol=1e-5), t


def test_beam_search_decodes_the_context_once_per_sentence(monkeypatch):
    from fairseq.sequence_generator import SequenceGenerator

    model, d = build(double=False)
    net, parts = batch(d, [3, 2], 17)
    calls = []
    real = model.decoder.context_states

    def spy(encoder_out, rows):
        calls.append((encoder_out["han_ctx_tgt_tokens"][0].size(0), rows.numel()))
        return real(encoder_out, rows)

    monkeypatch.setattr(model.decoder, "context_states", spy)
    gen = SequenceGenerator([model], d, beam_size=3, max_len_b=6)
    sample = {"net_input": {k: v for k, v in net.items() if k != "prev_output_tokens"}}
    sample["net_input"]["src_lengths"] = net["src_tokens"].ne(d.pad()).sum(1)
    hyps = gen.generate([model], sample)
    assert len(hyps) == 2 and all(len(h) == 3 for h in hyps)
    # computed at the first step only, for the 2 sentences' 2*k context rows
    assert calls == [(2 * K, 2 * 3)]


def test_context_does_not_cross_documents(toy_bin):
    """Through the task's batches: each row's context sentences are the
    previous sentences of its own document (at most k), never another's."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [toy_bin, "--arch", "transformer_han_tiny", *HAN_ARGS, "--max-tokens", "400"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    model = task.build_model(cfg.model)
    d = task.source_dictionary
    itr = task.get_batch_iterator(ds, max_tokens=400, seed=1).next_epoch_itr(shuffle=True)
    seen_first = 0
    for sample in itr:
        ni = sample["net_input"]
        for side, base in (("src", ds.base.src), ("tgt", ds.base.tgt)):
            sents, present = model.encoder.split(ni[f"{side}_ctx_tokens"])
            for r, i in enumerate(sample["id"].tolist()):
                pos = int(ds.sent_pos[i])
                want = [base[j].tolist() for j in range(i - min(pos, K), i)]
                got = [[x for x in sents[r * K + j].tolist() if x != d.pad()]
                       for j in range(K) if present[r, j]]
                assert got == want, (side, i)
                seen_first += pos == 0
    assert seen_first > 0
    # and the model's rows are independent: another row's context changes nothing
    sample = next(iter(task.get_batch_iterator(ds, max_tokens=400, seed=1).next_epoch_itr(
        shuffle=False)))
    model.eval()
    out = model(**sample["net_input"])[0]
    ni = dict(sample["net_input"])
    ni["src_ctx_tokens"] = ni["src_ctx_tokens"].clone()
    ni["src_ctx_tokens"][1:] = ni["src_ctx_tokens"][1:].flip(0)
    out2 = model(**ni)[0]
    assert torch.allclose(out[0], out2[0], atol=1e-5)


def test_build_checks_the_context_options(toy_bin):
    def build_with(argv):
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           [toy_bin, *TINY_MODEL_ARGS, *argv])
        cfg = convert_namespace_to_omegaconf(args)
        return tasks.setup_task(cfg.task).build_model(cfg.model)

    with pytest.raises(ValueError, match="--target-context-size 3"):
        build_with(["--arch", "transformer_han", "--task", "document_translation",
                    "--source-context-size", "3", "--target-context-size", "1"])
    with pytest.raises(ValueError, match="--source-context-size 3"):
        build_with(["--arch", "transformer_han_enc", "--task", "document_translation",
                    "--source-context-size", "1"])
    with pytest.raises(ValueError, match="--context-direction prev"):
        build_with(["--arch", "transformer_han_enc", *HAN_ENC_ARGS, "--context-direction",
                    "both"])
    m = build_with(["--arch", "transformer_han_enc", "--task", "document_translation",
                    "--source-context-size", "2", "--han-context-sentences", "2"])
    assert m.encoder.k == 2


def test_custom_separator(toy_bin):
    """--context-separator SYMBOL (a symbol that no valid sentence contains)
    ends each context sentence instead of </s>."""
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(os.path.join(toy_bin, "dict.src.txt"))
    valid = data_utils.load_indexed_dataset(os.path.join(toy_bin, "valid.src-tgt.src"), d)
    used = set(torch.cat([valid[i] for i in range(len(valid))]).tolist())
    sep = next(d[i] for i in range(d.nspecial, len(d)) if i not in used)
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [toy_bin, "--arch", "transformer_han_tiny", *HAN_ARGS, "--context-separator", sep])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    assert model.encoder.separator == task.source_dictionary.index(sep) != d.eos()
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    i = next(i for i in range(len(ds)) if ds.sent_pos[i] == 2)
    s = ds.collater([ds[i]])
    ctx = s["net_input"]["src_ctx_tokens"]
    assert (ctx == model.encoder.separator).sum() == 1  # first sentence ends with SYMBOL
    sents, present = model.encoder.split(ctx)
    got = [[x for x in r.tolist() if x != task.source_dictionary.pad()] for r in sents[1:]]
    assert got == [ds.base.src[i - 2].tolist(), ds.base.src[i - 1].tolist()]
    assert present.tolist() == [[False, True, True]]


def _task_and_model(toy_bin, argv, arch="transformer_han_tiny"):
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [toy_bin, "--arch", arch, *TINY_MODEL_ARGS, "--dropout", "0", *argv])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    return task, model, cfg


@pytest.mark.parametrize("separator", [False, True])
def test_collater_lays_out_the_context_sentences_as_split_context(toy_bin, separator):
    """The task's collater builds the HAN's B x k x L context rows and the
    present mask on the CPU (no host reads in the model): exactly what
    split_context computes from the concatenated context, for every batch of
    the toy data (both sides, first sentences without context, a custom
    separator), and the model's output is the same from either."""
    from fairseq.data import Dictionary

    argv = list(HAN_ARGS)
    if separator:
        d = Dictionary.load(os.path.join(toy_bin, "dict.src.txt"))
        argv += ["--context-separator", d[d.nspecial + 3]]
    task, model, _ = _task_and_model(toy_bin, argv)
    model = model.double().eval()
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    d = task.source_dictionary
    itr = task.get_batch_iterator(ds, max_tokens=300, seed=1).next_epoch_itr(shuffle=False)
    n_batches = n_empty = 0
    for sample in itr:
        ni = sample["net_input"]
        B = ni["src_tokens"].size(0)
        for side in ("src", "tgt"):
            rows, present = split_context(ni[f"{side}_ctx_tokens"], d.pad(),
                                          (d.eos(), ds.separator), d.eos(), K,
                                          non_words=(d.bos(),))
            got = ni[f"{side}_ctx_sentences"]
            assert got.shape == (B, K, rows.size(1))
            assert torch.equal(got.view(B * K, -1), rows), side
            assert torch.equal(ni[f"{side}_ctx_present"], present), side
            n_empty += int((~present).sum())
        with torch.no_grad():
            out = model(**ni)[0]
            old = {k: v for k, v in ni.items() if not k.endswith(("_sentences", "_present"))}
            ref = model(**old)[0]
        assert torch.allclose(out, ref, atol=1e-10)
        n_batches += 1
    assert n_batches > 1 and n_empty > 0
    # the encoder-only HAN gets the rows of the source side only
    task2, _, _ = _task_and_model(toy_bin, HAN_ENC_ARGS, arch="transformer_han_enc")
    task2.load_dataset("valid")
    ds2 = task2.datasets["valid"]
    ni = ds2.collater([ds2[i] for i in range(4)])["net_input"]
    assert "src_ctx_sentences" in ni and "tgt_ctx_sentences" not in ni


def _host_reads(fn):
    from ctx_fairseq.host_reads import HostReadCounter

    with HostReadCounter() as reads:
        fn()
    return reads.total


def test_no_host_reads_beyond_the_transformers(toy_bin):
    """A training forward + backward and a beam search of the HAN (batches
    of the task's collater) read back to the host exactly what fairseq's
    transformer reads on the same batch: nothing in the HAN's own code (no
    splitting, no nonzero, no per-row selection), and the extra passes over
    the previous sentences run fairseq's modules without its padding checks
    (encode_static / decode_static)."""
    from omegaconf import OmegaConf
    from fairseq.dataclass.configs import GenerationConfig

    gen_cfg = OmegaConf.structured(GenerationConfig)
    gen_cfg.beam, gen_cfg.max_len_a, gen_cfg.max_len_b, gen_cfg.min_len = 3, 0, 6, 6

    def measure(arch, argv):
        task, model, cfg = _task_and_model(toy_bin, [*argv, "--criterion",
                                                     "label_smoothed_cross_entropy_ctx"], arch)
        crit = task.build_criterion(cfg.criterion)
        task.load_dataset("valid")
        ds = task.datasets["valid"]
        sample = ds.collater([ds[i] for i in range(0, 6)])  # first sentences included
        model.train()

        def step():
            crit(model, sample)[0].backward()

        train = _host_reads(step)
        model.eval()
        gen = task.build_generator([model], gen_cfg)
        with torch.no_grad():
            beam = _host_reads(lambda: task.inference_step(gen, [model], sample))
        return train, beam

    t_train, t_beam = measure("transformer", ["--task", "translation"])
    assert t_train > 0 and t_beam > 0  # fairseq's own reads
    assert measure("transformer_han_tiny", [*HAN_ARGS, "--gold-target-context"]) == \
        (t_train, t_beam)
    assert measure("transformer_han_enc", HAN_ENC_ARGS) == (t_train, t_beam)


def test_static_passes_equal_fairseqs():
    """encode_static / decode_static (fairseq's encoder and decoder passes
    with the padding masks always given, no host reads) compute what
    fairseq's own passes compute, on rows with and without padding, and
    read nothing back to the host."""
    from ctx_fairseq.models._fairseq_utils import decode_static, encode_static

    model, d = build()
    net, _ = batch(d, [1, 1, 1], 23)
    for src in (net["src_tokens"], net["src_tokens"][:, -2:]):  # padded; no padding
        ref = model.encoder.forward_scriptable(src)
        assert torch.allclose(encode_static(model.encoder, src), ref["encoder_out"][0],
                              atol=1e-12)
        for prev in (net["prev_output_tokens"], net["prev_output_tokens"][:, :2]):
            want, _ = model.decoder.extract_features_scriptable(prev, ref)
            got = decode_static(model.decoder, prev, ref["encoder_out"][0],
                                ref["encoder_padding_mask"][0])
            assert torch.allclose(got, want, atol=1e-12)
    assert not net["src_tokens"][:, -2:].eq(d.pad()).any()
    assert _host_reads(lambda: encode_static(model.encoder, net["src_tokens"])) == 0
    ref = model.encoder.forward_scriptable(net["src_tokens"])
    assert _host_reads(lambda: decode_static(model.decoder, net["prev_output_tokens"],
                                             ref["encoder_out"][0],
                                             ref["encoder_padding_mask"][0])) == 0


# --------------------------------------------------------------------------- --max-tokens


def _synthetic_han_task(argv, src_lengths, tgt_lengths, docs):
    """``(task, dataset)``: the document task of ``argv`` over ``docs``
    documents (in memory) whose sentences have the given source and target
    lengths (cycled through); the dataset is wrapped before the model is built
    (as fairseq-train loads the validation split)."""
    from fairseq.data import LanguagePairDataset

    from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

    args = options.parse_args_and_arch(options.get_training_parser(),
                                       ["/dev/null", *TINY_MODEL_ARGS, "--dropout", "0", *argv])
    cfg = convert_namespace_to_omegaconf(args)
    d = _dummy_dictionary(VOCAB)
    task = DocumentTranslationTask(cfg.task, d, d)
    n = docs * len(src_lengths)
    src = sentences(d, [src_lengths[i % len(src_lengths)] for i in range(n)], 1)
    tgt = sentences(d, [tgt_lengths[i % len(tgt_lengths)] for i in range(n)], 2)
    base = LanguagePairDataset(src, [len(x) for x in src], d, tgt, [len(x) for x in tgt], d,
                               shuffle=False)
    doc_ids = [f"doc{i // len(src_lengths)}" for i in range(n)]
    task.datasets["valid"] = task.wrap(base, doc_ids, "<synthetic>")
    return task, cfg


def _built_tokens(model, sample, monkeypatch):
    """``(encoder side, decoder side)``: the token positions of the tensors the
    HAN's forward builds for ``sample``: ``B x S`` plus the ``(B*k) x L`` rows
    of the previous source sentences it encodes, ``B x T`` plus the ``(B*k) x
    L`` rows of the previous target sentences it decodes (HAN decoder)."""
    import ctx_fairseq.models.transformer_han as han

    seen = {"src": 0, "tgt": 0}
    real_enc, real_dec = han.HANEncoder.encode_sentences, han.decoder_inputs

    def enc(self, sentences, present, like):
        seen["src"] += sentences.numel()
        return real_enc(self, sentences, present, like)

    def dec(tokens, pad, eos):
        seen["tgt"] += tokens.numel()
        return real_dec(tokens, pad, eos)

    monkeypatch.setattr(han.HANEncoder, "encode_sentences", enc)
    monkeypatch.setattr(han, "decoder_inputs", dec)
    ni = sample["net_input"]
    with torch.no_grad():
        model(**ni)
    monkeypatch.undo()
    return (ni["src_tokens"].numel() + seen["src"],
            ni["prev_output_tokens"].numel() + seen["tgt"])


@pytest.mark.parametrize("side,batching", [("both", []), ("encoder", []),
                                           ("both", ["--document-batching"])])
def test_max_tokens_bounds_what_the_han_builds(side, batching, monkeypatch):
    """Batches the task makes for the HAN with --max-tokens M: the tensors the
    HAN's forward builds (B x S source and the B x k x L rows of the previous
    sentences it encodes; B x T target and, with the HAN decoder, the B x k x L
    rows it decodes) never exceed M on either side. Counting the context as
    the concatenated B x Tc tensor (what the task delivers) would: the data
    mixes long and short sentences, so k x the longest context sentence is
    well above the concatenated length."""
    M = 240
    argv = ["--arch", "transformer_han_tiny", "--han-side", side, *HAN_ARGS, *batching]
    src_lengths, tgt_lengths = [24, 2, 3, 2, 19, 2, 4], [3, 21, 2, 2, 3, 17, 2]
    task, cfg = _synthetic_han_task(argv, src_lengths, tgt_lengths, docs=6)
    ds = task.datasets["valid"]
    assert ds.context_layout == {"src": "concatenated", "tgt": "concatenated",
                                 "memory": "shared"}  # no model yet
    model = task.build_model(cfg.model, from_checkpoint=True).eval()
    want = {"src": "sentences", "tgt": "sentences" if side == "both" else "concatenated",
            "memory": "shared"}
    assert ds.context_layout == want  # the split loaded before the model knows it now
    assert task.wrap(ds.base, ["d"] * len(ds), "<x>").context_layout == want  # and new ones

    def sizes(dataset):
        itr = task.get_batch_iterator(dataset, max_tokens=M, seed=1, disable_iterator_cache=True)
        out = [_built_tokens(model, s, monkeypatch) for s in itr.next_epoch_itr(shuffle=False)]
        assert sum(len(b) for b in itr.frozen_batches) == len(dataset)
        return out

    built = sizes(ds)
    assert max(max(e, d) for e, d in built) <= M
    # the count is exact where the HAN lays the context out (not just a bound)
    itr = task.get_batch_iterator(ds, max_tokens=M, seed=1, disable_iterator_cache=True)
    for (enc, dec), b in zip(built, itr.frozen_batches):
        p = ds._part_lengths(b).max(0)
        assert enc == len(b) * (p[0] + p[1])
        if side == "both":
            assert dec == len(b) * (p[2] + p[3])
    assert max(max(e, d) for e, d in built) > M // 2  # the batches are full, not tiny
    # the concatenated count (the task's tensors) lets the HAN build more than M
    task2, _ = _synthetic_han_task(argv, src_lengths, tgt_lengths, docs=6)
    over = sizes(task2.datasets["valid"])
    assert max(max(e, d) for e, d in over) > M


def test_an_over_long_sentence_is_an_error():
    """A sentence whose context the HAN builds larger than --max-tokens (k
    rows of its longest previous sentence) is an error, never a silent
    truncation, even where its concatenated context would fit."""
    # sentence 1: source 2 after a sentence of 40 tokens: concatenated 2 + 40 = 42, as
    # the HAN builds it 2 + 3 x 40 = 122 (three rows of 40, two of them padding)
    task, cfg = _synthetic_han_task(["--arch", "transformer_han_tiny", "--han-side", "encoder",
                                     *HAN_ENC_ARGS], [40, 2], [4, 4], docs=1)
    ds = task.datasets["valid"]
    order = ds.ordered_indices()
    assert len(ds.batch_by_size(order, max_tokens=100)) >= 1  # concatenated count: fits
    task.build_model(cfg.model, from_checkpoint=True)
    assert ds.num_tokens(1) == 122
    with pytest.raises(ValueError, match=r"sentence 1 with its context needs 122 tokens .*3 rows "
                                         r"of its longest sentence.*--max-tokens 100"):
        ds.batch_by_size(ds.ordered_indices(), max_tokens=100)
    with pytest.raises(ValueError, match="needs 122 tokens"):
        task.get_batch_iterator(ds, max_tokens=100, seed=1, disable_iterator_cache=True)
    assert len(ds.batch_by_size(ds.ordered_indices(), max_tokens=122)) >= 1
