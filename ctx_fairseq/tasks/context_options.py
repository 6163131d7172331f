"""The document task's context options checked and compared: the options
that change what a model sees (``CONTEXT_OPTIONS``, declared beside the
options in ``tasks/document_config.py``; a checkpoint is translated with the
values it was trained with), their check before any data is read
(:func:`validate_context_options`), their command-line form for tools
that rebuild a checkpoint's command line (:func:`context_option_args`), and
the one context specification is built from them by
:meth:`ctx_fairseq.data.contract.ContextSpec.from_task_config` (what every
consumer reads).

Two options, two meanings (issue 35): ``--sampled-context-size K`` is the
training-time size drawn per sentence from 0..K (a memory's window drawn
likewise); ``--memory-window K`` is the window a document memory reads
outside training (default: the sampled K it was trained on). The old
``--sample-context-size K`` meant both; it stays as a deprecated alias that
sets both (:func:`~ctx_fairseq.data.contract.sampled_context_size`,
:func:`~ctx_fairseq.data.contract.memory_window`): in
fairseq-train the sampled size (and the validation window, as before), in
fairseq-generate and fairseq-validate the window, where only the window has
an effect (ctx-cxmi takes neither: it reads the checkpoint's values, and
scores another window with ``--context-size N``, the ``window-N``
condition). A checkpoint trained before the split stores only
``sample_context_size``; the same functions read it, so it loads and scores
as before (tests/test_context_spec.py, with a checkpoint made by the old code)."""

import logging
from typing import Any, List

from ctx_fairseq.data.contract import memory_window, sampled_context_size
from ctx_fairseq.tasks.document_config import CONTEXT_OPTIONS, FLAG_OPTIONS
from ctx_fairseq.data.windows import check_context_sizes
from ctx_fairseq.errors import InputError

__all__ = ["validate_context_options", "validate_doc2doc_options",
           "context_option_args", "context_option_diff", "task_setting"]

logger = logging.getLogger(__name__)



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
    old = int(_get(cfg, "sample_context_size", 0) or 0)
    new = int(_get(cfg, "sampled_context_size", 0) or 0)
    if old and new and old != new:
        raise InputError(f"--sample-context-size {old} and --sampled-context-size {new}: the "
                         "first is the deprecated name of the second (and of --memory-window); "
                         "give one")
    if old:
        logger.warning(
            f"--sample-context-size {old} is deprecated: it now stands for "
            f"--sampled-context-size {old} (training)"
            + (f" and --memory-window {old} (outside training)" if memory else "")
            + "; give those (a checkpoint trained before the split of the option is read "
            "the same way)")
    window = _get(cfg, "memory_window", None)
    if window is not None:
        if int(window) < 0:
            raise InputError(f"--memory-window must be >= 0 (0: the whole memory), got {window}")
        if not memory:
            raise InputError("--memory-window bounds a document memory (--document-memory); "
                             "for a bounded context use --source-context-size")
    sample = sampled_context_size(cfg)
    if sample:
        check_context_sizes(sample, None, src_k, tgt_k, _get(cfg, "context_direction", "prev"),
                            document, memory)
    validate_doc2doc_options(cfg)
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


#: options that give a sentence context inputs, or batches of another kind:
#: none goes with ``--doc2doc`` (the option, the value it may not have)
_NOT_WITH_DOC2DOC = (
    ("concat_context", False, "the concatenation baseline prepends context sentences"),
    ("document_context", "none", "a whole-document context is a context input"),
    ("document_memory", False, "a document memory is a context input"),
    ("document_batching", False, "segments are batched by length as sentences are"),
    ("context_ablation", "none", "segments carry no context to ablate"),
    ("context_dropout", 0.0, "segments carry no context to drop"),
    ("coword_dropout", 0.0, "CoWord dropout drops words of the current sentence beside its "
                            "context"),
    ("sampled_context_size", 0, "segments carry no context to sample"),
    ("sample_context_size", 0, "segments carry no context to sample"),
    ("gold_target_context", False, "segments carry no target context"),
    ("target_context_file", None, "segments carry no target context"),
    ("own_target_context", False, "segments carry no target context"),
    ("truncate_source", False, "a segment is never truncated (a long one is refused when "
                               "the data is loaded)"),
)


def validate_doc2doc_options(cfg) -> None:
    """``--doc2doc`` and its options: a segment is a sentence-level model's
    input, so no context option goes with it (``--source-context-size 0
    --target-context-size 0`` must be given: the task's default source
    context size is 1), the limits are positive, and the frame's options
    are checked (they are read only with ``--doc2doc``)."""
    mode = _get(cfg, "doc2doc", "none") or "none"
    frame = bool(_get(cfg, "doc2doc_frame", False))
    scale = float(_get(cfg, "lr_scale_pretrained", 1.0))
    if scale < 0:
        raise InputError(f"--lr-scale-pretrained must be >= 0, got {scale}")
    if mode == "none":
        if frame:
            raise InputError("--doc2doc-frame decodes segments: it goes with --doc2doc "
                             "greedy|multires")
        return
    src_k, tgt_k = int(cfg.source_context_size), int(cfg.target_context_size)
    if src_k or tgt_k:
        raise InputError(f"--doc2doc {mode} translates segments of whole sentences with no "
                         f"context inputs: give --source-context-size 0 (the default is 1) "
                         f"and --target-context-size 0 (got {src_k} and {tgt_k})")
    for name, none, why in _NOT_WITH_DOC2DOC:
        value = _get(cfg, name, none)
        if value is not None and value != none and not (none is None and not value):
            raise InputError(f"--{name.replace('_', '-')} {value} with --doc2doc {mode}: "
                             f"{why}; leave it out")
    n = int(_get(cfg, "doc2doc_max_tokens", 512))
    if n < 2:
        raise InputError(f"--doc2doc-max-tokens must be >= 2 (a token and </s>), got {n}")
    for side in ("source", "target"):
        limit = _get(cfg, f"max_{side}_positions", None)
        if limit is not None and n > int(limit):
            raise InputError(f"--doc2doc-max-tokens {n} is more than --max-{side}-positions "
                             f"{limit}: segments that long could not be read; lower it or "
                             "raise the positions")
    sep = str(_get(cfg, "doc2doc_separator", "<sep>") or "")
    if not sep or any(c.isspace() for c in sep) or sep in ("<s>", "<pad>", "</s>", "<unk>"):
        raise InputError(f"--doc2doc-separator {sep!r}: expected one symbol without white "
                         "space, not one of fairseq's special symbols")
    if int(_get(cfg, "doc2doc_min_sentence_len", 1)) < 0:
        raise InputError("--doc2doc-min-sentence-len must be >= 0")
    a, b = float(_get(cfg, "doc2doc_max_len_a", 1.5)), int(_get(cfg, "doc2doc_max_len_b", 10))
    if a < 0 or b < 0 or (a == 0 and b == 0):
        raise InputError(f"--doc2doc-max-len-a {a} / --doc2doc-max-len-b {b}: expected a >= 0, "
                         "b >= 0 and a sentence allowed at least one token")


def context_option_args(task_cfg) -> List[str]:
    """A checkpoint's context options (:data:`CONTEXT_OPTIONS`) as command-line
    arguments for fairseq-generate and the analysis tools (flags only when
    set; a document memory's window, ``--memory-window K``, too); empty
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
        args += ["--memory-window", str(window)]
    return args


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
    ours = memory_window(cfg) or 0
    if theirs is not None and theirs != ours:
        diff.append(f"--memory-window {ours} (trained with {theirs}: the window on the "
                    "document memory)")
    return diff


def task_setting(task, name: str, default: Any = None) -> Any:
    """A setting of ``task``'s configuration that is not a context setting
    (the language pair, the task's name, an override checked after a
    checkpoint is restored); ``default`` where the task has none. Context
    settings are read from the task's :class:`~ctx_fairseq.data.contract.ContextSpec`
    (``task_options(task)``): eval/ and cli/ never read ``task.cfg``, and
    ``tests/test_contract.py`` refuses a context option named here."""
    cfg = getattr(task, "cfg", None)
    return default if cfg is None else _get(cfg, name, default)
