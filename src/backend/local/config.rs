//! The Qwen3 model configuration, read from a Hugging Face `config.json`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::types::TokenId;

/// Hyper-parameters of a Qwen3 decoder, as in Hugging Face's `config.json` (the fields this
/// backend uses; unknown fields are ignored).
///
/// Both spellings of the RoPE base are accepted: the top-level `rope_theta` (transformers 4)
/// and `rope_parameters.rope_theta` (transformers 5).
///
/// ```
/// use rlvr::backend::local::Qwen3Config;
/// let c: Qwen3Config = serde_json::from_str(r#"{
///     "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
///     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
///     "head_dim": 8, "rope_parameters": {"rope_theta": 5000.0}, "eos_token_id": [1, 2]
/// }"#).unwrap();
/// assert_eq!(c.rope_theta(), 5000.0);
/// assert_eq!(c.eos_token_ids(), vec![1, 2]);
/// c.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen3Config {
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Number of query heads.
    pub num_attention_heads: usize,
    /// Number of key/value heads (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Width of one attention head (`hidden_size / num_attention_heads` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Epsilon of every RMSNorm.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base (transformers 4 spelling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rope_theta: Option<f64>,
    /// RoPE parameters (transformers 5 spelling), kept verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rope_parameters: Option<serde_json::Value>,
    /// Longest supported sequence.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Whether the attention projections have biases (Qwen3: false; true is unsupported).
    #[serde(default)]
    pub attention_bias: bool,
    /// BOS id, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<TokenId>,
    /// EOS id(s): a number or a list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<serde_json::Value>,
    /// The architecture name (`"qwen3"`); others are rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
    /// Sliding-window attention (unsupported; must be false).
    #[serde(default)]
    pub use_sliding_window: bool,
    /// RoPE scaling (transformers 4 spelling; unsupported unless null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rope_scaling: Option<serde_json::Value>,
    /// Initialisation scale used by [`LocalBackend::random`](super::LocalBackend::random).
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_pos() -> usize {
    32768
}
fn default_init_range() -> f64 {
    0.02
}

impl Qwen3Config {
    /// A configuration with the given sizes and Qwen3's defaults elsewhere
    /// (`rope_theta` 1e6, eps 1e-6, untied head, no EOS).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
        head_dim: usize,
        max_position_embeddings: usize,
    ) -> Self {
        Qwen3Config {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim: Some(head_dim),
            rms_norm_eps: 1e-6,
            rope_theta: Some(1_000_000.0),
            rope_parameters: None,
            max_position_embeddings,
            tie_word_embeddings: false,
            attention_bias: false,
            bos_token_id: None,
            eos_token_id: None,
            model_type: Some("qwen3".to_string()),
            use_sliding_window: false,
            rope_scaling: None,
            initializer_range: 0.02,
        }
    }

    /// Sets the RoPE base (builder style).
    pub fn with_rope_theta(mut self, theta: f64) -> Self {
        self.rope_theta = Some(theta);
        self.rope_parameters = None;
        self
    }

    /// Sets the EOS id (builder style).
    pub fn with_eos(mut self, eos: Option<TokenId>) -> Self {
        self.eos_token_id = eos.map(serde_json::Value::from);
        self
    }

    /// Sets weight tying (builder style).
    pub fn with_tied_embeddings(mut self, tied: bool) -> Self {
        self.tie_word_embeddings = tied;
        self
    }

    /// Reads and validates a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
        let config: Qwen3Config = serde_json::from_str(&text)
            .map_err(|e| Error::data_line(path, e.line(), e.to_string()))?;
        config
            .validate()
            .map_err(|e| Error::data_line(path, 0, e.to_string()))?;
        Ok(config)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The RoPE base (10,000 when the file names none, as transformers does).
    pub fn rope_theta(&self) -> f64 {
        if let Some(t) = self.rope_theta {
            return t;
        }
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(|t| t.as_f64())
            .unwrap_or(10_000.0)
    }

    /// The EOS ids (empty when none).
    pub fn eos_token_ids(&self) -> Vec<TokenId> {
        match &self.eos_token_id {
            Some(serde_json::Value::Number(n)) => n
                .as_u64()
                .and_then(|v| TokenId::try_from(v).ok())
                .into_iter()
                .collect(),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_u64().and_then(|v| TokenId::try_from(v).ok()))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Checks the sizes are consistent and the features are supported.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim()),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(Error::config(field, "must be positive"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(Error::config(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads = {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(Error::config(
                "head_dim",
                "must be even for rotary embeddings",
            ));
        }
        if let Some(t) = &self.model_type
            && t != "qwen3"
        {
            return Err(Error::config(
                "model_type",
                format!("`{t}` is not supported: the local backend implements `qwen3`"),
            ));
        }
        if self.use_sliding_window {
            return Err(Error::config(
                "use_sliding_window",
                "sliding-window attention is not supported",
            ));
        }
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(Error::config(
                "rope_scaling",
                "RoPE scaling is not supported (only the default rotary embedding)",
            ));
        }
        if self.attention_bias {
            return Err(Error::config(
                "attention_bias",
                "attention biases are not supported (Qwen3 has none)",
            ));
        }
        if let Some(p) = &self.rope_parameters
            && let Some(kind) = p.get("rope_type").and_then(|t| t.as_str())
            && kind != "default"
        {
            return Err(Error::config(
                "rope_parameters.rope_type",
                format!("`{kind}` is not supported (only `default`)"),
            ));
        }
        for id in self.eos_token_ids() {
            if id as usize >= self.vocab_size {
                return Err(Error::config(
                    "eos_token_id",
                    format!("{id} is outside the vocabulary ({})", self.vocab_size),
                ));
            }
        }
        Ok(())
    }
}
