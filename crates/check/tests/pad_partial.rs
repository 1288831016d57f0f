//! An expert-parallel rank puts its columns back in place with a rank-dependent zero pad
//! (`constant_pad_nd(x, [k*w, (n-1-k)*w])` on coordinate k) before a reduce-scatter: the
//! ranks' padded tensors sum to the whole tensor, a partial sum (DeepSeek's `ep=2` full
//! iteration, inconclusive before). Pads at another coordinate's block, or with a nonzero
//! value, are no partial sum.

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(pad: &str, value: &str) -> Report {
    let text = format!(
        "mesh ep=2\n\
         input x: f32[4, 4] ep=Shard(1)\n\
         y = constant_pad_nd(x, {pad}{value})\n\
         r = reduce_scatter(y, sum, ep)\n\
         output r ep=Shard(0)\n"
    );
    let case = parse_plan(Path::new("pad_partial.plan"), &text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap()
}

#[test]
fn a_zero_pad_at_the_own_block_is_a_partial_sum() {
    let r = check("[ep[0, 2], ep[2, 0]]", "");
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

#[test]
fn a_pad_at_another_block_or_of_another_value_is_not() {
    for (pad, value) in [
        ("[ep[2, 0], ep[0, 2]]", ""),
        ("[ep[0, 2], ep[2, 0]]", ", 1.0"),
    ] {
        let r = check(pad, value);
        assert_ne!(r.verdict, Verdict::Holds, "{pad}{value}: {}", r.render());
    }
}
