"""Bad input ends a fairseq command in one line, not a traceback
(ctx_fairseq.errors); any other exception keeps its traceback."""

import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)


def test_an_input_error_is_one_line_and_other_errors_keep_their_traceback():
    r = _run("import ctx_fairseq\nfrom ctx_fairseq.errors import InputError\n"
             "raise InputError('--x 3: expected at most 2')")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == "python: error: --x 3: expected at most 2"
    assert "Traceback" not in r.stderr
    r = _run("import ctx_fairseq\nraise ValueError('a bug')")
    assert r.returncode == 1 and "Traceback" in r.stderr and "ValueError: a bug" in r.stderr
    # (a library caller still catches it as a ValueError)
    from ctx_fairseq.data.docids import DocumentIdError
    from ctx_fairseq.errors import InputError
    assert issubclass(InputError, ValueError) and issubclass(DocumentIdError, InputError)


def test_fairseq_train_without_docids_is_one_line(toy_bin, tmp_path):
    """A split without its .docids: fairseq-train names the file in one line."""
    data = tmp_path / "bin"
    shutil.copytree(toy_bin, data)
    os.remove(data / "train.docids")
    r = subprocess.run([sys.executable, "-m", "fairseq_cli.train", str(data), "--user-dir",
                        "ctx_fairseq", "--task", "document_translation", "--source-context-size",
                        "1", "--arch", "transformer_context_aware", "--max-tokens", "500", "--save-dir",
                        str(tmp_path / "ckpt"), "--max-update", "1"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("train: error: ") and "train.docids: document ids not found" in last
    assert "Traceback" not in r.stderr
    # the model that does not take the context asked for: one line too
    r = subprocess.run([sys.executable, "-m", "fairseq_cli.train", str(toy_bin), "--user-dir",
                        "ctx_fairseq", "--task", "document_translation", "--source-context-size",
                        "1", "--arch", "transformer", "--max-tokens", "500", "--save-dir",
                        str(tmp_path / "ckpt2"), "--max-update", "1"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "train: error: --arch transformer does not take document context (its forward has no "
        "src_ctx_tokens: its class declares no context_contract); use a context-aware "
        "architecture or --source-context-size 0 --target-context-size 0")
