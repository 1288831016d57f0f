//! HLO syntax tree to the shardproof IR: each instruction becomes the registry's operators (see
//! `docs/formats/hlo.md` for the table), literal integer arithmetic (the partitioner's
//! `partition-id` offset tables) is folded, and anything else becomes an opaque `hlo.*` call.

use super::groups::{group_name, parse_groups, GroupSpec};
use super::lex::{Tok, Token};
use super::lit::{Lit, LitData, FOLD_LIMIT};
use super::parse::{perr, Attr, Computation, Instr, Module, PErr, Shape};
use shardproof_ir::{
    Arg, DType, Graph, Node, NodeKind, OpName, Output, SourceLoc, TensorType, ValueId,
};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// The element type of an HLO element type name, where the IR has it.
pub(crate) fn elem_dtype(elem: &str) -> Option<DType> {
    Some(match elem {
        "pred" => DType::Bool,
        "s8" => DType::I8,
        "s16" => DType::I16,
        "s32" => DType::I32,
        "s64" => DType::I64,
        "u8" => DType::U8,
        "f16" => DType::F16,
        "bf16" => DType::Bf16,
        "f32" => DType::F32,
        "f64" => DType::F64,
        "f8e4m3fn" => DType::F8e4m3,
        "f8e5m2" => DType::F8e5m2,
        _ => return None,
    })
}

fn is_int_elem(elem: &str) -> bool {
    elem.starts_with('s') || elem.starts_with('u')
}

/// A value of the HLO program while it is lowered.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    /// A value of the graph, with its element type name and dims.
    Ir(ValueId, String, Vec<i64>),
    /// A literal known at import time (constants and integer arithmetic on them).
    Lit(Rc<Lit>),
    /// A tuple.
    Tuple(Vec<Val>),
}

pub(crate) struct Lowerer<'m> {
    pub m: &'m Module,
    comps: HashMap<&'m str, usize>,
    pub g: Graph,
    names: HashSet<String>,
    pub device: Option<usize>,
    /// Literals already built in the graph; the `Rc` keeps each key's address from being reused.
    materialized: HashMap<*const Lit, (Rc<Lit>, ValueId)>,
    depth: usize,
}

type R<T> = Result<T, PErr>;

fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 'v');
    }
    let reserved = |p: &str| {
        s.strip_prefix(p)
            .is_some_and(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_digit()))
    };
    if reserved("arg") || reserved("out") {
        s.insert_str(0, "h_");
    }
    s
}

fn ints(v: &[i64]) -> Arg {
    Arg::List(v.iter().map(|&i| Arg::Int(i)).collect())
}

fn tt(elem: &str, dims: &[i64]) -> Option<TensorType> {
    elem_dtype(elem).map(|d| TensorType::new(d, dims))
}

/// Text of an attribute's tokens, as a kwarg of an opaque call.
fn attr_text(toks: &[Token]) -> String {
    let mut s = String::new();
    for t in toks {
        match &t.tok {
            Tok::Word(w) => {
                if s.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                    s.push(' ');
                }
                s.push_str(w)
            }
            Tok::Str(x) => {
                s.push('"');
                s.push_str(x);
                s.push('"')
            }
            Tok::Punct(p) => s.push_str(p),
        }
    }
    s
}

/// `{1,0}` or `{}`: a list of integers.
pub(crate) fn int_list(a: &Attr, line: usize) -> R<Vec<i64>> {
    let hint = "expected a list of integers such as `{1,0}`";
    let t = &a.toks;
    let bad = || {
        perr(
            line,
            a.col,
            format!("attribute `{}` is not a list of integers", a.key),
            hint,
        )
    };
    if t.len() < 2 || !t[0].is_punct("{") || !t[t.len() - 1].is_punct("}") {
        return Err(bad());
    }
    let mut out = Vec::new();
    for (i, tok) in t[1..t.len() - 1].iter().enumerate() {
        if i % 2 == 1 {
            if !tok.is_punct(",") {
                return Err(bad());
            }
        } else {
            out.push(tok.word().and_then(|w| w.parse().ok()).ok_or_else(bad)?);
        }
    }
    Ok(out)
}

impl<'m> Lowerer<'m> {
    pub(crate) fn new(m: &'m Module, name: &str, device: Option<usize>) -> Self {
        let comps = m
            .computations
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.as_str(), i))
            .collect();
        Lowerer {
            m,
            comps,
            g: Graph::new(name),
            names: HashSet::new(),
            device,
            materialized: HashMap::new(),
            depth: 0,
        }
    }

    fn fresh(&mut self, base: &str) -> String {
        let base = sanitize(base);
        let mut name = base.clone();
        let mut k = 1;
        while self.names.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.names.insert(name.clone());
        name
    }

    fn loc(&self, ins: &Instr) -> Option<SourceLoc> {
        let meta = ins.attr("metadata")?;
        let mut kv: HashMap<&str, String> = HashMap::new();
        let t = &meta.toks;
        let mut i = 0;
        while i + 2 < t.len() {
            if let (Some(k), true) = (t[i].word(), t[i + 1].is_punct("=")) {
                let v = match &t[i + 2].tok {
                    Tok::Word(w) | Tok::Str(w) => w.clone(),
                    Tok::Punct(_) => String::new(),
                };
                kv.insert(k, v);
                i += 3;
            } else {
                i += 1;
            }
        }
        let code = kv.get("op_name").cloned().unwrap_or_default();
        if let (Some(f), Some(l)) = (kv.get("source_file"), kv.get("source_line")) {
            return Some(SourceLoc {
                file: f.clone(),
                line: l.parse().ok()?,
                function: String::new(),
                code,
            });
        }
        let frame: i64 = kv.get("stack_frame_id")?.parse().ok()?;
        let tables = &self.m.tables;
        let loc = tables.frames.get(&frame)?;
        let (file, func, line) = tables.locations.get(loc)?;
        Some(SourceLoc {
            file: tables.files.get(file)?.clone(),
            line: u32::try_from(*line).ok()?,
            function: tables.functions.get(func).cloned().unwrap_or_default(),
            code,
        })
    }

    /// Appends a call node with one output and returns its value.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn call(
        &mut self,
        ins: &Instr,
        suffix: &str,
        op: &str,
        args: Vec<Arg>,
        kwargs: Vec<(String, Arg)>,
        elem: &str,
        dims: &[i64],
    ) -> Val {
        let base = if suffix.is_empty() {
            ins.name.clone()
        } else {
            format!("{}_{suffix}", ins.name)
        };
        let name = self.fresh(&base);
        let op = OpName::parse(op).expect("operator names here are well formed");
        let node = Node {
            name: name.clone(),
            kind: NodeKind::Call { op, args, kwargs },
            outputs: vec![Output {
                name,
                ty: tt(elem, dims),
            }],
            loc: self.loc(ins),
            line: Some(ins.line),
        };
        let i = self.g.push(node);
        Val::Ir(ValueId::new(i, 0), elem.to_string(), dims.to_vec())
    }

    /// A graph value for `v` (literals become constant-building calls).
    pub(crate) fn value(&mut self, ins: &Instr, v: &Val) -> R<(ValueId, String, Vec<i64>)> {
        match v {
            Val::Ir(id, e, d) => Ok((*id, e.clone(), d.clone())),
            Val::Tuple(_) => Err(perr(
                ins.line,
                ins.col,
                format!(
                    "`{}` reads a tuple where an array is expected",
                    crate::excerpt(&ins.name)
                ),
                "take an element with get-tuple-element first",
            )),
            Val::Lit(l) => {
                let key = Rc::as_ptr(l);
                if let Some((_, id)) = self.materialized.get(&key) {
                    return Ok((*id, l.elem.clone(), l.dims.clone()));
                }
                let out = self.materialize(ins, l);
                let Val::Ir(id, e, d) = out else {
                    unreachable!("materialize returns a graph value")
                };
                self.materialized.insert(key, (Rc::clone(l), id));
                Ok((id, e, d))
            }
        }
    }

    fn scalar_arg(l: &Lit, v: f64) -> Arg {
        if l.elem == "pred" {
            Arg::Bool(v != 0.0)
        } else if is_int_elem(&l.elem) {
            Arg::Int(v as i64)
        } else {
            Arg::Float(v)
        }
    }

    fn materialize(&mut self, ins: &Instr, l: &Lit) -> Val {
        let dtype = elem_dtype(&l.elem);
        let dkw = |d: Option<DType>| {
            d.map(|d| vec![("dtype".to_string(), Arg::Dtype(d))])
                .unwrap_or_default()
        };
        if dtype.is_none() {
            return self.opaque_named(ins, "hlo.constant.default", vec![], &l.elem, &l.dims);
        }
        if let Some(v) = l.uniform() {
            let s = Self::scalar_arg(l, v);
            if l.dims.is_empty() {
                return self.call(
                    ins,
                    "const",
                    "aten.scalar_tensor.default",
                    vec![s],
                    dkw(dtype),
                    &l.elem,
                    &[],
                );
            }
            return self.call(
                ins,
                "const",
                "aten.full.default",
                vec![ints(&l.dims), s],
                dkw(dtype),
                &l.elem,
                &l.dims,
            );
        }
        let LitData::Dense(data) = &l.data else {
            unreachable!("a non-uniform literal is dense")
        };
        if data.len() > 64 {
            return self.opaque_named(ins, "hlo.constant.default", vec![], &l.elem, &l.dims);
        }
        let mut parts = Vec::new();
        for &v in data.iter() {
            let Val::Ir(id, ..) = self.call(
                ins,
                "elem",
                "aten.scalar_tensor.default",
                vec![Self::scalar_arg(l, v)],
                dkw(dtype),
                &l.elem,
                &[],
            ) else {
                unreachable!()
            };
            parts.push(Arg::Value(id));
        }
        let n = data.len() as i64;
        let stacked = self.call(
            ins,
            "const",
            "aten.stack.default",
            vec![Arg::List(parts)],
            vec![],
            &l.elem,
            &[n],
        );
        if l.dims.len() == 1 {
            return stacked;
        }
        let Val::Ir(id, ..) = stacked else {
            unreachable!()
        };
        self.call(
            ins,
            "const",
            "aten.reshape.default",
            vec![Arg::Value(id), ints(&l.dims)],
            vec![],
            &l.elem,
            &l.dims,
        )
    }

    fn opaque_named(
        &mut self,
        ins: &Instr,
        op: &str,
        args: Vec<Arg>,
        elem: &str,
        dims: &[i64],
    ) -> Val {
        let kwargs = ins
            .attrs
            .iter()
            .filter(|a| a.key != "metadata" && a.key != "backend_config")
            .map(|a| (a.key.clone(), Arg::Str(attr_text(&a.toks))))
            .collect();
        self.call(ins, "", op, args, kwargs, elem, dims)
    }

    /// An opaque call `hlo.<opcode>` reading the operands, with the instruction's type.
    pub(crate) fn opaque(&mut self, ins: &Instr, ops: &[Val]) -> R<Val> {
        let mut args = Vec::new();
        for v in ops {
            args.push(self.opaque_arg(ins, v)?);
        }
        let opname = ins.opcode.replace('-', "_");
        let overload = if ins.opcode == "custom-call" {
            ins.attr("custom_call_target")
                .and_then(|a| match a.toks.first().map(|t| &t.tok) {
                    Some(Tok::Str(s)) => Some(
                        s.chars()
                            .map(|c| {
                                if c.is_ascii_alphanumeric() || c == '_' {
                                    c
                                } else {
                                    '_'
                                }
                            })
                            .collect::<String>(),
                    ),
                    _ => None,
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".into())
        } else {
            "default".into()
        };
        let op = OpName::new("hlo", &opname, &overload);
        let kwargs: Vec<(String, Arg)> = ins
            .attrs
            .iter()
            .filter(|a| a.key != "metadata" && a.key != "backend_config")
            .map(|a| (a.key.clone(), Arg::Str(attr_text(&a.toks))))
            .collect();
        let mut leaves = Vec::new();
        flatten_shape(&ins.shape, &mut leaves);
        let name = self.fresh(&ins.name);
        let outputs: Vec<Output> = if matches!(ins.shape, Shape::Tuple(_)) {
            leaves
                .iter()
                .enumerate()
                .map(|(k, s)| Output {
                    name: self.fresh(&format!("{name}_{k}")),
                    ty: leaf_type(s),
                })
                .collect()
        } else {
            vec![Output {
                name: name.clone(),
                ty: leaves.first().and_then(|s| leaf_type(s)),
            }]
        };
        let node = Node {
            name,
            kind: NodeKind::Call { op, args, kwargs },
            outputs,
            loc: self.loc(ins),
            line: Some(ins.line),
        };
        let i = self.g.push(node);
        let mut k = 0;
        Ok(rebuild(&ins.shape, i, &mut k))
    }

    fn opaque_arg(&mut self, ins: &Instr, v: &Val) -> R<Arg> {
        Ok(match v {
            Val::Tuple(items) => {
                let mut out = Vec::new();
                for x in items {
                    out.push(self.opaque_arg(ins, x)?);
                }
                Arg::List(out)
            }
            _ => Arg::Value(self.value(ins, v)?.0),
        })
    }

    pub(crate) fn computation(&self, ins: &Instr, key: &str) -> R<&'m Computation> {
        let a = ins.attr(key).ok_or_else(|| {
            perr(
                ins.line,
                ins.col,
                format!("`{}` needs a `{key}=` attribute", ins.opcode),
                "name the called computation",
            )
        })?;
        let name = a.toks.first().and_then(Token::word).unwrap_or("");
        match self.comps.get(name) {
            Some(&i) => Ok(&self.m.computations[i]),
            None => Err(perr(
                ins.line,
                a.toks.first().map_or(a.col, |t| t.col),
                format!("unknown computation `{}`", crate::excerpt(name)),
                "a called computation must be defined in the module",
            )),
        }
    }

    /// Lowers a computation with the given parameter values; returns its root's value.
    pub(crate) fn lower_comp(&mut self, comp: &'m Computation, params: &[Val]) -> R<Val> {
        self.depth += 1;
        if self.depth > 64 {
            return Err(perr(
                comp.line,
                1,
                format!(
                    "computation `{}` calls itself (or nests more than 64 deep)",
                    crate::excerpt(&comp.name)
                ),
                "HLO computations do not recurse",
            ));
        }
        let mut env: HashMap<&str, Val> = HashMap::new();
        for ins in &comp.instrs {
            let mut ops = Vec::with_capacity(ins.operands.len());
            for o in &ins.operands {
                match env.get(o.as_str()) {
                    Some(v) => ops.push(v.clone()),
                    None => {
                        return Err(perr(
                            ins.line,
                            ins.col,
                            format!("operand `{}` of `{}` is not defined before it", crate::excerpt(o), crate::excerpt(&ins.name)),
                            "an instruction may only read instructions of its computation printed above it",
                        ))
                    }
                }
            }
            let v = if ins.opcode == "parameter" {
                let n = param_number(ins)?;
                params.get(n).cloned().ok_or_else(|| {
                    perr(
                        ins.line,
                        ins.col,
                        format!(
                            "parameter({n}) but the computation is called with {} operands",
                            params.len()
                        ),
                        "the caller passes one operand per parameter",
                    )
                })?
            } else {
                self.instr(ins, &ops)?
            };
            env.insert(ins.name.as_str(), v);
        }
        self.depth -= 1;
        let root = &comp.instrs[comp.root];
        Ok(env
            .remove(root.name.as_str())
            .expect("the root was lowered"))
    }

    /// Entry parameters become graph inputs `arg0`, `arg1`, ... (tuple leaves `argN_K`).
    pub(crate) fn inputs(&mut self, entry: &Computation) -> R<Vec<Val>> {
        let mut params: Vec<(usize, &Instr)> = Vec::new();
        for ins in entry.instrs.iter().filter(|i| i.opcode == "parameter") {
            let n = param_number(ins)?;
            if params.iter().any(|(m, _)| *m == n) {
                return Err(perr(
                    ins.line,
                    ins.col,
                    format!("parameter({n}) appears twice"),
                    "each parameter number appears once",
                ));
            }
            params.push((n, ins));
        }
        params.sort_by_key(|(n, _)| *n);
        let mut vals = Vec::new();
        for (k, (n, ins)) in params.iter().enumerate() {
            if *n != k {
                return Err(perr(
                    ins.line,
                    ins.col,
                    format!("parameter({k}) is missing"),
                    "parameters are numbered from 0 without gaps",
                ));
            }
            let v = self.input(ins, &ins.shape, &format!("arg{n}"))?;
            vals.push(v);
        }
        Ok(vals)
    }

    fn input(&mut self, ins: &Instr, shape: &Shape, name: &str) -> R<Val> {
        match shape {
            Shape::Tuple(parts) => {
                let mut out = Vec::new();
                for (k, p) in parts.iter().enumerate() {
                    out.push(self.input(ins, p, &format!("{name}_{k}"))?);
                }
                Ok(Val::Tuple(out))
            }
            Shape::Array {
                elem,
                dims,
                dynamic,
                ..
            } => {
                if *dynamic {
                    return Err(perr(
                        ins.line,
                        ins.col,
                        "dynamic shapes (`<=N`, `?`) are not supported",
                        "capture with static shapes",
                    ));
                }
                self.names.insert(name.to_string());
                let i = self.g.push(Node {
                    name: name.to_string(),
                    kind: NodeKind::Input,
                    outputs: vec![Output {
                        name: name.to_string(),
                        ty: tt(elem, dims),
                    }],
                    loc: self.loc(ins),
                    line: Some(ins.line),
                });
                self.g.inputs.push(ValueId::new(i, 0));
                Ok(Val::Ir(ValueId::new(i, 0), elem.clone(), dims.clone()))
            }
        }
    }

    /// Makes the root's leaves the graph outputs, named `out0`, `out1`, ...
    pub(crate) fn outputs(&mut self, ins: &Instr, root: &Val) -> R<()> {
        let mut leaves = Vec::new();
        flatten_val(root, &mut leaves);
        let mut used = HashSet::new();
        for (k, leaf) in leaves.iter().enumerate() {
            let (id, elem, dims) = self.value(ins, leaf)?;
            let name = format!("out{k}");
            let node = &self.g.nodes[id.node];
            let renamable = matches!(node.kind, NodeKind::Call { .. })
                && node.outputs.len() == 1
                && !used.contains(&id.node);
            let id = if renamable {
                id
            } else {
                let Val::Ir(a, ..) = self.call(
                    ins,
                    "out",
                    "aten.alias.default",
                    vec![Arg::Value(id)],
                    vec![],
                    &elem,
                    &dims,
                ) else {
                    unreachable!()
                };
                a
            };
            used.insert(id.node);
            let node = &mut self.g.nodes[id.node];
            self.names.remove(&node.name);
            node.name = name.clone();
            node.outputs[0].name = name.clone();
            self.names.insert(name);
            self.g.outputs.push(Some(id));
        }
        Ok(())
    }

    fn lit_of(v: &Val) -> Option<&Rc<Lit>> {
        match v {
            Val::Lit(l) => Some(l),
            _ => None,
        }
    }

    /// Integer literal scalar operand `k` of `ins` (a dynamic-slice offset), if known.
    fn lit_int(v: &Val) -> Option<i64> {
        let l = Self::lit_of(v)?;
        if l.dims.iter().product::<i64>() != 1 {
            return None;
        }
        l.get(0).map(|x| x as i64)
    }

    fn instr(&mut self, ins: &Instr, ops: &[Val]) -> R<Val> {
        super::ops::lower_instr(self, ins, ops)
    }

    pub(crate) fn groups(&self, ins: &Instr) -> R<Option<(String, i64)>> {
        let Some(spec) = parse_groups(self.m, ins)? else {
            return Ok(None);
        };
        let GroupSpec { groups } = spec;
        let name = group_name(&groups);
        let size = match self.device {
            Some(d) => match groups.iter().find(|g| g.contains(&d)) {
                Some(g) => g.len(),
                None => return Ok(None),
            },
            None => {
                let n = groups.first().map_or(1, Vec::len);
                if groups.iter().any(|g| g.len() != n) {
                    return Ok(None);
                }
                n
            }
        };
        Ok(Some((name, size as i64)))
    }

    pub(crate) fn dyn_offsets(ops: &[Val]) -> Option<Vec<i64>> {
        ops.iter().map(Self::lit_int).collect()
    }

    pub(crate) fn lit(v: &Val) -> Option<&Rc<Lit>> {
        Self::lit_of(v)
    }

    pub(crate) fn fold_limit() -> usize {
        FOLD_LIMIT
    }
}

fn param_number(ins: &Instr) -> R<usize> {
    match ins.inner.as_slice() {
        [t] => t.word().and_then(|w| w.parse().ok()).ok_or_else(|| {
            perr(
                ins.line,
                t.col,
                "expected a parameter number",
                "a parameter reads `parameter(0)`",
            )
        }),
        _ => Err(perr(
            ins.line,
            ins.col,
            "expected one parameter number",
            "a parameter reads `parameter(0)`",
        )),
    }
}

fn flatten_shape<'s>(s: &'s Shape, out: &mut Vec<&'s Shape>) {
    match s {
        Shape::Tuple(parts) => parts.iter().for_each(|p| flatten_shape(p, out)),
        a => out.push(a),
    }
}

fn leaf_type(s: &Shape) -> Option<TensorType> {
    match s {
        Shape::Array {
            elem,
            dims,
            dynamic: false,
            ..
        } => tt(elem, dims),
        _ => None,
    }
}

fn rebuild(s: &Shape, node: usize, k: &mut usize) -> Val {
    match s {
        Shape::Tuple(parts) if *k == 0 && parts.is_empty() => Val::Tuple(vec![]),
        Shape::Tuple(parts) => Val::Tuple(parts.iter().map(|p| rebuild(p, node, k)).collect()),
        Shape::Array { elem, dims, .. } => {
            let v = Val::Ir(ValueId::new(node, *k), elem.clone(), dims.clone());
            *k += 1;
            v
        }
    }
}

pub(crate) fn flatten_val(v: &Val, out: &mut Vec<Val>) {
    match v {
        Val::Tuple(items) => items.iter().for_each(|x| flatten_val(x, out)),
        x => out.push(x.clone()),
    }
}
