//! The operator registry: for every known operator, its schema, its shape and dtype inference,
//! and its reference kernel.

use crate::args::{Args, Values};
use crate::schema::Schema;
use crate::tensor::{Meta, Tensor};
use crate::OpError;
use shardproof_ir::OpName;
use std::collections::BTreeMap;
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
}

impl Registry {
    /// An empty registry.
    pub fn empty() -> Self {
        Registry {
            ops: BTreeMap::new(),
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
        if op.overload.is_empty() {
            self.ops.get(&format!("{}.default", op.base()))
        } else {
            self.ops.get(&op.to_string())
        }
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
        (def.infer)(&bound)
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
        let bound = Args::bind(&def.schema, args, kwargs, values)?;
        let metas = (def.infer)(&bound)?;
        let kernel = def
            .eval
            .ok_or_else(|| OpError::new(format!("{} has no single-graph kernel", def.name)))?;
        let out = kernel(&bound, &metas, ctx)?;
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
