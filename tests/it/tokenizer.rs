//! `Tokenizer::encode` (which takes a direct path through byte-level BPE tokenizers) gives
//! exactly the ids of `tokenizers`' own `encode`, on real text and on generated text meant to
//! hit the pipeline's edges: contractions, whitespace runs, `\r\n`, digits, punctuation runs,
//! letters of other scripts, combining marks (texts NFC changes), emoji, special tokens.

use proptest::prelude::*;
use rlvr::tokenizer::Tokenizer;

fn reference(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.inner()
        .encode(text, false)
        .unwrap_or_else(|e| panic!("tokenizers failed on {text:?}: {e}"))
        .get_ids()
        .to_vec()
}

fn tiny_wordproblems() -> Tokenizer {
    Tokenizer::from_file(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/tiny-wordproblems/tokenizer.json"
    ))
    .expect("tiny-wordproblems tokenizer")
}

fn check(tok: &Tokenizer, text: &str) {
    // Twice: the second call may come from the cache of short texts.
    for _ in 0..2 {
        assert_eq!(
            tok.encode(text).expect("encode"),
            reference(tok, text),
            "text {text:?}"
        );
    }
}

/// Every question and answer of the GSM8K fixtures and every response of the grader
/// agreement corpus (14k model-like answers: LaTeX, odd spacing, mostly ASCII — the other
/// tests cover other scripts).
#[test]
fn encode_matches_tokenizers_on_real_text() {
    let mut texts: Vec<String> = Vec::new();
    for f in ["train.jsonl", "test.jsonl"] {
        let path = format!("{}/tests/fixtures/gsm8k/{f}", env!("CARGO_MANIFEST_DIR"));
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            texts.push(v["question"].as_str().unwrap().to_owned());
            texts.push(v["answer"].as_str().unwrap().to_owned());
        }
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/grader/agreement.jsonl.zst"
    );
    let raw = zstd::decode_all(std::fs::read(path).unwrap().as_slice()).unwrap();
    for line in String::from_utf8(raw).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        texts.push(v["response"].as_str().unwrap().to_owned());
    }
    assert!(texts.len() > 14_000);
    for tok in [crate::common::qwen3_tokenizer(), tiny_wordproblems()] {
        for t in &texts {
            check(&tok, t);
        }
    }
}

#[test]
fn encode_matches_tokenizers_on_edge_cases() {
    let cases = [
        "",
        " ",
        "   ",
        "\n",
        "\r\n\r\n",
        " \n \n ",
        "a  b   c    ",
        "I'm sure they'll say it's theirs; WE'LL SEE, I'D SAY",
        "12345678901234567890 + 0.5 = 1,000,000",
        "café naïve résumé",        // precomposed: already NFC
        "cafe\u{301} nai\u{308}ve", // combining marks: NFC changes it
        "Å Å Ω Ω",                  // singletons NFC rewrites
        "日本語のテキスト 123 漢字",
        "emoji 🎉🎉 and \u{200d} joiners 👩‍👩‍👧",
        "<|im_start|>user\nhi<|im_end|>",
        "text <|endoftext|> more",
        "tabs\tand\x0bvertical\x0cfeeds",
        "\\boxed{\\frac{1}{2}}  ",
        "...!!!???---___",
        "\u{feff}bom and \u{a0}nbsp",
    ];
    for tok in [crate::common::qwen3_tokenizer(), tiny_wordproblems()] {
        for t in cases {
            check(&tok, t);
        }
    }
}

fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z]{1,8}",
        "[0-9]{1,6}",
        "[ \t\r\n]{1,4}",
        "[.,;:!?'\"(){}\\[\\]\\\\$%+=*/<>|_-]{1,3}",
        prop::sample::select(vec![
            "'s",
            "'T",
            "'re",
            "'VE",
            "'m",
            "'ll",
            "'d",
            "é",
            "e\u{301}",
            "ß",
            "Ω",
            "\u{2126}",
            "日本",
            "🎉",
            "\u{a0}",
            "\u{3000}",
            "ﬁ",
            "<|im_end|>",
            "<|endoftext|>",
            "\r\n",
        ])
        .prop_map(str::to_owned),
        any::<char>().prop_map(|c| c.to_string()),
    ]
}

// Failing cases are saved to, and replayed first from, `tests/proptest-regressions/tokenizer.txt`:
// proptest's default `FileFailurePersistence::SourceParallel("proptest-regressions")` looks
// up from this file for the directory holding `main.rs` (`tests/it/`) and uses
// `proptest-regressions/<path below it>.txt` beside that directory.
proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn encode_matches_tokenizers_on_generated_text(
        parts in prop::collection::vec(piece(), 0..24),
        which in 0..2usize,
    ) {
        let text: String = parts.concat();
        let tok = if which == 0 { crate::common::qwen3_tokenizer() } else { tiny_wordproblems() };
        prop_assert_eq!(tok.encode(&text).unwrap(), reference(&tok, &text), "text {:?}", text);
    }
}
