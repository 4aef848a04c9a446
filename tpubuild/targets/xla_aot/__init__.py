"""Target `xla_aot`: ahead-of-time compiled C++ libraries, one per signature and batch size."""

from tpubuild.stages.base import TargetSpec

# The options' defaults, as the schema documents them (schemas/recipe.schema.json), filled
# into the canonical recipe; the stages read the canonical recipe's.
TARGET = TargetSpec(
    "xla_aot", build="xla_aot", verify="xla_aot_verify",
    defaults={"signatures": ["serving_default"], "rtol": None, "atol": None},  # batch_sizes: required by the schema
)
