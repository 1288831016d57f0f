//! The rule table: one placement rule per operator, DTensor-style.
//!
//! A rule sees one mesh dim at a time: the placements of its tensor arguments along that dim
//! (never `Unknown`: the engine stops before), their local shapes, and the bound literal
//! arguments, and returns the placement of every output, or a [`Violation`] with the
//! placements it continues with. [`rule`] finds an operator's rule by `namespace.name`; an
//! operator without one makes its outputs `Unknown`.

use crate::place::{Place, Red};
use shardproof_ir::{Arg, ValueId};
use shardproof_ops::{Args, Meta};
use std::collections::HashMap;
use std::sync::OnceLock;

/// What a violated rule is about: the spatial check it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The SPMD type rules (partial x partial, partial + replicate, a nonlinear function of a
    /// partial, an unmasked vocabulary lookup).
    Spmd,
    /// The inputs' placements admit no output placement (shards on different dims, a norm or
    /// softmax over a sharded dim).
    Consistency,
    /// A collective on an input it cannot take (all-reduce of a replicated tensor, ...).
    Legality,
    /// Sizes through a collective (group size, divisibility).
    Shape,
}

/// How to fix a violation, as the engine words it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hint {
    /// Reduce the partial input (the engine names it, its origin and the mesh dim).
    ReducePartial,
    /// Gather the sharded input first.
    GatherShard,
    /// Words of the rule.
    Text(String),
}

/// A rule that does not hold.
#[derive(Clone, Debug)]
pub struct Violation {
    /// The check it belongs to.
    pub kind: Kind,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub hint: Hint,
    /// The output placements propagation continues with.
    pub recover: Vec<Place>,
    /// What could still make the call legal, for the engine to decide with what it knows of
    /// the other ranks and of scaling.
    pub exempt: Exempt,
}

/// A violation the engine may lift.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Exempt {
    /// None.
    #[default]
    No,
    /// A partial plus a replicated term: legal where the replicated term is pre-scaled by
    /// 1/n (n ranks each add 1/n of it) or where the ranks compute the sum differently (the
    /// term added on some ranks only, as Megatron counts a replicated norm once).
    PartialPlusReplicate(Red),
    /// An all-reduce (sum) of a replicated tensor: legal where it was scaled by 1/n.
    ReduceReplicate,
}

/// The result of a rule on one mesh dim.
pub type Outcome = Result<Vec<Place>, Violation>;

/// The call a rule sees, on one mesh dim.
pub struct Ctx<'a> {
    /// The bound arguments.
    pub args: &'a Args<'a>,
    /// Local output metas.
    pub outs: &'a [Option<Meta>],
    /// Whether the call's literal arguments differ across the ranks of this mesh dim.
    pub varies: bool,
    /// For collectives: whether the group spans this mesh dim.
    pub in_group: bool,
    /// For collectives: the number of ranks in the caller's group.
    pub group_len: usize,
    /// This rank's coordinate along the mesh dim and the dim's size.
    pub coord: (usize, usize),
    /// For slices: the literal arguments of the same node on the other ranks along the mesh
    /// dim, by coordinate (`None` where a rank has no such node).
    pub peer_ints: &'a dyn Fn(&str) -> Vec<Option<i64>>,
    pub(crate) place: &'a dyn Fn(ValueId) -> Place,
    pub(crate) meta: &'a dyn Fn(ValueId) -> Option<Meta>,
}

/// A tensor argument: value, placement on this mesh dim, local meta.
#[derive(Clone, Debug)]
pub struct T {
    /// The value.
    pub v: ValueId,
    /// Its placement on the mesh dim.
    pub p: Place,
    /// Its local meta, when known.
    pub meta: Option<Meta>,
}

impl T {
    /// The tensor's rank (number of dims), 0 when unknown.
    pub fn rank(&self) -> usize {
        self.meta.as_ref().map_or(0, |m| m.shape.len())
    }
}

impl<'a> Ctx<'a> {
    fn has(&self, name: &str) -> bool {
        self.args.schema().index_of(name).is_some()
    }

    /// The argument `name` as given (or its default), when the schema has it.
    pub fn arg(&self, name: &str) -> Option<Arg> {
        if self.has(name) {
            self.args.get(name)
        } else {
            None
        }
    }

    /// The tensor argument `name`.
    pub fn t(&self, name: &str) -> Option<T> {
        match self.arg(name)? {
            Arg::Value(v) => Some(T {
                v,
                p: (self.place)(v),
                meta: (self.meta)(v),
            }),
            _ => None,
        }
    }

    /// The tensors of a list argument `name`.
    pub fn ts(&self, name: &str) -> Vec<T> {
        let mut vs = Vec::new();
        if let Some(a) = self.arg(name) {
            a.values(&mut vs);
        }
        vs.into_iter()
            .map(|v| T {
                v,
                p: (self.place)(v),
                meta: (self.meta)(v),
            })
            .collect()
    }

    /// An int argument.
    pub fn int(&self, name: &str) -> Option<i64> {
        self.arg(name).and_then(|a| a.as_int())
    }

    /// An int-list argument.
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.arg(name).and_then(|a| a.as_int_list())
    }

    /// A number argument (not a tensor).
    pub fn num(&self, name: &str) -> Option<f64> {
        self.arg(name).and_then(|a| a.as_f64())
    }

    /// A string argument.
    pub fn str(&self, name: &str) -> Option<String> {
        match self.arg(name)? {
            Arg::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The number of outputs.
    pub fn n_out(&self) -> usize {
        self.outs.len().max(1)
    }

    /// The rank of output `i`.
    pub fn out_rank(&self, i: usize) -> usize {
        self.outs
            .get(i)
            .and_then(|m| m.as_ref())
            .map_or(0, |m| m.shape.len())
    }

    fn all(&self, p: Place) -> Outcome {
        Ok(vec![p; self.n_out()])
    }
}

/// Normalizes a possibly negative dim against a rank.
pub fn norm_dim(d: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let d = if d < 0 { d + r } else { d };
    (0..r.max(1)).contains(&d).then_some(d as usize)
}

fn bad(kind: Kind, message: impl Into<String>, hint: Hint, recover: Vec<Place>) -> Outcome {
    Err(Violation {
        kind,
        message: message.into(),
        hint,
        recover,
        exempt: Exempt::No,
    })
}

/// A rule: the placement of every output from the call on one mesh dim.
pub type RuleFn = fn(&Ctx) -> Outcome;

/// How the engine treats literal arguments that differ across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Literals {
    /// A replicated result of rank-dependent literals varies (the engine makes it `Varying`).
    Vary,
    /// The rule reads the ranks' literals itself (slices, collectives, point-to-point).
    Own,
}

/// One entry of the rule table.
pub struct Rule {
    /// What the rule is, for the docs and the report (`elementwise-add`, `matmul`, ...).
    pub family: &'static str,
    /// The rule.
    pub f: RuleFn,
    /// How rank-dependent literals are treated.
    pub literals: Literals,
}

/// The rule of an operator (by `namespace.name`; the overload is read from the arguments).
pub fn rule(base: &str) -> Option<&'static Rule> {
    table().get(base)
}

/// Every operator with a rule, as (`namespace.name`, family), sorted.
pub fn rules() -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = table().iter().map(|(k, r)| (*k, r.family)).collect();
    v.sort_unstable();
    v
}

fn table() -> &'static HashMap<&'static str, Rule> {
    static T: OnceLock<HashMap<&'static str, Rule>> = OnceLock::new();
    T.get_or_init(build)
}

fn build() -> HashMap<&'static str, Rule> {
    let mut m: HashMap<&'static str, Rule> = HashMap::new();
    let mut add = |names: &[&'static str], family: &'static str, f: RuleFn, literals| {
        for n in names {
            m.insert(
                n,
                Rule {
                    family,
                    f,
                    literals,
                },
            );
        }
    };
    use Literals::{Own, Vary};
    add(
        &[
            "aten.clone",
            "aten.contiguous",
            "aten._to_copy",
            "aten.to",
            "aten.alias",
            "aten.alias_copy",
            "aten.detach",
            "aten.detach_copy",
            "aten.lift",
            "aten.lift_fresh",
            "aten.lift_fresh_copy",
            "aten.neg",
            "_c10d_functional.wait_tensor",
            "aten.native_dropout_backward",
        ],
        "linear-unary",
        linear_unary,
        Vary,
    );
    add(
        &["aten.dropout", "aten.native_dropout"],
        "dropout",
        dropout,
        Vary,
    );
    add(
        &[
            "aten.relu",
            "aten.gelu",
            "aten.silu",
            "aten.sigmoid",
            "aten.tanh",
            "aten.exp",
            "aten.exp2",
            "aten.expm1",
            "aten.log",
            "aten.log2",
            "aten.log10",
            "aten.log1p",
            "aten.sqrt",
            "aten.rsqrt",
            "aten.reciprocal",
            "aten.abs",
            "aten.sin",
            "aten.cos",
            "aten.tan",
            "aten.sinh",
            "aten.cosh",
            "aten.asin",
            "aten.acos",
            "aten.atan",
            "aten.asinh",
            "aten.acosh",
            "aten.atanh",
            "aten.erf",
            "aten.erfc",
            "aten.erfinv",
            "aten.round",
            "aten.floor",
            "aten.ceil",
            "aten.trunc",
            "aten.fix",
            "aten.frac",
            "aten.sign",
            "aten.sgn",
            "aten.clamp",
            "aten.clamp_min",
            "aten.clamp_max",
            "aten.isnan",
            "aten.isinf",
            "aten.isfinite",
            "aten.isposinf",
            "aten.isneginf",
            "aten.nan_to_num",
            "aten.bitwise_not",
            "aten.logical_not",
        ],
        "nonlinear-unary",
        nonlinear_unary,
        Vary,
    );
    add(&["aten.pow"], "pow", pow, Vary);
    add(
        &["aten.add", "aten.sub", "aten.rsub"],
        "elementwise-add",
        add_sub,
        Vary,
    );
    add(&["aten.mul"], "elementwise-mul", mul, Vary);
    add(&["aten.div"], "elementwise-div", div, Vary);
    add(
        &[
            "aten.maximum",
            "aten.minimum",
            "aten.fmax",
            "aten.fmin",
            "aten.atan2",
            "aten.remainder",
            "aten.fmod",
            "aten.floor_divide",
            "aten.eq",
            "aten.ne",
            "aten.lt",
            "aten.le",
            "aten.gt",
            "aten.ge",
            "aten.bitwise_and",
            "aten.bitwise_or",
            "aten.bitwise_xor",
            "aten.logical_and",
            "aten.logical_or",
            "aten.logical_xor",
            "aten.__and__",
            "aten.__or__",
            "aten.__xor__",
        ],
        "nonlinear-binary",
        nonlinear_binary,
        Vary,
    );
    add(&["aten.max", "aten.min"], "max-min", max_min, Vary);
    add(
        &[
            "aten.threshold_backward",
            "aten.gelu_backward",
            "aten.silu_backward",
            "aten.sigmoid_backward",
            "aten.tanh_backward",
        ],
        "activation-backward",
        activation_backward,
        Vary,
    );
    add(&["aten.where"], "where", where_, Vary);
    add(&["aten.masked_fill"], "masked-fill", masked_fill, Vary);
    add(&["aten.lerp"], "lerp", lerp, Vary);
    add(&["aten.addcmul", "aten.addcdiv"], "addcmul", addcmul, Vary);
    add(
        &["aten.mm", "aten.bmm", "aten.matmul", "aten.dot", "aten.mv"],
        "matmul",
        matmul,
        Vary,
    );
    add(&["aten.addmm", "aten.baddbmm"], "matmul-bias", addmm, Vary);
    add(&["aten.linear"], "linear", linear, Vary);
    add(
        &[
            "aten.view",
            "aten.view_copy",
            "aten.reshape",
            "aten._unsafe_view",
            "aten.flatten",
            "aten.unflatten",
        ],
        "view",
        view,
        Vary,
    );
    add(&["aten.t", "aten.t_copy"], "transpose", t, Vary);
    add(
        &["aten.transpose", "aten.transpose_copy"],
        "transpose",
        transpose,
        Vary,
    );
    add(
        &["aten.permute", "aten.permute_copy"],
        "permute",
        permute,
        Vary,
    );
    add(
        &["aten.unsqueeze", "aten.unsqueeze_copy"],
        "unsqueeze",
        unsqueeze,
        Vary,
    );
    add(
        &["aten.squeeze", "aten.squeeze_copy"],
        "squeeze",
        squeeze,
        Vary,
    );
    add(&["aten.expand", "aten.expand_copy"], "expand", expand, Vary);
    add(&["aten.repeat"], "repeat", repeat, Vary);
    add(
        &["aten.slice", "aten.slice_copy", "aten.narrow"],
        "slice",
        slice,
        Own,
    );
    add(&["aten.select", "aten.select_copy"], "select", select, Own);
    add(&["aten.cat"], "cat", cat, Vary);
    add(&["aten.stack"], "stack", stack, Vary);
    add(
        &[
            "aten.split",
            "aten.split_with_sizes",
            "aten.chunk",
            "aten.unbind",
        ],
        "split",
        split,
        Vary,
    );
    add(
        &["aten.slice_scatter", "aten.select_scatter"],
        "slice-scatter",
        slice_scatter,
        Own,
    );
    add(&["aten.constant_pad_nd", "aten.pad"], "pad", pad, Vary);
    add(&["aten.flip", "aten.roll"], "flip", flip, Vary);
    add(&["aten.triu", "aten.tril"], "triangle", triangle, Vary);
    add(
        &[
            "aten.sum",
            "aten.mean",
            "aten.amax",
            "aten.amin",
            "aten.logsumexp",
            "aten.prod",
            "aten.var",
            "aten.std",
            "aten.argmax",
            "aten.argmin",
            "aten.all",
            "aten.any",
            "aten.count_nonzero",
            "aten.norm",
            "aten.linalg_vector_norm",
        ],
        "reduction",
        reduction,
        Vary,
    );
    add(&["aten.cumsum", "aten.cumprod"], "scan", scan, Vary);
    add(
        &[
            "aten._softmax",
            "aten.softmax",
            "aten._log_softmax",
            "aten.log_softmax",
        ],
        "softmax",
        softmax,
        Vary,
    );
    add(
        &[
            "aten._softmax_backward_data",
            "aten._log_softmax_backward_data",
        ],
        "softmax-backward",
        softmax_backward,
        Vary,
    );
    add(
        &[
            "aten.native_layer_norm",
            "aten.layer_norm",
            "aten.rms_norm",
            "aten._fused_rms_norm",
        ],
        "norm",
        norm,
        Vary,
    );
    add(
        &[
            "aten.native_layer_norm_backward",
            "aten._fused_rms_norm_backward",
        ],
        "norm-backward",
        norm_backward,
        Vary,
    );
    add(
        &["apex.fused_layer_norm_affine_fwd"],
        "norm",
        apex_norm,
        Vary,
    );
    add(
        &["aten.topk", "aten.sort", "aten.argsort"],
        "sort",
        sort,
        Vary,
    );
    add(&["aten.embedding"], "embedding", embedding, Vary);
    add(
        &["aten.embedding_dense_backward"],
        "embedding-backward",
        embedding_backward,
        Vary,
    );
    add(&["aten.gather"], "gather", gather, Vary);
    add(&["aten.index_select"], "index-select", index_select, Vary);
    add(&["aten.index", "aten._unsafe_index"], "index", index, Vary);
    add(
        &["aten.index_put", "aten._unsafe_index_put"],
        "index-put",
        index_put,
        Vary,
    );
    add(
        &[
            "aten.scatter",
            "aten.scatter_add",
            "aten.scatter_reduce",
            "aten.index_add",
            "aten.index_copy",
            "aten.index_fill",
        ],
        "scatter",
        scatter,
        Vary,
    );
    add(&["aten.nll_loss_forward"], "nll-loss", nll_loss, Vary);
    add(
        &["aten.nll_loss_backward"],
        "nll-loss-backward",
        nll_loss_backward,
        Vary,
    );
    add(&["aten.mse_loss"], "mse-loss", mse_loss, Vary);
    add(
        &["aten.mse_loss_backward"],
        "mse-loss-backward",
        mse_loss_backward,
        Vary,
    );
    add(
        &[
            "aten.full",
            "aten.zeros",
            "aten.ones",
            "aten.empty",
            "aten.empty_strided",
            "aten.arange",
            "aten.eye",
            "aten.linspace",
            "aten.scalar_tensor",
        ],
        "creation",
        creation,
        Vary,
    );
    add(
        &[
            "aten.full_like",
            "aten.zeros_like",
            "aten.ones_like",
            "aten.empty_like",
            "aten.new_full",
            "aten.new_zeros",
            "aten.new_ones",
            "aten.new_empty",
            "aten.new_empty_strided",
            "aten.fill",
            "aten.zero",
        ],
        "like",
        like,
        Vary,
    );
    add(&["aten.copy"], "copy", copy, Vary);
    add(
        &["aten._assert_tensor_metadata"],
        "assert",
        assert_meta,
        Vary,
    );
    add(
        &["_c10d_functional.all_reduce"],
        "all-reduce",
        all_reduce,
        Own,
    );
    add(
        &["_c10d_functional.all_gather_into_tensor"],
        "all-gather",
        all_gather,
        Own,
    );
    add(
        &["_c10d_functional.reduce_scatter_tensor"],
        "reduce-scatter",
        reduce_scatter,
        Own,
    );
    add(
        &["_c10d_functional.all_to_all_single"],
        "all-to-all",
        all_to_all,
        Own,
    );
    add(&["_c10d_functional.broadcast"], "broadcast", broadcast, Own);
    add(&["shardproof_p2p.send"], "send", linear_unary_own, Own);
    m
}

// ---------------------------------------------------------------------------------------------
// Element-wise rules

/// How an element-wise operator treats a pending reduction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lin {
    /// Every tensor argument enters linearly and additively (add, sub, cat, where).
    Add,
    /// Linear in each argument separately (mul): one partial times replicated tensors.
    Mul,
    /// Linear in the first argument only (div by a replicated divisor; activation backward
    /// in its gradient).
    First,
    /// Not linear: no partial argument.
    None,
}

/// Placement of `x`'s sharded dim in an output of rank `out_rank` (broadcast aligns dims
/// from the right).
fn aligned(x: &T, out_rank: usize) -> Place {
    match x.p {
        Place::Shard(d) => Place::shard(d as usize + out_rank.saturating_sub(x.rank())),
        p => p,
    }
}

/// Merges the placements of element-wise arguments (broadcast), with `lin` deciding where a
/// partial may enter, and `scalar_nonzero` a non-zero scalar operand added to the result.
fn merge(
    ts: &[T],
    out_rank: usize,
    lin: Lin,
    scalar_add_nonzero: bool,
) -> Result<Place, Violation> {
    let places: Vec<Place> = ts.iter().map(|t| aligned(t, out_rank)).collect();
    if places.contains(&Place::Unmasked) {
        return Err(Violation {
            kind: Kind::Spmd,
            message: "reads rows looked up in a vocabulary shard before the rows outside the \
                      rank's range are zeroed"
                .into(),
            hint: Hint::Text(
                "mask the lookup (masked_fill of the out-of-range rows with 0) before using it"
                    .into(),
            ),
            recover: vec![Place::Replicate],
            exempt: Exempt::No,
        });
    }
    let mut shard: Option<u8> = None;
    let mut varying = false;
    let mut partial: Option<Red> = None;
    let mut n_partial = 0;
    let mut n_plain_tensor = 0;
    for p in &places {
        match *p {
            Place::Shard(d) => {
                if let Some(e) = shard {
                    if e != d {
                        return Err(Violation {
                            kind: Kind::Consistency,
                            message: format!(
                                "combines tensors sharded on different dims (Shard({e}) and \
                                 Shard({d}))"
                            ),
                            hint: Hint::Text(
                                "redistribute one operand (all-gather it, or all-to-all) so \
                                 both are sharded on the same dim"
                                    .into(),
                            ),
                            recover: vec![Place::Varying],
                            exempt: Exempt::No,
                        });
                    }
                }
                shard = Some(d);
                n_plain_tensor += 1;
            }
            Place::Varying => {
                varying = true;
                n_plain_tensor += 1;
            }
            Place::Partial(r) => {
                if partial.is_some_and(|q| q != r) {
                    return Err(Violation {
                        kind: Kind::Spmd,
                        message: "combines partial tensors of different reductions".into(),
                        hint: Hint::ReducePartial,
                        recover: vec![Place::Replicate],
                        exempt: Exempt::No,
                    });
                }
                partial = Some(r);
                n_partial += 1;
            }
            Place::Replicate => n_plain_tensor += 1,
            Place::Unmasked | Place::Unknown => {}
        }
    }
    let plain = if varying {
        Place::Varying
    } else if let Some(d) = shard {
        Place::Shard(d)
    } else {
        Place::Replicate
    };
    let Some(r) = partial else { return Ok(plain) };
    let spmd_ex = |message: &str, exempt: Exempt| {
        Err(Violation {
            kind: Kind::Spmd,
            message: message.into(),
            hint: Hint::ReducePartial,
            recover: vec![plain],
            exempt,
        })
    };
    let spmd = |message: &str| spmd_ex(message, Exempt::No);
    if !(r.is_linear() || (lin == Lin::Add && n_partial == ts.len() && ts.len() == 1)) {
        return spmd(&format!(
            "applies an operator to a Partial({}) tensor: only a reduction over the ranks \
             (all-reduce) may read it",
            r.name()
        ));
    }
    match lin {
        Lin::None => spmd("applies a nonlinear operator to a partial sum (the result is not the partial of anything)"),
        Lin::Add => {
            if n_plain_tensor > 0 {
                spmd_ex(
                    "adds a partial sum and a non-partial tensor: the non-partial term is counted once per rank (partial + replicate)",
                    if varying || shard.is_some() { Exempt::No } else { Exempt::PartialPlusReplicate(r) },
                )
            } else if scalar_add_nonzero {
                spmd("adds a constant to a partial sum: the constant is counted once per rank")
            } else {
                Ok(Place::Partial(r))
            }
        }
        Lin::Mul => {
            if n_partial > 1 {
                spmd("multiplies two partial sums (partial x partial does not distribute over the pending sum)")
            } else if varying || shard.is_some() {
                spmd("multiplies a partial sum by a tensor that differs across ranks")
            } else {
                Ok(Place::Partial(r))
            }
        }
        Lin::First => {
            if ts.first().is_some_and(|t| aligned(t, out_rank).is_partial()) && n_partial == 1 {
                if varying || shard.is_some() {
                    spmd("scales a partial sum by a tensor that differs across ranks")
                } else {
                    Ok(Place::Partial(r))
                }
            } else {
                spmd("divides by (or feeds the nonlinear operand with) a partial sum")
            }
        }
    }
}

fn one(p: Result<Place, Violation>, n: usize) -> Outcome {
    match p {
        Ok(p) => Ok(vec![p; n]),
        Err(mut v) => {
            let r = v.recover.first().copied().unwrap_or(Place::Replicate);
            v.recover = vec![r; n];
            Err(v)
        }
    }
}

fn tensors(c: &Ctx, names: &[&str]) -> Vec<T> {
    names.iter().filter_map(|n| c.t(n)).collect()
}

fn linear_unary(c: &Ctx) -> Outcome {
    let x = c
        .t("self")
        .or_else(|| c.t("input"))
        .or_else(|| c.t("tensor"))
        .or_else(|| c.t("grad_output"));
    match x {
        Some(x) if x.p == Place::Unmasked => c.all(Place::Unmasked),
        Some(x) => one(merge(&[x], c.out_rank(0), Lin::Add, false), c.n_out()),
        None => c.all(Place::Replicate),
    }
}

fn linear_unary_own(c: &Ctx) -> Outcome {
    linear_unary(c)
}

fn dropout(c: &Ctx) -> Outcome {
    let x = c.t("input").or_else(|| c.t("self"));
    match x {
        Some(x) if x.p.is_partial() => one(merge(&[x], c.out_rank(0), Lin::Mul, false), c.n_out()),
        Some(x) => c.all(x.p),
        None => c.all(Place::Replicate),
    }
}

fn nonlinear_unary(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "min", "max"]);
    one(merge(&ts, c.out_rank(0), Lin::None, false), c.n_out())
}

fn pow(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "exponent"]);
    let linear = c.num("exponent") == Some(1.0);
    one(
        merge(
            &ts,
            c.out_rank(0),
            if linear { Lin::Add } else { Lin::None },
            false,
        ),
        c.n_out(),
    )
}

fn add_sub(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "other"]);
    let scalar = c
        .arg("other")
        .and_then(|a| a.as_f64())
        .or_else(|| c.arg("self").and_then(|a| a.as_f64()));
    one(
        merge(
            &ts,
            c.out_rank(0),
            Lin::Add,
            scalar.is_some_and(|s| s != 0.0),
        ),
        c.n_out(),
    )
}

fn mul(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "other"]);
    one(merge(&ts, c.out_rank(0), Lin::Mul, false), c.n_out())
}

fn div(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "other"]);
    if c.str("rounding_mode").is_some() {
        return one(merge(&ts, c.out_rank(0), Lin::None, false), c.n_out());
    }
    one(merge(&ts, c.out_rank(0), Lin::First, false), c.n_out())
}

fn nonlinear_binary(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "other"]);
    one(merge(&ts, c.out_rank(0), Lin::None, false), c.n_out())
}

fn max_min(c: &Ctx) -> Outcome {
    if c.has("other") {
        return nonlinear_binary(c);
    }
    reduction(c)
}

fn activation_backward(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["grad_output", "self", "output"]);
    one(merge(&ts, c.out_rank(0), Lin::First, false), c.n_out())
}

fn where_(c: &Ctx) -> Outcome {
    let cond = tensors(c, &["condition"]);
    let vals = tensors(c, &["self", "other"]);
    let nonzero = ["self", "other"]
        .iter()
        .any(|n| c.arg(n).and_then(|a| a.as_f64()).is_some_and(|s| s != 0.0));
    let out = c.out_rank(0);
    let cp = match merge(&cond, out, Lin::None, false) {
        Ok(p) => p,
        Err(v) => return one(Err(v), c.n_out()),
    };
    let mut all = vals.clone();
    all.extend(cond.iter().map(|t| T {
        p: if t.p == Place::Replicate {
            Place::Replicate
        } else {
            t.p
        },
        ..t.clone()
    }));
    if vals.iter().any(|t| t.p.is_partial()) {
        // where(c, p, 0) is linear in p with a non-partial mask.
        let mut r = merge(&vals, out, Lin::Add, nonzero);
        if let Ok(Place::Partial(red)) = r {
            if cp != Place::Replicate {
                r = Err(Violation {
                    kind: Kind::Spmd,
                    message: format!(
                        "selects from a Partial({}) tensor with a mask that differs across ranks",
                        red.name()
                    ),
                    hint: Hint::ReducePartial,
                    recover: vec![Place::Varying],
                    exempt: Exempt::No,
                });
            }
        }
        return one(r, c.n_out());
    }
    one(merge(&all, out, Lin::None, false), c.n_out())
}

fn masked_fill(c: &Ctx) -> Outcome {
    let (Some(x), Some(mask)) = (c.t("self"), c.t("mask")) else {
        return nonlinear_unary(c);
    };
    let zero = c.num("value") == Some(0.0);
    if x.p == Place::Unmasked {
        if zero && mask.p == Place::Varying {
            return c.all(Place::Partial(Red::Sum));
        }
        return bad(
            Kind::Spmd,
            "masks a vocabulary-shard lookup with a mask that does not depend on the rank's \
             vocabulary range (or fills with a non-zero value)",
            Hint::Text("zero the rows whose index falls outside the rank's range".into()),
            vec![Place::Varying; c.n_out()],
        );
    }
    if x.p.is_partial() {
        let r = merge(&[x], c.out_rank(0), Lin::Add, !zero);
        if mask.p != Place::Replicate && r.is_ok() {
            return bad(
                Kind::Spmd,
                "masks a partial sum with a mask that differs across ranks",
                Hint::ReducePartial,
                vec![Place::Varying; c.n_out()],
            );
        }
        return one(r, c.n_out());
    }
    let mut ts = vec![x];
    ts.extend(c.t("value"));
    ts.push(mask);
    one(merge(&ts, c.out_rank(0), Lin::None, false), c.n_out())
}

fn lerp(c: &Ctx) -> Outcome {
    let mut ts = tensors(c, &["self", "end"]);
    if let Some(w) = c.t("weight") {
        if w.p.is_partial() {
            ts.push(w);
            return one(merge(&ts, c.out_rank(0), Lin::None, false), c.n_out());
        }
        if ts.iter().any(|t| t.p.is_partial()) && w.p != Place::Replicate {
            return one(
                merge(&[ts, vec![w]].concat(), c.out_rank(0), Lin::Mul, false),
                c.n_out(),
            );
        }
        ts.push(T {
            p: if ts.iter().any(|t| t.p.is_partial()) {
                ts[0].p
            } else {
                w.p
            },
            ..w
        });
    }
    one(merge(&ts, c.out_rank(0), Lin::Add, false), c.n_out())
}

fn addcmul(c: &Ctx) -> Outcome {
    let out = c.out_rank(0);
    let (Some(s), Some(t1), Some(t2)) = (c.t("self"), c.t("tensor1"), c.t("tensor2")) else {
        return nonlinear_unary(c);
    };
    let divide = c.args.schema().name.starts_with("addcdiv");
    let prod = match merge(
        &[t1.clone(), t2],
        out,
        if divide { Lin::First } else { Lin::Mul },
        false,
    ) {
        Ok(p) => p,
        Err(v) => return one(Err(v), c.n_out()),
    };
    let pt = T {
        p: prod,
        meta: t1.meta.clone(),
        v: t1.v,
    };
    one(merge(&[s, pt], out, Lin::Add, false), c.n_out())
}

// ---------------------------------------------------------------------------------------------
// Matrix products

/// The einsum-style rule of a product: each operand's dims labelled batch, free or
/// contracted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Label {
    Batch(usize),
    Row,
    Col,
    Contract,
}

fn product(
    a: &T,
    la: &[Label],
    b: &T,
    lb: &[Label],
    out_of: &dyn Fn(Label) -> Option<usize>,
) -> Result<Place, Violation> {
    let lab = |t: &T, l: &[Label]| t.p.shard_dim().and_then(|d| l.get(d).copied());
    let consistency = |message: String| Violation {
        kind: Kind::Consistency,
        message,
        hint: Hint::GatherShard,
        recover: vec![Place::Varying],
        exempt: Exempt::No,
    };
    match (a.p, b.p) {
        (Place::Unmasked, _) | (_, Place::Unmasked) => merge(&[a.clone(), b.clone()], 0, Lin::None, false),
        (Place::Partial(_), Place::Partial(_)) => Err(Violation {
            kind: Kind::Spmd,
            message: "multiplies two partial sums (partial x partial)".into(),
            hint: Hint::ReducePartial,
            recover: vec![Place::Replicate], exempt: Exempt::No,
        }),
        (Place::Partial(r), Place::Replicate) | (Place::Replicate, Place::Partial(r)) if r.is_linear() => Ok(Place::Partial(r)),
        (Place::Partial(_), _) | (_, Place::Partial(_)) => Err(Violation {
            kind: Kind::Spmd,
            message: "multiplies a partial sum by a tensor that is not replicated".into(),
            hint: Hint::ReducePartial,
            recover: vec![Place::Varying], exempt: Exempt::No,
        }),
        (Place::Replicate, Place::Replicate) => Ok(Place::Replicate),
        (Place::Varying, _) | (_, Place::Varying) => Ok(Place::Varying),
        (Place::Shard(_), Place::Shard(_)) => match (lab(a, la), lab(b, lb)) {
            (Some(Label::Contract), Some(Label::Contract)) => Ok(Place::Partial(Red::Sum)),
            (Some(Label::Batch(i)), Some(Label::Batch(j))) if i == j => {
                Ok(out_of(Label::Batch(i)).map_or(Place::Varying, Place::shard))
            }
            (x, y) => Err(consistency(format!(
                "multiplies operands sharded on incompatible dims ({x:?} of the left, {y:?} \
                 of the right)"
            ))),
        },
        // A replicated operand has the local size of the shard it meets (local shapes
        // type-check): it stands for its own tiling, and the product follows the shard.
        (Place::Shard(_), Place::Replicate) => match lab(a, la) {
            Some(l @ (Label::Row | Label::Col | Label::Batch(_))) => Ok(out_of(l).map_or(Place::Varying, Place::shard)),
            l => Err(consistency(format!(
                "the left operand is sharded on its {l:?} dim (contracted) but the right one is replicated"
            ))),
        },
        (Place::Replicate, Place::Shard(_)) => match lab(b, lb) {
            Some(l @ (Label::Row | Label::Col | Label::Batch(_))) => Ok(out_of(l).map_or(Place::Varying, Place::shard)),
            l => Err(consistency(format!(
                "the right operand is sharded on its {l:?} dim (contracted) but the left one is replicated"
            ))),
        },
        _ => Ok(Place::Unknown),
    }
}

/// Labels of a matmul: `a` of rank ra, `b` of rank rb (torch.matmul's broadcasting).
fn matmul_labels(ra: usize, rb: usize) -> (Vec<Label>, Vec<Label>, Vec<Label>) {
    let batch = ra.max(rb).saturating_sub(2);
    let la: Vec<Label> = match ra {
        1 => vec![Label::Contract],
        _ => (0..ra - 2)
            .map(|i| Label::Batch(batch - (ra - 2) + i))
            .chain([Label::Row, Label::Contract])
            .collect(),
    };
    let lb: Vec<Label> = match rb {
        1 => vec![Label::Contract],
        _ => (0..rb - 2)
            .map(|i| Label::Batch(batch - (rb - 2) + i))
            .chain([Label::Contract, Label::Col])
            .collect(),
    };
    let mut lo: Vec<Label> = (0..batch).map(Label::Batch).collect();
    if ra > 1 {
        lo.push(Label::Row);
    }
    if rb > 1 {
        lo.push(Label::Col);
    }
    (la, lb, lo)
}

fn mm_place(a: &T, b: &T) -> Result<Place, Violation> {
    let (la, lb, lo) = matmul_labels(a.rank(), b.rank());
    product(a, &la, b, &lb, &|l| lo.iter().position(|x| *x == l))
}

fn matmul(c: &Ctx) -> Outcome {
    let a = c.t("self");
    let b = c
        .t("mat2")
        .or_else(|| c.t("other"))
        .or_else(|| c.t("tensor"))
        .or_else(|| c.t("vec"));
    let (Some(a), Some(b)) = (a, b) else {
        return c.all(Place::Unknown);
    };
    one(mm_place(&a, &b), c.n_out())
}

fn with_bias(
    c: &Ctx,
    prod: Result<Place, Violation>,
    bias: Option<T>,
    scaled_out: bool,
) -> Outcome {
    let p = match prod {
        Ok(p) => p,
        Err(v) => return one(Err(v), c.n_out()),
    };
    let Some(bias) = bias else { return c.all(p) };
    if scaled_out {
        return c.all(p);
    }
    let pt = T {
        v: bias.v,
        p,
        meta: c.outs.first().cloned().flatten(),
    };
    match merge(&[pt, bias], c.out_rank(0), Lin::Add, false) {
        Err(mut v) if p.is_partial() => {
            v.message = "adds a replicated bias to a partial matrix product: the bias is counted once per rank (add it after the reduction)".into();
            one(Err(v), c.n_out())
        }
        r => one(r, c.n_out()),
    }
}

fn addmm(c: &Ctx) -> Outcome {
    let (Some(a), Some(b)) = (
        c.t("mat1").or_else(|| c.t("batch1")),
        c.t("mat2").or_else(|| c.t("batch2")),
    ) else {
        return c.all(Place::Unknown);
    };
    let beta_zero = c.num("beta") == Some(0.0);
    with_bias(c, mm_place(&a, &b), c.t("self"), beta_zero)
}

fn linear(c: &Ctx) -> Outcome {
    let (Some(x), Some(w)) = (c.t("input"), c.t("weight")) else {
        return c.all(Place::Unknown);
    };
    // x [..., k] @ w[m, k]^T
    let rx = x.rank();
    let batch = rx.saturating_sub(1);
    let lx: Vec<Label> = (0..batch)
        .map(Label::Batch)
        .chain([Label::Contract])
        .collect();
    let lw = vec![Label::Col, Label::Contract];
    let mut lo: Vec<Label> = (0..batch).map(Label::Batch).collect();
    lo.push(Label::Col);
    // A batch-sharded input against a replicated weight: its batch dims are free.
    let prod = if matches!(x.p, Place::Shard(d) if (d as usize) < batch) && w.p == Place::Replicate
    {
        Ok(x.p)
    } else {
        product(&x, &lx, &w, &lw, &|l| lo.iter().position(|y| *y == l))
    };
    with_bias(c, prod, c.t("bias"), false)
}

// ---------------------------------------------------------------------------------------------
// Views and layout

/// Where a shard of input dim `d` lands in a view from `ins` to `outs` (local shapes):
/// `Some(od)` when the shard stays contiguous (it is the outermost non-trivial dim of its
/// group), `None` when the view interleaves it.
pub fn view_dim(ins: &[usize], outs: &[usize], d: usize) -> Option<usize> {
    if ins.get(d).copied().unwrap_or(0) <= 1 {
        // A size-1 shard: it lands on the output dim of the same position in an unchanged
        // prefix only.
        return (ins[..=d.min(ins.len().saturating_sub(1))] == outs[..(d + 1).min(outs.len())])
            .then_some(d);
    }
    let (mut i, mut o) = (0usize, 0usize);
    while i < ins.len() && o < outs.len() {
        // Skip size-1 dims that start a group.
        let (gi0, go0) = (i, o);
        let (mut pi, mut po) = (ins[i] as u128, outs[o] as u128);
        i += 1;
        o += 1;
        while pi != po {
            if pi < po {
                if i >= ins.len() {
                    return None;
                }
                pi *= ins[i] as u128;
                i += 1;
            } else {
                if o >= outs.len() {
                    return None;
                }
                po *= outs[o] as u128;
                o += 1;
            }
        }
        // Absorb trailing size-1 dims into neither group: they start their own.
        if (gi0..i).contains(&d) {
            let first_in = (gi0..i).find(|&k| ins[k] > 1)?;
            if first_in != d {
                return None;
            }
            // The outermost output dim of the group holds the shard (a local size of 1 there
            // is one of the mesh dim's pieces).
            return Some(go0);
        }
    }
    None
}

fn out_shape(c: &Ctx, i: usize) -> Option<Vec<usize>> {
    c.outs
        .get(i)
        .and_then(|m| m.as_ref())
        .map(|m| m.shape.clone())
}

fn view(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    match x.p {
        Place::Shard(d) => {
            let (Some(m), Some(out)) = (&x.meta, out_shape(c, 0)) else {
                return c.all(Place::Unknown);
            };
            c.all(view_dim(&m.shape, &out, d as usize).map_or(Place::Varying, Place::shard))
        }
        p => c.all(p),
    }
}

fn moved(c: &Ctx, f: impl Fn(usize) -> Option<usize>) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    match x.p {
        Place::Shard(d) => c.all(f(d as usize).map_or(Place::Varying, Place::shard)),
        p => c.all(p),
    }
}

fn t(c: &Ctx) -> Outcome {
    let r = c.t("self").map_or(0, |x| x.rank());
    moved(c, |d| Some(if r == 2 { 1 - d } else { d }))
}

fn transpose(c: &Ctx) -> Outcome {
    let r = c.t("self").map_or(0, |x| x.rank());
    let (Some(a), Some(b)) = (
        c.int("dim0").and_then(|d| norm_dim(d, r)),
        c.int("dim1").and_then(|d| norm_dim(d, r)),
    ) else {
        return c.all(Place::Unknown);
    };
    moved(c, |d| {
        Some(if d == a {
            b
        } else if d == b {
            a
        } else {
            d
        })
    })
}

fn permute(c: &Ctx) -> Outcome {
    let r = c.t("self").map_or(0, |x| x.rank());
    let Some(dims) = c.ints("dims") else {
        return c.all(Place::Unknown);
    };
    let dims: Option<Vec<usize>> = dims.iter().map(|&d| norm_dim(d, r)).collect();
    let Some(dims) = dims else {
        return c.all(Place::Unknown);
    };
    moved(c, |d| dims.iter().position(|&x| x == d))
}

fn unsqueeze(c: &Ctx) -> Outcome {
    let r = c.out_rank(0);
    let Some(u) = c.int("dim").and_then(|d| norm_dim(d, r)) else {
        return c.all(Place::Unknown);
    };
    moved(c, |d| Some(if d >= u { d + 1 } else { d }))
}

fn squeeze(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let (Some(m), Some(out)) = (x.meta.clone(), out_shape(c, 0)) else {
        return c.all(Place::Unknown);
    };
    let removed: Vec<usize> = {
        // Dims of size 1 that disappear, matched greedily.
        let mut v = Vec::new();
        let mut o = 0;
        for (i, &s) in m.shape.iter().enumerate() {
            if o < out.len() && out[o] == s && (s != 1 || out.len() - o >= m.shape.len() - i) {
                o += 1;
            } else {
                v.push(i);
            }
        }
        v
    };
    moved(c, |d| {
        (!removed.contains(&d)).then(|| d - removed.iter().filter(|&&r| r < d).count())
    })
}

fn expand(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let off = c.out_rank(0).saturating_sub(x.rank());
    moved(c, |d| Some(d + off))
}

fn repeat(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let reps = c.ints("repeats").unwrap_or_default();
    let off = reps.len().saturating_sub(x.rank());
    match x.p {
        Place::Shard(d) if reps.get(d as usize + off).copied().unwrap_or(1) != 1 => {
            c.all(Place::Varying)
        }
        Place::Partial(_) => one(merge(&[x], c.out_rank(0), Lin::Add, false), 1),
        _ => moved(c, |d| Some(d + off)),
    }
}

/// Slices along `dim` of `x` from `start` of length `len`: what the slice holds on this mesh
/// dim given the other ranks' slices.
fn slice_like(c: &Ctx, x: &T, dim: usize, starts_name: &str, keeps_dim: bool) -> Outcome {
    let size = x
        .meta
        .as_ref()
        .and_then(|m| m.shape.get(dim).copied())
        .unwrap_or(0);
    let out_len = out_shape(c, 0)
        .and_then(|s| {
            if keeps_dim {
                s.get(dim).copied()
            } else {
                Some(1)
            }
        })
        .unwrap_or(0);
    let shift = |d: usize| {
        if keeps_dim || d < dim {
            Some(d)
        } else {
            Some(d - 1)
        }
    };
    match x.p {
        Place::Shard(d) if d as usize == dim => {
            if out_len == size && keeps_dim && !c.varies {
                c.all(x.p)
            } else {
                c.all(Place::Varying)
            }
        }
        Place::Shard(d) => {
            if c.varies {
                return c.all(Place::Varying);
            }
            c.all(shift(d as usize).map_or(Place::Varying, Place::shard))
        }
        Place::Replicate if c.varies => {
            // A rank-dependent slice of a replicated tensor: a shard when every rank along the
            // mesh dim takes the block at its own coordinate.
            let starts = (c.peer_ints)(starts_name);
            let (n, me) = (c.coord.1, c.coord.0);
            let own = keeps_dim
                && out_len > 0
                && out_len * n == size
                && starts.len() == n
                && starts.iter().enumerate().all(|(k, s)| {
                    s.map(|s| if s < 0 { s + size as i64 } else { s }) == Some((k * out_len) as i64)
                });
            let _ = me;
            c.all(if own {
                Place::shard(dim)
            } else {
                Place::Varying
            })
        }
        Place::Varying => c.all(Place::Varying),
        p @ (Place::Partial(_) | Place::Replicate) => c.all(p),
        p => c.all(p),
    }
}

fn slice(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(0), x.rank()) else {
        return c.all(Place::Unknown);
    };
    slice_like(c, &x, dim, "start", true)
}

fn select(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    slice_like(c, &x, dim, "index", false)
}

fn cat(c: &Ctx) -> Outcome {
    let ts = c.ts("tensors");
    let r = c.out_rank(0);
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(0), r) else {
        return c.all(Place::Unknown);
    };
    // Sizes along the cat dim differ: compare placements directly.
    let ts: Vec<T> = ts
        .into_iter()
        .filter(|t| {
            t.meta
                .as_ref()
                .is_none_or(|m| m.shape.iter().product::<usize>() > 0 || m.shape.len() == r)
        })
        .collect();
    if ts.iter().any(|t| t.p == Place::Shard(dim as u8)) {
        return c.all(if ts.len() == 1 {
            ts[0].p
        } else {
            Place::Varying
        });
    }
    let first = ts.first().map(|t| t.p);
    if ts.iter().all(|t| Some(t.p) == first) {
        return c.all(first.unwrap_or(Place::Replicate));
    }
    // Mixed: merge as a sum of disjoint blocks (a partial needs every block partial).
    let stripped: Vec<T> = ts
        .into_iter()
        .map(|mut t| {
            t.meta = None;
            t
        })
        .collect();
    one(merge(&stripped, r, Lin::Add, false), c.n_out())
}

fn stack(c: &Ctx) -> Outcome {
    let ts = c.ts("tensors");
    let r = c.out_rank(0);
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(0), r) else {
        return c.all(Place::Unknown);
    };
    let first = ts.first().map(|t| t.p);
    if !ts.iter().all(|t| Some(t.p) == first) {
        let stripped: Vec<T> = ts
            .into_iter()
            .map(|mut t| {
                t.meta = None;
                t
            })
            .collect();
        return one(merge(&stripped, r, Lin::Add, false), c.n_out());
    }
    match first {
        Some(Place::Shard(d)) => c.all(Place::shard(if d as usize >= dim {
            d as usize + 1
        } else {
            d as usize
        })),
        Some(p) => c.all(p),
        None => c.all(Place::Replicate),
    }
}

fn split(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(0), x.rank()) else {
        return c.all(Place::Unknown);
    };
    let unbind = c.args.schema().name.starts_with("unbind");
    match x.p {
        Place::Shard(d) if d as usize == dim => c.all(Place::Varying),
        Place::Shard(d) if unbind && d as usize > dim => c.all(Place::Shard(d - 1)),
        p => c.all(p),
    }
}

fn slice_scatter(c: &Ctx) -> Outcome {
    let (Some(x), Some(src)) = (c.t("self"), c.t("src")) else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(0), x.rank()) else {
        return c.all(Place::Unknown);
    };
    // A slice_scatter over the whole dim replaces the tensor by `src`.
    let size = x
        .meta
        .as_ref()
        .and_then(|m| m.shape.get(dim).copied())
        .unwrap_or(usize::MAX) as i64;
    let whole = c.args.schema().name.starts_with("slice_scatter")
        && c.int("start").unwrap_or(0) == 0
        && c.int("end").is_none_or(|e| e >= size)
        && c.int("step").unwrap_or(1) == 1;
    if whole && !c.varies {
        return c.all(src.p);
    }
    if c.varies || x.p == Place::Shard(dim as u8) {
        if x.p.is_partial() || src.p.is_partial() {
            return one(merge(&[x, src], 0, Lin::None, false), c.n_out());
        }
        return c.all(Place::Varying);
    }
    let src_p = match src.p {
        Place::Shard(d) if d as usize >= dim && c.args.schema().name.starts_with("select") => {
            Place::Shard(d + 1)
        }
        p => p,
    };
    let mut src = src;
    src.p = src_p;
    src.meta = None;
    let mut x = x;
    x.meta = None;
    one(merge(&[x, src], c.out_rank(0), Lin::Add, false), c.n_out())
}

fn pad(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let pads = c.ints("pad").unwrap_or_default();
    let r = x.rank();
    let padded: Vec<usize> = (0..pads.len() / 2)
        .filter(|i| pads[2 * i] != 0 || pads[2 * i + 1] != 0)
        .filter_map(|i| r.checked_sub(i + 1))
        .collect();
    let nonzero = c.num("value").is_some_and(|v| v != 0.0);
    match x.p {
        Place::Shard(d) if padded.contains(&(d as usize)) => c.all(Place::Varying),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::Add, nonzero), 1),
        p => c.all(p),
    }
}

fn flip(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let dims = c.ints("dims").unwrap_or_default();
    let all_dims = c.ints("dims").is_none() || dims.is_empty();
    match x.p {
        Place::Shard(d)
            if all_dims
                || dims
                    .iter()
                    .any(|&e| norm_dim(e, x.rank()) == Some(d as usize)) =>
        {
            c.all(Place::Varying)
        }
        p => c.all(p),
    }
}

fn triangle(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let r = x.rank();
    match x.p {
        Place::Shard(d) if d as usize + 2 >= r => c.all(Place::Varying),
        p => c.all(p),
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions, softmax, norms

fn reduced_dims(c: &Ctx, rank: usize) -> Option<Vec<usize>> {
    match c.arg("dim") {
        None | Some(Arg::None) => Some((0..rank).collect()),
        Some(a) => {
            let ds = a.as_int_list()?;
            if ds.is_empty() {
                return Some((0..rank).collect());
            }
            ds.iter().map(|&d| norm_dim(d, rank)).collect()
        }
    }
}

fn reduction(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let name = c.args.schema().name.clone();
    let base = name.split('.').next().unwrap_or("").to_string();
    let r = x.rank();
    let Some(dims) = reduced_dims(c, r) else {
        return c.all(Place::Unknown);
    };
    let keep = c.arg("keepdim").and_then(|a| a.as_bool()).unwrap_or(false)
        || (c.out_rank(0) == r && r > 0);
    let red = match base.as_str() {
        "sum" => Some(Red::Sum),
        "mean" => Some(Red::Avg),
        "amax" | "max" => Some(Red::Max),
        "amin" | "min" => Some(Red::Min),
        _ => None,
    };
    let n = c.n_out();
    match x.p {
        Place::Shard(d) if dims.contains(&(d as usize)) => match red {
            Some(red) => {
                let mut v = vec![Place::Partial(red)];
                if n > 1 {
                    // max.dim / min.dim indices: local positions.
                    v.push(Place::Varying);
                }
                Ok(v)
            }
            None => bad(
                Kind::Consistency,
                format!("`{base}` reduces over dim {d}, which is sharded: each rank reduces only its shard"),
                Hint::GatherShard,
                vec![Place::Replicate; n],
            ),
        },
        Place::Shard(d) => {
            let d = d as usize;
            let nd = if keep { d } else { d - dims.iter().filter(|&&e| e < d).count() };
            c.all(Place::shard(nd))
        }
        Place::Partial(pr) if pr.is_linear() && matches!(red, Some(Red::Sum | Red::Avg)) => c.all(Place::Partial(pr)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), n),
        p => c.all(p),
    }
}

fn scan(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    let linear = c.args.schema().name.starts_with("cumsum");
    match x.p {
        Place::Shard(d) if d as usize == dim => c.all(Place::Varying),
        Place::Partial(_) | Place::Unmasked => one(
            merge(&[x], 0, if linear { Lin::Add } else { Lin::None }, false),
            1,
        ),
        p => c.all(p),
    }
}

fn softmax(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    match x.p {
        Place::Shard(d) if d as usize == dim => bad(
            Kind::Consistency,
            format!("softmax over dim {dim}, which is sharded: each rank normalizes over its shard only"),
            Hint::GatherShard,
            vec![Place::Varying; c.n_out()],
        ),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), c.n_out()),
        p => c.all(p),
    }
}

fn softmax_backward(c: &Ctx) -> Outcome {
    let (Some(g), Some(y)) = (c.t("grad_output"), c.t("output")) else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, y.rank())) else {
        return c.all(Place::Unknown);
    };
    if y.p == Place::Shard(dim as u8) || g.p == Place::Shard(dim as u8) {
        return bad(
            Kind::Consistency,
            format!("softmax backward over dim {dim}, which is sharded"),
            Hint::GatherShard,
            vec![Place::Varying; c.n_out()],
        );
    }
    one(merge(&[g, y], c.out_rank(0), Lin::First, false), c.n_out())
}

/// Checks a norm's input against its normalized dims (the last `k`); the output placements
/// for (output, statistics...).
fn norm_core(c: &Ctx, x: &T, k: usize, params: &[T]) -> Outcome {
    let r = x.rank();
    let first = r.saturating_sub(k);
    let n = c.n_out();
    match x.p {
        Place::Shard(d) if d as usize >= first => bad(
            Kind::Consistency,
            format!(
                "normalizes over dim {d}, which is sharded: the statistics are those of the \
                 rank's shard, not of the whole dim"
            ),
            Hint::GatherShard,
            vec![x.p; n],
        ),
        Place::Partial(_) | Place::Unmasked => {
            one(merge(std::slice::from_ref(x), 0, Lin::None, false), n)
        }
        p => {
            for w in params {
                if w.p.is_partial() || matches!(w.p, Place::Shard(_)) {
                    return bad(
                        Kind::Consistency,
                        format!(
                            "the norm's weight or bias is {} where the normalized dims are whole",
                            w.p
                        ),
                        Hint::Text("replicate the norm's weight and bias".into()),
                        vec![p; n],
                    );
                }
            }
            let varying = params.iter().any(|w| w.p == Place::Varying);
            let out = if varying { Place::Varying } else { p };
            let mut v = vec![out];
            v.extend(std::iter::repeat_n(p, n - 1));
            Ok(v)
        }
    }
}

fn norm(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    let k = c.ints("normalized_shape").map_or(1, |s| s.len());
    let params = tensors(c, &["weight", "bias"]);
    norm_core(c, &x, k, &params)
}

fn apex_norm(c: &Ctx) -> Outcome {
    norm(c)
}

fn norm_backward(c: &Ctx) -> Outcome {
    let (Some(g), Some(x)) = (c.t("grad_out"), c.t("input")) else {
        return c.all(Place::Unknown);
    };
    let k = c.ints("normalized_shape").map_or(1, |s| s.len());
    let r = x.rank();
    let first = r.saturating_sub(k);
    let n = c.n_out();
    for t in [&g, &x] {
        if let Place::Shard(d) = t.p {
            if d as usize >= first {
                return bad(
                    Kind::Consistency,
                    format!("norm backward over dim {d}, which is sharded"),
                    Hint::GatherShard,
                    vec![t.p; n],
                );
            }
        }
    }
    if x.p.is_partial() {
        return one(merge(&[x], 0, Lin::None, false), n);
    }
    let gi = match merge(&[g.clone(), x.clone()], c.out_rank(0), Lin::First, false) {
        Ok(p) => p,
        Err(v) => return one(Err(v), n),
    };
    // The parameter gradients sum over the batch dims.
    let param = match gi {
        Place::Shard(d) if (d as usize) < first => Place::Partial(Red::Sum),
        p => p,
    };
    let mut v = vec![gi];
    v.extend(std::iter::repeat_n(param, n - 1));
    Ok(v)
}

fn sort(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = norm_dim(c.int("dim").unwrap_or(-1), x.rank()) else {
        return c.all(Place::Unknown);
    };
    match x.p {
        Place::Shard(d) if d as usize == dim => bad(
            Kind::Consistency,
            format!("sorts (or takes the top k) along dim {dim}, which is sharded"),
            Hint::GatherShard,
            vec![Place::Varying; c.n_out()],
        ),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), c.n_out()),
        p => c.all(p),
    }
}

// ---------------------------------------------------------------------------------------------
// Lookups, losses

fn embedding(c: &Ctx) -> Outcome {
    let (Some(w), Some(idx)) = (c.t("weight"), c.t("indices")) else {
        return c.all(Place::Unknown);
    };
    let out_r = c.out_rank(0);
    if idx.p.is_partial() {
        return one(merge(&[idx], 0, Lin::None, false), 1);
    }
    match w.p {
        Place::Shard(0) => c.all(Place::Unmasked),
        Place::Shard(_) => c.all(match idx.p {
            Place::Replicate => Place::shard(out_r.saturating_sub(1)),
            _ => Place::Varying,
        }),
        Place::Partial(r) if idx.p == Place::Replicate => c.all(Place::Partial(r)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[w], 0, Lin::None, false), 1),
        Place::Varying => c.all(Place::Varying),
        _ => c.all(idx.p),
    }
}

fn embedding_backward(c: &Ctx) -> Outcome {
    let (Some(g), Some(idx)) = (c.t("grad_output"), c.t("indices")) else {
        return c.all(Place::Unknown);
    };
    if idx.p.is_partial() {
        return one(merge(&[idx], 0, Lin::None, false), 1);
    }
    let gr = g.rank();
    match (g.p, idx.p) {
        (Place::Partial(r), Place::Replicate) => c.all(Place::Partial(r)),
        (Place::Partial(_), _) | (Place::Unmasked, _) => one(merge(&[g], 0, Lin::Mul, false), 1),
        (Place::Shard(d), _) if d as usize + 1 == gr && idx.p == Place::Replicate => {
            c.all(Place::Shard(1))
        }
        (Place::Shard(d), Place::Shard(e)) if d == e && (d as usize) + 1 < gr => {
            c.all(Place::Partial(Red::Sum))
        }
        (Place::Replicate, Place::Replicate) => c.all(Place::Replicate),
        _ => c.all(Place::Varying),
    }
}

fn gather(c: &Ctx) -> Outcome {
    let (Some(x), Some(idx)) = (c.t("self"), c.t("index")) else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    if idx.p.is_partial() {
        return one(merge(&[idx], 0, Lin::None, false), 1);
    }
    match x.p {
        Place::Shard(d) if d as usize == dim => c.all(Place::Unmasked),
        Place::Partial(r) if r.is_linear() && idx.p == Place::Replicate => c.all(Place::Partial(r)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), 1),
        _ => {
            let mut i2 = idx.clone();
            i2.meta = None;
            let mut x2 = x.clone();
            x2.meta = None;
            one(merge(&[x2, i2], 0, Lin::None, false), 1)
        }
    }
}

fn index_select(c: &Ctx) -> Outcome {
    let (Some(x), Some(idx)) = (c.t("self"), c.t("index")) else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    if idx.p.is_partial() {
        return one(merge(&[idx], 0, Lin::None, false), 1);
    }
    match x.p {
        Place::Shard(d) if d as usize == dim => c.all(Place::Unmasked),
        Place::Shard(d) if idx.p == Place::Replicate => c.all(Place::Shard(d)),
        Place::Partial(r) if r.is_linear() && idx.p == Place::Replicate => c.all(Place::Partial(r)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), 1),
        Place::Replicate => c.all(match idx.p {
            Place::Shard(_) | Place::Varying => Place::Varying,
            p => p,
        }),
        _ => c.all(Place::Varying),
    }
}

fn index(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(Arg::List(items)) = c.arg("indices") else {
        return c.all(Place::Unknown);
    };
    let idx: Vec<Option<T>> = items
        .iter()
        .map(|a| {
            a.as_value().map(|v| T {
                v,
                p: (c.place)(v),
                meta: (c.meta)(v),
            })
        })
        .collect();
    if idx.iter().flatten().any(|t| t.p.is_partial()) {
        return one(
            merge(
                &idx.into_iter().flatten().collect::<Vec<_>>(),
                0,
                Lin::None,
                false,
            ),
            1,
        );
    }
    let indexed: Vec<usize> = idx
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_some())
        .map(|(i, _)| i)
        .collect();
    let idx_p: Vec<Place> = idx.iter().flatten().map(|t| t.p).collect();
    let idx_plain = idx_p.iter().all(|p| *p == Place::Replicate);
    match x.p {
        Place::Shard(d) if indexed.contains(&(d as usize)) => c.all(Place::Unmasked),
        Place::Shard(d)
            if idx_plain && indexed.iter().all(|&i| i > d as usize) && indexed.len() == 1 =>
        {
            c.all(Place::Shard(d))
        }
        Place::Partial(r) if r.is_linear() && idx_plain => c.all(Place::Partial(r)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[x], 0, Lin::None, false), 1),
        Place::Replicate if idx_plain => c.all(Place::Replicate),
        _ => c.all(Place::Varying),
    }
}

fn index_put(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let vals = c.t("values");
    let mut idx = Vec::new();
    if let Some(a) = c.arg("indices") {
        a.values(&mut idx);
    }
    let idx: Vec<Place> = idx.into_iter().map(|v| (c.place)(v)).collect();
    let zero_fill = vals
        .as_ref()
        .is_some_and(|v| v.meta.as_ref().is_some_and(|m| m.shape.is_empty()));
    if x.p == Place::Unmasked {
        // Megatron's `predicted[mask] = 0.0`: the values are a 0-d (lifted) constant.
        if idx.iter().all(|p| *p == Place::Varying) && !idx.is_empty() && zero_fill {
            return c.all(Place::Partial(Red::Sum));
        }
        return bad(
            Kind::Spmd,
            "writes into a vocabulary-shard lookup without zeroing the rows outside the rank's range",
            Hint::Text("zero the out-of-range rows (index_put of 0 at the mask)".into()),
            vec![Place::Varying; c.n_out()],
        );
    }
    if idx.iter().any(|p| p.is_partial()) {
        return bad(
            Kind::Spmd,
            "indexes with a partial tensor",
            Hint::ReducePartial,
            vec![Place::Varying; c.n_out()],
        );
    }
    let mut ts = vec![T {
        meta: None,
        ..x.clone()
    }];
    ts.extend(vals.map(|mut v| {
        v.meta = None;
        v
    }));
    let r = merge(&ts, 0, Lin::Add, false);
    match r {
        Ok(p) if idx.iter().any(|q| *q != Place::Replicate) => {
            c.all(if p.is_partial() { p } else { Place::Varying })
        }
        r => one(r, c.n_out()),
    }
}

fn scatter(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Unknown);
    };
    let Some(dim) = c.int("dim").and_then(|d| norm_dim(d, x.rank())) else {
        return c.all(Place::Unknown);
    };
    let idx = c.t("index");
    let src = c
        .t("src")
        .or_else(|| c.t("source"))
        .or_else(|| c.t("value"));
    let mut ts = vec![x.clone()];
    ts.extend(src.clone());
    if idx.as_ref().is_some_and(|t| t.p.is_partial()) {
        return bad(
            Kind::Spmd,
            "scatters at partial indices",
            Hint::ReducePartial,
            vec![Place::Varying; c.n_out()],
        );
    }
    if x.p == Place::Shard(dim as u8) {
        return c.all(Place::Varying);
    }
    let stripped: Vec<T> = ts
        .into_iter()
        .map(|mut t| {
            t.meta = None;
            t
        })
        .collect();
    let mut all = stripped.clone();
    if let Some(mut i) = idx {
        i.meta = None;
        all.push(i);
    }
    let nonzero = c.num("value").is_some_and(|v| v != 0.0);
    if stripped.iter().any(|t| t.p.is_partial()) {
        return one(merge(&stripped, 0, Lin::Add, nonzero), c.n_out());
    }
    one(merge(&all, 0, Lin::None, false), c.n_out())
}

fn nll_loss(c: &Ctx) -> Outcome {
    let (Some(x), Some(tg)) = (c.t("self"), c.t("target")) else {
        return c.all(Place::Unknown);
    };
    let reduction = c.int("reduction").unwrap_or(1);
    let class_dim = if x.rank() >= 2 { 1 } else { 0 };
    if x.p == Place::Shard(class_dim as u8) {
        return bad(
            Kind::Consistency,
            "the loss picks each target's log-probability along the class dim, which is sharded",
            Hint::Text("use the vocab-parallel cross-entropy (gather the target logit on its rank, mask, all-reduce)".into()),
            vec![Place::Replicate; c.n_out()],
        );
    }
    if tg.p.is_partial() {
        return one(merge(&[tg], 0, Lin::None, false), c.n_out());
    }
    let batchish = |p: Place| matches!(p, Place::Shard(0));
    let base = match (x.p, tg.p) {
        (Place::Partial(r), Place::Replicate) if r.is_linear() => Place::Partial(r),
        (Place::Partial(_), _) | (Place::Unmasked, _) => {
            return one(merge(&[x], 0, Lin::None, false), c.n_out())
        }
        (p, q) if batchish(p) || batchish(q) => {
            if (p != q) && !(p == Place::Replicate || q == Place::Replicate) {
                Place::Varying
            } else {
                Place::Shard(0)
            }
        }
        (Place::Varying, _) | (_, Place::Varying) => Place::Varying,
        _ => Place::Replicate,
    };
    let out = match (base, reduction) {
        (Place::Shard(0), 0) => Place::Shard(0),
        (Place::Shard(0), 1) => Place::Partial(Red::Avg),
        (Place::Shard(0), _) => Place::Partial(Red::Sum),
        (p, _) => p,
    };
    let total = match base {
        Place::Shard(0) => Place::Partial(Red::Sum),
        Place::Partial(_) => Place::Replicate,
        p => p,
    };
    let mut v = vec![out];
    if c.n_out() > 1 {
        v.push(total);
    }
    Ok(v)
}

fn nll_loss_backward(c: &Ctx) -> Outcome {
    let (Some(g), Some(x), Some(tg)) = (c.t("grad_output"), c.t("self"), c.t("target")) else {
        return c.all(Place::Unknown);
    };
    let class_dim = if x.rank() >= 2 { 1 } else { 0 };
    if x.p == Place::Shard(class_dim as u8) {
        return bad(
            Kind::Consistency,
            "nll_loss backward over a sharded class dim",
            Hint::GatherShard,
            vec![Place::Varying],
        );
    }
    let mut tg2 = tg.clone();
    tg2.meta = None;
    let mut x2 = x.clone();
    x2.meta = None;
    let shape = match merge(&[x2, tg2], 0, Lin::None, false) {
        Ok(p) => p,
        Err(v) => return one(Err(v), 1),
    };
    match g.p {
        Place::Partial(r) if r.is_linear() && shape == Place::Replicate => c.all(Place::Partial(r)),
        Place::Partial(_) | Place::Unmasked => one(merge(&[g], 0, Lin::None, false), 1),
        Place::Replicate => c.all(shape),
        Place::Varying => c.all(Place::Varying),
        _ => c.all(Place::Varying),
    }
}

fn mse_loss(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["self", "target"]);
    let p = match merge(&ts, ts.first().map_or(0, T::rank), Lin::None, false) {
        Ok(p) => p,
        Err(v) => return one(Err(v), 1),
    };
    let reduction = c.int("reduction").unwrap_or(1);
    c.all(match (p, reduction) {
        (Place::Shard(_), 1) => Place::Partial(Red::Avg),
        (Place::Shard(_), 2) => Place::Partial(Red::Sum),
        (p, _) => p,
    })
}

fn mse_loss_backward(c: &Ctx) -> Outcome {
    let ts = tensors(c, &["grad_output", "self", "target"]);
    one(merge(&ts, c.out_rank(0), Lin::First, false), 1)
}

fn creation(c: &Ctx) -> Outcome {
    c.all(Place::Replicate)
}

fn like(c: &Ctx) -> Outcome {
    let Some(x) = c.t("self") else {
        return c.all(Place::Replicate);
    };
    if c.t("fill_value")
        .or_else(|| c.t("value"))
        .is_some_and(|v| v.p != Place::Replicate)
    {
        return c.all(Place::Varying);
    }
    let new = c.args.schema().name.starts_with("new_");
    c.all(match x.p {
        _ if new => Place::Replicate,
        Place::Shard(d) => Place::Shard(d),
        Place::Varying => Place::Varying,
        _ => Place::Replicate,
    })
}

fn copy(c: &Ctx) -> Outcome {
    let (Some(x), Some(src)) = (c.t("self"), c.t("src")) else {
        return c.all(Place::Unknown);
    };
    let _ = x;
    let off = c.out_rank(0).saturating_sub(src.rank());
    c.all(match src.p {
        Place::Shard(d) => Place::Shard(d + off as u8),
        p => p,
    })
}

fn assert_meta(_c: &Ctx) -> Outcome {
    Ok(Vec::new())
}

// ---------------------------------------------------------------------------------------------
// Collectives

fn legality(message: String, hint: &str, recover: Place, n: usize) -> Outcome {
    bad(
        Kind::Legality,
        message,
        Hint::Text(hint.into()),
        vec![recover; n],
    )
}

fn all_reduce(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    if !c.in_group {
        return c.all(x.p);
    }
    let op = c
        .str("reduce_op")
        .and_then(|s| Red::parse(&s))
        .unwrap_or(Red::Sum);
    match x.p {
        Place::Partial(r) if r == op || (r.is_linear() && op.is_linear()) => c.all(Place::Replicate),
        Place::Partial(r) => legality(
            format!("all-reduces with `{}` a tensor that is Partial({})", op.name(), r.name()),
            &format!("reduce with `{}`", r.name()),
            Place::Replicate,
            c.n_out(),
        ),
        Place::Varying => c.all(Place::Replicate),
        Place::Replicate if matches!(op, Red::Max | Red::Min | Red::Avg) => c.all(Place::Replicate),
        Place::Replicate => {
            let mut v = legality(
                format!(
                    "all-reduces (`{}`) a tensor that is already Replicate() over this mesh dim: no \
                     sum is pending, so each element becomes {} times its value",
                    op.name(),
                    c.group_len
                ),
                "drop the all-reduce over this mesh dim, or all-reduce over the group where the tensor is partial",
                Place::Replicate,
                c.n_out(),
            );
            if let Err(e) = &mut v {
                e.exempt = Exempt::ReduceReplicate;
            }
            v
        }
        Place::Shard(d) => legality(
            format!("all-reduces a tensor sharded on dim {d}: it adds different slices together"),
            "all-gather a shard; all-reduce only partial sums",
            Place::Replicate,
            c.n_out(),
        ),
        Place::Unmasked => bad(
            Kind::Spmd,
            "all-reduces rows looked up in a vocabulary shard that were never masked: every rank adds the rows of tokens outside its range",
            Hint::Text("zero the rows of tokens outside the rank's vocabulary range (masked_fill with 0) before the all-reduce".into()),
            vec![Place::Replicate; c.n_out()],
        ),
        Place::Unknown => c.all(Place::Unknown),
    }
}

fn all_gather(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    if !c.in_group {
        return c.all(x.p);
    }
    match x.p {
        Place::Shard(_) | Place::Varying => c.all(Place::Replicate),
        Place::Replicate => legality(
            "all-gathers a tensor that is Replicate() over this mesh dim: the result holds one copy per rank".into(),
            "drop the all-gather, or gather a shard",
            Place::Replicate,
            c.n_out(),
        ),
        Place::Partial(_) | Place::Unmasked => bad(
            Kind::Legality,
            "all-gathers a partial sum: the result stacks unreduced pieces",
            Hint::ReducePartial,
            vec![Place::Replicate; c.n_out()],
        ),
        Place::Unknown => c.all(Place::Unknown),
    }
}

fn reduce_scatter(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    if !c.in_group {
        return c.all(match x.p {
            Place::Shard(0) => Place::Varying,
            p => p,
        });
    }
    let op = c
        .str("reduce_op")
        .and_then(|s| Red::parse(&s))
        .unwrap_or(Red::Sum);
    match x.p {
        Place::Partial(r) if r == op || (r.is_linear() && op.is_linear()) => c.all(Place::Shard(0)),
        Place::Varying => c.all(Place::Shard(0)),
        Place::Partial(r) => legality(
            format!("reduce-scatters with `{}` a tensor that is Partial({})", op.name(), r.name()),
            &format!("reduce with `{}`", r.name()),
            Place::Shard(0),
            c.n_out(),
        ),
        Place::Replicate if !op.is_linear() || op == Red::Avg => c.all(Place::Shard(0)),
        Place::Replicate => legality(
            "reduce-scatters (sum) a tensor that is already Replicate() over this mesh dim: each element becomes group-size times its value".into(),
            "slice the rank's chunk instead, or reduce-scatter a partial sum",
            Place::Shard(0),
            c.n_out(),
        ),
        Place::Shard(d) => legality(
            format!("reduce-scatters a tensor sharded on dim {d}: it adds different slices together"),
            "reduce-scatter a partial sum",
            Place::Varying,
            c.n_out(),
        ),
        Place::Unmasked => bad(Kind::Spmd, "reduce-scatters an unmasked vocabulary-shard lookup", Hint::Text("mask it first".into()), vec![Place::Shard(0); c.n_out()]),
        Place::Unknown => c.all(Place::Unknown),
    }
}

fn all_to_all(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    if !c.in_group {
        return c.all(match x.p {
            Place::Shard(0) => Place::Varying,
            p => p,
        });
    }
    match x.p {
        Place::Partial(_) | Place::Unmasked => bad(
            Kind::Legality,
            "all-to-all of a partial sum: the pieces move to other ranks unreduced",
            Hint::ReducePartial,
            vec![Place::Varying; c.n_out()],
        ),
        _ => c.all(Place::Varying),
    }
}

fn broadcast(c: &Ctx) -> Outcome {
    let Some(x) = c.t("input") else {
        return c.all(Place::Unknown);
    };
    if !c.in_group {
        return c.all(x.p);
    }
    match x.p {
        Place::Partial(_) | Place::Unmasked => bad(
            Kind::Legality,
            "broadcasts a partial sum: one rank's piece replaces the sum",
            Hint::ReducePartial,
            vec![Place::Replicate; c.n_out()],
        ),
        _ => c.all(Place::Replicate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_moves_or_interleaves_a_shard() {
        // [b, s, h] -> [b*s, h]: the outer dim's shard stays contiguous.
        assert_eq!(view_dim(&[2, 4, 8], &[8, 8], 0), Some(0));
        // the inner dim's shard interleaves.
        assert_eq!(view_dim(&[2, 4, 8], &[8, 8], 1), None);
        // [b, s, h] -> [b, s, heads, hd]: the hidden shard lands on the heads.
        assert_eq!(view_dim(&[2, 4, 8], &[2, 4, 2, 4], 2), Some(2));
        assert_eq!(view_dim(&[2, 4, 2, 4], &[2, 4, 8], 2), Some(2));
        assert_eq!(view_dim(&[2, 4, 2, 4], &[2, 4, 8], 3), None);
        // size-1 dims in between.
        assert_eq!(view_dim(&[4, 1, 8], &[4, 8], 0), Some(0));
        assert_eq!(view_dim(&[4, 8], &[4, 1, 8], 1), Some(1));
        // a kv projection of one local head: [tokens, hd] -> [b, s, 1, hd] shards the heads.
        assert_eq!(view_dim(&[16, 4], &[2, 8, 1, 4], 1), Some(2));
    }

    #[test]
    fn matmul_labels_follow_torch() {
        let (la, lb, lo) = matmul_labels(3, 3);
        assert_eq!(la, vec![Label::Batch(0), Label::Row, Label::Contract]);
        assert_eq!(lb, vec![Label::Batch(0), Label::Contract, Label::Col]);
        assert_eq!(lo, vec![Label::Batch(0), Label::Row, Label::Col]);
        let (la, lb, lo) = matmul_labels(3, 2);
        assert_eq!(la, vec![Label::Batch(0), Label::Row, Label::Contract]);
        assert_eq!(lb, vec![Label::Contract, Label::Col]);
        assert_eq!(lo.len(), 3);
    }

    #[test]
    fn every_rule_names_a_registered_operator() {
        let reg = shardproof_ops::Registry::builtin();
        let known: std::collections::BTreeSet<String> = reg.iter().map(|d| d.name.base()).collect();
        for (name, _) in rules() {
            assert!(
                known.contains(name),
                "{name} has a rule but is not registered"
            );
        }
    }
}
