//! Adversarial review of `constant_pad_nd` in shape reduction (`reduce/rules.rs`): is the
//! reduced verdict always the full-size one? An expert-parallel style combine (each tp rank
//! holds 4 of 8 columns, zero-pads them to 8 and the ranks sum) under every pair of column
//! widths (`lo + hi = 4`: only `[0, 4]` on rank 0 and `[4, 0]` on rank 1 is right), and with
//! rows padded too, by widths tied to the rows' size (6: all of it, 3: half of it) or not, the
//! ranks padding the rows as the spec does or mirrored. Every case is proved with and without
//! the reduction and the verdicts compared, with what the programs are known to compute.

use shardproof_prove::{prove_case, ProveConfig, Verdict};
use std::path::Path;

const ROWS: i64 = 6;

/// The spec pads `relu(x)` `[6, 8]` by `rows` above and below; rank r pads its 4 columns by
/// `cols[r]` and its rows by `rank_rows`, and the ranks sum.
fn write(
    dir: &Path,
    cols: [[i64; 2]; 2],
    rows: [i64; 2],
    rank_rows: [i64; 2],
) -> shardproof_case::Case {
    let out_rows = ROWS + rows[0] + rows[1];
    std::fs::write(
        dir.join("spec.py"),
        format!(
            r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{ROWS}, 8]"):
        a: "f32[{ROWS}, 8]" = torch.ops.aten.relu.default(x)
        y: "f32[{out_rows}, 8]" = torch.ops.aten.constant_pad_nd.default(a, [0, 0, {}, {}], 0.0)
        return (y,)
"#,
            rows[0], rows[1]
        ),
    )
    .unwrap();
    for (r, [lo, hi]) in cols.iter().enumerate() {
        let width = 4 + lo + hi;
        let rank_out = ROWS + rank_rows[0] + rank_rows[1];
        std::fs::write(
            dir.join(format!("r{r}.py")),
            format!(
                r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[{ROWS}, 4]"):
        a: "f32[{ROWS}, 4]" = torch.ops.aten.relu.default(x)
        p: "f32[{rank_out}, {width}]" = torch.ops.aten.constant_pad_nd.default(a, [{lo}, {hi}, {}, {}], 0.0)
        s: "f32[{rank_out}, {width}]" = torch.ops._c10d_functional.all_reduce.default(p, 'sum', 'tp')
        y: "f32[{rank_out}, {width}]" = torch.ops._c10d_functional.wait_tensor.default(s)
        return (y,)
"#,
                rank_rows[0], rank_rows[1]
            ),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("case.yaml"),
        "version: 1\nname: padded\nspec:\n  graph: spec.py\nimpl:\n  mesh: { tp: 2 }\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Shard(1)\noutputs:\n  y: Replicate()\n",
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The verdicts with and without the reduction, which must agree, and the reduced proof's
/// reduction (whether one was made).
fn verdict(case: &shardproof_case::Case) -> (Verdict, bool) {
    let reduced = prove_case(case, &ProveConfig::default());
    let full = prove_case(
        case,
        &ProveConfig {
            reduce: false,
            ..ProveConfig::default()
        },
    );
    assert_eq!(reduced.verdict, full.verdict, "{:?}", reduced.message);
    if reduced.verdict == Verdict::Refuted {
        assert!(reduced.counterexample.is_some(), "{:?}", reduced.message);
    }
    (reduced.verdict, reduced.reduction.is_some())
}

#[test]
fn every_pair_of_column_widths_gets_its_full_size_verdict() {
    let mut reduced = 0;
    for lo0 in 0..=4 {
        for lo1 in 0..=4 {
            let cols = [[lo0, 4 - lo0], [lo1, 4 - lo1]];
            let dir = tempfile::tempdir().unwrap();
            let case = write(dir.path(), cols, [0, 0], [0, 0]);
            let right = lo0 == 0 && lo1 == 4;
            let (v, r) = verdict(&case);
            let want = if right {
                Verdict::Proved
            } else {
                Verdict::Refuted
            };
            assert_eq!(v, want, "{cols:?}");
            reduced += usize::from(r);
        }
    }
    // The widths that share a unit with the 4 columns (0, 2, 4) reduce; the others keep them.
    assert!(reduced >= 9, "{reduced}");
}

#[test]
fn row_widths_tied_to_the_rows_size_get_their_full_size_verdict() {
    let right_cols = [[0, 4], [4, 0]];
    for rows in [
        [ROWS, 0],
        [0, ROWS],
        [ROWS / 2, ROWS / 2],
        [ROWS, ROWS],
        [2, 1],
        [ROWS, 3],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let case = write(dir.path(), right_cols, rows, rows);
        assert_eq!(verdict(&case).0, Verdict::Proved, "{rows:?}");
        if rows[0] != rows[1] {
            // The ranks pad the rows mirrored: the same shape, the rows moved.
            let dir = tempfile::tempdir().unwrap();
            let case = write(dir.path(), right_cols, rows, [rows[1], rows[0]]);
            assert_eq!(verdict(&case).0, Verdict::Refuted, "{rows:?} mirrored");
        }
    }
    // A row width of the rows' size against the same total split otherwise (6 = 4 + 2).
    let dir = tempfile::tempdir().unwrap();
    let case = write(dir.path(), right_cols, [ROWS, 0], [4, 2]);
    assert_eq!(verdict(&case).0, Verdict::Refuted);
}
