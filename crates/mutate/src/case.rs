//! Just enough of the case file (docs/formats/case-format.md) to mutate a case: the graph
//! paths, the mesh and the `groups:` section, read line by line. Full validation is the job of
//! `shardproof` itself; here a case we cannot read is an error naming the line and a hint.

use std::path::{Path, PathBuf};

use crate::MutateError;

/// A case directory as the mutator sees it.
#[derive(Debug, Clone)]
pub struct CaseInput {
    /// A short label for reports (the case's `name:`, else its directory name).
    pub label: String,
    /// The case file.
    pub case_file: PathBuf,
    pub(crate) yaml: String,
    /// Spec graph path, relative to the case file's directory.
    pub(crate) spec_graph: String,
    /// Rank graph paths in rank order, relative to the case file's directory.
    pub(crate) rank_graphs: Vec<String>,
    pub(crate) mesh: Vec<(String, usize)>,
    /// Declared groups: name and the value text (`tp`, `[dp, tp]`, `all`, ...).
    pub(crate) groups: Vec<(String, String)>,
}

fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') => return &line[..i],
            _ => {}
        }
    }
    line
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    if s.len() >= 2
        && ((s.starts_with('"') && s.ends_with('"')) || (s.starts_with('\'') && s.ends_with('\'')))
    {
        s[1..s.len() - 1].to_string()
    } else {
        s.to_string()
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Splits a flow collection's inside at top-level commas.
fn split_flow(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    let mut quote = None;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out.into_iter().map(|p| p.trim().to_string()).collect()
}

/// Splits `key: value` at the first colon outside quotes.
fn split_key(s: &str) -> Option<(String, String)> {
    let mut quote = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, ':') => return Some((unquote(&s[..i]), s[i + 1..].trim().to_string())),
            _ => {}
        }
    }
    None
}

impl CaseInput {
    /// Reads a case: a case file, or a directory holding `case.yaml`.
    pub fn load(path: &Path) -> Result<CaseInput, MutateError> {
        let case_file = if path.is_dir() {
            path.join("case.yaml")
        } else {
            path.to_path_buf()
        };
        let yaml = std::fs::read_to_string(&case_file).map_err(|e| {
            MutateError::new(
                &case_file,
                0,
                format!("cannot read the case file: {e}"),
                "pass a case directory holding case.yaml, or the case file itself",
            )
        })?;
        let err =
            |line: usize, msg: String, hint: &str| MutateError::new(&case_file, line, msg, hint);
        let lines: Vec<&str> = yaml.lines().collect();
        let mut name = None;
        let mut spec_graph = None;
        let mut rank_graphs = None;
        let mut mesh = None;
        let mut groups = Vec::new();
        let mut section = String::new();
        let mut i = 0;
        while i < lines.len() {
            let raw = strip_comment(lines[i]);
            let text = raw.trim();
            if text.is_empty() {
                i += 1;
                continue;
            }
            let ind = indent(raw);
            let Some((key, value)) = split_key(text) else {
                i += 1;
                continue;
            };
            if ind == 0 {
                section = key.clone();
                if key == "name" {
                    name = Some(unquote(&value));
                }
                i += 1;
                continue;
            }
            match (section.as_str(), key.as_str()) {
                ("spec", "graph") => spec_graph = Some(unquote(&value)),
                ("impl", "mesh") => {
                    let inner = value.trim().trim_start_matches('{').trim_end_matches('}');
                    let mut dims = Vec::new();
                    for part in split_flow(inner) {
                        let Some((k, v)) = split_key(&part) else {
                            continue;
                        };
                        let size = v.trim().parse::<usize>().map_err(|_| {
                            err(
                                i + 1,
                                format!("mesh size `{v}` of `{k}` is not a number"),
                                "write the mesh as `mesh: { dp: 2, tp: 2 }`",
                            )
                        })?;
                        dims.push((k, size));
                    }
                    mesh = Some(dims);
                }
                ("impl", "graphs") => {
                    if value.starts_with('[') {
                        let inner = value.trim().trim_start_matches('[').trim_end_matches(']');
                        rank_graphs = Some(split_flow(inner).iter().map(|s| unquote(s)).collect());
                    } else if value.is_empty() {
                        let mut items = Vec::new();
                        let mut j = i + 1;
                        while j < lines.len() {
                            let t = strip_comment(lines[j]).trim();
                            if let Some(item) = t.strip_prefix("- ") {
                                items.push(unquote(item));
                            } else if !t.is_empty() {
                                break;
                            }
                            j += 1;
                        }
                        rank_graphs = Some(items);
                        i = j;
                        continue;
                    } else {
                        return Err(err(i + 1, format!("`graphs: {value}` maps ranks to files, which the mutator does not read"), "emit the case without --share-graphs, so `graphs:` lists one file per rank"));
                    }
                }
                ("impl", "groups") => {
                    if value.starts_with('{') {
                        let inner = value.trim().trim_start_matches('{').trim_end_matches('}');
                        for part in split_flow(inner) {
                            if let Some((k, v)) = split_key(&part) {
                                groups.push((k, v));
                            }
                        }
                    } else {
                        let mut j = i + 1;
                        while j < lines.len() {
                            let l = strip_comment(lines[j]);
                            if l.trim().is_empty() {
                                j += 1;
                                continue;
                            }
                            if indent(l) <= ind {
                                break;
                            }
                            if let Some((k, v)) = split_key(l.trim()) {
                                groups.push((k, v));
                            }
                            j += 1;
                        }
                        i = j;
                        continue;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        let spec_graph = spec_graph.ok_or_else(|| {
            err(
                0,
                "no `spec: graph:` entry".into(),
                "a case file names its spec as `spec:\\n  graph: FILE`",
            )
        })?;
        let rank_graphs = rank_graphs.ok_or_else(|| {
            err(
                0,
                "no `impl: graphs:` list".into(),
                "a case file lists its rank graphs as `impl:\\n  graphs: [r0.py, r1.py]`",
            )
        })?;
        let mesh = mesh.ok_or_else(|| {
            err(
                0,
                "no `impl: mesh:` entry".into(),
                "write the mesh as `mesh: { tp: 2 }` on one line",
            )
        })?;
        let label = name.unwrap_or_else(|| {
            case_file
                .parent()
                .and_then(|p| p.file_name())
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "case".into())
        });
        Ok(CaseInput {
            label,
            case_file,
            yaml,
            spec_graph,
            rank_graphs,
            mesh,
            groups,
        })
    }

    /// The directory graph paths are relative to.
    pub(crate) fn dir(&self) -> PathBuf {
        self.case_file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    pub(crate) fn world(&self) -> usize {
        self.mesh.iter().map(|(_, s)| *s).product::<usize>().max(1)
    }

    /// The case file with one more group, `name: value`, declared.
    pub(crate) fn with_group(&self, name: &str, value: &str) -> Option<String> {
        let lines: Vec<&str> = self.yaml.lines().collect();
        let mut out: Vec<String> = Vec::with_capacity(lines.len() + 2);
        let mut in_impl = false;
        let mut done = false;
        let mut i = 0;
        while i < lines.len() {
            let l = lines[i];
            let t = strip_comment(l).trim();
            if indent(l) == 0 && !t.is_empty() {
                if in_impl && !done {
                    // `impl:` had no groups: declare them at its end.
                    out.push(format!("  groups:\n    \"{name}\": {value}"));
                    done = true;
                }
                in_impl = t.starts_with("impl:");
            }
            if in_impl && !done && t.starts_with("groups:") {
                let ind = indent(l);
                let rest = t["groups:".len()..].trim();
                if rest.starts_with('{') {
                    let close = l.rfind('}')?;
                    let inner = l[..close].trim_end();
                    let sep = if inner.ends_with('{') { " " } else { ", " };
                    out.push(format!(
                        "{inner}{sep}\"{name}\": {value} }}{}",
                        &l[close + 1..]
                    ));
                    done = true;
                    i += 1;
                    continue;
                }
                out.push(l.to_string());
                let mut j = i + 1;
                let mut child_indent = ind + 2;
                while j < lines.len() {
                    let c = lines[j];
                    if !strip_comment(c).trim().is_empty() {
                        if indent(c) <= ind {
                            break;
                        }
                        child_indent = indent(c);
                    }
                    out.push(c.to_string());
                    j += 1;
                }
                out.push(format!("{}\"{name}\": {value}", " ".repeat(child_indent)));
                done = true;
                i = j;
                continue;
            }
            out.push(l.to_string());
            i += 1;
        }
        if in_impl && !done {
            out.push(format!("  groups:\n    \"{name}\": {value}"));
            done = true;
        }
        let mut text = out.join("\n");
        if self.yaml.ends_with('\n') {
            text.push('\n');
        }
        done.then_some(text)
    }
}
