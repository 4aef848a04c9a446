"""Random YAML documents and random field values never escape as anything but ConfigError;
hostile values never make a planning command crash."""

from __future__ import annotations

import copy
import shutil
import sys
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpubuild.config.recipe import load_recipe_file
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
    "warmup": {"enabled": False, "max_records": 4},
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
    @given(st.text(alphabet=st.sampled_from(list("ab:-[]{}#&*!|>'\" \n\t,?%@`0.\x00\x01")), max_size=60))
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


# Values mutated the way hostile recipes do (floats for ints, huge ints, NaN,
# null bytes, long strings, alias bombs), then every planning command a user would run
# next on whatever validates. Only exit codes 0, 1, 2; an exception escaping the CLI
# would be a traceback.

BUILDABLE = {
    "name": "r",
    "model": {"saved_model": "../models/toy", "tags": ["serve"]},
    "converter": {
        "tpu_functions": [{"signature_name": "serving_default"}],
        "batch_options": [{
            "num_batch_threads": 2, "max_batch_size": 8, "batch_timeout_micros": 5000, "allowed_batch_sizes": [4, 8],
            "max_enqueued_batches": 10, "disable_large_batch_splitting": False,
            "experimental": {"signature_name": "serving_default"},
        }],
        "bfloat16_optimization": "ENABLED",
        "io_shape_optimization": "disabled",
        "bfloat16_optimization_options": {"scope": "ALL", "filterlist": ["Softmax"]},
        "xla_sharding_options": {
            "num_cores_per_replica": 2, "device_assignment": [0, 0, 0, 0, 0, 0, 0, 1],
            "topology": {"mesh_shape": [1, 1, 1, 2], "device_coordinates": [0, 0, 0, 0, 0, 0, 0, 1]},
        },
        "quantization_options": {
            "method": "DYNAMIC_RANGE",
            "representative_datasets": {"serving_default": {"tfrecord_file_path": "../data/d.tfrecord"}},
        },
    },
    "verify": {"samples": 3, "seed": 1, "rtol": 0.1, "atol": 0.01},
    "warmup": {"enabled": True, "max_records": 10},
}
BUILDABLE_PATHS = [p for p in _paths(BUILDABLE) if p]

KEEP = object()  # the value already there: the mutated recipe may still validate

hostile = st.one_of(
    st.just(KEEP),
    st.integers(0, 2**31 - 1),  # right for some fields, out of range for others
    st.integers(-3, 2**40).map(float),  # `max_batch_size: 8.0`
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.integers(2**31 - 2, 2**80) | st.integers(-(2**80), -(2**31) + 1),  # beyond int32
    st.text(max_size=4).map(lambda t: f"{t}\0{t}"),  # null bytes
    st.integers(250, 400).map(lambda n: "a" * n),  # longer than a file name may be
    st.sampled_from(["-rf", "--help", "x=1", "a b", "\N{SNOWMAN}", "../../etc/passwd", "/etc/passwd", "~/x"]),
    values,
)
PLACEHOLDER = "HOSTILE_VALUE_HERE"


def _alias_bomb(levels: int, fanout: int) -> tuple[str, str]:
    """(anchor lines, the alias to use as a value): fanout ** levels leaves."""
    lines = [f"b0: &b0 [{', '.join(['lol'] * fanout)}]"]
    lines += [f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * fanout)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n", f"*b{levels - 1}"


def _mutated(path: tuple, value) -> dict:
    document = copy.deepcopy(BUILDABLE)
    target = document
    for part in path[:-1]:
        target = target[part]
    if value is not KEEP:
        target[path[-1]] = value
    return document


def test_hostile_values_then_render_and_dry_run(tmp_path_factory, run_cli):
    root = _workspace(tmp_path_factory)
    (root / "data").mkdir()
    (root / "data" / "d.tfrecord").write_bytes(b"")  # validation checks it exists; nothing reads it
    recipe = root / "recipes" / "r.yaml"
    tensorflow_before = "tensorflow" in sys.modules
    reached = {"validated": 0, "refused": 0}

    def planning(*argv: str) -> int:
        code, _, err = run_cli("--workspace", str(root), *argv)
        assert code in (0, 1, 2), (argv, code, err)
        assert all(line.startswith(("recipes/r.yaml", "error: ")) for line in err.splitlines()), err
        return code

    def check(text: str) -> None:
        recipe.write_text(text)
        if planning("validate") == 0:
            reached["validated"] += 1
            for fmt in ("textproto", "json", "yaml"):
                planning("render", "r", "--format", fmt)
            planning("build", "--dry-run")
            planning("list", "--json")
        else:
            reached["refused"] += 1

    check(yaml.safe_dump(BUILDABLE))
    assert reached == {"validated": 1, "refused": 0}  # the unmutated recipe goes all the way

    # derandomize: the same examples every run, so that "both roads were taken" below
    # holds every time (a random run may draw no value that validates).
    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(BUILDABLE_PATHS), hostile)
    def mutate_a_value(path, value):
        check(yaml.safe_dump(_mutated(path, value), width=float("inf"), allow_unicode=True))

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(BUILDABLE_PATHS), st.integers(1, 9), st.integers(1, 10))
    def alias_bomb_as_a_value(path, levels, fanout):
        anchors, alias = _alias_bomb(levels, fanout)
        text = yaml.safe_dump(_mutated(path, PLACEHOLDER), width=float("inf"))
        check(anchors + text.replace(PLACEHOLDER, alias))

    mutate_a_value()
    alias_bomb_as_a_value()
    assert reached["validated"] > 1 and reached["refused"] > 1, reached  # both roads were taken
    # build --dry-run and render are planning commands: TensorFlow stays out.
    assert tensorflow_before or "tensorflow" not in sys.modules
