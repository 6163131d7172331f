"""The decoder of ``transformer_selective_doc``: fairseq's decoder with the
document context layer (decoder integration), incremental decoding, and the
memory's decoder states (shared or from the frozen copy)."""

from typing import Dict, List, Optional, Tuple

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules import MultiheadAttention
from torch import Tensor

from ctx_fairseq.models._fairseq_utils import (
    decode_static,
    layer_being_built,
    plain_attention,
    wrap_layer,
)
from ctx_fairseq.models.transformer_selective_doc.common import (
    BUCKET_KEYS,
    EvalMode,
    cut_slice,
    detached,
    frozen_source,
    host_rows,
    init_context_part,
    length_groups,
    query_layout,
    real_positions,
    real_words,
    row_chunks,
    sentence_level_weights,
    ungroup,
)
from ctx_fairseq.modules.real_token_ffn import RealTokenDecoderLayer
from ctx_fairseq.modules.sentence_cache import (
    assemble_rows,
    row_keys,
    to_device,
    weights_signature,
)


class RecordingAttention(MultiheadAttention):
    """fairseq's encoder-decoder attention that keeps its last output (the
    source-attention context vectors, ``T x B x C``) for the context layer."""

    last_output: Optional[Tensor] = None

    def forward(self, *args, **kwargs):
        out, weights = super().forward(*args, **kwargs)
        self.last_output = out
        return out, weights


class RecordingDecoderLayer(RealTokenDecoderLayer):
    def build_encoder_attention(self, embed_dim, cfg):
        return RecordingAttention(
            embed_dim, cfg.decoder.attention_heads, kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout,
            encoder_decoder_attention=True, q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config)


class SelectiveDocDecoder(TransformerDecoderBase):
    """fairseq's decoder; with decoder integration its features go through
    the Document-level Context Layer before the output projection. Queries:
    the last layer's source-attention output; memory: the document's target
    sentences decoded with teacher forcing (keys: the last layer's
    source-attention outputs; values: the decoder output states), computed
    once per batch (at the first step of incremental decoding, then kept in
    the incremental state)."""

    def __init__(self, cfg, dictionary, embed_tokens, args, no_encoder_attn=False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        if args.context_integration == "decoder" and no_encoder_attn:
            raise ValueError("decoder integration needs the encoder-decoder attention")
        init_context_part(self, args, "decoder", cfg.decoder)
        self.memory_decoder: Optional[TransformerDecoderBase] = None  # frozen copy
        #: length groups: the output layer's logits left grouped (the model's
        #: ``grouped_logits``, for a loss that reads them through ``get_targets``)
        self.grouped_logits = False

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        last = layer_being_built(self) + 1 == cfg.decoder.layers
        if getattr(cfg, "context_integration", None) != "decoder" or not last:
            # only the last layer's source attention is read (decoder integration)
            return wrap_layer(RealTokenDecoderLayer(cfg, no_encoder_attn), cfg)
        layer = RecordingDecoderLayer(cfg, no_encoder_attn)
        if cfg.checkpoint_activations:
            # the context layer reads the last layer's source attention as a side
            # output; under activation checkpointing it would be computed without
            # gradients (the layer's forward runs under no_grad and is recomputed in
            # the backward), so the last layer is not checkpointed
            return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap)
        return wrap_layer(layer, cfg)

    @staticmethod
    def _last_attention(decoder) -> RecordingAttention:
        layer = decoder.layers[-1]
        layer = getattr(layer, "_checkpoint_wrapped_module", layer)
        return layer.encoder_attn

    @classmethod
    def _features_and_source_attention(cls, decoder, prev_output_tokens, encoder_out,
                                       *args) -> Tuple[Tensor, Dict, Tensor]:
        """``decoder``'s ``extract_features_scriptable`` and the last layer's
        source-attention output of that very call (``T x B x C``; taken and
        cleared, so that no stale output, nor its graph, is kept)."""
        attn = cls._last_attention(decoder)
        attn.last_output = None
        x, extra = TransformerDecoderBase.extract_features_scriptable(
            decoder, prev_output_tokens, encoder_out, *args)
        out, attn.last_output = attn.last_output, None
        if out is None or out.size(0) != x.size(1) or out.size(1) != x.size(0):
            raise RuntimeError("decoder integration: the last decoder layer's source attention "
                               "did not run for this input")
        return x, extra, out

    @classmethod
    def _memory_features(cls, decoder, prev_output_tokens: Tensor,
                         mem_enc: Dict[str, List[Tensor]]) -> Tuple[Tensor, Tensor]:
        """The teacher-forced pass over the memory's targets: the features
        (``B x T x C``) and the last layer's source-attention output (``T x B
        x C``), as :meth:`_features_and_source_attention` computes them but
        through :func:`~ctx_fairseq.models._fairseq_utils.decode_static`
        (the self-attention padding mask always given: fairseq's pass reads
        ``prev_output_tokens.eq(pad).any()`` back to decide whether to give
        it); fairseq's pass with ``--cross-self-attention``, which
        ``decode_static`` does not take (as transformer_han does)."""
        if decoder.cross_self_attention:
            x, _, out = cls._features_and_source_attention(decoder, prev_output_tokens, mem_enc)
            return x, out
        attn = cls._last_attention(decoder)
        attn.last_output = None
        pad = mem_enc.get("encoder_padding_mask") or [None]
        x = decode_static(decoder, prev_output_tokens, mem_enc["encoder_out"][0], pad[0])
        out, attn.last_output = attn.last_output, None
        if out is None or out.size(0) != x.size(1) or out.size(1) != x.size(0):
            raise RuntimeError("decoder integration: the last decoder layer's source attention "
                               "did not run for this input")
        return x, out

    def memory_states(self, encoder_out: Dict[str, List[Tensor]]) -> Tuple[Tensor, Tensor, Tensor]:
        """Keys (last-layer source-attention outputs), values (decoder output
        states), both ``S x L x C``, and the real-word mask ``S x L`` of the
        memory's target sentences, decoded with teacher forcing."""
        if "mem_tgt_prev_tokens" not in encoder_out:
            raise ValueError("decoder integration needs the target side of the document memory: "
                             "--target-context-size 1 with --document-memory (training: the "
                             "references; generation: --target-context-file FILE or "
                             "--gold-target-context)")
        prev = encoder_out["mem_tgt_prev_tokens"][0]
        if prev.size(0) == 0:  # no memory sentence (online: only first sentences)
            like = encoder_out["mem_encoder_out"][0]
            empty = like.new_zeros(0, prev.size(1), self.embed_dim)
            return empty, empty, real_words(prev, self.dictionary)
        mem_enc = {"encoder_out": encoder_out["mem_encoder_out"],
                   "encoder_padding_mask": encoder_out["mem_encoder_padding_mask"]}
        # one row per memory sentence, not beam copies: no "beamable" source attention
        if self.args.context_memory == "frozen":
            with plain_attention(self, frozen_source(self, "memory_decoder")):
                keys, values = self.frozen_memory_states(encoder_out, prev, mem_enc)
            return keys, values, real_words(prev, self.dictionary)
        with plain_attention(self):
            x, keys = self._memory_features(self, prev, mem_enc)
        return keys.transpose(0, 1), x, real_words(prev, self.dictionary)

    def frozen_memory_states(self, encoder_out: Dict[str, List[Tensor]], prev: Tensor,
                             mem_enc: Dict[str, List[Tensor]]) -> Tuple[Tensor, Tensor]:
        """``--context-memory frozen``: keys and values (``S x L x C``) of the
        memory's targets under the frozen sentence-level decoder (eval mode, no
        gradients), decoded on the memory sources' frozen encoder states
        (``mem_enc``). Read from the cache (keyed on the source and the target
        tokens) when the model has one, the misses computed in chunks
        (:meth:`_decode_frozen`); without a cache all are computed in chunks."""
        dec = frozen_source(self, "memory_decoder")
        real = prev.ne(self.padding_idx)
        enc_states = mem_enc["encoder_out"][0]
        src_pad = mem_enc["encoder_padding_mask"][0]
        cache = self.memory_cache
        with torch.no_grad(), EvalMode(dec):
            if cache is None:
                keys, values = [], []
                for a, b in row_chunks(prev.size(0), max(prev.size(1), enc_states.size(0)),
                                        self.memory_chunk_tokens):
                    x, k = self._memory_features(
                        dec, prev[a:b], {"encoder_out": [enc_states[:, a:b]],
                                         "encoder_padding_mask": [src_pad[a:b]]})
                    keys.append(k.transpose(0, 1))
                    values.append(x)
                return torch.cat(keys, 0).detach(), torch.cat(values, 0).detach()
            # (the encoder's validation empties everything: these depend on it too)
            cache.validate("decoder", weights_signature(
                sentence_level_weights(dec, own=dec is self)), tags=("tgt",))
            # the key: the source tokens (where the encoder states are not padding)
            # and the target tokens
            src = encoder_out["mem_src_tokens"][0]
            if src.shape != src_pad.shape:
                raise RuntimeError("frozen memory: mem_src_tokens do not match the memory's "
                                   "encoder states")
            parts = [encoder_out.get(k, [None])[0] for k in ("mem_src_key", "mem_tgt_key")]
            if all(t is not None for t in parts):  # the collater's digests, on the host
                src_rows, tgt_rows = host_rows(parts[0]), host_rows(parts[1])
                keys = [("tgt", a, b, c, d) for (a, b, _), (c, d, _) in zip(src_rows, tgt_rows)]
                src_lens = [h[2] for h in src_rows]
                lens = [h[2] for h in tgt_rows]
            else:
                keys = [("tgt",) + s + t for s, t in zip(
                    row_keys(src.masked_fill(src_pad, -1), -1), row_keys(prev, self.padding_idx))]
                lens = real.sum(1).tolist()
                src_lens = (~src_pad).sum(1).tolist()
            left_src = bool(self.args.left_pad_source)
            left_tgt = bool(getattr(self.args, "left_pad_target", False))
            entries = cache.fetch(
                keys, lens,
                lambda rows: self._decode_frozen(dec, prev, enc_states, src_pad, lens, src_lens,
                                                 left_src, left_tgt, rows),
                self.memory_chunk_tokens)
            return assemble_rows(entries, prev.size(1), left_tgt, enc_states.device,
                                 enc_states.dtype)

    @classmethod
    def _decode_frozen(cls, dec, prev: Tensor, enc_states: Tensor, src_pad: Tensor,
                       lens: List[int], src_lens: List[int], left_src: bool, left_tgt: bool,
                       rows: List[int]) -> Tuple[Tensor, Tensor]:
        """Cache misses: keys and values of memory rows ``rows`` at their real
        target positions (``sum x C`` each), sources and targets trimmed to
        their longest (``lens``/``src_lens``: real tokens per row, on the host)."""
        idx = to_device(torch.tensor(rows, dtype=torch.long), prev.device)
        n = [lens[i] for i in rows]
        tokens = prev.index_select(0, idx)[:, cut_slice(prev.size(1), max(n), left_tgt)]
        cols = cut_slice(enc_states.size(0), max(src_lens[i] for i in rows), left_src)
        mem_enc = {"encoder_out": [enc_states.index_select(1, idx)[cols]],
                   "encoder_padding_mask": [src_pad.index_select(0, idx)[:, cols]]}
        x, keys = cls._memory_features(dec, tokens, mem_enc)  # k x w x C
        pos = real_positions(n, x.size(1), left_tgt, x.device)
        C = x.size(-1)
        return (keys.transpose(0, 1).reshape(-1, C).index_select(0, pos),
                x.reshape(-1, C).index_select(0, pos))

    def forward(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                features_only: bool = False, full_context_alignment: bool = False,
                alignment_layer: Optional[int] = None, alignment_heads: Optional[int] = None,
                src_lengths=None, return_all_hiddens: bool = False):
        """fairseq's decoder forward; with the batch's length groups
        (``--length-buckets``, a whole batch on the encoder side) it runs per
        group, each cut to its own target and source widths, the output layer
        included, and puts the outputs back in batch order (zeros at the
        padding positions a group does not have, which the loss ignores). The
        decoder's own context layer (decoder integration) reads all of a
        document's queries at once, so there the batch runs whole.

        With ``grouped_logits`` (set by the model's :meth:`grouped_logits`
        for a loss that takes its targets from ``model.get_targets``) the
        logits stay grouped, ``M x 1 x V`` (each group's ``rows x width``
        positions, group after group): a document batch's padded logits are
        about twice its real ones, and on the CPU writing them back in batch
        order costs as much as the output layer. With the collater's
        ``query_bucket_target_index`` the output layer then runs on the real
        target tokens only (``M`` = the batch's target tokens): the padding
        left inside the groups is not projected onto the vocabulary.
        ``extra["length_groups"]`` holds ``(rows, target width)`` per group
        and ``extra["target_index"]`` that index, from which ``get_targets``
        groups the targets the same way."""
        groups = None
        if encoder_out is not None and incremental_state is None and self.context_layer is None:
            groups = length_groups({k: encoder_out[k][0] for k in BUCKET_KEYS
                                    if encoder_out.get(k)})
        if groups is None:
            return super().forward(prev_output_tokens, encoder_out, incremental_state,
                                   features_only, full_context_alignment, alignment_layer,
                                   alignment_heads, src_lengths, return_all_hiddens)
        restore = encoder_out["query_bucket_restore"][0]
        left_s = bool(self.args.left_pad_source)
        left_t = bool(getattr(self.args, "left_pad_target", False))
        states, mask = encoder_out["encoder_out"][0], encoder_out["encoder_padding_mask"][0]
        S, T = states.size(0), prev_output_tokens.size(1)
        grouped = self.grouped_logits and not features_only
        index = encoder_out.get("query_bucket_target_index", [None])[0] if grouped else None
        outs = []
        for rows, src_width, tgt_width in groups:
            cut = cut_slice(S, src_width, left_s)
            enc = {"encoder_out": [states.index_select(1, rows)[cut]],
                   "encoder_padding_mask": [mask.index_select(0, rows)[:, cut]]}
            prev = prev_output_tokens.index_select(0, rows)[:, cut_slice(T, tgt_width, left_t)]
            outs.append(super().forward(prev, enc, None, features_only or index is not None,
                                        full_context_alignment, alignment_layer,
                                        alignment_heads, None, return_all_hiddens))
        extra: Dict[str, list] = {}
        if grouped:
            x = torch.cat([o[0].reshape(-1, o[0].size(-1)) for o in outs], 0)
            if index is not None:  # the output layer on the real target tokens only
                x = self.output_layer(x.index_select(0, index))
                extra["target_index"] = index
            x = x.unsqueeze(1)
            extra["length_groups"] = [(rows, tgt_width) for rows, _, tgt_width in groups]
        else:
            x = ungroup([o[0] for o in outs], 0, {1: (T, left_t)}, restore)
        for key, batch_dim, widths in (("attn", 0, {1: (T, left_t), 2: (S, left_s)}),
                                       ("inner_states", 1, {0: (T, left_t)})):
            if key in outs[0][1]:
                extra[key] = [None if parts[0] is None else ungroup(parts, batch_dim, widths,
                                                                     restore)
                              for parts in zip(*[o[1][key] for o in outs])]
        return x, extra

    def extract_features(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]],
                         incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                         full_context_alignment: bool = False,
                         alignment_layer: Optional[int] = None,
                         alignment_heads: Optional[int] = None):
        if self.context_layer is None:
            return self.extract_features_scriptable(
                prev_output_tokens, encoder_out, incremental_state, full_context_alignment,
                alignment_layer, alignment_heads)
        x, extra, query = self._features_and_source_attention(  # query: T x B x C
            self, prev_output_tokens, encoder_out, incremental_state, full_context_alignment,
            alignment_layer, alignment_heads)
        cached = incremental_state.get("selective_doc_memory") if incremental_state is not None \
            else None
        if cached is not None:
            memory = cached["memory"]
        else:
            keys, values, words = self.memory_states(encoder_out)
            layout = [encoder_out.get(k, [None])[0] for k in ("mem_doc_rows", "mem_doc_valid")]
            memory = self.context_layer.project_memory(
                keys, values, words, encoder_out["mem_doc"][0], encoder_out["mem_pos"][0],
                *layout)
            if incremental_state is not None:
                incremental_state["selective_doc_memory"] = {"memory": memory}
        pad_mask = prev_output_tokens.eq(self.padding_idx) if incremental_state is None else None
        r_tilde, info = self.context_layer(
            x.transpose(0, 1), memory, encoder_out["query_doc"][0], encoder_out["query_pos"][0],
            self.online, query=query, query_padding_mask=pad_mask,
            need_weights=self.record_stats,
            return_stats=self.record_stats or self.record_statistics,
            query_window=encoder_out.get("query_window", [None])[0],
            **(query_layout({k: encoder_out.get(k, [None])[0]
                              for k in ("query_doc_groups", "query_doc_sizes")}, x.size(1), None)
               if incremental_state is None else {}))
        self.last_info = detached(info)
        return r_tilde.transpose(0, 1), extra
