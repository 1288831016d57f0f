//! Module outputs of a graph and where a rank's copy of one lies in the spec's tensor.
//!
//! A graph names its modules the way torch.fx prints `torch.fx.traceback.annotate({...})`:
//! a comment `# Annotation: {'module': 'layers.0.mlp', 'output': 'add_3'} ...` before the
//! module's nodes (with `'phase': 'backward'` in the region of its backward, whose `output` is
//! the gradient of the module's input). Annotations without both `module` and `output` are
//! someone else's and are ignored.
//!
//! A case declares layouts only for its inputs and outputs, so the pieces of an intermediate
//! tensor are found by [`place`]: among the boxes an even split of each dimension allows (and
//! the two mirrored chunks of a load-balanced context-parallel split), the one whose spec
//! values the rank's tensor matches best. That choice never makes a wrong run hold: a rank's
//! tensor that matches no box diverges at the best one, and boxes that do not tile the full
//! tensor are an omission or an overlap for `trace compare`. It is blind to a permutation
//! (ranks holding each other's correct slices tile the tensor): such a bug shows at the next
//! module, where the slices no longer fit.

use crate::format::{Piece, Region};
use crate::writer::strides;
use shardproof_ir::{Graph, ValueId};

/// The output of one module region of a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleOutput {
    /// The canonical module name.
    pub module: String,
    /// The region is the module's backward: the value is its input's gradient.
    pub backward: bool,
    /// The value.
    pub value: ValueId,
}

/// The `'key': 'value'` pairs of a Python dict literal whose values are strings; pairs with
/// other values are skipped (user annotations may hold anything).
fn string_pairs(dict: &str) -> Vec<(String, String)> {
    let chars: Vec<char> = dict.chars().collect();
    let mut pairs = Vec::new();
    // The items of the current pair: a string, or `None` for anything else.
    let mut items: Vec<Option<String>> = Vec::new();
    let mut depth = 0i32;
    let mut i = 0;
    let mut close = |items: &mut Vec<Option<String>>| {
        if let [Some(k), Some(v)] = items.as_slice() {
            pairs.push((k.clone(), v.clone()));
        }
        items.clear();
    };
    while i < chars.len() {
        match chars[i] {
            quote @ ('\'' | '"') => {
                let mut s = String::new();
                i += 1;
                while i < chars.len() && chars[i] != quote {
                    if chars[i] == '\\' && i + 1 < chars.len() {
                        i += 1;
                    }
                    s.push(chars[i]);
                    i += 1;
                }
                items.push((depth == 0).then_some(s));
            }
            '{' | '[' | '(' => {
                depth += 1;
                items.push(None);
            }
            '}' | ']' | ')' => depth -= 1,
            ',' if depth == 0 => close(&mut items),
            ':' => {}
            c if depth == 0 && !c.is_whitespace() => items.push(None),
            _ => {}
        }
        i += 1;
    }
    close(&mut items);
    pairs
}

/// The module annotations of graph text, in order: `(module, backward, output name, line)`.
pub fn annotations(text: &str) -> Vec<(String, bool, String, usize)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("# Annotation: {") else {
            continue;
        };
        let Some(end) = rest.find('}') else {
            continue;
        };
        let pairs = string_pairs(&rest[..end]);
        let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        if let (Some(module), Some(output)) = (get("module"), get("output")) {
            let backward = get("phase").as_deref() == Some("backward");
            found.push((module, backward, output, n + 1));
        }
    }
    found
}

/// The module outputs of `graph`, from the annotations of its source text (none when it has
/// no source file). An annotation naming a value the graph lacks is an error.
pub fn module_outputs(graph: &Graph) -> Result<Vec<ModuleOutput>, String> {
    let Some(path) = &graph.path else {
        return Ok(Vec::new());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    annotations(&text)
        .into_iter()
        .map(|(module, backward, output, line)| {
            let value = graph.find(&output).ok_or_else(|| {
                format!(
                    "{}:{line}: the annotation of module `{module}` names output `{output}`, which the graph does not define",
                    path.display()
                )
            })?;
            Ok(ModuleOutput {
                module,
                backward,
                value,
            })
        })
        .collect()
}

/// How many candidate boxes [`place`] tries at most; more is refused (not placed).
const MAX_CANDIDATES: usize = 4096;

/// The ways one dimension of `local` elements can lie in `full`: the whole dim, one of the
/// `full / local` even chunks, or the chunks `i` and `2k - 1 - i` of `2k` (context
/// parallelism's load balancing).
fn dim_options(full: u64, local: u64) -> Vec<Vec<[u64; 2]>> {
    if local == full {
        return vec![vec![[0, full]]];
    }
    if local == 0 || !full.is_multiple_of(local) {
        return Vec::new();
    }
    let k = full / local;
    let mut options: Vec<Vec<[u64; 2]>> =
        (0..k).map(|i| vec![[i * local, (i + 1) * local]]).collect();
    if local.is_multiple_of(2) {
        let half = local / 2;
        for i in 0..k {
            let j = 2 * k - 1 - i;
            options.push(vec![[i * half, (i + 1) * half], [j * half, (j + 1) * half]]);
        }
    }
    options
}

/// The pieces of one choice of intervals per dim: their cartesian product, laid out
/// consecutively along each dim of the local tensor.
fn pieces_of(choice: &[&Vec<[u64; 2]>]) -> Vec<Piece> {
    let mut pieces = vec![(Vec::new(), Vec::new())];
    for intervals in choice {
        let mut next = Vec::new();
        for (local, full) in &pieces {
            let mut offset = 0;
            for iv in intervals.iter() {
                let len = iv[1] - iv[0];
                let (mut l, mut f): (Vec<[u64; 2]>, Vec<[u64; 2]>) = (local.clone(), full.clone());
                l.push([offset, offset + len]);
                f.push(*iv);
                offset += len;
                next.push((l, f));
            }
        }
        pieces = next;
    }
    pieces
        .into_iter()
        .map(|(l, f)| Piece::boxed(Region(l), Region(f)))
        .collect()
}

/// The squared distance between the local tensor's boxes and the full tensor's.
fn distance(
    local: &[f64],
    local_shape: &[u64],
    full: &[f64],
    full_shape: &[u64],
    pieces: &[Piece],
) -> f64 {
    let (ls, fs) = (strides(local_shape), strides(full_shape));
    let mut sum = 0.0;
    for p in pieces {
        let ext = p.local.extents();
        let n: u64 = ext.iter().product();
        for e in 0..n {
            let (mut rem, mut lo, mut fo) = (e, 0u64, 0u64);
            for d in (0..ext.len()).rev() {
                let i = rem % ext[d];
                rem /= ext[d];
                lo += (p.local.0[d][0] + i) * ls[d];
                fo += (p.full.0[d][0] + i) * fs[d];
            }
            let diff = local[lo as usize] - full[fo as usize];
            sum += if diff.is_nan() {
                f64::INFINITY
            } else {
                diff * diff
            };
        }
    }
    sum
}

/// Where a rank's `local` tensor lies in the spec's `full` tensor: the pieces of the
/// candidate box it matches best (the first on a tie), or `None` when its shape fits no
/// even split of the full shape (or too many).
pub fn place(
    local: &[f64],
    local_shape: &[u64],
    full: &[f64],
    full_shape: &[u64],
) -> Option<Vec<Piece>> {
    if local_shape.len() != full_shape.len() {
        return None;
    }
    let options: Vec<Vec<Vec<[u64; 2]>>> = full_shape
        .iter()
        .zip(local_shape)
        .map(|(&f, &l)| dim_options(f, l))
        .collect();
    let count = options
        .iter()
        .try_fold(1usize, |n, o| n.checked_mul(o.len()))?;
    if count == 0 || count > MAX_CANDIDATES {
        return None;
    }
    let mut best: Option<(f64, Vec<Piece>)> = None;
    for c in 0..count {
        let mut rem = c;
        let mut choice = Vec::with_capacity(options.len());
        for o in options.iter().rev() {
            choice.push(&o[rem % o.len()]);
            rem /= o.len();
        }
        choice.reverse();
        let pieces = pieces_of(&choice);
        let d = distance(local, local_shape, full, full_shape, &pieces);
        if best.as_ref().is_none_or(|(b, _)| d < *b) {
            best = Some((d, pieces));
        }
    }
    best.map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_are_read_from_torch_fx_comments() {
        let text = "    def forward(self, x):\n        # Annotation: {'module': 'layers.0.mlp', 'output': 'add_1'} No stacktrace found for following nodes\n        add_1 = x\n        # Annotation: {'module': 'layers.0', 'phase': 'backward', 'output': 'mm'} File: a.py:3 in f, code: y\n        # Annotation: {'stage': 2, 'note': 'mine'} No stacktrace found for following nodes\n";
        assert_eq!(
            annotations(text),
            vec![
                ("layers.0.mlp".into(), false, "add_1".into(), 2),
                ("layers.0".into(), true, "mm".into(), 4),
            ]
        );
        assert_eq!(
            string_pairs("'a': 1, 'b': [1, 2], 'c': 'd'"),
            vec![("c".to_string(), "d".to_string())]
        );
    }

    fn iota(n: usize) -> Vec<f64> {
        (0..n).map(|i| i as f64 * 0.5 - 3.0).collect()
    }

    #[test]
    fn a_shard_is_placed_where_its_values_are() {
        // full [4, 6]; the rank holds rows 2..4 and columns 3..6.
        let full = iota(24);
        let local: Vec<f64> = (2..4)
            .flat_map(|r| (3..6).map(move |c| (r * 6 + c) as f64 * 0.5 - 3.0))
            .collect();
        let p = place(&local, &[2, 3], &full, &[4, 6]).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].full, Region(vec![[2, 4], [3, 6]]));
        assert_eq!(p[0].local, Region(vec![[0, 2], [0, 3]]));
        // Mirrored chunks 0 and 3 of 4 along the sequence (load-balanced context parallelism).
        let full = iota(8);
        let local = vec![full[0], full[1], full[6], full[7]];
        let p = place(&local, &[4], &full, &[8]).unwrap();
        assert_eq!(
            p.iter().map(|p| p.full.clone()).collect::<Vec<_>>(),
            vec![Region(vec![[0, 2]]), Region(vec![[6, 8]])]
        );
        // A shape that splits nothing evenly is not placed.
        assert!(place(&[0.0; 3], &[3], &full, &[8]).is_none());
        assert!(place(&[0.0; 4], &[4, 1], &full, &[8]).is_none());
    }

    #[test]
    fn a_wrong_tensor_still_gets_a_box() {
        let full = iota(8);
        let p = place(&[9.0; 4], &[4], &full, &[8]).unwrap();
        assert_eq!(p[0].full.volume(), 4);
    }
}
