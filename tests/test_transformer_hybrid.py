"""transformer_hybrid (Xu et al., ACL 2019): hybrid local/global self-attention."""

import argparse

import pytest
import torch
from torch.overrides import TorchFunctionMode

import ctx_fairseq  # noqa: F401  (registers the model)
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.modules.multihead_attention import MultiheadAttention
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from ctx_fairseq.models.transformer_hybrid import (
    HybridTransformerDecoderLayer,
    HybridTransformerEncoderLayer,
    TransformerHybridModel,
    hybrid_attention_modules,
)
from ctx_fairseq.modules.hybrid_attention import (
    GAUSSIAN_MODES,
    HYBRID_MODES,
    HybridAttentionConfig,
    HybridMultiheadAttention,
)
from fairseq_cli_utils import (
    assert_translates_test_split,
    hypotheses,
    states_from_sentence_checkpoint,
    train,
    train_and_generate,
    train_from_sentence_checkpoint,
    training_task_and_cfg,
)

D, HEADS = 16, 2


# ----------------------------------------------------------------- helpers
def make_dict(n=30):
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"w{i}")
    return d


class FakeTask:
    def __init__(self, d):
        self.source_dictionary = d
        self.target_dictionary = d


def tiny_args(**kw):
    a = dict(arch="transformer_hybrid", encoder_layers=2, decoder_layers=2,
             encoder_embed_dim=D, decoder_embed_dim=D, encoder_ffn_embed_dim=32,
             decoder_ffn_embed_dim=32, encoder_attention_heads=HEADS,
             decoder_attention_heads=HEADS, dropout=0.0)
    a.update(kw)
    return argparse.Namespace(**a)


def build(dictionary=None, **kw):
    torch.manual_seed(0)
    model = TransformerHybridModel.build_model(tiny_args(**kw), FakeTask(dictionary or make_dict()))
    # non-zero gate weights, so that gates vary with the token
    for _, m in hybrid_attention_modules(model):
        if m.gate_proj is not None:
            torch.nn.init.normal_(m.gate_proj.weight, std=1.0)
    return model.double().eval()


def attention(mode="gate", window=1, causal=False, per_head=False, seed=0):
    torch.manual_seed(seed)
    m = HybridMultiheadAttention(D, HEADS, HybridAttentionConfig(mode, window, per_head),
                                 causal=causal)
    if m.gate_proj is not None:
        torch.nn.init.normal_(m.gate_proj.weight, std=1.0)
    return m.double().eval()


def run(m, x, kpm=None, attn_mask=None, **kw):
    return m(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask, **kw)


def layer_cfg(**kw):
    return TransformerConfig.from_namespace(tiny_args(**kw))


# ------------------------------------------------------- the equations
def test_local_equals_global_when_window_covers_sentence():
    T, B = 6, 3
    x = torch.randn(T, B, D, dtype=torch.float64)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1, :2] = True  # left padding
    kpm[2, -1] = True  # right padding
    for window in (T - 1, T, 50):
        m = attention("gate", window)
        m.gate_override = 0.0
        glob, _ = run(m, x, kpm)
        m.gate_override = 1.0
        loc, _ = run(m, x, kpm)
        torch.testing.assert_close(loc, glob, rtol=0, atol=1e-12)
    # and the local-only mode equals fairseq's plain attention with the same weights
    m = attention("local", T)
    ref = MultiheadAttention(D, HEADS, self_attention=True).double().eval()
    ref.load_state_dict(m.state_dict())
    torch.testing.assert_close(run(m, x, kpm)[0], ref(x, x, x, key_padding_mask=kpm)[0],
                               rtol=0, atol=1e-12)


def test_small_window_restricts_local_pattern():
    T, B, m_ = 7, 2, 1
    m = attention("local", m_)
    x = torch.randn(T, B, D, dtype=torch.float64)
    out, w = run(m, x, need_head_weights=True)  # H x B x T x S
    i = torch.arange(T)
    outside = (i.view(-1, 1) - i.view(1, -1)).abs() > m_
    assert (w[..., outside] == 0).all()
    assert (w[..., ~outside] > 0).all()
    # changing a word farther than m from position 0 does not change its local output
    x2 = x.clone()
    x2[4] = torch.randn(B, D, dtype=torch.float64)
    out2, _ = run(m, x2)
    torch.testing.assert_close(out2[0], out[0], rtol=0, atol=1e-12)
    assert (out2[4] - out[4]).abs().max() > 1e-3
    # while the global pattern (gate mode, g = 0) does see it
    g = attention("gate", m_)
    g.gate_override = 0.0
    assert (run(g, x2)[0][0] - run(g, x)[0][0]).abs().max() > 1e-6


def test_gate_mixes_global_and_local_as_eq4_and_eq5():
    T, B = 5, 3
    x = torch.randn(T, B, D, dtype=torch.float64)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[0, :2] = True
    m = attention("gate", 1)
    m.record_gates = True
    out, _ = run(m, x, kpm)
    g = m.last_gate  # T x B x 1
    expected_g = torch.sigmoid(x @ m.gate_proj.weight.t())  # Eq. (5)
    torch.testing.assert_close(g, expected_g)
    assert g.std() > 0.05  # depends on the token
    m.record_gates = False
    m.gate_override = 0.0
    out0, _ = run(m, x, kpm)
    m.gate_override = 1.0
    out1, _ = run(m, x, kpm)
    # out_proj is affine and (1-g) + g = 1, so Eq. (4) holds after the projection too
    torch.testing.assert_close(out, (1 - g) * out0 + g * out1, rtol=0, atol=1e-12)


def test_gate_per_head():
    T, B = 5, 2
    x = torch.randn(T, B, D, dtype=torch.float64)
    shared = attention("gate", 1)
    per_head = attention("gate", 1, per_head=True)
    assert per_head.gate_proj.weight.shape == (HEADS, D)
    sd = {k: v for k, v in shared.state_dict().items() if not k.startswith("gate_proj")}
    per_head.load_state_dict(sd, strict=False)
    with torch.no_grad():  # every head with the shared gate's weights: same model
        per_head.gate_proj.weight.copy_(shared.gate_proj.weight.expand(HEADS, D))
    torch.testing.assert_close(run(per_head, x)[0], run(shared, x)[0], rtol=0, atol=1e-12)
    torch.nn.init.normal_(per_head.gate_proj.weight)
    per_head.record_gates = True
    run(per_head, x)
    assert per_head.last_gate.shape == (T, B, HEADS)
    assert not torch.allclose(per_head.last_gate[..., 0], per_head.last_gate[..., 1])


def _count_products(fn):
    seen = []

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in ("bmm", "matmul", "einsum", "baddbmm", "scaled_dot_product_attention"):
                seen.append(name)
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return seen


@pytest.mark.parametrize("mode", ["gate", "local"])
def test_single_energy_product_and_cached_band(mode):
    m = attention(mode, 2)
    x = torch.randn(9, 2, D, dtype=torch.float64)
    products = _count_products(lambda: run(m, x))
    assert len(products) == 2, products  # QK^T once, probabilities x V once
    builds = m.band_masks.builds
    assert builds == 1
    for T in (3, 9, 20, 9):
        run(m, torch.randn(T, 2, D, dtype=torch.float64))
    assert m.band_masks.builds == builds  # sliced from the cached mask, not rebuilt


def test_gaussian_biases():
    T, B = 6, 2
    x = torch.randn(T, B, D, dtype=torch.float64)
    # NEIGHBOR: centred on the query itself, so a query's largest bias is on itself
    m = attention("gauss-window", 1)
    bias = m._gaussian_bias(x, None, B, T, T, torch.float64)  # B x 1 x T x S
    assert bias.shape == (B, 1, T, T)
    assert (bias.argmax(-1).squeeze(1) == torch.arange(T)).all()
    assert (bias.diagonal(dim1=-2, dim2=-1) == 0).all() and (bias <= 0).all()
    # LOCAL H: fixed width D = 2m+1, predicted centre P_i in (0, I)
    m = attention("gauss-center", 2)
    c = T * m.center_predictor(x).t()
    bias = m._gaussian_bias(x, None, B, T, T, torch.float64)
    pos = torch.arange(T, dtype=torch.float64)
    expected = -((pos.view(1, 1, -1) - c.unsqueeze(-1)) ** 2) / (2 * (5 / 2) ** 2)
    torch.testing.assert_close(bias.squeeze(1), expected)
    # parameters: one predictor for window/centre, two for both
    n = lambda mode: sum(p.numel() for p in attention(mode).parameters())  # noqa: E731
    base = sum(p.numel() for p in MultiheadAttention(D, HEADS, self_attention=True).parameters())
    assert n("gauss-window") - base == n("gauss-center") - base == D * D + D + D
    assert n("gauss-both") - base == 2 * (D * D + 2 * D)


# ----------------------------------------------- equivalence with fairseq
def test_gate_zero_equals_fairseq_layers():
    cfg = layer_cfg()
    hyb_cfg = HybridAttentionConfig("gate", 1)
    torch.manual_seed(1)
    ref = TransformerEncoderLayerBase(cfg).double().eval()
    hyb = HybridTransformerEncoderLayer(cfg, hyb_cfg).double().eval()
    missing, unexpected = hyb.load_state_dict(ref.state_dict(), strict=False)
    assert missing == ["self_attn.gate_proj.weight"] and not unexpected
    hyb.self_attn.gate_override = 0.0
    T, B = 7, 3
    x = torch.randn(T, B, D, dtype=torch.float64)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1, :3] = True
    kpm[2, -2:] = True
    real = ~kpm.t()
    out_ref, out_hyb = ref(x, kpm), hyb(x, kpm)
    assert (out_ref[real] - out_hyb[real]).abs().max() < 1e-12
    hyb.self_attn.gate_override = None  # a real gate changes the output
    assert (ref(x, kpm)[real] - hyb(x, kpm)[real]).abs().max() > 1e-4

    # decoder layer: causal global pattern == fairseq's masked self-attention
    dref = TransformerDecoderLayerBase(cfg, no_encoder_attn=True).double().eval()
    dhyb = HybridTransformerDecoderLayer(cfg, hyb_cfg, no_encoder_attn=True).double().eval()
    dhyb.load_state_dict(dref.state_dict(), strict=False)
    dhyb.self_attn.gate_override = 0.0
    causal = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
    a = dref(x, self_attn_mask=causal)[0]
    b = dhyb(x, self_attn_mask=causal)[0]
    assert (a - b).abs().max() < 1e-12


def test_state_dict_compatible_with_transformer():
    d = make_dict()
    hyb = build(d, hybrid_mode="gate", hybrid_encoder_layers="all", hybrid_decoder_layers="1")
    torch.manual_seed(3)
    base = TransformerModel.build_model(
        tiny_args(arch="transformer"), FakeTask(d)).double().eval()
    missing, unexpected = hyb.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected
    assert sorted(missing) == sorted(
        ["encoder.layers.0.self_attn.gate_proj.weight",
         "encoder.layers.1.self_attn.gate_proj.weight",
         "decoder.layers.0.self_attn.gate_proj.weight"])


# ------------------------------------------------------------- padding
@pytest.mark.parametrize("mode", HYBRID_MODES)
def test_encoder_padding_invariance(mode):
    d = make_dict()
    model = build(d, hybrid_mode=mode, hybrid_encoder_layers="all", hybrid_window=1)
    pad = d.pad()
    torch.manual_seed(5)
    sent = torch.randint(d.nspecial, len(d), (5,))
    others = torch.randint(d.nspecial, len(d), (2, 9))

    def enc(tokens):
        lengths = tokens.ne(pad).sum(1)
        return model.encoder(tokens, src_lengths=lengths)["encoder_out"][0]

    alone = enc(sent.unsqueeze(0))[:, 0]
    for left in (True, False):
        row = torch.full((9,), pad)
        if left:
            row[-5:] = sent
        else:
            row[:5] = sent
        batch = torch.cat([others[:1], row.unsqueeze(0), others[1:]])
        out = enc(batch)[:, 1]
        out = out[-5:] if left else out[:5]
        assert torch.isfinite(enc(batch)).all()
        assert (out - alone).abs().max() < 1e-10, (mode, left)


# ------------------------------------------------------ half precision
LONG = 200  # words: the Gaussian bias reaches -2 * 200^2 / D^2


def _long_batch(causal):
    """``T x B x C`` inputs of a 200-word sentence and a 163-word one (left
    padded), their key padding mask (encoder) or future mask (decoder), and the
    real tokens' mask (``T x B``)."""
    g = torch.Generator().manual_seed(1)
    x = 3 * torch.randn(LONG, 2, D, generator=g)
    if causal:
        return x, None, torch.triu(torch.full((LONG, LONG), float("-inf")), 1), \
            torch.ones(LONG, 2, dtype=torch.bool)
    kpm = torch.zeros(2, LONG, dtype=torch.bool)
    kpm[1, :37] = True
    return x, kpm, None, ~kpm.t()


def _gauss_attention(mode, causal, narrow=False):
    """A float32 Gaussian-mode attention with large energies (``|xi|`` in the
    hundreds, so that ``finfo(float16).min + xi`` overflows); ``narrow``: the
    predicted window vanishes (``D_i`` at its 1e-3 floor), so that every key of a
    row whose predicted centre falls between two words gets a bias below
    float16's range."""
    torch.manual_seed(0)
    m = HybridMultiheadAttention(D, HEADS, HybridAttentionConfig(mode, 1), causal=causal)
    with torch.no_grad():
        m.q_proj.weight.mul_(4)
        if narrow:
            m.window_predictor.proj.bias.fill_(3.0)
            m.window_predictor.score.weight.fill_(-1.0)
    return m.eval()


def _relative_errors(m, dtype, causal, autocast):
    """``|y - y_fp32| / max|y_fp32|`` over the real tokens, where ``y`` is ``m``
    cast to ``dtype`` (as ``fairseq-train --fp16`` casts the model), or run
    under CPU autocast, and ``y_fp32`` the float32 module on the same (rounded)
    weights and inputs: the error of the arithmetic, not of the rounded inputs."""
    x, kpm, mask, real = _long_batch(causal)
    with torch.no_grad():
        if autocast:
            ref = m(x, x, x, key_padding_mask=kpm, attn_mask=mask, need_weights=False)[0]
            with torch.autocast("cpu", dtype=dtype):
                y = m(x, x, x, key_padding_mask=kpm, attn_mask=mask, need_weights=False)[0]
        else:
            m = m.to(dtype)
            xq = x.to(dtype)
            y = m(xq, xq, xq, key_padding_mask=kpm, need_weights=False,
                  attn_mask=None if mask is None else mask.to(dtype))[0]
            m = m.float()
            xq = xq.float()
            ref = m(xq, xq, xq, key_padding_mask=kpm, attn_mask=mask, need_weights=False)[0]
    y = y.float()
    assert torch.isfinite(y[real]).all(), "non-finite outputs at real tokens"
    return (y - ref)[real].abs() / ref[real].abs().max()


# max relative error against float32 (see _relative_errors): float16 keeps 11
# significant bits, bfloat16 8; a Gaussian centre predicted as I * sigmoid(.)
# moves by I x the rounding of its input projection (up to 0.4 words of a
# 200-word sentence in bfloat16), which moves a D = 3 Gaussian's weights;
# under autocast the float32 reference also keeps the unrounded input.
HALF_TOLERANCE = {(torch.float16, False): 0.02, (torch.bfloat16, False): 0.15,
                  (torch.bfloat16, True): 0.25}


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("mode", GAUSSIAN_MODES)
@pytest.mark.parametrize("dtype, autocast", list(HALF_TOLERANCE),
                         ids=["float16", "bfloat16", "autocast-bfloat16"])
def test_gaussian_modes_in_half_precision_match_float32(mode, causal, dtype, autocast):
    """200-word sentences, energies in the hundreds: finite, and within
    HALF_TOLERANCE of float32 (measured: float16 <= 0.008, bfloat16 <= 0.08,
    autocast bfloat16 <= 0.20). Before the bias was added in float32, float16 came to 0.039 for
    gauss-center."""
    err = _relative_errors(_gauss_attention(mode, causal), dtype, causal, autocast)
    assert err.max() <= HALF_TOLERANCE[dtype, autocast], (mode, err.max())


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("mode", ["gauss-window", "gauss-both"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_gaussian_bias_below_half_range_stays_finite(mode, causal, dtype):
    """A vanishing predicted window (``D_i = 1e-3``) on 200-word sentences puts
    the bias of most keys, and with gauss-both's fractional centres of every key
    of a row, far below float16's range. The output stays finite and close to
    float32 on average (mean relative error; the maximum is not defined here:
    with such a window a row's output jumps from one word to its neighbour when
    the predicted centre crosses the midpoint, which rounding may move it
    across). Before: float16 gave NaN rows (decoder) and a mean error of 0.058
    (encoder) for gauss-both, as finfo(float16).min + xi overflowed to -inf."""
    err = _relative_errors(_gauss_attention(mode, causal, narrow=True), dtype, causal, False)
    assert err.mean() <= (0.01 if dtype == torch.float16 else 0.02), (mode, err.mean())


def test_gaussian_bias_is_float32_for_half_energies():
    """The bias is never cast down to half precision: float32 for float16/bfloat16
    energies (the add and the softmax run in float32), the energy's own dtype
    for float32/float64."""
    m = attention("gauss-both", 1)
    x = torch.randn(5, 2, D, dtype=torch.float64)
    assert m._gaussian_bias(x, None, 2, 5, 5, torch.float64).dtype == torch.float64
    m = m.half()
    for dtype in (torch.float16, torch.bfloat16):
        assert m._gaussian_bias(x.half(), None, 2, 5, 5, dtype).dtype == torch.float32
    assert m.center_predictor(x.half()).dtype == torch.float32


def test_gate_never_sees_padding():
    """The gate of a real token depends only on that token's input; the local
    pattern gives padded keys zero weight."""
    m = attention("gate", 2)
    T, B = 6, 2
    x = torch.randn(T, B, D, dtype=torch.float64)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[0, :2] = True
    x2 = x.clone()
    x2[:2, 0] = 1e3 * torch.randn(2, D, dtype=torch.float64)  # garbage at the pads
    m.record_gates = True
    out1, w = run(m, x, kpm, need_head_weights=True)
    g1 = m.last_gate
    out2, _ = run(m, x2, kpm)
    torch.testing.assert_close(m.last_gate[2:, 0], g1[2:, 0], rtol=0, atol=0)
    torch.testing.assert_close(out2[2:, 0], out1[2:, 0], rtol=0, atol=1e-12)
    assert (w[:, 0, 2:, :2] == 0).all()


# -------------------------------------------------------------- decoder
@pytest.mark.parametrize("mode", HYBRID_MODES)
def test_decoder_incremental_equals_full_with_reorder(mode):
    d = make_dict()
    model = build(d, hybrid_mode=mode, hybrid_decoder_layers="all", hybrid_window=1)
    torch.manual_seed(7)
    # two sentences x beam 2 (a beam shares its source: fairseq keeps one encoder-
    # attention cache per sentence); the reorder moves hypotheses within a beam
    B, L, k = 4, 7, 3
    src = torch.randint(d.nspecial, len(d), (2, 6))
    src[0, :2] = d.pad()  # left padding
    src = src.repeat_interleave(2, dim=0)
    lengths = src.ne(d.pad()).sum(1)
    a = torch.randint(d.nspecial, len(d), (B, L))
    a[:, 0] = d.eos()
    c = torch.randint(d.nspecial, len(d), (B, L))
    new_order = torch.tensor([1, 1, 3, 2])

    enc = model.encoder(src, src_lengths=lengths)
    inc = {}
    steps = []
    for t in range(L):
        if t == k:  # beam reorder between steps
            model.decoder.reorder_incremental_state_scripting(inc, new_order)
            enc = model.encoder.reorder_encoder_out(enc, new_order)
        tokens = a[:, : t + 1] if t < k else torch.cat([a[new_order, :k], c[:, k : t + 1]], 1)
        steps.append(model.decoder(tokens, encoder_out=enc, incremental_state=inc)[0][:, -1])
    full_tokens = torch.cat([a[new_order, :k], c[:, k:]], 1)
    full = model.decoder(full_tokens, encoder_out=enc)[0]
    for t in range(L):
        step = steps[t][new_order] if t < k else steps[t]
        diff = (step - full[:, t]).abs().max()
        assert diff < 1e-6, (mode, t, diff)

    # causality: changing later tokens leaves earlier outputs unchanged
    changed = full_tokens.clone()
    changed[:, 4:] = torch.randint(d.nspecial, len(d), (B, L - 4))
    full2 = model.decoder(changed, encoder_out=enc)[0]
    assert (full2[:, :4] - full[:, :4]).abs().max() < 1e-12
    assert (full2[:, 4:] - full[:, 4:]).abs().max() > 1e-6


def test_decoder_causal_band():
    m = attention("local", 2, causal=True)
    T = 6
    x = torch.randn(T, 1, D, dtype=torch.float64)
    causal = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
    _, w = run(m, x, attn_mask=causal, need_head_weights=True)
    i = torch.arange(T)
    diff = i.view(-1, 1) - i.view(1, -1)
    inside = (diff >= 0) & (diff <= 2)
    assert (w[..., ~inside] == 0).all() and (w[..., inside] > 0).all()


# ------------------------------------------------------------- options
def test_bad_options_give_clear_errors():
    with pytest.raises(ValueError, match="--hybrid-window.*non-negative"):
        build(hybrid_window=-1)
    with pytest.raises(ValueError, match="--hybrid-encoder-layers.*out of range"):
        build(hybrid_encoder_layers="1-3")
    with pytest.raises(ValueError, match="--hybrid-decoder-layers.*out of range"):
        build(hybrid_decoder_layers="0")
    with pytest.raises(ValueError, match="--hybrid-mode"):
        build(hybrid_mode="sliding")
    with pytest.raises(ValueError, match="--hybrid-gate-per-head"):
        build(hybrid_mode="local", hybrid_gate_per_head=True)


def test_layer_selection_and_defaults():
    model = build(encoder_layers=3, decoder_layers=3)  # paper defaults: encoder 1-2
    assert [n for n, _ in hybrid_attention_modules(model)] == ["encoder.1", "encoder.2"]
    model = build(encoder_layers=3, decoder_layers=3, hybrid_encoder_layers="1,3",
                  hybrid_decoder_layers="2-3", hybrid_window=4, hybrid_mode="concat")
    mods = hybrid_attention_modules(model)
    assert [n for n, _ in mods] == ["encoder.1", "encoder.3", "decoder.2", "decoder.3"]
    assert all(m.window == 4 and m.mode == "concat" for _, m in mods)
    assert [m.causal for _, m in mods] == [False, False, True, True]
    assert build(hybrid_encoder_layers="none").encoder.hybrid_layers == ()


def test_bad_window_through_cli(toy_bin, tmp_path):
    with pytest.raises(ValueError, match="--hybrid-window"):
        train([toy_bin, "--arch", "transformer_hybrid", "--encoder-layers", "2",
               "--decoder-layers", "1", "--encoder-embed-dim", "16",
               "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "16",
               "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2",
               "--decoder-attention-heads", "2", "--hybrid-window", "-2",
               "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500",
               "--max-update", "1", "--save-dir", str(tmp_path), "--no-progress-bar",
               "--disable-validation", "--num-workers", "0"])


# ----------------------------------------------------- parameter budget
def test_gate_parameter_overhead_on_base_transformer():
    d = Dictionary()
    for i in range(32000 - d.nspecial):
        d.add_symbol(f"tok{i}")

    def count(cls, arch):
        args = argparse.Namespace(arch=arch)
        model = cls.build_model(args, FakeTask(d))
        return sum(p.numel() for p in model.parameters())

    base = count(TransformerModel, "transformer_wmt_en_de")
    hybrid = count(TransformerHybridModel, "transformer_hybrid_wmt_en_de")
    overhead = hybrid - base
    assert overhead == 2 * 512  # one 512-vector w per hybrid layer (Eq. 5), lowest two
    assert overhead / base <= 1e-4  # at most 0.01%


# ------------------------------------------------- through fairseq's CLIs
@pytest.mark.parametrize("mode", HYBRID_MODES)
def test_train_and_generate_cli(mode, toy_bin, tmp_path):
    extra = ["--hybrid-mode", mode, "--hybrid-window", "2"]
    if mode in ("gate", "local") + GAUSSIAN_MODES[-1:]:
        extra += ["--hybrid-decoder-layers", "1"]  # incremental beam search too
    if mode == "gate":
        extra += ["--hybrid-gate-per-head"]
    out = train_and_generate(toy_bin, str(tmp_path), "transformer_hybrid", extra=extra,
                             max_update=2)
    n_test = sum(1 for _ in open(f"{toy_bin}/test.docids"))
    assert len(hypotheses(out)) == n_test
    state = torch.load(f"{tmp_path}/checkpoint_last.pt", weights_only=True)
    keys = state["model"].keys()
    assert ("encoder.layers.0.self_attn.gate_proj.weight" in keys) == (mode == "gate")
    assert ("encoder.layers.1.self_attn.local_out_proj.weight" in keys) == (mode == "concat")


# ------------------------------------------------- two-stage training
SENTENCE_LEVEL = ["--task", "document_translation", "--source-context-size", "0",
                  "--share-all-embeddings"]


def _task_and_cfg(toy_bin, *extra):
    from fairseq_cli_utils import TINY_MODEL_ARGS

    return training_task_and_cfg([toy_bin, "--arch", "transformer_hybrid", *SENTENCE_LEVEL,
                                  *TINY_MODEL_ARGS, *extra])


@pytest.mark.parametrize("extra", [[], ["--hybrid-mode", "concat", "--hybrid-decoder-layers",
                                        "all"],
                                   ["--hybrid-mode", "gauss-both"]],
                         ids=["gate", "concat-dec", "gauss-both"])
def test_init_from_sentence_checkpoint(toy_bin, sentence_ckpt, extra, caplog):
    """Every parameter of the stage-1 transformer is loaded under its own
    name; the gates, local projections and position predictors keep their
    initialisation (equal to those of a model built with the same seed
    without the checkpoint); the log names the new tensors."""
    from ctx_fairseq.models.transformer_hybrid import is_hybrid_tensor

    task, cfg = _task_and_cfg(toy_bin, *extra, "--init-from-sentence-checkpoint", sentence_ckpt)
    ours, init, theirs = states_from_sentence_checkpoint(task, cfg, sentence_ckpt, caplog)
    new = [n for n in ours if is_hybrid_tensor(n)]
    shared = [n for n in ours if not is_hybrid_tensor(n)]
    assert set(shared) == set(theirs)  # every one
    for n in shared:
        assert torch.equal(ours[n], theirs[n].to(ours[n].dtype)), n
    assert not torch.equal(init["encoder.layers.0.self_attn.q_proj.weight"],
                           theirs["encoder.layers.0.self_attn.q_proj.weight"])
    assert new and all(n.startswith("encoder.layers.") for n in new) == (
        "--hybrid-decoder-layers" not in extra)
    for n in new:
        assert torch.equal(ours[n], init[n]), n
    log = caplog.text
    assert f"loaded {len(shared)} tensors" in log and f"fresh {len(new)} tensors" in log
    assert new[0] in log and "unused from the checkpoint: -" in log


def test_init_from_sentence_checkpoint_then_training_continues(toy_bin, sentence_ckpt, tmp_path):
    """fairseq-train from the stage-1 checkpoint: training runs, moves the
    loaded parameters and the gate, and the saved model generates."""
    import os

    from fairseq_cli_utils import TINY_MODEL_ARGS

    save = str(tmp_path / "hybrid")
    state, theirs = train_from_sentence_checkpoint(
        [toy_bin, "--arch", "transformer_hybrid", *SENTENCE_LEVEL, *TINY_MODEL_ARGS],
        sentence_ckpt, save)
    name = "encoder.layers.0.self_attn.q_proj.weight"
    w, start = state["model"][name].float(), theirs[name].float()
    assert torch.isfinite(w).all() and not torch.equal(w, start)
    assert (w - start).abs().max() < 0.05  # trained from there (3 steps of lr 1e-3)
    gate = state["model"]["encoder.layers.0.self_attn.gate_proj.weight"]
    assert gate.abs().max() > 0  # initialised at zero, trained
    assert_translates_test_split(toy_bin, os.path.join(save, "checkpoint_last.pt"),
                                 SENTENCE_LEVEL[:4])


def test_init_from_an_incompatible_checkpoint_is_an_error(toy_bin, sentence_ckpt, tmp_path):
    task, cfg = _task_and_cfg(toy_bin, "--decoder-layers", "3",
                              "--init-from-sentence-checkpoint", sentence_ckpt)
    with pytest.raises(ValueError, match=r"of this model's transformer tensors are not in "
                                         r"the checkpoint \(decoder.layers.2."):
        task.build_model(cfg.model)
    task, cfg = _task_and_cfg(toy_bin, "--encoder-layers", "1", "--hybrid-encoder-layers", "1",
                              "--init-from-sentence-checkpoint", sentence_ckpt)
    with pytest.raises(ValueError, match=r"tensors of the checkpoint have no place in this "
                                         r"model \(encoder.layers.1."):
        task.build_model(cfg.model)
    task, cfg = _task_and_cfg(toy_bin, "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
                              "--init-from-sentence-checkpoint", sentence_ckpt)
    with pytest.raises(ValueError, match=r"has shape \(\d+, 32\) there but \(\d+, 16\) here"):
        task.build_model(cfg.model)
    with pytest.raises(ValueError, match="encoder.embed_tokens.weight has shape"):
        build().load_sentence_checkpoint(sentence_ckpt)  # another vocabulary and size
    with pytest.raises(FileNotFoundError, match="no such file"):
        build().load_sentence_checkpoint(str(tmp_path / "missing.pt"))


def test_init_option_with_another_task_is_not_read_silently(caplog):
    """fairseq's translation task builds the model without reading the
    checkpoint (only document_translation knows a new run from a restored
    one): it says so."""
    import logging

    with caplog.at_level(logging.WARNING):
        TransformerHybridModel.build_model(
            tiny_args(init_from_sentence_checkpoint="stage1.pt"), FakeTask(make_dict()))
    assert "--init-from-sentence-checkpoint stage1.pt is not read by --task FakeTask" in caplog.text
