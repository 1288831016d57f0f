//! Point-to-point communication (`shardproof_p2p.send` / `shardproof_p2p.recv`): what a capture
//! of `torch.distributed.isend` / `irecv` records, in a namespace of ours because PyTorch's
//! functional collectives have none.
//!
//! - `send(Tensor input, int dst, int tag=0, str? group=None) -> Tensor` posts `input` to rank
//!   `dst`. Like `isend`, it never blocks (the message is buffered); its result is the sent
//!   tensor itself, a handle that a later `wait_tensor` may wait on.
//! - `recv(SymInt[] size, ScalarType dtype, int src, int tag=0, str? group=None) -> Tensor`
//!   receives a tensor of `size` and `dtype` from rank `src`: the buffer `irecv` fills,
//!   described by its type instead of a preallocated tensor (the values of such a buffer are
//!   never read).
//!
//! Without `group` the peer is a global rank (what a torch capture records). With `group` it is
//! the index of the peer within the calling rank's own member set of that process group (the
//! case's `groups:`), as PyTorch 2.6's `isend(t, group=g, group_dst=i)`: every data-parallel
//! replica of a pipeline stage then writes the same text. [`p2p_call`] turns either form into
//! the global peer.
//!
//! A recv on rank `d` matches the sends of rank `src` to `d` with the same tag, in program
//! order (first recv, first send). The registry only checks each call and infers its type; the
//! distributed interpreter moves the data (see [`p2p_call`]).

use crate::create::size_arg;
use crate::{Args, Meta, OpClass, OpDef, OpError, Registry};
use shardproof_ir::{Arg, OpName, Program};

/// The namespace of the point-to-point operators.
pub const P2P_NAMESPACE: &str = "shardproof_p2p";

/// Registers `send` and `recv`.
pub(crate) fn register(r: &mut Registry) {
    r.add(
        "shardproof_p2p.send.default",
        "send(Tensor input, int dst, int tag=0, str? group=None) -> Tensor",
        OpClass::PointToPoint,
        |a| {
            peer(a, "dst")?;
            a.int("tag")?;
            group(a)?;
            Ok(vec![a.meta("input")?])
        },
        None,
    );
    r.add(
        "shardproof_p2p.recv.default",
        "recv(SymInt[] size, ScalarType dtype, int src, int tag=0, str? group=None) -> Tensor",
        OpClass::PointToPoint,
        |a| {
            peer(a, "src")?;
            a.int("tag")?;
            group(a)?;
            Ok(vec![recv_meta(a)?])
        },
        None,
    );
}

/// The peer argument `name` as written (a global rank, or an index within `group`), which
/// must be a non-negative int.
fn peer(a: &Args, name: &str) -> Result<usize, OpError> {
    let r = a.int(name)?;
    usize::try_from(r).map_err(|_| {
        OpError::new(format!(
            "{}: {name} = {r} is not a rank (ranks are non-negative: global ranks, or indices \
             within `group`)",
            a.schema().name
        ))
    })
}

/// The optional `group` argument: `None`, or a process group's name.
fn group(a: &Args) -> Result<Option<String>, OpError> {
    match a.get("group") {
        None => Ok(None),
        Some(Arg::Str(s)) => Ok(Some(s)),
        Some(other) => Err(OpError::new(format!(
            "{}: argument `group` should be a process group's name or None, got {other:?}",
            a.schema().name
        ))),
    }
}

/// The type a recv declares: its `size` and `dtype`.
fn recv_meta(a: &Args) -> Result<Meta, OpError> {
    let dtype = a.dtype("dtype")?.ok_or_else(|| {
        OpError::new("recv: `dtype` must be a dtype such as torch.float32, not None")
    })?;
    Ok(Meta::new(dtype, size_arg(a)?))
}

/// Which end of a message a point-to-point call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum P2pEnd {
    /// `send`: posts its input to `peer`.
    Send,
    /// `recv`: takes the next message from `peer`.
    Recv,
}

/// A point-to-point call, read from its bound arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct P2pCall {
    /// Send or receive.
    pub end: P2pEnd,
    /// The other end's global rank (`dst` of a send, `src` of a recv), resolved through
    /// `group` where the call names one.
    pub peer: usize,
    /// The message tag; messages match only with equal tags.
    pub tag: i64,
}

/// The members of a rank's process groups, for [`p2p_call`]: given a group name, the calling
/// rank's member set in that group, in member order (the order a group index counts in), or
/// `None` when the group is unknown to the program or the rank is not in it.
pub type GroupMembers<'a> = &'a dyn Fn(&str) -> Option<Vec<usize>>;

/// The members of `rank`'s process groups in `program`, by the interpreter's rule for group
/// names: a group the case declares gives the rank's member set (none when the rank is not a
/// member); an undeclared one means every rank on a mesh of at most one dim, and is unknown
/// otherwise.
pub fn program_members(program: &Program, rank: usize) -> impl Fn(&str) -> Option<Vec<usize>> + '_ {
    move |name: &str| match program.group(name) {
        Some(g) => g.group_of(rank).map(<[usize]>::to_vec),
        None if program.mesh.dims.len() <= 1 => Some((0..program.ranks.len()).collect()),
        None => None,
    }
}

/// Reads the route of a call of a point-to-point operator (`op.class` is
/// [`OpClass::PointToPoint`]) from its bound arguments: literals only, so a send whose input
/// was never computed still has one. The peer is global: a call that names a `group` has its
/// index looked up in `members(group)` (see [`GroupMembers`]); an unknown group or an index
/// outside the rank's member set is an error. The message's type is `op.infer`'s: the sent
/// tensor's, or the one the recv declares. Errors name the argument that is wrong.
pub fn p2p_call(op: &OpDef, args: &Args, members: GroupMembers) -> Result<P2pCall, OpError> {
    let (end, key) = match (op.name.namespace.as_str(), op.name.name.as_str()) {
        (P2P_NAMESPACE, "send") => (P2pEnd::Send, "dst"),
        (P2P_NAMESPACE, "recv") => (P2pEnd::Recv, "src"),
        _ => {
            return Err(OpError::new(format!(
                "{} is not a point-to-point operator",
                op.name
            )))
        }
    };
    let index = peer(args, key)?;
    let peer = match group(args)? {
        None => index,
        Some(g) => {
            let m = members(&g).ok_or_else(|| {
                OpError::new(format!(
                    "{}: process group `{g}` is not one of this rank's groups (the case's \
                     `groups:` does not declare it, or does not put this rank in it)",
                    op.name
                ))
            })?;
            *m.get(index).ok_or_else(|| {
                OpError::new(format!(
                    "{}: {key} = {index} is outside process group `{g}`, whose member set for \
                     this rank has {} rank(s) {m:?} (with `group`, {key} is an index into it)",
                    op.name,
                    m.len()
                ))
            })?
        }
    };
    Ok(P2pCall {
        end,
        peer,
        tag: args.int("tag")?,
    })
}

/// [`p2p_call`] on a graph node's literal arguments (no tensor values needed): `None` when
/// `op` is not a point-to-point operator of the registry.
pub fn p2p_node_call(
    op: &OpName,
    args: &[Arg],
    kwargs: &[(String, Arg)],
    members: GroupMembers,
) -> Option<Result<P2pCall, OpError>> {
    let def = crate::Registry::builtin().get(op)?;
    if def.class != OpClass::PointToPoint {
        return None;
    }
    Some(
        Args::bind(&def.schema, args, kwargs, &crate::NoValues)
            .and_then(|a| p2p_call(def, &a, members)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ints, v};
    use crate::{Tensor, TensorList};
    use shardproof_ir::{Arg, DType, OpName};

    fn def(op: &str) -> &'static OpDef {
        Registry::builtin()
            .get(&OpName::parse(op).unwrap())
            .unwrap()
    }

    fn call(op: &str, tensors: &[Tensor], args: &[Arg]) -> Result<(P2pCall, Meta), OpError> {
        let d = def(op);
        let values = TensorList(tensors);
        let bound = Args::bind(&d.schema, args, &[], &values)?;
        let meta = (d.infer)(&bound)?.remove(0);
        Ok((p2p_call(d, &bound, &no_groups)?, meta))
    }

    fn no_groups(_: &str) -> Option<Vec<usize>> {
        None
    }

    #[test]
    fn send_and_recv_read_their_peer_tag_and_type() {
        let x = Tensor::new(Meta::new(DType::F32, vec![2, 3]), vec![0.0; 6]);
        let s = call(
            "shardproof_p2p.send.default",
            std::slice::from_ref(&x),
            &[v(0), Arg::Int(1), Arg::Int(7)],
        )
        .unwrap();
        assert_eq!(
            s,
            (
                P2pCall {
                    end: P2pEnd::Send,
                    peer: 1,
                    tag: 7,
                },
                x.meta.clone()
            )
        );
        // The tag defaults to 0.
        let r = call(
            "shardproof_p2p.recv.default",
            &[],
            &[ints(&[2, 3]), Arg::Dtype(DType::Bf16), Arg::Int(0)],
        )
        .unwrap();
        assert_eq!(
            (r.0.end, r.0.peer, r.0.tag, r.1),
            (P2pEnd::Recv, 0, 0, Meta::new(DType::Bf16, vec![2, 3]))
        );
        assert_eq!(
            def("shardproof_p2p.recv.default").class,
            OpClass::PointToPoint
        );
        assert!(def("shardproof_p2p.send.default").eval.is_none());
    }

    #[test]
    fn bad_peers_sizes_and_dtypes_are_errors() {
        let e = call(
            "shardproof_p2p.recv.default",
            &[],
            &[ints(&[2]), Arg::Dtype(DType::F32), Arg::Int(-1)],
        )
        .unwrap_err();
        assert!(e.0.contains("src = -1 is not a rank"), "{e}");
        let e = call(
            "shardproof_p2p.recv.default",
            &[],
            &[ints(&[-2]), Arg::Dtype(DType::F32), Arg::Int(0)],
        )
        .unwrap_err();
        assert!(e.0.contains("negative dimension"), "{e}");
        let e = call(
            "shardproof_p2p.recv.default",
            &[],
            &[ints(&[2]), Arg::None, Arg::Int(0)],
        )
        .unwrap_err();
        assert!(e.0.contains("dtype"), "{e}");
        let x = Tensor::new(Meta::new(DType::F32, vec![1]), vec![0.0]);
        let e = call(
            "shardproof_p2p.send.default",
            &[x],
            &[v(0), Arg::Str("1".into())],
        )
        .unwrap_err();
        assert!(e.0.contains("dst"), "{e}");
        let wait = def("_c10d_functional.wait_tensor.default");
        let xs = [Tensor::new(Meta::new(DType::F32, vec![1]), vec![0.0])];
        let values = TensorList(&xs);
        let args = [v(0)];
        let bound = Args::bind(&wait.schema, &args, &[], &values).unwrap();
        assert!(p2p_call(wait, &bound, &no_groups).is_err());
    }

    #[test]
    fn a_group_index_resolves_to_the_global_peer() {
        // Rank 5 of a 2 x 4 (dp x pp) mesh: its `pp` member set is ranks 4..8.
        let members = |g: &str| (g == "pp").then(|| vec![4, 5, 6, 7]);
        let x = Tensor::new(Meta::new(DType::F32, vec![1]), vec![0.0]);
        let send = def("shardproof_p2p.send.default");
        let route = |args: &[Arg], kwargs: &[(String, Arg)]| {
            let xs = [x.clone()];
            let values = TensorList(&xs);
            let bound = Args::bind(&send.schema, args, kwargs, &values)?;
            (send.infer)(&bound)?;
            p2p_call(send, &bound, &members)
        };
        let by_pos = route(
            &[v(0), Arg::Int(2), Arg::Int(3), Arg::Str("pp".into())],
            &[],
        )
        .unwrap();
        assert_eq!((by_pos.peer, by_pos.tag), (6, 3));
        let by_kw = route(
            &[v(0), Arg::Int(3)],
            &[("group".to_string(), Arg::Str("pp".into()))],
        )
        .unwrap();
        assert_eq!(by_kw.peer, 7);
        // Without a group the literal is the global rank.
        assert_eq!(route(&[v(0), Arg::Int(3)], &[]).unwrap().peer, 3);
        // An index outside the member set, and an unknown group, are errors.
        let e = route(
            &[v(0), Arg::Int(4), Arg::Int(0), Arg::Str("pp".into())],
            &[],
        )
        .unwrap_err();
        assert!(e.0.contains("dst = 4 is outside process group `pp`"), "{e}");
        let e = route(
            &[v(0), Arg::Int(0), Arg::Int(0), Arg::Str("cp".into())],
            &[],
        )
        .unwrap_err();
        assert!(
            e.0.contains("process group `cp` is not one of this rank's groups"),
            "{e}"
        );
        let e = route(&[v(0), Arg::Int(0), Arg::Int(0), Arg::Int(1)], &[]).unwrap_err();
        assert!(e.0.contains("group"), "{e}");
        // The literal form of the same call, on a recv.
        let recv = p2p_node_call(
            &OpName::parse("shardproof_p2p.recv.default").unwrap(),
            &[
                ints(&[1]),
                Arg::Dtype(DType::F32),
                Arg::Int(0),
                Arg::Int(0),
                Arg::Str("pp".into()),
            ],
            &[],
            &members,
        )
        .unwrap()
        .unwrap();
        assert_eq!((recv.end, recv.peer), (P2pEnd::Recv, 4));
        let not_p2p = OpName::parse("aten.relu.default").unwrap();
        assert!(p2p_node_call(&not_p2p, &[v(0)], &[], &members).is_none());
    }
}
