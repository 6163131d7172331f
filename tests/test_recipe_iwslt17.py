"""recipes/iwslt17_ted_en_de/run.sh: syntax, the offline full mode (stops at
the download step, nothing half-written), and the smoke mode end to end on
the IWSLT17 XML sets (slow: a few minutes on a 2-core CPU), re-run skipping
every finished step.

The smoke test needs the IWSLT17 TED en-de XML files: ``$IWSLT17_TED_DIR``,
else ``../shared/data/iwslt17-ted-en-de`` beside the repository."""

import glob
import json
import os
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "iwslt17_ted_en_de", "run.sh")
DATA = os.environ.get("IWSLT17_TED_DIR") or os.path.normpath(
    os.path.join(REPO, "..", "shared", "data", "iwslt17-ted-en-de"))
needs_data = pytest.mark.skipif(
    not os.path.isfile(os.path.join(DATA, "IWSLT17.TED.tst2015.en-de.en.xml")),
    reason=f"IWSLT17 TED en-de XML files not found in {DATA} (set IWSLT17_TED_DIR)")


def run(args, env=None, timeout=1200):
    return subprocess.run(["bash", RECIPE, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=dict(os.environ, **(env or {})))


def files_under(path):
    return sorted(os.path.relpath(os.path.join(d, f), path)
                  for d, _, fs in os.walk(path) for f in fs)


def test_bash_syntax():
    r = subprocess.run(["bash", "-n", RECIPE], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_help_and_smoke_needs_raw(tmp_path):
    r = run(["--help"])
    assert r.returncode == 0 and "IWSLT17 TED en-de documents" in r.stdout
    r = run(["--smoke", "--workdir", str(tmp_path / "w")])
    assert r.returncode == 1 and "give the sample with --raw DIR" in r.stderr


def test_offline_full_mode_stops_at_download(tmp_path):
    """No network (a dead proxy makes sure of it): the download step fails with
    a clear message, and no download, extraction or later output is left."""
    dead = "http://127.0.0.1:9"
    env = {k: dead for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                             "ALL_PROXY", "all_proxy")}
    env.update(no_proxy="", NO_PROXY="")
    work = tmp_path / "w"
    r = run(["--workdir", str(work)], env=env, timeout=300)
    assert r.returncode == 1, r.stderr
    assert "step download" in r.stderr
    assert ("cannot download https://raw.githubusercontent.com/hlt-mt/WIT3/master/archive/"
            "2017-01-trnted/texts/en/de/en-de.tgz (no network?)") in r.stderr
    assert "--raw DIR" in r.stderr and "step download failed" in r.stderr
    assert "step prep" not in r.stderr  # nothing after the download ran
    assert files_under(work) == []  # no archive, no .part file, no raw/, no done marker
    assert not (work / "raw").exists() and not (work / ".done" / "download").exists()


def _tags_file(path, docs, lang):
    """IWSLT train.tags layout: each talk's metadata lines, then its segments."""
    with open(path, "w", encoding="utf-8") as f:
        for docid, segs in docs:
            f.write(f"<url>http://www.ted.com/talks/{docid}</url>\n<keywords>talks</keywords>\n"
                    f"<talkid>{docid}</talkid>\n<title>Talk {docid} ({lang})</title>\n")
            f.write("".join(text + "\n" for _, text in segs))


def _fake_release(root):
    """Archives laid out like the IWSLT17 release, made from the XML sets:
    training talks = tst2010 (as train.tags), dev = tst2011, test "tst2016" =
    tst2015 (English in en-de/, German in de-en/)."""
    import shutil
    import tarfile

    from ctx_fairseq.prep.xml_docs import read_xml_documents

    def xml(name, lang):
        return os.path.join(DATA, f"IWSLT17.TED.{name}.en-de.{lang}.xml")

    trn = root / "trn" / "en-de"
    trn.mkdir(parents=True)
    for lang in ("en", "de"):
        _tags_file(trn / f"train.tags.en-de.{lang}", read_xml_documents(xml("tst2010", lang)), lang)
        shutil.copy(xml("tst2011", lang), trn / f"IWSLT17.TED.tst2011.en-de.{lang}.xml")
    (root / "tst" / "en-de").mkdir(parents=True)
    (root / "tst" / "de-en").mkdir(parents=True)
    shutil.copy(xml("tst2015", "en"), root / "tst" / "en-de" / "IWSLT17.TED.tst2016.en-de.en.xml")
    shutil.copy(xml("tst2015", "de"), root / "tst" / "de-en" / "IWSLT17.TED.tst2016.de-en.de.xml")
    archives = {}
    for name, base, sub in (("trnted", root / "trn", "en-de"), ("test-en-de", root / "tst", "en-de"),
                            ("test-de-en", root / "tst", "de-en")):
        archives[name] = str(root / f"{name}.tgz")
        with tarfile.open(archives[name], "w:gz") as tar:
            tar.add(base / sub, arcname=sub)
    return archives


@needs_data
def test_full_mode_data_steps_from_release_archives(tmp_path):
    """The full mode's download (file:// URLs), MD5 check, extraction, talks
    from train.tags (ctx-prep-docs tags), dev/test XML (test German from the
    de-en set), tokenisation, truecasing, BPE, binarization and the suite;
    UNTIL=data stops before training. A wrong MD5 is an error that removes the
    archive and extracts nothing."""
    import hashlib

    arch = _fake_release(tmp_path / "release")
    with open(arch["trnted"], "rb") as f:
        md5 = hashlib.md5(f.read()).hexdigest()
    env = {"IWSLT17_TRAIN_URL": "file://" + arch["trnted"], "IWSLT17_TRAIN_MD5": md5,
           "IWSLT17_TEST_URL_EN_DE": "file://" + arch["test-en-de"], "IWSLT17_TEST_MD5_EN_DE": "",
           "IWSLT17_TEST_URL_DE_EN": "file://" + arch["test-de-en"], "IWSLT17_TEST_MD5_DE_EN": "",
           "DEV_SETS": "tst2011", "TEST_SETS": "tst2016", "BPE_MERGES": "300", "UNTIL": "data",
           "OMP_NUM_THREADS": "1"}
    work = tmp_path / "w"
    r = run(["--workdir", str(work)], env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "md5 of" in r.stderr and "not checked" in r.stderr
    assert "UNTIL=data" in r.stderr and "train_sentence" not in r.stderr
    assert sorted(os.listdir(work / "raw")) == sorted(
        ["train.tags.en-de.en", "train.tags.en-de.de", "IWSLT17.TED.tst2011.en-de.en.xml",
         "IWSLT17.TED.tst2011.en-de.de.xml", "IWSLT17.TED.tst2016.en-de.en.xml",
         "IWSLT17.TED.tst2016.de-en.de.xml"])
    assert not (work / "raw.part").exists()
    from ctx_fairseq.prep.xml_docs import read_xml_documents

    def talk_lines(name):
        return [d for d, segs in read_xml_documents(os.path.join(
            DATA, f"IWSLT17.TED.{name}.en-de.en.xml")) for _ in segs]

    for split, name in (("train", "tst2010"), ("valid", "tst2011"), ("test", "tst2015")):
        assert (work / "data-bin" / f"{split}.docids").read_text().split() == talk_lines(name)
    assert (work / "data-bin" / "test.en-de.en.bin").exists()
    assert (work / "suite" / "test.pronouns.jsonl").read_text().strip()
    # the wrong checksum: an error, the archive removed, nothing extracted
    work2 = tmp_path / "w2"
    r = run(["--workdir", str(work2)], env=dict(env, IWSLT17_TRAIN_MD5="0" * 32), timeout=300)
    assert r.returncode == 1
    assert f"md5 {md5}, expected {'0' * 32}" in r.stderr and "step download failed" in r.stderr
    assert not (work2 / "raw").exists() and not (work2 / "raw.part").exists()
    assert "2017-01-trnted.en-de.tgz" not in os.listdir(work2 / "downloads")


MODELS = ["sentence", "context_aware", "encoder-online-sparse-soft"]


def _summary_checks(work, suite_records):
    """Every model: tokenized BLEU and sacreBLEU (sentence and document level,
    signatures), pronoun accuracy over the whole suite; the selective model's
    analysis; one table of every model."""
    n_test = len((work / "data-bin" / "test.docids").read_text().split())
    table = (work / "results" / "table.md").read_text()
    for m in MODELS:
        assert f"| {m} |" in table
        res = work / "results" / m
        for prefix, tok in (("tokenized_bleu", "tok:none"), ("sacrebleu", "tok:13a")):
            bleu = json.loads((res / f"{prefix}.json").read_text())
            for level in ("sentence_level", "document_level"):
                assert bleu[level]["signature"].startswith(f"nrefs:1|case:mixed|eff:no|{tok}")
                assert 0.0 <= bleu[level]["bleu"] <= 100.0
                assert f"{bleu[level]['bleu']:.2f}" in table
            assert bleu["references"]["source"] == "refs"
            assert bleu["sentences"] == n_test and bleu["documents"] == 4
        # sacreBLEU against the original German text, tokenized BLEU against the tokenized one
        assert json.loads((res / "sacrebleu.json").read_text())["references"]["description"] \
            .startswith(f"--refs {work / 'docs' / 'test.de'}")
        acc = json.loads((res / "contrastive_pronouns.json").read_text())["overall"]
        assert acc["n"] == suite_records and acc["accuracy"] is not None
        assert 0.0 <= acc["accuracy"] <= 1.0
    assert (work / "results" / f"analysis-{MODELS[2]}" / "selective_support_test.json").exists()
    complexity = (work / "results" / "complexity.md").read_text()
    assert all(f"| {m} |" in complexity for m in ["transformer", *MODELS[1:]])
    assert "| ? |" not in complexity
    summary = (work / "results" / "summary.md").read_text()
    assert table in summary and "smoke run" in summary
    return summary


@pytest.mark.slow
@needs_data
def test_smoke_end_to_end_and_rerun(tmp_path):
    work = tmp_path / "w" / "smoke"
    t0 = time.time()
    r = run(["--smoke", "--raw", DATA, "--workdir", str(tmp_path / "w")])
    elapsed = time.time() - t0
    assert r.returncode == 0, r.stderr[-5000:]
    print(f"smoke run: {elapsed:.0f} s")
    assert elapsed < 15 * 60
    # the split: talks, no talk in two splits; the suite from the test talks
    ids = {s: (work / "data-bin" / f"{s}.docids").read_text().split() for s in
           ("train", "valid", "test")}
    talks = {s: set(v) for s, v in ids.items()}
    assert len(talks["test"]) == 4 and len(talks["valid"]) == 3 and len(talks["train"]) == 66
    assert not (talks["train"] & talks["test"]) and not (talks["valid"] & talks["test"])
    suite = [json.loads(x) for x in (work / "suite" / "test.pronouns.jsonl").read_text().splitlines()]
    assert suite and all(rec["doc_id"] in talks["test"] for rec in suite)
    bpe_test = (work / "bpe" / "test.en").read_text().splitlines()
    assert all(bpe_test[rec["id"]] == rec["src"] for rec in suite)
    summary = _summary_checks(work, len(suite))
    assert "| sentence |" in r.stdout and "pronoun suite accuracy" in r.stdout
    assert not glob.glob(str(work / "**" / "*.part"), recursive=True)

    # a re-run skips every finished step and changes nothing
    before = {f: os.path.getmtime(work / f) for f in files_under(work)}
    t0 = time.time()
    r = run(["--smoke", "--raw", DATA, "--workdir", str(tmp_path / "w")])
    assert r.returncode == 0, r.stderr[-3000:]
    assert time.time() - t0 < 60
    assert "step " not in r.stderr.replace("skip ", "")
    assert r.stderr.count("skip ") == len(os.listdir(work / ".done"))
    assert {f: os.path.getmtime(work / f) for f in files_under(work)} == before
    assert (work / "results" / "summary.md").read_text() == summary
