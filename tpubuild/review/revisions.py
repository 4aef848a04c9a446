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


# What loading a revision's configuration reads: the workspace file, recipes, their
# `extends` bases and lock files. Every other file only has to exist (the config checks
# test that a SavedModel directory holds saved_model.pb; stage inputs are compared by
# path through changed_paths, never hashed), so it is an empty placeholder: writing a
# 200-model tree's real contents costs more than the whole diff.
CONTENT_SUFFIXES = (".yaml", ".yml")


def materialize(root: Path, rev: str, dest: Path) -> Path:
    """The tree of `rev` under `dest` (created): configuration files with their content,
    every other file as an empty placeholder. Returns `dest`."""
    commit = commit_of(root, rev)
    listing = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "-z", "--full-tree", commit],
                             capture_output=True, check=False)
    if listing.returncode != 0:
        raise UsageError(f"cannot list git revision {rev}: {listing.stderr.decode(errors='replace').strip()}")
    entries = [e.split("\t", 1) for e in listing.stdout.decode().split("\0") if e]
    paths = [path for meta, path in entries if meta.split()[1] == "blob"]  # not submodules
    models = {path[: -len("saved_model.pb")] for path in paths if path.rsplit("/", 1)[-1] == "saved_model.pb"}
    wanted, made = [], set()
    for path in paths:
        if _inside_saved_model(path, models):
            continue  # variables/, assets/, fingerprint.pb: config never looks past saved_model.pb
        target = dest / path
        if target.parent not in made:
            target.parent.mkdir(parents=True, exist_ok=True)
            made.add(target.parent)
        if path.endswith(CONTENT_SUFFIXES):
            wanted.append((path, target))
        else:
            target.touch()
    for (path, target), content in zip(wanted, blobs(root, commit, [p for p, _ in wanted])):
        target.write_bytes(content or b"")
    return dest


def _inside_saved_model(path: str, models: set[str]) -> bool:
    """A file of a SavedModel directory other than its saved_model.pb (`models`: the
    directories holding one, each with a trailing slash, or "" for the top)."""
    if path.rsplit("/", 1)[-1] == "saved_model.pb" and path[: -len("saved_model.pb")] in models:
        return False
    prefix = path
    while "/" in prefix:
        prefix = prefix.rsplit("/", 1)[0]
        if prefix + "/" in models:
            return True
    return "" in models


def blobs(root: Path, commit: str, paths: list[str]) -> list[bytes | None]:
    """The contents of `paths` at `commit` (None: absent there), in one `git cat-file --batch`."""
    if not paths:
        return []
    request = "".join(f"{commit}:{p}\n" for p in paths).encode()
    done = subprocess.run(["git", "-C", str(root), "cat-file", "--batch"], input=request, capture_output=True,
                          check=True)
    out: list[bytes | None] = []
    pos = 0
    data = done.stdout
    for _ in paths:
        end = data.index(b"\n", pos)
        header = data[pos:end].split()
        if header[-1] == b"missing":
            out.append(None)
            pos = end + 1
            continue
        size = int(header[2])
        out.append(data[end + 1:end + 1 + size])
        pos = end + 1 + size + 1  # the object, then a newline
    return out


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
