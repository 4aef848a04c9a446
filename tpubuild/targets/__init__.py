"""Serving targets besides the TPU SavedModel: one folder each, with `stage.py` (builds
the artifact), `verify_stage.py` (checks it) and the helpers only that target uses.
The registry is `tpubuild.pipeline.TARGET_PACKAGES`."""
