"""Optimizer mechanisms fairseq lacks: a learning-rate scale for the parameters
loaded from a sentence checkpoint (``--lr-scale-pretrained``,
:mod:`ctx_fairseq.optim.lr_scale`)."""
