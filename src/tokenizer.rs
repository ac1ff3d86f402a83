//! A handle over the [`tokenizers`] crate: encode without special tokens, decode, BOS/EOS ids.
//!
//! Load from a local `tokenizer.json` (BOS/EOS read from a `tokenizer_config.json` beside it
//! when present), or with the `hub` feature from a model's hub repository.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::types::TokenId;

/// A tokenizer with its special tokens. Cheap to clone.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    bos: Option<TokenId>,
    eos: Option<TokenId>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl Tokenizer {
    /// Wraps a `tokenizers::Tokenizer` with explicit BOS / EOS ids.
    pub fn new(inner: tokenizers::Tokenizer, bos: Option<TokenId>, eos: Option<TokenId>) -> Self {
        Tokenizer {
            inner: Arc::new(inner),
            bos,
            eos,
        }
    }

    /// Loads a `tokenizer.json`. BOS and EOS come from `tokenizer_config.json` in the same
    /// directory (`bos_token` / `eos_token`) when it exists; otherwise EOS is guessed from the
    /// common end-of-text tokens and there is no BOS.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io("reading", path, e))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let config_path = path.with_file_name("tokenizer_config.json");
        let config = if config_path.exists() {
            let text = std::fs::read_to_string(&config_path)
                .map_err(|e| Error::io("reading", &config_path, e))?;
            let value: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::data_line(&config_path, e.line(), e.to_string()))?;
            Some(value)
        } else {
            None
        };
        Self::with_config(inner, config.as_ref())
    }

    /// Loads a tokenizer from the bytes of a `tokenizer.json`, with the special tokens guessed
    /// as in [`from_file`](Self::from_file) without a config.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Self::with_config(inner, None)
    }

    /// Builds from a parsed `tokenizer_config.json` (if any).
    pub(crate) fn with_config(
        inner: tokenizers::Tokenizer,
        config: Option<&serde_json::Value>,
    ) -> Result<Self> {
        let token_of = |key: &str| -> Option<String> {
            let v = config?.get(key)?;
            match v {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => {
                    o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
                }
                _ => None,
            }
        };
        let resolve = |name: &str| -> Result<TokenId> {
            inner.token_to_id(name).ok_or_else(|| {
                Error::Tokenizer(format!("special token `{name}` is not in the vocabulary"))
            })
        };
        let bos = match token_of("bos_token") {
            Some(name) => Some(resolve(&name)?),
            None => None,
        };
        let eos = match token_of("eos_token") {
            Some(name) => Some(resolve(&name)?),
            None if config.is_some() => None,
            None => ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"]
                .iter()
                .find_map(|t| inner.token_to_id(t)),
        };
        Ok(Tokenizer {
            inner: Arc::new(inner),
            bos,
            eos,
        })
    }

    /// Overrides the BOS id (builder style).
    pub fn with_bos(mut self, bos: Option<TokenId>) -> Self {
        self.bos = bos;
        self
    }

    /// Overrides the EOS id (builder style).
    pub fn with_eos(mut self, eos: Option<TokenId>) -> Self {
        self.eos = eos;
        self
    }

    /// Encodes `text` without adding special tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<TokenId>> {
        let enc = self.inner.encode(text, false)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes `tokens`, special tokens included.
    pub fn decode(&self, tokens: &[TokenId]) -> Result<String> {
        Ok(self.inner.decode(tokens, false)?)
    }

    /// The BOS id, if the tokenizer has one.
    pub fn bos_token_id(&self) -> Option<TokenId> {
        self.bos
    }

    /// The EOS id, if the tokenizer has one.
    pub fn eos_token_id(&self) -> Option<TokenId> {
        self.eos
    }

    /// The id of `token`, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<TokenId> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The wrapped `tokenizers::Tokenizer`.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
