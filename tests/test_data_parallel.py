"""Data-parallel training is gradient accumulation: N gloo processes on the
CPU train exactly as one process with ``--update-freq N`` (issue 37).

Micro-batch ``u`` of rank ``r`` in update ``k`` is a batch of the one global
order of the epoch (seed and epoch only; fairseq's round-robin shards), so
after every update every parameter tensor of the N-process run agrees with
the one-process run to float round-off (the gradients are summed in another
order: ``||delta|| / ||theta|| <= 1e-6`` per tensor). The optimizer is SGD:
an update is then linear in the gradient, whose round-off it passes on as
it is; Adam divides each gradient by its running magnitude, so that a
parameter whose gradient is zero but for round-off (the attention's key
bias, which the softmax cancels) takes steps of the learning rate in the
round-off's direction, and two runs that sum the same gradients in another
order part by 1e-5 there after two updates. Each run is
fairseq-train's own entry in processes of its own (``tests/dp_runner.py``),
``--distributed-init-method tcp://`` as in the README's CPU command.
"""

import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from fairseq_cli_utils import REPO_ROOT, TINY_MODEL_ARGS, USER_DIR

RUNNER = os.path.join(REPO_ROOT, "tests", "dp_runner.py")
UPDATES = 6
TOLERANCE = 1e-6

COMMON = [*TINY_MODEL_ARGS, "--share-all-embeddings", "--dropout", "0",
          "--attention-dropout", "0", "--activation-dropout", "0",
          "--optimizer", "sgd", "--lr", "0.5", "--max-tokens", "300",
          "--disable-validation", "--no-save", "--num-workers", "0", "--seed", "1",
          "--no-progress-bar", "--log-interval", "1", "--cpu"]

DOC = ["--task", "document_translation"]
SELECTIVE = [*DOC, "--arch", "transformer_selective_doc", "--document-context", "online",
             "--document-memory"]

#: name -> (fairseq-train arguments, whether it reads the stage-1 checkpoint)
SETTINGS = {
    "sentence_batching": ([*DOC, "--arch", "transformer_context_aware",
                           "--source-context-size", "1"], False),
    "document_batching": ([*DOC, "--arch", "transformer_context_aware",
                           "--source-context-size", "1", "--document-batching"], False),
    "selective_frozen": ([*SELECTIVE, "--context-memory", "frozen"], True),
    "selective_shared": ([*SELECTIVE, "--context-memory", "shared"], False),
    "selective_precomputed": ([*SELECTIVE, "--context-memory", "frozen",
                               "--memory-precomputed"], True),
    "concat": ([*DOC, "--arch", "transformer_concat", "--concat-context",
                "--source-context-size", "1", "--target-context-size", "1"], False),
    "sampled_context": ([*DOC, "--arch", "transformer_context_aware",
                         "--source-context-size", "3", "--sampled-context-size", "3"], False),
    # the segment modes (issue 39): segments of consecutive sentences, a plain
    # transformer and G-Transformer
    "doc2doc_greedy": ([*DOC, "--arch", "transformer", "--source-context-size", "0",
                        "--doc2doc", "greedy", "--doc2doc-max-tokens", "60"], False),
    "doc2doc_multires": ([*DOC, "--arch", "transformer_gtrans", "--source-context-size", "0",
                          "--doc2doc", "multires", "--doc2doc-max-tokens", "60"], False),
    # the other architectures (ctx-demo's options for each)
    "han": ([*DOC, "--arch", "transformer_han", "--source-context-size", "3",
             "--target-context-size", "3"], True),
    "zhang2018": ([*DOC, "--arch", "transformer_doc_zhang2018", "--source-context-size", "2",
                   "--freeze-sentence-level"], True),
    "dc": (["--arch", "transformer_dc"], False),
    "hybrid": (["--arch", "transformer_hybrid"], False),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_training(out_dir, argv, world: int = 1, update_freq: int = 1,
                   ddp_backend: str = "legacy_ddp", spawn: bool = False):
    """Start fairseq-train ``argv`` in ``world`` processes (gloo, TCP
    rendezvous) recording through ``dp_runner.py`` into ``out_dir``: one
    command per rank (``--distributed-no-spawn``), or with ``spawn`` one
    command that spawns them. Returns the processes and their open logs."""
    os.makedirs(out_dir, exist_ok=True)
    argv = [*argv, "--update-freq", str(update_freq)]
    if world > 1:
        argv += ["--distributed-world-size", str(world), "--distributed-backend", "gloo",
                 "--ddp-backend", ddp_backend,
                 "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}"]
        if not spawn:
            argv.append("--distributed-no-spawn")
    procs, logs = [], []
    for rank in range(1 if spawn else world):
        extra = ["--distributed-rank", str(rank)] if world > 1 and not spawn else []
        log = open(os.path.join(out_dir, f"log.{rank}"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, RUNNER, str(out_dir), *argv, *extra],
            env=dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank)),
            stdout=log, stderr=subprocess.STDOUT, text=True))
    return procs, logs


def run_training(out_dir, argv, world: int = 1, update_freq: int = 1,
                 ddp_backend: str = "legacy_ddp", timeout: int = 900, spawn: bool = False):
    """fairseq-train ``argv`` in ``world`` processes (:func:`start_training`),
    waited for: returns ``out_dir``; a failed rank fails the test."""
    procs, logs = start_training(out_dir, argv, world, update_freq, ddp_backend, spawn)
    deadline = time.time() + timeout
    failed = None
    try:  # a rank that fails ends the run (the others would wait for it forever)
        while any(p.poll() is None for p in procs) and failed is None:
            failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            assert time.time() < deadline, f"no end after {timeout}s"
            time.sleep(0.2)
        failed = next((r for r, p in enumerate(procs) if p.returncode != 0), failed)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
        log.close()
    if failed is not None:
        raise AssertionError(f"rank {failed} failed:\n{texts[failed][-5000:]}")
    return out_dir


def updates(out_dir, world: int):
    """Per update, the set of its micro-batches (each a tuple of sentence
    ids) over all ranks, padding batches left out."""
    per_rank = []
    for rank in range(world):
        with open(os.path.join(out_dir, f"ids.{rank}")) as f:
            per_rank.append(f.read().splitlines())
    assert len({len(lines) for lines in per_rank}) == 1, "ranks ran different step counts"
    out = []
    for lines in zip(*per_rank):
        batches = set()
        for line in lines:
            for part in line.split("|"):
                part = part.strip()
                if part != "-":
                    batches.add(tuple(sorted(int(x) for x in part.split())))
        out.append(batches)
    return out


def relative_differences(dir_a, dir_b, count: int):
    """Per update 1..count, the largest ``||a - b|| / ||a||`` over the
    parameter tensors (and the name of that tensor)."""
    worst = []
    for k in range(1, count + 1):
        a = torch.load(os.path.join(dir_a, f"params.{k}.pt"), weights_only=True)
        b = torch.load(os.path.join(dir_b, f"params.{k}.pt"), weights_only=True)
        assert a.keys() == b.keys()
        rel = {n: float((a[n].double() - b[n].double()).norm()
                        / max(float(a[n].double().norm()), 1e-30)) for n in a}
        name = max(rel, key=rel.get)
        worst.append((rel[name], name))
    return worst


def assert_same_training(single, multi, world: int, count: int = UPDATES):
    one, many = updates(single, 1), updates(multi, world)
    assert len(one) >= count and len(many) >= count
    for k in range(count):
        assert one[k] == many[k], f"update {k + 1}: other batches"
    worst = relative_differences(single, multi, count)
    for k, (rel, name) in enumerate(worst, 1):
        assert rel <= TOLERANCE, f"update {k}: {name} differs by {rel:.3g} (relative)"
    return max(rel for rel, _ in worst)


@pytest.fixture(scope="module")
def single_runs(toy_bin, sentence_ckpt, tmp_path_factory):
    """The one-process runs (``--update-freq N``), made once per setting and N."""
    cache = {}

    def get(name, freq):
        if (name, freq) not in cache:
            cache[name, freq] = run_training(
                tmp_path_factory.mktemp(f"{name}_single{freq}"),
                train_argv(toy_bin, sentence_ckpt, name), update_freq=freq)
        return cache[name, freq]

    return get


def train_argv(toy_bin, sentence_ckpt, name, max_update: int = UPDATES):
    args, stage1 = SETTINGS[name]
    argv = [toy_bin, "--user-dir", USER_DIR, *args, *COMMON, "--max-update", str(max_update)]
    if stage1:
        argv += ["--init-from-sentence-checkpoint", sentence_ckpt]
    return argv


#: every setting with 2 workers; 3 workers for two of them (the test machine's CPU is shared)
WORLDS = [(name, 2) for name in SETTINGS] + [("document_batching", 3), ("selective_shared", 3)]


@pytest.mark.parametrize("name,world", WORLDS)
def test_n_workers_train_as_one_process_with_update_freq_n(name, world, toy_bin, sentence_ckpt,
                                                           single_runs, tmp_path):
    start = time.time()
    multi = run_training(tmp_path / "multi", train_argv(toy_bin, sentence_ckpt, name),
                         world=world)
    single = single_runs(name, world)
    worst = assert_same_training(single, multi, world)
    print(f"{name}, {world} workers: largest relative difference {worst:.2g}, "
          f"{time.time() - start:.1f}s")


def test_only_own_target_context_keeps_documents_whole_per_shard(toy_bin):
    """Training (and generation from given context) takes fairseq's
    round-robin shards; generation with the model's own target context keeps
    each document on one shard (it translates a document in order)."""
    from fairseq.data.iterators import EpochBatchIterator
    from test_document_task import setup_task

    from ctx_fairseq.data.batching import DocumentShardedEpochBatchIterator

    task = setup_task(toy_bin, "--document-batching", "--source-context-size", "1")
    task.load_dataset("train")
    ds = task.datasets["train"]
    shards = [task.get_batch_iterator(ds, max_tokens=300, num_shards=2, shard_id=r, seed=1,
                                      disable_iterator_cache=True) for r in (0, 1)]
    single = task.get_batch_iterator(ds, max_tokens=300, seed=1, disable_iterator_cache=True)
    assert not isinstance(shards[0], DocumentShardedEpochBatchIterator)
    assert type(shards[0]) is EpochBatchIterator
    one = [b["id"].tolist() for b in single.next_epoch_itr(shuffle=True)]
    many = [[b["id"].tolist() if b else None for b in s.next_epoch_itr(shuffle=True)]
            for s in shards]
    dealt = [b for pair in zip(*many) for b in pair if b is not None]
    assert dealt == one  # round-robin: batch i on worker i % 2, the same batches

    task = setup_task(toy_bin, "--document-batching", "--target-context-size", "1",
                      "--own-target-context", "--gen-subset", "test")
    task.load_dataset("test", task_cfg=task.cfg)  # as fairseq-generate loads it
    ds = task.datasets["test"]
    itrs = [task.get_batch_iterator(ds, max_tokens=300, num_shards=2, shard_id=r)
            for r in (0, 1)]
    assert all(isinstance(i, DocumentShardedEpochBatchIterator) for i in itrs)
    docs = [{int(ds.doc_index[i]) for b in itr.next_epoch_itr(shuffle=False) if b
             for i in b["id"].tolist()} for itr in itrs]
    assert docs[0] and docs[1] and not docs[0] & docs[1]

    # the concatenation baseline's dataset (it wraps the document dataset) likewise
    task = setup_task(toy_bin, "--document-batching", "--source-context-size", "1",
                      "--target-context-size", "1", "--own-target-context", "--gen-subset",
                      "test", "--concat-context")
    task.load_dataset("test", task_cfg=task.cfg)
    ds = task.datasets["test"]
    itrs = [task.get_batch_iterator(ds, max_tokens=80, num_shards=2, shard_id=r)
            for r in (0, 1)]
    assert all(isinstance(i, DocumentShardedEpochBatchIterator) for i in itrs)
    docs = [{int(ds.inner.doc_index[i]) for b in itr.next_epoch_itr(shuffle=False) if b
             for i in b["id"].tolist()} for itr in itrs]
    assert docs[0] and docs[1] and not docs[0] & docs[1]


def _stats(out_dir, rank: int = 0):
    import json

    with open(os.path.join(out_dir, f"stats.{rank}")) as f:
        return [json.loads(line) for line in f]


def test_an_update_ending_on_a_padding_batch_is_scaled_as_one_process(toy_bin, tmp_path):
    """2 workers x --update-freq 2 against one process x --update-freq 4 on
    an epoch of 4m + 3 batches: worker 1's last update is a real batch and
    a padding batch. fairseq's trainer kept the last micro-batch's padding
    flag for the whole update (its sample size zeroed, its logging dropped,
    its real gradient kept: a wrongly scaled update); ctx_fairseq.compat
    zeroes the padding batch's own sample size and drops its logging only."""
    from test_document_task import setup_task

    task = setup_task(toy_bin, "--source-context-size", "1")
    task.load_dataset("train")
    ds = task.datasets["train"]

    def n_batches(max_tokens):  # as fairseq-train batches (--required-batch-size-multiple 8)
        return len(task.get_batch_iterator(
            ds, max_tokens=max_tokens, seed=1, required_batch_size_multiple=8,
            disable_iterator_cache=True).frozen_batches)

    max_tokens = next(mt for mt in range(300, 600, 10) if n_batches(mt) % 4 == 3)
    argv = [toy_bin, "--user-dir", USER_DIR, *SETTINGS["sentence_batching"][0], *COMMON,
            "--max-epoch", "1"]
    argv[argv.index("--max-tokens") + 1] = str(max_tokens)
    single = run_training(tmp_path / "single", argv, update_freq=4)
    multi = run_training(tmp_path / "multi", argv, world=2, update_freq=2)
    count = (n_batches(max_tokens) + 3) // 4
    with open(multi / "ids.1") as f:
        last = f.read().splitlines()[-1].split("|")
    assert len(last) == 2 and last[0].strip() != "-" and last[1].strip() == "-", last
    assert_same_training(single, multi, 2, count=count)
    one, many = _stats(single), _stats(multi)
    assert len(one) == len(many) == count
    # the logged statistics (fairseq rounds the loss to 3 decimals) of every update
    assert [u["sample_size"] for u in one] == [u["sample_size"] for u in many]
    assert [u["loss"] for u in one] == [u["loss"] for u in many]


def _plugin_architectures():
    from ctx_fairseq.cli.arch_hooks import default_demo_archs

    return [a for a in default_demo_archs() if a != "transformer"]


@pytest.mark.parametrize("arch", _plugin_architectures())
def test_every_architecture_trains_with_pytorch_ddp_on_cpu(arch, toy_bin, sentence_ckpt,
                                                           tmp_path):
    """fairseq's default --ddp-backend (pytorch_ddp) on two CPU processes
    (gloo; ctx_fairseq.compat wraps a CPU model without device arguments),
    without --find-unused-parameters: a parameter that gets no gradient
    fails here (PyTorch's DDP raises in the next update)."""
    from ctx_fairseq.cli.arch_hooks import demo_hooks

    hooks = demo_hooks(arch)
    argv = [toy_bin, "--user-dir", USER_DIR, "--arch", arch, *hooks.train_args_for(arch),
            *COMMON, "--max-update", "2"]
    if hooks.stage1:
        argv += ["--init-from-sentence-checkpoint", sentence_ckpt]
    out = run_training(tmp_path, argv, world=2, ddp_backend="pytorch_ddp")
    assert len(updates(out, 2)) == 2


def test_pytorch_ddp_trains_as_one_process_with_update_freq_2(toy_bin, sentence_ckpt,
                                                              single_runs, tmp_path):
    """fairseq's default DDP backend averages the gradients in its own
    buckets; the updates are still those of one process."""
    multi = run_training(tmp_path, train_argv(toy_bin, sentence_ckpt, "document_batching"),
                         world=2, ddp_backend="pytorch_ddp")
    assert_same_training(single_runs("document_batching", 2), multi, 2)


def test_a_worker_without_batches_is_warned_about(toy_bin, caplog):
    """More workers than batches (or than document groups, generating with
    --own-target-context): the idle worker says so at start-up, with the
    counts; a worker with batches says nothing."""
    import logging

    from test_document_task import setup_task

    task = setup_task(toy_bin, "--document-batching", "--source-context-size", "1")
    task.load_dataset("valid")
    ds = task.datasets["valid"]
    n = len(task.get_batch_iterator(ds, max_tokens=4000, disable_iterator_cache=True)
            .frozen_batches)
    with caplog.at_level(logging.WARNING):
        task.get_batch_iterator(ds, max_tokens=4000, num_shards=n + 1, shard_id=0,
                                disable_iterator_cache=True)
        assert "gets no batch" not in caplog.text
        task.get_batch_iterator(ds, max_tokens=4000, num_shards=n + 1, shard_id=n,
                                disable_iterator_cache=True)
    assert f"worker {n} of {n + 1} gets no batch: {n} batches for {n + 1} workers" in caplog.text

    caplog.clear()
    task = setup_task(toy_bin, "--document-batching", "--target-context-size", "1",
                      "--own-target-context", "--gen-subset", "test")
    task.load_dataset("test", task_cfg=task.cfg)
    ds = task.datasets["test"]
    docs = len(set(ds.doc_index.tolist()))
    with caplog.at_level(logging.WARNING):
        task.get_batch_iterator(ds, max_tokens=4000, num_shards=docs + 1, shard_id=docs)
    assert "document groups for" in caplog.text and f"worker {docs} of {docs + 1}" in caplog.text


def _readme_commands():
    """The commands of the README's *Data-parallel training* block: one
    string per command (continuation lines joined), comments dropped."""
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("**Data-parallel training.**")
    block = text[text.index("```bash\n", start) + 8:]
    block = block[:block.index("```")]
    commands, current = [], ""
    for line in block.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        current += " " + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


#: the substitution of the README's placeholders (README, *Data-parallel training*)
def _fill(tokens, data, rest, n=None, rank=None, address=None):
    out = []
    for t in tokens:
        if t == "DATA":
            out.append(data)
        elif t == "...":
            out.extend(rest)
        elif t == "N" and n is not None:
            out.append(str(n))
        elif t == "R" and rank is not None:
            out.append(str(rank))
        elif t == "tcp://HOST:PORT" and address is not None:
            out.append(address)
        else:
            out.append(t)
    return out


def test_the_readme_commands_run_as_written(toy_bin, tmp_path):
    """The README's CPU command runs as written (two processes, fairseq's
    default --ddp-backend) with DATA, N, R, HOST:PORT filled in and ``...``
    the model and training options; its GPU forms parse."""
    import shlex

    from fairseq import options

    commands = [shlex.split(c) for c in _readme_commands()]
    assert len(commands) == 3, commands
    gpu, nodes, cpu = commands
    rest = ["--arch", "transformer_context_aware", "--source-context-size", "1",
            *[a for a in COMMON if a != "--cpu"], "--max-update", "2"]
    # the GPU forms: fairseq's own parser takes them (no GPU needed to parse)
    assert gpu[0] == "fairseq-train"
    at = nodes.index("$(which")
    assert nodes[0] == "torchrun" and nodes[at + 1] == "fairseq-train)"
    for argv in (gpu[1:], nodes[at + 2:]):
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           _fill(argv, toy_bin, []))
        assert args.distributed_world_size in (8, 16) and args.task == "document_translation"
    # the CPU form, run: fairseq-train is dp_runner.py (fairseq-train's entry, recording)
    assert cpu[0] == "fairseq-train" and "--ddp-backend" not in cpu
    address = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    for rank in (0, 1):
        argv = _fill(cpu[1:], toy_bin, rest, n=2, rank=rank, address=address)
        log = open(tmp_path / f"log.{rank}", "w+")
        procs.append((subprocess.Popen(
            [sys.executable, RUNNER, str(tmp_path), *argv], cwd=REPO_ROOT,
            env=dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank)),
            stdout=log, stderr=subprocess.STDOUT, text=True), log))
    try:
        for p, log in procs:
            p.wait(timeout=600)
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, log in procs:
        log.seek(0)
        assert p.returncode == 0, log.read()[-5000:]
    assert len(updates(tmp_path, 2)) == 2


def test_one_command_spawns_the_cpu_workers(toy_bin, sentence_ckpt, single_runs, tmp_path):
    """``--distributed-world-size 2 --distributed-init-method tcp://...``
    without ``--distributed-no-spawn`` on the CPU: fairseq spawned
    ``min(GPUs, 2)`` = 0 processes and ended with status 0, having trained
    nothing; ctx_fairseq.compat spawns the 2 workers, which train as one
    process with ``--update-freq 2``."""
    multi = run_training(tmp_path, train_argv(toy_bin, sentence_ckpt, "document_batching"),
                         world=2, spawn=True)
    assert_same_training(single_runs("document_batching", 2), multi, 2)


def _bad_data(toy_bin, tmp_path):
    """A copy of the toy binaries whose train.docids lacks its last line."""
    import shutil

    bad = str(tmp_path / "bad_bin")
    shutil.copytree(toy_bin, bad)
    with open(os.path.join(toy_bin, "train.docids")) as f:
        lines = f.read().splitlines()
    with open(os.path.join(bad, "train.docids"), "w") as f:
        f.write("\n".join(lines[:-1]) + "\n")
    return bad, f"{bad}/train.docids: {len(lines) - 1} document ids for {len(lines)} sentences"


@pytest.mark.parametrize("spawn", [False, True], ids=["command_per_rank", "spawned"])
@pytest.mark.parametrize("fault", ["docids", "missing_split"])
def test_bad_input_ends_every_worker_with_one_line(fault, spawn, toy_bin, tmp_path):
    """A docids file that does not match the data, or a missing split: every
    worker prints the same one-line error (no traceback), and every process
    ends with a non-zero status within 60 seconds: none waits for another."""
    data, expected = toy_bin, None
    extra = []
    if fault == "docids":
        data, expected = _bad_data(toy_bin, tmp_path)
    else:
        extra = ["--valid-subset", "nosuch"]
        expected = f"split 'nosuch' not found in {toy_bin}"
    argv = [data, "--user-dir", USER_DIR, *SETTINGS["sentence_batching"][0], *COMMON,
            "--max-update", "2", *extra]
    argv.remove("--disable-validation")
    start = time.time()
    procs, logs = start_training(tmp_path / "out", argv, world=2, spawn=spawn)
    try:
        for p in procs:
            p.wait(timeout=max(1.0, 60 - (time.time() - start)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode not in (None, 0) for p in procs)
    assert time.time() - start < 60
    text = ""
    for log in logs:
        log.seek(0)
        text += log.read()
        log.close()
    errors = [line for line in text.splitlines() if ": error: " in line]
    assert "Traceback" not in text, text[-3000:]
    # spawned: the first worker to fail ends the others (PyTorch's spawn), which may
    # not have printed their line yet; the launcher says which worker ended
    assert len(errors) == 2 or spawn and len(errors) == 1, errors
    assert len(set(e.split(": error: ", 1)[1] for e in errors)) == 1, errors
    assert not spawn or "ended with status 1 (its message is above)" in text
    assert expected in errors[0], errors


def test_every_worker_draws_dropout_from_the_same_stream_as_one_process(toy_bin, sentence_ckpt,
                                                                       tmp_path):
    """Issue 37 item 7, the option kept: fairseq's seeding. Every update
    starts from the random state of (``--seed``, update) on every worker,
    the same state as one process's update (docs/document_translation.md,
    *Dropout across workers*): with dropout the workers draw one stream, and
    a single-process run is what it was (its stream depends on nothing
    else)."""
    argv = train_argv(toy_bin, sentence_ckpt, "sentence_batching", max_update=3)
    for name, value in (("--dropout", "0.3"), ("--attention-dropout", "0.1")):
        argv[argv.index(name) + 1] = value
    single = run_training(tmp_path / "single", argv, update_freq=2)
    multi = run_training(tmp_path / "multi", argv, world=2)

    def streams(out, rank):
        with open(os.path.join(out, f"rng.{rank}")) as f:
            return f.read().split()

    one = streams(single, 0)
    assert len(one) == 3 and len(set(one)) == 3  # a new state per update
    assert streams(multi, 0) == streams(multi, 1) == one


def test_two_workers_resume_as_an_uninterrupted_run(toy_bin, sentence_ckpt, tmp_path):
    """Stopped after update 3 and resumed to 6 on 2 workers, mid-epoch:
    rank 0 reads checkpoint_last.pt and fairseq broadcasts its state to rank
    1, whose safe torch.load refused the state's OmegaConf configuration
    (every resume with several workers crashed on rank >= 1;
    ctx_fairseq.compat.broadcast_safe_states). The resumed run ends where
    the uninterrupted one does, with its batches."""
    def argv(save, max_update):
        a = train_argv(toy_bin, sentence_ckpt, "document_batching", max_update=max_update)
        a.remove("--no-save")
        return a + ["--save-dir", str(save), "--no-epoch-checkpoints"]

    whole = run_training(tmp_path / "whole", argv(tmp_path / "ck_whole", 6), world=2)
    run_training(tmp_path / "first", argv(tmp_path / "ck", 3), world=2)
    resumed = run_training(tmp_path / "resumed", argv(tmp_path / "ck", 6), world=2)
    assert updates(whole, 2)[3:] == updates(resumed, 2)
    a = torch.load(os.path.join(whole, "params.6.pt"), weights_only=True)
    b = torch.load(os.path.join(resumed, "params.6.pt"), weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_validation_across_workers_gives_the_figures_of_one_process(toy_bin, sentence_ckpt,
                                                                    tmp_path):
    """fairseq validates on every worker's shard of the validation batches and
    sums the statistics: loss (nll_loss) and ppl are one process's (wpb and
    bsz are per step summed over workers, so they differ by design)."""
    import re

    def valid_losses(out_dir):
        with open(os.path.join(out_dir, "log.0")) as f:
            text = f.read()
        return [tuple(m.groups()) for m in re.finditer(
            r"valid on 'valid' subset \| loss ([\d.]+) \| (?:nll_loss ([\d.]+) \| )?ppl "
            r"([\d.]+)",
            text)]

    def argv():
        a = train_argv(toy_bin, sentence_ckpt, "document_batching", max_update=4)
        a.remove("--disable-validation")
        return a + ["--validate-interval-updates", "2"]

    single = run_training(tmp_path / "single", argv(), update_freq=2)
    multi = run_training(tmp_path / "multi", argv(), world=2)
    one, many = valid_losses(single), valid_losses(multi)
    assert len(one) >= 2 and one == many
