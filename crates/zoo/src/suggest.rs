//! "Did you mean" for the names a user types on the command line (models, presets, bug ids,
//! mesh dims, schedules): the nearest one or two known names by edit distance, so a typo costs
//! one glance instead of a scan of every name.

/// A name list longer than this is not spelled out in an error; a hint points at `zoo list`.
pub const LISTED_AT_MOST: usize = 12;

/// The one or two known names nearest to `word`, nearest first; empty when none is a plausible
/// typo.
///
/// A candidate qualifies when one of the two contains the other and is at least half its length
/// (a bug id typed without its model prefix: `oproj-missing-allreduce`), or when its edit
/// distance (Damerau-Levenshtein, ignoring case) is at most a third of the word's length (at
/// least 1). Containment ranks first: a typed fragment of a long id is a stronger sign than a
/// few edits to some other id.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let typed = word.trim().to_lowercase();
    if typed.is_empty() {
        return Vec::new();
    }
    let typed_len = typed.chars().count();
    let cap = (typed_len / 3).max(1);
    let mut scored: Vec<(bool, usize, &str)> = candidates
        .into_iter()
        .filter(|c| *c != word)
        .filter_map(|c| {
            let known = c.to_lowercase();
            let d = strsim::damerau_levenshtein(&typed, &known);
            let known_len = known.chars().count();
            // Short fragments are in too many names to point at one (`llama` in every llama
            // bug), so containment needs the shorter to be half the longer, and 3 characters.
            let contained = typed_len.min(known_len) >= 3
                && 2 * typed_len.min(known_len) >= typed_len.max(known_len)
                && (known.contains(&typed) || typed.contains(&known));
            (d <= cap || contained).then_some((!contained, d, c))
        })
        .collect();
    scored.sort();
    scored.dedup_by(|x, y| x.2 == y.2);
    // A second name only when it is about as near as the first: `llama3-7b` may be `llama3-8b`
    // or `llama3-70b`, but `tp-missing-allreduc` is only `tp-missing-allreduce`.
    let Some(&(far, best, _)) = scored.first() else {
        return Vec::new();
    };
    scored
        .into_iter()
        .take_while(|s| s.0 == far && s.1 <= best + 1)
        .take(2)
        .map(|s| s.2)
        .collect()
}

/// `did you mean `a`?` / `did you mean `a` or `b`?`, or `None` when no name is near.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    match nearest(word, candidates).as_slice() {
        [] => None,
        [one] => Some(format!("did you mean `{one}`?")),
        [first, second, ..] => Some(format!("did you mean `{first}` or `{second}`?")),
    }
}

/// The error for an unknown name: `unknown KIND `word``, the known names when there are at most
/// [`LISTED_AT_MOST`] (else `listing`, the command that shows them all), and a `hint:` line with
/// the nearest names.
///
/// ```
/// let e = shardproof_zoo::suggest::unknown("model", "lama", ["mlp", "llama"], "shardproof zoo list");
/// assert_eq!(e, "unknown model `lama`; known: mlp, llama\n  hint: did you mean `llama`?");
/// ```
pub fn unknown<'a>(
    kind: &str,
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    listing: &str,
) -> String {
    let known: Vec<&str> = candidates.into_iter().collect();
    let suggestion = did_you_mean(word, known.iter().copied());
    let mut message = format!("unknown {kind} `{word}`");
    if known.len() <= LISTED_AT_MOST {
        message.push_str(&format!("; known: {}", known.join(", ")));
        if let Some(s) = suggestion {
            message.push_str(&format!("\n  hint: {s}"));
        }
    } else {
        let all = format!("`{listing}` shows all {}", known.len());
        message.push_str(&match suggestion {
            Some(s) => format!("\n  hint: {s} ({all})"),
            None => format!("\n  hint: {all}"),
        });
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_the_nearest_one_or_two() {
        let presets = ["llama3-8b", "llama3-70b", "llama3-405b", "llama3-8b-tiny"];
        assert_eq!(nearest("llama3-7b", presets), ["llama3-70b", "llama3-8b"]);
        assert_eq!(nearest("LLAMA3-8B", presets), ["llama3-8b"]);
        assert_eq!(nearest("llama3-8b-tin", presets), ["llama3-8b-tiny"]);
        let bugs = [
            "tp-missing-allreduce",
            "llama-oproj-missing-allreduce",
            "wrong-group",
        ];
        assert_eq!(
            nearest("tp-missing-allreduc", bugs),
            ["tp-missing-allreduce"]
        );
        assert_eq!(
            nearest("oproj-missing-allreduce", bugs),
            ["llama-oproj-missing-allreduce"]
        );
        assert_eq!(nearest("wrong-grp", bugs), ["wrong-group"]);
    }

    #[test]
    fn suggests_nothing_far() {
        assert!(nearest("nope", ["tp-missing-allreduce", "wrong-group"]).is_empty());
        assert!(nearest(
            "llama",
            ["llama-attn-scale-local", "llama-kv-grad-unsynced"]
        )
        .is_empty());
        assert!(nearest("zz", ["pp", "dp", "cp", "tp", "ep"]).is_empty());
        assert!(nearest("", ["pp"]).is_empty());
        assert_eq!(nearest("tq", ["pp", "dp", "cp", "tp", "ep"]), ["tp"]);
    }

    #[test]
    fn long_lists_stay_behind_a_hint() {
        let many: Vec<String> = (0..20).map(|i| format!("bug-{i}")).collect();
        let names = many.iter().map(String::as_str);
        let e = unknown("bug", "bgu-3", names.clone(), "shardproof zoo list --bugs");
        assert_eq!(
            e,
            "unknown bug `bgu-3`\n  hint: did you mean `bug-3`? (`shardproof zoo list --bugs` shows all 20)"
        );
        let e = unknown(
            "bug",
            "nothing-like-it",
            names,
            "shardproof zoo list --bugs",
        );
        assert_eq!(
            e,
            "unknown bug `nothing-like-it`\n  hint: `shardproof zoo list --bugs` shows all 20"
        );
    }
}
