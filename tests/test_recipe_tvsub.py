"""recipes/tvsub_zh_en and ctx_fairseq.prep.tvsub: the TVsub layout read
as documents (episodes, SGML refsets with every reference), the bad inputs
(each an error naming the file and the counts, nothing written), the
multi-reference scorer against sacreBLEU, and the recipe's smoke mode end to
end on tiny synthetic episodes written here in the repository's layout
(tests never read ../shared)."""

import json
import os
import random
import re
import subprocess
import sys

import pytest

from ctx_fairseq.prep import tvsub as pt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "tvsub_zh_en", "run.sh")

# a toy "Chinese" (numbered words) and its English; a dropped subject pronoun
# in the source whose English depends on the previous sentence's speaker word
ZH = [f"词{i}" for i in range(24)]
EN = [f"w{i}" for i in range(24)]


def _sentences(rng, n):
    out = []
    subject = "he"
    for _ in range(n):
        k = rng.randint(2, 6)
        idx = [rng.randrange(len(ZH)) for _ in range(k)]
        zh = " ".join(ZH[i] for i in idx)
        en = " ".join(EN[i] for i in idx)
        if rng.random() < 0.5:  # the pronoun is dropped in the Chinese
            en = f"{subject} {en}"
        else:
            subject = rng.choice(["he", "she"])
            zh = ("他 " if subject == "he" else "她 ") + zh
            en = f"{subject} {en}"
        if rng.random() < 0.3:
            en += " don &apos;t ."
            zh += " 不 。"
        out.append((zh, en))
    return out


def _sgm(path, setid, docs_by_ref):
    """docs_by_ref: {sysid: [(docid, [text, ...]), ...]} -> an SGML refset."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'<refset setid="{setid}" srclang="Chinese" trglang="English">\n')
        for sysid, docs in docs_by_ref.items():
            for docid, segs in docs:
                f.write(f'<DOC docid="{docid}" sysid="{sysid}">\n')
                for i, t in enumerate(segs, 1):
                    f.write(f"<p>\n<seg id={i}> {t}</seg>\n</p>\n")
                f.write("</DOC>\n")
        f.write("</refset>\n")


def _dp_line(zh, en):
    """The +DP line of a pair: the dropped subject pronoun restored (the
    English opens with he/she, the Chinese has no pronoun)."""
    first = en.split()[0]
    if first in ("he", "she") and not zh.startswith(("他", "她")):
        return ("他 " if first == "he" else "她 ") + zh
    return zh


def write_tvsub(root, episodes=12, lines=30, dev=(9, 12), test=(10, 8), test_refs=3, seed=0,
                dp=False):
    """A tiny corpus in the TVsub repository's layout under ROOT: training
    episodes 0..episodes-1 (tokenized and raw files), dev (two documents, one
    reference, sysid E01) and, with test_refs > 0, test (two documents,
    test_refs references reference_1...). ``dp``: also each split's
    ``{split}_oracle_dp_src``, the dropped subject pronouns restored."""
    rng = random.Random(seed)
    tr = os.path.join(root, "data", "orignal", "train", "separated")
    os.makedirs(tr, exist_ok=True)
    for n in range(episodes):
        pairs = _sentences(rng, lines)
        for suffix, side in ((pt.ZH_SUFFIX, 0), (pt.EN_SUFFIX, 1), (".zh", 0), (".en", 1)):
            # the raw Chinese is unsegmented
            text = [p[side].replace(" ", "") if suffix == ".zh" else p[side] for p in pairs]
            with open(os.path.join(tr, f"{n}{suffix}"), "w", encoding="utf-8") as f:
                f.write("".join(t + "\n" for t in text))
    splits = [("dev", dev, 1, "E01")]
    if test_refs:
        splits.append(("test", test, test_refs, None))
    for split, sizes, nrefs, sysid in splits:
        d = os.path.join(root, "data", "processed", split)
        os.makedirs(d, exist_ok=True)
        docs = [(f"SUB0{i + 1}", _sentences(rng, k)) for i, k in enumerate(sizes)]
        with open(os.path.join(d, f"{split}_src"), "w", encoding="utf-8") as f:
            f.write("".join(zh + "\n" for _, p in docs for zh, _ in p))
        if dp:
            with open(os.path.join(d, f"{split}_oracle_dp_src"), "w", encoding="utf-8") as f:
                f.write("".join(_dp_line(zh, en) + "\n" for _, p in docs for zh, en in p))
        refs = {}
        for r in range(nrefs):
            name = sysid or f"reference_{r + 1}"
            refs[name] = [(docid, [en if r == 0 else f"{en} r{r}" for _, en in p])
                          for docid, p in docs]
        # every reference of a document, then the next document (as the corpus)
        by_doc = {}
        for name, ds in refs.items():
            for docid, segs in ds:
                by_doc.setdefault(docid, []).append((name, segs))
        with open(os.path.join(d, f"{split}_trg.sgm"), "w", encoding="utf-8") as f:
            f.write(f'<refset setid="sub{split}_eval" srclang="Chinese" trglang="English">\n')
            for docid, rs in by_doc.items():
                for name, segs in rs:
                    f.write(f'<DOC docid="{docid}" sysid="{name}">\n')
                    f.write("".join(f"<p>\n<seg id={i}> {t}</seg>\n</p>\n"
                                    for i, t in enumerate(segs, 1)))
                    f.write("</DOC>\n")
            f.write("</refset>\n")
    return root


def _prep(root, out, **kw):
    return pt.prepare(str(root), str(out), **kw)


# ----------------------------------------------------------------------------- reading

def test_prepare_documents_and_references(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"))
    s = _prep(root, tmp_path / "docs")
    d = tmp_path / "docs"
    assert s["eval_split"] == "test"
    assert s["train"]["documents"] == 12 and s["train"]["sentences"] == 360
    assert s["valid"]["references"] == 1 and s["test"]["references"] == 3
    assert s["test"]["sysids"] == ["reference_1", "reference_2", "reference_3"]
    assert s["test"]["documents"] == ["test-SUB01", "test-SUB02"]
    docids = (d / "train.docids").read_text().split()
    assert docids[0] == "ep-0" and docids[-1] == "ep-11" and len(docids) == 360
    assert (d / "test.docids").read_text().split() == ["test-SUB01"] * 10 + ["test-SUB02"] * 8
    assert (d / "valid.docids").read_text().split() == ["dev-SUB01"] * 9 + ["dev-SUB02"] * 12
    ref0 = (d / "test.ref0.en").read_text().splitlines()
    ref2 = (d / "test.ref2.en").read_text().splitlines()
    assert (d / "test.en").read_text().splitlines() == ref0
    assert [r + " r2" for r in ref0] == ref2
    # entities kept as they are (the training English's units), seg's leading space gone
    assert any("&apos;" in r for r in ref0) and not any(r.startswith(" ") for r in ref0)
    assert s["test"]["reference_units"][0]["raw_quote_or_apostrophe"] == 0
    # training text as given, episode order
    tr = tmp_path / "tvsub" / "data" / "orignal" / "train" / "separated"
    assert (d / "train.zh").read_text().splitlines()[:30] == \
        (tr / f"0{pt.ZH_SUFFIX}").read_text().splitlines()
    assert not (tmp_path / "docs.part").exists()


def test_no_test_set_splits_dev_into_its_episodes(tmp_path):
    """Without a test set, dev's first episode chooses the checkpoint (valid)
    and the others are reported (test): no sentence in both (issue 38)."""
    root = write_tvsub(str(tmp_path / "tvsub"), test_refs=0)
    s = _prep(root, tmp_path / "docs", first=2, count=3)
    d = tmp_path / "docs"
    assert s["eval_split"] == "dev-episodes" and s["test"]["from"] == "dev"
    assert not s["reported_on_chosen_set"]
    assert (d / "valid.docids").read_text().split() == ["dev-SUB01"] * 9
    assert (d / "test.docids").read_text().split() == ["dev-SUB02"] * 12
    dev_src = (tmp_path / "tvsub" / "data" / "processed" / "dev" / "dev_src").read_text().splitlines()
    assert (d / "valid.zh").read_text().splitlines() == dev_src[:9]
    assert (d / "test.zh").read_text().splitlines() == dev_src[9:]
    assert (d / "test.ref0.en").read_text() == (d / "test.en").read_text()
    assert s["valid"]["sentences"] == 9 and s["test"]["sentences"] == 12
    assert (d / "train.docids").read_text().split()[0] == "ep-2"
    assert s["train"]["documents"] == 3
    # dev as both (asked for): said so
    s = _prep(root, tmp_path / "docs3", eval_split="dev")
    assert s["eval_split"] == "dev" and s["reported_on_chosen_set"]
    assert (tmp_path / "docs3" / "test.zh").read_text() == (tmp_path / "docs3" / "valid.zh").read_text()
    assert "not a held-out figure" in pt.eval_split_note(s)
    with pytest.raises(pt.TvsubError, match="no test set"):
        _prep(root, tmp_path / "docs2", eval_split="test")
    assert not (tmp_path / "docs2").exists()


def test_dev_of_one_episode_cannot_be_split(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), test_refs=0, dev=(9,))
    with pytest.raises(pt.TvsubError, match="dev has 1 document"):
        _prep(root, tmp_path / "docs")
    assert not (tmp_path / "docs").exists()
    assert _prep(root, tmp_path / "docs", eval_split="dev")["eval_split"] == "dev"


def test_dp_source_is_copied_per_split(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), test_refs=0)
    dev = tmp_path / "tvsub" / "data" / "processed" / "dev"
    src = (dev / "dev_src").read_text().splitlines()
    dp = [f"我 {z}" for z in src]
    (dev / "dev_oracle_dp_src").write_text("".join(x + "\n" for x in dp))
    s = _prep(root, tmp_path / "docs")
    assert (tmp_path / "docs" / "valid.dp.zh").read_text().splitlines() == dp[:9]
    assert (tmp_path / "docs" / "test.dp.zh").read_text().splitlines() == dp[9:]
    assert s["test"]["dp_source"].endswith("dev_oracle_dp_src")
    (dev / "dev_oracle_dp_src").write_text("".join(x + "\n" for x in dp[:-1]))
    with pytest.raises(pt.TvsubError, match=r"dev_oracle_dp_src has 20 lines but its source has 21"):
        _prep(root, tmp_path / "docs2")
    assert not (tmp_path / "docs2").exists()


def test_cli_prints_the_split(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), test_refs=0, episodes=3)
    r = subprocess.run(["python", "-c", "import sys; from ctx_fairseq.prep.tvsub import main;"
                        " main(sys.argv[1:])", "prep", "--raw", root, "--out",
                        str(tmp_path / "docs")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert ("evaluating on the dev set's dev-SUB02 (the input has no test set); checkpoints "
            "chosen on dev-SUB01") in r.stdout


# ----------------------------------------------------------------------------- bad input

def _expect_error(root, out, match, **kw):
    with pytest.raises(pt.TvsubError, match=match):
        _prep(root, out, **kw)
    assert not os.path.exists(out) and not os.path.exists(str(out) + ".part")


def _edit(path, fn):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(fn(text))


def test_episode_files_differ_in_line_count(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=4)
    en = os.path.join(root, pt.TRAIN_DIR, f"2{pt.EN_SUFFIX}")
    _edit(en, lambda t: t + "one more line\n")
    _expect_error(root, str(tmp_path / "out"),
                  rf"episode 2: its files differ in line count: .*2\{pt.ZH_SUFFIX} has 30, "
                  rf".*2\{pt.EN_SUFFIX} has 31")
    # the raw files are checked too
    root2 = write_tvsub(str(tmp_path / "tvsub2"), episodes=4)
    _edit(os.path.join(root2, pt.TRAIN_DIR, "1.zh"), lambda t: t.split("\n", 1)[1])
    _expect_error(root2, str(tmp_path / "out"), r"episode 1: .*1\.zh has 29")


def test_episode_without_its_pair_and_gaps(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=4)
    os.remove(os.path.join(root, pt.TRAIN_DIR, f"3{pt.ZH_SUFFIX}"))
    _expect_error(root, str(tmp_path / "out"), rf"1 episode\(s\) without \{pt.ZH_SUFFIX} "
                                               rf"\(first: 3\{pt.ZH_SUFFIX}\)")
    root = write_tvsub(str(tmp_path / "tvsub2"), episodes=4)
    for s in (pt.ZH_SUFFIX, pt.EN_SUFFIX):
        os.remove(os.path.join(root, pt.TRAIN_DIR, f"1{s}"))
    _expect_error(root, str(tmp_path / "out"), "episode 1 is missing")
    _expect_error(root, str(tmp_path / "out"), r"2 episodes from 2 on; 5 asked for",
                  first=2, count=5)


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.replace("<seg id=3>", "<seg id=4>", 1), r"seg id 4 repeated \(10 segs, 9 distinct"),
    (lambda t: t.replace("<seg id=10>", "<seg id=12>", 1), r"seg id 10 missing \(10 segs, ids 1\.\.12\)"),
    (lambda t: t.replace("<seg id=2>", "<seg id=x>", 1), "seg id 'x' is not a number"),
])
def test_refset_seg_ids(tmp_path, edit, match):
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=2)
    sgm = os.path.join(root, "data", "processed", "test", "test_trg.sgm")
    _edit(sgm, edit)
    _expect_error(root, str(tmp_path / "out"), re.escape(sgm) + r":\d+: DOC SUB01 .*" + match
                  if "not a number" not in match else re.escape(sgm) + r":\d+: " + match)


def test_refset_missing_seg(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=2)
    sgm = os.path.join(root, "data", "processed", "dev", "dev_trg.sgm")
    _edit(sgm, lambda t: t.replace("<p>\n<seg id=4>", "<p>\n<segx id=4>", 1))
    # SUB01 of dev now has ids 1-3, 5-9: 4 is missing
    _expect_error(root, str(tmp_path / "out"),
                  re.escape(sgm) + r":\d+: DOC SUB01 \(sysid E01\): seg id 4 missing \(8 segs, ids 1\.\.9\)")


def test_references_of_different_lengths(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=2)
    sgm = os.path.join(root, "data", "processed", "test", "test_trg.sgm")

    def drop_last_seg_of_ref2_sub02(t):
        head, sep, tail = t.partition('<DOC docid="SUB02" sysid="reference_2">')
        body, end, rest = tail.partition("</DOC>")
        body = body[:body.rindex("<p>\n<seg id=8>")]
        return head + sep + body + end + rest
    _edit(sgm, drop_last_seg_of_ref2_sub02)
    _expect_error(root, str(tmp_path / "out"),
                  re.escape(sgm) + ": DOC SUB02: reference reference_2 has 7 sentences, "
                  "reference reference_1 has 8")


def test_references_with_other_documents(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=2)
    sgm = os.path.join(root, "data", "processed", "test", "test_trg.sgm")
    _edit(sgm, lambda t: t.replace('docid="SUB02" sysid="reference_3"', 'docid="SUB03" sysid="reference_3"'))
    _expect_error(root, str(tmp_path / "out"), "reference reference_3 has documents SUB01, SUB03")


def test_source_without_references_and_counts(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=2)
    d = os.path.join(root, "data", "processed", "test")
    os.rename(os.path.join(d, "test_trg.sgm"), os.path.join(d, "elsewhere.sgm"))
    _expect_error(root, str(tmp_path / "out"),
                  re.escape(os.path.join(d, "test_src")) + ": a source without its references")
    os.rename(os.path.join(d, "elsewhere.sgm"), os.path.join(d, "test_trg.sgm"))
    os.rename(os.path.join(d, "test_src"), os.path.join(d, "test_auto_dp_src"))
    _expect_error(root, str(tmp_path / "out"), "references without their source .*test_auto_dp_src")
    # the +DP source named explicitly is read
    s = _prep(root, tmp_path / "ok", test_src="test_auto_dp_src")
    assert s["test"]["source"].endswith("test_auto_dp_src")
    _edit(os.path.join(d, "test_auto_dp_src"), lambda t: t + "多 一 行\n")
    _expect_error(root, str(tmp_path / "out"), r"test_auto_dp_src has 19 lines but .*test_trg\.sgm "
                  r"has 18 sentences per reference \(3 references; documents SUB01 10, SUB02 8\)",
                  test_src="test_auto_dp_src")


def test_failed_prepare_keeps_the_old_output(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=2)
    out = tmp_path / "docs"
    _prep(root, out)
    before = {p: (out / p).read_bytes() for p in os.listdir(out)}
    _edit(os.path.join(root, pt.TRAIN_DIR, f"0{pt.EN_SUFFIX}"), lambda t: t + "x\n")
    with pytest.raises(pt.TvsubError):
        _prep(root, out)
    assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before


# ----------------------------------------------------------------------------- scoring

def _gen_file(path, hyps):
    with open(path, "w", encoding="utf-8") as f:
        for i, h in enumerate(hyps):
            f.write(f"S-{i}\tsrc {i}\nH-{i}\t-0.5\t{h}\nD-{i}\t-0.5\t{h}\n")


def test_score_multi_reference_equals_sacrebleu(tmp_path):
    import sacrebleu

    root = write_tvsub(str(tmp_path / "tvsub"), episodes=2)
    d = tmp_path / "docs"
    _prep(root, d)
    refs = [(d / f"test.ref{k}.en").read_text().splitlines() for k in range(3)]
    rng = random.Random(1)
    hyps = [" ".join(w for w in r.split() if rng.random() < 0.8) for r in refs[1]]
    _gen_file(tmp_path / "gen.txt", hyps)
    res = pt.score(str(tmp_path / "gen.txt"), str(d / "test.ref"), str(d / "test.docids"))
    want = sacrebleu.corpus_bleu(hyps, refs, tokenize="none").score
    assert res["sentence_level"]["all_references"]["bleu"] == pytest.approx(want, abs=0.005)
    one = sacrebleu.corpus_bleu(hyps, refs[:1], tokenize="none").score
    assert res["sentence_level"]["first_reference"]["bleu"] == pytest.approx(one, abs=0.005)
    assert "nrefs:3" in res["sentence_level"]["all_references"]["signature"]
    assert "tok:none" in res["sentence_level"]["all_references"]["signature"]
    docs = (d / "test.docids").read_text().split()
    j = lambda xs: [" ".join(x for x, dd in zip(xs, docs) if dd == k) for k in ("test-SUB01", "test-SUB02")]
    dwant = sacrebleu.corpus_bleu(j(hyps), [j(r) for r in refs], tokenize="none").score
    assert res["document_level"]["all_references"]["bleu"] == pytest.approx(dwant, abs=0.005)
    assert res["references"] == 3 and res["documents"] == 2
    # a missing hypothesis is an error naming the file
    _gen_file(tmp_path / "short.txt", hyps[:-1])
    with pytest.raises(pt.TvsubError, match=r"short\.txt: 17 hypotheses for the 18 sentences"):
        pt.score(str(tmp_path / "short.txt"), str(d / "test.ref"), str(d / "test.docids"))


# ----------------------------------------------------------------------------- recipe

def run(args, env=None, timeout=1800):
    return subprocess.run(["bash", RECIPE, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=dict(os.environ, **(env or {})))


def test_bash_syntax_help_and_options(tmp_path):
    assert subprocess.run(["bash", "-n", RECIPE]).returncode == 0
    r = run(["--help"])
    assert r.returncode == 0 and "TVsub zh-en documents" in r.stdout and "--study" in r.stdout
    r = run(["--smoke", "--workdir", str(tmp_path / "w")])
    assert r.returncode == 1 and "give the sample with --raw DIR" in r.stderr
    r = run(["--smoke", "--study", "--workdir", str(tmp_path / "w")])
    assert r.returncode == 1 and "--smoke and --study exclude each other" in r.stderr
    # the removed word-level capacity: asked for, the run stops (nothing written)
    r = run(["--smoke", "--raw", str(tmp_path), "--workdir", str(tmp_path / "c")],
            env={"WORD_CAPACITY": "32"})
    assert r.returncode == 1 and "--doc-word-capacity was removed" in r.stderr, r.stderr
    assert not (tmp_path / "c").exists()
    r = run(["--smoke", "--raw", str(tmp_path), "--workdir", str(tmp_path / "w")],
            env={"MODELS": "transformer nope"})
    assert r.returncode == 1 and "MODELS: unknown model nope" in r.stderr
    for env, msg in (({"MEMORY_WINDOW": "x"}, "MEMORY_WINDOW=x: expected a number"),
                     ({"MEMORY_WINDOW": "0", "SAMPLE_CONTEXT": "1"}, "MEMORY_WINDOW=0: expected"),
                     ({"MEMORY_WINDOW": "4"}, "MEMORY_WINDOW goes with SAMPLE_CONTEXT=1")):
        r = run(["--smoke", "--raw", str(tmp_path), "--workdir", str(tmp_path / "m")], env=env)
        assert r.returncode == 1 and msg in r.stderr, (env, r.stderr)
        # (a malformed window stops before anything is written)
        assert "goes with" in msg or not (tmp_path / "m").exists()


def test_bad_input_stops_the_prep_step(tmp_path):
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=3)
    _edit(os.path.join(root, pt.TRAIN_DIR, f"1{pt.EN_SUFFIX}"), lambda t: t + "x\n")
    work = tmp_path / "w"
    r = run(["--smoke", "--raw", root, "--workdir", str(work)], env={"EPISODES": "0:3"})
    assert r.returncode == 1
    assert "episode 1: its files differ in line count" in r.stderr and "step prep failed" in r.stderr
    assert not (work / "smoke" / "docs").exists() and not (work / "smoke" / ".done" / "prep").exists()


def test_download_clones_the_repository_and_fails_cleanly(tmp_path):
    """The download step clones TVSUB_URL (here a local repository in the
    corpus's layout) and the data steps read the clone; a URL that cannot be
    cloned is an error that leaves nothing behind."""
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=3)
    git = ["git", "-C", root, "-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tvsub"]):
        assert subprocess.run(git + cmd).returncode == 0
    work = tmp_path / "w"
    r = run(["--workdir", str(work)], env={"TVSUB_URL": str(tmp_path / "nope"), "UNTIL": "data"})
    assert r.returncode == 1 and "cannot clone" in r.stderr and "--raw DIR" in r.stderr
    assert not (work / "raw").exists() and not (work / "raw.part").exists()
    assert not (work / ".done" / "download").exists()
    r = run(["--workdir", str(work)], env={"TVSUB_URL": root, "UNTIL": "data", "EPISODES": "0:3",
                                           "BPE_MERGES": "50"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("evaluating on the test set (test-SUB01, test-SUB02); checkpoints chosen on the dev "
            "set: 18 sentences, 3 reference(s)") in r.stderr
    assert len((work / "raw" / ".tvsub-revision").read_text().strip()) == 40
    assert (work / "data-bin" / "test.docids").read_text().split()[0] == "test-SUB01"
    dict_lines = (work / "data-bin" / "dict.zh.txt").read_text().splitlines()
    assert any(line.startswith("<brk> ") for line in dict_lines)
    assert (work / "data-bin" / "dict.en.txt").read_text() == (work / "data-bin" / "dict.zh.txt").read_text()


def test_smoke_end_to_end(tmp_path):
    """Every model on tiny synthetic episodes with the study's options: the
    test set's 3 references, held-out episodes (HELDOUT) as the CXMI split,
    results.json with BLEU, d-BLEU, paired p-values against the transformer,
    CXMI against the empty context with its document interval (4 documents:
    none, with the caveat), gates and the equal target-token budget; CoWord
    dropout reaches every stage-2 model, the sampled context size every model
    with a bounded context; a re-run skips every step."""
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=16)
    work = tmp_path / "w"
    env = {"OMP_NUM_THREADS": "1", "COWORD_DROPOUT": "0.1",
           "SAMPLE_CONTEXT": "1", "MEMORY_WINDOW": "2", "HELDOUT": "12:16",
           "DOC_TOKENS": "2500"}
    r = run(["--smoke", "--raw", root, "--workdir", str(work)], env=env)
    assert r.returncode == 0, r.stderr[-5000:]
    assert ("evaluating on the test set (test-SUB01, test-SUB02); checkpoints chosen on the dev "
            "set: 18 sentences, 3 reference(s)") in r.stderr
    res = json.loads((work / "smoke" / "results" / "results.json").read_text())
    assert res["eval_split"] == "test" and res["test"]["references"] == 3
    models = ["sentence", "transformer", "concat", "context_aware", "zhang2018", "han",
              "han_enc", "selective", "dc", "hybrid"]
    assert list(res["models"]) == models
    for m in models:
        row = res["models"][m]
        for k in ("bleu_all_refs", "bleu_first_ref", "d_bleu_all_refs", "d_bleu_first_ref"):
            assert isinstance(row[k], float), (m, k, row)
        assert "nrefs:3" in row["signature"]
        assert row["train_options"] and row["updates"] is not None
    # every context model, transformer_selective_doc's document memory included, on
    # the held-out episodes (4 documents: too few for a document interval, said so)
    for m in ("concat", "context_aware", "zhang2018", "han", "han_enc", "selective"):
        row = res["models"][m]
        assert isinstance(row["cxmi"], float) and isinstance(row["cxmi_shuffled"], float), m
        assert row["cxmi_split"] == "heldout" and row["cxmi_documents"] == 4, m
        assert row["cxmi_interval"]["low"] is None and "too few" in row["cxmi_interval"]["note"]
        assert (work / "smoke" / "results" / m / "cxmi" / "cxmi.json").exists(), m
        # (selective: windows 0..MEMORY_WINDOW on its memory, the curve over them)
        assert len(row["curve"]) == row["sample_context_size"] + 1, m
        assert row["p_cxmi_pronouns"]["count"] > 0, m
    for m in ("sentence", "transformer", "dc", "hybrid"):
        assert res["models"][m]["cxmi"] == "no context", m
        assert not (work / "smoke" / "results" / m / "cxmi").exists(), m
    # gates on dev for every model with a gate; paired p-values against the transformer
    assert "ctx_mass" in res["models"]["context_aware"]["gate_dev"]
    assert res["models"]["concat"]["gate_dev"] is None  # no gate
    for m in models:
        if m == "transformer":
            assert "paired_test" not in res["models"][m]
            continue
        pt, ph = res["models"][m]["paired_test"], res["models"][m]["paired_heldout"]
        assert pt["p_documents"] is None and "too few" in pt["note"], m  # 2 test documents
        assert ph["documents"] == 4 and ph["p_documents"] is None, m
        assert isinstance(res["models"][m]["heldout_bleu"], float), m
    # every model starts from the one stage-1 transformer, at one stage-2 target-token budget
    for m in models[1:]:
        args = (work / "smoke" / "checkpoints" / m / "train.args").read_text().splitlines()
        init = [a for a in args if a in ("arg=--init-from-sentence-checkpoint",
                                         "arg=--finetune-from-model")]
        assert len(init) == 1, (m, args)
        assert args[args.index(init[0]) + 1].startswith("arg=$WORK/checkpoints/sentence/"), m
        b = res["models"][m]["budget"]
        assert b["target_token_budget"] == 2500 and res["models"][m]["updates"] == b["updates"]
        assert b["target_tokens_planned"] >= 2500 > \
            b["target_tokens_planned"] - b["target_tokens_per_update"], (m, b)
        # CoWord dropout for every stage-2 model (no confound); the sampled size where
        # the context is bounded
        assert "arg=--coword-dropout" in args, (m, args)
        bounded = m in ("concat", "context_aware", "zhang2018", "han", "han_enc", "selective")
        assert ("arg=--sampled-context-size" in args) == bounded, (m, args)
        assert "arg=--sample-context-size" not in args, (m, args)  # the deprecated name
        assert "arg=--doc-word-capacity" not in args, (m, args)  # removed (issue 24)
    ca = (work / "smoke" / "checkpoints" / "context_aware" / "train.args").read_text()
    assert res["models"]["context_aware"]["updates"] > res["models"]["transformer"]["updates"]
    assert res["models"]["selective"]["word_overflow_max"] is None  # no capacity: exact
    assert res["models"]["context_aware"]["word_overflow_max"] is None
    md = (work / "smoke" / "results" / "results.md").read_text()
    assert "exceeded --doc-word-capacity" not in md
    assert "Evaluated on the **test** set: 18 sentences, 3 reference(s)" in md
    detail = md.split("## The English pronouns in detail", 1)[1].split("\n## ")[0]
    for m in ("concat", "context_aware", "zhang2018", "han", "han_enc", "selective"):
        assert f"\n| {m} | " in detail, m
    assert "\n| transformer | " not in detail  # no context: nothing to measure
    # the exact commands: the run's, and each model's training, translation and CXMI
    assert res["command"].endswith(f"recipes/tvsub_zh_en/run.sh --smoke --raw {root} "
                                   f"--workdir {work}")
    for setting in ("OMP_NUM_THREADS=1 ", "COWORD_DROPOUT=0.1 ",
                    "HELDOUT=12:16 "):
        assert setting in res["command"], res["command"]
    cmds = res["models"]["han"]["commands"]
    assert cmds["fairseq-train"].startswith(
        "fairseq-train $WORK/data-bin --user-dir ctx_fairseq --save-dir $WORK/checkpoints/han "), cmds
    assert "--arch transformer_han" in cmds["fairseq-train"]
    assert "--first-pass-path $WORK/checkpoints/sentence/" in cmds["ctx-iterative-decode"]
    # (the recorded command line is shell-quoted: printf %q escapes the comma)
    assert "--conditions none\\,shuffled" in cmds["ctx-cxmi"] and "--curve" in cmds["ctx-cxmi"]
    assert "--data $WORK/data-heldout" in cmds["ctx-cxmi"]
    assert "--path $WORK/checkpoints/concat/" in res["models"]["concat"]["commands"]["fairseq-generate"]
    # selective's window: translation and validation read window K (the task's option)
    sel = res["models"]["selective"]["commands"]
    for tool in ("fairseq-generate", "fairseq-generate.heldout", "fairseq-validate"):
        assert "--document-memory" in sel[tool] and "--memory-window 2" in sel[tool], tool
        assert "--sample-context-size" not in sel[tool], tool
    assert "--sampled-context-size 2" in sel["fairseq-train"]
    assert "--arch transformer_han_enc" in res["models"]["han_enc"]["commands"]["fairseq-train"]
    # (the held-out split's translation beside the test split's)
    assert set(res["models"]["dc"]["commands"]) == {"fairseq-train", "fairseq-generate",
                                                    "fairseq-generate.heldout"}
    assert md.count("```") >= 2 * (1 + len(models))
    # no +DP source in this input: the DP steps were skipped, said so; each result's
    # checkpoint recorded
    assert "the dropped-pronoun steps (dp_*, dpsuite" in r.stderr
    assert "## Dropped pronouns" not in md and "## Which checkpoint each result is of" in md
    assert res["models"]["han"]["checkpoint"]["reported_on"] == "test-SUB01, test-SUB02"
    r2 = run(["--smoke", "--raw", root, "--workdir", str(work)], env=env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert not re.search(r"\] step \w", r2.stderr), r2.stderr[-2000:]



@pytest.mark.slow
def test_smoke_dropped_pronoun_steps(tmp_path):
    """The dropped-pronoun steps end to end on tiny episodes without a test
    set (dev's second episode reported, its first choosing the checkpoints)
    and with a +DP source: ctx-dp-eval per model, the suite built once and
    scored with the recipe's BPE (true context; shuffled context is another
    document's, and the test split has one: not scored, said in the log),
    ctx-cxmi on the test split for the pronouns of its DP sentences,
    the paired DP comparison against the transformer, the provenance of each
    checkpoint, and results.md's new tables; zhang2018 (its sentence level
    frozen) flagged from its checkpoint with shuffled as co-primary; a re-run
    skips every step; a work directory whose input lost its +DP source skips
    the new steps with a log line."""
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=16, test_refs=0, dev=(9, 14), dp=True)
    work = tmp_path / "w"
    env = {"OMP_NUM_THREADS": "1", "MODELS": "transformer context_aware zhang2018",
           "HELDOUT": "12:16", "SAMPLE_CONTEXT": "1", "DOC_UPDATES": "3", "SENT_UPDATES": "20"}
    r = run(["--smoke", "--raw", root, "--workdir", str(work)], env=env)
    assert r.returncode == 0, r.stderr[-5000:]
    assert "context_aware: the test split has one document: no shuffled context" in r.stderr
    smoke = work / "smoke"
    res = json.loads((smoke / "results" / "results.json").read_text())
    assert res["eval_split"] == "dev-episodes"
    models = ["sentence", "transformer", "context_aware", "zhang2018"]
    assert list(res["models"]) == models
    suite = [json.loads(x) for x in (smoke / "results" / "dp_suite.jsonl").read_text().splitlines()]
    assert suite and all(rec["doc_id"] == "dev-SUB02" for rec in suite)
    for m in models:
        row = res["models"][m]
        c = row["checkpoint"]
        assert c["checkpoint"] == f"$WORK/checkpoints/{m}/checkpoint_best.pt", c
        assert c["chosen_on"] == "dev-SUB01" and c["reported_on"] == "dev-SUB02", c
        assert isinstance(c["num_updates"], int) and c["num_updates"] > 0, c
        assert c["reported_on_chosen_set"] is False
        assert c["sentence_level_frozen"] is (m == "zhang2018"), (m, c)
        dp = row["dp"]
        assert dp["items"] > 0 and 0 <= dp["recall"] <= 1 and dp["dp_sentences"] > 0, (m, dp)
        assert set(dp["by_class"]) >= {"3sg-m", "3sg-f"}
        runs = row["contrastive"]
        assert set(runs) == {"true"}, (m, runs)  # (one document: nothing to shuffle)
        assert runs["true"]["items"]["n"] == sum(len({(s["class"], s["token_index"])
                                                      for s in rec["swaps"]}) for rec in suite)
        if m == "transformer":
            assert "dp_paired" not in row
        else:
            pv = row["dp_paired"]["all"]
            assert pv["items"] == dp["items"] and 0 <= pv["mcnemar_p"] <= 1, (m, pv)
    for m in ("context_aware", "zhang2018"):
        row = res["models"][m]
        # the test split (one document): the pronouns of its DP sentences against none
        pd = row["p_cxmi_dp"]["none"]
        assert pd["dp_sentences"]["count"] > 0, (m, pd)
        assert row["p_cxmi_words"]["count"] > 0 and row["p_cxmi_eos"]["count"] > 0
        cx = json.loads((smoke / "results" / m / "cxmi" / "cxmi.json").read_text())
        assert cx["word_classes"]["none"]["</s>"]["count"] == cx["sentences"]
        assert (smoke / "commands" / f"{m}.ctx-cxmi.test.sh").exists()
        assert "ctx-score-contrastive.shuffled" not in row["commands"]
        assert "--bpe subword_nmt" in row["commands"]["ctx-score-contrastive"]
    assert res["models"]["zhang2018"]["cxmi_co_primary"] == "shuffled"
    assert res["models"]["context_aware"]["cxmi_co_primary"] is None
    md = (smoke / "results" / "results.md").read_text()
    assert "chosen on dev-SUB01; reported on dev-SUB02." in md
    assert "## Dropped pronouns" in md and "## Which checkpoint each result is of" in md
    assert "| zhang2018 | yes | empty and shuffled (co-primary) |" in md
    r2 = run(["--smoke", "--raw", root, "--workdir", str(work)], env=env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert not re.search(r"\] step \w", r2.stderr), r2.stderr[-2000:]
    # an input without the +DP source: the new steps are skipped, said so
    bare = write_tvsub(str(tmp_path / "bare"), episodes=16, test_refs=0, dev=(9, 14))
    env3 = dict(env, MODELS="transformer")
    r3 = run(["--smoke", "--raw", bare, "--workdir", str(tmp_path / "b")], env=env3)
    assert r3.returncode == 0, r3.stderr[-3000:]
    assert "the dropped-pronoun steps (dp_*, dpsuite" in r3.stderr
    assert not (tmp_path / "b" / "smoke" / "results" / "transformer" / "dp.json").exists()


def test_smoke_killed_during_training_resumes(tmp_path):
    """A smoke run killed (SIGKILL, the whole process group) during stage-1
    training, once fairseq has written a checkpoint, and run again: the
    finished data steps are skipped, stage 1 resumes from its checkpoint (not
    from scratch) and runs to its update budget, and every later step
    finishes, with the outputs of an uninterrupted run: the same translations
    and the same BLEU, d-BLEU and CXMI (on the CPU fairseq-train's resume is
    bit-exact, see ctx_fairseq.compat.reuse_first_epoch_batches)."""
    import signal
    import time

    root = write_tvsub(str(tmp_path / "tvsub"))
    env = {"OMP_NUM_THREADS": "1", "MODELS": "transformer context_aware"}
    work = tmp_path / "b"
    smoke = work / "smoke"
    ckpt = smoke / "checkpoints" / "sentence" / "checkpoint_last.pt"
    p = subprocess.Popen(["bash", RECIPE, "--smoke", "--raw", root, "--workdir", str(work)],
                         cwd=REPO, env=dict(os.environ, **env), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while not ckpt.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert ckpt.exists(), "stage 1 wrote no checkpoint"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not (smoke / ".done" / "train_sentence").exists(), "killed too late: stage 1 finished"
    assert not (smoke / "checkpoints" / "sentence" / "train.done").exists()
    assert (smoke / ".done" / "binarize").exists()
    b = run(["--smoke", "--raw", root, "--workdir", str(work)], env=env)
    assert b.returncode == 0, b.stderr[-3000:]
    assert "resuming the interrupted run (same settings)" in b.stderr
    assert "skip prep" in b.stderr and "skip binarize" in b.stderr
    log = (smoke / "logs" / "train-sentence.log").read_text()
    m = re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ (\d+) updates\)", log)
    assert m and int(m.group(1)) > 0, "stage 1 did not resume from its checkpoint"
    updates = [int(x) for x in re.findall(r"\| train \|.*?num_updates (\d+)", log)]
    assert updates[-1] == 40
    res = json.loads((smoke / "results" / "results.json").read_text())
    for name in ("sentence", "transformer", "context_aware"):
        assert isinstance(res["models"][name]["bleu_all_refs"], float), name
    # the same outputs as a run that was never interrupted
    a = run(["--smoke", "--raw", root, "--workdir", str(tmp_path / "a")], env=env)
    assert a.returncode == 0, a.stderr[-3000:]
    whole = tmp_path / "a" / "smoke"
    outputs = sorted(p.name for p in (whole / "generate").glob("*.txt"))
    assert outputs and outputs == sorted(p.name for p in (smoke / "generate").glob("*.txt"))
    for name in outputs:
        assert (smoke / "generate" / name).read_bytes() == \
            (whole / "generate" / name).read_bytes(), name
    ref = json.loads((whole / "results" / "results.json").read_text())
    for name in ("sentence", "transformer", "context_aware"):
        for key in ("bleu_all_refs", "bleu_first_ref", "d_bleu_all_refs", "cxmi",
                    "cxmi_shuffled"):
            assert res["models"][name].get(key) == ref["models"][name].get(key), (name, key)


def test_heldout_split(tmp_path):
    """heldout.py: the held-out episodes as documents, their first N
    sentences; overlapping the training episodes is an error, nothing
    written."""
    root = write_tvsub(str(tmp_path / "tvsub"), episodes=6, lines=10)
    script = os.path.join(REPO, "recipes", "tvsub_zh_en", "heldout.py")
    out = tmp_path / "docs"
    r = subprocess.run([sys.executable, script, "--raw", root, "--episodes", "4:6",
                        "--train-episodes", "0:4", "--sentences", "7", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ids = (out / "heldout.docids").read_text().splitlines()
    assert ids == ["ep-4"] * 7 + ["ep-5"] * 7
    assert len((out / "heldout.zh").read_text().splitlines()) == 14
    tr = os.path.join(root, "data", "orignal", "train", "separated")
    assert (out / "heldout.en").read_text().splitlines()[:7] == \
        open(os.path.join(tr, f"4{pt.EN_SUFFIX}"), encoding="utf-8").read().splitlines()[:7]
    bad = tmp_path / "bad"
    r = subprocess.run([sys.executable, script, "--raw", root, "--episodes", "3:6",
                        "--train-episodes", "0:4", "--out", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "overlap the training episodes" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("heldout.py: error:")
    assert not bad.exists()


def _report_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "tvsub_report", os.path.join(REPO, "recipes", "tvsub_zh_en", "report.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_report_pronoun_table():
    """The pronoun table: the class against the empty and the shuffled context
    beside all words, the repetition split and the per-person means weighted by
    each form's count, from ctx-cxmi's word classes as they are stored."""
    report = _report_module()

    def cls(mean, rep, nrep, by_word=None, minus=None):
        g = {"count": rep[0] + nrep[0], "mean_p_cxmi": mean,
             "in_previous_reference": {"count": rep[0], "mean_p_cxmi": rep[1]},
             "not_in_previous_reference": {"count": nrep[0], "mean_p_cxmi": nrep[1]},
             "minus_all_words": minus,
             "minus_all_words_interval": {"low": -0.5, "high": 0.25}}
        if by_word is not None:
            g["by_word"] = [{"word": w, "count": n, "mean_p_cxmi": v} for w, n, v in by_word]
        return g

    pron = cls(0.1, (2, 0.3), (4, 0.0), [("i", 3, 0.2), ("me", 1, -0.2), ("it", 2, 0.0)],
               minus=0.05)
    cx = {"sentences": 6, "split": "test", "documents": 2, "logprob_true_per_token": -1.0,
          "none": {"cxmi": 0.01, "interval": {"low": None, "note": "too few: 2"},
                   "cxmi_per_token": 0.01},
          "shuffled": {"cxmi": 0.0, "interval": {"low": None, "note": "too few: 2"}},
          "word_classes": {
              "none": {"all words": cls(0.05, (5, 0.2), (20, 0.0125)), "pronouns": pron},
              "shuffled": {"all words": cls(0.0, (5, 0.0), (20, 0.0)),
                           "pronouns": cls(0.02, (2, 0.0), (4, 0.03), [], minus=0.02)}}}
    row = report._cxmi_fields(cx, 6)
    assert row["p_cxmi_pronouns"] is pron and row["p_cxmi_shuffled_pronouns"]["mean_p_cxmi"] == 0.02
    means = report._person_means(pron)
    assert means[0] == (pytest.approx((3 * 0.2 - 0.2) / 4), 4)  # I: i and me, by count
    assert means[1] == (None, 0) and means[3] == (0.0, 2)
    res = {"models": {"transformer": {"cxmi": "no context"}, "ca": row}}
    lines = report._pronoun_lines(res)
    body = [x for x in lines if x.startswith("| ca |")]
    assert len(body) == 1 and not any(x.startswith("| transformer |") for x in lines)
    cells = [c.strip() for c in body[0].strip("|").split("|")]
    assert cells[1:6] == ["0.1000 / 0.0500", "0.0500 [-0.5000, 0.2500]", "0.0200 / 0.0000",
                          "0.0200 [-0.5000, 0.2500]", "0.3000 / 0.2000 (2)"]
    assert cells[6] == "0.0000 / 0.0125 (4)"
    assert cells[7:] == ["0.1000 (4)", "-", "-", "0.0000 (2)", "-", "-"]
    assert report._pronoun_lines({"models": {"transformer": {"cxmi": "no context"}}}) == []
    # the persons' forms are exactly ctx-cxmi's English pronouns, each once
    from ctx_fairseq.eval.context_use.word_classes import WORD_CLASSES

    forms = [w for _, words in report.PERSONS for w in words.split()]
    assert sorted(forms) == sorted(WORD_CLASSES["en"]["pronouns"])


def test_report_reads_the_gate_of_fairseq_validate(tmp_path):
    """The gate column comes from fairseq-validate's line on the dev set (the
    context-side statistics, every one named), never from a training line."""
    report = _report_module()
    log = tmp_path / "gate.log"
    log.write_text(
        "2026 | INFO | train | epoch 001 | loss 3 | gate 0.1 | ctx_mass 0.9\n"
        "2026 | INFO | valid | valid on 'valid' subset | loss 9.756 | gate 0.492393 | "
        "ctx_mass 0.507607 | ctx_frac 0.999098 | wps 0 | wpb 18455\n")
    assert report._gate(str(log)) == {"gate": 0.492393, "ctx_mass": 0.507607,
                                      "ctx_frac": 0.999098}
    log.write_text("2026 | INFO | valid | valid on 'valid' subset | loss 9.7 | ctx_mass_src "
                   "0.25 | ctx_mass_tgt 1.5e-01\n")
    assert report._gate(str(log)) == {"ctx_mass_src": 0.25, "ctx_mass_tgt": 0.15}
    log.write_text("2026 | INFO | valid | valid on 'valid' subset | loss 9.7 | ppl 3\n")
    assert report._gate(str(log)) is None  # a model without a gate
    assert report._gate(str(tmp_path / "none.log")) is None
