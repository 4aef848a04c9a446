"""Numerical verification shared by every target: comparing outputs, measuring latency,
and loading an artifact the way TF Serving does."""
