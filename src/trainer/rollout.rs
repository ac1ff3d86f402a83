//! What a rollout is made of: [`Turn`]s, graded [`Completion`]s (episodes) and the
//! [`Group`] of one problem — the data the [sample](super::sample) and
//! [grade](super::grade) phases produce and the later phases read.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::dataset::Problem;
use crate::renderer::ParseTermination;
use crate::reward::RewardError;
use crate::types::{ModelInput, SampledSequence, StopReason};

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
        let mut out = Vec::with_capacity(self.num_tokens());
        for t in &self.turns {
            out.extend_from_slice(&t.sequence.tokens);
        }
        out
    }
}

impl Group {
    /// The rewards of the group, in order.
    pub fn rewards(&self) -> Vec<f64> {
        self.completions.iter().map(|c| c.reward).collect()
    }
}

/// Whether a completion hit `max_tokens`.
pub(crate) fn truncated(c: &Completion) -> bool {
    c.stop_reason == StopReason::Length
}
