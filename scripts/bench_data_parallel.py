"""Two data-parallel CPU processes against one process on the same global
batch (issue 37, item 8): fairseq-train's own entry in each process, gloo,
``--update-freq 2`` for the single process against 2 workers with
``--update-freq 1`` (the same micro-batches per update: N workers train as
one process with ``--update-freq N``). Each process times its updates
(``Trainer.train_step``, the first ``--warmup`` left out) and the
collective calls inside them (``torch.distributed.all_reduce``, which
fairseq's ``legacy_ddp`` gradient reduction and its statistics use), and
counts the target tokens it trained on. Run it alone on the machine (two
jobs on two cores slow each other down)::

    python scripts/bench_data_parallel.py --json bench_dp.json

It writes a toy corpus (``ctx_fairseq.data.toy_corpus``) and its binaries
under ``--workdir`` unless ``--data`` gives binaries with ``.docids``. The
figures: per run, target tokens per second per process and in all, the
seconds per update, and the share of an update's time spent in all-reduce
(per worker, legacy_ddp; with ``--ddp-backend pytorch_ddp`` PyTorch's
reducer overlaps the all-reduce with the backward pass inside C++, so only
the statistics' all-reduce is seen and the throughput is what counts)."""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


# ----------------------------------------------------------------- the worker
def _worker(out: str, argv) -> None:
    """fairseq-train ``argv`` with its updates and all-reduce calls timed;
    writes ``out/times.RANK.json``."""
    sys.path.insert(0, REPO)
    import torch

    import ctx_fairseq  # noqa: F401
    from fairseq.trainer import Trainer

    record = {"update_s": [], "allreduce_s": [], "tokens": []}
    inside = {"on": False, "allreduce": 0.0}
    original_all_reduce = torch.distributed.all_reduce

    def all_reduce(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original_all_reduce(*args, **kwargs)
        finally:
            if inside["on"]:
                inside["allreduce"] += time.perf_counter() - start

    torch.distributed.all_reduce = all_reduce
    train_step = Trainer.train_step

    def timed(self, samples, raise_oom=False):
        inside["on"], inside["allreduce"] = True, 0.0
        start = time.perf_counter()
        try:
            return train_step(self, samples, raise_oom=raise_oom)
        finally:
            inside["on"] = False
            record["update_s"].append(time.perf_counter() - start)
            record["allreduce_s"].append(inside["allreduce"])
            record["tokens"].append(int(sum(int(s["ntokens"]) for s in samples if s)))
            dist = torch.distributed
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            with open(os.path.join(out, f"times.{rank}.json"), "w") as f:
                json.dump(record, f)

    Trainer.train_step = timed
    from fairseq_cli.train import cli_main

    sys.argv = ["fairseq-train", *argv]
    cli_main()


# ----------------------------------------------------------------- the driver
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _toy_data(workdir: str, docs: int) -> str:
    from ctx_fairseq.data.toy_corpus import make_toy_corpus
    from fairseq_cli import preprocess

    raw, dest = os.path.join(workdir, "raw"), os.path.join(workdir, "bin")
    if os.path.exists(os.path.join(dest, "train.docids")):
        return dest
    make_toy_corpus(raw, docs=docs, sents_per_doc=8, max_distance=3, seed=1,
                    valid_docs=6, test_docs=6)
    parser = preprocess.options.get_preprocessing_parser()
    args = parser.parse_args(["--source-lang", "src", "--target-lang", "tgt",
                              "--trainpref", os.path.join(raw, "train"),
                              "--validpref", os.path.join(raw, "valid"),
                              "--destdir", dest, "--joined-dictionary", "--workers", "1"])
    preprocess.main(args)
    for split in ("train", "valid"):
        with open(os.path.join(raw, f"{split}.docids")) as f, \
                open(os.path.join(dest, f"{split}.docids"), "w") as g:
            g.write(f.read())
    return dest


def _run(out: str, argv, world: int, update_freq: int, ddp_backend: str, threads: int):
    os.makedirs(out, exist_ok=True)
    argv = [*argv, "--update-freq", str(update_freq)]
    if world > 1:
        argv += ["--distributed-world-size", str(world), "--distributed-backend", "gloo",
                 "--ddp-backend", ddp_backend, "--distributed-no-spawn",
                 "--distributed-init-method", f"tcp://127.0.0.1:{_free_port()}"]
    procs = []
    for rank in range(world):
        extra = ["--distributed-rank", str(rank)] if world > 1 else []
        log = open(os.path.join(out, f"log.{rank}"), "w")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", out, "--", *argv, *extra],
            env=dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads)),
            stdout=log, stderr=subprocess.STDOUT))
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a run failed: see {out}/log.*")
    return [json.load(open(os.path.join(out, f"times.{r}.json"))) for r in range(world)]


def _summary(times, warmup: int, world: int):
    per = []
    for t in times:
        upd = t["update_s"][warmup:]
        red = t["allreduce_s"][warmup:]
        tok = t["tokens"][warmup:]
        per.append({"updates": len(upd), "seconds": sum(upd), "tokens": sum(tok),
                    "tokens_per_s": sum(tok) / sum(upd), "allreduce_s": sum(red),
                    "allreduce_share": sum(red) / sum(upd)})
    seconds = max(p["seconds"] for p in per)  # the workers wait for each other
    tokens = sum(p["tokens"] for p in per)
    return {"workers": world, "per_worker": per, "s_per_update": seconds / per[0]["updates"],
            "tokens_per_s_total": tokens / seconds,
            "tokens_per_s_per_process": tokens / seconds / world}


def main(argv=None):
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--worker":
        rest = sys.argv[3:]
        return _worker(sys.argv[2], rest[1:] if rest[:1] == ["--"] else rest)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="binaries with {train,valid}.docids (default: a toy corpus)")
    p.add_argument("--workdir", default=None, help="default: a temporary directory")
    p.add_argument("--docs", type=int, default=600, help="toy corpus documents")
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=2000)
    p.add_argument("--threads", type=int, default=1, help="threads per process")
    p.add_argument("--ddp-backends", default="legacy_ddp,pytorch_ddp")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    workdir = a.workdir or tempfile.mkdtemp(prefix="bench_dp_")
    data = a.data or _toy_data(workdir, a.docs)
    common = [data, "--user-dir", os.path.join(REPO, "ctx_fairseq"),
              "--task", "document_translation", "--arch", "transformer_context_aware",
              "--source-context-size", "1", "--document-batching",
              "--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
              "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
              "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
              "--decoder-attention-heads", "4", "--share-all-embeddings",
              "--optimizer", "adam", "--lr", "1e-4", "--max-tokens", str(a.max_tokens),
              "--max-update", str(a.updates), "--disable-validation", "--no-save",
              "--num-workers", "0", "--seed", "1", "--no-progress-bar", "--cpu",
              "--log-interval", "1000"]
    results = {"command": " ".join(sys.argv), "threads_per_process": a.threads,
               "max_tokens": a.max_tokens, "updates_timed": a.updates - a.warmup, "runs": {}}
    single = _run(os.path.join(workdir, "single"), common, 1, 2, "legacy_ddp", a.threads)
    results["runs"]["1 process, --update-freq 2"] = _summary(single, a.warmup, 1)
    for backend in a.ddp_backends.split(","):
        multi = _run(os.path.join(workdir, backend), common, 2, 1, backend, a.threads)
        results["runs"][f"2 processes, {backend}"] = _summary(multi, a.warmup, 2)
    text = json.dumps(results, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
