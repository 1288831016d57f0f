"""Writes a reference trace (with its perturbed runs) and a candidate trace of the example GPT
for one parallel configuration, optionally with a planted bug, for `shardproof trace compare`.

    python -m shardproof.trace.demo --config tp2-sp --bug sp_layernorm_unsynced --dtype bf16 --out DIR

writes DIR/ref (role reference, single device), DIR/ref/perturbed-0 ... (role perturbed) and
DIR/cand (role candidate, one process per rank on CPU with gloo). `--list` prints the bugs.
Exit status: 0 written, 2 bad usage (unknown configuration or bug, or a bug the configuration
cannot express), 1 a run failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from .collector import Perturbation, machine_epsilon
from .examples.bugs import BUGS, check_applies
from .examples.gpt import ModelSpec
from .examples.runner import TraceJob, launch, parse_config

DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp8": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn"}

CONFIGS_HELP = """configurations (dash-separated tokens):
  tpN dpN ppN cpN   parallel sizes (world size = tp*dp*pp*cp; 2 or 4 on this machine)
  vppN              virtual pipeline chunks per stage (needs pp > 1)
  mbN               microbatches per dp rank (default 1)
  sp                sequence parallelism (needs tp > 1)
  zero              ZeRO-1 optimizer (state partitioned over dp)
  recompute         recompute each MLP in backward
  moe               each MLP is a mixture of experts (a router and 2 experts, dense gates)
  e.g. tp2, tp2-sp, dp2, dp2-zero, tp2-sp-dp2-zero, pp2-mb2, pp2-vpp2-mb4, tp2-pp2, cp2, tp2-cp2, tp2-sp-cp2,
       tp2-recompute
"""


def bugs_help() -> str:
    """The bug table of --help and --list."""
    lines = ["bugs (--bug NAME; seed 002 Table 1 id, needs, example config, caught at):"]
    for bug in BUGS.values():
        lines.append(f"  {bug.name:22s} #{bug.table1:<2d} {bug.description}")
        lines.append(f"  {'':22s}     needs {bug.needs}; e.g. --config {bug.example_config} --dtype {bug.example_dtype}")
        lines.append(f"  {'':22s}     caught at: {bug.caught_at}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shardproof.trace.demo", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Trace the example GPT: a single-device reference (with perturbed runs) and a parallel "
                    "candidate, for `shardproof trace compare DIR/ref DIR/cand`.",
        epilog=CONFIGS_HELP + "\n" + bugs_help())
    parser.add_argument("--config", default="tp2", help="parallel configuration (see below); default tp2")
    parser.add_argument("--bug", default=None, help="planted bug (see below); default none: a correct run")
    parser.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp8 (emulated: bf16 with fp8 linears)")
    parser.add_argument("--out", help="output directory (replaced if it exists)")
    parser.add_argument("--perturbed", type=int, default=3, help="perturbed reference runs (default 3)")
    parser.add_argument("--rewrite", action="store_true", help="module-wise testing: rewrite every module's inputs")
    parser.add_argument("--seed", type=int, default=0, help="generator seed of parameters and data (default 0)")
    parser.add_argument("--list", action="store_true", help="print the bugs and exit")
    args = parser.parse_args(argv)
    if args.list:
        print(bugs_help())
        return 0
    if not args.out:
        parser.print_usage(sys.stderr)
        print("error: --out DIR is required", file=sys.stderr)
        return 2
    dtype = DTYPES.get(args.dtype)
    if dtype is None:
        print(f"error: unknown --dtype `{args.dtype}`; expected fp32, bf16 or fp8", file=sys.stderr)
        return 2
    try:
        run = parse_config(args.config, ModelSpec(), dtype, [args.bug] if args.bug else [])
    except ValueError as err:
        print(f"error: --config: {err}", file=sys.stderr)
        return 2
    run = type(run)(config=run.config, options=run.options, spec=run.spec, seed=args.seed)
    problem = check_applies(args.bug, run)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if run.config.world_size > 8:
        print(f"error: world size {run.config.world_size} is too large for this demo (at most 8)", file=sys.stderr)
        return 2
    if args.perturbed < 1:
        print("error: --perturbed must be at least 1 (the comparer derives tolerances from them)", file=sys.stderr)
        return 2
    shutil.rmtree(args.out, ignore_errors=True)
    ref_dir, cand_dir = os.path.join(args.out, "ref"), os.path.join(args.out, "cand")
    reference = run.reference()
    scale = machine_epsilon(dtype)
    started = time.monotonic()
    try:
        launch(reference, TraceJob(ref_dir, "reference", rewrite=args.rewrite, align_with=run.config))
        for k in range(args.perturbed):
            launch(reference, TraceJob(os.path.join(ref_dir, f"perturbed-{k}"), "perturbed", rewrite=args.rewrite,
                                       perturbation=Perturbation(seed=k + 1, relative_scale=scale),
                                       align_with=run.config))
        launch(run, TraceJob(cand_dir, "candidate", rewrite=args.rewrite))
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {ref_dir} (+{args.perturbed} perturbed) and {cand_dir}: config {args.config}, dtype {dtype}, "
          f"bug {args.bug or 'none'}{', rewrite' if args.rewrite else ''} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
