"""Time fairseq-train's own training step on chosen batches of a real corpus.

Usage: the arguments of a ``fairseq-train`` command line (the same data, task,
model and batching options), then after ``--`` this script's own::

    python scripts/bench_train_step.py DATA --user-dir ctx_fairseq --task document_translation \
        ... (the training command's options) ... -- --pick largest-memory --steps 3 [--json F]

It builds the task, model, criterion and ``fairseq.trainer.Trainer`` from
those arguments exactly as ``fairseq-train`` does, forms epoch 1's batches
with the trainer's iterator, and times ``trainer.train_step`` (forward,
backward, optimizer step) on the chosen batch:

* ``--pick largest-memory``: the batch whose document memory has the most
  sentences visible to one query (for the document-memory models; the
  acceptance shape of issue 24: a whole TV episode);
* ``--pick first``: the first batch; ``--pick nth --nth N``: batch ``N``.

The first step is a warm-up (it fills, for instance, the frozen memory's
cache, as the first epoch of a real run does) and is reported apart. Printed
and written as JSON: the batch's sentences, memory sentences, target tokens,
seconds per step, target tokens per second, peak resident memory (RSS).
"""

import argparse
import json
import resource
import sys
import time

import torch


def _own_args(argv):
    p = argparse.ArgumentParser(prog="bench_train_step.py")
    p.add_argument("--pick", choices=["largest-memory", "first", "nth"], default="largest-memory")
    p.add_argument("--nth", type=int, default=0, help="--pick nth: the batch's number (from 0)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--scan", type=int, default=0,
                   help="look at only the first N batches of the epoch (0: all)")
    p.add_argument("--json", default=None)
    p.add_argument("--profile", action="store_true",
                   help="also print torch.profiler's table of one timed step")
    return p.parse_args(argv)


def _memory_visible(sample) -> int:
    ni = sample["net_input"]
    if "mem_doc_valid" not in ni:
        return 0
    return int(ni["mem_doc_valid"].sum(1).max())


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        cut = argv.index("--")
        train_argv, own = argv[:cut], _own_args(argv[cut + 1:])
    else:
        train_argv, own = argv, _own_args([])
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, train_argv)
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    torch.manual_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    itr = trainer.get_train_iterator(epoch=1, load_dataset=False).next_epoch_itr(shuffle=False)
    best, best_key = None, -1
    for i, sample in enumerate(itr):
        if own.scan and i >= own.scan:
            break
        if own.pick == "nth" and i < own.nth:
            continue
        key = _memory_visible(sample) if own.pick == "largest-memory" else 0
        if key > best_key:
            best, best_key = sample, key
        if own.pick in ("first", "nth"):
            break
    if best is None:
        sys.exit("bench_train_step.py: error: the training split formed no batch")
    ni = best["net_input"]
    row = {
        "arch": cfg.model._name if hasattr(cfg.model, "_name") else getattr(args, "arch", "?"),
        "sentences": int(ni["src_tokens"].size(0)),
        "target_tokens": int(best["ntokens"]),
        "memory_sentences": int(ni["mem_src_tokens"].size(0)) if "mem_src_tokens" in ni else 0,
        "visible_memory_sentences_max": _memory_visible(best),
        "threads": torch.get_num_threads(),
    }
    times = []
    for _ in range(own.steps + 1):
        t0 = time.perf_counter()
        trainer.train_step([best])
        times.append(time.perf_counter() - t0)
    if own.profile:
        from torch.profiler import profile

        with profile() as prof:
            trainer.train_step([best])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    lengths = ni["mem_src_lengths"] if "mem_src_lengths" in ni else None
    if lengths is not None and lengths.numel():
        row["memory_tokens_max"] = int(lengths.max())
        row["memory_tokens_mean"] = round(float(lengths.float().mean()), 1)
    row["warmup_step_s"] = round(times[0], 3)
    row["step_s"] = round(sum(times[1:]) / max(1, len(times) - 1), 3)
    row["target_tokens_per_s"] = round(row["target_tokens"] / row["step_s"], 1)
    row["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(row))
    if own.json:
        with open(own.json, "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
