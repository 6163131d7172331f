"""ctx-make-pronoun-suite: a contrastive pronoun suite (English *it* ->
German *er* / *sie* / *es*) from a document-level test split, in the JSON
Lines format of the toy corpus (``ctx-score-contrastive --format toy``).

    ctx-make-pronoun-suite --src data/test.bpe.en --tgt data/test.bpe.de \\
        --docids data-bin/test.docids --bpe-codes data/codes --out test.pronouns.jsonl

The inputs are the split exactly as it was binarized (the files given to
``fairseq-preprocess``: tokenised, truecased, BPE'd), so that each record's
``src`` is line ``id`` of the binarized split, as ``--format toy`` checks.
``--bpe-codes`` names the subword-nmt codes of BPE'd files: the heuristic
reads the words (``@@ `` joined), and each contrastive sentence is segmented
again with the codes. Re-segmenting each selected reference must give its
line back exactly (else the codes are not those of the files: an error).
Files without BPE are read as they are (a file with ``@@`` markers and no
``--bpe-codes`` is an error).

**The heuristic** (no parser, no word alignment, no coreference), per line:

1. the source has exactly one token *it* (any case), and none of *he*,
   *she*, *they*, *him*, *her*, *them*, *himself*, *herself*, *themselves*
   (their German translations are *er*/*sie*/*ihn* too, so the target
   pronoun could belong to them);
2. the target has exactly one third-person pronoun among *er*, *sie*,
   *es*, *ihn*, *ihm* (lower case anywhere; *Er*, *Es*, *Ihn*, *Ihm*
   capitalised anywhere; *Sie* capitalised only as the first word, and only
   when the source has no *you*/*your*/*yours*/*yourself*/*yourselves*:
   capitalised *Sie* elsewhere is the polite *you* and is not counted; a
   first-word *Sie* with *you* in the source is ambiguous and the line is
   skipped), and that pronoun is *er*, *sie*, *es* or *ihn* (dative *ihm* is
   masculine or neuter: the line is skipped);
3. the contrastive candidates replace that one word by the other genders,
   keeping its capitalisation: *er* -> *sie*, *es*; *sie* -> *er*, *es*;
   *es* -> *er*, *sie*; *ihn* (masculine accusative) -> *sie*, *es*. Case
   is not analysed for *sie* and *es* (nominative and accusative look the
   same): the candidates use the nominative *er*, so where *sie*/*es* is an
   object, the *er* candidate is also the wrong case (an easier contrast).

The phenomenon (category) is ``it:PRONOUN`` (lower case), as ContraPro's
categories; ``distance`` and ``antecedent_id`` are null: without
coreference the antecedent is unknown. The suite therefore measures whether
a model picks the pronoun the reference translator used for a source *it*;
many of these pronouns do not depend on the context at all (*es* is often
expletive: *it is important* -> *es ist wichtig*), and the target pronoun is
not proven to translate the *it* (no alignment). It is a check built from
the data, not ContraPro (Mueller et al. 2018), which the selective attention
paper used (Table 4, by antecedent distance).

Records (one JSON object per line, see :mod:`ctx_fairseq.data.toy_corpus`):
``id`` (line of the split), ``doc_id``, ``sent_index`` (position in the
document), ``phenomenon``, ``distance`` (null), ``antecedent_id`` (null),
``src``, ``ref`` (the line itself), ``contrastive`` (the candidates),
``word``, ``contrastive_words`` and ``word_index`` (position in ``ref``'s
whitespace tokens of the pronoun's first unit). Lines that do not fit the
heuristic are skipped (counted by reason on stdout); no record at all is an
error, and nothing is written on an error.
"""

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

PROG = "ctx-make-pronoun-suite"

#: German third-person pronouns the heuristic looks at (lower case)
TARGET_PRONOUNS = ("er", "sie", "es", "ihn", "ihm")
#: the pronoun of the reference -> the contrastive pronouns (other genders, same case where known)
CANDIDATES: Dict[str, Tuple[str, ...]] = {
    "er": ("sie", "es"),
    "sie": ("er", "es"),
    "es": ("er", "sie"),
    "ihn": ("sie", "es"),
}
#: English pronouns whose German translation may also be er/sie/ihn
OTHER_SOURCE_PRONOUNS = frozenset(
    ["he", "she", "they", "him", "her", "them", "himself", "herself", "themselves"])
YOU = frozenset(["you", "your", "yours", "yourself", "yourselves"])

SKIP_REASONS = {
    "no_it": "no 'it' in the source",
    "several_it": "more than one 'it' in the source",
    "other_source_pronoun": "the source also has he/she/they/him/her/them/...",
    "no_target_pronoun": "no er/sie/es/ihn/ihm in the target",
    "several_target_pronouns": "more than one er/sie/es/ihn/ihm in the target",
    "ihm": "the target pronoun is dative 'ihm' (masculine or neuter)",
    "ambiguous_sie": "first-word 'Sie' and 'you' in the source (polite 'you'?)",
}


class SuiteBuildError(ValueError):
    """A problem with the inputs, or no record at all."""


# ----------------------------------------------------------------------------- units


class Units:
    """The split's units: words as they are, or subword-nmt BPE (``codes``)."""

    def __init__(self, codes: Optional[str] = None, separator: str = "@@"):
        self.separator = separator
        self.bpe = None
        if codes is not None:
            from subword_nmt.apply_bpe import BPE

            try:
                with open(codes, encoding="utf-8") as f:
                    self.bpe = BPE(f, separator=separator)
            except OSError as err:
                raise SuiteBuildError(f"--bpe-codes {codes}: cannot read: "
                                      f"{err.strerror or err}") from None

    def words(self, line: str) -> List[str]:
        """The word tokens of a line of the split."""
        if self.bpe is None:
            return line.split()
        return (" " + line + " ").replace(self.separator + " ", "").split()

    def segment(self, words: Sequence[str]) -> str:
        """Words to a line in the split's units."""
        text = " ".join(words)
        return text if self.bpe is None else self.bpe.process_line(text).strip()

    def first_unit_index(self, words: Sequence[str], k: int) -> int:
        """Index, among the whitespace tokens of ``segment(words)``, of the first
        unit of word ``k``."""
        return sum(len(self.segment([w]).split()) for w in words[:k])


# ------------------------------------------------------------------------- heuristic


def _first_word_index(tokens: Sequence[str]) -> Optional[int]:
    """Index of the first token holding a letter or digit (leading quotes and
    dashes skipped), None if there is none."""
    for i, tok in enumerate(tokens):
        if any(ch.isalnum() for ch in tok):
            return i
    return None


def find_pronoun(src_words: Sequence[str], tgt_words: Sequence[str]) -> Tuple[Optional[int], str]:
    """Apply the heuristic (module docstring) to one sentence pair of words.
    Returns (index of the German pronoun in ``tgt_words``, "") for a usable
    pair, else (None, reason) with a key of :data:`SKIP_REASONS`."""
    lower = [w.lower() for w in src_words]
    n_it = lower.count("it")
    if n_it == 0:
        return None, "no_it"
    if n_it > 1:
        return None, "several_it"
    if any(w in OTHER_SOURCE_PRONOUNS for w in lower):
        return None, "other_source_pronoun"
    you = any(w in YOU for w in lower)
    first = _first_word_index(tgt_words)
    found: List[int] = []
    for i, w in enumerate(tgt_words):
        low = w.lower()
        if low not in TARGET_PRONOUNS:
            continue
        if w == low or (w == low.capitalize() and low != "sie"):
            found.append(i)
        elif w == "Sie" and i == first:
            if you:
                return None, "ambiguous_sie"
            found.append(i)
        # any other casing ('Sie' inside the sentence: the polite 'you'; 'ES') is not counted
    if not found:
        return None, "no_target_pronoun"
    if len(found) > 1:
        return None, "several_target_pronouns"
    if tgt_words[found[0]].lower() == "ihm":
        return None, "ihm"
    return found[0], ""


def _recase(word: str, like: str) -> str:
    return word.capitalize() if like[:1].isupper() else word


def candidates_for(pronoun: str) -> List[str]:
    """The contrastive words for the reference's pronoun, in its capitalisation."""
    return [_recase(c, pronoun) for c in CANDIDATES[pronoun.lower()]]


# ----------------------------------------------------------------------------- files


def _read_lines(path: str, what: str) -> List[str]:
    try:
        with open(path, encoding="utf-8-sig", newline=None) as f:
            return [line[:-1] if line.endswith("\n") else line for line in f]
    except UnicodeDecodeError as err:
        raise SuiteBuildError(f"{what} {path}: not UTF-8 ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise SuiteBuildError(f"{what} {path}: cannot read: {err.strerror or err}") from None


def build_suite(src: str, tgt: str, docids: str, codes: Optional[str] = None,
                separator: str = "@@") -> Tuple[List[dict], Counter, int]:
    """The records for a split (module docstring). Returns (records, skipped
    lines by reason, lines read). Raises :class:`SuiteBuildError`."""
    from ctx_fairseq.data.docids import (
        DocFileError as PrepDocsError,
        read_docid_lines as read_docids,
    )

    src_lines = _read_lines(src, "--src")
    tgt_lines = _read_lines(tgt, "--tgt")
    try:
        ids = read_docids(docids)
    except PrepDocsError as err:
        raise SuiteBuildError(f"--docids {err}") from None
    if not src_lines:
        raise SuiteBuildError(f"--src {src}: empty file; expected one sentence per line")
    if not (len(src_lines) == len(tgt_lines) == len(ids)):
        raise SuiteBuildError(f"line counts differ: {src} has {len(src_lines)}, {tgt} "
                              f"{len(tgt_lines)}, {docids} {len(ids)}; expected one line per "
                              "sentence of the split in each")
    units = Units(codes, separator)
    if units.bpe is None:
        for path, lines in ((src, src_lines), (tgt, tgt_lines)):
            for lineno, line in enumerate(lines, 1):
                if separator + " " in line + " ":
                    raise SuiteBuildError(
                        f"{path}:{lineno}: BPE continuation marker '{separator}' in the text; "
                        "give the codes with --bpe-codes (the candidates must be segmented "
                        "as the split was)")
    records: List[dict] = []
    skipped: Counter = Counter()
    sent_index = 0
    for i, (s, t, doc) in enumerate(zip(src_lines, tgt_lines, ids)):
        sent_index = 0 if i == 0 or ids[i - 1] != doc else sent_index + 1
        s_words, t_words = units.words(s), units.words(t)
        k, reason = find_pronoun(s_words, t_words)
        if k is None:
            skipped[reason] += 1
            continue
        ref = " ".join(t.split())
        if units.bpe is not None and units.segment(t_words) != ref:
            raise SuiteBuildError(
                f"{tgt}:{i + 1}: segmenting the words of this line with --bpe-codes {codes} "
                f"gives {units.segment(t_words)!r}, not the line {ref!r}; expected the codes "
                "the split was segmented with")
        if units.bpe is not None and units.segment(s_words) != " ".join(s.split()):
            raise SuiteBuildError(
                f"{src}:{i + 1}: segmenting the words of this line with --bpe-codes {codes} "
                "does not give the line back; expected the codes the split was segmented with")
        word = t_words[k]
        cand_words = candidates_for(word)
        contrastive = [units.segment(t_words[:k] + [c] + t_words[k + 1:]) for c in cand_words]
        records.append({
            "id": i,
            "doc_id": doc,
            "sent_index": sent_index,
            "phenomenon": f"it:{word.lower()}",
            "distance": None,
            "antecedent_id": None,
            "src": " ".join(s.split()),
            "ref": ref,
            "contrastive": contrastive,
            "word": word,
            "contrastive_words": cand_words,
            "word_index": units.first_unit_index(t_words, k),
        })
    if not records:
        counts = ", ".join(f"{n} {SKIP_REASONS[r]}" for r, n in skipped.most_common())
        raise SuiteBuildError(f"no sentence of {src} / {tgt} fits the heuristic ({len(src_lines)} "
                              f"lines: {counts}); expected at least one 'it' translated with one "
                              "of er/sie/es/ihn")
    return records, skipped, len(src_lines)


def write_suite(records: Sequence[dict], out: str) -> None:
    """JSON Lines, written to a temporary file beside ``out`` and renamed."""
    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{os.path.basename(out)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for rec in records:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="A contrastive pronoun suite (English 'it' -> German er/sie/es) "
        "from a document-level split, in the toy JSON Lines format of ctx-score-contrastive "
        "--format toy. The heuristic and its limits: the module docstring "
        "(ctx_fairseq/eval/scoring/make_pronoun_suite.py).")
    p.add_argument("--src", required=True, metavar="FILE",
                   help="source side of the split as binarized (e.g. test.bpe.en)")
    p.add_argument("--tgt", required=True, metavar="FILE",
                   help="target side of the split as binarized (e.g. test.bpe.de)")
    p.add_argument("--docids", required=True, metavar="FILE",
                   help="the document id of each line (the split's .docids)")
    p.add_argument("--bpe-codes", default=None, metavar="CODES",
                   help="subword-nmt codes the files were segmented with (BPE'd files)")
    p.add_argument("--bpe-separator", default="@@", help="subword-nmt separator (default: @@)")
    p.add_argument("--out", required=True, metavar="FILE", help="the suite (JSON Lines)")
    return p


def cli_main(argv: Optional[Sequence[str]] = None) -> None:
    args = get_parser().parse_args(argv)
    try:
        records, skipped, n = build_suite(args.src, args.tgt, args.docids, codes=args.bpe_codes,
                                          separator=args.bpe_separator)
        write_suite(records, args.out)
    except (SuiteBuildError, OSError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        sys.exit(2)
    by = Counter(r["phenomenon"] for r in records)
    docs = len({r["doc_id"] for r in records})
    print(f"{PROG}: {len(records)} records from {n} lines ({docs} documents) -> {args.out}")
    print("  by pronoun: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())))
    print("  skipped: " + ", ".join(f"{v} {SKIP_REASONS[k]}" for k, v in skipped.most_common()))
    print("  antecedent distance: unknown (null; no coreference)")


if __name__ == "__main__":
    cli_main()
