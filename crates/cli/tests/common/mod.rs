//! Helpers shared by the end-to-end tests of the `shardproof` binary: a scratch directory to
//! write small graphs and cases into, a runner that captures exit code, stdout and stderr, and
//! hand-made torch.fx readable graphs.

#![allow(dead_code)]

pub mod spec_check;
pub mod zoo;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Emits the zoo's `model` under `mesh` (plus `extra` flags) into `dir` and returns its case
/// file; panics with the emitter's message when it refuses.
pub fn emit_zoo(model: &str, dir: &Path, mesh: &str, extra: &[&str]) -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(["zoo", "emit", model, "--mesh", mesh, "-o"])
        .arg(dir)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("case.yaml")
}

/// The exit code and standard output of `shardproof verify CASE`.
pub fn verify_exit(case: &Path) -> (i32, String) {
    verify_exit_with(case, &[])
}

/// The exit code and standard output of `shardproof verify CASE FLAGS...` (`--no-prove`: the
/// verdict of relation inference and the runs alone).
pub fn verify_exit_with(case: &Path, flags: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .arg("verify")
        .arg(case)
        .args(flags)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// What one invocation of the binary produced.
#[derive(Debug)]
pub struct Out {
    /// The exit code (`None` if the process was killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// Asserts the exit code, showing everything the command printed when it differs.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "expected exit code {code}, got {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
            self.code,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Asserts that stderr contains every one of `parts`.
    #[track_caller]
    pub fn stderr_has(&self, parts: &[&str]) -> &Self {
        for p in parts {
            assert!(
                self.stderr.contains(p),
                "stderr lacks {p:?}\n--- stdout:\n{}\n--- stderr:\n{}",
                self.stdout,
                self.stderr
            );
        }
        self
    }

    /// Asserts that stdout contains every one of `parts`.
    #[track_caller]
    pub fn stdout_has(&self, parts: &[&str]) -> &Self {
        for p in parts {
            assert!(
                self.stdout.contains(p),
                "stdout lacks {p:?}\n--- stdout:\n{}\n--- stderr:\n{}",
                self.stdout,
                self.stderr
            );
        }
        self
    }

    /// stdout parsed as JSON.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON: {e}\n--- stdout:\n{}\n--- stderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// The output `run` names as the first mismatch (`first mismatching output `NAME``).
#[track_caller]
pub fn first_mismatch(out: &Out) -> String {
    out.stdout
        .split("first mismatching output `")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .unwrap_or_else(|| panic!("no mismatching output named\n{}", out.stdout))
        .to_string()
}

/// Runs `shardproof ARGS` in `cwd`.
pub fn shardproof_in(cwd: &Path, args: &[&str]) -> Out {
    let out = Command::new(env!("CARGO_BIN_EXE_shardproof"))
        .args(args)
        .current_dir(cwd)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the shardproof binary starts");
    Out {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

/// A scratch directory holding the files of one test.
pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Self {
        Scratch {
            dir: tempfile::Builder::new()
                .prefix("shardproof-cli-test-")
                .tempdir()
                .expect("a temporary directory"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `text` to `name` (relative to the directory) and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", p.display()));
        p
    }

    /// Runs `shardproof ARGS` with the directory as the working directory, so relative paths
    /// in arguments and reports are stable.
    pub fn run(&self, args: &[&str]) -> Out {
        shardproof_in(self.dir.path(), args)
    }

    /// Replaces the directory's path in `text` by `[TMP]`.
    pub fn redact(&self, text: &str) -> String {
        let p = self.dir.path().display().to_string();
        text.replace(&p, "[TMP]")
    }
}

/// Single-device spec: `mm = x @ w`, x f32[4, 8], w f32[8, 6].
pub const SPEC_MM: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]", w: "f32[8, 6]"):
        mm: "f32[4, 6]" = torch.ops.aten.mm.default(x, w);  x = w = None
        return (mm,)
"#;

/// Row-parallel rank of `SPEC_MM` on 2 ranks: x sharded on dim 1, w on dim 0, the partial
/// product all-reduced over group `tp`.
pub const RANK_MM_ALLREDUCE: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 4]", w: "f32[4, 6]"):
        mm: "f32[4, 6]" = torch.ops.aten.mm.default(x, w);  x = w = None
        all_reduce: "f32[4, 6]" = torch.ops._c10d_functional.all_reduce.default(mm, 'sum', 'tp');  mm = None
        wait_tensor: "f32[4, 6]" = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        return (wait_tensor,)
"#;

/// Row-parallel rank of `SPEC_MM` without a collective: the output is a partial sum.
pub const RANK_MM_PARTIAL: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 4]", w: "f32[4, 6]"):
        mm: "f32[4, 6]" = torch.ops.aten.mm.default(x, w);  x = w = None
        return (mm,)
"#;

/// The row-parallel case over `spec.py`, `r0.py`, `r1.py` (line 9: `x`, line 10: `w`, line 12: `mm`).
pub const CASE_ROWPAR: &str = "version: 1
name: rowpar
spec:
  graph: spec.py
impl:
  mesh: { tp: 2 }
  graphs: [r0.py, r1.py]
inputs:
  x: Shard(1)
  w: Shard(0)
outputs:
  mm: Partial()
";

/// A scratch directory with `spec.py` = `SPEC_MM`, `r0.py`/`r1.py` = `RANK_MM_ALLREDUCE` and
/// `case.yaml` = `CASE_ROWPAR`.
pub fn rowpar() -> Scratch {
    let s = Scratch::new();
    s.write("spec.py", SPEC_MM);
    s.write("r0.py", RANK_MM_ALLREDUCE);
    s.write("r1.py", RANK_MM_ALLREDUCE);
    s.write("case.yaml", CASE_ROWPAR);
    s
}

/// Spec of a column-parallel layer: `relu(x @ w)`, x f32[4, 8], w f32[8, 6].
pub const SPEC_COL: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]", w: "f32[8, 6]"):
        mm: "f32[4, 6]" = torch.ops.aten.mm.default(x, w);  x = w = None
        relu: "f32[4, 6]" = torch.ops.aten.relu.default(mm);  mm = None
        return (relu,)
"#;

/// A rank of the column-parallel layer: w sharded on dim 1, the output sharded on dim 1.
pub const RANK_COL: &str = r#"class GraphModule(torch.nn.Module):
    def forward(self, x: "f32[4, 8]", w: "f32[8, 3]"):
        mm: "f32[4, 3]" = torch.ops.aten.mm.default(x, w);  x = w = None
        relu: "f32[4, 3]" = torch.ops.aten.relu.default(mm);  mm = None
        return (relu,)
"#;

pub const CASE_COL: &str = "version: 1
name: colpar
spec:
  graph: spec.py
impl:
  mesh: { tp: 2 }
  graphs: [r0.py, r1.py]
inputs:
  x: Replicate()
  w: Shard(1)
outputs:
  relu: Shard(1)
";

/// A scratch directory with the column-parallel case.
pub fn colpar() -> Scratch {
    let s = Scratch::new();
    s.write("spec.py", SPEC_COL);
    s.write("r0.py", RANK_COL);
    s.write("r1.py", RANK_COL);
    s.write("case.yaml", CASE_COL);
    s
}

/// The folder of the Entangle samples: `$SHARDPROOF_SHARED/samples/entangle` or
/// `CARGO_MANIFEST_DIR/../../../shared/samples/entangle`; `None` (with a message) when absent.
pub fn entangle_samples() -> Option<PathBuf> {
    let shared = match std::env::var_os("SHARDPROOF_SHARED") {
        Some(s) => PathBuf::from(s),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    };
    let dir = shared.join("samples/entangle");
    if dir.join("case-tp2.yaml").is_file() {
        Some(dir)
    } else {
        println!(
            "SKIPPED: the Entangle samples are not at {} (set SHARDPROOF_SHARED to the shared folder)",
            dir.display()
        );
        None
    }
}

/// The oracle suite's Python (the virtual environment `scripts/oracle-venv` makes), when the
/// suite is set up (`SHARDPROOF_ORACLE_DIR`, as `scripts/test` sets it).
pub fn oracle_python() -> Option<PathBuf> {
    std::env::var_os("SHARDPROOF_ORACLE_DIR")?;
    let venv = std::env::var_os("SHARDPROOF_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/shardproof/venv")
        });
    Some(venv.join("bin/python"))
}

/// Runs the Python `script` with `python` on `request` (written to a JSON file whose path is
/// the script's argument) and returns what the script prints, parsed as JSON.
pub fn run_oracle(python: &Path, script: &str, request: &serde_json::Value) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let (req, file) = (dir.path().join("in.json"), dir.path().join("oracle.py"));
    std::fs::write(&req, request.to_string()).unwrap();
    std::fs::write(&file, script).unwrap();
    let run = Command::new(python)
        .arg(&file)
        .arg(&req)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_slice(&run.stdout).unwrap()
}

/// Every output of `graph` run by the reference interpreter on `leaves`, by name.
pub fn graph_outputs(
    graph: &shardproof_ir::Graph,
    leaves: &std::collections::BTreeMap<String, shardproof_ops::Tensor>,
) -> std::collections::BTreeMap<String, shardproof_ops::Tensor> {
    let env = shardproof_interp::run_graph(graph, leaves, &Default::default()).unwrap();
    graph
        .outputs
        .iter()
        .flatten()
        .map(|&v| {
            (
                graph.value_name(v).to_string(),
                env.get(v).expect("computed").clone(),
            )
        })
        .collect()
}
