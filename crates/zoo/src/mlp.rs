//! The `mlp` model: layers of fc1 + relu + fc2 with an MSE loss, as a spec and as DP/TP ranks.

use crate::bugs::Mutation;
use crate::graph::{Arg, GraphBuilder, Val};
use crate::train::{self, Step};
use crate::{Param, TpLayout};
use std::collections::BTreeMap;

/// The sizes of the MLP.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpConfig {
    /// Model width (input and output features of every layer).
    pub hidden: usize,
    /// Inner width of every layer (fc1 output features).
    pub ffn: usize,
    /// Global batch size.
    pub batch: usize,
    /// Number of fc1 + relu + fc2 blocks.
    pub layers: usize,
    /// SGD learning rate of the full iteration.
    pub lr: f64,
}

impl Default for MlpConfig {
    fn default() -> Self {
        MlpConfig {
            hidden: 16,
            ffn: 32,
            batch: 8,
            layers: 1,
            lr: 0.1,
        }
    }
}

impl MlpConfig {
    /// The parameters in graph order: per layer fc1 weight/bias (column parallel), fc2
    /// weight (row parallel) and fc2 bias (replicated).
    pub fn params(&self) -> Vec<Param> {
        let (h, f) = (self.hidden, self.ffn);
        let p = |n: String, shape: Vec<usize>, tp| Param { name: n, shape, tp };
        (0..self.layers)
            .flat_map(|l| {
                [
                    p(format!("w1_{l}"), vec![f, h], TpLayout::Shard(0)),
                    p(format!("b1_{l}"), vec![f], TpLayout::Shard(0)),
                    p(format!("w2_{l}"), vec![h, f], TpLayout::Shard(1)),
                    p(format!("b2_{l}"), vec![h], TpLayout::Replicate),
                ]
            })
            .collect()
    }

    /// Why these sizes cannot be split `dp` x `tp` ways, if they cannot.
    pub fn check_split(&self, dp: usize, tp: usize) -> Result<(), String> {
        if self.hidden == 0 || self.ffn == 0 || self.batch == 0 || self.layers == 0 {
            return Err("hidden, ffn, batch and layers must be at least 1".into());
        }
        if !self.batch.is_multiple_of(dp) {
            return Err(format!(
                "batch {} is not divisible by dp = {dp}",
                self.batch
            ));
        }
        if !self.ffn.is_multiple_of(tp) {
            return Err(format!("ffn {} is not divisible by tp = {tp}", self.ffn));
        }
        Ok(())
    }
}

/// Options of the MLP beyond its sizes (`zoo emit mlp --recompute --fp8`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MlpOptions {
    /// Activation recomputation: the backward of each block recomputes fc1 and the relu from
    /// the block's checkpointed input instead of reading the forward's activations.
    pub recompute: bool,
    /// FP8 weights: fc1 and fc2 run on an FP8 (E4M3) quantize-dequantize of their weights with
    /// a per-tensor scale from the weight's amax (all-reduced, max, over tp when tp splits
    /// it); the gradients reach the master weights straight through the cast.
    pub fp8: bool,
}

/// The largest finite E4M3 value.
const E4M3_MAX: f64 = 448.0;

/// The FP8 (E4M3) quantize-dequantize of `w` with a per-tensor scale, emulated with ATen
/// operators on the interpreter's float dtype: `amax = max(|w|)` (all-reduced, max, over
/// `group` when the tensor is split over it), `y = w * 448 / amax`, `y` rounded to the E4M3
/// grid (3 mantissa bits: a step of `2^(floor(log2 |y|) - 3)`, the exponent clamped at -6 for
/// the subnormals), then `y * amax / 448`. Rounding is to nearest, ties away from zero (the
/// interpreter's `round`; the hardware rounds ties to even, which no drawn value hits).
fn fp8_cast(g: &mut GraphBuilder, w: &Val, group: Option<&str>) -> Val {
    let magnitude = g.unary("abs", "aten.abs.default", w);
    let local = g.call("max", "aten.max.default", &[Arg::V(&magnitude)], vec![]);
    let amax = match group {
        Some(group) => g.all_reduce(&local, "max", group),
        None => local,
    };
    let wide = g.mul_scalar("mul", w, Arg::F(E4M3_MAX));
    let y = g.binary("div", "aten.div.Tensor", &wide, &amax);
    let ay = g.unary("abs", "aten.abs.default", &y);
    let lg = g.unary("log2", "aten.log2.default", &ay);
    let exponent = g.unary("floor", "aten.floor.default", &lg);
    let exponent = g.call(
        "clamp_min",
        "aten.clamp_min.default",
        &[Arg::V(&exponent), Arg::F(-6.0)],
        exponent.shape.clone(),
    );
    let step_exp = g.call(
        "sub",
        "aten.sub.Scalar",
        &[Arg::V(&exponent), Arg::F(3.0)],
        exponent.shape.clone(),
    );
    let step = g.unary("exp2", "aten.exp2.default", &step_exp);
    let steps = g.binary("div", "aten.div.Tensor", &y, &step);
    let rounded = g.unary("round", "aten.round.default", &steps);
    let q = g.mul(&rounded, &step);
    let back = g.mul(&q, &amax);
    g.div_scalar("fp8_weight", &back, Arg::F(E4M3_MAX))
}

/// Builds the graph of one rank of the plan `dp` x `tp` (the spec is `dp = tp = 1`, no bug):
/// forward, MSE loss, and unless `forward_only` the explicit backward, gradient finalization
/// and an SGD step whose updated parameters are outputs `<param>_new`.
pub fn build(
    cfg: &MlpConfig,
    dp: usize,
    tp: usize,
    forward_only: bool,
    bug: Option<Mutation>,
) -> GraphBuilder {
    build_rank(
        cfg,
        &Step::plain(dp, tp, 0, bug, cfg.lr),
        forward_only,
        MlpOptions::default(),
    )
}

/// [`build`] for the rank and training options of `step` (loss scaling, microbatches, ZeRO,
/// clipping, the optimizer; see [`crate::train`]).
pub(crate) fn build_rank(
    cfg: &MlpConfig,
    step: &Step,
    forward_only: bool,
    options: MlpOptions,
) -> GraphBuilder {
    let (dp, tp) = (step.dp, step.tp);
    let is = |m: Mutation| step.bug == Some(m);
    let mut g = GraphBuilder::new();
    let (b, h) = (cfg.batch / dp, cfg.hidden);
    let x_all = g.input("x", &[b, h]);
    let target_all = g.input("target", &[b, h]);
    let specs = cfg.params();
    let weights = train::declare(&mut g, step, &specs);
    let mbs = step.microbatches();
    let bm = b / mbs;
    let mut losses = train::LossReport::default();
    let mut acc: BTreeMap<String, Val> = BTreeMap::new();
    for mb in 0..mbs {
        let x = train::microbatch(&mut g, &x_all, mb, mbs);
        let target = train::microbatch(&mut g, &target_all, mb, mbs);
        let forward = weights.pass(&mut g);
        let mut params: Vec<Val> = specs.iter().map(|p| forward[&p.name].clone()).collect();
        // FP8: fc1 and fc2 of every block run on the cast weights (w1, w2: split over tp, so
        // their amax is all-reduced over it), kept for the backward's input gradients.
        let mut master: BTreeMap<usize, Val> = BTreeMap::new();
        if options.fp8 {
            for l in 0..cfg.layers {
                for i in [4 * l, 4 * l + 2] {
                    let group = match tp {
                        1 => None,
                        _ if is(Mutation::Fp8AmaxWrongGroup) => Some("dp"),
                        _ => Some("tp"),
                    };
                    let cast = fp8_cast(&mut g, &params[i], group);
                    master.insert(i, std::mem::replace(&mut params[i], cast));
                }
            }
        }
        let layer = |l: usize| {
            (
                &params[4 * l],
                &params[4 * l + 1],
                &params[4 * l + 2],
                &params[4 * l + 3],
            )
        };

        // Forward: y = relu(h @ w1.T + b1) @ w2.T + b2, fc2 partial over tp until all-reduced.
        let mut act = x;
        let mut saved = Vec::new();
        for l in 0..cfg.layers {
            let (y, block_saved) = block(&mut g, &act, l, layer(l), tp, step.bug);
            saved.push(block_saved);
            act = y;
        }

        // MSE loss: the local mean, averaged over the microbatches and dp.
        let diff = g.sub("sub", &act, &target);
        let sq = g.square(&diff);
        let local = g.mean(if dp > 1 || mbs > 1 { "mean" } else { "loss" }, &sq);
        losses.add(&mut g, step, local);
        if forward_only {
            return g;
        }

        // Backward of the local loss: d mean((y - t)^2) / dy = 2 (y - t) / numel.
        let backward = weights.pass(&mut g);
        let mut bparams: Vec<Val> = specs.iter().map(|p| backward[&p.name].clone()).collect();
        if options.fp8 {
            // The backward's input gradients read the forward's FP8 weights (their casts, of
            // the same parameters, are the same values).
            for &i in master.keys() {
                bparams[i] = params[i].clone();
            }
        }
        let params = bparams;
        let twice = g.mul_scalar("mul", &diff, Arg::I(2));
        let seed = g.div_scalar("div", &twice, Arg::I((bm * h) as i64));
        let mut grad_y = train::scale_seed(&mut g, step, &seed);
        let mut grads = BTreeMap::new();
        for l in (0..cfg.layers).rev() {
            let weights = (&params[4 * l], &params[4 * l + 2]);
            let names: Vec<&str> = specs[4 * l..4 * l + 4]
                .iter()
                .map(|p| p.name.as_str())
                .collect();
            // Activation recomputation: fc1 and the relu rerun from the block's checkpoint
            // (its input), with the weight the forward used.
            let recomputed;
            let block_saved = if options.recompute {
                let checkpoint = if l == 1 && is(Mutation::RecomputeStaleInput) {
                    &saved[0].input
                } else {
                    &saved[l].input
                };
                let w1 = if l == 0 && is(Mutation::Fp8RecomputeWrongCast) {
                    master.get(&0).unwrap_or(&params[0])
                } else {
                    &params[4 * l]
                };
                recomputed = recompute(&mut g, checkpoint, w1, &params[4 * l + 1]);
                BlockSaved {
                    input: saved[l].input.clone(),
                    relu: recomputed,
                }
            } else {
                BlockSaved {
                    input: saved[l].input.clone(),
                    relu: saved[l].relu.clone(),
                }
            };
            if let Some(gx) = block_backward(
                &mut g,
                &grad_y,
                &block_saved,
                weights,
                l > 0,
                tp,
                &names,
                &mut grads,
            ) {
                grad_y = gx;
            }
            if l == 0 && is(Mutation::DanglingBackwardTensor) {
                // The gradients just computed are left without consumers; the finalization
                // reads zero-filled buffers no backward operator produced.
                for p in &specs[..2] {
                    let zeros = g.full(&p.local_shape(tp), 0.0);
                    grads.insert(p.name.clone(), zeros);
                }
            }
        }
        train::accumulate(&mut g, &mut acc, grads);
    }
    losses.finish(&mut g, step);

    // Gradient finalization over dp, then the optimizer step.
    train::finish(&mut g, step, &specs, &weights, &acc, |_, _, grad| grad);
    g
}

/// The recomputation of a block's activation from its checkpointed input: `relu(input @
/// w1.T + b1)`, as the forward computed it.
fn recompute(g: &mut GraphBuilder, input: &Val, w1: &Val, b1: &Val) -> Val {
    let t1 = g.t(w1);
    let m1 = g.mm(input, &t1);
    let a = g.add(&m1, b1);
    g.relu(&a)
}

/// What the backward of an fc1 + relu + fc2 block reads from its forward.
pub(crate) struct BlockSaved {
    /// The block's input.
    input: Val,
    /// The relu output (fc2's input).
    relu: Val,
}

/// Block `l` on `act`: `relu(act @ w1.T + b1) @ w2.T + b2`, fc1 column parallel and fc2 row
/// parallel with its all-reduce over tp (the bias added once after it). Honours the mlp
/// mutations of layer 0 (missing all-reduce, bias before it, wrong group).
pub(crate) fn block(
    g: &mut GraphBuilder,
    act: &Val,
    l: usize,
    (w1, b1, w2, b2): (&Val, &Val, &Val, &Val),
    tp: usize,
    bug: Option<Mutation>,
) -> (Val, BlockSaved) {
    let is = |m: Mutation| bug == Some(m);
    let scope = g.begin_module(format!("layers.{l}"), false);
    let t1 = g.t(w1);
    let m1 = g.mm(act, &t1);
    let a = g.add(&m1, b1);
    let r = g.relu(&a);
    let t2 = g.t(w2);
    let m2 = g.mm(&r, &t2);
    let y = if tp < 2 || (l == 0 && is(Mutation::TpMissingAllreduce)) {
        g.add(&m2, b2)
    } else if l == 0 && is(Mutation::AsyncAllreduceNoWait) {
        // The all-reduce's result is read directly: no `wait_tensor` on its handle.
        let handle = g.call(
            "all_reduce",
            "_c10d_functional.all_reduce.default",
            &[Arg::V(&m2), Arg::S("sum"), Arg::S("tp")],
            m2.shape.clone(),
        );
        g.add(&handle, b2)
    } else if l == 0 && is(Mutation::TpBiasBeforeAllreduce) {
        let early = g.add(&m2, b2);
        g.all_reduce_sum(&early, "tp")
    } else {
        let group = if l == 0 && is(Mutation::WrongGroup) {
            "dp"
        } else {
            "tp"
        };
        let full = g.all_reduce_sum(&m2, group);
        g.add(&full, b2)
    };
    g.end_module(scope, Some(&y));
    let saved = BlockSaved {
        input: act.clone(),
        relu: r,
    };
    (y, saved)
}

/// The backward of [`block`] for the gradient `grad_y` of its output: inserts the gradients of
/// w1, b1, w2, b2 (named `names`) into `grads`, and with `input_grad` returns the gradient of
/// the block's input (fc1 is column parallel: a partial sum over tp, all-reduced).
#[allow(clippy::too_many_arguments)]
pub(crate) fn block_backward(
    g: &mut GraphBuilder,
    grad_y: &Val,
    saved: &BlockSaved,
    (w1, w2): (&Val, &Val),
    input_grad: bool,
    tp: usize,
    names: &[&str],
    grads: &mut BTreeMap<String, Val>,
) -> Option<Val> {
    // The weight names end in the layer number (`w1_3`): the module the region belongs to.
    let layer = names
        .first()
        .and_then(|n| n.rsplit('_').next())
        .unwrap_or_default();
    let scope = g.begin_module(format!("layers.{layer}"), true);
    let r = &saved.relu;
    let gb2 = g.sum0(grad_y);
    let gyt = g.t(grad_y);
    let gw2 = g.mm(&gyt, r);
    let gr = g.mm(grad_y, w2);
    let ga = g.relu_backward(&gr, r);
    let gb1 = g.sum0(&ga);
    let gat = g.t(&ga);
    let gw1 = g.mm(&gat, &saved.input);
    let gx = input_grad.then(|| {
        // Column-parallel fc1: the input gradient is a partial sum over tp.
        let gh = g.mm(&ga, w1);
        if tp > 1 {
            g.all_reduce_sum(&gh, "tp")
        } else {
            gh
        }
    });
    g.end_module(scope, gx.as_ref());
    for (name, gv) in names.iter().zip([gw1, gb1, gw2, gb2]) {
        grads.insert((*name).to_string(), gv);
    }
    gx
}
