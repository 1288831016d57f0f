//! The Llama attention sublayer: RoPE and its tables (global positions under context
//! parallelism), grouped-query heads, the causal mask, scaled softmax attention and their
//! backwards, on one rank's share of heads and tokens.

use super::*;

/// RoPE on `[batch, heads, seq, head_dim]`: `x * cos + rotate_half(x) * sin` with
/// `rotate_half(x) = cat(-x2, x1)` over the two halves of the head dim.
pub(super) fn rope(g: &mut GraphBuilder, x: &Val, cos: &Val, sin: &Val) -> Val {
    let hd = x.shape[3];
    let x1 = g.slice(x, 3, 0, hd / 2);
    let x2 = g.slice(x, 3, hd / 2, hd);
    let nx2 = g.unary("neg", "aten.neg.default", &x2);
    let rot = g.cat(&[&nx2, &x1], 3);
    let a = g.mul(x, cos);
    let b = g.mul(&rot, sin);
    g.add(&a, &b)
}

/// The RoPE backward: `grad * cos + cat(u2, -u1)` where `u = grad * sin` (the transpose of
/// `rotate_half`).
pub(super) fn rope_backward(g: &mut GraphBuilder, grad: &Val, cos: &Val, sin: &Val) -> Val {
    let hd = grad.shape[3];
    let a = g.mul(grad, cos);
    let u = g.mul(grad, sin);
    let u1 = g.slice(&u, 3, 0, hd / 2);
    let u2 = g.slice(&u, 3, hd / 2, hd);
    let nu1 = g.unary("neg", "aten.neg.default", &u1);
    let back = g.cat(&[&u2, &nu1], 3);
    g.add(&a, &back)
}

/// `repeat_kv`: `[b, kv, s, d]` to `[b, kv * n_rep, s, d]`, query head `h` reading kv head
/// `h / n_rep` (unsqueeze, expand, contiguous copy, view).
pub(crate) fn repeat_kv(g: &mut GraphBuilder, x: &Val, n_rep: usize) -> Val {
    if n_rep == 1 {
        return x.clone();
    }
    let (b, kv, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let u = g.unsqueeze(x, 2);
    let e = g.expand(&u, &[b, kv, n_rep, s, d]);
    let c = g.contiguous(&e);
    g.view(&c, &[b, kv * n_rep, s, d])
}

/// The backward of [`repeat_kv`]: the gradients of the copies of each kv head summed.
pub(crate) fn repeat_kv_backward(g: &mut GraphBuilder, grad: &Val, n_rep: usize) -> Val {
    if n_rep == 1 {
        return grad.clone();
    }
    let (b, h, s, d) = (grad.shape[0], grad.shape[1], grad.shape[2], grad.shape[3]);
    let v = g.view(grad, &[b, h / n_rep, n_rep, s, d]);
    g.sum_dims(&v, &[2], false)
}

/// `[b, heads, s, d]` back to token rows `[b * s, heads * d]`.
pub(super) fn heads_to_rows(g: &mut GraphBuilder, x: &Val) -> Val {
    let (b, h, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let t = g.transpose(x, 1, 2);
    let c = g.contiguous(&t);
    g.view(&c, &[b * s, h * d])
}

/// The sizes one rank's attention sublayer works with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnShape {
    /// The rank's sequences.
    pub(crate) b: usize,
    /// Sequence length.
    pub(crate) s: usize,
    /// Model width.
    pub(crate) h: usize,
    /// Width of one head.
    pub(crate) hd: usize,
    /// The rank's query heads.
    pub(crate) nh: usize,
    /// The rank's kv heads.
    pub(crate) nkv: usize,
    /// Query heads per kv head.
    pub(crate) n_rep: usize,
    /// Size of the tp mesh dim.
    pub(crate) tp: usize,
    /// Context parallelism (`s` is then the rank's share of the sequence).
    pub(crate) cp: CpPlan,
}

impl AttnShape {
    /// The shape of a rank holding `b` sequences of a `tp`-way plan of `cfg`.
    pub(crate) fn new(cfg: &LlamaConfig, b: usize, tp: usize) -> AttnShape {
        let nh = cfg.heads / tp;
        let nkv = cfg.kv_heads * cfg.kv_replicas(tp) / tp;
        AttnShape {
            b,
            s: cfg.seq,
            h: cfg.hidden,
            hd: cfg.head_dim(),
            nh,
            nkv,
            n_rep: nh / nkv,
            tp,
            cp: CpPlan::NONE,
        }
    }

    /// The same shape on a rank of the cp plan `cp`: it holds `s / cp` tokens of each sequence.
    pub(crate) fn with_cp(self, cp: CpPlan) -> AttnShape {
        AttnShape {
            s: self.s / cp.cp,
            cp,
            ..self
        }
    }

    /// The rank's tokens (`b * s`).
    pub(crate) fn tokens(&self) -> usize {
        self.b * self.s
    }
}

/// What every layer's attention reads besides its weights: RoPE's cos and sin tables
/// `[s, head_dim]` and the additive causal mask `[s, s]`.
pub(crate) struct AttnTables {
    cos: Val,
    sin: Val,
    mask: Val,
    /// Under context parallelism: the masks of the ring steps (`mask` is unused).
    ring: Option<RingMasks>,
}

/// The RoPE tables for the positions `0..s` and the causal mask.
pub(crate) fn attn_tables(g: &mut GraphBuilder, inv_freq: &Val, s: usize) -> AttnTables {
    // RoPE angles: positions times the inverse frequencies. (Every rank holds whole sequences,
    // so positions start at 0; an offset shared by q and k would not even change the scores,
    // RoPE being relative.)
    let pos = g.arange(s);
    let (cos, sin) = rope_tables(g, inv_freq, &pos);
    let mask = causal_mask(g, s);
    AttnTables {
        cos,
        sin,
        mask,
        ring: None,
    }
}

/// RoPE's cos and sin tables `[s, head_dim]` for the positions `pos` `[s]` (i64).
pub(super) fn rope_tables(g: &mut GraphBuilder, inv_freq: &Val, pos: &Val) -> (Val, Val) {
    let s = pos.shape[0];
    let pos_f = g.call(
        "_to_copy",
        "aten._to_copy.default",
        &[Arg::V(pos), Arg::Raw("dtype = torch.float32")],
        vec![s],
    );
    let pos2 = g.unsqueeze(&pos_f, 1);
    let inv2 = g.unsqueeze(inv_freq, 0);
    let freqs = g.mul(&pos2, &inv2);
    let angles = g.cat(&[&freqs, &freqs], 1);
    let cos = g.unary("cos", "aten.cos.default", &angles);
    let sin = g.unary("sin", "aten.sin.default", &angles);
    (cos, sin)
}

/// [`attn_tables`] for a rank holding `s` tokens of each sequence on the cp plan `cp`: under
/// context parallelism the RoPE tables of the tokens' global positions (the planted
/// `cp-rope-no-offset` uses the local positions `0..s`) and the masks of the ring steps.
pub(crate) fn attn_tables_cp(
    g: &mut GraphBuilder,
    inv_freq: &Val,
    s: usize,
    cp: &CpPlan,
    bug: Option<Mutation>,
) -> AttnTables {
    if !cp.is_ring() {
        return attn_tables(g, inv_freq, s);
    }
    let pos = cp::positions(g, s, cp);
    let (cos, sin) = if bug == Some(Mutation::CpRopeNoOffset) {
        let local = g.arange(s);
        rope_tables(g, inv_freq, &local)
    } else {
        rope_tables(g, inv_freq, &pos)
    };
    let ring = cp::ring_masks(g, &pos, bug);
    AttnTables {
        cos,
        sin,
        mask: ring.diag().clone(),
        ring: Some(ring),
    }
}

/// The causal mask `[s, s]` added to attention scores: -inf above the diagonal, 0 elsewhere.
pub(crate) fn causal_mask(g: &mut GraphBuilder, s: usize) -> Val {
    let full = g.full(&[s, s], f64::NEG_INFINITY);
    g.call(
        "triu",
        "aten.triu.default",
        &[Arg::V(&full), Arg::I(1)],
        vec![s, s],
    )
}

/// Scaled, masked softmax attention of `b` sequences: `softmax(q3 @ kt3 * scale + mask) @ v3`
/// with queries `q3` `[b * heads, s, head_dim]` and transposed keys `kt3`; the values come
/// from `values`, emitted once the probabilities are (where the graphs view them). Returns
/// the output `[b * heads, s, head_dim]` and what the backward reads.
pub(crate) fn attend(
    g: &mut GraphBuilder,
    q3: Val,
    kt3: Val,
    values: impl FnOnce(&mut GraphBuilder) -> Val,
    mask: &Val,
    scale: f64,
    b: usize,
) -> (Val, ScoresSaved) {
    let (bh, s) = (q3.shape[0], q3.shape[1]);
    let raw3 = g.bmm(&q3, &kt3);
    let raw = g.view(&raw3, &[b, bh / b, s, s]);
    let scaled = g.mul_scalar("mul", &raw, Arg::F(scale));
    let masked = g.add(&scaled, mask);
    let p = g.call(
        "_softmax",
        "aten._softmax.default",
        &[Arg::V(&masked), Arg::I(-1), Arg::B(false)],
        masked.shape.clone(),
    );
    let p3 = g.view(&p, &[bh, s, s]);
    let v3 = values(g);
    let o3 = g.bmm(&p3, &v3);
    let saved = ScoresSaved {
        q3,
        kt3,
        p,
        p3,
        v3,
        scale,
    };
    (o3, saved)
}

/// The backward of [`attend`] for the gradient `g_o3` of the
/// attention output: the gradients of the queries, the transposed keys and the values.
pub(crate) fn attention_scores_backward(
    g: &mut GraphBuilder,
    g_o3: &Val,
    sv: &ScoresSaved,
) -> (Val, Val, Val) {
    let v3t = g.transpose(&sv.v3, 1, 2);
    let g_p3 = g.bmm(g_o3, &v3t);
    let p3t = g.transpose(&sv.p3, 1, 2);
    let g_v3 = g.bmm(&p3t, g_o3);
    let g_p = g.view(&g_p3, &sv.p.shape);
    let g_masked = g.call(
        "_softmax_backward_data",
        "aten._softmax_backward_data.default",
        &[
            Arg::V(&g_p),
            Arg::V(&sv.p),
            Arg::I(-1),
            Arg::Raw("torch.float32"),
        ],
        g_p.shape.clone(),
    );
    let g_raw = g.mul_scalar("mul", &g_masked, Arg::F(sv.scale));
    let g_raw3 = g.view(&g_raw, &sv.p3.shape);
    let kt3t = g.transpose(&sv.kt3, 1, 2);
    let g_q3 = g.bmm(&g_raw3, &kt3t);
    let q3t = g.transpose(&sv.q3, 1, 2);
    let g_kt3 = g.bmm(&q3t, &g_raw3);
    (g_q3, g_kt3, g_v3)
}

/// The attention sublayer of decoder layer `l` on the residual stream `x` `[b, s, h]`: RMSNorm,
/// q/k/v column parallel (the rank's heads), RoPE, grouped-query causal attention, o row
/// parallel with its all-reduce over tp, residual. Returns the residual stream after it.
/// Honours the llama attention mutations (scale, o-projection all-reduce, wrong group).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    g: &mut GraphBuilder,
    x: &Val,
    l: usize,
    w: &dyn Fn(&str) -> Val,
    d: AttnShape,
    tables: &AttnTables,
    eps: f64,
    bug: Option<Mutation>,
) -> (Val, AttnSaved) {
    let is = |m: Mutation| bug == Some(m);
    let AttnShape {
        b,
        s,
        h,
        hd,
        nh,
        nkv,
        n_rep,
        tp,
        ..
    } = d;
    let (cos, sin) = (&tables.cos, &tables.sin);
    let (xn, attn_norm) = rms_norm(g, x, &w(&format!("attn_norm_{l}")), eps);
    let xn2d = g.view(&xn, &[d.tokens(), h]);
    let q = linear(g, &xn2d, &w(&format!("wq_{l}")));
    let k = linear(g, &xn2d, &w(&format!("wk_{l}")));
    let vv = linear(g, &xn2d, &w(&format!("wv_{l}")));
    let q4 = g.view(&q, &[b, s, nh, hd]);
    let qh = g.transpose(&q4, 1, 2);
    let k4 = g.view(&k, &[b, s, nkv, hd]);
    let kh = g.transpose(&k4, 1, 2);
    let v4 = g.view(&vv, &[b, s, nkv, hd]);
    let vh = g.transpose(&v4, 1, 2);
    let qr = rope(g, &qh, cos, sin);
    let kr = rope(g, &kh, cos, sin);
    let scale = if is(Mutation::LlamaAttnScaleLocal) {
        1.0 / (hd as f64 / tp as f64).sqrt()
    } else {
        1.0 / (hd as f64).sqrt()
    };
    let (o3, core) = match &tables.ring {
        Some(masks) => {
            // Context parallelism: ring attention over the cp ranks' keys and values.
            let q3 = g.view(&qr, &[b * nh, s, hd]);
            let sh = RingShape { b, n_rep, layer: l };
            let (o3, ring) = cp::ring_attention(g, &q3, &kr, &vh, masks, scale, sh, &d.cp);
            (o3, AttnCore::Ring(ring))
        }
        None => {
            let krep = repeat_kv(g, &kr, n_rep);
            let vrep = repeat_kv(g, &vh, n_rep);
            let q3 = g.view(&qr, &[b * nh, s, hd]);
            let kt = g.transpose(&krep, 2, 3);
            let ktc = g.contiguous(&kt);
            let kt3 = g.view(&ktc, &[b * nh, hd, s]);
            let values = |g: &mut GraphBuilder| g.view(&vrep, &[b * nh, s, hd]);
            let (o3, scores) = attend(g, q3, kt3, values, &tables.mask, scale, b);
            (o3, AttnCore::Full(scores))
        }
    };
    let o4 = g.view(&o3, &[b, nh, s, hd]);
    let attn2d = heads_to_rows(g, &o4);
    let o = linear(g, &attn2d, &w(&format!("wo_{l}")));
    let o_full = if l == 0 && is(Mutation::LlamaOprojMissingAllreduce) {
        o
    } else if l == 0 && is(Mutation::WrongGroup) {
        g.all_reduce_sum(&o, "dp")
    } else {
        reduce_if(g, &o, "tp", tp)
    };
    let o3d = g.view(&o_full, &[b, s, h]);
    let hres = g.add(x, &o3d);
    let saved = AttnSaved {
        attn_norm,
        xn2d,
        core,
        attn2d,
    };
    (hres, saved)
}

/// The backward of [`attention`] for the gradient `g_hres` of its output: inserts the
/// gradients of layer `l`'s attention weights into `grads` and returns the gradient of its
/// input (residual plus the RMSNorm path, whose q/k/v input gradient is all-reduced over tp).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward(
    g: &mut GraphBuilder,
    g_hres: &Val,
    sv: &AttnSaved,
    l: usize,
    w: &dyn Fn(&str) -> Val,
    d: AttnShape,
    tables: &AttnTables,
    grads: &mut BTreeMap<String, Val>,
    bug: Option<Mutation>,
) -> Val {
    let (b, s, h, hd, nh) = (d.b, d.s, d.h, d.hd, d.nh);
    let (n_rep, tp) = (d.n_rep, d.tp);
    let (cos, sin) = (&tables.cos, &tables.sin);
    let g_o2d = g.view(g_hres, &[d.tokens(), h]);
    let g_attn2d = g.mm(&g_o2d, &w(&format!("wo_{l}")));
    let g_o2dt = g.t(&g_o2d);
    grads.insert(format!("wo_{l}"), g.mm(&g_o2dt, &sv.attn2d));
    let g_o4 = g.view(&g_attn2d, &[b, s, nh, hd]);
    let g_ot = g.transpose(&g_o4, 1, 2);
    let g_oc = g.contiguous(&g_ot);
    let g_o3 = g.view(&g_oc, &[b * nh, s, hd]);
    let (g_qr, g_kr, g_vh) = match (&sv.core, &tables.ring) {
        (AttnCore::Ring(ring), Some(masks)) => {
            let sh = RingShape { b, n_rep, layer: l };
            let (g_q3, g_kr, g_vh) = cp::ring_attention_backward(g, &g_o3, ring, masks, sh, &d.cp);
            (g.view(&g_q3, &[b, nh, s, hd]), g_kr, g_vh)
        }
        (AttnCore::Full(scores), _) => {
            let (g_q3, g_kt3, g_v3) = attention_scores_backward(g, &g_o3, scores);
            let g_qr = g.view(&g_q3, &[b, nh, s, hd]);
            let g_kt = g.view(&g_kt3, &[b, nh, hd, s]);
            let g_krep = g.transpose(&g_kt, 2, 3);
            let g_vrep = g.view(&g_v3, &[b, nh, s, hd]);
            let g_kr = repeat_kv_backward(g, &g_krep, n_rep);
            let g_vh = repeat_kv_backward(g, &g_vrep, n_rep);
            (g_qr, g_kr, g_vh)
        }
        (AttnCore::Ring(_), None) => unreachable!("ring attention is built with its masks"),
    };
    let g_qh = rope_backward(g, &g_qr, cos, sin);
    let g_kh = rope_backward(g, &g_kr, cos, sin);
    let g_q2d = heads_to_rows(g, &g_qh);
    let g_k2d = heads_to_rows(g, &g_kh);
    let g_v2d = heads_to_rows(g, &g_vh);
    let mut g_xn2d = None;
    for (name, gr) in [("wq", &g_q2d), ("wk", &g_k2d), ("wv", &g_v2d)] {
        let grt = g.t(gr);
        grads.insert(format!("{name}_{l}"), g.mm(&grt, &sv.xn2d));
        let part = g.mm(gr, &w(&format!("{name}_{l}")));
        g_xn2d = Some(match g_xn2d {
            None => part,
            Some(acc) => g.add(&acc, &part),
        });
    }
    let g_xn2d = g_xn2d.expect("q, k and v contribute");
    let g_xn2d = if l == 0 && bug == Some(Mutation::LlamaQkvGradMissingAllreduce) {
        g_xn2d
    } else {
        reduce_if(g, &g_xn2d, "tp", tp)
    };
    let g_xn = g.view(&g_xn2d, &[b, s, h]);
    let (g_x_norm, g_an) =
        rms_norm_backward(g, &g_xn, &w(&format!("attn_norm_{l}")), &sv.attn_norm);
    grads.insert(format!("attn_norm_{l}"), g_an);
    g.add(g_hres, &g_x_norm)
}
