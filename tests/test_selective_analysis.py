"""ctx-selective-analysis (ctx_fairseq.eval.analyses.selective_analysis): top context
sentences and words per head for one sentence, sparsemax support over a split,
on tiny transformer_selective_doc checkpoints trained 2 updates on the toy
corpus (encoder integration online, decoder integration online, flat-sentence
offline); errors."""

import json
import os

import pytest

from fairseq_cli_utils import train

#: the analysis reads the context layer whatever the memory: a memory with gradients
#: (``shared``; the architecture's default, ``frozen``, needs a stage-1 checkpoint)
SEL_ARGS = ["--task", "document_translation", "--document-memory",
            "--arch", "transformer_selective_doc", "--context-memory", "shared",
            "--encoder-layers", "1", "--decoder-layers", "1",
            "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
            "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
HEADS = 2


def _train(data, save, extra, max_update=2):
    train([data, *extra, "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3",
           "--max-tokens", "1000", "--max-update", str(max_update), "--save-dir", save,
           "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
           "--disable-validation", "--no-save-optimizer-state"])
    path = os.path.join(save, "checkpoint_last.pt")
    assert os.path.isfile(path)
    return path


@pytest.fixture(scope="module")
def enc_ckpt(toy_bin, tmp_path_factory):
    return _train(toy_bin, str(tmp_path_factory.mktemp("sel_enc")),
                  [*SEL_ARGS, "--document-context", "online"])


@pytest.fixture(scope="module")
def dec_ckpt(toy_bin, tmp_path_factory):
    return _train(toy_bin, str(tmp_path_factory.mktemp("sel_dec")),
                  [*SEL_ARGS, "--document-context", "online", "--target-context-size", "1",
                   "--context-integration", "decoder"])


@pytest.fixture(scope="module")
def flat_ckpt(toy_bin, tmp_path_factory):
    return _train(toy_bin, str(tmp_path_factory.mktemp("sel_flat")),
                  [*SEL_ARGS, "--document-context", "offline", "--doc-attention",
                   "flat-sentence"])


@pytest.fixture(scope="module")
def corpus(toy_corpus):
    """(docids, positions, source lines, target lines) of the raw test split."""
    def read(ext):
        with open(os.path.join(toy_corpus, f"test.{ext}"), encoding="utf-8") as f:
            return [x.rstrip("\n") for x in f]

    docids = read("docids")
    pos = []
    for i, d in enumerate(docids):
        pos.append(pos[-1] + 1 if i and docids[i - 1] == d else 0)
    return docids, pos, read("src"), read("tgt")


def _last_of_first_doc(corpus):
    docids, pos, _, _ = corpus
    line = max(i for i, d in enumerate(docids) if d == docids[0])
    assert pos[line] >= 3
    return line


def _run(argv):
    from ctx_fairseq.eval.analyses.selective_analysis import cli_main

    paths = cli_main(argv)
    with open(paths["json"], encoding="utf-8") as f:
        res = json.load(f)
    with open(paths["md"], encoding="utf-8") as f:
        md = f.read()
    return paths, res, md


def _valid_png(path, min_bytes=3000):
    """A PNG matplotlib can read back, with something drawn on it."""
    import matplotlib.image

    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", path
    assert os.path.getsize(path) > min_bytes, path
    img = matplotlib.image.imread(path)
    return img.ndim == 3 and min(img.shape[:2]) > 100 and float(img.std()) > 0


def _check_sentence(res, corpus, online, side="src", word_level=True):
    """Invariants of one sentence's report, against the raw corpus."""
    docids, pos, src, tgt = corpus
    line = res["line"]
    n_doc = sum(1 for d in docids if d == docids[line])
    assert res["position"] == pos[line] and res["document_sentences"] == n_doc
    assert res["source"] == src[line] and res["target"] == tgt[line]
    sents = res["sentences"]
    offsets = [e["offset"] for e in sents]
    assert 0 not in offsets  # the current sentence is never context
    if online:
        assert all(o < 0 for o in offsets)  # never a later sentence
        expected_visible = pos[line]
    else:
        expected_visible = n_doc - 1
    assert res["visible_sentences"] == expected_visible
    assert res["has_context"] == (expected_visible > 0)
    for e in sents:
        k = line + e["offset"]
        assert e["line"] == k and docids[k] == docids[line]
        assert e["source"] == src[k] and e["target"] == tgt[k]
        assert len(e["mass_per_head"]) == HEADS
        assert abs(e["mass"] - sum(e["mass_per_head"]) / HEADS) < 1e-9
        if not e["visible"]:
            assert e["mass"] == 0
    if not res["has_context"]:
        assert res["top_sentences"] == [] and all(e["mass"] == 0 for e in sents)
        return
    # sentence-level weights: a distribution over the visible sentences, per head
    assert abs(sum(e["mass"] for e in sents) - 1) < 1e-5
    for h in range(HEADS):
        assert abs(sum(e["mass_per_head"][h] for e in sents) - 1) < 1e-5
    support = [e for e in sents if e["mass"] > 0]
    assert res["support_sentences"] == len(support)
    for s in res["support_size_per_head"]:
        assert 1 <= s <= expected_visible
    # the top sentences are the largest masses, in decreasing order
    top = res["top_sentences"]
    masses = sorted((e["mass"] for e in support), reverse=True)
    assert [e["mass"] for e in top] == masses[:len(top)]
    assert 1 <= len(top) <= 3
    if not word_level:
        assert res["top_words_by_head"] is None
        return
    for e in top:
        # word columns are the sentence's words (memory side of the integration)
        assert e["words"] == (src if side == "src" else tgt)[e["line"]].split()
        for h in range(HEADS):
            # alpha_hier of a sentence sums to its sentence weight (alpha_w sums to 1)
            assert abs(sum(e["word_weights_per_head"][h]) - e["mass_per_head"][h]) < 1e-5
    by_line = {e["line"]: e for e in top}
    assert len(res["top_words_by_head"]) == HEADS
    for h, words in enumerate(res["top_words_by_head"]):
        assert 1 <= len(words)
        weights = [w["weight"] for w in words]
        assert weights == sorted(weights, reverse=True) and all(w > 0 for w in weights)
        for w in words:
            e = by_line[w["line"]]
            assert w["offset"] == e["offset"] and e["words"][w["position"]] == w["word"]
            assert w["weight"] == e["word_weights_per_head"][h][w["position"]]
        # nothing outside the list weighs more than what it holds
        rest = [a for e in top for a in e["word_weights_per_head"][h]]
        assert sorted(rest, reverse=True)[:len(words)] == weights


# --------------------------------------------------------------------------- sentence


def test_sentence_encoder_cli(enc_ckpt, toy_bin, corpus, tmp_path):
    line = _last_of_first_doc(corpus)
    out = str(tmp_path / "out")
    paths, res, md = _run(["sentence", "--path", enc_ckpt, "--data", toy_bin, "--line",
                           str(line), "--top-sentences", "3", "--top-words", "4",
                           "--out-dir", out])  # the PNG without --png: always written
    assert set(paths) == {"md", "json", "png"} and all(os.path.isfile(p) for p in paths.values())
    assert _valid_png(paths["png"])
    assert os.path.basename(paths["json"]) == f"selective_sentence_test_{line}.json"
    _check_sentence(res, corpus, online=True)
    assert len(res["top_sentences"]) == 3
    assert all(len(w) <= 4 for w in res["top_words_by_head"])
    assert res["query_tokens"] == corpus[2][line].split() + ["</s>"]
    assert res["checkpoint_setting"]["integration"] == "encoder"
    assert "encoder integration" in res["setting"] and "encoder integration" in md
    assert "| rank | offset | line | mass |" in md and "| head | words |" in md
    top = res["top_sentences"][0]
    assert f"| 1 | {top['offset']:+d} | {top['line']} | {top['mass']:.3f} |" in md
    # the first sentence of a document has no context: still a PNG, saying so
    first, res0, _ = _run(["sentence", "--path", enc_ckpt, "--data", toy_bin, "--line", "0",
                           "--out-dir", out])
    assert not res0["has_context"] and _valid_png(first["png"], min_bytes=1000)


def test_sentence_many_lines_and_first_sentences(enc_ckpt, toy_bin, corpus):
    """Every line of two documents and the first line of every document:
    online offsets, sums, word alignment (queries shorter and longer than
    their memory sentences); the first sentence of a document reports no
    context."""
    from ctx_fairseq.eval.analyses.selective_analysis import (
        format_sentence, load_selective_model, sentence_analysis)

    model, task = load_selective_model(enc_ckpt, toy_bin)
    docids, pos, _, _ = corpus
    two_docs = set(list(dict.fromkeys(docids))[:2])
    lines = [i for i, d in enumerate(docids) if d in two_docs or pos[i] == 0]
    assert len(lines) > 16
    firsts = 0
    for line in lines:
        res = sentence_analysis(model, task, "test", line, top_sentences=3, top_words=5)
        _check_sentence(res, corpus, online=True)
        if pos[line] == 0:
            firsts += 1
            assert not res["has_context"] and res["sentences"] == []
            assert res["top_words_by_head"] == [[] for _ in range(HEADS)]
            assert "no visible context sentence" in format_sentence(res)
    assert firsts == len(set(docids))


def test_sentence_query_token_average(enc_ckpt, toy_bin, corpus):
    """The all-token masses are the mean of the per-token masses."""
    from ctx_fairseq.eval.analyses.selective_analysis import load_selective_model, sentence_analysis

    model, task = load_selective_model(enc_ckpt, toy_bin)
    line = _last_of_first_doc(corpus)
    full = sentence_analysis(model, task, "test", line)
    n = len(full["query_tokens"])
    per_token = [sentence_analysis(model, task, "test", line, query_token=k) for k in range(n)]
    for j, e in enumerate(full["sentences"]):
        mean = sum(r["sentences"][j]["mass"] for r in per_token) / n
        assert abs(mean - e["mass"]) < 1e-9
        assert all(r["sentences"][j]["offset"] == e["offset"] for r in per_token)
    for r in per_token:
        assert r["averaged_over_tokens"] == 1 and abs(sum(e["mass"] for e in r["sentences"])
                                                        - 1) < 1e-5
    with pytest.raises(ValueError, match=f"--query-token {n}: the query has {n} tokens"):
        sentence_analysis(model, task, "test", line, query_token=n)


def test_sentence_decoder_cli(dec_ckpt, toy_bin, corpus, tmp_path):
    line = _last_of_first_doc(corpus) - 1
    paths, res, md = _run(["sentence", "--path", dec_ckpt, "--data", toy_bin, "--line",
                           str(line), "--out-dir", str(tmp_path)])
    _check_sentence(res, corpus, online=True, side="tgt")
    assert _valid_png(paths["png"])
    assert res["checkpoint_setting"]["integration"] == "decoder"
    assert "reference" in res["setting"] and "gold target memory" in md
    # decoder queries: the steps predicting the reference tokens
    assert res["query_tokens"] == corpus[3][line].split() + ["</s>"]
    assert "| rank | offset | line | mass | per head | reference (source) |" in md


def test_flat_sentence_offline(flat_ckpt, toy_bin, corpus, tmp_path):
    from ctx_fairseq.eval.analyses.selective_analysis import load_selective_model, sentence_analysis

    docids, pos, _, _ = corpus
    line = 2
    assert pos[line] == 2
    paths, res, md = _run(["sentence", "--path", flat_ckpt, "--data", toy_bin, "--line",
                           str(line), "--out-dir", str(tmp_path), "--png"])  # --png: a no-op
    _check_sentence(res, corpus, online=False, word_level=False)
    assert _valid_png(paths["png"])  # sentence weights only: no word level
    assert any(e["offset"] > 0 for e in res["sentences"])  # offline: later sentences too
    assert "no word level: sentences only" in md and "| head | words |" not in md
    model, task = load_selective_model(flat_ckpt, toy_bin)
    first = sentence_analysis(model, task, "test", 0)  # offline: the first sentence has context
    _check_sentence(first, corpus, online=False, word_level=False)
    assert first["has_context"] and all(e["offset"] > 0 for e in first["sentences"])


# --------------------------------------------------------------------------- support


def _check_support(res, corpus, online=True, word_level=True):
    docids, pos, _, _ = corpus
    n_doc = {d: docids.count(d) for d in set(docids)}
    visible = [p if online else n_doc[d] - 1 for d, p in zip(docids, pos)]
    with_ctx = [v for v in visible if v > 0]
    assert res["sentences"] == len(docids) and res["sentences_with_context"] == len(with_ctx)
    assert abs(res["mean_visible_sentences_per_sentence"] - sum(with_ctx) / len(with_ctx)) < 1e-9
    assert 1 <= res["mean_sentence_support"] <= res["mean_visible_sentences"] + 1e-9
    assert res["mean_visible_sentences"] <= max(visible)
    hist = {int(k): n for k, n in res["sentence_support_histogram"].items()}
    assert min(hist) >= 1 and max(hist) <= max(visible)
    # the distribution (from the weights) agrees with the module's statistics
    assert sum(hist.values()) == res["token_heads"]
    assert res["token_heads"] == HEADS * res["tokens_with_context"]
    mean_hist = sum(k * n for k, n in hist.items()) / sum(hist.values())
    assert abs(mean_hist - res["mean_sentence_support"]) < 1e-9
    assert 0 < res["mean_support_fraction"] <= res["max_support_fraction"] <= 1 + 1e-12
    if word_level:
        assert res["mean_word_support"] >= 1 and res["support_pairs"] > 0
    else:
        assert res["mean_word_support"] is None
    assert 0 < res["mean_gate"] < 1
    if res["tokens_with_context"] < res["tokens"]:  # tokens without context: gamma = 1
        assert res["mean_gate"] < res["mean_gate_all_tokens"] < 1


def test_support_encoder_cli_and_batching(enc_ckpt, toy_bin, corpus, tmp_path):
    paths, one, md = _run(["support", "--path", enc_ckpt, "--data", toy_bin, "--out-dir",
                           str(tmp_path / "a"), "--png"])
    assert set(paths) == {"md", "json", "png"} and all(os.path.isfile(p) for p in paths.values())
    assert _valid_png(paths["png"])
    assert os.path.basename(paths["json"]) == "selective_support_test.json"
    _check_support(one, corpus)
    assert "| mean sentence support" in md and "| support size | count | share |" in md
    # the same numbers from small batches: counts are weighted across batches
    paths, many, _ = _run(["support", "--path", enc_ckpt, "--data", toy_bin, "--out-dir",
                           str(tmp_path / "b"), "--max-tokens", "250"])
    assert _valid_png(paths["png"])  # without --png too
    assert many["batches"] > one["batches"] == 1
    _check_support(many, corpus)
    for key in ("tokens", "tokens_with_context", "token_heads", "support_pairs",
                "sentence_support_histogram"):
        assert many[key] == one[key], key
    for key in ("mean_sentence_support", "mean_word_support", "mean_visible_sentences",
                "mean_gate", "mean_gate_all_tokens", "mean_support_fraction"):
        assert abs(many[key] - one[key]) < 1e-6, key


def test_support_decoder_and_flat(dec_ckpt, flat_ckpt, toy_bin, corpus, tmp_path):
    _, res, md = _run(["support", "--path", dec_ckpt, "--data", toy_bin, "--out-dir",
                       str(tmp_path)])
    _check_support(res, corpus)
    assert "reference translations (gold)" in res["setting"] and "gold" in md
    _, flat, md = _run(["support", "--path", flat_ckpt, "--data", toy_bin, "--out-dir",
                        str(tmp_path)])
    _check_support(flat, corpus, online=False, word_level=False)
    # flat attention is a softmax: every visible sentence is in the support
    assert abs(flat["mean_sentence_support"] - flat["mean_visible_sentences"]) < 1e-9
    assert flat["max_support_fraction"] == 1


# --------------------------------------------------------------------------- errors


def test_errors(enc_ckpt, toy_bin, tmp_path, capsys):
    from ctx_fairseq.eval.analyses.selective_analysis import cli_main

    def fails(argv, message):
        with pytest.raises(SystemExit) as exc:
            cli_main(argv)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err

    base = ["--data", toy_bin, "--out-dir", str(tmp_path)]
    fails(["sentence", "--path", enc_ckpt, *base, "--line", "48"],
          "line 48 is outside test (48 sentences: 0..47)")
    fails(["sentence", "--path", enc_ckpt, *base, "--line", "-1"], "line -1 is outside test")
    fails(["sentence", "--path", enc_ckpt, *base, "--line", "3", "--split", "nosuch"], "nosuch")
    fails(["sentence", "--path", str(tmp_path / "missing.pt"), *base, "--line", "0"],
          "no such checkpoint file")
    fails(["sentence", "--path", enc_ckpt, *base, "--line", "3", "--query-token", "99"],
          "--query-token 99")
    assert not os.listdir(tmp_path)  # nothing written on an error


def test_console_script_entry_returns_none(enc_ckpt, toy_bin, tmp_path, monkeypatch):
    """``main`` (the console script) returns None: sys.exit would turn the
    dict of paths into exit status 1."""
    from ctx_fairseq.eval.analyses import selective_analysis

    out = tmp_path / "cs"
    monkeypatch.setattr("sys.argv", ["ctx-selective-analysis", "sentence", "--path", enc_ckpt,
                                     "--data", toy_bin, "--line", "1", "--out-dir", str(out)])
    assert selective_analysis.main() is None
    assert sorted(os.listdir(out)) == ["selective_sentence_test_1.json",
                                       "selective_sentence_test_1.md",
                                       "selective_sentence_test_1.png"]


def test_plot_without_context_still_writes_a_png(tmp_path):
    """A split where no token has a visible context sentence (single-sentence
    documents): the support PNG is written and says so."""
    from ctx_fairseq.eval.analyses.selective_analysis import write_outputs

    res = {"split": "test", "sentence_support_histogram": {}, "mean_sentence_support": None,
           "mean_visible_sentences": None, "mean_gate": None}
    paths = write_outputs("empty", "support", res, "table", str(tmp_path))
    assert sorted(paths) == ["json", "md", "png"] and _valid_png(paths["png"], min_bytes=1000)


def test_not_a_selective_checkpoint(toy_bin, tmp_path, capsys):
    from ctx_fairseq.eval.analyses.selective_analysis import cli_main

    ckpt = _train(toy_bin, str(tmp_path / "plain"),
                  ["--task", "document_translation", "--source-context-size", "0", "--arch",
                   "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
                   "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
                   "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16",
                   "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"],
                  max_update=1)
    for cmd in (["sentence", "--line", "0"], ["support"]):
        with pytest.raises(SystemExit):
            cli_main([*cmd, "--path", ckpt, "--data", toy_bin, "--out-dir", str(tmp_path / "o")])
        assert "needs a transformer_selective_doc checkpoint" in capsys.readouterr().err
