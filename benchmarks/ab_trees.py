"""Run one benchmark command on two source trees in one device call, each JSON line tagged with its tree.

Kernel work here is judged by same-call A/B: figures drift between machines and calls, so the code before and after
a change run on the same GPU minutes apart. Where the git history is (this machine):

    python benchmarks/ab_trees.py prepare --ref HEAD --out .carry/base

copies REF's tracked engine/, benchmarks/ (but its results/), wsserver/ and web_demo/ into OUT. On the GPU
machine, from the repository root:

    python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/profile_step.py --model /tmp/c2

runs the command in OUT's root and then in the working tree's, each tree first on PYTHONPATH (for the processes
the command starts, such as the server's engine processes, too), and prints every line
of its output, a JSON object line with {"tree": "base"} or {"tree": "new"} in front. A script the command names must
be inside the trees (a relative path): Python puts a script's own directory first on sys.path, so a script from
elsewhere would import the tree it lies in for both runs; `run` refuses one.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

# web_demo: the server serves its static files and will not start without them. The results (megabytes of raw
# lines) stay behind: a device call carries 64 MiB at most.
PACKAGES = ("engine", "benchmarks", "wsserver", "web_demo", ":(exclude)benchmarks/results")
REPO = Path(__file__).resolve().parent.parent


def prepare(ref: str, out: Path, repo: Path = REPO) -> None:
    """Replace `out` with REF's tracked PACKAGES (git archive; untracked and ignored files stay behind)."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", ref, *PACKAGES], check=True, capture_output=True
    ).stdout
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")


def outside_script(command: list[str], roots: list[Path]) -> str | None:
    """The first .py argument given by an absolute path outside every tree root (see the module docstring)."""
    for arg in command:
        path = Path(arg)
        inside = any(path.resolve().is_relative_to(root.resolve()) for root in roots)
        if path.suffix == ".py" and path.is_absolute() and not inside:
            return arg
    return None


def tag(line: str, tree: str) -> str:
    """`line` with {"tree": tree} in front if it is a JSON object, else unchanged."""
    text = line.rstrip("\n")
    if text.startswith("{"):
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            return text
        if isinstance(row, dict):
            return json.dumps({"tree": tree, **row})
    return text


def run_trees(command: list[str], trees: list[tuple[str, Path]]) -> int:
    """Run `command` in each (name, root), that root first on PYTHONPATH; print its output tagged. The worst rc."""
    script = outside_script(command, [root for _, root in trees])
    if script is not None:
        raise SystemExit(f"{script} lies outside the trees: it would import its own directory's code in every run")
    worst = 0
    for name, root in trees:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root.resolve()), env.get("PYTHONPATH", "")) if p)
        with subprocess.Popen(
            command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                print(tag(line, name), flush=True)
        worst = max(worst, proc.returncode)
    return worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    prep = sub.add_parser("prepare", help="copy REF's tracked sources into OUT (needs git)")
    prep.add_argument("--ref", default="HEAD")
    prep.add_argument("--out", type=Path, default=Path(".carry/base"))
    run = sub.add_parser("run", help="run a command on the base tree, then on the working tree")
    run.add_argument("--base", type=Path, default=Path(".carry/base"))
    run.add_argument("--new", type=Path, default=Path("."))
    run.add_argument("--new-first", action="store_true", help="run the working tree first")
    run.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command")
    args = p.parse_args()
    if args.action == "prepare":
        prepare(args.ref, args.out)
        return
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("run: no command given (put it after --)")
    trees = [("base", args.base), ("new", args.new)]
    sys.exit(run_trees(command, trees[::-1] if args.new_first else trees))


if __name__ == "__main__":
    main()
