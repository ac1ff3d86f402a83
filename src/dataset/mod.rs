//! Datasets of problems with verifiable answers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::types::Message;

pub mod word_problems;
pub use word_problems::WordProblems;

/// One problem: the conversation to prompt with and the reference answer to grade against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// A stable id (e.g. `gsm8k/train/17`).
    pub id: String,
    /// The bare question.
    pub question: String,
    /// The reference answer (e.g. the number after `####`).
    pub answer: String,
    /// The conversation rendered as the prompt (few-shot prefix, question with suffix).
    pub messages: Vec<Message>,
    /// Anything else a reward function may need.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, serde_json::Value>,
}

impl Problem {
    /// A problem whose prompt is the question as a single user message.
    pub fn new(
        id: impl Into<String>,
        question: impl Into<String>,
        answer: impl Into<String>,
    ) -> Self {
        let question = question.into();
        Problem {
            id: id.into(),
            messages: vec![Message::user(question.clone())],
            question,
            answer: answer.into(),
            metadata: BTreeMap::new(),
        }
    }
}

/// An indexed collection of problems.
pub trait Dataset: Send + Sync {
    /// Number of problems.
    fn len(&self) -> usize;
    /// Whether there are no problems.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The problem at `index` (`0..len()`).
    fn get(&self, index: usize) -> Result<Problem>;
}

impl Dataset for Vec<Problem> {
    fn len(&self) -> usize {
        <[Problem]>::len(self)
    }
    fn get(&self, index: usize) -> Result<Problem> {
        self.as_slice().get(index).cloned().ok_or_else(|| {
            crate::Error::config(
                "index",
                format!(
                    "problem {index} out of range (dataset has {})",
                    <[Problem]>::len(self)
                ),
            )
        })
    }
}
