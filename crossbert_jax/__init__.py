"""crossbert_jax: pretrain CrossBERT (and flat BERT) text encoders in JAX/Flax.

Layers, lowest first (a package imports only from packages above it in this list):
  core        errors, config schema
  data        sources, tokenizer, pipeline, built-in corpus
  model       layers, encoder, reconstructor, models (build_model), inference
  evaluation  embedder, tasks, probes, retrieval, runner, mteb  |  hf  mapping, files, convert
  training    masking, objectives, optimizer, sharding, step, checkpoint, metrics, flops, loop
  scaling     plan, runner, collect, fit, plots, report (sweeps over `training` runs)
The top-level modules are the commands: train, tokenizer, evaluate, export, bench, mteb_eval, sweep, report.
"""

__version__ = "0.1.0"
