"""Fixes for fairseq behaviour that silently loses data or makes a resumed
training differ from an uninterrupted one, applied on import.

``fairseq.data.data_utils.batch_by_size`` (fairseq >= 0.12.3 and its forks,
including ``ve-fairseq``) drops the last batch when its size is not a
multiple of ``--required-batch-size-multiple`` (default 8): up to 7 sentences
are skipped in every training epoch and, worse, ``fairseq-generate`` leaves
out test sentences, so BLEU is computed on part of the test set (upstream
issues facebookresearch/fairseq#5036 and #5351). Importing ``ctx_fairseq``
(``--user-dir ctx_fairseq``) restores fairseq 0.12.2's behaviour: the last,
smaller batch is kept. Every index appears in exactly one batch.

``FairseqTask.get_batch_iterator`` (fairseq 0.12.3, the version here) orders
the indices under ``numpy_seed(seed + epoch)``, so which of the equally long
sentences share a batch, and in which order, depends on the epoch the
iterator is built for. A dataset whose iterator is reused across epochs
(``can_reuse_epoch_itr_across_epochs``) gets its batches built once, at the
first epoch of the run; a run resumed from a checkpoint in epoch ``e > 1``
builds them for ``e`` instead: batches of the same sizes holding other
sentences or the same ones in another order (other dropout masks per
sentence, another summation order), so a killed and resumed
``fairseq-train`` does not end with the weights of an uninterrupted run
(measured: tests/test_resume.py; on the TVsub smoke data the loss of update
5 after resuming at 4 was 5.795 against 5.813). Importing ``ctx_fairseq``
builds the batches of a reusable iterator as for epoch 1 whatever epoch it
starts at (an uninterrupted run's batches: runs from scratch are
unchanged); the iterator still starts at ``epoch`` (``dataset.set_epoch``,
the iterator's epoch and so its per-epoch shuffling). Iterators rebuilt every
epoch (not reusable, ``disable_iterator_cache``, ``update_epoch_batch_itr``,
``rebuild_batches``) use ``seed + epoch`` in both runs and are left as they
are.

``fairseq.utils.softmax`` and ``fairseq.utils.log_softmax`` (fairseq's
attention weights, and a decoder's ``get_normalized_probs``) always compute
in float32: meant as an upcast of half precision, it is a downcast of a
float64 model, whose attention then rounds to float32 (relative error about
6e-8). Two computations that agree to float64 round-off before the softmax
(a batch grouped by length and the same batch whole; a sentence alone and
padded; the same matmul on another CPU's kernels) then differ by about 1e-7
after it, depending on whether a float32 rounding boundary falls between
them. Importing ``ctx_fairseq`` computes both in
``promote_types(dtype, float32)``: float32 for half, bfloat16 and float32
inputs (bit-identical to fairseq's), float64 for float64 inputs. The ONNX
tracing branch is left as it is, and so is TorchScript: a scripted module
compiles fairseq's own source of these functions (nothing in ctx_fairseq
scripts a model).

A checkpoint of the ``document_translation`` task trained before issue 35
stores ``--sample-context-size`` only (one option for the training-time
sampled size and, with a document memory, the window read outside
training). fairseq applies command-line overrides to a checkpoint's stored
configuration only for the keys it already has, so ``--memory-window`` or
``--sampled-context-size`` given to fairseq-validate (or any tool that
restores a checkpoint with overrides) would be dropped without a word.
Importing ``ctx_fairseq`` upgrades such a configuration as it is loaded,
before the overrides: ``sampled_context_size`` and ``memory_window`` are set
from the old field (:func:`upgrade_context_options`), which is then 0, so
the checkpoint scores exactly as before and gives no deprecation warning.

``Trainer.train_step`` (fairseq 0.12) runs an update's micro-batches
(``--update-freq``) in a loop whose padding flag (``is_dummy_batch``: an
empty batch, replaced by a dummy batch whose loss is multiplied by 0) is the
loop variable, so after the loop it is the last micro-batch's: an update
whose last micro-batch is padding gets its whole sample size zeroed and its
logging dropped while the real micro-batches' gradients stay (the update is
scaled by the other workers' sample size only), and an update whose padding
batch comes earlier counts the dummy's sample size and logging. Padding
batches come from the shards' fill at the end of an epoch (a worker whose
shard is one batch short) and from workers with nothing to train on.
Importing ``ctx_fairseq`` makes each padding micro-batch zero its own sample
size and drop only its own logging output (padding batches run first, so
that the last micro-batch is a real one; they add no gradient); an update of
padding batches only is fairseq's own case and left as it is
(tests/test_data_parallel.py: 2 workers x ``--update-freq 2`` on an epoch
ending so train as one process x ``--update-freq 4``).

``DistributedFairseqModel`` (``--ddp-backend pytorch_ddp``, fairseq's
default, or ``c10d``) gives ``DistributedDataParallel`` ``device_ids=[device_id]``
whatever the device, which PyTorch refuses for a CPU module ("device_ids and
output_device arguments only work with single-device/multiple-device GPU
modules or CPU modules"), so CPU training with gloo needed ``--ddp-backend
legacy_ddp``. Importing ``ctx_fairseq`` wraps a module on the CPU without
device arguments; a CUDA module is wrapped as before.

``fairseq-train`` spawns one process per GPU when ``--distributed-world-size``
exceeds 1 without ``--distributed-no-spawn``; with ``--cpu`` it spawned
``min(GPUs, N)``, that is none, and ended at once with status 0, having
trained nothing. Importing ``ctx_fairseq`` spawns ``N`` processes on the CPU
(one machine: ``--distributed-init-method`` given, ``--distributed-rank 0``;
without an address, or from another start rank, the command is refused with
what to give). In a spawned process, on the CPU or a GPU, bad input
(:class:`~ctx_fairseq.errors.InputError`) prints the one-line error and
ends that process with status 1; the launching process then ends with
status 1 without a traceback of its own (the workers' line says why), and
PyTorch's ``spawn`` ends the other workers, so that no worker waits for a
failed one.

With several workers, rank 0 alone reads a checkpoint to resume (or
``--finetune-from-model``) and fairseq sends its state to the others with
``broadcast_object``, which pickles it and unpickles it with a plain
``torch.load``: under torch >= 2.6 (``weights_only=True``) the receivers
refused the state's configuration (an OmegaConf ``DictConfig``, which
checkpoint files never hold: fairseq saves it as plain containers) and every
rank but 0 crashed. Importing ``ctx_fairseq`` sends configurations as the
files hold them, plain containers, and makes them ``DictConfig`` again on
arrival, as fairseq's loader does (safe loading stays on; the allow-list is
unchanged).
"""

import functools
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F


def _keep_last_batch(original):
    @functools.wraps(original)
    def batch_by_size(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None,
                      max_sentences=None, required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        if len(indices) == 0:
            return []
        batches = original(indices, num_tokens_fn, num_tokens_vec=num_tokens_vec,
                           max_tokens=max_tokens, max_sentences=max_sentences,
                           required_batch_size_multiple=required_batch_size_multiple,
                           fixed_shapes=fixed_shapes)
        if fixed_shapes is None:
            covered = sum(len(b) for b in batches)
            if covered < len(indices):  # batches are consecutive slices of indices
                batches = list(batches) + [indices[covered:]]
        return batches

    batch_by_size.ctx_fairseq_fixed = True
    return batch_by_size


def keep_last_batch() -> None:
    """Patch ``fairseq.data.data_utils.batch_by_size`` (idempotent)."""
    from fairseq.data import data_utils

    if not getattr(data_utils.batch_by_size, "ctx_fairseq_fixed", False):
        data_utils.batch_by_size = _keep_last_batch(data_utils.batch_by_size)


def _reuse_first_epoch_batches(original):
    @functools.wraps(original)
    def get_batch_iterator(self, dataset, *args, epoch=1, disable_iterator_cache=False,
                           update_epoch_batch_itr=False, **kwargs):
        if args:  # fairseq passes everything after ``dataset`` by keyword
            raise TypeError("get_batch_iterator: pass the arguments after dataset by keyword")
        reusable = (not disable_iterator_cache and not update_epoch_batch_itr
                    and self.can_reuse_epoch_itr(dataset)
                    and not getattr(getattr(self, "cfg", None), "rebuild_batches", False))
        cached = reusable and dataset in getattr(self, "dataset_to_epoch_iter", {})
        if not reusable or cached or epoch <= 1:
            return original(self, dataset, epoch=epoch,
                            disable_iterator_cache=disable_iterator_cache,
                            update_epoch_batch_itr=update_epoch_batch_itr, **kwargs)
        itr = original(self, dataset, epoch=1, disable_iterator_cache=disable_iterator_cache,
                       update_epoch_batch_itr=update_epoch_batch_itr, **kwargs)
        dataset.set_epoch(epoch)
        itr.epoch = epoch
        return itr

    get_batch_iterator.ctx_fairseq_fixed = True
    return get_batch_iterator


def reuse_first_epoch_batches() -> None:
    """Patch ``fairseq.tasks.FairseqTask.get_batch_iterator`` (idempotent):
    a reusable iterator's batches do not depend on the epoch it starts at."""
    from fairseq.tasks import FairseqTask

    if not getattr(FairseqTask.get_batch_iterator, "ctx_fairseq_fixed", False):
        FairseqTask.get_batch_iterator = _reuse_first_epoch_batches(
            FairseqTask.get_batch_iterator)


def _atomic_copy(original):
    @functools.wraps(original)
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        # overwrites, as fairseq's own local copy (shutil.copyfile) does
        from fairseq import file_io

        if file_io.IOPathManager is not None and file_io.PathManager.path_requires_pathmanager(
                dst_path):
            return original(src_path, dst_path, overwrite=overwrite)
        tmp = dst_path + ".tmp"
        shutil.copyfile(src_path, tmp)
        os.replace(tmp, dst_path)
        return True

    copy.ctx_fairseq_fixed = True
    return copy


def atomic_checkpoint_copies() -> None:
    """Patch ``fairseq.file_io.PathManager.copy`` (idempotent): a local copy
    is written to ``DST.tmp`` and renamed over ``DST``."""
    from fairseq.file_io import PathManager

    if not getattr(PathManager.copy, "ctx_fairseq_fixed", False):
        PathManager.copy = staticmethod(_atomic_copy(PathManager.copy))


def _no_float64_downcast(original, fn):
    @functools.wraps(original)
    def normalize(x, dim: int, onnx_trace: bool = False):
        if onnx_trace:
            return original(x, dim, onnx_trace=onnx_trace)
        return fn(x, dim=dim, dtype=torch.promote_types(x.dtype, torch.float32))

    normalize.ctx_fairseq_fixed = True
    return normalize


def float64_softmax() -> None:
    """Patch ``fairseq.utils.softmax`` and ``fairseq.utils.log_softmax``
    (idempotent): float32 at least, float64 for float64 inputs (fairseq's
    modules call them as ``utils.softmax``, so the patched function is the
    one they run)."""
    from fairseq import utils

    for name, fn in (("softmax", F.softmax), ("log_softmax", F.log_softmax)):
        if not getattr(getattr(utils, name), "ctx_fairseq_fixed", False):
            setattr(utils, name, _no_float64_downcast(getattr(utils, name), fn))


def upgrade_context_options(cfg) -> bool:
    """A document task's stored configuration from before issue 35 (only
    ``sample_context_size``) given ``sampled_context_size`` and
    ``memory_window`` in its place (in place; True when upgraded). Anything
    else, a newer configuration included, is left as it is."""
    from omegaconf import DictConfig, open_dict

    task = cfg.get("task") if cfg is not None and hasattr(cfg, "get") else None
    if task is None or task.get("_name", None) != "document_translation":
        return False
    if "sample_context_size" not in task or "sampled_context_size" in task \
            or "memory_window" in task:
        return False
    old = int(task.get("sample_context_size") or 0)
    values = {"sampled_context_size": old,
              "memory_window": old if task.get("document_memory", False) else None,
              "sample_context_size": 0}
    if isinstance(task, DictConfig):
        with open_dict(task):
            for k, v in values.items():
                task[k] = v
    else:
        task.update(values)
    return True


def _upgrade_before_overrides(original):
    @functools.wraps(original)
    def overwrite_args_by_name(cfg, overrides):
        upgrade_context_options(cfg)
        return original(cfg, overrides)

    overwrite_args_by_name.ctx_fairseq_fixed = True
    return overwrite_args_by_name


def _upgrade_on_load(original):
    @functools.wraps(original)
    def upgrade_state_dict(state):
        if isinstance(state, dict) and state.get("cfg") is not None:
            upgrade_context_options(state["cfg"])
        return original(state)

    upgrade_state_dict.ctx_fairseq_fixed = True
    return upgrade_state_dict


def upgrade_old_context_options() -> None:
    """Patch fairseq's checkpoint loading (idempotent): a stored document
    task configuration is upgraded (:func:`upgrade_context_options`) before
    the command line's overrides are applied, and on every load."""
    from fairseq import checkpoint_utils

    if not getattr(checkpoint_utils.overwrite_args_by_name, "ctx_fairseq_fixed", False):
        checkpoint_utils.overwrite_args_by_name = _upgrade_before_overrides(
            checkpoint_utils.overwrite_args_by_name)
    if not getattr(checkpoint_utils._upgrade_state_dict, "ctx_fairseq_fixed", False):
        checkpoint_utils._upgrade_state_dict = _upgrade_on_load(
            checkpoint_utils._upgrade_state_dict)


def _is_padding_batch(sample) -> bool:
    """A micro-batch fairseq's trainer replaces by its dummy batch."""
    return sample is None or len(sample) == 0


def _per_batch_padding(original):
    @functools.wraps(original)
    def train_step(self, samples, raise_oom=False):
        padding = [_is_padding_batch(s) for s in samples]
        if not any(padding) or all(padding):  # fairseq's own handling is right
            return original(self, samples, raise_oom=raise_oom)
        # the padding micro-batches first, so that the last one (whose flag fairseq
        # keeps) is real; a padding batch adds no gradient (its loss is multiplied by 0)
        ordered = ([s for s, p in zip(samples, padding) if p]
                   + [s for s, p in zip(samples, padding) if not p])
        dropped = []  # the padding batches' logging outputs (compared by identity)
        task = self.task
        task_step = task.train_step
        aggregate, reduce_and_log = self._aggregate_logging_outputs, self._reduce_and_log_stats

        def padded_task_step(*args, **kwargs):
            loss, size, log = task_step(*args, **kwargs)
            if kwargs.get("ignore_grad", False):
                size = torch.zeros_like(size) if torch.is_tensor(size) else size * 0
                dropped.append(log)
            return loss, size, log

        def keep(logs):
            return [log for log in logs if not any(log is d for d in dropped)]

        def aggregate_kept(logging_outputs, *extra, **kwargs):
            return aggregate(keep(logging_outputs), *extra, **kwargs)

        def reduce_kept(logging_outputs, *args, **kwargs):
            return reduce_and_log(keep(logging_outputs), *args, **kwargs)

        saved = [(obj, name, obj.__dict__[name] if name in obj.__dict__ else _ABSENT)
                 for obj, name in ((task, "train_step"), (self, "_aggregate_logging_outputs"),
                                   (self, "_reduce_and_log_stats"))]
        task.train_step = padded_task_step
        self._aggregate_logging_outputs = aggregate_kept
        self._reduce_and_log_stats = reduce_kept
        try:
            return original(self, ordered, raise_oom=raise_oom)
        finally:
            for obj, name, value in saved:
                if value is _ABSENT:
                    obj.__dict__.pop(name, None)
                else:
                    obj.__dict__[name] = value

    train_step.ctx_fairseq_fixed = True
    return train_step


_ABSENT = object()


def per_batch_padding() -> None:
    """Patch ``fairseq.trainer.Trainer.train_step`` (idempotent): in an
    update whose micro-batches (``--update-freq``) mix real and padding
    batches, each padding batch's own sample size is zeroed and its logging
    output dropped; the real batches' sample sizes and logging stay."""
    from fairseq.trainer import Trainer

    if not getattr(Trainer.train_step, "ctx_fairseq_fixed", False):
        Trainer.train_step = _per_batch_padding(Trainer.train_step)


class _DeviceAwareDDP(torch.nn.parallel.DistributedDataParallel):
    """``DistributedDataParallel`` that drops ``device_ids`` and
    ``output_device`` for a module on the CPU (PyTorch refuses them there)."""

    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        on_cpu = all(t.device.type == "cpu"
                     for t in list(module.parameters()) + list(module.buffers()))
        if on_cpu:
            device_ids = output_device = None
        super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


def ddp_on_cpu() -> None:
    """Patch the ``DistributedDataParallel`` that fairseq's
    ``DistributedFairseqModel`` builds for ``--ddp-backend pytorch_ddp``
    (``c10d``) (idempotent): a CPU model is wrapped without device
    arguments; a CUDA model exactly as before."""
    from fairseq.models import distributed_fairseq_model as dfm

    if dfm.DistributedDataParallel is torch.nn.parallel.DistributedDataParallel:
        dfm.DistributedDataParallel = _DeviceAwareDDP


def _spawned_worker(i, main, cfg, kwargs):
    """One spawned process of fairseq-train (``torch.multiprocessing.spawn``'s
    function: module level, so that it pickles): fairseq's
    ``distributed_main``; bad input prints its one line and ends the process
    with status 1 (a ``SystemExit``, which ``spawn`` does not turn into a
    traceback)."""
    from fairseq.distributed import utils as distributed_utils

    from ctx_fairseq.errors import InputError, _prog

    try:
        distributed_utils.distributed_main(i, main, cfg, kwargs)
    except InputError as err:
        print(f"{_prog()}: error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)


def _spawning_call_main(original):
    @functools.wraps(original)
    def call_main(cfg, main, **kwargs):
        from ctx_fairseq.errors import InputError, _prog

        dt = cfg.distributed_training
        world = int(dt.distributed_world_size or 1)
        cpu = bool(cfg.common.cpu) or not torch.cuda.is_available()
        if world <= 1 or dt.distributed_no_spawn or getattr(cfg.common, "tpu", False):
            return original(cfg, main, **kwargs)
        if dt.distributed_init_method is None:  # fairseq's inference (torchrun, SLURM, GPUs)
            try:
                distributed_utils.infer_init_method(dt)
            except AssertionError as err:  # "world size is N but have 0 available devices"
                if not cpu:
                    raise
                raise InputError(
                    f"--distributed-world-size {world} on the CPU needs "
                    "--distributed-init-method tcp://HOST:PORT (one command spawns the "
                    f"{world} processes), or one command per rank with --distributed-rank R "
                    "--distributed-no-spawn (README, Data-parallel training)") from err
            if dt.distributed_init_method is None or dt.distributed_no_spawn:
                return original(cfg, main, **kwargs)
        start_rank = dt.distributed_rank or 0
        if cpu:
            if start_rank != 0:
                raise InputError(
                    f"--distributed-rank {start_rank}: one command on the CPU spawns all "
                    f"{world} ranks from 0; for ranks on several machines give each rank its "
                    "own command with --distributed-no-spawn")
            nprocs = world
        else:
            nprocs = min(torch.cuda.device_count(), world)
        dt.distributed_rank = None  # fairseq's distributed_main assigns start_rank + i
        kwargs["start_rank"] = start_rank
        try:
            torch.multiprocessing.spawn(fn=_spawned_worker, args=(main, cfg, kwargs),
                                        nprocs=nprocs, join=True)
        except torch.multiprocessing.ProcessExitedException as err:
            if err.exit_code == 1:  # a worker's bad input: its line is printed above
                print(f"{_prog()}: worker {err.error_index} of {nprocs} ended with status 1 "
                      "(its message is above); the others were stopped", file=sys.stderr,
                      flush=True)
                raise SystemExit(1) from None
            raise

    from fairseq.distributed import utils as distributed_utils

    call_main.ctx_fairseq_fixed = True
    return call_main


def spawned_workers() -> None:
    """Patch fairseq's ``call_main`` (idempotent): the spawned form of
    ``--distributed-world-size N`` runs ``N`` processes on the CPU, and a
    worker's bad input ends every process with status 1 and one line (see
    the module)."""
    from fairseq.distributed import utils as distributed_utils

    if not getattr(distributed_utils.call_main, "ctx_fairseq_fixed", False):
        distributed_utils.call_main = _spawning_call_main(distributed_utils.call_main)


_CONFIG_KEY = "__ctx_fairseq_omegaconf__"


def _configs_to_containers(obj):
    """``obj`` with every OmegaConf configuration inside dicts, lists and
    tuples replaced by ``{_CONFIG_KEY: its plain container}`` (as fairseq
    saves a configuration in a checkpoint file)."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(obj):
        return {_CONFIG_KEY: OmegaConf.to_container(obj, resolve=True, enum_to_str=True)}
    if isinstance(obj, dict):
        return {k: _configs_to_containers(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_configs_to_containers(v) for v in obj)
    return obj


def _containers_to_configs(obj):
    """The inverse of :func:`_configs_to_containers` (``OmegaConf.create``
    with objects allowed, as fairseq's checkpoint loader makes a
    configuration)."""
    from omegaconf import OmegaConf

    if isinstance(obj, dict):
        if set(obj) == {_CONFIG_KEY}:  # (objects allowed: a model's argparse.Namespace)
            return OmegaConf.create(obj[_CONFIG_KEY], flags={"allow_objects": True})
        return {k: _containers_to_configs(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_containers_to_configs(v) for v in obj)
    return obj


def _plain_config_broadcast(original):
    @functools.wraps(original)
    def broadcast_object(obj, src_rank, group, dist_device=None):
        from fairseq.distributed import utils as distributed_utils

        if distributed_utils.get_rank(group) == src_rank:  # the sender keeps its own object
            original(_configs_to_containers(obj), src_rank, group, dist_device)
            return obj
        return _containers_to_configs(original(None, src_rank, group, dist_device))

    broadcast_object.ctx_fairseq_fixed = True
    return broadcast_object


def broadcast_safe_states() -> None:
    """Patch fairseq's ``broadcast_object`` (idempotent): configurations
    travel as plain containers, which the receivers' safe ``torch.load``
    takes (see the module)."""
    from fairseq.distributed import utils as distributed_utils

    if not getattr(distributed_utils.broadcast_object, "ctx_fairseq_fixed", False):
        distributed_utils.broadcast_object = _plain_config_broadcast(
            distributed_utils.broadcast_object)
