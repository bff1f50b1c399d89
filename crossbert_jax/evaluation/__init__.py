"""Frozen evaluation: embedders, task readers, probes, retrieval, the MTEB wrapper."""
