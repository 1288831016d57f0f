//! Binding the arguments of a call to an operator's schema, and typed access to them.

use crate::schema::{ArgType, Schema};
use crate::tensor::{Meta, Tensor};
use crate::OpError;
use shardproof_ir::{Arg, DType, ValueId};

/// Where the tensors a call refers to come from: the interpreter's environment (metas and
/// data), or shape inference (metas only).
pub trait Values {
    /// Shape and dtype of value `v`, if known.
    fn meta(&self, v: ValueId) -> Option<Meta>;
    /// Data of value `v`; `None` during shape inference.
    fn tensor(&self, v: ValueId) -> Option<&Tensor>;
}

/// The arguments of one call, bound to the operator's schema by position and keyword.
pub struct Args<'a> {
    schema: &'a Schema,
    bound: Vec<Option<&'a Arg>>,
    values: &'a dyn Values,
}

impl<'a> Args<'a> {
    /// Binds positional and keyword arguments to `schema`.
    pub fn bind(
        schema: &'a Schema,
        args: &'a [Arg],
        kwargs: &'a [(String, Arg)],
        values: &'a dyn Values,
    ) -> Result<Args<'a>, OpError> {
        let mut bound: Vec<Option<&Arg>> = vec![None; schema.args.len()];
        let positional: Vec<usize> = (0..schema.args.len())
            .filter(|&i| !schema.args[i].kw_only)
            .collect();
        if args.len() > positional.len() && !schema.variadic {
            return Err(OpError::new(format!(
                "{} takes {} positional arguments but {} were given",
                schema.name,
                positional.len(),
                args.len()
            )));
        }
        for (a, &i) in args.iter().zip(&positional) {
            bound[i] = Some(a);
        }
        for (k, a) in kwargs {
            match schema.index_of(k) {
                Some(i) if bound[i].is_some() => {
                    return Err(OpError::new(format!(
                        "{}: argument `{k}` given twice",
                        schema.name
                    )))
                }
                Some(i) => bound[i] = Some(a),
                None if schema.variadic => {}
                None => {
                    let names: Vec<&str> = schema.args.iter().map(|a| a.name.as_str()).collect();
                    return Err(OpError::new(format!(
                        "{}: unknown keyword argument `{k}` (expected one of: {})",
                        schema.name,
                        names.join(", ")
                    )));
                }
            }
        }
        for (i, sa) in schema.args.iter().enumerate() {
            if bound[i].is_none() && sa.default.is_none() && !sa.optional {
                return Err(OpError::new(format!(
                    "{}: missing required argument `{}`",
                    schema.name, sa.name
                )));
            }
        }
        Ok(Args {
            schema,
            bound,
            values,
        })
    }

    /// The schema these arguments are bound to.
    pub fn schema(&self) -> &Schema {
        self.schema
    }

    /// Whether tensor data is available (evaluation) or only metas (shape inference).
    pub fn has_data(&self) -> bool {
        self.values()
            .next()
            .is_some_and(|v| self.values.tensor(v).is_some())
    }

    fn values(&self) -> impl Iterator<Item = ValueId> + '_ {
        let mut vs = Vec::new();
        for a in self.bound.iter().flatten() {
            a.values(&mut vs);
        }
        vs.into_iter()
    }

    fn index(&self, name: &str) -> usize {
        self.schema
            .index_of(name)
            .unwrap_or_else(|| panic!("{} has no argument `{name}`", self.schema.name))
    }

    /// The argument as given, or its schema default; `None` when absent or `None`.
    pub fn get(&self, name: &str) -> Option<Arg> {
        let i = self.index(name);
        let arg = match self.bound[i] {
            Some(a) => a.clone(),
            None => parse_default(
                self.schema.args[i].default.as_deref()?,
                &self.schema.args[i].ty,
            )?,
        };
        match arg {
            Arg::None => None,
            a => Some(a),
        }
    }

    fn err(&self, name: &str, expected: &str, got: Option<&Arg>) -> OpError {
        OpError::new(format!(
            "{}: argument `{name}` should be {expected}, got {}",
            self.schema.name,
            got.map_or("nothing".to_string(), |a| format!("{a:?}"))
        ))
    }

    fn value_of(&self, name: &str) -> Result<Option<ValueId>, OpError> {
        match self.get(name) {
            None => Ok(None),
            Some(Arg::Value(v)) => Ok(Some(v)),
            Some(a) => Err(self.err(name, "a tensor", Some(&a))),
        }
    }

    /// A required tensor argument's data.
    pub fn tensor(&self, name: &str) -> Result<&'a Tensor, OpError> {
        self.opt_tensor(name)?
            .ok_or_else(|| self.err(name, "a tensor", None))
    }

    /// An optional tensor argument's data.
    pub fn opt_tensor(&self, name: &str) -> Result<Option<&'a Tensor>, OpError> {
        resolve(
            self.value_of(name)?,
            |v| self.values.tensor(v),
            || format!("no data for tensor argument `{name}`"),
        )
    }

    /// A required tensor argument's meta.
    pub fn meta(&self, name: &str) -> Result<Meta, OpError> {
        self.opt_meta(name)?
            .ok_or_else(|| self.err(name, "a tensor", None))
    }

    /// An optional tensor argument's meta.
    pub fn opt_meta(&self, name: &str) -> Result<Option<Meta>, OpError> {
        resolve(
            self.value_of(name)?,
            |v| self.values.meta(v),
            || format!("unknown shape for tensor argument `{name}`"),
        )
    }

    fn list_values(&self, name: &str) -> Result<Vec<Option<ValueId>>, OpError> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Arg::List(items)) => items
                .iter()
                .map(|a| match a {
                    Arg::None => Ok(None),
                    Arg::Value(v) => Ok(Some(*v)),
                    other => Err(self.err(name, "a list of tensors", Some(other))),
                })
                .collect(),
            Some(Arg::Value(v)) => Ok(vec![Some(v)]),
            Some(a) => Err(self.err(name, "a list of tensors", Some(&a))),
        }
    }

    /// A tensor-list argument's data (`None` entries for `Tensor?[]`).
    pub fn tensors(&self, name: &str) -> Result<Vec<Option<&'a Tensor>>, OpError> {
        self.list_values(name)?
            .into_iter()
            .map(|v| {
                resolve(
                    v,
                    |v| self.values.tensor(v),
                    || format!("no data for tensor in `{name}`"),
                )
            })
            .collect()
    }

    /// A tensor-list argument's metas.
    pub fn metas(&self, name: &str) -> Result<Vec<Option<Meta>>, OpError> {
        self.list_values(name)?
            .into_iter()
            .map(|v| {
                resolve(
                    v,
                    |v| self.values.meta(v),
                    || format!("unknown shape for tensor in `{name}`"),
                )
            })
            .collect()
    }

    /// An optional argument converted by `f`, or an error saying it should be `what`.
    fn opt_conv<T>(
        &self,
        name: &str,
        what: &str,
        f: impl FnOnce(&Arg) -> Option<T>,
    ) -> Result<Option<T>, OpError> {
        self.get(name)
            .map(|a| f(&a).ok_or_else(|| self.err(name, what, Some(&a))))
            .transpose()
    }

    /// A required integer.
    pub fn int(&self, name: &str) -> Result<i64, OpError> {
        self.opt_int(name)?
            .ok_or_else(|| self.err(name, "an int", None))
    }

    /// An optional integer.
    pub fn opt_int(&self, name: &str) -> Result<Option<i64>, OpError> {
        self.opt_conv(name, "an int", Arg::as_int)
    }

    /// A required list of integers (a single int counts as a one-element list).
    pub fn int_list(&self, name: &str) -> Result<Vec<i64>, OpError> {
        self.opt_int_list(name)?
            .ok_or_else(|| self.err(name, "a list of ints", None))
    }

    /// An optional list of integers.
    pub fn opt_int_list(&self, name: &str) -> Result<Option<Vec<i64>>, OpError> {
        self.opt_conv(name, "a list of ints", Arg::as_int_list)
    }

    /// A required number (int, float or bool; `Scalar` arguments too).
    pub fn float(&self, name: &str) -> Result<f64, OpError> {
        self.opt_float(name)?
            .ok_or_else(|| self.err(name, "a number", None))
    }

    /// An optional number.
    pub fn opt_float(&self, name: &str) -> Result<Option<f64>, OpError> {
        self.opt_conv(name, "a number", Arg::as_f64)
    }

    /// Whether a `Scalar` argument was written as a float (it decides the result dtype of
    /// integer-tensor arithmetic, as in torch).
    pub fn scalar_is_float(&self, name: &str) -> bool {
        matches!(self.get(name), Some(Arg::Float(_)))
    }

    /// A required bool.
    pub fn bool(&self, name: &str) -> Result<bool, OpError> {
        match self.get(name) {
            Some(Arg::Bool(b)) => Ok(b),
            Some(Arg::Int(i)) => Ok(i != 0),
            other => Err(self.err(name, "a bool", other.as_ref())),
        }
    }

    /// A required string.
    pub fn str(&self, name: &str) -> Result<String, OpError> {
        match self.get(name) {
            Some(Arg::Str(s)) => Ok(s),
            other => Err(self.err(name, "a string", other.as_ref())),
        }
    }

    /// An optional dtype.
    pub fn dtype(&self, name: &str) -> Result<Option<DType>, OpError> {
        match self.get(name) {
            None => Ok(None),
            Some(Arg::Dtype(d)) => Ok(Some(d)),
            Some(a) => Err(self.err(name, "a dtype", Some(&a))),
        }
    }
}

/// Looks an optional value up with `f`; a value `f` knows nothing about is an error.
fn resolve<T>(
    v: Option<ValueId>,
    f: impl FnOnce(ValueId) -> Option<T>,
    missing: impl FnOnce() -> String,
) -> Result<Option<T>, OpError> {
    v.map(|v| f(v).ok_or_else(|| OpError::new(missing())))
        .transpose()
}

/// Parses a schema default (`False`, `1`, `-1`, `1e-05`, `[]`, `[0, 1]`, `"mean"`, `None`).
fn parse_default(text: &str, ty: &ArgType) -> Option<Arg> {
    let t = text.trim();
    Some(match t {
        "None" => Arg::None,
        "True" => Arg::Bool(true),
        "False" => Arg::Bool(false),
        _ if t.starts_with('[') => {
            let inner = t.trim_start_matches('[').trim_end_matches(']');
            Arg::List(
                inner
                    .split(',')
                    .filter(|s| !s.trim().is_empty())
                    .map(|s| parse_default(s, &ArgType::Int))
                    .collect::<Option<Vec<_>>>()?,
            )
        }
        _ if t.starts_with('"') || t.starts_with('\'') => Arg::Str(t[1..t.len() - 1].to_string()),
        _ => match (t.parse::<i64>(), ty) {
            (Ok(i), ArgType::Float) => Arg::Float(i as f64),
            (Ok(i), _) => Arg::Int(i),
            (Err(_), _) => Arg::Float(t.parse().ok()?),
        },
    })
}

/// Values for binding a call whose literals alone matter (group names, peers, tags, defaults):
/// no value's meta or data is known.
pub struct NoValues;

impl Values for NoValues {
    fn meta(&self, _: ValueId) -> Option<Meta> {
        None
    }
    fn tensor(&self, _: ValueId) -> Option<&Tensor> {
        None
    }
}

/// Every schema argument of a call in schema order: the argument given (by position or
/// keyword), else its default, else `None`. Two calls with equal normalized arguments are the
/// same call however they were written.
pub fn normalize_args(
    schema: &Schema,
    args: &[Arg],
    kwargs: &[(String, Arg)],
) -> Result<Vec<Arg>, OpError> {
    let bound = Args::bind(schema, args, kwargs, &NoValues)?;
    Ok((0..schema.args.len())
        .map(|i| match bound.bound[i] {
            Some(a) => a.clone(),
            None => schema.args[i]
                .default
                .as_deref()
                .and_then(|d| parse_default(d, &schema.args[i].ty))
                .unwrap_or(Arg::None),
        })
        .collect())
}

/// A list of tensors addressed as values: `ValueId { node: i, output: 0 }` is the i-th tensor.
/// Handy for calling kernels outside a graph (tests, decompositions of custom operators).
pub struct TensorList<'t>(pub &'t [Tensor]);

impl Values for TensorList<'_> {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.0.get(v.node).map(|t| t.meta.clone())
    }
    fn tensor(&self, v: ValueId) -> Option<&Tensor> {
        self.0.get(v.node)
    }
}
