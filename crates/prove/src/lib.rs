//! The element-level prover of shardproof: does a distributed program compute, element by
//! element and for every input, what its single-device specification computes?
//!
//! Following TrainVerify (seed 000, sections 4-6), every tensor of the spec and of every rank
//! is executed on *symbolic tensors* whose elements are expressions over input symbols; each
//! expected spec output is rebuilt from the ranks' outputs by the case's placements, and
//! every (spec element, rebuilt element) pair is a goal `a == b` over the reals.
//!
//! # What it proves
//!
//! [`prove_case`] returns [`Verdict::Proved`] only when every element of every expected
//! output was decided equal by a sound layer, for all values of the inputs (reals for float
//! tensors, 0/1 for bools, integers within the indexed range for integer inputs such as token
//! ids). Partial inputs are split into fresh shares that combine into the spec value, so a
//! proof covers every split. Floating-point rounding is outside the semantics (as in
//! TrainVerify): a float-to-float cast is the identity.
//!
//! # The layers ([`decide`])
//!
//! 1. **normal-form**: expressions are hash-consed in a normal form ([`expr`]): polynomials
//!    with exact rational coefficients over *atoms* (symbols, and interpreted functions —
//!    exp, log, sqrt, reciprocal of a non-constant, tanh, erf, comparisons, `where`, max/min
//!    as a flattened, sorted, deduplicated multiset, table lookups — applied to normalized
//!    arguments). Equal ids are equal expressions: proved.
//! 2. **random-witness**: otherwise both sides are evaluated modulo 2^61-1 with fixed random
//!    interpretations of the functions; where they differ, random rational points are tried
//!    with the real functions (exactly where possible, else clearly beyond f64 rounding). A
//!    point where they differ refutes the goal. Equality at random points is never a proof.
//! 3. **product-expansion**: where no point separates them, the sides' difference is expanded
//!    ([`expand`]): `product` atoms multiplied out, `lookup`/`where` atoms combined entry by
//!    entry; zero proves the goal (it never refutes).
//! 4. **z3**: remaining goals go to Z3 (the system libz3 through a minimal C binding, see
//!    `smt`): reals, max/min/comparisons/where/division encoded exactly, the transcendental
//!    functions uninterpreted with true axioms. Unsat proves the goal; a model is accepted as
//!    a refutation only if it is a real difference.
//! 5. **unknown**: anything else, reported as such.
//!
//! A refutation is reported only with a [`equiv::counterexample::Counterexample`]: the
//! witness turned into concrete inputs, run through the reference interpreter
//! (`shardproof_interp::run_graph` / `run_program`), with the spec output and the rebuilt
//! output differing there.
//!
//! # Symbolic execution ([`exec`])
//!
//! Pure data movement (views, slices, permutes, concatenation, gathers with constant indices)
//! runs the registry's own f64 kernel on tensors of element indices; arithmetic operators
//! have one symbolic rule per family; operators with constant inputs fold through their
//! kernel; collectives and send/recv run across ranks in the order the interpreter's
//! schedule pairs them. An operator without a rule makes the proof inconclusive, naming it.
//!
//! # Limits
//!
//! By default the case is first *shape-reduced* ([`reduce`]; TrainVerify's Algorithm 1):
//! every size becomes the smallest one that keeps each operator's semantics and each
//! partition boundary, and the proof runs on the reduced case; a program with an operator or
//! literal the reduction cannot explain is refused (inconclusive), never reduced unsoundly
//! ([`ProveConfig::reduce`] off proves at full size). [`stage`] cuts a case with cuts into
//! stages proved on their own (with a memo for identical stages, on several threads or
//! processes) and chains them. A (reduced) program or stage is refused (inconclusive, naming the size and the limit) beyond
//! [`ProveConfig::max_elements`] tensor elements, [`expr::Budget`] polynomial terms or
//! [`ProveConfig::max_goals`] goals.
//! Products whose expansion would exceed [`expr::Budget::expand_limit`] terms stay
//! `product` atoms of their (primitive) factors, so deep chains of linear maps do not grow as
//! the product of their widths; where one program distributes such a product and the other
//! does not, normal forms differ and the goal falls to the later layers (unknown at worst,
//! never a wrong verdict). Exact rational arithmetic on f64 constants is slow on big models
//! (gpt2 tp=2 forward takes about a minute). [`ProveConfig::time_limit`] is checked before every node,
//! every few thousand expressions built ([`expr::Arena::set_deadline`]), before every goal and
//! random point, and caps Z3's timeout.
//!
//! ```
//! use shardproof_prove::decide::{decide, DecideConfig, Layer, Outcome};
//! use shardproof_prove::expr::{Arena, SymbolKind};
//!
//! let mut a = Arena::default();
//! let x = a.symbol("x", SymbolKind::Real).unwrap();
//! let y = a.symbol("y", SymbolKind::Real).unwrap();
//! // (x + y) * 2 and 2x + 2y have one normal form.
//! let s = a.add(x, y).unwrap();
//! let two = a.int(2).unwrap();
//! let lhs = a.mul(s, two).unwrap();
//! let (x2, y2) = (a.mul(two, x).unwrap(), a.mul(two, y).unwrap());
//! let rhs = a.add(x2, y2).unwrap();
//! assert_eq!(decide(&a, lhs, rhs, &DecideConfig::default()), Outcome::Proved(Layer::NormalForm));
//! // relu(x) and x differ, and a random point shows it.
//! let zero = a.int(0).unwrap();
//! let relu = a.max(x, zero).unwrap();
//! assert!(matches!(decide(&a, relu, x, &DecideConfig::default()), Outcome::Refuted { .. }));
//! ```

#![warn(missing_docs)]

pub mod assume;
pub mod coeff;
pub mod decide;
pub mod equiv;
pub mod eval;
pub mod exec;
pub mod expand;
pub mod expr;
pub mod reduce;
pub mod smt;
pub mod stage;
pub mod tensor;

pub use equiv::{prove_case, prove_case_or_full_size, CountedOn, Proof, ProveConfig, Verdict};
pub use stage::chunks::{ChunkedCuts, LoadBalanced};
pub use stage::micro::MicrobatchCut;
pub use stage::scale::CutScales;
pub use stage::{prove_staged, prove_staged_with, PlanOptions, StagedProof};

/// A value name for a node added to `g`: `base`, or `base_2`, `base_3`, ... where `g` already
/// names a value so (the stage builders and `assume:` add nodes beside the graph's own).
pub(crate) fn fresh_value_name(g: &shardproof_ir::Graph, base: &str) -> String {
    let taken: std::collections::HashSet<&str> = g
        .nodes
        .iter()
        .flat_map(|n| n.outputs.iter().map(|o| o.name.as_str()))
        .collect();
    let mut name = base.to_string();
    let mut k = 1;
    while taken.contains(name.as_str()) {
        k += 1;
        name = format!("{base}_{k}");
    }
    name
}
