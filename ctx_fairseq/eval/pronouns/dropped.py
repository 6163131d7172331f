"""The pronouns a +DP source restores, their person/number classes, and the
English pronouns of a translation (issue 38).

A pro-drop corpus such as TVsub zh-en (Wang et al. 2018, AAAI) gives, beside
the plain source, a +DP source: the same sentences with the dropped pronouns
written back (``不要 接`` -> ``不要 接它``). Everything here works on one line
pair at a time; the scores are in :mod:`ctx_fairseq.eval.pronouns.dp_eval`.

Classes
    ``1sg``, ``2`` (singular and plural: English *you* is both), ``3sg-m``,
    ``3sg-f``, ``3sg-n``, ``1pl``, ``3pl`` (:data:`CLASSES`).

Chinese pronouns (:data:`ZH_BASES`)
    我 俺: 1sg; 你 您 妳 你们 您们 你俩: 2; 他: 3sg-m; 她: 3sg-f; 它 牠: 3sg-n;
    我们 咱们 咱 俺们 我俩 咱俩: 1pl; 他们 她们 它们 他俩 她俩: 3pl. Each base
    also counts as its possessive (``+的``: 我的 is 1sg) and its reflexive
    (``+自己``, ``+自己的``: 他自己 is 3sg-m): possessives and reflexives go to
    their person. Bare 自己 has no person: it is no pronoun of any class (an
    inserted 自己 is reported with the non-pronoun insertions; an overt one
    is not counted). A string is read by longest match, inside one
    whitespace token, so 我们的 is one 1pl pronoun and 你们 is not 你 + 们.
    Words that hold a pronoun character but are no personal pronoun are
    matched as themselves and counted in no class (:data:`ZH_NOT_PRONOUNS`:
    其他 "other", 吉他 "guitar", 迷你 "mini", 他妈的 "damn", ...).

Finding the restored pronouns (:func:`align`)
    The two lines are aligned by characters, not tokens: the +DP file
    re-segments some words (``要`` -> ``我要``). Spaces are removed; the plain
    line's characters must occur, in order, in the +DP line (else the line
    is unusable: :func:`align` returns None and the caller skips it). The
    +DP characters left over are the insertions. Of the alignments possible
    (``你 你们`` against ``你们``: which 你 is new?), the one with the fewest
    inserted pieces is taken, a piece being a run of inserted characters
    inside one +DP token; among those, pieces that are whole +DP tokens are
    preferred to parts of tokens. Each piece is read with the Chinese
    pronouns above: a piece made entirely of pronouns of a class
    (``我``, ``他们的``, ``我的``) is one item per pronoun; any other piece
    (``的``, ``自己``, ``是``) is a non-pronoun insertion, reported and skipped.

English (:func:`english_words`, :func:`english_counts`)
    The corpus's English is lowercased, Moses-tokenized and XML-escaped
    (``i &apos;m``, ``it &apos;s``, ``don &apos;t``, ``woo @-@ hoo``);
    hypotheses may be truecased with raw apostrophes (``I'm``). Both are
    normalised the same way, so tokenization never matters:

    1. XML/HTML entities are unescaped (``&apos;`` -> ``'``, ``&quot;``), and
       the typographic apostrophes ``’ ‘`` and the backquote become ``'``;
    2. the text is lowercased;
    3. it is split at white space, hyphens (the corpus's ``@-@``), slashes and
       every punctuation mark but the apostrophe and the period;
    4. a word is a run of letters and digits, with an apostrophe kept in
       front (``'m``, ``'s``, ``'em``): ``i'm`` and ``i 'm`` are ``i``,
       ``'m``; ``it's`` is ``it``, ``'s`` (never ``its``);
    5. a period splits words (the corpus's unsplit joins, ``hurry.okay``),
       except between single letters: ``u.s.``, ``e.g.``, ``a.m.`` are one
       word each (abbreviations, no pronoun).

    English classes (:data:`EN_CLASSES`): 1sg i me my mine myself; 2 you
    your yours yourself yourselves and the training data's slang ya, u (only
    as a word of its own: ``u.s.`` is not one) and y'all (``y`` + ``'all``);
    3sg-m he him his himself; 3sg-f she her hers herself; 3sg-n it its
    itself; 1pl we us our ours ourselves, and the ``'s`` of ``let's``
    (``let &apos;s``: the corpus writes both ``let &apos;s`` and ``let us``,
    the same *us*, so both count as 1pl); 3pl they them their theirs
    themselves and the slang em, 'em (``&apos; em`` in the training data).
    Every occurrence counts, stutters included (``i @-@ i`` is two 1sg):
    references and hypotheses alike. Not handled: *US* (the country) in a
    truecased hypothesis reads as *us*; *mine* the noun as 1sg.
"""

import html
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["CLASSES", "NEUTER", "ZH_BASES", "ZH_NOT_PRONOUNS", "EN_CLASSES", "Insertion",
           "Alignment", "zh_lexicon", "zh_pronouns", "zh_counts", "align", "english_words",
           "english_counts", "english_pronouns"]

#: the person/number classes, in report order
CLASSES = ("1sg", "2", "3sg-m", "3sg-f", "3sg-n", "1pl", "3pl")
#: the class left out of "recall without neuter" (Chinese 它, English expletive *it*)
NEUTER = "3sg-n"

#: Chinese personal pronouns (bases) and their classes
ZH_BASES: Dict[str, str] = {
    "我": "1sg", "俺": "1sg",
    "你": "2", "您": "2", "妳": "2", "你们": "2", "您们": "2", "你俩": "2",
    "他": "3sg-m", "她": "3sg-f", "它": "3sg-n", "牠": "3sg-n",
    "我们": "1pl", "咱们": "1pl", "咱": "1pl", "俺们": "1pl", "我俩": "1pl", "咱俩": "1pl",
    "他们": "3pl", "她们": "3pl", "它们": "3pl", "他俩": "3pl", "她俩": "3pl",
}
#: suffixes that keep a pronoun's person: possessive, reflexive, reflexive possessive
ZH_SUFFIXES = ("", "的", "自己", "自己的")
#: words holding a pronoun character that are no personal pronoun (no class)
ZH_NOT_PRONOUNS = ("其他", "其它", "吉他", "他人", "自我", "迷你", "维他命", "安非他命",
                   "他妈的", "他杀")

#: English pronoun forms (normalised words, :func:`english_words`) and their classes
EN_CLASSES: Dict[str, str] = {}
for _cls, _forms in (("1sg", "i me my mine myself"),
                     ("2", "you your yours yourself yourselves ya u"),
                     ("3sg-m", "he him his himself"), ("3sg-f", "she her hers herself"),
                     ("3sg-n", "it its itself"), ("1pl", "we us our ours ourselves"),
                     ("3pl", "they them their theirs themselves em 'em")):
    EN_CLASSES.update({f: _cls for f in _forms.split()})
#: (previous word, clitic) pairs that are pronouns: let's, y'all
EN_CLITICS = {("let", "'s"): "1pl", ("y", "'all"): "2"}


def zh_lexicon() -> Dict[str, Optional[str]]:
    """Every Chinese form read (module docstring): pronoun forms -> class,
    the non-pronoun words -> None."""
    lex: Dict[str, Optional[str]] = {w: None for w in ZH_NOT_PRONOUNS}
    for base, cls in ZH_BASES.items():
        for suffix in ZH_SUFFIXES:
            lex[base + suffix] = cls
    return lex


_LEXICON = zh_lexicon()
_LONGEST = max(len(w) for w in _LEXICON)


def zh_pronouns(text: str) -> Tuple[List[Tuple[str, str]], bool]:
    """Read one string (no spaces) by longest match: ``(pronouns, covered)``
    with ``pronouns`` the ``(form, class)`` found in order and ``covered``
    whether every character belongs to a pronoun form."""
    found: List[Tuple[str, str]] = []
    covered, i = True, 0
    while i < len(text):
        for k in range(min(_LONGEST, len(text) - i), 0, -1):
            form = text[i:i + k]
            if form in _LEXICON:
                if _LEXICON[form] is None:
                    covered = False
                else:
                    found.append((form, _LEXICON[form]))
                i += k
                break
        else:
            covered = False
            i += 1
    return found, covered


def zh_counts(line: str) -> Dict[str, int]:
    """The overt pronouns of a segmented Chinese line, per class (each
    whitespace token read by :func:`zh_pronouns`)."""
    counts = dict.fromkeys(CLASSES, 0)
    for token in line.split():
        for _, cls in zh_pronouns(token)[0]:
            counts[cls] += 1
    return counts


@dataclass
class Insertion:
    """A piece of inserted characters: its text, the +DP token it is in
    (0-based) and that token's text."""
    text: str
    token_index: int
    token: str

    @property
    def whole_token(self) -> bool:
        return self.text == self.token


@dataclass
class Alignment:
    """The pronouns a +DP line restores: ``items`` the ``(form, class)`` of
    each restored pronoun, ``other`` the inserted pieces that are no pronoun."""
    items: List[Tuple[str, str]]
    other: List[Insertion]

    def dropped(self) -> Dict[str, int]:
        counts = dict.fromkeys(CLASSES, 0)
        for _, cls in self.items:
            counts[cls] += 1
        return counts


_PIECE, _PART = 10, 1  # the cost of an inserted piece, and of a piece that is part of a token


def _inserted_positions(plain: str, chars: str, tok: Sequence[int]) -> Optional[List[int]]:
    """The positions of ``chars`` left over by the cheapest alignment of
    ``plain`` into it (module docstring), or None when ``plain`` is not a
    subsequence. Costs: a new piece ``_PIECE``, plus ``_PART`` for each of
    its ends that is not a token boundary."""
    n, m = len(plain), len(chars)
    start = [j == 0 or tok[j] != tok[j - 1] for j in range(m)]
    end = [j == m - 1 or tok[j] != tok[j + 1] for j in range(m)]
    inf = float("inf")
    # cost[s][i][j]: plain[:i] aligned into chars[:j]; s = 1: chars[j-1] inserted
    cost = [[[inf] * (m + 1) for _ in range(n + 1)] for _ in range(2)]
    back: Dict[Tuple[int, int, int], Tuple[int, int, int]] = {}
    cost[0][0][0] = 0
    for j in range(m + 1):
        for i in range(n + 1):
            for s in (0, 1):
                here = cost[s][i][j]
                if here == inf or j == m:
                    continue
                moves = []
                if i < n and plain[i] == chars[j]:
                    moves.append(((0, i + 1, j + 1), here + (_PART if s and not end[j - 1] else 0)))
                same_piece = s == 1 and tok[j] == tok[j - 1]
                moves.append(((1, i, j + 1), here + (0 if same_piece else
                                                     _PIECE + (0 if start[j] else _PART))))
                for (s2, i2, j2), c in moves:
                    if c < cost[s2][i2][j2]:
                        cost[s2][i2][j2] = c
                        back[(s2, i2, j2)] = (s, i, j)
    best = min((0, 1), key=lambda s: cost[s][n][m])
    if cost[best][n][m] == inf:
        return None
    state, inserted = (best, n, m), []
    while state != (0, 0, 0):
        if state[0] == 1:
            inserted.append(state[2] - 1)
        state = back[state]
    return sorted(inserted)


def _is_subsequence(plain: str, chars: str) -> bool:
    it = iter(chars)
    return all(c in it for c in plain)


def align(plain_line: str, dp_line: str) -> Optional[Alignment]:
    """The restored pronouns of a line pair (module docstring); None when
    the plain line's characters are not all in the +DP line, in order."""
    plain = "".join(plain_line.split())
    tokens = dp_line.split()
    chars = "".join(tokens)
    if not _is_subsequence(plain, chars):
        return None
    tok = [k for k, t in enumerate(tokens) for _ in t]
    pieces: List[Insertion] = []
    last = -2
    for j in _inserted_positions(plain, chars, tok):
        if j == last + 1 and tok[j] == tok[last]:
            pieces[-1].text += chars[j]
        else:
            pieces.append(Insertion(chars[j], tok[j], tokens[tok[j]]))
        last = j
    items: List[Tuple[str, str]] = []
    other: List[Insertion] = []
    for piece in pieces:
        found, covered = zh_pronouns(piece.text)
        if covered and found:
            items += found
        else:
            other.append(piece)
    return Alignment(items, other)


# ---------------------------------------------------------------------------- English
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'"})
#: splits a text into chunks: everything but letters, digits, the apostrophe and the period
_CHUNK_SEP = re.compile(r"[^\w'.]+|_")
_WORD = re.compile(r"'?[^\W_]+(?:\.[^\W_]+)*")
_ABBREVIATION = re.compile(r"[^\W_](?:\.[^\W_])+")


def english_words(text: str) -> List[str]:
    """The normalised words of an English text (module docstring, steps 1-5)."""
    text = html.unescape(text).translate(_APOSTROPHES).lower()
    words: List[str] = []
    for chunk in _CHUNK_SEP.split(text):
        for word in _WORD.findall(chunk):
            bare = word.lstrip("'")
            if "." not in word or _ABBREVIATION.fullmatch(bare):
                words.append(word)
            else:
                parts = bare.split(".")
                words += [("'" if word.startswith("'") else "") + parts[0], *parts[1:]]
    return words


def english_pronouns(words: Sequence[str]) -> List[Tuple[int, str]]:
    """``(index, class)`` of each pronoun among normalised words: the forms
    of :data:`EN_CLASSES` and the clitics of :data:`EN_CLITICS`."""
    found = []
    for k, w in enumerate(words):
        cls = EN_CLASSES.get(w)
        if cls is None and k > 0:
            cls = EN_CLITICS.get((words[k - 1], w))
        if cls is not None:
            found.append((k, cls))
    return found


def english_counts(text: str) -> Dict[str, int]:
    """The English pronouns of a text, per class."""
    counts = dict.fromkeys(CLASSES, 0)
    for _, cls in english_pronouns(english_words(text)):
        counts[cls] += 1
    return counts
