"""`tpubuild import`'s work: a converter text proto read into the text of
`recipes/NAME.yaml`, checked as the next command will read it, then created in the
workspace's own `recipes/` directory without following a link.

What the file written promises: `validate`, `render` and `build` accept it (once its
SavedModel is there: it may be exported after the import), and it means exactly the text.
Before anything is written, the recipe's text is loaded as those commands load it (YAML,
the workspace's `defaults:`, the schema, the checks), and rendered back, as `tpubuild
render` would run here, into the dialect it was read as; the message that comes back must
equal the one the text parsed to, field for field (protobuf's message equality, on the
messages compiled from schemas/*.proto). The workspace's converter defaults are kept from
applying: each one the text leaves unset is written in the recipe with the value that
renders as unset (a list empty, a state DEFAULT), and said; one that no value can undo
(a section whose presence means something, such as `xla_sharding_options`) is refused,
naming it. A file name is never part of what the recipe means: it is shown in the header
comment escaped (fs/names.py shown), and every string of the body is a YAML scalar that
loads back as itself (the loaded data is compared with what was meant).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tpubuild.config.finding import LOCK_SUFFIX, glob_matches, lock_file_of
from tpubuild.config.paths import boundary_problem
from tpubuild.config.recipe import load_converter_options, load_recipe_text, recipe_names
from tpubuild.config.workspace import Workspace
from tpubuild.config.yamlload import MAX_DOCUMENT_BYTES, format_path, load_yaml
from tpubuild.converter_protos import GUIDE, V2
from tpubuild.converter_text import Imported, parse_message, rebase_datasets
from tpubuild.errors import ConfigError, Diagnostic, Location, UsageError
from tpubuild.fs import NotAFile, create_exclusive_at, lstat_at, open_dir, opened, shown
from tpubuild.render import Spelling, render

RECIPES_DIR = "recipes"
FORMAT = {GUIDE: "textproto", V2: "textproto-v2"}
# The converter defaults a recipe can undo exactly: the value that renders as unset (by
# path under `converter:`; "*" is any list index or mapping key).
NEUTRAL: dict[tuple, Any] = {
    ("tpu_functions",): [],
    ("batch_options",): [],
    ("io_shape_optimization",): "DEFAULT",
    ("bfloat16_optimization",): "DEFAULT",
    ("disable_default_optimizations",): False,
    ("enable_device_placement_safety_checks",): False,
    ("bfloat16_optimization_options", "scope"): "DEFAULT",
    ("bfloat16_optimization_options", "skip_safety_checks"): False,
    ("bfloat16_optimization_options", "filterlist"): [],
    ("xla_sharding_options", "device_assignment"): [],
    ("quantization_options", "unit_wise_quantization_specs"): [],
}
# Sections that render as nothing when every field in them is unset (render.py: only an
# empty mapping `{}` writes an empty message).
OPTIONAL_SECTIONS = {("bfloat16_optimization_options",)}
# tpubuild's own keys under `converter:`, not converter fields: a default of theirs changes
# no message (render.EXTENSIONS), and applies.
EXTENSIONS = {("quantization_options", "allow_unquantized")}
# A default the text leaves unset that the text itself can state (its converter default).
STATEABLE = {
    ("xla_sharding_options", "num_cores_per_replica"): "num_cores_per_replica: 1",
    ("quantization_options", "method"): "quantization_method { preset_method: METHOD_STATIC_RANGE_INT8 }",
    ("quantization_options", "op_set"): "op_set: XLA",
    ("quantization_options", "tags"): 'tags: "serve"',
    ("quantization_options", "signature_keys"): 'signature_keys: "serving_default"',
}


@dataclass
class Slot:
    """Where the recipe goes: `recipes/NAME.yaml` of the workspace, checked free."""

    ws: Workspace
    name: str

    @property
    def file_name(self) -> str:
        return f"{self.name}.yaml"

    @property
    def path(self) -> Path:
        return self.ws.root / RECIPES_DIR / self.file_name

    @property
    def shown(self) -> str:
        return f"{RECIPES_DIR}/{self.file_name}"


@dataclass
class Result:
    path: Path
    dialect: str
    notes: list[str] = field(default_factory=list)


def claim(ws: Workspace, name: str) -> Slot:
    """The slot of recipe `name` (a valid name), or UsageError saying why it cannot be
    used: `recipes` is not a directory of the workspace's own (a file, a link), the file
    exists, the workspace's recipe globs would not find it, or another recipe has that
    name or that lock file."""
    slot = Slot(ws, name)
    again = "give another --name (import never overwrites a recipe)"
    with _said(RECIPES_DIR), opened(_open_root(ws)) as root_fd:
        fd = _recipes_dir(root_fd, create=False)
        if fd is not None:
            with opened(fd):
                if lstat_at(slot.file_name, fd) is not None:
                    raise UsageError(f"{slot.shown}: exists; {again}")
    rel = f"{RECIPES_DIR}/{slot.file_name}"
    if slot.file_name.endswith(LOCK_SUFFIX) or not any(glob_matches(p, rel) for p in ws.recipe_globs):
        globs = ", ".join(repr(p) for p in ws.recipe_globs)
        why = "a lock file's name" if slot.file_name.endswith(LOCK_SUFFIX) else f"not matched by its recipes globs {globs}"
        raise UsageError(f"{rel} would not be a recipe of this workspace ({why} in {ws.display(ws.file)}): "
                         f"give another --name, or add {RECIPES_DIR + '/*.yaml'!r} to its recipes")
    lock = lock_file_of(slot.path)
    for other_name, other in recipe_names(ws):
        if other_name == name:
            raise UsageError(f"recipe name {name!r} is taken by {ws.display(other)}; {again}")
        if lock_file_of(other) == lock:
            raise UsageError(f"{ws.display(other)} keeps its lock file at {ws.display(lock)}, where {rel}'s would be; "
                             f"{again}")
    return slot


def model_path(ws: Workspace, saved_model: Path | None, name: str) -> Path:
    """The SavedModel the recipe names (absolute, links kept as written): --saved-model,
    which must be inside the workspace, else exported/NAME."""
    if saved_model is None:
        return ws.root / "exported" / name
    model = Path(os.path.abspath(saved_model))
    problem = boundary_problem(Path(os.path.relpath(model, ws.root)).as_posix(), ws.root)
    if problem:
        raise UsageError(f"--saved-model {shown(str(saved_model))} {problem}: a recipe names a SavedModel inside its "
                         "workspace; export or copy it there, or import in the workspace that holds it")
    return model


def write_recipe(slot: Slot, imported: Imported, origin: str, model: Path, guessed: bool, cwd: Path) -> Result:
    """Write the recipe of `imported` (read from `origin`, a file shown as given) into
    `slot`, naming `model`; ConfigError or UsageError, nothing written, when the next command
    would refuse it or it would mean something else than the text."""
    ws = slot.ws
    recipes = ws.root / RECIPES_DIR
    # What a build would check of the options, said against the text first (and before
    # the recipe's size: 100,000 bad batch sizes are one line saying so, not "too large").
    try:
        load_converter_options(rebase_datasets(imported.converter, cwd, ws.root), model, origin, slot.name, workspace=ws)
    except ConfigError as exc:
        problems = [d for d in exc.diagnostics if not d.json_path.startswith("model")]
        if problems:
            raise ConfigError(problems) from None
    # Dataset paths in the text are the reader's (this directory's); a recipe's, its file's.
    converter = rebase_datasets(imported.converter, cwd, recipes)
    converter, kept = _shield(ws, converter, origin)
    saved_model = Path(os.path.relpath(model, recipes)).as_posix()
    data = {"name": slot.name, "model": {"saved_model": saved_model}, "converter": converter}
    text = recipe_text(data, origin, imported.dialect, guessed, kept)
    size = len(text.encode("utf-8"))
    if size > MAX_DOCUMENT_BYTES:
        raise ConfigError([Diagnostic(Location(origin), "", f"its recipe would be {size} bytes, more than the "
                                      f"{MAX_DOCUMENT_BYTES} a recipe may have (config/yamlload.py); the largest value "
                                      f"is {_largest(converter)}: nothing written")])
    loaded, _ = load_yaml(text, slot.shown)
    if loaded != data:  # cannot happen: the dumper quotes what YAML would read otherwise
        raise ConfigError([Diagnostic(Location(origin), "", f"{slot.shown} would not load back as written")])
    try:
        recipe = load_recipe_text(text, slot.path, ws)
    except ConfigError as exc:
        raise ConfigError([_against(d, slot, origin) for d in exc.diagnostics]) from None
    spelling = Spelling(recipe.written_converter, recipe.root, cwd, recipe.absolute_paths)
    rendered = render(recipe.canonical, FORMAT[imported.dialect], source=origin, spelling=spelling)
    notes = _judge(imported, rendered, origin, cwd)
    if kept:
        paths = ", ".join(f"converter.{format_path(path)}" for path in kept)
        notes.append(f"note: {slot.shown} sets {paths} as {origin} leaves them, over the workspace's defaults "
                     f"({ws.display(ws.file)}): they do not apply to it")
    with _said(slot.shown), opened(_open_root(ws)) as root_fd:
        fd = _recipes_dir(root_fd, create=True)
        assert fd is not None
        with opened(fd):
            if not create_exclusive_at(slot.file_name, fd, text.encode("utf-8")):
                raise UsageError(f"{slot.shown}: exists; give another --name (import never overwrites a recipe)")
    return Result(slot.path, imported.dialect, notes)


def recipe_text(data: dict[str, Any], source: str, dialect: str, guessed: bool, kept: Sequence[tuple] = ()) -> str:
    """The recipe file: a comment naming its source (escaped: a file name's line break
    would start a line of YAML), then `data` as YAML whose every string loads back as itself."""
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=1 << 30)
    if guessed:
        line = f"  saved_model: {yaml.dump(data['model']['saved_model'], Dumper=_Dumper).splitlines()[0]}\n"
        body = body.replace(line, line[:-1] + "   # the SavedModel to convert: edit (import --saved-model)\n", 1)
    header = f"# Imported by `tpubuild import` from {shown(source)} (a {dialect} text proto).\n"
    if kept:
        keys = ", ".join(f"converter.{format_path(path)}" for path in kept)
        header += f"# {keys}: as the text leaves them, over the workspace's defaults.\n"
    return header + body


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, each string that holds a character YAML reads as a line break
    (U+0085, U+2028, U+2029, CR) or any other non-printable one written double-quoted, where
    every such character is escaped: in a single-quoted or plain scalar PyYAML writes U+0085
    as it is, and the reader folds it into a space."""


def _represent_str(dumper: Any, value: str) -> Any:
    style = None if value.isprintable() else '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _represent_list(dumper: Any, value: list) -> Any:
    # A list of scalars on one line, as recipes are written by hand (`allowed_batch_sizes: [2, 4, 8]`).
    flow = bool(value) and all(isinstance(item, (str, int, float, bool)) for item in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(list, _represent_list)


@contextmanager
def _said(what: str) -> Iterator[None]:
    """An OSError of the file system (no permission, a read-only disk) as one line naming `what`."""
    try:
        yield
    except OSError as exc:
        raise UsageError(f"{what}: {exc.strerror or exc}") from None


def _open_root(ws: Workspace) -> int:
    return os.open(ws.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _recipes_dir(root_fd: int, create: bool) -> int | None:
    """A descriptor of the workspace's `recipes/` (made when `create`; None when absent
    and not made), never reached through a link: a link or a file there is a UsageError."""
    try:
        if create:
            try:
                os.mkdir(RECIPES_DIR, 0o777, dir_fd=root_fd)
            except FileExistsError:
                pass
        elif lstat_at(RECIPES_DIR, root_fd) is None:
            return None
        return open_dir(RECIPES_DIR, root_fd)
    except NotAFile as exc:
        what = exc.kind
        if exc.kind == "a symbolic link":
            try:
                what = f"a symbolic link (to {shown(os.readlink(RECIPES_DIR, dir_fd=root_fd))})"
            except OSError:
                pass
        raise UsageError(f"{RECIPES_DIR}: {what}, not a directory: import writes only into the workspace's own "
                         f"{RECIPES_DIR}/ directory, never through a link (make it a directory)") from None


def _shield(ws: Workspace, converter: dict[str, Any], origin: str) -> tuple[dict[str, Any], list[tuple]]:
    """`converter` with a value for each workspace default it leaves unset, so that none
    applies: (the section, the paths set so). A default no value can undo is a ConfigError
    at its line in the workspace file."""
    defaults = ws.defaults.get("converter") if isinstance(ws.defaults, dict) else None
    if not isinstance(defaults, dict):
        return converter, []
    kept: list[tuple] = []
    problems: list[Diagnostic] = []

    def walk(default: dict[str, Any], mine: dict[str, Any], path: tuple) -> None:
        for key, value in default.items():
            here = path + (key,)
            if here in EXTENSIONS:
                continue
            if key in mine:
                if here in OPTIONAL_SECTIONS and mine[key] == {} and value:
                    problems.append(_cannot_undo(ws, here, origin, empty=True))
                elif isinstance(value, dict) and isinstance(mine[key], dict):
                    walk(value, mine[key], here)  # mappings merge: the default's other keys would apply
                continue  # a list or a value of the text's replaces the default's
            if here in NEUTRAL:
                mine[key] = copy.deepcopy(NEUTRAL[here])
                kept.append(here)
            elif here in OPTIONAL_SECTIONS and isinstance(value, dict):
                section: dict[str, Any] = {}
                inner = len(kept)
                walk(value, section, here)
                del kept[inner:]  # the section is what the recipe sets
                mine[key] = section or {"scope": "DEFAULT"}  # `{}` alone would render an empty message
                kept.append(here)
            else:
                problems.append(_cannot_undo(ws, here, origin))

    shielded = copy.deepcopy(converter)
    walk(defaults, shielded, ())
    if problems:
        raise ConfigError(problems)
    return shielded, kept


def _cannot_undo(ws: Workspace, path: tuple, origin: str, empty: bool = False) -> Diagnostic:
    try:
        where = ws.defaults_marks.value(("converter", *path))
    except KeyError:
        where = Location(ws.display(ws.file))
    stated = STATEABLE.get(path)
    if empty:
        what = "has it empty, which no recipe can write under this default (render would leave it out)"
        fix = f"remove the empty {format_path(path)} {{}} from {origin} (it means what none does) or drop the default"
    elif stated:
        what = "leaves it to the converter's default, which no recipe value restores"
        fix = f"state it in {origin} ({stated}, the converter's default) or drop it from the defaults"
    else:
        what = "has none, and no recipe value takes it back"
        fix = ("import into a workspace without this default (tpubuild --workspace DIR import ...) or drop it "
               "from the defaults")
    return Diagnostic(where, f"defaults.converter.{format_path(path)}",
                      f"applies to every recipe of this workspace, and {origin} {what}, so the recipe would not "
                      f"render the text's message: {fix}")


def _against(diagnostic: Diagnostic, slot: Slot, origin: str) -> Diagnostic:
    """A problem of the recipe-to-be, reported against the text it comes from (the recipe
    file does not exist); a problem elsewhere (the workspace file) keeps its place."""
    if diagnostic.loc.path == slot.shown:
        path = diagnostic.json_path
        return Diagnostic(Location(origin), path, diagnostic.message)
    return diagnostic


def _largest(converter: dict[str, Any]) -> str:
    best: tuple[int, str] = (0, "converter")

    def walk(value: Any, path: tuple) -> None:
        nonlocal best
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, path + (key,))
        elif isinstance(value, list):
            size = len(value)
            if size > best[0]:
                best = (size, f"{format_path(path)} ({size} elements)")
            for index, item in enumerate(value):
                walk(item, path + (index,))
        elif isinstance(value, str) and len(value) > best[0]:
            best = (len(value), f"{format_path(path)} ({len(value)} characters)")

    walk(converter, ("converter",))
    return best[1]


def _judge(imported: Imported, rendered: str, origin: str, cwd: Path) -> list[str]:
    """Notes on the round trip, or ConfigError when the recipe would render another
    message than the text's (a guard: what import writes is built to come back whole)."""
    from tpubuild.converter_protos import MESSAGES, message_class

    expected, notes = _as_tpubuild_writes(imported.message, imported.dialect, origin, cwd)
    back = message_class(MESSAGES[imported.dialect])()
    parse_message(rendered, back)
    difference = _difference(expected, back)
    if difference:
        raise ConfigError([Diagnostic(Location(origin), "", f"the recipe would render another message than this "
                                      f"text ({difference}); nothing written")])
    return notes


def _as_tpubuild_writes(message: Any, dialect: str, origin: str, cwd: Path) -> tuple[Any, list[str]]:
    """`message` with what the recipe spells otherwise though it means the same: V2's
    xla_functions with device_type TPU are tpu_functions entries (converter_text.py), and
    a dataset path is kept as the file it names (`data/./a` is `data/a`)."""
    notes: list[str] = []
    copy_ = type(message)()
    copy_.CopyFrom(message)
    if dialect == V2 and len(message.xla_functions):
        for spec in message.xla_functions:
            entry = copy_.tpu_functions.add()
            kind = spec.WhichOneof("function_spec")
            if kind:
                setattr(entry, kind, getattr(spec, kind))
            entry.enable_soft_device_placement = spec.enable_soft_device_placement
        del copy_.xla_functions[:]
        count = len(message.xla_functions)
        notes.append(f"note: {origin}: its {count} xla_functions entr{'y' if count == 1 else 'ies'} with device_type "
                     "TPU are written as tpu_functions entries, which place the same functions the same way (render "
                     "writes them so)")
    if dialect == GUIDE:
        datasets = copy_.external_feature_configs.quantization_options.representative_datasets
        for key in datasets:
            path = datasets[key].tfrecord_file_path
            same = Path(os.path.normpath(path if os.path.isabs(path) else os.path.relpath(cwd / path, cwd))).as_posix()
            if path and same != path:
                datasets[key].tfrecord_file_path = same
                notes.append(f"note: {origin}: representative_datasets[{key!r}]: {path!r} is written as {same!r}, "
                             "the same file")
    return copy_, notes


def _difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first field where two messages of one type differ, in words; None when equal."""
    if a == b:
        return None
    names = sorted({f.name for f, _ in a.ListFields()} | {f.name for f, _ in b.ListFields()},
                   key=lambda n: a.DESCRIPTOR.fields_by_name[n].number)
    for name in names:
        descriptor = a.DESCRIPTOR.fields_by_name[name]
        left, right = getattr(a, name), getattr(b, name)
        where = f"{path}.{name}" if path else name
        if descriptor.label == descriptor.LABEL_REPEATED:
            if list(left) == list(right):
                continue
            if descriptor.message_type is not None and not descriptor.message_type.GetOptions().map_entry \
                    and len(left) == len(right):
                for index, (x, y) in enumerate(zip(left, right)):
                    inner = _difference(x, y, f"{where}[{index}]")
                    if inner:
                        return inner
            return f"{where}: {_listed(right)} where the text has {_listed(left)}"
        if descriptor.message_type is not None:
            if a.HasField(name) != b.HasField(name):
                return f"{where}: {'present' if b.HasField(name) else 'absent'} where the text has it " \
                       f"{'present' if a.HasField(name) else 'absent'}"
            inner = _difference(left, right, where)
            if inner:
                return inner
        elif left != right:
            return f"{where}: {right!r} where the text has {left!r}"
    return "the messages differ"


def _listed(values: Any) -> str:
    items = list(values)
    shown_items = ", ".join(repr(v) if not hasattr(v, "ListFields") else "{...}" for v in items[:5])
    return f"[{shown_items}{', ...' if len(items) > 5 else ''}]"
