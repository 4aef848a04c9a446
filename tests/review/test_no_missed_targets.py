"""No missed targets: every field of the recipe schema, edited in the recipe,
in its `extends` base or in the workspace defaults, is either reported by `tpubuild diff`
with a cause for every stage whose key inputs changed, or provably changes no key
(comments, key order, equivalent spellings). In process, on the diff's own comparison
(`review.compare.stage_changes`), against the engine's plans (what keys hash)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli import REPO
from tpubuild.config.recipe import load_recipes
from tpubuild.config.workspace import load_workspace
from tpubuild.errors import ConfigError
from tpubuild.pipeline import STAGE_ORDER, TARGET_STAGES, plan
from tpubuild.review.compare import Side, stage_changes

RECIPE = {
    "extends": "common/base.yaml",
    "name": "r",
    "model": {"saved_model": "models/m", "tags": ["serve"]},
    "converter": {
        "tpu_functions": [{"function_alias": "tpu_func"}],
        "batch_options": [{"num_batch_threads": 2, "max_batch_size": 8, "batch_timeout_micros": 5000,
                           "allowed_batch_sizes": [2, 4, 8], "max_enqueued_batches": 10,
                           "disable_large_batch_splitting": False}],
        "bfloat16_optimization": "ENABLED",
        "quantization_options": {"method": "STATIC_RANGE", "signature_keys": ["serving_default"],
                                 "representative_datasets": {"serving_default": {"tfrecord_file_path": "data/d.tfrecord"}}},
    },
    "verify": {"samples": 8, "seed": 0, "rtol": 0.05, "atol": 0.001},
}
BASE = {"converter": {"io_shape_optimization": "DEFAULT", "bfloat16_optimization_options": {"scope": "TPU"}}}
TOPOLOGY = {"mesh_shape": [1, 1, 1, 2], "device_coordinates": [0, 0, 0, 0, 0, 0, 0, 1]}

# One edit per leaf of the recipe schema: (schema path, where in the recipe, new value).
MUTATIONS = [
    ("model.saved_model", ("model", "saved_model"), "models/m2"),
    ("model.tags", ("model", "tags"), ["serve", "tpu"]),
    ("converter.tpu_functions.[0].function_alias", ("converter", "tpu_functions"), [{"function_alias": "other"}]),
    ("converter.tpu_functions.[0].concrete_function_name", ("converter", "tpu_functions"),
     [{"concrete_function_name": "__inference_f_1"}]),
    ("converter.tpu_functions.[0].signature_name", ("converter", "tpu_functions"), [{"signature_name": "serving_default"}]),
    ("converter.tpu_functions.[0].jit_compile_functions", ("converter", "tpu_functions"), [{"jit_compile_functions": True}]),
    ("converter.batch_options.[0].num_batch_threads", ("converter", "batch_options", 0, "num_batch_threads"), 4),
    ("converter.batch_options.[0].max_batch_size", ("converter", "batch_options", 0, "max_batch_size"), 16),
    ("converter.batch_options.[0].batch_timeout_micros", ("converter", "batch_options", 0, "batch_timeout_micros"), 100),
    ("converter.batch_options.[0].allowed_batch_sizes", ("converter", "batch_options", 0, "allowed_batch_sizes"), [4, 8]),
    ("converter.batch_options.[0].max_enqueued_batches", ("converter", "batch_options", 0, "max_enqueued_batches"), 3),
    ("converter.batch_options.[0].disable_large_batch_splitting",
     ("converter", "batch_options", 0, "disable_large_batch_splitting"), True),
    ("converter.batch_options.[0].experimental.function_alias", ("converter", "batch_options", 0, "experimental"),
     {"function_alias": "tpu_func"}),
    ("converter.batch_options.[0].experimental.concrete_function_name",
     ("converter", "batch_options", 0, "experimental"), {"concrete_function_name": "__inference_f_1"}),
    ("converter.batch_options.[0].experimental.signature_name", ("converter", "batch_options", 0, "experimental"),
     {"signature_name": "serving_default"}),
    ("converter.io_shape_optimization", ("converter", "io_shape_optimization"), "DISABLED"),
    ("converter.bfloat16_optimization", ("converter", "bfloat16_optimization"), "DISABLED"),
    ("converter.disable_default_optimizations", ("converter", "disable_default_optimizations"), True),
    ("converter.bfloat16_optimization_options.scope", ("converter", "bfloat16_optimization_options", "scope"), "ALL"),
    ("converter.bfloat16_optimization_options.skip_safety_checks",
     ("converter", "bfloat16_optimization_options", "skip_safety_checks"), True),
    ("converter.bfloat16_optimization_options.filterlist", ("converter", "bfloat16_optimization_options", "filterlist"),
     ["Softmax"]),
    # ConverterOptionsV2's fields (issue 47): preserve_signature and convert_checkpoint only with scope ALL.
    ("converter.bfloat16_optimization_options.preserve_signature", ("converter", "bfloat16_optimization_options"),
     {"scope": "ALL", "preserve_signature": True}),
    ("converter.bfloat16_optimization_options.experimental.convert_checkpoint",
     ("converter", "bfloat16_optimization_options"), {"scope": "ALL", "experimental": {"convert_checkpoint": True}}),
    ("converter.enable_device_placement_safety_checks", ("converter", "enable_device_placement_safety_checks"), True),
    ("converter.experimental_options.graph_pruning", ("converter", "experimental_options"), {"graph_pruning": "DISABLED"}),
    ("converter.tpu_functions.[0].enable_soft_device_placement", ("converter", "tpu_functions"),
     [{"function_alias": "tpu_func", "enable_soft_device_placement": True}]),
    ("converter.xla_sharding_options.num_cores_per_replica", ("converter", "xla_sharding_options"),
     {"num_cores_per_replica": 2, "topology": TOPOLOGY}),
    ("converter.xla_sharding_options.device_assignment", ("converter", "xla_sharding_options"),
     {"num_cores_per_replica": 2, "topology": TOPOLOGY, "device_assignment": [0, 0, 0, 0, 0, 0, 0, 1]}),
    ("converter.xla_sharding_options.topology.mesh_shape", ("converter", "xla_sharding_options"),
     {"num_cores_per_replica": 1, "topology": {"mesh_shape": [1, 1, 1, 1], "device_coordinates": [0, 0, 0, 0]}}),
    ("converter.xla_sharding_options.topology.device_coordinates", ("converter", "xla_sharding_options"),
     {"num_cores_per_replica": 1, "topology": {"mesh_shape": [1, 1, 1, 2], "device_coordinates": [0, 0, 0, 1]}}),
    ("converter.quantization_options.method", ("converter", "quantization_options", "method"), "DYNAMIC_RANGE"),
    ("converter.quantization_options.tags", ("converter", "quantization_options", "tags"), ["serve", "tpu"]),
    ("converter.quantization_options.signature_keys", ("converter", "quantization_options"),
     {"method": "STATIC_RANGE", "signature_keys": ["serving_default", "other"],
      "representative_datasets": {"serving_default": {"tfrecord_file_path": "data/d.tfrecord"},
                                  "other": {"tfrecord_file_path": "data/e.tfrecord"}}}),
    *((f"converter.quantization_options.unit_wise_quantization_specs.[0].{leaf}",
       ("converter", "quantization_options", "unit_wise_quantization_specs"), value)
      for leaf, value in (
          ("unit.[0].op_type", [{"unit": [{"op_type": "MatMul"}]}]),
          ("unit.[0].node_name", [{"unit": [{"node_name": "dense/MatMul"}]}]),
          ("unit.[0].func_name", [{"unit": [{"node_name": "MatMul", "func_name": "__inference_f_1"}]}]),
          ("method", [{"unit": [{"op_type": "Conv2D"}], "method": "NO_QUANTIZE"}]))),
    ("converter.quantization_options.allow_unquantized", ("converter", "quantization_options", "allow_unquantized"), True),
    ("converter.quantization_options.op_set", ("converter", "quantization_options", "op_set"), "xla"),  # a spelling
    ("converter.quantization_options.representative_datasets",
     ("converter", "quantization_options", "representative_datasets"),
     {"serving_default": {"tfrecord_file_path": "data/e.tfrecord"}}),
    # Every stage loads the libraries first, so every key covers them (an installed module).
    ("op_libraries", ("op_libraries",), ["numpy"]),
    ("verify.samples", ("verify", "samples"), 9),
    ("verify.seed", ("verify", "seed"), 1),
    ("verify.rtol", ("verify", "rtol"), 0.1),
    ("verify.atol", ("verify", "atol"), 0.01),
    ("verify.representative_datasets", ("verify", "representative_datasets"),
     {"serving_default": {"tfrecord_file_path": "data/e.tfrecord"}}),
    # The recipe batches, so warmup runs by default: off removes the stage, max_records keys it.
    ("warmup.enabled", ("warmup", "enabled"), False),
    ("warmup.max_records", ("warmup", "max_records"), 10),
    # Adds the reshard stage (and changes what verify and everything after it read).
    ("variables.max_shard_size", ("variables", "max_shard_size"), "2MiB"),
    # Where versions are published and how TF Serving labels them: in no key, so never reported.
    ("publish_to", ("publish_to",), "s3://bucket/models"),
    ("serving.version_labels", ("serving", "version_labels"), {"stable": 3}),
    # How versions are pushed to an oci:// destination: in no key either.
    ("oci.format", ("oci", "format"), "modelcar"),
    ("oci.base_image", ("oci",), {"format": "modelcar", "base_image": "tools/busybox:1.36"}),
    ("oci.insecure", ("oci", "insecure"), True),
]
# `targets:`: each option of each target whose stages this tpubuild has.
TARGET_MUTATIONS = [
    ("targets.cpu_savedmodel.optimize", ("targets", "cpu_savedmodel", "optimize"), False),
    ("targets.cpu_savedmodel.rtol", ("targets", "cpu_savedmodel", "rtol"), 0.1),
    ("targets.cpu_savedmodel.atol", ("targets", "cpu_savedmodel", "atol"), 0.01),
    ("targets.litert.quantization", ("targets", "litert", "quantization"), "dynamic_range"),
    ("targets.litert.composites", ("targets", "litert", "composites"), ["lstm"]),
    ("targets.litert.select_tf_ops", ("targets", "litert", "select_tf_ops"), True),
    ("targets.litert.signatures", ("targets", "litert", "signatures"), ["serving_default"]),
    ("targets.litert.rtol", ("targets", "litert", "rtol"), 0.1),
    ("targets.litert.atol", ("targets", "litert", "atol"), 0.01),
    ("targets.xla_aot.signatures", ("targets", "xla_aot"), {"batch_sizes": [1], "signatures": ["other"]}),
    ("targets.xla_aot.batch_sizes", ("targets", "xla_aot"), {"batch_sizes": [1, 2]}),
    ("targets.xla_aot.rtol", ("targets", "xla_aot"), {"batch_sizes": [1], "rtol": 0.1}),
    ("targets.xla_aot.atol", ("targets", "xla_aot"), {"batch_sizes": [1], "atol": 0.01}),
]
_MISSING = [t for t, chain in TARGET_STAGES.items() if chain and chain[0] not in STAGE_ORDER]
MUTATIONS += [m for m in TARGET_MUTATIONS if m[1][1] not in _MISSING]
# Leaves not edited here, and why: the file's own metadata, the export form of `model`
# (its script, function and deps are inputs of the export stage: tests/review/test_diff.py),
# and the options of a target whose stages are not in this tpubuild (a recipe naming it is refused).
NOT_MUTATED = {"$schema", "name", "extends", "model.export.script", "model.export.function", "model.export.deps",
               *(m[0] for m in TARGET_MUTATIONS if m[1][1] in _MISSING)}


def schema_leaves() -> set[str]:
    schema = json.loads((REPO / "schemas" / "recipe.schema.json").read_text())
    out: set[str] = set()

    def walk(node: dict, path: list[str]) -> None:
        if "properties" in node:
            for key, sub in node["properties"].items():
                walk(sub, [*path, key])
        elif node.get("type") == "array" and isinstance(node.get("items"), dict) and (
                "properties" in node["items"] or "oneOf" in node["items"]):
            walk(node["items"], [*path, "[0]"])
        elif "oneOf" in node:
            for option in node["oneOf"]:
                walk(option, path)
        else:
            out.add(".".join(path))

    walk(schema, [])
    return out


def test_every_schema_leaf_has_a_mutation():
    assert schema_leaves() - NOT_MUTATED == {m[0] for m in MUTATIONS}


def _set(document: dict, where: tuple, value) -> None:
    for key in where[:-1]:
        document = document.setdefault(key, {}) if isinstance(key, str) else document[key]
    document[where[-1]] = copy.deepcopy(value)


def _workspace(root: Path, recipe: dict, base: dict, defaults: dict) -> dict:
    (root / "recipes" / "common").mkdir(parents=True)
    for model in ("m", "m2"):
        (root / "recipes" / "models" / model).mkdir(parents=True)
        (root / "recipes" / "models" / model / "saved_model.pb").write_bytes(b"")
    (root / "recipes" / "data").mkdir()
    for name in ("d", "e"):
        (root / "recipes" / "data" / f"{name}.tfrecord").write_bytes(b"")
    workspace = {"recipes": ["recipes/*.yaml"], **({"defaults": defaults} if defaults else {})}
    (root / "tpubuild.yaml").write_text(yaml.safe_dump(workspace))
    (root / "recipes" / "common" / "base.yaml").write_text(yaml.safe_dump(base))
    (root / "recipes" / "r.yaml").write_text("# the recipe\n" + yaml.safe_dump(recipe, sort_keys=False))
    ws = load_workspace(root)
    return {"ws": ws, "recipe": load_recipes(ws)[0]}


def _key_parts(canonical: dict) -> dict:
    """What each stage's key hashes from the recipe (the rest are file contents and code)."""
    return {p.name: (p.options, p.files, sorted(p.consumes.items()), p.summaries) for p in plan(canonical)}


def _check(tmp: Path, where: str, path: tuple, value) -> None:
    recipe, base, defaults = copy.deepcopy(RECIPE), copy.deepcopy(BASE), {}
    head_recipe, head_base, head_defaults = copy.deepcopy(recipe), copy.deepcopy(base), copy.deepcopy(defaults)
    target = {"recipe": head_recipe, "base": head_base, "defaults": head_defaults}[where]
    lists = [i for i, key in enumerate(path) if not isinstance(key, str)]
    if lists and where != "recipe":
        # Lists merge whole: the base or defaults get the recipe's list, edited.
        edited = copy.deepcopy(recipe)
        _set(edited, path, value)
        prefix = path[: lists[0]]
        document = edited
        for key in prefix:
            document = document[key]
        _set(target, prefix, document)
    else:
        _set(target, path, value)
    try:
        old = _workspace(tmp / "base", recipe, base, defaults)
        new = _workspace(tmp / "head", head_recipe, head_base, head_defaults)
    except ConfigError:
        # Refused by the validator, so it never reaches a build: only a path written
        # relative to a base file or the workspace file that does not exist from there.
        assert where != "recipe", (path, value)
        return
    reported = {change.stage: change.causes for change in
                stage_changes(Side("base", {}, old["ws"]), Side("head", {}, new["ws"]), old["recipe"], new["recipe"],
                              changed=set())}
    before, after = _key_parts(old["recipe"].canonical), _key_parts(new["recipe"].canonical)
    for stage, parts in after.items():
        if before.get(stage) != parts:
            assert stage in reported and reported[stage], (where, path, stage)
    if before == after:
        assert not reported, (where, path, reported)  # provably no key changed: nothing reported


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=st.sampled_from(MUTATIONS), where=st.sampled_from(["recipe", "base", "defaults"]))
def test_every_field_edit_is_reported_or_changes_no_key(tmp_path_factory, mutation, where):
    _, path, value = mutation
    _check(tmp_path_factory.mktemp("m"), where, path, value)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_each_field_edit_in_the_recipe(tmp_path, mutation):
    _check(tmp_path, "recipe", mutation[1], mutation[2])


def test_comment_key_order_and_spelling_change_no_key(tmp_path):
    old = _workspace(tmp_path / "base", RECIPE, BASE, {})
    spelled = copy.deepcopy(RECIPE)
    spelled["converter"]["bfloat16_optimization"] = "enabled"
    spelled = dict(reversed(list(spelled.items())))
    new = _workspace(tmp_path / "head", spelled, BASE, {})
    (tmp_path / "head" / "recipes" / "r.yaml").write_text("# another comment\n" + yaml.safe_dump(spelled, sort_keys=False))
    assert old["recipe"].canonical == load_recipes(load_workspace(tmp_path / "head"))[0].canonical
    assert stage_changes(Side("base", {}, old["ws"]), Side("head", {}, new["ws"]), old["recipe"], new["recipe"],
                         changed=set()) == []
