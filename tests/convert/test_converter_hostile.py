"""Issue 53: `tpubuild import`, `convert` and `render` given careless and hostile input
(file names, workspaces, text protos from elsewhere): each gives a result or one line and
exit 2, writes nothing outside recipes/ and never through a link, and an imported recipe
means exactly the imported text, judged by protobuf's own message equality on the
messages compiled from schemas/*.proto (the committed descriptor set) and protobuf's
text_format as the reference parser. TensorFlow-free: the commands run in this process
from the directory a user would run them in (tests/cli.py run_cli: an exception other
than SystemExit, a traceback, fails the test); the subprocess that checks they import no
TensorFlow is in test_converter_text.py, a converted model's file modes in
test_converter_flags.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli import run_cli, tpubuild
from tpubuild.config.recipe import load_recipe_file
from tpubuild.converter_protos import GUIDE, MESSAGES, message_class

TPU = 'tpu_functions { function_alias: "tpu_func" }\n'


def message(text: str, dialect: str = GUIDE):
    """`text` parsed by protobuf's own text_format into the dialect's message: the judge."""
    return text_format.Parse(text, message_class(MESSAGES[dialect])())


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "recipes").mkdir(parents=True)
    (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")  # as `tpubuild init` writes it
    (root / "exported" / "toy").mkdir(parents=True)  # what a recipe names must exist to render
    (root / "exported" / "toy" / "saved_model.pb").write_bytes(b"")
    return root


def run(cwd: Path, *args: str) -> tuple[int, str, str]:
    """`tpubuild ARGS` run from `cwd`: (exit code, stdout, stderr)."""
    before = os.getcwd()
    os.chdir(cwd)
    try:
        return run_cli(*args)
    finally:
        os.chdir(before)


def imports_back(ws: Path, text: str, name: str = "t", dialect: str = GUIDE, cwd: Path | None = None,
                 extra: tuple[str, ...] = ()) -> tuple[str, str]:
    """Import `text` (a file in `cwd`, default the workspace) and render it back from there;
    asserts the rendered message is the imported one. (rendered text, import's stderr)."""
    cwd = cwd or ws
    (cwd / f"{name}.pbtxt").write_text(text)
    model = os.path.relpath(ws / "exported" / "toy", cwd)
    code, out, err = run(cwd, "import", f"{name}.pbtxt", "--saved-model", model, *extra)
    written = ws / "recipes" / f"{name}.yaml"
    shown = written.relative_to(cwd) if written.is_relative_to(cwd) else written
    assert (code, out) == (0, f"wrote {shown} from {name}.pbtxt ({dialect})\n"), err
    fmt = "textproto" if dialect == GUIDE else "textproto-v2"
    code, rendered, render_err = run(cwd, "render", name, "--format", fmt)
    assert (code, render_err) == (0, "")
    assert message(rendered, dialect) == message(text, dialect)
    return rendered, err


# Item 1: a file name never changes what a recipe means.

BREAKS = {"LF": "\n", "CR": "\r", "CRLF": "\r\n", "NEL": "\x85", "LS": "\u2028", "PS": "\u2029", "VT": "\v",
          "FF": "\f", "FS": "\x1c", "GS": "\x1d", "RS": "\x1e"}


@pytest.mark.parametrize("kind", sorted(BREAKS))
def test_a_line_break_in_the_file_name_adds_nothing_to_the_recipe(ws: Path, kind: str) -> None:
    # A directory named to close the comment and add a key the build would load into its workers.
    directory = ws / f"from{BREAKS[kind]}op_libraries: [evil.so]{BREAKS[kind]}#"
    directory.mkdir()
    (directory / "tuned.pbtxt").write_text(TPU)
    code, out, err = run(ws, "import", str(directory / "tuned.pbtxt"), "--saved-model", "exported/toy")
    assert (code, err) == (0, "")
    assert out.count("\n") == 1 and out.startswith("wrote recipes/tuned.yaml from ")
    (ws / "recipes" / "plain.yaml").write_text("model: {saved_model: ../exported/toy}\n"
                                               "converter: {tpu_functions: [{function_alias: tpu_func}]}\n")
    injected = load_recipe_file(ws / "recipes" / "tuned.yaml")
    plain = load_recipe_file(ws / "recipes" / "plain.yaml")
    assert "op_libraries" not in injected.canonical
    assert {**injected.canonical, "name": "plain"} == plain.canonical
    header = (ws / "recipes" / "tuned.yaml").read_text(encoding="utf-8").splitlines()[0]
    assert header.isascii() and header.endswith(" (a ConverterOptions text proto).")
    code, rendered, err = run(ws, "render", "tuned")
    assert (code, err) == (0, "") and message(rendered) == message(TPU)


# Item 2: one line and exit 2, never a traceback.

def test_an_enum_number_beyond_int32_is_one_line(ws: Path) -> None:
    (ws / "big.pbtxt").write_text(TPU + "io_shape_optimization: 2147483648\n")
    assert run(ws, "import", "big.pbtxt") == (
        2, "", "big.pbtxt:2:24: Value out of range: 2147483648 (an enum's values are int32)\n")
    assert not (ws / "recipes" / "big.yaml").exists()


def test_convert_refuses_an_enum_number_beyond_int32_in_one_line(ws: Path) -> None:
    code, out, err = run(ws, "convert", "--input_model_dir", "exported/toy", "--output_model_dir", "out",
                         "--converter_options_string", "io_shape_optimization: -2147483649")
    assert (code, out, err) == (
        2, "", "--converter_options_string:1:24: Value out of range: -2147483649 (an enum's values are int32)\n")
    assert not (ws / "out").exists()


def test_recipes_a_regular_file_is_one_line(ws: Path) -> None:
    (ws / "recipes").rmdir()
    (ws / "recipes").write_text("mine\n")
    (ws / "t.pbtxt").write_text(TPU)
    assert run(ws, "import", "t.pbtxt") == (
        2, "", "error: recipes: a regular file, not a directory: import writes only into the workspace's own "
               "recipes/ directory, never through a link (make it a directory)\n")
    assert (ws / "recipes").read_text() == "mine\n"


def test_recipes_a_dangling_link_is_one_line_and_is_not_followed(ws: Path, tmp_path: Path) -> None:
    (ws / "recipes").rmdir()
    (ws / "recipes").symlink_to(tmp_path / "nowhere")
    (ws / "t.pbtxt").write_text(TPU)
    assert run(ws, "import", "t.pbtxt") == (
        2, "", f"error: recipes: a symbolic link (to {tmp_path / 'nowhere'}), not a directory: import writes only "
               "into the workspace's own recipes/ directory, never through a link (make it a directory)\n")
    assert not (tmp_path / "nowhere").exists()


def test_an_endless_file_is_read_no_further_than_the_bound(ws: Path) -> None:
    # In a process of its own, with a deadline: a read with no bound fills the memory.
    done = tpubuild(ws, "import", "/dev/zero", "--name", "zero", timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "error: /dev/zero: larger than 4 MiB, not read (a converter text proto is a few kilobytes)\n")


# Item 3: nothing written outside the workspace.

def test_recipes_a_link_to_a_directory_outside_is_refused(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "recipes").rmdir()
    (ws / "recipes").symlink_to(outside)
    (ws / "t.pbtxt").write_text(TPU)
    code, out, err = run(ws, "import", "t.pbtxt", "--saved-model", "exported/toy")
    assert (code, out, err) == (
        2, "", f"error: recipes: a symbolic link (to {outside}), not a directory: import writes only into the "
               "workspace's own recipes/ directory, never through a link (make it a directory)\n")
    assert list(outside.iterdir()) == []


# Item 4: import refuses what the next command would refuse.

def test_a_saved_model_outside_the_workspace_is_refused_at_import(ws: Path, tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (ws / "t.pbtxt").write_text(TPU)
    assert run(ws, "import", "t.pbtxt", "--saved-model", str(tmp_path / "model")) == (
        2, "", f"error: --saved-model {tmp_path / 'model'} is outside the workspace ({ws}): a recipe names a "
               "SavedModel inside its workspace; export or copy it there, or import in the workspace that holds it\n")
    assert not (ws / "recipes" / "t.yaml").exists()


def test_a_name_another_recipe_has_is_refused_at_import(ws: Path) -> None:
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml", "recipes/*.yml"]\n')
    (ws / "recipes" / "foo.yml").write_text("model: {saved_model: ../exported/toy}\n")
    (ws / "foo.pbtxt").write_text(TPU)
    assert run(ws, "import", "foo.pbtxt") == (
        2, "", "error: recipe name 'foo' is taken by recipes/foo.yml; give another --name (import never overwrites "
               "a recipe)\n")
    assert not (ws / "recipes" / "foo.yaml").exists()
    assert run(ws, "validate")[0] == 0


def test_a_recipe_no_glob_would_find_is_refused_at_import(ws: Path) -> None:
    (ws / "tpubuild.yaml").write_text('recipes: ["models/*/recipe.yaml"]\n')
    (ws / "t.pbtxt").write_text(TPU)
    assert run(ws, "import", "t.pbtxt") == (
        2, "", "error: recipes/t.yaml would not be a recipe of this workspace (not matched by its recipes globs "
               "'models/*/recipe.yaml' in tpubuild.yaml): give another --name, or add 'recipes/*.yaml' to its "
               "recipes\n")


def test_a_recipe_over_the_loaders_bound_is_refused_at_import(ws: Path) -> None:
    (ws / "long.pbtxt").write_text(f'tpu_functions {{ function_alias: "{"a" * 1_200_000}" }}\n')
    code, out, err = run(ws, "import", "long.pbtxt", "--saved-model", "exported/toy")
    assert (code, out, err) == (
        2, "", "long.pbtxt: its recipe would be 1200179 bytes, more than the 1048576 a recipe may have "
               "(config/yamlload.py); the largest value is converter.tpu_functions[0].function_alias (1200000 "
               "characters): nothing written\n")
    assert not (ws / "recipes" / "long.yaml").exists()


def test_an_empty_name_is_refused_not_taken_as_the_stem(ws: Path) -> None:
    (ws / "t.pbtxt").write_text(TPU)
    assert run(ws, "import", "t.pbtxt", "--name", "") == (
        2, "", "error: --name: '' is not valid: a recipe name is letters, digits, '.', '_' and '-', starts with a "
               "letter or digit, at most 100 characters\n")
    assert list((ws / "recipes").iterdir()) == []


# Item 5: the recipe means what the text means.

ALL_ALONE = TPU + "bfloat16_optimization_options { scope: ALL }\n"


def test_a_text_both_dialects_read_differently_asks_for_its_dialect(ws: Path) -> None:
    (ws / "all.pbtxt").write_text(ALL_ALONE)
    assert run(ws, "import", "all.pbtxt", "--saved-model", "exported/toy") == (
        2, "", "all.pbtxt: valid as both ConverterOptions and ConverterOptionsV2, which mean different things here "
               "(as ConverterOptionsV2, bfloat16_optimization_options.experimental.convert_checkpoint: refused: scope "
               "ALL without convert_checkpoint keeps the checkpoint float32, and tpubuild stores the variables it "
               "converts in bfloat16: set experimental { convert_checkpoint: true }; as ConverterOptions, accepted): "
               "say which it is with --dialect v1 (ConverterOptions, the guide's) or --dialect v2 "
               "(ConverterOptionsV2)\n")
    code, out, err = run(ws, "import", "all.pbtxt", "--saved-model", "exported/toy", "--dialect", "v2")
    assert (code, out) == (2, "") and len(err.splitlines()) == 2
    assert err.startswith("all.pbtxt: bfloat16_optimization_options.experimental.convert_checkpoint: refused: ")
    imports_back(ws, ALL_ALONE, name="all", extra=("--dialect", "v1"))
    # A field only V2 has makes it V2, whatever the others: the same refusal, no question.
    (ws / "v2.pbtxt").write_text(ALL_ALONE + "enable_device_placement_safety_checks: true\n")
    code, out, err = run(ws, "import", "v2.pbtxt", "--saved-model", "exported/toy")
    assert (code, out) == (2, "") and err.startswith("v2.pbtxt: bfloat16_optimization_options.experimental.")


DEFAULTS = """\
recipes: [recipes/*.yaml]
defaults:
  converter:
    batch_options: [{max_batch_size: 4, allowed_batch_sizes: [4]}]
    bfloat16_optimization: DISABLED
    bfloat16_optimization_options: {filterlist: [Softmax]}
"""


def test_the_workspace_defaults_do_not_change_an_imported_recipe(ws: Path) -> None:
    (ws / "tpubuild.yaml").write_text(DEFAULTS)
    rendered, err = imports_back(ws, TPU)
    assert rendered == 'tpu_functions {\n  function_alias: "tpu_func"\n}\n'  # no batching, bfloat16 as the converter's default
    assert err == ("note: recipes/t.yaml sets converter.batch_options, converter.bfloat16_optimization, "
                   "converter.bfloat16_optimization_options as t.pbtxt leaves them, over the workspace's defaults "
                   "(tpubuild.yaml): they do not apply to it\n")
    assert run(ws, "validate")[0] == 0
    # A default no recipe value undoes is refused, naming it.
    (ws / "tpubuild.yaml").write_text(DEFAULTS + "    xla_sharding_options: {num_cores_per_replica: 1}\n")
    (ws / "s.pbtxt").write_text(TPU)
    assert run(ws, "import", "s.pbtxt", "--saved-model", "exported/toy") == (
        2, "", "tpubuild.yaml:7:27: defaults.converter.xla_sharding_options: applies to every recipe of this "
               "workspace, and s.pbtxt has none, and no recipe value takes it back, so the recipe would not render "
               "the text's message: import into a workspace without this default (tpubuild --workspace DIR import "
               "...) or drop it from the defaults\n")


# A serialized TopologyProto of one task with two devices, then field 5 of TensorFlow's
# tensorflow.tpu.TopologyProto (tensorflow/core/protobuf/tpu/topology.proto:
# TPUHardwareFeature tpu_hardware_feature = 5) holding embedding_feature = 1.
TOPOLOGY = "\\n\\004\\001\\001\\001\\002\\020\\001\\030\\002\\\"\\010\\000\\000\\000\\000\\000\\000\\000\\001"


def test_a_topology_field_tpubuild_does_not_read_is_refused_by_name(ws: Path) -> None:
    (ws / "topo.pbtxt").write_text(TPU + f'xla_sharding_options {{ num_cores_per_replica: 2 topology: "{TOPOLOGY}'
                                         '*\\002\\010\\001" }\n')
    assert run(ws, "import", "topo.pbtxt") == (
        2, "", "topo.pbtxt: xla_sharding_options.topology: refused: TopologyProto field 5 (tpu_hardware_feature): "
               "tpubuild reads only mesh_shape, num_tasks, num_tpu_devices_per_task and device_coordinates (a "
               "recipe's topology holds no more)\n")
    # Without it the same topology is carried over, bytes and all.
    imports_back(ws, TPU + f'xla_sharding_options {{ num_cores_per_replica: 2 topology: "{TOPOLOGY}" }}\n')


def test_a_second_dataset_with_the_same_key_is_refused(ws: Path) -> None:
    (ws / "data").mkdir()
    (ws / "data" / "a.tfrecord").write_bytes(b"")
    text = ("external_feature_configs {\n  quantization_options {\n"
            '    representative_datasets { key: "serving_default" value { tfrecord_file_path: "data/a.tfrecord" } }\n'
            '    representative_datasets { key: "serving_default" value { tfrecord_file_path: "data/b.tfrecord" } }\n'
            "  }\n}\n")
    (ws / "q.pbtxt").write_text(text)
    assert run(ws, "import", "q.pbtxt") == (
        2, "", "q.pbtxt:4:102: a second \"representative_datasets\" entry with the key 'serving_default': the first "
               "would be dropped; give each key once (reading it as ConverterOptions; as ConverterOptionsV2 it fails "
               "earlier)\n")


def test_the_options_string_given_twice_is_refused(ws: Path) -> None:
    code, out, err = run(ws, "convert", "--input_model_dir", "exported/toy", "--output_model_dir", "out",
                         "--converter_options_string", 'tpu_functions { function_alias: "typo" }',
                         "--converter_options_string", TPU)
    assert (code, out, err) == (2, "", "error: --converter_options_string given 2 times; give it once (only one "
                                       "would be used, the others dropped)\n")
    assert not (ws / "out").exists()


def test_a_string_holding_a_line_break_comes_back_itself(ws: Path) -> None:
    # U+0085 came back as a space (PyYAML wrote it raw in a single-quoted scalar, which folds
    # it); the other characters YAML reads as line breaks or refuses raw are checked with it.
    aliases = [f"tpu{character}func" for character in ("\x85", "\u2028", "\u2029", "\r", "\t", "\x00", "\ufeff")]
    written = message_class(MESSAGES[GUIDE])()
    for alias in aliases:
        written.tpu_functions.add().function_alias = alias
    rendered, _ = imports_back(ws, text_format.MessageToString(written))  # protobuf's escapes: octal UTF-8
    assert [f.function_alias for f in message(rendered).tpu_functions] == aliases
    assert load_recipe_file(ws / "recipes" / "t.yaml").canonical["converter"]["tpu_functions"] == [
        {"function_alias": alias} for alias in aliases]


# Item 6: render gives back the imported message, field for field.

def test_filterlist_order_and_repeats_come_back(ws: Path) -> None:
    text = TPU + 'bfloat16_optimization_options {\n  filterlist: "Softmax"\n  filterlist: "Exp"\n  filterlist: "Softmax"\n}\n'
    rendered, _ = imports_back(ws, text)
    assert list(message(rendered).bfloat16_optimization_options.filterlist) == ["Softmax", "Exp", "Softmax"]


def test_an_explicit_scope_tpu_comes_back(ws: Path) -> None:
    rendered, _ = imports_back(ws, TPU + "bfloat16_optimization_options {\n  scope: TPU\n}\n")
    assert message(rendered).bfloat16_optimization_options.scope == 1


def test_an_empty_bfloat16_section_comes_back(ws: Path) -> None:
    rendered, _ = imports_back(ws, TPU + "bfloat16_optimization_options {\n}\n")
    assert message(rendered).HasField("bfloat16_optimization_options")


def test_a_dataset_path_relative_to_a_sub_directory_comes_back(ws: Path) -> None:
    (ws / "data").mkdir()
    (ws / "data" / "cal.tfrecord").write_bytes(b"")
    (ws / "sub").mkdir()
    text = ('external_feature_configs {\n  quantization_options {\n    representative_datasets {\n'
            '      key: "serving_default"\n      value {\n        tfrecord_file_path: "../data/cal.tfrecord"\n'
            "      }\n    }\n  }\n}\n")
    rendered, _ = imports_back(ws, text, cwd=ws / "sub")
    assert rendered == text
    # From the workspace root, the same file as the converter reads it from there.
    code, from_root, _ = run(ws, "render", "t")
    assert 'tfrecord_file_path: "data/cal.tfrecord"' in from_root


# Any message import accepts comes back: random ConverterOptions within what tpubuild
# carries out, imported and rendered in this process (the same code as the commands).
names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
ints = st.integers(min_value=1, max_value=64)


@st.composite
def options(draw) -> str:
    msg = message_class(MESSAGES[GUIDE])()
    for alias in draw(st.lists(names, max_size=2, unique=True)):
        msg.tpu_functions.add().function_alias = alias
    if draw(st.booleans()):
        batch = msg.batch_options.add()
        sizes = sorted(draw(st.sets(ints, min_size=0, max_size=3)))
        batch.max_batch_size = sizes[-1] if sizes else draw(ints)
        batch.allowed_batch_sizes.extend(sizes)
        for field in ("num_batch_threads", "batch_timeout_micros", "max_enqueued_batches"):
            if draw(st.booleans()):
                setattr(batch, field, draw(ints))
    msg.io_shape_optimization = draw(st.sampled_from([0, 1, 2]))
    msg.bfloat16_optimization = draw(st.sampled_from([0, 1, 2]))
    if draw(st.booleans()):
        bf16 = msg.bfloat16_optimization_options
        bf16.SetInParent()
        bf16.scope = draw(st.sampled_from([0, 1, 2]))
        bf16.filterlist.extend(draw(st.lists(st.sampled_from(["Softmax", "Exp", "Relu"]), max_size=4)))
    if draw(st.booleans()):
        xla = msg.xla_sharding_options
        xla.SetInParent()
        if draw(st.booleans()):
            xla.num_cores_per_replica = 1
        if draw(st.booleans()):
            xla.device_assignment.extend(draw(st.lists(st.integers(0, 3), min_size=4, max_size=4)))
    return text_format.MessageToString(msg, as_utf8=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=options())
def test_any_accepted_text_renders_back_to_its_message(tmp_path: Path, text: str) -> None:
    from tpubuild.config.workspace import load_workspace
    from tpubuild.converter_import import claim, model_path, write_recipe
    from tpubuild.converter_text import read_text_proto
    from tpubuild.render import Spelling, render

    root = tmp_path / f"ws{abs(hash(text))}"
    (root / "exported" / "t").mkdir(parents=True, exist_ok=True)
    (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")
    ws = load_workspace(override=root)
    imported = read_text_proto(text, "random.pbtxt", GUIDE)  # scope ALL alone is V2's too: say which
    result = write_recipe(claim(ws, "t"), imported, "random.pbtxt", model_path(ws, None, "t"), True, root)
    from tpubuild.config.recipe import load_recipe_text

    recipe = load_recipe_text(result.path.read_text(), result.path, ws)
    spelling = Spelling(recipe.written_converter, recipe.root, root, recipe.absolute_paths)
    assert message(render(recipe.canonical, spelling=spelling)) == message(text)
    result.path.unlink()


# Item 7: messages a user can read.

def test_a_file_that_is_not_utf8_is_told_at_its_line_and_column(ws: Path) -> None:
    (ws / "latin.pbtxt").write_bytes(b'tpu_functions {\n  function_alias: "caf\xe9"\n}\n')
    assert run(ws, "import", "latin.pbtxt") == (
        2, "", "latin.pbtxt:2:23: not UTF-8 text: byte 0xe9 here; a text proto is UTF-8\n")


def test_many_bad_list_elements_are_one_line_and_a_count(ws: Path) -> None:
    sizes = " ".join(f"allowed_batch_sizes: {70_000 + i}" for i in range(100_000))
    (ws / "many.pbtxt").write_text(f"batch_options {{ max_batch_size: 8 {sizes} }}\n")
    assert run(ws, "import", "many.pbtxt") == (
        2, "", "many.pbtxt: converter.batch_options[0].allowed_batch_sizes[0]: must be at most 65536 rows, got 70000 "
               "(TensorFlow's BatchFunction pads every batch to its size in host memory) (and 100000 more problems "
               "in its elements, up to converter.batch_options[0].allowed_batch_sizes[99999])\n")


def test_a_value_error_does_not_quote_a_huge_line(ws: Path) -> None:
    (ws / "one.pbtxt").write_text(TPU.strip() + " " + "batch_options { max_batch_size: 8 } " * 60_000
                                  + "io_shape_optimization: SOMETIMES\n")
    code, out, err = run(ws, "import", "one.pbtxt")
    assert (code, out) == (2, "") and err.count("\n") == 1 and len(err) < 300
    assert err.startswith("one.pbtxt:1:2160069: '...") and "_batch_size: 8 } io_shape" in err
    assert err.endswith(" io_shape_optimization: SOMETIMES': Enum type \"ConverterOptions.State\" has no value "
                        "named SOMETIMES\n")
