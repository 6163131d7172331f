"""ctx-bench's segment modes on tiny shapes (issue 39, item 8): the training
bench on segments against the sentence transformer on the same tokens, the
attention micro-benchmark and the decoding benchmark run and report their
fields; the batches and the L^2 FLOPs are exact. No speed is asserted."""

import json

import pytest
import torch

from ctx_fairseq.cli import bench
from ctx_fairseq.cli.bench_doc2doc import segment_specs, short_label

TINY = ["--layers", "2", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32", "--vocab", "64",
        "--src-len", "8", "--tgt-len", "8", "--max-tokens", "64", "--repeats", "1",
        "--train-steps", "1", "--threads", "1"]


def run_json(capsys, argv):
    bench.cli_main(argv + ["--json"])
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def no_profiler(monkeypatch):
    """The CPU peak-memory measurement (the torch profiler: its first start in a
    process takes tens of seconds; tested in test_bench.py and by the slow test
    below) replaced by a figure proportional to the batch's padded tokens."""
    def fake(self, entry):
        self.train_step(entry)
        return float(entry["sample"]["net_input"]["src_tokens"].numel())

    monkeypatch.setattr(bench.Bench, "peak_memory_mb", fake)


def test_segments_against_sentences_on_the_same_tokens(capsys, no_profiler, tmp_path):
    report = run_json(capsys, ["--segment-tokens", "32", *TINY])
    (tmp_path / "r.json").write_text(json.dumps(report))
    bench.cli_main(["--from-json", str(tmp_path / "r.json"), "--markdown"])
    table = capsys.readouterr().out
    assert "| 32 | `transformer_gtrans (segments)` |" in table and "step vs doc2doc" in table
    (point,) = report["segments"]
    assert point["segment_tokens"] == 32
    sent, doc, gtrans = point["results"]
    assert sent["arch"] == "transformer"
    assert doc["arch"] == "transformer[--doc2doc greedy --source-context-size 0 " \
                          "--doc2doc-max-tokens 32]"
    assert gtrans["arch"].startswith("transformer_gtrans[")
    # 64 target tokens: two full segments of 4 sentences, or the same 8 sentences
    assert sent["batch_target_tokens"] == doc["batch_target_tokens"] == 64
    assert (sent["batch_sentences"], doc["batch_sentences"], gtrans["batch_sentences"]) == (8, 2, 2)
    # the same tokens: the linear terms are equal but for the separator's output row
    # (6 FLOPs per token and model dimension, forward and backward); the rest is L^2
    extra_row = 6 * 64 * 16
    assert (doc["train_flops"] - doc["train_attention_flops"]) \
        - (sent["train_flops"] - sent["train_attention_flops"]) == extra_row
    # analytic L^2 terms: 3 (fwd+bwd) x 4 B S_q S_k E x (2 enc + 2 dec self + 2 cross)
    assert sent["train_attention_flops"] == 3 * 4 * 8 * 8 * 8 * 16 * 6
    assert doc["train_attention_flops"] == 3 * 4 * 2 * 32 * 32 * 16 * 6
    # G-Transformer, both layers global: every attention twice
    assert gtrans["train_attention_flops"] == 2 * doc["train_attention_flops"]
    rows = report["summary"]
    assert [r["unit"] for r in rows] == ["sentences", "segments", "segments"]
    keys = {"train_tokens_per_s", "ratio_vs_sentences", "flops_ratio_bound", "attention_share",
            "peak_mem_mb", "mem_ratio_vs_sentences", "step_vs_doc2doc", "flops_vs_doc2doc"}
    assert all(keys <= set(r) for r in rows)
    assert rows[0]["step_vs_doc2doc"] is None and rows[1]["step_vs_doc2doc"] == 1.0
    assert rows[2]["step_vs_doc2doc"] > 0 and rows[2]["flops_vs_doc2doc"] > 1.0
    assert rows[1]["flops_ratio_bound"] < 1.0  # the longer attention costs FLOPs
    assert [r["mem_ratio_vs_sentences"] for r in rows] == [1.0, 1.0, 1.0]  # (the fake)


@pytest.mark.slow
def test_segment_rows_measure_their_peak_memory(capsys):
    report = run_json(capsys, ["--segment-tokens", "32", *TINY])
    assert all(r["peak_mem_mb"] > 0 for r in report["summary"])


def test_segment_batch_is_the_tasks_and_sentences_are_the_same(capsys):
    """The doc2doc row's batch is the task's segment layout; the sentence row's
    holds the same tokens, each sentence with its own </s>."""
    from ctx_fairseq.cli.bench import Bench, get_parser
    from ctx_fairseq.cli.bench_specs import parse_spec

    args = get_parser().parse_args(["--segment-tokens", "32", *TINY])
    args.segment_tokens = 32
    b = Bench(args)
    samples = {}
    for spec in ["transformer", *segment_specs(["transformer"], 32)]:
        arch, extra = parse_spec(spec)
        model, task, margs = b.build(arch, extra)
        samples[spec] = (b.sample(model, task, margs, 1), task)
    (sent, _), (seg, task) = samples.values()
    sep = task.source_dictionary.index("<sep>")
    eos = task.source_dictionary.eos()
    src = seg["net_input"]["src_tokens"]
    assert src.shape == (2, 32) and (src == sep).sum(1).tolist() == [3, 3]
    assert (src[:, -1] == eos).all()
    # the segments' words are the sentences' words, in order
    words = lambda t: sorted(t[(t != sep) & (t != eos)].tolist())  # noqa: E731
    assert words(src) == words(sent["net_input"]["src_tokens"])
    assert words(seg["target"]) == words(sent["target"])
    assert int((sent["net_input"]["src_tokens"] == eos).sum()) == 8


def test_attention_bench_reports_each_kind(capsys):
    report = run_json(capsys, ["--segment-tokens", "16", "--attention-bench", *TINY])
    assert report["attention_bench"][0]["repeats"]["group_train"]
    rows = report["attention_bench"]
    assert [r["kind"] for r in rows] == ["self", "causal", "cross"]
    for r in rows:
        assert r["segment_tokens"] == 16 and r["batch"] == 4
        for k in ("group_train_ms", "plain_train_ms", "group_fwd_ms", "plain_fwd_ms",
                  "train_ratio", "forward_ratio", "mask_ms"):
            assert r[k] > 0


def test_attention_pair_computes_the_same_on_one_sentence():
    """A plain attention and a group attention of the same weights agree where
    the segment is one sentence: the pair times like for like."""
    from ctx_fairseq.cli.bench import get_parser
    from ctx_fairseq.cli.bench_attention import _pair

    args = get_parser().parse_args([*TINY, "--tgt-len", "64"])
    for kind in ("self", "causal", "cross"):
        group, plain, gcall, pcall, _ = _pair(kind, 16, args)
        group.eval(), plain.eval()
        with torch.no_grad():
            torch.testing.assert_close(gcall(), pcall(), rtol=1e-5, atol=1e-5)


def test_decode_bench_with_and_without_the_frame(capsys, tmp_path):
    report = run_json(capsys, ["--segment-tokens", "32", "--decode-bench", "--beam", "2",
                               "--decode-segments", "1", *TINY])
    assert report["beam"] == 2
    rows = report["decode_bench"]
    runs = [short_label(r["run"].partition(" (")[0]) + r["run"][len(r["run"].partition(" (")[0]):]
            for r in rows]
    assert runs == ["transformer (sentences)", "transformer (segments) (no frame)",
                    "transformer (segments) (frame)", "transformer_gtrans (segments) (no frame)",
                    "transformer_gtrans (segments) (frame)"]
    # the same work: every hypothesis of every run as long as the reference
    assert rows[0]["output_lengths"] == [8] and rows[0]["sequences"] == 4
    assert all(r["output_lengths"] == [32] and r["output_tokens"] == 32 for r in rows[1:])
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert rows[2]["frame_vs_no_frame"] > 0 and rows[4]["frame_vs_no_frame"] > 0
    path = tmp_path / "d.json"
    path.write_text(json.dumps(report))
    bench.cli_main(["--from-json", str(path)])
    assert "frame / no frame" in capsys.readouterr().out


def test_gtrans_alone_is_measured_on_segments(capsys):
    """Without --segment-tokens a doc2doc model's row is on its task's segments
    (--doc2doc-max-tokens), not one sentence at a time."""
    report = run_json(capsys, ["--archs", "transformer_gtrans[--doc2doc-max-tokens 32]",
                               "--dry-run", *TINY])
    base, gtrans = report["results"]
    assert base["batch_sentences"] == 8 and gtrans["batch_sentences"] == 2


@pytest.mark.parametrize("argv, message", [
    (["--segment-tokens", "4"], "shorter than one sentence"),
    (["--segment-tokens", "a,b"], "expected integers"),
    (["--attention-bench"], "need --segment-tokens"),
    (["--segment-tokens", "32", "--attention-bench", "--decode-bench"], "one at a time"),
])
def test_bad_input(capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.cli_main(argv + TINY)
    assert message in capsys.readouterr().err
