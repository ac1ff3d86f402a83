//! A handle over the [`tokenizers`] crate: encode without special tokens, decode, BOS/EOS ids.
//!
//! Load from a local `tokenizer.json` (BOS/EOS read from a `tokenizer_config.json` beside it
//! when present), or with the `hub` feature from a model's hub repository.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::types::TokenId;

mod fast;

/// A tokenizer with its special tokens. Cheap to clone.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    /// Every token's decoded bytes, built on the first [`decode`](Tokenizer::decode) when the
    /// decoder is byte-level (`None` inside for other decoders); shared by the clones.
    byte_table: Arc<OnceLock<Option<ByteTable>>>,
    /// Recent encodings of short texts (see [`encode`](Tokenizer::encode)); shared by the clones.
    encode_cache: Arc<Mutex<EncodeCache>>,
    /// The direct encoding path of byte-level BPE tokenizers, built on the first
    /// [`encode`](Tokenizer::encode) (`None` inside for other pipelines).
    fast: Arc<OnceLock<Option<fast::FastEncoder>>>,
}

/// Texts longer than this are never cached by [`Tokenizer::encode`].
const ENCODE_CACHE_MAX_TEXT: usize = 4096;
/// [`Tokenizer::encode`]'s cache starts over when it holds this many texts.
const ENCODE_CACHE_MAX_ENTRIES: usize = 1024;

/// Inserts into a cache that starts over (is emptied) when it holds `max` entries, so that
/// it never grows with the run (the encoding caches here and in [`fast`]).
pub(crate) fn insert_bounded<K: std::hash::Hash + Eq, V, S: std::hash::BuildHasher>(
    map: &mut HashMap<K, V, S>,
    key: K,
    value: V,
    max: usize,
) {
    if map.len() >= max {
        map.clear();
    }
    map.insert(key, value);
}

/// The hasher of the tokenizer's caches: `ahash` (already in `tokenizers`' tree), several
/// times quicker than the standard SipHash on the short texts and pieces they are keyed by;
/// the keys are the user's own prompts, not an adversary's.
pub(crate) type CacheHasher = ahash::RandomState;

/// Text → token ids, bounded: emptied when full, so it never grows with the run.
#[derive(Default)]
struct EncodeCache {
    map: HashMap<String, Arc<[TokenId]>, CacheHasher>,
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
            byte_table: Arc::default(),
            encode_cache: Arc::default(),
            fast: Arc::default(),
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
            byte_table: Arc::default(),
            encode_cache: Arc::default(),
            fast: Arc::default(),
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
    ///
    /// Texts up to 4 KiB are remembered (at most 1,024 of them; the memory starts over when
    /// full): renderers encode the same pieces — role headers, a few-shot prefix, stop
    /// sequences — for every prompt, and encoding is deterministic, so a repeat is a copy.
    ///
    /// Byte-level BPE tokenizers (Qwen, Llama 3, GPT-OSS, DeepSeek...) encode a text that is
    /// already NFC and holds no added token through their regexes and BPE model directly,
    /// without `tokenizers`' per-byte offset bookkeeping: the same ids, about three times
    /// faster. Other texts and tokenizers go through `tokenizers`' `encode`.
    pub fn encode(&self, text: &str) -> Result<Vec<TokenId>> {
        let cacheable = text.len() <= ENCODE_CACHE_MAX_TEXT;
        if cacheable
            && let Some(ids) = self
                .encode_cache
                .lock()
                .ok()
                .and_then(|c| c.map.get(text).cloned())
        {
            return Ok(ids.to_vec());
        }
        let ids = match self
            .fast
            .get_or_init(|| fast::FastEncoder::build(&self.inner))
            .as_ref()
            .and_then(|f| f.encode(&self.inner, text))
        {
            Some(ids) => ids,
            None => self.encode_slow(text)?,
        };
        if cacheable && let Ok(mut cache) = self.encode_cache.lock() {
            insert_bounded(
                &mut cache.map,
                text.to_owned(),
                Arc::from(ids.as_slice()),
                ENCODE_CACHE_MAX_ENTRIES,
            );
        }
        Ok(ids)
    }

    /// `tokenizers`' own `encode` (no special tokens added).
    pub(crate) fn encode_slow(&self, text: &str) -> Result<Vec<TokenId>> {
        Ok(self.inner.encode_fast(text, false)?.get_ids().to_vec())
    }

    /// Decodes `tokens`, special tokens included.
    ///
    /// With a byte-level decoder (GPT-2 style: Qwen, Llama 3, GPT-OSS...), every token's bytes
    /// come from a table built once, and the text is their concatenation read as UTF-8
    /// (invalid sequences replaced by U+FFFD): exactly `tokenizers`' own `decode`, without a
    /// string per token. Other decoders go through `tokenizers`.
    pub fn decode(&self, tokens: &[TokenId]) -> Result<String> {
        match self
            .byte_table
            .get_or_init(|| ByteTable::build(&self.inner))
        {
            Some(table) => Ok(table.decode(&self.inner, tokens)),
            None => Ok(self.inner.decode(tokens, false)?),
        }
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

/// The decoded bytes of every token of a tokenizer whose decoder is byte-level: what
/// `tokenizers`' `ByteLevel::decode_chain` makes of each token string (each char mapped back to
/// its byte, or the token's own UTF-8 bytes when a char is outside the byte alphabet, as for
/// most added tokens), stored once.
///
/// Each id has one 16-byte entry: up to [`SHORT`] bytes inline and their count in the last
/// byte, so that decoding a token is one cache line read and one fixed-size store (all 16
/// bytes go to the end of the text, into room reserved up front, and the text's length grows
/// by the token's). Longer tokens, rare in any vocabulary, are marked [`LONG`] and kept in
/// `long`.
///
/// The count byte also says whether the token's bytes are UTF-8 on their own ([`WHOLE`]).
/// Such a token starts and ends on a character boundary, so a decode only has to check (and
/// repair) the runs of tokens that are not — byte tokens and pieces cut mid-character — and
/// none at all for most text.
struct ByteTable {
    entries: Vec<[u8; 16]>,
    /// The tokens longer than [`SHORT`] bytes, by id, and whether they are UTF-8 alone.
    long: HashMap<u32, (Box<[u8]>, bool), CacheHasher>,
}

/// The most bytes a [`ByteTable`] entry holds inline.
const SHORT: usize = 15;
/// Set in the count byte of an inline entry whose bytes are UTF-8 on their own.
const WHOLE: u8 = 0x40;
/// The count byte of an id whose bytes are in [`ByteTable::long`].
const LONG: u8 = 0xFE;
/// The count byte of an id without a token (left out of decodes, as `tokenizers` does).
const NONE: u8 = 0xFF;
// An inline count is at most 15 (four bits) and `WHOLE` the bit above them: the decode's
// one-test check of an inline whole entry (`count >> 4 == WHOLE >> 4`) relies on it.
const _: () =
    assert!(SHORT <= 15 && WHOLE == 0x40 && LONG >> 4 != WHOLE >> 4 && NONE >> 4 != WHOLE >> 4);

impl ByteTable {
    /// The table, when `inner`'s decoder is exactly `ByteLevel` (else `None`).
    fn build(inner: &tokenizers::Tokenizer) -> Option<ByteTable> {
        if !matches!(
            inner.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        ) {
            return None;
        }
        let n = inner.get_vocab_size(true);
        let n = inner
            .get_added_tokens_decoder()
            .keys()
            .map(|&id| id as usize + 1)
            .fold(n, usize::max);
        let mut entries = Vec::with_capacity(n);
        let mut long = HashMap::default();
        for id in 0..n {
            let mut entry = [0u8; 16];
            let id = u32::try_from(id).ok()?;
            let Some(token) = inner.id_to_token(id) else {
                entry[15] = NONE;
                entries.push(entry);
                continue;
            };
            let bytes = token_bytes(&token);
            let whole = std::str::from_utf8(&bytes).is_ok();
            if bytes.len() <= SHORT {
                entry[..bytes.len()].copy_from_slice(&bytes);
                entry[15] = bytes.len() as u8 | if whole { WHOLE } else { 0 };
            } else {
                entry[15] = LONG;
                long.insert(id, (bytes.into_owned().into_boxed_slice(), whole));
            }
            entries.push(entry);
        }
        Some(ByteTable { entries, long })
    }

    /// Appends the bytes of a token without an inline entry — a long token, an id without a
    /// token, an id past the table — and says whether they are UTF-8 on their own.
    #[cold]
    fn push_rare(
        &self,
        inner: &tokenizers::Tokenizer,
        id: TokenId,
        entry: Option<&[u8; 16]>,
        out: &mut Vec<u8>,
    ) -> bool {
        match entry.map(|e| e[15]) {
            Some(NONE) => true,
            Some(_) => match self.long.get(&id) {
                Some((bytes, whole)) => {
                    out.extend_from_slice(bytes);
                    *whole
                }
                None => true,
            },
            // Beyond the table: what `tokenizers` does (an unknown id is left out).
            None => {
                if let Some(token) = inner.id_to_token(id) {
                    out.extend_from_slice(&token_bytes(&token));
                }
                false
            }
        }
    }

    fn decode(&self, inner: &tokenizers::Tokenizer, tokens: &[TokenId]) -> String {
        // Room for a whole entry (16 bytes) per token, reserved up front: an inline token is
        // then one unaligned 16-byte store at the end of the text and a length bump, with no
        // capacity check (the invariant: before token `i`, at least `16 × (n − i) + 16` bytes
        // are free; an inline token uses at most 15, and a rare one re-reserves).
        let n = tokens.len();
        let mut out: Vec<u8> = Vec::with_capacity(n * 16 + 16);
        // The byte ranges of the tokens that are not UTF-8 on their own (the only places the
        // text can be invalid), touching ones merged: byte tokens and pieces cut
        // mid-character, rare in text a model writes.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let entries = &self.entries[..];
        let mut i = 0;
        while i < n {
            // A stretch of inline tokens that are UTF-8 alone, the text's end and base kept
            // in registers; it stops before the first other token.
            let base = out.as_mut_ptr();
            let mut len = out.len();
            while let Some(&id) = tokens.get(i) {
                // The table is megabytes and sampled ids are scattered over it: ask for the
                // entry a few tokens ahead now, so that its cache miss overlaps this work.
                #[cfg(target_arch = "x86_64")]
                if let Some(&ahead) = tokens.get(i + 8) {
                    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                    // An id past the table makes an address past it: harmless to prefetch.
                    let at = entries.as_ptr().wrapping_add(ahead as usize);
                    // SAFETY: SSE is part of every x86_64 target, and a prefetch of any
                    // address never faults nor changes memory.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast()) };
                }
                let Some(entry) = entries.get(id as usize) else {
                    break;
                };
                // Inline and UTF-8 alone: `WHOLE` and a count of at most 15 (one test).
                let count = entry[15];
                if count >> 4 != WHOLE >> 4 {
                    break;
                }
                debug_assert!(out.capacity() - len >= 16);
                // SAFETY: at least 16 bytes past `len` are allocated (the invariant above),
                // so the store stays inside the buffer, which nothing else touches until
                // `set_len` below; the length covers only bytes this loop stored.
                unsafe { base.add(len).cast::<[u8; 16]>().write_unaligned(*entry) };
                len += usize::from(count & 15);
                i += 1;
            }
            // SAFETY: `out[..len]` is what was there plus what the stores above initialised.
            unsafe { out.set_len(len) };
            let Some(&id) = tokens.get(i) else {
                break;
            };
            i += 1;
            let entry = entries.get(id as usize);
            let whole = match entry {
                Some(e) if e[15] < LONG => {
                    // Inline but not UTF-8 alone.
                    out.extend_from_slice(&e[..usize::from(e[15] & !WHOLE)]);
                    false
                }
                _ => {
                    let whole = self.push_rare(inner, id, entry, &mut out);
                    out.reserve((n - i) * 16 + 16);
                    whole
                }
            };
            if !whole && out.len() > len {
                match runs.last_mut() {
                    Some((_, end)) if *end == len => *end = out.len(),
                    _ => runs.push((len, out.len())),
                }
            }
        }
        if runs.is_empty() {
            // The text, not the room reserved for copying: 16 bytes a token is ~4x its size.
            out.shrink_to_fit();
            // SAFETY: every token's bytes are UTF-8 on their own (checked when the table was
            // built), so their concatenation is UTF-8.
            return unsafe { String::from_utf8_unchecked(out) };
        }
        let mut text = String::with_capacity(out.len() + 3 * runs.len());
        let mut pos = 0;
        for (a, b) in runs {
            // SAFETY: `out[pos..a]` is the bytes of consecutive tokens that are each UTF-8 on
            // their own (checked when the table was built), so it is UTF-8 itself.
            text.push_str(unsafe { std::str::from_utf8_unchecked(&out[pos..a]) });
            // A run begins after a whole character and ends before one (or at the end): the
            // token after it, UTF-8 alone, cannot start with a continuation byte. So repairing
            // it alone gives what repairing the whole text gives there.
            push_utf8_lossy(&mut text, &out[a..b]);
            pos = b;
        }
        // SAFETY: as above, whole tokens only.
        text.push_str(unsafe { std::str::from_utf8_unchecked(&out[pos..]) });
        text
    }
}

/// Appends `bytes` as UTF-8 to `out`, each maximal invalid subsequence replaced by U+FFFD:
/// what `String::from_utf8_lossy` gives, faster on text with many invalid sequences (sampled
/// byte-level tokens, cut mid-character, are full of them). Each valid run goes through
/// `str::from_utf8`, whose word-at-a-time ASCII path `Utf8Chunks` lacks; `error_len` is the
/// length `from_utf8_lossy` replaces.
fn push_utf8_lossy(out: &mut String, bytes: &[u8]) {
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(valid) => {
                out.push_str(valid);
                return;
            }
            Err(error) => {
                let (valid, after) = rest.split_at(error.valid_up_to());
                // SAFETY: the `from_utf8` that returned `error` checked that the bytes
                // before `valid_up_to` are UTF-8.
                out.push_str(unsafe { std::str::from_utf8_unchecked(valid) });
                out.push(char::REPLACEMENT_CHARACTER);
                // `None`: an incomplete sequence at the end, one replacement for all of it.
                let Some(n) = error.error_len() else {
                    return;
                };
                rest = &after[n..];
            }
        }
    }
}

/// A token string's bytes as `ByteLevel::decode_chain` makes them: each char mapped back to
/// its byte, or the string's own UTF-8 bytes when a char is outside the byte alphabet (most
/// added tokens).
fn token_bytes(token: &str) -> std::borrow::Cow<'_, [u8]> {
    let char_byte = byte_level_alphabet();
    match token.chars().map(char_byte).collect::<Option<Vec<u8>>>() {
        Some(mapped) => std::borrow::Cow::Owned(mapped),
        None => std::borrow::Cow::Borrowed(token.as_bytes()),
    }
}

/// GPT-2's byte-level alphabet read backwards: the byte a char stands for, `None` for a char
/// outside the 256 of the alphabet (`bytes_to_unicode` in GPT-2's `encoder.py`).
fn byte_level_alphabet() -> impl Fn(char) -> Option<u8> {
    static TABLE: OnceLock<[i16; 324]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [-1i16; 324];
        let mut next = 256usize;
        for b in 0..=255u8 {
            let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            let c = if printable {
                b as usize
            } else {
                next += 1;
                next - 1
            };
            table[c] = i16::from(b);
        }
        table
    });
    |c: char| table.get(c as usize).and_then(|&b| u8::try_from(b).ok())
}

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

/// The tokenizer, chat-template and processor files of a Hugging Face model directory (the
/// cookbook's list, every model of the Tinker lineup covered): what a hub snapshot fetches
/// beside the weights and what a merged model copies from its base.
#[cfg(any(feature = "hub", feature = "weights"))]
pub(crate) const TOKENIZER_AND_PROCESSOR_FILES: &[&str] = &[
    "tokenizer_config.json",
    "tokenizer.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "tiktoken.model",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
];

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

#[cfg(test)]
mod byte_table_tests {
    use super::*;

    /// Id sequences of every length below `max_len`, each id `pick`ed from the next number
    /// of a xorshift stream seeded with `x` (reproducible).
    fn random_runs(max_len: usize, mut x: u64, pick: impl Fn(u64) -> TokenId) -> Vec<Vec<TokenId>> {
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..max_len)
            .map(|len| (0..len).map(|_| pick(next())).collect())
            .collect()
    }

    fn qwen3() -> Tokenizer {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/qwen3-tokenizer.json.zst"
        );
        let bytes = zstd::decode_all(std::fs::File::open(path).expect("fixture")).expect("zstd");
        Tokenizer::from_bytes(&bytes).expect("tokenizer")
    }

    /// A table's decode is its tokens' bytes read as UTF-8 the way `from_utf8_lossy` reads
    /// them, whatever the mix: ids without a token (no bytes) between the pieces of a split
    /// character, long tokens (the room reserved for copying is renewed after each), pieces
    /// of characters inline, ids past the table.
    #[test]
    fn byte_table_decode_is_the_lossy_text_of_the_bytes() {
        let tok = qwen3();
        let pieces: Vec<Option<Vec<u8>>> = vec![
            Some(b"ab".to_vec()),
            Some(vec![0xE2]),
            None,
            Some(vec![0x82]),
            Some(vec![0xAC]),
            Some("é ü 日本".as_bytes().to_vec()),
            Some(b"0123456789abcdef0123456789".to_vec()),
            Some(vec![0xF0, 0x9F]),
            Some(vec![0xA6, 0x80, b'!']),
            Some(
                "🦀🦀🦀🦀🦀 and more than fifteen bytes, \u{fffd}"
                    .as_bytes()
                    .to_vec(),
            ),
            Some(vec![0xFF]),
            Some(Vec::new()),
            Some(b"fifteen bytes!!".to_vec()),
            Some([0xC3].repeat(20)),
        ];
        let mut entries = Vec::new();
        let mut long = HashMap::default();
        for (id, piece) in pieces.iter().enumerate() {
            let mut entry = [0u8; 16];
            match piece {
                None => entry[15] = NONE,
                Some(bytes) => {
                    let whole = std::str::from_utf8(bytes).is_ok();
                    if bytes.len() <= SHORT {
                        entry[..bytes.len()].copy_from_slice(bytes);
                        entry[15] = bytes.len() as u8 | if whole { WHOLE } else { 0 };
                    } else {
                        entry[15] = LONG;
                        long.insert(id as u32, (bytes.clone().into_boxed_slice(), whole));
                    }
                }
            }
            entries.push(entry);
        }
        let table = ByteTable { entries, long };
        // €, split over three ids with a hole between its first two bytes.
        assert_eq!(table.decode(tok.inner(), &[1, 2, 3, 4]), "€");
        let past = pieces.len() as u32 + 1_000_000;
        let n = pieces.len() as u32;
        for ids in random_runs(600, 0x2545_F491_4F6C_DD1D, |x| match x % 16 {
            0 => past,
            k => (k as u32 + (x >> 8) as u32) % n,
        }) {
            let bytes: Vec<u8> = ids
                .iter()
                .filter_map(|&id| pieces.get(id as usize).cloned().flatten())
                .flatten()
                .collect();
            assert_eq!(
                table.decode(tok.inner(), &ids),
                String::from_utf8_lossy(&bytes),
                "{ids:?}"
            );
        }
    }

    /// The table decodes exactly as `tokenizers` does: every id alone (partial UTF-8
    /// included), all of them in a row, random runs (bytes split across tokens, added and
    /// special tokens), ids past the vocabulary.
    #[test]
    fn byte_table_decode_matches_tokenizers() {
        let tok = qwen3();
        let reference = |ids: &[TokenId]| tok.inner().decode(ids, false).expect("decode");
        let n = tok.inner().get_vocab_size(true) as u32 + 40;
        let table = ByteTable::build(tok.inner()).expect("Qwen3 decodes byte-level");
        // Both kinds of entry are exercised below: inline ones and longer tokens.
        assert!(table.long.len() > 100, "{} long tokens", table.long.len());
        assert!(
            table
                .entries
                .iter()
                .any(|e| e[15] < LONG && usize::from(e[15] & !WHOLE) == SHORT)
        );
        // Tokens that are UTF-8 alone and tokens that are not (byte tokens: 0x80 is `Ā`).
        assert!(
            table
                .entries
                .iter()
                .any(|e| e[15] < LONG && e[15] & WHOLE != 0)
        );
        assert!(
            table
                .entries
                .iter()
                .any(|e| e[15] < LONG && e[15] & WHOLE == 0)
        );
        for id in 0..n {
            assert_eq!(
                tok.decode(&[id]).expect("decode"),
                reference(&[id]),
                "id {id}"
            );
        }
        let all: Vec<TokenId> = (0..n).collect();
        assert_eq!(tok.decode(&all).expect("decode"), reference(&all));
        // Mostly the byte tokens and the added tokens at the top, some anywhere.
        for ids in random_runs(400, 0x9E37_79B9_7F4A_7C15, |x| match x % 4 {
            0 => (x >> 8) as u32 % 256,
            1 => 151_640 + (x >> 8) as u32 % 40,
            _ => (x >> 8) as u32 % n,
        }) {
            assert_eq!(
                tok.decode(&ids).expect("decode"),
                reference(&ids),
                "{ids:?}"
            );
        }
        let text = "Natalia sold 48/2 = <<48/2=24>>24 clips in May. 🦀 \\boxed{72}<|im_end|>";
        // Encoded twice: the second comes from the cache, and must be the same.
        assert_eq!(
            tok.encode(text).expect("encode"),
            tok.encode(text).expect("encode")
        );
        assert_eq!(
            tok.encode(text).expect("encode"),
            tok.inner().encode(text, false).expect("encode").get_ids()
        );
        let ids = tok.encode(text).expect("encode");
        assert_eq!(tok.decode(&ids).expect("decode"), text);
    }
}

#[cfg(test)]
mod encode_cache_tests {
    use super::*;

    /// The cache gives what `tokenizers` gives, and stays bounded however many texts pass.
    #[test]
    fn encode_cache_is_exact_and_bounded() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/qwen3-tokenizer.json.zst"
        );
        let bytes = zstd::decode_all(std::fs::File::open(path).expect("fixture")).expect("zstd");
        let tok = Tokenizer::from_bytes(&bytes).expect("tokenizer");
        for round in 0..2 {
            for i in 0..(ENCODE_CACHE_MAX_ENTRIES + 300) {
                let text = format!("User: problem {i} costs ${}.\n\n", i * 7);
                let want = tok.inner().encode(text.as_str(), false).expect("encode");
                assert_eq!(
                    tok.encode(&text).expect("encode"),
                    want.get_ids(),
                    "{round} {i}"
                );
                let len = tok.encode_cache.lock().map(|c| c.map.len()).unwrap_or(0);
                assert!(len <= ENCODE_CACHE_MAX_ENTRIES);
            }
        }
        let long = "x".repeat(ENCODE_CACHE_MAX_TEXT + 1);
        let before = tok.encode_cache.lock().map(|c| c.map.len()).unwrap_or(0);
        tok.encode(&long).expect("encode");
        let after = tok.encode_cache.lock().map(|c| c.map.len()).unwrap_or(0);
        assert_eq!(before, after, "long texts are not kept");
    }
}

#[cfg(test)]
mod utf8_lossy_tests {
    use rand::{Rng, SeedableRng};

    /// Every maximal invalid subsequence becomes one U+FFFD, as `from_utf8_lossy` does:
    /// stray continuation bytes, truncated and overlong sequences, surrogates, a cut at the
    /// end, and random bytes weighted towards multi-byte sequences.
    #[test]
    fn matches_from_utf8_lossy() {
        let lossy = |bytes: &[u8]| {
            let mut out = String::from("x");
            super::push_utf8_lossy(&mut out, bytes);
            out.split_off(1)
        };
        let fixed: [&[u8]; 9] = [
            b"plain ascii",
            "é日本🦀".as_bytes(),
            b"\x80\x80abc",
            b"ab\xE6\x97",
            b"ab\xE6\x97c\xF0\x9F\xA6",
            b"\xC0\xAF overlong \xE0\x80\xAF",
            b"\xED\xA0\x80 surrogate",
            b"\xF4\x90\x80\x80 too high \xFF\xFE",
            b"",
        ];
        for bytes in fixed {
            assert_eq!(lossy(bytes), String::from_utf8_lossy(bytes), "{bytes:?}");
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let alphabet = [b'a', b' ', 0x80, 0xBF, 0xC3, 0xE6, 0xF0, 0x9F, 0xED, 0xFF];
        for _ in 0..2000 {
            let len = rng.random_range(0..40);
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    if rng.random_bool(0.5) {
                        alphabet[rng.random_range(0..alphabet.len())]
                    } else {
                        rng.random()
                    }
                })
                .collect();
            assert_eq!(lossy(&bytes), String::from_utf8_lossy(&bytes), "{bytes:?}");
        }
    }
}
