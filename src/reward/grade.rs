//! Running a reward function with a real timeout (on the global [`GraderPool`]), and counting
//! how grading went.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::dataset::Problem;
use crate::reward::{GraderPool, Response, Reward, RewardError, RewardFn};

/// Grades `response` with `reward`, giving up after `timeout`, on the process-wide
/// [`GraderPool::global`].
///
/// The reward runs on a thread of that bounded pool (driving its future with
/// [`Handle::block_on`](tokio::runtime::Handle::block_on) on the caller's runtime), so a
/// reward that blocks — a synchronous closure that sleeps or loops forever, a slow regex, a
/// blocking HTTP call — can never stall the async runtime, and the caller really stops
/// waiting when the timeout expires:
///
/// - finished in time → its result (`Err(RewardError::Failed)` when the reward reported one);
/// - not finished → `Err(RewardError::Timeout(timeout))`;
/// - panicked → `Err(RewardError::Panicked(message))`.
///
/// A timed-out reward keeps running on its thread until it returns by itself (threads cannot
/// be killed safely); its result is discarded, and the thread rejoins the pool then. The
/// pool's threads are not the runtime's, so unlike
/// [`spawn_blocking`](tokio::task::spawn_blocking) (whose tasks a runtime waits for when it
/// shuts down) a hung grader neither delays runtime shutdown nor occupies the blocking pool.
/// The cookbook's `safe_grade`, by contrast, scores a hung grade as a failure but still waits
/// for it.
///
/// Since the pool is bounded ([`GraderPool::default_threads`] threads), hung rewards cannot
/// pile up threads: once every thread is hung, a grade waits for one to come back, and gives
/// up as `Err(RewardError::Timeout(timeout))` when none became free during a whole `timeout`
/// (before this pool, every call started its own thread and a timed-out one leaked). The
/// global pool has no hang limit; to stop after a number of hangs in a row, grade on your own
/// [`GraderPool`] (the trainer does).
///
/// Must be called from within a Tokio runtime; otherwise it returns `RewardError::Failed`.
/// On a current-thread runtime, timers and I/O inside an async reward are driven by the
/// thread that runs the runtime, which is busy awaiting this call — so they work.
///
/// Under Tokio's paused test clock (`start_paused = true`), the runtime looks idle while the
/// grading thread works, so the clock jumps ahead and every grade times out: test code that
/// pauses time should grade with [`RewardFn::grade`] directly.
///
/// Timeouts and panics are also logged (`tracing` warnings with the problem id), as the
/// cookbook does.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::{sync::Arc, time::Duration};
/// use rlvr::reward::{grade_with_timeout, Response, RewardError};
/// use rlvr::{dataset::Problem, renderer::ParseTermination};
///
/// let slow = |_: &Problem, _: &str| -> f64 {
///     std::thread::sleep(Duration::from_secs(2));
///     1.0
/// };
/// let problem = Arc::new(Problem::new("p0", "What is 2+2?", "4"));
/// let response = Response { text: "4".into(), termination: ParseTermination::StopSequence, tokens: vec![] };
/// let result = grade_with_timeout(Arc::new(slow), problem, response, Duration::from_millis(20)).await;
/// assert!(matches!(result, Err(RewardError::Timeout(_))));
/// # }
/// ```
pub async fn grade_with_timeout<R>(
    reward: Arc<R>,
    problem: Arc<Problem>,
    response: Response,
    timeout: Duration,
) -> Result<Reward, RewardError>
where
    R: RewardFn + ?Sized,
{
    // The global pool has no hang limit, so there is no fatal error to pass on; should one
    // come anyway, it is at least a counted failure.
    GraderPool::global()
        .grade(reward, problem, response, timeout)
        .await
        .unwrap_or_else(|e| Err(RewardError::Failed(e.to_string())))
}

/// The message of a panic payload (`panic!("...")` gives a `&str` or a `String`).
pub(super) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Counts of grading outcomes, for metrics (a failed grade scores 0 and never stops
/// training).
///
/// ```
/// use rlvr::reward::{GradeStats, Reward, RewardError};
/// let mut stats = GradeStats::default();
/// stats.record(&Ok(Reward::new(1.0)));
/// stats.record(&Err(RewardError::Timeout(std::time::Duration::from_secs(1))));
/// assert_eq!((stats.ok, stats.timed_out, stats.errors(), stats.total()), (1, 1, 1, 2));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GradeStats {
    /// Grades that produced a reward.
    pub ok: u64,
    /// Grades whose reward function returned [`RewardError::Failed`].
    pub failed: u64,
    /// Grades that hit the timeout.
    pub timed_out: u64,
    /// Grades whose reward function panicked.
    pub panicked: u64,
}

impl GradeStats {
    /// Counts one outcome.
    pub fn record(&mut self, result: &Result<Reward, RewardError>) {
        match result {
            Ok(_) => self.ok += 1,
            Err(RewardError::Failed(_)) => self.failed += 1,
            Err(RewardError::Timeout(_)) => self.timed_out += 1,
            Err(RewardError::Panicked(_)) => self.panicked += 1,
        }
    }

    /// Adds another set of counts.
    pub fn merge(&mut self, other: &GradeStats) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.timed_out += other.timed_out;
        self.panicked += other.panicked;
    }

    /// All grades counted.
    pub fn total(&self) -> u64 {
        self.ok + self.errors()
    }

    /// Grades that produced no reward (failed, timed out or panicked).
    pub fn errors(&self) -> u64 {
        self.failed + self.timed_out + self.panicked
    }

    /// The fraction of grades that produced no reward (0 when nothing was counted).
    pub fn error_rate(&self) -> f64 {
        match self.total() {
            0 => 0.0,
            n => self.errors() as f64 / n as f64,
        }
    }
}
