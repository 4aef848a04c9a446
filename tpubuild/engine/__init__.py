"""The build engine: content hashes, stat cache, content-addressed store, stage keys,
worker processes, versioned outputs, lock files, and the doit task graph that ties
them together. The main process never imports TensorFlow; workers do."""
