"""A sweep (not part of the pytest suite: minutes): runs the demo driver on every correct
configuration and every planted bug and prints, from a Python estimate of the comparer's rule
(error / largest perturbation response, replicas bit-identical), the largest ratio of each
correct run and the first flagged tensor of each buggy run.

    python tests/trace/sweep.py [OUT_DIR] [--threshold 5] [--seeds 0,1]

It imports the installed package (`scripts/trace-tests` installs it), or the source tree with
PYTHONPATH=python. About 20 s per case on 2 idle cores; 32 cases.

This only estimates what `shardproof trace compare` will say; the comparer is the authority.
"""

import argparse
import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from shardproof.trace import demo  # noqa: E402
from shardproof.trace.examples.bugs import BUGS  # noqa: E402
from tracereader import read_trace, rel_error  # noqa: E402

PHASE = {"forward_input": 0, "forward_output": 0, "grad_output": 1, "grad_input": 1, "param_grad": 1,
         "main_grad": 2, "param_before_step": 2, "param_after_step": 2}
CORRECT = [("tp2", "fp32"), ("tp2", "bf16"), ("tp2-sp", "bf16"), ("dp2", "bf16"), ("dp2-zero", "bf16"),
           ("pp2-mb2", "bf16"), ("tp2-pp2", "bf16"), ("cp2", "bf16"), ("tp2-cp2", "bf16"), ("tp2-sp-cp2", "bf16"),
           ("tp2-sp-dp2-zero", "bf16"), ("tp2-recompute", "bf16"), ("tp2", "fp8"), ("tp2-sp", "bf16", "--rewrite"),
           ("pp2-vpp2-mb4", "bf16"), ("pp2-dp2-zero", "bf16"), ("tp2-sp-moe", "bf16"), ("tp2-sp", "fp8")]


def ratios(out):
    ref, cand = read_trace(os.path.join(out, "ref")), read_trace(os.path.join(out, "cand"))
    perturbed = [read_trace(p) for p in sorted(glob.glob(os.path.join(out, "ref", "perturbed-*")))]
    rows = []
    for key in sorted(ref, key=lambda k: (PHASE[k.split("/")[2]], ref[k].first_seq)):
        error = rel_error(cand[key].value, ref[key].value)
        tolerance = max(rel_error(p[key].value, ref[key].value) for p in perturbed)
        ratio = 0.0 if error == 0 else error / tolerance if tolerance > 0 else float("inf")
        rows.append((key, ratio, cand[key].replica_diff))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", default="/tmp/shardproof-trace-sweep")
    parser.add_argument("--threshold", type=float, default=5.0)
    parser.add_argument("--seeds", default="0", help="comma-separated generator seeds of the correct runs")
    args = parser.parse_args()
    cases = [(c[0], c[1], None, list(c[2:]) + ["--seed", seed]) for seed in args.seeds.split(",") for c in CORRECT]
    cases += [(b.example_config, b.example_dtype, b.name, []) for b in BUGS.values()]
    for config, dtype, bug, extra in cases:
        out = os.path.join(args.out, "-".join([config, dtype, bug or "ok", *[e.strip("-") for e in extra]]))
        started = time.monotonic()
        code = demo.main(["--config", config, "--dtype", dtype, "--out", out, *extra, *(["--bug", bug] if bug else [])])
        if code != 0:
            print(f"{config:16s} {dtype:5s} {bug or 'correct':22s} demo exit {code}", flush=True)
            continue
        rows = ratios(out)
        took = time.monotonic() - started
        if bug is None:
            worst = max(rows, key=lambda r: r[1])
            replicas = max(r[2] for r in rows)
            label = " ".join(["correct", *[e.strip("-") for e in extra]])
            print(f"{config:16s} {dtype:5s} {label:22s} max ratio {worst[1]:6.2f} "
                  f"({worst[0]}), max replica diff {replicas:.1e}  [{took:.0f} s]", flush=True)
        else:
            first = next((r for r in rows if r[1] > args.threshold or r[2] > 0), None)
            what = "NOT FLAGGED" if first is None else f"first {first[0]} ratio {first[1]:.1f} replica diff {first[2]:.1e}"
            print(f"{config:16s} {dtype:5s} {bug:22s} {what}  [{took:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
