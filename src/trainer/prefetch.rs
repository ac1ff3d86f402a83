//! Batches sampled ahead (`max_steps_off_policy > 0`) in checkpoints.
//!
//! When the trainer samples ahead, a checkpoint taken after step `s` has rollouts for
//! steps `s+1…` in memory, sampled by the policy of earlier steps. Sampling them again on
//! resume would use another policy and change the run, so a checkpoint saves them
//! (`prefetched/<name>.json` in the run directory, written atomically before the checkpoint
//! record) and a resume puts them back in the queue: a resumed run trains on exactly the
//! batches the uninterrupted run would have.
//!
//! Every float is stored as its bit pattern (`f32::to_bits` / `f64::to_bits`): JSON text
//! round trips are not guaranteed bit-exact, and the sampler's logprobs enter the loss.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::dataset::Problem;
use crate::error::{Error, Result};
use crate::renderer::ParseTermination;
use crate::reward::RewardError;
use crate::types::{ModelInput, SampledSequence, StopReason};

use super::rollout::{Completion, Group, Turn};
use super::sample::Rollout;

/// The format tag of a prefetched-rollouts file. Version 2 added each rollout's kept groups
/// and rounds (dynamic sampling); a version-1 file (written before) reads as rollouts without
/// dynamic sampling, and a version-1 reader refuses version 2 rather than train on groups
/// that were not kept.
const FORMAT: &str = "rlvr-prefetched/2";
/// The format tag of files written before dynamic sampling (still read).
const FORMAT_V1: &str = "rlvr-prefetched/1";

#[derive(Serialize, Deserialize)]
struct File {
    format: String,
    rollouts: Vec<SavedRollout>,
}

#[derive(Serialize, Deserialize)]
struct SavedRollout {
    step: u64,
    time_sampling: f64,
    time_grading: f64,
    groups: Vec<SavedGroup>,
    /// The indices of the kept groups (dynamic sampling); absent without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kept: Option<Vec<usize>>,
    /// Extra rounds of dynamic sampling.
    #[serde(default)]
    rounds: usize,
}

#[derive(Serialize, Deserialize)]
struct SavedGroup {
    problem: Problem,
    prompt: ModelInput,
    policy_version: u64,
    completions: Vec<SavedCompletion>,
}

#[derive(Serialize, Deserialize)]
struct SavedCompletion {
    turns: Vec<SavedTurn>,
    stop_reason: StopReason,
    text: String,
    termination: ParseTermination,
    reward_bits: u64,
    component_bits: BTreeMap<String, u64>,
    reward_error: Option<SavedRewardError>,
}

#[derive(Serialize, Deserialize)]
struct SavedTurn {
    observation: ModelInput,
    tokens: Vec<crate::types::TokenId>,
    logprob_bits: Vec<u32>,
    stop_reason: StopReason,
    sequence_id: Option<String>,
}

#[derive(Serialize, Deserialize)]
enum SavedRewardError {
    Failed(String),
    Timeout { secs: u64, nanos: u32 },
    Panicked(String),
}

impl From<&RewardError> for SavedRewardError {
    fn from(e: &RewardError) -> Self {
        match e {
            RewardError::Failed(m) => SavedRewardError::Failed(m.clone()),
            RewardError::Timeout(d) => SavedRewardError::Timeout {
                secs: d.as_secs(),
                nanos: d.subsec_nanos(),
            },
            RewardError::Panicked(m) => SavedRewardError::Panicked(m.clone()),
        }
    }
}

impl From<SavedRewardError> for RewardError {
    fn from(e: SavedRewardError) -> Self {
        match e {
            SavedRewardError::Failed(m) => RewardError::Failed(m),
            SavedRewardError::Timeout { secs, nanos } => {
                RewardError::Timeout(Duration::new(secs, nanos))
            }
            SavedRewardError::Panicked(m) => RewardError::Panicked(m),
        }
    }
}

fn save_rollout(r: &Rollout) -> SavedRollout {
    SavedRollout {
        step: r.step,
        time_sampling: r.time_sampling,
        time_grading: r.time_grading,
        kept: r.kept.clone(),
        rounds: r.rounds,
        groups: r
            .groups
            .iter()
            .map(|g| SavedGroup {
                problem: (*g.problem).clone(),
                prompt: g.prompt.clone(),
                policy_version: g.policy_version,
                completions: g
                    .completions
                    .iter()
                    .map(|c| SavedCompletion {
                        turns: c
                            .turns
                            .iter()
                            .map(|t| SavedTurn {
                                observation: t.observation.clone(),
                                tokens: t.sequence.tokens.clone(),
                                logprob_bits: t
                                    .sequence
                                    .logprobs
                                    .iter()
                                    .map(|l| l.to_bits())
                                    .collect(),
                                stop_reason: t.sequence.stop_reason,
                                sequence_id: t.sequence.sequence_id.clone(),
                            })
                            .collect(),
                        stop_reason: c.stop_reason,
                        text: c.text.clone(),
                        termination: c.termination,
                        reward_bits: c.reward.to_bits(),
                        component_bits: c
                            .components
                            .iter()
                            .map(|(k, v)| (k.clone(), v.to_bits()))
                            .collect(),
                        reward_error: c.reward_error.as_ref().map(SavedRewardError::from),
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn load_rollout(r: SavedRollout) -> Rollout {
    Rollout {
        step: r.step,
        time_sampling: r.time_sampling,
        time_grading: r.time_grading,
        kept: r.kept,
        rounds: r.rounds,
        groups: r
            .groups
            .into_iter()
            .map(|g| Group {
                problem: Arc::new(g.problem),
                prompt: g.prompt,
                policy_version: g.policy_version,
                completions: g
                    .completions
                    .into_iter()
                    .map(|c| Completion {
                        turns: c
                            .turns
                            .into_iter()
                            .map(|t| Turn {
                                observation: t.observation,
                                sequence: SampledSequence {
                                    tokens: t.tokens,
                                    logprobs: t
                                        .logprob_bits
                                        .into_iter()
                                        .map(f32::from_bits)
                                        .collect(),
                                    stop_reason: t.stop_reason,
                                    sequence_id: t.sequence_id,
                                },
                            })
                            .collect(),
                        stop_reason: c.stop_reason,
                        text: c.text,
                        termination: c.termination,
                        reward: f64::from_bits(c.reward_bits),
                        components: c
                            .component_bits
                            .into_iter()
                            .map(|(k, v)| (k, f64::from_bits(v)))
                            .collect(),
                        reward_error: c.reward_error.map(RewardError::from),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Writes `rollouts` to `path` atomically (creating its directory).
pub(crate) fn save<'a>(path: &Path, rollouts: impl Iterator<Item = &'a Rollout>) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating directory", dir, e))?;
    }
    let file = File {
        format: FORMAT.to_string(),
        rollouts: rollouts.map(save_rollout).collect(),
    };
    let bytes = serde_json::to_vec(&file)
        .map_err(|e| Error::io("serializing", path, std::io::Error::other(e)))?;
    crate::fsio::write_atomic(path, &bytes)
}

/// Reads the rollouts saved at `path`, checking that each is for a step in
/// `from_step..total_steps`.
pub(crate) fn load(path: &Path, from_step: u64, total_steps: u64) -> Result<Vec<Rollout>> {
    let bad = |message: String| Error::Checkpoint {
        path: path.display().to_string(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|e| {
        bad(format!(
            "the batches this checkpoint sampled ahead cannot be read: {e}"
        ))
    })?;
    let file: File = serde_json::from_slice(&bytes)
        .map_err(|e| bad(format!("invalid prefetched-rollouts file: {e}")))?;
    if file.format != FORMAT && file.format != FORMAT_V1 {
        return Err(bad(format!(
            "format `{}`, expected `{FORMAT}` or `{FORMAT_V1}`",
            file.format
        )));
    }
    let rollouts: Vec<Rollout> = file.rollouts.into_iter().map(load_rollout).collect();
    for r in &rollouts {
        if let Some(i) = r.kept.iter().flatten().find(|&&i| i >= r.groups.len()) {
            return Err(bad(format!(
                "the batch of step {} keeps group {i} of {}",
                r.step,
                r.groups.len()
            )));
        }
    }
    if let Some(r) = rollouts
        .iter()
        .find(|r| r.step < from_step || r.step >= total_steps)
    {
        return Err(bad(format!(
            "holds the batch of step {}, outside the steps left ({from_step}..{total_steps})",
            r.step
        )));
    }
    Ok(rollouts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollouts_round_trip_bit_exactly() {
        let problem = Arc::new(Problem::new("p", "q?", "4"));
        let seq = SampledSequence {
            tokens: vec![1, 2, 3],
            logprobs: vec![-0.1f32, -1.0e-38, f32::MIN_POSITIVE * -0.5],
            stop_reason: StopReason::Stop,
            sequence_id: None,
        };
        let completion = Completion {
            turns: vec![Turn {
                observation: ModelInput::from_tokens(vec![7, 8]),
                sequence: seq,
            }],
            stop_reason: StopReason::Stop,
            text: "4".into(),
            termination: ParseTermination::StopSequence,
            reward: 0.1 + 0.2,
            components: BTreeMap::from([("format".to_string(), 1.0 / 3.0)]),
            reward_error: Some(RewardError::Timeout(Duration::from_millis(1500))),
        };
        let group = Group {
            problem,
            prompt: ModelInput::from_tokens(vec![7, 8]),
            policy_version: 3,
            completions: vec![completion.clone()],
        };
        let rollout = Rollout {
            step: 5,
            time_sampling: 0.5,
            time_grading: 0.25,
            groups: vec![group.clone(), group],
            kept: Some(vec![1]),
            rounds: 1,
        };
        let dir = std::env::temp_dir().join(format!("rlvr-prefetch-{}", std::process::id()));
        let path = dir.join("prefetched").join("000004.json");
        save(&path, [&rollout].into_iter()).unwrap();
        let back = load(&path, 4, 10).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].step, 5);
        assert_eq!(back[0].groups[0].policy_version, 3);
        let c = &back[0].groups[0].completions[0];
        assert_eq!(c, &completion);
        let bits = |c: &Completion| c.logprobs().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(c), bits(&completion));
        assert_eq!((back[0].kept.clone(), back[0].rounds), (Some(vec![1]), 1));
        assert!(matches!(load(&path, 6, 10), Err(Error::Checkpoint { .. })));
        assert!(matches!(load(&path, 0, 5), Err(Error::Checkpoint { .. })));

        // A file written before dynamic sampling (version 1: no `kept`, no `rounds`) reads
        // as rollouts without it.
        let mut doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        doc["format"] = "rlvr-prefetched/1".into();
        let saved = doc["rollouts"][0].as_object_mut().unwrap();
        saved.remove("kept");
        saved.remove("rounds");
        std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
        let old = load(&path, 4, 10).unwrap();
        assert_eq!((old[0].kept.clone(), old[0].rounds), (None, 0));
        assert_eq!(old[0].groups.len(), 2);
        // An unknown format, and a kept index past the groups, are refused.
        doc["format"] = "rlvr-prefetched/9".into();
        std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
        assert!(matches!(load(&path, 4, 10), Err(Error::Checkpoint { .. })));
        doc["format"] = "rlvr-prefetched/2".into();
        doc["rollouts"][0]["kept"] = serde_json::json!([2]);
        std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
        assert!(matches!(load(&path, 4, 10), Err(Error::Checkpoint { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
