"""Issue 47: `tpubuild convert` with the Cloud TPU Inference Converter's own flags, on real
SavedModels: the guide's text protos and today's ConverterOptionsV2 convert as the
equivalent YAML options do; soft device placement lets a string op stay in a TPU function."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.cli import REPO, tpubuild
from tpubuild.cli import main

# Exported in a subprocess, as a user's export script runs: this process's eager context
# then holds no function of the models (the MLIR bridge check registers copies in it).
MODELS = """
import sys
import numpy as np
import tensorflow as tf

SPEC4 = tf.TensorSpec([None, 4], tf.float32)


class Toy(tf.Module):
    # serve(x) = 2 * tpu_func(x), the guide's shape: one aliased TPU function.
    def __init__(self):
        self.w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), name="w")

    @tf.function(input_signature=[SPEC4])
    def tpu_func(self, x):
        return tf.nn.relu(tf.matmul(x, self.w))

    @tf.function(input_signature=[SPEC4])
    def serve(self, x):
        return {"y": self.tpu_func(x) * 2.0}


class StringInside(Toy):
    # A string round trip inside the TPU function: AsString and StringToNumber have no TPU kernel.
    @tf.function(input_signature=[SPEC4])
    def tpu_func(self, x):
        text = tf.strings.as_string(tf.matmul(x, self.w), precision=4)
        return tf.nn.relu(tf.strings.to_number(text))


for name, module in (("toy", Toy()), ("string_inside", StringInside())):
    tf.saved_model.save(module, f"{sys.argv[1]}/{name}", signatures={"serving_default": module.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": module.tpu_func}))
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    done = subprocess.run([sys.executable, "-c", MODELS, str(root)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return {"toy": root / "toy", "string_inside": root / "string_inside"}


def convert(*args: str) -> tuple[int, str]:
    """`tpubuild convert ARGS` in this process, as the `tpubuild` executable runs it (cli.main:
    a TpubuildError is its lines on stderr and an exit code); (exit code, stdout + stderr)."""
    done = CliRunner().invoke(main_command, ["convert", *args])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    return done.exit_code, done.output


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main_command(args: tuple[str, ...]) -> None:
    main(list(args))


def same_model(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and all(
        (a / f).read_bytes() == (b / f).read_bytes() for f in files)


GUIDE = ('tpu_functions { function_alias: "tpu_func" } '
         "batch_options { num_batch_threads: 2 max_batch_size: 8 batch_timeout_micros: 5000 "
         "allowed_batch_sizes: 2 allowed_batch_sizes: 4 allowed_batch_sizes: 8 max_enqueued_batches: 10 }")
GUIDE_YAML = """\
tpu_functions: [{function_alias: tpu_func}]
batch_options:
  - {num_batch_threads: 2, max_batch_size: 8, batch_timeout_micros: 5000, allowed_batch_sizes: [2, 4, 8],
     max_enqueued_batches: 10}
"""


def test_the_guides_command_line_converts_as_the_yaml_options_do(models: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "converter.yaml").write_text(GUIDE_YAML)
    code, output = convert(str(models["toy"]), str(tmp_path / "yaml"), "--options-file", str(tmp_path / "converter.yaml"))
    assert code == 0, output
    code, output = convert(f"--input_model_dir={models['toy']}", f"--output_model_dir={tmp_path / 'flags'}",
                           f"--converter_options_string={GUIDE}")
    assert code == 0, output
    assert output.endswith(f"converted {models['toy']} -> {tmp_path / 'flags'} (tpu, bfloat16, io_shape, batch)\n")
    code, output = convert("--input_model_dir", str(models["toy"]), "--output_model_dir", str(tmp_path / "spaced"),
                           "--converter_options_string", GUIDE)
    assert code == 0, output
    assert same_model(tmp_path / "yaml", tmp_path / "flags")
    assert same_model(tmp_path / "yaml", tmp_path / "spaced")


# The guide's other text protos (shared/docs/converter-reference.md), each converting the toy,
# with what else the command line needs.
GUIDE_VARIANTS = [
    ('tpu_functions { function_alias: "tpu_func" } batch_options { max_batch_size: 4 allowed_batch_sizes: 4 '
     'experimental { signature_name: "serving_default" } }', ()),
    # Valid in both dialects, meaning other things in each (V2's scope ALL alone keeps
    # neither the signature nor tpubuild's bfloat16 variables): the guide's, said so.
    ('tpu_functions { function_alias: "tpu_func" } bfloat16_optimization_options { scope: ALL filterlist: "Relu" }',
     ("--dialect", "v1")),
    ('tpu_functions { function_alias: "tpu_func" } disable_default_optimizations: true io_shape_optimization: ENABLED '
     "xla_sharding_options { num_cores_per_replica: 1 }", ()),
    # Today's ConverterOptionsV2: the batch component at the top of BatchOptionsV2.
    ('tpu_functions { function_alias: "tpu_func" } batch_options { max_batch_size: 4 allowed_batch_sizes: 4 '
     'signature_name: "serving_default" } experimental_options { graph_pruning: DISABLED }', ()),
]


@pytest.mark.parametrize("index", range(len(GUIDE_VARIANTS)))
def test_each_text_proto_converts_through_the_converters_flags(models: dict[str, Path], tmp_path: Path,
                                                                index: int) -> None:
    text, extra = GUIDE_VARIANTS[index]
    code, output = convert(f"--input_model_dir={models['toy']}", f"--output_model_dir={tmp_path / 'out'}",
                           f"--converter_options_string={text}", *extra)
    assert code == 0, output
    assert (tmp_path / "out" / "saved_model.pb").is_file()


def test_soft_placement_keeps_a_string_op_in_the_tpu_function(models: dict[str, Path], tmp_path: Path) -> None:
    model = models["string_inside"]
    code, output = convert(f"--input_model_dir={model}", f"--output_model_dir={tmp_path / 'hard'}",
                           '--converter_options_string=tpu_functions { function_alias: "tpu_func" }')
    assert code == 1
    assert output.splitlines()[-1] == (
        'error: tpu function "tpu_func" (alias of __inference_tpu_func_102): 2 ops: op \'AsString\' (node AsString), '
        "op 'StringToNumber' (node StringToNumber); each has no XLA kernel and cannot run on the TPU")
    code, output = convert(f"--input_model_dir={model}", f"--output_model_dir={tmp_path / 'soft'}",
                           '--converter_options_string=tpu_functions { function_alias: "tpu_func" '
                           "enable_soft_device_placement: true }")
    assert code == 0, output
    assert 'warning: tpu: tpu function "tpu_func" (alias of __inference_tpu_func_102): soft device placement: ' \
           "2 op(s) run on the host instead of the TPU: AsString (AsString), StringToNumber (StringToNumber)\n" in output
    # What the runtime reads: the metadata's allow_soft_placement, the host ops marked.
    from tpubuild.savedmodel.model import SavedModel

    converted = SavedModel.load(tmp_path / "soft")
    body = converted.functions["__inference_tpu_func_102"]
    nodes = {n.name: n for n in body.node_def}
    assert [n.attr["allow_soft_placement"].b for n in body.node_def if n.op == "TPUReplicateMetadata"] == [True]
    assert {name: n.attr["_xla_outside_compilation"].s for name, n in nodes.items()
            if "_xla_outside_compilation" in n.attr} == {"AsString": b"0", "StringToNumber": b"1"}


def test_a_soft_placed_recipe_builds_and_its_report_lists_the_host_ops(models: dict[str, Path], tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    run = lambda *args: tpubuild(ws, *args, timeout=900)  # noqa: E731
    assert run("init", ".").returncode == 0
    (ws / "soft.pbtxt").write_text('tpu_functions {\n  function_alias: "tpu_func"\n  enable_soft_device_placement: true\n}\n'
                                   "bfloat16_optimization: DISABLED\n")
    shutil.copytree(models["string_inside"], ws / "exported" / "soft")
    done = run("import", "soft.pbtxt", "--saved-model", "exported/soft")
    assert done.returncode == 0, done.stderr
    done = run("build", "-q")
    assert done.returncode == 0, done.stdout + done.stderr
    report = (ws / "out" / "soft" / "1" / "tpubuild-report.md").read_text()
    assert "- TPU placement: tpu_func at 1 call site(s); soft device placement: 2 op(s) run on the host instead of " \
           "the TPU: AsString (AsString), StringToNumber (StringToNumber)\n" in report


def test_malformed_text_exits_2_at_its_line_and_column(models: dict[str, Path], tmp_path: Path) -> None:
    done = tpubuild(None, "convert", f"--input_model_dir={models['toy']}", f"--output_model_dir={tmp_path / 'out'}",
                    '--converter_options_string=tpu_functions {\n  function_alias: "tpu_func"\n}\nbatch_options { max_batch: 8 }',
                    timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ('--converter_options_string:4:17: Message type "BatchOptions" has no field named '
                           '"max_batch"\n')
    assert not (tmp_path / "out").exists()


def test_a_gpu_field_is_refused_in_one_line(models: dict[str, Path], tmp_path: Path) -> None:
    code, output = convert(f"--input_model_dir={models['toy']}", f"--output_model_dir={tmp_path / 'out'}",
                           '--converter_options_string=xla_functions { device_type: GPU function_alias: "tpu_func" }')
    assert (code, output) == (
        2, "--converter_options_string: xla_functions[0].device_type: refused: GPU: GPU only (tpubuild converts "
           "for the TPU)\n")


def test_the_guides_quantization_text_proto_converts_through_the_flags(tmp_path: Path) -> None:
    """external_feature_configs { quantization_options { ... } } as `tpubuild render` writes it
    for the example `quantized` recipe, its TFRecord path relative to the directory the
    command runs in (as the converter's image reads it)."""
    repo = REPO
    export = ("import runpy, sys\n"
              "runpy.run_path('recipes/models/quantized.py')['export'](sys.argv[1])\n")
    done = subprocess.run([sys.executable, "-c", export, str(tmp_path / "model")], cwd=repo, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = tpubuild(repo, "render", "quantized", timeout=120).stdout
    assert 'tfrecord_file_path: "recipes/data/quantized.tfrecord"' in text
    done = tpubuild(repo, "convert", f"--input_model_dir={tmp_path / 'model'}", f"--output_model_dir={tmp_path / 'out'}",
                    f"--converter_options_string={text}")
    assert (done.returncode, done.stdout) == (0, f"converted {tmp_path / 'model'} -> {tmp_path / 'out'} (quantize)\n"), \
        done.stderr


TPU = 'tpu_functions { function_alias: "tpu_func" }'


def test_an_output_inside_the_input_is_refused_in_one_line(models: dict[str, Path], tmp_path: Path) -> None:
    """Issue 53 item 2: --output_model_dir inside --input_model_dir linked the input tree into
    its own output until ENAMETOOLONG; through a link to it, the same."""
    src = tmp_path / "src"
    shutil.copytree(models["toy"], src)
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    (tmp_path / "via").symlink_to(src)
    for given in (src / "converted", tmp_path / "via" / "converted"):
        code, output = convert(f"--input_model_dir={src}", f"--output_model_dir={given}",
                               f"--converter_options_string={TPU}")
        assert (code, output) == (2, f"error: {src / 'converted'}: inside the SavedModel to convert ({src}); the "
                                     "output goes outside the input\n")
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before


def test_the_converted_model_keeps_the_inputs_file_modes(models: dict[str, Path], tmp_path: Path) -> None:
    """Issue 53 item 7: saved_model.pb came out 0600 (as the stages write it for the cache)
    where the input's was 0644; each file takes its input's mode, a new one the umask's."""
    src = tmp_path / "src"
    shutil.copytree(models["toy"], src)
    for path in src.rglob("*"):
        path.chmod(0o750 if path.is_dir() else 0o640)
    (src / "saved_model.pb").chmod(0o644)
    code, output = convert(f"--input_model_dir={src}", f"--output_model_dir={tmp_path / 'out'}",
                           f"--converter_options_string={TPU}")
    assert code == 0, output
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {}
    for path in [tmp_path / "out", *(tmp_path / "out").rglob("*")]:
        theirs = src / path.relative_to(tmp_path / "out")
        expected = stat.S_IMODE(theirs.stat().st_mode) if theirs.exists() else (0o777 if path.is_dir() else 0o666) & ~umask
        modes[str(path.relative_to(tmp_path))] = (oct(stat.S_IMODE(path.stat().st_mode)), oct(expected))
    assert modes["out/saved_model.pb"] == ("0o644", "0o644")
    assert all(actual == expected for actual, expected in modes.values()), modes


def test_an_output_dir_that_cannot_be_made_is_one_line(models: dict[str, Path], tmp_path: Path) -> None:
    """A file where a directory of OUT_DIR's path should be was a FileExistsError traceback."""
    (tmp_path / "notes").write_text("mine\n")
    code, output = convert(f"--input_model_dir={models['toy']}", f"--output_model_dir={tmp_path / 'notes' / 'out'}",
                           f"--converter_options_string={TPU}")
    assert (code, output) == (2, f"error: {tmp_path / 'notes' / 'out'}: cannot be made: File exists "
                                 f"({tmp_path / 'notes'})\n")
    assert (tmp_path / "notes").read_text() == "mine\n"
