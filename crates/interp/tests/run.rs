//! Interpreter tests on small hand-written torch.fx graphs.

use shardproof_interp::{run_graph, run_program, InterpErrorKind, Precision, RunConfig};
use shardproof_ir::{DType, Mesh, OpMeaning, ProcessGroup, Program};
use shardproof_ops::{Meta, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

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
        ranks: vec![g.clone(), g],
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
    p.ranks[1] = graph(&other);
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
