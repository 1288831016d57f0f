//! Meanings of custom operators declared in a case file (`ops:`), so no Rust is needed to teach
//! shardproof an operator.

use crate::OpName;

/// What a declared custom operator computes.
#[derive(Clone, Debug, PartialEq)]
pub enum OpMeaning {
    /// The output is the first tensor argument (logging, marking and similar no-op operators).
    Identity,
    /// The output is this expression over the call's arguments.
    Decompose(DecompExpr),
}

/// An expression over a custom operator's arguments, e.g. `gelu(add($0, $1))`.
#[derive(Clone, Debug, PartialEq)]
pub enum DecompExpr {
    /// `$i`: the i-th positional argument of the call.
    Arg(usize),
    /// An integer literal argument.
    Int(i64),
    /// A float literal argument.
    Float(f64),
    /// A bool literal argument.
    Bool(bool),
    /// A string literal argument (a reduction such as `'sum'`, a process group's name).
    Str(String),
    /// A list literal argument (e.g. dims `[0, 1]`).
    List(Vec<DecompExpr>),
    /// A call of a registered operator (full name, e.g. `aten.gelu.default`).
    Call {
        /// The operator.
        op: OpName,
        /// Its positional arguments.
        args: Vec<DecompExpr>,
    },
    /// The mapping form of a declaration (`{ args: [...], returns: ..., writes: {...} }`): only
    /// at the top of a meaning. Calls bind keyword arguments by these parameter names, so
    /// `$i` is parameter `i` however the call passes it.
    Signature(Box<Signature>),
}

/// A custom operator's declared parameters, result and in-place writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    /// Parameter names in schema order: `$i` is `params[i]`.
    pub params: Vec<String>,
    /// What the operator returns, when it returns a tensor (`None`: it returns nothing).
    pub returns: Option<DecompExpr>,
    /// The parameters the operator overwrites, in schema order, with their new values over
    /// the call's arguments (as they were before the call).
    pub writes: Vec<(usize, DecompExpr)>,
}

impl Signature {
    /// The call's arguments by parameter: positional ones first, then keyword ones by name
    /// (`None` where the call passes none). `Err` names an unknown keyword.
    pub fn bind(
        &self,
        args: &[crate::Arg],
        kwargs: &[(String, crate::Arg)],
    ) -> Result<Vec<crate::Arg>, String> {
        let mut out: Vec<crate::Arg> = args.to_vec();
        out.resize(self.params.len().max(args.len()), crate::Arg::None);
        for (k, a) in kwargs {
            let i = self.params.iter().position(|p| p == k).ok_or_else(|| {
                format!(
                    "the call passes `{k}`, which is not among the declared `args` ({})",
                    self.params.join(", ")
                )
            })?;
            out[i] = a.clone();
        }
        Ok(out)
    }
}
