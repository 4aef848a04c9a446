"""Composite functions of a SavedModel that TensorFlow's LiteRT converter fuses into one op.

LiteRT's op-fusion design (tensorflow/lite/g3doc/models/convert/operation_fusion.md): a
tf.function annotated with the interface it implements stays a function in the SavedModel,
and the converter's `PrepareCompositeFunctionsPass`
(tensorflow/compiler/mlir/lite/transforms/prepare_composite_functions_tf.cc) replaces its
body with one fused LiteRT op before anything is inlined. It looks at two attributes:

  * `_implements` (tf.function's `experimental_implements`), either a string
    (`ConvertTFImplements`: "embedding_matmul", "LSTMCellSimple",
    "LayerNormalizedLstmCellSimple", "non_max_suppression_padded_v2",
    "addons:DenseImageWarp") or a NameAttrList (`ConvertTFImplementsWithAttributes`:
    "tftext:..." when TF Text is loaded, "TFLite_Detection_PostProcess",
    "addons:MaxUnpooling2D", and any name whose attrs hold `tfl_fusable_op: true`, which
    becomes a CUSTOM op of that name with the other attrs as its flexbuffer options);
  * `api_implements` (Keras 2's LSTM layers, `experimental_attributes`), a string starting
    with "lstm_" or "indy_lstm_" (`ConvertTFAPIImplements`, body built by
    `ConvertKerasLSTMLayer` in tensorflow/compiler/mlir/lite/utils/lstm_utils.cc).

The converter keeps these functions only on its SavedModel-import path, which it takes
when some function carries one of the two attributes (lite.py,
`_contains_function_with_implements_attr`); it has no option to turn fusion off. So a
composite the recipe does not keep loses its attribute here, before conversion, and is
then converted op by op like any other function.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorflow.core.framework.function_pb2 import FunctionDef

from tpubuild.errors import StageError
from tpubuild.savedmodel.model import SavedModel

IMPLEMENTS = "_implements"  # attributes_lib.IMPLEMENTS
API_IMPLEMENTS = "api_implements"  # attributes_lib.API_IMPLEMENTS
TFL_FUSABLE_OP = "tfl_fusable_op"  # kTFLFusableOp

# `_implements` strings the pass recognises -> the LiteRT op it writes
# (ConvertTFImplements; nms_utils.cc writes NON_MAX_SUPPRESSION_V4, perception_ops_utils.cc
# the DenseImageWarp custom op).
_FUSED_BY_NAME = {
    "embedding_matmul": "EMBEDDING_LOOKUP",
    "LSTMCellSimple": "LSTM",
    "LayerNormalizedLstmCellSimple": "LSTM",
    "non_max_suppression_padded_v2": "NON_MAX_SUPPRESSION_V4",
    "addons:DenseImageWarp": "DenseImageWarp",
}
# NameAttrList names with their own conversion (ConvertTFImplementsWithAttributes).
_FUSED_BY_ATTR_NAME = {
    "TFLite_Detection_PostProcess": "TFLite_Detection_PostProcess",
    "addons:MaxUnpooling2D": "MaxUnpooling2D",
}


@dataclass(frozen=True)
class Composite:
    name: str  # the interface implemented: what `composites: [names]` lists
    attribute: str  # IMPLEMENTS or API_IMPLEMENTS
    functions: tuple[str, ...]  # the FunctionDefs carrying it (one per trace)
    fused_op: str | None  # the LiteRT op the converter makes of it; None: not one it fuses

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "attribute": self.attribute, "functions": list(self.functions),
                "fused_op": self.fused_op}


def composites(model: SavedModel, signature_keys: list[str]) -> list[Composite]:
    """The annotated composites the signatures call, by name, in name order.

    Only those: the library also holds the functions of every other tf.function saved
    with the model, which the converter never sees."""
    signatures = model.signatures
    called: set[str] = set()
    for key in signature_keys:
        root = signatures.get(key)
        if root is None:  # a signature whose function cannot be named: look at everything
            called = set(model.functions)
            break
        called |= {root, *model.reachable(root)}
    found: dict[tuple[str, str], tuple[list[str], str | None]] = {}
    for fname, fdef in sorted(model.functions.items()):
        if fname not in called:
            continue
        annotation = _annotation(fdef)
        if annotation is None:
            continue
        name, attribute, fused_op = annotation
        functions, _ = found.setdefault((name, attribute), ([], fused_op))
        functions.append(fname)
    return [Composite(name, attribute, tuple(functions), fused_op)
            for (name, attribute), (functions, fused_op) in sorted(found.items())]


def _annotation(fdef: FunctionDef) -> tuple[str, str, str | None] | None:
    if IMPLEMENTS in fdef.attr:
        value = fdef.attr[IMPLEMENTS]
        if value.WhichOneof("value") == "s":
            name = value.s.decode()
            return name, IMPLEMENTS, _FUSED_BY_NAME.get(name)
        if value.WhichOneof("value") == "func":
            name = value.func.name
            if name.startswith("tftext:"):
                # Fused only when TF Text's ops are registered (IsTFTextRegistered); the op
                # keeps the API name (tftext_utils.cc).
                return name, IMPLEMENTS, name
            fusable = TFL_FUSABLE_OP in value.func.attr and value.func.attr[TFL_FUSABLE_OP].b
            return name, IMPLEMENTS, _FUSED_BY_ATTR_NAME.get(name, name if fusable else None)
    if API_IMPLEMENTS in fdef.attr:
        name = fdef.attr[API_IMPLEMENTS].s.decode()
        fused = name.startswith(("lstm_", "indy_lstm_"))
        return name, API_IMPLEMENTS, "UNIDIRECTIONAL_SEQUENCE_LSTM" if fused else None
    return None


def kept_composites(found: list[Composite], wanted: str | list[str]) -> list[Composite]:
    """The composites `composites: all | none | [names]` keeps; an unknown name is an error."""
    if wanted == "all":
        return list(found)
    if wanted == "none":
        return []
    names = {c.name for c in found}
    unknown = [name for name in wanted if name not in names]
    if unknown:
        listed = ", ".join(sorted(names)) or "none"
        raise StageError(f"targets.litert.composites: the model has no composite {unknown[0]!r}; its composites: {listed}")
    return [c for c in found if c.name in wanted]


def strip_composites(model: SavedModel, dropped: list[Composite]) -> None:
    """Remove the annotation of each dropped composite, so the converter inlines it."""
    for composite in dropped:
        for fname in composite.functions:
            del model.functions[fname].attr[composite.attribute]
