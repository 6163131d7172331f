"""Analyses of transformer_dc: JS divergence between global and local attention
(Eq. 10-13, ctx-dc-jsd) and BLEU by source length (Fig. 5, ctx-bleu-by-length)."""

import json
import math
import os

import pytest
import torch

import ctx_fairseq  # noqa: F401
from ctx_fairseq.eval.scoring import bleu_by_length as bbl
from ctx_fairseq.eval.analyses import dc_jsd
from fairseq_cli_utils import TINY_MODEL_ARGS, generate, hypotheses, train
from test_transformer_dc import build, rand_tokens

LN2 = math.log(2)


# --------------------------------------------------------------------------- JSD maths


def test_js_divergence_properties():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]], dtype=torch.float64)
    q = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    js = dc_jsd.js_divergence(p, q)
    assert js[0].item() == pytest.approx(LN2)  # disjoint supports: the bound
    assert torch.allclose(js, dc_jsd.js_divergence(q, p))  # symmetric
    assert torch.allclose(dc_jsd.js_divergence(p, p), torch.zeros(2, dtype=torch.float64))
    m = 0.5 * (p[1] + q[1])
    kl = lambda a, b: float((a * (a / b).log()).sum())
    assert js[1].item() == pytest.approx(0.5 * kl(p[1], m) + 0.5 * kl(q[1], m))


def test_reduce_heads_max_is_elementwise_and_renormalised():
    a = torch.tensor([[[[0.6, 0.4]], [[0.1, 0.9]]]])  # B=1, H=2, T=1, S=2
    out = dc_jsd.reduce_heads(a, "max")
    assert torch.allclose(out, torch.tensor([[[0.6 / 1.5, 0.9 / 1.5]]]))
    assert torch.allclose(dc_jsd.reduce_heads(a, "mean"), torch.tensor([[[0.35, 0.65]]]))
    with pytest.raises(ValueError, match="--head-reduce"):
        dc_jsd.reduce_heads(a, "min")


def test_attention_probs_match_fairseq_attention():
    """The recomputed per-head distributions average to what fairseq's
    MultiheadAttention itself returns, for h_g and h_l."""
    model, d, _ = build("transformer_dc")
    dc = model.encoder.layers[0].self_attn
    x = torch.randn(5, 2, 32, dtype=torch.float64)
    kpm = torch.tensor([[True, False, False, False, False], [False] * 5])
    a_g, a_l = dc.attention_probs(x, kpm)
    assert a_g.shape == (2, 2, 5, 5)
    _, w_g = dc.global_attn(x, x, x, key_padding_mask=kpm, need_weights=True)
    l_c = dc.local_context(x, kpm)
    _, w_l = dc.local_attn(x, l_c, l_c, key_padding_mask=kpm, need_weights=True)
    assert torch.allclose(a_g.mean(1), w_g, atol=1e-6)
    assert torch.allclose(a_l.mean(1), w_l, atol=1e-6)
    assert float(a_g[0, :, :, 0].abs().max()) == 0.0  # no mass on the pad


def test_encoder_jsd_is_padding_invariant_and_bounded():
    model, d, _ = build("transformer_dc", ["--encoder-layers", "3", "--dc-encoder-layers", "1,3"])
    s1, s2 = rand_tokens(d, 1, 4, seed=1), rand_tokens(d, 1, 7, seed=2)
    batch = torch.full((2, 7), d.pad(), dtype=torch.long)
    batch[0, 3:], batch[1] = s1[0], s2[0]  # left padded
    sample = lambda t: {"net_input": {"src_tokens": t, "src_lengths": t.ne(d.pad()).sum(1)}}
    together = dc_jsd.encoder_jsd(model, [sample(batch)])
    alone = [dc_jsd.encoder_jsd(model, [sample(s)]) for s in (s1, s2)]
    assert set(together["layers"]) == {"1", "3"}
    assert together["num_tokens"] == 11 and together["num_sentences"] == 2
    for l in ("1", "3"):
        expect = (4 * alone[0]["layers"][l] + 7 * alone[1]["layers"][l]) / 11
        assert together["layers"][l] == pytest.approx(expect, rel=1e-9)
        assert 0.0 < together["layers"][l] < LN2
    assert together["E_d"] == pytest.approx(sum(together["layers"].values()) / 2)


def test_encoder_jsd_needs_dc_layers():
    model, _, _ = build("transformer_dc", ["--dc-encoder-layers", "none"])
    with pytest.raises(ValueError, match="no DC encoder layers"):
        dc_jsd.encoder_jsd(model, [])


# --------------------------------------------------------------------------- CLIs


@pytest.fixture(scope="module")
def tiny_enc_dc(toy_bin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("dc_analysis_ckpt"))
    train([toy_bin, "--arch", "transformer_dc", *TINY_MODEL_ARGS,
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "2",
           "--save-dir", save, "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1",
           "--num-workers", "0", "--disable-validation"])
    return os.path.join(save, "checkpoint_last.pt")


def _is_png(path):
    """PNG magic bytes and a non-trivial size (a plot, not an empty canvas)."""
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 5000


def test_dc_jsd_cli(tiny_enc_dc, toy_bin, tmp_path):
    out = tmp_path / "jsd"
    paths = dc_jsd.cli_main([toy_bin, "--path", tiny_enc_dc, "--path", tiny_enc_dc,
                             "--label", "a", "--label", "b", "--split", "test",
                             "--max-sentences", "20", "--out-dir", str(out), "--cpu"])
    res = json.load(open(paths["json"]))["results"]
    assert [r["label"] for r in res] == ["a", "b"]
    assert set(res[0]["layers"]) == {"1", "2"} and res[0]["kernel_size"] == 2
    assert res[0]["num_sentences"] == 20
    assert all(0.0 < v < LN2 for v in res[0]["layers"].values())
    assert res[0]["E_d"] == pytest.approx(res[1]["E_d"])  # same checkpoint, same data
    table = open(paths["md"]).read()
    assert "dv^1" in table and "E_d" in table and f"{res[0]['E_d']:.4f}" in table
    assert _is_png(paths["png"])
    with pytest.raises(SystemExit, match="one label per checkpoint"):
        dc_jsd.cli_main([toy_bin, "--path", tiny_enc_dc, "--label", "a", "--label", "b"])


def _write_generate(path, rows):
    """rows: (id, src, ref, hyp) in fairseq-generate's format."""
    with open(path, "w", encoding="utf-8") as f:
        for i, s, t, h in rows:
            f.write(f"S-{i}\t{s}\nT-{i}\t{t}\nH-{i}\t-0.5\t{h}\nD-{i}\t-0.5\t{h}\n")
        f.write("Generate test with beam=2: BLEU4 = 0.00\n")


def test_bleu_by_length_buckets_and_scores(tmp_path):
    words = [f"w{i}" for i in range(80)]
    sent = lambda n, off=0: " ".join(words[off:off + n])
    rows_good, rows_mixed = [], []
    for i, n in enumerate([3, 9, 10, 19, 25, 35, 45, 50, 70]):
        ref = sent(n, 1)
        rows_good.append((i, sent(n), ref, ref))
        # "mixed" is perfect on short sources (< 20) and wrong elsewhere
        rows_mixed.append((i, sent(n), ref, ref if n < 20 else "zz yy xx ww vv"))
    _write_generate(tmp_path / "good.txt", rows_good)
    _write_generate(tmp_path / "mixed.txt", list(reversed(rows_mixed)))
    res = bbl.bleu_by_length({"good": str(tmp_path / "good.txt"),
                              "mixed": str(tmp_path / "mixed.txt")})
    assert res["counts"] == {"<10": 2, "10-20": 2, "20-30": 1, "30-40": 1, "40-50": 1, ">50": 2}
    assert all(v == pytest.approx(100.0) for v in res["bleu"]["good"].values())
    assert res["bleu"]["mixed"]["<10"] == pytest.approx(100.0)
    assert res["bleu"]["mixed"]["10-20"] == pytest.approx(100.0)
    assert res["bleu"]["mixed"][">50"] == pytest.approx(0.0)
    assert 0 < res["overall"]["mixed"] < 100
    assert bbl.bucket_of(9) == "<10" and bbl.bucket_of(10) == "10-20" and bbl.bucket_of(50) == ">50"
    # different test sets are refused
    _write_generate(tmp_path / "other.txt", rows_good[:-1])
    with pytest.raises(ValueError, match="--system other"):
        bbl.bleu_by_length({"good": str(tmp_path / "good.txt"),
                            "other": str(tmp_path / "other.txt")})


def test_bleu_by_length_cli_on_real_generate_output(tiny_enc_dc, toy_bin, tmp_path):
    gen = generate([toy_bin, "--path", tiny_enc_dc, "--beam", "2", "--max-tokens", "500",
                    "--gen-subset", "test", "--num-workers", "0", "--max-len-b", "20"])
    n = len(hypotheses(gen))
    (tmp_path / "enc.txt").write_text(gen, encoding="utf-8")
    _write_generate(tmp_path / "oracle.txt", [
        (int(l.split("\t")[0][2:]), l.split("\t")[1], l.split("\t")[1], l.split("\t")[1])
        for l in gen.splitlines() if l.startswith("S-")])
    # oracle: references = sources, so it must score 100 wherever it has sentences
    paths = bbl.cli_main(["--system", f"enc-dc={tmp_path / 'enc.txt'}",
                          "--system", f"oracle={tmp_path / 'oracle.txt'}",
                          "--out-dir", str(tmp_path / "out")])
    res = json.load(open(paths["json"]))
    assert sum(res["counts"].values()) == n
    for b, c in res["counts"].items():
        assert (res["bleu"]["oracle"][b] is None) == (c == 0)
        if c:
            assert res["bleu"]["oracle"][b] == pytest.approx(100.0)
            assert 0.0 <= res["bleu"]["enc-dc"][b] <= 100.0
    assert "enc-dc" in open(paths["md"]).read() and _is_png(paths["png"])
    with pytest.raises(SystemExit, match="NAME=FILE"):
        bbl.cli_main(["--system", str(tmp_path / "enc.txt")])


def test_console_script_exits_zero(tiny_enc_dc, toy_bin, tmp_path):
    """The installed console script (not just cli_main) succeeds with status 0."""
    import shutil
    import subprocess

    exe = shutil.which("ctx-bleu-by-length")
    if exe is None:
        pytest.skip("console scripts are not installed (pip install -e .)")
    gen = generate([toy_bin, "--path", tiny_enc_dc, "--beam", "2", "--max-tokens", "500",
                    "--gen-subset", "test", "--num-workers", "0", "--max-len-b", "20"])
    (tmp_path / "enc.txt").write_text(gen, encoding="utf-8")
    res = subprocess.run([exe, "--system", f"enc={tmp_path / 'enc.txt'}", "--out-dir",
                          str(tmp_path / "out")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "out").is_dir()
