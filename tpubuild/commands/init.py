"""`tpubuild init [DIRECTORY]`: make a directory a workspace, with nothing of the build in git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import click

# The workspace file `init` writes: seven of its keys (three set to their defaults, four
# commented out), each under a comment; `tpubuild schema workspace --content` lists them all.
WORKSPACE_TEMPLATE = """\
# The tpubuild workspace: `tpubuild build` run here or in a directory below builds its recipes.
# Every key is optional and shows its default; `tpubuild schema workspace --content` lists them all.

# Globs of the recipe files, relative to this file (*.lock.yaml files are never recipes).
recipes: ["recipes/*.yaml"]

# Published versions go to <output_dir>/<recipe>/<N>/, TF Serving's numbered layout.
output_dir: out

# The content-addressed cache of stage outputs. Like .tpubuild/, tpubuild's own state, it
# holds a .gitignore of `*`: git never sees it.
cache_dir: .tpubuild/cache

# How many published versions of each recipe to keep; older ones are pruned. Default: all.
# keep_versions: 5

# Seconds a stage may run before its worker is killed and the stage fails.
# stage_timeout: 3600

# A cache shared by a team and CI (fsspec URL: s3://..., gs://..., file:///...).
# remote_cache: s3://my-bucket/tpubuild

# Also publish each recipe's versions where TF Serving reads them, numbered there:
# <publish_to>/<recipe>/<N>/ (docs/publish-to-object-storage.md).
# publish_to: gs://my-bucket/models
"""

# What `init` prints last: the next steps of the quick start.
NEXT_STEPS = """\
next: write a recipe, e.g. recipes/my_model.yaml:
    model:
      export: {{script: models/my_model.py, function: export}}   # writes a SavedModel to its argument
    converter:
      tpu_functions:
        - function_alias: tpu_func   # tf.saved_model.SaveOptions(function_aliases={{"tpu_func": ...}})
  then `tpubuild validate` and `tpubuild build`; versions appear in {out}/my_model/<N>/."""


@click.command(
    "init",
    short_help="Make a directory a workspace: tpubuild.yaml, recipes/, and a cache git never sees.",
    epilog="\b\nExamples:\n  tpubuild init                    this directory\n"
    "  tpubuild init ../my-models       another directory, created if missing\n"
    "  tpubuild init --track-outputs    published versions are committed (e.g. with Git LFS)",
)
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False), default=".")
@click.option("--track-outputs", is_flag=True,
              help="Leave out/ out of .gitignore: the published versions are committed with the recipes.")
def command(directory: Path, track_outputs: bool) -> int:
    """Write a commented tpubuild.yaml and a recipes/ directory in DIRECTORY (default: here;
    an empty or an existing directory), and keep the build's files out of git: the state
    directory .tpubuild/ (which holds the cache) ignores itself with a .gitignore of `*`,
    and out/, where versions are published, is added to DIRECTORY's .gitignore.

    Nothing that exists is overwritten: an existing tpubuild.yaml, recipes/ or .gitignore
    is kept and said to be (a .gitignore only gets the out/ line appended, when it lacks it).
    """
    from tpubuild.config.finding import STATE_DIR, WORKSPACE_FILE, find_workspace_file
    from tpubuild.errors import UsageError
    from tpubuild.gitignore import GITIGNORE, ignore_itself, make_ignored_dir

    root = directory
    if root.exists() and not root.is_dir():
        raise UsageError(f"{root}: not a directory")
    outer = find_workspace_file(root.parent if not root.exists() else root)
    root.mkdir(parents=True, exist_ok=True)
    say = click.echo
    workspace_file = root / WORKSPACE_FILE
    if workspace_file.exists():
        say(f"kept {_shown(workspace_file)} (it exists)")
    else:
        if outer is not None and outer.parent.resolve() != root.resolve():
            say(f"note: {root.resolve()} is inside the workspace of {outer}; commands run here now use the "
                f"new {WORKSPACE_FILE}")
        if _create(workspace_file, WORKSPACE_TEMPLATE):
            say(f"created {_shown(workspace_file)}")
        else:
            say(f"kept {_shown(workspace_file)} (it exists)")
    output_dir, cache_dir = _directories(root)
    recipes = root / "recipes"
    if recipes.is_dir():
        say(f"kept {_shown(recipes)}/")
    elif recipes.exists() or recipes.is_symlink():
        click.echo(f"warning: kept {_shown(recipes)}, which is not a directory: recipes go where the "
                   f"`recipes:` globs of {WORKSPACE_FILE} say", err=True)
    else:
        recipes.mkdir()
        say(f"created {_shown(recipes)}/")
    state = root / STATE_DIR
    state.mkdir(exist_ok=True)
    if ignore_itself(state):
        say(f"created {_shown(state / GITIGNORE)} (the cache and tpubuild's state stay out of git)")
    else:
        say(f"kept {_shown(state / GITIGNORE)}")
    if _inside(cache_dir, root) and not _inside(cache_dir, state) and make_ignored_dir(cache_dir):
        say(f"created {_shown(cache_dir / GITIGNORE)} (the cache stays out of git)")
    if not track_outputs and _inside(output_dir, root):
        say(_ignore_outputs(root, output_dir))
    say(NEXT_STEPS.format(out=_shown(output_dir, root)))
    return 0


def _directories(root: Path) -> tuple[Path, Path]:
    """The output and cache directories of the workspace file in `root` (a kept one may
    name others than the defaults); the defaults when it does not load: `validate` says why."""
    from tpubuild.config.workspace import load_workspace
    from tpubuild.errors import TpubuildError

    try:
        ws = load_workspace(override=root)
    except TpubuildError as exc:
        click.echo(f"warning: {exc.lines()[0]}", err=True)
        return root / "out", root / ".tpubuild" / "cache"
    return Path(ws.output_dir), Path(ws.cache_dir)


def _ignore_outputs(root: Path, output_dir: Path) -> str:
    """Make `root/.gitignore` ignore the output directory: created, or the line appended."""
    from tpubuild.gitignore import GITIGNORE

    rel = output_dir.resolve().relative_to(root.resolve()).as_posix()
    line = f"/{rel}/"
    path = root / GITIGNORE
    added = f"# Published versions (tpubuild init; `tpubuild init --track-outputs` keeps them in git)\n{line}\n"
    if _create(path, added):
        return f"created {_shown(path)} (ignores {rel}/, the published versions)"
    data = path.read_bytes()
    if _ignores(root, rel, data.decode("utf-8", errors="replace")):
        return f"kept {_shown(path)} (it ignores {rel}/ already)"
    # Appended, as `cargo init` does: every byte of it kept, written atomically with its mode.
    from tpubuild.atomic import write_atomic

    mode = path.stat().st_mode & 0o7777
    write_atomic(path, data + (b"" if data.endswith(b"\n") or not data else b"\n") + added.encode("utf-8"))
    os.chmod(path, mode)
    return f"appended {line} to {_shown(path)} (its other lines kept)"


def _ignores(root: Path, rel: str, text: str) -> bool:
    """Whether the repository's own .gitignore files ignore `rel` already (asked of git in a
    work tree; a user's global excludes or .git/info/exclude do not count: they are not
    shared), else whether a line of `text` does."""
    try:
        done = subprocess.run(["git", "check-ignore", "-v", "--no-index", f"{rel}/"], cwd=root,
                              capture_output=True, text=True, timeout=30)
        if done.returncode == 1:
            return False
        if done.returncode == 0:
            source = done.stdout.split(":", 1)[0]
            return not os.path.isabs(source) and os.path.basename(source) == ".gitignore"
    except (OSError, subprocess.SubprocessError):
        pass  # no git: the lines decide
    forms = {rel, f"{rel}/", f"/{rel}", f"/{rel}/", f"{rel}/*", f"/{rel}/*", f"{rel}/**", f"/{rel}/**"}
    return any(line.strip() in forms for line in text.splitlines())


def _create(path: Path, text: str) -> bool:
    from tpubuild.atomic import create_text_exclusive

    return create_text_exclusive(path, text)


def _inside(path: Path, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False


def _shown(path: Path, root: Path | None = None) -> str:
    """`path` as the user names it: relative to the current directory when below it."""
    try:
        return Path(os.path.relpath(Path(path).resolve(), Path(root or Path.cwd()).resolve())).as_posix()
    except ValueError:
        return str(path)
