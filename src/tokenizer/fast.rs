//! A direct path through a byte-level BPE tokenizer's pipeline for the common case, with
//! `tokenizers`' own pieces and the same result.
//!
//! `tokenizers`' `encode` carries an alignment entry per byte through normalization and
//! pre-tokenization (offsets we never read), which makes it cost ~1.5 µs per token. For the
//! tokenizers of the models we train (Qwen, Llama 3, GPT-OSS, DeepSeek and the like: NFC or
//! no normalizer, regex `Split`s then `ByteLevel`, a BPE model, no truncation or padding) and
//! a text that is already NFC and holds no added token, the pipeline reduces to: split the
//! text with each pre-tokenizer regex in turn (isolated pieces, empty pieces dropped), then
//! apply the model's merges to each piece's bytes ([`ByteMerges`]; models it does not
//! reproduce get the piece mapped to the byte-level alphabet and split by their own BPE), and
//! remember each piece's ids (words recur). The regexes run as `tokenizers`
//! runs them (`fancy_regex`), except the GPT-2 family's `P|\s+(?!\S)|\s+`, whose one
//! lookahead is reproduced on a backtracking-free automaton ([`Splitter`]). Anything else —
//! another pipeline, a text that NFC would change, a text with an added token in it, a regex
//! error — returns `None` and goes through `tokenizers`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

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

/// Pre-tokenized piece → its ids (see [`FastEncoder::encode`]).
type PieceCache = HashMap<Box<str>, Box<[TokenId]>, super::CacheHasher>;

/// Pieces longer than this (bytes) are not cached (`tokenizers`' own BPE cache limit).
const PIECE_CACHE_MAX_LEN: usize = 256;
/// The piece cache starts over when it holds this many pieces (a few MB at most).
const PIECE_CACHE_MAX_ENTRIES: usize = 1 << 16;

/// The tail of the GPT-2 family's split patterns (GPT-2, cl100k, Llama 3, Qwen...): a run of
/// whitespace not followed by a non-space, else any run of whitespace. The lookahead is what
/// makes these patterns need a backtracking engine.
const WHITESPACE_TAIL: &str = r"|\s+(?!\S)|\s+";

/// One pre-tokenizer regex, as `fancy_regex` matches it.
enum Splitter {
    /// A pattern `P|\s+(?!\S)|\s+` whose `P` needs no lookaround, run as the two patterns
    /// `P` and `\s+` of one leftmost-first automaton (`regex-automata`, no backtracking).
    /// `\s+(?!\S)|\s+` matches exactly what `\s+` does, but one character shorter when
    /// the run is longer than one character and a non-space follows it (the last space then
    /// starts the next piece, e.g. `" word"`); so a `\s+` match is cut back by its last
    /// character in that case. `P` is tried first at every position in both, so every other
    /// match is the same.
    Automaton(regex_automata::meta::Regex),
    /// Any other pattern, through `fancy_regex`, the engine `tokenizers` uses.
    Backtracking(fancy_regex::Regex),
}

impl Splitter {
    fn new(pattern: &str) -> Option<Splitter> {
        if let Some(head) = pattern.strip_suffix(WHITESPACE_TAIL) {
            if let Ok(re) = regex_automata::meta::Regex::new_many(&[head, r"\s+"]) {
                return Some(Splitter::Automaton(re));
            }
        }
        fancy_regex::Regex::new(pattern)
            .ok()
            .map(Splitter::Backtracking)
    }

    /// Calls `f(start, end)` for each match in `text`, in order, as `fancy_regex`'s
    /// `find_iter` gives them; `None` on a regex error, or an empty match from the automaton
    /// (left to the full pipeline rather than reproducing the iterator's rules for them).
    fn for_each_match(&self, text: &str, mut f: impl FnMut(usize, usize)) -> Option<()> {
        match self {
            Splitter::Backtracking(re) => {
                for m in re.find_iter(text) {
                    let m = m.ok()?;
                    f(m.start(), m.end());
                }
            }
            Splitter::Automaton(re) => {
                use regex_automata::{Anchored, Input};
                let mut at = 0;
                while at < text.len() {
                    // Pieces usually follow each other: a match anchored where the last one
                    // ended is the leftmost one, and `search_half` finds its end with the
                    // forward automaton alone (its start is `at`; no reverse scan). Only
                    // when there is none does an unanchored search look further.
                    let input = Input::new(text).range(at..);
                    let found = match re.search_half(&input.clone().anchored(Anchored::Yes)) {
                        Some(half) => Some((at, half.offset(), half.pattern())),
                        None => re.search(&input).map(|m| (m.start(), m.end(), m.pattern())),
                    };
                    let Some((start, mut end, pattern)) = found else {
                        break;
                    };
                    if start == end {
                        return None;
                    }
                    if pattern.as_usize() == 1 && end < text.len() {
                        // `\s+` stopped before a non-space: `\s+(?!\S)` keeps its last
                        // character for the next piece when the run has more than one.
                        let last = text[start..end]
                            .chars()
                            .next_back()
                            .map_or(0, char::len_utf8);
                        if end - start > last {
                            end -= last;
                        }
                    }
                    f(start, end);
                    at = end;
                }
            }
        }
        Some(())
    }
}

/// The fast path of one tokenizer (see the module documentation).
pub(super) struct FastEncoder {
    /// NFC normalizer (else none).
    nfc: bool,
    /// The pre-tokenizer's regexes, applied in order, each splitting every current piece.
    splits: Vec<Splitter>,
    /// Every added token's content: a text holding one takes the slow path.
    added: Option<AhoCorasick>,
    byte_char: [char; 256],
    /// Pre-tokenized piece → its ids: the same words recur in every prompt, and the BPE
    /// model's own answer costs a `String` per token. `None` when the model samples merges
    /// (BPE dropout), where the same piece may split differently each time.
    pieces: Option<Mutex<PieceCache>>,
    /// The model's merges by pair, for pieces not cached yet (`None`: the model is not one
    /// [`ByteMerges`] reproduces, and the tokenizer's own model splits them).
    merges: Option<ByteMerges>,
}

/// A byte-level BPE model's merges, applied to a piece's bytes without `tokenizers`' per-word
/// machinery.
///
/// `tokenizers`' BPE builds a `Word` and a heap of candidate merges for every word it has
/// not seen, then a `Token` with its own `String` per resulting token — ≈ 8 k instructions a
/// GSM8K word, most of encoding a new question. Here a piece's bytes map to their
/// one-character tokens and the lowest-ranked adjacent pair is merged (the leftmost of equal
/// ranks, as `tokenizers`' heap pops them) until no pair has a merge: the same ids, with
/// two hash lookups a merge and no allocation (`tests/tokenizer.rs` compares the ids with
/// `tokenizers`' own `encode` on GSM8K, 14 k model answers and generated text).
///
/// Built for the models whose every byte is a token, without BPE dropout and without a
/// non-empty `continuing_subword_prefix` / `end_of_word_suffix` (Qwen's `tokenizer.json`
/// says `""` for both, which changes nothing); other models keep `tokenizers`' own BPE.
struct ByteMerges {
    /// Each byte's one-character token.
    byte_ids: [TokenId; 256],
    /// (left, right) as `left << 32 | right` → (rank, merged token).
    pairs: HashMap<u64, (u32, TokenId), ahash::RandomState>,
    /// `ignore_merges`: a piece that is a token as a whole is that token.
    ignore_merges: bool,
}

/// No merge: ranks past every real one.
const NO_MERGE: (u32, TokenId) = (u32::MAX, 0);

impl ByteMerges {
    /// `bpe`'s merges, when it is a model this reproduces (`None` otherwise).
    fn build(bpe: &tokenizers::models::bpe::BPE, byte_char: &[char; 256]) -> Option<ByteMerges> {
        if bpe.dropout.is_some_and(|p| p != 0.0) {
            return None;
        }
        let set = |o: &Option<String>| o.as_deref().is_some_and(|s| !s.is_empty());
        if set(&bpe.continuing_subword_prefix) || set(&bpe.end_of_word_suffix) {
            return None;
        }
        let mut byte_ids = [0; 256];
        let mut utf8 = [0u8; 4];
        for (id, c) in byte_ids.iter_mut().zip(byte_char) {
            *id = bpe.token_to_id(c.encode_utf8(&mut utf8))?;
        }
        // The merges in rank order, read from the model's serialized form (the crate keeps
        // its merge map private) by a serializer that sees only them.
        let mut grab = MergeGrab {
            bpe,
            // About one merge per token past the bytes.
            pairs: HashMap::with_capacity_and_hasher(bpe.get_vocab_size(), Default::default()),
            in_merges: false,
            left: None,
            joined: String::new(),
        };
        serde::Serialize::serialize(bpe, &mut grab).ok()?;
        let pairs = grab.pairs;
        Some(ByteMerges {
            byte_ids,
            pairs,
            ignore_merges: bpe.ignore_merges,
        })
    }

    fn pair(&self, left: TokenId, right: TokenId) -> (u32, TokenId) {
        self.pairs
            .get(&pair_key(left, right))
            .copied()
            .unwrap_or(NO_MERGE)
    }

    /// Appends `piece`'s tokens to `out`; `ranks` is scratch space.
    fn merge(&self, piece: &[u8], out: &mut Vec<TokenId>, ranks: &mut Vec<(u32, TokenId)>) {
        let start = out.len();
        out.extend(piece.iter().map(|&b| self.byte_ids[usize::from(b)]));
        let word = &out[start..];
        ranks.clear();
        ranks.extend(word.windows(2).map(|w| self.pair(w[0], w[1])));
        loop {
            // The lowest rank, the leftmost of equals.
            let mut best = NO_MERGE.0;
            let mut at = 0;
            for (i, &(rank, _)) in ranks.iter().enumerate() {
                if rank < best {
                    best = rank;
                    at = i;
                }
            }
            if best == NO_MERGE.0 {
                return;
            }
            let i = start + at;
            out[i] = ranks[at].1;
            out.remove(i + 1);
            ranks.remove(at);
            if at > 0 {
                ranks[at - 1] = self.pair(out[i - 1], out[i]);
            }
            if at < ranks.len() {
                ranks[at] = self.pair(out[i], out[i + 1]);
            }
        }
    }
}

/// A `serde` serializer that takes a BPE model's `merges` field (a sequence of
/// `(left, right)` token pairs in rank order) into a pair map, skipping every other field
/// without serializing it. Anything of another shape is an error.
struct MergeGrab<'a> {
    bpe: &'a tokenizers::models::bpe::BPE,
    pairs: HashMap<u64, (u32, TokenId), ahash::RandomState>,
    /// Inside the `merges` field.
    in_merges: bool,
    /// The current pair's left token.
    left: Option<TokenId>,
    /// The current pair's tokens joined.
    joined: String,
}

type GrabError = serde::de::value::Error;

fn not_merges() -> GrabError {
    serde::ser::Error::custom("not a BPE model's merges")
}

/// `Serializer` methods for the shapes a BPE model's serialization never takes here.
macro_rules! unexpected {
    ($($name:ident($($ty:ty),*)),* $(,)?) => {
        $(fn $name(self, $(_: $ty),*) -> Result<(), GrabError> {
            Err(not_merges())
        })*
    };
}

impl serde::Serializer for &mut MergeGrab<'_> {
    type Ok = ();
    type Error = GrabError;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = serde::ser::Impossible<(), GrabError>;
    type SerializeTupleVariant = serde::ser::Impossible<(), GrabError>;
    type SerializeMap = serde::ser::Impossible<(), GrabError>;
    type SerializeStruct = Self;
    type SerializeStructVariant = serde::ser::Impossible<(), GrabError>;

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, GrabError> {
        Ok(self)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self, GrabError> {
        if self.in_merges {
            Ok(self)
        } else {
            Err(not_merges())
        }
    }
    fn serialize_tuple(self, _: usize) -> Result<Self, GrabError> {
        self.serialize_seq(None)
    }
    fn serialize_str(self, token: &str) -> Result<(), GrabError> {
        if !self.in_merges {
            return Err(not_merges());
        }
        let id = self.bpe.token_to_id(token).ok_or_else(not_merges)?;
        match self.left.take() {
            None => {
                self.left = Some(id);
                self.joined.clear();
                self.joined.push_str(token);
            }
            Some(left) => {
                self.joined.push_str(token);
                let merged = self.bpe.token_to_id(&self.joined).ok_or_else(not_merges)?;
                // `tokenizers` serializes each pair once, in rank order.
                let rank = u32::try_from(self.pairs.len()).map_err(|_| not_merges())?;
                self.pairs.insert(pair_key(left, id), (rank, merged));
            }
        }
        Ok(())
    }
    unexpected!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );
    fn serialize_some<T: serde::Serialize + ?Sized>(self, _: &T) -> Result<(), GrabError> {
        Err(not_merges())
    }
    fn serialize_newtype_struct<T: serde::Serialize + ?Sized>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<(), GrabError> {
        Err(not_merges())
    }
    fn serialize_newtype_variant<T: serde::Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), GrabError> {
        Err(not_merges())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, GrabError> {
        Err(not_merges())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, GrabError> {
        Err(not_merges())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, GrabError> {
        Err(not_merges())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, GrabError> {
        Err(not_merges())
    }
}

impl serde::ser::SerializeStruct for &mut MergeGrab<'_> {
    type Ok = ();
    type Error = GrabError;
    fn serialize_field<T: serde::Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), GrabError> {
        if key == "merges" {
            self.in_merges = true;
            value.serialize(&mut **self)?;
            self.in_merges = false;
        }
        Ok(())
    }
    fn end(self) -> Result<(), GrabError> {
        Ok(())
    }
}

impl serde::ser::SerializeSeq for &mut MergeGrab<'_> {
    type Ok = ();
    type Error = GrabError;
    fn serialize_element<T: serde::Serialize + ?Sized>(&mut self, v: &T) -> Result<(), GrabError> {
        v.serialize(&mut **self)
    }
    fn end(self) -> Result<(), GrabError> {
        Ok(())
    }
}

impl serde::ser::SerializeTuple for &mut MergeGrab<'_> {
    type Ok = ();
    type Error = GrabError;
    fn serialize_element<T: serde::Serialize + ?Sized>(&mut self, v: &T) -> Result<(), GrabError> {
        v.serialize(&mut **self)
    }
    fn end(self) -> Result<(), GrabError> {
        Ok(())
    }
}

fn pair_key(left: TokenId, right: TokenId) -> u64 {
    u64::from(left) << 32 | u64::from(right)
}

impl FastEncoder {
    /// The fast path of `inner`, when its pipeline is one this module reproduces.
    pub(super) fn build(inner: &tokenizers::Tokenizer) -> Option<FastEncoder> {
        let tokenizers::ModelWrapper::BPE(bpe) = inner.get_model() else {
            return None;
        };
        if inner.get_truncation().is_some() || inner.get_padding().is_some() {
            return None;
        }
        let deterministic = bpe.dropout.is_none_or(|p| p == 0.0);
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
            .map(|p| Splitter::new(p))
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
        let byte_char = byte_to_char();
        Some(FastEncoder {
            nfc,
            splits,
            added,
            byte_char,
            pieces: deterministic.then(|| Mutex::new(HashMap::default())),
            merges: ByteMerges::build(bpe, &byte_char),
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
                re.for_each_match(piece, |start, end| {
                    if prev != start {
                        next.push(&piece[prev..start]);
                    }
                    if start != end {
                        next.push(&piece[start..end]);
                    }
                    prev = end;
                })?;
                if prev != piece.len() {
                    next.push(&piece[prev..]);
                }
            }
            pieces = next;
        }
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        let mut mapped = String::new();
        let mut ranks = Vec::new();
        let mut cache = self
            .pieces
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner));
        for piece in pieces {
            if let Some(hit) = cache.as_ref().and_then(|c| c.get(piece)) {
                ids.extend_from_slice(hit);
                continue;
            }
            let start = ids.len();
            match &self.merges {
                Some(m) if !m.ignore_merges => m.merge(piece.as_bytes(), &mut ids, &mut ranks),
                merges => {
                    mapped.clear();
                    mapped.extend(piece.bytes().map(|b| self.byte_char[b as usize]));
                    let model = inner.get_model();
                    match merges {
                        // `ignore_merges`: a piece that is a token is that token.
                        Some(m) => match model.token_to_id(&mapped) {
                            Some(whole) => ids.push(whole),
                            None => m.merge(piece.as_bytes(), &mut ids, &mut ranks),
                        },
                        None => ids.extend(model.tokenize(&mapped).ok()?.iter().map(|t| t.id)),
                    }
                }
            }
            if let Some(c) = cache
                .as_mut()
                .filter(|_| piece.len() <= PIECE_CACHE_MAX_LEN)
            {
                super::insert_bounded(
                    c,
                    piece.into(),
                    ids[start..].into(),
                    PIECE_CACHE_MAX_ENTRIES,
                );
            }
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
            let expected = inner.encode(text, false).expect("encode");
            // The second time from the piece cache.
            for _ in 0..2 {
                let ids = fast.encode(inner, text).expect("direct path taken");
                assert_eq!(ids, expected.get_ids());
            }
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
        // Qwen's `tokenizer.json` says `"continuing_subword_prefix": ""` and
        // `"end_of_word_suffix": ""`, which change nothing: its merges are applied here
        // (`check_taken` above compared the ids with `tokenizers`' own).
        assert!(fast.merges.is_some());
        assert!(fast.encode(&qwen, "cafe\u{301}").is_none());
        assert!(fast.encode(&qwen, "café 日本").is_some());
    }

    /// The split patterns of Qwen 2/3 (also Llama 3 and cl100k up to the digit rule) and
    /// GPT-2's `ByteLevel` regex.
    const QWEN_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    fn matches(s: &Splitter, text: &str) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        s.for_each_match(text, |a, b| out.push((a, b)))
            .expect("no regex error");
        out
    }

    /// The automaton gives `fancy_regex`'s matches, lookahead included, on random text
    /// weighted towards whitespace runs of every kind (spaces, tabs, newlines, `\r`, U+3000,
    /// U+00A0) next to letters, digits, punctuation, apostrophes and CJK.
    #[test]
    fn the_automaton_splits_as_the_backtracking_engine() {
        use rand::{Rng, SeedableRng};
        let alphabet = [
            " ",
            "  ",
            "\t",
            "\n",
            "\r\n",
            "\r",
            "\u{3000}",
            "\u{a0}",
            "a",
            "Z",
            "é",
            "日本",
            "7",
            "42",
            "'s",
            "'LL",
            "'",
            "!",
            ",",
            ".",
            "$",
            "\u{1f980}",
            "-",
            "\u{2028}",
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for pattern in [QWEN_SPLIT, LLAMA3_SPLIT, BYTE_LEVEL_REGEX] {
            let fast = Splitter::new(pattern).expect("pattern");
            assert!(matches!(fast, Splitter::Automaton(_)), "{pattern}");
            let slow = Splitter::Backtracking(fancy_regex::Regex::new(pattern).expect("fancy"));
            for i in 0..3000 {
                let len = rng.random_range(0..24);
                let text: String = (0..len)
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect();
                assert_eq!(
                    matches(&fast, &text),
                    matches(&slow, &text),
                    "pattern {pattern}, case {i}: {text:?}"
                );
            }
        }
        // Patterns without the whitespace tail stay with the backtracking engine.
        assert!(matches!(
            Splitter::new("[0-9]+").expect("pattern"),
            Splitter::Backtracking(_)
        ));
    }

    /// A byte-level BPE tokenizer with every byte a token and random merges over a few
    /// letters (overlapping pairs, merges whose result is made two ways, pairs that rank
    /// below the pair that made one of their halves).
    fn synthetic(rng: &mut impl rand::Rng, ignore_merges: bool) -> tokenizers::Tokenizer {
        let byte_char = byte_to_char();
        let mut vocab: HashMap<String, u32, ahash::RandomState> = byte_char
            .iter()
            .zip(0..)
            .map(|(c, id)| (c.to_string(), id))
            .collect();
        let mut tokens: Vec<String> = "abc é"
            .bytes()
            .map(|b| byte_char[usize::from(b)].to_string())
            .collect();
        let mut merges: Vec<(String, String)> = Vec::new();
        for _ in 0..rng.random_range(1..40) {
            let left = tokens[rng.random_range(0..tokens.len())].clone();
            let right = tokens[rng.random_range(0..tokens.len())].clone();
            if merges.iter().any(|(l, r)| *l == left && *r == right) {
                continue;
            }
            let joined = format!("{left}{right}");
            if !vocab.contains_key(&joined) {
                vocab.insert(joined.clone(), u32::try_from(vocab.len()).expect("small"));
                tokens.push(joined);
            }
            merges.push((left, right));
        }
        let bpe = tokenizers::models::bpe::BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .continuing_subword_prefix(String::new())
            .build()
            .expect("a BPE model");
        let mut tok = tokenizers::Tokenizer::new(bpe);
        tok.with_pre_tokenizer(Some(
            tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, true, true),
        ));
        tok
    }

    #[test]
    fn merges_are_applied_as_tokenizers_applies_them() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        for case in 0..60 {
            let tok = synthetic(&mut rng, case % 3 == 0);
            let fast = FastEncoder::build(&tok).expect("direct path");
            assert!(fast.merges.is_some(), "case {case}");
            for _ in 0..40 {
                let len = rng.random_range(1..24);
                let text: String = (0..len)
                    .map(|_| ['a', 'b', 'c', ' ', 'b', 'é'][rng.random_range(0..6)])
                    .collect();
                let expected = tok.encode(text.as_str(), false).expect("encode");
                assert_eq!(
                    fast.encode(&tok, &text).expect("direct path taken"),
                    expected.get_ids(),
                    "case {case}: {text:?}"
                );
            }
        }
    }

    #[test]
    fn merges_are_applied_here_only_for_models_they_reproduce() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let byte_char = byte_to_char();
        let tok = synthetic(&mut rng, false);
        let tokenizers::ModelWrapper::BPE(bpe) = tok.get_model() else {
            panic!("a BPE model");
        };
        assert!(ByteMerges::build(bpe, &byte_char).is_some());
        for (prefix, suffix) in [(Some("##"), None), (None, Some("</w>"))] {
            let mut other = bpe.clone();
            other.continuing_subword_prefix = prefix.map(str::to_owned);
            other.end_of_word_suffix = suffix.map(str::to_owned);
            assert!(ByteMerges::build(&other, &byte_char).is_none());
        }
        let mut empty = bpe.clone();
        empty.end_of_word_suffix = Some(String::new());
        assert!(ByteMerges::build(&empty, &byte_char).is_some());
        let mut dropout = bpe.clone();
        dropout.dropout = Some(0.1);
        assert!(ByteMerges::build(&dropout, &byte_char).is_none());
        // Bytes without a token of their own.
        assert!(ByteMerges::build(bpe, &['\u{4e00}'; 256]).is_none());
    }

    #[test]
    fn pieces_are_not_cached_under_bpe_dropout() {
        let mut tiny = load(include_bytes!(
            "../../examples/tiny-wordproblems/tokenizer.json"
        ));
        assert!(FastEncoder::build(&tiny).is_some_and(|f| f.pieces.is_some()));
        let tokenizers::ModelWrapper::BPE(bpe) = tiny.get_model() else {
            panic!("a BPE model");
        };
        let mut bpe = bpe.clone();
        bpe.dropout = Some(0.5);
        let _ = tiny.with_model(tokenizers::ModelWrapper::BPE(bpe));
        assert!(FastEncoder::build(&tiny).is_some_and(|f| f.pieces.is_none()));
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
