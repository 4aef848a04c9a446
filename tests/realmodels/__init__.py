"""Real models (Keras applications, keras_hub, JAX, BERT behind tensorflow_text) built end to end: the slow tier's heaviest tests."""
