"""Gate analyses of transformer_hybrid (Fig. 2-4) on a tiny trained model."""

import argparse
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from ctx_fairseq.eval.analyses.hybrid_gates import (
    GateCollector,
    GateAnalysisError,
    cli_main,
    collect_gates,
    word_index_of_pieces,
)
from fairseq_cli_utils import REPO_ROOT, TINY_MODEL_ARGS, preprocess, train


def fake_bpe(word):
    """Split words longer than 4 characters subword-nmt style: 'letter' -> 'le@@ tt@@ er'."""
    if len(word) <= 4:
        return word
    pieces = [word[i:i + 2] for i in range(0, len(word), 2)]
    return "@@ ".join(pieces)


def tag_of(word):
    return {"the": "DET", "a": "DET", "it": "PRON", ".": "PUNCT"}.get(
        word, "NOUN" if len(word) > 4 else "X")


@pytest.fixture(scope="module")
def bpe_data(toy_corpus, tmp_path_factory):
    """The toy corpus with subword-split sources, binarized; plus POS tags per word."""
    raw = tmp_path_factory.mktemp("hybrid_bpe_raw")
    for split in ("train", "valid", "test"):
        with open(os.path.join(toy_corpus, f"{split}.src"), encoding="utf-8") as f:
            words = [line.split() for line in f]
        (raw / f"{split}.src").write_text(
            "".join(" ".join(fake_bpe(w) for w in ws) + "\n" for ws in words), encoding="utf-8")
        (raw / f"{split}.tags").write_text(
            "".join(" ".join(tag_of(w) for w in ws) + "\n" for ws in words), encoding="utf-8")
        shutil.copy(os.path.join(toy_corpus, f"{split}.tgt"), raw / f"{split}.tgt")
    dest = str(tmp_path_factory.mktemp("hybrid_bpe_bin"))
    preprocess(["--source-lang", "src", "--target-lang", "tgt",
                "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"),
                "--testpref", str(raw / "test"), "--destdir", dest, "--joined-dictionary",
                "--workers", "1"])
    return dest, str(raw)


def train_tiny(data, save_dir, *extra):
    train([data, "--arch", "transformer_hybrid", *TINY_MODEL_ARGS, *extra,
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "2",
           "--save-dir", save_dir, "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1",
           "--num-workers", "0", "--disable-validation"])
    return os.path.join(save_dir, "checkpoint_last.pt")


@pytest.fixture(scope="module")
def gate_ckpt(bpe_data, tmp_path_factory):
    return train_tiny(bpe_data[0], str(tmp_path_factory.mktemp("hybrid_gate_ckpt")),
                      "--hybrid-decoder-layers", "1", "--hybrid-gate-per-head")


def count_tokens(path):
    with open(path, encoding="utf-8") as f:
        return sum(len(line.split()) for line in f)


def is_png(path):
    """PNG magic bytes and a non-trivial size (a plot, not an empty canvas)."""
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 5000


def test_word_index_of_pieces():
    assert word_index_of_pieces(["le@@", "tt@@", "er", "is", "qu@@", "iet"]) == (
        [0, 0, 0, 1, 2, 2], 3)
    assert word_index_of_pieces([]) == ([], 0)
    assert word_index_of_pieces(["a@@"]) == ([0], 1)  # a dangling marker ends the line


def test_gates_per_layer(bpe_data, gate_ckpt, tmp_path):
    data, raw = bpe_data
    paths = cli_main([data, "--path", gate_ckpt, "--split", "valid", "--out-dir", str(tmp_path)])
    for ext in ("tsv", "json", "png"):
        assert os.path.exists(paths[f"layers.{ext}"])
    assert is_png(paths["layers.png"])
    res = json.load(open(paths["layers.json"]))
    names = [r["layer"] for r in res["layers"]]
    assert names == ["encoder.1", "encoder.2", "decoder.1"]
    # every real source piece counted once; padding and </s> excluded
    n_src, n_tgt = count_tokens(f"{raw}/valid.src"), count_tokens(f"{raw}/valid.tgt")
    assert [r["tokens"] for r in res["layers"]] == [n_src, n_src, n_tgt]
    for r in res["layers"]:
        assert 0 < r["mean_gate"] < 1 and len(r["per_head"]) == 2
        assert abs(sum(r["per_head"]) / 2 - r["mean_gate"]) < 1e-9
    lines = open(paths["layers.tsv"]).read().splitlines()
    assert lines[0].startswith("layer\tmean_gate") and lines[1].startswith("encoder.1\t")

    # batching (and so padding) does not change the means
    one = collect_gates(gate_ckpt, data, "valid", batch_size=3, cpu=True).layer_results()
    for a, b in zip(one["layers"], res["layers"]):
        assert abs(a["mean_gate"] - b["mean_gate"]) < 1e-6, (a, b)


def test_gates_by_pos(bpe_data, gate_ckpt, tmp_path):
    data, raw = bpe_data
    tags = f"{raw}/valid.tags"
    paths = cli_main([data, "--path", gate_ckpt, "--split", "valid", "--pos-tags", tags,
                      "--pos-layer", "encoder.2", "--out-dir", str(tmp_path)])
    for ext in ("tsv", "json", "png"):
        assert os.path.exists(paths[f"pos.{ext}"])
    assert is_png(paths["pos.png"])
    res = json.load(open(paths["pos.json"]))
    expected = {}
    for line in open(tags):
        for t in line.split():
            expected[t] = expected.get(t, 0) + 1
    assert {t["tag"]: t["words"] for t in res["tags"]} == expected
    assert set(res["mean_gate"]) == {"encoder.1", "encoder.2"}
    assert res["plotted_layer"] == "encoder.2"
    for layer, values in res["mean_gate"].items():
        assert set(values) == set(expected)
        assert all(0 < v < 1 for v in values.values())


def test_pos_word_aggregation_matches_manual(bpe_data, gate_ckpt):
    """A word's gate is the mean over its pieces; a tag's the mean over its words."""
    data, raw = bpe_data
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [gate_ckpt], arg_overrides={"data": data})
    model = models[0].eval()
    d = task.source_dictionary
    src_lines = open(f"{raw}/valid.src").read().splitlines()
    tag_lines = open(f"{raw}/valid.tags").read().splitlines()
    sid = next(i for i, line in enumerate(src_lines) if "@@" in line)
    pieces, tags = src_lines[sid].split(), tag_lines[sid].split()
    src = torch.tensor([[d.index(p) for p in pieces] + [d.eos()]])
    assert d.unk() not in src
    col = GateCollector(model, d, [None] * sid + [tags], "manual.tags")
    with torch.no_grad(), col:
        model.encoder(src, src_lengths=torch.tensor([src.size(1)]))
        g = dict(col.modules)["encoder.1"].last_gate.double().mean(-1)[:, 0].tolist()
        col.add_batch({"id": torch.tensor([sid]), "net_input": {"src_tokens": src}})
    words, current = [], []  # by hand
    for piece, gate in zip(pieces, g):
        current.append(gate)
        if not piece.endswith("@@"):
            words.append(sum(current) / len(current))
            current = []
    assert len(words) == len(tags) and len(words) < len(pieces)
    expected = {}
    for tag, value in zip(tags, words):
        expected.setdefault(tag, []).append(value)
    got = col.pos_results()["mean_gate"]["encoder.1"]
    assert set(got) == set(expected)
    for tag, values in expected.items():
        assert abs(got[tag] - sum(values) / len(values)) < 1e-12, tag


def test_pos_tag_count_mismatch_names_file_and_line(bpe_data, gate_ckpt, tmp_path):
    data, raw = bpe_data
    lines = open(f"{raw}/valid.tags").read().splitlines()
    lines[2] = " ".join(lines[2].split()[:-1])  # one tag short on line 3
    bad = tmp_path / "bad.tags"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit, match=rf"{bad}:3: .* tags but the source sentence has"):
        cli_main([data, "--path", gate_ckpt, "--pos-tags", str(bad), "--out-dir", str(tmp_path)])
    short = tmp_path / "short.tags"
    short.write_text("\n".join(lines[:2]) + "\n")
    with pytest.raises(SystemExit, match=rf"{short}"):
        cli_main([data, "--path", gate_ckpt, "--pos-tags", str(short), "--out-dir",
                  str(tmp_path)])


def test_analysis_needs_gated_layers():
    import ctx_fairseq  # noqa: F401
    from fairseq.data import Dictionary
    from ctx_fairseq.models.transformer_hybrid import TransformerHybridModel

    d = Dictionary()
    task = argparse.Namespace(source_dictionary=d, target_dictionary=d)
    args = argparse.Namespace(arch="transformer_hybrid", hybrid_mode="concat",
                              encoder_layers=2, decoder_layers=1, encoder_embed_dim=8,
                              decoder_embed_dim=8, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_embed_dim=8,
                              decoder_ffn_embed_dim=8)
    model = TransformerHybridModel.build_model(args, task)
    with pytest.raises(GateAnalysisError, match="no gated hybrid layers.*concat"):
        GateCollector(model, d)


def _bleu_json(run_dir, score, tok=None, sig="nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0",
               tok_sig="nrefs:1|case:mixed|eff:no|tok:none|smooth:exp|version:2.4.0"):
    """bleu.json as the recipes' evaluation (sent_py evaluate) writes it."""
    res = {"sentences": 3, "generate_output": str(run_dir / "generate-valid.txt"),
           "reference": "/ref/valid.tgt", "tokenized_reference": "/tok/valid.tgt",
           "sacrebleu": {"score": score, "text": f"BLEU = {score}", "signature": sig,
                         "tokenize": "13a"},
           "tokenized_bleu": None}
    if tok is not None:
        res["tokenized_bleu"] = {"score": tok, "text": f"BLEU = {tok}", "signature": tok_sig,
                                 "tokenize": "none", "label": "multi-bleu.perl"}
    (run_dir / "bleu.json").write_text(json.dumps(res))


def test_window_sweep_summary(bpe_data, gate_ckpt, tmp_path):
    """The summary takes each run's BLEU from its bleu.json (the recipes' scoring
    against the reference files), names the metrics and their signatures, and
    never scores the generate output's T- lines itself."""
    data, _ = bpe_data
    runs = []
    scores = {1: (20.5, 22.25), 3: (18.0, 19.75)}
    for m in (1, 3):
        run_dir = tmp_path / f"m{m}"
        run_dir.mkdir()
        # m = 1 is the default of the module's checkpoint; train one more with m = 3
        ckpt = gate_ckpt if m == 1 else train_tiny(data, str(run_dir / "ckpt"),
                                                    "--hybrid-window", str(m))
        # a generate output whose T- lines would score 100: not what is reported
        (run_dir / "generate-valid.txt").write_text("S-0\ta b\nT-0\tx y\nH-0\t-0.1\tx y\n")
        cli_main([data, "--path", ckpt, "--split", "valid", "--out-dir", str(run_dir)])
        _bleu_json(run_dir, *scores[m])
        runs.append(f"{m}={run_dir}")
    out = tmp_path / "sweep"
    paths = cli_main(["sweep", *runs, "--out-dir", str(out)])
    res = json.load(open(paths["json"]))
    assert [r["window"] for r in res["runs"]] == [1, 3]
    assert [r["window_size"] for r in res["runs"]] == [3, 7]
    assert [(r["sacrebleu"], r["tokenized_bleu"]) for r in res["runs"]] == [scores[1], scores[3]]
    for r in res["runs"]:
        assert 0 < r["mean_gate"] < 1 and "bleu" not in r
    assert res["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "tok:none" in res["tokenized_bleu_signature"]
    assert res["tokenized_bleu_label"] == "multi-bleu.perl" and res["plotted"] == "tokenized_bleu"
    assert is_png(paths["png"])
    tsv = open(paths["tsv"]).read().splitlines()
    assert tsv[0] == "m\twindow_size\tsacrebleu\ttokenized_bleu\tmean_gate"
    assert tsv[1].startswith("1\t3\t20.50\t22.25\t")
    md = open(paths["md"]).read()
    assert "| m | window size 2m+1 | sacreBLEU | tokenized BLEU (multi-bleu.perl) | mean gate |" in md
    assert res["sacrebleu_signature"] in md and res["tokenized_bleu_signature"] in md
    assert "/ref/valid.tgt" in md and "/tok/valid.tgt" in md
    assert not [p for p in os.listdir(out) if ".part" in p]
    with pytest.raises(SystemExit, match="expected M=DIR"):
        cli_main(["sweep", str(tmp_path)])
    # runs scored differently are not put side by side
    _bleu_json(tmp_path / "m3", 18.0, 19.75, sig="nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.4.0")
    with pytest.raises(SystemExit, match="differ in sacreBLEU signature"):
        cli_main(["sweep", *runs, "--out-dir", str(out)])
    _bleu_json(tmp_path / "m3", 18.0)
    with pytest.raises(SystemExit, match="some runs have a tokenized BLEU and others not"):
        cli_main(["sweep", *runs, "--out-dir", str(out)])
    # sacreBLEU only: the figure's metric is sacreBLEU
    _bleu_json(tmp_path / "m1", 20.5)
    res = json.load(open(cli_main(["sweep", *runs, "--out-dir", str(out)])["json"]))
    assert res["plotted"] == "sacrebleu" and res["tokenized_bleu_signature"] is None
    assert [r["tokenized_bleu"] for r in res["runs"]] == [None, None]
    assert open(out / "hybrid_window_sweep.tsv").read().splitlines()[1].startswith("1\t3\t20.50\t-\t")


def test_window_sweep_needs_scored_runs(bpe_data, gate_ckpt, tmp_path):
    """A run without bleu.json (only a generate output) is an error naming the
    file, not a BLEU of the output's T- lines."""
    data, _ = bpe_data
    run_dir = tmp_path / "m1"
    run_dir.mkdir()
    (run_dir / "generate-valid.txt").write_text("S-0\ta b\nT-0\tx y\nH-0\t-0.1\tx y\n")
    cli_main([data, "--path", gate_ckpt, "--split", "valid", "--out-dir", str(run_dir)])
    with pytest.raises(SystemExit, match=rf"{run_dir}/bleu.json: missing"):
        cli_main(["sweep", f"1={run_dir}", "--out-dir", str(tmp_path)])
    (run_dir / "bleu.json").write_text(json.dumps({"bleu": 12.5}))
    with pytest.raises(SystemExit, match="not a BLEU result of the recipes' evaluation"):
        cli_main(["sweep", f"1={run_dir}", "--out-dir", str(tmp_path)])


@pytest.mark.slow
def test_window_sweep_recipe(bpe_data, tmp_path):
    """recipes/hybrid_window_sweep.sh: each window trained through recipe.sh's
    train() (train.args, train.done) and scored against the reference FILES
    (not the T- lines); a re-run skips the finished windows, a re-run with other
    options stops at them."""
    import sacrebleu

    data, raw = bpe_data
    # references that differ from the data's target side (what the T- lines
    # hold): the scores must follow these files
    ref = tmp_path / "ref.valid.tgt"
    tgt = open(f"{raw}/valid.tgt", encoding="utf-8").read().splitlines()
    ref.write_text("".join(f"{t} extra\n" for t in tgt), encoding="utf-8")
    tok_ref = tmp_path / "tok.valid.tgt"
    tok_ref.write_text("".join(f"{t} more words\n" for t in tgt), encoding="utf-8")
    out = tmp_path / "sweep"
    env = dict(os.environ, DATA=data, OUT=str(out), WINDOWS="1 2", MAX_UPDATE="2",
               ARCH="transformer_hybrid", GEN_SUBSET="valid",
               MODEL_ARGS=" ".join(TINY_MODEL_ARGS),
               TRAIN_ARGS="--optimizer adam --lr 1e-3 --max-tokens 500 --disable-validation "
                          "--num-workers 0",
               GEN_ARGS="--beam 2 --max-len-b 20 --remove-bpe", PYTHON=sys.executable,
               REF=str(ref), DETOK="0", TOK_REF=str(tok_ref), TOK_LABEL="multi-bleu.perl",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    script = os.path.join(REPO_ROOT, "recipes", "hybrid_window_sweep.sh")
    res = subprocess.run(["bash", script, "--cpu"], env=env, cwd=REPO_ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    summary = json.load(open(out / "hybrid_window_sweep.json"))
    assert [r["window"] for r in summary["runs"]] == [1, 2]
    assert summary["tokenized_bleu_label"] == "multi-bleu.perl"
    assert "tok:13a" in summary["sacrebleu_signature"]
    assert "tok:none" in summary["tokenized_bleu_signature"]
    for r, m in zip(summary["runs"], (1, 2)):
        assert os.path.exists(out / "ckpt" / f"m{m}" / "train.done")
        assert f"arg=--hybrid-window\narg={m}\n" in open(out / "ckpt" / f"m{m}" / "train.args").read()
        hyps = open(out / f"m{m}" / "hyp.tok", encoding="utf-8").read().splitlines()
        assert len(hyps) == len(tgt)
        assert r["sacrebleu"] == round(sacrebleu.corpus_bleu(hyps, [ref.read_text().splitlines()]).score, 2)
        assert r["tokenized_bleu"] == round(sacrebleu.corpus_bleu(
            hyps, [tok_ref.read_text().splitlines()], tokenize="none").score, 2)
        t_lines = [line.split("\t", 1)[1] for line in
                   open(out / f"m{m}" / "generate-valid.txt", encoding="utf-8")
                   if line.startswith("T-")]
        assert len(t_lines) == len(tgt)
    for p in ("tsv", "json", "md", "png"):
        assert os.path.exists(out / f"hybrid_window_sweep.{p}")
    md = open(out / "hybrid_window_sweep.md").read()
    assert "tokenized BLEU (multi-bleu.perl)" in md and str(ref) in md and str(tok_ref) in md
    assert not [p for p in out.rglob("*") if ".part" in p.name]
    # a re-run skips both windows (their markers match) and rewrites the summary
    res2 = subprocess.run(["bash", script, "--cpu"], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True)
    assert res2.returncode == 0, res2.stderr[-3000:]
    assert "skip m1 (done" in res2.stderr and "skip m2 (done" in res2.stderr
    # other training options: an error naming the difference, no training
    res3 = subprocess.run(["bash", script, "--cpu"], env=dict(env, MAX_UPDATE="3"), cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert res3.returncode != 0
    assert "step m1 was done with other settings" in res3.stderr, res3.stderr[-3000:]
