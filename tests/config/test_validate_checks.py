"""What validate catches before a build does (issue 30 items 6 and 11): a tab in YAML
indentation, an export script that does not parse or lacks its `function:`, and a child
recipe whose list replaces a base's entry and drops its fields. No TensorFlow."""

from __future__ import annotations

import ast
import json

import pytest

from tpubuild.config.model_checks import module_names

EXPORT = "model:\n  export: {script: ../models/exp.py, function: FUNCTION}\n"
TAB_MESSAGE = "YAML syntax error: a tab character in the indentation: YAML indents with spaces, never tabs"


@pytest.mark.parametrize("text, where", [
    ("model:\n\tsaved_model: ../models/toy\n", "2:1"),  # PyYAML: "cannot start any token"
    ("model:\n  saved_model: ../models/toy\n  \tx: 1\n", "3:3"),  # PyYAML: "violates indentation"
    ("model: {saved_model: ../models/toy}\nconverter:\n  tpu_functions:\n  - function_alias: f\n\t\n", "5:1"),
])
def test_a_tab_in_the_indentation_says_tab_and_where(ws, text, where):
    (ws.root / "recipes").mkdir()
    (ws.root / "recipes" / "r.yaml").write_text(text)  # as written: ws.write's dedent would blank the tab line
    assert ws.cli("validate") == (2, "", f"recipes/r.yaml:{where}: {TAB_MESSAGE}\n")


def test_a_tab_inside_a_value_is_no_indentation_error(ws):
    ws.write("recipes/r.yaml", "name: r\nmodel: {saved_model: ../models/toy}\nverify: {samples: 4}  \t# ok\n")
    assert ws.cli("validate")[0] == 0


def test_validate_reports_a_syntax_error_of_the_export_script_at_its_line(ws):
    ws.write("models/exp.py", "import os\n\ndef export(output_dir):\n    x = (\n")
    ws.write("recipes/r.yaml", EXPORT.replace("FUNCTION", "export"))
    assert ws.cli("validate") == (
        2, "", "models/exp.py:4:9: Python syntax error in the export script of recipes/r.yaml: '(' was never closed\n")
    # build keeps its own report of it: the export stage runs the script (tests/engine/test_user_errors.py).
    assert ws.cli("list")[0] == 0


def test_validate_reports_a_function_the_script_does_not_define(ws):
    ws.write("models/exp.py", "import os\n\ndef export(output_dir):\n    pass\n")
    ws.write("recipes/r.yaml", EXPORT.replace("FUNCTION", "exprot"))
    assert ws.cli("validate") == (
        2, "", "recipes/r.yaml:2:48: model.export.function: models/exp.py defines no function 'exprot' "
               "(did you mean 'export'?)\n")
    ws.write("recipes/r.yaml", EXPORT.replace("FUNCTION", "export"))
    assert ws.cli("validate")[0] == 0


@pytest.mark.parametrize("source, names", [
    ("def export(d): pass\nclass K: pass\nx = y = 1\nimport a.b as c, d.e\nfrom f import g as h\n",
     {"export", "K", "x", "y", "c", "d", "h"}),
    ("if True:\n    def export(d): pass\nelse:\n    export = None\ntry:\n    import z\nexcept ImportError:\n    z = None\n"
     "for i in []: pass\nwith open('f') as fh: pass\n(w := 1)\n", {"export", "z", "i", "fh", "w"}),
    ("def f():\n    inner = 1\n    def g(): pass\n", {"f"}),  # a function's locals are not the module's
    ("from m import *\n", None),  # unknowable without running it
    ("def __getattr__(name): pass\n", None),
    ("globals()['export'] = print\n", None),
])
def test_module_names(source, names):
    assert module_names(ast.parse(source)) == names


def test_a_script_whose_names_cannot_be_known_is_not_an_error(ws):
    ws.write("models/exp.py", "from os.path import *\n")
    ws.write("recipes/r.yaml", EXPORT.replace("FUNCTION", "export"))
    assert ws.cli("validate")[0] == 0


BASE = """\
converter:
  batch_options:
    - num_batch_threads: 2
      max_batch_size: 8
      allowed_batch_sizes: [2, 4, 8]
  tpu_functions: [{function_alias: f}]
"""


def test_a_child_list_that_drops_base_fields_is_a_validate_warning(ws):
    ws.write("recipes/common/base.yaml", BASE)
    ws.write("recipes/child.yaml", "extends: common/base.yaml\nmodel: {saved_model: ../models/toy}\n"
                                   "converter:\n  batch_options:\n    - max_batch_size: 16\n")
    code, out, err = ws.cli("validate")
    assert (code, out) == (0, f"1 recipe OK in {ws.root}\n")
    assert err == (
        "warning: recipes/child.yaml:5:5: converter.batch_options: replaces the whole list of "
        "recipes/common/base.yaml:3 (lists are not merged), dropping batch_options[0].num_batch_threads, "
        "batch_options[0].allowed_batch_sizes; repeat them here to keep them\n")
    # What the warning says is what the recipe is: the child's list alone, defaults filled.
    code, out, _ = ws.cli("render", "child", "--format", "json")
    batch = json.loads(out)["batch_options"][0]
    assert (batch["max_batch_size"], batch["num_batch_threads"], batch["allowed_batch_sizes"]) == (16, 1, [])


@pytest.mark.parametrize("child", [
    # The whole entry repeated: nothing dropped.
    "  batch_options:\n    - {num_batch_threads: 4, max_batch_size: 8, allowed_batch_sizes: [8]}\n",
    # Another kind of entry, no field in common: a deliberate replacement.
    "  tpu_functions: [{concrete_function_name: g}]\n",
])
def test_no_warning_when_nothing_is_lost_by_mistake(ws, child):
    ws.write("recipes/common/base.yaml", BASE)
    ws.write("recipes/child.yaml", "extends: common/base.yaml\nmodel: {saved_model: ../models/toy}\nconverter:\n" + child)
    assert ws.cli("validate") == (0, f"1 recipe OK in {ws.root}\n", "")


def test_workspace_defaults_are_a_base_too(ws):
    ws.write("tpubuild.yaml", "recipes: [recipes/*.yaml]\ndefaults:\n  converter:\n"
                              "    batch_options: [{max_batch_size: 8, batch_timeout_micros: 100}]\n")
    ws.write("recipes/r.yaml", "model: {saved_model: ../models/toy}\nconverter:\n  batch_options: [{max_batch_size: 4}]\n")
    code, _, err = ws.cli("validate")
    assert code == 0
    assert err.startswith("warning: recipes/r.yaml:3:18: converter.batch_options: replaces the whole list of "
                          "tpubuild.yaml:4 ") and "dropping batch_options[0].batch_timeout_micros;" in err
