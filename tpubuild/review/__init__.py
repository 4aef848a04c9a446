"""Reviewing changes between two git revisions of a workspace: `tpubuild diff` and
`--changed-since` (TensorFlow-free). The entry points are in `review/diff.py`."""
