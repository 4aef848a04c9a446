"""YAML loading that remembers where every key and value came from.

PyYAML's constructed data loses line numbers; the composed node tree keeps them. We
construct the data as usual and walk the node tree beside it to build a map from JSON
path to Location, so schema and semantic errors can point at `file:line:col`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tpubuild.errors import ConfigError, Diagnostic, Location

# The C loader is ~10x faster; both produce the same nodes and marks.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

JsonPath = tuple  # of str keys and int indexes


@dataclass
class Marks:
    """Where each value (and each mapping key) of a document was written."""

    values: dict[JsonPath, Location] = field(default_factory=dict)
    keys: dict[JsonPath, Location] = field(default_factory=dict)

    def value(self, path: JsonPath) -> Location:
        """The value's own mark, else the nearest enclosing one that exists."""
        for end in range(len(path), -1, -1):
            loc = self.values.get(tuple(path[:end]))
            if loc is not None:
                return loc
        raise KeyError(path)

    def key(self, path: JsonPath) -> Location:
        """The mark of the key that introduced `path`, falling back to its value."""
        return self.keys.get(tuple(path)) or self.value(path)

    def update(self, other: "Marks", under: JsonPath = ()) -> None:
        for path, loc in other.values.items():
            self.values[under + path] = loc
        for path, loc in other.keys.items():
            self.keys[under + path] = loc

    def drop(self, prefix: JsonPath) -> None:
        """Forget the marks below `prefix` (a value about to be replaced wholesale)."""
        n = len(prefix)
        for table in (self.values, self.keys):
            for path in [p for p in table if p[:n] == prefix and len(p) > n]:
                del table[path]


def format_path(path: JsonPath) -> str:
    """('converter', 'batch_options', 0, 'max_batch_size') -> converter.batch_options[0].max_batch_size"""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _loc(display: str, mark: yaml.Mark) -> Location:
    return Location(display, mark.line + 1, mark.column + 1)


def load_yaml(text: str, display: str) -> tuple[Any, Marks]:
    """Parse one YAML document; `display` is the path used in error messages."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, Marks({(): Location(display, 1, 1)})
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = exc.problem or "invalid YAML"
        if exc.context:
            message = f"{exc.context}, {message}" if exc.problem else exc.context
        loc = _loc(display, mark) if mark else Location(display)
        raise ConfigError([Diagnostic(loc, "", f"YAML syntax error: {message}")]) from None
    except yaml.YAMLError as exc:  # e.g. a reader error for bytes that are not text
        raise ConfigError([Diagnostic(Location(display), "", f"YAML error: {exc}")]) from None
    finally:
        loader.dispose()
    marks = Marks()
    problems: list[Diagnostic] = []
    _walk(node, (), display, marks, problems, loader)
    if problems:
        raise ConfigError(problems)
    return data, marks


def _walk(node: yaml.Node, path: JsonPath, display: str, marks: Marks, problems: list, loader) -> None:
    marks.values[path] = _loc(display, node.start_mark)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<:` merges are already flattened into the data by PyYAML
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key in seen:
                first = seen[key].start_mark.line + 1
                problems.append(
                    Diagnostic(
                        _loc(display, key_node.start_mark),
                        format_path(path + (key,)),
                        f"duplicate key (first set on line {first})",
                    )
                )
                continue
            seen[key] = key_node
            marks.keys[path + (key,)] = _loc(display, key_node.start_mark)
            _walk(value_node, path + (key,), display, marks, problems, loader)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, path + (index,), display, marks, problems, loader)


def read_yaml_file(path: Path, display: str) -> tuple[Any, Marks]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Diagnostic(Location(display), "", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError([Diagnostic(Location(display), "", f"cannot read: {reason}")]) from None
    return load_yaml(text, display)
