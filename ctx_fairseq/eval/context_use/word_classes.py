"""Small word lists per target language for ``ctx-cxmi``'s means per word class.

Fernandes et al. (2023, *When Does Translation Require Context?*, ACL) find
the words with high P-CXMI (Fernandes et al. 2021) and group them by the
phenomena that need context; pronouns and deictic words are the two classes
that a closed list can catch without a tagger. These lists are that closed
part, nothing more:

``pronouns``
    personal, possessive and reflexive pronouns (all persons and numbers,
    the inflected forms).
``deictic``
    demonstratives and the deictic adverbs of place and time (this/that,
    here/there, now/then, today/tomorrow/yesterday).

Choices and limits, stated so that the numbers are read correctly:

* matching is on the whole word (BPE merged), lower-cased, with Russian
  ``ё`` written as ``е`` (both spellings occur in corpora);
* words that are just as often articles or conjunctions are left out rather
  than counted wrongly: French ``le, la, les, l'`` (articles and object
  pronouns), German ``der, die, das`` (articles and demonstrative /
  relative pronouns) and ``da`` (also "because"), Russian ``то`` and ``что``,
  English ``that`` is kept as deictic although it is also a complementizer
  (the class mean then mixes both uses);
* German ``sie`` / ``Sie`` (she, they, formal you) and ``ihr`` (her, you
  plural, their) are pronouns in every reading and counted once;
* Chinese words are matched as the corpus segments them: with a
  character-level or unsegmented target only the one-character pronouns
  (``我 你 您 他 她 它``) and demonstratives (``这 那``) can match;
* a word belongs to at most one class (the lists are disjoint; a test checks).

``--word-classes FILE`` (JSON ``{"class": ["word", ...]}``) replaces the
built-in lists for any language, e.g. a synthetic corpus's own pronouns.
"""

import json
from typing import Dict, List, Optional

__all__ = ["WORD_CLASSES", "LANGUAGES", "normalise", "classes_for", "load_word_classes"]


def _words(text: str) -> List[str]:
    return text.split()


WORD_CLASSES: Dict[str, Dict[str, List[str]]] = {
    "en": {
        "pronouns": _words(
            "i me my mine myself you your yours yourself yourselves he him his himself she her "
            "hers herself it its itself we us our ours ourselves they them their theirs "
            "themselves"),
        "deictic": _words(
            "this that these those here there now then today tomorrow yesterday"),
    },
    "de": {
        "pronouns": _words(
            "ich mich mir du dich dir er ihn ihm sie es wir uns ihr euch ihnen "
            "mein meine meinen meinem meiner meines dein deine deinen deinem deiner deines "
            "sein seine seinen seinem seiner seines ihre ihren ihrem ihrer ihres "
            "unser unsere unseren unserem unserer unseres euer eure euren eurem eurer eures "
            "sich selbst"),
        "deictic": _words(
            "dies diese dieser dieses diesem diesen jene jener jenes jenem jenen "
            "hier dort jetzt nun heute morgen gestern damals"),
    },
    "fr": {
        "pronouns": _words(
            "je j' me m' moi tu te t' toi il elle on nous vous ils elles lui leur leurs eux "
            "se s' soi y en mon ma mes ton ta tes son sa ses notre nos votre vos "
            "mien mienne miens miennes tien tienne siens sienne siennes nôtre nôtres vôtre "
            "vôtres"),
        "deictic": _words(
            "ce c' cet cette ces ceci cela ça celui celle ceux celles ici là maintenant "
            "aujourd'hui demain hier alors"),
    },
    "ru": {
        "pronouns": _words(
            "я меня мне мной мною ты тебя тебе тобой тобою он его ему им нем него нему ним "
            "она ее ей ею нее ней нею оно мы нас нам нами вы вас вам вами они их ими них ним "
            "ними себя себе собой собою мой моя мое мои моего моей моему моим моих моими "
            "твой твоя твое твои твоего твоей твоему твоим твоих твоими наш наша наше наши "
            "нашего нашей нашему нашим наших нашими ваш ваша ваше ваши вашего вашей вашему "
            "вашим ваших вашими свой своя свое свои своего своей своему своим своих своими"),
        "deictic": _words(
            "этот эта это эти этого этой этому этим этих этими тот та те того той тому тем "
            "тех теми здесь тут там сейчас теперь тогда сегодня завтра вчера"),
    },
    "zh": {
        "pronouns": _words(
            "我 你 您 他 她 它 我们 你们 您们 他们 她们 它们 咱们 自己 我的 你的 您的 他的 她的 它的 "
            "我们的 你们的 他们的 她们的 它们的"),
        "deictic": _words(
            "这 那 这个 那个 这些 那些 这里 那里 这儿 那儿 这样 那样 现在 今天 明天 昨天 当时"),
    },
}

LANGUAGES = tuple(WORD_CLASSES)


def normalise(word: str) -> str:
    """The form a word is matched in: lower-cased, ``ё`` as ``е``."""
    return word.lower().replace("ё", "е")


def classes_for(lang: Optional[str], table: Optional[Dict[str, List[str]]] = None
                ) -> Optional[Dict[str, str]]:
    """``{normalised word: class}`` for ``lang`` (or for ``table``, a
    ``{class: [words]}`` given by the user); None for a language without a
    list. A word in two classes is an error."""
    if table is None:
        if lang is None or lang not in WORD_CLASSES:
            return None
        table = WORD_CLASSES[lang]
    out: Dict[str, str] = {}
    for cls, words in table.items():
        for w in words:
            key = normalise(w)
            if key in out and out[key] != cls:
                raise ValueError(f"word classes: {w!r} is in both {out[key]!r} and {cls!r}")
            out[key] = cls
    return out


def load_word_classes(path: str) -> Dict[str, List[str]]:
    """``--word-classes FILE``: JSON ``{"class": ["word", ...], ...}``."""
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"--word-classes {path}: cannot read it as JSON ({err})") from None
    if not isinstance(table, dict) or not table or not all(
            isinstance(k, str) and isinstance(v, list) and v and all(isinstance(w, str) and w
                                                                     for w in v)
            for k, v in table.items()):
        raise ValueError(f"--word-classes {path}: expected a JSON object mapping each class "
                         "name to a non-empty list of words")
    return table
