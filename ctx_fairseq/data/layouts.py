"""The context options' names and the context layouts a model declares
(what ``--max-tokens`` counts for it): shared by the dataset, the task and
the models."""

from typing import Dict

DIRECTIONS = ("prev", "next", "both")
DOCUMENT_CONTEXTS = ("none", "online", "offline")
#: how a model lays out the context it is given, which is what ``--max-tokens`` must count:
#: ``concatenated``: the ``B x Tc`` tensor of the context sentences one after the other, as
#: the task delivers it (one row per sentence, padded to the batch's longest context);
#: ``sentences``: one row per context slot (``k`` per sentence and direction, ``k`` the
#: context size), every row padded to the batch's longest context sentence, ``B x k x L``
#: (``transformer_han``, which encodes each previous sentence on its own)
CONTEXT_LAYOUTS = ("concatenated", "sentences")
#: how a model encodes a document memory (``--document-memory``), the layout's ``memory``
#: entry: ``shared``: each sentence of the batch and of its memory once, a query's memory
#: row sharing the query's encoding (``mem_state_index``); ``separate``: the memory rows
#: by another network than the queries (``transformer_selective_doc``'s frozen memory, the
#: stage-1 model's copy), so a query that is also a memory row is encoded twice
MEMORY_LAYOUTS = ("shared", "separate")


def normalise_context_layout(layout) -> Dict[str, str]:
    """``{"src": ..., "tgt": ..., "memory": ...}`` of a layout given as None
    (concatenated, shared memory), one name for both sides, or a dict per
    side and for the memory (a missing side: concatenated; a missing memory:
    shared; see ``MEMORY_LAYOUTS``)."""
    if layout is None:
        layout = {}
    if isinstance(layout, str):
        layout = {"src": layout, "tgt": layout}
    if not isinstance(layout, dict) or set(layout) - {"src", "tgt", "memory"}:
        raise ValueError(f"context layout: expected one of {CONTEXT_LAYOUTS} or a dict with the "
                         f"keys 'src'/'tgt'/'memory', got {layout!r}")
    out = {side: str(layout.get(side) or "concatenated") for side in ("src", "tgt")}
    for side, name in out.items():
        if name not in CONTEXT_LAYOUTS:
            raise ValueError(f"context layout of the {side} side: expected one of "
                             f"{CONTEXT_LAYOUTS}, got {name!r}")
    out["memory"] = str(layout.get("memory") or "shared")
    if out["memory"] not in MEMORY_LAYOUTS:
        raise ValueError(f"context layout of the document memory: expected one of "
                         f"{MEMORY_LAYOUTS}, got {out['memory']!r}")
    return out


def merge_context_layouts(a, b) -> Dict[str, str]:
    """The layout whose count bounds both (an ensemble's models share the
    batches): ``sentences`` where either has it (it never counts fewer
    tokens than ``concatenated``, see :meth:`DocumentContextDataset._part_lengths`)."""
    a, b = normalise_context_layout(a), normalise_context_layout(b)
    out = {side: "sentences" if "sentences" in (a[side], b[side]) else "concatenated"
           for side in ("src", "tgt")}
    out["memory"] = "separate" if "separate" in (a["memory"], b["memory"]) else "shared"
    return out
