"""General scoring: BLEU (sentence and document level, by length), contrastive and generative accuracy, the contrastive suites, paired significance, the recipes' reports."""
