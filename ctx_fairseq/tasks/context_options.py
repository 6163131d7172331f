"""The document task's context options in one place: the declared list of
options that change what a model sees (a checkpoint is translated with the
values it was trained with), their check before any data is read
(:func:`validate_context_options`), their command-line form for tools
that rebuild a checkpoint's command line (:func:`context_option_args`), and
what the models the task builds may read of them (:func:`options_for_models`,
the model-task contract of :mod:`ctx_fairseq.data.contract`)."""

from typing import Any, List, Optional

from ctx_fairseq.data.contract import TaskContextOptions
from ctx_fairseq.data.windows import check_context_sizes
from ctx_fairseq.errors import InputError

__all__ = ["CONTEXT_OPTIONS", "FLAG_OPTIONS", "validate_context_options",
           "context_option_args", "context_option_diff", "memory_window", "options_for_models"]

#: options that change what a model sees, compared with the checkpoint's
#: (``DocumentTranslationTask.check_context_options``)
CONTEXT_OPTIONS = ("source_context_size", "target_context_size", "context_direction",
                   "document_context", "document_memory", "context_separator",
                   "concat_context", "concat_break")
#: of those, the ones given as a bare flag (``store_true``)
FLAG_OPTIONS = ("document_memory", "concat_context")


def _get(cfg, name: str, default: Any = None) -> Any:
    return cfg.get(name, default) if hasattr(cfg, "get") else getattr(cfg, name, default)


def validate_context_options(cfg) -> None:
    """The document task's options (``DocumentTranslationConfig``, or any
    object with its fields), checked together before any data is read: the
    dropouts' probabilities, context dropout without context, the length
    groups, the sampled context size, and the concatenation baseline's
    options. Raises :class:`~ctx_fairseq.errors.InputError` (one line per
    console script). The checks that need the dictionaries (the separator's
    and ``--concat-break``'s indices) stay with the task."""
    for name in ("context_dropout", "coword_dropout"):
        p = float(_get(cfg, name, 0.0) or 0.0)
        if not 0.0 <= p <= 1.0:
            raise InputError(f"--{name.replace('_', '-')} must be a probability in [0, 1], "
                             f"got {p}")
    src_k, tgt_k = int(cfg.source_context_size), int(cfg.target_context_size)
    memory = bool(_get(cfg, "document_memory", False))
    document = _get(cfg, "document_context", "none") or "none"
    if float(_get(cfg, "context_dropout", 0.0) or 0.0) > 0 and not (src_k > 0 or tgt_k > 0
                                                                   or memory):
        raise InputError("--context-dropout without context (--source-context-size / "
                         "--target-context-size 0, no --document-memory): nothing to drop")
    buckets = _get(cfg, "length_buckets", 1)
    buckets = 1 if buckets is None else int(buckets)
    if buckets < 1:
        raise InputError(f"--length-buckets must be >= 1, got {buckets}")
    if buckets > 1 and not memory:
        raise InputError("--length-buckets groups the sentences of document-memory batches "
                         "(--document-memory) by length; other batches are sorted by length "
                         "already")
    sample = _get(cfg, "sample_context_size", 0)
    if sample:
        check_context_sizes(sample, None, src_k, tgt_k, _get(cfg, "context_direction", "prev"),
                            document, memory)
    weight = float(_get(cfg, "concat_context_loss_weight", 1.0))
    concat = bool(_get(cfg, "concat_context", False))
    if weight != 1.0 and not concat:
        raise InputError("--concat-context-loss-weight goes with --concat-context")
    if weight < 0:
        raise InputError("--concat-context-loss-weight must be >= 0")
    if not concat:
        return
    if src_k <= 0 and tgt_k <= 0:
        raise InputError("--concat-context with --source-context-size 0 and "
                         "--target-context-size 0 would add no context")
    if _get(cfg, "context_direction", "prev") != "prev" or document != "none" or memory:
        raise InputError("--concat-context takes previous sentences only (--context-direction "
                         "prev, no --document-context / --document-memory)")


def context_option_args(task_cfg) -> List[str]:
    """A checkpoint's context options (:data:`CONTEXT_OPTIONS`) as command-line
    arguments for fairseq-generate and the analysis tools (flags only when
    set; a document memory's window, ``--sample-context-size K``, too); empty
    without a task configuration."""
    args: List[str] = []
    if task_cfg is None:
        return args
    for name in CONTEXT_OPTIONS:
        value = _get(task_cfg, name, None)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if name in FLAG_OPTIONS:
            if bool(value):
                args.append(flag)
        else:
            args += [flag, str(value)]
    window = memory_window(task_cfg)
    if window:
        args += ["--sample-context-size", str(window)]
    return args


def memory_window(cfg) -> Optional[int]:
    """The window ``K`` a document memory trained on windows ``0..K``
    (``--sample-context-size`` with ``--document-memory``) reads outside
    training, 0 for the whole memory; None without a memory or without the
    option (a checkpoint older than it). It changes what the model sees, as
    the options of :data:`CONTEXT_OPTIONS` do."""
    window = _get(cfg, "sample_context_size", None)
    if not _get(cfg, "document_memory", False) or window is None:
        return None
    return int(window)


def context_option_diff(trained, cfg) -> List[str]:
    """The context options of ``cfg`` that differ from those of ``trained``
    (a checkpoint's task configuration), one ``--option ours (trained with
    theirs)`` each: :data:`CONTEXT_OPTIONS`, and a memory's window."""
    diff = []
    for name in CONTEXT_OPTIONS:
        theirs, ours = _get(trained, name, None), _get(cfg, name, None)
        if theirs is not None and str(theirs) != str(ours):
            diff.append(f"--{name.replace('_', '-')} {ours} (trained with {theirs})")
    theirs = memory_window(trained)
    ours = int(_get(cfg, "sample_context_size", 0) or 0)
    if theirs is not None and theirs != ours:
        diff.append(f"--sample-context-size {ours} (trained with {theirs}: the window on the "
                    "document memory)")
    return diff


def options_for_models(cfg, src_dict) -> TaskContextOptions:
    """The task configuration's context options as the models it builds read
    them (``DocumentTranslationTask.context_options_for_models``), the
    separator with its index in the source dictionary (None where it is not
    in it)."""
    sep = cfg.context_separator or None
    sep_index = None
    if sep:
        idx = src_dict.index(sep)
        sep_index = idx if idx != src_dict.unk() else None
    return TaskContextOptions(
        source_context_size=int(cfg.source_context_size),
        target_context_size=int(cfg.target_context_size),
        context_direction=str(cfg.context_direction),
        document_context=str(cfg.document_context or "none"),
        document_memory=bool(cfg.document_memory),
        memory_precomputed=bool(cfg.memory_precomputed),
        length_buckets=int(cfg.length_buckets or 1),
        left_pad_source=bool(cfg.left_pad_source), left_pad_target=bool(cfg.left_pad_target),
        context_separator=sep, context_separator_index=sep_index)
