"""The TVsub study's context-evaluation split: training episodes held out.

    python heldout.py --raw RAW --episodes FIRST:END --train-episodes FIRST:END
                      [--sentences N] --out DIR

Writes ``DIR/heldout.{zh,en,docids}``: the episodes ``FIRST..END-1`` of the
published training data (``data/orignal/train/separated/N.np.tk.qb.es.zh`` and
``N.qb.np.tk.lc.en``, the units the models train on), each episode one
document ``ep-N``, its first ``N`` sentences (``--sentences``; 0: all), so that
CXMI and BLEU have a split of many documents for a document bootstrap (dev
and test have two each). An error, with nothing written, when the held-out
episodes overlap the training episodes, an episode is missing or its two
files differ in line count.
"""

import argparse
import json
import os
import sys


def _range(text: str, name: str):
    try:
        a, b = text.split(":")
        a, b = int(a), int(b)
    except ValueError:
        raise ValueError(f"{name} {text!r}: expected FIRST:END (two integers)") from None
    if not 0 <= a < b:
        raise ValueError(f"{name} {text!r}: expected 0 <= FIRST < END")
    return a, b


def _lines(path: str):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def build(raw: str, episodes: str, train_episodes: str, sentences: int):
    a, b = _range(episodes, "--episodes")
    ta, tb = _range(train_episodes, "--train-episodes") if not train_episodes.endswith(":") \
        else (int(train_episodes[:-1]), None)
    if tb is None or (a < tb and ta < b):
        raise ValueError(f"held-out episodes {episodes} overlap the training episodes "
                         f"{train_episodes}: a context-evaluation split must not be trained on")
    if b - a < 2:
        raise ValueError("hold out at least two episodes (documents)")
    if sentences < 0:
        raise ValueError("--sentences must be >= 0")
    base = os.path.join(raw, "data", "orignal", "train", "separated")
    zh, en, ids = [], [], []
    for ep in range(a, b):
        fz = os.path.join(base, f"{ep}.np.tk.qb.es.zh")
        fe = os.path.join(base, f"{ep}.qb.np.tk.lc.en")
        for f in (fz, fe):
            if not os.path.exists(f):
                raise ValueError(f"episode {ep}: {f}: no such file")
        lz, le = _lines(fz), _lines(fe)
        if len(lz) != len(le):
            raise ValueError(f"episode {ep}: its files differ in line count: {fz} has {len(lz)}, "
                             f"{fe} has {len(le)}")
        if sentences:
            lz, le = lz[:sentences], le[:sentences]
        zh += lz
        en += le
        ids += [f"ep-{ep}"] * len(lz)
    return zh, en, ids


def main(argv=None):
    p = argparse.ArgumentParser(prog="heldout.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--raw", required=True)
    p.add_argument("--episodes", required=True, help="held-out episodes FIRST:END")
    p.add_argument("--train-episodes", required=True, help="the training episodes FIRST:END")
    p.add_argument("--sentences", type=int, default=0, help="first N sentences per episode")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        zh, en, ids = build(args.raw, args.episodes, args.train_episodes, args.sentences)
        os.makedirs(args.out, exist_ok=True)
        for ext, lines in (("zh", zh), ("en", en), ("docids", ids)):
            with open(os.path.join(args.out, f"heldout.{ext}.part"), "w", encoding="utf-8") as f:
                f.write("".join(x + "\n" for x in lines))
        for ext in ("zh", "en", "docids"):
            os.replace(os.path.join(args.out, f"heldout.{ext}.part"),
                       os.path.join(args.out, f"heldout.{ext}"))
    except (OSError, ValueError) as err:
        p.error(str(err))
    summary = {"episodes": args.episodes, "documents": len(dict.fromkeys(ids)),
               "sentences": len(zh), "sentences_per_episode": args.sentences or "all",
               "train_episodes": args.train_episodes}
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
