//! How far a [`verify`](crate::verify) has come, readable from another thread while it runs:
//! the spec operators the checked outputs need, how many of them are done, and the one being
//! inferred. The command line draws it (a spinner, or a line every few seconds in a log) and
//! names the operator a time limit stopped at.
//!
//! ```
//! use shardproof_refine::Progress;
//! let p = Progress::default();
//! p.start(2);
//! p.enter("mm_1");
//! assert_eq!(p.snapshot(), (0, 2, "mm_1".to_string()));
//! p.leave();
//! assert_eq!(p.snapshot().0, 1);
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Counters a walk updates and any thread reads (see the module docs).
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicUsize,
    total: AtomicUsize,
    current: Mutex<String>,
}

impl Progress {
    /// The walk begins: `total` spec operators to infer.
    pub fn start(&self, total: usize) {
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
    }

    /// Spec operator `name` is being inferred.
    pub fn enter(&self, name: &str) {
        if let Ok(mut c) = self.current.lock() {
            name.clone_into(&mut c);
        }
    }

    /// The operator entered last is done.
    pub fn leave(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// Operators done, operators in all, and the one being inferred (empty before the first).
    pub fn snapshot(&self) -> (usize, usize, String) {
        let current = self.current.lock().map(|c| c.clone()).unwrap_or_default();
        (
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
            current,
        )
    }
}
