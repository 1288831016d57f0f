//! "Did you mean" suggestions by edit distance.

/// Levenshtein distance in characters when at most `cap` (strsim's); names whose lengths
/// differ by more are skipped without it (graphs have thousands of value names; most are far
/// from the typo).
fn distance(a: &str, b: &str, cap: usize) -> Option<usize> {
    if a.chars().count().abs_diff(b.chars().count()) > cap {
        return None;
    }
    let d = strsim::levenshtein(a, b);
    (d <= cap).then_some(d)
}

/// The candidates nearest to `word` (up to three, tied at the smallest distance); only plausible
/// typos are offered (an edit distance of at most a third of the word's length, at least 1).
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let cap = (word.chars().count() / 3).max(1);
    let mut scored: Vec<(usize, &str)> = candidates
        .into_iter()
        .filter(|c| *c != word)
        .filter_map(|c| distance(word, c, cap).map(|d| (d, c)))
        .collect();
    scored.sort_by(|x, y| x.0.cmp(&y.0).then(x.1.cmp(y.1)));
    scored.dedup_by(|x, y| x.1 == y.1);
    // Only the nearest are worth reading: `primal_4` should suggest `primals_4`, not also
    // `primals_1`.
    let best = scored.first().map_or(0, |s| s.0);
    scored
        .into_iter()
        .take_while(|s| s.0 == best)
        .take(3)
        .map(|(_, c)| c.to_string())
        .collect()
}

/// ` — did you mean `a`?` / ` — did you mean `a` or `b`?`, or nothing when no candidate is near.
pub fn did_you_mean_suffix<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> String {
    let s = did_you_mean(word, candidates);
    match s.as_slice() {
        [] => String::new(),
        [one] => format!(" — did you mean `{one}`?"),
        many => {
            let quoted: Vec<String> = many.iter().map(|m| format!("`{m}`")).collect();
            let (last, rest) = quoted.split_last().expect("non-empty");
            format!(" — did you mean {} or {last}?", rest.join(", "))
        }
    }
}

/// A list of names for a hint, cut short when long.
pub fn list_names<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    let shown: Vec<String> = names.iter().take(12).map(|n| format!("`{n}`")).collect();
    if names.len() > shown.len() {
        format!("{}, ... ({} in all)", shown.join(", "), names.len())
    } else {
        shown.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_near_names_only() {
        let names = ["primals_4", "primals_40", "mul_4", "graphs"];
        assert_eq!(did_you_mean("primal_4", names)[0], "primals_4");
        assert!(did_you_mean("zzzzzz", names).is_empty());
        assert_eq!(did_you_mean("grpahs", names), vec!["graphs"]);
        assert_eq!(
            did_you_mean_suffix("primal_4", ["primals_4"]),
            " — did you mean `primals_4`?"
        );
    }
}
