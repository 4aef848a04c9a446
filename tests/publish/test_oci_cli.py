"""Issue 55 through the CLI, as a user meets it: `publish_to: oci://` in tpubuild.yaml (a
recipe's own `oci:` over the workspace's), a fresh CI clone numbering after what the
registry holds, `tpubuild verify oci://...`, `clean --remote`, `serving-config --format
kserve`, a registry that asks for a password (never shown or written), one that cannot be
reached, and validate's lines. Against Debian's docker-registry on 127.0.0.1; the
workspace is test_publish_to.py's `warm` one (its cache holds both models: only the
publish runs)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.cli import REPO, tpubuild
from tests.oci_registry import htpasswd, oras_pull, start_registry, stop_registry, tree_bytes
from tests.publish.test_publish_to import MODELS, build, clone, closed_port, warm  # noqa: F401

USER, PASSWORD = "ci-robot", "pa55-of-the-ci-robot-never-written"


@pytest.fixture
def registry(tmp_path):
    running = start_registry(tmp_path / "registry")
    yield running
    stop_registry(running)


def test_build_publishes_to_a_registry_and_a_fresh_clone_numbers_after_it(warm, registry, tmp_path):
    url = registry.url()
    ws = clone(warm, tmp_path / "ws", f"publish_to: {url}\n")
    done = tpubuild(ws, "build", code=0)
    out, err = done.stdout.splitlines(), done.stderr
    assert "published: toy -> out/toy/1" in out and f"published: toy -> {url}/toy:1" in out, out
    assert "Traceback" not in err and "warning" not in err, err
    oras_pull(registry.host, "models/toy:1", tmp_path / "pulled")
    assert tree_bytes(tmp_path / "pulled") == tree_bytes(ws / "out" / "toy" / "1")
    done = tpubuild(ws, "verify", f"{url}/toy:1", code=0)
    assert "every file matches its manifest" in done.stdout
    # A fresh clone with the other model: version 2 there, its manifest saying 2.
    other = clone(warm, tmp_path / "other", f"publish_to: {url}\n", recipes={"toy": MODELS["b"]})
    doc, _ = build(other)
    assert doc["destinations"]["toy"] == {"url": f"{url}/toy", "version": 2, "new": True, "mended": [],
                                          "pruned": []}
    oras_pull(registry.host, "models/toy:2", tmp_path / "second")
    assert json.loads((tmp_path / "second" / "tpubuild-manifest.json").read_text())["version"] == 2
    # The first clone again: the newest there (2) is not its model; it publishes 3.
    again, _ = build(clone(warm, tmp_path / "again", f"publish_to: {url}\n"))
    assert again["destinations"]["toy"]["version"] == 3
    # The recipe's own oci: a modelcar, published anew (another format is another place).
    text = (ws / "recipes" / "toy.yaml").read_text() + "oci:\n  format: modelcar\n"
    (ws / "recipes" / "toy.yaml").write_text(text)
    out = tpubuild(ws, "build", code=0).stdout.splitlines()
    assert f"published: toy -> {url}/toy:4" in out, out
    manifest = json.loads(registry.manifest("models/toy", "4")[0])
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    # clean --remote: every version but the newest, with its claims.
    done = tpubuild(ws, "clean", "--remote", code=0)
    assert [line for line in done.stdout.splitlines() if line.startswith("removed")] == [
        f"removed {url}/toy:{n}" for n in (1, 2, 3)], done.stdout
    assert f"kept {url}/toy: 4 (the newest)" in done.stdout
    tags = registry.tags("models/toy")
    assert [t for t in tags if not t.startswith("tpubuild-claim-4-")] == ["4"], tags
    # serving-config --format kserve: the modelcar's newest version, read in the registry.
    done = tpubuild(ws, "serving-config", "--format", "kserve", code=0)
    service = next(d for d in yaml.safe_load_all(done.stdout) if d)
    assert service["apiVersion"] == "serving.kserve.io/v1beta1" and service["kind"] == "InferenceService"
    assert service["metadata"]["name"] == "toy"
    assert service["spec"]["predictor"]["model"] == {
        "modelFormat": {"name": "tensorflow"}, "storageUri": f"oci+native://{registry.host}/models/toy:4"}
    assert "# toy (recipes/toy.yaml): version 4: the newest version published" in done.stdout


def test_serving_config_for_kserve_takes_a_labelled_version_a_base_image_and_a_bucket_without_a_registry(
        warm, tmp_path):
    ws = clone(warm, tmp_path / "ws", "publish_to: oci://registry.example/models\n", recipes={
        "toy": MODELS["a"] + "oci: {format: modelcar, base_image: tools/busybox:1.36}\n"
                              "serving:\n  version_labels: {stable: 7, canary: 8}\n",
        "bucket_model": MODELS["a"].replace("name: toy\n", "name: bucket_model\n")
        + "publish_to: s3://bucket/models\n",
    })
    done = tpubuild(ws, "serving-config", "--format", "kserve", code=0)  # no registry is asked: labels
    services = {d["metadata"]["name"]: d for d in yaml.safe_load_all(done.stdout) if d}
    assert services["toy"]["spec"]["predictor"]["model"]["storageUri"] == "oci://registry.example/models/toy:7"
    assert services["bucket-model"]["spec"]["predictor"]["model"]["storageUri"] == "s3://bucket/models/bucket_model"
    assert "TF Serving serves it as 'bucket-model'" in done.stdout
    done = tpubuild(ws, "serving-config", "--format", "kserve", "--label", "canary", "toy", code=0)
    assert "oci://registry.example/models/toy:8" in done.stdout
    # A ModelPack artifact, which KServe does not serve: one line, exit 2.
    (ws / "recipes" / "toy.yaml").write_text(MODELS["a"])
    done = tpubuild(ws, "serving-config", "--format", "kserve", "toy", code=2)
    assert "recipes/toy.yaml: publish_to oci://registry.example/models pushes ModelPack artifacts" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_registry_that_asks_for_a_password_gets_docker_configs_and_it_is_never_shown_or_written(warm, tmp_path):
    path = htpasswd(tmp_path / "htpasswd", USER, PASSWORD)
    registry = start_registry(tmp_path / "registry", auth={"htpasswd": {"realm": "tpubuild-test", "path": path}})
    try:
        config = tmp_path / "docker"
        config.mkdir()
        encoded = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        (config / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": encoded}}}))
        ws = clone(warm, tmp_path / "ws", f"publish_to: {registry.url()}\n")
        done = tpubuild(ws, "build", "-v", env={"DOCKER_CONFIG": str(config)}, code=0)
        assert f"published: toy -> {registry.url()}/toy:1" in done.stdout
        done_json = tpubuild(ws, "build", "--json", "--relock", env={"DOCKER_CONFIG": str(config)}, code=0)
        said = done.stdout + done.stderr + done_json.stdout + done_json.stderr
        assert PASSWORD not in said and encoded not in said
        for file in ws.rglob("*"):
            if file.is_file() and not file.is_symlink() and ".tpubuild/cache" not in file.as_posix():
                data = file.read_bytes()
                assert PASSWORD.encode() not in data and encoded.encode() not in data, file
        # Without the config: one line naming the registry, the local version kept, exit 1.
        other = clone(warm, tmp_path / "other", f"publish_to: {registry.url()}\n", recipes={"toy": MODELS["b"]})
        done = tpubuild(other, "build", env={"DOCKER_CONFIG": str(tmp_path / "empty")}, code=1)
        lines = [line for line in done.stderr.splitlines() if "not published" in line]
        assert len(lines) == 1 and f"docker login {registry.host}" in lines[0] and "out/toy/1 is kept" in lines[0]
    finally:
        stop_registry(registry)


def test_a_registry_that_cannot_be_reached_is_one_line_and_the_local_version_is_kept(warm, tmp_path):
    ws = clone(warm, tmp_path / "ws", f"publish_to: oci://127.0.0.1:{closed_port()}/models\n")
    done = tpubuild(ws, "build", code=1)
    lines = [line for line in done.stderr.splitlines() if "not published" in line]
    assert len(lines) == 1 and lines[0].startswith("recipes/toy.yaml: not published: publish_to oci://127.0.0.1:")
    assert lines[0].endswith("out/toy/1 is kept") and "Traceback" not in done.stderr
    assert (ws / "out" / "toy" / "1" / "saved_model.pb").is_file()


# Planning commands in a process that says, last, whether TensorFlow or an HTTP client was imported.
PROBE = textwrap.dedent(
    """\
    import sys
    from tpubuild.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
    print("EXIT", code, "tensorflow" in sys.modules, "requests" in sys.modules or "urllib3" in sys.modules)
    """
)


def test_validate_names_the_line_of_a_bad_oci_destination_and_planning_imports_no_http_client(warm, tmp_path):
    cases = {
        "publish_to: oci://Registry.example/Models\n": "'Models' is not a repository name component",
        "publish_to: oci://registry.example\n": "names no repository",
        "publish_to: oci://registry.example/models:v1\n": "without a tag or a digest",
        f"publish_to: oci://robot:{PASSWORD}@registry.example/models\n": "docker login",
        "publish_to: oci://registry.example/models\noci: {base_image: tools/busybox:1.36}\n":
            "a base image is for format: modelcar",
        "publish_to: oci://registry.example/models\noci: {format: modelcar, base_image: 'busybox latest'}\n":
            "is not REPO:TAG or REPO@sha256:DIGEST",
    }
    for index, (text, said) in enumerate(cases.items()):
        ws = clone(warm, tmp_path / f"ws{index}", text)
        done = tpubuild(ws, "validate", code=2)
        assert said in done.stderr and "tpubuild.yaml:" in done.stderr, (text, done.stderr)
        assert PASSWORD not in done.stderr and "Traceback" not in done.stderr
    ws = clone(warm, tmp_path / "named", "publish_to: oci://registry.example/models\n",
               recipes={"toy": MODELS["a"].replace("name: toy\n", "name: Toy.Model\n")})
    done = tpubuild(ws, "validate", code=2)
    assert "recipes/toy.yaml:" in done.stderr and "cannot name a repository" in done.stderr, done.stderr
    # A valid oci:// workspace: validate and list import neither TensorFlow nor an HTTP client.
    ws = clone(warm, tmp_path / "good", "publish_to: oci://registry.example/models\noci: {format: modelcar}\n")
    for verb in (["validate"], ["list"], ["build", "--dry-run"]):
        done = subprocess.run([sys.executable, "-c", PROBE, *verb], cwd=ws, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300, check=False)
        assert done.stdout.splitlines()[-1] == "EXIT 0 False False", (verb, done.stdout, done.stderr)
