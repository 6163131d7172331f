"""ctx-fairseq: local/global and document-level context for fairseq NMT.

Use it as a fairseq plugin: ``fairseq-train --user-dir ctx_fairseq ...``.
Importing this package registers every model, architecture, task and
criterion the project defines, and allow-lists the Python types that fairseq
checkpoints contain so that they load under ``torch.load(weights_only=True)``
(torch >= 2.6) without turning safe loading off, and makes fairseq keep the
last partial batch instead of silently dropping it, resume a killed run with
the batches of an uninterrupted one, copy checkpoints atomically and keep a
float64 model's attention softmax in float64, scale an update that mixes
real and padding micro-batches by its real ones, and let a CPU model train
with ``--ddp-backend pytorch_ddp`` (see
``ctx_fairseq.compat``); bad options and files given to a fairseq command
end in one line, not a traceback (``ctx_fairseq.errors``).
"""

__version__ = "0.1.0"

from ctx_fairseq import compat as _compat  # noqa: E402
from ctx_fairseq import errors as _errors  # noqa: E402
from ctx_fairseq import safe_load as _safe_load  # noqa: E402

_safe_load.allow_fairseq_checkpoints()
_compat.keep_last_batch()
_compat.reuse_first_epoch_batches()  # a resumed run builds the uninterrupted run's batches
_compat.atomic_checkpoint_copies()  # checkpoint_last.pt / _best.pt whole or not at all
_compat.float64_softmax()  # fairseq's softmax keeps a float64 model in float64
_compat.upgrade_old_context_options()  # --sample-context-size checkpoints take the new options
_compat.per_batch_padding()  # a padding micro-batch zeroes its own sample size, not the update's
_compat.ddp_on_cpu()  # --ddp-backend pytorch_ddp wraps a CPU model without device arguments
__import__("ctx_fairseq.optim.lr_scale", fromlist=["install"]).install()  # scaled param groups
_compat.spawned_workers()  # one command spawns N CPU workers; a worker's bad input: one line
_compat.broadcast_safe_states()  # a resumed state reaches every worker under safe loading
_errors.install_excepthook()  # bad options or files: one line, not a traceback

from ctx_fairseq._registry import import_all_submodules as _import_all  # noqa: E402

for _sub in ("modules", "data", "models", "tasks", "criterions"):
    _import_all(f"{__name__}.{_sub}")
