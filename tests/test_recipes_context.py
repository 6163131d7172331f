"""The document-level corpus recipes (recipes/{news_commentary_v11_en_de,
europarl_v7_en_de,opensubtitles2018_en_ru}/run.sh, shared steps in
recipes/lib/steps_context.sh): the smoke runs on a few lines written here (no
network), re-runs skip finished steps, and an offline full run stops at the
download step with a clear message and leaves no partial files. Their syntax
(bash -n, shellcheck): tests/test_recipes_lib.py, for every recipes/**/*.sh."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = {name: os.path.join(REPO, "recipes", name, "run.sh")
           for name in ("news_commentary_v11_en_de", "europarl_v7_en_de", "opensubtitles2018_en_ru")}

# English/German/Russian toy sentences: enough repeated words for BPE, truecasing
# and a few training updates; the content does not matter.
# Three in ten English sentences have one "it" and their German one er/sie/es:
# every test split has lines for the pronoun suite (ctx-make-pronoun-suite).
EN = ["the committee has adopted the report .", "we support the proposal of the commission .",
      "this is a very important question for our citizens .", "it must act now , said the council .",
      "i would like to thank the rapporteur .", "member states have to respect the rules .",
      "it will take place tomorrow .", "we cannot accept this amendment .",
      "it is a question of money and of trust .", "the debate is closed ."]
DE = ["der ausschuss hat den bericht angenommen .", "wir unterstützen den vorschlag der kommission .",
      "dies ist eine sehr wichtige frage für unsere bürger .", "er muss jetzt handeln , sagte der rat .",
      "ich möchte dem berichterstatter danken .", "die mitgliedstaaten müssen die regeln einhalten .",
      "sie findet morgen statt .", "wir können diesen änderungsantrag nicht annehmen .",
      "es ist eine frage des geldes und des vertrauens .", "die aussprache ist geschlossen ."]
RU = ["комитет принял доклад .", "мы поддерживаем предложение комиссии .",
      "это очень важный вопрос для наших граждан .", "совет должен действовать сейчас .",
      "я хотел бы поблагодарить докладчика .", "государства должны соблюдать правила .",
      "голосование состоится завтра .", "мы не можем принять эту поправку .",
      "это вопрос денег и доверия .", "прения закрыты ."]


def sentence(lang, i):
    base = {"en": EN, "de": DE, "ru": RU}[lang][i % 10]
    return (base[0].upper() + base[1:]) if i % 3 == 0 else base


def write(path, text):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# ------------------------------------------------------------------ raw layouts

def europarl_sessions(raw):
    """Two session files per language (the source release after its aligner):
    speaker turns of 6-7 sentences, chapter titles, a short turn (dropped: fewer
    than 6 sentences), a <P> line."""
    k = 0
    for session in ("ep-00-01-17", "ep-00-01-18"):
        text = {"en": [], "de": []}
        for chapter in (1, 2):
            for lang in text:
                text[lang] += [f'<CHAPTER ID="{chapter}">', sentence(lang, chapter)]
            for speaker, n in ((1, 6), (2, 7), (3, 2)):
                for lang in text:
                    text[lang].append(f'<SPEAKER ID="{speaker}" NAME="Speaker {speaker}">')
                for j in range(n):
                    if j == 3:
                        for lang in text:
                            text[lang].append("<P>")
                    for lang in text:
                        text[lang].append(sentence(lang, k))
                    k += 1
        for lang, lines in text.items():
            write(os.path.join(raw, "sessions", lang, f"{session}.txt"), "\n".join(lines) + "\n")


def sgm(path, kind, lang, docs):
    lines = [f'<{kind}set setid="newstest" srclang="any" trglang="{lang}">']
    for d, sents in docs:
        lines.append(f'<doc sysid="ref" docid="{d}" genre="news" origlang="en">')
        lines.append("<p>")
        lines += [f'<seg id="{i}">{s}</seg>' for i, s in enumerate(sents, 1)]
        lines += ["</p>", "</doc>"]
    lines.append(f"</{kind}set>")
    write(path, "\n".join(lines) + "\n")


def news_commentary(raw):
    """WMT16 dev/test SGML (two documents each) and <d>-delimited training documents."""
    k = 0
    for split, name in (("dev", "newstest2015"), ("test", "newstest2016")):
        docs = {"en": [], "de": []}
        for d in range(2):
            for lang in docs:
                docs[lang].append((f"{name}-doc{d}", [sentence(lang, k + j) for j in range(4)]))
            k += 4
        sgm(os.path.join(raw, split, f"{name}-ende-src.en.sgm"), "src", "en", docs["en"])
        sgm(os.path.join(raw, split, f"{name}-ende-ref.de.sgm"), "ref", "de", docs["de"])
    for lang in ("en", "de"):
        out = []
        for d in range(6):
            out.append("<d>")
            out += [sentence(lang, 7 * d + j) for j in range(5 + d % 3)]
        write(os.path.join(raw, "train", f"news-commentary-v11.doc.{lang}"), "\n".join(out) + "\n")


def subtitle_xml(sents):
    out = ['<?xml version="1.0" encoding="utf-8"?>', '<document id="1">']
    for sid, (start, words) in enumerate(sents, 1):
        out.append(f'<s id="{sid}">')
        if start is not None:
            out.append(f'<time id="T{sid}S" value="00:{start // 60:02d}:{start % 60:02d},000" />')
        out += [f'<w id="{sid}.{i}">{w}</w>' for i, w in enumerate(words.split(), 1)]
        if start is not None:
            out.append(f'<time id="T{sid}E" value="00:{(start + 1) // 60:02d}:'
                       f'{(start + 1) % 60:02d},500" />')
        out.append("</s>")
    out.append("</document>")
    return "\n".join(out) + "\n"


def opensubtitles(raw, movies=5, per_movie=12):
    """OPUS OpenSubtitles2018 en-ru: per-movie XML documents (directories, as the
    zip files hold them), the XCES alignment with overlap scores; a gap of 20 s
    after every 4th subtitle and one link under the 0.9 overlap per movie; two
    Voita et al. (2019) style contrastive test sets."""
    groups = []
    k = 0
    for m in range(movies):
        movie = f"200{m}/{1000 + m}"
        en, ru, links = [], [], []
        t = 1
        for i in range(per_movie):
            en.append((t, sentence("en", k)))
            ru.append((None, sentence("ru", k)))
            t += 20 if i % 4 == 3 else 2
            overlap = 0.5 if i == 6 else 0.95
            links.append(f'<link id="SL{i}" xtargets="{i + 1};{i + 1}" overlap="{overlap}" />')
            k += 1
        write(os.path.join(raw, "opus", "en", movie, "1.xml"), subtitle_xml(en))
        write(os.path.join(raw, "opus", "ru", movie, "2.xml"), subtitle_xml(ru))
        groups.append(f'<linkGrp targType="s" fromDoc="en/{movie}/1.xml.gz" '
                      f'toDoc="ru/{movie}/2.xml.gz">\n' + "\n".join(links) + "\n</linkGrp>")
    write(os.path.join(raw, "opus", "en-ru.xml"),
          '<?xml version="1.0" encoding="utf-8"?>\n<cesAlign version="1.0">\n'
          + "\n".join(groups) + "\n</cesAlign>\n")
    for name in ("deixis_test", "lex_cohesion_test"):
        recs = []
        for i in range(3):
            ctx_en = [sentence("en", i + j) for j in range(3)]
            ctx_ru = [sentence("ru", i + j) for j in range(3)]
            good, bad = sentence("ru", i + 3), sentence("ru", i + 4)
            recs.append({"src": " _eos ".join(ctx_en + [sentence("en", i + 3)]),
                         "dst": [" _eos ".join(ctx_ru + [good]), " _eos ".join(ctx_ru + [bad])],
                         "true_ind": 0, "ctx_dist": 1 + i % 3})
        write(os.path.join(raw, "contrastive", f"{name}.json"), json.dumps(recs, ensure_ascii=False))


LAYOUTS = {"news_commentary_v11_en_de": news_commentary, "europarl_v7_en_de": europarl_sessions,
           "opensubtitles2018_en_ru": opensubtitles}


def run(recipe, *args, env=None, timeout=600):
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable,
             PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    e.update(env or {})
    return subprocess.run(["bash", RECIPES[recipe], *args], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=REPO)


def files_under(path):
    out = []
    for root, _, names in os.walk(path):
        out += [os.path.relpath(os.path.join(root, n), path) for n in names]
    return sorted(out)


# --------------------------------------------------------------------- runs

@pytest.mark.parametrize("recipe", RECIPES)
def test_help_and_smoke_needs_raw(recipe, tmp_path):
    r = run(recipe, "--help")
    assert r.returncode == 0 and "--raw DIR" in r.stdout and "--smoke" in r.stdout
    r = run(recipe, "--smoke", "--workdir", str(tmp_path / "w"))
    assert r.returncode == 1 and "give the sample with --raw DIR" in r.stderr


# ------------------------------------------------------------- offline: download

OFFLINE = {"WMT16_URL": "http://127.0.0.1:9/wmt16", "OPUS_URL": "http://127.0.0.1:9/opus",
           "SUITES_URL": "http://127.0.0.1:9/suites"}


@pytest.mark.parametrize("recipe", RECIPES)
def test_offline_run_stops_at_download(recipe, tmp_path):
    """Without network (a closed local port: refused at once, no hang) the full
    run fails in the download step with a message saying what to fetch and
    where to put it, and leaves no file behind and no step marked done."""
    work = tmp_path / "w"
    t0 = time.time()
    r = run(recipe, "--workdir", str(work), env=OFFLINE, timeout=120)
    assert time.time() - t0 < 60
    assert r.returncode == 1, r.stderr
    assert "step download" in r.stderr and "step download failed" in r.stderr
    assert "cannot download http://127.0.0.1:9/" in r.stderr
    assert "--raw DIR" in r.stderr and "no network?" in r.stderr
    left = [f for f in files_under(work) if not f.startswith("logs/")]
    assert left == [], left
    assert "step prep" not in r.stderr


def test_news_commentary_download_says_which_training_documents_are_missing(tmp_path):
    """The WMT16 dev/test archives are there (as if downloaded): they are
    extracted, then the step stops with what to supply and where."""
    import tarfile

    raw_files = tmp_path / "files"
    news_commentary(str(raw_files))
    work = tmp_path / "w"
    dl = work / "raw" / "downloads"
    dl.mkdir(parents=True)
    for split, name in (("dev", "wmt16-dev.tgz"), ("test", "wmt16-test.tgz")):
        with tarfile.open(dl / name, "w:gz") as tar:
            tar.add(raw_files / split, arcname=split)
    r = run("news_commentary_v11_en_de", "--workdir", str(work), env=OFFLINE, timeout=120)
    assert r.returncode == 1
    assert "training-parallel-nc-v11.tgz has one sentence per line and no" in r.stderr
    assert f"Put the training documents in {work / 'raw'}" in r.stderr
    assert "train/news-commentary-v11.doc.en" in r.stderr
    assert "step download failed" in r.stderr
    got = files_under(work / "raw")
    assert "dev/newstest2015-ende-src.en.sgm" in got and "test/newstest2016-ende-ref.de.sgm" in got
    assert not [f for f in got if f.endswith(".part")]
    assert not (work / ".done" / "download").exists()
    with open(work / "raw" / "dev" / "newstest2015-ende-src.en.sgm", encoding="utf-8") as f:
        assert f.read() == (raw_files / "dev" / "newstest2015-ende-src.en.sgm").read_text()


def test_europarl_prep_error_names_file_and_line(tmp_path):
    raw = tmp_path / "raw"
    europarl_sessions(str(raw))
    bad = raw / "sessions" / "de" / "ep-00-01-18.txt"
    lines = bad.read_text(encoding="utf-8").split("\n")
    i = next(k for k, x in enumerate(lines) if x.startswith('<SPEAKER ID="2"'))
    lines[i] = '<SPEAKER ID="9" NAME="Speaker 9">'
    bad.write_text("\n".join(lines), encoding="utf-8")
    work = tmp_path / "w"
    r = run("europarl_v7_en_de", "--smoke", "--raw", str(raw), "--workdir", str(work), timeout=120)
    assert r.returncode == 1
    src = raw / "sessions" / "en" / "ep-00-01-18.txt"
    assert f"ctx-prep-corpora: error: {src}:{i + 1}: SPEAKER ID '2' here but '9'" in r.stderr
    assert "step prep failed" in r.stderr
    assert not (work / "smoke" / "docs").exists() or files_under(work / "smoke" / "docs") == []


# ------------------------------------------------------------------ smoke runs

def smoke(recipe, tmp_path, env=None):
    raw = tmp_path / "raw"
    LAYOUTS[recipe](str(raw))
    work = tmp_path / "w"
    t0 = time.time()
    r = run(recipe, "--smoke", "--raw", str(raw), "--workdir", str(work), env=env)
    elapsed = time.time() - t0
    assert r.returncode == 0, r.stderr[-6000:]
    return work / "smoke", r, elapsed


def check_bleu(results, name, tok_signature="tok:none"):
    for prefix, tok in (("tokenized_bleu", tok_signature), ("sacrebleu", "tok:13a")):
        with open(results / name / f"{prefix}.json", encoding="utf-8") as f:
            res = json.load(f)
        text = json.dumps(res)
        assert tok in text and "nrefs:1" in text, (name, prefix)
        report = (results / name / f"{prefix}.log").read_text()
        assert "sentence-level BLEU" in report and "document-level BLEU" in report
        assert report.count("signature: ") == 2
        assert (results / name / f"{prefix}.png").stat().st_size > 1000


def check_splits(d, src, tgt):
    for split in ("train", "valid", "test"):
        n = len((d / f"{split}.{src}").read_text(encoding="utf-8").splitlines())
        assert n > 0
        assert len((d / f"{split}.{tgt}").read_text(encoding="utf-8").splitlines()) == n
        assert len((d / f"{split}.docids").read_text(encoding="utf-8").splitlines()) == n


def check_maruf(work, src, tgt):
    check_splits(work / "docs", src, tgt)
    check_splits(work / "bpe", src, tgt)
    for split in ("train", "valid", "test"):
        assert (work / "data-bin" / f"{split}.docids").exists()
    assert (work / "tok" / f"truecase-model.{src}").stat().st_size > 0
    tag = "encoder-offline-sparse-soft"
    models = ("sentence", "context_aware", tag)  # smoke: BASELINES=context_aware
    for ckpt in models:
        assert (work / "checkpoints" / ckpt / "checkpoint_last.pt").exists()
    results = work / "results"
    n_suite = len((work / "suite" / "test.pronouns.jsonl").read_text().splitlines())
    assert n_suite > 0
    table = (results / "table.md").read_text()
    table_json = json.loads((results / "table.json").read_text())
    assert "| CXMI vs shuffled context (nats) |" in table.splitlines()[0]
    assert "| p vs transformer (sentences / documents) |" in table.splitlines()[0]
    for m in models:
        check_bleu(results, m)
        acc = json.loads((results / m / "contrastive_pronouns.json").read_text())["overall"]
        assert acc["n"] == n_suite
        assert f"| {m} |" in table and f"{acc['correct']}/{n_suite}" in table
        row = next(r for r in table.splitlines() if r.startswith(f"| {m} |"))
        cxmi = row.rstrip(" |").rsplit("| ", 1)[1]
        rec = table_json["models"][m]
        assert rec["contrastive_pronouns"]["n"] == n_suite
        if m == "sentence":  # sentence-level: no context to remove, no CXMI step
            assert cxmi == "-" and rec["cxmi_shuffled"] is None
            assert rec["paired_vs_transformer"] is None
            assert not (results / m / "cxmi").exists()
        else:  # every context model, the document memory included: a number
            cx = json.loads((results / m / "cxmi" / "cxmi.json").read_text())["shuffled"]
            n_test = len((work / "data-bin" / "test.docids").read_text().split())
            assert cx["tokens"] > n_test  # every reference token, </s> included
            assert cxmi == f"{cx['cxmi']:.4f}" and float(cxmi) == pytest.approx(cx["cxmi"], abs=1e-4)
            assert rec["cxmi_shuffled"] == {"cxmi": cx["cxmi"], "tokens": cx["tokens"]}
            # the paired bootstrap against the transformer (the test set's few documents:
            # no document-level p-value)
            pj = json.loads((results / m / "paired.json").read_text())
            assert rec["paired_vs_transformer"]["p_sentences"] == pj["sentences"]["p_value"]
            assert rec["paired_vs_transformer"]["p_documents"] is None
            assert (results / m / "cxmi" / "tokens.jsonl").stat().st_size > 0
    # stage 2 started from stage 1 and logged the context gate (label_smoothed_cross_entropy_ctx)
    train_log = (work / "logs" / f"train-{tag}.log").read_text()
    assert "init from sentence-level checkpoint" in train_log and "gate" in train_log
    ana = results / f"analysis-{tag}"
    assert "mean sentence support" in (ana / "support.log").read_text()
    assert (ana / "selective_support_test.png").stat().st_size > 1000
    assert any(p.name.startswith("line") for p in ana.iterdir())
    complexity = (results / "complexity.md").read_text()
    assert "| transformer |" in complexity and f"| {tag} |" in complexity
    assert "| ? |" not in complexity
    summary = (results / "summary.md").read_text()
    assert "smoke run" in summary and "signature: nrefs:1" in summary and table in summary


@pytest.fixture(scope="module")
def europarl_smoke(tmp_path_factory):
    # a test split of two speaker turns: CXMI's shuffled context comes from the other one
    return smoke("europarl_v7_en_de", tmp_path_factory.mktemp("europarl"),
                 env={"TEST_SENTENCES": "13"})


def test_europarl_smoke(europarl_smoke):
    work, r, elapsed = europarl_smoke
    print(f"europarl smoke: {elapsed:.0f}s")
    check_maruf(work, "en", "de")
    summary = json.loads((work / "docs.summary.json").read_text())
    assert summary["counts"]["<SPEAKER> boundaries"] == 12
    assert summary["counts"]["documents dropped: fewer than 6 sentences"] > 0
    assert summary["splits"]["valid"]["sentences"] <= 7 and summary["splits"]["test"]["sentences"] <= 13
    ids = (work / "docs" / "train.docids").read_text().split()
    assert all(".t" in i for i in ids)  # speaker turns: SESSION.tNNNN
    valid_ids = set((work / "docs" / "valid.docids").read_text().split())
    test_ids = set((work / "docs" / "test.docids").read_text().split())
    assert not (set(ids) & (valid_ids | test_ids)) and not valid_ids & test_ids
    assert len(test_ids) == 2


def test_rerun_skips_finished_steps(europarl_smoke, tmp_path):
    work, first, _ = europarl_smoke
    raw = work.parent.parent / "raw"
    mtimes = {p: os.path.getmtime(work / p) for p in files_under(work)
              if not p.startswith("results/summary")}
    r = run("europarl_v7_en_de", "--smoke", "--raw", str(raw), "--workdir", str(work.parent),
            env={"TEST_SENTENCES": "13"}, timeout=120)
    assert r.returncode == 0, r.stderr
    steps = [x.split("step ", 1)[1] for x in first.stderr.splitlines() if "] step " in x]
    assert len(steps) >= 12
    for s in steps:
        assert f"skip {s} (done" in r.stderr
    assert "] step " not in r.stderr
    assert {p: os.path.getmtime(work / p) for p in mtimes} == mtimes


@pytest.mark.slow
def test_news_commentary_smoke(tmp_path):
    work, r, elapsed = smoke("news_commentary_v11_en_de", tmp_path)
    print(f"news commentary smoke: {elapsed:.0f}s")
    check_maruf(work, "en", "de")
    ids = (work / "docs" / "test.docids").read_text().split()
    assert ids == ["newstest2016-doc0"] * 4 + ["newstest2016-doc1"] * 4  # the WMT docids
    assert set((work / "docs" / "train.docids").read_text().split()) == \
        {f"nc{i:05d}" for i in range(6)}


@pytest.mark.slow
def test_europarl_smoke_decoder_integration_online(tmp_path):
    """Bilingual context (decoder integration) decodes iteratively; online context."""
    work, r, _ = smoke("europarl_v7_en_de", tmp_path,
                       env={"INTEGRATION": "decoder", "DOC_CONTEXT": "online", "VARIANT": "word",
                            "BASELINES": "", "TEST_SENTENCES": "13"})
    tag = "decoder-online-word"
    check_bleu(work / "results", tag)
    assert (work / "generate" / f"{tag}.passes" / "generate-pass2.txt").exists()
    assert not (work / "checkpoints" / "context_aware").exists()
    table = (work / "results" / "table.md").read_text()
    assert f"| {tag} | transformer_selective_doc_dec: iterative decoding (2 passes); " \
        "pronouns scored and CXMI measured with the references as target context (an oracle) |" \
        in table
    # CXMI of the bilingual document memory against another document's memory
    cx = json.loads((work / "results" / tag / "cxmi" / "cxmi.json").read_text())
    assert cx["documents"] == 2
    assert table.splitlines()[3].endswith(f"| {cx['shuffled']['cxmi']:.4f} |")


@pytest.mark.slow
def test_opensubtitles_smoke(tmp_path):
    work, r, elapsed = smoke("opensubtitles2018_en_ru", tmp_path)
    print(f"opensubtitles smoke: {elapsed:.0f}s")
    check_splits(work / "docs", "en", "ru")
    summary = json.loads((work / "docs.summary.json").read_text())
    c = summary["counts"]
    assert c["links dropped: overlap below 0.9"] == 5 and c["runs ended: time gap above 7s"] > 0
    movie = lambda d: d.rsplit("/", 1)[0]  # noqa: E731
    movies = {s: {movie(d) for d in (work / "docs" / f"{s}.docids").read_text().split()}
              for s in ("train", "valid", "test")}
    assert not movies["train"] & (movies["valid"] | movies["test"])
    assert (work / "bpe" / "codes.en").exists() and (work / "bpe" / "codes.ru").exists()
    results = work / "results"
    check_bleu(results, "sentence")
    check_bleu(results, "context")
    # the paired bootstrap against the sentence-level transformer, in the summary's p column
    paired = json.loads((results / "context" / "paired.json").read_text())
    assert paired["baseline_file"].endswith("sentence.txt") and paired["sentences"]["segments"] > 0
    text = (results / "summary.md").read_text()
    part = text.split("## context/paired.log", 1)[1].split("## ", 1)[0]
    assert "BLEU baseline" in part and "p = " in part and "d-BLEU baseline" in part
    ana = results / "analysis-context"
    assert "| true - shuffled |" in (ana / "bleu.log").read_text()
    for ctx in ("none", "shuffled"):
        assert "signature: nrefs:1|case:mixed|eff:no|tok:none" in \
            (ana / f"tokenized_bleu_context_{ctx}.log").read_text()
    assert "attention to context" in (ana / "attention.log").read_text()
    for name in ("deixis_test", "lex_cohesion_test"):
        assert (results / "contrastive-sentence" / f"contrastive_{name}.json").exists()
        for label in (name, f"{name}_shuffled"):
            assert (results / "contrastive-context" / f"contrastive_{label}.json").exists()
            assert "accuracy" in (results / "contrastive-context" / f"{label}.log").read_text()
        assert "shuffled" in (results / "contrastive-context" / f"{name}_shuffled.log").read_text()
    assert "init from sentence-level checkpoint" in (work / "logs" / "train-context.log").read_text()
    # without contrastive sets, --smoke says that it skips them (and keeps no old results)
    raw = tmp_path / "raw"
    shutil.rmtree(raw / "contrastive")
    for step in ("suites", "contrastive"):
        (work / ".done" / step).unlink()
    r = run("opensubtitles2018_en_ru", "--smoke", "--raw", str(raw), "--workdir", str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "smoke: no contrastive test sets in" in r.stderr
    assert "the contrastive evaluation is SKIPPED" in r.stderr
    assert not (results / "contrastive-context").exists() and not (work / "suites").exists()


def test_opensubtitles_missing_suites_stop_before_any_step(tmp_path):
    """Outside --smoke the contrastive sets named in SUITES must be there: checked
    before the first step, naming the files and where they are expected."""
    raw = tmp_path / "raw"
    opensubtitles(str(raw))  # deixis_test and lex_cohesion_test only
    work = tmp_path / "w"
    r = run("opensubtitles2018_en_ru", "--raw", str(raw), "--workdir", str(work), timeout=120)
    assert r.returncode == 1
    assert f"expected as {raw / 'contrastive'}/SUITE.json" in r.stderr, r.stderr
    assert "missing: ellipsis_infl.json ellipsis_vp.json" in r.stderr
    assert "] step " not in r.stderr and os.listdir(work / ".done") == []
    r = run("opensubtitles2018_en_ru", "--raw", str(raw), "--workdir", str(work),
            env={"SUITES": ""}, timeout=120)
    assert r.returncode == 1 and "SUITES is empty" in r.stderr


def test_opensubtitles_download_is_staged(tmp_path):
    """The download goes to raw.part/ and becomes raw/ only when complete; a
    failed download keeps the finished files in raw.part/ for the next run."""
    import gzip

    srv = tmp_path / "srv"
    (srv / "opus" / "xml").mkdir(parents=True)
    (srv / "suites").mkdir()
    with gzip.open(srv / "opus" / "xml" / "en-ru.xml.gz", "wb") as f:
        f.write(b"not an alignment\n")
    (srv / "opus" / "xml" / "en.zip").write_bytes(b"EN")
    for s in ("deixis_test", "lex_cohesion_test"):
        (srv / "suites" / f"{s}.json").write_text("[]")
    env = {"OPUS_URL": f"file://{srv}/opus", "SUITES_URL": f"file://{srv}/suites",
           "SUITES": "deixis_test lex_cohesion_test"}
    work = tmp_path / "w"
    r = run("opensubtitles2018_en_ru", "--workdir", str(work), env=env, timeout=120)
    assert r.returncode == 1 and "step download failed" in r.stderr
    assert f"cannot download file://{srv}/opus/xml/ru.zip" in r.stderr
    assert not (work / "raw").exists()
    # each fetched file with the URL it came from
    assert files_under(work / "raw.part") == ["opus/en-ru.xml.gz", "opus/en-ru.xml.gz.url",
                                              "opus/en.zip", "opus/en.zip.url"]
    (srv / "opus" / "xml" / "ru.zip").write_bytes(b"RU")
    r = run("opensubtitles2018_en_ru", "--workdir", str(work), env=env, timeout=120)
    # the download completes; prep then refuses the stand-in alignment
    assert "step prep failed" in r.stderr and (work / ".done" / "download").exists(), r.stderr
    assert not (work / "raw.part").exists()
    # the contrastive sets are fetched by their own step (download-suites, before
    # the suites step: adding one to SUITES redoes only those steps)
    assert files_under(work / "raw") == ["opus/en-ru.xml.gz", "opus/en-ru.xml.gz.url",
                                         "opus/en.zip", "opus/en.zip.url", "opus/ru.zip",
                                         "opus/ru.zip.url"]
    marker = (work / ".done" / "download").read_text()
    assert f"arg.1=file://{srv}/opus" in marker and "SUITES" not in marker


def test_maruf_models_are_checked_before_any_step(tmp_path):
    """A misspelt model stops the recipe before the first step of the pipeline."""
    raw = tmp_path / "raw"
    news_commentary(str(raw))
    for env, msg in (({"VARIANTS": "encoder-sometimes-sparse-soft"},
                      "expected encoder-offline-... or encoder-online-..."),
                     ({"BASELINES": "han context"}, "BASELINES: context: expected"),
                     ({"BASELINES": "", "VARIANTS": ""}, "VARIANTS and BASELINES are both empty"),
                     ({"VARIANTS": "decoder-online-word", "INTEGRATION": "encoder"},
                      "VARIANTS and INTEGRATION/DOC_CONTEXT/VARIANT are both set"),
                     ({"UNTIL": "train"}, "UNTIL=train: expected data"),
                     ({"CONTRAPRO": str(tmp_path / "none.json")}, "none.json: no such file")):
        r = run("news_commentary_v11_en_de", "--smoke", "--raw", str(raw), "--workdir",
                str(tmp_path / "w"), env=env, timeout=120)
        assert r.returncode == 1 and msg in r.stderr, r.stderr[-2000:]
        assert "step truecase" not in r.stderr


def contrapro_suite(path):
    """A ContraPro-format suite (contrapro.json and the files of
    json2text_and_context.pl -c 3) in raw text, from the test sentences."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from suite_fixtures import write_contrapro

    examples = []
    for i, (pron, others) in ((3, ("er", ("sie", "es"))), (6, ("sie", ("er", "es"))),
                              (8, ("es", ("er", "sie")))):
        ref = sentence("de", i)
        words = ref.split()
        first = words[0]
        cap = first[0].isupper()
        alts = [" ".join([(o.capitalize() if cap else o), *words[1:]]) for o in others[1]]
        examples.append({"src": sentence("en", i), "ref": ref, "contrastive": alts,
                         "ctx_src": [sentence("en", i - k) for k in (3, 2, 1)],
                         "ctx_tgt": [sentence("de", i - k) for k in (3, 2, 1)],
                         "distance": 1, "category": f"it:{pron}", "pos": 3})
    os.makedirs(path, exist_ok=True)
    return write_contrapro(os.path.join(path, "contrapro"), examples, 3)


@pytest.mark.slow
def test_news_commentary_smoke_baselines_and_contrapro(tmp_path):
    """The paper's baselines (Zhang et al. 2018; HAN, trained from the HAN
    encoder and decoded iteratively) and ContraPro scoring of every online
    model from raw text (an offline model is not scored: logged)."""
    suite = contrapro_suite(str(tmp_path / "contrapro"))
    work, r, _ = smoke("news_commentary_v11_en_de", tmp_path,
                       env={"BASELINES": "zhang2018 han", "CONTRAPRO": suite,
                            "VARIANTS": "encoder-online-sparse-soft encoder-offline-word"})
    order = [x.split("step train_", 1)[1] for x in r.stderr.splitlines() if "] step train_" in x]
    assert order == ["sentence", "zhang2018_enc", "zhang2018_dec", "han_enc", "han",
                     "encoder-online-sparse-soft", "encoder-offline-word"]
    for m, integ in (("zhang2018_enc", "encoder"), ("zhang2018_dec", "decoder")):
        assert f"arg=--context-integration\narg={integ}\n" in \
            (work / "checkpoints" / m / "train.args").read_text()
    assert "init from sentence-level checkpoint" in (work / "logs" / "train-han.log").read_text()
    assert (work / "generate" / "han.passes" / "generate-pass2.txt").exists()
    table = (work / "results" / "table.md").read_text()
    for m in ("sentence", "zhang2018_enc", "zhang2018_dec", "han_enc", "han",
              "encoder-online-sparse-soft"):
        res = json.loads((work / "results" / m / "contrastive_contrapro.json").read_text())
        assert res["overall"]["n"] == 3, m
        assert f"| {m} |" in table
    assert not (work / "results" / "encoder-offline-word" / "contrastive_contrapro.json").exists()
    assert "encoder-offline-word: not scored on ContraPro" in r.stderr
    assert "ContraPro accuracy" in table and "not scored" in table
    assert "ContraPro scored with only the previous sentences ContraPro gives" in table
    # Table 5: the selective model's parameters without its frozen copy of stage 1
    complexity = {row.split("|")[1].strip(): row.split("|")[2].strip()
                  for row in (work / "results" / "complexity.md").read_text().splitlines()[2:]}
    n = {k: int(v.replace(",", "")) for k, v in complexity.items()}
    assert n["transformer"] < n["encoder-online-sparse-soft"] < 1.5 * n["transformer"]
    # a later run with another model keeps the earlier ones in the table
    r2 = run("news_commentary_v11_en_de", "--smoke", "--raw", str(tmp_path / "raw"), "--workdir",
             str(tmp_path / "w"), env={"BASELINES": "", "VARIANTS": "encoder-online-word",
                                       "CONTRAPRO": suite})
    assert r2.returncode == 0, r2.stderr[-3000:]
    table2 = (work / "results" / "table.md").read_text()
    for m in ("sentence", "zhang2018_enc", "han", "encoder-online-sparse-soft", "encoder-online-word"):
        assert f"| {m} |" in table2


def lib_call(tmp_path, script):
    """Run SCRIPT after sourcing recipe.sh (with a work directory)."""
    lib = os.path.join(REPO, "recipes", "lib", "recipe.sh")
    return subprocess.run(["bash", "-c", f'set -euo pipefail; RECIPE_NAME=t; . "{lib}"; '
                           f'recipe_init --workdir "{tmp_path}/w"; {script}'],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHON=sys.executable))


def test_write_if_changed_writes_nothing_on_failure(tmp_path):
    out = tmp_path / "t.md"
    out.write_text("old\n")
    r = lib_call(tmp_path, f'f() {{ echo partial; false; echo more; }}; ctx_write_if_changed "{out}" f')
    assert r.returncode == 1 and f"writing {out} failed" in r.stderr
    assert out.read_text() == "old\n" and not (tmp_path / "t.md.part").exists()
    r = lib_call(tmp_path, f'f() {{ echo new; }}; ctx_write_if_changed "{out}" f')
    assert r.returncode == 0 and out.read_text() == "new\n"


def test_results_table_cxmi_column(tmp_path):
    """table.md and table.json: CXMI against shuffled context per context model
    (4 decimals in the markdown, exact in the JSON), "-" for the sentence-level
    model, "not measured" for a context model without ctx-cxmi's output."""
    sig = "nrefs:1|case:mixed|eff:no|tok:none|smooth:exp|version:2.4.0"
    for m, bleu in (("sentence", 10.0), ("context_aware", 11.25), ("han_enc", 9.5)):
        d = tmp_path / "w" / "results" / m
        d.mkdir(parents=True)
        for prefix in ("tokenized_bleu", "sacrebleu"):
            (d / f"{prefix}.json").write_text(json.dumps({
                level: {"bleu": bleu, "signature": sig}
                for level in ("sentence_level", "document_level")}))
        (d / "contrastive_pronouns.json").write_text(json.dumps(
            {"overall": {"accuracy": 0.5, "correct": 2, "n": 4, "ties": 0}}))
    (tmp_path / "w" / "results" / "context_aware" / "paired.json").write_text(json.dumps(
        {"sentences": {"p_value": 0.0123, "delta": 1.25},
         "documents": {"p_value": 0.0004, "segments": 12}}))
    (tmp_path / "w" / "results" / "context_aware" / "cxmi").mkdir()
    (tmp_path / "w" / "results" / "context_aware" / "cxmi" / "cxmi.json").write_text(json.dumps(
        {"documents": 3, "shuffled": {"cxmi": 0.123456, "tokens": 321, "logprob_per_token": -2.0}}))
    specs = "sentence=transformer context_aware=transformer_context_aware han_enc=transformer_han_enc"
    r = lib_call(tmp_path, f"ctx_results_table md {specs}")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].endswith("| p vs transformer (sentences / documents) |"
                             " pronoun suite accuracy % (correct/n, ties) |"
                             " CXMI vs shuffled context (nats) |")
    assert lines[1].count("|") == lines[0].count("|")
    assert lines[2] == ("| sentence | transformer | 10.00 | 10.00 | 10.00 | 10.00 | - "
                        "| 50.0 (2/4, 0) | - |")
    assert lines[3] == ("| context_aware | transformer_context_aware | 11.25 | 11.25 | 11.25 "
                        "| 11.25 | 0.012 / <0.001 | 50.0 (2/4, 0) | 0.1235 |")
    assert lines[4].endswith("| not measured | 50.0 (2/4, 0) | not measured |")
    r = lib_call(tmp_path, f"ctx_results_table json {specs}")
    assert r.returncode == 0, r.stderr
    table = json.loads(r.stdout)
    assert table["columns"][-1] == "cxmi_shuffled"
    assert table["models"]["sentence"]["cxmi_shuffled"] is None
    assert table["models"]["context_aware"]["cxmi_shuffled"] == {"cxmi": 0.123456, "tokens": 321}
    assert table["models"]["han_enc"]["cxmi_shuffled"] == "not measured"
    assert table["models"]["context_aware"]["paired_vs_transformer"]["p_documents"] == 0.0004
    assert table["models"]["han_enc"]["paired_vs_transformer"] == "not measured"
    assert table["models"]["context_aware"]["tokenized_bleu_sentence_level"] == 11.25
    assert table["signatures"]["sacrebleu"] == [sig]
    # one test document: no other document to shuffle from, no number
    (tmp_path / "w" / "results" / "han_enc" / "cxmi").mkdir()
    (tmp_path / "w" / "results" / "han_enc" / "cxmi" / "cxmi.json").write_text(json.dumps(
        {"documents": 1, "shuffled": {"cxmi": 0.0, "tokens": 50, "logprob_per_token": -2.0}}))
    r = lib_call(tmp_path, f"ctx_results_table md {specs}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[4].endswith("| 50.0 (2/4, 0) | n/a (1 test document) |")
    r = lib_call(tmp_path, f"ctx_results_table json {specs}")
    rec = json.loads(r.stdout)["models"]["han_enc"]["cxmi_shuffled"]
    assert rec["cxmi"] is None and "one document" in rec["reason"]


def test_table_lists_earlier_models_and_skips_unknown_names(tmp_path):
    for m in ("sentence", "encoder-online-word", "zhang2018", "analysis-encoder-online-word"):
        d = tmp_path / "w" / "results" / m
        d.mkdir(parents=True)
        (d / "tokenized_bleu.json").write_text("{}")
    r = lib_call(tmp_path, "DOC_MODELS=(han_enc); ctx_maruf_models")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["sentence", "han_enc", "encoder-online-word"]
    assert "results/zhang2018: not a model of this pipeline" in r.stderr
