"""ctx-iterative-decode: two-pass iterative decoding with fairseq-generate."""

import os

import pytest

from ctx_fairseq.cli import iterative_decode as itd
from fairseq_cli_utils import hypotheses

DEC_ARGS = ["--task", "document_translation", "--document-context", "online",
            "--document-memory", "--target-context-size", "1"]


@pytest.fixture
def decoder_ckpt(selective_dec_ckpt):
    return selective_dec_ckpt


def _n_test(toy_bin):
    return sum(1 for _ in open(os.path.join(toy_bin, "test.docids")))


def test_two_passes_hand_the_first_pass_to_the_second(decoder_ckpt, toy_bin, tmp_path,
                                                      monkeypatch):
    calls = []
    real = itd.run_generate

    def spy(argv):
        calls.append(list(argv))
        return real(argv)

    monkeypatch.setattr(itd, "run_generate", spy)
    out = str(tmp_path / "dec")
    result = itd.iterative_decode(toy_bin, decoder_ckpt, out, passes=2,
                                  generate_args=[*DEC_ARGS, "--max-len-b", "10"])
    n = _n_test(toy_bin)
    assert len(calls) == 2
    first = calls[0][calls[0].index("--target-context-file") + 1]
    assert open(first).read() == "\n" * n  # pass 1: no target context
    assert calls[1][calls[1].index("--target-context-file") + 1] == os.path.join(
        out, "hyp-pass1.txt")
    hyp1 = open(os.path.join(out, "hyp-pass1.txt")).read().splitlines()
    gen1 = open(os.path.join(out, "generate-pass1.txt")).read()
    by_id = {}
    for line in gen1.splitlines():
        if line.startswith("H-"):
            by_id.setdefault(int(line.split("\t")[0][2:]), line.split("\t")[2])
    assert hyp1 == [by_id[i] for i in range(n)]  # corpus order
    assert len(hypotheses(result["output"])) == n
    assert [p["pass"] for p in result["passes"]] == [1, 2]


def test_first_pass_by_a_sentence_level_checkpoint(decoder_ckpt, sentence_ckpt, toy_bin,
                                                   tmp_path):
    out = str(tmp_path / "dec")
    rc = itd.cli_main([toy_bin, "--path", decoder_ckpt, "--out-dir", out,
                       "--first-pass-path", sentence_ckpt, "--", *DEC_ARGS, "--max-len-b", "10"])
    assert rc == 0
    gen1 = open(os.path.join(out, "generate-pass1.txt")).read()
    assert len(hypotheses(gen1)) == _n_test(toy_bin)
    assert not os.path.exists(os.path.join(out, "hyp-pass0-empty.txt"))


def test_missing_hypotheses_and_post_processing():
    with pytest.raises(RuntimeError, match="no hypothesis for 1 of 2 sentences"):
        itd.hypotheses_by_id("H-0\t-1.0\ta b\n", 2, "pass 1")
    assert itd._strip_post_process(["--beam", "4", "--remove-bpe", "--post-process",
                                    "sentencepiece", "--x"]) == ["--beam", "4", "--x"]
    assert itd._strip_post_process(["--remove-bpe=@@ ", "--y"]) == ["--y"]
    with pytest.raises(ValueError, match="at least 2"):
        itd.iterative_decode("d", "p", "o", passes=1)


def test_pass_two_reads_the_first_pass_translations_as_target_memory(decoder_ckpt, toy_bin,
                                                                     tmp_path, monkeypatch):
    from fairseq.data import Dictionary

    from ctx_fairseq.models.transformer_selective_doc.encoder import SelectiveDocEncoder

    seen = []
    original = SelectiveDocEncoder.forward

    def forward(self, *args, **kwargs):
        seen.append(kwargs["mem_tgt_tokens"].clone())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SelectiveDocEncoder, "forward", forward)
    out = str(tmp_path / "dec")
    calls = []
    real = itd.run_generate
    monkeypatch.setattr(itd, "run_generate", lambda argv: (calls.append(len(seen)), real(argv))[1])
    itd.iterative_decode(toy_bin, decoder_ckpt, out, passes=2,
                         generate_args=[*DEC_ARGS, "--max-len-b", "6"])
    d = Dictionary.load(os.path.join(toy_bin, "dict.tgt.txt"))

    def rows(tensors):
        return [d.string(r[r.ne(d.pad())]) for t in tensors for r in t]

    first, second = seen[:calls[1]], seen[calls[1]:]
    assert first and second
    assert set(rows(first)) <= {""}  # pass 1: empty target memory
    hyp1 = set(open(os.path.join(out, "hyp-pass1.txt")).read().splitlines())
    assert any(h for h in hyp1)
    assert set(rows(second)) <= hyp1 and set(rows(second)) & {h for h in hyp1 if h}


def test_sentence_level_first_pass_keeps_the_search_options():
    args = ["--task", "document_translation", "--document-context", "online", "--document-memory",
            "--target-context-size", "1", "--max-len-b", "6", "--lenpen=1.2", "--cpu"]
    assert itd.sentence_level_args(args) == ["--max-len-b", "6", "--lenpen=1.2", "--cpu"]
