//! Interpreter tests on small hand-written torch.fx graphs.

use shardproof_interp::{run_graph, run_program, InterpErrorKind, Precision, RunConfig};
use shardproof_ir::{DType, Mesh, OpMeaning, ProcessGroup, Program};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

fn graph(text: &str) -> shardproof_ir::Graph {
    shardproof_import::parse_fx(text, Path::new("test.py"))
        .unwrap_or_else(|e| panic!("{e}"))
        .graph
}

fn t(shape: &[usize], data: &[f64]) -> Tensor {
    Tensor::new(Meta::new(DType::F32, shape.to_vec()), data.to_vec())
}

fn leaves(items: &[(&str, Tensor)]) -> BTreeMap<String, Tensor> {
    items
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect()
}

const MATMUL_ALLREDUCE: &str = r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 2]", w: "f32[2, 2]"):
        mm: "f32[2, 2]" = torch.ops.aten.mm.default(x, w);  x = w = None
        all_reduce: "f32[2, 2]" = torch.ops._c10d_functional.all_reduce.default(mm, 'sum', 'tp');  mm = None
        wait_tensor: "f32[2, 2]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        return (wait_tensor,)
"#;

#[test]
fn single_graph_treats_collectives_as_identities() {
    let g = graph(MATMUL_ALLREDUCE);
    let x = t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let w = t(&[2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let env = run_graph(
        &g,
        &leaves(&[("x", x.clone()), ("w", w)]),
        &RunConfig::default(),
    )
    .unwrap();
    let out = env.get(g.outputs[0].unwrap()).unwrap();
    assert_eq!(*out.data, *x.data);
}

fn two_rank(g: shardproof_ir::Graph) -> Program {
    Program {
        mesh: Mesh::new(vec![("tp".into(), 2)]),
        groups: vec![ProcessGroup {
            name: "tp".into(),
            members: vec![vec![0, 1]],
        }],
        ranks: vec![Arc::new(g.clone()), Arc::new(g)],
    }
}

#[test]
fn all_reduce_sums_across_ranks() {
    let p = two_rank(graph(MATMUL_ALLREDUCE));
    let w = t(&[2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let l0 = leaves(&[("x", t(&[2, 2], &[1.0, 2.0, 3.0, 4.0])), ("w", w.clone())]);
    let l1 = leaves(&[("x", t(&[2, 2], &[10.0, 20.0, 30.0, 40.0])), ("w", w)]);
    let envs = run_program(&p, &[l0, l1], &RunConfig::default()).unwrap();
    for env in &envs {
        let out = env.get(p.ranks[0].outputs[0].unwrap()).unwrap();
        assert_eq!(*out.data, vec![11.0, 22.0, 33.0, 44.0]);
    }
}

#[test]
fn mismatched_collectives_are_a_deadlock() {
    let other = MATMUL_ALLREDUCE.replace("'tp'", "'dp'");
    let mut p = two_rank(graph(MATMUL_ALLREDUCE));
    p.ranks[1] = Arc::new(graph(&other));
    p.groups.push(ProcessGroup {
        name: "dp".into(),
        members: vec![vec![0, 1]],
    });
    let w = t(&[2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let l = leaves(&[("x", w.clone()), ("w", w)]);
    let err = run_program(&p, &[l.clone(), l], &RunConfig::default()).unwrap_err();
    assert_eq!(err.kind, InterpErrorKind::Deadlock);
    assert!(
        err.message.contains("rank 1 waits in `all_reduce`"),
        "{}",
        err.message
    );
}

#[test]
fn cuts_skip_producers_and_unknown_ops_are_unsupported() {
    let text = r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2]"):
        foo: "f32[2]" = torch.ops.mylib.foo.default(x);  x = None
        neg: "f32[2]" = torch.ops.aten.neg.default(foo);  foo = None
        return (neg,)
"#;
    let g = graph(text);
    // Without a meaning, `mylib.foo` is unsupported, never guessed.
    let err = run_graph(
        &g,
        &leaves(&[("x", t(&[2], &[1.0, 2.0]))]),
        &RunConfig::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind, InterpErrorKind::Unsupported);
    assert!(err.message.contains("mylib.foo"), "{}", err.message);
    // A cut at `foo` skips its producer.
    let env = run_graph(
        &g,
        &leaves(&[("foo", t(&[2], &[1.0, 2.0]))]),
        &RunConfig::default(),
    )
    .unwrap();
    assert_eq!(
        *env.get(g.outputs[0].unwrap()).unwrap().data,
        vec![-1.0, -2.0]
    );
    // Declared as identity, it runs.
    let cfg = RunConfig {
        custom_ops: [("mylib.foo".to_string(), OpMeaning::Identity)].into(),
        ..Default::default()
    };
    let env = run_graph(&g, &leaves(&[("x", t(&[2], &[1.0, 2.0]))]), &cfg).unwrap();
    assert_eq!(
        *env.get(g.outputs[0].unwrap()).unwrap().data,
        vec![-1.0, -2.0]
    );
}

#[test]
fn precision_rounds_every_output() {
    let text = r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[1]"):
        mul: "f32[1]" = torch.ops.aten.mul.Scalar(x, 3.0);  x = None
        return (mul,)
"#;
    let g = graph(text);
    let x = t(&[1], &[0.1]);
    let f64run = run_graph(&g, &leaves(&[("x", x.clone())]), &RunConfig::default()).unwrap();
    let cfg = RunConfig {
        precision: Precision::Bf16,
        ..Default::default()
    };
    let bf16run = run_graph(&g, &leaves(&[("x", x)]), &cfg).unwrap();
    let v = g.outputs[0].unwrap();
    assert!((f64run.get(v).unwrap().data[0] - 0.3).abs() < 1e-15);
    let b = bf16run.get(v).unwrap().data[0];
    assert_eq!(b, half::bf16::from_f64(b).to_f64());
    assert!((b - 0.3).abs() > 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Point-to-point messages (`shardproof_p2p.send` / `recv`).

fn rank_graph(text: &str, path: &str) -> shardproof_ir::Graph {
    shardproof_import::parse_fx(text, Path::new(path))
        .unwrap_or_else(|e| panic!("{e}"))
        .graph
}

/// A program of two ranks on a 1-d `pp` mesh with no process groups.
fn pipeline(r0: &str, r1: &str) -> Program {
    Program {
        mesh: Mesh::new(vec![("pp".into(), 2)]),
        groups: Vec::new(),
        ranks: vec![
            Arc::new(rank_graph(r0, "r0.py")),
            Arc::new(rank_graph(r1, "r1.py")),
        ],
    }
}

/// Rank 0 doubles `x` and sends it to rank 1 with tag 5, then receives the gradient back.
const STAGE0: &str = r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2]"):
        mul: "f32[2]" = torch.ops.aten.mul.Scalar(x, 2.0);  x = None
        send: "f32[2]" = torch.ops.shardproof_p2p.send.default(mul, 1, 5);  mul = None
        recv: "f32[2]" = torch.ops.shardproof_p2p.recv.default([2], torch.float32, 1, 6)
        neg: "f32[2]" = torch.ops.aten.neg.default(recv);  recv = None
        return (neg,)
"#;

/// Rank 1 adds `y` to what it receives and sends the sum back with tag 6.
const STAGE1: &str = r#"
class GraphModule(torch.nn.Module):
    def forward(self, y: "f32[2]"):
        recv: "f32[2]" = torch.ops.shardproof_p2p.recv.default([2], torch.float32, 0, 5)
        add: "f32[2]" = torch.ops.aten.add.Tensor(recv, y);  recv = y = None
        send: "f32[2]" = torch.ops.shardproof_p2p.send.default(add, 0, 6)
        return (add,)
"#;

fn pipeline_leaves() -> Vec<BTreeMap<String, Tensor>> {
    vec![
        leaves(&[("x", t(&[2], &[1.0, 2.0]))]),
        leaves(&[("y", t(&[2], &[10.0, 20.0]))]),
    ]
}

#[test]
fn send_and_recv_move_values_between_ranks() {
    let p = pipeline(STAGE0, STAGE1);
    let envs = run_program(&p, &pipeline_leaves(), &RunConfig::default()).unwrap();
    let out = |r: usize| envs[r].get(p.ranks[r].outputs[0].unwrap()).unwrap();
    // Rank 1: 2x + y; rank 0: -(2x + y), received back.
    assert_eq!(*out(1).data, vec![12.0, 24.0]);
    assert_eq!(*out(0).data, vec![-12.0, -24.0]);
    // A send's result is the tensor it sent.
    let send = p.ranks[0].find("send").unwrap();
    assert_eq!(*envs[0].get(send).unwrap().data, vec![2.0, 4.0]);
}

#[test]
fn recvs_match_sends_per_tag_in_order() {
    // Rank 0 sends a (tag 0), b (tag 1), c (tag 0); rank 1 takes tag 1 first, then the two
    // tag-0 messages in the order they were sent.
    let r0 = r#"
class GraphModule(torch.nn.Module):
    def forward(self, a: "f32[1]", b: "f32[1]", c: "f32[1]"):
        send: "f32[1]" = torch.ops.shardproof_p2p.send.default(a, 1, 0)
        send_1: "f32[1]" = torch.ops.shardproof_p2p.send.default(b, 1, 1)
        send_2: "f32[1]" = torch.ops.shardproof_p2p.send.default(c, 1, 0)
        return (send,)
"#;
    let r1 = r#"
class GraphModule(torch.nn.Module):
    def forward(self):
        recv: "f32[1]" = torch.ops.shardproof_p2p.recv.default([1], torch.float32, 0, 1)
        recv_1: "f32[1]" = torch.ops.shardproof_p2p.recv.default([1], torch.float32, 0, 0)
        recv_2: "f32[1]" = torch.ops.shardproof_p2p.recv.default([1], torch.float32, 0)
        cat: "f32[3]" = torch.ops.aten.cat.default([recv, recv_1, recv_2]);  recv = recv_1 = recv_2 = None
        return (cat,)
"#;
    let p = pipeline(r0, r1);
    let l0 = leaves(&[
        ("a", t(&[1], &[1.0])),
        ("b", t(&[1], &[2.0])),
        ("c", t(&[1], &[3.0])),
    ]);
    let envs = run_program(&p, &[l0, BTreeMap::new()], &RunConfig::default()).unwrap();
    let cat = envs[1].get(p.ranks[1].outputs[0].unwrap()).unwrap();
    assert_eq!(*cat.data, vec![2.0, 1.0, 3.0]);
}

#[test]
fn a_recv_without_its_send_is_reported_not_waited_on() {
    // Rank 1 never sends the gradient back: rank 0's recv can never complete.
    let without_send = STAGE1.replace(
        "        send: \"f32[2]\" = torch.ops.shardproof_p2p.send.default(add, 0, 6)\n",
        "",
    );
    let p = pipeline(STAGE0, &without_send);
    let err = run_program(&p, &pipeline_leaves(), &RunConfig::default()).unwrap_err();
    assert_eq!(err.kind, InterpErrorKind::Deadlock);
    for part in [
        "r0.py:6: node `recv`",
        "waits for a message from rank 1 with tag 6 (f32[2]) that rank 1 never sends",
        "no send to rank 0 with tag 6 is left in its graph, which it has finished",
        "hint:",
    ] {
        assert!(err.message.contains(part), "{part}: {}", err.message);
    }
    // A tag that disagrees is the same: the message is there, under another tag.
    let p = pipeline(STAGE0, &STAGE1.replace("(add, 0, 6)", "(add, 0, 7)"));
    let err = run_program(&p, &pipeline_leaves(), &RunConfig::default()).unwrap_err();
    assert_eq!(err.kind, InterpErrorKind::Deadlock);
    assert!(
        err.message
            .contains("only messages with other tags (1 with tag 7)"),
        "{}",
        err.message
    );
    // Both ranks receive first: rank 0 waits for a tag rank 1 never sends, rank 1 for the
    // activation rank 0 would send after its wait.
    let recv_first = r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2]"):
        recv: "f32[2]" = torch.ops.shardproof_p2p.recv.default([2], torch.float32, 1, 9)
        add: "f32[2]" = torch.ops.aten.add.Tensor(recv, x);  recv = x = None
        send: "f32[2]" = torch.ops.shardproof_p2p.send.default(add, 1, 5)
        return (add,)
"#;
    let p = pipeline(recv_first, STAGE1);
    let err = run_program(&p, &pipeline_leaves(), &RunConfig::default()).unwrap_err();
    assert_eq!(err.kind, InterpErrorKind::Deadlock);
    // Rank 0 waits for tag 9, which rank 1 never sends: that recv leads the report; rank 1
    // waits behind it for a message rank 0 would send later.
    for part in [
        "r0.py:4: node `recv` (shardproof_p2p.recv.default): waits for a message from rank 1 \
         with tag 9 (f32[2]) that rank 1 never sends",
        "rank 1 in `recv` waits for a message from rank 0 with tag 5 (f32[2]) that rank 0 would \
         send only later (`send`), after its own wait",
    ] {
        assert!(err.message.contains(part), "{part}: {}", err.message);
    }
}

#[test]
fn a_send_nobody_receives_is_reported() {
    let twice = STAGE1.replace(
        "        return (add,)",
        "        send_1: \"f32[2]\" = torch.ops.shardproof_p2p.send.default(add, 0, 6)\n        return (add,)",
    );
    let p = pipeline(STAGE0, &twice);
    let err = run_program(&p, &pipeline_leaves(), &RunConfig::default()).unwrap_err();
    assert_eq!(err.kind, InterpErrorKind::Deadlock);
    for part in [
        "r1.py:7: node `send_1`",
        "rank 1 sends a message to rank 0 with tag 6 that no recv takes",
        "hint:",
    ] {
        assert!(err.message.contains(part), "{part}: {}", err.message);
    }
}

#[test]
fn a_recv_of_another_shape_than_its_send_is_a_mismatch() {
    let p = pipeline(
        STAGE0,
        &STAGE1
            .replace("recv: \"f32[2]\"", "recv: \"f32[1, 2]\"")
            .replace(
                "([2], torch.float32, 0, 5)",
                "([1, 2], torch.float32, 0, 5)",
            ),
    );
    let err = run_program(&p, &pipeline_leaves(), &RunConfig::default()).unwrap_err();
    assert_eq!(err.kind, InterpErrorKind::Deadlock);
    for part in [
        "r1.py:4: node `recv`",
        "receives f32[2] from rank 0 with tag 5, but declares f32[1, 2]",
        "r0.py:5: node `send`",
    ] {
        assert!(err.message.contains(part), "{part}: {}", err.message);
    }
    // A peer outside the mesh is invalid input.
    let p = pipeline(&STAGE0.replace("(mul, 1, 5)", "(mul, 2, 5)"), STAGE1);
    let err = run_program(&p, &pipeline_leaves(), &RunConfig::default()).unwrap_err();
    assert_eq!(err.kind, InterpErrorKind::Invalid);
    assert!(
        err.message
            .contains("sends to rank 2, but the program has 2 rank(s)"),
        "{}",
        err.message
    );
}

#[test]
fn a_send_that_cannot_run_skips_its_recv() {
    // Without `x`, rank 0's send has no value: rank 1's recv (and what depends on it) is
    // skipped, as the nodes downstream of a missing leaf are, and nothing waits forever.
    let p = pipeline(STAGE0, STAGE1);
    let l = vec![BTreeMap::new(), pipeline_leaves().remove(1)];
    let envs = run_program(&p, &l, &RunConfig::default()).unwrap();
    assert!(envs[1].get(p.ranks[1].outputs[0].unwrap()).is_none());
    assert!(envs[0].get(p.ranks[0].outputs[0].unwrap()).is_none());
}

#[test]
fn a_single_graph_may_send_to_itself_only() {
    let text = r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2]"):
        send: "f32[2]" = torch.ops.shardproof_p2p.send.default(x, 0, 3)
        recv: "f32[2]" = torch.ops.shardproof_p2p.recv.default([2], torch.float32, 0, 3)
        neg: "f32[2]" = torch.ops.aten.neg.default(recv);  recv = None
        return (neg,)
"#;
    let g = graph(text);
    let l = leaves(&[("x", t(&[2], &[1.0, -3.0]))]);
    let env = run_graph(&g, &l, &RunConfig::default()).unwrap();
    assert_eq!(
        *env.get(g.outputs[0].unwrap()).unwrap().data,
        vec![-1.0, 3.0]
    );
    let err = run_graph(
        &graph(&text.replace("(x, 0, 3)", "(x, 1, 3)")),
        &l,
        &RunConfig::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind, InterpErrorKind::Invalid);
    let err = run_graph(
        &graph(&text.replace("(x, 0, 3)", "(x, 0, 4)")),
        &l,
        &RunConfig::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind, InterpErrorKind::Deadlock);
}

#[test]
fn point_to_point_and_collectives_interleave() {
    // Four ranks: two pipeline stages of two tp ranks. Stage 0 all-reduces over tp, then each
    // tp rank sends its result to the same tp rank of stage 1, which all-reduces again.
    let stage0 = r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[1]"):
        all_reduce: "f32[1]" = torch.ops._c10d_functional.all_reduce.default(x, 'sum', 'tp');  x = None
        wait_tensor: "f32[1]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        send: "f32[1]" = torch.ops.shardproof_p2p.send.default(wait_tensor, DST, 0)
        return (wait_tensor,)
"#;
    let stage1 = r#"
class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[1]"):
        recv: "f32[1]" = torch.ops.shardproof_p2p.recv.default([1], torch.float32, SRC, 0)
        mul: "f32[1]" = torch.ops.aten.mul.Tensor(recv, x);  recv = x = None
        all_reduce: "f32[1]" = torch.ops._c10d_functional.all_reduce.default(mul, 'sum', 'tp');  mul = None
        wait_tensor: "f32[1]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        return (wait_tensor,)
"#;
    let p = Program {
        mesh: Mesh::new(vec![("pp".into(), 2), ("tp".into(), 2)]),
        groups: vec![ProcessGroup {
            name: "tp".into(),
            members: vec![vec![0, 1], vec![2, 3]],
        }],
        // Stage 1 listed first in the rank order would not matter: ranks 2 and 3 wait.
        ranks: [
            stage0.replace("DST", "2"),
            stage0.replace("DST", "3"),
            stage1.replace("SRC", "0"),
            stage1.replace("SRC", "1"),
        ]
        .iter()
        .map(|text| Arc::new(graph(text)))
        .collect(),
    };
    let l = |v: f64| leaves(&[("x", t(&[1], &[v]))]);
    let envs = run_program(
        &p,
        &[l(1.0), l(2.0), l(10.0), l(100.0)],
        &RunConfig::default(),
    )
    .unwrap();
    // Stage 0: 1 + 2 = 3 on both; stage 1: 3 * 10 + 3 * 100 = 330 on both.
    let out = |r: usize| envs[r].get(p.ranks[r].outputs[0].unwrap()).unwrap().data[0];
    assert_eq!([out(0), out(1), out(2), out(3)], [3.0, 3.0, 330.0, 330.0]);
}

#[test]
fn progress_counts_every_node_of_every_rank_collectives_and_messages_included() {
    let progress = std::sync::Arc::new(shardproof_ir::Progress::default());
    let cfg = RunConfig {
        progress: Some(progress.clone()),
        ..Default::default()
    };
    let p = two_rank(graph(MATMUL_ALLREDUCE));
    let nodes: usize = p.ranks.iter().map(|g| g.nodes.len()).sum();
    progress.start(nodes);
    let w = t(&[2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let l = leaves(&[("x", t(&[2, 2], &[1.0, 2.0, 3.0, 4.0])), ("w", w)]);
    run_program(&p, &[l.clone(), l], &cfg).unwrap();
    let (done, total, last) = progress.snapshot();
    assert_eq!((done, total), (nodes, nodes));
    assert_eq!(last, "wait_tensor");
    // Point-to-point: the sends and recvs are passed too.
    let p = pipeline(STAGE0, STAGE1);
    let nodes: usize = p.ranks.iter().map(|g| g.nodes.len()).sum();
    progress.start(nodes);
    run_program(&p, &pipeline_leaves(), &cfg).unwrap();
    assert_eq!(progress.snapshot().0, nodes);
}

/// A 2 x 2 (dp x pp) program: stage graphs `s0` and `s1` on the two pipeline stages of each
/// data-parallel replica, with process group `pp` along the pipeline dim.
fn dp_pipeline(s0: [&str; 2], s1: [&str; 2]) -> Program {
    let mesh = Mesh::new(vec![("dp".into(), 2), ("pp".into(), 2)]);
    Program {
        groups: vec![ProcessGroup {
            name: "pp".into(),
            members: mesh.groups_along(&[1]),
        }],
        mesh,
        ranks: vec![
            Arc::new(rank_graph(s0[0], "r0.py")),
            Arc::new(rank_graph(s1[0], "r1.py")),
            Arc::new(rank_graph(s0[1], "r2.py")),
            Arc::new(rank_graph(s1[1], "r3.py")),
        ],
    }
}

/// The stage graphs of both replicas with global peers (replica 1's stages are ranks 2 and 3).
fn global_stages() -> ([String; 2], [String; 2]) {
    let s0 = |other: usize| {
        STAGE0
            .replace("(mul, 1, 5)", &format!("(mul, {other}, 5)"))
            .replace(
                "torch.float32, 1, 6)",
                &format!("torch.float32, {other}, 6)"),
            )
    };
    let s1 = |other: usize| {
        STAGE1
            .replace(
                "torch.float32, 0, 5)",
                &format!("torch.float32, {other}, 5)"),
            )
            .replace("(add, 0, 6)", &format!("(add, {other}, 6)"))
    };
    ([s0(1), s0(3)], [s1(0), s1(2)])
}

/// The same stage graphs with peers as indices within group `pp`: one text per stage.
fn group_stages() -> (String, String) {
    (
        STAGE0
            .replace("(mul, 1, 5)", "(mul, 1, 5, 'pp')")
            .replace("torch.float32, 1, 6)", "torch.float32, 1, 6, 'pp')"),
        STAGE1
            .replace("torch.float32, 0, 5)", "torch.float32, 0, 5, group = 'pp')")
            .replace("(add, 0, 6)", "(add, 0, 6, 'pp')"),
    )
}

fn dp_pipeline_leaves() -> Vec<BTreeMap<String, Tensor>> {
    vec![
        leaves(&[("x", t(&[2], &[1.0, 2.0]))]),
        leaves(&[("y", t(&[2], &[10.0, 20.0]))]),
        leaves(&[("x", t(&[2], &[3.0, 4.0]))]),
        leaves(&[("y", t(&[2], &[30.0, 40.0]))]),
    ]
}

#[test]
fn group_relative_peers_run_as_their_global_ranks() {
    let (g0, g1) = global_stages();
    let global = dp_pipeline([&g0[0], &g0[1]], [&g1[0], &g1[1]]);
    let (s0, s1) = group_stages();
    let grouped = dp_pipeline([&s0, &s0], [&s1, &s1]);
    let cfg = RunConfig::default();
    let a = run_program(&global, &dp_pipeline_leaves(), &cfg).unwrap();
    let b = run_program(&grouped, &dp_pipeline_leaves(), &cfg).unwrap();
    let outs = |p: &Program, envs: &[shardproof_interp::Env]| -> Vec<Vec<f64>> {
        (0..4)
            .map(|r| {
                envs[r]
                    .get(p.ranks[r].outputs[0].unwrap())
                    .unwrap()
                    .data
                    .to_vec()
            })
            .collect()
    };
    // Replica 1 adds its own y to its own x: the group index reached its own stage.
    assert_eq!(outs(&grouped, &b)[3], vec![36.0, 48.0]);
    assert_eq!(outs(&global, &a), outs(&grouped, &b));
    // The simulated schedule pairs the same messages.
    let none = BTreeMap::new();
    let (sa, sb) = (
        shardproof_interp::schedule(&global, &none, None),
        shardproof_interp::schedule(&grouped, &none, None),
    );
    assert!(sa.problem.is_none() && sb.problem.is_none());
    assert_eq!(sa.messages, sb.messages);
}

#[test]
fn a_group_index_outside_its_group_or_an_unknown_group_is_invalid() {
    let (s0, s1) = group_stages();
    for (bad, want) in [
        ("(mul, 2, 5, 'pp')", "dst = 2 is outside process group `pp`"),
        (
            "(mul, 1, 5, 'cp')",
            "process group `cp` is not one of this rank's groups",
        ),
    ] {
        let wrong = s0.replace("(mul, 1, 5, 'pp')", bad);
        let p = dp_pipeline([&s0, &wrong], [&s1, &s1]);
        let err = run_program(&p, &dp_pipeline_leaves(), &RunConfig::default()).unwrap_err();
        assert_eq!(err.kind, InterpErrorKind::Invalid, "{}", err.message);
        assert!(
            err.message.contains("r2.py:5: node `send`"),
            "{}",
            err.message
        );
        assert!(err.message.contains(want), "{}", err.message);
        let none = BTreeMap::new();
        let sched = shardproof_interp::schedule(&p, &none, None);
        match sched.problem {
            Some(shardproof_interp::ScheduleProblem::Invalid(m)) => {
                assert!(m.contains(want), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }
}
