//! The operators shape reduction accepts, and how each relates its outputs' dims to its
//! inputs'. An operator is listed only when it satisfies the conditions of the reduction
//! theorem (seed 000, section 6): it is SIMD (every output element is one kernel applied to
//! the input elements its dependency mapping selects) and its dependency mapping is linear in
//! the output index with offsets that scale with the sizes (docs/prove.md lists them).
//! Anything else refuses the reduction, naming the operator and where it is.

mod select;
mod size_values;

use super::sizes::{Mono, Sizes};
use super::Refusal;
use select::integer_computation;
pub use select::range_dims;
pub(crate) use select::VALUE_KEEPING;
use shardproof_ir::{Arg, Graph, NodeKind, ValueId};
use shardproof_ops::{Args, Meta, Registry, Tensor, Values};
pub use size_values::SIZE_VALUE_PIN;

/// A shape literal's reduced value.
#[derive(Clone, Debug)]
pub enum LitValue {
    /// A list of sizes (`None`: a `-1` kept as written).
    Sizes(Vec<Option<Mono>>),
    /// One size.
    Size(Mono),
    /// `dim * num / den`: an offset proportional to a dimension.
    Scaled {
        /// The dimension.
        dim: Mono,
        /// The literal in the original program.
        num: u64,
        /// The dimension's original size.
        den: u64,
    },
    /// `a·unit + b`: a scalar a label is shifted by or compared with, a point `b` away from
    /// a vocabulary block's edge (`reduce/vocab.rs`, V2).
    Offset {
        /// The vocabulary block.
        unit: Mono,
        /// Whole blocks.
        a: i64,
        /// The offset from the edge.
        b: i64,
        /// Written as a float in the original program.
        float: bool,
    },
}

/// A shape literal of a node to rewrite.
#[derive(Clone, Debug)]
pub struct Literal {
    /// The node.
    pub node: usize,
    /// The schema argument's name.
    pub arg: &'static str,
    /// Its value in the reduced program.
    pub value: LitValue,
}

/// The sizes of every value of one graph, and its literals.
#[derive(Clone, Debug, Default)]
pub struct GraphDims {
    /// Per node, per output: the size of every dim.
    pub dims: Vec<Vec<Option<Vec<Mono>>>>,
    /// Shape literals to rewrite.
    pub literals: Vec<Literal>,
    /// Integers a value literal may be a product of sizes of (the literal, its reciprocal,
    /// square, or reciprocal square).
    pub value_literals: Vec<u64>,
    /// The same, of the `eps` arguments of norms: a stabilizer added to a variance, which
    /// keeps reduced sizes from coinciding with it but pins no size (see
    /// [`super::reduce_case`]).
    pub eps_literals: Vec<u64>,
    /// Each tensor a `mul` or `div` scales by a value literal `c`: the integers `c` and `1/c`
    /// (those of them `>= 2`) with the tensor's dims. Where such an integer is a mesh size's
    /// product and some run of those dims holds exactly that many elements, the literal may
    /// stand for that size rather than the mesh (a mean's backward `div(g, n)` written as a
    /// literal; [`super::reduce_case_pinning_scaled_sizes`]).
    pub scaled_dims: Vec<(Vec<u64>, Vec<Mono>)>,
    /// Sizes that must keep their original value: a `topk`'s lane and count, the dim a
    /// `gather` or `scatter` indexes (an index's values range over it). Pinned once every
    /// relation is known ([`Sizes::pin`] pins the variables a size is made of then).
    pub kept: Vec<Mono>,
    /// Pairs `(rows, end)`: a table of `rows` rows looked up at positions below `end`, more
    /// rows than positions at full size; the reduced sizes must keep `rows >= end`, checked
    /// once they are chosen (`reduce_case` refuses the reduction otherwise).
    pub at_least: Vec<(Mono, Mono)>,
    /// Integer inputs of the graph whose values an index or an integer computation reads
    /// ([`integer_origins`]): their range (the dims they index in the spec) keeps its size,
    /// so they take the same values at full and reduced sizes.
    pub ranged_inputs: Vec<ValueId>,
    /// Sizes the graph reads as values (a count of a created fill, positions in arithmetic;
    /// [`SIZE_VALUE_PIN`]), each with its reason: they keep their original values, so a
    /// polynomial of them and literals takes its full-size value.
    pub size_values: Vec<(Mono, String)>,
}

impl GraphDims {
    /// The sizes of value `v`'s dims.
    pub fn dims_of(&self, v: ValueId) -> Option<&Vec<Mono>> {
        self.dims.get(v.node)?.get(v.output)?.as_ref()
    }
}

/// `file:line: `node` (op)` for messages.
pub fn location(g: &Graph, i: usize) -> String {
    let node = &g.nodes[i];
    let file = g
        .path
        .as_ref()
        .map_or(g.name.clone(), |p| p.display().to_string());
    let op = node.op().map(|o| format!(" ({o})")).unwrap_or_default();
    match node.line {
        Some(l) => format!("{file}:{l}: `{}`{op}", node.name),
        None => format!("{file}: `{}`{op}", node.name),
    }
}

/// Shape inference's metas as the values an operator's arguments bind to.
pub(super) struct MetaValues<'a>(pub(super) &'a [Vec<Option<Meta>>]);

impl Values for MetaValues<'_> {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.0.get(v.node)?.get(v.output)?.clone()
    }
    fn tensor(&self, _: ValueId) -> Option<&Tensor> {
        None
    }
}

/// Operators whose output has the broadcast shape of their tensor inputs, each output element
/// a function of the inputs' elements at the same (broadcast) index, or of one row along a
/// dim the output keeps (softmax and its backward, the causal mask's `triu`).
pub(super) const ELEMENTWISE: &[&str] = &[
    "aten.add",
    "aten.sub",
    "aten.rsub",
    "aten.mul",
    "aten.div",
    "aten.pow",
    "aten.neg",
    "aten.abs",
    "aten.reciprocal",
    "aten.relu",
    "aten.silu",
    "aten.gelu",
    "aten.sigmoid",
    "aten.tanh",
    "aten.exp",
    "aten.log",
    "aten.sqrt",
    "aten.rsqrt",
    "aten.sin",
    "aten.cos",
    "aten.erf",
    "aten.maximum",
    "aten.minimum",
    "aten.where",
    "aten.masked_fill",
    "aten.eq",
    "aten.ne",
    "aten.lt",
    "aten.le",
    "aten.gt",
    "aten.ge",
    "aten.logical_not",
    // Boolean elementwise operators (the vocab-parallel embedding's out-of-range mask is
    // `bitwise_or(lt(tokens, lo), ge(tokens, hi))`): one kernel per index, identity mapping.
    // Their operands' sizes are unified as any elementwise operands'; the range literals are
    // value literals, which pin or avoid sizes as every other literal does.
    "aten.logical_and",
    "aten.logical_or",
    "aten.bitwise_and",
    "aten.bitwise_or",
    "aten.bitwise_not",
    "aten.clone",
    "aten.contiguous",
    "aten.detach",
    "aten.alias",
    "aten._to_copy",
    "aten.threshold_backward",
    "aten.silu_backward",
    "aten.gelu_backward",
    "aten.sigmoid_backward",
    "aten.tanh_backward",
    "aten.triu",
    "aten.tril",
    "aten._softmax",
    "aten._log_softmax",
    "aten._softmax_backward_data",
    "aten._log_softmax_backward_data",
    "_c10d_functional.all_reduce",
    "_c10d_functional.wait_tensor",
];

/// Numeric arguments that are dims, sizes, flags or enums, never values a size could hide in.
const STRUCTURAL: &[&str] = &[
    "dim",
    "dim0",
    "dim1",
    "dims",
    "keepdim",
    "size",
    "start",
    "end",
    "step",
    "split_size",
    "split_sizes",
    // A pad's widths are shape literals, rewritten from the padded dims' reduced sizes.
    "pad",
    "num_weights",
    "normalized_shape",
    "half_to_float",
    "reduction",
    "group_size",
    "output_mask",
    "implicit",
    "non_blocking",
    "scale_grad_by_freq",
    "sparse",
    "pin_memory",
    // A point-to-point call's peer and tag route its message; they never enter a value.
    "src",
    "dst",
    "tag",
    // `topk`'s count (the only schema argument of that name): a size kept at its original
    // value by the topk rule, so the literal keeps its meaning; it never enters a value.
    "k",
];

/// Integers a value literal `c` may be a product of sizes behind: `c`, `1/c`, `c^2`, `1/c^2`.
fn size_candidates(c: f64) -> Vec<u64> {
    let c = c.abs();
    if !c.is_finite() || c == 0.0 {
        return Vec::new();
    }
    [c, 1.0 / c, c * c, 1.0 / (c * c)]
        .into_iter()
        .filter(|x| *x >= 2.0 && *x < 1e15)
        .filter(|x| (x - x.round()).abs() <= 1e-9 * x)
        .map(|x| x.round() as u64)
        .collect()
}

/// A `mul` or `div` scaling tensor `self` by the literal `other = c`: the integers among `c`
/// and `1/c` that are `>= 2` (a size a mean divides by, either way round) and `self`'s dims.
fn scaled_by_literal(
    base: &str,
    arg: &str,
    c: f64,
    bound: &Args<'_>,
    dims: &[Vec<Option<Vec<Mono>>>],
) -> Option<(Vec<u64>, Vec<Mono>)> {
    if !matches!(base, "aten.mul" | "aten.div") || arg != "other" {
        return None;
    }
    let Some(Arg::Value(v)) = bound.get("self") else {
        return None;
    };
    let tensor = dims.get(v.node)?.get(v.output)?.clone()?;
    let c = c.abs();
    if !c.is_finite() || c == 0.0 {
        return None;
    }
    let ints: Vec<u64> = [c, 1.0 / c]
        .into_iter()
        .filter(|x| *x >= 2.0 && *x < 1e15 && (x - x.round()).abs() <= 1e-9 * x)
        .map(|x| x.round() as u64)
        .collect();
    (!ints.is_empty() && !tensor.is_empty()).then_some((ints, tensor))
}

/// The sizes of a graph input (its value and original shape), from its caller.
pub type InputSizes<'a> =
    dyn FnMut(&mut Sizes, ValueId, &[u64]) -> Result<Option<Vec<Mono>>, Refusal> + 'a;

/// One graph's walk: sizes of every value, from its inputs' (given by `input`) through every
/// node's shape rule.
pub fn walk(
    sizes: &mut Sizes,
    g: &Graph,
    metas: &[Vec<Option<Meta>>],
    input: &mut InputSizes<'_>,
) -> Result<GraphDims, Refusal> {
    let mut out = GraphDims {
        dims: vec![Vec::new(); g.nodes.len()],
        ..Default::default()
    };
    let reg = Registry::builtin();
    let mut size_reads = size_values::SizeValues::new(g.nodes.len());
    for (i, node) in g.nodes.iter().enumerate() {
        let shape_of = |k: usize| -> Option<Vec<u64>> {
            metas
                .get(i)?
                .get(k)?
                .as_ref()
                .map(|m| m.shape.iter().map(|&d| d as u64).collect())
        };
        match &node.kind {
            NodeKind::Input => {
                let v = ValueId::new(i, 0);
                let shape = shape_of(0).ok_or_else(|| {
                    Refusal::new(format!("{}: the input's shape is unknown", location(g, i)))
                })?;
                out.dims[i] = vec![input(sizes, v, &shape)?];
                size_reads.input(i, shape.len());
            }
            NodeKind::Constant { .. } => {
                let shape = shape_of(0).unwrap_or_default();
                if !shape.is_empty() {
                    return Err(Refusal::new(format!(
                        "{}: a constant tensor of shape {shape:?} is not reduced",
                        location(g, i)
                    )));
                }
                out.dims[i] = vec![Some(Vec::new())];
                size_reads.constant(i);
            }
            NodeKind::Call { op, args, kwargs } => {
                let def = reg.get(op).ok_or_else(|| Refusal {
                    op: Some(op.to_string()),
                    message: format!("{}: unknown operator", location(g, i)),
                })?;
                let values = MetaValues(metas);
                let bound = Args::bind(&def.schema, args, kwargs, &values)
                    .map_err(|e| Refusal::new(format!("{}: {e}", location(g, i))))?;
                let outs: Vec<Option<Vec<u64>>> = (0..node.outputs.len()).map(shape_of).collect();
                let mut cx = Cx {
                    sizes,
                    g,
                    i,
                    op: op.to_string(),
                    base: op.base(),
                    args: &bound,
                    schema: &def.schema,
                    dims: &out.dims,
                    outs: &outs,
                    literals: Vec::new(),
                    kept: Vec::new(),
                    at_least: Vec::new(),
                    ranged_inputs: Vec::new(),
                    metas,
                };
                let result = cx.apply().map_err(|mut r| {
                    if r.op.is_none() {
                        r.op = Some(op.to_string());
                    }
                    r
                })?;
                let lits = std::mem::take(&mut cx.literals);
                out.kept.append(&mut cx.kept);
                out.at_least.append(&mut cx.at_least);
                out.ranged_inputs.append(&mut cx.ranged_inputs);
                let base = op.base();
                size_reads.call(
                    &size_values::Call {
                        g,
                        i,
                        base: &base,
                        schema: &def.schema,
                        bound: &bound,
                        dims: &out.dims,
                        result: &result,
                        sizes,
                    },
                    args,
                    kwargs,
                    &mut out.size_values,
                );
                // An integer computation on integer inputs (a token minus a rank's vocabulary
                // offset, compared with its range): those inputs keep their range, so the
                // computation gives the same values at full and reduced sizes whatever its
                // literals are, and they need neither pin nor avoid a size.
                if let Some(origins) = integer_computation(g, metas, i) {
                    out.ranged_inputs.extend(origins);
                    out.literals.extend(lits);
                    out.dims[i] = result.into_iter().map(Some).collect();
                    continue;
                }
                // Value literals: every numeric argument that is not structural.
                for a in &def.schema.args {
                    if STRUCTURAL.contains(&a.name.as_str()) {
                        continue;
                    }
                    let x = match bound.get(&a.name) {
                        Some(Arg::Int(n)) => n as f64,
                        Some(Arg::Float(x)) => x,
                        _ => continue,
                    };
                    // A negative ignore/padding index never equals a real index.
                    if (a.name == "ignore_index" || a.name == "padding_idx") && x < 0.0 {
                        continue;
                    }
                    if a.name == "eps" {
                        out.eps_literals.extend(size_candidates(x));
                    } else {
                        out.value_literals.extend(size_candidates(x));
                    }
                    if let Some(scaled) =
                        scaled_by_literal(&op.base(), &a.name, x, &bound, &out.dims)
                    {
                        out.scaled_dims.push(scaled);
                    }
                }
                out.literals.extend(lits);
                out.dims[i] = result.into_iter().map(Some).collect();
            }
        }
    }
    Ok(out)
}

/// What a shape rule sees of one call.
struct Cx<'a> {
    sizes: &'a mut Sizes,
    g: &'a Graph,
    i: usize,
    op: String,
    base: String,
    args: &'a Args<'a>,
    schema: &'a shardproof_ops::Schema,
    dims: &'a [Vec<Option<Vec<Mono>>>],
    outs: &'a [Option<Vec<u64>>],
    literals: Vec<Literal>,
    kept: Vec<Mono>,
    at_least: Vec<(Mono, Mono)>,
    ranged_inputs: Vec<ValueId>,
    metas: &'a [Vec<Option<Meta>>],
}

/// Dim `d` of a tensor of rank `rank`, a negative one counted from the end.
pub(super) fn norm_dim(d: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let d = if d < 0 { d + r } else { d };
    (0..r.max(1)).contains(&d).then_some(d as usize)
}

impl Cx<'_> {
    fn refuse(&self, why: impl std::fmt::Display) -> Refusal {
        Refusal {
            op: Some(self.op.clone()),
            message: format!("{}: {why}", location(self.g, self.i)),
        }
    }

    fn why(&self) -> String {
        location(self.g, self.i)
    }

    fn has(&self, name: &str) -> bool {
        self.schema.index_of(name).is_some()
    }

    fn get(&self, name: &str) -> Option<Arg> {
        if self.has(name) {
            self.args.get(name)
        } else {
            None
        }
    }

    fn int(&self, name: &str) -> Option<i64> {
        self.get(name).and_then(|a| a.as_int())
    }

    /// An `nll_loss` whose non-negative `ignore_index` names a class (of `x`'s class dim, the
    /// last of 1 or 2): the classes keep their size, so that the ignored class is the same
    /// class, inside the targets' range, at every size.
    fn keep_ignored_class(&mut self, x: &[Mono]) -> Result<(), Refusal> {
        if self.int("ignore_index").is_some_and(|i| i >= 0) {
            let classes = x
                .last()
                .cloned()
                .ok_or_else(|| self.refuse("a 0-d nll_loss input"))?;
            self.kept.push(classes);
        }
        Ok(())
    }

    fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).and_then(|a| a.as_int_list())
    }

    fn tensor_dims(&self, name: &str) -> Result<Option<Vec<Mono>>, Refusal> {
        match self.get(name) {
            Some(Arg::Value(v)) => self
                .dims
                .get(v.node)
                .and_then(|o| o.get(v.output))
                .cloned()
                .flatten()
                .map(Some)
                .ok_or_else(|| self.refuse(format!("the sizes of `{name}` are unknown"))),
            _ => Ok(None),
        }
    }

    fn tensor(&self, name: &str) -> Result<Vec<Mono>, Refusal> {
        self.tensor_dims(name)?
            .ok_or_else(|| self.refuse(format!("`{name}` is not a tensor")))
    }

    fn out_shape(&self, k: usize) -> Result<Vec<u64>, Refusal> {
        self.outs
            .get(k)
            .cloned()
            .flatten()
            .ok_or_else(|| self.refuse(format!("the shape of output {k} is unknown")))
    }

    fn unify(&mut self, a: &Mono, b: &Mono) -> Result<(), Refusal> {
        let why = self.why();
        self.sizes
            .unify(a, b, &why)
            .map_err(|e| self.refuse_plain(e.0))
    }

    fn refuse_plain(&self, message: String) -> Refusal {
        Refusal {
            op: Some(self.op.clone()),
            message,
        }
    }

    /// Fresh sizes for an output whose dims no input gives.
    fn fresh(&mut self, shape: &[u64], what: &str) -> Vec<Mono> {
        let loc = self.why();
        shape
            .iter()
            .enumerate()
            .map(|(d, &n)| self.sizes.fresh(n, format!("{loc} {what} dim {d}")))
            .collect()
    }

    /// Checks that the sizes computed for output `k` have its original shape.
    fn check(&self, k: usize, dims: &[Mono]) -> Result<(), Refusal> {
        let want = self.out_shape(k)?;
        let got: Vec<u64> = dims.iter().map(|m| self.sizes.original(m)).collect();
        if got != want {
            return Err(self.refuse(format!(
                "the reduction's shape rule gives {got:?}, not the recorded {want:?}"
            )));
        }
        Ok(())
    }

    fn apply(&mut self) -> Result<Vec<Vec<Mono>>, Refusal> {
        let base = self.base.clone();
        let b = base.as_str();
        let outs = if ELEMENTWISE.contains(&b) {
            vec![self.elementwise()?]
        } else {
            match b {
                "aten.t" | "aten.transpose" | "aten.permute" => vec![self.permute()?],
                "aten.unsqueeze" => {
                    let mut x = self.tensor("self")?;
                    let d = norm_dim(self.int("dim").unwrap_or(0), x.len() + 1)
                        .ok_or_else(|| self.refuse("bad dim"))?;
                    x.insert(d, Mono::constant(1));
                    vec![x]
                }
                "aten.squeeze" => {
                    let x = self.tensor("self")?;
                    let out = self.out_shape(0)?;
                    // Size-1 dims are constants: drop them until the rank matches.
                    let kept: Vec<Mono> = if x.len() == out.len() {
                        x
                    } else {
                        let drop: Vec<usize> = match self.ints("dim").or_else(|| self.int("dim").map(|d| vec![d])) {
                            Some(ds) => ds.iter().filter_map(|&d| norm_dim(d, x.len())).collect(),
                            None => (0..x.len()).filter(|&d| x[d].is_one()).collect(),
                        };
                        x.into_iter()
                            .enumerate()
                            .filter(|(d, m)| !(drop.contains(d) && m.is_one()))
                            .map(|(_, m)| m)
                            .collect()
                    };
                    vec![kept]
                }
                "aten.mm" | "aten.bmm" => vec![self.matmul("self", "mat2", None)?],
                "aten.addmm" => vec![self.matmul("mat1", "mat2", Some("self"))?],
                // logsumexp is `log ∘ sum ∘ exp` over the same dims (the max shift cancels
                // exactly): sum's mapping between elementwise kernels (docs/prove.md, section 2).
                "aten.sum" | "aten.mean" | "aten.amax" | "aten.amin" | "aten.prod"
                | "aten.logsumexp" => {
                    vec![self.reduction()?]
                }
                "aten.view" | "aten._unsafe_view" | "aten.reshape" => vec![self.view()?],
                "aten.expand" => vec![self.expand()?],
                "aten.slice" => vec![self.slice()?],
                "aten.constant_pad_nd" | "aten.pad" => vec![self.pad()?],
                "aten.cat" => vec![self.cat()?],
                "aten.split" | "aten.split_with_sizes" => self.split()?,
                "aten.full" | "aten.zeros" | "aten.ones" | "aten.empty" | "aten.scalar_tensor" => {
                    let shape = self.out_shape(0)?;
                    let d = self.fresh(&shape, "created");
                    if self.has("size") {
                        self.literals.push(Literal {
                            node: self.i,
                            arg: "size",
                            value: LitValue::Sizes(d.iter().cloned().map(Some).collect()),
                        });
                    }
                    vec![d]
                }
                "aten.arange" => vec![self.arange()?],
                "aten.topk" => self.topk()?,
                "aten.gather" => vec![self.gather()?],
                // The reducing overloads (`scatter.reduce`, ...) have no symbolic rule.
                "aten.scatter" if matches!(self.op.as_str(), "aten.scatter.src" | "aten.scatter.value") => {
                    vec![self.scatter()?]
                }
                // A send's result is its input (the handle of the posted tensor).
                "shardproof_p2p.send" => vec![self.tensor("input")?],
                // A recv's buffer has the sizes of the tensor the matched send posts: fresh
                // here, unified with the sender's across graphs once every graph is walked
                // (`super::unify_messages`), and its `size` literal rewritten from them.
                "shardproof_p2p.recv" => {
                    let shape = self.out_shape(0)?;
                    let d = self.fresh(&shape, "received");
                    self.literals.push(Literal {
                        node: self.i,
                        arg: "size",
                        value: LitValue::Sizes(d.iter().cloned().map(Some).collect()),
                    });
                    vec![d]
                }
                "aten.embedding" => {
                    let w = self.tensor("weight")?;
                    let mut idx = self.tensor("indices")?;
                    if w.len() != 2 {
                        return Err(self.refuse("an embedding table that is not 2-d"));
                    }
                    self.positions_fit_the_table(&w[0])?;
                    idx.push(w[1].clone());
                    vec![idx]
                }
                "aten.embedding_dense_backward" => {
                    let grad = self.tensor("grad_output")?;
                    // One gradient row per index: the gradient's leading dims are the
                    // indices' (a stage's cut gradient and the token input are related by
                    // nothing else, and reduced apart they no longer pair).
                    let idx = self.tensor("indices")?;
                    let lead = &grad[..grad.len().saturating_sub(1)];
                    let (ni, ng) = (
                        idx.iter().map(|m| self.sizes.original(m)).product::<u64>(),
                        lead.iter().map(|m| self.sizes.original(m)).product::<u64>(),
                    );
                    if idx.len() != lead.len() || ni != ng {
                        return Err(self.refuse("a gradient whose rows are not the indices' positions"));
                    }
                    for (a, b) in idx.iter().zip(lead) {
                        self.unify(a, b)?;
                    }
                    let out = self.out_shape(0)?;
                    let rows = self.fresh(&out[..1], "table rows");
                    // A padding row named by a non-negative padding_idx is a fixed row: the
                    // table keeps its rows, so that it is the same row at every size.
                    if self.int("padding_idx").is_some_and(|p| p >= 0) {
                        self.kept.push(rows[0].clone());
                    }
                    let cols = grad
                        .last()
                        .cloned()
                        .ok_or_else(|| self.refuse("a 0-d gradient"))?;
                    self.literals.push(Literal {
                        node: self.i,
                        arg: "num_weights",
                        value: LitValue::Size(rows[0].clone()),
                    });
                    vec![vec![rows[0].clone(), cols]]
                }
                "aten.nll_loss_forward" => {
                    let x = self.tensor("self")?;
                    let t = self.tensor("target")?;
                    if x.len() == 2 && t.len() == 1 {
                        let (a, b) = (x[0].clone(), t[0].clone());
                        self.unify(&a, &b)?;
                    }
                    if self.int("reduction") == Some(0) {
                        return Err(self.refuse("an unreduced nll_loss"));
                    }
                    self.keep_ignored_class(&x)?;
                    vec![Vec::new(), Vec::new()]
                }
                "aten.nll_loss_backward" => {
                    let x = self.tensor("self")?;
                    self.keep_ignored_class(&x)?;
                    vec![x]
                }
                "aten.native_layer_norm" => {
                    let x = self.tensor("input")?;
                    let n = self.ints("normalized_shape").unwrap_or_default().len();
                    if n == 0 || n > x.len() {
                        return Err(self.refuse("an empty normalized_shape"));
                    }
                    let lead = x.len() - n;
                    self.norm_params(&x[lead..], &["weight", "bias"])?;
                    self.literals.push(Literal {
                        node: self.i,
                        arg: "normalized_shape",
                        value: LitValue::Sizes(x[lead..].iter().cloned().map(Some).collect()),
                    });
                    let mut stat: Vec<Mono> = x[..lead].to_vec();
                    stat.extend((0..n).map(|_| Mono::constant(1)));
                    vec![x, stat.clone(), stat]
                }
                "aten.native_layer_norm_backward" => {
                    let x = self.tensor("input")?;
                    let grad = self.tensor("grad_out")?;
                    for (a, b) in grad.iter().zip(&x) {
                        self.unify(a, b)?;
                    }
                    let n = self.ints("normalized_shape").unwrap_or_default().len();
                    if n == 0 || n > x.len() {
                        return Err(self.refuse("an empty normalized_shape"));
                    }
                    let lead = x.len() - n;
                    let tail = x[lead..].to_vec();
                    self.norm_params(&tail, &["weight", "bias"])?;
                    self.literals.push(Literal {
                        node: self.i,
                        arg: "normalized_shape",
                        value: LitValue::Sizes(tail.iter().cloned().map(Some).collect()),
                    });
                    vec![x, tail.clone(), tail]
                }
                "_c10d_functional.all_gather_into_tensor" => {
                    let mut x = self.tensor("input")?;
                    let out = self.out_shape(0)?;
                    let k = self.int("group_size").unwrap_or(1).max(1) as u64;
                    if x.is_empty() {
                        return Err(self.refuse("an all-gather of a 0-d tensor"));
                    }
                    x[0] = x[0].scale(k).ok_or_else(|| self.refuse("size overflow"))?;
                    let _ = out;
                    vec![x]
                }
                "_c10d_functional.reduce_scatter_tensor" => {
                    let mut x = self.tensor("input")?;
                    let k = self.int("group_size").unwrap_or(1).max(1) as u64;
                    if x.is_empty() {
                        return Err(self.refuse("a reduce-scatter of a 0-d tensor"));
                    }
                    let why = self.why();
                    x[0] = self
                        .sizes
                        .divide(&x[0], k, &why)
                        .map_err(|e| self.refuse_plain(e.0))?;
                    vec![x]
                }
                _ => {
                    return Err(self.refuse(
                        "this operator is not on the list of operators shape reduction is proved sound for (docs/prove.md); use --no-reduce to prove at full size",
                    ))
                }
            }
        };
        for (k, d) in outs.iter().enumerate() {
            if self.outs.get(k).cloned().flatten().is_some() {
                self.check(k, d)?;
            }
        }
        Ok(outs)
    }

    /// Weight and bias of a norm have the normalized dims.
    fn norm_params(&mut self, tail: &[Mono], names: &[&str]) -> Result<(), Refusal> {
        for n in names {
            if let Some(w) = self.tensor_dims(n)? {
                if w.len() != tail.len() {
                    return Err(self.refuse(format!("`{n}` does not have the normalized shape")));
                }
                for (a, b) in w.iter().zip(tail) {
                    self.unify(a, b)?;
                }
            }
        }
        Ok(())
    }

    fn elementwise(&mut self) -> Result<Vec<Mono>, Refusal> {
        let out = self.out_shape(0)?;
        let mut inputs: Vec<Vec<Mono>> = Vec::new();
        for a in &self.schema.args {
            if let Some(Arg::Value(v)) = self.get(&a.name) {
                if let Some(Some(d)) = self.dims.get(v.node).and_then(|o| o.get(v.output)) {
                    inputs.push(d.clone());
                }
            }
        }
        let r = out.len();
        let mut dims = Vec::with_capacity(r);
        for (i, &n) in out.iter().enumerate() {
            if n == 1 {
                dims.push(Mono::constant(1));
                continue;
            }
            let mut found: Option<Mono> = None;
            for x in &inputs {
                if x.len() + i < r {
                    continue;
                }
                let m = x[x.len() + i - r].clone();
                if self.sizes.original(&m) != n {
                    continue;
                }
                match &found {
                    None => found = Some(m),
                    Some(f) => {
                        let f = f.clone();
                        self.unify(&f, &m)?;
                    }
                }
            }
            dims.push(
                found.ok_or_else(|| self.refuse(format!("output dim {i} comes from no input")))?,
            );
        }
        Ok(dims)
    }

    fn permute(&mut self) -> Result<Vec<Mono>, Refusal> {
        let x = self.tensor("self")?;
        let r = x.len();
        let perm: Vec<usize> = match self.base.as_str() {
            "aten.t" => {
                if r < 2 {
                    return Ok(x);
                }
                vec![1, 0]
            }
            "aten.transpose" => {
                let a = norm_dim(self.int("dim0").unwrap_or(0), r)
                    .ok_or_else(|| self.refuse("bad dim"))?;
                let b = norm_dim(self.int("dim1").unwrap_or(0), r)
                    .ok_or_else(|| self.refuse("bad dim"))?;
                let mut p: Vec<usize> = (0..r).collect();
                p.swap(a, b);
                p
            }
            _ => self
                .ints("dims")
                .unwrap_or_default()
                .iter()
                .map(|&d| norm_dim(d, r).ok_or_else(|| self.refuse("bad dim")))
                .collect::<Result<_, _>>()?,
        };
        Ok(perm.iter().map(|&p| x[p].clone()).collect())
    }

    fn matmul(&mut self, a: &str, b: &str, bias: Option<&str>) -> Result<Vec<Mono>, Refusal> {
        let x = self.tensor(a)?;
        let y = self.tensor(b)?;
        if x.len() != y.len() || x.len() < 2 {
            return Err(self.refuse("a matmul of unequal ranks"));
        }
        let r = x.len();
        for d in 0..r - 2 {
            self.unify(&x[d], &y[d])?;
        }
        self.unify(&x[r - 1], &y[r - 2])?;
        let mut out: Vec<Mono> = x[..r - 1].to_vec();
        out.push(y[r - 1].clone());
        if let Some(bias) = bias {
            let bd = self.tensor(bias)?;
            for (k, m) in bd.iter().rev().enumerate() {
                if !m.is_one() {
                    let o = out[out.len() - 1 - k].clone();
                    self.unify(m, &o)?;
                }
            }
        }
        Ok(out)
    }

    fn reduction(&mut self) -> Result<Vec<Mono>, Refusal> {
        let x = self.tensor("self")?;
        let r = x.len();
        let keep = self
            .get("keepdim")
            .and_then(|a| a.as_bool())
            .unwrap_or(false);
        let dims: Vec<usize> = match self
            .ints("dim")
            .or_else(|| self.int("dim").map(|d| vec![d]))
        {
            Some(ds) if !ds.is_empty() => ds
                .iter()
                .map(|&d| norm_dim(d, r).ok_or_else(|| self.refuse("bad dim")))
                .collect::<Result<_, _>>()?,
            _ => (0..r).collect(),
        };
        Ok(x.iter()
            .enumerate()
            .filter_map(|(d, m)| {
                if !dims.contains(&d) {
                    Some(m.clone())
                } else if keep {
                    Some(Mono::constant(1))
                } else {
                    None
                }
            })
            .collect())
    }

    fn view(&mut self) -> Result<Vec<Mono>, Refusal> {
        let x = self.tensor("self")?;
        let out = self.out_shape(0)?;
        let lit = self.ints("size").unwrap_or_default();
        // Group input and output dims into blocks of equal products (size-1 dims apart).
        let xin: Vec<(usize, u64)> = x
            .iter()
            .enumerate()
            .map(|(d, m)| (d, self.sizes.original(m)))
            .filter(|(_, n)| *n != 1)
            .collect();
        let yout: Vec<(usize, u64)> = out
            .iter()
            .enumerate()
            .map(|(d, &n)| (d, n))
            .filter(|(_, n)| *n != 1)
            .collect();
        let mut res: Vec<Mono> = out.iter().map(|_| Mono::constant(1)).collect();
        let (mut a, mut b) = (0, 0);
        while a < xin.len() || b < yout.len() {
            let (mut ins, mut outs) = (Vec::new(), Vec::new());
            let (mut pa, mut pb) = (1u64, 1u64);
            loop {
                if pa <= pb && a < xin.len() && (pa < pb || ins.is_empty()) {
                    pa *= xin[a].1;
                    ins.push(xin[a].0);
                    a += 1;
                } else if b < yout.len() && (pb < pa || outs.is_empty()) {
                    pb *= yout[b].1;
                    outs.push(yout[b].0);
                    b += 1;
                } else {
                    break;
                }
                if pa == pb && !ins.is_empty() && !outs.is_empty() {
                    break;
                }
            }
            if pa != pb || ins.is_empty() || outs.is_empty() {
                return Err(self.refuse("a reshape whose dims do not group into equal products"));
            }
            let why = self.why();
            let product = ins
                .iter()
                .try_fold(Mono::constant(1), |acc, &d| acc.mul(&x[d]))
                .ok_or_else(|| self.refuse("size overflow"))?;
            if outs.len() == 1 {
                res[outs[0]] = product;
            } else if ins.len() == 1 {
                let parts: Vec<u64> = outs.iter().map(|&d| out[d]).collect();
                let split = self
                    .sizes
                    .split(&product, &parts, &why)
                    .map_err(|e| self.refuse_plain(e.0))?;
                for (&d, m) in outs.iter().zip(split) {
                    res[d] = m;
                }
            } else {
                return Err(self.refuse("a reshape that regroups several dims into several others"));
            }
        }
        self.push_size_literal(&lit, &res);
        Ok(res)
    }

    /// Records the node's `size` list as the sizes `res`, keeping a `-1` (an inferred dim)
    /// where the literal had one.
    fn push_size_literal(&mut self, lit: &[i64], res: &[Mono]) {
        self.literals.push(Literal {
            node: self.i,
            arg: "size",
            value: LitValue::Sizes(
                res.iter()
                    .enumerate()
                    .map(|(d, m)| (lit.get(d) != Some(&-1)).then(|| m.clone()))
                    .collect(),
            ),
        });
    }

    fn expand(&mut self) -> Result<Vec<Mono>, Refusal> {
        let x = self.tensor("self")?;
        let out = self.out_shape(0)?;
        let lit = self.ints("size").unwrap_or_default();
        let r = out.len();
        let mut res = Vec::with_capacity(r);
        for (i, &n) in out.iter().enumerate() {
            let src = (x.len() + i >= r).then(|| x[x.len() + i - r].clone());
            match src {
                Some(m) if self.sizes.original(&m) == n => res.push(m),
                _ => {
                    let loc = self.why();
                    res.push(self.sizes.fresh(n, format!("{loc} expanded dim {i}")));
                }
            }
        }
        self.push_size_literal(&lit, &res);
        Ok(res)
    }

    /// `literal` as a proportional offset of `dim`: the dim made divisible so that the offset
    /// stays at the same fraction of it.
    fn scaled(&mut self, dim: &Mono, literal: u64, arg: &'static str) -> Result<(), Refusal> {
        let n = self.sizes.original(dim);
        let g = gcd(literal, n);
        let q = n.checked_div(g).unwrap_or(1);
        if literal != 0 && literal != n {
            let why = self.why();
            self.sizes
                .divide(dim, q, &why)
                .map_err(|e| self.refuse_plain(e.0))?;
        }
        self.literals.push(Literal {
            node: self.i,
            arg,
            value: LitValue::Scaled {
                dim: dim.clone(),
                num: literal,
                den: n.max(1),
            },
        });
        Ok(())
    }

    fn slice(&mut self) -> Result<Vec<Mono>, Refusal> {
        let mut x = self.tensor("self")?;
        let d = norm_dim(self.int("dim").unwrap_or(0), x.len())
            .ok_or_else(|| self.refuse("bad dim"))?;
        if self.int("step").unwrap_or(1) != 1 {
            return Err(self.refuse("a strided slice"));
        }
        let m = x[d].clone();
        let n = self.sizes.original(&m) as i64;
        let clamp = |v: i64| -> u64 {
            let v = if v < 0 { v + n } else { v };
            v.clamp(0, n) as u64
        };
        let start = clamp(self.int("start").unwrap_or(0));
        let end = clamp(self.int("end").unwrap_or(n));
        if end <= start {
            return Err(self.refuse("an empty slice"));
        }
        self.scaled(&m, start, "start")?;
        self.scaled(&m, end, "end")?;
        let len = end - start;
        // The piece is the same fraction of the (now divisible) dim.
        let why = self.why();
        let q = self.sizes.original(&m) / gcd(len, self.sizes.original(&m));
        let unit = self
            .sizes
            .divide(&m, q, &why)
            .map_err(|e| self.refuse_plain(e.0))?;
        let piece = unit
            .scale(len * q / self.sizes.original(&m))
            .ok_or_else(|| self.refuse("size overflow"))?;
        x[d] = piece;
        Ok(x)
    }

    /// `constant_pad_nd(x, pad, value)`, and `pad` in mode `constant`: along a padded dim the
    /// output is `lo` fill elements, `x`'s lane, `hi` fill elements, a concatenation of three
    /// parts whose middle one is `x` at offset `lo`. The dim is written as `q` units `u` with
    /// both widths whole numbers of units (`u` the gcd of the size and the widths, where the
    /// dim is made divisible), so every part keeps its fraction of the output and the copy's
    /// offset scales with `u` at every reduced size; widths that share no factor with the size
    /// make the unit one element, and the dim keeps its size. The other modes read the input
    /// at offsets that do not scale (reflect's `n - 2 - j`, replicate's `n - 1`, circular's
    /// wrap) and are refused, as is a negative width (a crop).
    fn pad(&mut self) -> Result<Vec<Mono>, Refusal> {
        if let Some(Arg::Str(mode)) = self.get("mode") {
            if mode != "constant" {
                return Err(self.refuse(format!(
                    "a pad in mode `{mode}`: its border reads the input at offsets that do not scale with the sizes; use --no-reduce to prove at full size"
                )));
            }
        }
        let mut x = self.tensor("self")?;
        let widths = self
            .ints("pad")
            .ok_or_else(|| self.refuse("a pad without its widths"))?;
        let r = x.len();
        if widths.len() % 2 != 0 || widths.len() / 2 > r {
            return Err(self.refuse("a pad list that is not a pair of widths per dim"));
        }
        let mut literal = Vec::with_capacity(widths.len());
        // torch lists the last dim's pair first.
        for (k, pair) in widths.chunks(2).enumerate() {
            let d = r - 1 - k;
            let (Ok(lo), Ok(hi)) = (u64::try_from(pair[0]), u64::try_from(pair[1])) else {
                return Err(self.refuse(format!(
                    "a pad of negative width ({}, {}) on dim {d}: a crop",
                    pair[0], pair[1]
                )));
            };
            let n = self.sizes.original(&x[d]);
            if lo == 0 && hi == 0 {
                literal.extend([Some(Mono::constant(0)), Some(Mono::constant(0))]);
                continue;
            }
            if n == 0 {
                return Err(self.refuse(format!("a pad of the empty dim {d}")));
            }
            let unit_size = gcd(gcd(n, lo), hi);
            let why = self.why();
            let unit = self
                .sizes
                .divide(&x[d], n / unit_size, &why)
                .map_err(|e| self.refuse_plain(e.0))?;
            let units = |w: u64| -> Result<Mono, Refusal> {
                if w == 0 {
                    return Ok(Mono::constant(0));
                }
                unit.scale(w / unit_size)
                    .ok_or_else(|| self.refuse("size overflow"))
            };
            literal.push(Some(units(lo)?));
            literal.push(Some(units(hi)?));
            x[d] = units(lo + n + hi)?;
        }
        self.literals.push(Literal {
            node: self.i,
            arg: "pad",
            value: LitValue::Sizes(literal),
        });
        Ok(x)
    }

    fn cat(&mut self) -> Result<Vec<Mono>, Refusal> {
        let parts: Vec<ValueId> = match self.get("tensors") {
            Some(Arg::List(l)) => l.iter().filter_map(|a| a.as_value()).collect(),
            _ => return Err(self.refuse("cat without a tensor list")),
        };
        let dims: Vec<Vec<Mono>> = parts
            .iter()
            .map(|v| {
                self.dims
                    .get(v.node)
                    .and_then(|o| o.get(v.output))
                    .cloned()
                    .flatten()
                    .ok_or_else(|| self.refuse("a part's sizes are unknown"))
            })
            .collect::<Result<_, _>>()?;
        let first = dims
            .first()
            .cloned()
            .ok_or_else(|| self.refuse("cat of nothing"))?;
        let d = norm_dim(self.int("dim").unwrap_or(0), first.len())
            .ok_or_else(|| self.refuse("bad dim"))?;
        for p in &dims[1..] {
            if p.len() != first.len() {
                return Err(self.refuse("parts of different ranks"));
            }
            for (k, (a, b)) in first.iter().zip(p).enumerate() {
                if k == d {
                    // Equal parts keep every boundary at the same fraction.
                    self.unify(a, b)?;
                } else {
                    self.unify(a, b)?;
                }
            }
        }
        let mut out = first.clone();
        out[d] = first[d]
            .scale(dims.len() as u64)
            .ok_or_else(|| self.refuse("size overflow"))?;
        Ok(out)
    }

    fn split(&mut self) -> Result<Vec<Vec<Mono>>, Refusal> {
        let x = self.tensor("self")?;
        let d = norm_dim(self.int("dim").unwrap_or(0), x.len())
            .ok_or_else(|| self.refuse("bad dim"))?;
        let m = x[d].clone();
        let n = self.sizes.original(&m);
        let sizes: Vec<u64> = match self.ints("split_sizes") {
            Some(s) => s.iter().map(|&v| v.max(0) as u64).collect(),
            None => {
                let s = self.int("split_size").unwrap_or(0).max(1) as u64;
                if !n.is_multiple_of(s) {
                    return Err(self.refuse("a split into unequal pieces"));
                }
                vec![s; (n / s) as usize]
            }
        };
        if sizes.iter().any(|&s| s != sizes[0]) || sizes.iter().sum::<u64>() != n {
            return Err(self.refuse("a split into unequal pieces"));
        }
        let why = self.why();
        let piece = self
            .sizes
            .divide(&m, sizes.len() as u64, &why)
            .map_err(|e| self.refuse_plain(e.0))?;
        if self.has("split_sizes") {
            self.literals.push(Literal {
                node: self.i,
                arg: "split_sizes",
                value: LitValue::Sizes(sizes.iter().map(|_| Some(piece.clone())).collect()),
            });
        } else {
            self.literals.push(Literal {
                node: self.i,
                arg: "split_size",
                value: LitValue::Size(piece.clone()),
            });
        }
        Ok(sizes
            .iter()
            .map(|_| {
                let mut o = x.clone();
                o[d] = piece.clone();
                o
            })
            .collect())
    }

    /// `arange(start, end)` with step 1: its length is a size, and a nonzero start must be a
    /// whole number of lengths (a rank's chunk of positions, as context parallelism writes
    /// it), which stays the same number of reduced lengths.
    fn arange(&mut self) -> Result<Vec<Mono>, Refusal> {
        let start = self.get("start").and_then(|a| a.as_f64()).unwrap_or(0.0);
        let step = self.get("step").map(|a| a.as_f64());
        if !matches!(step, None | Some(Some(1.0))) || start < 0.0 || start.fract() != 0.0 {
            return Err(
                self.refuse("an arange with a step other than 1 or a negative or fractional start")
            );
        }
        let out = self.out_shape(0)?;
        let d = self.fresh(&out, "positions");
        let len = out.first().copied().unwrap_or(0);
        let start = start as u64;
        if start != 0 && (len == 0 || !start.is_multiple_of(len)) {
            return Err(self.refuse(format!(
                "an arange from {start} that is not a whole number of its length {len}"
            )));
        }
        let chunks = start.checked_div(len).unwrap_or(0);
        if start != 0 {
            self.literals.push(Literal {
                node: self.i,
                arg: "start",
                value: LitValue::Size(
                    d[0].scale(chunks)
                        .ok_or_else(|| self.refuse("size overflow"))?,
                ),
            });
        }
        self.literals.push(Literal {
            node: self.i,
            arg: "end",
            value: LitValue::Size(
                d[0].scale(chunks + 1)
                    .ok_or_else(|| self.refuse("size overflow"))?,
            ),
        });
        Ok(d)
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
