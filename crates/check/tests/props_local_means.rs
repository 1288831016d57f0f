//! Property tests of the factor a local mean's claim carries (harness: `common/props.rs`): a
//! mean `nll_loss_backward` over row shards divides by the rank's own count, so each rank's
//! piece is `n` times the spec's. Its placements claim the spec's layout with that factor
//! (`PieceFactor::Times`), which the harness checks as "the pieces laid out make the spec's
//! value times the factor"; a use the factor does not pass through linearly claims nothing
//! (`PieceFactor::NotKnown`). Every claim here is checked against the interpreter.

mod common;
#[path = "common/props.rs"]
mod props;
use props::{Elem, In, Input, Program};
use shardproof_check::PieceFactor;

/// The inputs of the chained loss: a 0-d gradient `g`, log-probabilities `x` `[rows, 3]`,
/// targets `t` (never the ignored index), and a spec-valued `y` `[rows, 3]`, placed on
/// `mesh` with the rows sharded by `rows_on` (per mesh dim: shard the rows or replicate).
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
    ]
}

/// The mean loss's backward over the rows, divided by the forward's total weight.
fn chained_loss() -> Vec<String> {
    vec![
        "nf = torch.ops.aten.nll_loss_forward.default(x, t, None, 1, -100)".into(),
        "tw = nf[1]".into(),
        "lm = torch.ops.aten.nll_loss_backward.default(g, x, t, None, 1, -100, tw)".into(),
    ]
}

/// A program of the chained loss and `uses` (the same lines in spec and ranks), checking
/// `lm` and every use.
fn program(mesh: &[usize], rows_on: &[bool], uses: &[(&str, &str)]) -> Program {
    let mut body = chained_loss();
    body.extend(uses.iter().map(|(name, line)| format!("{name} = {line}")));
    let mut checked = vec![("lm".to_string(), "lm".to_string())];
    checked.extend(uses.iter().map(|(n, _)| (n.to_string(), n.to_string())));
    Program {
        mesh: mesh.to_vec(),
        inputs: inputs(2, rows_on),
        spec: body.clone(),
        ranks: vec![body],
        checked,
    }
}

/// Runs `prog` on a few seeds; returns the factors of the last run (every run's claims held).
fn factors(prog: &Program) -> Vec<PieceFactor> {
    let mut last = Vec::new();
    for seed in 1..=4 {
        let seen = props::run(prog, seed).unwrap_or_else(|e| panic!("{e}"));
        assert!(seen.skipped.is_none() && !seen.finding, "{seen:?}");
        last = seen.factors;
    }
    last
}

/// The backward of a mean nll loss over row shards: each piece is the rank's local mean,
/// `n` times the spec's shard. Claimed `Shard(0)` with the factor, which holds; over two
/// mesh dims that both shard the rows the factor is their product.
#[test]
fn a_mean_nll_loss_backward_over_row_shards_is_a_shard_times_the_mesh_size() {
    for (mesh, rows_on, factor) in [
        (vec![2], vec![true], 2),
        (vec![3], vec![true], 3),
        (vec![2, 2], vec![true, true], 4),
        (vec![2, 2], vec![true, false], 2),
    ] {
        let prog = program(&mesh, &rows_on, &[]);
        let seen = props::run(&prog, 7).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(seen.claims, 1, "{mesh:?}: {seen:?}");
        assert_eq!(seen.factors, vec![PieceFactor::Times(factor)], "{mesh:?}");
        assert!(seen.places[0].contains(&shardproof_check::Place::Shard(0)));
    }
}

/// Uses that pass the factor on linearly keep it (a negation, a scaling, a cumulative sum, a
/// zero pad, a softmax backward of it as the gradient, a sum over the rows: a partial sum
/// of local means); uses that do not (a number added, a cumulative product, a pad by one,
/// the softmax backward reading it as the output, `exp`, a square) claim nothing.
#[test]
fn uses_of_a_local_mean_keep_its_factor_only_where_linear() {
    let aten = "torch.ops.aten";
    let uses = [
        ("neg", format!("{aten}.neg.default(lm)")),
        ("scaled", format!("{aten}.mul.Tensor(lm, 3.0)")),
        ("csum", format!("{aten}.cumsum.default(lm, 1)")),
        (
            "pad0",
            format!("{aten}.constant_pad_nd.default(lm, [1, 1], 0.0)"),
        ),
        (
            "sbg",
            format!("{aten}._softmax_backward_data.default(lm, y, 1, torch.float64)"),
        ),
        ("rows", format!("{aten}.sum.dim_IntList(lm, [0])")),
        ("plus1", format!("{aten}.add.Tensor(lm, 1.0)")),
        ("cprod", format!("{aten}.cumprod.default(lm, 1)")),
        (
            "pad1",
            format!("{aten}.constant_pad_nd.default(lm, [1, 1], 1.0)"),
        ),
        (
            "sbo",
            format!("{aten}._softmax_backward_data.default(y, lm, 1, torch.float64)"),
        ),
        ("e", format!("{aten}.exp.default(lm)")),
        ("sq", format!("{aten}.mul.Tensor(lm, lm)")),
    ];
    let uses: Vec<(&str, &str)> = uses.iter().map(|(n, l)| (*n, l.as_str())).collect();
    let prog = program(&[2], &[true], &uses);
    let got = factors(&prog);
    let times = PieceFactor::Times(2);
    let none = PieceFactor::NotKnown;
    let want = [
        times, times, times, times, times, times, times, none, none, none, none, none, none,
    ];
    let named: Vec<(&str, PieceFactor)> = std::iter::once("lm")
        .chain(uses.iter().map(|u| u.0))
        .zip(got.iter().copied())
        .collect();
    assert_eq!(got, want, "{named:?}");
}

/// A local mean's rows summed (a partial sum, `n` times the spec's) and all-reduced over the
/// mesh dim that split its batch: every rank holds `n` times the spec's sum, which a
/// replicated placement does not say. The walk does not follow the reduction (a division by
/// `n` after it, or an average, would settle it): no claim.
#[test]
fn a_local_mean_all_reduced_over_its_mesh_dim_claims_nothing() {
    let f = "torch.ops._c10d_functional";
    let mut spec = chained_loss();
    spec.push("rows = torch.ops.aten.sum.dim_IntList(lm, [0])".into());
    let mut ranks = spec.clone();
    ranks.push(format!("c = {f}.all_reduce.default(rows, 'sum', 'tp')"));
    ranks.push(format!("ar = {f}.wait_tensor.default(c)"));
    let prog = Program {
        mesh: vec![2],
        inputs: inputs(2, &[true]),
        spec,
        ranks: vec![ranks],
        checked: vec![("ar".into(), "rows".into())],
    };
    let seen = props::run(&prog, 3).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(seen.factors, vec![PieceFactor::NotKnown], "{seen:?}");
    assert_eq!((seen.claims, seen.declined), (0, 1), "{seen:?}");
}

/// The divisor decides the factor: a replicated total weight (the same number on every
/// rank) is the spec's divisor, so the pieces are the spec's; class weights make each rank's
/// count weigh its own targets, so there is no common factor and no claim.
#[test]
fn the_total_weight_and_class_weights_decide_the_factor() {
    let replicated = vec![
        "tw = torch.ops.aten.full.default([], 4.0, dtype = torch.float64)".to_string(),
        "lm = torch.ops.aten.nll_loss_backward.default(g, x, t, None, 1, -100, tw)".into(),
    ];
    let prog = Program {
        mesh: vec![2],
        inputs: inputs(2, &[true]),
        spec: replicated.clone(),
        ranks: vec![replicated],
        checked: vec![("lm".into(), "lm".into())],
    };
    assert_eq!(factors(&prog), vec![PieceFactor::Spec]);
    let weighted = vec![
        "nf = torch.ops.aten.nll_loss_forward.default(x, t, w, 1, -100)".to_string(),
        "tw = nf[1]".into(),
        "lm = torch.ops.aten.nll_loss_backward.default(g, x, t, w, 1, -100, tw)".into(),
    ];
    let mut ins = inputs(2, &[true]);
    ins.push(Input::f("w", &[3], &[In::R]));
    let prog = Program {
        mesh: vec![2],
        inputs: ins,
        spec: weighted.clone(),
        ranks: vec![weighted],
        checked: vec![("lm".into(), "lm".into())],
    };
    let seen = props::run(&prog, 5).unwrap_or_else(|e| panic!("{e}"));
    assert!(seen.skipped.is_none() && !seen.finding, "{seen:?}");
    assert_eq!(seen.factors, vec![PieceFactor::NotKnown], "{seen:?}");
}

/// A local mean sent along a ring over tp while dp splits the rows: the receiver holds the
/// sender's values, the same dp piece, so the recv carries the sender's factor (dp's 2).
#[test]
fn a_received_local_mean_keeps_the_sender_s_factor() {
    let tp = 2;
    let ranks = (0..4)
        .map(|r| {
            let (row, j) = (r / tp, r % tp);
            let dst = row * tp + (j + 1) % tp;
            let src = row * tp + (j + tp - 1) % tp;
            let mut lines = chained_loss();
            lines.push(format!(
                "snd = torch.ops.shardproof_p2p.send.default(lm, {dst}, 0)"
            ));
            lines.push(format!(
                "out = torch.ops.shardproof_p2p.recv.default([2, 3], torch.float64, {src}, 0)"
            ));
            lines
        })
        .collect();
    let mut spec = chained_loss();
    spec.push("out = torch.ops.aten.clone.default(lm)".into());
    let prog = Program {
        mesh: vec![2, tp],
        inputs: inputs(2, &[true, false]),
        spec,
        ranks,
        checked: vec![("out".into(), "out".into())],
    };
    let seen = props::run(&prog, 11).unwrap_or_else(|e| panic!("{e}"));
    assert!(seen.skipped.is_none() && !seen.finding, "{seen:?}");
    assert_eq!(seen.factors, vec![PieceFactor::Times(2)], "{seen:?}");
    assert_eq!(seen.claims, 1, "{seen:?}");
}
