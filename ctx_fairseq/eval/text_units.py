"""Raw text in, the model's units out: fairseq's ``--tokenizer`` and
``--bpe`` applied to sentences of a test suite or a probing file.

The evaluation commands (``ctx-score-contrastive``, ``ctx-probe``) read text
that was not preprocessed with the training data. They take fairseq's own
options, as ``fairseq-interactive`` does:

* ``--tokenizer moses`` (sacremoses; ``--moses-source-lang`` /
  ``--moses-target-lang`` name the language of each side, by default the
  task's ``--source-lang`` / ``--target-lang``; ``--moses-no-dash-splits``,
  ``--moses-no-escape`` as in fairseq; ``--moses-protect-entities`` keeps XML
  entities whole, as the recipes' ``moses_tok``, with ``--moses-no-escape``);
* ``--truecase-source-model FILE`` / ``--truecase-target-model FILE``: a
  sacremoses truecasing model (``sacremoses train-truecase``, as the recipes
  write it), applied after the tokenizer; fairseq has no truecasing option, so
  these are this project's;
* ``--bpe subword_nmt --bpe-codes FILE`` (``--bpe-separator``, default ``@@``).

Both default to what the checkpoint was trained with when its configuration
records them (``cfg.tokenizer`` / ``cfg.bpe``); otherwise text is used as it
is (whitespace units), which is right for data that is already in the
model's units, such as the toy corpus. The order is fairseq's: tokenizer,
(truecaser,) then BPE, then the dictionary (``encode_line``, ``</s>`` appended). A word the
dictionary does not know becomes ``<unk>``; :class:`TextEncoder` counts such
tokens so that a command can report them (a suite scored mostly as
``<unk>`` means the wrong units).
"""

import argparse
from argparse import Namespace
from typing import Optional

import torch

from ctx_fairseq.tasks.context_options import task_setting

__all__ = ["add_text_unit_args", "TextEncoder"]


def add_text_unit_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("raw text to model units (fairseq's options)")
    g.add_argument("--tokenizer", default=None, choices=["moses", "none"],
                   help="tokenize the text first (default: the checkpoint's, else none)")
    g.add_argument("--moses-source-lang", default=None,
                   help="language of the source text for --tokenizer moses "
                        "(default: the task's --source-lang)")
    g.add_argument("--moses-target-lang", default=None,
                   help="language of the target text (default: the task's --target-lang)")
    g.add_argument("--moses-no-dash-splits", action="store_true")
    g.add_argument("--moses-no-escape", action="store_true")
    g.add_argument("--moses-protect-entities", action="store_true",
                   help="keep XML entities in the text (&amp; ...) as single tokens, as the "
                        "recipes tokenize (moses_tok; needs --moses-no-escape)")
    g.add_argument("--truecase-source-model", default=None, metavar="FILE",
                   help="sacremoses truecasing model for the source text (after tokenizing)")
    g.add_argument("--truecase-target-model", default=None, metavar="FILE",
                   help="sacremoses truecasing model for the target text")
    g.add_argument("--bpe", default=None, choices=["subword_nmt", "none"],
                   help="apply BPE after tokenizing (default: the checkpoint's, else none)")
    g.add_argument("--bpe-codes", default=None, help="subword-nmt codes file (--bpe subword_nmt)")
    g.add_argument("--bpe-separator", default="@@")


class _RecipeMosesTokenizer:
    """The recipes' Moses tokenization (:func:`ctx_fairseq.prep.corpora.moses_tokenize`:
    no escaping, XML entities kept whole) with fairseq's tokenizer interface."""

    def __init__(self, lang: str, aggressive_dash_splits: bool):
        self.lang, self.dash = lang, aggressive_dash_splits

    def encode(self, text: str) -> str:
        from ctx_fairseq.prep.corpora import moses_tokenize

        return moses_tokenize(text, self.lang, aggressive_dash_splits=self.dash)


def _cfg_get(cfg, *keys):
    for k in keys:
        if cfg is None:
            return None
        cfg = cfg.get(k, None) if hasattr(cfg, "get") else getattr(cfg, k, None)
    return cfg


def _scheme_applied(option: str, name: Optional[str], supported: str, already: str) -> bool:
    """Whether the text is to go through the ``--OPTION NAME`` of the
    command line or the checkpoint (``--tokenizer``, ``--bpe``): not for
    none; for ``supported``, the one scheme read here; any other is an error
    that says to give ``--OPTION none`` where the text is ``already`` so."""
    if name in (None, "none"):
        return False
    if name != supported:
        raise ValueError(f"the checkpoint uses --{option} {name}; only {supported} is supported "
                         f"here: give --{option} none if the text is already {already}")
    return True


class TextEncoder:
    """Strings to token tensors for one side (``"source"`` or ``"target"``)
    of a model: tokenizer, BPE, dictionary."""

    def __init__(self, dictionary, tokenizer=None, bpe=None, side: str = "source",
                 truecaser=None):
        self.dictionary, self.tokenizer, self.bpe, self.side = dictionary, tokenizer, bpe, side
        self.truecaser = truecaser
        self.tokens = 0
        self.unknown = 0

    @classmethod
    def pair_from_args(cls, args, task, ckpt_cfg=None):
        """(source encoder, target encoder) from the options of
        :func:`add_text_unit_args`, falling back to the checkpoint's
        ``cfg.tokenizer`` / ``cfg.bpe``."""
        from fairseq.data import encoders

        tok_name = args.tokenizer or _cfg_get(ckpt_cfg, "tokenizer", "_name")
        bpe_name = args.bpe or _cfg_get(ckpt_cfg, "bpe", "_name")
        codes = args.bpe_codes or _cfg_get(ckpt_cfg, "bpe", "bpe_codes")
        if args.bpe_codes and bpe_name in (None, "none"):
            raise ValueError("--bpe-codes given without --bpe subword_nmt")
        bpe = None
        if _scheme_applied("bpe", bpe_name, "subword_nmt", "in BPE units"):
            if not codes:
                raise ValueError("--bpe subword_nmt needs --bpe-codes FILE")
            import os

            if not os.path.isfile(codes):
                raise ValueError(f"--bpe-codes {codes}: no such file")
            bpe = encoders.build_bpe(Namespace(bpe="subword_nmt", bpe_codes=codes,
                                               bpe_separator=args.bpe_separator))
        out = []
        for side, d, lang, default in (
                ("source", task.source_dictionary, args.moses_source_lang,
                 task_setting(task, "source_lang")),
                ("target", task.target_dictionary, args.moses_target_lang,
                 task_setting(task, "target_lang"))):
            tok = None
            if _scheme_applied("tokenizer", tok_name, "moses", "tokenized"):
                lang = lang or _cfg_get(ckpt_cfg, "tokenizer", f"{side}_lang") or default
                if not lang:
                    raise ValueError(f"--tokenizer moses: give --moses-{side}-lang")
                if getattr(args, "moses_protect_entities", False):
                    if not args.moses_no_escape:
                        raise ValueError("--moses-protect-entities is the recipes' tokenization, "
                                         "which never escapes: give --moses-no-escape too")
                    tok = _RecipeMosesTokenizer(lang, not args.moses_no_dash_splits)
                else:
                    tok = encoders.build_tokenizer(Namespace(
                        tokenizer="moses", source_lang=lang, target_lang=lang,
                        moses_no_dash_splits=args.moses_no_dash_splits,
                        moses_no_escape=args.moses_no_escape))
            tc = None
            model = getattr(args, f"truecase_{side}_model", None)
            if model:
                import os

                if not os.path.isfile(model):
                    raise ValueError(f"--truecase-{side}-model {model}: no such file")
                from sacremoses import MosesTruecaser

                tc = MosesTruecaser(load_from=model)
            out.append(cls(d, tok, bpe, side, truecaser=tc))
        return tuple(out)

    def units(self, text: str) -> str:
        """The text in the model's units (tokenized, BPE), space separated."""
        text = text.strip()
        if self.tokenizer is not None:
            text = self.tokenizer.encode(text)
        if self.truecaser is not None:
            text = self.truecaser.truecase(text, return_str=True)
        if self.bpe is not None:
            text = self.bpe.encode(text)
        return text

    def encode(self, text: str) -> torch.Tensor:
        ids = self.dictionary.encode_line(self.units(text), add_if_not_exist=False,
                                          append_eos=True).long()
        self.tokens += int(ids.numel()) - 1
        self.unknown += int(ids.eq(self.dictionary.unk()).sum())
        return ids

    def unknown_rate(self) -> Optional[float]:
        return self.unknown / self.tokens if self.tokens else None
