"""The recipes' Python helpers, once heredocs in recipes/lib/steps_{sentence,context}.sh:
text extraction (ctx_fairseq.prep.recipe_text: extract, xml-sets) and scoring
and reports (ctx_fairseq.eval.scoring.recipe_report: evaluate, bylength, summary,
complexity, results-table); bad input on either command line is one line,
``PROG: error: ...``, exit status 2, no traceback."""

import json
import os
import subprocess
import sys

import pytest

from ctx_fairseq.errors import InputError
from ctx_fairseq.eval.scoring import recipe_report as rr
from ctx_fairseq.prep import recipe_text as rt
from ctx_fairseq.data.docids import DocFileError as PrepDocsError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(path, text):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return str(path)


def read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def iwslt_xml(lang, docs):
    """An IWSLT-style XML file: docs = [(docid, [segment text, ...]), ...]."""
    out = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", f'<srcset setid="x" srclang="{lang}">']
    for docid, segs in docs:
        out += [f'<doc docid="{docid}" genre="lectures">', "<url>http://x</url>",
                f"<talkid>{docid}</talkid>", "<title>A &amp; B</title>"]
        out += [f'<seg id="{i}"> {s} </seg>' for i, s in enumerate(segs, 1)]
        out.append("</doc>")
    return "\n".join(out + ["</srcset>", "</mteval>"]) + "\n"


# ---------------------------------------------------------------- extraction


def test_read_sentence_lines(tmp_path):
    p = write(tmp_path / "a.txt", "\ufeffone\r\ntwo\rhalves\n\nlast")
    assert rt.read_sentence_lines(p) == ["one", "two halves", "", "last"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\n")
    with pytest.raises(PrepDocsError, match=r"bad.txt:2: not UTF-8"):
        rt.read_sentence_lines(str(bad))


def test_extract_plain_drop_empty_and_max_lines(tmp_path, capsys):
    s = write(tmp_path / "raw" / "t.es", "  uno \ndos\n\ntres\ncuatro\n")
    t = write(tmp_path / "raw" / "t.en", "one\n two\nthree\n\nfour\n")
    out = str(tmp_path / "text" / "train")
    info = rt.extract(out, "es", "en", [f"plain:{s}"], [f"plain:{t}"], drop_empty=True, max_lines=2)
    assert read(out + ".es") == "uno\ndos\n" and read(out + ".en") == "one\ntwo\n"
    assert info == {"split": "train", "sentences": 2, "dropped_empty_pairs": 2,
                    "parts": [{"src": f"plain:{s}", "tgt": f"plain:{t}", "sentences": 5}],
                    "smoke_max_lines": 2}
    assert json.loads(read(out + ".json")) == info
    assert "2 sentence pairs (2 pairs with an empty side dropped)" in capsys.readouterr().err
    # without --drop-empty the empty sides stay, line-aligned
    rt.extract(out, "es", "en", [f"plain:{s}"], [f"plain:{t}"])
    assert read(out + ".es").split("\n")[2:4] == ["", "tres"]
    assert not [p for p in os.listdir(tmp_path / "text") if p.endswith(".part")]


def test_extract_tags_xml_sgm_aspec(tmp_path):
    tags = "<url>u</url>\n<talkid>7</talkid>\n<title>T</title>\n{a}\n{b}\n<talkid>8</talkid>\n{c}\n"
    ts = write(tmp_path / "train.tags.es-en.es", tags.format(a=" hola ", b="a\rb", c="fin"))
    tt = write(tmp_path / "train.tags.es-en.en", tags.format(a="hello", b="", c="end"))
    xs = write(tmp_path / "x.es.xml", iwslt_xml("es", [("1", ["a &amp; b", "&lt;c&gt;"]),
                                                       ("2", ["it&apos;s"])]))
    xt = write(tmp_path / "x.en.xml", iwslt_xml("en", [("1", ["A", "B"]), ("2", ["C"])]))
    sgm = ('<refset setid="t" srclang="any" trglang="{l}">\n<doc sysid="ref" docid="d1">\n'
           '<seg id="1">{a}</seg>\n<seg id="2">{b}</seg>\n</doc>\n</refset>\n')
    gs = write(tmp_path / "t.en.sgm", sgm.format(l="en", a="AT&T &amp; &quot;x&quot;", b="&#39;y&nbsp;"))
    gt = write(tmp_path / "t.de.sgm", sgm.format(l="de", a="eins", b="zwei"))
    asp = write(tmp_path / "train-1.txt", "0.9 ||| A-0 ||| 0 ||| ja ja ||| en en\nB ||| 1 ||| j2 ||| e2\n")
    out = str(tmp_path / "out" / "all")
    info = rt.extract(out, "es", "en", [f"tags:{ts}", f"xml:{xs}", f"sgm:{gs}", f"aspec-ja:{asp}"],
                      [f"tags:{tt}", f"xml:{xt}", f"sgm:{gt}", f"aspec-en:{asp}"])
    # metadata lines are not text; a stray \r is a space; the five XML entities
    # unescaped (in .sgm only those: &#39; and &nbsp; stay as they are)
    assert read(out + ".es").splitlines() == [
        "hola", "a b", "fin", "a & b", "<c>", "it's", 'AT&T & "x"', "&#39;y&nbsp;", "ja ja", "j2"]
    assert read(out + ".en").splitlines() == [
        "hello", "", "end", "A", "B", "C", "eins", "zwei", "en en", "e2"]
    assert [p["sentences"] for p in info["parts"]] == [3, 3, 2, 2]


@pytest.mark.parametrize("src,tgt,message", [
    ("nope:{p}", "plain:{p}", "unknown part kind 'nope'"),
    ("xml:{x}", "plain:{p}", "xml and plain in one part"),
    ("plain:{p}", "plain:{short}", "has 2 sentences, plain:"),
    ("aspec-ja:{p}", "aspec-en:{p}", "expected 'ID ||| NO ||| Japanese ||| English'"),
    ("xml:{x}", "xml:{x2}", "expected segment id 1"),
    ("plain:{missing}", "plain:{p}", "cannot read"),
])
def test_extract_errors(src, tgt, message, tmp_path):
    files = {"p": write(tmp_path / "p.txt", "a\nb\n"), "short": write(tmp_path / "s.txt", "a\n"),
             "x": write(tmp_path / "x.xml", iwslt_xml("en", [("1", ["a"])])),
             "x2": write(tmp_path / "x2.xml",
                         iwslt_xml("de", [("1", ["a"])]).replace('<seg id="1">', '<seg id="9">')),
             "missing": str(tmp_path / "missing.txt")}
    with pytest.raises(InputError, match=message):
        rt.extract(str(tmp_path / "o" / "t"), "en", "de", [src.format(**files)], [tgt.format(**files)])
    assert not os.path.exists(tmp_path / "o")


def test_extract_no_sentences_and_part_counts(tmp_path):
    p = write(tmp_path / "p.txt", "\n")
    with pytest.raises(InputError, match="no sentences"):
        rt.extract(str(tmp_path / "t"), "en", "de", [f"plain:{p}"], [f"plain:{p}"], drop_empty=True)
    with pytest.raises(InputError, match="as many --src parts as --tgt parts"):
        rt.extract(str(tmp_path / "t"), "en", "de", [f"plain:{p}"], [])


def test_xml_sets(tmp_path, capsys):
    a = [write(tmp_path / f"a.{l}.xml", iwslt_xml(l, [("1", ["x", "y"]), ("2", ["z"])])) for l in ("en", "de")]
    b = [write(tmp_path / f"b.{l}.xml", iwslt_xml(l, [("3", ["w"])])) for l in ("en", "de")]
    out = str(tmp_path / "docs" / "valid")
    assert rt.xml_sets(out, "en", "de", [*a, *b]) == (3, 4)
    assert read(out + ".docids") == "1\n1\n2\n3\n" and read(out + ".de") == "x\ny\nz\nw\n"
    assert rt.xml_sets(out, "en", "de", [*a, *b], max_docs=2) == (2, 3)
    assert read(out + ".docids") == "1\n1\n2\n"
    with pytest.raises(PrepDocsError, match="expected at least 4"):
        rt.xml_sets(out, "en", "de", [*a, *b], max_docs=4)
    with pytest.raises(PrepDocsError, match="document 1 is also in"):
        rt.xml_sets(out, "en", "de", [*a, *a])
    with pytest.raises(InputError, match="SRC_XML TGT_XML pairs"):
        rt.xml_sets(out, "en", "de", [a[0]])
    rt.main(["xml-sets", out, "en", "de", "0", *b])
    assert capsys.readouterr().out == f"ctx-prep-docs: 1 documents, 1 sentences -> {out}.{{en,de,docids}}\n"


# ---------------------------------------------------------------- scoring


def generate_output(path, hyps, refs):
    lines = []
    for i, (h, r) in enumerate(zip(hyps, refs)):
        lines += [f"S-{i}\tsrc {i}", f"T-{i}\t{r}", f"H-{i}\t-0.{i + 1}\t{h}", f"D-{i}\t-0.{i + 1}\t{h}"]
    return write(path, "\n".join(lines) + "\n")


REFS = ["The cat sat on the mat.", "It's a dog, isn't it?", "Hello world."]
TOK_REFS = ["The cat sat on the mat .", "It 's a dog , isn 't it ?", "Hello world ."]


def test_evaluate(tmp_path, capsys):
    ref = write(tmp_path / "text" / "test.en", "".join(r + "\n" for r in REFS))
    tok_ref = write(tmp_path / "tok" / "test.en", "".join(r + "\n" for r in TOK_REFS))
    gen = generate_output(tmp_path / "gen.txt", TOK_REFS, TOK_REFS)
    out = str(tmp_path / "res")
    res = rr.evaluate(gen, ref, "en", out, "TITLE", detok=True, tok_ref=tok_ref,
                      tok_label="multi-bleu", meta=["model=m", "smoke=1"])
    assert read(os.path.join(out, "hyp.tok")).splitlines() == TOK_REFS
    assert read(os.path.join(out, "hyp.detok")).splitlines() == REFS
    assert res["sacrebleu"]["score"] == 100.0 and res["tokenized_bleu"]["score"] == 100.0
    assert res["sacrebleu"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "tok:none" in res["tokenized_bleu"]["signature"] and res["tokenized_bleu"]["label"] == "multi-bleu"
    assert res["model"] == "m" and res["sentences"] == 3
    assert json.loads(read(os.path.join(out, "bleu.json"))) == res
    text = read(os.path.join(out, "bleu.txt"))
    assert text.startswith("TITLE\nsacreBLEU, sacremoses-detokenised hypotheses") and "tokenized BLEU (multi-bleu;" in text
    assert capsys.readouterr().out == text
    # a corpus distributed tokenised: scored as it is, no tokenized BLEU
    res = rr.evaluate(gen, tok_ref, "en", out, "T2", detok=False)
    assert read(os.path.join(out, "hyp.detok")).splitlines() == TOK_REFS
    assert res["tokenized_bleu"] is None and "tokenized BLEU" not in read(os.path.join(out, "bleu.txt"))


def test_read_hypotheses_checks(tmp_path):
    ref = write(tmp_path / "ref", "a\nb\nc\n")
    with pytest.raises(InputError, match=r"hypotheses for 2 sentences, the test set .* has 3; missing ids \[2\]"):
        rr.read_hypotheses(generate_output(tmp_path / "g1", ["a", "b"], ["a", "b"]), ref)
    with pytest.raises(InputError, match="still hold subword_nmt BPE markers"):
        rr.read_hypotheses(generate_output(tmp_path / "g2", ["a@@ b", "b", "c"], ["a", "b", "c"]), ref)
    with pytest.raises(InputError, match="no hypotheses"):
        rr.read_hypotheses(write(tmp_path / "g3", "hello\n"), ref)
    with pytest.raises(InputError, match="cannot read"):
        rr.read_hypotheses(str(tmp_path / "none"), ref)
    with pytest.raises(InputError, match="has 3 lines, the test set 2"):
        rr.evaluate(generate_output(tmp_path / "g4", ["a", "b"], ["a", "b"]),
                    write(tmp_path / "r2", "a\nb\n"), "en", str(tmp_path / "o"), "t", False, tok_ref=ref)


def test_by_length(tmp_path):
    src = write(tmp_path / "bpe.es", "a b\nc d e\nf\n")
    ref = write(tmp_path / "ref.en", "".join(r + "\n" for r in REFS))
    gen = generate_output(tmp_path / "gen.txt", TOK_REFS, TOK_REFS)
    hyp = write(tmp_path / "hyp.detok", "".join(r + "\n" for r in REFS))
    out = str(tmp_path / "by_length")
    paths = rr.by_length(src, ref, out, [f"Sys|{gen}|{hyp}"])
    assert set(paths) == {"md", "json", "png"}
    assert read(os.path.join(out, "Sys.by-length-input.txt")).splitlines()[:3] == [
        "S-0\ta b", f"T-0\t{REFS[0]}", f"H-0\t-0.1\t{REFS[0]}"]
    result = json.loads(read(paths["json"]))
    assert result["bleu"]["Sys"]["<10"] == pytest.approx(100.0)
    with pytest.raises(InputError, match="expected LABEL|GENERATE_OUTPUT|HYPOTHESES"):
        rr.by_length(src, ref, out, [f"Sys|{gen}"])
    short = write(tmp_path / "h2", "a\nb\n")
    with pytest.raises(InputError, match="3 sources, 3 references, 2 hypotheses"):
        rr.by_length(src, ref, out, [f"Sys|{gen}|{short}"])


# ---------------------------------------------------------------- summary


def bleu_json(path, score, tok=None, sig="nrefs:1|tok:13a"):
    write(path, json.dumps({"sacrebleu": {"score": score, "signature": sig},
                            "tokenized_bleu": None if tok is None else {"score": tok},
                            "checkpoint": "ckpt.pt"}))


def test_format_p_and_train_params(tmp_path):
    assert [rr.format_p(p) for p in (None, 0.0004, 0.001, 0.25)] == ["n/a", "<0.001", "0.001", "0.250"]
    log = write(tmp_path / "train.log", "num. model params: 1,000 (num. trained: 1,000)\n"
                                        "num. shared model params: 2,500,000 (num. trained: 10)\n")
    assert rr.train_params(log) == 2_500_000 and rr.train_params(str(tmp_path / "none")) is None


def test_summary(tmp_path, capsys):
    work = str(tmp_path)
    bleu_json(tmp_path / "results" / "es-en" / "transformer" / "bleu.json", 20.0, 21.5)
    bleu_json(tmp_path / "results" / "es-en" / "enc-dc" / "bleu.json", 22.25, 23.0)
    write(tmp_path / "results" / "es-en" / "enc-dc" / "paired.json",
          json.dumps({"sentences": {"p_value": 0.0004}}))
    for f, score in (("5", 19.0), ("3", 18.0)):
        bleu_json(tmp_path / "results" / "es-en" / f"k{f}" / "bleu.json", score)
    write(tmp_path / "logs" / "train-es-en.enc-dc.log", "num. model params: 1,230,000\n")
    write(tmp_path / "bin" / "dict.es.txt", "a 1\nb 1\n")
    write(tmp_path / "analysis" / "probe" / "enc-dc" / "probe.json", json.dumps({"tasks": [
        {"task": "bigram_shift", "accuracy": 0.75, "majority_accuracy": 0.5},
        {"task": "word_content", "accuracy": 0.5, "majority_accuracy": 0.25}]}))
    models = ["transformer|Transformer|main|dc", "enc-dc|Enc-DC|main|dc", "k5|K5|kernel=5|dc",
              "k3|K3|kernel=3|dc", "nope|Nope|main|dc"]
    lines = rr.summary(work, "recipe", "The paper.", models, "es-en en-es", tok_label="multi-bleu",
                       smoke=True, also=["kernel=2:enc-dc"])
    md = read(tmp_path / "results" / "summary.md")
    assert md == "\n".join(lines) + "\n" and capsys.readouterr().out == md
    assert md.startswith("# recipe: results\n\n**Smoke run**")
    assert "| es-en | transformer | Transformer | dc | ? | 20.00 | 21.50 | - |" in md
    assert "| es-en | enc-dc | Enc-DC | dc | 1.23M | 22.25 | 23.00 | <0.001 |" in md
    kernel = md[md.index("## Enc-DC by CNN kernel size"):]
    assert [row.split(" | ")[1] for row in kernel.splitlines()[4:7]] == ["enc-dc", "k3", "k5"]
    assert "| es-en | k3 | K3 | dc | 3 | ? | 18.00 | - | not measured |" in kernel
    assert "Dictionaries (types incl. fairseq's 4 special symbols): bin/dict.es.txt 6" in md
    assert "| bigram_shift | 75.00 (50.00) |" in md and "| Surface | 50.00 (1/2 tasks) |" in md
    assert "- `analysis/kernel_size_bleu.png`" in md
    assert os.path.getsize(tmp_path / "analysis" / "kernel_size_bleu.png") > 1000
    js = json.loads(read(tmp_path / "results" / "summary.json"))
    assert js["smoke"] is True and len(js["results"]) == 5 and js["dictionaries"] == {"bin/dict.es.txt": 6}
    with pytest.raises(InputError, match="expected ID|LABEL|FAMILY|GROUP"):
        rr.summary(work, "r", "p", ["a|b|c"], "es-en")


# ---------------------------------------------------------------- document-level tables


def test_complexity_table(tmp_path):
    import torch

    save = tmp_path / "ckpt"
    save.mkdir()
    torch.save({"model": {"encoder.w": torch.zeros(3, 4), "decoder.b": torch.zeros(5),
                          "encoder.memory_encoder.w": torch.zeros(100)}},
               str(save / "checkpoint_last.pt"))
    train = write(tmp_path / "train.log",
                  "num. shared model params: 1,234 (num. trained: 17)\n"
                  "2024 | INFO | train_inner | epoch 001:  loss=3, wps=100, ups=1\n"
                  "2024 | INFO | train | epoch 001 | loss 3 | wps 300 | ups 1\n"
                  "2024 | INFO | valid | epoch 001 | wps 99999\n")
    gen = write(tmp_path / "gen.log", "Translated 2 sentences (30 tokens) in 1.0s\n"
                                      "Translated 2 sentences (1,200 tokens) in 2.0s\n")
    lines = rr.complexity_table([f"model a={train}:{gen}:{save}"])
    assert lines[0].startswith("| model | parameters (without the frozen memory copy) |")
    assert lines[2] == "| model a | 17 | 17 | 200 | 400 |"
    with pytest.raises(InputError, match="no checkpoint_best.pt or checkpoint_last.pt"):
        rr.complexity_table([f"m={train}:{gen}:{tmp_path}"])
    with pytest.raises(InputError, match="expected LABEL=TRAIN_LOG:GENERATE_LOG:SAVE_DIR"):
        rr.complexity_table([f"m={train}"])
    with pytest.raises(InputError, match="cannot read"):
        rr.complexity_table([f"m={tmp_path}/none.log:{gen}:{save}"])


def test_results_table(tmp_path):
    """The results tables' cells (the recipe-level test, test_recipes_context.py's
    test_results_table_cxmi_column, runs them through ctx_results_table)."""
    sig = "nrefs:1|tok:none"
    for m, b in (("sentence", 10.0), ("ctx", 11.256), ("old", 9.0)):
        for prefix in ("tokenized_bleu", "sacrebleu"):
            write(tmp_path / m / f"{prefix}.json", json.dumps(
                {lv: {"bleu": b, "signature": sig} for lv in ("sentence_level", "document_level")}))
    write(tmp_path / "ctx" / "contrastive_contrapro.json", json.dumps(
        {"overall": {"accuracy": None, "correct": 0, "n": 0, "ties": 0}}))
    write(tmp_path / "ctx" / "paired.json", json.dumps(
        {"sentences": {"p_value": 0.5, "delta": 0.1, "note": "few documents"}, "documents": None}))
    write(tmp_path / "ctx" / "cxmi" / "cxmi.json", json.dumps({"documents": 1, "shuffled": None}))
    specs = ["sentence=transformer", "ctx=transformer_context_aware: a=b", "old=x"]
    md = rr.results_table(str(tmp_path), "md", specs).splitlines()
    assert md[0].endswith("| p vs transformer (sentences / documents) | ContraPro accuracy % "
                          "(correct/n, ties) | CXMI vs shuffled context (nats) |")
    assert md[2] == "| sentence | transformer | 10.00 | 10.00 | 10.00 | 10.00 | - | not scored | - |"
    assert md[3] == ("| ctx | transformer_context_aware: a=b | 11.26 | 11.26 | 11.26 | 11.26 "
                     "| 0.500 / n/a | - (0/0, 0) | n/a (1 test document) |")
    assert md[4].endswith("| not measured | not scored | not measured |")
    assert md[5:] == ["", f"- tokenized BLEU signature (sentence and document level): {sig}",
                      f"- sacreBLEU signature (sentence and document level): {sig}"]
    js = json.loads(rr.results_table(str(tmp_path), "json", specs))
    assert js["columns"][-2:] == ["contrastive_contrapro", "cxmi_shuffled"]
    rec = js["models"]["ctx"]
    assert rec["paired_vs_transformer"] == {"p_sentences": 0.5, "p_documents": None, "delta": 0.1,
                                            "documents": None, "note": "few documents"}
    assert rec["cxmi_shuffled"]["cxmi"] is None and rec["tokenized_bleu_sentence_level"] == 11.256
    assert js["models"]["sentence"]["paired_vs_transformer"] is None
    with pytest.raises(InputError, match=r"missing.*tokenized_bleu.json: cannot read"):
        rr.results_table(str(tmp_path), "md", ["missing=x"])
    with pytest.raises(InputError, match="expected MODEL=LABEL"):
        rr.results_table(str(tmp_path), "md", ["sentence"])


# ---------------------------------------------------------------- command lines


def run_module(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))


def error_lines(stderr):
    """stderr without the log lines importing fairseq prints."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("INFO:")]


@pytest.mark.parametrize("module,args,message", [
    ("ctx_fairseq.prep.recipe_text", ["extract", "--out-prefix", "{tmp}/t", "--l1", "a", "--l2", "b",
                                      "--src", "plain:{tmp}/none.txt", "--tgt", "plain:{tmp}/none.txt"],
     "none.txt: cannot read"),
    ("ctx_fairseq.eval.scoring.recipe_report", ["results-table", "{tmp}", "md", "sentence=x"],
     "tokenized_bleu.json: cannot read"),
], ids=["recipe_text", "recipe_report"])
def test_bad_input_is_one_line(module, args, message, tmp_path):
    r = run_module(module, *[a.format(tmp=tmp_path) for a in args])
    lines = error_lines(r.stderr)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 and lines[0].startswith(f"python -m {module}: error: ") and message in lines[0], lines


@pytest.mark.parametrize("main,argv,message", [
    (rt.main, ["extract", "--out-prefix", "{tmp}/t", "--l1", "a", "--l2", "b", "--src", "bad:x",
               "--tgt", "plain:x"], "unknown part kind 'bad'"),
    (rt.main, ["xml-sets", "{tmp}/v", "en", "de", "0", "{tmp}/a.xml", "{tmp}/b.xml"], "a.xml: cannot read"),
    (rr.main, ["evaluate", "--gen", "{tmp}/g", "--ref", "{tmp}/none", "--lang", "en", "--out-dir", "{tmp}",
               "--title", "t", "--detok", "1"], "none: cannot read"),
    (rr.main, ["bylength", "--src", "{tmp}/s", "--ref", "{tmp}/s", "--out-dir", "{tmp}", "--system", "x"],
     "expected LABEL|GENERATE_OUTPUT|HYPOTHESES"),
    (rr.main, ["summary", "--work", "{tmp}", "--name", "n", "--paper", "p", "--directions", "a-b",
               "--model", "x|y"], "expected ID|LABEL|FAMILY|GROUP"),
    (rr.main, ["complexity", "label-only"], "expected LABEL=TRAIN_LOG:GENERATE_LOG:SAVE_DIR"),
], ids=["extract", "xml-sets", "evaluate", "bylength", "summary", "complexity"])
def test_each_command_bad_input(main, argv, message, tmp_path, capsys):
    write(tmp_path / "s", "a\n")
    with pytest.raises(SystemExit) as exc:
        main([a.format(tmp=tmp_path) for a in argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ": error: " in err[0] and message in err[0], err
