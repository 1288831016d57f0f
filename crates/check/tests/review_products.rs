//! Adversarial review of products across mesh dims (`rules/matmul.rs`: batch shards of
//! different mesh dims, a bias over other mesh dims): hand-picked programs on a `dp × tp` mesh
//! run through the property harness (`common/props.rs`), which checks every placement the
//! checker infers against the interpreter's values, so a false claim fails the test. The
//! attacks lean on local sizes of 1 (a shard whose local length broadcasts) and on biases,
//! scales and permutes the per-mesh-dim rules see one at a time.

mod common;
#[path = "common/props.rs"]
mod props;
use props::{run, Elem, In, Input, Program, Seen};
use shardproof_check::{check_case, Red, Verdict};

const P: In = In::P(Red::Sum);

/// A program whose spec and ranks run the same `lines`, checking `checked`.
fn program(mesh: &[usize], inputs: Vec<Input>, lines: &[&str], checked: &[&str]) -> Program {
    let body: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    Program {
        mesh: mesh.to_vec(),
        inputs,
        spec: body.clone(),
        ranks: vec![body],
        checked: checked
            .iter()
            .map(|c| (c.to_string(), c.to_string()))
            .collect(),
    }
}

/// Runs `prog` on a few seeds: panics naming `what` on a claim the values contradict.
fn no_false_claim(what: &str, prog: &Program) -> Seen {
    let mut last = Seen::default();
    for seed in 0..3 {
        last = run(prog, seed).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            last.skipped.is_none(),
            "{what}: skipped: {:?}",
            last.skipped
        );
    }
    eprintln!(
        "{what}: claims {} declined {} finding {} places {:?}",
        last.claims, last.declined, last.finding, last.places
    );
    last
}

#[test]
fn linear_with_a_one_element_bias_shard_beside_a_partial_product() {
    // x and w sharded on the contracted dim over tp: the product is a partial sum on tp. The
    // bias [tp] sharded over tp is one element per rank, broadcast over the product's tp
    // columns: tp's sum adds every rank's element to every column.
    let tp = 2;
    let prog = program(
        &[tp],
        vec![
            Input::f("x", &[3, 2], &[In::S(1)]),
            Input::f("w", &[tp, 2], &[In::S(1)]),
            Input::f("b", &[1], &[In::S(0)]),
        ],
        &["o = torch.ops.aten.linear.default(x, w, b)"],
        &["o"],
    );
    no_false_claim("linear, partial product, one-element bias shard", &prog);
}

#[test]
fn linear_with_a_replicated_bias_beside_a_partial_product() {
    let prog = program(
        &[2, 2],
        vec![
            Input::f("x", &[3, 2], &[In::S(0), In::S(1)]),
            Input::f("w", &[2, 2], &[In::R, In::S(1)]),
            Input::f("b", &[2], &[In::R, In::R]),
        ],
        &["o = torch.ops.aten.linear.default(x, w, b)"],
        &["o"],
    );
    no_false_claim("linear, partial product on tp, replicated bias", &prog);
}

#[test]
fn addmm_with_a_one_element_bias_shard_on_dp_beside_rows_on_dp() {
    // Rows of the product sharded over dp; the bias [dp] sharded over dp (one element per
    // rank) broadcast over the product's dp columns: rank d adds b[d] to every column.
    let prog = program(
        &[2, 2],
        vec![
            Input::f("a", &[2, 3], &[In::S(0), In::R]),
            Input::f("m", &[3, 2], &[In::R, In::R]),
            Input::f("b", &[1], &[In::S(0), In::R]),
        ],
        &["o = torch.ops.aten.addmm.default(b, a, m)"],
        &["o"],
    );
    no_false_claim("addmm, rows on dp, one-element bias shard on dp", &prog);
}

#[test]
fn addmm_with_a_one_element_bias_shard_on_tp_beside_rows_on_dp() {
    let prog = program(
        &[2, 2],
        vec![
            Input::f("a", &[2, 3], &[In::S(0), In::R]),
            Input::f("m", &[3, 2], &[In::R, In::R]),
            Input::f("b", &[1], &[In::R, In::S(0)]),
        ],
        &["o = torch.ops.aten.addmm.default(b, a, m)"],
        &["o"],
    );
    no_false_claim("addmm, rows on dp, one-element bias shard on tp", &prog);
}

#[test]
fn matmul_of_a_one_batch_shard_against_a_replicated_batch() {
    // a [dp, m, k] sharded on its batch over dp: a local batch of 1 broadcasts against w's
    // full batch of dp, pairing a's piece d with every batch of w.
    let prog = program(
        &[2, 2],
        vec![
            Input::f("a", &[1, 2, 3], &[In::S(0), In::R]),
            Input::f("w", &[2, 3, 2], &[In::R, In::R]),
        ],
        &["o = torch.ops.aten.matmul.default(a, w)"],
        &["o"],
    );
    no_false_claim("matmul, one-batch shard against a replicated batch", &prog);
}

#[test]
fn matmul_of_a_batched_operand_against_a_two_d_one_sharded_on_columns() {
    // The right case: rows' batch on dp, w's columns on tp.
    let prog = program(
        &[2, 2],
        vec![
            Input::f("a", &[2, 2, 3], &[In::S(0), In::R]),
            Input::f("w", &[3, 2], &[In::R, In::S(1)]),
        ],
        &["o = torch.ops.aten.matmul.default(a, w)"],
        &["o"],
    );
    let seen = no_false_claim("matmul, batched against 2-d column shard", &prog);
    assert!(
        seen.claims > 0,
        "the right product claims nothing: {seen:?}"
    );
}

#[test]
fn matmul_of_a_two_d_operand_sharded_on_rows_over_tp_against_a_batch_on_dp() {
    // a [m, k] rows on tp against w [b, k, n] batch on dp: different product dims, each a
    // single factor's: the product is Shard(0) on dp and Shard(1) on tp.
    let prog = program(
        &[2, 2],
        vec![
            Input::f("a", &[2, 3], &[In::R, In::S(0)]),
            Input::f("w", &[2, 3, 2], &[In::S(0), In::R]),
        ],
        &["o = torch.ops.aten.matmul.default(a, w)"],
        &["o"],
    );
    no_false_claim("matmul, 2-d rows on tp against a batch on dp", &prog);
}

#[test]
fn bmm_after_a_permute_with_batches_on_different_mesh_dims() {
    // An einsum written as permute + bmm: x [k, b, m] permuted to [b, m, k], its batch on dp;
    // y's batch on tp.
    let prog = program(
        &[2, 2],
        vec![
            Input::f("xs", &[3, 1, 2], &[In::S(1), In::R]),
            Input::f("y", &[1, 3, 2], &[In::R, In::S(0)]),
        ],
        &[
            "xp = torch.ops.aten.permute.default(xs, [1, 2, 0])",
            "o = torch.ops.aten.bmm.default(xp, y)",
        ],
        &["o"],
    );
    let seen = no_false_claim("permute + bmm, batches on dp and on tp", &prog);
    assert!(
        seen.finding,
        "mixed batch shards after a permute are not reported: {seen:?}"
    );
}

#[test]
fn baddbmm_with_beta_and_alpha_over_a_partial_product() {
    // The product is a partial sum on tp (contracted dims sharded): a partial `self` keeps the
    // sum (beta · Σ self_i + alpha · Σ prod_i); a replicated one is counted tp times.
    for (self_place, what) in [(P, "partial self"), (In::R, "replicated self")] {
        let prog = program(
            &[2, 2],
            vec![
                Input::f("s", &[2, 2, 2], &[In::S(0), self_place]),
                Input::f("x", &[2, 2, 3], &[In::S(0), In::S(2)]),
                Input::f("y", &[2, 3, 2], &[In::S(0), In::S(1)]),
            ],
            &["o = torch.ops.aten.baddbmm.default(s, x, y, beta = 0.5, alpha = 2.0)"],
            &["o"],
        );
        no_false_claim(&format!("baddbmm beta 0.5 alpha 2, {what}"), &prog);
    }
}

#[test]
fn baddbmm_with_a_bias_batch_on_tp_beside_a_product_batch_on_dp() {
    let prog = program(
        &[2, 2],
        vec![
            Input::f("s", &[1, 2, 2], &[In::R, In::S(0)]),
            Input::f("x", &[1, 2, 3], &[In::S(0), In::R]),
            Input::f("y", &[1, 3, 2], &[In::S(0), In::R]),
        ],
        &["o = torch.ops.aten.baddbmm.default(s, x, y, beta = 0.5, alpha = 2.0)"],
        &["o"],
    );
    no_false_claim("baddbmm, bias batch on tp, product batch on dp", &prog);
}

#[test]
fn a_number_scattered_into_a_partial_claims_no_partial() {
    // Every rank writes 0.5 into its piece: tp's sum holds tp × 0.5 there.
    for (line, what) in [
        (
            "o = torch.ops.aten.scatter.value(p, 1, ix, 0.5)",
            "scatter.value 0.5",
        ),
        (
            "o = torch.ops.aten.scatter.value(p, 1, ix, 0.0)",
            "scatter.value 0",
        ),
        ("o = torch.ops.aten.fill.Scalar(p, 0.5)", "fill 0.5"),
        ("o = torch.ops.aten.fill.Scalar(p, 0.0)", "fill 0"),
    ] {
        let prog = program(
            &[2, 2],
            vec![
                Input::f("p", &[2, 3], &[In::S(0), P]),
                Input {
                    name: "ix".into(),
                    elem: Elem::Int(0, 3),
                    local: vec![2, 1],
                    places: vec![In::S(0), In::R],
                },
            ],
            &[line],
            &["o"],
        );
        no_false_claim(&format!("{what} into a partial"), &prog);
    }
}

/// The verdict, whether every rank's gathered product is the spec's, and the report of
/// `bmm(x, y)` on `dp × ep × tp` (2 × 2 × 2): x's batch split over dp and ep (dp outermost),
/// y's batch blocks held as `y_order` says (rank `(d, e)` holds block `y_order(d, e)`, the
/// case declaring it by an explicit expression), the product gathered over ep then dp.
fn bmm_on_three_dims(y_expr: &str, y_order: fn(usize, usize) -> usize) -> (Verdict, bool, String) {
    use common::dispatch::{load_written, Declared};
    use shardproof_interp::{run_graph, run_program, RunConfig};
    use shardproof_ir::{DType, Graph, ValueId};
    use shardproof_ops::{Meta, Tensor};
    use std::collections::BTreeMap;
    let (dp, ep, tp) = (2usize, 2usize, 2usize);
    let (b, m, k, n) = (dp * ep, 2usize, 3usize, 2usize);
    let spec = format!(
        "class G(torch.nn.Module):
    def forward(self, x: \"f64[{b}, {m}, {k}]\", y: \"f64[{b}, {k}, {n}]\"):
        out: \"f64[{b}, {m}, {n}]\" = torch.ops.aten.bmm.default(x, y)
        return (out,)
"
    );
    let rank = format!(
        "class G(torch.nn.Module):
    def forward(self, x: \"f64[1, {m}, {k}]\", y: \"f64[1, {k}, {n}]\"):
        o: \"f64[1, {m}, {n}]\" = torch.ops.aten.bmm.default(x, y)
        ge: \"f64[{ep}, {m}, {n}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(o, {ep}, 'ep')
        we: \"f64[{ep}, {m}, {n}]\" = torch.ops._c10d_functional.wait_tensor.default(ge)
        gd: \"f64[{b}, {m}, {n}]\" = torch.ops._c10d_functional.all_gather_into_tensor.default(we, {dp}, 'dp')
        out: \"f64[{b}, {m}, {n}]\" = torch.ops._c10d_functional.wait_tensor.default(gd)
        return (out,)
"
    );
    let groups: Vec<(&str, Vec<&str>)> =
        vec![("dp", vec!["dp"]), ("ep", vec!["ep"]), ("tp", vec!["tp"])];
    let inputs = [
        ("x", "{ dp: Shard(0), ep: Shard(0) }".to_string()),
        ("y", format!("{{ expr: \"{y_expr}\" }}")),
    ];
    let declared = Declared {
        name: "review-products-order",
        mesh: &[("dp", dp), ("ep", ep), ("tp", tp)],
        groups: &groups,
        inputs: &inputs,
        outputs: &[("out", "Replicate()".to_string())],
    };
    let ranks = dp * ep * tp;
    let case = load_written(&spec, &vec![rank; ranks], &declared);
    let report = check_case(&case).unwrap();
    let x: Vec<f64> = (0..b * m * k).map(|i| 0.5 + i as f64 * 0.25).collect();
    let y: Vec<f64> = (0..b * k * n).map(|i| 1.0 - i as f64 * 0.125).collect();
    let t3 = |s: [usize; 3], d: Vec<f64>| Tensor::new(Meta::new(DType::F64, s.to_vec()), d);
    let leaves = BTreeMap::from([
        ("x".to_string(), t3([b, m, k], x.clone())),
        ("y".to_string(), t3([b, k, n], y.clone())),
    ]);
    let per_rank: Vec<BTreeMap<String, Tensor>> = (0..ranks)
        .map(|q| {
            let (d, e) = (q / (ep * tp), (q / tp) % ep);
            let (bx, by) = (d * ep + e, y_order(d, e));
            BTreeMap::from([
                (
                    "x".to_string(),
                    t3([1, m, k], x[bx * m * k..(bx + 1) * m * k].to_vec()),
                ),
                (
                    "y".to_string(),
                    t3([1, k, n], y[by * k * n..(by + 1) * k * n].to_vec()),
                ),
            ])
        })
        .collect();
    let at = |g: &Graph| ValueId::new(g.nodes.iter().position(|n| n.name == "out").unwrap(), 0);
    let want = run_graph(&case.spec, &leaves, &RunConfig::default())
        .ok()
        .and_then(|env| env.get(at(&case.spec)).map(|t| t.data.to_vec()));
    let right = run_program(&case.program, &per_rank, &RunConfig::default()).is_ok_and(|envs| {
        envs.iter().zip(&case.program.ranks).all(|(env, g)| {
            env.get(at(g)).is_some_and(|t: &Tensor| {
                want.as_ref()
                    .is_some_and(|w| common::values::close(&t.data, w))
            })
        })
    });
    (report.verdict, right, report.render())
}

#[test]
fn bmm_of_batches_split_over_dp_and_ep_in_different_orders_never_holds() {
    // y's blocks ep-outermost (rank (d, e) holds block e * dp + d) against x's dp-outermost:
    // ranks (0, 1) and (1, 0) multiply pieces the spec never pairs. Ranks are (d * ep + e) *
    // tp + t: (0,0) = r0, (1,0) = r4, (0,1) = r2, (1,1) = r6.
    let (verdict, right, report) =
        bmm_on_three_dims("concat([r0.y, r4.y, r2.y, r6.y], 0)", |d, e| e * 2 + d);
    eprintln!("bmm, ep-outer y: {verdict:?} (right: {right})\n{report}");
    assert!(!right, "the mismatched orders are right when run\n{report}");
    assert_ne!(verdict, Verdict::Holds, "a false hold\n{report}");
    // The same order (dp outermost) as x: right when run.
    let (verdict, right, report) =
        bmm_on_three_dims("concat([r0.y, r2.y, r4.y, r6.y], 0)", |d, e| d * 2 + e);
    eprintln!("bmm, dp-outer y: {verdict:?} (right: {right})\n{report}");
    assert!(right, "the matching orders are wrong when run\n{report}");
}
