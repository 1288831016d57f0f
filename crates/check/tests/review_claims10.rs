//! Adversarial review (check-review10) of the piece factor settled in the claim walk
//! (`settle_by_all_reduce`, `settle_by_scaling`, `piece_factor`, `record_local_means`), the
//! nll local mean's factor under `assume: ignore-index: unused`, `maximum`/`minimum` keeping
//! `Partial(max|min)`, `mse_loss_backward`'s `Times(n)` and received local means. Every
//! program runs through the property harness (`common/props.rs`), which checks each claimed
//! placement and factor against the reference interpreter: a test fails where a claim is
//! contradicted by the values (the harness's `Err`).

mod common;
#[path = "common/props.rs"]
mod props;
use props::{Elem, In, Input, Program};
use shardproof_check::PieceFactor;

const A: &str = "torch.ops.aten";
const F: &str = "torch.ops._c10d_functional";

/// The inputs of the chained loss: a 0-d gradient `g`, log-probabilities `x` `[rows, 3]`,
/// targets `t` (classes 0..3, never the ignored index), a spec-valued `y` `[rows, 3]` placed
/// like `x`, class weights `w` `[3]` (replicated, drawn in [-1, 1)), a boolean mask `m` like
/// `x`, and `idx` `[rows, 3]` column indices like `x`. Rows sharded per mesh dim by `rows_on`.
fn inputs(rows: usize, rows_on: &[bool]) -> Vec<Input> {
    let split: Vec<In> = rows_on
        .iter()
        .map(|&s| if s { In::S(0) } else { In::R })
        .collect();
    let replicated = vec![In::R; rows_on.len()];
    vec![
        Input::f("g", &[], &replicated),
        Input::f("x", &[rows, 3], &split),
        Input {
            name: "t".into(),
            elem: Elem::Int(0, 3),
            local: vec![rows],
            places: split.clone(),
        },
        Input::f("y", &[rows, 3], &split),
        Input::f("w", &[3], &replicated),
        Input {
            name: "m".into(),
            elem: Elem::Bool,
            local: vec![rows, 3],
            places: split.clone(),
        },
        Input {
            name: "idx".into(),
            elem: Elem::Int(0, 3),
            local: vec![rows, 3],
            places: split,
        },
    ]
}

/// The mean nll loss's backward over the rows, divided by the forward's total weight.
fn chained_loss() -> Vec<String> {
    vec![
        format!("nf = {A}.nll_loss_forward.default(x, t, None, 1, -100)"),
        "tw = nf[1]".into(),
        format!("lm = {A}.nll_loss_backward.default(g, x, t, None, 1, -100, tw)"),
    ]
}

/// A program whose spec and ranks both run `body`, checking `out`.
fn same_lines(mesh: &[usize], rows_on: &[bool], body: Vec<String>) -> Program {
    Program {
        mesh: mesh.to_vec(),
        inputs: inputs(2, rows_on),
        spec: body.clone(),
        ranks: vec![body],
        checked: vec![("out".into(), "out".into())],
    }
}

/// The chained loss then `out = <line>` (spec and ranks alike) on `mesh`.
fn use_of_lm(mesh: &[usize], rows_on: &[bool], line: &str) -> Program {
    let mut body = chained_loss();
    body.push(format!("out = {line}"));
    same_lines(mesh, rows_on, body)
}

/// What one program's last run saw: the checked value's factor, the claims checked, and
/// whether the checker reported a finding.
type Outcome = (PieceFactor, usize, bool);

/// Runs `prog` on seeds 1..=3: `Err` with the harness's message where a claim is
/// contradicted by the interpreter; else the last run's outcome. Panics where the instance
/// was skipped (the program must run).
fn run(what: &str, prog: &Program) -> Result<Outcome, String> {
    let mut last = (PieceFactor::NotKnown, 0, false);
    for seed in 1..=3 {
        let seen = props::run(prog, seed)
            .map_err(|e| format!("{what}: a claim the interpreter contradicts: {e}"))?;
        assert!(seen.skipped.is_none(), "{what}: skipped: {seen:?}");
        last = (
            seen.factors
                .first()
                .copied()
                .unwrap_or(PieceFactor::NotKnown),
            seen.claims,
            seen.finding,
        );
    }
    Ok(last)
}

/// [`run`], panicking where a claim is contradicted.
fn holds(what: &str, prog: &Program) -> Outcome {
    run(what, prog).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs every `(what, program)`; panics naming each whose claim the interpreter contradicts.
fn all_hold(progs: &[(String, Program)]) {
    let wrong: Vec<String> = progs
        .iter()
        .filter_map(|(what, prog)| run(what, prog).err())
        .collect();
    assert!(
        wrong.is_empty(),
        "{} false claim(s):\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// A rank program of the chained loss and its rows summed (`rows`), then `tail`; the spec
/// has the loss, the row sum and `out = <spec_out>`. Checks `out` on a mesh `[n]`.
fn rows_then(n: usize, spec_out: &str, tail: &[String]) -> Program {
    let mut spec = chained_loss();
    spec.push(format!("rows = {A}.sum.dim_IntList(lm, [0])"));
    let mut ranks = spec.clone();
    spec.push(format!("out = {spec_out}"));
    ranks.extend(tail.iter().cloned());
    Program {
        mesh: vec![n],
        inputs: inputs(2, &[true]),
        spec,
        ranks: vec![ranks],
        checked: vec![("out".into(), "out".into())],
    }
}

/// The all-reduce of `x` by `op` over tp, waited on as `name`.
fn all_reduce(x: &str, op: &str, name: &str) -> [String; 2] {
    [
        format!("c_{name} = {F}.all_reduce.default({x}, '{op}', 'tp')"),
        format!("{name} = {F}.wait_tensor.default(c_{name})"),
    ]
}

// ---------------------------------------------------------------------------------------
// Bugs: each test fails today with the harness's message (the claim, the program, the
// placements) where the interpreter contradicts a claim.

/// A number added or filled in by keyword is a term of the spec's own beside a local mean,
/// as it is by position (`add(lm, 1.0)` claims nothing): `lm + 1` is not 2 times `spec + 1`.
/// The walk (`engine/local_means.rs`, the `elementwise-add`, `where` and `pad` arms) reads
/// the number only by position, so each of these claims `Shard(0)` with `Times(2)`.
#[test]
fn a_number_term_passed_by_keyword_is_the_spec_s_own() {
    let lines = [
        format!("{A}.add.Tensor(lm, other = 1.0)"),
        format!("{A}.rsub.Scalar(lm, other = 1.0)"),
        format!("{A}.where.ScalarOther(m, lm, other = 1.0)"),
        format!("{A}.constant_pad_nd.default(lm, [1, 1], value = 1.0)"),
    ];
    let progs: Vec<(String, Program)> = lines
        .iter()
        .map(|l| (l.clone(), use_of_lm(&[2], &[true], l)))
        .collect();
    all_hold(&progs);
}

/// `aten.pad(x, pad, mode, value)`: its fill is the fourth argument (the third is the mode),
/// so a pad by 1.0 is read as a pad by zero and keeps the factor (`Times(2)`, false).
#[test]
fn a_generic_pad_s_fill_is_its_fourth_argument() {
    let line = format!("{A}.pad.default(lm, [1, 1], 'constant', 1.0)");
    holds(&line, &use_of_lm(&[2], &[true], &line));
}

/// `scatter_reduce(.., 'prod')` multiplies the written values into the tensor: with a local
/// mean on both sides the elements are `n²` times the spec's, not `n` (the walk's `scatter`
/// arm reads every scatter as one sum of its terms).
#[test]
fn a_scatter_reduce_product_multiplies_the_factors() {
    let line = format!("{A}.scatter_reduce.two(lm, 1, idx, lm, 'prod', include_self = True)");
    holds(&line, &use_of_lm(&[2], &[true], &line));
}

/// The forward's total weight with class weights is each rank's weighted count: the
/// backward (without weights) divides each rank by its own weighted sum, no common factor.
/// `forward_count` checks the forward's target and output but not its weight, so the
/// backward claims `Shard(0)` with `Times(2)`, which the interpreter contradicts.
#[test]
fn a_weighted_forward_s_total_weight_is_no_count() {
    let body = vec![
        format!("nf = {A}.nll_loss_forward.default(x, t, w, 1, -100)"),
        "tw = nf[1]".into(),
        format!("out = {A}.nll_loss_backward.default(g, x, t, None, 1, -100, tw)"),
    ];
    holds("forward weighted", &same_lines(&[2], &[true], body));
}

/// `maximum` of a partial maximum and a *share* (a replicated value the ranks divide by
/// the mesh size where the spec does not: each copy the spec's over n) is no partial
/// maximum of the spec's value; `extremum` lets any `Replicate` operand join without
/// reading its `scaled` record, and the claim's factor is `Spec`.
#[test]
fn a_maximum_beside_a_share_claims_no_partial_max() {
    let spec = vec![
        format!("mx = {A}.amax.default(x, [0])"),
        format!("out = {A}.maximum.default(mx, w)"),
    ];
    let ranks = vec![
        format!("mx = {A}.amax.default(x, [0])"),
        format!("h = {A}.div.Tensor(w, 2)"),
        format!("out = {A}.maximum.default(mx, h)"),
    ];
    let prog = Program {
        mesh: vec![2],
        inputs: inputs(2, &[true]),
        spec,
        ranks: vec![ranks],
        checked: vec![("out".into(), "out".into())],
    };
    holds("maximum(mx, w / 2)", &prog);
}

/// `all_reduce(sum) / n` of a local mean's row sums is the spec's sum (the walk settles the
/// factor, rightly claimed `Spec`), but the rules still read the division as a share (a
/// replicated value divided by n: its copies sum to the undivided value). Summed over tp
/// again, the share is lifted: `Replicate()` of the spec's value is claimed, while every
/// rank holds n times it. The walk's answer overrides the share record for the divided
/// value only (`piece_factor`), not for the rules reading it.
#[test]
fn a_settled_sum_summed_again_is_no_lifted_share() {
    let mut tail: Vec<String> = all_reduce("rows", "sum", "ar").into();
    tail.push(format!("half = {A}.div.Tensor(ar, 2)"));
    tail.extend(all_reduce("half", "sum", "out"));
    let spec_out = format!("{A}.clone.default(rows)");
    holds(
        "all_reduce(all_reduce(rows) / 2)",
        &rows_then(2, &spec_out, &tail),
    );
}

/// Outside the recent changes, found on the way (it reaches the new `maximum` rule's
/// operands): `neg` is registered as a linear unary operator, whose merge keeps a single
/// partial of any reduction, so `neg(Partial(max))` is claimed `Partial(max)`; it is the
/// partial minimum of the negated values.
#[test]
fn a_negated_partial_max_is_no_partial_max() {
    let body = vec![
        format!("mx = {A}.amax.default(x, [0])"),
        format!("out = {A}.neg.default(mx)"),
    ];
    holds("neg(amax)", &same_lines(&[2], &[true], body));
}

/// A cast to an integer type truncates: `trunc(2a)` is not `2 trunc(a)`. The walk passes a
/// factor through the whole `linear-unary` family, `_to_copy` and `to` included, so the
/// truncated local mean (scaled by 10 so that it has integer parts) claims `Times(2)`.
#[test]
fn a_cast_to_an_integer_type_does_not_keep_the_factor() {
    let progs: Vec<(String, Program)> = [
        format!("{A}._to_copy.default(s10, dtype = torch.int64)"),
        format!("{A}.to.dtype(s10, torch.int64)"),
    ]
    .into_iter()
    .map(|line| {
        let mut body = chained_loss();
        body.push(format!("s10 = {A}.mul.Tensor(lm, 10.0)"));
        body.push(format!("out = {line}"));
        (line, same_lines(&[2], &[true], body))
    })
    .collect();
    all_hold(&progs);
}

/// The same as [`a_settled_sum_summed_again_is_no_lifted_share`] through a message: the
/// settled sum is sent to the other tp rank and summed there. The recv keeps the sender's
/// `scaled` record, so the receiver lifts it as a share: `Replicate()` of the spec's value
/// claimed, every rank holding twice it.
#[test]
fn a_settled_sum_received_then_summed_is_no_lifted_share() {
    let ranks: Vec<Vec<String>> = (0..2)
        .map(|r| {
            let mut l = chained_loss();
            l.push(format!("rows = {A}.sum.dim_IntList(lm, [0])"));
            l.extend(all_reduce("rows", "sum", "ar"));
            l.push(format!("half = {A}.div.Tensor(ar, 2)"));
            let p2p = "torch.ops.shardproof_p2p";
            l.push(format!("snd = {p2p}.send.default(half, {}, 0)", 1 - r));
            l.push(format!(
                "rv = {p2p}.recv.default([3], torch.float64, {}, 0)",
                1 - r
            ));
            l.extend(all_reduce("rv", "sum", "out"));
            l
        })
        .collect();
    let mut spec = chained_loss();
    spec.push(format!("rows = {A}.sum.dim_IntList(lm, [0])"));
    spec.push(format!("out = {A}.clone.default(rows)"));
    let prog = Program {
        mesh: vec![2],
        inputs: inputs(2, &[true]),
        spec,
        ranks,
        checked: vec![("out".into(), "out".into())],
    };
    holds("all_reduce(recv(all_reduce(rows) / 2))", &prog);
}

// ---------------------------------------------------------------------------------------
// Attacks the engine survives (regression tests).

/// The forward's total weight summed over dp, which does not split the rows (equal copies:
/// the divisor is n_dp times the rank's count): `forward_count` follows the all-reduce, but
/// the rules find the sum of a replicated value, so nothing is claimed.
#[test]
fn a_total_weight_summed_over_equal_copies_claims_nothing() {
    let body = vec![
        format!("nf = {A}.nll_loss_forward.default(x, t, None, 1, -100)"),
        "tw0 = nf[1]".into(),
        format!("c = {F}.all_reduce.default(tw0, 'sum', 'dp')"),
        format!("tw = {F}.wait_tensor.default(c)"),
        format!("out = {A}.nll_loss_backward.default(g, x, t, None, 1, -100, tw)"),
    ];
    let (_, claims, finding) = holds(
        "tw summed over dp",
        &same_lines(&[2, 2], &[false, true], body),
    );
    assert!(finding && claims == 0, "{claims} claims, finding {finding}");
}

/// The rank's factor is read over the spec's at the same position: the spec divides its sum
/// by 4, the ranks their all-reduced sum (2 times the spec's) by 8: the spec's value, and
/// claimed so; the ranks dividing by 4 like the spec stay 2 times it.
#[test]
fn a_division_is_read_against_the_spec_s_own() {
    let spec_out = format!("{A}.div.Tensor(rows, 4)");
    for (by, want) in [(8, PieceFactor::Spec), (4, PieceFactor::Times(2))] {
        let mut tail: Vec<String> = all_reduce("rows", "sum", "ar").into();
        tail.push(format!("out = {A}.div.Tensor(ar, {by})"));
        let (factor, claims, _) = holds(&format!("/ {by}"), &rows_then(2, &spec_out, &tail));
        assert_eq!((factor, claims), (want, 1), "/ {by}");
    }
}

/// A partial sum of local means divided by n before its all-reduce (sum: the spec's sum,
/// right; average: half of it, wrong): whatever is claimed holds.
#[test]
fn a_partial_divided_before_its_reduction_claims_nothing_false() {
    let spec_out = format!("{A}.clone.default(rows)");
    for op in ["sum", "avg"] {
        let mut tail = vec![format!("q = {A}.div.Tensor(rows, 2)")];
        tail.extend(all_reduce("q", op, "out"));
        holds(op, &rows_then(2, &spec_out, &tail));
    }
}

/// `mse_loss_backward` with its reduction by keyword over rows split on dp and tp: the
/// shard with `Times(4)`, which holds; `maximum` of partial maxima over different mesh dims
/// (one over dp, one over tp) is a partial maximum on both, which holds.
#[test]
fn an_mse_by_keyword_and_extrema_over_two_mesh_dims_hold() {
    let body = vec![format!(
        "out = {A}.mse_loss_backward.default(g, x, y, reduction = 1)"
    )];
    let got = holds("mse", &same_lines(&[2, 2], &[true, true], body));
    assert_eq!((got.0, got.1), (PieceFactor::Times(4), 1), "mse");
    let body = vec![
        format!("ma = {A}.amax.default(a, [0])"),
        format!("mb = {A}.amax.default(b, [0])"),
        format!("out = {A}.maximum.default(ma, mb)"),
    ];
    let prog = Program {
        mesh: vec![2, 2],
        inputs: vec![
            Input::f("a", &[2, 3], &[In::S(0), In::R]),
            Input::f("b", &[2, 3], &[In::R, In::S(0)]),
        ],
        spec: body.clone(),
        ranks: vec![body],
        checked: vec![("out".into(), "out".into())],
    };
    let got = holds("maximum over two mesh dims", &prog);
    assert_eq!((got.0, got.1), (PieceFactor::Spec, 1), "maximum");
}
