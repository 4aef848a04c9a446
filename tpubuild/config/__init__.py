"""Recipe configuration: the workspace file, YAML with line marks, JSON Schema,
extends/defaults, semantic checks and the canonical form that the build engine hashes.
TensorFlow-free. Recipes are read with `tpubuild.config.recipe` (load_recipes,
load_recipe_file)."""
