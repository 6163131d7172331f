"""Parse 1-based layer specifications such as ``all``, ``none``, ``1-3`` or ``1,3,5``.

Used by options that choose which layers of a stack get a special module, e.g.
``--dc-encoder-layers`` / ``--dc-decoder-layers`` of ``transformer_dc`` (the
numbering follows the paper's Table 5: layer 1 is the layer nearest the
embeddings) and ``--hybrid-encoder-layers``.

Grammar (whitespace is ignored, case-insensitive keywords)::

    spec   := "all" | "none" | "" | item ("," item)*
    item   := N | N "-" M          (1 <= N <= M <= num_layers)

The result is a sorted tuple of **0-based** layer indices, so that
``i in parse_layer_spec(...)`` can be tested directly while building layers.
"""

from typing import Iterable, Optional, Tuple, Union

__all__ = ["parse_layer_spec", "format_layer_spec"]


def _err(option_name: str, spec, why: str, num_layers: int) -> ValueError:
    return ValueError(
        f"{option_name}: invalid layer spec {spec!r}: {why}. Expected 'all', 'none', "
        f"a 1-based layer number, a range like '1-3' or a comma-separated list like "
        f"'1,3,5', with layers between 1 and {num_layers}."
    )


def parse_layer_spec(
    spec: Union[str, int, Iterable[int], None],
    num_layers: int,
    option_name: str = "--layers",
) -> Tuple[int, ...]:
    """Return the sorted, de-duplicated 0-based layer indices selected by ``spec``.

    Args:
        spec: ``"all"``, ``"none"`` (or ``""``/``None``), ``"2"``, ``"1-3"``,
            ``"1,3,5"``, ``"1-2,4"``; an int or an iterable of 1-based ints is
            accepted as well (for programmatic use).
        num_layers: how many layers the stack has.
        option_name: the option name to put in error messages.

    Raises:
        ValueError: naming ``option_name`` and what was expected, for layer 0,
            layers above ``num_layers``, reversed ranges (``3-1``) or
            non-numeric items.
    """
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 0:
        raise ValueError(
            f"{option_name}: number of layers must be a non-negative int, got {num_layers!r}"
        )
    if spec is None:
        return ()
    if isinstance(spec, bool):
        raise _err(option_name, spec, "expected a string, not a boolean", num_layers)
    if isinstance(spec, int):
        items = [str(spec)]
    elif isinstance(spec, str):
        s = "".join(spec.split()).lower()
        if s in ("", "none"):
            return ()
        if s == "all":
            return tuple(range(num_layers))
        items = s.split(",")
    else:
        try:
            items = [str(int(x)) for x in spec]
        except (TypeError, ValueError):
            raise _err(option_name, spec, "expected a string or a list of ints", num_layers)

    chosen = set()
    for item in items:
        if item == "":
            raise _err(option_name, spec, "empty item (stray comma?)", num_layers)
        if "-" in item[1:]:
            lo_s, hi_s = item.split("-", 1) if not item.startswith("-") else (item, "")
            if not lo_s.isdigit() or not hi_s.isdigit():
                raise _err(option_name, spec, f"{item!r} is not a range N-M of positive integers",
                           num_layers)
            lo, hi = int(lo_s), int(hi_s)
            if lo > hi:
                raise _err(option_name, spec, f"range {item!r} is reversed (start > end)",
                           num_layers)
        else:
            if not item.isdigit():
                raise _err(option_name, spec, f"{item!r} is not a positive integer", num_layers)
            lo = hi = int(item)
        for v in (lo, hi):
            if v < 1:
                raise _err(option_name, spec, f"layer {v} is out of range (layers are 1-based)",
                           num_layers)
            if v > num_layers:
                raise _err(option_name, spec,
                           f"layer {v} is out of range (the stack has {num_layers} layers)",
                           num_layers)
        chosen.update(range(lo - 1, hi))
    return tuple(sorted(chosen))


def format_layer_spec(indices: Iterable[int], num_layers: Optional[int] = None) -> str:
    """Inverse of :func:`parse_layer_spec`: 0-based indices -> compact 1-based spec."""
    idx = sorted(set(int(i) for i in indices))
    if not idx:
        return "none"
    if num_layers is not None and idx == list(range(num_layers)):
        return "all"
    parts = []
    start = prev = idx[0]
    for i in idx[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start + 1) if start == prev else f"{start + 1}-{prev + 1}")
        if i is not None:
            start = prev = i
    return ",".join(parts)
