//! `shardproof zoo`: list the model zoo and the bug catalog, emit a case.

use crate::Verdict;
use clap::{Args as ClapArgs, Subcommand};
use shardproof_zoo::suggest;
use shardproof_zoo::{
    emit_to_dir, find_bug, find_preset, AdamConfig, DeepseekConfig, EmitExtras, EmitOptions,
    EpDispatch, Gpt2Config, LlamaConfig, Mesh, MlpConfig, MlpOptions, Optimizer, PipelineOptions,
    RankGraphs, Schedule, SizeFlags, TrainOptions, ZeroStage, BUGS, MODELS, PARALLELISMS, PRESETS,
    TRAINING,
};
use std::path::PathBuf;

/// Subcommands of `shardproof zoo`.
#[derive(Subcommand)]
pub enum ZooCommand {
    /// List the models, presets, parallelisms and the bug catalog, in columns that fit the
    /// terminal (100 columns when stdout is not one), or as JSON.
    List(ListArgs),
    /// Emit a spec graph, one graph per rank and a case file into a directory.
    Emit(Box<EmitArgs>),
}

/// Arguments of `shardproof zoo list`.
#[derive(ClapArgs)]
pub struct ListArgs {
    /// Print only the bug catalog.
    #[arg(long)]
    bugs: bool,
    /// Print machine-readable JSON on stdout: one object per model, preset, parallelism,
    /// option and bug.
    #[arg(long)]
    json: bool,
}

/// Arguments of `shardproof zoo emit`.
#[derive(ClapArgs)]
pub struct EmitArgs {
    /// The model (see `zoo list`); may be left out with --preset.
    model: Option<String>,
    /// Start from a preset's sizes and plan (see `zoo list`): size flags override its values,
    /// --mesh replaces its plan (mesh, --vocab-parallel, --microbatches, --pp-schedule).
    #[arg(long, value_name = "NAME")]
    preset: Option<String>,
    /// The mesh, e.g. `dp=2,tp=2` (default: tp=2, or the preset's plan).
    #[arg(long)]
    mesh: Option<String>,
    /// Write one graph file per distinct rank program, named after its first rank, and let the
    /// case map every rank to its file (default: on with --preset, off otherwise).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    share_graphs: Option<bool>,
    /// Plant a bug from the catalog (see `zoo list`).
    #[arg(long)]
    bug: Option<String>,
    /// Emit the forward pass and loss only.
    #[arg(long)]
    forward_only: bool,
    /// Llama: split the embedding and LM head along the vocabulary over tp (vocab-parallel
    /// embedding and cross-entropy).
    #[arg(long)]
    vocab_parallel: bool,
    /// gpt2: Megatron sequence parallelism over tp (activations outside the tensor-parallel
    /// regions split along the sequence, all-gather / reduce-scatter around them); deepseek:
    /// the MoE blocks on the rank's sequence chunk with experts replicated over tp.
    #[arg(long)]
    sequence_parallel: bool,
    /// Model width (default: the model's tiny size; mlp 16, llama 16, gpt2 16, deepseek 16).
    #[arg(long)]
    hidden: Option<usize>,
    /// Inner width of every MLP (default: mlp 32, llama 32, gpt2 64; deepseek: the shared
    /// expert's, 16).
    #[arg(long)]
    ffn: Option<usize>,
    /// Global batch size (default: mlp 8, llama 2, gpt2 2, deepseek 4).
    #[arg(long)]
    batch: Option<usize>,
    /// Number of layers (default: mlp 1, llama 2, gpt2 2, deepseek 2).
    #[arg(long)]
    layers: Option<usize>,
    /// Attention heads (llama, gpt2, deepseek; default 4).
    #[arg(long)]
    heads: Option<usize>,
    /// Key/value heads of grouped-query attention (llama, deepseek; default 2).
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Sequence length (llama, gpt2, deepseek; default 8).
    #[arg(long)]
    seq: Option<usize>,
    /// Vocabulary size (llama, gpt2, deepseek; default 32).
    #[arg(long)]
    vocab: Option<usize>,
    /// The optimizer step of the full iteration.
    #[arg(long, default_value = "sgd", value_parser = ["sgd", "adam"])]
    optimizer: String,
    /// Adam: the step number t of this update (bias corrections 1 - beta^t; default 1).
    #[arg(long)]
    adam_step: Option<u32>,
    /// Clip the global gradient norm to MAXNORM before the optimizer step.
    #[arg(long, value_name = "MAXNORM")]
    clip_grad: Option<f64>,
    /// Static loss scaling: scale the loss by S before the backward, unscale the gradients.
    #[arg(long, value_name = "S")]
    loss_scale: Option<f64>,
    /// Accumulate gradients over M microbatches per dp rank.
    #[arg(long, value_name = "M", default_value_t = 1)]
    grad_accum: usize,
    /// ZeRO over dp: 1 splits the optimizer states, 2 the gradients too, 3 the parameters too.
    #[arg(long, value_name = "STAGE", value_parser = clap::value_parser!(u8).range(1..=3))]
    zero: Option<u8>,
    /// Inner width of each routed expert (deepseek; default 8).
    #[arg(long)]
    moe_ffn: Option<usize>,
    /// Routed experts (deepseek; default 4).
    #[arg(long)]
    experts: Option<usize>,
    /// Experts selected per token (deepseek; default 2).
    #[arg(long)]
    top_k: Option<usize>,
    /// deepseek under expert parallelism: how tokens reach the experts' ranks, by all-gather
    /// and reduce-scatter over ep or by all_to_all_single.
    #[arg(long, value_name = "DISPATCHER", default_value = "allgather", value_parser = ["allgather", "alltoall"])]
    ep_dispatch: String,
    /// mlp: activation recomputation (each block's fc1 and relu rerun in the backward from
    /// its checkpointed input).
    #[arg(long)]
    recompute: bool,
    /// mlp: FP8 (E4M3, emulated) weights with per-tensor scaling, the amax all-reduced over tp.
    #[arg(long)]
    fp8: bool,
    /// gpt2 with --sequence-parallel: TP communication overlap (the row-parallel weight
    /// gradients computed chunk by chunk as the all-gathered output gradient arrives).
    #[arg(long)]
    tp_comm_overlap: bool,
    /// Pipeline parallelism (a pp mesh dim): microbatches per dp rank (default 1).
    #[arg(long, value_name = "M")]
    microbatches: Option<usize>,
    /// Pipeline parallelism: the schedule of each stage's forward and backward passes.
    #[arg(long, value_name = "SCHEDULE", value_parser = ["gpipe", "1f1b"])]
    pp_schedule: Option<String>,
    /// Pipeline parallelism: layers of the first stage (Megatron's
    /// --decoder-first-pipeline-num-layers); the other stages divide the rest evenly.
    #[arg(long, value_name = "N")]
    pp_first_layers: Option<usize>,
    /// Pipeline parallelism: layers of the last stage (Megatron's
    /// --decoder-last-pipeline-num-layers); the other stages divide the rest evenly.
    #[arg(long, value_name = "N")]
    pp_last_layers: Option<usize>,
    /// Output directory.
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
}

/// Runs `shardproof zoo ...`.
pub fn main(cmd: &ZooCommand) -> Verdict {
    match cmd {
        ZooCommand::List(args) => {
            list(args);
            Verdict::Holds
        }
        ZooCommand::Emit(args) => match emit_case(args) {
            Ok(()) => Verdict::Holds,
            Err(e) => {
                errln!("error: {e}");
                Verdict::Invalid
            }
        },
    }
}

/// The model options of the zoo, each with the models it applies to (`zoo list` prints them
/// under the parallelisms).
const MODEL_OPTIONS: &[(&str, &str)] = &[
    (
        "--vocab-parallel",
        "llama only: splits the embedding and LM head over tp",
    ),
    (
        "--sequence-parallel",
        "gpt2: Megatron sequence parallelism over tp: LayerNorms on sequence chunks, \
         all-gather before and reduce-scatter after the tensor-parallel regions, LayerNorm and \
         row-parallel bias gradients all-reduced; deepseek: each MoE block runs on the rank's \
         sequence chunk, router and experts replicated over tp, the chunks all-gathered after it",
    ),
    (
        "--ep-dispatch alltoall",
        "deepseek only: dispatches tokens to the experts and combines their outputs by \
         all_to_all_single over ep instead of all-gather and reduce-scatter",
    ),
    (
        "--recompute",
        "mlp only: reruns each block's fc1 and relu in the backward from its checkpoint",
    ),
    (
        "--fp8",
        "mlp only: runs fc1 and fc2 on FP8 (E4M3, emulated) weights with per-tensor scaling, \
         the amax all-reduced over tp",
    ),
    (
        "--tp-comm-overlap",
        "gpt2 with --sequence-parallel: computes the row-parallel weight gradients chunk by \
         chunk as the all-gathered output gradient arrives",
    ),
];

fn list(args: &ListArgs) {
    if args.json {
        let text = serde_json::to_string_pretty(&list_json(args.bugs)).unwrap_or_default();
        outln!("{text}");
        return;
    }
    for line in list_text(args.bugs, crate::layout::stdout_width()) {
        outln!("{line}");
    }
}

/// The `zoo list` rows as JSON: one object per model, preset, parallelism, option and bug.
fn list_json(bugs_only: bool) -> serde_json::Value {
    use serde_json::json;
    let bugs: Vec<_> = BUGS
        .iter()
        .map(|b| {
            json!({
                "id": b.id,
                "models": b.models,
                "parallelism": b.parallelism,
                "engines": b.engines,
                "spec_op": b.spec_op,
                "description": b.description,
                "source": b.source,
                "plantable": !b.listed_only(),
            })
        })
        .collect();
    if bugs_only {
        return json!({ "bugs": bugs });
    }
    let pairs = |rows: &[(&str, &str)], key: &str| -> Vec<serde_json::Value> {
        rows.iter()
            .map(|(k, d)| json!({ key: k, "description": d }))
            .collect()
    };
    let presets: Vec<_> = PRESETS
        .iter()
        .map(|p| {
            json!({
                "name": p.name,
                "model": p.model,
                "sizes": p.sizes_line(),
                "plan": p.plan_note(),
                "flags": p.plan_flags(),
                "source": p.source,
            })
        })
        .collect();
    json!({
        "models": pairs(MODELS, "name"),
        "presets": presets,
        "parallelisms": pairs(PARALLELISMS, "name"),
        "model_options": pairs(MODEL_OPTIONS, "flag"),
        "training": pairs(TRAINING, "flag"),
        "bugs": bugs,
    })
}

/// The `zoo list` text, every line at most `width` columns.
fn list_text(bugs_only: bool, width: usize) -> Vec<String> {
    use crate::layout::{paragraph, Cell, Table};
    let mut out: Vec<String> = Vec::new();
    let details = |rows: &[(&str, String)]| {
        let mut t = Table::new(4, &[Cell::Whole, Cell::Words]);
        for (label, text) in rows {
            t.row([label.to_string(), text.clone()]);
        }
        t.render(width)
    };
    if !bugs_only {
        out.push("models:".into());
        let mut t = Table::new(2, &[Cell::Whole, Cell::Words]);
        for (m, d) in MODELS {
            t.row([*m, *d]);
        }
        out.extend(t.render(width));

        out.extend(paragraph(
            "presets (--preset NAME; size flags override its sizes, --mesh replaces its plan):",
            0,
            width,
        ));
        let name_width = PRESETS.iter().map(|p| p.name.len()).max().unwrap_or(0);
        for p in PRESETS {
            out.push(format!("  {:name_width$}  {}", p.name, p.model));
            // One label width: sizes break between items, the plan between words.
            let mut t = Table::new(4, &[Cell::Whole, Cell::List]);
            t.row([format!("{:6}", "sizes"), p.sizes_line()]);
            out.extend(t.render(width));
            let mut t = Table::new(4, &[Cell::Whole, Cell::Words]);
            t.row([format!("{:6}", "plan"), p.plan_note()]);
            out.extend(t.render(width));
            out.extend(details(&[("source", p.source.to_string())]));
        }

        out.push("parallelisms (mesh dims):".into());
        let mut t = Table::new(2, &[Cell::Whole, Cell::Words]);
        for (p, d) in PARALLELISMS {
            t.row([*p, *d]);
        }
        out.extend(t.render(width));
        out.push("model options:".into());
        let mut t = Table::new(2, &[Cell::Whole, Cell::Words]);
        for (flag, d) in MODEL_OPTIONS {
            t.row([*flag, *d]);
        }
        out.extend(t.render(width));

        out.extend(paragraph(
            "training (full iteration; every model but deepseek, any mesh):",
            0,
            width,
        ));
        let mut t = Table::new(2, &[Cell::Whole, Cell::Words]);
        for (flag, d) in TRAINING {
            t.row([*flag, *d]);
        }
        out.extend(t.render(width));
    }
    out.push("bugs:".into());
    out.extend(paragraph(
        "(plant one with `zoo emit MODEL --bug ID`; `zoo list --bugs --json` gives every field)",
        2,
        width,
    ));
    // Engines and parallelism beside the id where they fit in readable columns; on a narrow
    // terminal they join the details below it.
    let id_width = BUGS.iter().map(|b| b.id.len()).max().unwrap_or(0);
    let beside = width >= 2 + id_width + 2 * (2 + 16);
    let mut t = if beside {
        let mut t = Table::new(2, &[Cell::Whole, Cell::Words, Cell::Words]);
        t.row(["ID", "ENGINES", "PARALLELISM"]);
        t
    } else {
        let mut t = Table::new(2, &[Cell::Whole]);
        t.row(["ID"]);
        t
    };
    for b in BUGS {
        t.row([b.id, b.engines, b.parallelism]);
    }
    let mut rows = t.render_rows(width).into_iter();
    out.extend(rows.next().unwrap_or_default());
    for (b, row) in BUGS.iter().zip(rows) {
        out.extend(row);
        let mut rows = Vec::new();
        if !beside {
            rows.push(("engines", b.engines.to_string()));
            rows.push(("parallelism", b.parallelism.to_string()));
        }
        rows.extend([
            ("models", b.models.join(", ")),
            ("what", b.description.to_string()),
            ("spec operator", b.spec_op.to_string()),
            ("source", b.source.to_string()),
        ]);
        if b.listed_only() {
            rows.push(("note", "listed only: the zoo cannot plant it".to_string()));
        }
        out.extend(details(&rows));
    }
    out
}

/// The size flags given.
fn size_flags(args: &EmitArgs) -> SizeFlags {
    SizeFlags {
        hidden: args.hidden,
        heads: args.heads,
        kv_heads: args.kv_heads,
        ffn: args.ffn,
        layers: args.layers,
        seq: args.seq,
        batch: args.batch,
        vocab: args.vocab,
        moe_ffn: args.moe_ffn,
        experts: args.experts,
        top_k: args.top_k,
    }
}

/// The training options of the flags.
fn train_options(args: &EmitArgs) -> Result<TrainOptions, String> {
    let optimizer = if args.optimizer == "adam" {
        Optimizer::Adam(AdamConfig {
            step: args.adam_step.unwrap_or(1),
            ..AdamConfig::default()
        })
    } else {
        if args.adam_step.is_some() {
            return Err("--adam-step applies to --optimizer adam".into());
        }
        Optimizer::Sgd
    };
    Ok(TrainOptions {
        optimizer,
        clip_grad: args.clip_grad,
        loss_scale: args.loss_scale,
        grad_accum: args.grad_accum,
        zero: args.zero.and_then(ZeroStage::from_level),
    })
}

fn emit_case(args: &EmitArgs) -> Result<(), String> {
    let preset = args.preset.as_deref().map(find_preset).transpose()?;
    let model = match (&args.model, preset) {
        (Some(m), Some(p)) if *m != p.model => {
            return Err(format!(
                "preset `{}` is a {} model, not `{m}` (leave the model out with --preset)",
                p.name, p.model
            ))
        }
        (Some(m), _) => m.clone(),
        (None, Some(p)) => p.model.to_string(),
        (None, None) => return Err("give a MODEL or --preset NAME (see `zoo list`)".into()),
    };
    let model = model.as_str();
    // Named first, so a typo is reported as one and not as a flag that does not apply to it.
    if !MODELS.iter().any(|(m, _)| *m == model) {
        return Err(suggest::unknown(
            "model",
            model,
            MODELS.iter().map(|(m, _)| *m),
            "shardproof zoo list",
        ));
    }
    let mesh = match (&args.mesh, preset) {
        (Some(text), _) => Mesh::parse(text).map_err(|e| format!("--mesh: {e}"))?,
        (None, Some(p)) => p.mesh(),
        (None, None) => Mesh::parse("tp=2").expect("the default mesh parses"),
    };
    // The preset's plan includes its vocab-parallel flag; --mesh replaces the whole plan.
    let vocab_parallel =
        args.vocab_parallel || (args.mesh.is_none() && preset.is_some_and(|p| p.vocab_parallel));
    let bug = match &args.bug {
        None => None,
        Some(id) => Some(find_bug(id).ok_or_else(|| {
            suggest::unknown(
                "bug",
                id,
                BUGS.iter().map(|b| b.id),
                "shardproof zoo list --bugs",
            )
        })?),
    };
    if !["llama", "deepseek"].contains(&model) && args.kv_heads.is_some() {
        return Err(format!(
            "--kv-heads applies to the llama and deepseek models, not `{model}`"
        ));
    }
    let moe_only = [
        ("--moe-ffn", args.moe_ffn),
        ("--experts", args.experts),
        ("--top-k", args.top_k),
    ];
    if let Some((flag, _)) = moe_only.iter().find(|(_, v)| v.is_some()) {
        if model != "deepseek" {
            return Err(format!(
                "{flag} applies to the deepseek model, not `{model}`"
            ));
        }
    }
    if model == "mlp" {
        let decoder_only = [
            ("--heads", args.heads),
            ("--seq", args.seq),
            ("--vocab", args.vocab),
        ];
        if let Some((flag, _)) = decoder_only.iter().find(|(_, v)| v.is_some()) {
            return Err(format!(
                "{flag} applies to the llama and gpt2 models, not `{model}`"
            ));
        }
    }
    let m = MlpConfig::default();
    let g = Gpt2Config::default();
    let sizes = size_flags(args);
    let opts = EmitOptions {
        model: model.to_string(),
        mlp: MlpConfig {
            hidden: args.hidden.unwrap_or(m.hidden),
            ffn: args.ffn.unwrap_or(m.ffn),
            batch: args.batch.unwrap_or(m.batch),
            layers: args.layers.unwrap_or(m.layers),
            ..m
        },
        llama: sizes.llama(&preset.map_or_else(LlamaConfig::default, |p| p.llama())),
        mesh,
        bug,
        forward_only: args.forward_only,
        vocab_parallel,
    };
    let extras = EmitExtras {
        gpt2: Gpt2Config {
            hidden: args.hidden.unwrap_or(g.hidden),
            heads: args.heads.unwrap_or(g.heads),
            ffn: args.ffn.unwrap_or(g.ffn),
            layers: args.layers.unwrap_or(g.layers),
            seq: args.seq.unwrap_or(g.seq),
            batch: args.batch.unwrap_or(g.batch),
            vocab: args.vocab.unwrap_or(g.vocab),
            ..g
        },
        sequence_parallel: args.sequence_parallel,
        deepseek: sizes.deepseek(&preset.map_or_else(DeepseekConfig::default, |p| p.deepseek())),
        rank_graphs: if args.share_graphs.unwrap_or(preset.is_some()) {
            RankGraphs::Shared
        } else {
            RankGraphs::PerRank
        },
        preset,
        ep_dispatch: EpDispatch::parse(&args.ep_dispatch)?,
        mlp_options: MlpOptions {
            recompute: args.recompute,
            fp8: args.fp8,
        },
        tp_comm_overlap: args.tp_comm_overlap,
    };
    // The preset's microbatches and schedule belong to its plan, which --mesh replaces; the
    // flags override them.
    let plan_pipeline = match preset {
        Some(p) if args.mesh.is_none() => p.pipeline,
        _ => PipelineOptions::default(),
    };
    let pipeline = PipelineOptions {
        microbatches: args.microbatches.unwrap_or(plan_pipeline.microbatches),
        schedule: match &args.pp_schedule {
            Some(name) => Schedule::parse(name)?,
            None => plan_pipeline.schedule,
        },
        first_stage_layers: args.pp_first_layers.or(plan_pipeline.first_stage_layers),
        last_stage_layers: args.pp_last_layers.or(plan_pipeline.last_stage_layers),
    };
    let summary = emit_to_dir(&opts, &extras, &train_options(args)?, &pipeline, &args.out)?;
    let case = args.out.join("case.yaml");
    if summary.rank_files == summary.ranks {
        outln!("wrote {} (spec + {} ranks)", case.display(), summary.ranks);
    } else {
        let files = if summary.rank_files == 1 {
            "1 graph file".to_string()
        } else {
            format!("{} graph files", summary.rank_files)
        };
        outln!(
            "wrote {} (spec + {} ranks sharing {files})",
            case.display(),
            summary.ranks
        );
    }
    Ok(())
}
