//! Scratch: the first nodes of one rank whose placement on a mesh dim is Varying while no input is.
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let case = shardproof_case::load_case(std::path::Path::new(&a[1])).unwrap();
    let r: usize = a[2].parse().unwrap();
    let m: usize = a[3].parse().unwrap();
    let p = shardproof_check::propagate(&case).unwrap();
    let g = &case.program.ranks[r];
    let nd = case.program.mesh.dims.len();
    let of = |v: shardproof_ir::ValueId| p.ranks[r].of(v, nd)[m];
    for (i, n) in g.nodes.iter().enumerate() {
        if n.outputs.is_empty() {
            continue;
        }
        let me = of(shardproof_ir::ValueId::new(i, 0));
        if format!("{me:?}") == "Varying"
            && !n
                .inputs()
                .iter()
                .any(|&v| format!("{:?}", of(v)) == "Varying")
        {
            let ins: Vec<String> = n
                .inputs()
                .iter()
                .map(|&v| {
                    format!(
                        "{}={:?} {:?}",
                        g.nodes[v.node].name,
                        p.ranks[r].of(v, nd),
                        p.metas[r][v.node][v.output]
                            .as_ref()
                            .map(|m| m.shape.clone())
                    )
                })
                .collect();
            println!(
                "{} {:?} {:?} <- {}",
                n.name,
                n.op().map(|o| o.to_string()),
                p.metas[r][i][0].as_ref().map(|m| m.shape.clone()),
                ins.join(", ")
            );
        }
    }
}
