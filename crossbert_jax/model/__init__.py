"""Flax modules (logical axis names only): layers, encoder, reconstructor, the objective heads, and inference."""
