//! A direct path through a byte-level BPE tokenizer's pipeline for the common case, with
//! `tokenizers`' own pieces and the same result.
//!
//! `tokenizers`' `encode` carries an alignment entry per byte through normalization and
//! pre-tokenization (offsets we never read), which makes it cost ~1.5 µs per token. For the
//! tokenizers of the models we train (Qwen, Llama 3, GPT-OSS, DeepSeek and the like: NFC or
//! no normalizer, regex `Split`s then `ByteLevel`, a BPE model, no truncation or padding) and
//! a text that is already NFC and holds no added token, the pipeline reduces to: split the
//! text with each pre-tokenizer regex in turn (isolated pieces, empty pieces dropped), map
//! each piece's bytes to the byte-level alphabet, and hand it to the tokenizer's own BPE
//! model (each piece's ids are remembered: words recur). The regexes run as `tokenizers`
//! runs them (`fancy_regex`), except the GPT-2 family's `P|\s+(?!\S)|\s+`, whose one
//! lookahead is reproduced on a backtracking-free automaton ([`Splitter`]); for the patterns
//! of Qwen 2/3 and Llama 3/cl100k, a matcher written out by hand takes every piece whose
//! bytes decide it are ASCII ([`ascii_piece`]) and leaves the rest to the automaton.
//! Anything else — another pipeline, a text that NFC would change, a text with an added
//! token in it, a regex error — returns `None` and goes through `tokenizers`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use aho_corasick::AhoCorasick;
use tokenizers::Model;
use unicode_normalization_alignments::{IsNormalized, is_nfc_quick};

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

/// The head `P` (before [`WHITESPACE_TAIL`]) of the split pattern of Qwen 2 and 3 (one
/// digit a piece) and of Llama 3 and cl100k (`\p{N}{1,3}`: three), with that number of
/// digits: [`ascii_piece`] matches these patterns by hand over ASCII text.
const GPT4_HEADS: [(&str, usize); 2] = [
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+",
        1,
    ),
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+",
        3,
    ),
];

/// `\s` among ASCII bytes (Unicode `White_Space`: tab, line feed, vertical tab, form feed,
/// carriage return, space).
fn ascii_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ')
}

/// `[^\s\p{L}\p{N}]` among ASCII bytes.
fn ascii_other(b: u8) -> bool {
    !ascii_space(b) && !b.is_ascii_alphanumeric()
}

/// The end of the match of `GPT4_HEADS`' pattern (with its whitespace tail) that starts at
/// `at` in `text`, decided on ASCII bytes alone: `None` when a byte the decision depends on
/// is not ASCII (a letter, digit or space of another script may be one), and the automaton
/// decides. `digits`: the most digits of one piece.
///
/// The alternatives in order, as a backtracking engine tries them: a contraction (`'s`,
/// `'T`, `'re`…); an optional character that is not a line break, letter or digit, then
/// letters; digits; an optional space, then characters that are not spaces, letters or
/// digits, then line breaks; spaces up to their last line break; spaces not followed by a
/// non-space (all but the last of a run that a non-space follows); spaces. The automaton's
/// search cost ≈ 470 instructions a piece (measured with callgrind). Tested
/// against it on every string of up to four characters of a mixed alphabet.
fn ascii_piece(text: &[u8], at: usize, digits: usize) -> Option<usize> {
    /// The byte at `i`: `Ok(None)` past the end, `Err(())` when it is not ASCII.
    fn byte(text: &[u8], i: usize) -> Result<Option<u8>, ()> {
        match text.get(i) {
            None => Ok(None),
            Some(&b) if b.is_ascii() => Ok(Some(b)),
            Some(_) => Err(()),
        }
    }
    /// The end of the run of bytes in `class` from `i` (`None`: it ends at a non-ASCII byte).
    fn run(text: &[u8], mut i: usize, class: fn(u8) -> bool) -> Option<usize> {
        loop {
            match byte(text, i).ok()? {
                Some(b) if class(b) => i += 1,
                _ => return Some(i),
            }
        }
    }
    let c = byte(text, at).ok()??;
    let next = || byte(text, at + 1).ok();
    let lower = |b: Option<u8>| b.map(|b| b.to_ascii_lowercase());
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if c == b'\'' {
        match lower(next()?) {
            Some(b's' | b't' | b'm' | b'd') => return Some(at + 2),
            Some(b'r' | b'v') if lower(byte(text, at + 2).ok()?) == Some(b'e') => {
                return Some(at + 3);
            }
            Some(b'l') if lower(byte(text, at + 2).ok()?) == Some(b'l') => return Some(at + 3),
            _ => {}
        }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if c.is_ascii_alphabetic() {
        return run(text, at + 1, |b| b.is_ascii_alphabetic());
    }
    if c != b'\r'
        && c != b'\n'
        && !c.is_ascii_digit()
        && let Some(n) = next()?
        && n.is_ascii_alphabetic()
    {
        return run(text, at + 2, |b| b.is_ascii_alphabetic());
    }
    // \p{N} or \p{N}{1,3}
    if c.is_ascii_digit() {
        let mut end = at + 1;
        while end - at < digits {
            match byte(text, end).ok()? {
                Some(b) if b.is_ascii_digit() => end += 1,
                _ => break,
            }
        }
        return Some(end);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let others = match (c, next()?) {
        (b' ', Some(n)) if ascii_other(n) => Some(at + 1),
        _ if ascii_other(c) => Some(at),
        _ => None,
    };
    if let Some(from) = others {
        let mut end = run(text, from, ascii_other)?;
        while matches!(text.get(end), Some(b'\r' | b'\n')) {
            end += 1;
        }
        return Some(end);
    }
    // What is left is a space: `\s*[\r\n]+` ends after the run's last line break,
    // `\s+(?!\S)` leaves a run's last space to a non-space after it, `\s+` takes a lone one.
    let end = run(text, at, ascii_space)?;
    if let Some(k) = text[at..end]
        .iter()
        .rposition(|&b| b == b'\r' || b == b'\n')
    {
        return Some(at + k + 1);
    }
    if end < text.len() && end - at > 1 {
        return Some(end - 1);
    }
    Some(end)
}

/// One pre-tokenizer regex, as `fancy_regex` matches it.
enum Splitter {
    /// A pattern `P|\s+(?!\S)|\s+` whose `P` needs no lookaround, run as the two patterns
    /// `P` and `\s+` of one leftmost-first automaton (`regex-automata`, no backtracking).
    /// `\s+(?!\S)|\s+` matches exactly what `\s+` does, but one character shorter when
    /// the run is longer than one character and a non-space follows it (the last space then
    /// starts the next piece, e.g. `" word"`); so a `\s+` match is cut back by its last
    /// character in that case. `P` is tried first at every position in both, so every other
    /// match is the same. `ascii`: for the patterns of [`GPT4_HEADS`], their `digits`, and
    /// each piece is first matched by [`ascii_piece`].
    Automaton {
        re: regex_automata::meta::Regex,
        ascii: Option<usize>,
    },
    /// Any other pattern, through `fancy_regex`, the engine `tokenizers` uses.
    Backtracking(fancy_regex::Regex),
}

impl Splitter {
    fn new(pattern: &str) -> Option<Splitter> {
        if let Some(head) = pattern.strip_suffix(WHITESPACE_TAIL)
            && let Ok(re) = regex_automata::meta::Regex::new_many(&[head, r"\s+"])
        {
            let ascii = GPT4_HEADS
                .iter()
                .find(|(h, _)| *h == head)
                .map(|&(_, digits)| digits);
            return Some(Splitter::Automaton { re, ascii });
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
            Splitter::Automaton { re, ascii } => {
                use regex_automata::{Anchored, Input};
                let mut at = 0;
                while at < text.len() {
                    let piece = ascii.and_then(|d| ascii_piece(text.as_bytes(), at, d));
                    if let Some(end) = piece.filter(|&end| end > at) {
                        f(at, end);
                        at = end;
                        continue;
                    }
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
    /// A copy of the tokenizer's BPE model without its empty `continuing_subword_prefix` /
    /// `end_of_word_suffix` (`None`: the model has none, the tokenizer's own is used). See
    /// [`without_empty_affixes`].
    bpe: Option<tokenizers::models::bpe::BPE>,
}

/// `bpe` without an empty `continuing_subword_prefix` or `end_of_word_suffix`, when it has
/// one (`None` otherwise).
///
/// `tokenizers`' BPE formats a new `String` for every character of a word it has not seen
/// yet when either option is set, even to `""` — which the `tokenizer.json` files of Qwen 2
/// and 3 and others say. Prefixing or suffixing `""` changes nothing (the model's merges were
/// built with a prefix length of 0 either way), so a copy without them gives the same ids
/// with about half the work per new word. The copy is made once per tokenizer (≈ 50 ms for
/// Qwen's 151 k tokens).
fn without_empty_affixes(
    bpe: &tokenizers::models::bpe::BPE,
) -> Option<tokenizers::models::bpe::BPE> {
    let empty = |o: &Option<String>| o.as_deref() == Some("");
    if !empty(&bpe.continuing_subword_prefix) && !empty(&bpe.end_of_word_suffix) {
        return None;
    }
    let mut copy = bpe.clone();
    if empty(&copy.continuing_subword_prefix) {
        copy.continuing_subword_prefix = None;
    }
    if empty(&copy.end_of_word_suffix) {
        copy.end_of_word_suffix = None;
    }
    Some(copy)
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
        Some(FastEncoder {
            nfc,
            splits,
            added,
            byte_char: byte_to_char(),
            pieces: deterministic.then(|| Mutex::new(HashMap::default())),
            bpe: without_empty_affixes(bpe),
        })
    }

    /// `text`'s ids as `tokenizers` would give them (without special tokens), or `None` when
    /// this text needs the full pipeline.
    pub(super) fn encode(&self, inner: &tokenizers::Tokenizer, text: &str) -> Option<Vec<TokenId>> {
        if self.nfc && !text.is_ascii() && is_nfc_quick(text.chars()) != IsNormalized::Yes {
            return None;
        }
        if let Some(added) = &self.added
            && added.is_match(text)
        {
            return None;
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
        let tokenize = |mapped: &str| match &self.bpe {
            Some(bpe) => bpe.tokenize(mapped),
            None => inner.get_model().tokenize(mapped),
        };
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        let mut mapped = String::new();
        let mut cache = self
            .pieces
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner));
        for piece in pieces {
            if let Some(hit) = cache.as_ref().and_then(|c| c.get(piece)) {
                ids.extend_from_slice(hit);
                continue;
            }
            mapped.clear();
            mapped.extend(piece.bytes().map(|b| self.byte_char[b as usize]));
            let start = ids.len();
            ids.extend(tokenize(&mapped).ok()?.iter().map(|t| t.id));
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
        // No prefix or suffix to drop: the tokenizer's own model is used.
        assert!(FastEncoder::build(&tiny).is_some_and(|f| f.bpe.is_none()));
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
        // `"end_of_word_suffix": ""`: the direct path runs a copy of the model without them
        // (`check_taken` above compared its ids with `tokenizers`' own).
        let bpe = fast.bpe.as_ref().expect("a copy without the empty affixes");
        assert_eq!(bpe.continuing_subword_prefix, None);
        assert_eq!(bpe.end_of_word_suffix, None);
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
            assert!(matches!(fast, Splitter::Automaton { .. }), "{pattern}");
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

    /// The hand-written ASCII matcher gives the automaton's (and so `fancy_regex`'s)
    /// pieces: every string of up to four characters of an alphabet that holds each class
    /// of ASCII byte the patterns tell apart (letters of the contractions in both cases,
    /// digits, each ASCII space, line breaks, punctuation, control bytes) and non-ASCII
    /// letters, digits, spaces and marks next to them; then every string of two ASCII bytes.
    #[test]
    fn the_ascii_matcher_splits_as_the_automaton() {
        let alphabet = [
            "a", "Z", "s", "T", "r", "E", "v", "l", "L", "d", "m", "7", " ", "\t", "\n", "\r",
            "\u{b}", "\u{c}", "\u{1c}", "'", ".", "!", "\0", "é", "\u{a0}", "\u{17f}", "\u{663}",
            "\u{301}", "\u{3000}",
        ];
        for (pattern, digits) in [(QWEN_SPLIT, 1), (LLAMA3_SPLIT, 3)] {
            let fast = Splitter::new(pattern).expect("pattern");
            assert!(
                matches!(fast, Splitter::Automaton { ascii: Some(d), .. } if d == digits),
                "{pattern}"
            );
            let Splitter::Automaton { re, .. } = &fast else {
                unreachable!()
            };
            let plain = Splitter::Automaton {
                re: re.clone(),
                ascii: None,
            };
            let mut text = String::new();
            let n = alphabet.len();
            for len in 1..=4u32 {
                for mut code in 0..n.pow(len) {
                    text.clear();
                    for _ in 0..len {
                        text.push_str(alphabet[code % n]);
                        code /= n;
                    }
                    assert_eq!(matches(&fast, &text), matches(&plain, &text), "{text:?}");
                }
            }
            for a in 0..128u8 {
                for b in 0..128u8 {
                    let text = String::from_utf8(vec![a, b]).expect("ASCII");
                    assert_eq!(matches(&fast, &text), matches(&plain, &text), "{text:?}");
                }
            }
            // Longer digit runs and contractions inside words, against `fancy_regex` too.
            let slow = Splitter::Backtracking(fancy_regex::Regex::new(pattern).expect("fancy"));
            for text in [
                "1234567 890",
                "I'm sure they'LL say it's 42,000.5$!",
                "Janet\u{2019}s ducks lay 16 eggs per day.\n\n  Answer:",
                "x  \t\n \r\n  y \n",
                "a'b'sss 'RE're've'd'",
            ] {
                assert_eq!(matches(&fast, text), matches(&slow, text), "{text:?}");
                assert_eq!(matches(&fast, text), matches(&plain, text), "{text:?}");
            }
        }
        // Other patterns of the family keep to the automaton alone.
        assert!(matches!(
            Splitter::new(BYTE_LEVEL_REGEX).expect("pattern"),
            Splitter::Automaton { ascii: None, .. }
        ));
    }

    #[test]
    fn only_empty_affixes_are_dropped() {
        let bpe = |prefix: Option<&str>, suffix: Option<&str>| {
            let mut b = tokenizers::models::bpe::BPE::builder();
            if let Some(p) = prefix {
                b = b.continuing_subword_prefix(p.to_owned());
            }
            if let Some(s) = suffix {
                b = b.end_of_word_suffix(s.to_owned());
            }
            b.build().expect("an empty BPE")
        };
        assert!(without_empty_affixes(&bpe(None, None)).is_none());
        assert!(without_empty_affixes(&bpe(Some("##"), Some("</w>"))).is_none());
        let copy = without_empty_affixes(&bpe(Some("##"), Some(""))).expect("a copy");
        assert_eq!(copy.continuing_subword_prefix.as_deref(), Some("##"));
        assert_eq!(copy.end_of_word_suffix, None);
        let copy = without_empty_affixes(&bpe(Some(""), None)).expect("a copy");
        assert_eq!(copy.continuing_subword_prefix, None);
        assert_eq!(copy.end_of_word_suffix, None);
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
