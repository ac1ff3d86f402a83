//! Renderers of the DeepSeek family: [`DeepSeekV3`] (V3 / V3.1, thinking on or off) and
//! [`DeepSeekV4_1`] (V4.1, chat mode or thinking with a reasoning effort), ports of the
//! cookbook's `deepseek_v3.py` and `deepseek_v4_1.py`.
//!
//! Both versions open with `<｜begin▁of▁sentence｜>`, introduce turns with the fullwidth-bar
//! role tokens (`<｜User｜>`, `<｜Assistant｜>`), end an assistant turn (and stop sampling) at
//! `<｜end▁of▁sentence｜>`, and restore the `<think>` a thinking prompt prefills before
//! parsing a response. They differ in system prompts, tool calls (V3's tool-call tokens,
//! V4.1's DSML blocks) and tool results, so each has its own module.

use std::sync::Arc;

use crate::error::Result;
use crate::renderer::Renderer;
use crate::tokenizer::Tokenizer;

mod v3;
mod v4_1;

pub use v3::DeepSeekV3;
pub use v4_1::{DeepSeekV4_1, ReasoningEffort};

/// The beginning-of-sequence token both versions prepend.
pub(crate) const BOS: &str = "<｜begin▁of▁sentence｜>";
/// The end-of-turn token, also the stop token.
pub(crate) const END_OF_SENTENCE: &str = "<｜end▁of▁sentence｜>";
/// The user role token.
pub(crate) const USER: &str = "<｜User｜>";
/// The assistant role token.
pub(crate) const ASSISTANT: &str = "<｜Assistant｜>";

/// The renderer called `name` of this family.
pub(crate) fn build(name: &str, tokenizer: Tokenizer) -> Result<Arc<dyn Renderer>> {
    Ok(match name {
        "deepseekv3" | "deepseekv3_disable_thinking" => {
            Arc::new(DeepSeekV3::new(tokenizer, false)?.named(name))
        }
        "deepseekv3_thinking" => Arc::new(DeepSeekV3::new(tokenizer, true)?.named(name)),
        "deepseekv4_1" => Arc::new(DeepSeekV4_1::new(tokenizer, Some(ReasoningEffort::High))?),
        "deepseekv4_1_low_reasoning" => {
            Arc::new(DeepSeekV4_1::new(tokenizer, Some(ReasoningEffort::Low))?)
        }
        "deepseekv4_1_max_reasoning" => {
            Arc::new(DeepSeekV4_1::new(tokenizer, Some(ReasoningEffort::Max))?)
        }
        "deepseekv4_1_disable_thinking" => Arc::new(DeepSeekV4_1::new(tokenizer, None)?),
        "deepseekv4_1_preserve_thinking" => Arc::new(
            DeepSeekV4_1::new(tokenizer, Some(ReasoningEffort::High))?
                .with_strip_thinking_from_history(false),
        ),
        _ => return Err(crate::renderer::registry::unknown(name)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    /// The first word of each unparsed call's error (JSON parser messages differ between
    /// Python and Rust), as the fixture check compares them.
    fn normalized(mut v: serde_json::Value) -> serde_json::Value {
        if let Some(list) = v
            .get_mut("unparsed_tool_calls")
            .and_then(|l| l.as_array_mut())
        {
            for u in list {
                let first = u["error"]
                    .as_str()
                    .unwrap_or("")
                    .split([':', ' '])
                    .next()
                    .unwrap_or("")
                    .to_owned();
                u["error"] = serde_json::Value::String(first);
            }
        }
        v
    }

    /// Hand-made responses (valid and malformed tool calls) parse as the cookbook parses
    /// them (`tests/fixtures/renderers/deepseek_parse_cases.py`).
    #[test]
    fn tool_call_parsing_matches_the_cookbook() {
        let cases: serde_json::Map<String, serde_json::Value> = serde_json::from_str(include_str!(
            "../../../tests/fixtures/renderers/deepseek_parse_cases.json"
        ))
        .unwrap();
        assert_eq!(cases.len(), 13);
        for (name, case) in cases {
            let content = case["content"].as_str().unwrap();
            let message = Message::assistant(content);
            let parsed = if name.starts_with("deepseekv3/") {
                DeepSeekV3::parse_content(message)
            } else {
                DeepSeekV4_1::parse_content(message)
            }
            .unwrap();
            let got = normalized(serde_json::to_value(&parsed).unwrap());
            assert_eq!(got, normalized(case["message"].clone()), "{name}");
        }
    }
}
