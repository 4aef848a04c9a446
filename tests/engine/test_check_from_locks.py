"""`build --check` from lock files alone (engine/lockcheck.py) and what makes it as fast as a
no-op build: lock files read without a YAML parser, code digests without parsing whole files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpubuild.engine import code
from tpubuild.engine.lockfile import lock_document, lock_text, read_lock, read_lock_keys

REPO = Path(__file__).resolve().parents[2]


def _modules() -> list[tuple[Path, str]]:
    found = []
    for path in sorted(code.PACKAGE_ROOT.rglob("*.py")):
        parts = path.relative_to(code.PACKAGE_ROOT).with_suffix("").parts
        found.append((path, ".".join(("tpubuild", *(parts[:-1] if parts[-1] == "__init__" else parts)))))
    return found


def test_import_statements_found_by_pattern_are_those_of_the_syntax_tree():
    # The fast scan must never miss an import (a stage's key would miss code it runs), and
    # finds no more than the syntax tree (no stage reruns for a module named in prose).
    modules = _modules()
    assert len(modules) > 100
    for path, name in modules:
        assert code._imports(path, name) == code._parsed_imports(path.read_bytes(), path, name), name


def test_the_scan_falls_back_to_the_syntax_tree_where_a_pattern_would_miss(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('x = 1; import tpubuild.a\nif x: import tpubuild.b\nfrom tpubuild.c import (d,  # e)\n f)\n'
                      'RUN = ["python", "-m", "tpubuild.g"]\n')
    assert code._imports(source, "tpubuild.m") == {"tpubuild.a", "tpubuild.b", "tpubuild.c",
                                                   "tpubuild.c.d", "tpubuild.c.f", "tpubuild.g"}


@pytest.mark.parametrize("lock", sorted((REPO / "recipes").glob("*.lock.yaml")), ids=lambda p: p.name)
def test_the_line_reader_reads_what_the_yaml_parser_reads(lock):
    fast, full = read_lock_keys(lock), read_lock(lock)
    assert fast is not None
    full.pop("artifact")
    assert fast.pop("artifact") == {}
    assert fast == full


def test_a_lock_file_of_another_layout_is_read_by_the_yaml_parser(tmp_path):
    document = lock_document("r", "d" * 64, {"python": "CPython 3.11"}, {"file:a b.py": "a" * 64},
                             [{"stage": "export", "key": "b" * 64, "output": "c" * 64,
                               "discovered": {"m/x.py": "absent", "dist:keras": "3.1"}}], 1)
    path = tmp_path / "r.lock.yaml"
    path.write_text(lock_text(document))
    written = read_lock_keys(path)
    assert written["stages"][0]["discovered"] == {"dist:keras": "3.1", "m/x.py": "absent"}
    assert written["inputs"] == {"file:a b.py": "a" * 64}
    # Hand-edited into flow style (still YAML): the same document through the YAML parser.
    path.write_text(lock_text(document).replace("toolchain:\n  python: \"CPython 3.11\"",
                                                 "toolchain: {python: CPython 3.11}"))
    edited = read_lock_keys(path)
    assert edited["toolchain"] == {"python": "CPython 3.11"}
    assert edited["stages"] == written["stages"]
