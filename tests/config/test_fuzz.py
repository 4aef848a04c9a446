"""Random YAML documents and random field values never escape as anything but ConfigError."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpubuild.config import load_recipe_file
from tpubuild.errors import ConfigError

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["DEFAULT", "enabled", "ALL", "STATIC_RANGE", "../x", "serving_default"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)

VALID = {
    "model": {"saved_model": "../models/toy", "tags": ["serve"]},
    "converter": {
        "tpu_functions": [{"function_alias": "f"}],
        "batch_options": [{"max_batch_size": 8, "allowed_batch_sizes": [4, 8], "experimental": {"signature_name": "s"}}],
        "bfloat16_optimization_options": {"scope": "ALL", "filterlist": ["Softmax"]},
        "xla_sharding_options": {"num_cores_per_replica": 2, "topology": {"mesh_shape": [1, 1, 1, 2], "device_coordinates": [0, 0, 0, 0, 0, 0, 0, 1]}},
        "quantization_options": {"method": "DYNAMIC_RANGE", "representative_datasets": {"serving_default": {"npz": "../d.npz"}}},
    },
    "verify": {"samples": 3, "rtol": 0.1},
}


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, prefix + (index,))


ALL_PATHS = [p for p in _paths(VALID) if p]


def _load(root: Path, text: str) -> None:
    recipe = root / "recipes" / "fuzz.yaml"
    recipe.write_text(text)
    try:
        load_recipe_file(recipe)
    except ConfigError as exc:
        assert exc.lines() and all(line.startswith("recipes/fuzz.yaml") for line in exc.lines()), exc.lines()


def _workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")
    (root / "recipes").mkdir()
    (root / "models" / "toy").mkdir(parents=True)
    (root / "models" / "toy" / "saved_model.pb").write_bytes(b"")
    return root


def test_random_text_documents(tmp_path_factory):
    root = _workspace(tmp_path_factory)

    @SETTINGS
    @given(st.text(alphabet=st.sampled_from(list("ab:-[]{}#&*!|>'\" \n\t,?%@`0.")), max_size=60))
    def check(text):
        _load(root, text)

    check()
    shutil.rmtree(root)


def test_random_yaml_values(tmp_path_factory):
    root = _workspace(tmp_path_factory)

    @SETTINGS
    @given(values)
    def check(document):
        _load(root, yaml.safe_dump(document))

    check()


def test_random_field_values_in_a_valid_recipe(tmp_path_factory):
    root = _workspace(tmp_path_factory)

    @SETTINGS
    @given(st.sampled_from(ALL_PATHS), values)
    def check(path, value):
        document = copy.deepcopy(VALID)
        target = document
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        _load(root, yaml.safe_dump(document))

    check()
