//! Where `Varying` begins in the correct zoo plans: for every node whose output is `Varying`
//! on some mesh dim while none of its inputs is, prints the operator, the mesh dim and its
//! inputs' placements, counted over the ranks (`varying_origins [FILTER]`).
#[path = "../tests/common/plans.rs"]
mod plans;
use shardproof_check::Place;
use shardproof_ir::{NodeKind, ValueId};
use std::collections::BTreeMap;

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let root = tempfile::tempdir().unwrap();
    let mut total: BTreeMap<String, usize> = BTreeMap::new();
    // VARYING_CASE=PATH/case.yaml reads that case instead (a preset kept by `throughput`'s
    // BENCH_KEEP).
    let given = std::env::var_os("VARYING_CASE").map(std::path::PathBuf::from);
    let cases: Vec<(String, std::path::PathBuf)> = match &given {
        Some(path) => vec![(path.display().to_string(), path.clone())],
        None => plans::correct_plans()
            .iter()
            .enumerate()
            .filter(|(_, p)| p.label().contains(&filter))
            .filter_map(|(i, p)| {
                let dir = root.path().join(format!("{i:03}"));
                Some((format!("{i:03} {}", p.label()), p.emit(&dir).ok()?))
            })
            .collect(),
    };
    for (label, case) in &cases {
        let case = shardproof_case::load_case(case).unwrap();
        let Ok(prop) = shardproof_check::propagate(&case) else {
            continue;
        };
        let program = &case.program;
        let nd = program.mesh.dims.len();
        let mut here: BTreeMap<String, usize> = BTreeMap::new();
        for (r, g) in program.ranks.iter().enumerate() {
            let rp = &prop.ranks[r];
            for (n, node) in g.nodes.iter().enumerate() {
                let NodeKind::Call { op, .. } = &node.kind else {
                    continue;
                };
                let ins = node.inputs();
                let out_shape = prop.metas[r]
                    .get(n)
                    .and_then(|o| o.first())
                    .cloned()
                    .flatten()
                    .map(|m| format!("{:?}", m.shape))
                    .unwrap_or_default();
                let end = rp
                    .offsets
                    .get(n + 1)
                    .map_or(rp.places.len() / nd.max(1), |&e| e as usize);
                let nout = end - rp.offsets[n] as usize;
                for o in 0..nout {
                    let v = ValueId { node: n, output: o };
                    let places = rp.of(v, nd);
                    for m in 0..nd {
                        if places.get(m) != Some(&Place::Varying) {
                            continue;
                        }
                        if ins.iter().any(|&x| rp.of(x, nd)[m] == Place::Varying) {
                            continue;
                        }
                        let ip: Vec<String> = ins
                            .iter()
                            .map(|&x| {
                                let s = prop.metas[r]
                                    .get(x.node)
                                    .and_then(|o| o.get(x.output))
                                    .cloned()
                                    .flatten()
                                    .map(|m| format!("{:?}", m.shape))
                                    .unwrap_or_default();
                                format!("{}{s}", rp.of(x, nd)[m])
                            })
                            .collect();
                        let key = format!(
                            "{} {} [{}] -> {out_shape}",
                            program.mesh.dims[m].0,
                            op,
                            ip.join(", ")
                        );
                        *here.entry(key).or_default() += 1;
                    }
                }
            }
        }
        println!("{label}");
        for (k, c) in &here {
            println!("    {c:5} {k}");
            *total.entry(k.clone()).or_default() += c;
        }
    }
    println!("total:");
    let mut v: Vec<_> = total.into_iter().collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    for (k, c) in v.iter().take(60) {
        println!("    {c:6} {k}");
    }
}
