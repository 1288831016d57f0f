//! Property tests of `maximum` and `minimum` of partial extrema (harness: `common/props.rs`):
//! the maximum over ranks of the element-wise maximum of two per-rank maxima is the
//! element-wise maximum of the two maxima over ranks, so `maximum(Partial(max),
//! Partial(max))` is `Partial(max)`, and so is `maximum(Partial(max), Replicate)` (the
//! replicated operand is the same on every rank; a maximum takes it once however many ranks
//! hold it). The same for `minimum` and `Partial(min)`. Mixing max with min, or either with a
//! sum, or a partial with a shard, is no partial of anything. Every claim is checked against
//! the interpreter on random inputs.

mod common;
#[path = "common/props.rs"]
mod props;
use props::{In, Input, Program};
use shardproof_check::{Place, Red};

/// Inputs: `x`, `y` `[rows, 3]` with rows sharded on every mesh dim, `z` `[3]` replicated,
/// `w` `[rows, 3]` sharded like `x` (a shard beside the partials).
fn inputs(mesh: &[usize]) -> Vec<Input> {
    let rows = vec![In::S(0); mesh.len()];
    vec![
        Input::f("x", &[2, 3], &rows),
        Input::f("y", &[2, 3], &rows),
        Input::f("z", &[3], &vec![In::R; mesh.len()]),
        Input::f("w", &[1, 3], &vec![In::R; mesh.len()]),
    ]
}

/// A program of `lines` (spec and ranks alike) on `mesh`, checking `out`.
fn program(mesh: &[usize], lines: &[&str]) -> Program {
    let body: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    Program {
        mesh: mesh.to_vec(),
        inputs: inputs(mesh),
        spec: body.clone(),
        ranks: vec![body],
        checked: vec![("out".into(), "out".into())],
    }
}

const A: &str = "torch.ops.aten";

/// The per-rank reductions of the rows: `mx`/`my` maxima, `nx`/`ny` minima, `sx` a sum.
fn reductions() -> Vec<String> {
    vec![
        format!("mx = {A}.amax.default(x, [0])"),
        format!("my = {A}.amax.default(y, [0])"),
        format!("nx = {A}.amin.default(x, [0])"),
        format!("ny = {A}.amin.default(y, [0])"),
        format!("sx = {A}.sum.dim_IntList(x, [0])"),
    ]
}

/// Runs `out = <line>` after the reductions on every mesh and a few seeds; returns the
/// placements of the last run and whether every run checked its claim (no finding).
fn run(line: &str) -> Vec<(Vec<usize>, Vec<Place>, bool, bool)> {
    let mut lines = reductions();
    lines.push(format!("out = {line}"));
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for mesh in [vec![2], vec![3], vec![2, 2]] {
        let prog = program(&mesh, &refs);
        for seed in 1..=3 {
            let seen = props::run(&prog, seed).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert!(seen.skipped.is_none(), "{line}: {seen:?}");
            if seed == 3 {
                out.push((
                    mesh.clone(),
                    seen.places.first().cloned().unwrap_or_default(),
                    seen.claims == 1,
                    seen.finding,
                ));
            }
        }
    }
    out
}

/// Partial extrema of one kind, with each other or with a replicated operand: the partial
/// is kept, and the claim holds of the ranks' values.
#[test]
fn an_extremum_of_partial_extrema_of_its_kind_keeps_the_partial() {
    let kept = [
        (format!("{A}.maximum.default(mx, my)"), Red::Max),
        (format!("{A}.maximum.default(mx, z)"), Red::Max),
        (format!("{A}.maximum.default(z, mx)"), Red::Max),
        (format!("{A}.maximum.default(mx, w)"), Red::Max),
        (format!("{A}.minimum.default(nx, ny)"), Red::Min),
        (format!("{A}.minimum.default(z, ny)"), Red::Min),
    ];
    for (line, red) in &kept {
        for (mesh, places, checked, finding) in run(line) {
            assert!(!finding, "{line} on {mesh:?}: a finding");
            assert!(checked, "{line} on {mesh:?}: no claim checked ({places:?})");
            assert_eq!(places, vec![Place::Partial(*red); mesh.len()], "{line}");
        }
    }
}

/// Mixing the kinds (a maximum of a partial minimum, a minimum of partial maxima), a sum's
/// pieces, or a shard beside the partial: no partial is claimed (the rules find it).
#[test]
fn an_extremum_mixing_kinds_sums_or_shards_claims_no_partial() {
    let mixed = [
        format!("{A}.maximum.default(mx, ny)"),
        format!("{A}.maximum.default(nx, z)"),
        format!("{A}.minimum.default(mx, my)"),
        format!("{A}.maximum.default(mx, sx)"),
        format!("{A}.maximum.default(sx, z)"),
        format!("{A}.maximum.default(x, mx)"),
    ];
    for line in &mixed {
        for (mesh, places, checked, finding) in run(line) {
            assert!(
                !places.iter().any(|p| p.is_partial()),
                "{line} on {mesh:?}: {places:?}"
            );
            assert!(finding || !checked, "{line} on {mesh:?}: {places:?}");
        }
    }
}
