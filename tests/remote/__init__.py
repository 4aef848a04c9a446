"""Tests of tpubuild/remote/ (a package, so that test modules of one name in two folders stay apart)."""
