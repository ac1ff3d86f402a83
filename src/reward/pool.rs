//! A bounded pool of grading threads: a reward that hangs costs at most its timeout, also the
//! hundredth time, and never more threads than the pool's bound.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

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

/// How long a queued grade waits for a thread before it wakes (or starts) another one for
/// itself: a burst of cheap grades (a regex and a comparison, tens of microseconds each)
/// runs on one thread, one after the other, instead of waking a thread per grade, while the
/// grades queued behind a slow one get threads of their own after this long.
const PATIENCE: Duration = Duration::from_millis(5);

/// A grade whose measured cost (a moving average of run times) is above this is slow: a
/// burst of them gets a thread each at once.
const SLOW: Duration = Duration::from_millis(5);

/// [`Job::phase`] of a grade waiting in the queue.
const QUEUED: u64 = 0;
/// [`Job::phase`] of a grade whose caller stopped waiting before a thread took it.
const ABANDONED: u64 = u64::MAX;

/// One grade, from the queue to its thread.
struct Job {
    /// Runs the reward (on the caller's runtime).
    work: Box<dyn FnOnce() -> Outcome + Send>,
    /// Where the outcome goes; closed when the caller stopped waiting.
    reply: oneshot::Sender<Outcome>,
    /// [`QUEUED`], [`ABANDONED`], or 1 + the nanoseconds from [`Shared::epoch`] to when a
    /// thread started it. Changed only under the pool's lock.
    phase: Arc<AtomicU64>,
}

/// The pool's bookkeeping, behind one lock.
struct State {
    /// Grades waiting for a thread, oldest first.
    queue: VecDeque<Job>,
    /// Threads started (they end only when the pool is dropped).
    spawned: usize,
    /// Threads waiting for work that no wake-up was handed to yet.
    sleeping: usize,
    /// Wake-ups handed out (one per notified thread) and not yet taken.
    wakeups: usize,
    /// Grades running on a thread, hung ones included.
    running: usize,
    /// Threads still running a reward whose caller stopped waiting for it.
    hung: usize,
    /// When a thread last became free (pool creation at first).
    last_free: Instant,
    /// Smoothed run time of one grade, in seconds (`None` until a grade finished).
    cost: Option<f64>,
    /// The pool was dropped: threads end once their reward returns.
    closed: bool,
}

/// What the pool's threads share with it.
struct Shared {
    state: Mutex<State>,
    /// Where idle threads wait for a wake-up.
    work: Condvar,
    /// The origin of [`Job::phase`] times.
    epoch: Instant,
    /// Grades in a row that timed out (reset by any grade that finished in time).
    consecutive_hangs: AtomicUsize,
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
/// - A grade first **waits (asynchronously) in the pool's queue for a thread**. It gives
///   up, as a [`RewardError::Timeout`], when no thread can be added, none of the pool's
///   threads became free during a whole timeout, and every running grade has itself been
///   given up: then every thread is busy with a reward that is not finishing (hung), and
///   waiting longer would be unbounded. While threads keep
///   freeing up (slow but honest rewards), a waiting grade waits its turn: queueing is not a
///   timeout.
/// - **Threads are woken as the work needs them.** A burst of grades wakes one thread,
///   which takes them one after the other; a grade still queued after 5 ms wakes (or
///   starts) another thread for itself. So 128 cheap grades (a regex, tens of microseconds
///   each: a tutorial step) run on one thread instead of waking 64 and switching between
///   them, while grades queued behind a slow one wait at most those 5 ms more. Once the
///   pool has measured that grades are slow (a moving average of their run times above
///   5 ms: a judge model behind HTTP, say), a burst gets a thread per grade at once.
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
/// use rlvr::{dataset::Problem, renderer::ParseTermination, Error};
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
            .field("idle", &st.sleeping)
            .field("queued", &st.queue.len())
            .field("hung", &st.hung)
            .field(
                "consecutive_hangs",
                &self.shared.consecutive_hangs.load(Ordering::Relaxed),
            )
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
                    queue: VecDeque::new(),
                    spawned: 0,
                    sleeping: 0,
                    wakeups: 0,
                    running: 0,
                    hung: 0,
                    last_free: Instant::now(),
                    cost: None,
                    closed: false,
                }),
                work: Condvar::new(),
                epoch: Instant::now(),
                consecutive_hangs: AtomicUsize::new(0),
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
        self.shared.consecutive_hangs.load(Ordering::Relaxed)
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
                ))));
            }
        };
        let problem_id = problem.id.clone();
        let (reply, rx) = oneshot::channel();
        let work: Box<dyn FnOnce() -> Outcome + Send> =
            Box::new(move || handle.block_on(reward.grade(&problem, &response)));
        let phase = Arc::new(AtomicU64::new(QUEUED));
        let enqueued = Instant::now();
        let patience = PATIENCE.min(timeout);
        self.shared.lock().queue.push_back(Job {
            work,
            reply,
            phase: Arc::clone(&phase),
        });
        let mut pending = Pending {
            rx,
            phase,
            shared: &self.shared,
            settled: false,
        };
        // Let the other grades of this poll (the rest of a group, of a step) queue theirs
        // first: then one wake-up serves the whole burst, and the woken thread does not
        // preempt this one for each grade.
        tokio::task::yield_now().await;
        let staffed = {
            let mut st = self.shared.lock();
            let staffed = self.staff(&mut st);
            (staffed, st.spawned)
        };
        match staffed {
            (Ok(wake), _) => self.wake(wake),
            (Err(message), 0) => {
                // No thread exists to take it.
                if let Some(outcome) = pending.abandon() {
                    return Ok(outcome);
                }
                return Ok(Err(RewardError::Failed(message)));
            }
            (Err(_), _) => {}
        }
        let mut deadline = enqueued + patience;
        let outcome = loop {
            let at = tokio::time::Instant::from_std(deadline);
            if let Ok(received) = tokio::time::timeout_at(at, &mut pending.rx).await {
                pending.settled = true;
                break received.unwrap_or_else(|_| {
                    Err(RewardError::Failed(
                        "the grading thread ended without a result".into(),
                    ))
                });
            }
            let now = Instant::now();
            let mut st = self.shared.lock();
            match pending.phase.load(Ordering::Relaxed) {
                QUEUED => {
                    // Still waiting for a thread: wake or start one more if the bound
                    // allows; else give up once none became free during a whole timeout
                    // and every running grade has been given up as hung (a slow one that
                    // is still within its own timeout may yet free its thread).
                    let since = enqueued.max(st.last_free);
                    if let Some(wake) = self.add_thread(&mut st) {
                        drop(st);
                        self.wake(wake);
                        deadline = now + patience;
                    } else if now < since + timeout {
                        deadline = since + timeout;
                    } else if st.hung < st.running {
                        deadline = now + Duration::from_millis(5);
                    } else {
                        drop(st);
                        if let Some(late) = pending.abandon() {
                            break late;
                        }
                        return self.timed_out(&problem_id, timeout, false);
                    }
                }
                running => {
                    // The timeout runs from when its thread started it.
                    let started = self
                        .shared
                        .epoch
                        .checked_add(Duration::from_nanos(running.saturating_sub(1)))
                        .unwrap_or(now);
                    if now < started + timeout {
                        deadline = started + timeout;
                        continue;
                    }
                    drop(st);
                    match pending.abandon() {
                        // It returned just as the timer fired: in time after all.
                        Some(late) => break late,
                        None => return self.timed_out(&problem_id, timeout, true),
                    }
                }
            }
        };
        self.shared.consecutive_hangs.store(0, Ordering::Relaxed);
        if let Err(RewardError::Panicked(message)) = &outcome {
            tracing::warn!(problem = %problem_id, %message, "reward panicked");
        }
        Ok(outcome)
    }

    /// Wakes or starts threads until enough are awake for the queue: one, or one per waiting
    /// or running grade when a grade is known to be [`SLOW`]. Never beyond the bound. Gives
    /// the number of sleeping threads to wake ([`wake`](Self::wake), once the lock is
    /// released); the error is a thread that could not be started.
    fn staff(&self, st: &mut State) -> std::result::Result<usize, String> {
        let live = st.running.saturating_sub(st.hung);
        let backlog = st.queue.len() + live;
        let want = match st.cost {
            Some(cost) if cost > SLOW.as_secs_f64() => backlog,
            _ => backlog.min(1),
        };
        let mut awake = st
            .spawned
            .saturating_sub(st.sleeping)
            .saturating_sub(st.hung);
        let mut wake = 0;
        while awake < want {
            match self.try_add_thread(st)? {
                Some(n) => wake += n,
                None => break,
            }
            awake += 1;
        }
        Ok(wake)
    }

    /// One more thread awake: a sleeping one (`Some(1)`: to wake once the lock is released)
    /// or a new one (`Some(0)`); `None` when every thread allowed is awake already (or none
    /// could be started).
    fn add_thread(&self, st: &mut State) -> Option<usize> {
        self.try_add_thread(st).ok().flatten()
    }

    fn try_add_thread(&self, st: &mut State) -> std::result::Result<Option<usize>, String> {
        if st.sleeping > 0 {
            st.sleeping -= 1;
            st.wakeups += 1;
            return Ok(Some(1));
        }
        if st.spawned >= self.threads {
            return Ok(None);
        }
        let shared = Arc::clone(&self.shared);
        std::thread::Builder::new()
            .name(format!("rlvr-grader-{}", st.spawned))
            .spawn(move || worker(&shared))
            .map_err(|e| format!("could not start a grading thread: {e}"))?;
        st.spawned += 1;
        Ok(Some(0))
    }

    /// Wakes `n` sleeping threads (their wake-ups are already counted). Called without the
    /// lock, so that a woken thread does not find it held.
    fn wake(&self, n: usize) {
        for _ in 0..n {
            self.shared.work.notify_one();
        }
    }

    /// A grade that timed out (`started`: on its thread; else while waiting for one): a
    /// counted timeout, or the fatal error once the hang limit is reached.
    fn timed_out(&self, problem: &str, timeout: Duration, started: bool) -> Result<Outcome> {
        let consecutive = self
            .shared
            .consecutive_hangs
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        let hung = self.shared.lock().hung;
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

impl Drop for GraderPool {
    /// Idle threads end now; a thread running a reward ends when the reward returns.
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.closed = true;
        self.shared.work.notify_all();
    }
}

/// A grade in the pool, seen from its caller.
struct Pending<'a> {
    rx: oneshot::Receiver<Outcome>,
    /// The job's [`Job::phase`].
    phase: Arc<AtomicU64>,
    shared: &'a Shared,
    /// Whether the outcome was taken or the grade abandoned.
    settled: bool,
}

impl Pending<'_> {
    /// Stops waiting: the result if the reward returned after all, else `None`. A grade
    /// still queued leaves the queue; a running one leaves its thread counted hung until the
    /// reward returns. The receiver is closed and the thread counted hung in one critical
    /// section, and the worker takes the lock only after its reply, so a thread is counted
    /// hung exactly when its reply finds no receiver, and uncounted after that.
    fn abandon(&mut self) -> Option<Outcome> {
        self.settled = true;
        let mut st = self.shared.lock();
        self.rx.close();
        if let Ok(outcome) = self.rx.try_recv() {
            return Some(outcome);
        }
        if self.phase.load(Ordering::Relaxed) == QUEUED {
            self.phase.store(ABANDONED, Ordering::Relaxed);
            let phase = &self.phase;
            st.queue.retain(|j| !Arc::ptr_eq(&j.phase, phase));
        } else {
            st.hung += 1;
        }
        None
    }
}

impl Drop for Pending<'_> {
    /// A grade dropped while it waits or runs (its caller was cancelled) leaves the queue, or
    /// leaves its thread hung until the reward returns, without counting a hang.
    fn drop(&mut self) {
        if !self.settled {
            self.abandon();
        }
    }
}

/// A pool thread: takes queued grades one after the other, sleeps while there are none,
/// and ends once the pool is dropped.
fn worker(shared: &Shared) {
    let mut st = shared.lock();
    loop {
        let Some(job) = st.queue.pop_front() else {
            if st.closed {
                st.spawned = st.spawned.saturating_sub(1);
                return;
            }
            st.sleeping += 1;
            while st.wakeups == 0 && !st.closed {
                st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.wakeups > 0 {
                st.wakeups -= 1;
            } else {
                st.sleeping = st.sleeping.saturating_sub(1);
            }
            continue;
        };
        let start = Instant::now();
        let since_epoch = start.saturating_duration_since(shared.epoch).as_nanos();
        // 1 + the nanoseconds: never QUEUED, never ABANDONED.
        let stamp = u64::try_from(since_epoch).map_or(ABANDONED - 2, |n| n.min(ABANDONED - 2));
        job.phase.store(stamp + 1, Ordering::Relaxed);
        st.running += 1;
        drop(st);
        let Job { work, reply, .. } = job;
        let outcome = match std::panic::catch_unwind(AssertUnwindSafe(work)) {
            Ok(outcome) => outcome,
            Err(payload) => Err(RewardError::Panicked(panic_message(payload.as_ref()))),
        };
        let took = start.elapsed().as_secs_f64();
        // Sent before taking the lock, so that the woken caller does not find it held. A
        // failed send means the caller closed its receiver, which it does (in `abandon`)
        // in the same critical section that counts the thread hung: that count is made
        // before the lock below is ours.
        let abandoned = reply.send(outcome).is_err();
        st = shared.lock();
        st.running -= 1;
        if abandoned {
            // Its caller abandoned it: the thread was counted hung, and is back now.
            st.hung = st.hung.saturating_sub(1);
        }
        st.last_free = Instant::now();
        st.cost = Some(st.cost.map_or(took, |c| 0.8 * c + 0.2 * took));
    }
}
