"""Turn a recipe's `tpu_functions` entries into the concrete functions they name."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Any

from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SavedModel

XLA_MUST_COMPILE = "_XlaMustCompile"
SOFT_PLACEMENT = "enable_soft_device_placement"  # the recipe's (and ConverterOptionsV2's) key


@dataclass(frozen=True)
class TpuFunction:
    """One resolved TPU function: its concrete name and how the recipe named it."""

    name: str
    alias: str | None
    entry: int  # index in tpu_functions
    how: str  # e.g. 'function_alias "tpu_func"'
    signature: str | None = None  # set when named by signature_name
    # ConverterOptionsV2's enable_soft_device_placement: ops the TPU cannot run stay in the
    # function and run on the host (outside compilation; tpu/placement.py).
    soft_placement: bool = False

    @property
    def label(self) -> str:
        """The name users know: the alias if there is one, else the concrete name."""
        return self.alias or self.name


def resolve_tpu_functions(model: SavedModel, entries: list[dict[str, Any]]) -> list[TpuFunction]:
    """Resolve every entry (in recipe order); refuse unknown names, repeats, indirect calls."""
    resolved: list[TpuFunction] = []
    seen: dict[str, TpuFunction] = {}
    for index, entry in enumerate(entries):
        for found in _resolve_entry(model, index, entry):
            if found.name in seen:
                first = seen[found.name]
                raise ConversionError(
                    f"tpu_functions[{index}]: {found.how} names function {found.name}, "
                    f"already named by tpu_functions[{first.entry}] ({first.how})"
                )
            seen[found.name] = found
            resolved.append(found)
    check_no_indirect_calls(model, resolved)
    return resolved


def check_no_indirect_calls(model: SavedModel, functions: list[TpuFunction]) -> None:
    """The converter's own rule: a TPU function may call another only directly."""
    for caller in functions:
        direct = model.callees(caller.name)
        for callee in functions:
            if callee is caller:
                continue
            if any(c != callee.name and callee.name in model.reachable(c) for c in direct):
                raise ConversionError(
                    f'Unable to place both "{caller.label}" and "{callee.label}" on the TPU because '
                    f'"{caller.label}" indirectly calls "{callee.label}". This behavior is unsupported '
                    "because it can cause invalid graphs to be generated."
                )


def _resolve_entry(model: SavedModel, index: int, entry: dict[str, Any]) -> list[TpuFunction]:
    soft = bool(entry.get(SOFT_PLACEMENT))
    found = _resolve_name(model, index, {k: v for k, v in entry.items() if k != SOFT_PLACEMENT})
    return [replace(f, soft_placement=soft) for f in found] if soft else found


def _resolve_name(model: SavedModel, index: int, entry: dict[str, Any]) -> list[TpuFunction]:
    if len(entry) != 1:
        raise ConversionError(
            f"tpu_functions[{index}]: expected exactly one of function_alias, concrete_function_name, "
            f"signature_name, jit_compile_functions; got {', '.join(sorted(entry)) or 'none'}"
        )
    (kind, value), = entry.items()
    where = f"tpu_functions[{index}]"
    if kind == "function_alias":
        return [_by_alias(model, where, index, value)]
    if kind == "concrete_function_name":
        return [_by_concrete_name(model, where, index, value)]
    if kind == "signature_name":
        return [_by_signature(model, where, index, value)]
    if kind == "jit_compile_functions":
        return _jit_compiled(model, where, index) if value else []
    raise ConversionError(f"{where}: unknown key {kind!r}")


def _by_alias(model: SavedModel, where: str, index: int, alias: str) -> TpuFunction:
    # TF records an alias for every concrete function the tf.function ever traced
    # (save.py `_build_meta_graph_impl`: `func._list_all_concrete_functions()`), also those
    # traced outside the save and never written; its loader skips such names ("is listed
    # in function alias but it is not found", load.py Loader.__init__), and so does this.
    # Keras's ExportArchive writes one: its endpoint is traced again when another
    # endpoint calls it.
    by_alias = {a: name for name, a in sorted(model.aliases.items()) if name in model.functions}
    by_alias.update({a: name for name, a in model.aliases.items() if a not in by_alias})
    if alias not in by_alias:
        if not by_alias:
            raise ConversionError(
                f'{where}: unknown function alias "{alias}"; the SavedModel has no function aliases '
                "(export with tf.saved_model.SaveOptions(function_aliases=...))"
            )
        raise ConversionError(
            f'{where}: unknown function alias "{alias}"{_did_you_mean(alias, by_alias)}; '
            f"aliases: {_quoted(by_alias)}"
        )
    name = by_alias[alias]
    if name not in model.functions:
        raise ConversionError(f'{where}: function alias "{alias}" names {name}, which is not in the function library')
    return TpuFunction(name, alias, index, f'function_alias "{alias}"')


def _by_concrete_name(model: SavedModel, where: str, index: int, name: str) -> TpuFunction:
    if name not in model.functions:
        aliases = model.aliases
        listed = ", ".join(f'"{a}" ({n})' for n, a in sorted(aliases.items(), key=lambda i: i[1]))
        raise ConversionError(
            f'{where}: unknown concrete function "{name}"{_did_you_mean(name, model.functions)}; '
            f"aliases: {listed or 'none'}"
        )
    return TpuFunction(name, model.alias_of(name), index, f'concrete_function_name "{name}"')


def _by_signature(model: SavedModel, where: str, index: int, key: str) -> TpuFunction:
    signatures = model.signatures
    if key not in signatures:
        raise ConversionError(
            f'{where}: unknown signature "{key}"{_did_you_mean(key, signatures)}; '
            f"signatures: {_quoted(signatures) or 'none'}"
        )
    name = signatures[key]
    return TpuFunction(name, model.alias_of(name), index, f'signature_name "{key}"', signature=key)


def _jit_compiled(model: SavedModel, where: str, index: int) -> list[TpuFunction]:
    marked = {
        name
        for name, fdef in model.functions.items()
        if XLA_MUST_COMPILE in fdef.attr and fdef.attr[XLA_MUST_COMPILE].b
    }
    # Only the outermost ones: a jit function called by another is compiled inside it.
    inner = set().union(*(model.reachable(name) for name in marked)) if marked else set()
    outermost = sorted(marked - inner)
    if not outermost:
        raise ConversionError(
            f"{where}: jit_compile_functions is true but no function was exported with "
            "@tf.function(jit_compile=True)"
        )
    return [
        TpuFunction(name, model.alias_of(name), index, "jit_compile_functions") for name in outermost
    ]


def _did_you_mean(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


def _quoted(names: Any) -> str:
    return ", ".join(f'"{n}"' for n in sorted(names))
