"""ctx-bench: throughput, memory and FLOPs of plugin architectures against the
fairseq ``transformer`` baseline with identical dimensions, in one process.

For each architecture (and the baseline) it builds the model through fairseq's
own registry and argument parser, then, interleaving the models over
``--repeats`` rounds (the order rotates each round so that no model always
runs first):

* **training throughput**: target tokens per second of full training steps
  (forward, label-smoothed cross-entropy, backward, Adam step) on a random
  batch of ``--max-tokens`` target tokens;
* **inference throughput**: sentences per second of beam search through
  fairseq's ``SequenceGenerator``; every hypothesis is forced to exactly
  ``--tgt-len`` tokens (``min_len = max_len``) so all models do equal work
  (concatenation: after its target context, forced as the task forces it at
  generation, ``ForcedPrefixes`` of ``document_translation``);
* **peak memory** of a training step, each model's own: the bytes of its
  parameters, gradients and optimizer state plus the peak of the tensor memory
  allocated during one step above what was allocated when the step began
  (CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats``, minus
  ``memory_allocated`` at the start of the step; CPU: the torch profiler's
  memory timeline, each allocation and free at its time). The models
  measured before one stay alive for the interleaved repeats; what they hold
  is allocated before the step begins and so never counts (it did: ``max_memory_allocated`` alone grew with every
  model measured before). The batch itself is not counted (on either device);
* **parameter count**;
* **the analytic bound on the throughput ratio**: baseline FLOPs / arch FLOPs
  of one training step (forward + backward), counted by
  ``torch.utils.flop_counter.FlopCounterMode`` with formulas for the fused
  attention kernels (``ctx_fairseq.flops``), so that attention counts the same
  whether a model runs it fused (fairseq's fast path, on the CPU or CUDA) or
  as explicit matrix products; ``infer_flops_ratio_bound`` is the same for one
  beam search.

* **absolute efficiency**: achieved TFLOP/s (the counted FLOPs of a step over
  its median time; beam search likewise) and MFU, its fraction of the
  device's dense peak for the run's precision (``fp16`` under ``--fp16``,
  else ``fp32``, or ``tf32`` where torch lets float32 products use it): the
  table of known cards ``ctx_fairseq.flops.PEAK_TFLOPS`` (vendors' datasheets)
  or ``--peak-tflops``; none on the CPU unless given.

``--train-step fairseq`` times fairseq's own ``Trainer.train_step`` as
fairseq-train runs it (fairseq's Adam, gradient norm and logging; ``--fp16``:
the half-precision model with fp32 master weights, ``FP16Optimizer``) instead
of the default forward, loss, backward and ``torch.optim.Adam`` step (whose
``--fp16`` is autocast with fp32 weights, as fairseq-train's ``--amp``); the
report's ``training_step`` says which.

``--sweep-max-tokens 4096,16384,32768`` runs the whole bench at each batch in
turn and reports, per architecture, tokens/s, TFLOP/s and MFU at each and the
smallest batch with 90% of its best tokens/s (below it, the step is
host-bound). ``--dry-run`` checks every argument and builds every model and the
batch it would be measured on (the task's batching, the concatenation and
memory checks) on the CPU, whatever ``--device``/``--fp16`` say, and runs
nothing: it takes a GPU run's exact arguments (``scripts/gpu_check.sh``).
``--segment-tokens`` (issue 39): doc2doc segments against sentences on the same tokens,
``--attention-bench``, ``--decode-bench`` (:mod:`ctx_fairseq.cli.bench_doc2doc`,
:mod:`ctx_fairseq.cli.bench_attention`).

Each ratio is arch / baseline measured in the same run (median over repeats).
Architectures are fairseq architecture names; ``ARCH[--opt value --flag]``
passes extra architecture options, e.g. ``transformer_dc[--dc-decoder-layers all]``.
What the bench knows of an architecture is in
:mod:`ctx_fairseq.cli.arch_hooks` (``BenchHooks``; a plugin registers its own
with ``register_bench_hooks``): ``sample(task, args, batch_size, src_len,
tgt_len, doc_len, device)`` builds the model's own training sample (e.g. with
document context); the default is a sentence-level translation batch.

Whole-document models (``BenchHooks.task_args``, e.g.
``transformer_selective_doc``: ``--document-context online
--document-memory``) run with the ``document_translation`` task, and their
batch is made by the task's own dataset and batching (the one place context is
built): synthetic documents of ``--doc-len`` sentences, batched within
``--max-tokens`` with their document memory by the task's own batch iterator
(``task.get_batch_iterator`` with fairseq-train's arguments, the model built
through ``task.build_model`` so that the context layout is the one training
batches by: a frozen memory counts apart from the batch's sentences), and the
batch measured is the largest batch of the first document (``--doc-batch
largest``) or the one that holds its last sentence (``last``: the most
memory). The row names the batch's sentences (``batch_sentences``), its
memory sentences (``batch_memory_sentences``) and the peak memory. FLOPs are
counted in the timed precision (under the same autocast). Such a
batch can hold fewer sentences than the baseline's, so the report also gives
sentences per second and peak memory per sentence of the batch;
``ARCH[--memory-precomputed]`` and other task options pass through like model
options.

A model's hooks may say what its row measures (``setting(model)``: the ``setting
of the JSON report, a note under the table). ``transformer_selective_doc``'s
default is the paper's frozen memory; the bench has no stage-1 checkpoint, so
the frozen copies are of the initial weights, and, as the bench repeats one
batch, the memory is read from the model's cache (filled by one untimed
forward before anything is measured: FLOPs, memory and times are all of the
warm step; ``[--memory-cache-sentences 0]`` encodes it, without gradients,
in every step; ``[--context-memory shared]`` computes it with gradients).
"""

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Dict, List, Optional

import numpy as np
import torch

from ctx_fairseq.cli.arch_hooks import bench_hooks
from ctx_fairseq.cli.bench_memory import (
    CudaMemoryStats, cpu_step_peak_bytes, resident_bytes, step_peak_bytes)
from ctx_fairseq.cli.bench_report import (
    format_markdown, format_table, sweep_summary)
from ctx_fairseq.cli.bench_specs import (memory_sentences, parse_spec, split_specs,
                                          train_batches)
from ctx_fairseq.data.contract import sentence_level, task_options
from ctx_fairseq.cli.bench_doc2doc import doc2doc_of, segment_sample
from ctx_fairseq.flops import attention_step_flops, device_peak_tflops, matmul_precision, mfu

USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _inside(event, names) -> bool:
    """Whether a profiler event runs inside an event named in ``names``."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


def _setting(arch: str, model) -> Optional[str]:
    """What the row of ``arch`` measures, where its hooks say (``BenchHooks.setting``)."""
    setting = bench_hooks(arch).setting
    return setting(model) if setting is not None else None


def _tokens(sample) -> int:
    """Target tokens of the sentences being translated: a concatenated target's
    context part (``target_prefix_len``) is input, not output, and does not
    count as throughput."""
    tokens = int(sample["ntokens"])
    if "target_prefix_len" in sample:
        tokens -= int(sample["target_prefix_len"].sum())
    return tokens


class Bench:
    def __init__(self, args):
        self.args = args
        # --dry-run builds on the CPU whatever --device says (nothing runs)
        self.device = torch.device("cpu" if getattr(args, "dry_run", False) else args.device)
        self.batch_size = max(1, args.max_tokens // args.tgt_len)
        self.memory_stats = CudaMemoryStats(self.device) if self.device.type == "cuda" else None

    # ----------------------------------------------------------------- build
    def fairseq_step(self) -> bool:
        return getattr(self.args, "train_step", "torch") == "fairseq"

    def trainer_args(self) -> List[str]:
        """fairseq-train's options of the trainer (``--train-step fairseq``)."""
        if not self.fairseq_step():
            return []
        a = self.args
        # one process on one device, whatever the machine has (no DDP wrapper)
        out = ["--optimizer", "adam", "--lr", "0.0001", "--max-tokens", str(a.max_tokens),
               "--seed", str(a.seed), "--distributed-world-size", "1"]
        if a.fp16:
            out.append("--fp16")
        if self.device.type == "cpu":
            out.append("--cpu")
        return out

    def build(self, arch: str, extra: List[str]):
        import ctx_fairseq  # noqa: F401
        from fairseq import options
        from fairseq.data import Dictionary
        from fairseq.models import ARCH_MODEL_REGISTRY
        from fairseq.tasks.translation import TranslationConfig, TranslationTask

        a = self.args
        if arch not in ARCH_MODEL_REGISTRY:
            raise ValueError(f"--archs: unknown architecture {arch!r}")
        doc_task = list(bench_hooks(arch).task_args)
        # a spec with the doc2doc task's options (--segment-tokens) is the document task's
        doc_task += ["--doc2doc", "greedy"] if "--doc2doc" in extra and not doc_task else []
        task_name = "document_translation" if doc_task else "translation"
        seg = getattr(a, "segment_tokens", None) or 0
        argv = [
            "bench-data", "--user-dir", USER_DIR, "--arch", arch, "--task", task_name, *doc_task,
            "--encoder-layers", str(a.layers), "--decoder-layers", str(a.layers),
            "--encoder-embed-dim", str(a.embed_dim), "--decoder-embed-dim", str(a.embed_dim),
            "--encoder-ffn-embed-dim", str(a.ffn_dim), "--decoder-ffn-embed-dim", str(a.ffn_dim),
            "--encoder-attention-heads", str(a.heads), "--decoder-attention-heads", str(a.heads),
            "--share-all-embeddings", "--max-source-positions",
            str(max(1024, a.src_len * a.doc_len + 8, seg + 8)),
            "--max-target-positions", str(max(1024, a.tgt_len + 8, seg + 8)), *self.trainer_args(), *extra,
        ]
        parser = options.get_training_parser()
        margs = options.parse_args_and_arch(parser, argv)
        dictionary = Dictionary()
        for i in range(a.vocab - dictionary.nspecial):
            dictionary.add_symbol(f"w{i}")
        if doc_task:
            from fairseq.dataclass.utils import convert_namespace_to_omegaconf

            from ctx_fairseq.tasks.document_translation import DocumentTranslationTask

            task = DocumentTranslationTask(convert_namespace_to_omegaconf(margs).task,
                                           dictionary, dictionary)
            # fairseq-train's path: the task builds the model, sets the context layout it
            # batches by (``set_context_layout``: a frozen memory is encoded apart from the
            # batch's sentences and counted so) and finishes the set-up (frozen copies);
            # from_checkpoint: no stage-1 checkpoint (the frozen copies are of the initial
            # weights) and nothing restored from a save directory
            model = task.build_model(margs, from_checkpoint=True)
        else:
            task = TranslationTask(TranslationConfig(), dictionary, dictionary)
            model = task.build_model(margs)
            if hasattr(model, "finish_setup"):
                model.finish_setup(None, new_run=False)
        model = model.to(self.device)
        return model, task, margs

    def synthetic_documents(self, task, seed: int):
        """``(base, doc_ids, name)`` of :meth:`document_sample`'s split: enough
        documents of ``--doc-len`` sentences of ``--src-len`` / ``--tgt-len``
        random tokens (each ended by ``</s>``) for one batch, drawn from a
        generator seeded with ``seed``."""
        from fairseq.data import LanguagePairDataset

        a, d = self.args, task.target_dictionary
        g = torch.Generator().manual_seed(seed)
        n = (1 + math.ceil(self.batch_size / a.doc_len)) * a.doc_len

        def sents(length):
            t = torch.randint(d.nspecial, len(d), (n, length), generator=g)
            t[:, -1] = d.eos()
            return list(t)

        src, tgt = sents(a.src_len), sents(a.tgt_len)
        base = LanguagePairDataset(src, torch.full((n,), a.src_len).numpy(), d, tgt,
                                   torch.full((n,), a.tgt_len).numpy(), d, shuffle=False)
        return base, [f"d{i // a.doc_len}" for i in range(n)], "<bench documents>"

    def document_sample(self, task, seed: int, model=None, margs=None) -> Dict:
        """A batch of synthetic documents through the task's dataset and
        batching (see the module docstring): the batches are the task's own
        (``task.get_batch_iterator`` with fairseq-train's arguments: ``--max-tokens``,
        the model's and task's maximum positions, ``--required-batch-size-multiple``,
        the seed, epoch 1), over the split as fairseq-train wraps its training
        split."""
        from fairseq import utils as fairseq_utils

        a = self.args
        ds = task.wrap(*self.synthetic_documents(task, seed), training=True)
        max_positions = None
        if model is not None:
            max_positions = fairseq_utils.resolve_max_positions(
                task.max_positions(), model.max_positions(), a.max_tokens)
        batches = train_batches(task, ds, margs, a.max_tokens, seed, max_positions)
        first_doc = [b for b in batches if (b < a.doc_len).any()]
        if a.doc_batch == "last":
            batch = next(b for b in first_doc if a.doc_len - 1 in b.tolist())
        else:
            batch = max(first_doc, key=len)
        spec = task_options(task) or sentence_level()
        if spec.concat_context:
            # concatenation: measure sentences that have their whole context
            k = max(spec.source_context_size, spec.target_context_size)
            if a.doc_len <= k:
                raise ValueError(f"--doc-len {a.doc_len}: concatenation with {k} context "
                                 f"sentence(s) needs documents of more than {k} sentences")
            batch = np.asarray([i for i in batch if ds.sent_pos[int(i)] >= k], dtype=np.int64)
            if not len(batch):
                raise ValueError("no sentence with its whole context in the measured batch; "
                                 "raise --doc-len or --max-tokens")
        sample = ds.collater([ds[int(i)] for i in batch])
        return fairseq_utils.move_to_cuda(sample, self.device) if self.device.type == "cuda" \
            else sample

    def sample(self, model, task, margs, seed: int) -> Dict:
        a = self.args
        hooks = bench_hooks(margs.arch)
        if getattr(a, "segment_tokens", None) or doc2doc_of(task) != "none":
            # segments (issue 39): a doc2doc task's, or the same batch's sentences
            return segment_sample(self, task, model, margs, seed)
        if hooks.task_args:
            return self.document_sample(task, seed, model, margs)
        if hooks.sample is not None:
            return hooks.sample(task, margs, self.batch_size, a.src_len, a.tgt_len, a.doc_len,
                                self.device)
        d = task.target_dictionary
        g = torch.Generator().manual_seed(seed)
        bsz = self.batch_size
        src = torch.randint(d.nspecial, len(d), (bsz, a.src_len), generator=g)
        src[:, -1] = d.eos()
        tgt = torch.randint(d.nspecial, len(d), (bsz, a.tgt_len), generator=g)
        tgt[:, -1] = d.eos()
        prev = torch.cat([tgt[:, -1:], tgt[:, :-1]], dim=1)
        return {
            "id": torch.arange(bsz), "nsentences": bsz, "ntokens": bsz * a.tgt_len,
            "net_input": {"src_tokens": src.to(self.device),
                          "src_lengths": torch.full((bsz,), a.src_len, device=self.device),
                          "prev_output_tokens": prev.to(self.device)},
            "target": tgt.to(self.device),
        }

    # ------------------------------------------------------------- measures
    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _autocast(self):
        if self.args.fp16 and not self.fairseq_step():  # fairseq's --fp16: a half model
            return torch.autocast(device_type="cuda", dtype=torch.float16)
        return torch.autocast(device_type=self.device.type, enabled=False)

    def train_step(self, entry) -> None:
        if "trainer" in entry:  # fairseq-train's step; an out-of-memory error is raised
            entry["trainer"].train_step([entry["sample"]], raise_oom=True)
            return
        model, crit, opt, scaler, sample = (entry[k] for k in ("model", "crit", "opt", "scaler", "sample"))
        model.train()
        opt.zero_grad(set_to_none=True)
        with self._autocast():
            loss, _, _ = crit(model, sample)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    def count_flops(self, entry) -> float:
        from ctx_fairseq.flops import FlopCounter

        model, crit, sample = entry["model"], entry["crit"], entry["sample"]
        if "trainer" in entry:  # the whole step (the optimizer's part has no counted op)
            with FlopCounter() as counter:
                self.train_step(entry)
            entry.setdefault("uncounted_ops", set()).update(counter.uncounted)
            return float(counter.total)
        model.train()
        # in the timed precision: under autocast the kernels (and a model's own choice
        # of path by dtype) are those of the timed step
        with FlopCounter() as counter:
            with self._autocast():
                loss, _, _ = crit(model, sample)
            loss.backward()
        model.zero_grad(set_to_none=True)
        entry.setdefault("uncounted_ops", set()).update(counter.uncounted)
        return float(counter.total)

    def peak_memory_mb(self, entry) -> float:
        """The model's own peak (module docstring): resident bytes (its
        parameters, gradients, optimizer state) + the step's peak above the
        memory allocated when it began."""
        self.train_step(entry)  # gradients and optimizer state exist from here on
        resident = resident_bytes(entry["model"], entry["opt"])
        if self.memory_stats is not None:  # CUDA
            return (resident + step_peak_bytes(lambda: self.train_step(entry),
                                               self.memory_stats)) / 2 ** 20
        from torch.profiler import ProfilerActivity, profile

        from ctx_fairseq.flops import counted_op_names

        # (the memory timeline needs the shapes and the stacks recorded)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                     record_shapes=True, with_stack=True) as prof:
            start = time.perf_counter()
            self.train_step(entry)
            entry["profiled_step_s"] = time.perf_counter() - start
        counted = counted_op_names()
        counted_us = 0
        for ev in prof.events():
            if ev.name in counted and not _inside(ev, counted):
                counted_us += ev.cpu_time_total
        peak = cpu_step_peak_bytes(prof)
        # CPU time of the ops whose FLOPs are counted (matrix products, fused attention,
        # convolutions), each with what it calls
        entry["counted_ops_s"] = counted_us / 1e6
        return (resident + peak) / 2 ** 20

    @staticmethod
    def infer_net_input(ni: Dict, n: int) -> Dict:
        """The inputs of the beam search over the first ``n`` sentences of a
        training batch's ``net_input`` (no ``prev_output_tokens``): the
        per-sentence inputs cut to ``n`` rows; a document memory stays whole,
        and where its rows' states come from (``mem_state_index``,
        ``mem_extra_rows``, which index the batch's queries) is recomputed for
        the ``n`` queries on the host
        (:func:`ctx_fairseq.models.transformer_selective_doc.first_queries_state_index`):
        the queries left out become memory rows encoded as such. Preparation,
        outside the timed part."""
        out = {"src_tokens": ni["src_tokens"][:n], "src_lengths": ni["src_lengths"][:n]}
        memory = "mem_src_tokens" in ni
        for k, v in ni.items():  # document models may carry context inputs
            if k in ("src_tokens", "src_lengths", "prev_output_tokens"):
                continue
            if k == "query_doc_groups":  # the kept rows of each document; the rest padding (n)
                out[k] = torch.where(v < n, v, torch.full_like(v, n))
                continue
            if k in ("query_doc_sizes", "query_doc_tokens", "query_doc_token_counts") \
                    or k.startswith("query_bucket_"):
                continue  # index the whole batch's rows (the layout per document stays exact)
            # per-sentence inputs follow the first n sentences; a document memory stays whole
            per_sentence = not memory or k.startswith("query_")
            out[k] = v[:n] if torch.is_tensor(v) and per_sentence else v
        if memory and "mem_state_index" in ni:
            from ctx_fairseq.models.transformer_selective_doc.common import (
                first_queries_state_index,
            )

            source, extra = first_queries_state_index(ni["mem_state_index"].cpu().numpy(), n)
            dev = ni["mem_state_index"].device
            out["mem_state_index"] = torch.from_numpy(source).to(dev)
            out["mem_extra_rows"] = torch.from_numpy(extra).to(dev)
        return out

    @torch.no_grad()
    def infer(self, entry, count_flops: bool = False) -> float:
        from fairseq.sequence_generator import SequenceGenerator

        a = self.args
        model = entry["model"].eval()
        ni = entry["sample"]["net_input"]
        n = min(a.infer_sentences, ni["src_tokens"].size(0))
        # concatenation (target context in the target): the context is forced as the
        # decoder's prefix as the task does at generation (ForcedPrefixes, one call for
        # the batch), then tgt_len tokens follow
        prefix = None
        if "target_prefix_len" in entry["sample"]:
            plen = entry["sample"]["target_prefix_len"][:n]
            width = int(plen.max()) if n else 0
            if width:
                tgt = entry["sample"]["target"][:n, :width].clone()
                cols = torch.arange(width, device=tgt.device).unsqueeze(0)
                tgt[cols >= plen.to(tgt.device).unsqueeze(1)] = entry["task"].target_dictionary.pad()
                prefix = tgt
        gen = entry.get("generator")
        if gen is None:
            gen = entry["generator"] = SequenceGenerator(
                [model], entry["task"].target_dictionary, beam_size=a.beam,
                max_len_a=0, max_len_b=a.tgt_len, min_len=a.tgt_len,
            )
        sample = {}
        if prefix is not None:
            sample.update(target_prefix=prefix, target_prefix_len=plen,
                          id=torch.arange(n, device=prefix.device))

        def forced():
            if prefix is None:
                return contextlib.nullcontext()
            from ctx_fairseq.tasks.generation import ForcedPrefixes

            return ForcedPrefixes(gen, sample, sample["target_prefix_len"].tolist())

        sample["net_input"] = self.infer_net_input(ni, n)
        if count_flops:
            from ctx_fairseq.flops import FlopCounter

            with FlopCounter() as counter, self._autocast(), forced():
                gen.generate([model], sample)
            entry.setdefault("uncounted_ops", set()).update(counter.uncounted)
            return float(counter.total) / n  # per sentence
        self._sync()
        start = time.perf_counter()
        with self._autocast(), forced():
            gen.generate([model], sample)
        self._sync()
        return n / (time.perf_counter() - start)

    def timed_train(self, entry) -> float:
        self._sync()
        start = time.perf_counter()
        for _ in range(self.args.train_steps):
            self.train_step(entry)
        self._sync()
        return self.args.train_steps * _tokens(entry["sample"]) / (time.perf_counter() - start)

    # ------------------------------------------------------------------ run
    def run(self, specs: List[str], log=print) -> Dict:
        from fairseq.criterions.label_smoothed_cross_entropy import (
            LabelSmoothedCrossEntropyCriterion,
        )

        a = self.args
        if getattr(a, "dry_run", False):
            return self.dry_run(specs, log)
        entries = []
        for label in specs:
            arch, extra = parse_spec(label)
            torch.manual_seed(a.seed)
            model, task, margs = self.build(arch, extra)
            crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
            entry = {
                "label": label, "model": model, "task": task, "crit": crit,
                "sample": self.sample(model, task, margs, a.seed),
                "params": sum(p.numel() for p in model.parameters()),
                "train": [], "infer": [],
            }
            if self.fairseq_step():
                from fairseq.dataclass.utils import convert_namespace_to_omegaconf
                from fairseq.trainer import Trainer

                # as fairseq-train: the trainer halves the model under --fp16 (in place)
                trainer = Trainer(convert_namespace_to_omegaconf(margs), task, model, crit)
                entry.update(trainer=trainer, model=trainer.model, opt=trainer.optimizer,
                             scaler=None)
            else:
                entry.update(opt=torch.optim.Adam(model.parameters(), lr=1e-4),
                             scaler=torch.amp.GradScaler("cuda") if a.fp16 else None)
            entry["setting"] = _setting(arch, model)
            if getattr(model, "memory_cache", None) is not None:
                # a frozen memory's cache: filled before anything is measured, so that the
                # FLOPs, the memory and the times all measure the same (warm) step
                with torch.no_grad(), self._autocast():
                    model.train()
                    entry["crit"](model, entry["sample"])
            entry["flops"] = self.count_flops(entry)
            entry["attention_flops"] = attention_step_flops(entry["model"], entry["sample"])
            # two full training steps (the memory measurement) also warm the model up
            entry["peak_mem_mb"] = self.peak_memory_mb(entry)
            if self.device.type == "cuda":  # what a step waits for on the host
                from ctx_fairseq.host_reads import SyncCounter

                with SyncCounter() as syncs:
                    self.train_step(entry)
                entry["syncs_per_step"] = len(syncs.sites)
            for _ in range(a.warmup):
                self.train_step(entry)
            if a.infer_sentences:
                # untimed: builds the generator, warms up decoding, counts its FLOPs
                entry["infer_flops"] = self.infer(entry, count_flops=True)
            entries.append(entry)
            if entry["uncounted_ops"]:
                log(f"ctx-bench: warning: {label}: no FLOPs formula for "
                    f"{', '.join(sorted(entry['uncounted_ops']))}; their FLOPs count as zero "
                    "and the FLOPs bounds are not comparable")
            log(f"ctx-bench: built {label}: {entry['params'] / 1e6:.2f}M params, "
                f"{entry['flops'] / 1e9:.1f} GFLOP per training step"
                + (f"; {entry['setting']}" if entry["setting"] else ""))
        for r in range(a.repeats):
            order = entries[r % len(entries):] + entries[:r % len(entries)]
            for entry in order:
                entry["train"].append(self.timed_train(entry))
                if a.infer_sentences:
                    entry["infer"].append(self.infer(entry))
            log(f"ctx-bench: repeat {r + 1}/{a.repeats} done")
        base = entries[0]
        base_train = statistics.median(base["train"])
        base_infer = statistics.median(base["infer"]) if base["infer"] else math.nan
        peak, peak_source = self.peak_tflops()
        results = [self._result_row(e, base, base_train, base_infer, peak) for e in entries]
        return {"device": self.device_name(), "shape": self.shape(), "precision": self.precision(),
                "peak_tflops": peak, "peak_tflops_source": peak_source,
                "training_step": self.training_step_note(), "results": results}

    @staticmethod
    def _result_row(e: Dict, base: Dict, base_train: float, base_infer: float, peak) -> Dict:
        """One architecture's row of the results, its ratios against ``base``."""
        train = statistics.median(e["train"])
        infer = statistics.median(e["infer"]) if e["infer"] else math.nan
        tokens = _tokens(e["sample"])
        # achieved TFLOP/s: the counted FLOPs of a step (forward + backward, in the
        # timed precision) over the median step time
        train_eff = mfu(e["flops"], tokens / train, peak)
        infer_eff = (mfu(e["infer_flops"], 1.0 / infer, peak)
                     if "infer_flops" in e and not math.isnan(infer) else None)
        return {
            "arch": e["label"], "setting": e["setting"], "params": e["params"],
            "train_tokens_per_s": train, "train_ratio": train / base_train,
            # per target token: a whole-document batch may hold fewer tokens than the
            # baseline's
            "flops_ratio_bound": (base["flops"] / _tokens(base["sample"]))
            / (e["flops"] / _tokens(e["sample"])),
            "infer_sentences_per_s": None if math.isnan(infer) else infer,
            "infer_ratio": None if math.isnan(infer) else infer / base_infer,
            "infer_flops_ratio_bound": (base["infer_flops"] / e["infer_flops"]
                                        if "infer_flops" in e else None),
            "peak_mem_mb": e["peak_mem_mb"],
            # CUDA only: the synchronising calls of one training step (host reads)
            "train_syncs_per_step": e.get("syncs_per_step"),
            "train_tflops": train_eff["tflops"], "train_mfu": train_eff["mfu"],
            "infer_tflops": infer_eff["tflops"] if infer_eff else None,
            "infer_mfu": infer_eff["mfu"] if infer_eff else None,
            "batch_sentences": int(e["sample"]["nsentences"]),
            "batch_memory_sentences": memory_sentences(e["sample"]),
            "batch_target_tokens": tokens,
            "train_sentences_per_s": train / _tokens(e["sample"]) * e["sample"]["nsentences"],
            "peak_mem_mb_per_sentence": e["peak_mem_mb"] / e["sample"]["nsentences"],
            "train_flops": e["flops"], "train_attention_flops": e.get("attention_flops"),
            # CPU only: one training step under the profiler (the memory measurement),
            # its wall time and the CPU time of the ops whose FLOPs are counted
            "train_profiled_step_s": e.get("profiled_step_s"),
            "train_counted_ops_s": e.get("counted_ops_s"),
            "train_tokens_per_s_repeats": e["train"],
            "infer_sentences_per_s_repeats": e["infer"],
        }

    def training_step_note(self) -> str:
        """What the timed training step is, where it differs from fairseq-train's."""
        if self.fairseq_step():
            return ("fairseq's Trainer.train_step as fairseq-train runs it (--optimizer adam"
                    + (", --fp16: half-precision model, fp32 master weights (FP16Optimizer)"
                       if self.args.fp16 else "") + "), label-smoothed cross-entropy")
        note = "forward, label-smoothed cross-entropy, backward, torch.optim.Adam step"
        if self.args.fp16:
            note += ("; fp16: autocast with fp32 weights and a GradScaler (fairseq-train "
                     "--amp), not --fp16's half-precision model with fp32 master weights "
                     "(FP16Optimizer)")
        return note

    def dry_run(self, specs: List[str], log=print) -> Dict:
        """``--dry-run``: every argument checked and every model and measured
        batch built as the real run builds them (the task's batching, the
        concatenation and memory checks), at the given shapes, on the CPU;
        nothing run or timed."""
        rows = []
        for label in specs:
            arch, extra = parse_spec(label)
            torch.manual_seed(self.args.seed)
            model, task, margs = self.build(arch, extra)
            sample = self.sample(model, task, margs, self.args.seed)
            if self.fairseq_step():  # fairseq-train's trainer takes the options (not built)
                from fairseq.criterions.label_smoothed_cross_entropy import (
                    LabelSmoothedCrossEntropyCriterion,
                )
                from fairseq.dataclass.utils import convert_namespace_to_omegaconf
                from fairseq.trainer import Trainer

                Trainer(convert_namespace_to_omegaconf(margs), task, model,
                        LabelSmoothedCrossEntropyCriterion(task, False, 0.1))
            row = {"arch": label, "params": sum(p.numel() for p in model.parameters()),
                   "batch_sentences": int(sample["nsentences"]),
                   "batch_memory_sentences": memory_sentences(sample),
                   "batch_target_tokens": _tokens(sample),
                   "setting": _setting(arch, model)}
            rows.append(row)
            log(f"ctx-bench: dry run: {label}: {row['params'] / 1e6:.2f}M params, batch of "
                f"{row['batch_sentences']} sentences ({row['batch_target_tokens']} target tokens"
                + (f", {row['batch_memory_sentences']} memory sentences"
                   if row["batch_memory_sentences"] is not None else "") + ")")
            del model, task, sample
        return {"device": f"dry run (built on the CPU for --device {self.args.device})",
                "dry_run": True, "shape": self.shape(), "precision": self.precision(),
                "results": rows}

    def precision(self) -> str:
        """The precision of the timed matrix products (``ctx_fairseq.flops.matmul_precision``)."""
        if self.args.device != "cuda":
            return "fp32"
        return matmul_precision(self.args.fp16)

    def peak_tflops(self):
        """(the dense peak TFLOP/s that MFU is a fraction of, where it comes
        from): ``--peak-tflops``, else the table of known cards for the run's
        precision; (None, why) where neither applies."""
        a = self.args
        if getattr(a, "peak_tflops", None):
            return a.peak_tflops, "--peak-tflops"
        if self.device.type != "cuda":
            return None, "no peak known for the CPU (give --peak-tflops)"
        name = torch.cuda.get_device_name(self.device)
        peak, pattern = device_peak_tflops(name, self.precision())
        if peak is None:
            why = (f"{name} has no dense {self.precision()} peak in the table" if pattern else
                   f"{name} is not in ctx_fairseq.flops.PEAK_TFLOPS (give --peak-tflops)")
            return None, why
        return peak, f"{name}: dense {self.precision()} peak (datasheet; PEAK_TFLOPS {pattern!r})"

    def device_name(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device) + (" fp16" if self.args.fp16 else " fp32")
        return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"

    def shape(self) -> Dict:
        a = self.args
        return {
            "layers": a.layers, "embed_dim": a.embed_dim, "heads": a.heads, "ffn_dim": a.ffn_dim,
            "vocab": a.vocab, "src_len": a.src_len, "tgt_len": a.tgt_len,
            "max_tokens": a.max_tokens, "batch_size": self.batch_size, "doc_len": a.doc_len,
            "beam": a.beam, "infer_sentences": a.infer_sentences, "repeats": a.repeats,
            "train_steps": a.train_steps, "fp16": a.fp16,
            "train_step": getattr(a, "train_step", "torch"),
            "doc_batch": getattr(a, "doc_batch", "largest"),
        }


def run_sweep(args, specs: List[str], sizes: List[int], log=print) -> Dict:
    """The bench at each ``--max-tokens`` of ``sizes`` in turn (each point a
    full run: its own batches, FLOPs and repeats; the models of one point are
    freed before the next)."""
    import copy
    import gc

    points = []
    for m in sizes:
        a = copy.copy(args)
        a.max_tokens = m
        log(f"ctx-bench: sweep: --max-tokens {m}")
        report = Bench(a).run(specs, log=log)
        points.append({"max_tokens": m, **report})
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    shape = dict(points[0]["shape"], max_tokens=sizes, batch_size=None)
    if getattr(args, "dry_run", False):  # each point's models and batches, nothing measured
        return {"device": points[0]["device"], "shape": shape, "dry_run": True,
                "precision": points[0]["precision"],
                "results": [dict(r, arch=f"{r['arch']} @{p['max_tokens']}")
                            for p in points for r in p["results"]]}
    return {"device": points[0]["device"], "shape": shape, "sweep": points,
            "summary": sweep_summary(points)}


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctx-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--archs", default=None,
                   help="comma-separated architectures to compare with the baseline; "
                   "ARCH[--opt value] passes options (default: every plugin model's base arch)")
    p.add_argument("--baseline", default="transformer", help="baseline architecture (default: transformer)")
    p.add_argument("--layers", type=int, default=6, help="encoder and decoder layers (6)")
    p.add_argument("--embed-dim", type=int, default=512, help="model dimension (512)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (8)")
    p.add_argument("--ffn-dim", type=int, default=2048, help="FFN dimension (2048)")
    p.add_argument("--vocab", type=int, default=32000, help="joined vocabulary size (32000)")
    p.add_argument("--src-len", type=int, default=30, help="source sentence length (30)")
    p.add_argument("--tgt-len", type=int, default=30, help="target sentence length (30)")
    p.add_argument("--max-tokens", type=int, default=4096, help="target tokens per batch (4096)")
    p.add_argument("--doc-len", type=int, default=1,
                   help="context sentences per sentence for document models; sentences per "
                        "document for whole-document models (1)")
    p.add_argument("--doc-batch", choices=["largest", "last"], default="largest",
                   help="whole-document models: measure the largest batch of the first "
                        "document (throughput), or the one holding its last sentence (the "
                        "most memory) (largest)")
    p.add_argument("--beam", type=int, default=5, help="beam size for inference (5)")
    p.add_argument("--infer-sentences", type=int, default=32,
                   help="sentences per beam-search run; 0 skips inference (32)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved measurement rounds (3)")
    p.add_argument("--train-steps", type=int, default=2, help="training steps per measurement (2)")
    p.add_argument("--warmup", type=int, default=0,
                   help="extra untimed training steps per model; the two steps of the memory "
                   "measurement and one beam search always run first (0)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's choice); 1 is the most "
                   "robust against other load on the machine")
    p.add_argument("--fp16", action="store_true", help="mixed precision (autocast fp16; CUDA only)")
    p.add_argument("--train-step", choices=["torch", "fairseq"], default="torch",
                   help="the timed training step: 'torch': forward, loss, backward and a "
                        "torch.optim.Adam step (--fp16: autocast with fp32 weights and a "
                        "GradScaler, fairseq-train's --amp); 'fairseq': fairseq's "
                        "Trainer.train_step as fairseq-train runs it (fairseq's Adam; --fp16: "
                        "the half-precision model with fp32 master weights, FP16Optimizer, "
                        "its loss scaler, gradient norm and logging) (torch)")
    p.add_argument("--peak-tflops", type=float, default=None, metavar="TFLOPS",
                   help="the device's dense peak TFLOP/s for the run's precision, that MFU is a "
                        "fraction of (default: ctx_fairseq.flops.PEAK_TFLOPS for a known CUDA "
                        "card; none on the CPU)")
    p.add_argument("--sweep-max-tokens", default=None, metavar="N,N,...",
                   help="measure at each of these --max-tokens in turn and report, per "
                        "architecture, training tokens/s, TFLOP/s and MFU at each, and the "
                        "batch from which it stops being host-bound")
    p.add_argument("--segment-tokens", default=None, metavar="L,L,...",
                   help="issue 39: each --archs model (default transformer,transformer_gtrans) "
                   "trains on greedy doc2doc segments of at most L tokens, the baseline on the "
                   "same sentences (ctx_fairseq.cli.bench_doc2doc); with --attention-bench or "
                   "--decode-bench, the lengths those measure")
    p.add_argument("--attention-bench", action="store_true",
                   help="with --segment-tokens: group-masked attention against fairseq's "
                   "attention of the same shape (ctx_fairseq.cli.bench_attention)")
    p.add_argument("--decode-bench", action="store_true",
                   help="with --segment-tokens: beam search (--beam) on segments with and "
                   "without the sentence-count frame (ctx_fairseq.cli.bench_attention)")
    p.add_argument("--decode-segments", type=int, default=2,
                   help="--decode-bench: segments per beam search (2)")
    p.add_argument("--trace", action="store_true",
                   help="no timing: one cold training step per model on the accelerator's "
                   "path, counted on the CPU (FLOPs per target token against the baseline, "
                   "the context layer's aten ops, the selected sentences' word-level FLOPs "
                   "against their work, peak live memory; ctx_fairseq.cli.bench_trace)")
    p.add_argument("--path", default=None, metavar="CKPT",
                   help="with --trace: a trained checkpoint, traced on every batch of --data's "
                   "--split instead of random models")
    p.add_argument("--data", default=None, metavar="DIR", help="with --path: its data directory")
    p.add_argument("--split", default="test", help="with --path: the split (test)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the arguments and build every model and the batch it would be "
                        "measured on (on the CPU, whatever --device and --fp16 say); run "
                        "nothing")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--from-json", metavar="FILE",
                   help="do not measure: format the report saved by an earlier --json run")
    return p


def cli_main(argv: Optional[List[str]] = None) -> None:
    parser = get_parser()
    a = parser.parse_args(argv)
    for name in ("layers", "embed_dim", "heads", "ffn_dim", "src_len", "tgt_len", "max_tokens",
                 "doc_len", "beam", "repeats", "train_steps"):
        if getattr(a, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.infer_sentences < 0 or a.warmup < 0:
        parser.error("--infer-sentences and --warmup must be >= 0")
    if a.embed_dim % a.heads:
        parser.error(f"--embed-dim {a.embed_dim} must be divisible by --heads {a.heads}")
    if a.vocab < 8:
        parser.error("--vocab must be >= 8")
    if a.tgt_len > a.max_tokens:
        parser.error("--max-tokens must be at least --tgt-len")
    if a.threads is not None:
        if a.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available() and not a.dry_run:
        parser.error("--device cuda: no CUDA device is available")
    if a.fp16 and a.device != "cuda":
        parser.error("--fp16 needs --device cuda")
    if a.peak_tflops is not None and not (a.peak_tflops > 0 and math.isfinite(a.peak_tflops)):
        parser.error("--peak-tflops must be a positive number")
    sweep = None
    if a.sweep_max_tokens is not None:
        try:
            sweep = [int(x) for x in a.sweep_max_tokens.split(",") if x.strip()]
        except ValueError:
            parser.error(f"--sweep-max-tokens {a.sweep_max_tokens!r}: expected integers "
                         "separated by commas")
        if not sweep or len(set(sweep)) != len(sweep) or min(sweep) < a.tgt_len:
            parser.error("--sweep-max-tokens: distinct values, each at least --tgt-len")
        sweep = sorted(sweep)
    if a.from_json:
        try:
            with open(a.from_json, encoding="utf-8") as f:
                report = json.load(f)
        except (OSError, ValueError) as err:
            parser.error(f"--from-json {a.from_json}: {err}")
        print(format_markdown(report) if a.markdown else format_table(report))
        return
    if a.archs is None:
        from ctx_fairseq._registry import plugin_models

        specs = list(plugin_models())
    else:
        try:
            specs = split_specs(a.archs)
            for s in specs:
                parse_spec(s)
        except ValueError as err:
            parser.error(str(err))
    from fairseq.models import ARCH_MODEL_REGISTRY

    import ctx_fairseq  # noqa: F401  (registers the plugin's architectures)

    for s in [a.baseline] + specs:  # before any model is built or timed
        if parse_spec(s)[0] not in ARCH_MODEL_REGISTRY:
            parser.error(f"--archs: unknown architecture {parse_spec(s)[0]!r}")
    # The baseline comes first; naming it in --archs adds a second copy of it,
    # which measures the baseline against itself (run-to-run noise).
    specs = [a.baseline] + specs
    log = (lambda msg: print(msg, file=sys.stderr, flush=True))
    if a.segment_tokens is not None or a.attention_bench or a.decode_bench:
        from ctx_fairseq.cli.bench_attention import segment_main

        return segment_main(a, specs, parser, log, Bench)
    if a.trace:
        from ctx_fairseq.cli.bench_trace import trace_main

        return trace_main(a, Bench(a), specs, parser, log)
    try:
        if sweep:
            report = run_sweep(a, specs, sweep, log)
        else:
            report = Bench(a).run(specs, log=log)
    except ValueError as err:
        parser.error(str(err))
    if a.json:
        print(json.dumps(report, indent=2))
    elif a.markdown:
        print(format_markdown(report))
    else:
        print(format_table(report))


if __name__ == "__main__":
    cli_main(sys.argv[1:])
