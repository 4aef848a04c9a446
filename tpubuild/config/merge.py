"""Layering recipes: workspace defaults < extends base(s) < the recipe itself.

Mappings merge deeply, everything else (lists included) is replaced, and the marks move
with the values so an error in a key inherited from a base names the base file's line.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from tpubuild.config.yamlload import Marks, format_path
from tpubuild.errors import Diagnostic, Location


@dataclass(frozen=True)
class ReplacedList:
    """A list of mappings that a layer replaced whole although it edits the same entries:
    the fields of the base's entries that the new list does not repeat are gone."""

    path: tuple
    lost: tuple[str, ...]  # "[0].num_batch_threads", ...
    base: Location  # where the base wrote the list
    over: Location  # where the overriding layer did

    def warning(self) -> Diagnostic:
        fields = ", ".join(format_path(self.path[-1:]) + f for f in self.lost)
        return Diagnostic(self.over, format_path(self.path),
                          f"replaces the whole list of {self.base.path}:{self.base.line} (lists are not merged), "
                          f"dropping {fields}; repeat them here to keep them")


def deep_merge(base: Any, base_marks: Marks, over: Any, over_marks: Marks,
               replaced: list[ReplacedList] | None = None) -> tuple[Any, Marks]:
    """`over` layered on `base`; neither input is modified. Lists that lose fields are
    appended to `replaced` (validate warns about them)."""
    marks = base_marks.copy()
    merged = _merge(copy.deepcopy(base), over, (), marks, over_marks, replaced)
    return merged, marks


def _merge(base: Any, over: Any, path: tuple, marks: Marks, over_marks: Marks,
           replaced: list[ReplacedList] | None = None) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        for key, value in over.items():
            sub = path + (key,)
            if key in base:
                base[key] = _merge(base[key], value, sub, marks, over_marks, replaced)
            else:
                base[key] = copy.deepcopy(value)
                _take(marks, over_marks, sub)
            if sub in over_marks.keys:
                marks.keys[sub] = over_marks.keys[sub]
        if path in over_marks.values and path not in marks.values:
            marks.values[path] = over_marks.values[path]
        return base
    lost = _lost_fields(base, over)
    if lost and replaced is not None:
        replaced.append(ReplacedList(path, lost, marks.value(path), over_marks.value(path)))
    _take(marks, over_marks, path)
    return copy.deepcopy(over)


def _lost_fields(base: Any, over: Any) -> tuple[str, ...]:
    """Fields of `base`'s mapping entries missing from `over`'s entry at the same position,
    when the two entries share a field (an edit of the entry, as a child setting only
    batch_options[0].max_batch_size; entries with no field in common are a deliberate
    replacement, as one tpu_functions kind for another)."""
    if not (isinstance(base, list) and isinstance(over, list)):
        return ()
    lost = []
    for index, (old, new) in enumerate(zip(base, over)):
        if isinstance(old, dict) and isinstance(new, dict) and set(old) & set(new):
            lost += [f"[{index}].{key}" for key in old if key not in new]
    return tuple(lost)


def _take(marks: Marks, over_marks: Marks, path: tuple) -> None:
    """Replace every mark at and below `path` by the overriding layer's."""
    marks.drop(path)
    n = len(path)
    for table, source in zip(marks.tables(), over_marks.tables()):
        for p, loc in source.items():
            if p[:n] == path:
                table[p] = loc
