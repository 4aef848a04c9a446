"""A recipe with `targets: {cpu_savedmodel: {}}`, built through the real CLI: the published
layout, the CPU SavedModel itself, caching, early cutoff, the manifest and repair."""

from __future__ import annotations

import json
import os
import time

import yaml

from tests.cli import tpubuild
from tests.engine.conftest import build_json, statuses
from tests.engine.test_noop_memo import probe
from tests.targets.conftest import RECIPE
from tests.tolerances import FLOAT32_REORDERED, assert_close

CHAIN = ["cpu_savedmodel", "cpu_savedmodel_verify"]


def test_publishes_the_cpu_savedmodel_beside_the_tpu_version(targets_built):
    ws, document = targets_built
    assert statuses(document, "toy") == {
        "source": "built", "batch": "built", "verify": "built", "warmup": "built", "report": "built",
        "cpu_savedmodel": "built", "cpu_savedmodel_verify": "built", "publish": "built"}
    out = ws / "out" / "toy"
    assert sorted(os.listdir(out)) == ["1", "cpu_savedmodel"]
    assert sorted(os.listdir(out / "cpu_savedmodel")) == ["1"]
    cpu = out / "cpu_savedmodel" / "1"
    # The warmup requests of the batching recipe go into every SavedModel it serves.
    # Its own provenance statement too: a target version is served from its own base path.
    assert sorted(os.listdir(cpu)) == ["assets.extra", "fingerprint.pb", "saved_model.pb", "tpubuild-manifest.json",
                                       "tpubuild-provenance.json", "variables"]
    # The main manifest lists every target file with its digest, and they are the files there.
    manifest = json.loads((out / "1" / "tpubuild-manifest.json").read_text())
    from tpubuild.digests import hash_file

    listed = manifest["targets"]["cpu_savedmodel"]["files"]
    assert set(listed) == {"fingerprint.pb", "saved_model.pb", "variables/variables.data-00000-of-00001",
                           "variables/variables.index", "assets.extra/tf_serving_warmup_requests"}
    assert all(hash_file(cpu / rel) == digest for rel, digest in listed.items())
    assert not any(rel.startswith("cpu_savedmodel") for rel in manifest["files"])
    own = json.loads((cpu / "tpubuild-manifest.json").read_text())
    assert (own["recipe"], own["target"], own["version"], own["files"]) == ("toy", "cpu_savedmodel", 1, listed)
    verdict = manifest["targets"]["cpu_savedmodel"]["verify"]
    assert verdict["passed"] is True and verdict["samples"]["serving_default"]["count"] == 4
    assert set(verdict["latency"]["call_seconds"]) == {"source", "cpu_savedmodel"}
    # The lock file lists the target stages like any other, and a fact per target.
    lock = yaml.safe_load((ws / "recipes" / "toy.lock.yaml").read_text())
    assert [s["stage"] for s in lock["stages"]][-3:] == [*CHAIN, "publish"]
    assert lock["artifact"]["cpu_savedmodel"]["passed"] is True
    # The size of what the target stage built; publishing adds the warmup requests to it.
    assert lock["artifact"]["cpu_savedmodel"]["size_bytes"] == sum(
        (cpu / rel).stat().st_size for rel in listed if not rel.startswith("assets.extra/"))


def test_the_cpu_savedmodel_loads_keeps_batching_and_matches_the_source(targets_built):
    import numpy as np
    import tensorflow as tf

    ws, _ = targets_built
    cpu = ws / "out" / "toy" / "cpu_savedmodel" / "1"
    source = ws / "recipes" / "models" / "fold"
    saved = tf.saved_model.load(str(cpu))
    reference = tf.saved_model.load(str(source))
    x = tf.constant(np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4))
    got = saved.signatures["serving_default"](x=x)["y"].numpy()
    want = reference.signatures["serving_default"](x=x)["y"].numpy()
    # Constant folding and batching change the order of float32 sums, not the math.
    assert_close(got, want, FLOAT32_REORDERED, "cpu_savedmodel vs source")
    from tpubuild.savedmodel.model import SavedModel

    model = SavedModel.load(cpu, ["serve"])
    ops = {n.op for f in model.functions.values() for n in f.node_def}
    assert "BatchFunction" in ops  # the twin keeps the batching the TPU artifact has
    assert not any(op.startswith("TPU") for op in ops)
    # TF Serving's view: the main graph (signatures, saver) is the TPU artifact's, as saved.
    tpu = SavedModel.load(ws / "out" / "toy" / "1", ["serve"])
    assert model.meta_graph.signature_def == tpu.meta_graph.signature_def
    assert model.meta_graph.saver_def == tpu.meta_graph.saver_def


def test_grappler_folds_the_constants_at_build_time(targets_built):
    """The serve function's `(a * 2 + b) / 3` (Mul, AddV2, RealDiv, Range, Reshape,
    Transpose ...) is one Const in the CPU SavedModel: fewer nodes than in the TPU artifact."""
    from tpubuild.savedmodel.model import SavedModel

    ws, _ = targets_built
    tpu = SavedModel.load(ws / "out" / "toy" / "1", ["serve"])
    cpu = SavedModel.load(ws / "out" / "toy" / "cpu_savedmodel" / "1", ["serve"])
    manifest = json.loads((ws / "out" / "toy" / "1" / "tpubuild-manifest.json").read_text())
    counts = manifest["targets"]["cpu_savedmodel"]["build"]["grappler"]["functions"]
    folded = [name for name, (before, after) in counts.items() if after < before]
    assert folded, counts
    for name in folded:
        assert len(cpu.functions[name].node_def) == counts[name][1] < len(tpu.functions[name].node_def)
    serve = next(name for name in folded if "serve" in name and "wrapper" not in name)
    ops = [n.op for n in cpu.functions[serve].node_def]
    assert not {"Mul", "RealDiv", "Range", "Transpose"} & set(ops), ops
    assert {"Mul", "RealDiv", "Range"} <= {n.op for n in tpu.functions[serve].node_def}


def test_second_build_is_cached_and_optimize_reruns_only_its_chain(targets_workspace):
    ws = targets_workspace
    again = build_json(ws)
    assert set(statuses(again, "toy").values()) == {"cached"}
    (ws / "recipes" / "toy.yaml").write_text(RECIPE % "false")
    explain = tpubuild(ws, "explain", "toy")
    assert "  cpu_savedmodel: would run" in explain.stdout
    assert "option optimize: true -> false" in explain.stdout
    assert "  verify: cached" in explain.stdout and "  report: cached" in explain.stdout
    changed = build_json(ws)
    built = {stage for stage, status in statuses(changed, "toy").items() if status == "built"}
    assert built == {*CHAIN, "publish"}
    out = ws / "out" / "toy"
    assert sorted(os.listdir(out / "cpu_savedmodel")) == ["1", "2"] and (out / "2").is_dir()
    manifest = json.loads((out / "2" / "tpubuild-manifest.json").read_text())
    assert manifest["targets"]["cpu_savedmodel"]["build"] == {"optimized": False, "tpu_calls_undone": 0}
    # The TPU SavedModel itself did not change: the same files in both versions.
    first = json.loads((out / "1" / "tpubuild-manifest.json").read_text())
    assert manifest["files"] == first["files"]


def test_a_deleted_target_file_is_restored_even_through_the_noop_memo(targets_workspace):
    ws = targets_workspace
    time.sleep(2.1)  # the memo remembers only files older than the build that checks them
    build_json(ws)
    assert probe(ws) == (0, False, 8)  # the memo proves the build a no-op without loading the recipe
    index = ws / "out" / "toy" / "cpu_savedmodel" / "1" / "variables" / "variables.index"
    content = index.read_bytes()
    index.unlink()
    result = tpubuild(ws, "build")
    assert result.returncode == 0, result.stderr
    assert "restored out/toy/cpu_savedmodel/1/variables/variables.index" in result.stderr
    assert index.read_bytes() == content
    assert sorted(os.listdir(ws / "out" / "toy")) == ["1", "cpu_savedmodel"]  # no new version


def test_report_shows_the_targets_side_by_side(targets_built):
    ws, _ = targets_built
    result = tpubuild(ws, "report", "toy")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("Targets:")
    assert lines[start + 1].split()[:3] == ["target", "directory", "size"]
    assert lines[start + 2].split()[:2] == ["tpu_savedmodel", "1/"]
    cpu = lines[start + 3].split()
    assert cpu[:2] == ["cpu_savedmodel", "cpu_savedmodel/1/"] and "passed" in cpu
    assert "median" in lines[start + 4]
    document = json.loads(tpubuild(ws, "report", "toy", "--format", "json").stdout)
    assert [row["target"] for row in document["targets"]] == ["tpu_savedmodel", "cpu_savedmodel"]
    assert document["targets"][1]["passed"] is True


def test_clean_removes_the_target_versions_too(targets_workspace):
    ws = targets_workspace
    result = tpubuild(ws, "clean", "toy")
    assert result.returncode == 0, result.stderr
    assert not (ws / "out" / "toy").exists()


def test_a_target_version_left_by_a_killed_publish_never_has_its_number_reused(targets_workspace):
    # Issue 32: an older tpubuild renamed target versions first; killed before the main
    # version it left cpu_savedmodel/2 (a model server watching that base path may have
    # loaded it) and the next build gave the number 2 to other bytes.
    import shutil

    ws = targets_workspace
    cpu = ws / "out" / "toy" / "cpu_savedmodel"
    shutil.copytree(cpu / "1", cpu / "2")
    manifest = json.loads((cpu / "2" / "tpubuild-manifest.json").read_text())
    os.chmod(cpu / "2" / "tpubuild-manifest.json", 0o644)
    (cpu / "2" / "tpubuild-manifest.json").write_text(json.dumps(dict(manifest, version=2), indent=2, sort_keys=True) + "\n")
    (ws / "recipes" / "toy.yaml").write_text(RECIPE % "false")
    build_json(ws)
    assert sorted(os.listdir(ws / "out" / "toy")) == ["1", "3", "cpu_savedmodel"]
    assert sorted(os.listdir(cpu)) == ["1", "3"]
    assert json.loads((cpu / "3" / "tpubuild-manifest.json").read_text())["version"] == 3
