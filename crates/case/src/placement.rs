//! DTensor-style placements: `Shard(d)`, `Replicate()`, `Partial(op)`.

use std::fmt;

/// How the pieces of a partial tensor combine into the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduce {
    /// The value is the sum of the pieces.
    Sum,
    /// The value is the mean of the pieces.
    Avg,
    /// The value is the element-wise maximum of the pieces.
    Max,
    /// The value is the element-wise minimum of the pieces.
    Min,
}

impl Reduce {
    /// The name used in placements and in c10d (`sum`, `avg`, `max`, `min`).
    pub fn name(self) -> &'static str {
        match self {
            Reduce::Sum => "sum",
            Reduce::Avg => "avg",
            Reduce::Max => "max",
            Reduce::Min => "min",
        }
    }

    fn from_name(s: &str) -> Option<Reduce> {
        Some(match s {
            "sum" => Reduce::Sum,
            "avg" | "mean" => Reduce::Avg,
            "max" => Reduce::Max,
            "min" => Reduce::Min,
            _ => return None,
        })
    }
}

/// How a tensor is laid out along one mesh dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Split along this tensor dim into equal pieces, one per coordinate of the mesh dim.
    Shard(usize),
    /// Every coordinate holds the whole tensor.
    Replicate,
    /// Every coordinate holds a piece of the same shape; the pieces reduce to the value.
    Partial(Reduce),
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Shard(d) => write!(f, "Shard({d})"),
            Placement::Replicate => f.write_str("Replicate()"),
            Placement::Partial(Reduce::Sum) => f.write_str("Partial()"),
            Placement::Partial(r) => write!(f, "Partial({})", r.name()),
        }
    }
}

/// A placement syntax error: the char offset in the text, the message and a hint.
#[derive(Debug)]
pub(crate) struct PlacementSyntaxError {
    pub offset: usize,
    pub message: String,
    pub hint: String,
}

const FORMS: &str = "write `Shard(0)`, `Replicate()`, `Partial()`, `Partial(avg)`, `Partial(max)` \
                     or `Partial(min)`";

/// Parses one placement. Besides the forms of the contract, the spellings torch prints are
/// accepted (`Shard(dim=0)`, `Partial(reduce_op=sum)`, `Partial('sum')`), because users paste
/// them from DTensor reprs.
pub(crate) fn parse_placement(text: &str) -> Result<Placement, PlacementSyntaxError> {
    let err = |offset: usize, message: String| PlacementSyntaxError {
        offset,
        message,
        hint: FORMS.to_string(),
    };
    let lead = text[..text.len() - text.trim_start().len()].chars().count();
    let t = text.trim();
    let (head, arg, arg_off) = match t.find('(') {
        Some(open) => {
            if !t.ends_with(')') {
                return Err(err(
                    lead + t.chars().count(),
                    format!("`{t}` is not a placement: missing `)`"),
                ));
            }
            let inner = &t[open + 1..t.len() - 1];
            let inner_lead = inner.len() - inner.trim_start().len();
            (
                t[..open].trim_end(),
                inner.trim(),
                lead + t[..open + 1].chars().count() + inner[..inner_lead].chars().count(),
            )
        }
        None => (t, "", lead + t.chars().count()),
    };
    match head {
        "Shard" | "S" => {
            let a = arg.strip_prefix("dim").map_or(arg, |rest| {
                rest.trim_start().strip_prefix('=').map_or(arg, str::trim)
            });
            if a.is_empty() {
                return Err(err(
                    arg_off,
                    "`Shard` needs the tensor dim: `Shard(0)`".into(),
                ));
            }
            match a.parse::<i64>() {
                Ok(d) if d >= 0 => usize::try_from(d)
                    .map(Placement::Shard)
                    .map_err(|_| err(arg_off, format!("`{a}` is too large a tensor dim"))),
                Ok(d) => Err(PlacementSyntaxError {
                    offset: arg_off,
                    message: format!("`Shard({d})`: the tensor dim must not be negative"),
                    hint: "count the dim from the front: for a tensor of rank n, `-1` is `n - 1`"
                        .into(),
                }),
                Err(_) => Err(err(
                    arg_off,
                    format!("`Shard` takes a tensor dim (a non-negative integer), found `{a}`"),
                )),
            }
        }
        "Replicate" | "R" => {
            if arg.is_empty() {
                Ok(Placement::Replicate)
            } else {
                Err(err(
                    arg_off,
                    format!("`Replicate()` takes no argument, found `{arg}`"),
                ))
            }
        }
        "Partial" | "P" => {
            let a = arg.strip_prefix("reduce_op").map_or(arg, |rest| {
                rest.trim_start().strip_prefix('=').map_or(arg, str::trim)
            });
            let a = a.trim_matches(|c| c == '\'' || c == '"');
            if a.is_empty() {
                return Ok(Placement::Partial(Reduce::Sum));
            }
            Reduce::from_name(a).map(Placement::Partial).ok_or_else(|| {
                err(
                    arg_off,
                    format!("`{a}` is not a reduction: expected `sum`, `avg`, `max` or `min`"),
                )
            })
        }
        _ => {
            let known = ["Shard", "Replicate", "Partial"];
            let lower = head.to_ascii_lowercase();
            let near = known
                .iter()
                .find(|k| k.to_ascii_lowercase() == lower)
                .map_or_else(
                    || crate::suggest::did_you_mean_suffix(head, known),
                    |k| format!(" — did you mean `{k}`?"),
                );
            Err(err(lead, format!("`{t}` is not a placement{near}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(parse_placement("Shard(0)").unwrap(), Placement::Shard(0));
        assert_eq!(
            parse_placement(" Shard( dim = 2 )").unwrap(),
            Placement::Shard(2)
        );
        assert_eq!(
            parse_placement("Replicate()").unwrap(),
            Placement::Replicate
        );
        assert_eq!(
            parse_placement("Partial()").unwrap(),
            Placement::Partial(Reduce::Sum)
        );
        assert_eq!(
            parse_placement("Partial(avg)").unwrap(),
            Placement::Partial(Reduce::Avg)
        );
        assert_eq!(
            parse_placement("Partial(reduce_op='max')").unwrap(),
            Placement::Partial(Reduce::Max)
        );
        assert_eq!(
            parse_placement("Partial(min)").unwrap(),
            Placement::Partial(Reduce::Min)
        );
    }

    #[test]
    fn rejects_with_offsets() {
        let e = parse_placement("Shard(x)").unwrap_err();
        assert_eq!(e.offset, 6);
        let e = parse_placement("shard(0)").unwrap_err();
        assert!(e.message.contains("did you mean `Shard`"), "{}", e.message);
        assert!(parse_placement("Shard(-1)").is_err());
        assert!(parse_placement("Shard(0").is_err());
        assert!(parse_placement("Partial(prod)").is_err());
        assert!(parse_placement("Replicate(1)").is_err());
        assert!(parse_placement("").is_err());
    }

    #[test]
    fn display_round_trips() {
        for p in [
            Placement::Shard(3),
            Placement::Replicate,
            Placement::Partial(Reduce::Sum),
            Placement::Partial(Reduce::Avg),
        ] {
            assert_eq!(parse_placement(&p.to_string()).unwrap(), p);
        }
    }
}
