"""Engine tests: real workspaces in tmp dirs, real SavedModels, the real CLI in real
processes. One tiny SavedModel is made per session and copied into each workspace."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.cli import CLI, REPO, tpubuild  # noqa: F401 (CLI, REPO: test_trust_lookup.py and test_outputs.py import them from here)
from tests.once import built_once_per_run, once_per_run
from tpubuild.lock import MEASURED

EXPORT_SCRIPT = textwrap.dedent(
    '''\
    """Export a tiny model: y = x @ w, batched over dimension 0."""
    import tensorflow as tf

    from helper import SCALE


    class Tiny(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([[1.0], [SCALE]])

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.matmul(x, self.w)}


    def export(output_dir):
        model = Tiny()
        tf.saved_model.save(model, output_dir, signatures={"serving_default": model.serve})
    '''
)

# An export whose output is a copy of a prebuilt SavedModel: byte-identical every run,
# which is what early cutoff needs (TensorFlow's function names depend on process state).
COPY_SCRIPT = textwrap.dedent(
    '''\
    import shutil
    import time
    from pathlib import Path

    import notes  # a dependency whose comments can change without changing the output


    def export(output_dir):
        here = Path(__file__).parent
        while (here / "SLOW").exists():  # the SIGKILL test holds the stage here
            time.sleep(0.05)
        shutil.copytree(here / "prebuilt", output_dir, dirs_exist_ok=True)
        (Path(output_dir) / "assets").mkdir(exist_ok=True)
        (Path(output_dir) / "assets" / "note.txt").write_text(notes.NOTE)
    '''
)

BATCH = """\
converter:
  batch_options:
    - num_batch_threads: 1
      max_batch_size: 4
      batch_timeout_micros: {timeout}
      allowed_batch_sizes: [2, 4]
      max_enqueued_batches: 10
      experimental: {{signature_name: serving_default}}
"""


@pytest.fixture(scope="session")
def tiny_saved_model(tmp_path_factory) -> Path:
    """A SavedModel `y = x @ [[1], [2]]` with a batchable serving_default signature."""
    import tensorflow as tf

    class Tiny(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([[1.0], [2.0]])

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.matmul(x, self.w)}

    def save(directory: Path) -> None:
        model = Tiny()
        tf.saved_model.save(model, str(directory / "tiny"), signatures={"serving_default": model.serve})

    # One per run, as `built_once` that copies it: a SavedModel saved in another process
    # holds other function names, so other bytes and other stage keys.
    return once_per_run(tmp_path_factory, "tiny_saved_model", save) / "tiny"


def save_placed_model(path: Path, strings: bool = False) -> Path:
    """`y = x @ w` behind a serving signature that calls it under the alias `tpu_func`
    (the converter guide's shape of a TPU model); with `strings`, a string output too."""
    import tensorflow as tf

    class Placed(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([[1.0], [2.0]])

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def tpu_func(self, x):
            return tf.matmul(x, self.w)

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return {"y": self.tpu_func(x), **({"label": tf.strings.as_string(tf.round(x))} if strings else {})}

    model = Placed()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}))
    return path


def source_recipe(name: str, timeout: int = 100, samples: int = 4, comment: str = "") -> str:
    return f"# {comment}\nname: {name}\nmodel: {{saved_model: models/tiny}}\n" + BATCH.format(
        timeout=timeout
    ) + f"verify: {{samples: {samples}}}\n"


def export_recipe(name: str, script: str = "models/tiny_export.py", deps: str = "models/helper.py") -> str:
    return (
        f"name: {name}\nmodel:\n  export: {{script: {script}, function: export, deps: [{deps}]}}\n"
        "converter: {}\nverify: {samples: 4}\n"
    )


def write_workspace(ws: Path, model: Path, recipes: dict[str, str], keep_versions: int | None = None) -> Path:
    """A workspace with `tpubuild.yaml`, the tiny SavedModel, export scripts and `recipes`."""
    (ws / "recipes" / "models").mkdir(parents=True)
    text = 'recipes: ["recipes/*.yaml"]\n'
    if keep_versions:
        text += f"keep_versions: {keep_versions}\n"
    (ws / "tpubuild.yaml").write_text(text)
    models = ws / "recipes" / "models"
    shutil.copytree(model, models / "tiny")
    shutil.copytree(model, models / "prebuilt")
    (models / "tiny_export.py").write_text(EXPORT_SCRIPT)
    (models / "helper.py").write_text("SCALE = 2.0\n")
    (models / "copy_export.py").write_text(COPY_SCRIPT)
    (models / "notes.py").write_text('# notes\nNOTE = "first"\n')
    (models / "bad_export.py").write_text("def export(output_dir):\n    raise ValueError('no model today')\n")
    for name, text in recipes.items():
        (ws / "recipes" / f"{name}.yaml").write_text(text)
    return ws


@pytest.fixture
def make_workspace(tmp_path, tiny_saved_model):
    """A new, unbuilt workspace in this test's tmp dir."""

    def make(recipes: dict[str, str], keep_versions: int | None = None) -> Path:
        return write_workspace(tmp_path / "ws", tiny_saved_model, recipes, keep_versions)

    return make


BUILT_RECIPES = {
    "toy": source_recipe("toy"),
    "other": source_recipe("other", timeout=300),
    "cut": export_recipe("cut", "models/copy_export.py", "models/notes.py"),
}


@pytest.fixture(scope="session")
def built_once(tmp_path_factory, tiny_saved_model) -> tuple[Path, dict]:
    """BUILT_RECIPES built once per test run (tests/once.py), and the --json document of
    that build. Tests read it; `built_workspace` is a copy to change."""

    def build(ws: Path) -> dict:
        return build_json(write_workspace(ws, tiny_saved_model, BUILT_RECIPES, keep_versions=2))

    return built_once_per_run(tmp_path_factory, "engine_built_once", build)


@pytest.fixture
def built_workspace(built_once, tmp_path) -> Path:
    """A private copy of the session's built workspace (cache, outputs, lock files)."""
    ws = tmp_path / "ws"
    shutil.copytree(built_once[0], ws, symlinks=True)
    return ws


def build_json(ws: Path, *args: str, expect: int = 0, env: dict | None = None, timeout: float = 300) -> dict:
    """`tpubuild build --json ARGS`, checked for its exit code, parsed."""
    result = tpubuild(ws, "build", "--json", *args, env=env, timeout=timeout)
    assert result.returncode == expect, result.stderr
    return json.loads(result.stdout)


def export_variant(ws: Path, script: str, old: str, new: str) -> None:
    """recipes/models/<script>: the tiny export script with `old` replaced by `new`."""
    assert old in EXPORT_SCRIPT, old
    (ws / "recipes" / "models" / script).write_text(EXPORT_SCRIPT.replace(old, new))


def lock_record(ws: Path, recipe: str, index: int = 0) -> Path:
    """The local stage record of stage `index` of `recipe`, found by its lock file's key."""
    lock = yaml.safe_load((ws / "recipes" / f"{recipe}.lock.yaml").read_text())
    key = lock["stages"][index]["key"]
    return ws / ".tpubuild" / "cache" / "v1" / "stages" / key[:2] / f"{key}.json"


def statuses(document: dict, recipe: str) -> dict[str, str]:
    return {row["stage"]: row["status"] for row in document["rows"] if row["recipe"] == recipe}


def as_another_machine_wrote_it(text: str) -> str:
    """The lock file as a machine with other floats would have written it: every digest
    on a measured line replaced, the measured verification error changed."""
    lines = []
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n").endswith(MEASURED):
            line = re.sub(r"\b[0-9a-f]{64}\b", lambda m: m.group(0)[::-1], line)
            line = line.replace("max_abs_error: 0.0 ", "max_abs_error: 0.0001 ")
        lines.append(line)
    return "".join(lines)
