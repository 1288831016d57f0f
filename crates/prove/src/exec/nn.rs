//! Symbolic rules of the matmul family, softmax, normalizations and losses: each written from
//! the operator's mathematical definition, the way the registry's kernel computes it.

use super::rules::{map_elementwise, reduce_by};
use super::{ExecError, NodeCtx, Operand};
use crate::expr::{Arena, Built, Coeff, ExprId, Func};
use crate::tensor::{broadcast_index, norm_dim, strides, SymTensor};

/// sum_k a[.., i, k] * b[.., k, j] with broadcast batch dims, both operands at least 2-d.
fn batched_matmul(ar: &mut Arena, a: &SymTensor, b: &SymTensor) -> Result<SymTensor, ExecError> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (n, k) = (a.shape[ra - 2], a.shape[ra - 1]);
    let (k2, m) = (b.shape[rb - 2], b.shape[rb - 1]);
    if k != k2 {
        return Err(ExecError::invalid(format!(
            "matmul of {:?} and {:?}: inner dims differ",
            a.shape, b.shape
        )));
    }
    let (ba, bb) = (&a.shape[..ra - 2], &b.shape[..rb - 2]);
    let nb = ba.len().max(bb.len());
    let mut batch = vec![1usize; nb];
    for d in 0..nb {
        let x = if d + ba.len() >= nb {
            ba[d + ba.len() - nb]
        } else {
            1
        };
        let y = if d + bb.len() >= nb {
            bb[d + bb.len() - nb]
        } else {
            1
        };
        batch[d] = if x == 1 { y } else { x };
    }
    let ia = broadcast_index(ba, &batch);
    let ib = broadcast_index(bb, &batch);
    let mut out = Vec::with_capacity(ia.len() * n * m);
    let mut terms = Vec::with_capacity(k);
    for (pa, pb) in ia.iter().zip(&ib) {
        let (oa, ob) = (pa * n * k, pb * k * m);
        for i in 0..n {
            for j in 0..m {
                terms.clear();
                for t in 0..k {
                    terms.push(ar.mul(a.elems[oa + i * k + t], b.elems[ob + t * m + j])?);
                }
                out.push(ar.sum(&terms)?);
            }
        }
    }
    let mut shape = batch;
    shape.extend([n, m]);
    Ok(SymTensor::new(a.dtype, shape, out))
}

fn transpose_last(t: &SymTensor) -> SymTensor {
    let r = t.shape.len();
    let (n, m) = (t.shape[r - 2], t.shape[r - 1]);
    let batch: usize = t.shape[..r - 2].iter().product();
    let mut out = Vec::with_capacity(t.numel());
    for b in 0..batch {
        for j in 0..m {
            for i in 0..n {
                out.push(t.elems[b * n * m + i * m + j]);
            }
        }
    }
    let mut shape = t.shape.clone();
    shape.swap(r - 2, r - 1);
    SymTensor::new(t.dtype, shape, out)
}

fn with_shape(t: &SymTensor, shape: Vec<usize>) -> SymTensor {
    SymTensor {
        dtype: t.dtype,
        shape,
        elems: t.elems.clone(),
    }
}

/// mm, bmm, matmul, addmm, baddbmm, linear, dot, mv.
pub(crate) fn matmul_family(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let name = ctx.def.name.name.clone();
    let meta = ctx.out_meta(0)?;
    let (a, b) = match name.as_str() {
        "mm" | "bmm" => (ctx.tensor("self")?, ctx.tensor("mat2")?),
        "addmm" => (ctx.tensor("mat1")?, ctx.tensor("mat2")?),
        "baddbmm" => (ctx.tensor("batch1")?, ctx.tensor("batch2")?),
        "linear" => {
            let w = ctx.tensor("weight")?;
            if w.shape.len() != 2 {
                return Err(ctx.unsupported("a weight that is not 2-d"));
            }
            (ctx.tensor("input")?, transpose_last(&w))
        }
        "dot" => (ctx.tensor("self")?, ctx.tensor("tensor")?),
        "mv" => (ctx.tensor("self")?, ctx.tensor("vec")?),
        _ => (ctx.tensor("self")?, ctx.tensor("other")?),
    };
    // 1-d operands become matrices, as torch.matmul does, and the added dims go again.
    let a2 = if a.shape.len() == 1 {
        with_shape(&a, vec![1, a.shape[0]])
    } else {
        a.clone()
    };
    let b2 = if b.shape.len() == 1 {
        with_shape(&b, vec![b.shape[0], 1])
    } else {
        b.clone()
    };
    let product = batched_matmul(ctx.arena, &a2, &b2)?;
    let mut product = with_shape(&product, meta.shape.clone());
    if product.numel() != meta.numel() {
        return Err(ctx.unsupported("the product's size differs from the inferred shape"));
    }
    product.dtype = meta.dtype;
    if matches!(name.as_str(), "addmm" | "baddbmm") {
        let bias = ctx.operand("self", None)?;
        let beta = ctx.scalar("beta", 1.0)?;
        let alpha = ctx.scalar("alpha", 1.0)?;
        let p = Operand::Tensor(product);
        return Ok(vec![map_elementwise(ctx, &[bias, p], &mut |ar, v| {
            let x = ar.mul(beta, v[0])?;
            let y = ar.mul(alpha, v[1])?;
            ar.add(x, y)
        })?]);
    }
    if name == "linear" {
        if let Some(bias) = ctx.opt_tensor("bias")? {
            let ops = [Operand::Tensor(product), Operand::Tensor(bias)];
            return Ok(vec![map_elementwise(ctx, &ops, &mut |ar, v| {
                ar.add(v[0], v[1])
            })?]);
        }
    }
    Ok(vec![product])
}

/// Groups of elements along `dim`: per group, the flat indices in order.
fn lanes(shape: &[usize], dim: usize) -> Vec<Vec<usize>> {
    let st = strides(shape);
    let total: usize = shape.iter().product();
    let len = shape[dim];
    let mut out = Vec::new();
    for flat in 0..total {
        if (flat / st[dim]).is_multiple_of(len) {
            out.push((0..len).map(|k| flat + k * st[dim]).collect());
        }
    }
    out
}

/// softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x); log_softmax likewise.
pub(crate) fn softmax(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let log = ctx.def.name.name.contains("log");
    let x = ctx.tensor("self")?;
    let dim = norm_dim(ctx.int("dim")?, x.shape.len())
        .ok_or_else(|| ctx.unsupported("dim out of range"))?;
    let meta = ctx.out_meta(0)?;
    let mut out = vec![ExprId(0); x.numel()];
    if x.shape.is_empty() {
        let v = if log {
            ctx.arena.int(0)?
        } else {
            ctx.arena.int(1)?
        };
        return Ok(vec![SymTensor::new(meta.dtype, vec![], vec![v])]);
    }
    for lane in lanes(&x.shape, dim) {
        let xs: Vec<ExprId> = lane.iter().map(|&i| x.elems[i]).collect();
        let ar = &mut *ctx.arena;
        let m = ar.app(Func::Max, xs.clone())?;
        let mut shifted = Vec::with_capacity(xs.len());
        let mut exps = Vec::with_capacity(xs.len());
        for &v in &xs {
            let d = ar.sub(v, m)?;
            exps.push(ar.app(Func::Exp, vec![d])?);
            shifted.push(d);
        }
        let s = ar.sum(&exps)?;
        if log {
            let ls = ar.app(Func::Log, vec![s])?;
            for (k, &i) in lane.iter().enumerate() {
                out[i] = ar.sub(shifted[k], ls)?;
            }
        } else {
            let inv = ar.recip(s)?;
            for (k, &i) in lane.iter().enumerate() {
                out[i] = ar.mul(exps[k], inv)?;
            }
        }
    }
    Ok(vec![SymTensor::new(meta.dtype, x.shape.clone(), out)])
}

/// softmax: g_in = y * (g - sum(g * y)); log_softmax: g_in = g - exp(y) * sum(g).
pub(crate) fn softmax_backward(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let log = ctx.def.name.name.contains("log");
    let g = ctx.tensor("grad_output")?;
    let y = ctx.tensor("output")?;
    let dim = norm_dim(ctx.int("dim")?, y.shape.len())
        .ok_or_else(|| ctx.unsupported("dim out of range"))?;
    let meta = ctx.out_meta(0)?;
    let mut out = vec![ExprId(0); y.numel()];
    for lane in lanes(&y.shape, dim) {
        let ar = &mut *ctx.arena;
        if log {
            let gs: Vec<ExprId> = lane.iter().map(|&i| g.elems[i]).collect();
            // A one-hot's selectors over every class sum to 1 (`Arena::fold_selector_sums`):
            // folded, the vocab-parallel cross-entropy backward is the spec's in normal form.
            let s = ar.sum(&gs)?;
            let s = ar.fold_selector_sums(s)?;
            for &i in &lane {
                let e = ar.app(Func::Exp, vec![y.elems[i]])?;
                let p = ar.mul(e, s)?;
                out[i] = ar.sub(g.elems[i], p)?;
            }
        } else {
            let mut prods = Vec::with_capacity(lane.len());
            for &i in &lane {
                prods.push(ar.mul(g.elems[i], y.elems[i])?);
            }
            let s = ar.sum(&prods)?;
            for &i in &lane {
                let d = ar.sub(g.elems[i], s)?;
                out[i] = ar.mul(y.elems[i], d)?;
            }
        }
    }
    Ok(vec![SymTensor::new(meta.dtype, y.shape.clone(), out)])
}

/// Rows of the normalized trailing dims: (rows, row length).
fn norm_rows(ctx: &NodeCtx, x: &SymTensor) -> Result<(usize, usize), ExecError> {
    let ns = ctx
        .opt_int_list("normalized_shape")?
        .ok_or_else(|| ctx.unsupported("no normalized_shape"))?;
    let k = ns.len();
    if k > x.shape.len() {
        return Err(ctx.unsupported("normalized_shape longer than the input's shape"));
    }
    let n: usize = x.shape[x.shape.len() - k..].iter().product();
    Ok((x.numel() / n.max(1), n))
}

fn scale_by(ar: &mut Arena, e: ExprId, n: usize) -> Built {
    ar.scale(e, &Coeff::new(1, n.max(1) as i64))
}

/// layer_norm: (x - mean) * rsqrt(var + eps) * w + b; native_layer_norm also returns mean
/// and rstd.
pub(crate) fn layer_norm(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let native = ctx.def.name.name.starts_with("native");
    let x = ctx.tensor("input")?;
    let (rows, n) = norm_rows(ctx, &x)?;
    let w = ctx.opt_tensor("weight")?;
    let b = ctx.opt_tensor("bias")?;
    let eps = ctx.scalar("eps", 1e-5)?;
    let meta = ctx.out_meta(0)?;
    let ar = &mut *ctx.arena;
    let mut out = Vec::with_capacity(x.numel());
    let (mut means, mut rstds) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let row = &x.elems[r * n..(r + 1) * n];
        let s = ar.sum(row)?;
        let mean = scale_by(ar, s, n)?;
        let mut sq = Vec::with_capacity(n);
        let mut centered = Vec::with_capacity(n);
        for &v in row {
            let d = ar.sub(v, mean)?;
            sq.push(ar.mul(d, d)?);
            centered.push(d);
        }
        let ss = ar.sum(&sq)?;
        let var = scale_by(ar, ss, n)?;
        let ve = ar.add(var, eps)?;
        let sd = ar.app(Func::Sqrt, vec![ve])?;
        let rstd = ar.recip(sd)?;
        for (j, &d) in centered.iter().enumerate() {
            let mut y = ar.mul(d, rstd)?;
            if let Some(w) = &w {
                y = ar.mul(y, w.elems[j])?;
            }
            if let Some(b) = &b {
                y = ar.add(y, b.elems[j])?;
            }
            out.push(y);
        }
        means.push(mean);
        rstds.push(rstd);
    }
    let y = SymTensor::new(meta.dtype, x.shape.clone(), out);
    if !native {
        return Ok(vec![y]);
    }
    let stat = ctx.out_meta(1)?;
    Ok(vec![
        y,
        SymTensor::new(stat.dtype, stat.shape.clone(), means),
        SymTensor::new(stat.dtype, stat.shape, rstds),
    ])
}

/// native_layer_norm_backward, as the registry's kernel: with `x̂ = (x - mean) * rstd` and
/// `ĝ = g * w` per row, `dx = rstd / n * (n * ĝ - Σ ĝ - x̂ * Σ ĝ x̂)`, `dw = Σ_rows g x̂`,
/// `db = Σ_rows g` (every output produced, whatever the mask, as the kernel does).
pub(crate) fn layer_norm_backward(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let g = ctx.tensor("grad_out")?;
    let x = ctx.tensor("input")?;
    let (rows, n) = norm_rows(ctx, &x)?;
    let mean = ctx.tensor("mean")?;
    let rstd = ctx.tensor("rstd")?;
    if mean.numel() != rows || rstd.numel() != rows || g.numel() != x.numel() {
        return Err(ctx.unsupported("statistics or gradient of the wrong size"));
    }
    let w = ctx.opt_tensor("weight")?;
    let metas = [ctx.out_meta(0)?, ctx.out_meta(1)?, ctx.out_meta(2)?];
    let ar = &mut *ctx.arena;
    let nn = ar.int(n as i64)?;
    let mut dx = Vec::with_capacity(x.numel());
    let mut dw_terms: Vec<Vec<ExprId>> = vec![Vec::with_capacity(rows); n];
    let mut db_terms: Vec<Vec<ExprId>> = vec![Vec::with_capacity(rows); n];
    for r in 0..rows {
        let (m, rs) = (mean.elems[r], rstd.elems[r]);
        let mut xh = Vec::with_capacity(n);
        let mut gh = Vec::with_capacity(n);
        for j in 0..n {
            let d = ar.sub(x.elems[r * n + j], m)?;
            xh.push(ar.mul(d, rs)?);
            let gj = g.elems[r * n + j];
            gh.push(match &w {
                Some(w) => ar.mul(gj, w.elems[j])?,
                None => gj,
            });
            dw_terms[j].push(ar.mul(gj, xh[j])?);
            db_terms[j].push(gj);
        }
        let s1 = ar.sum(&gh)?;
        let prods = (0..n)
            .map(|j| ar.mul(gh[j], xh[j]))
            .collect::<Result<Vec<_>, _>>()?;
        let s2 = ar.sum(&prods)?;
        let k = scale_by(ar, rs, n)?;
        for j in 0..n {
            let a = ar.mul(nn, gh[j])?;
            let b = ar.sub(a, s1)?;
            let c = ar.mul(xh[j], s2)?;
            let inner = ar.sub(b, c)?;
            dx.push(ar.mul(k, inner)?);
        }
    }
    let dw = dw_terms
        .iter()
        .map(|t| ar.sum(t))
        .collect::<Result<Vec<_>, _>>()?;
    let db = db_terms
        .iter()
        .map(|t| ar.sum(t))
        .collect::<Result<Vec<_>, _>>()?;
    let [m0, m1, m2] = metas;
    Ok(vec![
        SymTensor::new(m0.dtype, x.shape.clone(), dx),
        SymTensor::new(m1.dtype, m1.shape, dw),
        SymTensor::new(m2.dtype, m2.shape, db),
    ])
}

/// rms_norm: x * rsqrt(mean(x^2) + eps) * w (eps defaults to the machine epsilon, as the
/// kernel's).
pub(crate) fn rms_norm(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let fused = ctx.def.name.name.starts_with('_');
    let x = ctx.tensor("input")?;
    let (rows, n) = norm_rows(ctx, &x)?;
    let w = ctx.opt_tensor("weight")?;
    let default_eps = if x.dtype == shardproof_ir::DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    };
    let eps = ctx.opt_float("eps").unwrap_or(default_eps);
    let eps = ctx.arena.float(eps)?;
    let meta = ctx.out_meta(0)?;
    let ar = &mut *ctx.arena;
    let mut out = Vec::with_capacity(x.numel());
    let mut rstds = Vec::new();
    for r in 0..rows {
        let row = &x.elems[r * n..(r + 1) * n];
        let mut sq = Vec::with_capacity(n);
        for &v in row {
            sq.push(ar.mul(v, v)?);
        }
        let ss = ar.sum(&sq)?;
        let ms = scale_by(ar, ss, n)?;
        let me = ar.add(ms, eps)?;
        let sd = ar.app(Func::Sqrt, vec![me])?;
        let rstd = ar.recip(sd)?;
        for (j, &v) in row.iter().enumerate() {
            let mut y = ar.mul(v, rstd)?;
            if let Some(w) = &w {
                y = ar.mul(y, w.elems[j])?;
            }
            out.push(y);
        }
        rstds.push(rstd);
    }
    let y = SymTensor::new(meta.dtype, x.shape.clone(), out);
    if !fused {
        return Ok(vec![y]);
    }
    let stat = ctx.out_meta(1)?;
    Ok(vec![y, SymTensor::new(stat.dtype, stat.shape, rstds)])
}

/// The loss's reduction: 0 none, 1 mean, 2 sum.
fn reduction_of(ctx: &NodeCtx) -> Result<i64, ExecError> {
    Ok(ctx.opt_int("reduction")?.unwrap_or(1))
}

/// (samples, classes) of an nll input of shape [N, C] or [C].
fn nll_dims(x: &SymTensor) -> (usize, usize) {
    match x.shape.as_slice() {
        [c] => (1, *c),
        [n, c, ..] => (*n, *c),
        _ => (1, 1),
    }
}

/// Per sample and class, the one-hot weight of class c for target t: [t == c] (a symbolic
/// target selects its class through an equality test, so no index needs to be concrete);
/// and per sample, whether it counts (t != ignore_index) times its class weight.
fn nll_selectors(
    ctx: &mut NodeCtx,
    x: &SymTensor,
) -> Result<(Vec<Vec<ExprId>>, Vec<ExprId>), ExecError> {
    let t = ctx.tensor("target")?;
    let w = ctx.opt_tensor("weight")?;
    let ignore = ctx.int("ignore_index")?;
    let (n, c) = nll_dims(x);
    if x.shape.len() > 2 {
        return Err(ctx.unsupported("nll_loss over more than 2 dims has no symbolic rule"));
    }
    let ar = &mut *ctx.arena;
    let ig = ar.int(ignore)?;
    let mut onehot = Vec::with_capacity(n);
    let mut weight = Vec::with_capacity(n);
    for i in 0..n {
        let keep = nll_keep(ar, t.elems[i], ig)?;
        let (row, total) = onehot_row(ar, t.elems[i], keep, w.as_ref(), c)?;
        weight.push(total);
        onehot.push(row);
    }
    Ok((onehot, weight))
}

/// Whether a sample with target `t` counts: `t != ignore_index` (folded to 1 when the
/// target's range excludes ignore_index).
fn nll_keep(ar: &mut Arena, t: ExprId, ignore: ExprId) -> Built {
    let is_ignored = ar.eq(t, ignore)?;
    ar.not(is_ignored)
}

/// One sample's one-hot selectors over `c` classes (each `[t == k]`, times the class weight,
/// times `keep`) and its counted weight (`keep` times the target's class weight).
fn onehot_row(
    ar: &mut Arena,
    t: ExprId,
    keep: ExprId,
    w: Option<&SymTensor>,
    c: usize,
) -> Result<(Vec<ExprId>, ExprId), ExecError> {
    let mut row = Vec::with_capacity(c);
    let mut wsum = Vec::with_capacity(c);
    for k in 0..c {
        let kc = ar.int(k as i64)?;
        let hit = ar.eq(t, kc)?;
        let sel = match w {
            Some(w) => ar.mul(hit, w.elems[k])?,
            None => hit,
        };
        wsum.push(sel);
        row.push(sel);
    }
    // An ignored target selects no class: its class weight sums to 0 when ignore_index is
    // outside [0, C), and is masked out otherwise (the equality folds to 0 when the
    // target's range excludes ignore_index).
    for sel in row.iter_mut() {
        *sel = ar.mul(*sel, keep)?;
    }
    // A target ranging within [0, C) selects exactly one class: the selectors sum to
    // that class's weight (1 without weights), not to a sum of equality atoms.
    let total = match ar.index_bound(t) {
        Some(b) if (b as usize) <= c => match w {
            None => ar.int(1)?,
            Some(w) => {
                let mut args = vec![t];
                args.extend(w.elems.iter().copied());
                ar.app(Func::Lookup, args)?
            }
        },
        _ => ar.sum(&wsum)?,
    };
    Ok((row, ar.mul(total, keep)?))
}

/// Whether target `t` is provably one of the classes `[0, c)` for every valid input: a
/// constant among them, or a label whose range the classes cover (a label ranges over the
/// smallest size it indexes, `shardproof_interp::index_bound_known`).
fn target_in_range(ar: &Arena, t: ExprId, c: usize) -> bool {
    match ar.as_const(t) {
        Some(k) => k.to_usize().is_some_and(|k| k < c),
        None => ar.index_bound(t).is_some_and(|b| (b as usize) <= c),
    }
}

/// nll_loss_forward: per sample -w[t] x[t]; mean divides by the total weight. A target
/// provably within the classes reads its entry by one lookup (`lookup(t, w_k·x_k)`, the terms
/// the row shares outside it: [`Arena::lookup_in_range`]): O(1) atoms per sample however many
/// classes, where the one-hot `Σ_k [t == k]·w_k·x_k` holds one selector per class; any other
/// target selects by the one-hot.
pub(crate) fn nll_loss_forward(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let x = ctx.tensor("self")?;
    let red = reduction_of(ctx)?;
    let t = ctx.tensor("target")?;
    let w = ctx.opt_tensor("weight")?;
    let ignore = ctx.int("ignore_index")?;
    if x.shape.len() > 2 {
        return Err(ctx.unsupported("nll_loss over more than 2 dims has no symbolic rule"));
    }
    let (n, c) = nll_dims(&x);
    let m0 = ctx.out_meta(0)?;
    let m1 = ctx.out_meta(1)?;
    let ar = &mut *ctx.arena;
    let ig = ar.int(ignore)?;
    let mut terms = Vec::with_capacity(n);
    let mut weight = Vec::with_capacity(n);
    for i in 0..n {
        let ti = t.elems[i];
        let keep = nll_keep(ar, ti, ig)?;
        let x_row = &x.elems[i * c..(i + 1) * c];
        let (picked, total) = if target_in_range(ar, ti, c) {
            let row = match &w {
                Some(w) => (0..c)
                    .map(|k| ar.mul(w.elems[k], x_row[k]))
                    .collect::<Result<Vec<_>, _>>()?,
                None => x_row.to_vec(),
            };
            let picked = ar.lookup_in_range(ti, &row)?;
            let class_weight = match &w {
                Some(w) => ar.lookup_in_range(ti, &w.elems)?,
                None => ar.int(1)?,
            };
            let picked = ar.mul(picked, keep)?;
            (picked, ar.mul(class_weight, keep)?)
        } else {
            let (row, total) = onehot_row(ar, ti, keep, w.as_ref(), c)?;
            let mut selected = Vec::with_capacity(c);
            for (k, &sel) in row.iter().enumerate() {
                selected.push(ar.mul(sel, x_row[k])?);
            }
            (ar.sum(&selected)?, total)
        };
        terms.push(ar.neg(picked)?);
        weight.push(total);
    }
    let total = ar.sum(&weight)?;
    if red == 0 && x.shape.len() == 2 {
        let zero = ar.int(0)?;
        return Ok(vec![
            SymTensor::new(m0.dtype, m0.shape, terms),
            SymTensor::new(m1.dtype, m1.shape, vec![zero]),
        ]);
    }
    let sum = ar.sum(&terms)?;
    let out = if red == 1 { ar.div(sum, total)? } else { sum };
    Ok(vec![
        SymTensor::new(m0.dtype, m0.shape, vec![out]),
        SymTensor::new(m1.dtype, m1.shape, vec![total]),
    ])
}

/// nll_loss_backward: -w[t] g (divided by the total weight for mean) at the target's class.
pub(crate) fn nll_loss_backward(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let x = ctx.tensor("self")?;
    let g = ctx.tensor("grad_output")?;
    let tw = ctx.tensor("total_weight")?;
    let red = reduction_of(ctx)?;
    let (onehot, _) = nll_selectors(ctx, &x)?;
    let (n, c) = nll_dims(&x);
    let meta = ctx.out_meta(0)?;
    let ar = &mut *ctx.arena;
    let mut out = Vec::with_capacity(n * c);
    for (i, row) in onehot.iter().enumerate() {
        let gi = match red {
            0 if x.shape.len() == 2 => g.elems[i],
            1 => ar.div(g.elems[0], tw.elems[0])?,
            _ => g.elems[0],
        };
        let ng = ar.neg(gi)?;
        for &sel in row {
            out.push(ar.mul(sel, ng)?);
        }
    }
    Ok(vec![SymTensor::new(meta.dtype, meta.shape, out)])
}

/// mse_loss: (x - y)^2, reduced by mean, sum or not at all.
pub(crate) fn mse_loss(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let x = ctx.operand("self", None)?;
    let y = ctx.operand("target", None)?;
    let red = reduction_of(ctx)?;
    if red == 0 {
        return Ok(vec![map_elementwise(ctx, &[x, y], &mut |ar, v| {
            let d = ar.sub(v[0], v[1])?;
            ar.mul(d, d)
        })?]);
    }
    let (Operand::Tensor(xt), Operand::Tensor(yt)) = (&x, &y) else {
        return Err(ctx.unsupported("scalar operands"));
    };
    if xt.shape != yt.shape {
        return Err(ctx.unsupported("broadcast operands of a reduced mse_loss"));
    }
    let ar = &mut *ctx.arena;
    let mut sq = Vec::with_capacity(xt.numel());
    for (a, b) in xt.elems.iter().zip(yt.elems.iter()) {
        let d = ar.sub(*a, *b)?;
        sq.push(ar.mul(d, d)?);
    }
    let s = ar.sum(&sq)?;
    let v = if red == 1 {
        scale_by(ar, s, sq.len())?
    } else {
        s
    };
    let meta = ctx.out_meta(0)?;
    let _ = reduce_by;
    Ok(vec![SymTensor::new(meta.dtype, meta.shape, vec![v])])
}

/// Whether tensor argument `name` has constant elements only.
pub(crate) fn constant_arg(ctx: &NodeCtx, name: &str) -> Result<bool, ExecError> {
    Ok(match ctx.opt_tensor(name)? {
        Some(t) => super::constant_values(ctx.arena, &t).is_some(),
        None => true,
    })
}

/// Refuses `kernel`'s indices unless each is shown within its `rows` (a rank's mask one row
/// long, a clamp one row past, or an integer of unknown range may be one the kernel fails on,
/// where the symbolic rule would silently drop or mask it).
fn indices_within_rows(
    ctx: &NodeCtx,
    idx: &SymTensor,
    rows: usize,
    kernel: &str,
) -> Result<(), ExecError> {
    if idx
        .elems
        .iter()
        .all(|&i| super::range::within(ctx.arena, i, rows))
    {
        return Ok(());
    }
    Err(ctx.unsupported(format!(
        "{kernel} indices that may fall outside its {rows} rows, where the kernel fails"
    )))
}

/// embedding(weight, indices) at symbolic indices: out[p, d] = lookup(indices[p], weight[:, d]).
pub(crate) fn embedding(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let w = ctx.tensor("weight")?;
    let idx = ctx.tensor("indices")?;
    if w.shape.len() != 2 {
        return Err(ctx.unsupported("a weight that is not 2-d"));
    }
    let (v, d) = (w.shape[0], w.shape[1]);
    // The lookup outside the table would be an opaque value a mask on the output may then
    // drop (a rank that masks its output but not its index).
    indices_within_rows(ctx, &idx, v, "embedding")?;
    let meta = ctx.out_meta(0)?;
    let columns: Vec<Vec<ExprId>> = (0..d)
        .map(|j| (0..v).map(|i| w.elems[i * d + j]).collect())
        .collect();
    let mut out = Vec::with_capacity(idx.numel() * d);
    for &i in idx.elems.iter() {
        for col in &columns {
            let mut args = Vec::with_capacity(v + 1);
            args.push(i);
            args.extend_from_slice(col);
            out.push(ctx.arena.app(Func::Lookup, args)?);
        }
    }
    Ok(vec![SymTensor::new(meta.dtype, meta.shape, out)])
}

/// embedding_dense_backward: grad_weight[v, d] = sum over positions p with indices[p] == v
/// (and != padding_idx) of grad[p, d]; the test is an equality atom, so symbolic indices need
/// no case split (constant ones fold it to 0 or 1).
pub(crate) fn embedding_backward(ctx: &mut NodeCtx) -> Result<Vec<SymTensor>, ExecError> {
    let g = ctx.tensor("grad_output")?;
    let idx = ctx.tensor("indices")?;
    if ctx.bool_or("scale_grad_by_freq", false)? {
        return Err(ctx.unsupported("scale_grad_by_freq has no symbolic rule"));
    }
    let padding = ctx.opt_int("padding_idx")?.unwrap_or(-1);
    let meta = ctx.out_meta(0)?;
    if meta.shape.len() != 2 || g.numel() != idx.numel() * meta.shape[1] {
        return Err(ctx.unsupported(format!(
            "embedding_dense_backward of a {:?} gradient for {} indices into {:?}",
            g.shape,
            idx.numel(),
            meta.shape
        )));
    }
    let (v, d) = (meta.shape[0], meta.shape[1]);
    // The rows' equality tests would just drop an index past them.
    indices_within_rows(ctx, &idx, v, "embedding_dense_backward")?;
    let n = idx.numel();
    let ar = &mut *ctx.arena;
    let pad = ar.int(padding)?;
    // Per position and row: whether the position's index is that row.
    let mut hits = Vec::with_capacity(n);
    for &i in idx.elems.iter() {
        let not_pad = {
            let is_pad = ar.eq(i, pad)?;
            ar.not(is_pad)?
        };
        let mut row = Vec::with_capacity(v);
        for r in 0..v {
            let rc = ar.int(r as i64)?;
            let hit = ar.eq(i, rc)?;
            row.push(ar.mul(hit, not_pad)?);
        }
        hits.push(row);
    }
    let mut out = Vec::with_capacity(v * d);
    let mut terms = Vec::with_capacity(n);
    for r in 0..v {
        for j in 0..d {
            terms.clear();
            for (p, row) in hits.iter().enumerate() {
                terms.push(ar.mul(row[r], g.elems[p * d + j])?);
            }
            out.push(ar.sum(&terms)?);
        }
    }
    Ok(vec![SymTensor::new(meta.dtype, meta.shape, out)])
}
