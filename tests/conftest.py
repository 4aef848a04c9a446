"""Loaded before any test module: TensorFlow's own log lines stay out of the suite's log.

What a `tpubuild` command does for its user unless --debug (tpubuild/quiet.py) is done here
for the test processes, before whichever test module imports TensorFlow first (which depends
on the order xdist hands modules to a worker): TF_CPP_MIN_LOG_LEVEL=3 and tpubuild's quiet
flag go into the environment, read by this process and inherited by every subprocess a test
starts (the CLI, build workers, Ray and probe scripts), and this process's first
`import tensorflow` runs with file descriptor 2 captured, since the lines TensorFlow's
libraries log while they load ("oneDNN custom operations are on", "Could not find cuda
drivers", absl's "All log messages before absl::InitializeLog()") ignore that variable.

Users get what they got: the CLI quiets itself the same way, and tests that check what a user
sees run it with these variables removed (tests/convert/test_batch_quiet_cli.py).
"""

from tpubuild.quiet import quiet_tensorflow

quiet_tensorflow()
