"""One module per CLI verb; each exports a click command named `command`.

`tpubuild.cli` imports a verb's module only when that verb runs (or --help lists it),
so no verb pays for another's imports. Command modules stay thin and TensorFlow-free
at import time: they parse arguments and call the core.
"""
