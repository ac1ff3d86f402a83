//! # rlvr — reinforcement learning with verifiable rewards for language models
//!
//! GRPO post-training in Rust: sample groups of completions from a policy, grade them with
//! a reward function you write, and train on group-relative advantages, against the Tinker
//! service (feature `tinker`) or an embedded candle backend (feature `local`).
//!
//! The pieces are small traits composed by a generic trainer:
//! [`Renderer`] (conversation ⇄ tokens), [`RewardFn`] (grading), [`Dataset`] (problems),
//! [`PolicyBackend`] + [`Sampler`] (where sampling and training run), driven by
//! [`GrpoTrainer`] with a [`TrainerConfig`]. The defaults of the Tinker tutorial are here
//! too: the [`RoleColon`] renderer, the [`BoxedAnswer`] grader and the [`Gsm8k`] dataset.
//!
//! Everything else has one home, a module per concern:
//!
//! | module | what is in it |
//! |---|---|
//! | [`backend`] | [`Pending`](backend::Pending); the backends [`backend::tinker`] and [`backend::local`] |
//! | [`types`] | the data exchanged with a backend: [`ModelInput`](types::ModelInput), [`Datum`](types::Datum), [`SamplingParams`](types::SamplingParams), [`LossFn`](types::LossFn), [`LoraConfig`](types::LoraConfig)… |
//! | [`loss`] | custom losses run as Tinker's `forward_backward_custom`: [`CustomLoss`](loss::CustomLoss), [`forward_backward_custom`](loss::forward_backward_custom), GSPO, Dr. GRPO |
//! | [`message`] | conversations: [`Message`](message::Message), [`Role`](message::Role), content parts, tool calls |
//! | [`renderer`] | the renderer registry, [`MessageFormat`](renderer::MessageFormat), one module per model family |
//! | [`reward`] | [`Response`](reward::Response), [`Reward`](reward::Reward), bounded grading ([`GraderPool`](reward::GraderPool)) |
//! | [`dataset`] | [`Problem`](dataset::Problem), GSM8K options, synthetic word problems |
//! | [`trainer`] | the trainer's options, environments, evaluators, metrics |
//! | [`report`] | the run directory, progress, plots |
//! | [`tokenizer`] | [`Tokenizer`](tokenizer::Tokenizer) |
//! | [`weights`] | trained weights out: PEFT adapters, merged Hugging Face models (feature `weights`) |
//!
//! `use rlvr::prelude::*;` brings the traits and the types a typical program names.
//!
//! ```
//! use rlvr::prelude::*;
//!
//! // A reward is any `Fn(&Problem, &str) -> f64`, or a type implementing `RewardFn`.
//! let exact = |p: &Problem, text: &str| if text.trim() == p.answer { 1.0 } else { 0.0 };
//! fn takes_reward<R: RewardFn>(_: R) {}
//! takes_reward(exact);
//! ```
//!
//! See `docs/architecture.md` for the layers and the data flow of one step.
#![warn(missing_docs)]

pub mod backend;
pub mod dataset;
mod error;
pub(crate) mod fsio;
#[cfg(feature = "hub")]
pub mod hub;
pub mod loss;
pub mod message;
pub(crate) mod python;
pub mod renderer;
pub mod report;
pub mod reward;
pub mod tokenizer;
pub mod trainer;
pub mod types;
#[cfg(feature = "weights")]
pub mod weights;

pub use backend::api::{PolicyBackend, Sampler};
pub use dataset::api::Dataset;
pub use dataset::gsm8k::Gsm8k;
pub use error::{Error, Result, WeightsDownloadErrorKind};
pub use renderer::api::Renderer;
pub use renderer::role_colon::RoleColon;
pub use reward::api::RewardFn;
pub use reward::boxed::BoxedAnswer;
pub use trainer::config::TrainerConfig;
pub use trainer::grpo::GrpoTrainer;

/// Re-export of [`async_trait`](https://docs.rs/async-trait) so custom [`RewardFn`],
/// [`Sampler`] and [`PolicyBackend`] implementations need no extra dependency:
/// `#[rlvr::async_trait]`.
pub use async_trait::async_trait;

/// The traits and the types a typical program names, for `use rlvr::prelude::*`.
///
/// Each item here has its one home elsewhere (the crate root or a module); the prelude only
/// gathers them.
pub mod prelude {
    pub use crate::dataset::Problem;
    pub use crate::message::{Message, Role};
    pub use crate::renderer::{ParseTermination, TrainOnWhat};
    pub use crate::reward::{Response, Reward, RewardError};
    pub use crate::tokenizer::Tokenizer;
    pub use crate::types::{
        Datum, LoraConfig, LossFn, ModelInput, SampledSequence, SamplingParams, StopCondition,
        TokenId,
    };
    pub use crate::{
        BoxedAnswer, Dataset, Error, GrpoTrainer, Gsm8k, PolicyBackend, Renderer, Result, RewardFn,
        RoleColon, Sampler, TrainerConfig, async_trait,
    };
}

/// Not public API: hooks for the crate's own crash tests.
#[doc(hidden)]
pub mod __private {
    pub use crate::fsio::{WriteHook, set_write_hook};
}

// The README's code blocks are compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
