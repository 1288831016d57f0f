//! The XLA HLO text importer: the module text that `jax.jit(f).lower(...).as_text(dialect="hlo")`
//! and `.compile().as_text()` print (the single-device program and the SPMD-partitioned
//! per-device program), to the shardproof IR. `docs/formats/hlo.md` describes what is read, the
//! instruction-to-operator table, the process-group names and device ids.
//!
//! - Entry parameters become graph inputs `arg0`, `arg1`, ... (in parameter order); the entry
//!   root's leaves become outputs `out0`, `out1`, ...
//! - Fusions and calls are inlined; `metadata={op_name=... source_file=... source_line=...}` or
//!   `stack_frame_id=N` (resolved through the module's `StackFrames` tables) becomes the node's
//!   source location.
//! - A per-device program is imported for one device (`device`): `partition-id` becomes that
//!   device's id and the partitioner's offset arithmetic folds to constants.
//! - An instruction the importer does not model becomes an opaque call `hlo.<opcode>`.

mod collective;
mod compound;
mod groups;
mod lex;
mod lit;
mod lower;
mod ops;
mod parse;

pub use groups::{hlo_groups, hlo_groups_yaml, parse_group_name};

use crate::fx::ParseStats;
use shardproof_ir::{Graph, SourceError, Span};
use std::path::Path;

/// The result of importing an HLO module.
#[derive(Clone, Debug, PartialEq)]
pub struct HloParse {
    /// The entry computation as a graph.
    pub graph: Graph,
    /// Parse coverage (every line is either part of the module or blank).
    pub stats: ParseStats,
    /// The device the program was imported for, if any.
    pub device: Option<usize>,
    /// The module's `num_partitions` (1 when the header does not say).
    pub num_partitions: usize,
}

/// True when `text` is HLO module text: its first non-blank line starts with `HloModule`.
pub fn looks_like_hlo(text: &str) -> bool {
    text.lines()
        .map(str::trim_start)
        .find(|l| !l.is_empty())
        .is_some_and(|l| l.starts_with("HloModule"))
}

/// True when the path names an HLO text file (`.hlo`, `.hlo.txt`).
pub fn is_hlo_path(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    name.ends_with(".hlo") || name.ends_with(".hlo.txt")
}

/// The device id a per-device file names: `NAME.devK.hlo` (or `.devK.hlo.txt`) is device K.
///
/// ```
/// use std::path::Path;
/// assert_eq!(shardproof_import::hlo_device_from_path(Path::new("mlp.tp2.dev1.hlo")), Some(1));
/// assert_eq!(shardproof_import::hlo_device_from_path(Path::new("mlp.spec.hlo")), None);
/// ```
pub fn hlo_device_from_path(path: &Path) -> Option<usize> {
    let name = path.file_name()?.to_str()?;
    let stem = name
        .strip_suffix(".hlo.txt")
        .or_else(|| name.strip_suffix(".hlo"))
        .or_else(|| name.strip_suffix(".txt"))?;
    let last = stem.rsplit('.').next()?;
    last.strip_prefix("dev")?.parse().ok()
}

/// Imports HLO module text. `device` is the device a per-device (SPMD-partitioned) program is
/// imported for; without it `partition-id` is known only in a one-partition module (else it is
/// opaque). Errors name the file, line and column.
pub fn parse_hlo(text: &str, file: &Path, device: Option<usize>) -> Result<HloParse, SourceError> {
    run(text, file, device).map_err(crate::shorten_quotes)
}

fn run(text: &str, file: &Path, device: Option<usize>) -> Result<HloParse, SourceError> {
    let err = |e: parse::PErr| {
        SourceError::new(file, Some(Span::new(e.line, e.col)), e.message).with_hint(e.hint)
    };
    let m = parse::parse_module(text).map_err(err)?;
    let num_partitions = m.num_partitions.unwrap_or(1).max(1) as usize;
    if let Some(d) = device {
        let n = num_partitions * m.replica_count.unwrap_or(1).max(1) as usize;
        if d >= n {
            return Err(SourceError::new(
                file,
                Some(Span::new(1, 1)),
                format!("the file is for device {d}, but the module runs on {n} device(s) (num_partitions={num_partitions})"),
            )
            .with_hint("name per-device files `NAME.devK.hlo` with K below the module's num_partitions"));
        }
    }
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| {
            n.trim_end_matches(".txt")
                .trim_end_matches(".hlo")
                .to_string()
        })
        .unwrap_or_else(|| m.name.clone());
    let mut l = lower::Lowerer::new(&m, &name, device);
    let entry = &m.computations[m.entry];
    let params = l.inputs(entry).map_err(err)?;
    let root = l.lower_comp(entry, &params).map_err(err)?;
    l.outputs(&entry.instrs[entry.root], &root).map_err(err)?;
    let mut graph = l.g;
    graph.path = Some(file.to_path_buf());
    let lines_total = text.lines().count();
    Ok(HloParse {
        graph,
        stats: ParseStats {
            lines_total,
            lines_parsed: m.lines_parsed,
            lines_ignored: m.lines_ignored,
            unparsed: Vec::new(),
        },
        device,
        num_partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardproof_ir::{Arg, NodeKind};

    fn import(body: &str, device: Option<usize>) -> Graph {
        import_with(body, "", device)
    }

    fn import_with(body: &str, header: &str, device: Option<usize>) -> Graph {
        let text = format!("HloModule t{header}\n\n{body}");
        match parse_hlo(&text, Path::new("t.hlo"), device) {
            Ok(p) => p.graph,
            Err(e) => panic!("{e}\n{text}"),
        }
    }

    fn ops(g: &Graph) -> Vec<String> {
        g.nodes
            .iter()
            .filter_map(|n| n.op().map(|o| o.to_string()))
            .collect()
    }

    fn node<'g>(g: &'g Graph, name: &str) -> &'g shardproof_ir::Node {
        g.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no `{name}` in {:?}", ops(g)))
    }

    const ADD: &str = "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] add(a, b)\n}\n";
    const MAX: &str = "max {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] maximum(a, b)\n}\n";

    #[test]
    fn parameters_and_outputs_are_named_by_position() {
        let g = import("ENTRY e {\n  y = f32[4] parameter(1)\n  x = f32[4] parameter(0)\n  ROOT t = (f32[4], f32[4]) tuple(y, x)\n}\n", None);
        let names: Vec<&str> = g.inputs.iter().map(|v| g.value_name(*v)).collect();
        assert_eq!(names, ["arg0", "arg1"]);
        // Outputs that are inputs get an alias node to carry the output name.
        let outs: Vec<&str> = g.outputs.iter().map(|v| g.value_name(v.unwrap())).collect();
        assert_eq!(outs, ["out0", "out1"]);
        assert_eq!(ops(&g), ["aten.alias.default", "aten.alias.default"]);
        assert_eq!(
            g.node(g.outputs[0].unwrap()).args()[0],
            Arg::Value(g.inputs[1])
        );
    }

    #[test]
    fn elementwise_ops_and_scalar_constants() {
        let body = "ENTRY e {\n  x = f32[2,3] parameter(0)\n  c = f32[] constant(0.5)\n  b = f32[2,3] broadcast(c), dimensions={}\n  m = f32[2,3] multiply(x, b)\n  one = f32[] constant(1)\n  o = f32[2,3] broadcast(one), dimensions={}\n  a = f32[2,3] add(o, m)\n  s = f32[2,3] subtract(o, a)\n  t = f32[2,3] tanh(s)\n  zc = f32[] constant(0)\n  z = f32[2,3] broadcast(zc), dimensions={}\n  ROOT r = f32[2,3] maximum(t, z)\n}\n";
        let g = import(body, None);
        assert_eq!(
            ops(&g),
            [
                "aten.mul.Tensor",
                "aten.add.Scalar",
                "aten.rsub.Scalar",
                "aten.tanh.default",
                "aten.scalar_tensor.default",
                "aten.maximum.default"
            ]
        );
        assert_eq!(node(&g, "m").args()[1], Arg::Float(0.5));
        assert_eq!(node(&g, "a").args()[1], Arg::Float(1.0));
        // The maximum's literal is a 0-d tensor, broadcast by the operator.
        assert_eq!(g.nodes[g.outputs[0].unwrap().node].name, "out0");
    }

    #[test]
    fn unary_compare_select_convert() {
        let g = import("ENTRY e {\n  x = f32[4] parameter(0)\n  y = f32[4] parameter(1)\n  n = f32[4] negate(x)\n  e = f32[4] exponential(n)\n  l = f32[4] log(e)\n  q = f32[4] rsqrt(l)\n  p = pred[4] compare(x, y), direction=GT\n  s = f32[4] select(p, q, y)\n  ROOT c = bf16[4] convert(s)\n}\n", None);
        assert_eq!(
            ops(&g),
            [
                "aten.neg.default",
                "aten.exp.default",
                "aten.log.default",
                "aten.rsqrt.default",
                "aten.gt.Tensor",
                "aten.where.self",
                "aten._to_copy.default"
            ]
        );
        assert_eq!(
            node(&g, "out0").kwarg("dtype"),
            Some(&Arg::Dtype(shardproof_ir::DType::Bf16))
        );
    }

    #[test]
    fn broadcast_reshape_transpose_slice_concat() {
        let g = import("ENTRY e {\n  x = f32[3,2] parameter(0)\n  b = f32[2,4,3] broadcast(x), dimensions={2,0}\n  r = f32[8,3] reshape(b)\n  t = f32[3,8] transpose(r), dimensions={1,0}\n  s = f32[2,8] slice(t), slice={[1:3], [0:8]}\n  ROOT c = f32[5,8] concatenate(t, s), dimensions={0}\n}\n", None);
        assert_eq!(
            ops(&g),
            [
                "aten.permute.default",
                "aten.reshape.default",
                "aten.expand.default",
                "aten.reshape.default",
                "aten.permute.default",
                "aten.slice.Tensor",
                "aten.cat.default"
            ]
        );
        assert_eq!(
            node(&g, "b_permute").args()[1],
            Arg::List(vec![Arg::Int(1), Arg::Int(0)])
        );
        assert_eq!(
            node(&g, "b_reshape").args()[1],
            Arg::List(vec![Arg::Int(2), Arg::Int(1), Arg::Int(3)])
        );
        assert_eq!(
            node(&g, "s_slice0").args()[2..4],
            [Arg::Int(1), Arg::Int(3)]
        );
    }

    #[test]
    fn dots_lower_to_mm_bmm_and_matmul() {
        let g = import("ENTRY e {\n  a = f32[8,16] parameter(0)\n  b = f32[16,4] parameter(1)\n  ROOT d = f32[8,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n", None);
        assert_eq!(ops(&g), ["aten.mm.default"]);
        let g = import("ENTRY e {\n  a = f32[8,16] parameter(0)\n  b = f32[4,16] parameter(1)\n  ROOT d = f32[8,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={1}\n}\n", None);
        assert_eq!(ops(&g), ["aten.permute.default", "aten.mm.default"]);
        let g = import("ENTRY e {\n  a = f32[2,8,4] parameter(0)\n  b = f32[2,4,3] parameter(1)\n  ROOT d = f32[2,8,3] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}\n}\n", None);
        assert_eq!(ops(&g), ["aten.bmm.default"]);
        // bqhd,bkhd->bhqk: batch {0,2}, contracting {3}.
        let g = import("ENTRY e {\n  q = f32[2,5,3,4] parameter(0)\n  k = f32[2,6,3,4] parameter(1)\n  ROOT d = f32[2,3,5,6] dot(q, k), lhs_batch_dims={0,2}, lhs_contracting_dims={3}, rhs_batch_dims={0,2}, rhs_contracting_dims={3}\n}\n", None);
        assert_eq!(
            ops(&g),
            [
                "aten.permute.default",
                "aten.permute.default",
                "aten.matmul.default"
            ]
        );
        assert_eq!(
            node(&g, "d_lhs").args()[1],
            Arg::List([0, 2, 1, 3].map(Arg::Int).to_vec())
        );
        assert_eq!(
            node(&g, "d_rhs").args()[1],
            Arg::List([0, 2, 3, 1].map(Arg::Int).to_vec())
        );
        // Several contracting dims merge.
        let g = import("ENTRY e {\n  a = f32[8,2,3] parameter(0)\n  b = f32[2,3,4] parameter(1)\n  ROOT d = f32[8,4] dot(a, b), lhs_contracting_dims={1,2}, rhs_contracting_dims={0,1}\n}\n", None);
        assert_eq!(
            ops(&g),
            [
                "aten.reshape.default",
                "aten.reshape.default",
                "aten.mm.default"
            ]
        );
    }

    #[test]
    fn reductions_by_their_computation() {
        let body = format!("{ADD}{MAX}ENTRY e {{\n  x = f32[4,6] parameter(0)\n  z = f32[] constant(0)\n  s = f32[4] reduce(x, z), dimensions={{1}}, to_apply=add\n  ni = f32[] constant(-inf)\n  m = f32[6] reduce(x, ni), dimensions={{0}}, to_apply=max\n  two = f32[] constant(2)\n  t = f32[4] reduce(x, two), dimensions={{1}}, to_apply=add\n  ROOT r = (f32[4], f32[6], f32[4]) tuple(s, m, t)\n}}\n");
        let g = import(&body, None);
        assert_eq!(
            ops(&g),
            [
                "aten.sum.dim_IntList",
                "aten.amax.default",
                "aten.sum.dim_IntList",
                "aten.add.Scalar"
            ]
        );
        assert_eq!(node(&g, "out0").args()[1], Arg::List(vec![Arg::Int(1)]));
        // A reduction the importer does not know is opaque.
        let body = "mul {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] multiply(a, b)\n}\nENTRY e {\n  x = f32[4] parameter(0)\n  o = f32[] constant(1)\n  ROOT p = f32[] reduce(x, o), dimensions={0}, to_apply=mul\n}\n";
        assert_eq!(
            ops(&import(body, None)),
            ["aten.scalar_tensor.default", "hlo.reduce.default"]
        );
    }

    #[test]
    fn partition_id_offsets_fold_to_slices() {
        // The partitioner's pattern: an offset table indexed by the partition id.
        let body = "ENTRY e {\n  x = f32[8,6] parameter(0)\n  pid = u32[] partition-id()\n  tab = s32[2]{0} constant({0, 4})\n  ds = s32[1]{0} dynamic-slice(tab, pid), dynamic_slice_sizes={1}\n  off = s32[] bitcast(ds)\n  zero = s32[] constant(0)\n  ROOT y = f32[4,6] dynamic-slice(x, off, zero), dynamic_slice_sizes={4,6}\n}\n";
        for (dev, start) in [(0, 0), (1, 4)] {
            let g = import_with(body, ", num_partitions=2", Some(dev));
            assert_eq!(ops(&g), ["aten.slice.Tensor"], "device {dev}");
            assert_eq!(
                node(&g, "out0").args()[2..4],
                [Arg::Int(start), Arg::Int(start + 4)]
            );
        }
        // Without a device the offset is unknown: opaque, never guessed.
        let g = import_with(body, ", num_partitions=2", None);
        assert!(
            ops(&g).iter().any(|o| o == "hlo.partition_id.default"),
            "{:?}",
            ops(&g)
        );
        assert!(
            ops(&g).iter().any(|o| o == "hlo.dynamic_slice.default"),
            "{:?}",
            ops(&g)
        );
        // Offsets are clamped as HLO clamps them.
        let body = "ENTRY e {\n  x = f32[8] parameter(0)\n  o = s32[] constant(7)\n  ROOT y = f32[4] dynamic-slice(x, o), dynamic_slice_sizes={4}\n}\n";
        assert_eq!(
            node(&import(body, None), "out0").args()[2..4],
            [Arg::Int(4), Arg::Int(8)]
        );
    }

    #[test]
    fn fusions_are_inlined_with_locations() {
        let body = "FileNames\n1 \"/src/model.py\"\n\nFunctionNames\n1 \"mlp\"\n\nFileLocations\n1 {file_name_id=1 function_name_id=1 line=42 end_line=42 column=1 end_column=9}\n\nStackFrames\n1 {file_location_id=1 parent_frame_id=1}\n\n%f (p0: f32[4], p1: f32[4]) -> f32[4] {\n  %p0 = f32[4]{0} parameter(0)\n  %p1 = f32[4]{0} parameter(1)\n  ROOT %m = f32[4]{0} multiply(%p0, %p1), metadata={op_name=\"jit(f)/mul\" stack_frame_id=1}\n}\n\nENTRY %e (a: f32[4]) -> f32[4] {\n  %a = f32[4]{0} parameter(0)\n  ROOT %fu = f32[4]{0} fusion(%a, %a), kind=kLoop, calls=%f, backend_config={\"x\":{\"y\":[]}}\n}\n";
        let g = import(body, None);
        assert_eq!(ops(&g), ["aten.mul.Tensor"]);
        let loc = g.nodes[1].loc.as_ref().unwrap();
        assert_eq!(
            (
                loc.file.as_str(),
                loc.line,
                loc.function.as_str(),
                loc.code.as_str()
            ),
            ("/src/model.py", 42, "mlp", "jit(f)/mul")
        );
        let g = import("ENTRY e {\n  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), metadata={op_name=\"neg\" source_file=\"/m.py\" source_line=7}\n}\n", None);
        assert_eq!(g.nodes[1].loc.as_ref().unwrap().line, 7);
    }

    #[test]
    fn collectives_map_to_functional_collectives() {
        let body = format!("{ADD}ENTRY e {{\n  x = f32[4,6] parameter(0)\n  r = f32[4,6] all-reduce(x), channel_id=1, replica_groups={{{{0,1}},{{2,3}}}}, use_global_device_ids=true, to_apply=add\n  g = f32[4,12] all-gather(r), channel_id=2, replica_groups=[2,2]<=[4], dimensions={{1}}, use_global_device_ids=true\n  s = f32[2,12] reduce-scatter(g), channel_id=3, replica_groups={{{{0,1}},{{2,3}}}}, dimensions={{0}}, to_apply=add\n  ROOT a = f32[2,12] all-to-all(s), channel_id=4, replica_groups={{{{0,1}},{{2,3}}}}, dimensions={{0}}\n}}\n");
        let g = import_with(&body, ", num_partitions=4", Some(2));
        assert_eq!(
            ops(&g),
            [
                "_c10d_functional.all_reduce.default",
                "aten.permute.default",
                "_c10d_functional.all_gather_into_tensor.default",
                "aten.permute.default",
                "_c10d_functional.reduce_scatter_tensor.default",
                "_c10d_functional.all_to_all_single.default"
            ]
        );
        let group = Arg::Str("hlo{{0,1},{2,3}}".into());
        assert_eq!(
            node(&g, "r").args(),
            [
                Arg::Value(g.inputs[0]),
                Arg::Str("sum".into()),
                group.clone()
            ]
        );
        assert_eq!(node(&g, "g_c").args()[1..], [Arg::Int(2), group.clone()]);
        assert_eq!(
            node(&g, "s").args()[1..],
            [Arg::Str("sum".into()), Arg::Int(2), group.clone()]
        );
        // Members listed out of rank order gather in that order: opaque.
        let body = "ENTRY e {\n  x = f32[4] parameter(0)\n  ROOT g = f32[8] all-gather(x), channel_id=1, replica_groups={{1,0}}, dimensions={0}\n}\n";
        assert_eq!(
            ops(&import_with(body, ", num_partitions=2", Some(0))),
            ["hlo.all_gather.default"]
        );
        // No channel_id in a partitioned one-replica program: each device alone.
        let body = format!("{ADD}ENTRY e {{\n  x = f32[4] parameter(0)\n  ROOT r = f32[4] all-reduce(x), replica_groups={{}}, to_apply=add\n}}\n");
        let g = import_with(&body, ", num_partitions=2", Some(1));
        assert_eq!(node(&g, "out0").args()[2], Arg::Str("hlo{{0},{1}}".into()));
    }

    #[test]
    fn collective_permute_is_send_and_recv() {
        let body = "ENTRY e {\n  x = f32[4] parameter(0)\n  ROOT p = f32[4] collective-permute(x), channel_id=5, source_target_pairs={{0,1},{1,2}}\n}\n";
        let g = import_with(body, ", num_partitions=3", Some(1));
        assert_eq!(
            ops(&g),
            ["shardproof_p2p.send.default", "shardproof_p2p.recv.default"]
        );
        assert_eq!(node(&g, "p_send2").args()[1..], [Arg::Int(2), Arg::Int(5)]);
        assert_eq!(node(&g, "out0").args()[2..], [Arg::Int(0), Arg::Int(5)]);
        // Device 0 is targeted by no pair: zeros.
        let g = import_with(body, ", num_partitions=3", Some(0));
        assert_eq!(
            ops(&g),
            ["shardproof_p2p.send.default", "aten.full.default"]
        );
        // Without a device the permute is opaque.
        assert_eq!(
            ops(&import_with(body, ", num_partitions=3", None)),
            ["hlo.collective_permute.default"]
        );
    }

    #[test]
    fn unknown_instructions_are_opaque() {
        let g = import("cmp {\n  a = f32[] parameter(0)\n  ROOT b = pred[] constant(true)\n}\nENTRY e {\n  x = f32[4] parameter(0)\n  i = s32[4] parameter(1)\n  ROOT s = (f32[4], s32[4]) sort(x, i), dimensions={0}, to_apply=cmp, is_stable=true\n}\n", None);
        let n = g
            .nodes
            .iter()
            .find(|n| n.op().is_some_and(|o| o.namespace == "hlo"))
            .unwrap();
        assert_eq!(n.op().unwrap().to_string(), "hlo.sort.default");
        assert_eq!(n.outputs.len(), 2);
        assert_eq!(n.kwarg("is_stable"), Some(&Arg::Str("true".into())));
        let g = import("ENTRY e {\n  x = f32[4] parameter(0)\n  ROOT c = f32[4] custom-call(x), custom_call_target=\"__onednn$matmul\"\n}\n", None);
        assert_eq!(ops(&g), ["hlo.custom_call.__onednn_matmul"]);
        let g = import("ENTRY e {\n  x = f32[4] parameter(0)\n  ROOT c = f32[4] custom-call(x), custom_call_target=\"Sharding\", sharding={replicated}\n}\n", None);
        assert_eq!(ops(&g), ["aten.alias.default"]);
        assert!(g
            .nodes
            .iter()
            .all(|n| !matches!(n.kind, NodeKind::Constant { .. })));
    }

    #[test]
    fn bitcasts_follow_layouts() {
        // A bitcast between transposed layouts is a transpose of the logical values.
        let g = import(
            "ENTRY e {\n  x = f32[2,3]{1,0} parameter(0)\n  ROOT b = f32[3,2]{0,1} bitcast(x)\n}\n",
            None,
        );
        assert_eq!(ops(&g), ["aten.permute.default"]);
        let g = import(
            "ENTRY e {\n  x = f32[2,3]{1,0} parameter(0)\n  ROOT b = f32[6]{0} bitcast(x)\n}\n",
            None,
        );
        assert_eq!(ops(&g), ["aten.reshape.default"]);
    }

    #[test]
    fn errors_name_line_and_column() {
        let e = parse_hlo(
            "HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT y = f32[4] negate(z)\n}\n",
            Path::new("g.hlo"),
            None,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("g.hlo:4:8: operand `z` of `y` is not defined before it"),
            "{e}"
        );
        let e = parse_hlo(
            "HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT y = f32[4] negate(x\n}\n",
            Path::new("g.hlo"),
            None,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("g.hlo:4:"), "{e}");
        let long = "a".repeat(500);
        let e = parse_hlo(&format!("HloModule m\nENTRY e {{\n  x = f32[4] parameter(0)\n  ROOT y = f32[4] negate({long})\n}}\n"), Path::new("g.hlo"), None).unwrap_err();
        assert!(e.message.chars().count() < 300, "{e}");
        let e = parse_hlo(
            "HloModule m, num_partitions=2\nENTRY e {\n  ROOT x = f32[4] parameter(0)\n}\n",
            Path::new("g.dev5.hlo"),
            Some(5),
        )
        .unwrap_err();
        assert!(e.message.contains("device 5"), "{e}");
        assert!(parse_hlo("", Path::new("g.hlo"), None).is_err());
    }

    #[test]
    fn shapes_that_do_not_fit_are_errors_not_panics() {
        for body in [
            "ENTRY e {\n  x = f32[3,8] parameter(0)\n  ROOT s = f32[2] slice(x), slice={[0:2], [0:8]}\n}\n",
            "ENTRY e {\n  x = f32[3,8] parameter(0)\n  ROOT s = f32[2,9] slice(x), slice={[0:2], [0:9]}\n}\n",
            "ENTRY e {\n  x = f32[3,8] parameter(0)\n  o = s32[] constant(0)\n  ROOT s = f32[2] dynamic-slice(x, o, o), dynamic_slice_sizes={2,8}\n}\n",
            "ENTRY e {\n  x = f32[3] parameter(0)\n  ROOT b = f32[3,2] broadcast(x), dimensions={2}\n}\n",
            "ENTRY e {\n  a = f32[8,16] parameter(0)\n  b = f32[4,4] parameter(1)\n  ROOT d = f32[8,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n",
        ] {
            let text = format!("HloModule t\n{body}");
            let e = parse_hlo(&text, Path::new("t.hlo"), None).unwrap_err();
            assert!(e.span.is_some(), "{e}");
        }
    }

    #[test]
    fn device_ids_come_from_file_names() {
        assert_eq!(hlo_device_from_path(Path::new("a/b.tp4.dev3.hlo")), Some(3));
        assert_eq!(hlo_device_from_path(Path::new("b.dev12.hlo.txt")), Some(12));
        assert_eq!(hlo_device_from_path(Path::new("b.hlo")), None);
        assert!(is_hlo_path(Path::new("x.HLO")) && is_hlo_path(Path::new("x.hlo.txt")));
        assert!(looks_like_hlo("\n  HloModule m\n") && !looks_like_hlo("class G:"));
    }

    #[test]
    fn garbage_never_panics() {
        let seeds = [
            "HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT y = f32[4] add(x, x)\n}\n",
            "HloModule m, num_partitions=2\nENTRY e {\n  x = f32[4,2]{1,0} parameter(0)\n  ROOT g = f32[8,2] all-gather(x), channel_id=1, replica_groups=[1,2]<=[2], dimensions={0}\n}\n",
        ];
        for s in seeds {
            let chars: Vec<char> = s.chars().collect();
            for cut in 0..chars.len() {
                let t: String = chars[..cut].iter().collect();
                let _ = parse_hlo(&t, Path::new("g.hlo"), Some(1));
                let mut u = chars.clone();
                u[cut] = match u[cut] {
                    '{' => '}',
                    '(' => '[',
                    '0' => '9',
                    'f' => 's',
                    ',' => ' ',
                    _ => '%',
                };
                let u: String = u.into_iter().collect();
                let _ = parse_hlo(&u, Path::new("g.hlo"), Some(1));
            }
        }
    }
}
