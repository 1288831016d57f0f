//! Lowering a parsed plan to the shared IR: the mesh, one process group per mesh dim (and the
//! declared ones), one graph per rank (the statements of the `on` blocks that hold it, with
//! local shapes), and the input placements and output expectations of a [`Case`], so that
//! every check runs on it unchanged.

use super::syntax::{Call, Expr, ExprKind, Name, PlacedOn, PlanAst, Restriction, Stmt, StmtKind};
use shardproof_case::{
    Assumptions, Blocks, Case, CaseFile, GraphRef, Held, ImplSpec, InputRelation, Layout,
    OutputExpectation, PlacedLayout, Placement,
};
use shardproof_ir::{
    Arg, DType, DecompExpr, Graph, Located, Mesh, Node, NodeKind, OpMeaning, OpName, Output,
    ProcessGroup, Program, SourceError, Span, TensorType, ValueId,
};
use shardproof_ops::Registry;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

/// The most ranks a plan may have: hand-written plans are small; a bigger mesh is a typo.
const MAX_RANKS: usize = 4096;

/// A process group: its mesh dims and its size.
struct GroupInfo {
    size: usize,
}

struct Lowering<'a> {
    file: &'a Path,
    mesh: Mesh,
    groups: BTreeMap<String, GroupInfo>,
    registry: &'static Registry,
}

fn err(file: &Path, span: Span, message: impl Into<String>, hint: &str) -> SourceError {
    SourceError::new(file, Some(span), message).with_hint(hint)
}

/// The collectives the plan names by their short forms: (plan name, c10d name, takes a
/// reduction, asynchronous).
const COLLECTIVES: &[(&str, &str, bool, bool)] = &[
    ("all_reduce", "all_reduce", true, false),
    ("all_reduce_async", "all_reduce", true, true),
    ("all_gather", "all_gather_into_tensor", false, false),
    ("all_gather_async", "all_gather_into_tensor", false, true),
    ("reduce_scatter", "reduce_scatter_tensor", true, false),
    ("reduce_scatter_async", "reduce_scatter_tensor", true, true),
];

/// Short operator names that are not `aten.NAME.*`.
const ALIASES: &[(&str, &str)] = &[
    ("matmul", "aten.matmul.default"),
    ("linear", "aten.linear.default"),
    ("softmax", "aten.softmax.int"),
    ("log_softmax", "aten.log_softmax.int"),
    ("layer_norm", "aten.layer_norm.default"),
    ("rms_norm", "aten.rms_norm.default"),
    ("transpose", "aten.transpose.int"),
];

impl Lowering<'_> {
    fn err(&self, span: Span, message: impl Into<String>, hint: &str) -> SourceError {
        err(self.file, span, message, hint)
    }

    fn dim_index(&self, name: &Name) -> Result<usize, SourceError> {
        self.mesh.dim_index(&name.text).ok_or_else(|| {
            let dims: Vec<&str> = self.mesh.dims.iter().map(|(d, _)| d.as_str()).collect();
            self.err(
                name.span,
                format!("`{}` is not a mesh dim", name.text),
                &format!("the mesh dims are {}", dims.join(", ")),
            )
        })
    }

    /// Whether `stmt` runs on the rank at `coords`.
    fn holds(&self, on: &[Restriction], coords: &[usize]) -> bool {
        on.iter().all(|r| {
            self.mesh
                .dim_index(&r.dim.text)
                .is_some_and(|m| r.coords.contains(&coords[m]))
        })
    }

    fn check_restrictions(&self, on: &[Restriction]) -> Result<(), SourceError> {
        for r in on {
            let m = self.dim_index(&r.dim)?;
            let size = self.mesh.dims[m].1;
            if let Some(&c) = r.coords.iter().find(|&&c| c >= size) {
                return Err(self.err(
                    r.dim.span,
                    format!(
                        "coordinate {c} is outside mesh dim `{}` of size {size}",
                        r.dim.text
                    ),
                    &format!("coordinates along `{}` are 0 to {}", r.dim.text, size - 1),
                ));
            }
        }
        Ok(())
    }

    /// Per mesh dim, the placement an `input` or `output` line gives (unnamed dims are
    /// replicated; dims its `on` block restricts are where it lives, not how it is placed).
    fn placements(
        &self,
        placed: &[PlacedOn],
        on: &[Restriction],
    ) -> Result<PlacedLayout, SourceError> {
        let nd = self.mesh.dims.len();
        let mut placements = vec![Placement::Replicate; nd];
        let mut given = vec![false; nd];
        for p in placed {
            let m = self.dim_index(&p.dim)?;
            if given[m] {
                return Err(self.err(
                    p.dim.span,
                    format!("mesh dim `{}` is placed twice", p.dim.text),
                    "give one placement per mesh dim",
                ));
            }
            if on.iter().any(|r| r.dim.text == p.dim.text) && p.placement != Placement::Replicate {
                return Err(self.err(
                    p.dim.span,
                    format!(
                        "the `on` block says which coordinates of `{}` hold this tensor; it has no placement along it",
                        p.dim.text
                    ),
                    "drop this placement (or move the line out of the block)",
                ));
            }
            given[m] = true;
            placements[m] = p.placement;
        }
        let at = on
            .iter()
            .map(|r| Held {
                dim: self.mesh.dim_index(&r.dim.text).unwrap_or(0),
                name: r.dim.text.clone(),
                coords: r.coords.clone(),
            })
            .collect();
        Ok(PlacedLayout {
            placements,
            blocks: Blocks::NONE,
            at,
        })
    }

    /// The local shape of a global `shape` laid out by `layout`.
    fn local_shape(
        &self,
        name: &Name,
        shape: &[i64],
        layout: &PlacedLayout,
    ) -> Result<Vec<i64>, SourceError> {
        let mut local = shape.to_vec();
        for (m, p) in layout.placements.iter().enumerate() {
            if let Placement::Shard(d) = *p {
                let (dim, size) = &self.mesh.dims[m];
                if d >= shape.len() {
                    return Err(self.err(
                        name.span,
                        format!(
                            "`{}` has {} dims, so it has no dim {d} to shard over `{dim}`",
                            name.text,
                            shape.len()
                        ),
                        "shard a dim the tensor has (dims count from 0)",
                    ));
                }
                if local[d] % *size as i64 != 0 {
                    return Err(self.err(
                        name.span,
                        format!(
                            "dim {d} of `{}` has {} elements here, not divisible by the {size} coordinates of `{dim}`",
                            name.text, local[d]
                        ),
                        "shard a dim whose size the mesh dim divides",
                    ));
                }
                local[d] /= *size as i64;
            }
        }
        Ok(local)
    }

    /// The global rank at `coords` with the peer arguments (`pp=1`, `pp=+1`, `cp=-1`) applied.
    fn peer(
        &self,
        call: &Call,
        coords: &[usize],
        keys: &[&str],
    ) -> Result<(usize, i64), SourceError> {
        let hint = "name the peer by its coordinate along a mesh dim: `pp=1` (absolute) or \
                    `pp=+1`, `cp=-1` (relative, wrapping around)";
        let mut c = coords.to_vec();
        let mut tag = 0;
        let mut any = false;
        for (key, value) in &call.kwargs {
            if keys.contains(&key.text.as_str()) {
                continue;
            }
            if key.text == "tag" {
                match value.kind {
                    ExprKind::Int { value: t, .. } => tag = t,
                    _ => {
                        return Err(self.err(
                            value.span,
                            "`tag` must be an integer",
                            "write `tag=0`",
                        ))
                    }
                }
                continue;
            }
            let m = self.dim_index(key)?;
            let size = self.mesh.dims[m].1 as i64;
            let ExprKind::Int { value: k, signed } = value.kind else {
                return Err(self.err(value.span, "expected a coordinate", hint));
            };
            let target = if signed {
                (c[m] as i64 + k).rem_euclid(size)
            } else {
                k
            };
            if !(0..size).contains(&target) {
                return Err(self.err(
                    value.span,
                    format!(
                        "coordinate {target} is outside mesh dim `{}` of size {size}",
                        key.text
                    ),
                    hint,
                ));
            }
            c[m] = target as usize;
            any = true;
        }
        if !any {
            return Err(self.err(
                call.op.span,
                format!("`{}` names no peer", call.op.text),
                hint,
            ));
        }
        Ok((self.mesh.rank(&c), tag))
    }

    /// Resolves an operator name: a full `namespace.name[.overload]`, an alias, or
    /// `aten.NAME.OVERLOAD` (`default`, else the only overload, else `Scalar` when the second
    /// argument is a number, else `Tensor`).
    fn resolve(&self, call: &Call) -> Result<OpName, SourceError> {
        let name = &call.op.text;
        let unknown =
            |hint: String| self.err(call.op.span, format!("unknown operator `{name}`"), &hint);
        if let Some((_, full)) = ALIASES.iter().find(|(a, _)| a == name) {
            return OpName::parse(full).ok_or_else(|| unknown(String::new()));
        }
        if name.contains('.') {
            let parts: Vec<&str> = name.split('.').collect();
            let op = match parts.as_slice() {
                [ns, n] => OpName::new(ns, n, "default"),
                [ns, n, o] => OpName::new(ns, n, o),
                _ => {
                    return Err(unknown(
                        "write `namespace.name` or `namespace.name.overload`".into(),
                    ))
                }
            };
            return match self.registry.get(&op) {
                Some(_) => Ok(op),
                None => Err(unknown(
                    "the registry has no such operator (`shardproof ops` lists them)".into(),
                )),
            };
        }
        let prefix = format!("aten.{name}.");
        let all: Vec<&shardproof_ops::OpDef> = self
            .registry
            .iter()
            .filter(|d| d.name.to_string().starts_with(&prefix))
            .collect();
        // Overloads that take this many positional arguments (and these keywords), if any.
        let fits = |d: &&shardproof_ops::OpDef| {
            let positional: Vec<_> = d.schema.args.iter().filter(|a| !a.kw_only).collect();
            let required = positional
                .iter()
                .filter(|a| a.default.is_none() && !a.optional)
                .count();
            (d.schema.variadic || call.args.len() <= positional.len())
                && call.args.len() + call.kwargs.len() >= required
                && call
                    .kwargs
                    .iter()
                    .all(|(k, _)| d.schema.args.iter().any(|a| a.name == k.text))
        };
        let fitting: Vec<String> = all
            .iter()
            .filter(|d| fits(d))
            .map(|d| d.name.to_string())
            .collect();
        let found: Vec<String> = if fitting.is_empty() {
            all.iter().map(|d| d.name.to_string()).collect()
        } else {
            fitting
        };
        let scalar_second = matches!(
            call.args.get(1).map(|a| &a.kind),
            Some(ExprKind::Int { .. } | ExprKind::Float(_))
        );
        let pick = |o: &str| found.iter().find(|f| f.ends_with(&format!(".{o}")));
        let chosen = if found.len() == 1 {
            found.first()
        } else if scalar_second && pick("Scalar").is_some() {
            pick("Scalar")
        } else {
            pick("default").or_else(|| pick("Tensor"))
        };
        match chosen {
            Some(full) => OpName::parse(full).ok_or_else(|| unknown(String::new())),
            None if found.is_empty() => Err(unknown(
                "a short name means `aten.NAME`; other operators need their full name \
                 (`_c10d_functional.all_to_all_single`, `shardproof_p2p.send`)"
                    .into(),
            )),
            None => Err(unknown(format!(
                "several overloads: write one of {}",
                found.join(", ")
            ))),
        }
    }
}

/// One rank's graph under construction.
struct RankGraph {
    graph: Graph,
    env: HashMap<String, ValueId>,
    defined_at: HashMap<String, usize>,
    coords: Vec<usize>,
    rank: usize,
}

impl RankGraph {
    fn where_(&self, mesh: &Mesh) -> String {
        let c: Vec<String> = mesh
            .dims
            .iter()
            .zip(&self.coords)
            .map(|((d, _), c)| format!("{d}={c}"))
            .collect();
        format!("rank {} ({})", self.rank, c.join(" "))
    }

    /// A fresh node name based on `base`.
    fn fresh(&self, base: &str) -> String {
        if !self.defined_at.contains_key(base) {
            return base.to_string();
        }
        (2..)
            .map(|k| format!("{base}_{k}"))
            .find(|n| !self.defined_at.contains_key(n))
            .unwrap_or_default()
    }

    fn define(
        &mut self,
        file: &Path,
        name: &Name,
        node_name: String,
        kind: NodeKind,
        outputs: Vec<Output>,
        line: usize,
    ) -> Result<usize, SourceError> {
        if let Some(&l) = self.defined_at.get(&node_name) {
            return Err(err(
                file,
                name.span,
                format!("`{node_name}` is already defined at line {l}"),
                "a plan assigns each name once: pick a new name",
            ));
        }
        for o in &outputs {
            if o.name != node_name {
                if let Some(&l) = self.defined_at.get(&o.name) {
                    return Err(err(
                        file,
                        name.span,
                        format!("`{}` is already defined at line {l}", o.name),
                        "a plan assigns each name once: pick a new name",
                    ));
                }
            }
        }
        let i = self.graph.push(Node {
            name: node_name.clone(),
            kind,
            outputs,
            loc: None,
            line: Some(line),
        });
        self.defined_at.insert(node_name, line);
        for o in &self.graph.nodes[i].outputs {
            self.defined_at.insert(o.name.clone(), line);
        }
        Ok(i)
    }
}

/// Lowers a parsed plan to a case.
pub(super) fn lower(file: &Path, ast: &PlanAst) -> Result<Case, SourceError> {
    let mesh = Mesh::new(ast.mesh.iter().map(|(n, s)| (n.text.clone(), *s)).collect());
    let mesh_span = ast.mesh_span.unwrap_or(Span::new(1, 1));
    if mesh
        .dims
        .iter()
        .try_fold(1usize, |a, (_, s)| a.checked_mul(*s))
        .is_none_or(|n| n > MAX_RANKS)
    {
        return Err(err(
            file,
            mesh_span,
            format!("the mesh has more than {MAX_RANKS} ranks"),
            "a plan is written by hand for a few ranks; emit a case for bigger meshes",
        ));
    }
    let mut l = Lowering {
        file,
        mesh: mesh.clone(),
        groups: BTreeMap::new(),
        registry: Registry::builtin(),
    };
    let mut groups = Vec::new();
    for (m, (d, s)) in mesh.dims.iter().enumerate() {
        l.groups.insert(d.clone(), GroupInfo { size: *s });
        groups.push(ProcessGroup {
            name: d.clone(),
            members: mesh.groups_along(&[m]),
        });
    }
    for (name, dims) in &ast.groups {
        if l.groups.contains_key(&name.text) {
            return Err(l.err(
                name.span,
                format!("group `{}` is already defined", name.text),
                "each mesh dim is a group of its own name; give a multi-dim group another name",
            ));
        }
        let mut idx = Vec::new();
        for d in dims {
            idx.push(l.dim_index(d)?);
        }
        idx.sort_unstable();
        idx.dedup();
        let size = idx.iter().map(|&m| mesh.dims[m].1).product();
        l.groups.insert(name.text.clone(), GroupInfo { size });
        groups.push(ProcessGroup {
            name: name.text.clone(),
            members: mesh.groups_along(&idx),
        });
    }
    for on in &ast.blocks {
        l.check_restrictions(on)?;
    }
    let plan_name = ast.name.as_ref().map_or_else(
        || {
            file.file_stem()
                .map_or("plan".into(), |s| s.to_string_lossy().into_owned())
        },
        |n| n.text.clone(),
    );
    let mut inputs: Vec<InputRelation> = Vec::new();
    let mut outputs: Vec<OutputExpectation> = Vec::new();
    let mut ranks = Vec::with_capacity(mesh.size());
    let mut ops: BTreeMap<String, OpMeaning> = BTreeMap::new();
    for rank in 0..mesh.size() {
        let coords = mesh.coords(rank);
        let mut g = RankGraph {
            graph: Graph::new(format!("{plan_name} rank {rank}")),
            env: HashMap::new(),
            defined_at: HashMap::new(),
            coords,
            rank,
        };
        g.graph.path = Some(file.to_path_buf());
        let mut input_no = 0;
        let mut output_no = 0;
        for stmt in &ast.stmts {
            let here = l.holds(&stmt.on, &g.coords);
            match &stmt.kind {
                StmtKind::Input {
                    name,
                    dtype,
                    shape,
                    placements,
                } => {
                    let k = input_no;
                    input_no += 1;
                    if rank == 0 {
                        inputs.push(input_relation(&l, name, placements, &stmt.on)?);
                    }
                    if !here {
                        continue;
                    }
                    let Layout::Placed(layout) = inputs[k].layout.clone() else {
                        continue;
                    };
                    let dt = DType::from_short_name(&dtype.text).ok_or_else(|| {
                        l.err(
                            dtype.span,
                            format!("`{}` is not a dtype", dtype.text),
                            "write f32, bf16, f16, f64, i64, i32, i8, u8 or bool",
                        )
                    })?;
                    let local = l.local_shape(name, shape, &layout)?;
                    let i = g.define(
                        file,
                        name,
                        name.text.clone(),
                        NodeKind::Input,
                        vec![Output {
                            name: name.text.clone(),
                            ty: Some(TensorType::new(dt, &local)),
                        }],
                        stmt.span.line,
                    )?;
                    g.graph.inputs.push(ValueId::new(i, 0));
                    g.env.insert(name.text.clone(), ValueId::new(i, 0));
                    inputs[k].rank_values.push((rank, ValueId::new(i, 0)));
                }
                StmtKind::Output { name, placements } => {
                    let k = output_no;
                    output_no += 1;
                    if rank == 0 {
                        let layout = l.placements(placements, &stmt.on)?;
                        outputs.push(OutputExpectation {
                            spec_name: name.text.clone(),
                            spec_value: ValueId::new(0, 0),
                            is_graph_output: true,
                            impl_name: name.text.clone(),
                            impl_values: Vec::new(),
                            rank_values: Vec::new(),
                            layout: Layout::Placed(layout),
                            span: name.span,
                        });
                    }
                    if !here {
                        continue;
                    }
                    let v = lookup(&l, &g, name)?;
                    g.graph.outputs.push(Some(v));
                    outputs[k].rank_values.push((rank, v));
                }
                StmtKind::Call { targets, call } => {
                    if here {
                        lower_call(&l, &mut g, stmt, targets, call, &mut ops)?;
                    }
                }
            }
        }
        ranks.push(Arc::new(g.graph));
    }
    let everywhere = |rv: &[(usize, ValueId)]| -> Vec<ValueId> {
        if rv.len() == mesh.size() {
            rv.iter().map(|&(_, v)| v).collect()
        } else {
            Vec::new()
        }
    };
    for i in &mut inputs {
        i.impl_values = everywhere(&i.rank_values);
    }
    for o in &mut outputs {
        o.impl_values = everywhere(&o.rank_values);
    }
    let program = Program {
        mesh,
        groups,
        ranks,
    };
    let located = |value: String| Located {
        value,
        span: mesh_span,
    };
    Ok(Case {
        file: file.to_path_buf(),
        name: plan_name.clone(),
        spec: Graph::new(format!("{plan_name} (no spec: a plan)")),
        program,
        inputs,
        outputs,
        ops,
        assume: Assumptions::default(),
        constants: BTreeMap::new(),
        source: CaseFile {
            path: file.to_path_buf(),
            version: Located {
                value: 1,
                span: mesh_span,
            },
            name: ast.name.as_ref().map(|n| Located {
                value: n.text.clone(),
                span: n.span,
            }),
            spec: GraphRef {
                path: located(String::new()),
            },
            impl_: ImplSpec {
                span: mesh_span,
                mesh: Vec::new(),
                mesh_span,
                graphs: Vec::new(),
                graphs_span: mesh_span,
                groups: Vec::new(),
                groups_span: None,
            },
            inputs: Vec::new(),
            outputs: Vec::new(),
            ops: Vec::new(),
            assume: Vec::new(),
            constants: Vec::new(),
            span: Span::new(1, 1),
        },
    })
}

fn input_relation(
    l: &Lowering,
    name: &Name,
    placements: &[PlacedOn],
    on: &[Restriction],
) -> Result<InputRelation, SourceError> {
    Ok(InputRelation {
        spec_name: name.text.clone(),
        spec_value: ValueId::new(0, 0),
        impl_name: name.text.clone(),
        impl_values: Vec::new(),
        rank_values: Vec::new(),
        layout: Layout::Placed(l.placements(placements, on)?),
        cut: false,
        span: name.span,
    })
}

fn lookup(l: &Lowering, g: &RankGraph, name: &Name) -> Result<ValueId, SourceError> {
    g.env.get(&name.text).copied().ok_or_else(|| {
        l.err(
            name.span,
            format!(
                "`{}` is not defined on {} at this line",
                name.text,
                g.where_(&l.mesh)
            ),
            "define it first with `input` or as a call's result; inside an `on` block only \
             the block's ranks define it",
        )
    })
}

/// An argument of a generic operator call.
fn arg(l: &Lowering, g: &RankGraph, e: &Expr) -> Result<Arg, SourceError> {
    Ok(match &e.kind {
        ExprKind::Name(n) => match n.as_str() {
            "True" => Arg::Bool(true),
            "False" => Arg::Bool(false),
            "None" => Arg::None,
            _ => match g.env.get(n) {
                Some(v) => Arg::Value(*v),
                None => match DType::from_short_name(n) {
                    Some(d) => Arg::Dtype(d),
                    None => {
                        return Err(lookup(
                            l,
                            g,
                            &Name {
                                text: n.clone(),
                                span: e.span,
                            },
                        )
                        .unwrap_err())
                    }
                },
            },
        },
        ExprKind::Int { value, .. } => Arg::Int(*value),
        ExprKind::Float(f) => Arg::Float(*f),
        ExprKind::Str(s) => Arg::Str(s.clone()),
        ExprKind::List(items) => Arg::List(
            items
                .iter()
                .map(|i| arg(l, g, i))
                .collect::<Result<_, _>>()?,
        ),
        // `tp[0, 32]`: one literal per coordinate of a mesh dim, this rank's.
        ExprKind::Type { dtype, shape } if l.mesh.dim_index(dtype).is_some() => {
            let m = l.mesh.dim_index(dtype).unwrap_or(0);
            let (_, size) = &l.mesh.dims[m];
            if shape.len() != *size {
                return Err(l.err(
                    e.span,
                    format!(
                        "`{dtype}[...]` gives {} literals for the {size} coordinates of `{dtype}`",
                        shape.len()
                    ),
                    "give one literal per coordinate: `tp[0, 32]` on a mesh dim of size 2",
                ));
            }
            Arg::Int(shape[g.coords[m]])
        }
        ExprKind::Type { .. } => {
            return Err(l.err(
                e.span,
                "a type is an argument of `recv` only",
                "pass a tensor, a number, a string, a list, or `DIM[a, b, ...]` (one literal per coordinate of mesh dim DIM)",
            ))
        }
    })
}

fn tensor_arg(l: &Lowering, g: &RankGraph, call: &Call, k: usize) -> Result<ValueId, SourceError> {
    let what = format!("`{}` takes a tensor as argument {}", call.op.text, k + 1);
    match call.args.get(k) {
        Some(Expr {
            kind: ExprKind::Name(n),
            span,
        }) => lookup(
            l,
            g,
            &Name {
                text: n.clone(),
                span: *span,
            },
        ),
        Some(e) => Err(l.err(e.span, what, "pass a tensor's name")),
        None => Err(l.err(call.op.span, what, "pass a tensor's name")),
    }
}

fn word_arg<'e>(
    l: &Lowering,
    call: &'e Call,
    k: usize,
    what: &str,
    hint: &str,
) -> Result<(&'e str, Span), SourceError> {
    match call.args.get(k) {
        Some(Expr {
            kind: ExprKind::Name(n) | ExprKind::Str(n),
            span,
        }) => Ok((n.as_str(), *span)),
        Some(e) => Err(l.err(e.span, format!("expected {what}"), hint)),
        None => Err(l.err(
            call.op.span,
            format!("`{}` needs {what} as argument {}", call.op.text, k + 1),
            hint,
        )),
    }
}

fn single_target<'t>(
    l: &Lowering,
    targets: &'t [Name],
    call: &Call,
) -> Result<Option<&'t Name>, SourceError> {
    if targets.len() > 1 {
        return Err(l.err(
            targets[1].span,
            format!("`{}` has one result", call.op.text),
            "assign it to one name",
        ));
    }
    Ok(targets.first())
}

fn call_node(op: &str, args: Vec<Arg>) -> NodeKind {
    NodeKind::Call {
        op: OpName::parse(op).unwrap_or_else(|| OpName::new("aten", op, "default")),
        args,
        kwargs: Vec::new(),
    }
}

fn out(name: &str) -> Vec<Output> {
    vec![Output {
        name: name.to_string(),
        ty: None,
    }]
}

fn lower_call(
    l: &Lowering,
    g: &mut RankGraph,
    stmt: &Stmt,
    targets: &[Name],
    call: &Call,
    ops: &mut BTreeMap<String, OpMeaning>,
) -> Result<(), SourceError> {
    let line = stmt.span.line;
    let opname = call.op.text.as_str();
    let anon = || format!("{opname}_{line}");
    if let Some(&(_, c10d, reduces, is_async)) = COLLECTIVES.iter().find(|c| c.0 == opname) {
        let target = single_target(l, targets, call)?;
        let x = tensor_arg(l, g, call, 0)?;
        let mut args = vec![Arg::Value(x)];
        let mut k = 1;
        if reduces {
            let (red, span) = word_arg(
                l,
                call,
                1,
                "a reduction",
                "write `sum`, `avg`, `max` or `min`",
            )?;
            if !["sum", "avg", "max", "min"].contains(&red) {
                return Err(l.err(
                    span,
                    format!("`{red}` is not a reduction"),
                    "write `sum`, `avg`, `max` or `min`",
                ));
            }
            args.push(Arg::Str(red.into()));
            k = 2;
        }
        let groups: Vec<&str> = l.groups.keys().map(String::as_str).collect();
        let ghint = format!("name a group: {}", groups.join(", "));
        let (group, gspan) = word_arg(l, call, k, "a group", &ghint)?;
        let Some(info) = l.groups.get(group) else {
            return Err(l.err(gspan, format!("`{group}` is not a group"), &ghint));
        };
        if call.args.len() > k + 1 || !call.kwargs.is_empty() {
            return Err(l.err(
                call.op.span,
                format!("`{opname}` takes {} arguments", k + 1),
                if reduces {
                    "write `op(x, sum, GROUP)`"
                } else {
                    "write `op(x, GROUP)`"
                },
            ));
        }
        if c10d != "all_reduce" {
            args.push(Arg::Int(info.size as i64));
        }
        args.push(Arg::Str(group.into()));
        let name = target.map_or_else(anon, |t| t.text.clone());
        let kind = call_node(&format!("_c10d_functional.{c10d}.default"), args);
        let at = target.cloned().unwrap_or(call.op.clone());
        if is_async {
            let i = g.define(l.file, &at, name.clone(), kind, out(&name), line)?;
            g.env.insert(name, ValueId::new(i, 0));
        } else {
            let started = g.fresh(&format!("{name}_async"));
            let i = g.define(l.file, &at, started.clone(), kind, out(&started), line)?;
            let w = call_node(
                "_c10d_functional.wait_tensor.default",
                vec![Arg::Value(ValueId::new(i, 0))],
            );
            let j = g.define(l.file, &at, name.clone(), w, out(&name), line)?;
            g.env.insert(name, ValueId::new(j, 0));
        }
        return Ok(());
    }
    match opname {
        "wait" => {
            if !targets.is_empty() {
                return Err(l.err(
                    targets[0].span,
                    "`wait` rebinds its handle's name",
                    "write `wait(h)` on its own",
                ));
            }
            let h = tensor_arg(l, g, call, 0)?;
            let hname = g.graph.value_name(h).to_string();
            let node = g.fresh(&format!("{hname}_waited"));
            let w = call_node("_c10d_functional.wait_tensor.default", vec![Arg::Value(h)]);
            let j = g.define(l.file, &call.op, node.clone(), w, out(&node), line)?;
            let user_name = match &call.args[0].kind {
                ExprKind::Name(n) => n.clone(),
                _ => hname,
            };
            g.env.insert(user_name, ValueId::new(j, 0));
        }
        "send" => {
            let target = single_target(l, targets, call)?;
            let x = tensor_arg(l, g, call, 0)?;
            let (dst, tag) = l.peer(call, &g.coords, &[])?;
            let name = target.map_or_else(|| g.fresh(&format!("send_{line}")), |t| t.text.clone());
            let kind = call_node(
                "shardproof_p2p.send.default",
                vec![Arg::Value(x), Arg::Int(dst as i64), Arg::Int(tag)],
            );
            let at = target.cloned().unwrap_or(call.op.clone());
            let i = g.define(l.file, &at, name.clone(), kind, out(&name), line)?;
            g.env.insert(name, ValueId::new(i, 0));
        }
        "recv" => {
            let target = single_target(l, targets, call)?;
            let hint = "write `x = recv(f32[8, 16], pp=0)`: the local buffer's type and the sender";
            let Some(Expr {
                kind: ExprKind::Type { dtype, shape },
                span,
            }) = call.args.first()
            else {
                return Err(l.err(
                    call.op.span,
                    "`recv` needs the received buffer's type first",
                    hint,
                ));
            };
            let dt = DType::from_short_name(dtype)
                .ok_or_else(|| l.err(*span, format!("`{dtype}` is not a dtype"), hint))?;
            let (src, tag) = l.peer(call, &g.coords, &[])?;
            let Some(target) = target else {
                return Err(l.err(call.op.span, "a `recv` needs a result name", hint));
            };
            let kind = call_node(
                "shardproof_p2p.recv.default",
                vec![
                    Arg::List(shape.iter().map(|&s| Arg::Int(s)).collect()),
                    Arg::Dtype(dt),
                    Arg::Int(src as i64),
                    Arg::Int(tag),
                ],
            );
            let i = g.define(
                l.file,
                target,
                target.text.clone(),
                kind,
                out(&target.text),
                line,
            )?;
            g.env.insert(target.text.clone(), ValueId::new(i, 0));
        }
        _ => {
            // `add_(x, y)`: the in-place form of a registered operator, declared to mean it
            // (the temporal checks see the in-place write; placements follow the operator).
            let in_place_of =
                if opname.ends_with('_') && !opname.contains('.') && l.resolve(call).is_err() {
                    let plain = Call {
                        op: Name {
                            text: opname.trim_end_matches('_').to_string(),
                            span: call.op.span,
                        },
                        ..call.clone()
                    };
                    let inner = l.resolve(&plain)?;
                    if !call.kwargs.is_empty() {
                        return Err(l.err(
                            call.kwargs[0].0.span,
                            format!("the in-place `{opname}` takes positional arguments only"),
                            "pass every argument by position",
                        ));
                    }
                    Some(inner)
                } else {
                    None
                };
            let op = match &in_place_of {
                Some(inner) => {
                    let outer = OpName::new(
                        &inner.namespace,
                        &format!("{}_", inner.name),
                        &inner.overload,
                    );
                    ops.insert(
                        outer.to_string(),
                        OpMeaning::Decompose(DecompExpr::Call {
                            op: inner.clone(),
                            args: (0..call.args.len()).map(DecompExpr::Arg).collect(),
                        }),
                    );
                    outer
                }
                None => l.resolve(call)?,
            };
            let def = l
                .registry
                .get(in_place_of.as_ref().unwrap_or(&op))
                .ok_or_else(|| l.err(call.op.span, format!("unknown operator `{op}`"), ""))?;
            let args = call
                .args
                .iter()
                .map(|a| arg(l, g, a))
                .collect::<Result<Vec<_>, _>>()?;
            let kwargs = call
                .kwargs
                .iter()
                .map(|(k, v)| Ok((k.text.clone(), arg(l, g, v)?)))
                .collect::<Result<Vec<_>, SourceError>>()?;
            let returns = def.schema.returns.len();
            let list_return = returns == 1 && def.schema.returns[0].ends_with("[]");
            let count = if list_return {
                targets.len().max(1)
            } else {
                returns.max(1)
            };
            if !targets.is_empty() && targets.len() != count {
                return Err(l.err(
                    targets[0].span,
                    format!(
                        "`{op}` has {count} results, {} names are given",
                        targets.len()
                    ),
                    &format!("write {count} names before `=`"),
                ));
            }
            let names: Vec<String> = if targets.is_empty() {
                let base = g.fresh(&anon());
                (0..count)
                    .map(|k| {
                        if k == 0 {
                            base.clone()
                        } else {
                            format!("{base}_{k}")
                        }
                    })
                    .collect()
            } else {
                targets.iter().map(|t| t.text.clone()).collect()
            };
            let at = targets.first().cloned().unwrap_or(call.op.clone());
            let outputs = names
                .iter()
                .map(|n| Output {
                    name: n.clone(),
                    ty: None,
                })
                .collect();
            let i = g.define(
                l.file,
                &at,
                names[0].clone(),
                NodeKind::Call { op, args, kwargs },
                outputs,
                line,
            )?;
            for (k, n) in names.into_iter().enumerate() {
                g.env.insert(n, ValueId::new(i, k));
            }
        }
    }
    Ok(())
}
