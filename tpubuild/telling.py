"""The one line of TensorFlow's output that says what went wrong.

TF's errors open with a generic header (`Graph execution error:`, `Detected at node ...`)
and put the cause further down: `Could not find variable ...` in an op error's body,
`LLVM ERROR: ...` or `Check failed: ...` as the last words of an aborting process on its
stderr. A build's one-line error quotes the cause, not the header.
"""

from __future__ import annotations

import re

# Most telling first. Sources: absl's CHECK (`Check failed:`), LLVM's report_fatal_error
# (`LLVM ERROR:`), MLIR diagnostics (`error: ...` after a location), TF's op errors
# (`Could not find variable`, `Op type not registered`, `not found`), Python's last line.
_CAUSES = [
    re.compile(r"LLVM ERROR: .*"),
    re.compile(r"Check failed: .*"),
    re.compile(r"Could not find variable .*"),
    re.compile(r"Op type not registered .*"),
    re.compile(r"(?:^|\s)error: .*"),
    re.compile(r"\b[A-Z][A-Za-z]*Error: .*"),
    re.compile(r"(?:INVALID_ARGUMENT|NOT_FOUND|FAILED_PRECONDITION|INTERNAL|UNIMPLEMENTED): .*"),
]
# `<stack traces unavailable>` follows `Detected at node ... defined at` in a loaded
# SavedModel's op errors (no Python frames were saved with the graph).
_HEADERS = re.compile(
    r"^(Graph execution error:|Detected at node|Traceback|\s*File \"|\s*\[\[|During handling|<stack traces unavailable>)")
_NOISE = re.compile(r"^[IWE]\d{4} |^\d{4}-\d\d-\d\d |^WARNING:|^Instructions for updating")
# Said by every TF process on a machine without a GPU; never the cause.
_NO_GPU = re.compile(r"cuInit|CUDA|cuda_")


def telling_line(text: str, limit: int = 400) -> str | None:
    """The most telling line of `text` (TF log or error message), or None when empty."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not _NO_GPU.search(line)]
    for pattern in _CAUSES:
        for line in reversed(lines):  # the last occurrence is nearest the failure
            found = pattern.search(line)
            if found and not _HEADERS.match(line):
                return _clip(found.group(0).strip(), limit)
    useful = [line for line in lines if not _HEADERS.match(line) and not _NOISE.match(line)]
    return _clip(useful[0], limit) if useful else None


def _clip(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."
