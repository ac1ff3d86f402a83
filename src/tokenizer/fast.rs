//! A direct path through a byte-level BPE tokenizer's pipeline for the common case, with
//! `tokenizers`' own pieces and the same result.
//!
//! `tokenizers`' `encode` carries an alignment entry per byte through normalization and
//! pre-tokenization (offsets we never read), which makes it cost ~1.5 µs per token. For the
//! tokenizers of the models we train (Qwen, Llama 3, GPT-OSS, DeepSeek and the like: NFC or
//! no normalizer, regex `Split`s then `ByteLevel`, a BPE model, no truncation or padding) and
//! a text that is already NFC and holds no added token, the pipeline reduces to: split the
//! text with each pre-tokenizer regex in turn (`fancy_regex`, the engine and patterns
//! `tokenizers` uses, isolated pieces, empty pieces dropped), map each piece's bytes to the
//! byte-level alphabet, and hand it to the tokenizer's own BPE model. Anything else — another
//! pipeline, a text that NFC would change, a text with an added token in it, a regex error —
//! returns `None` and goes through `tokenizers`.

use aho_corasick::AhoCorasick;
use tokenizers::Model;
use unicode_normalization_alignments::{is_nfc_quick, IsNormalized};

use crate::types::TokenId;

/// GPT-2's `bytes_to_unicode`, byte → char (the pre-tokenizer `ByteLevel`'s map).
fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            u32::from(b)
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// The regex `ByteLevel` splits with when its `use_regex` is on (`tokenizers` 0.23).
const BYTE_LEVEL_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The fast path of one tokenizer (see the module documentation).
pub(super) struct FastEncoder {
    /// NFC normalizer (else none).
    nfc: bool,
    /// The pre-tokenizer's regexes, applied in order, each splitting every current piece.
    splits: Vec<fancy_regex::Regex>,
    /// Every added token's content: a text holding one takes the slow path.
    added: Option<AhoCorasick>,
    byte_char: [char; 256],
}

impl FastEncoder {
    /// The fast path of `inner`, when its pipeline is one this module reproduces.
    pub(super) fn build(inner: &tokenizers::Tokenizer) -> Option<FastEncoder> {
        if !matches!(inner.get_model(), tokenizers::ModelWrapper::BPE(_))
            || inner.get_truncation().is_some()
            || inner.get_padding().is_some()
        {
            return None;
        }
        let nfc = match inner.get_normalizer() {
            None => false,
            Some(tokenizers::NormalizerWrapper::NFC(_)) => true,
            Some(_) => return None,
        };
        // The pre-tokenizer's shape, read from its serialized form (the crate keeps a
        // `Sequence`'s members private).
        let pre = serde_json::to_value(inner.get_pre_tokenizer()?).ok()?;
        let steps = match pre.get("type")?.as_str()? {
            "Sequence" => pre.get("pretokenizers")?.as_array()?.clone(),
            _ => vec![pre],
        };
        let (last, splits) = steps.split_last()?;
        let byte_level_regex = match last.get("type")?.as_str()? {
            "ByteLevel" if last.get("add_prefix_space")?.as_bool()? => return None,
            "ByteLevel" => last.get("use_regex")?.as_bool()?,
            _ => return None,
        };
        let mut patterns = Vec::new();
        for s in splits {
            if s.get("type")?.as_str()? != "Split"
                || s.get("behavior")?.as_str()? != "Isolated"
                || s.get("invert")?.as_bool()?
            {
                return None;
            }
            patterns.push(s.get("pattern")?.get("Regex")?.as_str()?.to_owned());
        }
        if byte_level_regex {
            patterns.push(BYTE_LEVEL_REGEX.to_owned());
        }
        let splits = patterns
            .iter()
            .map(|p| fancy_regex::Regex::new(p).ok())
            .collect::<Option<Vec<_>>>()?;
        let contents: Vec<String> = inner
            .get_added_tokens_decoder()
            .values()
            .map(|t| t.content.clone())
            .filter(|c| !c.is_empty())
            .collect();
        let added = if contents.is_empty() {
            None
        } else {
            Some(AhoCorasick::new(&contents).ok()?)
        };
        Some(FastEncoder {
            nfc,
            splits,
            added,
            byte_char: byte_to_char(),
        })
    }

    /// `text`'s ids as `tokenizers` would give them (without special tokens), or `None` when
    /// this text needs the full pipeline.
    pub(super) fn encode(&self, inner: &tokenizers::Tokenizer, text: &str) -> Option<Vec<TokenId>> {
        if self.nfc && !text.is_ascii() && is_nfc_quick(text.chars()) != IsNormalized::Yes {
            return None;
        }
        if let Some(added) = &self.added {
            if added.is_match(text) {
                return None;
            }
        }
        let mut pieces: Vec<&str> = vec![text];
        for re in &self.splits {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                let mut prev = 0;
                for m in re.find_iter(piece) {
                    let m = m.ok()?;
                    if prev != m.start() {
                        next.push(&piece[prev..m.start()]);
                    }
                    if m.start() != m.end() {
                        next.push(m.as_str());
                    }
                    prev = m.end();
                }
                if prev != piece.len() {
                    next.push(&piece[prev..]);
                }
            }
            pieces = next;
        }
        let model = inner.get_model();
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        let mut mapped = String::new();
        for piece in pieces {
            mapped.clear();
            mapped.extend(piece.bytes().map(|b| self.byte_char[b as usize]));
            ids.extend(model.tokenize(&mapped).ok()?.iter().map(|t| t.id));
        }
        Some(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(json: &[u8]) -> tokenizers::Tokenizer {
        tokenizers::Tokenizer::from_bytes(json).expect("tokenizer")
    }

    fn check_taken(inner: &tokenizers::Tokenizer, special: &str) {
        let fast = FastEncoder::build(inner).expect("this pipeline has the direct path");
        for text in [
            "Natalia sold 48 clips in April.  Then\r\n it's 12,000!",
            "",
            "  \n",
        ] {
            let ids = fast.encode(inner, text).expect("direct path taken");
            assert_eq!(ids, inner.encode(text, false).expect("encode").get_ids());
        }
        assert!(fast.encode(inner, &format!("a {special} b")).is_none());
    }

    #[test]
    fn the_direct_path_is_taken_for_byte_level_bpe() {
        let tiny = load(include_bytes!(
            "../../examples/tiny-wordproblems/tokenizer.json"
        ));
        let special = tiny
            .get_added_tokens_decoder()
            .values()
            .next()
            .map(|t| t.content.clone())
            .expect("an added token");
        check_taken(&tiny, &special);
    }

    #[cfg(feature = "tinker")]
    #[test]
    fn the_direct_path_is_taken_for_qwen3_and_skips_what_nfc_changes() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/qwen3-tokenizer.json.zst"
        );
        let raw = std::fs::read(path).expect("fixture");
        let qwen = load(&zstd::decode_all(raw.as_slice()).expect("zstd"));
        check_taken(&qwen, "<|im_end|>");
        let fast = FastEncoder::build(&qwen).expect("direct path");
        assert!(fast.encode(&qwen, "cafe\u{301}").is_none());
        assert!(fast.encode(&qwen, "café 日本").is_some());
    }

    #[test]
    fn other_pipelines_take_the_full_path() {
        let mut tiny = load(include_bytes!(
            "../../examples/tiny-wordproblems/tokenizer.json"
        ));
        let _ = tiny.with_normalizer(Some(tokenizers::NormalizerWrapper::Lowercase(
            tokenizers::normalizers::Lowercase,
        )));
        assert!(FastEncoder::build(&tiny).is_none());
    }
}
