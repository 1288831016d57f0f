//! An output declared as a shard of fused blocks (`blocks:` in the case) holds its pieces of
//! every block, concatenated in block order: a plain shard of that dim or of another is not
//! that layout. Before, any inferred shard passed the postcondition of a fused declaration,
//! whatever its dim.

use shardproof_case::{Blocks, Case, Layout};
use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

/// `y = relu(x)` with `x` sharded on dim 0 over tp=2, `y` declared `Shard(out_dim)` of
/// `count` fused blocks.
fn check(out_dim: usize, count: usize) -> Report {
    let text = format!(
        "mesh tp=2\n\
         input x: f32[4, 8] tp=Shard(0)\n\
         y = relu(x)\n\
         output y tp=Shard({out_dim})\n"
    );
    let mut case: Case =
        parse_plan(Path::new("fused.plan"), &text).unwrap_or_else(|e| panic!("{e}"));
    for out in &mut case.outputs {
        if let Layout::Placed(pl) = &mut out.layout {
            pl.blocks = Blocks::Equal { count, replicas: 1 };
        }
    }
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_shard_of_another_dim_never_passes_a_fused_declaration() {
    let r = check(1, 2);
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

#[test]
fn a_contiguous_shard_is_not_proven_to_be_the_fused_layout() {
    let r = check(0, 2);
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

#[test]
fn an_unfused_declaration_of_the_same_shard_holds() {
    let r = check(0, 1);
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}
