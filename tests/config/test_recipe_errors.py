"""Every schema and semantic error, with its exact `file:line:col: path: message`."""

from __future__ import annotations

import pytest

from tpubuild.config.workspace import load_workspace
from tpubuild.errors import ConfigError


def errors_of(ws, recipe_text: str, name: str = "r") -> list[str]:
    return ws.errors_of(recipe_text, name)


MODEL = "model: {saved_model: ../models/toy}\n"


def test_yaml_syntax_error_names_file_line_col(ws):
    assert errors_of(ws, "model: [1\nname: x\n") == [
        "recipes/r.yaml:2:5: YAML syntax error: while parsing a flow sequence, did not find expected ',' or ']'"
    ]


def test_duplicate_key_is_an_error_not_silently_last_wins(ws):
    assert errors_of(ws, MODEL + "verify: {samples: 1}\nverify: {samples: 2}\n") == [
        "recipes/r.yaml:3:1: verify: duplicate key (first set on line 2)"
    ]


def test_recipe_must_be_a_mapping(ws):
    assert errors_of(ws, "- a\n- b\n") == ["recipes/r.yaml:1:1: a recipe must be a mapping of keys to values"]


def test_unknown_key_suggests_the_closest(ws):
    assert errors_of(ws, MODEL + "converter:\n  tpu_function: []\n") == [
        "recipes/r.yaml:3:3: converter.tpu_function: unknown key 'tpu_function' (did you mean 'tpu_functions'?)"
    ]


def test_mis_indented_key_is_rejected(ws):
    # pre-commit #979: a key indented one level too far was silently ignored.
    text = MODEL + "converter:\n  batch_options:\n    - max_batch_size: 4\n  num_batch_threads: 2\n"
    assert errors_of(ws, text) == [
        "recipes/r.yaml:5:3: converter.num_batch_threads: unknown key 'num_batch_threads' (allowed: batch_options, "
        "bfloat16_optimization, bfloat16_optimization_options, disable_default_optimizations, "
        "enable_device_placement_safety_checks, experimental_options, io_shape_optimization, "
        "quantization_options, tpu_functions, xla_sharding_options)"
    ]


def test_wrong_type_and_enum(ws):
    text = MODEL + "converter:\n  io_shape_optimization: maybe\n  disable_default_optimizations: 3\n"
    assert errors_of(ws, text) == [
        "recipes/r.yaml:3:26: converter.io_shape_optimization: 'maybe' is not one of DEFAULT, ENABLED, DISABLED",
        "recipes/r.yaml:4:34: converter.disable_default_optimizations: expected true or false, got 3",
    ]


def test_max_batch_size_at_least_one(ws):
    text = MODEL + "converter:\n  batch_options:\n    - {max_batch_size: 0}\n"
    assert errors_of(ws, text) == [
        "recipes/r.yaml:4:24: converter.batch_options[0].max_batch_size: must be >= 1, got 0"
    ]


def test_allowed_batch_sizes_must_increase(ws):
    text = MODEL + "converter:\n  batch_options:\n    - max_batch_size: 8\n      allowed_batch_sizes: [2, 8, 4]\n"
    assert errors_of(ws, text) == [
        "recipes/r.yaml:5:35: converter.batch_options[0].allowed_batch_sizes[2]: "
        "allowed_batch_sizes must increase monotonically: 4 follows 8"
    ]


def test_allowed_batch_sizes_must_not_exceed_max_batch_size(ws):
    text = MODEL + "converter:\n  batch_options:\n    - max_batch_size: 8\n      allowed_batch_sizes: [2, 16]\n"
    assert errors_of(ws, text) == [
        "recipes/r.yaml:5:32: converter.batch_options[0].allowed_batch_sizes[1]: "
        "allowed_batch_sizes must end at max_batch_size (8) or below, got 16"
    ]


def test_allowed_batch_sizes_must_end_at_max_without_splitting(ws):
    text = (
        MODEL
        + "converter:\n  batch_options:\n    - max_batch_size: 8\n      allowed_batch_sizes: [2, 4]\n"
        + "      disable_large_batch_splitting: true\n"
    )
    assert errors_of(ws, text) == [
        "recipes/r.yaml:5:32: converter.batch_options[0].allowed_batch_sizes[1]: "
        "allowed_batch_sizes must end at max_batch_size (8) when disable_large_batch_splitting is true, got 4"
    ]


def test_only_one_batch_options_entry(ws):
    text = MODEL + "converter:\n  batch_options:\n    - {max_batch_size: 4}\n    - {max_batch_size: 8}\n"
    assert errors_of(ws, text) == [
        "recipes/r.yaml:5:7: converter.batch_options[1]: "
        "only one batch_options entry is supported (the converter supports one today)"
    ]


def test_same_function_named_twice(ws):
    text = MODEL + "converter:\n  tpu_functions:\n    - function_alias: f\n    - function_alias: f\n"
    assert errors_of(ws, text) == [
        "recipes/r.yaml:5:23: converter.tpu_functions[1].function_alias: names the same function as converter.tpu_functions[0]"
    ]


def test_tpu_function_oneof(ws):
    text = MODEL + "converter:\n  tpu_functions:\n    - function_alias: f\n      signature_name: s\n"
    assert errors_of(ws, text) == [
        "recipes/r.yaml:4:7: converter.tpu_functions[0]: set exactly one of function_alias, "
        "concrete_function_name, signature_name, jit_compile_functions (got function_alias and signature_name)"
    ]


def test_batch_experimental_oneof(ws):
    text = (
        MODEL
        + "converter:\n  batch_options:\n    - max_batch_size: 4\n"
        + "      experimental: {function_alias: f, signature_name: s}\n"
    )
    assert errors_of(ws, text) == [
        "recipes/r.yaml:5:21: converter.batch_options[0].experimental: set exactly one of function_alias, "
        "concrete_function_name, signature_name (got function_alias and signature_name)"
    ]


def test_model_oneof(ws):
    ws.write("export.py", "def export(d): pass\n")
    text = "model:\n  saved_model: ../models/toy\n  export: {script: ../export.py}\n"
    assert errors_of(ws, text) == ["recipes/r.yaml:3:3: model.export: set only one of saved_model or export, not both"]


def test_model_is_required(ws):
    assert errors_of(ws, "verify: {samples: 3}\n") == [
        "recipes/r.yaml:1:1: model is required (model.saved_model or model.export)"
    ]


def test_cores_per_replica_needs_topology(ws):
    text = MODEL + "converter:\n  xla_sharding_options: {num_cores_per_replica: 2}\n"
    assert errors_of(ws, text) == [
        "recipes/r.yaml:3:49: converter.xla_sharding_options.num_cores_per_replica: "
        "num_cores_per_replica is 2, which needs a topology (xla_sharding_options.topology)"
    ]


def test_missing_paths(ws):
    text = (
        "model:\n  saved_model: ../models/nope\n"
        "converter:\n  quantization_options:\n    representative_datasets:\n"
        "      serving_default: {tfrecord_file_path: ../data/nope.tfrecord}\n"
    )
    assert errors_of(ws, text) == [
        "recipes/r.yaml:2:16: model.saved_model: '../models/nope' does not exist",
        "recipes/r.yaml:6:45: converter.quantization_options.representative_datasets.serving_default"
        ".tfrecord_file_path: '../data/nope.tfrecord' does not exist",
    ]


def test_directory_without_saved_model_pb(ws):
    (ws.root / "models" / "empty").mkdir()
    assert errors_of(ws, "model: {saved_model: ../models/empty}\n") == [
        "recipes/r.yaml:1:22: model.saved_model: '../models/empty' is not a SavedModel (no saved_model.pb)"
    ]


def test_paths_may_not_leave_the_workspace(ws):
    assert errors_of(ws, "model: {saved_model: ../../outside}\n") == [
        f"recipes/r.yaml:1:22: model.saved_model: '../../outside' is outside the workspace ({ws.root})"
    ]


def test_export_deps_glob_must_match(ws):
    ws.write("export.py", "def export(d): pass\n")
    text = "model:\n  export: {script: ../export.py, deps: ['../lib/*.py']}\n"
    assert errors_of(ws, text) == ["recipes/r.yaml:2:41: model.export.deps[0]: '../lib/*.py' matches no file"]


def test_dataset_keys_must_be_signature_keys(ws):
    ws.write("data/a.tfrecord", "x")
    text = (
        MODEL + "converter:\n  quantization_options:\n    method: DYNAMIC_RANGE\n"
        "    signature_keys: [serving_default]\n    representative_datasets:\n"
        "      predict: {tfrecord_file_path: ../data/a.tfrecord}\n"
    )
    assert errors_of(ws, text) == [
        "recipes/r.yaml:7:7: converter.quantization_options.representative_datasets.predict: "
        "representative dataset for 'predict', which is not in signature_keys (serving_default)"
    ]


def test_static_range_needs_a_dataset(ws):
    text = MODEL + "converter:\n  quantization_options: {method: static_range}\n"
    assert errors_of(ws, text) == [
        "recipes/r.yaml:3:25: converter.quantization_options: "
        "STATIC_RANGE quantization needs a representative dataset for 'serving_default'"
    ]


def test_all_errors_of_all_files_at_once(ws):
    ws.write("recipes/a.yaml", "model: {saved_model: ../models/nope}\n")
    lines = errors_of(ws, MODEL + "verify: {samples: 0, rtol: -1}\n", name="b")
    assert lines == [
        "recipes/a.yaml:1:22: model.saved_model: '../models/nope' does not exist",
        "recipes/b.yaml:2:19: verify.samples: must be >= 1, got 0",
        "recipes/b.yaml:2:28: verify.rtol: must be >= 0, got -1",
    ]


def test_duplicate_recipe_names_name_both_files(ws):
    # The error points at the second file's `name:` line, where the fix is.
    ws.write("recipes/a.yaml", "name: same\n" + MODEL)
    assert errors_of(ws, "# b\n" + MODEL + "name: same\n", name="b") == [
        "recipes/b.yaml:3:1: name: recipe name 'same' is also used by recipes/a.yaml"
    ]


def test_error_in_an_inherited_key_names_the_base_file(ws):
    ws.write("recipes/common/base.yaml", "model: {saved_model: ../../models/toy}\n" + "converter:\n  batch_options: [{max_batch_size: 0}]\n")
    assert errors_of(ws, "extends: common/base.yaml\n") == [
        "recipes/common/base.yaml:3:36: converter.batch_options[0].max_batch_size: must be >= 1, got 0"
    ]


def test_extends_cycle_and_missing_base(ws):
    ws.write("recipes/common/a.yaml", "extends: b.yaml\n")
    ws.write("recipes/common/b.yaml", "extends: a.yaml\n")
    assert errors_of(ws, "extends: common/a.yaml\n") == [
        "recipes/common/b.yaml:1:10: extends: extends cycle: "
        "recipes/r.yaml -> recipes/common/a.yaml -> recipes/common/b.yaml -> recipes/common/a.yaml"
    ]
    assert errors_of(ws, "extends: common/zzz.yaml\n") == [
        "recipes/r.yaml:1:10: extends: 'common/zzz.yaml' does not exist"
    ]


def test_workspace_file_errors_are_located(ws):
    ws.write("tpubuild.yaml", "recipes: [recipes/*.yaml]\nkeep_versions: 0\noutput: x\n")
    with pytest.raises(ConfigError) as info:
        load_workspace(ws.root)
    assert info.value.lines() == [
        "tpubuild.yaml:2:16: keep_versions: must be >= 1, got 0",
        "tpubuild.yaml:3:1: output: unknown key 'output' (did you mean 'output_dir'?)",
    ]



def test_max_shard_size_below_one_mib(ws):
    assert errors_of(ws, MODEL + "variables: {max_shard_size: 64KiB}\n") == [
        "recipes/r.yaml:2:29: variables.max_shard_size: must be >= 1MiB (1048576 bytes), got 64KiB"
    ]
    ws.write("recipes/r.yaml", MODEL)
    assert errors_of(ws, MODEL + "variables: {max_shard_size: 1000}\n", "s") == [
        "recipes/s.yaml:2:29: variables.max_shard_size: must be >= 1048576, got 1000"
    ]


def test_a_size_that_is_not_one_says_how_sizes_are_written(ws):
    # The schema's pattern says it in words (patternErrorMessage), not as a regex.
    assert errors_of(ws, MODEL + "variables: {max_shard_size: 12 megs}\n") == [
        "recipes/r.yaml:2:29: variables.max_shard_size: '12 megs' is not a size: a whole number of bytes, or a "
        "number with a unit (KiB, MiB, GiB, TiB; KB, MB, GB, TB), e.g. 512MiB or 1.5GiB"
    ]
    ws.write("tpubuild.yaml", "recipes: [recipes/*.yaml]\nworker_memory_limit: 8 gigs\n")
    with pytest.raises(ConfigError) as info:
        load_workspace(ws.root)
    # A oneOf (bytes or a size string): the alternative of the value's type says what is wrong.
    assert info.value.lines() == [
        "tpubuild.yaml:2:22: worker_memory_limit: '8 gigs' is not a size: a whole number of bytes, or a number "
        "with a unit (KiB, MiB, GiB, TiB; KB, MB, GB, TB), e.g. 512MiB or 1.5GiB"
    ]
