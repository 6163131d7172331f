"""Context use of segment models (issue 39, item 6): ctx-cxmi and
ctx-score-contrastive score the last sentence of a segment of its previous
sentences against the sentence alone, for a --doc2doc transformer and
transformer_gtrans trained 2 updates on the toy corpus. Checked by hand: the
segment's layout, the score counting only the last sentence's tokens (one
forward pass of the whole segment, the prefix columns left out), the
sentence-alone score equal to the model's one-sentence segment, the context
changing the score, and the refusals."""

import os

import numpy as np
import pytest
import torch

from ctx_fairseq.data.conditions import ContextCondition
from ctx_fairseq.errors import InputError
from ctx_fairseq.eval.context_use import cxmi
from ctx_fairseq.eval.context_use.segment_context import (is_segment_model,
                                                          segment_condition_dataset)
from ctx_fairseq.eval.scoring import contrastive as C
from ctx_fairseq.eval.scoring.suite_report import SuiteOptions
from fairseq_cli_utils import TINY_MODEL_ARGS, train
from suite_fixtures import toy_examples, write_voita

pytestmark = pytest.mark.usefixtures("one_thread")

D2D = ["--task", "document_translation", "--doc2doc", "greedy", "--source-context-size", "0",
       "--doc2doc-max-tokens", "60"]


def _train(data, save, arch):
    train([data, "--arch", arch, *TINY_MODEL_ARGS, *D2D, "--share-all-embeddings",
           "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--max-update", "2",
           "--save-dir", save, "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1",
           "--num-workers", "0", "--disable-validation"])
    return os.path.join(save, "checkpoint_last.pt")


@pytest.fixture(scope="module", params=["transformer", "transformer_gtrans"])
def segment_ckpt(request, toy_bin, tmp_path_factory):
    """A doc2doc transformer and a G-Transformer, 2 updates on greedy segments."""
    save = str(tmp_path_factory.mktemp(f"d2d_{request.param}"))
    return _train(toy_bin, save, request.param)


@pytest.fixture(scope="module")
def loaded(segment_ckpt, toy_bin):
    model, task, cfg = cxmi.load(segment_ckpt, toy_bin, cuda=False)
    return model.eval(), task, cfg


@torch.no_grad()
def _forward_logprobs(model, src, tgt):
    """Per target token log-probabilities of one pair (batch of one, fairseq's
    shift for the decoder input)."""
    eos = model.decoder.dictionary.eos()
    prev = torch.cat([torch.tensor([eos]), tgt[:-1]]).unsqueeze(0)
    out = model(src_tokens=src.unsqueeze(0), src_lengths=torch.tensor([len(src)]),
                prev_output_tokens=prev)
    lp = model.get_normalized_probs(out, log_probs=True)[0]
    return lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1).double().numpy()


def _sep(task):
    return task.source_dictionary.index(task.cfg.doc2doc_separator)


def _tiny(src_sizes, tgt_sizes, docs, condition, max_tokens, seed=1):
    """A SegmentContextDataset over hand-made sentences: sentence j's tokens
    are ``10 + j`` repeated, then ``</s>``."""
    from fairseq.data import Dictionary, LanguagePairDataset

    from ctx_fairseq.eval.context_use.segment_context import SegmentContextDataset

    d = Dictionary()
    for k in range(40):
        d.add_symbol(f"w{k}")
    sep = d.add_symbol("<sep>")

    def sent(j, n):
        return torch.tensor([10 + j] * (n - 1) + [d.eos()])

    src = [sent(j, n) for j, n in enumerate(src_sizes)]
    tgt = [sent(j, n) for j, n in enumerate(tgt_sizes)]
    base = LanguagePairDataset(src, np.array(src_sizes), d, tgt, np.array(tgt_sizes), d,
                               shuffle=False)
    return SegmentContextDataset(base, docs, sep, sep, max_tokens, condition, seed=seed), sep


def test_a_tiny_segment_exactly():
    """Sizes (</s> included) of two documents: a = 3, 4, 2, 5 (target 3, 2, 2,
    6), b = 2, 2. With a limit of 10 tokens, sentence 3 of a takes sentence 2
    (2 + 5 source, 2 + 6 target tokens) but not sentence 1 (11 source tokens
    though the target's 10 would fit): the longer side counts."""
    docs = ["a", "a", "a", "a", "b", "b"]
    src, tgt = [3, 4, 2, 5, 2, 2], [3, 2, 2, 6, 2, 2]
    ds, sep = _tiny(src, tgt, docs, ContextCondition("true"), 10)
    assert [c.tolist() for c in ds.context_ids] == [[], [0], [0, 1], [2], [], [4]]
    assert ds.cut_by_limit.tolist() == [False, False, False, True, False, False]
    item = ds[3]
    assert item["source"].tolist() == [12, sep, 13, 13, 13, 13, 2]
    assert item["target"].tolist() == [12, sep, 13, 13, 13, 13, 13, 2]
    assert item["prefix_len"] == 2 and ds.size(3) == (7, 8)
    b = ds.collater([ds[3], ds[2], ds[0]])
    assert b["target_prefix_len"].tolist() == [ds.prefix_len[i] for i in b["id"].tolist()]
    assert b["net_input"]["prev_output_tokens"][b["id"].tolist().index(3)].tolist()[:3] == \
        [2, 12, sep]
    # a size keeps the nearest; none keeps nothing; shuffled reads the other document
    one, _ = _tiny(src, tgt, docs, ContextCondition("previous", 1), 100)
    assert [c.tolist() for c in one.context_ids] == [[], [0], [1], [2], [], [4]]
    none, _ = _tiny(src, tgt, docs, ContextCondition("none"), 100)
    assert all(len(c) == 0 for c in none.context_ids)
    assert torch.equal(none[3]["source"], none.base.src[3]) and none[3]["prefix_len"] == 0
    shuf, _ = _tiny(src, tgt, docs, ContextCondition("shuffled"), 100)
    assert shuf.donor[5] in (1, 2, 3) and shuf.donor[1] == 5 and shuf.donor[0] == 0
    assert shuf.context_ids[1].tolist() == [4]
    assert shuf.context_ids[5].tolist() == list(range(0, int(shuf.donor[5])))
    with pytest.raises(InputError, match="fewer than two documents"):
        _tiny(src[:4], tgt[:4], docs[:4], ContextCondition("shuffled"), 100)


def test_the_segment_of_a_sentence_by_hand(loaded):
    """Sentence i with its K previous sentences: ``x_1 <sep> .. x_i </s>`` on
    both sides, the target prefix the context's tokens with their separators;
    'none' the sentence alone; sizes cut the context; 'shuffled' another
    document's sentences; 'random' the same layout with other symbols."""
    _, task, _ = loaded
    assert is_segment_model(task)
    sep = _sep(task)
    ds = segment_condition_dataset(task, "test", ContextCondition("true"))
    base = ds.base
    i = int(np.flatnonzero(ds.sent_pos >= 2)[0])
    ctx = ds.context_ids[i].tolist()
    assert len(ctx) >= 2 and ctx[-1] == i - 1 and ctx == list(range(ctx[0], i))
    item = ds[i]

    def joined(side):
        parts = [getattr(base, side)[j].clone() for j in ctx + [i]]
        for p in parts[:-1]:
            p[-1] = sep
        return torch.cat(parts)

    assert torch.equal(item["source"], joined("src"))
    assert torch.equal(item["target"], joined("tgt"))
    assert item["prefix_len"] == sum(len(base.tgt[j]) for j in ctx)
    assert max(len(item["source"]), len(item["target"])) <= task.cfg.doc2doc_max_tokens
    # the context is the longest run that fits: one more sentence would not
    first = int(ds.doc_start[ds.doc_index[i]])
    if ctx[0] > first:
        j = ctx[0] - 1
        assert max(len(item["source"]) + len(base.src[j]),
                   len(item["target"]) + len(base.tgt[j])) > task.cfg.doc2doc_max_tokens
    alone = segment_condition_dataset(task, "test", ContextCondition("none"))[i]
    assert torch.equal(alone["source"], base.src[i]) and torch.equal(alone["target"], base.tgt[i])
    assert alone["prefix_len"] == 0
    one = segment_condition_dataset(task, "test", ContextCondition("previous", 1))
    assert one.context_ids[i].tolist() == [i - 1]
    shuf = segment_condition_dataset(task, "test", ContextCondition("shuffled"))
    donor = int(shuf.donor[i])
    assert shuf.doc_index[donor] != shuf.doc_index[i] and shuf.sent_pos[donor] > 0
    assert all(shuf.doc_index[j] == shuf.doc_index[donor] for j in shuf.context_ids[i])
    assert shuf.context_ids[i][-1] == donor - 1
    rnd = segment_condition_dataset(task, "test", ContextCondition("random"))[i]
    t = item["target"]
    assert rnd["prefix_len"] == item["prefix_len"] and len(rnd["target"]) == len(t)
    p = item["prefix_len"]
    assert torch.equal(rnd["target"][p:], t[p:])
    assert torch.equal(rnd["target"][:p].eq(sep), t[:p].eq(sep))
    assert not torch.equal(rnd["target"][:p], t[:p])


def test_scores_count_only_the_last_sentence(loaded):
    """ctx-cxmi's token log-probabilities under the true context are those of
    the last sentence's tokens in one forward pass of the whole segment;
    under 'none' they are the model's one-sentence segment; the context
    changes them."""
    model, task, _ = loaded
    true_ds = cxmi.condition_dataset(task, "test", "true")
    none_ds = cxmi.condition_dataset(task, "test", "none")
    lp_true = cxmi.token_logprobs(model, task, true_ds, max_tokens=300)
    lp_none = cxmi.token_logprobs(model, task, none_ds, max_tokens=300)
    with_ctx = np.flatnonzero(true_ds.sentences_with_context())
    assert len(with_ctx) > 5
    for i in list(with_ctx[:4]) + [int(np.flatnonzero(true_ds.sent_pos == 0)[0])]:
        item = true_ds[int(i)]
        full = _forward_logprobs(model, item["source"], item["target"])
        p = item["prefix_len"]
        np.testing.assert_allclose(lp_true[i], full[p:], atol=1e-5)
        assert len(lp_true[i]) == len(true_ds.base.tgt[i])
        alone = _forward_logprobs(model, true_ds.base.src[i], true_ds.base.tgt[i])
        np.testing.assert_allclose(lp_none[i], alone, atol=1e-5)
    # the task's own one-sentence segments (fairseq's batches) give the same numbers
    seg = task.datasets["test"]
    ones = [k for k in range(len(seg)) if len(seg.sentence_ids(k)) == 1]
    for k in ones[:3]:
        i = int(seg.sentence_ids(k)[0])
        b = seg.collater([seg[k]])
        out = model(**b["net_input"])
        lp = model.get_normalized_probs(out, log_probs=True)[0]
        got = lp.gather(-1, b["target"][0].unsqueeze(-1)).squeeze(-1).double().numpy()
        np.testing.assert_allclose(lp_none[i], got, atol=1e-5)
    diff = [abs(lp_true[i].sum() - lp_none[i].sum()) for i in with_ctx]
    assert max(diff) > 1e-3
    no_ctx = np.flatnonzero(~true_ds.sentences_with_context())
    for i in no_ctx:
        np.testing.assert_allclose(lp_true[i], lp_none[i], atol=1e-5)  # (other batches)


def test_cxmi_of_a_segment_model(loaded):
    model, task, cfg = loaded
    result, words = cxmi.compute_cxmi(model, task, cfg, "test", ["none", "shuffled", "random"],
                                      max_tokens=300, lang="de")
    assert result["cxmi"] != 0.0 and np.isfinite(result["cxmi"])
    assert result["segments"].startswith("doc2doc segments")
    assert result["sentences"] == len(task.datasets["test"].base)
    assert result["sentences_with_context"] > 0
    for c in ("shuffled", "random"):
        assert result[c]["cxmi"] != 0.0
    assert any("greedy" in n for n in result["notes"])
    zero, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["none"], max_tokens=300,
                                context_size=0)
    assert zero["cxmi"] == 0.0 and zero["sentences_with_context"] == 0
    curve, _ = cxmi.compute_cxmi(model, task, cfg, "test", ["none"], max_tokens=300,
                                 context_size=2, curve=True)
    assert [p["context_size"] for p in curve["curve"]] == [0, 1, 2]
    assert curve["curve"][0]["cxmi"] == 0.0
    assert curve["curve"][2]["cxmi"] == pytest.approx(curve["cxmi"], abs=1e-12)
    with pytest.raises(cxmi.CXMIError, match="give --context-size N"):
        cxmi.compute_cxmi(model, task, cfg, "test", ["none"], max_tokens=300, curve=True)


def _scores(ckpt, data, path, fmt="toy", **kw):
    return C.evaluate_checkpoint(ckpt, data, path, SuiteOptions(fmt=fmt, **kw),
                                 return_scores=True)


def test_contrastive_scores_of_a_segment_model(segment_ckpt, loaded, toy_bin, toy_corpus,
                                               tmp_path):
    """The toy suite (the split's previous sentences, their references as the
    target context) and the same examples in Voita's format (two previous
    sentences): a candidate's score is its tokens' log-probabilities after
    the prefix, in one forward pass of the segment; the
    bare suite (no context) gives the sentence-alone scores, which differ."""
    model, task, _ = loaded
    jsonl = os.path.join(toy_corpus, "test.contrastive.jsonl")
    with pytest.raises(ValueError, match="--gold-target-context"):
        _scores(segment_ckpt, toy_bin, jsonl)
    res, suite, toy = _scores(segment_ckpt, toy_bin, jsonl, gold_target_context=True)
    assert res["context"].startswith("doc2doc segment")
    exs = toy_examples(toy_corpus, k=2)
    voita = write_voita(str(tmp_path / "v.json"), exs)
    _, _, sv = _scores(segment_ckpt, toy_bin, voita, fmt="voita")
    # toy: every previous sentence that fits in 60 tokens; the suite: its two
    full_ds = segment_condition_dataset(task, "test", ContextCondition("true"))
    two_ds = segment_condition_dataset(task, "test", ContextCondition("previous", 2))
    assert max(len(full_ds.context_ids[ex.corpus_line]) for ex in suite.examples) > 2
    for ex, s_toy, s_v in zip(suite.examples, toy, sv):
        for ds, s in ((full_ds, s_toy), (two_ds, s_v)):
            item = ds[ex.corpus_line]
            full = _forward_logprobs(model, item["source"], item["target"])
            assert s[0] == pytest.approx(full[item["prefix_len"]:].sum(), abs=1e-4)
    true_ds = two_ds
    bare = write_voita(str(tmp_path / "bare.json"), [dict(e, ctx_src=[], ctx_tgt=[])
                                                      for e in exs])
    _, _, sb = _scores(segment_ckpt, toy_bin, bare, fmt="voita")
    base = true_ds.base
    for ex, s in zip(suite.examples, sb):
        alone = _forward_logprobs(model, base.src[ex.corpus_line], base.tgt[ex.corpus_line])
        assert s[0] == pytest.approx(alone.sum(), abs=1e-4)
    with_ctx = [k for k, e in enumerate(exs) if e["ctx_src"]]
    assert max(abs(sv[k][0] - sb[k][0]) for k in with_ctx) > 1e-3
    _, _, shuf = _scores(segment_ckpt, toy_bin, voita, fmt="voita", ablation="shuffled")
    assert max(abs(sv[k][0] - shuf[k][0]) for k in with_ctx) > 1e-3


def test_refusals(segment_ckpt, loaded, toy_bin, toy_corpus, tmp_path):
    """No target-side context in a suite, a memory's window and generative
    accuracy are refused, each with one line; never scored without context."""
    model, task, _ = loaded
    exs = toy_examples(toy_corpus, k=1)
    voita = write_voita(str(tmp_path / "v.json"), exs)
    suite = SuiteOptions(fmt="voita").read(voita)
    scorer = C.scorer_for_checkpoint(segment_ckpt, toy_bin, SuiteOptions(fmt="voita", cpu=True))
    suite.target_context = False
    with pytest.raises(C.ContextUnavailable, match="gives no target-side context"):
        scorer.check_context(suite)
    one = SuiteOptions(fmt="voita").read(voita)
    ex = next(e for e in one.examples if e.src_context)
    ex.tgt_context = None
    for cand in ex.candidates:
        cand.tgt_context = None
    with pytest.raises(C.ContextUnavailable, match="no target-side context"):
        scorer.rank_datasets(one)
    with pytest.raises(InputError, match="generative accuracy"):
        scorer.rank_datasets(SuiteOptions(fmt="voita").read(voita), generation=True)
    with pytest.raises(InputError, match="window bounds a document memory"):
        segment_condition_dataset(task, "test", ContextCondition("window", 1))


def test_both_commands_on_a_segment_checkpoint(segment_ckpt, toy_bin, toy_corpus, tmp_path,
                                               capsys):
    """ctx-cxmi and ctx-score-contrastive end to end (their parsers and
    outputs), the segment context named in what they print."""
    res = cxmi.cli_main(["--path", segment_ckpt, "--data", toy_bin, "--split", "test",
                         "--out", str(tmp_path / "cx"), "--cpu", "--max-tokens", "300",
                         "--conditions", "none,shuffled", "--lang", "de"])
    out = capsys.readouterr().out
    assert "context: doc2doc segments" in out and res["cxmi"] != 0.0
    assert os.path.exists(tmp_path / "cx" / "cxmi.json")
    jsonl = os.path.join(toy_corpus, "test.contrastive.jsonl")
    with pytest.raises(SystemExit):
        C.cli_main(["--path", segment_ckpt, "--data", toy_bin, "--contrastive", jsonl,
                    "--out-dir", str(tmp_path / "c")])
    assert "--gold-target-context" in capsys.readouterr().err
    r = C.cli_main(["--path", segment_ckpt, "--data", toy_bin, "--contrastive", jsonl,
                    "--out-dir", str(tmp_path / "c"), "--gold-target-context",
                    "--scores-out", str(tmp_path / "scores.txt")])
    assert r["context"].startswith("doc2doc segment")
    assert any("doc2doc segments" in n for n in r["notes"])
    n = sum(len(ex["scores"]) for ex in r["examples"])
    assert len(open(tmp_path / "scores.txt").read().split()) == n
