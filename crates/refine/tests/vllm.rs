//! vLLM-style graphs: custom operators wrapped in `higher_order.auto_functionalized` (v1) and a
//! custom all-reduce, declared in the case's `ops:` (the way Entangle's vLLM Qwen2 captures
//! call `_C.fused_add_rms_norm`, `_C.rotary_embedding`, `_C.silu_and_mul`,
//! `vllm.unified_attention_with_output` and `vllm.all_reduce`). The graphs are written here, in
//! the form torch.fx prints them; vLLM is not needed.

use shardproof_refine::{verify, Options, Verdict};
use std::fmt::Write as _;
use std::path::Path;

/// Tokens, hidden size, heads, head dim, MLP width (all at tp=1).
const T: usize = 4;
const H: usize = 16;
const NH: usize = 4;
const HD: usize = 4;
const I: usize = 8;

/// The declarations of the vLLM operators (sizes: `T` tokens, head dim `HD`).
fn ops() -> String {
    let rms = |x: &str, w: &str, eps: &str| {
        format!("aten.mul.Tensor({w}, aten.mul.Tensor({x}, rsqrt(aten.add.Scalar(aten.mean.dim(aten.pow.Tensor_Scalar({x}, 2), [-1], True), {eps}))))")
    };
    let heads = |x: &str| format!("view({x}, [{T}, -1, {HD}])");
    let half = HD / 2;
    let cs = "embedding($4, $0)";
    let cos = format!("unsqueeze(aten.slice.Tensor({cs}, 1, 0, {half}), 1)");
    let sin = format!("unsqueeze(aten.slice.Tensor({cs}, 1, {half}, {HD}), 1)");
    let rope = |x: &str| {
        let x1 = format!("aten.slice.Tensor({}, 2, 0, {half})", heads(x));
        let x2 = format!("aten.slice.Tensor({}, 2, {half}, {HD})", heads(x));
        format!(
            "view(cat([aten.sub.Tensor(aten.mul.Tensor({x1}, {cos}), aten.mul.Tensor({x2}, {sin})), aten.add.Tensor(aten.mul.Tensor({x2}, {cos}), aten.mul.Tensor({x1}, {sin}))], 2), [{T}, -1])"
        )
    };
    let bh = |x: &str| format!("aten.transpose.int({}, 0, 1)", heads(x));
    let attn = format!(
        "reshape(aten.transpose.int(bmm(_softmax(aten.mul.Tensor(bmm({}, permute({}, [1, 2, 0])), 0.5), -1, False), {}), 0, 1), [{T}, -1])",
        bh("$0"),
        heads("$1"),
        bh("$2")
    );
    let halves = format!("view($1, [{T}, 2, -1])");
    let mut s = String::from("ops:\n");
    let _ = writeln!(
        s,
        "  _C.rms_norm: {{ args: [result, input, weight, epsilon], writes: {{ result: \"{}\" }} }}",
        rms("$1", "$2", "$3")
    );
    let _ = writeln!(
        s,
        "  _C.fused_add_rms_norm:\n    args: [input, residual, weight, epsilon]\n    writes:\n      input: \"{}\"\n      residual: \"aten.add.Tensor($0, $1)\"",
        rms("aten.add.Tensor($0, $1)", "$2", "$3")
    );
    let _ = writeln!(
        s,
        "  _C.rotary_embedding:\n    args: [positions, query, key, head_size, cos_sin_cache, is_neox]\n    writes:\n      query: \"{}\"\n      key: \"{}\"",
        rope("$1"),
        rope("$2")
    );
    let _ = writeln!(
        s,
        "  _C.silu_and_mul: {{ args: [result, input], writes: {{ result: \"aten.mul.Tensor(silu(aten.select.int({halves}, 1, 0)), aten.select.int({halves}, 1, 1))\" }} }}"
    );
    let _ = writeln!(
        s,
        "  vllm.unified_attention_with_output:\n    args: [query, key, value, output, layer_name]\n    writes: {{ output: \"{attn}\" }}"
    );
    s.push_str("  vllm.all_reduce: \"_c10d_functional.all_reduce($0, 'sum', $1)\"\n");
    s
}

/// One Qwen2 decoder layer as vLLM captures it, at tensor parallelism `tp` (1: the spec),
/// with the all-reduce after the attention's output projection left out when `drop_reduce`.
fn qwen2_layer(tp: usize, drop_reduce: bool) -> String {
    let (nh, i) = (NH / tp, I / tp);
    let q = nh * HD;
    let mut g = format!(
        "class GraphModule(torch.nn.Module):\n    def forward(self, positions: \"i64[{T}]\", hidden: \"f32[{T}, {H}]\", residual: \"f32[{T}, {H}]\", cos_sin_cache: \"f32[8, {HD}]\", w_in: \"f32[{H}]\", w_post: \"f32[{H}]\", wq: \"f32[{q}, {H}]\", wk: \"f32[{q}, {H}]\", wv: \"f32[{q}, {H}]\", wo: \"f32[{H}, {q}]\", w_gate: \"f32[{i}, {H}]\", w_up: \"f32[{i}, {H}]\", w_down: \"f32[{H}, {i}]\"):\n"
    );
    let mut line = |l: String| {
        g.push_str("        ");
        g.push_str(&l);
        g.push('\n');
    };
    line("auto_functionalized = torch.ops.higher_order.auto_functionalized(torch.ops._C.fused_add_rms_norm.default, input = hidden, residual = residual, weight = w_in, epsilon = 1e-06)".into());
    line(format!(
        "getitem_1: \"f32[{T}, {H}]\" = auto_functionalized[1]"
    ));
    line(format!(
        "getitem_2: \"f32[{T}, {H}]\" = auto_functionalized[2];  auto_functionalized = None"
    ));
    for (name, w) in [("q", "wq"), ("k", "wk"), ("v", "wv")] {
        line(format!(
            "t_{name}: \"f32[{H}, {q}]\" = torch.ops.aten.t.default({w})"
        ));
        line(format!(
            "mm_{name}: \"f32[{T}, {q}]\" = torch.ops.aten.mm.default(getitem_1, t_{name})"
        ));
    }
    line("auto_functionalized_1 = torch.ops.higher_order.auto_functionalized(torch.ops._C.rotary_embedding.default, positions = positions, query = mm_q, key = mm_k, head_size = 4, cos_sin_cache = cos_sin_cache, is_neox = True)".into());
    line(format!(
        "getitem_4: \"f32[{T}, {q}]\" = auto_functionalized_1[1]"
    ));
    line(format!(
        "getitem_5: \"f32[{T}, {q}]\" = auto_functionalized_1[2];  auto_functionalized_1 = None"
    ));
    line(format!("empty: \"f32[{T}, {q}]\" = torch.ops.aten.empty.memory_format([{T}, {q}], dtype = torch.float32, device = device(type='cpu'), pin_memory = False)"));
    line("auto_functionalized_2 = torch.ops.higher_order.auto_functionalized(torch.ops.vllm.unified_attention_with_output.default, query = getitem_4, key = getitem_5, value = mm_v, output = empty, layer_name = 'model.layers.0.self_attn.attn');  empty = None".into());
    line(format!(
        "getitem_7: \"f32[{T}, {q}]\" = auto_functionalized_2[1];  auto_functionalized_2 = None"
    ));
    line(format!(
        "t_o: \"f32[{q}, {H}]\" = torch.ops.aten.t.default(wo)"
    ));
    line(format!(
        "mm_o: \"f32[{T}, {H}]\" = torch.ops.aten.mm.default(getitem_7, t_o)"
    ));
    let attn_out = if tp > 1 && !drop_reduce {
        line(format!(
            "all_reduce: \"f32[{T}, {H}]\" = torch.ops.vllm.all_reduce.default(mm_o, 'tp:0')"
        ));
        "all_reduce"
    } else {
        "mm_o"
    };
    line(format!("auto_functionalized_3 = torch.ops.higher_order.auto_functionalized(torch.ops._C.fused_add_rms_norm.default, input = {attn_out}, residual = getitem_2, weight = w_post, epsilon = 1e-06)"));
    line(format!(
        "getitem_9: \"f32[{T}, {H}]\" = auto_functionalized_3[1]"
    ));
    line(format!(
        "getitem_10: \"f32[{T}, {H}]\" = auto_functionalized_3[2];  auto_functionalized_3 = None"
    ));
    for (name, w) in [("gate", "w_gate"), ("up", "w_up")] {
        line(format!(
            "t_{name}: \"f32[{H}, {i}]\" = torch.ops.aten.t.default({w})"
        ));
        line(format!(
            "mm_{name}: \"f32[{T}, {i}]\" = torch.ops.aten.mm.default(getitem_9, t_{name})"
        ));
    }
    line(format!(
        "cat: \"f32[{T}, {}]\" = torch.ops.aten.cat.default([mm_gate, mm_up], 1)",
        2 * i
    ));
    line(format!("empty_1: \"f32[{T}, {i}]\" = torch.ops.aten.empty.memory_format([{T}, {i}], dtype = torch.float32, device = device(type='cpu'), pin_memory = False)"));
    line("auto_functionalized_4 = torch.ops.higher_order.auto_functionalized(torch.ops._C.silu_and_mul.default, result = empty_1, input = cat);  empty_1 = None".into());
    line(format!(
        "getitem_12: \"f32[{T}, {i}]\" = auto_functionalized_4[1];  auto_functionalized_4 = None"
    ));
    line(format!(
        "t_down: \"f32[{i}, {H}]\" = torch.ops.aten.t.default(w_down)"
    ));
    line(format!(
        "mm_down: \"f32[{T}, {H}]\" = torch.ops.aten.mm.default(getitem_12, t_down)"
    ));
    let out = if tp > 1 {
        line(format!(
            "all_reduce_1: \"f32[{T}, {H}]\" = torch.ops.vllm.all_reduce.default(mm_down, 'tp:0')"
        ));
        "all_reduce_1"
    } else {
        "mm_down"
    };
    g.push_str(&format!("        return ({out}, getitem_10)\n"));
    g
}

const CASE: &str = "version: 1
name: qwen2-layer
spec:
  graph: spec.py
impl:
  mesh: { tp: 2 }
  graphs: [r0.py, r1.py]
inputs:
  positions: Replicate()
  hidden: Replicate()
  residual: Replicate()
  cos_sin_cache: Replicate()
  w_in: Replicate()
  w_post: Replicate()
  wq: Shard(0)
  wk: Shard(0)
  wv: Shard(0)
  wo: Shard(1)
  w_gate: Shard(0)
  w_up: Shard(0)
  w_down: Shard(1)
outputs:
  mm_down: { impl: all_reduce_1, placement: Replicate() }
  getitem_10: Replicate()
";

fn write_case(dir: &Path, drop_reduce: bool) -> std::path::PathBuf {
    std::fs::write(dir.join("spec.py"), qwen2_layer(1, false)).unwrap();
    for r in 0..2 {
        std::fs::write(dir.join(format!("r{r}.py")), qwen2_layer(2, drop_reduce)).unwrap();
    }
    let case = dir.join("case.yaml");
    std::fs::write(&case, format!("{CASE}{}", ops())).unwrap();
    case
}

#[test]
fn vllm_qwen2_layer_tp2_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let case = shardproof_case::load_case(&write_case(dir.path(), false)).unwrap();
    let out = verify(&case, &Options::default());
    assert_eq!(out.verdict, Verdict::Verified, "{out:#?}");
}

#[test]
fn vllm_qwen2_layer_without_the_attention_all_reduce_is_refuted() {
    let dir = tempfile::tempdir().unwrap();
    let case = shardproof_case::load_case(&write_case(dir.path(), true)).unwrap();
    let out = verify(&case, &Options::default());
    assert_eq!(out.verdict, Verdict::Refuted, "{out:#?}");
    let failure = out.failure.as_ref().expect("a refutation says where");
    let text = format!("{failure:?}");
    // The stop is the residual add of the post-attention `fused_add_rms_norm`: its call's line.
    let spec = qwen2_layer(1, false);
    let line = 2 + spec
        .lines()
        .skip(2)
        .position(|l| l.contains("auto_functionalized_3 ="))
        .unwrap();
    assert_eq!(failure.op, "aten.add.Tensor", "{text}");
    assert!(
        failure
            .graph_location
            .ends_with(&format!("spec.py:{}", line + 1)),
        "{text}"
    );
    assert!(
        failure
            .hint
            .as_deref()
            .unwrap_or("")
            .contains("unreduced partial sum"),
        "{text}"
    );
}
