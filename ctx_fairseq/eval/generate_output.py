"""Read what ``fairseq-generate`` prints (S-/T-/H- lines) and score it with sacreBLEU."""

from dataclasses import dataclass
from typing import Dict, List, Optional

import sacrebleu


@dataclass
class GenerateOutput:
    ids: List[int]
    sources: List[str]
    references: List[str]
    hypotheses: List[str]


def read_generate_output(path: str) -> GenerateOutput:
    """Parse a fairseq-generate log; sentences come back in id (corpus) order.

    With ``--nbest N`` the first (best) hypothesis of each sentence is kept.
    Every id with an ``H-`` line must also have ``S-`` and ``T-`` lines; a file
    with no hypotheses at all is an error (the generate run probably failed).
    """
    src: Dict[int, str] = {}
    ref: Dict[int, str] = {}
    hyp: Dict[int, str] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            tag, _, rest = line.rstrip("\n").partition("\t")
            if len(tag) < 3 or tag[1] != "-" or tag[0] not in "STH":
                continue
            try:
                idx = int(tag[2:])
            except ValueError:
                continue
            if tag[0] == "S":
                src[idx] = rest
            elif tag[0] == "T":
                ref[idx] = rest
            else:  # H-<id>\t<score>\t<text>
                parts = rest.split("\t", 1)
                if len(parts) != 2:
                    raise ValueError(f"{path}:{lineno}: expected 'H-<id>\\t<score>\\t<text>'")
                hyp.setdefault(idx, parts[1])  # with --nbest > 1 the best comes first
    if not hyp:
        raise ValueError(f"{path}: no hypotheses (H- lines) found; is it fairseq-generate output?")
    missing = [i for i in hyp if i not in ref or i not in src]
    if missing:
        raise ValueError(f"{path}: sentence id {missing[0]} has a hypothesis but no S-/T- line")
    ids = sorted(hyp)
    return GenerateOutput(ids, [src[i] for i in ids], [ref[i] for i in ids], [hyp[i] for i in ids])


def corpus_bleu(hypotheses: List[str], references: List[str], tokenize: Optional[str] = None) -> float:
    """sacreBLEU corpus BLEU (default 13a tokenisation)."""
    kwargs = {} if tokenize is None else {"tokenize": tokenize}
    return sacrebleu.corpus_bleu(hypotheses, [references], **kwargs).score
