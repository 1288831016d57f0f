//! `shardproof run`: numerical differential check of a distributed program against its spec.
//!
//! Seeded random spec inputs are laid out on the ranks by the case's placements (slices for
//! Shard, copies for Replicate, a random split for Partial); the spec and every rank run in the
//! reference interpreter; each expected output is compared piece by piece, rank by rank.

mod convert;

use crate::output::{self, OutputArgs};
use crate::Verdict;
use clap::Args as ClapArgs;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use shardproof_case::{rank_pieces, Case, Expr, Layout, RankPiece, Reduce};
use shardproof_interp::{
    infer_graph, live_values, run_graph, run_program, storage_bytes, Env, InterpErrorKind,
    Precision, RunConfig,
};
use shardproof_ir::{DType, Graph, NodeKind, ValueId};
use shardproof_ops::{strides, Meta, OpClass, Registry, Tensor};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

/// The relative error an f64 run tolerates (the reference precision: rounding only).
const F64_TOLERANCE: f64 = 1e-9;

/// Perturbed reruns of the spec that set a bf16 run's tolerances (seed 002 section 4.5): a
/// fixed bound is wrong both ways in bf16 (a deep model's rounding exceeds it, a bug below it
/// passes), so each output gets the response of the spec to inputs perturbed at bf16's machine
/// epsilon, with the tolerance model `trace compare` uses.
const BF16_PERTURBED_RUNS: u64 = 2;

/// Arguments of `shardproof run`.
#[derive(ClapArgs)]
pub struct RunArgs {
    /// The case file.
    case: PathBuf,
    /// Seed of the random inputs (and of random operators).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Precision of the run: f64 is the exact reference.
    #[arg(long, default_value = "f64", value_parser = ["f64", "f32", "bf16"])]
    dtype: String,
    /// Refuse cases whose tensors need more memory than this (e.g. 8GB, 512MB).
    #[arg(long, default_value = "8GB", value_parser = parse_bytes)]
    max_memory: u64,
    #[command(flatten)]
    output: OutputArgs,
    /// Show no progress on stderr (a spinner on a terminal, else a line every 5 seconds;
    /// SHARDPROOF_PROGRESS_SECONDS sets the interval).
    #[arg(long)]
    quiet: bool,
    /// Stop the run after this many seconds (0: no limit): the verdict is then inconclusive,
    /// naming the node it had reached.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0, value_parser = crate::watch::parse_seconds)]
    time_limit: f64,
}

impl RunArgs {
    /// The defaults of the command line for `case`.
    pub fn new(case: PathBuf) -> Self {
        RunArgs {
            case,
            seed: 0,
            dtype: "f64".into(),
            max_memory: 8 << 30,
            output: OutputArgs::default(),
            quiet: true,
            time_limit: 0.0,
        }
    }
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_uppercase();
    let (num, mult) = [
        ("GB", 1u64 << 30),
        ("G", 1 << 30),
        ("MB", 1 << 20),
        ("M", 1 << 20),
        ("KB", 1 << 10),
        ("K", 1 << 10),
        ("B", 1),
    ]
    .iter()
    .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n.trim().to_string(), *m)))
    .unwrap_or((t.clone(), 1));
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size; write e.g. 8GB, 512MB or a number of bytes"))?;
    if v.is_nan() || v < 0.0 {
        return Err(format!("`{s}` is not a size"));
    }
    Ok((v * mult as f64) as u64)
}

/// The comparison of one output.
#[derive(Serialize, Clone)]
struct OutputResult {
    name: String,
    placement: Option<String>,
    rel_error: Option<f64>,
    matched: bool,
    note: Option<String>,
    /// The output's own tolerance, when it has one (perturbation tolerances, bf16).
    #[serde(skip_serializing_if = "Option::is_none")]
    tolerance: Option<f64>,
}

#[derive(Serialize)]
struct RunReport {
    case: String,
    ranks: usize,
    seed: u64,
    dtype: String,
    /// The fixed tolerance, or under perturbation tolerances the largest output's.
    tolerance: f64,
    /// How many perturbed spec runs set the tolerances (absent: the fixed `tolerance`).
    #[serde(skip_serializing_if = "Option::is_none")]
    perturbed_runs: Option<u64>,
    verdict: &'static str,
    outputs: Vec<OutputResult>,
    first_mismatch: Option<String>,
    message: Option<String>,
}

/// Why a run could not produce a verdict on the numbers.
struct Stop {
    verdict: Verdict,
    message: String,
}

fn stop(verdict: Verdict, message: impl Into<String>) -> Stop {
    Stop {
        verdict,
        message: message.into(),
    }
}

/// Runs the command and returns its verdict.
pub fn main(args: &RunArgs) -> Verdict {
    let (precision, tolerance) = match args.dtype.as_str() {
        "f32" => (Precision::F32, Tolerances::Fixed(1e-5)),
        "bf16" => (
            Precision::Bf16,
            Tolerances::Perturbation {
                runs: BF16_PERTURBED_RUNS,
            },
        ),
        _ => (Precision::F64, Tolerances::Fixed(F64_TOLERANCE)),
    };
    let mut report = RunReport {
        case: args.case.display().to_string(),
        ranks: 0,
        seed: args.seed,
        dtype: args.dtype.clone(),
        tolerance: match tolerance {
            Tolerances::Fixed(t) => t,
            Tolerances::Perturbation { .. } => 0.0,
        },
        perturbed_runs: match tolerance {
            Tolerances::Fixed(_) => None,
            Tolerances::Perturbation { runs } => Some(runs),
        },
        verdict: "invalid",
        outputs: Vec::new(),
        first_mismatch: None,
        message: None,
    };
    let started = std::time::Instant::now();
    let mut loaded = None;
    // The `--html` file is opened first: a path that cannot be written is refused at once.
    let (html, executed) = match args.output.prepare() {
        Ok(html) => (
            html,
            execute(args, precision, tolerance, &mut report, &mut loaded),
        ),
        Err(message) => (None, Err(stop(Verdict::Invalid, message))),
    };
    let verdict = match executed {
        Ok(v) => v,
        Err(s) => {
            report.message = Some(s.message.clone());
            if !args.output.json() {
                errln!("{}", s.message);
            }
            s.verdict
        }
    };
    report.verdict = match verdict {
        Verdict::Holds => "holds",
        Verdict::Violated => "violated",
        Verdict::Invalid => "invalid",
        Verdict::Inconclusive => "inconclusive",
    };
    let mut converted = convert::report(&report, args, verdict, loaded.as_ref());
    converted.seconds = Some(started.elapsed().as_secs_f64());
    let print = || {
        if args.output.json() {
            outln!(
                "{}",
                serde_json::to_string_pretty(&report).expect("report serializes")
            );
        } else if verdict != Verdict::Invalid {
            // Invalid input has no verdict to report: the error on stderr is the whole answer,
            // so a script reading stdout never sees a header for a run that did not happen.
            print_text(&report, verdict);
        }
    };
    // A page that could not be written after all (the disk filled up): an invalid run.
    let unwritten = |message: &str| {
        let r = output::report(
            shardproof_report::Command::Run,
            &report.case,
            &args.case,
            Verdict::Invalid,
            message,
        );
        let json = || crate::print_invalid_json(Some(&report.case), message);
        output::invalid(&args.output, None, &r, json, true)
    };
    output::finish(&args.output, html, &converted, print, unwritten, verdict)
}

/// How outputs are judged.
#[derive(Clone, Copy, Debug)]
enum Tolerances {
    /// One relative error bound for every output.
    Fixed(f64),
    /// Each output's response to `runs` perturbed reruns of the spec.
    Perturbation {
        /// Perturbed reruns.
        runs: u64,
    },
}

/// Runs the case of `args`, filling `report`; `loaded` keeps the case once it is read, for the
/// locations of the report's findings.
fn execute(
    args: &RunArgs,
    precision: Precision,
    tolerance: Tolerances,
    report: &mut RunReport,
    loaded: &mut Option<Case>,
) -> Result<Verdict, Stop> {
    let case = shardproof_case::load_case(&args.case)
        .and_then(|c| {
            c.validate_ops(&|op| Registry::builtin().get(op).is_some())?;
            Ok(c)
        })
        .map_err(|e| stop(Verdict::Invalid, format!("error: {e}")))?;
    let case = &*loaded.insert(case);
    report.case = case.name.clone();
    report.ranks = case.program.ranks.len();
    let results = run_watched(args, case, precision, tolerance)?;
    if results.is_empty() {
        return Err(stop(
            Verdict::Inconclusive,
            "inconclusive: there is nothing to compare: the spec returns no tensor and the case sets no `outputs:`\n  hint: name the tensors to check under `outputs:`",
        ));
    }
    report.first_mismatch = results.iter().find(|r| !r.matched).map(|r| r.name.clone());
    if let Some(largest) = results.iter().filter_map(|r| r.tolerance).reduce(f64::max) {
        report.tolerance = largest;
    }
    report.outputs = results;
    Ok(if report.first_mismatch.is_some() {
        Verdict::Violated
    } else {
        Verdict::Holds
    })
}

/// Runs `case` and compares its outputs on a thread of its own, showing how many nodes have
/// run and stopping at `--time-limit` (see [`crate::watch`]).
fn run_watched(
    args: &RunArgs,
    case: &Case,
    precision: Precision,
    tolerance: Tolerances,
) -> Result<Vec<OutputResult>, Stop> {
    let progress = Arc::new(shardproof_ir::Progress::default());
    let counted = progress.clone();
    let owned = case.clone();
    let (seed, max_memory) = (args.seed, args.max_memory);
    let work = move || {
        let (spec_env, rank_envs, spec_leaves) =
            run_case(&owned, precision, seed, max_memory, Some(counted))?;
        let tolerances = match tolerance {
            Tolerances::Fixed(t) => Judged::Fixed(t),
            Tolerances::Perturbation { runs } => Judged::PerOutput(perturbation_tolerances(
                &owned,
                precision,
                shardproof_trace::RunDtype::Bfloat16,
                seed,
                &spec_env,
                &spec_leaves,
                runs,
            )?),
        };
        compare_outputs(&owned, &spec_env, &rank_envs, &tolerances)
    };
    let watched = crate::watch::watch_shown(
        work,
        progress,
        crate::watch::Shown {
            visible: !args.quiet && args.output.text(),
            prefix: format!("run {}: ", case.name),
            units: "nodes",
            preparing: "preparing the programs",
            limit: args.time_limit,
        },
    );
    match watched {
        crate::watch::Watched::Done(results) => results,
        crate::watch::Watched::TimedOut(stopped) => Err(stop(
            Verdict::Inconclusive,
            format!(
                "inconclusive: the run did not finish within the time limit ({} s; --time-limit): {}\n  hint: a longer --time-limit, or a smaller case (`zoo emit` sizes)",
                stopped.limit,
                stopped.at("node")
            ),
        )),
        crate::watch::Watched::Lost => Err(stop(
            Verdict::Inconclusive,
            "inconclusive: the run stopped without a result (its thread ended early)",
        )),
    }
}

/// Lays out seeded random inputs and runs the spec and every rank of `case`; checks memory
/// first and that no random operator ran without a seed. `progress`, when given, counts every
/// node of the spec and of every rank.
fn run_case(
    case: &Case,
    precision: Precision,
    seed: u64,
    max_memory: u64,
    progress: Option<Arc<shardproof_ir::Progress>>,
) -> Result<(Env, Vec<Env>, Leaves), Stop> {
    let spec_metas = prepare_run(case, max_memory)?;
    run_prepared(case, &spec_metas, precision, seed, progress)
}

/// What a run needs whatever its seed: the spec's shapes, once the case is known to fit
/// `max_memory` and to type-check (an error: the run's verdict). A search over several seeds
/// asks this once.
fn prepare_run(case: &Case, max_memory: u64) -> Result<Vec<Vec<Option<Meta>>>, Stop> {
    // The memory estimate comes first, from the shapes inference gives (an ill-typed program
    // leaves some unknown, which only lowers the estimate): a case over budget is refused in
    // a moment, before the ranks are type-checked. Ranks with equal graphs share one inference.
    let spec_metas = infer_graph(&case.spec, &case.ops).metas;
    check_memory(case, &spec_metas, max_memory)?;
    // A program that does not type-check gets no run; empty and overflowing tensors are
    // refused here, before anything is allocated.
    crate::preflight::typecheck_all(case).map_err(|p| stop(p.verdict, p.message))?;
    Ok(spec_metas)
}

/// [`run_case`] past [`prepare_run`], whose shapes `spec_metas` are.
fn run_prepared(
    case: &Case,
    spec_metas: &[Vec<Option<Meta>>],
    precision: Precision,
    seed: u64,
    progress: Option<Arc<shardproof_ir::Progress>>,
) -> Result<(Env, Vec<Env>, Leaves), Stop> {
    let (spec_leaves, rank_leaves) = make_inputs(case, spec_metas, seed)?;
    let cfg = RunConfig {
        precision,
        seed,
        custom_ops: case.ops.clone(),
        progress: progress.clone(),
    };
    if let Some(p) = &progress {
        let nodes = case.spec.nodes.len()
            + case
                .program
                .ranks
                .iter()
                .map(|g| g.nodes.len())
                .sum::<usize>();
        p.start(nodes);
    }
    let interp_stop = |e: shardproof_interp::InterpError, which: &str| {
        match e.kind {
            InterpErrorKind::Invalid => stop(Verdict::Invalid, format!("error: {which}: {}", e.message)),
            InterpErrorKind::Unsupported => stop(
                Verdict::Inconclusive,
                format!(
                    "inconclusive: {which}: {}\n  hint: give the operator a meaning in the case's `ops:` section (`identity`, or a decomposition into known operators)",
                    e.message
                ),
            ),
            InterpErrorKind::Deadlock => stop(Verdict::Violated, format!("violated: {which}: {}", e.message)),
        }
    };
    let spec_env = run_graph(&case.spec, &spec_leaves, &cfg).map_err(|e| interp_stop(e, "spec"))?;
    let rank_envs = run_program(&case.program, &rank_leaves, &cfg)
        .map_err(|e| interp_stop(e, "implementation"))?;
    check_random(&case.spec, &spec_env, "spec")?;
    for (r, (g, env)) in case.program.ranks.iter().zip(&rank_envs).enumerate() {
        check_random(g, env, &format!("rank {r}"))?;
    }
    Ok((spec_env, rank_envs, spec_leaves))
}

/// The seeds a counterexample search tries, in order: `run`'s default seed first, so a
/// counterexample `run` would show by default is the one reported.
pub const SEARCH_SEEDS: [u64; 3] = [0, 1, 2];

/// A concrete input on which the ranks miss the spec.
#[derive(Clone, Debug, Serialize)]
pub struct Counterexample {
    /// The seed of the random inputs: `run --seed SEED` reproduces it.
    pub seed: u64,
    /// The expected output the ranks miss.
    pub output: String,
    /// Its relative Frobenius error; `None` when the ranks' tensors do not even fit its
    /// placement.
    pub rel_error: Option<f64>,
    /// Why the ranks' tensors do not fit, when they do not (an `expr:` they cannot be
    /// evaluated into).
    #[serde(skip)]
    pub misfit: Option<String>,
}

/// What a counterexample search over [`SEARCH_SEEDS`] found (f64, `run`'s memory budget).
pub enum Search {
    /// A seed on which an expected output differs from the spec.
    Counterexample(Counterexample),
    /// The ranks cannot complete their communication (`run`'s deadlock report).
    Hang(String),
    /// Every seed matches every output.
    Agrees,
    /// The run cannot decide: the case is too large, invalid, or uses an operator without a
    /// meaning. The verdict `run` itself would give, and its first line.
    Undecided(Verdict, String),
}

/// Runs `case` on every seed of [`SEARCH_SEEDS`] until one shows an output that misses its
/// expectation.
pub fn search_counterexample(case: &Case) -> Search {
    let defaults = RunArgs::new(case.file.clone());
    // The memory estimate and the type check do not depend on the seed: asked once, they give
    // every seed's run the answer its own would (about a third of the search at 80 layers).
    let prepared = prepare_run(case, defaults.max_memory);
    for seed in SEARCH_SEEDS {
        let run = match &prepared {
            Ok(spec_metas) => run_prepared(case, spec_metas, Precision::F64, seed, None),
            Err(s) => Err(stop(s.verdict, s.message.clone())),
        };
        let results = run.and_then(|(spec_env, rank_envs, _)| {
            compare_outputs(case, &spec_env, &rank_envs, &Judged::Fixed(F64_TOLERANCE))
        });
        let results = match results {
            Ok(r) => r,
            Err(s) if s.verdict == Verdict::Violated => return Search::Hang(s.message),
            Err(s) => return Search::Undecided(s.verdict, s.message),
        };
        if let Some(r) = results.into_iter().find(|r| !r.matched) {
            let misfit = r.rel_error.is_none().then(|| {
                r.note.unwrap_or_else(|| {
                    "the ranks' tensors do not fit the expected placement".into()
                })
            });
            return Search::Counterexample(Counterexample {
                seed,
                output: r.name,
                rel_error: r.rel_error,
                misfit,
            });
        }
    }
    Search::Agrees
}

/// The names a run gives values to: laid-out spec tensors (or their impl names) and constants.
fn leaf_names(graph: &Graph, laid_out: impl Iterator<Item = String>) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = laid_out.collect();
    for node in &graph.nodes {
        if let NodeKind::Constant { .. } = node.kind {
            names.insert(node.outputs[0].name.clone());
        }
    }
    names
}

/// Refuses cases whose computed tensors (stored as f64 by the interpreter) exceed the budget.
/// Ranks with equal graphs and the same given inputs need the same bytes: each distinct rank
/// program is inferred and counted once (the zoo's presets give thousands of ranks a few).
fn check_memory(case: &Case, spec: &[Vec<Option<Meta>>], budget: u64) -> Result<(), Stop> {
    // Checked sums: a shape whose byte size overflows is over any budget (`None`).
    let bytes = |graph: &Graph, names: BTreeSet<String>, metas: &[Vec<Option<Meta>>]| {
        let live = live_values(graph, &names);
        storage_bytes(metas, Some(&live))
    };
    let spec_names = leaf_names(&case.spec, case.inputs.iter().map(|r| r.spec_name.clone()));
    let spec_bytes = bytes(&case.spec, spec_names, spec);
    let first = shardproof_interp::first_equal(&case.program.ranks);
    let mut counted: BTreeMap<(usize, BTreeSet<String>), Option<u64>> = BTreeMap::new();
    let mut metas_of: BTreeMap<usize, Vec<Vec<Option<Meta>>>> = BTreeMap::new();
    let rank_bytes = case
        .program
        .ranks
        .iter()
        .enumerate()
        .map(|(r, g)| {
            let names = leaf_names(
                g,
                case.inputs.iter().filter_map(|rel| {
                    rel.rank_values
                        .iter()
                        .find(|&&(holder, _)| holder == r)
                        .map(|&(_, v)| g.value_name(v).to_string())
                }),
            );
            let key = (first[r], names);
            if let Some(&b) = counted.get(&key) {
                return b;
            }
            let metas = metas_of
                .entry(first[r])
                .or_insert_with(|| infer_graph(g, &case.ops).metas);
            let b = bytes(g, key.1.clone(), metas);
            counted.insert(key, b);
            b
        })
        .try_fold(0u64, |acc, b| acc.checked_add(b?));
    let (Some(spec_bytes), Some(rank_bytes), Some(total)) = (
        spec_bytes,
        rank_bytes,
        spec_bytes
            .zip(rank_bytes)
            .and_then(|(a, b)| a.checked_add(b)),
    ) else {
        return Err(stop(
            Verdict::Inconclusive,
            format!(
                "inconclusive: the case's tensors need more than 2^64 bytes, over the memory budget of {}\n  hint: capture the programs at smaller sizes (fewer layers, smaller batch, sequence or vocabulary)",
                human(budget)
            ),
        ));
    };
    if total > budget {
        return Err(stop(
            Verdict::Inconclusive,
            format!(
                "inconclusive: the case needs about {} of tensors (spec {}, ranks {}), over the memory budget of {}\n  hint: raise --max-memory, or capture the programs at smaller sizes (fewer layers, smaller batch, sequence or vocabulary)",
                human(total),
                human(spec_bytes),
                human(rank_bytes),
                human(budget)
            ),
        ));
    }
    Ok(())
}

fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.1} GB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MB", b / (1u64 << 20) as f64)
    } else {
        format!("{bytes} bytes")
    }
}

/// A random generator for one named thing, stable across platforms.
fn rng_for(seed: u64, key: &str) -> ChaCha8Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed.rotate_left(17);
    for b in key.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    ChaCha8Rng::seed_from_u64(h)
}

/// Random data for a tensor: floats uniform in [-1, 1), integers uniform in [0, bound), bools
/// fair coins.
fn random_tensor(meta: &Meta, bound: i64, rng: &mut ChaCha8Rng) -> Tensor {
    let n = meta.numel();
    let data = match meta.dtype {
        DType::Bool => (0..n).map(|_| rng.random_range(0..2) as f64).collect(),
        d if d.is_int() => (0..n)
            .map(|_| rng.random_range(0..bound.max(1)) as f64)
            .collect(),
        _ => (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
    };
    Tensor::new(meta.clone(), data)
}

/// Copies the blocks a rank holds out of a spec tensor (concatenated along `piece.dim`).
fn extract(spec: &Tensor, piece: &RankPiece, dtype: DType) -> Tensor {
    let shape: Vec<usize> = piece.local_shape().iter().map(|&d| d as usize).collect();
    let mut out = vec![0.0; shape.iter().product()];
    let out_strides = strides(&shape);
    let spec_strides = strides(spec.shape());
    let mut offset = 0usize;
    for block in &piece.blocks {
        let bshape: Vec<usize> = block.iter().map(|r| (r.end - r.start) as usize).collect();
        let n: usize = bshape.iter().product();
        let mut idx = vec![0usize; bshape.len()];
        for _ in 0..n {
            let mut src = 0;
            let mut dst = 0;
            for d in 0..bshape.len() {
                src += (block[d].start as usize + idx[d]) * spec_strides[d];
                let local = if d == piece.dim {
                    idx[d] + offset
                } else {
                    idx[d]
                };
                dst += local * out_strides[d];
            }
            out[dst] = spec.data[src];
            for d in (0..bshape.len()).rev() {
                idx[d] += 1;
                if idx[d] < bshape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        if let Some(r) = block.get(piece.dim) {
            offset += (r.end - r.start) as usize;
        }
    }
    Tensor::new(Meta::new(dtype, shape), out)
}

/// This rank's share of a partial value: the group's shares reduce (sum, avg, max, min) to
/// `local`. Every member draws the same random shares from a generator keyed by the group, so
/// the shares are consistent across ranks.
fn partial_share(
    local: &Tensor,
    reduce: Reduce,
    index: usize,
    members: usize,
    mut rng: ChaCha8Rng,
) -> Tensor {
    let k = members.max(1);
    let n = local.numel();
    let is_int = !local.dtype().is_float();
    let mut noise: Vec<Vec<f64>> = (0..k)
        .map(|_| {
            (0..n)
                .map(|_| {
                    if is_int {
                        rng.random_range(-4i64..5) as f64
                    } else {
                        rng.random_range(-1.0..1.0)
                    }
                })
                .collect()
        })
        .collect();
    let data: Vec<f64> = match reduce {
        Reduce::Sum => (0..n)
            .map(|e| {
                if index + 1 < k {
                    noise[index][e]
                } else {
                    local.data[e] - (0..k - 1).map(|i| noise[i][e]).sum::<f64>()
                }
            })
            .collect(),
        Reduce::Avg => {
            // local + noise_i, with the noise summing to zero over the group.
            let (first, last) = noise.split_at_mut(k - 1);
            for (e, slot) in last[0].iter_mut().enumerate() {
                *slot = -first.iter().map(|row| row[e]).sum::<f64>();
            }
            (0..n).map(|e| local.data[e] + noise[index][e]).collect()
        }
        Reduce::Max | Reduce::Min => (0..n)
            .map(|e| {
                // One member, chosen per element, holds the value; the others hold less (more).
                let owner = ((noise[0][e].abs() * 1e6) as usize) % k;
                let d = noise[index][e].abs() + 0.5;
                match (index == owner, reduce) {
                    (true, _) => local.data[e],
                    (false, Reduce::Max) => local.data[e] - d,
                    _ => local.data[e] + d,
                }
            })
            .collect(),
    };
    Tensor::new(local.meta.clone(), data)
}

type Leaves = BTreeMap<String, Tensor>;

/// Seeded random spec inputs and, from them, every rank's inputs by the case's layouts; plus
/// values for module constants (random, keyed by name, so equal names get equal values).
fn make_inputs(
    case: &Case,
    spec_metas: &[Vec<Option<Meta>>],
    seed: u64,
) -> Result<(Leaves, Vec<Leaves>), Stop> {
    let mesh = &case.program.mesh;
    let mut spec_leaves = Leaves::new();
    let mut rank_leaves = vec![Leaves::new(); case.program.ranks.len()];
    for rel in &case.inputs {
        if let Layout::Expr(_) = rel.layout {
            return Err(stop(
                Verdict::Inconclusive,
                format!(
                    "inconclusive: `{}` is laid out by an `expr:`; `run` builds rank inputs only from placements\n  hint: write its layout as a placement (with blocks/replicas if fused)",
                    rel.spec_name
                ),
            ));
        }
        let v = rel.spec_value;
        let meta = spec_metas[v.node][v.output].clone().ok_or_else(|| {
            stop(
                Verdict::Invalid,
                format!(
                    "error: the shape of spec tensor `{}` is unknown (symbolic or not inferable)",
                    rel.spec_name
                ),
            )
        })?;
        // Only integer data needs a bound, and finding it walks the graph's consumers: asking
        // for every input made inputs of a many-layer model quadratic in its layers.
        let bound = if meta.dtype.is_int() {
            shardproof_interp::index_bound(&case.spec, v, spec_metas)
        } else {
            i64::MAX
        };
        let value = random_tensor(
            &meta,
            bound,
            &mut rng_for(seed, &format!("input/{}", rel.spec_name)),
        );
        let shape: Vec<i64> = meta.shape.iter().map(|&d| d as i64).collect();
        // Only the ranks that hold the tensor get a piece (all of them unless `at:` says).
        for &(r, iv) in &rel.rank_values {
            let piece = rank_pieces(&rel.layout, &shape, mesh, r)
                .map_err(|e| stop(Verdict::Invalid, format!("error: `{}`: {e}", rel.spec_name)))?;
            let graph = &case.program.ranks[r];
            let leaves = &mut rank_leaves[r];
            let dtype = graph.recorded_type(iv).map_or(meta.dtype, |t| t.dtype);
            let mut local = extract(&value, &piece, dtype);
            if let Some(share) = &piece.partial {
                let rng = rng_for(
                    seed,
                    &format!("partial/{}/{:?}", rel.spec_name, share.group),
                );
                local = partial_share(&local, share.reduce, share.index, share.group.len(), rng);
            }
            leaves.insert(graph.value_name(iv).to_string(), local);
        }
        spec_leaves.insert(rel.spec_name.clone(), value);
    }
    add_constants(
        &case.spec,
        spec_metas,
        &case.constants,
        seed,
        &mut spec_leaves,
    );
    // Only a program with module constants needs its shapes here (inferring every rank's
    // program for each seed was a tenth of the counterexample search at 80 layers).
    let has_constants = |g: &Graph| {
        g.nodes
            .iter()
            .any(|n| matches!(n.kind, NodeKind::Constant { .. }))
    };
    for (g, leaves) in case.program.ranks.iter().zip(rank_leaves.iter_mut()) {
        if has_constants(g) {
            let metas = infer_graph(g, &case.ops).metas;
            add_constants(g, &metas, &case.constants, seed, leaves);
        }
    }
    Ok((spec_leaves, rank_leaves))
}

/// Module constants: the value the case states or the captured source line assigns (for a
/// 0-d constant), else seeded random values keyed by the attribute name.
fn add_constants(
    graph: &Graph,
    metas: &[Vec<Option<Meta>>],
    stated: &std::collections::BTreeMap<String, f64>,
    seed: u64,
    leaves: &mut Leaves,
) {
    for (i, node) in graph.nodes.iter().enumerate() {
        if let NodeKind::Constant { attr } = &node.kind {
            if leaves.contains_key(&node.outputs[0].name) {
                continue;
            }
            if let Some(meta) = &metas[i][0] {
                let known = stated.get(attr).copied().or_else(|| {
                    node.loc
                        .as_ref()
                        .filter(|_| meta.shape.is_empty())
                        .and_then(|l| l.assigned_literal())
                });
                if let Some(v) = known {
                    let t = shardproof_ops::Tensor::full(meta.dtype, meta.shape.clone(), v);
                    leaves.insert(node.outputs[0].name.clone(), t);
                    continue;
                }
                let bound = if meta.dtype.is_int() {
                    shardproof_interp::index_bound(graph, ValueId::new(i, 0), metas)
                } else {
                    i64::MAX
                };
                let t = random_tensor(meta, bound, &mut rng_for(seed, &format!("constant/{attr}")));
                leaves.insert(node.outputs[0].name.clone(), t);
            }
        }
    }
}

/// Random operators draw different numbers in each program: a comparison through them says
/// nothing, so the run is inconclusive when one actually drew.
fn check_random(graph: &Graph, env: &Env, which: &str) -> Result<(), Stop> {
    let reg = Registry::builtin();
    for (i, node) in graph.nodes.iter().enumerate() {
        let Some(def) = node.op().and_then(|o| reg.get(o)) else {
            continue;
        };
        if def.class != OpClass::Random || env.values[i].iter().all(Option::is_none) {
            continue;
        }
        let arg = |pos: usize, key: &str| {
            node.args()
                .get(pos)
                .cloned()
                .or_else(|| node.kwarg(key).cloned())
        };
        let deterministic = matches!(def.name.name.as_str(), "native_dropout" | "dropout")
            && (arg(1, "p").and_then(|a| a.as_f64()) == Some(0.0)
                || arg(2, "train").and_then(|a| a.as_bool()) == Some(false));
        if !deterministic {
            return Err(stop(
                Verdict::Inconclusive,
                format!(
                    "inconclusive: {which}: `{}` ({}) draws random numbers, which differ between the spec and the ranks\n  hint: `run` compares deterministic programs; capture with dropout disabled (p=0 or eval mode). The refinement engine honors `assume: dropout: same-mask`",
                    node.name, def.name
                ),
            ));
        }
    }
    Ok(())
}

/// Evaluates an `expr:` layout over the ranks' computed tensors: each clean operator of the
/// case format by its ATen kernel.
fn eval_layout_expr(case: &Case, e: &Expr, rank_envs: &[Env]) -> Result<Tensor, String> {
    use shardproof_case::ExprKind as K;
    use shardproof_ir::Arg;
    let reg = Registry::builtin();
    let tensor = |i: usize| Arg::Value(ValueId::new(i, 0));
    let call = |op: &str, ts: &[Tensor], args: &[Arg]| -> Result<Tensor, String> {
        reg.call(op, ts, args, &[])
            .map_err(|err| format!("`{e}`: {op}: {}", err.0))
            .map(|mut out| out.swap_remove(0))
    };
    let unary = |op: &str, input: &Expr, rest: &[Arg]| -> Result<Tensor, String> {
        let x = eval_layout_expr(case, input, rank_envs)?;
        let mut args = vec![tensor(0)];
        args.extend_from_slice(rest);
        call(op, &[x], &args)
    };
    let ints = |v: &[i64]| Arg::List(v.iter().map(|&n| Arg::Int(n)).collect());
    match &e.kind {
        K::Tensor { rank, name } => {
            let v = case
                .program
                .ranks
                .get(*rank)
                .and_then(|g| g.find(name))
                .ok_or_else(|| format!("rank {rank} has no tensor `{name}`"))?;
            rank_envs[*rank]
                .get(v)
                .cloned()
                .ok_or_else(|| format!("r{rank}.{name} is not computed by the run"))
        }
        K::Concat { parts, .. } | K::Sum(parts) if parts.is_empty() => {
            Err(format!("`{e}` has no parts"))
        }
        K::Concat { parts, dim } => {
            let ts = parts
                .iter()
                .map(|p| eval_layout_expr(case, p, rank_envs))
                .collect::<Result<Vec<_>, _>>()?;
            let list = Arg::List((0..ts.len()).map(tensor).collect());
            call("aten.cat.default", &ts, &[list, Arg::Int(*dim)])
        }
        K::Sum(parts) => {
            let mut acc = eval_layout_expr(case, &parts[0], rank_envs)?;
            for p in &parts[1..] {
                let x = eval_layout_expr(case, p, rank_envs)?;
                acc = call("aten.add.Tensor", &[acc, x], &[tensor(0), tensor(1)])?;
            }
            Ok(acc)
        }
        K::Slice {
            input,
            dim,
            start,
            end,
        } => unary(
            "aten.slice.Tensor",
            input,
            &[Arg::Int(*dim), Arg::Int(*start), Arg::Int(*end)],
        ),
        K::Transpose { input, dim0, dim1 } => unary(
            "aten.transpose.int",
            input,
            &[Arg::Int(*dim0), Arg::Int(*dim1)],
        ),
        K::Permute { input, dims } => unary("aten.permute.default", input, &[ints(dims)]),
        K::Reshape { input, shape } => unary("aten.reshape.default", input, &[ints(shape)]),
        K::Select { input, dim, index } => unary(
            "aten.select.int",
            input,
            &[Arg::Int(*dim), Arg::Int(*index)],
        ),
        K::Unsqueeze { input, dim } => unary("aten.unsqueeze.default", input, &[Arg::Int(*dim)]),
    }
}

/// Accumulated comparison of rank pieces against the spec.
#[derive(Default)]
struct ErrorSum {
    diff2: f64,
    ref2: f64,
    nonfinite: bool,
}

impl ErrorSum {
    fn add(&mut self, got: &Tensor, want: &Tensor) {
        for (&g, &w) in got.data.iter().zip(want.data.iter()) {
            if g.is_nan() && w.is_nan() {
                continue;
            }
            if !g.is_finite() || !w.is_finite() {
                if g != w {
                    self.nonfinite = true;
                }
                continue;
            }
            self.diff2 += (g - w) * (g - w);
            self.ref2 += w * w;
        }
    }

    fn relative(&self) -> f64 {
        if self.nonfinite {
            f64::INFINITY
        } else if self.ref2 > 0.0 {
            (self.diff2 / self.ref2).sqrt()
        } else {
            self.diff2.sqrt()
        }
    }
}

fn combine(values: &[&Tensor], reduce: Reduce) -> Tensor {
    let n = values[0].numel();
    let data = (0..n)
        .map(|e| {
            let it = values.iter().map(|t| t.data[e]);
            match reduce {
                Reduce::Sum => it.sum(),
                Reduce::Avg => it.sum::<f64>() / values.len() as f64,
                Reduce::Max => it.fold(f64::NEG_INFINITY, f64::max),
                Reduce::Min => it.fold(f64::INFINITY, f64::min),
            }
        })
        .collect();
    Tensor::new(values[0].meta.clone(), data)
}

/// Relative Frobenius error of the ranks' values against the spec value laid out by `layout`,
/// or why they cannot be compared.
fn compare_placed(
    case: &Case,
    layout: &Layout,
    spec: &Tensor,
    ranks: &[Option<&Tensor>],
    name: &str,
) -> Result<f64, String> {
    let shape: Vec<i64> = spec.shape().iter().map(|&d| d as i64).collect();
    let mut sum = ErrorSum::default();
    for (r, value) in ranks.iter().enumerate() {
        if let Layout::Placed(l) = layout {
            if !l.holds(&case.program.mesh, r) {
                continue;
            }
        }
        let piece =
            rank_pieces(layout, &shape, &case.program.mesh, r).map_err(|e| e.to_string())?;
        let want_shape: Vec<usize> = piece.local_shape().iter().map(|&d| d as usize).collect();
        let got = match &piece.partial {
            Some(share) if share.index != 0 => continue,
            Some(share) => {
                let members: Vec<&Tensor> = share
                    .group
                    .iter()
                    .map(|&m| ranks[m].ok_or_else(|| format!("rank {m} did not compute `{name}`")))
                    .collect::<Result<_, _>>()?;
                if let Some(bad) = members
                    .iter()
                    .position(|t| t.shape() != want_shape.as_slice())
                {
                    return Err(format!(
                        "rank {} holds {:?}, the placement expects {:?}",
                        share.group[bad],
                        members[bad].shape(),
                        want_shape
                    ));
                }
                combine(&members, share.reduce)
            }
            None => {
                let t = value.ok_or_else(|| format!("rank {r} did not compute `{name}`"))?;
                if t.shape() != want_shape.as_slice() {
                    return Err(format!(
                        "rank {r} holds {:?}, the placement expects {:?}",
                        t.shape(),
                        want_shape
                    ));
                }
                (*t).clone()
            }
        };
        sum.add(&got, &extract(spec, &piece, spec.dtype()));
    }
    Ok(sum.relative())
}

/// The graph inputs and constants without a value that `v` depends on.
fn missing_inputs(graph: &Graph, env: &Env, v: ValueId) -> Vec<String> {
    let mut missing = BTreeSet::new();
    let mut seen = vec![false; graph.nodes.len()];
    let mut stack = vec![v.node];
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut seen[n], true) {
            continue;
        }
        let node = &graph.nodes[n];
        match node.kind {
            NodeKind::Call { .. } => stack.extend(
                node.inputs()
                    .into_iter()
                    .filter(|i| env.get(*i).is_none())
                    .map(|i| i.node),
            ),
            _ if env.values[n].iter().all(Option::is_none) => {
                missing.insert(node.name.clone());
            }
            _ => {}
        }
    }
    missing.into_iter().collect()
}

/// The tolerances a comparison applies.
enum Judged {
    /// One bound for every output.
    Fixed(f64),
    /// Per spec value compared, its own (from [`perturbation_tolerances`]).
    PerOutput(BTreeMap<ValueId, f64>),
}

impl Judged {
    /// The tolerance of spec value `v`, and whether it is the output's own.
    fn of(&self, v: ValueId) -> (f64, Option<f64>) {
        match self {
            Judged::Fixed(t) => (*t, None),
            // Every compared value has one; a value without would be a bug here, and an
            // infinite bound would hide it, so it gets none.
            Judged::PerOutput(map) => map.get(&v).map_or((0.0, Some(0.0)), |&t| (t, Some(t))),
        }
    }
}

/// The spec values an output comparison reads: the case's `outputs:`, or else the spec's
/// graph outputs.
fn compared_values(case: &Case) -> Vec<(ValueId, String)> {
    if !case.outputs.is_empty() {
        return case
            .outputs
            .iter()
            .map(|e| (e.spec_value, e.spec_name.clone()))
            .collect();
    }
    let mut seen = Vec::new();
    for v in case.spec.outputs.iter().flatten() {
        if !seen.iter().any(|(s, _)| s == v) {
            seen.push((*v, case.spec.value_name(*v).to_string()));
        }
    }
    seen
}

/// Each compared output's tolerance from `runs` reruns of the spec with its float inputs
/// perturbed at the precision's machine epsilon: the tolerance model of `trace compare`
/// (`shardproof_trace::perturb`), on the same canonical ids `trace emit` gives the outputs.
fn perturbation_tolerances(
    case: &Case,
    precision: Precision,
    dtype: shardproof_trace::RunDtype,
    seed: u64,
    spec_env: &Env,
    spec_leaves: &Leaves,
    runs: u64,
) -> Result<BTreeMap<ValueId, f64>, Stop> {
    let cfg = RunConfig {
        precision,
        seed,
        custom_ops: case.ops.clone(),
        progress: None,
    };
    let values = compared_values(case);
    let mut responses: Vec<Vec<f64>> = vec![Vec::new(); values.len()];
    for k in 0..runs {
        let leaves = shardproof_trace::perturb::perturb(
            spec_leaves,
            dtype.epsilon(),
            shardproof_trace::perturb::run_seed(seed, k),
        );
        let env = run_graph(&case.spec, &leaves, &cfg).map_err(|e| {
            stop(
                Verdict::Inconclusive,
                format!("inconclusive: a perturbed spec run failed: {}", e.message),
            )
        })?;
        for ((v, _), r) in values.iter().zip(responses.iter_mut()) {
            if let (Some(a), Some(b)) = (spec_env.get(*v), env.get(*v)) {
                r.push(shardproof_trace::perturb::relative_error(&a.data, &b.data));
            }
        }
    }
    let ids: Vec<_> = values
        .iter()
        .map(|(_, name)| shardproof_trace::perturb::output_id(case, name))
        .collect();
    let tolerances = shardproof_trace::perturb::tolerances(dtype, &ids, &responses);
    Ok(values
        .iter()
        .zip(tolerances)
        .map(|((v, _), t)| (*v, t.value))
        .collect())
}

fn compare_outputs(
    case: &Case,
    spec_env: &Env,
    rank_envs: &[Env],
    judged: &Judged,
) -> Result<Vec<OutputResult>, Stop> {
    let spec_value = |v: ValueId, name: &str| {
        spec_env.get(v).ok_or_else(|| {
            let missing = missing_inputs(&case.spec, spec_env, v);
            stop(
                Verdict::Invalid,
                format!(
                    "error: {}: spec tensor `{name}` cannot be computed from the case's inputs: it depends on {}, which `inputs:` does not lay out\n  hint: add {} to `inputs:` in {}",
                    case.file.display(),
                    missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "),
                    if missing.len() == 1 { "it" } else { "them" },
                    case.file.display()
                ),
            )
        })
    };
    let mut results = Vec::new();
    if !case.outputs.is_empty() {
        let mut expectations: Vec<_> = case.outputs.iter().collect();
        expectations.sort_by_key(|e| e.spec_value);
        for e in expectations {
            let spec = spec_value(e.spec_value, &e.spec_name)?;
            let (tolerance, own) = judged.of(e.spec_value);
            let (rel_error, note) = if let Layout::Expr(x) = &e.layout {
                match eval_layout_expr(case, x, rank_envs) {
                    Ok(got) if got.shape() == spec.shape() => {
                        let mut err = ErrorSum::default();
                        err.add(&got, spec);
                        (Some(err.relative()), None)
                    }
                    Ok(got) => (
                        None,
                        Some(format!(
                            "the expression has shape {:?}, the spec tensor {:?}",
                            got.shape(),
                            spec.shape()
                        )),
                    ),
                    Err(why) => (None, Some(why)),
                }
            } else {
                // Per rank, its value; `None` on the ranks that do not hold the output (`at:`).
                let mut ranks: Vec<Option<&Tensor>> = vec![None; rank_envs.len()];
                for &(r, v) in &e.rank_values {
                    ranks[r] = rank_envs[r].get(v);
                }
                match compare_placed(case, &e.layout, spec, &ranks, &e.impl_name) {
                    Ok(err) => (Some(err), None),
                    Err(note) => (None, Some(note)),
                }
            };
            results.push(OutputResult {
                name: e.spec_name.clone(),
                placement: Some(e.layout.to_string()),
                matched: rel_error.is_some_and(|x| x <= tolerance),
                rel_error,
                note,
                tolerance: own,
            });
        }
        return Ok(results);
    }
    let mut seen = Vec::new();
    for (i, out) in case.spec.outputs.iter().enumerate() {
        let Some(v) = *out else { continue };
        if seen.contains(&v) {
            continue;
        }
        seen.push(v);
        let name = case.spec.value_name(v).to_string();
        let spec = spec_value(v, &name)?;
        let (tolerance, own) = judged.of(v);
        let ranks: Vec<Option<&Tensor>> = case
            .program
            .ranks
            .iter()
            .zip(rank_envs)
            .map(|(g, env)| {
                g.outputs
                    .get(i)
                    .copied()
                    .flatten()
                    .and_then(|rv| env.get(rv))
            })
            .collect();
        let mut best: Option<(f64, String)> = None;
        let mut matched = None;
        for layout in
            shardproof_case::simple_layouts(case.program.mesh.dims.len(), spec.shape().len(), 4096)
        {
            if let Ok(err) = compare_placed(case, &layout, spec, &ranks, &name) {
                if err <= tolerance {
                    matched = Some((err, layout.to_string()));
                    break;
                }
                if best.as_ref().is_none_or(|(b, _)| err < *b) {
                    best = Some((err, layout.to_string()));
                }
            }
        }
        results.push(match (matched, best) {
            (Some((err, p)), _) => OutputResult {
                name,
                placement: Some(p),
                rel_error: Some(err),
                matched: true,
                note: None,
                tolerance: own,
            },
            (None, Some((err, p))) => OutputResult {
                name,
                placement: Some(p),
                rel_error: Some(err),
                matched: false,
                note: Some(format!(
                    "output {i} matches no simple placement; closest shown"
                )),
                tolerance: own,
            },
            (None, None) => OutputResult {
                name,
                placement: None,
                rel_error: None,
                matched: false,
                note: Some(format!(
                    "output {i}: the ranks' outputs fit no simple placement"
                )),
                tolerance: own,
            },
        });
    }
    Ok(results)
}

fn print_text(report: &RunReport, verdict: Verdict) {
    let tolerance = match report.perturbed_runs {
        Some(runs) => format!(
            "perturbation tolerances from {runs} perturbed spec runs, largest {:.2e}",
            report.tolerance
        ),
        None => format!("tolerance {:e}", report.tolerance),
    };
    outln!(
        "case {}: spec + {} ranks, seed {}, {} ({tolerance})",
        report.case,
        report.ranks,
        report.seed,
        report.dtype,
    );
    let width = report
        .outputs
        .iter()
        .map(|o| o.name.len())
        .max()
        .unwrap_or(6)
        .max(6);
    for o in &report.outputs {
        let mut err = o.rel_error.map_or("-".to_string(), |e| format!("{e:.2e}"));
        if let Some(t) = o.tolerance {
            err = format!("{err} <= {t:.2e}");
        }
        outln!(
            "  {:width$}  {:24}  rel. error {:>9}  {}{}",
            o.name,
            o.placement.as_deref().unwrap_or("-"),
            err,
            if o.matched { "ok" } else { "MISMATCH" },
            o.note
                .as_ref()
                .map_or(String::new(), |n| format!("  ({n})")),
        );
    }
    match verdict {
        Verdict::Holds => outln!("verdict: holds: every compared output matches the spec"),
        Verdict::Violated => match &report.first_mismatch {
            Some(n) => {
                outln!("verdict: violated: first mismatching output `{n}` (in spec order)")
            }
            None => outln!("verdict: violated"),
        },
        // `main` prints no report for invalid input.
        Verdict::Invalid => {}
        Verdict::Inconclusive => outln!("verdict: inconclusive"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value() -> Tensor {
        Tensor::new(
            Meta::new(DType::F64, vec![2, 3]),
            vec![1.0, -2.0, 3.5, 0.25, 8.0, -1.0],
        )
    }

    #[test]
    fn partial_shares_reduce_to_the_value() {
        let v = value();
        for reduce in [Reduce::Sum, Reduce::Avg, Reduce::Max, Reduce::Min] {
            for k in [1, 2, 3] {
                let shares: Vec<Tensor> = (0..k)
                    .map(|i| partial_share(&v, reduce, i, k, rng_for(5, "g")))
                    .collect();
                let refs: Vec<&Tensor> = shares.iter().collect();
                let back = combine(&refs, reduce);
                for (a, b) in back.data.iter().zip(v.data.iter()) {
                    assert!((a - b).abs() < 1e-12, "{reduce:?} k={k}: {a} vs {b}");
                }
                if k > 1 {
                    assert_ne!(
                        shares[0], v,
                        "{reduce:?}: a share must not be the value itself"
                    );
                }
            }
        }
    }

    #[test]
    fn extract_concatenates_blocks_along_the_shard_dim() {
        let v = value();
        let piece = RankPiece {
            blocks: vec![vec![0..2, 0..1], vec![0..2, 2..3]],
            dim: 1,
            partial: None,
        };
        let t = extract(&v, &piece, DType::F64);
        assert_eq!(t.shape(), &[2, 2]);
        assert_eq!(*t.data, vec![1.0, 3.5, 0.25, -1.0]);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("8GB").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("512mb").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert!(parse_bytes("lots").is_err());
    }

    #[test]
    fn candidate_layouts_start_with_replicate() {
        let c = shardproof_case::simple_layouts(2, 2, 4096);
        assert_eq!(c.len(), 16);
        assert_eq!(c[0].to_string(), "[Replicate(), Replicate()]");
    }
}
