"""tpubuild: declarative, incremental builds of TPU-ready TensorFlow SavedModels."""

__version__ = "0.1.0"
