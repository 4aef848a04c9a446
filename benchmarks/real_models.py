"""Real models through tpubuild: seconds per stage, peak memory, artifact size, and the floor.

Models (random weights, nothing downloaded): ResNet50 (keras.applications) with bfloat16
on its TPU function, the same ResNet50 with static-range int8 quantization, the same
ResNet50 with an XLA AOT target (float32, batch 1), and a
BERT-base-size encoder (keras_hub BertBackbone: 12 layers, hidden 768, vocabulary 30522)
behind tensorflow_text BertTokenizer preprocessing. Each is exported the converter
guide's way (a serving signature on the CPU calling `tpu_func`, saved under that alias)
once, in a process of its own; the recipes then build from that SavedModel.

For each recipe it prints the build's seconds and peak RSS per stage (from `tpubuild build
--json`: each worker's own peak in that stage), the peak RSS of the build's largest
process, the published artifact's size next to the source's, and the floor measured in
the same run: a plain `tf.saved_model.load` + `tf.saved_model.save` of the source in a
fresh process (seconds and peak RSS). The whole command's time is printed twice: wall
seconds as a user times it, and CPU seconds (user + system of the command and everything it
started, from getrusage(RUSAGE_CHILDREN)), which other work on a shared machine disturbs
less; each beside the floor's same figure and its ratio.
Asserts nothing.

Run: pip install -e '.[bench]' && python benchmarks/real_models.py [--only resnet50_bf16,...]
     [--calibration 32] [--keep DIR] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from statistics import median

EXPORTS = textwrap.dedent('''\
    """Exports for benchmarks/real_models.py (random weights)."""
    import os
    import sys

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import numpy as np

    VOCAB_WORDS = ["the", "model", "serves", "text", "on", "a", "tpu", "fast", "build", "cache"]


    def _save(module, serve, tpu_func, out):
        import tensorflow as tf

        tf.saved_model.save(module, out, signatures={"serving_default": serve},
                            options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": tpu_func}))


    def resnet50(out):
        import keras
        import tensorflow as tf

        keras.utils.set_random_seed(0)
        net = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))

        class M(tf.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            @tf.function(input_signature=[tf.TensorSpec([None, 224, 224, 3], tf.float32)])
            def tpu_func(self, x):
                return self.net(x, training=False)

            @tf.function(input_signature=[tf.TensorSpec([None, 224, 224, 3], tf.float32, name="images")])
            def serve(self, x):
                return {"probabilities": self.tpu_func(x)}

        m = M()
        _save(m, m.serve, m.tpu_func, out)


    def bert_base(out):
        import keras
        import keras_hub
        import tensorflow as tf
        import tensorflow_text as text

        keras.utils.set_random_seed(0)
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *VOCAB_WORDS] + [f"w{i}" for i in range(30522 - 14)]
        encoder = keras_hub.models.BertBackbone(vocabulary_size=len(vocab), num_layers=12, num_heads=12,
                                                hidden_dim=768, intermediate_dim=3072, max_sequence_length=128)

        class M(tf.Module):
            def __init__(self):
                super().__init__()
                self.table = tf.lookup.StaticVocabularyTable(
                    tf.lookup.KeyValueTensorInitializer(vocab, tf.range(len(vocab), dtype=tf.int64)), 1)
                self.tokenizer = text.BertTokenizer(self.table, token_out_type=tf.int64, lower_case=True)
                self.encoder = encoder

            @tf.function(input_signature=[tf.TensorSpec([None, 128], tf.int32)] * 2)
            def tpu_func(self, ids, mask):
                return self.encoder({"token_ids": ids, "segment_ids": tf.zeros_like(ids),
                                     "padding_mask": mask})["pooled_output"]

            @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
            def serve(self, s):
                pieces = self.tokenizer.tokenize(s).merge_dims(-2, -1)[:, :126]
                b = tf.shape(s, out_type=tf.int64)[:1]
                ends = lambda v: tf.fill(tf.concat([b, [1]], 0), tf.constant(v, tf.int64))
                ids = tf.concat([ends(2), pieces, ends(3)], axis=1).to_tensor(0, shape=[None, 128])
                ids = tf.cast(ids, tf.int32)
                return {"pooled": self.tpu_func(ids, tf.cast(ids != 0, tf.int32))}

        m = M()
        _save(m, m.serve, m.tpu_func, out)


    def images():
        rng = np.random.default_rng(1)
        while True:
            ramp = np.linspace(0, 255, 224, dtype=np.float32)
            base = ramp[None, :, None, None] * rng.uniform(0.2, 1, (1, 1, 1, 3)) + ramp[None, None, :, None] * 0.3
            yield {"images": np.clip(base + rng.normal(0, 8, (1, 224, 224, 3)), 0, 255).astype(np.float32)}


    def write_text_samples(path, count=16):
        import tensorflow as tf

        rng = np.random.default_rng(2)
        rows = [" ".join(rng.choice(VOCAB_WORDS, size=rng.integers(4, 40))).encode() for _ in range(count)]
        saver = tf.quantization.experimental.TfRecordRepresentativeDatasetSaver(path_map={"serving_default": path})
        saver.save({"serving_default": [{"text": np.array([r], dtype=object)} for r in rows]})


    if __name__ == "__main__":
        globals()[sys.argv[1]](*sys.argv[2:])
''')

RECIPES = {
    "resnet50_bf16": ("resnet50", """\
name: resnet50_bf16
model: {saved_model: ../sources/resnet50}
converter:
  tpu_functions: [{function_alias: tpu_func}]
  bfloat16_optimization: ENABLED
  bfloat16_optimization_options: {scope: TPU}
verify: {samples: 8}
"""),
    # The recipe the speed issue named (issue 54 item 6): placement, bfloat16, IO shapes,
    # batching (verify calls the artifact at every allowed batch size), 16 verify samples,
    # report and publish (both on by default).
    "resnet50_batched": ("resnet50", """\
name: resnet50_batched
model: {saved_model: ../sources/resnet50}
converter:
  tpu_functions: [{function_alias: tpu_func}]
  bfloat16_optimization: ENABLED
  bfloat16_optimization_options: {scope: TPU}
  io_shape_optimization: ENABLED
  batch_options:
    - num_batch_threads: 2
      max_batch_size: 16
      batch_timeout_micros: 5000
      allowed_batch_sizes: [4, 8, 16]
      max_enqueued_batches: 10
verify: {samples: 16}
"""),
    "resnet50_int8": ("resnet50", """\
name: resnet50_int8
model: {saved_model: ../sources/resnet50}
converter:
  tpu_functions: [{function_alias: tpu_func}]
  quantization_options:
    method: STATIC_RANGE
    representative_datasets:
      serving_default: {generator: "recipes.exports:images", num_samples: %(calibration)d}
"""),
    # The XLA AOT target of the same ResNet50 (float32, batch 1): its verify compiles a C++
    # harness against the library and the XLA AOT runtime and runs it on the samples.
    "resnet50_xla_aot": ("resnet50", """\
name: resnet50_xla_aot
model: {saved_model: ../sources/resnet50}
converter:
  tpu_functions: [{function_alias: tpu_func}]
verify: {samples: 8}
targets:
  xla_aot: {signatures: [serving_default], batch_sizes: [1]}
"""),
    "bert_base_text": ("bert_base", """\
name: bert_base_text
model: {saved_model: ../sources/bert_base}
op_libraries: [tensorflow_text]
converter:
  tpu_functions: [{function_alias: tpu_func}]
verify:
  # 12 bfloat16 layers: the pooled output drifts past bfloat16's default rtol 0.02 on
  # random weights (max rel error ~0.033 measured); the benchmark measures time, not accuracy.
  rtol: 0.05
  representative_datasets:
    serving_default: {tfrecord_file_path: ../data/text.tfrecord}
"""),
}


def _measured(argv: list[str], cwd: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """(seconds, peak RSS in MiB of the largest process it started, result) of a fresh
    process; RUSAGE_CHILDREN's maxrss is the largest descendant waited for, so each
    command runs in a child of its own whose own rusage is read."""
    seconds, _cpu, rss, result = _measured_cpu(argv, cwd)
    return seconds, rss, result


def _measured_cpu(argv: list[str], cwd: Path) -> tuple[float, float, float, subprocess.CompletedProcess]:
    """_measured, and the CPU seconds (user + system) of the command and all it started:
    getrusage(RUSAGE_CHILDREN) counts every descendant waited for (a build waits for its
    workers, the worker for what it starts), on the machine's cores whatever else runs."""
    probe = ("import resource, subprocess, sys, json, time\n"
             "t = time.monotonic(); r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
             "print(json.dumps({'s': time.monotonic() - t, 'cpu': u.ru_utime + u.ru_stime, 'rss': u.ru_maxrss,"
             " 'rc': r.returncode, 'out': r.stdout, 'err': r.stderr}))")
    done = subprocess.run([sys.executable, "-c", probe, *argv], cwd=cwd, capture_output=True, text=True, check=True)
    data = json.loads(done.stdout)
    return data["s"], data["cpu"], data["rss"] / 1024, \
        subprocess.CompletedProcess(argv, data["rc"], data["out"], data["err"])


# The verify goal's reference: the source run once over the verification samples as one
# batch in a fresh process (load, then one call), seconds of the call and of the load; the
# twin costs about the same again. Samples as verify draws them: the recipe's TFRecord,
# else `verify.samples` random inputs (the benchmark's recipes set 8).
VERIFY_REFERENCE = """
import sys, time
import numpy as np
import tensorflow as tf
if sys.argv[3] == "text":
    import tensorflow_text  # noqa: F401
    from tpubuild.quantize.datasets import read_tfrecord
    from pathlib import Path
    samples = list(read_tfrecord(Path(sys.argv[2]), "reference"))
    batch = {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}
else:
    batch = {"images": np.random.default_rng(0).uniform(size=(int(sys.argv[2]), 224, 224, 3)).astype("float32")}
t = time.perf_counter()
model = tf.saved_model.load(sys.argv[1])
loaded = time.perf_counter() - t
t = time.perf_counter()
model.signatures["serving_default"](**{k: tf.constant(v) for k, v in batch.items()})
print(loaded, time.perf_counter() - t)
"""


# The quantize stage's reference: TF's quantizer alone (what a user without tpubuild runs)
# on the source in a fresh process, static range, op set XLA, on the calibration samples the
# recipe draws (the same generator); prints the quantizer's own seconds.
QUANTIZE_REFERENCE = """
import itertools, sys, tempfile, time
import tensorflow as tf
from tensorflow.compiler.mlir.quantization.tensorflow import quantization_options_pb2 as qpb
sys.path.insert(0, ".")
from recipes.exports import images
Q = tf.quantization.experimental
with tempfile.TemporaryDirectory() as scratch:
    # TF's quantizer aborts on Keras 3's duplicate variable handles (missing attribute
    # 'value'); the source gets the one-handle fix tpubuild hands it too.
    from pathlib import Path
    import shutil
    from tpubuild.savedmodel.variable_handles import normalize_in_place
    shutil.copytree(sys.argv[1], scratch + "/model")
    normalize_in_place(Path(scratch + "/model"))
    data = scratch + "/calibration.tfrecord"
    Q.TfRecordRepresentativeDatasetSaver(path_map={"serving_default": data}).save(
        {"serving_default": list(itertools.islice(images(), int(sys.argv[2])))})
    options = Q.QuantizationOptions(
        quantization_method=Q.QuantizationMethod(preset_method=Q.QuantizationMethod.PresetMethod.METHOD_STATIC_RANGE_INT8),
        op_set=qpb.XLA, tags=["serve"], signature_keys=["serving_default"],
        representative_datasets={"serving_default": qpb.RepresentativeDatasetFile(tfrecord_file_path=data)})
    t = time.perf_counter()
    Q.quantize_saved_model(scratch + "/model", scratch + "/out", quantization_options=options)
    print(time.perf_counter() - t)
"""


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _references(ws: Path, name: str, model: str, source: Path, rows: list[dict], rss: float,
                env: dict[str, str], runtime_compiled: int, calibration: int) -> None:
    """The goals of the issue beside their references, measured now: stages after the
    source within 4x the floor is printed above; here verify against one batched run of
    source and twin, peak RSS against 3x the model on disk + TensorFlow's own, and the
    cache and out/ against the distinct stage outputs."""
    text = model == "bert_base"
    imports = "import tensorflow" + (", tensorflow_text" if text else "")
    _, baseline, _ = _measured([sys.executable, "-c", imports], ws)
    limit = 3 * _size(source) / 2**20 + baseline
    print(f"  peak RSS goal: <= 3 x {_mib(_size(source))} + TensorFlow's own {baseline:,.0f} MiB "
          f"= {limit:,.0f} MiB; measured {rss:,.0f} MiB ({'met' if rss <= limit else 'NOT met'})")
    verify = next((r["seconds"] for r in rows if r["stage"] == "verify" and r["status"] == "built"), None)
    if verify is not None:
        arg = str(ws / "data" / "text.tfrecord") if text else "8"
        done = subprocess.run([sys.executable, "-c", VERIFY_REFERENCE, str(source), arg, "text" if text else "images"],
                              cwd=ws, env=env, capture_output=True, text=True)
        if done.returncode == 0:
            load, call = map(float, done.stdout.split()[-2:])
            print(f"  verify {verify:.2f} s; reference: source + twin each loaded once ({2 * load:.2f} s) and run "
                  f"once over the samples as one batch ({2 * call:.2f} s): {verify / (2 * load + 2 * call):.2f}x "
                  f"of both, {verify / (2 * call):.1f}x of the runs alone")
    quantize = next((r for r in rows if r["stage"] == "quantize" and r["status"] == "built"), None)
    if quantize is not None:
        q_s, q_rss, done = _measured([sys.executable, "-c", QUANTIZE_REFERENCE, str(source), str(calibration)], ws)
        if done.returncode == 0:
            own = float(done.stdout.split()[-1])
            peak = (quantize.get("peak_rss_bytes") or 0) / 2**20
            # The stage's own seconds leave its worker's start-up (TensorFlow's import) out;
            # the reference's process pays it, so both are compared with it.
            q_stage = quantize["seconds"] + (quantize.get("worker_startup_seconds") or 0.0)
            print(f"  quantize {quantize['seconds']:.2f} s ({q_stage:.2f} s with its worker's start-up), peak RSS "
                  f"{peak:,.0f} MiB; reference: TF's quantizer alone "
                  f"on the source ({calibration} samples, fresh process): {own:.2f} s in the quantizer, {q_s:.2f} s with "
                  f"TensorFlow's import, peak RSS {q_rss:,.0f} MiB: {q_stage / q_s:.2f}x the time, "
                  f"{peak / q_rss:.2f}x the memory")
        else:
            print(f"  quantize reference failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    _disk_row(ws, name, env)  # before xla_aot's second run below publishes another version
    seconds = {r["stage"]: r["seconds"] for r in rows if r["status"] == "built"}
    if "xla_aot_verify" in seconds and "xla_aot" in seconds:
        print(f"  xla_aot_verify {seconds['xla_aot_verify']:.2f} s; reference: compiling its libraries (the xla_aot "
              f"stage, tfcompile) {seconds['xla_aot']:.2f} s: {seconds['xla_aot_verify'] / seconds['xla_aot']:.2f}x "
              f"({runtime_compiled} XLA AOT runtime objects compiled for the workspace's cache in this run)")
        if runtime_compiled:
            # Once per workspace and toolchain: measure again with the runtime's objects
            # cached (one more sample changes xla_aot_verify's key, not the libraries').
            recipe = ws / "recipes" / f"{name}.yaml"
            text = recipe.read_text()
            recipe.write_text(text.replace("verify: {samples: 8}", "verify: {samples: 9}"))
            _, _, again = _measured([sys.executable, "-m", "tpubuild", "build", "--json", name], ws)
            recipe.write_text(text)
            warm = {r["stage"]: r for r in json.loads(again.stdout or '{"rows": []}')["rows"]}.get("xla_aot_verify")
            if warm and warm["status"] == "built":
                print(f"  xla_aot_verify again, runtime objects cached: {warm['seconds']:.2f} s: "
                      f"{warm['seconds'] / seconds['xla_aot']:.2f}x the libraries' compile time")


def _recipe_objects(ws: Path, name: str) -> dict[str, Path]:
    """The cache objects of the recipe's stage outputs (its lock file's keys), by hash."""
    import yaml

    from tpubuild.store import Store

    store = Store(ws / ".tpubuild" / "cache")
    lock = yaml.safe_load((ws / "recipes" / f"{name}.lock.yaml").read_text())
    objects = {}
    for stage in lock["stages"]:
        entry = store.get(stage["key"]) if stage["stage"] != "publish" else None  # publish: not a stage record
        for f in entry.files if entry else ():
            objects[f.hash] = store.object_path(f.hash)
    return objects


def _used(paths: list[Path]) -> int:
    """Bytes on disk of these files and of every file under these directories, an inode
    (a hard link) counted once. A reflink's shared extents are counted per file: no portable
    call tells them apart, so on btrfs/XFS this overstates what copy mode uses."""
    seen, total = set(), 0
    for path in paths:
        for f in [path] if path.is_file() else (p for p in path.rglob("*") if p.is_file()):
            st = f.stat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _disk_row(ws: Path, name: str, env: dict[str, str]) -> None:
    """cache + out/ for one recipe against its distinct stage outputs, in the workspace's
    link_type (copy: reflink or copy) and, published again into another directory, with
    `link_type: hardlink`."""
    from tpubuild.publish import OWN_FILES

    objects = _recipe_objects(ws, name)
    # The publish step's own output: each version's manifest, provenance and signature.
    own = sum(f.stat().st_size for f in (ws / "out" / name).rglob("*") if f.name in OWN_FILES)
    distinct = sum(p.stat().st_size for p in objects.values()) + own
    copy = _used([*objects.values(), ws / "out" / name])
    workspace = ws / "tpubuild.yaml"
    original = workspace.read_text()
    workspace.write_text(original + "link_type: hardlink\noutput_dir: out-hardlink\n")
    try:
        done = subprocess.run([sys.executable, "-m", "tpubuild", "build", name], cwd=ws, env=env,
                              capture_output=True, text=True)
    finally:
        workspace.write_text(original)
    linked = _used([*objects.values(), ws / "out-hardlink" / name]) if done.returncode == 0 else None
    print(f"  cache + out/ for {name}: its distinct stage outputs {_mib(distinct)} ({len(objects)} objects "
          f"and {own:,} bytes of manifests and provenance); "
          f"with out/ (link_type copy) {_mib(copy)} = {copy / distinct:.2f}x "
          f"({'met' if copy <= distinct else 'over: published files are copies on a file system without reflinks'}); "
          + (f"link_type hardlink {_mib(linked)} = {linked / distinct:.2f}x ({'met' if linked <= distinct else 'NOT met'})"
             if linked is not None else f"link_type hardlink: build failed: {done.stderr.strip()[-300:]}"))


def _batch_calls_line(version: Path | None) -> None:
    """What verify ran per batch size of a batched recipe (its summary in the published
    report): calls, padded rows and the largest error at each size, against the source's
    outputs computed once, on each sample alone."""
    report = version / "tpubuild-report.json" if version else None
    if report is None or not report.is_file():
        return
    verify = json.loads(report.read_text()).get("verify") or {}
    for key, calls in sorted((verify.get("batch_calls") or {}).items()):
        if "not_batched" in calls:
            print(f"  verify {key}: each sample alone, not in batches: {calls['not_batched']}")
            continue
        sizes = ", ".join(f"{c['batch_size']}: {c['calls']} calls ({c['padded_rows']} padded rows), max abs error "
                          f"{c['max_abs_error']:.3g}{'' if c['passed'] else ' FAILED'}" for c in calls["sizes"])
        counts = {k: v["count"] for k, v in verify.get("samples", {}).items()}
        print(f"  verify {key}: source once on {counts.get(key, '?')} samples alone; artifact per batch size: {sizes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(RECIPES), help="comma-separated recipes")
    parser.add_argument("--calibration", type=int, default=32, help="int8 calibration samples (converter: 200+)")
    parser.add_argument("--keep", type=Path, help="build in this directory and keep it")
    parser.add_argument("--runs", type=int, default=3, help="floor and cold build, in turn, this many times (medians)")
    args = parser.parse_args()
    wanted = [r for r in args.only.split(",") if r]
    ws = args.keep or Path(tempfile.mkdtemp(prefix="tpubuild-real-models-"))
    (ws / "recipes").mkdir(parents=True, exist_ok=True)
    (ws / "data").mkdir(exist_ok=True)
    (ws / "recipes" / "__init__.py").write_text("")
    (ws / "recipes" / "exports.py").write_text(EXPORTS)
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
    quiet = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    print(f"workspace {ws}; python {sys.version.split()[0]}; {os.cpu_count()} CPUs")
    for stale in (ws / "recipes").glob("*.yaml"):
        stale.unlink()  # this script's own recipes from an earlier --keep run
    for name in wanted:  # all first: a build validates every recipe of the workspace
        (ws / "recipes" / f"{name}.yaml").write_text(RECIPES[name][1] % {"calibration": args.calibration})
    for name in wanted:  # every source before any build: a build validates every recipe
        model = RECIPES[name][0]
        source = ws / "sources" / model
        if not source.exists():
            t = time.monotonic()
            subprocess.run([sys.executable, "recipes/exports.py", model, str(source)], cwd=ws, check=True,
                           env=quiet, capture_output=True)
            print(f"exported {model}: {time.monotonic() - t:.1f} s, {_mib(_size(source))}")
        if name == "bert_base_text" and not (ws / "data" / "text.tfrecord").exists():
            subprocess.run([sys.executable, "recipes/exports.py", "write_text_samples", "data/text.tfrecord"],
                           cwd=ws, check=True, env=quiet, capture_output=True)
    for name in wanted:
        model = RECIPES[name][0]
        source = ws / "sources" / model
        floor_dir = ws / "floor" / model
        runtime_cache = ws / ".tpubuild" / "xla_aot_runtime"
        # Floor and cold build in turn, `--runs` times: on a shared machine one run says
        # little; the medians, and the median of each pair's ratio, are printed.
        floors, builds = [], []
        for _ in range(max(1, args.runs)):
            shutil.rmtree(floor_dir, ignore_errors=True)
            floor_s, floor_cpu, floor_rss, floor = _measured_cpu(
                [sys.executable, "-c", "import sys, tensorflow as tf\n"
                 + ("import tensorflow_text\n" if model == "bert_base" else "")
                 + "tf.saved_model.save(tf.saved_model.load(sys.argv[1]), sys.argv[2])", str(source), str(floor_dir)],
                ws)
            if floor.returncode:
                print(f"  floor failed: {floor.stderr.strip().splitlines()[-1]}")
            floors.append((floor_s, floor_cpu, floor_rss))
            # Cold: nothing of an earlier run (--keep) or recipe in the cache. Only this script's
            # own workspace state goes: the exported sources and data stay.
            shutil.rmtree(ws / ".tpubuild", ignore_errors=True)
            shutil.rmtree(ws / "out" / name, ignore_errors=True)
            shutil.rmtree(ws / "out-hardlink" / name, ignore_errors=True)  # _disk_row's, of an earlier run
            runtime_before = len(list(runtime_cache.glob("*.o"))) if runtime_cache.is_dir() else 0
            seconds, cpu, rss, result = _measured_cpu([sys.executable, "-m", "tpubuild", "build", "--json", name], ws)
            try:
                peaks = [(row.get("peak_rss_bytes") or 0) / 2**20 for row in json.loads(result.stdout)["rows"]]
            except ValueError:
                peaks = []
            builds.append((seconds, cpu, max([rss, *peaks])))  # the largest process's peak: see below
        runtime_compiled = (len(list(runtime_cache.glob("*.o"))) if runtime_cache.is_dir() else 0) - runtime_before
        print(f"\n{name}: build {'ok' if result.returncode == 0 else f'FAILED (exit {result.returncode})'}")
        if result.returncode:
            for line in result.stderr.strip().splitlines()[-3:]:
                print(f"  {line}")
        try:
            rows = json.loads(result.stdout)["rows"]
        except ValueError:
            rows = []
        # A worker resets its high-water mark before each stage (/proc/self/clear_refs), and
        # getrusage's maxrss is that mark at exit: the largest process's peak is the larger of
        # the build's own and every stage's.
        rss = max([rss, *((row.get("peak_rss_bytes") or 0) / 2**20 for row in rows)])
        for row in rows:
            peak = row.get("peak_rss_bytes")
            startup = row.get("worker_startup_seconds")
            print(f"  {row['stage']:<22} {row['status']:<8} {row['seconds']:8.2f} s"
                  + (f"   peak RSS {peak / 2**20:,.0f} MiB" if peak else "")
                  + (f"   worker start-up {startup:.2f} s" if startup else ""))
        out = ws / "out" / name
        versions = sorted((p for p in out.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)) if out.is_dir() else []
        artifact = _size(versions[-1]) if versions else 0
        _batch_calls_line(versions[-1] if versions else None)
        own = sum(row["seconds"] for row in rows if row["status"] == "built")
        waited = sum(row.get("worker_startup_seconds") or 0.0 for row in rows)
        print(f"  stages' own seconds {own:.2f} s, worker start-up waited for {waited:.2f} s")
        runs = f"median of {len(builds)} run{'s' if len(builds) > 1 else ''}"
        b_s, b_cpu, b_rss = (median(b[i] for b in builds) for i in range(3))
        f_s, f_cpu, f_rss = (median(f[i] for f in floors) for i in range(3))
        print(f"  total (cold `tpubuild build`)   {b_s:8.2f} s wall {b_cpu:8.2f} s CPU   peak RSS {b_rss:,.0f} MiB  ({runs})")
        print(f"  floor (load + save, fresh proc) {f_s:8.2f} s wall {f_cpu:8.2f} s CPU   "
              f"peak RSS {f_rss:,.0f} MiB  ({runs})")
        wall_x = median(b[0] / f[0] for b, f in zip(builds, floors))
        cpu_x = median(b[1] / f[1] for b, f in zip(builds, floors))
        print(f"  -> build / floor, median of each pair's ratio: {wall_x:.2f}x wall, {cpu_x:.2f}x CPU (goal <= 2x)")
        print(f"  source {_mib(_size(source))}, artifact {_mib(artifact)} ({artifact / max(_size(source), 1):.2f}x)")
        _references(ws, name, model, source, rows, rss, quiet, runtime_compiled, args.calibration)
    if not args.keep:
        shutil.rmtree(ws, ignore_errors=True)


if __name__ == "__main__":
    main()
