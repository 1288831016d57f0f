//! Long work on its own thread, watched from the main one: how far it has come is drawn (a
//! spinner on a terminal, a line every few seconds in a log, nothing under `--quiet` or a
//! machine-readable format), and an optional time limit ends the wait with the unit of work it
//! stopped at. Every engine command (`run`, `verify`, `check`, `inspect`) watches its work the
//! same way, so their progress lines and time-limit messages read alike.

use shardproof_ir::Progress;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a log (stderr not a terminal) gets a progress line; `SHARDPROOF_PROGRESS_SECONDS`
/// sets another interval.
const LOG_EVERY_SECONDS: f64 = 5.0;

/// How often the watcher looks at the counters.
const TICK: Duration = Duration::from_millis(200);

/// Where progress is shown.
pub enum Display<'a> {
    /// A spinner on a terminal, its message prefixed by the text given.
    Spinner(&'a indicatif::ProgressBar, String),
    /// A line on stderr every `every` seconds, prefixed by `prefix` (e.g. `verify llama-tp2: `).
    Log {
        /// Seconds between lines.
        every: f64,
        /// What each line begins with.
        prefix: String,
    },
    /// Nowhere (`--quiet`, `--json` and the other machine-readable formats).
    Nowhere,
}

impl<'a> Display<'a> {
    /// The display for a command: the spinner when one is drawn, else log lines unless
    /// `silent`. `prefix` begins each log line and the spinner's message.
    pub fn new(
        spinner: Option<&'a indicatif::ProgressBar>,
        silent: bool,
        prefix: String,
    ) -> Display<'a> {
        match spinner {
            Some(s) => Display::Spinner(s, prefix),
            None if silent => Display::Nowhere,
            None => Display::Log {
                every: std::env::var("SHARDPROOF_PROGRESS_SECONDS")
                    .ok()
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .unwrap_or(LOG_EVERY_SECONDS),
                prefix,
            },
        }
    }
}

/// A spinner on stderr when `wanted` and stderr is a terminal (a log gets lines instead).
pub fn spinner(wanted: bool) -> Option<indicatif::ProgressBar> {
    (wanted && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.enable_steady_tick(Duration::from_millis(120));
        s
    })
}

/// How a command shows and bounds its work (see [`watch_shown`]).
pub struct Shown {
    /// Whether progress is drawn at all: not under `--quiet` nor a machine-readable format.
    pub visible: bool,
    /// What each line (and the spinner's message) begins with, e.g. `run llama-tp2: `.
    pub prefix: String,
    /// The units counted, in the plural (`nodes`, `tensors`).
    pub units: &'static str,
    /// What the work does before its first unit.
    pub preparing: &'static str,
    /// Seconds before the wait ends; 0 for none.
    pub limit: f64,
}

/// [`watch`] with a command's display: a spinner on a terminal, a line every few seconds in a
/// log, nothing when not [`Shown::visible`]; the spinner is cleared when the work ends.
pub fn watch_shown<T, F>(work: F, progress: Arc<Progress>, shown: Shown) -> Watched<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let bar = spinner(shown.visible);
    let display = Display::new(bar.as_ref(), !shown.visible, shown.prefix);
    let watched = watch(
        work,
        Watch {
            progress,
            units: shown.units,
            limit: shown.limit,
            display,
            preparing: shown.preparing,
        },
    );
    if let Some(s) = bar {
        s.finish_and_clear();
    }
    watched
}

/// Where a time limit stopped the work.
#[derive(Clone, Debug)]
pub struct Stopped {
    /// The limit, in seconds.
    pub limit: f64,
    /// Units done.
    pub done: usize,
    /// Units in all (0 while the work was still preparing).
    pub total: usize,
    /// The unit in progress (empty before the first).
    pub current: String,
    /// What the work does before its first unit (see [`Watch::preparing`]).
    pub preparing: &'static str,
}

impl Stopped {
    /// Where it stopped, e.g. "it stopped at spec operator `mm_3`, 12 of 845 done", with the
    /// unit named in the singular (`spec operator`, `node`).
    pub fn at(&self, unit: &str) -> String {
        if self.current.is_empty() {
            format!(
                "it stopped before the first {unit} (while {})",
                self.preparing
            )
        } else {
            format!(
                "it stopped at {unit} `{}`, {} of {} done",
                self.current, self.done, self.total
            )
        }
    }
}

/// What watching the work gave.
pub enum Watched<T> {
    /// The work's result.
    Done(T),
    /// The time limit came first; the work's thread is abandoned (the process exits after the
    /// report).
    TimedOut(Stopped),
    /// The work's thread ended without a result (it panicked).
    Lost,
}

/// What the watcher needs besides the work.
pub struct Watch<'a> {
    /// Counters the work updates.
    pub progress: Arc<Progress>,
    /// The units counted, in the plural, for the progress line (`spec operators`, `nodes`).
    pub units: &'static str,
    /// Seconds before the wait ends; 0 for none.
    pub limit: f64,
    /// Where progress is shown.
    pub display: Display<'a>,
    /// What the work does before its first unit, e.g. `preparing the programs`.
    pub preparing: &'static str,
}

/// Units done of all, the current one, the time so far and an estimate of the time left, e.g.
/// `12/845 spec operators, at `mm_3`, 4 s, about 270 s left`.
pub fn progress_line(progress: &Progress, units: &str, preparing: &str, elapsed: f64) -> String {
    let (done, total, current) = progress.snapshot();
    if total == 0 {
        return format!("{preparing}, {elapsed:.0} s");
    }
    let at = if current.is_empty() {
        String::new()
    } else {
        format!(", at `{current}`")
    };
    // A linear estimate, once there is something to extrapolate from: units differ in cost,
    // so it is a guide, and it says "about".
    let left = if done > 0 && done < total && elapsed >= 1.0 {
        let rest = elapsed * (total - done) as f64 / done as f64;
        format!(", about {rest:.0} s left")
    } else {
        String::new()
    };
    format!("{done}/{total} {units}{at}, {elapsed:.0} s{left}")
}

/// Runs `work` on its own thread (with the main thread's stack room: engines recurse over
/// terms) and waits for it, showing progress and stopping at the limit (see [`Watch`]). When
/// no thread can be started, the work runs here, without progress or a limit, and says so.
pub fn watch<T, F>(work: F, watch: Watch) -> Watched<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    // The work moves into the thread only if the thread starts; kept here otherwise.
    let slot = Arc::new(std::sync::Mutex::new(Some(work)));
    let in_thread = slot.clone();
    let spawned = std::thread::Builder::new()
        .name("engine".into())
        .stack_size(64 << 20)
        .spawn(move || {
            let taken = in_thread.lock().ok().and_then(|mut w| w.take());
            if let Some(work) = taken {
                let _ = tx.send(work());
            }
        });
    if spawned.is_err() {
        errln!("warning: could not start a thread for the work; running without progress or a time limit");
        let taken = slot.lock().ok().and_then(|mut w| w.take());
        return match taken {
            Some(work) => Watched::Done(work()),
            None => Watched::Lost,
        };
    }
    let started = Instant::now();
    let mut last_line = 0.0;
    loop {
        // Wake at the limit itself, not at the next tick past it.
        let wait = if watch.limit > 0.0 {
            let left = (watch.limit - started.elapsed().as_secs_f64()).max(0.0);
            TICK.min(Duration::from_secs_f64(left))
        } else {
            TICK
        };
        match rx.recv_timeout(wait) {
            Ok(result) => return Watched::Done(result),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Watched::Lost,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        let elapsed = started.elapsed().as_secs_f64();
        if watch.limit > 0.0 && elapsed >= watch.limit {
            let (done, total, current) = watch.progress.snapshot();
            return Watched::TimedOut(Stopped {
                limit: watch.limit,
                done,
                total,
                current,
                preparing: watch.preparing,
            });
        }
        match &watch.display {
            Display::Spinner(s, prefix) => s.set_message(format!(
                "{prefix}{}",
                progress_line(&watch.progress, watch.units, watch.preparing, elapsed)
            )),
            Display::Log { every, prefix } if elapsed - last_line >= *every => {
                last_line = elapsed;
                errln!(
                    "{prefix}{}",
                    progress_line(&watch.progress, watch.units, watch.preparing, elapsed)
                );
            }
            _ => {}
        }
    }
}

/// Parses a `--time-limit` value: seconds, non-negative and finite (0 for none).
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "expected a number of seconds, 0 or more (e.g. 30 or 2.5), found `{s}`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_estimates_the_time_left_once_work_is_done() {
        let p = Progress::default();
        assert_eq!(
            progress_line(&p, "nodes", "preparing the programs", 2.0),
            "preparing the programs, 2 s"
        );
        p.start(4);
        p.enter("mm_1");
        p.leave();
        assert_eq!(
            progress_line(&p, "nodes", "preparing the programs", 3.0),
            "1/4 nodes, at `mm_1`, 3 s, about 9 s left"
        );
    }

    #[test]
    fn a_limit_stops_the_wait_and_names_the_unit() {
        let progress = Arc::new(Progress::default());
        let counted = progress.clone();
        let w = watch(
            move || {
                counted.start(3);
                counted.enter("slow_op");
                std::thread::sleep(Duration::from_secs(5));
            },
            Watch {
                progress,
                units: "nodes",
                limit: 0.3,
                display: Display::Nowhere,
                preparing: "preparing the programs",
            },
        );
        match w {
            Watched::TimedOut(s) => {
                assert_eq!(s.at("node"), "it stopped at node `slow_op`, 0 of 3 done")
            }
            _ => panic!("the limit did not stop the wait"),
        }
    }

    #[test]
    fn a_result_comes_back_and_a_panic_is_lost() {
        let w = watch(
            || 7,
            Watch {
                progress: Arc::default(),
                units: "nodes",
                limit: 0.0,
                display: Display::Nowhere,
                preparing: "preparing the programs",
            },
        );
        assert!(matches!(w, Watched::Done(7)));
        let w: Watched<()> = watch(
            || panic!("engine bug"),
            Watch {
                progress: Arc::default(),
                units: "nodes",
                limit: 0.0,
                display: Display::Nowhere,
                preparing: "preparing the programs",
            },
        );
        assert!(matches!(w, Watched::Lost));
    }
}
