"""Proof of where a published version came from: an in-toto statement with a SLSA
provenance predicate, and a signature over the version's files in the OpenSSF
model-signing format."""
