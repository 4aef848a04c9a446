"""Loaded before any test module: TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, at its first
C++ log line, so it must be set before whichever test module imports TensorFlow first
(which depends on the order xdist hands modules to a worker). Tests that check what a
user sees run the CLI in a subprocess with TensorFlow's variables removed."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
