//! Cuts whose rank tensors are a whole multiple of their pieces: a data-parallel rank's
//! activation gradient is `D` times the spec's on its rows (its loss is averaged over its own
//! rows), which no placement states and the case format's `expr:` cannot (it has no scaling).
//!
//! A relation `rank tensor = c · piece` (the piece its placed layout gives) is encoded in the
//! stage's rank graphs, so that every later step (leaves, rebuilt outputs, shape and mesh
//! reduction, the memo key, the interpreter's replay) sees plain placed relations and plain
//! operators:
//!
//! - a stage that *assumes* the cut reads a fresh input `x_unscaled`, laid out by the placement,
//!   and computes `x = mul(x_unscaled, c)` where the rank read `x`: the rank's `x` is then `c`
//!   times its piece, for every piece;
//! - a stage that *establishes* the cut computes `div(x, c)` after the rank's `x` and expects it
//!   in the placement: it holds exactly when `x` is `c` times its piece (`c > 0`, exact
//!   rational arithmetic).
//!
//! So the chain of section 7 is unchanged: each stage states and proves the scaled relation.

use shardproof_case::{Case, Layout};
use shardproof_ir::{Arg, Graph, Node, NodeKind, OpName, Output, ValueId};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Relations whose rank tensors are a whole multiple of their pieces, by spec tensor name:
/// every rank's tensor of that relation is `c` times the piece its placed layout gives.
pub type CutScales = BTreeMap<String, u64>;

fn scalar_call(name: String, op: &str, x: ValueId, c: u64, ty: &Output) -> Node {
    Node {
        name: name.clone(),
        kind: NodeKind::Call {
            op: OpName::new("aten", op, "Scalar"),
            args: vec![Arg::Value(x), Arg::Int(c as i64)],
            kwargs: Vec::new(),
        },
        outputs: vec![Output {
            name,
            ty: ty.ty.clone(),
        }],
        loc: None,
        line: None,
    }
}

/// Shifts every reference to a node at or after `at` by one (a node was inserted at `at`),
/// except `keep`, which stays where it is.
fn shift(v: ValueId, at: usize, keep: ValueId) -> ValueId {
    if v != keep && v.node >= at {
        ValueId::new(v.node + 1, v.output)
    } else {
        v
    }
}

fn shift_arg(a: &mut Arg, at: usize, keep: ValueId) {
    match a {
        Arg::Value(v) => *v = shift(*v, at, keep),
        Arg::List(xs) => xs.iter_mut().for_each(|x| shift_arg(x, at, keep)),
        _ => {}
    }
}

/// `g` with input `v` read as `c` times a fresh input: the fresh input takes `v`'s place (and
/// id), `mul(fresh, c)` follows it under `v`'s name, and every reader of `v` reads the product.
fn scale_input(g: &Graph, v: ValueId, c: u64) -> Result<Graph, String> {
    let node = &g.nodes[v.node];
    if !matches!(node.kind, NodeKind::Input) || v.output != 0 {
        return Err(format!(
            "`{}` is not an input of the stage's rank graph",
            g.value_name(v)
        ));
    }
    let at = v.node + 1;
    let product = ValueId::new(at, 0);
    let mut out = g.clone();
    let unscaled = crate::fresh_value_name(g, &format!("{}_unscaled", node.outputs[0].name));
    let mut input = node.clone();
    input.name = unscaled.clone();
    input.outputs[0].name = unscaled;
    let mul = scalar_call(node.outputs[0].name.clone(), "mul", v, c, &node.outputs[0]);
    out.nodes[v.node] = input;
    out.nodes.insert(at, mul);
    for (i, n) in out.nodes.iter_mut().enumerate() {
        if i == at {
            continue;
        }
        if let NodeKind::Call { args, kwargs, .. } = &mut n.kind {
            // Readers of `v` now read the product, which sits at `at`.
            let redirect = |a: &mut Arg| {
                shift_arg(a, at, ValueId::new(usize::MAX, 0));
                redirect_value(a, ValueId::new(v.node, 0), product);
            };
            args.iter_mut().for_each(redirect);
            kwargs.iter_mut().for_each(|(_, a)| redirect(a));
        }
    }
    for o in out.outputs.iter_mut().flatten() {
        *o = shift(*o, at, ValueId::new(usize::MAX, 0));
        if *o == v {
            *o = product;
        }
    }
    for i in out.inputs.iter_mut() {
        *i = shift(*i, at, v);
    }
    Ok(out)
}

fn redirect_value(a: &mut Arg, from: ValueId, to: ValueId) {
    match a {
        Arg::Value(x) if *x == from => *x = to,
        Arg::List(xs) => xs.iter_mut().for_each(|x| redirect_value(x, from, to)),
        _ => {}
    }
}

/// Rewrites a stage case so that every relation named in `scales` states `rank = c · piece`
/// (see the module documentation); relations not named are left as they are. Its expected
/// outputs are rewritten only where the stage establishes a cut (`cut_target`): an `outputs:`
/// entry states its own, unscaled relation, even of a tensor that a scaled cut also names.
pub(crate) fn encode(case: &mut Case, scales: &CutScales, cut_target: bool) -> Result<(), String> {
    for k in 0..case.inputs.len() {
        let Some(&c) = scales.get(&case.inputs[k].spec_name) else {
            continue;
        };
        check(&case.inputs[k].layout, &case.inputs[k].spec_name, c)?;
        // One rewrite per distinct graph: ranks sharing a graph share the rewritten one.
        let mut done: HashMap<usize, (Arc<Graph>, ValueId)> = HashMap::new();
        let holders = case.inputs[k].rank_values.clone();
        for &(r, v) in &holders {
            let ptr = Arc::as_ptr(&case.program.ranks[r]) as usize;
            let (g, at) = match done.get(&ptr) {
                Some((g, w)) if *w == v => (g.clone(), v.node + 1),
                Some(_) => {
                    return Err(format!(
                        "`{}` is held by two values of one shared rank graph",
                        case.inputs[k].spec_name
                    ))
                }
                None => {
                    let g = Arc::new(scale_input(&case.program.ranks[r], v, c)?);
                    done.insert(ptr, (g.clone(), v));
                    (g, v.node + 1)
                }
            };
            case.program.ranks[r] = g;
            // Every other relation's value on this rank moves with the inserted node.
            for rel in case.inputs.iter_mut() {
                for rv in rel.rank_values.iter_mut().filter(|(h, _)| *h == r) {
                    rv.1 = shift(rv.1, at, v);
                }
                if let Some(iv) = rel.impl_values.get_mut(r) {
                    *iv = shift(*iv, at, v);
                }
            }
            for o in case.outputs.iter_mut() {
                for rv in o.rank_values.iter_mut().filter(|(h, _)| *h == r) {
                    rv.1 = shift(rv.1, at, ValueId::new(usize::MAX, 0));
                }
                if let Some(iv) = o.impl_values.get_mut(r) {
                    *iv = shift(*iv, at, ValueId::new(usize::MAX, 0));
                }
            }
        }
    }
    if !cut_target {
        return Ok(());
    }
    for k in 0..case.outputs.len() {
        let Some(&c) = scales.get(&case.outputs[k].spec_name) else {
            continue;
        };
        check(&case.outputs[k].layout, &case.outputs[k].spec_name, c)?;
        let mut done: HashMap<(usize, ValueId), (Arc<Graph>, ValueId)> = HashMap::new();
        let holders = case.outputs[k].rank_values.clone();
        let mut moved = Vec::new();
        for &(r, v) in &holders {
            let key = (Arc::as_ptr(&case.program.ranks[r]) as usize, v);
            let (g, nv) = match done.get(&key) {
                Some(x) => x.clone(),
                None => {
                    let old = &case.program.ranks[r];
                    let mut g = (**old).clone();
                    let name =
                        crate::fresh_value_name(&g, &format!("{}_unscaled", g.value_name(v)));
                    let ty = g.nodes[v.node].outputs[v.output].clone();
                    let at = g.push(scalar_call(name, "div", v, c, &ty));
                    let nv = ValueId::new(at, 0);
                    for o in g.outputs.iter_mut().flatten() {
                        if *o == v {
                            *o = nv;
                        }
                    }
                    let g = Arc::new(g);
                    done.insert(key, (g.clone(), nv));
                    (g, nv)
                }
            };
            case.program.ranks[r] = g;
            moved.push((r, nv));
        }
        let o = &mut case.outputs[k];
        for &(r, nv) in &moved {
            if let Some(iv) = o.impl_values.get_mut(r) {
                *iv = nv;
            }
        }
        o.rank_values = moved;
    }
    Ok(())
}

fn check(layout: &Layout, name: &str, c: u64) -> Result<(), String> {
    if c == 0 {
        return Err(format!(
            "`{name}`: a scale of 0 states nothing about its pieces"
        ));
    }
    if !matches!(layout, Layout::Placed(_)) {
        return Err(format!(
            "`{name}`: a scaled relation needs a placed layout, not an `expr:`"
        ));
    }
    Ok(())
}
