"""Target `litert`: the float source as a LiteRT flatbuffer, run by the LiteRT interpreter."""

from tpubuild.stages.base import TargetSpec

# The options' defaults, as the schema documents them (schemas/recipe.schema.json), filled
# into the canonical recipe; the stages read the canonical recipe's.
TARGET = TargetSpec(
    "litert", build="litert", verify="litert_verify",
    defaults={
        "quantization": "none", "composites": "all", "select_tf_ops": False, "signatures": None,
        "rtol": None, "atol": None,
    },
)
