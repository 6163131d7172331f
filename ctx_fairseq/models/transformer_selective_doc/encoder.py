"""The encoder of ``transformer_selective_doc``: fairseq's encoder with the
document context layer on top (encoder integration) and the memory's
encoder states (shared with the queries or from the frozen copy)."""

import logging
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from fairseq.models.transformer import TransformerEncoderBase
from torch import Tensor

from ctx_fairseq.models._fairseq_utils import wrap_layer
from ctx_fairseq.models.transformer_selective_doc.common import (
    EvalMode,
    MEMORY_KEYS,
    QUERY_KEYS,
    ROW_INDEX_KEYS,
    align_states,
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
    state_index,
    ungroup,
)
from ctx_fairseq.modules.real_token_ffn import RealTokenEncoderLayer
from ctx_fairseq.modules.sentence_cache import (
    assemble_rows,
    row_keys,
    to_device,
    weights_signature,
)

logger = logging.getLogger(__name__)


class SelectiveDocEncoder(TransformerEncoderBase):
    """fairseq's encoder. With encoder integration its output goes through
    the Document-level Context Layer (queries: the output; memory: the
    document's sentences). It also encodes the memory sentences' sources
    (``mem_encoder_out``) and passes the memory inputs on in ``encoder_out``
    for decoder integration."""

    def __init__(self, cfg, dictionary, embed_tokens, args):
        super().__init__(cfg, dictionary, embed_tokens)
        init_context_part(self, args, "encoder", cfg.encoder)
        self.memory_encoder: Optional[TransformerEncoderBase] = None  # frozen copy

    def build_encoder_layer(self, cfg):
        # fairseq's layer, its FFN on the real tokens on the CPU (modules/real_token_ffn.py)
        return wrap_layer(RealTokenEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    def _state_index(self, doc: Dict[str, Tensor]) -> Tuple[Tensor, Tensor]:
        source, extra = doc.get("mem_state_index"), doc.get("mem_extra_rows")
        if source is None or extra is None:
            source, extra = state_index(doc["query_mem_row"], doc["mem_src_tokens"].size(0))
        return source, extra

    def _encode_with_memory(self, src_tokens: Tensor, src_lengths: Tensor,
                            doc: Dict[str, Tensor], return_all_hiddens: bool):
        """Shared memory: the batch's sources and the memory sentences that are
        no query of the batch (``mem_extra_rows``) in one encoder call (one
        set of fairseq's per-call host reads), padded to a common width.
        Returns fairseq's encoder output for the batch's sources (exactly the
        columns and rows of ``src_tokens``) and the states of all of them,
        ``W x (B + E) x C``, ``W = max(source, memory width)``."""
        mem, lengths = doc["mem_src_tokens"], doc["mem_src_lengths"]
        _, extra = self._state_index(doc)
        B, Ls = src_tokens.shape
        W = max(Ls, mem.size(1))
        left = bool(self.args.left_pad_source)

        def pad(t: Tensor) -> Tensor:
            n = W - t.size(1)
            return F.pad(t, (n, 0) if left else (0, n), value=self.padding_idx) if n else t

        full = self.forward_scriptable(
            torch.cat([pad(src_tokens), pad(mem.index_select(0, extra))], 0),
            torch.cat([src_lengths, lengths.index_select(0, extra)]), return_all_hiddens)
        cut = slice(W - Ls, W) if left else slice(0, Ls)
        states = full["encoder_out"][0]
        out = {
            "encoder_out": [states[cut, :B]],
            "encoder_padding_mask": [m[:B, cut] for m in full["encoder_padding_mask"]],
            "encoder_embedding": [e[:B, cut] for e in full["encoder_embedding"]],
            "encoder_states": [x[cut, :B] for x in full["encoder_states"]],
            "fc_results": [x[cut, :B] if x is not None else x for x in full["fc_results"]],
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }
        return out, states

    def memory_states(self, src_tokens: Tensor, enc_q: Tensor,
                      doc: Dict[str, Tensor], together: Optional[Tensor] = None
                      ) -> Tuple[Tensor, Tensor]:
        """The memory sentences' last-layer states (``W x S x C``) and tokens
        (``S x W``), padded like the source. ``shared``: a memory sentence that
        is a query of the batch reuses the query's states (``enc_q``), the
        others are encoded here; ``frozen``: the frozen stage-1 encoder (or this
        encoder, when the sentence level is frozen) without gradients, in eval
        mode."""
        mem, lengths = doc["mem_src_tokens"], doc["mem_src_lengths"]
        if mem.size(0) == 0:  # no memory sentence (online: only first sentences); nothing to run
            return enc_q.new_zeros(mem.size(1), 0, enc_q.size(2)), mem
        if self.args.context_memory == "frozen":
            return self.frozen_memory_states(mem, lengths, enc_q, doc.get("mem_src_key")), mem
        left = bool(self.args.left_pad_source)
        width = max(mem.size(1), src_tokens.size(1))
        source, extra = self._state_index(doc)
        padding = (width - mem.size(1), 0) if left else (0, width - mem.size(1))
        if together is not None:  # encoded with the batch (_encode_with_memory)
            return together.index_select(1, source), F.pad(mem, padding, value=self.padding_idx)
        parts = [align_states(enc_q, width, left)]
        if extra.numel():  # static: the collater's index
            e_out = TransformerEncoderBase.forward_scriptable(
                self, mem.index_select(0, extra), lengths.index_select(0, extra))
            parts.append(align_states(e_out["encoder_out"][0], width, left))
        states = torch.cat(parts, 1).index_select(1, source)
        return states, F.pad(mem, padding, value=self.padding_idx)

    def frozen_memory_states(self, mem: Tensor, lengths: Tensor, like: Tensor,
                             keys: Optional[Tensor] = None) -> Tensor:
        """``--context-memory frozen``: the memory sentences' last-layer
        states (``W x S x C``, ``like``'s dtype) under the frozen sentence-level
        encoder, in eval mode, without gradients. Read from the cache (keyed on
        the source tokens) when the model has one, the misses computed in
        chunks (:meth:`_encode_frozen`); without a cache all are computed in
        chunks."""
        enc = frozen_source(self, "memory_encoder")
        real = mem.ne(self.padding_idx)
        cache = self.memory_cache
        with torch.no_grad(), EvalMode(enc):
            if cache is None:
                parts = [TransformerEncoderBase.forward_scriptable(
                    enc, mem[a:b], lengths[a:b])["encoder_out"][0]
                    for a, b in row_chunks(mem.size(0), mem.size(1), self.memory_chunk_tokens)]
                return torch.cat(parts, 1).to(like.dtype).detach()
            cache.validate("encoder", weights_signature(
                sentence_level_weights(enc, own=enc is self)))
            if keys is not None:  # the collater's digests and lengths, on the host
                host = host_rows(keys)
                row_key = [("src", a, b) for a, b, _ in host]
                lens = [n for _, _, n in host]
            else:  # inputs built without them: the tokens themselves
                row_key = row_keys(mem, self.padding_idx, tag="src")
                lens = real.sum(1).tolist()
            left = bool(self.args.left_pad_source)
            entries = cache.fetch(
                row_key, lens,
                lambda rows: self._encode_frozen(enc, mem, lengths, lens, left, rows),
                self.memory_chunk_tokens)
            (states,) = assemble_rows(entries, mem.size(1), left, like.device, like.dtype)
        return states.transpose(0, 1)

    @staticmethod
    def _encode_frozen(enc, mem: Tensor, lengths: Tensor, lens: List[int], left: bool,
                       rows: List[int]) -> Tuple[Tensor]:
        """Cache misses: the states of memory rows ``rows`` at their real
        tokens (``sum x C``), the rows trimmed to their longest (``lens``:
        the real tokens per memory row, on the host)."""
        idx = to_device(torch.tensor(rows, dtype=torch.long), mem.device)
        n = [lens[i] for i in rows]
        tokens = mem.index_select(0, idx)[:, cut_slice(mem.size(1), max(n), left)]
        out = TransformerEncoderBase.forward_scriptable(enc, tokens, lengths.index_select(0, idx))
        states = out["encoder_out"][0].transpose(0, 1)  # k x w x C
        flat = states.reshape(-1, states.size(-1))
        return (flat.index_select(0, real_positions(n, states.size(1), left, flat.device)),)

    def _forward_groups(self, src_tokens: Tensor, src_lengths: Tensor,
                        groups: List[Tuple[Tensor, int, int]], restore: Tensor,
                        return_all_hiddens: bool) -> Dict[str, List[Tensor]]:
        """``--length-buckets``: fairseq's encoder run on each length group of
        the batch (:func:`length_groups`), each cut to its own width, and its
        outputs put back together, padded as the batch (zeros at the columns
        a group does not have: padding, which every reader masks). A
        sentence's states are those of the one-group forward, to rounding."""
        left = bool(self.args.left_pad_source)
        S = src_tokens.size(1)
        if src_tokens.is_cuda and not getattr(self, "_warned_groups_on_gpu", False):
            self._warned_groups_on_gpu = True
            logger.warning(f"--length-buckets: {len(groups)} length groups on the GPU: each "
                           "group is one more call of fairseq's encoder and decoder, with their "
                           "host synchronisations; the groups pay off on the CPU "
                           "(docs/transformer_selective_doc.md)")
        outs = [TransformerEncoderBase.forward_scriptable(
            self, src_tokens.index_select(0, rows)[:, cut_slice(S, width, left)],
            src_lengths.index_select(0, rows), return_all_hiddens)
            for rows, width, _ in groups]
        time_major = {0: (S, left)}  # T x B x C

        def join(key: str, i: int, batch_dim: int, widths) -> Optional[Tensor]:
            parts = [o[key][i] for o in outs]
            return None if parts[0] is None else ungroup(parts, batch_dim, widths, restore)

        return {
            "encoder_out": [join("encoder_out", 0, 1, time_major)],
            "encoder_padding_mask": [src_tokens.eq(self.padding_idx)],
            "encoder_embedding": [join("encoder_embedding", 0, 0, {1: (S, left)})],
            "encoder_states": [join("encoder_states", i, 1, time_major)
                               for i in range(len(outs[0]["encoder_states"]))],
            "fc_results": [join("fc_results", i, 1, time_major)
                           for i in range(len(outs[0]["fc_results"]))],
            "src_tokens": [],
            "src_lengths": [src_tokens.ne(self.padding_idx).sum(
                dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()],
        }

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None,
                **doc):
        if "mem_src_tokens" not in doc or doc["mem_src_tokens"] is None:
            raise ValueError("transformer_selective_doc needs the document memory in each batch: "
                             "--task document_translation --document-context online|offline "
                             "--document-memory")
        together = None
        groups = length_groups(doc)
        if groups is not None and self.args.context_memory != "frozen":
            raise ValueError("--length-buckets: a shared memory is encoded together with the "
                             "batch's sources; length groups need --context-memory frozen")
        if self.args.context_memory != "frozen" and doc["mem_src_tokens"].size(0) > 0 \
                and token_embeddings is None and src_lengths is not None:
            out, together = self._encode_with_memory(src_tokens, src_lengths, doc,
                                                     return_all_hiddens)
        elif groups is not None and token_embeddings is None and src_lengths is not None:
            out = self._forward_groups(src_tokens, src_lengths, groups,
                                       doc["query_bucket_restore"], return_all_hiddens)
        else:
            out = self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens,
                                          token_embeddings)
        for key in MEMORY_KEYS:
            if doc.get(key) is not None:
                out[key] = [doc[key]]
        r = out["encoder_out"][0]
        states, mem_tokens = self.memory_states(src_tokens, r, doc, together)
        if self.context_layer is None:  # decoder integration: the decoder attends to these
            out["mem_encoder_out"] = [states]
            out["mem_encoder_padding_mask"] = [mem_tokens.eq(self.padding_idx)]
            return out
        words = states.transpose(0, 1)
        by_length = None  # the source memory's sentences by length, in these columns
        shift = words.size(1) - doc["mem_src_tokens"].size(1)  # columns padded on here
        if all(doc.get(k) is not None for k in ("mem_doc_rows_by_len", "mem_doc_len_order",
                                                 "mem_doc_span_by_len", "mem_doc_rows")) \
                and shift >= 0:
            span = doc["mem_doc_span_by_len"]
            if shift and bool(self.args.left_pad_source):
                span = np.where(span[..., 1:] > span[..., :1], span + shift, span)
            by_length = (doc["mem_doc_rows_by_len"], doc["mem_doc_len_order"], span)
        memory = self.context_layer.project_memory(
            words, words, real_words(mem_tokens, self.dictionary), doc["mem_doc"],
            doc["mem_pos"], doc.get("mem_doc_rows"), doc.get("mem_doc_valid"),
            by_length=by_length)
        pad_mask = out["encoder_padding_mask"][0] if out["encoder_padding_mask"] else None
        r_tilde, info = self.context_layer(
            r, memory, doc["query_doc"], doc["query_pos"], self.online,
            query_padding_mask=pad_mask, need_weights=self.record_stats,
            return_stats=self.record_stats or self.record_statistics,
            query_window=doc.get("query_window"),
            **query_layout(doc, r.size(0), src_tokens.size(1)))
        out["encoder_out"] = [r_tilde]
        self.last_info = detached(info)
        return out

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        out = super().reorder_encoder_out(encoder_out, new_order)
        for key in MEMORY_KEYS:
            vals = encoder_out.get(key, [])
            if key in ROW_INDEX_KEYS:
                out.pop(key, None)
            elif vals:
                # the queries follow the beam; the memory is per document and stays
                out[key] = [vals[0].index_select(0, new_order)] if key in QUERY_KEYS else vals
        return out
