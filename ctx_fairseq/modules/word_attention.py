r"""The word level of selective attention (Maruf et al. 2019, Eq. 4-5, and the
flat word attention of Eq. 6), streamed over blocks of memory sentences: no
tensor pairs every query token with every word of its document.

Notation: a *group* ``g`` is a set of ``M`` query rows (tokens) that share
one list of ``J`` memory sentences ``index[g]`` (rows of the projected memory,
each ``L`` words): one query sentence (``M = T``, the per-sentence layout of
incremental decoding) or all query sentences of one document (``M = Bq T``,
the per-document layout the task's collater provides). Per head ``h``:

* hierarchical (Eq. 4-5 and the value read)::

      out[m] = sum_j a[m, j] sum_l norm_l(s[m, j, l]) v[j, l]      s = q[m] . k[j, l]

  ``a`` the Eq. 3 sentence weights (0 outside the sparsemax support and for
  sentences that are not visible), ``norm`` softmax or sparsemax over the
  real words of sentence ``j`` (Eq. 4). Because Eq. 4 normalises within one
  sentence, a block of whole sentences is complete: blocks are summed, with
  no rescaling between them.
* flat-word (Eq. 6)::

      out[m] = sum_{j,l} softmax_{j,l}(s[m, j, l] + c[m, j]) v[j, l]

  over every real word of every visible sentence (``c``: the optional
  sentence-distance bias, ``-inf`` where not visible), streamed with the
  running maximum and sum of flash attention (Dao et al. 2022).

Forward and backward loop over tiles (a chunk of groups, a chunk of their
query rows, a block of ``block`` sentences); each tile's scores
(``chunk x H x M x block x L``) are computed, used and dropped, and the
backward recomputes them (the memory-for-compute trade of flash attention).
Kept for the backward: the inputs, the output, and for flat-word the
log-sum-exp per query row. Peak memory is therefore linear in the document:
``O(G H M J)`` for the sentence weights plus one tile. Gradients::

    dP = g . v[j, l]                (the tile's dropout mask applied)
    hierarchical:  da[m, j] = sum_l p dP,   ds = a p (dP - da)            (softmax)
                                            ds = on (a dP - mean_on(a dP)) (sparsemax)
    flat-word:     ds = P (dP - D),  D[m] = g . out[m],   dc[m, j] = sum_l ds
    dq = sum ds k,   dk = sum ds q,   dv = sum P g        (float32 accumulation)

Exactness and batch independence. The blocks start at the group's first
memory sentence and have a fixed size (``block``, never derived from the
batch), a tile past a group's last sentence adds exactly 0, and the group
and row chunks only split independent rows, so a sentence's result does not
depend on which other documents share its batch (tested bitwise in float32
on the CPU). Matrix products run in the operands' dtype (the autocast dtype
inside an autocast region), normalisation and accumulation in float32; the
sentence weights ``a`` stay float32.

Attention dropout (on ``alpha_hier`` / the flat weights, fairseq's placement)
draws its mask per tile from a generator seeded with a seed drawn from
torch's default CPU generator and the tile's number, so that the backward
regenerates the forward's mask without storing it.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from ctx_fairseq.modules.cpu_shortcuts import cpu_shortcuts

__all__ = ["streamed_word_attention", "WORD_BLOCK", "TILE_ELEMS", "TILING_OPTIONS",
           "tile_elems_for", "word_block_for"]

#: memory sentences per block, per device type (fixed: a sentence's result must not
#: depend on the batch). On the CPU, where a tile computes only the query rows that
#: give one of its sentences a weight (``compact``), smaller blocks leave fewer rows
#: in: 16 against 32 took the word level of a TVsub batch from 296 to 227 ms
#: (forward and backward; 8: 278 ms); an accelerator computes whole tiles, larger
WORD_BLOCK = {"cpu": 16, "default": 32}
#: about how many score elements one tile holds (group, row and block chunks): on
#: the CPU (cache-sized temporaries) and on an accelerator (fewer, larger kernels: a
#: tile's dozen float32 temporaries take about 3 GiB there); the tiles split only
#: independent query rows, so the result does not depend on it
TILE_ELEMS = {"cpu": 1 << 23, "default": 1 << 26}


def tile_elems_for(device: torch.device, tile_elems: Optional[int] = None) -> int:
    """``tile_elems`` if given, else the CPU's default where its shortcuts
    apply (:func:`~ctx_fairseq.modules.cpu_shortcuts.cpu_shortcuts`), else
    the accelerator's."""
    if tile_elems:
        return int(tile_elems)
    return TILE_ELEMS["cpu" if cpu_shortcuts(device) else "default"]


def word_block_for(device: torch.device, word_block: Optional[int] = None) -> int:
    """``word_block`` if given, else the CPU's default where its shortcuts
    apply, else the accelerator's."""
    if word_block:
        return int(word_block)
    return WORD_BLOCK["cpu" if cpu_shortcuts(device) else "default"]


def _compute_dtype(t: Tensor) -> torch.dtype:
    """The dtype an autocast region would compute a matrix product of ``t`` in."""
    dev = t.device.type
    if not t.is_floating_point():
        return t.dtype
    try:
        if torch.is_autocast_enabled(dev):
            return torch.get_autocast_dtype(dev)
        return t.dtype
    except RuntimeError:  # a device type autocast does not know: no autocast there
        return t.dtype
    except (TypeError, AttributeError):  # torch < 2.4: the per-device functions
        if dev == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        if dev == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
        return t.dtype


def _plan(G: int, M: int, J: int, H: int, L: int, block: int, tile_elems: int, spans=None,
          group_rows=None):
    """The tiles ``(g0, g1, m0, m1, j0, j1, number, (c0, c1))`` in a fixed
    order (the same in both passes); from shapes and host arrays only.

    Without ``spans``: chunks of groups and of their query rows times blocks
    of ``block`` sentences, every token column. With ``spans`` (host numpy
    ``G x J x 2``, the token columns each entry occupies) one group per tile,
    its block's own columns (a block of none is skipped), and with
    ``group_rows`` (host numpy ``G``) only the group's real query rows: a
    tile's shapes then depend on its own document only (a sentence's result
    does not depend on its batch) and no padded row or column is computed."""
    n = 0
    if spans is None:
        per_row = H * block * L
        rows = max(1, tile_elems // per_row)
        gq = max(1, rows // max(M, 1)) if M <= rows else 1
        mq = M if M <= rows else rows
        for g0 in range(0, G, gq):
            for m0 in range(0, M, mq):
                for j0 in range(0, J, block):
                    yield g0, min(G, g0 + gq), m0, min(M, m0 + mq), j0, min(J, j0 + block), n, \
                        (0, L)
                    n += 1
        return
    for g in range(G):
        rows_g = M if group_rows is None else min(M, int(group_rows[g]))
        for j0 in range(0, J, block):
            j1 = min(J, j0 + block)
            cols = _columns(spans, g, g + 1, j0, j1, L)
            if cols is None or rows_g <= 0:
                continue
            mq = max(1, tile_elems // (H * (j1 - j0) * (cols[1] - cols[0])))
            for m0 in range(0, rows_g, mq):
                yield g, g + 1, m0, min(rows_g, m0 + mq), j0, j1, n, cols
                n += 1


def _sparsemax(x: Tensor, dim: int) -> Tensor:
    """Sparsemax over ``dim`` (Martins & Astudillo 2016; the forward of
    :class:`ctx_fairseq.modules.sparsemax._Sparsemax`)."""
    x = x - x.amax(dim, keepdim=True)
    z, _ = torch.sort(x, dim=dim, descending=True)
    cs = z.cumsum(dim) - 1
    shape = [1] * x.dim()
    shape[dim] = x.size(dim)
    k = torch.arange(1, x.size(dim) + 1, device=x.device, dtype=x.dtype).view(shape)
    support = (k * z > cs).sum(dim, keepdim=True)
    tau = cs.gather(dim, support - 1) / support.to(x.dtype)
    return torch.clamp(x - tau, min=0)


class _StreamedWordAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, weight, index, word_mask, flat: bool, word_attn: str, block: int,
                tile_elems: int, p_drop: float, seed: int, want_nnz: bool, spans=None,
                group_rows=None, compact: bool = False):
        G, H, M, d = q.shape
        J, L = index.size(1), k.size(2)
        dt = _compute_dtype(q)
        acc = torch.promote_types(q.dtype, torch.float32)
        low = torch.finfo(acc).min
        out = q.new_zeros(G, H, M, d, dtype=acc)
        nnz = q.new_zeros(G, H, M, J, dtype=torch.int32) if want_nnz else None
        mass = q.new_zeros(0, dtype=acc)
        if flat:
            run_max = q.new_full((G, H, M), low, dtype=acc)
            run_sum = q.new_zeros(G, H, M, dtype=acc)

        def tiles():
            for g0, g1, m0, m1, j0, j1, n, cols in _plan(G, M, J, H, L, block, tile_elems,
                                                           spans, group_rows):
                yield (g0, g1, m0, m1, j0, j1, n,
                       _Tile(q, k, v, weight, index, word_mask, (g0, g1, m0, m1, j0, j1), dt,
                             acc, cols))

        for g0, g1, m0, m1, j0, j1, n, t in tiles():
            rs = (slice(g0, g1), slice(None), slice(m0, m1))
            if compact and not flat and not t.compact():
                continue  # no weight in the tile: it adds exactly 0
            if flat:
                x = t.flat_logits(low)  # gq x H x mq x L x n
                mx = torch.maximum(run_max[rs], x.amax((-2, -1)))
                scale = torch.exp(run_max[rs] - mx)
                e = torch.exp(x - mx[..., None, None])
                run_sum[rs] = run_sum[rs] * scale + e.sum((-2, -1))
                run_max[rs] = mx
                out[rs] = out[rs] * scale.unsqueeze(-1) + t.read(_dropout(e, p_drop, seed, n))
            else:
                P, p = t.hier_weights(word_attn)
                if nnz is not None:  # nonzero word weights of the sentences with weight
                    t.put_rows(nnz[rs + (slice(j0, j1),)],
                               ((p != 0) & (t.weight() != 0).unsqueeze(-2)).sum(-2).to(nnz.dtype))
                keep = _keep(P, p_drop, seed, n, t.support() if compact else None)
                t.add_rows(out[rs], t.read(P if keep is None else P * keep))
        lse = None
        if flat:
            row_ok = run_max > low / 2  # a row with one visible word
            out = torch.where(row_ok.unsqueeze(-1), out / run_sum.clamp(min=1e-30).unsqueeze(-1),
                              out.new_zeros(()))
            lse = torch.where(row_ok, run_max + run_sum.clamp(min=1e-30).log(),
                              torch.full_like(run_max, float("inf")))
            if nnz is not None:  # the final weights per sentence: one more pass over the scores
                mass = q.new_zeros(G, H, M, J, dtype=acc)
                for g0, g1, m0, m1, j0, j1, n, t in tiles():
                    rs = (slice(g0, g1), slice(None), slice(m0, m1))
                    P = torch.exp(t.flat_logits(low) - lse[rs][..., None, None])
                    nnz[rs + (slice(j0, j1),)] = (P != 0).sum(-2)
                    mass[rs + (slice(j0, j1),)] = P.sum(-2)
        ctx.save_for_backward(q, k, v, weight, index, word_mask, out, lse)
        ctx.cfg = (flat, word_attn, block, tile_elems, p_drop, seed, dt, acc, spans, group_rows,
                   compact)
        if nnz is None:
            nnz = q.new_zeros(0, dtype=torch.int32)
        ctx.mark_non_differentiable(nnz, mass)
        return out.to(dt), nnz, mass

    @staticmethod
    def backward(ctx, grad, _grad_nnz, _grad_mass):
        q, k, v, weight, index, word_mask, out, lse = ctx.saved_tensors
        flat, word_attn, block, tile_elems, p_drop, seed, dt, acc, spans, group_rows, compact = \
            ctx.cfg
        G, H, M, d = q.shape
        J, L = index.size(1), k.size(2)
        low = torch.finfo(acc).min
        grad = grad.to(acc)
        need_q, need_k, need_v, need_w = ctx.needs_input_grad[:4]
        dq = torch.zeros(q.shape, dtype=acc, device=q.device) if need_q else None
        dk = torch.zeros(k.shape, dtype=torch.promote_types(k.dtype, torch.float32),
                         device=k.device) if need_k else None
        dv = torch.zeros(v.shape, dtype=torch.promote_types(v.dtype, torch.float32),
                         device=v.device) if need_v else None
        dw = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        D = (grad * out).sum(-1) if flat else None  # G x H x M
        for g0, g1, m0, m1, j0, j1, n, cols in _plan(G, M, J, H, L, block, tile_elems, spans,
                                                       group_rows):
            t = _Tile(q, k, v, weight, index, word_mask, (g0, g1, m0, m1, j0, j1), dt, acc, cols)
            rs = (slice(g0, g1), slice(None), slice(m0, m1))
            if compact and not flat and not t.compact():
                continue  # the forward skipped it: no gradient flows through it
            go = t.pick(grad[rs])
            gv = t.grad_values(go)  # gq x H x mq x L x n
            if flat:
                keep = _keep(gv, p_drop, seed, n)  # the forward's dropout mask (or None)
                dP = gv if keep is None else gv * keep
                P = torch.exp(t.flat_logits(low) - lse[rs][..., None, None])
                ds = P * (dP - D[rs][..., None, None])
                if dw is not None:
                    dw[rs + (slice(j0, j1),)] = ds.sum(-2)
            else:
                P, p = t.hier_weights(word_attn)
                keep = _keep(gv, p_drop, seed, n, t.support() if compact else None)
                dP = gv if keep is None else gv * keep
                da = (p * dP).sum(-2)  # d loss / d a
                if dw is not None:
                    t.put_rows(dw[rs + (slice(j0, j1),)], da)
                if word_attn == "softmax":
                    ds = P * (dP - da.unsqueeze(-2))
                else:
                    on = p > 0
                    dp = torch.where(on, dP * t.weight().unsqueeze(-2), dP.new_zeros(()))
                    ds = torch.where(on, dp - dp.sum(-2, keepdim=True)
                                     / on.sum(-2, keepdim=True).clamp(min=1), dp.new_zeros(()))
            t.accumulate(ds, P if keep is None else P * keep, go, dq, dk, dv)
        return ((dq.to(q.dtype) if dq is not None else None),
                (dk.to(k.dtype) if dk is not None else None),
                (dv.to(v.dtype) if dv is not None else None),
                (dw.to(weight.dtype) if dw is not None else None),
                None, None, None, None, None, None, None, None, None, None, None, None)


def _columns(spans, g0: int, g1: int, j0: int, j1: int, L: int) -> Optional[Tuple[int, int]]:
    """The token columns ``[c0, c1)`` a tile's sentences occupy (host numpy
    ``spans``, ``G x J x 2``; all ``L`` without them); None when the tile
    holds no sentence (it adds exactly 0 and is skipped)."""
    if spans is None:
        return 0, L
    part = spans[g0:g1, j0:j1]
    c0, c1 = int(part[..., 0].min()), int(part[..., 1].max())
    if c1 <= c0:
        return None
    return max(0, c0), min(L, c1)


def _keep(x: Tensor, p: float, seed: int, tile: int,
          support: Optional[Tensor] = None) -> Optional[Tensor]:
    """Tile ``tile``'s dropout mask scaled by ``1 / (1 - p)`` (``x``'s shape and
    dtype), drawn from a generator seeded by ``(seed, tile)``: the same in the
    forward and the backward; None when ``p`` is 0. With ``support`` (bool,
    broadcast to ``x``'s shape: the words of the tile's sentences with weight,
    :meth:`_Tile.support`, from the inputs only, so the same in both passes)
    only those entries are drawn and the others are 0: a weight of 0 stays 0
    whatever its mask, and most of a compacted tile's weights are 0 (drawing
    the numbers is then most of the cost of dropout)."""
    if p <= 0:
        return None
    gen = _generator(x.device, (seed + 1_000_003 * tile) % (1 << 63))
    if support is None:
        keep = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype) >= p
        return keep.to(x.dtype).div_(1 - p)
    where = support.expand(x.shape).reshape(-1).nonzero().squeeze(1)
    drawn = torch.rand(where.numel(), generator=gen, device=x.device, dtype=x.dtype) >= p
    keep = torch.zeros(x.numel(), dtype=x.dtype, device=x.device)
    keep[where] = drawn.to(x.dtype).div_(1 - p)
    return keep.view(x.shape)


def _generator(device: torch.device, seed: int) -> Optional[torch.Generator]:
    """A generator on ``device`` seeded with ``seed``; None on the meta device
    (a shape-only trace: it has no generator and draws no values)."""
    if torch.device(device).type == "meta":
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _dropout(x: Tensor, p: float, seed: int, tile: int) -> Tensor:
    """``x`` times tile ``tile``'s dropout mask (:func:`_keep`)."""
    keep = _keep(x, p, seed, tile)
    return x if keep is None else x * keep


class _Tile:
    """One tile: groups ``g0:g1``, query rows ``m0:m1``, memory sentences
    ``j0:j1`` of each group's list. Word-major layout: the tile's keys and
    values are ``gq x H x (L n) x d`` (word ``l`` of sentence ``i`` at ``l n + i``)
    and its scores ``gq x H x mq x L x n``, so that every reduction over a
    sentence's words runs over dim -2 with the sentences contiguous (a
    softmax over a last dim of a dozen words is about ten times slower on the
    CPU)."""

    def __init__(self, q, k, v, weight, index, word_mask, span, dt, acc, cols=None):
        g0, g1, m0, m1, j0, j1 = span  # groups, query rows, memory sentences
        self.sl = (slice(g0, g1), slice(None), slice(m0, m1))
        self.rows = index[g0:g1, j0:j1]  # gq x n
        self.n = j1 - j0
        self.j = slice(j0, j1)
        c0, c1 = cols if cols is not None else (0, k.size(2))
        self.c = slice(c0, c1)  # the token columns the tile's sentences occupy
        self.L = c1 - c0
        self.dt, self.acc = dt, acc
        self.k, self.v, self.wsrc = k[:, :, self.c], v[:, :, self.c], weight
        self._keys = self._values = self._weight = self.sel = None
        self.q = q[self.sl].to(dt)
        low = torch.finfo(acc).min
        words = word_mask[:, self.c][self.rows].transpose(1, 2)  # gq x L x n
        self.word_bias = torch.zeros((), dtype=acc, device=q.device).masked_fill(
            ~words, low).unsqueeze(1).unsqueeze(1)  # gq x 1 x 1 x L x n

    def _gather(self, x: Tensor) -> Tensor:
        gq, n = self.rows.shape
        H, L, d = x.shape[1:]
        return x[self.rows].to(self.dt).permute(0, 2, 3, 1, 4).reshape(gq, H, L * n, d)

    @property
    def keys(self) -> Tensor:
        if self._keys is None:
            self._keys = self._gather(self.k)
        return self._keys

    @property
    def values(self) -> Tensor:
        if self._values is None:
            self._values = self._gather(self.v)
        return self._values

    def weight(self) -> Tensor:
        """The tile's sentence term, ``gq x H x mq x n`` (its selected rows
        after :meth:`compact`)."""
        if self._weight is None:
            self._weight = self.wsrc[self.sl + (self.j,)].to(self.acc)
        return self._weight

    def compact(self) -> bool:
        """Keeps, per group and head, only the query rows with a nonzero
        sentence weight in the tile (hierarchical; one host read, the CPU's
        path): False when there is none (the tile adds exactly 0). The other
        rows would add ``0 * p v`` (exactly 0) to the output and to ``dq``,
        ``dk``, ``dv``; their ``d a`` (left 0) only ever meets a normaliser
        whose Jacobian is 0 where its output is 0 (sparsemax outside its
        support, softmax where it underflows or is masked), so the model's
        gradients are those of the full tile."""
        w = self.weight()
        on = (w != 0).any(-1)  # gq x H x mq
        count = int(on.sum(-1).max()) if on.numel() else 0
        if count == 0:
            return False
        if count < on.size(-1):
            # each head's rows with weight first (in order), padded with rows of none
            self.sel = torch.argsort((~on).to(torch.uint8), dim=-1, stable=True)[..., :count]
            self.q = self.pick(self.q)
            self._weight = self.pick(w)
        return True

    def support(self) -> Tensor:
        """Bool, broadcastable to the tile's ``gq x H x mq x L x n``: the real
        words of the sentences with nonzero weight (where ``a p`` can be
        nonzero), from the inputs alone."""
        return (self.weight() != 0).unsqueeze(-2) & (self.word_bias == 0)

    def pick(self, x: Tensor) -> Tensor:
        """``x`` (``gq x H x mq x ...``) at the tile's selected rows."""
        if self.sel is None:
            return x
        idx = self.sel.view(*self.sel.shape, *([1] * (x.dim() - 3)))
        return x.gather(2, idx.expand(*self.sel.shape, *x.shape[3:]))

    def add_rows(self, dst: Tensor, x: Tensor) -> None:
        """``dst[selected rows] += x`` (``dst`` a ``gq x H x mq x ...`` view)."""
        if self.sel is None:
            dst += x.to(dst.dtype)
            return
        idx = self.sel.view(*self.sel.shape, *([1] * (x.dim() - 3)))
        dst.scatter_add_(2, idx.expand_as(x), x.to(dst.dtype))

    def put_rows(self, dst: Tensor, x: Tensor) -> None:
        """``dst[selected rows] = x`` (``dst`` a ``gq x H x mq x ...`` view)."""
        if self.sel is None:
            dst.copy_(x)
            return
        idx = self.sel.view(*self.sel.shape, *([1] * (x.dim() - 3)))
        dst.scatter_(2, idx.expand_as(x), x.to(dst.dtype))

    def scores(self) -> Tensor:
        """``gq x H x mq x L x n`` in the accumulation dtype."""
        s = torch.matmul(self.q, self.keys.transpose(-1, -2)).to(self.acc)
        return s.view(*s.shape[:-1], self.L, self.n)

    def hier_weights(self, word_attn: str) -> Tuple[Tensor, Tensor]:
        """Eq. 4-5 on the tile: ``(a p, p)``, ``p`` normalised over each
        sentence's real words (a sentence without one, which never has
        weight, gets uniform weights)."""
        w = self.weight().unsqueeze(-2)
        s = self.scores()
        s += self.word_bias
        # a sentence of weight 0 adds 0 whatever its scores: a half-precision
        # overflow in it (inf) is taken as 0, so that 0 x inf cannot make NaN
        # (a finite score is kept: the gradient of a weight at 0 stays exact)
        s = torch.where(torch.isfinite(s) | (w != 0), s, s.new_zeros(()))
        p = torch.softmax(s, -2) if word_attn == "softmax" else _sparsemax(s, -2)
        return p * w, p

    def flat_logits(self, low: float) -> Tensor:
        """Eq. 6 logits on the tile; ``low`` where not allowed."""
        s = self.scores()
        s += self.word_bias
        s += self.weight().unsqueeze(-2)
        return s.clamp_(min=low)

    def read(self, P: Tensor) -> Tensor:
        """``P`` (``gq x H x mq x L x n``) times the tile's values."""
        return torch.matmul(P.to(self.dt).flatten(-2), self.values).to(self.acc)

    def grad_values(self, go: Tensor) -> Tensor:
        """``g . v`` for every word of the tile: ``gq x H x mq x L x n``."""
        gv = torch.matmul(go.to(self.dt), self.values.transpose(-1, -2)).to(self.acc)
        return gv.view(*gv.shape[:-1], self.L, self.n)

    def accumulate(self, ds: Tensor, Pd: Tensor, go: Tensor, dq, dk, dv) -> None:
        ds, Pd = ds.to(self.dt).flatten(-2), Pd.to(self.dt).flatten(-2)
        if dq is not None:
            self.add_rows(dq[self.sl], torch.matmul(ds, self.keys))
        flat_rows = self.rows.reshape(-1)
        gq, n = self.rows.shape
        for acc, a, b in ((dk, ds, self.q), (dv, Pd, go.to(self.dt))):
            if acc is None:
                continue
            part = torch.matmul(a.transpose(-1, -2), b)  # gq x H x (L n) x d
            H, d = part.size(1), part.size(-1)
            part = part.view(gq, H, self.L, n, d).permute(0, 3, 1, 2, 4).reshape(
                gq * n, H, self.L, d)
            acc[:, :, self.c].index_add_(0, flat_rows, part.to(acc.dtype))


#: :func:`streamed_word_attention`'s options, by keyword, and their defaults
TILING_OPTIONS = {"block": None, "tile_elems": None, "dropout": 0.0, "want_nnz": False,
                  "spans": None, "group_rows": None, "compact": False}


def streamed_word_attention(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, index: Tensor,
                            word_mask: Tensor, flat: bool, word_attn: str = "softmax",
                            **options) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """The word level over groups (see the module docstring). ``options``
    (:data:`TILING_OPTIONS`, by keyword): ``block``, ``tile_elems``,
    ``dropout``, ``want_nnz``, ``spans``, ``group_rows``, ``compact``.

    ``q`` ``G x H x M x d`` (scaled queries); ``k``/``v`` ``S x H x L x d`` (the
    projected memory); ``weight`` ``G x H x M x J`` float32: the sentence
    weights ``a`` (hierarchical) or the flat logits' sentence term ``c``
    (``-inf`` where not visible); ``index`` ``G x J`` long (memory rows);
    ``word_mask`` ``S x L`` (True = real word). ``dropout``: the attention
    dropout probability (0 outside training). Returns ``(out, nnz, mass)``:
    ``out`` ``G x H x M x d`` in the compute dtype; with ``want_nnz``, ``nnz``
    ``G x H x M x J`` int32 (the nonzero word weights of each sentence with
    weight, before dropout) and for flat-word ``mass`` (``G x H x M x J``
    float32, each sentence's share of the weights), else None. ``spans``
    (optional, numpy ``G x J x 2`` on the host): the token columns ``[start,
    end)`` each entry of ``index`` occupies (``(L, 0)``: none); a tile then
    reads only the columns its sentences occupy and a tile of none is
    skipped (with sentences ordered by length, most of the padding of a
    document's longest sentence is never read), one group per tile; with
    ``group_rows`` (numpy ``G``) only each group's first ``group_rows[g]``
    query rows are computed (the others are padding: output 0).

    ``compact`` (hierarchical; the model turns it on on the CPU): each tile computes
    only the query rows that give one of its sentences a nonzero weight
    (:meth:`_Tile.compact`; one host read per tile, which an accelerator
    would wait for) and a tile without weight is skipped. The output and the
    gradients of ``q``, ``k``, ``v`` are those of the full tiles; ``weight``'s
    gradient is left 0 in the rows of a tile that give it no weight, which is
    exact for weights from a softmax or sparsemax (their Jacobian is 0 where
    their output is 0: Eq. 3's sentence weights) but not for arbitrary ones
    (``compact=False`` then)."""
    if word_attn not in ("softmax", "sparsemax"):
        raise ValueError(f"word_attn: expected softmax or sparsemax, got {word_attn!r}")
    unknown = set(options) - set(TILING_OPTIONS)
    if unknown:
        raise TypeError(f"unexpected arguments {sorted(unknown)}; the options are "
                        f"{', '.join(TILING_OPTIONS)}")
    o = dict(TILING_OPTIONS, **options)
    dropout, want_nnz = float(o["dropout"]), bool(o["want_nnz"])
    seed = int(torch.randint(0, 1 << 62, (1,)).item()) if dropout > 0 else 0  # CPU generator
    out, nnz, mass = _StreamedWordAttention.apply(
        q, k, v, weight.to(torch.promote_types(q.dtype, torch.float32)), index, word_mask,
        bool(flat), word_attn, word_block_for(q.device, o["block"]),
        tile_elems_for(q.device, o["tile_elems"]), dropout, seed, want_nnz, o["spans"],
        o["group_rows"], bool(o["compact"]))
    if not want_nnz:
        return out, None, None
    return out, nnz, (mass if flat else None)
