"""The canonical form: what is hashed must depend on meaning only."""

from __future__ import annotations

from tpubuild.config.recipe import load_recipe_file, load_recipes
from tpubuild.config.workspace import load_workspace
from tpubuild.pipeline import plan, stage_names

FULL = """
# yaml-language-server: $schema=../schemas/recipe.schema.json
model:
  saved_model: ../models/toy
converter:
  tpu_functions:
    - function_alias: tpu_func
  batch_options:
    - max_batch_size: 8
      allowed_batch_sizes: [2, 4, 8]
  bfloat16_optimization: enabled
  bfloat16_optimization_options: {scope: default, filterlist: [Softmax, Softmax, Exp]}
verify: {rtol: 0.02}
"""

REORDERED = """
verify:
  rtol: 0.02   # a comment, keys reordered, defaults spelled out, enum case changed
converter:
  bfloat16_optimization_options: {filterlist: [Exp, Softmax], scope: TPU, skip_safety_checks: false}
  bfloat16_optimization: ENABLED
  io_shape_optimization: DEFAULT
  batch_options:
    - allowed_batch_sizes: [2, 4, 8]
      max_batch_size: 8
      num_batch_threads: 1
      max_enqueued_batches: 10
  tpu_functions: [{function_alias: tpu_func}]
model: {tags: [serve], saved_model: "../models/./toy"}
"""


def test_equivalent_recipes_hash_the_same(ws):
    a = load_recipe_file(ws.write("recipes/a.yaml", FULL))
    b = load_recipe_file(ws.write("recipes/b.yaml", REORDERED))
    a.canonical.pop("name"), b.canonical.pop("name")
    assert a.canonical == b.canonical
    assert a.canonical_json == b.canonical_json


def test_canonical_document(ws):
    recipe = load_recipe_file(ws.write("recipes/toy.yaml", FULL))
    assert recipe.canonical == {
        "name": "toy",
        "model": {"saved_model": "models/toy", "tags": ["serve"]},
        "converter": {
            "tpu_functions": [{"function_alias": "tpu_func"}],
            "batch_options": [
                {
                    "num_batch_threads": 1,
                    "max_batch_size": 8,
                    "batch_timeout_micros": 0,
                    "allowed_batch_sizes": [2, 4, 8],
                    "max_enqueued_batches": 10,
                    "disable_large_batch_splitting": False,
                }
            ],
            "io_shape_optimization": "DEFAULT",
            "bfloat16_optimization": "ENABLED",
            "disable_default_optimizations": False,
            "bfloat16_optimization_options": {"scope": "TPU", "skip_safety_checks": False, "filterlist": ["Exp", "Softmax"]},
        },
        "verify": {"samples": 32, "seed": 0, "rtol": 0.02, "atol": None, "representative_datasets": {}},
    }
    assert len(recipe.digest) == 64


def test_extends_and_defaults_layering(ws):
    ws.write(
        "tpubuild.yaml",
        "recipes: [recipes/*.yaml]\ndefaults:\n  verify: {samples: 4, atol: 0.5}\n"
        "  converter: {bfloat16_optimization: DISABLED}\n",
    )
    ws.write(
        "recipes/common/base.yaml",
        "model: {saved_model: ../../models/toy}\nconverter:\n  tpu_functions: [{function_alias: a}, {function_alias: b}]\n"
        "  batch_options: [{max_batch_size: 4}]\nverify: {samples: 8}\n",
    )
    ws.write(
        "recipes/child.yaml",
        "extends: common/base.yaml\nconverter:\n  tpu_functions: [{function_alias: c}]\n"
        "  bfloat16_optimization: ENABLED\n",
    )
    (recipe,) = load_recipes(load_workspace(ws.root))
    assert recipe.name == "child"
    converter = recipe.canonical["converter"]
    assert converter["tpu_functions"] == [{"function_alias": "c"}]  # lists are replaced
    assert converter["batch_options"][0]["max_batch_size"] == 4  # mappings merge deeply
    assert converter["bfloat16_optimization"] == "ENABLED"  # recipe beats defaults
    assert recipe.canonical["model"]["saved_model"] == "models/toy"  # base paths are relative to the base
    assert recipe.canonical["verify"] == {"samples": 8, "seed": 0, "rtol": None, "atol": 0.5, "representative_datasets": {}}


def test_export_deps_are_expanded_to_files(ws):
    ws.write("models/export.py", "def export(d): pass\n")
    ws.write("models/lib/b.py", "")
    ws.write("models/lib/a.py", "")
    recipe = load_recipe_file(
        ws.write("recipes/e.yaml", "model:\n  export: {script: ../models/export.py, deps: ['../models/lib/*.py']}\n")
    )
    assert recipe.canonical["model"] == {
        "export": {"script": "models/export.py", "function": "export", "deps": ["models/lib/a.py", "models/lib/b.py"]},
        "tags": ["serve"],
    }
    assert [s.name for s in plan(recipe.canonical)][:1] == ["export"]
    assert plan(recipe.canonical)[0].files == ["models/export.py", "models/lib/a.py", "models/lib/b.py"]


def test_default_optimizations_follow_the_converter(ws):
    base = "model: {saved_model: ../models/toy}\nconverter:\n  tpu_functions: [{function_alias: f}]\n"

    def stages(extra: str) -> list[str]:
        return stage_names(load_recipe_file(ws.write("recipes/s.yaml", base + extra)).canonical)

    assert stages("") == ["source", "tpu", "bfloat16", "io_shape", "verify", "report", "publish"]
    assert stages("  disable_default_optimizations: true\n") == ["source", "tpu", "verify", "report", "publish"]
    assert stages("  disable_default_optimizations: true\n  io_shape_optimization: ENABLED\n") == [
        "source", "tpu", "io_shape", "verify", "report", "publish"
    ]
    assert stages("  bfloat16_optimization: DISABLED\n") == ["source", "tpu", "io_shape", "verify", "report", "publish"]


def test_a_verify_edit_changes_only_the_verify_slice(ws):
    text = "model: {saved_model: ../models/toy}\nconverter:\n  tpu_functions: [{function_alias: f}]\n"
    before = {s.name: s.options for s in plan(load_recipe_file(ws.write("recipes/v.yaml", text)).canonical)}
    after = {
        s.name: s.options
        for s in plan(load_recipe_file(ws.write("recipes/v.yaml", text + "verify: {rtol: 0.1}\n")).canonical)
    }
    assert [name for name in before if before[name] != after[name]] == ["verify"]


def test_verify_datasets_override_quantization_datasets_for_verify_only(ws):
    ws.write("data/q.tfrecord", "q")
    ws.write("data/v.tfrecord", "v")
    recipe = load_recipe_file(
        ws.write(
            "recipes/d.yaml",
            "model: {saved_model: ../models/toy}\nconverter:\n  quantization_options:\n"
            "    representative_datasets: {serving_default: {tfrecord_file_path: ../data/q.tfrecord}}\n"
            "verify:\n  representative_datasets: {serving_default: {tfrecord_file_path: ../data/v.tfrecord}}\n",
        )
    )
    stages = {s.name: s for s in plan(recipe.canonical)}
    assert stages["verify"].options["representative_datasets"] == {"serving_default": {"tfrecord_file_path": "data/v.tfrecord"}}
    assert stages["verify"].files == ["data/v.tfrecord"]
    assert stages["quantize"].options["representative_datasets"] == {"serving_default": {"tfrecord_file_path": "data/q.tfrecord"}}
    assert stages["quantize"].files == ["data/q.tfrecord"]


def test_max_shard_size_spellings_canonicalize_alike_and_add_the_reshard_stage(ws):
    recipes = [load_recipe_file(ws.write(f"recipes/{name}.yaml", "model: {saved_model: ../models/toy}\n"
                                         f"variables: {{max_shard_size: {size}}}\n"))
               for name, size in (("a", "1GiB"), ("b", "1 GiB"), ("c", 1073741824))]
    assert {r.canonical["variables"]["max_shard_size"] for r in recipes} == {1 << 30}
    assert "reshard" in stage_names(recipes[0].canonical)
    assert stage_names(recipes[0].canonical).index("reshard") < stage_names(recipes[0].canonical).index("verify")
    plain = load_recipe_file(ws.write("recipes/d.yaml", "model: {saved_model: ../models/toy}\n"))
    assert "variables" not in plain.canonical and "reshard" not in stage_names(plain.canonical)
