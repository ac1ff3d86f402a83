//! Reward functions: grade a sampled response against a problem.
//!
//! Implement [`RewardFn`] for your own type, or pass a plain closure
//! `Fn(&Problem, &str) -> f64`:
//!
//! ```
//! use rlvr::{dataset::Problem, RewardFn};
//! let exact = |p: &Problem, text: &str| if text.trim() == p.answer { 1.0 } else { 0.0 };
//! fn takes_reward<R: RewardFn>(_: R) {}
//! takes_reward(exact);
//! ```
//!
//! For math problems, [`BoxedAnswer`](crate::BoxedAnswer) grades the last `\boxed{…}` of the response
//! ([`extract_boxed`], [`answers_equivalent`]) with the cookbook's plain 1/0 reward
//! ([`BoxedAnswer::correctness`](crate::BoxedAnswer::correctness)) or its format-aware 1 / 0.9 / 0 / −0.1 reward
//! ([`BoxedAnswer::format_aware`](crate::BoxedAnswer::format_aware)). [`GraderPool`] runs any reward off the async runtime
//! with a real timeout on a bounded set of threads (a hung reward is abandoned and counted;
//! too many hangs in a row are a fatal [`Error::RewardHung`](crate::Error::RewardHung)),
//! [`grade_with_timeout`] does so on the process-wide pool, and [`GradeStats`] counts failed,
//! timed-out and panicked grades.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::renderer::ParseTermination;
use crate::types::TokenId;

mod grade;
mod pool;

pub(crate) mod api;
pub(crate) mod boxed;
pub(crate) mod last_integer;
mod math;
mod overlong;

pub(crate) use api::RewardFn;
pub use boxed::{answers_equivalent, extract_boxed};
pub use grade::{GradeStats, grade_with_timeout};
pub use last_integer::{LastInteger, extract_last_integer};
pub use math::{MathAnswer, MathGrader, grade_math_answer};
pub use overlong::OverlongPenalty;
pub use pool::{DEFAULT_MAX_CONSECUTIVE_HANGS, GraderPool, MAX_GRADER_THREADS};

/// What a reward function sees of one sampled completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The parsed text content of the assistant message.
    pub text: String,
    /// How the response ended.
    pub termination: ParseTermination,
    /// The raw sampled tokens.
    pub tokens: Vec<TokenId>,
}

/// A grade: the total reward and named components (`correct`, `format`...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reward {
    /// The scalar reward used for advantages.
    pub total: f64,
    /// Named parts reported as metrics (`env/all/<name>`).
    pub components: BTreeMap<String, f64>,
}

impl Reward {
    /// A reward with no components.
    pub fn new(total: f64) -> Self {
        Reward {
            total,
            components: BTreeMap::new(),
        }
    }
    /// Adds a component (builder style).
    pub fn with(mut self, name: impl Into<String>, value: f64) -> Self {
        self.components.insert(name.into(), value);
        self
    }
}

impl From<f64> for Reward {
    fn from(total: f64) -> Self {
        Reward::new(total)
    }
}

/// Why a grade could not be produced. The trainer counts these (the sample gets reward 0);
/// they never stop training by themselves (too many timeouts in a row do: see
/// [`GraderPool`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RewardError {
    /// The reward function reported a failure.
    #[error("reward failed: {0}")]
    Failed(String),
    /// The reward function did not finish within the timeout.
    #[error("reward timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The reward function panicked.
    #[error("reward panicked: {0}")]
    Panicked(String),
}
