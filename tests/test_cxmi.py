"""ctx-cxmi: CXMI and P-CXMI (Fernandes et al. 2021) against no, shuffled and
random context, checked against log-probabilities computed independently, one
sentence at a time through the model's ``get_normalized_probs``; the paper's
CXMI (true against empty context, mean of per-sentence means) built by hand
on a checkpoint trained with a sampled context size; the context-size curve
and the document bootstrap."""

import json
import os
import shutil

import numpy as np
import pytest
import torch

from fairseq_cli_utils import TINY_MODEL_ARGS, train
from ctx_fairseq.eval.context_use import cxmi_outputs

pytestmark = pytest.mark.usefixtures("one_thread")

CONDS = ["none", "shuffled", "random"]


def _sentence_logprob(model, ds, i, edit=None):
    """log p(reference of sentence i), its own batch of one; ``edit(sample)``
    may change the batch first."""
    sample = ds.collater([ds[i]])
    if edit is not None:
        edit(sample)
    with torch.no_grad():
        out = model(**sample["net_input"])
        lp = model.get_normalized_probs(out, log_probs=True)
    target = sample["target"]
    tok = lp.gather(-1, target.unsqueeze(-1)).squeeze(-1).double()
    keep = target.ne(ds.tgt_dict.pad())
    if "target_prefix_len" in sample:
        keep &= torch.arange(target.size(1)).unsqueeze(0) >= sample["target_prefix_len"][:, None]
    return float(tok[keep].sum())


@pytest.fixture(scope="module")
def loaded(context_ckpt, toy_bin):
    from ctx_fairseq.eval.context_use import cxmi

    return cxmi.load(context_ckpt[0], toy_bin, cuda=False)


@pytest.fixture(scope="module")
def measured(loaded):
    from ctx_fairseq.eval.context_use import cxmi

    model, task, cfg = loaded
    return cxmi.compute_cxmi(model, task, cfg, "test", CONDS, max_tokens=300, lang="de")


def test_cxmi_equals_independent_logprobs(loaded, measured):
    """cxmi = mean over target tokens of log p(y|x,C) - log p(y|x,C'), with
    every log-probability recomputed sentence by sentence; none's input built
    by hand (the batch's context replaced by an empty one)."""
    from ctx_fairseq.eval.context_use import cxmi

    model, task, cfg = loaded
    result, words = measured
    true_ds = cxmi.condition_dataset(task, "test", "true")
    n = len(true_ds)
    lens = np.array([len(true_ds.base.tgt[i]) for i in range(n)])
    assert result["tokens"] == lens.sum() and result["sentences"] == n

    def empty_context(sample):
        ni = sample["net_input"]
        ni["src_ctx_tokens"] = torch.full((1, 1), task.source_dictionary.pad())
        ni["src_ctx_lengths"] = torch.zeros(1, dtype=torch.long)

    true = np.array([_sentence_logprob(model, true_ds, i) for i in range(n)])
    assert result["logprob_true_per_token"] == pytest.approx(true.sum() / lens.sum(), abs=1e-5)
    for c in CONDS:
        if c == "none":
            other = np.array([_sentence_logprob(model, true_ds, i, empty_context)
                              for i in range(n)])
        else:
            ds = cxmi.condition_dataset(task, "test", c)
            other = np.array([_sentence_logprob(model, ds, i) for i in range(n)])
        assert result[c]["tokens"] == lens.sum()
        # the paper's normalisation first (mean of per-sentence means), the others beside
        assert result[c]["cxmi"] == pytest.approx(np.mean((true - other) / lens), abs=1e-5)
        assert result[c]["cxmi_per_token"] == pytest.approx((true - other).sum() / lens.sum(),
                                                            abs=1e-5)
        assert result[c]["cxmi_per_sentence_sum"] == pytest.approx((true - other).sum() / n,
                                                                   abs=1e-4)
        # the first sentence of a document has no context under any condition
        first = true_ds.sent_pos == 0
        assert np.abs((true - other)[first]).max() < 1e-5
        assert result["by_position"][c]["0"]["cxmi"] == pytest.approx(0.0, abs=1e-6)
        # and the others do differ: the condition changed the input
        assert np.abs((true - other)[~first]).max() > 1e-4
        # per word: the words' P-CXMI add up to the sentence's
        per_sentence = np.zeros(n)
        for rec in words:
            per_sentence[rec["sentence"]] += rec["p_cxmi"][c]
        np.testing.assert_allclose(per_sentence, true - other, atol=1e-4)


def test_outputs(measured, tmp_path):
    from ctx_fairseq.eval.context_use import cxmi

    result, words = measured
    paths = cxmi_outputs.write_outputs(result, words, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(cxmi_outputs.OUTPUT_FILES)
    got = json.loads((tmp_path / "cxmi.json").read_text())
    assert got["cxmi"] == got["none"]["cxmi"] and got["cxmi_interval"] == got["none"]["interval"]
    for c in CONDS:
        assert set(got[c]) >= {"cxmi", "tokens", "cxmi_per_token", "cxmi_per_sentence_sum",
                               "interval", "normalisation"}
        assert "mean over sentences" in got[c]["normalisation"]["cxmi"]
        # 6 test documents: too few for a document bootstrap, said so, no interval
        assert got[c]["interval"]["low"] is None and "too few" in got[c]["interval"]["note"]
        assert got["top_words"][c] and all(r["count"] >= 3 for r in got["top_words"][c])
        means = [r["mean_p_cxmi"] for r in got["top_words"][c]]
        assert means == sorted(means, reverse=True)
        classes = got["word_classes"][c]
        assert set(classes) == {"all words", "pronouns", "deictic", "other", "</s>"}
        # all words: </s> left out, on a line of its own (one per sentence)
        n_eos = sum(r["word"] == "</s>" for r in words)
        assert n_eos == got["sentences"] and classes["</s>"]["count"] == n_eos
        assert classes["all words"]["count"] == len(words) - n_eos
        assert classes["all words"]["excludes"] == "</s>"
        assert sum(g["count"] for k, g in classes.items() if k != "all words") == len(words)
        vals = [r["p_cxmi"][c] for r in words if r["word"] != "</s>"]
        assert classes["all words"]["mean_p_cxmi"] == pytest.approx(np.mean(vals), abs=1e-9)
        eos = [r["p_cxmi"][c] for r in words if r["word"] == "</s>"]
        assert classes["</s>"]["mean_p_cxmi"] == pytest.approx(np.mean(eos), abs=1e-9)
        assert classes["</s>"]["minus_all_words"] == pytest.approx(np.mean(eos) - np.mean(vals),
                                                                   abs=1e-9)
    assert got["sentence_level_frozen"] is False and got["co_primary"] is None
    assert any("without a sampled context size" in n for n in got["notes"])
    lines = [json.loads(x) for x in (tmp_path / "tokens.jsonl").read_text().splitlines()]
    assert len(lines) == len(words)
    assert set(lines[0]) >= {"doc", "sentence", "sent_pos", "position", "word", "p_cxmi"}
    assert set(lines[0]["p_cxmi"]) == set(CONDS)
    # the words are the reference's words, </s> included
    first = [r["word"] for r in lines if r["sentence"] == 0]
    assert first[-1] == "</s>"
    pronouns = got["word_classes"]["shuffled"]["pronouns"]["words"]
    assert set(pronouns) <= {"er", "sie", "es", "ihn", "ihm", "ihr", "ihnen", "wir", "ich", "du"}
    md = (tmp_path / "cxmi.md").read_text()
    assert "| shuffled |" in md and "note: none" in md
    for png in ("cxmi_hist.png", "cxmi_by_position.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert paths["cxmi.json"] == str(tmp_path / "cxmi.json")


def test_class_breakdown_per_word_and_by_repetition(loaded, measured, tmp_path):
    """Each listed class's mean P-CXMI per member word and split by whether the
    word is repeated from the previous reference sentence of its document, both
    recomputed here from the reference text and the per-word records."""
    from ctx_fairseq.eval.context_use import cxmi
    from ctx_fairseq.eval.context_use.word_classes import classes_for, normalise

    model, task, cfg = loaded
    result, words = measured
    ds = cxmi.condition_dataset(task, "test", "true")
    d = task.target_dictionary
    table = classes_for("de")
    # the previous reference sentence's words, from the raw reference text
    sentence_words = [[w.lower() for w in d.string(ds.base.tgt[i]).replace("@@ ", "").split()]
                      for i in range(len(ds))]
    repeated = 0
    for r in words:
        i = r["sentence"]
        prev = set(sentence_words[i - 1]) if r["sent_pos"] > 0 else set()
        want = None if r["word"] == "</s>" else normalise(r["word"]) in prev
        assert r["in_previous_reference"] is want, r  # </s>: in neither half
        repeated += bool(want)
    assert repeated > 0  # the toy corpus repeats words: the split is not empty
    for c in CONDS:
        classes = result["word_classes"][c]
        for name, g in classes.items():
            sel = [r for r in words if (r["word"] == "</s>") == (name == "</s>") and (
                name in ("all words", "</s>")
                or table.get(normalise(r["word"]), "other") == name)]
            for key, flag in (("in_previous_reference", True),
                              ("not_in_previous_reference", False)):
                vals = [r["p_cxmi"][c] for r in sel if r["in_previous_reference"] == flag]
                assert g[key]["count"] == len(vals)
                if vals:
                    assert g[key]["mean_p_cxmi"] == pytest.approx(np.mean(vals), abs=1e-9)
            if name in ("all words", "other", "</s>"):
                assert "by_word" not in g
                continue
            assert sum(b["count"] for b in g["by_word"]) == g["count"]
            assert [b["count"] for b in g["by_word"]] == \
                sorted((b["count"] for b in g["by_word"]), reverse=True)
            for b in g["by_word"]:
                vals = [r["p_cxmi"][c] for r in sel if normalise(r["word"]) == b["word"]]
                assert b["count"] == len(vals)
                assert b["mean_p_cxmi"] == pytest.approx(np.mean(vals), abs=1e-9)
    every = result["word_classes"]["none"]["all words"]
    assert every["in_previous_reference"]["count"] + every["not_in_previous_reference"][
        "count"] == len(words) - len(ds)  # every word but the </s> of each sentence
    pron = result["word_classes"]["none"]["pronouns"]
    assert pron["count"] > 0
    md = cxmi_outputs.format_result(result)
    assert "pronouns: mean P-CXMI per word" in md
    assert f"| (pronouns: in the previous reference sentence) | " \
        f"{pron['in_previous_reference']['count']} |" in md
    top = pron["by_word"][0]
    if top["count"] >= result["top_words_min_count"]:
        assert f"| {top['word']} | {top['count']} | {top['mean_p_cxmi']:.4f} |" in md


def test_none_is_the_headline_and_conditions_checked(loaded):
    from ctx_fairseq.eval.context_use import cxmi

    model, task, cfg = loaded
    result, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["none"], max_tokens=300)
    assert result["conditions"] == ["none"]
    result, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["shuffled"], max_tokens=300)
    assert result["conditions"] == ["none", "shuffled"]  # the headline always comes first
    assert result["shuffled"]["role"].startswith("sensitivity check")
    assert result["word_classes"] is None  # target language "tgt": no list
    assert any("--word-classes" in n for n in result["notes"])
    with pytest.raises(ValueError, match="unknown condition"):
        cxmi.compute_cxmi(model, task, cfg, "test", ["wrong"])


def test_batch_logprobs_adds_no_host_read(loaded):
    """The per-batch work beyond the model's forward reads nothing back (the
    batch is moved to the device before, host-to-device)."""
    from ctx_fairseq.eval.context_use import cxmi
    from ctx_fairseq.host_reads import HostReadCounter

    model, task, cfg = loaded
    ds = cxmi.condition_dataset(task, "test", "true")
    sample = ds.collater([ds[i] for i in range(8)])
    with HostReadCounter() as bare, torch.no_grad():
        model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
    with HostReadCounter() as ours, torch.no_grad():
        cxmi.batch_logprobs(model, sample["net_input"], sample["target"])
    assert ours.by_op == bare.by_op


class _ModelElsewhere:
    """The model as if on another device (tests/other_device.py): every
    tensor it is given must be there; it runs on the CPU data and returns its
    outputs there."""

    def __init__(self, model):
        self.model = model

    def eval(self):
        return self

    def parameters(self):
        from other_device import OTHER

        yield torch.empty(0, device=OTHER)

    def max_positions(self):
        return self.model.max_positions()

    def _run(self, fn, *args, **kwargs):
        from torch.utils._python_dispatch import _disable_current_modes
        from torch.utils._pytree import tree_map

        from other_device import Elsewhere, not_on_other

        def _unwrap(x):  # the CPU data under the simulated device's tensors
            return tree_map(lambda t: t.elem if isinstance(t, Elsewhere) else t, x)

        wrong = not_on_other(("args", args), ("kwargs", kwargs))
        assert not wrong, f"tensors on the CPU reach the model: {wrong}"
        with _disable_current_modes():
            out = fn(*_unwrap(args), **_unwrap(kwargs))
        return tree_map(lambda t: Elsewhere(t) if isinstance(t, torch.Tensor) else t, out)

    def __call__(self, **net_input):
        return self._run(self.model, **net_input)

    def get_normalized_probs(self, net_output, log_probs):
        return self._run(self.model.get_normalized_probs, net_output, log_probs=log_probs)


def test_model_on_another_device(loaded):
    """Batches go to the model's device, results come back once: the same
    numbers as on the CPU (a second device simulated on the CPU)."""
    from ctx_fairseq.eval.context_use import cxmi
    from other_device import OtherDeviceMode

    model, task, cfg = loaded
    ds = cxmi.condition_dataset(task, "test", "shuffled")
    here = cxmi.token_logprobs(model, task, ds, 300)
    with OtherDeviceMode():
        there = cxmi.token_logprobs(_ModelElsewhere(model), task, ds, 300)
    assert len(here) == len(there)
    for a, b in zip(here, there):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_batching_does_not_change_the_numbers(loaded, measured):
    from ctx_fairseq.eval.context_use import cxmi

    model, task, cfg = loaded
    result, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["shuffled"], max_tokens=None,
                                  batch_size=3)
    assert result["shuffled"]["cxmi"] == pytest.approx(measured[0]["shuffled"]["cxmi"], abs=1e-5)


def test_errors(sentence_ckpt, context_ckpt, toy_bin, tmp_path, monkeypatch):
    from ctx_fairseq.eval.context_use import cxmi

    with pytest.raises(cxmi.CXMIError, match="sentence-level checkpoint"):
        cxmi.load(sentence_ckpt, toy_bin, cuda=False)
    nodoc = tmp_path / "nodoc"
    shutil.copytree(toy_bin, nodoc)
    os.remove(nodoc / "test.docids")
    out = tmp_path / "out"
    with pytest.raises(SystemExit):
        cxmi.cli_main(["--path", context_ckpt[0], "--data", str(nodoc), "--split", "test",
                       "--out", str(out), "--cpu"])
    assert not out.exists() or not os.listdir(out)
    model, task, cfg = cxmi.load(context_ckpt[0], str(nodoc), cuda=False)
    with pytest.raises(cxmi.CXMIError, match="document ids not found"):
        cxmi.compute_cxmi(model, task, cfg, "test", ["shuffled"])
    # one document: there is no other document to take shuffled context from
    onedoc = tmp_path / "onedoc"
    shutil.copytree(toy_bin, onedoc)
    n_lines = len((onedoc / "test.docids").read_text().splitlines())
    (onedoc / "test.docids").write_text("d0\n" * n_lines)
    model, task, cfg = cxmi.load(context_ckpt[0], str(onedoc), cuda=False)
    with pytest.raises(cxmi.CXMIError, match="another document.*only 1 document"):
        cxmi.compute_cxmi(model, task, cfg, "test", ["shuffled"])
    result, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["random"])
    assert result["documents"] == 1 and "shuffled" not in result["conditions"]
    # nothing half-written: a failure while writing leaves no output
    result, words = cxmi.compute_cxmi(*cxmi.load(context_ckpt[0], toy_bin, cuda=False), "test",
                                      ["shuffled"])

    def boom(*a, **k):
        raise RuntimeError("plot failed")

    monkeypatch.setattr(cxmi_outputs, "_plots", boom)
    with pytest.raises(RuntimeError, match="plot failed"):
        cxmi_outputs.write_outputs(result, words, str(out))
    assert os.listdir(out) == []


MEMORY_ARCHS = {
    # encoder integration, shared memory, trained here from scratch
    "selective_doc_online": ["--arch", "transformer_selective_doc", "--context-memory", "shared",
                             "--document-context", "online"],
    "selective_doc_offline": ["--arch", "transformer_selective_doc", "--context-memory",
                              "shared", "--document-context", "offline"],
}


def _memory_checkpoint(name, toy_bin, tmp_path, selective_dec_ckpt):
    if name == "selective_dec_frozen":  # decoder integration, frozen memory, target memory
        return selective_dec_ckpt
    save = str(tmp_path / "ckpt")
    train([toy_bin, *MEMORY_ARCHS[name], "--task", "document_translation", "--document-memory",
           *TINY_MODEL_ARGS, "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3",
           "--max-tokens", "600", "--max-update", "2", "--save-dir", save, "--no-progress-bar",
           "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
           "--disable-validation"])
    return os.path.join(save, "checkpoint_last.pt")


@pytest.mark.parametrize("name", [*MEMORY_ARCHS, "selective_dec_frozen"])
def test_document_memory_models(name, toy_bin, tmp_path, selective_dec_ckpt):
    """Models with a document memory: every condition, checked against
    sentence-by-sentence log-probabilities (each sentence a batch of its own:
    a memory of its own batch); none: the same as the sentence with
    ``query_doc = -1`` (a context-dropped sentence: no visible memory)."""
    from ctx_fairseq.eval.context_use import cxmi

    ckpt = _memory_checkpoint(name, toy_bin, tmp_path, selective_dec_ckpt)
    model, task, cfg = cxmi.load(ckpt, toy_bin, cuda=False)
    assert task.cfg.document_memory
    online = task.cfg.document_context == "online"
    result, words = cxmi.compute_cxmi(model, task, cfg, "test", CONDS, max_tokens=600)
    true_ds = cxmi.condition_dataset(task, "test", "true")
    n = len(true_ds)
    tokens = sum(len(true_ds.base.tgt[i]) for i in range(n))
    true = np.array([_sentence_logprob(model, true_ds, i) for i in range(n)])
    assert result["logprob_true_per_token"] == pytest.approx(true.sum() / tokens, abs=1e-5)
    has = true_ds.sentences_with_context()
    assert result["sentences_with_context"] == int(has.sum())
    assert has.sum() == ((true_ds.sent_pos > 0).sum() if online else n)

    def dropped(sample):
        sample["net_input"]["query_doc"] = torch.full_like(sample["net_input"]["query_doc"], -1)

    for c in CONDS:
        ds = cxmi.condition_dataset(task, "test", c)
        other = np.array([_sentence_logprob(model, ds, i) for i in range(n)])
        if c == "none":
            by_hand = np.array([_sentence_logprob(model, true_ds, i, dropped) for i in range(n)])
            np.testing.assert_allclose(other, by_hand, atol=1e-5)
        assert result[c]["cxmi_per_token"] == pytest.approx((true - other).sum() / tokens,
                                                            abs=1e-5)
        diff = true - other
        if online:  # a document's first sentence sees no memory under any condition
            assert np.abs(diff[true_ds.sent_pos == 0]).max() < 1e-5
        assert np.abs(diff[has]).max() > 1e-4  # the condition changed what the model saw
    write = cxmi_outputs.write_outputs(result, words, str(tmp_path / "out"))
    assert os.path.exists(write["cxmi.json"])


def test_a_document_memory_trained_with_a_sampled_window(toy_bin, tmp_path):
    """An online memory model trained with --sample-context-size 2 (its
    memory's window drawn per sentence): --context-size N scores the memory
    sentences at most N positions away (checked sentence by sentence), the
    curve has K+1 points, N above K is refused; without the sampled size any
    N is taken, and the curve is refused."""
    from ctx_fairseq.eval.context_use import cxmi

    save = str(tmp_path / "ckpt")
    train([toy_bin, *MEMORY_ARCHS["selective_doc_online"], "--task", "document_translation",
           "--document-memory", "--sample-context-size", "2", *TINY_MODEL_ARGS,
           "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens",
           "600", "--max-update", "2", "--save-dir", save, "--no-progress-bar",
           "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
           "--disable-validation"])
    model, task, cfg = cxmi.load(os.path.join(save, "checkpoint_last.pt"), toy_bin, cuda=False)
    assert cxmi.trained_context_size(task) == 2
    result, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["none"], max_tokens=600,
                                  context_size=1, curve=True)
    assert result["context_size"] == 1 and result["trained_context_size"] == 2
    assert [p["context_size"] for p in result["curve"]] == [0, 1, 2]
    sized = cxmi.condition_dataset(task, "test", "true", 1)
    n = len(sized)
    tokens = sum(len(sized.base.tgt[i]) for i in range(n))
    true = np.array([_sentence_logprob(model, sized, i) for i in range(n)])
    assert result["logprob_true_per_token"] == pytest.approx(true.sum() / tokens, abs=1e-5)
    widest = cxmi.condition_dataset(task, "test", "true")  # window K = 2, as trained
    assert widest.context_size == 2
    far = np.flatnonzero(widest.sent_pos >= 2)  # these see two sentences at window 2
    wide = np.array([_sentence_logprob(model, widest, int(i)) for i in far])
    assert np.abs(wide - true[far]).max() > 1e-6  # the window changed what they saw
    with pytest.raises(cxmi.CXMIError, match="larger than the checkpoint was trained with"):
        cxmi.compute_cxmi(model, task, cfg, "test", ["none"], context_size=3)
    plain = _memory_checkpoint("selective_doc_online", toy_bin, tmp_path / "plain", None)
    model, task, cfg = cxmi.load(plain, toy_bin, cuda=False)
    assert cxmi.trained_context_size(task) is None
    result, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["none"], max_tokens=600,
                                  context_size=5)
    assert result["context_size"] == 5
    assert any("window on a document memory trained on whole documents" in n
               for n in result["notes"])
    with pytest.raises(cxmi.CXMIError, match="--curve"):
        cxmi.compute_cxmi(model, task, cfg, "test", ["none"], curve=True)


def test_cli(context_ckpt, toy_bin, tmp_path, capsys):
    from ctx_fairseq.eval.context_use import cxmi

    cxmi.cli_main(["--path", context_ckpt[0], "--data", toy_bin, "--split", "valid",
                   "--out", str(tmp_path), "--cpu", "--conditions", "shuffled",
                   "--max-tokens", "400", "--lang", "de"])
    got = json.loads((tmp_path / "cxmi.json").read_text())
    assert got["conditions"] == ["none", "shuffled"] and got["split"] == "valid"
    assert "| shuffled |" in capsys.readouterr().out


def test_console_script():
    from ctx_fairseq.cli import entry_points

    setup = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "setup.py")).read()
    assert '"ctx-cxmi = ctx_fairseq.cli.entry_points:cxmi"' in setup
    assert callable(entry_points.cxmi)


def test_merge_words():
    from ctx_fairseq.eval.context_use.cxmi import merge_words

    assert merge_words(["a@@", "b", "c", "</s>"]) == [("ab", 0, 2), ("c", 2, 3), ("</s>", 3, 4)]
    assert merge_words(["\u2581ab", "c", "\u2581d", "</s>"], "sentencepiece") == \
        [("abc", 0, 2), ("d", 2, 3), ("</s>", 3, 4)]


def test_word_lists():
    from ctx_fairseq.eval.context_use.word_classes import LANGUAGES, classes_for, normalise

    assert set(LANGUAGES) == {"en", "de", "fr", "ru", "zh"}
    for lang in LANGUAGES:
        table = classes_for(lang)  # raises if a word is in two classes
        assert set(table.values()) == {"pronouns", "deictic"}
    assert classes_for("ru")[normalise("Её")] == "pronouns"
    assert classes_for("xx") is None
    with pytest.raises(ValueError, match="both"):
        classes_for(None, {"a": ["x"], "b": ["X"]})


# ------------------------------------------------------------- architectures
ARCHS = {
    "transformer_han": ["--arch", "transformer_han", "--task", "document_translation",
                        "--source-context-size", "2", "--target-context-size", "2",
                        "--han-context-sentences", "2"],
    "transformer_doc_zhang2018": ["--arch", "transformer_doc_zhang2018", "--task",
                                  "document_translation", "--source-context-size", "2"],
    "concat_2to2": ["--arch", "transformer", "--task", "document_translation",
                    "--concat-context", "--source-context-size", "1",
                    "--target-context-size", "1"],
}


@pytest.mark.parametrize("name", list(ARCHS))
def test_every_context_architecture(name, toy_bin, tmp_path):
    """Each context architecture with per-sentence context: all conditions,
    checked against sentence-by-sentence log-probabilities (concatenation's
    none: the model run on the sentence alone, a sentence-level batch)."""
    from ctx_fairseq.eval.context_use import cxmi

    save = str(tmp_path / "ckpt")
    train([toy_bin, *ARCHS[name], *TINY_MODEL_ARGS, "--share-all-embeddings", "--optimizer",
           "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "2", "--save-dir", save,
           "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
           "--disable-validation"])
    model, task, cfg = cxmi.load(os.path.join(save, "checkpoint_last.pt"), toy_bin, cuda=False)
    result, words = cxmi.compute_cxmi(model, task, cfg, "test", CONDS, max_tokens=400)
    true_ds = cxmi.condition_dataset(task, "test", "true")
    n = len(true_ds)
    true = np.array([_sentence_logprob(model, true_ds, i) for i in range(n)])
    tokens = sum(len(true_ds.base.tgt[i]) for i in range(n))
    for c in CONDS:
        if c == "none" and name.startswith("concat"):
            base = true_ds.base
            other = np.array([_sentence_logprob(model, base, i) for i in range(n)])
        else:
            ds = cxmi.condition_dataset(task, "test", c)
            other = np.array([_sentence_logprob(model, ds, i) for i in range(n)])
        assert result[c]["cxmi_per_token"] == pytest.approx((true - other).sum() / tokens,
                                                            abs=1e-5)
        assert result["by_position"][c]["0"]["cxmi"] == pytest.approx(0.0, abs=1e-6)
    write = cxmi_outputs.write_outputs(result, words, str(tmp_path / "out"))
    assert os.path.exists(write["tokens.jsonl"])


# ------------------------------------------- the paper's CXMI, sampled context size
@pytest.fixture(scope="module")
def sampled_ckpt(toy_bin, sentence_ckpt, tmp_path_factory):
    """transformer_context_aware from the sentence checkpoint, 3 updates with
    --sample-context-size 1 (K = 1)."""
    save = str(tmp_path_factory.mktemp("sampled"))
    train([toy_bin, "--arch", "transformer_context_aware", "--task", "document_translation",
           "--source-context-size", "1", "--sample-context-size", "1", *TINY_MODEL_ARGS,
           "--share-all-embeddings", "--init-from-sentence-checkpoint", sentence_ckpt,
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "3",
           "--save-dir", save, "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1",
           "--num-workers", "0", "--disable-validation"])
    return os.path.join(save, "checkpoint_last.pt")


def test_paper_cxmi_by_hand(sampled_ckpt, toy_bin):
    """Fernandes et al. (2021)'s CXMI built by hand: the same model, each
    sentence in a batch of its own with its true context and with an empty
    context (the batch's context replaced by a row of padding), the mean
    token log-probability of each sentence, their difference averaged over the
    sentences. ctx-cxmi's headline matches it to 1e-6; --context-size 0 gives
    0 exactly; the curve over sizes 0..K has K+1 points, 0 at size 0 and the
    headline at K."""
    from ctx_fairseq.eval.context_use import cxmi

    model, task, cfg = cxmi.load(sampled_ckpt, toy_bin, cuda=False)
    assert task.cfg.sample_context_size == 1 and cxmi.trained_context_size(task) == 1
    result, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["none"], max_tokens=300,
                                  curve=True, lang="de")
    ds = cxmi.condition_dataset(task, "test", "true")
    n = len(ds)

    def empty_context(sample):
        ni = sample["net_input"]
        ni["src_ctx_tokens"] = torch.full((1, 1), task.source_dictionary.pad())
        ni["src_ctx_lengths"] = torch.zeros(1, dtype=torch.long)

    lens = np.array([len(ds.base.tgt[i]) for i in range(n)])
    true = np.array([_sentence_logprob(model, ds, i) for i in range(n)]) / lens
    empty = np.array([_sentence_logprob(model, ds, i, empty_context) for i in range(n)]) / lens
    by_hand = float(np.mean(true - empty))
    assert abs(by_hand) > 1e-4  # the context changes something
    assert result["cxmi"] == pytest.approx(by_hand, abs=1e-6)
    assert result["none"]["cxmi"] == result["cxmi"]
    assert result["context_size"] == 1 and result["trained_context_size"] == 1
    assert not any("out of distribution" in note for note in result["notes"])
    assert [p["context_size"] for p in result["curve"]] == [0, 1]
    assert result["curve"][0]["cxmi"] == 0.0
    assert result["curve"][1]["cxmi"] == pytest.approx(result["cxmi"], abs=1e-12)
    zero, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["none"], max_tokens=300,
                                context_size=0)
    assert zero["cxmi"] == 0.0 and zero["sentences_with_context"] == 0
    one, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["none"], max_tokens=300,
                               context_size=1)
    assert one["cxmi"] == pytest.approx(result["cxmi"], abs=1e-12)


def test_context_size_bad_input(sampled_ckpt, context_ckpt, toy_bin, tmp_path, capsys):
    """--context-size above the trained K, negative, or --curve on a memory
    model: a one-line error, nothing written."""
    from ctx_fairseq.eval.context_use import cxmi

    model, task, cfg = cxmi.load(sampled_ckpt, toy_bin, cuda=False)
    with pytest.raises(cxmi.CXMIError, match="larger than the checkpoint was trained with"):
        cxmi.compute_cxmi(model, task, cfg, "test", ["none"], context_size=2)
    for bad in (["--context-size", "2"], ["--context-size", "-1"]):
        out = tmp_path / "out"
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            cxmi.cli_main(["--path", sampled_ckpt, "--data", toy_bin, "--split", "test",
                           "--out", str(out), "--cpu", *bad])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("ctx-cxmi: error: --context-size"), err
        assert "Traceback" not in "\n".join(err)
        assert not out.exists()


def test_doc_bootstrap():
    """The document block bootstrap: too few documents give no interval and
    say why; the same seed, the same interval; documents that all gain give an
    interval above 0; a paired difference on the same draws."""
    from ctx_fairseq.eval.context_use.cxmi import MIN_BOOTSTRAP_DOCS, doc_bootstrap

    few = doc_bootstrap(np.ones(MIN_BOOTSTRAP_DOCS - 1), np.ones(MIN_BOOTSTRAP_DOCS - 1))
    assert few["low"] is None and few["high"] is None and "too few" in few["note"]
    rng = np.random.default_rng(0)
    den = rng.integers(5, 20, size=30).astype(float)
    num = den * (0.1 + 0.02 * rng.standard_normal(30))
    iv = doc_bootstrap(num, den, seed=3)
    assert 0 < iv["low"] < num.sum() / den.sum() < iv["high"]
    assert doc_bootstrap(num, den, seed=3) == iv
    noise = den * rng.standard_normal(30)
    iv0 = doc_bootstrap(noise, den)
    assert iv0["low"] < 0 < iv0["high"]
    same = doc_bootstrap(num, den, minus=(num, den))
    assert same["low"] == same["high"] == 0.0
    assert "30 documents" in iv["method"]


def test_frozen_sentence_level_has_shuffled_as_co_primary(toy_bin, sentence_ckpt, tmp_path):
    """A checkpoint trained with --freeze-sentence-level (read from its own
    arguments, also from the file alone): flagged, shuffled measured though
    not asked for (its co-primary figure), a note and a line in cxmi.md; the
    same model without the flag is not flagged."""
    from ctx_fairseq.eval.context_use import cxmi

    flags = {}
    for frozen in (True, False):
        save = str(tmp_path / f"z{int(frozen)}")
        train([toy_bin, *ARCHS["transformer_doc_zhang2018"], *TINY_MODEL_ARGS,
               "--share-all-embeddings", "--init-from-sentence-checkpoint", sentence_ckpt,
               *(["--freeze-sentence-level"] if frozen else []), "--optimizer", "adam", "--lr",
               "1e-3", "--max-tokens", "500", "--max-update", "1", "--save-dir", save,
               "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1", "--num-workers",
               "0", "--disable-validation"])
        path = os.path.join(save, "checkpoint_last.pt")
        model, task, cfg = cxmi.load(path, toy_bin, cuda=False)
        result, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["none"], max_tokens=400)
        flags[frozen] = result
        assert cxmi.checkpoint_sentence_level_frozen(path) is frozen
    on, off = flags[True], flags[False]
    assert on["sentence_level_frozen"] is True and on["co_primary"] == "shuffled"
    assert on["conditions"] == ["none", "shuffled"] and "cxmi" in on["shuffled"]
    assert any("--freeze-sentence-level" in n and "co-primary" in n for n in on["notes"])
    assert "co-primary: shuffled" in cxmi_outputs.format_result(on)
    assert off["sentence_level_frozen"] is False and off["co_primary"] is None
    assert off["conditions"] == ["none"]
    assert "co-primary" not in cxmi_outputs.format_result(off)
