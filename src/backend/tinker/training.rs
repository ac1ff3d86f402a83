//! [`TinkerBackend`]: a LoRA training run on a Tinker server, as a [`PolicyBackend`].

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use prost::Message;
use serde::Deserialize;

use super::futures::{FutureSpec, Promise, RequestType, retrieve};
use super::http::{Body, Call, decode_json};
use super::proto;
use super::sampling::TinkerSampler;
use super::session::{GetInfoResponse, Session, create_model, get_info};
use crate::backend::{Pending, PolicyBackend};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use crate::types::{
    AdamParams, CheckpointRef, Chunk, Datum, ForwardBackwardOutput, LoraConfig, LossFn,
    OptimStepOutput, TensorData, TensorValues,
};

/// Options for [`TinkerClient::create_lora_training_with`](super::TinkerClient::create_lora_training_with).
#[derive(Debug, Clone, Default)]
pub struct TinkerBackendOptions {
    /// Use this tokenizer instead of resolving one from the model name.
    pub tokenizer: Option<Tokenizer>,
}

/// Loads the tokenizer for a training run: a local directory named by the model (or the
/// tokenizer id) holding `tokenizer.json` first, then, with the `hub` feature, the hub
/// repository chosen by the SDK's rules
/// ([`tokenizer_repo_for_model`](crate::tokenizer::tokenizer_repo_for_model)).
async fn load_tokenizer(base_model: &str, info: &GetInfoResponse) -> Result<Tokenizer> {
    let model_name = info
        .model_data
        .model_name
        .clone()
        .unwrap_or_else(|| base_model.to_string());
    let tokenizer_id = info.model_data.tokenizer_id.as_deref();
    let repo = crate::tokenizer::tokenizer_repo_for_model(&model_name, tokenizer_id);
    for candidate in [base_model, model_name.as_str(), repo.as_str()] {
        let file = Path::new(candidate).join("tokenizer.json");
        if file.is_file() {
            return Tokenizer::from_file(file);
        }
    }
    #[cfg(feature = "hub")]
    {
        let hub = crate::hub::Hub::new(&crate::hub::HubOptions::default())?;
        Tokenizer::for_model(&hub, &model_name, tokenizer_id).await
    }
    #[cfg(not(feature = "hub"))]
    {
        Err(Error::config(
            "tokenizer",
            format!(
                "no local tokenizer.json for `{repo}` and the `hub` feature is off; pass one with TinkerBackendOptions {{ tokenizer: Some(..) }}"
            ),
        ))
    }
}

struct TrainState {
    model_id: String,
    /// The seq_id the next training request takes (the first is 1).
    next_seq: i32,
    /// The label of a training request whose submission failed for good (or was cancelled)
    /// after it took a seq_id. The server processes a run's requests strictly in seq_id
    /// order, so it would wait forever for that one: every later training request is refused
    /// with an error naming it, until [`PolicyBackend::load_state`] starts a fresh run.
    failed: Option<String>,
}

impl TrainState {
    /// Refuses a new training request when an earlier one left a seq_id gap.
    fn check_usable(&self) -> Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(label) => Err(Error::RequestFailed {
                request: label.clone(),
                category: "client".into(),
                message: format!(
                    "this training run is unusable: `{label}` was never accepted by the server, \
                     which runs a model's requests strictly in seq_id order and would wait for it \
                     forever; load a checkpoint (load_state) or create a new training run"
                ),
            }),
        }
    }

    /// Takes `n` seq_ids for the request `label` and marks the run as failed until
    /// [`TrainState::submitted`] is called: if the submission errors or its future is dropped
    /// the mark stays, so later requests fail fast instead of hanging.
    fn take_seqs(&mut self, n: usize, label: impl FnOnce(i32) -> String) -> Result<i32> {
        self.check_usable()?;
        let first = self.next_seq;
        let n = i32::try_from(n)
            .ok()
            .and_then(|n| first.checked_add(n))
            .ok_or_else(|| Error::config("data", "too many seq_ids for one training run"))?;
        self.next_seq = n;
        self.failed = Some(label(first));
        Ok(first)
    }

    /// Clears the mark set by [`TrainState::take_seqs`] once the submission was accepted.
    fn submitted(&mut self) {
        self.failed = None;
    }
}

/// A LoRA training run on a Tinker server.
///
/// Training operations are *submitted* in order: each request goes out only after the
/// previous one was accepted (its promise received), so `optim_step` is sent while the
/// `forward_backward` result is still being computed; the returned [`Pending`] polls for the
/// result. Each operation takes the next per-model `seq_id` (from 1).
///
/// If a training request cannot be submitted (its retries ran out, the server refused it,
/// or the call was cancelled), its `seq_id` is never filled and the server would hold every
/// later request forever. The backend therefore refuses later training requests at once
/// with an [`Error::RequestFailed`] naming the lost request (category `"client"`), until
/// [`load_state`](PolicyBackend::load_state) starts a fresh run. Sampling is unaffected.
pub struct TinkerBackend {
    session: Arc<Session>,
    base_model: String,
    lora: LoraConfig,
    info: GetInfoResponse,
    tokenizer: Tokenizer,
    state: tokio::sync::Mutex<TrainState>,
}

impl std::fmt::Debug for TinkerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerBackend")
            .field("base_model", &self.base_model)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Estimated bytes of a datum, as the SDK counts for chunking.
fn datum_bytes(d: &Datum) -> usize {
    let tokens = 4 * d.model_input.len();
    let tensors: usize = d
        .loss_fn_inputs
        .values()
        .map(|t| match t.values() {
            TensorValues::Int64(v) => 8 * v.len(),
            TensorValues::Float32(v) => 4 * v.len(),
        })
        .sum();
    tokens + tensors
}

/// Splits data into chunks of at most `max_len` datums and `max_bytes` estimated bytes
/// (a datum larger than the limit goes alone).
pub(crate) fn chunk_data(data: Vec<Datum>, max_len: usize, max_bytes: usize) -> Vec<Vec<Datum>> {
    let max_len = max_len.max(1);
    let mut chunks: Vec<Vec<Datum>> = Vec::new();
    let mut current: Vec<Datum> = Vec::new();
    let mut bytes = 0usize;
    for d in data {
        let b = datum_bytes(&d);
        if !current.is_empty() && (current.len() >= max_len || bytes + b > max_bytes) {
            chunks.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += b;
        current.push(d);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

fn tensor_to_proto(name: &str, t: &TensorData) -> proto::Tensor {
    let _ = name;
    let (dtype, bytes) = match t.values() {
        TensorValues::Int64(v) => (proto::DType::Int64, proto::i64_le(v)),
        TensorValues::Float32(v) => (proto::DType::Float32, proto::f32_le(v)),
    };
    proto::Tensor {
        encoding: Some(proto::tensor::Encoding::Dense(bytes)),
        dtype: dtype as i32,
        shape: t.shape().iter().map(|&s| s as i64).collect(),
    }
}

/// Builds the protobuf `ForwardBackwardRequest` for one chunk.
pub(crate) fn forward_backward_request(
    model_id: &str,
    seq_id: i32,
    data: &[Datum],
    loss: &LossFn,
    forward_only: bool,
) -> Result<proto::ForwardBackwardRequest> {
    let mut out = Vec::with_capacity(data.len());
    for (i, d) in data.iter().enumerate() {
        d.validate(loss)
            .map_err(|e| Error::config(format!("data[{i}]"), e.to_string()))?;
        let mut chunks = Vec::new();
        for c in d.model_input.chunks() {
            match c {
                Chunk::EncodedText { tokens } => {
                    if let Some(t) = tokens.iter().find(|&&t| i32::try_from(t).is_err()) {
                        return Err(Error::config(
                            format!("data[{i}].model_input"),
                            format!("token {t} does not fit in int32"),
                        ));
                    }
                    // Every id fits in an `i32`, whose little-endian bytes are the `u32`'s.
                    chunks.push(proto::Chunk {
                        chunk: Some(proto::chunk::Chunk::EncodedText(proto::EncodedTextChunk {
                            tokens: proto::le_bytes(tokens, u32::to_le_bytes),
                        })),
                    });
                }
            }
        }
        out.push(proto::Datum {
            model_input: chunks,
            loss_fn_inputs: d
                .loss_fn_inputs
                .iter()
                .map(|(k, v)| (k.clone(), tensor_to_proto(k, v)))
                .collect(),
            model_input_spans: Vec::new(),
            loss_fn_input_spans: Vec::new(),
        });
    }
    let config = loss.config();
    Ok(proto::ForwardBackwardRequest {
        model_id: model_id.to_string(),
        seq_id,
        data: out,
        loss_fn: loss.name().to_string(),
        loss_fn_config: config.clone(),
        forward_only,
        loss_fn_config_v2: config
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    proto::LossConfigValue {
                        value: Some(proto::loss_config_value::Value::Number(v)),
                    },
                )
            })
            .collect(),
    })
}

fn decode_err(what: &str, message: impl Into<String>, raw: &[u8]) -> Error {
    Error::Decode {
        what: what.to_string(),
        message: message.into(),
        raw: raw.to_vec(),
    }
}

/// Decodes a protobuf `ForwardBackwardOutput` into per-datum tensors.
pub(crate) fn decode_forward_backward(body: &Bytes, what: &str) -> Result<ForwardBackwardOutput> {
    let msg = proto::ForwardBackwardOutput::decode(body.clone())
        .map_err(|e| decode_err(what, e.to_string(), body))?;
    let mut outputs: Vec<BTreeMap<String, TensorData>> = Vec::new();
    for rec in &msg.loss_fn_outputs {
        let mut n = usize::try_from(rec.num_datums).unwrap_or(0);
        if n == 0
            && let Some(first) = rec.fields.values().next()
        {
            n = (first.offsets.len() / 8).saturating_sub(1);
        }
        // Check the server's counts against the offsets it sent *before* allocating for
        // them: a bogus `num_datums` must be a decode error, not a huge allocation.
        let mut fields = Vec::with_capacity(rec.fields.len());
        for (name, bt) in &rec.fields {
            let offsets = proto::parse_i64_le(&bt.offsets)
                .ok_or_else(|| decode_err(what, format!("field {name}: bad offsets"), body))?;
            if n.checked_add(1) != Some(offsets.len()) {
                return Err(decode_err(
                    what,
                    format!("field {name}: {} offsets for {n} datums", offsets.len()),
                    body,
                ));
            }
            fields.push((name, bt, offsets));
        }
        if fields.is_empty() && n > body.len() {
            return Err(decode_err(
                what,
                format!("{n} datums in a record without fields"),
                body,
            ));
        }
        let base = outputs.len();
        outputs.extend((0..n).map(|_| BTreeMap::new()));
        for (name, bt, offsets) in fields {
            let trailing: Vec<usize> = bt
                .trailing_shape
                .iter()
                .map(|&s| usize::try_from(s).unwrap_or(0))
                .collect();
            let inner: usize = trailing
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| {
                    decode_err(
                        what,
                        format!("field {name}: trailing shape overflows"),
                        body,
                    )
                })?
                .max(1);
            for i in 0..n {
                let (a, b) = (offsets[i], offsets[i + 1]);
                let slice = usize::try_from(a)
                    .ok()
                    .zip(usize::try_from(b).ok())
                    .filter(|(a, b)| a <= b && *b <= bt.data.len())
                    .map(|(a, b)| &bt.data[a..b])
                    .ok_or_else(|| {
                        decode_err(what, format!("field {name}: offsets out of range"), body)
                    })?;
                let values = match proto::DType::try_from(bt.dtype) {
                    Ok(proto::DType::Float32) => {
                        proto::parse_f32_le(slice).map(TensorValues::Float32)
                    }
                    Ok(proto::DType::Bfloat16) => {
                        proto::parse_bf16_le(slice).map(TensorValues::Float32)
                    }
                    Ok(proto::DType::Int64) => proto::parse_i64_le(slice).map(TensorValues::Int64),
                    Ok(proto::DType::Int32) => proto::parse_i32_le(slice)
                        .map(|v| TensorValues::Int64(v.into_iter().map(i64::from).collect())),
                    _ => None,
                }
                .ok_or_else(|| {
                    decode_err(
                        what,
                        format!("field {name}: bad data for dtype {}", bt.dtype),
                        body,
                    )
                })?;
                let len = match &values {
                    TensorValues::Float32(v) => v.len(),
                    TensorValues::Int64(v) => v.len(),
                };
                let mut shape = vec![len / inner];
                shape.extend(&trailing);
                let t = TensorData::with_shape(values, shape)
                    .map_err(|e| decode_err(what, format!("field {name}: {e}"), body))?;
                if let Some(m) = outputs.get_mut(base + i) {
                    m.insert(name.clone(), t);
                }
            }
        }
    }
    let output_type = msg
        .loss_fn_output_type
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_string();
    Ok(ForwardBackwardOutput {
        loss_fn_output_type: output_type,
        loss_fn_outputs: outputs,
        metrics: msg.metrics,
    })
}

/// Merges the results of the chunks of one call: outputs concatenated, each metric reduced
/// by its `:reduction` suffix — `sum`, `mean` (weighted by datums), `min`, `max`, `slack`
/// (max − weighted mean), `hash2` (sum as u64, wrapping), `unique` (first value under the
/// key, others as `key_1`, `key_2`...). Unknown suffixes are dropped, as the SDK does; keys
/// without a suffix are kept with the first chunk's value.
pub(crate) fn merge_outputs(parts: Vec<(ForwardBackwardOutput, usize)>) -> ForwardBackwardOutput {
    let total: usize = parts.iter().map(|(_, n)| *n).sum();
    let mut keys: Vec<String> = Vec::new();
    for (p, _) in &parts {
        for k in p.metrics.keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let mut metrics = BTreeMap::new();
    for key in keys {
        let vals: Vec<(f64, usize)> = parts
            .iter()
            .filter_map(|(p, n)| p.metrics.get(&key).map(|v| (*v, *n)))
            .collect();
        let Some(&(first, _)) = vals.first() else {
            continue;
        };
        let weighted_mean = || {
            let w: usize = vals.iter().map(|(_, n)| *n).sum();
            if w == 0 || total == 0 {
                vals.iter().map(|(v, _)| v).sum::<f64>() / vals.len() as f64
            } else {
                vals.iter().map(|(v, n)| v * *n as f64).sum::<f64>() / w as f64
            }
        };
        let max = || {
            vals.iter()
                .map(|(v, _)| *v)
                .fold(f64::NEG_INFINITY, f64::max)
        };
        let parts_of_key: Vec<&str> = key.split(':').collect();
        if parts_of_key.len() != 2 {
            metrics.insert(key.clone(), first);
            continue;
        }
        match parts_of_key[1] {
            "sum" => {
                metrics.insert(key.clone(), vals.iter().map(|(v, _)| v).sum());
            }
            "mean" => {
                metrics.insert(key.clone(), weighted_mean());
            }
            "min" => {
                metrics.insert(
                    key.clone(),
                    vals.iter().map(|(v, _)| *v).fold(f64::INFINITY, f64::min),
                );
            }
            "max" => {
                metrics.insert(key.clone(), max());
            }
            "slack" => {
                metrics.insert(key.clone(), max() - weighted_mean());
            }
            "hash2" => {
                let h = vals
                    .iter()
                    .fold(0u64, |acc, (v, _)| acc.wrapping_add(*v as u64));
                metrics.insert(key.clone(), h as f64);
            }
            "unique" => {
                metrics.insert(key.clone(), first);
                for (i, (v, _)) in vals.iter().enumerate().skip(1) {
                    metrics.insert(format!("{key}_{i}"), *v);
                }
            }
            _ => {}
        }
    }
    let mut out = ForwardBackwardOutput {
        metrics,
        ..ForwardBackwardOutput::default()
    };
    for (p, _) in parts {
        if out.loss_fn_output_type.is_empty() {
            out.loss_fn_output_type = p.loss_fn_output_type;
        }
        out.loss_fn_outputs.extend(p.loss_fn_outputs);
    }
    out
}

impl TinkerBackend {
    pub(crate) async fn new(
        session: Arc<Session>,
        model_id: String,
        base_model: String,
        lora: LoraConfig,
        info: GetInfoResponse,
        options: TinkerBackendOptions,
    ) -> Result<Self> {
        let tokenizer = match options.tokenizer {
            Some(t) => t,
            None => load_tokenizer(&base_model, &info).await?,
        };
        Ok(TinkerBackend {
            session,
            base_model,
            lora,
            info,
            tokenizer,
            state: tokio::sync::Mutex::new(TrainState {
                model_id,
                next_seq: 1,
                failed: None,
            }),
        })
    }

    /// The model id of the training run (`<session>:train:<n>`).
    pub async fn model_id(&self) -> String {
        self.state.lock().await.model_id.clone()
    }

    /// The base model name.
    pub fn base_model(&self) -> &str {
        &self.base_model
    }

    /// What `get_info` reported for the run.
    pub fn info(&self) -> &GetInfoResponse {
        &self.info
    }

    /// Saves an exportable copy of the weights (Hugging Face format) as
    /// `tinker://<run>/external_weights/<name>`, as the SDK's
    /// `TrainingClient.save_weights_external`: `ttl_seconds` (3600 s to 10 years; `None`:
    /// never expires) and, when `age_recipients` is not empty (at most 10 `age1…` or SSH
    /// public keys), every file encrypted to them and stored with a `.age` suffix. Returns the
    /// checkpoint's path; download it with
    /// [`download_weights`](super::download_weights).
    ///
    /// ```no_run
    /// # async fn run(backend: rlvr::backend::tinker::TinkerBackend) -> rlvr::Result<()> {
    /// // Kept a day, unencrypted.
    /// let path = backend.save_weights_external("final", Some(86_400), &[]).await?;
    /// assert!(path.starts_with("tinker://"));
    /// # Ok(()) }
    /// ```
    pub async fn save_weights_external(
        &self,
        name: &str,
        ttl_seconds: Option<u64>,
        age_recipients: &[String],
    ) -> Result<String> {
        if name.is_empty() {
            return Err(Error::config("name", "a checkpoint name must not be empty"));
        }
        let mut state = self.state.lock().await;
        let seq = state.take_seqs(1, |s| format!("save_weights_external seq {s}"))?;
        let model_id = state.model_id.clone();
        save_weights_external(
            &self.session,
            &model_id,
            seq,
            name,
            ttl_seconds,
            age_recipients,
            move |_| {
                state.submitted();
                drop(state);
            },
        )
        .await
    }

    /// Submits one JSON training request under the holder retry loop; returns its promise
    /// and the time to receive it.
    async fn submit_json(
        &self,
        path: &'static str,
        body: &serde_json::Value,
        sdk: &'static str,
        http_retries: Option<u32>,
    ) -> Result<(Promise, std::time::Duration)> {
        let http = &self.session.http;
        let t0 = Instant::now();
        let promise = http
            .with_holder_retries(|| {
                let call = Call::post_json(http, path, body).map(|c| {
                    let c = c.sdk(sdk);
                    match http_retries {
                        Some(n) => c.retries(n),
                        None => c,
                    }
                });
                async move {
                    let resp = http.send(call?).await?;
                    decode_json::<Promise>(&resp.body, &format!("{path} promise"))
                }
            })
            .await?;
        Ok((promise, t0.elapsed()))
    }

    async fn submit_forward_backward(
        &self,
        data: Vec<Datum>,
        loss: LossFn,
        forward_only: bool,
    ) -> Result<Pending<ForwardBackwardOutput>> {
        if data.is_empty() {
            return Err(Error::config(
                "data",
                "forward_backward needs at least one datum",
            ));
        }
        let (name, rtype, mut sdk) = if forward_only {
            ("forward", RequestType::Forward, "TrainingClient.forward")
        } else {
            (
                "forward_backward",
                RequestType::ForwardBackward,
                "TrainingClient.forward_backward",
            )
        };
        // The SDK's forward_backward_custom sends both of its passes under its own name.
        if crate::backend::IN_CUSTOM_LOSS.try_with(|_| ()).is_ok() {
            sdk = "TrainingClient.forward_backward_custom";
        }
        let server = &self.session.server;
        let chunks = chunk_data(
            data,
            server.fwdbwd_max_chunk_len,
            server.fwdbwd_max_chunk_bytes_count,
        );
        let zstd = server.proto_compress_fwdbwd;
        let mut state = self.state.lock().await;
        state.check_usable()?;
        let first_seq = state.next_seq;
        let mut bodies = Vec::with_capacity(chunks.len());
        for (i, c) in chunks.iter().enumerate() {
            let seq = i32::try_from(i)
                .ok()
                .and_then(|i| first_seq.checked_add(i))
                .ok_or_else(|| Error::config("data", "too many seq_ids for one training run"))?;
            let req = forward_backward_request(&state.model_id, seq, c, &loss, forward_only)?;
            bodies.push((seq, c.len(), req.encode_to_vec()));
        }
        let n_chunks = chunks.len();
        state.take_seqs(n_chunks, |first| match n_chunks {
            1 => format!("{name} seq {first}"),
            n => format!(
                "{name} seqs {first}..={}",
                first.saturating_add(n as i32 - 1)
            ),
        })?;
        let http = &self.session.http;
        let submit = |seq: i32, bytes: Vec<u8>| async move {
            let bytes = bytes::Bytes::from(bytes);
            let t0 = Instant::now();
            let p = http
                .with_holder_retries(|| {
                    let call = Call {
                        method: reqwest::Method::POST,
                        path: "forward_backward".into(),
                        body: Body::Proto {
                            bytes: bytes.clone(),
                            zstd,
                        },
                        accept: "application/json",
                        max_retries: http.max_retries,
                        timeout: http.timeout,
                        headers: Vec::new(),
                        sdk_method: Some(sdk),
                        raw_key: false,
                    };
                    async move {
                        let resp = http.send(call).await?;
                        decode_json::<Promise>(&resp.body, &format!("{name} promise (seq {seq})"))
                    }
                })
                .await?;
            Ok::<_, Error>((seq, p, t0.elapsed()))
        };
        // Chunks 2..n concurrently first, chunk 1 last (the server waits for seq order).
        let mut promises = Vec::with_capacity(bodies.len());
        let mut iter = bodies.into_iter();
        let first = iter.next();
        let rest: Vec<_> = iter.collect();
        let mut sizes = Vec::new();
        if let Some((_, n, _)) = &first {
            sizes.push(*n);
        }
        sizes.extend(rest.iter().map(|(_, n, _)| *n));
        if server.parallel_fwdbwd_chunks {
            let results =
                futures::future::join_all(rest.into_iter().map(|(s, _, b)| submit(s, b))).await;
            let mut rest_promises = Vec::new();
            for r in results {
                rest_promises.push(r?);
            }
            if let Some((s, _, b)) = first {
                promises.push(submit(s, b).await?);
            }
            promises.extend(rest_promises);
        } else {
            if let Some((s, _, b)) = first {
                promises.push(submit(s, b).await?);
            }
            for (s, _, b) in rest {
                promises.push(submit(s, b).await?);
            }
        }
        state.submitted();
        drop(state);
        let http = Arc::clone(&self.session.http);
        Ok(Pending::new(async move {
            let mut parts = Vec::with_capacity(promises.len());
            for ((seq, promise, rt), n) in promises.into_iter().zip(sizes) {
                let label = format!("{name} seq {seq}");
                let spec = FutureSpec {
                    request_id: promise.request_id,
                    request_type: rtype,
                    roundtrip: rt,
                    sdk_method: sdk,
                    label: label.clone(),
                };
                let body = retrieve(&http, &spec).await?;
                parts.push((
                    decode_forward_backward(&body, &format!("{label} result"))?,
                    n,
                ));
            }
            Ok(merge_outputs(parts))
        }))
    }

    async fn wait_json<T: serde::de::DeserializeOwned>(
        &self,
        promise: Promise,
        rtype: RequestType,
        rt: std::time::Duration,
        sdk: &'static str,
        label: String,
    ) -> Result<T> {
        let spec = FutureSpec {
            request_id: promise.request_id,
            request_type: rtype,
            roundtrip: rt,
            sdk_method: sdk,
            label: label.clone(),
        };
        let body = retrieve(&self.session.http, &spec).await?;
        decode_json(&body, format_args!("{label} result"))
    }
}

/// `save_weights_external` on run `model_id` with `seq`; `submitted` is called once the
/// service accepted the request (before its result is waited for).
pub(crate) async fn save_weights_external(
    session: &Arc<Session>,
    model_id: &str,
    seq: i32,
    name: &str,
    ttl_seconds: Option<u64>,
    age_recipients: &[String],
    submitted: impl FnOnce(()),
) -> Result<String> {
    let sdk = "TrainingClient.save_weights_external";
    let mut body = serde_json::Map::new();
    body.insert("model_id".into(), model_id.into());
    body.insert("path".into(), name.into());
    body.insert("seq_id".into(), seq.into());
    if let Some(ttl) = ttl_seconds {
        body.insert("ttl_seconds".into(), ttl.into());
    }
    if !age_recipients.is_empty() {
        body.insert("age_encryption_recipients".into(), age_recipients.into());
    }
    body.insert("type".into(), "save_weights_external".into());
    let body = serde_json::Value::Object(body);
    let http = &session.http;
    let t0 = Instant::now();
    let promise = http
        .with_holder_retries(|| {
            let call = Call::post_json(http, "save_weights_external", &body)
                .map(|c| c.sdk(sdk).retries(0));
            async move {
                let resp = http.send(call?).await?;
                decode_json::<Promise>(&resp.body, "save_weights_external promise")
            }
        })
        .await?;
    submitted(());
    let label = format!("save_weights_external seq {seq}");
    let spec = FutureSpec {
        request_id: promise.request_id,
        request_type: RequestType::SaveWeightsExternal,
        roundtrip: t0.elapsed(),
        sdk_method: sdk,
        label: label.clone(),
    };
    let result = retrieve(http, &spec).await?;
    let r: PathResult = decode_json(&result, format_args!("{label} result"))?;
    r.path.ok_or_else(|| Error::Decode {
        what: format!("{label} result"),
        message: "no path".into(),
        raw: result.to_vec(),
    })
}

#[derive(Deserialize)]
struct PathResult {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    sampling_session_id: Option<String>,
    #[serde(default)]
    model_id: Option<String>,
}

#[async_trait]
impl PolicyBackend for TinkerBackend {
    type Sampler = TinkerSampler;

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    async fn forward_backward(
        &self,
        data: Vec<Datum>,
        loss: LossFn,
    ) -> Result<Pending<ForwardBackwardOutput>> {
        self.submit_forward_backward(data, loss, false).await
    }

    async fn forward(
        &self,
        data: Vec<Datum>,
        loss: LossFn,
    ) -> Result<Pending<ForwardBackwardOutput>> {
        self.submit_forward_backward(data, loss, true).await
    }

    async fn optim_step(&self, params: AdamParams) -> Result<Pending<OptimStepOutput>> {
        for (name, v) in [
            ("learning_rate", params.learning_rate),
            ("beta1", params.beta1),
            ("beta2", params.beta2),
            ("eps", params.eps),
            ("weight_decay", params.weight_decay),
            ("grad_clip_norm", params.grad_clip_norm),
        ] {
            if !v.is_finite() {
                return Err(Error::config(
                    format!("adam_params.{name}"),
                    "must be finite",
                ));
            }
        }
        let sdk = "TrainingClient.optim_step";
        let mut state = self.state.lock().await;
        let seq = state.take_seqs(1, |s| format!("optim_step seq {s}"))?;
        let body = serde_json::json!({
            "model_id": state.model_id,
            "seq_id": seq,
            "type": "optim_step",
            "adam_params": {
                "learning_rate": params.learning_rate,
                "beta1": params.beta1,
                "beta2": params.beta2,
                "eps": params.eps,
                "weight_decay": params.weight_decay,
                "grad_clip_norm": params.grad_clip_norm,
            },
        });
        let (promise, rt) = self.submit_json("optim_step", &body, sdk, None).await?;
        state.submitted();
        drop(state);
        let http = Arc::clone(&self.session.http);
        Ok(Pending::new(async move {
            #[derive(Deserialize)]
            struct R {
                #[serde(default)]
                metrics: Option<BTreeMap<String, f64>>,
            }
            let label = format!("optim_step seq {seq}");
            let spec = FutureSpec {
                request_id: promise.request_id,
                request_type: RequestType::OptimStep,
                roundtrip: rt,
                sdk_method: sdk,
                label: label.clone(),
            };
            let body = retrieve(&http, &spec).await?;
            let r: R = decode_json(&body, format_args!("{label} result"))?;
            Ok(OptimStepOutput {
                metrics: r.metrics.unwrap_or_default(),
            })
        }))
    }

    async fn sampler(&self) -> Result<TinkerSampler> {
        // Open from here to the return (never entered, so nothing is held across an await):
        // marks the save in traces, e.g. for `examples/tinker_bench.rs`'s phase timing.
        let _span = tracing::info_span!("save_for_sampler");
        let sdk = "TrainingClient.save_weights_and_get_sampling_client";
        let mut state = self.state.lock().await;
        let seq = state.take_seqs(1, |s| format!("save_weights_for_sampler seq {s}"))?;
        let body = serde_json::json!({
            "model_id": state.model_id,
            "sampling_session_seq_id": self.session.next_sampling_seq(),
            "kind": "snapshot",
            "seq_id": seq,
            "type": "save_weights_for_sampler",
        });
        let (promise, rt) = self
            .submit_json("save_weights_for_sampler", &body, sdk, Some(0))
            .await?;
        state.submitted();
        drop(state);
        let label = format!("save_weights_for_sampler seq {seq}");
        let r: PathResult = self
            .wait_json(promise, RequestType::SaveWeightsForSampler, rt, sdk, label)
            .await?;
        let id = match (r.sampling_session_id, r.path) {
            (Some(id), _) => id,
            // A server that only returns the path: open a sampling session on it.
            (None, Some(path)) => {
                self.session
                    .create_sampling_session(None, Some(&path), sdk)
                    .await?
            }
            (None, None) => {
                return Err(Error::Decode {
                    what: format!("save_weights_for_sampler seq {seq} result"),
                    message: "neither sampling_session_id nor path".into(),
                    raw: Vec::new(),
                });
            }
        };
        Ok(TinkerSampler::new(Arc::clone(&self.session), id))
    }

    async fn reference_sampler(&self) -> Result<TinkerSampler> {
        let id = self
            .session
            .create_sampling_session(
                Some(&self.base_model),
                None,
                "ServiceClient.create_sampling_client",
            )
            .await?;
        Ok(TinkerSampler::new(Arc::clone(&self.session), id))
    }

    async fn save_state(&self, name: &str) -> Result<CheckpointRef> {
        if name.is_empty() {
            return Err(Error::config("name", "a checkpoint name must not be empty"));
        }
        let sdk = "TrainingClient.save_state";
        let mut state = self.state.lock().await;
        let seq = state.take_seqs(1, |s| format!("save_weights seq {s}"))?;
        let body = serde_json::json!({
            "model_id": state.model_id,
            "path": name,
            "seq_id": seq,
            "overwrite": false,
            "type": "save_weights",
        });
        let (promise, rt) = self
            .submit_json("save_weights", &body, sdk, Some(0))
            .await?;
        state.submitted();
        drop(state);
        let label = format!("save_weights seq {seq}");
        let r: PathResult = self
            .wait_json(promise, RequestType::SaveWeights, rt, sdk, label.clone())
            .await?;
        let path = r.path.ok_or_else(|| Error::Decode {
            what: format!("{label} result"),
            message: "no path".into(),
            raw: Vec::new(),
        })?;
        Ok(CheckpointRef {
            name: name.to_string(),
            path,
        })
    }

    async fn load_state(&self, checkpoint: &CheckpointRef) -> Result<()> {
        let sdk = "ServiceClient.create_training_client_from_state_with_optimizer";
        let mut state = self.state.lock().await;
        // The SDK 0.38 form: a new training run created by loading the state (one request).
        let model_seq_id = self.session.next_model_seq();
        let body = serde_json::json!({
            "session_id": self.session.session_id,
            "model_seq_id": model_seq_id,
            "path": checkpoint.path,
            "optimizer": true,
            "type": "load_weights",
        });
        match self.submit_json("load_weights", &body, sdk, None).await {
            Ok((promise, rt)) => {
                let label = format!("load_weights ({})", checkpoint.path);
                let promised_model = promise.model_id.clone();
                let r: PathResult = self
                    .wait_json(promise, RequestType::LoadWeights, rt, sdk, label)
                    .await?;
                let model_id = r
                    .model_id
                    .or(promised_model)
                    .unwrap_or_else(|| format!("{}:train:{model_seq_id}", self.session.session_id));
                get_info(&self.session, &model_id, sdk).await?;
                state.model_id = model_id;
                state.next_seq = 1;
                state.failed = None;
                Ok(())
            }
            // Servers that only know the older flow refuse the one-request form with 422:
            // create a fresh run, then load into it as its first request (seq 1).
            Err(Error::Http { status: 422, .. }) => {
                let sdk = "TrainingClient.load_state_with_optimizer";
                let model_id =
                    create_model(&self.session, &self.base_model, &self.lora, sdk).await?;
                let body = serde_json::json!({
                    "model_id": model_id,
                    "seq_id": 1,
                    "path": checkpoint.path,
                    "optimizer": true,
                    "type": "load_weights",
                });
                let (promise, rt) = self.submit_json("load_weights", &body, sdk, None).await?;
                let label = format!("load_weights ({} into {model_id})", checkpoint.path);
                let _: PathResult = self
                    .wait_json(promise, RequestType::LoadWeights, rt, sdk, label)
                    .await?;
                get_info(&self.session, &model_id, sdk).await?;
                state.model_id = model_id;
                state.next_seq = 2;
                state.failed = None;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ModelInput;

    fn datum(n: usize) -> Datum {
        Datum::new(ModelInput::from_tokens((0..n as u32).collect()))
            .with_target_tokens(vec![1; n])
            .with_weights(vec![1.0; n])
    }

    #[test]
    fn chunking_respects_count_and_bytes() {
        let data: Vec<Datum> = (0..5).map(|_| datum(10)).collect();
        let sizes: Vec<usize> = chunk_data(data.clone(), 2, usize::MAX)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(sizes, vec![2, 2, 1]);
        // 10 tokens: 40 + 80 + 40 = 160 bytes per datum.
        let sizes: Vec<usize> = chunk_data(data.clone(), 100, 320)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(sizes, vec![2, 2, 1]);
        let sizes: Vec<usize> = chunk_data(data, 100, 10).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1; 5], "an oversized datum goes alone");
    }

    #[test]
    fn metrics_merge_by_reduction() {
        let part = |m: &[(&str, f64)], n: usize| {
            (
                ForwardBackwardOutput {
                    metrics: m.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                    ..Default::default()
                },
                n,
            )
        };
        let merged = merge_outputs(vec![
            part(
                &[
                    ("loss:sum", 1.0),
                    ("a:mean", 1.0),
                    ("b:max", 1.0),
                    ("c:min", 1.0),
                    ("u:unique", 7.0),
                    ("x:weird", 1.0),
                    ("s:slack", 1.0),
                ],
                1,
            ),
            part(
                &[
                    ("loss:sum", 2.0),
                    ("a:mean", 4.0),
                    ("b:max", 3.0),
                    ("c:min", -1.0),
                    ("u:unique", 8.0),
                    ("x:weird", 1.0),
                    ("s:slack", 4.0),
                ],
                3,
            ),
        ]);
        let m = &merged.metrics;
        assert_eq!(m["loss:sum"], 3.0);
        assert_eq!(m["a:mean"], (1.0 + 12.0) / 4.0);
        assert_eq!(m["b:max"], 3.0);
        assert_eq!(m["c:min"], -1.0);
        assert_eq!(m["u:unique"], 7.0);
        assert_eq!(m["u:unique_1"], 8.0);
        assert_eq!(m["s:slack"], 4.0 - 13.0 / 4.0);
        assert!(!m.contains_key("x:weird"));
    }

    #[test]
    fn request_tokens_are_int32_little_endian_and_out_of_range_ids_are_refused() {
        let loss = LossFn::CrossEntropy;
        let req = forward_backward_request("m", 0, &[datum(3)], &loss, false).expect("request");
        let chunk = &req.data[0].model_input[0];
        let Some(proto::chunk::Chunk::EncodedText(text)) = &chunk.chunk else {
            panic!("an encoded text chunk: {chunk:?}");
        };
        assert_eq!(text.tokens, [0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(proto::parse_i32_le(&text.tokens), Some(vec![0, 1, 2]));

        let big = Datum::new(ModelInput::from_tokens(vec![5, 1 << 31]))
            .with_target_tokens(vec![1; 2])
            .with_weights(vec![1.0; 2]);
        let err = forward_backward_request("m", 0, &[datum(2), big], &loss, false)
            .expect_err("2^31 is no int32");
        let text = err.to_string();
        assert!(
            text.contains("data[1].model_input") && text.contains("2147483648"),
            "{text}"
        );
    }

    #[test]
    fn bogus_datum_counts_are_decode_errors_not_allocations() {
        let record = |num_datums: i64, offsets: &[i64], trailing: Vec<i64>| {
            let body = proto::ForwardBackwardOutput {
                loss_fn_output_type: "ArrayRecord".into(),
                loss_fn_outputs: vec![proto::ArrayRecord {
                    type_tag: "ArrayRecord".into(),
                    fields: [(
                        "logprobs".to_string(),
                        proto::BatchedTensor {
                            data: proto::f32_le(&[0.5, 0.5]).into(),
                            offsets: proto::i64_le(offsets).into(),
                            dtype: proto::DType::Float32 as i32,
                            trailing_shape: trailing,
                        },
                    )]
                    .into_iter()
                    .collect(),
                    num_datums,
                }],
                metrics: BTreeMap::new(),
            }
            .encode_to_vec();
            Bytes::from(body)
        };
        let ok = decode_forward_backward(&record(1, &[0, 8], vec![]), "t").unwrap();
        assert_eq!(
            ok.loss_fn_outputs[0]["logprobs"].as_f32().unwrap(),
            &[0.5, 0.5]
        );
        for body in [
            record(i64::MAX, &[0, 8], vec![]),
            record(1, &[0, 8], vec![i64::MAX, i64::MAX]),
        ] {
            match decode_forward_backward(&body, "t") {
                Err(Error::Decode { raw, .. }) => assert_eq!(raw, body, "raw body kept"),
                other => panic!("expected a decode error, got {other:?}"),
            }
        }
        let empty = proto::ForwardBackwardOutput {
            loss_fn_outputs: vec![proto::ArrayRecord {
                num_datums: i64::MAX,
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec();
        let empty = Bytes::from(empty);
        assert!(matches!(
            decode_forward_backward(&empty, "t"),
            Err(Error::Decode { .. })
        ));
    }

    #[test]
    fn request_carries_loss_config_twice() {
        let req =
            forward_backward_request("m", 3, &[datum(2)], &LossFn::CrossEntropy, false).unwrap();
        assert_eq!(req.seq_id, 3);
        assert!(req.loss_fn_config.is_empty());
        let d = Datum::new(ModelInput::from_tokens(vec![1, 2]))
            .with_target_tokens(vec![2, 3])
            .with_logprobs(vec![0.0, -1.0])
            .with_advantages(vec![0.0, 1.0]);
        let req = forward_backward_request("m", 1, &[d], &LossFn::ppo(), true).unwrap();
        assert_eq!(req.loss_fn_config["clip_low_threshold"], 0.8);
        assert_eq!(
            req.loss_fn_config_v2["clip_high_threshold"].value,
            Some(proto::loss_config_value::Value::Number(1.2))
        );
        assert!(req.forward_only);
    }
}
