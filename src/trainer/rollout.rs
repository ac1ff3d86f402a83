//! Rollouts: concurrent sampling of every prompt, parsing, and grading with a timeout.
//!
//! This is the trainer's built-in single-turn path, an equivalent twin of
//! [`ProblemEnv`](super::ProblemEnv) run through the env machinery (same calls, datums and
//! metrics; pinned by the test `problem_env_path_matches_the_built_in_rollout`). It is kept
//! for its separate sampling/grading phases and for streamed minibatches; keep both in step.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use crate::backend::Sampler;
use crate::dataset::Problem;
use crate::error::Result;
use crate::renderer::{ParseTermination, Renderer};
use crate::report::PhaseBar;
use crate::reward::{Response, Reward, RewardError, RewardFn};
use crate::types::{ModelInput, SampledSequence, SamplingParams, StopReason};

/// One policy turn: what the model saw and what it sampled.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The observation (the whole context the model was sampled from).
    pub observation: ModelInput,
    /// The sampled action.
    pub sequence: SampledSequence,
}

/// One graded completion (an episode: one turn for single-turn problems).
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The turns of the episode, in order (never empty).
    pub turns: Vec<Turn>,
    /// Why the last turn's sampling stopped.
    pub stop_reason: StopReason,
    /// The parsed text of the last turn.
    pub text: String,
    /// How the renderer saw the response end.
    pub termination: ParseTermination,
    /// The reward used for advantages (0 when grading failed).
    pub reward: f64,
    /// Named reward components.
    pub components: BTreeMap<String, f64>,
    /// Why grading failed, if it did.
    pub reward_error: Option<RewardError>,
}

/// One problem with its rendered prompt and its group of graded completions.
#[derive(Debug, Clone)]
pub struct Group {
    /// The problem.
    pub problem: Arc<Problem>,
    /// The rendered prompt.
    pub prompt: ModelInput,
    /// Index of the policy version (step) whose sampler produced the completions.
    pub policy_version: u64,
    /// The completions.
    pub completions: Vec<Completion>,
}

impl Completion {
    /// Sampled tokens over all turns.
    pub fn num_tokens(&self) -> usize {
        self.turns.iter().map(|t| t.sequence.tokens.len()).sum()
    }
    /// The sampler's log-probabilities of every sampled token, all turns.
    pub fn logprobs(&self) -> impl Iterator<Item = f32> + '_ {
        self.turns
            .iter()
            .flat_map(|t| t.sequence.logprobs.iter().copied())
    }
    /// Every sampled token, all turns.
    pub fn tokens(&self) -> Vec<crate::types::TokenId> {
        self.turns
            .iter()
            .flat_map(|t| t.sequence.tokens.iter().copied())
            .collect()
    }
}

impl Group {
    /// The rewards of the group, in order.
    pub fn rewards(&self) -> Vec<f64> {
        self.completions.iter().map(|c| c.reward).collect()
    }
}

/// [`reward::grade_with_timeout`](crate::reward::grade_with_timeout), with a non-finite
/// total also counted as a failure (it would poison the group's advantages).
pub(crate) async fn grade_with_timeout<R: RewardFn>(
    reward: Arc<R>,
    problem: Arc<Problem>,
    response: Response,
    timeout: Duration,
) -> std::result::Result<Reward, RewardError> {
    let result = crate::reward::grade_with_timeout(reward, problem, response, timeout).await?;
    if !result.total.is_finite() {
        return Err(RewardError::Failed(format!(
            "non-finite reward {}",
            result.total
        )));
    }
    Ok(result)
}

/// Samples `group_size` completions of every prompt, all prompts concurrently (one `sample`
/// call per prompt). `seed_of(i)` gives prompt i's sampling seed.
pub(crate) async fn sample_all<S: Sampler>(
    sampler: &S,
    prompts: &[ModelInput],
    group_size: usize,
    params: &SamplingParams,
    seed_of: impl Fn(usize) -> Option<u64>,
    bar: &PhaseBar,
) -> Result<Vec<Vec<SampledSequence>>> {
    let futures = prompts.iter().enumerate().map(|(i, prompt)| {
        let mut p = params.clone();
        p.seed = seed_of(i);
        async move {
            let out = sampler.sample(prompt, group_size, &p).await?;
            bar.inc(1);
            if out.len() != group_size {
                return Err(crate::Error::Backend(format!(
                    "sampler returned {} sequences for {group_size} requested",
                    out.len()
                )));
            }
            Ok(out)
        }
    });
    join_all(futures).await.into_iter().collect()
}

/// Parses and grades every sequence of every group concurrently.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn grade_all<R: RewardFn>(
    reward: &Arc<R>,
    renderer: &dyn Renderer,
    problems: &[Arc<Problem>],
    prompts: Vec<ModelInput>,
    sequences: Vec<Vec<SampledSequence>>,
    timeout: Duration,
    policy_version: u64,
    bar: &PhaseBar,
) -> Vec<Group> {
    let running = std::sync::Mutex::new((0.0f64, 0usize));
    let mut pending = Vec::new();
    let mut shells = Vec::new();
    for ((problem, prompt), seqs) in problems.iter().zip(prompts).zip(sequences) {
        let mut parsed = Vec::with_capacity(seqs.len());
        for seq in seqs {
            let (message, termination) = renderer.parse_response(&seq.tokens);
            let response = Response {
                text: message.final_text(),
                termination,
                tokens: seq.tokens.clone(),
            };
            let grade =
                grade_with_timeout(Arc::clone(reward), Arc::clone(problem), response, timeout);
            let running = &running;
            pending.push(async move {
                let g = grade.await;
                // Live mean reward on the bar (failures count as 0).
                let (sum, n) = {
                    let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
                    r.0 += g.as_ref().map_or(0.0, |r| r.total);
                    r.1 += 1;
                    *r
                };
                bar.set_message(format!("reward {:.3}", sum / n as f64));
                bar.inc(1);
                g
            });
            parsed.push((seq, message.content.to_display_string(""), termination));
        }
        shells.push((Arc::clone(problem), prompt, parsed));
    }
    let mut grades = join_all(pending).await.into_iter();
    shells
        .into_iter()
        .map(|(problem, prompt, parsed)| {
            let completions = parsed
                .into_iter()
                .map(|(sequence, text, termination)| {
                    let (reward, components, reward_error) = match grades.next() {
                        Some(Ok(r)) => (r.total, r.components, None),
                        Some(Err(e)) => (0.0, BTreeMap::new(), Some(e)),
                        None => (
                            0.0,
                            BTreeMap::new(),
                            Some(RewardError::Failed("missing grade".into())),
                        ),
                    };
                    if let Some(e) = &reward_error {
                        tracing::warn!(problem = %problem.id, error = %e, "reward failed; counted as 0");
                    }
                    Completion {
                        stop_reason: sequence.stop_reason,
                        turns: vec![Turn {
                            observation: prompt.clone(),
                            sequence,
                        }],
                        text,
                        termination,
                        reward,
                        components,
                        reward_error,
                    }
                })
                .collect();
            Group {
                problem,
                prompt,
                policy_version,
                completions,
            }
        })
        .collect()
}

/// Whether a completion hit `max_tokens`.
pub(crate) fn truncated(c: &Completion) -> bool {
    c.stop_reason == StopReason::Length
}
