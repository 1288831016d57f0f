//! Resolution of a parsed case file against its mesh and graphs.

use crate::expr::fmt_shape;
use crate::layout::{
    explain_dim, rank_pieces, Block, Blocks, Held, Layout, LayoutError, PlacedLayout, RankPiece,
};
use crate::placement::Placement;
use crate::suggest::{did_you_mean_suffix, list_names};
use crate::syntax::{
    parse_case, BlocksSpec, CaseFile, Ctx, GroupTarget, LayoutSpec, PlacementSpec, TensorEntry,
    ENTRY_KEYS,
};
use shardproof_ir::{
    Arg, Graph, Located, MemberIndex, Mesh, NodeKind, OpMeaning, OpName, ProcessGroup, Program,
    SourceError, Span, TensorType, ValueId,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A bound that keeps rank enumeration (groups, pieces) cheap on hostile input.
const MAX_RANKS: usize = 1 << 16;

/// A case resolved against its graphs: everything an engine needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The case file.
    pub file: PathBuf,
    /// `name:`, or the file stem.
    pub name: String,
    /// The specification graph.
    pub spec: Graph,
    /// The distributed implementation: mesh, process groups (declared ones, plus on a 1-d mesh
    /// the undeclared ones its collectives use), one graph per rank.
    pub program: Program,
    /// The input relation, in file order.
    pub inputs: Vec<InputRelation>,
    /// The output expectations, in file order (empty: every spec output must be rebuildable).
    pub outputs: Vec<OutputExpectation>,
    /// Custom operator meanings by operator name as written (`tg.log_tensor`).
    pub ops: BTreeMap<String, OpMeaning>,
    /// Accepted assumptions.
    pub assume: Assumptions,
    /// Values of 0-d module constants by attribute name (`constants:`); they hold in every
    /// graph that has such an attribute.
    pub constants: BTreeMap<String, f64>,
    /// The case file as parsed, for positions in later diagnostics.
    pub source: CaseFile,
}

/// How one spec tensor is laid out on the ranks (an `inputs:` entry, resolved).
#[derive(Clone, Debug, PartialEq)]
pub struct InputRelation {
    /// The spec tensor's name.
    pub spec_name: String,
    /// The spec tensor.
    pub spec_value: ValueId,
    /// The impl-side name (the spec name unless renamed; the spec name for `expr:` layouts).
    pub impl_name: String,
    /// The impl-side tensor in each rank graph, in rank order. Empty for `expr:` layouts,
    /// whose expression names its tensors, and for layouts that `at:` restricts to some ranks
    /// (see `rank_values`).
    pub impl_values: Vec<ValueId>,
    /// The impl-side tensor on each rank that holds it, as (rank, value) in rank order: every
    /// rank, or the ranks `at:` selects. Empty for `expr:` layouts.
    pub rank_values: Vec<(usize, ValueId)>,
    /// The layout.
    pub layout: Layout,
    /// True when the spec tensor is not a graph input: it becomes a leaf in both programs and
    /// its producers are not checked.
    pub cut: bool,
    /// Where the entry's key is.
    pub span: Span,
}

/// What the user expects of one spec tensor in the implementation (an `outputs:` entry).
#[derive(Clone, Debug, PartialEq)]
pub struct OutputExpectation {
    /// The spec tensor's name.
    pub spec_name: String,
    /// The spec tensor.
    pub spec_value: ValueId,
    /// True when it is one of the spec graph's outputs (otherwise an intermediate value).
    pub is_graph_output: bool,
    /// The impl-side name (the spec name unless renamed; the spec name for `expr:` layouts).
    pub impl_name: String,
    /// The impl-side tensor in each rank graph, in rank order (empty for `expr:` layouts and
    /// for layouts that `at:` restricts to some ranks; see `rank_values`).
    pub impl_values: Vec<ValueId>,
    /// The impl-side tensor on each rank that holds it, as (rank, value) in rank order: every
    /// rank, or the ranks `at:` selects. Empty for `expr:` layouts.
    pub rank_values: Vec<(usize, ValueId)>,
    /// The layout the impl must hold it in.
    pub layout: Layout,
    /// Where the entry's key is.
    pub span: Span,
}

/// Assumptions the user accepts (`assume:`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assumptions {
    /// `dropout:`, when given.
    pub dropout: Option<Located<DropoutAssumption>>,
    /// `ignore-index: unused`: no loss target equals its loss's `ignore_index`, so a mean over
    /// targets divides by their count (where the assumption is stated, when given).
    pub ignore_index_unused: Option<Span>,
    /// Approximation overrides (TrainVerify section 5.3), in file order: computations the
    /// ranks approximate, accepted as their strict versions. Only `prove` applies them.
    pub overrides: Vec<Override>,
}

/// An approximation override of `assume:`: the ranks compute an approximation of the spec's
/// strict computation, and the user accepts it; the prover substitutes the strict version in
/// the ranks (TrainVerify section 5.3) and reports that it did.
#[derive(Clone, Debug, PartialEq)]
pub enum Override {
    /// `batch-norm: { per-device: G, stats: [...] }`: the named rank values are per-device
    /// batch statistics (means over the batch the ranks along mesh dim `G` split); the strict
    /// computation averages them over `G`.
    BatchNormPerDevice {
        /// The mesh dim the batch is split over.
        group: Located<String>,
        /// Its index in the mesh.
        dim: usize,
        /// The rank values that are per-device statistics.
        stats: Vec<Located<String>>,
        /// Where the entry is.
        span: Span,
    },
    /// `moe-routing: { node-limited: S, nodes: N, top-nodes: K }`: the named rank values are
    /// routing scores masked to the experts of the `K` best of `N` nodes; the strict
    /// computation routes over every expert (the unmasked scores).
    NodeLimitedRouting {
        /// The masked scores.
        scores: Vec<Located<String>>,
        /// Expert groups (nodes) the experts are split into.
        nodes: Located<usize>,
        /// Groups a token may be routed to.
        top_nodes: Located<usize>,
        /// Where the entry is.
        span: Span,
    },
}

/// What may be assumed of random dropout masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropoutAssumption {
    /// `same-mask`: the masks are laid out like the tensors they apply to (one random mask for
    /// the spec tensor, sliced / replicated like it on the ranks).
    SameMask,
}

impl Case {
    /// The names of the values rank `rank`'s graph is given: the rank tensors the case's
    /// `inputs:` lay out on it, and its constants. A run computes only what these reach.
    pub fn rank_leaves(&self, rank: usize) -> BTreeSet<String> {
        let Some(graph) = self.program.ranks.get(rank) else {
            return BTreeSet::new();
        };
        let laid_out = self.inputs.iter().flat_map(|rel| {
            // `rank_values` is in rank order: a binary search, not a scan of every rank's
            // entry per rank (quadratic in the ranks: 8192 of them on the 405b plan).
            let from = rel
                .rank_values
                .partition_point(|&(holder, _)| holder < rank);
            let placed = rel.rank_values[from..]
                .iter()
                .take_while(move |&&(holder, _)| holder == rank)
                .map(|&(_, v)| graph.value_name(v).to_string());
            // An `expr:` layout gives the rank the tensors its expression names.
            let named: Vec<String> = match &rel.layout {
                Layout::Expr(e) => e
                    .tensors()
                    .into_iter()
                    .filter(|&(r, _, _)| r == rank)
                    .map(|(_, name, _)| name.to_string())
                    .collect(),
                _ => Vec::new(),
            };
            placed.chain(named)
        });
        let constants = graph
            .nodes
            .iter()
            .filter(|n| matches!(n.kind, shardproof_ir::NodeKind::Constant { .. }))
            .map(|n| n.outputs[0].name.clone());
        laid_out.chain(constants).collect()
    }

    /// Every `scale:` of the `inputs:` entries, by spec name: each rank's tensor of that
    /// relation is the scale times the piece its placement gives (a case loaded by
    /// [`load_case_with_scales`]; [`load_case`] refuses them).
    pub fn scales(&self) -> BTreeMap<String, u64> {
        self.source
            .inputs
            .iter()
            .filter_map(|e| Some((e.name.value.clone(), e.scale.as_ref()?.value)))
            .collect()
    }

    /// The relation of a spec input (or cut) by spec name.
    pub fn input(&self, spec_name: &str) -> Option<&InputRelation> {
        self.inputs.iter().find(|r| r.spec_name == spec_name)
    }

    /// The declared meaning of an operator: by its full name, else by `namespace.name`.
    pub fn op_meaning(&self, op: &OpName) -> Option<&OpMeaning> {
        self.ops
            .get(&op.to_string())
            .or_else(|| self.ops.get(&op.base()))
    }

    /// What `rank` holds of spec value `spec_value` laid out by `layout`, using the spec's
    /// recorded (concrete) shape.
    pub fn pieces(
        &self,
        layout: &Layout,
        spec_value: ValueId,
        rank: usize,
    ) -> Result<RankPiece, LayoutError> {
        let shape = self
            .spec
            .recorded_type(spec_value)
            .and_then(TensorType::concrete_shape)
            .ok_or_else(|| LayoutError {
                message: format!(
                    "spec value `{}` has no concrete recorded shape",
                    self.spec.value_name(spec_value)
                ),
            })?;
        rank_pieces(layout, &shape, &self.program.mesh, rank)
    }

    /// Checks that every operator a decomposition in `ops:` calls is known (`known` is the
    /// operator registry's membership test); the error points at the call.
    pub fn validate_ops(&self, known: &dyn Fn(&OpName) -> bool) -> Result<(), SourceError> {
        for d in &self.source.ops {
            for (op, span) in &d.calls {
                if !known(op) {
                    return Err(SourceError::new(
                        &self.file,
                        Some(*span),
                        format!(
                            "unknown operator `{op}` in the meaning of `{}`",
                            d.name.value
                        ),
                    )
                    .with_hint(
                        "decompositions call operators shardproof implements; a bare name \
                         means `aten.<name>.default`, otherwise write `namespace.name.overload`",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Reads a case file and everything it names, and resolves it: the YAML, then the checks that
/// need no graph, then the spec and rank graphs (paths relative to the case file; their own
/// errors pass through), then the checks against the graphs.
///
/// A `scale:` on an `inputs:` entry is refused here, pointing at it: only `shardproof prove`
/// reads it ([`load_case_with_scales`]), and an engine reading the placement alone would check
/// another relation than the one the case states.
pub fn load_case(path: &Path) -> Result<Case, SourceError> {
    read_case(path, false).map_err(shardproof_import::shorten_quotes)
}

/// [`load_case`], accepting `scale:` on `inputs:` entries ([`Case::scales`]): for callers
/// that state the scaled relations in what they prove (`shardproof prove`).
pub fn load_case_with_scales(path: &Path) -> Result<Case, SourceError> {
    read_case(path, true).map_err(shardproof_import::shorten_quotes)
}

/// The first `scale:` of `file`'s inputs, as an error for a caller that does not read it.
fn refuse_scales(file: &CaseFile) -> Result<(), SourceError> {
    let Some((e, c)) = file
        .inputs
        .iter()
        .find_map(|e| e.scale.as_ref().map(|c| (e, c)))
    else {
        return Ok(());
    };
    Err(SourceError::new(
        &file.path,
        Some(c.span),
        format!(
            "`scale` on the input `{}` is read by `shardproof prove` only",
            e.name.value
        ),
    )
    .with_hint(
        "check, verify, run and trace read the placement alone, and the scaled relation is not it: prove the case with `shardproof prove`, or remove `scale`",
    ))
}

fn read_case(path: &Path, scales: bool) -> Result<Case, SourceError> {
    let bytes = std::fs::read(path).map_err(|e| {
        SourceError::new(path, None, format!("cannot read the case file: {e}"))
            .with_hint("check that the path exists and is a readable UTF-8 text file")
    })?;
    let text = shardproof_import::decode_utf8(&bytes, path)?;
    let file = parse_case(text, path)?;
    if !scales {
        refuse_scales(&file)?;
    }
    let prep = prepare(&file)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let spec = load_graph_at(&file, base, &file.spec.path, "spec graph")?;
    // Ranks that share a graph file (the zoo's presets map thousands of ranks to a few files)
    // parse it once: the same bytes give the same graph.
    let mut parsed: BTreeMap<&str, Arc<Graph>> = BTreeMap::new();
    let mut ranks = Vec::with_capacity(file.impl_.graphs.len());
    for (r, g) in file.impl_.graphs.iter().enumerate() {
        let graph = match parsed.get(g.value.as_str()) {
            Some(graph) => graph.clone(),
            None => {
                let graph = Arc::new(load_graph_at(
                    &file,
                    base,
                    g,
                    &format!("graph of rank {r}"),
                )?);
                parsed.insert(&g.value, graph.clone());
                graph
            }
        };
        ranks.push(graph);
    }
    drop(parsed);
    let (spec, ranks) = inline_declared(spec, ranks, &prep.ops);
    finish(file, prep, spec, ranks)
}

/// The graphs with the operators declared in `ops:` inlined ([`crate::expand`]); ranks that
/// share a graph keep sharing its expansion.
fn inline_declared(
    spec: Graph,
    ranks: Vec<Arc<Graph>>,
    ops: &BTreeMap<String, OpMeaning>,
) -> (Graph, Vec<Arc<Graph>>) {
    let spec = crate::expand::expand_declared(&spec, ops).unwrap_or(spec);
    let mut done: Vec<(Arc<Graph>, Arc<Graph>)> = Vec::new();
    let ranks = ranks
        .into_iter()
        .map(|g| {
            if let Some((_, e)) = done.iter().find(|(o, _)| Arc::ptr_eq(o, &g)) {
                return e.clone();
            }
            let e = crate::expand::expand_declared(&g, ops).map_or_else(|| g.clone(), Arc::new);
            done.push((g, e.clone()));
            e
        })
        .collect();
    (spec, ranks)
}

/// Resolves a parsed case against graphs the caller already has (`ranks` in rank order). A
/// `scale:` is refused, as [`load_case`] refuses it.
pub fn resolve_case(file: CaseFile, spec: Graph, ranks: Vec<Graph>) -> Result<Case, SourceError> {
    refuse_scales(&file)?;
    let prep = prepare(&file).map_err(shardproof_import::shorten_quotes)?;
    let ranks = ranks.into_iter().map(Arc::new).collect();
    let (spec, ranks) = inline_declared(spec, ranks, &prep.ops);
    finish(file, prep, spec, ranks).map_err(shardproof_import::shorten_quotes)
}

fn load_graph_at(
    file: &CaseFile,
    base: &Path,
    p: &Located<String>,
    what: &str,
) -> Result<Graph, SourceError> {
    let full = base.join(&p.value);
    if !full.is_file() {
        return Err(SourceError::new(
            &file.path,
            Some(p.span),
            format!(
                "cannot find the {what} `{}` (looked for {})",
                p.value,
                full.display()
            ),
        )
        .with_hint("graph paths are relative to the directory of the case file"));
    }
    shardproof_import::load_graph(&full)
}

/// What is known before the graphs are read.
struct Prepared {
    mesh: Mesh,
    groups: Vec<(ProcessGroup, Span)>,
    inputs: Vec<Layout>,
    outputs: Vec<Layout>,
    ops: BTreeMap<String, OpMeaning>,
    assume: Assumptions,
}

fn mesh_text(mesh: &Mesh) -> String {
    let dims: Vec<String> = mesh.dims.iter().map(|(n, s)| format!("{n}: {s}")).collect();
    format!("{{ {} }}", dims.join(", "))
}

fn prepare(file: &CaseFile) -> Result<Prepared, SourceError> {
    let ctx = Ctx { file: &file.path };
    let mut dims = Vec::new();
    let mut size = 1usize;
    for d in &file.impl_.mesh {
        if ENTRY_KEYS.contains(&d.name.value.as_str()) || d.name.value == "all" {
            return Err(ctx
                .err(
                    d.name.span,
                    format!("`{}` cannot name a mesh dim", d.name.value),
                )
                .with_hint(format!(
                    "{} and `all` are keywords of the case format; rename the dim",
                    list_names(ENTRY_KEYS)
                )));
        }
        size = size
            .checked_mul(d.size.value)
            .filter(|s| *s <= MAX_RANKS)
            .ok_or_else(|| {
                ctx.err(
                    d.size.span,
                    format!("the mesh has more than {MAX_RANKS} ranks"),
                )
                .with_hint("shardproof checks programs captured per rank; use a smaller mesh")
            })?;
        dims.push((d.name.value.clone(), d.size.value));
    }
    let mesh = Mesh::new(dims);
    check_rank_count(file, &mesh, file.impl_.graphs.len(), "`graphs` lists")?;
    let mut groups = Vec::new();
    for g in &file.impl_.groups {
        groups.push((resolve_group(&ctx, g, &mesh)?, g.name.span));
    }
    let inputs = file
        .inputs
        .iter()
        .map(|e| layout_of(&ctx, e, &mesh))
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = file
        .outputs
        .iter()
        .map(|e| layout_of(&ctx, e, &mesh))
        .collect::<Result<Vec<_>, _>>()?;
    let ops = file
        .ops
        .iter()
        .map(|d| (d.name.value.clone(), d.meaning.clone()))
        .collect();
    let mut assume = Assumptions::default();
    for a in &file.assume {
        if a.key.value == "dropout" && a.value.value == "same-mask" {
            assume.dropout = Some(Located {
                value: DropoutAssumption::SameMask,
                span: a.value.span,
            });
        }
        if a.key.value == "ignore-index" && a.value.value == "unused" {
            assume.ignore_index_unused = Some(a.value.span);
        }
        if !a.fields.is_empty() {
            assume.overrides.push(resolve_override(&ctx, a, &mesh)?);
        }
    }
    Ok(Prepared {
        mesh,
        groups,
        inputs,
        outputs,
        ops,
        assume,
    })
}

fn override_field<'a>(a: &'a crate::syntax::Assumption, name: &str) -> &'a [Located<String>] {
    a.fields
        .iter()
        .find(|(k, _)| k.value == name)
        .map_or(&[][..], |(_, v)| v.as_slice())
}

fn override_int(
    ctx: &Ctx,
    a: &crate::syntax::Assumption,
    name: &str,
) -> Result<Located<usize>, SourceError> {
    let items = override_field(a, name);
    let item = &items[0];
    match item.value.trim().parse::<usize>() {
        Ok(n) if n >= 1 && items.len() == 1 => Ok(Located {
            value: n,
            span: item.span,
        }),
        _ => Err(ctx
            .err(
                item.span,
                format!(
                    "`{name}` must be a positive whole number, found `{}`",
                    item.value
                ),
            )
            .with_hint(format!("write `{name}: 4`"))),
    }
}

fn resolve_override(
    ctx: &Ctx,
    a: &crate::syntax::Assumption,
    mesh: &Mesh,
) -> Result<Override, SourceError> {
    if a.key.value == "batch-norm" {
        let groups = override_field(a, "per-device");
        let group = &groups[0];
        let names: Vec<&str> = mesh.dims.iter().map(|(n, _)| n.as_str()).collect();
        let dim = match mesh.dim_index(&group.value) {
            Some(d) if groups.len() == 1 => d,
            _ => {
                return Err(ctx
                    .err(
                        group.span,
                        format!(
                            "`per-device` must name one mesh dim, found `{}`{}",
                            group.value,
                            did_you_mean_suffix(&group.value, names.iter().copied())
                        ),
                    )
                    .with_hint(format!(
                        "name the mesh dim the batch is split over: {}",
                        list_names(names.iter().copied())
                    )))
            }
        };
        if mesh.dims[dim].1 < 2 {
            return Err(ctx
                .err(
                    group.span,
                    format!(
                        "mesh dim `{}` has one rank: no statistics are per-device along it",
                        group.value
                    ),
                )
                .with_hint("name the mesh dim the batch is split over"));
        }
        return Ok(Override::BatchNormPerDevice {
            group: group.clone(),
            dim,
            stats: override_field(a, "stats").to_vec(),
            span: a.key.span,
        });
    }
    let nodes = override_int(ctx, a, "nodes")?;
    let top_nodes = override_int(ctx, a, "top-nodes")?;
    if top_nodes.value >= nodes.value {
        return Err(ctx
            .err(
                top_nodes.span,
                format!(
                    "`top-nodes` ({}) must be fewer than `nodes` ({}): routing to every node is not limited",
                    top_nodes.value, nodes.value
                ),
            )
            .with_hint("write the number of nodes a token may be routed to, below `nodes`"));
    }
    Ok(Override::NodeLimitedRouting {
        scores: override_field(a, "node-limited").to_vec(),
        nodes,
        top_nodes,
        span: a.key.span,
    })
}

fn check_rank_count(file: &CaseFile, mesh: &Mesh, n: usize, what: &str) -> Result<(), SourceError> {
    if n == mesh.size() {
        return Ok(());
    }
    Err(SourceError::new(
        &file.path,
        Some(file.impl_.graphs_span),
        format!(
            "the mesh {} has {} ranks but {what} {n} graphs",
            mesh_text(mesh),
            mesh.size()
        ),
    )
    .with_hint("list one graph per rank, in rank order (ranks are row-major over the mesh dims)"))
}

fn mesh_dim(
    ctx: &Ctx,
    mesh: &Mesh,
    name: &Located<String>,
    context: &str,
) -> Result<usize, SourceError> {
    mesh.dim_index(&name.value).ok_or_else(|| {
        let names: Vec<&str> = mesh.dims.iter().map(|(n, _)| n.as_str()).collect();
        ctx.err(
            name.span,
            format!(
                "unknown mesh dim `{}` in {context}{}",
                name.value,
                did_you_mean_suffix(&name.value, names.iter().copied())
            ),
        )
        .with_hint(format!("the mesh dims are {}", list_names(names)))
    })
}

fn resolve_group(
    ctx: &Ctx,
    g: &crate::syntax::GroupDecl,
    mesh: &Mesh,
) -> Result<ProcessGroup, SourceError> {
    let name = &g.name.value;
    let members = match &g.target.value {
        GroupTarget::All => vec![(0..mesh.size()).collect()],
        GroupTarget::Dims(dims) => {
            let mut idx: Vec<usize> = Vec::new();
            for d in dims {
                let i = mesh_dim(ctx, mesh, d, &format!("process group `{name}`"))?;
                if idx.contains(&i) {
                    return Err(ctx
                        .err(
                            d.span,
                            format!("mesh dim `{}` appears twice in group `{name}`", d.value),
                        )
                        .with_hint("name each mesh dim once"));
                }
                idx.push(i);
            }
            mesh.groups_along(&idx)
        }
        GroupTarget::Ranks(lists) => {
            let mut seen: HashMap<usize, Span> = HashMap::new();
            let mut out = Vec::new();
            for list in lists {
                let mut ranks = Vec::new();
                for r in list {
                    if r.value >= mesh.size() {
                        return Err(ctx
                            .err(
                                r.span,
                                format!(
                                    "rank {} is outside the mesh {} of {} ranks",
                                    r.value,
                                    mesh_text(mesh),
                                    mesh.size()
                                ),
                            )
                            .with_hint(format!("ranks are 0 to {}", mesh.size() - 1)));
                    }
                    if let Some(prev) = seen.insert(r.value, r.span) {
                        return Err(ctx
                            .err(
                                r.span,
                                format!("rank {} appears twice in group `{name}`", r.value),
                            )
                            .with_hint(format!(
                                "the rank lists of a group are disjoint; rank {} is already at \
                                 line {}, column {}",
                                r.value, prev.line, prev.col
                            )));
                    }
                    ranks.push(r.value);
                }
                // torch.distributed.new_group sorts its ranks; collectives follow that order.
                ranks.sort_unstable();
                out.push(ranks);
            }
            out
        }
    };
    Ok(ProcessGroup {
        name: name.clone(),
        members,
    })
}

fn layout_of(ctx: &Ctx, e: &TensorEntry, mesh: &Mesh) -> Result<Layout, SourceError> {
    let LayoutSpec::Placed {
        placement,
        blocks,
        replicas,
        at,
    } = &e.layout
    else {
        let LayoutSpec::Expr(x) = &e.layout else {
            unreachable!()
        };
        return Ok(Layout::Expr(x.clone()));
    };
    let n = mesh.dims.len();
    let placements = match placement {
        PlacementSpec::Bare(p) => {
            if n == 1 {
                vec![p.value]
            } else if p.value == Placement::Replicate {
                vec![Placement::Replicate; n]
            } else {
                let first = &mesh.dims[0].0;
                return Err(ctx
                    .err(
                        p.span,
                        format!(
                            "`{}` alone is ambiguous on the {n}-d mesh {}",
                            p.value,
                            mesh_text(mesh)
                        ),
                    )
                    .with_hint(format!(
                        "say which mesh dim it applies to, e.g. `{{ {first}: {} }}` (dims not \
                         named are Replicate()), or give one placement per mesh dim in a list",
                        p.value
                    )));
            }
        }
        PlacementSpec::PerDimMap(entries) => {
            let mut out = vec![Placement::Replicate; n];
            for (k, p) in entries {
                let i = mesh.dim_index(&k.value).ok_or_else(|| {
                    let names: Vec<&str> = mesh.dims.iter().map(|(n, _)| n.as_str()).collect();
                    let candidates = names.iter().copied().chain(ENTRY_KEYS);
                    ctx.err(
                        k.span,
                        format!(
                            "unknown mesh dim `{}` in the placement of `{}`{}",
                            k.value,
                            e.name.value,
                            did_you_mean_suffix(&k.value, candidates)
                        ),
                    )
                    .with_hint(format!(
                        "the mesh dims are {}; an entry's own keys are {}",
                        list_names(names),
                        list_names(ENTRY_KEYS)
                    ))
                })?;
                out[i] = p.value;
            }
            out
        }
        PlacementSpec::PerDimList(list) => {
            if list.value.len() != n {
                return Err(ctx
                    .err(
                        list.span,
                        format!(
                            "{} placements for the {n}-d mesh {}",
                            list.value.len(),
                            mesh_text(mesh)
                        ),
                    )
                    .with_hint("give one placement per mesh dim, in mesh order"));
            }
            list.value.iter().map(|p| p.value).collect()
        }
    };
    let top = replicas.as_ref().map_or(1, |r| r.value);
    let blocks = match blocks.as_ref().map(|b| &b.value) {
        None => Blocks::Equal {
            count: 1,
            replicas: top,
        },
        Some(BlocksSpec::Count(c)) => Blocks::Equal {
            count: *c,
            replicas: top,
        },
        Some(BlocksSpec::Sizes(b)) => Blocks::Sizes(
            b.iter()
                .map(|b| Block {
                    size: b.size.value,
                    replicas: b.replicas.as_ref().map_or(top, |r| r.value),
                })
                .collect(),
        ),
    };
    let at = held_at(ctx, e, at, mesh, &placements)?;
    let l = PlacedLayout {
        placements,
        blocks,
        at,
    };
    l.check(mesh).map_err(|m| {
        ctx.err(
            e.value_span,
            format!("the layout of `{}`: {m}", e.name.value),
        )
        .with_hint("see \"Layouts\" in docs/formats/case-format.md")
    })?;
    Ok(Layout::Placed(l))
}

/// The `at:` of an entry against the mesh: known dims, each named once, coordinates inside
/// the dim, and a `Replicate()` placement on each (errors at the offending key or value).
fn held_at(
    ctx: &Ctx,
    e: &TensorEntry,
    at: &[crate::syntax::AtDim],
    mesh: &Mesh,
    placements: &[Placement],
) -> Result<Vec<Held>, SourceError> {
    let mut out: Vec<Held> = Vec::new();
    for (name, coords) in at {
        let names: Vec<&str> = mesh.dims.iter().map(|(n, _)| n.as_str()).collect();
        let dim = mesh.dim_index(&name.value).ok_or_else(|| {
            ctx.err(
                name.span,
                format!(
                    "unknown mesh dim `{}` in the `at` of `{}`{}",
                    name.value,
                    e.name.value,
                    did_you_mean_suffix(&name.value, names.iter().copied())
                ),
            )
            .with_hint(format!(
                "the mesh dims are {}",
                list_names(names.iter().copied())
            ))
        })?;
        let size = mesh.dims[dim].1;
        if let Some(c) = coords.value.iter().find(|&&c| c >= size) {
            return Err(ctx
                .err(
                    coords.span,
                    format!(
                        "`{}` is held at {} = {c}, but mesh dim `{}` has size {size}",
                        e.name.value, name.value, name.value
                    ),
                )
                .with_hint(format!(
                    "coordinates along `{}` are 0 to {}",
                    name.value,
                    size - 1
                )));
        }
        if placements[dim] != Placement::Replicate {
            return Err(ctx
                .err(
                    name.span,
                    format!(
                        "`{}` is both placed {} over mesh dim `{}` and restricted to some of its \
                         coordinates by `at`",
                        e.name.value, placements[dim], name.value
                    ),
                )
                .with_hint(format!(
                    "`at` picks the ranks along `{}` that hold the tensor, each a whole copy: \
                     leave `{}` out of the placement (Replicate())",
                    name.value, name.value
                )));
        }
        let mut held: Vec<usize> = coords.value.clone();
        held.sort_unstable();
        held.dedup();
        out.push(Held {
            dim,
            name: name.value.clone(),
            coords: held,
        });
    }
    Ok(out)
}

fn graph_label(g: &Graph) -> String {
    match &g.path {
        Some(p) => p.file_name().map_or_else(
            || p.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        ),
        None => g.name.clone(),
    }
}

/// One use of a process group by a collective in a rank graph.
struct GroupUse {
    group: String,
    rank: usize,
    node: String,
    op: OpName,
    line: Option<usize>,
    group_size: Option<i64>,
}

/// Collectives of the functional c10d API name their group by the last string argument (or
/// `group_name=`); `wait_tensor` names none.
fn group_uses(ranks: &[Arc<Graph>]) -> Vec<GroupUse> {
    let mut out = Vec::new();
    for (rank, g) in ranks.iter().enumerate() {
        for n in &g.nodes {
            let NodeKind::Call { op, args, .. } = &n.kind else {
                continue;
            };
            if !op.namespace.starts_with("_c10d_functional") {
                continue;
            }
            let name = match n.kwarg("group_name") {
                Some(Arg::Str(s)) => Some(s.clone()),
                _ => args.iter().rev().find_map(|a| match a {
                    Arg::Str(s) => Some(s.clone()),
                    _ => None,
                }),
            };
            let Some(group) = name else { continue };
            let size_pos = match op.name.as_str() {
                "all_gather_into_tensor" => Some(1),
                "reduce_scatter_tensor" => Some(2),
                _ => None,
            };
            let group_size = n
                .kwarg("group_size")
                .and_then(Arg::as_int)
                .or_else(|| size_pos.and_then(|p| args.get(p)).and_then(Arg::as_int));
            out.push(GroupUse {
                group,
                rank,
                node: n.name.clone(),
                op: op.clone(),
                line: n.line,
                group_size,
            });
        }
    }
    out
}

fn resolve_program_groups(
    ctx: &Ctx,
    file: &CaseFile,
    mesh: &Mesh,
    declared: Vec<(ProcessGroup, Span)>,
    ranks: &[Arc<Graph>],
) -> Result<Vec<ProcessGroup>, SourceError> {
    let mut groups = declared;
    let at = file.impl_.groups_span.unwrap_or(file.impl_.span);
    let uses = group_uses(ranks);
    let where_ = |u: &GroupUse| {
        format!(
            "`{}` (node `{}` of rank {} in {}{})",
            u.op,
            u.node,
            u.rank,
            graph_label(&ranks[u.rank]),
            u.line.map_or_else(String::new, |l| format!(", line {l}"))
        )
    };
    // Membership first: a rank outside its group is a more basic mistake than a size mismatch.
    let mut resolved = Vec::with_capacity(uses.len());
    // The first undeclared group's error, reported after the membership of the uses before it.
    let mut undeclared = None;
    for u in &uses {
        let idx = match groups.iter().position(|(g, _)| g.name == u.group) {
            Some(i) => i,
            // An HLO replica-group name (`hlo{{0,1},{2,3}}`) states its own members, which
            // may be fewer than the mesh: taking it for the whole mesh would change the sums.
            None if mesh.dims.len() == 1 && !u.group.starts_with("hlo{") => {
                groups.push((
                    ProcessGroup {
                        name: u.group.clone(),
                        members: vec![(0..mesh.size()).collect()],
                    },
                    at,
                ));
                groups.len() - 1
            }
            None => {
                undeclared = Some(
                    ctx.err(
                        at,
                        format!(
                            "process group `{}` is used by {} but `impl.groups` does not \
                             declare it",
                            u.group,
                            where_(u)
                        ),
                    )
                    .with_hint(if u.group.starts_with("hlo{") {
                        format!(
                            "an HLO replica-group name states its members: declare it under \
                             `impl.groups` with those ranks, e.g. `\"{}\": [[0, 1], [2, 3]]` for \
                             `hlo{{{{0,1}},{{2,3}}}}` (the importer's `hlo_groups_yaml` writes \
                             these entries)",
                            u.group
                        )
                    } else {
                        format!(
                            "on the {}-d mesh {} every process group must be declared, e.g. \
                             `\"{}\": {}` under `impl.groups`",
                            mesh.dims.len(),
                            mesh_text(mesh),
                            u.group,
                            mesh.dims[mesh.dims.len() - 1].0
                        )
                    }),
                );
                break;
            }
        };
        resolved.push(idx);
    }
    // Each group indexed once: a search of its sets per use was quadratic in the ranks
    // (issue 45: 8192 ranks).
    let indices: Vec<MemberIndex> = groups.iter().map(|(g, _)| g.index(ranks.len())).collect();
    for (u, &idx) in uses.iter().zip(&resolved) {
        let span = &groups[idx].1;
        if indices[idx].group_of(u.rank).is_none() {
            return Err(ctx
                .err(
                    *span,
                    format!(
                        "rank {} calls {} on process group `{}`, which does not contain rank {}",
                        u.rank,
                        where_(u),
                        u.group,
                        u.rank
                    ),
                )
                .with_hint(
                    "every rank that calls a collective on a group must be a member of it",
                ));
        }
    }
    if let Some(e) = undeclared {
        return Err(e);
    }
    for (u, idx) in uses.iter().zip(resolved) {
        let (_, span) = &groups[idx];
        let members = indices[idx].group_of(u.rank).unwrap_or_default();
        if let Some(n) = u.group_size {
            if usize::try_from(n).ok() != Some(members.len()) {
                return Err(ctx
                    .err(
                        *span,
                        format!(
                            "{} runs on {n} ranks, but process group `{}` gives rank {} a group \
                             of {} ranks {:?}",
                            where_(u),
                            u.group,
                            u.rank,
                            members.len(),
                            members
                        ),
                    )
                    .with_hint("map the group to the mesh dims the collective actually spans"));
            }
        }
    }
    Ok(groups.into_iter().map(|(g, _)| g).collect())
}

/// `rank 0 has f32[1000, 768], rank 1 has f32[1152, 768]`, grouping ranks of the same type so
/// that large meshes stay readable.
fn ranks_text(tys: &[(usize, Option<&TensorType>)]) -> String {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for &(r, t) in tys {
        let s = t.map_or_else(|| "no recorded type".to_string(), |t| t.to_string());
        match groups.iter_mut().find(|(k, _)| *k == s) {
            Some((_, v)) => v.push(r),
            None => groups.push((s, vec![r])),
        }
    }
    groups
        .iter()
        .map(|(s, ranks)| {
            let mut parts: Vec<String> = Vec::new();
            let mut i = 0;
            while i < ranks.len() {
                let mut j = i;
                while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
                    j += 1;
                }
                parts.push(if i == j {
                    ranks[i].to_string()
                } else {
                    format!("{}-{}", ranks[i], ranks[j])
                });
                i = j + 1;
            }
            if ranks.len() == 1 {
                format!("rank {} has {s}", parts[0])
            } else {
                format!("ranks {} have {s}", parts.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

struct Resolver<'a> {
    ctx: Ctx<'a>,
    mesh: &'a Mesh,
    spec: &'a Graph,
    spec_index: HashMap<&'a str, ValueId>,
    ranks: &'a [Arc<Graph>],
    /// Per rank, its graph's names (one index per shared graph).
    rank_index: Vec<std::rc::Rc<HashMap<&'a str, ValueId>>>,
}

/// A resolved entry, before it becomes an input relation or an output expectation.
struct Resolved {
    spec_value: ValueId,
    impl_name: String,
    impl_values: Vec<ValueId>,
    rank_values: Vec<(usize, ValueId)>,
}

impl Resolver<'_> {
    fn spec_value(&self, e: &TensorEntry, section: &str) -> Result<ValueId, SourceError> {
        self.spec_index
            .get(e.name.value.as_str())
            .copied()
            .ok_or_else(|| {
                let suffix = did_you_mean_suffix(&e.name.value, self.spec_index.keys().copied());
                let mut inputs: Vec<&str> = self
                    .spec
                    .inputs
                    .iter()
                    .map(|v| self.spec.value_name(*v))
                    .collect();
                let hint = if section == "inputs" {
                    inputs.truncate(200);
                    format!(
                        "`inputs` names values of the spec graph {}; its inputs are {}",
                        graph_label(self.spec),
                        list_names(inputs)
                    )
                } else {
                    let outs: Vec<&str> = self
                        .spec
                        .outputs
                        .iter()
                        .flatten()
                        .map(|v| self.spec.value_name(*v))
                        .collect();
                    format!(
                        "`outputs` names values of the spec graph {}; its outputs are {}",
                        graph_label(self.spec),
                        list_names(outs)
                    )
                };
                self.ctx
                    .err(
                        e.name.span,
                        format!(
                            "unknown tensor `{}`: the spec graph has no value of that name{suffix}",
                            e.name.value
                        ),
                    )
                    .with_hint(hint)
            })
    }

    fn resolve(
        &self,
        e: &TensorEntry,
        layout: &Layout,
        section: &str,
    ) -> Result<Resolved, SourceError> {
        let spec_value = self.spec_value(e, section)?;
        let spec_ty = self.spec.recorded_type(spec_value);
        match layout {
            Layout::Expr(x) => {
                self.check_expr(e, x, spec_ty)?;
                Ok(Resolved {
                    spec_value,
                    impl_name: e.name.value.clone(),
                    impl_values: Vec::new(),
                    rank_values: Vec::new(),
                })
            }
            Layout::Placed(l) => {
                let (impl_name, at) = match &e.impl_name {
                    Some(n) => (n.value.clone(), n.span),
                    None => (e.name.value.clone(), e.name.span),
                };
                let mut rank_values = Vec::with_capacity(self.ranks.len());
                for (r, idx) in self.rank_index.iter().enumerate() {
                    if !l.holds(self.mesh, r) {
                        continue;
                    }
                    let Some(v) = idx.get(impl_name.as_str()) else {
                        let hint = if !l.at.is_empty() {
                            format!(
                                "the layout places it {}: every rank there must have it",
                                l.at.iter()
                                    .map(|h| h.to_string())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        } else if e.impl_name.is_some() {
                            "`impl:` names the tensor in every rank graph".to_string()
                        } else {
                            format!(
                                "if the implementation calls it differently, write `{}: {{ impl: \
                                 NAME, placement: {l} }}`",
                                e.name.value
                            )
                        };
                        return Err(self
                            .ctx
                            .err(
                                at,
                                format!(
                                    "`{impl_name}` is not a value of the graph of rank {r} ({}){}",
                                    graph_label(&self.ranks[r]),
                                    did_you_mean_suffix(&impl_name, idx.keys().copied())
                                ),
                            )
                            .with_hint(hint));
                    };
                    rank_values.push((r, *v));
                }
                let rank_tys: Vec<(usize, Option<&TensorType>)> = rank_values
                    .iter()
                    .map(|&(r, v)| (r, self.ranks[r].recorded_type(v)))
                    .collect();
                self.check_fit(e, l, spec_ty, &rank_tys)?;
                // Every rank holds it: the rank-indexed form that engines written before `at:`
                // read. Restricted layouts leave it empty, so such an engine finds no tensors
                // (an inconclusive relation) rather than misreading holders as ranks.
                let impl_values = if rank_values.len() == self.ranks.len() {
                    rank_values.iter().map(|&(_, v)| v).collect()
                } else {
                    Vec::new()
                };
                Ok(Resolved {
                    spec_value,
                    impl_name,
                    impl_values,
                    rank_values,
                })
            }
        }
    }

    fn check_fit(
        &self,
        e: &TensorEntry,
        l: &PlacedLayout,
        spec_ty: Option<&TensorType>,
        rank_tys: &[(usize, Option<&TensorType>)],
    ) -> Result<(), SourceError> {
        // Without a concrete spec shape there is nothing to check against; engines that need
        // shapes infer them and report there.
        let Some(spec_ty) = spec_ty else {
            return Ok(());
        };
        let Some(spec_shape) = spec_ty.concrete_shape() else {
            return Ok(());
        };
        let head = format!(
            "`{}`: {l} does not fit: spec {spec_ty}, {}",
            e.name.value,
            ranks_text(rank_tys)
        );
        let fail = |why: String| {
            self.ctx
                .err(e.value_span, format!("{head} ({why})"))
                .with_hint(
                    "a placement must describe how the ranks' tensors make up the spec tensor; \
                     check the tensor dim, the mesh dims, `blocks` and `replicas`",
                )
        };
        for &(r, t) in rank_tys {
            let expected = rank_pieces(&Layout::Placed(l.clone()), &spec_shape, self.mesh, r)
                .map_err(|err| fail(err.message))?
                .local_shape();
            let Some(t) = t else { continue };
            if t.dtype != spec_ty.dtype {
                return Err(fail(format!(
                    "rank {r} holds {} but the spec tensor is {}; a layout relates tensors of \
                     the same dtype",
                    t.dtype, spec_ty.dtype
                )));
            }
            let Some(shape) = t.concrete_shape() else {
                continue;
            };
            if shape == expected {
                continue;
            }
            if shape.len() != expected.len() {
                return Err(fail(format!(
                    "expected {} dims on rank {r}, as in the spec",
                    expected.len()
                )));
            }
            let d = (0..shape.len())
                .find(|&d| shape[d] != expected[d])
                .unwrap_or(0);
            let why = match explain_dim(l, &spec_shape, self.mesh, d) {
                Some(x) => format!("expected {x} along dim {d}"),
                None => format!(
                    "expected {} along dim {d}, as in the spec: no placement splits it",
                    expected[d]
                ),
            };
            return Err(fail(why));
        }
        Ok(())
    }

    fn check_expr(
        &self,
        e: &TensorEntry,
        x: &crate::expr::Expr,
        spec_ty: Option<&TensorType>,
    ) -> Result<(), SourceError> {
        for (rank, name, span) in x.tensors() {
            let Some(idx) = self.rank_index.get(rank) else {
                return Err(self
                    .ctx
                    .err(
                        span,
                        format!(
                            "rank {rank} does not exist: the mesh has {} ranks",
                            self.ranks.len()
                        ),
                    )
                    .with_hint(format!(
                        "ranks are r0 to r{}",
                        self.ranks.len().saturating_sub(1)
                    )));
            };
            if !idx.contains_key(name) {
                return Err(self
                    .ctx
                    .err(
                        span,
                        format!(
                            "`{name}` is not a value of the graph of rank {rank} ({}){}",
                            graph_label(&self.ranks[rank]),
                            did_you_mean_suffix(name, idx.keys().copied())
                        ),
                    )
                    .with_hint("`rK.name` names value `name` of rank K's graph"));
            }
        }
        let shape_of = |rank: usize, name: &str| {
            let v = *self.rank_index.get(rank)?.get(name)?;
            self.ranks[rank].recorded_type(v)?.concrete_shape()
        };
        let got = x.infer_shape(&shape_of).map_err(|(span, m)| {
            self.ctx
                .err(
                    span,
                    format!("in the expression for `{}`: {m}", e.name.value),
                )
                .with_hint("shapes come from the types recorded in the rank graphs")
        })?;
        let want = spec_ty.and_then(TensorType::concrete_shape);
        if let (Some(got), Some(want), Some(ty)) = (got, want, spec_ty) {
            if got != want {
                return Err(self
                    .ctx
                    .err(
                        e.value_span,
                        format!(
                            "the expression for `{}` gives shape {} but the spec tensor is {ty}",
                            e.name.value,
                            fmt_shape(&got)
                        ),
                    )
                    .with_hint("the expression must rebuild the whole spec tensor"));
            }
        }
        Ok(())
    }
}

fn finish(
    file: CaseFile,
    prep: Prepared,
    spec: Graph,
    ranks: Vec<Arc<Graph>>,
) -> Result<Case, SourceError> {
    let ctx = Ctx { file: &file.path };
    check_rank_count(&file, &prep.mesh, ranks.len(), "the caller gave")?;
    let groups = resolve_program_groups(&ctx, &file, &prep.mesh, prep.groups, &ranks)?;
    let (inputs, outputs) = {
        let r = Resolver {
            ctx: Ctx { file: &file.path },
            mesh: &prep.mesh,
            spec: &spec,
            spec_index: spec.name_index(),
            ranks: &ranks,
            rank_index: {
                let mut shared: HashMap<*const Graph, std::rc::Rc<HashMap<&str, ValueId>>> =
                    HashMap::new();
                ranks
                    .iter()
                    .map(|g| {
                        shared
                            .entry(Arc::as_ptr(g))
                            .or_insert_with(|| std::rc::Rc::new(g.name_index()))
                            .clone()
                    })
                    .collect()
            },
        };
        let mut inputs = Vec::new();
        for (e, layout) in file.inputs.iter().zip(prep.inputs) {
            let res = r.resolve(e, &layout, "inputs")?;
            let cut = !matches!(
                spec.node(res.spec_value).kind,
                NodeKind::Input | NodeKind::Constant { .. }
            );
            inputs.push(InputRelation {
                spec_name: e.name.value.clone(),
                spec_value: res.spec_value,
                impl_name: res.impl_name,
                impl_values: res.impl_values,
                rank_values: res.rank_values,
                layout,
                cut,
                span: e.name.span,
            });
        }
        let mut outputs = Vec::new();
        for (e, layout) in file.outputs.iter().zip(prep.outputs) {
            let res = r.resolve(e, &layout, "outputs")?;
            outputs.push(OutputExpectation {
                spec_name: e.name.value.clone(),
                spec_value: res.spec_value,
                is_graph_output: spec.outputs.contains(&Some(res.spec_value)),
                impl_name: res.impl_name,
                impl_values: res.impl_values,
                rank_values: res.rank_values,
                layout,
                span: e.name.span,
            });
        }
        (inputs, outputs)
    };
    let mut constants = BTreeMap::new();
    let attrs: BTreeSet<&str> = std::iter::once(&spec)
        .chain(ranks.iter().map(|g| &**g))
        .flat_map(|g| g.nodes.iter())
        .filter_map(|n| match &n.kind {
            NodeKind::Constant { attr } => Some(attr.as_str()),
            _ => None,
        })
        .collect();
    for (key, value) in &file.constants {
        if !attrs.contains(key.value.as_str()) {
            return Err(SourceError::new(
                &file.path,
                Some(key.span),
                format!(
                    "no graph of the case has a module constant `{}`{}",
                    key.value,
                    did_you_mean_suffix(&key.value, attrs.iter().copied())
                ),
            )
            .with_hint(if attrs.is_empty() {
                "the graphs have no module constants (`self._tensor_constantN`); remove `constants:`".to_string()
            } else {
                format!("the graphs' module constants are {}", list_names(attrs.iter().copied()))
            }));
        }
        constants.insert(key.value.clone(), value.value);
    }
    let name = file.name.as_ref().map_or_else(
        || {
            file.path
                .file_stem()
                .map_or_else(|| "case".to_string(), |s| s.to_string_lossy().into_owned())
        },
        |n| n.value.clone(),
    );
    Ok(Case {
        file: file.path.clone(),
        name,
        spec,
        program: Program {
            mesh: prep.mesh,
            groups,
            ranks,
        },
        inputs,
        outputs,
        ops: prep.ops,
        assume: prep.assume,
        constants,
        source: file,
    })
}
