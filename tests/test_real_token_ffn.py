"""fairseq's encoder and decoder layers with the FFN on the real tokens only
(:mod:`ctx_fairseq.modules.real_token_ffn`): at the real positions the
values and every gradient are fairseq's layer's (same parameters, float64),
the padding positions hold the residual path only, incremental steps and
unpadded batches run fairseq's code unchanged, and the parameter names are
fairseq's (checkpoints load either way)."""

import pytest
import torch
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from ctx_fairseq.modules.real_token_ffn import (
    RealTokenDecoderLayer,
    RealTokenEncoderLayer,
    RealTokenLinear,
)

pytestmark = pytest.mark.usefixtures("one_thread")

C, F_, T, B = 16, 40, 7, 5


def _cfg(normalize_before):
    cfg = TransformerConfig()
    for side in (cfg.encoder, cfg.decoder):
        side.embed_dim, side.ffn_embed_dim, side.attention_heads = C, F_, 4
        side.normalize_before = normalize_before
    cfg.dropout = cfg.attention_dropout = cfg.activation_dropout = 0.0
    return cfg


def _pair(kind, normalize_before):
    cfg = _cfg(normalize_before)
    ours_cls, theirs_cls = ((RealTokenEncoderLayer, TransformerEncoderLayerBase) if kind == "encoder"
                            else (RealTokenDecoderLayer, TransformerDecoderLayerBase))
    torch.manual_seed(0)
    ours = ours_cls(cfg).double()
    theirs = theirs_cls(cfg).double()
    theirs.load_state_dict(ours.state_dict())  # the same names: a checkpoint loads either way
    return ours, theirs


def _inputs(left=False):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, B, C, generator=g, dtype=torch.double)
    lengths = torch.tensor([7, 3, 5, 1, 6])
    pad = torch.arange(T)[None] >= lengths[:, None]  # B x T, right-padded
    if left:
        pad = pad.flip(1)
    enc = torch.randn(6, B, C, generator=g, dtype=torch.double)
    enc_pad = torch.arange(6)[None] >= torch.tensor([6, 2, 4, 6, 3])[:, None]
    return x, pad, enc, enc_pad


def _run(layer, kind, x, pad, enc, enc_pad, positional=False):
    if kind == "encoder":
        return layer(x, pad)
    causal = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.double), 1)
    if positional:  # fairseq's signature: the padding mask is the 8th argument
        return layer(x, enc, enc_pad, None, None, None, causal, pad)[0]
    return layer(x, enc, enc_pad, None, self_attn_mask=causal, self_attn_padding_mask=pad)[0]


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("kind,left,positional", [
    ("encoder", False, False), ("encoder", True, False), ("decoder", False, False),
    ("decoder", False, True), ("decoder", True, False)],
    ids=["encoder", "encoder-left-pad", "decoder", "decoder-positional", "decoder-left-pad"])
def test_real_positions_equal_fairseqs_layer(kind, left, positional, normalize_before):
    ours, theirs = _pair(kind, normalize_before)
    x, pad, enc, enc_pad = _inputs(left)
    calls = []
    ours.fc1.register_forward_hook(lambda m, i, o: calls.append(o.size(0)))
    real = (~pad).t().unsqueeze(-1)  # T x B x 1
    w = torch.randn(T, B, C, generator=torch.Generator().manual_seed(2), dtype=torch.double)
    res = []
    for layer in (ours, theirs):
        xx = x.clone().requires_grad_()
        out = _run(layer, kind, xx, pad, enc, enc_pad, positional)
        (out * real * w).sum().backward()
        res.append((out.detach(), xx.grad, {n: p.grad for n, p in layer.named_parameters()}))
    (o1, g1, p1), (o2, g2, p2) = res
    torch.testing.assert_close(o1 * real, o2 * real, rtol=0, atol=1e-12)
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-12)
    for n in p2:
        torch.testing.assert_close(p1[n], p2[n], rtol=0, atol=1e-12, msg=n)
    assert ours.fc1.rows is None and ours.fc2.rows is None  # nothing left set
    assert calls == [int((~pad).sum())]  # the FFN saw the real tokens only
    assert torch.isfinite(o1).all()


def test_an_incremental_step_equals_fairseqs():
    """One decoding step (``1 x B``, a padding mask of ``B x 1``): the real
    rows as fairseq's layer, the state kept alike."""
    ours, theirs = _pair("decoder", False)
    ours.eval(), theirs.eval()
    x, _, enc, enc_pad = _inputs()
    step_pad = torch.tensor([[False], [True], [False], [False], [True]])
    outs = []
    for layer in (ours, theirs):
        state = {}
        with torch.no_grad():
            for t in range(3):
                out = layer(x[t:t + 1], enc, enc_pad, state, self_attn_padding_mask=step_pad
                            if t == 2 else None)[0]
        outs.append(out)
    real = ~step_pad.t().unsqueeze(-1)
    torch.testing.assert_close(outs[0] * real, outs[1] * real, rtol=0, atol=1e-12)


def test_no_padding_and_other_devices_run_fairseqs_code():
    """Without padding (or with the CPU's shortcuts off) the FFN sees the
    whole batch: bitwise fairseq's layer."""
    from ctx_fairseq.modules.cpu_shortcuts import accelerator_path

    ours, theirs = _pair("encoder", False)
    x, pad, _, _ = _inputs()
    calls = []
    ours.fc1.register_forward_hook(lambda m, i, o: calls.append(tuple(o.shape)))
    assert torch.equal(ours(x, torch.zeros(B, T, dtype=torch.bool)),
                       theirs(x, torch.zeros(B, T, dtype=torch.bool)))
    with accelerator_path():
        assert torch.equal(ours(x, pad), theirs(x, pad))
    assert calls == [(T, B, F_), (T, B, F_)]
    ours(x, pad)
    assert calls[-1] == (int((~pad).sum()), F_)


def test_real_token_linear_is_a_linear():
    lin = RealTokenLinear(3, 4, scatter=True)
    assert isinstance(lin, torch.nn.Linear)
    assert sorted(n for n, _ in lin.named_parameters()) == ["bias", "weight"]
