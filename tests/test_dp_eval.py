"""ctx-dp-eval (issue 38): the restored pronouns found by character
alignment, their classes, the English normalisation, and the scores on a
hand-written fixture with exact expected values (the reference scores 100 %,
a chosen half deleted scores that half, all deleted 0, swapped persons lower
precision by the swapped count), the paired comparison, and bad input."""

import json

import pytest

from ctx_fairseq.errors import InputError
from ctx_fairseq.eval.pronouns import dp_eval
from ctx_fairseq.eval.pronouns.dropped import (CLASSES, align, english_counts, english_words,
                                               zh_counts)
from fairseq_cli_utils import run_main

# plain source, +DP source, reference 1, reference 2 (line 9: the +DP line drops a
# word, as one line of TVsub's dev set does; line 8: a non-pronoun insertion;
# line 10: a restored pronoun only the second reference supports)
FIXTURE = [
    ("不要 接", "不要 接它", "don &apos;t answer it .", "do not answer it ."),
    ("要 走 了", "我要 走 了", "i &apos;m leaving .", "i &apos;m off ."),
    ("你 去 哪儿 ?", "你 去 哪儿 ?", "where are you going ?", "where are you off to ?"),
    ("喜欢 吗 ?", "你 喜欢 它 吗 ?", "do you like it ?", "you like it ?"),
    ("我 看见 了", "我 看见 他 了", "i saw him .", "i saw him ."),
    ("走 吧", "我们 走 吧", "let &apos;s go .", "let us go ."),
    ("这 是 书", "这 是 书", "this is a book .", "a book ."),
    ("没 办法 现在", "我 没 办法 它 现在", "i can &apos;t do it now .", "i can &apos;t now ."),
    ("他们 说 好", "他们 说 的 好", "they said yes .", "they agreed ."),
    ("这是 我的 生存之道 是", "这是 我的 生存之道", "that &apos;s my livelihood .",
     "it &apos;s my living ."),
    ("看 了", "她 看 了", "mary watched .", "she watched it ."),
]
REF1 = [x[2] for x in FIXTURE]
#: REF1 with a chosen half of the 8 items deleted: line 0's it, 1's i, 3's you, 4's him
HALF = list(REF1)
HALF[0], HALF[1], HALF[3], HALF[4] = ("don &apos;t answer .", "&apos;m leaving .",
                                      "do like it ?", "i saw .")
#: REF1 without any pronoun
NONE = ["don &apos;t answer .", "&apos;m leaving .", "where are going ?", "do like ?", "saw .",
        "go .", "this is a book .", "can &apos;t do now .", "said yes .",
        "that &apos;s livelihood .", "mary watched ."]
#: REF1 with three persons swapped: line 1 i -> you (an item), line 2 you -> he, line 8 they -> we
SWAPPED = list(REF1)
SWAPPED[1], SWAPPED[2], SWAPPED[8] = ("you &apos;re leaving .", "where is he going ?",
                                      "we said yes .")
NO_BOOT = {"resamples": 0, "seed": 0, "level": 0.95}


def write(path, lines):
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return str(path)


@pytest.fixture
def files(tmp_path):
    return {
        "src": write(tmp_path / "src.zh", [x[0] for x in FIXTURE]),
        "dp": write(tmp_path / "dp.zh", [x[1] for x in FIXTURE]),
        "ref1": write(tmp_path / "ref1.en", REF1),
        "ref2": write(tmp_path / "ref2.en", [x[3] for x in FIXTURE]),
        "tmp": tmp_path,
    }


def evaluate(files, hyp_lines, refs=("ref1",), boot=NO_BOOT, **kw):
    hyp = write(files["tmp"] / "hyp.en", hyp_lines)
    return dp_eval.evaluate(files["src"], files["dp"], [files[r] for r in refs], hyp,
                            boot=boot, **kw)


# ------------------------------------------------------------------ the pieces
def test_alignment_finds_resegmented_pronouns():
    assert align("要 走 了", "我要 走 了").items == [("我", "1sg")]
    assert align("不要 接", "不要 接它").items == [("它", "3sg-n")]
    a = align("没 办法 现在", "我 没 办法 它 现在")
    assert a.items == [("我", "1sg"), ("它", "3sg-n")] and a.other == []
    # possessives and reflexives go to their person; one pronoun, not 我 + 的
    assert align("天 哪", "我的 天 哪").items == [("我的", "1sg")]
    assert align("去 吧", "你自己 去 吧").items == [("你自己", "2")]
    assert align("说 好", "他们的 说 好").items == [("他们的", "3pl")]
    # 你们 is one class-2 pronoun, 咱们 1pl, 它们 3pl, 您 2
    assert [c for _, c in align("来", "你们 咱们 它们 您 来").items] == ["2", "1pl", "3pl", "2"]
    # the whole inserted token is preferred: 我的 (1sg), not 我 + a second 的
    a = align("的 书", "我的 的 书")
    assert a.items == [("我的", "1sg")] and a.other == []


def test_non_pronoun_insertions_and_unusable_lines():
    a = align("他们 说 好", "他们 说 的 好")
    assert a.items == [] and [(x.text, x.token) for x in a.other] == [("的", "的")]
    a = align("想到 你", "我 没想到 你")
    assert a.items == [("我", "1sg")] and [(x.text, x.token) for x in a.other] == [("没", "没想到")]
    assert [x.text for x in align("做", "自己 做").other] == ["自己"]  # no person
    assert align("这是 我的 生存之道 是", "这是 我的 生存之道") is None


def test_overt_chinese_pronouns():
    c = zh_counts("其他 人 和 我们的 吉他 你 让你在 他妈的")
    assert c == {"1sg": 0, "2": 2, "3sg-m": 0, "3sg-f": 0, "3sg-n": 0, "1pl": 1, "3pl": 0}
    assert zh_counts("他 她 它 他们 我自己")["3sg-m"] == 1
    assert zh_counts("他 她 它 他们 我自己")["3pl"] == 1


@pytest.mark.parametrize("text,expected", [
    ("I'm sure", {"1sg": 1}), ("i &apos;m sure", {"1sg": 1}),
    ("It's its own", {"3sg-n": 2}), ("it &apos;s", {"3sg-n": 1}),
    ("let &apos;s go", {"1pl": 1}), ("Let's go", {"1pl": 1}), ("let us go", {"1pl": 1}),
    ("she lets me", {"1sg": 1, "3sg-f": 1}), ("see ya , u know", {"2": 2}),
    ("get &apos; em", {"3pl": 1}),
    ("y &apos;all come", {"2": 1}), ("the u.s. army", {}), ("hurry.it is", {"3sg-n": 1}),
    ("woo @-@ hoo , i @-@ i", {"1sg": 2}),
    ("THEMSELVES! Our", {"3pl": 1, "1pl": 1}),
    ("She told him “you’re hers”", {"3sg-f": 2, "3sg-m": 1, "2": 1}),
])
def test_english_normalisation(text, expected):
    assert english_counts(text) == {c: expected.get(c, 0) for c in CLASSES}


def test_english_words_tokenization_does_not_matter():
    assert english_words("I'm sure it's fine.") == english_words("i &apos;m sure it &apos;s fine .")
    assert english_words("don't") == ["don", "'t"]


# ------------------------------------------------------------------ the scores
def test_reference_scores_100(files):
    r = evaluate(files, REF1)
    assert (r["sentences"], r["skipped"], r["dp_sentences"], r["items"]) == (11, 1, 7, 8)
    assert (r["restored"], r["unsupported_items"], r["non_pronoun_insertions"]) == (9, 1, 1)
    assert r["skipped_lines"][0]["line"] == 10
    assert r["non_pronoun_insertion_list"] == [{"line": 9, "text": "的", "token": "的"}]
    assert r["recall"] == 1.0 and r["recall_without_neuter"] == 1.0
    assert r["precision_all"] == 1.0 and r["precision_non_dp"] == 1.0
    assert r["hypothesis_pronouns"] == 11 and r["hypothesis_pronouns_non_dp"] == 2
    items = {c: v["items"] for c, v in r["by_class"].items()}
    assert items == {"1sg": 2, "2": 1, "3sg-m": 1, "3sg-f": 0, "3sg-n": 3, "1pl": 1, "3pl": 0}
    assert r["by_class"]["3sg-f"]["unsupported"] == 1 and r["by_class"]["3sg-f"]["recall"] is None


def test_half_deleted_scores_half(files):
    r = evaluate(files, HALF)
    assert r["recall"] == 0.5 and r["credit"] == 4
    assert r["recall_without_neuter"] == 2 / 5
    recall = {c: v["recall"] for c, v in r["by_class"].items()}
    assert recall == {"1sg": 0.5, "2": 0.0, "3sg-m": 0.0, "3sg-f": None, "3sg-n": 2 / 3,
                      "1pl": 1.0, "3pl": None}
    assert r["precision_all"] == 1.0 and r["hypothesis_pronouns"] == 7


def test_all_deleted_scores_zero(files):
    r = evaluate(files, NONE)
    assert r["recall"] == 0.0 and r["recall_without_neuter"] == 0.0
    assert r["hypothesis_pronouns"] == 0 and r["precision_all"] is None


def test_swapped_persons_lower_precision_by_the_swapped_count(files):
    r = evaluate(files, SWAPPED)
    assert (r["hypothesis_pronouns"], r["matched"]) == (11, 8)
    assert r["precision_all"] == 8 / 11
    assert r["precision_non_dp"] == 0.0  # both non-DP pronouns swapped
    assert r["recall"] == 7 / 8  # the swapped i was an item
    # you twice (right on line 3, where i belongs on line 1); he once wrong, him once right
    assert r["by_class"]["2"]["precision"] == 0.5 and r["by_class"]["3sg-m"]["precision"] == 0.5


def test_several_references(files, tmp_path):
    r = evaluate(files, REF1, refs=("ref1", "ref2"))
    assert r["items"] == 9 and r["unsupported_items"] == 0  # line 11's she
    assert r["recall"] == 8 / 9 and r["precision_all"] == 1.0
    sgml = ['<refset setid="t" srclang="zh" trglang="en">']
    for sysid, ref in (("A", REF1), ("B", [x[3] for x in FIXTURE])):
        sgml += [f'<DOC docid="SUB01" sysid="{sysid}">']
        sgml += [f"<p><seg id={i}> {t}</seg></p>" for i, t in enumerate(ref, 1)]
        sgml += ["</DOC>"]
    files["sgml"] = write(tmp_path / "refs.sgm", sgml + ["</refset>"])
    s = evaluate(files, REF1, refs=("sgml",))
    assert s["references"] == [f"{files['sgml']}:A", f"{files['sgml']}:B"]
    for key in ("items", "recall", "precision_all", "precision_non_dp", "by_class"):
        assert s[key] == r[key]


def test_fairseq_generate_output_reads_as_plain(files, tmp_path):
    gen = []
    for i in reversed(range(len(HALF))):  # any id order
        gen += [f"S-{i}\tsrc", f"T-{i}\tref", f"H-{i}\t-0.5\tTOKENIZED", f"D-{i}\t-0.5\t{HALF[i]}",
                f"P-{i}\t-0.1 -0.2"]
    path = write(tmp_path / "gen.txt", gen)
    r = dp_eval.evaluate(files["src"], files["dp"], [files["ref1"]], path, boot=NO_BOOT)
    assert r["hypothesis_format"] == "fairseq-generate D- lines"
    assert r["recall"] == 0.5 and r["by_class"] == evaluate(files, HALF)["by_class"]


def test_bootstrap_intervals(files):
    boot = {"resamples": 200, "seed": 3, "level": 0.95}
    r = evaluate(files, REF1, boot=boot)
    assert r["recall_interval"] == [1.0, 1.0] and r["precision_all_interval"] == [1.0, 1.0]
    h = evaluate(files, HALF, boot=boot)
    lo, hi = h["recall_interval"]
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    assert evaluate(files, HALF, boot=boot)["recall_interval"] == [lo, hi]  # seeded
    assert h["by_class"]["3sg-f"]["recall_interval"] is None
    assert evaluate(files, HALF)["recall_interval"] is None  # --bootstrap 0


def test_mcnemar_exact():
    assert dp_eval.mcnemar_exact(0, 0) == 1.0
    assert dp_eval.mcnemar_exact(4, 0) == 0.125
    assert dp_eval.mcnemar_exact(1, 9) == 2 * 11 / 1024
    assert dp_eval.mcnemar_exact(5, 5) == 1.0


def test_paired_comparison(files, tmp_path):
    hyp_b = write(tmp_path / "b.en", HALF)
    boot = {"resamples": 100, "seed": 0, "level": 0.95}
    r = evaluate(files, REF1, hyp_b=hyp_b, boot=boot)
    assert r["system_b"]["recall"] == 0.5
    c = r["comparison"]["all"]
    assert (c["items"], c["only_a"], c["only_b"], c["both"]) == (8, 4, 0, 4)
    assert c["mcnemar_p"] == 0.125
    assert c["paired_bootstrap"]["delta"] == -0.5 and c["paired_bootstrap"]["interval"][1] < 0
    n = r["comparison"]["without_neuter"]
    assert (n["items"], n["only_a"], n["only_b"]) == (5, 3, 0) and n["mcnemar_p"] == 0.25


# ------------------------------------------------------------------ bad input
def test_bad_input_names_the_file_and_line(files, tmp_path):
    short = write(tmp_path / "short.zh", [x[1] for x in FIXTURE][:-1])
    with pytest.raises(InputError, match=r"short\.zh:11: no \+DP line for line 11 of .*src\.zh"):
        dp_eval.evaluate(files["src"], short, [files["ref1"]], files["ref1"], boot=NO_BOOT)
    with pytest.raises(InputError, match=r"short\.en:11: no reference for line 11"):
        dp_eval.evaluate(files["src"], files["dp"], [files["ref1"], write(tmp_path / "short.en",
                         REF1[:-1])], files["ref1"], boot=NO_BOOT)
    long_hyp = write(tmp_path / "long.en", REF1 + ["extra"])
    with pytest.raises(InputError, match=r"long\.en:12: a line beyond the last"):
        dp_eval.evaluate(files["src"], files["dp"], [files["ref1"]], long_hyp, boot=NO_BOOT)
    gen = write(tmp_path / "gen.txt", [f"S-{i}\ts\nH-{i}\t-1\t{REF1[i]}" for i in range(11)
                                       if i != 3])
    with pytest.raises(InputError, match=r"gen\.txt: no hypothesis for sentence id 3 \(line 4"):
        dp_eval.evaluate(files["src"], files["dp"], [files["ref1"]], gen, boot=NO_BOOT)
    bpe = write(tmp_path / "bpe.en", ["he@@ llo"] + REF1[1:])
    with pytest.raises(InputError, match=r"bpe\.en: subword_nmt BPE markers .* line 1"):
        dp_eval.evaluate(files["src"], files["dp"], [files["ref1"]], bpe, boot=NO_BOOT)


def test_strict_makes_a_skipped_line_an_error(files):
    with pytest.raises(InputError, match=r"dp\.zh:10: the \+DP line does not hold every "
                                         r"character of line 10 .*\(--strict\)"):
        evaluate(files, REF1, strict=True)


def test_cli(files, tmp_path, capsys):
    out = str(tmp_path / "o" / "dp.json")
    hyp = write(tmp_path / "h.en", HALF)
    code, stdout, err = run_main(dp_eval.cli_main, [
        "--source", files["src"], "--dp-source", files["dp"], "--refs", files["ref1"],
        "--hyp", hyp, "--json", out, "--bootstrap", "50"], capsys)
    assert code == 0, err
    assert "recall 50.0 [" in stdout and "1 skipped" in stdout and "dp.zh:10:" in stdout
    with open(out, encoding="utf-8") as f:
        r = json.load(f)
    assert r["recall"] == 0.5 and r["bootstrap"] == {"resamples": 50, "seed": 0, "level": 0.95,
                                                     "unit": "sentence"}
    short = write(tmp_path / "short.zh", ["x"])
    code, _, err = run_main(dp_eval.cli_main, [
        "--source", files["src"], "--dp-source", short, "--refs", files["ref1"],
        "--hyp", hyp, "--json", str(tmp_path / "x.json")], capsys)
    err += code if isinstance(code, str) else ""  # sys.exit(message)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code not in (0, None) and lines[-1].startswith("ctx-dp-eval: error: ")
    assert "short.zh:2:" in lines[-1]
    assert not (tmp_path / "x.json").exists()
