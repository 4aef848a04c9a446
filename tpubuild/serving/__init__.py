"""What TF Serving reads from a SavedModel besides the graph and the variables: the
warmup requests it replays at load (`assets.extra/`)."""
