"""Two versions of a model in ctx-demo, seed by seed: pronoun accuracy by
antecedent distance and an exact McNemar test on the same contrastive items
(issue 36: the selective model's accuracy before and after a change).

Each directory is a ``ctx-demo --workdir DIR --archs ARCH --seed S`` run;
the two runs of a seed must have the same suite (the toy corpus of a seed;
checked). Usage::

    python scripts/demo_paired_seeds.py --arch transformer_selective_doc \\
        --before b1 b2 b3 --after a1 a2 a3
"""

import argparse
import json
import math
import sys


def _load(workdir: str, arch: str):
    with open(f"{workdir}/results/{arch}.json", encoding="utf-8") as f:
        r = json.load(f)["contrastive"]
    with open(f"{workdir}/data/test.contrastive.jsonl", encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    if len(items) != len(r["examples"]):
        sys.exit(f"{workdir}: {len(r['examples'])} scored examples, {len(items)} in the suite")
    right = [ex["outcome"] == "correct" for ex in r["examples"]]
    return items, right, r["by_distance"]["pronoun"]


def mcnemar(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for ``b`` and ``c`` discordant items."""
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", required=True)
    p.add_argument("--before", nargs="+", required=True)
    p.add_argument("--after", nargs="+", required=True)
    a = p.parse_args(argv)
    if len(a.before) != len(a.after):
        p.error("--before and --after: one directory per seed each")
    print("| seed run | before d=1 / 2 / 3 | after d=1 / 2 / 3 | before | after | "
          "right only before | right only after | McNemar p |")
    print("|---|---|---|---|---|---|---|---|")
    tot = [0, 0]
    for k, (bd, ad) in enumerate(zip(a.before, a.after), 1):
        (ib, rb, db), (ia, ra, da) = _load(bd, a.arch), _load(ad, a.arch)
        if ib != ia:
            sys.exit(f"{bd} and {ad}: different suites (not the same seed?)")
        pr = [i for i, it in enumerate(ib) if it.get("phenomenon") == "pronoun"]
        only_b = sum(1 for i in pr if rb[i] and not ra[i])
        only_a = sum(1 for i in pr if ra[i] and not rb[i])
        tot[0] += only_b
        tot[1] += only_a

        def dist(d):
            return " / ".join(f"{100 * d[x]['accuracy']:.1f}" for x in sorted(d))

        print(f"| {k} | {dist(db)} | {dist(da)} | {100 * sum(rb[i] for i in pr) / len(pr):.1f} | "
              f"{100 * sum(ra[i] for i in pr) / len(pr):.1f} | {only_b} | {only_a} | "
              f"{mcnemar(only_b, only_a):.3f} |")
    print(f"| all (discordant items summed over runs) | | | | | {tot[0]} | {tot[1]} | "
          f"{mcnemar(*tot):.3f} |")


if __name__ == "__main__":
    main()
