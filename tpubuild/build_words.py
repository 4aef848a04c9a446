"""The words of a build's summary line and their colours: what both the executable's fast
path (tpubuild/entry.py, before click is imported) and the CLI's printer
(commands/build_output.py) print, so the two say a no-op in the same words. Standard
library only: the fast path's cost is its imports.
"""

from __future__ import annotations

import os
from typing import TextIO

# ANSI SGR colours of each state's word; dry-run's words are explain's.
COLOURS = {
    "built": "32",  # green: work done
    "cached": "34",  # blue
    "failed": "1;31",  # bold red
    "skipped": "33",  # yellow: not run because of a failure
    "would run": "33",
    "cached if unchanged": "34",  # the dry-run summary's count of stages waiting for an earlier output
    "cannot run": "1;31",
    "published": "32",
}


def wants_colour(stream: TextIO) -> bool:
    """Colour only on a terminal, and not when the user said no (NO_COLOR set to anything
    but the empty string, as no-color.org defines it) or the terminal cannot show it."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def paint(text: str, word: str, colour: bool) -> str:
    code = COLOURS.get(word)
    return f"\033[{code}m{text}\033[0m" if colour and code else text


def summary_line(recipes: int, counts: dict[str, int], order: tuple[str, ...], colour: bool) -> str:
    """`2 recipes: 5 built, 12 cached` (states in `order`, those with a count only)."""
    parts = ", ".join(paint(f"{counts[s]} {s}", s, colour) for s in order if counts.get(s))
    return f"{recipes} recipe{'s' if recipes != 1 else ''}: {parts or 'nothing to do'}"
