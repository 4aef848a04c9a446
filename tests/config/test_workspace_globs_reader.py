"""`build --check`'s reader of a workspace file's `recipes:` globs (config/finding.py
recipe_globs_in), which reads without PyYAML. Where it answers, it must answer what YAML
reads: a glob it got wrong could leave a recipe out of the check. Where it is unsure it
says None and the caller parses the file with PyYAML."""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tpubuild.config.finding import DEFAULT_RECIPE_GLOBS, recipe_globs_in
from tpubuild.config.workspace import load_workspace

# Forms people write: each must be read here (or the fast path is never taken).
READ = {
    "# the example workspace\nrecipes: [\"recipes/*.yaml\"]   # bases live in recipes/common\noutput_dir: out\n":
        ["recipes/*.yaml"],
    "recipes: [recipes/*.yaml, models/**/recipe.yaml]\ncache_dir: .tpubuild/cache\nkeep_versions: 5\n":
        ["recipes/*.yaml", "models/**/recipe.yaml"],
    "recipes:\n  - recipes/*.yaml\n  - 'teams/*/recipes/*.yml'  # each team's\noutput_dir: out\n":
        ["recipes/*.yaml", "teams/*/recipes/*.yml"],
    "recipes:\n- ./recipes/*.yaml\n": ["./recipes/*.yaml"],
    "output_dir: out\ndefaults:\n  verify:\n    samples: 4\n": list(DEFAULT_RECIPE_GLOBS),
    "": list(DEFAULT_RECIPE_GLOBS),
    "$schema: schemas/workspace.schema.json\nrecipes: [toy.yaml]\n": ["toy.yaml"],
}


def test_the_usual_forms_are_read_as_the_workspace_loader_reads_them(tmp_path):
    for text, globs in READ.items():
        (tmp_path / "tpubuild.yaml").write_text(text)
        (tmp_path / "recipes").mkdir(exist_ok=True)
        assert recipe_globs_in(text) == globs == load_workspace(tmp_path).recipe_globs, text


# Forms YAML reads differently from a line-by-line guess, or that are not a list of strings.
DECLINED = [
    "recipes: [*.yaml]\n",  # an alias in YAML
    "recipes:\n  - a/*.yaml\n    - b\n",  # one plain scalar, 'a/*.yaml - b'
    "recipes: [a/*.yaml]\nrecipes: [b/*.yaml]\n",  # a duplicate key
    "recipes:\n",  # null
    "recipes: []\n",
    "recipes: recipes/*.yaml\n",  # a string
    "recipes: [\"a,b/*.yaml\"]\n",
    "recipes: [yes]\n",  # a bool in YAML 1.1
    "defaults: {a: 1,\nrecipes: [x/*.yaml]}\n",  # a flow mapping over two lines
    "output_dir: \"out\nrecipes: [x/*.yaml]\"\n",  # a quoted scalar over two lines
    "base: &b [x/*.yaml]\nrecipes: *b\n",
    "---\nrecipes: [x/*.yaml]\n",
    "recipes: [x/*.yaml]\n  y/*.yaml\n",
    "r:\n- x\nrecipes: [y/*.yaml]\n",
    "recipes:\t[x/*.yaml]\n",
    "\ufeffrecipes: [x/*.yaml]\n",
]


def test_forms_it_does_not_know_are_left_to_yaml():
    for text in DECLINED:
        assert recipe_globs_in(text) is None, text


INVALID = "not YAML"


def _yaml_globs(text: str) -> list[str] | str | None:
    """What PyYAML reads as the recipe globs; None where that is not a list of strings."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return INVALID
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return None
    globs = data.get("recipes", list(DEFAULT_RECIPE_GLOBS))
    return globs if isinstance(globs, list) and all(isinstance(g, str) for g in globs) else None


KEYS = ["recipes", "output_dir", "defaults", "$schema", "recipes:x", '"recipes"', "? recipes", "<<", "- recipes"]
VALUES = ["", "[a/*.yaml]", "[a/*.yaml, 'b/*.yml']", '["x/*.yaml"]  # c', "out", "*.yaml", "[*.yaml]", "&a [x/*.yaml]",
          "*a", "|", ">-", "{a: 1}", "{a: 1,", "'q", '"q', "a #b", "a#b", "[a/*.yaml,]", "[]", "~", "null", "[1/*.yaml]",
          "[yes]", "[a/*.yaml] # c", "[a/*.yaml]#c", "!!str x", "[x.yaml, y.yml]", "[-a/*.yaml]", "[.5]", "[a: b]"]
INDENTED = ["  - a/*.yaml", "  - 'b/*.yaml'", "- c/*.yaml", "  x: 1", "    - d/*.yaml", "  # comment", "   more", "",
            "  - *.yaml", "  - [x]", "  - x.yaml # c", "- ~", "  -x.yaml", "  recipes: [z/*.yaml]", "x/*.yaml]", "#"]
OTHER = ["---", "...", "%YAML 1.1", "# recipes: [n/*.yaml]"]

LINE = st.one_of(st.builds(lambda k, v: f"{k}: {v}" if v else f"{k}:", st.sampled_from(KEYS), st.sampled_from(VALUES)),
                 st.sampled_from(INDENTED), st.sampled_from(OTHER))


@settings(max_examples=400, derandomize=True, deadline=None)
@given(st.lists(LINE, min_size=1, max_size=7))
def test_where_it_answers_it_answers_what_yaml_reads(lines):
    text = "\n".join(lines) + "\n"
    globs = recipe_globs_in(text)
    # A file YAML cannot parse never hashes as a lock file records (its build would have
    # failed), so the quick path cannot act on what this reader makes of it.
    assert globs is None or _yaml_globs(text) in (globs, INVALID), text
