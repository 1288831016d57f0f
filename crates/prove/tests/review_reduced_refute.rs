//! A correct program refuted on reduced sizes (docs/prove.md section 2, "Value literals"): a
//! rank dividing by a literal that stands for a tensor size (a microbatch's mean over its
//! `b·S` tokens written as `div(g, 8)`, as the zoo's vocab-parallel cross-entropy backward
//! does), where the literal is also a product of mesh sizes (`pp·dp = 4·2 = 8`). A mesh-size
//! literal pins nothing, so the tokens reduce (8 -> 3) and there the literal no longer equals
//! the spec's size-derived `1/n`: the reduced programs really differ, the full ones do not.
//! The refutation is checked again on the sizes such a literal scales kept whole
//! (`reduce_case_pinning_scaled_sizes`), which proves the case where the full-size check
//! cannot be had; a wrong divisor is still refuted.

use shardproof_prove::reduce::{reduce_case, reduce_case_pinning_scaled_sizes, SCALED_SIZE_PIN};
use shardproof_prove::{prove_case, ProveConfig, Verdict};
use std::path::Path;

/// Tokens of the microbatch, as `pp·dp` of the mesh.
const TOKENS: usize = 8;

/// The spec's mean over `g [8, width]`'s tokens against every rank's `sum(div(g, divisor))`
/// on a `pp=4, dp=2` mesh, `g` replicated.
fn write(dir: &Path, width: usize, divisor: usize) -> shardproof_case::Case {
    std::fs::write(
        dir.join("spec.py"),
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, g: "f32[{TOKENS}, {width}]"):
        e: "f32[{TOKENS}, {width}]" = torch.ops.aten.exp.default(g)
        y: "f32[{width}]" = torch.ops.aten.mean.dim(e, [0])
        return (y,)
"#
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("r0.py"),
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, g: "f32[{TOKENS}, {width}]"):
        e: "f32[{TOKENS}, {width}]" = torch.ops.aten.exp.default(g)
        d: "f32[{TOKENS}, {width}]" = torch.ops.aten.div.Scalar(e, {divisor})
        y: "f32[{width}]" = torch.ops.aten.sum.dim_IntList(d, [0])
        return (y,)
"#
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: token-mean\nspec:\n  graph: spec.py\nimpl:\n  mesh: { pp: 4, dp: 2 }\n  graphs: [r0.py, r0.py, r0.py, r0.py, r0.py, r0.py, r0.py, r0.py]\ninputs:\n  g: Replicate()\noutputs:\n  y: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

fn reduced_tokens(r: &shardproof_prove::reduce::Reduction) -> u64 {
    r.inputs
        .iter()
        .find(|(name, _, _)| name == "g")
        .map(|(_, _, reduced)| reduced[0])
        .unwrap()
}

#[test]
fn a_mesh_size_literal_standing_for_the_tokens_refutes_the_reduced_case_only() {
    let dir = tempfile::tempdir().unwrap();
    let case = write(dir.path(), 6, TOKENS);
    // The cause: 8 is `pp·dp`, so it pins nothing and the tokens reduce to 3, where the
    // rank's 1/8 is not the spec's 1/3.
    let relaxed = reduce_case(&case).unwrap();
    assert!(
        relaxed.mesh_literals.contains(&8),
        "{:?}",
        relaxed.mesh_literals
    );
    assert_eq!(reduced_tokens(&relaxed), 3);
    let unreduced = ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    };
    let on_relaxed = prove_case(&relaxed.case, &unreduced);
    assert_eq!(
        on_relaxed.verdict,
        Verdict::Refuted,
        "{:?}",
        on_relaxed.message
    );
    let cx = on_relaxed
        .counterexample
        .expect("a confirmed counterexample");
    let ratio = cx.spec_value / cx.rebuilt_value;
    assert!((ratio - 8.0 / 3.0).abs() < 1e-9, "{ratio}");
    // The full-size case is right.
    assert_eq!(prove_case(&case, &unreduced).verdict, Verdict::Proved);
    // With the sizes the literal scales kept, the tokens stay 8 (the width still reduces).
    let pinned = reduce_case_pinning_scaled_sizes(&case).unwrap();
    assert_eq!(reduced_tokens(&pinned), 8);
    assert!(pinned.sizes.iter().any(|s| s.original == 8
        && s.why
            .as_deref()
            .is_some_and(|w| w.starts_with(SCALED_SIZE_PIN))));
    assert_eq!(pinned.inputs[0].2[1], 3, "{:?}", pinned.inputs);
}

#[test]
fn the_refutation_is_checked_on_the_sizes_the_literal_scales_and_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = write(dir.path(), 6, TOKENS);
    let proof = prove_case(&case, &ProveConfig::default());
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    // Proved on reduced sizes with the tokens kept, not at full size.
    let reduction = proof.reduction.expect("a reduced proof");
    let g = reduction.inputs.iter().find(|i| i.name == "g").unwrap();
    assert_eq!(g.reduced, vec![8, 3]);
}

#[test]
fn over_the_element_limit_the_sizes_the_literal_scales_still_decide() {
    // Width 64 = 8²: the strict reduction keeps it (a literal's square may stand for a size),
    // so strict sizes are the full ones, over the limit; with only the tokens kept the case
    // is small.
    let dir = tempfile::tempdir().unwrap();
    let case = write(dir.path(), 64, TOKENS);
    let cfg = ProveConfig {
        max_elements: 2_000,
        ..ProveConfig::default()
    };
    let proof = prove_case(&case, &cfg);
    assert_eq!(proof.verdict, Verdict::Proved, "{:?}", proof.message);
    let reduction = proof.reduction.expect("a reduced proof");
    assert!(
        reduction.elements_before > 2_000,
        "{}",
        reduction.elements_before
    );
    let g = reduction.inputs.iter().find(|i| i.name == "g").unwrap();
    assert_eq!(g.reduced[0], 8);
}

#[test]
fn a_wrong_divisor_is_refuted_with_the_sizes_kept_or_not() {
    for width in [6, 64] {
        for max_elements in [ProveConfig::default().max_elements, 2_000] {
            let dir = tempfile::tempdir().unwrap();
            // 4 = pp: a mesh-size literal too, scaling no dim of its size.
            let case = write(dir.path(), width, 4);
            let cfg = ProveConfig {
                max_elements,
                ..ProveConfig::default()
            };
            let proof = prove_case(&case, &cfg);
            assert_ne!(proof.verdict, Verdict::Proved, "{width} {max_elements}");
            if max_elements > 2_000 {
                assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
            }
        }
    }
}

#[test]
fn a_wrong_kernel_under_the_right_literal_is_not_proved_on_the_kept_sizes() {
    // The rank's literal is right (the retry keeps the tokens), its kernel is not (sigmoid
    // for exp): refuted where the case fits, never proved over the element limit, where the
    // kept sizes' proof is the only check before the strict reduction.
    for (width, max_elements) in [(6, ProveConfig::default().max_elements), (64, 2_000)] {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), width, TOKENS);
        let rank = std::fs::read_to_string(dir.path().join("r0.py")).unwrap();
        let wrong = rank.replace("aten.exp.default(g)", "aten.sigmoid.default(g)");
        assert_ne!(rank, wrong);
        std::fs::write(dir.path().join("r0.py"), wrong).unwrap();
        let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
        assert!(reduce_case_pinning_scaled_sizes(&case)
            .unwrap()
            .sizes
            .iter()
            .any(|s| s
                .why
                .as_deref()
                .is_some_and(|w| w.starts_with(SCALED_SIZE_PIN))));
        let cfg = ProveConfig {
            max_elements,
            ..ProveConfig::default()
        };
        let proof = prove_case(&case, &cfg);
        assert_ne!(
            proof.verdict,
            Verdict::Proved,
            "{width}: {:?}",
            proof.message
        );
        if width == 6 {
            assert_eq!(proof.verdict, Verdict::Refuted, "{:?}", proof.message);
        }
    }
}

/// A size-derived value in a polynomial of literals: the rank adds `(n² - 5n + 7 - 1)·mean`
/// with `n = sum(ones([8]))`, zero at `n = 2` and `n = 3` only. No literal (5, 7, 1) has 2 as a
/// divisor, so the rows reduce to 2, where the extra term vanishes: the reduced case is
/// proved while the full-size one (`n = 8`: 30·mean) is wrong. The no-coincidence rule keeps
/// reduced sizes off the literals, not off the roots of polynomials in sizes with literal
/// coefficients: the count `n` is a size read as a value, so the `ones` dim keeps its 8.
#[test]
fn a_size_in_a_polynomial_of_literals_is_not_proved_at_one_of_its_roots() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    std::fs::write(
        path.join("spec.py"),
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8, 3]"):
        y: "f32[3]" = torch.ops.aten.mean.dim(x, [0])
        return (y,)
"#,
    )
    .unwrap();
    std::fs::write(
        path.join("r0.py"),
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[8, 3]"):
        m: "f32[3]" = torch.ops.aten.mean.dim(x, [0])
        o: "f32[8]" = torch.ops.aten.ones.default([8], device = device(type='cpu'), pin_memory = False)
        n: "f32[]" = torch.ops.aten.sum.default(o)
        nn: "f32[]" = torch.ops.aten.mul.Tensor(n, n)
        n5: "f32[]" = torch.ops.aten.mul.Tensor(n, 5)
        a: "f32[]" = torch.ops.aten.sub.Tensor(nn, n5)
        b: "f32[]" = torch.ops.aten.add.Tensor(a, 7)
        c: "f32[]" = torch.ops.aten.sub.Tensor(b, 1)
        e: "f32[3]" = torch.ops.aten.mul.Tensor(m, c)
        y: "f32[3]" = torch.ops.aten.add.Tensor(m, e)
        return (y,)
"#,
    )
    .unwrap();
    std::fs::write(
        path.join("case.yaml"),
        "version: 1\nname: root\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r0.py]\ninputs:\n  x: Replicate()\noutputs:\n  y: Replicate()\n",
    )
    .unwrap();
    let case = shardproof_case::load_case(&path.join("case.yaml")).unwrap();
    let full = prove_case(
        &case,
        &ProveConfig {
            reduce: false,
            ..ProveConfig::default()
        },
    );
    assert_eq!(full.verdict, Verdict::Refuted, "{:?}", full.message);
    let reduced = prove_case(&case, &ProveConfig::default());
    assert_ne!(reduced.verdict, Verdict::Proved, "{:?}", reduced.reduction);
}
