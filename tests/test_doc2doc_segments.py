"""--doc2doc (issue 39, data side): segment plans (greedy, multi-resolution)
with exact expected segments, every sentence once per resolution, long
sentences alone, the segment dataset's layout and batches, the task's
options and bad input, a toy doc2doc training run from scratch and from a
sentence checkpoint without the separator, and ctx-doc2doc-split."""

import json
import os

import numpy as np
import pytest
import torch

from ctx_fairseq.data.segments import plan_segments
from ctx_fairseq.errors import InputError
from fairseq_cli_utils import TINY_MODEL_ARGS, generate, preprocess, train

pytestmark = pytest.mark.usefixtures("one_thread")

D2D = ["--task", "document_translation", "--doc2doc", "greedy", "--source-context-size", "0"]


def _segments(plan):
    return [(int(r), plan.sentence_ids(i).tolist()) for i, r in enumerate(plan.resolution)]


# ------------------------------------------------------------------ the plans
#: sizes (</s> included) of a hand-made corpus: document a (5 sentences),
#: document b (2), document c (1)
SRC = [3, 4, 2, 10, 3, 5, 5, 2]
TGT = [3, 5, 2, 3, 3, 5, 6, 2]
DOCS = list("aaaaabbc")


def test_greedy_segments_are_exact():
    plan = plan_segments(SRC, TGT, DOCS, "greedy", 9)
    # a: 0+1 is 7 / 8 tokens (+2 would make the target 10); 3 is 10 > 9 alone;
    # b: 5 + 6 target tokens > 9; c alone
    assert _segments(plan) == [(0, [0, 1]), (0, [2]), (0, [3]), (0, [4]), (0, [5]), (0, [6]),
                               (0, [7])]
    assert plan.doc.tolist() == [0, 0, 0, 0, 1, 1, 2]
    s = plan.summary
    assert (s["segments"], s["over_long"], s["over_long_sentences"], s["documents"]) == \
        (7, 1, [3], 3)
    assert s["longest"] == 10 and "1 sentence(s) longer than the limit" in plan.describe()
    # a large limit: one segment per document
    assert _segments(plan_segments(SRC, TGT, DOCS, "greedy", 100)) == \
        [(0, [0, 1, 2, 3, 4]), (0, [5, 6]), (0, [7])]
    # the limit counts the longer side, separators and </s> included: exactly at the limit
    assert _segments(plan_segments([4, 5], [5, 4], ["d", "d"], "greedy", 9)) == [(0, [0, 1])]
    assert _segments(plan_segments([4, 5], [5, 5], ["d", "d"], "greedy", 9)) == \
        [(0, [0]), (0, [1])]


def test_multires_segments_per_resolution_are_exact():
    plan = plan_segments(SRC, TGT, DOCS, "multires", 100)
    # a (N=5): 1 chunk of 5; 2 chunks (2, 3); 4 chunks (1, 1, 1, 2); 5 of 1
    # b (N=2): 1 chunk of 2; 2 of 1.  c (N=1): 1 chunk
    assert _segments(plan) == [
        (0, [0, 1, 2, 3, 4]), (1, [0, 1]), (1, [2, 3, 4]), (2, [0]), (2, [1]), (2, [2]),
        (2, [3, 4]), (3, [0]), (3, [1]), (3, [2]), (3, [3]), (3, [4]),
        (0, [5, 6]), (1, [5]), (1, [6]), (0, [7])]
    s = plan.summary
    assert s["resolutions"] == [0, 1, 2, 3]
    assert s["segments_per_resolution"] == [3, 4, 4, 5]
    assert s["split_chunks"] == 0 and s["over_long"] == 0


def test_multires_chunks_over_the_limit_are_split_greedily_and_counted():
    plan = plan_segments(SRC, TGT, DOCS, "multires", 9)
    got = _segments(plan)
    # resolution 0 of a is the greedy plan of a; b's whole document too
    assert [g for g in got if g[0] == 0] == [(0, [0, 1]), (0, [2]), (0, [3]), (0, [4]),
                                             (0, [5]), (0, [6]), (0, [7])]
    # resolution 1 of a: (0, 1) fits; (2, 3, 4) is split at the limit
    assert [g for g in got if g[0] == 1][:4] == [(1, [0, 1]), (1, [2]), (1, [3]), (1, [4])]
    s = plan.summary
    # split chunks: a and b at 0, a at 1 and 2 (its (3, 4) chunk)
    assert s["split_chunks_per_resolution"] == [2, 1, 1, 0]
    assert s["over_long"] == 1  # sentence 3, counted once


@pytest.mark.parametrize("mode", ["greedy", "multires"])
def test_every_sentence_is_in_exactly_one_segment_per_resolution(mode):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=60)
    docs = np.repeat([f"d{i}" for i in range(60)], lengths).tolist()
    n = len(docs)
    src, tgt = rng.integers(2, 80, size=n), rng.integers(2, 80, size=n)
    plan = plan_segments(src, tgt, docs, mode, 128)
    cs, ct = np.concatenate([[0], np.cumsum(src)]), np.concatenate([[0], np.cumsum(tgt)])
    for k in plan.summary["resolutions"]:
        seen = np.zeros(n, dtype=np.int64)
        for i in np.flatnonzero(plan.resolution == k):
            ids = plan.sentence_ids(i)
            assert len({docs[j] for j in ids}) == 1  # one document
            seen[ids] += 1
            a, b = ids[0], ids[-1] + 1
            assert max(cs[b] - cs[a], ct[b] - ct[a]) <= 128 or len(ids) == 1
        # every sentence of a document that has resolution k once, others never
        starts = [0] + [j for j in range(1, n) if docs[j] != docs[j - 1]] + [n]
        for a, b in zip(starts[:-1], starts[1:]):
            has_k = k == 0 or 2 ** (k - 1) < b - a
            assert (seen[a:b] == (1 if has_k else 0)).all(), (k, a, b)


def test_plan_checks_its_inputs():
    with pytest.raises(ValueError, match="segment mode"):
        plan_segments(SRC, TGT, DOCS, "whole", 9)
    with pytest.raises(ValueError, match="one of each per sentence"):
        plan_segments(SRC, TGT[:-1], DOCS, "greedy", 9)
    assert len(plan_segments([], [], [], "greedy", 9)) == 0


# ------------------------------------------------------------ the task side
def _task(data, *extra):
    from fairseq import options, tasks

    import ctx_fairseq  # noqa: F401

    args = options.parse_args_and_arch(options.get_training_parser(),
                                       [data, "--arch", "transformer", *extra])
    return tasks.setup_task(args)


def test_segments_from_the_binaries(toy_bin):
    task = _task(toy_bin, *D2D, "--doc2doc-max-tokens", "40")
    d = task.source_dictionary
    sep = d.index("<sep>")
    assert sep == len(d) - 1 and task.target_dictionary.index("<sep>") == sep
    assert task.context_spec.doc2doc_separator_index == sep
    task.load_dataset("test")
    ds = task.datasets["test"]
    base = ds.base
    covered = []
    for i in range(len(ds)):
        item = ds[i]
        ids = ds.sentence_ids(i).tolist()
        covered += ids
        for side, parts in (("source", [base.src[j] for j in ids]),
                            ("target", [base.tgt[j] for j in ids])):
            want = torch.cat([torch.cat([p[:-1], torch.tensor([sep])]) for p in parts[:-1]]
                             + [parts[-1]])
            assert torch.equal(item[side], want)
        assert ds.size(i) == (len(item["source"]), len(item["target"]))
        assert ds.num_tokens(i) == max(ds.size(i)) <= 40
    assert covered == list(range(len(base)))  # greedy: corpus order, each once
    b = ds.collater([ds[i] for i in range(4)])
    assert set(b["net_input"]) == {"src_tokens", "src_lengths", "prev_output_tokens"}
    # a one-sentence segment is exactly the sentence-level sample
    one = _task(toy_bin, *D2D, "--doc2doc-max-tokens", "2")
    one.load_dataset("test")
    s1 = one.datasets["test"]
    assert len(s1) == len(base) and s1.plan.summary["over_long"] == len(base)
    for i in (0, 5):
        assert torch.equal(s1[i]["source"], base[i]["source"])
        assert torch.equal(s1[i]["target"], base[i]["target"])


def test_the_train_split_gets_the_mode_and_the_others_greedy(toy_bin, caplog):
    import logging

    task = _task(toy_bin, "--task", "document_translation", "--doc2doc", "multires",
                 "--source-context-size", "0", "--doc2doc-max-tokens", "40")
    with caplog.at_level(logging.INFO):
        task.load_dataset("train")
        task.load_dataset("valid")
    assert task.datasets["train"].plan.mode == "multires"
    assert task.datasets["valid"].plan.mode == "greedy"
    assert len(set(task.datasets["train"].plan.resolution.tolist())) > 1
    assert "multires segments" in caplog.text and "chunks split at the limit" in caplog.text


def test_options_are_checked(toy_bin):
    doc = ["--task", "document_translation"]
    cases = [
        ([*doc, "--doc2doc", "greedy"], "--source-context-size 0"),
        ([*D2D, "--concat-context"], "--concat-context"),
        ([*D2D, "--document-batching"], "--document-batching"),
        ([*D2D, "--doc2doc-max-tokens", "2000"], "more than --max-source-positions"),
        ([*D2D, "--doc2doc-separator", "</s>"], "special symbols"),
        ([*doc, "--doc2doc-frame"], "goes with --doc2doc"),
        ([*D2D, "--doc2doc-max-len-a", "0", "--doc2doc-max-len-b", "0"], "at least one token"),
        ([*doc, "--lr-scale-pretrained", "-1"], ">= 0"),
    ]
    for argv, match in cases:
        with pytest.raises(InputError, match=match):
            _task(toy_bin, *argv)


def test_the_contract_options_and_their_defaults():
    from ctx_fairseq.tasks.document_config import DocumentTranslationConfig

    cfg = DocumentTranslationConfig()
    assert (cfg.doc2doc, cfg.doc2doc_max_tokens, cfg.doc2doc_separator, cfg.doc2doc_frame,
            cfg.doc2doc_min_sentence_len, cfg.doc2doc_max_len_a, cfg.doc2doc_max_len_b,
            cfg.lr_scale_pretrained) == ("none", 512, "<sep>", False, 1, 1.5, 10, 1.0)


def test_a_context_architecture_is_refused(toy_bin):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        toy_bin, "--arch", "transformer_context_aware", *D2D, *TINY_MODEL_ARGS])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    assert task.context_spec.doc2doc == "greedy" and not task.context_spec.uses_context
    with pytest.raises(InputError, match="reads context inputs of its own"):
        task.build_model(cfg.model)


def test_doc2doc_options_join_the_checked_context_options():
    from ctx_fairseq.tasks.context_options import context_option_args, context_option_diff
    from ctx_fairseq.tasks.document_config import CONTEXT_OPTIONS

    assert {"doc2doc", "doc2doc_max_tokens", "doc2doc_separator"} <= set(CONTEXT_OPTIONS)
    trained = {"doc2doc": "greedy", "doc2doc_max_tokens": 512, "doc2doc_separator": "<sep>"}
    ours = dict(trained, doc2doc_max_tokens=1000)
    assert context_option_diff(trained, ours) == ["--doc2doc-max-tokens 1000 (trained with 512)"]
    assert context_option_diff({}, ours) == []  # a checkpoint older than the options
    args = context_option_args(trained)
    assert args[args.index("--doc2doc") + 1] == "greedy"


def test_a_segment_over_the_positions_is_refused(toy_bin):
    task = _task(toy_bin, *D2D, "--doc2doc-max-tokens", "8", "--max-source-positions", "8",
                 "--max-target-positions", "8")
    with pytest.raises(InputError, match=r"segment \d+ \(document '.*' of .*test.docids, "
                                         r"sentences \d+-\d+\) has \d+ (source|target) tokens, "
                                         r"more than --max-(source|target)-positions 8"):
        task.load_dataset("test")


def test_max_tokens_below_the_longest_segment_is_one_line(toy_bin):
    """fairseq's batching asserts every sample fits --max-tokens (a
    traceback), or, where it filters by size, skips the segments over it:
    below --doc2doc-max-tokens both are refused with the segment and the
    value to set; at or above it only a single over-long sentence can exceed
    --max-tokens, refused where fairseq would assert and left to fairseq's
    filter where it filters (as for sentence-level data)."""
    task = _task(toy_bin, *D2D, "--doc2doc-max-tokens", "40")
    task.load_dataset("test")
    ds = task.dataset("test")
    cost = ds.num_tokens_vec(np.arange(len(ds)))
    longest = int(cost.max())
    assert longest > 20
    msg = (r"--max-tokens 20 \(--max-tokens-valid in validation\) cannot hold segment \d+ "
           r"\(document '.*' of .*test.docids, sentences \d+-\d+\): \d+ tokens .* set the "
           rf"batch size to at least {longest} tokens$")
    with pytest.raises(InputError, match=msg):
        task.get_batch_iterator(ds, max_tokens=20)
    with pytest.raises(InputError, match=msg):  # training's filter would skip them
        task.get_batch_iterator(ds, max_tokens=20, max_positions=(1024, 1024),
                                ignore_invalid_inputs=True)
    itr = task.get_batch_iterator(ds, max_tokens=longest)
    assert sum(len(b) for b in itr.frozen_batches) == len(ds)
    # a single sentence over the limit (a segment alone) over --max-tokens >= the limit
    task = _task(toy_bin, *D2D, "--doc2doc-max-tokens", "6")
    task.load_dataset("test")
    ds = task.dataset("test")
    cost = ds.num_tokens_vec(np.arange(len(ds)))
    assert cost.max() > 8 and (ds.plan.counts[cost > 8] == 1).all()
    with pytest.raises(InputError, match=r"--max-tokens 8 .* set the batch size to at least"):
        task.get_batch_iterator(ds, max_tokens=8)
    itr = task.get_batch_iterator(ds, max_tokens=8, max_positions=(8, 8),
                                  ignore_invalid_inputs=True)
    kept = sum(len(b) for b in itr.frozen_batches)
    assert kept == int((cost <= 8).sum()) < len(ds)  # fairseq's filter skipped the others


def _tiny_corpus(tmp_path, src_lines, tgt_lines, docids, dict_from=None):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "test"):
        (raw / f"{split}.src").write_text("\n".join(src_lines) + "\n")
        (raw / f"{split}.tgt").write_text("\n".join(tgt_lines) + "\n")
    dest = str(tmp_path / "bin")
    preprocess(["--source-lang", "src", "--target-lang", "tgt", "--trainpref",
                str(raw / "train"), "--testpref", str(raw / "test"), "--destdir", dest,
                "--joined-dictionary", "--workers", "1"])
    for split in ("train", "test"):
        with open(os.path.join(dest, f"{split}.docids"), "w") as f:
            f.write("\n".join(docids) + "\n")
    return dest


def test_the_separator_inside_the_text_is_refused(tmp_path):
    data = _tiny_corpus(tmp_path, ["a b", "c <sep> d", "e"], ["x", "y", "z"], ["d1", "d2", "d2"])
    task = _task(data, *D2D)
    with pytest.raises(InputError, match=r"test\.src-tgt\.src: sentence 1 \(line 2, document "
                                         r"'d2'\) contains the separator '<sep>'"):
        task.load_dataset("test")


def test_documents_not_contiguous_are_refused(tmp_path):
    data = _tiny_corpus(tmp_path, ["a b", "c d", "e"], ["x", "y", "z"], ["d1", "d2", "d1"])
    task = _task(data, *D2D)
    with pytest.raises(InputError, match=r"test\.docids:3: document d1 reappears"):
        task.load_dataset("test")


def test_a_sentence_empty_on_one_side_is_counted(tmp_path, caplog):
    import logging

    data = _tiny_corpus(tmp_path, ["a b", "c d", "e"], ["x", "", "z"], ["d1", "d1", "d1"])
    task = _task(data, *D2D)
    with caplog.at_level(logging.WARNING):
        task.load_dataset("test")
    assert "1 sentence(s) empty on one side only (first: line 2" in caplog.text
    sep = task.target_dictionary.index("<sep>")
    assert task.datasets["test"][0]["target"].tolist().count(sep) == 2


# ------------------------------------------------------------ training runs
def _train(data, save, *extra, updates=2):
    train([data, "--arch", "transformer", *TINY_MODEL_ARGS, *D2D, "--doc2doc-max-tokens", "60",
           "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3",
           "--max-tokens", "500", "--max-update", str(updates), "--save-dir", save,
           "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
           "--disable-validation", *extra])
    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(save, "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == updates
    return state


@pytest.fixture(scope="module")
def doc2doc_run(toy_bin, tmp_path_factory):
    """A transformer trained 2 updates on greedy segments, and the test
    split it generated (beam 2)."""
    save = str(tmp_path_factory.mktemp("d2d"))
    _train(toy_bin, save)
    ckpt = os.path.join(save, "checkpoint_last.pt")
    out = generate([toy_bin, "--path", ckpt, *D2D, "--doc2doc-max-tokens", "60", "--beam", "2",
                    "--max-tokens", "500", "--gen-subset", "test", "--num-workers", "0",
                    "--max-len-b", "60"])
    path = os.path.join(save, "gen.txt")
    with open(path, "w") as f:
        f.write(out)
    return ckpt, path


def test_doc2doc_trains_and_generates_segments(doc2doc_run, toy_bin):
    ckpt, gen = doc2doc_run
    from ctx_fairseq.generate_output import read_generate_output

    out = read_generate_output(gen)
    with open(os.path.join(toy_bin, "test.docids")) as f:
        ids = f.read().split()
    plan = plan_segments(*_sizes(toy_bin, "test"), ids, "greedy", 60)
    assert out.ids == list(range(len(plan))) and len(plan) < len(ids)
    assert any("<sep>" in s for s in out.sources)


def test_generation_without_the_frame_is_not_cut_silently(doc2doc_run, toy_bin, caplog):
    """fairseq's default output cap (200 tokens) below --doc2doc-max-tokens
    is refused; a segment that reaches a given cap is warned about, counted."""
    import logging

    ckpt, _ = doc2doc_run
    base = [toy_bin, "--path", ckpt, *D2D, "--doc2doc-max-tokens", "60", "--beam", "1",
            "--max-tokens", "500", "--gen-subset", "test", "--num-workers", "0"]
    with pytest.raises(InputError, match=r"--max-len-b 59 would cut the translation of a "
                                         r"segment of --doc2doc-max-tokens 60"):
        generate([*base, "--max-len-b", "59"])
    with caplog.at_level(logging.WARNING):
        generate([*base, "--max-len-a", "0.1", "--max-len-b", "55"])
    assert "reached the maximum output length" in caplog.text


def _sizes(data, split):
    from fairseq.data import data_utils

    out = []
    for lang in ("src", "tgt"):
        ds = data_utils.load_indexed_dataset(os.path.join(data, f"{split}.src-tgt.{lang}"), None)
        # a copy while the dataset lives: the sizes are a view of its memory map
        out.append(np.array(ds.sizes, dtype=np.int64))
    return out


def test_generation_checks_the_doc2doc_options_against_the_checkpoint(doc2doc_run, toy_bin):
    ckpt, _ = doc2doc_run
    with pytest.raises(InputError, match=r"--doc2doc-max-tokens 30 \(trained with 60\)"):
        generate([toy_bin, "--path", ckpt, *D2D, "--doc2doc-max-tokens", "30", "--beam", "1",
                  "--gen-subset", "test", "--num-workers", "0"])


def test_a_sentence_checkpoint_without_the_separator_is_fine_tuned(sentence_ckpt, toy_bin,
                                                                      tmp_path, caplog):
    import logging

    from fairseq import checkpoint_utils

    theirs = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"]
    rows = theirs["encoder.embed_tokens.weight"].shape[0]
    with caplog.at_level(logging.INFO):
        state = _train(toy_bin, str(tmp_path), "--finetune-from-model", sentence_ckpt)
    ours = state["model"]
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                "decoder.output_projection.weight"):
        assert ours[key].shape[0] == rows + 1, key
    assert torch.equal(ours["encoder.embed_tokens.weight"],
                       ours["decoder.output_projection.weight"])  # shared, one new row
    assert caplog.text.count("the rows of the symbols the task added") == 1


def test_the_extended_rows_are_drawn_as_embeddings(sentence_ckpt, toy_bin):
    from fairseq import checkpoint_utils

    task = _task(toy_bin, *D2D, *TINY_MODEL_ARGS, "--share-all-embeddings")
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        toy_bin, "--arch", "transformer", *D2D, *TINY_MODEL_ARGS, "--share-all-embeddings"])
    model = task.build_model(convert_namespace_to_omegaconf(args).model)
    theirs = checkpoint_utils.load_checkpoint_to_cpu(sentence_ckpt)["model"]
    model.load_state_dict(theirs, strict=True)
    w = model.encoder.embed_tokens.weight.detach()
    old = theirs["encoder.embed_tokens.weight"]
    assert torch.equal(w[:len(old)], old)
    assert w[len(old):].abs().max() < 6 * w.size(1) ** -0.5 and w[len(old):].abs().sum() > 0
    assert torch.equal(model.decoder.output_projection.weight, model.encoder.embed_tokens.weight)
    # the project's two-stage loader extends them too (--init-from-sentence-checkpoint)
    from ctx_fairseq.models._fairseq_utils import load_sentence_checkpoint

    fresh = task.build_model(convert_namespace_to_omegaconf(args).model)
    got = load_sentence_checkpoint(fresh, sentence_ckpt)
    assert "encoder.embed_tokens.weight" in got["loaded"] and not got["fresh"]
    assert torch.equal(fresh.encoder.embed_tokens.weight[:len(old)], old)
    # a checkpoint with another number of rows fails as before
    bad = dict(theirs, **{k: v[:-2] for k, v in theirs.items() if "embed_tokens" in k
                          or "output_projection" in k})
    with pytest.raises(RuntimeError, match="size mismatch"):
        model.load_state_dict(bad, strict=True)


# ----------------------------------------------------------- the splitter
def _split(*argv):
    from ctx_fairseq.cli.doc2doc_split import cli_main

    return cli_main(list(argv))


def test_the_splitter_on_a_real_run(doc2doc_run, toy_bin, tmp_path):
    """The toy model's own output: split per sentence where every segment
    has its source's number of sentences, else refused (status 1) and split
    per document on request; ctx-doc-bleu reads either file."""
    from ctx_fairseq.eval.scoring.doc_bleu import doc_bleu
    from ctx_fairseq.generate_output import read_generate_output

    ckpt, gen = doc2doc_run
    g = read_generate_output(gen)
    bad = sum(h.count("<sep>") != s.count("<sep>") for h, s in zip(g.hypotheses, g.sources))
    out = str(tmp_path / "sent.txt")
    args = [gen, "--data", toy_bin, "--split", "test", "--path", ckpt, "--output", out]
    if bad:
        with pytest.raises(SystemExit) as e:
            _split(*args, "--report", str(tmp_path / "r.json"))
        assert e.value.code == 1
        assert json.load(open(tmp_path / "r.json"))["mismatched_segments"] == bad
        assert _split(*args, "--doc-level-only") == 0
        doc_bleu(out, out + ".docids")
    else:
        assert _split(*args) == 0
        doc_bleu(out, os.path.join(toy_bin, "test.docids"))


def _fake_output(toy_bin, tmp_path, bad_segments=()):
    """A generate output of the test split's greedy segments (60 tokens)
    whose hypotheses are the references, with one extra separator in
    ``bad_segments``."""
    from fairseq.data import Dictionary

    d = Dictionary.load(os.path.join(toy_bin, "dict.src.txt"))
    with open(os.path.join(toy_bin, "test.docids")) as f:
        ids = f.read().split()
    plan = plan_segments(*_sizes(toy_bin, "test"), ids, "greedy", 60)
    from fairseq.data import data_utils

    src = data_utils.load_indexed_dataset(os.path.join(toy_bin, "test.src-tgt.src"), d)
    tgt = data_utils.load_indexed_dataset(os.path.join(toy_bin, "test.src-tgt.tgt"), d)
    lines = []
    for i in range(len(plan)):
        sids = plan.sentence_ids(i)
        s = " <sep> ".join(d.string(src[j]) for j in sids)
        t = " <sep> ".join(d.string(tgt[j]) for j in sids)
        h = t + (" <sep> extra" if i in bad_segments else "")
        lines += [f"S-{i}\t{s}", f"T-{i}\t{t}", f"H-{i}\t-0.5\t{h}", f"D-{i}\t-0.5\t{h}"]
    path = str(tmp_path / "fake.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path, plan, ids


def test_the_splitter_maps_segments_to_sentence_ids(toy_bin, tmp_path):
    from ctx_fairseq.generate_output import read_generate_output

    path, plan, ids = _fake_output(toy_bin, tmp_path)
    out = str(tmp_path / "sent.txt")
    assert _split(path, "--data", toy_bin, "--split", "test", "--doc2doc-max-tokens", "60",
                  "--output", out) == 0
    got = read_generate_output(out)
    assert got.ids == list(range(len(ids)))
    assert got.hypotheses == got.references
    with open(out + ".segments") as f:  # the segment map of ctx-doc-bleu --segments
        assert [list(map(int, line.split())) for line in f] == \
            [plan.sentence_ids(i).tolist() for i in range(len(plan))]
    assert got.sources[0] and "<sep>" not in " ".join(got.sources + got.hypotheses)


def test_the_splitter_reports_mismatches_and_writes_documents_only_on_request(
        toy_bin, tmp_path, capsys):
    from ctx_fairseq.generate_output import read_generate_output

    path, plan, ids = _fake_output(toy_bin, tmp_path, bad_segments=(1, 3))
    out = str(tmp_path / "sent.txt")
    report = str(tmp_path / "r.json")
    with pytest.raises(SystemExit) as e:
        _split(path, "--data", toy_bin, "--split", "test", "--doc2doc-max-tokens", "60",
               "--output", out, "--report", report)
    assert e.value.code == 1 and not os.path.exists(out)
    err = capsys.readouterr().err
    assert f"2 of {len(plan)} segments" in err and "no per-sentence output written" in err
    r = json.load(open(report))
    assert [m["segment"] for m in r["mismatches"]] == [1, 3]
    assert r["mismatch_rate"] == pytest.approx(2 / len(plan))
    assert _split(path, "--data", toy_bin, "--split", "test", "--doc2doc-max-tokens", "60",
                  "--output", out, "--doc-level-only") == 0
    docs = read_generate_output(out)
    names = open(out + ".docids").read().split()
    assert len(docs.ids) == len(names) == len(dict.fromkeys(ids))
    bad_doc = names.index(ids[int(plan.starts[1])])
    assert "extra" in docs.hypotheses[bad_doc]
    assert not any("<sep>" in h for h in docs.hypotheses + docs.references)


def test_the_splitter_refuses_output_of_other_options(toy_bin, tmp_path, capsys):
    path, plan, ids = _fake_output(toy_bin, tmp_path)
    with pytest.raises(SystemExit) as e:
        _split(path, "--data", toy_bin, "--split", "test", "--doc2doc-max-tokens", "30",
               "--output", str(tmp_path / "x.txt"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "have no hypothesis" in err or "the output is not of this --data" in err


def test_the_separator_is_found_whatever_the_white_space_around_it():
    from ctx_fairseq.cli.doc2doc_split import split_at

    # SentencePiece's --remove-bpe glues the separator to the words
    assert split_at("a b<sep> c", "<sep>") == ["a b", "c"]
    assert split_at("a <sep> <sep> b", "<sep>") == ["a", "", "b"]
    assert split_at("", "<sep>") == [""]


def test_a_sentence_checkpoint_is_not_translated_on_segments(sentence_ckpt, toy_bin):
    """A checkpoint trained on sentences has no trained separator: generating
    segments with it is refused (its rows are extended only when a training
    run starts from it), never run with a random separator row."""
    with pytest.raises(InputError, match=r"rows for the \d+ symbols of the dictionaries: it "
                                         r"was trained without the symbols the task adds"):
        generate([toy_bin, "--path", sentence_ckpt, *D2D, "--doc2doc-max-tokens", "60",
                  "--beam", "1", "--gen-subset", "test", "--num-workers", "0",
                  "--max-len-a", "1.5", "--max-len-b", "10"])
