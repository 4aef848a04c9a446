"""`tpubuild validate` reads a plain SavedModel's function aliases from saved_model.pb
without TensorFlow (config/saved_model_wire.py): the same aliases TensorFlow's own proto
parser reads, and an unknown alias in a recipe is an error at its line (issue 30 item 6)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from sm_models import ALIASES, SIGNATURES
from tensorflow.core.protobuf import saved_model_pb2

from tpubuild.config.saved_model_wire import meta_graph_aliases, meta_graphs

PROBE = (
    "import sys\nfrom tpubuild.cli import main\n"
    "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
    "print('TF_LOADED' if 'tensorflow' in sys.modules else 'TF_FREE', code)\n"
)


def test_wire_reader_agrees_with_tensorflow(zoo: Path, tmp_path: Path) -> None:
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((zoo / "saved_model.pb").read_bytes())
    want = [(list(mg.meta_info_def.tags), dict(mg.meta_info_def.function_aliases)) for mg in proto.meta_graphs]
    assert meta_graph_aliases(zoo / "saved_model.pb") == want
    assert set(want[0][1].values()) == set(ALIASES)
    # Signature keys too, without TF's initializer signature (no recipe names it).
    keys = sorted(k for k in proto.meta_graphs[0].signature_def if k != "__saved_model_init_op")
    assert sorted(meta_graphs(zoo / "saved_model.pb")[0].signatures) == keys == sorted(SIGNATURES)
    # Two MetaGraphDefs (TF1's builder writes one per tag set): both are read, in order.
    proto.meta_graphs.add().CopyFrom(proto.meta_graphs[0])
    proto.meta_graphs[1].meta_info_def.ClearField("tags")
    proto.meta_graphs[1].meta_info_def.tags.append("tpu")
    (tmp_path / "saved_model.pb").write_bytes(proto.SerializeToString())
    assert meta_graph_aliases(tmp_path / "saved_model.pb") == [want[0], (["tpu"], want[0][1])]


def test_validate_names_an_unknown_alias_at_its_line_without_tensorflow(zoo: Path, tmp_path: Path) -> None:
    shutil.copytree(zoo, tmp_path / "models" / "zoo")
    (tmp_path / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")
    (tmp_path / "recipes").mkdir()
    known = sorted(ALIASES)[0]
    (tmp_path / "recipes" / "z.yaml").write_text(
        "model: {saved_model: ../models/zoo}\nconverter:\n"
        f"  tpu_functions:\n  - function_alias: {known}\n  - function_alias: {known}x\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    done = subprocess.run([sys.executable, "-c", PROBE, "validate"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.stdout.splitlines()[-1] == "TF_FREE 2", done.stderr
    listed = ", ".join(f'"{a}"' for a in sorted(ALIASES))
    assert done.stderr.splitlines() == [
        f'recipes/z.yaml:5:21: converter.tpu_functions[1].function_alias: unknown function alias "{known}x" '
        f'(did you mean "{known}"?) in models/zoo; aliases: {listed}'
    ]
    # The same recipe with the right alias validates.
    (tmp_path / "recipes" / "z.yaml").write_text(
        f"model: {{saved_model: ../models/zoo}}\nconverter:\n  tpu_functions: [{{function_alias: {known}}}]\n")
    done = subprocess.run([sys.executable, "-c", PROBE, "validate"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.stdout.splitlines()[-1] == "TF_FREE 0", done.stderr


def test_validate_names_an_unknown_signature_at_its_line_without_tensorflow(zoo: Path, tmp_path: Path) -> None:
    """issue 42: a misspelled signature_name of a `saved_model:` recipe is validate's error at
    file:line:col (exit 2), read from the saved_model.pb validate already reads for aliases."""
    shutil.copytree(zoo, tmp_path / "models" / "zoo")
    (tmp_path / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "x.tfrecord").write_bytes(b"")  # read by the build, not by validate
    (tmp_path / "recipes" / "z.yaml").write_text(
        "model: {saved_model: ../models/zoo}\nconverter:\n"
        "  tpu_functions:\n  - signature_name: serve_tow\n"
        "  batch_options:\n  - {max_batch_size: 8, allowed_batch_sizes: [8], experimental: {signature_name: serving_defualt}}\n"
        "verify:\n  representative_datasets:\n    serve_chain: {tfrecord_file_path: x.tfrecord}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    done = subprocess.run([sys.executable, "-c", PROBE, "validate"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.stdout.splitlines()[-1] == "TF_FREE 2", done.stderr
    listed = ", ".join(f'"{k}"' for k in sorted(SIGNATURES))
    assert done.stderr.splitlines() == [
        f'recipes/z.yaml:4:21: converter.tpu_functions[0].signature_name: unknown signature "serve_tow" '
        f'(did you mean "serve_two"?) in models/zoo; signatures: {listed}',
        f'recipes/z.yaml:6:82: converter.batch_options[0].experimental.signature_name: unknown signature '
        f'"serving_defualt" (did you mean "serving_default"?) in models/zoo; signatures: {listed}',
        f'recipes/z.yaml:9:5: verify.representative_datasets.serve_chain: unknown signature "serve_chain" '
        f'(did you mean "serve_chains"?) in models/zoo; signatures: {listed}',
    ]
