"""TF Serving's model config of a workspace's recipes (`tpubuild serving-config`): a
`ModelServerConfig` text proto (tensorflow_serving/config/model_server_config.proto), made
with TF Serving's own message classes (tensorflow-serving-api) so that what it writes is
what `--model_config_file` parses.

Each recipe is one `ModelConfig`: its name, its base path (`<publish_to>/<recipe>`, or the
local `<output_dir>/<recipe>` when it has no destination), platform `tensorflow`. Version
labels come from the recipe (`serving: {version_labels: {stable: 3}}`), reviewed with
it: with labels the model's version policy is `specific` over exactly the labelled
versions, since TF Serving assigns a label only to a version it has loaded
(tensorflow_serving/model_servers/server_core.cc UpdateModelVersionLabelMap, unless
--allow_version_labels_for_unavailable_models) and its default policy loads the newest
version alone. Without labels the policy is TF Serving's default (`latest`, one version).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HEADER = ("# TF Serving model config (ModelServerConfig text proto), written by `tpubuild serving-config`\n"
          "# from the workspace's recipes: tensorflow_model_server --model_config_file=THIS_FILE\n")


def base_path(recipe: Any, output_dir: Path) -> str:
    """Where TF Serving finds a recipe's numbered versions."""
    url = getattr(recipe, "publish_to", None)
    if url:
        return f"{url.rstrip('/')}/{recipe.name}"
    return str((Path(output_dir) / recipe.name).resolve())


def model_server_config(recipes: list[Any], output_dir: Path) -> str:
    """The text proto of a ModelServerConfig naming every recipe of `recipes`."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    for recipe in sorted(recipes, key=lambda r: r.name):
        model = config.model_config_list.config.add()
        model.name = recipe.name
        model.base_path = base_path(recipe, output_dir)
        model.model_platform = "tensorflow"
        labels = dict(getattr(recipe, "version_labels", {}) or {})
        if labels:
            model.model_version_policy.specific.versions.extend(sorted(set(labels.values())))
            for label, number in sorted(labels.items()):
                model.version_labels[label] = number
    return HEADER + text_format.MessageToString(config)
