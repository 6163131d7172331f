"""fairseq keeps every sentence once ctx_fairseq is imported."""

import os

import numpy as np
import pytest

import ctx_fairseq  # noqa: F401
from fairseq_cli_utils import USER_DIR, generate, hypotheses, preprocess, train


@pytest.mark.parametrize("n", [1, 5, 8, 13, 100])
@pytest.mark.parametrize("use_vec", [True, False])
def test_batch_by_size_keeps_the_last_partial_batch(n, use_vec):
    from fairseq.data import data_utils

    indices = np.random.RandomState(n).permutation(n).astype(np.int64)
    kwargs = {"num_tokens_vec": np.full(n, 6, dtype=np.int64)} if use_vec else {}
    batches = data_utils.batch_by_size(indices, lambda i: 6, max_tokens=60,
                                       required_batch_size_multiple=8, **kwargs)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(n))  # every index exactly once
    assert all(len(b) <= 10 for b in batches)
    assert data_utils.batch_by_size(np.array([], dtype=np.int64), lambda i: 1,
                                    max_tokens=10) == []


def test_generate_translates_every_test_sentence(toy_corpus, tmp_path):
    """13 test sentences (not a multiple of 8): all 13 come out of fairseq-generate."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n in (("train", 40), ("valid", 13), ("test", 13)):
        for side in ("src", "tgt"):
            lines = open(os.path.join(toy_corpus, f"train.{side}")).read().splitlines()[:n]
            (raw / f"{split}.{side}").write_text("\n".join(lines) + "\n")
    dest = str(tmp_path / "bin")
    preprocess(["--source-lang", "src", "--target-lang", "tgt", "--trainpref", str(raw / "train"),
                "--validpref", str(raw / "valid"), "--testpref", str(raw / "test"),
                "--destdir", dest, "--joined-dictionary", "--workers", "1"])
    save = str(tmp_path / "ck")
    train([dest, "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
           "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
           "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16",
           "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "200", "--max-update", "1",
           "--save-dir", save, "--no-progress-bar", "--num-workers", "0"])
    out = generate([dest, "--path", os.path.join(save, "checkpoint_last.pt"), "--beam", "2",
                    "--max-tokens", "500", "--gen-subset", "test", "--num-workers", "0",
                    "--max-len-b", "10"])
    assert len(hypotheses(out)) == 13
    assert USER_DIR.endswith("ctx_fairseq")


def test_checkpoints_with_numpy_meters_load_safely(tmp_path):
    """fairseq-train --eval-bleu stores numpy counts in extra_state: such
    checkpoints load with weights_only=True; object arrays stay refused."""
    import numpy as np
    import torch

    import ctx_fairseq  # noqa: F401

    f = tmp_path / "ckpt.pt"
    state = {"extra_state": {"_bleu_counts": np.array([3, 2, 1, 0], dtype=np.int64),
                             "best": np.float64(1.5), "n": np.int64(4),
                             "f32": np.zeros(2, dtype=np.float32)}}
    torch.save(state, f)
    got = torch.load(f, weights_only=True)["extra_state"]
    assert got["_bleu_counts"].tolist() == [3, 2, 1, 0] and float(got["best"]) == 1.5
    bad = tmp_path / "obj.pt"
    torch.save({"x": np.array([object()], dtype=object)}, bad)
    with pytest.raises(Exception):
        torch.load(bad, weights_only=True)


def test_checkpoint_copies_are_atomic(tmp_path, monkeypatch):
    """fairseq makes checkpoint_last.pt as a copy (PathManager.copy): a copy
    killed half-way leaves the old file whole, a finished one the new file,
    and no .tmp."""
    import shutil

    from fairseq.file_io import PathManager

    src, dst = tmp_path / "checkpoint_2_8.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new" * 1000)
    dst.write_bytes(b"old")
    real = shutil.copyfile

    def killed(a, b):
        with open(b, "wb") as f:
            f.write(b"ne")  # a partial write, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copyfile", killed)
    with pytest.raises(KeyboardInterrupt):
        PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == b"old"
    monkeypatch.setattr(shutil, "copyfile", real)
    assert PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([dst.name, src.name])


def test_fairseq_softmax_keeps_float64_and_is_unchanged_below():
    """fairseq's ``utils.softmax``/``log_softmax`` compute in float32 whatever
    the input: a float64 model's attention rounded to float32 (about 1e-7,
    the cause of grouped and whole selective batches differing on some CPUs).
    With ctx_fairseq: float64 stays float64; half, bfloat16 and float32 give
    fairseq's float32 results bit for bit."""
    import torch
    import torch.nn.functional as F
    from fairseq import utils

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 33, generator=g, dtype=torch.float64) * 5
    for ours, ref in ((utils.softmax, F.softmax), (utils.log_softmax, F.log_softmax)):
        got = ours(x, dim=-1)
        assert got.dtype == torch.float64
        assert torch.equal(got, ref(x, dim=-1))
        for dt in (torch.float16, torch.bfloat16, torch.float32):
            y = ours(x.to(dt), dim=-1)
            assert y.dtype == torch.float32
            assert torch.equal(y, ref(x.to(dt), dim=-1, dtype=torch.float32))
        assert ours(x, dim=-1, onnx_trace=True).dtype == torch.float32  # fairseq's branch


def test_a_float64_attention_with_static_keys_is_float64():
    """fairseq's MultiheadAttention with ``static_kv`` (a decoder's
    encoder-attention) takes the path that calls ``utils.softmax``: in a
    float64 model it now agrees with a float64 reference to float64
    round-off, not float32's."""
    import torch
    from fairseq.modules.multihead_attention import MultiheadAttention

    torch.manual_seed(0)
    m = MultiheadAttention(16, 4, encoder_decoder_attention=True).double().eval()
    q = torch.randn(5, 2, 16, dtype=torch.float64)
    kv = torch.randn(9, 2, 16, dtype=torch.float64)
    with torch.no_grad():
        out, _ = m(q, kv, kv, static_kv=True, need_weights=False)
    ref, _ = torch.nn.functional.multi_head_attention_forward(
        q, kv, kv, 16, 4, None, torch.cat([m.q_proj.bias, m.k_proj.bias, m.v_proj.bias]),
        None, None, False, 0.0, m.out_proj.weight, m.out_proj.bias, training=False,
        need_weights=False, use_separate_proj_weight=True, q_proj_weight=m.q_proj.weight,
        k_proj_weight=m.k_proj.weight, v_proj_weight=m.v_proj.weight)
    assert float((out - ref).abs().max()) < 1e-13
