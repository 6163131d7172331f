"""Read what ``fairseq-generate`` prints (S-/T-/H-/D- lines) and score it with sacreBLEU."""

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import sacrebleu
from sacrebleu.metrics import BLEU

from ctx_fairseq.errors import InputError


@dataclass
class GenerateOutput:
    ids: List[int]
    sources: List[str]
    references: Optional[List[str]]  # None: no T- lines (only with need_references=False)
    hypotheses: List[str]  # H- lines: tokenized (BPE removed if generated with --remove-bpe)
    detokenized: Optional[List[str]] = None  # D- lines (--tokenizer decoded); None if absent


class NoHypothesesError(InputError):
    """The file has no ``H-`` line (e.g. ``fairseq-generate --quiet`` or a failed run)."""


def read_generate_output(path: str, need_references: bool = True) -> GenerateOutput:
    """Parse a fairseq-generate log; sentences come back in id (corpus) order.

    With ``--nbest N`` the first (best) hypothesis of each sentence is kept
    (``H-`` and ``D-`` alike). Every id with an ``H-`` line must also have an
    ``S-`` and (unless ``need_references`` is False and the file has no
    ``T-`` line at all) a ``T-`` line; ``D-`` lines, when the file has any,
    must exist for every id. fairseq-generate prints the lines of one
    sentence together, so an id whose lines come back after another
    sentence's, or a second ``S-``/``T-`` line for an id, is a duplicate (two
    runs concatenated?) and an error. A file with no hypotheses at all is a
    :class:`NoHypothesesError` (the generate run probably failed).
    """
    src: Dict[int, str] = {}
    ref: Dict[int, str] = {}
    hyp: Dict[int, str] = {}
    detok: Dict[int, str] = {}
    first_line: Dict[int, int] = {}
    current: Optional[int] = None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            tag, _, rest = line.rstrip("\n").partition("\t")
            if len(tag) < 3 or tag[1] != "-" or tag[0] not in "STHD":
                continue
            try:
                idx = int(tag[2:])
            except ValueError:
                continue
            if idx != current:
                if idx in first_line:
                    raise ValueError(
                        f"{path}:{lineno}: sentence id {idx} appears again (its lines began at "
                        f"line {first_line[idx]} and other sentences came in between); "
                        f"expected each sentence once (several fairseq-generate outputs "
                        f"concatenated?)")
                first_line[idx] = lineno
                current = idx
            if tag[0] in "ST":
                seen = src if tag[0] == "S" else ref
                if idx in seen:
                    raise ValueError(f"{path}:{lineno}: a second {tag[0]}- line for sentence id "
                                     f"{idx}; expected each sentence once")
                seen[idx] = rest
            else:  # H-<id>\t<score>\t<text>, D- likewise
                parts = rest.split("\t", 1)
                if len(parts) != 2:
                    raise ValueError(f"{path}:{lineno}: expected '{tag[0]}-<id>\\t<score>\\t<text>'")
                # with --nbest > 1 the best comes first
                (hyp if tag[0] == "H" else detok).setdefault(idx, parts[1])
    if not hyp:
        raise NoHypothesesError(
            f"{path}: no hypotheses (H- lines) found; is it fairseq-generate output?")
    no_refs = not ref and not need_references
    missing = [i for i in hyp if i not in src or (i not in ref and not no_refs)]
    if missing:
        raise ValueError(f"{path}: sentence id {missing[0]} has a hypothesis but no S-/T- line")
    if detok:
        no_detok = sorted(i for i in hyp if i not in detok)
        if no_detok:
            raise ValueError(f"{path}: sentence id {no_detok[0]} has an H- line but no D- line "
                             f"({len(no_detok)} such); expected D- lines for all or none")
    ids = sorted(hyp)
    return GenerateOutput(ids, [src[i] for i in ids], None if no_refs else [ref[i] for i in ids],
                          [hyp[i] for i in ids], [detok[i] for i in ids] if detok else None)


def corpus_bleu(hypotheses: List[str], references: List[str], tokenize: Optional[str] = None) -> float:
    """sacreBLEU corpus BLEU (default 13a tokenisation)."""
    kwargs = {} if tokenize is None else {"tokenize": tokenize}
    return sacrebleu.corpus_bleu(hypotheses, [references], **kwargs).score


def bleu_metric(tokenize: Optional[str] = None) -> BLEU:
    """sacreBLEU's BLEU (default 13a tokenisation); ``get_signature()`` gives
    the signature of the scores it computes. An unknown ``tokenize`` is a
    ValueError naming sacreBLEU's tokenizers."""
    if tokenize is not None and tokenize not in BLEU.TOKENIZERS:
        raise ValueError(f"--tokenize {tokenize}: not a sacreBLEU tokenizer; expected one of "
                         f"{', '.join(BLEU.TOKENIZERS)}")
    return BLEU() if tokenize is None else BLEU(tokenize=tokenize)


# BPE units left in text: subword-nmt continuation markers ("@@" before a space
# or at the end) and SentencePiece word-boundary markers (U+2581).
BPE_SCHEMES = ("subword_nmt", "sentencepiece")
_BPE_MARKER = {"subword_nmt": re.compile(r"@@( |$)"), "sentencepiece": re.compile("\u2581")}


def lines_with_bpe(lines: Sequence[str]) -> Dict[str, List[int]]:
    """For each BPE scheme of :data:`BPE_SCHEMES`, the indices of ``lines``
    holding its markers (schemes with none are left out)."""
    found = {}
    for scheme in BPE_SCHEMES:
        idx = [i for i, line in enumerate(lines) if _BPE_MARKER[scheme].search(line)]
        if idx:
            found[scheme] = idx
    return found


def remove_bpe(lines: Sequence[str], scheme: str) -> List[str]:
    """fairseq's own ``--remove-bpe``/``--post-process`` step
    (:func:`fairseq.data.data_utils.post_process`) applied to each line that
    holds the scheme's markers; other lines are left alone (SentencePiece
    removal deletes every space: it would destroy a plain-text line)."""
    from fairseq.data.data_utils import post_process

    if scheme not in BPE_SCHEMES:
        raise ValueError(f"--remove-bpe {scheme}: expected one of {', '.join(BPE_SCHEMES)}")
    marker = _BPE_MARKER[scheme]
    return [post_process(line, scheme) if marker.search(line) else line for line in lines]
