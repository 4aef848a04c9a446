"""Issue 47: converter text protos of both dialects read into a recipe's converter section
(tpubuild/converter_text.py), `tpubuild import` and the import -> render round trip.
TensorFlow-free: the commands run as a user runs them, in subprocesses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import REPO, tpubuild
from tpubuild.converter_text import read_text_proto
from tpubuild.errors import ConfigError

GUIDE_TEXT = """\
tpu_functions {
  function_alias: "tpu_func"
}
batch_options {
  num_batch_threads: 2
  max_batch_size: 8
  batch_timeout_micros: 5000
  allowed_batch_sizes: 4
  allowed_batch_sizes: 8
  max_enqueued_batches: 10
  experimental {
    function_alias: "batch_func"
  }
}
io_shape_optimization: DISABLED
bfloat16_optimization_options {
  scope: ALL
  filterlist: "Softmax"
}
xla_sharding_options {
  num_cores_per_replica: 2
  topology: "\\n\\004\\001\\001\\001\\002\\020\\001\\030\\002\\\"\\010\\000\\000\\000\\000\\000\\000\\000\\001"
}
external_feature_configs {
  quantization_options {
    quantization_method {
      preset_method: METHOD_STATIC_RANGE_INT8
    }
    op_set: XLA
    tags: "serve"
    signature_keys: "serving_default"
    representative_datasets {
      key: "serving_default"
      value {
        tfrecord_file_path: "data/toy.tfrecord"
      }
    }
  }
}
"""

V2_TEXT = """\
tpu_functions {
  function_alias: "tpu_func"
  enable_soft_device_placement: true
}
enable_device_placement_safety_checks: true
batch_options {
  num_batch_threads: 2
  max_batch_size: 8
  allowed_batch_sizes: 8
  max_enqueued_batches: 10
  signature_name: "serving_default"
}
bfloat16_optimization_options {
  scope: ALL
  preserve_signature: true
  experimental {
    convert_checkpoint: true
  }
}
experimental_options {
  graph_pruning: DISABLED
}
"""


def test_the_guides_dialect_is_read_field_for_field() -> None:
    imported = read_text_proto(GUIDE_TEXT, "guide.pbtxt")
    assert imported.dialect == "ConverterOptions"
    assert imported.converter == {
        "tpu_functions": [{"function_alias": "tpu_func"}],
        "batch_options": [{"num_batch_threads": 2, "max_batch_size": 8, "batch_timeout_micros": 5000,
                           "allowed_batch_sizes": [4, 8], "max_enqueued_batches": 10,
                           "experimental": {"function_alias": "batch_func"}}],
        "io_shape_optimization": "DISABLED",
        "bfloat16_optimization_options": {"scope": "ALL", "filterlist": ["Softmax"]},
        "xla_sharding_options": {"num_cores_per_replica": 2,
                                 "topology": {"mesh_shape": [1, 1, 1, 2], "device_coordinates": [0, 0, 0, 0, 0, 0, 0, 1]}},
        "quantization_options": {"method": "STATIC_RANGE", "op_set": "XLA", "tags": ["serve"],
                                 "signature_keys": ["serving_default"],
                                 "representative_datasets": {"serving_default": {"tfrecord_file_path": "data/toy.tfrecord"}}},
    }


def test_v2_is_told_apart_by_its_fields() -> None:
    imported = read_text_proto(V2_TEXT, "v2.pbtxt")
    assert imported.dialect == "ConverterOptionsV2"
    assert imported.converter == {
        "tpu_functions": [{"function_alias": "tpu_func", "enable_soft_device_placement": True}],
        "enable_device_placement_safety_checks": True,
        # V2's top-level batch component, in the recipe's one spelling.
        "batch_options": [{"num_batch_threads": 2, "max_batch_size": 8, "allowed_batch_sizes": [8],
                           "max_enqueued_batches": 10, "experimental": {"signature_name": "serving_default"}}],
        "bfloat16_optimization_options": {"scope": "ALL", "preserve_signature": True,
                                          "experimental": {"convert_checkpoint": True}},
        "experimental_options": {"graph_pruning": "DISABLED"},
    }


def test_a_tpu_xla_function_is_a_tpu_function() -> None:
    imported = read_text_proto('xla_functions { device_type: TPU function_alias: "f" '
                               "enable_soft_device_placement: true }", "s")
    assert imported.converter == {"tpu_functions": [{"function_alias": "f", "enable_soft_device_placement": True}]}


def test_what_tpubuild_cannot_carry_out_is_refused_one_line_each() -> None:
    text = """
        tpu_functions { function_alias: "tpu_func" }
        xla_functions { device_type: GPU function_alias: "gpu_func" }
        xla_functions { device_type: TPU function_alias: "f" device_name: "/device:GPU:0" }
        enable_shared_replicate_cluster_name: true
        batch_options { max_batch_size: 8 low_priority_batch_options { max_batch_size: 4 } }
        bfloat16_optimization_options { scope: GPU enable_cast_outside: true }
        xla_io_optimization: ENABLED
        xla_io_optimization_options { input_packing_threshold: 10 }
        non_xla_device_placement_options { place_variables_on_cpu: ENABLED }
        xla_sharding_options { num_cores_per_replica: 1 use_shardy_partitioner: true
                               sharding_specs { var_name_regex: "w" } }
        experimental_options { graph_pruning: ENABLED }
    """
    with pytest.raises(ConfigError) as info:
        read_text_proto(text, "--converter_options_string")
    gpu = "GPU only (tpubuild converts for the TPU)"
    where = "--converter_options_string"
    assert info.value.lines() == [
        f"{where}: batch_options[0].low_priority_batch_options: refused: priority queue batching: tpubuild's batch "
        "stage does not set BatchFunction's low-priority attributes",
        f"{where}: bfloat16_optimization_options.enable_cast_outside: refused: tpubuild casts inside the function "
        "(after its arguments, before its results), not around the call",
        f"{where}: bfloat16_optimization_options.scope: refused: GPU: XLA GPU computation is {gpu}",
        f"{where}: enable_shared_replicate_cluster_name: refused: one TPU cluster name for every TPU function is for "
        "Pathways models; tpubuild gives each TPU function its own cluster",
        f"{where}: experimental_options.graph_pruning: refused: ENABLED: tpubuild keeps every function of the model "
        "(it has no pruning)",
        f"{where}: non_xla_device_placement_options: refused: placement beside XLA GPU functions: {gpu}",
        f"{where}: xla_functions[0].device_type: refused: GPU: {gpu}",
        f"{where}: xla_functions[1].device_name: refused: names the GPU of a GPU function: {gpu}",
        f"{where}: xla_io_optimization: refused: packs inputs of XLA GPU functions: {gpu}",
        f"{where}: xla_io_optimization_options: refused: packs inputs of XLA GPU functions: {gpu}",
        f"{where}: xla_sharding_options.sharding_specs: refused: tpubuild does not annotate variables with shardings",
        f"{where}: xla_sharding_options.use_shardy_partitioner: refused: tpubuild leaves the choice of partitioner "
        "to the TPU runtime",
    ]


def test_v2_scope_all_must_say_what_tpubuild_does() -> None:
    with pytest.raises(ConfigError) as info:
        read_text_proto('tpu_functions { function_alias: "f" enable_soft_device_placement: true } '
                        "bfloat16_optimization_options { scope: ALL }", "s")
    assert info.value.lines() == [
        "s: bfloat16_optimization_options.experimental.convert_checkpoint: refused: scope ALL without "
        "convert_checkpoint keeps the checkpoint float32, and tpubuild stores the variables it converts in "
        "bfloat16: set experimental { convert_checkpoint: true }",
        "s: bfloat16_optimization_options.preserve_signature: refused: scope ALL without preserve_signature "
        "changes the signature to bfloat16, and tpubuild always keeps the signature's types: set "
        "preserve_signature: true",
    ]


@pytest.mark.parametrize(("text", "line"), [
    ('tpu_functions {\n  function_alias: "tpu_func"\n', "s:2:19: Expected \"}\""),
    ('tpu_functions { function_alias: "f" }\nbatch_options {\n  max_batch_size: 8\n  experimental { sig: "x" }\n}',
     's:4:18: Message type "BatchOptions.Experimental" has no field named "sig" '
     "(reading it as ConverterOptions; as ConverterOptionsV2 it fails earlier)"),
    ('tpu_functions { function_alias: "f" enable_soft_device_placement: true }\nbatch_options { experimental {} }',
     's:2:17: Message type "BatchOptionsV2" has no field named "experimental" '
     "(reading it as ConverterOptionsV2; as ConverterOptions it fails earlier)"),
    ("io_shape_optimization: SOMETIMES",
     's:1:24: \'io_shape_optimization: SOMETIMES\': Enum type "ConverterOptions.State" has no value named SOMETIMES'),
])
def test_malformed_text_is_one_line_at_its_line_and_column(text: str, line: str) -> None:
    with pytest.raises(ConfigError) as info:
        read_text_proto(text, "s")
    assert info.value.lines() == [line]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    assert tpubuild(tmp_path, "init", ".").returncode == 0
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "toy.tfrecord").write_bytes(b"")
    (tmp_path / "exported" / "toy").mkdir(parents=True)  # what a recipe names must exist to render
    (tmp_path / "exported" / "toy" / "saved_model.pb").write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize(("text", "fmt"), [(GUIDE_TEXT, "textproto"), (V2_TEXT, "textproto-v2")])
def test_import_then_render_gives_the_imported_message_back(workspace: Path, text: str, fmt: str) -> None:
    (workspace / "tuned.pbtxt").write_text(text)
    done = tpubuild(workspace, "import", "tuned.pbtxt", "--saved-model", "exported/toy")
    dialect = "ConverterOptions" if fmt == "textproto" else "ConverterOptionsV2"
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f"wrote recipes/tuned.yaml from tuned.pbtxt ({dialect})\n", "")
    recipe = (workspace / "recipes" / "tuned.yaml").read_text()
    assert recipe.startswith(f"# Imported by `tpubuild import` from tuned.pbtxt (a {dialect} text proto).\n"
                             "name: tuned\nmodel:\n  saved_model: ../exported/toy\nconverter:\n")
    rendered = tpubuild(workspace, "render", "tuned", "--format", fmt)
    assert (rendered.returncode, rendered.stderr) == (0, "")
    assert rendered.stdout == text


def test_import_never_overwrites_and_refuses_in_one_line(workspace: Path) -> None:
    (workspace / "toy.pbtxt").write_text('tpu_functions { function_alias: "tpu_func" }\n')
    assert tpubuild(workspace, "import", "toy.pbtxt").returncode == 0
    assert "  saved_model: ../exported/toy   # the SavedModel to convert: edit (import --saved-model)\n" in \
        (workspace / "recipes" / "toy.yaml").read_text()
    before = (workspace / "recipes" / "toy.yaml").read_bytes()
    again = tpubuild(workspace, "import", "toy.pbtxt")
    assert (again.returncode, again.stderr) == (
        2, "error: recipes/toy.yaml: exists; give another --name (import never overwrites a recipe)\n")
    assert (workspace / "recipes" / "toy.yaml").read_bytes() == before
    (workspace / "gpu.pbtxt").write_text('xla_functions { device_type: GPU function_alias: "f" }\n')
    refused = tpubuild(workspace, "import", "gpu.pbtxt", "--name", "gpu")
    assert (refused.returncode, refused.stderr) == (
        2, "gpu.pbtxt: xla_functions[0].device_type: refused: GPU: GPU only (tpubuild converts for the TPU)\n")
    assert not (workspace / "recipes" / "gpu.yaml").exists()


def test_import_render_and_validate_do_not_import_tensorflow(workspace: Path) -> None:
    (workspace / "v2.pbtxt").write_text(V2_TEXT)
    code = ("import sys\nfrom tpubuild.cli import main\n"
            "for args in (['import', 'v2.pbtxt', '--saved-model', 'exported/toy'],\n"
            "             ['render', 'v2', '--format', 'textproto-v2'], ['validate', 'v2']):\n"
            "    try:\n        main(args)\n    except SystemExit as e:\n        assert not e.code, e.code\n"
            "assert 'tensorflow' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=workspace, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_migration_guide_shows_the_text_protos_it_imports() -> None:
    repo = REPO
    page = (repo / "docs" / "migrating-from-the-converter.md").read_text()
    import re

    shown = re.findall(r"```textproto\n(.*?)```", page, re.S)
    files = [(repo / "recipes" / "converter" / name).read_text() for name in ("toy_guide.pbtxt", "toy_v2.pbtxt")]
    assert shown == files
    assert [read_text_proto(text, "doc").dialect for text in files] == ["ConverterOptions", "ConverterOptionsV2"]
