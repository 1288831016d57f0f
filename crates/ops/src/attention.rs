//! Scaled dot-product attention: the composite `scaled_dot_product_attention` and the fused
//! CPU kernel PyTorch's captures call (output and log-sum-exp), with its backward.

use crate::nn::{acc_dtype, err, require_float, softmax_lane};
use crate::util::{broadcast_indices, broadcast_shapes};
use crate::{Args, EvalCtx, Meta, OpError, Registry, Tensor};
use shardproof_ir::DType;

/// The checked shapes of a `scaled_dot_product_attention` call: query `[..., Hq, L, E]`, key
/// `[..., Hk, S, E]`, value `[..., Hv, S, Ev]`, optional mask broadcastable to `[..., L, S]`.
struct Attention {
    /// Batch dims of the output (everything before `[L, Ev]`), broadcast over all operands.
    batch: Vec<usize>,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    /// With `enable_gqa`, the query heads `Hq`, which key and value heads serve in groups.
    gqa_heads: Option<usize>,
    scale: f64,
    causal: bool,
}

impl Attention {
    fn of(a: &Args) -> Result<Attention, OpError> {
        const OP: &str = "scaled_dot_product_attention";
        let (q, k, v) = (a.meta("query")?, a.meta("key")?, a.meta("value")?);
        let mask = a.opt_meta("attn_mask")?;
        require_float(OP, &q)?;
        if k.dtype != q.dtype || v.dtype != q.dtype {
            return err(format!(
                "{OP}: expected query, key, and value to have the same dtype, got {}, {} and {}",
                q.dtype.torch_name(),
                k.dtype.torch_name(),
                v.dtype.torch_name()
            ));
        }
        if q.rank() < 2 || k.rank() < 2 || v.rank() < 2 {
            return err(format!(
                "{OP}: query, key and value need at least 2 dims, got shapes {:?}, {:?} and {:?}",
                q.shape, k.shape, v.shape
            ));
        }
        let last2 = |m: &Meta| (m.shape[m.rank() - 2], m.shape[m.rank() - 1]);
        let ((l, e), (s, ek), (sv, ev)) = (last2(&q), last2(&k), last2(&v));
        if ek != e || sv != s {
            return err(format!(
                "{OP}: query {:?}, key {:?} and value {:?} do not fit ([..., L, E], [..., S, E], \
                 [..., S, Ev])",
                q.shape, k.shape, v.shape
            ));
        }
        let dropout = a.float("dropout_p")?;
        if dropout != 0.0 {
            // Random, and the interpreter cannot reproduce torch's random stream: refuse rather
            // than compute something else.
            return err(format!(
                "{OP}: dropout_p = {dropout} is not supported (attention dropout is random); \
                 capture the model in eval mode"
            ));
        }
        let causal = a.bool("is_causal")?;
        if causal && mask.is_some() {
            return err(format!(
                "{OP}: explicit attn_mask should not be set when is_causal=True"
            ));
        }
        let (qb, mut kb, mut vb) = (
            &q.shape[..q.rank() - 2],
            k.shape[..k.rank() - 2].to_vec(),
            v.shape[..v.rank() - 2].to_vec(),
        );
        // The fused kernels' schemas (`_scaled_dot_product_flash_attention_for_cpu`) have no
        // `enable_gqa`: their heads must match.
        let gqa = a.schema().index_of("enable_gqa").is_some() && a.bool("enable_gqa")?;
        let gqa_heads = if gqa {
            let (Some(&hq), Some(&hk), Some(&hv)) = (qb.last(), kb.last(), vb.last()) else {
                return err(format!(
                    "{OP}: enable_gqa needs a head dim (-3) in query, key and value"
                ));
            };
            if hk == 0 || hv == 0 || hq % hk != 0 || hq % hv != 0 {
                return err(format!(
                    "{OP}: with enable_gqa the key and value heads ({hk}, {hv}) must divide \
                     the query heads ({hq})"
                ));
            }
            *kb.last_mut().expect("checked") = hq;
            *vb.last_mut().expect("checked") = hq;
            Some(hq)
        } else {
            None
        };
        let mut batch = broadcast_shapes(&broadcast_shapes(qb, &kb)?, &vb)?;
        if let Some(m) = &mask {
            if !(m.dtype == DType::Bool || m.dtype == DType::F32 || m.dtype == q.dtype) {
                return err(format!(
                    "{OP}: expected attn_mask dtype to be bool or float or to match query dtype, \
                     got {} and {}",
                    m.dtype.torch_name(),
                    q.dtype.torch_name()
                ));
            }
            let mut scores = batch.clone();
            scores.extend([l, s]);
            let full = broadcast_shapes(&scores, &m.shape)?;
            if full[full.len() - 2..] != [l, s] {
                return err(format!(
                    "{OP}: attn_mask of shape {:?} does not broadcast to the scores {scores:?}",
                    m.shape
                ));
            }
            batch = full[..full.len() - 2].to_vec();
        }
        let scale = a.opt_float("scale")?.unwrap_or(1.0 / (e as f64).sqrt());
        Ok(Attention {
            batch,
            l,
            s,
            e,
            ev,
            gqa_heads,
            scale,
            causal,
        })
    }

    fn out_shape(&self) -> Vec<usize> {
        let mut shape = self.batch.clone();
        shape.extend([self.l, self.ev]);
        shape
    }

    /// For every output batch, the batch of an operand with batch dims `src`: broadcast, and
    /// under GQA query head `h` reads key/value head `h / (Hq / H)`.
    fn batch_indices(&self, src: &[usize]) -> Vec<usize> {
        match (self.gqa_heads, src.last()) {
            (Some(hq), Some(&h)) if h != hq => {
                let mut expanded = src.to_vec();
                *expanded.last_mut().expect("nonempty") = hq;
                broadcast_indices(&expanded, &self.batch)
                    .into_iter()
                    .map(|i| (i / hq) * h + (i % hq) / (hq / h))
                    .collect()
            }
            _ => broadcast_indices(src, &self.batch),
        }
    }
}

fn infer_sdpa(a: &Args) -> Result<Vec<Meta>, OpError> {
    let att = Attention::of(a)?;
    Ok(vec![Meta::new(a.meta("query")?.dtype, att.out_shape())])
}

/// The scaled scores `q·kᵀ·scale + bias` of every output batch, `[batch, L, S]` flattened, the
/// bias being `-inf` where a bool mask is false or above the diagonal under `is_causal`, or an
/// additive float mask.
fn attention_scores(att: &Attention, a: &Args) -> Result<Vec<f64>, OpError> {
    let (q, k) = (a.tensor("query")?, a.tensor("key")?);
    let mask = a.opt_tensor("attn_mask")?;
    let (l, s, e) = (att.l, att.s, att.e);
    let batch_of = |t: &Tensor| att.batch_indices(&t.shape()[..t.meta.rank() - 2]);
    let (iq, ik) = (batch_of(q), batch_of(k));
    let mut scores_shape = att.batch.clone();
    scores_shape.extend([l, s]);
    let im = mask.map(|t| broadcast_indices(t.shape(), &scores_shape));
    let bool_mask = mask.is_some_and(|t| t.dtype() == DType::Bool);
    let mut scores = vec![0.0; iq.len() * l * s];
    for b in 0..iq.len() {
        let (qd, kd) = (&q.data[iq[b] * l * e..], &k.data[ik[b] * s * e..]);
        for i in 0..l {
            let qrow = &qd[i * e..(i + 1) * e];
            for j in 0..s {
                let krow = &kd[j * e..(j + 1) * e];
                let dot: f64 = qrow.iter().zip(krow).map(|(x, y)| x * y).sum();
                let at = (b * l + i) * s + j;
                let bias = match (&im, mask) {
                    _ if att.causal && j > i => f64::NEG_INFINITY,
                    (Some(im), Some(mt)) if bool_mask => {
                        if mt.data[im[at]] != 0.0 {
                            0.0
                        } else {
                            f64::NEG_INFINITY
                        }
                    }
                    (Some(im), Some(mt)) => mt.data[im[at]],
                    _ => 0.0,
                };
                scores[at] = dot * att.scale + bias;
            }
        }
    }
    Ok(scores)
}

/// The attention output `softmax(scores)·v` and each row's log-sum-exp of the scores. A row
/// masked entirely gives zeros and a log-sum-exp of `-inf`, as torch's kernels (not NaN, as a
/// plain softmax would).
fn attention_forward(att: &Attention, a: &Args) -> Result<(Vec<f64>, Vec<f64>), OpError> {
    let v = a.tensor("value")?;
    let (l, s, ev) = (att.l, att.s, att.ev);
    let iv = att.batch_indices(&v.shape()[..v.meta.rank() - 2]);
    let scores = attention_scores(att, a)?;
    let mut out = vec![0.0; iv.len() * l * ev];
    let mut lse = vec![f64::NEG_INFINITY; iv.len() * l];
    let mut probs = vec![0.0; l * s];
    for b in 0..iv.len() {
        let rows = scores[b * l * s..(b + 1) * l * s].chunks(s.max(1));
        for (i, (row, p)) in rows.zip(probs.chunks_mut(s.max(1))).enumerate() {
            if row.iter().all(|&x| x == f64::NEG_INFINITY) {
                p.fill(0.0);
            } else {
                softmax_lane(row, p, false);
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = row.iter().map(|x| (x - max).exp()).sum();
                lse[b * l + i] = max + sum.ln();
            }
        }
        let vd = &v.data[iv[b] * s * ev..(iv[b] + 1) * s * ev];
        crate::linalg::gemm_acc(&probs, vd, &mut out[b * l * ev..(b + 1) * l * ev], l, s, ev);
    }
    Ok((out, lse))
}

/// `softmax(q·kᵀ·scale + bias)·v` (see [`attention_forward`]).
fn eval_sdpa(a: &Args, m: &[Meta], _: &mut EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let att = Attention::of(a)?;
    let (out, _) = attention_forward(&att, a)?;
    Ok(vec![Tensor::new(m[0].clone(), out)])
}

/// The fused CPU kernel's checks beyond [`Attention::of`]: query, key and value share their
/// batch and head dims (no broadcasting, no grouped heads).
fn fused_attention(op: &str, a: &Args) -> Result<Attention, OpError> {
    let att = Attention::of(a)?;
    let (q, k, v) = (a.meta("query")?, a.meta("key")?, a.meta("value")?);
    let batch = |m: &Meta| m.shape[..m.rank() - 2].to_vec();
    if batch(&k) != batch(&q) || batch(&v) != batch(&q) || batch(&q) != att.batch {
        return err(format!(
            "{op}: query {:?}, key {:?} and value {:?} must share their batch and head dims",
            q.shape, k.shape, v.shape
        ));
    }
    if att.ev != att.e {
        return err(format!(
            "{op}: query, key and value must have the same head size, got {} and {}",
            att.e, att.ev
        ));
    }
    Ok(att)
}

/// Output `[..., L, Ev]` in the query's dtype, log-sum-exp `[..., L]` in the accumulation dtype.
fn infer_flash_cpu(a: &Args) -> Result<Vec<Meta>, OpError> {
    const OP: &str = "_scaled_dot_product_flash_attention_for_cpu";
    let att = fused_attention(OP, a)?;
    let dtype = a.meta("query")?.dtype;
    let mut lse = att.batch.clone();
    lse.push(att.l);
    Ok(vec![
        Meta::new(dtype, att.out_shape()),
        Meta::new(acc_dtype(OP, dtype)?, lse),
    ])
}

fn eval_flash_cpu(a: &Args, m: &[Meta], _: &mut EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let att = fused_attention("_scaled_dot_product_flash_attention_for_cpu", a)?;
    let (out, lse) = attention_forward(&att, a)?;
    Ok(vec![
        Tensor::new(m[0].clone(), out),
        Tensor::new(m[1].clone(), lse),
    ])
}

fn infer_flash_cpu_backward(a: &Args) -> Result<Vec<Meta>, OpError> {
    const OP: &str = "_scaled_dot_product_flash_attention_for_cpu_backward";
    let att = fused_attention(OP, a)?;
    let mut lse = att.batch.clone();
    lse.push(att.l);
    for (name, shape) in [
        ("grad_out", att.out_shape()),
        ("out", att.out_shape()),
        ("logsumexp", lse),
    ] {
        let got = a.meta(name)?;
        if got.shape != shape {
            return err(format!(
                "{OP}: `{name}` has shape {:?}, the forward's is {shape:?}",
                got.shape
            ));
        }
    }
    Ok(vec![a.meta("query")?, a.meta("key")?, a.meta("value")?])
}

/// The gradients of the fused kernel from the forward's output and log-sum-exp, as the kernel
/// computes them: `P = exp(scores - lse)`, `dV = Pᵀ·dO`, `dP = dO·Vᵀ`,
/// `dS = P ∘ (dP - rowsum(dO ∘ O))`, `dQ = dS·K·scale`, `dK = dSᵀ·Q·scale`.
fn eval_flash_cpu_backward(a: &Args, m: &[Meta], _: &mut EvalCtx) -> Result<Vec<Tensor>, OpError> {
    let att = fused_attention("_scaled_dot_product_flash_attention_for_cpu_backward", a)?;
    let (q, k, v) = (a.tensor("query")?, a.tensor("key")?, a.tensor("value")?);
    let (d_out, out, lse) = (
        a.tensor("grad_out")?,
        a.tensor("out")?,
        a.tensor("logsumexp")?,
    );
    let (l, s, e, ev) = (att.l, att.s, att.e, att.ev);
    let batches: usize = att.batch.iter().product();
    let scores = attention_scores(&att, a)?;
    let (mut dq, mut dk, mut dv) = (
        vec![0.0; batches * l * e],
        vec![0.0; batches * s * e],
        vec![0.0; batches * s * ev],
    );
    for b in 0..batches {
        for i in 0..l {
            let row = b * l + i;
            let d_o = &d_out.data[row * ev..(row + 1) * ev];
            let o = &out.data[row * ev..(row + 1) * ev];
            let delta: f64 = d_o.iter().zip(o).map(|(x, y)| x * y).sum();
            let qrow = &q.data[row * e..(row + 1) * e];
            for j in 0..s {
                let score = scores[row * s + j];
                if score == f64::NEG_INFINITY || lse.data[row] == f64::NEG_INFINITY {
                    continue;
                }
                let p = (score - lse.data[row]).exp();
                let col = b * s + j;
                let vrow = &v.data[col * ev..(col + 1) * ev];
                let dp: f64 = d_o.iter().zip(vrow).map(|(x, y)| x * y).sum();
                let ds = p * (dp - delta) * att.scale;
                for (g, x) in dv[col * ev..(col + 1) * ev].iter_mut().zip(d_o) {
                    *g += p * x;
                }
                let krow = &k.data[col * e..(col + 1) * e];
                for (g, x) in dq[row * e..(row + 1) * e].iter_mut().zip(krow) {
                    *g += ds * x;
                }
                for (g, x) in dk[col * e..(col + 1) * e].iter_mut().zip(qrow) {
                    *g += ds * x;
                }
            }
        }
    }
    Ok(vec![
        Tensor::new(m[0].clone(), dq),
        Tensor::new(m[1].clone(), dk),
        Tensor::new(m[2].clone(), dv),
    ])
}

pub(crate) fn register_attention(r: &mut Registry) {
    // Pure: dropout_p > 0 is refused rather than registered as a random operator (see
    // `Attention::of`), so every accepted call is deterministic.
    r.pure(
        "aten.scaled_dot_product_attention.default",
        "scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0., bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor",
        infer_sdpa,
        eval_sdpa,
    );
    // The fused kernel PyTorch's CPU captures call (torch.export, AOTAutograd): the output and
    // each row's log-sum-exp, and its backward from them.
    r.pure(
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value, float dropout_p=0.0, bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None) -> (Tensor output, Tensor logsumexp)",
        infer_flash_cpu,
        eval_flash_cpu,
    );
    r.pure(
        "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
        "_scaled_dot_product_flash_attention_for_cpu_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, Tensor? attn_mask=None, float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)",
        infer_flash_cpu_backward,
        eval_flash_cpu_backward,
    );
}
