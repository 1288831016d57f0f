//! ZeRO's gradient relayout: a partial gradient whose column blocks a view and a permute move
//! to dim 0 is reduce-scattered into the rank's column block (`Shard(1)`), updated against the
//! rank's slice of the weight, gathered and moved back. The right program holds; a program
//! that skips a permute, or pairs the chunk with the wrong layout, never does.

use shardproof_check::{check_case, plan::parse_plan, Report, Verdict};
use std::path::Path;

fn check(text: &str) -> Report {
    let case = parse_plan(Path::new("zero.plan"), text).unwrap_or_else(|e| panic!("{e}"));
    check_case(&case).unwrap_or_else(|e| panic!("{e}"))
}

/// The ZeRO-2 step with `to_dim0` the relayout of the gradient before the reduce-scatter and
/// `back` the relayout of the gathered update.
fn zero2(to_dim0: &str, back: &str, out: &str) -> String {
    format!(
        "mesh dp=2\n\
         input g: f32[16, 16] dp=Partial()\n\
         input w: f32[16, 16] dp=Replicate()\n\
         {to_dim0}\
         ch = reduce_scatter(f, sum, dp)\n\
         wc = slice(w, 1, dp[0, 8], dp[8, 16])\n\
         st = mul(ch, 0.1)\n\
         u = sub(wc, st)\n\
         ga = all_gather(u, dp)\n\
         {back}\
         {out}"
    )
}

const TO_DIM0: &str = "v = view(g, [16, 2, 8])\n\
                       p = permute(v, [1, 0, 2])\n\
                       c = clone(p)\n\
                       f = view(c, [32, 8])\n";
const BACK: &str = "s = view(ga, [2, 16, 8])\n\
                    q = permute(s, [1, 0, 2])\n\
                    cc = clone(q)\n\
                    w_new = view(cc, [16, 16])\n";

#[test]
fn zero2_relayout_holds() {
    let r = check(&zero2(TO_DIM0, BACK, "output w_new dp=Replicate()\n"));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
    assert_eq!(r.unknown_values, 0, "{}", r.render());
    // The chunk is the rank's column block of the summed gradient.
    let r = check(&zero2(TO_DIM0, BACK, "output ch dp=Shard(1)\n"));
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// Without the permute, dim 0 of `[32, 8]` holds the rows' halves: the chunk is rows of the
/// flattened gradient, not the rank's columns.
#[test]
fn a_relayout_without_its_permute_is_never_a_pass() {
    let to_dim0 = "v = view(g, [16, 2, 8])\n\
                   c = clone(v)\n\
                   f = view(c, [32, 8])\n";
    let r = check(&zero2(to_dim0, BACK, "output w_new dp=Replicate()\n"));
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
    let r = check(&zero2(TO_DIM0, BACK, "output ch dp=Shard(0)\n"));
    assert_eq!(r.verdict, Verdict::Violated, "{}", r.render());
}

/// A split whose outer part is not the mesh dim's size: the reduce-scatter's chunks are no
/// column block.
#[test]
fn a_split_of_another_size_is_no_column_block() {
    let to_dim0 = "v = view(g, [16, 4, 4])\n\
                   p = permute(v, [1, 0, 2])\n\
                   c = clone(p)\n\
                   f0 = view(c, [64, 4])\n\
                   f = view(f0, [32, 8])\n";
    let r = check(&zero2(to_dim0, BACK, "output w_new dp=Replicate()\n"));
    assert_ne!(r.verdict, Verdict::Holds, "{}", r.render());
}

/// The claims against the interpreter: on random inputs (the gradient a partial sum, the
/// weight replicated), every rank's chunk is its column block of the summed gradient
/// (`Shard(1)`), and every rank's updated weight is the whole update (`Replicate()`), for 2
/// and 4 ranks.
#[test]
fn zero2_claims_agree_with_the_interpreter() {
    use rand::{Rng, SeedableRng};
    use shardproof_ir::{DType, ValueId};
    use shardproof_ops::{Meta, Tensor};
    use std::collections::BTreeMap;
    for n in [2usize, 4] {
        let piece = 16 / n;
        let blocks: Vec<String> = (0..n).map(|r| (r * piece).to_string()).collect();
        let ends: Vec<String> = (1..=n).map(|r| (r * piece).to_string()).collect();
        let text = format!(
            "mesh dp={n}\n\
             input g: f32[16, 16] dp=Partial()\n\
             input w: f32[16, 16] dp=Replicate()\n\
             v = view(g, [16, {n}, {piece}])\n\
             p = permute(v, [1, 0, 2])\n\
             c = clone(p)\n\
             f = view(c, [{}, {piece}])\n\
             ch = reduce_scatter(f, sum, dp)\n\
             wc = slice(w, 1, dp[{}], dp[{}])\n\
             st = mul(ch, 0.1)\n\
             u = sub(wc, st)\n\
             ga = all_gather(u, dp)\n\
             s = view(ga, [{n}, 16, {piece}])\n\
             q = permute(s, [1, 0, 2])\n\
             cc = clone(q)\n\
             w_new = view(cc, [16, 16])\n\
             output ch dp=Shard(1)\n\
             output w_new dp=Replicate()\n",
            16 * n,
            blocks.join(", "),
            ends.join(", ")
        );
        let r = check(&text);
        assert_eq!(r.verdict, Verdict::Holds, "{}", r.render());
        let case = parse_plan(Path::new("zero.plan"), &text).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(n as u64);
        let mut draw = || -> Tensor {
            Tensor::new(
                Meta::new(DType::F32, vec![16, 16]),
                (0..256).map(|_| rng.random_range(-1.0..1.0)).collect(),
            )
        };
        let w = draw();
        let gs: Vec<Tensor> = (0..n).map(|_| draw()).collect();
        let leaves: Vec<BTreeMap<String, Tensor>> = gs
            .iter()
            .map(|g| BTreeMap::from([("g".to_string(), g.clone()), ("w".to_string(), w.clone())]))
            .collect();
        let envs = shardproof_interp::run_program(
            &case.program,
            &leaves,
            &shardproof_interp::RunConfig::default(),
        )
        .unwrap();
        let sum: Vec<f64> = (0..256)
            .map(|i| gs.iter().map(|g| g.data[i]).sum())
            .collect();
        let value = |r: usize, name: &str| -> Vec<f64> {
            let g = &case.program.ranks[r];
            let i = g.nodes.iter().position(|nd| nd.name == name).unwrap();
            envs[r].get(ValueId::new(i, 0)).unwrap().data.to_vec()
        };
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * (1.0 + b.abs());
        for r in 0..n {
            let ch = value(r, "ch");
            for i in 0..16 {
                for k in 0..piece {
                    assert!(
                        close(ch[i * piece + k], sum[i * 16 + r * piece + k]),
                        "n={n} rank {r}"
                    );
                }
            }
            let w_new = value(r, "w_new");
            for i in 0..256 {
                assert!(
                    close(w_new[i], w.data[i] - 0.1 * sum[i]),
                    "n={n} rank {r} at {i}"
                );
            }
        }
    }
}
