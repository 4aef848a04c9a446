"""Names from a destination or a shared cache (tpubuild/fs/names.py): only what tpubuild
itself writes becomes a path or a version number."""

from __future__ import annotations

import pytest

from tpubuild.fs import clean_relative, inside, version_number


@pytest.mark.parametrize("name, number", [
    ("1", 1), ("0", 0), ("9223372036854775807", 2**63 - 1),
    ("9223372036854775808", None), ("9" * 255, None), ("²", None), ("012", None), ("+1", None),
    ("-1", None), (" 1", None), ("1 ", None), ("", None), ("1a", None), ("١", None),
])
def test_version_numbers_are_decimal_int64(name, number):
    assert version_number(name) == number


@pytest.mark.parametrize("name", ["a", "a/b.pb", "variables/variables.data-00000-of-00001", "toy/2/saved_model.pb"])
def test_clean_names_pass(name):
    assert clean_relative(name) == name


@pytest.mark.parametrize("name", [
    "", "/etc/passwd", "a/../b", "..", ".", "a/./b", "a//b", "a/", "toy/1//home/u/x", "a\\b", "a\nb",
    "x" * 256, None, 3, ["a"],
])
def test_unclean_names_are_refused(name):
    assert clean_relative(name) is None


def test_inside_takes_the_part_below_a_prefix_only_when_clean():
    assert inside("toy/2/a.pb", "toy/2") == "a.pb"
    assert inside("toy/2/../3/a.pb", "toy/2") is None
    assert inside("toy/20/a.pb", "toy/2") is None
    assert inside("toy/2", "toy/2") is None
