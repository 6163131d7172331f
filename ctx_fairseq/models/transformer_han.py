"""``transformer_han``: the Hierarchical Attention Network of Miculicich, Ram,
Pappas & Henderson (EMNLP 2018), "Document-Level Neural Machine Translation
with Hierarchical Attention Networks".

A fairseq Transformer whose final encoder states (HAN encoder) and/or final
decoder states (HAN decoder) go through the HAN of
:mod:`ctx_fairseq.modules.han_attention` (word-level, then sentence-level
attention over the previous ``k`` sentences, FFN, context gate, Eq. 1-6).
This file only wires the module into fairseq; the equations are in the
module.

Inputs (``--task document_translation --source-context-size k
[--target-context-size k]``, ``k = --han-context-sentences``, 3 as in the
paper): ``src_ctx_tokens`` / ``tgt_ctx_tokens``, the previous sentences one
after the other, each ended by the separator; and, laid out by the task's
collater for this model (``context_layout``: ``sentences``), the same one
sentence per row, the ``k`` nearest: ``src_ctx_sentences`` /
``tgt_ctx_sentences`` (``B x k x L``) and ``*_ctx_present`` (``B x k``),
built on the CPU so that the forward pass reads nothing back to the host.
Without them (hand-made batches) the model splits the concatenated tokens
itself (:func:`~ctx_fairseq.modules.han_attention.split_context`, the same
rows, independent of padding; it reads sizes back to the host).

Static shapes: every context row is encoded (and decoded), empty slots as a
lone ``</s>`` whose states are zeroed and masked (no data-dependent row
selection). The previous sentences are encoded (decoded) in a pass of their
own, without gradients by default, through fairseq's modules with the
padding masks always given (:func:`~ctx_fairseq.models._fairseq_utils.encode_static`,
:func:`~ctx_fairseq.models._fairseq_utils.decode_static`: fairseq's passes
read back whether a batch has padding). A training step or a beam search
reads back to the host what fairseq's transformer reads, nothing more
(tested).

* HAN encoder: each previous source sentence is encoded on its own by the
  (shared) sentence-level encoder; its final states are the context of the
  current sentence's final encoder states.
* HAN decoder: each previous target sentence is decoded with teacher forcing
  by the (shared) decoder over its own source sentence's sentence-level
  encoder states (training: the references; generation: the task's
  ``--gold-target-context`` / ``--target-context-file``, or
  fairseq-interactive's own translations); the final decoder states (before
  the output projection) are the context of the current sentence's final
  decoder states. A target context sentence is used only with its source
  sentence (slots are matched by distance from the current sentence).
* ``transformer_han`` (joint, the paper's best): both.

Incremental decoding: the decoder context (previous targets decoded) is
computed at the first step of a batch for the batch's sentences only (not
per beam hypothesis); the word-level keys and values are projected then and
kept in the incremental state, reordered with the beam. ``encoder_out``
carries the context per sentence and a row map (``han_rows``) that
``reorder_encoder_out`` reorders, so beam search never copies the context
states at each step.

Two-stage training (as the paper): ``--init-from-sentence-checkpoint PATH``
(a sentence-level ``transformer``) copies every parameter whose name and
shape match (everything except the HAN modules ``encoder.han.*`` /
``decoder.han.*``); then the whole model is trained (the paper's second
stage, as Maruf et al. 2019, Sec. 2.2 describe it). ``--freeze-sentence-level``
trains the HAN parameters only. The paper's joint model starts from the HAN
encoder model: give a ``transformer_han_enc`` checkpoint to
``--init-from-sentence-checkpoint`` (names match, the decoder's HAN starts
fresh).

Choices where the paper is silent: see the module docstring and
docs/transformer_han.md.
"""

import logging
from collections import OrderedDict
from typing import Dict, List, NamedTuple, Optional

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.models.transformer.transformer_legacy import base_architecture
from torch import Tensor

from ctx_fairseq.data.contract import ContextContract, task_options
from ctx_fairseq.models._fairseq_utils import (
    add_sentence_init_option,
    decode_static,
    encode_and_decode,
    encode_static,
    load_sentence_checkpoint,
    plain_attention,
    set_default,
    tiny_shape,
    to_namespace,
    two_stage_defaults,
)
from ctx_fairseq.modules.context_statistics import mean_gate_sum, real_tokens
from ctx_fairseq.modules.han_attention import (
    HierarchicalContextAttention,
    decoder_inputs,
    split_context,
)

logger = logging.getLogger(__name__)

__all__ = ["TransformerHANModel", "HANEncoder", "HANDecoder", "HANContext"]

SIDES = ("both", "encoder", "decoder")
#: keys the encoder adds to ``encoder_out`` for the HAN decoder (per sentence, not reordered)
DECODER_CONTEXT_KEYS = ("han_ctx_src_out", "han_ctx_src_padding_mask", "han_ctx_tgt_tokens",
                        "han_ctx_present")


class HANContext(NamedTuple):
    """The context inputs of a batch that the HAN reads, as the
    ``document_translation`` task names them in ``net_input``:
    ``src_ctx_tokens`` / ``tgt_ctx_tokens`` (the previous sentences one after
    the other, ``B x Tc``; all padding: no context) and, laid out by the
    task's collater for this model, ``*_ctx_sentences`` (``B x k x L``) and
    ``*_ctx_present`` (``B x k``). Grouped so that the encoder's ``forward``
    keeps fairseq's own parameters and takes the context as the batch's
    keyword arguments (:meth:`of`)."""
    src_ctx_tokens: Optional[Tensor] = None
    src_ctx_sentences: Optional[Tensor] = None
    src_ctx_present: Optional[Tensor] = None
    tgt_ctx_tokens: Optional[Tensor] = None
    tgt_ctx_sentences: Optional[Tensor] = None
    tgt_ctx_present: Optional[Tensor] = None

    @classmethod
    def of(cls, inputs: Dict[str, Optional[Tensor]]) -> "HANContext":
        """The HAN's context among a batch's inputs (other keys, such as
        ``*_ctx_lengths``, are not read)."""
        return cls(**{k: inputs.get(k) for k in cls._fields})


def _build_han(cfg, side: str, args) -> HierarchicalContextAttention:
    part = cfg.encoder if side == "encoder" else cfg.decoder
    return HierarchicalContextAttention(
        part.embed_dim, int(args.han_heads or part.attention_heads),
        int(args.han_ffn_dim or part.ffn_embed_dim), int(args.han_context_sentences),
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout or 0.0,
        activation_fn=cfg.activation_fn or "relu",
        detach_inputs=not bool(args.han_context_grad))


def _token_statistics(info: Dict[str, Tensor], padding_mask: Optional[Tensor]) -> Tensor:
    """``[sum of the mean gate, tokens with context, tokens]`` (float64) over
    the non-padding query tokens; the gate over those whose sentence has
    context."""
    lam, has_ctx = info["gate"], info["has_context"]
    T, B = lam.shape[:2]
    real = real_tokens(T, B, lam.device, padding_mask)
    with_ctx = real_tokens(T, B, lam.device, padding_mask, has_ctx)
    gate_sum, n_ctx = mean_gate_sum(lam, with_ctx)
    return torch.stack([gate_sum, n_ctx, real.sum().to(torch.float64)])


class HANEncoder(TransformerEncoderBase):
    """fairseq's encoder; the previous source sentences are encoded by the
    same encoder, and (HAN encoder) the final states go through the HAN.
    For the HAN decoder it passes the context sentences on in ``encoder_out``
    (see the module docstring)."""

    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens)
        self.k = int(cfg.han_context_sentences)
        sep = getattr(cfg, "han_separator", None)
        self.separator = dictionary.eos() if sep is None else int(sep)
        self.context_grad = bool(cfg.han_context_grad)
        self.han = _build_han(cfg, "encoder", cfg) if cfg.han_side in ("both", "encoder") \
            else None
        self.decoder_context = cfg.han_side in ("both", "decoder")
        self.record_statistics = False
        self.last_statistics: Optional[Tensor] = None

    def split(self, ctx_tokens: Tensor, sentences: Optional[Tensor] = None,
              present: Optional[Tensor] = None):
        """``(sentences (B*k) x L, present B x k)`` of a context input: the
        ``B x k x L`` rows and ``B x k`` mask the task's collater built (layout
        ``sentences``, no host reads here), or, for callers that only have the
        concatenated ``B x Tc`` tokens (ctx-bench, hand-made batches),
        :func:`split_context` of them (which reads the batch's sizes back to the
        host: slow on a GPU)."""
        if sentences is None:
            if present is not None:
                raise ValueError("transformer_han: context sentences given without present")
            d = self.dictionary
            return split_context(ctx_tokens, d.pad(), (d.eos(), self.separator), d.eos(),
                                 self.k, non_words=(d.bos(),))
        B = ctx_tokens.size(0) if ctx_tokens is not None else sentences.size(0)
        if present is None or sentences.dim() != 3 or sentences.shape[:2] != (B, self.k) or \
                present.shape != (B, self.k):
            raise ValueError(
                f"transformer_han: expected the context as B x k x L sentences and a B x k "
                f"present mask (k = {self.k}, B = {B}), got "
                f"{tuple(sentences.shape)} and {None if present is None else tuple(present.shape)}")
        return sentences.reshape(B * self.k, sentences.size(2)), present.to(torch.bool)

    def word_mask(self, sentences: Tensor) -> Tensor:
        """True where a position of a context sentence is not a key word."""
        d = self.dictionary
        return sentences.eq(d.pad()) | sentences.eq(d.eos()) | sentences.eq(d.bos())

    def fill_empty(self, sentences: Tensor, present: Tensor) -> Tensor:
        """The context rows as they are encoded: an empty slot (a padding row)
        gets a lone ``</s>`` in its first position, so that every row has a
        key and its states are finite (they are zeroed and masked after);
        every row is encoded, so the shapes never depend on the data."""
        first = torch.arange(sentences.size(1), device=sentences.device).eq(0)
        empty = ~present.reshape(-1, 1) & first.unsqueeze(0)
        return sentences.masked_fill(empty, self.dictionary.eos())

    def encode_sentences(self, sentences: Tensor, present: Tensor, like: Tensor) -> Tensor:
        """The final encoder states (``L x (B*k) x C``, zeros where a slot is
        empty) of the context sentences (``(B*k) x L``, after
        :meth:`fill_empty`), each encoded alone by this encoder (without
        gradients unless ``--han-context-grad``)."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.context_grad):
            enc = encode_static(self, sentences)  # fairseq's pass, no has_pads read
            return enc.to(like.dtype) * present.reshape(1, -1, 1).to(like.dtype)

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None,
                **context):
        """As fairseq's encoder, plus the context inputs of the
        ``document_translation`` task (``context``, read as a
        :class:`HANContext`; ``src_ctx_tokens``: all padding means no context;
        None is an error; ``*_ctx_sentences`` / ``*_ctx_present``: the same
        context one sentence per row, as the task's collater lays it out for
        this model, see :meth:`split`). Returns fairseq's encoder-out dict,
        ``encoder_out`` after the HAN (HAN encoder), plus the context for the
        HAN decoder (``han_ctx_*``, ``han_rows``)."""
        ctx = HANContext.of(context)
        if ctx.src_ctx_tokens is None:
            raise ValueError(
                "transformer_han: the batch has no context inputs (src_ctx_tokens); run it with "
                "--task document_translation and the context options it was trained with "
                f"(--source-context-size {self.k}"
                + (f" --target-context-size {self.k}" if self.decoder_context else "") + ")")
        if self.decoder_context and ctx.tgt_ctx_tokens is None:
            raise ValueError(
                "transformer_han: the HAN decoder needs the previous target sentences "
                f"(tgt_ctx_tokens): --target-context-size {self.k}; at generation "
                "--gold-target-context or --target-context-file FILE (see docs/transformer_han.md)")
        out = self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens,
                                      token_embeddings)
        h = out["encoder_out"][0]
        sentences, present = self.split(ctx.src_ctx_tokens, ctx.src_ctx_sentences,
                                        ctx.src_ctx_present)
        filled = self.fill_empty(sentences, present)
        states = self.encode_sentences(filled, present, h)
        if self.han is not None:
            h_tilde, info = self.han(h, states, self.word_mask(sentences), present)
            out["encoder_out"] = [h_tilde]
            if self.record_statistics:
                self.last_statistics = _token_statistics(info, out["encoder_padding_mask"][0])
        if self.decoder_context:
            tgt, tgt_present = self.split(ctx.tgt_ctx_tokens, ctx.tgt_ctx_sentences,
                                          ctx.tgt_ctx_present)
            out["han_ctx_src_out"] = [states]
            out["han_ctx_src_padding_mask"] = [filled.eq(self.padding_idx)]
            out["han_ctx_tgt_tokens"] = [tgt]
            out["han_ctx_present"] = [present & tgt_present]
            out["han_rows"] = [torch.arange(src_tokens.size(0), device=src_tokens.device)]
        return out

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        out = super().reorder_encoder_out(encoder_out, new_order)
        for key in DECODER_CONTEXT_KEYS:
            if encoder_out.get(key):
                out[key] = encoder_out[key]  # per sentence: read through han_rows
        if encoder_out.get("han_rows"):
            out["han_rows"] = [encoder_out["han_rows"][0].index_select(0, new_order)]
        return out


class HANDecoder(TransformerDecoderBase):
    """fairseq's decoder; with the HAN decoder its final states (before the
    output projection) go through the HAN, whose context is the previous
    target sentences decoded by this decoder with teacher forcing."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.k = int(cfg.han_context_sentences)
        self.context_grad = bool(cfg.han_context_grad)
        self.han = None
        if cfg.han_side in ("both", "decoder"):
            if no_encoder_attn:
                raise ValueError("transformer_han: the HAN decoder decodes the previous target "
                                 "sentences over their sources; it needs the encoder attention")
            self.han = _build_han(cfg, "decoder", cfg)
        self.record_statistics = False
        self.last_statistics: Optional[Tensor] = None

    def context_states(self, encoder_out: Dict[str, List[Tensor]], rows: Tensor):
        """The final decoder states of the previous target sentences of the
        sentences ``rows`` (``L x (len(rows)*k) x C``) and their key mask
        (True: not a word). Each target sentence is decoded once per source
        sentence of the batch (not per beam hypothesis), over its own
        source's sentence-level encoder states, without gradients unless
        ``--han-context-grad``."""
        for key in DECODER_CONTEXT_KEYS:
            if not encoder_out.get(key):
                raise ValueError("transformer_han: the HAN decoder needs the previous sentences "
                                 f"from the encoder ({key} missing from encoder_out)")
        d = self.dictionary
        tgt = encoder_out["han_ctx_tgt_tokens"][0]
        present = encoder_out["han_ctx_present"][0].reshape(-1, 1)
        prev = decoder_inputs(tgt, d.pad(), d.eos())
        # every row is decoded (static shapes): an empty slot as a lone </s> over its
        # source row (itself at least a lone </s>, HANEncoder.fill_empty); zeroed below
        first = torch.arange(prev.size(1), device=prev.device).eq(0).unsqueeze(0)
        filled = prev.masked_fill(~present & first, d.eos())
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.context_grad):
            with plain_attention(self):  # fairseq's teacher-forced pass, no padding read
                src_out = encoder_out["han_ctx_src_out"][0]
                src_mask = encoder_out["han_ctx_src_padding_mask"][0]
                if self.cross_self_attention:  # (its mask is always given: no read either)
                    y, _ = self.extract_features_scriptable(
                        filled, {"encoder_out": [src_out], "encoder_padding_mask": [src_mask]})
                else:
                    y = decode_static(self, filled, src_out, src_mask)
            states = y * present.unsqueeze(2).to(y.dtype)
        mask = prev.eq(d.pad()) | prev.eq(d.eos()) | prev.eq(d.bos())
        k = self.k
        rows_k = (rows.unsqueeze(1) * k + torch.arange(k, device=rows.device)).reshape(-1)
        return states.index_select(0, rows_k).transpose(0, 1), mask.index_select(0, rows_k)

    def extract_features(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]],
                         incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                         full_context_alignment: bool = False,
                         alignment_layer: Optional[int] = None,
                         alignment_heads: Optional[int] = None):
        x, extra = self.extract_features_scriptable(
            prev_output_tokens, encoder_out, incremental_state, full_context_alignment,
            alignment_layer, alignment_heads)
        if self.han is None:
            return x, extra
        if encoder_out is None or not encoder_out.get("han_rows"):
            raise ValueError("transformer_han: the HAN decoder needs the previous sentences from "
                             "the HAN encoder (han_rows missing from encoder_out)")
        rows = encoder_out["han_rows"][0]
        present = encoder_out["han_ctx_present"][0].index_select(0, rows)
        if self.han.word_attn.has_cache(incremental_state):
            states = mask = None  # keys and values projected at the first step
        else:
            states, mask = self.context_states(encoder_out, rows)
        h, info = self.han(x.transpose(0, 1), states, mask, present,
                           incremental_state=incremental_state)
        if self.record_statistics and incremental_state is None:
            self.last_statistics = _token_statistics(
                info, prev_output_tokens.eq(self.padding_idx))
        return h.transpose(0, 1), extra


@register_model("transformer_han")
class TransformerHANModel(TransformerModel):
    """Hierarchical Attention Network (Miculicich et al., 2018); see the
    module docstring. Use with ``--task document_translation
    --source-context-size 3`` (HAN decoder: also ``--target-context-size 3``)."""

    context_contract = ContextContract(inputs=tuple(
        f"{side}_ctx_{part}" for side in ("src", "tgt")
        for part in ("tokens", "lengths", "sentences", "present")))

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--han-side", choices=SIDES,
                            help="where the HAN is: on the final encoder states (encoder), the "
                                 "final decoder states (decoder) or both (the paper's joint "
                                 "model; default of transformer_han)")
        parser.add_argument("--han-context-sentences", type=int, metavar="K",
                            help="previous sentences the HAN attends to (default 3, the "
                                 "paper's); the task's --source-context-size (and, with the "
                                 "HAN decoder, --target-context-size) must be K")
        parser.add_argument("--han-heads", type=int, metavar="N",
                            help="attention heads of the word and sentence levels (default: "
                                 "the model's attention heads)")
        parser.add_argument("--han-ffn-dim", type=int, metavar="N",
                            help="inner dimension of the HAN's FFN (default: the model's FFN "
                                 "dimension)")
        parser.add_argument("--han-context-grad", action="store_true",
                            help="let the gradient reach the sentence-level model through the "
                                 "HAN's queries and context states too (default: they are "
                                 "detached, as in the authors' code, and the context sentences "
                                 "are encoded/decoded without gradients)")
        add_sentence_init_option(
            parser, "the HAN modules",
            also=", or from a transformer_han_enc checkpoint for the joint model, as the paper "
                 "does (the decoder's HAN left at its initialisation)",
            freeze="the HAN parameters (the paper trains the whole model)")

    @classmethod
    def build_model(cls, args, task):
        args = to_namespace(args)
        han_base_architecture(args)
        k = int(args.han_context_sentences)
        if k < 1:
            raise ValueError(f"--han-context-sentences must be >= 1, got {k}")
        decoder_side = args.han_side in ("both", "decoder")
        options = task_options(task)
        if options is not None and options.document_task:
            want = [("source_context_size", k)]
            if decoder_side:
                want.append(("target_context_size", k))
            wrong = [f"--{n.replace('_', '-')} {getattr(options, n)}" for n, v in want
                     if getattr(options, n) != v]
            if wrong or options.context_direction != "prev" or options.whole_document:
                need = " ".join(f"--{n.replace('_', '-')} {v}" for n, v in want)
                raise ValueError(
                    f"transformer_han (--han-side {args.han_side}) attends to the {k} previous "
                    f"sentences: use --task document_translation {need} --context-direction "
                    f"prev (got {', '.join(wrong) or 'other context options'}; "
                    "--han-context-sentences changes k)")
            if options.context_separator:
                args.han_separator = options.context_separator_index
        if decoder_side and (getattr(args, "decoder_output_dim", None) or
                             args.decoder_embed_dim) != args.decoder_embed_dim:
            raise ValueError("transformer_han: the HAN decoder gates the decoder states; "
                             "--decoder-output-dim must equal --decoder-embed-dim")
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return HANEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return HANDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    @property
    def uses_target_context(self) -> bool:
        """Only the HAN decoder reads target context (the task warns otherwise)."""
        return self.decoder.han is not None

    @property
    def context_layout(self) -> Dict[str, str]:
        """What the task's ``--max-tokens`` counts (``CONTEXT_LAYOUTS`` of
        :mod:`ctx_fairseq.data.document_dataset`): the ``k`` previous source
        sentences are encoded each in its own row, padded to the batch's
        longest context sentence (:func:`split_context`: ``(B*k) x L``), and,
        with the HAN decoder, the previous target sentences are decoded so;
        without it the target context stays the task's ``B x Tc`` tensor."""
        return {"src": "sentences",
                "tgt": "sentences" if self.decoder.han is not None else "concatenated"}

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, **context):
        """fairseq's ``TransformerModel.forward``; of the batch's other inputs
        (``context``) the encoder is given the ones the model declares
        (:attr:`context_contract`: ``{src,tgt}_ctx_{tokens,lengths,sentences,
        present}``, None where the batch has none)."""
        return encode_and_decode(self, src_tokens, src_lengths, prev_output_tokens,
                                 return_all_hiddens, features_only, alignment_layer,
                                 alignment_heads,
                                 **{k: context.get(k) for k in self.context_contract.inputs})

    # --------------------------------------------------------------- two stages
    def han_parameters(self):
        for name, p in self.named_parameters():
            if name.startswith("encoder.han.") or name.startswith("decoder.han."):
                yield name, p

    def sentence_level_parameters(self):
        han = {n for n, _ in self.han_parameters()}
        for name, p in self.named_parameters():
            if name not in han:
                yield name, p

    def finish_setup(self, init_path: Optional[str], new_run: bool) -> None:
        """Called by the ``document_translation`` task once the model is
        built: stage-2 initialisation and ``--freeze-sentence-level``."""
        if init_path:
            self.load_sentence_checkpoint(init_path)
        if getattr(self.args, "freeze_sentence_level", False):
            for _, p in self.sentence_level_parameters():
                p.requires_grad_(False)

    def load_sentence_checkpoint(self, path: str) -> Dict[str, List[str]]:
        """See :func:`ctx_fairseq.models._fairseq_utils.load_sentence_checkpoint`."""
        return load_sentence_checkpoint(self, path)

    # ------------------------------------------------------ training statistics
    def _parts(self):
        return [(side, part) for side, part in (("enc", self.encoder), ("dec", self.decoder))
                if part.han is not None]

    def record_context_statistics(self, enabled: bool = True) -> None:
        """Turn the gate statistics of each HAN on or off (a full forward pass
        records them; incremental steps do not)."""
        for _, part in self._parts():
            part.record_statistics = bool(enabled)
            if not enabled:
                part.last_statistics = None

    def context_statistics(self) -> Dict[str, Tensor]:
        """``[sum, count]`` per HAN (``enc``, ``dec``): ``gate_SIDE`` (mean
        lambda of Eq. 5, the share of the sentence-level state in Eq. 6, over
        the non-padding query tokens of sentences with context),
        ``ctx_mass_SIDE`` (``1 - lambda``, same tokens), ``ctx_frac_SIDE``
        (share of non-padding query tokens whose sentence has context)."""
        stats = OrderedDict()
        for side, part in self._parts():
            st = part.last_statistics
            if st is None:
                st = part.han.gate.weight.new_zeros(3, dtype=torch.float64)
            gate_sum, n_ctx, n_tok = st.unbind(0)
            stats[f"gate_{side}"] = torch.stack([gate_sum, n_ctx])
            stats[f"ctx_mass_{side}"] = torch.stack([n_ctx - gate_sum, n_ctx])
            stats[f"ctx_frac_{side}"] = torch.stack([n_ctx, n_tok])
        return stats

# --------------------------------------------------------------------------- presets


_default = set_default


def han_base_architecture(args):
    _default(args, "han_side", "both")
    _default(args, "han_context_sentences", 3)
    _default(args, "han_heads", None)
    _default(args, "han_ffn_dim", None)
    _default(args, "han_context_grad", False)
    two_stage_defaults(args)
    base_architecture(args)


@register_model_architecture("transformer_han", "transformer_han")
def transformer_han(args):
    """HAN encoder + HAN decoder (the paper's joint model), k = 3, Transformer base."""
    han_base_architecture(args)


@register_model_architecture("transformer_han", "transformer_han_enc")
def transformer_han_enc(args):
    _default(args, "han_side", "encoder")
    han_base_architecture(args)


@register_model_architecture("transformer_han", "transformer_han_dec")
def transformer_han_dec(args):
    _default(args, "han_side", "decoder")
    han_base_architecture(args)


@register_model_architecture("transformer_han", "transformer_han_tiny")
def transformer_han_tiny(args):
    tiny_shape(args)
    han_base_architecture(args)
