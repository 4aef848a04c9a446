"""Issue 8's reproductions: a stale artifact is never reported up to date.

Each test failed on the engine before the redesign (hashing after the build, a hand-kept
stage version, declared-only inputs, a recipe name inside a cached output, summaries in
output digests) and passes now.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cli import CLI, REPO, tpubuild
from tests.engine.conftest import build_json, export_recipe, export_variant, statuses

SLOW_EXPORT = '''\
import time
from pathlib import Path

import helper
import sibling  # imported, never declared in deps


def export(output_dir):
    here = Path(__file__).parent
    (here / "STARTED").write_text("")
    while (here / "SLOW").exists():  # the test edits inputs while the export runs
        time.sleep(0.05)
    import tensorflow as tf

    class M(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([[1.0], [helper.SCALE * sibling.FACTOR]])

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.matmul(x, self.w)}

    m = M()
    tf.saved_model.save(m, output_dir, signatures={"serving_default": m.serve})
'''


def _serve(version_dir: Path, x):
    import tensorflow as tf

    loaded = tf.saved_model.load(str(version_dir))
    return loaded.signatures["serving_default"](x=tf.constant(x))["y"].numpy()


def _slow_workspace(make_workspace) -> Path:
    ws = make_workspace({"slow": export_recipe("slow", "models/slow_export.py", "models/helper.py")})
    models = ws / "recipes" / "models"
    (models / "slow_export.py").write_text(SLOW_EXPORT)
    (models / "sibling.py").write_text("FACTOR = 1.0\n")
    return ws


def _start_slow_build(ws: Path) -> subprocess.Popen:
    models = ws / "recipes" / "models"
    (models / "SLOW").write_text("")
    (models / "STARTED").unlink(missing_ok=True)
    proc = subprocess.Popen([*CLI, "build"], cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 120
    while not (models / "STARTED").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def _release(ws: Path, proc: subprocess.Popen) -> tuple[int, str, str]:
    (ws / "recipes" / "models" / "SLOW").unlink()
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.mark.slow
def test_declared_input_edited_during_the_build_fails_the_stage_and_is_never_recorded(make_workspace):
    ws = _slow_workspace(make_workspace)
    proc = _start_slow_build(ws)
    (ws / "recipes" / "models" / "helper.py").write_text("SCALE = 5.0\n")  # after the export imported it
    code, out, err = _release(ws, proc)
    assert code == 1
    assert ("recipes/slow.yaml: stage export: input recipes/models/helper.py changed while the stage ran; "
            "its result was not recorded (build again)") in err
    # Nothing claims to be up to date: --check and the next build agree.
    check = tpubuild(ws, "build", "--check")
    assert check.returncode == 1, check.stdout
    doc = build_json(ws)
    assert statuses(doc, "slow")["export"] == "built"
    np.testing.assert_allclose(_serve(ws / "out" / "slow" / "1", [[1.0, 1.0]]), [[6.0]], rtol=1e-6)
    assert tpubuild(ws, "build", "--check").returncode == 0


@pytest.mark.slow
def test_undeclared_import_edited_during_the_build_reruns_next_time(make_workspace):
    ws = _slow_workspace(make_workspace)
    proc = _start_slow_build(ws)
    (ws / "recipes" / "models" / "sibling.py").write_text("FACTOR = 10.0\n")  # imported before the edit
    code, out, err = _release(ws, proc)
    assert code == 0, err
    # The artifact holds the imported content (factor 1): the record says so, so the next
    # build sees the edit, explain names it, and the rebuilt artifact has factor 10.
    np.testing.assert_allclose(_serve(ws / "out" / "slow" / "1", [[1.0, 1.0]]), [[3.0]], rtol=1e-6)
    lock = (ws / "recipes" / "slow.lock.yaml").read_text()
    assert '"import:recipes/models/sibling.py"' in lock
    explain = tpubuild(ws, "explain", "slow").stdout
    assert "export: would run" in explain and "imported module recipes/models/sibling.py: content changed" in explain
    assert tpubuild(ws, "build", "--check").returncode == 1
    doc = build_json(ws)
    assert statuses(doc, "slow")["export"] == "built"
    np.testing.assert_allclose(_serve(ws / "out" / "slow" / "2", [[1.0, 1.0]]), [[21.0]], rtol=1e-6)


@pytest.mark.slow
def test_stage_code_and_environment_are_in_the_key(built_workspace, tmp_path):
    ws = built_workspace
    package = tmp_path / "pkg"
    shutil.copytree(REPO / "tpubuild", package / "tpubuild", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": str(package)}
    # The copied package has the same sources: same keys, nothing to do.
    same = json.loads(tpubuild(ws, "build", "--json", "toy", env=env).stdout)
    assert set(statuses(same, "toy").values()) == {"cached"}
    # Editing a module that only the report stage uses reruns the report alone.
    cost = package / "tpubuild" / "report" / "cost.py"
    cost.write_text(cost.read_text() + "\n# an edit\n")
    explain = tpubuild(ws, "explain", "toy", env=env).stdout
    assert "report: would run" in explain and "the stage's code changed" in explain
    doc = json.loads(tpubuild(ws, "build", "--json", "toy", env=env).stdout)
    assert statuses(doc, "toy") == {"source": "cached", "batch": "cached", "verify": "cached", "warmup": "cached",
                                    "report": "built", "publish": "cached"}
    # An allow-listed variable that changes TensorFlow's kernels reruns every TF stage...
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    explain = tpubuild(ws, "explain", "toy", env=env).stdout
    assert 'environment variable TF_ENABLE_ONEDNN_OPTS: added ("0")' in explain
    doc = json.loads(tpubuild(ws, "build", "--json", "toy", env=env).stdout)
    assert statuses(doc, "toy") == {"source": "cached", "batch": "built", "verify": "built", "warmup": "built",
                                    "report": "built", "publish": "cached"}
    # ...and any other variable changes nothing (workers do not see it).
    env["SOME_UNRELATED_VARIABLE"] = "1"
    doc = json.loads(tpubuild(ws, "build", "--json", "toy", env=env).stdout)
    assert set(statuses(doc, "toy").values()) == {"cached"}


@pytest.mark.slow
def test_generator_imports_are_discovered(make_workspace):
    recipe = """\
name: gen
model: {saved_model: models/tiny}
converter:
  quantization_options:
    method: STATIC_RANGE
    representative_datasets:
      serving_default: {generator: "recipes.samples:make", num_samples: 8}
verify: {samples: 4}
"""
    ws = make_workspace({"gen": recipe})
    (ws / "recipes" / "samples.py").write_text(
        "import numpy as np\nfrom recipes import scale\n\n\ndef make():\n"
        "    for i in range(8):\n        yield {'x': np.full((1, 2), scale.VALUE * (i + 1), np.float32)}\n"
    )
    (ws / "recipes" / "scale.py").write_text("VALUE = 0.5\n")
    doc = build_json(ws)
    assert statuses(doc, "gen")["dataset"] == "built"
    (ws / "recipes" / "scale.py").write_text("VALUE = 0.25\n")
    doc = build_json(ws)
    assert statuses(doc, "gen")["dataset"] == "built"
    assert statuses(doc, "gen")["quantize"] == "built"


@pytest.mark.slow
def test_a_generators_declared_data_file_is_an_input(make_workspace):
    # A generator that reads a data file with open(): tpubuild cannot see the read, so the
    # file is declared in `deps:` (relative to the recipe), as an export script's are.
    recipe = """\
name: gendata
model: {saved_model: models/tiny}
converter:
  quantization_options:
    method: STATIC_RANGE
    representative_datasets:
      serving_default: {generator: "recipes.readscale:make", num_samples: 8, deps: [data/*.txt]}
verify: {samples: 4}
"""
    ws = make_workspace({"gendata": recipe})
    (ws / "recipes" / "data").mkdir()
    (ws / "recipes" / "data" / "scale.txt").write_text("0.5\n")
    (ws / "recipes" / "readscale.py").write_text(
        "import os\n\nimport numpy as np\n\n\ndef make():\n"
        "    scale = float(open(os.path.join(os.path.dirname(__file__), 'data', 'scale.txt')).read())\n"
        "    for i in range(8):\n        yield {'x': np.full((1, 2), scale * (i + 1), np.float32)}\n"
    )
    doc = build_json(ws)
    assert statuses(doc, "gendata")["dataset"] == "built"
    (ws / "recipes" / "data" / "scale.txt").write_text("0.25\n")
    doc = build_json(ws)
    assert statuses(doc, "gendata")["dataset"] == "built" and statuses(doc, "gendata")["quantize"] == "built"
    (ws / "recipes" / "gendata.yaml").write_text(recipe.replace("num_samples: 8, deps: [data/*.txt]",
                                                                "num_samples: 8, deps: [data/*.bin]"))
    result = tpubuild(ws, "validate")
    assert result.returncode != 0 and "'data/*.bin' matches no file" in result.stderr + result.stdout, result.stderr


@pytest.mark.slow
def test_a_module_an_import_looked_for_and_did_not_find_is_an_input(make_workspace):
    # `try: import extra` that fails records where Python looked: creating the file there
    # later changes what the script runs, so the export reruns (a dep file's negative entry).
    ws = make_workspace({"neg": export_recipe("neg", "models/neg_export.py", "models/helper.py")})
    (ws / "recipes" / "models" / "neg_export.py").write_text(
        "try:\n    import extra\n    SCALE = extra.SCALE\nexcept ImportError:\n    SCALE = 1.0\n\n"
        + (ws / "recipes" / "models" / "tiny_export.py").read_text().replace("from helper import SCALE\n", ""))
    doc = build_json(ws)
    assert statuses(doc, "neg")["export"] == "built"
    assert statuses(build_json(ws), "neg")["export"] == "cached"
    lock = (ws / "recipes" / "neg.lock.yaml").read_text()
    # In the key and in the export's `discovered` (what `build --check` recomputes the key
    # from without a cache), not among the inputs a reviewer reads.
    assert "absent" not in lock.split("\nstages:")[0]
    assert '    "recipes/models/extra.py": absent\n' in lock
    (ws / "recipes" / "models" / "extra.py").write_text("SCALE = 3.0\n")
    doc = build_json(ws)
    assert statuses(doc, "neg")["export"] == "built"
    assert "import:recipes/models/extra.py" in (ws / "recipes" / "neg.lock.yaml").read_text()


@pytest.mark.slow
def test_a_module_imported_from_outside_the_workspace_is_keyed_by_content(make_workspace, tmp_path):
    # A PYTHONPATH directory is no installed distribution: its modules are inputs too.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "extscale.py").write_text("SCALE = 2.0\n")
    ws = make_workspace({"ext": export_recipe("ext", "models/ext_export.py", "models/helper.py")})
    export_variant(ws, "ext_export.py", "from helper import SCALE", "from extscale import SCALE")
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{outside}"}
    assert statuses(build_json(ws, env=env), "ext")["export"] == "built"
    assert statuses(build_json(ws, env=env), "ext")["export"] == "cached"
    (outside / "extscale.py").write_text("SCALE = 5.0\n")
    assert statuses(build_json(ws, env=env), "ext")["export"] == "built"


@pytest.mark.slow
def test_upgrading_an_installed_package_an_export_imports_reruns_it(make_workspace, tmp_path):
    # Keras, keras-hub, tensorflow_text decide what an export writes as much as its own
    # code: an installed distribution user code imported is an input, by version.
    site = tmp_path / "venv" / "site-packages"  # where pip puts it
    (site / "fakescale").mkdir(parents=True)
    (site / "fakescale" / "__init__.py").write_text("SCALE = 2.0\n")

    def install(version: str) -> None:
        for old in site.glob("fakescale-*.dist-info"):
            shutil.rmtree(old)
        info = site / f"fakescale-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakescale\nVersion: {version}\n")
        (info / "top_level.txt").write_text("fakescale\n")

    install("1.0")
    ws = make_workspace({"dist": export_recipe("dist", "models/dist_export.py", "models/helper.py")})
    export_variant(ws, "dist_export.py", "from helper import SCALE", "from fakescale import SCALE")
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{site}"}
    assert statuses(build_json(ws, env=env), "dist")["export"] == "built"
    assert statuses(build_json(ws, env=env), "dist")["export"] == "cached"
    install("1.1")  # same module file, another release: pip's upgrade renames the dist-info
    assert statuses(build_json(ws, env=env), "dist")["export"] == "built"


def test_two_recipes_on_one_model_publish_their_own_names(make_workspace):
    from tests.engine.conftest import source_recipe

    ws = make_workspace({"alpha": source_recipe("alpha"), "beta": source_recipe("beta")})
    doc = build_json(ws)
    assert statuses(doc, "beta")["report"] == "cached"  # one record serves both recipes
    for name in ("alpha", "beta"):
        version = ws / "out" / name / "1"
        report = json.loads((version / "tpubuild-report.json").read_text())
        assert "recipe" not in report and "alpha" not in json.dumps(report) + (version / "tpubuild-report.md").read_text()
        assert json.loads((version / "tpubuild-manifest.json").read_text())["recipe"] == name
        assert tpubuild(ws, "report", name).stdout.splitlines()[1] == f"Conversion report for {name}"


def test_renamed_export_script_with_identical_output_reruns_nothing_after_it(built_workspace):
    ws = built_workspace
    models = ws / "recipes" / "models"
    shutil.copy(models / "copy_export.py", models / "renamed_export.py")
    (ws / "recipes" / "cut.yaml").write_text(export_recipe("cut", "models/renamed_export.py", "models/notes.py"))
    doc = build_json(ws, "cut")
    assert statuses(doc, "cut") == {"export": "built", "verify": "cached", "report": "cached", "publish": "cached"}


WIDE_EXPORT = """\
import numpy as np
import tensorflow as tf


class Wide(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.linspace(-1.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64))

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.matmul(x, self.w)}


def export(output_dir):
    model = Wide()
    tf.saved_model.save(model, output_dir, signatures={"serving_default": model.serve})
"""


@pytest.mark.slow
def test_unchanged_quantize_output_stops_a_dataset_change(make_workspace):
    recipe = """\
name: dyn
model:
  export: {script: models/wide.py, function: export}
converter:
  tpu_functions: [{signature_name: serving_default}]
  quantization_options:
    method: DYNAMIC_RANGE
    representative_datasets:
      serving_default: {npz: models/dyn.npz}
verify: {samples: 4}
"""
    ws = make_workspace({"dyn": recipe})
    (ws / "recipes" / "models" / "wide.py").write_text(WIDE_EXPORT)
    np.savez(ws / "recipes" / "models" / "dyn.npz", x=np.ones((4, 1, 64), np.float32))
    build_json(ws)
    np.savez(ws / "recipes" / "models" / "dyn.npz", x=np.full((4, 1, 64), 0.5, np.float32))
    doc = build_json(ws)
    rows = statuses(doc, "dyn")
    # Dynamic range ignores the data: quantize reruns with a byte-identical output, so the
    # TPU stages after it are cached; verify reads the new samples and reruns.
    assert rows["dataset"] == "built" and rows["quantize"] == "built"
    assert [rows[s] for s in ("tpu", "bfloat16", "io_shape")] == ["cached"] * 3
    assert rows["verify"] == "built"


@pytest.mark.slow
def test_user_code_runs_from_its_source_never_from_a_bytecode_cache(make_workspace):
    """A `.pyc` in the workspace that Python would accept for helper.py (same source size and
    mtime, as after a same-size edit within one second or a checkout that restores mtimes)
    holds other code: the export must run the source it read and hashed, and the build must
    write no `__pycache__` into the workspace. Installed packages keep their caches."""
    import importlib.util
    import py_compile

    ws = make_workspace({"tiny": export_recipe("tiny")})
    helper = ws / "recipes" / "models" / "helper.py"
    stat = helper.stat()
    forged = Path(importlib.util.cache_from_source(str(helper)))
    helper.write_text("SCALE = 9.0\n")  # same size as "SCALE = 2.0\n"
    os.utime(helper, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    py_compile.compile(str(helper), cfile=str(forged), invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    helper.write_text("SCALE = 2.0\n")
    os.utime(helper, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    # Python itself would take the forged file: the check this test guards against is real.
    spec = importlib.util.spec_from_file_location("helper_probe", helper)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.SCALE == 9.0
    forged_bytes = forged.read_bytes()

    doc = build_json(ws)
    assert statuses(doc, "tiny")["export"] == "built"
    version = ws / "out" / "tiny" / "1"
    np.testing.assert_allclose(_serve(version, np.array([[1.0, 1.0]], np.float32)), [[3.0]])  # 1 + SCALE (2.0)
    assert forged.read_bytes() == forged_bytes  # left as the user had it, never rewritten
    assert [p for p in (ws / "recipes").rglob("__pycache__") if p != forged.parent] == []
