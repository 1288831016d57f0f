//! The rest of a real training iteration, shared by every model of the zoo: static loss
//! scaling, gradient accumulation over microbatches, ZeRO over dp, global gradient-norm
//! clipping and the optimizer step (SGD or Adam).
//!
//! A model builder declares its parameters through [`declare`], asks [`Weights::pass`] for the
//! parameters before its forward and before its backward (ZeRO-3 all-gathers them there),
//! slices its batch with [`microbatch`], scales the gradient of its loss with [`scale_seed`],
//! reduces its loss with [`loss_over_ranks`] and hands every gradient to [`finish`]. With the
//! default [`TrainOptions`] every one of these emits exactly the operators the models emitted
//! before they existed: SGD after an all-reduce and average over dp.

use crate::bugs::Mutation;
use crate::graph::{Arg, GraphBuilder, Val};
use crate::{Param, TpLayout};
use std::collections::BTreeMap;

/// The optimizer of the full iteration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// Plain SGD: `w - lr * grad`.
    Sgd,
    /// Adam with bias correction, as PyTorch's single-tensor `torch.optim.Adam` step.
    Adam(AdamConfig),
}

/// Adam's hyperparameters; the learning rate is the model's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Decay of the first moment (`exp_avg`).
    pub beta1: f64,
    /// Decay of the second moment (`exp_avg_sq`).
    pub beta2: f64,
    /// Added to the bias-corrected root of the second moment.
    pub eps: f64,
    /// The step number of this update (1 for the first), used by the bias corrections.
    pub step: u32,
}

impl Default for AdamConfig {
    /// PyTorch's defaults, first step.
    fn default() -> Self {
        AdamConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            step: 1,
        }
    }
}

/// How much of the training state ZeRO splits over dp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ZeroStage {
    /// Optimizer states split; gradients all-reduced, each rank updates its shard, the updated
    /// parameters all-gathered.
    One,
    /// Stage 1 with the gradients reduce-scattered instead of all-reduced.
    Two,
    /// Stage 2 with the parameters stored split too: all-gathered before the forward and again
    /// before the backward; the updated shards stay split.
    Three,
}

impl ZeroStage {
    /// The stage of `--zero LEVEL` (1, 2 or 3).
    pub fn from_level(level: u8) -> Option<ZeroStage> {
        match level {
            1 => Some(ZeroStage::One),
            2 => Some(ZeroStage::Two),
            3 => Some(ZeroStage::Three),
            _ => None,
        }
    }

    /// The stage number.
    pub fn level(self) -> u8 {
        match self {
            ZeroStage::One => 1,
            ZeroStage::Two => 2,
            ZeroStage::Three => 3,
        }
    }
}

/// What the full iteration does after the backward, and how it splits the batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainOptions {
    /// The optimizer step.
    pub optimizer: Optimizer,
    /// Clip the global gradient norm to this value (PyTorch's `clip_grad_norm_`, Megatron's
    /// distributed rule for the norm).
    pub clip_grad: Option<f64>,
    /// Static loss scale: the loss is multiplied by it before the backward and the gradients
    /// divided by it before clipping and the optimizer.
    pub loss_scale: Option<f64>,
    /// Microbatches per dp rank (1: no accumulation).
    pub grad_accum: usize,
    /// ZeRO over dp, if any.
    pub zero: Option<ZeroStage>,
}

impl Default for TrainOptions {
    /// [`TrainOptions::PLAIN`].
    fn default() -> Self {
        TrainOptions::PLAIN
    }
}

impl TrainOptions {
    /// SGD, no clipping, no loss scale, one microbatch, no ZeRO: the zoo's original iteration.
    pub const PLAIN: TrainOptions = TrainOptions {
        optimizer: Optimizer::Sgd,
        clip_grad: None,
        loss_scale: None,
        grad_accum: 1,
        zero: None,
    };

    /// The command-line flags that differ from the defaults, e.g. `--optimizer adam`.
    pub fn flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Optimizer::Adam(a) = self.optimizer {
            out.push("--optimizer adam".to_string());
            if a.step != 1 {
                out.push(format!("--adam-step {}", a.step));
            }
        }
        if let Some(c) = self.clip_grad {
            out.push(format!("--clip-grad {c}"));
        }
        if let Some(s) = self.loss_scale {
            out.push(format!("--loss-scale {s}"));
        }
        if self.grad_accum != 1 {
            out.push(format!("--grad-accum {}", self.grad_accum));
        }
        if let Some(z) = self.zero {
            out.push(format!("--zero {}", z.level()));
        }
        out
    }

    /// Why these options cannot apply to the model with `params` on a `dp` x `tp` plan with
    /// `local_batch` sequences (or rows) per dp rank, forward only or not, if they cannot.
    pub fn check(
        &self,
        params: &[Param],
        (dp, tp): (usize, usize),
        local_batch: usize,
        forward_only: bool,
    ) -> Result<(), String> {
        let flags = self.flags();
        if forward_only && !flags.is_empty() {
            return Err(format!(
                "the training options {} need the full iteration (drop --forward-only)",
                flags.join(", ")
            ));
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if let Some(c) = self.clip_grad.filter(|&c| !positive(c)) {
            return Err(format!(
                "--clip-grad {c}: the maximal norm must be a positive number"
            ));
        }
        if let Some(s) = self.loss_scale.filter(|&s| !positive(s)) {
            return Err(format!(
                "--loss-scale {s}: the scale must be a positive number"
            ));
        }
        if self.grad_accum == 0 {
            return Err("--grad-accum 0: there must be at least one microbatch".into());
        }
        if !local_batch.is_multiple_of(self.grad_accum) {
            return Err(format!(
                "the batch per dp rank ({local_batch}) is not divisible into --grad-accum {} \
                 microbatches (raise --batch)",
                self.grad_accum
            ));
        }
        if let Some(z) = self.zero {
            let split = params.iter().any(|p| zero_shard_dim(p, tp, dp).is_some());
            if dp >= 2 && !split {
                return Err(format!(
                    "--zero {}: no parameter has a dim that dp = {dp} divides and tp leaves \
                     whole, so nothing would be split (change the sizes or dp)",
                    z.level()
                ));
            }
            if dp < 2 {
                return Err(format!(
                    "--zero {} splits the training state over dp: it needs a dp mesh dim of \
                     size >= 2",
                    z.level()
                ));
            }
        }
        if let Optimizer::Adam(a) = self.optimizer {
            let decay = |b: f64| (0.0..1.0).contains(&b);
            if !decay(a.beta1) || !decay(a.beta2) || !positive(a.eps) || a.step == 0 {
                return Err(format!(
                    "Adam needs 0 <= beta1, beta2 < 1, eps > 0 and a step >= 1 (got beta1 \
                     {}, beta2 {}, eps {}, step {})",
                    a.beta1, a.beta2, a.eps, a.step
                ));
            }
        }
        Ok(())
    }

    /// The options of the single-device spec: no microbatches (the whole batch at once) and no
    /// ZeRO; the same optimizer, clipping and loss scale.
    pub fn for_spec(&self) -> TrainOptions {
        TrainOptions {
            grad_accum: 1,
            zero: None,
            ..*self
        }
    }

    /// A suffix of the case name, e.g. `-adam-clip-ls-ga2-zero1` (empty for the defaults).
    pub fn label(&self) -> String {
        let mut s = String::new();
        if let Optimizer::Adam(_) = self.optimizer {
            s.push_str("-adam");
        }
        if self.clip_grad.is_some() {
            s.push_str("-clip");
        }
        if self.loss_scale.is_some() {
            s.push_str("-ls");
        }
        if self.grad_accum > 1 {
            s.push_str(&format!("-ga{}", self.grad_accum));
        }
        if let Some(z) = self.zero {
            s.push_str(&format!("-zero{}", z.level()));
        }
        s
    }

    /// One line describing the full iteration, for the case file's header.
    pub fn describe(&self) -> String {
        if *self == TrainOptions::default() {
            return "Full iteration: forward, loss, backward, gradient all-reduce, SGD step."
                .into();
        }
        let mut steps = vec!["forward".to_string(), "loss".to_string()];
        if let Some(s) = self.loss_scale {
            steps.push(format!("loss scaled by {s}"));
        }
        steps.push(if self.grad_accum > 1 {
            format!(
                "backward accumulated over {} microbatches (each loss / {})",
                self.grad_accum, self.grad_accum
            )
        } else {
            "backward".to_string()
        });
        steps.push(match self.zero {
            None => "gradient all-reduce".to_string(),
            Some(ZeroStage::One) => {
                "ZeRO-1 (gradient all-reduce, sharded optimizer update, all-gather)".to_string()
            }
            Some(ZeroStage::Two) => {
                "ZeRO-2 (gradient reduce-scatter, sharded update, all-gather)".to_string()
            }
            Some(ZeroStage::Three) => "ZeRO-3 (parameters all-gathered before use, gradient \
                                       reduce-scatter, sharded update)"
                .to_string(),
        });
        if self.loss_scale.is_some() {
            steps.push("gradients unscaled".to_string());
        }
        if let Some(c) = self.clip_grad {
            steps.push(format!("global gradient norm clipped to {c}"));
        }
        steps.push(match self.optimizer {
            Optimizer::Sgd => "SGD step".to_string(),
            Optimizer::Adam(a) => format!(
                "Adam step {} (beta1 {}, beta2 {}, eps {:e})",
                a.step, a.beta1, a.beta2, a.eps
            ),
        });
        format!("Full iteration: {}.", steps.join(", "))
    }
}

/// The dim along which ZeRO splits parameter `p` (its tp-local shape) over `dp` ranks: the first
/// dim that tp does not split and `dp` divides, or `None` when there is none (a bias split over
/// tp): such a parameter stays whole on every dp rank and is updated redundantly, as DeepSpeed
/// keeps small parameters whole. (A dp split of a dim that tp splits too would put a rank's
/// piece at a strided position of the global tensor, which a placement cannot describe: case
/// placements nest mesh dims outermost first.)
pub fn zero_shard_dim(p: &Param, tp: usize, dp: usize) -> Option<usize> {
    let tp_dim = match p.tp {
        _ if tp < 2 => None,
        TpLayout::Replicate => None,
        TpLayout::Shard(d) | TpLayout::ShardReplicas { dim: d, .. } => Some(d),
    };
    let local = p.local_shape(tp);
    (0..local.len()).find(|&d| Some(d) != tp_dim && local[d].is_multiple_of(dp))
}

/// The rank a graph is built for and the options of its iteration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step<'a> {
    /// The options (the spec's: see [`TrainOptions::for_spec`]).
    pub opts: &'a TrainOptions,
    /// Size of the dp mesh dim.
    pub dp: usize,
    /// Size of the tp mesh dim.
    pub tp: usize,
    /// The rank's index along dp.
    pub dp_rank: usize,
    /// The rank's index along tp.
    pub tp_rank: usize,
    /// Size of the cp mesh dim (context parallelism): the loss and the gradients are averaged
    /// over dp x cp, every rank holding other tokens of the batch.
    pub cp: usize,
    /// Pipeline stages (size of the pp mesh dim; 1 without one): each holds its own
    /// parameters, so the global gradient norm sums the stages' shares over `pp`.
    pub stages: usize,
    /// Parameters this rank holds as a copy of another stage's (a pipelined gpt2's last stage:
    /// the tied token embedding): left out of the gradient norm, which counts them where the
    /// original lives (Megatron's `shared` parameters, skipped by `param_is_not_shared`).
    pub shared_copies: &'static [&'static str],
    /// The planted bug, if any.
    pub bug: Option<Mutation>,
    /// The model's learning rate.
    pub lr: f64,
}

impl Step<'static> {
    /// The plain iteration ([`TrainOptions::PLAIN`]) of a rank at `tp_rank` of a `dp` x `tp`
    /// plan, as the models' `build` emits it.
    pub fn plain(dp: usize, tp: usize, tp_rank: usize, bug: Option<Mutation>, lr: f64) -> Self {
        Step {
            opts: &TrainOptions::PLAIN,
            dp,
            tp,
            dp_rank: 0,
            tp_rank,
            cp: 1,
            stages: 1,
            shared_copies: &[],
            bug,
            lr,
        }
    }
}

impl Step<'_> {
    fn is(&self, m: Mutation) -> bool {
        self.bug == Some(m)
    }

    /// The process group over which the loss and the gradients are averaged, and its size:
    /// every rank holding other tokens of the batch (`dp`; `dp_cp`, declared by the case file,
    /// or `cp` under context parallelism).
    pub fn data_group(&self) -> (&'static str, usize) {
        match (self.dp > 1, self.cp > 1) {
            (true, true) => ("dp_cp", self.dp * self.cp),
            (false, true) => ("cp", self.cp),
            _ => ("dp", self.dp),
        }
    }

    /// Microbatches per dp rank.
    pub fn microbatches(&self) -> usize {
        self.opts.grad_accum.max(1)
    }

    /// The dim along which ZeRO splits `p` on this plan, if it does.
    fn shard_dim(&self, p: &Param) -> Option<usize> {
        match self.opts.zero {
            Some(_) if self.dp > 1 => zero_shard_dim(p, self.tp, self.dp),
            _ => None,
        }
    }

    fn zero_at_least(&self, stage: ZeroStage) -> bool {
        self.dp > 1 && self.opts.zero.is_some_and(|z| z >= stage)
    }

    /// `p`'s dp shard: `dim` of its tp-local shape divided by dp.
    fn shard_shape(&self, p: &Param, dim: usize) -> Vec<usize> {
        let mut shape = p.local_shape(self.tp);
        shape[dim] /= self.dp;
        shape
    }
}

/// The parameters and optimizer states a rank stores.
pub(crate) struct Weights {
    /// Parameter names in model order.
    order: Vec<String>,
    /// Each parameter's graph input: tp-local, or its dp shard under ZeRO-3.
    stored: BTreeMap<String, Val>,
    /// ZeRO-3: the parameters stored split, and the dim along which.
    split: BTreeMap<String, usize>,
    /// Adam: each parameter's `(exp_avg, exp_avg_sq)` inputs (dp shards under ZeRO).
    states: BTreeMap<String, (Val, Val)>,
    dp: usize,
}

/// Declares the parameters of `specs` as graph inputs (dp shards of the split ones under
/// ZeRO-3), then, for Adam, every parameter's `exp_avg_<name>` and `exp_avg_sq_<name>` (dp
/// shards of the split ones under any ZeRO stage).
pub(crate) fn declare(g: &mut GraphBuilder, step: &Step, specs: &[Param]) -> Weights {
    let mut w = Weights {
        order: specs.iter().map(|p| p.name.clone()).collect(),
        stored: BTreeMap::new(),
        split: BTreeMap::new(),
        states: BTreeMap::new(),
        dp: step.dp,
    };
    for p in specs {
        let shape = match step.shard_dim(p) {
            Some(d) if step.zero_at_least(ZeroStage::Three) => {
                w.split.insert(p.name.clone(), d);
                step.shard_shape(p, d)
            }
            _ => p.local_shape(step.tp),
        };
        w.stored.insert(p.name.clone(), g.input(&p.name, &shape));
    }
    if let Optimizer::Adam(_) = step.opts.optimizer {
        for p in specs {
            let shape = match step.shard_dim(p) {
                Some(d) => step.shard_shape(p, d),
                None => p.local_shape(step.tp),
            };
            let m = g.input(&format!("exp_avg_{}", p.name), &shape);
            let v = g.input(&format!("exp_avg_sq_{}", p.name), &shape);
            w.states.insert(p.name.clone(), (m, v));
        }
    }
    w
}

impl Weights {
    /// The tp-local parameters for one forward or backward pass, by name: under ZeRO-3 the
    /// split ones are all-gathered over dp first (again for every pass, as ZeRO-3 frees them
    /// after use); otherwise the stored inputs, emitting nothing.
    pub fn pass(&self, g: &mut GraphBuilder) -> BTreeMap<String, Val> {
        self.order
            .iter()
            .map(|name| {
                let stored = &self.stored[name];
                let v = match self.split.get(name) {
                    Some(&dim) => gather_dp(g, stored, dim, self.dp, None),
                    None => stored.clone(),
                };
                (name.clone(), v)
            })
            .collect()
    }
}

/// The dp group's pieces of `shard` concatenated along `dim`: `all_gather_into_tensor` (which
/// concatenates along dim 0), then for another dim the pieces moved there (view, permute,
/// contiguous copy, view), as `all_gather_tensor(gather_dim=dim)` does. The last operator is
/// named `name` when given.
fn gather_dp(g: &mut GraphBuilder, shard: &Val, dim: usize, dp: usize, name: Option<&str>) -> Val {
    if dim == 0 {
        return g.all_gather_as(name.unwrap_or("wait_tensor"), shard, dp, "dp");
    }
    let gathered = g.all_gather(shard, dp, "dp");
    let mut split = vec![dp];
    split.extend(&shard.shape);
    let pieces = g.view(&gathered, &split);
    // [dp, s0, .., s_dim, ..] -> [s0, .., dp, s_dim, ..]: the pieces become the outer part of
    // `dim`.
    let mut order: Vec<usize> = (1..=dim).collect();
    order.push(0);
    order.extend(dim + 1..split.len());
    let moved = g.permute(&pieces, &order);
    let copy = g.contiguous(&moved);
    let mut whole = shard.shape.clone();
    whole[dim] *= dp;
    g.call_typed(
        name.unwrap_or("view"),
        "aten.view.default",
        &[
            Arg::V(&copy),
            Arg::Ints(whole.iter().map(|&d| d as i64).collect()),
        ],
        copy.dtype,
        whole,
    )
}

/// This rank's shard (along `dim`) of the sum over the dp group of `x`:
/// `reduce_scatter_tensor` (which splits dim 0), for another dim after moving that dim's pieces
/// to the front.
fn reduce_scatter_dp(g: &mut GraphBuilder, x: &Val, dim: usize, dp: usize) -> Val {
    if dim == 0 {
        return g.reduce_scatter_sum(x, dp, "dp");
    }
    // [s0, .., S, ..] -> [s0, .., dp, S / dp, ..] -> [dp, s0, .., S / dp, ..] -> [dp * s0, ..].
    let mut split = x.shape.clone();
    split[dim] /= dp;
    split.insert(dim, dp);
    let pieces = g.view(x, &split);
    let mut order = vec![dim];
    order.extend((0..split.len()).filter(|&d| d != dim));
    let moved = g.permute(&pieces, &order);
    let copy = g.contiguous(&moved);
    let mut rows: Vec<usize> = moved.shape[1..].to_vec();
    rows[0] *= dp;
    let stacked = g.view(&copy, &rows);
    g.reduce_scatter_sum(&stacked, dp, "dp")
}

/// This dp rank's shard of `x` along `dim`.
fn own_shard(g: &mut GraphBuilder, x: &Val, dim: usize, step: &Step) -> Val {
    let len = x.shape[dim] / step.dp;
    g.slice(x, dim, step.dp_rank * len, (step.dp_rank + 1) * len)
}

/// Microbatch `index` of `count` of a batch-major input (rows along dim 0); the input itself
/// when there is one microbatch.
pub(crate) fn microbatch(g: &mut GraphBuilder, x: &Val, index: usize, count: usize) -> Val {
    if count == 1 {
        return x.clone();
    }
    let rows = x.shape[0] / count;
    g.slice(x, 0, index * rows, (index + 1) * rows)
}

/// The gradient of the iteration's objective with respect to a value whose gradient of the
/// microbatch loss is `grad`: divided by the microbatches (the loss of each is scaled by 1/M
/// before its backward; the planted bug leaves it unscaled) and multiplied by the loss scale.
pub(crate) fn scale_seed(g: &mut GraphBuilder, step: &Step, grad: &Val) -> Val {
    let mut grad = grad.clone();
    let m = step.microbatches();
    if m > 1 && !step.is(Mutation::GradAccumLossNotScaled) {
        grad = g.div_scalar("div", &grad, Arg::I(m as i64));
    }
    if let Some(s) = step.opts.loss_scale {
        grad = g.mul_scalar("mul", &grad, Arg::F(s));
    }
    grad
}

/// The reported loss, named `loss`: the microbatch losses `locals` (each a mean over its
/// tokens) scaled by 1/M and summed, then all-reduced and averaged over dp (dp x cp under
/// context parallelism).
fn loss_over_ranks(g: &mut GraphBuilder, step: &Step, locals: &[Val]) -> Val {
    let (group, dp) = step.data_group();
    let local = match locals {
        [one] => one.clone(),
        _ => {
            let m = locals.len() as i64;
            let scaled: Vec<Val> = locals
                .iter()
                .map(|l| {
                    if step.is(Mutation::GradAccumLossNotScaled) {
                        l.clone()
                    } else {
                        g.div_scalar("div", l, Arg::I(m))
                    }
                })
                .collect();
            let mut acc = scaled[0].clone();
            for (i, s) in scaled.iter().enumerate().skip(1) {
                let last = i + 1 == scaled.len();
                let hint = if last && dp == 1 { "loss" } else { "add" };
                acc = g.binary(hint, "aten.add.Tensor", &acc, s);
            }
            acc
        }
    };
    if dp > 1 {
        let total = g.all_reduce_sum(&local, group);
        let by = if step.is(Mutation::DpLossNotAveraged) {
            1
        } else {
            dp as i64
        };
        g.div_scalar("loss", &total, Arg::I(by))
    } else {
        local
    }
}

/// The losses of a rank's microbatches, reported as the output `loss` once known.
#[derive(Default)]
pub(crate) struct LossReport {
    locals: Vec<Val>,
}

impl LossReport {
    /// Records the local loss of a microbatch. With one microbatch the loss is reported at
    /// once (between the forward and the backward, where the zoo always put it).
    pub fn add(&mut self, g: &mut GraphBuilder, step: &Step, local: Val) {
        if step.microbatches() == 1 {
            let loss = loss_over_ranks(g, step, &[local]);
            g.output(&loss);
        } else {
            self.locals.push(local);
        }
    }

    /// Reports the loss of several microbatches, after the last one.
    pub fn finish(self, g: &mut GraphBuilder, step: &Step) {
        if !self.locals.is_empty() {
            let loss = loss_over_ranks(g, step, &self.locals);
            g.output(&loss);
        }
    }
}

/// Adds a microbatch's gradients into the accumulated ones.
pub(crate) fn accumulate(
    g: &mut GraphBuilder,
    acc: &mut BTreeMap<String, Val>,
    grads: BTreeMap<String, Val>,
) {
    for (name, grad) in grads {
        let sum = match acc.get(&name) {
            Some(prev) => g.add(prev, &grad),
            None => grad,
        };
        acc.insert(name, sum);
    }
}

/// A gradient on its way to the optimizer.
struct Pending<'p> {
    param: &'p Param,
    /// The rank's gradient (its dp shard when split).
    grad: Val,
    /// The dim along which ZeRO splits the parameter, if it does.
    shard_dim: Option<usize>,
}

/// Gradient finalization and the optimizer step, in model order: `presync` (the model's own
/// synchronization of a gradient over tp), the dp reduction (all-reduce, or reduce-scatter
/// under ZeRO-2/3; averaged), unscaling, clipping, then SGD or Adam. Outputs `<name>_new` for
/// every parameter (the dp shard under ZeRO-3), and for Adam `exp_avg_<name>_new` and
/// `exp_avg_sq_<name>_new`. Without clipping each parameter is finished before the next, as
/// the zoo always emitted; clipping needs every gradient first.
pub(crate) fn finish(
    g: &mut GraphBuilder,
    step: &Step,
    specs: &[Param],
    weights: &Weights,
    grads: &BTreeMap<String, Val>,
    mut presync: impl FnMut(&mut GraphBuilder, &Param, Val) -> Val,
) {
    let mut pending = Vec::new();
    for p in specs {
        let grad = presync(g, p, grads[&p.name].clone());
        let shard_dim = step.shard_dim(p);
        let grad = reduce_over_dp(g, step, grad, shard_dim);
        let grad = match step.opts.loss_scale {
            Some(s) if !step.is(Mutation::LossScaleNotUnscaled) => {
                g.mul_scalar("mul", &grad, Arg::F(1.0 / s))
            }
            _ => grad,
        };
        let item = Pending {
            param: p,
            grad,
            shard_dim,
        };
        if step.opts.clip_grad.is_some() {
            pending.push(item);
        } else {
            update(g, step, weights, item);
        }
    }
    if let Some(max_norm) = step.opts.clip_grad {
        let coef = clip_coefficient(g, step, &pending, max_norm);
        for mut item in pending {
            item.grad = g.mul(&item.grad, &coef);
            update(g, step, weights, item);
        }
    }
}

/// The gradient averaged over dp (dp x cp under context parallelism, which ZeRO is not
/// combined with): all-reduced, or reduce-scattered to the rank's shard under ZeRO-2/3 (under
/// ZeRO-1 the rank then keeps its shard of the all-reduced gradient).
fn reduce_over_dp(g: &mut GraphBuilder, step: &Step, grad: Val, shard_dim: Option<usize>) -> Val {
    let (group, size) = step.data_group();
    if size < 2 {
        return grad;
    }
    let scattered = shard_dim.filter(|_| step.zero_at_least(ZeroStage::Two));
    let summed = match scattered {
        Some(dim) => reduce_scatter_dp(g, &grad, dim, step.dp),
        None => g.all_reduce_sum(&grad, group),
    };
    let mean = if step.is(Mutation::DpGradNotAveraged) {
        summed
    } else {
        g.div_scalar("div", &summed, Arg::I(size as i64))
    };
    match shard_dim {
        Some(dim) if scattered.is_none() => own_shard(g, &mean, dim, step),
        _ => mean,
    }
}

/// Whether this rank adds `item`'s squared norm to its share of the global norm: every
/// gradient counts once over the ranks the norm is all-reduced over. A parameter replicated
/// over tp counts on tp rank 0 only (Megatron's `param_is_not_tensor_parallel_duplicate`; the
/// planted bug counts it on every tp rank), a kv head held by several tp ranks on the first;
/// under ZeRO (norm all-reduced over dp too) a parameter kept whole on every dp rank on dp
/// rank 0 only.
fn counted_in_norm(step: &Step, item: &Pending) -> bool {
    if step.shared_copies.contains(&item.param.name.as_str()) {
        return false;
    }
    let over_tp = match item.param.tp {
        TpLayout::Shard(_) => true,
        TpLayout::Replicate => {
            step.tp_rank == 0 || step.is(Mutation::GradNormReplicatedOvercounted)
        }
        TpLayout::ShardReplicas { replicas, .. } => step.tp_rank.is_multiple_of(replicas),
    };
    let over_dp =
        !step.zero_at_least(ZeroStage::One) || item.shard_dim.is_some() || { step.dp_rank == 0 };
    over_tp && over_dp
}

/// `clamp(max_norm / (norm + 1e-6), max = 1)` for the global norm of the gradients (PyTorch's
/// `clip_grad_norm_`): each rank sums the squares of the gradients it counts, the sum is
/// all-reduced over tp (over dp under ZeRO, whose gradients are dp shards; over pp under
/// pipeline parallelism, whose stages hold different parameters), then the root is taken.
fn clip_coefficient(g: &mut GraphBuilder, step: &Step, items: &[Pending], max_norm: f64) -> Val {
    let mut total: Option<Val> = None;
    for item in items.iter().filter(|i| counted_in_norm(step, i)) {
        let sq = g.square(&item.grad);
        let sum = g.call("sum", "aten.sum.default", &[Arg::V(&sq)], vec![]);
        total = Some(match total {
            None => sum,
            Some(acc) => g.add(&acc, &sum),
        });
    }
    let mut total = total.unwrap_or_else(|| {
        // This rank counts no gradient: its share of the sum is zero.
        g.full(&[], 0.0)
    });
    if step.tp > 1 {
        total = g.all_reduce_sum(&total, "tp");
    }
    // Under every ZeRO stage a rank's gradients are its dp shards (ZeRO-1 keeps its shard of
    // the all-reduced gradient), so the squares are summed over dp as well.
    if step.zero_at_least(ZeroStage::One) {
        total = g.all_reduce_sum(&total, "dp");
    }
    if step.stages > 1 {
        // Each pipeline stage holds other parameters: the model-parallel norm sums them all.
        total = g.all_reduce_sum(&total, "pp");
    }
    let norm = g.unary("sqrt", "aten.sqrt.default", &total);
    let padded = g.call(
        "add",
        "aten.add.Scalar",
        &[Arg::V(&norm), Arg::F(1e-6)],
        vec![],
    );
    let inverse = g.unary("reciprocal", "aten.reciprocal.default", &padded);
    let coef = g.mul_scalar("mul", &inverse, Arg::F(max_norm));
    g.call(
        "clamp",
        "aten.clamp.default",
        &[Arg::V(&coef), Arg::Raw("None"), Arg::F(1.0)],
        vec![],
    )
}

/// The optimizer step of one parameter and its outputs.
fn update(g: &mut GraphBuilder, step: &Step, weights: &Weights, item: Pending) {
    let p = item.param;
    let name = &p.name;
    let out_name = format!("{name}_new");
    let stored = &weights.stored[name];
    let stored_split = weights.split.contains_key(name);
    // The part of the parameter this rank updates: its dp shard under ZeRO (stored as such
    // under ZeRO-3, sliced out of the whole parameter under ZeRO-1/2).
    let current = match item.shard_dim {
        Some(dim) if !stored_split => own_shard(g, stored, dim, step),
        _ => stored.clone(),
    };
    let gathered = item.shard_dim.is_some() && !stored_split;
    let skipped = item.shard_dim.is_some()
        && step.dp_rank + 1 == step.dp
        && step.is(Mutation::ZeroParamUpdateSkipped);
    // The update is the output itself unless it is all-gathered first or dropped by the bug.
    let update_name = |op: &str| {
        if gathered || skipped {
            op.to_string()
        } else {
            out_name.clone()
        }
    };
    let mut states = Vec::new();
    let new = match step.opts.optimizer {
        Optimizer::Sgd => {
            let delta = g.mul_scalar("mul", &item.grad, Arg::F(step.lr));
            g.sub(&update_name("sub"), &current, &delta)
        }
        Optimizer::Adam(a) => {
            let (m, v) = &weights.states[name];
            let shape = item.grad.shape.clone();
            // exp_avg.lerp_(grad, 1 - beta1)
            let m_new = g.call(
                &format!("exp_avg_{name}_new"),
                "aten.lerp.Scalar",
                &[Arg::V(m), Arg::V(&item.grad), Arg::F(1.0 - a.beta1)],
                shape.clone(),
            );
            // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value = 1 - beta2)
            let decayed = g.mul_scalar("mul", v, Arg::F(a.beta2));
            let weight = format!("value = {:?}", 1.0 - a.beta2);
            let v_new = g.call(
                &format!("exp_avg_sq_{name}_new"),
                "aten.addcmul.default",
                &[
                    Arg::V(&decayed),
                    Arg::V(&item.grad),
                    Arg::V(&item.grad),
                    Arg::Raw(&weight),
                ],
                shape.clone(),
            );
            // denom = exp_avg_sq.sqrt() / sqrt(1 - beta2^t) + eps;
            // param.addcdiv_(exp_avg, denom, value = -lr / (1 - beta1^t))
            let t = f64::from(a.step);
            let bias1 = 1.0 - a.beta1.powf(t);
            let bias2 = 1.0 - a.beta2.powf(t);
            let root = g.unary("sqrt", "aten.sqrt.default", &v_new);
            let unbiased = g.div_scalar("div", &root, Arg::F(bias2.sqrt()));
            let denom = g.call(
                "add",
                "aten.add.Scalar",
                &[Arg::V(&unbiased), Arg::F(a.eps)],
                shape.clone(),
            );
            let step_size = format!("value = {:?}", -step.lr / bias1);
            let new = g.call(
                &update_name("addcdiv"),
                "aten.addcdiv.default",
                &[
                    Arg::V(&current),
                    Arg::V(&m_new),
                    Arg::V(&denom),
                    Arg::Raw(&step_size),
                ],
                shape,
            );
            states.extend([m_new, v_new]);
            new
        }
    };
    // The planted bug: this rank keeps its stale shard (Megatron's lost parameter update).
    let kept = if skipped { &current } else { &new };
    let out = match item.shard_dim {
        Some(dim) if gathered => gather_dp(g, kept, dim, step.dp, Some(&out_name)),
        _ if skipped => g.call(
            &out_name,
            "aten.clone.default",
            &[Arg::V(kept)],
            kept.shape.clone(),
        ),
        _ => new,
    };
    g.output(&out);
    for s in &states {
        g.output(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(name: &str, shape: &[usize], tp: TpLayout) -> Param {
        Param {
            name: name.into(),
            shape: shape.to_vec(),
            tp,
        }
    }

    #[test]
    fn zero_splits_a_dim_tp_leaves_whole() {
        let w1 = param("w1", &[32, 16], TpLayout::Shard(0));
        assert_eq!(zero_shard_dim(&w1, 1, 2), Some(0));
        assert_eq!(zero_shard_dim(&w1, 2, 2), Some(1));
        let b1 = param("b1", &[32], TpLayout::Shard(0));
        assert_eq!(zero_shard_dim(&b1, 2, 2), None);
        assert_eq!(zero_shard_dim(&b1, 1, 4), Some(0));
        let odd = param("odd", &[3], TpLayout::Replicate);
        assert_eq!(zero_shard_dim(&odd, 2, 2), None);
    }

    #[test]
    fn options_are_checked() {
        let d = TrainOptions::default();
        let ps = [param("w", &[4, 6], TpLayout::Shard(0))];
        let check = |o: &TrainOptions, dp, batch, fw| o.check(&ps, (dp, 2), batch, fw);
        assert!(check(&d, 1, 8, true).is_ok());
        assert!(d.flags().is_empty() && d.label().is_empty());
        let adam = TrainOptions {
            optimizer: Optimizer::Adam(AdamConfig::default()),
            clip_grad: Some(1.0),
            ..d
        };
        let e = check(&adam, 1, 8, true).unwrap_err();
        assert!(
            e.contains("options --optimizer adam, --clip-grad 1") && e.contains("--forward-only")
        );
        let accum = TrainOptions { grad_accum: 3, ..d };
        let e = check(&accum, 1, 8, false).unwrap_err();
        assert!(e.contains("not divisible"), "{e}");
        let zero = TrainOptions {
            zero: Some(ZeroStage::Two),
            ..d
        };
        assert!(check(&zero, 1, 8, false)
            .unwrap_err()
            .contains("dp mesh dim"));
        assert!(check(&zero, 2, 8, false).is_ok());
        // dp = 4 divides no dim tp leaves whole (dim 1 of size 6).
        assert!(check(&zero, 4, 8, false)
            .unwrap_err()
            .contains("nothing would be split"));
        let bad = TrainOptions {
            loss_scale: Some(f64::NAN),
            ..d
        };
        assert!(check(&bad, 1, 8, false)
            .unwrap_err()
            .contains("--loss-scale"));
        let spec = TrainOptions {
            grad_accum: 2,
            ..zero
        }
        .for_spec();
        assert_eq!((spec.grad_accum, spec.zero), (1, None));
    }

    #[test]
    fn gathers_and_scatters_move_the_pieces_along_the_dim() {
        let mut g = GraphBuilder::new();
        let shard = g.input("w", &[4, 3]);
        let whole = gather_dp(&mut g, &shard, 1, 2, Some("w_new"));
        assert_eq!(
            (whole.name.as_str(), whole.shape.clone()),
            ("w_new", vec![4, 6])
        );
        let back = reduce_scatter_dp(&mut g, &whole, 1, 2);
        assert_eq!(back.shape, vec![4, 3]);
        let text = g.render();
        for line in [
            "all_gather_into_tensor.default(w, 2, 'dp')",
            "view: \"f32[2, 4, 3]\"",
            "aten.permute.default(view, [1, 0, 2])",
            "w_new: \"f32[4, 6]\" = torch.ops.aten.view.default(clone, [4, 6])",
            "aten.view.default(w_new, [4, 2, 3])",
            "aten.permute.default(view_1, [1, 0, 2])",
            "view_2: \"f32[8, 3]\"",
            "reduce_scatter_tensor.default(view_2, 'sum', 2, 'dp')",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
    }
}
