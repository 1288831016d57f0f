//! Hand-built graphs for tests that must not depend on the importer.

#![allow(dead_code)]

use shardproof_case::Case;
use shardproof_ir::{
    Arg, DType, Graph, Node, NodeKind, OpName, Output, SourceError, Span, TensorType, ValueId,
};
use std::path::Path;

/// A small graph builder.
pub struct G(pub Graph);

impl G {
    pub fn new(name: &str) -> Self {
        let mut g = Graph::new(name);
        g.path = Some(format!("{name}.py").into());
        G(g)
    }

    fn push(&mut self, name: &str, kind: NodeKind, shape: Option<&[i64]>) -> ValueId {
        let i = self.0.push(Node {
            name: name.into(),
            kind,
            outputs: vec![Output {
                name: name.into(),
                ty: shape.map(|s| TensorType::new(DType::F32, s)),
            }],
            loc: None,
            line: Some(self.0.nodes.len() + 1),
        });
        ValueId::new(i, 0)
    }

    /// An f32 input.
    pub fn input(mut self, name: &str, shape: &[i64]) -> Self {
        let v = self.push(name, NodeKind::Input, Some(shape));
        self.0.inputs.push(v);
        self
    }

    /// An f32 value computed by `aten.<op>.default` from earlier values.
    pub fn call(mut self, name: &str, op: &str, args: &[&str], shape: &[i64]) -> Self {
        let args = args
            .iter()
            .map(|a| Arg::Value(self.0.find(a).expect("argument defined")))
            .collect();
        self.push(
            name,
            NodeKind::Call {
                op: OpName::new("aten", op, "default"),
                args,
                kwargs: vec![],
            },
            Some(shape),
        );
        self
    }

    /// `_c10d_functional.all_reduce(x, 'sum', group)`.
    pub fn all_reduce(mut self, name: &str, x: &str, group: &str, shape: &[i64]) -> Self {
        let x = self.0.find(x).expect("argument defined");
        self.push(
            name,
            NodeKind::Call {
                op: OpName::new("_c10d_functional", "all_reduce", "default"),
                args: vec![
                    Arg::Value(x),
                    Arg::Str("sum".into()),
                    Arg::Str(group.into()),
                ],
                kwargs: vec![],
            },
            Some(shape),
        );
        self
    }

    /// `_c10d_functional.all_gather_into_tensor(x, size, group)`.
    pub fn all_gather(
        mut self,
        name: &str,
        x: &str,
        size: i64,
        group: &str,
        shape: &[i64],
    ) -> Self {
        let x = self.0.find(x).expect("argument defined");
        self.push(
            name,
            NodeKind::Call {
                op: OpName::new("_c10d_functional", "all_gather_into_tensor", "default"),
                args: vec![Arg::Value(x), Arg::Int(size), Arg::Str(group.into())],
                kwargs: vec![],
            },
            Some(shape),
        );
        self
    }

    /// Marks values as graph outputs.
    pub fn outputs(mut self, names: &[&str]) -> Self {
        for n in names {
            let v = self.0.find(n).expect("output defined");
            self.0.outputs.push(Some(v));
        }
        self
    }

    pub fn build(self) -> Graph {
        self.0.check_structure().expect("well-formed test graph");
        self.0
    }
}

/// A linear layer: spec `y = x @ w.T` with `x: [8, 768]`, `w: [2304, 768]`.
pub fn spec_linear() -> Graph {
    G::new("spec")
        .input("primals_1", &[8, 768])
        .input("primals_4", &[2304, 768])
        .call("t", "t", &["primals_4"], &[768, 2304])
        .call("mm", "mm", &["primals_1", "t"], &[8, 2304])
        .outputs(&["mm"])
        .build()
}

/// One rank of a column-parallel split of [`spec_linear`] with `rows` rows of `primals_4`.
pub fn rank_linear(rank: usize, rows: i64) -> Graph {
    G::new(&format!("r{rank}"))
        .input("primals_1", &[8, 768])
        .input("primals_4", &[rows, 768])
        .call("t", "t", &["primals_4"], &[768, rows])
        .call("mm", "mm", &["primals_1", "t"], &[8, rows])
        .all_gather("all_gather_into_tensor", "mm", 2, "12", &[16, rows])
        .outputs(&["mm"])
        .build()
}

/// Asserts that resolving a case failed in `case.yaml` at `line`:`col` with a message
/// containing `needle` and a hint; returns the error.
#[track_caller]
pub fn assert_error(
    r: Result<Case, SourceError>,
    line: usize,
    col: usize,
    needle: &str,
) -> SourceError {
    let e = r.expect_err("the case must be rejected");
    assert_eq!(e.file, Path::new("case.yaml"));
    assert_eq!(
        e.span,
        Some(Span::new(line, col)),
        "wrong position for: {e}"
    );
    assert!(e.message.contains(needle), "`{needle}` not in: {e}");
    assert!(e.hint.is_some(), "no hint in: {e}");
    e
}
