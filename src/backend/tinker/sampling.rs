//! [`TinkerSampler`]: sampling from a Tinker sampling session.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use prost::Message;
use serde::Serialize;

use super::futures::{FutureSpec, Promise, RequestType, retrieve};
use super::http::{Call, billing_within_window, decode_json, http_backoff, is_holder_retryable};
use super::proto;
use super::session::Session;
use crate::backend::Sampler;
use crate::error::{Error, Result};
use crate::types::{
    Chunk, ModelInput, SampledSequence, SamplingParams, StopCondition, StopReason, TokenId,
};

/// Give up on a sample when nothing succeeded for this long (the SDK's stuck detection).
const STUCK_AFTER: Duration = Duration::from_secs(7200);

/// A sampler over one Tinker sampling session (a weights snapshot or a base model).
///
/// Each sample attempt takes the next `seq_id` of this sampler (from 0). A `429` on
/// `asample` is back-pressure: every sampler of the session waits 1 s (5 s for prompts over
/// 128 KiB) and the request is sent again with the same `seq_id`; for 10 s afterwards at
/// most 10 submissions are in flight (400 otherwise). Failed attempts
/// (connection errors, 408/409/410/429/5xx) are re-submitted with a new `seq_id` after
/// `min(0.5·2^n, 10)` s ± 25 %.
pub struct TinkerSampler {
    session: Arc<Session>,
    sampling_session_id: String,
    next_seq: AtomicU64,
}

impl std::fmt::Debug for TinkerSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerSampler")
            .field("sampling_session_id", &self.sampling_session_id)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum StopJson<'a> {
    Strings(&'a [String]),
    Tokens(&'a [TokenId]),
}

#[derive(Serialize)]
struct SamplingParamsJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop: Option<StopJson<'a>>,
    temperature: f32,
    top_k: i32,
    top_p: f32,
}

/// An `asample` request. Its JSON is what `serde_json` writes for the fields in this order,
/// `prompt` being `{"chunks":[{"tokens":[…],"type":"encoded_text"},…]}`
/// ([`to_json`](Self::to_json); tested against `serde_json`).
struct SampleRequest<'a> {
    num_samples: usize,
    prompt: &'a ModelInput,
    tail: SampleRequestTail<'a>,
}

/// The fields of a [`SampleRequest`] after its prompt.
#[derive(Serialize)]
struct SampleRequestTail<'a> {
    sampling_params: SamplingParamsJson<'a>,
    sampling_session_id: &'a str,
    seq_id: u64,
    prompt_logprobs: bool,
    topk_prompt_logprobs: u32,
    topk_sample_logprobs: u32,
    prompt_alt_tokens_k: u32,
    record_stability_info: bool,
    #[serde(rename = "type")]
    kind: &'static str,
}

impl SampleRequest<'_> {
    /// The request's JSON body. The prompt's ids are written in one loop: `serde`'s path
    /// for a sequence (a separator, a formatter call and a write per element) cost ≈ 70
    /// instructions an id, ≈ 0.3 M a tutorial step; the other fields go through
    /// `serde_json`.
    fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(384 + 7 * self.prompt.len());
        let mut num = itoa::Buffer::new();
        out.extend_from_slice(b"{\"num_samples\":");
        out.extend_from_slice(num.format(self.num_samples).as_bytes());
        out.extend_from_slice(b",\"prompt\":{\"chunks\":[");
        for (i, chunk) in self.prompt.chunks().iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match chunk {
                Chunk::EncodedText { tokens } => {
                    out.extend_from_slice(b"{\"tokens\":[");
                    if let Some((first, rest)) = tokens.split_first() {
                        out.extend_from_slice(num.format(*first).as_bytes());
                        for &t in rest {
                            out.push(b',');
                            out.extend_from_slice(num.format(t).as_bytes());
                        }
                    }
                    out.extend_from_slice(b"],\"type\":\"encoded_text\"}");
                }
            }
        }
        out.extend_from_slice(b"]}");
        // The tail's object without its `{`, after a comma.
        let at = out.len();
        serde_json::to_writer(&mut out, &self.tail)?;
        out[at] = b',';
        Ok(out)
    }
}

fn sampling_params_json(p: &SamplingParams) -> Result<SamplingParamsJson<'_>> {
    for (name, v) in [("temperature", p.temperature), ("top_p", p.top_p)] {
        if !v.is_finite() {
            return Err(Error::config(
                format!("sampling_params.{name}"),
                "must be finite",
            ));
        }
    }
    Ok(SamplingParamsJson {
        max_tokens: p.max_tokens,
        seed: p.seed,
        stop: p.stop.as_ref().map(|s| match s {
            StopCondition::Strings(v) => StopJson::Strings(v),
            StopCondition::Tokens(v) => StopJson::Tokens(v),
        }),
        temperature: p.temperature,
        top_k: p.top_k,
        top_p: p.top_p,
    })
}

/// Decodes a protobuf `SampleResponse` into sequences (ids stamped from the promise). The
/// message's token and logprob bytes are slices of `body` (not copies).
pub(crate) fn decode_sample_response(
    body: &Bytes,
    what: impl std::fmt::Display,
    ids: Option<&[String]>,
) -> Result<(Vec<SampledSequence>, proto::SampleResponse)> {
    let err = |m: String| Error::Decode {
        what: what.to_string(),
        message: m,
        raw: body.to_vec(),
    };
    let msg = proto::SampleResponse::decode(body.clone()).map_err(|e| err(e.to_string()))?;
    let ids = ids.filter(|ids| ids.len() == msg.sequences.len());
    let mut out = Vec::with_capacity(msg.sequences.len());
    for (i, s) in msg.sequences.iter().enumerate() {
        // The wire's ids are `int32`: read as `u32`, a negative one is above `i32::MAX`.
        let tokens = proto::parse_u32_le(&s.tokens)
            .ok_or_else(|| err(format!("sequence {i}: token bytes not a multiple of 4")))?;
        if let Some(&t) = tokens.iter().find(|&&t| i32::try_from(t).is_err()) {
            return Err(err(format!(
                "sequence {i}: negative token id {}",
                t.cast_signed()
            )));
        }
        let logprobs = match &s.logprobs {
            Some(b) => proto::parse_f32_le(b)
                .ok_or_else(|| err(format!("sequence {i}: logprob bytes not a multiple of 4")))?,
            None => return Err(err(format!("sequence {i}: no logprobs"))),
        };
        if logprobs.len() != tokens.len() {
            return Err(err(format!(
                "sequence {i}: {} tokens but {} logprobs",
                tokens.len(),
                logprobs.len()
            )));
        }
        let stop_reason = match proto::StopReason::try_from(s.stop_reason) {
            Ok(proto::StopReason::Length) => StopReason::Length,
            Ok(proto::StopReason::Stop) => StopReason::Stop,
            Err(_) => {
                return Err(err(format!(
                    "sequence {i}: unknown stop reason {}",
                    s.stop_reason
                )));
            }
        };
        out.push(SampledSequence {
            tokens,
            logprobs,
            stop_reason,
            sequence_id: ids.and_then(|ids| ids.get(i).cloned()),
        });
    }
    Ok((out, msg))
}

fn sample_retryable(e: &Error) -> bool {
    match e {
        Error::Http { status: 410, .. } => true,
        other => is_holder_retryable(other),
    }
}

impl TinkerSampler {
    pub(crate) fn new(session: Arc<Session>, sampling_session_id: String) -> Self {
        TinkerSampler {
            session,
            sampling_session_id,
            next_seq: AtomicU64::new(0),
        }
    }

    /// The sampling session id (`<session>:sample:<n>`).
    pub fn sampling_session_id(&self) -> &str {
        &self.sampling_session_id
    }

    async fn wait_backpressure(&self) {
        loop {
            let deadline = self.session.sample_backoff.lock().ok().and_then(|g| *g);
            match deadline {
                Some(d) if d > Instant::now() => {
                    let left = d - Instant::now();
                    tokio::time::sleep(left.min(Duration::from_secs(1))).await;
                }
                _ => return,
            }
        }
    }

    fn set_backpressure(&self, prompt_tokens: usize) {
        // The SDK estimates 10 bytes per token.
        let wait = self
            .session
            .http
            .backoff(if prompt_tokens * 10 > 128 * 1024 {
                Duration::from_secs(5)
            } else {
                Duration::from_secs(1)
            });
        if let Ok(mut g) = self.session.sample_backoff.lock() {
            let d = Instant::now() + wait;
            if g.is_none_or(|old| old < d) {
                *g = Some(d);
            }
        }
    }

    /// One attempt: submit `asample` (429 → wait and resend with the same seq_id) and poll.
    async fn attempt(
        &self,
        prompt: &ModelInput,
        num_samples: usize,
        params: &SamplingParams,
        prompt_logprobs: bool,
        sdk: &'static str,
    ) -> Result<(Vec<SampledSequence>, proto::SampleResponse)> {
        let http = &self.session.http;
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        let req = SampleRequest {
            num_samples,
            prompt,
            tail: SampleRequestTail {
                sampling_params: sampling_params_json(params)?,
                sampling_session_id: &self.sampling_session_id,
                seq_id: seq,
                prompt_logprobs,
                topk_prompt_logprobs: 0,
                topk_sample_logprobs: 0,
                prompt_alt_tokens_k: 0,
                record_stability_info: false,
                kind: "sample",
            },
        }
        .to_json()
        .map_err(|e| Error::Backend(format!("serializing request: {e}")))?;
        let req = bytes::Bytes::from(req);
        let label = format!("sample ({} seq {seq})", self.sampling_session_id);
        let start = Instant::now();
        let mut holder_attempt = 0u32;
        let (mut billing_since, mut billing_last) = (None, None);
        let (promise, rt) = loop {
            self.wait_backpressure().await;
            let closed = || Error::Cancelled("the Tinker session is closed".into());
            let _submit = self
                .session
                .submit_slots
                .acquire()
                .await
                .map_err(|_| closed())?;
            // Within 10 s after a back-off deadline, at most 10 submissions at a time.
            let throttled = self
                .session
                .sample_backoff
                .lock()
                .ok()
                .and_then(|g| *g)
                .is_some_and(|d| Instant::now() < d + Duration::from_secs(10));
            let _throttle = if throttled {
                Some(
                    self.session
                        .throttle_slots
                        .acquire()
                        .await
                        .map_err(|_| closed())?,
                )
            } else {
                None
            };
            let t0 = Instant::now();
            let call = Call::post_json_bytes(http, "asample", req.clone())
                .retries(0)
                .sdk(sdk)
                .header("x-tinker-sampling-backpressure", "1");
            match http.send(call).await {
                Ok(resp) => {
                    let p: Promise = decode_json(&resp.body, format_args!("{label} promise"))?;
                    break (p, t0.elapsed());
                }
                Err(Error::Http { status: 429, .. }) => {
                    self.set_backpressure(prompt.len());
                }
                Err(Error::Http { status: 402, .. })
                    if billing_within_window(&mut billing_since, &mut billing_last) =>
                {
                    self.set_backpressure(prompt.len());
                }
                Err(e) if is_holder_retryable(&e) => {
                    let delay =
                        http.backoff(Duration::from_secs(2u64.pow(holder_attempt.min(5)).min(30)));
                    if start.elapsed() + delay > Duration::from_secs(300) {
                        return Err(e);
                    }
                    tokio::time::sleep(delay).await;
                    holder_attempt += 1;
                }
                Err(e) => return Err(e),
            }
        };
        let spec = FutureSpec {
            request_id: promise.request_id.clone(),
            request_type: RequestType::Sample,
            roundtrip: rt,
            sdk_method: sdk,
            label: label.clone(),
        };
        let body = retrieve(http, &spec).await?;
        decode_sample_response(
            &body,
            format_args!("{label} result"),
            promise.sample_sequence_ids.as_deref(),
        )
    }

    /// Retries whole attempts with a new seq_id (the SDK's sampling retry handler).
    async fn with_sample_retries(
        &self,
        prompt: &ModelInput,
        num_samples: usize,
        params: &SamplingParams,
        prompt_logprobs: bool,
        sdk: &'static str,
    ) -> Result<(Vec<SampledSequence>, proto::SampleResponse)> {
        if prompt.is_empty() {
            return Err(Error::config("prompt", "the prompt is empty"));
        }
        let _slot = self
            .session
            .sample_slots
            .acquire()
            .await
            .map_err(|_| Error::Cancelled("the Tinker session is closed".into()))?;
        let start = Instant::now();
        let mut attempt = 0u32;
        loop {
            match self
                .attempt(prompt, num_samples, params, prompt_logprobs, sdk)
                .await
            {
                Ok(r) => return Ok(r),
                Err(e)
                    if !self.session.server.sample_no_retries
                        && sample_retryable(&e)
                        && (!self.session.server.sample_enable_stuck_detection
                            || start.elapsed() < STUCK_AFTER) =>
                {
                    let d = self
                        .session
                        .http
                        .backoff(http_backoff(attempt).min(Duration::from_secs(10)));
                    tracing::debug!("sampling attempt failed ({e}); retrying in {d:?}");
                    tokio::time::sleep(d).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[async_trait]
impl Sampler for TinkerSampler {
    async fn sample(
        &self,
        prompt: &ModelInput,
        num_samples: usize,
        params: &SamplingParams,
    ) -> Result<Vec<SampledSequence>> {
        if num_samples == 0 {
            return Ok(Vec::new());
        }
        let (seqs, _) = self
            .with_sample_retries(prompt, num_samples, params, false, "SamplingClient.sample")
            .await?;
        Ok(seqs)
    }

    async fn compute_logprobs(&self, input: &ModelInput) -> Result<Vec<Option<f32>>> {
        let params = SamplingParams::default().max_tokens(1);
        let (_, msg) = self
            .with_sample_retries(input, 1, &params, true, "SamplingClient.compute_logprobs")
            .await?;
        let bytes = msg.prompt_logprobs.ok_or_else(|| Error::Decode {
            what: "compute_logprobs result".into(),
            message: "the server sent no prompt_logprobs".into(),
            raw: Vec::new(),
        })?;
        let values = proto::parse_f32_le(&bytes).ok_or_else(|| Error::Decode {
            what: "compute_logprobs result".into(),
            message: "prompt_logprobs bytes not a multiple of 4".into(),
            raw: bytes.clone(),
        })?;
        // The SDK's servers send one value per prompt token (NaN at position 0); some
        // compatible servers leave position 0 out. Accept both.
        let skip_first = values.len() == input.len();
        let mut out: Vec<Option<f32>> = Vec::with_capacity(input.len());
        if !skip_first {
            out.push(None);
        }
        out.extend(values.into_iter().enumerate().map(|(i, v)| {
            if (skip_first && i == 0) || v.is_nan() {
                None
            } else {
                Some(v)
            }
        }));
        if out.len() != input.len() {
            return Err(Error::Decode {
                what: "compute_logprobs result".into(),
                message: format!(
                    "{} prompt logprobs for a prompt of {} tokens",
                    out.len(),
                    input.len()
                ),
                raw: bytes,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SampleRequest::to_json` writes the bytes `serde_json` writes for the request as a
    /// derived struct: prompts of no chunk, one id, several chunks, the largest ids;
    /// every kind of stop condition and optional field.
    #[test]
    fn sample_request_json_is_serde_jsons() {
        #[derive(Serialize)]
        struct PromptChunk<'a> {
            tokens: &'a [TokenId],
            #[serde(rename = "type")]
            kind: &'static str,
        }
        #[derive(Serialize)]
        struct Prompt<'a> {
            chunks: Vec<PromptChunk<'a>>,
        }
        #[derive(Serialize)]
        struct Reference<'a> {
            num_samples: usize,
            prompt: Prompt<'a>,
            #[serde(flatten)]
            tail: &'a SampleRequestTail<'a>,
        }
        let prompts: Vec<ModelInput> = vec![
            ModelInput::default(),
            ModelInput::from_tokens(vec![]),
            ModelInput::from_tokens(vec![0]),
            ModelInput::from_tokens(vec![151_643, 7, 42, u32::MAX, 10, 99_999]),
            ModelInput::from_chunks(vec![
                Chunk::EncodedText { tokens: vec![1, 2] },
                Chunk::EncodedText { tokens: vec![3] },
                Chunk::EncodedText {
                    tokens: vec![4_000_000_000, 5],
                },
            ]),
        ];
        let stops = [
            None,
            Some(StopCondition::Strings(vec![
                "\n\nUser:".into(),
                "\"é\u{1}".into(),
            ])),
            Some(StopCondition::Tokens(vec![151_645, 0])),
        ];
        for (i, prompt) in prompts.iter().enumerate() {
            for (j, stop) in stops.iter().enumerate() {
                let params = SamplingParams {
                    max_tokens: (j != 1).then_some(256),
                    seed: (i % 2 == 0).then_some(u64::MAX - i as u64),
                    stop: stop.clone(),
                    temperature: 0.7 + i as f32 / 3.0,
                    top_k: -1,
                    top_p: 1.0,
                };
                let req = SampleRequest {
                    num_samples: 8 * i,
                    prompt,
                    tail: SampleRequestTail {
                        sampling_params: sampling_params_json(&params).expect("finite"),
                        sampling_session_id: "session-\"1\"",
                        seq_id: (i * 3 + j) as u64,
                        prompt_logprobs: j == 2,
                        topk_prompt_logprobs: 0,
                        topk_sample_logprobs: 0,
                        prompt_alt_tokens_k: 0,
                        record_stability_info: false,
                        kind: "sample",
                    },
                };
                let reference = Reference {
                    num_samples: req.num_samples,
                    prompt: Prompt {
                        chunks: prompt
                            .chunks()
                            .iter()
                            .map(|c| match c {
                                Chunk::EncodedText { tokens } => PromptChunk {
                                    tokens,
                                    kind: "encoded_text",
                                },
                            })
                            .collect(),
                    },
                    tail: &req.tail,
                };
                assert_eq!(
                    String::from_utf8(req.to_json().expect("serializes")).expect("UTF-8"),
                    serde_json::to_string(&reference).expect("serializes"),
                    "prompt {i}, stop {j}"
                );
            }
        }
    }

    #[test]
    fn sample_responses_decode_and_negative_ids_are_named() {
        use prost::Message as _;
        let seq = |tokens: &[i32]| proto::SampledSequence {
            stop_reason: proto::StopReason::Stop as i32,
            tokens: proto::i32_le(tokens.to_vec()).into(),
            logprobs: Some(
                tokens
                    .iter()
                    .flat_map(|&t| (t as f32).to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
            ),
            topk_sampled_logprobs: None,
        };
        let body = |seqs| {
            proto::SampleResponse {
                sequences: seqs,
                ..Default::default()
            }
            .encode_to_vec()
            .into()
        };
        let ok = body(vec![seq(&[5, 0, i32::MAX]), seq(&[])]);
        let (seqs, _) = decode_sample_response(&ok, "sample", None).expect("decodes");
        assert_eq!(seqs[0].tokens, [5, 0, i32::MAX as u32]);
        assert_eq!(seqs[0].logprobs, [5.0, 0.0, i32::MAX as f32]);
        assert_eq!(seqs[0].stop_reason, StopReason::Stop);
        assert!(seqs[1].tokens.is_empty());
        let bad = body(vec![seq(&[1]), seq(&[3, -7])]);
        match decode_sample_response(&bad, "sample", None) {
            Err(Error::Decode { message, .. }) => {
                assert_eq!(message, "sequence 1: negative token id -7");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sampling_params_json_matches_the_sdk() {
        let p = SamplingParams::default()
            .max_tokens(16)
            .stop(StopCondition::Strings(vec!["\n\nUser:".into()]));
        let v = serde_json::to_value(sampling_params_json(&p).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"max_tokens":16,"stop":["\n\nUser:"],"temperature":1.0,"top_k":-1,"top_p":1.0})
        );
        let p = SamplingParams::default()
            .max_tokens(16)
            .stop(StopCondition::Tokens(vec![151645, 151643]));
        let s = serde_json::to_string(&sampling_params_json(&p).unwrap()).unwrap();
        assert_eq!(
            s,
            r#"{"max_tokens":16,"stop":[151645,151643],"temperature":1.0,"top_k":-1,"top_p":1.0}"#
        );
    }

    #[test]
    fn seeds_are_sent_as_given() {
        // As the SDK does: the user's seed goes out unchanged, whatever its size.
        for seed in [0u64, 42, 0x8000_0000, u64::MAX] {
            let p = SamplingParams::default().seed(seed);
            let v = serde_json::to_value(sampling_params_json(&p).unwrap()).unwrap();
            assert_eq!(v["seed"].as_u64(), Some(seed));
        }
    }
}
