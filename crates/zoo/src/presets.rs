//! Presets: the Llama-3 and DeepSeek-V3 models TrainVerify verifies (its Tables 5 and 6) at
//! their real sizes, each with the parallel plan of its Table 2 as far as the zoo's mesh dims
//! express it, and a `-tiny` variant of each with the same structure (layers, query heads per
//! kv head, experts per selected expert) at sizes that `shardproof run` executes in seconds.
//!
//! `zoo emit --preset NAME` starts from a preset; size flags given with it override its values
//! one by one ([`SizeFlags`]), and `--mesh` replaces its plan (mesh and `--vocab-parallel`).
//!
//! **What the tables leave out.** Tables 5 and 6 give layers, width, heads, sequence length,
//! vocabulary and (DeepSeek) routed and activated experts; kv heads, MLP widths and the exact
//! vocabulary come from the public model configs the paper cites (Meta's Llama 3.1 and
//! DeepSeek's V2-Lite, V2 and V3 `config.json`), as each preset's comment says. Neither gives a
//! global batch: the full presets take one sequence per data-parallel rank, the smallest batch
//! their plan splits (a shape-reduced verification does not depend on it, and it keeps the
//! spec's `[batch, heads, seq, seq]` attention scores within the zoo's 2^40-element bound).
//!
//! **What the zoo does not model.** DeepSeek's multi-head latent attention (low-rank q/kv
//! compression, decoupled RoPE dims) is the zoo's grouped-query attention with as many kv heads
//! as heads (the configs' `num_key_value_heads`); its first dense layers
//! (`first_k_dense_replace`) are MoE layers like the rest; its shared experts are one SwiGLU
//! of width `n_shared_experts * moe_intermediate_size` (how DeepSeek's code implements them).

use crate::{
    DeepseekConfig, EmitExtras, EmitOptions, LlamaConfig, Mesh, PipelineOptions, RankGraphs,
    Schedule,
};

/// The plan of a TrainVerify Table 2 experiment: parallel degrees and microbatches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TablePlan {
    /// The experiment id in Table 2 (`L1`..`L3`, `D1`..`D3`).
    pub id: &'static str,
    /// Data-parallel degree.
    pub dp: usize,
    /// Tensor-parallel degree (for DeepSeek also the expert-parallel one: nnScaler treats
    /// expert parallelism as tensor parallelism of the same degree).
    pub tp: usize,
    /// Pipeline stages.
    pub pp: usize,
    /// Microbatches of the pipeline schedule.
    pub microbatches: usize,
}

impl TablePlan {
    /// GPUs of the plan: `dp * tp * pp`.
    pub fn gpus(&self) -> usize {
        self.dp * self.tp * self.pp
    }
}

/// The mixture-of-experts sizes of a DeepSeek preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeSizes {
    /// Inner width of each routed expert (`moe_intermediate_size`).
    pub moe_ffn: usize,
    /// Routed experts.
    pub experts: usize,
    /// Experts selected per token.
    pub top_k: usize,
}

/// The sizes of a preset (the model's flags of the same names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PresetSizes {
    /// Model width.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Inner width of the MLP (llama) or of the shared expert (deepseek).
    pub ffn: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Sequence length.
    pub seq: usize,
    /// Global batch (sequences).
    pub batch: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// The experts (deepseek presets only).
    pub moe: Option<MoeSizes>,
}

/// A named model size and plan of `zoo emit --preset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preset {
    /// The name (`llama3-405b`, `deepseek-v3-671b-tiny`, ...).
    pub name: &'static str,
    /// The zoo model it instantiates (`llama` or `deepseek`).
    pub model: &'static str,
    /// Its sizes.
    pub sizes: PresetSizes,
    /// The default mesh, dims in the zoo's mesh order.
    pub mesh: &'static [(&'static str, usize)],
    /// Whether the default plan splits the embedding and LM head over tp (`--vocab-parallel`).
    pub vocab_parallel: bool,
    /// The default plan's microbatches and schedule (`--microbatches`, `--pp-schedule`; used
    /// when its mesh has a `pp` dim).
    pub pipeline: PipelineOptions,
    /// The Table 2 plan of the model (of the full-size model, for a tiny variant).
    pub table: TablePlan,
    /// For a tiny variant: the full-size preset whose structure it keeps.
    pub tiny_of: Option<&'static str>,
    /// Where the sizes come from.
    pub source: &'static str,
}

/// Llama 3 at 8B, 70B and 405B: layers, width, heads, sequence from TrainVerify's Table 5; kv
/// heads, MLP width and vocabulary from Meta's Llama 3.1 `config.json` (Table 5 rounds the
/// vocabulary to 128000; the tokenizer has 128000 BPE tokens plus 256 special ones = 128256).
const LLAMA3_SOURCE: &str = "TrainVerify Tables 2 and 5; kv_heads, ffn and the exact vocab \
     (128256, Table 5 rounds to 128000) from Meta's Llama 3.1 config.json";

/// DeepSeek at 16B and 236B are the V2-Lite and V2 shapes TrainVerify evaluates as "DS-V3";
/// 671B is V3.
const DEEPSEEK_SOURCE: &str = "TrainVerify Tables 2 and 6; kv_heads (= heads: MLA), moe_ffn \
     and ffn (shared experts x moe_ffn) from DeepSeek's config.json (16B: V2-Lite, 236B: V2, \
     671B: V3)";

/// The pipeline options of a plan without a `pp` mesh dim.
const NO_PIPELINE: PipelineOptions = PipelineOptions::DEFAULT;

/// A pipeline of `microbatches` microbatches on Megatron's default schedule, 1F1B (Table 2
/// gives none), the first and the last stage given their own layer counts if any.
const fn one_f_one_b(
    microbatches: usize,
    first_stage_layers: Option<usize>,
    last_stage_layers: Option<usize>,
) -> PipelineOptions {
    PipelineOptions {
        microbatches,
        schedule: Schedule::OneFOneB,
        first_stage_layers,
        last_stage_layers,
    }
}

/// Table 2, experiment L1 (Llama3-8B).
const L1: TablePlan = TablePlan {
    id: "L1",
    dp: 512,
    tp: 1,
    pp: 1,
    microbatches: 1,
};

/// Table 2, experiment L2 (Llama3-70B).
const L2: TablePlan = TablePlan {
    id: "L2",
    dp: 16,
    tp: 8,
    pp: 4,
    microbatches: 32,
};

/// Table 2, experiment L3 (Llama3-405B).
const L3: TablePlan = TablePlan {
    id: "L3",
    dp: 64,
    tp: 8,
    pp: 16,
    microbatches: 16,
};

/// Table 2, experiment D1 (DS-V3-16B).
const D1: TablePlan = TablePlan {
    id: "D1",
    dp: 16,
    tp: 4,
    pp: 2,
    microbatches: 16,
};

/// Table 2, experiment D2 (DS-V3-236B).
const D2: TablePlan = TablePlan {
    id: "D2",
    dp: 16,
    tp: 8,
    pp: 4,
    microbatches: 16,
};

/// Table 2, experiment D3 (DS-V3-671B).
const D3: TablePlan = TablePlan {
    id: "D3",
    dp: 32,
    tp: 8,
    pp: 8,
    microbatches: 16,
};

/// The sequence length of every Llama 3 preset (Table 5).
const LLAMA3_SEQ: usize = 8192;

/// The vocabulary of every Llama 3 preset (see [`LLAMA3_SOURCE`]).
const LLAMA3_VOCAB: usize = 128256;

/// The sequence length of every DeepSeek preset (Table 6).
const DEEPSEEK_SEQ: usize = 16384;

/// A full-size Llama 3 preset: `sizes` and the plan of Table 2 experiment `table`.
const fn llama3(
    name: &'static str,
    sizes: PresetSizes,
    mesh: &'static [(&'static str, usize)],
    vocab_parallel: bool,
    pipeline: PipelineOptions,
    table: TablePlan,
) -> Preset {
    Preset {
        name,
        model: "llama",
        sizes,
        mesh,
        vocab_parallel,
        pipeline,
        table,
        tiny_of: None,
        source: LLAMA3_SOURCE,
    }
}

/// A full-size DeepSeek preset: `sizes` and the plan of Table 2 experiment `table` (the
/// embedding and the LM head never split over tp).
const fn deepseek_v3(
    name: &'static str,
    sizes: PresetSizes,
    mesh: &'static [(&'static str, usize)],
    pipeline: PipelineOptions,
    table: TablePlan,
) -> Preset {
    Preset {
        name,
        model: "deepseek",
        sizes,
        mesh,
        vocab_parallel: false,
        pipeline,
        table,
        tiny_of: None,
        source: DEEPSEEK_SOURCE,
    }
}

/// Table 2 L1: DP 512, TP 1, PP 1, 1 microbatch — expressible as is.
const LLAMA3_8B: Preset = llama3(
    "llama3-8b",
    PresetSizes {
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        ffn: 14336,
        layers: 32,
        seq: LLAMA3_SEQ,
        batch: 512,
        vocab: LLAMA3_VOCAB,
        moe: None,
    },
    &[("dp", 512)],
    false,
    NO_PIPELINE,
    L1,
);

/// Table 2 L2: DP 16, TP 8, PP 4, 32 microbatches — expressible as is.
const LLAMA3_70B: Preset = llama3(
    "llama3-70b",
    PresetSizes {
        hidden: 8192,
        heads: 64,
        kv_heads: 8,
        ffn: 28672,
        layers: 80,
        seq: LLAMA3_SEQ,
        // 32 microbatches of one sequence per dp rank.
        batch: 512,
        vocab: LLAMA3_VOCAB,
        moe: None,
    },
    &[("pp", 4), ("dp", 16), ("tp", 8)],
    true,
    one_f_one_b(32, None, None),
    L2,
);

/// Table 2 L3: DP 64, TP 8, PP 16, 16 microbatches — expressible with uneven stages: 126
/// layers do not split into 16 equal stages, and Meta's 405B "reduce[d] one Transformer layer
/// each from the first and the last stages" (Llama 3 paper, 3.3.2; they carry the embedding
/// and the LM head + loss): 7 + 14 x 8 + 7 (Megatron's
/// --decoder-first/last-pipeline-num-layers 7).
const LLAMA3_405B: Preset = llama3(
    "llama3-405b",
    PresetSizes {
        hidden: 16384,
        heads: 128,
        kv_heads: 8,
        ffn: 53248,
        layers: 126,
        seq: LLAMA3_SEQ,
        // 16 microbatches of one sequence per dp rank.
        batch: 1024,
        vocab: LLAMA3_VOCAB,
        moe: None,
    },
    &[("pp", 16), ("dp", 64), ("tp", 8)],
    true,
    one_f_one_b(16, Some(7), Some(7)),
    L3,
);

/// Table 2 D1: DP 16, TP 4 (= EP), PP 2, 16 microbatches. The zoo carves ep out of data
/// parallelism (Megatron): dp=4 x ep=4 is the data-parallel degree 16 of the dense weights,
/// ep=4 splits the experts, tp=4 the attention and each expert's inner width. 27 layers over 2
/// stages: 14 + 13, the last stage lighter (it also runs the LM head over the 102400-word
/// vocabulary and the loss; the first stage's embedding is a lookup).
const DEEPSEEK_V3_16B: Preset = deepseek_v3(
    "deepseek-v3-16b",
    PresetSizes {
        hidden: 2048,
        heads: 16,
        kv_heads: 16,
        // Two shared experts of moe_intermediate_size 1408.
        ffn: 2816,
        layers: 27,
        seq: DEEPSEEK_SEQ,
        // 16 microbatches of one sequence per data-parallel (dp x ep) rank.
        batch: 256,
        vocab: 102400,
        moe: Some(MoeSizes {
            moe_ffn: 1408,
            experts: 64,
            top_k: 6,
        }),
    },
    &[("pp", 2), ("dp", 4), ("tp", 4), ("ep", 4)],
    one_f_one_b(16, None, Some(13)),
    D1,
);

/// Table 2 D2: DP 16, TP 8 (= EP), PP 4, 16 microbatches: dp=2 x ep=8 (data parallel 16) x
/// tp=8, 60 layers in 4 even stages of 15.
const DEEPSEEK_V3_236B: Preset = deepseek_v3(
    "deepseek-v3-236b",
    PresetSizes {
        hidden: 5120,
        heads: 128,
        kv_heads: 128,
        // Two shared experts of moe_intermediate_size 1536.
        ffn: 3072,
        layers: 60,
        seq: DEEPSEEK_SEQ,
        batch: 256,
        vocab: 102400,
        moe: Some(MoeSizes {
            moe_ffn: 1536,
            experts: 160,
            top_k: 6,
        }),
    },
    &[("pp", 4), ("dp", 2), ("tp", 8), ("ep", 8)],
    one_f_one_b(16, None, None),
    D2,
);

/// Table 2 D3: DP 32, TP 8 (= EP), PP 8, 16 microbatches: dp=4 x ep=8 (data parallel 32) x
/// tp=8; 61 layers over 8 stages as 7 + 6 x 8 + 6: the first stage one layer lighter (the
/// embedding, as Meta's 405B), the last two (the LM head over 129280 words and the loss).
const DEEPSEEK_V3_671B: Preset = deepseek_v3(
    "deepseek-v3-671b",
    PresetSizes {
        hidden: 7168,
        heads: 128,
        kv_heads: 128,
        // One shared expert of moe_intermediate_size 2048.
        ffn: 2048,
        layers: 61,
        seq: DEEPSEEK_SEQ,
        batch: 512,
        vocab: 129280,
        moe: Some(MoeSizes {
            moe_ffn: 2048,
            experts: 256,
            top_k: 8,
        }),
    },
    &[("pp", 8), ("dp", 4), ("tp", 8), ("ep", 8)],
    one_f_one_b(16, Some(7), Some(6)),
    D3,
);

/// The widths of a tiny variant: the sizes it does not take from its full preset or share
/// with every tiny variant.
struct TinyWidths {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    ffn: usize,
    batch: usize,
    moe: Option<MoeSizes>,
}

/// The mesh of a tiny variant whose full plan has every dim: each at size 2.
const TINY_FULL_MESH: &[(&str, usize)] = &[("pp", 2), ("dp", 2), ("tp", 2), ("ep", 2)];

/// The tiny variant `name` of `full`: its model, layers, vocabulary layout and Table 2 plan,
/// at `widths` with 8 positions and a 64-word vocabulary, on `mesh` with `pipeline`.
const fn tiny_variant(
    full: &Preset,
    name: &'static str,
    widths: TinyWidths,
    mesh: &'static [(&'static str, usize)],
    pipeline: PipelineOptions,
    source: &'static str,
) -> Preset {
    Preset {
        name,
        model: full.model,
        sizes: PresetSizes {
            hidden: widths.hidden,
            heads: widths.heads,
            kv_heads: widths.kv_heads,
            ffn: widths.ffn,
            layers: full.sizes.layers,
            seq: 8,
            batch: widths.batch,
            vocab: 64,
            moe: widths.moe,
        },
        mesh,
        vocab_parallel: full.vocab_parallel,
        pipeline,
        table: full.table,
        tiny_of: Some(full.name),
        source,
    }
}

/// The presets, full-size then tiny, in the order `zoo list` prints them.
pub const PRESETS: &[Preset] = &[
    LLAMA3_8B,
    LLAMA3_70B,
    LLAMA3_405B,
    DEEPSEEK_V3_16B,
    DEEPSEEK_V3_236B,
    DEEPSEEK_V3_671B,
    // The tiny variants: the same layers, query heads per kv head (4, 8, 16) and experts per
    // selected expert (64/6 = 32/3, 160/6 = 80/3, 256/8 = 64/2), the same mesh dims at size
    // 2, every width small.
    tiny_variant(
        &LLAMA3_8B,
        "llama3-8b-tiny",
        TinyWidths {
            hidden: 32,
            heads: 8,
            kv_heads: 2,
            ffn: 112,
            batch: 2,
            moe: None,
        },
        &[("dp", 2)],
        NO_PIPELINE,
        "test-size variant of llama3-8b",
    ),
    tiny_variant(
        &LLAMA3_70B,
        "llama3-70b-tiny",
        TinyWidths {
            hidden: 64,
            heads: 16,
            kv_heads: 2,
            ffn: 224,
            batch: 4,
            moe: None,
        },
        &[("pp", 2), ("dp", 2), ("tp", 2)],
        one_f_one_b(2, None, None),
        "test-size variant of llama3-70b",
    ),
    // pp = 4, not 2: the full plan's division (the first and last stages one layer lighter
    // than the others) needs middle stages: 31 + 32 + 32 + 31.
    tiny_variant(
        &LLAMA3_405B,
        "llama3-405b-tiny",
        TinyWidths {
            hidden: 64,
            heads: 32,
            kv_heads: 2,
            ffn: 208,
            batch: 4,
            moe: None,
        },
        &[("pp", 4), ("dp", 2), ("tp", 2)],
        one_f_one_b(2, Some(31), Some(31)),
        "test-size variant of llama3-405b",
    ),
    tiny_variant(
        &DEEPSEEK_V3_16B,
        "deepseek-v3-16b-tiny",
        TinyWidths {
            hidden: 16,
            heads: 4,
            kv_heads: 4,
            ffn: 8,
            batch: 8,
            moe: Some(MoeSizes {
                moe_ffn: 4,
                experts: 32,
                top_k: 3,
            }),
        },
        TINY_FULL_MESH,
        one_f_one_b(2, None, Some(13)),
        "test-size variant of deepseek-v3-16b",
    ),
    tiny_variant(
        &DEEPSEEK_V3_236B,
        "deepseek-v3-236b-tiny",
        TinyWidths {
            hidden: 16,
            heads: 8,
            kv_heads: 8,
            ffn: 8,
            batch: 8,
            moe: Some(MoeSizes {
                moe_ffn: 4,
                experts: 80,
                top_k: 3,
            }),
        },
        TINY_FULL_MESH,
        one_f_one_b(2, None, None),
        "test-size variant of deepseek-v3-236b",
    ),
    tiny_variant(
        &DEEPSEEK_V3_671B,
        "deepseek-v3-671b-tiny",
        TinyWidths {
            hidden: 16,
            heads: 8,
            kv_heads: 8,
            ffn: 4,
            batch: 8,
            moe: Some(MoeSizes {
                moe_ffn: 4,
                experts: 64,
                top_k: 2,
            }),
        },
        TINY_FULL_MESH,
        one_f_one_b(2, None, Some(30)),
        "test-size variant of deepseek-v3-671b",
    ),
];

/// The preset called `name`, or an error listing the presets.
pub fn find_preset(name: &str) -> Result<&'static Preset, String> {
    PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
        crate::suggest::unknown(
            "preset",
            name,
            PRESETS.iter().map(|p| p.name),
            "shardproof zoo list",
        )
    })
}

impl Preset {
    /// The default mesh.
    pub fn mesh(&self) -> Mesh {
        Mesh {
            dims: self.mesh.to_vec(),
        }
    }

    /// The llama sizes (of a deepseek preset: the sizes it shares with llama), with the model's
    /// default learning rate and epsilon.
    pub fn llama(&self) -> LlamaConfig {
        let s = &self.sizes;
        LlamaConfig {
            hidden: s.hidden,
            heads: s.heads,
            kv_heads: s.kv_heads,
            ffn: s.ffn,
            layers: s.layers,
            seq: s.seq,
            batch: s.batch,
            vocab: s.vocab,
            ..LlamaConfig::default()
        }
    }

    /// The deepseek sizes (of a llama preset: the deepseek defaults for the experts), with the
    /// model's default learning rate, epsilon and auxiliary-loss weight.
    pub fn deepseek(&self) -> DeepseekConfig {
        let d = DeepseekConfig::default();
        let moe = self.sizes.moe.unwrap_or(MoeSizes {
            moe_ffn: d.moe_ffn,
            experts: d.experts,
            top_k: d.top_k,
        });
        DeepseekConfig {
            base: self.llama(),
            moe_ffn: moe.moe_ffn,
            experts: moe.experts,
            top_k: moe.top_k,
            ..d
        }
    }

    /// What `zoo emit --preset NAME` emits with no other flag: the preset's sizes and plan,
    /// shared rank graph files, the full iteration with SGD (pass the extras to
    /// [`crate::emit_pipelined`] or [`crate::emit_to_dir`] with [`crate::TrainOptions::PLAIN`]).
    pub fn request(&'static self) -> (EmitOptions, EmitExtras, PipelineOptions) {
        let opts = EmitOptions {
            model: self.model.to_string(),
            mlp: crate::MlpConfig::default(),
            llama: self.llama(),
            mesh: self.mesh(),
            bug: None,
            forward_only: false,
            vocab_parallel: self.vocab_parallel,
        };
        let extras = EmitExtras {
            deepseek: self.deepseek(),
            rank_graphs: RankGraphs::Shared,
            preset: Some(self),
            ..EmitExtras::default()
        };
        (opts, extras, self.pipeline)
    }

    /// The sizes in one line, e.g. `hidden 16384, heads 128/8 kv, ffn 53248, 126 layers, ...`.
    pub fn sizes_line(&self) -> String {
        let s = &self.sizes;
        let mut line = format!(
            "hidden {}, heads {}/{} kv, ffn {}, {} layers, seq {}, batch {}, vocab {}",
            s.hidden, s.heads, s.kv_heads, s.ffn, s.layers, s.seq, s.batch, s.vocab
        );
        if let Some(m) = s.moe {
            line.push_str(&format!(
                ", {} experts top-{} moe_ffn {}",
                m.experts, m.top_k, m.moe_ffn
            ));
        }
        line
    }

    /// The default plan as mesh flags, e.g. `dp=64,tp=8 --vocab-parallel`.
    pub fn plan_flags(&self) -> String {
        let dims: Vec<String> = self.mesh.iter().map(|(d, n)| format!("{d}={n}")).collect();
        let mut flags = dims.join(",");
        if self.vocab_parallel {
            flags.push_str(" --vocab-parallel");
        }
        if self.mesh.iter().any(|(d, _)| *d == "pp") {
            flags.push_str(&format!(
                " --microbatches {} --pp-schedule {}",
                self.pipeline.microbatches,
                self.pipeline.schedule.name()
            ));
            if let Some(n) = self.pipeline.first_stage_layers {
                flags.push_str(&format!(" --pp-first-layers {n}"));
            }
            if let Some(n) = self.pipeline.last_stage_layers {
                flags.push_str(&format!(" --pp-last-layers {n}"));
            }
        }
        flags
    }

    /// How the default plan relates to the Table 2 plan, in one line.
    pub fn plan_note(&self) -> String {
        let t = &self.table;
        if let Some(full) = self.tiny_of {
            return format!(
                "test-size variant of {full} (structure of Table 2 {}) on {}",
                t.id,
                self.plan_flags()
            );
        }
        let plural = if t.microbatches == 1 { "" } else { "es" };
        let table = format!(
            "Table 2 {}: DP {} TP {} PP {}, {} microbatch{plural}, {} GPUs",
            t.id,
            t.dp,
            t.tp,
            t.pp,
            t.microbatches,
            t.gpus()
        );
        let mut note = format!("{table}; emitted as {}", self.plan_flags());
        if self.model == "deepseek" {
            // nnScaler's expert parallelism has the tp degree; the zoo's carves it out of dp.
            note.push_str(&format!(
                " (experts split over ep = TP; data parallel dp x ep = {})",
                self.mesh().size("dp") * self.mesh().size("ep")
            ));
        }
        let mesh = self.mesh();
        if t.pp > 1 && mesh.size("pp") == 1 {
            note.push_str(&format!(
                ", {} ranks without pp: every rank holds all {} layers, the microbatches are \
                 not split",
                mesh.ranks(),
                self.sizes.layers
            ));
        }
        note
    }
}

/// Size flags of `zoo emit`: each one given replaces the value of the preset (or of the
/// model's tiny default size) it names; those not given keep it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SizeFlags {
    /// `--hidden`.
    pub hidden: Option<usize>,
    /// `--heads`.
    pub heads: Option<usize>,
    /// `--kv-heads`.
    pub kv_heads: Option<usize>,
    /// `--ffn`.
    pub ffn: Option<usize>,
    /// `--layers`.
    pub layers: Option<usize>,
    /// `--seq`.
    pub seq: Option<usize>,
    /// `--batch`.
    pub batch: Option<usize>,
    /// `--vocab`.
    pub vocab: Option<usize>,
    /// `--moe-ffn` (deepseek).
    pub moe_ffn: Option<usize>,
    /// `--experts` (deepseek).
    pub experts: Option<usize>,
    /// `--top-k` (deepseek).
    pub top_k: Option<usize>,
}

impl SizeFlags {
    /// `base` with the llama sizes these flags give replaced.
    pub fn llama(&self, base: &LlamaConfig) -> LlamaConfig {
        LlamaConfig {
            hidden: self.hidden.unwrap_or(base.hidden),
            heads: self.heads.unwrap_or(base.heads),
            kv_heads: self.kv_heads.unwrap_or(base.kv_heads),
            ffn: self.ffn.unwrap_or(base.ffn),
            layers: self.layers.unwrap_or(base.layers),
            seq: self.seq.unwrap_or(base.seq),
            batch: self.batch.unwrap_or(base.batch),
            vocab: self.vocab.unwrap_or(base.vocab),
            ..base.clone()
        }
    }

    /// `base` with the deepseek sizes these flags give replaced.
    pub fn deepseek(&self, base: &DeepseekConfig) -> DeepseekConfig {
        DeepseekConfig {
            base: self.llama(&base.base),
            moe_ffn: self.moe_ffn.unwrap_or(base.moe_ffn),
            experts: self.experts.unwrap_or(base.experts),
            top_k: self.top_k.unwrap_or(base.top_k),
            ..base.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_every_preset_and_lists_them_on_a_miss() {
        for p in PRESETS {
            assert_eq!(find_preset(p.name).unwrap(), p);
        }
        let err = find_preset("llama3-7b").unwrap_err();
        assert!(err.starts_with("unknown preset `llama3-7b`; known: llama3-8b, "));
        assert!(
            err.ends_with("\n  hint: did you mean `llama3-70b` or `llama3-8b`?"),
            "{err}"
        );
        for p in PRESETS {
            assert!(err.contains(p.name), "{err}");
        }
        let mut names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PRESETS.len(), "preset names are unique");
    }

    #[test]
    fn flags_override_preset_sizes_one_by_one() {
        let p = find_preset("llama3-405b").unwrap();
        assert_eq!(SizeFlags::default().llama(&p.llama()), p.llama());
        let flags = SizeFlags {
            layers: Some(2),
            seq: Some(16),
            ..SizeFlags::default()
        };
        let c = flags.llama(&p.llama());
        assert_eq!((c.layers, c.seq), (2, 16));
        assert_eq!((c.hidden, c.heads, c.kv_heads), (16384, 128, 8));
        assert_eq!((c.ffn, c.batch, c.vocab), (53248, 1024, 128256));

        let d = find_preset("deepseek-v3-671b").unwrap();
        let flags = SizeFlags {
            experts: Some(16),
            hidden: Some(64),
            ..SizeFlags::default()
        };
        let c = flags.deepseek(&d.deepseek());
        assert_eq!((c.experts, c.base.hidden), (16, 64));
        assert_eq!((c.top_k, c.moe_ffn, c.base.layers), (8, 2048, 61));
        assert_eq!(c.aux_alpha, DeepseekConfig::default().aux_alpha);
    }

    #[test]
    fn full_presets_have_the_documented_sizes() {
        // name: hidden, layers, heads, kv heads, ffn, seq, vocab; experts, top-k, moe_ffn.
        type Dense = (usize, usize, usize, usize, usize, usize, usize);
        type Moe = Option<(usize, usize, usize)>;
        let expected: [(&str, Dense, Moe); 6] = [
            ("llama3-8b", (4096, 32, 32, 8, 14336, 8192, 128256), None),
            ("llama3-70b", (8192, 80, 64, 8, 28672, 8192, 128256), None),
            (
                "llama3-405b",
                (16384, 126, 128, 8, 53248, 8192, 128256),
                None,
            ),
            (
                "deepseek-v3-16b",
                (2048, 27, 16, 16, 2816, 16384, 102400),
                Some((64, 6, 1408)),
            ),
            (
                "deepseek-v3-236b",
                (5120, 60, 128, 128, 3072, 16384, 102400),
                Some((160, 6, 1536)),
            ),
            (
                "deepseek-v3-671b",
                (7168, 61, 128, 128, 2048, 16384, 129280),
                Some((256, 8, 2048)),
            ),
        ];
        for (name, dense, moe) in expected {
            let s = find_preset(name).unwrap().sizes;
            let got = (
                s.hidden, s.layers, s.heads, s.kv_heads, s.ffn, s.seq, s.vocab,
            );
            assert_eq!(got, dense, "{name}");
            let got = s.moe.map(|m| (m.experts, m.top_k, m.moe_ffn));
            assert_eq!(got, moe, "{name}");
        }
    }

    #[test]
    fn plans_follow_table_2() {
        let table = |name| find_preset(name).unwrap().table;
        let plans: Vec<(usize, usize, usize, usize)> = [
            "llama3-8b",
            "llama3-70b",
            "llama3-405b",
            "deepseek-v3-16b",
            "deepseek-v3-236b",
            "deepseek-v3-671b",
        ]
        .iter()
        .map(|n| {
            let t = table(n);
            (t.dp, t.tp, t.pp, t.microbatches)
        })
        .collect();
        assert_eq!(
            plans,
            [
                (512, 1, 1, 1),
                (16, 8, 4, 32),
                (64, 8, 16, 16),
                (16, 4, 2, 16),
                (16, 8, 4, 16),
                (32, 8, 8, 16)
            ]
        );
        for p in PRESETS.iter().filter(|p| p.tiny_of.is_none()) {
            let mesh = p.mesh();
            let t = p.table;
            // Without pp: the table's data-parallel degree (dp x ep: ep is carved out of data
            // parallelism) and tensor-parallel degree, and expert parallelism at the tp degree.
            assert_eq!(mesh.size("dp") * mesh.size("ep"), t.dp, "{}", p.name);
            assert_eq!(mesh.size("tp"), t.tp, "{}", p.name);
            if p.model == "deepseek" {
                assert_eq!(mesh.size("ep"), t.tp, "{}", p.name);
            }
            let pp = mesh.size("pp");
            if pp > 1 {
                assert_eq!((pp, p.pipeline.microbatches), (t.pp, t.microbatches));
            }
            assert_eq!(mesh.ranks() * t.pp / pp, t.gpus(), "{}", p.name);
        }
    }

    #[test]
    fn tiny_variants_keep_the_structure() {
        for tiny in PRESETS.iter().filter(|p| p.tiny_of.is_some()) {
            let full = find_preset(tiny.tiny_of.unwrap()).unwrap();
            assert_eq!(tiny.name, format!("{}-tiny", full.name));
            assert_eq!((tiny.model, tiny.table), (full.model, full.table));
            let (t, f) = (&tiny.sizes, &full.sizes);
            assert_eq!(t.layers, f.layers, "{}", tiny.name);
            assert_eq!(t.heads * f.kv_heads, f.heads * t.kv_heads, "{}", tiny.name);
            if let (Some(tm), Some(fm)) = (t.moe, f.moe) {
                assert_eq!(
                    tm.experts * fm.top_k,
                    fm.experts * tm.top_k,
                    "{}",
                    tiny.name
                );
            }
            let dims = |p: &Preset| p.mesh.iter().map(|(d, _)| *d).collect::<Vec<_>>();
            assert_eq!(dims(tiny), dims(full), "{}", tiny.name);
            assert_eq!(tiny.vocab_parallel, full.vocab_parallel, "{}", tiny.name);
            assert_eq!(
                tiny.pipeline.schedule, full.pipeline.schedule,
                "{}",
                tiny.name
            );
        }
        assert_eq!(PRESETS.iter().filter(|p| p.tiny_of.is_some()).count(), 6);
    }

    #[test]
    fn every_preset_passes_the_emit_checks() {
        for p in PRESETS {
            let (opts, extras, pipeline) = p.request();
            let planned =
                crate::check_and_plan(&opts, &extras, &crate::TrainOptions::PLAIN, &pipeline);
            assert!(planned.is_ok(), "{}: {:?}", p.name, planned.err());
        }
    }

    #[test]
    fn every_preset_splits_over_its_plan() {
        for p in PRESETS {
            let mesh = p.mesh();
            let dims: Vec<String> = p.mesh.iter().map(|(d, n)| format!("{d}={n}")).collect();
            assert_eq!(Mesh::parse(&dims.join(",")).unwrap(), mesh, "mesh order");
            let (dp, tp, ep) = (mesh.size("dp"), mesh.size("tp"), mesh.size("ep"));
            let checked = if p.model == "deepseek" {
                p.deepseek().check_split(dp, tp, ep)
            } else {
                p.llama().check_split(dp, tp, p.vocab_parallel)
            };
            let pp = mesh.size("pp");
            let microbatches = p.pipeline.microbatches;
            let division = crate::Division::new(
                p.sizes.layers,
                pp,
                p.pipeline.first_stage_layers,
                p.pipeline.last_stage_layers,
            );
            assert!(division.is_ok(), "{}: {:?}", p.name, division.err());
            assert!(
                (p.sizes.batch / dp).is_multiple_of(microbatches),
                "{}",
                p.name
            );
            assert_eq!(checked, Ok(()), "{}", p.name);
        }
    }
}
