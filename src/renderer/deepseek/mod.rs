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

use crate::error::{Error, Result};
use crate::renderer::Renderer;
use crate::tokenizer::Tokenizer;
use crate::types::TokenId;

mod v3;
mod v4_1;

pub use v3::DeepSeekV3;
pub use v4_1::{DeepSeekV4_1, ReasoningEffort};

/// The beginning-of-sequence token both versions prepend.
pub const BOS: &str = "<｜begin▁of▁sentence｜>";
/// The end-of-turn token, also the stop token.
pub const END_OF_SENTENCE: &str = "<｜end▁of▁sentence｜>";
/// The user role token.
pub const USER: &str = "<｜User｜>";
/// The assistant role token.
pub const ASSISTANT: &str = "<｜Assistant｜>";

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

/// The one token `text` encodes to; [`Error::Tokenizer`] when it is not a single token (the
/// cookbook asserts the same when it looks the token up).
pub(crate) fn single_token(tokenizer: &Tokenizer, text: &str, renderer: &str) -> Result<TokenId> {
    match tokenizer.encode(text)?.as_slice() {
        [token] => Ok(*token),
        other => Err(Error::Tokenizer(format!(
            "renderer `{renderer}` needs `{text}` to be a single token, but this tokenizer \
             encodes it as {other:?}"
        ))),
    }
}

/// The cookbook's `_normalize_response_tokens` of the thinking renderers: a response that
/// closes a think block it did not open had its `<think>` prefilled by the generation
/// prompt, so it is put back.
pub(crate) fn restore_think_prefix(
    response: &[TokenId],
    think_open: TokenId,
    think_close: TokenId,
) -> Vec<TokenId> {
    let starts_with_think = response.first() == Some(&think_open);
    if !starts_with_think && response.contains(&think_close) {
        let mut out = Vec::with_capacity(response.len() + 1);
        out.push(think_open);
        out.extend_from_slice(response);
        out
    } else {
        response.to_vec()
    }
}

/// A static regex (the patterns are literals, so compiling cannot fail at run time).
pub(crate) fn static_regex(
    cell: &'static std::sync::OnceLock<regex::Regex>,
    pattern: &str,
) -> &'static regex::Regex {
    cell.get_or_init(|| {
        regex::Regex::new(pattern).unwrap_or_else(|e| panic!("static regex {pattern}: {e}"))
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

    #[test]
    fn think_prefix_is_restored_only_when_missing() {
        assert_eq!(restore_think_prefix(&[5, 2, 7], 1, 2), vec![1, 5, 2, 7]);
        assert_eq!(restore_think_prefix(&[1, 5, 2], 1, 2), vec![1, 5, 2]);
        assert_eq!(restore_think_prefix(&[5, 7], 1, 2), vec![5, 7]);
        assert_eq!(restore_think_prefix(&[], 1, 2), Vec::<TokenId>::new());
    }
}
