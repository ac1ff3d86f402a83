//! Renderers of the Nemotron-3 family (the cookbook's `nemotron3.py`): Nemotron-3 Nano and
//! Super, and the Ultra format (Nemotron-3 Ultra, Nemotron-3.5 Lightning and Super).
//!
//! Nemotron-3 is built on the Qwen3.5 render path (the Qwen3.5 hooks), as the cookbook's
//! `Nemotron3Renderer` subclasses `Qwen3_5Renderer`. One configurable type,
//! [`Nemotron3Renderer`], covers every name:
//!
//! | name | variant | thinking | history |
//! |---|---|---|---|
//! | `nemotron3` | Nano/Super | full | stripped |
//! | `nemotron3_low_thinking` | Nano/Super | low effort | stripped |
//! | `nemotron3_disable_thinking` | Nano/Super | off | stripped |
//! | `nemotron3_preserve_thinking` | Nano/Super | full | kept |
//! | `nemotron3_ultra` | Ultra | full | stripped |
//! | `nemotron3_ultra_disable_thinking` | Ultra | off | stripped |
//! | `nemotron3_ultra_medium_thinking` | Ultra | medium effort | stripped |
//! | `nemotron3_ultra_preserve_thinking` | Ultra | full | kept |

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::message::{Content, ContentPart, Message, Role};
use crate::python::{py_str, py_strip};
use crate::renderer::base::python_json_dumps;
use crate::renderer::qwen3::{
    Qwen3_5Hooks, Qwen3Core, impl_qwen3_message_format, qwen3_5_postprocess_parsed_message,
    qwen3_5_render_message,
};
use crate::renderer::{RenderContext, RenderedMessage, Renderer, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::types::TokenId;

/// The renderer called `name` of this family.
pub(crate) fn build(name: &str, tokenizer: Tokenizer) -> Result<Arc<dyn Renderer>> {
    use Nemotron3Thinking::*;
    use Nemotron3Variant::*;
    let (variant, thinking, strip_thinking_from_history) = match name {
        "nemotron3" => (NanoSuper, Full, true),
        "nemotron3_low_thinking" => (NanoSuper, LowEffort, true),
        "nemotron3_disable_thinking" => (NanoSuper, Disabled, true),
        "nemotron3_preserve_thinking" => (NanoSuper, Full, false),
        "nemotron3_ultra" => (Ultra, Full, true),
        "nemotron3_ultra_disable_thinking" => (Ultra, Disabled, true),
        "nemotron3_ultra_medium_thinking" => (Ultra, MediumEffort, true),
        "nemotron3_ultra_preserve_thinking" => (Ultra, Full, false),
        _ => return Err(crate::renderer::registry::unknown(name)),
    };
    Ok(Arc::new(Nemotron3Renderer::with_options(
        tokenizer,
        Nemotron3Options {
            variant,
            thinking,
            strip_thinking_from_history,
            ..Nemotron3Options::default()
        },
    )?))
}

/// Which Nemotron chat template is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Nemotron3Variant {
    /// Nemotron-3 Nano and Super: thinking written `<think>\n…\n</think>\n`, one newline
    /// between `</think>` and the text.
    #[default]
    NanoSuper,
    /// Nemotron-3 Ultra and the Nemotron-3.5 models: thinking written `<think>\n…</think>`,
    /// no separator after `</think>`.
    Ultra,
}

/// The reasoning mode (the template's `enable_thinking` / `low_effort` / `medium_effort`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Nemotron3Thinking {
    /// Reasoning on (`enable_thinking=True`): the prompt ends with `<think>\n`.
    #[default]
    Full,
    /// Low-effort reasoning (3 Super, `low_effort=True`): `\n\n{reasoning effort: low}` is
    /// appended to the last user message, whose content must be a string.
    LowEffort,
    /// Medium-effort reasoning (Ultra, 3.5 Super, `medium_effort=True`):
    /// `\n\n{reasoning effort: efficient}` is appended to the last user message.
    MediumEffort,
    /// Reasoning off (`enable_thinking=False`): the prompt ends with `<think></think>`.
    Disabled,
}

/// How a [`Nemotron3Renderer`] is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nemotron3Options {
    /// The template variant (default Nano/Super).
    pub variant: Nemotron3Variant,
    /// The reasoning mode (default full).
    pub thinking: Nemotron3Thinking,
    /// Collapse the thinking of assistant messages before the last user message to
    /// `<think></think>` (default `true`, the template's `truncate_history_thinking=True`;
    /// `false` is the `*_preserve_thinking` renderers).
    pub strip_thinking_from_history: bool,
    /// Tokenize a message's text pieces as one string (default `true`).
    pub merge_text_chunks: bool,
}

impl Default for Nemotron3Options {
    fn default() -> Self {
        Nemotron3Options {
            variant: Nemotron3Variant::NanoSuper,
            thinking: Nemotron3Thinking::Full,
            strip_thinking_from_history: true,
            merge_text_chunks: true,
        }
    }
}

impl Nemotron3Options {
    /// The registry name of this configuration (`"nemotron3_ultra_medium_thinking"`).
    pub fn name(&self) -> String {
        let mut name = match self.variant {
            Nemotron3Variant::NanoSuper => "nemotron3".to_owned(),
            Nemotron3Variant::Ultra => "nemotron3_ultra".to_owned(),
        };
        name.push_str(match self.thinking {
            Nemotron3Thinking::Full => "",
            Nemotron3Thinking::LowEffort => "_low_thinking",
            Nemotron3Thinking::MediumEffort => "_medium_thinking",
            Nemotron3Thinking::Disabled => "_disable_thinking",
        });
        if !self.strip_thinking_from_history {
            name.push_str("_preserve_thinking");
        }
        name
    }
}

/// The Nemotron-3 renderer, text only: every `nemotron3*` name (see the
/// [module documentation](self)).
///
/// The Qwen3.5 layout (`<|im_start|>role\n…<|im_end|>`, the `<think>\n` prefill, XML tool
/// calls, grouped tool responses) with the Nemotron-3 templates' changes: an empty system
/// message is added when the conversation has none; tools are declared as XML, after the
/// system prompt; every assistant turn whose thinking is not written gets `<think></think>`
/// (history included); thinking is stripped only before the last user message; tool
/// responses end with a newline; the thinking-off prompt ends with `<think></think>`.
///
/// A thinking renderer's prompt ends with `<think>\n` while a turn without reasoning is
/// written `<think></think>` (cookbook issue #860): as in the cookbook, supervised weights
/// are left as they are in that case. Image and audio parts are
/// [`Error::Unsupported`].
///
/// ```
/// # fn main() -> rlvr::Result<()> {
/// # // A toy character-level tokenizer with the ChatML special tokens.
/// # let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(br#"{"version":"1.0","added_tokens":[
/// #   {"id":12,"content":"<|im_start|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
/// #   {"id":13,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
/// #   {"id":14,"content":"<think>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false},
/// #   {"id":15,"content":"</think>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}],
/// #   "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":{"type":"Fuse"},
/// #   "model":{"type":"BPE","vocab":{"a":0,"b":1,"\n":2,"u":3,"s":4,"e":5,"r":6,"i":7,"t":8,"n":9,"y":10,"m":11},
/// #   "merges":[],"unk_token":"a"}}"#)?;
/// use rlvr::renderer::nemotron3::Nemotron3Renderer;
/// use rlvr::{message::{ContentPart, Message}, renderer::ParseTermination, Renderer};
/// let renderer = Nemotron3Renderer::new(tokenizer.clone())?;
/// let prompt = renderer.generation_prompt(&[Message::user("ab")])?;
/// // The template always writes a system turn.
/// assert_eq!(
///     tokenizer.decode(&prompt.to_tokens())?,
///     "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nab<|im_end|>\n\
///      <|im_start|>assistant\n<think>\n"
/// );
/// // One newline separates `</think>` from the answer.
/// let sampled = tokenizer.encode("ab\n</think>\nba<|im_end|>")?;
/// let (message, termination) = renderer.parse_response(&sampled);
/// assert_eq!(termination, ParseTermination::StopSequence);
/// assert_eq!(message, Message::assistant(vec![
///     ContentPart::thinking("ab"),
///     ContentPart::text("ba"),
/// ]));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Nemotron3Renderer {
    core: Qwen3Core,
    options: Nemotron3Options,
}

impl Nemotron3Renderer {
    /// The `nemotron3` renderer.
    ///
    /// Errors: [`Error::Tokenizer`] when the tokenizer lacks
    /// `<|im_end|>`.
    pub fn new(tokenizer: Tokenizer) -> Result<Self> {
        Self::with_options(tokenizer, Nemotron3Options::default())
    }

    /// A renderer configured by `options`, named [`Nemotron3Options::name`].
    ///
    /// Errors: [`Error::Tokenizer`] when the tokenizer lacks
    /// `<|im_end|>`.
    pub fn with_options(tokenizer: Tokenizer, options: Nemotron3Options) -> Result<Self> {
        Ok(Nemotron3Renderer {
            core: Qwen3Core::new(
                options.name(),
                tokenizer,
                options.strip_thinking_from_history,
                options.merge_text_chunks,
            )?,
            options,
        })
    }

    /// The options this renderer was built with.
    pub fn options(&self) -> &Nemotron3Options {
        &self.options
    }

    fn is_ultra(&self) -> bool {
        self.options.variant == Nemotron3Variant::Ultra
    }

    /// The low / medium effort suffix appended to the last user message.
    fn with_effort_suffix(&self, message: &Message) -> Result<Option<Message>> {
        let suffix = match self.options.thinking {
            Nemotron3Thinking::LowEffort => "\n\n{reasoning effort: low}",
            Nemotron3Thinking::MediumEffort => "\n\n{reasoning effort: efficient}",
            _ => return Ok(None),
        };
        let mut message = message.clone();
        message.content = match message.content {
            Content::Text(s) => Content::Text(s + suffix),
            Content::Parts(mut parts) => {
                if self.options.thinking == Nemotron3Thinking::LowEffort {
                    return Err(Error::Renderer(
                        "Nemotron-3 low-thinking mode is text-only; list content not supported"
                            .into(),
                    ));
                }
                parts.push(ContentPart::text(suffix));
                Content::Parts(parts)
            }
        };
        Ok(Some(message))
    }
}

/// Python's `ctx.idx < ctx.last_user_index` (`-1` for no user message).
fn is_historical(ctx: &RenderContext<'_>) -> bool {
    ctx.last_user_index.is_some_and(|u| ctx.idx < u)
}

fn has_nonempty_text(content: &Content) -> bool {
    matches!(content, Content::Parts(parts)
        if parts.iter().any(|p| matches!(p, ContentPart::Text { text } if !text.is_empty())))
}

impl Qwen3_5Hooks for Nemotron3Renderer {
    fn core(&self) -> &Qwen3Core {
        &self.core
    }

    fn disables_thinking(&self) -> bool {
        self.options.thinking == Nemotron3Thinking::Disabled
    }

    /// With thinking preserved, history renders each turn as a supervised example does.
    fn has_extension_property(&self) -> bool {
        !self.core.strip_thinking_from_history
    }

    /// `_normalize_messages`: an empty system message first when there is none.
    fn normalize_messages<'a>(&self, messages: &'a [Message]) -> Result<Cow<'a, [Message]>> {
        if messages.first().is_some_and(|m| m.role == Role::System) {
            return Ok(Cow::Borrowed(messages));
        }
        let mut out = Vec::with_capacity(messages.len() + 1);
        out.push(Message::system(""));
        out.extend_from_slice(messages);
        Ok(Cow::Owned(out))
    }

    /// Thinking is stripped only before the last user message (an assistant message at or
    /// after it is rendered as if it were the last), and the effort suffix goes on the last
    /// user message.
    fn render_message(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        let mut ctx = *ctx;
        if message.role == Role::Assistant && !is_historical(&ctx) && !ctx.is_last {
            ctx.is_last = true;
        }
        if message.role == Role::User
            && ctx.last_user_index == Some(ctx.idx)
            && let Some(patched) = self.with_effort_suffix(message)?
        {
            return qwen3_5_render_message(self, &patched, &ctx);
        }
        qwen3_5_render_message(self, message, &ctx)
    }

    /// Only string content is trimmed (the template does not trim parts).
    fn trim_content(&self, content: &Content) -> Content {
        match content {
            Content::Text(s) => Content::Text(py_strip(s).to_owned()),
            parts => parts.clone(),
        }
    }

    /// `<think></think>` whenever the thinking is not written: every turn without
    /// reasoning, and historical turns whose reasoning is stripped (Nano/Super add `\n`
    /// when such a turn has text and no tool calls).
    fn assistant_header_suffix(&self, message: &Message, ctx: &RenderContext<'_>) -> String {
        let historical = is_historical(ctx);
        let has_think = message.content.has_thinking();
        if has_think && (!historical || !self.core.strip_thinking_from_history) {
            return String::new();
        }
        if !self.is_ultra()
            && historical
            && has_think
            && has_nonempty_text(&message.content)
            && message.tool_calls.is_empty()
        {
            return "<think></think>\n".into();
        }
        "<think></think>".into()
    }

    fn format_thinking_text(&self, thinking: &str) -> String {
        if self.is_ultra() {
            format!("<think>\n{thinking}</think>")
        } else {
            format!("<think>\n{thinking}\n</think>\n")
        }
    }

    fn wrap_tool_response_chunks(&self, chunks: Vec<String>) -> Vec<String> {
        let mut out = Vec::with_capacity(chunks.len() + 2);
        out.push("<tool_response>\n".to_owned());
        out.extend(chunks);
        out.push("\n</tool_response>\n".to_owned());
        out
    }

    fn tool_response_continuation_header(&self) -> String {
        String::new()
    }

    /// Each call followed by `\n`, after one `\n` (Nano/Super: none when the content is
    /// thinking only, whose block already ends with `\n`).
    fn format_tool_calls_chunks(&self, message: &Message) -> Result<Vec<String>> {
        let mut calls = String::new();
        for call in &message.tool_calls {
            calls.push_str(&self.format_tool_call_xml(call)?);
            calls.push('\n');
        }
        let has_thinking_part = matches!(&message.content, Content::Parts(parts)
            if parts.iter().any(|p| matches!(p, ContentPart::Thinking { .. })));
        let prefix =
            if !self.is_ultra() && has_thinking_part && !has_nonempty_text(&message.content) {
                ""
            } else {
                "\n"
            };
        Ok(vec![format!("{prefix}{calls}")])
    }

    fn generation_suffix(&self, role: Role, ctx: &RenderContext<'_>) -> Result<Vec<TokenId>> {
        let text = if self.options.thinking == Nemotron3Thinking::Disabled {
            let maybe_newline = if ctx.idx > 0 { "\n" } else { "" };
            format!(
                "{maybe_newline}<|im_start|>{}\n<think></think>",
                role.as_str()
            )
        } else {
            self.generation_suffix_str(role.as_str(), ctx)
        };
        self.core.tokenizer.encode(&text)
    }

    /// Nano/Super: one separator newline after `</think>` dropped, then Qwen3.5's.
    fn postprocess_parsed_message(&self, message: &mut Message) {
        if !self.is_ultra()
            && let Content::Parts(parts) = &mut message.content
        {
            let mut seen_thinking = false;
            for part in parts.iter_mut() {
                match part {
                    ContentPart::Thinking { .. } => seen_thinking = true,
                    ContentPart::Text { text } if seen_thinking => {
                        if let Some(rest) = text.strip_prefix('\n') {
                            *text = rest.to_owned();
                        }
                        break;
                    }
                    _ => {}
                }
            }
        }
        qwen3_5_postprocess_parsed_message(message);
    }

    /// XML tool declarations, the system prompt before them.
    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        nemotron3_tools_prefix(tools, system_prompt)
    }
}

impl_qwen3_message_format!(Nemotron3Renderer);

/// `create_conversation_prefix_with_tools` of Nemotron-3.
fn nemotron3_tools_prefix(tools: &[ToolSpec], system_prompt: &str) -> Result<Vec<Message>> {
    let mut tools_text = String::new();
    if !tools.is_empty() {
        let declarations = tools
            .iter()
            .map(format_tool_declaration)
            .collect::<Result<Vec<_>>>()?
            .join("\n");
        tools_text = crate::renderer::qwen3::xml_tools_prompt(&declarations);
    }
    let content = if tools_text.is_empty() {
        system_prompt.to_owned()
    } else if system_prompt.is_empty() {
        tools_text
    } else {
        format!("{system_prompt}\n\n{tools_text}")
    };
    Ok(vec![Message::system(content)])
}

/// `_render_extra_keys`: the keys of `obj` not in `handled` as `<key>value</key>` (objects
/// and arrays as JSON, scalars through Python's `str`).
fn render_extra_keys(obj: &serde_json::Map<String, Value>, handled: &[&str]) -> Vec<String> {
    obj.iter()
        .filter(|(k, _)| !handled.contains(&k.as_str()))
        .map(|(k, v)| {
            let value = match v {
                Value::Object(_) | Value::Array(_) => python_json_dumps(v),
                scalar => py_str(scalar),
            };
            format!("<{k}>{value}</{k}>")
        })
        .collect()
}

/// Python's `value.strip()` on a field that must be a string.
fn strip_str<'a>(value: &'a Value, what: &str) -> Result<&'a str> {
    match value {
        Value::String(s) => Ok(py_strip(s)),
        other => Err(Error::Renderer(format!(
            "{what} must be a string, got {other}"
        ))),
    }
}

/// `_format_nemotron3_tool_declaration`: one tool as the template's XML `<function>` block.
fn format_tool_declaration(tool: &ToolSpec) -> Result<String> {
    let mut lines = vec![
        "<function>".to_owned(),
        format!("<name>{}</name>", tool.name),
    ];
    let description = py_strip(&tool.description);
    if !description.is_empty() {
        lines.push(format!("<description>{description}</description>"));
    }
    lines.push("<parameters>".into());
    // `tool.get("parameters") or {}`: anything but an object renders no parameters.
    let empty = serde_json::Map::new();
    let params = match &tool.parameters {
        Value::Object(map) => map,
        _ => &empty,
    };
    if let Some(properties) = params.get("properties") {
        let Value::Object(properties) = properties else {
            return Err(Error::Renderer(format!(
                "tool `{}`: parameters.properties must be an object",
                tool.name
            )));
        };
        for (param_name, fields) in properties {
            let Value::Object(fields) = fields else {
                return Err(Error::Renderer(format!(
                    "tool `{}`: parameter `{param_name}` must be an object",
                    tool.name
                )));
            };
            lines.push("<parameter>".into());
            lines.push(format!("<name>{param_name}</name>"));
            if let Some(ty) = fields.get("type") {
                lines.push(format!("<type>{}</type>", py_str(ty)));
            }
            if let Some(desc) = fields.get("description") {
                let desc = strip_str(desc, &format!("parameter `{param_name}` description"))?;
                lines.push(format!("<description>{desc}</description>"));
            }
            if let Some(values) = fields.get("enum") {
                lines.push(format!("<enum>{}</enum>", python_json_dumps(values)));
            }
            lines.extend(render_extra_keys(
                fields,
                &["name", "type", "description", "enum"],
            ));
            lines.push("</parameter>".into());
        }
    }
    lines.extend(render_extra_keys(
        params,
        &["type", "properties", "required"],
    ));
    if let Some(required) = params.get("required") {
        lines.push(format!(
            "<required>{}</required>",
            python_json_dumps(required)
        ));
    }
    lines.push("</parameters>".into());
    lines.push("</function>".into());
    Ok(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_declaration_matches_cookbook() {
        let tool = ToolSpec {
            name: "get_weather".into(),
            description: " Get weather ".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name "},
                    "unit": {"type": ["string", "null"], "enum": ["c", "f"], "default": "c"},
                },
                "required": ["city"],
                "additionalProperties": false,
            }),
        };
        assert_eq!(
            format_tool_declaration(&tool).unwrap(),
            "<function>\n<name>get_weather</name>\n<description>Get weather</description>\n\
             <parameters>\n<parameter>\n<name>city</name>\n<type>string</type>\n\
             <description>City name</description>\n</parameter>\n<parameter>\n<name>unit</name>\n\
             <type>['string', 'null']</type>\n<enum>[\"c\", \"f\"]</enum>\n<default>c</default>\n\
             </parameter>\n<additionalProperties>False</additionalProperties>\n\
             <required>[\"city\"]</required>\n</parameters>\n</function>"
        );
    }
}
