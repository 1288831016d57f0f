#!/usr/bin/env python3
"""Captures the PyTorch-oracle fixtures of shardproof.

    python python/capture.py --out target/oracle [--only SUBSTRING] [--skip-ops] [--skip-dist]

Writes OUT/ops/ (one graph + safetensors per operator case, and manifest.json) and OUT/dist/
(single-device and per-rank graphs of small distributed programs, with case files). See
python/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="target/oracle", help="output directory (default: target/oracle)")
    ap.add_argument("--only", help="capture only the cases whose name contains this")
    ap.add_argument("--skip-ops", action="store_true", help="do not capture the per-operator cases")
    ap.add_argument("--skip-dist", action="store_true", help="do not capture the distributed programs")
    a = ap.parse_args()

    warnings.filterwarnings("ignore")
    import torch

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    t0 = time.time()
    failed = 0
    if not a.skip_ops:
        from oracle.ops_capture import capture_ops

        m = capture_ops(a.out, a.only)
        failed += len(m["not_captured"])
    if not a.skip_dist:
        from oracle.dist_capture import capture_dist

        d = capture_dist(a.out, a.only)
        failed += len(d["not_captured"])
        # The programs of `shardproof check`'s captured-graph tests (OUT/check/).
        from oracle.check_cases import capture_check_cases

        c = capture_check_cases(a.out, a.only)
        failed += len(c["not_captured"])
    print(f"capture: done in {time.time() - t0:.1f}s -> {a.out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
