//! Tiny zoo plans (models x parallelisms x forward/full), shared by the integration tests, the
//! benchmark and the examples of `shardproof-check`.

#![allow(dead_code)]

use shardproof_zoo::{
    emit_pipelined, AdamConfig, Bug, DeepseekConfig, EmitExtras, EmitOptions, Gpt2Config,
    LlamaConfig, Mesh, MlpConfig, MlpOptions, Optimizer, PipelineOptions, Schedule, TrainOptions,
    ZeroStage,
};
use std::path::{Path, PathBuf};

/// One zoo plan: model, mesh and options.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The model.
    pub model: &'static str,
    /// The mesh, as `zoo emit --mesh` takes it.
    pub mesh: &'static str,
    /// Forward and loss only.
    pub forward_only: bool,
    /// Vocab-parallel embedding and LM head (llama).
    pub vocab_parallel: bool,
    /// Sequence parallelism (gpt2, deepseek).
    pub sequence_parallel: bool,
    /// Microbatches of a pipelined plan.
    pub microbatches: usize,
    /// Training options.
    pub train: TrainOptions,
    /// mlp options.
    pub mlp_options: MlpOptions,
    /// gpt2 under SP: TP communication overlap.
    pub tp_comm_overlap: bool,
    /// A planted bug.
    pub bug: Option<&'static Bug>,
    /// A pipelined plan in GPipe order (1F1B otherwise).
    pub gpipe: bool,
}

impl Plan {
    /// A plain plan of `model` on `mesh`.
    pub fn new(model: &'static str, mesh: &'static str, forward_only: bool) -> Plan {
        Plan {
            model,
            mesh,
            forward_only,
            vocab_parallel: false,
            sequence_parallel: false,
            microbatches: 1,
            train: TrainOptions::default(),
            mlp_options: MlpOptions::default(),
            tp_comm_overlap: false,
            bug: None,
            gpipe: false,
        }
    }

    /// A short name for messages.
    pub fn label(&self) -> String {
        let mut s = format!(
            "{} {} {}",
            self.model,
            self.mesh,
            if self.forward_only { "forward" } else { "full" }
        );
        if self.vocab_parallel {
            s.push_str(" vp");
        }
        if self.sequence_parallel {
            s.push_str(" sp");
        }
        if self.microbatches > 1 {
            s.push_str(&format!(" mb={}", self.microbatches));
        }
        if let Some(b) = self.bug {
            s.push_str(&format!(" bug={}", b.id));
        }
        s
    }

    /// Emits the plan into a temporary directory and checks it (panics, naming the plan, where
    /// the zoo refuses it or the case does not load).
    pub fn check(&self) -> shardproof_check::Report {
        let dir = tempfile::tempdir().unwrap();
        let case = self
            .emit(dir.path())
            .unwrap_or_else(|e| panic!("{}: {e}", self.label()));
        let case = shardproof_case::load_case(&case).unwrap();
        shardproof_check::check_case(&case).unwrap_or_else(|e| panic!("{}: {e}", self.label()))
    }

    /// Emits the plan into `dir` and returns its case file, or the zoo's refusal.
    pub fn emit(&self, dir: &Path) -> Result<PathBuf, String> {
        let mesh = Mesh::parse(self.mesh)?;
        let pp = mesh.size("pp") > 1;
        let layers = 2;
        let dp = mesh.size("dp").max(1);
        let mb = self.microbatches.max(1);
        let batch = |b: usize| if pp { 2 * mb * dp } else { b };
        let opts = EmitOptions {
            model: self.model.into(),
            mlp: MlpConfig {
                layers,
                batch: if pp { 8 } else { MlpConfig::default().batch },
                ..MlpConfig::default()
            },
            llama: LlamaConfig {
                layers,
                batch: batch(LlamaConfig::default().batch),
                ..LlamaConfig::default()
            },
            mesh,
            bug: self.bug,
            forward_only: self.forward_only,
            vocab_parallel: self.vocab_parallel,
        };
        let d = DeepseekConfig::default();
        let extras = EmitExtras {
            gpt2: Gpt2Config {
                layers,
                batch: batch(Gpt2Config::default().batch),
                ..Gpt2Config::default()
            },
            sequence_parallel: self.sequence_parallel,
            deepseek: DeepseekConfig {
                base: LlamaConfig {
                    layers,
                    batch: batch(d.base.batch),
                    ..d.base
                },
                ..d
            },
            mlp_options: self.mlp_options,
            tp_comm_overlap: self.tp_comm_overlap,
            ..EmitExtras::default()
        };
        let pipeline = PipelineOptions {
            microbatches: self.microbatches,
            schedule: if pp && !self.gpipe {
                Schedule::OneFOneB
            } else {
                Schedule::GPipe
            },
            ..PipelineOptions::DEFAULT
        };
        let e = emit_pipelined(&opts, &extras, &self.train, &pipeline)?;
        e.write(dir).map_err(|e| e.to_string())?;
        Ok(dir.join("case.yaml"))
    }
}

/// The correct plans the tests check: every model under every parallelism it supports, forward
/// only and full iteration, at tiny sizes.
pub fn correct_plans() -> Vec<Plan> {
    let mut plans = Vec::new();
    for fw in [true, false] {
        for mesh in ["tp=2", "dp=2", "dp=2,tp=2"] {
            for model in ["mlp", "llama", "gpt2", "deepseek"] {
                plans.push(Plan::new(model, mesh, fw));
            }
        }
        plans.push(Plan::new("deepseek", "ep=2", fw));
        plans.push(Plan::new("deepseek", "dp=2,tp=2,ep=2", fw));
        plans.push(Plan {
            vocab_parallel: true,
            ..Plan::new("llama", "tp=2", fw)
        });
        plans.push(Plan {
            sequence_parallel: true,
            ..Plan::new("gpt2", "tp=2", fw)
        });
        plans.push(Plan {
            sequence_parallel: true,
            ..Plan::new("deepseek", "tp=2", fw)
        });
        for model in ["mlp", "llama", "gpt2", "deepseek"] {
            plans.push(Plan {
                microbatches: 2,
                ..Plan::new(model, "pp=2", fw)
            });
        }
        plans.push(Plan {
            microbatches: 2,
            ..Plan::new("llama", "dp=2,pp=2,tp=2", fw)
        });
        for model in ["llama", "gpt2", "deepseek"] {
            plans.push(Plan::new(model, "cp=2", fw));
        }
        plans.push(Plan::new("llama", "dp=2,cp=2,tp=2", fw));
    }
    // Training options of the full iteration.
    let full = |model, mesh| Plan::new(model, mesh, false);
    let adam = TrainOptions {
        optimizer: Optimizer::Adam(AdamConfig::default()),
        clip_grad: Some(1.0),
        loss_scale: Some(8.0),
        ..TrainOptions::PLAIN
    };
    for model in ["mlp", "llama", "gpt2"] {
        plans.push(Plan {
            train: adam,
            ..full(model, "dp=2,tp=2")
        });
        for zero in [ZeroStage::One, ZeroStage::Two, ZeroStage::Three] {
            plans.push(Plan {
                train: TrainOptions {
                    zero: Some(zero),
                    ..TrainOptions::PLAIN
                },
                ..full(model, "dp=2,tp=2")
            });
        }
        plans.push(Plan {
            train: TrainOptions {
                grad_accum: 2,
                ..TrainOptions::PLAIN
            },
            ..full(model, "dp=2")
        });
    }
    plans.push(Plan {
        mlp_options: MlpOptions {
            recompute: true,
            fp8: true,
        },
        ..full("mlp", "dp=2,tp=2")
    });
    plans.push(Plan {
        sequence_parallel: true,
        tp_comm_overlap: true,
        ..full("gpt2", "tp=2")
    });
    plans
}
