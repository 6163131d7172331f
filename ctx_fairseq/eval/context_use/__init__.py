"""Context use: CXMI and P-CXMI (Fernandes et al. 2021) and the word classes its breakdown uses."""
