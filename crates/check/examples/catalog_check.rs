//! Checks the catalog bugs `check` claims, each planted in its smallest plan, and the plan
//! without it; prints each verdict (`catalog_check`).
#[path = "../tests/common/plans.rs"]
mod plans;
use plans::Plan;

fn main() {
    let tp = |m| Plan::new(m, "tp=2", false);
    let cases: Vec<(&str, Plan)> = vec![
        ("tp-missing-allreduce", tp("mlp")),
        ("tp-bias-before-allreduce", tp("mlp")),
        ("wrong-group", Plan::new("mlp", "dp=2,tp=2", false)),
        ("llama-oproj-missing-allreduce", tp("llama")),
        ("llama-qkv-grad-missing-allreduce", tp("llama")),
        (
            "llama-vocab-embedding-unmasked",
            Plan {
                vocab_parallel: true,
                ..tp("llama")
            },
        ),
        (
            "sp-layernorm-grad-not-reduced",
            Plan {
                sequence_parallel: true,
                ..tp("gpt2")
            },
        ),
        (
            "moe-aux-loss-not-divided-by-tp",
            Plan::new("deepseek", "tp=2", true),
        ),
        ("moe-router-grad-unsynced", tp("deepseek")),
        (
            "pp-mismatched-send-recv",
            Plan {
                microbatches: 2,
                ..Plan::new("llama", "pp=2", false)
            },
        ),
        ("norm-sharded-hidden", Plan::new("deepseek", "tp=2", true)),
        ("async-allreduce-no-wait", tp("mlp")),
        (
            "fp8-amax-wrong-group",
            Plan {
                mlp_options: shardproof_zoo::MlpOptions {
                    recompute: false,
                    fp8: true,
                },
                ..Plan::new("mlp", "dp=2,tp=2", false)
            },
        ),
        (
            "tp-overlap-wrong-chunk-order",
            Plan {
                sequence_parallel: true,
                tp_comm_overlap: true,
                ..tp("gpt2")
            },
        ),
        (
            "tp-cp-layernorm-grad-scaled-by-tp",
            Plan::new("llama", "cp=2,tp=2", false),
        ),
    ];
    let root = tempfile::tempdir().unwrap();
    // CATALOG_CHECK_KEEP=DIR keeps the emitted cases there.
    let keep = std::env::var_os("CATALOG_CHECK_KEEP").map(std::path::PathBuf::from);
    for (i, (bug, plan)) in cases.into_iter().enumerate() {
        for planted in [false, true] {
            let p = Plan {
                bug: if planted {
                    shardproof_zoo::find_bug(bug)
                } else {
                    None
                },
                ..plan.clone()
            };
            let dir = keep
                .as_deref()
                .unwrap_or(root.path())
                .join(format!("{i:03}{planted}"));
            let case = match p.emit(&dir) {
                Ok(c) => c,
                Err(e) => {
                    println!("{bug} planted={planted}: emit refused: {e}");
                    continue;
                }
            };
            let case = shardproof_case::load_case(&case).unwrap();
            let r = shardproof_check::check_case(&case).unwrap();
            println!(
                "{bug:40} planted={planted:5} {:?} findings={}",
                r.verdict,
                r.findings.len()
            );
            if std::env::args().nth(1).is_some_and(|f| bug.contains(&f)) {
                print!("{}", r.render());
            }
        }
    }
}
