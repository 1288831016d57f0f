//! Every emitted case loads and resolves with `shardproof_case::load_case`.

use shardproof_zoo::{
    emit, emit_with, find_bug, EmitExtras, EmitOptions, LlamaConfig, Mesh, MlpConfig, Site, BUGS,
};

fn opts(model: &str, mesh: &str, forward_only: bool) -> EmitOptions {
    EmitOptions {
        model: model.into(),
        mlp: MlpConfig {
            layers: 2,
            ..MlpConfig::default()
        },
        llama: LlamaConfig::default(),
        mesh: Mesh::parse(mesh).unwrap(),
        bug: None,
        forward_only,
        vocab_parallel: false,
    }
}

#[test]
fn emitted_cases_load() {
    let plans = [
        ("mlp", false),
        ("llama", false),
        ("gpt2", false),
        ("gpt2", true),
    ];
    for (model, sp) in plans {
        for mesh in ["tp=2", "dp=2", "dp=2,tp=2", "tp=4"] {
            if sp && !mesh.contains("tp") {
                continue;
            }
            let extras = EmitExtras {
                sequence_parallel: sp,
                ..EmitExtras::default()
            };
            for forward_only in [true, false] {
                let mut o = opts(model, mesh, forward_only);
                let mut bugs = vec![None];
                bugs.extend(BUGS.iter().map(Some));
                for bug in bugs {
                    o.bug = bug;
                    let (dp, tp) = (o.mesh.size("dp"), o.mesh.size("tp"));
                    let site = Site {
                        model,
                        dp,
                        tp,
                        forward_only,
                        kv_replicated: model == "llama" && o.llama.kv_replicas(tp) > 1,
                        vocab_parallel: false,
                        sequence_parallel: sp,
                    };
                    if bug.is_some_and(|b| b.check_applies(&site).is_err()) {
                        assert!(emit_with(&o, &extras).is_err());
                        continue;
                    }
                    let what = format!(
                        "{model} sp={sp} {mesh} fw={forward_only} {:?}",
                        bug.map(|b| b.id)
                    );
                    let dir = tempfile::tempdir().unwrap();
                    let e = emit_with(&o, &extras).unwrap();
                    assert_eq!(e.files.len(), 2 + o.mesh.ranks(), "{what}");
                    e.write(dir.path()).unwrap();
                    let case = shardproof_case::load_case(&dir.path().join("case.yaml"))
                        .unwrap_or_else(|err| panic!("{what}: {err:?}"));
                    drop(case);
                }
            }
        }
    }
}

#[test]
fn invalid_requests_are_refused() {
    let mut o = opts("mlp", "tp=3", true);
    assert!(emit(&o).unwrap_err().contains("not divisible"));
    o.mesh = Mesh::parse("dp=2").unwrap();
    o.bug = find_bug("tp-missing-allreduce");
    assert!(emit(&o).unwrap_err().contains("tp mesh dim"));
    o.bug = None;
    o.model = "gpt9".into();
    assert!(emit(&o).unwrap_err().contains("unknown model"));
    let mut l = opts("llama", "tp=8", true);
    assert!(emit(&l).unwrap_err().contains("heads 4 is not divisible"));
    l.mesh = Mesh::parse("tp=2").unwrap();
    l.bug = find_bug("tp-bias-before-allreduce");
    assert!(emit(&l).unwrap_err().contains("not `llama`"));
    l.bug = find_bug("llama-kv-grad-unsynced");
    l.forward_only = false;
    assert!(emit(&l).unwrap_err().contains("kv heads"));
    l.bug = None;
    l.vocab_parallel = true;
    l.mesh = Mesh::parse("dp=2").unwrap();
    assert!(emit(&l).unwrap_err().contains("tp mesh dim"));
    l.mesh = Mesh::parse("tp=2").unwrap();
    assert_eq!(emit(&l).unwrap().files.len(), 4);
}

#[test]
fn deepseek_cases_load() {
    let extras = EmitExtras::default();
    for mesh in ["tp=2", "ep=2", "dp=2,ep=2", "dp=2,tp=2,ep=2"] {
        for forward_only in [true, false] {
            let mut o = opts("deepseek", mesh, forward_only);
            let (dp, tp, ep) = (o.mesh.size("dp"), o.mesh.size("tp"), o.mesh.size("ep"));
            let site = Site::new("deepseek", dp, tp, forward_only);
            let mut bugs = vec![None];
            bugs.extend(
                BUGS.iter()
                    .filter(|b| b.check_applies_with_ep(&site, ep).is_ok())
                    .map(Some),
            );
            for bug in bugs {
                o.bug = bug;
                let what = format!("deepseek {mesh} fw={forward_only} {:?}", bug.map(|b| b.id));
                let dir = tempfile::tempdir().unwrap();
                emit_with(&o, &extras).unwrap().write(dir.path()).unwrap();
                shardproof_case::load_case(&dir.path().join("case.yaml"))
                    .unwrap_or_else(|err| panic!("{what}: {err:?}"));
            }
        }
    }
}
