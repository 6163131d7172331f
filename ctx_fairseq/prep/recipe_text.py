"""The recipes' text extraction (``python -m ctx_fairseq.prep.recipe_text COMMAND``).

Two commands, one per recipe library:

* ``extract`` (``sent_py extract`` / ``sent_extract`` in
  ``recipes/lib/steps_sentence.sh``): one split of a sentence-level recipe.
  Each ``--src KIND:PATH`` / ``--tgt KIND:PATH`` pair is a parallel part; the
  parts are concatenated, in the order given, into ``PREFIX.{L1,L2}`` (one
  sentence a line) and ``PREFIX.json`` (the sentences of each part, the
  pairs dropped). ``--drop-empty`` drops the pairs with an empty side,
  ``--max-lines N`` (``--smoke``) keeps the first N pairs. Kinds:

  - ``plain``: every line, stripped;
  - ``tags``: an IWSLT ``train.tags`` file (the transcript lines; the
    metadata lines, those starting with ``<``, are not text), read by
    :func:`ctx_fairseq.prep.text_docs.load_tags` with both sides together;
  - ``xml``: the ``<seg>`` elements of an IWSLT/mteval XML file
    (:func:`ctx_fairseq.prep.xml_docs.load_xml`: XML entities unescaped,
    documents and segment ids aligned between the two sides);
  - ``sgm``: the ``<seg>`` elements of a WMT ``.sgm`` file
    (:func:`ctx_fairseq.prep.docs.load_sgml`, read tolerantly, with only the
    five XML entities unescaped: ``&#39;`` or ``&nbsp;`` stay as they are);
  - ``aspec-ja`` / ``aspec-en``: ASPEC's ``' ||| '``-separated lines
    (Japanese is the second-last field, English the last).

  ``tags``, ``xml`` and ``sgm`` are read as a pair (both sides of a part
  must have that kind); empty segments are kept (``--drop-empty`` decides).

* ``xml-sets`` (``ctx_prep_xml_sets`` in ``recipes/lib/steps_context.sh``):
  several IWSLT-style XML pairs as one document split,
  ``PREFIX.{L1,L2,docids}``, in the order given (``--max-docs N > 0``: only
  their first N documents). Each pair is read and validated as by
  ``ctx-prep-docs xml``; a document id in two pairs, or fewer than N
  documents, is an error.

Lines are split at ``\\n`` only and a stray ``\\r`` becomes a space (a
``\\r`` would split a line in the tools that follow). Bad input ends in one
line, ``PROG: error: MESSAGE``, exit status 2; nothing is written then.
"""

import argparse
import json
import os
import sys
from typing import List, Optional, Sequence, Tuple

from ctx_fairseq.errors import InputError
from ctx_fairseq.prep.common import read_text_lines
from ctx_fairseq.data.docids import DocFileError as PrepDocsError
from ctx_fairseq.prep.docs import load_sgml, write_documents
from ctx_fairseq.prep.text_docs import load_tags
from ctx_fairseq.prep.xml_docs import load_xml

__all__ = ["PAIR_KINDS", "LINE_KINDS", "read_sentence_lines", "read_part", "read_pair",
           "extract", "write_lines", "xml_sets", "main"]

PROG = "python -m ctx_fairseq.prep.recipe_text"

#: kinds read with both sides together (documents and segment ids aligned)
PAIR_KINDS = ("tags", "xml", "sgm")
#: kinds read one side at a time
LINE_KINDS = ("plain", "aspec-ja", "aspec-en")


def read_sentence_lines(path: str) -> List[str]:
    """Lines split at \\n only (a stray \\r would split a line in the tools that
    follow, so it becomes a space); a trailing \\r and a byte-order mark are
    dropped, the file must be UTF-8."""
    return [line.replace("\r", " ") for line in read_text_lines(path)]


def _split_spec(spec: str) -> Tuple[str, str]:
    kind, sep, path = spec.partition(":")
    if not sep or kind not in PAIR_KINDS + LINE_KINDS:
        raise InputError(f"unknown part kind {kind!r} in {spec!r}; expected KIND:PATH with KIND "
                         f"one of {', '.join(PAIR_KINDS + LINE_KINDS)}")
    return kind, path


def read_part(spec: str) -> List[str]:
    """The sentences of one side, ``KIND:PATH`` with a kind of :data:`LINE_KINDS`."""
    kind, path = _split_spec(spec)
    if kind not in LINE_KINDS:
        raise InputError(f"{spec}: {kind} files are read as a pair (both sides of a part)")
    lines = read_sentence_lines(path)
    if kind == "plain":
        return [s.strip() for s in lines]
    out = []
    for no, line in enumerate(lines, 1):
        fields = line.split(" ||| ")
        if len(fields) < 4:
            raise PrepDocsError(path, no, "expected 'ID ||| NO ||| Japanese ||| English' "
                                "(dev/test) or 'SCORE ||| ID ||| NO ||| Japanese ||| English' "
                                f"(train), got {len(fields)} field(s)")
        out.append(fields[-2 if kind == "aspec-ja" else -1].strip())
    return out


def read_pair(src_spec: str, tgt_spec: str) -> Tuple[List[str], List[str]]:
    """The sentence pairs of one part: ``(source sentences, target sentences)``."""
    s_kind, s_path = _split_spec(src_spec)
    t_kind, t_path = _split_spec(tgt_spec)
    if s_kind in PAIR_KINDS or t_kind in PAIR_KINDS:
        if s_kind != t_kind:
            raise InputError(f"{src_spec} and {tgt_spec}: {s_kind} and {t_kind} in one part; "
                             f"{' and '.join(PAIR_KINDS)} parts need both sides of that kind")
        if s_kind == "tags":
            docs = load_tags(s_path, t_path, allow_empty=True, universal_newlines=False)[0]
        elif s_kind == "xml":
            docs = load_xml(s_path, t_path, allow_empty=True)[0]
        else:
            docs = load_sgml(s_path, t_path, allow_empty=True, entities="xml")[0]
        pairs = [p for _, doc in docs for p in doc]
        return [s for s, _ in pairs], [t for _, t in pairs]
    src, tgt = read_part(src_spec), read_part(tgt_spec)
    if len(src) != len(tgt):
        raise InputError(f"{src_spec} has {len(src)} sentences, {tgt_spec} has {len(tgt)}: "
                         "not parallel")
    return src, tgt


def write_lines(path: str, lines: Sequence[str]) -> None:
    """``lines`` to ``path``, one a line, via ``path.part`` (never half-written)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".part", "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(path + ".part", path)


def extract(out_prefix: str, l1: str, l2: str, src: Sequence[str], tgt: Sequence[str],
            drop_empty: bool = False, max_lines: int = 0) -> dict:
    """The ``extract`` command (see the module): writes ``PREFIX.{l1,l2}`` and
    ``PREFIX.json``; returns what ``PREFIX.json`` holds."""
    if len(src) != len(tgt):
        raise InputError("extract: give as many --src parts as --tgt parts")
    src_all: List[str] = []
    tgt_all: List[str] = []
    report = []
    for s_spec, t_spec in zip(src, tgt):
        s, t = read_pair(s_spec, t_spec)
        report.append({"src": s_spec, "tgt": t_spec, "sentences": len(s)})
        src_all += s
        tgt_all += t
    dropped = 0
    if drop_empty:
        keep = [i for i, (x, y) in enumerate(zip(src_all, tgt_all)) if x and y]
        dropped = len(src_all) - len(keep)
        src_all = [src_all[i] for i in keep]
        tgt_all = [tgt_all[i] for i in keep]
    if max_lines > 0:
        src_all, tgt_all = src_all[:max_lines], tgt_all[:max_lines]
    if not src_all:
        raise InputError(f"{out_prefix}: no sentences")
    write_lines(f"{out_prefix}.{l1}", src_all)
    write_lines(f"{out_prefix}.{l2}", tgt_all)
    info = {"split": os.path.basename(out_prefix), "sentences": len(src_all),
            "dropped_empty_pairs": dropped, "parts": report,
            "smoke_max_lines": max_lines if max_lines > 0 else None}
    with open(f"{out_prefix}.json", "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
    print(f"{out_prefix}.{{{l1},{l2}}}: {len(src_all)} sentence pairs"
          + (f" ({dropped} pairs with an empty side dropped)" if dropped else ""), file=sys.stderr)
    return info


def xml_sets(out_prefix: str, l1: str, l2: str, files: Sequence[str], max_docs: int = 0) -> Tuple[int, int]:
    """The ``xml-sets`` command (see the module): ``files`` alternate source
    and target XML. Returns (documents, sentences) written."""
    if not files or len(files) % 2:
        raise InputError("xml-sets: expected SRC_XML TGT_XML pairs")
    docs, where = [], {}
    for src, tgt in zip(files[::2], files[1::2]):
        part, _ = load_xml(src, tgt)
        for docid, pairs in part:
            if docid in where:
                raise PrepDocsError(src, None, f"document {docid} is also in {where[docid]}; "
                                    "expected each talk in one set")
            where[docid] = src
            docs.append((docid, pairs))
    if max_docs > 0:
        if len(docs) < max_docs:
            raise PrepDocsError(files[0], None, f"{len(docs)} documents; expected at least {max_docs}")
        docs = docs[:max_docs]
    write_documents(docs, out_prefix, l1, l2)
    return len(docs), sum(len(p) for _, p in docs)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract", help="one split of a sentence-level recipe: PREFIX.{L1,L2,json}")
    e.add_argument("--out-prefix", required=True)
    e.add_argument("--l1", required=True)
    e.add_argument("--l2", required=True)
    e.add_argument("--src", action="append", default=[], metavar="KIND:PATH")
    e.add_argument("--tgt", action="append", default=[], metavar="KIND:PATH")
    e.add_argument("--drop-empty", action="store_true", help="drop the pairs with an empty side")
    e.add_argument("--max-lines", type=int, default=0, help="keep the first N pairs (0: all)")
    x = sub.add_parser("xml-sets", help="IWSLT XML pairs as one document split: PREFIX.{L1,L2,docids}")
    x.add_argument("out_prefix", metavar="OUT_PREFIX")
    x.add_argument("l1", metavar="L1")
    x.add_argument("l2", metavar="L2")
    x.add_argument("max_docs", type=int, metavar="N", help="> 0: only the first N documents")
    x.add_argument("files", nargs="+", metavar="XML", help="SRC_XML TGT_XML [SRC_XML TGT_XML ...]")
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = get_parser().parse_args(argv)
    try:
        if args.cmd == "extract":
            extract(args.out_prefix, args.l1, args.l2, args.src, args.tgt, args.drop_empty,
                    args.max_lines)
        else:
            n_docs, n_sents = xml_sets(args.out_prefix, args.l1, args.l2, args.files,
                                       args.max_docs)
            print(f"ctx-prep-docs: {n_docs} documents, {n_sents} sentences "
                  f"-> {args.out_prefix}.{{{args.l1},{args.l2},docids}}")
    except InputError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
