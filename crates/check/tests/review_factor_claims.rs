//! Adversarial review of what `check` claims of a value beside its placements: the piece
//! factor of local means (`RankPlacements::piece_factor`, `engine/local_means.rs`), one row of
//! a replicated table (`rules/slicing.rs`), and microbatches received from one sender
//! (`recv::received_alike`) with maxima over part of the rows. Every claim is checked against
//! the reference interpreter (`common/props.rs` for placements and factors; a verdict beside
//! the run values for whole programs). Only value differences that a claim states count.

mod common;
#[path = "common/props.rs"]
mod props;
use props::{Elem, In, Input, Program, Seen};
use shardproof_check::PieceFactor;

const ATEN: &str = "torch.ops.aten";

/// The inputs of the loss: a 0-d gradient `g`, log-probabilities `x` `[rows, 3]`, targets `t`
/// drawn from `targets`, a spec-valued `y` `[rows, 3]` (rows split as `x`'s), and a replicated
/// bias `b` `[3]`; rows sharded on the mesh dims `rows_on` marks.
fn inputs(rows: usize, rows_on: &[bool], targets: Elem) -> Vec<Input> {
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
            elem: targets,
            local: vec![rows],
            places: split.clone(),
        },
        Input::f("y", &[rows, 3], &split),
        Input::f("b", &[3], &replicated),
    ]
}

/// The mean loss's backward divided by the forward's total weight.
fn chained_loss() -> Vec<String> {
    vec![
        format!("nf = {ATEN}.nll_loss_forward.default(x, t, None, 1, -100)"),
        "tw = nf[1]".into(),
        format!("lm = {ATEN}.nll_loss_backward.default(g, x, t, None, 1, -100, tw)"),
    ]
}

/// The same lines in spec and ranks, checking `checked`.
fn same_lines(mesh: &[usize], ins: Vec<Input>, body: Vec<String>, checked: &[&str]) -> Program {
    Program {
        mesh: mesh.to_vec(),
        inputs: ins,
        spec: body.clone(),
        ranks: vec![body],
        checked: checked
            .iter()
            .map(|c| (c.to_string(), c.to_string()))
            .collect(),
    }
}

/// Runs `prog` on `seeds`: panics where a claim is contradicted by the values (the harness's
/// `Err`); returns every run's sightings.
fn run_seeds(prog: &Program, seeds: std::ops::RangeInclusive<u64>) -> Vec<Seen> {
    seeds
        .map(|seed| props::run(prog, seed).unwrap_or_else(|e| panic!("seed {seed}: {e}")))
        .collect()
}

/// Asserts every run was checked (not skipped).
fn all_ran(seen: &[Seen]) {
    for s in seen {
        assert!(s.skipped.is_none(), "{s:?}");
    }
}

// ---- The divisor: what makes the local count ----

/// Targets drawn in `[-1, 3)` with `ignore_index = -1`: each rank ignores its own rows, so the
/// ranks' counts differ and no common factor relates a rank's mean to the spec's. The case
/// does not assume `ignore-index: unused` (the harness states it only where no integer input
/// can be negative), so no factor is claimed.
#[test]
fn ignored_targets_on_some_ranks_claim_no_common_factor() {
    let body = vec![
        format!("nf = {ATEN}.nll_loss_forward.default(x, t, None, 1, -1)"),
        "tw = nf[1]".into(),
        format!("lm = {ATEN}.nll_loss_backward.default(g, x, t, None, 1, -1, tw)"),
    ];
    let prog = same_lines(&[2], inputs(4, &[true], Elem::Int(-1, 3)), body, &["lm"]);
    all_ran(&run_seeds(&prog, 1..=8));
}

/// A total weight that is a partial sum but no count (`sum(y)`): the rank divides by its
/// piece of the sum, the spec by the whole; their ratio is no mesh size.
#[test]
fn a_partial_sum_divisor_that_is_no_count_claims_no_factor() {
    let body = vec![
        format!("tw = {ATEN}.sum.default(y)"),
        format!("lm = {ATEN}.nll_loss_backward.default(g, x, t, None, 1, -100, tw)"),
    ];
    let prog = same_lines(&[2], inputs(2, &[true], Elem::Int(0, 3)), body, &["lm"]);
    all_ran(&run_seeds(&prog, 1..=4));
}

/// A total weight given as a partial input on the mesh dim that splits the rows.
#[test]
fn a_partial_input_divisor_claims_no_factor() {
    let mut ins = inputs(2, &[true], Elem::Int(0, 3));
    ins.push(Input::f("w0", &[], &[In::P(shardproof_check::Red::Sum)]));
    let body = vec![format!(
        "lm = {ATEN}.nll_loss_backward.default(g, x, t, None, 1, -100, w0)"
    )];
    let prog = same_lines(&[2], ins, body, &["lm"]);
    all_ran(&run_seeds(&prog, 1..=4));
}

/// A partial divisor on a mesh dim that does not split the rows: every rank's piece of the
/// divisor differs, so its gradient does too.
#[test]
fn a_divisor_partial_on_a_dim_that_keeps_the_rows_claims_nothing_false() {
    let mut ins = inputs(2, &[true, false], Elem::Int(0, 3));
    ins.push(Input::f(
        "w0",
        &[],
        &[In::R, In::P(shardproof_check::Red::Sum)],
    ));
    let body = vec![format!(
        "lm = {ATEN}.nll_loss_backward.default(g, x, t, None, 1, -100, w0)"
    )];
    let prog = same_lines(&[2, 2], ins, body, &["lm"]);
    all_ran(&run_seeds(&prog, 1..=4));
}

/// A mean's divisor partial on a mesh dim that keeps the targets (every rank along it holds
/// the same rows), the rows split or not on another mesh dim: each rank divides by its own
/// piece of the divisor, so the gradients along that dim differ. The harness checks every
/// `Replicate()` mesh dim's ranks hold equal values even where the factor is not known (the
/// placement was claimed `Replicate()` while the factor walk disclaimed it: issue 44).
#[test]
fn a_partial_divisor_on_a_dim_that_keeps_the_targets_is_not_replicated() {
    for (mesh, rows_on, gp) in [
        (vec![2], vec![false], In::R),
        (vec![2, 2], vec![true, false], In::R),
        (vec![2, 2], vec![false, false], In::R),
        (
            vec![2, 2],
            vec![true, false],
            In::P(shardproof_check::Red::Sum),
        ),
    ] {
        let mut ins = inputs(2, &rows_on, Elem::Int(0, 3));
        let last = mesh.len() - 1;
        ins[0].places[last] = gp;
        let mut divisor = vec![In::R; mesh.len()];
        divisor[last] = In::P(shardproof_check::Red::Sum);
        ins.push(Input::f("w0", &[], &divisor));
        let body = vec![format!(
            "lm = {ATEN}.nll_loss_backward.default(g, x, t, None, 1, -100, w0)"
        )];
        let prog = same_lines(&mesh, ins, body, &["lm"]);
        for s in run_seeds(&prog, 1..=3) {
            assert!(s.skipped.is_none(), "{s:?}");
            assert!(!s.finding, "{mesh:?} {rows_on:?}: {s:?}");
            assert_ne!(
                s.places[0][last],
                shardproof_check::Place::Replicate,
                "{mesh:?} {rows_on:?}: {s:?}"
            );
        }
    }
}

/// The forward's total weight all-reduced over one of two mesh dims that split the rows: the
/// pieces are means over the rows of one dp coordinate, twice the spec's.
#[test]
fn a_total_weight_summed_over_one_of_two_row_dims_keeps_the_other_s_factor() {
    let f = "torch.ops._c10d_functional";
    let body = vec![
        format!("nf = {ATEN}.nll_loss_forward.default(x, t, None, 1, -100)"),
        "tw0 = nf[1]".into(),
        format!("c = {f}.all_reduce.default(tw0, 'sum', 'tp')"),
        format!("tw = {f}.wait_tensor.default(c)"),
        format!("lm = {ATEN}.nll_loss_backward.default(g, x, t, None, 1, -100, tw)"),
    ];
    let mut prog = same_lines(
        &[2, 2],
        inputs(2, &[true, true], Elem::Int(0, 3)),
        body,
        &["lm"],
    );
    prog.spec = chained_loss();
    let seen = run_seeds(&prog, 1..=3);
    all_ran(&seen);
    assert!(
        seen.iter().all(|s| s.factors[0] != PieceFactor::Times(4)),
        "{seen:?}"
    );
}

/// The sum reduction divides by nothing: the pieces are the spec's shard.
#[test]
fn a_sum_reduction_s_backward_is_the_spec_s_shard() {
    let body = vec![
        format!("nf = {ATEN}.nll_loss_forward.default(x, t, None, 2, -100)"),
        "tw = nf[1]".into(),
        format!("lm = {ATEN}.nll_loss_backward.default(g, x, t, None, 2, -100, tw)"),
    ];
    let prog = same_lines(&[2], inputs(2, &[true], Elem::Int(0, 3)), body, &["lm"]);
    all_ran(&run_seeds(&prog, 1..=3));
}

/// The reduction and the total weight passed by keyword: the same local mean.
#[test]
fn a_mean_backward_with_keyword_arguments_keeps_its_factor() {
    let body = vec![
        format!("nf = {ATEN}.nll_loss_forward.default(x, t, None, 1, -100)"),
        "tw = nf[1]".into(),
        format!(
            "lm = {ATEN}.nll_loss_backward.default(g, x, t, None, reduction = 1, ignore_index = -100, total_weight = tw)"
        ),
    ];
    let prog = same_lines(&[2], inputs(2, &[true], Elem::Int(0, 3)), body, &["lm"]);
    let seen = run_seeds(&prog, 1..=3);
    all_ran(&seen);
    assert_eq!(seen[0].factors, vec![PieceFactor::Times(2)], "{seen:?}");
}

/// Class weights passed by keyword: each rank's count weighs its own targets.
#[test]
fn class_weights_by_keyword_claim_no_common_factor() {
    let body = vec![
        format!("nf = {ATEN}.nll_loss_forward.default(x, t, weight = b, reduction = 1, ignore_index = -100)"),
        "tw = nf[1]".into(),
        format!(
            "lm = {ATEN}.nll_loss_backward.default(g, x, t, weight = b, reduction = 1, ignore_index = -100, total_weight = tw)"
        ),
    ];
    let prog = same_lines(&[2], inputs(4, &[true], Elem::Int(0, 3)), body, &["lm"]);
    all_ran(&run_seeds(&prog, 1..=4));
}

// ---- Uses of a local mean ----

/// A use of `lm` checked against the interpreter over a few seeds; returns the factor claimed.
fn use_of(before: &[String], line: &str) -> PieceFactor {
    let mut body = chained_loss();
    body.extend(before.iter().cloned());
    body.push(format!("u = {line}"));
    let prog = same_lines(&[2], inputs(2, &[true], Elem::Int(0, 3)), body, &["u"]);
    let seen = run_seeds(&prog, 1..=3);
    all_ran(&seen);
    seen[0].factors[0]
}

/// Non-linear uses: none may claim the factor (or the spec's pieces) falsely.
#[test]
fn non_linear_uses_of_a_local_mean_claim_nothing_false() {
    let uses = [
        format!("{ATEN}.pow.Tensor_Scalar(lm, 2)"),
        format!("{ATEN}.sigmoid.default(lm)"),
        format!("{ATEN}.tanh.default(lm)"),
        format!("{ATEN}.sign.default(lm)"),
        format!("{ATEN}.clamp.default(lm, -0.05, 0.05)"),
        format!("{ATEN}.reciprocal.default(lm)"),
        format!("{ATEN}.div.Tensor(lm, lm)"),
        format!("{ATEN}.div.Tensor(y, lm)"),
        format!("{ATEN}._softmax.default(lm, 1, False)"),
        format!("{ATEN}._log_softmax.default(lm, 1, False)"),
        format!("{ATEN}.var.correction(lm, [1])"),
        format!("{ATEN}.std.correction(lm, [1])"),
        format!("{ATEN}.amax.default(lm, [1])"),
        format!("{ATEN}.maximum.default(lm, y)"),
        format!("{ATEN}.abs.default(lm)"),
        format!("{ATEN}.relu.default(lm)"),
        format!("{ATEN}.pow.Tensor_Scalar(lm, 1)"),
        format!("{ATEN}.native_layer_norm.default(lm, [3], None, None, 1e-05)"),
        format!("{ATEN}.exp.default(lm)"),
        format!("{ATEN}.logsumexp.default(lm, [1])"),
    ];
    for u in &uses {
        eprintln!("{u}: {:?}", use_of(&[], u));
    }
    // A mask from the local mean's own values at a threshold: the ranks' mask is not the
    // spec's (a sign alone would be).
    let masked = use_of(
        &[format!("mk = {ATEN}.gt.Scalar(lm, 0.05)")],
        &format!("{ATEN}.where.self(mk, lm, y)"),
    );
    assert_eq!(masked, PieceFactor::NotKnown);
}

/// The local mean against its own divisor (the rank's count, a partial sum): a product gives
/// the rank's sums (the spec's pieces, not the factor's), a quotient divides twice.
#[test]
fn a_local_mean_against_its_own_count_claims_nothing_false() {
    for u in [
        format!("{ATEN}.mul.Tensor(lm, tw)"),
        format!("{ATEN}.div.Tensor(lm, tw)"),
        format!("{ATEN}.mul.Tensor(tw, lm)"),
    ] {
        eprintln!("{u}: {:?}", use_of(&[], &u));
    }
}

/// Linear backwards of a local mean as their gradient: the factor passes.
#[test]
fn linear_backwards_of_a_local_mean_keep_its_factor() {
    let uses = [
        format!("{ATEN}._log_softmax_backward_data.default(lm, y, 1, torch.float64)"),
        format!("{ATEN}.threshold_backward.default(lm, y, 0.0)"),
        format!("{ATEN}.gelu_backward.default(lm, y)"),
    ];
    for u in &uses {
        assert_eq!(use_of(&[], u), PieceFactor::Times(2), "{u}");
    }
}

/// Layout uses of a local mean along and across its sharded rows (flips, rolls, scans along
/// the rows, transposed sums, a full mean, a square of its row sums): whatever is claimed
/// must hold.
#[test]
fn layout_uses_of_a_local_mean_claim_nothing_false() {
    let uses: [(&[String], String); 9] = [
        (&[], format!("{ATEN}.flip.default(lm, [0])")),
        (&[], format!("{ATEN}.roll.default(lm, [1], [0])")),
        (&[], format!("{ATEN}.cumsum.default(lm, 0)")),
        (&[], format!("{ATEN}.mean.default(lm)")),
        (&[], format!("{ATEN}.slice.Tensor(lm, 1, 0, 1)")),
        (
            &[format!("lt = {ATEN}.t.default(lm)")],
            format!("{ATEN}.sum.dim_IntList(lt, [1])"),
        ),
        (
            &[format!("rs = {ATEN}.sum.dim_IntList(lm, [0])")],
            format!("{ATEN}.expand.default(rs, [2, 3])"),
        ),
        (
            &[format!("rs = {ATEN}.sum.dim_IntList(lm, [0])")],
            format!("{ATEN}.mul.Tensor(rs, rs)"),
        ),
        (&[], format!("{ATEN}.view.default(lm, [-1])")),
    ];
    for (before, u) in &uses {
        eprintln!("{u}: {:?}", use_of(before, u));
    }
}

/// A number or a spec value added to a local mean, or set beside it: a term of the spec's
/// own, no common factor.
#[test]
fn spec_terms_beside_a_local_mean_claim_nothing_false() {
    let uses = [
        format!("{ATEN}.add.Tensor(lm, b)"),
        format!("{ATEN}.add.Tensor(b, lm)"),
        format!("{ATEN}.add.Tensor(lm, y, alpha = 2)"),
        format!("{ATEN}.add.Tensor(lm, y)"),
        format!("{ATEN}.sub.Tensor(y, lm)"),
        format!("{ATEN}.rsub.Scalar(lm, 1.0)"),
        format!("{ATEN}.add.Scalar(lm, 0.5)"),
        format!("{ATEN}.addcmul.default(y, lm, y)"),
        format!("{ATEN}.lerp.Scalar(lm, y, 0.5)"),
        format!("{ATEN}.cat.default([lm, y], 1)"),
        format!("{ATEN}.cat.default([lm, y])"),
        format!("{ATEN}.stack.default([lm, y])"),
        format!("{ATEN}.clamp_min.default(lm, 0.01)"),
        format!("{ATEN}.fill.Scalar(lm, 2.0)"),
        format!("{ATEN}.add.Tensor(lm, lm, alpha = 2)"),
        format!("{ATEN}.mul.Tensor(lm, y)"),
    ];
    for u in &uses {
        eprintln!("{u}: {:?}", use_of(&[], u));
    }
    let mask = [format!("mk = {ATEN}.gt.Scalar(y, 0.0)")];
    for u in [
        format!("{ATEN}.where.self(mk, lm, b)"),
        format!("{ATEN}.masked_fill.Scalar(lm, mk, 1.0)"),
        format!("{ATEN}.masked_fill.Scalar(lm, mk, 0.0)"),
    ] {
        eprintln!("{u}: {:?}", use_of(&mask, &u));
    }
    let kept = format!("{ATEN}.where.ScalarOther(mk, lm, 0.0)");
    assert_eq!(use_of(&mask, &kept), PieceFactor::Times(2), "{kept}");
    // Spec values written into a local mean, and a local mean written into spec values.
    let cols = [
        format!("ys = {ATEN}.slice.Tensor(y, 1, 0, 1)"),
        format!("ls = {ATEN}.slice.Tensor(lm, 1, 0, 1)"),
    ];
    for u in [
        format!("{ATEN}.slice_scatter.default(lm, ys, 1, 0, 1)"),
        format!("{ATEN}.slice_scatter.default(y, ls, 1, 0, 1)"),
        format!("{ATEN}.slice_scatter.default(lm, ls, 1, 2, 3)"),
    ] {
        eprintln!("{u}: {:?}", use_of(&cols, &u));
    }
    let yt = [format!("yt = {ATEN}.t.default(y)")];
    let u = format!("{ATEN}.mm.default(lm, yt)");
    eprintln!("{u}: {:?}", use_of(&yt, &u));
}

/// `where` with a number other than zero in a branch: the number is a term of the spec's own
/// (as in `masked_fill` and `add`), so the pieces are no common factor of the spec's.
#[test]
fn a_number_beside_a_local_mean_in_where_claims_no_factor() {
    let mask = [format!("mk = {ATEN}.gt.Scalar(y, 0.0)")];
    for u in [
        format!("{ATEN}.where.ScalarOther(mk, lm, 1.0)"),
        format!("{ATEN}.where.ScalarSelf(mk, 1.0, lm)"),
    ] {
        assert_eq!(use_of(&mask, &u), PieceFactor::NotKnown, "{u}");
    }
}

/// A local mean of factor 2 beside the spec's (a replicated divisor) or beside one of factor
/// 4 (rows split over both mesh dims): a mix of factors.
#[test]
fn local_means_of_different_factors_mixed_claim_nothing_false() {
    let body = |last: &str| {
        let mut b = chained_loss();
        b.push(format!(
            "tws = {ATEN}.full.default([], 4.0, dtype = torch.float64)"
        ));
        b.push(format!(
            "ls = {ATEN}.nll_loss_backward.default(g, x, t, None, 1, -100, tws)"
        ));
        b.push(format!("u = {last}"));
        b
    };
    for last in [
        format!("{ATEN}.add.Tensor(lm, ls)"),
        format!("{ATEN}.sub.Tensor(lm, ls)"),
        format!("{ATEN}.mul.Tensor(lm, ls)"),
        format!("{ATEN}.cat.default([lm, ls], 1)"),
        format!("{ATEN}.maximum.default(lm, ls)"),
    ] {
        let prog = same_lines(
            &[2],
            inputs(2, &[true], Elem::Int(0, 3)),
            body(&last),
            &["u"],
        );
        let seen = run_seeds(&prog, 1..=3);
        all_ran(&seen);
        eprintln!("{last}: {:?}", seen[0].factors);
    }
}

/// Collectives over the local mean's mesh dim: an all-reduce of its shards, a reduce-scatter,
/// an all-gather, an all-to-all; and its row sums all-reduced by avg.
#[test]
fn collectives_of_a_local_mean_claim_nothing_false() {
    let f = "torch.ops._c10d_functional";
    let lines: [&[String]; 5] = [
        &[
            format!("c = {f}.all_reduce.default(lm, 'sum', 'tp')"),
            format!("u = {f}.wait_tensor.default(c)"),
        ],
        &[
            format!("c = {f}.reduce_scatter_tensor.default(lm, 'sum', 2, 'tp')"),
            format!("u = {f}.wait_tensor.default(c)"),
        ],
        &[
            format!("c = {f}.all_gather_into_tensor.default(lm, 2, 'tp')"),
            format!("u = {f}.wait_tensor.default(c)"),
        ],
        &[
            format!("rs = {ATEN}.sum.dim_IntList(lm, [0])"),
            format!("c = {f}.all_reduce.default(rs, 'avg', 'tp')"),
            format!("u = {f}.wait_tensor.default(c)"),
        ],
        &[
            format!("rs = {ATEN}.mean.dim(lm, [0])"),
            format!("c = {f}.all_reduce.default(rs, 'sum', 'tp')"),
            format!("u = {f}.wait_tensor.default(c)"),
        ],
    ];
    for l in lines {
        let mut body = chained_loss();
        body.extend(l.iter().cloned());
        let mut spec = chained_loss();
        let last = l
            .last()
            .unwrap()
            .replace(f, "")
            .replace(".wait_tensor.default(c)", "");
        let _ = last;
        spec.push(match l[0].as_str() {
            s if s.contains("all_gather") => format!("u = {ATEN}.clone.default(lm)"),
            s if s.contains("sum.dim_IntList") => format!("u = {ATEN}.sum.dim_IntList(lm, [0])"),
            s if s.contains("mean.dim") => format!("u = {ATEN}.sum.dim_IntList(lm, [0])"),
            _ => format!("u = {ATEN}.clone.default(lm)"),
        });
        let mut prog = same_lines(&[2], inputs(2, &[true], Elem::Int(0, 3)), body, &["u"]);
        prog.spec = spec;
        let seen = run_seeds(&prog, 1..=3);
        all_ran(&seen);
        eprintln!("{}: {:?} {:?}", l[0], seen[0].places, seen[0].factors);
    }
}

// ---- One row of a replicated table ----

/// `x [1, 3]` split over tp (the spec's `[2, 3]`) beside rows of a replicated table `t
/// [9, 3]` selected by `rank_lines` (one row on a rank) and `spec_lines` (two rows in the
/// spec), into `ts`; `out = x + ts` checked against the interpreter. Rank k must read the
/// spec's row of x's k-th row, not one row broadcast: whatever is claimed must hold.
fn table_rows(spec_lines: &[String], rank_lines: &[String]) -> Seen {
    table_rows_of(9, spec_lines, rank_lines)
}

/// [`table_rows`] with a table of `rows` rows.
fn table_rows_of(rows: usize, spec_lines: &[String], rank_lines: &[String]) -> Seen {
    let prog = table_program(rows, spec_lines, rank_lines);
    let seen = run_seeds(&prog, 1..=2);
    all_ran(&seen);
    seen.into_iter().next().unwrap()
}

/// The program of [`table_rows_of`].
fn table_program(rows: usize, spec_lines: &[String], rank_lines: &[String]) -> Program {
    let ins = vec![
        Input::f("x", &[1, 3], &[In::S(0)]),
        Input::f("t", &[rows, 3], &[In::R]),
    ];
    let tail = format!("out = {ATEN}.add.Tensor(x, ts)");
    let mut spec = spec_lines.to_vec();
    spec.push(tail.clone());
    let mut ranks = rank_lines.to_vec();
    ranks.push(tail);
    Program {
        mesh: vec![2],
        inputs: ins,
        spec,
        ranks: vec![ranks],
        checked: vec![("out".into(), "out".into())],
    }
}

/// Lines `ts = ...` of `form` for `n` rows (`{n}` and `{n2}` = 2n stand for them).
fn lines(form: &[&str], n: usize) -> Vec<String> {
    form.iter()
        .map(|l| {
            l.replace("{n2}", &(2 * n).to_string())
                .replace("{n}", &n.to_string())
                .replace("{A}", ATEN)
        })
        .collect()
}

/// Neighbours of the one-row slice: an explicit step of 1, a step of 2, `narrow`,
/// `index_select` of an `arange`, `index.Tensor`, `split` and `getitem`, bounds counted from
/// the end or past it, a copy of the table first, an `expand` after.
#[test]
fn one_row_of_a_replicated_table_in_other_forms_claims_nothing_false() {
    let forms: &[&[&str]] = &[
        &["ts = {A}.slice.Tensor(t, 0, 0, {n}, 1)"],
        &["ts = {A}.slice.Tensor(t, 0, 0, {n2}, 2)"],
        &["ts = {A}.narrow.default(t, 0, 0, {n})"],
        &["ts = {A}.narrow.default(t, 0, 3, {n})"],
        &[
            "ix = {A}.arange.start(0, {n}, dtype = torch.int64)",
            "ts = {A}.index_select.default(t, 0, ix)",
        ],
        &[
            "ix = {A}.arange.start(0, {n}, dtype = torch.int64)",
            "ts = {A}.index.Tensor(t, [ix])",
        ],
        &["ts = {A}.slice.Tensor(t, 0, -9, {n})"],
        &[
            "tc = {A}.clone.default(t)",
            "ts = {A}.slice.Tensor(tc, 0, 0, {n})",
        ],
        &[
            "tc = {A}.mul.Tensor(t, 1.0)",
            "ts = {A}.slice.Tensor(tc, 0, 0, {n})",
        ],
        &[
            "s1 = {A}.slice.Tensor(t, 0, 0, {n})",
            "ts = {A}.expand.default(s1, [{n}, 3])",
        ],
        &[
            "tv = {A}.view.default(t, [9, 1, 3])",
            "s1 = {A}.slice.Tensor(tv, 0, 0, {n})",
            "ts = {A}.view.default(s1, [{n}, 3])",
        ],
    ];
    let mut false_claims = Vec::new();
    for form in forms {
        let prog = table_program(9, &lines(form, 2), &lines(form, 1));
        for seed in 1..=2 {
            match props::run(&prog, seed) {
                Ok(seen) => {
                    assert!(seen.skipped.is_none(), "{form:?}: {seen:?}");
                    eprintln!("{form:?}: {:?} claims {}", seen.places, seen.claims);
                }
                Err(e) => false_claims.push(format!("{form:?}: {e}")),
            }
        }
    }
    assert!(false_claims.is_empty(), "{false_claims:#?}");
}

/// `split` (and `split_with_sizes`, `chunk`) of a replicated table into pieces of one row
/// at a local length, beside a shard of local size 1.
#[test]
fn one_row_split_off_a_replicated_table_claims_nothing_false() {
    let forms: &[(&[&str], &[&str])] = &[
        (&["sp = {A}.split.Tensor(t, {n})", "ts = sp[0]"], &[]),
        (
            &[
                "sp = {A}.split_with_sizes.default(t, [{n}, 7])",
                "ts = sp[0]",
            ],
            &[
                "sp = {A}.split_with_sizes.default(t, [{n}, 8])",
                "ts = sp[0]",
            ],
        ),
        (
            &["sp = {A}.chunk.default(t, 5)", "ts = sp[0]"],
            &["sp = {A}.chunk.default(t, 9)", "ts = sp[0]"],
        ),
    ];
    let mut false_claims = Vec::new();
    for (spec, rank) in forms {
        let rank = if rank.is_empty() { spec } else { rank };
        let prog = table_program(9, &lines(spec, 2), &lines(rank, 1));
        match props::run(&prog, 1) {
            Ok(seen) => assert!(seen.skipped.is_none(), "{spec:?}: {seen:?}"),
            Err(e) => false_claims.push(format!("{rank:?}: {e}")),
        }
    }
    assert!(false_claims.is_empty(), "{false_claims:#?}");
}

/// The split forms of a table split on its columns by dp (`t {dp: Shard(1), tp:
/// Replicate()}`) beside `x {dp: Shard(1), tp: Shard(0)}` of one local row: rank (i, j) reads
/// row 0 of its columns where the spec reads row j (issue 44: was a false claim, the split
/// rule refusing only a table replicated on every mesh dim).
#[test]
fn one_row_split_off_a_table_split_over_another_mesh_dim_claims_nothing_false() {
    let forms: &[(&[&str], &[&str])] = &[
        (&["sp = {A}.split.Tensor(t, {n})", "ts = sp[0]"], &[]),
        (
            &["sp = {A}.chunk.default(t, 5)", "ts = sp[0]"],
            &["sp = {A}.chunk.default(t, 9)", "ts = sp[0]"],
        ),
    ];
    let tail = format!("out = {ATEN}.add.Tensor(x, ts)");
    for (spec, rank) in forms {
        let rank = if rank.is_empty() { spec } else { rank };
        let with_tail = |mut l: Vec<String>| {
            l.push(tail.clone());
            l
        };
        let prog = Program {
            mesh: vec![2, 2],
            inputs: vec![
                Input::f("x", &[1, 3], &[In::S(1), In::S(0)]),
                Input::f("t", &[9, 3], &[In::S(1), In::R]),
            ],
            spec: with_tail(lines(spec, 2)),
            ranks: vec![with_tail(lines(rank, 1))],
            checked: vec![("out".into(), "out".into())],
        };
        let seen = run_seeds(&prog, 1..=2);
        all_ran(&seen);
        assert_eq!(seen[0].claims, 0, "{rank:?}: {seen:?}");
    }
}

/// A slice at the end: rank k reads the last row where the spec's k-th row is row 7 + k.
#[test]
fn one_row_at_the_table_s_end_claims_nothing_false() {
    let spec = lines(&["ts = {A}.slice.Tensor(t, 0, 7, 100)"], 2);
    let rank = lines(&["ts = {A}.slice.Tensor(t, 0, 8, 100)"], 1);
    let seen = table_rows(&spec, &rank);
    eprintln!("{:?} claims {}", seen.places, seen.claims);
}

/// A table of two rows: the spec reads all of it, each rank its first row.
#[test]
fn one_row_of_a_two_row_table_claims_nothing_false() {
    let seen = table_rows_of(
        2,
        &lines(&["ts = {A}.slice.Tensor(t, 0, 0, {n})"], 2),
        &lines(&["ts = {A}.slice.Tensor(t, 0, 0, {n})"], 1),
    );
    eprintln!("{:?} claims {}", seen.places, seen.claims);
}

// ---- Whole programs: microbatches received, maxima over part of the rows ----

mod staged {
    //! Programs on a mesh `pp × dp` (`pp` stages, dp = 2): stage 0 holds `a` and `b`
    //! (`[B, V]` each, split over dp); the last stage computes the scalar `m`, all-reduced over
    //! dp into `out`, compared with the spec's `out` by the interpreter beside the verdict.

    use crate::common::dispatch::{load_written, Declared};
    use crate::common::values::close;
    use shardproof_check::{check_case, Verdict};
    use shardproof_interp::{run_graph, run_program, RunConfig};
    use shardproof_ir::{DType, Graph, ValueId};
    use shardproof_ops::{Meta, Tensor};
    use std::collections::BTreeMap;

    /// Rows of the spec's tensors.
    pub const B: usize = 16;
    /// Columns.
    pub const V: usize = 4;
    /// The dp mesh dim's size.
    const DP: usize = 2;
    /// Rows of a rank's shard.
    pub const R: usize = B / DP;

    fn tensor(n: usize, d: Vec<f64>) -> Tensor {
        Tensor::new(Meta::new(DType::F64, vec![n, V]), d)
    }

    /// The spec's `a` (increasing: every shard's maximum is in its last row) and `b` (its
    /// negation).
    fn spec_values(name: &str) -> Vec<f64> {
        (0..B * V)
            .map(|i| {
                let x = i as f64 * 0.5 + 0.25;
                if name == "a" {
                    x
                } else {
                    -x
                }
            })
            .collect()
    }

    /// The spec reducing `a` by `op` (`sum`, `amax`, ...) into `out`.
    pub fn spec_of(op: &str) -> String {
        format!(
            "class G(torch.nn.Module):
    def forward(self, a: \"f64[{B}, {V}]\", b: \"f64[{B}, {V}]\"):
        out: \"f64[]\" = torch.ops.aten.{op}.default(a)
        return (out,)
"
        )
    }

    /// (verdict, whether the declared stage's `out` equals the spec's on every rank, report)
    /// of `bodies` (one per stage; the last defines `m`) reduced over dp by `reduce_op`.
    pub fn judge(spec: &str, reduce_op: &str, bodies: &[String]) -> (Verdict, bool, String) {
        let pp = bodies.len();
        let last = pp - 1;
        let text = |s: usize| {
            let params = if s == 0 {
                format!("a: \"f64[{R}, {V}]\", b: \"f64[{R}, {V}]\"")
            } else {
                String::new()
            };
            let sep = if params.is_empty() { "" } else { ", " };
            let tail = if s == last {
                format!(
                    "        o_ar: \"f64[]\" = torch.ops._c10d_functional.all_reduce.default(m, '{reduce_op}', 'dp')
        out: \"f64[]\" = torch.ops._c10d_functional.wait_tensor.default(o_ar)
        return (out,)
"
                )
            } else {
                format!(
                    "        out{s}: \"f64[]\" = torch.ops.aten.full.default([], 1.0, dtype = torch.float64)
        return (out{s},)
"
                )
            };
            format!(
                "class G(torch.nn.Module):
    def forward(self{sep}{params}):
{}{tail}",
                bodies[s]
            )
        };
        let texts: Vec<String> = (0..pp * DP).map(|q| text(q / DP)).collect();
        let one = pp == 1;
        let mesh: Vec<(&str, usize)> = if one {
            vec![("dp", DP)]
        } else {
            vec![("pp", pp), ("dp", DP)]
        };
        let groups: Vec<(&str, Vec<&str>)> = if one {
            vec![("dp", vec!["dp"])]
        } else {
            vec![("pp", vec!["pp"]), ("dp", vec!["dp"])]
        };
        let input = if one {
            "{ dp: Shard(0) }".to_string()
        } else {
            "{ placement: { dp: Shard(0) }, at: { pp: 0 } }".to_string()
        };
        let output = if one {
            "Replicate()".to_string()
        } else {
            format!("{{ placement: Replicate(), at: {{ pp: {last} }} }}")
        };
        let inputs = [("a", input.clone()), ("b", input)];
        let declared = Declared {
            name: "review-factor-claims",
            mesh: &mesh,
            groups: &groups,
            inputs: &inputs,
            outputs: &[("out", output)],
        };
        let case = load_written(spec, &texts, &declared);
        let report = check_case(&case).unwrap();
        let leaves: BTreeMap<String, Tensor> = ["a", "b"]
            .iter()
            .map(|n| (n.to_string(), tensor(B, spec_values(n))))
            .collect();
        let at = |g: &Graph| ValueId::new(g.nodes.iter().position(|n| n.name == "out").unwrap(), 0);
        let want = run_graph(&case.spec, &leaves, &RunConfig::default()).unwrap();
        let want = want.get(at(&case.spec)).unwrap().data.to_vec();
        let per_rank: Vec<BTreeMap<String, Tensor>> = (0..pp * DP)
            .map(|q| {
                if q >= DP {
                    return BTreeMap::new();
                }
                ["a", "b"]
                    .iter()
                    .map(|n| {
                        let v = spec_values(n);
                        (
                            n.to_string(),
                            tensor(R, v[q * R * V..(q + 1) * R * V].to_vec()),
                        )
                    })
                    .collect()
            })
            .collect();
        let envs = run_program(&case.program, &per_rank, &RunConfig::default()).unwrap();
        let right = envs
            .iter()
            .zip(&case.program.ranks)
            .enumerate()
            .filter(|(q, _)| q / DP == last)
            .all(|(_, (env, g))| close(&env.get(at(g)).unwrap().data, &want));
        (report.verdict, right, report.render())
    }

    /// A send of `x` (`[shape]`) to stage `to` with `tag`.
    pub fn send(x: &str, shape: &str, to: usize, tag: usize) -> String {
        format!(
            "        sent{tag}_{x}: \"f64[{shape}]\" = torch.ops.shardproof_p2p.send.default({x}, {to}, {tag}, 'pp')\n"
        )
    }

    /// A recv into `v` (`[shape]`) from stage `from` with `tag`.
    pub fn recv(v: &str, shape: &str, from: usize, tag: usize) -> String {
        format!(
            "        {v}: \"f64[{shape}]\" = torch.ops.shardproof_p2p.recv.default([{shape}], torch.float64, {from}, {tag}, 'pp')\n"
        )
    }

    /// Asserts a wrong program never holds.
    pub fn never_holds((verdict, right, report): (Verdict, bool, String), what: &str) {
        assert!(!right, "{what} is right when run");
        assert_ne!(verdict, Verdict::Holds, "{what}: {report}");
    }

    /// Asserts a right program is not reported violated (and says whether it held).
    pub fn not_violated((verdict, right, report): (Verdict, bool, String), what: &str) -> bool {
        assert!(right, "{what} is wrong when run");
        assert_ne!(verdict, Verdict::Violated, "{what}: {report}");
        verdict == Verdict::Holds
    }
}

use staged::{judge, never_holds, not_violated, recv, send, spec_of, R, V};

/// `line` as an fx line `name: "f64[shape]" = rhs`.
fn fx(name: &str, shape: &str, rhs: &str) -> String {
    format!("        {name}: \"f64[{shape}]\" = {rhs}\n")
}

/// Rows 0..4 of `a` and rows 4..8 of `b` set one above the other (`cat`), summed on stage 0.
#[test]
fn a_cat_of_halves_of_two_tensors_summed_never_holds() {
    let body = fx(
        "h0",
        &format!("4, {V}"),
        &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"),
    ) + &fx(
        "h1",
        &format!("4, {V}"),
        &format!("{ATEN}.slice.Tensor(b, 0, 4, 8)"),
    ) + &fx(
        "c",
        &format!("{R}, {V}"),
        &format!("{ATEN}.cat.default([h0, h1])"),
    ) + &fx("m", "", &format!("{ATEN}.sum.default(c)"));
    never_holds(
        judge(&spec_of("sum"), "sum", &[body]),
        "a cat of halves of a and b",
    );
}

/// The same cat sent as its two halves (one tensor `c`, two slices), summed on stage 1.
#[test]
fn halves_of_a_cat_of_two_tensors_received_never_hold() {
    let h = format!("4, {V}");
    let stage0 = fx("h0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
        + &fx("h1", &h, &format!("{ATEN}.slice.Tensor(b, 0, 4, 8)"))
        + &fx(
            "c",
            &format!("{R}, {V}"),
            &format!("{ATEN}.cat.default([h0, h1])"),
        )
        + &fx("c0", &h, &format!("{ATEN}.slice.Tensor(c, 0, 0, 4)"))
        + &fx("c1", &h, &format!("{ATEN}.slice.Tensor(c, 0, 4, 8)"))
        + &send("c0", &h, 1, 0)
        + &send("c1", &h, 1, 1);
    let stage1 = recv("v0", &h, 0, 0)
        + &recv("v1", &h, 0, 1)
        + &fx("l0", "", &format!("{ATEN}.sum.default(v0)"))
        + &fx("l1", "", &format!("{ATEN}.sum.default(v1)"))
        + &fx("m", "", &format!("{ATEN}.add.Tensor(l0, l1)"));
    never_holds(
        judge(&spec_of("sum"), "sum", &[stage0, stage1]),
        "halves of a cat of a and b, received",
    );
}

/// The cat sent whole and cut on the receiver.
#[test]
fn a_cat_of_two_tensors_received_and_cut_never_holds() {
    let h = format!("4, {V}");
    let stage0 = fx("h0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
        + &fx("h1", &h, &format!("{ATEN}.slice.Tensor(b, 0, 4, 8)"))
        + &fx(
            "c",
            &format!("{R}, {V}"),
            &format!("{ATEN}.cat.default([h0, h1])"),
        )
        + &send("c", &format!("{R}, {V}"), 1, 0);
    let stage1 = recv("v", &format!("{R}, {V}"), 0, 0)
        + &fx("v0", &h, &format!("{ATEN}.slice.Tensor(v, 0, 0, 4)"))
        + &fx("v1", &h, &format!("{ATEN}.slice.Tensor(v, 0, 4, 8)"))
        + &fx("l0", "", &format!("{ATEN}.sum.default(v0)"))
        + &fx("l1", "", &format!("{ATEN}.sum.default(v1)"))
        + &fx("m", "", &format!("{ATEN}.add.Tensor(l0, l1)"));
    never_holds(
        judge(&spec_of("sum"), "sum", &[stage0, stage1]),
        "a cat of a and b received and cut",
    );
}

/// Products of halves: `a0 * a0` and `a1 * a0` sent (one tensor, the first pair of slices
/// differing, the second alike); the spec sums `a * a`.
#[test]
fn products_of_halves_received_never_hold() {
    let h = format!("4, {V}");
    let spec = spec_of("sum").replace(
        "out: \"f64[]\" = torch.ops.aten.sum.default(a)",
        "sq: \"f64[16, 4]\" = torch.ops.aten.mul.Tensor(a, a)\n        out: \"f64[]\" = torch.ops.aten.sum.default(sq)",
    );
    let stage0 = fx("h0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
        + &fx("h1", &h, &format!("{ATEN}.slice.Tensor(a, 0, 4, 8)"))
        + &fx("k0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
        + &fx("p0", &h, &format!("{ATEN}.mul.Tensor(h0, k0)"))
        + &fx("p1", &h, &format!("{ATEN}.mul.Tensor(h1, k0)"))
        + &send("p0", &h, 1, 0)
        + &send("p1", &h, 1, 1);
    let stage1 = recv("v0", &h, 0, 0)
        + &recv("v1", &h, 0, 1)
        + &fx("l0", "", &format!("{ATEN}.sum.default(v0)"))
        + &fx("l1", "", &format!("{ATEN}.sum.default(v1)"))
        + &fx("m", "", &format!("{ATEN}.add.Tensor(l0, l1)"));
    never_holds(
        judge(&spec, "sum", &[stage0, stage1]),
        "a0*a0 and a1*a0 received",
    );
}

/// A step-2 slice (rows 0, 2, 4, 6) and the second half (rows 4..8) sent: they overlap.
#[test]
fn a_strided_microbatch_and_a_half_received_never_hold() {
    let h = format!("4, {V}");
    let stage0 = fx("h0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 8, 2)"))
        + &fx("h1", &h, &format!("{ATEN}.slice.Tensor(a, 0, 4, 8)"))
        + &send("h0", &h, 1, 0)
        + &send("h1", &h, 1, 1);
    let stage1 = recv("v0", &h, 0, 0)
        + &recv("v1", &h, 0, 1)
        + &fx("l0", "", &format!("{ATEN}.sum.default(v0)"))
        + &fx("l1", "", &format!("{ATEN}.sum.default(v1)"))
        + &fx("m", "", &format!("{ATEN}.add.Tensor(l0, l1)"));
    never_holds(
        judge(&spec_of("sum"), "sum", &[stage0, stage1]),
        "rows 0,2,4,6 and 4..8 received",
    );
}

/// Stage 0 sends rows 0..4 of `first` and 4..8 of `second` to stage 1, which relays each
/// (through `relay(v, k)`, the value sent on) to stage 2, which sums both and adds.
fn relayed(
    first: &str,
    second: &str,
    relay: &dyn Fn(usize) -> String,
) -> (shardproof_check::Verdict, bool, String) {
    let h = format!("4, {V}");
    let stage0 = fx("h0", &h, &format!("{ATEN}.slice.Tensor({first}, 0, 0, 4)"))
        + &fx("h1", &h, &format!("{ATEN}.slice.Tensor({second}, 0, 4, 8)"))
        + &send("h0", &h, 1, 0)
        + &send("h1", &h, 1, 1);
    let stage1 = recv("u0", &h, 0, 0) + &recv("u1", &h, 0, 1) + &relay(0) + &relay(1);
    let stage2 = recv("v0", &h, 1, 0)
        + &recv("v1", &h, 1, 1)
        + &fx("l0", "", &format!("{ATEN}.sum.default(v0)"))
        + &fx("l1", "", &format!("{ATEN}.sum.default(v1)"))
        + &fx("m", "", &format!("{ATEN}.add.Tensor(l0, l1)"));
    let spec = spec_of("sum");
    judge(&spec, "sum", &[stage0, stage1, stage2])
}

/// Each message relayed as received.
fn as_received(k: usize) -> String {
    send(&format!("u{k}"), &format!("4, {V}"), 2, k)
}

#[test]
fn halves_of_two_tensors_relayed_never_hold() {
    never_holds(relayed("a", "b", &as_received), "halves of a and b relayed");
}

#[test]
fn halves_of_one_tensor_relayed_are_not_violated() {
    let held = not_violated(relayed("a", "a", &as_received), "halves of a relayed");
    eprintln!("halves of a relayed: held {held}");
}

/// The middle stage relays the first message twice.
#[test]
fn one_half_relayed_twice_never_holds() {
    never_holds(
        relayed("a", "a", &|k| send("u0", &format!("4, {V}"), 2, k)),
        "the first half relayed twice",
    );
}

/// The middle stage negates the second message before relaying it.
#[test]
fn a_half_changed_by_the_relay_never_holds() {
    let h = format!("4, {V}");
    never_holds(
        relayed("a", "a", &|k| {
            if k == 0 {
                send("u0", &h, 2, 0)
            } else {
                fx("n1", &h, &format!("{ATEN}.neg.default(u1)")) + &send("n1", &h, 2, 1)
            }
        }),
        "the second half negated by the relay",
    );
}

/// The middle stage sends its own copy of the first half (a local clone of the message)
/// beside the second: the two are one tensor's halves all the same.
#[test]
fn a_half_cloned_by_the_relay_is_not_violated() {
    let h = format!("4, {V}");
    let held = not_violated(
        relayed("a", "a", &|k| {
            if k == 0 {
                fx("c0", &h, &format!("{ATEN}.clone.default(u0)")) + &send("c0", &h, 2, 0)
            } else {
                send("u1", &h, 2, 1)
            }
        }),
        "the first half cloned by the relay",
    );
    eprintln!("a half cloned by the relay: held {held}");
}

// ---- A max over part of the rows by other routes ----

/// One stage: `body` computes `m` from the rank's `a`, all-reduced by `reduce` over dp; the
/// spec reduces `a` by `spec_op`.
fn one_stage(spec_op: &str, reduce: &str, body: &str) -> (shardproof_check::Verdict, bool, String) {
    judge(&spec_of(spec_op), reduce, &[body.to_string()])
}

#[test]
fn part_maxima_by_other_routes_never_hold() {
    let h = format!("4, {V}");
    let cases = [
        (
            "max.dim over the first microbatch",
            fx("s0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
                + "        md = torch.ops.aten.max.dim(s0, 0)\n"
                + &fx("mv", &V.to_string(), "md[0]")
                + &fx("m", "", &format!("{ATEN}.amax.default(mv)")),
        ),
        (
            "index_select of the first microbatch",
            "        ix: \"i64[4]\" = torch.ops.aten.arange.start(0, 4, dtype = torch.int64)\n"
                .to_string()
                + &fx("s0", &h, &format!("{ATEN}.index_select.default(a, 0, ix)"))
                + &fx("m", "", &format!("{ATEN}.amax.default(s0)")),
        ),
        (
            "row maxima, then the first microbatch's",
            fx(
                "rm",
                &R.to_string(),
                &format!("{ATEN}.amax.default(a, [1])"),
            ) + &fx("p", "4", &format!("{ATEN}.slice.Tensor(rm, 0, 0, 4)"))
                + &fx("m", "", &format!("{ATEN}.amax.default(p)")),
        ),
        (
            "a cumulative max's fourth row",
            "        cm = torch.ops.aten.cummax.default(a, 0)\n".to_string()
                + &fx("cv", &format!("{R}, {V}"), "cm[0]")
                + &fx(
                    "r3",
                    &V.to_string(),
                    &format!("{ATEN}.select.int(cv, 0, 3)"),
                )
                + &fx("m", "", &format!("{ATEN}.amax.default(r3)")),
        ),
        (
            "per-microbatch maxima of a view, the first selected",
            fx(
                "w",
                &format!("2, 4, {V}"),
                &format!("{ATEN}.view.default(a, [2, 4, {V}])"),
            ) + &fx("wm", "2", &format!("{ATEN}.amax.default(w, [1, 2])"))
                + &fx("m", "", &format!("{ATEN}.select.int(wm, 0, 0)")),
        ),
        (
            "the maximum of two rows",
            fx("r0", &V.to_string(), &format!("{ATEN}.select.int(a, 0, 0)"))
                + &fx("r1", &V.to_string(), &format!("{ATEN}.select.int(a, 0, 1)"))
                + &fx(
                    "mx",
                    &V.to_string(),
                    &format!("{ATEN}.maximum.default(r0, r1)"),
                )
                + &fx("m", "", &format!("{ATEN}.amax.default(mx)")),
        ),
        (
            "minus the min of the negated first microbatch",
            fx("s0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
                + &fx("ng", &h, &format!("{ATEN}.neg.default(s0)"))
                + &fx("mn", "", &format!("{ATEN}.amin.default(ng)"))
                + &fx("m", "", &format!("{ATEN}.neg.default(mn)")),
        ),
        (
            "a sort's first row of the first microbatch",
            fx("s0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
                + "        so = torch.ops.aten.sort.default(s0, 0, True)\n"
                + &fx("sv", &h, "so[0]")
                + &fx(
                    "r0",
                    &V.to_string(),
                    &format!("{ATEN}.select.int(sv, 0, 0)"),
                )
                + &fx("m", "", &format!("{ATEN}.amax.default(r0)")),
        ),
        (
            "the first microbatch transposed, its rows reduced second",
            fx("s0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
                + &fx("st", &format!("{V}, 4"), &format!("{ATEN}.t.default(s0)"))
                + &fx(
                    "cm",
                    &V.to_string(),
                    &format!("{ATEN}.amax.default(st, [1])"),
                )
                + &fx("m", "", &format!("{ATEN}.amax.default(cm)")),
        ),
        (
            "the first microbatch flattened",
            fx("s0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
                + &fx(
                    "fl",
                    &(4 * V).to_string(),
                    &format!("{ATEN}.view.default(s0, [{}])", 4 * V),
                )
                + &fx("m", "", &format!("{ATEN}.amax.default(fl)")),
        ),
        (
            "the rank's rows flattened, the first half of them",
            fx(
                "fl",
                &(R * V).to_string(),
                &format!("{ATEN}.view.default(a, [{}])", R * V),
            ) + &fx(
                "p",
                &(4 * V).to_string(),
                &format!("{ATEN}.slice.Tensor(fl, 0, 0, {})", 4 * V),
            ) + &fx("m", "", &format!("{ATEN}.amax.default(p)")),
        ),
        (
            "the first microbatch twice, set one above the other",
            fx("s0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
                + &fx(
                    "cc",
                    &format!("{R}, {V}"),
                    &format!("{ATEN}.cat.default([s0, s0])"),
                )
                + &fx("m", "", &format!("{ATEN}.amax.default(cc)")),
        ),
        (
            "the first microbatch padded by its own rows",
            fx("s0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
                + &fx(
                    "pd",
                    &format!("{R}, {V}"),
                    &format!("{ATEN}.constant_pad_nd.default(s0, [0, 0, 0, 4], -1000.0)"),
                )
                + &fx("m", "", &format!("{ATEN}.amax.default(pd)")),
        ),
        (
            "a rank-shaped mask keeping the first microbatch",
            "        ix: \"i64[8]\" = torch.ops.aten.arange.default(8, dtype = torch.int64)\n"
                .to_string()
                + "        keep: \"b8[8]\" = torch.ops.aten.lt.Scalar(ix, 4)\n"
                + "        kv: \"b8[8, 1]\" = torch.ops.aten.unsqueeze.default(keep, 1)\n"
                + &fx(
                    "mk",
                    &format!("{R}, {V}"),
                    &format!("{ATEN}.where.ScalarOther(kv, a, -1000.0)"),
                )
                + &fx("m", "", &format!("{ATEN}.amax.default(mk)")),
        ),
    ];
    let mut held = Vec::new();
    for (what, body) in &cases {
        let (verdict, right, report) = one_stage("amax", "max", body);
        assert!(!right, "{what} is right when run");
        if verdict == shardproof_check::Verdict::Holds {
            held.push(format!("{what}: {report}"));
        }
        eprintln!("{what}: {verdict:?}");
    }
    assert!(held.is_empty(), "{held:#?}");
}

// ---- A local mean moved between ranks ----

/// A local mean sent along dp (the mesh dim that splits its rows) to the next dp rank: the
/// receiver holds its peer's piece, a rotated shard times the factor.
#[test]
fn a_local_mean_sent_along_its_own_mesh_dim_claims_nothing_false() {
    let (dp, tp) = (2, 2);
    let ranks = (0..dp * tp)
        .map(|r| {
            let (i, j) = (r / tp, r % tp);
            let dst = ((i + 1) % dp) * tp + j;
            let src = ((i + dp - 1) % dp) * tp + j;
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
    spec.push(format!("out = {ATEN}.clone.default(lm)"));
    let prog = Program {
        mesh: vec![dp, tp],
        inputs: inputs(2, &[true, false], Elem::Int(0, 3)),
        spec,
        ranks,
        checked: vec![("out".into(), "out".into())],
    };
    let seen = run_seeds(&prog, 1..=3);
    all_ran(&seen);
    eprintln!("{:?} {:?}", seen[0].places, seen[0].factors);
}

/// The loss's gradient partial over the mesh dim that keeps the rows: the local mean's
/// pieces are partial there, times dp's factor.
#[test]
fn a_local_mean_of_a_partial_gradient_claims_nothing_false() {
    let mut ins = inputs(2, &[true, false], Elem::Int(0, 3));
    ins[0].places = vec![In::R, In::P(shardproof_check::Red::Sum)];
    let mut body = chained_loss();
    body.push(format!("rs = {ATEN}.sum.dim_IntList(lm, [0])"));
    let prog = same_lines(&[2, 2], ins, body, &["lm", "rs"]);
    let seen = run_seeds(&prog, 1..=3);
    all_ran(&seen);
    // Both claims are checked against the values (`lm` the rows' shard times 2 on dp and a
    // partial sum on tp, `rs` a partial sum on both), not declined.
    for s in &seen {
        assert_eq!(s.claims, 2, "{s:?}");
    }
}

/// One row of the table against the shard by other elementwise operators.
#[test]
fn one_row_beside_a_shard_by_other_operators_claims_nothing_false() {
    for op in ["mul.Tensor", "maximum.default", "sub.Tensor", "div.Tensor"] {
        let body = |n: usize| {
            vec![
                format!("ts = {ATEN}.slice.Tensor(t, 0, 0, {n})"),
                format!("out = {ATEN}.{op}(x, ts)"),
            ]
        };
        let ins = vec![
            Input::f("x", &[1, 3], &[In::S(0)]),
            Input::f("t", &[9, 3], &[In::R]),
        ];
        let prog = Program {
            mesh: vec![2],
            inputs: ins,
            spec: body(2),
            ranks: vec![body(1)],
            checked: vec![("out".into(), "out".into())],
        };
        let seen = run_seeds(&prog, 1..=2);
        all_ran(&seen);
        eprintln!("{op}: {:?} claims {}", seen[0].places, seen[0].claims);
    }
}

/// A microbatch received from stage 0 (rows 0..4 of the rank's shard), its max all-reduced
/// by max over dp on stage 1: the max of the first halves only.
#[test]
fn a_received_microbatch_s_max_never_holds() {
    let h = format!("4, {V}");
    let stage0 = fx("h0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)")) + &send("h0", &h, 1, 0);
    let stage1 = recv("v0", &h, 0, 0) + &fx("m", "", &format!("{ATEN}.amax.default(v0)"));
    never_holds(
        judge(&spec_of("amax"), "max", &[stage0, stage1]),
        "a received microbatch's max",
    );
}

/// Both microbatches received, each's max taken, the two combined by `maximum`: right.
#[test]
fn both_received_microbatch_maxima_combined_are_not_violated() {
    let h = format!("4, {V}");
    let stage0 = fx("h0", &h, &format!("{ATEN}.slice.Tensor(a, 0, 0, 4)"))
        + &fx("h1", &h, &format!("{ATEN}.slice.Tensor(a, 0, 4, 8)"))
        + &send("h0", &h, 1, 0)
        + &send("h1", &h, 1, 1);
    let stage1 = recv("v0", &h, 0, 0)
        + &recv("v1", &h, 0, 1)
        + &fx("l0", "", &format!("{ATEN}.amax.default(v0)"))
        + &fx("l1", "", &format!("{ATEN}.amax.default(v1)"))
        + &fx("m", "", &format!("{ATEN}.maximum.default(l0, l1)"));
    let held = not_violated(
        judge(&spec_of("amax"), "max", &[stage0, stage1]),
        "both received microbatches' maxima combined",
    );
    eprintln!("both received maxima combined: held {held}");
}
