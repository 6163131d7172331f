"""Dropped pronouns (pro-drop source languages, TVsub zh-en): finding the
pronouns a +DP source restores (:mod:`ctx_fairseq.eval.pronouns.dropped`),
scoring translations on them (``ctx-dp-eval``,
:mod:`ctx_fairseq.eval.pronouns.dp_eval`) and a contrastive suite built from
them (``ctx-dp-suite``, :mod:`ctx_fairseq.eval.pronouns.dp_suite`)."""
