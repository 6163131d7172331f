"""Helpers of the transformer_han tests (tests/test_transformer_han*.py):
tiny models, synthetic sentences and their context batches."""


import torch

import ctx_fairseq  # noqa: F401

from fairseq_cli_utils import (
    build_tiny_model,
)

VOCAB = 40
K = 3
HAN_ARGS = ["--task", "document_translation", "--source-context-size", "3",
            "--target-context-size", "3"]
HAN_ENC_ARGS = ["--task", "document_translation", "--source-context-size", "3"]


def build(extra=(), arch="transformer_han_tiny", double=True):
    return build_tiny_model(arch, extra, vocab=VOCAB, double=double)


def sentences(d, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        s = torch.randint(d.nspecial, len(d), (n,), generator=g)
        s[-1] = d.eos()
        out.append(s)
    return out


def pad_rows(rows, pad, left, width=None):
    width = max([width or 1] + [len(r) for r in rows])
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            if left:
                out[i, width - len(r):] = r
            else:
                out[i, :len(r)] = r
    return out


def context_row(sents):
    return torch.cat(sents) if sents else torch.empty(0, dtype=torch.long)


def batch(d, n_ctx, seed, src_left=True, extra_width=0):
    """A batch of B sentences, sentence b with ``n_ctx[b]`` previous source and
    target sentences (lists of 1-D tensors kept for single-row runs)."""
    B = len(n_ctx)
    g = torch.Generator().manual_seed(seed)
    lens = lambda n: torch.randint(2, 7, (n,), generator=g).tolist()  # noqa: E731
    src = sentences(d, lens(B), seed + 1)
    prev = []
    for t in sentences(d, lens(B), seed + 2):
        prev.append(torch.cat([t[-1:], t[:-1]]))
    sctx = [sentences(d, lens(n), seed + 10 + b) for b, n in enumerate(n_ctx)]
    tctx = [sentences(d, lens(n), seed + 50 + b) for b, n in enumerate(n_ctx)]
    pad = d.pad()
    net = {
        "src_tokens": pad_rows(src, pad, src_left),
        "prev_output_tokens": pad_rows(prev, pad, False),
        "src_ctx_tokens": pad_rows([context_row(c) for c in sctx], pad, src_left,
                                   extra_width + 1),
        "tgt_ctx_tokens": pad_rows([context_row(c) for c in tctx], pad, False, extra_width + 1),
    }
    parts = {"src": src, "prev": prev, "sctx": sctx, "tctx": tctx}
    return net, parts


def single(parts, b, pad, src_left=True):
    return {
        "src_tokens": pad_rows([parts["src"][b]], pad, src_left),
        "prev_output_tokens": pad_rows([parts["prev"][b]], pad, False),
        "src_ctx_tokens": pad_rows([context_row(parts["sctx"][b])], pad, src_left),
        "tgt_ctx_tokens": pad_rows([context_row(parts["tctx"][b])], pad, False),
    }


def run(model, net):
    return model(net["src_tokens"], None, net["prev_output_tokens"],
                 src_ctx_tokens=net["src_ctx_tokens"], tgt_ctx_tokens=net["tgt_ctx_tokens"])[0]
