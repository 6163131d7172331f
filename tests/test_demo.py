"""ctx-demo end to end on a tiny setting: the table, step reuse, failures."""

import json
import os

import numpy as np
import pytest

from ctx_fairseq.cli import demo

# 20 training documents: 2 test documents, so that ctx-cxmi can take shuffled context
# from another document
TINY = ["--docs", "20", "--sents-per-doc", "5", "--max-distance", "2", "--max-update", "2"]


@pytest.fixture(scope="module")
def tiny_model(monkeypatch_module):
    monkeypatch_module.setattr(demo, "DEMO_MODEL_ARGS", [
        "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
        "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--share-all-embeddings",
    ])


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def demo_run(tiny_model, tmp_path_factory):
    work = str(tmp_path_factory.mktemp("demo"))
    return work


def test_demo_runs_and_reuses_steps(demo_run, capsys):
    demo.cli_main(["--workdir", demo_run, "--archs", "transformer", *TINY])
    out = capsys.readouterr().out
    assert "[5/5] BLEU + contrastive accuracy + CXMI transformer: done" in out
    assert "pron d=2" in out and "coh d=1" in out and "CXMI" in out
    results = json.load(open(os.path.join(demo_run, "results.json")))
    r = results["transformer"]
    assert 0.0 <= r["bleu"] <= 100.0 and r["params"] > 0
    pron = r["contrastive"]["by_phenomenon"]["pronoun"]
    assert r["cxmi"] == {"shuffled": None, "why": "sentence-level model (no context)",
                         "refused": False}
    assert "[1]" not in out  # no footnote: a sentence-level model has no context to measure
    assert pron["n"] > 0 and 0.0 <= pron["accuracy"] <= 1.0
    ckpt = os.path.join(demo_run, "checkpoints", "transformer", "checkpoint_last.pt")
    assert os.path.exists(ckpt)
    png = os.path.join(demo_run, "results.png")  # the plot beside the table
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 2000

    # The checkpoint loads safely once ctx_fairseq is imported.
    import torch

    import ctx_fairseq  # noqa: F401
    assert "model" in torch.load(ckpt, weights_only=True)

    # A re-run reuses every finished step ...
    demo.cli_main(["--workdir", demo_run, "--archs", "transformer", *TINY])
    out = capsys.readouterr().out
    assert out.count("done earlier, reused") == 5
    # ... and a changed setting re-runs the steps it affects.
    demo.cli_main(["--workdir", demo_run, "--archs", "transformer", *TINY[:-1], "3"])
    out = capsys.readouterr().out
    assert out.count("done earlier, reused") == 2  # toy corpus and preprocessing
    for step in ("train transformer", "fairseq-generate transformer",
                 "BLEU + contrastive accuracy + CXMI transformer"):
        assert f"{step}: done in" in out


def test_failed_step_names_command_and_log(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(demo, "DEMO_MODEL_ARGS", demo.DEMO_MODEL_ARGS + ["--no-such-option"])
    with pytest.raises(SystemExit) as exc:
        demo.cli_main(["--workdir", str(tmp_path), "--archs", "transformer", *TINY])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "step 'train transformer' failed" in err and "--no-such-option" in err
    log = os.path.join(str(tmp_path), "logs", "train-transformer.log")
    assert f"log: {log}" in err and "unrecognized arguments" in open(log).read()
    assert not os.path.exists(os.path.join(str(tmp_path), "steps", "train-transformer.done"))


def test_unknown_arch(tmp_path, capsys):
    with pytest.raises(SystemExit):
        demo.cli_main(["--workdir", str(tmp_path), "--archs", "transformer,nope"])
    assert "unknown architecture(s) nope" in capsys.readouterr().err


def test_demo_runs_the_selective_model_in_both_integrations(tiny_model, tmp_path, capsys):
    """Decoder integration translates by two-pass iterative decoding (its
    generate step is ctx-iterative-decode); both integrations are scored with
    their document memory."""
    work = str(tmp_path / "sel")
    demo.cli_main(["--workdir", work, "--archs",
                   "transformer_selective_doc,transformer_selective_doc_dec", *TINY])
    out = capsys.readouterr().out
    for arch in ("transformer_selective_doc", "transformer_selective_doc_dec"):
        res = json.load(open(os.path.join(work, "results", f"{arch}.json")))
        assert res["sentences"] > 0
        assert res["contrastive"]["overall"]["n"] > 0
        assert arch in out
    # CXMI: a number, or (while ctx-cxmi refuses document-memory models) "-" with a
    # footnote giving ctx-cxmi's reason, never a number it did not compute
    for arch in ("transformer_selective_doc", "transformer_selective_doc_dec"):
        c = json.load(open(os.path.join(work, "results", f"{arch}.json")))["cxmi"]
        if c["refused"]:
            assert c["shuffled"] is None and "document memory" in c["why"]
            assert "no CXMI for" in out and arch in out.split("no CXMI for", 1)[1]
        else:
            assert np.isfinite(c["shuffled"])
    steps = open(os.path.join(work, "logs", "generate-transformer_selective_doc_dec.log"),
                 errors="replace").read() if os.path.exists(
        os.path.join(work, "logs", "generate-transformer_selective_doc_dec.log")) else ""
    assert os.path.exists(os.path.join(work, "generate", "transformer_selective_doc_dec",
                                       "generate-pass2.txt")), steps[-2000:]


def test_changed_training_settings_start_anew(tiny_model, tmp_path, capsys):
    """A re-run with other training settings trains from scratch, never on top
    of the checkpoint the earlier settings left."""
    work = str(tmp_path / "fresh")
    demo.cli_main(["--workdir", work, "--archs", "transformer", *TINY])
    demo.cli_main(["--workdir", work, "--archs", "transformer", *TINY[:-1], "3"])
    log = open(os.path.join(work, "logs", "train-transformer.log")).read()
    assert "loaded checkpoint" not in log.lower() or "num_updates 0" in log
    import torch

    state = torch.load(os.path.join(work, "checkpoints", "transformer", "checkpoint_last.pt"),
                       map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 3
    assert "No existing checkpoint found" in log


def test_demo_cxmi_column_is_ctx_cxmi(tiny_model, tmp_path, capsys):
    """A context model's CXMI cell is compute_cxmi's CXMI against shuffled
    context on the test split, recomputed here from the checkpoint."""
    from ctx_fairseq.eval.context_use import cxmi

    work = str(tmp_path / "ctx")
    demo.cli_main(["--workdir", work, "--archs", "transformer_context_aware", *TINY])
    out = capsys.readouterr().out
    res = json.load(open(os.path.join(work, "results", "transformer_context_aware.json")))
    ckpt = os.path.join(work, "checkpoints", "transformer_context_aware", "checkpoint_last.pt")
    model, task, cfg = cxmi.load(ckpt, os.path.join(work, "data-bin"), cuda=False)
    want, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["shuffled"])
    # (two runs of the same float32 model: the matrix products' thread split may
    # differ under load, about 1e-8 here)
    assert res["cxmi"]["shuffled"] == pytest.approx(want["shuffled"]["cxmi_per_token"],
                                                    abs=1e-7)
    assert res["cxmi"]["tokens"] == want["tokens"] and not res["cxmi"]["refused"]
    row = next(line for line in out.splitlines() if line.startswith("transformer_context_aware"))
    assert f"{want['shuffled']['cxmi_per_token']:.4f}" in row.split()


def test_format_table_cxmi_cells_and_footnotes():
    """'-' for a sentence-level model, the number for a context model, '-[k]'
    with one footnote per reason ctx-cxmi gave for refusing."""
    group = {"n": 3, "correct": 3, "ties": 0, "wrong": 0, "accuracy": 1.0}
    contrastive = {"by_phenomenon": {"pronoun": group}, "by_distance": {"pronoun": {"1": group}}}

    def res(c):
        return {"params": 1e5, "bleu": 50.0, "contrastive": contrastive, "cxmi": c}

    why = "it reads a document memory (--document-memory): not supported yet"
    table = demo.format_table({
        "transformer": res({"shuffled": None, "why": "sentence-level model (no context)",
                            "refused": False}),
        "transformer_context_aware": res({"shuffled": 0.02301, "refused": False}),
        "transformer_selective_doc": res({"shuffled": None, "why": why, "refused": True}),
        "transformer_selective_doc_dec": res({"shuffled": None, "why": why, "refused": True}),
    }, 1)
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:6]}
    assert rows["transformer"][3] == "-"
    assert rows["transformer_context_aware"][3] == "0.0230"
    assert rows["transformer_selective_doc"][3] == "-[1]"
    assert rows["transformer_selective_doc_dec"][3] == "-[1]"
    assert table.count("no CXMI for") == 1
    assert ("[1] no CXMI for transformer_selective_doc, transformer_selective_doc_dec: ctx-cxmi "
            f"refuses it: {why}") in table
