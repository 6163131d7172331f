r"""Local Context Unit of the Dual Contextual (DC) module (Ampomah et al., 2021, Eq. 6).

.. math::

    \hat r_t = g\big([r_{t-a}; \dots; r_{t+b}]\,W^r + b^r\big), \qquad
    l_c = \mathrm{LayerNorm}(\hat r + r)

with :math:`W^r \in \mathbb{R}^{f d \times 2d}` (a 1-D convolution of kernel size
``f`` written as one matrix over the concatenated window, exactly as in the
paper), :math:`g` the GLU (``2d -> d``), a residual connection and LayerNorm.

Window placement (``a`` past and ``b`` future neighbours, ``a + b + 1 = f``):

* **Encoder** (``causal=False``): centred on ``t``. Eq. 6 writes the window as
  ``r_{t-f/2} .. r_{t+f/2}``, which has ``f + 1`` elements for even ``f``. We
  keep its lower bound: ``a = floor(f/2)``, ``b = f - 1 - a``. Odd ``f`` is
  symmetric; even ``f`` gets the extra neighbour on the *left*; the paper's
  default ``f = 2`` therefore sees ``(r_{t-1}, r_t)``.
* **Decoder** (``causal=True``): ``a = f - 1``, ``b = 0``, i.e. the window
  ``t-f+1 .. t``; position ``t`` never sees a future token.

Sequence boundaries are zero-padded. Padded positions (``padding_mask`` True)
are zeroed *before* the window projection, so a padded position contributes
exactly what an out-of-sentence boundary position contributes (nothing but the
bias): a sentence gets the same ``l_c`` at its real positions whether it is
alone or left/right-padded in a batch. Outputs at padded positions are
meaningless and are masked out downstream by the attention key padding mask.

Incremental decoding (causal only) keeps the last ``f - 1`` inputs in the
incremental state (zeros before the first step, as the boundary padding), so
each step costs one ``f d x 2d`` product; :meth:`reorder_incremental_state`
follows the beam.

Implementation: the window is built with one ``unfold`` over time (one copy of
``f * T * B * d`` values) followed by a single GEMM, which is the same
arithmetic as ``F.conv1d`` without the ``T x B x C -> B x C x T`` transposes.

Mixed precision. Under ``torch.autocast`` the unit's input is float32 (it is
the output of a LayerNorm, or the residual stream, both float32 under
autocast), while the GEMM runs in the autocast dtype. The unit therefore
casts its input **once** to the compute dtype (:func:`compute_dtype`) and
zero-pads, masks and unfolds that half-precision copy, so the ``f``-fold
window is built and read at half the bytes and autocast has nothing left to
cast before ``W^r``; a caller that already holds the cast input (the DC
module shares it with its attentions) passes it as ``x_cast``. The only
float32 work left is what stability needs: the residual ``\hat r + r`` is
added in the input's dtype (float32 under autocast, as fairseq's layers add
their residuals; the add promotes inside one kernel, no separate copy) and
the LayerNorm runs in float32 (autocast's choice for ``layer_norm``). Without
autocast (float32, or a model cast with ``.half()`` as ``fairseq-train --fp16``
does) the compute dtype is the input's dtype and nothing is cast.
"""

from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout

__all__ = ["LocalContextUnit", "compute_dtype", "window_offsets"]


def window_offsets(kernel_size: int, causal: bool):
    """``(a, b)``: how many past (``a``) and future (``b``) neighbours of ``t``
    the window covers, ``a + b + 1 == kernel_size`` (see the module docstring)."""
    if kernel_size < 1:
        raise ValueError(f"--dc-kernel-size: expected a positive integer, got {kernel_size}")
    if causal:
        return kernel_size - 1, 0
    a = kernel_size // 2
    return a, kernel_size - 1 - a


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the GEMMs on ``x`` run in: the autocast dtype of ``x``'s device
    when autocast is on there and would cast ``x`` (a floating tensor other
    than float64, as autocast's own eligibility rule), else ``x.dtype``."""
    dev = x.device.type
    if (x.is_floating_point() and x.dtype != torch.float64
            and torch.is_autocast_enabled(dev)):
        return torch.get_autocast_dtype(dev)
    return x.dtype


@with_incremental_state
class LocalContextUnit(nn.Module):
    """Eq. 6: ``l_c = LayerNorm(GLU(window(r) W^r + b^r) + r)``.

    Args:
        embed_dim: ``d``.
        kernel_size: ``f`` (the paper uses 2).
        causal: decoder-side (window ``t-f+1..t``) if True, centred otherwise.
        dropout: dropout on ``\\hat r`` before the residual connection.

    Shapes: ``x`` is ``T x B x C``; ``padding_mask`` is ``B x T`` (True = pad).
    """

    def __init__(self, embed_dim: int, kernel_size: int = 2, causal: bool = False,
                 dropout: float = 0.0, export: bool = False):
        super().__init__()
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 1:
            raise ValueError(
                f"--dc-kernel-size: expected a positive integer, got {kernel_size!r}"
            )
        self.embed_dim = embed_dim
        self.kernel_size = kernel_size
        self.causal = causal
        self.padding_l, self.padding_r = window_offsets(kernel_size, causal)
        # W^r in R^{f d x 2d}, b^r in R^{2d}; input index = k * d + c for window slot k
        # (k = 0 is the oldest position t - a).
        self.window_proj = nn.Linear(kernel_size * embed_dim, 2 * embed_dim)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.layer_norm = LayerNorm(embed_dim, export=export)
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.xavier_uniform_(self.window_proj.weight)
        nn.init.constant_(self.window_proj.bias, 0.0)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, kernel_size={self.kernel_size}, "
                f"causal={self.causal}, window=(t-{self.padding_l}..t+{self.padding_r})")

    def _windows(self, ctx: Tensor, tgt_len: int) -> Tensor:
        """``ctx``: ``(tgt_len + f - 1) x B x C`` -> ``tgt_len x B x (f*C)``."""
        f = self.kernel_size
        if f == 1:
            return ctx
        bsz, c = ctx.size(1), ctx.size(2)
        # unfold over time: tgt_len x B x C x f (a view); slot order -> (f, C)
        win = ctx.unfold(0, f, 1).transpose(2, 3)
        return win.reshape(tgt_len, bsz, f * c)

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                x_cast: Optional[Tensor] = None) -> Tensor:
        """``x_cast``: ``x`` already cast to :func:`compute_dtype` (optional; the
        unit casts ``x`` itself otherwise). The windows are built from it; the
        residual uses ``x``."""
        tgt_len = x.size(0)
        # B x T -> T x B x 1; padded inputs contribute nothing to the windows
        pad = (padding_mask.transpose(0, 1).unsqueeze(-1).to(torch.bool)
               if padding_mask is not None else None)
        # one cast to the GEMM's dtype (a no-op without autocast): pad, mask and
        # unfold then move half-precision values and W^r's input needs no cast
        dtype = compute_dtype(x)
        xc = x.to(dtype) if x_cast is None else x_cast
        if xc.shape != x.shape or xc.dtype != dtype:
            raise ValueError(f"LocalContextUnit: x_cast must be x as {dtype}, "
                             f"got {xc.dtype} {tuple(xc.shape)} for {tuple(x.shape)}")

        if incremental_state is not None:
            x_in = xc if pad is None else xc.masked_fill(pad, 0.0)
            if not self.causal:
                raise RuntimeError("LocalContextUnit: incremental decoding needs causal=True")
            ctx = x_in
            if self.kernel_size > 1:
                buf = self._get_input_buffer(incremental_state)
                if buf is None:
                    buf = x_in.new_zeros(self.kernel_size - 1, x_in.size(1), x_in.size(2))
                ctx = torch.cat([buf, x_in], dim=0)
                self._set_input_buffer(incremental_state, ctx[-(self.kernel_size - 1):])
        elif self.padding_l or self.padding_r:
            # one new buffer: zero boundaries, then zero the padded inputs in place
            ctx = F.pad(xc, (0, 0, 0, 0, self.padding_l, self.padding_r))
            if pad is not None:
                ctx[self.padding_l:self.padding_l + tgt_len].masked_fill_(pad, 0.0)
        else:
            ctx = xc if pad is None else xc.masked_fill(pad, 0.0)

        r_hat = F.glu(self.window_proj(self._windows(ctx, tgt_len)), dim=-1)
        r_hat = self.dropout_module(r_hat)
        # Residual in x's dtype (float32 under autocast, promoted inside the add)
        # and LayerNorm in float32 under autocast: the upcasts stability needs.
        return self.layer_norm(r_hat + x)

    # ---- incremental state (buffer of the last f-1 inputs, (f-1) x B x C) ----
    def _get_input_buffer(self, incremental_state) -> Optional[Tensor]:
        state = self.get_incremental_state(incremental_state, "lc_state")
        if state is None:
            return None
        return state.get("input_buffer")

    def _set_input_buffer(self, incremental_state, buf: Tensor):
        return self.set_incremental_state(incremental_state, "lc_state", {"input_buffer": buf})

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        buf = self._get_input_buffer(incremental_state)
        if buf is not None:
            self._set_input_buffer(incremental_state, buf.index_select(1, new_order))
        return incremental_state
