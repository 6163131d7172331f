r"""``label_smoothed_cross_entropy_ctx``: fairseq's label-smoothed cross-entropy
plus each context model's own statistics in the training and validation
logs (progress bar, JSON log, TensorBoard). The keys, per architecture, and
the equations they refer to are in docs/criterion.md.

Loss. The class is fairseq's
:class:`~fairseq.criterions.label_smoothed_cross_entropy.LabelSmoothedCrossEntropyCriterion`
with its options (``--label-smoothing``, ``--report-accuracy``,
``--ignore-prefix-size``, ``--sentence-avg``) and its loss, ``nll_loss``,
sample size and accuracy, unchanged: :meth:`forward` calls the parent's and
only adds entries to its logging output.

Statistics come from the model, through the protocol of
:mod:`ctx_fairseq.modules.context_statistics`: if the model (reached through
fairseq's data-parallel wrappers, which forward attribute look-ups) has
``record_context_statistics``, recording is turned on for the parent's
forward pass and off again right after it (also on error), and
``model.context_statistics()`` gives ``name -> [sum, count]``. Recording
only reads detached tensors and never changes what the forward pass
computes, so loss and gradients are those of ``label_smoothed_cross_entropy``
(tested bit for bit); models without the protocol (``transformer``,
``transformer_dc``) log exactly what ``label_smoothed_cross_entropy`` logs.

Grouped logits (``--length-buckets``). A model with ``grouped_logits``
(``transformer_selective_doc``) is asked, for the forward pass of this loss
and not past it, to leave its logits grouped by length with its targets
grouped alike through ``model.get_targets``, which is where fairseq's loss
reads them: the same sum over the same target tokens, without writing a
document batch's padded logits (tested against the ungrouped loss). Not
with ``--ignore-prefix-size`` (which cuts a prefix off each row of the
padded layout): there the logits are padded as usual.

Logging output: ``ctxstat/NAME/sum`` and ``ctxstat/NAME/count`` (0-d float64
tensors on the model's device, as fairseq's own ``loss`` entry: nothing is
read back to the host between the forward and the backward pass;
:meth:`reduce_metrics` reads the sums once per logging call, outside the
training step's hot path). Both are sums, so ``logging_outputs_can_be_summed``
stays True (fairseq may add the outputs of the data-parallel workers before
:meth:`reduce_metrics`; the keys depend only on the model's configuration, so
every worker sends the same).

Cost. Computing the statistics costs the context layer some work (e.g. the
selective word level's count of nonzero word weights per selected sentence,
a tensor of the size of the sentence weights). ``--context-stats-interval
N`` computes them on updates ``N, 2N, ...`` only (the document task tells
the criterion which update it trains): with ``N`` = ``--log-interval`` the
updates fairseq does not print pay nothing, and each printed value is that
of the printed update's batches (the epoch's, pooled over those updates).
The default, 1, computes them on every update; validation always does.

Metrics: :meth:`reduce_metrics` logs the sum and the count of each statistic
with ``metrics.log_scalar_sum`` as ``_ctxstat/NAME/sum`` and
``_ctxstat/NAME/count`` (hidden: fairseq does not print keys starting with
``_``) and ``NAME`` as a ``log_derived`` ``sum / count`` of the meters. The
logged value is therefore the exact mean over every token (or token-head
pair, ...) of the logging interval, the epoch or the validation set, pooled
over batches, gradient-accumulation steps and workers, not a mean of
per-batch means; ``nan`` when the count is 0 (e.g. no sentence of the
interval had context).
"""

from dataclasses import dataclass, field
from typing import Dict, List

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.logging import metrics

__all__ = [
    "LabelSmoothedCrossEntropyCtxCriterionConfig",
    "LabelSmoothedCrossEntropyCtxCriterion",
    "PREFIX",
]

#: logging-output keys of the statistics: ``ctxstat/NAME/sum``, ``ctxstat/NAME/count``
PREFIX = "ctxstat/"
#: place of the statistics in the progress bar: after loss, nll_loss, ppl, accuracy
PRIORITY = 30


def _sum_key(name: str) -> str:
    return f"{PREFIX}{name}/sum"


def _count_key(name: str) -> str:
    return f"{PREFIX}{name}/count"


def statistic_names(logging_outputs: List[Dict]) -> List[str]:
    """The statistics present in ``logging_outputs``, in order of appearance."""
    names: Dict[str, None] = {}
    for log in logging_outputs:
        for key in log:
            if key.startswith(PREFIX) and key.endswith("/sum"):
                names.setdefault(key[len(PREFIX):-len("/sum")], None)
    return list(names)


def _host_floats(values: List) -> List[float]:
    """``values`` (floats, or tensors on one device) as floats, read back to
    the host in one copy."""
    tensors = [v for v in values if torch.is_tensor(v)]
    if not tensors:
        return [float(v) for v in values]
    dev = tensors[0].device
    return torch.stack([v.detach().to(dev, torch.float64).reshape(()) if torch.is_tensor(v)
                        else torch.tensor(float(v), dtype=torch.float64, device=dev)
                        for v in values]).tolist()


def _pooled_mean(sum_meter: str, count_meter: str):
    def mean(meters) -> float:
        count = meters[count_meter].sum
        return meters[sum_meter].sum / count if count > 0 else float("nan")

    return mean


@dataclass
class LabelSmoothedCrossEntropyCtxCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    """The options of ``label_smoothed_cross_entropy``, unchanged, and how
    often the context statistics are computed in training."""

    context_stats_interval: int = field(
        default=1, metadata={"help": "compute the context models' statistics (ctxstat/*) in "
                             "training on every N-th update only (updates N, 2N, ...: with "
                             "N = --log-interval, the updates fairseq prints), so that the "
                             "others pay nothing for them; 1 (default): every update. "
                             "Validation always computes them"})


@register_criterion("label_smoothed_cross_entropy_ctx",
                    dataclass=LabelSmoothedCrossEntropyCtxCriterionConfig)
class LabelSmoothedCrossEntropyCtxCriterion(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed cross-entropy that also logs the context model's
    statistics (module docstring)."""

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0,
                 report_accuracy=False, context_stats_interval=1):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size,
                         report_accuracy)
        if int(context_stats_interval) < 1:
            raise ValueError(f"--context-stats-interval {context_stats_interval}: expected 1 "
                             "or more updates")
        self.context_stats_interval = int(context_stats_interval)
        #: the update being trained (set by the document task's ``train_step``); None:
        #: unknown, the statistics are computed
        self.update_num = None

    def statistics_due(self, model) -> bool:
        """Whether this forward computes the context statistics: always in
        validation and where the update is unknown, else on updates
        ``N, 2N, ...`` (``--context-stats-interval N``; fairseq numbers the
        update being trained ``update_num``, done: ``update_num + 1``)."""
        n = self.context_stats_interval
        return (not model.training or n <= 1 or self.update_num is None
                or (int(self.update_num) + 1) % n == 0)

    def compute_loss(self, model, net_output, sample, reduce=True):
        """fairseq's loss; with ``--concat-context --concat-context-loss-weight
        W`` (W != 1) the target context tokens of a concatenated target (the
        first ``target_prefix_len`` of each row) count W times in ``loss``
        (``nll_loss``, the reported perplexity, stays unweighted; the sample
        size stays the number of target tokens)."""
        cfg = getattr(self.task, "cfg", None)
        w = getattr(cfg, "concat_context_loss_weight", None)
        w = 1.0 if w is None else float(w)
        if w == 1.0 or "target_prefix_len" not in sample:
            return super().compute_loss(model, net_output, sample, reduce=reduce)
        if self.ignore_prefix_size > 0:
            raise ValueError("--concat-context-loss-weight with --ignore-prefix-size is not "
                             "supported")
        from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, target, self.eps,
                                                 ignore_index=self.padding_idx, reduce=False)
        tgt = sample["target"]
        cols = torch.arange(tgt.size(1), device=tgt.device).unsqueeze(0)
        plen = sample["target_prefix_len"].to(tgt.device).unsqueeze(1)
        weights = torch.where(cols < plen, torch.full_like(cols, 0, dtype=loss.dtype) + w,
                              torch.ones_like(cols, dtype=loss.dtype)).reshape(-1)
        loss = loss.reshape(-1) * weights
        nll_loss = nll_loss.reshape(-1)
        if reduce:
            loss, nll_loss = loss.sum(), nll_loss.sum()
        return loss, nll_loss

    def forward(self, model, sample, reduce=True):
        grouped = getattr(model, "grouped_logits", None)
        if grouped is None or self.ignore_prefix_size > 0:
            return self._forward(model, sample, reduce)
        # --length-buckets: the loss reads the logits grouped by length, with
        # the targets grouped alike (model.get_targets): no padded logits
        grouped(True)
        try:
            return self._forward(model, sample, reduce)
        finally:
            grouped(False)

    def _forward(self, model, sample, reduce=True):
        record = getattr(model, "record_context_statistics", None)
        if record is None or not self.statistics_due(model):
            return super().forward(model, sample, reduce=reduce)
        record(True)
        try:
            loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
            stats = model.context_statistics()
        finally:
            record(False)
        if stats:
            # kept on the device: reading them back here would stall a GPU between the
            # forward and the backward pass; reduce_metrics reads them, once per call
            with torch.no_grad():
                for name, value in stats.items():
                    total, count = value.detach().to(torch.float64).reshape(2).unbind(0)
                    logging_output[_sum_key(name)] = total
                    logging_output[_count_key(name)] = count
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        """fairseq's metrics, then for each statistic its summed sum and count
        (hidden meters) and its pooled mean ``sum / count``."""
        super().reduce_metrics(logging_outputs)
        names = statistic_names(logging_outputs)
        sums = [sum(log.get(key, 0.0) for log in logging_outputs)
                for name in names for key in (_sum_key(name), _count_key(name))]
        values = iter(_host_floats(sums))
        for name in names:
            s_key, c_key = _sum_key(name), _count_key(name)
            total, count = next(values), next(values)
            metrics.log_scalar_sum("_" + s_key, float(total), priority=PRIORITY)
            metrics.log_scalar_sum("_" + c_key, float(count), priority=PRIORITY)
            metrics.log_derived(name, _pooled_mean("_" + s_key, "_" + c_key),
                                priority=PRIORITY)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        """True: every added entry is a sum or a count."""
        return True
