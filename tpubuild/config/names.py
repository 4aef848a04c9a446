"""Recipe names: what a name may be, wherever it comes from (`name:` or the file name).

A name becomes a directory (`<output_dir>/<name>/`), part of doit task names
(`<name>:<stage>`, where `:` and `=` have a meaning) and a command-line target (where a
leading `-` reads as an option). Hence letters, digits, `.`, `_`, `-`, starting with a
letter or digit, and short enough for a file name with room for suffixes.
"""

from __future__ import annotations

import re

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # also in schemas/recipe.schema.json (a test compares)
NAME_MAX_LENGTH = 100
NAME_RULE = (
    f"a recipe name is letters, digits, '.', '_' and '-', starts with a letter or digit, "
    f"at most {NAME_MAX_LENGTH} characters"
)

_NAME = re.compile(NAME_PATTERN)


def valid_name(name: str) -> bool:
    # fullmatch: `$` alone would accept a trailing newline.
    return len(name) <= NAME_MAX_LENGTH and _NAME.fullmatch(name) is not None


def invalid_name_message(name: str) -> str:
    """As the schema words it too ("patternErrorMessage" in schemas/recipe.schema.json)."""
    return f"{name!r} is not valid: {NAME_RULE}"


def name_from_file_message(name: str) -> str:
    return (
        f"the file name gives the recipe name {name!r}, which is not valid ({NAME_RULE}): "
        f"set `name:` in the recipe, or rename the file"
    )
