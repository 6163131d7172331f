"""ctx_fairseq.eval.report_files: the PREFIX.{md,json,png} files of the
analysis tools and the lines that name them."""

import json
import os

from ctx_fairseq.eval.report_files import print_written, pyplot, save_figure, write_table_files


def test_write_table_files(tmp_path):
    out = str(tmp_path / "new" / "dir")
    paths = write_table_files(out, "x", "| a |\n", {"w": "\u00e9"})
    assert paths == {"md": os.path.join(out, "x.md"), "json": os.path.join(out, "x.json")}
    assert open(paths["md"], encoding="utf-8").read() == "| a |\n"
    assert open(paths["json"], encoding="utf-8").read() == '{\n  "w": "\\u00e9"\n}'

    def plot(png):
        fig, ax = pyplot().subplots()
        ax.plot([0, 1])
        save_figure(fig, png)

    paths = write_table_files(out, "y", "t", {"w": "\u00e9"}, plot, ensure_ascii=False)
    assert list(paths) == ["md", "json", "png"]
    assert json.load(open(paths["json"], encoding="utf-8")) == {"w": "\u00e9"}
    assert "\u00e9" in open(paths["json"], encoding="utf-8").read()
    with open(paths["png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_print_written(capsys):
    print_written({"md": "a.md", "json": "a.json"}.values(), "TABLE")
    assert capsys.readouterr().out == "TABLE\nwrote a.md\nwrote a.json\n"
    print_written(["a.md", "a.json"], "TABLE", one_line=True)
    assert capsys.readouterr().out == "TABLE\n\nwritten: a.md, a.json\n"
    print_written(["m"])
    assert capsys.readouterr().out == "wrote m\n"
