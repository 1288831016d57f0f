//! Shape reduction (TrainVerify, seed 000, section 5.2, Algorithm 1; soundness in section 6
//! and appendix C): the smallest sizes that keep every operator's semantics and every
//! partition boundary, and the case rewritten to them.
//!
//! Every dimension of every value of the spec and of every distinct rank graph gets a size
//! over size variables ([`sizes`]). The case's input placements relate a rank's dims to the
//! spec's (`local = global / shards`, divisible by the shards and fused blocks), each
//! operator's shape rule ([`rules`]) relates its outputs' dims to its inputs' (equal dims,
//! products for reshapes, multiples for concatenation and all-gathers, proportional offsets
//! for slices), and the expected outputs' placements relate the ranks' outputs to the spec's.
//! Constraints are solved exactly by substitution as they are met, so the remaining free
//! variables can take any positive value; each gets 2 (or 1 where it was 1), except those a
//! value literal may depend on (a scale `1/sqrt(d)`, a mean's `1/n` written as a constant),
//! which keep their size. Every shape literal is then rewritten from its dims' sizes, and
//! the rewritten graphs are checked against shape inference.
//!
//! An operator outside the list satisfying the theorem's conditions ([`rules`]), a literal
//! no dim explains, a cut, a constant tensor or a layout with explicit block sizes refuses
//! the reduction ([`Refusal`]): never reduced unsoundly.

pub mod mesh;
pub mod rules;
pub mod sizes;
pub mod vocab;

pub use rules::SIZE_VALUE_PIN;
use rules::{GraphDims, LitValue};
use serde::Serialize;
use shardproof_case::{Blocks, Case, Layout};
use shardproof_ir::{Arg, Dim, Graph, NodeKind, TensorType, ValueId};
use sizes::{Mono, Sizes, Unexplained};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Why a case is not reduced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The operator to blame, when one is.
    pub op: Option<String>,
    /// What and where.
    pub message: String,
}

impl Refusal {
    fn new(message: impl Into<String>) -> Refusal {
        Refusal {
            op: None,
            message: message.into(),
        }
    }
}

impl From<Unexplained> for Refusal {
    fn from(e: Unexplained) -> Self {
        Refusal::new(e.0)
    }
}

/// One size variable of the reduction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReducedSize {
    /// Where it first appeared (`spec x dim 1`).
    pub origin: String,
    /// Its size in the case.
    pub original: u64,
    /// Its size in the reduced case.
    pub reduced: u64,
    /// Kept at the original size because a value literal may depend on it.
    pub pinned: bool,
    /// Why it is pinned (the literal, or the operator whose kernel depends on it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// A size kept whole because no factor related the two sides of an equation between sizes
/// (`4 = v²`): not a free variable, so not in [`Reduction::sizes`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeptSize {
    /// Where its variable first appeared.
    pub origin: String,
    /// Its size.
    pub size: u64,
    /// The relation that kept it, with both sides.
    pub why: String,
}

/// A reduced case and how it was reduced.
#[derive(Clone, Debug)]
pub struct Reduction {
    /// The case with every shape and shape literal rewritten.
    pub case: Case,
    /// The free size variables.
    pub sizes: Vec<ReducedSize>,
    /// Sizes kept whole because no factor related an equation's sides.
    pub kept_whole: Vec<KeptSize>,
    /// Every spec input's original and reduced shape.
    pub inputs: Vec<(String, Vec<u64>, Vec<u64>)>,
    /// Literal products that name mesh sizes, or come only from a norm's `eps`, and were
    /// kept from coinciding with a reduced size without pinning the sizes dividing them
    /// (empty for [`reduce_case_strict`], and where pinning would have kept nothing).
    pub mesh_literals: Vec<u64>,
    /// Each vocabulary integer inputs index (the labels'): reduced with them, or kept and why
    /// (`vocab`).
    pub vocabulary: Vec<vocab::VocabReduction>,
    /// Which literals pinned, so that [`reduce_case_above`] reduces the same way.
    pinning: Pinning,
    /// The size variable of each entry of `sizes`, for [`reduce_case_above`]'s floors.
    free_vars: Vec<sizes::Var>,
}

/// Every product of mesh dim sizes (each dim at most once), and the squares of those
/// products: the integers a literal naming a mesh size (a data-parallel average's `1/512`)
/// gives (`c`, `1/c`, `c²`, `1/c²`).
fn mesh_products(case: &Case) -> Vec<u64> {
    let mut out: Vec<u64> = vec![1];
    for (_, s) in &case.program.mesh.dims {
        let more: Vec<u64> = out
            .iter()
            .filter_map(|p| p.checked_mul(*s as u64))
            .collect();
        out.extend(more);
    }
    let squares: Vec<u64> = out.iter().filter_map(|p| p.checked_mul(*p)).collect();
    out.extend(squares);
    out.retain(|&p| p >= 2);
    out.sort_unstable();
    out.dedup();
    out
}

/// Elements of every value of a graph, by shape inference.
pub fn graph_elements(g: &Graph, case: &Case) -> usize {
    shardproof_interp::infer_graph(g, &case.ops)
        .metas
        .iter()
        .flatten()
        .flatten()
        .map(|m| m.numel())
        .sum()
}

/// The ratio `global / local` of a dimension, when exact.
fn ratio(global: u64, local: u64, what: &str) -> Result<u64, Refusal> {
    if local == 0 || !global.is_multiple_of(local) {
        return Err(Refusal::new(format!(
            "{what}: the ranks' size {local} does not divide the spec's {global} (uneven shards are not reduced)"
        )));
    }
    Ok(global / local)
}

fn blocks_of(layout: &Layout) -> Result<u64, Refusal> {
    match layout {
        Layout::Placed(p) => match &p.blocks {
            Blocks::Equal { count, .. } => Ok(*count as u64),
            Blocks::Sizes(_) => Err(Refusal::new(
                "a layout with explicit block sizes (`blocks: [..]`) is not reduced",
            )),
        },
        Layout::Expr(_) => Err(Refusal::new("an `expr:` layout is not reduced")),
    }
}

/// A rank dim from the spec dim it holds a `1/k` of (with `blocks` fused blocks, each split
/// into `k`): divisible by `k * blocks`, so every shard and block boundary stays.
fn local_dim(
    sizes: &mut Sizes,
    global: &Mono,
    local: u64,
    blocks: u64,
    what: &str,
) -> Result<Mono, Refusal> {
    let g = sizes.original(global);
    if g == local {
        if blocks > 1 {
            // A fused dim held whole still has its block boundaries.
            sizes.divide(global, blocks, what)?;
        }
        return Ok(global.clone());
    }
    let k = ratio(g, local, what)?;
    let part = sizes.divide(global, k * blocks, what)?;
    Ok(part.scale(blocks).expect("small"))
}

/// Reduces `case`: the smallest sizes keeping every operator's semantics and every partition
/// boundary, or why not.
///
/// A value literal that is a product of mesh dim sizes (or its square) is taken to name mesh
/// sizes, which the reduction never changes: the sizes dividing it are not pinned, but no
/// reduced size may coincide with it. This keeps proofs sound (a proof needs only that no
/// literal coincides with a reduced size; pinning keeps a literal that stands for a *tensor*
/// size agreeing with it, so without it such a program can only be refuted, never proved, at
/// the reduced sizes). A refutation found this way is therefore checked again by the caller
/// on [`reduce_case_strict`]'s sizes, where every literal pins (docs/prove.md, section 2).
pub fn reduce_case(case: &Case) -> Result<Reduction, Refusal> {
    reduce_with(case, Pinning::Relaxed, &BTreeMap::new())
}

/// [`reduce_case`] with every value literal pinning the sizes dividing it, mesh sizes
/// included.
pub fn reduce_case_strict(case: &Case) -> Result<Reduction, Refusal> {
    reduce_with(case, Pinning::Strict, &BTreeMap::new())
}

/// [`reduce_case`], except that a mesh-size literal scaling a tensor (`mul`, `div`) one of
/// whose runs of dims holds exactly that many elements pins the sizes of that run: there the
/// literal may stand for the size (a microbatch's mean over its `b·S` tokens written as
/// `div(g, 8)` in a backward, on a mesh where `pp·dp = 8`) and the spec's size-derived
/// constant agrees with it only at full size. Pinning is for completeness only, so this is
/// as sound as [`reduce_case`]; it is tried where that one's reduced case is refuted.
pub fn reduce_case_pinning_scaled_sizes(case: &Case) -> Result<Reduction, Refusal> {
    reduce_with(case, Pinning::ScaledSizes, &BTreeMap::new())
}

/// The second reduction of the second-size check (`equiv/second_size.rs`): `case` reduced as
/// `first` was (the same literals pinning), with every free size variable of `first` forced
/// strictly above its reduced value there. Each takes the next value its constraints admit
/// (every divisibility, alignment and minimum holds by substitution whatever the value; no
/// literal may coincide with it), at most its original size, which a variable already at its
/// original size keeps. `Ok(None)` where every variable of `first` is at its original size:
/// `first` is the full size and there is nothing to check.
pub fn reduce_case_above(case: &Case, first: &Reduction) -> Result<Option<Reduction>, Refusal> {
    if first.sizes.iter().all(|s| s.reduced >= s.original) {
        return Ok(None);
    }
    let mut floors: BTreeMap<sizes::Var, u64> = first
        .free_vars
        .iter()
        .zip(&first.sizes)
        .map(|(&v, s)| (v, s.reduced + 1))
        .collect();
    // Each round raises a floor by at least 1 and no floor passes its original size.
    let rounds: u64 = first
        .sizes
        .iter()
        .map(|s| s.original.saturating_sub(s.reduced))
        .sum::<u64>()
        + 1;
    for _ in 0..rounds {
        let second = reduce_with(case, first.pinning, &floors)?;
        // The walk is deterministic, so the variables are the first reduction's; a difference
        // would leave the floors on other sizes than meant.
        let same = second.free_vars == first.free_vars
            && second
                .sizes
                .iter()
                .zip(&first.sizes)
                .all(|(a, b)| a.origin == b.origin && a.original == b.original);
        if !same {
            return Err(Refusal::new(
                "the second reduction's size variables are not the first's",
            ));
        }
        // The second sizes keep the originals' order: two variables whose original sizes
        // differ get second sizes that differ the same way. A program comparing two sizes'
        // values (ids an 8-row table bounds against a one-hot over 4 classes) agrees with its
        // spec wherever the smaller is not smaller; the first reduction may take both to one
        // value, and the check must not do so again.
        match order_lost(&second) {
            None => return Ok(Some(second)),
            Some((v, floor)) => {
                let f = floors.entry(second.free_vars[v]).or_insert(floor);
                *f = (*f).max(floor);
            }
        }
    }
    Err(Refusal::new(
        "the second sizes could not keep the original sizes' order",
    ))
}

/// A variable of `r` (its index in `r.sizes`) whose reduced size does not exceed that of a
/// variable of smaller original size, and the floor that would put it above: `None` where
/// the reduced sizes keep the originals' strict order.
fn order_lost(r: &Reduction) -> Option<(usize, u64)> {
    let s = &r.sizes;
    (0..s.len()).find_map(|j| {
        (0..s.len())
            .filter(|&i| s[i].original < s[j].original && s[i].reduced >= s[j].reduced)
            .map(|i| s[i].reduced + 1)
            .max()
            .map(|floor| (j, floor.min(s[j].original)))
    })
}

/// How the reason begins of a size pinned by [`reduce_case_pinning_scaled_sizes`].
pub const SCALED_SIZE_PIN: &str = "the mesh-size literal";

/// Which value literals pin the sizes they may stand for (every literal keeps reduced sizes
/// from coinciding with it whatever the choice: the rule soundness needs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pinning {
    /// Literals naming mesh sizes, norm epsilons and literals both sides write pin nothing.
    Relaxed,
    /// As `Relaxed`, but a mesh-size literal scaling a tensor with a run of dims of exactly
    /// its size pins that run.
    ScaledSizes,
    /// Every literal pins.
    Strict,
}

/// The runs of consecutive dims among `dims` whose original sizes multiply to `x`.
fn runs_of_size(sizes: &Sizes, dims: &[Mono], x: u64) -> Vec<Vec<Mono>> {
    let mut runs = Vec::new();
    for start in 0..dims.len() {
        let mut product: u64 = 1;
        for end in start..dims.len() {
            product = product.saturating_mul(sizes.original(&dims[end]));
            if product == x {
                runs.push(dims[start..=end].to_vec());
            }
            if product > x {
                break;
            }
        }
    }
    runs
}

/// Reduces `case`; `floors` are minimum reduced values of size variables (the second-size
/// check's, [`reduce_case_above`]; empty otherwise).
fn reduce_with(
    case: &Case,
    pinning: Pinning,
    floors: &BTreeMap<sizes::Var, u64>,
) -> Result<Reduction, Refusal> {
    let strict = pinning == Pinning::Strict;
    let mut sizes = Sizes::default();
    if case.inputs.iter().any(|r| r.cut) {
        return Err(Refusal::new("a case with cuts is not reduced"));
    }
    let spec_metas = shardproof_interp::infer_graph(&case.spec, &case.ops).metas;
    let mut spec = rules::walk(&mut sizes, &case.spec, &spec_metas, &mut |sz, v, shape| {
        Ok(Some(
            shape
                .iter()
                .enumerate()
                .map(|(d, &n)| sz.fresh(n, format!("spec {} dim {d}", case.spec.value_name(v))))
                .collect(),
        ))
    })?;
    // The rank graphs, each distinct one once: ranks sharing a graph hold the same shapes.
    let first = shardproof_interp::first_equal(&case.program.ranks);
    let mut walked: HashMap<usize, GraphDims> = HashMap::new();
    let mut rank_metas: HashMap<usize, Vec<Vec<Option<shardproof_ops::Meta>>>> = HashMap::new();
    for (r, g) in case.program.ranks.iter().enumerate() {
        if first[r] != r {
            continue;
        }
        let metas = shardproof_interp::infer_graph(g, &case.ops).metas;
        let dims = rules::walk(&mut sizes, g, &metas, &mut |sz, v, shape| {
            let rel = case
                .inputs
                .iter()
                .find(|rel| rel.rank_values.iter().any(|&(rr, rv)| rr == r && rv == v));
            let Some(rel) = rel else {
                return Err(Refusal::new(format!(
                    "rank {r}'s input `{}` is not laid out by the case",
                    g.value_name(v)
                )));
            };
            let global = spec.dims_of(rel.spec_value).ok_or_else(|| {
                Refusal::new(format!(
                    "the shape of spec input `{}` is unknown",
                    rel.spec_name
                ))
            })?;
            if global.len() != shape.len() {
                return Err(Refusal::new(format!(
                    "rank {r}'s `{}` has rank {} but spec `{}` has {}",
                    g.value_name(v),
                    shape.len(),
                    rel.spec_name,
                    global.len()
                )));
            }
            let blocks = blocks_of(&rel.layout)?;
            let mut out = Vec::new();
            for (d, (gm, &n)) in global.iter().zip(shape).enumerate() {
                let what = format!("`{}` dim {d} on rank {r}", rel.spec_name);
                out.push(local_dim(sz, gm, n, blocks, &what)?);
            }
            Ok(Some(out))
        })?;
        walked.insert(r, dims);
        rank_metas.insert(r, metas);
    }
    unify_messages(case, &first, &walked, &mut sizes)?;
    // The expected outputs' placements relate the ranks' outputs to the spec's.
    for e in &case.outputs {
        let Some(global) = spec.dims_of(e.spec_value) else {
            continue;
        };
        let blocks = blocks_of(&e.layout)?;
        for &(r, rv) in &e.rank_values {
            let dims = &walked[&first[r]];
            let Some(local) = dims.dims_of(rv) else {
                continue;
            };
            if local.len() != global.len() {
                continue;
            }
            for (d, (gm, lm)) in global.iter().zip(local.iter()).enumerate() {
                let what = format!("output `{}` dim {d} on rank {r}", e.spec_name);
                let n = sizes.original(lm);
                let expect = local_dim(&mut sizes, gm, n, blocks, &what)?;
                sizes.unify(&expect, lm, &what)?;
            }
        }
    }
    // Integer inputs an index or an integer computation reads keep their range: the spec dims
    // that bound the spec input they hold (a rank's input through the case's relation).
    let mut ranged: Vec<ValueId> = spec.ranged_inputs.clone();
    for (&r, dims) in &walked {
        for &v in &dims.ranged_inputs {
            for rel in &case.inputs {
                if rel
                    .rank_values
                    .iter()
                    .any(|&(rr, rv)| first[rr] == r && rv == v)
                {
                    ranged.push(rel.spec_value);
                }
            }
        }
    }
    ranged.sort_unstable();
    ranged.dedup();
    // A vocabulary the labels index may reduce with them where conditions V1-V4 hold
    // (`vocab`); V5's minimum block is set once the other sizes are chosen, below.
    let outcomes = vocab::analyse(
        &vocab::Walked {
            case,
            spec: &spec,
            spec_metas: &spec_metas,
            ranks: &walked,
            rank_metas: &rank_metas,
            first: &first,
        },
        &ranged,
        &sizes,
    );
    let mut plans = Vec::new();
    let mut vocabulary = Vec::new();
    let mut decided: Vec<ValueId> = Vec::new();
    for o in outcomes {
        match o {
            vocab::Outcome::Reduce(plan) => {
                decided.extend(plan.labels.iter().copied());
                plans.push(plan);
            }
            vocab::Outcome::Keep { labels, var, why } => {
                decided.extend(labels.iter().copied());
                vocabulary.push(vocab::VocabReduction {
                    labels: labels
                        .iter()
                        .map(|&v| case.spec.value_name(v).to_string())
                        .collect(),
                    origin: var
                        .map(|v| sizes.origin_of(v).to_string())
                        .unwrap_or_default(),
                    block: var.map_or(0, |v| sizes.original(&Mono::var(v))),
                    reduced_block: var.map_or(0, |v| sizes.original(&Mono::var(v))),
                    label_elements: 0,
                    offset_bound: 0,
                    kept: Some(why.clone()),
                });
                for v in labels {
                    for m in rules::range_dims(&case.spec, &spec, v) {
                        sizes.pin(
                            &m,
                            &format!("an integer input's range: an index or integer computation reads it; the vocabulary is kept ({why})"),
                        );
                    }
                }
            }
        }
    }
    for v in ranged {
        if decided.contains(&v) {
            continue;
        }
        for m in rules::range_dims(&case.spec, &spec, v) {
            sizes.pin(
                &m,
                "an integer input's range: an index or integer computation reads it",
            );
        }
    }
    // Sizes an operator's kernel depends on (a topk's lane and count, an index's range) keep
    // their original values; pinned only now, when every relation is known, so that no later
    // substitution leaves a part of them free.
    for m in spec
        .kept
        .iter()
        .chain(walked.values().flat_map(|w| w.kept.iter()))
    {
        // A reduced vocabulary's gathers index it by label values, which V1-V4 let reduce.
        let n = sizes.norm(m);
        if plans.iter().any(|p| n.vars.contains_key(&p.var)) {
            continue;
        }
        sizes.pin(
            m,
            "an operator's kernel depends on it (topk, gather, scatter)",
        );
    }
    // Sizes read as values (a count of a created fill, positions in arithmetic) keep their
    // original values: a polynomial of them and literals may vanish at a reduced size where
    // it does not at full size, which no rule on the literals alone excludes.
    for (m, why) in spec
        .size_values
        .iter()
        .chain(walked.values().flat_map(|w| w.size_values.iter()))
    {
        sizes.pin(m, why);
    }
    // Value literals may stand for sizes: keep those sizes; those naming mesh sizes only
    // keep reduced sizes from coinciding with them.
    let mesh = if strict {
        Vec::new()
    } else {
        mesh_products(case)
    };
    let mut literals: Vec<u64> = spec
        .value_literals
        .iter()
        .chain(walked.values().flat_map(|w| w.value_literals.iter()))
        .copied()
        .collect();
    literals.sort_unstable();
    literals.dedup();
    // A norm's `eps` is a stabilizer added to a variance, never a size: like a mesh-size
    // literal it only keeps reduced sizes from coinciding with it (the one rule soundness
    // needs), unless the same integer also comes from another literal. Without this, 1e-5
    // (100000 = 2^5 5^5) pins every power-of-two size up to 32 and nothing of a tiny model
    // is reduced. Not in the strict reduction, which pins every literal.
    let mut eps: Vec<u64> = if strict {
        Vec::new()
    } else {
        spec.eps_literals
            .iter()
            .chain(walked.values().flat_map(|w| w.eps_literals.iter()))
            .copied()
            .filter(|x| literals.binary_search(x).is_err())
            .collect()
    };
    if strict {
        literals.extend(
            spec.eps_literals
                .iter()
                .chain(walked.values().flat_map(|w| w.eps_literals.iter()))
                .copied(),
        );
        literals.sort_unstable();
        literals.dedup();
    }
    eps.sort_unstable();
    eps.dedup();
    // A literal product the spec and every distinct rank graph all write (an attention
    // scale `1/sqrt(128)`, a learning rate) is used alike on both sides, so it need not keep
    // the sizes it may stand for: like a mesh-size literal it only keeps reduced sizes from
    // coinciding with it (the rule soundness needs), and a refutation on such sizes is
    // checked again on the strict reduction's. Without this, `1/sqrt(128)` pins the head dim
    // and a llama3-8b layer keeps attention widths of 4096.
    //
    // "Both sides" is the spec and some rank graph, not every one: a stage of a pipeline
    // plan holds ranks of other pipeline stages whose graphs compute none of the layer (the
    // RMSNorm's `1e-5`, written as an `add`, then pinned every size dividing 100000,
    // llama3-405b's 16 heads per rank among them). Pinning is for completeness only; the
    // literal still keeps reduced sizes from coinciding with it, and a refutation on sizes
    // it would have pinned is checked on the strict reduction's.
    let shared: Vec<u64> = if strict {
        Vec::new()
    } else {
        spec.value_literals
            .iter()
            .copied()
            .filter(|x| walked.values().any(|w| w.value_literals.contains(x)))
            .collect()
    };
    let (mut named, others): (Vec<u64>, Vec<u64>) = literals
        .into_iter()
        .partition(|x| mesh.contains(x) || shared.contains(x));
    named.extend(eps);
    for x in others {
        sizes.pin_divisors_of(x);
    }
    if pinning == Pinning::ScaledSizes {
        let scaled: Vec<&(Vec<u64>, Vec<Mono>)> = spec
            .scaled_dims
            .iter()
            .chain(walked.values().flat_map(|w| w.scaled_dims.iter()))
            .collect();
        for &x in named.iter().filter(|x| mesh.contains(x)) {
            for (_, dims) in scaled.iter().filter(|(ints, _)| ints.contains(&x)) {
                for run in runs_of_size(&sizes, dims, x) {
                    for m in &run {
                        sizes.pin(
                            m,
                            &format!("{SCALED_SIZE_PIN} {x} scales a tensor with dims of {x} elements, so it may stand for their size"),
                        );
                    }
                }
            }
        }
    }
    let mut mesh_literals = Vec::new();
    for x in named {
        if sizes.avoid(x) {
            mesh_literals.push(x);
        }
    }
    // The second-size check's floors, before any choice below reads a reduced size.
    for (&v, &floor) in floors {
        if v >= sizes.len() {
            return Err(Refusal::new(
                "the second reduction has fewer size variables than the first",
            ));
        }
        sizes.at_least(v, floor);
    }
    // A table looked up at positions keeps at least as many rows as positions
    // (`rules::Cx::positions_fit_the_table`): checked on the chosen sizes; where they fall
    // short the table keeps its rows (a pin only raises its own variables), and where even
    // that falls short the reduction is refused.
    for (rows, end) in spec
        .at_least
        .iter()
        .chain(walked.values().flat_map(|w| w.at_least.iter()))
    {
        if sizes.reduced(rows) < sizes.reduced(end) {
            sizes.pin(
                rows,
                "a table looked up at positions: at least as many rows",
            );
        }
        let (r, e) = (sizes.reduced(rows), sizes.reduced(end));
        if r < e {
            return Err(Refusal {
                op: Some("aten.embedding.default".into()),
                message: format!(
                    "a table of {} rows (reduced to {r}) looked up at positions up to {} (reduced to {e})",
                    sizes.original(rows),
                    sizes.original(end)
                ),
            });
        }
    }
    // V5: the block holds a window around each label and block edge.
    for plan in plans {
        let labels: u64 = plan
            .labels
            .iter()
            .map(|&v| {
                spec.dims_of(v)
                    .map_or(1, |d| d.iter().map(|m| sizes.reduced(m)).product::<u64>())
            })
            .sum();
        let b = plan.offset_bound as u64;
        let minimum = (4 * b + 2).saturating_mul(labels.saturating_add(3));
        sizes.at_least(plan.var, minimum);
        let unit = Mono::var(plan.var);
        let (block, reduced_block) = (sizes.original(&unit), sizes.reduced(&unit));
        let kept = if reduced_block >= block {
            let why = format!(
                "V5: a block of {block} is not above the minimum (4B + 2)·(N + 3) = {minimum} for B = {b} and N = {labels} labels, or every smaller one coincides with a literal"
            );
            sizes.pin(&unit, &format!("the vocabulary is kept ({why})"));
            Some(why)
        } else {
            for (key, lit) in plan.literals {
                match key {
                    vocab::GraphKey::Spec => spec.literals.push(lit),
                    vocab::GraphKey::Rank(r) => walked
                        .get_mut(&r)
                        .expect("a walked graph")
                        .literals
                        .push(lit),
                }
            }
            None
        };
        vocabulary.push(vocab::VocabReduction {
            labels: plan
                .labels
                .iter()
                .map(|&v| case.spec.value_name(v).to_string())
                .collect(),
            origin: sizes.origin_of(plan.var).to_string(),
            block,
            reduced_block: sizes.reduced(&unit),
            label_elements: labels,
            offset_bound: b,
            kept,
        });
    }
    let new_spec = rewrite(&case.spec, &spec, &sizes, &case.ops)?;
    let mut new_graphs: HashMap<usize, Arc<Graph>> = HashMap::new();
    for (&r, dims) in &walked {
        new_graphs.insert(
            r,
            Arc::new(rewrite(&case.program.ranks[r], dims, &sizes, &case.ops)?),
        );
    }
    let mut reduced = case.clone();
    reduced.spec = new_spec;
    reduced.program.ranks = (0..case.program.ranks.len())
        .map(|r| new_graphs[&first[r]].clone())
        .collect();
    let inputs = case
        .inputs
        .iter()
        .filter_map(|rel| {
            let d = spec.dims_of(rel.spec_value)?;
            Some((
                rel.spec_name.clone(),
                d.iter().map(|m| sizes.original(m)).collect(),
                d.iter().map(|m| sizes.reduced(m)).collect(),
            ))
        })
        .collect();
    let free_vars = sizes.free().into_iter().map(|(v, ..)| v).collect();
    let free = sizes
        .free()
        .into_iter()
        .map(|(_, original, reduced, origin, why)| ReducedSize {
            origin: origin.to_string(),
            original,
            reduced,
            pinned: why.is_some(),
            why: why.map(str::to_string),
        })
        .collect();
    let kept_whole = sizes
        .kept_whole()
        .iter()
        .map(|(origin, size, why)| KeptSize {
            origin: origin.clone(),
            size: *size,
            why: why.clone(),
        })
        .collect();
    Ok(Reduction {
        case: reduced,
        sizes: free,
        kept_whole,
        inputs,
        mesh_literals,
        vocabulary,
        pinning,
        free_vars,
    })
}

/// Whether a graph calls a point-to-point operator.
pub(crate) fn has_point_to_point(g: &Graph) -> bool {
    g.nodes.iter().any(|n| {
        n.op()
            .is_some_and(|op| op.namespace == shardproof_ops::P2P_NAMESPACE)
    })
}

/// A recv's buffer holds the tensor the matched send posts (a copy: one kernel per index, the
/// identity mapping), so the two have the same sizes: each recv's dims are unified with its
/// send's input's, pairs as the interpreter delivers them (the k-th recv from a peer with a
/// tag takes the k-th send to it with that tag). A program whose messages do not pair (a
/// hang, an invalid peer) is not reduced.
fn unify_messages(
    case: &Case,
    first: &[usize],
    walked: &HashMap<usize, GraphDims>,
    sizes: &mut Sizes,
) -> Result<(), Refusal> {
    let distinct = || (0..first.len()).filter(|&r| first[r] == r);
    if !distinct().any(|r| has_point_to_point(&case.program.ranks[r])) {
        return Ok(());
    }
    let sched = shardproof_interp::schedule(&case.program, &case.ops, None);
    if let Some(p) = &sched.problem {
        return Err(Refusal {
            op: Some("shardproof_p2p.recv".into()),
            message: format!(
                "the point-to-point messages do not pair, so their sizes are not related: {}",
                p.message()
            ),
        });
    }
    let mut matched = 0usize;
    for (&(rr, ri), &(sr, si)) in &sched.messages {
        let recv_graph = &case.program.ranks[rr];
        let send_graph = &case.program.ranks[sr];
        let recv = walked[&first[rr]].dims_of(ValueId::new(ri, 0));
        let sent = send_graph.nodes[si].inputs().first().copied();
        let send = sent.and_then(|v| walked[&first[sr]].dims_of(v));
        let (Some(recv), Some(send)) = (recv, send) else {
            return Err(Refusal::new(format!(
                "{}: the sizes of a message are unknown",
                rules::location(recv_graph, ri)
            )));
        };
        if recv.len() != send.len() {
            return Err(Refusal::new(format!(
                "{}: receives a tensor of rank {} from {}, which sends one of rank {}",
                rules::location(recv_graph, ri),
                recv.len(),
                rules::location(send_graph, si),
                send.len()
            )));
        }
        let what = format!(
            "{} receives from {}",
            rules::location(recv_graph, ri),
            rules::location(send_graph, si)
        );
        for (a, b) in recv.iter().zip(send) {
            sizes.unify(a, b, &what)?;
        }
        matched += 1;
    }
    // Every recv takes a message (a schedule without a problem pairs them all); one left
    // without would keep sizes no sender relates.
    let per_graph: HashMap<usize, usize> = distinct()
        .map(|r| {
            let n = case.program.ranks[r]
                .nodes
                .iter()
                .filter(|n| {
                    n.op().is_some_and(|op| {
                        op.namespace == shardproof_ops::P2P_NAMESPACE && op.name == "recv"
                    })
                })
                .count();
            (r, n)
        })
        .collect();
    let recvs: usize = first.iter().map(|f| per_graph[f]).sum();
    if matched != recvs {
        return Err(Refusal::new(format!(
            "{} of {recvs} recvs take a message: the others' sizes are not related",
            matched
        )));
    }
    Ok(())
}

/// Sets argument `name` of a call node, positionally or by keyword as it was given (or
/// appended by keyword when it was defaulted).
fn set_arg(
    node: &mut shardproof_ir::Node,
    schema: &shardproof_ops::Schema,
    name: &str,
    value: Arg,
) {
    let NodeKind::Call { args, kwargs, .. } = &mut node.kind else {
        return;
    };
    if let Some((_, a)) = kwargs.iter_mut().find(|(k, _)| k == name) {
        *a = value;
        return;
    }
    match schema.index_of(name) {
        Some(i) if i < args.len() => args[i] = value,
        _ => kwargs.push((name.to_string(), value)),
    }
}

fn int_arg(x: u64) -> Arg {
    Arg::Int(x as i64)
}

/// The graph with every recorded shape and shape literal at its reduced size, checked
/// against shape inference.
pub(crate) fn rewrite(
    g: &Graph,
    dims: &GraphDims,
    sizes: &Sizes,
    ops: &std::collections::BTreeMap<String, shardproof_ir::OpMeaning>,
) -> Result<Graph, Refusal> {
    let mut out = g.clone();
    for (i, node) in out.nodes.iter_mut().enumerate() {
        for (k, o) in node.outputs.iter_mut().enumerate() {
            let (Some(ty), Some(d)) = (&o.ty, dims.dims[i].get(k).and_then(|d| d.as_ref())) else {
                continue;
            };
            if ty.shape.iter().any(|d| matches!(d, Dim::Sym(_))) {
                return Err(Refusal::new(format!(
                    "`{}` has a symbolic shape; only concrete shapes are reduced",
                    o.name
                )));
            }
            let shape: Vec<i64> = d.iter().map(|m| sizes.reduced(m) as i64).collect();
            o.ty = Some(TensorType::new(ty.dtype, &shape));
        }
    }
    let reg = shardproof_ops::Registry::builtin();
    for lit in &dims.literals {
        let node = &mut out.nodes[lit.node];
        let Some(op) = node.op().cloned() else {
            continue;
        };
        let def = reg.get(&op).expect("walked nodes are registered");
        let value = match &lit.value {
            LitValue::Sizes(list) => Arg::List(
                list.iter()
                    .map(|m| match m {
                        Some(m) => int_arg(sizes.reduced(m)),
                        None => Arg::Int(-1),
                    })
                    .collect(),
            ),
            LitValue::Size(m) => int_arg(sizes.reduced(m)),
            LitValue::Offset { unit, a, b, float } => {
                let x = a * sizes.reduced(unit) as i64 + b;
                if *float {
                    Arg::Float(x as f64)
                } else {
                    Arg::Int(x)
                }
            }
            LitValue::Scaled { dim, num, den } => {
                let n = sizes.reduced(dim);
                // Exact: the dim was made divisible by `den / gcd(num, den)`.
                int_arg(n * num / den)
            }
        };
        set_arg(node, &def.schema, lit.arg, value);
    }
    // The rewritten graph must agree with shape inference everywhere.
    let inferred = shardproof_interp::infer_graph(&out, ops);
    for (i, node) in out.nodes.iter().enumerate() {
        for (k, o) in node.outputs.iter().enumerate() {
            let (Some(ty), Some(Some(m))) = (&o.ty, inferred.metas[i].get(k)) else {
                continue;
            };
            let want: Vec<usize> = ty
                .concrete_shape()
                .unwrap_or_default()
                .iter()
                .map(|&d| d as usize)
                .collect();
            if m.shape != want {
                return Err(Refusal {
                    op: node.op().map(|o| o.to_string()),
                    message: format!(
                        "{}: the reduced `{}` infers to {:?}, not {:?}: its shape rule is not reduced consistently",
                        rules::location(g, i),
                        o.name,
                        m.shape,
                        want
                    ),
                });
            }
        }
    }
    Ok(out)
}
