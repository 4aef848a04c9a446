"""Reading and rewriting SavedModels as protos: call graph, TPU placement, CPU twin, checks."""
