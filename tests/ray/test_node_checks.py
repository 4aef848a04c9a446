"""The Ray task's checks on its node, called as the task function itself (in this
process, as a Ray worker calls it): a node with other stage code, another toolchain or
another view of the workspace is refused with one line, before it fetches or runs
anything; the worker environment carries the driver's keyed variables."""

from __future__ import annotations

import socket
from pathlib import Path

from tpubuild.digests import toolchain
from tpubuild.keys import code_digest
from tpubuild.pipeline import entry, stage_module
from tpubuild.workers import node_env, run_on_node


def request(workspace: Path, **keyed) -> dict:
    """A request for the verify stage as the driver sends it, keyed as this process would."""
    return {
        "entry": entry("verify"), "stage": "verify", "workspace": str(workspace), "options": {},
        "results": {}, "trees": {}, "fresh": False, "declared": {},
        "keyed": {"code": code_digest(stage_module("verify")), "toolchain": dict(toolchain()), "env": {}, **keyed},
    }


def reply_error(result: dict) -> str:
    assert result["files"] == [] and result["reply"]["ok"] is False, result
    return result["reply"]["error"]


def test_other_stage_code_is_refused(tmp_path):
    wrong = "0" * 64
    error = reply_error(run_on_node(request(tmp_path, code=wrong), 60, (tmp_path / "remote").as_uri()))
    mine = code_digest(stage_module("verify"))
    assert error == (f"ray node {socket.gethostname()} runs other tpubuild code/TensorFlow than this build "
                     f"(stage verify code {mine[:12]}, the build's {wrong[:12]})")
    assert not (tmp_path / "remote").exists()  # refused before the remote was touched


def test_another_tensorflow_is_refused(tmp_path):
    other = dict(toolchain(), tensorflow="2.20.0")
    error = reply_error(run_on_node(request(tmp_path, toolchain=other), 60, (tmp_path / "remote").as_uri()))
    assert error == (f"ray node {socket.gethostname()} runs other tpubuild code/TensorFlow than this build "
                     f"(tensorflow {toolchain()['tensorflow']}, the build's 2.20.0)")


def test_a_node_that_sees_other_workspace_files_is_refused(tmp_path):
    (tmp_path / "data.tfrecord").write_bytes(b"this node's copy")
    sent = request(tmp_path)
    sent["declared"] = {"data.tfrecord": "f" * 64}  # the content the driver hashed into the key
    error = reply_error(run_on_node(sent, 60, (tmp_path / "remote").as_uri()))
    assert error == (f"ray node {socket.gethostname()} sees other content of data.tfrecord than this build "
                     f"(the workspace at {tmp_path} must be the same shared directory on every node)")
    sent["workspace"] = str(tmp_path / "absent")
    error = reply_error(run_on_node(sent, 60, (tmp_path / "remote").as_uri()))
    assert error.startswith(f"ray node {socket.gethostname()} has no workspace at {tmp_path / 'absent'}: ")


def test_the_worker_gets_the_drivers_keyed_variables(monkeypatch):
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")  # the node's own setting
    monkeypatch.setenv("XLA_FLAGS", "--node-only")
    monkeypatch.setenv("SOME_SECRET", "x")  # never reaches a stage
    env = node_env({"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert env["TF_ENABLE_ONEDNN_OPTS"] == "0"  # the driver's value: the one in the key
    assert "XLA_FLAGS" not in env and "SOME_SECRET" not in env
    assert env["PYTHONHASHSEED"] == "0"
