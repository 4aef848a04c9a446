"""Parameters by dtype and on-disk sizes of a SavedModel (for the report and quantize).

Parameters are the checkpoint's variables plus constant tensors of at least
`MIN_CONST_ELEMENTS` elements: TF's quantizer freezes weights into int8 constants, and
smaller constants are shapes, axes and quantization scales, not weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from tpubuild.savedmodel.model import SavedModel

MIN_CONST_ELEMENTS = 16
_SKIP_KEYS = ("_CHECKPOINTABLE_OBJECT_GRAPH",)


def _add(table: dict[str, dict[str, int]], dtype: tf.DType, shape: list[int]) -> None:
    elements = int(np.prod(shape)) if shape else 1
    row = table.setdefault(dtype.name, {"tensors": 0, "elements": 0, "bytes": 0})
    row["tensors"] += 1
    row["elements"] += elements
    row["bytes"] += elements * dtype.size


def parameters(model: SavedModel) -> dict[str, Any]:
    """{"variables": {dtype: counts}, "constants": {dtype: counts}, "total": {dtype: counts}}."""
    variables: dict[str, dict[str, int]] = {}
    prefix = model.path / "variables" / "variables"
    if prefix.with_suffix(".index").is_file():
        reader = tf.train.load_checkpoint(str(prefix))
        dtypes = reader.get_variable_to_dtype_map()
        for name, shape in sorted(reader.get_variable_to_shape_map().items()):
            if not name.startswith(_SKIP_KEYS) and dtypes[name] != tf.string:
                _add(variables, dtypes[name], shape)
    constants: dict[str, dict[str, int]] = {}
    nodes = [n for f in model.functions.values() for n in f.node_def] + list(model.meta_graph.graph_def.node)
    for node in nodes:
        if node.op != "Const":
            continue
        tensor = node.attr["value"].tensor
        shape = [d.size for d in tensor.tensor_shape.dim]
        dtype = tf.as_dtype(tensor.dtype)
        if dtype != tf.string and int(np.prod(shape or [1])) >= MIN_CONST_ELEMENTS:
            _add(constants, dtype, shape)
    total: dict[str, dict[str, int]] = {}
    for table in (variables, constants):
        for dtype, row in table.items():
            into = total.setdefault(dtype, {"tensors": 0, "elements": 0, "bytes": 0})
            for key, value in row.items():
                into[key] += value
    return {"variables": variables, "constants": constants, "total": dict(sorted(total.items()))}


def sizes(path: Path) -> dict[str, int]:
    """Bytes on disk: the graph (saved_model.pb), the variables directory, everything."""
    path = Path(path)
    files = [p for p in path.rglob("*") if p.is_file()]
    variables = path / "variables"
    return {
        "graph": (path / "saved_model.pb").stat().st_size,
        "variables": sum(p.stat().st_size for p in files if variables in p.parents),
        "total": sum(p.stat().st_size for p in files),
    }


def parameter_bytes(params: dict[str, Any]) -> int:
    return sum(row["bytes"] for row in params["total"].values())
