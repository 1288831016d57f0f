//! The report of `verify`: the verdict, the certificate or failure, the trace, and how
//! expressions are rendered in them (the CLI prints and serializes these types as they are).

use super::relation::{Impl, State};
use crate::lemmas::SCALE;
use crate::term::{Term, CAT, GET, LIST, MAX, MIN, SLICE, SUM};
use egg::{Id, RecExpr};
use shardproof_ir::{Graph as IrGraph, ValueId};

/// The verdict of a refinement check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every checked output has a clean relation (meeting the case's expectations).
    Verified,
    /// Some output has none: the report names the spec operator where relations stop.
    Refuted,
    /// Something could not be analysed (an operator without meaning, a limit).
    Inconclusive,
}

/// One checked output and its clean expression.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Certificate {
    /// Spec tensor.
    pub tensor: String,
    /// Its clean expressions over implementation tensors (simplest first).
    pub relations: Vec<String>,
}

/// Where and why refinement fails.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Failure {
    /// The checked output that has no clean relation (or misses its expectation).
    pub output: String,
    /// The spec operator where clean relations stop.
    pub operator: String,
    /// Its operator name.
    pub op: String,
    /// Where the spec graph defines it (`file:line`).
    pub graph_location: String,
    /// The captured Python source location, when recorded.
    pub source: Option<String>,
    /// Per input of that operator: its relations.
    pub inputs: Vec<(String, Vec<String>)>,
    /// What the operator's output can only be written as (not clean), when known.
    pub computed: Option<String>,
    /// Implementation operators that consume the inputs' tensors.
    pub impl_consumers: Vec<String>,
    /// A known bug class the evidence matches.
    pub hint: Option<String>,
    /// Other spec operators where clean relations stop on other paths into the same output
    /// (`name (op)`, in graph order): an output may miss its relation for more than one reason,
    /// and an inconclusive verdict names them all so the user sees every gap at once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_stops: Vec<String>,
    /// Evidence checks skipped for their size (see `evidence::misaligned_rows`) or cut off at
    /// their bounds (the search for a partial sum's reduction), said in an inconclusive reason; not serialized, so reports of cases under the limits stay as they were.
    #[serde(skip)]
    pub not_computed: Option<String>,
}

impl Failure {
    /// `; relations also stop at ...` when other paths stop too, else nothing.
    pub fn other_stops_clause(&self) -> String {
        if self.other_stops.is_empty() {
            return String::new();
        }
        const SHOWN: usize = 4;
        let mut named: Vec<String> = self
            .other_stops
            .iter()
            .take(SHOWN)
            .map(|s| format!("`{s}`"))
            .collect();
        if self.other_stops.len() > SHOWN {
            named.push(format!("{} more", self.other_stops.len() - SHOWN));
        }
        format!("; relations also stop at {}", named.join(", "))
    }
}

/// One spec operator's share of a run: the wall time of its inference on its worker thread
/// (at `--jobs 1` the walk's own time, less the in-order commit) and the path that related it.
#[derive(Clone, Debug)]
pub struct OperatorTime {
    /// Spec tensor (the node's first output).
    pub tensor: String,
    /// Its operator.
    pub op: String,
    /// Seconds its outputs' inference took.
    pub seconds: f64,
    /// How it was related: `fast`, `reused`, `pieces` (some piece reused), `inferred`, or
    /// `input` (a cut or alias, nothing inferred).
    pub path: &'static str,
    /// The attempts of full inference taken, in order: kind (`first`, `wide`, `roomier`,
    /// `moves`, `pieces`), seconds, peak e-graph size, and whether it related the value.
    pub attempts: Vec<String>,
}

/// The result of `verify`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Outcome {
    /// The verdict.
    pub verdict: Verdict,
    /// Spec operators processed.
    pub spec_operators: usize,
    /// Spec operators left unexplored because the verdict was settled before them: an earlier
    /// checked output already fails on final evidence (fast refutation, see [`crate::verify`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub operators_skipped: usize,
    /// Spec operators related by an earlier twin's relation, renamed and checked (repeated
    /// layers solved once); not in the serialized report, which stays the same with reuse off.
    #[serde(skip)]
    pub operators_reused: usize,
    /// Pieces of operators inferred piece by piece that took a sibling piece's relation over
    /// other ranks, renamed and checked (symmetric ranks solved once); not serialized either.
    #[serde(skip)]
    pub pieces_reused: usize,
    /// Spec operators related by the fast path's placement rules, with no e-graph (see
    /// [`crate::Options::fast_path`]); not serialized either. Under
    /// [`crate::Options::audit_fast_path`], those where the fast path wrote the e-graph's
    /// relation.
    #[serde(skip)]
    pub operators_fast: usize,
    /// Under [`crate::Options::audit_fast_path`]: per operator where the fast path's relation
    /// is written otherwise than the e-graph's, the spec tensor and both relations.
    #[serde(skip)]
    pub fast_path_differences: Vec<String>,
    /// Per spec operator inferred, in node order, where its time went (see [`OperatorTime`]);
    /// not serialized (timings differ run to run): for profiling which operators take the time.
    #[serde(skip)]
    pub operator_times: Vec<OperatorTime>,
    /// Per checked output, its certificate (when verified).
    pub certificate: Vec<Certificate>,
    /// Why it failed (refuted).
    pub failure: Option<Failure>,
    /// Why it is inconclusive.
    pub reason: Option<String>,
    /// Seconds taken.
    pub seconds: f64,
    /// Number of lemmas in the library.
    pub lemmas: usize,
    /// The checked output whose clean relation differs from the case's expectation, when that
    /// is why the verdict is inconclusive: the caller may settle it by running the case on
    /// concrete values (a numeric mismatch is a counterexample; agreement leaves it undecided).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmet_expectation: Option<String>,
    /// Per spec operator, in order, its relation (only with [`Options::trace`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<TraceStep>,
}

impl Outcome {
    /// An inconclusive outcome with nothing inferred yet: the start of every run of the
    /// engine, and what a caller reports for a run it stopped (`reason: None` until one is
    /// known).
    ///
    /// ```
    /// let o = shardproof_refine::Outcome::inconclusive(Some("stopped".into()), 0);
    /// assert_eq!(o.verdict, shardproof_refine::Verdict::Inconclusive);
    /// assert!(o.certificate.is_empty());
    /// ```
    pub fn inconclusive(reason: Option<String>, lemmas: usize) -> Outcome {
        Outcome {
            verdict: Verdict::Inconclusive,
            spec_operators: 0,
            operators_skipped: 0,
            operators_reused: 0,
            pieces_reused: 0,
            operators_fast: 0,
            fast_path_differences: Vec::new(),
            operator_times: Vec::new(),
            certificate: Vec::new(),
            failure: None,
            reason,
            seconds: 0.0,
            lemmas,
            unmet_expectation: None,
            trace: Vec::new(),
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One spec tensor's relation, as inference found it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TraceStep {
    /// Spec tensor.
    pub tensor: String,
    /// Its operator.
    pub op: String,
    /// `clean`, `unclean`, `unrelated` or `blocked`.
    pub status: &'static str,
    /// The simplest expression, or why there is none.
    pub detail: String,
}

/// A refutation where the implementation's checked tensors depend on module constants of
/// unknown value is inconclusive: the constants might hold exactly the values that make the
/// programs agree.
pub(super) fn undecided_by_constants(mut o: Outcome, imp: &Impl) -> Outcome {
    if !imp.unknown_consts.is_empty() {
        let mut names: Vec<String> = imp
            .unknown_consts
            .iter()
            .map(|c| format!("{} (rank {})", imp.name(*c), c.rank.unwrap_or(0)))
            .collect();
        names.sort();
        let at = o
            .failure
            .as_ref()
            .map_or(String::new(), |f| format!(" at `{}`", f.operator));
        o.reason = Some(format!(
            "relations stop{at}, but the implementation's checked tensors depend on module constants whose values are not in the graph text ({}); state them in the case's `constants:` section to decide",
            names.join(", ")
        ));
        o.verdict = Verdict::Inconclusive;
        // A run needs the same values, so it cannot settle an expectation either.
        o.unmet_expectation = None;
    }
    o
}

pub(super) fn trace_step(spec: &IrGraph, v: ValueId, s: &State) -> TraceStep {
    let (status, detail) = match s {
        State::Related(r) => (
            if r.clean { "clean" } else { "unclean" },
            r.exprs
                .first()
                .map(|e| render(e, e.as_ref().len() - 1))
                .unwrap_or_default(),
        ),
        State::Unrelated(m) => ("unrelated", m.clone()),
        State::Lost(m) => ("lost", m.clone()),
        State::Blocked(m) => ("blocked", m.clone()),
    };
    TraceStep {
        tensor: spec.value_name(v).to_string(),
        op: spec.nodes[v.node]
            .op()
            .map(|o| o.to_string())
            .unwrap_or_default(),
        status,
        detail,
    }
}

/// A factor `p/q` as text: a fraction of small terms as it is (`* 1/4`); a binary fraction
/// such as the `m / 2^k` a float literal is, as that float (`* 0.35355339059327373`, or
/// `/ 0.35355339059327373` for its inverse), which is exact; any other as the fraction.
pub(super) fn factor_text(p: i64, q: i64) -> String {
    const SMALL: u64 = 1 << 20;
    if p.unsigned_abs() <= SMALL && q.unsigned_abs() <= SMALL {
        return format!("* {p}/{q}");
    }
    let exact = |n: i64| n.unsigned_abs() < (1 << 53);
    if q > 0 && q.count_ones() == 1 && exact(p) {
        return format!("* {}", p as f64 / q as f64);
    }
    if p != 0 && p.unsigned_abs().is_power_of_two() && q > 0 && exact(q) {
        return format!("/ {}", q as f64 / p as f64);
    }
    format!("* {p}/{q}")
}

/// A readable rendering of node `i` of an expression.
pub fn render(e: &RecExpr<Term>, i: usize) -> String {
    let nodes = e.as_ref();
    let r = |id: &Id| render(e, usize::from(*id));
    match &nodes[i] {
        Term::Num(n) => n.to_string(),
        Term::Op(s, kids) => {
            let s = s.as_str();
            if let Some((rank, name)) = crate::term::parse_leaf(s) {
                return format!("r{rank}.{name}");
            }
            match s {
                CAT => format!(
                    "cat(dim={}; {})",
                    r(&kids[0]),
                    kids[1..].iter().map(r).collect::<Vec<_>>().join(", ")
                ),
                SUM | MAX | MIN => {
                    format!("{s}({})", kids.iter().map(r).collect::<Vec<_>>().join(", "))
                }
                SLICE => format!(
                    "{}[dim {}: {}..{}]",
                    r(&kids[3]),
                    r(&kids[0]),
                    r(&kids[1]),
                    r(&kids[2])
                ),
                GET => format!("{}[{}]", r(&kids[1]), r(&kids[0])),
                SCALE => match (&nodes[usize::from(kids[0])], &nodes[usize::from(kids[1])]) {
                    (Term::Num(p), Term::Num(q)) => {
                        format!("({} {})", r(&kids[2]), factor_text(*p, *q))
                    }
                    _ => format!("({} * {}/{})", r(&kids[2]), r(&kids[0]), r(&kids[1])),
                },
                LIST => format!("[{}]", kids.iter().map(r).collect::<Vec<_>>().join(", ")),
                _ if kids.is_empty() => s
                    .split_once(':')
                    .map_or(s.to_string(), |(_, v)| v.to_string()),
                _ => {
                    let short = s.strip_prefix("aten.").unwrap_or(s);
                    let short = short.strip_suffix(".default").unwrap_or(short);
                    format!(
                        "{short}({})",
                        kids.iter().map(r).collect::<Vec<_>>().join(", ")
                    )
                }
            }
        }
    }
}

/// The expressions a certificate shows: a tensor that equals implementation tensors
/// outright is shown as those (its replicas); other expressions only when there are none.
pub(super) fn certificate_exprs(exprs: &[RecExpr<Term>]) -> impl Iterator<Item = &RecExpr<Term>> {
    let leaves = exprs.iter().any(|e| e.as_ref().len() == 1);
    exprs
        .iter()
        .filter(move |e| !leaves || e.as_ref().len() == 1)
}
