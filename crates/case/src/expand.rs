//! Declared operators inlined into the graphs: every call of an operator the case declares by a
//! decomposition, and every `auto_functionalized` (v1, and v2 around a declaration with
//! `writes`) of one, becomes the registered calls it stands for, so that every engine reads
//! the same graph of known operators (and a collective named in a decomposition is a
//! collective every engine schedules).
//!
//! The last call computing an output of the original node keeps that output's name, recorded
//! type and source location, so cases, reports and diagnostics name what the graph text names.
//! A call that does not fit its declaration (a keyword the declaration does not name, a write to
//! a view of a base, an identity with several tensors) stays as it is: the engines then report
//! the operator as unsupported, never guess.

use shardproof_ir::{
    Arg, DecompExpr, Graph, Node, NodeKind, OpMeaning, OpName, Output, Signature, ValueId,
};
use std::collections::{BTreeMap, HashSet};

/// What each output of a node becomes, or `None` when the node stays as written.
type Plan<'a> = Vec<Option<Source<'a>>>;

/// How one output of an inlined node is computed.
enum Source<'a> {
    /// This expression over the (inlined) call's parameters.
    Expr(&'a DecompExpr, &'a [Arg]),
    /// The value of this argument, unchanged.
    Same(Arg),
    /// Nothing (an operator that returns nothing): no one may read it.
    Nothing,
}

/// `graph` with the declared operators of `ops` inlined, or `None` when there is none to inline.
pub(crate) fn expand_declared(graph: &Graph, ops: &BTreeMap<String, OpMeaning>) -> Option<Graph> {
    if ops.is_empty() {
        return None;
    }
    let mut taken: HashSet<String> = graph
        .nodes
        .iter()
        .flat_map(|n| n.outputs.iter().map(|o| o.name.clone()))
        .collect();
    let mut out = Graph {
        name: graph.name.clone(),
        path: graph.path.clone(),
        nodes: Vec::with_capacity(graph.nodes.len()),
        inputs: Vec::new(),
        outputs: Vec::new(),
    };
    let mut remap: Vec<Vec<Option<ValueId>>> = Vec::with_capacity(graph.nodes.len());
    let mut changed = false;
    for node in &graph.nodes {
        let mapped = map_node(node, &remap);
        let bound = mapped.as_ref().and_then(|m| bind_node(m, ops));
        match (mapped, bound) {
            (Some(m), Some(bound)) => {
                changed = true;
                let mut outs = Vec::with_capacity(m.outputs.len());
                for (k, src) in plan_of(&bound).into_iter().enumerate() {
                    let v = src.and_then(|s| emit_output(&mut out, &m, k, s, &mut taken));
                    outs.push(v);
                }
                remap.push(outs);
            }
            (Some(m), None) => {
                let i = out.push(m);
                let n = out.nodes[i].outputs.len();
                remap.push((0..n).map(|o| Some(ValueId::new(i, o))).collect());
            }
            // The node reads an output that an inlined operator does not produce (the result of
            // an operator that returns nothing): nothing can be inlined soundly.
            (None, _) => return None,
        }
    }
    if !changed {
        return None;
    }
    let at = |v: &ValueId| {
        remap
            .get(v.node)
            .and_then(|o| o.get(v.output))
            .copied()
            .flatten()
    };
    out.inputs = graph.inputs.iter().map(&at).collect::<Option<_>>()?;
    out.outputs = graph
        .outputs
        .iter()
        .map(|v| v.as_ref().and_then(at))
        .collect();
    Some(out)
}

/// The planned outputs (borrowing the bound arguments the plan holds).
fn plan_of<'a>(p: &'a Bound<'a>) -> Plan<'a> {
    p.outputs
        .iter()
        .map(|o| {
            o.as_ref().map(|s| match s {
                BoundOut::Expr(e) => Source::Expr(e, &p.args),
                BoundOut::Same(a) => Source::Same(a.clone()),
                BoundOut::Nothing => Source::Nothing,
            })
        })
        .collect()
}

/// A node's arguments bound to a declaration, and what each of its outputs is.
struct Bound<'a> {
    args: Vec<Arg>,
    outputs: Vec<Option<BoundOut<'a>>>,
}

enum BoundOut<'a> {
    Expr(&'a DecompExpr),
    Same(Arg),
    Nothing,
}

fn meaning<'a>(ops: &'a BTreeMap<String, OpMeaning>, op: &OpName) -> Option<&'a OpMeaning> {
    ops.get(&op.to_string()).or_else(|| ops.get(&op.base()))
}

/// How `node` (its arguments already remapped) is inlined, if it is.
fn bind_node<'a>(node: &Node, ops: &'a BTreeMap<String, OpMeaning>) -> Option<Bound<'a>> {
    let NodeKind::Call { op, args, kwargs } = &node.kind else {
        return None;
    };
    let n = node.outputs.len();
    if op.namespace == "higher_order" {
        return match op.name.as_str() {
            "auto_functionalized" => functionalized_v1(args, kwargs, n, ops),
            "auto_functionalized_v2" => functionalized_v2(args, kwargs, n, ops),
            _ => None,
        };
    }
    match meaning(ops, op)? {
        OpMeaning::Decompose(DecompExpr::Signature(sig)) => Some(Bound {
            args: sig.bind(args, kwargs).ok()?,
            outputs: vec![Some(BoundOut::Expr(sig.returns.as_ref()?))],
        }),
        OpMeaning::Decompose(e @ DecompExpr::Call { .. }) if kwargs.is_empty() && n == 1 => {
            Some(Bound {
                args: args.clone(),
                outputs: vec![Some(BoundOut::Expr(e))],
            })
        }
        _ => None,
    }
}

/// The wrapper's own keyword arguments (not the operator's).
fn operator_kwargs(kwargs: &[(String, Arg)]) -> Vec<(String, Arg)> {
    kwargs
        .iter()
        .filter(|(k, _)| !k.starts_with('_'))
        .cloned()
        .collect()
}

/// `auto_functionalized(op, **kwargs)` returns the operator's result (`None` when it returns
/// nothing) followed by the new values of the arguments it writes, in schema order.
fn functionalized_v1<'a>(
    args: &[Arg],
    kwargs: &[(String, Arg)],
    n: usize,
    ops: &'a BTreeMap<String, OpMeaning>,
) -> Option<Bound<'a>> {
    let Some(Arg::Op(inner)) = args.first() else {
        return None;
    };
    let kw = operator_kwargs(kwargs);
    match meaning(ops, inner)? {
        OpMeaning::Decompose(DecompExpr::Signature(sig)) => {
            let bound = sig.bind(&args[1..], &kw).ok()?;
            let mut outputs = vec![Some(result_of(sig))];
            for (p, e) in &sig.writes {
                // An optional argument passed as `None` is not written (and returns `None`).
                if !matches!(bound.get(*p), Some(Arg::Value(_))) {
                    outputs.push(Some(BoundOut::Nothing));
                } else {
                    outputs.push(Some(BoundOut::Expr(e)));
                }
            }
            (outputs.len() >= n).then(|| {
                outputs.truncate(n);
                Bound {
                    args: bound,
                    outputs,
                }
            })
        }
        // An identity writes nothing it does not hold already; which keyword it writes is
        // only certain when it has one tensor.
        OpMeaning::Identity => {
            let tensors: Vec<&Arg> = args[1..]
                .iter()
                .chain(kw.iter().map(|(_, a)| a))
                .filter(|a| matches!(a, Arg::Value(_)))
                .collect();
            let [t] = tensors.as_slice() else {
                return None;
            };
            (n <= 2).then(|| Bound {
                args: Vec::new(),
                outputs: [BoundOut::Nothing, BoundOut::Same((*t).clone())]
                    .into_iter()
                    .take(n)
                    .map(Some)
                    .collect(),
            })
        }
        OpMeaning::Decompose(_) => None,
    }
}

fn result_of(sig: &Signature) -> BoundOut<'_> {
    sig.returns
        .as_ref()
        .map_or(BoundOut::Nothing, BoundOut::Expr)
}

/// `auto_functionalized_v2(op, **kwargs, _all_bases=[...])` passes each written argument as a
/// base (`_<name>_base_index`) and returns the result followed by every base's new value.
/// Only writes to whole bases are inlined (a written view of a base, `_<name>_size` and the
/// like, is not); declared identities keep the engines' own handling of v2.
fn functionalized_v2<'a>(
    args: &[Arg],
    kwargs: &[(String, Arg)],
    n: usize,
    ops: &'a BTreeMap<String, OpMeaning>,
) -> Option<Bound<'a>> {
    let Some(Arg::Op(inner)) = args.first() else {
        return None;
    };
    let Some(OpMeaning::Decompose(DecompExpr::Signature(sig))) = meaning(ops, inner) else {
        return None;
    };
    let kwarg = |k: &str| kwargs.iter().find(|(n, _)| n == k).map(|(_, a)| a);
    let Some(Arg::List(bases)) = kwarg("_all_bases") else {
        return None;
    };
    let mut bound = sig.bind(&args[1..], &operator_kwargs(kwargs)).ok()?;
    let mut written: Vec<Option<&DecompExpr>> = vec![None; bases.len()];
    for (p, e) in &sig.writes {
        let name = &sig.params[*p];
        let view_keys = ["size", "stride", "storage_offset", "slice_dim"];
        if view_keys
            .iter()
            .any(|k| kwarg(&format!("_{name}_{k}")).is_some())
        {
            return None;
        }
        match kwarg(&format!("_{name}_base_index")) {
            Some(Arg::Int(b)) => {
                let b = usize::try_from(*b).ok().filter(|&b| b < bases.len())?;
                if written[b].is_some() {
                    return None;
                }
                written[b] = Some(e);
                bound[*p] = bases[b].clone();
            }
            // Not passed (an optional argument left out): not written.
            None | Some(Arg::None) => {}
            _ => return None,
        }
    }
    let mut outputs = vec![Some(result_of(sig))];
    for (b, base) in bases.iter().enumerate() {
        outputs.push(Some(match written[b] {
            Some(e) => BoundOut::Expr(e),
            None => BoundOut::Same(base.clone()),
        }));
    }
    (outputs.len() >= n).then(|| {
        outputs.truncate(n);
        Bound {
            args: bound,
            outputs,
        }
    })
}

/// `node` with its arguments renamed to the expanded graph's values; `None` when it reads a
/// value that no longer exists.
fn map_node(node: &Node, remap: &[Vec<Option<ValueId>>]) -> Option<Node> {
    let mut node = node.clone();
    if let NodeKind::Call { args, kwargs, .. } = &mut node.kind {
        for a in args.iter_mut() {
            map_arg(a, remap)?;
        }
        for (_, a) in kwargs.iter_mut() {
            map_arg(a, remap)?;
        }
    }
    Some(node)
}

fn map_arg(a: &mut Arg, remap: &[Vec<Option<ValueId>>]) -> Option<()> {
    match a {
        Arg::Value(v) => {
            *v = remap.get(v.node)?.get(v.output).copied().flatten()?;
        }
        Arg::List(items) => {
            for it in items {
                map_arg(it, remap)?;
            }
        }
        _ => {}
    }
    Some(())
}

/// Emits the calls computing output `k` of `node`; the last keeps the output's name, type and
/// location. `None` for an output that is nothing.
fn emit_output(
    g: &mut Graph,
    node: &Node,
    k: usize,
    src: Source,
    taken: &mut HashSet<String>,
) -> Option<ValueId> {
    let out = &node.outputs[k];
    let mut em = Emitter {
        g,
        node,
        base: out.name.clone(),
        taken,
    };
    match src {
        Source::Nothing => None,
        Source::Same(a) => Some(em.call_named(
            OpName::new("aten", "alias", "default"),
            vec![a],
            out.clone(),
        )),
        // A declared collective is synchronous where it is called (vLLM's all-reduce returns
        // the reduced tensor): the functional collective it names is waited on at once.
        Source::Expr(e @ DecompExpr::Call { op, .. }, bound)
            if op.namespace == "_c10d_functional" && op.name != "wait_tensor" =>
        {
            let issued = em.arg(e, bound);
            Some(em.call_named(
                OpName::new("_c10d_functional", "wait_tensor", "default"),
                vec![issued],
                out.clone(),
            ))
        }
        Source::Expr(DecompExpr::Call { op, args }, bound) => {
            let args: Vec<Arg> = args.iter().map(|e| em.arg(e, bound)).collect();
            Some(em.call_named(op.clone(), args, out.clone()))
        }
        Source::Expr(e, bound) => {
            let a = em.arg(e, bound);
            Some(em.call_named(
                OpName::new("aten", "alias", "default"),
                vec![a],
                out.clone(),
            ))
        }
    }
}

struct Emitter<'g, 'n, 't> {
    g: &'g mut Graph,
    node: &'n Node,
    base: String,
    taken: &'t mut HashSet<String>,
}

impl Emitter<'_, '_, '_> {
    /// The argument `e` stands for, emitting the calls it makes.
    fn arg(&mut self, e: &DecompExpr, bound: &[Arg]) -> Arg {
        match e {
            DecompExpr::Arg(i) => bound.get(*i).cloned().unwrap_or(Arg::None),
            DecompExpr::Int(i) => Arg::Int(*i),
            DecompExpr::Float(f) => Arg::Float(*f),
            DecompExpr::Bool(b) => Arg::Bool(*b),
            DecompExpr::Str(s) => Arg::Str(s.clone()),
            DecompExpr::List(items) => {
                Arg::List(items.iter().map(|x| self.arg(x, bound)).collect())
            }
            DecompExpr::Call { op, args } => {
                let args: Vec<Arg> = args.iter().map(|x| self.arg(x, bound)).collect();
                let name = self.fresh();
                let out = Output { name, ty: None };
                Arg::Value(self.call_named(op.clone(), args, out))
            }
            // The parser puts a signature only at the top of a meaning.
            DecompExpr::Signature(_) => Arg::None,
        }
    }

    fn fresh(&mut self) -> String {
        let mut k = 0usize;
        loop {
            let name = format!("{}_d{k}", self.base);
            if self.taken.insert(name.clone()) {
                return name;
            }
            k += 1;
        }
    }

    fn call_named(&mut self, op: OpName, args: Vec<Arg>, out: Output) -> ValueId {
        let i = self.g.push(Node {
            name: out.name.clone(),
            kind: NodeKind::Call {
                op,
                args,
                kwargs: Vec::new(),
            },
            outputs: vec![out],
            loc: self.node.loc.clone(),
            line: self.node.line,
        });
        ValueId::new(i, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(node: usize) -> Arg {
        Arg::Value(ValueId::new(node, 0))
    }

    fn input(name: &str) -> Node {
        Node {
            name: name.into(),
            kind: NodeKind::Input,
            outputs: vec![Output {
                name: name.into(),
                ty: None,
            }],
            loc: None,
            line: None,
        }
    }

    fn call(
        name: &str,
        op: OpName,
        args: Vec<Arg>,
        kwargs: Vec<(&str, Arg)>,
        outs: &[&str],
    ) -> Node {
        Node {
            name: name.into(),
            kind: NodeKind::Call {
                op,
                args,
                kwargs: kwargs
                    .into_iter()
                    .map(|(k, a)| (k.to_string(), a))
                    .collect(),
            },
            outputs: outs
                .iter()
                .map(|o| Output {
                    name: o.to_string(),
                    ty: None,
                })
                .collect(),
            loc: None,
            line: None,
        }
    }

    fn fused_add() -> BTreeMap<String, OpMeaning> {
        let add = DecompExpr::Call {
            op: OpName::new("aten", "add", "Tensor"),
            args: vec![DecompExpr::Arg(0), DecompExpr::Arg(1)],
        };
        let sig = Signature {
            params: vec!["input".into(), "residual".into(), "eps".into()],
            returns: None,
            writes: vec![
                (
                    0,
                    DecompExpr::Call {
                        op: OpName::new("aten", "relu", "default"),
                        args: vec![add.clone()],
                    },
                ),
                (1, add),
            ],
        };
        BTreeMap::from([(
            "_C.fused".to_string(),
            OpMeaning::Decompose(DecompExpr::Signature(Box::new(sig))),
        )])
    }

    #[test]
    fn v1_writes_become_calls_named_like_the_getitems() {
        let mut g = Graph::new("g");
        g.push(input("x"));
        g.push(input("r"));
        g.push(call(
            "af",
            OpName::new("higher_order", "auto_functionalized", ""),
            vec![Arg::Op(OpName::new("_C", "fused", "default"))],
            vec![
                ("input", v(0)),
                ("residual", v(1)),
                ("eps", Arg::Float(1e-6)),
            ],
            &["af[0]", "getitem_1", "getitem_2"],
        ));
        g.push(call(
            "out",
            OpName::new("aten", "mul", "Tensor"),
            vec![
                Arg::Value(ValueId::new(2, 1)),
                Arg::Value(ValueId::new(2, 2)),
            ],
            vec![],
            &["out"],
        ));
        g.inputs = vec![ValueId::new(0, 0), ValueId::new(1, 0)];
        g.outputs = vec![Some(ValueId::new(3, 0))];
        let e = expand_declared(&g, &fused_add()).unwrap();
        e.check_structure().unwrap();
        let ops: Vec<String> = e
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "{}={}",
                    n.name,
                    n.op().map_or("input".into(), |o| o.to_string())
                )
            })
            .collect();
        assert_eq!(
            ops,
            [
                "x=input",
                "r=input",
                "getitem_1_d0=aten.add.Tensor",
                "getitem_1=aten.relu.default",
                "getitem_2=aten.add.Tensor",
                "out=aten.mul.Tensor"
            ]
        );
        assert_eq!(e.nodes[5].args(), &[v(3), v(4)]);
        assert_eq!(e.outputs, vec![Some(ValueId::new(5, 0))]);
    }

    #[test]
    fn v2_writes_to_whole_bases_only() {
        let af = |extra: Vec<(&str, Arg)>| {
            let mut kw = vec![
                ("eps", Arg::Float(1e-6)),
                ("_input_base_index", Arg::Int(1)),
                ("_residual_base_index", Arg::Int(0)),
                ("_all_bases", Arg::List(vec![v(1), v(0)])),
            ];
            kw.extend(extra);
            let mut g = Graph::new("g");
            g.push(input("x"));
            g.push(input("r"));
            g.push(call(
                "af",
                OpName::new("higher_order", "auto_functionalized_v2", ""),
                vec![Arg::Op(OpName::new("_C", "fused", "default"))],
                kw,
                &["af[0]", "getitem_1", "getitem_2"],
            ));
            g.outputs = vec![Some(ValueId::new(2, 1)), Some(ValueId::new(2, 2))];
            g
        };
        let e = expand_declared(&af(vec![]), &fused_add()).unwrap();
        // Base 0 is the residual (r): x + r; base 1 the input: relu(x + r).
        let last = |name: &str| e.nodes.iter().find(|n| n.name == name).unwrap();
        assert_eq!(last("getitem_1").op().unwrap().name, "add");
        assert_eq!(last("getitem_1").args(), &[v(0), v(1)]);
        assert_eq!(last("getitem_2").op().unwrap().name, "relu");
        assert!(
            expand_declared(&af(vec![("_input_size", Arg::List(vec![]))]), &fused_add()).is_none()
        );
    }

    #[test]
    fn unfit_calls_stay() {
        let mut g = Graph::new("g");
        g.push(input("x"));
        g.push(call(
            "af",
            OpName::new("higher_order", "auto_functionalized", ""),
            vec![Arg::Op(OpName::new("_C", "fused", "default"))],
            vec![("input", v(0)), ("other", v(0))],
            &["af[0]", "getitem_1"],
        ));
        assert!(expand_declared(&g, &fused_add()).is_none());
    }
}
