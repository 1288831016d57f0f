//! Each model's pipeline stage: what a stage of the mlp, llama, gpt2 or DeepSeek holds, and its
//! forward and backward passes on one microbatch, run in the order the schedule gives.

use super::*;

/// The mlp on one stage.
pub(super) struct MlpStage<'a> {
    cfg: &'a MlpConfig,
    step: &'a Step<'a>,
    pos: Position,
    layers: Range<usize>,
    weights: &'a Weights,
    /// The rank's inputs `x` (first stage) and targets (last stage).
    data: StageData,
    /// Per microbatch: each block's saved values and (last stage) `y - target`.
    saved: BTreeMap<usize, (Vec<BlockSaved>, Option<Val>)>,
    losses: LossReport,
}

impl MlpStage<'_> {
    /// The rows of a microbatch.
    fn rows(&self) -> usize {
        self.cfg.batch / self.step.dp / self.step.microbatches()
    }

    /// The stage's weights for one pass, by name: w1, b1, w2, b2 of layer `l`.
    fn block_weights<'w>(
        &self,
        w: &'w BTreeMap<String, Val>,
        l: usize,
    ) -> (&'w Val, &'w Val, &'w Val, &'w Val) {
        let name = |p: &str| &w[&format!("{p}_{l}")];
        (name("w1"), name("b1"), name("w2"), name("b2"))
    }
}

impl Stage for MlpStage<'_> {
    fn boundary(&self) -> Vec<usize> {
        vec![self.rows(), self.cfg.hidden]
    }

    fn forward(&mut self, g: &mut GraphBuilder, mb: usize, input: Option<Val>) -> Option<Val> {
        let m = self.step.microbatches();
        let w = self.weights.pass(g);
        let mut act = match input {
            Some(x) => x,
            None => self.data.inputs(g, mb, m),
        };
        let mut blocks = Vec::new();
        for l in self.layers.clone() {
            let (y, saved) = mlp::block(
                g,
                &act,
                l,
                self.block_weights(&w, l),
                self.step.tp,
                self.step.bug,
            );
            blocks.push(saved);
            act = y;
        }
        if !self.pos.last() {
            self.saved.insert(mb, (blocks, None));
            return Some(act);
        }
        let target = self.data.labels(g, mb, m, self.step.bug);
        let diff = g.sub("sub", &act, &target);
        let sq = g.square(&diff);
        let local = g.mean(local_loss_name(self.step, "mean"), &sq);
        self.losses.add(g, self.step, local);
        self.saved.insert(mb, (blocks, Some(diff)));
        None
    }

    fn backward(&mut self, g: &mut GraphBuilder, mb: usize, grad: Option<Val>) -> (Grads, Val) {
        let w = self.weights.pass(g);
        let (blocks, diff) = self.saved.remove(&mb).expect("forward before backward");
        let mut grad_y = match (grad, diff) {
            (Some(grad), _) => grad,
            (None, Some(diff)) => {
                // d mean((y - t)^2) / dy = 2 (y - t) / numel.
                let twice = g.mul_scalar("mul", &diff, Arg::I(2));
                let seed = g.div_scalar(
                    "div",
                    &twice,
                    Arg::I((self.rows() * self.cfg.hidden) as i64),
                );
                train::scale_seed(g, self.step, &seed)
            }
            (None, None) => unreachable!("only the last stage starts the backward"),
        };
        let mut grads = BTreeMap::new();
        for (l, saved) in self.layers.clone().zip(&blocks).rev() {
            let names: Vec<String> = ["w1", "b1", "w2", "b2"]
                .iter()
                .map(|p| format!("{p}_{l}"))
                .collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let (w1, _, w2, _) = self.block_weights(&w, l);
            // Every layer but the model's first passes a gradient back.
            if let Some(gx) = mlp::block_backward(
                g,
                &grad_y,
                saved,
                (w1, w2),
                l > 0,
                self.step.tp,
                &names,
                &mut grads,
            ) {
                grad_y = gx;
            }
        }
        (grads, grad_y)
    }
}

/// What the last llama stage keeps of a microbatch's forward for its backward.
pub(super) struct LlamaHead {
    head: HeadSaved,
    ce: CrossEntropy,
}

/// What a llama stage keeps of a microbatch's forward for its backward.
pub(super) struct LlamaSaved {
    /// Each of the stage's layers.
    layers: Vec<LayerSaved>,
    /// The microbatch's token ids (first stage: the embedding's backward reads them).
    tokens: Option<Val>,
    /// The masks of a vocab-parallel embedding (first stage).
    embedding: Option<VocabEmbedding>,
    /// The final norm, LM head and loss (last stage).
    head: Option<LlamaHead>,
}

/// The llama decoder on one stage.
pub(super) struct LlamaStage<'a> {
    cfg: &'a LlamaConfig,
    step: &'a Step<'a>,
    pos: Position,
    layers: Range<usize>,
    weights: &'a Weights,
    dims: AttnShape,
    tables: AttnTables,
    /// Under vocabulary parallelism, the rank's rows `(v0, vl)` of the embedding and the LM head.
    vocab: Option<(usize, usize)>,
    /// The rank's token ids (first stage) and labels (last stage).
    data: StageData,
    /// Per microbatch: the layers' saved values, the tokens (first stage), the head (last).
    saved: BTreeMap<usize, LlamaSaved>,
    losses: LossReport,
}

impl Stage for LlamaStage<'_> {
    fn boundary(&self) -> Vec<usize> {
        vec![self.dims.b, self.dims.s, self.dims.h]
    }

    fn forward(&mut self, g: &mut GraphBuilder, mb: usize, input: Option<Val>) -> Option<Val> {
        let m = self.step.microbatches();
        let forward = self.weights.pass(g);
        let w = |name: &str| forward[name].clone();
        let (mut x, tokens, embedding) = match input {
            Some(x) => (x, None, None),
            None => {
                let tokens = self.data.inputs(g, mb, m);
                let (x, vpe) =
                    llama::token_embedding(g, &w("embed"), &tokens, self.vocab, self.step.bug);
                (x, Some(tokens), vpe)
            }
        };
        let mut layers = Vec::new();
        for l in self.layers.clone() {
            let (out, saved) = llama::decoder_layer(
                g,
                &x,
                l,
                &w,
                self.dims,
                &self.tables,
                self.cfg.eps,
                self.step.bug,
            );
            x = out;
            layers.push(saved);
        }
        if !self.pos.last() {
            let saved = LlamaSaved {
                layers,
                tokens,
                embedding,
                head: None,
            };
            self.saved.insert(mb, saved);
            return Some(x);
        }
        let (logits, head) = llama::lm_head(g, &x, &w, self.cfg.eps);
        let labels = self.data.labels(g, mb, m, self.step.bug);
        let labels1 = g.view(&labels, &[self.dims.tokens()]);
        let name = local_loss_name(self.step, "nll_loss");
        let ce = match self.vocab {
            Some((v0, _)) => llama::vocab_cross_entropy(g, &logits, &labels1, v0, name),
            None => llama::cross_entropy(g, &logits, &labels1, name),
        };
        self.losses.add(g, self.step, ce.loss().clone());
        let head = Some(LlamaHead { head, ce });
        self.saved.insert(
            mb,
            LlamaSaved {
                layers,
                tokens,
                embedding,
                head,
            },
        );
        None
    }

    fn backward(&mut self, g: &mut GraphBuilder, mb: usize, grad: Option<Val>) -> (Grads, Val) {
        let backward = self.weights.pass(g);
        let w = |name: &str| backward[name].clone();
        let LlamaSaved {
            layers,
            tokens,
            embedding,
            head,
        } = self.saved.remove(&mb).expect("forward before backward");
        let (mut grads, mut gx) = match (grad, head) {
            (Some(grad), _) => (BTreeMap::new(), grad),
            (None, Some(h)) => {
                let g_logits = h.ce.backward(g);
                let g_logits = train::scale_seed(g, self.step, &g_logits);
                llama::lm_head_backward(g, &g_logits, &h.head, &w, self.vocab.is_some())
            }
            (None, None) => unreachable!("only the last stage starts the backward"),
        };
        for (l, saved) in self.layers.clone().zip(&layers).rev() {
            gx = llama::decoder_layer_backward(
                g,
                &gx,
                saved,
                l,
                &w,
                self.dims,
                &self.tables,
                &mut grads,
                self.step.bug,
            );
        }
        if let Some(tokens) = tokens {
            let rows = self.vocab.map_or(self.cfg.vocab, |(_, vl)| vl);
            let g_embed = llama::token_embedding_backward(
                g,
                &gx,
                embedding.as_ref(),
                &tokens,
                rows,
                self.step.bug,
            );
            grads.insert("embed".into(), g_embed);
        }
        (grads, gx)
    }
}

/// What a gpt2 stage keeps of a microbatch's forward for its backward.
pub(super) struct Gpt2Saved {
    layers: Vec<gpt2::LayerSaved>,
    masks: Masks,
    /// The embeddings' (first stage).
    embedded: Option<Embedded>,
    /// The final LayerNorm, LM head and loss (last stage).
    head: Option<Gpt2Head>,
}

/// The gpt2 decoder on one stage. Its token embedding is tied to the LM head: the first
/// stage embeds with it, the last stage's LM head multiplies by it, each holds a copy and
/// computes its share of the gradient, and the two shares are summed over the `embd` group
/// before the dp reduction (Megatron's embedding group).
pub(super) struct Gpt2Stage<'a> {
    step: &'a Step<'a>,
    pos: Position,
    layers: Range<usize>,
    weights: &'a Weights,
    dims: &'a gpt2::Dims<'a>,
    /// The rank's token ids (first stage) and labels (last stage).
    data: StageData,
    saved: BTreeMap<usize, Gpt2Saved>,
    /// The parameters applied to sequence chunks (their gradients are partial over tp under SP).
    seq_partial: BTreeSet<String>,
    losses: LossReport,
}

impl Stage for Gpt2Stage<'_> {
    fn boundary(&self) -> Vec<usize> {
        self.dims.stream()
    }

    fn forward(&mut self, g: &mut GraphBuilder, mb: usize, input: Option<Val>) -> Option<Val> {
        let m = self.step.microbatches();
        let w = self.weights.pass(g);
        let (mut x, embedded, masks) = match input {
            Some(x) => (x, None, gpt2::stage_masks(g, self.dims)),
            None => {
                let tokens = self.data.inputs(g, mb, m);
                let (x, embedded, masks) = gpt2::embed_forward(g, self.dims, &w, &tokens);
                (x, Some(embedded), masks)
            }
        };
        let mut layers = Vec::new();
        for l in self.layers.clone() {
            let (out, saved) = gpt2::layer_forward(g, self.dims, &w, &masks, &x, l);
            x = out;
            layers.push(saved);
        }
        let mut saved = Gpt2Saved {
            layers,
            masks,
            embedded,
            head: None,
        };
        if !self.pos.last() {
            self.saved.insert(mb, saved);
            return Some(x);
        }
        let labels = self.data.labels(g, mb, m, self.step.bug);
        let name = local_loss_name(self.step, "nll_loss");
        let (local, head) = gpt2::head_forward(g, self.dims, &w, &x, &labels, name);
        self.losses.add(g, self.step, local);
        saved.head = Some(head);
        self.saved.insert(mb, saved);
        None
    }

    fn backward(&mut self, g: &mut GraphBuilder, mb: usize, grad: Option<Val>) -> (Grads, Val) {
        let w = self.weights.pass(g);
        let saved = self.saved.remove(&mb).expect("forward before backward");
        let mut grads = BTreeMap::new();
        let (mut gx, g_wte_head) = match (grad, &saved.head) {
            (Some(grad), _) => (grad, None),
            (None, Some(head)) => {
                let (gx, g_head) = gpt2::head_backward(
                    g,
                    self.dims,
                    self.step,
                    &w,
                    head,
                    &mut grads,
                    &mut self.seq_partial,
                );
                (gx, Some(g_head))
            }
            (None, None) => unreachable!("only the last stage starts the backward"),
        };
        for (l, sv) in self.layers.clone().zip(&saved.layers).rev() {
            gx = gpt2::layer_backward(
                g,
                self.dims,
                self.step,
                &w,
                &saved.masks,
                &gx,
                sv,
                l,
                &mut grads,
                &mut self.seq_partial,
            );
        }
        match &saved.embedded {
            Some(embedded) => {
                gpt2::embed_backward(g, self.dims, gx.clone(), embedded, g_wte_head, &mut grads)
            }
            None => {
                // The last stage's share of the tied embedding's gradient: the LM head's.
                if let Some(g_head) = g_wte_head {
                    grads.insert("wte".into(), g_head);
                }
            }
        }
        (grads, gx)
    }
}

/// What a deepseek stage keeps of a microbatch's forward for its backward.
pub(super) struct DeepseekSaved {
    layers: Vec<deepseek::LayerSaved>,
    /// The microbatch's token ids (first stage).
    tokens: Option<Val>,
    /// The final norm, LM head and cross-entropy (last stage).
    head: Option<LlamaHead>,
}

/// The deepseek decoder on one stage. Each stage's MoE layers add their balance losses: the
/// forward sums the stage's shares (each microbatch's divided by M), and after the schedule
/// they are all-reduced over `pp` into the last stage's loss (Megatron reduces its aux-loss
/// tracker over the pipeline group the same way); the backward seeds each layer's balance
/// loss with `1 / M` inside the stage, as Megatron's `MoEAuxLossAutoScaler` does, so no
/// gradient crosses stages for it.
pub(super) struct DeepseekStage<'a> {
    pos: Position,
    layers: Range<usize>,
    w: BTreeMap<String, Val>,
    dims: AttnShape,
    tables: AttnTables,
    cx: MoeCtx<'a>,
    /// The rank's token ids (first stage) and labels (last stage).
    data: StageData,
    saved: BTreeMap<usize, DeepseekSaved>,
    /// The stage's balance-loss shares, summed over the microbatches (each divided by M).
    aux: Option<Val>,
    /// Last stage: the cross-entropies, summed over the microbatches (each divided by M).
    ce: Option<Val>,
}

impl DeepseekStage<'_> {
    /// `x / M` with M microbatches (`x` itself with one), added to `total`.
    fn add_share(g: &mut GraphBuilder, total: &mut Option<Val>, x: Val, m: usize) {
        let x = if m > 1 {
            g.div_scalar("div", &x, Arg::I(m as i64))
        } else {
            x
        };
        deepseek::add_to_total(g, total, x);
    }
}

impl Stage for DeepseekStage<'_> {
    fn boundary(&self) -> Vec<usize> {
        vec![self.dims.b, self.dims.s, self.dims.h]
    }

    fn forward(&mut self, g: &mut GraphBuilder, mb: usize, input: Option<Val>) -> Option<Val> {
        let m = self.cx.microbatches;
        let weights = &self.w;
        let w = |name: &str| weights[name].clone();
        let (mut x, tokens) = match input {
            Some(x) => (x, None),
            None => {
                let tokens = self.data.inputs(g, mb, m);
                (llama::embedding(g, &w("embed"), &tokens), Some(tokens))
            }
        };
        let mut layers = Vec::new();
        let mut aux_total: Option<Val> = None;
        for l in self.layers.clone() {
            let (hres, moe_out, aux, saved) =
                deepseek::layer_forward(g, &x, l, &w, self.dims, &self.tables, &self.cx);
            deepseek::add_to_total(g, &mut aux_total, aux);
            x = deepseek::layer_output(g, &hres, &moe_out, self.dims);
            layers.push(saved);
        }
        let aux = aux_total.expect("every stage runs a layer");
        Self::add_share(g, &mut self.aux, aux, m);
        if !self.pos.last() {
            let saved = DeepseekSaved {
                layers,
                tokens,
                head: None,
            };
            self.saved.insert(mb, saved);
            return Some(x);
        }
        let (logits, head) = llama::lm_head(g, &x, &w, self.cx.cfg.base.eps);
        let labels = self.data.labels(g, mb, m, self.cx.bug);
        let labels1 = g.view(&labels, &[self.dims.tokens()]);
        let ce = llama::cross_entropy(g, &logits, &labels1, "nll_loss");
        Self::add_share(g, &mut self.ce, ce.loss().clone(), m);
        let head = Some(LlamaHead { head, ce });
        self.saved.insert(
            mb,
            DeepseekSaved {
                layers,
                tokens,
                head,
            },
        );
        None
    }

    fn backward(&mut self, g: &mut GraphBuilder, mb: usize, grad: Option<Val>) -> (Grads, Val) {
        let m = self.cx.microbatches;
        let weights = &self.w;
        let w = |name: &str| weights[name].clone();
        let saved = self.saved.remove(&mb).expect("forward before backward");
        let (mut grads, mut gx) = match (grad, &saved.head) {
            (Some(grad), _) => (BTreeMap::new(), grad),
            (None, Some(h)) => {
                let g_logits = h.ce.backward(g);
                let g_logits = if m > 1 {
                    g.div_scalar("div", &g_logits, Arg::I(m as i64))
                } else {
                    g_logits
                };
                llama::lm_head_backward(g, &g_logits, &h.head, &w, false)
            }
            (None, None) => unreachable!("only the last stage starts the backward"),
        };
        for (l, sv) in self.layers.clone().zip(&saved.layers).rev() {
            gx = deepseek::layer_backward(
                g,
                &gx,
                sv,
                l,
                &w,
                self.dims,
                &self.tables,
                &self.cx,
                &mut grads,
            );
        }
        if let Some(tokens) = &saved.tokens {
            let vocab = self.cx.cfg.base.vocab;
            grads.insert(
                "embed".into(),
                llama::embedding_backward(g, &gx, tokens, vocab),
            );
        }
        (grads, gx)
    }
}

/// The deepseek rank plan of global rank `rank` (row-major over pp, dp, tp, ep).
pub(super) fn deepseek_rank(plan: &PipelinePlan, rank: usize) -> deepseek::RankPlan {
    deepseek::RankPlan {
        dp: plan.dp,
        tp: plan.tp,
        ep: plan.ep,
        ep_rank: rank % plan.ep,
        tp_rank: rank / plan.ep % plan.tp,
        dispatch: plan.dispatch,
        sequence_parallel: plan.sequence_parallel,
        cp: CpPlan::NONE,
    }
}

/// The graph of the deepseek rank at `pos`: its inputs, the schedule's passes, the loss (the
/// last stage's cross-entropy plus every stage's balance losses, all-reduced over pp) and,
/// for the full iteration, the finalization and SGD step of the stage's parameters `specs`.
pub(super) fn build_deepseek_stage(
    plan: &PipelinePlan,
    pos: Position,
    specs: &[Param],
    layers: Range<usize>,
) -> GraphBuilder {
    let mut g = GraphBuilder::new();
    let cfg = plan.deepseek;
    let base = &cfg.base;
    let rank_plan = deepseek_rank(plan, pos.rank);
    let m = plan.pipeline.microbatches;
    let b_all = base.batch / (plan.dp * plan.ep);
    let data = StageData::tokens(&mut g, pos, b_all, base.seq);
    let dims = AttnShape::new(base, b_all / m, plan.tp);
    let inv_freq = g.input("rope_inv_freq", &[dims.hd / 2]);
    let w = deepseek::declare_weights(&mut g, specs, plan.tp, plan.ep);
    let tables = llama::attn_tables(&mut g, &inv_freq, base.seq);
    let cx = MoeCtx {
        cfg,
        plan: rank_plan,
        b: b_all / m,
        bug: plan.bug,
        microbatches: m,
    };
    let schedule = plan.passes(pos);
    let mut stage = DeepseekStage {
        pos,
        layers,
        w,
        dims,
        tables,
        cx,
        data,
        saved: BTreeMap::new(),
        aux: None,
        ce: None,
    };
    let acc = run_passes(&mut g, pos, &schedule, &mut stage, plan.bug, plan.dp);
    // The balance losses: the tp ranks' shares summed (under SP each computed the whole),
    // then every stage's summed over pp.
    let aux = stage.aux.take().expect("every stage runs a layer");
    let aux = rank_plan.aux_over_tp(&mut g, &aux);
    let aux = llama::reduce_if(&mut g, &aux, "pp", pos.stages);
    if let Some(ce) = stage.ce.take() {
        let loss = rank_plan.loss(&mut g, &ce, &aux);
        g.output(&loss);
    }
    if plan.forward_only {
        return g;
    }
    let weights = &stage.w;
    let w = |name: &str| weights[name].clone();
    deepseek::finalize(&mut g, specs, &acc, &w, rank_plan, plan.bug, base.lr);
    g
}

/// The mlp's passes on the stage at `pos` (see [`build_stage`]).
pub(super) fn run_mlp_stage<'a>(
    g: &mut GraphBuilder,
    plan: &PipelinePlan<'a>,
    pos: Position,
    step: &Step,
    specs: &[Param],
    layers: Range<usize>,
) -> StageRun<'a> {
    let cfg = plan.mlp;
    let b = cfg.batch / plan.dp;
    let data = StageData::declare(g, pos, ["x", "target"], "f32", &[b, cfg.hidden]);
    let weights = train::declare(g, step, specs);
    let mut stage = MlpStage {
        cfg,
        step,
        pos,
        layers,
        weights: &weights,
        data,
        saved: BTreeMap::new(),
        losses: LossReport::default(),
    };
    let acc = run_passes(g, pos, &plan.passes(pos), &mut stage, step.bug, plan.dp);
    let losses = stage.losses;
    StageRun {
        weights,
        acc,
        losses,
        presync: Box::new(|_, _, grad| grad),
    }
}

/// The llama's passes on the stage at `pos` (see [`build_stage`]); the gradients of kv heads
/// replicated over tp ranks are summed over their replicas.
pub(super) fn run_llama_stage<'a>(
    g: &mut GraphBuilder,
    plan: &PipelinePlan<'a>,
    pos: Position,
    step: &Step,
    specs: &[Param],
    layers: Range<usize>,
) -> StageRun<'a> {
    let cfg = plan.llama;
    let m = plan.pipeline.microbatches;
    let b_all = cfg.batch / plan.dp;
    let data = StageData::tokens(g, pos, b_all, cfg.seq);
    let dims = AttnShape::new(cfg, b_all / m, plan.tp);
    let inv_freq = g.input("rope_inv_freq", &[dims.hd / 2]);
    let weights = train::declare(g, step, specs);
    let tables = llama::attn_tables(g, &inv_freq, cfg.seq);
    let vl = cfg.vocab / plan.tp;
    let vocab = (plan.vocab_parallel && plan.tp > 1).then_some((step.tp_rank * vl, vl));
    let mut stage = LlamaStage {
        cfg,
        step,
        pos,
        layers,
        weights: &weights,
        dims,
        tables,
        vocab,
        data,
        saved: BTreeMap::new(),
        losses: LossReport::default(),
    };
    let acc = run_passes(g, pos, &plan.passes(pos), &mut stage, step.bug, plan.dp);
    let losses = stage.losses;
    let bug = step.bug;
    StageRun {
        weights,
        acc,
        losses,
        presync: Box::new(move |g, p, grad| {
            let kv_replicated = matches!(p.tp, TpLayout::ShardReplicas { .. });
            if kv_replicated && bug != Some(Mutation::LlamaKvGradUnsynced) {
                // Each replica saw only its own query heads' share of the kv head's gradient.
                g.all_reduce_sum(&grad, "kv")
            } else {
                grad
            }
        }),
    }
}

/// The gpt2's passes on the stage at `pos` (see [`build_stage`]); the tied embedding's shares
/// are summed over the `embd` group (the first and last stage's ranks of one dp and tp index),
/// as Megatron all-reduces the embedding group's gradients, before the dp reduction.
pub(super) fn run_gpt2_stage<'a>(
    g: &mut GraphBuilder,
    plan: &PipelinePlan<'a>,
    pos: Position,
    step: &Step,
    specs: &[Param],
    layers: Range<usize>,
) -> StageRun<'a> {
    let cfg = plan.gpt2;
    let m = plan.pipeline.microbatches;
    let data = StageData::tokens(g, pos, cfg.batch / plan.dp, cfg.seq);
    let weights = train::declare(g, step, specs);
    let rank_plan = gpt2::RankPlan {
        dp: plan.dp,
        tp: plan.tp,
        tp_rank: step.tp_rank,
        sequence_parallel: plan.sequence_parallel,
        tp_comm_overlap: false,
    };
    let dims = gpt2::Dims::new(cfg, rank_plan, &CpPlan::NONE, step.bug, m);
    let mut stage = Gpt2Stage {
        step,
        pos,
        layers,
        weights: &weights,
        dims: &dims,
        data,
        saved: BTreeMap::new(),
        seq_partial: BTreeSet::new(),
        losses: LossReport::default(),
    };
    let acc = run_passes(g, pos, &plan.passes(pos), &mut stage, step.bug, plan.dp);
    let Gpt2Stage {
        losses,
        seq_partial,
        ..
    } = stage;
    let tied = pos.stages > 1 && (pos.first() || pos.last());
    let bug = step.bug;
    StageRun {
        weights,
        acc,
        losses,
        presync: Box::new(move |g, p, grad| {
            let grad = gpt2::sync_grad(g, &dims, &seq_partial, p, grad);
            if tied && p.name == "wte" && bug != Some(Mutation::ZeroTiedEmbeddingUntied) {
                g.all_reduce_sum(&grad, "embd")
            } else {
                grad
            }
        }),
    }
}
