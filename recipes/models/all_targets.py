"""A tiny sequence classifier built for every serving target (recipes/all_targets.yaml).

token ids -> embedding lookup -> LSTM -> dense head (`tpu_func`, placed on the TPU) -> logits.

The embedding lookup and the LSTM are composites that TensorFlow's LiteRT converter can fuse
into one op each (tensorflow/compiler/mlir/lite/transforms/prepare_composite_functions_tf.cc;
the recipe fuses the lookup only: a fused LSTM keeps its state between calls, see below):

  * `embedding_matmul` is annotated `experimental_implements="embedding_matmul"`; the
    converter replaces its body with EMBEDDING_LOOKUP(ids, table), so it must take
    (table, ids) in that order and return one tensor. LiteRT's kernel looks up a 1-D ids
    tensor (tensorflow/lite/kernels/embedding_lookup.cc), hence the reshapes around it.
  * `lstm` carries the attributes of Keras 2's LSTM layer (`api_implements: "lstm_..."`,
    `time_major`, `go_backwards`), which the converter rewrites into
    UNIDIRECTIONAL_SEQUENCE_LSTM (`ConvertKerasLSTMLayer`, utils/lstm_utils.cc): arguments
    (inputs, init_h, init_c, kernel, recurrent_kernel, bias), five results of which only
    the first two may be used, gates in Keras order (input, forget, cell, output), and a
    fixed batch size (`CheckFusableKerasLstm` refuses state tensors of unknown shape).
    Keras 3's own LSTM layer carries none of this (keras/src/backend/tensorflow/rnn.py),
    so the cell is written out here. The fused kernel clips the cell state to +-10
    (cell_clip 10.0 in ConvertKerasLSTMLayer); this model's cell state stays far inside.
    `init_h` and `init_c` become the fused op's state: variable tensors the kernel updates
    in place at every step (tensorflow/lite/kernels/lstm_eval.cc, LstmStepWithAuxInput),
    so the next call starts from the last one's state (measured: the second call's logits
    differ from the source's by 1.7e-2), where the source starts every call from zeros.

Shapes are fixed ([1, 8] ids): the LSTM fusion needs a static batch, and XLA's AOT
compiler needs static shapes anyway. The step loop is unrolled in Python so every op is
one tfcompile supports (no TensorList); the converter with `composites: none` then shows
the unfused ops one by one.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

VOCAB, EMBED, UNITS, CLASSES = 64, 8, 16, 4
BATCH, STEPS = 1, 8


@tf.function(experimental_implements="embedding_matmul")
def embedding_matmul(table: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    return tf.gather(table, ids)


@tf.function(experimental_attributes={"api_implements": "lstm_all_targets", "time_major": False, "go_backwards": False})
def lstm(inputs: tf.Tensor, init_h: tf.Tensor, init_c: tf.Tensor, kernel: tf.Tensor,
         recurrent_kernel: tf.Tensor, bias: tf.Tensor) -> tuple[tf.Tensor, ...]:
    h, c = init_h, init_c
    sequence = []
    for step in range(inputs.shape[1]):
        z = tf.matmul(inputs[:, step], kernel) + tf.matmul(h, recurrent_kernel) + bias
        i, f, g, o = tf.split(z, 4, axis=1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        h = tf.sigmoid(o) * tf.tanh(c)
        sequence.append(h)
    # Keras's five results: last output, whole sequence, final h and c, runtime marker.
    return h, tf.stack(sequence, axis=1), h, c, tf.constant(0.0)


class SequenceClassifier(tf.Module):
    def __init__(self, seed: int = 12) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)  # fixed weights: the same export every time
        self.table = tf.Variable(rng.normal(size=(VOCAB, EMBED)).astype("float32"), name="table")
        self.kernel = tf.Variable((rng.normal(size=(EMBED, 4 * UNITS)) / 3).astype("float32"), name="kernel")
        self.recurrent = tf.Variable((rng.normal(size=(UNITS, 4 * UNITS)) / 4).astype("float32"), name="recurrent")
        self.bias = tf.Variable(rng.normal(scale=0.1, size=4 * UNITS).astype("float32"), name="bias")
        self.head = tf.Variable(rng.normal(size=(UNITS, CLASSES)).astype("float32"), name="head")
        self.head_bias = tf.Variable(np.zeros(CLASSES, "float32"), name="head_bias")

    @tf.function(input_signature=[tf.TensorSpec([BATCH, UNITS], tf.float32)])
    def tpu_func(self, features: tf.Tensor) -> tf.Tensor:
        return tf.matmul(features, self.head) + self.head_bias

    @tf.function(input_signature=[tf.TensorSpec([BATCH, STEPS], tf.int32, name="ids")])
    def serve(self, ids: tf.Tensor) -> dict[str, tf.Tensor]:
        # Variables are read into tensors: the composites take values, not resource handles.
        embedded = embedding_matmul(tf.convert_to_tensor(self.table), tf.reshape(ids, [-1]))
        inputs = tf.reshape(embedded, [BATCH, STEPS, EMBED])
        zeros = tf.zeros([BATCH, UNITS])
        last, _, _, _, _ = lstm(inputs, zeros, zeros, tf.convert_to_tensor(self.kernel),
                                tf.convert_to_tensor(self.recurrent), tf.convert_to_tensor(self.bias))
        logits = self.tpu_func(last)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits)}


def export(output_dir: str, seed: int = 12) -> None:
    """Write the SavedModel with the alias `tpu_func` for the dense head."""
    model = SequenceClassifier(seed)
    tf.saved_model.save(
        model,
        output_dir,
        signatures={"serving_default": model.serve},
        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}),
    )
