//! The error of a trace that cannot be read: which file, where in it (a JSON path such as
//! `$.tensors[3].pieces[0].full[2]`, a `line:col` of a syntax error, or a tensor key), what was
//! expected and a hint. Every malformed input ends here, never in a panic.

use std::fmt;
use std::path::{Path, PathBuf};

/// A trace that cannot be read or does not follow the format (exit 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    /// The file (or directory) at fault.
    pub file: PathBuf,
    /// Where in the file: a JSON path (`$.tensors[3].key`), `line:col`, or `tensor KEY`.
    pub at: Option<String>,
    /// What is wrong, with what was expected.
    pub message: String,
    /// How to fix it.
    pub hint: Option<String>,
}

impl TraceError {
    /// An error in `file` at `at`.
    pub fn new(file: &Path, at: Option<String>, message: impl Into<String>) -> TraceError {
        TraceError {
            file: file.to_path_buf(),
            at,
            message: message.into(),
            hint: None,
        }
    }

    /// The same error with a hint.
    pub fn with_hint(mut self, hint: impl Into<String>) -> TraceError {
        self.hint = Some(hint.into());
        self
    }

    /// An I/O error reading `file`.
    pub fn io(file: &Path, e: &std::io::Error) -> TraceError {
        TraceError::new(file, None, format!("cannot read: {e}"))
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        match &self.at {
            // A `line:col` joins the file name as editors expect (`trace.json:3:14`).
            Some(at) if at.starts_with(|c: char| c.is_ascii_digit()) => write!(f, ":{at}")?,
            Some(at) => write!(f, ": at {at}")?,
            None => {}
        }
        write!(f, ": {}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for TraceError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_and_the_place() {
        let e = TraceError::new(
            Path::new("t/trace.json"),
            Some("$.version".into()),
            "expected 1",
        )
        .with_hint("upgrade");
        assert_eq!(
            e.to_string(),
            "t/trace.json: at $.version: expected 1\n  hint: upgrade"
        );
        let e = TraceError::new(Path::new("t/trace.json"), Some("3:14".into()), "bad");
        assert_eq!(e.to_string(), "t/trace.json:3:14: bad");
    }
}
