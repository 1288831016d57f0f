//! Functional collectives (`_c10d_functional`): shape inference here, values computed by the
//! distributed interpreter through [`apply_collective`], which sees every member's arguments.
//!
//! In a single-device program every process group has one member, so each collective there
//! is the identity, and `apply_collective` with a one-member group computes exactly that.

use crate::tensor::cast_value;
use crate::{Args, Meta, OpClass, OpDef, OpError, Registry, Tensor};
use shardproof_ir::DType;

/// Registers the functional collectives and `wait_tensor`.
pub(crate) fn register(r: &mut Registry) {
    let c = OpClass::Collective;
    r.add(
        "_c10d_functional.all_reduce.default",
        "all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor",
        c,
        |a| {
            ReduceOp::parse(&a.str("reduce_op")?)?;
            Ok(vec![a.meta("input")?])
        },
        None,
    );
    r.add(
        "_c10d_functional.all_reduce_coalesced.default",
        "all_reduce_coalesced(Tensor[] inputs, str reduce_op, str group_name) -> Tensor[]",
        c,
        |a| {
            ReduceOp::parse(&a.str("reduce_op")?)?;
            list_metas(a)
        },
        None,
    );
    r.add(
        "_c10d_functional.all_gather_into_tensor.default",
        "all_gather_into_tensor(Tensor input, int group_size, str group_name) -> Tensor",
        c,
        |a| Ok(vec![gathered(&a.meta("input")?, group_size(a)?)?]),
        None,
    );
    r.add(
        "_c10d_functional.all_gather_into_tensor_coalesced.default",
        "all_gather_into_tensor_coalesced(Tensor[] inputs, int group_size, str group_name) -> Tensor[]",
        c,
        |a| {
            let n = group_size(a)?;
            list_metas(a)?.iter().map(|m| gathered(m, n)).collect()
        },
        None,
    );
    r.add(
        "_c10d_functional.reduce_scatter_tensor.default",
        "reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor",
        c,
        |a| {
            ReduceOp::parse(&a.str("reduce_op")?)?;
            Ok(vec![scattered(&a.meta("input")?, group_size(a)?)?])
        },
        None,
    );
    r.add(
        "_c10d_functional.reduce_scatter_tensor_coalesced.default",
        "reduce_scatter_tensor_coalesced(Tensor[] inputs, str reduce_op, int group_size, str group_name) -> Tensor[]",
        c,
        |a| {
            ReduceOp::parse(&a.str("reduce_op")?)?;
            let n = group_size(a)?;
            list_metas(a)?.iter().map(|m| scattered(m, n)).collect()
        },
        None,
    );
    r.add(
        "_c10d_functional.all_to_all_single.default",
        "all_to_all_single(Tensor input, SymInt[] output_split_sizes, SymInt[] input_split_sizes, str group_name) -> Tensor",
        c,
        |a| {
            let x = a.meta("input")?;
            let out = splits(a, "output_split_sizes")?;
            splits(a, "input_split_sizes")?;
            if x.rank() == 0 {
                return Err(OpError::new("all_to_all_single: input must have at least one dim"));
            }
            // As torch's kernel: dim 0 is the sum of the output splits, whatever they are.
            let mut shape = x.shape.clone();
            shape[0] = out.iter().sum();
            Ok(vec![Meta::new(x.dtype, shape)])
        },
        None,
    );
    r.add(
        "_c10d_functional.broadcast.default",
        "broadcast(Tensor input, int src, str group_name) -> Tensor",
        c,
        |a| {
            if a.int("src")? < 0 {
                return Err(OpError::new("broadcast: src must be non-negative"));
            }
            Ok(vec![a.meta("input")?])
        },
        None,
    );
    r.add(
        "_c10d_functional.wait_tensor.default",
        "wait_tensor(Tensor tensor) -> Tensor",
        OpClass::Wait,
        |a| Ok(vec![a.meta("tensor")?]),
        Some(|a, _, _| Ok(vec![a.tensor("tensor")?.clone()])),
    );
}

fn group_size(a: &Args) -> Result<usize, OpError> {
    let n = a.int("group_size")?;
    if n < 1 {
        return Err(OpError::new(format!(
            "group_size must be positive, got {n}"
        )));
    }
    Ok(n as usize)
}

fn list_metas(a: &Args) -> Result<Vec<Meta>, OpError> {
    a.metas("inputs")?
        .into_iter()
        .map(|m| m.ok_or_else(|| OpError::new("collective: `inputs` may not contain None")))
        .collect()
}

fn splits(a: &Args, name: &str) -> Result<Vec<usize>, OpError> {
    let s = a.int_list(name)?;
    if s.iter().any(|&x| x < 0) {
        return Err(OpError::new(format!(
            "all_to_all_single: negative {name} {s:?}"
        )));
    }
    Ok(s.iter().map(|&x| x as usize).collect())
}

fn gathered(m: &Meta, n: usize) -> Result<Meta, OpError> {
    if m.rank() == 0 {
        return Err(OpError::new(
            "all_gather_into_tensor: input must have at least one dim",
        ));
    }
    let mut shape = m.shape.clone();
    shape[0] *= n;
    Ok(Meta::new(m.dtype, shape))
}

fn scattered(m: &Meta, n: usize) -> Result<Meta, OpError> {
    if m.rank() == 0 || !m.shape[0].is_multiple_of(n) {
        return Err(OpError::new(format!(
            "reduce_scatter_tensor: dim 0 of input {:?} is not divisible by the group size {n}",
            m.shape
        )));
    }
    let mut shape = m.shape.clone();
    shape[0] /= n;
    Ok(Meta::new(m.dtype, shape))
}

/// A reduction of c10d (`ReduceOp` names, lower-cased as the functional API passes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReduceOp {
    Sum,
    Avg,
    Product,
    Min,
    Max,
    Band,
    Bor,
    Bxor,
}

impl ReduceOp {
    fn parse(s: &str) -> Result<ReduceOp, OpError> {
        Ok(match s {
            "sum" => ReduceOp::Sum,
            "avg" => ReduceOp::Avg,
            "product" => ReduceOp::Product,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "band" => ReduceOp::Band,
            "bor" => ReduceOp::Bor,
            "bxor" => ReduceOp::Bxor,
            other => {
                return Err(OpError::new(format!(
                    "unsupported reduce_op '{other}' (expected sum, avg, product, min, max, band, bor or bxor)"
                )))
            }
        })
    }

    /// Reduces one element across members, in group order.
    fn apply(self, vals: impl Iterator<Item = f64>, n: usize, dtype: DType) -> f64 {
        // c10d reduces bools as logical or (sum, max) / logical and (product, min).
        let op = match (dtype, self) {
            (DType::Bool, ReduceOp::Sum | ReduceOp::Avg) => ReduceOp::Max,
            (DType::Bool, ReduceOp::Product) => ReduceOp::Min,
            _ => self,
        };
        let nan_aware = |f: fn(f64, f64) -> f64| {
            // NaN wins, so a NaN on any member is never hidden by max/min.
            move |acc: f64, v: f64| {
                if acc.is_nan() || v.is_nan() {
                    f64::NAN
                } else {
                    f(acc, v)
                }
            }
        };
        let bits = |f: fn(i64, i64) -> i64| move |acc: f64, v: f64| f(acc as i64, v as i64) as f64;
        let mut vals = vals;
        let first = vals.next().unwrap_or(0.0);
        let r = match op {
            ReduceOp::Sum => vals.fold(first, |a, v| a + v),
            ReduceOp::Avg => {
                let s = vals.fold(first, |a, v| a + v) / n as f64;
                if dtype.is_float() {
                    s
                } else {
                    cast_value(s, dtype)
                }
            }
            ReduceOp::Product => vals.fold(first, |a, v| a * v),
            ReduceOp::Min => vals.fold(first, nan_aware(f64::min)),
            ReduceOp::Max => vals.fold(first, nan_aware(f64::max)),
            ReduceOp::Band => vals.fold(first, bits(|a, b| a & b)),
            ReduceOp::Bor => vals.fold(first, bits(|a, b| a | b)),
            ReduceOp::Bxor => vals.fold(first, bits(|a, b| a ^ b)),
        };
        if dtype.is_float() {
            r
        } else {
            cast_value(r, dtype)
        }
    }
}

/// Elementwise reduction of equally shaped tensors, over the flat element range `range`.
fn reduce_range(
    op: ReduceOp,
    inputs: &[&Tensor],
    range: std::ops::Range<usize>,
) -> Result<Vec<f64>, OpError> {
    same_metas("collective", inputs)?;
    let n = inputs.len();
    let dtype = inputs[0].dtype();
    Ok(range
        .map(|i| op.apply(inputs.iter().map(|t| t.data[i]), n, dtype))
        .collect())
}

fn reduce_all(op: ReduceOp, inputs: &[&Tensor]) -> Result<Vec<f64>, OpError> {
    reduce_range(op, inputs, 0..inputs[0].numel())
}

fn same_metas(op: &str, inputs: &[&Tensor]) -> Result<(), OpError> {
    if let Some((j, t)) = inputs
        .iter()
        .enumerate()
        .find(|(_, t)| t.meta != inputs[0].meta)
    {
        return Err(OpError::new(format!(
            "{op}: member {j} contributes {} {:?} but member 0 contributes {} {:?}",
            t.dtype().torch_name(),
            t.shape(),
            inputs[0].dtype().torch_name(),
            inputs[0].shape()
        )));
    }
    Ok(())
}

/// Every member's value of argument `name`, which must agree across the group.
fn agreed<T: PartialEq + std::fmt::Debug>(
    group: &[&Args],
    name: &str,
    get: impl Fn(&Args) -> Result<T, OpError>,
) -> Result<T, OpError> {
    let first = get(group[0])?;
    for (j, a) in group.iter().enumerate().skip(1) {
        let v = get(a)?;
        if v != first {
            return Err(OpError::new(format!(
                "collective: member {j} passes {name} = {v:?} but member 0 passes {first:?}"
            )));
        }
    }
    Ok(first)
}

fn tensor_lists<'a>(group: &[&Args<'a>]) -> Result<Vec<Vec<&'a Tensor>>, OpError> {
    let lists: Vec<Vec<&Tensor>> = group
        .iter()
        .map(|a| {
            a.tensors("inputs")?
                .into_iter()
                .map(|t| t.ok_or_else(|| OpError::new("collective: `inputs` may not contain None")))
                .collect()
        })
        .collect::<Result<_, _>>()?;
    let len = lists[0].len();
    if lists.iter().any(|l| l.len() != len) {
        return Err(OpError::new(
            "collective: members pass different numbers of tensors",
        ));
    }
    Ok(lists)
}

/// Member `j`'s tensor `i` of the coalesced lists, for each member.
fn column<'a>(lists: &[Vec<&'a Tensor>], i: usize) -> Vec<&'a Tensor> {
    lists.iter().map(|l| l[i]).collect()
}

fn gather(inputs: &[&Tensor], out: &Meta) -> Result<Tensor, OpError> {
    same_metas("all_gather_into_tensor", inputs)?;
    let data = inputs.iter().flat_map(|t| t.data.iter().copied()).collect();
    Ok(Tensor::new(out.clone(), data))
}

fn reduce_scatter(
    op: ReduceOp,
    inputs: &[&Tensor],
    rank: usize,
    out: &Meta,
) -> Result<Tensor, OpError> {
    // Only this member's chunk is reduced: the others' chunks are theirs to compute.
    let chunk = out.numel();
    let data = reduce_range(op, inputs, rank * chunk..(rank + 1) * chunk)?;
    Ok(Tensor::new(out.clone(), data))
}

/// A member's split sizes, or equal splits when the list is empty (c10d's convention).
fn split_or_equal(s: Vec<usize>, dim0: usize, n: usize) -> Result<Vec<usize>, OpError> {
    if s.is_empty() {
        if !dim0.is_multiple_of(n) {
            return Err(OpError::new(format!(
                "all_to_all_single: dim 0 ({dim0}) is not divisible by the group size {n}"
            )));
        }
        return Ok(vec![dim0 / n; n]);
    }
    if s.len() != n || s.iter().sum::<usize>() != dim0 {
        return Err(OpError::new(format!(
            "all_to_all_single: split sizes {s:?} do not split {dim0} rows among {n} members"
        )));
    }
    Ok(s)
}

fn all_to_all(group: &[&Args], rank: usize, out: &Meta) -> Result<Tensor, OpError> {
    let n = group.len();
    let mut data = Vec::with_capacity(out.numel());
    for (j, a) in group.iter().enumerate() {
        let x = a.tensor("input")?;
        if x.dtype() != out.dtype || x.meta.rank() != out.rank() || x.shape()[1..] != out.shape[1..]
        {
            return Err(OpError::new(format!(
                "all_to_all_single: member {j}'s input {:?} does not match member {rank}'s output {:?}",
                x.shape(),
                out.shape
            )));
        }
        let row: usize = x.shape()[1..].iter().product();
        let s = split_or_equal(splits(a, "input_split_sizes")?, x.shape()[0], n)?;
        let start: usize = s[..rank].iter().sum();
        data.extend_from_slice(&x.data[start * row..(start + s[rank]) * row]);
    }
    if data.len() != out.numel() {
        return Err(OpError::new(format!(
            "all_to_all_single: member {rank} receives {} elements but its output_split_sizes give shape {:?}",
            data.len(),
            out.shape
        )));
    }
    Ok(Tensor::new(out.clone(), data))
}

/// Computes one member's outputs of a functional collective from every member's arguments.
///
/// `group_args[j]` are the bound arguments of the call on the member of group index `j` (group
/// order = ascending global rank, as c10d orders a group), bound with that member's values so
/// its tensors carry data; `rank_index_in_group` is the index of the member whose outputs are
/// wanted. The result has one tensor per output of `op` (one, or one per list element for the
/// `*_coalesced` ops), with the metas `op.infer` gives for that member.
///
/// Semantics, as torch's `_c10d_functional` kernels:
/// - `all_reduce`: elementwise `sum` / `avg` / `product` / `min` / `max` / `band` / `bor` /
///   `bxor` over members in group order (bools reduce as logical or / and, as c10d does).
/// - `all_gather_into_tensor`: members' inputs concatenated on dim 0 in group order.
/// - `reduce_scatter_tensor`: this member's dim-0 chunk of the reduction.
/// - `all_to_all_single`: the concatenation over members `j` of chunk `rank_index_in_group` of
///   member `j`'s input, split by member `j`'s `input_split_sizes` (empty = equal splits).
/// - `broadcast`: a copy of the input of the member whose group index is `src`. torch's kernel
///   hands `src` to `ProcessGroup::broadcast` as the root's rank *within the group*, so `src` is
///   read as a group index here; callers never translate it.
/// - `wait_tensor`: the identity.
///
/// A one-member group yields each member's own input (the identity), whatever the op.
/// Errors when members disagree on shapes, dtypes, `reduce_op` or `group_size`, or when
/// `group_size` differs from the number of members.
pub fn apply_collective(
    op: &OpDef,
    group_args: &[&Args],
    rank_index_in_group: usize,
) -> Result<Vec<Tensor>, OpError> {
    let n = group_args.len();
    let rank = rank_index_in_group;
    if rank >= n {
        return Err(OpError::new(format!(
            "{}: member index {rank} out of range for a group of {n}",
            op.name
        )));
    }
    if op.name.namespace != "_c10d_functional" {
        return Err(OpError::new(format!(
            "{} is not a functional collective",
            op.name
        )));
    }
    let me = group_args[rank];
    let metas = (op.infer)(me)?;
    crate::check_outputs(&op.name, &metas)?;
    let name = op.name.name.as_str();
    if matches!(
        name,
        "all_gather_into_tensor"
            | "all_gather_into_tensor_coalesced"
            | "reduce_scatter_tensor"
            | "reduce_scatter_tensor_coalesced"
    ) {
        let gs = agreed(group_args, "group_size", |a| a.int("group_size"))?;
        if gs != n as i64 {
            return Err(OpError::new(format!(
                "{}: group_size is {gs} but the group has {n} members",
                op.name
            )));
        }
    }
    let reduce_op = || -> Result<ReduceOp, OpError> {
        ReduceOp::parse(&agreed(group_args, "reduce_op", |a| a.str("reduce_op"))?)
    };
    let inputs = || -> Result<Vec<&Tensor>, OpError> {
        group_args.iter().map(|a| a.tensor("input")).collect()
    };
    match name {
        "all_reduce" => Ok(vec![Tensor::new(
            metas[0].clone(),
            reduce_all(reduce_op()?, &inputs()?)?,
        )]),
        "all_reduce_coalesced" => {
            let (op, lists) = (reduce_op()?, tensor_lists(group_args)?);
            (0..metas.len())
                .map(|i| {
                    Ok(Tensor::new(
                        metas[i].clone(),
                        reduce_all(op, &column(&lists, i))?,
                    ))
                })
                .collect()
        }
        "all_gather_into_tensor" => Ok(vec![gather(&inputs()?, &metas[0])?]),
        "all_gather_into_tensor_coalesced" => {
            let lists = tensor_lists(group_args)?;
            (0..metas.len())
                .map(|i| gather(&column(&lists, i), &metas[i]))
                .collect()
        }
        "reduce_scatter_tensor" => Ok(vec![reduce_scatter(
            reduce_op()?,
            &inputs()?,
            rank,
            &metas[0],
        )?]),
        "reduce_scatter_tensor_coalesced" => {
            let (op, lists) = (reduce_op()?, tensor_lists(group_args)?);
            (0..metas.len())
                .map(|i| reduce_scatter(op, &column(&lists, i), rank, &metas[i]))
                .collect()
        }
        "all_to_all_single" => Ok(vec![all_to_all(group_args, rank, &metas[0])?]),
        "broadcast" => {
            let src = agreed(group_args, "src", |a| a.int("src"))?;
            let xs = inputs()?;
            same_metas("broadcast", &xs)?;
            let root = usize::try_from(src)
                .ok()
                .filter(|&s| s < n)
                .ok_or_else(|| {
                    OpError::new(format!(
                        "broadcast: src {src} is not a member index of a group of {n}"
                    ))
                })?;
            Ok(vec![xs[root].clone()])
        }
        "wait_tensor" => Ok(vec![me.tensor("tensor")?.clone()]),
        _ => Err(OpError::new(format!(
            "{}: no distributed semantics implemented",
            op.name
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::TensorList;
    use crate::testing::v;
    use shardproof_ir::{Arg, OpName};

    fn t(shape: &[usize], data: &[f64]) -> Tensor {
        Tensor::new(Meta::new(DType::F32, shape.to_vec()), data.to_vec())
    }

    fn def(op: &str) -> &'static OpDef {
        Registry::builtin()
            .get(&OpName::parse(op).unwrap())
            .unwrap()
    }

    /// Runs `op` on a group whose member `j` holds `tensors[j]` and passes `args[j]`; returns
    /// every member's outputs.
    fn run(
        op: &str,
        tensors: &[Vec<Tensor>],
        args: &[Vec<Arg>],
    ) -> Result<Vec<Vec<Tensor>>, OpError> {
        let d = def(op);
        let lists: Vec<TensorList> = tensors.iter().map(|ts| TensorList(ts)).collect();
        let bound: Vec<Args> = args
            .iter()
            .zip(&lists)
            .map(|(a, l)| Args::bind(&d.schema, a, &[], l))
            .collect::<Result<_, _>>()?;
        let refs: Vec<&Args> = bound.iter().collect();
        (0..refs.len())
            .map(|r| apply_collective(d, &refs, r))
            .collect()
    }

    fn infer(op: &str, tensors: &[Tensor], args: &[Arg]) -> Result<Vec<Meta>, OpError> {
        Registry::builtin().infer(def(op), args, &[], &TensorList(tensors))
    }

    #[test]
    fn all_reduce_on_two_members() {
        let ts = vec![vec![t(&[2], &[1., 5.])], vec![t(&[2], &[3., -2.])]];
        let args = |op: &str| vec![vec![v(0), Arg::Str(op.into()), Arg::Str("12".into())]; 2];
        for (op, want) in [
            ("sum", [4., 3.]),
            ("avg", [2., 1.5]),
            ("product", [3., -10.]),
            ("max", [3., 5.]),
            ("min", [1., -2.]),
        ] {
            let out = run("_c10d_functional.all_reduce.default", &ts, &args(op)).unwrap();
            assert_eq!(*out[0][0].data, want.to_vec(), "{op}");
            assert_eq!(out[0][0], out[1][0]);
        }
        assert!(run(
            "_c10d_functional.all_reduce.default",
            &ts,
            &args("premul_sum")
        )
        .is_err());
        let bad = vec![vec![t(&[2], &[1., 5.])], vec![t(&[3], &[3., -2., 0.])]];
        assert!(run("_c10d_functional.all_reduce.default", &bad, &args("sum")).is_err());
    }

    #[test]
    fn one_member_groups_are_the_identity() {
        let x = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let g = Arg::Str("7".into());
        for (op, args) in [
            (
                "_c10d_functional.all_reduce.default",
                vec![v(0), Arg::Str("sum".into()), g.clone()],
            ),
            (
                "_c10d_functional.broadcast.default",
                vec![v(0), Arg::Int(0), g.clone()],
            ),
            (
                "_c10d_functional.all_gather_into_tensor.default",
                vec![v(0), Arg::Int(1), g.clone()],
            ),
            (
                "_c10d_functional.reduce_scatter_tensor.default",
                vec![v(0), Arg::Str("max".into()), Arg::Int(1), g.clone()],
            ),
        ] {
            let out = run(op, &[vec![x.clone()]], &[args]).unwrap();
            assert_eq!(out[0][0], x, "{op}");
        }
    }

    #[test]
    fn all_gather_and_reduce_scatter_on_two_members() {
        let ts = vec![
            vec![t(&[2, 2], &[1., 2., 3., 4.])],
            vec![t(&[2, 2], &[10., 20., 30., 40.])],
        ];
        let args = vec![vec![v(0), Arg::Int(2), Arg::Str("12".into())]; 2];
        let out = run(
            "_c10d_functional.all_gather_into_tensor.default",
            &ts,
            &args,
        )
        .unwrap();
        assert_eq!(out[0][0].shape(), &[4, 2]);
        assert_eq!(*out[1][0].data, vec![1., 2., 3., 4., 10., 20., 30., 40.]);
        let args = vec![
            vec![
                v(0),
                Arg::Str("sum".into()),
                Arg::Int(2),
                Arg::Str("12".into())
            ];
            2
        ];
        let out = run("_c10d_functional.reduce_scatter_tensor.default", &ts, &args).unwrap();
        assert_eq!(out[0][0].shape(), &[1, 2]);
        assert_eq!(*out[0][0].data, vec![11., 22.]);
        assert_eq!(*out[1][0].data, vec![33., 44.]);
        // group_size must be the group's size.
        let args = vec![vec![v(0), Arg::Int(4), Arg::Str("12".into())]; 2];
        assert!(run(
            "_c10d_functional.all_gather_into_tensor.default",
            &ts,
            &args
        )
        .is_err());
        // Inference: dim 0 scaled, and divisibility checked.
        let x = [t(&[3, 2], &[0.; 6])];
        let m = infer(
            "_c10d_functional.all_gather_into_tensor.default",
            &x,
            &[v(0), Arg::Int(2), Arg::Str("g".into())],
        )
        .unwrap();
        assert_eq!(m[0].shape, vec![6, 2]);
        let args = [
            v(0),
            Arg::Str("sum".into()),
            Arg::Int(2),
            Arg::Str("g".into()),
        ];
        assert!(infer("_c10d_functional.reduce_scatter_tensor.default", &x, &args).is_err());
    }

    #[test]
    fn coalesced_ops_on_two_members() {
        let ts = vec![
            vec![t(&[2], &[1., 2.]), t(&[1], &[5.])],
            vec![t(&[2], &[3., 4.]), t(&[1], &[7.])],
        ];
        let list = Arg::List(vec![v(0), v(1)]);
        let g = Arg::Str("12".into());
        let args = vec![vec![list.clone(), Arg::Str("sum".into()), g.clone()]; 2];
        let out = run("_c10d_functional.all_reduce_coalesced.default", &ts, &args).unwrap();
        assert_eq!((out[1][0].data[1], out[1][1].data[0]), (6., 12.));
        let args = vec![vec![list.clone(), Arg::Int(2), g.clone()]; 2];
        let out = run(
            "_c10d_functional.all_gather_into_tensor_coalesced.default",
            &ts,
            &args,
        )
        .unwrap();
        assert_eq!(*out[0][1].data, vec![5., 7.]);
        let args = vec![vec![list, Arg::Str("sum".into()), Arg::Int(2), g]; 2];
        let out = run(
            "_c10d_functional.reduce_scatter_tensor_coalesced.default",
            &ts,
            &args,
        );
        // The second tensor's dim 0 (1) does not split in two.
        assert!(out.is_err());
    }

    #[test]
    fn all_to_all_single_on_two_members() {
        // Member 0 sends 1 row to itself and 2 to member 1; member 1 sends 2 to member 0 and
        // 1 to itself.
        let ts = vec![
            vec![t(&[3, 1], &[1., 2., 3.])],
            vec![t(&[3, 1], &[10., 20., 30.])],
        ];
        let g = Arg::Str("12".into());
        let ints = |xs: &[i64]| Arg::List(xs.iter().map(|&x| Arg::Int(x)).collect());
        let args = vec![
            vec![v(0), ints(&[1, 2]), ints(&[1, 2]), g.clone()],
            vec![v(0), ints(&[2, 1]), ints(&[2, 1]), g.clone()],
        ];
        let out = run("_c10d_functional.all_to_all_single.default", &ts, &args).unwrap();
        assert_eq!(*out[0][0].data, vec![1., 10., 20.]);
        assert_eq!(*out[1][0].data, vec![2., 3., 30.]);
        // Equal splits.
        let ts = vec![vec![t(&[2], &[1., 2.])], vec![t(&[2], &[3., 4.])]];
        let args = vec![vec![v(0), ints(&[1, 1]), ints(&[]), g.clone()]; 2];
        let out = run("_c10d_functional.all_to_all_single.default", &ts, &args).unwrap();
        assert_eq!(*out[0][0].data, vec![1., 3.]);
        assert_eq!(*out[1][0].data, vec![2., 4.]);
        // Output splits that disagree with what arrives.
        let args = vec![vec![v(0), ints(&[2, 1]), ints(&[1, 1]), g]; 2];
        assert!(run("_c10d_functional.all_to_all_single.default", &ts, &args).is_err());
    }

    #[test]
    fn broadcast_and_wait_on_two_members() {
        let ts = vec![vec![t(&[2], &[1., 2.])], vec![t(&[2], &[3., 4.])]];
        let args = |src: i64| vec![vec![v(0), Arg::Int(src), Arg::Str("12".into())]; 2];
        let out = run("_c10d_functional.broadcast.default", &ts, &args(1)).unwrap();
        assert_eq!(*out[0][0].data, vec![3., 4.]);
        assert_eq!(out[0][0], out[1][0]);
        assert!(run("_c10d_functional.broadcast.default", &ts, &args(2)).is_err());
        let w = Registry::builtin()
            .call("_c10d_functional.wait_tensor.default", &ts[0], &[v(0)], &[])
            .unwrap();
        assert_eq!(w[0], ts[0][0]);
        assert_eq!(
            def("_c10d_functional.wait_tensor.default").class,
            OpClass::Wait
        );
        assert!(def("_c10d_functional.all_reduce.default").eval.is_none());
    }

    #[test]
    fn bool_sum_is_logical_or() {
        let b = |d: &[f64]| Tensor::new(Meta::new(DType::Bool, vec![2]), d.to_vec());
        let ts = vec![vec![b(&[1., 0.])], vec![b(&[1., 0.])]];
        let args = vec![vec![v(0), Arg::Str("sum".into()), Arg::Str("g".into())]; 2];
        let out = run("_c10d_functional.all_reduce.default", &ts, &args).unwrap();
        assert_eq!(*out[0][0].data, vec![1., 0.]);
    }
}
