"""ctx-bench on tiny shapes: the JSON report, the baseline against itself,
architecture option pass-through and bad input."""

import json
import re

import pytest

from ctx_fairseq.cli import bench, bench_specs
from ctx_fairseq.cli.bench_report import step_time_fit

TINY = ["--layers", "1", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32", "--vocab", "64",
        "--src-len", "6", "--tgt-len", "5", "--max-tokens", "40", "--infer-sentences", "3",
        "--beam", "2", "--repeats", "2", "--train-steps", "1", "--warmup", "0"]


def run_json(capsys, argv):
    bench.cli_main(argv + ["--json"])
    return json.loads(capsys.readouterr().out)


def test_baseline_against_itself(capsys):
    report = run_json(capsys, ["--archs", "transformer", *TINY])
    assert set(report) == {"device", "shape", "results", "precision", "peak_tflops",
                           "peak_tflops_source", "training_step"}
    assert report["precision"] == "fp32" and report["peak_tflops"] is None
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
    assert md[0].startswith("| arch | params") and len(md) == 7 and "infer FLOPs bound" in md[0]
    assert md[-2].startswith("precision: fp32; MFU: -, no peak known for the CPU")
    assert md[-1].startswith("training step: forward, label-smoothed cross-entropy")
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
    assert bench_specs.split_specs("a,b[--l 1,3],c") == ["a", "b[--l 1,3]", "c"]
    assert bench_specs.parse_spec("b[--l 1,3 --flag]") == ("b", ["--l", "1,3", "--flag"])


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


def test_cpu_peak_counts_the_temporaries_inside_an_autograd_function():
    """The CPU peak sees the tensors a custom autograd function allocates and
    frees inside itself (the streamed word level's tiles): each at its own
    time. Summing each profiler event's self memory in the order the events
    start put those frees at the function's start, and the peak of this step
    came out near 0."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    n = 256 * 1024  # 1 MiB of float32

    class Tiles(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            acc = torch.zeros_like(x)
            for i in range(4):
                t = x * i  # two tiles alive at once, freed within the function
                acc += t + 1
                del t
            return acc

        @staticmethod
        def backward(ctx, g):
            return g

    x = torch.randn(n, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 record_shapes=True, with_stack=True) as prof:
        Tiles.apply(x).sum().backward()
    peak = bench.cpu_step_peak_bytes(prof)
    # acc, x * i, t + 1 at once: 3 MiB (the gradient and the sum's few bytes aside)
    assert 3 * 4 * n <= peak <= 4 * 4 * n + 4096, peak


def test_document_memory_beam_search_over_fewer_sentences_than_the_batch(capsys):
    """``--infer-sentences`` below the batch size with a document-memory model
    (it crashed: the first ``n`` queries were kept with the whole batch's
    ``mem_state_index``/``mem_extra_rows``, "INDICES element is out of DATA
    bounds"). The recomputed indices equal the collater's on the whole batch,
    and the encoder's output for the first ``n`` sentences equals the whole
    batch's first ``n`` rows (the queries left out are encoded as memory rows)."""
    import numpy as np
    import torch

    from ctx_fairseq.models.transformer_selective_doc.common import memory_state_index

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


# ------------------------------------------------------------------ absolute efficiency


def test_mfu_against_a_given_peak(capsys):
    """Issue 27: achieved TFLOP/s (counted FLOPs of a step over its median
    time) and MFU, its fraction of ``--peak-tflops``, for training and beam
    search; printed in the table."""
    report = run_json(capsys, ["--archs", "transformer", *TINY, "--peak-tflops", "0.5"])
    assert report["peak_tflops"] == 0.5 and report["peak_tflops_source"] == "--peak-tflops"
    for r in report["results"]:
        step_s = r["batch_target_tokens"] / r["train_tokens_per_s"]
        assert r["train_tflops"] == pytest.approx(r["train_flops"] / step_s / 1e12)
        assert r["train_mfu"] == pytest.approx(r["train_tflops"] / 0.5)
        assert 0 < r["infer_mfu"] == pytest.approx(r["infer_tflops"] / 0.5)
        assert r["batch_sentences"] == 8 and r["batch_memory_sentences"] is None
    bench.cli_main(["--archs", "transformer", *TINY, "--peak-tflops", "0.5"])
    out = capsys.readouterr().out
    assert "MFU" in out and "/ 0.5 TFLOP/s, --peak-tflops" in out
    row = next(line for line in out.splitlines() if line.startswith("transformer "))
    assert re.search(r"\d+\.\d%", row), row


def test_peak_table_of_known_cards():
    from ctx_fairseq.flops import device_peak_tflops, matmul_precision

    assert device_peak_tflops("NVIDIA H100 80GB HBM3", "fp16")[0] == 989.4
    assert device_peak_tflops("NVIDIA H100 80GB HBM3", "fp32")[0] == 67.0
    assert device_peak_tflops("NVIDIA H100 PCIe", "fp16")[0] == 756.5
    assert device_peak_tflops("NVIDIA H100 NVL", "bf16")[0] == 835.5
    assert device_peak_tflops("NVIDIA H200", "tf32")[0] == 494.7
    assert device_peak_tflops("NVIDIA A100-SXM4-40GB", "bf16")[0] == 312.0
    assert device_peak_tflops("NVIDIA A100 80GB PCIe", "fp32")[0] == 19.5
    assert device_peak_tflops("NVIDIA A10", "fp16")[0] == 125.0
    assert device_peak_tflops("NVIDIA L4", "fp16")[0] == 121.0
    assert device_peak_tflops("NVIDIA L40S", "fp16")[0] == 362.0
    assert device_peak_tflops("Tesla V100-SXM2-16GB", "fp16")[0] == 125.0
    assert device_peak_tflops("Tesla T4", "fp16")[0] == 65.0
    peak, pattern = device_peak_tflops("Tesla T4", "bf16")  # known card, no bf16
    assert peak is None and pattern is not None
    assert device_peak_tflops("NVIDIA L40", "fp16") == (None, None)  # not L4, not L40S
    assert device_peak_tflops("Some Card", "fp16") == (None, None)
    with pytest.raises(ValueError):
        device_peak_tflops("NVIDIA H100", "int8")
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        assert matmul_precision(False) == "fp32" and matmul_precision(True) == "fp16"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert matmul_precision(False) == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("high")
        assert matmul_precision(False) == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])


def test_sweep_summary_finds_where_the_step_stops_being_host_bound():
    def point(m, tok):
        return {"max_tokens": m, "results": [{"arch": "a", "train_tokens_per_s": tok,
                                              "train_tflops": tok / 1e3, "train_mfu": None,
                                              "batch_target_tokens": m}]}

    # host-bound: tokens/s doubles with the batch up to 16k, then flat
    s = bench.sweep_summary([point(4096, 20e3), point(16384, 70e3), point(32768, 74e3)])["a"]
    assert s["saturates_at"] == 16384 and s["saturated"]
    s = bench.sweep_summary([point(4096, 20e3), point(16384, 40e3), point(32768, 80e3)])["a"]
    assert s["saturates_at"] == 32768 and not s["saturated"]
    assert s["max_tokens"] == [4096, 16384, 32768]
    # step time = 50 ms + tokens / 400k tokens/s: the host's part is half the step at 20k
    steps = [point(m, m / (0.05 + m / 4e5)) for m in (4096, 16384, 32768)]
    s = bench.sweep_summary(steps)["a"]
    assert s["fixed_ms"] == pytest.approx(50.0) and s["host_half_tokens"] == pytest.approx(2e4)
    assert step_time_fit([4096], [1e4]) == {"fixed_ms": None, "host_half_tokens": None}


def test_sweep_mode_runs_each_batch(capsys, tmp_path):
    argv = ["--archs", "transformer[--encoder-ffn-embed-dim 64]", *TINY, "--repeats", "1",
            "--infer-sentences", "0", "--sweep-max-tokens", "40,20", "--peak-tflops", "1"]
    report = run_json(capsys, argv)
    assert [p["max_tokens"] for p in report["sweep"]] == [20, 40]
    assert [p["shape"]["batch_size"] for p in report["sweep"]] == [4, 8]
    assert report["shape"]["max_tokens"] == [20, 40]
    assert set(report["summary"]) == {"transformer", "transformer[--encoder-ffn-embed-dim 64]"}
    for arch, s in report["summary"].items():
        assert s["max_tokens"] == [20, 40] and s["saturates_at"] in (20, 40)
        assert all(u is not None and u > 0 for u in s["train_mfu"])
    saved = tmp_path / "sweep.json"
    saved.write_text(json.dumps(report))
    bench.cli_main(["--from-json", str(saved)])
    out = capsys.readouterr().out
    assert "tok/s @20" in out and "MFU @40" in out and "saturates at" in out
    assert "fixed ms" in out and "host half at" in out
    bench.cli_main(["--from-json", str(saved), "--markdown"])
    assert capsys.readouterr().out.startswith("| arch | tok/s @20 |")


@pytest.mark.parametrize("argv,message", [
    (["--sweep-max-tokens", "40,x"], "expected integers"),
    (["--sweep-max-tokens", "40,40"], "distinct values"),
    (["--sweep-max-tokens", "3"], "at least --tgt-len"),
    (["--peak-tflops", "0"], "--peak-tflops must be a positive number"),
])
def test_bad_sweep_and_peak(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        bench.cli_main([*TINY, *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().splitlines()[-1].startswith("ctx-bench: error:")


# ------------------------------------------------------------------ what fairseq-train runs


def test_dry_run_takes_the_real_arguments_without_a_gpu(capsys):
    """--dry-run: --device cuda and --fp16 accepted on a CPU-only machine; the
    models and batches are built as measured, nothing runs."""
    report = run_json(capsys, ["--dry-run", "--device", "cuda", "--fp16",
                               "--archs", "transformer_concat", *TINY[:-10], "--doc-len", "4",
                               "--max-tokens", "60"])
    assert report["dry_run"] and report["precision"] == "fp16"
    base, concat = report["results"]
    assert base["batch_sentences"] == 12 and base["batch_target_tokens"] == 60
    assert 0 < concat["batch_sentences"] and concat["batch_memory_sentences"] is None
    bench.cli_main(["--dry-run", "--archs", "transformer_concat", *TINY[:-10], "--doc-len",
                    "4", "--max-tokens", "60"])
    out = capsys.readouterr().out
    assert "batch sents" in out and "transformer_concat" in out


def test_dry_run_catches_concatenation_without_whole_contexts(capsys):
    """Issue 27, defect 1: the GPU run's ``--doc-len 2`` with concatenation at
    the base shape has no sentence with its whole context in the batch: the
    dry run at the same arguments says so on the CPU (in seconds)."""
    with pytest.raises(SystemExit) as exc:
        bench.cli_main(["--dry-run", "--device", "cuda", "--archs", "transformer_concat",
                        "--doc-len", "2", "--layers", "1"])
    assert exc.value.code == 2
    assert "no sentence with its whole context" in capsys.readouterr().err
    report = run_json(capsys, ["--dry-run", "--device", "cuda", "--archs", "transformer_concat",
                               "--doc-len", "10", "--layers", "1"])
    assert report["results"][1]["batch_sentences"] > 0


def test_document_batch_is_one_the_task_forms():
    """Issue 24, item 3: the measured batch of a whole-document model is one of
    the batches ``task.get_batch_iterator`` forms with fairseq-train's
    arguments (--max-tokens, --required-batch-size-multiple, the seed), the
    task's context layout set by building the model through the task (a
    frozen memory is encoded apart: ``separate``), and ``--doc-batch last``
    holds the document's last sentence."""
    import numpy as np
    from fairseq import utils as fairseq_utils

    args = ["--layers", "1", "--embed-dim", "16", "--heads", "2", "--ffn-dim", "32",
            "--vocab", "64", "--src-len", "6", "--tgt-len", "5", "--doc-len", "8",
            "--max-tokens", "60", "--threads", "1"]
    seen = {}
    for memory in ("frozen", "shared"):
        b = bench.Bench(bench.get_parser().parse_args([*args, "--doc-batch", "last"]))
        model, task, margs = b.build("transformer_selective_doc", ["--context-memory", memory])
        assert task.context_layout["memory"] == ("separate" if memory == "frozen" else "shared")
        sample = b.document_sample(task, 1, model, margs)
        ids = sorted(sample["id"].tolist())
        assert 7 in ids  # the first document's last sentence
        # the batches of the task's own iterator over the same documents
        ds = task.wrap(*b.synthetic_documents(task, 1), training=True)
        itr = task.get_batch_iterator(
            ds, max_tokens=60, max_positions=fairseq_utils.resolve_max_positions(
                task.max_positions(), model.max_positions(), 60),
            required_batch_size_multiple=margs.required_batch_size_multiple, seed=margs.seed,
            epoch=1, disable_iterator_cache=True)
        assert any(sorted(np.asarray(x).tolist()) == ids for x in itr.frozen_batches)
        seen[memory] = (len(ids), bench_specs.memory_sentences(sample))
    # the frozen memory counts against --max-tokens apart from the queries: fewer queries
    assert seen["frozen"][0] < seen["shared"][0], seen


def test_flops_are_counted_in_the_timed_precision(monkeypatch):
    """The FLOPs of a step are counted under the timed step's autocast."""
    import contextlib

    args = bench.get_parser().parse_args(TINY)
    b = bench.Bench(args)
    model, task, margs = b.build("transformer", [])
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    entered = []

    @contextlib.contextmanager
    def autocast(self):
        entered.append(1)
        yield

    monkeypatch.setattr(bench.Bench, "_autocast", autocast)
    flops = b.count_flops({"model": model, "crit": crit, "sample": b.sample(model, task, margs, 1)})
    assert flops > 0 and entered == [1]


def test_fairseq_train_step_counts_the_same_flops(capsys):
    """--train-step fairseq times fairseq's Trainer.train_step (fairseq's Adam,
    its gradient norm and logging): the FLOPs of the step are the same
    products as the plain step's."""
    argv = ["--archs", "transformer_dc", *TINY, "--repeats", "1", "--infer-sentences", "2"]
    plain = run_json(capsys, argv)
    trainer = run_json(capsys, argv + ["--train-step", "fairseq"])
    assert trainer["shape"]["train_step"] == "fairseq"
    assert trainer["training_step"].startswith("fairseq's Trainer.train_step")
    assert plain["training_step"].startswith("forward, label-smoothed cross-entropy")
    for p, t in zip(plain["results"], trainer["results"]):
        assert p["arch"] == t["arch"] and p["train_flops"] == t["train_flops"] > 0
        assert t["train_tokens_per_s"] > 0 and t["infer_sentences_per_s"] > 0


def test_fairseq_fp16_step_is_the_half_model_with_fp32_master_weights(monkeypatch):
    """fairseq-train --fp16 (``--train-step fairseq --fp16``): the model in half
    precision, fp32 master weights and Adam state (FP16Optimizer), counted in
    the resident memory; run here on the CPU (FP16Optimizer asks for the
    current CUDA device only to key its flat master copy: faked)."""
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    args = bench.get_parser().parse_args([*TINY, "--train-step", "fairseq", "--repeats", "1",
                                          "--infer-sentences", "2", "--threads", "1"])
    args.fp16 = True  # the CLI takes --fp16 with --device cuda only
    seen = {}
    measure = bench.Bench.peak_memory_mb

    def spy(self, entry):
        out = measure(self, entry)
        params = list(entry["model"].parameters())
        n = sum(p.numel() for p in params)
        seen[entry["label"]] = ({p.dtype for p in params}, n,
                                bench.resident_bytes(entry["model"], entry["opt"]))
        return out

    monkeypatch.setattr(bench.Bench, "peak_memory_mb", spy)
    report = bench.Bench(args).run(["transformer", "transformer_dc"], log=lambda m: None)
    assert "--fp16: half-precision model, fp32 master weights" in report["training_step"]
    for arch, (dtypes, n, resident) in seen.items():
        assert dtypes == {torch.float16}, arch
        # half weights and gradients (2 + 2), fp32 master weights and gradients (4 + 4),
        # Adam's two moments (4 + 4): 20 bytes a parameter, and Adam's step counter
        assert 20 * n <= resident <= 20 * n + 64, (arch, n, resident)
    assert all(r["train_tokens_per_s"] > 0 for r in report["results"])
