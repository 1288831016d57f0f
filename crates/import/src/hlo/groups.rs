//! Replica groups of HLO collectives, and the process-group names the importer gives them.
//!
//! A collective's `replica_groups` (every form XLA prints: `{{0,1},{2,3}}`, `{}`, the iota form
//! `[2,2]<=[4]` / `[2,2]<=[2,2]T(1,0)`, and the mesh-axes form `mesh['x'=2,'y'=2] {'y'}`) becomes
//! the process group named `hlo{{0,1},{2,3}}`: the groups as an explicit list, each sorted, sorted
//! by their first member. A case declares that name under `groups:` with the same rank lists
//! ([`hlo_groups_yaml`] writes those entries).

use super::lex::{Tok, Token};
use super::parse::{perr, Instr, Module, PErr};
use shardproof_ir::{Arg, Graph, NodeKind};

/// The groups of a collective, as listed (members in HLO's order).
pub(crate) struct GroupSpec {
    pub groups: Vec<Vec<usize>>,
}

/// The process-group name of `groups` (sorted canonically first).
pub(crate) fn group_name(groups: &[Vec<usize>]) -> String {
    let mut gs: Vec<Vec<usize>> = groups
        .iter()
        .map(|g| {
            let mut g = g.clone();
            g.sort_unstable();
            g
        })
        .collect();
    gs.sort();
    let inner: Vec<String> = gs
        .iter()
        .map(|g| {
            let m: Vec<String> = g.iter().map(|r| r.to_string()).collect();
            format!("{{{}}}", m.join(","))
        })
        .collect();
    format!("hlo{{{}}}", inner.join(","))
}

/// The rank lists a group name of [`group_name`]'s form stands for.
pub fn parse_group_name(name: &str) -> Option<Vec<Vec<usize>>> {
    let body = name.strip_prefix("hlo{")?.strip_suffix('}')?;
    let mut out = Vec::new();
    for part in body.split("},") {
        let p = part.trim_start_matches('{').trim_end_matches('}');
        let ranks: Option<Vec<usize>> = p.split(',').map(|r| r.parse().ok()).collect();
        out.push(ranks?);
    }
    Some(out)
}

/// Every HLO process group the graphs' collectives name, with its rank lists, in order of first
/// use.
pub fn hlo_groups(graphs: &[&Graph]) -> Vec<(String, Vec<Vec<usize>>)> {
    let mut out: Vec<(String, Vec<Vec<usize>>)> = Vec::new();
    for g in graphs {
        for n in &g.nodes {
            let NodeKind::Call { op, args, .. } = &n.kind else {
                continue;
            };
            if !op.namespace.starts_with("_c10d_functional") {
                continue;
            }
            for a in args {
                if let Arg::Str(s) = a {
                    if let Some(rl) = parse_group_name(s) {
                        if !out.iter().any(|(name, _)| name == s) {
                            out.push((s.clone(), rl));
                        }
                    }
                }
            }
        }
    }
    out
}

/// The `groups:` entries of a case file for the graphs' HLO process groups, one per line,
/// indented for the `impl:` section:
///
/// ```text
///     "hlo{{0,1},{2,3}}": [[0, 1], [2, 3]]
/// ```
pub fn hlo_groups_yaml(graphs: &[&Graph]) -> String {
    let mut s = String::new();
    for (name, rl) in hlo_groups(graphs) {
        let lists: Vec<String> = rl
            .iter()
            .map(|g| {
                let m: Vec<String> = g.iter().map(|r| r.to_string()).collect();
                format!("[{}]", m.join(", "))
            })
            .collect();
        s.push_str(&format!("    \"{name}\": [{}]\n", lists.join(", ")));
    }
    s
}

const HINT: &str = "replica_groups reads `{{0,1},{2,3}}`, `{}`, `[2,2]<=[4]`, `[2,2]<=[2,2]T(1,0)` or `mesh['x'=2,'y'=2] {'y'}`";

struct C<'a> {
    t: &'a [Token],
    i: usize,
    line: usize,
    col: usize,
}

impl C<'_> {
    fn err(&self) -> PErr {
        let col = self.t.get(self.i).map_or(self.col, |t| t.col);
        let found = self
            .t
            .get(self.i)
            .map_or("the end of the value".into(), Token::describe);
        perr(
            self.line,
            col,
            format!("cannot read the replica groups at {found}"),
            HINT,
        )
    }
    fn eat(&mut self, p: &str) -> bool {
        if self.t.get(self.i).is_some_and(|t| t.is_punct(p)) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, p: &str) -> Result<(), PErr> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(self.err())
        }
    }
    fn int(&mut self) -> Result<i64, PErr> {
        let v = self
            .t
            .get(self.i)
            .and_then(Token::word)
            .and_then(|w| w.parse::<i64>().ok())
            .filter(|v| *v >= 0 && *v < 1 << 20)
            .ok_or_else(|| self.err())?;
        self.i += 1;
        Ok(v)
    }
    fn list(&mut self, open: &str, close: &str) -> Result<Vec<i64>, PErr> {
        self.expect(open)?;
        let mut v = Vec::new();
        if self.eat(close) {
            return Ok(v);
        }
        loop {
            v.push(self.int()?);
            if self.eat(close) {
                return Ok(v);
            }
            self.expect(",")?;
        }
    }
    fn done(&self) -> bool {
        self.i >= self.t.len()
    }
}

/// Device ids of an iota list `[dims]` transposed by `perm` (row-major flattening).
fn iota_ids(dims: &[i64], perm: &[i64]) -> Option<Vec<usize>> {
    let n: i64 = dims.iter().product();
    if n > 1 << 16 || perm.len() != dims.len() {
        return None;
    }
    let mut seen = vec![false; dims.len()];
    for &p in perm {
        *seen.get_mut(usize::try_from(p).ok()?)? = true;
    }
    if seen.iter().any(|s| !s) {
        return None;
    }
    let st = super::lit::strides(dims);
    let tdims: Vec<i64> = perm.iter().map(|&p| dims[p as usize]).collect();
    let tst = super::lit::strides(&tdims);
    Some(
        (0..n)
            .map(|f| {
                perm.iter()
                    .enumerate()
                    .map(|(o, &p)| ((f / tst[o]) % tdims[o]) * st[p as usize])
                    .sum::<i64>() as usize
            })
            .collect(),
    )
}

fn iota_form(c: &mut C) -> Result<Vec<Vec<usize>>, PErr> {
    let shape = c.list("[", "]")?;
    c.expect("<=")?;
    let dims = c.list("[", "]")?;
    let perm = if c.t.get(c.i).and_then(Token::word) == Some("T") {
        c.i += 1;
        c.list("(", ")")?
    } else {
        (0..dims.len() as i64).collect()
    };
    let ids = iota_ids(&dims, &perm).ok_or_else(|| c.err())?;
    if shape.len() != 2 || shape[0] * shape[1] != ids.len() as i64 {
        return Err(c.err());
    }
    let s = shape[1] as usize;
    Ok(ids.chunks(s.max(1)).map(<[usize]>::to_vec).collect())
}

fn mesh_form(c: &mut C) -> Result<Vec<Vec<usize>>, PErr> {
    c.i += 1; // `mesh`
    c.expect("[")?;
    let mut axes: Vec<(String, i64)> = Vec::new();
    loop {
        let name = match c.t.get(c.i).map(|t| &t.tok) {
            Some(Tok::Str(s)) | Some(Tok::Word(s)) => s.clone(),
            _ => return Err(c.err()),
        };
        c.i += 1;
        c.expect("=")?;
        let size = c.int()?;
        axes.push((name, size));
        if c.eat("]") {
            break;
        }
        c.expect(",")?;
    }
    let dims: Vec<i64> = axes.iter().map(|a| a.1).collect();
    let mut ids =
        iota_ids(&dims, &(0..dims.len() as i64).collect::<Vec<_>>()).ok_or_else(|| c.err())?;
    if c.eat("<=") {
        let d = c.list("[", "]")?;
        let perm = if c.t.get(c.i).and_then(Token::word) == Some("T") {
            c.i += 1;
            c.list("(", ")")?
        } else {
            (0..d.len() as i64).collect()
        };
        ids = iota_ids(&d, &perm).ok_or_else(|| c.err())?;
        if ids.len() != dims.iter().product::<i64>() as usize {
            return Err(c.err());
        }
    }
    // The axes the groups run along: `'y'` or a sub-axis `'y':(pre)size`.
    c.expect("{")?;
    // Split each axis into sub-axes as needed: (axis, pre, size) per group axis.
    let mut refs: Vec<(usize, i64, i64)> = Vec::new();
    if !c.eat("}") {
        loop {
            let name = match c.t.get(c.i).map(|t| &t.tok) {
                Some(Tok::Str(s)) | Some(Tok::Word(s)) => s.clone(),
                _ => return Err(c.err()),
            };
            c.i += 1;
            let a = axes
                .iter()
                .position(|x| x.0 == name)
                .ok_or_else(|| c.err())?;
            let (pre, size) = if c.eat(":") {
                c.expect("(")?;
                let pre = c.int()?;
                c.expect(")")?;
                (pre, c.int()?)
            } else {
                (1, axes[a].1)
            };
            if pre < 1 || size < 1 || axes[a].1 % (pre * size) != 0 {
                return Err(c.err());
            }
            refs.push((a, pre, size));
            if c.eat("}") {
                break;
            }
            c.expect(",")?;
        }
    }
    // Fine dims: a referenced axis becomes [pre, size, post], any other axis stays [n].
    let mut fine: Vec<i64> = Vec::new();
    let mut start = Vec::new();
    for (a, (_, n)) in axes.iter().enumerate() {
        start.push(fine.len());
        let r: Vec<&(usize, i64, i64)> = refs.iter().filter(|r| r.0 == a).collect();
        match r.as_slice() {
            [] => fine.push(*n),
            [(_, pre, size)] => {
                fine.push(*pre);
                fine.push(*size);
                fine.push(n / (pre * size));
            }
            _ => return Err(c.err()),
        }
    }
    // Group members run over the referenced sub-axes, in the order listed.
    let order: Vec<usize> = refs.iter().map(|r| start[r.0] + 1).collect();
    let st = super::lit::strides(&fine);
    let rest: Vec<usize> = (0..fine.len()).filter(|d| !order.contains(d)).collect();
    let count = |ds: &[usize]| ds.iter().map(|&d| fine[d]).product::<i64>();
    let mut groups = Vec::new();
    for g in 0..count(&rest) {
        let mut base = 0;
        let mut rem = g;
        for &d in rest.iter().rev() {
            base += (rem % fine[d]) * st[d];
            rem /= fine[d];
        }
        let mut members = Vec::new();
        for m in 0..count(&order) {
            let mut off = 0;
            let mut rem = m;
            for &d in order.iter().rev() {
                off += (rem % fine[d]) * st[d];
                rem /= fine[d];
            }
            members.push(ids[(base + off) as usize]);
        }
        groups.push(members);
    }
    Ok(groups)
}

fn explicit_form(c: &mut C) -> Result<Vec<Vec<usize>>, PErr> {
    c.expect("{")?;
    let mut groups = Vec::new();
    if c.eat("}") {
        return Ok(groups);
    }
    loop {
        groups.push(c.list("{", "}")?.into_iter().map(|v| v as usize).collect());
        if c.eat("}") {
            return Ok(groups);
        }
        c.expect(",")?;
    }
}

/// The groups of a collective instruction, on the module's devices (partition ids, or replica
/// ids in a module of replicas), or `None` where the program does not say or mixes replicas
/// and partitions (the collective is then opaque).
pub(crate) fn parse_groups(m: &Module, ins: &Instr) -> Result<Option<GroupSpec>, PErr> {
    let partitions = m.num_partitions.unwrap_or(1).max(1) as usize;
    let replicas = m.replica_count.unwrap_or(1).max(1) as usize;
    if partitions > 1 && replicas > 1 {
        return Ok(None);
    }
    let n = partitions * replicas;
    let cross_partition = ins.attr("channel_id").is_some();
    if !cross_partition && replicas == 1 && partitions > 1 {
        // A cross-replica collective in a partitioned program of one replica: every device is
        // its own group.
        return Ok(Some(GroupSpec {
            groups: (0..n).map(|d| vec![d]).collect(),
        }));
    }
    let groups = match ins.attr("replica_groups") {
        None => vec![(0..n).collect()],
        Some(a) => {
            let mut c = C {
                t: &a.toks,
                i: 0,
                line: ins.line,
                col: a.col,
            };
            let g = match a.toks.first() {
                Some(t) if t.word() == Some("mesh") => mesh_form(&mut c)?,
                Some(t) if t.is_punct("[") => iota_form(&mut c)?,
                _ => explicit_form(&mut c)?,
            };
            if !c.done() {
                return Err(c.err());
            }
            if g.is_empty() {
                vec![(0..n).collect()]
            } else {
                g
            }
        }
    };
    let mut seen = vec![false; n];
    for g in &groups {
        for &d in g {
            match seen.get_mut(d) {
                Some(s) if !*s => *s = true,
                _ => {
                    return Err(perr(
                        ins.line,
                        ins.attr("replica_groups").map_or(ins.col, |a| a.col),
                        format!("replica group member {d} is repeated or not one of the module's {n} devices"),
                        "replica groups are disjoint lists of device ids below num_partitions",
                    ))
                }
            }
        }
    }
    Ok(Some(GroupSpec { groups }))
}

/// `source_target_pairs={{0,1},{1,0}}`.
pub(crate) fn parse_pairs(ins: &Instr) -> Result<Option<Vec<(usize, usize)>>, PErr> {
    let Some(a) = ins.attr("source_target_pairs") else {
        return Ok(None);
    };
    let mut c = C {
        t: &a.toks,
        i: 0,
        line: ins.line,
        col: a.col,
    };
    let g = explicit_form(&mut c)?;
    let mut out = Vec::new();
    for p in g {
        match p.as_slice() {
            [s, t] => out.push((*s, *t)),
            _ => return Err(c.err()),
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlo::parse::parse_module;

    fn groups(attr: &str, parts: usize) -> Vec<Vec<usize>> {
        let text = format!(
            "HloModule m, num_partitions={parts}\nENTRY e {{\n  p = f32[2] parameter(0)\n  ROOT a = f32[2] all-reduce(p), channel_id=1, replica_groups={attr}, to_apply=r\n}}\n"
        );
        let m = parse_module(&text).unwrap();
        let ins = &m.computations[0].instrs[1];
        parse_groups(&m, ins).unwrap().unwrap().groups
    }

    #[test]
    fn every_form_reads() {
        assert_eq!(groups("{{0,1},{2,3}}", 4), [[0, 1], [2, 3]]);
        assert_eq!(groups("{}", 2), [[0, 1]]);
        assert_eq!(groups("[2,2]<=[4]", 4), [[0, 1], [2, 3]]);
        assert_eq!(groups("[2,2]<=[2,2]T(1,0)", 4), [[0, 2], [1, 3]]);
        assert_eq!(
            groups("mesh['axis_0'=1,'axis_1'=2] {'axis_1'}", 2),
            [[0, 1]]
        );
        assert_eq!(groups("mesh['x'=2,'y'=2] {'y'}", 4), [[0, 1], [2, 3]]);
        assert_eq!(groups("mesh['x'=2,'y'=2] {'x'}", 4), [[0, 2], [1, 3]]);
        assert_eq!(groups("mesh['x'=2,'y'=2] {'x','y'}", 4), [[0, 1, 2, 3]]);
        // Sub-axis `(pre)size`: `pre` major elements before it, so `(1)2` is the major half.
        assert_eq!(groups("mesh['x'=4] {'x':(1)2}", 4), [[0, 2], [1, 3]]);
        assert_eq!(groups("mesh['x'=4] {'x':(2)2}", 4), [[0, 1], [2, 3]]);
    }

    #[test]
    fn names_round_trip() {
        let n = group_name(&[vec![3, 2], vec![0, 1]]);
        assert_eq!(n, "hlo{{0,1},{2,3}}");
        assert_eq!(parse_group_name(&n), Some(vec![vec![0, 1], vec![2, 3]]));
        assert_eq!(parse_group_name("tp"), None);
    }

    #[test]
    fn bad_groups_are_errors() {
        let text = "HloModule m, num_partitions=2\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT a = f32[2] all-reduce(p), channel_id=1, replica_groups={{0,5}}, to_apply=r\n}\n";
        let m = parse_module(text).unwrap();
        assert!(parse_groups(&m, &m.computations[0].instrs[1]).is_err());
    }
}
