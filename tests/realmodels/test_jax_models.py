"""JAX models exported through jax2tf (native serialization: one XlaCallModule holding
StableHLO), built through every stage they take.

One workspace, built once per session: the plain jax2tf export (docs/jax.md's worked
example) with placement by alias, batching and bfloat16; the same export with
DYNAMIC_RANGE quantization (refused: TF's quantizer cannot reach inside the module); and
orbax-export's ExportManager (`JaxModule` + `ServingConfig`), float32, placed and batched.
The bfloat16 artifact must compute in bfloat16 inside its XlaCallModule, not only store
its weights in bfloat16.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cli import REPO, tpubuild
from tests.engine.conftest import statuses
from tests.realmodels import jax_models
from tests.realmodels.workspaces import model_workspace
from tests.tolerances import BFLOAT16, FLOAT32_REORDERED, assert_close

MODELS = Path(__file__).parent / "jax_models.py"
BATCHING = "  batch_options: [{max_batch_size: 8, allowed_batch_sizes: [2, 4, 8]}]\n"
RECIPES = {
    "jax_mlp": "model:\n  export: {script: models/jax_models.py, function: export_jax2tf}\n"
               "converter:\n  tpu_functions: [{function_alias: tpu_func}]\n" + BATCHING +
               "  bfloat16_optimization: ENABLED\nverify:\n  samples: 8\n",
    "jax_mlp_int8": "model:\n  export: {script: models/jax_models.py, function: export_jax2tf}\n"
                    "converter:\n  tpu_functions: [{function_alias: tpu_func}]\n"
                    "  quantization_options: {method: DYNAMIC_RANGE}\n",
    "jax_orbax": "model:\n  export: {script: models/jax_models.py, function: export_orbax}\n"
                 "converter:\n  tpu_functions: [{function_alias: tpu_func}]\n" + BATCHING +
                 "  bfloat16_optimization: DISABLED\nverify:\n  samples: 8\n",
}
# orbax's serving signature placed whole: the TPU body is split from the signature wrapper
# (no object-graph record of its own) and holds the alias's computation.
RECIPES["jax_orbax_signature"] = RECIPES["jax_orbax"].replace("function_alias: tpu_func", "signature_name: serving_default")
# jax_mlp with a tolerance bfloat16 cannot meet: verify fails, explain-error looks inside.
RECIPES["jax_tight"] = RECIPES["jax_mlp"].replace("  samples: 8\n", "  samples: 8\n  rtol: 0.00001\n  atol: 0.0000001\n")
BUILT = ("jax_mlp", "jax_orbax")


@pytest.fixture(scope="session")
def jax_built(tmp_path_factory) -> tuple[Path, dict, str]:
    # Not importorskip, which would import JAX in this pytest worker (its threads then warn at every fork).
    for module in ("jax", "orbax.export"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    ws = tmp_path_factory.mktemp("jax") / "ws"
    model_workspace(ws, MODELS, RECIPES)
    result = tpubuild(ws, "build", "--json", timeout=900)
    assert result.returncode == 1, result.stderr  # jax_mlp_int8 is refused
    return ws, json.loads(result.stdout), result.stderr


@pytest.mark.slow
def test_jax2tf_and_orbax_exports_build_every_stage(jax_built):
    _, document, _ = jax_built
    for recipe in BUILT:
        assert set(statuses(document, recipe).values()) == {"built"}, statuses(document, recipe)
    assert statuses(document, "jax_mlp")["bfloat16"] == "built"
    assert statuses(document, "jax_orbax")["batch"] == "built"


@pytest.mark.slow
def test_orbax_placed_by_signature_has_the_alias_hlo_and_cost_without_a_warning(jax_built):
    """No `no HLO` warning on either placement, and the signature's TPU body lowers to the
    alias's computation (metadata aside: it names the callers' ops)."""
    ws, document, stderr = jax_built
    stages = statuses(document, "jax_orbax_signature")
    assert stages["tpu"] == stages["report"] == "built", stages  # its export is jax_orbax's, cached
    assert set(stages.values()) <= {"built", "cached"}, stages
    assert "no HLO" not in stderr, stderr
    reports = [row for row in document["rows"] if row["recipe"] in ("jax_orbax", "jax_orbax_signature")
               and row["stage"] == "report"]
    assert len(reports) == 2 and not [row.get("warnings") for row in reports if row.get("warnings")], reports
    hlo = {}
    for recipe in ("jax_orbax", "jax_orbax_signature"):
        version = ws / "out" / recipe / "1"
        report = json.loads((version / "tpubuild-report.json").read_text())
        (entry,) = report["hlo"].values()
        (row,) = report["cost"]["tpu_functions"]
        assert row["function"] == entry["function"] and row["cost"] > 0, (recipe, report["cost"])
        hlo[recipe] = re.sub(r", metadata=\{[^}]*\}", "", (version / entry["file"]).read_text())
        assert hlo[recipe].startswith("HloModule ") and " call(" in hlo[recipe], hlo[recipe]
    assert hlo["jax_orbax_signature"] == hlo["jax_orbax"]


@pytest.mark.slow
def test_quantization_of_an_xla_call_module_is_refused_in_one_line(jax_built):
    _, document, stderr = jax_built
    assert statuses(document, "jax_mlp_int8")["quantize"] == "failed"
    refusals = [line for line in stderr.splitlines() if "jax_mlp_int8" in line and "XlaCallModule" in line]
    assert len(refusals) == 1, stderr
    assert "node 'XlaCallModule'" in refusals[0] and "TF's quantizer cannot quantize" in refusals[0], refusals
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_explain_error_finds_the_bfloat16_error_in_the_xla_call_module(jax_built):
    ws, document, _ = jax_built
    assert statuses(document, "jax_tight")["verify"] == "failed"
    result = tpubuild(ws, "explain-error", "jax_tight", timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # The one op of the graph that computes in bfloat16 is where the error starts ...
    assert any(line.strip().startswith("serving_default: XlaCallModule (XlaCallModule, bfloat16)") for line in lines), \
        result.stdout
    # ... and keeping it float32 is tried; its variables stay bfloat16, so the error stays.
    assert any("tried bfloat16_optimization_options.filterlist: [XlaCallModule]" in line for line in lines), result.stdout
    assert lines[-1].strip().startswith("no op that computes in bfloat16 starts the error: it comes from the variables "
                                        "stored in bfloat16"), result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_jax_is_keyed_by_version(jax_built):
    from importlib import metadata

    ws, _, _ = jax_built
    records = [json.loads(p.read_text())["record"] for p in (ws / ".tpubuild" / "cache").rglob("stages/*/*.json")]
    exports = [r for r in records if r.get("stage") == "export"]
    # The export scripts import jax (and orbax): their versions are discovered inputs.
    assert len(exports) == 2 and all(r["discovered"]["dist:jax"] == metadata.version("jax") for r in exports)
    assert any(r["discovered"].get("dist:orbax-export") == metadata.version("orbax-export") for r in exports)
    bfloat16 = [r for r in records if r.get("stage") == "bfloat16"]
    # Its rewrite serializes StableHLO with jax's MLIR bindings: the versions it used are
    # discovered inputs of the runs that met an XlaCallModule (and of no other run, so
    # installing jax changes no key of a model without StableHLO).
    assert bfloat16 and all(r["discovered"] == {"dist:jax": metadata.version("jax"),
                                                "dist:jaxlib": metadata.version("jaxlib")} for r in bfloat16)
    assert all("jaxlib" not in r["options"] for r in bfloat16)


@pytest.mark.slow
def test_check_keys_the_bfloat16_rewrite_by_the_jax_it_used(jax_built, tmp_path):
    """build --check in a fresh clone (no cache) recomputes the bfloat16 stage's key from
    the jax and jaxlib versions its lock file records (engine/lockcheck.py)."""
    from importlib import metadata

    ws, _, _ = jax_built
    lock = (ws / "recipes" / "jax_mlp.lock.yaml").read_text()
    assert f'"dist:jaxlib": "{metadata.version("jaxlib")}"' in lock or \
        f'"dist:jaxlib": {metadata.version("jaxlib")}' in lock, lock
    clone = tmp_path / "clone"
    shutil.copytree(ws, clone, ignore=shutil.ignore_patterns(".tpubuild", "out"))
    check = tpubuild(clone, "build", "--check", *BUILT)
    assert (check.returncode, check.stdout) == (0, "2 lock files up to date\n"), check.stderr
    # Another jaxlib rewrites the module differently: the lock file's key no longer holds.
    path = clone / "recipes" / "jax_mlp.lock.yaml"
    stage = lock.index("- stage: bfloat16")
    jaxlib = lock.index('"dist:jaxlib": ', stage)
    end = lock.index("\n", jaxlib)
    path.write_text(lock[:jaxlib] + '"dist:jaxlib": "0.0.1"' + lock[end:])
    check = tpubuild(clone, "build", "--check", "jax_mlp")
    assert check.returncode == 1
    assert f"stage bfloat16 would run (installed package jaxlib: 0.0.1 -> {metadata.version('jaxlib')})" \
        in check.stdout, check.stdout


def _tpu_xla_call_module(path: Path):
    from tpubuild.savedmodel.model import SavedModel

    model = SavedModel.load(path)
    found = [n for f in model.functions.values() for n in f.node_def
             if n.op == "XlaCallModule" and "_tpu_replicate" in n.attr]
    assert len(found) == 1, [n.name for n in found]
    return found[0]


@pytest.mark.slow
def test_the_published_xla_call_module_computes_in_bfloat16(jax_built):
    from tensorflow.core.framework import types_pb2

    from tpubuild.savedmodel.xla_call_module import open_module

    ws, _, _ = jax_built
    node = _tpu_xla_call_module(ws / "out" / "jax_mlp" / "1")
    assert list(node.attr["Tout"].list.type) == [types_pb2.DT_BFLOAT16]
    assert set(node.attr["Tin"].list.type) == {types_pb2.DT_BFLOAT16}
    with open_module(node) as module:
        text = str(module)
    assert "bf16" in text and "f32" not in text


def _serve(path: Path, x: np.ndarray) -> np.ndarray:
    """serving_default of a SavedModel (TPU-placed ones through their CPU twin, as verify runs them)."""
    import tempfile

    import tensorflow as tf

    from tpubuild.tpu.twin import make_cpu_twin

    with tempfile.TemporaryDirectory() as scratch:
        twin = Path(scratch) / "twin"
        make_cpu_twin(path, twin, ["serve"])
        return tf.saved_model.load(str(twin)).signatures["serving_default"](x=tf.constant(x))["probabilities"].numpy()


def _jax_computes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(features, what JAX computes on them), JAX run in a process of its own: imported in
    a pytest worker, JAX's threads would make every later fork of that worker (each
    `tpubuild` the tests run) print JAX's os.fork() warning, and risk its deadlock."""
    x = jax_models.features(n, seed=seed)
    program = ("import json, sys\nimport numpy as np\nfrom tests.realmodels import jax_models as m\n"
               f"x = m.features({n}, seed={seed})\n"
               "print(json.dumps(np.asarray(m.mlp(m.params(), x), dtype=np.float64).tolist()))\n")
    result = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    return x, np.asarray(json.loads(result.stdout.splitlines()[-1]), dtype=np.float32)


@pytest.mark.slow
def test_bfloat16_numbers_are_within_bfloat16_tolerance_of_the_float32_jax_model(jax_built):
    ws, _, _ = jax_built
    x, want = _jax_computes(6, seed=5)
    got = _serve(ws / "out" / "jax_mlp" / "1", x)
    # bfloat16 keeps 8 mantissa bits: each of the MLP's few roundings costs ~0.4%.
    assert_close(got, want, BFLOAT16)
    # float32 compute would agree to float32 reordering; bfloat16 compute cannot.
    assert np.abs(got - want).max() > FLOAT32_REORDERED.atol + FLOAT32_REORDERED.rtol * np.abs(want).max()


@pytest.mark.slow
def test_orbax_export_serves_what_jax_computes(jax_built):
    ws, _, _ = jax_built
    x, want = _jax_computes(3, seed=6)
    # The same float32 computation on another kernel path: float32 reordering only.
    assert_close(_serve(ws / "out" / "jax_orbax" / "1", x), want, FLOAT32_REORDERED)


@pytest.mark.slow
def test_tpu_savedmodels_restore_in_the_session_loader(jax_built):
    import tensorflow as tf

    ws, _, _ = jax_built
    for recipe in BUILT:
        graph = tf.Graph()
        with tf.compat.v1.Session(graph=graph) as session:
            meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(ws / "out" / recipe / "1"))
            assert "serving_default" in meta_graph.signature_def, recipe


@pytest.mark.slow
def test_the_report_says_what_computes_in_bfloat16(jax_built):
    ws, _, _ = jax_built
    report = (ws / "out" / "jax_mlp" / "1" / "tpubuild-report.md").read_text()
    line = next(l for l in report.splitlines() if l.startswith("- bfloat16 (scope TPU)"))
    assert "XlaCallModule 1" in line and "XlaCallModule XlaCallModule in tpu_func computes in bfloat16:" in line, line
    assert "stablehlo.dot_general" in line and "kept float32" not in line, line
    assert "Passed with bfloat16 tolerances" in report
