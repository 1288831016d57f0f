//! `shardproof._core`: the shardproof command line as a Python extension.
//!
//! One function, `main(argv) -> (exit_code, stdout, stderr)`, runs a command of the `shardproof`
//! binary in-process (`shardproof_cli::main_with_args`), so the Python API and the CLI are the
//! same code. The commands print their reports on the process's stdout and stderr; the call
//! points both file descriptors at temporary files while it runs and hands back what was
//! written, so Python gets the JSON report without a subprocess.
#![warn(missing_docs)]

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::sync::Mutex;

/// One capture at a time: the file descriptors are process-wide.
static CAPTURING: Mutex<()> = Mutex::new(());

/// A file descriptor (1 or 2) pointed at a temporary file until [`Redirect::finish`].
struct Redirect {
    fd: i32,
    saved: i32,
    file: File,
}

impl Redirect {
    fn new(fd: i32) -> std::io::Result<Redirect> {
        let file = tempfile::tempfile()?;
        // SAFETY: dup/dup2 on descriptors this process owns; failures are checked.
        let saved = unsafe { libc::dup(fd) };
        if saved < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if unsafe { libc::dup2(file.as_raw_fd(), fd) } < 0 {
            let err = std::io::Error::last_os_error();
            unsafe { libc::close(saved) };
            return Err(err);
        }
        Ok(Redirect { fd, saved, file })
    }

    /// Restores the descriptor and returns what was written to it.
    fn finish(mut self) -> std::io::Result<String> {
        // SAFETY: `saved` is the duplicate made in `new`, closed exactly once here.
        unsafe {
            libc::dup2(self.saved, self.fd);
            libc::close(self.saved);
        }
        let mut bytes = Vec::new();
        self.file.seek(SeekFrom::Start(0))?;
        self.file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Runs `argv` (argv[0] is the program name) and returns the exit code with everything the
/// command wrote on stdout and on stderr.
pub fn run_captured(argv: Vec<String>) -> std::io::Result<(u8, String, String)> {
    let _one = CAPTURING.lock().unwrap_or_else(|e| e.into_inner());
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let out = Redirect::new(1)?;
    let err = match Redirect::new(2) {
        Ok(e) => e,
        Err(e) => {
            let _ = out.finish();
            return Err(e);
        }
    };
    let code = std::panic::catch_unwind(|| shardproof_cli::main_with_args(argv));
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let stderr = err.finish()?;
    let stdout = out.finish()?;
    match code {
        Ok(code) => Ok((code, stdout, stderr)),
        Err(_) => Err(std::io::Error::other(format!(
            "shardproof panicked (a bug; please report it with the case):\n{stderr}"
        ))),
    }
}

/// `main(argv) -> (exit_code, stdout, stderr)`: one `shardproof` command line, in-process.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> PyResult<(u8, String, String)> {
    // The engines take seconds to minutes: let other Python threads run meanwhile.
    py.detach(|| run_captured(argv))
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// The extension module `shardproof._core`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_runs_in_process_with_its_output_captured() {
        let (code, out, err) = run_captured(vec!["shardproof".into(), "--version".into()]).unwrap();
        assert_eq!(code, 0, "stderr: {err}");
        assert!(out.starts_with("shardproof "), "stdout: {out:?}");
        let (code, _, err) = run_captured(vec![
            "shardproof".into(),
            "verify".into(),
            "/no/such/case.yaml".into(),
        ])
        .unwrap();
        assert_eq!(code, 2);
        assert!(err.contains("case.yaml"), "stderr: {err}");
    }
}
