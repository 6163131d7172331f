"""The TVsub recipe's GPU mode (no --smoke, no --cpu) on the CPU, as far as the
CPU takes it (issue 27: the smoke failed under CUDA with ``step train_sentence
failed (exit 1)`` and no log): the exact fairseq-train command line of its
first training step, recorded by a stand-in ``fairseq-train`` on PATH that then
fails, and the failed step's log printed on standard error by the recipe's
step runner (recipes/lib/recipe.sh)."""

import os
import stat
import subprocess

from test_recipe_tvsub import RECIPE, REPO, write_tvsub

FAKE_TRAIN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$FAKE_ARGS"
echo "fake fairseq-train: RuntimeError: the reason the training failed"
exit 1
"""


def test_gpu_mode_train_command_and_failed_step_log(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=4)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "fairseq-train"
    fake.write_text(FAKE_TRAIN)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    args_file = tmp_path / "train.args"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               FAKE_ARGS=str(args_file), OMP_NUM_THREADS="1", MODELS="transformer",
               BPE_MERGES="50")
    work = tmp_path / "w"
    r = subprocess.run(["bash", RECIPE, "--raw", root, "--workdir", str(work)],
                       capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "step train_sentence failed (exit 1)" in r.stderr, r.stderr[-3000:]
    # the failed step's log, on standard error
    assert "the last 30 lines of " in r.stderr and "logs/train-sentence.log" in r.stderr
    assert "RuntimeError: the reason the training failed" in r.stderr
    argv = args_file.read_text().splitlines()
    print("GPU mode, stage 1:", " ".join(argv))

    def value(opt):
        return argv[argv.index(opt) + 1]

    # the GPU branch: no --cpu, mixed precision, Transformer base, 4,096-token batches
    assert "--cpu" not in argv and "--fp16" in argv
    assert value("--arch") == "transformer" and value("--max-tokens") == "4096"
    assert value("--encoder-layers") == value("--decoder-layers") == "6"
    assert value("--encoder-embed-dim") == "512" and value("--encoder-ffn-embed-dim") == "2048"
    assert value("--encoder-attention-heads") == "8"
    assert value("--num-workers") == "0" and value("--data-buffer-size") == "0"
    assert value("--user-dir") == os.path.join(REPO, "ctx_fairseq")
    assert value("--save-dir") == str(work / "checkpoints" / "sentence")
