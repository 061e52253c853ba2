"""benchmarks/ab_trees.py: a base tree from git, and one command run on two trees with its JSON lines tagged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.ab_trees import REPO, prepare, run_trees, tag

PROBE = """import json
import engine
print("warming up")
print(json.dumps({"where": engine.WHERE, "engine": engine.__file__}))
"""


def fake_tree(root: Path, where: str) -> Path:
    (root / "engine").mkdir(parents=True)
    (root / "engine" / "__init__.py").write_text(f"WHERE = {where!r}\n")
    (root / "probe.py").write_text(PROBE)
    return root


def test_run_imports_each_tree_and_tags_its_json_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, new = fake_tree(tmp_path / "base", "base code"), fake_tree(tmp_path / "new", "new code")
    assert run_trees([sys.executable, "probe.py"], [("base", base), ("new", new)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == lines[2] == "warming up"  # other lines pass through as they are
    rows = [json.loads(lines[1]), json.loads(lines[3])]
    assert [(r["tree"], r["where"]) for r in rows] == [("base", "base code"), ("new", "new code")]
    assert Path(rows[0]["engine"]).is_relative_to(base) and Path(rows[1]["engine"]).is_relative_to(new)


def test_run_returns_the_worst_exit_status(tmp_path: Path) -> None:
    base, new = fake_tree(tmp_path / "base", "b"), fake_tree(tmp_path / "new", "n")
    (new / "probe.py").write_text("raise SystemExit(3)\n")
    assert run_trees([sys.executable, "probe.py"], [("base", base), ("new", new)]) == 3


def test_run_refuses_a_script_outside_the_trees(tmp_path: Path) -> None:
    """Such a script would put its own directory first on sys.path and import the same code in both runs."""
    base, new = fake_tree(tmp_path / "base", "b"), fake_tree(tmp_path / "new", "n")
    stray = tmp_path / "stray.py"
    stray.write_text(PROBE)
    with pytest.raises(SystemExit, match="outside the trees"):
        run_trees([sys.executable, str(stray)], [("base", base), ("new", new)])


def test_tag_only_touches_json_objects() -> None:
    assert json.loads(tag('{"xrt": 1.5}\n', "base")) == {"tree": "base", "xrt": 1.5}
    assert tag("[1, 2]\n", "base") == "[1, 2]"
    assert tag("{not json\n", "new") == "{not json"


def test_prepare_copies_the_tracked_sources_of_a_ref(tmp_path: Path) -> None:
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    out = tmp_path / "base"
    (out / "stale").mkdir(parents=True)  # replaced, not merged into
    prepare("HEAD", out)
    assert (out / "engine" / "__init__.py").is_file() and (out / "benchmarks").is_dir()
    assert (out / "web_demo" / "index.html").is_file()  # a server started from the tree needs its static files
    assert not (out / "stale").exists() and not (out / "tests").exists()
    assert (out / "benchmarks" / "ws_latency.py").is_file() and not (out / "benchmarks" / "results").exists()
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-tree", "-r", "--name-only", "HEAD", "engine"], capture_output=True, text=True
    ).stdout.split()
    assert sorted(str(p.relative_to(out)) for p in (out / "engine").rglob("*") if p.is_file()) == sorted(tracked)
