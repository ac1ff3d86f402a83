//! Tinker backend: remote LoRA training and sampling over the Tinker HTTP API, speaking the
//! wire protocol of the official Python SDK 0.38 (JSON + protobuf + zstd, long-polled
//! futures, per-model `seq_id` ordering, the SDK's retry and idempotency rules).
//!
//! Entry point: [`TinkerClient::connect`] with a [`TinkerConfig`], then
//! [`TinkerClient::create_lora_training`] for a [`TinkerBackend`] (a
//! [`PolicyBackend`](crate::PolicyBackend)) whose samplers are [`TinkerSampler`]s.
//! Trained weights: [`TinkerBackend::save_weights_external`] exports them,
//! [`download_weights`] downloads them (`docs/weights.md`), [`TinkerRestClient`] manages
//! checkpoints. See `docs/tinker.md`.

mod client;
mod config;
mod download;
mod futures;
mod http;
#[cfg(test)]
mod properties;
pub mod proto;
mod rest;
mod sampling;
mod session;
mod training;

pub use client::{SupportedModel, TinkerClient};
pub use config::{DEFAULT_BASE_URL, SDK_VERSION, Secret, TinkerConfig};
pub use download::{DownloadOptions, download_weights};
pub use rest::{CheckpointKind, ExternalWeightsUrls, TinkerPath, TinkerRestClient};
pub use sampling::TinkerSampler;
pub use session::{GetInfoResponse, ModelData};
pub use training::{TinkerBackend, TinkerBackendOptions};

/// Entry points for the fuzz targets in `fuzz/` to the crate-private response decoders.
/// Built only under `--cfg fuzzing` (which `cargo fuzz` sets); not part of the API.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzz_hooks {
    /// Decodes `body` as a protobuf `SampleResponse`, as a sampling call does.
    pub fn decode_sample_response(body: &[u8]) -> bool {
        super::sampling::decode_sample_response(&bytes::Bytes::copy_from_slice(body), "fuzz", None)
            .is_ok()
    }

    /// Decodes `body` as a protobuf `ForwardBackwardOutput`, as a training call does.
    pub fn decode_forward_backward(body: &[u8]) -> bool {
        super::training::decode_forward_backward(&bytes::Bytes::copy_from_slice(body), "fuzz")
            .is_ok()
    }

    /// Decodes `body` as JSON responses the client reads.
    pub fn decode_json(body: &[u8]) -> bool {
        let info = super::http::decode_json::<super::GetInfoResponse>(body, "fuzz").is_ok();
        let value = super::http::decode_json::<serde_json::Value>(body, "fuzz").is_ok();
        info || value
    }
}
