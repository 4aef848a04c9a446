"""Issue 55: versions pushed to an OCI registry (`publish_to: oci://`), against Debian's
docker-registry (distribution 2.8, the reference registry) on a free 127.0.0.1 port with
its storage in the test's directory (tests/oci_registry.py), and read back with clients
tpubuild does not contain: raw HTTP (urllib), `skopeo inspect --raw` / `skopeo copy`,
oras-py's pull. Versions are the tiny ones of tests/remote/publish_job.py, published
through tpubuild's publish module (no TensorFlow); tests/publish/test_oci_cli.py takes
the same paths through `tpubuild build`."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import tarfile
import threading
import time
from pathlib import Path

import pytest

from tests.oci_registry import oras_pull, skopeo, start_registry, stop_registry, tree_bytes
from tests.remote.publish_job import fake_version
from tpubuild.config.remote_url import OciAddress, Timeouts
from tpubuild.publish import DestinationError, open_destination, publish_to_destination
from tpubuild.publish.oci_format import MODEL_ARTIFACT, MODEL_CONFIG, OCI_IMAGE_CONFIG, OCI_MANIFEST
from tpubuild.publish.targets import MANIFEST

SCHEMA = Path(__file__).parent / "data" / "modelpack-config-schema.json"  # modelpack/model-spec schema/, d78bf32


@pytest.fixture
def registry(tmp_path):
    running = start_registry(tmp_path / "registry")
    yield running
    stop_registry(running)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def publish(registry, tmp_path, model: str, settings: dict | None = None, recipe: str = "toy", url: str | None = None,
            said: list | None = None, **options):
    """`model`'s version of `recipe` published to the registry (a fresh local version each call)."""
    version = fake_version(tmp_path / f"local-{model}-{time.monotonic_ns()}", recipe, model)
    dest = open_destination(url or registry.url(), Timeouts(), settings or {})
    lines = said if said is not None else []
    outcome = publish_to_destination(dest, recipe, version, tmp_path, say=lines.append, **options)
    return outcome, version, dest


def version_files(version: Path) -> dict[str, bytes]:
    return tree_bytes(version)


# --- 1. a ModelPack artifact, read back byte for byte ------------------------------------------
def test_a_modelpack_version_reads_back_byte_for_byte_with_raw_http_skopeo_and_oras(registry, tmp_path):
    import jsonschema

    outcome, version, _ = publish(registry, tmp_path, "a")
    assert (outcome.number, outcome.new) == (1, True)
    assert outcome.version_url == f"oci://{registry.host}/models/toy:1"
    assert "1" in registry.tags("models/toy")
    data, said_digest = registry.manifest("models/toy", "1")
    assert said_digest == sha256(data)
    manifest = json.loads(data)
    assert manifest["mediaType"] == OCI_MANIFEST and manifest["artifactType"] == MODEL_ARTIFACT
    local = version_files(version)
    paths = [layer["annotations"]["org.cncf.model.filepath"] for layer in manifest["layers"]]
    assert paths == sorted(local)  # one layer per file, in path order
    for layer in manifest["layers"]:
        path = layer["annotations"]["org.cncf.model.filepath"]
        assert layer["mediaType"].startswith("application/vnd.cncf.model.") and layer["mediaType"].endswith(".raw")
        assert layer["digest"] == sha256(local[path]) and layer["size"] == len(local[path])  # .raw: the file's sha256
        assert registry.blob("models/toy", layer["digest"]) == local[path]
        metadata = json.loads(layer["annotations"]["org.cncf.model.file.metadata+json"])
        assert metadata["size"] == len(local[path]) and metadata["typeflag"] == 0
    weights = {layer["annotations"]["org.cncf.model.filepath"]: layer["mediaType"] for layer in manifest["layers"]}
    assert weights["variables/variables.index"] == "application/vnd.cncf.model.weight.v1.raw"
    assert weights[MANIFEST] == "application/vnd.cncf.model.weight.config.v1.raw"
    assert manifest["annotations"]["org.opencontainers.image.version"] == "1"
    assert manifest["annotations"]["org.tpubuild.manifest.digest"] == sha256(local[MANIFEST])
    # The config: exactly what modelpack/model-spec's schema takes, its diffIds the layers.
    assert manifest["config"]["mediaType"] == MODEL_CONFIG
    config = json.loads(registry.blob("models/toy", manifest["config"]["digest"]))
    jsonschema.validate(config, json.loads(SCHEMA.read_text()))
    assert config["modelfs"]["diffIds"] == [layer["digest"] for layer in manifest["layers"]]
    # skopeo (containers/image) reads the same bytes, and copies every blob out.
    raw = skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{registry.host}/models/toy:1").stdout
    assert raw.encode() == data
    skopeo("copy", "--src-tls-verify=false", f"docker://{registry.host}/models/toy:1", f"dir:{tmp_path}/copied")
    for layer in manifest["layers"]:
        copied = tmp_path / "copied" / layer["digest"].split(":")[1]
        assert copied.read_bytes() == local[layer["annotations"]["org.cncf.model.filepath"]]
    # oras-py pulls each layer to its title: the version as out/ holds it.
    oras_pull(registry.host, "models/toy:1", tmp_path / "oras")
    assert tree_bytes(tmp_path / "oras") == local


def test_the_same_version_is_the_same_manifest_bytes_and_source_date_epoch_sets_its_time(registry, tmp_path,
                                                                                          monkeypatch):
    version = fake_version(tmp_path / "local", "toy", "a")
    digests = []
    for repository in ("one", "two"):
        dest = open_destination(registry.url(repository), Timeouts(), {})
        publish_to_destination(dest, "toy", version, tmp_path)
        digests.append(registry.manifest(f"{repository}/toy", "1"))
    assert digests[0] == digests[1]  # the same bytes, so the same digest, wherever it is pushed
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    for repository in ("three", "four"):
        publish_to_destination(open_destination(registry.url(repository), Timeouts(), {}), "toy", version, tmp_path)
    three, four = (registry.manifest(f"{r}/toy", "1") for r in ("three", "four"))
    assert three == four and three != digests[0]
    assert json.loads(three[0])["annotations"]["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"


# --- 2. a modelcar image -------------------------------------------------------------------------
def read_tar(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return tar.getmembers()


def push_base_image(registry, repository: str = "tools/base", tag: str = "1") -> tuple[str, str]:
    """A small image of the test's own (a tar layer with a shell script and /etc/passwd,
    which says its repository): (its layer's digest, its manifest's)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, text in (("bin/sh", b"#!/bin/true\n"), ("etc/passwd", f"root:x:0:0:{repository}:/:/bin/sh\n".encode())):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text), 0o755
            tar.addfile(info, io.BytesIO(text))
    layer = buffer.getvalue()
    layer_digest = registry.push_blob(repository, layer)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/sh"]},
                         "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}).encode()
    config_digest = registry.push_blob(repository, config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": OCI_IMAGE_CONFIG, "digest": config_digest, "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                                       "size": len(layer)}]}).encode()
    return layer_digest, registry.put_manifest(repository, tag, manifest)


def test_a_modelcar_is_an_image_of_deterministic_tar_layers_holding_models_n(registry, tmp_path):
    outcome, version, _ = publish(registry, tmp_path, "a", {"format": "modelcar"})
    data, _ = registry.manifest("models/toy", "1")
    manifest = json.loads(data)
    assert "artifactType" not in manifest and manifest["config"]["mediaType"] == OCI_IMAGE_CONFIG
    config = json.loads(registry.blob("models/toy", manifest["config"]["digest"]))
    assert config["rootfs"] == {"type": "layers", "diff_ids": [layer["digest"] for layer in manifest["layers"]]}
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    extracted: dict[str, bytes] = {}
    for layer in manifest["layers"]:
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
        blob = registry.blob("models/toy", layer["digest"])
        members = read_tar(blob)
        assert [m.name for m in members] == sorted(m.name for m in members)
        for member in members:
            assert (member.uid, member.gid, member.mtime) == (0, 0, members[0].mtime)
            assert member.mode == (0o755 if member.isdir() else 0o644) and (member.isdir() or member.isreg())
            if member.isreg():
                with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
                    handle = tar.extractfile(member.name)
                    assert handle is not None
                    extracted[member.name] = handle.read()
    assert extracted == {f"models/1/{k}": v for k, v in version_files(version).items()}
    # skopeo copies it as an image (`dir:` keeps each layer as it is), every layer the bytes pushed.
    skopeo("copy", "--src-tls-verify=false", f"docker://{registry.host}/models/toy:1", f"dir:{tmp_path}/copied")
    for layer in manifest["layers"]:
        blob = tmp_path / "copied" / layer["digest"].split(":")[1]
        assert sha256(blob.read_bytes()) == layer["digest"]
    # The same version again: nothing pushed (the model layer is the tar the local files make).
    again, _, _ = publish(registry, tmp_path, "a", {"format": "modelcar"})
    assert (again.number, again.new) == (1, False)


def test_a_modelcar_on_a_base_image_mounts_its_layers_and_keeps_its_config(registry, tmp_path):
    base_layer, _ = push_base_image(registry)
    outcome, version, _ = publish(registry, tmp_path, "a", {"format": "modelcar", "base_image": "tools/base:1"})
    manifest = json.loads(registry.manifest("models/toy", "1")[0])
    assert manifest["layers"][0]["digest"] == base_layer and len(manifest["layers"]) == 3
    config = json.loads(registry.blob("models/toy", manifest["config"]["digest"]))
    assert config["config"] == {"Cmd": ["/bin/sh"]}
    assert config["rootfs"]["diff_ids"][0] == base_layer
    status, _, _ = registry.http("HEAD", f"/v2/models/toy/blobs/{base_layer}")
    assert status == 200  # mounted from tools/base, in the model's repository now
    # Another base image is another image: published anew, the model's layers the same.
    push_base_image(registry, "tools/other", "2")
    moved, _, _ = publish(registry, tmp_path, "a", {"format": "modelcar", "base_image": "tools/other:2"})
    assert (moved.number, moved.new) == (2, True)
    second = json.loads(registry.manifest("models/toy", "2")[0])
    assert second["layers"][0]["digest"] != base_layer


def test_a_base_image_that_is_missing_costs_no_number(registry, tmp_path):
    with pytest.raises(DestinationError, match="oci.base_image tools/none:1: no such image"):
        publish(registry, tmp_path, "a", {"format": "modelcar", "base_image": "tools/none:1"})
    assert registry.tags("models/toy") == []


# --- 3. numbers from the registry, never shared, never overwritten ---------------------------------
def foreign_manifest(registry, repository: str, tag: str, note: str) -> str:
    """A co-writer's artifact under `tag` (not tpubuild's): its digest."""
    empty = registry.push_blob(repository, b"{}")
    descriptor = {"mediaType": "application/vnd.oci.empty.v1+json", "digest": empty, "size": 2}
    data = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": descriptor, "layers": [descriptor],
                       "annotations": {"note": note}}).encode()
    return registry.put_manifest(repository, tag, data)


def test_the_next_number_is_one_above_the_highest_decimal_tag_and_other_tags_are_left_alone(registry, tmp_path):
    theirs = {tag: foreign_manifest(registry, "models/toy", tag, tag) for tag in ("latest", "v9", "007", "5")}
    said: list[str] = []
    outcome, _, _ = publish(registry, tmp_path, "a", said=said)
    assert outcome.number == 6  # "5" is a number, "007" and "v9" are not (as for buckets)
    for tag, digest in theirs.items():
        assert registry.manifest("models/toy", tag)[1] == digest
    # A tag far above the rest is no number tpubuild took: ignored, said once.
    foreign_manifest(registry, "models/toy", "9223372036854775807", "far")
    said.clear()
    outcome, _, _ = publish(registry, tmp_path, "b", said=said)
    assert outcome.number == 7
    assert any("9223372036854775807 is more than 1000 above" in line for line in said)


def test_a_version_tag_is_never_overwritten_and_a_repush_of_the_same_bytes_is_a_no_op(registry, tmp_path):
    outcome, version, dest = publish(registry, tmp_path, "a")
    first = registry.manifest("models/toy", "1")
    # The same version pushed again under its number: the tag names it already, nothing changes.
    from tpubuild.publish.oci_publish import push_tree
    from tpubuild.publish.to_destination import prepare_trees

    manifest = json.loads((version / MANIFEST).read_text())
    (tree, source), = prepare_trees("toy", version, manifest, 1, 1, tmp_path / "work", None)
    assert push_tree(dest, "toy", 1, None, tree, source) == first[1]
    assert registry.manifest("models/toy", "1") == first
    # Pushed as 2 while a co-writer (who claims nothing) holds tag 2: refused, their tag kept.
    theirs = foreign_manifest(registry, "models/toy", "2", "a co-writer's")
    (tree, source), = prepare_trees("toy", version, manifest, 2, 1, tmp_path / "work2", None)
    with pytest.raises(DestinationError, match=r"models/toy:2 exists and names other bytes .*not overwritten"):
        push_tree(dest, "toy", 2, None, tree, source)
    assert registry.manifest("models/toy", "2")[1] == theirs


def test_two_claims_of_one_number_keep_it_for_neither_and_each_job_then_gets_its_own(registry, tmp_path):
    """The claim protocol's rule, with a rival's claim made between this job's listing and its
    own claim (what two CI jobs starting at once do): this job sees two claims of N, gives N
    up and takes another number; no two jobs ever keep one (the slow tier races processes)."""
    from tpubuild.publish.oci_format import OCI_MANIFEST as MEDIA, claim_manifest, claim_tag

    dest = open_destination(registry.url(), Timeouts(), {})
    survey = dest.survey("toy")  # this job's first listing: nothing
    rival = "f" * 24
    registry.push_blob("models/toy", b"{}")
    registry.put_manifest("models/toy", claim_tag(1, rival), claim_manifest(1, rival, {"pid": 0}), MEDIA)
    number, after = dest.claim(survey)
    assert number == 2 and rival in after.claims[1] and len(after.claims[1]) == 2  # both gave 1 up
    assert len(after.claims[2]) == 1 and after.claims[2] < after.claims[1]


# --- 6. a registry is data: verify, tampered tags, unclean names -------------------------------------
def test_verify_pulls_a_version_and_a_tag_a_co_writer_repushed_with_other_bytes_fails(registry, tmp_path):
    from tests.cli import tpubuild

    outcome, version, _ = publish(registry, tmp_path, "a")
    done = tpubuild(tmp_path, "verify", outcome.version_url, code=0)
    assert done.stdout.strip() == f"{outcome.version_url}: every file matches its manifest"
    # A co-writer re-pushes tag 1: the same manifest with the variables layer swapped for bytes of theirs.
    manifest = json.loads(registry.manifest("models/toy", "1")[0])
    forged = b"not the weights"
    for layer in manifest["layers"]:
        if layer["annotations"]["org.cncf.model.filepath"] == "variables/variables.data-00000-of-00001":
            layer["digest"], layer["size"] = registry.push_blob("models/toy", forged), len(forged)
    registry.put_manifest("models/toy", "1", json.dumps(manifest).encode())
    done = tpubuild(tmp_path, "verify", outcome.version_url, code=1)
    lines = done.stderr.strip().splitlines()
    assert f"{outcome.version_url}: variables/variables.data-00000-of-00001: content differs from the manifest" \
        in lines, done.stderr
    assert all(line.startswith(f"{outcome.version_url}: ") for line in lines) and "Traceback" not in done.stderr
    # The build's check of the newest version sees it too: a new version, with one warning.
    said: list[str] = []
    again, _, _ = publish(registry, tmp_path, "a", said=said)
    assert (again.number, again.new) == (2, True)
    assert any("toy:1 does not hold what its manifest says" in line for line in said), said


def test_verify_writes_nothing_outside_its_directory_for_unclean_layer_paths_and_tar_members(registry, tmp_path):
    from tests.cli import tpubuild

    outcome, version, _ = publish(registry, tmp_path, "a")
    manifest = json.loads(registry.manifest("models/toy", "1")[0])
    for layer in manifest["layers"]:
        if layer["annotations"]["org.cncf.model.filepath"] == "assets/vocab.txt":
            layer["annotations"]["org.cncf.model.filepath"] = "../../../../escaped.txt"
    registry.put_manifest("models/toy", "1", json.dumps(manifest).encode())
    done = tpubuild(tmp_path, "verify", outcome.version_url, code=1)
    assert "'../../../../escaped.txt' is not a clean relative path; not pulled" in done.stderr
    assert "assets/vocab.txt: missing" in done.stderr or "assets/vocab.txt" in done.stderr
    assert not list(Path("/tmp").glob("escaped.txt")) and not (tmp_path / "escaped.txt").exists()
    # A modelcar whose layer holds a link and a name that climbs out.
    car, _, _ = publish(registry, tmp_path, "b", {"format": "modelcar"}, recipe="car")
    manifest = json.loads(registry.manifest("models/car", "1")[0])
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        link = tarfile.TarInfo("models/1/saved_model.pb")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
        climb = tarfile.TarInfo("models/1/../../../escaped-car.txt")
        climb.size = 3
        tar.addfile(climb, io.BytesIO(b"bad"))
    layer = buffer.getvalue()
    manifest["layers"][0]["digest"], manifest["layers"][0]["size"] = registry.push_blob("models/car", layer), len(layer)
    registry.put_manifest("models/car", "1", json.dumps(manifest).encode())
    done = tpubuild(tmp_path, "verify", car.version_url, code=1)
    assert "saved_model.pb: not a regular file" in done.stderr
    assert "is not a clean name under models/1/" in done.stderr
    assert not (tmp_path / "escaped-car.txt").exists() and "Traceback" not in done.stderr


def test_verify_of_what_is_no_version_is_exit_2(registry, tmp_path):
    from tests.cli import tpubuild

    publish(registry, tmp_path, "a")
    assert "nothing there" in tpubuild(tmp_path, "verify", registry.url() + "/toy:9", code=2).stderr
    assert "not a version" in tpubuild(tmp_path, "verify", registry.url() + "/toy:latest", code=2).stderr


# --- 7. pruning -------------------------------------------------------------------------------------
def test_pruning_deletes_old_versions_and_their_claims_and_never_a_manifest_another_tag_names(registry, tmp_path):
    for model in "abc":
        publish(registry, tmp_path, model)
    stable = registry.manifest("models/toy", "1")
    data, _ = stable
    registry.put_manifest("models/toy", "stable", data)  # a co-writer's tag on version 1
    said: list[str] = []
    outcome, _, _ = publish(registry, tmp_path, "d", said=said, keep=2)
    assert outcome.number == 4 and outcome.pruned == [2]
    tags = registry.tags("models/toy")
    assert {"1", "3", "4", "stable"} <= set(tags) and "2" not in tags
    assert not any(t.startswith("tpubuild-claim-2-") for t in tags)  # the claim went with its version
    assert any(t.startswith("tpubuild-claim-4-") for t in tags)
    assert registry.manifest("models/toy", "stable") == stable
    assert any("models/toy:1 is left: the tag stable also names its manifest" in line for line in said), said


def test_a_registry_that_refuses_deletes_is_one_warning_and_the_publish_stands(tmp_path):
    registry = start_registry(tmp_path / "registry", delete=False)
    try:
        publish(registry, tmp_path, "a")
        said: list[str] = []
        outcome, _, _ = publish(registry, tmp_path, "b", said=said, keep=1)
        assert (outcome.number, outcome.new, outcome.pruned) == (2, True, [])
        warnings = [line for line in said if "does not delete" in line]
        assert len(warnings) == 1 and "UNSUPPORTED" in warnings[0], said
        assert {"1", "2"} <= set(registry.tags("models/toy"))
    finally:
        stop_registry(registry)


# --- 4. deadlines -------------------------------------------------------------------------------------
def test_a_registry_that_never_answers_is_one_line_at_the_deadline(tmp_path):
    """A socket that accepts and never answers: the survey's tag list ends at the total
    deadline with one line, retries included."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        host = f"127.0.0.1:{listener.getsockname()[1]}"
        dest = open_destination(f"oci://{host}/models", Timeouts(connect=1.0, first_byte=0.5, total=2.0), {})
        started = time.monotonic()
        with pytest.raises(DestinationError) as caught:
            dest.survey("toy")
        took = time.monotonic() - started
        assert "\n" not in str(caught.value) and f"publish_to oci://{host}/models" in str(caught.value)
        assert "timed out" in str(caught.value) or "no complete answer" in str(caught.value)
        assert took < 10, took  # the 2 s deadline, not the retries' sum of connection timeouts
    finally:
        stop.set()
        thread.join()
        listener.close()
        for connection in held:
            connection.close()


# --- 5. plain HTTP only to this machine ------------------------------------------------------------------
def test_plain_http_is_spoken_only_to_this_machine_or_with_insecure(registry, tmp_path):
    from tpubuild.transport import Registry

    assert Registry(OciAddress("registry.example:5000", "m")).http.base == "https://registry.example:5000"
    assert Registry(OciAddress("10.0.0.7:5000", "m")).http.base == "https://10.0.0.7:5000"
    assert Registry(OciAddress("10.0.0.7:5000", "m"), insecure=True).http.base == "http://10.0.0.7:5000"
    assert Registry(OciAddress(registry.host, "m")).http.base == f"http://{registry.host}"
    # insecure: false speaks TLS even to 127.0.0.1: a plain-HTTP registry is then one line.
    dest = open_destination(registry.url(), Timeouts(connect=2, first_byte=2, total=5), {"insecure": False})
    with pytest.raises(DestinationError) as caught:
        dest.survey("toy")
    assert "\n" not in str(caught.value) and "SSL" in str(caught.value).upper()


# --- uploads: chunks, bounded memory ---------------------------------------------------------------------
def test_a_blob_larger_than_a_chunk_goes_in_patches_and_reads_back_whole(registry, tmp_path):
    from tpubuild.transport import Registry

    data = hashlib.sha256(b"seed").digest() * 20000  # 640 000 bytes: ten 64 KiB chunks and a piece
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    client = Registry(OciAddress(registry.host, "models"), Timeouts(), chunk=64 << 10)
    digest = sha256(data)
    assert client.push_blob("models/big", digest, len(data), lambda offset: _opened(path, offset)) is True
    assert registry.blob("models/big", digest) == data
    assert client.push_blob("models/big", digest, len(data), lambda offset: _opened(path, offset)) is False  # HEAD


def _opened(path: Path, offset: int):
    handle = open(path, "rb")  # noqa: SIM115 - the client closes it
    handle.seek(offset)
    return handle


# --- target versions, renumbered ----------------------------------------------------------------------
def with_target(version: Path, target: str = "litert") -> Path:
    """`version` given a target version beside it (`<recipe>/<target>/<N>/`), as publish writes one."""
    from tpubuild.digests import hash_file
    from tpubuild.publish.targets import manifest_bytes, target_manifest

    folder = version.parent / target / version.name
    folder.mkdir(parents=True)
    (folder / "model.tflite").write_bytes(b"TFL3" + version.name.encode() * 1000)
    manifest = json.loads((version / MANIFEST).read_text())
    manifest["targets"] = {target: {"files": {"model.tflite": hash_file(folder / "model.tflite")}}}
    (version / MANIFEST).write_bytes(manifest_bytes(manifest))
    (folder / MANIFEST).write_bytes(manifest_bytes(target_manifest(manifest, target)))
    return version


@pytest.mark.parametrize("form", ["modelpack", "modelcar"])
def test_a_target_version_is_its_own_repository_and_a_renumbered_version_says_its_number(registry, tmp_path, form):
    from tests.cli import tpubuild

    publish(registry, tmp_path, "first", {"format": form})
    version = with_target(fake_version(tmp_path / "local", "toy", "second"))
    dest = open_destination(registry.url(), Timeouts(), {"format": form})
    outcome = publish_to_destination(dest, "toy", version, tmp_path)
    assert (outcome.number, outcome.new) == (2, True)  # out/toy/1 is version 2 there
    assert "2" in registry.tags("models/toy/litert") and "2" in registry.tags("models/toy")
    for url in (f"{registry.url()}/toy:2", f"{registry.url()}/toy/litert:2"):
        done = tpubuild(tmp_path, "verify", url, code=0)
        assert "every file matches its manifest" in done.stdout
    if form == "modelpack":
        oras_pull(registry.host, "models/toy/litert:2", tmp_path / "target")
        pulled = tree_bytes(tmp_path / "target")
        assert pulled["model.tflite"] == (version.parent / "litert" / "1" / "model.tflite").read_bytes()
        assert json.loads(pulled[MANIFEST])["version"] == 2 and json.loads(pulled[MANIFEST])["target"] == "litert"
    # The same model again: nothing pushed, its target checked too.
    again = publish_to_destination(dest, "toy", version, tmp_path)
    assert (again.number, again.new) == (2, False)
