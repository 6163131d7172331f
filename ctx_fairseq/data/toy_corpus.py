"""A synthetic discourse corpus in which context provably matters.

The toy language pair translates an English-like source into a German-like
target. Every sentence is whitespace-tokenised and lower-cased. Three
phenomena are built in:

(a) **Pronouns across sentences.** Entity nouns have one of three grammatical
    genders in the target (masculine, feminine, neuter). The source pronoun
    ``it`` is translated ``er`` / ``sie`` / ``es`` after the gender of its
    antecedent, an entity noun introduced 1..K sentences earlier (K is
    ``max_distance``). Only sentences without entity nouns stand in between,
    so the antecedent is always the most recent entity noun. The pronoun
    sentence itself is sampled independently of that gender: without the
    previous K sentences the pronoun cannot be predicted better than chance
    (1/3); with them it is determined.
(b) **Local reordering.** Adjective-noun phrases swap order (``the big dog`` ->
    ``der hund gross``) and determiners agree with the noun's gender, so local
    context inside the sentence matters.
(c) **Lexical cohesion.** An ambiguous source noun (``bank``) has two target
    senses with different words (``ufer`` / ``kasse``). A first mention
    carries a disambiguating cue (``near the river``); a later mention 1..K
    sentences on, without a cue, must repeat the sense chosen earlier (chance:
    1/2 without context).

Documents are sequences of *episodes*: a pronoun episode (introduction,
``d-1`` fillers, pronoun sentence), a cohesion episode (cued mention, ``d-1``
fillers, bare mention) or a single filler sentence, with ``d`` uniform in
1..K.

Files written to ``DIR`` (see :func:`make_toy_corpus`):

* ``{train,valid,test}.{src,tgt}``: one sentence per line, documents
  contiguous;
* ``{split}.docids``: the document id of each line;
* ``test.contrastive.jsonl``: one JSON object per context-dependent test
  sentence, with the fields

  ====================  =====================================================
  ``id``                0-based line number in ``test.src`` / ``test.tgt``
  ``doc_id``            document id (as in ``test.docids``)
  ``sent_index``        0-based position of the sentence in its document
  ``phenomenon``        ``"pronoun"`` or ``"lexical_cohesion"``
  ``distance``          antecedent distance in sentences (1..K)
  ``antecedent_id``     line number of the antecedent sentence
  ``src``               the source sentence
  ``ref``               the correct target sentence (equal to ``test.tgt``)
  ``contrastive``       list of incorrect targets, each differing from ``ref``
                        in the context-dependent word only
  ``word``              the correct context-dependent target word
  ``contrastive_words`` the incorrect words, aligned with ``contrastive``
  ``word_index``        token position of that word in ``ref``
  ====================  =====================================================

* ``toy.json``: the generation parameters and per-split counts.

Everything is deterministic for a seed. Bad arguments raise
:class:`ToyCorpusError` before anything is written; files are written to a
temporary directory inside ``DIR`` and moved into place only when all of them
are complete.
"""

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ctx_fairseq.data.json_lines import json_lines

GENDERS = ("m", "f", "n")
PRONOUN = {"m": "er", "f": "sie", "n": "es"}
DEFINITE = {"m": "der", "f": "die", "n": "das"}
INDEFINITE = {"m": "ein", "f": "eine", "n": "ein"}

# Entity nouns: source -> (target, gender); six of each gender.
ENTITY_NOUNS: Dict[str, Tuple[str, str]] = {
    "dog": ("hund", "m"), "bird": ("vogel", "m"), "tree": ("baum", "m"),
    "king": ("koenig", "m"), "table": ("tisch", "m"), "chair": ("stuhl", "m"),
    "cat": ("katze", "f"), "flower": ("blume", "f"), "door": ("tuer", "f"),
    "queen": ("koenigin", "f"), "lamp": ("lampe", "f"), "cloud": ("wolke", "f"),
    "horse": ("pferd", "n"), "house": ("haus", "n"), "book": ("buch", "n"),
    "child": ("kind", "n"), "boat": ("boot", "n"), "window": ("fenster", "n"),
}
ADJECTIVES = {
    "big": "gross", "small": "klein", "old": "alt", "new": "neu",
    "red": "rot", "green": "gruen", "quiet": "still", "strange": "seltsam",
}
# Verbs and adverbs of sentences with a pronoun subject.
PRONOUN_VERBS = {
    "sleeps": "schlaeft", "falls": "faellt", "moves": "bewegt",
    "shines": "leuchtet", "waits": "wartet", "turns": "dreht",
}
ADVERBS = {
    "today": "heute", "later": "spaeter", "again": "wieder",
    "slowly": "langsam", "often": "oft", "now": "jetzt",
}
# Filler sentences: no entity noun, no pronoun "it".
FILLER_SUBJECTS = {"we": "wir", "you": "ihr", "they": "sie_pl"}
FILLER_VERBS = {
    "walk": "gehen", "sing": "singen", "work": "arbeiten",
    "talk": "reden", "rest": "ruhen", "read": "lesen",
}
# Ambiguous nouns: source -> gender, (cue_a, target_a), (cue_b, target_b).
# Both senses share a gender so that a contrastive target differs from the
# reference in the ambiguous word only.
AMBIGUOUS_NOUNS: Dict[str, Tuple[str, Tuple[str, str], Tuple[str, str]]] = {
    "bank": ("n", ("river", "ufer"), ("money", "geldhaus")),
    "bat": ("f", ("cave", "fledermaus"), ("game", "keule")),
    "letter": ("m", ("mail", "brief"), ("alphabet", "buchstabe")),
    "seal": ("n", ("sea", "robbentier"), ("wax", "siegel")),
}
CUE_WORDS = {
    "river": "fluss", "money": "geld", "cave": "hoehle", "game": "spiel",
    "mail": "post", "alphabet": "alphabet", "sea": "meer", "wax": "wachs",
}

SPLITS = ("train", "valid", "test")


class ToyCorpusError(ValueError):
    """Bad arguments or an unusable output directory for the toy corpus."""


@dataclass
class Sentence:
    src: List[str]
    tgt: List[str]
    # Context-dependent word (filled for pronoun / cohesion sentences).
    phenomenon: Optional[str] = None
    distance: int = 0
    word_index: int = -1
    alternatives: List[str] = field(default_factory=list)


def _filler(rng: random.Random) -> Sentence:
    subj = rng.choice(sorted(FILLER_SUBJECTS))
    verb = rng.choice(sorted(FILLER_VERBS))
    adv = rng.choice(sorted(ADVERBS))
    return Sentence(
        [subj, verb, adv, "."], [FILLER_SUBJECTS[subj], FILLER_VERBS[verb], ADVERBS[adv], "."]
    )


def _introduction(rng: random.Random) -> Tuple[Sentence, str]:
    noun = rng.choice(sorted(ENTITY_NOUNS))
    tgt_noun, gender = ENTITY_NOUNS[noun]
    adj = rng.choice(sorted(ADJECTIVES))
    if rng.random() < 0.5:
        sent = Sentence(
            ["we", "saw", "the", adj, noun, "."],
            ["wir", "sahen", DEFINITE[gender], tgt_noun, ADJECTIVES[adj], "."],
        )
    else:
        sent = Sentence(
            ["there", "is", "a", adj, noun, "here", "."],
            ["hier", "ist", INDEFINITE[gender], tgt_noun, ADJECTIVES[adj], "."],
        )
    return sent, gender


def _pronoun_sentence(rng: random.Random, gender: str, distance: int) -> Sentence:
    # Everything but the pronoun is sampled independently of the gender.
    if rng.random() < 0.5:
        verb = rng.choice(sorted(PRONOUN_VERBS))
        adv = rng.choice(sorted(ADVERBS))
        src = ["it", verb, adv, "."]
        tgt = [PRONOUN[gender], PRONOUN_VERBS[verb], ADVERBS[adv], "."]
    else:
        adj = rng.choice(sorted(ADJECTIVES))
        src = ["it", "is", "very", adj, "."]
        tgt = [PRONOUN[gender], "ist", "sehr", ADJECTIVES[adj], "."]
    others = [PRONOUN[g] for g in GENDERS if g != gender]
    return Sentence(src, tgt, "pronoun", distance, 0, others)


def _cued_mention(rng: random.Random, noun: str, sense: int) -> Sentence:
    gender, *senses = AMBIGUOUS_NOUNS[noun]
    cue, tgt_word = senses[sense]
    return Sentence(
        ["we", "saw", "the", noun, "near", "the", cue, "."],
        ["wir", "sahen", DEFINITE[gender], tgt_word, "nahe", "dem", CUE_WORDS[cue], "."],
    )


def _bare_mention(rng: random.Random, noun: str, sense: int, distance: int) -> Sentence:
    gender, *senses = AMBIGUOUS_NOUNS[noun]
    tgt_word = senses[sense][1]
    other = senses[1 - sense][1]
    adj = rng.choice(sorted(ADJECTIVES))
    src = ["the", noun, "is", adj, "."]
    tgt = [DEFINITE[gender], tgt_word, "ist", ADJECTIVES[adj], "."]
    return Sentence(src, tgt, "lexical_cohesion", distance, 1, [other])


def make_document(rng: random.Random, num_sents: int, max_distance: int) -> List[Sentence]:
    """One document of ``num_sents`` sentences built from episodes."""
    doc: List[Sentence] = []
    while len(doc) < num_sents:
        room = num_sents - len(doc)
        kind = rng.random()
        distance = rng.randint(1, max_distance)
        if kind < 0.75 and distance + 1 <= room:
            if kind < 0.5:
                intro, gender = _introduction(rng)
                doc.append(intro)
                doc.extend(_filler(rng) for _ in range(distance - 1))
                doc.append(_pronoun_sentence(rng, gender, distance))
            else:
                noun = rng.choice(sorted(AMBIGUOUS_NOUNS))
                sense = rng.randint(0, 1)
                doc.append(_cued_mention(rng, noun, sense))
                doc.extend(_filler(rng) for _ in range(distance - 1))
                doc.append(_bare_mention(rng, noun, sense, distance))
        else:
            doc.append(_filler(rng))
    return doc


def _check_args(out_dir: str, docs: int, sents_per_doc: int, max_distance: int,
                valid_docs: int, test_docs: int) -> None:
    if not out_dir:
        raise ToyCorpusError("--out: an output directory is required")
    for name, value, minimum in (
        ("--docs", docs, 1), ("--valid-docs", valid_docs, 1), ("--test-docs", test_docs, 1),
        ("--max-distance", max_distance, 1),
    ):
        if not isinstance(value, int) or value < minimum:
            raise ToyCorpusError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if not isinstance(sents_per_doc, int) or sents_per_doc < max_distance + 1:
        raise ToyCorpusError(
            f"--sents-per-doc must be an integer >= --max-distance + 1 = {max_distance + 1} "
            f"(an antecedent K sentences back needs K+1 sentences), got {sents_per_doc!r}"
        )
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ToyCorpusError(f"--out {out_dir}: exists and is not a directory")


def _prepare_out_dir(out_dir: str) -> str:
    """Create ``out_dir`` if needed and return a fresh temporary directory in it."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        return tempfile.mkdtemp(prefix=".ctx-make-toy-", dir=out_dir)
    except OSError as err:
        raise ToyCorpusError(f"--out {out_dir}: cannot write there ({err.strerror or err})") from err


def generate_split(rng: random.Random, split: str, num_docs: int, sents_per_doc: int,
                   max_distance: int) -> List[Tuple[str, List[Sentence]]]:
    return [
        (f"{split}-{i:05d}", make_document(rng, sents_per_doc, max_distance))
        for i in range(num_docs)
    ]


def contrastive_records(documents: Sequence[Tuple[str, List[Sentence]]]) -> List[dict]:
    records, line = [], 0
    for doc_id, sents in documents:
        for idx, sent in enumerate(sents):
            if sent.phenomenon is not None:
                ref = " ".join(sent.tgt)
                contrastive = []
                for alt in sent.alternatives:
                    toks = list(sent.tgt)
                    toks[sent.word_index] = alt
                    contrastive.append(" ".join(toks))
                records.append({
                    "id": line, "doc_id": doc_id, "sent_index": idx,
                    "phenomenon": sent.phenomenon, "distance": sent.distance,
                    "antecedent_id": line - sent.distance,
                    "src": " ".join(sent.src), "ref": ref, "contrastive": contrastive,
                    "word": sent.tgt[sent.word_index],
                    "contrastive_words": list(sent.alternatives),
                    "word_index": sent.word_index,
                })
            line += 1
    return records


def make_toy_corpus(out_dir: str, docs: int = 2000, sents_per_doc: int = 10,
                    max_distance: int = 3, seed: int = 1, valid_docs: Optional[int] = None,
                    test_docs: Optional[int] = None) -> Dict[str, int]:
    """Write the toy corpus to ``out_dir``; returns the number of lines per split.

    ``docs`` is the number of training documents; ``valid_docs`` and
    ``test_docs`` default to ``max(1, docs // 10)``.
    """
    if valid_docs is None:
        valid_docs = max(1, docs // 10) if isinstance(docs, int) else docs
    if test_docs is None:
        test_docs = max(1, docs // 10) if isinstance(docs, int) else docs
    _check_args(out_dir, docs, sents_per_doc, max_distance, valid_docs, test_docs)
    tmp = _prepare_out_dir(out_dir)
    try:
        counts = {}
        split_docs = {"train": docs, "valid": valid_docs, "test": test_docs}
        for split_no, split in enumerate(SPLITS):
            rng = random.Random(f"{seed}-{split_no}-{split}")
            documents = generate_split(rng, split, split_docs[split], sents_per_doc, max_distance)
            with open(os.path.join(tmp, f"{split}.src"), "w", encoding="utf-8") as fs, \
                    open(os.path.join(tmp, f"{split}.tgt"), "w", encoding="utf-8") as ft, \
                    open(os.path.join(tmp, f"{split}.docids"), "w", encoding="utf-8") as fd:
                for doc_id, sents in documents:
                    for sent in sents:
                        fs.write(" ".join(sent.src) + "\n")
                        ft.write(" ".join(sent.tgt) + "\n")
                        fd.write(doc_id + "\n")
            counts[split] = sum(len(s) for _, s in documents)
            if split == "test":
                with open(os.path.join(tmp, "test.contrastive.jsonl"), "w", encoding="utf-8") as fj:
                    for rec in contrastive_records(documents):
                        fj.write(json.dumps(rec, ensure_ascii=False) + "\n")
        meta = {
            "generator": "ctx_fairseq.data.toy_corpus", "seed": seed, "docs": split_docs,
            "sents_per_doc": sents_per_doc, "max_distance": max_distance, "lines": counts,
            "src_lang": "src", "tgt_lang": "tgt",
        }
        with open(os.path.join(tmp, "toy.json"), "w", encoding="utf-8") as fm:
            json.dump(meta, fm, indent=2)
        for name in sorted(os.listdir(tmp)):
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
        return counts
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_contrastive(path: str) -> List[dict]:
    """Read a ``*.contrastive.jsonl`` file, checking each record's fields."""
    required = ("id", "phenomenon", "distance", "src", "ref", "contrastive")
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, rec in json_lines(path, f):
            missing = [k for k in required if k not in rec]
            if missing:
                raise ValueError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
            if not rec["contrastive"]:
                raise ValueError(f"{path}:{lineno}: 'contrastive' must list at least one target")
            records.append(rec)
    return records
