"""Acceptance on the toy corpus (slow: two small trainings, a few minutes on
one CPU core): a transformer_context_aware trained with
``--sample-context-size 1`` from a sentence-level stage 1 (the demo's shape
and schedule) uses its context as the paper measures it: CXMI against the
empty context above 0.05 nats with a document-bootstrap interval that
excludes 0, the curve over sizes 0..K has K+1 points, and its own
translations get the antecedent right (generative accuracy at distance 1
of at least 95 %)."""

import os

import pytest

from fairseq_cli_utils import preprocess, train

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

SHAPE = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64",
         "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
         "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4", "--share-all-embeddings", "--dropout", "0.1"]
OPTIM = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3",
         "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--criterion",
         "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "4096",
         "--max-update", "300", "--seed", "1", "--no-epoch-checkpoints",
         "--disable-validation", "--no-progress-bar", "--num-workers", "0"]


def test_sampled_context_model_uses_its_context(tmp_path):
    from ctx_fairseq.data.toy_corpus import make_toy_corpus
    from ctx_fairseq.eval.context_use import cxmi
    from ctx_fairseq.eval.scoring import generative_accuracy as ga

    raw, binned = str(tmp_path / "raw"), str(tmp_path / "bin")
    # every antecedent one sentence back: all of them within the model's one sentence
    make_toy_corpus(raw, docs=1000, sents_per_doc=10, max_distance=1, seed=1,
                    valid_docs=20, test_docs=100)
    preprocess(["--source-lang", "src", "--target-lang", "tgt", "--joined-dictionary",
                "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid",
                "--testpref", f"{raw}/test", "--destdir", binned, "--workers", "1"])
    for split in ("train", "valid", "test"):
        os.link(f"{raw}/{split}.docids", f"{binned}/{split}.docids")
    s1 = str(tmp_path / "s1")
    train([binned, "--arch", "transformer", *SHAPE, *OPTIM, "--save-dir", s1])
    ctx = str(tmp_path / "ctx")
    # twice the updates of stage 1: half the sentences train without context (k = 0)
    train([binned, "--arch", "transformer_context_aware", "--task", "document_translation",
           "--source-context-size", "1", "--sample-context-size", "1", *SHAPE, *OPTIM,
           "--max-update", "600", "--init-from-sentence-checkpoint", f"{s1}/checkpoint_last.pt",
           "--save-dir", ctx])
    ckpt = f"{ctx}/checkpoint_last.pt"

    model, task, cfg = cxmi.load(ckpt, binned, cuda=False)
    result, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["none"], curve=True,
                                  lang="de")
    res, _, _ = ga.evaluate(os.path.join(raw, "test.contrastive.jsonl"), path=ckpt,
                            data=binned, decoding=ga.Decoding(beam=4, max_len_b=20))
    d1 = {ph: by["1"] for ph, by in res["by_distance"].items() if "1" in by}
    correct = sum(v["correct"] for v in d1.values())
    n = sum(v["n"] for v in d1.values())
    print(f"CXMI {result['cxmi']:.4f} {result['cxmi_interval']}; generative accuracy at d=1 "
          f"{correct}/{n}")
    assert result["documents"] == 100 and result["sample_context_size"] == 1
    iv = result["cxmi_interval"]
    assert result["cxmi"] > 0.05, result["cxmi"]
    assert iv["low"] > 0, iv  # a document-bootstrap interval that excludes 0
    assert "document block bootstrap" in iv["method"]
    assert [p["context_size"] for p in result["curve"]] == [0, 1]  # K + 1 points
    assert n > 50 and correct / n >= 0.95, d1
