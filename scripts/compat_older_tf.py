"""Load a converted artifact's CPU twin under an older TensorFlow and run it.

    python scripts/compat_older_tf.py [--venv DIR] [--tensorflow VERSION] [--work DIR]

1. Exports a small model with this environment's TensorFlow (a TPU function called from
   the serving signature), converts it with `tpubuild convert` (TPU placement, bfloat16,
   IO shapes, batching of the TPU call site), and makes the CPU twin.
2. Computes the oldest TensorFlow the twin needs (tpubuild.report.compat) and, unless
   --tensorflow says otherwise, installs that release's `tensorflow-cpu` with pip into a
   separate virtual environment (default /tmp/tpubuild-compat-tf-VERSION; reused when it
   already has that release).
3. In that environment, loads the twin, runs its serving signature once and from eight
   threads at once (the BatchFunction kernel batches them), and compares with what this
   environment's TensorFlow computed. It does the same with a copy of the twin whose
   default-valued attributes were put back, and lists the attributes the older registry
   does not know (it logs each as an error and ignores it: ValidateNodeDef in
   tensorflow/core/framework/node_def_util.cc), which is what stripping avoids.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import sys, threading
    import numpy as np
    import tensorflow as tf

    model_dir, data = sys.argv[1], np.load(sys.argv[2])
    print(f"older TensorFlow: {tf.__version__} ({sys.executable})")
    fn = tf.saved_model.load(model_dir).signatures["serving_default"]
    x = data["x"]
    got = fn(x=tf.constant(x))["y"].numpy()
    # The two TF builds may pick different CPU kernels (oneDNN, vector widths), so the
    # results agree to a tolerance, not bit for bit.
    np.testing.assert_allclose(got, data["y"], rtol=1e-5, atol=1e-5)
    print(f"loaded {model_dir} and ran serving_default on a {list(x.shape)} batch: "
          f"max |older - {data['version']}| = {np.abs(got - data['y']).max():.3g}")
    rows = {}
    def call(i):
        rows[i] = fn(x=tf.constant(x[i:i + 1]))["y"].numpy()
    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(x))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    np.testing.assert_allclose(np.concatenate([rows[i] for i in range(len(x))]), data["y"],
                               rtol=1e-5, atol=1e-5)
    print(f"{len(x)} concurrent one-row calls through BatchFunction: each got its own row")
    """
)
# What an older registry says about an attribute it does not know
# (tensorflow/core/framework/node_def_util.cc, ValidateNodeDef): logged and ignored.
UNKNOWN_ATTR = re.compile(r"NodeDef mentions attribute (\w+) which is not in the op definition: Op<name=(\w+)")


def export_source(path: Path) -> None:
    import numpy as np
    import tensorflow as tf

    spec = tf.TensorSpec([None, 8], tf.float32)

    class Demo(tf.Module):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.w = tf.Variable(rng.normal(size=(8, 4)).astype(np.float32), name="w")

        @tf.function(input_signature=[spec])
        def tpu_func(self, x):
            return tf.nn.relu(tf.matmul(x, self.w))

        @tf.function(input_signature=[spec])
        def serve(self, x):
            return {"y": self.tpu_func(x) + 1.0}

    demo = Demo()
    options = tf.saved_model.SaveOptions(function_aliases={"tpu_func": demo.tpu_func})
    tf.saved_model.save(demo, str(path), signatures={"serving_default": demo.serve}, options=options)


OPTIONS = """\
tpu_functions:
  - function_alias: tpu_func
batch_options:
  - num_batch_threads: 2
    max_batch_size: 8
    batch_timeout_micros: 20000
    allowed_batch_sizes: [2, 4, 8]
    max_enqueued_batches: 16
"""


def with_defaults_back(src: Path, dst: Path) -> None:
    """A copy of `src` whose nodes spell out every default, as tpubuild wrote them before."""
    from tpubuild.atomic import write_atomic
    from tpubuild.savedmodel.fnedit import fill_default_attrs
    from tpubuild.savedmodel.model import SAVED_MODEL_PB, SavedModel

    model = SavedModel.load(src)
    model.save(dst)
    graph = model.meta_graph.graph_def
    for node in list(graph.node) + [n for f in graph.library.function for n in f.node_def]:
        fill_default_attrs(node)
    model.meta_graph.meta_info_def.stripped_default_attrs = False
    write_atomic(dst / SAVED_MODEL_PB, model.proto.SerializeToString(deterministic=True))


def ensure_venv(venv: Path, version: str) -> Path:
    python = venv / "bin" / "python"
    if python.exists():
        found = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('tensorflow-cpu'))"],
            capture_output=True, text=True,
        ).stdout.strip()
        if found.startswith(version):
            print(f"reusing {venv} (tensorflow-cpu {found})")
            return python
    print(f"creating {venv} with tensorflow-cpu {version} (pip; takes a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    spec = f"tensorflow-cpu=={version}" if version.count(".") == 2 else f"tensorflow-cpu~={version}.0"
    subprocess.run([str(python), "-m", "pip", "install", "-q", spec], check=True)
    return python


def requirements(model_dir: Path) -> list:
    from tpubuild.report import compat
    from tpubuild.savedmodel.model import SavedModel

    return compat.requirements(SavedModel.load(model_dir).meta_graph)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, help="virtual environment for the older TensorFlow")
    parser.add_argument("--tensorflow", help="release to test (default: the artifact's minimum)")
    parser.add_argument("--work", type=Path, help="keep the models here (default: a temp dir)")
    args = parser.parse_args()

    from tpubuild.quiet import quiet_tensorflow

    quiet_tensorflow()  # this environment's TensorFlow stays quiet; the older one is watched
    import numpy as np
    import tensorflow as tf

    from tpubuild.report.compat import min_tensorflow_version
    from tpubuild.tpu.twin import make_cpu_twin

    work = args.work or Path(tempfile.mkdtemp(prefix="tpubuild-compat-"))
    work.mkdir(parents=True, exist_ok=True)
    source, artifact, twin, unstripped = (work / n for n in ("source", "artifact", "twin", "twin-defaults"))
    for path in (artifact, twin, unstripped):
        if path.exists():
            sys.exit(f"{path} exists; give an empty --work directory")
    export_source(source)
    (work / "converter.yaml").write_text(OPTIONS)
    subprocess.run(
        [sys.executable, "-m", "tpubuild", "convert", str(source), str(artifact),
         "--options-file", str(work / "converter.yaml")],
        check=True,
    )
    twin.mkdir()
    make_cpu_twin(artifact, twin, ["serve"])
    unstripped.mkdir()
    with_defaults_back(twin, unstripped)
    for label, path in (("artifact", artifact), ("CPU twin", twin)):
        version, reason = min_tensorflow_version(path, ["serve"])
        print(f"min TensorFlow of the {label}: {version} ({reason})")
    version = args.tensorflow or min_tensorflow_version(twin, ["serve"])[0]

    x = np.random.default_rng(1).normal(size=(8, 8)).astype(np.float32)
    y = tf.saved_model.load(str(twin)).signatures["serving_default"](x=tf.constant(x))["y"].numpy()
    np.savez(work / "reference.npz", x=x, y=y, version=tf.__version__)
    print(f"this environment: TensorFlow {tf.__version__}; converted and twinned in {work}")

    python = ensure_venv(args.venv or Path(tempfile.gettempdir()) / f"tpubuild-compat-tf-{version}", version)
    tested = tuple(int(p) for p in version.split("."))
    child = work / "run_twin.py"
    child.write_text(CHILD)
    # TensorFlow's C++ log on (level 0), to catch what the older registry says.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TF_CPP_MIN_LOG_LEVEL": "0"}
    for label, model_dir in (("as tpubuild writes it", twin), ("with its defaults put back", unstripped)):
        print(f"--- the CPU twin {label}")
        done = subprocess.run(
            [str(python), str(child), str(model_dir), str(work / "reference.npz")],
            env=env, capture_output=True, text=True,
        )
        sys.stdout.write(done.stdout)
        if done.returncode:
            sys.stdout.write(done.stderr[-3000:])
            print(f"FAILED under the older TensorFlow (exit code {done.returncode})")
            return 1
        newer = sorted({r.what.split(" (")[0] for r in requirements(model_dir) if r.since[:2] > tested[:2]})
        print(f"attributes and ops newer than {version} by tpubuild's history: {', '.join(newer) or 'none'}")
        # ValidateNodeDef logs these with LOG_EVERY_N_SEC(ERROR, 5): at most one line per 5 s.
        logged = sorted({f"{op}.{attr}" for attr, op in UNKNOWN_ATTR.findall(done.stderr)})
        print(f"the older TensorFlow logged 'NodeDef mentions attribute ... Unknown attributes will "
              f"be ignored' for: {', '.join(logged) or 'nothing'}")
    print(json.dumps({"older_tensorflow_ok": True, "work": str(work)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
