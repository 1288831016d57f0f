//! `shardproof capture SCRIPT`: runs a user's capture script (Python, calling
//! `shardproof.capture(...)`) with the output folder in `SHARDPROOF_CAPTURE_OUT`, then checks
//! that it wrote a case and names it, so CI can go on with `shardproof verify DIR/case.yaml`.

use crate::Verdict;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The arguments of `shardproof capture`.
#[derive(clap::Args)]
pub struct CaptureArgs {
    /// The Python script to run; it calls `shardproof.capture(...)` (whose `out` defaults to
    /// the folder given here, through SHARDPROOF_CAPTURE_OUT).
    pub script: PathBuf,
    /// The folder the capture writes into (spec.py, r0.py.., case.yaml).
    #[arg(short, long, default_value = "capture")]
    pub out: PathBuf,
    /// The Python interpreter (default: SHARDPROOF_PYTHON, else python3).
    #[arg(long, value_name = "PYTHON")]
    pub python: Option<PathBuf>,
    /// Arguments passed on to the script.
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// Runs the script; holds when it exits 0 and left `case.yaml` files under `--out`.
pub fn main(args: &CaptureArgs) -> Verdict {
    if !args.script.is_file() {
        errln!(
            "error: capture script `{}` not found\n  hint: give the path of a Python file that calls shardproof.capture(...)",
            args.script.display()
        );
        return Verdict::Invalid;
    }
    let python = args
        .python
        .clone()
        .or_else(|| std::env::var_os("SHARDPROOF_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("python3"));
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        errln!(
            "error: cannot create the output folder `{}`: {e}\n  hint: give --out a writable path",
            args.out.display()
        );
        return Verdict::Invalid;
    }
    let status = Command::new(&python)
        .arg(&args.script)
        .args(&args.args)
        .env("SHARDPROOF_CAPTURE_OUT", &args.out)
        .status();
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            errln!(
                "error: cannot run `{}`: {e}\n  hint: pass --python or set SHARDPROOF_PYTHON to an interpreter with torch and shardproof installed",
                python.display()
            );
            return Verdict::Invalid;
        }
    };
    if !status.success() {
        errln!(
            "error: the capture script `{}` failed ({status})\n  hint: its own error is printed above; SHARDPROOF_CAPTURE_DEBUG=1 adds the capture processes' tracebacks",
            args.script.display()
        );
        return Verdict::Invalid;
    }
    let cases = find_cases(&args.out);
    if cases.is_empty() {
        errln!(
            "error: `{}` wrote no case.yaml under `{}`\n  hint: call shardproof.capture(...) without `out` (it then writes into SHARDPROOF_CAPTURE_OUT) or with a folder under it",
            args.script.display(),
            args.out.display()
        );
        return Verdict::Invalid;
    }
    for case in cases {
        outln!("{}", case.display());
    }
    Verdict::Holds
}

/// Every `case.yaml` under `dir` (the folder itself and below), sorted.
fn find_cases(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "case.yaml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_found_below_the_folder_in_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("b")).unwrap();
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("b/case.yaml"), "").unwrap();
        std::fs::write(dir.path().join("a/case.yaml"), "").unwrap();
        std::fs::write(dir.path().join("a/other.yaml"), "").unwrap();
        let found = find_cases(dir.path());
        assert_eq!(
            found,
            vec![
                dir.path().join("a/case.yaml"),
                dir.path().join("b/case.yaml")
            ]
        );
    }
}
