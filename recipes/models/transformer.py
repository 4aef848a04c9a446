"""A small transformer-like text classifier: token embedding, self-attention, dense layers.

`export` writes the example size used by the recipes (about 0.46M parameters, fast to
build); `export_large` writes the benchmark size (about 2.8M parameters). Weights are
seeded, so every export of one size is identical.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

SEQUENCE = 16  # tokens per request


class Transformer(tf.Module):
    """Embedding -> one attention block (4 heads, residual, layer norm) -> FFN -> classifier."""

    def __init__(self, vocab: int, width: int, heads: int, ffn: int, classes: int) -> None:
        super().__init__()
        rng = np.random.default_rng(11)
        self.heads = heads

        def weight(*shape: int) -> tf.Variable:
            return tf.Variable((rng.normal(size=shape) / np.sqrt(shape[0])).astype("float32"))

        self.embedding = tf.Variable((rng.normal(size=(vocab, width)) * 0.5).astype("float32"))
        self.position = tf.Variable((rng.normal(size=(SEQUENCE, width)) * 0.1).astype("float32"))
        self.wq, self.wk, self.wv, self.wo = (weight(width, width) for _ in range(4))
        self.w_in, self.w_out = weight(width, ffn), weight(ffn, width)
        self.w_cls = weight(width, classes)

    def _attention(self, x: tf.Tensor) -> tf.Tensor:
        batch, width = tf.shape(x)[0], x.shape[-1]
        depth = width // self.heads

        def split(t: tf.Tensor) -> tf.Tensor:  # [b, s, w] -> [b, heads, s, depth]
            return tf.transpose(tf.reshape(t, [batch, SEQUENCE, self.heads, depth]), [0, 2, 1, 3])

        def project(t: tf.Tensor, w: tf.Variable) -> tf.Tensor:
            # A plain MatMul (not Einsum): TF's quantizer quantizes MatMul weights.
            return tf.reshape(tf.reshape(t, [-1, width]) @ w, [batch, SEQUENCE, width])

        q, k, v = (split(project(x, w)) for w in (self.wq, self.wk, self.wv))
        scores = tf.matmul(q, k, transpose_b=True) / float(np.sqrt(depth))
        context = tf.matmul(tf.nn.softmax(scores, axis=-1), v)
        merged = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch, SEQUENCE, width])
        return project(merged, self.wo)

    @tf.function(input_signature=[tf.TensorSpec([None, SEQUENCE], tf.int32, name="tokens")])
    def serve(self, tokens: tf.Tensor) -> dict[str, tf.Tensor]:
        x = tf.gather(self.embedding, tokens) + self.position
        x = _layer_norm(x + self._attention(x))
        hidden = tf.nn.relu(tf.reshape(x, [-1, x.shape[-1]]) @ self.w_in) @ self.w_out
        x = _layer_norm(x + tf.reshape(hidden, tf.shape(x)))
        pooled = tf.reduce_mean(x, axis=1)
        return {"logits": pooled @ self.w_cls}


def _layer_norm(x: tf.Tensor) -> tf.Tensor:
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + 1e-6)


def _save(model: Transformer, output_dir: str) -> None:
    tf.saved_model.save(model, output_dir, signatures={"serving_default": model.serve})


def export(output_dir: str) -> None:
    """The example size: vocab 2000, width 128, FFN 512 (about 0.46M parameters)."""
    _save(Transformer(vocab=2000, width=128, heads=4, ffn=512, classes=8), output_dir)


def export_large(output_dir: str) -> None:
    """The benchmark size: vocab 8000, width 256, FFN 1024 (about 2.8M parameters)."""
    _save(Transformer(vocab=8000, width=256, heads=4, ffn=1024, classes=8), output_dir)
