"""A plain JAX MLP exported to TensorFlow the two ways JAX teams serve through TF, as a user writes them.

This file is also the workspaces' export script (copied in; recipes name `export_jax2tf`
and `export_orbax`):
- `export_jax2tf`: `jax2tf.convert` with native serialization (the computation is one
  `XlaCallModule` op holding StableHLO), a polymorphic batch dimension, the parameters as
  `tf.Variable`s of a `tf.Module`, the TPU part saved under the function alias `tpu_func`
  and called from the serving signature (docs/jax.md's worked example);
- `export_orbax`: orbax-export's `JaxModule` + `ExportManager` (which do the same
  jax2tf conversion and variable wrapping), the alias given through `save_options`.
Lowered for both CPU and TPU (`native_serialization_platforms`): the TPU refuses a module
lowered only for the CPU it was exported on, and verify runs the CPU lowering.
Seeded random weights, 8 -> 16 -> 4: the export path is what is tested (a few KB).
"""

from __future__ import annotations

import numpy as np

FEATURES, HIDDEN, CLASSES = 8, 16, 4
PLATFORMS = ("cpu", "tpu")


def params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    weights = {
        "w1": rng.normal(size=(FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        "b1": rng.normal(size=(HIDDEN,)) * 0.1,
        "w2": rng.normal(size=(HIDDEN, CLASSES)) / np.sqrt(HIDDEN),
        "b2": rng.normal(size=(CLASSES,)) * 0.1,
    }
    return {k: v.astype(np.float32) for k, v in weights.items()}


def mlp(p, x):
    import jax

    hidden = jax.nn.relu(x @ p["w1"] + p["b1"])
    return jax.nn.softmax(hidden @ p["w2"] + p["b2"], axis=-1)


def features(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, FEATURES)).astype(np.float32)


def export_jax2tf(output_dir: str) -> None:
    import tensorflow as tf
    from jax.experimental import jax2tf

    class Exported(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.params = {k: tf.Variable(v, name=k) for k, v in params().items()}
            # None: the parameters' shapes are fixed; (b, ...): any batch size.
            self._mlp = jax2tf.convert(mlp, polymorphic_shapes=[None, "(b, ...)"],
                                       native_serialization_platforms=PLATFORMS)

        @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)], autograph=False)
        def tpu_func(self, x):
            return self._mlp(self.params, x)

        @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
        def serve(self, x):
            return {"probabilities": self.tpu_func(x)}

    module = Exported()
    tf.saved_model.save(module, output_dir, signatures={"serving_default": module.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": module.tpu_func}))


def export_orbax(output_dir: str) -> None:
    import tensorflow as tf
    from orbax.export import ExportManager, JaxModule, ServingConfig, constants

    module = JaxModule(params(), mlp, input_polymorphic_shape="(b, ...)",
                       jax2tf_kwargs={"native_serialization_platforms": PLATFORMS})
    serving = ServingConfig("serving_default", input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")],
                            tf_postprocessor=lambda probabilities: {"probabilities": probabilities})
    tpu_func = module.methods[constants.DEFAULT_METHOD_KEY]
    ExportManager(module, [serving]).save(
        output_dir, save_options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": tpu_func}))
