"""Tests of tpubuild/review/ (a package, so that test modules of one name in two folders stay apart)."""
