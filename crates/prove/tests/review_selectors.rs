//! Adversarial cases for the selector normal form (`expr/selector.rs`): comparisons of a
//! `where`, truth tables of comparisons, comparisons squared, and the other comparisons of an
//! index beside `[t == K]`. Each wrong program must never be proved (at full size or
//! reduced); each right one stays proved.

use shardproof_prove::{prove_case, ProveConfig, Verdict};
use std::path::Path;

/// Lines both graphs start with: `t` and `u` index `x` (so they are index symbols of bound
/// 4), `xs = x[t]`.
const PRELUDE: &str = "        xs: \"f32[4]\" = torch.ops.aten.gather.default(x, 0, t)\n        us: \"f32[4]\" = torch.ops.aten.gather.default(x, 0, u)\n";

/// `x: f32[4]`, `t, u: i64[4]` replicated on `tp=2`; the spec runs `spec`, every rank `rank`
/// (lines after [`PRELUDE`], ending in `y: f32[4]`).
fn case(dir: &Path, spec: &str, rank: &str) -> shardproof_case::Case {
    let graph = |body: &str| {
        format!(
            "class GraphModule(torch.nn.Module):\n    def forward(self, x: \"f32[4]\", t: \"i64[4]\", u: \"i64[4]\"):\n{PRELUDE}{body}\n        return (y,)\n"
        )
    };
    std::fs::write(dir.join("spec.py"), graph(spec)).unwrap();
    std::fs::write(dir.join("r0.py"), graph(rank)).unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: selectors\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r0.py]\ninputs:\n  x: Replicate()\n  t: Replicate()\n  u: Replicate()\noutputs:\n  y: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The verdicts at full size and reduced (messages printed).
fn verdicts(spec: &str, rank: &str) -> (Verdict, Verdict) {
    let dir = tempfile::tempdir().unwrap();
    let case = case(dir.path(), spec, rank);
    // Without the run of the case as written: every verdict comes from the symbolic layers,
    // whose normal form is under attack.
    let full = prove_case(
        &case,
        &ProveConfig {
            reduce: false,
            run_first: false,
            ..ProveConfig::default()
        },
    );
    let reduced = prove_case(
        &case,
        &ProveConfig {
            run_first: false,
            ..ProveConfig::default()
        },
    );
    eprintln!(
        "full {:?} {:?} {:?}",
        full.verdict, full.message, full.layers
    );
    eprintln!("reduced {:?} {:?}", reduced.verdict, reduced.message);
    (full.verdict, reduced.verdict)
}

/// `y` of the spec and of rank 0 run by the interpreter on `x = [0.5, 1, 1.5, 2]`, `t = [0,
/// 1, 2, 3]`, `u = [1, 2, 3, 0]`.
fn interpreted(spec: &str, rank: &str) -> (Vec<f64>, Vec<f64>) {
    use shardproof_ir::DType;
    use shardproof_ops::{Meta, Tensor};
    let dir = tempfile::tempdir().unwrap();
    let case = case(dir.path(), spec, rank);
    let tensor = |dtype, data: Vec<f64>| Tensor::new(Meta::new(dtype, vec![4]), data);
    let leaves: std::collections::BTreeMap<String, Tensor> = [
        ("x", tensor(DType::F32, vec![0.5, 1.0, 1.5, 2.0])),
        ("t", tensor(DType::I64, vec![0.0, 1.0, 2.0, 3.0])),
        ("u", tensor(DType::I64, vec![1.0, 2.0, 3.0, 0.0])),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), t))
    .collect();
    let y = |graph: &shardproof_ir::Graph| {
        let env = shardproof_interp::run_graph(graph, &leaves, &Default::default()).unwrap();
        env.get(graph.find("y").unwrap()).unwrap().data.to_vec()
    };
    (y(&case.spec), y(&case.program.ranks[0]))
}

/// A wrong rank program: refuted at full size, never proved reduced.
fn assert_wrong(spec: &str, rank: &str) {
    let (full, reduced) = verdicts(spec, rank);
    assert_eq!(full, Verdict::Refuted, "full size");
    assert_eq!(reduced, Verdict::Refuted, "reduced");
    assert_ne!(reduced, Verdict::Proved, "reduced");
}

/// A right rank program: proved at full size.
fn assert_right(spec: &str, rank: &str) {
    let (full, _) = verdicts(spec, rank);
    assert_eq!(full, Verdict::Proved, "full size");
}

/// `name = float(op(a, b))` as a graph line.
fn cmp(name: &str, op: &str, a: &str, b: &str) -> String {
    let kind = if b.parse::<f64>().is_ok() {
        "Scalar"
    } else {
        "Tensor"
    };
    format!("        {name}_b: \"b8[4]\" = torch.ops.aten.{op}.{kind}({a}, {b})\n        {name}: \"f32[4]\" = torch.ops.aten._to_copy.default({name}_b, dtype = torch.float32)\n")
}

fn mul(name: &str, a: &str, b: &str) -> String {
    format!("        {name}: \"f32[4]\" = torch.ops.aten.mul.Tensor({a}, {b})\n")
}

const Y_ZERO: &str = "        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(xs, 0)";

/// `[t == 1]·[t == 2]·xs` is 0; without the second selector it is not.
#[test]
fn selectors_of_two_constants_of_one_index() {
    let spec = format!(
        "{}{}{}{}",
        cmp("a", "eq", "t", "1"),
        cmp("b", "eq", "t", "2"),
        mul("ab", "a", "b"),
        "        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(ab, xs)"
    );
    let wrong = format!(
        "{}{}",
        cmp("a", "eq", "t", "1"),
        "        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(a, xs)"
    );
    assert_wrong(&spec, &wrong);
    assert_right(&spec, Y_ZERO);
}

/// `[t == 2]·[t < 2.5]` is `[t == 2]`; `[t == 2]·[t < 1.5]` is 0.
#[test]
fn a_selector_beside_a_comparison_with_a_half() {
    let sel = format!(
        "{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(a, xs)",
        cmp("a", "eq", "t", "2")
    );
    let below = |k: &str| {
        format!(
            "{}{}{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(ab, xs)",
            cmp("a", "eq", "t", "2"),
            cmp("b", "lt", "t", k),
            mul("ab", "a", "b")
        )
    };
    assert_right(&below("2.5"), &sel);
    assert_wrong(&below("1.5"), &sel);
    assert_wrong(&below("2.0"), &sel);
}

/// A float data value compared: `[x == 3]·[x < 2]` is 0 only for data, which is no index; the
/// product must not become `[x == 3]`.
#[test]
fn a_data_value_compared_is_no_selector() {
    let spec = format!(
        "{}{}{}        y: \"f32[4]\" = torch.ops.aten.add.Tensor(ab, xs)",
        cmp("a", "eq", "us", "3"),
        cmp("b", "lt", "us", "2"),
        mul("ab", "a", "b")
    );
    let wrong = format!(
        "{}        y: \"f32[4]\" = torch.ops.aten.add.Tensor(a, xs)",
        cmp("a", "eq", "us", "3")
    );
    assert_wrong(&spec, &wrong);
}

/// `ne(t, 1)·[t == 2]` is `[t == 2]`, not `[t == 1]`; `ne(t, 2)·[t == 2]` is 0.
#[test]
fn ne_beside_a_selector() {
    let spec = |k: &str| {
        format!(
            "{}{}{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(ab, xs)",
            cmp("a", "ne", "t", k),
            cmp("b", "eq", "t", "2"),
            mul("ab", "a", "b")
        )
    };
    let sel = |k: &str| {
        format!(
            "{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(a, xs)",
            cmp("a", "eq", "t", k)
        )
    };
    assert_right(&spec("1"), &sel("2"));
    assert_wrong(&spec("1"), &sel("1"));
    assert_right(&spec("2"), Y_ZERO);
    assert_wrong(&spec("3"), Y_ZERO);
}

/// `ge` of an integer index and a float: `[t >= 1.5]` is `[t >= 2]`, not `[t >= 1]`.
#[test]
fn ge_of_an_index_and_a_float() {
    let ge = |k: &str| {
        format!(
            "{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(a, xs)",
            cmp("a", "ge", "t", k)
        )
    };
    assert_wrong(&ge("1.5"), &ge("1"));
    let with_sel = |k: &str| {
        format!(
            "{}{}{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(ab, xs)",
            cmp("a", "ge", "t", k),
            cmp("b", "eq", "t", "1"),
            mul("ab", "a", "b")
        )
    };
    // Beside `[t == 1]`, `[t >= 1.5]` is 0 and `[t >= 0.5]` is 1.
    assert_right(&with_sel("1.5"), Y_ZERO);
    assert_wrong(&with_sel("0.5"), Y_ZERO);
}

/// A negative constant: `[t == -1]` is no selector (outside `[0, 4)`); `[t == -1]·[t == 1]`
/// is still 0, `[t + 1 == 0]`'s root is not `1`.
#[test]
fn a_negative_constant() {
    let spec = format!(
        "{}{}{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(ab, xs)",
        cmp("a", "eq", "t", "-1"),
        cmp("b", "ne", "t", "1"),
        mul("ab", "a", "b")
    );
    let sel = format!(
        "{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(a, xs)",
        cmp("a", "eq", "t", "1")
    );
    assert_wrong(&sel, &spec);
}

/// A sum of two indices compared: `[t + u == 2]·[t == 1]` is `[u == 1]·[t == 1]`, not
/// `[u == 2]·[t == 1]`.
#[test]
fn a_comparison_of_a_sum_of_two_indices() {
    let sum = "        s: \"i64[4]\" = torch.ops.aten.add.Tensor(t, u)\n";
    let spec = format!(
        "{sum}{}{}{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(ab, xs)",
        cmp("a", "eq", "s", "2"),
        cmp("b", "eq", "t", "1"),
        mul("ab", "a", "b")
    );
    let rank = |k: &str| {
        format!(
            "{}{}{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(ab, xs)",
            cmp("a", "eq", "u", k),
            cmp("b", "eq", "t", "1"),
            mul("ab", "a", "b")
        )
    };
    assert_right(&spec, &rank("1"));
    assert_wrong(&spec, &rank("2"));
}

/// A square of a value that is not a comparison stays a square: `xs·xs` is not `xs`, nor is
/// `where(t == 1, xs, 0)` squared.
#[test]
fn squares_of_non_comparisons_stay() {
    let sq = "        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(xs, xs)";
    let id = "        y: \"f32[4]\" = torch.ops.aten.clone.default(xs)";
    assert_wrong(sq, id);
    let w = "        cb: \"b8[4]\" = torch.ops.aten.eq.Scalar(t, 1)\n        w: \"f32[4]\" = torch.ops.aten.where.ScalarOther(cb, xs, 0.0)\n";
    assert_wrong(
        &format!("{w}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(w, w)"),
        &format!("{w}        y: \"f32[4]\" = torch.ops.aten.clone.default(w)"),
    );
    let sel = format!(
        "{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(a, xs)",
        cmp("a", "eq", "t", "1")
    );
    let sel2 = format!(
        "{}{}        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(aa, xs)",
        cmp("a", "eq", "t", "1"),
        mul("aa", "a", "a")
    );
    assert_right(&sel2, &sel);
}

/// The normal form keeps a monomial a selector zeroes where it holds an infinity:
/// `([t == 1]·-inf)·[t == 2]` is NaN (IEEE's `0·-inf`), never the polynomial 0.
#[test]
fn a_selector_never_zeroes_a_monomial_holding_an_infinity() {
    use shardproof_prove::expr::{Arena, SymbolKind};
    let mut ar = Arena::default();
    let t = ar.symbol("t", SymbolKind::Index(4)).unwrap();
    let (one, two) = (ar.int(1).unwrap(), ar.int(2).unwrap());
    let a = ar.eq(t, one).unwrap();
    let b = ar.eq(t, two).unwrap();
    let inf = ar.float(f64::NEG_INFINITY).unwrap();
    let ainf = ar.mul(a, inf).unwrap();
    let y = ar.mul(ainf, b).unwrap();
    assert_ne!(y, ar.int(0).unwrap());
    // Without the infinity the same product is 0.
    let ab = ar.mul(a, b).unwrap();
    assert_eq!(ab, ar.int(0).unwrap());
}

/// `0·inf`: `[t == 1]·[t == 2]·log(0)` is NaN (IEEE's `0·-inf`), not 0.
#[test]
fn a_vanishing_selector_product_times_an_infinity_is_not_zero() {
    let spec = format!(
        "{}{}{}        z: \"f32[4]\" = torch.ops.aten.mul.Tensor(xs, 0)\n        l: \"f32[4]\" = torch.ops.aten.log.default(z)\n        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(ab, l)",
        cmp("a", "eq", "t", "1"),
        cmp("b", "eq", "t", "2"),
        mul("ab", "a", "b")
    );
    let (full, reduced) = verdicts(&spec, Y_ZERO);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
    // The same with the infinity multiplied in between: `([t == 1]·log(0))·[t == 2]`, one
    // monomial the selector rule sees whole.
    let spec = format!(
        "{}{}        z: \"f32[4]\" = torch.ops.aten.mul.Tensor(xs, 0)\n        l: \"f32[4]\" = torch.ops.aten.log.default(z)\n        al: \"f32[4]\" = torch.ops.aten.mul.Tensor(a, l)\n        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(al, b)",
        cmp("a", "eq", "t", "1"),
        cmp("b", "eq", "t", "2"),
    );
    let (spec_y, rank_y) = interpreted(&spec, Y_ZERO);
    assert!(spec_y.iter().all(|v| v.is_nan()), "{spec_y:?}");
    assert_eq!(rank_y, [0.0; 4]);
    let (full, reduced) = verdicts(&spec, Y_ZERO);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
}

/// A comparison of a `where` with an infinite branch: `[where(t == 1, log(0), xs) == 0]`.
/// The branch `log(0) == 0` is false, never the data branch's value.
#[test]
fn a_comparison_of_a_where_with_an_infinite_branch() {
    let pre = "        z: \"f32[4]\" = torch.ops.aten.mul.Tensor(xs, 0)\n        l: \"f32[4]\" = torch.ops.aten.log.default(z)\n        cb: \"b8[4]\" = torch.ops.aten.eq.Scalar(t, 1)\n        w: \"f32[4]\" = torch.ops.aten.where.self(cb, l, xs)\n";
    let spec = format!(
        "{pre}{}        y: \"f32[4]\" = torch.ops.aten.add.Tensor(a, xs)",
        cmp("a", "eq", "w", "0")
    );
    // Right: `[w == 0] = [t != 1]·[xs == 0]`.
    let right = format!(
        "{pre}{}{}{}        y: \"f32[4]\" = torch.ops.aten.add.Tensor(ab, xs)",
        cmp("a", "ne", "t", "1"),
        cmp("b", "eq", "xs", "0"),
        mul("ab", "a", "b")
    );
    let wrong = format!(
        "{pre}{}        y: \"f32[4]\" = torch.ops.aten.add.Tensor(b, xs)",
        cmp("b", "eq", "xs", "0")
    );
    assert_wrong(&spec, &wrong);
    assert_right(&spec, &right);
}

/// A truth table of four comparisons: `[a + b + c + d == 2]` (exactly two of four) is not
/// `[a + b + c + d >= 2]`.
#[test]
fn a_truth_table_of_four_comparisons() {
    let atoms = format!(
        "{}{}{}{}",
        cmp("a", "eq", "t", "0"),
        cmp("b", "eq", "u", "1"),
        cmp("c", "gt", "xs", "0"),
        cmp("d", "lt", "us", "1")
    );
    let s = "        s1: \"f32[4]\" = torch.ops.aten.add.Tensor(a, b)\n        s2: \"f32[4]\" = torch.ops.aten.add.Tensor(s1, c)\n        s: \"f32[4]\" = torch.ops.aten.add.Tensor(s2, d)\n";
    let spec = format!(
        "{atoms}{s}{}        y: \"f32[4]\" = torch.ops.aten.add.Tensor(e, xs)",
        cmp("e", "eq", "s", "2")
    );
    let wrong = format!(
        "{atoms}{s}{}        y: \"f32[4]\" = torch.ops.aten.add.Tensor(e, xs)",
        cmp("e", "ge", "s", "2")
    );
    assert_wrong(&spec, &wrong);
}

/// `[xs > 0]·log(0)·[xs < 0]` is NaN everywhere (IEEE's `0·-inf`), without any selector: the
/// product of the comparisons is 0 only over the reals.
#[test]
fn two_exclusive_comparisons_times_an_infinity_are_not_zero() {
    let spec = format!(
        "{}{}        z: \"f32[4]\" = torch.ops.aten.mul.Tensor(xs, 0)\n        l: \"f32[4]\" = torch.ops.aten.log.default(z)\n        al: \"f32[4]\" = torch.ops.aten.mul.Tensor(a, l)\n        y: \"f32[4]\" = torch.ops.aten.mul.Tensor(al, b)",
        cmp("a", "gt", "xs", "0"),
        cmp("b", "lt", "xs", "0"),
    );
    let (spec_y, rank_y) = interpreted(&spec, Y_ZERO);
    assert!(spec_y.iter().all(|v| v.is_nan()), "{spec_y:?}");
    assert_eq!(rank_y, [0.0; 4]);
    let (full, reduced) = verdicts(&spec, Y_ZERO);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
}

/// `log(0) - log(0)` is NaN, not 0.
#[test]
fn an_infinity_minus_itself_is_not_zero() {
    let spec = "        z: \"f32[4]\" = torch.ops.aten.mul.Tensor(xs, 0)\n        l: \"f32[4]\" = torch.ops.aten.log.default(z)\n        d: \"f32[4]\" = torch.ops.aten.sub.Tensor(l, l)\n        y: \"f32[4]\" = torch.ops.aten.add.Tensor(d, xs)";
    let rank = "        y: \"f32[4]\" = torch.ops.aten.clone.default(xs)";
    let (spec_y, _) = interpreted(spec, rank);
    assert!(spec_y.iter().all(|v| v.is_nan()), "{spec_y:?}");
    let (full, reduced) = verdicts(spec, rank);
    assert_ne!(full, Verdict::Proved);
    assert_ne!(reduced, Verdict::Proved);
}
