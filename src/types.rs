//! Backend-neutral data: model inputs, datums, tensors, sampling and optimizer parameters,
//! loss functions, sampled sequences, messages.
//!
//! These mirror the Tinker SDK's public types (field names and defaults are the SDK's), so the
//! same values drive the Tinker backend and the embedded local backend.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A token id.
pub type TokenId = u32;

pub(crate) use crate::message::{Content, ContentPart, Message, Role, ToolCall, UnparsedToolCall};

// ---------------------------------------------------------------------------------------------
// Model input
// ---------------------------------------------------------------------------------------------

/// One chunk of a [`ModelInput`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Chunk {
    /// Already-tokenized text.
    EncodedText {
        /// The token ids.
        tokens: Vec<TokenId>,
    },
}

impl Chunk {
    /// Number of tokens in the chunk.
    pub fn len(&self) -> usize {
        match self {
            Chunk::EncodedText { tokens } => tokens.len(),
        }
    }
    /// Whether the chunk holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The chunk's tokens.
    pub fn tokens(&self) -> &[TokenId] {
        match self {
            Chunk::EncodedText { tokens } => tokens,
        }
    }
}

/// The input of a model: a sequence of chunks (Tinker's `ModelInput`).
///
/// ```
/// use rlvr::types::ModelInput;
/// let mut input = ModelInput::from_tokens(vec![1, 2]);
/// input.push_tokens(vec![3]);
/// assert_eq!(input.len(), 3);
/// assert_eq!(input.to_tokens(), vec![1, 2, 3]);
/// assert_eq!(input.chunks().len(), 2);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInput {
    /// Shared: a prompt is cloned into every sample of its group and every turn of a
    /// rollout, and a clone is one reference count (copied only when one of them is changed).
    /// Serialized as the chunks themselves (serde's `rc`), `{"chunks": [...]}` as before.
    chunks: Arc<Vec<Chunk>>,
}

impl ModelInput {
    /// An empty input.
    pub fn new() -> Self {
        Self::default()
    }
    /// An input of one text chunk.
    pub fn from_tokens(tokens: Vec<TokenId>) -> Self {
        let mut m = Self::new();
        m.push_tokens(tokens);
        m
    }
    /// An input from chunks (empty chunks are dropped).
    pub fn from_chunks(chunks: Vec<Chunk>) -> Self {
        ModelInput {
            chunks: Arc::new(chunks.into_iter().filter(|c| !c.is_empty()).collect()),
        }
    }
    /// Appends a text chunk (nothing when `tokens` is empty).
    pub fn push_tokens(&mut self, tokens: Vec<TokenId>) {
        if !tokens.is_empty() {
            Arc::make_mut(&mut self.chunks).push(Chunk::EncodedText { tokens });
        }
    }
    /// Appends every chunk of `other`.
    pub fn extend(&mut self, other: ModelInput) {
        Arc::make_mut(&mut self.chunks).extend(Arc::unwrap_or_clone(other.chunks));
    }
    /// The chunks.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }
    /// Total number of tokens.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(Chunk::len).sum()
    }
    /// Whether the input holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// All tokens, flattened.
    pub fn to_tokens(&self) -> Vec<TokenId> {
        let mut out = Vec::with_capacity(self.len());
        for c in self.chunks.iter() {
            out.extend_from_slice(c.tokens());
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Tensors and datums
// ---------------------------------------------------------------------------------------------

/// Element type of a [`TensorData`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 64-bit integers (token ids).
    Int64,
    /// 32-bit floats.
    Float32,
}

/// The values of a [`TensorData`], flattened row-major.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TensorValues {
    /// `int64` values.
    Int64(Vec<i64>),
    /// `float32` values.
    Float32(Vec<f32>),
}

/// A dense tensor: values (row-major) and a shape (Tinker's `TensorData`).
///
/// ```
/// use rlvr::types::{DType, TensorData};
/// let t = TensorData::f32(vec![0.5, -1.0]);
/// assert_eq!(t.dtype(), DType::Float32);
/// assert_eq!(t.shape(), &[2]);
/// assert_eq!(t.as_f32().unwrap(), &[0.5, -1.0]);
/// ```
///
/// The shape always matches the number of values: [`TensorData::with_shape`] checks it, and
/// so does deserialization (`{"values": [1, 2, 3], "shape": [2]}` is an error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "TensorDataUnchecked")]
pub struct TensorData {
    values: TensorValues,
    shape: Vec<usize>,
}

/// The serialized form of a [`TensorData`], before its shape is checked.
#[derive(Deserialize)]
struct TensorDataUnchecked {
    values: TensorValues,
    shape: Vec<usize>,
}

impl TryFrom<TensorDataUnchecked> for TensorData {
    type Error = Error;
    fn try_from(raw: TensorDataUnchecked) -> Result<Self> {
        TensorData::with_shape(raw.values, raw.shape)
    }
}

impl TensorData {
    /// A 1-D `float32` tensor.
    pub fn f32(values: Vec<f32>) -> Self {
        let shape = vec![values.len()];
        TensorData {
            values: TensorValues::Float32(values),
            shape,
        }
    }
    /// A 1-D `int64` tensor.
    pub fn i64(values: Vec<i64>) -> Self {
        let shape = vec![values.len()];
        TensorData {
            values: TensorValues::Int64(values),
            shape,
        }
    }
    /// A tensor of any shape; fails with [`Error::Config`] (field `shape`) when the shape
    /// does not match the number of values (or its element count overflows `usize`).
    ///
    /// ```
    /// use rlvr::{types::{TensorData, TensorValues}, Error};
    /// let t = TensorData::with_shape(TensorValues::Float32(vec![0.0; 6]), vec![2, 3]).unwrap();
    /// assert_eq!(t.len(), 6);
    /// let err = TensorData::with_shape(TensorValues::Int64(vec![1, 2, 3]), vec![2]).unwrap_err();
    /// assert!(matches!(err, Error::Config { ref field, .. } if field == "shape"));
    /// ```
    pub fn with_shape(values: TensorValues, shape: Vec<usize>) -> Result<Self> {
        let n = match &values {
            TensorValues::Int64(v) => v.len(),
            TensorValues::Float32(v) => v.len(),
        };
        match shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)) {
            Some(expected) if expected == n => Ok(TensorData { values, shape }),
            Some(expected) => Err(Error::config(
                "shape",
                format!("tensor shape {shape:?} needs {expected} values, got {n}"),
            )),
            None => Err(Error::config(
                "shape",
                format!("tensor shape {shape:?} has more elements than fit in usize"),
            )),
        }
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self.values {
            TensorValues::Int64(_) => DType::Int64,
            TensorValues::Float32(_) => DType::Float32,
        }
    }
    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Number of elements (the product of the shape, which always equals the number of
    /// values).
    pub fn len(&self) -> usize {
        match &self.values {
            TensorValues::Int64(v) => v.len(),
            TensorValues::Float32(v) => v.len(),
        }
    }
    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The values.
    pub fn values(&self) -> &TensorValues {
        &self.values
    }
    /// The values as `f32`, if the dtype is `float32`.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.values {
            TensorValues::Float32(v) => Some(v),
            TensorValues::Int64(_) => None,
        }
    }
    /// The values as mutable `f32`, if the dtype is `float32`.
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.values {
            TensorValues::Float32(v) => Some(v),
            TensorValues::Int64(_) => None,
        }
    }
    /// The values as `i64`, if the dtype is `int64`.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.values {
            TensorValues::Int64(v) => Some(v),
            TensorValues::Float32(_) => None,
        }
    }
    /// The values converted to `f32` whatever the dtype.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.values {
            TensorValues::Float32(v) => v.clone(),
            TensorValues::Int64(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }
}

/// A per-token input of the built-in losses: its wire name and the dtype the losses expect.
///
/// The four the built-in losses read are constants; build and read them through
/// [`Datum`]'s typed methods ([`Datum::with_advantages`], [`Datum::advantages`], …), so a
/// misspelt name is a compile error rather than a failed request. Inputs of other names
/// (a custom loss's) go through [`Datum::with_input`] / [`Datum::input`].
///
/// ```
/// use rlvr::types::{DType, LossInput};
/// assert_eq!(LossInput::ADVANTAGES.name(), "advantages");
/// assert_eq!(LossInput::TARGET_TOKENS.dtype(), DType::Int64);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LossInput {
    name: &'static str,
    dtype: DType,
}

impl LossInput {
    /// `target_tokens` (`int64`): the token each position predicts (the input shifted by one).
    pub const TARGET_TOKENS: LossInput = LossInput {
        name: "target_tokens",
        dtype: DType::Int64,
    };
    /// `weights` (`float32`): the per-token weights of `cross_entropy`.
    pub const WEIGHTS: LossInput = LossInput {
        name: "weights",
        dtype: DType::Float32,
    };
    /// `logprobs` (`float32`): the sampler's log-probabilities of the targets (0 on prompt
    /// positions), for the policy-gradient losses.
    pub const LOGPROBS: LossInput = LossInput {
        name: "logprobs",
        dtype: DType::Float32,
    };
    /// `advantages` (`float32`): the per-token advantages (0 on prompt positions).
    pub const ADVANTAGES: LossInput = LossInput {
        name: "advantages",
        dtype: DType::Float32,
    };
    /// The name on the wire (the key of [`Datum::loss_fn_inputs`]).
    pub const fn name(self) -> &'static str {
        self.name
    }
    /// The element type the built-in losses expect.
    pub const fn dtype(self) -> DType {
        self.dtype
    }
}

/// One training example: a model input and the named per-token inputs of the loss
/// ([`LossInput`]s: `target_tokens`, `weights`, `logprobs`, `advantages`, or a custom loss's),
/// all of the input's length.
///
/// ```
/// use rlvr::types::{Datum, ModelInput};
/// let d = Datum::new(ModelInput::from_tokens(vec![1, 2, 3]))
///     .with_target_tokens(vec![2, 3, 4])
///     .with_logprobs(vec![0.0, -0.5, -0.25])
///     .with_advantages(vec![0.0, 1.0, 1.0]);
/// assert_eq!(d.target_tokens(), Some(&[2, 3, 4][..]));
/// assert_eq!(d.advantages(), Some(&[0.0, 1.0, 1.0][..]));
/// assert_eq!(d.weights(), None);
/// d.validate(&rlvr::types::LossFn::ImportanceSampling).unwrap();
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Datum {
    /// The tokens fed to the model.
    pub model_input: ModelInput,
    /// Loss inputs by wire name (see [`LossInput`]; the typed methods below read and write
    /// the built-in ones).
    pub loss_fn_inputs: BTreeMap<String, TensorData>,
}

impl Datum {
    /// A datum with no loss inputs yet.
    pub fn new(model_input: ModelInput) -> Self {
        Datum {
            model_input,
            loss_fn_inputs: BTreeMap::new(),
        }
    }
    /// Adds a loss input by name (builder style): for a custom loss's inputs; the built-in
    /// ones have typed setters ([`with_target_tokens`](Self::with_target_tokens), …).
    pub fn with_input(mut self, name: impl Into<String>, tensor: TensorData) -> Self {
        self.loss_fn_inputs.insert(name.into(), tensor);
        self
    }
    /// A loss input by name.
    pub fn input(&self, name: &str) -> Option<&TensorData> {
        self.loss_fn_inputs.get(name)
    }
    /// A built-in loss input.
    pub fn loss_input(&self, input: LossInput) -> Option<&TensorData> {
        self.loss_fn_inputs.get(input.name)
    }
    /// Sets [`LossInput::TARGET_TOKENS`] (builder style).
    pub fn with_target_tokens(self, tokens: Vec<i64>) -> Self {
        self.with_input(LossInput::TARGET_TOKENS.name, TensorData::i64(tokens))
    }
    /// Sets [`LossInput::WEIGHTS`] (builder style).
    pub fn with_weights(self, weights: Vec<f32>) -> Self {
        self.with_input(LossInput::WEIGHTS.name, TensorData::f32(weights))
    }
    /// Sets [`LossInput::LOGPROBS`] (builder style).
    pub fn with_logprobs(self, logprobs: Vec<f32>) -> Self {
        self.with_input(LossInput::LOGPROBS.name, TensorData::f32(logprobs))
    }
    /// Sets [`LossInput::ADVANTAGES`] (builder style).
    pub fn with_advantages(self, advantages: Vec<f32>) -> Self {
        self.with_input(LossInput::ADVANTAGES.name, TensorData::f32(advantages))
    }
    /// [`LossInput::TARGET_TOKENS`], if present as `int64`.
    pub fn target_tokens(&self) -> Option<&[i64]> {
        self.loss_input(LossInput::TARGET_TOKENS)?.as_i64()
    }
    /// [`LossInput::WEIGHTS`], if present as `float32`.
    pub fn weights(&self) -> Option<&[f32]> {
        self.loss_input(LossInput::WEIGHTS)?.as_f32()
    }
    /// [`LossInput::LOGPROBS`], if present as `float32`.
    pub fn logprobs(&self) -> Option<&[f32]> {
        self.loss_input(LossInput::LOGPROBS)?.as_f32()
    }
    /// [`LossInput::ADVANTAGES`], if present as `float32`.
    pub fn advantages(&self) -> Option<&[f32]> {
        self.loss_input(LossInput::ADVANTAGES)?.as_f32()
    }
    /// [`LossInput::ADVANTAGES`] to change in place, if present as `float32`.
    pub fn advantages_mut(&mut self) -> Option<&mut [f32]> {
        self.loss_fn_inputs
            .get_mut(LossInput::ADVANTAGES.name)?
            .as_f32_mut()
    }
    /// Checks that every loss input has the model input's length and that the inputs `loss`
    /// needs are present with the right dtype.
    pub fn validate(&self, loss: &LossFn) -> Result<()> {
        let n = self.model_input.len();
        for (name, t) in &self.loss_fn_inputs {
            if t.shape().first().copied() != Some(n) {
                return Err(Error::config(
                    format!("loss_fn_inputs.{name}"),
                    format!(
                        "has shape {:?}, but the model input has {n} tokens",
                        t.shape()
                    ),
                ));
            }
        }
        for &LossInput { name, dtype } in loss.required_inputs() {
            match self.loss_fn_inputs.get(name) {
                None => {
                    return Err(Error::config(
                        format!("loss_fn_inputs.{name}"),
                        format!("missing; `{}` needs it", loss.name()),
                    ));
                }
                Some(t) if t.dtype() != dtype => {
                    return Err(Error::config(
                        format!("loss_fn_inputs.{name}"),
                        format!("has dtype {:?}, expected {dtype:?}", t.dtype()),
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Sampling
// ---------------------------------------------------------------------------------------------

/// When sampling stops (besides `max_tokens`).
///
/// In Tinker's semantics an absent condition (`None` in [`SamplingParams::stop`]) keeps the
/// implicit stop at EOS, and an empty list disables every stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopCondition {
    /// Stop when the decoded completion contains any of these strings.
    Strings(Vec<String>),
    /// Stop when any of these tokens is sampled.
    Tokens(Vec<TokenId>),
}

/// Sampling settings (Tinker's `SamplingParams`; same defaults).
///
/// ```
/// use rlvr::types::SamplingParams;
/// let p = SamplingParams::default().max_tokens(256).temperature(0.7);
/// assert_eq!(p.max_tokens, Some(256));
/// assert_eq!(p.top_k, -1);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Most tokens to generate (`None`: the backend's limit).
    pub max_tokens: Option<u32>,
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling threshold (1.0: off).
    pub top_p: f32,
    /// Keep only the `k` most likely tokens (-1: off).
    pub top_k: i32,
    /// Seed for reproducible sampling.
    pub seed: Option<u64>,
    /// Stop condition (`None`: stop at EOS only).
    pub stop: Option<StopCondition>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_tokens: None,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            seed: None,
            stop: None,
        }
    }
}

impl SamplingParams {
    /// Sets `max_tokens`.
    pub fn max_tokens(mut self, n: u32) -> Self {
        self.max_tokens = Some(n);
        self
    }
    /// Sets `temperature`.
    pub fn temperature(mut self, t: f32) -> Self {
        self.temperature = t;
        self
    }
    /// Sets `top_p`.
    pub fn top_p(mut self, p: f32) -> Self {
        self.top_p = p;
        self
    }
    /// Sets `top_k`.
    pub fn top_k(mut self, k: i32) -> Self {
        self.top_k = k;
        self
    }
    /// Sets `seed`.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// Sets the stop condition.
    pub fn stop(mut self, stop: StopCondition) -> Self {
        self.stop = Some(stop);
        self
    }
}

/// Why a sampled sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StopReason {
    /// A stop string, stop token or EOS was produced.
    Stop,
    /// `max_tokens` was reached.
    Length,
}

/// One completion returned by a [`Sampler`](crate::Sampler).
///
/// `tokens` include the stop sequence or EOS that ended the completion (the role-colon format
/// trains on them), and `logprobs[i]` is the sampler's log-probability of `tokens[i]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampledSequence {
    /// Sampled tokens.
    pub tokens: Vec<TokenId>,
    /// Log-probability of each sampled token under the sampling policy.
    pub logprobs: Vec<f32>,
    /// Why sampling stopped.
    pub stop_reason: StopReason,
    /// A server-side id of the sequence, when the backend provides one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_id: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Optimizer and losses
// ---------------------------------------------------------------------------------------------

/// AdamW hyper-parameters (Tinker's `AdamParams`, same defaults).
///
/// ```
/// use rlvr::types::AdamParams;
/// let p = AdamParams { learning_rate: 4e-5, ..AdamParams::default() };
/// assert_eq!((p.beta1, p.beta2, p.eps), (0.9, 0.95, 1e-12));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdamParams {
    /// Learning rate.
    pub learning_rate: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay (0: off).
    pub weight_decay: f64,
    /// Global gradient-norm clip (0: off).
    pub grad_clip_norm: f64,
}

impl Default for AdamParams {
    fn default() -> Self {
        AdamParams {
            learning_rate: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-12,
            weight_decay: 0.0,
            grad_clip_norm: 0.0,
        }
    }
}

/// The training objective of a `forward_backward` call, with its configuration.
///
/// Token losses are summed over all tokens of all datums (no mean), as on Tinker.
///
/// ```
/// use rlvr::types::LossFn;
/// assert_eq!(LossFn::ppo().name(), "ppo");
/// assert_eq!(LossFn::ppo().config().get("clip_high_threshold"), Some(&1.2));
/// assert!(LossFn::ImportanceSampling.config().is_empty());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "loss_fn", rename_all = "snake_case")]
pub enum LossFn {
    /// `L = −Σ w·lp` (inputs `target_tokens`, `weights`).
    CrossEntropy,
    /// `L = −Σ r·A`, `r = exp(lp − lp_sampler)` (inputs `target_tokens`, `logprobs`, `advantages`).
    /// The default.
    #[default]
    ImportanceSampling,
    /// `L = −Σ min(r·A, clip(r, lo, hi)·A)`.
    Ppo {
        /// Lower ratio bound (default 0.8).
        clip_low_threshold: f64,
        /// Upper ratio bound (default 1.2).
        clip_high_threshold: f64,
    },
    /// `L = −Σ sg[clip(r, lo, hi)]·lp·A`.
    Cispo {
        /// Lower ratio bound (default 0.0).
        clip_low_threshold: f64,
        /// Upper ratio bound (default 4.0).
        clip_high_threshold: f64,
    },
    /// `L = −Σ [lp·A − ½β(lp − lp_sampler)²]`.
    Dro {
        /// Quadratic penalty (default 0.05).
        beta: f64,
    },
}

impl LossFn {
    /// PPO with the default thresholds (0.8, 1.2).
    pub fn ppo() -> Self {
        LossFn::Ppo {
            clip_low_threshold: 0.8,
            clip_high_threshold: 1.2,
        }
    }
    /// CISPO with the default thresholds (0.0, 4.0).
    pub fn cispo() -> Self {
        LossFn::Cispo {
            clip_low_threshold: 0.0,
            clip_high_threshold: 4.0,
        }
    }
    /// DRO with β = 0.05.
    pub fn dro() -> Self {
        LossFn::Dro { beta: 0.05 }
    }
    /// The wire name (`"importance_sampling"`).
    pub fn name(&self) -> &'static str {
        match self {
            LossFn::CrossEntropy => "cross_entropy",
            LossFn::ImportanceSampling => "importance_sampling",
            LossFn::Ppo { .. } => "ppo",
            LossFn::Cispo { .. } => "cispo",
            LossFn::Dro { .. } => "dro",
        }
    }
    /// The `loss_fn_config` map sent with the call (empty for losses without one).
    pub fn config(&self) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        match *self {
            LossFn::CrossEntropy | LossFn::ImportanceSampling => {}
            LossFn::Ppo {
                clip_low_threshold,
                clip_high_threshold,
            }
            | LossFn::Cispo {
                clip_low_threshold,
                clip_high_threshold,
            } => {
                m.insert("clip_low_threshold".to_string(), clip_low_threshold);
                m.insert("clip_high_threshold".to_string(), clip_high_threshold);
            }
            LossFn::Dro { beta } => {
                m.insert("beta".to_string(), beta);
            }
        }
        m
    }
    /// The loss inputs this loss needs.
    pub fn required_inputs(&self) -> &'static [LossInput] {
        match self {
            LossFn::CrossEntropy => &[LossInput::TARGET_TOKENS, LossInput::WEIGHTS],
            _ => &[
                LossInput::TARGET_TOKENS,
                LossInput::LOGPROBS,
                LossInput::ADVANTAGES,
            ],
        }
    }
    /// Parses a wire name with the default configuration.
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "cross_entropy" => LossFn::CrossEntropy,
            "importance_sampling" => LossFn::ImportanceSampling,
            "ppo" => LossFn::ppo(),
            "cispo" => LossFn::cispo(),
            "dro" => LossFn::dro(),
            other => {
                return Err(Error::config(
                    "loss_fn",
                    format!(
                        "unknown loss `{other}` (expected cross_entropy, importance_sampling, ppo, cispo or dro)"
                    ),
                ));
            }
        })
    }
}

/// The result of a `forward_backward` (or forward-only) call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForwardBackwardOutput {
    /// Output type tag (the part after the last `:` of the server's tag).
    pub loss_fn_output_type: String,
    /// Per-datum outputs, e.g. `logprobs` (the learner's log-probabilities of `target_tokens`).
    pub loss_fn_outputs: Vec<BTreeMap<String, TensorData>>,
    /// Metrics; keys carry a `:reduction` suffix (`loss:sum`).
    pub metrics: BTreeMap<String, f64>,
}

impl ForwardBackwardOutput {
    /// The key of a datum's per-token log-probabilities in
    /// [`loss_fn_outputs`](Self::loss_fn_outputs).
    pub const LOGPROBS: &'static str = "logprobs";

    /// Datum `i`'s log-probabilities of its targets, if the backend returned them as
    /// `float32`.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use rlvr::types::{ForwardBackwardOutput, TensorData};
    /// let out = ForwardBackwardOutput {
    ///     loss_fn_outputs: vec![BTreeMap::from([(
    ///         ForwardBackwardOutput::LOGPROBS.to_string(),
    ///         TensorData::f32(vec![-0.5, -1.0]),
    ///     )])],
    ///     ..Default::default()
    /// };
    /// assert_eq!(out.logprobs(0), Some(&[-0.5, -1.0][..]));
    /// assert_eq!(out.logprobs(1), None);
    /// ```
    pub fn logprobs(&self, i: usize) -> Option<&[f32]> {
        self.loss_fn_outputs.get(i)?.get(Self::LOGPROBS)?.as_f32()
    }
}

/// The result of an `optim_step` call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OptimStepOutput {
    /// Metrics reported by the backend (names are backend specific).
    pub metrics: BTreeMap<String, f64>,
}

/// A saved training state (weights + optimizer), as returned by `save_state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRef {
    /// The name it was saved under.
    pub name: String,
    /// Where it lives: a `tinker://` path or a local directory.
    pub path: String,
}

/// Which LoRA adapters to train (Tinker's `lora_config`).
///
/// ```
/// use rlvr::types::LoraConfig;
/// let c = LoraConfig::new(32);
/// assert!(c.train_attn && c.train_mlp && c.train_unembed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoraConfig {
    /// Adapter rank.
    pub rank: u32,
    /// Seed of the adapters' initialization (`None`: backend chooses).
    pub seed: Option<u64>,
    /// Adapt the MLP projections.
    pub train_mlp: bool,
    /// Adapt the attention projections.
    pub train_attn: bool,
    /// Adapt the unembedding (LM head).
    pub train_unembed: bool,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 32,
            seed: None,
            train_mlp: true,
            train_attn: true,
            train_unembed: true,
        }
    }
}

impl LoraConfig {
    /// All parts adapted at `rank`.
    pub fn new(rank: u32) -> Self {
        LoraConfig {
            rank,
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_deserialization_checks_the_shape() {
        let t: TensorData = serde_json::from_str(r#"{"values":[1,2,3,4],"shape":[2,2]}"#).unwrap();
        assert_eq!((t.len(), t.shape()), (4, &[2usize, 2][..]));
        let back: TensorData = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        for bad in [
            r#"{"values":[1,2,3],"shape":[2]}"#,
            r#"{"values":[],"shape":[18446744073709551615,2]}"#,
        ] {
            let err = serde_json::from_str::<TensorData>(bad).unwrap_err();
            assert!(err.to_string().contains("shape"), "{bad}: {err}");
        }
    }

    #[test]
    fn shape_overflow_is_a_config_error() {
        let err =
            TensorData::with_shape(TensorValues::Float32(vec![]), vec![usize::MAX, 2]).unwrap_err();
        assert!(matches!(err, Error::Config { ref field, .. } if field == "shape"));
    }
}
