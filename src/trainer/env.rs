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
use crate::renderer::Renderer;
use crate::reward::{Response, RewardError, RewardFn};
use crate::types::{ModelInput, SampledSequence, StopCondition};

use super::grade::grade_with_timeout;

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
}

/// One episode of an environment (the cookbook's `Env`): single use.
///
/// ```
/// use rlvr::trainer::{Env, Observation, StepResult};
/// use rlvr::{ModelInput, SampledSequence, StopCondition};
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
/// response parsed by the renderer and graded by the reward (under a timeout; a failure
/// scores 0 and is reported in [`StepResult::reward_error`]). The reward's components
/// become the turn's metrics.
///
/// This is how the trainer rolls out single-turn problems when it is given no env builder:
/// a [`ProblemEnvBuilder`] over the trainer's renderer, reward and `reward_timeout_s`.
pub struct ProblemEnv<R: RewardFn> {
    renderer: Arc<dyn Renderer>,
    reward: Arc<R>,
    problem: Arc<Problem>,
    timeout: Duration,
    /// The first observation when already rendered (a builder renders a group's prompt
    /// once for all its envs).
    rendered: Option<Observation>,
}

impl<R: RewardFn> ProblemEnv<R> {
    /// An episode of `problem`.
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
            rendered: None,
        }
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
        let graded = grade_with_timeout(
            Arc::clone(&self.reward),
            Arc::clone(&self.problem),
            response,
            self.timeout,
        )
        .await;
        Ok(match graded {
            Ok(r) => StepResult {
                reward: r.total,
                done: true,
                next: None,
                metrics: r.components,
                reward_error: None,
            },
            Err(e) => StepResult {
                done: true,
                reward_error: Some(e),
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
}

impl<R: RewardFn> ProblemEnvBuilder<R> {
    /// Environments rendering with `renderer` and grading with `reward` under `timeout`.
    pub fn new(renderer: Arc<dyn Renderer>, reward: Arc<R>, timeout: Duration) -> Self {
        ProblemEnvBuilder {
            renderer,
            reward,
            timeout,
        }
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
                );
                env.rendered.clone_from(&rendered);
                Box::new(env) as Box<dyn Env>
            })
            .collect())
    }
}
