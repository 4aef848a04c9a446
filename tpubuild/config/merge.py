"""Layering recipes: workspace defaults < extends base(s) < the recipe itself.

Mappings merge deeply, everything else (lists included) is replaced, and the marks move
with the values so an error in a key inherited from a base names the base file's line.
"""

from __future__ import annotations

import copy
from typing import Any

from tpubuild.config.yamlload import Marks


def deep_merge(base: Any, base_marks: Marks, over: Any, over_marks: Marks) -> tuple[Any, Marks]:
    """`over` layered on `base`; neither input is modified."""
    marks = base_marks.copy()
    merged = _merge(copy.deepcopy(base), over, (), marks, over_marks)
    return merged, marks


def _merge(base: Any, over: Any, path: tuple, marks: Marks, over_marks: Marks) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        for key, value in over.items():
            sub = path + (key,)
            if key in base:
                base[key] = _merge(base[key], value, sub, marks, over_marks)
            else:
                base[key] = copy.deepcopy(value)
                _take(marks, over_marks, sub)
            if sub in over_marks.keys:
                marks.keys[sub] = over_marks.keys[sub]
        if path in over_marks.values and path not in marks.values:
            marks.values[path] = over_marks.values[path]
        return base
    _take(marks, over_marks, path)
    return copy.deepcopy(over)


def _take(marks: Marks, over_marks: Marks, path: tuple) -> None:
    """Replace every mark at and below `path` by the overriding layer's."""
    marks.drop(path)
    n = len(path)
    for table, source in zip(marks.tables(), over_marks.tables()):
        for p, loc in source.items():
            if p[:n] == path:
                table[p] = loc
