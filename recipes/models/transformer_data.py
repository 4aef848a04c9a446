"""Representative samples for the transformer example: token ids like real requests.

Used by recipes/static_range_generator.yaml as `generator: recipes.models.transformer_data:samples`;
each sample is one request `{input name: array}` matching the `serving_default` signature.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

VOCAB, SEQUENCE = 2000, 16


def samples() -> Iterator[dict[str, np.ndarray]]:
    """Seeded, endless: tpubuild takes `num_samples` of them."""
    rng = np.random.default_rng(5)
    while True:
        # Zipf-like token frequencies, as in text: a few ids are very common.
        tokens = np.minimum(rng.zipf(1.3, size=(1, SEQUENCE)), VOCAB) - 1
        yield {"tokens": tokens.astype(np.int32)}
