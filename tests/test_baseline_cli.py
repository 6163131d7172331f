"""The plugin through fairseq's own entry points: train and generate the
baseline with --user-dir, and load its checkpoint safely under torch >= 2.6."""

import os
import subprocess
import sys

import pytest
import torch

from fairseq_cli_utils import REPO_ROOT, hypotheses, train_and_generate


class NotAllowed:
    """An arbitrary class: safe loading must still refuse it."""


@pytest.fixture(scope="module")
def baseline_run(toy_bin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("baseline_ckpt"))
    out = train_and_generate(toy_bin, save, "transformer", max_update=4)
    return save, out


def test_train_and_generate_baseline(baseline_run, toy_bin):
    _, out = baseline_run
    hyps = hypotheses(out)
    n_test = sum(1 for _ in open(os.path.join(toy_bin, "test.docids")))
    assert len(hyps) == n_test
    assert "BLEU" in out


def test_checkpoint_loads_with_weights_only(baseline_run):
    import ctx_fairseq  # noqa: F401  (allow-lists fairseq's checkpoint types)

    ckpt = os.path.join(baseline_run[0], "checkpoint_last.pt")
    state = torch.load(ckpt, weights_only=True)
    assert "model" in state and any(k.startswith("encoder.") for k in state["model"])


def test_safe_loading_stays_on_for_other_globals(tmp_path):
    import ctx_fairseq  # noqa: F401

    path = tmp_path / "other.pt"
    torch.save({"x": NotAllowed()}, path)
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        torch.load(path, weights_only=True)


def test_fresh_process_needs_only_the_import(baseline_run):
    """In a new interpreter, torch.load(weights_only=True) works once ctx_fairseq
    is imported, and fails without it (so the allow-list is what makes it work)."""
    ckpt = os.path.join(baseline_run[0], "checkpoint_last.pt")
    code = "import torch, sys\n{imp}\ntorch.load(sys.argv[1], weights_only=True)\nprint('LOADED')"
    ok = subprocess.run([sys.executable, "-c", code.format(imp="import ctx_fairseq"), ckpt],
                        capture_output=True, text=True, cwd=REPO_ROOT)
    assert "LOADED" in ok.stdout, ok.stderr[-2000:]
    bare = subprocess.run([sys.executable, "-c", code.format(imp=""), ckpt],
                          capture_output=True, text=True, cwd=REPO_ROOT)
    assert "LOADED" not in bare.stdout and "Namespace" in bare.stderr


def test_user_dir_from_repository_root(toy_bin, tmp_path):
    """`fairseq-train --user-dir ctx_fairseq` as a user types it, from the repo root."""
    save = tmp_path / "ck"
    cmd = [sys.executable, "-m", "fairseq_cli.train", toy_bin, "--user-dir", "ctx_fairseq",
           "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
           "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
           "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
           "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "1",
           "--save-dir", str(save), "--no-progress-bar", "--disable-validation", "--num-workers", "0",
           # no prefetch thread: with one, the process sometimes aborts at exit
           # ("terminate called without an active exception", return code -6)
           "--data-buffer-size", "0"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (save / "checkpoint_last.pt").exists()


def test_fairseq_interactive_loads_the_checkpoint(baseline_run, toy_bin, toy_corpus, tmp_path):
    import contextlib
    import io

    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import interactive

    from fairseq_cli_utils import USER_DIR

    src = open(os.path.join(toy_corpus, "test.src")).read().splitlines()[:3]
    inp = tmp_path / "input.txt"
    inp.write_text("\n".join(src) + "\n")
    parser = options.get_interactive_generation_parser()
    args = options.parse_args_and_arch(parser, [
        toy_bin, "--user-dir", USER_DIR, "--path", os.path.join(baseline_run[0], "checkpoint_last.pt"),
        "--source-lang", "src", "--target-lang", "tgt", "--beam", "2", "--input", str(inp),
        "--max-len-b", "10"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        interactive.main(convert_namespace_to_omegaconf(args))
    assert sum(line.startswith("H-") for line in out.getvalue().splitlines()) == 3
