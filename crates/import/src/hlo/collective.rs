//! HLO collectives to `_c10d_functional` collectives and `shardproof_p2p` send / recv.

use super::groups::parse_pairs;
use super::lower::{elem_dtype, flatten_val, Lowerer, Val};
use super::ops::{attr_ints, ints, is_int, l_id, region_op, word_attr};
use super::parse::{perr, Instr, PErr, Shape};
use shardproof_ir::Arg;

type R<T> = Result<T, PErr>;

fn reduce_name(l: &Lowerer, ins: &Instr) -> R<Option<&'static str>> {
    let comp = l.computation(ins, "to_apply")?;
    Ok(match region_op(comp) {
        Some("add") => Some("sum"),
        Some("maximum") => Some("max"),
        Some("minimum") => Some("min"),
        Some("multiply") => Some("product"),
        _ => None,
    })
}

pub(crate) fn collective(l: &mut Lowerer, ins: &Instr, ops: &[Val]) -> R<Val> {
    let op = ins.opcode.trim_end_matches("-start");
    let Some((group, gsize)) = l.groups(ins)? else {
        return l.opaque(ins, ops);
    };
    let order_sensitive = op != "all-reduce";
    if order_sensitive {
        if let Some(spec) = super::groups::parse_groups(l.m, ins)? {
            if spec
                .groups
                .iter()
                .any(|g| g.windows(2).any(|w| w[0] > w[1]))
            {
                // Members out of rank order gather in that order: the case's sorted groups
                // cannot say so.
                return l.opaque(ins, ops);
            }
        }
    }
    let mut leaves = Vec::new();
    for o in ops {
        flatten_val(o, &mut leaves);
    }
    let mut out_shapes = Vec::new();
    collect_arrays(&ins.shape, &mut out_shapes);
    let mut results = Vec::new();
    match op {
        "all-reduce" => {
            let Some(red) = reduce_name(l, ins)? else {
                return l.opaque(ins, ops);
            };
            for (k, v) in leaves.iter().enumerate() {
                let (x, e, d) = l.value(ins, v)?;
                let sfx = if leaves.len() > 1 {
                    format!("{k}")
                } else {
                    String::new()
                };
                results.push(l.call(
                    ins,
                    &sfx,
                    "_c10d_functional.all_reduce.default",
                    vec![Arg::Value(x), Arg::Str(red.into()), Arg::Str(group.clone())],
                    vec![],
                    &e,
                    &d,
                ));
            }
        }
        "all-gather" | "reduce-scatter" => {
            let red = if op == "reduce-scatter" {
                match reduce_name(l, ins)? {
                    Some(r) => Some(r),
                    None => return l.opaque(ins, ops),
                }
            } else {
                None
            };
            let dim = attr_ints(ins, "dimensions")?
                .and_then(|v| v.first().copied())
                .unwrap_or(0);
            for (k, v) in leaves.iter().enumerate() {
                let (x, e, d) = l.value(ins, v)?;
                if dim < 0
                    || dim as usize >= d.len()
                    || (op == "reduce-scatter" && d[dim as usize] % gsize != 0)
                {
                    return Err(perr(ins.line, ins.col, format!("{op} dimension {dim} does not fit the operand"), "the dimension lies within the operand's rank (and divides by the group size)"));
                }
                let dim = dim as usize;
                let sfx = if leaves.len() > 1 {
                    format!("{k}")
                } else {
                    String::new()
                };
                let (x, fd) = l.move_dim(ins, &format!("{sfx}front"), x, &e, &d, dim, true);
                let mut od = fd.clone();
                let (name, args) = if let Some(r) = red {
                    od[0] /= gsize;
                    (
                        "_c10d_functional.reduce_scatter_tensor.default",
                        vec![
                            Arg::Value(x),
                            Arg::Str(r.into()),
                            Arg::Int(gsize),
                            Arg::Str(group.clone()),
                        ],
                    )
                } else {
                    od[0] *= gsize;
                    (
                        "_c10d_functional.all_gather_into_tensor.default",
                        vec![Arg::Value(x), Arg::Int(gsize), Arg::Str(group.clone())],
                    )
                };
                let c = if dim == 0 {
                    sfx.clone()
                } else {
                    format!("{sfx}c")
                };
                let r = l.call(ins, &c, name, args, vec![], &e, &od);
                let (b, bd) = l.move_dim(ins, &sfx, l_id(&r), &e, &od, dim, false);
                results.push(Val::Ir(b, e.clone(), bd));
            }
        }
        _ => {
            // all-to-all
            if let Some(dim) = attr_ints(ins, "dimensions")?.and_then(|v| v.first().copied()) {
                if leaves.len() != 1 {
                    return l.opaque(ins, ops);
                }
                let (x, e, d) = l.value(ins, &leaves[0])?;
                if dim < 0 || dim as usize >= d.len() || d[dim as usize] % gsize != 0 {
                    return Err(perr(
                        ins.line,
                        ins.col,
                        "all-to-all dimension does not fit the operand",
                        "the split dimension divides by the group size",
                    ));
                }
                let dim = dim as usize;
                let (x, fd) = l.move_dim(ins, "front", x, &e, &d, dim, true);
                let r = l.call(
                    ins,
                    if dim == 0 { "" } else { "c" },
                    "_c10d_functional.all_to_all_single.default",
                    vec![Arg::Value(x), ints(&[]), ints(&[]), Arg::Str(group.clone())],
                    vec![],
                    &e,
                    &fd,
                );
                let (b, bd) = l.move_dim(ins, "", l_id(&r), &e, &fd, dim, false);
                return Ok(Val::Ir(b, e, bd));
            }
            // Tuple form: operand j goes to member j; result j comes from member j.
            if leaves.len() as i64 != gsize || leaves.is_empty() {
                return l.opaque(ins, ops);
            }
            let mut parts = Vec::new();
            let mut shape: Option<(String, Vec<i64>)> = None;
            for v in &leaves {
                let (x, e, d) = l.value(ins, v)?;
                if d.is_empty() || shape.as_ref().is_some_and(|s| s.1 != d || s.0 != e) {
                    return l.opaque(ins, ops);
                }
                shape = Some((e, d));
                parts.push(Arg::Value(x));
            }
            let (e, d) = shape.expect("at least one operand");
            let mut cd = d.clone();
            cd[0] *= gsize;
            let cat = l.call(
                ins,
                "cat",
                "aten.cat.default",
                vec![Arg::List(parts), Arg::Int(0)],
                vec![],
                &e,
                &cd,
            );
            let r = l.call(
                ins,
                "a2a",
                "_c10d_functional.all_to_all_single.default",
                vec![
                    Arg::Value(l_id(&cat)),
                    ints(&[]),
                    ints(&[]),
                    Arg::Str(group.clone()),
                ],
                vec![],
                &e,
                &cd,
            );
            for j in 0..gsize {
                let s = l.call(
                    ins,
                    &format!("{j}"),
                    "aten.slice.Tensor",
                    vec![
                        Arg::Value(l_id(&r)),
                        Arg::Int(0),
                        Arg::Int(j * d[0]),
                        Arg::Int((j + 1) * d[0]),
                        Arg::Int(1),
                    ],
                    vec![],
                    &e,
                    &d,
                );
                results.push(s);
            }
            return Ok(Val::Tuple(results));
        }
    }
    if matches!(ins.shape, Shape::Tuple(_)) {
        if out_shapes.len() == 2 && results.len() == 1 && ins.opcode.ends_with("-start") {
            // (operand, result) of an async start
            let first = leaves[0].clone();
            return Ok(Val::Tuple(vec![first, results.remove(0)]));
        }
        return Ok(Val::Tuple(results));
    }
    match results.len() {
        1 => Ok(results.remove(0)),
        _ => l.opaque(ins, ops),
    }
}

fn collect_arrays<'s>(s: &'s Shape, out: &mut Vec<&'s Shape>) {
    match s {
        Shape::Tuple(p) => p.iter().for_each(|x| collect_arrays(x, out)),
        a => out.push(a),
    }
}

pub(crate) fn collective_permute(l: &mut Lowerer, ins: &Instr, ops: &[Val]) -> R<Val> {
    let Some(device) = l.device else {
        return l.opaque(ins, ops);
    };
    let Some(pairs) = parse_pairs(ins)? else {
        return l.opaque(ins, ops);
    };
    if ops.len() != 1 || ins.attr("channel_id").is_none() {
        return l.opaque(ins, ops);
    }
    let (x, e, d) = l.value(ins, &ops[0])?;
    let Some(dt) = elem_dtype(&e) else {
        return l.opaque(ins, ops);
    };
    let tag = word_attr(ins, "channel_id")
        .and_then(|w| w.parse::<i64>().ok())
        .unwrap_or(0);
    for &(s, t) in &pairs {
        if s == device {
            l.call(
                ins,
                &format!("send{t}"),
                "shardproof_p2p.send.default",
                vec![Arg::Value(x), Arg::Int(t as i64), Arg::Int(tag)],
                vec![],
                &e,
                &d,
            );
        }
    }
    let srcs: Vec<usize> = pairs
        .iter()
        .filter(|p| p.1 == device)
        .map(|p| p.0)
        .collect();
    let r = match srcs.as_slice() {
        [] => {
            // Devices no pair targets receive zeros.
            let s = if is_int(&e) {
                Arg::Int(0)
            } else if e == "pred" {
                Arg::Bool(false)
            } else {
                Arg::Float(0.0)
            };
            l.call(
                ins,
                "",
                "aten.full.default",
                vec![ints(&d), s],
                vec![("dtype".into(), Arg::Dtype(dt))],
                &e,
                &d,
            )
        }
        [s] => l.call(
            ins,
            "",
            "shardproof_p2p.recv.default",
            vec![ints(&d), Arg::Dtype(dt), Arg::Int(*s as i64), Arg::Int(tag)],
            vec![],
            &e,
            &d,
        ),
        _ => {
            return Err(perr(
                ins.line,
                ins.col,
                format!("device {device} is the target of several source_target_pairs"),
                "each device receives from at most one source",
            ));
        }
    };
    if ins.opcode.ends_with("-start") && matches!(ins.shape, Shape::Tuple(_)) {
        return Ok(Val::Tuple(vec![ops[0].clone(), r]));
    }
    Ok(r)
}
