"""ctx-probe: probing tasks (Conneau et al. 2018) on a frozen encoder --
the SentEval file reader, the SentLen/WC/BShift generators, the classifier,
the mean-pooled features and the command line end to end."""

import collections
import json
import os

import pytest
import torch

import ctx_fairseq  # noqa: F401
from ctx_fairseq.eval.analyses import probe
from ctx_fairseq.eval.analyses.probe import ProbeError, ProbeSettings
from fairseq_cli_utils import TINY_MODEL_ARGS

# --------------------------------------------------------------------------- helpers


def write(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


GOOD = ["tr\tA\tthe cat sat .", "tr\tB\ta dog ran away .", "tr\tA\tthe cat sat down .",
        "va\tA\tthe bird sang .", "va\tB\ta fish swam .",
        "te\tB\tthe horse ran .", "te\tA\ta cow sat ."]


def in_bin(label, n):
    lo, _, hi = label.partition("-")
    return int(lo) <= n <= int(hi or lo)


@pytest.fixture(scope="module")
def toy_text(toy_corpus):
    """The fixture corpus's source side, 4-8 words a sentence."""
    return probe.read_text([os.path.join(toy_corpus, "train.src")], min_words=4, max_words=28)


# --------------------------------------------------------------------------- probing files


def test_read_probing_file(tmp_path):
    path = write(tmp_path / "my_task.txt", GOOD + [""])  # a blank line is skipped
    task = probe.read_probing_file(path)
    assert task.name == "my_task"
    assert task.sizes() == {"tr": 3, "va": 2, "te": 2}
    assert task.examples["te"][0] == ("B", "the horse ran .", 6)
    assert task.labels("tr") == ["A", "B", "A"]


@pytest.mark.parametrize("lines, message", [
    (GOOD[:3] + ["va\tA"] + GOOD[4:], r"t\.txt:4: expected 3 tab-separated fields .* got 2"),
    (GOOD[:1] + ["tr\tA\tB\tone more"] + GOOD[2:], r"t\.txt:2: expected 3 .* got 4"),
    (GOOD[:2] + ["dev\tA\ta sentence"] + GOOD[3:], r"t\.txt:3: unknown split tag 'dev'"),
    (GOOD[:5] + ["te\tA\t   "] + GOOD[6:], r"t\.txt:6: empty sentence"),
    (GOOD[:1] + ["tr\t \tsome words"] + GOOD[2:], r"t\.txt:2: empty label"),
    ([], r"t\.txt: empty probing file"),
    (["", "  "], r"t\.txt: empty probing file"),
    ([g for g in GOOD if not g.startswith("va")], r"t\.txt: no 'va' examples"),
    ([g for g in GOOD if not g.startswith("te")], r"t\.txt: no 'te' examples"),
    ([g for g in GOOD if not g.startswith("tr")], r"t\.txt: no 'tr' examples"),
    (GOOD[:6] + ["te\tC\tan unseen label ."], r"t\.txt:7: label 'C' of the te split does not"),
    (["tr\tA\tx y", "va\tA\tx z", "te\tA\ty z"], r"t\.txt: the tr split has a single label"),
])
def test_read_probing_file_errors(tmp_path, lines, message):
    path = write(tmp_path / "t.txt", lines)
    with pytest.raises(ProbeError, match=message):
        probe.read_probing_file(path)


def test_collect_task_files(tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    a = write(d / "b_task.txt", GOOD)
    b = write(d / "a_task.txt", GOOD)
    write(d / "notes.json", ["{}"])
    assert probe.collect_task_files([str(d)]) == [b, a]  # sorted, *.txt only
    with pytest.raises(ProbeError, match="two files name the task 'a_task'"):
        probe.collect_task_files([str(d), b])
    with pytest.raises(ProbeError, match="no such file or directory"):
        probe.collect_task_files([str(tmp_path / "missing.txt")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProbeError, match="directory without"):
        probe.collect_task_files([str(tmp_path / "empty")])


# --------------------------------------------------------------------------- generation


def test_sentlen_bins():
    assert probe.sentlen_bins(range(5, 29), 6) == [(5, 8), (9, 12), (13, 16), (17, 20),
                                                  (21, 24), (25, 28)]
    assert probe.sentlen_bins([4, 8, 6], 6) == [(4, 4), (5, 5), (6, 6), (7, 7), (8, 8)]
    bins = probe.sentlen_bins([3, 20], 4)
    assert bins[0][0] == 3 and bins[-1][1] == 20 and len(bins) == 4
    assert all(b[0] == a[1] + 1 for a, b in zip(bins, bins[1:]))  # contiguous


def check_split_properties(gen, n_classes):
    """Balanced in every split; no sentence twice (so none in two splits)."""
    sents = [s for split in probe.SPLITS for _, s in gen.examples[split]]
    assert len(sents) == len(set(sents))
    for split in probe.SPLITS:
        counts = collections.Counter(lab for lab, _ in gen.examples[split])
        assert len(counts) == n_classes and len(set(counts.values())) == 1, (split, counts)


def test_sentlen_labels_match_word_counts(toy_text):
    gen = probe.make_sentlen(toy_text, 6, sizes=(600, 200, 200), min_per_class=20, seed=3)
    lengths = {len(t) for t in toy_text.distinct}
    assert lengths == {4, 5, 6, 7, 8}
    # five lengths for six bins: one bin per length; 8 words (8 sentences) left out
    assert gen.info["bins"] == [[k, k] for k in range(4, 9)]
    assert gen.info["classes"] == ["4", "5", "6", "7"]
    assert any("left out: 8 (8)" in n for n in gen.info["notes"])
    check_split_properties(gen, 4)
    distinct = {" ".join(t) for t in toy_text.distinct}
    for split in probe.SPLITS:
        for label, sent in gen.examples[split]:
            assert in_bin(label, len(sent.split())) and sent in distinct
    # proportions of --sizes: 27 per class (the smallest class), 3:1:1
    assert gen.info["per_class"] == 27
    assert gen.info["sizes"] == {"tr": 4 * 17, "va": 4 * 5, "te": 4 * 5}


def test_generation_is_deterministic(toy_text):
    a = probe.make_sentlen(toy_text, 6, (600, 200, 200), 20, seed=1)
    b = probe.make_sentlen(toy_text, 6, (600, 200, 200), 20, seed=1)
    c = probe.make_sentlen(toy_text, 6, (600, 200, 200), 20, seed=2)
    assert a.lines() == b.lines()
    assert a.lines() != c.lines()
    x = probe.make_bshift(toy_text, (600, 200, 200), 20, seed=1)
    assert x.lines() == probe.make_bshift(toy_text, (600, 200, 200), 20, seed=1).lines()


def one_adjacent_swap(a, b):
    """Index i if b is a with words i and i+1 swapped (and nothing else)."""
    if len(a) != len(b):
        return None
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] \
            and a[diff[1]] == b[diff[0]]:
        return diff[0]
    return None


def test_bshift_is_one_adjacent_swap(toy_text):
    gen = probe.make_bshift(toy_text, (600, 200, 200), 20, seed=1)
    check_split_properties(gen, 2)
    distinct = {" ".join(t) for t in toy_text.distinct}
    n_inverted = 0
    for split in probe.SPLITS:
        for label, sent in gen.examples[split]:
            if label == "O":
                assert sent in distinct
                continue
            assert label == "I" and sent not in distinct
            toks = sent.split()
            origins = [(o, one_adjacent_swap(o.split(), toks)) for o in distinct]
            origins = [(o, i) for o, i in origins if i is not None]
            assert origins, sent
            for o, i in origins:  # never a punctuation token
                assert not probe.is_punct(toks[i]) and not probe.is_punct(toks[i + 1])
            n_inverted += 1
    assert n_inverted == gen.info["sizes"]["tr"] // 2 + gen.info["sizes"]["va"] // 2 \
        + gen.info["sizes"]["te"] // 2


def test_swap_positions_rules():
    attested = {("a", "b", "c", "."), ("b", "a", "c", ".")}
    # 0: swap gives an attested sentence; 2: punctuation; only 1 is left
    assert probe.swap_positions(("a", "b", "c", "."), attested) == [1]
    assert probe.swap_positions(("x", "x", "."), set()) == []  # identical words
    assert probe.swap(("a", "b", "c"), 1) == ("a", "c", "b")


def test_wc_label_word_present_exactly_once(toy_text):
    gen = probe.make_wc(toy_text, n_words=10, rank_start=26, sizes=(600, 200, 200),
                        min_per_class=9, seed=1)
    targets = set(gen.info["words"])
    assert len(targets) == 10
    ranked = [w for w, _ in probe.word_ranks(toy_text)]
    assert gen.info["words"] == ranked[26:36]
    n = len(gen.info["classes"])
    assert n >= 2
    check_split_properties(gen, n)
    for split in probe.SPLITS:
        for label, sent in gen.examples[split]:
            toks = sent.split()
            assert toks.count(label) == 1
            assert [t for t in toks if t in targets] == [label]


def test_wc_refuses_a_small_vocabulary(toy_text):
    with pytest.raises(ProbeError, match=r"WC cannot be built from .*train\.src: it has \d+ "
                                         r"distinct words .* needs 3000"):
        probe.make_wc(toy_text)  # Conneau's ranks 2000-2999
    with pytest.raises(ProbeError, match=r"WC cannot be built .* 0 class\(es\) with at least "
                                         r"--min-per-class 50"):
        probe.make_wc(toy_text, n_words=10, rank_start=26, min_per_class=50)


def test_generation_errors(tmp_path):
    same = probe.read_text([write(tmp_path / "same.txt", ["a b c d e ."] * 3 + ["x y z w v ."])])
    with pytest.raises(ProbeError, match="SentLen cannot be built .* every sentence has 6 words"):
        probe.make_sentlen(same)
    with pytest.raises(ProbeError, match="BShift cannot be built"):
        probe.make_bshift(same)
    with pytest.raises(ProbeError, match="empty text"):
        probe.read_text([write(tmp_path / "empty.txt", ["", " "])])
    with pytest.raises(ProbeError, match="none of its 1 sentences has 5-28 words"):
        probe.read_text([write(tmp_path / "short.txt", ["too short ."])])


def test_cli_generate(toy_corpus, tmp_path, capsys):
    out = tmp_path / "gen"
    text = os.path.join(toy_corpus, "train.src")
    opts = ["--text", text, "--min-words", "4", "--min-per-class", "20",
            "--sizes", "600,200,200"]
    # WC with Conneau's ranks cannot be built: an error and nothing written
    with pytest.raises(SystemExit, match="ctx-probe generate: error: WC cannot be built.*nothing "
                                         "written"):
        probe.cli_main(["generate", *opts, "--out-dir", str(out)])
    assert not out.exists()
    probe.cli_main(["generate", *opts, "--out-dir", str(out), "--tasks", "sentlen,bshift",
                    "--seed", "2"])
    assert "one bin per length" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["bigram_shift.txt", "probe_data.json",
                                       "sentence_length.txt"]
    manifest = json.load(open(out / "probe_data.json"))
    assert manifest["seed"] == 2 and set(manifest["tasks"]) == {"sentlen", "bshift"}
    task = probe.read_probing_file(str(out / "sentence_length.txt"))  # round trip
    assert task.sizes() == manifest["tasks"]["sentlen"]["sizes"]
    splits = [line.split("\t")[0] for line in open(out / "bigram_shift.txt")]
    assert splits == sorted(splits, key=probe.SPLITS.index)  # ordered tr, va, te
    with pytest.raises(SystemExit):
        probe.cli_main(["generate", "--text", text, "--out-dir", str(out), "--tasks", "tdep"])
    with pytest.raises(SystemExit):
        probe.cli_main(["generate", "--text", text, "--out-dir", str(out), "--sizes", "10,0,1"])


# --------------------------------------------------------------------------- classifier


def blobs(n_per_class, dim=8, n_classes=3, seed=0, spread=1.0):
    centers = torch.randn(n_classes, dim, generator=torch.Generator().manual_seed(123)) * 2
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n_classes).repeat_interleave(n_per_class)
    x = centers[y] + spread * torch.randn(len(y), dim, generator=g)
    return x, y


def blob_splits(seed=0):
    feats, labels = {}, {}
    for k, (split, n) in enumerate([("tr", 60), ("va", 20), ("te", 20)]):
        feats[split], labels[split] = blobs(n, seed=seed * 10 + k)
    return feats, labels


def test_classifier_is_deterministic_and_learns():
    feats, labels = blob_splits()
    s = ProbeSettings(lr=1e-2, max_epochs=30, patience=10, seed=5)
    a = probe.train_probe(feats, labels, 3, s)
    b = probe.train_probe(feats, labels, 3, s)
    assert a["accuracy"] == b["accuracy"] and a["valid_history"] == b["valid_history"]
    for k, v in a["model"].state_dict().items():
        assert torch.equal(v, b["model"].state_dict()[k])
    c = probe.train_probe(feats, labels, 3, ProbeSettings(lr=1e-2, max_epochs=30, patience=10,
                                                          seed=6))
    assert not torch.equal(c["model"].hidden.weight, a["model"].hidden.weight)
    assert a["accuracy"] > 0.8  # separable blobs; majority is 1/3
    state = torch.random.get_rng_state()
    probe.train_probe(feats, labels, 3, s)
    assert torch.equal(state, torch.random.get_rng_state())  # global RNG untouched


def test_classifier_architecture_and_l2():
    m = probe.ProbeClassifier(16, 4, hidden=50, dropout=0.1)
    assert [type(x).__name__ for x in m.children()] == ["Linear", "Dropout", "Linear"]
    assert m.hidden.weight.shape == (50, 16) and m.out.weight.shape == (4, 50)
    assert m.regularized_weight() is m.hidden.weight
    lr = probe.ProbeClassifier(16, 4, hidden=0)
    assert lr.hidden is None and lr.regularized_weight() is lr.out.weight
    # sigmoid hidden units: outputs are an affine map of values in (0, 1)
    x = torch.randn(3, 16)
    h = torch.sigmoid(m.hidden(x))
    m.eval()
    assert torch.allclose(m(x), m.out(h))
    # weight decay hits the hidden layer's weights only
    feats, labels = blob_splits()
    base = dict(lr=1e-2, max_epochs=10, patience=10, seed=1)
    plain = probe.train_probe(feats, labels, 3, ProbeSettings(l2=0.0, **base))["model"]
    decay = probe.train_probe(feats, labels, 3, ProbeSettings(l2=1.0, **base))["model"]
    assert decay.hidden.weight.norm() < 0.5 * plain.hidden.weight.norm()
    assert decay.out.weight.norm() > 0.5 * plain.out.weight.norm()


def test_early_stopping_keeps_the_best_valid_epoch():
    feats, labels = blob_splits()
    labels["va"] = labels["va"][torch.randperm(len(labels["va"]),
                                               generator=torch.Generator().manual_seed(0))]
    res = probe.train_probe(feats, labels, 3, ProbeSettings(lr=1e-2, max_epochs=200,
                                                            patience=3, seed=1))
    hist = res["valid_history"]
    assert res["epochs"] == len(hist) < 200
    assert res["best_epoch"] == hist.index(max(hist)) + 1
    assert res["epochs"] - res["best_epoch"] == 3  # stopped after 3 epochs without a better one
    assert res["valid_accuracy"] == max(hist)
    with pytest.raises(ProbeError):
        probe.train_probe(feats, labels, 3, ProbeSettings(patience=0))


def test_majority_baseline():
    assert probe.majority_baseline(["a", "b", "b"], ["b", "a", "b", "c"]) == ("b", 0.5)
    assert probe.majority_baseline(["b", "a"], ["a", "a", "b"]) == ("a", pytest.approx(2 / 3))


# --------------------------------------------------------------------------- features


def build_model(toy_bin, arch):
    from fairseq import options, tasks

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [toy_bin, "--arch", arch, "--task", "translation", *TINY_MODEL_ARGS,
         "--share-all-embeddings"])
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    return task.build_model(args).eval(), task


@pytest.mark.parametrize("arch", ["transformer", "transformer_dc", "transformer_hybrid"])
def test_features_are_the_mean_over_non_pad_positions(toy_bin, arch):
    from ctx_fairseq.eval.text_units import TextEncoder

    model, task = build_model(toy_bin, arch)
    enc = TextEncoder(task.source_dictionary)
    sents = ["we saw the red tree .", "it sleeps .", "there is a big dog here today ."]
    where = [f"f:{i}" for i in range(3)]
    batched = probe.sentence_features(model.encoder, enc, sents, where, left_pad=True)
    assert batched.shape == (3, 32)
    with torch.no_grad():
        for i, s in enumerate(sents):  # one at a time, no padding: all positions, </s> too
            ids = enc.encode(s).unsqueeze(0)
            out = model.encoder(ids, src_lengths=torch.tensor([ids.numel()]))
            assert out["encoder_out"][0].shape[0] == len(s.split()) + 1
            mean = out["encoder_out"][0].mean(0)[0]
            assert torch.allclose(batched[i], mean, atol=1e-5), arch
    right = probe.sentence_features(model.encoder, enc, sents, where, left_pad=False)
    assert torch.allclose(right, batched, atol=1e-5)
    assert enc.unknown_rate() == 0.0
    probe.sentence_features(model.encoder, enc, ["we saw the zebra ."], ["f:9"])
    assert enc.unknown > 0  # "zebra" is not in the toy dictionary
    with pytest.raises(ProbeError, match=r"probe\.txt:7: \d+ tokens .* at most"):
        probe.sentence_features(model.encoder, enc, ["we " * 2000], ["probe.txt:7"])


# --------------------------------------------------------------------------- end to end


def test_cli_run_end_to_end(toy_corpus, toy_bin, sentence_ckpt, tmp_path, capsys):
    gen = tmp_path / "gen"
    probe.cli_main(["generate", "--text", os.path.join(toy_corpus, "train.src"),
                    "--out-dir", str(gen), "--tasks", "sentlen,bshift", "--min-words", "4",
                    "--min-per-class", "20", "--sizes", "600,200,200"])
    out = tmp_path / "out"
    run = ["run", "--path", sentence_ckpt, "--data", toy_bin, "--task-file", str(gen),
           "--out-dir", str(out), "--seed", "1"]
    assert probe.cli_main(run) is None  # the console script: sys.exit(None) is exit 0
    printed = capsys.readouterr()
    assert "| sentence_length | 4 |" in printed.out and "| bigram_shift | 2 |" in printed.out
    assert "DEBUG:matplotlib" not in printed.err
    assert sorted(os.listdir(out)) == ["probe.json", "probe.md", "probe.png"]
    saved = json.load(open(out / "probe.json"))
    res = probe.main(run + ["--out-dir", str(tmp_path / "main")])["result"]
    assert res["tasks"] == saved["tasks"]  # deterministic for --seed
    assert [t["task"] for t in saved["tasks"]] == ["bigram_shift", "sentence_length"]
    assert saved["settings"] == {"hidden": 50, "dropout": 0.0, "l2": 1e-4, "lr": 2.5e-4,
                                 "batch_size": 64, "max_epochs": 100, "patience": 20,
                                 "seed": 1}
    sl = {t["task"]: t for t in res["tasks"]}["sentence_length"]
    assert sl["n"] == {"tr": 68, "va": 20, "te": 20} and sl["classes"] == 4
    assert sl["majority_accuracy"] == pytest.approx(0.25)  # balanced
    assert sl["accuracy"] >= sl["majority_accuracy"] + 0.25
    assert sl["unknown_rate"] == 0.0 and sl["feature_dim"] == 32
    assert len(sl["valid_history"]) == sl["epochs"]
    # the untrained control runs on the same files
    rand = probe.main(run + ["--random-init", "--out-dir", str(tmp_path / "rand")])
    assert rand["result"]["random_init"] is True
    assert os.path.exists(tmp_path / "rand" / "probe.png")


def test_cli_run_errors(toy_bin, sentence_ckpt, tmp_path):
    bad = write(tmp_path / "bad.txt", GOOD[:2] + ["xx\tA\tsome words"] + GOOD[3:])
    base = ["run", "--data", toy_bin, "--out-dir", str(tmp_path / "o")]
    with pytest.raises(SystemExit, match=r"ctx-probe run: error: .*bad\.txt:3: unknown split tag"):
        probe.cli_main(base + ["--path", sentence_ckpt, "--task-file", bad])
    good = write(tmp_path / "good.txt", GOOD)
    with pytest.raises(SystemExit, match="no such checkpoint"):
        probe.cli_main(base + ["--path", str(tmp_path / "none.pt"), "--task-file", good])
    with pytest.raises(SystemExit, match="--data .*no such directory"):
        probe.cli_main(["run", "--data", str(tmp_path / "nobin"), "--path", sentence_ckpt,
                        "--task-file", good])
    with pytest.raises(SystemExit, match="must be >= 1"):
        probe.cli_main(base + ["--path", sentence_ckpt, "--task-file", good, "--patience", "0"])
    with pytest.raises(SystemExit, match="--bpe-codes"):
        probe.cli_main(base + ["--path", sentence_ckpt, "--task-file", good,
                               "--bpe", "subword_nmt"])
    with pytest.raises(SystemExit):  # no subcommand
        probe.cli_main(["--path", sentence_ckpt])


def test_document_level_checkpoint_is_refused(toy_bin, selective_dec_ckpt, tmp_path):
    good = write(tmp_path / "good.txt", GOOD)
    with pytest.raises(SystemExit, match="document-level checkpoint .*mem_src_tokens.*single "
                                         "sentences without documents"):
        probe.cli_main(["run", "--path", selective_dec_ckpt, "--data", toy_bin,
                        "--task-file", good, "--out-dir", str(tmp_path / "o")])


# --------------------------------------------------------------------------- acceptance (slow)


def write_noun_gender(text_path, out_path):
    """A SentEval-format diagnostic: the target-language gender of the toy
    corpus's entity noun, with *held-out nouns* (4 nouns a gender in tr, one
    in va, one in te): only an encoder that learnt gender from translating can
    generalise to the te nouns."""
    from ctx_fairseq.data.toy_corpus import ENTITY_NOUNS

    split_of, seen = {}, collections.Counter()
    for noun, (_, gender) in sorted(ENTITY_NOUNS.items()):
        k = seen[gender]
        seen[gender] += 1
        split_of[noun] = "tr" if k < 4 else ("va" if k == 4 else "te")
    lines = {s: [] for s in probe.SPLITS}
    for sent in sorted({line.strip() for line in open(text_path) if line.strip()}):
        hits = [w for w in sent.split() if w in ENTITY_NOUNS]
        if len(hits) == 1:
            split = split_of[hits[0]]
            lines[split].append(f"{split}\t{ENTITY_NOUNS[hits[0]][1]}\t{sent}")
    return write(out_path, [line for s in probe.SPLITS for line in lines[s]])


@pytest.mark.slow
def test_acceptance_trained_encoder_on_the_toy_corpus(tmp_path):
    """Trains a small transformer on the toy corpus (~1 minute), then probes
    it and a randomly initialised encoder of the same shape."""
    from ctx_fairseq.data.toy_corpus import make_toy_corpus
    from fairseq_cli_utils import preprocess, train

    raw, binned, save = (str(tmp_path / d) for d in ("raw", "bin", "ckpt"))
    make_toy_corpus(raw, docs=1000, seed=1)
    preprocess(["--source-lang", "src", "--target-lang", "tgt",
                "--trainpref", os.path.join(raw, "train"), "--validpref",
                os.path.join(raw, "valid"), "--destdir", binned, "--joined-dictionary",
                "--workers", "1"])
    train([binned, "--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "2",
           "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
           "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
           "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
           "--share-all-embeddings", "--optimizer", "adam", "--lr", "2e-3",
           "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
           "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
           "--max-tokens", "4096", "--max-update", "300", "--save-dir", save,
           "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
           "--disable-validation", "--data-buffer-size", "0"])
    ckpt = os.path.join(save, "checkpoint_last.pt")
    gen = tmp_path / "gen"
    text = os.path.join(raw, "train.src")
    probe.cli_main(["generate", "--text", text, "--out-dir", str(gen), "--tasks", "sentlen",
                    "--min-words", "4", "--sizes", "60000,20000,20000"])
    write_noun_gender(text, gen / "noun_gender.txt")
    res = {}
    for init in ("trained", "random"):
        argv = ["run", "--path", ckpt, "--data", binned, "--task-file", str(gen),
                "--out-dir", str(tmp_path / init)] + (["--random-init"] if init == "random"
                                                      else [])
        res[init] = {t["task"]: t for t in probe.main(argv)["result"]["tasks"]}
    sl = res["trained"]["sentence_length"]
    assert sl["accuracy"] > sl["majority_accuracy"] + 0.3
    g_tr, g_rand = res["trained"]["noun_gender"], res["random"]["noun_gender"]
    assert g_tr["accuracy"] > g_tr["majority_accuracy"] + 0.2
    assert g_tr["accuracy"] > g_rand["accuracy"] + 0.2
