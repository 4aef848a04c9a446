"""Git revisions as directories: the default base (merge base with the default branch)
and a materialized copy of a revision's tree (`git archive | tar -x`), never touching
the user's checkout."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from tpubuild.errors import UsageError


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def repo_root(start: Path) -> Path:
    top = _git(start, "rev-parse", "--show-toplevel")
    if top is None:
        raise UsageError(f"{start} is not inside a git repository (tpubuild diff compares git revisions)")
    return Path(top).resolve()


def default_base(root: Path) -> str:
    """The merge base of HEAD with the default branch: origin/HEAD, else main, else master."""
    for branch in ("origin/HEAD", "main", "master"):
        if _git(root, "rev-parse", "--verify", "--quiet", branch + "^{commit}") is None:
            continue
        base = _git(root, "merge-base", "HEAD", branch)
        if base:
            return base
    raise UsageError("no default branch to compare with (origin/HEAD, main or master): give BASE")


def commit_of(root: Path, rev: str) -> str:
    commit = _git(root, "rev-parse", "--verify", "--quiet", rev + "^{commit}")
    if commit is None:
        raise UsageError(f"unknown git revision {rev!r}")
    return commit


def materialize(root: Path, rev: str, dest: Path) -> Path:
    """Extract the tree of `rev` into `dest` (a fresh directory); returns `dest`."""
    commit = commit_of(root, rev)
    done = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", commit], capture_output=True, check=False)
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise UsageError(f"git archive {rev} failed: {message[-1] if message else 'no output'}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(dest, filter="data")
    return dest
