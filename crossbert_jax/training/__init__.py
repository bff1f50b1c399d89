"""What a step computes: masking, objectives, optimizer, mesh and sharding, the compiled program, FLOPs."""
