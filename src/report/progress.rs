//! Progress display: indicatif bars on a terminal, one plain line per step otherwise.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How [`Progress`] shows itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// indicatif bars on stdout: an overall bar of steps, one bar per running phase, and the
    /// step summaries printed above the bars.
    Bars,
    /// No bars; one plain line per finished step on stdout
    /// (`step 3/100 [00:42] reward 0.41 ...`). Suited to logs and CI.
    Lines,
    /// Nothing at all.
    Hidden,
}

impl ProgressMode {
    /// [`Bars`](Self::Bars) when stdout is a terminal, [`Lines`](Self::Lines) otherwise.
    pub fn detect() -> Self {
        if std::io::stdout().is_terminal() {
            ProgressMode::Bars
        } else {
            ProgressMode::Lines
        }
    }
}

/// The training run's progress display.
///
/// With a terminal on stdout it shows indicatif bars: one for the steps, and one per running
/// phase (`sampling`, `training`, `eval`...) whose message carries live values such as the
/// reward so far. When stdout is not a terminal it prints one plain line per finished step
/// to stdout instead (written directly, not through `tracing`, so the lines appear whether or
/// not a subscriber is installed; [`Progress::lines_to`] sends them elsewhere). Output errors (a closed pipe) are ignored: progress never
/// fails a run.
///
/// ```
/// use rlvr::report::{Progress, ProgressMode};
/// let progress = Progress::with_mode(10, ProgressMode::Hidden);
/// let bar = progress.phase("sampling", 8);
/// bar.inc(8);
/// bar.set_message("reward 0.50".to_string());
/// bar.finish();
/// progress.step_done(0, "reward 0.50");
/// progress.finish();
/// ```
pub struct Progress {
    mode: ProgressMode,
    total_steps: u64,
    multi: MultiProgress,
    steps: ProgressBar,
    started: Instant,
    /// Where [`ProgressMode::Lines`] writes (stdout unless [`Progress::lines_to`]).
    lines: Mutex<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("mode", &self.mode)
            .field("total_steps", &self.total_steps)
            .field("position", &self.steps.position())
            .finish_non_exhaustive()
    }
}

/// One phase's bar, from [`Progress::phase`]. Removed from the display when finished or
/// dropped.
#[derive(Debug)]
pub struct PhaseBar {
    bar: ProgressBar,
}

impl Progress {
    /// A display for `total_steps` steps in the mode of [`ProgressMode::detect`].
    pub fn new(total_steps: u64) -> Self {
        Self::with_mode(total_steps, ProgressMode::detect())
    }

    /// A display for `total_steps` steps in the given mode.
    pub fn with_mode(total_steps: u64, mode: ProgressMode) -> Self {
        let (multi, steps) = match mode {
            ProgressMode::Bars => {
                let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
                let steps = multi.add(ProgressBar::new(total_steps));
                steps.set_style(style(
                    "{prefix:>9.bold} [{elapsed_precise}] {wide_bar:.cyan/blue} {pos}/{len} steps (eta {eta}) {msg}",
                ));
                steps.set_prefix("steps");
                steps.enable_steady_tick(Duration::from_millis(500));
                (multi, steps)
            }
            ProgressMode::Lines | ProgressMode::Hidden => (
                MultiProgress::with_draw_target(ProgressDrawTarget::hidden()),
                ProgressBar::hidden(),
            ),
        };
        Progress {
            mode,
            total_steps,
            multi,
            steps,
            started: Instant::now(),
            lines: Mutex::new(Box::new(std::io::stdout())),
        }
    }

    /// A [`Lines`](ProgressMode::Lines) display that writes its lines to `writer` instead of
    /// stdout (a log file, a buffer in tests).
    pub fn lines_to(total_steps: u64, writer: impl Write + Send + 'static) -> Self {
        let mut progress = Self::with_mode(total_steps, ProgressMode::Lines);
        progress.lines = Mutex::new(Box::new(writer));
        progress
    }

    /// The mode in use.
    pub fn mode(&self) -> ProgressMode {
        self.mode
    }

    /// Sets the step count already done (a resumed run starting at step `n` calls this with `n`).
    pub fn set_start(&self, steps_done: u64) {
        self.steps.set_position(steps_done);
        self.steps.reset_eta();
    }

    /// Starts a bar for a phase of `len` units (samples, datums, problems...). In
    /// [`Lines`](ProgressMode::Lines) and [`Hidden`](ProgressMode::Hidden) modes the bar is
    /// inert.
    pub fn phase(&self, name: &str, len: u64) -> PhaseBar {
        let bar = match self.mode {
            ProgressMode::Bars => {
                let bar = self.multi.add(ProgressBar::new(len));
                bar.set_style(style(
                    "{prefix:>9} [{elapsed_precise}] {bar:30.green/white} {pos}/{len} {msg}",
                ));
                bar.set_prefix(name.to_string());
                bar
            }
            ProgressMode::Lines | ProgressMode::Hidden => ProgressBar::hidden(),
        };
        PhaseBar { bar }
    }

    /// Records that step `step` (0-based, as in `metrics.jsonl`) finished, with a one-line
    /// summary (`"reward 0.41 correct 0.38"`): the step bar moves to `step + 1`, and the line
    /// `step {step+1}/{total} [elapsed] {summary}` is printed (above the bars, or on its own).
    pub fn step_done(&self, step: u64, summary: &str) {
        let line = format!(
            "step {}/{} [{}] {}",
            step + 1,
            self.total_steps,
            fmt_elapsed(self.started.elapsed()),
            summary
        );
        match self.mode {
            ProgressMode::Bars => {
                self.steps.set_position(step + 1);
                self.steps.set_message(summary.to_string());
                let _ = self.multi.println(line);
            }
            ProgressMode::Lines => self.write_line(&line),
            ProgressMode::Hidden => {}
        }
    }

    /// Prints a line without garbling the bars (plain stdout in [`Lines`](ProgressMode::Lines)
    /// mode, nothing when [`Hidden`](ProgressMode::Hidden)).
    pub fn println(&self, line: &str) {
        match self.mode {
            ProgressMode::Bars => {
                let _ = self.multi.println(line);
            }
            ProgressMode::Lines => self.write_line(line),
            ProgressMode::Hidden => {}
        }
    }

    fn write_line(&self, line: &str) {
        // A poisoned lock only means another thread panicked mid-write; keep going.
        let mut out = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    /// Ends the display: the step bar stays on screen with its last summary.
    pub fn finish(&self) {
        self.steps.finish();
    }
}

impl PhaseBar {
    /// Advances the bar by `n` units.
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Sets the live message shown after the bar (`"reward 0.42"`).
    pub fn set_message(&self, msg: String) {
        self.bar.set_message(msg);
    }

    /// Sets the live message from `msg`, called only when the bar is shown: an inert bar
    /// ([`Lines`](ProgressMode::Lines) and [`Hidden`](ProgressMode::Hidden) modes) skips the
    /// formatting, which a message updated once per graded sample would otherwise pay for.
    ///
    /// ```
    /// use rlvr::report::{Progress, ProgressMode};
    /// let progress = Progress::with_mode(1, ProgressMode::Hidden);
    /// let bar = progress.phase("sampling", 1);
    /// bar.set_message_with(|| unreachable!("an inert bar formats nothing"));
    /// ```
    pub fn set_message_with(&self, msg: impl FnOnce() -> String) {
        if !self.bar.is_hidden() {
            self.bar.set_message(msg());
        }
    }

    /// Finishes the phase and removes its bar.
    pub fn finish(self) {
        // Drop does the work.
    }
}

impl Drop for PhaseBar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

fn fmt_elapsed(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{:02}:{:02}", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_format() {
        assert_eq!(fmt_elapsed(Duration::from_secs(42)), "00:42");
        assert_eq!(fmt_elapsed(Duration::from_secs(3725)), "1:02:05");
    }

    #[test]
    fn templates_are_valid() {
        assert!(ProgressStyle::with_template(
            "{prefix:>9.bold} [{elapsed_precise}] {wide_bar:.cyan/blue} {pos}/{len} steps (eta {eta}) {msg}"
        )
        .is_ok());
        assert!(
            ProgressStyle::with_template(
                "{prefix:>9} [{elapsed_precise}] {bar:30.green/white} {pos}/{len} {msg}"
            )
            .is_ok()
        );
    }
}
