//! The two exact rules: a recomputation (`recompute_input` / `recompute_output`) must equal the
//! same trace's forward value bit for bit, and replicas declared bit-identical
//! (`exact_replicas`) must not differ at all, whatever the tolerance.

use shardproof_trace::*;
use std::path::Path;

const SHAPE: [u64; 2] = [4, 8];

fn values(scale: f64) -> Vec<f64> {
    (0..32)
        .map(|i| scale * (1.0 + f64::from(i) / 7.0))
        .collect()
}

fn id(kind: Kind, module: &str) -> CanonicalId {
    CanonicalId::new(0, 0, kind, module, 0)
}

/// One tensor record: its id, its values (the full tensor) and whether its replicas are
/// declared exact.
struct Rec {
    id: CanonicalId,
    full: Vec<f64>,
    exact: bool,
}

fn rec(kind: Kind, module: &str, full: Vec<f64>) -> Rec {
    Rec {
        id: id(kind, module),
        full,
        exact: false,
    }
}

/// A trace whose every rank records every tensor whole (replicas), in order; `edit(rank, k,
/// values)` changes the values rank `rank` records for tensor `k`.
fn write(
    dir: &Path,
    role: Role,
    ranks: u64,
    records: &[Rec],
    edit: impl Fn(u64, usize, &mut Vec<f64>),
) {
    let mut meta = TraceMeta::new(role, ranks, RunDtype::Float32);
    meta.parallel.tp = ranks;
    let w = TraceWriter::create(dir, meta).unwrap();
    let whole = Region::whole(&SHAPE);
    for r in 0..ranks {
        let mut rank = w
            .rank(
                r,
                Coords {
                    tp: r,
                    ..Coords::default()
                },
            )
            .unwrap();
        for (k, t) in records.iter().enumerate() {
            let mut v = t.full.clone();
            edit(r, k, &mut v);
            rank.set_exact_replicas(t.exact);
            let pieces = vec![Piece::boxed(whole.clone(), whole.clone())];
            rank.record(
                t.id.clone(),
                Some("Linear"),
                &SHAPE,
                Local {
                    shape: &SHAPE,
                    pieces,
                },
                &v,
            )
            .unwrap();
        }
        rank.finish().unwrap();
    }
}

fn compare_with(
    reference: &[Rec],
    candidate: &[Rec],
    edit: impl Fn(u64, usize, &mut Vec<f64>),
) -> Comparison {
    let dir = tempfile::tempdir().unwrap();
    let (r, c) = (dir.path().join("ref"), dir.path().join("cand"));
    write(&r, Role::Reference, 1, reference, |_, _, _| {});
    write(&c, Role::Candidate, 2, candidate, edit);
    compare_dirs(&r, &c).unwrap()
}

/// The reference of a recomputed module's backward: the gradient of its output, then of its
/// input.
fn reference() -> Vec<Rec> {
    vec![
        rec(Kind::ForwardOutput, "layers.0.fc", values(1.0)),
        rec(Kind::GradOutput, "layers.0.fc", values(0.5)),
        rec(Kind::GradInput, "layers.0.fc", values(0.25)),
    ]
}

/// The candidate recomputes the module between the two gradients, as activation
/// recomputation does.
fn recomputing() -> Vec<Rec> {
    vec![
        rec(Kind::ForwardOutput, "layers.0.fc", values(1.0)),
        rec(Kind::GradOutput, "layers.0.fc", values(0.5)),
        rec(Kind::RecomputeOutput, "layers.0.fc", values(1.0)),
        rec(Kind::GradInput, "layers.0.fc", values(0.25)),
    ]
}

/// One ulp of f32 on element 5.
fn ulp(v: &mut [f64]) {
    v[5] = f64::from(f32::from_bits((v[5] as f32).to_bits() + 1));
}

#[test]
fn a_bit_identical_recomputation_holds_and_says_so() {
    let result = compare_with(&reference(), &recomputing(), |_, _, _| {});
    assert_eq!(result.verdict, Verdict::Holds, "{}", result.render());
    assert!(
        result
            .summary
            .contains("1 recomputations bit-identical to the forward"),
        "{}",
        result.summary
    );
    let t = result
        .tensors
        .iter()
        .find(|t| t.id.kind == Kind::RecomputeOutput)
        .unwrap();
    let check = t.recompute.as_ref().unwrap();
    assert_eq!((check.elements, check.unequal), (64, 0));
    // Never compared with the reference, which has no recomputation.
    assert!(t.tolerance.is_none() && t.status == Status::Passed);
}

#[test]
fn a_recomputation_one_ulp_off_is_the_first_divergence() {
    // The recomputation differs by one ulp on rank 1, far inside any tolerance; the gradient
    // of the input, computed from it, diverges beyond tolerance, but later.
    let result = compare_with(&reference(), &recomputing(), |r, k, v| {
        if r == 1 && k == 2 {
            ulp(v);
        }
        if k == 3 {
            v[0] += 1.0;
        }
    });
    assert_eq!(result.verdict, Verdict::Violated);
    let first = &result.tensors[result.first_divergence.unwrap()];
    assert_eq!(first.name, "it0/mb0/recompute_output/layers.0.fc/0");
    assert_eq!(first.status.rule(), Some("recompute-mismatch"));
    let check = first.recompute.as_ref().unwrap();
    assert_eq!((check.rank, check.unequal), (1, 1));
    assert!(check.relative_error > 0.0 && check.relative_error < 1e-7);
    assert!(
        result.summary.contains(
            "first divergence at module `layers.0.fc` (recompute_output, iteration 0, microbatch 0)"
        ),
        "{}",
        result.summary
    );
    let text = result.render();
    assert!(
        text.contains(
            "tolerance:       none: the recomputation must equal the forward value bit for bit"
        ),
        "{text}"
    );
    // Execution order: the recomputation after the gradient recorded before it, before the next.
    let order: Vec<&str> = result.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        order[1..],
        [
            "it0/mb0/grad_output/layers.0.fc/0",
            "it0/mb0/recompute_output/layers.0.fc/0",
            "it0/mb0/grad_input/layers.0.fc/0"
        ]
    );
}

#[test]
fn a_recomputation_without_its_forward_value_is_not_judged() {
    let mut candidate = recomputing();
    candidate.remove(0);
    let mut reference = reference();
    reference.remove(0);
    let result = compare_with(&reference, &candidate, |_, _, _| {});
    assert_eq!(result.verdict, Verdict::Inconclusive, "{}", result.render());
    let t = result
        .tensors
        .iter()
        .find(|t| t.id.kind == Kind::RecomputeOutput)
        .unwrap();
    assert!(
        t.message().contains("rank 0 recorded no forward value"),
        "{}",
        t.message()
    );
}

#[test]
fn replicas_declared_exact_must_not_differ_at_all() {
    let candidate = |exact: bool| {
        vec![Rec {
            exact,
            ..rec(Kind::ForwardOutput, "layers.0.fc.input_amax", values(1.0))
        }]
    };
    let reference = vec![rec(
        Kind::ForwardOutput,
        "layers.0.fc.input_amax",
        values(1.0),
    )];
    let off = |r: u64, _: usize, v: &mut Vec<f64>| {
        if r == 1 {
            ulp(v);
        }
    };
    // Judged by the tolerance, one ulp is nothing.
    let loose = compare_with(&reference, &candidate(false), off);
    assert_eq!(loose.verdict, Verdict::Holds, "{}", loose.render());
    assert_eq!(loose.tensors[0].replicas.as_ref().unwrap().unequal, None);
    // Declared exact, it is a replica disagreement.
    let exact = compare_with(&reference, &candidate(true), off);
    assert_eq!(exact.verdict, Verdict::Violated, "{}", exact.render());
    let t = &exact.tensors[0];
    assert_eq!(t.status, Status::ReplicasDisagree);
    assert_eq!(t.replicas.as_ref().unwrap().unequal, Some(1));
    assert!(
        t.message()
            .contains("1 elements differ where the replicas are declared bit-identical"),
        "{}",
        t.message()
    );
    // Declared exact and bit-identical, it holds.
    let same = compare_with(&reference, &candidate(true), |_, _, _| {});
    assert_eq!(same.verdict, Verdict::Holds, "{}", same.render());
    assert_eq!(same.tensors[0].replicas.as_ref().unwrap().unequal, Some(0));
}

#[test]
fn exact_replicas_is_an_optional_boolean_of_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let records = [Rec {
        exact: true,
        ..rec(Kind::ForwardOutput, "layers.0.fc", values(1.0))
    }];
    write(dir.path(), Role::Candidate, 1, &records, |_, _, _| {});
    let index = dir.path().join("rank-00000/index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    assert!(text.contains("\"exact_replicas\": true"), "{text}");
    let trace = Trace::open(dir.path()).unwrap();
    assert!(trace.ranks[0].index.tensors[0].exact_replicas);
    std::fs::write(
        &index,
        text.replace("\"exact_replicas\": true", "\"exact_replicas\": 1"),
    )
    .unwrap();
    let err = Trace::open(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("$.tensors[0].exact_replicas") && err.contains("expected a boolean"),
        "{err}"
    );
}
