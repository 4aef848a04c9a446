"""Custom-op libraries (`op_libraries:` in a recipe or the workspace's `defaults:`).

A SavedModel that calls ops outside TensorFlow's core (tensorflow_text's CaseFoldUTF8 and
WordpieceTokenizeWithOffsets, tensorflow_decision_forests' SimpleMLInferenceOp, a team's
own kernels) loads only in a process where those ops are registered: TensorFlow's graph
importer looks each op up in the global OpRegistry (tensorflow/core/framework/op.cc
OpRegistry::LookUp: `Op type not registered '...' in binary ...`). A Python package
registers its ops when imported (tensorflow_text/__init__.py loads its `_*_ops.so` with
tf.load_op_library); a bare `.so` is loaded with tf.load_op_library
(tensorflow/python/framework/load_library.py).

Planning never imports TensorFlow or the libraries: `resolve` names each entry with what
keys it (the installed distribution's version, the file's content goes in as a declared
input), the worker loads them before the stage runs.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

# Which package registers a well-known op, for the hint of the error below.
KNOWN_OPS = (
    (re.compile(r"^(CaseFold|Normalize|RegexSplit|Wordpiece|FastWordpiece|FastBert|Sentencepiece|"
                r"UnicodeScript|WhitespaceTokenize|SplitMergeTokenize|TokenizerFromLogits|"
                r"ConstrainedSequence|MaxSpanningTree|RoundRobin|SplitMerge|NgramsStringJoin|Mst|Utf8Binarize|"
                r"ByteSplit|BoiseOffset|GreedyConstrainedSequence|ViterbiConstrainedSequence)"), "tensorflow_text"),
    (re.compile(r"^SimpleML"), "tensorflow_decision_forests"),
)
_NOT_REGISTERED = re.compile(r"Op type not registered '([^']+)'")


def is_shared_library(entry: str) -> bool:
    return entry.endswith(".so")


def resolve(entries: list[str]) -> list[dict[str, str]]:
    """What a stage's options hold for `entries`: modules with their distribution and
    version (an upgrade changes every key), libraries by workspace-relative path (their
    content is a declared input of every stage)."""
    from tpubuild.digests import installed_dist

    resolved = []
    for entry in entries:
        if is_shared_library(entry):
            resolved.append({"library": entry})
            continue
        top = entry.split(".")[0]
        installed = installed_dist(top) or _distribution_of(top)
        resolved.append({"module": entry, "version": installed[0] if installed else "unknown"})
    return resolved


def _distribution_of(top: str) -> tuple[str, str] | None:
    """The slow lookup, when the module's name is not its distribution's."""
    from importlib import metadata

    from tpubuild.digests import installed_dist

    for dist in metadata.packages_distributions().get(top, []):
        found = installed_dist(dist)
        if found:
            return found
    return None


def missing_module(entry: str) -> bool:
    """Whether the top-level package of a module entry cannot be found (no import)."""
    return importlib.util.find_spec(entry.split(".")[0]) is None


def load(resolved: list[dict[str, str]], workspace: Path) -> None:
    """Register the ops of every entry in this process (a worker, before its stage)."""
    for entry in resolved:
        if "module" in entry:
            importlib.import_module(entry["module"])
        else:
            import tensorflow as tf

            tf.load_op_library(str(workspace / entry["library"]))


def unregistered_op_message(text: str, loaded: list[dict[str, Any]] | None) -> str | None:
    """The one line for TensorFlow's `Op type not registered 'X'`, naming the setting
    that fixes it; None when `text` is not that error."""
    found = _NOT_REGISTERED.search(text)
    if not found:
        return None
    op = found.group(1)
    package = next((pkg for pattern, pkg in KNOWN_OPS if pattern.match(op)), None)
    hint = f", e.g. {package}" if package else " (the Python package or .so that defines it)"
    have = [str(e.get("module") or e.get("library")) for e in loaded or []]
    also = f"; loaded: {', '.join(have)}" if have else ""
    return f"op {op} is not registered: add its library to op_libraries{hint}{also}"
