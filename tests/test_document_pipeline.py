"""The document pipeline on real input (issue 8): fairseq-interactive keeps
documents, batch sizes count context, truncation keeps the nearest
sentences, one docids reader, target context only where asked, resume
without re-reading the init checkpoint, per-epoch document grouping, and a
real two-process data-parallel run."""

import logging
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

import ctx_fairseq  # noqa: F401
from fairseq import options
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from ctx_fairseq.data.document_dataset import DocumentContextDataset
from ctx_fairseq.data.windows import truncate_windows
from ctx_fairseq.models.transformer_context_aware import ContextAwareTransformerEncoder
from fairseq_cli_utils import (
    REPO_ROOT,
    TINY_MODEL_ARGS,
    USER_DIR,
    document_dataset,
    interactive,
    train,
    write_two_documents,
)
from test_document_task import copy_bin, setup_task

DOC_ARGS = ["--task", "document_translation", "--source-context-size", "1"]


# --------------------------------------------------------------------------- interactive


def _spy_encoder(monkeypatch):
    """Record (source, source context) of every encoder call."""
    calls = []
    original = ContextAwareTransformerEncoder.forward

    def forward(self, *args, **kwargs):
        src = kwargs["src_tokens"] if "src_tokens" in kwargs else args[0]
        ctx = kwargs.get("src_ctx_tokens")
        calls.append((src.clone(), None if ctx is None else ctx.clone()))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ContextAwareTransformerEncoder, "forward", forward)
    return calls


def _rows(t, pad):
    return [r[r.ne(pad)] for r in t]


def _contexts_by_source(calls, d):
    """source sentence text -> the context text it was encoded with."""
    seen = {}
    for src, ctx in calls:
        assert ctx is not None, "the encoder ran without context inputs"
        for s, c in zip(_rows(src, d.pad()), _rows(ctx, d.pad())):
            seen[d.string(s)] = d.string(c)
    return seen


@pytest.mark.parametrize("buffer_size", [1, 2])
def test_interactive_translates_documents_with_context(context_ckpt, toy_bin, toy_corpus,
                                                       tmp_path, monkeypatch, buffer_size):
    ckpt, _ = context_ckpt
    inp = tmp_path / "input.txt"
    doc1, doc2 = write_two_documents(toy_corpus, inp)
    calls = _spy_encoder(monkeypatch)
    out = interactive([toy_bin, "--path", ckpt, *DOC_ARGS, "--source-lang", "src",
                       "--target-lang", "tgt", "--beam", "2", "--max-len-b", "10",
                       "--input", str(inp), "--buffer-size", str(buffer_size)])
    d = Dictionary.load(os.path.join(toy_bin, "dict.src.txt"))
    ctx = _contexts_by_source(calls, d)
    assert ctx[doc1[0]] == ""          # first sentence of the document: no context
    assert ctx[doc1[1]] == doc1[0]     # the second sentence received the first
    assert ctx[doc1[2]] == doc1[1]     # the third the second (context size 1)
    assert ctx[doc2[0]] == ""          # a blank line started a new document
    assert ctx[doc2[1]] == doc2[0]
    hyps = [line for line in out.splitlines() if line.startswith("H-")]
    assert len(hyps) == 5              # the blank line prints nothing
    assert {int(h.split("\t")[0][2:]) for h in hyps} == {0, 1, 2, 4, 5}


def test_interactive_refuses_following_context(context_ckpt, toy_bin, tmp_path):
    ckpt, _ = context_ckpt
    inp = tmp_path / "input.txt"
    inp.write_text("it sleeps .\n")
    with pytest.raises(ValueError, match="only context from previous sentences"):
        interactive([toy_bin, "--path", ckpt, *DOC_ARGS, "--context-direction", "both",
                     "--source-lang", "src", "--target-lang", "tgt", "--input", str(inp)])


def test_batch_without_context_never_reaches_the_model(toy_bin):
    task = setup_task(toy_bin)
    sample = {"net_input": {"src_tokens": torch.tensor([[4, 5, 2]]),
                            "src_lengths": torch.tensor([3])}}
    with pytest.raises(ValueError, match="would translate it without context"):
        task.inference_step(None, [], sample)


# --------------------------------------------------------------------------- batch sizes


@pytest.mark.parametrize("extra", [
    ["--source-context-size", "2"],
    ["--source-context-size", "1", "--target-context-size", "1"],
    ["--source-context-size", "3", "--context-direction", "both"],
    ["--document-context", "online"],
    ["--document-context", "offline"],
])
def test_max_tokens_bounds_what_the_model_processes(toy_bin, extra):
    task = setup_task(toy_bin, *extra)
    task.load_dataset("train")
    ds = task.datasets["train"]
    max_tokens = 400
    itr = task.get_batch_iterator(ds, max_tokens=max_tokens, seed=1,
                                  disable_iterator_cache=True)
    seen = 0
    for batch in itr.next_epoch_itr(shuffle=False):
        ni = batch["net_input"]
        enc = ni["src_tokens"].numel() + ni["src_ctx_tokens"].numel()
        dec = batch["target"].numel() + (ni["tgt_ctx_tokens"].numel()
                                         if "tgt_ctx_tokens" in ni else 0)
        assert max(enc, dec) <= max_tokens, (enc, dec)
        seen += ni["src_tokens"].size(0)
    assert seen == len(ds)
    # num_tokens counts the context
    i = int(np.flatnonzero(ds.sent_pos > 0)[0])
    assert ds.num_tokens(i) >= ds.base.src_sizes[i] + len(ds[i]["src_ctx"])


def test_a_sentence_whose_context_exceeds_max_tokens_is_a_clear_error(toy_bin):
    for extra in (["--source-context-size", "3"], ["--document-context", "online"]):
        task = setup_task(toy_bin, *extra)
        task.load_dataset("valid")
        with pytest.raises(ValueError, match="with its context needs .* more than --max-tokens 24"):
            task.get_batch_iterator(task.datasets["valid"], max_tokens=24, seed=1,
                                    disable_iterator_cache=True)


# --------------------------------------------------------------------------- truncation


def _fixed_dataset(n_sent=10, words=3, **kw):
    """One document of ``n_sent`` sentences of ``words`` words + </s>; the
    words of sentence j are all ``w{j}``."""
    d = Dictionary()
    for j in range(n_sent):
        d.add_symbol(f"w{j}")
    src = [torch.tensor([d.index(f"w{j}")] * words + [d.eos()]) for j in range(n_sent)]
    base = LanguagePairDataset(src, np.array([len(s) for s in src]), d, src,
                               np.array([len(s) for s in src]), d, shuffle=False)
    return document_dataset(base, ["doc"] * n_sent, **kw), d


def _context_sentences(ds, d, i):
    toks = ds.context_tokens(i)
    words = [d[t] for t in toks.tolist() if t != d.eos()]
    return words


@pytest.mark.parametrize("kw,index,expected", [
    (dict(src_context_size=5, direction="prev"), 7, [5, 6]),
    (dict(src_context_size=5, direction="next"), 2, [3, 4]),
    (dict(src_context_size=5, direction="both"), 5, [4, 6]),
    (dict(src_context_size=5, direction="both"), 0, [1, 2]),
    (dict(src_context_size=5, direction="both"), 9, [7, 8]),
    (dict(document_context="online"), 9, [7, 8]),
    (dict(document_context="offline"), 5, [4, 6]),
])
def test_truncation_keeps_the_nearest_sentences(kw, index, expected):
    # each sentence adds 4 tokens (3 words + separator): 10 tokens hold two sentences
    ds, d = _fixed_dataset(max_src_context_tokens=10, **kw)
    assert ds.context_indices(index) == expected
    words = _context_sentences(ds, d, index)
    assert words == [f"w{j}" for j in expected for _ in range(3)]
    assert len(ds.context_tokens(index)) == ds.context_length["src"][index] == 8
    offs = ds.context_sent_offsets(index) if ds.document_context != "none" else None
    if offs is not None:
        assert offs.tolist() == [j - index for j in expected for _ in range(4)]


def test_truncation_one_sentence_longer_than_the_limit():
    ds, d = _fixed_dataset(words=6, src_context_size=2, direction="prev",
                           max_src_context_tokens=4)
    toks = ds.context_tokens(5)  # the end of sentence 4, nearest the current one
    assert [d[t] for t in toks.tolist()] == ["w4", "w4", "w4", "</s>"]
    ds, d = _fixed_dataset(words=6, src_context_size=2, direction="next",
                           max_src_context_tokens=4)
    toks = ds.context_tokens(5)  # the beginning of sentence 6
    assert [d[t] for t in toks.tolist()] == ["w6", "w6", "w6", "</s>"]


def test_truncate_windows_matches_a_greedy_reference():
    rng = np.random.RandomState(0)
    for _ in range(200):
        n = rng.randint(1, 12)
        unit = rng.randint(1, 6, size=n)
        limit = int(rng.randint(1, 20))
        k = rng.randint(1, n + 1)
        i = np.arange(n)
        win = (np.maximum(i - k, 0), i, i + 1, np.minimum(i + 1 + k, n))
        (p_lo, p_hi, n_lo, n_hi), partial, length, full = truncate_windows(unit, win, limit)
        for s in range(n):
            order = []
            for r in range(1, n + 1):
                if s - r >= win[0][s]:
                    order.append(s - r)
                if s + r < win[3][s]:
                    order.append(s + r)
            kept, total = [], 0
            for j in order:
                if total + unit[j] > limit:
                    break
                kept.append(j)
                total += unit[j]
            got = list(range(p_lo[s], p_hi[s])) + list(range(n_lo[s], n_hi[s]))
            assert sorted(kept) == got, (unit, limit, k, s)
            assert full[s] == unit[win[0][s]:win[1][s]].sum() + unit[win[2][s]:win[3][s]].sum()
            if order and not kept:
                assert partial[s] and length[s] == limit
            else:
                assert not partial[s] and length[s] == total


def test_truncation_is_logged_once_per_split(toy_bin, caplog):
    task = setup_task(toy_bin, "--document-context", "online", "--max-source-positions", "20",
                      "--max-target-positions", "20")
    with caplog.at_level(logging.INFO):
        task.load_dataset("valid")
        task.load_dataset("valid")
    cut = [r for r in caplog.records if "source context longer than 20 tokens" in r.getMessage()]
    assert len(cut) == 1
    ds = task.datasets["valid"]
    assert max(len(ds[i]["src_ctx"]) for i in range(len(ds))) <= 20


# --------------------------------------------------------------------------- docids


def test_docids_with_bom_and_trailing_spaces_read_as_ctx_prep_docs(toy_bin, tmp_path):
    clean = setup_task(toy_bin)
    clean.load_dataset("test")
    data = copy_bin(toy_bin, tmp_path)
    path = os.path.join(data, "test.docids")
    lines = open(path).read().splitlines()
    with open(path, "w", encoding="utf-8") as f:
        f.write("\ufeff" + "\r\n".join(x + (" \t" if k % 3 else "") for k, x in enumerate(lines))
                + "\r\n")
    task = setup_task(data)
    task.load_dataset("test")
    assert task.datasets["test"].doc_names == clean.datasets["test"].doc_names
    assert np.array_equal(task.datasets["test"].doc_start, clean.datasets["test"].doc_start)


# --------------------------------------------------------------------------- target context


def test_target_context_file_applies_to_the_generation_split_only(toy_bin, tmp_path):
    ref = setup_task(toy_bin)
    ref.load_dataset("train")
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("".join("ist hier\n" for _ in range(len(ref.datasets["train"]))))
    task = setup_task(toy_bin, "--target-context-size", "1", "--target-context-file", str(hyp))
    with pytest.raises(ValueError, match="is for generation only"):
        task.load_dataset("train")
    with pytest.raises(ValueError, match="is for generation only"):
        task.load_dataset("valid")
    n = len(setup_task(toy_bin).datasets.get("test") or [])  # noqa: F841
    ref.load_dataset("test")
    hyp.write_text("".join("ist hier\n" for _ in range(len(ref.datasets["test"]))))
    task.load_dataset("test")  # --gen-subset (default: test)
    with pytest.raises(ValueError, match="--target-context-size is 0"):
        setup_task(toy_bin, "--target-context-file", str(hyp)).load_dataset("test")


def test_analysis_uses_reference_target_context_only_when_asked(context_ckpt, toy_bin,
                                                                monkeypatch):
    from fairseq_cli import generate as fs_generate

    from ctx_fairseq.eval.analyses import context_aware_analysis as caa

    seen = []
    monkeypatch.setattr(fs_generate, "main", lambda args: seen.append(args))
    ckpt, _ = context_ckpt
    caa.generate(ckpt, toy_bin)
    caa.generate(ckpt, toy_bin, gold_target_context=True)
    assert [a.gold_target_context for a in seen] == [False, True]

    from ctx_fairseq.data.contract import ContextSpec

    class _T:  # what the analysis reads of a task: its context specification
        context_spec = ContextSpec(target_context_size=1)

    with pytest.raises(ValueError, match="--gold-target-context"):
        caa.check_target_context(_T, False, "contrastive scoring")
    caa.check_target_context(_T, True, "contrastive scoring")


# --------------------------------------------------------------------------- resume


def test_resume_does_not_reread_the_init_checkpoint(toy_bin, sentence_ckpt, tmp_path):
    init = tmp_path / "stage1.pt"
    shutil.copy(sentence_ckpt, init)
    save = str(tmp_path / "save")
    common = [toy_bin, "--arch", "transformer_context_aware", *DOC_ARGS, *TINY_MODEL_ARGS,
              "--share-all-embeddings", "--init-from-sentence-checkpoint", str(init),
              "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--save-dir", save,
              "--no-progress-bar", "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0",
              "--disable-validation"]
    train(common + ["--max-update", "1"])
    os.remove(init)  # the stage-1 checkpoint moved away
    train(common + ["--max-update", "2"])  # resumes from checkpoint_last.pt
    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(save, "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 2
    # a new run still needs it
    with pytest.raises(FileNotFoundError, match="no such file"):
        train(common[:-1] + ["--disable-validation", "--max-update", "1", "--save-dir",
                             str(tmp_path / "fresh")])


# --------------------------------------------------------------------------- epochs


def test_one_worker_document_grouping_changes_every_epoch(toy_bin):
    task = setup_task(toy_bin, "--document-batching", "--source-context-size", "1")
    task.load_dataset("train")
    ds = task.datasets["train"]
    groups = []
    for epoch in (1, 2):
        itr = task.get_batch_iterator(ds, max_tokens=300, seed=1, epoch=epoch,
                                      disable_iterator_cache=True)
        groups.append({tuple(sorted(set(ds.doc_index[np.asarray(b)].tolist())))
                       for b in itr.frozen_batches})
        covered = sorted(i for b in itr.frozen_batches for i in b)
        assert covered == list(range(len(ds)))
    assert groups[0] != groups[1]
    # the same epoch gives the same grouping (every worker agrees)
    again = task.get_batch_iterator(ds, max_tokens=300, seed=1, epoch=2,
                                    disable_iterator_cache=True)
    assert {tuple(sorted(set(ds.doc_index[np.asarray(b)].tolist())))
            for b in again.frozen_batches} == groups[1]


# --------------------------------------------------------------------------- data parallel

_DDP_SCRIPT = r'''
import os, sys
sys.path.insert(0, {repo!r})
import ctx_fairseq  # noqa: F401
from fairseq.trainer import Trainer

_train_step = Trainer.train_step
OUT = {out!r}


def train_step(self, samples, raise_oom=False):
    with open(os.path.join(OUT, "ids.%s" % os.environ["RANK"]), "a") as f:
        for s in samples:
            if s:
                f.write(" ".join(map(str, s["id"].tolist())) + "\n")
    return _train_step(self, samples, raise_oom=raise_oom)


Trainer.train_step = train_step
from fairseq_cli.train import cli_main
sys.argv = ["fairseq-train"] + {argv!r} + sys.argv[1:]
cli_main()
'''


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_data_parallel_training_partitions_the_sentences(toy_bin, tmp_path):
    """Each sentence is trained on once by one of the two workers (fairseq's
    round-robin shards; that they train as one process with --update-freq 2:
    tests/test_data_parallel.py)."""
    out = tmp_path / "out"
    out.mkdir()
    argv = [toy_bin, "--user-dir", USER_DIR, "--arch", "transformer_context_aware", *DOC_ARGS,
            "--document-batching", *TINY_MODEL_ARGS, "--share-all-embeddings",
            "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "300", "--max-epoch", "1",
            "--cpu", "--distributed-world-size", "2", "--distributed-backend", "gloo",
            "--ddp-backend", "legacy_ddp", "--no-save", "--disable-validation",
            "--num-workers", "0", "--seed", "1", "--no-progress-bar", "--log-interval", "1"]
    # on CPU, fairseq cannot infer ranks from torchrun (it divides by the GPU count):
    # one process per rank with an explicit TCP rendezvous, as on several nodes
    argv += ["--distributed-init-method", f"tcp://127.0.0.1:{_free_port()}",
             "--distributed-no-spawn"]
    script = tmp_path / "run.py"
    script.write_text(_DDP_SCRIPT.format(repo=REPO_ROOT, out=str(out), argv=argv))
    procs = [subprocess.Popen(
        [sys.executable, str(script), "--distributed-rank", str(rank)],
        env=dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    proc = subprocess.CompletedProcess([], 0, "", "\n".join(logs))
    ids = {}
    for rank in (0, 1):
        path = out / f"ids.{rank}"
        assert path.exists(), proc.stderr[-4000:]
        ids[rank] = [int(x) for line in path.read_text().split("\n") for x in line.split()]
        assert ids[rank], f"worker {rank} trained on nothing"
    task = setup_task(toy_bin, "--document-batching")
    task.load_dataset("train")
    ds = task.datasets["train"]
    every = ids[0] + ids[1]
    assert sorted(every) == list(range(len(ds)))  # a partition: each sentence once


# --------------------------------------------------------------------------- review fixes


def test_generation_with_other_context_options_than_trained_is_an_error(context_ckpt, toy_bin):
    from fairseq_cli_utils import generate

    ckpt, _ = context_ckpt
    base = [toy_bin, "--path", ckpt, "--task", "document_translation", "--beam", "1",
            "--max-len-b", "5", "--num-workers", "0", "--max-tokens", "500"]
    with pytest.raises(ValueError, match=r"--source-context-size 3 \(trained with 1\)"):
        generate(base + ["--source-context-size", "3"])
    out = generate(base + ["--source-context-size", "3", "--allow-context-change"])
    assert "H-" in out
    # without the document task the context model refuses instead of dropping its context
    with pytest.raises(ValueError, match="no context inputs"):
        generate([toy_bin, "--path", ckpt, "--beam", "1", "--max-len-b", "5",
                  "--num-workers", "0"])


def test_target_context_sources_are_exclusive_and_files_may_have_a_bom(toy_bin, tmp_path):
    ref = setup_task(toy_bin)
    ref.load_dataset("test")
    n = len(ref.datasets["test"])
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("\ufeff" + "".join("ist hier\n" for _ in range(n)), encoding="utf-8")
    task = setup_task(toy_bin, "--target-context-size", "1", "--target-context-file", str(hyp))
    task.load_dataset("test")
    ds = task.datasets["test"]
    i = int(ds.doc_start[0]) + 1
    assert task.tgt_dict.string(ds[i]["tgt_ctx"]) == "ist hier"  # no <unk> from the BOM
    with pytest.raises(ValueError, match="choose one source of target context"):
        setup_task(toy_bin, "--target-context-size", "1", "--target-context-file", str(hyp),
                   "--gold-target-context").load_dataset("test")


def test_score_contrastive_scores_document_checkpoints_with_context(context_ckpt, toy_bin,
                                                                   toy_corpus, capsys, tmp_path):
    from ctx_fairseq.eval.scoring import contrastive

    ckpt, _ = context_ckpt
    jsonl = os.path.join(toy_corpus, "test.contrastive.jsonl")
    calls = []
    real = contrastive.ContrastiveScorer.score_rows

    def spy(self, ds, rows):
        calls.append(ds.collater([ds[int(r)] for r in rows[:2]])["net_input"])
        return real(self, ds, rows)

    contrastive.ContrastiveScorer.score_rows = spy
    try:
        contrastive.cli_main(["--path", ckpt, "--data", toy_bin, "--contrastive", jsonl,
                              "--out-dir", str(tmp_path)])
    finally:
        contrastive.ContrastiveScorer.score_rows = real
    assert calls and all("src_ctx_tokens" in ni for ni in calls)  # with context inputs
    assert "overall" in capsys.readouterr().out


def test_readme_commands_set_up_run_the_demo_and_test(tmp_path):
    readme = open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8").read()
    block = readme.split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    assert "bash scripts/install.sh" in block[0] and block[0].rstrip().endswith("ctx-demo")
    assert block[1].rstrip().endswith("python -m pytest")
    ci = open(os.path.join(REPO_ROOT, ".ci", "run"), encoding="utf-8").read()
    assert "bash scripts/install.sh" in ci and "python -m pytest" in ci


def test_interactive_target_context_is_the_models_own_translations(selective_dec_ckpt, toy_bin,
                                                                  toy_corpus, tmp_path,
                                                                  monkeypatch):
    """Three sentences in one buffer and one batch: each is translated with
    the model's translations of the previous ones as its target memory."""
    from ctx_fairseq.models.transformer_selective_doc.encoder import SelectiveDocEncoder

    seen = []
    original = SelectiveDocEncoder.forward

    def forward(self, *args, **kwargs):
        if kwargs.get("mem_tgt_tokens") is not None:
            seen.append({k: kwargs[k].clone() for k in ("query_pos", "mem_pos", "mem_tgt_tokens")})
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SelectiveDocEncoder, "forward", forward)
    src = open(os.path.join(toy_corpus, "test.src")).read().splitlines()[:3]
    inp = tmp_path / "input.txt"
    inp.write_text("\n".join(src) + "\n")
    out = interactive([toy_bin, "--path", selective_dec_ckpt, "--task", "document_translation",
                       "--document-context", "online", "--document-memory",
                       "--target-context-size", "1", "--source-lang", "src",
                       "--target-lang", "tgt", "--beam", "2", "--max-len-b", "6",
                       "--input", str(inp), "--buffer-size", "3", "--batch-size", "3"])
    hyps = {}
    for line in out.splitlines():
        if line.startswith("H-"):
            hyps[int(line.split("\t")[0][2:])] = line.split("\t")[2]
    assert sorted(hyps) == [0, 1, 2]
    d = Dictionary.load(os.path.join(toy_bin, "dict.tgt.txt"))
    by_pos = {}
    for call in seen:
        assert call["query_pos"].numel() == 1  # one sentence at a time
        by_pos[int(call["query_pos"][0])] = call
    assert sorted(by_pos) == [0, 1, 2]
    for p in (1, 2):
        mem = by_pos[p]
        assert mem["mem_pos"].tolist() == list(range(p))
        for r in range(p):
            row = mem["mem_tgt_tokens"][r]
            assert d.string(row[row.ne(d.pad())]) == hyps[r]
