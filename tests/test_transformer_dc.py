"""transformer_dc (Dual Contextual module, Ampomah et al. 2021): equations,
incremental decoding, causality, padding invariance, layer specs, checkpoints
and the fairseq CLIs."""

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ctx_fairseq  # noqa: F401  (registers the model)
from fairseq import options
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from ctx_fairseq.models.transformer_dc import (
    TransformerDCModel,
    _dummy_dictionary,
    count_parameters,
    describe,
)
from ctx_fairseq.modules.dual_context import (
    DCTransformerDecoderLayer,
    DCTransformerEncoderLayer,
    DualContextAttention,
)
from ctx_fairseq.modules.layer_spec import format_layer_spec, parse_layer_spec
from ctx_fairseq.modules.local_context import LocalContextUnit
from fairseq_cli_utils import (
    TINY_MODEL_ARGS,
    assert_translates_test_split,
    decode_with_reorder,
    hypotheses,
    states_from_sentence_checkpoint,
    train_and_generate,
    train_from_sentence_checkpoint,
    training_task_and_cfg,
)

VOCAB = 40


class _Task:
    def __init__(self, d):
        self.source_dictionary = d
        self.target_dictionary = d


def build(arch, extra=(), vocab=VOCAB, double=True):
    """A tiny model (2+2 layers, d=32) built as fairseq builds it, dropout off."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["/dev/null", "--arch", arch, "--task", "translation", "--dropout", "0",
         *TINY_MODEL_ARGS, *extra],
    )
    d = _dummy_dictionary(vocab)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, _Task(d))
    torch.manual_seed(0)
    with torch.no_grad():  # non-trivial LayerNorm/bias values too
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    if double:
        model = model.double()
    return model.eval(), d, args


def rand_tokens(d, bsz, length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(d.nspecial, len(d), (bsz, length), generator=g)


def is_dc(layer):
    return isinstance(layer, (DCTransformerEncoderLayer, DCTransformerDecoderLayer))


# --------------------------------------------------------------------------- Local Context Unit


def test_local_context_unit_matches_eq6_by_hand():
    """l_c_t = LN(GLU([r_{t-a};..;r_{t+b}] W^r + b^r) + r_t), zero boundaries."""
    torch.manual_seed(1)
    for f, causal, (a, b) in [(2, False, (1, 0)), (3, False, (1, 1)), (4, False, (2, 1)),
                              (3, True, (2, 0)), (2, True, (1, 0)), (1, False, (0, 0))]:
        lcu = LocalContextUnit(8, kernel_size=f, causal=causal).double()
        with torch.no_grad():
            lcu.window_proj.bias.normal_()
        x = torch.randn(5, 2, 8, dtype=torch.float64)
        out = lcu(x)
        ref = []
        for t in range(5):
            win = [x[s] if 0 <= s < 5 else torch.zeros_like(x[0]) for s in range(t - a, t + b + 1)]
            h = torch.nn.functional.glu(lcu.window_proj(torch.cat(win, -1)), -1)
            ref.append(lcu.layer_norm(h + x[t]))
        assert torch.allclose(out, torch.stack(ref), atol=1e-12), (f, causal)


def test_local_context_unit_incremental_and_reorder():
    torch.manual_seed(2)
    lcu = LocalContextUnit(8, kernel_size=3, causal=True).double()
    x = torch.randn(6, 3, 8, dtype=torch.float64)
    state = {}
    steps = [lcu(x[t:t + 1], incremental_state=state) for t in range(3)]
    order = torch.tensor([2, 0, 0])
    lcu.reorder_incremental_state(state, order)
    y = torch.cat([x[:3, order], x[3:]], 0)  # beams continue from reordered prefixes
    steps += [lcu(y[t:t + 1], incremental_state=state) for t in range(3, 6)]
    full_x, full_y = lcu(x), lcu(y)
    assert torch.allclose(torch.cat(steps[:3]), full_x[:3], atol=1e-12)
    assert torch.allclose(torch.cat(steps[3:]), full_y[3:], atol=1e-12)
    with pytest.raises(ValueError, match="--dc-kernel-size"):
        LocalContextUnit(8, kernel_size=0)


class _ActivationCasts(TorchDispatchMode):
    """Counts dtype conversions of activations (3-D ``T x B x C`` tensors; weights
    are 2-D, biases 1-D) and records the dtype every ``unfold`` works in."""

    def __init__(self):
        super().__init__()
        self.casts, self.unfold_dtypes = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket is torch.ops.aten._to_copy and args[0].dim() == 3:
            dtype = kwargs.get("dtype", args[0].dtype)
            if dtype != args[0].dtype:
                self.casts.append((args[0].dtype, dtype))
        if func.overloadpacket in (torch.ops.aten.unfold, torch.ops.aten.constant_pad_nd):
            self.unfold_dtypes.append(args[0].dtype)
        return func(*args, **kwargs)


@pytest.mark.parametrize("causal", [False, True])
def test_dc_module_under_autocast_casts_its_input_once(causal):
    """Under autocast (CPU: bfloat16) the DC module casts its float32 input once and
    l_c once, and the Local Context Unit pads and unfolds in bfloat16 (it used to
    build the f-fold window in float32 and cast it, then cast r once per
    projection); the output is what autocast's own casts give, bit for bit."""
    torch.manual_seed(3)
    dc = DualContextAttention(16, 2, kernel_size=3, causal=causal).eval()
    x = torch.randn(7, 3, 16)
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, :2] = True
    mask = (torch.triu(torch.full((7, 7), float("-inf")), 1) if causal else None)
    with torch.no_grad():
        ref32, _ = dc(x, x, x, key_padding_mask=kpm, attn_mask=mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with _ActivationCasts() as seen:  # (a dispatch mode may change SDPA's kernel)
                dc(x, x, x, key_padding_mask=kpm, attn_mask=mask)
            y, _ = dc(x, x, x, key_padding_mask=kpm, attn_mask=mask)
        # reference: every consumer casts r itself (autocast's behaviour)
        lcu = dc.local_context
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pad = kpm.t().unsqueeze(-1)
            ctx = torch.nn.functional.pad(x.to(torch.bfloat16), (0, 0, 0, 0, lcu.padding_l,
                                                                 lcu.padding_r))
            ctx[lcu.padding_l:lcu.padding_l + 7].masked_fill_(pad, 0.0)
            r_hat = torch.nn.functional.glu(lcu.window_proj(lcu._windows(ctx, 7)), -1)
            l_c = lcu.layer_norm(r_hat + x)
            h_g, _ = dc.global_attn(x, x, x, key_padding_mask=kpm, attn_mask=mask,
                                    need_weights=False)
            h_l, _ = dc.local_attn(x, l_c, l_c, key_padding_mask=kpm, attn_mask=mask,
                                   need_weights=False)
    assert y.dtype == torch.bfloat16
    assert seen.casts == [(torch.float32, torch.bfloat16)] * 2, seen.casts
    assert seen.unfold_dtypes and set(seen.unfold_dtypes) == {torch.bfloat16}
    assert torch.equal(y, h_l + h_g)
    assert (y.float() - ref32).abs().max() < 0.05 * ref32.abs().max()


def test_local_context_unit_incremental_under_autocast():
    """Under autocast the incremental buffer holds the bfloat16 inputs; steps equal
    the full (autocast) forward up to GEMM blocking (bfloat16 resolution)."""
    torch.manual_seed(4)
    lcu = LocalContextUnit(16, kernel_size=3, causal=True).eval()
    x = torch.randn(6, 2, 16)
    state = {}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        steps = torch.cat([lcu(x[t:t + 1], incremental_state=state) for t in range(6)])
        full = lcu(x)
        assert lcu._get_input_buffer(state).dtype == torch.bfloat16
    assert steps.dtype == full.dtype == torch.float32  # LayerNorm runs in float32
    assert (steps - full).abs().max() < 2e-2
    with pytest.raises(ValueError, match="x_cast"):
        lcu(x, x_cast=x.double())


# --------------------------------------------------------------------------- structure


def test_default_is_enc_dc_and_presets():
    m, _, args = build("transformer_dc")
    assert all(is_dc(l) for l in m.encoder.layers)
    assert not any(is_dc(l) for l in m.decoder.layers)
    assert args.dc_kernel_size == 2
    assert m.encoder.layers[0].self_attn.kernel_size == 2
    assert describe(m) == {"encoder": "all", "decoder": "none"}
    assert describe(build("transformer_dc_dec")[0]) == {"encoder": "none", "decoder": "all"}
    assert describe(build("transformer_dc_full")[0]) == {"encoder": "all", "decoder": "all"}


def test_iwslt_and_wmt_presets():
    for arch, (layers, dim, heads) in [("transformer_dc_iwslt", (4, 256, 4)),
                                        ("transformer_dc_wmt_en_de", (6, 512, 8))]:
        args = options.parse_args_and_arch(
            options.get_training_parser(), ["/dev/null", "--arch", arch, "--task", "translation"])
        assert (args.encoder_layers, args.decoder_layers) == (layers, layers)
        assert (args.encoder_embed_dim, args.encoder_attention_heads) == (dim, heads)
        assert (args.dc_encoder_layers, args.dc_decoder_layers) == ("all", "none")
    for arch in ("transformer_dc_iwslt_dec", "transformer_dc_iwslt_full",
                 "transformer_dc_wmt_en_de_dec", "transformer_dc_wmt_en_de_full"):
        assert arch in ARCH_MODEL_REGISTRY


def test_layer_spec_selects_exactly_those_layers():
    m, _, _ = build("transformer_dc", ["--encoder-layers", "4", "--dc-encoder-layers", "1-2",
                                       "--dc-decoder-layers", "2"])
    assert [is_dc(l) for l in m.encoder.layers] == [True, True, False, False]
    assert [is_dc(l) for l in m.decoder.layers] == [False, True]
    # the other layers are fairseq's own
    assert type(m.encoder.layers[2]) is TransformerEncoderLayerBase
    assert type(m.decoder.layers[0]) is TransformerDecoderLayerBase
    m2, _, _ = build("transformer_dc", ["--encoder-layers", "5", "--dc-encoder-layers", "1,3,5"])
    assert [is_dc(l) for l in m2.encoder.layers] == [True, False, True, False, True]


def test_parse_layer_spec():
    assert parse_layer_spec("all", 6, "--x") == (0, 1, 2, 3, 4, 5)
    assert parse_layer_spec("none", 6, "--x") == ()
    assert parse_layer_spec("1-3", 6, "--x") == (0, 1, 2)
    assert parse_layer_spec("1,3,5", 6, "--x") == (0, 2, 4)
    assert parse_layer_spec(" 2-3,1 ", 6, "--x") == (0, 1, 2)
    assert format_layer_spec((0, 1, 3), 6) == "1-2,4"
    assert format_layer_spec(range(6), 6) == "all"


@pytest.mark.parametrize("spec, why", [("0", "1-based"), ("7", "6 layers"),
                                        ("3-1", "reversed"), ("x", "not a positive integer"),
                                        ("1,,2", "empty"), ("2-", "range")])
def test_bad_layer_specs(spec, why):
    with pytest.raises(ValueError) as e:
        parse_layer_spec(spec, 6, "--dc-encoder-layers")
    msg = str(e.value)
    assert "--dc-encoder-layers" in msg and why in msg
    assert "Expected 'all', 'none'" in msg and "between 1 and 6" in msg


def test_bad_specs_through_the_model():
    with pytest.raises(ValueError, match=r"--dc-encoder-layers.*'3'.*2 layers"):
        build("transformer_dc", ["--dc-encoder-layers", "3"])
    with pytest.raises(ValueError, match=r"--dc-decoder-layers.*'x'"):
        build("transformer_dc", ["--dc-decoder-layers", "x"])
    with pytest.raises(ValueError, match=r"--dc-kernel-size.*positive"):
        build("transformer_dc", ["--dc-kernel-size", "0"])


def test_dc_layer_parameters_follow_the_paper():
    """Per DC layer: W^r (f d x 2d) + b^r, LN of Eq. 6, the h_l projections
    (3 d^2 + 3d), and W_z (2d x d) + b_z replacing the self-attention's W_o."""
    d, f = 32, 2
    plain, _, _ = build("transformer_dc", ["--dc-encoder-layers", "none"])
    enc, _, _ = build("transformer_dc", ["--dc-encoder-layers", "1"])
    n = lambda m: sum(p.numel() for p in m.parameters())
    extra = (f * d * 2 * d + 2 * d) + 2 * d + (3 * d * d + 3 * d) + d * d
    assert n(enc) - n(plain) == extra


# --------------------------------------------------------------------------- decoder


def _incremental_with_reorder(model, src, prev, split, order):
    """Decode step by step; after ``split`` steps reorder the beams with ``order``.
    Returns (step outputs, the token rows the full pass must see, new src)."""
    enc = model.encoder(src, src.ne(model.encoder.padding_idx).sum(1))
    steps, prev2, _ = decode_with_reorder(model, enc, prev, split, order)
    return steps, prev2, src[order]


@pytest.mark.parametrize("arch, extra", [("transformer_dc_dec", []),
                                         ("transformer_dc_full", []),
                                         ("transformer_dc_full", ["--dc-kernel-size", "3"]),
                                         ("transformer_dc_dec", ["--decoder-normalize-before",
                                                                 "--encoder-normalize-before"])])
def test_incremental_equals_full_forward_with_beam_reorder(arch, extra):
    model, d, _ = build(arch, extra)
    # 2 sentences x beam 2 (rows 0,1 and 2,3 share a source); as in beam search,
    # the reorder permutes/duplicates hypotheses within each sentence's beam.
    src = rand_tokens(d, 2, 6, seed=3)
    src[1, :2] = d.pad()  # left padding, as fairseq batches sources
    src = src.repeat_interleave(2, dim=0)
    prev = rand_tokens(d, 4, 8, seed=4)
    prev[:, 0] = d.eos()
    order = torch.tensor([1, 1, 3, 2])
    with torch.no_grad():
        steps, prev2, src2 = _incremental_with_reorder(model, src, prev, 4, order)
        full1, _ = model(src, src.ne(d.pad()).sum(1), prev)
        full2, _ = model(src2, src2.ne(d.pad()).sum(1), prev2)
    assert steps.dtype == torch.float64
    assert (steps[:, :4] - full1[:, :4]).abs().max() < 1e-10  # float64 throughout (compat)
    assert (steps[:, 4:] - full2[:, 4:]).abs().max() < 1e-10
    # the reorder mattered: without it, steps after the split would differ
    assert (full1[:, 4:] - full2[:, 4:]).abs().max() > 1e-3


@pytest.mark.parametrize("f", [2, 3])
def test_decoder_causality(f):
    model, d, _ = build("transformer_dc_dec", ["--dc-kernel-size", str(f)])
    src = rand_tokens(d, 2, 5, seed=5)
    prev = rand_tokens(d, 2, 7, seed=6)
    with torch.no_grad():
        out1, _ = model(src, src.ne(d.pad()).sum(1), prev)
        for t in range(6):
            changed = prev.clone()
            changed[:, t + 1] = (changed[:, t + 1] - d.nspecial + 1) % (len(d) - d.nspecial) \
                + d.nspecial
            out2, _ = model(src, src.ne(d.pad()).sum(1), changed)
            assert (out1[:, :t + 1] - out2[:, :t + 1]).abs().max() < 1e-12
            assert (out1[:, t + 1:] - out2[:, t + 1:]).abs().max() > 1e-6


# --------------------------------------------------------------------------- encoder


@pytest.mark.parametrize("f, prenorm", [(2, False), (3, False), (4, True)])
def test_encoder_padding_invariance(f, prenorm):
    extra = ["--dc-kernel-size", str(f)] + (["--encoder-normalize-before"] if prenorm else [])
    model, d, _ = build("transformer_dc", extra)
    sent = rand_tokens(d, 1, 5, seed=7)
    others = rand_tokens(d, 2, 9, seed=8)
    with torch.no_grad():
        alone = model.encoder(sent, torch.tensor([5]))["encoder_out"][0][:, 0]
        for left in (True, False):
            batch = torch.full((3, 9), d.pad(), dtype=torch.long)
            batch[1:] = others
            if left:
                batch[0, 4:] = sent[0]
                real = slice(4, 9)
            else:
                batch[0, :5] = sent[0]
                real = slice(0, 5)
            out = model.encoder(batch, batch.ne(d.pad()).sum(1))["encoder_out"][0]
            assert (out[real, 0] - alone).abs().max() < 1e-10, ("left" if left else "right")


def test_dc_changes_the_encoding():
    """The DC module is wired in: perturbing h_l's parameters changes the output."""
    model, d, _ = build("transformer_dc")
    src = rand_tokens(d, 2, 6, seed=9)
    with torch.no_grad():
        a = model.encoder(src, torch.tensor([6, 6]))["encoder_out"][0]
        model.encoder.layers[1].self_attn.local_context.window_proj.weight.mul_(2)
        b = model.encoder(src, torch.tensor([6, 6]))["encoder_out"][0]
    assert (a - b).abs().max() > 1e-4


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip_weights_only(tmp_path):
    from fairseq import checkpoint_utils, models
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    model, d, args = build("transformer_dc_full", ["--dc-encoder-layers", "2",
                                                   "--dc-kernel-size", "3"], double=False)
    src = rand_tokens(d, 2, 6, seed=10)
    src[0, :1] = d.pad()
    prev = rand_tokens(d, 2, 5, seed=11)
    with torch.no_grad():
        ref, _ = model(src, src.ne(d.pad()).sum(1), prev)
    path = str(tmp_path / "dc.pt")
    cfg = convert_namespace_to_omegaconf(args)
    # what fairseq's Trainer.state_dict() stores
    cfg = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    checkpoint_utils.torch_persistent_save({"cfg": cfg, "model": model.state_dict()}, path)
    state = torch.load(path, weights_only=True)
    model_cfg = state["cfg"]["model"]
    # both a Namespace (legacy checkpoints) and an omegaconf DictConfig must work
    for mcfg in (model_cfg, OmegaConf.create(vars(model_cfg))):
        loaded = models.build_model(mcfg, _Task(d))
        loaded.load_state_dict(state["model"], strict=True)
        loaded.eval()
        assert describe(loaded) == {"encoder": "2", "decoder": "all"}
        assert loaded.encoder.layers[1].self_attn.kernel_size == 3
        with torch.no_grad():
            out, _ = loaded(src, src.ne(d.pad()).sum(1), prev)
        assert torch.equal(out, ref)


# --------------------------------------------------------------------------- fairseq CLIs


@pytest.fixture(scope="module")
def cli_runs(toy_bin, tmp_path_factory):
    runs = {}
    for name, arch in [("enc", "transformer_dc"), ("dec", "transformer_dc_dec"),
                       ("full", "transformer_dc_full")]:
        save = str(tmp_path_factory.mktemp(f"dc_{name}"))
        runs[name] = (save, train_and_generate(toy_bin, save, arch, max_update=3))
    return runs


@pytest.mark.parametrize("name", ["enc", "dec", "full"])
def test_train_and_generate(cli_runs, toy_bin, name):
    save, out = cli_runs[name]
    n_test = sum(1 for _ in open(os.path.join(toy_bin, "test.docids")))
    assert len(hypotheses(out)) == n_test
    assert "BLEU" in out
    state = torch.load(os.path.join(save, "checkpoint_last.pt"), weights_only=True)
    keys = state["model"].keys()
    has_enc = any(k.startswith("encoder.layers.0.self_attn.local_context.") for k in keys)
    has_dec = any(k.startswith("decoder.layers.0.self_attn.local_context.") for k in keys)
    assert (has_enc, has_dec) == {"enc": (True, False), "dec": (False, True),
                                  "full": (True, True)}[name]


def test_trained_checkpoint_reload_matches_fairseq_loader(cli_runs, toy_bin):
    """The CLI checkpoint loads with weights_only=True and rebuilds a model that
    computes the same outputs as the one fairseq's own loader returns."""
    from fairseq import checkpoint_utils, tasks

    ckpt = os.path.join(cli_runs["full"][0], "checkpoint_last.pt")
    [fs_model], _, task = checkpoint_utils.load_model_ensemble_and_task(
        [ckpt], arg_overrides={"data": toy_bin})
    state = torch.load(ckpt, weights_only=True)
    model = task.build_model(state["cfg"]["model"])
    model.load_state_dict(state["model"])
    fs_model.eval(), model.eval()
    d = task.source_dictionary
    src = rand_tokens(d, 2, 6, seed=12)
    prev = rand_tokens(d, 2, 4, seed=13)
    with torch.no_grad():
        a, _ = fs_model(src, torch.tensor([6, 6]), prev)
        b, _ = model(src, torch.tensor([6, 6]), prev)
    assert torch.equal(a, b)
    assert isinstance(model, TransformerDCModel)


def test_param_count_base_scale():
    """Enc-DC at the paper's WMT setting adds 6 x 2,100,736 parameters."""
    base = count_parameters("transformer_wmt_en_de", vocab_size=1000)
    enc = count_parameters("transformer_dc_wmt_en_de", vocab_size=1000)
    full = count_parameters("transformer_dc_wmt_en_de_full", vocab_size=1000)
    assert enc - base == 6 * 2_100_736
    assert full - base == 12 * 2_100_736


# --------------------------------------------------------------------------- two-stage training

SENTENCE_LEVEL = ["--task", "document_translation", "--source-context-size", "0",
                  "--share-all-embeddings"]


def _task_and_cfg(toy_bin, arch, *extra):
    return training_task_and_cfg([toy_bin, "--arch", arch, *SENTENCE_LEVEL, *TINY_MODEL_ARGS,
                                  *extra])


@pytest.mark.parametrize("arch", ["transformer_dc", "transformer_dc_full"])
def test_init_from_sentence_checkpoint(toy_bin, sentence_ckpt, arch, caplog):
    """Every parameter of the stage-1 transformer is loaded (a DC layer's
    global attention from the transformer's self-attention); the Local
    Context Units and local attentions keep their initialisation (equal to
    those of a model built with the same seed without the checkpoint); the
    log names the renamed and the new tensors."""
    from ctx_fairseq.models.transformer_dc import is_dc_tensor, transformer_name

    task, cfg = _task_and_cfg(toy_bin, arch, "--init-from-sentence-checkpoint", sentence_ckpt)
    ours, init, theirs = states_from_sentence_checkpoint(task, cfg, sentence_ckpt, caplog)
    new = [n for n in ours if is_dc_tensor(n)]
    shared = [n for n in ours if not is_dc_tensor(n)]
    assert {transformer_name(n) for n in shared} == set(theirs)  # every one, each once
    assert "encoder.layers.1.self_attn.global_attn.q_proj.weight" in shared
    for n in shared:
        assert torch.equal(ours[n], theirs[transformer_name(n)].to(ours[n].dtype)), n
    assert not torch.equal(init["encoder.layers.0.fc1.weight"],
                           theirs["encoder.layers.0.fc1.weight"])
    assert any(".local_context." in n for n in new) and any(".local_attn." in n for n in new)
    assert arch != "transformer_dc_full" or any(n.startswith("decoder.") for n in new)
    for n in new:
        assert torch.equal(ours[n], init[n]), n
    log = caplog.text
    assert f"loaded {len(shared)} tensors" in log and f"fresh {len(new)} tensors" in log
    assert ("encoder.layers.0.self_attn.q_proj.weight -> "
            "encoder.layers.0.self_attn.global_attn.q_proj.weight") in log
    assert "encoder.layers.0.self_attn.local_context.window_proj.weight" in log
    assert "unused from the checkpoint: -" in log


def test_init_from_sentence_checkpoint_then_training_continues(toy_bin, sentence_ckpt, tmp_path):
    """fairseq-train from the stage-1 checkpoint: training runs, moves the
    loaded parameters, and the saved model generates."""
    save = str(tmp_path / "dc")
    state, theirs = train_from_sentence_checkpoint(
        [toy_bin, "--arch", "transformer_dc", *SENTENCE_LEVEL, *TINY_MODEL_ARGS], sentence_ckpt,
        save)
    w = state["model"]["encoder.layers.0.self_attn.global_attn.q_proj.weight"]
    assert torch.isfinite(w).all()
    start = theirs["encoder.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(w.float(), start.float())  # trained from there
    assert (w.float() - start.float()).abs().max() < 0.05  # (3 steps of lr 1e-3)
    assert_translates_test_split(toy_bin, os.path.join(save, "checkpoint_last.pt"),
                                 SENTENCE_LEVEL[:4])


def test_init_from_an_incompatible_checkpoint_is_an_error(toy_bin, sentence_ckpt, tmp_path):
    task, cfg = _task_and_cfg(toy_bin, "transformer_dc", "--encoder-layers", "3",
                              "--init-from-sentence-checkpoint", sentence_ckpt)
    with pytest.raises(ValueError, match=r"6 of this model's transformer tensors are not in "
                                         r"the checkpoint \(encoder.layers.2."):
        task.build_model(cfg.model)  # (fc1, fc2, layer norms of the third layer)
    task, cfg = _task_and_cfg(toy_bin, "transformer_dc", "--decoder-layers", "1",
                              "--init-from-sentence-checkpoint", sentence_ckpt)
    with pytest.raises(ValueError, match=r"tensors of the checkpoint have no place in this "
                                         r"model \(decoder.layers.1."):
        task.build_model(cfg.model)
    task, cfg = _task_and_cfg(toy_bin, "transformer_dc", "--encoder-ffn-embed-dim", "48",
                              "--init-from-sentence-checkpoint", sentence_ckpt)
    with pytest.raises(ValueError, match=r"encoder.layers.0.fc1.weight has shape \(64, 32\) "
                                         r"there but \(48, 32\) here"):
        task.build_model(cfg.model)
    model, _, _ = build("transformer_dc", double=False)  # another vocabulary
    with pytest.raises(ValueError, match="encoder.embed_tokens.weight has shape"):
        model.load_sentence_checkpoint(sentence_ckpt)
    with pytest.raises(FileNotFoundError, match="no such file"):
        model.load_sentence_checkpoint(str(tmp_path / "missing.pt"))
