"""transformer_context_aware (Voita et al. 2018): gate equation, shared
layers, padding invariance, empty context (finite outputs and gradients),
beam reorder, two-stage initialisation, CLIs, contrastive hook, bench hook,
analyses."""

import json
import os

import pytest
import torch

import ctx_fairseq  # noqa: F401
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from ctx_fairseq.cli.arch_hooks import bench_hooks
from ctx_fairseq.models.transformer_context_aware import ContextAwareTransformerEncoder
from ctx_fairseq.modules.context_gate import ContextAwareEncoderLayer, ContextGate
from fairseq_cli_utils import (
    TINY_MODEL_ARGS,
    DictionaryTask,
    build_tiny_model,
    hypotheses,
    loaded_and_fresh,
    random_tokens,
    unpadded_row,
)

VOCAB = 40
DOC_ARGS = ["--task", "document_translation", "--source-context-size", "1"]


def build(extra=(), arch="transformer_context_aware", double=True):
    return build_tiny_model(arch, extra, vocab=VOCAB, double=double)


# --------------------------------------------------------------------------- structure


def test_gate_equation_by_hand():
    torch.manual_seed(0)
    gate = ContextGate(6).double()
    with torch.no_grad():
        gate.proj.bias.normal_()
    cs, cc = torch.randn(3, 2, 6).double(), torch.randn(3, 2, 6).double()
    out, g = gate(cs, cc)
    want_g = torch.sigmoid(torch.cat([cs, cc], -1) @ gate.proj.weight.T + gate.proj.bias)
    assert torch.allclose(g, want_g)
    assert torch.allclose(out, want_g * cs + (1 - want_g) * cc)
    assert g.shape == cs.shape  # a vector gate, per position and dimension


def test_structure_shared_layers_and_own_context_layer():
    model, _ = build()
    enc = model.encoder
    assert isinstance(enc, ContextAwareTransformerEncoder)
    assert len(enc.layers) == 2 and isinstance(enc.layers[-1], ContextAwareEncoderLayer)
    assert not isinstance(enc.layers[0], ContextAwareEncoderLayer)
    assert not isinstance(enc.context_layer, ContextAwareEncoderLayer)
    assert enc.context_layer is not enc.layers[-1]
    names = dict(model.named_parameters())
    assert "encoder.layers.1.gate.proj.weight" in names
    assert "encoder.layers.1.context_attn.k_proj.weight" in names
    assert "encoder.context_layer.self_attn.k_proj.weight" in names
    # the sentence-level layer names of the last layer are fairseq's
    assert "encoder.layers.1.self_attn.q_proj.weight" in names
    assert "encoder.layers.1.fc1.weight" in names


def test_context_encoder_uses_the_shared_layers():
    """Perturbing shared layer 1 changes the context encoder's output;
    perturbing the source's last layer does not."""
    model, d = build()
    src, ctx = random_tokens(d, [5], 1), random_tokens(d, [6], 2)
    out1 = model.encoder(src, src_ctx_tokens=ctx)["context_out"][0].clone()
    w = model.encoder.layers[0].fc2.weight
    saved = w.detach().clone()
    with torch.no_grad():
        w.add_(0.3 * torch.randn_like(w))
    out2 = model.encoder(src, src_ctx_tokens=ctx)["context_out"][0]
    assert not torch.allclose(out1, out2)
    last = model.encoder.layers[-1].fc2.weight
    with torch.no_grad():
        w.copy_(saved)
        last.add_(0.3 * torch.randn_like(last))  # source's last layer: not on the context path
    out3 = model.encoder(src, src_ctx_tokens=ctx)["context_out"][0]
    assert torch.allclose(out1, out3)


def test_context_changes_the_source_encoding():
    model, d = build()
    src = random_tokens(d, [5, 5], 1)
    src[1] = src[0]
    ctx = random_tokens(d, [6, 6], 3)
    out = model.encoder(src, src_ctx_tokens=ctx)["encoder_out"][0]
    assert not torch.allclose(out[:, 0], out[:, 1])


# --------------------------------------------------------------------------- padding / empty context


def test_padding_invariance_of_the_encoder():
    """Each (sentence, context) encodes the same alone and in a padded batch
    (left-padded source and context, one row without context)."""
    model, d = build()
    pad = d.pad()
    src = random_tokens(d, [3, 7, 5, 4], 11)
    ctx = random_tokens(d, [9, 0, 4, 12], 12)
    batch = model.encoder(src, src_ctx_tokens=ctx)
    for r in range(src.size(0)):
        s = unpadded_row(src, r, pad)
        alone = model.encoder(s, src_ctx_tokens=unpadded_row(ctx, r, pad))
        n = s.size(1)
        got = batch["encoder_out"][0][-n:, r]
        assert torch.allclose(got, alone["encoder_out"][0][:, 0], atol=1e-10), r
    # and the decoder on top of it
    prev = random_tokens(d, [4, 6, 3, 5], 13, left_pad=False)
    full, _ = model(src, None, prev, src_ctx_tokens=ctx)
    for r in range(src.size(0)):
        n = int(prev[r].ne(pad).sum())
        alone, _ = model(unpadded_row(src, r, pad), None, prev[r:r + 1, :n],
                         src_ctx_tokens=unpadded_row(ctx, r, pad))
        assert torch.allclose(full[r, :n], alone[0], atol=1e-9)


def test_empty_context_gives_finite_outputs_and_gradients():
    model, d = build(double=False)
    model.train()
    src = random_tokens(d, [5, 6, 4], 21)
    ctx = random_tokens(d, [0, 7, 0], 22)  # two sentences without context
    prev = random_tokens(d, [4, 5, 6], 23, left_pad=False)
    out, _ = model(src, None, prev, src_ctx_tokens=ctx)
    assert torch.isfinite(out).all()
    out.float().logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name
    # a batch where no sentence has context, and no context given at all
    model.zero_grad()
    empty = torch.full((3, 1), d.pad(), dtype=torch.long)
    out2, _ = model(src, None, prev, src_ctx_tokens=empty)
    out2.sum().backward()
    assert torch.isfinite(out2).all()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    ctx_params = [p for n, p in model.named_parameters()
                  if "context_attn" in n or "context_layer" in n]
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in ctx_params)


def test_empty_context_means_zero_context_attention():
    """With no context, c_c = 0: the output does not depend on the padding
    width of the (empty) context and equals the model run without context."""
    model, d = build()
    src = random_tokens(d, [6], 31)
    a = model.encoder(src, src_ctx_tokens=torch.full((1, 1), d.pad()))["encoder_out"][0]
    b = model.encoder(src, src_ctx_tokens=torch.full((1, 9), d.pad()))["encoder_out"][0]
    assert torch.allclose(a, b)
    with pytest.raises(ValueError, match="no context inputs"):
        model.encoder(src)  # never silently without context
    layer = model.encoder.layers[-1]
    layer.record = True
    model.encoder(src, src_ctx_tokens=torch.full((1, 3), d.pad()))
    g = layer.last_gate
    layer.record = False
    assert g is not None and g.shape == (6, 1, 32)


def test_reorder_encoder_out_handles_context_tensors():
    model, d = build()
    src, ctx = random_tokens(d, [4, 6, 5], 41), random_tokens(d, [3, 0, 8], 42)
    enc = model.encoder(src, src_ctx_tokens=ctx)
    order = torch.tensor([2, 2, 0, 1])
    re = model.encoder.reorder_encoder_out(enc, order)
    assert torch.equal(re["context_out"][0], enc["context_out"][0].index_select(1, order))
    assert torch.equal(re["context_padding_mask"][0], enc["context_padding_mask"][0][order])
    assert torch.equal(re["encoder_out"][0], enc["encoder_out"][0].index_select(1, order))


def test_presets():
    for arch, dim, layers in (("transformer_context_aware", 512, 6),
                              ("transformer_context_aware_small", 512, 6),
                              ("transformer_context_aware_tiny", 64, 2)):
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           ["/dev/null", "--arch", arch])
        assert args.encoder_embed_dim == dim and args.encoder_layers == layers
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       ["/dev/null", "--arch", "transformer_context_aware_small"])
    assert args.encoder_attention_heads == 4 and args.encoder_ffn_embed_dim == 1024


def test_bench_sample_trains():
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    model, d = build(double=False)
    task = DictionaryTask(d)
    task.target_dictionary = d
    sample = bench_hooks("transformer_context_aware").sample(task, None, 3, 6, 5, 2, "cpu")
    assert sample["net_input"]["src_ctx_tokens"].shape == (3, 12)
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    loss, _, _ = crit(model.train(), sample)
    loss.backward()
    assert torch.isfinite(loss)
    assert model.encoder.layers[-1].gate.proj.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------- CLIs


def test_cli_train_and_generate(context_ckpt, toy_bin):
    _, out = context_ckpt
    hyps = hypotheses(out)
    n = sum(1 for _ in open(os.path.join(toy_bin, "test.docids")))
    assert len(hyps) == n


def test_init_from_sentence_checkpoint(toy_bin, sentence_ckpt):
    from fairseq import checkpoint_utils

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [toy_bin, "--arch", "transformer_context_aware", *DOC_ARGS, *TINY_MODEL_ARGS,
         "--share-all-embeddings", "--init-from-sentence-checkpoint", sentence_ckpt])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    theirs = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"]
    shared, fresh = loaded_and_fresh(model, theirs)
    assert "encoder.layers.0.self_attn.k_proj.weight" in shared
    assert "encoder.layers.1.fc1.weight" in shared and "decoder.layers.1.fc2.bias" in shared
    assert any(k.startswith("encoder.layers.1.gate.") for k in fresh)
    assert any(k.startswith("encoder.context_layer.") for k in fresh)
    assert all(("gate" in k or "context" in k) for k in fresh), fresh
    # fresh parameters are really fresh, not copies
    assert not torch.equal(model.state_dict()["encoder.context_layer.fc1.weight"],
                           theirs["encoder.layers.1.fc1.weight"])
    # loading from this model's own checkpoint does not re-initialise
    model2 = task.build_model(cfg.model, from_checkpoint=True)
    assert not torch.equal(model2.state_dict()["encoder.layers.0.fc1.weight"],
                           theirs["encoder.layers.0.fc1.weight"])


def test_init_from_sentence_checkpoint_errors(toy_bin, sentence_ckpt, tmp_path):
    model, _ = build(double=False)  # vocabulary of 40: embeddings do not match
    with pytest.raises(ValueError, match="encoder.embed_tokens.weight has shape"):
        model.load_sentence_checkpoint(sentence_ckpt)
    with pytest.raises(FileNotFoundError, match="no such file"):
        model.load_sentence_checkpoint(str(tmp_path / "missing.pt"))


def test_demo_contrastive_and_shuffled(context_ckpt, toy_bin, toy_corpus):
    from ctx_fairseq.data.toy_corpus import read_contrastive

    ckpt, _ = context_ckpt
    jsonl = os.path.join(toy_corpus, "test.contrastive.jsonl")
    from ctx_fairseq.eval.analyses.context_aware_analysis import contrastive_with_context

    res = contrastive_with_context(ckpt, toy_bin, jsonl)
    n = len(read_contrastive(jsonl))
    assert res["overall"]["n"] == n
    assert set(res["by_phenomenon"]) <= {"pronoun", "lexical_cohesion"}
    assert {"overall", "by_phenomenon", "by_distance"} <= set(res)
    # ctx-score-contrastive takes the same path (with context), never the context-free one
    from ctx_fairseq.eval.scoring.contrastive import evaluate_checkpoint

    assert evaluate_checkpoint(ckpt, toy_bin, jsonl) == res
    shuffled = contrastive_with_context(ckpt, toy_bin, jsonl, ablation="shuffled")
    assert shuffled["overall"]["n"] == n


def test_demo_contrastive_checks_records(context_ckpt, toy_bin, toy_corpus, tmp_path):
    from ctx_fairseq.eval.analyses.context_aware_analysis import contrastive_with_context

    ckpt, _ = context_ckpt
    recs = [json.loads(x) for x in open(os.path.join(toy_corpus, "test.contrastive.jsonl"))]
    recs[0]["doc_id"] = "no-such-doc"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(ValueError, match="but the record says 'no-such-doc'"):
        contrastive_with_context(ckpt, toy_bin, str(bad))


def test_analysis_cli(context_ckpt, toy_bin, tmp_path):
    from ctx_fairseq.eval.analyses import context_aware_analysis as caa

    ckpt, _ = context_ckpt
    out = str(tmp_path / "ana")
    paths = caa.cli_main(["attention", "--path", ckpt, "--data", toy_bin, "--out-dir", out,
                          "--top-k", "5", "--min-count", "1"])
    res = json.load(open(paths["json"]))
    assert len(res["top_words"]) == 5
    vals = [w["attention_to_context"] for w in res["top_words"]]
    assert vals == sorted(vals, reverse=True) and all(0 < v < 1 for v in vals)
    assert 0 < res["mean_gate"]["all"] < 1 and res["mean_gate"]["without_context"] is not None
    assert abs(res["mean_attention_to_context"] + res["mean_gate"]["all"] - 1) < 1e-9
    paths = caa.cli_main(["bleu", "--path", ckpt, "--data", toy_bin, "--out-dir", out,
                          "--beam", "1", "--generate-args", "--max-len-b 12"])
    res = json.load(open(paths["json"]))
    assert res["true"]["sentences"] == res["shuffled"]["sentences"] > 0
    assert abs(res["difference"] - (res["true"]["bleu"] - res["shuffled"]["bleu"])) < 1e-9
    assert "| shuffled |" in open(paths["md"]).read()


def test_ctx_bench_runs_with_context(capsys):
    """ctx-bench builds the model, uses its bench hooks' sample (context of doc_len
    sentences) for training, FLOPs and beam search."""
    from ctx_fairseq.cli import bench

    tiny = ["--layers", "2", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32",
            "--vocab", "64", "--src-len", "6", "--tgt-len", "5", "--max-tokens", "40",
            "--infer-sentences", "3", "--beam", "2", "--repeats", "1", "--train-steps", "1",
            "--warmup", "0", "--doc-len", "2"]
    bench.cli_main(["--archs", "transformer_context_aware", *tiny, "--json"])
    report = json.loads(capsys.readouterr().out)
    base, ctx = report["results"]
    assert ctx["arch"] == "transformer_context_aware"
    # context encoder, context attention and gate cost FLOPs: the bound is below 1
    assert 0 < ctx["flops_ratio_bound"] < 1 and ctx["params"] > base["params"]
    assert ctx["infer_sentences_per_s"] > 0
