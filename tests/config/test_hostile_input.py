"""Issue 13's bad inputs, each with its exact message: numbers the converter cannot take,
paths the OS refuses, names from file names, YAML bombs, symlinks out of the workspace."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli import CLI, REPO
from tpubuild.config.names import NAME_MAX_LENGTH, NAME_PATTERN, NAME_RULE
from tpubuild.config.schema import INT32_MAX, validator
from tpubuild.config.yamlload import (
    MAX_ALIASES,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_NODES,
)

MODEL = "model: {saved_model: ../models/toy}\n"
PLANNING = (["validate"], ["render", "r"], ["build", "--dry-run"], ["list"])


def assert_every_planning_command_fails_with(ws, lines: list[str]) -> None:
    """validate, render, build --dry-run and list each print exactly `lines`, exit 2."""
    for argv in PLANNING:
        code, out, err = ws.cli(*argv)
        assert (code, out, err.splitlines()) == (2, "", lines), argv


# Item 4: integers are integers, within the proto field's range.


def test_a_float_where_the_converter_takes_an_int32(ws):
    text = MODEL + (
        "converter:\n  batch_options:\n"
        "    - {max_batch_size: 8.0, num_batch_threads: 2.0, batch_timeout_micros: 1.5}\n"
    )
    lines = [
        "recipes/r.yaml:4:24: converter.batch_options[0].max_batch_size: expected an integer, got 8.0",
        "recipes/r.yaml:4:48: converter.batch_options[0].num_batch_threads: expected an integer, got 2.0",
        "recipes/r.yaml:4:75: converter.batch_options[0].batch_timeout_micros: expected an integer, got 1.5",
    ]
    assert ws.errors_of(text) == lines
    assert_every_planning_command_fails_with(ws, lines)  # render and build no longer crash


def test_every_recipe_extending_a_base_with_a_float_names_the_base(ws):
    ws.write("recipes/common/base.yaml", "converter:\n  batch_options: [{max_batch_size: 8.0}]\n")
    ws.write("recipes/a.yaml", "extends: common/base.yaml\n" + MODEL)
    assert ws.errors_of("extends: common/base.yaml\n" + MODEL) == [
        "recipes/common/base.yaml:2:36: converter.batch_options[0].max_batch_size: expected an integer, got 8.0"
    ]


def test_integers_beyond_int32_are_refused(ws):
    text = MODEL + (
        "converter:\n  batch_options:\n"
        "    - max_batch_size: 99999999999999999999999\n"
        "      allowed_batch_sizes: [2147483647]\n"
        "      max_enqueued_batches: 2147483648\n"
    )
    why = "must be <= 2147483647 (the largest int32: the converter's field is an int32)"
    lines = [
        f"recipes/r.yaml:4:23: converter.batch_options[0].max_batch_size: {why}, got 99999999999999999999999",
        "recipes/r.yaml:5:29: converter.batch_options[0].allowed_batch_sizes[0]: must be at most 65536 rows, got "
        "2147483647 (TensorFlow's BatchFunction pads every batch to its size in host memory)",
        f"recipes/r.yaml:6:29: converter.batch_options[0].max_enqueued_batches: {why}, got 2147483648",
    ]
    assert ws.errors_of(text) == lines
    assert_every_planning_command_fails_with(ws, lines)


def test_the_largest_int32_renders(ws):
    batching = "converter:\n  batch_options: [{max_batch_size: 8, max_enqueued_batches: 2147483647}]\n"
    ws.write("recipes/r.yaml", MODEL + batching)
    code, out, err = ws.cli("render", "r")
    assert (code, err) == (0, "")
    assert "  max_enqueued_batches: 2147483647\n" in out


def _proto_int32_fields() -> dict[str, set[str]]:
    """message name -> its int32 fields, read from schemas/converter_options.proto."""
    text = (REPO / "schemas" / "converter_options.proto").read_text()
    fields: dict[str, set[str]] = {}
    for match in re.finditer(r"^message (\w+) \{(.*?)^\}", text, re.S | re.M):
        fields[match.group(1)] = set(re.findall(r"^\s*(?:repeated )?int32 (\w+) =", match.group(2), re.M))
    return fields


def test_many_bad_elements_of_one_list_are_one_line_and_a_count(ws):
    """Issue 53 item 7: 100,000 bad allowed_batch_sizes were 34,465 lines, one per element."""
    sizes = ", ".join(str(70_000 + i) for i in range(5_000))
    text = MODEL + f"converter:\n  batch_options:\n    - max_batch_size: 8\n      allowed_batch_sizes: [{sizes}]\n"
    lines = ["recipes/r.yaml:5:29: converter.batch_options[0].allowed_batch_sizes[0]: must be at most 65536 rows, got "
             "70000 (TensorFlow's BatchFunction pads every batch to its size in host memory) (and 5000 more problems "
             "in its elements, up to converter.batch_options[0].allowed_batch_sizes[4999])"]
    assert ws.errors_of(text) == lines
    assert_every_planning_command_fails_with(ws, lines)
    # A few are each their own line (two too large, the last also above max_batch_size).
    assert len(ws.errors_of(MODEL + "converter:\n  batch_options: [{max_batch_size: 8, allowed_batch_sizes: "
                                    "[70000, 70001]}]\n")) == 3


def test_every_int32_field_of_the_proto_is_bounded_in_both_schemas():
    recipe = validator("recipe").schema["properties"]
    converter = recipe["converter"]["properties"]
    xla = converter["xla_sharding_options"]["properties"]
    sections = {
        "BatchOptions": converter["batch_options"]["items"]["properties"],
        "XlaShardingOptions": xla,
        "TopologyProto": xla["topology"]["properties"],
    }
    proto = _proto_int32_fields()
    checked = 0
    for message, properties in sections.items():
        # num_tasks and num_tpu_devices_per_task are tpubuild's to write, not the recipe's.
        for name in proto[message] & set(properties):
            field = properties[name]
            field = field.get("items", field)
            assert (field["type"], field["maximum"]) == ("integer", INT32_MAX), (message, name)
            checked += 1
    assert checked == 9
    # The workspace's `defaults:` take the same sections, bounds included.
    defaults = validator("workspace").schema["properties"]["defaults"]["properties"]
    assert {key: recipe[key] for key in defaults} == defaults


@pytest.mark.parametrize(
    "verify, lines",
    [
        ("{rtol: .nan, atol: .inf}", ["recipes/r.yaml:2:16: verify.rtol: must be a finite number >= 0, got nan",
                                     "recipes/r.yaml:2:28: verify.atol: must be a finite number >= 0, got inf"]),
        ("{atol: -.inf}", ["recipes/r.yaml:2:16: verify.atol: must be >= 0, got -inf"]),
        ("{samples: .inf}", ["recipes/r.yaml:2:19: verify.samples: expected an integer, got inf"]),
        ("{samples: .nan}", ["recipes/r.yaml:2:19: verify.samples: expected an integer, got nan"]),
        ("{samples: 1000001}", ["recipes/r.yaml:2:19: verify.samples: must be <= 1000000, got 1000001"]),
    ],
)
def test_verification_numbers_are_finite_and_bounded(ws, verify, lines):
    assert ws.errors_of(MODEL + f"verify: {verify}\n") == lines


# Item 5: paths the OS refuses are input errors; a full disk is an environment error.


def test_a_null_byte_in_a_path(ws):
    ws.write("recipes/r.yaml", 'extends: "\\0"\n' + MODEL)
    assert_every_planning_command_fails_with(ws, ["recipes/r.yaml:1:10: extends: '\\x00' contains a null byte"])
    assert ws.errors_of(MODEL.replace("../models/toy", '"../models/\\0"')) == [
        "recipes/r.yaml:1:22: model.saved_model: '../models/\\x00' contains a null byte"
    ]


def test_a_path_too_long_for_the_file_system(ws):
    long = "a" * 300
    ws.write("recipes/r.yaml", f"extends: {long}.yaml\n" + MODEL)
    assert_every_planning_command_fails_with(
        ws, [f"recipes/r.yaml:1:10: extends: '{long}.yaml' cannot be used: File name too long"]
    )
    assert ws.errors_of(f"model: {{saved_model: {long}}}\n") == [
        f"recipes/r.yaml:1:22: model.saved_model: '{long}' cannot be used: File name too long"
    ]


def test_a_raw_null_byte_in_a_yaml_file(ws):
    assert ws.errors_of('model: {saved_model: "../models/toy\0"}\n') == [
        "recipes/r.yaml:1:36: YAML error: unacceptable character #x0000: control characters are not allowed"
    ]
    # Located in characters, though libyaml counts UTF-8 bytes.
    assert ws.errors_of('# caf\u00e9\nmodel: {saved_model: "x\1"}\n') == [
        "recipes/r.yaml:2:24: YAML error: unacceptable character #x0001: control characters are not allowed"
    ]


def test_workspace_directories_the_os_would_refuse(ws):
    long = "a" * 300
    ws.write("recipes/r.yaml", MODEL)
    ws.write("tpubuild.yaml", f'output_dir: "out\\0"\ncache_dir: {long}/cache\n')
    code, out, err = ws.cli("build", "--dry-run")
    assert (code, out, err.splitlines()) == (2, "", [
        "tpubuild.yaml:1:13: output_dir: 'out\\x00' contains a null byte",
        f"tpubuild.yaml:2:12: cache_dir: '{long}/cache' cannot be used: File name too long",
    ])


def test_long_or_null_byte_targets_are_usage_errors(ws, run_cli):
    ws.write("recipes/r.yaml", MODEL)
    long = "a" * 300
    assert ws.cli("render", f"{long}.yaml") == (2, "", f"error: no recipe matches '{long}.yaml': File name too long "
                                                      "(recipes: r)\n")
    assert ws.cli("build", "--dry-run", "r\0") == (2, "", "error: no recipe matches 'r\\x00' (did you mean 'r'?)\n")
    code, _, err = run_cli("--workspace", long, "validate")
    assert (code, err) == (2, f"error: no workspace file at '{long}': File name too long\n")


def test_a_full_disk_is_one_line_and_exit_1(ws):
    # /dev/full fails every write with ENOSPC: a real full device, as stdout.
    ws.write("recipes/r.yaml", MODEL)
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [*CLI, "list"], cwd=ws.root, stdout=full, stderr=subprocess.PIPE,
            text=True, timeout=60,
        )
    assert (done.returncode, done.stderr) == (1, "error: No space left on device\n")


def test_an_environment_fault_is_found_behind_other_exceptions(tmp_path):
    from tpubuild.cli import environment_fault

    full = OSError(28, "No space left on device", str(tmp_path / "statcache"))
    try:
        try:
            raise full
        except OSError:
            raise RuntimeError("while saving the stat cache")  # raised while handling it
    except RuntimeError as exc:
        assert environment_fault(exc) is full
    assert environment_fault(OSError(2, "No such file or directory")) is None
    assert environment_fault(ValueError("bug")) is None


# Item 6: a name from the file name is validated like `name:`.


@pytest.mark.parametrize("stem", ["x=1", "-rf", "--help", "a b", "model\N{SNOWMAN}", "a:b"])
def test_names_from_file_names_are_validated(ws, stem):
    assert ws.errors_of(MODEL, name=stem) == [
        f"recipes/{stem}.yaml: name: the file name gives the recipe name {stem!r}, which is not valid "
        f"({NAME_RULE}): set `name:` in the recipe, or rename the file"
    ]
    ws.write(f"recipes/{stem}.yaml", "name: fixed\n" + MODEL)  # the fix the message gives
    assert ws.cli("validate")[0] == 0


@pytest.mark.parametrize("name", ["x=1", "-rf", "ab\\n", "a" * (NAME_MAX_LENGTH + 1)])
def test_explicit_names_follow_the_same_rule(ws, name):
    (line,) = ws.errors_of(f'name: "{name}"\n' + MODEL)
    assert line.startswith("recipes/r.yaml:1:7: name: ")
    shown = name.replace("\\n", "\n")
    if len(shown) > NAME_MAX_LENGTH:
        assert line.endswith(f"name: must be at most {NAME_MAX_LENGTH} characters, got {len(shown)}")
    else:
        assert line.endswith(f"name: {shown!r} is not valid: {NAME_RULE}")


def test_the_schema_states_the_name_rule_of_config_names():
    name = validator("recipe").schema["properties"]["name"]
    assert (name["pattern"], name["maxLength"]) == (NAME_PATTERN, NAME_MAX_LENGTH)
    assert name["patternErrorMessage"] == f"is not valid: {NAME_RULE}"


# Item 7: YAML that would expand beyond any recipe is refused fast.


def _alias_bomb(levels: int, fanout: int) -> str:
    lines = ["l0: &l0 [" + ", ".join(["lol"] * fanout) + "]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * fanout) + "]")
    return "\n".join(lines) + f"\nmodel: {{saved_model: *l{levels - 1}}}\n"


def test_an_alias_bomb_is_refused_fast(ws):
    started = time.perf_counter()
    lines = ws.errors_of(_alias_bomb(9, 10))
    assert time.perf_counter() - started < 5  # it was 30 s and 2.25 GB
    assert lines == [
        f"recipes/r.yaml:5:5: YAML too large: its aliases expand to more than {MAX_NODES} values "
        "(a recipe needs far less)"
    ]


def test_yaml_bounds(ws):
    many_aliases = "a: &a x\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]\n"
    assert ws.errors_of(many_aliases) == [
        f"recipes/r.yaml:2:{5 + 4 * MAX_ALIASES}: YAML too large: more than {MAX_ALIASES} aliases (a recipe needs far less)"
    ]
    deep = "a: " + "[" * 100_000 + "]" * 100_000 + "\n"  # libyaml's composer would segfault
    assert ws.errors_of(deep) == [
        f"recipes/r.yaml:1:{4 + MAX_DEPTH - 1}: YAML too large: nested deeper than {MAX_DEPTH} levels (a recipe needs far less)"
    ]
    assert ws.errors_of("a: &a [*a]\n") == ["recipes/r.yaml:1:4: YAML alias refers to an enclosing node (a cycle)"]
    assert ws.errors_of("#" * MAX_DOCUMENT_BYTES + "\n") == [
        f"recipes/r.yaml: YAML too large: the file is larger than {MAX_DOCUMENT_BYTES} bytes (a recipe needs far less)"
    ]


# Item 8: the workspace boundary holds through symlinks.


@pytest.fixture
def outside(tmp_path_factory) -> Path:
    """A directory outside the workspace holding a SavedModel, a recipe and a script."""
    root = tmp_path_factory.mktemp("outside")
    (root / "model").mkdir()
    (root / "model" / "saved_model.pb").write_bytes(b"")
    (root / "base.yaml").write_text(MODEL)
    (root / "export.py").write_text("def export(output_dir):\n    pass\n")
    return root


def test_a_symlink_to_a_model_outside_the_workspace(ws, outside):
    os.symlink(outside / "model", ws.root / "models" / "linked")
    assert ws.errors_of("model: {saved_model: ../models/linked}\n") == [
        f"recipes/r.yaml:1:22: model.saved_model: '../models/linked' is outside the workspace ({ws.root}) "
        f"through a symlink: it leads to {outside / 'model'}"
    ]


def test_a_saved_model_pb_linked_out_of_the_workspace(ws):
    (ws.root / "models" / "pb").mkdir()
    os.symlink("/etc/passwd", ws.root / "models" / "pb" / "saved_model.pb")
    assert ws.errors_of("model: {saved_model: ../models/pb}\n") == [
        f"recipes/r.yaml:1:22: model.saved_model: '../models/pb' holds saved_model.pb, which is outside the "
        f"workspace ({ws.root}) through a symlink: it leads to /etc/passwd"
    ]


def test_scripts_deps_datasets_and_bases_linked_out_of_the_workspace(ws, outside):
    os.symlink(outside / "export.py", ws.root / "export.py")
    (ws.root / "recipes").mkdir()
    os.symlink(outside / "base.yaml", ws.root / "recipes" / "base.yaml.in")
    leads = f"is outside the workspace ({ws.root}) through a symlink: it leads to {outside}"
    text = (
        "model: {export: {script: ../export.py, deps: ['../*.py']}}\n"
        "converter:\n  quantization_options:\n    method: DYNAMIC_RANGE\n"
        "    representative_datasets: {serving_default: {npz: ../export.py}}\n"
    )
    assert ws.errors_of(text) == [
        f"recipes/r.yaml:1:26: model.export.script: '../export.py' {leads}/export.py",
        f"recipes/r.yaml:1:47: model.export.deps[0]: '../*.py' matches export.py, which {leads}/export.py",
        "recipes/r.yaml:5:54: converter.quantization_options.representative_datasets.serving_default.npz: "
        f"'../export.py' {leads}/export.py",
    ]
    assert ws.errors_of("extends: base.yaml.in\n") == [f"recipes/r.yaml:1:10: extends: 'base.yaml.in' {leads}/base.yaml"]


def test_recipe_globs_stay_in_the_workspace(ws, outside):
    ws.write("tpubuild.yaml", "recipes: [recipes/*.yaml, /etc/*.conf, '../*']\n")
    code, out, err = ws.cli("validate")
    assert (code, out, err.splitlines()) == (2, "", [
        f"tpubuild.yaml:1:27: recipes[1]: '/etc/*.conf' is outside the workspace ({ws.root}): recipes must be inside it",
        f"tpubuild.yaml:1:40: recipes[2]: '../*' is outside the workspace ({ws.root}): recipes must be inside it",
    ])
    ws.write("tpubuild.yaml", "recipes: [recipes/*.yaml]\n")
    (ws.root / "recipes").mkdir()
    os.symlink(outside / "base.yaml", ws.root / "recipes" / "linked.yaml")
    code, out, err = ws.cli("list")
    assert (code, out, err) == (2, "", (
        f"tpubuild.yaml: recipes[0]: 'recipes/*.yaml' matches recipes/linked.yaml, which is outside the "
        f"workspace ({ws.root}) through a symlink: it leads to {outside / 'base.yaml'}\n"
    ))


# Item 12: what the user wrote, and what matched nothing.


def test_messages_quote_paths_as_written(ws):
    assert ws.errors_of("model: {saved_model: ../../etc/passwd}\n") == [
        f"recipes/r.yaml:1:22: model.saved_model: '../../etc/passwd' is outside the workspace ({ws.root})"
    ]
    ws.write("tpubuild.yaml", "recipes: [recipes/*.yaml]\ndefaults:\n  model: {saved_model: models/nope}\n")
    assert ws.errors_of("{}\n") == ["tpubuild.yaml:3:24: model.saved_model: 'models/nope' does not exist"]


def test_validate_warns_about_a_recipe_glob_matching_nothing(ws):
    ws.write("tpubuild.yaml", "recipes: [recipes/*.yaml, recipes/*.yml]\n")
    ws.write("recipes/r.yaml", MODEL)
    assert ws.cli("validate") == (
        0,
        f"1 recipe OK in {ws.root}\n",
        "warning: tpubuild.yaml: recipes glob 'recipes/*.yml' matches no recipe file\n",
    )
