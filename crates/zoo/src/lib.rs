//! The model zoo of shardproof: emits a specification graph, its distributed rank graphs
//! (torch.fx readable text) and a case file, for a model, a parallel plan on a mesh and
//! optionally a planted bug from the catalog.

pub mod bugs;
pub mod graph;
pub mod mlp;

pub use bugs::{find_bug, Bug, Mutation, BUGS};
pub use mlp::MlpConfig;

use mlp::TpLayout;
use std::fmt::Write as _;
use std::path::Path;

/// The models the zoo can emit: name and one line.
pub const MODELS: &[(&str, &str)] = &[(
    "mlp",
    "fc1 + relu + fc2 blocks with an MSE loss (sizes: hidden, ffn, batch, layers)",
)];

/// The parallelisms (mesh dims) the zoo can emit: name and one line.
pub const PARALLELISMS: &[(&str, &str)] = &[
    (
        "dp",
        "data parallel: batch Shard(0), loss and gradients all-reduced and averaged over dp",
    ),
    (
        "tp",
        "Megatron tensor parallel: fc1 column parallel, fc2 row parallel with an all-reduce",
    ),
];

/// A mesh of the zoo's plans: sizes of the `dp` and `tp` dims, `dp` outermost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    /// The dims in mesh order, with their sizes.
    pub dims: Vec<(&'static str, usize)>,
}

impl Mesh {
    /// Parses `dp=2,tp=2` (any order, each dim at most once, sizes at least 1).
    pub fn parse(text: &str) -> Result<Mesh, String> {
        let mut dims: Vec<(&'static str, usize)> = Vec::new();
        for part in text.split(',').map(str::trim) {
            let Some((name, size)) = part.split_once('=') else {
                return Err(format!(
                    "mesh entry `{part}` is not NAME=SIZE (e.g. dp=2,tp=2)"
                ));
            };
            let Some(&(dim, _)) = PARALLELISMS.iter().find(|(n, _)| *n == name.trim()) else {
                return Err(format!("unknown mesh dim `{}`; known: dp, tp", name.trim()));
            };
            let size: usize = match size.trim().parse() {
                Ok(s) if s >= 1 => s,
                _ => {
                    return Err(format!(
                        "mesh dim `{dim}` has size `{}`: not a positive integer",
                        size.trim()
                    ))
                }
            };
            if dims.iter().any(|(d, _)| *d == dim) {
                return Err(format!("mesh dim `{dim}` is given twice"));
            }
            dims.push((dim, size));
        }
        dims.sort_by_key(|(d, _)| PARALLELISMS.iter().position(|(n, _)| n == d));
        Ok(Mesh { dims })
    }

    /// The size of `dim` (1 when the mesh lacks it).
    pub fn size(&self, dim: &str) -> usize {
        self.dims
            .iter()
            .find(|(d, _)| *d == dim)
            .map_or(1, |(_, s)| *s)
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.dims.iter().map(|(_, s)| s).product()
    }

    /// A short label, e.g. `dp2-tp2`.
    pub fn label(&self) -> String {
        let parts: Vec<String> = self.dims.iter().map(|(d, s)| format!("{d}{s}")).collect();
        parts.join("-")
    }
}

/// What to emit.
#[derive(Clone, Debug)]
pub struct EmitOptions {
    /// The model name (see [`MODELS`]).
    pub model: String,
    /// The sizes of the MLP.
    pub mlp: MlpConfig,
    /// The mesh of the distributed plan.
    pub mesh: Mesh,
    /// A catalog bug to plant, if any.
    pub bug: Option<&'static Bug>,
    /// Emit the forward pass and loss only (no backward, no optimizer step).
    pub forward_only: bool,
}

/// An emitted case: file names (relative to the output directory) and their contents.
#[derive(Clone, Debug)]
pub struct Emitted {
    /// `case.yaml`, `spec.py`, `r0.py`, ... in that order.
    pub files: Vec<(String, String)>,
}

impl Emitted {
    /// Writes every file into `dir` (created when missing).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for (name, text) in &self.files {
            std::fs::write(dir.join(name), text)?;
        }
        Ok(())
    }
}

/// Emits the case described by `opts`, or says why it cannot.
pub fn emit(opts: &EmitOptions) -> Result<Emitted, String> {
    if !MODELS.iter().any(|(m, _)| *m == opts.model) {
        let known: Vec<&str> = MODELS.iter().map(|(m, _)| *m).collect();
        return Err(format!(
            "unknown model `{}`; known: {}",
            opts.model,
            known.join(", ")
        ));
    }
    if opts.mesh.dims.is_empty() {
        return Err("the mesh has no dims (e.g. --mesh tp=2)".into());
    }
    let (dp, tp) = (opts.mesh.size("dp"), opts.mesh.size("tp"));
    opts.mlp.check_split(dp, tp)?;
    if let Some(bug) = opts.bug {
        bug.check_applies(dp, tp, opts.forward_only)?;
    }
    let cfg = &opts.mlp;
    let spec = mlp::build(cfg, 1, 1, opts.forward_only, None);
    let rank = mlp::build(cfg, dp, tp, opts.forward_only, opts.bug.map(|b| b.mutation)).render();
    let n = opts.mesh.ranks();
    let mut files = vec![
        ("case.yaml".to_string(), case_yaml(opts, &spec)),
        ("spec.py".to_string(), spec.render()),
    ];
    files.extend((0..n).map(|r| (format!("r{r}.py"), rank.clone())));
    Ok(Emitted { files })
}

fn case_yaml(opts: &EmitOptions, spec: &graph::GraphBuilder) -> String {
    let mesh = &opts.mesh;
    let has = |d: &str| mesh.dims.iter().any(|(m, _)| *m == d);
    let on = |dim: &str, p: &str| {
        if has(dim) {
            format!("{{ {dim}: {p} }}")
        } else {
            "Replicate()".to_string()
        }
    };
    let tp_place = |l: TpLayout| match l {
        TpLayout::Replicate => "Replicate()".to_string(),
        TpLayout::Shard(d) => on("tp", &format!("Shard({d})")),
    };
    let mut name = format!("{}-{}", opts.model, mesh.label());
    if opts.forward_only {
        name.push_str("-fw");
    }
    if let Some(b) = opts.bug {
        let _ = write!(name, "-{}", b.id);
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Emitted by `shardproof zoo emit`: model {}, mesh {}.",
        opts.model,
        mesh.label()
    );
    let _ = writeln!(
        s,
        "# {}",
        if opts.forward_only {
            "Forward and loss only."
        } else {
            "Full iteration: forward, loss, backward, gradient all-reduce, SGD step."
        }
    );
    if let Some(b) = opts.bug {
        let _ = writeln!(s, "# Planted bug `{}`: {}.", b.id, b.description);
    }
    let _ = writeln!(
        s,
        "version: 1\nname: {name}\nspec:\n  graph: spec.py\nimpl:"
    );
    let dims: Vec<String> = mesh.dims.iter().map(|(d, n)| format!("{d}: {n}")).collect();
    let _ = writeln!(s, "  mesh: {{ {} }}", dims.join(", "));
    let graphs: Vec<String> = (0..mesh.ranks()).map(|r| format!("r{r}.py")).collect();
    let _ = writeln!(s, "  graphs: [{}]\n  groups:", graphs.join(", "));
    for (d, _) in &mesh.dims {
        let _ = writeln!(s, "    \"{d}\": {d}");
    }
    let _ = writeln!(s, "inputs:");
    let _ = writeln!(s, "  x: {}", on("dp", "Shard(0)"));
    let _ = writeln!(s, "  target: {}", on("dp", "Shard(0)"));
    let params = opts.mlp.params();
    for p in &params {
        let _ = writeln!(s, "  {}: {}", p.name, tp_place(p.tp));
    }
    let _ = writeln!(s, "outputs:");
    for out in spec.outputs() {
        let place = match params
            .iter()
            .find(|p| format!("{}_new", p.name) == out.name)
        {
            Some(p) => tp_place(p.tp),
            None => "Replicate()".to_string(),
        };
        let _ = writeln!(s, "  {}: {place}", out.name);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_parses_and_orders() {
        let m = Mesh::parse("tp=4, dp=2").unwrap();
        assert_eq!(m.dims, vec![("dp", 2), ("tp", 4)]);
        assert_eq!((m.ranks(), m.label()), (8, "dp2-tp4".to_string()));
        for bad in ["tp", "pp=2", "tp=0", "tp=x", "tp=2,tp=2"] {
            assert!(Mesh::parse(bad).is_err(), "{bad}");
        }
    }
}
