"""Build a workspace twice from scratch and compare the results byte for byte.

    python scripts/check_reproducible.py [WORKSPACE] [--env-b TF_ENABLE_ONEDNN_OPTS=0] [--ignore GLOB]

Each build runs in its own copy of the workspace (tpubuild.yaml and the recipe
directories, no cache, no outputs, no lock files) with its own PYTHONHASHSEED; the first
with one worker, the second with two, so every export and stage runs in a process whose
TensorFlow counters differ from the first build's. `--env-a/--env-b KEY=VALUE` change
one side's environment: with TF_ENABLE_ONEDNN_OPTS=0 against =1 (other CPU kernels) the
differences listed are what a build on another machine would measure differently.
Prints every lock file stage whose output differs and every differing published file;
exit code 1 when anything differs, 0 when the two builds are identical.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

SIDES = {"A": ("1", ["-j", "1"]), "B": ("4242", ["-j", "2"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workspace", nargs="?", default=".", type=Path)
    parser.add_argument("--env-a", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--env-b", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ignore", action="append", default=[], metavar="GLOB", help="published files to skip")
    parser.add_argument("--keep", type=Path, help="build in this directory and keep it")
    args = parser.parse_args()
    source = args.workspace.resolve()
    root = args.keep or Path(tempfile.mkdtemp(prefix="tpubuild-repro-"))
    try:
        sides = {}
        for side, extra in (("A", args.env_a), ("B", args.env_b)):
            sides[side] = _copy(source, root / side)
            _build(sides[side], side, dict(item.split("=", 1) for item in extra))
        differences = _compare_locks(sides["A"], sides["B"]) + _compare_outputs(sides["A"], sides["B"], args.ignore)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print("\n".join(differences) or "identical: every lock file and every published file")
    return 1 if differences else 0


def _copy(source: Path, dest: Path) -> Path:
    """The workspace's own files only: what a fresh clone holds before its first build."""
    ignore = shutil.ignore_patterns(".git", ".tpubuild", "out", "*.lock.yaml", "__pycache__", "tpubuild")
    shutil.copytree(source, dest, ignore=ignore)
    return dest


def _build(workspace: Path, side: str, env_changes: dict[str, str]) -> None:
    seed, jobs = SIDES[side]
    env = {**os.environ, "PYTHONHASHSEED": seed, "TF_CPP_MIN_LOG_LEVEL": "3", **env_changes}
    done = subprocess.run([sys.executable, "-m", "tpubuild", "build", *jobs], cwd=workspace, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"build {side} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")


def _compare_locks(a: Path, b: Path) -> list[str]:
    found = []
    locks = sorted({p.relative_to(a) for p in a.rglob("*.lock.yaml")} | {p.relative_to(b) for p in b.rglob("*.lock.yaml")})
    for rel in locks:
        if not (a / rel).is_file() or not (b / rel).is_file():
            found.append(f"lock file {rel}: only in build {'A' if (a / rel).is_file() else 'B'}")
            continue
        doc_a, doc_b = (yaml.safe_load((side / rel).read_text()) for side in (a, b))
        stages = [sa["stage"] for sa, sb in zip(doc_a["stages"], doc_b["stages"]) if sa["output"] != sb["output"]]
        found += [f"lock file {rel}: stage {stage} output differs" for stage in stages]
        if not stages and (a / rel).read_bytes() != (b / rel).read_bytes():
            found.append(f"lock file {rel}: differs")
    return found


def _output_dir(workspace: Path) -> Path:
    config = yaml.safe_load((workspace / "tpubuild.yaml").read_text()) or {}
    return workspace / config.get("output_dir", "out")


def _compare_outputs(a: Path, b: Path, ignore: list[str]) -> list[str]:
    files_a = {p.relative_to(a) for p in _output_dir(a).rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in _output_dir(b).rglob("*") if p.is_file()}
    found = []
    for rel in sorted(files_a | files_b):
        if any(fnmatch.fnmatch(str(rel), pattern) for pattern in ignore):
            continue
        if rel not in files_a or rel not in files_b:
            found.append(f"published file {rel}: only in build {'A' if rel in files_a else 'B'}")
        elif (a / rel).read_bytes() != (b / rel).read_bytes():
            found.append(f"published file {rel}: differs")
    return found


if __name__ == "__main__":
    sys.exit(main())
