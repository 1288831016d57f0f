//! How far an engine has come, readable from another thread while it runs: the units of work
//! it has (spec operators for `verify`'s walk, nodes for a run of the interpreter, rank graphs
//! for the static checker), how many are done, and the one in progress. The command line draws
//! it (a spinner, or a line every few seconds in a log) and names the unit a time limit
//! stopped at.
//!
//! ```
//! use shardproof_ir::Progress;
//! let p = Progress::default();
//! p.start(2);
//! p.enter("mm_1");
//! assert_eq!(p.snapshot(), (0, 2, "mm_1".to_string()));
//! p.leave();
//! assert_eq!(p.snapshot().0, 1);
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Counters an engine updates and any thread reads (see the module docs).
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicUsize,
    total: AtomicUsize,
    current: Mutex<String>,
}

impl Progress {
    /// The work begins: `total` units (done goes back to 0).
    pub fn start(&self, total: usize) {
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
    }

    /// Unit `name` is in progress.
    pub fn enter(&self, name: &str) {
        if let Ok(mut c) = self.current.lock() {
            name.clone_into(&mut c);
        }
    }

    /// The unit entered last is done.
    pub fn leave(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// Units done, units in all, and the one in progress (empty before the first).
    pub fn snapshot(&self) -> (usize, usize, String) {
        let current = self.current.lock().map(|c| c.clone()).unwrap_or_default();
        (
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
            current,
        )
    }
}
