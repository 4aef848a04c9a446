"""Stages: one module per stage, each with `run(input_dir, output_dir, options, context)`.

Stage modules import TensorFlow; nothing outside `stages/` and `savedmodel/` may import
them at planning time. The registry that planning uses is `tpubuild.pipeline`.
"""
