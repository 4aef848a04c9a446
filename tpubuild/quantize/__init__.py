"""Post-training quantization: TF's quantizer, per-function quantization, representative
datasets, and the checks on what the quantizer did."""
