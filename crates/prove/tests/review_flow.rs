//! Adversarial cases for sizes read as values through data (`reduce/rules/size_values/flow.rs`,
//! docs/prove/reduction.md "Through data"): each rank scales or shifts a right result by a
//! value that reads a size and is right at the size a reduction would choose, not at full
//! size. Each is refuted at full size and must never be proved reduced.

use shardproof_prove::{prove_case, ProveConfig, Verdict};
use std::path::Path;

/// A case on a `tp=2` mesh, `x: f32[8, 3]` replicated: the spec returns `mean(x, 0)`, every
/// rank `m·c` with `m = mean(x, 0)` and `c` (`f32[]` or `f32[3]`) computed by `body`: right
/// where `c = 1`.
fn case_scaled_by(dir: &Path, body: &str) -> shardproof_case::Case {
    write_case(
        dir,
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[8, 3]\"):\n        y: \"f32[3]\" = torch.ops.aten.mean.dim(x, [0])\n        return (y,)\n",
        &format!("class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[8, 3]\"):\n        m: \"f32[3]\" = torch.ops.aten.mean.dim(x, [0])\n{body}\n        y: \"f32[3]\" = torch.ops.aten.mul.Tensor(m, c)\n        return (y,)\n"),
    )
}

/// A case with `x: f32[8]`: the spec returns `x`, every rank `x + x·q` with `q: f32[8]`
/// computed by `body`: right where `q = 0`.
fn case_shifted_by(dir: &Path, body: &str) -> shardproof_case::Case {
    write_case(
        dir,
        "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[8]\"):\n        y: \"f32[8]\" = torch.ops.aten.clone.default(x)\n        return (y,)\n",
        &format!("class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[8]\"):\n{POSITIONS}{body}\n        e: \"f32[8]\" = torch.ops.aten.mul.Tensor(x, q)\n        y: \"f32[8]\" = torch.ops.aten.add.Tensor(x, e)\n        return (y,)\n"),
    )
}

fn write_case(dir: &Path, spec: &str, rank: &str) -> shardproof_case::Case {
    std::fs::write(dir.join("spec.py"), spec).unwrap();
    std::fs::write(dir.join("r0.py"), rank).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: size-flow\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r0.py]\n  groups:\n    \"tp\": tp\ninputs:\n  x: Replicate()\noutputs:\n  y: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// `pf = float(arange(8))`: the positions `0..8`.
const POSITIONS: &str = "        p: \"i64[8]\" = torch.ops.aten.arange.start(0, 8, device = device(type='cpu'), pin_memory = False)\n        pf: \"f32[8]\" = torch.ops.aten._to_copy.default(p, dtype = torch.float32)\n";

/// Refuted at full size, never proved reduced (where the reduction is refused, it is not
/// proved either).
fn assert_not_proved(case: &shardproof_case::Case) {
    let full = prove_case(
        case,
        &ProveConfig {
            reduce: false,
            ..ProveConfig::default()
        },
    );
    eprintln!("full {:?} {:?}", full.verdict, full.message);
    // Without the run of the case as written, which would refute it before any reduction.
    let reduced = prove_case(
        case,
        &ProveConfig {
            run_first: false,
            ..ProveConfig::default()
        },
    );
    eprintln!("reduced {:?} {:?}", reduced.verdict, reduced.message);
    assert_eq!(full.verdict, Verdict::Refuted, "{:?}", full.message);
    assert_ne!(reduced.verdict, Verdict::Proved, "{:?}", reduced.reduction);
}

fn scaled(body: &str) {
    let dir = tempfile::tempdir().unwrap();
    assert_not_proved(&case_scaled_by(dir.path(), body));
}

fn shifted(body: &str) {
    let dir = tempfile::tempdir().unwrap();
    assert_not_proved(&case_shifted_by(dir.path(), body));
}

/// A view merging the repeated rows with the columns: `n = sum(view(ones([8, 3]), [24]))`,
/// `c = n/3 - 1`, 1 at 2 rows.
#[test]
fn a_view_merging_the_counted_rows() {
    scaled("        o: \"f32[8, 3]\" = torch.ops.aten.ones.default([8, 3], device = device(type='cpu'), pin_memory = False)\n        v: \"f32[24]\" = torch.ops.aten.view.default(o, [24])\n        n: \"f32[]\" = torch.ops.aten.sum.default(v)\n        n3: \"f32[]\" = torch.ops.aten.div.Tensor(n, 3)\n        c: \"f32[]\" = torch.ops.aten.sub.Tensor(n3, 1)");
}

/// A count of an `expand`: `c = sum(expand(ones([1]), [8])) - 1`.
#[test]
fn a_count_of_an_expand() {
    scaled("        o: \"f32[1]\" = torch.ops.aten.ones.default([1], device = device(type='cpu'), pin_memory = False)\n        e: \"f32[8]\" = torch.ops.aten.expand.default(o, [8])\n        n: \"f32[]\" = torch.ops.aten.sum.default(e)\n        c: \"f32[]\" = torch.ops.aten.sub.Tensor(n, 1)");
}

/// A count of a `repeat`: `c = sum(repeat(ones([1]), [8])) - 1`.
#[test]
fn a_count_of_a_repeat() {
    scaled("        o: \"f32[1]\" = torch.ops.aten.ones.default([1], device = device(type='cpu'), pin_memory = False)\n        e: \"f32[8]\" = torch.ops.aten.repeat.default(o, [8])\n        n: \"f32[]\" = torch.ops.aten.sum.default(e)\n        c: \"f32[]\" = torch.ops.aten.sub.Tensor(n, 1)");
}

/// A `cat` of a constant and data: `sum(cat(ones(8), sum(x, 1))) - sum(sum(x, 1)) - 1`.
#[test]
fn a_cat_of_a_constant_and_data() {
    scaled("        o: \"f32[8]\" = torch.ops.aten.ones.default([8], device = device(type='cpu'), pin_memory = False)\n        xc: \"f32[8]\" = torch.ops.aten.sum.dim_IntList(x, [1])\n        k: \"f32[16]\" = torch.ops.aten.cat.default([o, xc])\n        s: \"f32[]\" = torch.ops.aten.sum.default(k)\n        sx: \"f32[]\" = torch.ops.aten.sum.default(xc)\n        n: \"f32[]\" = torch.ops.aten.sub.Tensor(s, sx)\n        c: \"f32[]\" = torch.ops.aten.sub.Tensor(n, 1)");
}

/// `cumsum(x + 1) - cumsum(x)` is the positions plus 1; its maximum is the row count.
#[test]
fn a_cumsum_of_data_plus_one() {
    scaled("        x1: \"f32[8, 3]\" = torch.ops.aten.add.Tensor(x, 1)\n        a: \"f32[8, 3]\" = torch.ops.aten.cumsum.default(x1, 0)\n        b: \"f32[8, 3]\" = torch.ops.aten.cumsum.default(x, 0)\n        d: \"f32[8, 3]\" = torch.ops.aten.sub.Tensor(a, b)\n        n: \"f32[3]\" = torch.ops.aten.amax.default(d, [0])\n        c: \"f32[3]\" = torch.ops.aten.sub.Tensor(n, 1)");
}

/// The unbiased variance of the positions, `n(n + 1)/12`: `2·var` is 1 at 2 rows.
#[test]
fn an_unbiased_variance_of_positions() {
    scaled(&format!("{POSITIONS}        v: \"f32[]\" = torch.ops.aten.var.correction(pf, [0], correction = 1)\n        c: \"f32[]\" = torch.ops.aten.mul.Tensor(v, 2)"));
}

/// `exp(logsumexp(zeros(8))) = n`.
#[test]
fn a_logsumexp_of_zeros() {
    scaled("        z: \"f32[8]\" = torch.ops.aten.zeros.default([8], device = device(type='cpu'), pin_memory = False)\n        l: \"f32[]\" = torch.ops.aten.logsumexp.default(z, [0])\n        n: \"f32[]\" = torch.ops.aten.exp.default(l)\n        c: \"f32[]\" = torch.ops.aten.sub.Tensor(n, 1)");
}

/// `1/max(softmax(zeros(8))) = n`.
#[test]
fn a_softmax_of_zeros() {
    scaled("        z: \"f32[8]\" = torch.ops.aten.zeros.default([8], device = device(type='cpu'), pin_memory = False)\n        s: \"f32[8]\" = torch.ops.aten._softmax.default(z, 0, False)\n        s0: \"f32[]\" = torch.ops.aten.amax.default(s, [0])\n        n: \"f32[]\" = torch.ops.aten.reciprocal.default(s0)\n        c: \"f32[]\" = torch.ops.aten.sub.Tensor(n, 1)");
}

#[test]
fn an_index_select_of_positions() {
    scaled(&format!("{POSITIONS}        g: \"f32[8]\" = torch.ops.aten.index_select.default(pf, 0, p)\n        c: \"f32[]\" = torch.ops.aten.sum.default(g)"));
}

/// A division by a mean: `sum(x, 0)/mean(x, 0) = n`.
#[test]
fn a_sum_divided_by_a_mean() {
    scaled("        s: \"f32[3]\" = torch.ops.aten.sum.dim_IntList(x, [0])\n        n: \"f32[3]\" = torch.ops.aten.div.Tensor(s, m)\n        c: \"f32[3]\" = torch.ops.aten.sub.Tensor(n, 1)");
}

/// A mean then a sum over the same rows: `sum(expand(mean(ones), [8, 3]), 0) = n`.
#[test]
fn a_mean_then_a_sum_over_the_same_rows() {
    scaled("        o: \"f32[8, 3]\" = torch.ops.aten.ones.default([8, 3], device = device(type='cpu'), pin_memory = False)\n        mu: \"f32[1, 3]\" = torch.ops.aten.mean.dim(o, [0], True)\n        e: \"f32[8, 3]\" = torch.ops.aten.expand.default(mu, [8, 3])\n        n: \"f32[3]\" = torch.ops.aten.sum.dim_IntList(e, [0])\n        c: \"f32[3]\" = torch.ops.aten.sub.Tensor(n, 1)");
}

/// A count through an `all_reduce`: `sum(ones(8))` summed over 2 ranks is `2n`.
#[test]
fn a_count_through_an_all_reduce() {
    scaled("        o: \"f32[8]\" = torch.ops.aten.ones.default([8], device = device(type='cpu'), pin_memory = False)\n        n: \"f32[]\" = torch.ops.aten.sum.default(o)\n        r: \"f32[]\" = torch.ops._c10d_functional.all_reduce.default(n, 'sum', 'tp')\n        w: \"f32[]\" = torch.ops._c10d_functional.wait_tensor.default(r)\n        h: \"f32[]\" = torch.ops.aten.div.Tensor(w, 2)\n        c: \"f32[]\" = torch.ops.aten.sub.Tensor(h, 1)");
}

/// `pow(p, 2) - p` instead of `p·p - p`: zero at positions 0 and 1 only.
#[test]
fn a_pow_of_positions() {
    shifted("        sq: \"f32[8]\" = torch.ops.aten.pow.Tensor_Scalar(pf, 2)\n        q: \"f32[8]\" = torch.ops.aten.sub.Tensor(sq, pf)");
}

/// `p·p` as the diagonal of the outer product `mm(col, row)`.
#[test]
fn a_square_of_positions_through_mm() {
    shifted("        col: \"f32[8, 1]\" = torch.ops.aten.view.default(pf, [8, 1])\n        row: \"f32[1, 8]\" = torch.ops.aten.view.default(pf, [1, 8])\n        pp: \"f32[8, 8]\" = torch.ops.aten.mm.default(col, row)\n        dg: \"f32[8]\" = torch.ops.aten.diagonal.default(pp)\n        q: \"f32[8]\" = torch.ops.aten.sub.Tensor(dg, pf)");
}

/// `x·0 + p`: the positions `0..8` through data (the normal form cancels `x·0`).
const POSITIONS_THROUGH_DATA: &str = "        xc: \"f32[8]\" = torch.ops.aten.sum.dim_IntList(x, [1])\n        x0: \"f32[8]\" = torch.ops.aten.mul.Tensor(xc, 0)\n        a: \"f32[8]\" = torch.ops.aten.add.Tensor(x0, pf)\n";

/// `amax(x·0 + p) = n - 1`, 1 at 2 rows: the maximum of positions through data reads their
/// count, and the reduction moved the positions' length to 2 without keeping it.
#[test]
fn an_amax_of_positions_through_data() {
    scaled(&format!("{POSITIONS}{POSITIONS_THROUGH_DATA}        c: \"f32[]\" = torch.ops.aten.amax.default(a, [0])"));
}

/// `2·mean(x·0 + p) = n - 1`, 1 at 2 rows.
#[test]
fn a_mean_of_positions_through_data() {
    scaled(&format!("{POSITIONS}{POSITIONS_THROUGH_DATA}        mu: \"f32[]\" = torch.ops.aten.mean.default(a)\n        c: \"f32[]\" = torch.ops.aten.mul.Tensor(mu, 2)"));
}

/// `sum(x·0 + p) = n(n - 1)/2`, 1 at 2 rows: kept.
#[test]
fn a_sum_of_positions_through_data() {
    scaled(&format!(
        "{POSITIONS}{POSITIONS_THROUGH_DATA}        c: \"f32[]\" = torch.ops.aten.sum.default(a)"
    ));
}

/// `prod(x·0 + p + 1)/2 = n!/2`, 1 at 2 rows.
#[test]
fn a_prod_of_positions_through_data() {
    scaled(&format!("{POSITIONS}{POSITIONS_THROUGH_DATA}        a1: \"f32[8]\" = torch.ops.aten.add.Tensor(a, 1)\n        pr: \"f32[]\" = torch.ops.aten.prod.default(a1)\n        c: \"f32[]\" = torch.ops.aten.div.Tensor(pr, 2)"));
}

/// `argmax(x·0 + p) = n - 1`, 1 at 2 rows.
#[test]
fn an_argmax_of_positions_through_data() {
    scaled(&format!("{POSITIONS}{POSITIONS_THROUGH_DATA}        am: \"i64[]\" = torch.ops.aten.argmax.default(a)\n        c: \"f32[]\" = torch.ops.aten._to_copy.default(am, dtype = torch.float32)"));
}

/// `-amin(x·0 - p) = n - 1`, 1 at 2 rows.
#[test]
fn an_amin_of_positions_through_data() {
    scaled(&format!("{POSITIONS}{POSITIONS_THROUGH_DATA}        na: \"f32[8]\" = torch.ops.aten.neg.default(a)\n        mi: \"f32[]\" = torch.ops.aten.amin.default(na, [0])\n        c: \"f32[]\" = torch.ops.aten.neg.default(mi)"));
}
