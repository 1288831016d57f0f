//! Point-to-point communication (`shardproof_p2p.send` / `shardproof_p2p.recv`): what a capture
//! of `torch.distributed.isend` / `irecv` records, in a namespace of ours because PyTorch's
//! functional collectives have none.
//!
//! - `send(Tensor input, int dst, int tag=0) -> Tensor` posts `input` to global rank `dst`. Like
//!   `isend`, it never blocks (the message is buffered); its result is the sent tensor itself,
//!   a handle that a later `wait_tensor` may wait on.
//! - `recv(SymInt[] size, ScalarType dtype, int src, int tag=0) -> Tensor` receives a tensor of
//!   `size` and `dtype` from global rank `src`: the buffer `irecv` fills, described by its type
//!   instead of a preallocated tensor (the values of such a buffer are never read).
//!
//! A recv on rank `d` matches the sends of rank `src` to `d` with the same tag, in program
//! order (first recv, first send). The registry only checks each call and infers its type; the
//! distributed interpreter moves the data (see [`p2p_call`]).

use crate::create::size_arg;
use crate::{Args, Meta, OpClass, OpDef, OpError, Registry};

/// The namespace of the point-to-point operators.
pub const P2P_NAMESPACE: &str = "shardproof_p2p";

/// Registers `send` and `recv`.
pub(crate) fn register(r: &mut Registry) {
    r.add(
        "shardproof_p2p.send.default",
        "send(Tensor input, int dst, int tag=0) -> Tensor",
        OpClass::PointToPoint,
        |a| {
            peer(a, "dst")?;
            a.int("tag")?;
            Ok(vec![a.meta("input")?])
        },
        None,
    );
    r.add(
        "shardproof_p2p.recv.default",
        "recv(SymInt[] size, ScalarType dtype, int src, int tag=0) -> Tensor",
        OpClass::PointToPoint,
        |a| {
            peer(a, "src")?;
            a.int("tag")?;
            Ok(vec![recv_meta(a)?])
        },
        None,
    );
}

/// The peer rank argument `name`, which must be a non-negative int.
fn peer(a: &Args, name: &str) -> Result<usize, OpError> {
    let r = a.int(name)?;
    usize::try_from(r).map_err(|_| {
        OpError::new(format!(
            "{}: {name} = {r} is not a rank (ranks are non-negative global ranks)",
            a.schema().name
        ))
    })
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
    /// The other end's global rank (`dst` of a send, `src` of a recv).
    pub peer: usize,
    /// The message tag; messages match only with equal tags.
    pub tag: i64,
}

/// Reads the route of a call of a point-to-point operator (`op.class` is
/// [`OpClass::PointToPoint`]) from its bound arguments: literals only, so a send whose input
/// was never computed still has one. The message's type is `op.infer`'s: the sent tensor's, or
/// the one the recv declares. Errors name the argument that is wrong.
pub fn p2p_call(op: &OpDef, args: &Args) -> Result<P2pCall, OpError> {
    match (op.name.namespace.as_str(), op.name.name.as_str()) {
        (P2P_NAMESPACE, "send") => Ok(P2pCall {
            end: P2pEnd::Send,
            peer: peer(args, "dst")?,
            tag: args.int("tag")?,
        }),
        (P2P_NAMESPACE, "recv") => Ok(P2pCall {
            end: P2pEnd::Recv,
            peer: peer(args, "src")?,
            tag: args.int("tag")?,
        }),
        _ => Err(OpError::new(format!(
            "{} is not a point-to-point operator",
            op.name
        ))),
    }
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
        Ok((p2p_call(d, &bound)?, meta))
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
        assert!(p2p_call(wait, &bound).is_err());
    }
}
