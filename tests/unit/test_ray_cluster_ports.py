"""The test Ray cluster's ports: Ray refuses to start when two of its components share one."""

from tests import ray_cluster


def test_no_component_port_falls_in_the_worker_block_or_repeats():
  for _ in range(200):  # CI's failure came from a 1-in-30 draw: many draws, each cheap.
    workers, ports = ray_cluster.cluster_ports()
    assert len(workers) == ray_cluster.WORKER_PORTS + 1 and workers.stop <= 65536
    assert len(set(ports.values())) == len(ports)
    assert not set(ports.values()) & set(workers)


def test_free_port_avoids_the_given_range():
  low = ray_cluster.free_port()
  block = range(low - 2000, low + 2000)  # Of the ~28,000 ephemeral ports: most draws land outside.
  for _ in range(20):
    assert ray_cluster.free_port(avoid=block) not in block
