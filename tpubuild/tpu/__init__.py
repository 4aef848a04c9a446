"""TPU placement and the TPU runtime's rules: which functions go to the TPU, how their calls
are rewritten, what the runtime accepts, and the CPU twin that runs a TPU artifact on CPU."""
