//! A small graph builder: names values, records their types, and prints torch.fx readable text.

use std::collections::BTreeSet;
use std::fmt::Write as _;

/// A named value of a graph under construction, with its (f32) shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Val {
    /// The value's name in the printed graph.
    pub name: String,
    /// Its shape (empty for a scalar tensor).
    pub shape: Vec<usize>,
}

/// An argument of an operator call.
#[derive(Clone, Debug)]
pub enum Arg<'a> {
    /// A value of the graph.
    V(&'a Val),
    /// An integer literal.
    I(i64),
    /// A float literal.
    F(f64),
    /// A list of integers.
    Ints(Vec<i64>),
    /// A quoted string (reduce ops, group names).
    S(&'a str),
}

impl Arg<'_> {
    fn render(&self) -> String {
        match self {
            Arg::V(v) => v.name.clone(),
            Arg::I(i) => i.to_string(),
            Arg::F(f) => format!("{f:?}"),
            Arg::Ints(l) => format!(
                "[{}]",
                l.iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Arg::S(s) => format!("'{s}'"),
        }
    }
}

/// Builds one graph: inputs, operator lines with recorded types, and outputs.
#[derive(Default)]
pub struct GraphBuilder {
    inputs: Vec<Val>,
    lines: Vec<String>,
    used: BTreeSet<String>,
    outputs: Vec<Val>,
}

fn ty(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("\"f32[{}]\"", dims.join(", "))
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    fn fresh(&mut self, hint: &str) -> String {
        let mut name = hint.to_string();
        let mut k = 0;
        while self.used.contains(&name) {
            k += 1;
            name = format!("{hint}_{k}");
        }
        self.used.insert(name.clone());
        name
    }

    /// Declares a graph input `name` of `shape`.
    pub fn input(&mut self, name: &str, shape: &[usize]) -> Val {
        let v = Val {
            name: self.fresh(name),
            shape: shape.to_vec(),
        };
        self.inputs.push(v.clone());
        v
    }

    /// Appends `hint: "f32[shape]" = torch.ops.OP(args)`; `op` is e.g. `aten.mm.default`.
    pub fn call(&mut self, hint: &str, op: &str, args: &[Arg], shape: Vec<usize>) -> Val {
        let name = self.fresh(hint);
        let args: Vec<String> = args.iter().map(Arg::render).collect();
        self.lines.push(format!(
            "{name}: {} = torch.ops.{op}({})",
            ty(&shape),
            args.join(", ")
        ));
        Val { name, shape }
    }

    /// Marks `v` as a graph output (in call order).
    pub fn output(&mut self, v: &Val) {
        self.outputs.push(v.clone());
    }

    /// The graph's outputs so far.
    pub fn outputs(&self) -> &[Val] {
        &self.outputs
    }

    /// The graph as torch.fx readable text.
    pub fn render(&self) -> String {
        let mut s = String::from("class GraphModule(torch.nn.Module):\n    def forward(self");
        for i in &self.inputs {
            let _ = write!(s, ", {}: {}", i.name, ty(&i.shape));
        }
        s.push_str("):\n");
        for l in &self.lines {
            let _ = writeln!(s, "        {l}");
        }
        let outs: Vec<&str> = self.outputs.iter().map(|v| v.name.as_str()).collect();
        let _ = writeln!(s, "        return ({},)", outs.join(", "));
        s
    }

    // -----------------------------------------------------------------------------------------
    // Operators, with their result shapes.

    /// `aten.t.default`: transpose of a matrix.
    pub fn t(&mut self, a: &Val) -> Val {
        self.call(
            "t",
            "aten.t.default",
            &[Arg::V(a)],
            vec![a.shape[1], a.shape[0]],
        )
    }

    /// `aten.mm.default`: matrix product.
    pub fn mm(&mut self, a: &Val, b: &Val) -> Val {
        assert_eq!(a.shape[1], b.shape[0], "mm {} x {}", a.name, b.name);
        self.call(
            "mm",
            "aten.mm.default",
            &[Arg::V(a), Arg::V(b)],
            vec![a.shape[0], b.shape[1]],
        )
    }

    /// `aten.add.Tensor` (the result has the first operand's shape; the second broadcasts).
    pub fn add(&mut self, a: &Val, b: &Val) -> Val {
        self.call(
            "add",
            "aten.add.Tensor",
            &[Arg::V(a), Arg::V(b)],
            a.shape.clone(),
        )
    }

    /// `aten.sub.Tensor` (the result has the first operand's shape).
    pub fn sub(&mut self, hint: &str, a: &Val, b: &Val) -> Val {
        self.call(
            hint,
            "aten.sub.Tensor",
            &[Arg::V(a), Arg::V(b)],
            a.shape.clone(),
        )
    }

    /// `aten.relu.default`.
    pub fn relu(&mut self, a: &Val) -> Val {
        self.call("relu", "aten.relu.default", &[Arg::V(a)], a.shape.clone())
    }

    /// `aten.threshold_backward.default(grad, out, 0)`: the gradient of relu.
    pub fn relu_backward(&mut self, grad: &Val, out: &Val) -> Val {
        self.call(
            "threshold_backward",
            "aten.threshold_backward.default",
            &[Arg::V(grad), Arg::V(out), Arg::I(0)],
            grad.shape.clone(),
        )
    }

    /// `aten.pow.Tensor_Scalar(a, 2)`.
    pub fn square(&mut self, a: &Val) -> Val {
        self.call(
            "pow",
            "aten.pow.Tensor_Scalar",
            &[Arg::V(a), Arg::I(2)],
            a.shape.clone(),
        )
    }

    /// `aten.mean.default`: the mean of every element.
    pub fn mean(&mut self, hint: &str, a: &Val) -> Val {
        self.call(hint, "aten.mean.default", &[Arg::V(a)], vec![])
    }

    /// `aten.sum.dim_IntList(a, [0])`: the sum over the leading dim.
    pub fn sum0(&mut self, a: &Val) -> Val {
        self.call(
            "sum",
            "aten.sum.dim_IntList",
            &[Arg::V(a), Arg::Ints(vec![0])],
            a.shape[1..].to_vec(),
        )
    }

    /// `aten.mul.Scalar`.
    pub fn mul_scalar(&mut self, hint: &str, a: &Val, s: Arg) -> Val {
        self.call(hint, "aten.mul.Scalar", &[Arg::V(a), s], a.shape.clone())
    }

    /// `aten.div.Scalar`.
    pub fn div_scalar(&mut self, hint: &str, a: &Val, s: Arg) -> Val {
        self.call(hint, "aten.div.Scalar", &[Arg::V(a), s], a.shape.clone())
    }

    /// `_c10d_functional.all_reduce.default(a, 'sum', group)` followed by `wait_tensor`.
    pub fn all_reduce_sum(&mut self, a: &Val, group: &str) -> Val {
        let ar = self.call(
            "all_reduce",
            "_c10d_functional.all_reduce.default",
            &[Arg::V(a), Arg::S("sum"), Arg::S(group)],
            a.shape.clone(),
        );
        self.call(
            "wait_tensor",
            "_c10d_functional.wait_tensor.default",
            &[Arg::V(&ar)],
            a.shape.clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_typed() {
        let mut g = GraphBuilder::new();
        let x = g.input("x", &[2, 3]);
        let a = g.t(&x);
        let b = g.t(&a);
        assert_eq!((a.name.as_str(), b.name.as_str()), ("t", "t_1"));
        let c = g.call("t_1", "aten.t.default", &[Arg::V(&b)], vec![3, 2]);
        assert_ne!(c.name, b.name);
        g.output(&c);
        let text = g.render();
        assert!(
            text.contains("def forward(self, x: \"f32[2, 3]\"):"),
            "{text}"
        );
        assert!(
            text.contains("t: \"f32[3, 2]\" = torch.ops.aten.t.default(x)"),
            "{text}"
        );
        assert!(text.ends_with(&format!("return ({},)\n", c.name)), "{text}");
    }
}
