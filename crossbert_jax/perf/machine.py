"""This machine's measured compute and memory: a jitted float32 matmul's FLOP/s, a copy's bandwidth, and
the two as a roofline chip (`compile --chip=measured`; `bench`'s reference matmul)."""

import statistics
import time

import jax
import jax.numpy as jnp

from crossbert_jax.perf import roofline


def time_matmul(n: int, repeats: int) -> dict[str, float]:
  """Median/min seconds and TFLOP/s of a jitted float32 N x N @ N x N on the default device."""
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (n, n), jnp.float32)
  b = jax.random.normal(kb, (n, n), jnp.float32)
  matmul = jax.jit(jnp.matmul)
  jax.block_until_ready(matmul(a, b))
  jax.block_until_ready(matmul(a, b))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(matmul(a, b))
    times.append(time.perf_counter() - t0)
  med = statistics.median(times)
  return {
      "n": n, "flops": 2.0 * n ** 3, "median_s": med, "min_s": min(times), "tflops_median": 2.0 * n ** 3 / med / 1e12,
      "tflops_max": 2.0 * n ** 3 / min(times) / 1e12}


def copy_bandwidth(mib: int = 512, repeats: int = 5) -> float:
  """Bytes/s of the default device's memory: the best of `repeats` jitted x * 2 over a `mib` MiB
  float32 array (each element read once and written once)."""
  x = jnp.ones((mib * 2 ** 20 // 4,), jnp.float32)
  nbytes = x.nbytes
  double = jax.jit(lambda a: a * 2, donate_argnums=0)  # In place: no fresh output buffer to fault in.
  x = jax.block_until_ready(double(x))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    x = jax.block_until_ready(double(x))
    best = min(best, time.perf_counter() - t0)
  return 2 * nbytes / best


def measured_chip(matmul_size: int = 2048, repeats: int = 5) -> roofline.Chip:
  """This machine's default device as a roofline chip: its measured float32 matmul FLOP/s (best of
  `repeats`) and copy bandwidth; no chip-to-chip links."""
  matmul = time_matmul(matmul_size, repeats)
  device = jax.devices()[0]
  return roofline.custom_chip(f"{device.device_kind} (measured)", matmul["tflops_max"] * 1e12, copy_bandwidth())
