//! The selections and index-driven operators of shape reduction (`topk`, `gather`, `scatter`,
//! an embedding at positions) and the walks that trace an index's values to their origin: an
//! index's values are data, not positions, so what they range over keeps its size
//! (docs/prove.md, section 2).

use super::{norm_dim, Cx, GraphDims};
use crate::reduce::sizes::Mono;
use crate::reduce::Refusal;
use shardproof_ir::{Arg, Graph, NodeKind, ValueId};
use shardproof_ops::Meta;

/// Movements whose every output element is an element of their first input: through them an
/// index tensor's values are its source's.
pub(crate) const VALUE_KEEPING: &[&str] = &[
    "aten.view",
    "aten._unsafe_view",
    "aten.reshape",
    "aten.unsqueeze",
    "aten.squeeze",
    "aten.expand",
    "aten.permute",
    "aten.transpose",
    "aten.t",
    "aten.slice",
    "aten.clone",
    "aten.contiguous",
    "aten.detach",
    "aten.alias",
];

/// Whether value `v` of `g` holds the indices a `topk` selected (its second output), reached
/// through value-keeping movements only: its values then range over that topk's lane, whose
/// size the reduction keeps, so they are the same values at every reduced size. An index of
/// any other origin (an input, arithmetic, a position) may range over sizes the reduction
/// changes, and the operators reading it are refused.
fn topk_indices(g: &Graph, mut v: ValueId) -> bool {
    // A chain of movements is short; the bound only keeps a malformed graph from looping.
    for _ in 0..64 {
        let Some(NodeKind::Call { op, args, .. }) = g.nodes.get(v.node).map(|n| &n.kind) else {
            return false;
        };
        let base = op.base();
        if base == "aten.topk" {
            return v.output == 1;
        }
        if !VALUE_KEEPING.contains(&base.as_str()) {
            return false;
        }
        match args.first() {
            Some(Arg::Value(u)) => v = *u,
            _ => return false,
        }
    }
    false
}

/// Integer operators whose every output element is one size-free function of its operands'
/// elements at the same (broadcast) index and of its literals: shifts, comparisons, masks.
const INTEGER_ELEMENTWISE: &[&str] = &[
    "aten.add",
    "aten.sub",
    "aten.masked_fill",
    "aten.where",
    "aten.eq",
    "aten.ne",
    "aten.lt",
    "aten.le",
    "aten.gt",
    "aten.ge",
    "aten.logical_not",
    "aten.logical_and",
    "aten.logical_or",
    "aten.bitwise_and",
    "aten.bitwise_or",
    "aten.bitwise_not",
    "aten._to_copy",
];

/// The graph inputs the values of `v` are computed from, where every step is a value-keeping
/// movement or an integer operator of [`INTEGER_ELEMENTWISE`] on integer or boolean operands
/// and literals, and every leaf is an input or a topk's indices (whose range the topk rule
/// keeps). `None` where any other value takes part (a position from `arange`, a float, a
/// constant tensor): its values may follow a reduced size. With the inputs' ranges kept,
/// `v` holds the same values at full and reduced sizes.
fn integer_origins(g: &Graph, metas: &[Vec<Option<Meta>>], v: ValueId) -> Option<Vec<ValueId>> {
    let mut inputs = Vec::new();
    let mut stack = vec![v];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(u) = stack.pop() {
        if !seen.insert(u) {
            continue;
        }
        // An index expression is a handful of steps; a long one is not followed.
        if seen.len() > 256 {
            return None;
        }
        if topk_indices(g, u) {
            continue;
        }
        let node = g.nodes.get(u.node)?;
        let NodeKind::Call { op, args, kwargs } = &node.kind else {
            if matches!(node.kind, NodeKind::Input) {
                inputs.push(u);
                continue;
            }
            return None;
        };
        let base = op.base();
        if VALUE_KEEPING.contains(&base.as_str()) {
            match args.first() {
                Some(Arg::Value(w)) => stack.push(*w),
                _ => return None,
            }
            continue;
        }
        if !INTEGER_ELEMENTWISE.contains(&base.as_str()) {
            return None;
        }
        let mut operands = args.iter().chain(kwargs.iter().map(|(_, a)| a));
        if operands.any(|a| matches!(a, Arg::List(_))) {
            return None;
        }
        for a in args.iter().chain(kwargs.iter().map(|(_, a)| a)) {
            match a {
                Arg::Value(w) => {
                    let dt = metas
                        .get(w.node)
                        .and_then(|m| m.get(w.output)?.as_ref())
                        .map(|m| m.dtype);
                    if !dt.is_some_and(|d| d.is_int() || d == shardproof_ir::DType::Bool) {
                        return None;
                    }
                    stack.push(*w);
                }
                Arg::Float(x) if x.fract() != 0.0 || !x.is_finite() => return None,
                _ => {}
            }
        }
    }
    Some(inputs)
}

/// Node `i`'s integer inputs, when it is an integer computation whose values
/// [`integer_origins`] traces to inputs and topk indices only (its output integer or boolean).
pub(super) fn integer_computation(
    g: &Graph,
    metas: &[Vec<Option<Meta>>],
    i: usize,
) -> Option<Vec<ValueId>> {
    let node = &g.nodes[i];
    if node.outputs.len() != 1 {
        return None;
    }
    let dt = metas.get(i)?.first()?.as_ref()?.dtype;
    if !(dt.is_int() || dt == shardproof_ir::DType::Bool) {
        return None;
    }
    let NodeKind::Call { op, .. } = &node.kind else {
        return None;
    };
    if !INTEGER_ELEMENTWISE.contains(&op.base().as_str()) {
        return None;
    }
    integer_origins(g, metas, ValueId::new(i, 0))
}

/// The dims whose size bounds the values of integer input `v` of `g`: every dim
/// [`shardproof_interp::index_uses`] finds `v` indexing (the symbols' range,
/// `shardproof_interp::index_bound_known`, is the smallest of them, found by the same walk),
/// here also through slices and further. Both walks are taken, so every use the range is
/// read from is among them whatever order a longer walk meets values in, and keeping every
/// dim keeps the range.
pub fn range_dims(g: &Graph, dims: &GraphDims, v: ValueId) -> Vec<Mono> {
    use shardproof_interp::{index_uses, IndexWalk};
    let wider = IndexWalk {
        through_slices: true,
        max_values: 256,
    };
    let rank = |t: ValueId| dims.dims_of(t).map(|d| d.len());
    let mut uses = index_uses(g, v, IndexWalk::BOUND, rank);
    uses.extend(index_uses(g, v, wider, rank));
    uses.iter()
        .filter_map(|u| dims.dims_of(u.table)?.get(u.dim).cloned())
        .collect()
}

/// Selections and index-driven movements (docs/prove.md, section 2: why each keeps the
/// theorem's conditions).
impl Cx<'_> {
    /// The dim `name` selects, normalized against a tensor of rank `rank` (at least 1).
    fn index_dim(&self, name: &str, default: i64, rank: usize) -> Result<usize, Refusal> {
        if rank == 0 {
            return Err(self.refuse("a selection along a 0-d tensor"));
        }
        norm_dim(self.int(name).unwrap_or(default), rank).ok_or_else(|| self.refuse("bad dim"))
    }

    /// Unifies every dim of `a` but `skip` with `b`'s, which must have the same original
    /// sizes (torch allows an index smaller than its input along the other dims: a prefix the
    /// reduction would have to keep at a fixed fraction, which it does not track).
    fn same_dims_but(
        &mut self,
        a: &[Mono],
        b: &[Mono],
        skip: Option<usize>,
        what: &str,
    ) -> Result<(), Refusal> {
        if a.len() != b.len() {
            return Err(self.refuse(format!("{what}: ranks differ")));
        }
        for (k, (x, y)) in a.iter().zip(b).enumerate() {
            if Some(k) == skip {
                continue;
            }
            if self.sizes.original(x) != self.sizes.original(y) {
                return Err(self.refuse(format!("{what}: dim {k} differs")));
            }
            self.unify(x, y)?;
        }
        Ok(())
    }

    /// The `index` argument, which must hold a topk's indices ([`topk_indices`]).
    fn topk_index(&self) -> Result<Vec<Mono>, Refusal> {
        let Some(Arg::Value(v)) = self.get("index") else {
            return Err(self.refuse("no index tensor"));
        };
        if !topk_indices(self.g, v) {
            return Err(self.refuse(
                "an index that is not a topk's indices (through value-keeping movements): its range may depend on a reduced size; use --no-reduce to prove at full size",
            ));
        }
        self.tensor("index")
    }

    /// `topk(x, k, dim)`: each output lane is one kernel of one input lane, the other dims
    /// batch dims with the identity mapping; but the kernel depends on the lane's length and
    /// on `k` (the j-th largest of n values, an index ranging over the lane), so both keep
    /// their original sizes and the reduced program runs the same kernel on fewer lanes. The
    /// semantic minimum `k <= lane` then holds as it does at full size.
    pub(super) fn topk(&mut self) -> Result<Vec<Vec<Mono>>, Refusal> {
        let x = self.tensor("self")?;
        let d = self.index_dim("dim", -1, x.len())?;
        let out = self.out_shape(0)?;
        let k = *out
            .get(d)
            .ok_or_else(|| self.refuse("an output without the lane"))?;
        if self.int("k").and_then(|n| u64::try_from(n).ok()) != Some(k) {
            return Err(self.refuse("a count that is not the output's lane"));
        }
        let count = self.fresh(&[k], "top-k count").remove(0);
        self.kept.push(x[d].clone());
        self.kept.push(count.clone());
        let mut o = x;
        o[d] = count;
        Ok(vec![o.clone(), o])
    }

    /// An embedding looked up at positions (an `arange`, through value-keeping movements:
    /// GPT-2's position table) reads rows up to the arange's end, a size that reduces: the
    /// table's rows are that end where they are as many (a substitution); where they are
    /// more, the reduced sizes must keep them at least the end (checked once chosen, the
    /// reduction refused otherwise: a context-parallel rank's chunk ends below the whole
    /// table, which the last rank's chunk ends at); a shorter table is refused. Left
    /// unrelated, the two reduced apart: a context-parallel rank's positions (`2·v`) ran
    /// past a table reduced to 3 rows.
    pub(super) fn positions_fit_the_table(&mut self, rows: &Mono) -> Result<(), Refusal> {
        let Some(Arg::Value(mut v)) = self.get("indices") else {
            return Ok(());
        };
        for _ in 0..64 {
            let Some(NodeKind::Call { op, args, .. }) = self.g.nodes.get(v.node).map(|n| &n.kind)
            else {
                return Ok(());
            };
            let base = op.base();
            if base == "aten.arange" {
                break;
            }
            if !VALUE_KEEPING.contains(&base.as_str()) {
                return Ok(());
            }
            match args.first() {
                Some(Arg::Value(u)) => v = *u,
                _ => return Ok(()),
            }
        }
        let Some(end) = self.arange_end(v) else {
            return Ok(());
        };
        let (have, need) = (self.sizes.original(rows), self.sizes.original(&end));
        if have == need {
            self.unify(rows, &end)
        } else if have > need {
            self.at_least.push((rows.clone(), end));
            Ok(())
        } else {
            Err(self.refuse(format!(
                "an embedding of {have} rows looked up at positions up to {need}"
            )))
        }
    }

    /// The end (last position + 1) of the arange `v` as a size: its length times the chunks
    /// its start skips plus one, as [`Cx::arange`] writes its `end` literal.
    fn arange_end(&self, v: ValueId) -> Option<Mono> {
        let NodeKind::Call { args, .. } = &self.g.nodes.get(v.node)?.kind else {
            return None;
        };
        let len_mono = self
            .dims
            .get(v.node)?
            .get(v.output)?
            .as_ref()?
            .first()?
            .clone();
        let len = self.sizes.original(&len_mono);
        // `arange(end)` or `arange(start, end)`: the start is the first of two numbers.
        let numbers: Vec<f64> = args.iter().filter_map(|a| a.as_f64()).collect();
        let start = if numbers.len() >= 2 { numbers[0] } else { 0.0 };
        if start < 0.0 || start.fract() != 0.0 || len == 0 || !(start as u64).is_multiple_of(len) {
            return None;
        }
        len_mono.scale(start as u64 / len + 1)
    }

    /// `gather(x, dim, index)`: `out[p] = x[p with p_dim := index[p]]`. Along every other dim
    /// the mapping is the identity (index and input dims equal); along `dim` each output
    /// element reads one index element at its own position and the input's whole lane, so
    /// the lane keeps its original size (the index values range over it) and the index's
    /// extent along `dim` is a batch dim. The values must be a topk's, kept alike.
    pub(super) fn gather(&mut self) -> Result<Vec<Mono>, Refusal> {
        let x = self.tensor("self")?;
        let d = self.index_dim("dim", 0, x.len())?;
        let idx = match self.get("index") {
            Some(Arg::Value(v)) if !topk_indices(self.g, v) => {
                let Some(origins) = integer_origins(self.g, self.metas, v) else {
                    return Err(self.refuse(
                        "an index that is neither a topk's indices nor an integer computation on inputs (through value-keeping movements): its range may depend on a reduced size; use --no-reduce to prove at full size",
                    ));
                };
                self.ranged_inputs.extend(origins);
                self.tensor("index")?
            }
            _ => self.topk_index()?,
        };
        self.same_dims_but(&idx, &x, Some(d), "index and input")?;
        self.kept.push(x[d].clone());
        Ok(idx)
    }

    /// `scatter(self, dim, index, src | value)`: writes `src[p]` to `out[p with p_dim :=
    /// index[p]]`, the last write winning. An output element depends on its own element of
    /// `self` and on the whole lane of `index` and `src` along `dim` (which of them name it),
    /// the other dims mapped by the identity: so the output's lane (the index values' range)
    /// and the index's lane (the number of writes) keep their original sizes. The values must
    /// be a topk's, kept alike.
    pub(super) fn scatter(&mut self) -> Result<Vec<Mono>, Refusal> {
        let s = self.tensor("self")?;
        let d = self.index_dim("dim", 0, s.len())?;
        let idx = self.topk_index()?;
        self.same_dims_but(&idx, &s, Some(d), "index and self")?;
        if let Some(src) = self.tensor_dims("src")? {
            self.same_dims_but(&src, &idx, None, "src and index")?;
        }
        self.kept.push(s[d].clone());
        self.kept.push(idx[d].clone());
        Ok(s)
    }
}
