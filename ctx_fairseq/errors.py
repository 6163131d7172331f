"""Bad input (an option or a file that cannot be used as given) and how a
command line shows it.

:class:`InputError` is a ``ValueError``, so that library callers catch it as
before. Left uncaught at the top of a command (``fairseq-train``,
``fairseq-generate`` or ``fairseq-interactive`` with ``--user-dir
ctx_fairseq``, whose task's checks raise it), it prints one line,
``PROG: error: MESSAGE``, and no traceback; the exit status is 1, as for any
uncaught exception (:func:`install_excepthook`, run when the package is
imported). Every other exception keeps its traceback: a bug stays visible."""

import os
import sys

__all__ = ["InputError", "install_excepthook"]


class InputError(ValueError):
    """The user's input cannot be used as given; the message says what was
    given and what was expected."""


def _prog() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if name in ("", "-c", "-m"):
        return "python"
    return name[:-3] if name.endswith(".py") else name


def install_excepthook() -> None:
    """Show an uncaught :class:`InputError` as one line (see the module);
    idempotent, and any other exception goes to the hook that was there."""
    previous = sys.excepthook
    if getattr(previous, "_ctx_fairseq_input_errors", False):
        return

    def hook(exc_type, exc, tb):
        if isinstance(exc, InputError):
            print(f"{_prog()}: error: {exc}", file=sys.stderr, flush=True)
        else:
            previous(exc_type, exc, tb)

    hook._ctx_fairseq_input_errors = True
    sys.excepthook = hook
