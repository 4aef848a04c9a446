"""JSON Schema validation whose errors point at the YAML line of the offending value."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from tpubuild.config.yamlload import Marks, format_path
from tpubuild.errors import Diagnostic

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
INT32_MAX = 2**31 - 1  # the schemas' "maximum" of every field that is an int32 in converter_options.proto


@lru_cache(maxsize=None)
def validator(name: str):
    """A compiled validator for `schemas/<name>.schema.json` (built once per process)."""
    import jsonschema  # imported here: ~50 ms that only validation needs

    # JSON Schema counts 8.0 as an integer; YAML's 8.0 is a float, which a proto int32
    # field, `range()` and the text proto cannot take (`max_batch_size: 8.0` would pass
    # validation, then crash render and build). An integer is a Python int, not a bool.
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    )
    strict = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker)
    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text(encoding="utf-8"))
    return strict(schema)


def schema_diagnostics(name: str, data: Any, marks: Marks) -> list[Diagnostic]:
    """Every schema violation of `data`, one Diagnostic each, located through `marks`."""
    errors = list(validator(name).iter_errors(data))
    # A value of the wrong type fails its other keywords too (.inf as an integer is also
    # above the maximum): its type error alone says what is wrong.
    mistyped = {tuple(e.absolute_path) for e in errors if e.validator == "type"}
    out = []
    for error in errors:
        if error.validator == "type" or tuple(error.absolute_path) not in mistyped:
            out.extend(_diagnose(error, marks))
    return out


def _diagnose(error, marks: Marks) -> list[Diagnostic]:
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extras = [k for k in error.instance if k not in error.schema.get("properties", {})]
        return [
            Diagnostic(
                marks.key(path + (key,)),
                format_path(path + (key,)),
                f"unknown key {key!r}" + _suggest(key, allowed),
            )
            for key in extras
        ]
    return [Diagnostic(marks.value(path), format_path(path), _message(error))]


def _suggest(key: Any, allowed: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(str(key), allowed, n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (allowed: {', '.join(allowed)})"


_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}


def _message(error) -> str:
    """jsonschema's messages, reworded where they would confuse a YAML author."""
    kind = error.validator
    value = error.instance
    if kind == "type":
        expected = error.validator_value
        names = [expected] if isinstance(expected, str) else list(expected)
        return f"expected {' or '.join(_TYPE_NAMES.get(n, n) for n in names)}, got {_show(value)}"
    if kind == "enum":
        # Case-insensitive enums list both spellings; name the upper-case one only.
        values = error.validator_value
        choices = [c for c in values if not (isinstance(c, str) and c != c.upper() and c.upper() in values)]
        return f"{_show(value)} is not one of {', '.join(map(str, choices))}"
    if kind == "const":
        return f"must be {_show(error.validator_value)}, got {_show(value)}"
    if kind == "required":
        return error.message.replace("is a required property", "is required")
    if kind == "minProperties" and error.validator_value == 1:
        return "must not be empty"
    if kind == "anyOf" and "anyOfErrorMessage" in error.schema:
        return f"{_show(value)} {error.schema['anyOfErrorMessage']}"
    if kind in ("oneOf", "anyOf"):
        # The alternative of the value's own type says what is wrong with it (a size
        # string that is not one), where "not valid under any of the given schemas" does not.
        fitting = [sub for sub in error.context or () if sub.validator != "type" and not sub.relative_path]
        if fitting:
            return _message(fitting[0])
    if kind == "minimum":
        return f"must be >= {error.validator_value}, got {_show(value)}"
    if kind == "maximum":
        bound = error.validator_value
        why = " (the largest int32: the converter's field is an int32)" if bound == INT32_MAX else ""
        return f"must be <= {bound}{why}, got {_show(value)}"
    if kind == "pattern":
        # "patternErrorMessage": the YAML language server's keyword, so editors say it too.
        if "patternErrorMessage" in error.schema:
            return f"{_show(value)} {error.schema['patternErrorMessage']}"
        return f"{_show(value)} does not match the pattern {error.validator_value}"
    if kind == "maxLength":
        return f"must be at most {error.validator_value} characters, got {len(value)}"
    return error.message


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    return repr(value) if isinstance(value, str) else str(value)
