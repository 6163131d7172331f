"""ctx-doc-bleu (ctx_fairseq.eval.scoring.doc_bleu): document-level and sentence-level
sacreBLEU of fairseq-generate output with the split's docids, the segment-level
BLEU of a segment map (G-Transformer's d-BLEU) and the lower-cased tokenized
variant (Sun et al. 2022's); checked against sacreBLEU computed here directly,
on hand-written outputs and on a real fairseq-generate run of the toy corpus;
every error."""

import json
import os

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU

from ctx_fairseq.eval.scoring.doc_bleu import cli_main, read_segments, write_segments
from fairseq_cli_utils import generate

DOCIDS = ["talk-a"] * 3 + ["talk-b"] * 2 + ["talk-c"] * 3
DOCS = [(0, 3), (3, 5), (5, 8)]  # [start, end) of each document above
REFS = ["The cat sat on the mat near the door.",
        "It was a warm and sunny afternoon.",
        "Then the dog came in and barked loudly.",
        "She bought three apples at the market.",
        "They weren't red but very sweet.",
        "The train left the station at noon.",
        "Nobody on the platform noticed it.",
        "Later that day the rain began to fall."]
# D- lines (detokenized) and H- lines (as Moses tokenized them)
DETOK = ["The cat sat on the mat by the door.",
         "It was a warm sunny afternoon.",
         "Then the dog came in and barked loudly.",
         "She bought three apples on the market.",
         "They weren't red but very sweet.",
         "The train left the station at midday.",
         "No one on the platform noticed it.",
         "Later that day the rain started to fall."]
TOK = ["The cat sat on the mat by the door .",
       "It was a warm sunny afternoon .",
       "Then the dog came in and barked loudly .",
       "She bought three apples on the market .",
       "They weren &apos;t red but very sweet .",
       "The train left the station at midday .",
       "No one on the platform noticed it .",
       "Later that day the rain started to fall ."]


def gen_text(order=range(8), hyp=TOK, detok=DETOK, refs=REFS, with_t=True, with_d=True):
    """What fairseq-generate prints for the sentences ``order``."""
    out = ["2024-01-01 | INFO | fairseq_cli.generate | loading model(s) from ckpt.pt"]
    for i in order:
        out.append(f"S-{i}\tsource {i} .")
        if with_t:
            out.append(f"T-{i}\t{refs[i]}")
        out.append(f"H-{i}\t-0.25\t{hyp[i]}")
        if with_d:
            out.append(f"D-{i}\t-0.25\t{detok[i]}")
        out.append(f"P-{i}\t" + " ".join("-0.2500" for _ in hyp[i].split()))
    out.append("Generate test with beam=5: BLEU4 = 41.20, 70.1/48.2/35.0/26.1 (BP=1.000)")
    return "\n".join(out) + "\n"


@pytest.fixture
def files(tmp_path):
    def write(name, text):
        p = tmp_path / name
        p.write_text(text, encoding="utf-8")
        return str(p)

    write.docids = write("test.docids", "\n".join(DOCIDS) + "\n")
    write.gen = write("gen.txt", gen_text())
    write.out = str(tmp_path / "out")
    return write


def run(argv, out):
    assert cli_main([*argv, "--out-dir", out]) is None  # console script: exit status 0
    with open(os.path.join(out, "doc_bleu.json"), encoding="utf-8") as f:
        return json.load(f)


def fails(argv, message, capsys, out=None):
    with pytest.raises(SystemExit) as exc:
        cli_main(argv if out is None else [*argv, "--out-dir", out])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    if out is not None:
        assert not os.path.exists(out)  # nothing written on an error
    return err


def direct(hyps, refs, tokenize="13a"):
    """sacreBLEU over sentences and over documents (joined with spaces)."""
    sent = BLEU(tokenize=tokenize).corpus_score(hyps, [refs]).score
    doc = BLEU(tokenize=tokenize).corpus_score(
        [" ".join(hyps[a:b]) for a, b in DOCS], [[" ".join(refs[a:b]) for a, b in DOCS]]).score
    return sent, doc


def is_png(path):
    with open(path, "rb") as f:
        head = f.read(8)
    return head == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 5000


# ------------------------------------------------------------------ scores


def test_scores_equal_sacrebleu_and_signature_printed(files, capsys):
    res = run([files.gen, "--docids", files.docids], files.out)
    sent, doc = direct(DETOK, REFS)
    assert res["sentence_level"]["bleu"] == pytest.approx(sent, abs=1e-9)
    assert res["document_level"]["bleu"] == pytest.approx(doc, abs=1e-9)
    assert abs(sent - doc) > 0.1  # the two levels really differ on this data
    assert res["sentences"] == 8 and res["documents"] == 3
    assert res["sentence_level"]["segments"] == 8 and res["document_level"]["segments"] == 3
    # joining adds no tokens: same lengths at both levels
    assert res["sentence_level"]["hyp_len"] == res["document_level"]["hyp_len"]
    # per document: each scored on its own
    for d, (a, b) in zip(res["per_document"], DOCS):
        assert d["docid"] == DOCIDS[a] and d["first_line"] == a and d["sentences"] == b - a
        assert d["bleu"] == pytest.approx(BLEU().corpus_score(
            [" ".join(DETOK[a:b])], [[" ".join(REFS[a:b])]]).score, abs=1e-9)
    signature = f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    assert res["sentence_level"]["signature"] == res["document_level"]["signature"] == signature
    out = capsys.readouterr().out
    assert out.count(f"signature: {signature}") == 2
    label = "[sacreBLEU tok:13a, D- lines vs T- lines]"
    assert f"sentence-level BLEU (8 sentences): {sent:.2f} {label}" in out
    assert f"document-level BLEU (3 documents): {doc:.2f} {label}" in out
    assert f"hypotheses: D- lines of {files.gen}: fairseq-generate's detokenized hypotheses " \
           "(the H- lines through its --bpe and --tokenizer decoders), or what a " \
           "post-processing step wrote in their place; they differ from the H- lines in 8 of " \
           "8 sentences" in out
    assert f"references: T- lines of {files.gen}: fairseq-generate's references" in out
    assert "metric: sacreBLEU with its 13a tokenizer" in out and "warning" not in out
    assert res["metric"]["kind"] == "sacreBLEU"
    assert f"docids: {files.docids} (8 sentences, 3 documents)" in out
    md = open(os.path.join(files.out, "doc_bleu.md"), encoding="utf-8").read()
    assert md.startswith("# Document-level and sentence-level BLEU: sacreBLEU\n")
    assert signature in md and "| talk-b | 3 | 2 |" in md
    assert is_png(os.path.join(files.out, "doc_bleu.png"))
    import matplotlib.image

    img = matplotlib.image.imread(os.path.join(files.out, "doc_bleu.png"))
    assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0  # not a blank image


def test_shuffled_output_is_put_back_in_corpus_order(files):
    ordered = run([files.gen, "--docids", files.docids], files.out)
    shuffled = files("shuffled.txt", gen_text(order=[5, 0, 7, 2, 4, 1, 6, 3]))
    res = run([shuffled, "--docids", files.docids], os.path.join(files.out, "s"))
    for key in ("sentence_level", "document_level", "per_document"):
        assert res[key] == ordered[key], key
    # a shuffled docids file would be different documents: check the order matters
    rev = files("rev.txt", gen_text(hyp=TOK[::-1], detok=DETOK[::-1]))
    other = run([rev, "--docids", files.docids], os.path.join(files.out, "r"))
    assert other["document_level"]["bleu"] != ordered["document_level"]["bleu"]


def test_hypothesis_lines_choice(files, capsys):
    res = run([files.gen, "--docids", files.docids, "--hypotheses", "H"], files.out)
    sent, doc = direct(TOK, REFS)
    assert res["hypotheses"]["lines"] == "H" and res["hypotheses"]["differ_from_H"] == 8
    assert res["sentence_level"]["bleu"] == pytest.approx(sent, abs=1e-9)
    assert res["document_level"]["bleu"] == pytest.approx(doc, abs=1e-9)
    assert sent != pytest.approx(direct(DETOK, REFS)[0])
    out = capsys.readouterr().out
    assert f"hypotheses: H- lines of {files.gen}: fairseq-generate's hypotheses in the " \
           "binarized data's tokenization" in out
    assert "warning: the H- lines are tokenized text but the T- references are decoded like " \
           "the D- lines" in out
    assert "[sacreBLEU tok:13a, H- lines vs T- lines]" in out
    # explicit D equals the default
    d = run([files.gen, "--docids", files.docids, "--hypotheses", "D"], files.out + "d")
    assert d["sentence_level"]["bleu"] == pytest.approx(direct(DETOK, REFS)[0], abs=1e-9)
    # no --tokenizer: D- equals H-, said so
    same = files("same.txt", gen_text(hyp=DETOK))
    run([same, "--docids", files.docids], files.out + "s")
    out = capsys.readouterr().out
    assert "D- lines of" in out and "identical to the H- lines (fairseq-generate decoded " \
           "nothing" in out
    # a file without D- lines (older fairseq): H- lines, said so
    old = files("old.txt", gen_text(hyp=DETOK, with_d=False))
    res = run([old, "--docids", files.docids], files.out + "o")
    assert res["hypotheses"]["lines"] == "H"
    assert res["sentence_level"]["bleu"] == pytest.approx(direct(DETOK, REFS)[0], abs=1e-9)
    assert "(the file has no D- lines)" in capsys.readouterr().out
    fails([old, "--docids", files.docids, "--hypotheses", "D"],
          "old.txt: no D- lines (detokenized hypotheses)", capsys, files.out + "x")


def test_tokenize_and_refs_file(files, capsys):
    res = run([files.gen, "--docids", files.docids, "--tokenize", "char"], files.out)
    sent, doc = direct(DETOK, REFS, tokenize="char")
    assert res["sentence_level"]["bleu"] == pytest.approx(sent, abs=1e-9)
    assert res["document_level"]["bleu"] == pytest.approx(doc, abs=1e-9)
    assert "tok:char" in res["document_level"]["signature"] and res["tokenize"] == "char"
    # --refs: other references than the T- lines are scored
    refs = files("refs.txt", "\n".join(DETOK[:4] + REFS[4:]) + "\n")
    res = run([files.gen, "--docids", files.docids, "--refs", refs], files.out + "r")
    sent, doc = direct(DETOK, DETOK[:4] + REFS[4:])
    assert res["sentence_level"]["bleu"] == pytest.approx(sent, abs=1e-9)
    assert res["document_level"]["bleu"] == pytest.approx(doc, abs=1e-9)
    assert f"references: --refs {refs} (one per sentence, scored as the file holds them)" \
        in capsys.readouterr().out
    # an output without T- lines needs --refs
    no_t = files("no_t.txt", gen_text(with_t=False))
    res = run([no_t, "--docids", files.docids, "--refs", refs], files.out + "t")
    assert res["sentence_level"]["bleu"] == pytest.approx(sent, abs=1e-9)
    fails([no_t, "--docids", files.docids], "no_t.txt: sentence id 0 has a hypothesis but no "
          "S-/T- line", capsys, files.out + "x")
    short = files("short.txt", "\n".join(REFS[:7]) + "\n")
    fails([files.gen, "--docids", files.docids, "--refs", short],
          f"--refs {short}: 7 lines, but {files.docids} has 8 document ids", capsys,
          files.out + "x")


def test_tokenized_bleu_is_labelled_as_such(files, capsys):
    """The recipes' call (H- lines against tokenized references, --tokenize
    none) is reported as tokenized BLEU, not as sacreBLEU, without a warning;
    sacreBLEU of the H- lines, and --tokenize none on detokenized D- lines,
    are each reported with a warning."""
    tok_refs = files("tok_refs.txt", "\n".join(TOK[:4] + DETOK[4:]) + "\n")
    assert cli_main([files.gen, "--docids", files.docids, "--out-dir", files.out, "--refs",
                     tok_refs, "--hypotheses", "H", "--tokenize", "none", "--prefix",
                     "tokenized_bleu"]) is None
    with open(os.path.join(files.out, "tokenized_bleu.json"), encoding="utf-8") as f:
        res = json.load(f)
    sent, doc = direct(TOK, TOK[:4] + DETOK[4:], tokenize="none")
    assert res["sentence_level"]["bleu"] == pytest.approx(sent, abs=1e-9)
    assert res["document_level"]["bleu"] == pytest.approx(doc, abs=1e-9)
    assert res["metric"]["kind"] == "tokenized BLEU" and res["warnings"] == []
    out = capsys.readouterr().out
    assert f"sentence-level BLEU (8 sentences): {sent:.2f} [tokenized BLEU, tok:none, H- lines " \
           "vs --refs]" in out
    assert "metric: tokenized BLEU: sacreBLEU --tokenize none" in out
    assert "not comparable with sacreBLEU (13a) scores" in out and "warning" not in out
    md = open(os.path.join(files.out, "tokenized_bleu.md"), encoding="utf-8").read()
    assert md.startswith("# Document-level and sentence-level BLEU: tokenized BLEU\n")
    # sacreBLEU's tokenizer over the tokenized H- lines: said
    res = run([files.gen, "--docids", files.docids, "--refs", tok_refs, "--hypotheses", "H"],
              files.out + "s")
    assert res["metric"]["kind"] == "sacreBLEU"
    assert "sacreBLEU (tok:13a) of the tokenized H- lines" in capsys.readouterr().out
    # --tokenize none on detokenized D- lines: neither kind, said
    res = run([files.gen, "--docids", files.docids, "--tokenize", "none"], files.out + "n")
    assert res["metric"]["kind"] == "BLEU of detokenized text, tok:none"
    assert "warning: --tokenize none on the detokenized D- lines" in capsys.readouterr().out
    # D- lines equal to the H- lines (no --tokenizer) with --tokenize none: tokenized BLEU
    same = files("same.txt", gen_text(hyp=TOK, detok=TOK, refs=TOK))
    res = run([same, "--docids", files.docids, "--tokenize", "none"], files.out + "d")
    assert res["metric"]["kind"] == "tokenized BLEU" and res["warnings"] == []


def test_bpe_left_in_text(files, capsys):
    bpe = [s.replace("sat", "s@@ at").replace("market", "mar@@ ket") for s in DETOK]
    bpe_refs = [s.replace("afternoon", "after@@ noon") for s in REFS]
    gen = files("bpe.txt", gen_text(hyp=bpe, detok=bpe))
    err = fails([gen, "--docids", files.docids], "bpe.txt (D- lines): 2 of 8 sentences still "
                "hold subword_nmt BPE markers ('@@ '), e.g. sentence 0", capsys, files.out)
    assert "--remove-bpe" in err
    ref_bpe = files("ref_bpe.txt", gen_text(hyp=DETOK, refs=bpe_refs))
    fails([ref_bpe, "--docids", files.docids], "ref_bpe.txt (T- lines): 1 of 8 sentences",
          capsys, files.out)
    refs_file = files("refs.txt", "\n".join(bpe_refs) + "\n")
    fails([files.gen, "--docids", files.docids, "--refs", refs_file],
          f"--refs {refs_file}: 1 of 8 sentences still hold subword_nmt", capsys, files.out)
    spm = files("spm.txt", gen_text(hyp=["\u2581" + s.replace(" ", " \u2581") for s in DETOK],
                                    detok=["\u2581" + s.replace(" ", " \u2581") for s in DETOK]))
    fails([spm, "--docids", files.docids], "8 of 8 sentences still hold sentencepiece",
          capsys, files.out)
    # --remove-bpe: fairseq's removal, then the clean scores
    both = files("both.txt", gen_text(hyp=bpe, detok=bpe, refs=bpe_refs))
    res = run([both, "--docids", files.docids, "--remove-bpe"], files.out)
    sent, doc = direct(DETOK, REFS)
    assert res["remove_bpe"] == {"scheme": "subword_nmt", "hypotheses_changed": 2,
                                 "references_changed": 1}
    assert res["sentence_level"]["bleu"] == pytest.approx(sent, abs=1e-9)
    assert res["document_level"]["bleu"] == pytest.approx(doc, abs=1e-9)
    assert "BPE removed here (--remove-bpe subword_nmt): 2 of 8 hypotheses, 1 of 8 " \
           "references" in capsys.readouterr().out
    # sentencepiece removal deletes spaces: the plain T- lines must stay untouched
    res = run([spm, "--docids", files.docids, "--remove-bpe", "sentencepiece"], files.out + "s")
    assert res["remove_bpe"]["references_changed"] == 0
    assert res["sentence_level"]["bleu"] == pytest.approx(sent, abs=1e-9)
    assert res["document_level"]["bleu"] == pytest.approx(doc, abs=1e-9)
    fails([spm, "--docids", files.docids, "--remove-bpe"],
          "they remain after --remove-bpe subword_nmt", capsys, files.out + "x")


# ------------------------------------------------------------------ segments and lower case

SEGMENTS = [(0, 2), (2, 1), (3, 2), (5, 3)]  # (first id, sentences) within DOCIDS' documents


def segment_file(files, segments=SEGMENTS, name="test.segments"):
    return files(name, "".join(" ".join(str(i) for i in range(a, a + k)) + "\n"
                               for a, k in segments))


def joined(lines, spans):
    return [" ".join(lines[a:a + k]) for a, k in spans]


def test_segment_level_bleu(files, capsys):
    """G-Transformer's d-BLEU: corpus BLEU over the segments of the map,
    each segment's sentences joined; sacreBLEU directly gives the same, a map
    of the documents gives the document-level score and a map of single
    sentences the sentence-level one; the reference as hypothesis gives 100."""
    seg = segment_file(files)
    res = run([files.gen, "--docids", files.docids, "--segments", seg], files.out)
    want = BLEU().corpus_score(joined(DETOK, SEGMENTS), [joined(REFS, SEGMENTS)])
    r = res["segment_level"]
    assert r["bleu"] == pytest.approx(want.score, abs=1e-9) and r["segments"] == 4
    assert r["hyp_len"] == res["sentence_level"]["hyp_len"]
    sent, doc = direct(DETOK, REFS)
    assert len({round(r["bleu"], 6), round(sent, 6), round(doc, 6)}) == 3  # three figures
    assert res["segment_map"] == seg and r["signature"] == res["sentence_level"]["signature"]
    assert r["computes"].startswith("d-BLEU per segment (G-Transformer's)")
    assert res["sentence_level"]["computes"].startswith("s-BLEU")
    assert res["document_level"]["computes"].startswith("d-BLEU per document")
    out = capsys.readouterr().out
    assert f"segments: {seg} (4 segments)" in out
    assert (f"segment-level BLEU (4 segments): {want.score:.2f} "
            f"[sacreBLEU tok:13a, D- lines vs T- lines]") in out
    assert out.count("  signature: ") == 3
    md = open(os.path.join(files.out, "doc_bleu.md"), encoding="utf-8").read()
    assert "segment-level BLEU (4 segments)" in md
    as_docs = segment_file(files, [(a, b - a) for a, b in DOCS], "docs.segments")
    res = run([files.gen, "--docids", files.docids, "--segments", as_docs], files.out + "d")
    assert res["segment_level"]["bleu"] == pytest.approx(doc, abs=1e-9)
    single = segment_file(files, [(i, 1) for i in range(8)], "single.segments")
    res = run([files.gen, "--docids", files.docids, "--segments", single], files.out + "s")
    assert res["segment_level"]["bleu"] == pytest.approx(sent, abs=1e-9)
    perfect = files("perfect.txt", gen_text(hyp=REFS, detok=REFS))
    res = run([perfect, "--docids", files.docids, "--segments", seg], files.out + "p")
    assert [res[k]["bleu"] for k in ("sentence_level", "document_level", "segment_level")] == \
        pytest.approx([100.0] * 3, abs=1e-9)
    # without --segments: no segment-level score
    res = run([files.gen, "--docids", files.docids], files.out + "n")
    assert "segment_level" not in res and "segment_map" not in res


def test_lower_cased_tokenized_bleu(files, capsys):
    """Sun et al. 2022's s-BLEU and d-BLEU (multi-bleu.perl -lc over
    tokenized text): --hypotheses H --tokenize none --lowercase against
    tokenized references, named so and signed case:lc; equal to sacreBLEU's
    own lower-cased tok:none; the lower-cased reference as hypothesis scores
    100 (the cased score does not)."""
    upper = [t.upper() for t in TOK]
    refs = files("tok_refs.txt", "\n".join(TOK) + "\n")
    gen = files("upper.txt", gen_text(hyp=upper, detok=DETOK))
    argv = [gen, "--docids", files.docids, "--refs", refs, "--hypotheses", "H",
            "--tokenize", "none", "--segments", segment_file(files)]
    res = run([*argv, "--lowercase"], files.out)
    for key in ("sentence_level", "document_level", "segment_level"):
        assert res[key]["bleu"] == pytest.approx(100.0, abs=1e-9), key
        assert "case:lc|eff:no|tok:none" in res[key]["signature"]
    assert res["lowercase"] is True and res["metric"]["kind"] == "lower-cased tokenized BLEU"
    assert "Sun et al. 2022" in res["metric"]["description"] and res["warnings"] == []
    out = capsys.readouterr().out
    assert ("sentence-level BLEU (8 sentences): 100.00 [lower-cased tokenized BLEU, tok:none, "
            "case:lc, H- lines vs --refs]") in out
    cased = run(argv, files.out + "c")
    assert cased["sentence_level"]["bleu"] < 10 and cased["lowercase"] is False
    assert cased["metric"]["kind"] == "tokenized BLEU"
    # a known case: sacreBLEU's lower-cased tok:none directly, sentences and documents
    mixed = [t.upper() if i % 2 else t for i, t in enumerate(TOK)]
    tok_refs = [t.lower() for t in DETOK]
    gen = files("mixed.txt", gen_text(hyp=mixed, detok=DETOK))
    refs = files("lower_refs.txt", "\n".join(tok_refs) + "\n")
    res = run([gen, "--docids", files.docids, "--refs", refs, "--hypotheses", "H", "--tokenize",
               "none", "-lc"], files.out + "k")
    lc = BLEU(tokenize="none", lowercase=True)
    assert res["sentence_level"]["bleu"] == pytest.approx(
        lc.corpus_score(mixed, [tok_refs]).score, abs=1e-9)
    spans = [(a, b - a) for a, b in DOCS]
    assert res["document_level"]["bleu"] == pytest.approx(
        lc.corpus_score(joined(mixed, spans), [joined(tok_refs, spans)]).score, abs=1e-9)
    assert 0 < res["document_level"]["bleu"] < 100
    # lower-cased sacreBLEU (13a) is named as such
    res = run([files.gen, "--docids", files.docids, "--lowercase"], files.out + "s")
    assert res["metric"]["kind"] == "lower-cased sacreBLEU"
    assert res["sentence_level"]["bleu"] == pytest.approx(
        BLEU(lowercase=True).corpus_score(DETOK, [REFS]).score, abs=1e-9)
    assert "[lower-cased sacreBLEU tok:13a, case:lc, D- lines vs T- lines]" in \
        capsys.readouterr().out


def test_segment_map_round_trip_and_errors(files, capsys):
    path = files("w.segments", "")
    write_segments(path, [range(0, 2), [2], (3, 4), [5, 6, 7]])
    assert read_segments(path, DOCIDS) == SEGMENTS
    bad = {
        "0 1\n2\n3 4\n5 7 6\n": "line 4: ids 5, 7, 6 are not ascending and consecutive",
        "0 1\n2 3\n4\n5 6 7\n": "line 2: the segment 2-3 crosses documents 'talk-a' and "
                                   "'talk-b'",
        "0 1\n2\n3 4\n5 6 7 8\n": "line 4: ids 5-8 lie outside the split (0..7",
        "0 1 2\n2\n3 4\n5 6 7\n": "1 sentence(s) in two segments: ids 2; expected every "
                                    "sentence of the split (8 by the docids file) in exactly one",
        "0 1 2\n3 4\n5 6\n": "1 sentence(s) in none: ids 7",
        "0 1 2\n\n3 4\n5 6 7\n": "line 2: empty",
        "0 1 2\n3 4\n5 six 7\n": "line 3: '5 six 7': expected the sentence ids of one segment",
        "": "empty file; expected one line per segment",
    }
    for k, (text, message) in enumerate(bad.items()):
        seg = files(f"bad{k}.segments", text)
        fails([files.gen, "--docids", files.docids, "--segments", seg],
              f"--segments {seg}", capsys, files.out)
        fails([files.gen, "--docids", files.docids, "--segments", seg], message, capsys,
              files.out)
    nowhere = files.out + ".segments"
    fails([files.gen, "--docids", files.docids, "--segments", nowhere],
          f"--segments {nowhere}: no such file", capsys, files.out)


# ------------------------------------------------------------------ errors


def test_missing_and_outside_ids(files, capsys):
    subset = files("subset.txt", gen_text(order=[0, 1, 3, 4, 7]))
    fails([subset, "--docids", files.docids],
          f"{subset}: hypotheses for 5 sentences, but {files.docids} has 8 document ids (one per "
          f"sentence of the split); 3 sentence(s) of the split have no hypothesis: ids 2, 5-6",
          capsys, files.out)
    longer = files("longer.docids", "\n".join(DOCIDS + ["talk-c"]) + "\n")
    fails([files.gen, "--docids", longer], "1 sentence(s) of the split have no hypothesis: ids 8",
          capsys, files.out)
    shorter = files("shorter.docids", "\n".join(DOCIDS[:6]) + "\n")
    err = fails([files.gen, "--docids", shorter], "2 id(s) lie outside the split (0..5): 6-7",
                capsys, files.out)
    assert f"is {shorter} the docids file of the split" in err
    many = files("many.docids", "\n".join(f"d{i}" for i in range(100)) + "\n")
    fails([files.gen, "--docids", many], "92 sentence(s) of the split have no hypothesis: "
                "ids 8-99", capsys, files.out)
    gappy = files("gappy.txt", gen_text(order=range(0, 8, 2)))
    fails([gappy, "--docids", files("t.docids", "t\n" * 60)],
          "56 sentence(s) of the split have no hypothesis: ids 1, 3, 5, 7-59;", capsys, files.out)
    lines = [f"sentence {i} ." for i in range(100)]
    even = files("even.txt", gen_text(order=range(0, 100, 2), hyp=lines, detok=lines, refs=lines))
    odd = ", ".join(str(i) for i in range(1, 41, 2))
    fails([even, "--docids", files("h.docids", "t\n" * 100)],  # long lists are cut
          f"50 sentence(s) of the split have no hypothesis: ids {odd}, ...;", capsys, files.out)


def test_duplicates_and_empty_inputs(files, capsys):
    dup = files("dup.txt", gen_text(order=[0, 1, 2, 3]) + gen_text(order=[2, 4, 5, 6, 7]))
    fails([dup, "--docids", files.docids],
          f"{dup}:24: sentence id 2 appears again (its lines began at line 12", capsys, files.out)
    empty = files("empty.txt", "")
    fails([empty, "--docids", files.docids], f"{empty}: no hypotheses (H- lines)", capsys,
          files.out)
    quiet = files("quiet.txt", "Generate test with beam=5: BLEU4 = 41.20\n")
    fails([quiet, "--docids", files.docids], f"{quiet}: no hypotheses", capsys, files.out)
    no_docs = files("empty.docids", "")
    fails([files.gen, "--docids", no_docs], f"{no_docs}:1: empty file", capsys, files.out)
    fails([files.gen, "--docids", files("x.docids", "a\nb\na\nc\nc\nc\nc\nc\n")],
          "document a reappears", capsys, files.out)
    refs = files("empty_refs.txt", "")
    fails([files.gen, "--docids", files.docids, "--refs", refs],
          f"--refs {refs}: empty file", capsys, files.out)


def test_missing_files_and_bad_options(files, tmp_path, capsys):
    nowhere = str(tmp_path / "nowhere.txt")
    fails([nowhere, "--docids", files.docids], f"{nowhere}: no such file", capsys, files.out)
    fails([files.gen, "--docids", nowhere], f"{nowhere}: document ids not found", capsys,
          files.out)
    fails([files.gen, "--docids", files.docids, "--refs", nowhere],
          f"--refs {nowhere}: no such file", capsys, files.out)
    fails([files.gen, "--docids", files.docids, "--tokenize", "13b"],
          "argument --tokenize: invalid choice: '13b'", capsys, files.out)
    fails([files.gen, "--docids", files.docids, "--remove-bpe", "wordpiece"],
          "argument --remove-bpe: invalid choice: 'wordpiece'", capsys, files.out)
    fails([files.gen], "the following arguments are required: --docids", capsys, files.out)


# ------------------------------------------------------------------ end to end


def _lines(text, tag):
    out = {}
    for line in text.splitlines():
        if line.startswith(tag + "-"):
            head, rest = line.split("\t", 1)
            out[int(head[2:])] = rest.split("\t", 1)[1] if tag in "HD" else rest
    return out


def test_end_to_end_fairseq_generate(toy_bin, toy_corpus, sentence_ckpt, tmp_path, capsys):
    gen_args = [toy_bin, "--path", sentence_ckpt, "--beam", "2", "--max-tokens", "500",
                "--gen-subset", "test", "--num-workers", "0", "--max-len-b", "20"]
    text = generate(gen_args)
    gen = tmp_path / "gen.txt"
    gen.write_text(text, encoding="utf-8")
    docids_path = os.path.join(toy_bin, "test.docids")
    with open(docids_path, encoding="utf-8") as f:
        docids = [x.strip() for x in f]
    out = str(tmp_path / "out")
    res = run([str(gen), "--docids", docids_path], out)
    # sacreBLEU directly over the D- lines, documents grouped from the docids file
    hyp, ref = _lines(text, "D"), _lines(text, "T")
    n = len(docids)
    assert sorted(hyp) == list(range(n)) and res["sentences"] == n == 48
    hyps, refs = [hyp[i] for i in range(n)], [ref[i] for i in range(n)]
    order = list(dict.fromkeys(docids))
    doc_h = [" ".join(h for h, d in zip(hyps, docids) if d == doc) for doc in order]
    doc_r = [" ".join(r for r, d in zip(refs, docids) if d == doc) for doc in order]
    assert res["documents"] == len(order) == 6
    assert res["sentence_level"]["bleu"] == pytest.approx(
        BLEU().corpus_score(hyps, [refs]).score, abs=1e-9)
    assert res["document_level"]["bleu"] == pytest.approx(
        BLEU().corpus_score(doc_h, [doc_r]).score, abs=1e-9)
    assert [d["docid"] for d in res["per_document"]] == order
    assert "signature: nrefs:1|case:mixed|eff:no|tok:13a" in capsys.readouterr().out
    assert is_png(os.path.join(out, "doc_bleu.png"))
    # the raw test references as --refs: the same as the T- lines (the toy data is plain text)
    raw = os.path.join(toy_corpus, "test.tgt")
    assert open(raw, encoding="utf-8").read().splitlines() == refs
    with_refs = run([str(gen), "--docids", docids_path, "--refs", raw], out + "r")
    assert with_refs["document_level"] == res["document_level"]
    # a segment map of consecutive sentences (3 per segment, within documents): the same as
    # sacreBLEU directly over the joined segments
    spans = [(a, min(3, e - a)) for d in order
             for s0, e in [(docids.index(d), n - docids[::-1].index(d))]
             for a in range(s0, e, 3)]
    seg = tmp_path / "test.segments"
    write_segments(str(seg), [range(a, a + k) for a, k in spans])
    res = run([str(gen), "--docids", docids_path, "--segments", str(seg)], out + "s")
    assert res["segment_level"]["bleu"] == pytest.approx(BLEU().corpus_score(
        joined(hyps, spans), [joined(refs, spans)]).score, abs=1e-9)
    # generation that skipped the long sentences: an error listing them, not a smaller score
    text = generate([*gen_args, "--max-source-positions", "7",
                     "--skip-invalid-size-inputs-valid-test"])
    kept = sorted(_lines(text, "H"))
    with open(os.path.join(toy_corpus, "test.src"), encoding="utf-8") as f:
        long_ids = [i for i, line in enumerate(f) if len(line.split()) + 1 > 7]
    assert long_ids and sorted(set(range(n)) - set(kept)) == long_ids
    skipped = tmp_path / "skipped.txt"
    skipped.write_text(text, encoding="utf-8")
    err = fails([str(skipped), "--docids", docids_path], f"{skipped}: hypotheses for "
                f"{n - len(long_ids)} sentences, but {docids_path} has {n} document ids", capsys,
                out + "x")
    assert f"{len(long_ids)} sentence(s) of the split have no hypothesis: ids {long_ids[0]}" in err
