"""crossbert_jax: pretrain CrossBERT (and flat BERT) text encoders in JAX/Flax.

Layers, lowest first (a package imports only from packages above it in this list):
  core        errors, config schema
  data        sources, splits (per-host reads), tokenizer, shards, packing, pipeline, elastic, prepare,
              workers, throughput, built-in corpus
  model       layers, attention (+ chunked, kernels), encoder, reconstructor, models, inference
  evaluation  embedder, tasks, generic, probes, retrieval, runner, pooler, mteb  |  hf  mapping, files, convert
  training    masking, objectives, optimizer, sharding, step, checkpoint, metrics, flops, aot,
              lock, guard, preemption, resume, elastic, compile_cache, feed_bench, loop
  scaling     plan, runner, collect, fit, plots, report (sweeps over `training` runs)
The top-level modules are the commands: train, tokenizer, prepare, evaluate, pooler, export,
compile, bench, mteb_eval, sweep, report.
"""

__version__ = "0.1.0"
