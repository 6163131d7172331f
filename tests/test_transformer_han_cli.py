"""transformer_han through its tools: statistics, bench and demo hooks, the
CLIs (train, generate, iterative decoding, own target context, interactive),
two-stage initialisation, the joint model from the encoder checkpoint,
contrastive scoring, ctx-bench and ctx-demo."""

import json
import os

import pytest
import torch

import ctx_fairseq  # noqa: F401
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from ctx_fairseq.cli.arch_hooks import bench_hooks, demo_hooks
from fairseq_cli_utils import (
    TINY_MODEL_ARGS,
    DictionaryTask,
    generate,
    hypotheses,
    loaded_and_fresh,
    train_and_generate,
)
from han_utils import (
    HAN_ARGS,
    HAN_ENC_ARGS,
    build,
    batch,
    run,
)


# --------------------------------------------------------------------------- statistics, hooks


def test_context_statistics():
    model, d = build(double=False)
    net, _ = batch(d, [3, 0], 19)
    model.record_context_statistics(True)
    run(model, net)
    st = model.context_statistics()
    assert list(st) == ["gate_enc", "ctx_mass_enc", "ctx_frac_enc", "gate_dec", "ctx_mass_dec",
                        "ctx_frac_dec"]
    n_src = int(net["src_tokens"][0].ne(d.pad()).sum())
    assert st["ctx_frac_enc"][0] == n_src
    assert st["ctx_frac_enc"][1] == int(net["src_tokens"].ne(d.pad()).sum())
    assert 0 < st["gate_enc"][0] / st["gate_enc"][1] < 1
    model.record_context_statistics(False)
    assert model.encoder.last_statistics is None


def test_bench_sample_trains():
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    model, d = build(double=False)
    task = DictionaryTask(d)
    sample = bench_hooks("transformer_han").sample(task, model.args, 3, 6, 5, 1, "cpu")
    assert sample["net_input"]["src_ctx_tokens"].shape == (3, 18)
    assert sample["net_input"]["tgt_ctx_tokens"].shape == (3, 15)
    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    loss, _, _ = crit(model.train(), sample)
    loss.backward()
    assert torch.isfinite(loss)
    assert model.encoder.han.gate.weight.grad.abs().sum() > 0
    assert model.decoder.han.word_attn.k_proj.weight.grad.abs().sum() > 0


def test_demo_hooks():
    hooks = demo_hooks("transformer_han")
    assert hooks is demo_hooks("transformer_han_enc")  # one model, its presets
    assert hooks.archs == ["transformer_han"] and hooks.stage1 == "transformer"
    assert hooks.train_args_for("transformer_han") == HAN_ARGS
    assert hooks.generate_args_for("transformer_han_enc") == HAN_ENC_ARGS
    assert hooks.generate_command("transformer_han_enc", "py", "D", "C", "O") is None
    cmd = hooks.generate_command("transformer_han", "py", "D", "C", "O", first_pass="S")
    assert "ctx_fairseq.cli.iterative_decode" in cmd
    assert cmd[cmd.index("--first-pass-path") + 1] == "S"
    assert cmd[cmd.index("--") + 1:] == HAN_ARGS


# --------------------------------------------------------------------------- CLIs


@pytest.fixture(scope="module")
def han_ckpt(toy_bin, sentence_ckpt, tmp_path_factory):
    """Two-stage: transformer_han (joint) initialised from the sentence
    checkpoint, trained 3 updates, then beam-searched by fairseq-generate
    with the references as previous target sentences."""
    save = str(tmp_path_factory.mktemp("han"))
    out = train_and_generate(
        toy_bin, save, "transformer_han",
        extra=[*HAN_ARGS, "--share-all-embeddings", "--init-from-sentence-checkpoint",
               sentence_ckpt, "--criterion", "label_smoothed_cross_entropy_ctx"],
        gen_extra=[*HAN_ARGS, "--gold-target-context"])
    return os.path.join(save, "checkpoint_last.pt"), out


def _n_test(toy_bin):
    return sum(1 for _ in open(os.path.join(toy_bin, "test.docids")))


def test_cli_train_and_generate(han_ckpt, toy_bin):
    _, out = han_ckpt
    assert len(hypotheses(out)) == _n_test(toy_bin)


def test_cli_generate_needs_the_target_context(han_ckpt, toy_bin):
    ckpt, _ = han_ckpt
    with pytest.raises(ValueError, match="--gold-target-context"):
        generate([toy_bin, "--path", ckpt, "--gen-subset", "test", "--beam", "2",
                  "--max-tokens", "500", "--num-workers", "0", *HAN_ARGS])


def test_cli_han_encoder_trains_and_generates(toy_bin, sentence_ckpt, tmp_path):
    out = train_and_generate(
        toy_bin, str(tmp_path / "enc"), "transformer_han_enc",
        extra=[*HAN_ENC_ARGS, "--share-all-embeddings", "--init-from-sentence-checkpoint",
               sentence_ckpt, "--freeze-sentence-level"],
        gen_extra=HAN_ENC_ARGS, max_update=2)
    assert len(hypotheses(out)) == _n_test(toy_bin)


def test_cli_iterative_decoding(han_ckpt, sentence_ckpt, toy_bin, tmp_path):
    """The demo's decoding: pass 1 by the stage-1 model, pass 2 by the HAN
    with pass 1's translations as previous target sentences."""
    from ctx_fairseq.cli import iterative_decode as itd

    ckpt, _ = han_ckpt
    out = str(tmp_path / "dec")
    res = itd.iterative_decode(toy_bin, ckpt, out, passes=2, first_pass_path=sentence_ckpt,
                               beam=2, generate_args=[*HAN_ARGS, "--max-len-b", "10"])
    assert len(hypotheses(res["output"])) == _n_test(toy_bin)


def test_cli_own_target_context(han_ckpt, toy_bin, monkeypatch):
    """fairseq-generate --own-target-context: each sentence's previous target
    sentences are the model's own translations, re-collated by the task in
    the layout the HAN reads (one sentence per row, built by the collater)."""
    from ctx_fairseq.models.transformer_han import HANEncoder

    ckpt, _ = han_ckpt
    seen = []
    real = HANEncoder.forward

    def spy(self, src_tokens, *args, **kw):
        seen.append(kw.get("tgt_ctx_sentences") is not None)
        return real(self, src_tokens, *args, **kw)

    monkeypatch.setattr(HANEncoder, "forward", spy)
    out = generate([toy_bin, "--path", ckpt, "--gen-subset", "test", "--beam", "2",
                    "--max-tokens", "500", "--num-workers", "0", "--max-len-b", "6",
                    *HAN_ARGS, "--own-target-context"])
    assert len(hypotheses(out)) == _n_test(toy_bin)
    assert seen and all(seen)


def test_cli_interactive_uses_its_own_translations(han_ckpt, toy_bin, toy_corpus, tmp_path,
                                                   monkeypatch):
    """fairseq-interactive: the previous target sentences are the model's own
    translations of the document's previous lines."""
    from fairseq.data import Dictionary

    from ctx_fairseq.models.transformer_han import HANEncoder
    from fairseq_cli_utils import interactive

    ckpt, _ = han_ckpt
    src = open(os.path.join(toy_corpus, "test.src")).read().splitlines()
    inp = tmp_path / "input.txt"
    inp.write_text("\n".join(src[:3]) + "\n")
    d = Dictionary.load(os.path.join(toy_bin, "dict.tgt.txt"))
    seen = []
    real = HANEncoder.forward

    def spy(self, src_tokens, *args, **kw):
        t = kw["tgt_ctx_tokens"]
        seen.append([d.string(r[r.ne(d.pad())]) for r in t])
        return real(self, src_tokens, *args, **kw)

    monkeypatch.setattr(HANEncoder, "forward", spy)
    out = interactive([toy_bin, "--path", ckpt, *HAN_ARGS, "--source-lang", "src",
                       "--target-lang", "tgt", "--beam", "2", "--max-len-b", "6",
                       "--input", str(inp), "--buffer-size", "3", "--batch-size", "3"])
    hyps = [line.split("\t")[2] for line in out.splitlines() if line.startswith("H-")]
    assert len(hyps) == 3 and len(seen) == 3
    assert seen[0] == [""] and seen[1] == [hyps[0]] and seen[2] == [hyps[0] + " " + hyps[1]]


def test_init_from_sentence_checkpoint_and_freeze(toy_bin, sentence_ckpt):
    from fairseq import checkpoint_utils

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [toy_bin, "--arch", "transformer_han", *HAN_ARGS, *TINY_MODEL_ARGS,
         "--share-all-embeddings", "--init-from-sentence-checkpoint", sentence_ckpt,
         "--freeze-sentence-level"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    theirs = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"]
    _, fresh = loaded_and_fresh(model, theirs)
    assert all(k.startswith("encoder.han.") or k.startswith("decoder.han.") for k in fresh), fresh
    assert any(k.startswith("decoder.han.") for k in fresh)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.han_parameters()}
    # loading this model's own checkpoint does not re-initialise
    model2 = task.build_model(cfg.model, from_checkpoint=True)
    assert not torch.equal(model2.state_dict()["encoder.layers.0.fc1.weight"],
                           theirs["encoder.layers.0.fc1.weight"])


def test_joint_model_from_the_han_encoder_checkpoint(han_ckpt, toy_bin, tmp_path):
    """The paper's joint model starts from the HAN encoder: a HAN checkpoint
    given to --init-from-sentence-checkpoint fills the HAN modules too."""
    from fairseq import checkpoint_utils

    ckpt, _ = han_ckpt
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [toy_bin, "--arch", "transformer_han", *HAN_ARGS, *TINY_MODEL_ARGS,
         "--share-all-embeddings", "--init-from-sentence-checkpoint", ckpt])
    cfg = convert_namespace_to_omegaconf(args)
    model = tasks.setup_task(cfg.task).build_model(cfg.model)
    theirs = checkpoint_utils.load_checkpoint_to_cpu(ckpt)["model"]
    assert torch.equal(model.state_dict()["encoder.han.gate.weight"],
                       theirs["encoder.han.gate.weight"])


def test_contrastive_scoring(han_ckpt, toy_bin, toy_corpus):
    """ctx-score-contrastive builds the HAN's context through the task."""
    from ctx_fairseq.eval.scoring.contrastive import evaluate_checkpoint
    from ctx_fairseq.eval.scoring.suite_report import SuiteOptions
    from ctx_fairseq.data.toy_corpus import read_contrastive

    ckpt, _ = han_ckpt
    jsonl = os.path.join(toy_corpus, "test.contrastive.jsonl")
    res = evaluate_checkpoint(ckpt, toy_bin, jsonl, SuiteOptions(gold_target_context=True))
    assert res["overall"]["n"] == len(read_contrastive(jsonl))
    assert {"overall", "by_phenomenon", "by_distance"} <= set(res)
    with pytest.raises(ValueError, match="target"):
        evaluate_checkpoint(ckpt, toy_bin, jsonl)  # never the references silently


def test_ctx_bench_runs(capsys):
    from ctx_fairseq.cli import bench

    tiny = ["--layers", "2", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32",
            "--vocab", "64", "--src-len", "6", "--tgt-len", "5", "--max-tokens", "40",
            "--infer-sentences", "3", "--beam", "2", "--repeats", "1", "--train-steps", "1",
            "--warmup", "0"]
    bench.cli_main(["--archs", "transformer_han,transformer_han_enc", *tiny, "--json"])
    report = json.loads(capsys.readouterr().out)
    base, joint, enc = report["results"]
    assert joint["arch"] == "transformer_han" and enc["arch"] == "transformer_han_enc"
    assert 0 < joint["flops_ratio_bound"] < enc["flops_ratio_bound"] < 1
    assert joint["params"] > enc["params"] > base["params"]
    assert joint["infer_sentences_per_s"] > 0


@pytest.mark.slow
def test_ctx_demo_runs_the_han(tmp_path, capsys, monkeypatch):
    """ctx-demo: stage 1 (transformer), then the HAN initialised from it,
    translated by two-pass iterative decoding and scored with its context
    (about 90 s: every step is a new process)."""
    from ctx_fairseq.cli import demo

    monkeypatch.setattr(demo, "DEMO_MODEL_ARGS", [
        "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
        "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--share-all-embeddings"])
    work = str(tmp_path / "demo")
    demo.cli_main(["--workdir", work, "--archs", "transformer_han", "--docs", "12",
                   "--sents-per-doc", "5", "--max-distance", "2", "--max-update", "2"])
    out = capsys.readouterr().out
    assert "train transformer_han (from transformer)" in out
    res = json.load(open(os.path.join(work, "results", "transformer_han.json")))
    assert res["sentences"] > 0 and res["contrastive"]["overall"]["n"] > 0
    gen = os.path.join(work, "generate", "transformer_han")
    assert os.path.exists(os.path.join(gen, "generate-pass2.txt"))
    log = open(os.path.join(work, "logs", "train-transformer_han.log")).read()
    assert "init from sentence-level checkpoint" in log
