"""Tests of tpubuild/engine/ (a package, so that test modules of one name in two folders stay apart)."""
