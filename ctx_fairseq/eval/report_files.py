"""What the evaluation tools share to write their outputs: matplotlib set up
for image files (:func:`pyplot`) and a figure laid out, saved and closed
(:func:`save_figure`); the ``PREFIX.{md,json,png}`` files of the analysis
tools (:func:`write_table_files`: each file written in place; the
contrastive tools write theirs whole or not at all,
:func:`ctx_fairseq.eval.scoring.suite_report.write_report_files`); and what a tool
prints of them (:func:`print_written`)."""

import json
import logging
import os
from typing import Callable, Dict, Iterable, Optional

__all__ = ["pyplot", "save_figure", "write_table_files", "print_written"]


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (image files, no display),
    with matplotlib's logger at WARNING: importing fairseq sets the root
    logger to DEBUG (wav2vec2_classification)."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str, dpi: Optional[float] = 100) -> None:
    """``fig`` laid out (``tight_layout``), saved to ``path`` at ``dpi``
    (None: matplotlib's ``savefig.dpi``) and closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def write_table_files(out_dir: str, prefix: str, markdown: str, data,
                      plot: Optional[Callable[[str], None]] = None,
                      ensure_ascii: bool = True) -> Dict[str, str]:
    """``OUT_DIR/PREFIX.md`` (``markdown`` as given), ``PREFIX.json``
    (``data``, indented by 2) and, where ``plot`` is given, ``PREFIX.png``
    (``plot(path)`` draws it), in that order, ``out_dir`` made where missing;
    returns their paths by extension (``md``, ``json``, ``png``)."""
    os.makedirs(out_dir, exist_ok=True)
    prefix = os.path.join(out_dir, prefix)
    paths = {"md": prefix + ".md", "json": prefix + ".json"}
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(markdown)
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=ensure_ascii)
    if plot is not None:
        paths["png"] = prefix + ".png"
        plot(paths["png"])
    return paths


def print_written(paths: Iterable[str], table: Optional[str] = None,
                  one_line: bool = False) -> None:
    """``table`` (where given), then the files written: a ``wrote PATH``
    line each or, with ``one_line``, a blank line and ``written: PATH, ...``."""
    if table is not None:
        print(table)
    if one_line:
        print("\nwritten: " + ", ".join(paths))
    else:
        for p in paths:
            print(f"wrote {p}")
