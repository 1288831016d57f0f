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

/// Runs `prog` on seeds 1..=3: panics with the harness's message where a claim is
/// contradicted by the interpreter; returns the last run's factor and claim count.
fn holds(what: &str, prog: &Program) -> (PieceFactor, usize, bool) {
    let mut last = (PieceFactor::NotKnown, 0, false);
    for seed in 1..=3 {
        let seen = props::run(prog, seed)
            .unwrap_or_else(|e| panic!("{what}: a claim the interpreter contradicts: {e}"));
        assert!(seen.skipped.is_none(), "{what}: skipped: {seen:?}");
        last = (
            seen.factors.first().copied().unwrap_or(PieceFactor::NotKnown),
            seen.claims,
            seen.finding,
        );
    }
    last
}

// ---------------------------------------------------------------------------------------
// Probes (to be sorted into bugs and survivors).

#[test]
fn probe_add_number_by_keyword() {
    holds(
        "add(lm, other = 1.0)",
        &use_of_lm(&[2], &[true], &format!("{A}.add.Tensor(lm, other = 1.0)")),
    );
}

#[test]
fn probe_rsub_number_by_keyword() {
    holds(
        "rsub(lm, other = 1.0)",
        &use_of_lm(&[2], &[true], &format!("{A}.rsub.Scalar(lm, other = 1.0)")),
    );
}

#[test]
fn probe_pad_value_by_keyword() {
    holds(
        "constant_pad_nd(lm, [1, 1], value = 1.0)",
        &use_of_lm(
            &[2],
            &[true],
            &format!("{A}.constant_pad_nd.default(lm, [1, 1], value = 1.0)"),
        ),
    );
}

#[test]
fn probe_pad_generic_value() {
    holds(
        "pad(lm, [1, 1], 'constant', 1.0)",
        &use_of_lm(
            &[2],
            &[true],
            &format!("{A}.pad.default(lm, [1, 1], 'constant', 1.0)"),
        ),
    );
}

#[test]
fn probe_where_other_by_keyword() {
    holds(
        "where(m, lm, other = 1.0)",
        &use_of_lm(
            &[2],
            &[true],
            &format!("{A}.where.ScalarOther(m, lm, other = 1.0)"),
        ),
    );
}

#[test]
fn probe_scatter_reduce_prod() {
    holds(
        "scatter_reduce(lm, 1, idx, lm, 'prod')",
        &use_of_lm(
            &[2],
            &[true],
            &format!("{A}.scatter_reduce.two(lm, 1, idx, lm, 'prod', include_self = True)"),
        ),
    );
}

#[test]
fn probe_forward_weighted_backward_not() {
    let body = vec![
        format!("nf = {A}.nll_loss_forward.default(x, t, w, 1, -100)"),
        "tw = nf[1]".into(),
        format!("out = {A}.nll_loss_backward.default(g, x, t, None, 1, -100, tw)"),
    ];
    holds("forward weighted", &same_lines(&[2], &[true], body));
}

#[test]
fn probe_total_weight_summed_over_replicated_dim() {
    let body = vec![
        format!("nf = {A}.nll_loss_forward.default(x, t, None, 1, -100)"),
        "tw0 = nf[1]".into(),
        format!("c = {F}.all_reduce.default(tw0, 'sum', 'dp')"),
        format!("tw = {F}.wait_tensor.default(c)"),
        format!("out = {A}.nll_loss_backward.default(g, x, t, None, 1, -100, tw)"),
    ];
    let r = holds("tw summed over dp", &same_lines(&[2, 2], &[false, true], body));
    eprintln!("{r:?}");
}

#[test]
fn probe_maximum_of_a_share() {
    let mesh = [2usize];
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
        mesh: mesh.to_vec(),
        inputs: inputs(2, &[true]),
        spec,
        ranks: vec![ranks],
        checked: vec![("out".into(), "out".into())],
    };
    let r = holds("maximum of a share", &prog);
    eprintln!("{r:?}");
}

#[test]
fn probe_settled_value_summed_again_as_a_share() {
    let mut spec = chained_loss();
    spec.push(format!("rows = {A}.sum.dim_IntList(lm, [0])"));
    spec.push(format!("out = {A}.clone.default(rows)"));
    let mut ranks = chained_loss();
    ranks.extend([
        format!("rows = {A}.sum.dim_IntList(lm, [0])"),
        format!("c = {F}.all_reduce.default(rows, 'sum', 'tp')"),
        format!("ar = {F}.wait_tensor.default(c)"),
        format!("half = {A}.div.Tensor(ar, 2)"),
        format!("c2 = {F}.all_reduce.default(half, 'sum', 'tp')"),
        format!("out = {F}.wait_tensor.default(c2)"),
    ]);
    let prog = Program {
        mesh: vec![2],
        inputs: inputs(2, &[true]),
        spec,
        ranks: vec![ranks],
        checked: vec![("out".into(), "out".into())],
    };
    let r = holds("settled then summed", &prog);
    eprintln!("{r:?}");
}
