"""scripts/gpu_check.sh on a CPU-only machine (GPU_CHECK_DRY=1): the GPU run's
ctx-bench steps with their exact arguments (issue 27: the real run failed on an
argument error the dry run did not catch), and the suite phase keeping the
logs of the recipes' steps."""

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "gpu_check.sh")
BENCH_STEPS = ["fp32", "fp16", "concat_fp32", "concat_fp16", "selective100", "selective1000",
               "sweep_fp16", "fp16_fairseq", "selacc100_fp32", "selacc100_fp16",
               "selacc1000_fp32", "selacc1000_fp16"]
#: ctx-bench's options that are shapes (the only ones a dry run may change), with a value
SHAPE_OPTIONS = {"--layers", "--embed-dim", "--heads", "--ffn-dim", "--vocab", "--src-len",
                 "--tgt-len", "--max-tokens", "--repeats", "--train-steps", "--beam",
                 "--threads", "--sweep-max-tokens", "--doc-len", "--device"}


def run_check(tmp_path, phases, **env):
    out = tmp_path / "out"
    e = dict(os.environ, GPU_CHECK_DRY="1", GPU_CHECK_PHASES=phases, OUT=str(out),
             OMP_NUM_THREADS="1", PYTHON=sys.executable, GPU_CHECK_BUDGET="900", **env)
    r = subprocess.run(["bash", SCRIPT], cwd=REPO, env=e, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, (out / "summary.txt").read_text()


def _steps(summary):
    """{(step, 'a' | 'b'): (command argv, rc)} from the summary's phase lines."""
    steps, lines = {}, summary.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"== phase \d: ctx-bench (\w+) \((dry run of the real command|the same ARGS, "
                     r"dry shapes, CPU)\): (.*) \(timeout \d+ s\)$", line)
        if m:
            rc = int(re.match(r"\s+rc=(\d+)", lines[i + 1]).group(1))
            kind = "a" if m.group(2).startswith("dry run") else "b"
            steps[(m.group(1), kind)] = (shlex.split(m.group(3)), rc)
    return steps


def _without_shapes(argv):
    argv = argv[argv.index("ctx_fairseq.cli.bench") + 1:]
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in SHAPE_OPTIONS:
            skip = True
        elif a not in ("--dry-run",):
            out.append(a)
    return out


def test_dry_run_runs_every_bench_step_with_the_real_arguments(tmp_path):
    out, summary = run_check(tmp_path, "3 4 5 6")
    steps = _steps(summary)
    for name in BENCH_STEPS:
        real, rc = steps[(name, "a")]
        assert rc == 0, (name, summary[-3000:])
        # (a) is the real command: --device cuda, the real shapes, --dry-run added
        assert real[real.index("--device") + 1] == "cuda" and real[-1] == "--dry-run", real
        assert "--layers" not in real  # ctx-bench's defaults: the base shape
        report = json.load(open(_member(out, f"bench_{name}_dry.json")))
        assert report["dry_run"] and all(r["batch_sentences"] > 0 for r in report["results"])
        fp16 = "--fp16" in real
        assert report["precision"] == ("fp16" if fp16 else "fp32")
        if fp16:
            assert (name, "b") not in steps
            continue
        cpu, rc = steps[(name, "b")]
        assert rc == 0, (name, summary[-3000:])
        assert cpu[cpu.index("--device") + 1] == "cpu"
        # the same arguments but the shapes
        assert _without_shapes(cpu) == _without_shapes(real), (cpu, real)
    # concatenation is measured on documents long enough to hold whole contexts
    concat, _ = steps[("concat_fp32", "a")]
    assert int(concat[concat.index("--doc-len") + 1]) >= 10
    assert "transformer_concat" not in steps[("fp32", "a")][0][
        steps[("fp32", "a")][0].index("--archs") + 1]
    for name in ("sweep_fp16", "fp16_fairseq"):  # fairseq-train's own step
        argv = steps[(name, "a")][0]
        assert argv[argv.index("--train-step") + 1] == "fairseq", argv
    sweep = json.load(open(_member(out, "bench_sweep_fp16_dry.json")))
    assert {r["arch"] for r in sweep["results"]} == {
        f"{a} @{m}" for a in ("transformer", "transformer_dc_dec") for m in (4096, 16384, 32768)}
    assert "| arch | params |" in summary  # each CPU run's table
    # phase 6 (issue 36): the selective model's accelerator path in one file
    sel = json.load(open(_member(out, "selective_accelerator.json")))
    assert {"selacc100_fp32", "selacc1000_fp16_dry"} <= set(sel)
    for name in ("selacc100_fp32", "selacc1000_fp32"):
        argv = steps[(name, "a")][0]
        assert argv[argv.index("--archs") + 1] == "transformer_selective_doc[--memory-precomputed]"
        rows = sel[name]["results"]
        assert [r["arch"] for r in rows] == ["transformer", argv[argv.index("--archs") + 1]]
        assert all("train_syncs_per_step" in r for r in rows)  # (None on the CPU)
    assert [int(steps[(f"selacc{n}_fp16", "a")][0][steps[(f"selacc{n}_fp16", "a")][0].index(
        "--doc-len") + 1]) for n in (100, 1000)] == [100, 1000]


def _member(out, name):
    """``name`` extracted from gpu_check.tgz (every phase's full output)."""
    dest = out / "x"
    with tarfile.open(out / "gpu_check.tgz") as t:
        t.extractall(dest, filter="data")
    path = dest / name
    assert path.exists(), sorted(p.name for p in dest.iterdir())
    return path


FAILING_RECIPE_TEST = '''
def test_a_recipe_step_fails(tmp_path):
    logs = tmp_path / "work" / "logs"
    logs.mkdir(parents=True)
    (logs / "train-sentence.log").write_text("Traceback: the reason the step failed\\n")
    assert False, "step train_sentence failed (exit 1)"
'''


def test_suite_phase_keeps_the_logs_of_recipe_steps(tmp_path):
    """Issue 27: a recipe step failed in the GPU's suite phase and its log was
    lost with pytest's temporary directory; the phase keeps every step log."""
    test = tmp_path / "t" / "test_failing_recipe.py"
    test.parent.mkdir()
    test.write_text(FAILING_RECIPE_TEST)
    out, summary = run_check(tmp_path, "2", PHASE2_TESTS=str(test))
    assert "FAILED" in summary and "kept 1 recipe step log(s)" in summary
    with tarfile.open(out / "gpu_check.tgz") as t:
        logs = [m for m in t.getnames() if m.endswith("logs/train-sentence.log")]
        assert len(logs) == 1 and logs[0].startswith("./phase2_recipe_logs/"), t.getnames()
        assert b"the reason the step failed" in t.extractfile(logs[0]).read()
