"""``transformer_concat``: the concatenation baseline (Tiedemann and Scherrer
2017) as an architecture name for ``ctx-demo`` and ``ctx-bench``.

Concatenation is a way of feeding data, not a model: ``--task
document_translation --concat-context`` works with any sentence-level
architecture (:mod:`ctx_fairseq.data.concat_dataset`, docs/concatenation.md).
This module registers ``transformer_concat``, fairseq's ``transformer`` with
the hooks that make the demo and the benchmark run it with the paper's "2-to-2"
setting: one previous sentence on each side (``--source-context-size 1
--target-context-size 1``), its target context forced as the decoder's prefix
at generation and taken from the model's own previous translations
(``--own-target-context``, in document order). Its checkpoints are plain
transformer checkpoints.
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel, base_architecture

from ctx_fairseq.models._fairseq_utils import tiny_shape

CONCAT_TASK_ARGS = ["--task", "document_translation", "--concat-context",
                    "--source-context-size", "1", "--target-context-size", "1"]


@register_model("transformer_concat")
class TransformerConcatModel(TransformerModel):
    """fairseq's transformer, trained and translated on concatenated context
    (see the module docstring; its ctx-demo and ctx-bench options are in
    :mod:`ctx_fairseq.cli.arch_hooks`)."""


@register_model_architecture("transformer_concat", "transformer_concat")
def transformer_concat(args):
    base_architecture(args)


@register_model_architecture("transformer_concat", "transformer_concat_tiny")
def transformer_concat_tiny(args):
    tiny_shape(args)
    base_architecture(args)
