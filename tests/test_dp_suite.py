"""ctx-dp-suite (issue 38): the swaps and their agreement rules, the suite
built from a hand-written fixture (which items, which are skipped and why),
read back by ctx-score-contrastive's toy reader, and the report by class and
kind of swap from the scorer's own JSON (``summarize``) with chosen scores."""

import json

import pytest

from ctx_fairseq.errors import InputError
from ctx_fairseq.eval.pronouns import dp_suite
from ctx_fairseq.eval.scoring.contrastive import summarize
from ctx_fairseq.eval.scoring.contrastive_suites import read_toy
from fairseq_cli_utils import run_main


def swapped(ref, k):
    """The candidate texts for the pronoun at token ``k``, with their kinds."""
    tokens = ref.split()
    out = []
    for changes, kind in dp_suite.swaps_for(tokens, k):
        new = list(tokens)
        for j, w in changes.items():
            new[j] = dp_suite._write_token(tokens[j], w, any(c.isupper() for c in ref))
        out.append((" ".join(new), kind))
    return out


@pytest.mark.parametrize("ref,k,expected", [
    # I/you: a be-form next to the pronoun changes with it, elsewhere in the clause it blocks
    ("i &apos;m leaving .", 0, [("you &apos;re leaving .", "person-1/2")]),
    ("am i late ?", 1, [("are you late ?", "person-1/2")]),
    ("I was there .", 0, [("You were there .", "person-1/2")]),
    ("i really am late .", 0, []),
    ("you &apos;re right .", 0, [("we &apos;re right .", "plural"),
                                 ("they &apos;re right .", "plural"),
                                 ("i &apos;m right .", "person-1/2")]),
    ("do you like it ?", 1, [("do we like it ?", "plural"), ("do they like it ?", "plural"),
                             ("do i like it ?", "person-1/2")]),
    ("thank you .", 1, [("thank us .", "plural"), ("thank them .", "plural"),
                        ("thank me .", "person-1/2")]),
    ("are you coming ?", 1, [("are we coming ?", "plural"), ("are they coming ?", "plural"),
                             ("am i coming ?", "person-1/2")]),
    ("aren &apos;t you coming ?", 2, []),  # role unknown (no parser)
    ("my god .", 0, [("your god .", "person-1/2")]),
    ("do it yourself .", 2, [("do it myself .", "person-1/2")]),
    ("we did it", 0, [("they did it", "plural"), ("you did it", "plural")]),
    ("tell them now", 1, [("tell us now", "plural"), ("tell you now", "plural")]),
    # he/she/it, by role where the form does not say it
    ("i saw him .", 2, [("i saw her .", "gender"), ("i saw it .", "gender")]),
    ("do it .", 1, [("do him .", "gender"), ("do her .", "gender")]),
    ("is it ?", 1, [("is he ?", "gender"), ("is she ?", "gender")]),
    ("it &apos;s old .", 0, [("he &apos;s old .", "gender"), ("she &apos;s old .", "gender")]),
    ("i saw her .", 2, [("i saw him .", "gender"), ("i saw it .", "gender")]),
    ("i saw her car .", 2, []),  # determiner or object: skipped
    ("his car", 0, [("her car", "gender"), ("its car", "gender")]),
    ("it is his .", 2, [("it is hers .", "gender")]),
    ("i like it so much", 2, []),  # role unknown
])
def test_swaps(ref, k, expected):
    assert swapped(ref, k) == expected


# plain source, +DP source, reference
FIXTURE = [
    ("要 走 了", "我要 走 了", "i &apos;m leaving ."),                    # 1sg
    ("喜欢 吗 ?", "你 喜欢 它 吗 ?", "do you like it ?"),                 # 2 and 3sg-n
    ("我 看见 了", "我 看见 他 了", "i saw him ."),                       # 3sg-m
    ("你 去 哪儿 ?", "你 去 哪儿 ?", "where are you going ?"),            # nothing restored
    ("看 了", "她 看 了", "mary watched ."),                               # no she: skipped
    ("真 是 的", "我 真 是 的", "i really am something ."),               # agreement: skipped
    ("走 吧", "我们 走 吧", "let &apos;s go ."),                          # let's: skipped
    ("喜欢", "我 喜欢 你", "i like ya ."),                                 # 1sg; ya skipped
    ("这是 我的 生存之道 是", "这是 我的 生存之道", "that &apos;s my livelihood ."),  # line skipped
]
DOCIDS = ["d1"] * 5 + ["d2"] * 4


def write(path, lines):
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return str(path)


@pytest.fixture
def inputs(tmp_path):
    return [write(tmp_path / name, [x[i] for x in FIXTURE])
            for i, name in enumerate(("src.zh", "dp.zh", "ref.en"))]


def test_build(inputs, tmp_path):
    src, dp, ref = inputs
    docids = write(tmp_path / "t.docids", DOCIDS)
    records, skipped, counts = dp_suite.build_suite(src, dp, [ref], docids)
    assert [r["id"] for r in records] == [0, 1, 2, 7]
    assert dict(skipped) == {"no_single_token": 1, "no_swap": 1, "not_own_token": 1, "slang": 1}
    assert counts == {"lines": 9, "skipped_lines": 1, "non_pronoun_insertions": 0}
    r = records[1]
    assert r["phenomenon"] == "2+3sg-n" and r["ref"] == "do you like it ?"
    assert r["contrastive"] == ["do we like it ?", "do they like it ?", "do i like it ?",
                                "do you like him ?", "do you like her ?"]
    assert [(s["class"], s["to"], s["kind"]) for s in r["swaps"]] == [
        ("2", "1pl", "plural"), ("2", "3pl", "plural"), ("2", "1sg", "person-1/2"),
        ("3sg-n", "3sg-m", "gender"), ("3sg-n", "3sg-f", "gender")]
    assert records[3]["contrastive"] == ["you like ya ."]
    assert (records[3]["doc_id"], records[3]["sent_index"]) == ("d2", 2)
    assert records[0]["src"] == "要 走 了" and records[0]["distance"] is None


def test_suite_reads_as_toy_format_and_reports(inputs, tmp_path, capsys):
    src, dp, ref = inputs
    out = str(tmp_path / "suite.jsonl")
    code, stdout, err = run_main(dp_suite.cli_main, ["build", "--source", src, "--dp-source", dp,
                                                     "--refs", ref, "--out", out], capsys)
    assert code == 0, err
    assert "4 records (5 items) from 9 lines (1 skipped)" in stdout
    assert "1sg 2, 2 1, 3sg-m 1, 3sg-n 1" in stdout
    assert "gender 4, plural 2, person-1/2 3" in stdout  # i -> you twice, you -> i once
    suite = read_toy(out)
    assert [ex.corpus_line for ex in suite.examples] == [0, 1, 2, 7]
    assert [len(ex.candidates) for ex in suite.examples] == [2, 6, 3, 2]
    # the scorer's own JSON, with chosen scores (reference first)
    scores = [[-1, -2], [-1, -2, -0.5, -1.00001, -3, -3], [-1, -2, -2], [-2, -1]]
    result = summarize(suite, scores)
    path = str(tmp_path / "contrastive_suite.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    rep = dp_suite.report_suite(out, [path])["runs"][0]
    assert rep["items"] == {"n": 5, "correct": 3, "ties": 0, "wrong": 2, "accuracy": 0.6}
    acc = {c: v["accuracy"] for c, v in rep["by_class"].items()}
    assert acc == {"1sg": 0.5, "2": 0.0, "3sg-m": 1.0, "3sg-n": 1.0}
    kinds = {k: (v["n"], v["correct"], v["ties"], v["wrong"]) for k, v in rep["by_kind"].items()}
    assert kinds == {"gender": (4, 4, 0, 0), "plural": (2, 1, 0, 1), "person-1/2": (3, 1, 1, 1)}
    code, stdout, _ = run_main(dp_suite.cli_main, ["report", "--suite", out, "--scores", path,
                                                   "--json", str(tmp_path / "rep.json")], capsys)
    assert code == 0 and "| swap person-1/2 | 3 | 33.3 |" in stdout
    assert json.loads((tmp_path / "rep.json").read_text())["runs"][0]["by_class"]["2"]["n"] == 1


def test_errors(inputs, tmp_path, capsys):
    src, dp, ref = inputs
    out = str(tmp_path / "suite.jsonl")
    dp_suite.write_suite(dp_suite.build_suite(src, dp, [ref])[0], out)
    bad = tmp_path / "scores.json"
    bad.write_text(json.dumps({"examples": [{"where": "x:1", "scores": [0, 1]}]}))
    with pytest.raises(InputError, match="1 examples, the suite has 4"):
        dp_suite.report_suite(out, [str(bad)])
    nothing = write(tmp_path / "ref0.en", ["a ."] * len(FIXTURE))
    with pytest.raises(InputError, match="has an item for the suite"):
        dp_suite.build_suite(src, dp, [nothing])
    code, _, err = run_main(dp_suite.cli_main, ["build", "--source", src, "--dp-source", dp,
                                                "--refs", ref, "--strict", "--out", out], capsys)
    assert isinstance(code, str) and code.startswith("ctx-dp-suite build: error: ")
    assert "dp.zh:9:" in code and "\n" not in code
