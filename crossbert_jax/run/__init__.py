"""Keeping a run alive around the step: the trainer, checkpoints, resume, the workdir lease, preemption, metrics."""
