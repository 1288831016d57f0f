//! The case file as written: typed, with the position of every key and value, before it is
//! checked against the mesh and the graphs.

use crate::decomp::parse_decomposition;
use crate::expr::{parse_expr, Expr};
use crate::placement::{parse_placement, Placement};
use crate::suggest::{did_you_mean_suffix, list_names};
use crate::yaml::{parse_yaml, YKind, YNode};
use shardproof_ir::{DecompExpr, Located, OpMeaning, OpName, Signature, SourceError, Span};
use std::path::{Path, PathBuf};

/// A parsed case file (format version 1), not yet checked against its graphs.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseFile {
    /// The file it was read from (diagnostics name it; graph paths are relative to it).
    pub path: PathBuf,
    /// `version:` (always 1 once parsed).
    pub version: Located<u32>,
    /// `name:`, when given.
    pub name: Option<Located<String>>,
    /// `spec:`.
    pub spec: GraphRef,
    /// `impl:`.
    pub impl_: ImplSpec,
    /// `inputs:`, in file order.
    pub inputs: Vec<InputEntry>,
    /// `outputs:`, in file order (empty when absent).
    pub outputs: Vec<OutputEntry>,
    /// `ops:`, in file order.
    pub ops: Vec<OpDecl>,
    /// `assume:`, in file order.
    pub assume: Vec<Assumption>,
    /// `constants:`: values of module constants (`_tensor_constant0: 0.0`), in file order.
    pub constants: Vec<ConstantValue>,
    /// Where the document starts (for errors about missing top-level keys).
    pub span: Span,
}

/// A graph file named by the case (`spec: { graph: ... }`).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphRef {
    /// The path as written, relative to the case file.
    pub path: Located<String>,
}

/// `impl:`: the mesh, the rank graphs and the process groups.
#[derive(Clone, Debug, PartialEq)]
pub struct ImplSpec {
    /// Where the `impl` key is.
    pub span: Span,
    /// Mesh dims in order (outermost first).
    pub mesh: Vec<MeshDimDecl>,
    /// Where the mesh value is.
    pub mesh_span: Span,
    /// One graph path per rank, in rank order.
    pub graphs: Vec<Located<String>>,
    /// Where the graphs value is.
    pub graphs_span: Span,
    /// Declared process groups, in file order.
    pub groups: Vec<GroupDecl>,
    /// Where the `groups` key is, when present.
    pub groups_span: Option<Span>,
}

/// One mesh dim: `tp: 2`.
#[derive(Clone, Debug, PartialEq)]
pub struct MeshDimDecl {
    /// Its name.
    pub name: Located<String>,
    /// Its size (at least 1).
    pub size: Located<usize>,
}

/// One declared process group: `"12": tp`.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupDecl {
    /// The name collectives use.
    pub name: Located<String>,
    /// What it spans.
    pub target: Located<GroupTarget>,
}

/// What a declared process group spans.
#[derive(Clone, Debug, PartialEq)]
pub enum GroupTarget {
    /// `all`: every rank.
    All,
    /// `tp` or `[dp, tp]`: one group per slice of the mesh along these dims.
    Dims(Vec<Located<String>>),
    /// `[[0, 1], [2, 3]]`: explicit rank sets.
    Ranks(Vec<Vec<Located<usize>>>),
}

/// One entry of `inputs:` or `outputs:`.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEntry {
    /// The spec tensor's name (the key).
    pub name: Located<String>,
    /// `impl:`, when the impl-side tensor has another name.
    pub impl_name: Option<Located<String>>,
    /// The layout as written.
    pub layout: LayoutSpec,
    /// `scale:` (an `inputs:` entry only): every rank's tensor is this whole number times the
    /// piece its placement gives (a data-parallel rank's activation gradient at a backward
    /// cut is the replica count times the spec's rows). Read by `shardproof prove` only.
    pub scale: Option<Located<u64>>,
    /// Where the value starts.
    pub value_span: Span,
}

/// An entry of `inputs:`.
pub type InputEntry = TensorEntry;
/// An entry of `outputs:`.
pub type OutputEntry = TensorEntry;

/// A layout as written, before it is checked against the mesh.
#[derive(Clone, Debug, PartialEq)]
pub enum LayoutSpec {
    /// Placements, with optional fused blocks and replicas.
    Placed {
        /// The placement in one of its forms.
        placement: PlacementSpec,
        /// `blocks:`.
        blocks: Option<Located<BlocksSpec>>,
        /// `replicas:` (applies to every block that does not give its own).
        replicas: Option<Located<usize>>,
        /// `at:` (an extension): the tensor lives only on the ranks at these coordinates of
        /// these mesh dims, e.g. `at: { pp: 0 }`; empty when every rank holds it.
        at: Vec<AtDim>,
    },
    /// `expr:`.
    Expr(Expr),
}

/// The forms a placement can be written in.
#[derive(Clone, Debug, PartialEq)]
pub enum PlacementSpec {
    /// `Shard(0)`: the 1-d shorthand.
    Bare(Located<Placement>),
    /// `{ tp: Shard(1) }`: by mesh dim name; missing dims are `Replicate()`.
    PerDimMap(Vec<(Located<String>, Located<Placement>)>),
    /// `[Shard(0), Replicate()]`: one per mesh dim, in mesh order.
    PerDimList(Located<Vec<Located<Placement>>>),
}

/// One mesh dim of `at:` as written: its name and the coordinates along it that hold the
/// tensor (`pp: 0` or `pp: [0, 1]`).
pub type AtDim = (Located<String>, Located<Vec<usize>>);

/// `blocks:` as written.
#[derive(Clone, Debug, PartialEq)]
pub enum BlocksSpec {
    /// `blocks: 2`: that many equal blocks.
    Count(usize),
    /// `blocks: [1536, { size: 256, replicas: 2 }]`.
    Sizes(Vec<BlockSpec>),
}

/// One block of `blocks: [...]`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockSpec {
    /// The block's size along the sharded dim.
    pub size: Located<i64>,
    /// Its own `replicas`, when given.
    pub replicas: Option<Located<usize>>,
}

/// One entry of `ops:`.
#[derive(Clone, Debug, PartialEq)]
pub struct OpDecl {
    /// The operator as written (`tg.log_tensor`).
    pub name: Located<String>,
    /// The operator, parsed.
    pub op: OpName,
    /// What it computes.
    pub meaning: OpMeaning,
    /// Every operator its decomposition calls, with the call's position.
    pub calls: Vec<(OpName, Span)>,
}

/// One entry of `constants:`: a module constant's name and its value.
pub type ConstantValue = (Located<String>, Located<f64>);

/// One entry of `assume:` (validated: the key and value are known).
#[derive(Clone, Debug, PartialEq)]
pub struct Assumption {
    /// The assumption's name (`dropout`).
    pub key: Located<String>,
    /// Its value (`same-mask`); for an override written as a mapping, the empty string at the
    /// mapping's position.
    pub value: Located<String>,
    /// An override's fields (`batch-norm: { per-device: dp, stats: [m, v] }`), each with its
    /// scalar or list items; empty for a plain value.
    pub fields: Vec<(Located<String>, Vec<Located<String>>)>,
}

/// The keys that make a mapping value of `inputs:` the entry form rather than a per-dim map.
pub(crate) const ENTRY_KEYS: [&str; 7] = [
    "impl",
    "placement",
    "blocks",
    "replicas",
    "expr",
    "at",
    "scale",
];

/// Known assumptions and their allowed values.
pub(crate) const ASSUMPTIONS: [(&str, &[&str]); 2] =
    [("dropout", &["same-mask"]), ("ignore-index", &["unused"])];

/// Approximation overrides (TrainVerify section 5.3), written as mappings, with their fields:
/// the required ones, then the optional ones.
pub(crate) const OVERRIDES: [(&str, &[&str], &str); 2] = [
    (
        "batch-norm",
        &["per-device", "stats"],
        "batch-norm: { per-device: dp, stats: [bn_mean, bn_var] }",
    ),
    (
        "moe-routing",
        &["node-limited", "nodes", "top-nodes"],
        "moe-routing: { node-limited: masked_scores, nodes: 8, top-nodes: 4 }",
    ),
];

pub(crate) struct Ctx<'a> {
    pub file: &'a Path,
}

type Entries<'n> = Vec<(&'n YNode, &'n YNode)>;

impl Ctx<'_> {
    pub fn err(&self, span: Span, msg: impl Into<String>) -> SourceError {
        SourceError::new(self.file, Some(span), msg)
    }

    fn map<'n>(&self, node: &'n YNode, what: &str, hint: &str) -> Result<Entries<'n>, SourceError> {
        match &node.kind {
            YKind::Map(m) => Ok(m.iter().map(|(k, v)| (k, v)).collect()),
            _ => Err(self
                .err(
                    node.span,
                    format!("{what} must be a mapping, found {}", node.describe()),
                )
                .with_hint(hint.to_string())),
        }
    }

    /// Checks that keys are scalars, unique, and (when `allowed` is given) known.
    fn keys<'n>(
        &self,
        entries: &Entries<'n>,
        allowed: Option<&[&str]>,
        section: &str,
    ) -> Result<Vec<(Located<String>, &'n YNode)>, SourceError> {
        let mut out: Vec<(Located<String>, &'n YNode)> = Vec::new();
        for (k, v) in entries {
            let Some(name) = k.scalar() else {
                return Err(self
                    .err(
                        k.span,
                        format!("keys in {section} must be names, found {}", k.describe()),
                    )
                    .with_hint("write `name: value`"));
            };
            if let Some((prev, _)) = out.iter().find(|(p, _)| p.value == name) {
                return Err(self
                    .err(k.span, format!("`{name}` appears twice in {section}"))
                    .with_hint(format!(
                        "the first `{name}` is at line {}, column {}; keep one",
                        prev.span.line, prev.span.col
                    )));
            }
            if let Some(allowed) = allowed {
                if !allowed.contains(&name) {
                    return Err(self
                        .err(
                            k.span,
                            format!(
                                "unknown key `{name}` in {section}{}",
                                did_you_mean_suffix(name, allowed.iter().copied())
                            ),
                        )
                        .with_hint(format!(
                            "the keys of {section} are {}",
                            list_names(allowed.iter().copied())
                        )));
                }
            }
            out.push((
                Located {
                    value: name.to_string(),
                    span: k.span,
                },
                v,
            ));
        }
        Ok(out)
    }

    fn string(&self, node: &YNode, what: &str) -> Result<Located<String>, SourceError> {
        match node.scalar() {
            Some(s) if !node.is_null() && !s.trim().is_empty() => Ok(Located {
                value: s.to_string(),
                span: node.span,
            }),
            _ => Err(self
                .err(
                    node.span,
                    format!("{what} must be a string, found {}", node.describe()),
                )
                .with_hint(format!("write {what} as plain text"))),
        }
    }

    fn int(&self, node: &YNode, what: &str, min: i64) -> Result<Located<i64>, SourceError> {
        let parsed = node
            .scalar()
            .filter(|_| node.is_plain())
            .and_then(|s| s.replace('_', "").parse::<i64>().ok());
        match parsed {
            Some(i) if i >= min => Ok(Located {
                value: i,
                span: node.span,
            }),
            Some(i) => Err(self
                .err(
                    node.span,
                    format!("{what} must be at least {min}, found {i}"),
                )
                .with_hint(format!("write {what} as an integer of at least {min}"))),
            None => Err(self
                .err(
                    node.span,
                    format!("{what} must be an integer, found {}", node.describe()),
                )
                .with_hint(format!("write {what} as an unquoted integer, e.g. `2`"))),
        }
    }

    fn usize(&self, node: &YNode, what: &str, min: i64) -> Result<Located<usize>, SourceError> {
        let i = self.int(node, what, min)?;
        let value = usize::try_from(i.value)
            .map_err(|_| self.err(node.span, format!("{what} is too large")))?;
        Ok(Located {
            value,
            span: i.span,
        })
    }
}

fn find<'a, 'n>(
    keys: &'a [(Located<String>, &'n YNode)],
    k: &str,
) -> Option<(&'a Located<String>, &'n YNode)> {
    keys.iter()
        .find(|(n, _)| n.value == k)
        .map(|(n, v)| (n, *v))
}

fn required<'a, 'n>(
    ctx: &Ctx,
    keys: &'a [(Located<String>, &'n YNode)],
    k: &str,
    at: Span,
    section: &str,
    example: &str,
) -> Result<(&'a Located<String>, &'n YNode), SourceError> {
    find(keys, k).ok_or_else(|| {
        ctx.err(at, format!("{section} has no `{k}`"))
            .with_hint(format!("add `{example}`"))
    })
}

/// Parses the text of a case file. `path` names the file in diagnostics.
pub fn parse_case(text: &str, path: &Path) -> Result<CaseFile, SourceError> {
    parse_case_text(text, path).map_err(shardproof_import::shorten_quotes)
}

fn parse_case_text(text: &str, path: &Path) -> Result<CaseFile, SourceError> {
    let ctx = Ctx { file: path };
    let root = parse_yaml(text, path)?.ok_or_else(|| {
        SourceError::new(path, Some(Span::new(1, 1)), "the case file is empty")
            .with_hint("a case file starts with `version: 1`; see docs/formats/case-format.md")
    })?;
    let top = ctx.map(
        &root,
        "a case file",
        "a case file is a mapping that starts with `version: 1`",
    )?;
    let top = ctx.keys(
        &top,
        Some(&[
            "version",
            "name",
            "spec",
            "impl",
            "inputs",
            "outputs",
            "ops",
            "assume",
            "constants",
        ]),
        "the case file",
    )?;
    let doc = root.span;
    let (_, v) = required(&ctx, &top, "version", doc, "the case file", "version: 1")?;
    let version = ctx.int(v, "`version`", 0)?;
    if version.value != 1 {
        return Err(ctx
            .err(
                v.span,
                format!("unsupported case format version {}", version.value),
            )
            .with_hint("this shardproof reads case files of version 1: write `version: 1`"));
    }
    let version = Located {
        value: 1,
        span: version.span,
    };
    let name = find(&top, "name")
        .map(|(_, v)| ctx.string(v, "`name`"))
        .transpose()?;
    let (spec_key, spec_node) = required(
        &ctx,
        &top,
        "spec",
        doc,
        "the case file",
        "spec: { graph: PATH }",
    )?;
    let spec = graph_ref(&ctx, spec_key, spec_node)?;
    let (impl_key, impl_node) = required(
        &ctx,
        &top,
        "impl",
        doc,
        "the case file",
        "impl: { mesh: { tp: 2 }, graphs: [r0.py, r1.py] }",
    )?;
    let impl_ = impl_spec(&ctx, impl_key, impl_node)?;
    let (_, inputs_node) = required(
        &ctx,
        &top,
        "inputs",
        doc,
        "the case file",
        "inputs: { x: Shard(0) }",
    )?;
    let inputs = tensor_entries(&ctx, inputs_node, "`inputs`")?;
    let outputs = match find(&top, "outputs") {
        Some((_, v)) if !v.is_null() => tensor_entries(&ctx, v, "`outputs`")?,
        _ => Vec::new(),
    };
    if let Some((o, c)) = outputs
        .iter()
        .find_map(|o| o.scale.as_ref().map(|c| (o, c)))
    {
        return Err(ctx
            .err(
                c.span,
                format!(
                    "`scale` on the output `{}`: a scale states how the ranks' inputs relate to the spec's",
                    o.name.value
                ),
            )
            .with_hint(
                "give `scale:` on the `inputs:` entry of the cut (the stage that establishes it checks the scaled relation); remove it here",
            ));
    }
    let ops = match find(&top, "ops") {
        Some((_, v)) if !v.is_null() => op_decls(&ctx, v)?,
        _ => Vec::new(),
    };
    let assume = match find(&top, "assume") {
        Some((_, v)) if !v.is_null() => assumptions(&ctx, v)?,
        _ => Vec::new(),
    };
    let constants = match find(&top, "constants") {
        Some((_, v)) if !v.is_null() => constant_values(&ctx, v)?,
        _ => Vec::new(),
    };
    Ok(CaseFile {
        path: path.to_path_buf(),
        version,
        name,
        spec,
        impl_,
        inputs,
        outputs,
        ops,
        assume,
        constants,
        span: doc,
    })
}

fn graph_ref(ctx: &Ctx, key: &Located<String>, node: &YNode) -> Result<GraphRef, SourceError> {
    let m = ctx.map(node, "`spec`", "write `spec: { graph: PATH }`")?;
    let keys = ctx.keys(&m, Some(&["graph"]), "`spec`")?;
    let (_, g) = required(ctx, &keys, "graph", key.span, "`spec`", "graph: PATH")?;
    Ok(GraphRef {
        path: ctx.string(g, "the spec graph path")?,
    })
}

fn impl_spec(ctx: &Ctx, key: &Located<String>, node: &YNode) -> Result<ImplSpec, SourceError> {
    let m = ctx.map(
        node,
        "`impl`",
        "write `impl: { mesh: { tp: 2 }, graphs: [r0.py, r1.py] }`",
    )?;
    let keys = ctx.keys(&m, Some(&["mesh", "graphs", "groups"]), "`impl`")?;
    let (_, mesh_node) = required(ctx, &keys, "mesh", key.span, "`impl`", "mesh: { tp: 2 }")?;
    let mm = ctx.map(
        mesh_node,
        "`mesh`",
        "name each mesh dim with its size: `mesh: { dp: 2, tp: 4 }`",
    )?;
    let mesh_keys = ctx.keys(&mm, None, "`mesh`")?;
    let mut mesh = Vec::new();
    for (name, v) in mesh_keys {
        let size = ctx.usize(v, &format!("the size of mesh dim `{}`", name.value), 1)?;
        mesh.push(MeshDimDecl { name, size });
    }
    if mesh.is_empty() {
        return Err(ctx
            .err(mesh_node.span, "the mesh has no dims")
            .with_hint("name each mesh dim with its size: `mesh: { tp: 2 }`"));
    }
    let (_, graphs_node) = required(
        ctx,
        &keys,
        "graphs",
        key.span,
        "`impl`",
        "graphs: [r0.py, r1.py]",
    )?;
    let YKind::Seq(items) = &graphs_node.kind else {
        return Err(ctx
            .err(
                graphs_node.span,
                format!(
                    "`graphs` must be a list of paths, found {}",
                    graphs_node.describe()
                ),
            )
            .with_hint("list one graph file per rank, in rank order: `graphs: [r0.py, r1.py]`"));
    };
    let graphs = items
        .iter()
        .map(|g| ctx.string(g, "a rank graph path"))
        .collect::<Result<Vec<_>, _>>()?;
    let (groups, groups_span) = match find(&keys, "groups") {
        Some((k, v)) if !v.is_null() => (group_decls(ctx, v)?, Some(k.span)),
        Some((k, _)) => (Vec::new(), Some(k.span)),
        None => (Vec::new(), None),
    };
    Ok(ImplSpec {
        span: key.span,
        mesh,
        mesh_span: mesh_node.span,
        graphs,
        graphs_span: graphs_node.span,
        groups,
        groups_span,
    })
}

const GROUP_HINT: &str =
    "a group is a mesh dim (`tp`), several (`[dp, tp]`), `all`, or rank lists \
                          (`[[0, 1], [2, 3]]`)";

fn group_decls(ctx: &Ctx, node: &YNode) -> Result<Vec<GroupDecl>, SourceError> {
    let m = ctx.map(
        node,
        "`groups`",
        "map each process-group name to mesh dims: `groups: { \"12\": tp }`",
    )?;
    let keys = ctx.keys(&m, None, "`groups`")?;
    let mut out = Vec::new();
    for (name, v) in keys {
        let target = match &v.kind {
            YKind::Scalar { text, .. } if !v.is_null() && text == "all" && v.is_plain() => {
                GroupTarget::All
            }
            YKind::Scalar { .. } if !v.is_null() => {
                GroupTarget::Dims(vec![ctx.string(v, "a mesh dim")?])
            }
            YKind::Seq(items) if !items.is_empty() => {
                if items.iter().all(|i| matches!(i.kind, YKind::Seq(_))) {
                    let mut lists = Vec::new();
                    for i in items {
                        let YKind::Seq(ranks) = &i.kind else {
                            unreachable!()
                        };
                        if ranks.is_empty() {
                            return Err(ctx
                                .err(i.span, "an explicit rank list is empty")
                                .with_hint(GROUP_HINT));
                        }
                        lists.push(
                            ranks
                                .iter()
                                .map(|r| ctx.usize(r, "a rank", 0))
                                .collect::<Result<Vec<_>, _>>()?,
                        );
                    }
                    GroupTarget::Ranks(lists)
                } else {
                    let dims = items
                        .iter()
                        .map(|i| match &i.kind {
                            YKind::Scalar { .. } => ctx.string(i, "a mesh dim"),
                            _ => Err(ctx
                                .err(
                                    i.span,
                                    format!(
                                        "expected a mesh dim name, found {}; a list mixes dims \
                                         and rank lists",
                                        i.describe()
                                    ),
                                )
                                .with_hint(GROUP_HINT)),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    GroupTarget::Dims(dims)
                }
            }
            _ => {
                return Err(ctx
                    .err(
                        v.span,
                        format!(
                            "process group `{}` must name mesh dims or ranks, found {}",
                            name.value,
                            v.describe()
                        ),
                    )
                    .with_hint(GROUP_HINT))
            }
        };
        out.push(GroupDecl {
            name,
            target: Located {
                value: target,
                span: v.span,
            },
        });
    }
    Ok(out)
}

fn placement(ctx: &Ctx, node: &YNode) -> Result<Located<Placement>, SourceError> {
    let Some(text) = node.scalar().filter(|_| !node.is_null()) else {
        return Err(ctx
            .err(
                node.span,
                format!("expected a placement, found {}", node.describe()),
            )
            .with_hint("write `Shard(0)`, `Replicate()` or `Partial()`"));
    };
    parse_placement(text)
        .map(|p| Located {
            value: p,
            span: node.span,
        })
        .map_err(|e| ctx.err(node.span_at(e.offset), e.message).with_hint(e.hint))
}

fn placement_spec(ctx: &Ctx, node: &YNode) -> Result<PlacementSpec, SourceError> {
    match &node.kind {
        YKind::Scalar { .. } => Ok(PlacementSpec::Bare(placement(ctx, node)?)),
        YKind::Seq(items) => Ok(PlacementSpec::PerDimList(Located {
            value: items
                .iter()
                .map(|i| placement(ctx, i))
                .collect::<Result<Vec<_>, _>>()?,
            span: node.span,
        })),
        YKind::Map(_) => {
            let m = ctx.map(node, "a placement", "")?;
            let keys = ctx.keys(&m, None, "the per-dim placement")?;
            keys.into_iter()
                .map(|(k, v)| Ok((k, placement(ctx, v)?)))
                .collect::<Result<Vec<_>, _>>()
                .map(PlacementSpec::PerDimMap)
        }
    }
}

fn tensor_entries(ctx: &Ctx, node: &YNode, section: &str) -> Result<Vec<TensorEntry>, SourceError> {
    if node.is_null() {
        return Ok(Vec::new());
    }
    let m = ctx.map(
        node,
        section,
        "map each spec tensor to its layout, e.g. `w1: Shard(0)`",
    )?;
    let keys = ctx.keys(&m, None, section)?;
    keys.into_iter()
        .map(|(name, v)| tensor_entry(ctx, name, v))
        .collect()
}

fn tensor_entry(ctx: &Ctx, name: Located<String>, v: &YNode) -> Result<TensorEntry, SourceError> {
    let is_entry_form = match &v.kind {
        YKind::Map(m) => m
            .iter()
            .any(|(k, _)| k.scalar().is_some_and(|k| ENTRY_KEYS.contains(&k))),
        _ => false,
    };
    if !is_entry_form {
        if v.is_null() {
            return Err(ctx
                .err(v.span, format!("`{}` has no layout", name.value))
                .with_hint("write a placement such as `Shard(0)` or `Replicate()`"));
        }
        return Ok(TensorEntry {
            value_span: v.span,
            impl_name: None,
            scale: None,
            layout: LayoutSpec::Placed {
                placement: placement_spec(ctx, v)?,
                blocks: None,
                replicas: None,
                at: Vec::new(),
            },
            name,
        });
    }
    let section = format!("the entry of `{}`", name.value);
    let m = ctx.map(v, &section, "")?;
    let keys = ctx.keys(&m, Some(&ENTRY_KEYS), &section)?;
    let impl_name = find(&keys, "impl")
        .map(|(_, n)| ctx.string(n, "`impl`"))
        .transpose()?;
    if let Some((_, e)) = find(&keys, "expr") {
        if let Some((other, _)) = keys.iter().find(|(k, _)| k.value != "expr") {
            return Err(ctx
                .err(
                    other.span,
                    format!("`{}` cannot be combined with `expr`", other.value),
                )
                .with_hint("an expression names the rank tensors itself (`r0.x`); remove the other keys or the expression"));
        }
        let Some(text) = e.scalar().filter(|_| !e.is_null()) else {
            return Err(ctx
                .err(
                    e.span,
                    format!("`expr` must be a string, found {}", e.describe()),
                )
                .with_hint("quote the expression: `expr: \"concat([r0.x, r1.x], 0)\"`"));
        };
        let at = |o: usize| e.span_at(o);
        let expr = parse_expr(text, &at).map_err(|err| {
            ctx.err(e.span_at(err.offset), err.message)
                .with_hint(err.hint)
        })?;
        return Ok(TensorEntry {
            name,
            impl_name: None,
            layout: LayoutSpec::Expr(expr),
            scale: None,
            value_span: v.span,
        });
    }
    let Some((_, p)) = find(&keys, "placement") else {
        return Err(ctx
            .err(
                v.span,
                format!("the entry of `{}` has no `placement`", name.value),
            )
            .with_hint("add `placement: Shard(0)` (or another placement), or give an `expr`"));
    };
    let placement = placement_spec(ctx, p)?;
    let blocks = find(&keys, "blocks")
        .map(|(_, b)| blocks_spec(ctx, b))
        .transpose()?;
    let replicas = find(&keys, "replicas")
        .map(|(_, r)| ctx.usize(r, "`replicas`", 1))
        .transpose()?;
    let at = find(&keys, "at")
        .map(|(_, a)| at_spec(ctx, a))
        .transpose()?
        .unwrap_or_default();
    let scale = find(&keys, "scale")
        .map(|(_, c)| {
            ctx.int(c, "`scale`", 1).map(|c| Located {
                value: c.value.unsigned_abs(),
                span: c.span,
            })
        })
        .transpose()?;
    Ok(TensorEntry {
        name,
        impl_name,
        scale,
        layout: LayoutSpec::Placed {
            placement,
            blocks,
            replicas,
            at,
        },
        value_span: v.span,
    })
}

/// `at: { pp: 0 }` or `at: { pp: [0, 1], dp: 0 }`: per mesh dim, the coordinates whose ranks
/// hold the tensor (checked against the mesh later).
fn at_spec(ctx: &Ctx, node: &YNode) -> Result<Vec<AtDim>, SourceError> {
    let hint = "write `at: { pp: 0 }` (the ranks at coordinate 0 of mesh dim pp hold the \
                tensor) or `at: { pp: [0, 1] }`";
    let m = ctx.map(node, "`at`", hint)?;
    if m.is_empty() {
        return Err(ctx.err(node.span, "`at` names no mesh dim").with_hint(hint));
    }
    let keys = ctx.keys(&m, None, "`at`")?;
    keys.into_iter()
        .map(|(dim, v)| {
            let coords = match &v.kind {
                YKind::Seq(items) if !items.is_empty() => items
                    .iter()
                    .map(|i| ctx.usize(i, "a mesh coordinate", 0).map(|c| c.value))
                    .collect::<Result<Vec<_>, _>>()?,
                YKind::Seq(_) => {
                    return Err(ctx
                        .err(
                            v.span,
                            format!("`at` lists no coordinate of `{}`", dim.value),
                        )
                        .with_hint(hint))
                }
                _ => vec![ctx.usize(v, "a mesh coordinate", 0)?.value],
            };
            Ok((
                dim,
                Located {
                    value: coords,
                    span: v.span,
                },
            ))
        })
        .collect()
}

fn blocks_spec(ctx: &Ctx, node: &YNode) -> Result<Located<BlocksSpec>, SourceError> {
    let value = match &node.kind {
        YKind::Scalar { .. } => BlocksSpec::Count(ctx.usize(node, "`blocks`", 1)?.value),
        YKind::Seq(items) if !items.is_empty() => {
            let mut out = Vec::new();
            for i in items {
                out.push(match &i.kind {
                    YKind::Map(_) => {
                        let m = ctx.map(i, "a block", "")?;
                        let keys = ctx.keys(&m, Some(&["size", "replicas"]), "a block")?;
                        let (_, s) = required(ctx, &keys, "size", i.span, "the block", "size: 256")?;
                        BlockSpec {
                            size: ctx.int(s, "the block `size`", 1)?,
                            replicas: find(&keys, "replicas")
                                .map(|(_, r)| ctx.usize(r, "`replicas`", 1))
                                .transpose()?,
                        }
                    }
                    _ => BlockSpec {
                        size: ctx.int(i, "a block size", 1)?,
                        replicas: None,
                    },
                });
            }
            BlocksSpec::Sizes(out)
        }
        _ => {
            return Err(ctx
                .err(node.span, format!("`blocks` must be a count or a list of sizes, found {}", node.describe()))
                .with_hint("write `blocks: 2` or `blocks: [1536, 256, 256]` or `blocks: [1536, { size: 256, replicas: 2 }]`"))
        }
    };
    Ok(Located {
        value,
        span: node.span,
    })
}

fn op_decls(ctx: &Ctx, node: &YNode) -> Result<Vec<OpDecl>, SourceError> {
    let m = ctx.map(
        node,
        "`ops`",
        "map each custom operator to `identity` or a decomposition",
    )?;
    let keys = ctx.keys(&m, None, "`ops`")?;
    let mut out = Vec::new();
    for (name, v) in keys {
        let op = OpName::parse(&name.value).ok_or_else(|| {
            ctx.err(name.span, format!("`{}` is not an operator name", name.value))
                .with_hint("write the operator as `namespace.name` or `namespace.name.overload`, e.g. `tg.log_tensor`")
        })?;
        if let YKind::Map(_) = &v.kind {
            let (meaning, calls) = signature_decl(ctx, &name, v)?;
            out.push(OpDecl {
                name,
                op,
                meaning,
                calls,
            });
            continue;
        }
        let Some(text) = v.scalar().filter(|_| !v.is_null()) else {
            return Err(ctx
                .err(
                    v.span,
                    format!(
                        "the meaning of `{}` must be a string or a mapping, found {}",
                        name.value,
                        v.describe()
                    ),
                )
                .with_hint("write `identity`, a decomposition such as `\"gelu(add($0, $1))\"`, or `{ args: [out, x], writes: { out: \"relu($1)\" } }`"));
        };
        let (meaning, calls) = if text.trim() == "identity" {
            (OpMeaning::Identity, Vec::new())
        } else {
            let (e, calls) = decomposition(ctx, v, text)?;
            (OpMeaning::Decompose(e), calls)
        };
        out.push(OpDecl {
            name,
            op,
            meaning,
            calls,
        });
    }
    Ok(out)
}

fn decomposition(
    ctx: &Ctx,
    v: &YNode,
    text: &str,
) -> Result<(DecompExpr, Vec<(OpName, Span)>), SourceError> {
    let at = |o: usize| v.span_at(o);
    parse_decomposition(text, &at).map_err(|err| {
        ctx.err(v.span_at(err.offset), err.message)
            .with_hint(err.hint)
    })
}

/// The mapping form of an `ops:` entry: `args` names the parameters (so that keyword
/// arguments bind), `returns` is the result and `writes` the new values of the parameters
/// the operator overwrites in place (what `auto_functionalized` returns after the result).
fn signature_decl(
    ctx: &Ctx,
    name: &Located<String>,
    v: &YNode,
) -> Result<(OpMeaning, Vec<(OpName, Span)>), SourceError> {
    let what = format!("the declaration of `{}`", name.value);
    let m = ctx.map(
        v,
        &what,
        "write `{ args: [out, x], writes: { out: \"relu($1)\" } }`",
    )?;
    let keys = ctx.keys(&m, Some(&["args", "returns", "writes"]), &what)?;
    let (_, args_node) = required(ctx, &keys, "args", v.span, &what, "args: [out, x]")?;
    let YKind::Seq(items) = &args_node.kind else {
        return Err(ctx
            .err(
                args_node.span,
                format!(
                    "`args` must be a list of parameter names, found {}",
                    args_node.describe()
                ),
            )
            .with_hint(
                "list the operator's parameters in schema order, e.g. `args: [out, x, eps]`",
            ));
    };
    let mut params: Vec<String> = Vec::new();
    for it in items {
        let p = ctx.string(it, "a parameter name")?;
        if params.contains(&p.value) {
            return Err(ctx
                .err(
                    p.span,
                    format!("parameter `{}` appears twice in `args`", p.value),
                )
                .with_hint("name each parameter once"));
        }
        params.push(p.value);
    }
    let mut calls = Vec::new();
    let mut expr = |node: &YNode, what: &str| -> Result<DecompExpr, SourceError> {
        let text = ctx.string(node, what)?;
        let (e, c) = decomposition(ctx, node, &text.value)?;
        if let Some(i) = max_arg(&e).filter(|&i| i >= params.len()) {
            return Err(ctx
                .err(
                    node.span,
                    format!(
                        "{what} reads `${i}`, but `args` names {} parameters",
                        params.len()
                    ),
                )
                .with_hint("`$i` is the i-th name of `args`, counting from 0"));
        }
        calls.extend(c);
        Ok(e)
    };
    let returns = find(&keys, "returns")
        .map(|(_, r)| expr(r, "`returns`"))
        .transpose()?;
    let mut writes: Vec<(usize, DecompExpr)> = Vec::new();
    if let Some((_, w)) = find(&keys, "writes") {
        let wm = ctx.map(w, "`writes`", "write `writes: { out: \"relu($1)\" }`")?;
        for (param, value) in ctx.keys(&wm, None, "`writes`")? {
            let Some(i) = params.iter().position(|p| *p == param.value) else {
                return Err(ctx
                    .err(
                        param.span,
                        format!(
                            "`{}` is not a parameter in `args`{}",
                            param.value,
                            did_you_mean_suffix(&param.value, params.iter().map(String::as_str))
                        ),
                    )
                    .with_hint("`writes` maps parameters named in `args` to their new values"));
            };
            writes.push((
                i,
                expr(value, &format!("the new value of `{}`", param.value))?,
            ));
        }
    }
    // `auto_functionalized` returns the written arguments in schema order.
    writes.sort_by_key(|(i, _)| *i);
    if returns.is_none() && writes.is_empty() {
        return Err(ctx
            .err(v.span, format!("{what} has neither `returns` nor `writes`"))
            .with_hint("say what the operator returns, what it overwrites, or both"));
    }
    Ok((
        OpMeaning::Decompose(DecompExpr::Signature(Box::new(Signature {
            params,
            returns,
            writes,
        }))),
        calls,
    ))
}

fn max_arg(e: &DecompExpr) -> Option<usize> {
    match e {
        DecompExpr::Arg(i) => Some(*i),
        DecompExpr::List(items) | DecompExpr::Call { args: items, .. } => {
            items.iter().filter_map(max_arg).max()
        }
        _ => None,
    }
}

fn constant_values(ctx: &Ctx, node: &YNode) -> Result<Vec<ConstantValue>, SourceError> {
    let m = ctx.map(
        node,
        "`constants`",
        "write `constants: { _tensor_constant0: 0.0 }`",
    )?;
    let mut out = Vec::new();
    for (key, v) in ctx.keys(&m, None, "`constants`")? {
        let value = v
            .scalar()
            .filter(|_| v.is_plain())
            .and_then(|s| match s {
                "true" | "True" => Some(1.0),
                "false" | "False" => Some(0.0),
                _ => s.replace('_', "").parse::<f64>().ok(),
            })
            .filter(|f| f.is_finite());
        let Some(value) = value else {
            return Err(ctx
                .err(
                    v.span,
                    format!(
                        "the value of constant `{}` must be a number, found {}",
                        key.value,
                        v.describe()
                    ),
                )
                .with_hint("write the scalar the module attribute holds, e.g. `0` or `0.0`"));
        };
        out.push((
            key,
            Located {
                value,
                span: v.span,
            },
        ));
    }
    Ok(out)
}

fn assumptions(ctx: &Ctx, node: &YNode) -> Result<Vec<Assumption>, SourceError> {
    let m = ctx.map(node, "`assume`", "write `assume: { dropout: same-mask }`")?;
    let known: Vec<&str> = ASSUMPTIONS
        .iter()
        .map(|(k, _)| *k)
        .chain(OVERRIDES.iter().map(|(k, _, _)| *k))
        .collect();
    let keys = ctx.keys(&m, Some(&known), "`assume`")?;
    let mut out = Vec::new();
    for (key, v) in keys {
        if let Some((_, fields, example)) = OVERRIDES.iter().find(|(k, _, _)| *k == key.value) {
            let what = format!("`{}`", key.value);
            let entries = ctx.map(v, &what, &format!("write `{example}`"))?;
            let named = ctx.keys(&entries, Some(fields), &what)?;
            for f in fields.iter() {
                if !named.iter().any(|(k, _)| k.value == *f) {
                    return Err(ctx
                        .err(v.span, format!("{what} needs `{f}`"))
                        .with_hint(format!("write `{example}`")));
                }
            }
            let mut parsed = Vec::new();
            for (k, item) in named {
                let items = match &item.kind {
                    YKind::Seq(xs) if !xs.is_empty() => xs
                        .iter()
                        .map(|x| ctx.string(x, &format!("an item of `{}`", k.value)))
                        .collect::<Result<Vec<_>, _>>()?,
                    _ => vec![ctx.string(item, &format!("`{}`", k.value))?],
                };
                parsed.push((k, items));
            }
            out.push(Assumption {
                key,
                value: Located {
                    value: String::new(),
                    span: v.span,
                },
                fields: parsed,
            });
            continue;
        }
        let allowed = ASSUMPTIONS
            .iter()
            .find(|(k, _)| *k == key.value)
            .map_or(&[][..], |(_, a)| *a);
        let value = ctx.string(v, &format!("`{}`", key.value))?;
        if !allowed.contains(&value.value.as_str()) {
            return Err(ctx
                .err(
                    v.span,
                    format!(
                        "unknown value `{}` for assumption `{}`{}",
                        value.value,
                        key.value,
                        did_you_mean_suffix(&value.value, allowed.iter().copied())
                    ),
                )
                .with_hint(format!(
                    "`{}` accepts {}",
                    key.value,
                    list_names(allowed.iter().copied())
                )));
        }
        out.push(Assumption {
            key,
            value,
            fields: Vec::new(),
        });
    }
    Ok(out)
}
