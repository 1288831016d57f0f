//! Every emitted case loads and resolves with `shardproof_case::load_case`.

use shardproof_zoo::{emit, find_bug, EmitOptions, Mesh, MlpConfig, BUGS};

fn opts(mesh: &str, forward_only: bool) -> EmitOptions {
    EmitOptions {
        model: "mlp".into(),
        mlp: MlpConfig {
            layers: 2,
            ..MlpConfig::default()
        },
        mesh: Mesh::parse(mesh).unwrap(),
        bug: None,
        forward_only,
    }
}

#[test]
fn emitted_cases_load() {
    for mesh in ["tp=2", "dp=2", "dp=2,tp=2", "tp=4"] {
        for forward_only in [true, false] {
            let mut o = opts(mesh, forward_only);
            let mut bugs = vec![None];
            bugs.extend(BUGS.iter().map(Some));
            for bug in bugs {
                o.bug = bug;
                let (dp, tp) = (o.mesh.size("dp"), o.mesh.size("tp"));
                if bug.is_some_and(|b| b.check_applies(dp, tp, forward_only).is_err()) {
                    assert!(emit(&o).is_err());
                    continue;
                }
                let dir = tempfile::tempdir().unwrap();
                let e = emit(&o).unwrap();
                assert_eq!(e.files.len(), 2 + o.mesh.ranks());
                e.write(dir.path()).unwrap();
                let case = shardproof_case::load_case(&dir.path().join("case.yaml"))
                    .unwrap_or_else(|err| panic!("{mesh} fw={forward_only} {bug:?}: {err:?}"));
                drop(case);
            }
        }
    }
}

#[test]
fn invalid_requests_are_refused() {
    let mut o = opts("tp=3", true);
    assert!(emit(&o).unwrap_err().contains("not divisible"));
    o.mesh = Mesh::parse("dp=2").unwrap();
    o.bug = find_bug("tp-missing-allreduce");
    assert!(emit(&o).unwrap_err().contains("tp mesh dim"));
    o.bug = None;
    o.model = "gpt9".into();
    assert!(emit(&o).unwrap_err().contains("unknown model"));
}
