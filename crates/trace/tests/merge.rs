//! The merge's consistency checks on hand-made shard maps: partial overlap, omission, scalar
//! tensors, and candidates with non-finite values or a reference of zero norm.

use shardproof_trace::*;
use std::path::Path;

fn id() -> CanonicalId {
    CanonicalId::new(0, 0, Kind::ForwardOutput, "layers.0.attn", 0)
}

/// A trace of one tensor of shape `shape` whose rank `r` holds the full box `boxes[r]` of the
/// values `full` (each with `edit` applied).
fn write(
    dir: &Path,
    role: Role,
    shape: &[u64],
    full: &[f64],
    boxes: &[Region],
    edit: impl Fn(usize, f64) -> f64,
) {
    let w = TraceWriter::create(
        dir,
        TraceMeta::new(role, boxes.len() as u64, RunDtype::Float64),
    )
    .unwrap();
    for (r, b) in boxes.iter().enumerate() {
        let mut rank = w.rank(r as u64, Coords::default()).unwrap();
        let local_shape = b.extents();
        let values: Vec<f64> = extract(full, shape, b)
            .into_iter()
            .map(|v| edit(r, v))
            .collect();
        let pieces = vec![Piece::boxed(Region::whole(&local_shape), b.clone())];
        rank.record(
            id(),
            Some("Attention"),
            shape,
            Local {
                shape: &local_shape,
                pieces,
            },
            &values,
        )
        .unwrap();
        rank.finish().unwrap();
    }
}

fn run(
    shape: &[u64],
    boxes: &[Region],
    edit: impl Fn(usize, f64) -> f64,
    full: &[f64],
) -> Comparison {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("ref"),
        Role::Reference,
        shape,
        full,
        &[Region::whole(shape)],
        |_, v| v,
    );
    write(
        &dir.path().join("cand"),
        Role::Candidate,
        shape,
        full,
        boxes,
        edit,
    );
    compare_dirs(&dir.path().join("ref"), &dir.path().join("cand")).unwrap()
}

fn rows(a: u64, b: u64) -> Region {
    Region(vec![[a, b], [0, 2]])
}

#[test]
fn partial_overlap_and_omission_are_findings() {
    let full: Vec<f64> = (1..=16).map(f64::from).collect();
    let overlap = run(&[8, 2], &[rows(0, 6), rows(4, 8)], |_, v| v, &full);
    assert_eq!(overlap.verdict, Verdict::Violated);
    let t = &overlap.tensors[0];
    assert_eq!(t.status.rule(), Some("shard-overlap"));
    assert!(t.message().contains("share [4:6, 0:2]"), "{}", t.message());
    let gap = run(&[8, 2], &[rows(0, 3), rows(5, 8)], |_, v| v, &full);
    let t = &gap.tensors[0];
    assert_eq!(t.status.rule(), Some("shard-omission"));
    assert!(
        t.message()
            .contains("4 elements are held by no rank, among them [3:5, 0:2]"),
        "{}",
        t.message()
    );
    // Identical boxes are replicas, not overlaps; tiles are consistent.
    let fine = run(
        &[8, 2],
        &[rows(0, 4), rows(4, 8), rows(0, 4)],
        |_, v| v,
        &full,
    );
    assert_eq!(fine.verdict, Verdict::Holds, "{}", fine.render());
}

#[test]
fn scalars_and_non_finite_values() {
    let scalar = run(&[], &[Region(vec![]), Region(vec![])], |_, v| v, &[2.5]);
    assert_eq!(scalar.verdict, Verdict::Holds, "{}", scalar.render());
    let full: Vec<f64> = (1..=16).map(f64::from).collect();
    let nan = run(
        &[8, 2],
        &[rows(0, 4), rows(4, 8)],
        |r, v| if r == 1 && v == 12.0 { f64::NAN } else { v },
        &full,
    );
    assert_eq!(nan.tensors[0].status, Status::Diverged);
    assert_eq!(nan.tensors[0].relative_error, Some(f64::INFINITY));
    // A zero reference: equal zeros hold, anything else diverges.
    let zeros = vec![0.0; 16];
    assert_eq!(
        run(&[8, 2], &[rows(0, 8)], |_, v| v, &zeros).verdict,
        Verdict::Holds
    );
    let off = run(&[8, 2], &[rows(0, 8)], |_, v| v + 1e-9, &zeros);
    assert_eq!(off.tensors[0].status, Status::Diverged);
}

#[test]
fn one_sided_tensors_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let full: Vec<f64> = (1..=4).map(f64::from).collect();
    write(
        &dir.path().join("ref"),
        Role::Reference,
        &[4],
        &full,
        &[Region::whole(&[4])],
        |_, v| v,
    );
    // The candidate records the same values under another id only.
    let w = TraceWriter::create(
        &dir.path().join("cand"),
        TraceMeta::new(Role::Candidate, 1, RunDtype::Float64),
    )
    .unwrap();
    let mut rank = w.rank(0, Coords::default()).unwrap();
    let other = CanonicalId::new(0, 0, Kind::ForwardOutput, "layers.0.mlp", 0);
    let pieces = vec![Piece::boxed(Region::whole(&[4]), Region::whole(&[4]))];
    rank.record(
        other,
        None,
        &[4],
        Local {
            shape: &[4],
            pieces,
        },
        &full,
    )
    .unwrap();
    rank.finish().unwrap();
    let result = compare_dirs(&dir.path().join("ref"), &dir.path().join("cand")).unwrap();
    assert_eq!(result.verdict, Verdict::Violated);
    let statuses: Vec<&Status> = result.tensors.iter().map(|t| &t.status).collect();
    assert_eq!(
        statuses,
        [&Status::MissingInCandidate, &Status::OnlyInCandidate]
    );
    assert!(
        result.summary.contains("missing-tensor"),
        "{}",
        result.summary
    );
}

/// A candidate whose two ranks hold the flat element ranges `[0, split)` and `[split, 12)` of
/// a [3, 4] tensor (a ZeRO shard of a contiguous buffer), written as `local_flat` pieces, each
/// rank's value at flat index `i` passed through `edit`.
fn flat_candidate(dir: &Path, split: u64, edit: impl Fn(u64, f64) -> f64) {
    let full: Vec<f64> = (1..=12).map(f64::from).collect();
    let mut meta = TraceMeta::new(Role::Candidate, 2, RunDtype::Float64);
    meta.parallel.dp = 2;
    let w = TraceWriter::create(dir, meta).unwrap();
    // Row-major boxes of each range: a partial row, whole rows, a partial row.
    let boxes = |a: u64, b: u64| -> Vec<Region> {
        let mut out = Vec::new();
        let mut i = a;
        while i < b {
            let (row, col) = (i / 4, i % 4);
            let end = if col == 0 && b - i >= 4 {
                i + (b - i) / 4 * 4
            } else {
                (row * 4 + 4).min(b)
            };
            let rows = [
                row,
                if col == 0 && end - i >= 4 {
                    row + (end - i) / 4
                } else {
                    row + 1
                },
            ];
            let cols = if col == 0 && end - i >= 4 {
                [0, 4]
            } else {
                [col, col + end - i]
            };
            out.push(Region(vec![rows, cols]));
            i = end;
        }
        out
    };
    for (r, (a, b)) in [(0, split), (split, 12)].into_iter().enumerate() {
        let mut rank = w
            .rank(
                r as u64,
                Coords {
                    dp: r as u64,
                    ..Coords::default()
                },
            )
            .unwrap();
        let mut start = 0;
        let pieces: Vec<Piece> = boxes(a, b)
            .into_iter()
            .map(|full_box| {
                let p = Piece::flat(start, full_box);
                start += p.full.volume();
                p
            })
            .collect();
        let values: Vec<f64> = (a..b).map(|i| edit(i, full[i as usize])).collect();
        let local_shape = [b - a];
        rank.record(
            id(),
            None,
            &[3, 4],
            Local {
                shape: &local_shape,
                pieces,
            },
            &values,
        )
        .unwrap();
        rank.finish().unwrap();
    }
}

#[test]
fn flat_ranges_across_rows_merge_into_the_full_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let full: Vec<f64> = (1..=12).map(f64::from).collect();
    write(
        &dir.path().join("ref"),
        Role::Reference,
        &[3, 4],
        &full,
        &[Region::whole(&[3, 4])],
        |_, v| v,
    );
    for (name, split, wrong) in [("ok", 6, None), ("ok-rows", 4, None), ("bad", 7, Some(9))] {
        let cand = dir.path().join(name);
        flat_candidate(
            &cand,
            split,
            |i, v| if Some(i) == wrong { v + 1.0 } else { v },
        );
        let text = std::fs::read_to_string(cand.join("rank-00001/index.json")).unwrap();
        assert!(text.contains("\"local_flat\""), "{text}");
        let c = compare_dirs(&dir.path().join("ref"), &cand).unwrap();
        let expected = if wrong.is_some() {
            Verdict::Violated
        } else {
            Verdict::Holds
        };
        assert_eq!(c.verdict, expected, "{name}: {}", c.tensors[0].message());
    }
}
