//! Scratch: dumps placements of named nodes of one rank.
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let case = shardproof_case::load_case(std::path::Path::new(&a[1])).unwrap();
    let r: usize = a[2].parse().unwrap();
    let p = shardproof_check::propagate(&case).unwrap();
    let g = &case.program.ranks[r];
    let nd = case.program.mesh.dims.len();
    for (i, n) in g.nodes.iter().enumerate() {
        if n.outputs.is_empty() {
            continue;
        }
        if a.len() == 3 || a[3..].iter().any(|s| s == &n.name) {
            let ps = p.ranks[r].of(shardproof_ir::ValueId::new(i, 0), nd);
            println!("{} {:?}", n.name, ps);
        }
    }
}
