"""Finding and reading the workspace file, `tpubuild.yaml` (like git finds `.git`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpubuild.config.finding import (
    DEFAULT_RECIPE_GLOBS,
    STATE_DIR,
    WORKSPACE_FILE,
    find_workspace_file,
)
from tpubuild.config.paths import leaves_root, name_problem, rebase, to_root_relative
from tpubuild.config.remote_url import TIMEOUT_KEYS, Timeouts
from tpubuild.config.schema import schema_diagnostics
from tpubuild.config.yamlload import Marks, format_path, read_yaml_file
from tpubuild.errors import ConfigError, Diagnostic, TpubuildError, UsageError


@dataclass
class Workspace:
    root: Path  # absolute; canonical recipe paths are relative to it
    file: Path
    output_dir: Path
    cache_dir: Path
    recipe_globs: list[str] = field(default_factory=lambda: list(DEFAULT_RECIPE_GLOBS))
    keep_versions: int | None = None
    link_type: str = "copy"  # how versions are published: copy (reflink or copy) | hardlink
    stage_timeout: float = 3600.0  # seconds before a stage's worker is killed
    worker_memory_limit: int | None = None  # bytes of address space per worker (workers/pool.py)
    remote_cache: str | None = None  # an fsspec URL (remote/cache.py)
    remote_push: bool = True  # upload stages built here to the remote cache
    # Public keys whose signed remote records are accepted (absolute paths); empty: any record.
    remote_trusted_keys: list[Path] = field(default_factory=list)
    remote_timeouts: Timeouts = field(default_factory=Timeouts)  # deadlines of remote calls (publish_to's too)
    # Where versions are also published for servers (publish/destination.py), an fsspec URL
    # or an OCI registry's repository (publish/oci_destination.py), and how to push there (`oci:`).
    publish_to: str | None = None
    oci: dict[str, Any] = field(default_factory=dict)
    # The private key that signs every published version (provenance/signature.py), if any.
    signing_key: Path | None = None
    signing_certificate: Path | None = None  # sign with this certificate (and its chain) instead of a bare key
    signing_chain: list[Path] = field(default_factory=list)
    executor: str = "local"  # where stages run: local worker processes | ray (workers/ray.py)
    ray_address: str | None = None  # the Ray cluster; None: RAY_ADDRESS, else a cluster on this machine
    ray_resources: dict[str, dict[str, float]] = field(default_factory=dict)  # stage -> Ray resources per task
    defaults: dict[str, Any] = field(default_factory=dict)
    defaults_marks: Marks = field(default_factory=Marks)

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    def display(self, path: Path) -> str:
        """`path` as printed in messages: workspace-relative when inside the workspace."""
        return display_path(path, self.root)


def display_path(path: Path, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return str(path)


def load_workspace(start: Path | None = None, override: Path | None = None) -> Workspace:
    """Read the workspace named by `override` (a directory or a file), else found upward."""
    if override is not None:
        override = Path(override)
        path: Path | None
        try:  # a null byte or an over-long name is a usage error, not a crash
            path = override / WORKSPACE_FILE if override.is_dir() else override
            found = path.is_file()
        except (OSError, ValueError) as exc:
            raise UsageError(f"no workspace file at {str(override)!r}: {getattr(exc, 'strerror', None) or exc}") from None
        if not found:
            raise UsageError(f"no workspace file at {path}")
    else:
        start = Path.cwd() if start is None else Path(start)
        path = find_workspace_file(start)
        if path is None:
            raise UsageError(
                f"no {WORKSPACE_FILE} in {os.path.abspath(start)} or any parent directory: `tpubuild init` "
                f"writes one here (where the recipes are, where outputs and the cache go), or pass --workspace PATH"
            )
    path = path.resolve()
    root = path.parent
    data, marks = read_yaml_file(path, display_path(path, root))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([Diagnostic(marks.value(()), "", "the workspace file must be a mapping")])
    if override is not None and "model" in data and "recipes" not in data:
        # `-w recipes/toy.yaml`: one line, not a schema error for each of the recipe's keys.
        raise UsageError(f"{override} is a recipe, not a workspace file: --workspace takes the workspace's "
                         f"directory or its {WORKSPACE_FILE} (to build one recipe: tpubuild build {override})")
    problems = schema_diagnostics("workspace", data, marks) + _recipe_glob_problems(data, marks, root)
    problems += _directory_problems(data, marks, root) + _remote_problems(data, marks) + _publish_problems(data, marks)
    if not problems:
        problems += _layout_problems(data, marks, root) + _trusted_key_problems(data, marks, root)
    if problems:
        raise ConfigError(problems)
    defaults_marks = _sub_marks(marks, ("defaults",))
    defaults = data.get("defaults", {})
    # Paths in defaults are relative to tpubuild.yaml: normalize them (messages quote the originals).
    rebase(defaults, root, root, defaults_marks.written)
    return Workspace(
        root=root,
        file=path,
        recipe_globs=list(data.get("recipes", DEFAULT_RECIPE_GLOBS)),
        output_dir=root / data.get("output_dir", "out"),
        cache_dir=root / data.get("cache_dir", f"{STATE_DIR}/cache"),
        keep_versions=data.get("keep_versions"),
        link_type=data.get("link_type", "hardlink"),  # issue 54: no byte moved twice (publish/versions.py)
        stage_timeout=float(data.get("stage_timeout", 3600.0)),
        worker_memory_limit=_size(data.get("worker_memory_limit")),
        remote_cache=_remote_setting(data)[0],
        remote_push=_remote_setting(data)[1],
        remote_trusted_keys=[root / key for key in _trusted_keys(data)],
        remote_timeouts=_remote_timeouts(data),
        publish_to=data.get("publish_to"),
        oci=dict(data.get("oci") or {}),
        signing_key=root / data["signing"]["key"] if "signing" in data else None,
        signing_certificate=root / data["signing"]["certificate"] if "certificate" in data.get("signing", {}) else None,
        signing_chain=[root / c for c in data.get("signing", {}).get("certificate_chain", [])],
        executor=data.get("executor", "local"),
        ray_address=data.get("ray_address"),
        ray_resources=data.get("ray_resources", {}),
        defaults=defaults,
        defaults_marks=defaults_marks,
    )


def _recipe_glob_problems(data: dict, marks: Marks, root: Path) -> list[Diagnostic]:
    """Recipe globs stay inside the workspace: `/etc/*.conf` or `../*` are errors (the
    files they match through symlinks are checked by config.recipe.discover)."""
    globs = data.get("recipes")
    if not isinstance(globs, list):
        return []  # absent, or a wrong type the schema reports
    problems = []
    for index, pattern in enumerate(globs):
        if not isinstance(pattern, str):
            continue
        problem = name_problem(os.path.join(root, pattern))
        if problem is None and leaves_root(to_root_relative(pattern, root, root)):
            problem = f"is outside the workspace ({root}): recipes must be inside it"
        if problem:
            path = ("recipes", index)
            problems.append(Diagnostic(marks.value(path), format_path(path), f"{pattern!r} {problem}"))
    return problems


def _directory_problems(data: dict, marks: Marks, root: Path) -> list[Diagnostic]:
    """output_dir and cache_dir are created later: refuse now what the OS would refuse then."""
    problems = []
    for key in ("output_dir", "cache_dir"):
        value = data.get(key)
        problem = name_problem(os.path.join(root, value)) if isinstance(value, str) else None
        if problem:
            problems.append(Diagnostic(marks.value((key,)), key, f"{value!r} {problem}"))
    return problems


def _layout_problems(data: dict, marks: Marks, root: Path) -> list[Diagnostic]:
    """output_dir, cache_dir and the recipe tree must not contain one another: tpubuild
    deletes what it finds in its own directories (a build's temp-session cleanup in the
    cache, pruning in the output), so an output_dir inside the cache lost published
    versions. A recipe glob's tree is its fixed directory; a directory below it counts
    only when the glob descends (`**`, or a wildcard in a directory part), since only then
    would it read tpubuild's files as recipes. Compared after symlinks are resolved."""
    def real(value: str) -> Path:
        return Path(os.path.realpath(os.path.join(root, value)))

    owned = [("output_dir", data.get("output_dir", "out")), ("cache_dir", data.get("cache_dir", f"{STATE_DIR}/cache"))]
    # (key, value, real path, whether what is below it matters): always for tpubuild's own
    # directories; for a recipe tree only when its glob descends.
    places = [(key, value, real(value), True) for key, value in owned]
    for index, pattern in enumerate(data.get("recipes", DEFAULT_RECIPE_GLOBS)):
        fixed = pattern.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
        tree = os.path.dirname(fixed) if fixed != pattern else os.path.dirname(pattern)
        descends = "**" in pattern or "/" in pattern[len(fixed):]
        places.append((f"recipes[{index}]", pattern, real(tree or "."), descends))
    problems = []
    for i, first in enumerate(places[:2]):
        for second in places[i + 1:]:
            # Said from the side of the line that moved a directory: the first one the file writes.
            (key, value, path, holds), (other_key, other_value, other, other_holds) = \
                (second, first) if first[0] not in data and second[0].split("[")[0] in data else (first, second)
            if path == other:
                relation = "is the same directory as"
            elif other in path.parents and other_holds:  # what is below `other` matters to it
                relation = "is inside"
            elif path in other.parents and holds:
                relation = "contains"
            else:
                continue
            node = _node(key)
            problems.append(Diagnostic(
                marks.value(node), format_path(node), f"{_what(key, value)} {relation} {_what(other_key, other_value)}:"
                " tpubuild deletes what it finds in its own directories, so they must not contain one another"))
    return problems


def _node(key: str) -> tuple:
    """The JSON path of a `_layout_problems` place name (`output_dir`, `recipes[2]`)."""
    return ("recipes", int(key[8:-1])) if key.startswith("recipes[") else (key,)


def _what(key: str, value: str) -> str:
    return f"the recipe tree of {value!r}" if key.startswith("recipes") else f"{key} {value!r}"


def _remote_setting(data: dict) -> tuple[str | None, bool]:
    """`remote_cache:` as (url, push): a URL string, or {url, push}."""
    value = data.get("remote_cache")
    if isinstance(value, dict):
        return value.get("url"), bool(value.get("push", True))
    return value, True


def _size(value: int | str | None) -> int | None:
    """`worker_memory_limit:` in bytes: an integer, or a number with a unit (8GiB, 512MiB)."""
    if value is None or isinstance(value, int):
        return value
    from tpubuild.config.sizes import parse_size

    return parse_size(value)


def _remote_timeouts(data: dict) -> Timeouts:
    value = data.get("remote_cache")
    if not isinstance(value, dict):
        return Timeouts()
    return Timeouts(**{field: float(value[key]) for key, field in TIMEOUT_KEYS.items() if key in value})


def _trusted_keys(data: dict) -> list[str]:
    value = data.get("remote_cache")
    return list(value.get("trusted_keys", [])) if isinstance(value, dict) else []


def _trusted_key_problems(data: dict, marks: Marks, root: Path) -> list[Diagnostic]:
    """Each trusted key must be a readable ECDSA or Ed25519 public key, said at its line."""
    from tpubuild.digests import SigningKeyError, load_public_key

    problems = []
    for index, key in enumerate(_trusted_keys(data)):
        path = ("remote_cache", "trusted_keys", index)
        try:
            load_public_key(root / key, format_path(path))
        except SigningKeyError as exc:
            problems.append(Diagnostic(marks.value(path), format_path(path), str(exc).split(": ", 1)[1]))
    return problems


def _remote_problems(data: dict, marks: Marks) -> list[Diagnostic]:
    """A remote cache URL with credentials in it (user:password@, a secret query
    parameter), an unknown scheme: errors at the line that wrote it."""
    value = data.get("remote_cache")
    path: tuple = ("remote_cache", "url") if isinstance(value, dict) else ("remote_cache",)
    url = _remote_setting(data)[0] if isinstance(value, (str, dict)) else None
    if not isinstance(url, str):
        return []  # absent, or a wrong type the schema reports
    from tpubuild.config.remote_url import url_problem

    problem = url_problem(url)
    return [Diagnostic(marks.value(path), format_path(path), problem)] if problem else []


def _publish_problems(data: dict, marks: Marks) -> list[Diagnostic]:
    """`publish_to:` as `remote_cache:`'s URL is checked (credentials in it, an unknown
    scheme; or an oci:// one's registry and repository), and `oci:`'s base image."""
    url = data.get("publish_to")
    from tpubuild.config.remote_url import oci_settings_problems, url_problem

    found = [Diagnostic(marks.value(path), format_path(path), problem)
             for path, problem in oci_settings_problems(data.get("oci"))]
    if not isinstance(url, str):
        return found  # absent, or a wrong type the schema reports
    problem = url_problem(url, oci=True)
    return [Diagnostic(marks.value(("publish_to",)), "publish_to", problem)] + found if problem else found


def _sub_marks(marks: Marks, prefix: tuple) -> Marks:
    """The marks below `prefix`, re-rooted so `prefix` becomes ()."""
    n = len(prefix)
    out = Marks()
    out.values = {p[n:]: loc for p, loc in marks.values.items() if p[:n] == prefix}
    out.keys = {p[n:]: loc for p, loc in marks.keys.items() if p[:n] == prefix and len(p) > n}
    return out


def implicit_workspace(directory: Path) -> Workspace:
    """A workspace for a recipe used outside any tpubuild.yaml: rooted at its directory."""
    root = Path(directory).resolve()
    return Workspace(
        root=root,
        file=root / WORKSPACE_FILE,
        output_dir=root / "out",
        cache_dir=root / STATE_DIR / "cache",
    )



class OutputOverlapError(TpubuildError):
    """output_dir or cache_dir overlaps a recipe's inputs (exit code 2), one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))

    def lines(self) -> list[str]:
        return [f"error: {p}" for p in self.problems]


def recipe_inputs(canonical: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, workspace-relative path) of what a recipe reads from the workspace: the
    SavedModel directory or the export script's directory and deps, and dataset files."""
    model = canonical.get("model", {})
    found = []
    if "saved_model" in model:
        found.append(("model.saved_model", model["saved_model"]))
    if "export" in model:
        export = model["export"]
        found.append(("model.export.script", os.path.dirname(export["script"]) or "."))
        found += [("model.export.deps", dep) for dep in export.get("deps", [])]
    quant = (canonical.get("converter") or {}).get("quantization_options") or {}
    sources = [("converter.quantization_options.representative_datasets", s)
               for s in quant.get("representative_datasets", {}).values()]
    sources += [("verify.representative_datasets", s)
                for s in (canonical.get("verify") or {}).get("representative_datasets", {}).values()]
    for where, source in sources:
        for key in ("tfrecord_file_path", "npz", "module_file"):
            if key in source:
                found.append((f"{where}.{key}", source[key]))
    return found


def check_output_overlap(ws: Workspace, recipes: list[Any]) -> list[str]:
    """One line per recipe input that is inside output_dir or cache_dir, or contains one:
    tpubuild deletes and rewrites what is in those directories, so they must never hold
    (or be held by) a file the user owns. Globs are checked by their fixed prefix."""
    owned = [(name, Path(os.path.realpath(d))) for name, d in (("output_dir", ws.output_dir), ("cache_dir", ws.cache_dir))
             if d is not None]
    problems = []
    for recipe in recipes:
        for where, rel in recipe_inputs(recipe.canonical):
            fixed = rel.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
            path = Path(os.path.realpath(Path(recipe.root) / fixed))
            for name, directory in owned:
                if path == directory or directory in path.parents:
                    problems.append(f"{recipe.rel_file}: {where} {rel} is inside {name} {ws.display(directory)}, "
                                    "whose content tpubuild deletes and rewrites; move one of them")
                elif path in directory.parents:
                    problems.append(f"{recipe.rel_file}: {name} {ws.display(directory)} is inside {where} {rel}, "
                                    "so tpubuild would write into the recipe's input; move one of them")
    return problems
