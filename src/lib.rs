//! # rlvr — reinforcement learning with verifiable rewards for language models
//!
//! GRPO post-training in Rust: sample groups of completions from a policy, grade them with
//! a reward function you write, and train on group-relative advantages, against the Tinker
//! service (feature `tinker`) or an embedded candle backend (feature `local`).
//!
//! The pieces are small traits composed by a generic trainer:
//! [`Renderer`] (conversation ⇄ tokens), [`RewardFn`] (grading), [`Dataset`] (problems),
//! [`PolicyBackend`] + [`Sampler`] (where sampling and training run).
//!
//! See `docs/architecture.md` for the layers and the data flow of one step.
#![warn(missing_docs)]

pub mod backend;
pub mod dataset;
pub mod error;
pub(crate) mod fsio;
#[cfg(feature = "hub")]
pub mod hub;
pub mod message;
pub(crate) mod python;
pub mod renderer;
pub mod report;
pub mod reward;
pub mod tokenizer;
pub mod trainer;
pub mod types;

pub use backend::{Pending, PolicyBackend, Sampler};
pub use dataset::{Dataset, Problem};
pub use error::{Error, Result};
pub use message::{Content, ContentPart, ToolCall, UnparsedToolCall};
pub use renderer::{ParseTermination, Renderer, RoleColon, TrainOnWhat};
pub use reward::{BoxedAnswer, Response, Reward, RewardError, RewardFn};
pub use tokenizer::Tokenizer;
pub use trainer::{GrpoTrainer, StepMetrics, TrainerConfig};
pub use types::*;

/// Re-export of [`async_trait`](https://docs.rs/async-trait) so custom [`RewardFn`],
/// [`Sampler`] and [`PolicyBackend`] implementations need no extra dependency:
/// `#[rlvr::async_trait]`.
pub use async_trait::async_trait;

/// Not public API: hooks for the crate's own crash tests.
#[doc(hidden)]
pub mod __private {
    pub use crate::fsio::{set_write_hook, WriteHook};
}

// The README's code blocks are compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
