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
from yaml.reader import ReaderError

from tpubuild.errors import ConfigError, Diagnostic, Location

# The C loader is ~10x faster; both produce the same nodes and marks.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

JsonPath = tuple  # of str keys and int indexes

# Bounds on what one YAML document may make us build (a 9 x 10 alias bomb would grow
# `validate` to 2.25 GB). The largest example recipe is about 2 KB, 8 levels deep,
# with no alias and under 100 nodes; these leave a wide margin and keep the worst case
# in milliseconds and a few MB.
MAX_DOCUMENT_BYTES = 1 << 20  # 1 MiB of text
MAX_DEPTH = 64  # nested mappings/sequences; also keeps libyaml's recursive composer
# (which segfaults near 100,000 levels) and our own recursive walks far from any limit
MAX_ALIASES = 100  # `*alias` references in one document
MAX_NODES = 100_000  # nodes after expanding every alias (what the data would hold)

_OPENERS = frozenset({yaml.BlockSequenceStartToken, yaml.BlockMappingStartToken, yaml.FlowSequenceStartToken,
                      yaml.FlowMappingStartToken})
_CLOSERS = frozenset({yaml.BlockEndToken, yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken})


@dataclass
class Marks:
    """Where each value (and each mapping key) of a document was written."""

    values: dict[JsonPath, Location] = field(default_factory=dict)
    keys: dict[JsonPath, Location] = field(default_factory=dict)
    # A path field's value as the user wrote it, before rebasing to the workspace root:
    # what error messages quote (config/paths.py).
    written: dict[JsonPath, str] = field(default_factory=dict)

    def tables(self) -> tuple[dict, dict, dict]:
        return self.values, self.keys, self.written

    def copy(self) -> "Marks":
        return Marks(dict(self.values), dict(self.keys), dict(self.written))

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
        for mine, theirs in zip(self.tables(), other.tables()):
            for path, mark in theirs.items():
                mine[under + path] = mark

    def drop(self, prefix: JsonPath) -> None:
        """Forget the marks below `prefix` (a value about to be replaced wholesale)."""
        n = len(prefix)
        for table in self.tables():
            for path in [p for p in table if p[:n] == prefix and len(p) > n]:
                del table[path]


def format_path(path: JsonPath) -> str:
    """('converter', 'batch_options', 0, 'max_batch_size') -> converter.batch_options[0].max_batch_size"""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (isinstance(part, str) and part.isprintable() and part):
            out += f"[{part!r}]"  # a key holding a line break must not break the one-line message
        else:
            out += f".{part}" if out else str(part)
    return out


def _loc(display: str, mark: yaml.Mark) -> Location:
    return Location(display, mark.line + 1, mark.column + 1)


def _indentation_message(exc: yaml.MarkedYAMLError) -> str | None:
    """PyYAML's and libyaml's words for a line indented wrongly ("did not find expected
    key", "expected <block end>", "mapping values are not allowed"), in words that say so."""
    problem, context = exc.problem or "", exc.context or ""
    line = exc.problem_mark.line + 1 if exc.problem_mark else None
    opened = exc.context_mark
    if line is None:
        return None
    if context == "while parsing a block mapping" and (problem == "did not find expected key"
                                                       or problem.startswith("expected <block end>")):
        return (f"bad indentation: line {line} is indented less or more than its neighbours; the keys of one "
                f"mapping (here the one from line {opened.line + 1}, column {opened.column + 1}) start in the "
                "same column")
    if context == "while parsing a block collection" and (problem == "did not find expected '-' indicator"
                                                          or problem.startswith("expected <block end>")):
        return (f"bad indentation: line {line} is indented less or more than its neighbours; the items of one "
                f"list (here the one from line {opened.line + 1}, column {opened.column + 1}) each start with "
                "`- ` in the same column")
    if problem.startswith("mapping values are not allowed"):
        return (f"bad indentation, or a `: ` inside a value: if line {line} holds a key, it is indented more "
                "than the key above it (the keys of one mapping start in the same column); if the `: ` is part "
                "of a value, quote the value")
    return None


def load_yaml(text: str, display: str) -> tuple[Any, Marks]:
    """Parse one YAML document; `display` is the path used in error messages."""
    if len(text) > MAX_DOCUMENT_BYTES:  # in characters here: text may come from elsewhere than a file
        raise _too_big(Location(display), f"the document is larger than {MAX_DOCUMENT_BYTES} bytes")
    loader = _Loader(text)
    try:
        aliases = _check_shape(text, display)
        node = loader.get_single_node()
        if node is None:
            return None, Marks({(): Location(display, 1, 1)})
        if aliases:  # without aliases, the document's size bounds the data's
            _check_expansion(node, display)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        tab = _tab_at(text, mark) if mark else None
        if tab is not None:
            # PyYAML's words ("found character that cannot start any token") hide the cause.
            message = "a tab character in the indentation: YAML indents with spaces, never tabs"
            raise ConfigError([Diagnostic(Location(display, tab[0], tab[1]), "", f"YAML syntax error: {message}")]) from None
        message = _indentation_message(exc) or exc.problem or "invalid YAML"
        if exc.context and not message.startswith("bad indentation"):
            message = f"{exc.context}, {message}" if exc.problem else exc.context
        loc = _loc(display, mark) if mark else Location(display)
        raise ConfigError([Diagnostic(loc, "", f"YAML syntax error: {message}")]) from None
    except ReaderError as exc:  # a character YAML does not allow, e.g. a raw null byte
        # libyaml counts UTF-8 bytes, PyYAML's own reader characters.
        before = text.encode()[: exc.position].decode(errors="ignore") if _Loader is not yaml.SafeLoader else text[: exc.position]
        line, col = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        what = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        message = f"YAML error: unacceptable character {what}: {exc.reason}"
        raise ConfigError([Diagnostic(Location(display, line, col), "", message)]) from None
    except yaml.YAMLError as exc:  # anything else, on one line
        raise ConfigError([Diagnostic(Location(display), "", f"YAML error: {' '.join(str(exc).split())}")]) from None
    finally:
        loader.dispose()
    marks = Marks()
    problems: list[Diagnostic] = []
    _walk(node, (), display, marks, problems, loader)
    if problems:
        raise ConfigError(problems)
    return data, marks


def _tab_at(text: str, mark: yaml.Mark) -> tuple[int, int] | None:
    """(line, column), 1-based, of the tab that an error marked at `mark` is about: a tab
    in the marked line's leading whitespace, or at the mark itself. None: no tab there."""
    lines = text.split("\n")
    if not 0 <= mark.line < len(lines):
        return None
    line = lines[mark.line]
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    if "\t" in indent:
        return mark.line + 1, indent.index("\t") + 1
    if line[mark.column: mark.column + 1] == "\t":
        return mark.line + 1, mark.column + 1
    return None


def _too_big(loc: Location, what: str) -> ConfigError:
    return ConfigError([Diagnostic(loc, "", f"YAML too large: {what} (a recipe needs far less)")])


def _check_shape(text: str, display: str) -> int:
    """Refuse deep nesting and many aliases from the token stream, before anything is
    composed: the scan stops at the first excess, so the cost is bounded too. Returns
    the number of aliases."""
    try:
        return _scan_shape(text, display, _Loader)
    except yaml.YAMLError as exc:
        # libyaml >= 0.2.6 (PyYAML 6.0.4's wheels) stops at its own flow-depth limit while
        # looking ahead, before yielding the tokens that would reach ours: scan again with
        # the pure-Python scanner, which has no such limit, to say where ours is crossed.
        if "maximum nesting depth" not in str(exc) or _Loader is yaml.SafeLoader:
            raise
        return _scan_shape(text, display, yaml.SafeLoader)


def _scan_shape(text: str, display: str, loader: type) -> int:
    depth = aliases = 0
    for token in yaml.scan(text, Loader=loader):
        kind = type(token)  # exact types: a set lookup is cheaper than isinstance
        if kind in _OPENERS:
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_big(_loc(display, token.start_mark), f"nested deeper than {MAX_DEPTH} levels")
        elif kind in _CLOSERS:
            depth -= 1
        elif kind is yaml.AliasToken:
            aliases += 1
            if aliases > MAX_ALIASES:
                raise _too_big(_loc(display, token.start_mark), f"more than {MAX_ALIASES} aliases")
    return aliases


def _check_expansion(root: yaml.Node, display: str) -> None:
    """Refuse a document whose aliases expand to more than MAX_NODES nodes (a "billion
    laughs"), counted on the composed graph, where an alias is a shared node: each node's
    expanded size is computed once. An alias to an enclosing node is a cycle."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise ConfigError([Diagnostic(_loc(display, node.start_mark), "", "YAML alias refers to an enclosing node (a cycle)")])
        open_nodes.add(key)
        children: list = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        total = 1 + sum(size(child) for child in children)
        open_nodes.discard(key)
        if total > MAX_NODES:
            raise _too_big(_loc(display, node.start_mark), f"its aliases expand to more than {MAX_NODES} values")
        sizes[key] = total
        return total

    size(root)


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
        with open(path, "rb") as stream:
            raw = stream.read(MAX_DOCUMENT_BYTES + 1)  # never more than the bound into memory
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise _too_big(Location(display), f"the file is larger than {MAX_DOCUMENT_BYTES} bytes")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError([Diagnostic(Location(display), "", "file not found")]) from None
    except (OSError, ValueError) as exc:  # ValueError: a null byte in the path; UnicodeDecodeError
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError([Diagnostic(Location(display), "", f"cannot read: {reason}")]) from None
    return load_yaml(text, display)
