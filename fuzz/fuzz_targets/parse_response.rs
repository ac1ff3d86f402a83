//! Renderer `parse_response` / `try_parse_response` on arbitrary token ids (ids past the
//! vocabulary included) for built-in renderers of each family: never panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rlvr::renderer::{self, Renderer};

#[allow(dead_code)]
#[path = "../../tests/common/renderer_fixtures.rs"]
mod renderer_fixtures;

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
                let tok = renderer_fixtures::family_tokenizer(family);
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
