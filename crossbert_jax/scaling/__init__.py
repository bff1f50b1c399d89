"""Scaling sweeps: plan a ladder at equal FLOPs, run it, fit power laws, plot and report."""
