"""Target `cpu_savedmodel`: a servable CPU SavedModel (the TPU artifact's CPU twin)."""

from tpubuild.stages.base import TargetSpec

# The options' defaults, as the schema documents them (schemas/recipe.schema.json), filled
# into the canonical recipe; the stages read the canonical recipe's.
TARGET = TargetSpec(
    "cpu_savedmodel", build="cpu_savedmodel", verify="cpu_savedmodel_verify",
    defaults={"optimize": True, "rtol": None, "atol": None},
    savedmodel=True,
)
