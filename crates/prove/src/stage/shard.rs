//! Proving a plan's distinct stages in several processes: `--shard I/N` proves every N-th
//! distinct stage starting at the I-th and writes the outcomes into a directory, `--merge`
//! reads every shard's file back and chains them into the verdict. Each shard file names the
//! plan it belongs to, so results of another case, or of another version of it, are refused.

use super::{Plan, StageOutcome};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The format tag of a shard file.
const FORMAT: &str = "shardproof-prove-shard/1";

/// One stage's outcome in a shard file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardResult {
    /// The stage's position in the plan.
    pub stage: usize,
    /// Its memo key's digest.
    pub key: String,
    /// What its proof found.
    pub outcome: StageOutcome,
}

/// A shard file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardFile {
    /// [`FORMAT`].
    pub format: String,
    /// The case's name.
    pub case: String,
    /// The plan's digest.
    pub plan: String,
    /// This shard's index.
    pub shard: usize,
    /// The number of shards.
    pub shards: usize,
    /// The stages it proved.
    pub results: Vec<ShardResult>,
}

/// Parses `I/N` (0 <= I < N).
pub fn parse_shard(text: &str) -> Result<(usize, usize), String> {
    let (i, n) = text
        .split_once('/')
        .ok_or_else(|| format!("`{text}` is not I/N (e.g. 0/4)"))?;
    let i: usize = i
        .trim()
        .parse()
        .map_err(|_| format!("`{text}`: the shard index is not a number"))?;
    let n: usize = n
        .trim()
        .parse()
        .map_err(|_| format!("`{text}`: the shard count is not a number"))?;
    if n == 0 || i >= n {
        return Err(format!(
            "`{text}`: the index must be below the count (0/{n} .. {}/{n})",
            n.max(1) - 1
        ));
    }
    Ok((i, n))
}

/// The distinct stages shard `i` of `n` proves: every `n`-th, starting at the `i`-th, in plan
/// order. Every process computes the same plan, so the shards split it without talking.
pub fn shard_stages(plan: &Plan, i: usize, n: usize) -> Vec<usize> {
    plan.distinct
        .iter()
        .enumerate()
        .filter(|(j, _)| j % n == i)
        .map(|(_, &k)| k)
        .collect()
}

/// The file shard `i` of `n` writes in `dir`.
pub fn shard_path(dir: &Path, i: usize, n: usize) -> PathBuf {
    dir.join(format!("shard-{i}-of-{n}.json"))
}

/// Writes shard `i` of `n`'s outcomes into `dir` (created if needed).
pub fn write_shard(
    dir: &Path,
    case: &str,
    plan: &Plan,
    i: usize,
    n: usize,
    outcomes: &[(usize, StageOutcome)],
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let file = ShardFile {
        format: FORMAT.into(),
        case: case.into(),
        plan: plan.digest.clone(),
        shard: i,
        shards: n,
        results: outcomes
            .iter()
            .map(|(k, o)| ShardResult {
                stage: *k,
                key: plan.stages[*k].digest.clone(),
                outcome: o.clone(),
            })
            .collect(),
    };
    let path = shard_path(dir, i, n);
    // Written whole under another name, then renamed: a merge never reads half a file.
    let tmp = dir.join(format!(".shard-{i}-of-{n}.json.tmp"));
    let text = serde_json::to_string_pretty(&file).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Reads every shard file of `plan` in `dir`: the outcomes by stage. A file of another plan,
/// or two files that disagree on a stage, is an error.
pub fn read_shards(dir: &Path, plan: &Plan) -> Result<BTreeMap<usize, StageOutcome>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("shard-") && n.ends_with(".json"))
        })
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(format!("{} holds no shard-*.json file", dir.display()));
    }
    let mut out: BTreeMap<usize, StageOutcome> = BTreeMap::new();
    for p in &paths {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let file: ShardFile =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
        if file.format != FORMAT {
            return Err(format!(
                "{}: format `{}`, expected `{FORMAT}`",
                p.display(),
                file.format
            ));
        }
        if file.plan != plan.digest {
            return Err(format!(
                "{}: written for another plan ({} of case `{}`, this case's is {})",
                p.display(),
                file.plan,
                file.case,
                plan.digest
            ));
        }
        for r in file.results {
            let known = plan
                .stages
                .get(r.stage)
                .is_some_and(|s| s.rep == r.stage && s.digest == r.key);
            if !known {
                return Err(format!(
                    "{}: stage {} with key {} is not a distinct stage of this plan",
                    p.display(),
                    r.stage,
                    r.key
                ));
            }
            if let Some(prev) = out.get(&r.stage) {
                if *prev != r.outcome {
                    return Err(format!(
                        "{}: stage {} differs from another shard's result for it",
                        p.display(),
                        r.stage
                    ));
                }
            }
            out.insert(r.stage, r.outcome);
        }
    }
    Ok(out)
}
