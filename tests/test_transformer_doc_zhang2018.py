"""transformer_doc_zhang2018 (Zhang et al. 2018): the context attention
sub-layer by hand (gate and residual), masking and sentences without context
(identity: the sentence-level model), padding invariance, incremental ==
full forward with beam reorder (context encoded once), context never crossing
documents through a task batch, two-step training (initialised from and
frozen at the sentence-level checkpoint), the fairseq CLIs, the contrastive
scorer, ctx-bench, presets and hooks, training statistics, parameter count."""

import os

import pytest
import torch

import ctx_fairseq  # noqa: F401  (registers the model and the task)
from ctx_fairseq.cli.arch_hooks import bench_hooks
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_REGISTRY

from ctx_fairseq.models.transformer_dc import _dummy_dictionary
from ctx_fairseq.models.transformer_doc_zhang2018 import (
    TransformerDocZhang2018Model,
    ZhangDecoderLayer,
    ZhangEncoder,
    ZhangEncoderLayer,
)
from ctx_fairseq.modules.doc_context_attention import (
    ContextGating,
    DocContextAttention,
    context_attention_mask,
)
from fairseq_cli_utils import (
    TINY_MODEL_ARGS,
    DictionaryTask,
    build_tiny_model,
    decode_with_reorder,
    hypotheses,
    loaded_and_fresh,
    random_tokens,
    train_and_generate,
    unpadded_row,
)

VOCAB = 40
ARCH = "transformer_doc_zhang2018"
ZHANG_ARGS = ["--task", "document_translation", "--source-context-size", "2"]


pytestmark = pytest.mark.usefixtures("one_thread")  # (its equality tests: conftest)


# --------------------------------------------------------------------------- helpers


def build(extra=(), arch=ARCH, double=True, vocab=VOCAB):
    """A tiny model (2+2 layers, d=32) as fairseq builds it, dropout off,
    non-trivial biases and LayerNorm parameters."""
    return build_tiny_model(arch, extra, vocab=vocab, double=double)


NORM_FLAGS = ("--encoder-normalize-before", "--decoder-normalize-before")


def sentence_level_twin(model, d, extra=()):
    """A fairseq ``transformer`` with the same sentence-level weights (and
    the normalisation flags among ``extra``)."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["/dev/null", "--arch", "transformer", "--task", "translation", "--dropout", "0",
         *TINY_MODEL_ARGS, *[a for a in extra if a in NORM_FLAGS]])
    twin = ARCH_MODEL_REGISTRY["transformer"].build_model(args, DictionaryTask(d)).double().eval()
    own = model.state_dict()
    theirs = twin.state_dict()
    assert set(theirs) <= set(own)
    twin.load_state_dict({k: own[k] for k in theirs})
    return twin


def setup_task(data, *extra, arch=ARCH):
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [data, "--arch", arch, *ZHANG_ARGS, *TINY_MODEL_ARGS, "--share-all-embeddings", *extra])
    cfg = convert_namespace_to_omegaconf(args)
    return tasks.setup_task(cfg.task), cfg


# --------------------------------------------------------------------------- the sub-layer


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("combine", ["gate", "residual"])
def test_sub_layer_by_hand(combine, normalize_before):
    """B = MultiHead(A, D, D); lambda = sigmoid(W_i A + W_s B);
    A' = LN(lambda A + (1 - lambda) B) (post-norm), the residual variant
    LN(A + B), and the pre-norm forms."""
    torch.manual_seed(3)
    sub = DocContextAttention(16, 4, combine=combine, normalize_before=normalize_before).double()
    with torch.no_grad():
        sub.layer_norm.weight.add_(0.3 * torch.randn(16, dtype=torch.float64))
        sub.layer_norm.bias.add_(0.3 * torch.randn(16, dtype=torch.float64))
    x = torch.randn(5, 3, 16, dtype=torch.float64)
    ctx = torch.randn(7, 3, 16, dtype=torch.float64)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, :4] = True  # left-padded context
    mask, has = context_attention_mask(pad)
    out = sub(x, ctx, mask, has)
    a = sub.layer_norm(x) if normalize_before else x
    b, _ = sub.attn(query=a, key=ctx, value=ctx, key_padding_mask=mask, static_kv=True)
    if combine == "gate":
        lam = torch.sigmoid(a @ sub.gate.w_input.weight.t() + b @ sub.gate.w_context.weight.t())
        mixed = lam * x + (1 - lam) * b
    else:
        mixed = x + b
    want = mixed if normalize_before else sub.layer_norm(mixed)
    assert torch.allclose(out, want, atol=1e-12)
    assert (sub.gate is None) == (combine == "residual")
    if combine == "gate":
        assert sub.gate.w_input.bias is None and sub.gate.w_context.bias is None


def test_gating_equation():
    g = ContextGating(4).double()
    a, b = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    out, lam = g(a, b)
    assert torch.allclose(lam, torch.sigmoid(g.w_input(a) + g.w_context(b)))
    assert torch.allclose(out, lam * a + (1 - lam) * b)


def test_context_masking_and_rows_without_context():
    """Padded context keys get no attention; a row without context is the
    identity (A' = A), whatever the width of its (padding) context."""
    torch.manual_seed(4)
    sub = DocContextAttention(16, 4).double().eval()
    x = torch.randn(5, 3, 16, dtype=torch.float64)
    ctx = torch.randn(6, 3, 16, dtype=torch.float64)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[0, :2] = True
    pad[2] = True  # row 2: no context
    mask, has = context_attention_mask(pad)
    assert has.tolist() == [True, True, False]
    assert not mask.all(1).any()  # no softmax over masked keys only
    sub.record = True
    out = sub(x, ctx, mask, has)
    assert torch.equal(out[:, 2], x[:, 2])
    assert not torch.allclose(out[:, :2], x[:, :2])
    assert sub.last_attn[0, :, :2].abs().max() == 0  # padding gets no weight
    assert sub.last_gate.shape == (5, 3, 16)
    # the padding keys' content does not matter
    ctx2 = ctx.clone()
    ctx2[:2, 0] = 100.0
    ctx2[:, 2] = -7.0
    out2 = sub(x, ctx2, mask, has)
    assert torch.allclose(out, out2, atol=1e-12)


# --------------------------------------------------------------------------- structure


def test_structure_and_document_level_parameters():
    model, _ = build()
    enc, dec = model.encoder, model.decoder
    assert all(isinstance(layer, ZhangEncoderLayer) for layer in enc.layers)
    assert all(isinstance(layer, ZhangDecoderLayer) for layer in dec.layers)
    assert len(enc.context_layers) == 1 and enc.context_layer_norm is None
    # the context encoder shares the source embeddings and positions
    assert not any(n.startswith("encoder.context_layers.0.embed") for n, _ in
                   model.named_parameters())
    doc = {n for n, _ in model.document_level_parameters()}
    sent = {n for n, _ in model.sentence_level_parameters()}
    twin = sentence_level_twin(model, _dummy_dictionary(VOCAB))
    assert sent == {n for n, _ in twin.named_parameters()}
    assert doc and all("context" in n for n in doc)
    for extra, n_enc, n_dec in ((["--context-integration", "encoder"], 2, 0),
                                (["--context-integration", "decoder"], 0, 2)):
        m, _ = build(extra)
        assert sum(isinstance(x, ZhangEncoderLayer) for x in m.encoder.layers) == n_enc
        assert sum(isinstance(x, ZhangDecoderLayer) for x in m.decoder.layers) == n_dec
    m, _ = build(["--context-encoder-layers", "3", "--encoder-normalize-before"])
    assert len(m.encoder.context_layers) == 3 and m.encoder.context_layer_norm is not None


@pytest.mark.parametrize("extra", [[], ["--encoder-normalize-before",
                                        "--decoder-normalize-before"],
                                   ["--context-integration", "encoder"],
                                   ["--context-integration", "decoder"]],
                         ids=["both", "pre-norm", "encoder", "decoder"])
def test_sentences_without_context_are_the_sentence_level_model(extra):
    """First sentences (no context) get exactly the sentence-level
    Transformer's output; sentences with context do not."""
    model, d = build(extra)
    twin = sentence_level_twin(model, d, extra)
    src = random_tokens(d, [5, 7, 4], 1)
    ctx = random_tokens(d, [0, 9, 0], 2)
    prev = random_tokens(d, [4, 6, 5], 3, left_pad=False)
    with torch.no_grad():
        out, _ = model(src, None, prev, src_ctx_tokens=ctx)
        ref, _ = twin(src, None, prev)
    for r in (0, 2):
        n = int(prev[r].ne(d.pad()).sum())
        assert torch.allclose(out[r, :n], ref[r, :n], atol=1e-10), r
    assert not torch.allclose(out[1], ref[1], atol=1e-3)


def test_the_context_changes_the_output_on_each_side():
    for side in ("encoder", "decoder"):
        model, d = build(["--context-integration", side])
        src, prev = random_tokens(d, [5, 5], 1), random_tokens(d, [4, 4], 3, left_pad=False)
        a, _ = model(src, None, prev, src_ctx_tokens=random_tokens(d, [6, 6], 4))
        b, _ = model(src, None, prev, src_ctx_tokens=random_tokens(d, [6, 6], 5))
        assert (a - b).abs().max() > 1e-3, side
        enc_a = model.encoder(src, src_ctx_tokens=random_tokens(d, [6, 6], 4))["encoder_out"][0]
        enc_b = model.encoder(src, src_ctx_tokens=random_tokens(d, [6, 6], 5))["encoder_out"][0]
        assert torch.equal(enc_a, enc_b) == (side == "decoder"), side


# --------------------------------------------------------------------------- padding


@pytest.mark.parametrize("extra", [[], ["--encoder-normalize-before",
                                        "--decoder-normalize-before",
                                        "--context-encoder-layers", "2"]],
                         ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("left_pad", [True, False], ids=["left-pad", "right-pad"])
def test_padding_invariance(extra, left_pad):
    """Each sentence encodes (and decodes) the same alone and in a batch of
    longer ones, with and without context."""
    model, d = build(extra)
    pad = d.pad()
    src = random_tokens(d, [3, 9, 5, 4], 11, left_pad)
    ctx = random_tokens(d, [9, 0, 4, 14], 12, left_pad)
    prev = random_tokens(d, [4, 7, 3, 5], 13, left_pad=False)
    with torch.no_grad():
        batch = model.encoder(src, src_ctx_tokens=ctx)
        full, _ = model(src, None, prev, src_ctx_tokens=ctx)
        for r in range(src.size(0)):
            s, c = unpadded_row(src, r, pad), unpadded_row(ctx, r, pad)
            alone = model.encoder(s, src_ctx_tokens=c)["encoder_out"][0][:, 0]
            real = src[r].ne(pad)
            got = batch["encoder_out"][0][real, r]
            assert torch.allclose(got, alone, atol=1e-10), r
            n = int(prev[r].ne(pad).sum())
            dec, _ = model(s, None, prev[r:r + 1, :n], src_ctx_tokens=c)
            assert torch.allclose(full[r, :n], dec[0], atol=1e-9), r


# --------------------------------------------------------------------------- incremental decoding


@pytest.mark.parametrize("extra", [[], ["--decoder-normalize-before"],
                                   ["--context-integration", "encoder"],
                                   ["--context-combine", "residual"]],
                         ids=["both", "pre-norm", "encoder-only", "residual"])
def test_incremental_equals_full_forward_with_beam_reorder(extra, monkeypatch):
    model, d = build(extra)
    calls = []
    real = ZhangEncoder.encode_context
    monkeypatch.setattr(ZhangEncoder, "encode_context",
                        lambda self, t: calls.append(1) or real(self, t))
    src, ctx = random_tokens(d, [4, 6, 5], 21), random_tokens(d, [7, 0, 9], 22)
    bsz, beam, split = 3, 2, 3
    g = torch.Generator().manual_seed(5)
    prev = torch.randint(d.nspecial, len(d), (bsz * beam, 7), generator=g)
    prev[:, 0] = d.eos()
    order = torch.tensor([1, 1, 2, 3, 5, 4])  # within each sentence's beam, duplicated
    with torch.no_grad():
        enc = model.encoder(src, src_ctx_tokens=ctx)
        enc = model.encoder.reorder_encoder_out(enc, torch.arange(bsz).repeat_interleave(beam))
        steps, prev2, enc2 = decode_with_reorder(model, enc, prev, split, order)
        full1, _ = model.decoder(prev, enc)
        full2, _ = model.decoder(prev2, enc2)
    assert len(calls) == 1  # the context is encoded once per batch
    # float64 throughout (ctx_fairseq.compat keeps fairseq's softmax in float64)
    assert (steps[:, :split] - full1[:, :split]).abs().max() < 1e-10
    assert (steps[:, split:] - full2[:, split:]).abs().max() < 1e-10
    assert (full1[:, split:] - full2[:, split:]).abs().max() > 1e-3  # the reorder mattered
    for key, dim in (("context_out", 1), ("context_attn_mask", 0), ("context_has", 0)):
        assert torch.equal(enc2[key][0], enc[key][0].index_select(dim, order)), key


def test_beam_search_encodes_the_context_once(monkeypatch):
    from fairseq.sequence_generator import SequenceGenerator

    model, d = build(double=False)
    calls = []
    real = ZhangEncoder.encode_context
    monkeypatch.setattr(ZhangEncoder, "encode_context",
                        lambda self, t: calls.append(t.shape) or real(self, t))
    sample = {"net_input": {"src_tokens": random_tokens(d, [4, 6, 5], 31),
                            "src_lengths": torch.tensor([4, 6, 5]),
                            "src_ctx_tokens": random_tokens(d, [7, 0, 9], 32),
                            "src_ctx_lengths": torch.tensor([7, 0, 9])}}
    gen = SequenceGenerator([model], d, beam_size=3, max_len_b=6, min_len=2)
    with torch.no_grad():
        hyps = gen.generate([model], sample)
    assert len(hyps) == 3 and all(len(h) == 3 for h in hyps)
    assert calls == [(3, 9)]


def test_errors_without_context():
    model, d = build()
    src = random_tokens(d, [4], 1)
    with pytest.raises(ValueError, match="no context inputs"):
        model.encoder(src)
    plain = {"encoder_out": [torch.zeros(4, 1, 32, dtype=torch.float64)],
             "encoder_padding_mask": [src.eq(d.pad())]}
    with pytest.raises(ValueError, match="context encoder's output"):
        model.decoder(random_tokens(d, [3], 2, left_pad=False), plain)


def test_empty_context_gives_finite_outputs_and_gradients():
    model, d = build(double=False)
    model.train()
    src, prev = random_tokens(d, [5, 6, 4], 21), random_tokens(d, [4, 5, 6], 23, left_pad=False)
    out, _ = model(src, None, prev, src_ctx_tokens=random_tokens(d, [0, 7, 0], 22))
    out.float().logsumexp(-1).sum().backward()
    assert torch.isfinite(out).all()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    model.zero_grad()
    out2, _ = model(src, None, prev, src_ctx_tokens=torch.full((3, 1), d.pad()))
    out2.sum().backward()
    assert torch.isfinite(out2).all()
    # no sentence has context: the document-level parameters get no gradient
    for _, p in model.document_level_parameters():
        assert p.grad is None or p.grad.abs().sum() == 0


# --------------------------------------------------------------------------- through the task


def test_context_never_crosses_documents_through_a_task_batch(toy_bin):
    """A batch of the document task (--source-context-size 2) gives each
    sentence the output it gets with its own document's previous (at most 2)
    sentences as context, built here by hand from the binarized data and
    the docids; first sentences get the sentence-level path."""
    from fairseq.data import data_utils

    task, cfg = setup_task(toy_bin, "--dropout", "0")
    task.load_dataset("test")
    ds = task.datasets["test"]
    model = task.build_model(cfg.model).double().eval()
    twin = sentence_level_twin(model, task.source_dictionary)
    d = task.source_dictionary
    lines = data_utils.load_indexed_dataset(os.path.join(toy_bin, "test.src-tgt.src"), d)
    docids = [x.strip() for x in open(os.path.join(toy_bin, "test.docids"), encoding="utf-8")]
    ids = list(range(0, 20))
    sample = ds.collater([ds[i] for i in ids])
    ni = sample["net_input"]
    assert ni["src_ctx_tokens"].size(0) == len(ids)
    with torch.no_grad():
        enc = model.encoder(ni["src_tokens"], src_ctx_tokens=ni["src_ctx_tokens"])
        enc_twin = twin.encoder(ni["src_tokens"])
    firsts = 0
    for r, i in enumerate(sample["id"].tolist()):
        prev_ids = [j for j in (i - 2, i - 1) if j >= 0 and docids[j] == docids[i]]
        src = lines[i].unsqueeze(0)
        real = ni["src_tokens"][r].ne(d.pad())
        got = enc["encoder_out"][0][real, r]
        if not prev_ids:
            firsts += 1
            assert not bool(enc["context_has"][0][r])
            assert torch.allclose(got, enc_twin["encoder_out"][0][real, r], atol=1e-10)
            continue
        ctx = torch.cat([lines[j] for j in prev_ids]).unsqueeze(0)
        with torch.no_grad():
            alone = model.encoder(src, src_ctx_tokens=ctx)["encoder_out"][0][:, 0]
        assert torch.allclose(got, alone, atol=1e-10), (i, prev_ids)
    assert firsts >= 2  # the batch spans documents


# --------------------------------------------------------------------------- two steps


def test_two_step_init_and_freeze(toy_bin, sentence_ckpt):
    theirs = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"]
    task, cfg = setup_task(toy_bin, "--init-from-sentence-checkpoint", sentence_ckpt,
                           "--freeze-sentence-level")
    model = task.build_model(cfg.model)
    shared, fresh = loaded_and_fresh(model, theirs)
    assert "encoder.layers.1.fc1.weight" in shared
    assert "decoder.layers.1.encoder_attn.k_proj.weight" in shared
    fresh = set(fresh)
    doc = {n for n, _ in model.document_level_parameters()}
    assert fresh == doc  # exactly the document-level parameters start fresh
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == doc
    # without freezing, everything trains
    task2, cfg2 = setup_task(toy_bin, "--init-from-sentence-checkpoint", sentence_ckpt)
    assert all(p.requires_grad for p in task2.build_model(cfg2.model).parameters())
    # freezing a random sentence-level model is an error in a new run
    task3, cfg3 = setup_task(toy_bin, "--freeze-sentence-level")
    with pytest.raises(ValueError, match="--init-from-sentence-checkpoint"):
        task3.build_model(cfg3.model)
    # (loading a checkpoint of this model freezes without re-initialising)
    model4 = task3.build_model(cfg3.model, from_checkpoint=True)
    assert {n for n, p in model4.named_parameters() if p.requires_grad} == doc


def test_frozen_parameters_do_not_change_in_fairseq_train(zhang_run, sentence_ckpt):
    """After 3 updates of fairseq-train (step 2), every sentence-level tensor
    is still the sentence checkpoint's, and fairseq's optimizer holds
    exactly the document-level parameters (with moments: they got gradients)."""
    ckpt, _ = zhang_run
    theirs = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"]
    state = checkpoint_utils.load_checkpoint_to_cpu(ckpt)
    ours = state["model"]
    assert state["optimizer_history"][-1]["num_updates"] == 3
    for k, v in theirs.items():
        if k in ours:
            assert torch.equal(ours[k], v), k
    doc = [k for k in ours if TransformerDocZhang2018Model.is_document_level(k)]
    assert doc and all(k not in theirs for k in doc)
    assert len(ours) == len(theirs) + len(doc)
    opt = state["last_optimizer_state"]
    assert sum(len(g["params"]) for g in opt["param_groups"]) == len(doc)
    assert all(float(st["exp_avg"].abs().sum()) > 0 for st in opt["state"].values())


def test_an_update_changes_only_the_document_level_parameters(toy_bin, sentence_ckpt):
    """One optimiser step on a task batch, over the parameters that require
    gradients (as fairseq's trainer selects them)."""
    theirs = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"]
    task, cfg = setup_task(toy_bin, "--init-from-sentence-checkpoint", sentence_ckpt,
                           "--freeze-sentence-level", "--criterion",
                           "label_smoothed_cross_entropy", "--label-smoothing", "0.1")
    task.load_dataset("train")
    ds = task.datasets["train"]
    model = task.build_model(cfg.model).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    crit = task.build_criterion(cfg.criterion)
    sample = ds.collater([ds[i] for i in range(16)])
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss, _, _ = crit(model, sample)
    loss.backward()
    assert all(p.grad is None for _, p in model.sentence_level_parameters())
    opt.step()
    after = model.state_dict()
    for k in after:
        if TransformerDocZhang2018Model.is_document_level(k):
            assert not torch.equal(after[k], before[k]), k
        else:
            assert torch.equal(after[k], theirs[k]), k


@pytest.fixture(scope="module")
def zhang_run(toy_bin, sentence_ckpt, tmp_path_factory):
    """Step 2 through fairseq-train (initialised from the sentence
    checkpoint, sentence level frozen, 3 updates), then fairseq-generate."""
    save = str(tmp_path_factory.mktemp("zhang"))
    out = train_and_generate(
        toy_bin, save, ARCH,
        extra=[*ZHANG_ARGS, "--share-all-embeddings", "--init-from-sentence-checkpoint",
               sentence_ckpt, "--freeze-sentence-level"],
        gen_extra=ZHANG_ARGS)
    return os.path.join(save, "checkpoint_last.pt"), out


# --------------------------------------------------------------------------- CLIs


def test_cli_train_and_generate(zhang_run, toy_bin):
    _, out = zhang_run
    n = sum(1 for _ in open(os.path.join(toy_bin, "test.docids")))
    assert len(hypotheses(out)) == n


def test_cli_one_step_encoder_integration(toy_bin, tmp_path):
    """Without the two steps (all parameters trained from scratch), tiny
    preset, integration into the encoder only."""
    out = train_and_generate(
        toy_bin, str(tmp_path), "transformer_doc_zhang2018_tiny",
        extra=[*ZHANG_ARGS, "--share-all-embeddings", "--context-integration", "encoder"],
        max_update=2, gen_extra=ZHANG_ARGS)
    n = sum(1 for _ in open(os.path.join(toy_bin, "test.docids")))
    assert len(hypotheses(out)) == n


def test_contrastive_scoring(zhang_run, toy_bin, toy_corpus):
    from ctx_fairseq.eval.scoring.contrastive import evaluate_checkpoint
    from ctx_fairseq.data.toy_corpus import read_contrastive

    ckpt, _ = zhang_run
    jsonl = os.path.join(toy_corpus, "test.contrastive.jsonl")
    res = evaluate_checkpoint(ckpt, toy_bin, jsonl)
    assert res["overall"]["n"] == len(read_contrastive(jsonl))
    assert {"overall", "by_phenomenon", "by_distance"} <= set(res)


def test_generation_needs_the_document_task(zhang_run, toy_bin):
    from fairseq_cli_utils import generate

    ckpt, _ = zhang_run
    with pytest.raises(Exception, match="context"):
        generate([toy_bin, "--path", ckpt, "--beam", "2", "--max-tokens", "500",
                  "--gen-subset", "test", "--num-workers", "0", "--max-len-b", "5"])


def test_build_errors(toy_bin):
    task, cfg = setup_task(toy_bin, "--checkpoint-activations")
    with pytest.raises(ValueError, match="--checkpoint-activations"):
        task.build_model(cfg.model)
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [toy_bin, "--arch", ARCH, "--task", "document_translation", "--source-context-size", "0",
         *TINY_MODEL_ARGS, "--share-all-embeddings"])
    cfg = convert_namespace_to_omegaconf(args)
    with pytest.raises(ValueError, match="needs source context"):
        tasks.setup_task(cfg.task).build_model(cfg.model)


# --------------------------------------------------------------------------- hooks, presets


def test_presets_and_demo_hooks():
    for arch, dim, layers, heads, ffn in ((ARCH, 512, 6, 8, 2048),
                                          ("transformer_doc_zhang2018_tiny", 64, 2, 4, 128)):
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           ["/dev/null", "--arch", arch])
        assert (args.encoder_embed_dim, args.decoder_layers, args.encoder_attention_heads,
                args.decoder_ffn_embed_dim) == (dim, layers, heads, ffn)
        assert (args.context_encoder_layers, args.context_integration,
                args.context_combine, args.freeze_sentence_level) == (1, "both", "gate", False)
    from ctx_fairseq.cli.arch_hooks import default_demo_archs, demo_hooks

    hooks = demo_hooks(ARCH)
    assert hooks.stage1 == "transformer"
    assert hooks.train_args_for(ARCH) == ZHANG_ARGS + ["--freeze-sentence-level"]
    assert hooks.generate_args_for(ARCH) == ZHANG_ARGS

    assert ARCH in default_demo_archs()


def test_training_statistics():
    model, d = build(double=False)
    src, prev = random_tokens(d, [5, 6, 4], 21), random_tokens(d, [4, 5, 6], 23, left_pad=False)
    model.record_context_statistics(True)
    model(src, None, prev, src_ctx_tokens=random_tokens(d, [0, 7, 3], 22))
    st = model.context_statistics()
    assert list(st) == ["gate_enc", "gate_dec", "ctx_frac"]
    n_ctx, n_tok = st["ctx_frac"].tolist()
    assert (n_ctx, n_tok) == (6 + 4, 5 + 6 + 4)  # source tokens of the 2 sentences with context
    for key in ("gate_enc", "gate_dec"):
        s, n = st[key].tolist()
        assert n == 2 * (n_ctx if key == "gate_enc" else 5 + 6) and 0 < s / n < 1
    model.record_context_statistics(False)
    assert all(s.last_statistics is None for subs in model.context_sub_layers().values()
               for s in subs)
    m, _ = build(["--context-combine", "residual", "--context-integration", "decoder"],
                 double=False)
    m.record_context_statistics(True)
    m(src, None, prev, src_ctx_tokens=random_tokens(d, [0, 7, 3], 22))
    assert list(m.context_statistics()) == ["ctx_frac"]


def test_criterion_logs_the_statistics():
    from ctx_fairseq.criterions.label_smoothed_cross_entropy_ctx import (
        LabelSmoothedCrossEntropyCtxCriterion,
        statistic_names,
    )

    model, d = build(double=False)
    task = DictionaryTask(d)
    sample = bench_hooks(ARCH).sample(task, None, 3, 6, 5, 2, "cpu")
    crit = LabelSmoothedCrossEntropyCtxCriterion(task, sentence_avg=False, label_smoothing=0.1)
    _, _, log = crit(model.train(), sample)
    assert list(statistic_names([log])) == ["gate_enc", "gate_dec", "ctx_frac"]


def test_bench_sample_trains():
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    model, d = build(double=False)
    task = DictionaryTask(d)
    sample = bench_hooks(ARCH).sample(task, None, 3, 6, 5, 2, "cpu")
    ni = sample["net_input"]
    assert ni["src_ctx_tokens"].shape == (3, 12) and ni["prev_output_tokens"][0, 0] == d.eos()
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    loss, _, _ = crit(model.train(), sample)
    loss.backward()
    assert torch.isfinite(loss)
    assert model.encoder.layers[0].context_attn.gate.w_context.weight.grad.abs().sum() > 0
    assert model.encoder.context_layers[0].fc1.weight.grad.abs().sum() > 0


def test_ctx_bench_runs(capsys):
    import json

    from ctx_fairseq.cli import bench

    tiny = ["--layers", "2", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32",
            "--vocab", "64", "--src-len", "6", "--tgt-len", "5", "--max-tokens", "40",
            "--infer-sentences", "3", "--beam", "2", "--repeats", "1", "--train-steps", "1",
            "--warmup", "0", "--doc-len", "2"]
    bench.cli_main(["--archs", ARCH, *tiny, "--json"])
    report = json.loads(capsys.readouterr().out)
    base, zhang = report["results"]
    assert zhang["arch"] == ARCH
    assert 0 < zhang["flops_ratio_bound"] < 1 and zhang["params"] > base["params"]
    assert zhang["infer_sentences_per_s"] > 0


def test_parameter_count_of_maruf_et_al_setting():
    """Maruf et al. 2019, Table 5 (News-Commentary, integration into the
    encoder, 4+4 layers, d=512, 8 heads, FFN 2048): Transformer 50M, Zhang
    et al. 59.5M. Our model adds 9,456,128 parameters there: one context
    encoder layer (3,152,384) and four context sub-layers (1,575,936 each:
    attention 1,050,624, gate 524,288, LayerNorm 1,024)."""
    shape = ["--encoder-layers", "4", "--decoder-layers", "4", "--encoder-embed-dim", "512",
             "--decoder-embed-dim", "512", "--encoder-ffn-embed-dim", "2048",
             "--decoder-ffn-embed-dim", "2048", "--encoder-attention-heads", "8",
             "--decoder-attention-heads", "8", "--share-all-embeddings"]
    d = _dummy_dictionary(8)

    def count(arch, *extra):
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           ["/dev/null", "--arch", arch, *shape, *extra])
        m = ARCH_MODEL_REGISTRY[arch].build_model(args, DictionaryTask(d))
        return sum(p.numel() for p in m.parameters())

    base = count("transformer")
    assert count(ARCH, "--context-integration", "encoder") - base == 9_456_128
    assert count(ARCH) - base == 3_152_384 + 8 * 1_575_936


def test_layerdrop_and_no_context_encoder_layers():
    """--encoder/decoder-layerdrop: every layer still gets the context;
    --context-encoder-layers 0: the context is its embeddings."""
    model, d = build(["--encoder-layerdrop", "0.5", "--decoder-layerdrop", "0.5"])
    model.train()
    src, prev = random_tokens(d, [5, 6], 1), random_tokens(d, [4, 5], 3, left_pad=False)
    torch.manual_seed(0)
    for _ in range(4):
        out, _ = model(src, None, prev, src_ctx_tokens=random_tokens(d, [6, 0], 4))
        assert torch.isfinite(out).all()
    model, d = build(["--context-encoder-layers", "0"])
    assert len(model.encoder.context_layers) == 0
    enc = model.encoder(src, src_ctx_tokens=random_tokens(d, [6, 0], 4))
    emb, _ = model.encoder.forward_embedding(random_tokens(d, [6, 0], 4))
    assert torch.allclose(enc["context_out"][0][:, 0], emb[0])


def test_ctx_bench_with_frozen_sentence_level(capsys):
    import json

    from ctx_fairseq.cli import bench

    tiny = ["--layers", "1", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32",
            "--vocab", "64", "--src-len", "6", "--tgt-len", "5", "--max-tokens", "40",
            "--infer-sentences", "2", "--beam", "2", "--repeats", "1", "--train-steps", "1",
            "--warmup", "0", "--doc-len", "2"]
    bench.cli_main(["--archs", f"{ARCH}[--freeze-sentence-level]", *tiny, "--json"])
    _, zhang = json.loads(capsys.readouterr().out)["results"]
    assert zhang["train_tokens_per_s"] > 0
