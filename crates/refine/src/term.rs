//! The term language of the e-graphs and the shape analysis over it.
//!
//! Every term is either an integer (`Num`) or an operator applied to children (`Op`). The
//! operator symbol says what it is:
//! - `%r0:mm_3` — a tensor of the implementation (rank 0, value `mm_3`): a leaf;
//! - `cat`, `sum`, `max`, `min`, `slice`, `get` — the clean operators of relations;
//! - `aten.mm.default`, ... — a registered operator; its children are its schema arguments in
//!   schema order, defaults filled in, so equal calls are equal terms however they were written;
//! - `f:0.5`, `b:true`, `none`, `dt:f16`, `s:...`, `list` — literal arguments.

use egg::{Analysis, DidMerge, EGraph, FromOp, Id, Language, Symbol};
use shardproof_ir::{Arg, DType, ValueId};
use shardproof_ops::{Meta, Registry, Tensor, Values};
use std::collections::HashMap;

/// A node of a term: an integer or an operator over children.
///
/// Written by hand rather than with `define_language!`: the macro's discriminant is the enum
/// variant, so every operator node would share one discriminant and each lemma's search would
/// scan every e-class of the graph. Here the discriminant is the operator symbol, so egg's
/// per-operator class index hands a lemma only the classes holding its root operators.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Clone)]
pub enum Term {
    /// An integer literal (a dim, an offset, a size).
    Num(i64),
    /// An operator symbol over its children.
    Op(Symbol, Vec<Id>),
}

impl Language for Term {
    /// `None` for integers, the operator symbol otherwise.
    type Discriminant = Option<Symbol>;

    #[inline(always)]
    fn discriminant(&self) -> Self::Discriminant {
        match self {
            Term::Num(_) => None,
            Term::Op(sym, _) => Some(*sym),
        }
    }

    #[inline(always)]
    fn matches(&self, other: &Self) -> bool {
        match (self, other) {
            (Term::Num(a), Term::Num(b)) => a == b,
            (Term::Op(a, l), Term::Op(b, r)) => a == b && l.len() == r.len(),
            _ => false,
        }
    }

    fn children(&self) -> &[Id] {
        match self {
            Term::Num(_) => &[],
            Term::Op(_, ids) => ids,
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            Term::Num(_) => &mut [],
            Term::Op(_, ids) => ids,
        }
    }
}

impl std::fmt::Display for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Term::Num(n) => std::fmt::Display::fmt(n, f),
            Term::Op(sym, _) => std::fmt::Display::fmt(sym, f),
        }
    }
}

impl FromOp for Term {
    type Error = std::convert::Infallible;

    fn from_op(op: &str, children: Vec<Id>) -> Result<Self, Self::Error> {
        Ok(match op.parse::<i64>() {
            Ok(n) if children.is_empty() => Term::Num(n),
            _ => Term::Op(op.into(), children),
        })
    }
}

/// The operator name `$name`, interned once per call site: a `Symbol` read from a static.
///
/// `$name` must be a constant (`&'static str` literal or `const`): the static keeps the first
/// name it was built from, so a name computed at run time would silently stand for every later
/// one. A `const` item enforces it: a local, a parameter or a non-`const` call does not compile.
macro_rules! sym {
    ($name:expr) => {{
        const NAME: &str = $name;
        static SYM: std::sync::LazyLock<egg::Symbol> =
            std::sync::LazyLock::new(|| egg::Symbol::from(NAME));
        *SYM
    }};
}
pub(crate) use sym;

/// Whether a symbol (`Symbol` or `&Symbol`) names the operator `$name` (a literal or a
/// constant, see [`sym!`]). The name is interned once per call site, so the test is an integer
/// compare: `Symbol::as_str` takes the global symbol table's lock, and lemma searches ran it on
/// every node of every class they scanned (44% of a saturation's time on the llama tp=2 bug
/// case).
macro_rules! is_op {
    ($sym:expr, $name:expr) => {
        *std::borrow::Borrow::<egg::Symbol>::borrow(&$sym) == $crate::term::sym!($name)
    };
}
pub(crate) use is_op;

/// Concatenation along a dim: `(cat D x0 x1 ...)`.
pub const CAT: &str = "cat";
/// Elementwise sum of tensors of one shape (a reduction over ranks): `(sum x0 x1 ...)`.
pub const SUM: &str = "sum";
/// Elementwise maximum over tensors of one shape: `(max x0 x1 ...)`.
pub const MAX: &str = "max";
/// Elementwise minimum over tensors of one shape: `(min x0 x1 ...)`.
pub const MIN: &str = "min";
/// Slice along a dim with step 1: `(slice D START END x)`.
pub const SLICE: &str = "slice";
/// Output K of a multi-output operator: `(get K call)`.
pub const GET: &str = "get";
/// A list literal: `(list a b ...)`.
pub const LIST: &str = "list";
/// A lookup into a vocabulary shard: `(vocab_lookup W t s)` is `W[t - s]` where
/// `s <= t < s + rows(W)` and zero rows elsewhere (Megatron's masked embedding).
pub const VOCAB_LOOKUP: &str = "vocab_lookup";
/// A pick from a vocabulary shard of the last dim: `(vocab_pick X t s)` is `X[..., t - s]` where
/// `s <= t < s + X.shape[-1]` and zero elsewhere (the target logit of vocab-parallel
/// cross-entropy).
pub const VOCAB_PICK: &str = "vocab_pick";
/// The one-hot of targets within a vocabulary shard: `(vocab_onehot t s w)` is a boolean
/// `[.., w]` tensor, true at column `t - s` where `s <= t < s + w` (a row of zeros elsewhere):
/// the target one-hot of vocab-parallel cross-entropy's backward.
pub const VOCAB_ONEHOT: &str = "vocab_onehot";
/// Rows of the embedding gradient for a vocabulary shard: `(vocab_grad G t s n)` is the
/// `[n, H]` tensor whose row `r` sums the rows `G[p]` with `t[p] = s + r` (rows `[s, s + n)` of
/// `embedding_dense_backward(G, t, ..)`; targets outside the shard contribute nothing).
pub const VOCAB_GRAD: &str = "vocab_grad";

/// The symbol of an implementation tensor leaf.
pub fn leaf_symbol(rank: usize, name: &str) -> String {
    format!("%r{rank}:{name}")
}

/// The (rank, value name) of a leaf symbol.
pub fn parse_leaf(sym: &str) -> Option<(usize, &str)> {
    let rest = sym.strip_prefix("%r")?;
    let (r, name) = rest.split_once(':')?;
    Some((r.parse().ok()?, name))
}

/// Whether a node is an implementation tensor leaf.
pub fn is_leaf(node: &Term) -> bool {
    matches!(node, Term::Op(s, c) if c.is_empty() && s.as_str().starts_with("%r"))
}

/// The symbol of a literal argument (ints are `Num` nodes, lists `list` nodes).
pub fn literal_symbol(arg: &Arg) -> Option<String> {
    Some(match arg {
        Arg::None => "none".into(),
        Arg::Bool(b) => format!("b:{b}"),
        Arg::Float(f) => format!("f:{f:?}"),
        Arg::Str(s) => format!("s:{s}"),
        Arg::Dtype(d) => format!("dt:{}", d.short_name()),
        // Placement is irrelevant to values: every device is the same device.
        Arg::Device(_) => "dev".into(),
        Arg::Layout(l) => format!("layout:{l}"),
        Arg::MemoryFormat(m) => format!("mf:{m}"),
        Arg::Op(o) => format!("op:{o}"),
        Arg::Int(_) | Arg::Value(_) | Arg::List(_) => return None,
    })
}

/// The argument a literal symbol stands for.
pub fn literal_arg(sym: &str) -> Option<Arg> {
    Some(match sym {
        "none" => Arg::None,
        "dev" => Arg::Device("cpu".into()),
        _ => {
            let (kind, text) = sym.split_once(':')?;
            match kind {
                "b" => Arg::Bool(text == "true"),
                "f" => Arg::Float(text.parse().ok()?),
                "s" => Arg::Str(text.to_string()),
                "dt" => Arg::Dtype(DType::from_short_name(text)?),
                "layout" => Arg::Layout(text.to_string()),
                "mf" => Arg::MemoryFormat(text.to_string()),
                _ => return None,
            }
        }
    })
}

/// What the analysis knows of an e-class.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// A tensor (or a tuple of tensors, for multi-output calls) with these metas.
    Tensors(Vec<Meta>),
    /// An integer literal.
    Int(i64),
    /// A non-tensor argument (literal or list) of a call.
    Literal,
    /// A tensor whose shape could not be inferred (an ill-formed term).
    Unknown,
}

impl Data {
    /// The meta of a single tensor.
    pub fn meta(&self) -> Option<&Meta> {
        match self {
            Data::Tensors(m) if m.len() == 1 => Some(&m[0]),
            _ => None,
        }
    }

    /// The shape of a single tensor.
    pub fn shape(&self) -> Option<&[usize]> {
        self.meta().map(|m| m.shape.as_slice())
    }
}

/// The shape analysis: metas of leaves are given; every other term's meta is inferred with the
/// operator registry (clean operators by their own rules).
#[derive(Default)]
pub struct Shapes {
    /// Metas of the implementation leaves, by symbol.
    pub leaves: HashMap<Symbol, Meta>,
    /// Where each implementation leaf is computed: its node's position in its rank's program,
    /// and its rank. Extraction breaks ties between equally small expressions by these (see
    /// [`Shapes::preference`]).
    pub positions: HashMap<Symbol, (usize, usize)>,
    /// The blocks of implementation tensors the ranks' programs make zero.
    pub zeros: std::sync::Arc<crate::kinds::ZeroBlocks>,
    /// The size at which lemmas stop adding terms (0: no bound). egg checks its node limit
    /// only between iterations, and one iteration can outgrow it a thousandfold (a view pushed
    /// through every multiple of every class: 16 thousand nodes to 23 million).
    pub node_cap: usize,
}

impl Shapes {
    /// How little extraction prefers a leaf among equals (lower is preferred): the tensor
    /// computed earliest in its rank's program, then the lowest rank, so that replicas and
    /// copies are named the same way in every relation. Unknown leaves come first.
    pub fn preference(&self, leaf: Symbol) -> u64 {
        self.positions
            .get(&leaf)
            .map_or(0, |&(node, rank)| ((node as u64) << 16) + rank as u64)
    }
}

impl Analysis<Term> for Shapes {
    type Data = Data;

    fn make(egraph: &mut EGraph<Term, Self>, enode: &Term) -> Data {
        let (sym, kids) = match enode {
            Term::Num(n) => return Data::Int(*n),
            Term::Op(s, k) => (s, k),
        };
        let s = sym.as_str();
        if kids.is_empty() {
            if let Some(m) = egraph.analysis.leaves.get(sym) {
                return Data::Tensors(vec![m.clone()]);
            }
            if s.starts_with("%r") {
                return Data::Unknown;
            }
            return Data::Literal;
        }
        if s == LIST {
            return Data::Literal;
        }
        let data = |i: usize| &egraph[kids[i]].data;
        let int = |i: usize| match data(i) {
            Data::Int(n) => Some(*n),
            _ => None,
        };
        let meta = |i: usize| data(i).meta().cloned();
        let out = match s {
            CAT => (|| {
                let d = usize::try_from(int(0)?).ok()?;
                let mut m = meta(1)?;
                let mut total = 0;
                for i in 1..kids.len() {
                    let p = meta(i)?;
                    if p.shape.len() != m.shape.len() || d >= p.shape.len() {
                        return None;
                    }
                    total += p.shape[d];
                }
                m.shape[d] = total;
                Some(vec![m])
            })(),
            SUM | MAX | MIN => (|| {
                let m = meta(0)?;
                (1..kids.len())
                    .all(|i| meta(i).is_some_and(|p| p.shape == m.shape))
                    .then(|| vec![m])
            })(),
            SLICE => (|| {
                let d = usize::try_from(int(0)?).ok()?;
                let (a, b) = (int(1)?, int(2)?);
                let mut m = meta(3)?;
                let n = *m.shape.get(d)? as i64;
                if !(0 <= a && a <= b && b <= n) {
                    return None;
                }
                m.shape[d] = (b - a) as usize;
                Some(vec![m])
            })(),
            "scale" => meta(2).map(|m| vec![m]),
            VOCAB_LOOKUP => (|| {
                let (w, t) = (meta(0)?, meta(1)?);
                if w.shape.len() != 2 || t.dtype.is_float() {
                    return None;
                }
                let mut shape = t.shape.clone();
                shape.push(w.shape[1]);
                Some(vec![Meta::new(w.dtype, shape)])
            })(),
            VOCAB_PICK => (|| {
                let (x, t) = (meta(0)?, meta(1)?);
                (x.shape.len() == t.shape.len() + 1
                    && x.shape[..t.shape.len()] == t.shape[..]
                    && !t.dtype.is_float())
                .then(|| vec![Meta::new(x.dtype, t.shape.clone())])
            })(),
            VOCAB_ONEHOT => (|| {
                let (t, w) = (meta(0)?, usize::try_from(int(2)?).ok()?);
                int(1)?;
                if t.dtype.is_float() {
                    return None;
                }
                let mut shape = t.shape.clone();
                shape.push(w);
                Some(vec![Meta::new(DType::Bool, shape)])
            })(),
            VOCAB_GRAD => (|| {
                let (grad, t, n) = (meta(0)?, meta(1)?, usize::try_from(int(3)?).ok()?);
                int(2)?;
                (grad.shape.len() == t.shape.len() + 1
                    && grad.shape[..t.shape.len()] == t.shape[..]
                    && !t.dtype.is_float())
                .then(|| vec![Meta::new(grad.dtype, vec![n, grad.shape[t.shape.len()]])])
            })(),
            GET => (|| {
                let k = usize::try_from(int(0)?).ok()?;
                match data(1) {
                    Data::Tensors(ms) => ms.get(k).cloned().map(|m| vec![m]),
                    _ => None,
                }
            })(),
            _ => infer_call(egraph, s, kids),
        };
        out.map_or(Data::Unknown, Data::Tensors)
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        // Equal terms have equal shapes; an unknown shape is refined by a known one.
        if *a == Data::Unknown && b != Data::Unknown {
            *a = b;
            return DidMerge(true, false);
        }
        DidMerge(false, *a != b)
    }
}

/// The argument an e-class stands for, tensors numbered in order of appearance.
fn class_arg(egraph: &EGraph<Term, Shapes>, id: Id, metas: &mut Vec<Meta>) -> Option<Arg> {
    let class = &egraph[id];
    match &class.data {
        Data::Tensors(ms) => {
            let m = (ms.len() == 1).then(|| ms[0].clone())?;
            metas.push(m);
            Some(Arg::Value(ValueId::new(metas.len() - 1, 0)))
        }
        Data::Int(n) => Some(Arg::Int(*n)),
        Data::Unknown => None,
        Data::Literal => {
            let node = class.nodes.first()?;
            match node {
                Term::Num(n) => Some(Arg::Int(*n)),
                Term::Op(s, kids) if is_op!(s, LIST) => Some(Arg::List(
                    kids.iter()
                        .map(|&k| class_arg(egraph, k, metas))
                        .collect::<Option<Vec<_>>>()?,
                )),
                Term::Op(s, _) => literal_arg(s.as_str()),
            }
        }
    }
}

struct MetaList<'a>(&'a [Meta]);

impl Values for MetaList<'_> {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.0.get(v.node).cloned()
    }
    fn tensor(&self, _: ValueId) -> Option<&Tensor> {
        None
    }
}

fn infer_call(egraph: &EGraph<Term, Shapes>, op: &str, kids: &[Id]) -> Option<Vec<Meta>> {
    let name = shardproof_ir::OpName::parse(op)?;
    let reg = Registry::builtin();
    let def = reg.get(&name)?;
    let mut metas = Vec::new();
    let mut kwargs = Vec::with_capacity(kids.len());
    for (i, &k) in kids.iter().enumerate() {
        let a = class_arg(egraph, k, &mut metas)?;
        kwargs.push((def.schema.args.get(i)?.name.clone(), a));
    }
    reg.infer(def, &[], &kwargs, &MetaList(&metas)).ok()
}
