"""How fast a step could and does run: pre-flight compile (aot), roofline, HLO costs, the step and feed benchmarks."""
