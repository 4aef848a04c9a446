"""Model-changing rewrites after placement: bfloat16, IO shapes, batching (and its checks)."""
