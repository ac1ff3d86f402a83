//! Every built-in renderer against fixtures the cookbook (tinker-cookbook 0.6.1) produced:
//! generation prompts, supervised examples (tokens and weights for every `TrainOnWhat`),
//! stop conditions, parses and tool-declaration prefixes, over varied conversations.
//! `tests/fixtures/renderers/make_fixtures.py` regenerates them.

use crate::common::renderer_fixtures::assert_family;

#[test]
fn role_colon_matches_the_cookbook() {
    assert_family("role_colon");
}

#[test]
fn qwen3_family_matches_the_cookbook() {
    assert_family("qwen3");
}

#[test]
fn qwen3_5_family_matches_the_cookbook() {
    assert_family("qwen3_5");
}

#[test]
fn qwen3_8_family_matches_the_cookbook() {
    assert_family("qwen3_8");
}

#[test]
fn llama3_matches_the_cookbook() {
    assert_family("llama3");
}

#[test]
fn deepseek_family_matches_the_cookbook() {
    assert_family("deepseek");
}

#[test]
fn glm5_3_family_matches_the_cookbook() {
    assert_family("glm5_3");
}

#[test]
fn kimi_family_matches_the_cookbook() {
    assert_family("kimi");
}

#[test]
fn nemotron3_family_matches_the_cookbook() {
    assert_family("nemotron3");
}
