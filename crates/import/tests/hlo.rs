//! The HLO importer on the JAX fixtures of `tests/fixtures/hlo/` (written by
//! `python/hlo/capture.py`): every file imports, nothing is opaque, every value's HLO type is
//! what the registry's inference gives, and the source locations point at the capture script.

use shardproof_import::{hlo_device_from_path, hlo_groups, hlo_groups_yaml, load_graph, parse_hlo};
use shardproof_ir::{Graph, NodeKind, ValueId};
use shardproof_ops::{Args, Meta, Registry, Tensor, Values};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hlo");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the HLO fixtures exist")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "hlo"))
        .collect();
    v.sort();
    assert!(
        v.len() >= 20,
        "expected the captured fixtures, found {}",
        v.len()
    );
    v
}

struct Metas(HashMap<ValueId, Meta>);

impl Values for Metas {
    fn meta(&self, v: ValueId) -> Option<Meta> {
        self.0.get(&v).cloned()
    }
    fn tensor(&self, _: ValueId) -> Option<&Tensor> {
        None
    }
}

/// Infers every node with the registry and compares with the recorded (HLO) types; returns the
/// number of values checked. Panics naming the first opaque operator or disagreement.
fn check_shapes(g: &Graph, what: &str) -> usize {
    let reg = Registry::builtin();
    let mut metas = Metas(HashMap::new());
    let mut checked = 0;
    for (i, n) in g.nodes.iter().enumerate() {
        match &n.kind {
            NodeKind::Input | NodeKind::Constant { .. } => {
                let ty = n.outputs[0].ty.as_ref().expect("inputs have types");
                metas
                    .0
                    .insert(ValueId::new(i, 0), Meta::from_type(ty).unwrap());
            }
            NodeKind::Call { op, args, kwargs } => {
                let def = reg.get(op).unwrap_or_else(|| {
                    panic!(
                        "{what}: `{}` calls opaque `{op}` (line {:?})",
                        n.name, n.line
                    )
                });
                let bound = Args::bind(&def.schema, args, kwargs, &metas)
                    .unwrap_or_else(|e| panic!("{what}: `{}` ({op}) does not bind: {e:?}", n.name));
                let out = (def.infer)(&bound).unwrap_or_else(|e| {
                    panic!("{what}: `{}` ({op}) does not infer: {e:?}", n.name)
                });
                for (o, m) in out.into_iter().enumerate() {
                    if let Some(rec) = &n.outputs[o].ty {
                        assert_eq!(
                            rec,
                            &m.to_type(),
                            "{what}: `{}` ({op}, line {:?}) recorded {rec} but infers {}",
                            n.name,
                            n.line,
                            m.to_type()
                        );
                        checked += 1;
                    }
                    metas.0.insert(ValueId::new(i, o), m);
                }
            }
        }
    }
    checked
}

#[test]
fn every_fixture_imports_with_nothing_opaque_and_shapes_agree() {
    for path in fixtures() {
        let what = path.file_name().unwrap().to_string_lossy().to_string();
        let g = load_graph(&path).unwrap_or_else(|e| panic!("{e}"));
        g.check_structure().unwrap();
        assert!(
            g.nodes
                .iter()
                .all(|n| n.op().is_none_or(|o| o.namespace != "hlo")),
            "{what}: opaque hlo.* operators"
        );
        let checked = check_shapes(&g, &what);
        assert!(checked >= 8, "{what}: only {checked} values checked");
        // The inputs are arg0..argN, the outputs out0..
        for (k, v) in g.inputs.iter().enumerate() {
            assert_eq!(g.value_name(*v), format!("arg{k}"), "{what}");
        }
        for (k, v) in g.outputs.iter().enumerate() {
            assert_eq!(g.value_name(v.unwrap()), format!("out{k}"), "{what}");
        }
    }
}

#[test]
fn every_line_of_every_fixture_is_accounted_for() {
    for path in fixtures() {
        let text = std::fs::read_to_string(&path).unwrap();
        let p = parse_hlo(&text, &path, hlo_device_from_path(&path)).unwrap();
        assert_eq!(
            p.stats.lines_parsed + p.stats.lines_ignored,
            p.stats.lines_total,
            "{}",
            path.display()
        );
        assert!(p.stats.unparsed.is_empty());
        // The lenient parser `inspect` uses for line coverage reads HLO too.
        let lenient = shardproof_import::parse_fx_lenient(&text, &path).unwrap();
        assert_eq!(lenient.stats, p.stats);
    }
}

#[test]
fn nodes_point_at_the_capture_script() {
    for name in ["mlp.spec.hlo", "mlp.tp2.dev0.hlo", "block.tp4.dev3.hlo"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hlo")
            .join(name);
        let g = load_graph(&path).unwrap();
        let mms: Vec<_> = g
            .nodes
            .iter()
            .filter(|n| n.op().is_some_and(|o| o.name == "mm"))
            .collect();
        assert!(!mms.is_empty(), "{name}");
        for n in mms {
            let loc = n
                .loc
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: `{}` has no location", n.name));
            assert!(loc.file.ends_with("capture.py"), "{name}: {}", loc.file);
            assert!(loc.line > 0 && !loc.function.is_empty(), "{name}: {loc}");
            assert!(loc.code.contains("dot_general"), "{name}: {}", loc.code);
        }
    }
}

#[test]
fn collectives_name_hlo_groups_and_the_yaml_helper_declares_them() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hlo");
    for (n, name) in [(2, "hlo{{0,1}}"), (4, "hlo{{0,1,2,3}}")] {
        let graphs: Vec<Graph> = (0..n)
            .map(|k| load_graph(&dir.join(format!("block.tp{n}.dev{k}.hlo"))).unwrap())
            .collect();
        let refs: Vec<&Graph> = graphs.iter().collect();
        let groups = hlo_groups(&refs);
        assert_eq!(
            groups,
            vec![(name.to_string(), vec![(0..n).collect::<Vec<usize>>()])]
        );
        let yaml = hlo_groups_yaml(&refs);
        let members: Vec<String> = (0..n).map(|r| r.to_string()).collect();
        assert_eq!(
            yaml,
            format!("    \"{name}\": [[{}]]\n", members.join(", "))
        );
        // The case files declare exactly these groups.
        let case = std::fs::read_to_string(dir.join(format!("block.tp{n}.yaml"))).unwrap();
        assert!(case.contains(yaml.trim_end()), "block.tp{n}.yaml:\n{case}");
        // Each all-reduce says sum over that group.
        for g in &graphs {
            let ars: Vec<_> = g
                .nodes
                .iter()
                .filter(|x| x.op().is_some_and(|o| o.name == "all_reduce"))
                .collect();
            assert_eq!(ars.len(), 2);
            for a in ars {
                assert_eq!(a.args()[1], shardproof_ir::Arg::Str("sum".into()));
                assert_eq!(a.args()[2], shardproof_ir::Arg::Str(name.into()));
            }
        }
    }
}

#[test]
fn the_dropped_psum_leaves_no_collective() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hlo");
    for f in ["mlp_bug.tp2.dev0.hlo", "mlp_bug.tp4.dev3.hlo"] {
        let g = load_graph(&dir.join(f)).unwrap();
        assert!(
            g.nodes
                .iter()
                .all(|n| n.op().is_none_or(|o| !o.namespace.starts_with("_c10d"))),
            "{f}"
        );
    }
    let g = load_graph(&dir.join("mlp.tp4.dev2.hlo")).unwrap();
    assert_eq!(
        g.nodes
            .iter()
            .filter(|n| n.op().is_some_and(|o| o.name == "all_reduce"))
            .count(),
        1
    );
}
