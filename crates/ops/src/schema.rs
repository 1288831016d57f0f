//! Operator signatures in torch's schema syntax, e.g.
//! `sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor`.
//!
//! Parsed by hand: the syntax is small and fixed, and no crate parses it.

use std::fmt;

/// The type of one schema argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgType {
    /// `Tensor`.
    Tensor,
    /// `Tensor[]` (and `Tensor?[]`, whose entries may be `None`).
    TensorList,
    /// `int` / `SymInt`.
    Int,
    /// `int[]` / `SymInt[]` / `int[N]`.
    IntList,
    /// `float`.
    Float,
    /// `float[]`.
    FloatList,
    /// `Scalar`: int, float or bool.
    Scalar,
    /// `bool`.
    Bool,
    /// `bool[]`.
    BoolList,
    /// `str`.
    Str,
    /// `ScalarType` (a dtype).
    ScalarType,
    /// `Layout`, `Device`, `MemoryFormat`, `Generator`: carried but never computed with.
    Opaque,
    /// `Any` (e.g. the operator argument of `auto_functionalized_v2`).
    Any,
}

/// One argument of a schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaArg {
    /// Argument name.
    pub name: String,
    /// Argument type.
    pub ty: ArgType,
    /// Whether `None` is accepted (`Tensor?`, `int[]?`).
    pub optional: bool,
    /// Default value as written in the schema (`False`, `1`, `None`, `[]`).
    pub default: Option<String>,
    /// Whether the argument must be passed by keyword (after `*`).
    pub kw_only: bool,
}

/// A parsed operator schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    /// `name.overload` as written.
    pub name: String,
    /// Arguments in order.
    pub args: Vec<SchemaArg>,
    /// Whether extra positional/keyword arguments are accepted (`...`).
    pub variadic: bool,
    /// Return types as written (`Tensor`, `Tensor[]`, ...).
    pub returns: Vec<String>,
}

impl Schema {
    /// Parses a schema string; panics on a malformed built-in schema (a programming error caught
    /// by the registry's own tests, never by user input).
    pub fn parse(s: &str) -> Schema {
        Self::try_parse(s).unwrap_or_else(|e| panic!("bad built-in schema `{s}`: {e}"))
    }

    /// Parses a schema string.
    pub fn try_parse(s: &str) -> Result<Schema, String> {
        let open = s.find('(').ok_or("missing `(`")?;
        let close = s
            .rfind(") ->")
            .or_else(|| s.rfind(')'))
            .ok_or("missing `)`")?;
        let name = s[..open].trim().to_string();
        let args_text = &s[open + 1..close];
        let ret_text = s[close + 1..].trim().trim_start_matches("->").trim();
        let mut args = Vec::new();
        let mut kw_only = false;
        let mut variadic = false;
        for part in split_top(args_text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            if part == "*" {
                kw_only = true;
                continue;
            }
            if part == "..." {
                variadic = true;
                continue;
            }
            let (decl, default) = match part.split_once('=') {
                Some((d, v)) => (d.trim(), Some(v.trim().to_string())),
                None => (part, None),
            };
            let (ty_text, arg_name) = decl.rsplit_once(' ').ok_or(format!("bad arg `{part}`"))?;
            let ty_text = ty_text.trim();
            let optional = ty_text.ends_with('?');
            let base = ty_text.trim_end_matches('?');
            let ty = parse_type(base).ok_or(format!("unknown type `{ty_text}`"))?;
            args.push(SchemaArg {
                name: arg_name.trim().to_string(),
                ty,
                optional,
                default,
                kw_only,
            });
        }
        // `(Tensor values, Tensor indices)` and `()` are tuples; `Tensor(a!)` is not.
        let ret = match ret_text.strip_prefix('(') {
            Some(inner) => inner.strip_suffix(')').unwrap_or(inner),
            None => ret_text,
        };
        let returns = split_top(ret)
            .into_iter()
            .map(|r| r.trim().to_string())
            .filter(|r| !r.is_empty())
            .collect();
        Ok(Schema {
            name,
            args,
            variadic,
            returns,
        })
    }

    /// Position of a named argument.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.args.iter().position(|a| a.name == name)
    }
}

fn parse_type(t: &str) -> Option<ArgType> {
    // Alias annotations (`Tensor(a!)`, `Tensor(a -> *)[]`) say how outputs share storage; a
    // functional interpreter has no use for them.
    let t = match (t.find('('), t.rfind(')')) {
        (Some(open), Some(close)) if open < close => format!("{}{}", &t[..open], &t[close + 1..]),
        _ => t.to_string(),
    };
    let t = t.trim();
    let list = t.ends_with(']');
    let elem = t.split('[').next()?.trim_end_matches('?');
    Some(match (elem, list) {
        ("Tensor", false) => ArgType::Tensor,
        ("Tensor", true) => ArgType::TensorList,
        ("int" | "SymInt", false) => ArgType::Int,
        ("int" | "SymInt", true) => ArgType::IntList,
        ("float", false) => ArgType::Float,
        ("float", true) => ArgType::FloatList,
        ("Scalar", false) => ArgType::Scalar,
        ("bool", false) => ArgType::Bool,
        ("bool", true) => ArgType::BoolList,
        ("str", false) => ArgType::Str,
        ("ScalarType", false) => ArgType::ScalarType,
        ("Layout" | "Device" | "MemoryFormat" | "Generator", false) => ArgType::Opaque,
        ("Any", _) => ArgType::Any,
        _ => return None,
    })
}

/// Splits on commas that are not inside brackets.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.name)?;
        for (i, a) in self.args.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(
                f,
                "{:?}{} {}",
                a.ty,
                if a.optional { "?" } else { "" },
                a.name
            )?;
        }
        write!(f, ") -> ({})", self.returns.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_torch_schemas() {
        let s = Schema::parse(
            "sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
        );
        assert_eq!(s.args.len(), 4);
        assert_eq!(s.args[1].ty, ArgType::IntList);
        assert!(s.args[1].optional);
        assert_eq!(s.args[2].default.as_deref(), Some("False"));
        assert!(s.args[3].kw_only);
        assert_eq!(s.returns, vec!["Tensor"]);
        let s = Schema::parse(
            "max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
        );
        assert_eq!(s.returns.len(), 2);
        let s = Schema::parse("index.Tensor(Tensor self, Tensor?[] indices) -> Tensor");
        assert_eq!(s.args[1].ty, ArgType::TensorList);
        let s = Schema::parse("detach_(Tensor(a!) self) -> Tensor(a!)");
        assert_eq!(s.args[0].ty, ArgType::Tensor);
        assert_eq!(s.returns, vec!["Tensor(a!)"]);
        let s = Schema::parse("_foreach_add_(Tensor(a!)[] self, Scalar scalar) -> ()");
        assert_eq!(s.args[0].ty, ArgType::TensorList);
        assert!(s.returns.is_empty());
    }
}
