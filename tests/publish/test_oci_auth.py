"""Issue 55 item 5: a registry's credentials as docker finds them ($DOCKER_CONFIG/config.json:
`auths`, `credHelpers`, `credsStore`) and its challenge answered (Basic, or a bearer token
from its realm), against Debian's docker-registry configured with htpasswd or with token
authentication whose realm is a small token server of the test's own
(tests/oci_registry.py TokenServer); no secret in any line tpubuild says. Read back with
skopeo, which logs in on its own."""

from __future__ import annotations

import base64
import json
import os
import stat
import time
from pathlib import Path

import pytest

from tests.oci_registry import TokenServer, htpasswd, skopeo, start_registry, stop_registry
from tests.remote.publish_job import fake_version
from tpubuild.config.remote_url import Timeouts
from tpubuild.publish import DestinationError, open_destination, publish_to_destination

USER, PASSWORD = "ci-robot", "s3cr3t-Pa55word-never-shown"


def docker_config(tmp_path: Path, monkeypatch, config: dict) -> Path:
    """$DOCKER_CONFIG of this test alone (the machine user's ~/.docker is never read)."""
    folder = tmp_path / f"docker-{time.monotonic_ns()}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    return folder


def auths(host: str, user: str = USER, password: str = PASSWORD) -> dict:
    return {"auths": {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}}


def publish(url: str, tmp_path: Path, model: str = "a"):
    version = fake_version(tmp_path / f"local-{time.monotonic_ns()}", "toy", model)
    return publish_to_destination(open_destination(url, Timeouts(), {}), "toy", version, tmp_path)


def read_back(host: str, user: str = USER, password: str = PASSWORD) -> dict:
    raw = skopeo("inspect", "--raw", "--tls-verify=false", "--creds", f"{user}:{password}",
                 f"docker://{host}/models/toy:1").stdout
    return json.loads(raw)


@pytest.fixture
def htpasswd_registry(tmp_path):
    path = htpasswd(tmp_path / "htpasswd", USER, PASSWORD)
    running = start_registry(tmp_path / "registry", auth={"htpasswd": {"realm": "tpubuild-test", "path": path}})
    yield running
    stop_registry(running)


@pytest.fixture
def token_registry(tmp_path):
    tokens = TokenServer(tmp_path / "tokens", USER, PASSWORD)
    running = start_registry(tmp_path / "registry", auth=tokens.registry_auth())
    yield running, tokens
    stop_registry(running)
    tokens.stop()


def test_a_password_from_docker_config_answers_a_basic_challenge_and_none_is_one_line(htpasswd_registry, tmp_path,
                                                                                        monkeypatch):
    host = htpasswd_registry.host
    docker_config(tmp_path, monkeypatch, {})
    with pytest.raises(DestinationError) as caught:
        publish(htpasswd_registry.url(), tmp_path)
    assert f"docker login {host}" in str(caught.value) and "\n" not in str(caught.value)
    docker_config(tmp_path, monkeypatch, auths(host, password="wrong-" + PASSWORD))
    with pytest.raises(DestinationError) as caught:
        publish(htpasswd_registry.url(), tmp_path)
    assert "401" in str(caught.value) and PASSWORD not in str(caught.value)
    docker_config(tmp_path, monkeypatch, auths(host))
    outcome = publish(htpasswd_registry.url(), tmp_path)
    assert (outcome.number, outcome.new) == (1, True)
    assert read_back(host)["annotations"]["org.opencontainers.image.version"] == "1"


def helper(tmp_path: Path, name: str, body: str) -> Path:
    """A docker credential helper `docker-credential-<name>` on PATH (docker-credential-helpers' protocol)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    program = folder / f"docker-credential-{name}"
    program.write_text("#!/bin/sh\n" + body)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return folder


def test_a_credential_helper_docker_config_names_gives_the_password_and_its_failure_shows_no_output(
        htpasswd_registry, tmp_path, monkeypatch):
    host = htpasswd_registry.host
    answer = json.dumps({"ServerURL": host, "Username": USER, "Secret": PASSWORD})
    folder = helper(tmp_path, "tpubuildtest", f'[ "$1" = get ] || exit 3\nread server\n'
                                               f'[ "$server" = "{host}" ] || exit 4\necho \'{answer}\'\n')
    helper(tmp_path, "broken", f'echo "half of {PASSWORD}" >&2\necho "{PASSWORD}"\nexit 1\n')
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    docker_config(tmp_path, monkeypatch, {"credHelpers": {host: "tpubuildtest"}, "auths": {host: {}}})
    assert publish(htpasswd_registry.url(), tmp_path).number == 1
    docker_config(tmp_path, monkeypatch, {"credsStore": "tpubuildtest"})  # the store for every host
    assert publish(htpasswd_registry.url(), tmp_path, "b").number == 2
    docker_config(tmp_path, monkeypatch, {"credsStore": "broken"})
    with pytest.raises(Exception) as caught:
        publish(htpasswd_registry.url(), tmp_path, "c")
    line = str(caught.value)
    assert "docker-credential-broken get" in line and "its output is not shown" in line and PASSWORD not in line


def test_a_bearer_token_of_the_registrys_realm_is_asked_with_docker_configs_password(token_registry, tmp_path,
                                                                                       monkeypatch):
    registry, tokens = token_registry
    docker_config(tmp_path, monkeypatch, {})
    with pytest.raises(DestinationError) as caught:
        publish(registry.url(), tmp_path)
    assert "its token realm gives no anonymous token" in str(caught.value) and "\n" not in str(caught.value)
    docker_config(tmp_path, monkeypatch, auths(registry.host))
    outcome = publish(registry.url(), tmp_path)
    assert (outcome.number, outcome.new) == (1, True)
    assert "repository:models/toy:pull,push" in tokens.issued
    assert read_back(registry.host)["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    docker_config(tmp_path, monkeypatch, auths(registry.host, password="wrong"))
    with pytest.raises(DestinationError) as caught:
        publish(registry.url(), tmp_path, "b")
    assert "refused the credentials docker's config has" in str(caught.value) and PASSWORD not in str(caught.value)


def test_a_config_file_that_is_not_json_is_named_with_its_line_and_nothing_of_it(tmp_path, monkeypatch,
                                                                                htpasswd_registry):
    folder = docker_config(tmp_path, monkeypatch, {})
    (folder / "config.json").write_text('{\n  "auths": {\n    "x": {"auth": "' + PASSWORD + '"\n')
    with pytest.raises(Exception) as caught:
        publish(htpasswd_registry.url(), tmp_path)
    line = str(caught.value)
    assert str(folder / "config.json") in line and "not JSON" in line and PASSWORD not in line
