"""Evaluation: BLEU, contrastive scoring and the papers' analyses."""
