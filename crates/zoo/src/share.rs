//! Writing a plan's rank graphs, and which ranks share a program.
//!
//! Under [`RankGraphs::Shared`] a plan of thousands of ranks (llama3-405b: 8192) runs a few
//! hundred distinct programs: the data-parallel replicas of a rank run its program, since every
//! peer and collective group in a rank graph is group-relative. Building and rendering every
//! rank only to find its text equal to an earlier one's costs minutes to hours, so each rank is
//! given a *program key* (the mesh coordinates its program depends on, [`program_key`]) and one
//! graph is built per key. A wrong key would silently hand a rank another rank's program, so
//! the key is conservative (it drops the dp coordinate only where no rank reads it: no ZeRO
//! shard, no planted bug), a second member of every key is built and compared (a mismatch is an
//! error, never a merge), and the tests compare the keyed emission with the build-every-rank one
//! byte for byte.

use crate::{case_yaml, EmitExtras, EmitOptions, EmitSink, EmitSummary, Mesh, Plan, RankGraphs};
use crate::{Stages, TrainOptions};
use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};

/// How the rank graphs of a [`RankGraphs::Shared`] emission are built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Build {
    /// Every rank built and rendered, equal texts stored once (the reference the keyed build
    /// is tested against).
    EveryRank,
    /// One graph built per program key; with `verify`, a second member of each key (its last
    /// rank) built too and its text compared with the first's.
    Keyed {
        /// Build and compare a second member of each key.
        verify: bool,
    },
}

/// Whether the programs of a plan are the same on every dp coordinate: the zoo's ranks read
/// their dp index only to take their ZeRO shard (and to count a whole parameter once in the
/// ZeRO gradient norm), and a planted bug may single out a rank; everything else a rank graph
/// names (peers, groups) is group-relative.
pub(crate) fn dp_invariant(opts: &EmitOptions, train: &TrainOptions) -> bool {
    train.zero.is_none() && opts.bug.is_none()
}

/// The program key of rank `r`: its mesh coordinates, the dp coordinate left out (zero) when
/// `dp_invariant`. Ranks with equal keys run byte-identical rank graphs.
pub(crate) fn program_key(mesh: &Mesh, dp_invariant: bool, r: usize) -> Vec<usize> {
    let mut coords = mesh.coords(r);
    if dp_invariant {
        for (c, (d, _)) in coords.iter_mut().zip(&mesh.dims) {
            if *d == "dp" {
                *c = 0;
            }
        }
    }
    coords
}

/// Writes `plan` into `sink`: spec, rank graphs (one file per rank, or per distinct program
/// under [`RankGraphs::Shared`], built once per program key), case file.
pub(crate) fn write_plan(
    opts: &EmitOptions,
    extras: &EmitExtras,
    train: &TrainOptions,
    planned: (Plan, Option<Stages>),
    sink: &mut dyn EmitSink,
) -> Result<EmitSummary, String> {
    let invariant = dp_invariant(opts, train);
    let key = |r: usize| program_key(&opts.mesh, invariant, r);
    let build = Build::Keyed { verify: true };
    write_plan_keyed(opts, extras, train, planned, sink, build, &key)
}

/// A rank graph stored under [`RankGraphs::Shared`]: its file and node count.
type Stored = (String, usize);

/// [`write_plan`] with the build and the program key given (the tests plant wrong keys).
pub(crate) fn write_plan_keyed(
    opts: &EmitOptions,
    extras: &EmitExtras,
    train: &TrainOptions,
    (plan, stages): (Plan, Option<Stages>),
    sink: &mut dyn EmitSink,
    build: Build,
    key: &dyn Fn(usize) -> Vec<usize>,
) -> Result<EmitSummary, String> {
    sink.put("spec.py", &plan.spec.render())?;
    let ranks = opts.mesh.ranks();
    let mut rank_nodes = 0;
    let mut graph_files: Vec<String> = Vec::with_capacity(ranks);
    // Under `Shared`: the files written so far, by a hash of their text (equal hashes are
    // confirmed by comparing the texts, so a collision never merges two programs).
    let mut written: HashMap<u64, Vec<String>> = HashMap::new();
    let shared = extras.rank_graphs == RankGraphs::Shared;
    let keyed = shared && build != Build::EveryRank;
    // Per program key: its last rank (the member verified) and, once built, its stored graph.
    let mut last_of: HashMap<Vec<usize>, usize> = HashMap::new();
    if keyed {
        for r in 0..ranks {
            last_of.insert(key(r), r);
        }
    }
    let mut stored: HashMap<Vec<usize>, Stored> = HashMap::new();
    for r in 0..ranks {
        let k = if keyed { Some(key(r)) } else { None };
        if let Some((file, nodes)) = k.as_ref().and_then(|k| stored.get(k)) {
            graph_files.push(file.clone());
            rank_nodes += nodes;
            continue;
        }
        let graph = (plan.rank)(r);
        let nodes = graph.nodes();
        rank_nodes += nodes;
        let text = graph.render();
        drop(graph);
        let name = format!("r{r}.py");
        if !shared {
            sink.put(&name, &text)?;
            graph_files.push(name);
            continue;
        }
        if let (Some(k), Build::Keyed { verify: true }) = (&k, build) {
            let last = last_of[k];
            if last != r && (plan.rank)(last).render() != text {
                return Err(format!(
                    "internal error: ranks {r} and {last} were given one program key {k:?} \
                     (mesh {}) but their rank graphs differ; the zoo's program key is wrong \
                     for this plan (emit without sharing: --share-graphs false)",
                    opts.mesh.label()
                ));
            }
        }
        let file = store(sink, &mut written, &name, &text)?;
        if let Some(k) = k {
            stored.insert(k, (file.clone(), nodes));
        }
        graph_files.push(file);
    }
    let mut rank_files = graph_files.clone();
    rank_files.sort_unstable();
    rank_files.dedup();
    sink.put(
        "case.yaml",
        &case_yaml(opts, extras, train, &plan, stages.as_ref(), &graph_files),
    )?;
    Ok(EmitSummary {
        ranks,
        rank_files: rank_files.len(),
        spec_nodes: plan.spec.nodes(),
        rank_nodes,
    })
}

/// Stores `text` as the file `name` unless an earlier file holds it: the file that holds it.
fn store(
    sink: &mut dyn EmitSink,
    written: &mut HashMap<u64, Vec<String>>,
    name: &str,
    text: &str,
) -> Result<String, String> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    let same = written.entry(hasher.finish()).or_default();
    for file in same.iter() {
        if sink.holds(file, text)? {
            return Ok(file.clone());
        }
    }
    sink.put(name, text)?;
    same.push(name.to_string());
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        check_and_plan, find_bug, EmitOptions, Emitted, EpDispatch, PipelineOptions, Schedule,
        ZeroStage, PRESETS,
    };

    /// The files of the emission of a request with `build` and `key` (the real program key
    /// when `None`), or why it failed.
    fn emit(
        (opts, extras, train, pipeline): &Request,
        build: Build,
        key: Option<&dyn Fn(usize) -> Vec<usize>>,
    ) -> Result<Vec<(String, String)>, String> {
        let planned = check_and_plan(opts, extras, train, pipeline)?;
        let invariant = dp_invariant(opts, train);
        let real = |r: usize| program_key(&opts.mesh, invariant, r);
        let mut sink = Emitted { files: Vec::new() };
        write_plan_keyed(
            opts,
            extras,
            train,
            planned,
            &mut sink,
            build,
            key.unwrap_or(&real),
        )?;
        Ok(sink.files)
    }

    type Request = (EmitOptions, EmitExtras, TrainOptions, PipelineOptions);

    /// Asserts that the keyed emission of `request` is the build-every-rank emission byte for
    /// byte (the verified one: where it succeeds the unverified one writes the same files);
    /// returns the number of distinct rank files.
    fn assert_keyed_equal(what: &str, request: &Request) -> usize {
        let every = emit(request, Build::EveryRank, None).unwrap_or_else(|e| panic!("{what}: {e}"));
        let keyed = emit(request, Build::Keyed { verify: true }, None)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            keyed.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            every.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            "{what}: file names"
        );
        for ((name, a), (_, b)) in keyed.iter().zip(&every) {
            assert!(
                a == b,
                "{what}: {name} differs from the build-every-rank one"
            );
        }
        every.len() - 2
    }

    /// A small request of `model` on `mesh` (sizes that split over every dim used here).
    fn small(model: &str, mesh: &str) -> Request {
        let mut opts = EmitOptions {
            model: model.into(),
            mlp: crate::MlpConfig::default(),
            llama: crate::LlamaConfig::default(),
            mesh: Mesh::parse(mesh).unwrap(),
            bug: None,
            forward_only: false,
            vocab_parallel: false,
        };
        opts.llama.batch = 8;
        opts.mlp.layers = 2;
        let mut extras = EmitExtras {
            rank_graphs: RankGraphs::Shared,
            ..EmitExtras::default()
        };
        extras.gpt2.batch = 8;
        extras.deepseek.base.batch = 8;
        let pipeline = if opts.mesh.size("pp") > 1 {
            PipelineOptions {
                microbatches: 2,
                schedule: Schedule::OneFOneB,
                ..PipelineOptions::default()
            }
        } else {
            PipelineOptions::default()
        };
        (opts, extras, TrainOptions::default(), pipeline)
    }

    fn vocab_parallel(mut r: Request) -> Request {
        r.0.vocab_parallel = true;
        r
    }

    fn zero(stage: ZeroStage, mut r: Request) -> Request {
        r.2.zero = Some(stage);
        r.2.clip_grad = Some(1.0);
        r
    }

    /// The `-tiny` presets, one test each (each emits its preset three times).
    const TINY: [&str; 6] = [
        "llama3-8b-tiny",
        "llama3-70b-tiny",
        "llama3-405b-tiny",
        "deepseek-v3-16b-tiny",
        "deepseek-v3-236b-tiny",
        "deepseek-v3-671b-tiny",
    ];

    fn assert_tiny_preset_keyed_equal(index: usize) {
        let preset = crate::find_preset(TINY[index]).unwrap();
        let (opts, extras, pipeline) = preset.request();
        assert_eq!(extras.rank_graphs, RankGraphs::Shared);
        let files = assert_keyed_equal(
            preset.name,
            &(opts, extras, TrainOptions::default(), pipeline),
        );
        assert!(
            files < preset.mesh().ranks(),
            "{}: {files} files",
            preset.name
        );
    }

    #[test]
    fn the_tiny_preset_tests_cover_every_tiny_preset() {
        let tiny: Vec<&str> = PRESETS
            .iter()
            .map(|p| p.name)
            .filter(|n| n.ends_with("-tiny"))
            .collect();
        assert_eq!(tiny, TINY);
    }

    #[test]
    fn keyed_emit_equals_every_rank_on_llama3_8b_tiny() {
        assert_tiny_preset_keyed_equal(0);
    }

    #[test]
    fn keyed_emit_equals_every_rank_on_llama3_70b_tiny() {
        assert_tiny_preset_keyed_equal(1);
    }

    #[test]
    fn keyed_emit_equals_every_rank_on_llama3_405b_tiny() {
        assert_tiny_preset_keyed_equal(2);
    }

    #[test]
    fn keyed_emit_equals_every_rank_on_deepseek_v3_16b_tiny() {
        assert_tiny_preset_keyed_equal(3);
    }

    #[test]
    fn keyed_emit_equals_every_rank_on_deepseek_v3_236b_tiny() {
        assert_tiny_preset_keyed_equal(4);
    }

    #[test]
    fn keyed_emit_equals_every_rank_on_deepseek_v3_671b_tiny() {
        assert_tiny_preset_keyed_equal(5);
    }

    #[test]
    fn keyed_emit_equals_every_rank_on_dense_meshes() {
        let mut cases: Vec<(String, Request)> = Vec::new();
        for model in ["mlp", "llama", "gpt2"] {
            for mesh in ["dp=2", "tp=2", "dp=4,tp=2", "pp=2,dp=2", "pp=2,dp=2,tp=2"] {
                cases.push((format!("{model} {mesh}"), small(model, mesh)));
            }
            for stage in [ZeroStage::One, ZeroStage::Two, ZeroStage::Three] {
                let what = format!("{model} dp=2,tp=2 zero {stage:?}");
                cases.push((what, zero(stage, small(model, "dp=2,tp=2"))));
            }
            let what = format!("{model} pp=2,dp=2 zero 1");
            cases.push((what, zero(ZeroStage::One, small(model, "pp=2,dp=2"))));
        }
        for model in ["llama", "gpt2"] {
            cases.push((format!("{model} cp"), small(model, "dp=2,cp=2,tp=2")));
        }
        let vp = vocab_parallel(small("llama", "pp=2,dp=2,tp=2"));
        cases.push(("llama vp".into(), vp));
        let vp = vocab_parallel(small("llama", "dp=2,tp=2"));
        cases.push(("llama vp no pp".into(), vp));
        // tp = 4 over 2 kv heads: the kv groups.
        cases.push(("llama kv replicas".into(), small("llama", "dp=2,tp=4")));
        let mut sp = small("gpt2", "dp=2,cp=2,tp=2");
        sp.1.sequence_parallel = true;
        cases.push(("gpt2 sp cp".into(), sp));
        let mut accum = small("mlp", "dp=2,tp=2");
        accum.2.grad_accum = 2;
        cases.push(("mlp grad accum".into(), accum));
        let mut fw = small("llama", "pp=2,dp=2,tp=2");
        fw.0.forward_only = true;
        cases.push(("llama forward only".into(), fw));
        let mut shared = 0;
        for (what, request) in &cases {
            let files = assert_keyed_equal(what, request);
            shared += usize::from(files < request.0.mesh.ranks());
        }
        // The dp replicas did share files: the comparison covered the keyed path.
        assert!(shared > cases.len() / 2, "{shared} of {}", cases.len());
    }

    #[test]
    fn keyed_emit_equals_every_rank_on_moe_meshes() {
        let mut cases: Vec<(String, Request)> = Vec::new();
        for mesh in [
            "dp=2,ep=2",
            "dp=2,tp=2,ep=2",
            "dp=2,cp=2,ep=2",
            "pp=2,dp=2,ep=2",
        ] {
            cases.push((format!("deepseek {mesh}"), small("deepseek", mesh)));
        }
        let mut sp = small("deepseek", "dp=2,tp=2,ep=2");
        sp.1.sequence_parallel = true;
        cases.push(("deepseek sp".into(), sp));
        let mut a2a = small("deepseek", "dp=2,tp=2,ep=2");
        a2a.1.ep_dispatch = EpDispatch::AllToAll;
        cases.push(("deepseek a2a".into(), a2a));
        for (what, request) in &cases {
            let files = assert_keyed_equal(what, request);
            assert!(files < request.0.mesh.ranks(), "{what}: {files} files");
        }
    }

    #[test]
    fn keyed_emit_equals_every_rank_with_planted_bugs() {
        for (bug, model, mesh, zero_stage) in [
            (
                "zero-param-update-skipped",
                "mlp",
                "dp=2,tp=2",
                Some(ZeroStage::One),
            ),
            ("dp-grad-not-averaged", "llama", "dp=2,tp=2", None),
            ("pp-mismatched-send-recv", "llama", "pp=2,dp=2,tp=2", None),
        ] {
            let mut request = small(model, mesh);
            request.0.bug = Some(find_bug(bug).unwrap());
            if let Some(stage) = zero_stage {
                request = zero(stage, request);
            }
            assert_keyed_equal(bug, &request);
        }
    }

    /// A program key that wrongly leaves out mesh dim `dim`.
    fn dropping(mesh: &Mesh, dim: &str) -> impl Fn(usize) -> Vec<usize> {
        let (mesh, dim) = (mesh.clone(), dim.to_string());
        move |r| {
            let mut k = mesh.coords(r);
            for (c, (d, _)) in k.iter_mut().zip(&mesh.dims) {
                if *d == dim {
                    *c = 0;
                }
            }
            k
        }
    }

    #[test]
    fn a_key_that_drops_a_dim_that_matters_is_caught() {
        let planted = [
            ("tp", vocab_parallel(small("llama", "dp=2,tp=2"))),
            ("pp", small("llama", "pp=2,dp=2")),
            ("cp", small("gpt2", "dp=2,cp=2")),
            ("ep", small("deepseek", "dp=2,ep=2")),
            // ZeRO: each dp rank updates its own shard.
            ("dp", zero(ZeroStage::One, small("mlp", "dp=2,tp=2"))),
        ];
        for (dim, request) in &planted {
            let every = emit(request, Build::EveryRank, None).unwrap();
            let wrong = dropping(&request.0.mesh, dim);
            // Unverified, the wrong key hands ranks another rank's program: the comparison
            // with the build-every-rank emission sees it.
            let keyed = emit(request, Build::Keyed { verify: false }, Some(&wrong)).unwrap();
            assert!(
                keyed != every,
                "dropping {dim}: the keyed emission is unchanged"
            );
            // Verified, the emission refuses.
            let err = emit(request, Build::Keyed { verify: true }, Some(&wrong)).unwrap_err();
            assert!(err.contains("program key"), "dropping {dim}: {err}");
        }
    }

    #[test]
    fn program_keys_drop_only_the_dp_coordinate() {
        let mesh = Mesh::parse("pp=2,dp=3,tp=2").unwrap();
        assert_eq!(mesh.coords(0), vec![0, 0, 0]);
        assert_eq!(mesh.coords(7), vec![1, 0, 1]);
        assert_eq!(mesh.coords(11), vec![1, 2, 1]);
        assert_eq!(program_key(&mesh, true, 11), vec![1, 0, 1]);
        assert_eq!(program_key(&mesh, false, 11), vec![1, 2, 1]);
    }
}
