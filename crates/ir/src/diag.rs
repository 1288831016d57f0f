//! Located, user-facing errors: every error about user input names a file, a line and a column,
//! what was expected, and a hint.

use std::fmt;
use std::path::{Path, PathBuf};

/// A position in a text file (1-based line and column).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    /// 1-based line number.
    pub line: usize,
    /// 1-based column number.
    pub col: usize,
}

impl Span {
    /// A span at `line`, `col` (both 1-based).
    pub fn new(line: usize, col: usize) -> Self {
        Span { line, col }
    }
}

/// An error in user input with its location, the problem, and an optional hint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    /// The file the error is in.
    pub file: PathBuf,
    /// Where in the file; `None` when the error concerns the whole file (e.g. it cannot be read).
    pub span: Option<Span>,
    /// What is wrong, including what was expected.
    pub message: String,
    /// How to fix it, when we can tell.
    pub hint: Option<String>,
}

impl SourceError {
    /// An error at `span` in `file`.
    pub fn new(file: impl AsRef<Path>, span: Option<Span>, message: impl Into<String>) -> Self {
        SourceError {
            file: file.as_ref().to_path_buf(),
            span,
            message: message.into(),
            hint: None,
        }
    }

    /// Adds a hint to the error.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.span {
            Some(s) => write!(
                f,
                "{}:{}:{}: {}",
                self.file.display(),
                s.line,
                s.col,
                self.message
            )?,
            None => write!(f, "{}: {}", self.file.display(), self.message)?,
        }
        if let Some(h) = &self.hint {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SourceError {}

/// A value together with the place in the input it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Located<T> {
    /// The value.
    pub value: T,
    /// Where it was written.
    pub span: Span,
}
