//! A bounded pool of grading threads: a reward that hangs costs at most its timeout, also the
//! hundredth time, and never more threads than the pool's bound.

use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::{mpsc, Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::dataset::Problem;
use crate::error::{Error, Result};
use crate::reward::{Response, Reward, RewardError, RewardFn};

use super::grade::panic_message;

/// The most threads a [`GraderPool`] may have (larger requests are clamped to it).
pub const MAX_GRADER_THREADS: usize = 4096;

/// The default of [`GraderPool::max_consecutive_hangs`] for a pool made with
/// [`GraderPool::default`], and of the trainer's `max_consecutive_reward_hangs`.
///
/// 16 timeouts in a row is far beyond what a healthy reward produces (one slow grade among
/// working ones resets the count), yet small enough that a reward that is stuck for good
/// stops a run after about one timeout's worth of grades instead of scoring every later
/// batch 0.
pub const DEFAULT_MAX_CONSECUTIVE_HANGS: usize = 16;

/// What a grade produces: a reward, or why there is none.
type Outcome = std::result::Result<Reward, RewardError>;

/// One grade handed to a thread of the pool.
struct Job {
    /// Runs the reward (on the caller's runtime).
    work: Box<dyn FnOnce() -> Outcome + Send>,
    /// Where the outcome goes; closed when the caller stopped waiting.
    reply: oneshot::Sender<Outcome>,
    /// The thread's own queue, put back into the idle list when the job is over. While the
    /// thread is idle the list holds the only sender, so dropping the pool ends the thread.
    home: mpsc::Sender<Job>,
    /// One of the pool's `threads` slots, held until the reward returns (hung or not).
    slot: OwnedSemaphorePermit,
}

/// The pool's bookkeeping, behind one lock.
struct State {
    /// Threads waiting for work (the sender of each one's queue).
    idle: Vec<mpsc::Sender<Job>>,
    /// Threads started (none ever ends while the pool lives).
    spawned: usize,
    /// Threads still running a reward whose caller stopped waiting for it.
    hung: usize,
    /// Grades in a row that timed out (reset by any grade that finished in time).
    consecutive_hangs: usize,
    /// When a thread last became free (pool creation at first).
    last_free: Instant,
}

/// What the pool's threads share with it.
struct Shared {
    state: Mutex<State>,
    /// One permit per thread the pool may have: a grade takes one to run, and its thread
    /// gives it back when the reward returns, so hung threads keep theirs.
    slots: Arc<Semaphore>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A bounded pool of OS threads that run reward functions under a timeout.
///
/// The rule, for every grade ([`grade`](Self::grade)):
///
/// - **At most [`threads`](Self::threads) OS threads ever exist**, hung ones included. They
///   are started lazily (the first grades start them) and reused.
/// - A grade first **waits (asynchronously) for a free thread**. It gives up, as a
///   [`RewardError::Timeout`], when no thread of the pool became free during a whole
///   timeout: then every thread is busy with a reward that is not finishing (hung), and
///   waiting longer would be unbounded. While threads keep freeing up (slow but honest
///   rewards), a waiting grade waits its turn: queueing is not a timeout.
/// - **Its timeout runs from when it starts on a thread.** A reward that does not return in
///   time is abandoned: the caller gets [`RewardError::Timeout`] at once, the thread stays
///   *hung* (not reusable) until the reward returns by itself (threads cannot be killed),
///   then rejoins the pool. Its late result is discarded.
/// - **Consecutive hangs are counted**: every grade that times out (while running or while
///   waiting for a thread) adds one, every grade that finishes in time (a reward, a failure
///   or a panic) resets the count. When the count reaches
///   [`max_consecutive_hangs`](Self::max_consecutive_hangs) (0: never), the grade returns
///   the fatal [`Error::RewardHung`] instead of a counted timeout, and so does every further
///   timeout until a grade finishes in time.
/// - A panicking reward gives [`RewardError::Panicked`] (its thread is reused), a failing
///   one its own [`RewardError::Failed`].
///
/// A reward runs on a pool thread by driving its future with
/// [`Handle::block_on`](tokio::runtime::Handle::block_on) on the caller's runtime, so a
/// reward that blocks (a synchronous closure that sleeps or loops, a slow regex, a blocking
/// HTTP call) never stalls the async runtime. The threads are not the runtime's, so a hung
/// reward never delays the runtime's shutdown; dropping the pool ends its idle threads, and
/// a hung one ends when its reward returns.
///
/// The [`GrpoTrainer`](crate::trainer::GrpoTrainer) makes one pool per run from its
/// `grader_threads` and `max_consecutive_reward_hangs` settings;
/// [`grade_with_timeout`](super::grade_with_timeout) uses the process-wide
/// [`GraderPool::global`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> rlvr::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use rlvr::reward::{GraderPool, Response, RewardError};
/// use rlvr::{Error, ParseTermination, Problem};
///
/// // Two threads; the second hang in a row is fatal.
/// let pool = GraderPool::new(2, 2);
/// let stuck = Arc::new(|_: &Problem, _: &str| -> f64 {
///     std::thread::sleep(Duration::from_millis(300));
///     1.0
/// });
/// let problem = Arc::new(Problem::new("p0", "What is 2+2?", "4"));
/// let response = Response { text: "4".into(), termination: ParseTermination::StopSequence, tokens: vec![] };
/// let timeout = Duration::from_millis(20);
///
/// let first = pool.grade(stuck.clone(), problem.clone(), response.clone(), timeout).await?;
/// assert_eq!(first, Err(RewardError::Timeout(timeout)));
/// assert_eq!((pool.alive_threads(), pool.hung_threads()), (1, 1));
/// let second = pool.grade(stuck, problem.clone(), response.clone(), timeout).await;
/// assert!(matches!(second, Err(Error::RewardHung { consecutive: 2, .. })));
///
/// // Any grade that finishes in time resets the count.
/// let exact = Arc::new(|p: &Problem, text: &str| if text == p.answer { 1.0 } else { 0.0 });
/// // Both threads are hung for a moment: this grade waits for one to come back.
/// let graded = pool.grade(exact, problem, response, Duration::from_secs(5)).await?;
/// assert_eq!(graded.map(|r| r.total), Ok(1.0));
/// assert_eq!((pool.consecutive_hangs(), pool.alive_threads()), (0, 2));
/// # Ok(()) }
/// ```
pub struct GraderPool {
    shared: Arc<Shared>,
    threads: usize,
    max_consecutive_hangs: usize,
}

impl std::fmt::Debug for GraderPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("GraderPool")
            .field("threads", &self.threads)
            .field("max_consecutive_hangs", &self.max_consecutive_hangs)
            .field("alive", &st.spawned)
            .field("idle", &st.idle.len())
            .field("hung", &st.hung)
            .field("consecutive_hangs", &st.consecutive_hangs)
            .finish()
    }
}

impl Default for GraderPool {
    /// [`default_threads`](Self::default_threads) threads, stopping after
    /// [`DEFAULT_MAX_CONSECUTIVE_HANGS`] hangs in a row.
    fn default() -> Self {
        GraderPool::new(0, DEFAULT_MAX_CONSECUTIVE_HANGS)
    }
}

impl GraderPool {
    /// A pool of at most `threads` threads (0: [`default_threads`](Self::default_threads);
    /// more than [`MAX_GRADER_THREADS`] is clamped to it) whose grades fail with
    /// [`Error::RewardHung`] once `max_consecutive_hangs` of them in a row timed out (0: never;
    /// every timeout is then a counted [`RewardError::Timeout`]). No thread is started until
    /// the first grade.
    ///
    /// ```
    /// use rlvr::reward::GraderPool;
    /// let pool = GraderPool::new(8, 16);
    /// assert_eq!((pool.threads(), pool.max_consecutive_hangs(), pool.alive_threads()), (8, 16, 0));
    /// assert_eq!(GraderPool::new(0, 0).threads(), GraderPool::default_threads());
    /// ```
    pub fn new(threads: usize, max_consecutive_hangs: usize) -> Self {
        let threads = match threads {
            0 => Self::default_threads(),
            n => n.min(MAX_GRADER_THREADS),
        };
        GraderPool {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    idle: Vec::new(),
                    spawned: 0,
                    hung: 0,
                    consecutive_hangs: 0,
                    last_free: Instant::now(),
                }),
                slots: Arc::new(Semaphore::new(threads)),
            }),
            threads,
            max_consecutive_hangs,
        }
    }

    /// The thread count used for `threads = 0`: `max(64, 2 × available_parallelism)`.
    ///
    /// Rewards are mostly cheap CPU work (a regex, a comparison) or waiting on I/O (a judge
    /// model behind HTTP, which holds its thread while it waits). 64 threads let half of a
    /// tutorial batch (16 problems × 8 samples) wait on I/O at once and keep CPU-bound rewards
    /// busy on any machine up to 32 cores; an idle thread costs only its stack's address
    /// space. The bound is what matters: rewards that hang for good can hold at most this
    /// many threads.
    ///
    /// ```
    /// assert!(rlvr::reward::GraderPool::default_threads() >= 64);
    /// ```
    pub fn default_threads() -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        cores.saturating_mul(2).clamp(64, MAX_GRADER_THREADS)
    }

    /// The process-wide pool behind [`grade_with_timeout`](super::grade_with_timeout) and the
    /// environments made without an explicit pool ([`ProblemEnv::new`],
    /// [`ProblemEnvBuilder::new`]): [`default_threads`](Self::default_threads) threads and
    /// no hang limit (those callers have no fatal error to return), so a reward that hangs
    /// on every call costs each grade its timeout, never another thread.
    ///
    /// [`ProblemEnv::new`]: crate::trainer::ProblemEnv::new
    /// [`ProblemEnvBuilder::new`]: crate::trainer::ProblemEnvBuilder::new
    ///
    /// ```
    /// use rlvr::reward::GraderPool;
    /// let pool = GraderPool::global();
    /// assert!(std::sync::Arc::ptr_eq(&pool, &GraderPool::global()));
    /// assert_eq!(pool.max_consecutive_hangs(), 0);
    /// ```
    pub fn global() -> Arc<GraderPool> {
        static GLOBAL: OnceLock<Arc<GraderPool>> = OnceLock::new();
        Arc::clone(GLOBAL.get_or_init(|| Arc::new(GraderPool::new(0, 0))))
    }

    /// The most threads this pool ever has.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Timeouts in a row that make a grade fail with [`Error::RewardHung`] (0: never).
    pub fn max_consecutive_hangs(&self) -> usize {
        self.max_consecutive_hangs
    }

    /// Threads started so far (at most [`threads`](Self::threads)).
    pub fn alive_threads(&self) -> usize {
        self.shared.lock().spawned
    }

    /// Threads still running a reward whose grade timed out (they rejoin the pool when the
    /// reward returns).
    pub fn hung_threads(&self) -> usize {
        self.shared.lock().hung
    }

    /// Grades in a row that timed out, up to now.
    pub fn consecutive_hangs(&self) -> usize {
        self.shared.lock().consecutive_hangs
    }

    /// Grades `response` to `problem` with `reward` on a thread of the pool, giving up after
    /// `timeout` (see the [rule](Self)).
    ///
    /// The inner result is the grade, counted by the trainer when it is an error: the reward,
    /// `Err(RewardError::Failed)` when the reward reported a failure (or when there is no
    /// Tokio runtime to run it on, or no thread could be started),
    /// `Err(RewardError::Timeout(timeout))`, `Err(RewardError::Panicked(message))`. The outer
    /// error is fatal: [`Error::RewardHung`] once
    /// [`max_consecutive_hangs`](Self::max_consecutive_hangs) grades in a row timed out.
    ///
    /// Must be called from within a Tokio runtime. On a current-thread runtime, timers and
    /// I/O inside an async reward are driven by the thread that runs the runtime, which is
    /// busy awaiting this call — so they work. Under Tokio's paused test clock the runtime
    /// looks idle while the reward works, so the clock jumps ahead and every grade times out:
    /// test code that pauses time should call [`RewardFn::grade`] directly.
    ///
    /// Timeouts and panics are logged (`tracing` warnings with the problem id).
    pub async fn grade<R>(
        &self,
        reward: Arc<R>,
        problem: Arc<Problem>,
        response: Response,
        timeout: Duration,
    ) -> Result<std::result::Result<Reward, RewardError>>
    where
        R: RewardFn + ?Sized,
    {
        let handle = match tokio::runtime::Handle::try_current() {
            Ok(h) => h,
            Err(e) => {
                return Ok(Err(RewardError::Failed(format!(
                    "grading needs a Tokio runtime: {e}"
                ))))
            }
        };
        let problem_id = problem.id.clone();
        let Some(slot) = self.wait_for_thread(timeout).await else {
            return self.timed_out(&problem_id, timeout, false);
        };
        let (reply, rx) = oneshot::channel();
        let work: Box<dyn FnOnce() -> Outcome + Send> =
            Box::new(move || handle.block_on(reward.grade(&problem, &response)));
        if let Err(message) = self.dispatch(work, reply, slot) {
            return Ok(Err(RewardError::Failed(message)));
        }
        // The timeout runs from here: the job is on its thread.
        let mut pending = Pending {
            rx,
            shared: &self.shared,
            settled: false,
        };
        let outcome = match tokio::time::timeout(timeout, &mut pending.rx).await {
            Ok(received) => {
                pending.settled = true;
                received.unwrap_or_else(|_| {
                    Err(RewardError::Failed(
                        "the grading thread ended without a result".into(),
                    ))
                })
            }
            Err(_) => match pending.abandon() {
                // It returned just as the timer fired: in time after all.
                Some(late) => late,
                None => return self.timed_out(&problem_id, timeout, true),
            },
        };
        self.shared.lock().consecutive_hangs = 0;
        if let Err(RewardError::Panicked(message)) = &outcome {
            tracing::warn!(problem = %problem_id, %message, "reward panicked");
        }
        Ok(outcome)
    }

    /// A slot of the pool, once one is free; `None` when no thread became free during a whole
    /// `timeout` (counted from the call or from the last thread that became free).
    async fn wait_for_thread(&self, timeout: Duration) -> Option<OwnedSemaphorePermit> {
        let slots = &self.shared.slots;
        if let Ok(slot) = Arc::clone(slots).try_acquire_owned() {
            return Some(slot);
        }
        let start = Instant::now();
        // Tokio's semaphore is fair: waiting grades get threads in arrival order.
        let mut acquire = pin!(Arc::clone(slots).acquire_owned());
        loop {
            let since = start.max(self.shared.lock().last_free);
            let Some(deadline) = since.checked_add(timeout) else {
                return acquire.await.ok();
            };
            let deadline = tokio::time::Instant::from_std(deadline);
            match tokio::time::timeout_at(deadline, acquire.as_mut()).await {
                Ok(slot) => return slot.ok(),
                Err(_) if self.shared.lock().last_free > since => {}
                Err(_) => return None,
            }
        }
    }

    /// Hands `work` to an idle thread, or to a new one (never beyond the bound: holding a
    /// slot guarantees one or the other).
    fn dispatch(
        &self,
        work: Box<dyn FnOnce() -> Outcome + Send>,
        reply: oneshot::Sender<Outcome>,
        slot: OwnedSemaphorePermit,
    ) -> std::result::Result<(), String> {
        let mut st = self.shared.lock();
        let home = match st.idle.pop() {
            Some(home) => home,
            None if st.spawned < self.threads => {
                let (home, jobs) = mpsc::channel();
                let shared = Arc::downgrade(&self.shared);
                std::thread::Builder::new()
                    .name(format!("rlvr-grader-{}", st.spawned))
                    .spawn(move || worker(shared, jobs))
                    .map_err(|e| format!("could not start a grading thread: {e}"))?;
                st.spawned += 1;
                home
            }
            None => {
                return Err(format!(
                    "no grading thread is free although a slot is ({} threads)",
                    self.threads
                ))
            }
        };
        let job = Job {
            work,
            reply,
            home: home.clone(),
            slot,
        };
        if let Err(mpsc::SendError(job)) = home.send(job) {
            // The thread is gone (it can only end when the pool does).
            st.spawned = st.spawned.saturating_sub(1);
            drop(st);
            drop(job);
            return Err("the grading thread has stopped".into());
        }
        Ok(())
    }

    /// A grade that timed out (`started`: on its thread; else while waiting for one): a
    /// counted timeout, or the fatal error once the hang limit is reached.
    fn timed_out(&self, problem: &str, timeout: Duration, started: bool) -> Result<Outcome> {
        let (consecutive, hung) = {
            let mut st = self.shared.lock();
            st.consecutive_hangs += 1;
            (st.consecutive_hangs, st.hung)
        };
        if started {
            tracing::warn!(
                problem,
                ?timeout,
                consecutive,
                hung_threads = hung,
                "reward timed out"
            );
        } else {
            tracing::warn!(
                problem,
                ?timeout,
                consecutive,
                hung_threads = hung,
                "reward timed out waiting for a grading thread (every thread is busy and none finished)"
            );
        }
        if self.max_consecutive_hangs > 0 && consecutive >= self.max_consecutive_hangs {
            return Err(Error::RewardHung {
                problem: problem.to_owned(),
                consecutive,
                timeout,
                hung_threads: hung,
                threads: self.threads,
            });
        }
        Ok(Err(RewardError::Timeout(timeout)))
    }
}

/// A grade running on a thread, seen from its caller.
struct Pending<'a> {
    rx: oneshot::Receiver<Outcome>,
    shared: &'a Shared,
    /// Whether the outcome was taken or the grade abandoned.
    settled: bool,
}

impl Pending<'_> {
    /// Stops waiting: the result if the reward returned after all, else `None` with its
    /// thread counted hung until the reward returns. The worker's reply and this check take
    /// the same lock, so a thread is counted hung exactly when its reply finds no receiver.
    fn abandon(&mut self) -> Option<Outcome> {
        self.settled = true;
        let mut st = self.shared.lock();
        self.rx.close();
        match self.rx.try_recv() {
            Ok(outcome) => Some(outcome),
            Err(_) => {
                st.hung += 1;
                None
            }
        }
    }
}

impl Drop for Pending<'_> {
    /// A grade dropped while its reward runs (its caller was cancelled) leaves the thread
    /// hung until the reward returns, without counting a hang.
    fn drop(&mut self) {
        if !self.settled {
            self.abandon();
        }
    }
}

/// A pool thread: runs jobs until the pool is gone.
fn worker(shared: Weak<Shared>, jobs: mpsc::Receiver<Job>) {
    while let Ok(Job {
        work,
        reply,
        home,
        slot,
    }) = jobs.recv()
    {
        let outcome = match std::panic::catch_unwind(AssertUnwindSafe(work)) {
            Ok(outcome) => outcome,
            Err(payload) => Err(RewardError::Panicked(panic_message(payload.as_ref()))),
        };
        let Some(pool) = shared.upgrade() else {
            return;
        };
        {
            let mut st = pool.lock();
            if reply.send(outcome).is_err() {
                // Its caller abandoned it: the thread was counted hung, and is back now.
                st.hung = st.hung.saturating_sub(1);
            }
            st.idle.push(home);
            st.last_free = Instant::now();
        }
        // Only now may a waiting grade take the slot: the thread is in the idle list.
        drop(slot);
    }
}
