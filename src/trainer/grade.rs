//! Phase 2, grade: every sampled first turn is fed to its environment, which grades it
//! (a [`ProblemEnv`](super::ProblemEnv) parses the response with the renderer and runs the
//! reward under a timeout); multi-turn environments continue, one `sample` call per env and
//! turn, until done. All episodes of the batch run concurrently; the rewards run on the
//! run's bounded [`GraderPool`]. A grading failure, timeout or panic scores 0 and is counted
//! (`reward_errors/...`), never fatal — unless `max_consecutive_reward_hangs` timeouts come
//! in a row: that is [`Error::RewardHung`], and the step fails with it.
//!
//! What this phase hands to [advantages](super::advantages) is a [`Group`] per problem: its
//! prompt and its graded [`Completion`]s.

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures::future::join_all;

use crate::backend::Sampler;
use crate::error::{Error, Result};
use crate::renderer::Renderer;
use crate::report::PhaseBar;
use crate::reward::RewardError;
use crate::types::{ModelInput, SamplingParams};

use super::rollout::{Completion, Group, Turn};
use super::sample::{Sampled, mix};

/// The running sum and count of the rewards graded so far (the bar's live mean reward).
pub(crate) type RunningReward = Mutex<(f64, usize)>;

/// Phase 2 of a step: runs every sampled group's episodes to the end, all concurrently.
/// `policy_version` is the step whose sampler produced the groups.
pub(crate) async fn grade<S: Sampler>(
    sampler: &S,
    sampled: Vec<Sampled>,
    params: &SamplingParams,
    max_turns: usize,
    renderer: &dyn Renderer,
    policy_version: u64,
    bar: &PhaseBar,
) -> Result<Vec<Group>> {
    let running = RunningReward::default();
    let futures = sampled.into_iter().map(|s| {
        grade_group(
            sampler,
            s,
            params,
            max_turns,
            renderer,
            policy_version,
            bar,
            &running,
        )
    });
    join_all(futures).await.into_iter().collect()
}

/// The grade phase of one group: every episode run to the end concurrently. Env `i`'s
/// sampling call at turn `t` (every turn not sampled by the sample phase) uses the seed
/// `mix(group seed, i + 1, t)`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn grade_group<S: Sampler>(
    sampler: &S,
    sampled: Sampled,
    params: &SamplingParams,
    max_turns: usize,
    renderer: &dyn Renderer,
    policy_version: u64,
    bar: &PhaseBar,
    running: &RunningReward,
) -> Result<Group> {
    let Sampled {
        problem,
        envs,
        first,
        actions,
        seed,
    } = sampled;
    let prompt = first
        .first()
        .map(|o| o.input.clone())
        .unwrap_or_else(ModelInput::new);
    let episodes = envs
        .into_iter()
        .zip(first)
        .zip(actions)
        .enumerate()
        .map(|(i, ((mut env, ob), action))| {
            let problem = &problem;
            async move {
                let mut ob = ob;
                let mut action = action;
                let mut turns = Vec::new();
                let mut reward = 0.0;
                let mut metrics = BTreeMap::new();
                let mut reward_error = None;
                let mut parsed = None;
                for t in 0..max_turns {
                    let seq = match action.take() {
                        Some(s) => s,
                        None => {
                            let p = SamplingParams {
                                seed: Some(mix(seed, i as u64 + 1, t as u64)),
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
                    parsed = step.parsed;
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
                if let Some(e) = &reward_error {
                    tracing::warn!(problem = %problem.id, error = %e, "reward failed; counted as 0");
                }
                let last = turns
                    .last()
                    .map(|t: &Turn| &t.sequence)
                    .ok_or_else(|| Error::config("max_turns", "must be at least 1"))?;
                let stop_reason = last.stop_reason;
                let (message, termination) =
                    parsed.unwrap_or_else(|| renderer.parse_response(&last.tokens));
                // Live mean reward on the bar (failures count as 0).
                let (sum, n) = {
                    let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
                    r.0 += reward;
                    r.1 += 1;
                    *r
                };
                bar.set_message_with(|| format!("reward {:.3}", sum / n as f64));
                bar.inc(1);
                Ok(Completion {
                    stop_reason,
                    turns,
                    text: message.content.into_display_string(""),
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
    Ok(Group {
        problem,
        prompt,
        policy_version,
        completions,
    })
}
