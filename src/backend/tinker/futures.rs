//! Promises and the `retrieve_future` long-poll.

use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;

use super::http::{Call, Http, billing_within_window, decode_json};
use crate::error::{Error, Result};

/// The `X-Tinker-Request-Type` of a future.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestType {
    CreateModel,
    ForwardBackward,
    Forward,
    OptimStep,
    SaveWeights,
    SaveWeightsForSampler,
    SaveWeightsExternal,
    LoadWeights,
    Sample,
}

impl RequestType {
    fn header(self) -> &'static str {
        match self {
            RequestType::CreateModel => "CreateModel",
            RequestType::ForwardBackward => "ForwardBackward",
            RequestType::Forward => "Forward",
            RequestType::OptimStep => "OptimStep",
            RequestType::SaveWeights => "SaveWeights",
            RequestType::SaveWeightsForSampler => "SaveWeightsForSampler",
            RequestType::SaveWeightsExternal => "SaveWeightsExternal",
            RequestType::LoadWeights => "LoadWeights",
            RequestType::Sample => "Sample",
        }
    }
    /// Results of these types come back as protobuf.
    pub fn is_protobuf(self) -> bool {
        matches!(
            self,
            RequestType::ForwardBackward | RequestType::Forward | RequestType::Sample
        )
    }
}

/// The answer to a request that returns a promise (`UntypedAPIFuture`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Promise {
    pub request_id: String,
    #[serde(default)]
    pub model_id: Option<String>,
    /// One id per sample (asample only). Optional: some servers do not send it.
    #[serde(default)]
    pub sample_sequence_ids: Option<Vec<String>>,
}

/// What to wait for.
#[derive(Debug, Clone)]
pub(crate) struct FutureSpec {
    pub request_id: String,
    pub request_type: RequestType,
    /// Time from building the submission to receiving its promise.
    pub roundtrip: Duration,
    pub sdk_method: &'static str,
    /// Names the request in errors, e.g. `forward_backward (seq 3)`.
    pub label: String,
}

/// Polls `retrieve_future` until the result is there; returns the result body (protobuf
/// bytes for ForwardBackward/Forward/Sample, JSON bytes otherwise).
///
/// Classification and status handling follow SDK 0.38: protobuf content type → success;
/// `try_again` → poll again at once; `complete_metadata` → poll again with
/// `allow_metadata_only: false`; `{"error", "category"}` → [`Error::RequestFailed`]; other
/// JSON → success. 408 and 5xx → poll again at once; 429 and connection errors → back off
/// `min(2^n, 30)` s; 400 → up to 3 times in a row; 402 → wait 5 s within the billing window;
/// 410 and other 4xx → an [`Error::Http`].
pub(crate) async fn retrieve(http: &Http, spec: &FutureSpec) -> Result<Bytes> {
    let mut iteration: u64 = 0;
    let mut allow_metadata_only = true;
    let mut backoff_n: u32 = 0;
    let mut bad_requests: u32 = 0;
    let (mut billing_since, mut billing_last) = (None, None);
    loop {
        let body = serde_json::json!({
            "request_id": spec.request_id,
            "allow_metadata_only": allow_metadata_only,
        });
        let mut call = Call::post_json(http, "retrieve_future", &body)?
            .retries(0)
            .timeout(http.poll_timeout)
            .sdk(spec.sdk_method)
            .header("x-tinker-request-iteration", iteration.to_string())
            .header("x-tinker-request-type", spec.request_type.header());
        if iteration == 0 {
            call = call.header(
                "x-tinker-create-promise-roundtrip-time",
                format!("{}", spec.roundtrip.as_secs_f64()),
            );
        }
        call = call.header("x-stainless-raw-response", "raw");
        if spec.request_type.is_protobuf() {
            call.accept = "application/x-protobuf";
        }
        iteration += 1;
        let resp = match http.send_raw(&call).await {
            Ok(r) => r,
            Err(Error::Transport { message, .. }) => {
                backoff_n += 1;
                let d = http.backoff(Duration::from_secs(
                    2u64.pow((backoff_n - 1).min(5)).min(30),
                ));
                tracing::debug!("{}: poll failed ({message}); retrying in {d:?}", spec.label);
                tokio::time::sleep(d).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        match resp.status {
            200..=299 => {
                backoff_n = 0;
                bad_requests = 0;
                if resp.is_protobuf() {
                    if !spec.request_type.is_protobuf() {
                        return Err(Error::Decode {
                            what: format!("{} result", spec.label),
                            message: "unexpected protobuf result for a JSON request type".into(),
                            raw: resp.body.to_vec(),
                        });
                    }
                    return Ok(resp.body);
                }
                let v: serde_json::Value =
                    decode_json(&resp.body, format_args!("{} result", spec.label))?;
                if v.get("type").and_then(|t| t.as_str()) == Some("try_again") {
                    if let Some(state) = v.get("queue_state").and_then(|s| s.as_str())
                        && state != "active"
                    {
                        tracing::debug!("{}: queue state {state}", spec.label);
                    }
                    continue;
                }
                if v.get("status").and_then(|t| t.as_str()) == Some("complete_metadata") {
                    allow_metadata_only = false;
                    continue;
                }
                if let Some(err) = v.get("error") {
                    let message = match err {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let category = v
                        .get("category")
                        .and_then(|c| c.as_str())
                        .unwrap_or("unknown")
                        .to_string();
                    return Err(Error::RequestFailed {
                        request: spec.label.clone(),
                        category,
                        message,
                    });
                }
                if spec.request_type.is_protobuf() {
                    return Err(Error::Decode {
                        what: format!("{} result", spec.label),
                        message: "expected a protobuf result, got JSON (server predates protobuf results)".into(),
                        raw: resp.body.to_vec(),
                    });
                }
                return Ok(resp.body);
            }
            408 | 500..=599 => {
                backoff_n = 0;
                continue;
            }
            429 => {
                backoff_n += 1;
                let d = http.backoff(Duration::from_secs(
                    2u64.pow((backoff_n - 1).min(5)).min(30),
                ));
                tokio::time::sleep(d).await;
                continue;
            }
            400 if bad_requests < 3 => {
                backoff_n = 0;
                bad_requests += 1;
                continue;
            }
            402 if billing_within_window(&mut billing_since, &mut billing_last) => {
                backoff_n = 0;
                tokio::time::sleep(http.backoff(Duration::from_secs(5))).await;
                continue;
            }
            status => {
                return Err(Error::Http {
                    method: "POST".into(),
                    endpoint: format!("/api/v1/retrieve_future ({})", spec.label),
                    status,
                    body: resp.body_text(),
                });
            }
        }
    }
}
