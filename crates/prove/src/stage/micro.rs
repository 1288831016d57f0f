//! Cuts on pipeline plans: a spec value whose piece a rank holds as several values, one per
//! microbatch.
//!
//! On a pipeline (or gradient-accumulation) plan a layer runs on one pipeline stage's ranks
//! only, once per microbatch: rank `r` computes the layer's output as `M` values `v_0 ..
//! v_{M-1}`, each the rows of one microbatch of its data-parallel shard. No placement relates
//! one spec value to several rank values, so such a cut is given to the plan
//! ([`MicrobatchCut`], `PlanOptions::microbatch_cuts`) and states:
//!
//! > on every rank its layout holds, `cat([v_0, ..., v_{M-1}], 0)` is the rank's piece of the
//! > spec value, the `v_m` having equal sizes along dim 0.
//!
//! The stage builder encodes the relation into each stage's rank graphs, so that every later
//! step (leaves, rebuilt outputs, shape and mesh reduction, the memo key, the interpreter's
//! confirmation) sees a plain placed relation on one value per rank and plain operators:
//!
//! - a stage that *establishes* the cut computes every `v_m` and `cat([v_0, ...], 0)` after
//!   them, and expects the concatenation in the layout: it holds exactly when the relation
//!   does;
//! - a stage that *assumes* it reads a fresh input `x`, laid out by the layout, and computes
//!   `v_m = slice(x, 0, m·b, (m+1)·b)` where the rank read `v_m`. In the whole run the relation
//!   gives `x = cat(v)`, and a slice of a concatenation of equal parts is the part, so the
//!   stage's inputs range over (at least) every whole run's values.
//!
//! The whole programs are never rewritten: the pipeline's schedule (which microbatch a rank
//! sends when, which message a recv takes) is the whole run's, checked stage by stage as for
//! any cut (`slice::same_pairing`). So the chain of `stage/mod.rs` is unchanged: the stage
//! that computes a microbatched cut proves its relation under the relations it assumes, and a
//! later stage assumes only relations established earlier.

use shardproof_case::{rank_pieces, Case, InputRelation, Layout, PlacedLayout};
use shardproof_ir::{Arg, Graph, Node, NodeKind, OpName, Output, Span, TensorType, ValueId};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A cut whose rank values are a pipeline rank's microbatches of its piece: on every rank
/// `layout` holds, the values named `values` (the same names in every holder's graph, in
/// microbatch order) concatenated along dim 0 are the rank's piece of spec value `spec_name`.
#[derive(Clone, Debug, PartialEq)]
pub struct MicrobatchCut {
    /// The spec value cut.
    pub spec_name: String,
    /// How the ranks hold its pieces (placements and `at:`).
    pub layout: PlacedLayout,
    /// The holders' values, one per microbatch, in order along dim 0 of the piece.
    pub values: Vec<String>,
}

/// Adds every cut of `cuts` to the case's relations as a cut whose `rank_values` list each
/// holder's microbatch values in order (several per rank where there are several
/// microbatches). Refused where a name is unknown, already related, or a holder lacks a value.
pub(crate) fn add_relations(case: &Case, cuts: &[MicrobatchCut]) -> Result<Case, String> {
    if cuts.is_empty() {
        return Ok(case.clone());
    }
    let mut out = case.clone();
    // One name index per distinct graph: a plan's thousands of ranks share a few files.
    let mut indices: HashMap<usize, HashMap<&str, ValueId>> = HashMap::new();
    for cut in cuts {
        let name = &cut.spec_name;
        let spec_value = case
            .spec
            .find(name)
            .ok_or_else(|| format!("microbatched cut `{name}` names no spec value"))?;
        let related = out.inputs.iter().any(|r| r.spec_value == spec_value)
            || out.outputs.iter().any(|o| o.spec_value == spec_value);
        if related {
            return Err(format!(
                "microbatched cut `{name}` is already related by the case"
            ));
        }
        if cut.values.is_empty() {
            return Err(format!("microbatched cut `{name}` names no rank value"));
        }
        if !cut.layout.blocks.is_trivial() {
            return Err(format!(
                "microbatched cut `{name}`: fused blocks are not supported"
            ));
        }
        let mesh = &case.program.mesh;
        let mut rank_values = Vec::new();
        for (r, g) in case.program.ranks.iter().enumerate() {
            if !cut.layout.holds(mesh, r) {
                continue;
            }
            let index = indices
                .entry(Arc::as_ptr(g) as usize)
                .or_insert_with(|| g.name_index());
            for v in &cut.values {
                let id = index.get(v.as_str()).ok_or_else(|| {
                    format!("microbatched cut `{name}`: rank {r} has no value `{v}`")
                })?;
                rank_values.push((r, *id));
            }
        }
        if rank_values.is_empty() {
            return Err(format!("microbatched cut `{name}`: no rank holds it"));
        }
        out.inputs.push(InputRelation {
            spec_name: name.clone(),
            spec_value,
            impl_name: cut.values[0].clone(),
            impl_values: Vec::new(),
            rank_values,
            layout: Layout::Placed(cut.layout.clone()),
            cut: true,
            span: Span::new(0, 0),
        });
    }
    Ok(out)
}

/// Shapes of every value of a graph.
type Metas = [Vec<Option<shardproof_ops::Meta>>];

/// Checks that the microbatched cuts (`case.inputs[added..]`, from [`add_relations`]) state a
/// concatenation: on each holder the values have one dtype, one shape, and together along dim 0
/// the shape of the rank's piece. The stages that assume a cut slice its input at multiples of
/// the first value's rows, which is each value exactly when this holds.
pub(crate) fn check_shapes(
    case: &Case,
    added: usize,
    spec_metas: &Metas,
    rank_metas: &[Arc<Vec<Vec<Option<shardproof_ops::Meta>>>>],
) -> Result<(), String> {
    for rel in &case.inputs[added.min(case.inputs.len())..] {
        let name = &rel.spec_name;
        let spec = spec_metas[rel.spec_value.node][rel.spec_value.output]
            .as_ref()
            .ok_or_else(|| format!("the shape of spec value `{name}` is unknown"))?;
        let spec_shape: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
        for (r, values) in per_rank(&rel.rank_values) {
            let piece = rank_pieces(&rel.layout, &spec_shape, &case.program.mesh, r)
                .map_err(|e| format!("microbatched cut `{name}`: {e}"))?
                .local_shape();
            let metas: Vec<&shardproof_ops::Meta> = values
                .iter()
                .map(|v| rank_metas[r][v.node][v.output].as_ref())
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    format!("microbatched cut `{name}`: a value's shape on rank {r} is unknown")
                })?;
            let first = metas[0];
            let rows = first.shape.first().copied().unwrap_or(0) as i64;
            let mut joined: Vec<i64> = first.shape.iter().map(|&d| d as i64).collect();
            if let Some(d0) = joined.first_mut() {
                *d0 = rows * metas.len() as i64;
            }
            let alike = metas.iter().all(|m| {
                m.dtype == first.dtype
                    && m.shape.len() == first.shape.len()
                    && m.shape == first.shape
            });
            if !alike || joined != piece {
                return Err(format!(
                    "microbatched cut `{name}`: rank {r}'s {} values ({}) do not concatenate along dim 0 into its piece {piece:?}",
                    metas.len(),
                    metas
                        .iter()
                        .map(|m| format!("{:?}{:?}", m.dtype, m.shape))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// Whether some rank holds several values of a relation (a microbatched cut).
fn several_per_rank(values: &[(usize, ValueId)]) -> bool {
    values.windows(2).any(|w| w[0].0 == w[1].0)
}

/// The values of each rank, in order.
fn per_rank(values: &[(usize, ValueId)]) -> BTreeMap<usize, Vec<ValueId>> {
    let mut out: BTreeMap<usize, Vec<ValueId>> = BTreeMap::new();
    for &(r, v) in values {
        out.entry(r).or_default().push(v);
    }
    out
}

pub(super) fn call(name: String, op: OpName, args: Vec<Arg>, ty: Option<TensorType>) -> Node {
    Node {
        name: name.clone(),
        kind: NodeKind::Call {
            op,
            args,
            kwargs: Vec::new(),
        },
        outputs: vec![Output { name, ty }],
        loc: None,
        line: None,
    }
}

/// The recorded type of `v`, which a stage graph's inputs and computed nodes carry.
pub(super) fn type_of(g: &Graph, v: ValueId) -> Result<TensorType, String> {
    g.recorded_type(v)
        .cloned()
        .ok_or_else(|| format!("`{}` has no recorded type", g.value_name(v)))
}

/// `ty` with dim 0 `rows`.
fn with_rows(ty: &TensorType, rows: i64) -> Result<TensorType, String> {
    let mut shape = ty
        .concrete_shape()
        .ok_or("a microbatch value has no concrete shape")?;
    let d0 = shape.first_mut().ok_or("a microbatch value is a scalar")?;
    *d0 = rows;
    Ok(TensorType::new(ty.dtype, &shape))
}

/// The type of `cat(values, 0)` (the microbatches joined), a microbatch's rows, and a fresh
/// name for the joined value in `g`.
fn joined_type_and_name(
    g: &Graph,
    values: &[ValueId],
) -> Result<(TensorType, i64, String), String> {
    let ty = type_of(g, values[0])?;
    let rows = ty
        .concrete_shape()
        .and_then(|s| s.first().copied())
        .unwrap_or(0);
    let joined = with_rows(&ty, rows * values.len() as i64)?;
    let name = crate::fresh_value_name(g, &format!("{}_microbatches", g.value_name(values[0])));
    Ok((joined, rows, name))
}

/// Appends `cat(values, 0)` to `g`, the establishing side of a microbatched cut; returns it.
pub(crate) fn append_cat(g: &mut Graph, values: &[ValueId]) -> Result<ValueId, String> {
    let (joined, _, name) = joined_type_and_name(g, values)?;
    let list = Arg::List(values.iter().map(|&v| Arg::Value(v)).collect());
    let at = g.push(call(
        name,
        OpName::new("aten", "cat", "default"),
        vec![list, Arg::Int(0)],
        Some(joined),
    ));
    Ok(ValueId::new(at, 0))
}

/// `g` with its inputs `values` (one per microbatch, in order) read as the slices of one fresh
/// input, their concatenation: the assuming side of a microbatched cut. Returns the graph, the
/// fresh input and where each node of `g` went.
fn slice_input(g: &Graph, values: &[ValueId]) -> Result<Rebuilt, String> {
    for &v in values {
        if !matches!(g.nodes[v.node].kind, NodeKind::Input) || v.output != 0 {
            return Err(format!(
                "`{}` is not an input of the stage's rank graph",
                g.value_name(v)
            ));
        }
    }
    let (joined, rows, name) = joined_type_and_name(g, values)?;
    let first = values.iter().map(|v| v.node).min().unwrap_or(0);
    let mut out = Graph::new(g.name.clone());
    out.path = g.path.clone();
    let mut map: Vec<Option<usize>> = vec![None; g.nodes.len()];
    let mut whole = ValueId::new(0, 0);
    for (i, node) in g.nodes.iter().enumerate() {
        if i == first {
            let at = out.push(Node {
                name: name.clone(),
                kind: NodeKind::Input,
                outputs: vec![Output {
                    name: name.clone(),
                    ty: Some(joined.clone()),
                }],
                loc: None,
                line: None,
            });
            whole = ValueId::new(at, 0);
            // Inputs depend on nothing, so every slice can sit here, before any reader.
            for (m, &v) in values.iter().enumerate() {
                let piece = type_of(g, v)?;
                let start = rows * m as i64;
                let at = out.push(call(
                    g.value_name(v).to_string(),
                    OpName::new("aten", "slice", "Tensor"),
                    vec![
                        Arg::Value(whole),
                        Arg::Int(0),
                        Arg::Int(start),
                        Arg::Int(start + rows),
                    ],
                    Some(piece),
                ));
                map[v.node] = Some(at);
            }
        }
        if values.iter().any(|v| v.node == i) {
            continue;
        }
        map[i] = Some(out.push(remapped_node(node, &map)?));
    }
    let moved = |v: ValueId| map[v.node].map(|n| ValueId::new(n, v.output));
    for &i in &g.inputs {
        if i.node == first {
            out.inputs.push(whole);
        } else if !values.contains(&i) {
            out.inputs
                .push(moved(i).ok_or("an input of the stage graph was lost")?);
        }
    }
    out.outputs = g.outputs.iter().map(|o| o.and_then(moved)).collect();
    Ok((Arc::new(out), whole, Arc::new(map)))
}

/// A rebuilt stage graph, its fresh input and the new node of every old one.
type Rebuilt = (Arc<Graph>, ValueId, Arc<Vec<Option<usize>>>);

/// A copy of `node` whose arguments read the copies `map` gives (of an earlier graph's nodes).
pub(super) fn remapped_node(node: &Node, map: &[Option<usize>]) -> Result<Node, String> {
    let mut n = node.clone();
    if let NodeKind::Call { args, kwargs, .. } = &mut n.kind {
        for a in args.iter_mut().chain(kwargs.iter_mut().map(|(_, a)| a)) {
            remap(a, map)?;
        }
    }
    Ok(n)
}

pub(super) fn remap(a: &mut Arg, map: &[Option<usize>]) -> Result<(), String> {
    match a {
        Arg::Value(v) => {
            let n = map[v.node].ok_or("a node reads a later node")?;
            *v = ValueId::new(n, v.output);
        }
        Arg::List(items) => {
            for x in items.iter_mut() {
                remap(x, map)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Rewrites a stage case so that every assumed relation listing several values on a rank reads
/// them as slices of one input laid out by the relation (see the module documentation).
pub(crate) fn encode_inputs(case: &mut Case) -> Result<(), String> {
    for k in 0..case.inputs.len() {
        if !several_per_rank(&case.inputs[k].rank_values) {
            continue;
        }
        let groups = per_rank(&case.inputs[k].rank_values);
        // One rewrite per distinct graph and values: ranks sharing a graph share the result.
        let mut done: HashMap<(usize, Vec<ValueId>), Rebuilt> = HashMap::new();
        let mut moved = Vec::new();
        for (r, values) in groups {
            let old = case.program.ranks[r].clone();
            let key = (Arc::as_ptr(&old) as usize, values.clone());
            let (g, whole, map) = match done.get(&key) {
                Some(x) => x.clone(),
                None => {
                    let x = slice_input(&old, &values)
                        .map_err(|e| format!("`{}`: {e}", case.inputs[k].spec_name))?;
                    done.insert(key, x.clone());
                    x
                }
            };
            // Every other relation's value on this rank moves with the rebuilt graph.
            let remap_value =
                |v: ValueId| -> Option<ValueId> { map[v.node].map(|n| ValueId::new(n, v.output)) };
            for (j, rel) in case.inputs.iter_mut().enumerate() {
                if j == k {
                    continue;
                }
                for rv in rel.rank_values.iter_mut().filter(|(h, _)| *h == r) {
                    rv.1 = remap_value(rv.1).ok_or("a related value was lost")?;
                }
                if let Some(iv) = rel.impl_values.get_mut(r) {
                    *iv = remap_value(*iv).ok_or("a related value was lost")?;
                }
            }
            for o in case.outputs.iter_mut() {
                for rv in o.rank_values.iter_mut().filter(|(h, _)| *h == r) {
                    rv.1 = remap_value(rv.1).ok_or("an expected value was lost")?;
                }
                if let Some(iv) = o.impl_values.get_mut(r) {
                    *iv = remap_value(*iv).ok_or("an expected value was lost")?;
                }
            }
            case.program.ranks[r] = g;
            moved.push((r, whole));
        }
        case.inputs[k].rank_values = moved;
    }
    Ok(())
}
