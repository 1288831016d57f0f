//! One HLO instruction to the registry's operators (the table in `docs/formats/hlo.md`).

use super::collective::{collective, collective_permute};
use super::compound::{bitcast, dot, reduce, slice_spec, valid_perm};
use super::lit::{parse_literal, wrap_int, Lit, LitData};
use super::lower::{elem_dtype, int_list, Lowerer, Val};
use super::parse::{perr, Computation, Instr, PErr, Shape};
use shardproof_ir::{Arg, ValueId};
use std::rc::Rc;

type R<T> = Result<T, PErr>;

pub(crate) fn ints(v: &[i64]) -> Arg {
    Arg::List(v.iter().map(|&i| Arg::Int(i)).collect())
}

pub(crate) fn is_int(elem: &str) -> bool {
    elem.starts_with('s') || elem.starts_with('u')
}

pub(super) fn is_float(elem: &str) -> bool {
    elem.starts_with('f') || elem == "bf16"
}

/// The array shape of the instruction, or `None` for tuples and dynamic shapes.
fn arr(ins: &Instr) -> Option<(&str, &[i64])> {
    match &ins.shape {
        Shape::Array {
            elem,
            dims,
            dynamic: false,
            ..
        } => Some((elem, dims)),
        _ => None,
    }
}

pub(super) fn arity(ins: &Instr, ops: &[Val], n: usize) -> R<()> {
    if ops.len() == n {
        Ok(())
    } else {
        Err(perr(
            ins.line,
            ins.col,
            format!("`{}` takes {n} operand(s), found {}", ins.opcode, ops.len()),
            "check the instruction's operand list",
        ))
    }
}

pub(crate) fn attr_ints(ins: &Instr, key: &str) -> R<Option<Vec<i64>>> {
    ins.attr(key).map(|a| int_list(a, ins.line)).transpose()
}

fn is_identity(perm: &[i64]) -> bool {
    perm.iter().enumerate().all(|(i, &p)| p == i as i64)
}

/// Where `binary` ops come from: the ATen base name, and how a scalar may be passed.
fn binary_op(opcode: &str, elem: &str) -> Option<&'static str> {
    let int = is_int(elem);
    let pred = elem == "pred";
    Some(match opcode {
        "add" => "add",
        "subtract" => "sub",
        "multiply" => "mul",
        "divide" if !int && !pred => "div",
        "divide" if int => "div_trunc",
        "maximum" => "maximum",
        "minimum" => "minimum",
        "power" if !int && !pred => "pow",
        "remainder" if !pred => "fmod",
        "atan2" if !int && !pred => "atan2",
        "and" if pred => "logical_and",
        "or" if pred => "logical_or",
        "xor" if pred => "logical_xor",
        "and" if int => "bitwise_and",
        "or" if int => "bitwise_or",
        "xor" if int => "bitwise_xor",
        _ => return None,
    })
}

fn fold_binary(opcode: &str, elem: &str, x: f64, y: f64) -> Option<f64> {
    let v = match opcode {
        "add" => x + y,
        "subtract" => x - y,
        "multiply" => x * y,
        "divide" if y != 0.0 => (x / y).trunc(),
        "remainder" if y != 0.0 => x % y,
        "maximum" => x.max(y),
        "minimum" => x.min(y),
        "and" => ((x as i64) & (y as i64)) as f64,
        "or" => ((x as i64) | (y as i64)) as f64,
        "xor" => ((x as i64) ^ (y as i64)) as f64,
        _ => return None,
    };
    Some(if elem == "pred" {
        (v != 0.0) as i64 as f64
    } else {
        wrap_int(elem, v)
    })
}

fn unary_op(opcode: &str, elem: &str) -> Option<&'static str> {
    let float = is_float(elem);
    Some(match opcode {
        "negate" if elem != "pred" => "aten.neg.default",
        "abs" if elem != "pred" => "aten.abs.default",
        "sign" if elem != "pred" => "aten.sign.default",
        "floor" if float => "aten.floor.default",
        "ceil" if float => "aten.ceil.default",
        "round-nearest-even" if float => "aten.round.default",
        "sqrt" if float => "aten.sqrt.default",
        "rsqrt" if float => "aten.rsqrt.default",
        "exponential" if float => "aten.exp.default",
        "exponential-minus-one" if float => "aten.expm1.default",
        "log" if float => "aten.log.default",
        "log-plus-one" if float => "aten.log1p.default",
        "tanh" if float => "aten.tanh.default",
        "logistic" if float => "aten.sigmoid.default",
        "sine" if float => "aten.sin.default",
        "cosine" if float => "aten.cos.default",
        "tan" if float => "aten.tan.default",
        "erf" if float => "aten.erf.default",
        "not" => "aten.bitwise_not.default",
        _ => return None,
    })
}

fn compare_op(dir: &str) -> Option<&'static str> {
    Some(match dir {
        "EQ" => "eq",
        "NE" => "ne",
        "LT" => "lt",
        "LE" => "le",
        "GT" => "gt",
        "GE" => "ge",
        _ => return None,
    })
}

pub(crate) fn word_attr<'a>(ins: &'a Instr, key: &str) -> Option<&'a str> {
    ins.attr(key)
        .and_then(|a| a.toks.first())
        .and_then(|t| match &t.tok {
            super::lex::Tok::Word(w) | super::lex::Tok::Str(w) => Some(w.as_str()),
            _ => None,
        })
}

/// What a two-parameter reduction computation computes: `add`, `maximum`, ... of its
/// parameters, or `None`.
pub(crate) fn region_op(comp: &Computation) -> Option<&str> {
    let root = comp.instrs.get(comp.root)?;
    if root.operands.len() != 2 || comp.instrs.len() != 3 {
        return None;
    }
    let params: Vec<&Instr> = comp
        .instrs
        .iter()
        .filter(|i| i.opcode == "parameter")
        .collect();
    if params.len() != 2 {
        return None;
    }
    let mut names: Vec<&str> = root.operands.iter().map(String::as_str).collect();
    names.sort_unstable();
    let mut pn: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
    pn.sort_unstable();
    (names == pn).then_some(root.opcode.as_str())
}

impl Lowerer<'_> {
    fn v(&mut self, ins: &Instr, x: &Val) -> R<(ValueId, String, Vec<i64>)> {
        self.value(ins, x)
    }

    pub(super) fn reshape_to(
        &mut self,
        ins: &Instr,
        sfx: &str,
        x: ValueId,
        elem: &str,
        from: &[i64],
        to: &[i64],
    ) -> ValueId {
        if from == to {
            return x;
        }
        let v = self.call(
            ins,
            sfx,
            "aten.reshape.default",
            vec![Arg::Value(x), ints(to)],
            vec![],
            elem,
            to,
        );
        self.id(v)
    }

    pub(super) fn permute(
        &mut self,
        ins: &Instr,
        sfx: &str,
        x: ValueId,
        elem: &str,
        dims: &[i64],
        perm: &[i64],
    ) -> (ValueId, Vec<i64>) {
        let out: Vec<i64> = perm.iter().map(|&p| dims[p as usize]).collect();
        if is_identity(perm) {
            return (x, out);
        }
        let v = self.call(
            ins,
            sfx,
            "aten.permute.default",
            vec![Arg::Value(x), ints(perm)],
            vec![],
            elem,
            &out,
        );
        (self.id(v), out)
    }

    fn id(&self, v: Val) -> ValueId {
        match v {
            Val::Ir(id, ..) => id,
            _ => unreachable!("call returns a graph value"),
        }
    }

    /// An operand that is an `aten.expand` of a tensor of the same rank (a broadcast that only
    /// stretches size-1 dims), when the other operand has the full shape: the expand's input,
    /// which the operator broadcasts itself (torch's broadcasting gives the same values). So
    /// `x / broadcast(sum)` reads `sum` kept in its `[.., 1]` form, as torch's own captures do.
    fn unexpanded(&self, x: &Arg, full: &[i64]) -> Option<Arg> {
        let Arg::Value(v) = x else { return None };
        let n = &self.g.nodes[v.node];
        if n.op().map(|o| o.to_string()).as_deref() != Some("aten.expand.default") {
            return None;
        }
        let Some(Arg::Value(src)) = n.args().first() else {
            return None;
        };
        let ty = self.g.recorded_type(*src)?.concrete_shape()?;
        let fits = ty.len() == full.len() && ty.iter().zip(full).all(|(&a, &b)| a == b || a == 1);
        fits.then_some(Arg::Value(*src))
    }

    fn full_shaped(&self, x: &Arg, full: &[i64]) -> bool {
        let Arg::Value(v) = x else { return false };
        self.g
            .recorded_type(*v)
            .and_then(|t| t.concrete_shape())
            .is_some_and(|s| s == full)
    }

    fn unexpand_pair(&self, x: Arg, y: Arg, full: &[i64]) -> (Arg, Arg) {
        if self.full_shaped(&x, full) {
            if let Some(y2) = self.unexpanded(&y, full) {
                if self.unexpanded(&x, full).is_none() {
                    return (x, y2);
                }
            }
        }
        if self.full_shaped(&y, full) && self.unexpanded(&y, full).is_none() {
            if let Some(x2) = self.unexpanded(&x, full) {
                return (x2, y);
            }
        }
        (x, y)
    }

    /// A scalar or tensor operand of an elementwise op: a uniform literal passes as a 0-d
    /// `scalar_tensor` (broadcast by the operator), anything else as a graph value.
    fn elem_arg(&mut self, ins: &Instr, x: &Val) -> R<Arg> {
        if let Val::Lit(l) = x {
            if let (Some(v), Some(d)) = (l.uniform(), elem_dtype(&l.elem)) {
                if !l.dims.is_empty() {
                    let s = Lit {
                        elem: l.elem.clone(),
                        dims: vec![],
                        data: LitData::Uniform(v),
                    };
                    let _ = d;
                    let id = self.v(ins, &Val::Lit(Rc::new(s)))?.0;
                    return Ok(Arg::Value(id));
                }
            }
        }
        Ok(Arg::Value(self.v(ins, x)?.0))
    }

    pub(super) fn binary(&mut self, ins: &Instr, a: &Val, b: &Val) -> R<Val> {
        let Some((elem, dims)) = arr(ins) else {
            return self.opaque(ins, &[a.clone(), b.clone()]);
        };
        let opnd_elem = match a {
            Val::Ir(_, e, _) => e.clone(),
            Val::Lit(l) => l.elem.clone(),
            Val::Tuple(_) => return self.opaque(ins, &[a.clone(), b.clone()]),
        };
        if let (Some(x), Some(y)) = (Self::lit(a), Self::lit(b)) {
            if (is_int(elem) || elem == "pred") && x.numel() <= Self::fold_limit() {
                let op = ins.opcode.clone();
                let e = elem.to_string();
                if let Some(l) = Lit::map(&[x, y], elem, |v| {
                    fold_binary(&op, &e, v[0], v[1]).unwrap_or(f64::NAN)
                }) {
                    let ok = match &l.data {
                        LitData::Uniform(v) => !v.is_nan(),
                        LitData::Dense(d) => d.iter().all(|v| !v.is_nan()),
                    };
                    if ok {
                        return Ok(Val::Lit(Rc::new(l)));
                    }
                }
            }
        }
        let Some(op) = binary_op(&ins.opcode, &opnd_elem) else {
            return self.opaque(ins, &[a.clone(), b.clone()]);
        };
        if elem_dtype(elem).is_none() {
            return self.opaque(ins, &[a.clone(), b.clone()]);
        }
        // A uniform literal operand passes as a Python scalar where ATen takes one.
        let scalar = |v: &Val| -> Option<Arg> {
            let l = Self::lit(v)?;
            let s = l.uniform()?;
            Some(if l.elem == "pred" {
                return None;
            } else if is_int(&l.elem) {
                Arg::Int(s as i64)
            } else {
                Arg::Float(s)
            })
        };
        // Exact IEEE identities (NaN and signed zeros included): `maximum(x, -inf)` (JAX's
        // softmax guard, which XLA's compiler drops), `minimum(x, inf)`, `x * 1`, `x / 1`.
        let ident = |x: &Val, y: &Val, swap_ok: bool| -> Option<Val> {
            let c = Self::lit(y)?.uniform()?;
            if Self::lit(x).is_some() || !is_float(elem) {
                return None;
            }
            let hit = match op {
                "maximum" => c == f64::NEG_INFINITY,
                "minimum" => c == f64::INFINITY,
                "mul" => c == 1.0,
                "div" => c == 1.0 && !swap_ok,
                _ => false,
            };
            hit.then(|| x.clone())
        };
        if let Some(v) = ident(a, b, false).or_else(|| ident(b, a, true).filter(|_| op != "div")) {
            if matches!(&v, Val::Ir(_, e, d) if e == elem && d.as_slice() == dims) {
                return Ok(v);
            }
        }
        let commutes = matches!(op, "add" | "mul" | "maximum" | "minimum");
        let (a, b) = if commutes && Self::lit(a).is_some() && Self::lit(b).is_none() {
            (b, a)
        } else {
            (a, b)
        };
        if matches!(op, "add" | "sub" | "mul" | "div") && Self::lit(a).is_none() {
            if let Some(s) = scalar(b) {
                let x = self.v(ins, a)?.0;
                // `add.Scalar` / `sub.Scalar` for sums with a scalar, `mul.Tensor` /
                // `div.Tensor` with a scalar for products: the forms torch's own captures use.
                let overload = if matches!(op, "add" | "sub") {
                    "Scalar"
                } else {
                    "Tensor"
                };
                return Ok(self.call(
                    ins,
                    "",
                    &format!("aten.{op}.{overload}"),
                    vec![Arg::Value(x), s],
                    vec![],
                    elem,
                    dims,
                ));
            }
        }
        if op == "sub" && Self::lit(b).is_none() {
            if let Some(s) = scalar(a) {
                let y = self.v(ins, b)?.0;
                return Ok(self.call(
                    ins,
                    "",
                    "aten.rsub.Scalar",
                    vec![Arg::Value(y), s],
                    vec![],
                    elem,
                    dims,
                ));
            }
        }
        // Both literals (float): the first becomes a full tensor so the result has the shape.
        let x = if Self::lit(a).is_some() && Self::lit(b).is_some() {
            Arg::Value(self.v(ins, a)?.0)
        } else {
            self.elem_arg(ins, a)?
        };
        let y = self.elem_arg(ins, b)?;
        let (x, y) = self.unexpand_pair(x, y, dims);
        let (name, kwargs) = match op {
            "div_trunc" => (
                "aten.div.Tensor_mode",
                vec![("rounding_mode".to_string(), Arg::Str("trunc".into()))],
            ),
            "maximum" => ("aten.maximum.default", vec![]),
            "minimum" => ("aten.minimum.default", vec![]),
            "pow" => ("aten.pow.Tensor_Tensor", vec![]),
            "fmod" => ("aten.fmod.Tensor", vec![]),
            "atan2" => ("aten.atan2.default", vec![]),
            "logical_and" => ("aten.logical_and.default", vec![]),
            "logical_or" => ("aten.logical_or.default", vec![]),
            "logical_xor" => ("aten.logical_xor.default", vec![]),
            "bitwise_and" => ("aten.bitwise_and.Tensor", vec![]),
            "bitwise_or" => ("aten.bitwise_or.Tensor", vec![]),
            "bitwise_xor" => ("aten.bitwise_xor.Tensor", vec![]),
            "add" => ("aten.add.Tensor", vec![]),
            "sub" => ("aten.sub.Tensor", vec![]),
            "mul" => ("aten.mul.Tensor", vec![]),
            _ => ("aten.div.Tensor", vec![]),
        };
        Ok(self.call(ins, "", name, vec![x, y], kwargs, elem, dims))
    }

    fn broadcast(
        &mut self,
        ins: &Instr,
        x: &Val,
        out: &[i64],
        elem: &str,
        bdims: &[i64],
    ) -> R<Val> {
        if let Some(l) = Self::lit(x) {
            if l.dims.len() == bdims.len() {
                if let Some(r) = l.broadcast(out, bdims) {
                    return Ok(Val::Lit(Rc::new(r)));
                }
            }
        }
        let (id, e, dims) = self.v(ins, x)?;
        if dims.len() != bdims.len() || bdims.iter().any(|&b| b < 0 || b as usize >= out.len()) {
            return Err(perr(
                ins.line,
                ins.col,
                "broadcast `dimensions` do not match the operand's rank or the result's",
                "broadcast maps each operand dim to a result dim",
            ));
        }
        // Order the operand's dims like the result's, then insert 1s and expand.
        let mut order: Vec<i64> = (0..bdims.len() as i64).collect();
        order.sort_by_key(|&i| bdims[i as usize]);
        let (id, pdims) = self.permute(ins, "permute", id, &e, &dims, &order);
        let mut sorted: Vec<i64> = bdims.to_vec();
        sorted.sort_unstable();
        let mut shape = vec![1i64; out.len()];
        for (k, &b) in sorted.iter().enumerate() {
            shape[b as usize] = pdims[k];
        }
        let id = self.reshape_to(ins, "reshape", id, &e, &pdims, &shape);
        if shape == out {
            if id == self.v(ins, x)?.0 {
                return Ok(self.call(
                    ins,
                    "",
                    "aten.alias.default",
                    vec![Arg::Value(id)],
                    vec![],
                    elem,
                    out,
                ));
            }
            return Ok(Val::Ir(id, elem.to_string(), out.to_vec()));
        }
        Ok(self.call(
            ins,
            "",
            "aten.expand.default",
            vec![Arg::Value(id), ints(out)],
            vec![],
            elem,
            out,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn slice(
        &mut self,
        ins: &Instr,
        x: &Val,
        starts: &[i64],
        limits: &[i64],
        steps: &[i64],
        elem: &str,
        out: &[i64],
    ) -> R<Val> {
        if let Some(l) = Self::lit(x) {
            if let Some(r) = l.slice(starts, steps, out) {
                return Ok(Val::Lit(Rc::new(r)));
            }
        }
        let (mut id, e, dims) = self.v(ins, x)?;
        let mut cur = dims.clone();
        let mut sliced = false;
        for d in 0..dims.len() {
            if starts[d] == 0 && limits[d] == dims[d] && steps[d] == 1 {
                continue;
            }
            cur[d] = out[d];
            let v = self.call(
                ins,
                &format!("slice{d}"),
                "aten.slice.Tensor",
                vec![
                    Arg::Value(id),
                    Arg::Int(d as i64),
                    Arg::Int(starts[d]),
                    Arg::Int(limits[d]),
                    Arg::Int(steps[d]),
                ],
                vec![],
                &e,
                &cur,
            );
            id = self.id(v);
            sliced = true;
        }
        if !sliced {
            return Ok(x.clone());
        }
        Ok(Val::Ir(id, elem.to_string(), out.to_vec()))
    }

    /// Moves dim `d` to the front (`to_front`) or back from the front.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn move_dim(
        &mut self,
        ins: &Instr,
        sfx: &str,
        x: ValueId,
        elem: &str,
        dims: &[i64],
        d: usize,
        to_front: bool,
    ) -> (ValueId, Vec<i64>) {
        let n = dims.len();
        let mut perm: Vec<i64> = (0..n as i64).collect();
        if to_front {
            perm.remove(d);
            perm.insert(0, d as i64);
        } else {
            // inverse of the above
            let mut p: Vec<i64> = (1..n as i64).collect();
            p.insert(d, 0);
            perm = p;
        }
        self.permute(ins, sfx, x, elem, dims, &perm)
    }
}

pub(crate) fn lower_instr(l: &mut Lowerer, ins: &Instr, ops: &[Val]) -> R<Val> {
    let op = ins.opcode.as_str();
    let shape = arr(ins);
    match op {
        "constant" => {
            let Some((elem, dims)) = shape else {
                return l.opaque(ins, ops);
            };
            return match parse_literal(&ins.inner, elem, dims, ins.line, ins.col)? {
                Some(lit) if lit.numel() <= Lowerer::fold_limit() => Ok(Val::Lit(Rc::new(lit))),
                _ => l.opaque(ins, ops),
            };
        }
        "tuple" => return Ok(Val::Tuple(ops.to_vec())),
        "get-tuple-element" => {
            arity(ins, ops, 1)?;
            let idx = word_attr(ins, "index").and_then(|w| w.parse::<usize>().ok());
            return match (&ops[0], idx) {
                (Val::Tuple(items), Some(i)) if i < items.len() => Ok(items[i].clone()),
                _ => Err(perr(
                    ins.line,
                    ins.col,
                    "get-tuple-element needs a tuple operand and an `index=` within it",
                    "e.g. `get-tuple-element(%t), index=0`",
                )),
            };
        }
        "copy" | "copy-start" | "copy-done" | "optimization-barrier" | "opt-barrier" => {
            arity(ins, ops, 1)?;
            return Ok(ops[0].clone());
        }
        "add-dependency" => {
            arity(ins, ops, 2)?;
            return Ok(ops[0].clone());
        }
        "partition-id" | "replica-id" => {
            let single = if op == "partition-id" {
                l.m.num_partitions.unwrap_or(1) <= 1
            } else {
                l.m.replica_count.unwrap_or(1) <= 1
            };
            let known = if single {
                Some(0)
            } else if (op == "partition-id" && l.m.replica_count.unwrap_or(1) <= 1)
                || (op == "replica-id" && l.m.num_partitions.unwrap_or(1) <= 1)
            {
                l.device
            } else {
                None
            };
            return match (known, shape) {
                (Some(d), Some((elem, _))) => Ok(Val::Lit(Rc::new(Lit {
                    elem: elem.to_string(),
                    dims: vec![],
                    data: LitData::Uniform(d as f64),
                }))),
                _ => l.opaque(ins, ops),
            };
        }
        "fusion" | "call" | "async-start" => {
            let key = if ins.attr("calls").is_some() {
                "calls"
            } else {
                "to_apply"
            };
            let comp = l.computation(ins, key)?;
            return l.lower_comp(comp, ops);
        }
        "custom-call" => {
            let target =
                ins.attr("custom_call_target")
                    .and_then(|a| match a.toks.first().map(|t| &t.tok) {
                        Some(super::lex::Tok::Str(s)) => Some(s.as_str()),
                        _ => None,
                    });
            // Sharding annotations: the identity on values (the unpartitioned program's view).
            let annotation = matches!(
                target,
                Some("Sharding" | "xla.sdy.Sharding" | "xla.sdy.FuncResultSharding")
            );
            if annotation && ops.len() == 1 {
                let same = match (&ops[0], arr(ins)) {
                    (Val::Ir(_, e, d), Some((elem, dims))) => e == elem && d.as_slice() == dims,
                    (Val::Lit(x), Some((elem, dims))) => {
                        x.elem == elem && x.dims.as_slice() == dims
                    }
                    _ => false,
                };
                if same {
                    return Ok(ops[0].clone());
                }
            }
            return l.opaque(ins, ops);
        }
        "all-reduce-done" | "all-gather-done" | "collective-permute-done" | "async-done" => {
            arity(ins, ops, 1)?;
            return Ok(match &ops[0] {
                Val::Tuple(items) if items.len() >= 2 && op != "all-reduce-done" => {
                    items[1].clone()
                }
                v => v.clone(),
            });
        }
        _ => {}
    }
    let Some((elem, dims)) = shape else {
        return match op {
            "all-reduce" | "all-reduce-start" | "all-to-all" | "all-gather"
            | "all-gather-start" | "reduce-scatter" => collective(l, ins, ops),
            "collective-permute-start" => collective_permute(l, ins, ops),
            _ => l.opaque(ins, ops),
        };
    };
    let (elem, dims) = (elem.to_string(), dims.to_vec());
    let elem = elem.as_str();
    if let Some(aten) = unary_op(
        op,
        ops.first().map_or(elem, |v| match v {
            Val::Ir(_, e, _) => e.as_str(),
            Val::Lit(l) => l.elem.as_str(),
            Val::Tuple(_) => "",
        }),
    ) {
        arity(ins, ops, 1)?;
        if let Some(x) = Lowerer::lit(&ops[0]) {
            if is_int(elem) || elem == "pred" {
                let f: Option<fn(f64) -> f64> = match op {
                    "negate" => Some(|v| -v),
                    "abs" => Some(f64::abs),
                    "sign" => Some(f64::signum),
                    _ => None,
                };
                let e = elem.to_string();
                let folded = match (op, f) {
                    ("not", _) if elem == "pred" => {
                        Lit::map(&[x], elem, |v| (v[0] == 0.0) as i64 as f64)
                    }
                    ("not", _) => Lit::map(&[x], elem, |v| wrap_int(&e, !(v[0] as i64) as f64)),
                    (_, Some(f)) => Lit::map(&[x], elem, |v| {
                        wrap_int(
                            &e,
                            if v[0] == 0.0 && op == "sign" {
                                0.0
                            } else {
                                f(v[0])
                            },
                        )
                    }),
                    _ => None,
                };
                if let Some(r) = folded {
                    return Ok(Val::Lit(Rc::new(r)));
                }
            }
        }
        if elem_dtype(elem).is_none() {
            return l.opaque(ins, ops);
        }
        let x = l.value(ins, &ops[0])?.0;
        return Ok(l.call(ins, "", aten, vec![Arg::Value(x)], vec![], elem, &dims));
    }
    if binary_op(
        op,
        match &ops.first() {
            Some(Val::Ir(_, e, _)) => e.as_str(),
            Some(Val::Lit(x)) => x.elem.as_str(),
            _ => elem,
        },
    )
    .is_some()
        || matches!(op, "divide" | "remainder")
            && ops.len() == 2
            && ops.iter().all(|v| Lowerer::lit(v).is_some())
    {
        arity(ins, ops, 2)?;
        return l.binary(ins, &ops[0], &ops[1]);
    }
    match op {
        "compare" => {
            arity(ins, ops, 2)?;
            let Some(cmp) = word_attr(ins, "direction").and_then(compare_op) else {
                return l.opaque(ins, ops);
            };
            if let (Some(x), Some(y)) = (Lowerer::lit(&ops[0]), Lowerer::lit(&ops[1])) {
                let f: fn(f64, f64) -> bool = match cmp {
                    "eq" => |a, b| a == b,
                    "ne" => |a, b| a != b,
                    "lt" => |a, b| a < b,
                    "le" => |a, b| a <= b,
                    "gt" => |a, b| a > b,
                    _ => |a, b| a >= b,
                };
                if let Some(r) = Lit::map(&[x, y], "pred", |v| f(v[0], v[1]) as i64 as f64) {
                    return Ok(Val::Lit(Rc::new(r)));
                }
            }
            let a = if Lowerer::lit(&ops[0]).is_some() && Lowerer::lit(&ops[1]).is_none() {
                l.elem_arg(ins, &ops[0])?
            } else {
                Arg::Value(l.value(ins, &ops[0])?.0)
            };
            let b = l.elem_arg(ins, &ops[1])?;
            Ok(l.call(
                ins,
                "",
                &format!("aten.{cmp}.Tensor"),
                vec![a, b],
                vec![],
                elem,
                &dims,
            ))
        }
        "select" => {
            arity(ins, ops, 3)?;
            if let Some(p) = Lowerer::lit(&ops[0]).and_then(|p| p.uniform()) {
                return Ok(if p != 0.0 {
                    ops[1].clone()
                } else {
                    ops[2].clone()
                });
            }
            if let (Some(p), Some(a), Some(b)) = (
                Lowerer::lit(&ops[0]),
                Lowerer::lit(&ops[1]),
                Lowerer::lit(&ops[2]),
            ) {
                if let Some(r) =
                    Lit::map(&[p, a, b], elem, |v| if v[0] != 0.0 { v[1] } else { v[2] })
                {
                    return Ok(Val::Lit(Rc::new(r)));
                }
            }
            let p = l.value(ins, &ops[0])?.0;
            let a = l.elem_arg(ins, &ops[1])?;
            let b = l.elem_arg(ins, &ops[2])?;
            Ok(l.call(
                ins,
                "",
                "aten.where.self",
                vec![Arg::Value(p), a, b],
                vec![],
                elem,
                &dims,
            ))
        }
        "clamp" => {
            arity(ins, ops, 3)?;
            if let (Some(lo), Some(x), Some(hi)) = (
                Lowerer::lit(&ops[0]),
                Lowerer::lit(&ops[1]),
                Lowerer::lit(&ops[2]),
            ) {
                if is_int(elem) {
                    let lo = lo
                        .broadcast(&x.dims, &[])
                        .filter(|_| lo.dims.is_empty())
                        .unwrap_or_else(|| (**lo).clone());
                    let hi = hi
                        .broadcast(&x.dims, &[])
                        .filter(|_| hi.dims.is_empty())
                        .unwrap_or_else(|| (**hi).clone());
                    if let Some(r) = Lit::map(&[&lo, x, &hi], elem, |v| v[1].max(v[0]).min(v[2])) {
                        return Ok(Val::Lit(Rc::new(r)));
                    }
                }
            }
            let x = l.value(ins, &ops[1])?.0;
            let lo = l.elem_arg(ins, &ops[0])?;
            let hi = l.elem_arg(ins, &ops[2])?;
            Ok(l.call(
                ins,
                "",
                "aten.clamp.Tensor",
                vec![Arg::Value(x), lo, hi],
                vec![],
                elem,
                &dims,
            ))
        }
        "convert" => {
            arity(ins, ops, 1)?;
            if let Some(x) = Lowerer::lit(&ops[0]) {
                if is_int(&x.elem) || x.elem == "pred" {
                    let e = elem.to_string();
                    let r = Lit::map(&[x], elem, |v| {
                        if e == "pred" {
                            (v[0] != 0.0) as i64 as f64
                        } else if is_int(&e) {
                            wrap_int(&e, v[0])
                        } else {
                            v[0]
                        }
                    });
                    if let Some(r) = r {
                        return Ok(Val::Lit(Rc::new(r)));
                    }
                }
            }
            let Some(d) = elem_dtype(elem) else {
                return l.opaque(ins, ops);
            };
            let (x, e, _) = l.value(ins, &ops[0])?;
            if e == elem {
                return Ok(Val::Ir(x, e, dims));
            }
            Ok(l.call(
                ins,
                "",
                "aten._to_copy.default",
                vec![Arg::Value(x)],
                vec![("dtype".into(), Arg::Dtype(d))],
                elem,
                &dims,
            ))
        }
        "broadcast" => {
            arity(ins, ops, 1)?;
            let b = attr_ints(ins, "dimensions")?.unwrap_or_default();
            l.broadcast(ins, &ops[0], &dims, elem, &b)
        }
        "reshape" => {
            arity(ins, ops, 1)?;
            if let Some(x) = Lowerer::lit(&ops[0]) {
                if let Some(r) = x.reshape(&dims) {
                    return Ok(Val::Lit(Rc::new(r)));
                }
            }
            let (x, e, from) = l.value(ins, &ops[0])?;
            if from.iter().product::<i64>() != dims.iter().product::<i64>() {
                return Err(perr(
                    ins.line,
                    ins.col,
                    "reshape changes the number of elements",
                    "a reshape keeps the element count",
                ));
            }
            if from == dims {
                return Ok(ops[0].clone());
            }
            Ok(l.call(
                ins,
                "",
                "aten.reshape.default",
                vec![Arg::Value(x)]
                    .into_iter()
                    .chain([ints(&dims)])
                    .collect(),
                vec![],
                &e,
                &dims,
            ))
        }
        "bitcast" => {
            arity(ins, ops, 1)?;
            bitcast(l, ins, &ops[0], elem, &dims)
        }
        "transpose" => {
            arity(ins, ops, 1)?;
            let perm = attr_ints(ins, "dimensions")?.unwrap_or_default();
            if let Some(x) = Lowerer::lit(&ops[0]) {
                if let Some(r) = x.transpose(&perm, &dims) {
                    return Ok(Val::Lit(Rc::new(r)));
                }
            }
            let (x, e, from) = l.value(ins, &ops[0])?;
            if !valid_perm(&perm, from.len()) {
                return Err(perr(
                    ins.line,
                    ins.col,
                    "transpose `dimensions` is not a permutation of the operand's dims",
                    "e.g. `dimensions={1,0}`",
                ));
            }
            if is_identity(&perm) {
                return Ok(ops[0].clone());
            }
            Ok(l.call(
                ins,
                "",
                "aten.permute.default",
                vec![Arg::Value(x), ints(&perm)],
                vec![],
                &e,
                &dims,
            ))
        }
        "slice" => {
            arity(ins, ops, 1)?;
            let Some(a) = ins.attr("slice") else {
                return Err(perr(
                    ins.line,
                    ins.col,
                    "slice needs a `slice={[start:limit:stride], ...}` attribute",
                    "as XLA prints it",
                ));
            };
            let spec = slice_spec(a, ins.line)?;
            let in_dims = match &ops[0] {
                Val::Ir(_, _, d) => d.clone(),
                Val::Lit(x) => x.dims.clone(),
                Val::Tuple(_) => return l.opaque(ins, ops),
            };
            if spec.len() != in_dims.len() {
                return Err(perr(
                    ins.line,
                    a.col,
                    "the slice has a different number of dims than its operand",
                    "one `[start:limit]` per dim",
                ));
            }
            let fits = spec.len() == dims.len()
                && spec
                    .iter()
                    .zip(&in_dims)
                    .zip(&dims)
                    .all(|((&(s, e, st), &n), &o)| e <= n && (e - s + st - 1) / st == o);
            if !fits {
                return Err(perr(
                    ins.line,
                    a.col,
                    "the slice does not fit its operand or its result's shape",
                    "each `[start:limit:stride]` lies within the operand and gives the result's size",
                ));
            }
            let starts: Vec<i64> = spec.iter().map(|s| s.0).collect();
            let limits: Vec<i64> = spec.iter().map(|s| s.1).collect();
            let steps: Vec<i64> = spec.iter().map(|s| s.2).collect();
            l.slice(ins, &ops[0], &starts, &limits, &steps, elem, &dims)
        }
        "dynamic-slice" => {
            if ops.is_empty() {
                return arity(ins, ops, 2).map(|_| unreachable!());
            }
            let in_dims = match &ops[0] {
                Val::Ir(_, _, d) => d.clone(),
                Val::Lit(x) => x.dims.clone(),
                Val::Tuple(_) => return l.opaque(ins, ops),
            };
            let sizes = attr_ints(ins, "dynamic_slice_sizes")?.unwrap_or_else(|| dims.clone());
            let Some(offs) = Lowerer::dyn_offsets(&ops[1..]) else {
                return l.opaque(ins, ops);
            };
            if offs.len() != in_dims.len()
                || sizes.len() != in_dims.len()
                || dims != sizes
                || sizes.iter().zip(&in_dims).any(|(s, n)| s > n || *s < 0)
            {
                return Err(perr(
                    ins.line,
                    ins.col,
                    "dynamic-slice needs one start index and one size per operand dim",
                    "as XLA prints it",
                ));
            }
            // HLO clamps the start so the slice stays inside the operand.
            let starts: Vec<i64> = (0..in_dims.len())
                .map(|d| offs[d].clamp(0, (in_dims[d] - sizes[d]).max(0)))
                .collect();
            let limits: Vec<i64> = (0..in_dims.len()).map(|d| starts[d] + sizes[d]).collect();
            l.slice(
                ins,
                &ops[0],
                &starts,
                &limits,
                &vec![1; in_dims.len()],
                elem,
                &dims,
            )
        }
        "dynamic-update-slice" => {
            if ops.len() < 2 {
                return arity(ins, ops, 3).map(|_| unreachable!());
            }
            let Some(offs) = Lowerer::dyn_offsets(&ops[2..]) else {
                return l.opaque(ins, ops);
            };
            let (x, e, xd) = l.value(ins, &ops[0])?;
            let (u, _, ud) = l.value(ins, &ops[1])?;
            if offs.len() != xd.len() || ud.len() != xd.len() {
                return Err(perr(
                    ins.line,
                    ins.col,
                    "dynamic-update-slice needs one start index per operand dim",
                    "as XLA prints it",
                ));
            }
            let differ: Vec<usize> = (0..xd.len()).filter(|&d| ud[d] != xd[d]).collect();
            match differ.as_slice() {
                [] => Ok(Val::Ir(u, e, xd)),
                [d] => {
                    let s = offs[*d].clamp(0, xd[*d] - ud[*d]);
                    Ok(l.call(
                        ins,
                        "",
                        "aten.slice_scatter.default",
                        vec![
                            Arg::Value(x),
                            Arg::Value(u),
                            Arg::Int(*d as i64),
                            Arg::Int(s),
                            Arg::Int(s + ud[*d]),
                            Arg::Int(1),
                        ],
                        vec![],
                        elem,
                        &dims,
                    ))
                }
                _ => l.opaque(ins, ops),
            }
        }
        "concatenate" => {
            let d = attr_ints(ins, "dimensions")?
                .and_then(|v| v.first().copied())
                .unwrap_or(0);
            if d < 0 || d as usize >= dims.len() {
                return Err(perr(
                    ins.line,
                    ins.col,
                    "concatenate `dimensions` is outside the result's rank",
                    "e.g. `dimensions={0}`",
                ));
            }
            let lits: Option<Vec<&Rc<Lit>>> = ops.iter().map(Lowerer::lit).collect();
            if let Some(ls) = lits {
                let refs: Vec<&Lit> = ls.iter().map(|x| x.as_ref()).collect();
                if let Some(r) = Lit::concat(&refs, d as usize, &dims) {
                    return Ok(Val::Lit(Rc::new(r)));
                }
            }
            let mut parts = Vec::new();
            for o in ops {
                parts.push(Arg::Value(l.value(ins, o)?.0));
            }
            Ok(l.call(
                ins,
                "",
                "aten.cat.default",
                vec![Arg::List(parts), Arg::Int(d)],
                vec![],
                elem,
                &dims,
            ))
        }
        "iota" => {
            let d = word_attr(ins, "iota_dimension")
                .and_then(|w| w.parse::<usize>().ok())
                .unwrap_or(0);
            if d >= dims.len() {
                return Err(perr(
                    ins.line,
                    ins.col,
                    "iota_dimension is outside the shape",
                    "e.g. `iota_dimension=0`",
                ));
            }
            if is_int(elem) {
                if let Some(r) = Lit::iota(elem, &dims, d) {
                    return Ok(Val::Lit(Rc::new(r)));
                }
            }
            let Some(dt) = elem_dtype(elem) else {
                return l.opaque(ins, ops);
            };
            let n = dims[d];
            let a = l.call(
                ins,
                "arange",
                "aten.arange.default",
                vec![Arg::Int(n)],
                vec![("dtype".into(), Arg::Dtype(dt))],
                elem,
                &[n],
            );
            let seen = Val::Ir(l_id(&a), elem.to_string(), vec![n]);
            l.broadcast(ins, &seen, &dims, elem, &[d as i64])
        }
        "pad" => {
            arity(ins, ops, 2)?;
            let Some(pv) = Lowerer::lit(&ops[1]).and_then(|p| p.uniform()) else {
                return l.opaque(ins, ops);
            };
            let Some(cfg) = word_attr(ins, "padding").map(str::to_string) else {
                return l.opaque(ins, ops);
            };
            let mut pads = Vec::new();
            for part in cfg.split('x') {
                let nums: Vec<i64> = match part.split('_').map(|p| p.parse::<i64>()).collect() {
                    Ok(v) => v,
                    Err(_) => return l.opaque(ins, ops),
                };
                match nums.as_slice() {
                    [lo, hi] | [lo, hi, 0] => pads.push((*lo, *hi)),
                    _ => return l.opaque(ins, ops),
                }
            }
            let (x, _, xd) = l.value(ins, &ops[0])?;
            if pads.len() != xd.len() {
                return l.opaque(ins, ops);
            }
            let flat: Vec<i64> = pads.iter().rev().flat_map(|(lo, hi)| [*lo, *hi]).collect();
            let s = if is_int(elem) {
                Arg::Int(pv as i64)
            } else if elem == "pred" {
                Arg::Bool(pv != 0.0)
            } else {
                Arg::Float(pv)
            };
            Ok(l.call(
                ins,
                "",
                "aten.constant_pad_nd.default",
                vec![Arg::Value(x), ints(&flat), s],
                vec![],
                elem,
                &dims,
            ))
        }
        "reverse" => {
            arity(ins, ops, 1)?;
            let ds = attr_ints(ins, "dimensions")?.unwrap_or_default();
            let x = l.value(ins, &ops[0])?.0;
            if ds.is_empty() {
                return Ok(ops[0].clone());
            }
            Ok(l.call(
                ins,
                "",
                "aten.flip.default",
                vec![Arg::Value(x), ints(&ds)],
                vec![],
                elem,
                &dims,
            ))
        }
        "reduce" => reduce(l, ins, ops, elem, &dims),
        "dot" => dot(l, ins, ops, elem, &dims),
        "all-reduce" | "all-reduce-start" | "all-gather" | "all-gather-start"
        | "reduce-scatter" | "all-to-all" => collective(l, ins, ops),
        "collective-permute" | "collective-permute-start" => collective_permute(l, ins, ops),
        _ => l.opaque(ins, ops),
    }
}

pub(crate) fn l_id(v: &Val) -> ValueId {
    match v {
        Val::Ir(id, ..) => *id,
        _ => unreachable!("call returns a graph value"),
    }
}
