"""`validate`'s checks of what a recipe names inside the model's own files, without
TensorFlow and without running anything: the export script parses and defines the
`function:` the export stage calls; the function aliases and signature keys a recipe names
(`tpu_functions`, `batch_options`, the quantization options, representative datasets)
exist in a plain SavedModel's saved_model.pb.

What only a build can tell (the script runs and writes a SavedModel, the aliases of a
SavedModel an export script writes) is left to the build's stages (stages/export.py,
tpu/functions.py), whose messages these imitate.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubuild.config.yamlload import Marks, format_path
from tpubuild.errors import Diagnostic, Location

DEFAULT_EXPORT_FUNCTION = "export"  # recipe.schema.json: model.export.function's default
DEFAULT_TAGS = ["serve"]  # config/canonical.py's: the tags every stage selects by

if TYPE_CHECKING:
    from tpubuild.config.saved_model_wire import MetaGraphNames


def model_problems(data: dict[str, Any], marks: Marks, root: Path) -> list[Diagnostic]:
    model = data.get("model") or {}
    if "export" in model:
        return _export_problems(model["export"], marks, root)
    if "saved_model" in model:
        return _saved_model_problems(data, marks, root)
    return []


def _export_problems(export: dict[str, Any], marks: Marks, root: Path) -> list[Diagnostic]:
    script = export["script"]
    try:
        source = (root / script).read_bytes()
        tree = ast.parse(source, filename=script)
    except SyntaxError as exc:  # the line and column Python gives, in the script itself
        where = Location(script, exc.lineno or 0, exc.offset or 0 if exc.lineno else 0)
        recipe = marks.value(("model", "export", "script")).path
        return [Diagnostic(where, "", f"Python syntax error in the export script of {recipe}: {exc.msg}")]
    except (OSError, ValueError) as exc:  # ValueError: a null byte in the source
        path = ("model", "export", "script")
        return [Diagnostic(marks.value(path), format_path(path), f"{script!r} cannot be read: {exc}")]
    except (RecursionError, MemoryError):  # nested beyond the parser's means: the export stage will say
        return []
    function = export.get("function", DEFAULT_EXPORT_FUNCTION)
    defined = module_names(tree)
    if defined is None or function in defined:
        return []
    # stages/export.py looks the function up with getattr(module, function) after running the script.
    path = ("model", "export", "function")
    close = difflib.get_close_matches(function, sorted(defined), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = marks.value(path) if path in marks.values else marks.value(("model", "export"))
    return [Diagnostic(where, format_path(path), f"{script} defines no function {function!r}{hint}")]


def module_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level (also inside if/try/with/for there), or
    None when they cannot be known without running it (`import *`, a module __getattr__,
    writes through globals())."""
    names: set[str] = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue  # their bodies bind local names
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
            continue
        for child in ast.walk(node):
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.add(child.id)
            elif isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id in ("globals", "exec"):
                return None
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(child.name)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in child.names)
    return None if "__getattr__" in names else names


def _saved_model_problems(data: dict[str, Any], marks: Marks, root: Path) -> list[Diagnostic]:
    """The function aliases and signature keys the recipe names that the SavedModel lacks,
    each at its own line, in the words of the stages that would fail on it (tpu/functions.py)."""
    from tpubuild.config.saved_model_wire import WireError, meta_graphs

    named = _named(data)
    if not named:
        return []
    pb = Path(root) / data["model"]["saved_model"] / "saved_model.pb"
    try:
        graphs = meta_graphs(pb)
    except (OSError, WireError, UnicodeDecodeError):
        return []  # not readable here: the build reads it with TensorFlow and says what is wrong
    graph = _selected(graphs, data["model"].get("tags") or DEFAULT_TAGS)
    if graph is None:
        return []  # no such tag set: the build names the tag sets there are
    known = {"alias": sorted(set(graph.aliases.values())),
             "signature": sorted(graph.signatures)}
    problems = []
    for kind, path, name, at_key in named:
        if name in known[kind]:
            continue
        close = difflib.get_close_matches(name, known[kind], n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        listed = ", ".join(f'"{a}"' for a in known[kind])
        if kind == "alias":
            what = "function alias"
            where = (f"aliases: {listed}" if listed else "the SavedModel has no function aliases "
                     "(export with tf.saved_model.SaveOptions(function_aliases=...))")
        else:
            what = "signature"
            where = f"signatures: {listed}" if listed else "the SavedModel has no signatures"
        mark = marks.key(path) if at_key else marks.value(path)
        problems.append(Diagnostic(mark, format_path(path), f'unknown {what} "{name}"{hint} in '
                                   f'{data["model"]["saved_model"]}; {where}'))
    return problems


def _named(data: dict[str, Any]) -> list[tuple[str, tuple, str, bool]]:
    """(alias | signature, its path in the recipe, the name, whether the name is a mapping
    key) of every function alias and signature key the recipe names."""
    converter = data.get("converter") or {}
    named: list[tuple[str, tuple, str, bool]] = []
    for i, entry in enumerate(converter.get("tpu_functions") or []):
        for field, kind in (("function_alias", "alias"), ("signature_name", "signature")):
            if field in entry:
                named.append((kind, ("converter", "tpu_functions", i, field), entry[field], False))
    for i, entry in enumerate(converter.get("batch_options") or []):
        experimental = entry.get("experimental") or {}
        for field, kind in (("function_alias", "alias"), ("signature_name", "signature")):
            if field in experimental:
                named.append((kind, ("converter", "batch_options", i, "experimental", field), experimental[field],
                              False))
    quantization = converter.get("quantization_options") or {}
    for i, key in enumerate(quantization.get("signature_keys") or []):
        named.append(("signature", ("converter", "quantization_options", "signature_keys", i), key, False))
    for section, owner in ((("converter", "quantization_options"), quantization), (("verify",), data.get("verify"))):
        for key in (owner or {}).get("representative_datasets") or {}:
            named.append(("signature", (*section, "representative_datasets", key), key, True))
    return [item for item in named if isinstance(item[2], str)]


def _selected(graphs: list[MetaGraphNames], tags: list[str]) -> MetaGraphNames | None:
    """The MetaGraphDef whose tag set is `tags`, as savedmodel/model.py's _select finds it
    for the stages (which always pass the recipe's tags, default [serve])."""
    for graph in graphs:
        if set(graph.tags) == set(tags):
            return graph
    return None
