"""ctx-bench on tiny shapes: the JSON report, the baseline against itself,
architecture option pass-through and bad input."""

import json

import pytest

from ctx_fairseq.cli import bench

TINY = ["--layers", "1", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32", "--vocab", "64",
        "--src-len", "6", "--tgt-len", "5", "--max-tokens", "40", "--infer-sentences", "3",
        "--beam", "2", "--repeats", "2", "--train-steps", "1", "--warmup", "0"]


def run_json(capsys, argv):
    bench.cli_main(argv + ["--json"])
    return json.loads(capsys.readouterr().out)


def test_baseline_against_itself(capsys):
    report = run_json(capsys, ["--archs", "transformer", *TINY])
    assert set(report) == {"device", "shape", "results"}
    assert report["shape"]["batch_size"] == 8 and report["shape"]["layers"] == 1
    a, b = report["results"]
    keys = {"arch", "params", "train_tokens_per_s", "train_ratio", "flops_ratio_bound",
            "infer_sentences_per_s", "infer_ratio", "peak_mem_mb"}
    assert keys <= set(a)
    assert a["arch"] == b["arch"] == "transformer"
    assert a["params"] == b["params"] > 0
    assert a["train_ratio"] == 1.0 and a["flops_ratio_bound"] == 1.0
    assert b["flops_ratio_bound"] == pytest.approx(1.0)  # identical FLOPs
    assert b["infer_flops_ratio_bound"] == pytest.approx(1.0)
    assert b["train_tokens_per_s"] > 0 and b["infer_sentences_per_s"] > 0
    assert b["peak_mem_mb"] == pytest.approx(a["peak_mem_mb"], rel=0.2)
    assert b["train_ratio"] == pytest.approx(b["train_tokens_per_s"] / a["train_tokens_per_s"])
    # CPU: the profiled step's wall time and the time of the ops whose FLOPs are counted
    assert 0 < b["train_counted_ops_s"] < b["train_profiled_step_s"]


def test_options_pass_through_change_the_model(capsys):
    report = run_json(capsys, ["--archs", "transformer[--encoder-ffn-embed-dim 64]",
                               "--infer-sentences", "0", *TINY[:-10], "--repeats", "1",
                               "--train-steps", "1", "--warmup", "0"])
    base, wide = report["results"]
    assert wide["arch"] == "transformer[--encoder-ffn-embed-dim 64]"
    # one encoder layer's FFN grows from 16x32 to 16x64 (weights and biases)
    assert wide["params"] - base["params"] == 2 * 16 * 32 + 32
    assert wide["flops_ratio_bound"] < 1.0
    assert wide["infer_ratio"] is None and wide["infer_flops_ratio_bound"] is None


def test_table_and_markdown_output(capsys, tmp_path):
    bench.cli_main(["--archs", "transformer", *TINY])
    out = capsys.readouterr().out
    assert "train ratio" in out and "FLOPs bound" in out and out.count("transformer") >= 2
    report = run_json(capsys, ["--archs", "transformer", *TINY])
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(report))
    bench.cli_main(["--from-json", str(saved), "--markdown"])
    md = capsys.readouterr().out.splitlines()
    assert md[0].startswith("| arch | params") and len(md) == 4 and "infer FLOPs bound" in md[0]
    assert md[2].startswith("| `transformer` |") and "| 1.000 |" in md[2]


@pytest.mark.parametrize("argv,message", [
    (["--archs", "no_such_arch"], "unknown architecture"),
    (["--archs", "transformer[--x"], "unbalanced"),
    (["--embed-dim", "30", "--heads", "4"], "divisible"),
    (["--fp16"], "--fp16 needs --device cuda"),
    (["--layers", "0"], "--layers must be >= 1"),
])
def test_bad_input(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        bench.cli_main([*TINY, *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_split_specs_keeps_commas_inside_brackets():
    assert bench.split_specs("a,b[--l 1,3],c") == ["a", "b[--l 1,3]", "c"]
    assert bench.parse_spec("b[--l 1,3 --flag]") == ("b", ["--l", "1,3", "--flag"])


class _FakeAllocator:
    """Stands in for the CUDA caching allocator's counters: ``held`` bytes
    allocated before a step (other models, this one's resident tensors), and
    what a step allocates at its peak (``transient``)."""

    def __init__(self, held):
        self.held, self.current, self.peak = held, held, held

    def run_step(self, transient):
        self.peak = max(self.peak, self.current + transient)

    def synchronize(self):
        pass

    def reset_peak(self):
        self.peak = self.current

    def allocated(self):
        return self.current

    def max_allocated(self):
        return self.peak


def test_step_peak_does_not_count_what_other_models_hold():
    for held in (0, 3 * 2 ** 30):
        stats = _FakeAllocator(held)
        assert bench.step_peak_bytes(lambda: stats.run_step(5 * 2 ** 20), stats) == 5 * 2 ** 20


def test_cuda_peak_of_each_model_is_its_own(monkeypatch):
    """Issue 18, defect 2: ``--device cuda`` reported ``max_memory_allocated``,
    which counts the weights, gradients and optimizer states of every model
    measured before (alive for the interleaved repeats). The CUDA path, run on
    the CPU with a fake allocator: the figure is the model's resident bytes
    plus its step's own peak, whatever the device holds besides."""
    import torch

    args = bench.get_parser().parse_args(TINY)
    b = bench.Bench(args)
    model, task, margs = b.build("transformer", [])
    entry = {"model": model, "crit": None, "opt": torch.optim.Adam(model.parameters(), lr=1e-4),
             "scaler": None, "sample": None}
    calls = []

    def train_step(self, e):  # one real Adam step (gradients and state), then the fake peak
        calls.append(1)
        for p in e["model"].parameters():
            p.grad = torch.zeros_like(p)
        e["opt"].step()
        b.memory_stats.run_step(7 * 2 ** 20)

    monkeypatch.setattr(bench.Bench, "train_step", train_step)
    figures = []
    for held in (0, 2 ** 30, 5 * 2 ** 30):
        b.memory_stats = _FakeAllocator(held)
        figures.append(b.peak_memory_mb(entry))
    resident = bench.resident_bytes(model, entry["opt"])
    params = list(model.parameters())
    steps = [st["step"] for st in entry["opt"].state.values()]
    # weights, gradients, Adam's two moments (fp32), Adam's step counters
    assert resident == 4 * 4 * sum(p.numel() for p in params) + sum(
        t.numel() * t.element_size() for t in steps)
    assert figures == [(resident + 7 * 2 ** 20) / 2 ** 20] * 3
    assert len(calls) == 6  # two steps per measurement, as on the CPU


def test_cpu_peak_does_not_depend_on_the_models_measured_before(capsys):
    """On the CPU every model's figure is the same measured first or after
    another model (within the profiler's run-to-run spread: the order of
    allocations and frees it records with the same timestamp varies, a few
    KB in these tiny models, up to 4% of their peak)."""
    wide = "transformer[--encoder-ffn-embed-dim 64]"
    quick = [*TINY[:-10], "--infer-sentences", "0", "--repeats", "1", "--train-steps", "1",
             "--warmup", "0", "--threads", "1"]
    one = run_json(capsys, ["--baseline", "transformer", "--archs", wide, *quick])["results"]
    two = run_json(capsys, ["--baseline", wide, "--archs", "transformer", *quick])["results"]
    first = {r["arch"]: r["peak_mem_mb"] for r in one}
    second = {r["arch"]: r["peak_mem_mb"] for r in two}
    assert first.keys() == second.keys()
    for arch in first:
        assert first[arch] == pytest.approx(second[arch], rel=0.08)
    assert first["transformer"] < first[wide]


def test_document_memory_beam_search_over_fewer_sentences_than_the_batch(capsys):
    """``--infer-sentences`` below the batch size with a document-memory model
    (it crashed: the first ``n`` queries were kept with the whole batch's
    ``mem_state_index``/``mem_extra_rows``, "INDICES element is out of DATA
    bounds"). The recomputed indices equal the collater's on the whole batch,
    and the encoder's output for the first ``n`` sentences equals the whole
    batch's first ``n`` rows (the queries left out are encoded as memory rows)."""
    import numpy as np
    import torch

    from ctx_fairseq.models.transformer_selective_doc import memory_state_index

    args = ["--layers", "1", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32",
            "--vocab", "64", "--src-len", "6", "--tgt-len", "5", "--doc-len", "10",
            "--max-tokens", "200", "--beam", "2", "--repeats", "1", "--train-steps", "1",
            "--warmup", "0", "--threads", "1"]
    b = bench.Bench(bench.get_parser().parse_args([*args, "--infer-sentences", "3"]))
    arch = ["--context-memory", "shared"]  # no stage-1 checkpoint here: memory with gradients
    model, task, _ = b.build("transformer_selective_doc", arch)
    ni = b.document_sample(task, seed=1)["net_input"]
    B, S = ni["src_tokens"].size(0), ni["mem_src_tokens"].size(0)
    # queries left out that the memory holds: they become memory rows of their own
    assert 3 < B and ni["query_mem_row"][3:].ge(0).any()
    source, extra = memory_state_index(ni["query_mem_row"].numpy(), S)
    assert np.array_equal(source, ni["mem_state_index"].numpy())
    assert np.array_equal(extra, ni["mem_extra_rows"].numpy())
    cut = b.infer_net_input(ni, 3)
    assert cut["src_tokens"].size(0) == 3 and cut["mem_src_tokens"].size(0) == S
    # the same as derived from the kept queries' memory rows
    source, extra = memory_state_index(ni["query_mem_row"][:3].numpy(), S)
    assert np.array_equal(source, cut["mem_state_index"].numpy())
    assert np.array_equal(extra, cut["mem_extra_rows"].numpy())
    assert int(cut["mem_state_index"].max()) < 3 + cut["mem_extra_rows"].numel()
    model.eval()
    with torch.no_grad():
        full = model.encoder(**{k: v for k, v in ni.items() if k != "prev_output_tokens"})
        part = model.encoder(**cut)
    assert torch.allclose(part["encoder_out"][0], full["encoder_out"][0][:, :3], atol=1e-5)

    report = run_json(capsys, ["--archs", "transformer_selective_doc[--context-memory shared]",
                               *args, "--infer-sentences", "3"])
    sel = report["results"][-1]
    assert sel["infer_sentences_per_s"] > 0 and sel["infer_ratio"] is not None


def test_selective_rows_say_where_the_memory_comes_from(capsys):
    """transformer_selective_doc's default is the paper's frozen memory (read from
    the warm cache in the bench); other settings are labelled as such."""
    quick = ["--layers", "1", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32",
             "--vocab", "64", "--src-len", "6", "--tgt-len", "5", "--doc-len", "4",
             "--max-tokens", "60", "--infer-sentences", "2", "--beam", "2", "--repeats", "1",
             "--train-steps", "1", "--warmup", "0", "--threads", "1"]
    report = run_json(capsys, ["--archs", "transformer_selective_doc,"
                               "transformer_selective_doc[--context-memory shared]", *quick])
    base, frozen, shared = report["results"]
    assert base["setting"] is None
    assert "frozen memory (the paper's; read from the cache (warm)" in frozen["setting"]
    assert "shared memory" in shared["setting"] and "beyond the paper" in shared["setting"]
    assert frozen["infer_sentences_per_s"] > 0 and shared["infer_sentences_per_s"] > 0
    # the frozen memory is neither encoded nor back-propagated in the measured step
    assert frozen["train_flops"] < shared["train_flops"]
    table = bench.format_table(report).splitlines()
    assert table[-2].startswith("transformer_selective_doc: encoder integration, frozen")
    assert table[-1].startswith("transformer_selective_doc[--context-memory shared]: ")
