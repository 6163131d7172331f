"""No machine paths in committed results (issue 35, item 9).

The committed study results (``recipes/*/study-*/``, ``recipes/**/results*``)
name paths relative to the repository's root or as ``$WORK/...`` (the
recipe's work directory), never an absolute path of the machine that ran
them; and the writer of the TVsub recipe's results.{json,md}
(``recipes/tvsub_zh_en/report.py``) writes them so.
"""

import importlib.util
import json
import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the top directories of machine paths (home directories, scratch and work
#: areas, temporary files), as a whole path component
_ROOTS = ("work", "tmp", "root", "home", "Users", "mnt", "scratch", "data", "private",
          "media", "nfs", "gpfs", "lustre")
_MACHINE_PATH = re.compile(r"(?<![\w.$~/-])/(?:" + "|".join(_ROOTS) + r")/")


def _machine_paths():
    """The pattern of a machine path: one of ``_ROOTS``, or this checkout's and
    this user's home directory (wherever they are)."""
    extra = {REPO, os.path.realpath(REPO), os.path.expanduser("~")}
    alts = [re.escape(p) for p in sorted(extra, key=len, reverse=True)
            if p and p != os.sep and p.startswith(os.sep)]
    return [_MACHINE_PATH] + [re.compile(r"(?<![\w.$~/-])" + a + r"(?![\w.~-])") for a in alts]


def _committed_files(top="recipes"):
    """The repository's files under ``top`` (relative paths): git's list, or
    every file there where git is not available (an unpacked archive)."""
    try:
        r = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--", top],
                           capture_output=True, timeout=30)
        if r.returncode == 0 and r.stdout:
            return sorted(p for p in r.stdout.decode("utf-8").split("\0") if p)
    except (OSError, subprocess.SubprocessError):
        pass
    out = []
    for dp, dns, fns in os.walk(os.path.join(REPO, top)):
        dns[:] = [d for d in dns if not d.startswith(".") and d != "__pycache__"]
        out += [os.path.relpath(os.path.join(dp, fn), REPO) for fn in fns]
    return sorted(p.replace(os.sep, "/") for p in out)


def _is_result(path):
    return "study-" in path or os.path.basename(path).startswith("results")


def _text(path):
    """The file's text; None for a binary file (a NUL byte, or not UTF-8)."""
    with open(os.path.join(REPO, path), "rb") as f:
        data = f.read()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_machine_paths_in_committed_results():
    results = [p for p in _committed_files() if _is_result(p)
               and os.path.isfile(os.path.join(REPO, p))]
    assert results, "no committed study results found under recipes/"
    patterns = _machine_paths()
    found, scanned = [], 0
    for path in results:
        text = _text(path)
        if text is None:
            continue
        scanned += 1
        for n, line in enumerate(text.splitlines(), 1):
            for pat in patterns:
                m = pat.search(line)
                if m:
                    snippet = line[max(0, m.start() - 40):m.start() + 80]
                    found.append(f"{path}:{n}: {m.group(0)!r} in ...{snippet}...")
                    break
    assert scanned, "every committed study result is binary?"
    assert not found, (
        "absolute machine paths in committed results (write them relative to the "
        "repository's root, or as $WORK/... for the recipe's work directory):\n"
        + "\n".join(found))


def test_the_pattern_finds_machine_paths():
    pats = _machine_paths()
    hit = lambda s: any(p.search(s) for p in pats)  # noqa: E731
    assert hit("--workdir /work/main/work/tvsub")
    assert hit('"checkpoint": "/tmp/x/checkpoint_best.pt"')
    assert hit("--raw=/home/me/tvsub")
    assert hit(os.path.join(REPO, "work", "x"))
    assert not hit("--workdir work/tvsub --data $WORK/data-bin")
    assert not hit("see https://github.com/home/tmp/ and recipes/work/x")
    assert not hit("--data ~/work/x rel/tmp/y")


def _report_module():
    spec = importlib.util.spec_from_file_location(
        "tvsub_report_paths", os.path.join(REPO, "recipes", "tvsub_zh_en", "report.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_portable_paths():
    pp = _report_module().portable_paths
    repo, work = "/r/repo", "/r/repo/work/tv/study"
    # the work directory (under the repository) first: $WORK
    assert pp("--data /r/repo/work/tv/study/data-bin --save-dir /r/repo/work/tv/study",
              work, repo) == "--data $WORK/data-bin --save-dir $WORK"
    assert pp("'/r/repo/work/tv/study/a,b' /r/repo/work/tv/study/", work, repo) == \
        "'$WORK/a,b' $WORK/"
    # elsewhere in the repository: relative to its root
    assert pp("run.sh --raw /r/repo/work/tv-raw --workdir /r/repo/work/tv", work, repo) == \
        "run.sh --raw work/tv-raw --workdir work/tv"
    assert pp("--workdir=/r/repo/work/tv", work, repo) == "--workdir=work/tv"
    assert pp("--a /r/repo --b /r/repo/ --c=/r/repo", work, repo) == "--a . --b ./ --c=."
    # anything else as it is
    same = ("--raw /tmp/tvsub /r/repository/x /r/repo-old/x /x/r/repo/y rel/r/repo/z "
            "/r/repo/work/tv/study2/x $WORK/data-bin work/tv ~/r/repo")
    assert pp(same, work, repo) == same.replace("/r/repo/work/tv/study2/x",
                                                "work/tv/study2/x")
    assert pp("--raw /tmp/tvsub --workdir /tmp/w", "/tmp/w/study", repo) == \
        "--raw /tmp/tvsub --workdir /tmp/w"
    assert pp("", work, repo) == "" and pp(None, work, repo) is None
    # a work directory outside the repository
    assert pp("--path /scratch/w/smoke/checkpoints/han/checkpoint_best.pt /r/repo/ctx_fairseq",
              "/scratch/w/smoke", repo) == \
        "--path $WORK/checkpoints/han/checkpoint_best.pt ctx_fairseq"
    # the repository's root by default
    mod = _report_module()
    assert mod.portable_paths(os.path.join(mod.REPO, "recipes", "x"), "/nowhere") == "recipes/x"


def test_report_writes_portable_commands(tmp_path, monkeypatch):
    """results.json and results.md: the run's command line, each model's
    commands and training options without the machine's paths."""
    report = _report_module()
    repo = tmp_path / "repo"
    work = repo / "work" / "tv" / "study"
    (work / "commands").mkdir(parents=True)
    (work / "checkpoints" / "han").mkdir(parents=True)
    monkeypatch.setattr(report, "REPO", str(repo))
    (work / "commands" / "run.sh").write_text(
        f"OMP_NUM_THREADS=1 recipes/tvsub_zh_en/run.sh --study --raw {repo}/work/tv-raw "
        f"--workdir {repo}/work/tv\n", encoding="utf-8")
    (work / "commands" / "han.fairseq-train.sh").write_text(
        f"fairseq-train {work}/data-bin --user-dir ctx_fairseq --save-dir $WORK/checkpoints/han\n",
        encoding="utf-8")
    (work / "checkpoints" / "han" / "train.args").write_text(
        f"arg=--restore-file\narg={work}/checkpoints/sentence/checkpoint_best.pt\n",
        encoding="utf-8")
    res = report.collect(str(work), "study", ["han"])
    assert res["command"] == ("OMP_NUM_THREADS=1 recipes/tvsub_zh_en/run.sh --study "
                              "--raw work/tv-raw --workdir work/tv")
    han = res["models"]["han"]
    assert han["commands"]["fairseq-train"] == (
        "fairseq-train $WORK/data-bin --user-dir ctx_fairseq --save-dir $WORK/checkpoints/han")
    assert han["train_options"] == \
        "--restore-file $WORK/checkpoints/sentence/checkpoint_best.pt"
    text = json.dumps(res) + report.markdown(res)
    assert str(tmp_path) not in text
    assert "--workdir work/tv\n" in report.markdown(res)
