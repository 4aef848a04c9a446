"""Git revisions as directories: the default base (merge base with the default branch)
and a materialized copy of a revision's tree (`git archive | tar -x`), never touching
the user's checkout."""

from __future__ import annotations

import subprocess
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
    """Extract the tree of `rev` into `dest` (created); returns `dest`. The tar binary
    extracts a 600-file tree in milliseconds where Python's tarfile takes half a second."""
    commit = commit_of(root, rev)
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(root), "archive", "--format=tar", commit],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True, check=False)
    archive.stdout.close()
    error = archive.stderr.read().decode(errors="replace").strip()
    if archive.wait() != 0 or untar.returncode != 0:
        message = (error or untar.stderr.decode(errors="replace").strip() or "no output").splitlines()[-1]
        raise UsageError(f"cannot extract git revision {rev}: {message}")
    return dest


def changed_paths(root: Path, base: str, head: str | None) -> set[str]:
    """Repository-relative paths whose content differs between `base` and `head` (None:
    the working tree, untracked files included; ignored files are not seen)."""
    args = ["diff", "--no-renames", "--name-only", "-z", commit_of(root, base)]
    if head is not None:
        args.append(commit_of(root, head))
    out = _git_z(root, *args)
    if head is None:
        out |= _git_z(root, "ls-files", "--others", "--exclude-standard", "-z")
    return out


def _git_z(root: Path, *args: str) -> set[str]:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)
    if done.returncode != 0:
        raise UsageError(f"git {args[0]} failed: {done.stderr.decode(errors='replace').strip()}")
    return {p for p in done.stdout.decode().split("\0") if p}
