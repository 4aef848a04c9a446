"""Finding the workspace file and the recipe files, for the config layer and the no-op
memo alike (which must see exactly what the config layer sees, or a new recipe could
hide behind a remembered no-op). TensorFlow-free and config-free, so the no-op fast
path imports nothing heavy."""

from __future__ import annotations

import glob
import os
import re
import stat
from pathlib import Path

LOCK_SUFFIX = ".lock.yaml"
WORKSPACE_FILE = "tpubuild.yaml"
STATE_DIR = ".tpubuild"  # tpubuild's own files (dep file, stat cache, locks) live here
DEFAULT_RECIPE_GLOBS = ("recipes/*.yaml",)


def find_workspace_file(start: Path) -> Path | None:
    """The nearest tpubuild.yaml in `start` or a parent directory."""
    directory = Path(os.path.abspath(start))
    for candidate in (directory, *directory.parents):
        path = candidate / WORKSPACE_FILE
        if path.is_file():
            return path
    return None


def workspace_file_for(start: Path, override: Path | None) -> Path | None:
    """The workspace file `--workspace` names (a directory or a file), else the nearest
    one upward (the fast paths' lookup); None when there is none or the name cannot be
    used: the full load (config/workspace.py load_workspace) then says why."""
    if override is None:
        return find_workspace_file(start)
    try:
        path = override / WORKSPACE_FILE if override.is_dir() else override
        return path if path.is_file() else None
    except (OSError, ValueError):  # a null byte, an over-long name
        return None


def lock_file_of(recipe_file: Path) -> Path:
    """`recipes/toy.yaml` -> `recipes/toy.lock.yaml`, one per recipe (no merge conflicts)."""
    name = recipe_file.name
    for suffix in (".yaml", ".yml"):
        if name.endswith(suffix):
            return recipe_file.with_name(name[: -len(suffix)] + LOCK_SUFFIX)
    return recipe_file.with_name(recipe_file.stem + LOCK_SUFFIX)


_EXTENDS = re.compile(r"""^extends:[ \t]*(?:"([^"\n]*)"|'([^'\n]*)'|([^\s#'"][^#\n]*?))[ \t]*(?:#.*)?$""", re.M)


def extends_chain(recipe_file: Path, limit: int = 32) -> list[tuple[Path, bytes]] | None:
    """The recipe file and the bases its top-level `extends:` line names, each with its
    bytes, read without a YAML parser (`build --check`'s quick path, lock/quickcheck.py);
    None when one cannot be read. A guess: where it is wrong (an `extends` written another
    way), the files hash differently from what the lock file recorded and the full check
    decides."""
    chain: list[tuple[Path, bytes]] = []
    path: Path | None = recipe_file
    while path is not None and len(chain) < limit:
        try:
            data = path.read_bytes()
            found = _EXTENDS.search(data.decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            return None
        chain.append((path, data))
        path = None
        if found is not None:
            base = (chain[-1][0].parent / next(g for g in found.groups() if g is not None).strip()).resolve()
            path = None if any(base == seen for seen, _ in chain) else base
    return chain


def recipe_matches(root: Path, pattern: str, workspace_file: Path) -> list[str]:
    """The files a recipes glob matches that can be recipes: not a lock file, and not the
    workspace file itself (`recipes: ["*.yaml"]` at the root matches tpubuild.yaml)."""
    return [match for match, _ in _matches(root, pattern, os.path.realpath(workspace_file), {})]


def glob_matches(pattern: str, rel: str) -> bool:
    """Whether `glob.glob(root / pattern, recursive=True)` would list the file `rel` (a
    relative POSIX path whose names do not start with '.'), were it there: for a recipe
    file about to be written (`tpubuild import`). `**` is any number of directories, or
    anything as the last component; the other components match one name each (fnmatch)."""
    import fnmatch

    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    names = rel.split("/")

    def match(i: int, j: int) -> bool:
        if i == len(parts):
            return j == len(names)
        if parts[i] == "**":
            return any(match(i + 1, k) for k in range(j, len(names) + 1)) or i == len(parts) - 1
        return j < len(names) and fnmatch.fnmatchcase(names[j], parts[i]) and match(i + 1, j + 1)

    return match(0, 0)


def discover_files(root: Path, patterns: list[str], workspace_file: Path) -> list[Path]:
    """Recipe files matched by `patterns` (relative to `root`), resolved and sorted."""
    own = os.path.realpath(workspace_file)
    real_dirs: dict[str, str] = {}
    return sorted({Path(real) for pattern in patterns for _, real in _matches(root, pattern, own, real_dirs)})


def _matches(root: Path, pattern: str, own: str, real_dirs: dict[str, str]) -> list[tuple[str, str]]:
    """(match, its real path) of recipe_matches. The real path is its directory's, resolved
    once per directory, joined with its name unless the file itself is a symbolic link: one
    lstat per file instead of one per component of its path."""
    found = []
    for match in glob.glob(str(Path(root) / pattern), recursive=True):
        try:
            mode = os.lstat(match).st_mode
        except OSError:
            continue
        if stat.S_ISLNK(mode):
            if not os.path.isfile(match):
                continue
            real = os.path.realpath(match)
        elif stat.S_ISREG(mode):
            directory, name = os.path.split(match)
            real_dir = real_dirs.get(directory)
            if real_dir is None:
                real_dir = real_dirs[directory] = os.path.realpath(directory)
            real = os.path.join(real_dir, name)
        else:
            continue
        if not match.endswith(LOCK_SUFFIX) and real != own:
            found.append((match, real))
    return found


# The recipe globs of a workspace file, read without a YAML parser (`build --check`'s quick
# path; importing PyYAML costs more than checking 30 lock files). It reads the plain form
# people write, `recipes: [a, "b"]` or a block list of such scalars, and gives up (None)
# on anything else YAML allows: the quick path then loads the file with PyYAML. Giving up
# is always safe; reading other globs than YAML would is not (a recipe left out of the
# check), so every form accepted here is one where YAML's reading is the same string.
_TOP_KEY = re.compile(r"([$A-Za-z_][\w$-]*):(?:[ ]+(.*?))?[ ]*")
_ITEM = re.compile(r"(-[ ]+)(.*?)[ ]*")
_COMMENT = re.compile(r"(.*?)(?:[ ]+#.*)?")
# A plain scalar YAML reads as this string in block and flow context: no indicator first,
# no flow or comment syntax inside, and a path-like form no YAML 1.1 resolver turns into
# a bool, number, null or date (each has a `/`, a glob character or a .yaml/.yml suffix).
_PLAIN = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./*?~-]*")
_QUOTED = re.compile(r'"([^"\\]+)"|\'([^\']+)\'')
# Values of other keys that start a construct which may span lines at column 0 or refer
# elsewhere (flow collections, quoted scalars, block scalars, anchors, aliases, tags).
_OPENERS = tuple("[{\"'|>&*!%@`")


def recipe_globs_in(text: str) -> list[str] | None:
    """The `recipes:` globs of the workspace file `text` (the default when it has none),
    or None when the file uses a form this reader does not (see above)."""
    if not text.isascii() or "\t" in text or "\r" in text:
        return None
    globs: list[str] | None = None
    block: int | str | None = None  # the indentation of `recipes:`'s block list items, once seen ("" before the first)
    inline = False  # the last top-level key was `recipes:` with its value on the line
    keyed = False  # a top-level key came: indented lines are its value's
    for line in text.split("\n"):
        comment = _COMMENT.fullmatch(line)
        if comment is None:  # cannot happen: the pattern matches any line
            return None
        body = comment.group(1)
        if not body.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if block is not None and (item := _ITEM.fullmatch(body, indent)) and block in ("", indent):
            scalar = _scalar(item.group(2))
            if scalar is None or globs is None:
                return None
            globs.append(scalar)
            block = indent
            continue
        if indent:
            if inline or block is not None or not keyed:
                return None  # a continuation of `recipes:`'s value or item, or a mapping under it
            continue  # inside another key's block value
        top = _TOP_KEY.fullmatch(body)
        if top is None:
            return None  # `---`, `%YAML`, `? key`, `<<: *base`, a quoted key, a sequence at top level
        if block == "":
            return None  # `recipes:` with no items: null
        key, value = top.group(1), top.group(2)
        block, inline, keyed = None, False, True
        if key != "recipes":
            if value and value.startswith(_OPENERS):
                return None
            continue
        if globs is not None:
            return None  # a duplicate key
        globs = []
        if not value:
            block = ""
        elif value.startswith("[") and value.endswith("]"):
            items = [_scalar(part.strip()) for part in value[1:-1].split(",")]
            if not items or None in items:
                return None
            globs, inline = [item for item in items if item is not None], True
        else:
            return None
    if block == "":
        return None
    return list(DEFAULT_RECIPE_GLOBS) if globs is None else globs


def _scalar(text: str) -> str | None:
    """The string a glob list item reads as, when it is one of the forms above."""
    quoted = _QUOTED.fullmatch(text)
    if quoted:
        return quoted.group(1) if quoted.group(1) is not None else quoted.group(2)
    if _PLAIN.fullmatch(text) and ("/" in text or "*" in text or "?" in text or text.endswith((".yaml", ".yml"))):
        return text
    return None


# Directories a search of the workspace for stray recipe files never enters: hidden ones
# (.git, .tpubuild), Python's and node's caches.
_NOT_SEARCHED = ("__pycache__", "node_modules")
_SEARCH_LIMIT = 100_000  # directory entries looked at, at most: an error message must not take minutes


def yaml_files_named(root: Path, stem_pattern: str, skip: tuple[Path, ...] = ()) -> list[Path]:
    """The .yaml/.yml files below `root` (not lock files) whose stem matches the shell
    pattern `stem_pattern`, sorted; `skip` directories (the outputs, the cache) are not
    entered. For the hint of a target that names no recipe: a file outside the globs."""
    import fnmatch

    skipped = {os.path.realpath(s) for s in skip}
    found, seen = [], 0
    for directory, dirs, files in os.walk(root):
        seen += len(dirs) + len(files)
        if seen > _SEARCH_LIMIT:
            break
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _NOT_SEARCHED
                         and os.path.realpath(os.path.join(directory, d)) not in skipped)
        for name in files:
            stem, suffix = os.path.splitext(name)
            if suffix in (".yaml", ".yml") and not name.endswith(LOCK_SUFFIX) and fnmatch.fnmatchcase(stem, stem_pattern):
                found.append(Path(directory) / name)
    return sorted(found)
