"""ctx-fairseq: local/global and document-level context for fairseq NMT.

Use it as a fairseq plugin: ``fairseq-train --user-dir ctx_fairseq ...``.
Importing this package registers every model, architecture, task and
criterion the project defines, and allow-lists the Python types that fairseq
checkpoints contain so that they load under ``torch.load(weights_only=True)``
(torch >= 2.6) without turning safe loading off, and makes fairseq keep the
last partial batch instead of silently dropping it (see ``ctx_fairseq.compat``).
"""

__version__ = "0.1.0"

from ctx_fairseq import compat as _compat  # noqa: E402
from ctx_fairseq import safe_load as _safe_load  # noqa: E402

_safe_load.allow_fairseq_checkpoints()
_compat.keep_last_batch()

from ctx_fairseq._registry import import_all_submodules as _import_all  # noqa: E402

for _sub in ("modules", "data", "models", "tasks", "criterions"):
    _import_all(f"{__name__}.{_sub}")
