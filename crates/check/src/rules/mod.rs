//! The rule table: one placement rule per operator, DTensor-style.
//!
//! A rule sees one mesh dim at a time: the placements of its tensor arguments along that dim
//! (never `Unknown`: the engine stops before), their local shapes, and the bound literal
//! arguments, and returns the placement of every output, or a [`Violation`] with the
//! placements it continues with. [`rule`] finds an operator's rule by `namespace.name`; an
//! operator without one makes its outputs `Unknown`.

use crate::place::{Place, Red, RowKey};
use shardproof_ir::{Arg, ValueId};
use shardproof_ops::{Args, Meta};
use std::collections::HashMap;
use std::sync::OnceLock;

mod collectives;
mod elementwise;
mod indexing;
mod matmul;
mod reductions;
mod slicing;
mod stages;
mod table;
mod views;

use collectives::*;
use elementwise::*;
pub use elementwise::{mixed_mesh_shards, pairs_elements};
use indexing::*;
use matmul::*;
use reductions::*;
use slicing::*;
pub use stages::StageShares;
pub(crate) use stages::{stage_alike_through_shares, stage_shares};
use table::build;
use views::*;
pub use views::{
    reshaped_apart, reshaped_apart_by_global, view_blocks, view_blocks_unique, view_dim,
};

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
    /// Sizes through a collective (group size, divisibility), and global shapes an element-wise
    /// pairing of a replicated operand with a shard does not broadcast.
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
    /// Whether the first input is rows of a selection on this mesh dim (`Place::Rows`), read
    /// as a shard of the selected rows: the spec's dim holds more rows than the n pieces.
    pub rows_input: bool,
    /// The mesh dims (bit per mesh dim) that hold the first input as rows of a selection
    /// (`Place::Rows`; `input_places` shows them as shards).
    pub rows_dims: u64,
    /// The pipeline mesh dims (bit per mesh dim; named `pp`), whose coordinates are stages.
    pub pipeline_dims: u64,
    /// Set by the view rule where its reading came from the factors of every mesh dim's
    /// pieces ([`views::view_by_factors`]), rows included: the engine's rows-cross check
    /// then has nothing left to guard.
    pub by_factors: &'a std::cell::Cell<bool>,
    /// Local output metas.
    pub outs: &'a [Option<Meta>],
    /// Whether the call's literal arguments differ across the ranks of this mesh dim.
    pub varies: bool,
    /// For collectives: whether the group spans this mesh dim.
    pub in_group: bool,
    /// For collectives: the number of ranks in the caller's group.
    pub group_len: usize,
    /// The first tensor argument's placement on every mesh dim (by mesh dim): what a
    /// collective or a view does to one mesh dim's layout depends on the others'.
    pub input_places: &'a [Place],
    /// Any value's placement on every mesh dim (by mesh dim), shown as `input_places` shows
    /// the first input's: a product pairs its operands' batch dims (and its bias) across mesh
    /// dims, which one mesh dim's placements do not show. This mesh dim's entry is the
    /// engine's; a rule reads its own view of it through `place` ([`Ctx::t`]).
    pub places_on_mesh: &'a dyn Fn(ValueId) -> Vec<Place>,
    /// For collectives: the mesh dims the caller's group spans.
    pub group_dims: &'a [usize],
    /// For collectives: whether the first tensor argument's dim 0 was made by a view that
    /// regrouped dims (a flattening of several dims, or a split of one).
    pub regrouped: bool,
    /// This rank's coordinate along the mesh dim and the dim's size: read the coordinate
    /// through [`MeshCoord::me`], which records the read (ranks whose runs read no
    /// coordinate of a mesh dim share their placements across it: `propagate`).
    pub coord: MeshCoord<'a>,
    /// The index of this mesh dim (in `input_places` and `mesh_sizes`).
    pub mesh_dim: usize,
    /// Every mesh dim's size, by mesh dim.
    pub mesh_sizes: &'a [usize],
    /// For slices: the literal arguments of the same node on the other ranks along the mesh
    /// dim, by coordinate (`None` where a rank has no such node).
    pub peer_ints: &'a dyn Fn(&str) -> Vec<Option<i64>>,
    /// For pads: an integer-list argument of the same node on the other ranks along the mesh
    /// dim, by coordinate (`None` where a rank has no such node; never on a pipeline dim).
    pub peer_int_lists: &'a dyn Fn(&str) -> Vec<Option<Vec<i64>>>,
    pub(crate) place: &'a dyn Fn(ValueId) -> Place,
    pub(crate) meta: &'a dyn Fn(ValueId) -> Option<Meta>,
    /// Whether a value is known to be all zeros (made by `zeros`, `full(.., 0)` and the like,
    /// or a view or copy of such): a replicated zero tensor is also a `Partial(sum)` one.
    pub(crate) zero: &'a dyn Fn(ValueId) -> bool,
    /// The dims along which a value is known constant (bit `i` for dim `i`; `u64::MAX` for a
    /// fill of one literal value): a piece of the same construction of any size along them, so
    /// it pairs with a shard there.
    pub(crate) constant: &'a dyn Fn(ValueId) -> u64,
    /// What is known of a value's equal runs ([`Runs`]): a `[R, c]` merge with the `c` dim
    /// constant is the blocked piece of the same construction, so it pairs with a shard of k
    /// blocks there, R dividing k.
    pub(crate) runs: &'a dyn Fn(ValueId) -> Runs,
    /// Whether a replicated value is scaled by 1/n over this mesh dim (`div(x, n)`, as DTensor
    /// turns a replicated operand into a `Partial(sum)` share): its n copies sum to one.
    pub(crate) scaled: &'a dyn Fn(ValueId) -> bool,
    /// The global shapes of the first input and the output where the case's single-device
    /// spec has a node of the same name and operator: they settle a view whose local shapes
    /// leave the sharded output dim open.
    pub global_view: Option<(&'a [i64], &'a [i64])>,
    /// Whether this mesh dim is the pipeline's (`pp`): its coordinates run different stages,
    /// so a `Varying` value there is a stage's own tensor, never split along the dim.
    pub pipeline_dim: bool,
    /// Numbers a row selection ([`Place::Rows`]), `None` when the numbers ran out.
    pub(crate) rows: &'a dyn Fn(RowKey) -> Option<u16>,
    /// The key of a row selection numbered by `rows` (a concatenation joins spread rows).
    pub(crate) row_key: &'a dyn Fn(u16) -> Option<RowKey>,
    /// A value's name (its node's name and output, as every rank's graph names it).
    pub(crate) value_name: &'a dyn Fn(ValueId) -> String,
}

impl Ctx<'_> {
    /// Whether a `Varying` placement here may be a shard in an unknown layout (any mesh dim
    /// but the pipeline's): a rule that needs a dim whole cannot claim it is.
    pub fn varying_may_shard(&self, p: Place) -> bool {
        p == Place::Varying && !self.pipeline_dim
    }
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
    /// The dims along which it is known constant (bit `i` for dim `i`; `u64::MAX`: a fill of
    /// one literal value, the same on every rank).
    pub constant: u64,
    /// For a replicated tensor: what is known of its equal runs ([`Runs`]); `Runs::Unknown`
    /// for the others.
    pub runs: Runs,
}

/// What is known of a replicated tensor's equal runs along a dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    /// Along `dim` it is `count` runs of equal length, each constant along the dim (a view
    /// merging `[count, c]` with the `c` dim constant; one run: constant along the dim).
    Along {
        /// The tensor dim.
        dim: usize,
        /// How many runs.
        count: usize,
    },
    /// A graph input (through copies and dim moves): the same tensor at every size, no
    /// construction the single-device program repeats at another size.
    Input,
    /// Nothing known.
    Unknown,
}
impl T {
    /// Whether the tensor is known constant along its dim `d`.
    pub fn constant_along(&self, d: usize) -> bool {
        d < 64 && self.constant & (1 << d) != 0
    }

    /// The tensor's rank (number of dims), 0 when unknown.
    pub fn rank(&self) -> usize {
        self.meta.as_ref().map_or(0, |m| m.shape.len())
    }
}

/// A rank's coordinate along one mesh dim, and the dim's size. The coordinate is read only
/// through [`MeshCoord::me`], which sets bit `dim` of `read`: the engine shares a rank's
/// placements with another rank only across mesh dims whose coordinate no rule read.
#[derive(Clone, Copy)]
pub struct MeshCoord<'a> {
    me: usize,
    /// The mesh dim's size.
    pub n: usize,
    dim: usize,
    read: &'a std::cell::Cell<u64>,
}

impl<'a> MeshCoord<'a> {
    /// The coordinate `me` of a mesh dim `dim` of size `n`, its reads recorded in `read`.
    pub fn new(me: usize, n: usize, dim: usize, read: &'a std::cell::Cell<u64>) -> Self {
        MeshCoord { me, n, dim, read }
    }

    /// This rank's coordinate (recorded as read).
    pub fn me(&self) -> usize {
        if self.dim < 64 {
            self.read.set(self.read.get() | 1 << self.dim);
        }
        self.me
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
            Arg::Value(v) => Some(self.value(v)),
            _ => None,
        }
    }

    /// The tensor argument of value `v`.
    pub fn value(&self, v: ValueId) -> T {
        let p = (self.place)(v);
        T {
            v,
            p,
            meta: (self.meta)(v),
            constant: (self.constant)(v),
            // Only a replicated operand's runs are read (beside a blocked shard): the walk
            // is skipped for the rest.
            runs: if p == Place::Replicate {
                (self.runs)(v)
            } else {
                Runs::Unknown
            },
        }
    }

    /// `t`'s placement on every mesh dim (by mesh dim), this mesh dim's as the rule sees it.
    pub fn on_every_mesh_dim(&self, t: &T) -> Vec<Place> {
        let mut places = (self.places_on_mesh)(t.v);
        if let Some(p) = places.get_mut(self.mesh_dim) {
            *p = t.p;
        }
        places
    }

    /// Whether tensor `t` is known to hold only zeros.
    pub fn is_zero(&self, t: &T) -> bool {
        (self.zero)(t.v)
    }

    /// The tensors of a list argument `name`.
    pub fn ts(&self, name: &str) -> Vec<T> {
        let mut vs = Vec::new();
        if let Some(a) = self.arg(name) {
            a.values(&mut vs);
        }
        vs.into_iter().map(|v| self.value(v)).collect()
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

/// Whether the rules of `family` read blocked shards ([`Place::Blocked`]); the engine shows
/// a blocked input to any other rule as `Varying` (no known layout: sound, never a guess).
pub fn takes_blocked(family: &str) -> bool {
    matches!(
        family,
        "linear-unary"
            | "nonlinear-unary"
            | "elementwise-add"
            | "elementwise-mul"
            | "elementwise-div"
            | "nonlinear-binary"
            | "activation-backward"
            | "matmul"
            | "matmul-bias"
            | "linear"
            | "reduction"
            | "softmax"
            | "softmax-backward"
            | "norm"
            | "norm-backward"
            | "sort"
            | "nll-loss"
            | "nll-loss-backward"
            | "view"
            | "slice"
            | "select"
            | "cat"
            | "transpose"
            | "permute"
            | "unsqueeze"
            | "squeeze"
            | "expand"
            | "scatter"
            | "gather"
            | "all-gather"
            | "all-reduce"
            | "reduce-scatter"
    )
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

/// Whether operators of `family` move or copy their input's values without combining them
/// (copies, views, transposes, permutes, size-1 dims added or dropped, broadcasts): a record
/// about the values (n times the tensor, divided by n, zero, constant) carries through.
pub fn moves_values(family: &str) -> bool {
    matches!(
        family,
        "linear-unary" | "view" | "transpose" | "permute" | "unsqueeze" | "squeeze" | "expand"
    )
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
        // [4, 8] -> [4, 1, 8] with dim 1 sharded: an unsqueeze of [4, 8n] (Shard(2)) or a split
        // of it into [4, n, 8] (Shard(1)): open, no claim.
        assert_eq!(view_dim(&[4, 8], &[4, 1, 8], 1), None);
        // A size-1 output dim leading the group leaves the reading open: a kv projection of
        // one local head, [tokens, hd] -> [b, s, 1, hd], shards the heads of [b, s, n, hd]
        // or the head dim of [b, s, 1, n*hd]; [2, 8, 4] -> [1, 2, 8, 4] shards dim 0 of
        // [n, 2, 8, 4] or dim 1 of [1, 2n, 8, 4]. No claim (was a guess: the first).
        assert_eq!(view_dim(&[16, 4], &[2, 8, 1, 4], 1), None);
        assert_eq!(view_dim(&[2, 8, 4], &[1, 2, 8, 4], 0), None);
    }

    #[test]
    fn the_spec_settles_a_view_the_local_shapes_leave_open() {
        // A kv projection of one local head: [8, 4] -> [1, 8, 1, 4] shards the heads of the
        // spec's [1, 8, 2, 4], not the head dim.
        assert_eq!(view_dim(&[8, 4], &[1, 8, 1, 4], 1), None);
        assert_eq!(
            view_dim_by_global(&[8, 4], &[1, 8, 1, 4], 1, &[1, 8, 2, 4], 2),
            Some(2)
        );
        // ... and the head dim of a spec [1, 8, 1, 8].
        assert_eq!(
            view_dim_by_global(&[8, 4], &[1, 8, 1, 4], 1, &[1, 8, 1, 8], 2),
            Some(3)
        );
        // A kv head of local size 1 merged with its 2 query-group copies: dim 1 of the spec's
        // [2, 4, 8, 4] (2 kv heads x 2).
        assert_eq!(view_dim(&[2, 1, 2, 8, 4], &[2, 2, 8, 4], 1), None);
        assert_eq!(
            view_dim_by_global(&[2, 1, 2, 8, 4], &[2, 2, 8, 4], 1, &[2, 4, 8, 4], 2),
            Some(1)
        );
        // Another mesh dim shards the output too (the batch over dp): the sizes could match by
        // coincidence, no claim.
        assert_eq!(
            view_dim_by_global(&[8, 4], &[1, 8, 1, 4], 1, &[2, 8, 2, 4], 2),
            None
        );
    }

    #[test]
    fn views_place_blocked_shards() {
        // Megatron's [s, b, np, hn] -> [s, b*np, hn] with the heads sharded: b blocks of dim 1.
        assert_eq!(view_blocks(&[4, 2, 3, 8], &[4, 6, 8], 2, 1), Some((1, 2)));
        // ... and back: the blocks split off, the heads sharded again.
        assert_eq!(view_blocks(&[4, 6, 8], &[4, 2, 3, 8], 1, 2), Some((2, 1)));
        // ZeRO: [dp=2 * 16, 8] with the tp rows in 2 blocks -> [2, 16, 8]: Shard(1).
        assert_eq!(view_blocks(&[32, 8], &[2, 16, 8], 0, 2), Some((1, 1)));
        // A shard merged with dims inside it stays one block.
        assert_eq!(view_blocks(&[2, 4, 8], &[2, 32], 1, 1), Some((1, 1)));
        // Blocks that cut the rows of a piece apart: no placement.
        assert_eq!(view_blocks(&[6, 4], &[4, 6], 0, 3), None);
        // Sizes that do not match: no placement.
        assert_eq!(view_blocks(&[2, 4], &[3, 3], 0, 1), None);
        // A local batch of one flattened with the sequence: one reading, Shard(0) of [8n, 16].
        assert_eq!(
            view_blocks_unique(&[1, 8, 16], &[8, 16], 0, 1),
            Some((0, 1))
        );
        assert_eq!(view_blocks_unique(&[1, 8], &[8], 0, 1), Some((0, 1)));
        // Size-1 dims around a size-1 shard: Shard(0) of [n, 1] or Shard(1) of [1, n].
        assert_eq!(view_blocks_unique(&[1, 1, 1], &[1, 1], 0, 1), None);
        assert_eq!(view_blocks_unique(&[1, 1, 1], &[1, 1], 1, 1), None);
        // [1, 8] -> [1, 2, 4]: Shard(0) of [n, 2, 4] or Shard(1) of [1, 2n, 4].
        assert_eq!(view_blocks_unique(&[1, 8], &[1, 2, 4], 0, 1), None);
        // Fewest blocks wins in view_blocks; view_blocks_unique refuses two readings.
        assert_eq!(view_blocks(&[1, 8, 2, 4], &[8, 8], 2, 1), Some((1, 1)));
        assert_eq!(view_blocks_unique(&[1, 8, 2, 4], &[8, 8], 2, 1), None);
        // Dims reshaped apart or together.
        assert!(reshaped_apart(&[2, 4, 8], &[2, 4, 2, 4], 0, 2));
        assert!(!reshaped_apart(&[2, 4, 8, 4], &[8, 8, 4], 0, 1));
        assert!(!reshaped_apart(&[1, 2, 8, 4], &[2, 8, 4], 0, 1));
        // A size-1 kv-head shard beside the batch (GQA's copies merged, `[b, kv, rep, s, d]
        // -> [b, kv * rep, s, d]`): the local shapes leave the cut open, the spec's settle it
        // (the batch and the heads stay apart); a spec that merges them does not.
        assert!(!reshaped_apart(&[2, 1, 2, 8, 4], &[2, 2, 8, 4], 0, 1));
        let (ins, outs) = ([2, 1, 2, 8, 4], [2, 2, 8, 4]);
        assert!(reshaped_apart_by_global(
            &ins,
            &outs,
            &[8, 2, 2, 8, 4],
            &[8, 4, 8, 4],
            0,
            1
        ));
        assert!(!reshaped_apart_by_global(
            &ins,
            &outs,
            &[8, 2, 2, 8, 4],
            &[32, 8, 4, 1],
            0,
            1
        ));
        // Merged locally too: no cut between them.
        assert!(!reshaped_apart_by_global(
            &[2, 2, 8, 4],
            &[4, 8, 4],
            &[8, 4, 8, 4],
            &[32, 8, 4],
            0,
            1
        ));
        assert_eq!(Place::blocked(1, 1), Place::Shard(1));
        assert_eq!(Place::blocked(1, 4).to_string(), "Shard(1, blocks=4)");
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

    /// The same batch label in different blocks is named as such (was "Some(Batch(0)) of the
    /// left, Some(Batch(0)) of the right", which reads as a contradiction).
    #[test]
    fn a_product_of_one_batch_dim_in_different_blocks_names_the_blocks() {
        let t = |p: Place| T {
            v: ValueId::new(0, 0),
            p,
            meta: Some(Meta::new(shardproof_ir::DType::F64, vec![4, 2, 2])),
            constant: 0,
            runs: Runs::Unknown,
        };
        let (la, lb, lo) = matmul_labels(3, 3);
        let out_of = |l: Label| lo.iter().position(|x| *x == l);
        let (a, b) = (t(Place::Shard(0)), t(Place::blocked(0, 2)));
        let v = product(&a, &la, &b, &lb, &out_of).unwrap_err();
        assert_eq!(v.kind, Kind::Consistency);
        assert!(
            v.message
                .contains("same dim (Batch(0)) in different blocks (1 of the left, 2 of"),
            "{}",
            v.message
        );
        // Blocks alike: the batch shard.
        let b = t(Place::Shard(0));
        assert_eq!(
            product(&a, &la, &b, &lb, &out_of).ok(),
            Some(Place::Shard(0))
        );
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
