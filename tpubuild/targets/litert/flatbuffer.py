"""Facts read from a LiteRT flatbuffer: its ops by count, its signatures (TensorFlow-free).

Reads the flatbuffer with the schema module that ships in the `ai-edge-litert` wheel
(ai_edge_litert/schema_py_generated.py, generated from LiteRT's schema.fbs): the op of an
operator is `operator_codes[opcode_index]`; builtin ops are named by the BuiltinOperator
enum, CUSTOM ops (fused `tfl_fusable_op` composites, `Flex<TFOp>` select-TF ops) by
their `custom_code`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

FLEX_PREFIX = "Flex"  # select-TF ops are CUSTOM ops named Flex<TF op> (tensorflow/lite/delegates/flex)


def require_litert() -> None:
    """StageError (environment, exit code 1) when the ai-edge-litert wheel is missing."""
    import importlib.util

    if importlib.util.find_spec("ai_edge_litert") is None:
        from tpubuild.errors import StageError

        # A core dependency (pyproject.toml): missing only when removed after installing tpubuild.
        raise StageError("the LiteRT target needs the ai-edge-litert package, a dependency of tpubuild: "
                         "pip install 'ai-edge-litert>=2.3,<3'")


def _schema() -> Any:
    require_litert()
    from ai_edge_litert import schema_py_generated

    return schema_py_generated


def _model(data: bytes) -> Any:
    schema = _schema()
    if not schema.Model.ModelBufferHasIdentifier(data, 0):
        raise ValueError("not a LiteRT flatbuffer (no TFL3 file identifier)")
    return schema.Model.GetRootAs(data, 0)


def op_counts(data: bytes) -> dict[str, int]:
    """Op name -> number of operators of that op, over every subgraph; sorted by name."""
    schema = _schema()
    model = _model(data)
    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    counts: Counter[str] = Counter()
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        for o in range(subgraph.OperatorsLength()):
            code = model.OperatorCodes(subgraph.Operators(o).OpcodeIndex())
            # Codes above 127 live in builtin_code; deprecated_builtin_code holds the rest.
            builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            if builtin == schema.BuiltinOperator.CUSTOM:
                counts[code.CustomCode().decode()] += 1
            else:
                counts[names.get(builtin, f"BUILTIN_{builtin}")] += 1
    return dict(sorted(counts.items()))


def signature_keys(data: bytes) -> list[str]:
    model = _model(data)
    return sorted(model.SignatureDefs(i).SignatureKey().decode() for i in range(model.SignatureDefsLength()))


def variable_tensors(data: bytes) -> int:
    """Tensors marked `is_variable`: state the interpreter keeps from one call to the next
    (the fused LSTM ops' inputs 18 and 19, "Stateful input tensors that are variables and
    will be modified by the Op", tensorflow/lite/kernels/unidirectional_sequence_lstm.cc)."""
    model = _model(data)
    return sum(
        1
        for s in range(model.SubgraphsLength())
        for t in range(model.Subgraphs(s).TensorsLength())
        if model.Subgraphs(s).Tensors(t).IsVariable()
    )


def zero_unreferenced_buffers(data: bytes) -> bytes:
    """The flatbuffer with the bytes of every buffer no tensor or metadata entry refers to set
    to zero, in place (same layout, same size).

    TensorFlow's int8 quantizer leaves such buffers behind: the quantized initial values of
    a fused LSTM's state, whose variable tensors then point at buffer 0 (none), hold bytes
    that differ from one conversion of the same model to the next (measured: 0x0f...
    in one, 0x7f... in the other). Nothing can read them (a tensor reaches data only through
    its `buffer` index; metadata through `Metadata.buffer` and the deprecated
    `metadata_buffer` list), so zeroing them makes the file deterministic without changing
    what it computes.
    """
    model = _model(data)
    referenced = {0}
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        referenced.update(subgraph.Tensors(t).Buffer() for t in range(subgraph.TensorsLength()))
    referenced.update(model.Metadata(m).Buffer() for m in range(model.MetadataLength()))
    referenced.update(model.MetadataBuffer(m) for m in range(model.MetadataBufferLength()))
    patched = bytearray(data)
    for index in range(model.BuffersLength()):
        buffer = model.Buffers(index)
        if index in referenced or buffer.DataLength() == 0:
            continue
        # The data vector's first byte: the generated Buffer.Data(j) reads at
        # _tab.Vector(_tab.Offset(4)) + j.
        start = buffer._tab.Vector(buffer._tab.Offset(4))
        patched[start:start + buffer.DataLength()] = bytes(buffer.DataLength())
    return bytes(patched)


def flex_ops(ops: dict[str, int]) -> list[str]:
    """The select-TF ops among `ops` (they run only with the Flex delegate linked in)."""
    return sorted(op for op in ops if op.startswith(FLEX_PREFIX))
