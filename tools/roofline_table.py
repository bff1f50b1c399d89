"""The roofline rows of `compile --out` reports as a markdown table (docs/scaling.md).

  python tools/roofline_table.py base_crossbert_1024_v5p.json ... > table.md
"""

import json
import sys

HEADER = ("| params | objective | L | slice | global batch | bound by | compute ms | memory ms | communication ms "
          "| step ms >= | MFU <= | collectives GB / chip / step |")


def row(path: str) -> str:
  r = json.load(open(path, encoding="utf-8"))
  b = r["roofline"]
  name = f"{r['topology']} ({r['num_devices']} chips)"
  return (
      f"| {r['params']['total'] / 1e6:.0f} M | {r['objective']} | {r['seq_len']} | {name} | {r['batch_size']} | "
      f"{b['bound_by']} | {1e3 * b['compute_s']:.1f} | {1e3 * b['memory_s']:.1f} | {1e3 * b['communication_s']:.1f} | "
      f"{1e3 * b['step_s_lower_bound']:.1f} | {100 * b['mfu_upper_bound']:.0f}% | "
      f"{r['traffic']['collective_bytes'] / 1e9:.2f} |")


if __name__ == "__main__":
  print(HEADER)
  print("|" + "---|" * (HEADER.count("|") - 1))
  for p in sys.argv[1:]:
    print(row(p))
