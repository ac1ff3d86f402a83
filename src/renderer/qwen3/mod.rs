//! Renderers of the Qwen family: Qwen3 (thinking, thinking off, Instruct-2507), Qwen3-VL,
//! Qwen3.5 and Qwen3.8 — the cookbook's `qwen3.py`, `qwen3_5.py` and `qwen3_8.py`.
//!
//! All of them write the ChatML layout (`<|im_start|>role\n…<|im_end|>`) and stop on
//! `<|im_end|>`. The cookbook's class tree is kept:
//!
//! - [`Qwen3Renderer`] (`qwen3`, `qwen3_disable_thinking`, `qwen3_instruct`): the text
//!   renderer, one struct configured by [`Qwen3Options`].
//! - The vision-language line, `Qwen3VLRenderer` → `Qwen3_5Renderer` → `Qwen3_8Renderer`
//!   (and, in Python, `Nemotron3Renderer`), shares one render path whose override points are
//!   the methods of its (crate-internal) hooks: [`Qwen3VlRenderer`] (`qwen3_vl`, `qwen3_vl_instruct`),
//!   [`Qwen3_5Renderer`] (`qwen3_5`, `qwen3_5_disable_thinking`,
//!   `qwen3_5_preserve_thinking`) and [`Qwen3_8Renderer`] (`qwen3_8_*`). Images are not
//!   rendered (no image processor): image and audio parts are [`Error::Unsupported`].
//!
//! Build one by name with [`by_name`](crate::renderer::by_name) or construct the types
//! directly; see [`Qwen3Renderer`] for an example.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::message::{ContentPart, Message, Role, ToolCall};
use crate::renderer::base::{
    assign_tool_calls, detect_unterminated_tool_block, parse_content_blocks,
    parse_response_for_stop_token, python_json_dumps, special_token,
};
use crate::renderer::{ParseTermination, RenderContext, Renderer};
use crate::tokenizer::Tokenizer;
use crate::types::{Content, TokenId};

mod common;
mod qwen3_5;
mod qwen3_8;
mod text;
mod vl;

pub(crate) use self::common::{
    Qwen3_5Hooks, Qwen3Core, impl_qwen3_message_format, parse_qwen_response,
    qwen3_5_postprocess_parsed_message, qwen3_5_render_message, xml_tools_prompt,
};
pub use qwen3_5::{Qwen3_5Options, Qwen3_5Renderer};
pub use qwen3_8::{Qwen3_8Options, Qwen3_8Renderer, ReasoningEffort};
pub use text::{Qwen3Mode, Qwen3Options, Qwen3Renderer};
pub use vl::{Qwen3VlOptions, Qwen3VlRenderer};

/// The renderer called `name` of this family.
pub(crate) fn build(name: &str, tokenizer: Tokenizer) -> Result<Arc<dyn Renderer>> {
    let qwen3 = |mode| Qwen3Options {
        mode,
        ..Qwen3Options::default()
    };
    let qwen3_5 = |disable_thinking, strip_thinking_from_history| Qwen3_5Options {
        disable_thinking,
        strip_thinking_from_history,
        ..Qwen3_5Options::default()
    };
    let qwen3_8 = |reasoning_effort, disable_thinking| Qwen3_8Options {
        reasoning_effort,
        disable_thinking,
        ..Qwen3_8Options::default()
    };
    Ok(match name {
        "qwen3" => Arc::new(Qwen3Renderer::with_options(
            tokenizer,
            qwen3(Qwen3Mode::Thinking),
        )?),
        "qwen3_disable_thinking" => Arc::new(Qwen3Renderer::with_options(
            tokenizer,
            qwen3(Qwen3Mode::DisableThinking),
        )?),
        "qwen3_instruct" => Arc::new(Qwen3Renderer::with_options(
            tokenizer,
            qwen3(Qwen3Mode::Instruct),
        )?),
        "qwen3_vl" => Arc::new(Qwen3VlRenderer::new(tokenizer)?),
        "qwen3_vl_instruct" => Arc::new(Qwen3VlRenderer::with_options(
            tokenizer,
            Qwen3VlOptions {
                instruct: true,
                ..Qwen3VlOptions::default()
            },
        )?),
        "qwen3_5" => Arc::new(Qwen3_5Renderer::with_options(
            tokenizer,
            qwen3_5(false, true),
        )?),
        "qwen3_5_disable_thinking" => Arc::new(Qwen3_5Renderer::with_options(
            tokenizer,
            qwen3_5(true, true),
        )?),
        "qwen3_5_preserve_thinking" => Arc::new(Qwen3_5Renderer::with_options(
            tokenizer,
            qwen3_5(false, false),
        )?),
        "qwen3_8_xhigh_reasoning" => Arc::new(Qwen3_8Renderer::with_options(
            tokenizer,
            qwen3_8(ReasoningEffort::Xhigh, false),
        )?),
        "qwen3_8_medium_reasoning" => Arc::new(Qwen3_8Renderer::with_options(
            tokenizer,
            qwen3_8(ReasoningEffort::Medium, false),
        )?),
        "qwen3_8_low_reasoning" => Arc::new(Qwen3_8Renderer::with_options(
            tokenizer,
            qwen3_8(ReasoningEffort::Low, false),
        )?),
        "qwen3_8_disable_thinking" => Arc::new(Qwen3_8Renderer::with_options(
            tokenizer,
            qwen3_8(ReasoningEffort::Xhigh, true),
        )?),
        _ => return Err(crate::renderer::registry::unknown(name)),
    })
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by the Qwen renderers (and by renderers built on them, e.g. Nemotron-3)
// ---------------------------------------------------------------------------------------------

/// The end-of-turn token every Qwen renderer writes and stops on.
pub(crate) const IM_END: &str = "<|im_end|>";

/// The role a message is written under: tool responses go in a `user` turn, as the
/// Qwen3 chat template writes them (`_get_qwen_role_for_message`).
pub(crate) fn qwen_role(role: Role) -> &'static str {
    match role {
        Role::Tool => "user",
        other => other.as_str(),
    }
}

/// `"\n"` before every turn but the first.
pub(crate) fn maybe_newline(ctx: &RenderContext<'_>) -> &'static str {
    if ctx.idx > 0 { "\n" } else { "" }
}

/// Python's `ctx.idx <= ctx.last_user_index` (with `-1` for "no user message").
pub(crate) fn at_or_before_last_user(ctx: &RenderContext<'_>) -> bool {
    ctx.last_user_index.is_some_and(|u| ctx.idx <= u)
}

/// `Error::Unsupported` for an image or audio part (no image processor here).
pub(crate) fn media_unsupported(renderer: &str, part: &ContentPart) -> Error {
    Error::Unsupported(format!(
        "renderer `{renderer}` renders text only; a {} part needs an image processor",
        part.kind()
    ))
}

/// The `<|im_end|>` id, [`Error::Tokenizer`] when the vocabulary lacks it.
pub(crate) fn im_end_token(tokenizer: &Tokenizer, renderer: &str) -> Result<TokenId> {
    special_token(tokenizer, IM_END, renderer)
}

/// `_frame_thinking`: reasoning the way Qwen3's chat template frames the produced turn,
/// `<think>\n{reasoning}\n</think>\n\n` (padding stripped first, present even when empty).
pub(crate) fn frame_thinking(reasoning: &str) -> String {
    format!("<think>\n{}\n</think>\n\n", reasoning.trim_matches('\n'))
}

/// `_unframe_thinking`: the reverse of [`frame_thinking`], so render → parse is the
/// identity: thinking loses its `\n` padding (and an empty block is dropped), the text right
/// after a block loses its leading newlines.
pub(crate) fn unframe_thinking(parts: Vec<ContentPart>) -> Vec<ContentPart> {
    let mut out = Vec::with_capacity(parts.len());
    let mut after_block = false;
    for p in parts {
        match p {
            ContentPart::Thinking { thinking } => {
                let reasoning = thinking.trim_matches('\n');
                if !reasoning.is_empty() {
                    out.push(ContentPart::thinking(reasoning));
                }
                after_block = true;
            }
            ContentPart::Text { text } => {
                let text = if after_block {
                    text.trim_start_matches('\n').to_owned()
                } else {
                    text
                };
                out.push(ContentPart::Text { text });
                after_block = false;
            }
            other => {
                out.push(other);
                after_block = false;
            }
        }
    }
    out
}

/// `json.dumps(_tool_call_payload(call))`: `{"name": …, "arguments": {…}}`, as Qwen3
/// writes a call inside `<tool_call>` tags.
pub(crate) fn tool_call_json(call: &ToolCall) -> Result<String> {
    let arguments = call.arguments_json()?;
    let mut payload = serde_json::Map::new();
    payload.insert("name".into(), serde_json::Value::String(call.name.clone()));
    payload.insert("arguments".into(), arguments);
    Ok(python_json_dumps(&serde_json::Value::Object(payload)))
}

/// Qwen3's `<tool_call>\n{json}\n</tool_call>` blocks, joined by newlines.
pub(crate) fn tool_call_blocks_json(calls: &[ToolCall]) -> Result<String> {
    let blocks = calls
        .iter()
        .map(|c| Ok(format!("<tool_call>\n{}\n</tool_call>", tool_call_json(c)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(blocks.join("\n"))
}

/// Qwen3's tool declaration (`create_conversation_prefix_with_tools` of `Qwen3Renderer`,
/// used by Qwen3 and Qwen3-VL): one system message, the system prompt first.
pub(crate) fn qwen3_tools_prefix(
    tools: &[crate::renderer::ToolSpec],
    system_prompt: &str,
) -> Result<Vec<Message>> {
    let mut tools_text = String::new();
    if !tools.is_empty() {
        let lines = tools
            .iter()
            .map(|t| {
                let tool = serde_json::to_value(t)
                    .map_err(|e| Error::Renderer(format!("tool `{}`: {e}", t.name)))?;
                let mut wrapped = serde_json::Map::new();
                wrapped.insert("type".into(), "function".into());
                wrapped.insert("function".into(), tool);
                Ok(crate::renderer::base::python_json(
                    &serde_json::Value::Object(wrapped),
                    ", ",
                    ": ",
                    true,
                ))
            })
            .collect::<Result<Vec<_>>>()?
            .join("\n");
        tools_text = format!(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n\
             <tools>\n{lines}\n</tools>\n\n\
             For each function call, return a json object with function name and arguments \
             within <tool_call></tool_call> XML tags:\n\
             <tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n\
             </tool_call>"
        );
    }
    let content = if system_prompt.is_empty() {
        tools_text
    } else {
        format!("{system_prompt}\n\n{tools_text}")
    };
    Ok(vec![Message::system(content)])
}

/// The body of Qwen3's `parse_response` after the stop-token split: `<think>` and
/// `<tool_call>` (JSON) blocks parsed out of the string content, thinking unframed when
/// `frames_thinking`, and a `<tool_call>` opened without being closed reported as unparsed.
pub(crate) fn parse_qwen3_blocks(message: &mut Message, frames_thinking: bool) {
    let content = match &message.content {
        Content::Text(s) => s.clone(),
        Content::Parts(_) => return,
    };
    if let Some((parts, calls)) = parse_content_blocks(&content) {
        message.content = Content::Parts(if frames_thinking {
            unframe_thinking(parts)
        } else {
            parts
        });
        assign_tool_calls(message, calls);
    }
    if let Some(dangling) = detect_unterminated_tool_block(&content, "<tool_call>", "</tool_call>")
    {
        message.unparsed_tool_calls.push(dangling);
    }
}

/// Qwen3's `parse_response` for already-normalized tokens: split on `<|im_end|>` (zero: the
/// response was cut, malformed; two or more: an error), then [`parse_qwen3_blocks`].
pub(crate) fn parse_qwen3_tokens(
    tokenizer: &Tokenizer,
    end_token: TokenId,
    tokens: &[TokenId],
    frames_thinking: bool,
) -> Result<(Message, ParseTermination)> {
    let (mut message, termination) = parse_response_for_stop_token(tokens, tokenizer, end_token)?;
    if termination.is_clean() {
        parse_qwen3_blocks(&mut message, frames_thinking);
    }
    Ok((message, termination))
}

#[cfg(test)]
mod tests;
