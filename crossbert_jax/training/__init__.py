"""Pretraining: masking, objectives, optimizer, mesh and sharding, the jitted step, checkpoints, metrics, FLOPs, the loop."""
