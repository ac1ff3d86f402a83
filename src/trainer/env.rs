//! Environments: the multi-turn abstraction (observation → action → reward, next
//! observation, done), the single-turn [`ProblemEnv`] built on it, and the episode runner.
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
use futures::future::join_all;

use crate::backend::Sampler;
use crate::dataset::Problem;
use crate::error::{Error, Result};
use crate::renderer::Renderer;
use crate::reward::{Response, RewardError, RewardFn};
use crate::types::{ModelInput, SampledSequence, SamplingParams, StopCondition};

use super::rollout::{grade_with_timeout, Completion, Turn};

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
/// The trainer's default single-turn rollout (no env builder) is a twin of this env, not a
/// user of it: it makes the same `sample` calls (one per prompt, `group_size` samples each,
/// same seeds and params), the same datums and the same metrics, which the test
/// `problem_env_path_matches_the_built_in_rollout` pins down. It stays separate because it
/// grades the whole batch at once after sampling (its own `time/grading` and progress bar
/// with the live mean reward) and feeds streamed minibatches (`stream_minibatches`); a change
/// to one must be mirrored in the other.
pub struct ProblemEnv<R: RewardFn> {
    renderer: Arc<dyn Renderer>,
    reward: Arc<R>,
    problem: Arc<Problem>,
    timeout: Duration,
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
        }
    }
}

#[async_trait]
impl<R: RewardFn> Env for ProblemEnv<R> {
    async fn initial_observation(&mut self) -> Result<Observation> {
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
        Ok((0..n)
            .map(|_| {
                Box::new(ProblemEnv::new(
                    Arc::clone(&self.renderer),
                    Arc::clone(&self.reward),
                    Arc::clone(&problem),
                    self.timeout,
                )) as Box<dyn Env>
            })
            .collect())
    }
}

/// Runs the episodes of one group concurrently. When every env starts from the same
/// observation (the single-turn case), the first turn is one `sample` call for the whole
/// group; later turns sample one completion per env. `seed_of(env, turn)` gives the seed of
/// a per-env call, `group_seed` the seed of the shared first call.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_group<S: Sampler>(
    sampler: &S,
    mut envs: Vec<Box<dyn Env>>,
    params: &SamplingParams,
    group_seed: u64,
    seed_of: impl Fn(usize, usize) -> u64,
    max_turns: usize,
    renderer: &dyn Renderer,
) -> Result<(ModelInput, Vec<Completion>)> {
    let mut first = Vec::with_capacity(envs.len());
    for env in envs.iter_mut() {
        first.push(env.initial_observation().await?);
    }
    let Some(head) = first.first().cloned() else {
        return Ok((ModelInput::new(), Vec::new()));
    };
    let shared = first.iter().all(|o| *o == head);
    let mut first_actions: Vec<Option<SampledSequence>> = vec![None; envs.len()];
    if shared {
        let p = SamplingParams {
            seed: Some(group_seed),
            stop: Some(head.stop.clone()),
            ..params.clone()
        };
        let out = sampler.sample(&head.input, envs.len(), &p).await?;
        if out.len() != envs.len() {
            return Err(Error::Backend(format!(
                "sampler returned {} sequences for {} requested",
                out.len(),
                envs.len()
            )));
        }
        first_actions = out.into_iter().map(Some).collect();
    }
    let episodes = envs
        .into_iter()
        .zip(first)
        .zip(first_actions)
        .enumerate()
        .map(|(i, ((mut env, ob), action))| {
            let seed_of = &seed_of;
            async move {
                let mut ob = ob;
                let mut action = action;
                let mut turns = Vec::new();
                let mut reward = 0.0;
                let mut metrics = BTreeMap::new();
                let mut reward_error = None;
                for t in 0..max_turns {
                    let seq = match action.take() {
                        Some(s) => s,
                        None => {
                            let p = SamplingParams {
                                seed: Some(seed_of(i, t)),
                                stop: Some(ob.stop.clone()),
                                ..params.clone()
                            };
                            sampler
                                .sample(&ob.input, 1, &p)
                                .await?
                                .into_iter()
                                .next()
                                .ok_or_else(|| {
                                    Error::Backend("sampler returned no sequence".into())
                                })?
                        }
                    };
                    let step = env.step(&seq).await?;
                    turns.push(Turn {
                        observation: ob.input.clone(),
                        sequence: seq,
                    });
                    reward += step.reward;
                    metrics.extend(step.metrics);
                    if step.reward_error.is_some() {
                        reward_error = step.reward_error;
                    }
                    match (step.done, step.next) {
                        (true, _) => break,
                        (false, Some(next)) => ob = next,
                        (false, None) => {
                            return Err(Error::Backend(format!(
                                "environment {i} is not done but gave no next observation"
                            )))
                        }
                    }
                }
                if !reward.is_finite() {
                    reward_error = Some(RewardError::Failed(format!("non-finite return {reward}")));
                    reward = 0.0;
                }
                let last = turns
                    .last()
                    .map(|t: &Turn| t.sequence.clone())
                    .ok_or_else(|| Error::config("max_turns", "must be at least 1"))?;
                let (message, termination) = renderer.parse_response(&last.tokens);
                Ok(Completion {
                    stop_reason: last.stop_reason,
                    turns,
                    text: message.content.to_display_string(""),
                    termination,
                    reward,
                    components: metrics,
                    reward_error,
                })
            }
        });
    let completions: Vec<Completion> = join_all(episodes)
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    Ok((head.input, completions))
}
