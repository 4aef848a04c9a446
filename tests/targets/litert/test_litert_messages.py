"""The converter's failure text -> one line, for failures the ConverterErrorData protos do not
carry (their text measured with TensorFlow 2.21's converter)."""

from __future__ import annotations

from tpubuild.targets.litert.convert import describe_converter_error, readable_function

# Keras 3's LSTM layer (a TensorList loop of unknown element shape), converted without select-TF ops.
TENSOR_LIST = (
    '<unknown>:0: error: loc(callsite(fused["TensorListReserve:", "functional_1/lstm_1/TensorArrayV2_1@__inference___call___676"] '
    'at fused["StatefulPartitionedCall:", "StatefulPartitionedCall_1"])): \'tf.TensorListReserve\' op requires element_shape '
    "to be static during TF Lite transformation pass\n"
    '<unknown>:0: note: loc(fused["StatefulPartitionedCall:", "StatefulPartitionedCall_1"]): called from\n'
)
FLEX_TEXT = (
    "<unknown>:0: error: failed while converting: 'main': \n"
    "Some ops are not supported by the native TFLite runtime, you can enable TF kernels fallback using TF Select. "
    "See instructions: https://www.tensorflow.org/lite/guide/ops_select \n"
    "TF Select ops: MatrixInverse, PopulationCount\nDetails:\n"
)


def test_an_error_without_an_op_code_gives_the_converters_first_error_line() -> None:
    assert describe_converter_error(RuntimeError(TENSOR_LIST), select_tf_ops=False) == (
        "TensorFlow's LiteRT converter failed: 'tf.TensorListReserve' op requires element_shape to be static "
        "during TF Lite transformation pass"
    )


def test_the_message_text_names_the_select_tf_ops_when_no_proto_does() -> None:
    assert describe_converter_error(RuntimeError(FLEX_TEXT), select_tf_ops=False) == (
        "ops without a LiteRT builtin kernel: MatrixInverse, PopulationCount; set targets.litert.select_tf_ops: true"
    )


def test_function_names_lose_tracing_decorations() -> None:
    assert readable_function("__inference_serve_11") == "serve"
    assert readable_function("__inference___call___676") == "__call__"
