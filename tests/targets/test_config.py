"""`targets:` in the recipe: schema errors (one line, file:line), canonical defaults,
the plan of target chains, and which stages a target-only change reruns (TensorFlow-free)."""

from __future__ import annotations

import pytest
import yaml

from tests.cli import run_cli
from tests.config.conftest import WorkspaceFactory
from tpubuild.config.canonical import canonicalize
from tpubuild.config.recipe import load_recipes
from tpubuild.config.workspace import load_workspace
from tpubuild.pipeline import STAGE_ORDER, TARGET_STAGES, plan, stage_names

MODEL = "model: {saved_model: ../models/toy}\n"
# The target chains this checkout has stage modules for (the others land with their branches).
AVAILABLE = [t for t, chain in TARGET_STAGES.items() if chain and chain[0] in STAGE_ORDER]
TPU_STAGES = {"tpu", "bfloat16", "io_shape", "batch"}
MINIMAL = {"cpu_savedmodel": {}, "litert": {}, "xla_aot": {"batch_sizes": [1]}}  # the least each target needs


@pytest.fixture
def ws(tmp_path) -> WorkspaceFactory:
    return WorkspaceFactory(tmp_path)


def canonical_of(ws: WorkspaceFactory, text: str) -> dict:
    ws.write("recipes/r.yaml", text)
    return load_recipes(load_workspace(ws.root))[0].canonical


def schema_errors(ws: WorkspaceFactory, text: str) -> list[str]:
    """The errors of a recipe, without the one for a target whose stages are not here yet."""
    return [line for line in ws.errors_of(text) if "is not available in this tpubuild" not in line]


def test_unknown_target_and_option_are_one_line_errors(ws):
    assert ws.errors_of(MODEL + "targets:\n  cpu_savedmodle: {}\n") == [
        "recipes/r.yaml:3:3: targets.cpu_savedmodle: unknown key 'cpu_savedmodle' (did you mean 'cpu_savedmodel'?)"
    ]
    assert ws.errors_of(MODEL + "targets:\n  cpu_savedmodel: {optimise: false}\n") == [
        "recipes/r.yaml:3:20: targets.cpu_savedmodel.optimise: unknown key 'optimise' (did you mean 'optimize'?)"
    ]
    assert ws.errors_of(MODEL + "targets:\n  cpu_savedmodel: {optimize: 1}\n") == [
        "recipes/r.yaml:3:30: targets.cpu_savedmodel.optimize: expected true or false, got 1"
    ]
    assert schema_errors(ws, MODEL + "targets:\n  litert: {quantization: int4}\n") == [
        "recipes/r.yaml:3:26: targets.litert.quantization: 'int4' is not one of none, dynamic_range, float16, int8"
    ]
    assert schema_errors(ws, MODEL + "targets:\n  litert: {composites: some}\n") == [
        "recipes/r.yaml:3:24: targets.litert.composites: 'some' is not valid: expected all, none or a list of "
        "composite names"
    ]
    assert schema_errors(ws, MODEL + "targets:\n  xla_aot: {batch_sizes: [0]}\n") == [
        "recipes/r.yaml:3:27: targets.xla_aot.batch_sizes[0]: must be >= 1, got 0"
    ]
    assert schema_errors(ws, MODEL + "targets:\n  xla_aot: {}\n") == [
        "recipes/r.yaml:3:12: targets.xla_aot: 'batch_sizes' is required"
    ]
    assert ws.errors_of(MODEL + "targets:\n  cpu_savedmodel: {rtol: .nan}\n") == [
        "recipes/r.yaml:3:26: targets.cpu_savedmodel.rtol: must be a finite number >= 0, got nan"
    ]


def test_canonical_defaults_and_the_default_target_keeps_the_digest(ws, tmp_path):
    plain = canonical_of(ws, MODEL)
    assert "targets" not in plain  # the TPU SavedModel alone: the canonical form (and digest) of before
    assert canonical_of(ws, MODEL + "targets: {tpu_savedmodel: {}}\n") == plain
    assert canonical_of(ws, MODEL + "targets:\n  cpu_savedmodel: {}\n")["targets"] == {
        "tpu_savedmodel": {}, "cpu_savedmodel": {"optimize": True, "rtol": None, "atol": None}}
    # Every target's defaults, per the targets contract; lists that are sets are sorted.
    data = {"model": {"saved_model": "m"}, "targets": {
        "litert": {"composites": ["lstm", "embedding_lookup", "lstm"]},
        "xla_aot": {"batch_sizes": [8, 1], "signatures": ["b", "a"]}}}
    assert canonicalize(data, "r", tmp_path)["targets"] == {
        "tpu_savedmodel": {},
        "litert": {"quantization": "none", "composites": ["embedding_lookup", "lstm"], "select_tf_ops": False,
                   "signatures": None, "rtol": None, "atol": None},
        "xla_aot": {"signatures": ["a", "b"], "batch_sizes": [1, 8], "rtol": None, "atol": None},
    }


def test_target_chains_run_after_report_and_feed_publish(ws):
    canonical = canonical_of(ws, MODEL + "converter: {tpu_functions: [{function_alias: f}]}\n"
                                         "targets:\n  cpu_savedmodel: {}\n")
    names = stage_names(canonical)
    assert names[names.index("report") + 1:] == ["cpu_savedmodel", "cpu_savedmodel_verify", "publish"]
    planned = {p.name: p for p in plan(canonical)}
    # The CPU SavedModel is the twin of the final TPU artifact; its verifier reads the source.
    assert planned["cpu_savedmodel"].consumes == {"model": "io_shape"}
    assert planned["cpu_savedmodel_verify"].consumes == {"source": "source", "cpu_savedmodel": "cpu_savedmodel"}
    assert planned["publish"].consumes == {"model": "io_shape", "report": "report", "cpu_savedmodel": "cpu_savedmodel"}
    assert planned["publish"].summaries == ("cpu_savedmodel_verify",)
    # A tolerance is the verifier's alone; `optimize` is the build stage's.
    assert "rtol" not in planned["cpu_savedmodel"].options and "optimize" in planned["cpu_savedmodel"].options


@pytest.mark.parametrize("target", ["litert", "xla_aot"])
def test_the_litert_and_xla_aot_chains_read_no_tpu_stage(ws, target):
    """They convert the source, not the TPU artifact (targets contract): nothing the TPU
    stages do can rebuild them."""
    canonical = canonical_of(ws, MODEL + "converter: {tpu_functions: [{function_alias: f}]}\n"
                             + yaml.safe_dump({"targets": {target: MINIMAL[target]}}))
    for planned in plan(canonical):
        if planned.name in TARGET_STAGES[target]:
            read = set(planned.consumes.values()) | set(planned.summaries)
            assert not read & TPU_STAGES, (planned.name, planned.consumes)


# Per target, an option only its chain reads, and a value to change it to.
FLIPS = {"cpu_savedmodel": ("optimize", False), "litert": ("select_tf_ops", True), "xla_aot": ("batch_sizes", [1, 2])}


@pytest.mark.parametrize("target", AVAILABLE)
def test_a_target_only_change_reruns_only_its_chain_and_publish(ws, target):
    from tpubuild.review.compare import Side, compare_recipe

    listed = {t: dict(MINIMAL[t]) for t in AVAILABLE}
    ws.write("recipes/r.yaml", MODEL + yaml.safe_dump({"targets": listed}))
    old = load_recipes(load_workspace(ws.root))[0]
    key, value = FLIPS[target]
    listed[target][key] = value
    ws.write("recipes/r.yaml", MODEL + yaml.safe_dump({"targets": listed}))
    new = load_recipes(load_workspace(ws.root))[0]
    change = compare_recipe(Side("BASE", {"r": old}), Side("HEAD", {"r": new}), old, new, set())
    assert [s.stage for s in change.stages] == [*TARGET_STAGES[target], "publish"]
    assert change.stages[0].causes[0].startswith((f"option {key}: ", f"option {key}["))  # a list names the element


def test_list_shows_targets_and_render_prints_converter_options_only(ws):
    ws.write("recipes/r.yaml", MODEL + "targets:\n  cpu_savedmodel: {optimize: false}\n")
    code, out, err = run_cli("--workspace", str(ws.root), "list")
    assert (code, err) == (0, "")
    assert out == ("r  models/toy  [source > verify > report > cpu_savedmodel > cpu_savedmodel_verify > publish]"
                   "  targets: tpu_savedmodel, cpu_savedmodel\n")
    for fmt in ("textproto", "json", "yaml"):
        code, out, err = run_cli("--workspace", str(ws.root), "render", "r", "--format", fmt)
        assert code == 0 and "optimize" not in out and "cpu_savedmodel" not in out, (fmt, out, err)


def test_diff_shows_each_targets_figures_from_the_lock_files(ws):
    from tpubuild.review.compare import artifact_deltas

    ws.write("recipes/r.yaml", MODEL)
    recipe = load_recipes(load_workspace(ws.root))[0]
    old = {"artifact": {"cpu_savedmodel": {"size_bytes": 1000, "passed": True, "max_abs_error": 0.0}}}
    new = {"recipe_digest": recipe.digest,
           "artifact": {"cpu_savedmodel": {"size_bytes": 800, "passed": True, "max_abs_error": 1e-6}}}
    deltas = artifact_deltas(old, new, recipe)
    assert deltas["cpu_savedmodel.size_bytes"] == {"old": 1000, "new": 800, "delta": -200, "percent": -20.0}
    assert deltas["cpu_savedmodel.max_abs_error"]["new"] == 1e-6
