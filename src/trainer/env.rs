//! Environments: the multi-turn abstraction (observation → action → reward, next
//! observation, done) and the single-turn [`ProblemEnv`] built on it. Every rollout of the
//! trainer runs through environments: the [sample](super::sample) phase makes them and
//! samples their first turn, the [grade](super::grade) phase runs them to the end.
//!
//! An [`Env`] is one episode, used once. An [`EnvBuilder`] makes the `group_size` envs of
//! one problem (the GRPO group). Give the trainer a builder with
//! [`GrpoTrainer::with_env_builder`](super::GrpoTrainer::with_env_builder) to train on tool-use
//! or dialogue tasks: every action token of an episode gets the episode's advantage
//! (total reward − group mean), and turns whose observation extends the previous context are
//! merged into one datum (observation tokens get no gradient).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::dataset::Problem;
use crate::error::Result;
use crate::renderer::{Message, ParseTermination, Renderer};
use crate::reward::{GraderPool, Response, RewardError, RewardFn};
use crate::types::{ModelInput, SampledSequence, StopCondition};

/// What the policy sees before a turn: its whole context, and where sampling should stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The model input to sample from.
    pub input: ModelInput,
    /// The stop condition of this turn.
    pub stop: StopCondition,
}

/// The outcome of one [`Env::step`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepResult {
    /// The reward of this turn (an episode's return is the sum over its turns).
    pub reward: f64,
    /// Whether the episode is over.
    pub done: bool,
    /// The next observation (required when not done).
    pub next: Option<Observation>,
    /// Metrics of the turn, reported as `env/all/<name>` (averaged over episodes; the last
    /// turn's value wins within an episode).
    pub metrics: BTreeMap<String, f64>,
    /// A grading failure behind this turn's reward (counted in `reward_errors/...`).
    pub reward_error: Option<RewardError>,
    /// The renderer's reading of this turn's action ([`Renderer::parse_response`]), when the
    /// env already parsed it: the trainer keeps the last turn's text and parse termination
    /// (samples, `env/...` metrics). `None`: the trainer parses the action itself.
    pub parsed: Option<(Message, ParseTermination)>,
}

/// One episode of an environment (the cookbook's `Env`): single use.
///
/// ```
/// use rlvr::trainer::{Env, Observation, StepResult};
/// use rlvr::types::{ModelInput, SampledSequence, StopCondition};
///
/// /// Rewards the model for answering token 42, giving it two tries.
/// struct Guess { tries: u32 }
///
/// #[async_trait::async_trait]
/// impl Env for Guess {
///     async fn initial_observation(&mut self) -> rlvr::Result<Observation> {
///         Ok(Observation { input: ModelInput::from_tokens(vec![1, 2]), stop: StopCondition::Tokens(vec![0]) })
///     }
///     async fn step(&mut self, action: &SampledSequence) -> rlvr::Result<StepResult> {
///         self.tries += 1;
///         let hit = action.tokens.first() == Some(&42);
///         let next = (!hit && self.tries < 2).then(|| Observation {
///             input: ModelInput::from_tokens(vec![1, 2, 7]),
///             stop: StopCondition::Tokens(vec![0]),
///         });
///         Ok(StepResult { reward: if hit { 1.0 } else { 0.0 }, done: next.is_none(), next, ..Default::default() })
///     }
/// }
/// ```
#[async_trait]
pub trait Env: Send {
    /// The first observation.
    async fn initial_observation(&mut self) -> Result<Observation>;
    /// Feeds the sampled action; returns its reward and what comes next.
    async fn step(&mut self, action: &SampledSequence) -> Result<StepResult>;
}

/// Makes the environments of one group.
pub trait EnvBuilder: Send + Sync {
    /// `n` fresh environments for `problem` (one GRPO group).
    fn make_envs(&self, problem: Arc<Problem>, n: usize) -> Result<Vec<Box<dyn Env>>>;
}

/// The single-turn problem environment: the problem's messages rendered as the prompt, one
/// response parsed by the renderer and graded by the reward (under a timeout, on a
/// [`GraderPool`]; a failure scores 0 and is reported in [`StepResult::reward_error`]). The
/// reward's components become the turn's metrics. When the pool's hang limit is reached,
/// [`step`](Env::step) fails with [`Error::RewardHung`](crate::Error::RewardHung).
///
/// This is how the trainer rolls out single-turn problems when it is given no env builder:
/// a [`ProblemEnvBuilder`] over the trainer's renderer, reward, `reward_timeout_s` and the
/// run's grader pool.
pub struct ProblemEnv<R: RewardFn> {
    renderer: Arc<dyn Renderer>,
    reward: Arc<R>,
    problem: Arc<Problem>,
    timeout: Duration,
    pool: Arc<GraderPool>,
    /// The first observation when already rendered (a builder renders a group's prompt
    /// once for all its envs).
    rendered: Option<Observation>,
}

impl<R: RewardFn> ProblemEnv<R> {
    /// An episode of `problem`, graded on the process-wide [`GraderPool::global`] (no hang
    /// limit); see [`with_pool`](Self::with_pool).
    pub fn new(
        renderer: Arc<dyn Renderer>,
        reward: Arc<R>,
        problem: Arc<Problem>,
        timeout: Duration,
    ) -> Self {
        ProblemEnv {
            renderer,
            reward,
            problem,
            timeout,
            pool: GraderPool::global(),
            rendered: None,
        }
    }

    /// Grades on `pool` instead (its thread bound and hang limit apply).
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use rlvr::reward::GraderPool;
    /// use rlvr::trainer::ProblemEnv;
    /// use rlvr::{dataset::Problem, Renderer};
    ///
    /// # fn demo(renderer: Arc<dyn Renderer>) {
    /// let exact = |p: &Problem, text: &str| if text.trim() == p.answer { 1.0 } else { 0.0 };
    /// let problem = Arc::new(Problem::new("p0", "What is 2+2?", "4"));
    /// // At most 4 grading threads; the 8th timeout in a row fails the step.
    /// let env = ProblemEnv::new(renderer, Arc::new(exact), problem, Duration::from_secs(5))
    ///     .with_pool(Arc::new(GraderPool::new(4, 8)));
    /// # let _ = env;
    /// # }
    /// ```
    pub fn with_pool(mut self, pool: Arc<GraderPool>) -> Self {
        self.pool = pool;
        self
    }
}

#[async_trait]
impl<R: RewardFn> Env for ProblemEnv<R> {
    async fn initial_observation(&mut self) -> Result<Observation> {
        if let Some(ob) = self.rendered.take() {
            return Ok(ob);
        }
        Ok(Observation {
            input: self.renderer.generation_prompt(&self.problem.messages)?,
            stop: self.renderer.stop(),
        })
    }

    async fn step(&mut self, action: &SampledSequence) -> Result<StepResult> {
        let (message, termination) = self.renderer.parse_response(&action.tokens);
        let response = Response {
            text: message.final_text(),
            termination,
            tokens: action.tokens.clone(),
        };
        let parsed = Some((message, termination));
        let graded = self
            .pool
            .grade(
                Arc::clone(&self.reward),
                Arc::clone(&self.problem),
                response,
                self.timeout,
            )
            .await?;
        // A non-finite total would poison the group's advantages: a failed grade instead.
        let graded = match graded {
            Ok(r) if !r.total.is_finite() => Err(RewardError::Failed(format!(
                "non-finite reward {}",
                r.total
            ))),
            graded => graded,
        };
        Ok(match graded {
            Ok(r) => StepResult {
                reward: r.total,
                done: true,
                next: None,
                metrics: r.components,
                reward_error: None,
                parsed,
            },
            Err(e) => StepResult {
                done: true,
                reward_error: Some(e),
                parsed,
                ..StepResult::default()
            },
        })
    }
}

/// Builds [`ProblemEnv`]s.
pub struct ProblemEnvBuilder<R: RewardFn> {
    renderer: Arc<dyn Renderer>,
    reward: Arc<R>,
    timeout: Duration,
    pool: Arc<GraderPool>,
}

impl<R: RewardFn> ProblemEnvBuilder<R> {
    /// Environments rendering with `renderer` and grading with `reward` under `timeout`, on
    /// the process-wide [`GraderPool::global`] (no hang limit); see
    /// [`with_pool`](Self::with_pool).
    pub fn new(renderer: Arc<dyn Renderer>, reward: Arc<R>, timeout: Duration) -> Self {
        ProblemEnvBuilder {
            renderer,
            reward,
            timeout,
            pool: GraderPool::global(),
        }
    }

    /// Environments grading on `pool` instead: its thread bound applies, and its hang limit
    /// makes a step fail with [`Error::RewardHung`](crate::Error::RewardHung). The trainer's
    /// own builder uses the run's pool ([`GrpoTrainer::grader_pool`]); pass that one to share
    /// it with a custom builder.
    ///
    /// [`GrpoTrainer::grader_pool`]: super::GrpoTrainer::grader_pool
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use rlvr::reward::GraderPool;
    /// use rlvr::trainer::ProblemEnvBuilder;
    /// use rlvr::{dataset::Problem, Renderer};
    ///
    /// # fn demo(renderer: Arc<dyn Renderer>) {
    /// let exact = |p: &Problem, text: &str| if text.trim() == p.answer { 1.0 } else { 0.0 };
    /// let pool = Arc::new(GraderPool::new(8, 16));
    /// let builder = ProblemEnvBuilder::new(renderer, Arc::new(exact), Duration::from_secs(30))
    ///     .with_pool(pool);
    /// # let _ = builder;
    /// # }
    /// ```
    pub fn with_pool(mut self, pool: Arc<GraderPool>) -> Self {
        self.pool = pool;
        self
    }
}

impl<R: RewardFn> EnvBuilder for ProblemEnvBuilder<R> {
    fn make_envs(&self, problem: Arc<Problem>, n: usize) -> Result<Vec<Box<dyn Env>>> {
        // The prompt is rendered once for the whole group.
        let rendered = if n > 0 {
            Some(Observation {
                input: self.renderer.generation_prompt(&problem.messages)?,
                stop: self.renderer.stop(),
            })
        } else {
            None
        };
        Ok((0..n)
            .map(|_| {
                let mut env = ProblemEnv::new(
                    Arc::clone(&self.renderer),
                    Arc::clone(&self.reward),
                    Arc::clone(&problem),
                    self.timeout,
                )
                .with_pool(Arc::clone(&self.pool));
                env.rendered.clone_from(&rendered);
                Box::new(env) as Box<dyn Env>
            })
            .collect())
    }
}
