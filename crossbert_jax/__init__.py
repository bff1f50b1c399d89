"""crossbert_jax: pretrain CrossBERT (and flat BERT) text encoders in JAX/Flax.

Layers, lowest first (a package imports only from packages above it in this list):
  core        errors, config schema
  data        sources, splits (per-host reads), tokenizer (+ hf_tokenizer, special_ids), shards, packing,
              pipeline, elastic, prepare, workers, throughput, built-in corpus
  model       layers, attention (+ chunked, kernels), encoder, reconstructor, models, inference
  evaluation | hf  evaluation: embedder, tasks, generic, probes, retrieval, runner, columns, pooler, mteb, glue;
              hf: mapping, files, convert, import_config
  training    what a step computes: masking, objectives, optimizer, sharding, program (the train
              state, the jitted step and loss check), flops
  perf | run  perf: how fast a step could and does run (aot, roofline, hlo_costs, benchmark, feed_bench);
              run: what keeps a run alive around the step: trainer, recorder, checkpoint, resume, elastic,
              lock, preemption, environment, warm_start, fork, metrics, compile_cache, load, eval_models
  scaling     plan, runner, collect, fit, plots, report (sweeps over runs)
The top-level modules are the commands: train, tokenizer, prepare, evaluate, pooler, export,
compile, bench, mteb_eval, sweep, report.
"""

__version__ = "0.1.0"
