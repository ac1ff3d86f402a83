//! Renderer `parse_response` / `try_parse_response` on arbitrary token ids (ids past the
//! vocabulary included) for built-in renderers of each family: never panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rlvr::{renderer, Renderer};
use rlvr::tokenizer::Tokenizer;
use serde_json::Value;

/// The repository's test fixtures (this crate lives in `fuzz/`).
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");

/// The tokenizer of a fixture family, as `tests/it/common/renderer_fixtures.rs` builds it: the
/// Qwen3 vocabulary plus the family's added tokens.
fn family_tokenizer(family: &str) -> Tokenizer {
    let compressed = std::fs::read(format!("{FIXTURES}/qwen3-tokenizer.json.zst"))
        .expect("reading the Qwen3 tokenizer");
    let json = zstd::decode_all(compressed.as_slice()).expect("decompressing the tokenizer");
    let mut base: Value = serde_json::from_slice(&json).expect("tokenizer JSON");
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{FIXTURES}/renderers/tokenizers/{family}.json"))
            .expect("reading the tokenizer spec"),
    )
    .expect("tokenizer spec JSON");
    if let Some(added) = spec["added_tokens"].as_array() {
        base["added_tokens"]
            .as_array_mut()
            .expect("added_tokens array")
            .extend(added.iter().cloned());
    }
    let tok = Tokenizer::from_bytes(&serde_json::to_vec(&base).expect("JSON")).expect("tokenizer");
    let id = |key: &str| spec[key].as_str().and_then(|t| tok.token_to_id(t));
    let (bos, eos) = (id("bos_token"), id("eos_token"));
    tok.with_bos(bos).with_eos(eos)
}

const RENDERERS: &[(&str, &str)] = &[
    ("qwen3", "qwen3"),
    ("llama3", "llama3"),
    ("kimi_k2", "kimi"),
    ("gpt_oss_no_sysprompt", "gpt_oss"),
    ("deepseekv3_thinking", "deepseek"),
    ("glm5_3_max_reasoning", "glm5_3"),
    ("role_colon", "role_colon"),
];

fn renderers() -> &'static [(Arc<dyn Renderer>, u32)] {
    static R: OnceLock<Vec<(Arc<dyn Renderer>, u32)>> = OnceLock::new();
    R.get_or_init(|| {
        RENDERERS
            .iter()
            .map(|&(name, family)| {
                let tok = family_tokenizer(family);
                let vocab = tok.vocab_size() as u32;
                (renderer::by_name(name, tok).expect("built-in"), vocab)
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let (r, vocab) = &renderers()[usize::from(which) % RENDERERS.len()];
    // Three bytes per id, mapped mostly into the vocabulary and its added tokens (the top
    // of the range), sometimes past it.
    let tokens: Vec<u32> = rest
        .chunks_exact(3)
        .map(|c| {
            let v = u32::from(c[0]) << 16 | u32::from(c[1]) << 8 | u32::from(c[2]);
            if c[0] >= 0xf0 {
                vocab.saturating_sub(u32::from(c[2]) + 1 + (u32::from(c[1]) << 8))
            } else if c[0] == 0xef {
                vocab + u32::from(c[2])
            } else {
                v % (vocab + 64)
            }
        })
        .collect();
    let _ = r.parse_response(&tokens);
    let _ = r.try_parse_response(&tokens);
});
