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

    /// Downloads `tokenizer.json` (required) and `tokenizer_config.json` (optional, for BOS /
    /// EOS) of the model repository `repo` into the hub cache, or reuses the cached copies,
    /// and loads them as [`from_file`](Self::from_file) does. Settings come from the
    /// environment ([`HubOptions::default`](crate::hub::HubOptions)).
    ///
    /// Errors: [`Error::Hub`] naming the repository and file; [`Error::Unsupported`] for the
    /// `TML/` and `thinkingmachines/` tokenizers, which ship as a Python package.
    #[cfg(feature = "hub")]
    pub async fn from_pretrained(repo: &str) -> Result<Self> {
        Self::from_pretrained_with(
            &crate::hub::Hub::new(&crate::hub::HubOptions::default())?,
            &crate::hub::HubRepo::model(repo),
        )
        .await
    }

    /// [`from_pretrained`](Self::from_pretrained) through a configured [`Hub`](crate::hub::Hub),
    /// at the repository's revision.
    #[cfg(feature = "hub")]
    pub async fn from_pretrained_with(
        hub: &crate::hub::Hub,
        repo: &crate::hub::HubRepo,
    ) -> Result<Self> {
        if repo.id.starts_with("TML/") || repo.id.starts_with("thinkingmachines/") {
            return Err(Error::Unsupported(format!(
                "tokenizer `{}` is distributed in the Python `tml_tokenizers` package, \
                 not on the hub",
                repo.id
            )));
        }
        let json_path = hub.get(repo, "tokenizer.json").await?;
        let config_path = hub.get_optional(repo, "tokenizer_config.json").await?;
        let bytes = std::fs::read(&json_path).map_err(|e| Error::io("reading", &json_path, e))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", json_path.display())))?;
        let config = match config_path {
            Some(path) => {
                let text =
                    std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
                let value: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| Error::data_line(&path, e.line(), e.to_string()))?;
                Some(value)
            }
            None => None,
        };
        Self::with_config(inner, config.as_ref())
    }

    /// The tokenizer of a Tinker base model, chosen as the Tinker SDK does
    /// ([`tokenizer_repo_for_model`], with the SDK's pinned revisions) and downloaded
    /// through `hub`.
    #[cfg(feature = "hub")]
    pub async fn for_model(
        hub: &crate::hub::Hub,
        model_name: &str,
        tokenizer_id: Option<&str>,
    ) -> Result<Self> {
        let repo_id = tokenizer_repo_for_model(model_name, tokenizer_id);
        let mut repo = crate::hub::HubRepo::model(repo_id.as_str());
        if let Some(revision) = pinned_tokenizer_revision(&repo_id) {
            repo = repo.with_revision(revision);
        }
        Self::from_pretrained_with(hub, &repo).await
    }
}

/// The Llama 3 tokenizer repository the Tinker SDK substitutes for `meta-llama/Llama-3*`.
pub const LLAMA3_TOKENIZER_REPO: &str = "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer";

/// The hub repository holding the tokenizer of a Tinker model, by the Tinker SDK's rules
/// (`get_tokenizer`, SDK 0.38):
///
/// 1. Anything from the first `:` on is dropped (from the model name and the tokenizer id).
/// 2. A `tokenizer_id` (from the server's model info) wins. Without one,
///    `meta-llama/Llama-3*` uses [`LLAMA3_TOKENIZER_REPO`], a name with two slashes
///    `org/model/variant` uses `org/model`, and any other name is its own repository.
/// 3. `moonshotai/Kimi-K2.5-Text-Only` shares `moonshotai/Kimi-K2.5`'s tokenizer.
///
/// ```
/// use rlvr::tokenizer::tokenizer_repo_for_model;
///
/// assert_eq!(tokenizer_repo_for_model("Qwen/Qwen3-8B", None), "Qwen/Qwen3-8B");
/// assert_eq!(
///     tokenizer_repo_for_model("meta-llama/Llama-3.1-8B:peft:123", None),
///     "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer"
/// );
/// assert_eq!(tokenizer_repo_for_model("org/model/variant", None), "org/model");
/// assert_eq!(tokenizer_repo_for_model("a/b", Some("c/d:x")), "c/d");
/// ```
pub fn tokenizer_repo_for_model(model_name: &str, tokenizer_id: Option<&str>) -> String {
    fn before_colon(s: &str) -> &str {
        s.split(':').next().unwrap_or(s)
    }
    let model = before_colon(model_name);
    let repo = match tokenizer_id.map(before_colon).filter(|id| !id.is_empty()) {
        Some(id) => id.to_string(),
        None if model.starts_with("meta-llama/Llama-3") => LLAMA3_TOKENIZER_REPO.to_string(),
        None => {
            let parts: Vec<&str> = model.split('/').collect();
            match parts.as_slice() {
                [org, name, _variant] => format!("{org}/{name}"),
                _ => model.to_string(),
            }
        }
    };
    match repo.as_str() {
        "moonshotai/Kimi-K2.5-Text-Only" => "moonshotai/Kimi-K2.5".to_string(),
        _ => repo,
    }
}

/// The revision the Tinker SDK pins for a tokenizer repository, if any (the Kimi models).
pub fn pinned_tokenizer_revision(repo: &str) -> Option<&'static str> {
    match repo {
        "moonshotai/Kimi-K2-Thinking" => Some("612681931a8c906ddb349f8ad0f582cb552189cd"),
        "moonshotai/Kimi-K2.5" => Some("4d01dfe0332d63057c186e0b262165819efb6611"),
        "moonshotai/Kimi-K2.6" => Some("b5aabbfb20227ed42becbf5541dbffd213942c58"),
        "moonshotai/Kimi-K3" => Some("f831ab66814297da540d832a5235f8e904f29d06"),
        _ => None,
    }
}

#[cfg(test)]
mod repo_rule_tests {
    use super::*;

    #[test]
    fn sdk_tokenizer_repo_rules() {
        assert_eq!(
            tokenizer_repo_for_model("Qwen/Qwen3-8B", None),
            "Qwen/Qwen3-8B"
        );
        assert_eq!(
            tokenizer_repo_for_model("Qwen/Qwen3-8B:abc", Some("")),
            "Qwen/Qwen3-8B"
        );
        assert_eq!(
            tokenizer_repo_for_model("meta-llama/Llama-3.2-1B", None),
            LLAMA3_TOKENIZER_REPO
        );
        // The tokenizer id wins, even for Llama 3.
        assert_eq!(
            tokenizer_repo_for_model("meta-llama/Llama-3.2-1B", Some("x/y")),
            "x/y"
        );
        assert_eq!(
            tokenizer_repo_for_model("meta-llama/Llama-2-7b", None),
            "meta-llama/Llama-2-7b"
        );
        assert_eq!(
            tokenizer_repo_for_model("org/model/variant", None),
            "org/model"
        );
        assert_eq!(tokenizer_repo_for_model("a/b/c/d", None), "a/b/c/d");
        assert_eq!(
            tokenizer_repo_for_model("moonshotai/Kimi-K2.5-Text-Only", None),
            "moonshotai/Kimi-K2.5"
        );
        assert_eq!(
            pinned_tokenizer_revision(&tokenizer_repo_for_model(
                "moonshotai/Kimi-K2.5-Text-Only",
                None
            )),
            Some("4d01dfe0332d63057c186e0b262165819efb6611")
        );
        assert_eq!(pinned_tokenizer_revision("Qwen/Qwen3-8B"), None);
    }
}
