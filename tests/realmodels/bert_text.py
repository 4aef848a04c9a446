"""A BERT encoder behind tensorflow_text tokenization, exported the converter guide's way.

Also the test workspace's export script (copied in as recipes/models/bert_text.py): the
serving signature takes a batch of strings, tokenizes them on the CPU with
`tensorflow_text.BertTokenizer` (CaseFoldUTF8, NormalizeUTF8, RegexSplitWithOffsets,
WordpieceTokenizeWithOffsets: ops TensorFlow itself does not register), and calls the
encoder through `tpu_func`, saved under that function alias. A tiny `keras_hub`
BertBackbone from a config (random weights) and a vocabulary generated here.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

SEQUENCE = 16
WORDS = ["the", "model", "serves", "text", "on", "a", "tpu", "fast", "slow", "build", "cache", "##s", "##ing"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS]


def export(output_dir: str) -> None:
    import keras
    import keras_hub
    import tensorflow as tf
    import tensorflow_text as text

    keras.utils.set_random_seed(3)
    encoder = keras_hub.models.BertBackbone(
        vocabulary_size=len(VOCAB) + 1, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=SEQUENCE)
    cls, sep = VOCAB.index("[CLS]"), VOCAB.index("[SEP]")

    class Exported(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = tf.lookup.StaticVocabularyTable(
                tf.lookup.KeyValueTensorInitializer(VOCAB, tf.range(len(VOCAB), dtype=tf.int64)), num_oov_buckets=1)
            self.tokenizer = text.BertTokenizer(self.table, token_out_type=tf.int64, lower_case=True)
            self.encoder = encoder

        @tf.function(input_signature=[tf.TensorSpec([None, SEQUENCE], tf.int32),
                                      tf.TensorSpec([None, SEQUENCE], tf.int32)])
        def tpu_func(self, token_ids, padding_mask):
            outputs = self.encoder({"token_ids": token_ids, "segment_ids": tf.zeros_like(token_ids),
                                    "padding_mask": padding_mask})
            return outputs["pooled_output"]

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, sentences):
            pieces = self.tokenizer.tokenize(sentences).merge_dims(-2, -1)[:, : SEQUENCE - 2]
            batch = tf.shape(sentences, out_type=tf.int64)[:1]
            ids = tf.concat([tf.fill(tf.concat([batch, [1]], 0), tf.constant(cls, tf.int64)), pieces,
                             tf.fill(tf.concat([batch, [1]], 0), tf.constant(sep, tf.int64))], axis=1)
            dense = tf.cast(ids.to_tensor(default_value=0, shape=[None, SEQUENCE]), tf.int32)
            return {"pooled": self.tpu_func(dense, tf.cast(dense != 0, tf.int32))}

    module = Exported()
    tf.saved_model.save(module, output_dir, signatures={"serving_default": module.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": module.tpu_func}))


def sentences(count: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    words = ["The", "model", "serves", "TEXT", "on", "a", "TPU", "fast", "caches", "building", "zebra"]
    return [" ".join(rng.choice(words, size=rng.integers(2, 9))).encode() for _ in range(count)]


def write_samples(path: str, count: int = 8) -> None:
    """Verification samples for the serving signature (strings cannot be drawn at random)."""
    import tensorflow as tf

    saver = tf.quantization.experimental.TfRecordRepresentativeDatasetSaver(path_map={"serving_default": path})
    saver.save({"serving_default": [{"text": np.array([s], dtype=object)} for s in sentences(count)]})
