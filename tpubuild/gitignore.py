"""Keeping tpubuild's own directories out of version control.

The state directory (`.tpubuild/`) and the cache directory each hold a `.gitignore`
whose one pattern, `*`, ignores the directory's whole content, itself included: the way
pytest's `.pytest_cache/` and ruff's `.ruff_cache/` ignore themselves. No edit of the
project's own .gitignore is needed, and `git add -A` never stages a cache object or the
private record key (`v1/keys/<uid>`), whatever created the directory: `tpubuild init`,
the first build, or a cache_dir moved elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from tpubuild.atomic import create_text_exclusive

GITIGNORE = ".gitignore"
IGNORE_EVERYTHING = "# Written by tpubuild: nothing in this directory belongs in version control.\n*\n"


def ignore_itself(directory: Path) -> bool:
    """Write `directory/.gitignore` holding `*` unless a .gitignore is there (one the user
    wrote, or edited, is theirs); True when written."""
    path = Path(directory) / GITIGNORE
    if path.exists() or path.is_symlink():
        return False
    return create_text_exclusive(path, IGNORE_EVERYTHING)


def make_ignored_dir(directory: Path) -> bool:
    """`mkdir -p directory`; when this call created it, it ignores itself. An existing
    directory is left as it is (a shared cache, or one the user keeps in git on purpose).
    True when the directory was created."""
    directory = Path(directory)
    if directory.is_dir():
        return False
    directory.mkdir(parents=True, exist_ok=True)
    ignore_itself(directory)
    return True
