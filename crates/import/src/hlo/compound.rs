//! HLO instructions whose lowering is more than one operator or needs the layout: `bitcast`
//! (a reshape or transpose by the operand and result layouts), `reduce` (its region's binary
//! operator over the reduced dims), `dot` (contracting and batch dims to a `bmm`), and the
//! permutation and slice attributes they and `transpose`/`slice` read.

use super::lit::{Lit, LitData};
use super::lower::{elem_dtype, Lowerer, Val};
use super::ops::{arity, attr_ints, ints, is_float, is_int, l_id, region_op};
use super::parse::{perr, Instr, PErr, Shape};
use shardproof_ir::Arg;
use std::rc::Rc;

type R<T> = Result<T, PErr>;

pub(super) fn valid_perm(perm: &[i64], n: usize) -> bool {
    let mut seen = vec![false; n];
    perm.len() == n
        && perm.iter().all(|&p| {
            usize::try_from(p)
                .ok()
                .and_then(|p| seen.get_mut(p))
                .is_some_and(|s| !std::mem::replace(s, true))
        })
}

/// `{[0:4], [0:16:1]}` -> (start, limit, stride) per dim.
pub(super) fn slice_spec(a: &super::parse::Attr, line: usize) -> R<Vec<(i64, i64, i64)>> {
    let bad = |col| {
        perr(
            line,
            col,
            "cannot read the slice",
            "a slice reads `slice={[start:limit], [start:limit:stride], ...}`",
        )
    };
    let t = &a.toks;
    let mut out = Vec::new();
    let mut i = 1;
    if !t.first().is_some_and(|x| x.is_punct("{")) {
        return Err(bad(a.col));
    }
    let num = |i: usize| {
        t.get(i)
            .and_then(|x| x.word())
            .and_then(|w| w.parse::<i64>().ok())
    };
    while i < t.len() {
        if t[i].is_punct("}") {
            return Ok(out);
        }
        if t[i].is_punct(",") {
            i += 1;
            continue;
        }
        if !t[i].is_punct("[") {
            return Err(bad(t[i].col));
        }
        let s = num(i + 1).ok_or_else(|| bad(t[i].col))?;
        if !t.get(i + 2).is_some_and(|x| x.is_punct(":")) {
            return Err(bad(t[i].col));
        }
        let e = num(i + 3).ok_or_else(|| bad(t[i].col))?;
        let (step, next) = if t.get(i + 4).is_some_and(|x| x.is_punct(":")) {
            (num(i + 5).ok_or_else(|| bad(t[i].col))?, i + 6)
        } else {
            (1, i + 4)
        };
        if !t.get(next).is_some_and(|x| x.is_punct("]")) || step < 1 || s < 0 || e < s {
            return Err(bad(t[i].col));
        }
        out.push((s, e, step));
        i = next + 1;
    }
    Err(bad(a.col))
}

/// `bitcast`: a reshape of the values in their physical (layout) order.
pub(super) fn bitcast(l: &mut Lowerer, ins: &Instr, x: &Val, elem: &str, dims: &[i64]) -> R<Val> {
    let out_layout = match &ins.shape {
        Shape::Array { layout, .. } => layout.clone(),
        _ => None,
    };
    if let Some(lit) = Lowerer::lit(x) {
        let default = out_layout.as_ref().is_none_or(|lay| is_default_layout(lay));
        if default && lit.elem == elem {
            if let Some(r) = lit.reshape(dims) {
                return Ok(Val::Lit(Rc::new(r)));
            }
        }
    }
    let (id, e, from) = l.value(ins, x)?;
    if e != elem || from.iter().product::<i64>() != dims.iter().product::<i64>() {
        return l.opaque(ins, std::slice::from_ref(x));
    }
    // The operand's layout is the one its producer printed; values we create have the default.
    let in_layout = operand_layout(l, ins);
    let major = |lay: &Option<Vec<i64>>, n: usize| -> Option<Vec<i64>> {
        match lay {
            None => Some((0..n as i64).collect()),
            Some(m2m) if valid_perm(m2m, n) => Some(m2m.iter().rev().copied().collect()),
            Some(_) => None,
        }
    };
    let (Some(pin), Some(pout)) = (
        major(&in_layout, from.len()),
        major(&out_layout, dims.len()),
    ) else {
        return l.opaque(ins, std::slice::from_ref(x));
    };
    // logical -> physical (operand), reshape, physical -> logical (result).
    let (a, phys_in) = l.permute(ins, "phys", id, &e, &from, &pin);
    let phys_out: Vec<i64> = pout.iter().map(|&p| dims[p as usize]).collect();
    let b = l.reshape_to(ins, "reshape", a, &e, &phys_in, &phys_out);
    let mut inv = vec![0i64; pout.len()];
    for (k, &p) in pout.iter().enumerate() {
        inv[p as usize] = k as i64;
    }
    let (c, _) = l.permute(ins, "", b, &e, &phys_out, &inv);
    if c == id {
        return Ok(x.clone());
    }
    Ok(Val::Ir(c, elem.to_string(), dims.to_vec()))
}

fn is_default_layout(lay: &[i64]) -> bool {
    lay.iter().rev().enumerate().all(|(i, &d)| d == i as i64)
}

/// The layout the bitcast's operand was printed with (its producer's shape).
fn operand_layout(l: &Lowerer, ins: &Instr) -> Option<Vec<i64>> {
    let name = ins.operands.first()?;
    for c in &l.m.computations {
        for i in &c.instrs {
            if &i.name == name {
                if let Shape::Array { layout, .. } = &i.shape {
                    return layout.clone();
                }
            }
        }
    }
    None
}

pub(super) fn reduce(
    l: &mut Lowerer,
    ins: &Instr,
    ops: &[Val],
    elem: &str,
    dims: &[i64],
) -> R<Val> {
    if ops.len() != 2 {
        return l.opaque(ins, ops);
    }
    let comp = l.computation(ins, "to_apply")?;
    let Some(rop) = region_op(comp) else {
        return l.opaque(ins, ops);
    };
    let rd = attr_ints(ins, "dimensions")?.unwrap_or_default();
    let Some(init) = Lowerer::lit(&ops[1]).and_then(|x| x.uniform()) else {
        return l.opaque(ins, ops);
    };
    let Some(dt) = elem_dtype(elem) else {
        return l.opaque(ins, ops);
    };
    let (aten, identity): (&str, f64) = match (rop, elem) {
        ("add", e) if e != "pred" => ("aten.sum.dim_IntList", 0.0),
        ("maximum", e) if is_float(e) => ("aten.amax.default", f64::NEG_INFINITY),
        ("minimum", e) if is_float(e) => ("aten.amin.default", f64::INFINITY),
        ("maximum", e) if is_int(e) => ("aten.amax.default", f64::NAN),
        ("minimum", e) if is_int(e) => ("aten.amin.default", f64::NAN),
        ("and", "pred") => ("aten.all.dims", 1.0),
        ("or", "pred") => ("aten.any.dims", 0.0),
        _ => return l.opaque(ins, ops),
    };
    if rd.is_empty() {
        return l.opaque(ins, ops);
    }
    let (x, _, _) = l.value(ins, &ops[0])?;
    let mut kwargs = Vec::new();
    let mut args = vec![Arg::Value(x), ints(&rd)];
    if aten == "aten.sum.dim_IntList" {
        args.push(Arg::Bool(false));
        if is_int(elem) {
            kwargs.push(("dtype".to_string(), Arg::Dtype(dt)));
        }
    }
    let combine = init.to_bits() != identity.to_bits() && !(init == 0.0 && identity == 0.0);
    let r = l.call(
        ins,
        if combine { "reduce" } else { "" },
        aten,
        args,
        kwargs,
        elem,
        dims,
    );
    if !combine {
        return Ok(r);
    }
    // A non-identity initial value joins the reduction once.
    let ctor = match rop {
        "add" => "add",
        "maximum" => "maximum",
        "minimum" => "minimum",
        "and" => "and",
        _ => "or",
    };
    let init_lit = Val::Lit(Rc::new(Lit {
        elem: elem.to_string(),
        dims: vec![],
        data: LitData::Uniform(init),
    }));
    let _ = ctor;
    let mut fake = ins.clone();
    fake.opcode = rop.to_string();
    l.binary(&fake, &r, &init_lit)
}

pub(super) fn dot(l: &mut Lowerer, ins: &Instr, ops: &[Val], elem: &str, out: &[i64]) -> R<Val> {
    arity(ins, ops, 2)?;
    let lb = attr_ints(ins, "lhs_batch_dims")?.unwrap_or_default();
    let rb = attr_ints(ins, "rhs_batch_dims")?.unwrap_or_default();
    let lc = attr_ints(ins, "lhs_contracting_dims")?.unwrap_or_default();
    let rc = attr_ints(ins, "rhs_contracting_dims")?.unwrap_or_default();
    let (mut x, xe, xd) = l.value(ins, &ops[0])?;
    let (mut y, ye, yd) = l.value(ins, &ops[1])?;
    let in_range = |v: &[i64], n: usize| v.iter().all(|&d| d >= 0 && (d as usize) < n);
    if lb.len() != rb.len()
        || lc.len() != rc.len()
        || !in_range(&lb, xd.len())
        || !in_range(&lc, xd.len())
        || !in_range(&rb, yd.len())
        || !in_range(&rc, yd.len())
    {
        return Err(perr(
            ins.line,
            ins.col,
            "dot dimension numbers do not fit the operands",
            "batch and contracting dims pair up and lie within each operand's rank",
        ));
    }
    let Some(dt) = elem_dtype(elem) else {
        return l.opaque(ins, ops);
    };
    // Operands of another element type than the result are converted first (exact for the
    // bf16 -> f32 products XLA emits with a preferred element type).
    if xe != elem {
        x = l_id(&l.call(
            ins,
            "lhs_cast",
            "aten._to_copy.default",
            vec![Arg::Value(x)],
            vec![("dtype".into(), Arg::Dtype(dt))],
            elem,
            &xd,
        ));
    }
    if ye != elem {
        y = l_id(&l.call(
            ins,
            "rhs_cast",
            "aten._to_copy.default",
            vec![Arg::Value(y)],
            vec![("dtype".into(), Arg::Dtype(dt))],
            elem,
            &yd,
        ));
    }
    let free = |n: usize, a: &[i64], b: &[i64]| -> Vec<i64> {
        (0..n as i64)
            .filter(|d| !a.contains(d) && !b.contains(d))
            .collect()
    };
    let lf = free(xd.len(), &lb, &lc);
    let rf = free(yd.len(), &rb, &rc);
    let size = |d: &[i64], v: &[i64]| -> i64 { v.iter().map(|&i| d[i as usize]).product() };
    let bsz: Vec<i64> = lb.iter().map(|&i| xd[i as usize]).collect();
    let (m, k, n) = (size(&xd, &lf), size(&xd, &lc), size(&yd, &rf));
    if size(&yd, &rc) != k || rb.iter().map(|&i| yd[i as usize]).collect::<Vec<_>>() != bsz {
        return Err(perr(
            ins.line,
            ins.col,
            "dot operands disagree on contracting or batch sizes",
            "paired dims must have equal sizes",
        ));
    }
    let lperm: Vec<i64> = lb.iter().chain(&lf).chain(&lc).copied().collect();
    let rperm: Vec<i64> = rb.iter().chain(&rc).chain(&rf).copied().collect();
    let (x, xp) = l.permute(ins, "lhs", x, elem, &xd, &lperm);
    let (y, yp) = l.permute(ins, "rhs", y, elem, &yd, &rperm);
    let lshape: Vec<i64> = bsz.iter().copied().chain([m, k]).collect();
    let rshape: Vec<i64> = bsz.iter().copied().chain([k, n]).collect();
    let x = l.reshape_to(ins, "lhs_view", x, elem, &xp, &lshape);
    let y = l.reshape_to(ins, "rhs_view", y, elem, &yp, &rshape);
    let mshape: Vec<i64> = bsz.iter().copied().chain([m, n]).collect();
    let op = match bsz.len() {
        0 => "aten.mm.default",
        1 => "aten.bmm.default",
        _ => "aten.matmul.default",
    };
    let sfx = if mshape == out { "" } else { "mm" };
    let r = l.call(
        ins,
        sfx,
        op,
        vec![Arg::Value(x), Arg::Value(y)],
        vec![],
        elem,
        &mshape,
    );
    if mshape == out {
        return Ok(r);
    }
    let id = l_id(&r);
    Ok(Val::Ir(
        l.reshape_to(ins, "", id, elem, &mshape, out),
        elem.to_string(),
        out.to_vec(),
    ))
}
