"""Architectures: one thin file per paper, built from ctx_fairseq.modules."""
