//! The operator registry: for every known operator, its schema, its shape and dtype inference,
//! and its reference kernel.

use crate::args::{Args, Values};
use crate::schema::Schema;
use crate::tensor::{Meta, Tensor};
use crate::OpError;
use shardproof_ir::OpName;
use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

/// Shape and dtype inference: the metas of the outputs from the bound arguments.
pub type InferFn = fn(&Args) -> Result<Vec<Meta>, OpError>;

/// Reference kernel: the outputs from the bound arguments (with data) and their inferred metas.
pub type EvalFn = fn(&Args, &Meta0, &mut EvalCtx) -> Result<Vec<Tensor>, OpError>;

/// The inferred output metas handed to a kernel, so kernels do not repeat shape logic.
pub type Meta0 = [Meta];

/// What kind of operator an entry is; engines treat the classes differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    /// A deterministic function of its inputs.
    Pure,
    /// Draws random numbers (dropout, rand); deterministic per seed in the interpreter.
    Random,
    /// Communicates across ranks; evaluated by the distributed interpreter, not by a kernel.
    Collective,
    /// Waits for an asynchronous collective; the identity on values.
    Wait,
    /// Point-to-point communication (`send` / `recv` between two ranks); evaluated by the
    /// distributed interpreter, which matches each recv with its send.
    PointToPoint,
}

/// One registered operator.
pub struct OpDef {
    /// Full name, `namespace.name.overload`.
    pub name: OpName,
    /// Signature.
    pub schema: Schema,
    /// Shape and dtype inference.
    pub infer: InferFn,
    /// Reference kernel (collectives and point-to-point operators have none: the distributed
    /// interpreter runs them).
    pub eval: Option<EvalFn>,
    /// Operator class.
    pub class: OpClass,
}

/// Per-call context of a kernel: the seed and identity of the call, for random operators.
#[derive(Clone, Debug)]
pub struct EvalCtx {
    /// The run's seed.
    pub seed: u64,
    /// A stable identity of the call (e.g. the node name), mixed into the seed of random ops.
    pub call_key: String,
}

impl EvalCtx {
    /// A deterministic seed for this call: a hash of the run seed and the call key.
    pub fn call_seed(&self) -> u64 {
        // FNV-1a: stable across platforms and Rust versions, unlike `DefaultHasher`.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ self.seed;
        for b in self.call_key.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }
}

/// The set of known operators.
pub struct Registry {
    ops: BTreeMap<String, OpDef>,
    /// The full names of `ops` by namespace, name and overload: a lookup borrows the parts of
    /// an [`OpName`] instead of formatting its full name. The checker and the schedule look an
    /// operator up once per node per rank (hundreds of millions of times on the 405b plan),
    /// and formatting the key was a third of that time.
    by_parts: HashMap<String, HashMap<String, HashMap<String, String>>>,
}

impl Registry {
    /// An empty registry.
    pub fn empty() -> Self {
        Registry {
            ops: BTreeMap::new(),
            by_parts: HashMap::new(),
        }
    }

    /// The built-in registry of every operator shardproof understands.
    pub fn builtin() -> &'static Registry {
        static REG: OnceLock<Registry> = OnceLock::new();
        REG.get_or_init(|| {
            let mut r = Registry::empty();
            crate::register_all(&mut r);
            r
        })
    }

    /// Registers an operator under `namespace.name.overload` with a torch-style schema
    /// (`mm(Tensor self, Tensor mat2) -> Tensor`; the name part of the schema is informative).
    pub fn add(
        &mut self,
        full_name: &str,
        schema: &str,
        class: OpClass,
        infer: InferFn,
        eval: Option<EvalFn>,
    ) {
        let name = OpName::parse(full_name)
            .unwrap_or_else(|| panic!("bad built-in op name `{full_name}`"));
        let key = name.to_string();
        self.by_parts
            .entry(name.namespace.clone())
            .or_default()
            .entry(name.name.clone())
            .or_default()
            .insert(name.overload.clone(), key.clone());
        let def = OpDef {
            name,
            schema: Schema::parse(schema),
            infer,
            eval,
            class,
        };
        assert!(
            self.ops.insert(key.clone(), def).is_none(),
            "op `{key}` registered twice"
        );
    }

    /// Registers a pure operator with a kernel.
    pub fn pure(&mut self, full_name: &str, schema: &str, infer: InferFn, eval: EvalFn) {
        self.add(full_name, schema, OpClass::Pure, infer, Some(eval));
    }

    /// Looks an operator up; a name printed without an overload matches the `default` overload.
    pub fn get(&self, op: &OpName) -> Option<&OpDef> {
        let overload = if op.overload.is_empty() {
            "default"
        } else {
            op.overload.as_str()
        };
        let key = self
            .by_parts
            .get(op.namespace.as_str())?
            .get(op.name.as_str())?
            .get(overload)?;
        self.ops.get(key)
    }

    /// Every registered operator, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &OpDef> {
        self.ops.values()
    }

    /// Number of registered operators.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the registry is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Infers the output metas of a call.
    pub fn infer(
        &self,
        def: &OpDef,
        args: &[shardproof_ir::Arg],
        kwargs: &[(String, shardproof_ir::Arg)],
        values: &dyn Values,
    ) -> Result<Vec<Meta>, OpError> {
        let bound = Args::bind(&def.schema, args, kwargs, values)?;
        guarded(&def.name, "shape inference", || (def.infer)(&bound))
    }

    /// Runs the kernel of a call: infers output metas, then computes the outputs.
    pub fn eval(
        &self,
        def: &OpDef,
        args: &[shardproof_ir::Arg],
        kwargs: &[(String, shardproof_ir::Arg)],
        values: &dyn Values,
        ctx: &mut EvalCtx,
    ) -> Result<Vec<Tensor>, OpError> {
        check_inputs(&def.name, args, kwargs, values)?;
        let bound = Args::bind(&def.schema, args, kwargs, values)?;
        let metas = guarded(&def.name, "shape inference", || (def.infer)(&bound))?;
        let kernel = def
            .eval
            .ok_or_else(|| OpError::new(format!("{} has no single-graph kernel", def.name)))?;
        check_outputs(&def.name, &metas)?;
        let out = guarded(&def.name, "kernel", || kernel(&bound, &metas, ctx))?;
        debug_assert_eq!(
            out.iter().map(|t| &t.meta).collect::<Vec<_>>(),
            metas.iter().collect::<Vec<_>>(),
            "kernel of {} disagrees with its inference",
            def.name
        );
        Ok(out)
    }

    /// Calls operator `op` (full name) on `tensors`, with arguments that refer to the i-th tensor
    /// as `Arg::Value(ValueId::new(i, 0))`. For tests and for decompositions of custom operators.
    pub fn call(
        &self,
        op: &str,
        tensors: &[Tensor],
        args: &[shardproof_ir::Arg],
        kwargs: &[(String, shardproof_ir::Arg)],
    ) -> Result<Vec<Tensor>, OpError> {
        let name = OpName::parse(op).ok_or_else(|| OpError::new(format!("bad op name `{op}`")))?;
        let def = self
            .get(&name)
            .ok_or_else(|| OpError::new(format!("unknown operator `{op}`")))?;
        let mut ctx = EvalCtx {
            seed: 0,
            call_key: op.to_string(),
        };
        self.eval(
            def,
            args,
            kwargs,
            &crate::args::TensorList(tensors),
            &mut ctx,
        )
    }
}

/// Runs `f` (an operator's shape inference or kernel), turning a panic into an [`OpError`]:
/// the last line of defence that keeps a bug in one operator from aborting a whole run on user
/// input. Sizes are checked before any kernel runs ([`check_inputs`], [`check_outputs`]), so
/// this only catches what those checks cannot foresee.
fn guarded<T>(
    op: &OpName,
    what: &str,
    f: impl FnOnce() -> Result<T, OpError>,
) -> Result<T, OpError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(OpError::new(format!(
            "{op}: internal error in its {what} ({msg}); the arguments are out of what it supports"
        )))
    })
}

/// Checks that every tensor a call reads holds as many elements as its shape says (a tensor
/// built with an overflowing or inconsistent shape would make a kernel index out of bounds).
pub fn check_inputs(
    op: &OpName,
    args: &[shardproof_ir::Arg],
    kwargs: &[(String, shardproof_ir::Arg)],
    values: &dyn Values,
) -> Result<(), OpError> {
    let mut read = Vec::new();
    args.iter().for_each(|a| a.values(&mut read));
    kwargs.iter().for_each(|(_, a)| a.values(&mut read));
    for v in read {
        let Some(t) = values.tensor(v) else { continue };
        check_tensor(op, t)?;
    }
    Ok(())
}

/// Checks that `t` holds exactly as many elements as its shape says.
pub fn check_tensor(op: &OpName, t: &Tensor) -> Result<(), OpError> {
    match t.meta.checked_numel() {
        Some(n) if n == t.data.len() => Ok(()),
        Some(n) => Err(OpError::new(format!(
            "{op}: an input of shape {:?} holds {} elements instead of {n}",
            t.meta.shape,
            t.data.len()
        ))),
        None => Err(OpError::new(format!(
            "{op}: an input of shape {:?} has more elements than 64-bit arithmetic can count",
            t.meta.shape
        ))),
    }
}

/// Element counts above which [`check_outputs`] makes sure the memory can be had before a
/// kernel builds its results (2^24 elements, 128 MiB).
const LARGE_RESULT: usize = 1 << 24;

/// Checks, before a kernel runs, that its results (of `metas`) can be held: their element
/// counts and byte sizes (8 bytes per element: the interpreter stores `f64`s) do not overflow,
/// and, for large results, that the allocator grants that much memory (`try_reserve`), so that a
/// kernel never attempts an absurd allocation. Returns an [`OpError`] naming `op` and the sizes.
pub fn check_outputs(op: &OpName, metas: &[Meta]) -> Result<(), OpError> {
    let mut total: usize = 0;
    for m in metas {
        let n = m
            .checked_numel()
            .filter(|&n| n.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| {
                OpError::new(format!(
                    "{op}: its result of shape {:?} is too large to hold (its size in bytes overflows 64-bit arithmetic)",
                    m.shape
                ))
            })?;
        total = total
            .checked_add(n)
            .filter(|t| t.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| {
                OpError::new(format!(
                    "{op}: its results are too large to hold (their size in bytes overflows 64-bit arithmetic)"
                ))
            })?;
    }
    if total > LARGE_RESULT {
        let mut probe: Vec<f64> = Vec::new();
        if probe.try_reserve_exact(total).is_err() {
            let shapes: Vec<&Vec<usize>> = metas.iter().map(|m| &m.shape).collect();
            return Err(OpError::new(format!(
                "{op}: cannot allocate {} bytes for its results of shapes {shapes:?}",
                total * 8
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardproof_ir::{Arg, DType, ValueId};

    #[test]
    fn call_binds_defaults_and_broadcasts() {
        let r = Registry::builtin();
        let a = Tensor::new(Meta::new(DType::F32, vec![2, 2]), vec![1.0, 2.0, 3.0, 4.0]);
        let b = Tensor::new(Meta::new(DType::F32, vec![2]), vec![10.0, 20.0]);
        let v = |i| Arg::Value(ValueId::new(i, 0));
        let out = r
            .call(
                "aten.add.Tensor",
                &[a.clone(), b.clone()],
                &[v(0), v(1)],
                &[],
            )
            .unwrap();
        assert_eq!(*out[0].data, vec![11.0, 22.0, 13.0, 24.0]);
        let kw = [("alpha".to_string(), Arg::Int(2))];
        let out = r
            .call("aten.add.Tensor", &[a, b], &[v(0), v(1)], &kw)
            .unwrap();
        assert_eq!(*out[0].data, vec![21.0, 42.0, 23.0, 44.0]);
    }

    fn regression_call(op: &str, tensors: &[Tensor], args: &[Arg]) -> String {
        Registry::builtin()
            .call(op, tensors, args, &[])
            .expect_err("expected the call to be refused")
            .0
    }

    #[test]
    fn full_of_absurd_size_is_refused() {
        let e = regression_call(
            "aten.full.default",
            &[],
            &[Arg::List(vec![Arg::Int(i64::MAX)]), Arg::Float(1.0)],
        );
        assert!(
            e.contains("aten.full.default") && e.contains("too large"),
            "{e}"
        );
        // 2^59 f64s (4 EiB) do not overflow, but exceed any address space: no allocator grants
        // them, even with unlimited overcommit.
        let e = regression_call(
            "aten.full.default",
            &[],
            &[
                Arg::List(vec![Arg::Int(1 << 40), Arg::Int(1 << 19)]),
                Arg::Float(1.0),
            ],
        );
        assert!(
            e.contains("aten.full.default") && e.contains("cannot allocate"),
            "{e}"
        );
    }

    #[test]
    fn expand_to_absurd_size_is_refused() {
        let x = Tensor::new(Meta::new(DType::F32, vec![1]), vec![1.0]);
        let e = regression_call(
            "aten.expand.default",
            &[x],
            &[
                Arg::Value(ValueId::new(0, 0)),
                Arg::List(vec![Arg::Int(i64::MAX)]),
            ],
        );
        assert!(
            e.contains("aten.expand.default") && e.contains("too large"),
            "{e}"
        );
    }

    #[test]
    fn inputs_whose_shape_overflows_are_refused() {
        // A [2^62, 16] tensor cannot exist; one that claims that shape (its data empty, as a
        // wrapped element count would make it) is refused instead of indexed out of bounds.
        let x = Tensor {
            meta: Meta::new(DType::F32, vec![1 << 62, 16]),
            data: std::sync::Arc::new(Vec::new()),
        };
        let w = Tensor::new(Meta::new(DType::F32, vec![16, 2]), vec![0.0; 32]);
        let v = |i| Arg::Value(ValueId::new(i, 0));
        let e = regression_call("aten.mm.default", &[x.clone(), w.clone()], &[v(0), v(1)]);
        assert!(e.contains("aten.mm.default") && e.contains("64-bit"), "{e}");
        let e = regression_call("aten.matmul.default", &[x, w], &[v(0), v(1)]);
        assert!(e.contains("aten.matmul.default"), "{e}");
        let short = Tensor {
            meta: Meta::new(DType::F32, vec![4, 16]),
            data: std::sync::Arc::new(vec![0.0; 3]),
        };
        let w = Tensor::new(Meta::new(DType::F32, vec![16, 2]), vec![0.0; 32]);
        let e = regression_call("aten.mm.default", &[short, w], &[v(0), v(1)]);
        assert!(e.contains("holds 3 elements instead of 64"), "{e}");
    }

    #[test]
    fn every_builtin_schema_names_its_op() {
        for def in Registry::builtin().iter() {
            let schema_base = def.schema.name.split('.').next().unwrap();
            assert_eq!(schema_base, def.name.name, "schema name of {}", def.name);
            if !matches!(def.class, OpClass::Collective | OpClass::PointToPoint) {
                assert!(def.eval.is_some(), "{} has no kernel", def.name);
            }
        }
    }
}
