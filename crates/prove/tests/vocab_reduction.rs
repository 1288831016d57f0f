//! The vocabulary reduced with the labels (docs/prove.md, section 2, "The labels' range"):
//! conditions V1-V5 checked on the graphs (`reduce/vocab.rs`). The zoo's vocab-parallel loss
//! stage is proved on a reduced vocabulary; planted bugs stay refuted on it, each with a
//! counterexample the interpreter confirms, and at full size; a program violating any
//! condition keeps its vocabulary whole and names the condition.

#[path = "../examples/common/layer_cuts.rs"]
mod layer_cuts;
mod zoo_emit;
use zoo_emit::{edit_rank, with_literal};

use shardproof_case::Case;
use shardproof_prove::reduce::{reduce_case, Reduction};
use shardproof_prove::{prove_case, ProveConfig, Verdict};
use shardproof_zoo::{EmitExtras, EmitOptions, Mesh, MlpConfig, PipelineOptions};
use std::path::Path;

/// The symbolic layers alone, at the case's own sizes.
fn as_written() -> ProveConfig {
    ProveConfig {
        run_first: false,
        reduce: false,
        ..ProveConfig::default()
    }
}

/// The one vocabulary of a reduction.
fn vocabulary(r: &Reduction) -> &shardproof_prove::reduce::vocab::VocabReduction {
    assert_eq!(r.vocabulary.len(), 1, "{:?}", r.vocabulary);
    &r.vocabulary[0]
}

/// The rows of spec input `name` before and after the reduction.
fn rows(r: &Reduction, name: &str) -> (u64, u64) {
    let (_, full, reduced) = r
        .inputs
        .iter()
        .find(|(n, _, _)| n == name)
        .unwrap_or_else(|| panic!("no input `{name}`: {:?}", r.inputs));
    (full[0], reduced[0])
}

// ---------------------------------------------------------------------------------------
// The zoo's loss stage.

/// Rows per rank of the zoo case: the vocabulary is `2 · ROWS` on tp = 2.
const ROWS: i64 = 48;

/// The tiny llama with the vocab-parallel loss (one sequence of two tokens, so two labels),
/// emitted into `dir`, cut at its layers, `edit` applied to its files; its loss stage.
fn zoo_loss_stage(dir: &Path, edit: &dyn Fn(&Path)) -> Case {
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: zoo_emit::width4_llama(1, 1, 2 * ROWS as usize),
        mesh: Mesh::parse("tp=2").unwrap(),
        bug: None,
        forward_only: true,
        vocab_parallel: true,
    };
    zoo_emit::emit(
        dir,
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    );
    assert!(layer_cuts::cut_at_layers(dir) >= 2);
    edit(dir);
    let case = shardproof_case::load_case(&dir.join("case.yaml")).unwrap();
    let plan = shardproof_prove::stage::plan(&case, false).unwrap();
    plan.stages
        .into_iter()
        .find(|s| s.target == "output `loss`")
        .expect("a loss stage")
        .case
        .as_ref()
        .clone()
}

// The loss's label lines on every rank (the embedding's token lines use `tokens`).
const MASK_BELOW: &str = "aten.lt.Scalar(view_15";
const MASK_ABOVE: &str = "aten.ge.Scalar(view_15";
const OFFSET: &str = "aten.sub.Scalar(view_15";

/// The loss stage with `edit`, reduced (the vocabulary with it), and the verdicts on the
/// reduced case and at full size, each at its own sizes with `cfg`.
fn reduced_and_full(
    edit: &dyn Fn(&Path),
    cfg: &ProveConfig,
) -> (Reduction, shardproof_prove::Proof, shardproof_prove::Proof) {
    let dir = tempfile::tempdir().unwrap();
    let case = zoo_loss_stage(dir.path(), edit);
    let r = reduce_case(&case).unwrap();
    let v = vocabulary(&r);
    println!("{v:?}");
    assert_eq!(v.kept, None, "{v:?}");
    assert!(v.reduced_block < v.block, "{v:?}");
    let reduced = prove_case(&r.case, cfg);
    let full = prove_case(&case, cfg);
    (r, reduced, full)
}

#[test]
fn the_zoo_loss_stage_is_proved_on_a_reduced_vocabulary() {
    let (r, reduced, full) = reduced_and_full(&|_| {}, &as_written());
    let v = vocabulary(&r);
    println!("vocabulary {v:?}");
    // Two labels, no offset from a block edge: n' >= 2·(2 + 3).
    assert_eq!((v.label_elements, v.offset_bound), (2, 0), "{v:?}");
    assert!(v.reduced_block >= 10, "{v:?}");
    assert_eq!(reduced.verdict, Verdict::Proved, "{:?}", reduced.message);
    assert_eq!(full.verdict, Verdict::Proved, "{:?}", full.message);
    // The same through the prover's own pipeline (reduction on).
    let dir = tempfile::tempdir().unwrap();
    let case = zoo_loss_stage(dir.path(), &|_| {});
    let p = prove_case(
        &case,
        &ProveConfig {
            run_first: false,
            ..ProveConfig::default()
        },
    );
    assert_eq!(p.verdict, Verdict::Proved, "{:?}", p.message);
    assert!(p.reduction.is_some());
}

/// A planted bug: refuted on the reduced vocabulary with a counterexample (confirmed by the
/// interpreter inside the prover), and at full size; found by the symbolic layers alone.
fn stays_refuted(edit: &dyn Fn(&Path)) -> Reduction {
    stays_refuted_with(edit, &as_written())
}

fn stays_refuted_with(edit: &dyn Fn(&Path), cfg: &ProveConfig) -> Reduction {
    let (r, reduced, full) = reduced_and_full(edit, cfg);
    assert_eq!(reduced.verdict, Verdict::Refuted, "{:?}", reduced.message);
    assert!(reduced.counterexample.is_some());
    assert_eq!(full.verdict, Verdict::Refuted, "{:?}", full.message);
    assert!(full.counterexample.is_some());
    r
}

#[test]
fn a_wrong_rank_offset_stays_refuted_after_reduction() {
    // Rank 1 masks and shifts by rank 0's range.
    stays_refuted(&|d| {
        edit_rank(d, 1, MASK_BELOW, &|l| with_literal(l, 0));
        edit_rank(d, 1, MASK_ABOVE, &|l| with_literal(l, ROWS));
        edit_rank(d, 1, OFFSET, &|l| with_literal(l, 0));
    });
}

#[test]
fn a_label_masked_one_late_stays_refuted_after_reduction() {
    // `<=` for `<`: rank 1 masks its first label too.
    stays_refuted(&|d| {
        edit_rank(d, 1, MASK_BELOW, &|l| {
            l.replace("aten.lt.Scalar", "aten.le.Scalar")
        })
    });
    // Rank 1's range starts one label late (a literal `n + 1`: B = 1).
    let r = stays_refuted(&|d| edit_rank(d, 1, MASK_BELOW, &|l| with_literal(l, ROWS + 1)));
    assert_eq!(vocabulary(&r).offset_bound, 1);
}

/// Rank `rank`'s local label ids shifted by one on interior positions only (section 2,
/// example 1): `where(0 < id, where(id < n - 1, id + 1, id), id)` (nested, so that the
/// symbolic gather shows the index in range).
fn shift_interior(d: &Path, rank: usize, n: i64) {
    let path = d.join(format!("r{rank}.py"));
    let text = std::fs::read_to_string(&path).unwrap();
    // The masked local ids (`masked_fill(sub(labels, lo), outside, 0)`), then their unsqueeze.
    let fill = text
        .lines()
        .find(|l| l.contains("aten.masked_fill.Scalar(sub_") && l.contains(", 0)"))
        .expect("the local ids line")
        .to_string();
    let ids = fill.trim().split(':').next().unwrap().to_string();
    let indent = &fill[..fill.len() - fill.trim_start().len()];
    let t = "i64[2]";
    let b = "b8[2]";
    let added = format!(
        "{indent}vr_gt: \"{b}\" = torch.ops.aten.gt.Scalar({ids}, 0)\n\
         {indent}vr_lt: \"{b}\" = torch.ops.aten.lt.Scalar({ids}, {})\n\
         {indent}vr_up: \"{t}\" = torch.ops.aten.add.Scalar({ids}, 1)\n\
         {indent}vr_in: \"{t}\" = torch.ops.aten.where.self(vr_lt, vr_up, {ids})\n\
         {indent}vr_ids: \"{t}\" = torch.ops.aten.where.self(vr_gt, vr_in, {ids})",
        n - 1
    );
    let mut out = Vec::new();
    let mut after = false;
    for l in text.lines() {
        if after && l.contains(&format!("aten.unsqueeze.default({ids},")) {
            out.push(l.replace(
                &format!("unsqueeze.default({ids},"),
                "unsqueeze.default(vr_ids,",
            ));
            continue;
        }
        out.push(l.to_string());
        if l == fill {
            out.push(added.clone());
            after = true;
        }
    }
    std::fs::write(&path, out.join("\n") + "\n").unwrap();
}

#[test]
fn the_interior_only_bug_stays_refuted_after_reduction() {
    // Equal to the correct loss where no position is interior (2 rows per rank): neither
    // random runs nor the symbolic layers tell them apart there (the symbolic gather cannot
    // show the shifted index in range, so it is inconclusive rather than proved), so a
    // reduction to n' = 2 could never refute it.
    let dir = tempfile::tempdir().unwrap();
    let opts = EmitOptions {
        model: "llama".into(),
        mlp: MlpConfig::default(),
        llama: zoo_emit::width4_llama(1, 1, 4),
        mesh: Mesh::parse("tp=2").unwrap(),
        bug: None,
        forward_only: true,
        vocab_parallel: true,
    };
    zoo_emit::emit(
        dir.path(),
        &opts,
        &EmitExtras::default(),
        &PipelineOptions::default(),
    );
    layer_cuts::cut_at_layers(dir.path());
    // Two rows per rank: the interior test `0 < id < 1` holds for no id.
    shift_interior(dir.path(), 1, 2);
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap();
    let p = shardproof_prove::prove_staged_with(
        &case,
        &ProveConfig {
            reduce: false,
            ..ProveConfig::default()
        },
        1,
        &shardproof_prove::PlanOptions::default(),
    );
    assert_ne!(p.verdict, Verdict::Refuted, "{:?}", p.message);
    // The bug at n = ROWS: refuted on the reduced vocabulary (n' >= 6·(2 + 3) > 2), by a run
    // on random inputs (the symbolic gather cannot show the shifted index in range).
    let runs = ProveConfig {
        reduce: false,
        ..ProveConfig::default()
    };
    let r = stays_refuted_with(&|d| shift_interior(d, 1, ROWS), &runs);
    let v = vocabulary(&r);
    assert_eq!(v.offset_bound, 1, "{v:?}");
    assert!(v.reduced_block >= 30, "{v:?}");
}

// ---------------------------------------------------------------------------------------
// Each condition's refusal, on a hand-written vocab-parallel loss (tp = 2, two tokens).

/// Rows per rank of the hand-written case.
const N: usize = 64;

fn spec_text(extra_inputs: &str, extra: &str) -> String {
    let v = 2 * N;
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 4]", w: "f32[{v}, 4]", labels: "i64[2]"{extra_inputs}):
        t: "f32[4, {v}]" = torch.ops.aten.t.default(w)
        logits: "f32[2, {v}]" = torch.ops.aten.mm.default(x, t)
        lp: "f32[2, {v}]" = torch.ops.aten._log_softmax.default(logits, 1, False)
        nll = torch.ops.aten.nll_loss_forward.default(lp, labels, None, 1, -100)
        loss: "f32[]" = nll[0]
        total_weight: "f32[]" = nll[1]
{extra}        return (loss,)
"#
    )
}

/// Rank `r`'s loss: the logits of its `N` vocabulary rows, the label's logit picked where
/// the label is in its range and all-reduced, minus the all-reduced log-sum-exp.
fn rank_text(r: usize, extra_inputs: &str) -> String {
    let (lo, hi) = (r * N, (r + 1) * N);
    format!(
        r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[2, 4]", w: "f32[{N}, 4]", labels: "i64[2]"{extra_inputs}):
        t: "f32[4, {N}]" = torch.ops.aten.t.default(w)
        logits: "f32[2, {N}]" = torch.ops.aten.mm.default(x, t)
        exp: "f32[2, {N}]" = torch.ops.aten.exp.default(logits)
        sum_1: "f32[2, 1]" = torch.ops.aten.sum.dim_IntList(exp, [1], True)
        all_reduce: "f32[2, 1]" = torch.ops._c10d_functional.all_reduce.default(sum_1, 'sum', 'tp')
        wait: "f32[2, 1]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce)
        log: "f32[2, 1]" = torch.ops.aten.log.default(wait)
        below: "b8[2]" = torch.ops.aten.lt.Scalar(labels, {lo})
        above: "b8[2]" = torch.ops.aten.ge.Scalar(labels, {hi})
        outside: "b8[2]" = torch.ops.aten.bitwise_or.Tensor(below, above)
        shifted: "i64[2]" = torch.ops.aten.sub.Scalar(labels, {lo})
        ids1: "i64[2]" = torch.ops.aten.masked_fill.Scalar(shifted, outside, 0)
        ids: "i64[2, 1]" = torch.ops.aten.unsqueeze.default(ids1, 1)
        mask: "b8[2, 1]" = torch.ops.aten.unsqueeze.default(outside, 1)
        picked: "f32[2, 1]" = torch.ops.aten.gather.default(logits, 1, ids)
        zeroed: "f32[2, 1]" = torch.ops.aten.masked_fill.Scalar(picked, mask, 0.0)
        all_reduce_1: "f32[2, 1]" = torch.ops._c10d_functional.all_reduce.default(zeroed, 'sum', 'tp')
        wait_1: "f32[2, 1]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce_1)
        per: "f32[2, 1]" = torch.ops.aten.sub.Tensor(log, wait_1)
        loss: "f32[]" = torch.ops.aten.mean.default(per)
        return (loss,)
"#
    )
}

/// The hand-written case, each rank's text edited by `edit(rank, text)`; `extra` inputs
/// (name, placement) are added to every graph's signature.
fn hand_case(
    dir: &Path,
    extra: &[(&str, &str, &str)],
    spec_extra: &str,
    edit: &dyn Fn(usize, String) -> String,
) -> Case {
    let sig: String = extra
        .iter()
        .map(|(name, ty, _)| format!(", {name}: \"{ty}\""))
        .collect();
    std::fs::write(dir.join("spec.py"), spec_text(&sig, spec_extra)).unwrap();
    for r in 0..2 {
        std::fs::write(dir.join(format!("r{r}.py")), edit(r, rank_text(r, &sig))).unwrap();
    }
    let ins: String = extra
        .iter()
        .map(|(name, _, place)| format!("  {name}: {place}\n"))
        .collect();
    // The ranks' masked lookup ignores no target, so the case assumes that no target equals
    // the loss's ignore_index (without it a padded target is a real difference).
    std::fs::write(
        dir.join("case.yaml"),
        format!("version: 1\nname: vocab\nspec:\n  graph: spec.py\nimpl:\n  mesh: {{ tp: 2 }}\n  graphs: [r0.py, r1.py]\ninputs:\n  x: Replicate()\n  w: Shard(0)\n  labels: Replicate()\n{ins}outputs:\n  loss: Replicate()\nassume:\n  ignore-index: unused\n"),
    )
    .unwrap();
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

/// The hand-written case reduced: the vocabulary kept whole for the condition `cond`, or
/// reduced (`cond` empty).
fn vocabulary_of(case: &Case, cond: &str) -> Reduction {
    let r = reduce_case(case).unwrap_or_else(|e| panic!("{e:?}"));
    let v = vocabulary(&r).clone();
    println!("{cond}: {v:?}");
    let (full, reduced) = rows(&r, "w");
    if cond.is_empty() {
        assert_eq!(v.kept, None, "{v:?}");
        assert!(reduced < full, "{v:?}");
    } else {
        let why = v.kept.clone().unwrap_or_default();
        assert!(why.starts_with(cond), "{cond}: {v:?}");
        assert_eq!(reduced, full, "{v:?}");
        assert_eq!(v.reduced_block, v.block, "{v:?}");
    }
    r
}

#[test]
fn the_hand_written_loss_reduces_its_vocabulary_and_is_proved() {
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(dir.path(), &[], "", &|_, t| t);
    let r = vocabulary_of(&case, "");
    let v = vocabulary(&r);
    // Two labels, B = 0: n' >= 2·(2 + 3), below 64.
    assert!(v.reduced_block >= 10 && v.reduced_block < N as u64, "{v:?}");
    let p = prove_case(&r.case, &as_written());
    assert_eq!(p.verdict, Verdict::Proved, "{:?}", p.message);
    let p = prove_case(&case, &as_written());
    assert_eq!(p.verdict, Verdict::Proved, "{:?}", p.message);
}

#[test]
fn v1_a_label_compared_with_a_tensor_keeps_the_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(
        dir.path(),
        &[("lo", "i64[2]", "Replicate()")],
        "",
        &|r, t| {
            t.replace(
                &format!("aten.lt.Scalar(labels, {})", r * N),
                "aten.lt.Tensor(labels, lo)",
            )
        },
    );
    vocabulary_of(&case, "V1");
}

#[test]
fn v1_two_label_tensors_combined_keep_the_vocabulary() {
    // A second label tensor indexing the same classes; rank masks mix the two.
    let dir = tempfile::tempdir().unwrap();
    let spec_extra = "        nll2 = torch.ops.aten.nll_loss_forward.default(lp, labels2, None, 1, -100)\n        \
                      loss2: \"f32[]\" = nll2[0]\n        \
                      total_weight2: \"f32[]\" = nll2[1]\n";
    let case = hand_case(
        dir.path(),
        &[("labels2", "i64[2]", "Replicate()")],
        spec_extra,
        &|r, t| {
            t.replace(
                &format!("aten.ge.Scalar(labels, {})", (r + 1) * N),
                &format!("aten.ge.Scalar(labels2, {})", (r + 1) * N),
            )
        },
    );
    let r = vocabulary_of(&case, "V1");
    assert_eq!(vocabulary(&r).labels.len(), 2);
}

#[test]
fn v2_a_literal_of_no_block_form_keeps_the_vocabulary() {
    // `lt(label, 5)` at n = 64: five positions from a block edge.
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(dir.path(), &[], "", &|r, t| {
        t.replace(
            &format!("aten.lt.Scalar(labels, {})", r * N),
            "aten.lt.Scalar(labels, 5)",
        )
    });
    vocabulary_of(&case, "V2");
    // An offset of 2 from the block edge (`r·n + 2`): over the bound B = 1.
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(dir.path(), &[], "", &|r, t| {
        t.replace(
            &format!("aten.sub.Scalar(labels, {})", r * N),
            &format!("aten.sub.Scalar(labels, {})", r * N + 2),
        )
    });
    vocabulary_of(&case, "V2");
}

#[test]
fn v3_a_label_read_as_a_number_keeps_the_vocabulary() {
    // The local ids looked up in an embedding table (not a gather index or nll target).
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(
        dir.path(),
        &[("table", "f32[8, 4]", "Replicate()")],
        "",
        &|_, t| {
            t.replace(
                "        ids: \"i64[2, 1]\"",
                "        emb: \"f32[2, 4]\" = torch.ops.aten.embedding.default(table, ids1)\n        ids: \"i64[2, 1]\"",
            )
        },
    );
    vocabulary_of(&case, "V3");
}

#[test]
fn v4_an_arange_or_a_merging_view_on_the_vocabulary_keeps_it() {
    // Logits plus their column position: an arange along the vocabulary.
    kept_when_replaced(
        "        exp: \"f32[2, 64]\" = torch.ops.aten.exp.default(logits)",
        "        pos: \"i64[64]\" = torch.ops.aten.arange.start(0, 64, device = device(type='cpu'), pin_memory = False)\n        \
         posf: \"f32[64]\" = torch.ops.aten._to_copy.default(pos, dtype = torch.float32)\n        \
         shift: \"f32[2, 64]\" = torch.ops.aten.add.Tensor(logits, posf)\n        \
         exp: \"f32[2, 64]\" = torch.ops.aten.exp.default(shift)",
        "V4",
    );
    // The logits flattened across tokens and vocabulary, then summed.
    kept_when_replaced(
        "        sum_1: \"f32[2, 1]\" = torch.ops.aten.sum.dim_IntList(exp, [1], True)",
        "        flat: \"f32[128]\" = torch.ops.aten.view.default(exp, [128])\n        \
         total: \"f32[]\" = torch.ops.aten.sum.default(flat)\n        \
         sum_1: \"f32[2, 1]\" = torch.ops.aten.sum.dim_IntList(exp, [1], True)",
        "V4",
    );
}

#[test]
fn v5_a_block_below_the_minimum_keeps_the_vocabulary() {
    // 8 rows per rank: two labels need n' >= 2·(2 + 3) = 10.
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(dir.path(), &[], "", &|_, t| t);
    let text = |s: String| s.replace("128", "16").replace("64", "8");
    for f in ["spec.py", "r0.py", "r1.py"] {
        let p = dir.path().join(f);
        std::fs::write(&p, text(std::fs::read_to_string(&p).unwrap())).unwrap();
    }
    let case = shardproof_case::load_case(&dir.path().join("case.yaml")).unwrap_or(case);
    vocabulary_of(&case, "V5");
}

/// The hand-written case with `from` replaced by `to` in its graphs, reduced: asserts the
/// vocabulary is kept whole for the condition `cond` (as [`vocabulary_of`]).
fn kept_when_replaced(from: &str, to: &str, cond: &str) -> Reduction {
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(dir.path(), &[], "", &|_, t| t.replace(from, to));
    vocabulary_of(&case, cond)
}

/// `from` replaced by `to` in every file of the case in `dir`, reloaded.
fn edited(dir: &Path, from: &str, to: &str) -> Case {
    for f in ["spec.py", "r0.py", "r1.py", "case.yaml"] {
        let p = dir.join(f);
        std::fs::write(&p, std::fs::read_to_string(&p).unwrap().replace(from, to)).unwrap();
    }
    shardproof_case::load_case(&dir.join("case.yaml")).unwrap()
}

#[test]
fn v1_a_label_spread_over_the_vocabulary_keeps_it() {
    // The local ids expanded along the vocabulary (a label value with a vocabulary dim),
    // compared and used as a mask of the logits.
    kept_when_replaced(
        "        mask: \"b8[2, 1]\"",
        "        wide: \"i64[2, 64]\" = torch.ops.aten.expand.default(ids, [2, 64])\n        \
         weq: \"b8[2, 64]\" = torch.ops.aten.eq.Scalar(wide, 0)\n        \
         wm: \"f32[2, 64]\" = torch.ops.aten.masked_fill.Scalar(logits, weq, 0.0)\n        \
         mask: \"b8[2, 1]\"",
        "V1",
    );
}

#[test]
fn v2_offsets_accumulated_over_the_bound_or_a_class_ignored_keep_the_vocabulary() {
    // `(label + 1) - (lo - 1)`: each literal one from a block edge, their sum two.
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(dir.path(), &[], "", &|r, t| {
        t.replace(
            &format!(
                "        shifted: \"i64[2]\" = torch.ops.aten.sub.Scalar(labels, {})",
                r * N
            ),
            &format!(
                "        pre: \"i64[2]\" = torch.ops.aten.add.Scalar(labels, 1)\n        \
                 shifted: \"i64[2]\" = torch.ops.aten.sub.Scalar(pre, {})",
                r as i64 * N as i64 - 1
            ),
        )
    });
    let r = vocabulary_of(&case, "V2");
    assert!(vocabulary(&r)
        .kept
        .as_deref()
        .unwrap()
        .contains("accumulate"));
    // An nll_loss ignoring class 0: a comparison of the label with a literal the reduced
    // program would keep.
    let dir = tempfile::tempdir().unwrap();
    hand_case(dir.path(), &[], "", &|_, t| t);
    let case = edited(dir.path(), "None, 1, -100)", "None, 1, 0)");
    vocabulary_of(&case, "V2");
}

#[test]
fn a_label_copied_to_an_integer_type_is_still_reduced() {
    // `aten._to_copy` to an integer type moves a label value (its elements are the label's):
    // the gather index read through it keeps the vocabulary reducible. A cast to a float is
    // refused (V3, below).
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(dir.path(), &[], "", &|_, t| {
        t.replace(
            "        ids: \"i64[2, 1]\" = torch.ops.aten.unsqueeze.default(ids1, 1)",
            "        idc: \"i64[2]\" = torch.ops.aten._to_copy.default(ids1, dtype = torch.int64)\n        \
             ids: \"i64[2, 1]\" = torch.ops.aten.unsqueeze.default(idc, 1)",
        )
    });
    assert!(std::fs::read_to_string(dir.path().join("r0.py"))
        .unwrap()
        .contains("_to_copy.default(ids1"));
    vocabulary_of(&case, "");
}

#[test]
fn v3_a_label_cast_to_a_float_or_returned_keeps_the_vocabulary() {
    kept_when_replaced(
        "        ids: \"i64[2, 1]\"",
        "        lf: \"f32[2]\" = torch.ops.aten._to_copy.default(ids1, dtype = torch.float32)\n        ids: \"i64[2, 1]\"",
        "V3",
    );
    // The labels an output of both programs.
    let dir = tempfile::tempdir().unwrap();
    let extra = "        lab: \"i64[2]\" = torch.ops.aten.clone.default(labels)\n";
    hand_case(dir.path(), &[], extra, &|_, t| {
        t.replace(
            "        return (loss,)",
            &format!("{extra}        return (loss,)"),
        )
    });
    edited(dir.path(), "return (loss,)", "return (loss, lab)");
    let case = edited(
        dir.path(),
        "  loss: Replicate()\n",
        "  loss: Replicate()\n  lab: Replicate()\n",
    );
    vocabulary_of(&case, "V3");
}

#[test]
fn v4_class_weights_keep_the_vocabulary() {
    // A weight per class: a value per vocabulary position.
    let dir = tempfile::tempdir().unwrap();
    hand_case(
        dir.path(),
        &[("cw", "f32[128]", "Replicate()")],
        "",
        &|_, t| t,
    );
    let case = edited(
        dir.path(),
        "(lp, labels, None, 1, -100)",
        "(lp, labels, cw, 1, -100)",
    );
    let r = vocabulary_of(&case, "V4");
    assert!(vocabulary(&r)
        .kept
        .as_deref()
        .unwrap()
        .contains("class weights"));
}

#[test]
fn every_input_indexing_the_vocabulary_counts_as_a_label() {
    // A second label tensor read only as the spec's nll_loss target (no integer computation
    // on it, so it is not among the inputs whose range is kept): still a label of the
    // vocabulary, checked and counted in N.
    let dir = tempfile::tempdir().unwrap();
    let spec_extra = "        nll2 = torch.ops.aten.nll_loss_forward.default(lp, labels2, None, 1, -100)\n        \
                      loss2: \"f32[]\" = nll2[0]\n        \
                      total_weight2: \"f32[]\" = nll2[1]\n";
    let case = hand_case(
        dir.path(),
        &[("labels2", "i64[2]", "Replicate()")],
        spec_extra,
        &|_, t| t,
    );
    let r = vocabulary_of(&case, "");
    let v = vocabulary(&r);
    assert_eq!(v.labels, ["labels", "labels2"], "{v:?}");
    assert_eq!(v.label_elements, 4, "{v:?}");
}

#[test]
fn v1_a_label_masked_or_selected_with_other_values_keeps_the_vocabulary() {
    // The local ids masked by a boolean input, not by the labels' own comparisons.
    let ids1 = "ids1: \"i64[2]\" = torch.ops.aten.masked_fill.Scalar(shifted, outside, 0)";
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(dir.path(), &[("m", "b8[2]", "Replicate()")], "", &|_, t| {
        t.replace(
            ids1,
            "ids1: \"i64[2]\" = torch.ops.aten.masked_fill.Scalar(shifted, m, 0)",
        )
    });
    let r = vocabulary_of(&case, "V1");
    assert!(vocabulary(&r)
        .kept
        .as_deref()
        .unwrap()
        .contains("masked by"));
    // The local ids selected against an integer input where the label is out of range.
    let dir = tempfile::tempdir().unwrap();
    let case = hand_case(
        dir.path(),
        &[("o", "i64[2]", "Replicate()")],
        "",
        &|_, t| {
            t.replace(
                ids1,
                "ids1: \"i64[2]\" = torch.ops.aten.where.self(outside, o, shifted)",
            )
        },
    );
    let r = vocabulary_of(&case, "V1");
    assert!(vocabulary(&r)
        .kept
        .as_deref()
        .unwrap()
        .contains("selected against"));
}
