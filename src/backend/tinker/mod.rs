//! Tinker backend: remote LoRA training and sampling over the Tinker HTTP API, speaking the
//! wire protocol of the official Python SDK 0.38 (JSON + protobuf + zstd, long-polled
//! futures, per-model `seq_id` ordering, the SDK's retry and idempotency rules).
//!
//! Entry point: [`TinkerClient::connect`] with a [`TinkerConfig`], then
//! [`TinkerClient::create_lora_training`] for a [`TinkerBackend`] (a
//! [`PolicyBackend`](crate::PolicyBackend)) whose samplers are [`TinkerSampler`]s.
//! See `docs/tinker.md`.

mod client;
mod config;
mod futures;
mod http;
#[cfg(test)]
mod properties;
pub mod proto;
mod sampling;
mod session;
mod training;

pub use client::{SupportedModel, TinkerClient};
pub use config::{Secret, TinkerConfig, DEFAULT_BASE_URL, SDK_VERSION};
pub use sampling::TinkerSampler;
pub use session::{GetInfoResponse, ModelData};
pub use training::{TinkerBackend, TinkerBackendOptions};
