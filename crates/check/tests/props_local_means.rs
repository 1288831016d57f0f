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

/// A rank program of the chained loss, its rows summed (`rows`, a partial sum of local
/// means on the one mesh dim, `n` times the spec's sum) and `tail` after it; the spec has the
/// loss and the row sum alone. Checks `out` against the spec's `rows`.
fn reduced_rows(n: usize, tail: &[String]) -> Program {
    let mut spec = chained_loss();
    spec.push("rows = torch.ops.aten.sum.dim_IntList(lm, [0])".into());
    let mut ranks = spec.clone();
    ranks.extend(tail.iter().cloned());
    Program {
        mesh: vec![n],
        inputs: inputs(2, &[true]),
        spec,
        ranks: vec![ranks],
        checked: vec![("out".into(), "rows".into())],
    }
}

/// The all-reduce of `rows` over the mesh dim by `op`, named `out` (or `ar` where `then`
/// follows, `then` reading `ar`).
fn all_reduced(op: &str, then: Option<&str>) -> Vec<String> {
    let f = "torch.ops._c10d_functional";
    let name = if then.is_some() { "ar" } else { "out" };
    let mut lines = vec![
        format!("c = {f}.all_reduce.default(rows, '{op}', 'tp')"),
        format!("{name} = {f}.wait_tensor.default(c)"),
    ];
    lines.extend(then.map(|t| format!("out = {t}")));
    lines
}

/// One seed's claim of `prog`: its placements and factor, and whether it was checked
/// (`claims == 1`) against the interpreter.
fn claim_of(prog: &Program, seed: u64) -> (Vec<shardproof_check::Place>, PieceFactor, bool) {
    let seen = props::run(prog, seed).unwrap_or_else(|e| panic!("{e}"));
    assert!(seen.skipped.is_none() && !seen.finding, "{seen:?}");
    (seen.places[0].clone(), seen.factors[0], seen.claims == 1)
}

/// Where the factor is settled: an all-reduce sum over the mesh dim of a partial sum of
/// local means is replicated and `n` times the spec's value (every rank holds `n` times the
/// spec's sum); a division by exactly `n` (or a product with `1/n`) that the spec does not
/// make brings it back to the spec's value; an all-reduce average gives the spec's value.
/// Every claim with a placement that claims values is checked against the interpreter.
#[test]
fn an_all_reduce_of_local_means_and_a_division_by_the_mesh_size_settle_the_factor() {
    use shardproof_check::Place;
    let aten = "torch.ops.aten";
    for n in [2usize, 3, 4] {
        let summed = reduced_rows(n, &all_reduced("sum", None));
        for seed in 1..=3 {
            assert_eq!(
                claim_of(&summed, seed),
                (vec![Place::Replicate], PieceFactor::Times(n as u64), true),
                "sum over {n}"
            );
        }
        let divided = format!("{aten}.div.Tensor(ar, {n})");
        let times_inverse = format!("{aten}.mul.Tensor(ar, {})", 1.0 / n as f64);
        for then in [divided, times_inverse] {
            let prog = reduced_rows(n, &all_reduced("sum", Some(&then)));
            for seed in 1..=3 {
                assert_eq!(
                    claim_of(&prog, seed),
                    (vec![Place::Replicate], PieceFactor::Spec, true),
                    "{then} over {n}"
                );
            }
        }
        // The average's factor is the spec's; the rules read an average of partial sums as
        // `Unknown` (they do not read the factor), so nothing is claimed of its values yet.
        let averaged = reduced_rows(n, &all_reduced("avg", None));
        for seed in 1..=3 {
            assert_eq!(
                claim_of(&averaged, seed),
                (vec![Place::Unknown], PieceFactor::Spec, false),
                "avg over {n}"
            );
        }
    }
}

/// A division by anything but the factor does not settle it: by half the mesh size, by
/// another number than the mesh size, a product by another number than its inverse, or by
/// the mesh size where the spec divides by it too. None claims the spec's value (each claim still checked against the
/// interpreter where one is made).
#[test]
fn a_division_by_another_number_than_the_factor_never_claims_the_spec() {
    let aten = "torch.ops.aten";
    let wrong = [
        (4, format!("{aten}.div.Tensor(ar, 2)")),
        (2, format!("{aten}.div.Tensor(ar, 3)")),
        (2, format!("{aten}.mul.Tensor(ar, 0.25)")),
        (2, format!("{aten}.mul.Tensor(ar, 2.0)")),
    ];
    for (n, then) in &wrong {
        let prog = reduced_rows(*n, &all_reduced("sum", Some(then)));
        for seed in 1..=3 {
            let (places, factor, _) = claim_of(&prog, seed);
            assert_ne!(factor, PieceFactor::Spec, "{then} over {n}: {places:?}");
        }
    }
    // Summed a second time: the copies of a value 2 times the spec's summed are 4 times it
    // (the rules find the sum of a replicated value; the factor claims nothing either).
    let f = "torch.ops._c10d_functional";
    let again = [
        format!("c2 = {f}.all_reduce.default(ar, 'sum', 'tp')"),
        format!("{f}.wait_tensor.default(c2)"),
    ];
    let mut tail = all_reduced("sum", Some(&again[1]));
    tail.insert(2, again[0].clone());
    let prog = reduced_rows(2, &tail);
    let seen = props::run(&prog, 1).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        seen.factors,
        vec![PieceFactor::NotKnown],
        "summed twice: {seen:?}"
    );
    // The spec divides its sum by 2 as well: the rank's division is the spec's own, so the
    // rank's value stays 2 times the spec's.
    let mut spec = chained_loss();
    spec.push("rows = torch.ops.aten.sum.dim_IntList(lm, [0])".into());
    let mut ranks = spec.clone();
    spec.push(format!("out = {aten}.div.Tensor(rows, 2)"));
    ranks.extend(all_reduced(
        "sum",
        Some(&format!("{aten}.div.Tensor(ar, 2)")),
    ));
    let prog = Program {
        mesh: vec![2],
        inputs: inputs(2, &[true]),
        spec,
        ranks: vec![ranks],
        checked: vec![("out".into(), "out".into())],
    };
    for seed in 1..=3 {
        let (places, factor, _) = claim_of(&prog, seed);
        assert_ne!(
            factor,
            PieceFactor::Spec,
            "the spec's own division: {places:?}"
        );
    }
}

/// Divided by the mesh size twice after the all-reduce (or then multiplied by 3): the first
/// division settles the factor, the second makes a share the spec lacks (`Replicate()` with a
/// `scaled` record, each copy the spec's over `n`), the product another multiple. Whatever is claimed is checked against the interpreter
/// (`claim_of` panics on a contradicted claim), and the spec's value is not claimed.
#[test]
fn a_second_division_by_the_mesh_size_claims_no_spec_value() {
    let aten = "torch.ops.aten";
    for n in [2usize, 4] {
        for then in [
            format!("div.Tensor(half, {n})"),
            "mul.Tensor(half, 3.0)".into(),
        ] {
            let mut tail = all_reduced("sum", Some(&format!("{aten}.div.Tensor(ar, {n})")));
            let last = tail.len() - 1;
            tail[last] = format!("half = {aten}.div.Tensor(ar, {n})");
            tail.push(format!("out = {aten}.{then}"));
            let prog = reduced_rows(n, &tail);
            for seed in 1..=3 {
                let (places, factor, _) = claim_of(&prog, seed);
                assert_ne!(factor, PieceFactor::Spec, "{then} over {n}: {places:?}");
            }
        }
    }
    // The twice-divided value times a local mean: the product is the spec's (n times, over
    // n), not the local mean's factor (what is claimed is checked by the interpreter).
    for n in [2usize, 4] {
        let mut spec = chained_loss();
        spec.push("rows = torch.ops.aten.sum.dim_IntList(lm, [0])".into());
        let mut ranks = spec.clone();
        spec.push(format!("out = {aten}.mul.Tensor(lm, rows)"));
        let mut tail = all_reduced("sum", Some(&format!("{aten}.div.Tensor(ar, {n})")));
        let last = tail.len() - 1;
        tail[last] = format!("half = {aten}.div.Tensor(ar, {n})");
        tail.push(format!("q = {aten}.div.Tensor(half, {n})"));
        tail.push(format!("out = {aten}.mul.Tensor(lm, q)"));
        ranks.extend(tail);
        let prog = Program {
            mesh: vec![n],
            inputs: inputs(2, &[true]),
            spec,
            ranks: vec![ranks],
            checked: vec![("out".into(), "out".into())],
        };
        for seed in 1..=3 {
            claim_of(&prog, seed);
        }
    }
    // No local mean at all: a replicated value the ranks divide by the mesh size where the
    // spec does not is a share of the spec's, not its value.
    let prog = Program {
        mesh: vec![2],
        inputs: inputs(2, &[true]),
        spec: vec!["out = torch.ops.aten.clone.default(g)".into()],
        ranks: vec![vec![format!("out = {aten}.div.Tensor(g, 2)")]],
        checked: vec![("out".into(), "out".into())],
    };
    for seed in 1..=3 {
        let (places, factor, _) = claim_of(&prog, seed);
        assert_ne!(factor, PieceFactor::Spec, "a share: {places:?}");
    }
}
