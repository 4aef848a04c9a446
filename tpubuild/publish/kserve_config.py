"""KServe's `InferenceService`s of a workspace's recipes (`tpubuild serving-config --format
kserve`): YAML documents of `serving.kserve.io/v1beta1`, one per recipe, for a pull request
to review beside the recipe as TF Serving's model config is (publish/serving_config.py).

Each recipe is one InferenceService (kserve pkg/apis/serving/v1beta1): its name the
recipe's, in the form KServe takes (`[a-z]([-a-z0-9]*[a-z0-9])?`,
inference_service_validation.go IsvcNameFmt; `_` and `.` become `-`), which is also the
model name TF Serving serves it under (config/runtimes/kserve-tensorflow-serving.yaml:
`--model_name={{.Name}}`, `--model_base_path=/mnt/models`); its predictor
`model.modelFormat.name: tensorflow` (that runtime's supportedModelFormats) and
`storageUri`:
- an `oci:` modelcar: the version's tag, `oci+native://HOST/REPO/<recipe>:<N>` (a
  Kubernetes image volume of the image's `models/`, no shell needed: kserve
  pkg/utils/storage.go ConfigureOciNativeToContainer, subPath "models"), or with
  `base_image:` `oci://...` (the modelcar sidecar, which runs `ln` and `sleep` in the
  image: ConfigureModelcarToContainer). N is the version `label` names in the recipe's
  `serving.version_labels`, else the newest version tpubuild published there (one tag
  list and one manifest read of the registry).
- a ModelPack artifact: refused (KServe mounts and fetches images whose `/models` holds
  the model; its ModelPack support is not there yet: docs/samples/storage/oci-fetch).
- a bucket: its base path (`s3://bucket/models/<recipe>`), which KServe's storage
  initializer downloads into /mnt/models, and TF Serving serves its newest version.
- no destination, or a mount (file://): refused, KServe reads neither.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from tpubuild.errors import UsageError

HEADER = ("# KServe InferenceServices (serving.kserve.io/v1beta1), written by `tpubuild serving-config --format "
          "kserve`\n# from the workspace's recipes: kubectl apply -f THIS_FILE\n")
ISVC_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# KServe names the predictor's objects `<name>-predictor` (its Service a DNS label of 63 at most).
ISVC_NAME_MAX = 63 - len("-predictor")


def isvc_name(recipe: Any) -> str:
    """The InferenceService name of a recipe; UsageError when none can be made."""
    name = recipe.name.lower().replace("_", "-").replace(".", "-")
    if not ISVC_NAME.fullmatch(name) or len(name) > ISVC_NAME_MAX:
        raise UsageError(f"{recipe.rel_file}: the recipe name {recipe.name!r} makes no InferenceService name "
                         f"({ISVC_NAME.pattern}, at most {ISVC_NAME_MAX} characters): set `name:`")
    return name


def storage_uri(recipe: Any, label: str, newest: Callable[[Any], int]) -> tuple[str, str]:
    """(the predictor's storageUri, a comment saying which version it is and why)."""
    url = getattr(recipe, "publish_to", None)
    where = recipe.rel_file
    if not url:
        raise UsageError(f"{where}: no publish_to destination: KServe reads models from a registry (oci://) or a "
                         "bucket (s3://, gs://), not out/")
    if url.startswith("file://"):
        raise UsageError(f"{where}: publish_to {url} is a mount, which KServe does not read (pvc:// is a volume of "
                         "its own): publish to oci:// or a bucket")
    if not url.startswith("oci://"):
        return f"{url.rstrip('/')}/{recipe.name}", "its base path: TF Serving serves the newest version there"
    settings = getattr(recipe, "oci", None) or {}
    if settings.get("format", "modelpack") != "modelcar":
        raise UsageError(f"{where}: publish_to {url} pushes ModelPack artifacts, which KServe does not serve (it "
                         "serves images whose /models holds the model): set `oci: {format: modelcar}`")
    labels = dict(getattr(recipe, "version_labels", {}) or {})
    if label in labels:
        number, why = labels[label], f"serving.version_labels.{label}"
    else:
        number, why = newest(recipe), "the newest version published" + (f" (no version label {label!r})"
                                                                           if labels else "")
    scheme = "oci://" if settings.get("base_image") else "oci+native://"
    return f"{scheme}{url[len('oci://'):].rstrip('/')}/{recipe.name}:{number}", f"version {number}: {why}"


def inference_services(recipes: list[Any], label: str = "stable",
                       newest: Callable[[Any], int] | None = None) -> str:
    """The YAML of one InferenceService per recipe. `newest(recipe)`: the newest version
    tpubuild published to the recipe's registry (asked only for a recipe without `label`)."""
    import yaml

    def unknown(recipe: Any) -> int:
        raise UsageError(f"{recipe.rel_file}: no version label {label!r} and no registry to ask")

    names: dict[str, str] = {}
    documents = []
    for recipe in sorted(recipes, key=lambda r: r.name):
        name = isvc_name(recipe)
        if name in names:
            raise UsageError(f"{recipe.rel_file}: its InferenceService name {name!r} is also {names[name]}'s")
        names[name] = recipe.name
        uri, why = storage_uri(recipe, label, newest or unknown)
        service = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                   "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "tpubuild"}},
                   "spec": {"predictor": {"model": {"modelFormat": {"name": "tensorflow"}, "storageUri": uri}}}}
        said = f"# {recipe.name} ({recipe.rel_file}): {why}"
        if name != recipe.name:
            said += f"\n# TF Serving serves it as {name!r} (KServe's --model_name is the InferenceService's name)"
        documents.append(said + "\n" + yaml.safe_dump(service, sort_keys=False, default_flow_style=False))
    return HEADER + "".join(f"---\n{d}" for d in documents)


def newest_in_registry(timeouts: Any = None, say: Callable[[str], None] | None = None) -> Callable[[Any], int]:
    """`newest(recipe)`: the newest version tpubuild published to the recipe's registry, read
    there (a DestinationError when it cannot be; a UsageError when there is none)."""
    from tpubuild.publish.dest_state import DestinationError
    from tpubuild.publish.oci_destination import OciDestination

    def newest(recipe: Any) -> int:
        dest = OciDestination(recipe.publish_to, timeouts, recipe.oci, say=say)
        number = dest.newest_published(dest.survey(recipe.name))
        if number is None:
            raise DestinationError(f"{recipe.rel_file}: {dest.base_path(recipe.name)} holds no version tpubuild published "
                             "(build first)")
        return number

    return newest
