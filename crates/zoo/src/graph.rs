//! A small graph builder: names values, records their types, and prints torch.fx readable text.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

/// A named value of a graph under construction, with its dtype and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Val {
    /// The value's name in the printed graph.
    pub name: String,
    /// Its shape (empty for a scalar tensor).
    pub shape: Vec<usize>,
    /// Its dtype as torch.fx annotations print it (`f32`, `i64`, `b8`).
    pub dtype: &'static str,
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
    /// A Python boolean.
    B(bool),
    /// A list of values (`cat`'s tensors).
    Vals(Vec<&'a Val>),
    /// Printed verbatim: `None`, `torch.float32`, or a keyword argument `dtype = torch.int64`.
    Raw(&'a str),
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
            Arg::B(b) => if *b { "True" } else { "False" }.to_string(),
            Arg::Vals(vs) => format!(
                "[{}]",
                vs.iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Arg::Raw(r) => r.to_string(),
        }
    }
}

/// Builds one graph: inputs, operator lines with recorded types, and outputs.
#[derive(Default)]
pub struct GraphBuilder {
    inputs: Vec<Val>,
    lines: Vec<String>,
    used: BTreeSet<String>,
    /// Per name hint, the suffix [`GraphBuilder::fresh`] last returned (0: the bare hint).
    /// Names are never released, so the first free suffix of a hint never decreases: resuming
    /// the search here gives the names a search from 0 would, in time linear in the graph
    /// (a 126-layer graph reuses hints like `mm` thousands of times).
    next_suffix: HashMap<String, usize>,
    outputs: Vec<Val>,
    /// Comments printed before the line of the index, in push order: the module annotations
    /// of [`GraphBuilder::end_module`] (`trace emit` records each module's output by them).
    comments: Vec<(usize, String)>,
    /// A module region is open: regions do not nest (an fx comment applies until the next).
    in_module: bool,
}

/// An open module region of a graph: see [`GraphBuilder::begin_module`].
#[must_use = "a module region is closed by `end_module`"]
pub struct ModuleScope {
    start: usize,
    name: String,
    backward: bool,
}

fn ty(dtype: &str, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("\"{dtype}[{}]\"", dims.join(", "))
}

/// The broadcast shape of two operands (numpy rules), or `None` when they do not broadcast.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Some(x),
            (1, y) => Some(y),
            _ => None,
        })
        .collect()
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    fn fresh(&mut self, hint: &str) -> String {
        let mut k = self.next_suffix.get(hint).copied().unwrap_or(0);
        let candidate = |k: usize| {
            if k == 0 {
                hint.to_string()
            } else {
                format!("{hint}_{k}")
            }
        };
        let mut name = candidate(k);
        while self.used.contains(&name) {
            k += 1;
            name = candidate(k);
        }
        self.next_suffix.insert(hint.to_string(), k);
        self.used.insert(name.clone());
        name
    }

    /// Declares a graph input `name` of `shape` (f32).
    pub fn input(&mut self, name: &str, shape: &[usize]) -> Val {
        self.input_typed(name, "f32", shape)
    }

    /// Declares a graph input `name` of `dtype` and `shape`.
    pub fn input_typed(&mut self, name: &str, dtype: &'static str, shape: &[usize]) -> Val {
        let v = Val {
            name: self.fresh(name),
            shape: shape.to_vec(),
            dtype,
        };
        self.inputs.push(v.clone());
        v
    }

    /// Appends `hint: "f32[shape]" = torch.ops.OP(args)`; `op` is e.g. `aten.mm.default`.
    pub fn call(&mut self, hint: &str, op: &str, args: &[Arg], shape: Vec<usize>) -> Val {
        self.call_typed(hint, op, args, "f32", shape)
    }

    /// [`GraphBuilder::call`] with a result dtype other than f32.
    pub fn call_typed(
        &mut self,
        hint: &str,
        op: &str,
        args: &[Arg],
        dtype: &'static str,
        shape: Vec<usize>,
    ) -> Val {
        let name = self.fresh(hint);
        let args: Vec<String> = args.iter().map(Arg::render).collect();
        self.lines.push(format!(
            "{name}: {} = torch.ops.{op}({})",
            ty(dtype, &shape),
            args.join(", ")
        ));
        Val { name, shape, dtype }
    }

    /// A call with several (f32) outputs, printed as torch.fx does: the untyped call, then one
    /// typed line per output, named by `names` (`getitem` where a name is empty).
    pub fn call_multi(
        &mut self,
        hint: &str,
        op: &str,
        args: &[Arg],
        outs: &[(&str, Vec<usize>)],
    ) -> Vec<Val> {
        let typed: Vec<(&str, &'static str, Vec<usize>)> = outs
            .iter()
            .map(|(item, shape)| (*item, "f32", shape.clone()))
            .collect();
        self.call_multi_typed(hint, op, args, &typed)
    }

    /// [`GraphBuilder::call_multi`] with a dtype per output (`topk`: f32 values, i64 indices).
    pub fn call_multi_typed(
        &mut self,
        hint: &str,
        op: &str,
        args: &[Arg],
        outs: &[(&str, &'static str, Vec<usize>)],
    ) -> Vec<Val> {
        let name = self.fresh(hint);
        let rendered: Vec<String> = args.iter().map(Arg::render).collect();
        self.lines
            .push(format!("{name} = torch.ops.{op}({})", rendered.join(", ")));
        outs.iter()
            .enumerate()
            .map(|(i, (item, dtype, shape))| {
                let item = self.fresh(if item.is_empty() { "getitem" } else { item });
                let shape = shape.clone();
                self.lines
                    .push(format!("{item}: {} = {name}[{i}]", ty(dtype, &shape)));
                Val {
                    name: item,
                    shape,
                    dtype,
                }
            })
            .collect()
    }

    /// Opens the region of module `name` (its forward, or with `backward` its backward): the
    /// lines up to [`GraphBuilder::end_module`] are annotated as torch.fx prints the nodes of
    /// `torch.fx.traceback.annotate({...})`, so a trace of the graph can record the module's
    /// output under its canonical name. Regions do not nest.
    pub fn begin_module(&mut self, name: impl Into<String>, backward: bool) -> ModuleScope {
        debug_assert!(!self.in_module, "module regions do not nest");
        self.in_module = true;
        ModuleScope {
            start: self.lines.len(),
            name: name.into(),
            backward,
        }
    }

    /// Closes a module region whose result is `output` (the module's output, or in a backward
    /// region the gradient of its input); with none, the region is left unannotated.
    pub fn end_module(&mut self, scope: ModuleScope, output: Option<&Val>) {
        self.in_module = false;
        let Some(output) = output.filter(|_| scope.start < self.lines.len()) else {
            return;
        };
        let phase = if scope.backward {
            ", 'phase': 'backward'"
        } else {
            ""
        };
        self.comments.push((
            scope.start,
            format!(
                "# Annotation: {{'module': '{}'{phase}, 'output': '{}'}} No stacktrace found for following nodes",
                scope.name, output.name
            ),
        ));
        self.comments.push((
            self.lines.len(),
            "# No stacktrace found for following nodes".to_string(),
        ));
    }

    /// Marks `v` as a graph output (in call order).
    pub fn output(&mut self, v: &Val) {
        self.outputs.push(v.clone());
    }

    /// The graph's outputs so far.
    pub fn outputs(&self) -> &[Val] {
        &self.outputs
    }

    /// Its nodes as torch.fx counts them, less the output node: one per input (placeholder)
    /// and one per printed operator line (a multi-output call and each of its `getitem`s).
    pub fn nodes(&self) -> usize {
        self.inputs.len() + self.lines.len()
    }

    /// The graph as torch.fx readable text.
    pub fn render(&self) -> String {
        let mut s = String::from("class GraphModule(torch.nn.Module):\n    def forward(self");
        for i in &self.inputs {
            let _ = write!(s, ", {}: {}", i.name, ty(i.dtype, &i.shape));
        }
        s.push_str("):\n");
        let mut comments = self.comments.iter().peekable();
        for (i, l) in self.lines.iter().enumerate() {
            while let Some((_, c)) = comments.next_if(|(at, _)| *at <= i) {
                let _ = writeln!(s, "        {c}");
            }
            let _ = writeln!(s, "        {l}");
        }
        let outs: Vec<&str> = self.outputs.iter().map(|v| v.name.as_str()).collect();
        if outs.is_empty() {
            // A pipeline stage that only sends (a forward-only first stage) returns nothing.
            s.push_str("        return ()\n");
        } else {
            let _ = writeln!(s, "        return ({},)", outs.join(", "));
        }
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

    /// A broadcasting binary operator `op` (e.g. `aten.mul.Tensor`) on two values.
    pub fn binary(&mut self, hint: &str, op: &str, a: &Val, b: &Val) -> Val {
        let shape = broadcast(&a.shape, &b.shape)
            .unwrap_or_else(|| panic!("{op}: {:?} and {:?} do not broadcast", a.shape, b.shape));
        self.call(hint, op, &[Arg::V(a), Arg::V(b)], shape)
    }

    /// `aten.add.Tensor` (broadcasting).
    pub fn add(&mut self, a: &Val, b: &Val) -> Val {
        self.binary("add", "aten.add.Tensor", a, b)
    }

    /// `aten.sub.Tensor` (broadcasting).
    pub fn sub(&mut self, hint: &str, a: &Val, b: &Val) -> Val {
        self.binary(hint, "aten.sub.Tensor", a, b)
    }

    /// `aten.mul.Tensor` (broadcasting).
    pub fn mul(&mut self, a: &Val, b: &Val) -> Val {
        self.binary("mul", "aten.mul.Tensor", a, b)
    }

    /// A unary operator `op` whose result has its operand's shape (e.g. `aten.neg.default`).
    pub fn unary(&mut self, hint: &str, op: &str, a: &Val) -> Val {
        self.call(hint, op, &[Arg::V(a)], a.shape.clone())
    }

    /// `aten.view.default(a, shape)`.
    pub fn view(&mut self, a: &Val, shape: &[usize]) -> Val {
        assert_eq!(
            a.shape.iter().product::<usize>(),
            shape.iter().product::<usize>(),
            "view {} {:?} as {shape:?}",
            a.name,
            a.shape
        );
        let dims = shape.iter().map(|&d| d as i64).collect();
        self.call_typed(
            "view",
            "aten.view.default",
            &[Arg::V(a), Arg::Ints(dims)],
            a.dtype,
            shape.to_vec(),
        )
    }

    /// `aten.transpose.int(a, d0, d1)`.
    pub fn transpose(&mut self, a: &Val, d0: usize, d1: usize) -> Val {
        let mut shape = a.shape.clone();
        shape.swap(d0, d1);
        self.call(
            "transpose",
            "aten.transpose.int",
            &[Arg::V(a), Arg::I(d0 as i64), Arg::I(d1 as i64)],
            shape,
        )
    }

    /// `aten.unsqueeze.default(a, dim)`.
    pub fn unsqueeze(&mut self, a: &Val, dim: usize) -> Val {
        let mut shape = a.shape.clone();
        shape.insert(dim, 1);
        self.call_typed(
            "unsqueeze",
            "aten.unsqueeze.default",
            &[Arg::V(a), Arg::I(dim as i64)],
            a.dtype,
            shape,
        )
    }

    /// `aten.expand.default(a, shape)`.
    pub fn expand(&mut self, a: &Val, shape: &[usize]) -> Val {
        let dims = shape.iter().map(|&d| d as i64).collect();
        self.call(
            "expand",
            "aten.expand.default",
            &[Arg::V(a), Arg::Ints(dims)],
            shape.to_vec(),
        )
    }

    /// `aten.clone.default(a, memory_format = torch.contiguous_format)`: what AOTAutograd
    /// emits before viewing a transposed or expanded tensor.
    pub fn contiguous(&mut self, a: &Val) -> Val {
        self.call(
            "clone",
            "aten.clone.default",
            &[
                Arg::V(a),
                Arg::Raw("memory_format = torch.contiguous_format"),
            ],
            a.shape.clone(),
        )
    }

    /// `aten.slice.Tensor(a, dim, start, end)` (of any dtype).
    pub fn slice(&mut self, a: &Val, dim: usize, start: usize, end: usize) -> Val {
        let mut shape = a.shape.clone();
        shape[dim] = end - start;
        self.call_typed(
            "slice",
            "aten.slice.Tensor",
            &[
                Arg::V(a),
                Arg::I(dim as i64),
                Arg::I(start as i64),
                Arg::I(end as i64),
            ],
            a.dtype,
            shape,
        )
    }

    /// `aten.cat.default(parts, dim)`.
    pub fn cat(&mut self, parts: &[&Val], dim: usize) -> Val {
        let mut shape = parts[0].shape.clone();
        shape[dim] = parts.iter().map(|p| p.shape[dim]).sum();
        self.call(
            "cat",
            "aten.cat.default",
            &[Arg::Vals(parts.to_vec()), Arg::I(dim as i64)],
            shape,
        )
    }

    /// `aten.bmm.default`: batched matrix product.
    pub fn bmm(&mut self, a: &Val, b: &Val) -> Val {
        assert_eq!(
            (a.shape[0], a.shape[2]),
            (b.shape[0], b.shape[1]),
            "bmm {} x {}",
            a.name,
            b.name
        );
        self.call(
            "bmm",
            "aten.bmm.default",
            &[Arg::V(a), Arg::V(b)],
            vec![a.shape[0], a.shape[1], b.shape[2]],
        )
    }

    /// `aten.sum.dim_IntList(a, dims, keepdim)` over non-negative `dims`.
    pub fn sum_dims(&mut self, a: &Val, dims: &[usize], keepdim: bool) -> Val {
        let shape = reduced(&a.shape, dims, keepdim);
        let dims = dims.iter().map(|&d| d as i64).collect();
        self.call(
            "sum",
            "aten.sum.dim_IntList",
            &[Arg::V(a), Arg::Ints(dims), Arg::B(keepdim)],
            shape,
        )
    }

    /// `aten.mean.dim(a, [-1], True)`: the mean over the last dim, kept.
    pub fn mean_last(&mut self, a: &Val) -> Val {
        let last = a.shape.len() - 1;
        let shape = reduced(&a.shape, &[last], true);
        self.call(
            "mean",
            "aten.mean.dim",
            &[Arg::V(a), Arg::Ints(vec![-1]), Arg::B(true)],
            shape,
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

    /// `aten.permute.default(a, dims)`.
    pub fn permute(&mut self, a: &Val, dims: &[usize]) -> Val {
        let shape = dims.iter().map(|&d| a.shape[d]).collect();
        let list = dims.iter().map(|&d| d as i64).collect();
        self.call_typed(
            "permute",
            "aten.permute.default",
            &[Arg::V(a), Arg::Ints(list)],
            a.dtype,
            shape,
        )
    }

    /// `aten.addmm.default(bias, a, b)`: `bias + a @ b`, as AOTAutograd prints a linear layer
    /// with a bias.
    pub fn addmm(&mut self, bias: &Val, a: &Val, b: &Val) -> Val {
        assert_eq!(a.shape[1], b.shape[0], "addmm {} x {}", a.name, b.name);
        self.call(
            "addmm",
            "aten.addmm.default",
            &[Arg::V(bias), Arg::V(a), Arg::V(b)],
            vec![a.shape[0], b.shape[1]],
        )
    }

    /// `aten.native_layer_norm.default(x, [last], w, b, eps)` over the last dim: the output,
    /// the per-row mean and the per-row reciprocal standard deviation (both `[.., 1]`).
    pub fn layer_norm(&mut self, x: &Val, w: &Val, b: &Val, eps: f64) -> (Val, Val, Val) {
        let n = *x.shape.last().expect("layer norm of a tensor");
        let mut stats = x.shape.clone();
        *stats.last_mut().expect("non-empty") = 1;
        let outs = self.call_multi(
            "native_layer_norm",
            "aten.native_layer_norm.default",
            &[
                Arg::V(x),
                Arg::Ints(vec![n as i64]),
                Arg::V(w),
                Arg::V(b),
                Arg::F(eps),
            ],
            &[("", x.shape.clone()), ("", stats.clone()), ("", stats)],
        );
        (outs[0].clone(), outs[1].clone(), outs[2].clone())
    }

    /// `aten.native_layer_norm_backward.default` of [`GraphBuilder::layer_norm`]: the
    /// gradients of the input, the weight and the bias.
    pub fn layer_norm_backward(
        &mut self,
        grad: &Val,
        x: &Val,
        mean: &Val,
        rstd: &Val,
        w: &Val,
        b: &Val,
    ) -> (Val, Val, Val) {
        let n = *x.shape.last().expect("layer norm of a tensor");
        let outs = self.call_multi(
            "native_layer_norm_backward",
            "aten.native_layer_norm_backward.default",
            &[
                Arg::V(grad),
                Arg::V(x),
                Arg::Ints(vec![n as i64]),
                Arg::V(mean),
                Arg::V(rstd),
                Arg::V(w),
                Arg::V(b),
                Arg::Raw("[True, True, True]"),
            ],
            &[
                ("", x.shape.clone()),
                ("", w.shape.clone()),
                ("", b.shape.clone()),
            ],
        );
        (outs[0].clone(), outs[1].clone(), outs[2].clone())
    }

    /// `_c10d_functional.all_gather_into_tensor.default(a, size, group)` followed by
    /// `wait_tensor`: the `size` members' tensors concatenated along dim 0.
    pub fn all_gather(&mut self, a: &Val, size: usize, group: &str) -> Val {
        self.all_gather_as("wait_tensor", a, size, group)
    }

    /// [`GraphBuilder::all_gather`] whose result (the `wait_tensor`) is named `name`.
    pub fn all_gather_as(&mut self, name: &str, a: &Val, size: usize, group: &str) -> Val {
        let mut shape = a.shape.clone();
        shape[0] *= size;
        let ag = self.call(
            "all_gather_into_tensor",
            "_c10d_functional.all_gather_into_tensor.default",
            &[Arg::V(a), Arg::I(size as i64), Arg::S(group)],
            shape.clone(),
        );
        self.call(
            name,
            "_c10d_functional.wait_tensor.default",
            &[Arg::V(&ag)],
            shape,
        )
    }

    /// `_c10d_functional.reduce_scatter_tensor.default(a, 'sum', size, group)` followed by
    /// `wait_tensor`: this member's dim-0 chunk of the sum over the `size` members.
    pub fn reduce_scatter_sum(&mut self, a: &Val, size: usize, group: &str) -> Val {
        let mut shape = a.shape.clone();
        assert!(
            shape[0].is_multiple_of(size),
            "reduce_scatter of {:?} over {size}",
            a.shape
        );
        shape[0] /= size;
        let rs = self.call(
            "reduce_scatter_tensor",
            "_c10d_functional.reduce_scatter_tensor.default",
            &[Arg::V(a), Arg::S("sum"), Arg::I(size as i64), Arg::S(group)],
            shape.clone(),
        );
        self.call(
            "wait_tensor",
            "_c10d_functional.wait_tensor.default",
            &[Arg::V(&rs)],
            shape,
        )
    }

    /// `_c10d_functional.all_to_all_single.default(a, splits, splits, group)` with equal
    /// splits (`a`'s dim 0 divided by `size`) followed by `wait_tensor`: this member receives
    /// its chunk of every member's tensor, concatenated along dim 0 in group order.
    pub fn all_to_all(&mut self, a: &Val, size: usize, group: &str) -> Val {
        assert!(
            a.shape[0].is_multiple_of(size),
            "all_to_all of {:?} over {size}",
            a.shape
        );
        let splits = vec![(a.shape[0] / size) as i64; size];
        let a2a = self.call(
            "all_to_all_single",
            "_c10d_functional.all_to_all_single.default",
            &[
                Arg::V(a),
                Arg::Ints(splits.clone()),
                Arg::Ints(splits),
                Arg::S(group),
            ],
            a.shape.clone(),
        );
        self.call(
            "wait_tensor",
            "_c10d_functional.wait_tensor.default",
            &[Arg::V(&a2a)],
            a.shape.clone(),
        )
    }

    /// `_c10d_functional.all_reduce.default(a, 'sum', group)` followed by `wait_tensor`.
    pub fn all_reduce_sum(&mut self, a: &Val, group: &str) -> Val {
        self.all_reduce(a, "sum", group)
    }

    /// `_c10d_functional.all_reduce.default(a, op, group)` (`op`: sum, max, ...) followed by
    /// `wait_tensor`.
    pub fn all_reduce(&mut self, a: &Val, op: &str, group: &str) -> Val {
        let ar = self.call(
            "all_reduce",
            "_c10d_functional.all_reduce.default",
            &[Arg::V(a), Arg::S(op), Arg::S(group)],
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

impl GraphBuilder {
    /// `aten.arange.start(0, n)`: the i64 vector `0, 1, ..., n - 1`.
    pub fn arange(&mut self, n: usize) -> Val {
        self.call_typed(
            "arange",
            "aten.arange.start",
            &[
                Arg::I(0),
                Arg::I(n as i64),
                Arg::Raw("device = device(type='cpu')"),
                Arg::Raw("pin_memory = False"),
            ],
            "i64",
            vec![n],
        )
    }

    /// `aten.full.default(shape, value)`: a new f32 tensor filled with `value`, with the keyword
    /// arguments AOTAutograd prints.
    pub fn full(&mut self, shape: &[usize], value: f64) -> Val {
        self.call(
            "full",
            "aten.full.default",
            &[
                Arg::Ints(shape.iter().map(|&d| d as i64).collect()),
                Arg::F(value),
                Arg::Raw("dtype = torch.float32"),
                Arg::Raw("device = device(type='cpu')"),
                Arg::Raw("pin_memory = False"),
            ],
            shape.to_vec(),
        )
    }
}

impl GraphBuilder {
    /// `shardproof_p2p.send.default(x, dst, tag, group)`: posts `x` to the rank at index `dst`
    /// of this rank's member set of process group `group` (see docs/formats/point-to-point.md),
    /// so that every replica along the other mesh dims writes the same text; the result, the
    /// sent tensor, is a handle nobody reads.
    pub fn send(&mut self, x: &Val, dst: usize, tag: usize, group: &str) -> Val {
        self.call_typed(
            "send",
            "shardproof_p2p.send.default",
            &[
                Arg::V(x),
                Arg::I(dst as i64),
                Arg::I(tag as i64),
                Arg::S(group),
            ],
            x.dtype,
            x.shape.clone(),
        )
    }

    /// `shardproof_p2p.recv.default(shape, torch.float32, src, tag, group)`: the next f32
    /// tensor of `shape` that the rank at index `src` of this rank's member set of `group` sent
    /// to this rank with `tag`.
    pub fn recv(&mut self, shape: &[usize], src: usize, tag: usize, group: &str) -> Val {
        self.call(
            "recv",
            "shardproof_p2p.recv.default",
            &[
                Arg::Ints(shape.iter().map(|&d| d as i64).collect()),
                Arg::Raw("torch.float32"),
                Arg::I(src as i64),
                Arg::I(tag as i64),
                Arg::S(group),
            ],
            shape.to_vec(),
        )
    }
}

/// The shape of a reduction of `shape` over `dims`.
fn reduced(shape: &[usize], dims: &[usize], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (dims.contains(&i), keepdim) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
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

    #[test]
    fn shapes_of_broadcasts_reductions_and_multi_outputs() {
        assert_eq!(broadcast(&[2, 1, 4], &[3, 1]), Some(vec![2, 3, 4]));
        assert_eq!(broadcast(&[4], &[2, 3, 4]), Some(vec![2, 3, 4]));
        assert_eq!(broadcast(&[2, 3], &[3, 2]), None);
        assert_eq!(reduced(&[2, 3, 4], &[0, 1], false), vec![4]);
        assert_eq!(reduced(&[2, 3, 4], &[2], true), vec![2, 3, 1]);
        let mut g = GraphBuilder::new();
        let x = g.input("x", &[4, 5]);
        let idx = g.input_typed("idx", "i64", &[4]);
        let outs = g.call_multi(
            "nll",
            "aten.nll_loss_forward.default",
            &[
                Arg::V(&x),
                Arg::V(&idx),
                Arg::Raw("None"),
                Arg::I(1),
                Arg::I(-100),
            ],
            &[("", vec![]), ("total_weight", vec![])],
        );
        let v = g.view(&idx, &[2, 2]);
        assert_eq!(v.dtype, "i64");
        g.output(&outs[0]);
        let text = g.render();
        assert!(text.contains("idx: \"i64[4]\""), "{text}");
        assert!(
            text.contains("nll = torch.ops.aten.nll_loss_forward.default(x, idx, None, 1, -100)"),
            "{text}"
        );
        assert!(text.contains("total_weight: \"f32[]\" = nll[1]"), "{text}");
        assert!(text.contains("view: \"i64[2, 2]\""), "{text}");
    }

    #[test]
    fn layer_norm_linears_and_sequence_collectives() {
        let mut g = GraphBuilder::new();
        let x = g.input("x", &[4, 2, 6]);
        let (w, b) = (g.input("w", &[6]), g.input("b", &[6]));
        let (y, mean, rstd) = g.layer_norm(&x, &w, &b, 1e-5);
        assert_eq!(
            (y.shape.clone(), mean.shape.clone()),
            (vec![4, 2, 6], vec![4, 2, 1])
        );
        let (gx, gw, gb) = g.layer_norm_backward(&y, &x, &mean, &rstd, &w, &b);
        assert_eq!(
            (gx.shape, gw.shape, gb.shape),
            (vec![4, 2, 6], vec![6], vec![6])
        );
        let p = g.permute(&x, &[2, 0, 1]);
        assert_eq!(p.shape, vec![6, 4, 2]);
        let gathered = g.all_gather(&x, 2, "tp");
        assert_eq!(gathered.shape, vec![8, 2, 6]);
        let scattered = g.reduce_scatter_sum(&gathered, 4, "tp");
        assert_eq!(scattered.shape, vec![2, 2, 6]);
        let x2 = g.view(&x, &[8, 6]);
        let wt = g.input("wt", &[6, 3]);
        let bias = g.input("bias", &[3]);
        assert_eq!(g.addmm(&bias, &x2, &wt).shape, vec![8, 3]);
        let text = g.render();
        for line in [
            "torch.ops.aten.native_layer_norm.default(x, [6], w, b, 1e-5)",
            "torch.ops.aten.native_layer_norm_backward.default(getitem, x, [6], getitem_1, \
             getitem_2, w, b, [True, True, True])",
            "torch.ops._c10d_functional.all_gather_into_tensor.default(x, 2, 'tp')",
            "torch.ops._c10d_functional.reduce_scatter_tensor.default(wait_tensor, 'sum', 4, 'tp')",
            "torch.ops.aten.addmm.default(bias, view, wt)",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
    }
}
