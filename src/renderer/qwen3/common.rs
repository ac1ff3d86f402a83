//! The render path shared by Qwen3-VL, Qwen3.5, Qwen3.8 (and, in the cookbook, Nemotron-3):
//! `Qwen3VLRenderer.render_message` with its override points as the [`Qwen3_5Hooks`] trait,
//! and the Qwen3.5 pieces that path uses (thinking-off suffix, XML tool calls and tools
//! prompt, response normalisation).

use std::sync::OnceLock;

use crate::message::UnparsedToolCall;
use crate::python::{PY_SPACE_CLASS as WS, py_lstrip, py_rstrip};
use crate::renderer::base::UNTERMINATED_TOOL_BLOCK_ERROR;
use regex::Regex;

use std::borrow::Cow;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::message::{Content, ContentPart, Message, Role, ToolCall};
use crate::python::{py_str, py_strip};
use crate::renderer::base::python_json_dumps;
use crate::renderer::{ParseTermination, RenderContext, RenderedMessage, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::types::TokenId;

use super::{
    at_or_before_last_user, im_end_token, maybe_newline, media_unsupported, parse_qwen3_tokens,
    qwen_role,
};

/// The state every renderer of the Qwen3-VL line carries (the attributes the cookbook's
/// `Qwen3VLRenderer.__init__` sets).
#[derive(Debug, Clone)]
pub(crate) struct Qwen3Core {
    /// The registry name (`"qwen3_5"`), for [`Renderer::name`](crate::Renderer::name) and
    /// error messages.
    pub name: String,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The id of `<|im_end|>` (`_end_message_token`), the stop token.
    pub end_message_token: TokenId,
    /// Drop thinking from history (`strip_thinking_from_history`); which messages count as
    /// history is [`Qwen3_5Hooks::strips_thinking_for`].
    pub strip_thinking_from_history: bool,
    /// Tokenize a message's text pieces as one string (`merge_text_chunks`, the default),
    /// as `apply_chat_template` does; `false` tokenizes each piece separately.
    pub merge_text_chunks: bool,
}

impl Qwen3Core {
    /// The core of renderer `name`.
    ///
    /// Errors: [`Error::Tokenizer`] when the tokenizer lacks `<|im_end|>`.
    pub fn new(
        name: impl Into<String>,
        tokenizer: Tokenizer,
        strip_thinking_from_history: bool,
        merge_text_chunks: bool,
    ) -> Result<Self> {
        let name = name.into();
        let end_message_token = im_end_token(&tokenizer, &name)?;
        Ok(Qwen3Core {
            name,
            tokenizer,
            end_message_token,
            strip_thinking_from_history,
            merge_text_chunks,
        })
    }
}

/// The override points of the cookbook's `Qwen3VLRenderer` → `Qwen3_5Renderer` class line.
///
/// [`render_vl_message`] is `Qwen3VLRenderer.render_message`: the header
/// (`<|im_start|>role\n` plus [`assistant_header_suffix`](Self::assistant_header_suffix)),
/// the content as text pieces (thinking through
/// [`format_thinking_text`](Self::format_thinking_text) unless
/// [`strips_thinking_for`](Self::strips_thinking_for)), tool responses wrapped, tool calls
/// appended, `<|im_end|>`; consecutive tool responses share one user turn when
/// [`groups_consecutive_tool_responses`](Self::groups_consecutive_tool_responses).
/// [`parse_qwen_response`] is `Qwen3Renderer.parse_response` with
/// [`normalize_response_tokens`](Self::normalize_response_tokens) before and
/// [`postprocess_parsed_message`](Self::postprocess_parsed_message) after.
///
/// Every provided method is **`Qwen3_5Renderer`'s** behaviour (the class the Qwen3.8 and
/// Nemotron-3 renderers derive from); [`Qwen3VlRenderer`] overrides them back to Qwen3-VL's.
/// A renderer derived from Qwen3.5 implements [`core`](Self::core), overrides what its
/// Python class overrides, and gets its [`MessageFormat`](crate::renderer::MessageFormat)
/// (hence [`Renderer`](crate::Renderer)) implementation from the crate-internal macro
/// `impl_qwen3_message_format!`.
pub(crate) trait Qwen3_5Hooks: Send + Sync {
    /// The shared state.
    fn core(&self) -> &Qwen3Core;

    /// Whether the generation prompt closes the think block (`disables_thinking`).
    fn disables_thinking(&self) -> bool {
        false
    }

    /// `has_extension_property`. Qwen3.5: never (a turn sampled after the open `<think>\n`
    /// does not tokenize as history writes it).
    fn has_extension_property(&self) -> bool {
        false
    }

    /// `frames_thinking`: parsing strips the template's `\n` padding from thinking (and the
    /// newlines after `</think>`). `false` for the Instruct models without `<think>`.
    fn frames_thinking(&self) -> bool {
        true
    }

    /// `groups_consecutive_tool_responses`: a run of tool responses shares one
    /// `<|im_start|>user` turn (Qwen3.5 templates) instead of one turn each (Qwen3-VL).
    fn groups_consecutive_tool_responses(&self) -> bool {
        true
    }

    /// The conversation the template actually renders, applied before generation prompts
    /// and supervised examples (`build_generation_prompt` / `build_supervised_example`
    /// overrides: Qwen3.8's reasoning-effort system message, Nemotron's empty system
    /// message). Must be idempotent: a supervised example renders its generation prompt
    /// from the already normalized messages. Default: unchanged.
    fn normalize_messages<'a>(&self, messages: &'a [Message]) -> Result<Cow<'a, [Message]>> {
        Ok(Cow::Borrowed(messages))
    }

    /// `render_message`. Qwen3.5: the content trimmed by
    /// [`trim_content`](Self::trim_content), then [`render_vl_message`]. Override to patch
    /// the message or its context first (as Nemotron does), calling [`render_vl_message`].
    fn render_message(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        qwen3_5_render_message(self, message, ctx)
    }

    /// `_trim_content`: the template's `content|trim` (string content stripped; in a parts
    /// list, the visible text at both ends, thinking skipped).
    fn trim_content(&self, content: &Content) -> Content {
        match content {
            Content::Text(s) => Content::Text(py_strip(s).to_owned()),
            Content::Parts(parts) => Content::Parts(strip_visible_content(parts)),
        }
    }

    /// `_assistant_header_suffix`: text appended to an assistant header. Qwen3.5: the empty
    /// block `<think>\n\n</think>\n\n` on a turn after the last user message that did not
    /// reason; nothing otherwise.
    fn assistant_header_suffix(&self, message: &Message, ctx: &RenderContext<'_>) -> String {
        if at_or_before_last_user(ctx) || message.content.has_thinking() {
            String::new()
        } else {
            "<think>\n\n</think>\n\n".into()
        }
    }

    /// `_format_thinking_text`: how a thinking part is written. Qwen3.5:
    /// `<think>\n{thinking}\n</think>\n\n`.
    fn format_thinking_text(&self, thinking: &str) -> String {
        format!("<think>\n{thinking}\n</think>\n\n")
    }

    /// `_strips_thinking_for`: whether this message's thinking parts are left out. Qwen3-VL
    /// and Qwen3.5: every assistant message but the last, when stripping history (this
    /// over-strips a thinking tool-call turn followed by tool results; kept as the cookbook
    /// keeps it).
    fn strips_thinking_for(&self, message: &Message, ctx: &RenderContext<'_>) -> bool {
        self.core().strip_thinking_from_history && message.role == Role::Assistant && !ctx.is_last
    }

    /// `_wrap_qwen_tool_response_chunks`: `<tool_response>\n` … `\n</tool_response>`.
    fn wrap_tool_response_chunks(&self, chunks: Vec<String>) -> Vec<String> {
        let mut out = Vec::with_capacity(chunks.len() + 2);
        out.push("<tool_response>\n".to_owned());
        out.extend(chunks);
        out.push("\n</tool_response>".to_owned());
        out
    }

    /// `_tool_response_continuation_header`: what starts a tool response that continues a
    /// grouped run (`"\n"`).
    fn tool_response_continuation_header(&self) -> String {
        "\n".into()
    }

    /// `_format_tool_calls_chunks`: the text appended for a message's tool calls. Qwen3.5:
    /// the XML calls of [`format_tool_call_xml`](Self::format_tool_call_xml) joined by
    /// newlines, after a blank line when the message has visible content.
    fn format_tool_calls_chunks(&self, message: &Message) -> Result<Vec<String>> {
        let has_visible_content = match &message.content {
            Content::Text(s) => !py_strip(s).is_empty(),
            Content::Parts(parts) => parts.iter().any(|p| match p {
                ContentPart::Text { text } => !py_strip(text).is_empty(),
                ContentPart::Image { .. } => true,
                _ => false,
            }),
        };
        let calls = message
            .tool_calls
            .iter()
            .map(|c| self.format_tool_call_xml(c))
            .collect::<Result<Vec<_>>>()?
            .join("\n");
        let separator = if has_visible_content { "\n\n" } else { "" };
        Ok(vec![format!("{separator}{calls}")])
    }

    /// `_format_tool_call_xml`: one call as
    /// `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n…</function>\n</tool_call>`.
    fn format_tool_call_xml(&self, call: &ToolCall) -> Result<String> {
        let args = if call.arguments.is_empty() {
            serde_json::Map::new()
        } else {
            match call.arguments_json()? {
                Value::Object(map) => map,
                other => {
                    return Err(Error::Renderer(format!(
                        "tool call `{}`: arguments must be a JSON object, got {other}",
                        call.name
                    )));
                }
            }
        };
        let mut lines = vec![format!("<tool_call>\n<function={}>", call.name)];
        for (name, value) in &args {
            lines.push(format!(
                "<parameter={name}>\n{}\n</parameter>",
                self.format_tool_call_argument(value)
            ));
        }
        lines.push("</function>\n</tool_call>".into());
        Ok(lines.join("\n"))
    }

    /// `_format_tool_call_argument`: one argument value. Qwen3.5 (and Nemotron): objects and
    /// arrays as JSON, scalars through Python's `str` (`True`, `None`, `1.5`).
    fn format_tool_call_argument(&self, value: &Value) -> String {
        match value {
            Value::Object(_) | Value::Array(_) => python_json_dumps(value),
            scalar => py_str(scalar),
        }
    }

    /// `_generation_suffix_str`: the text the generation prompt ends with. Qwen3.5: the
    /// header plus the `<think>\n` prefill.
    fn generation_suffix_str(&self, role: &str, ctx: &RenderContext<'_>) -> String {
        format!("{}<|im_start|>{role}\n<think>\n", maybe_newline(ctx))
    }

    /// `_generation_suffix_in_header`: how much of this message's header the generation
    /// prompt already wrote (the rest moves to the output, so it is trained). Qwen3.5: the
    /// whole [`generation_suffix_str`](Self::generation_suffix_str) for the last assistant
    /// message, nothing otherwise.
    fn generation_suffix_in_header(&self, message: &Message, ctx: &RenderContext<'_>) -> String {
        if message.role != Role::Assistant || !ctx.is_last {
            return String::new();
        }
        self.generation_suffix_str(qwen_role(message.role), ctx)
    }

    /// `_get_generation_suffix`: the tokens of
    /// [`generation_suffix_str`](Self::generation_suffix_str).
    fn generation_suffix(&self, role: Role, ctx: &RenderContext<'_>) -> Result<Vec<TokenId>> {
        self.core()
            .tokenizer
            .encode(&self.generation_suffix_str(role.as_str(), ctx))
    }

    /// `_normalize_response_tokens`: sampled tokens as the parser should see them. Qwen3.5:
    /// the prefilled `<think>\n` restored when the response closes a think block it did not
    /// open.
    fn normalize_response_tokens(&self, tokens: &[TokenId]) -> Result<Vec<TokenId>> {
        qwen3_5_normalize_response_tokens(&self.core().tokenizer, tokens)
    }

    /// `_postprocess_parsed_message`, applied to a cleanly terminated parse. Qwen3.5:
    /// [`qwen3_5_postprocess_parsed_message`] (thinking trimmed, the `\n\n` after `</think>`
    /// dropped, XML tool calls parsed).
    fn postprocess_parsed_message(&self, message: &mut Message) {
        qwen3_5_postprocess_parsed_message(message);
    }

    /// `create_conversation_prefix_with_tools`. Qwen3.5: the JSON tool list and the XML
    /// calling instructions, then the system prompt.
    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        qwen3_5_tools_prefix(tools, system_prompt)
    }
}

/// `Qwen3VLRenderer._preprocess_message_parts`: the content as text pieces, thinking
/// through [`Qwen3_5Hooks::format_thinking_text`] or left out; image and audio parts are
/// [`Error::Unsupported`].
fn preprocess_message_parts<H: Qwen3_5Hooks + ?Sized>(
    hooks: &H,
    message: &Message,
    strip_thinking: bool,
) -> Result<Vec<String>> {
    match &message.content {
        Content::Text(s) => Ok(vec![s.clone()]),
        Content::Parts(parts) => {
            let mut out = Vec::with_capacity(parts.len());
            for part in parts {
                match part {
                    ContentPart::Text { text } => out.push(text.clone()),
                    ContentPart::Thinking { thinking } => {
                        if !strip_thinking {
                            out.push(hooks.format_thinking_text(thinking));
                        }
                    }
                    other => return Err(media_unsupported(&hooks.core().name, other)),
                }
            }
            Ok(out)
        }
    }
}

/// `Qwen3VLRenderer.render_message`, the render path of the Qwen3-VL line (see
/// [`Qwen3_5Hooks`]), for text content.
pub(crate) fn render_vl_message<H: Qwen3_5Hooks + ?Sized>(
    hooks: &H,
    message: &Message,
    ctx: &RenderContext<'_>,
) -> Result<RenderedMessage> {
    let core = hooks.core();
    let grouping = hooks.groups_consecutive_tool_responses();
    let is_tool = message.role == Role::Tool;
    let prev_is_tool = grouping && ctx.prev_message.is_some_and(|m| m.role == Role::Tool);
    let mut header = if is_tool && prev_is_tool {
        // A continuation of a tool-response run: the user turn stays open.
        hooks.tool_response_continuation_header()
    } else {
        let mut h = format!(
            "{}<|im_start|>{}\n",
            maybe_newline(ctx),
            qwen_role(message.role)
        );
        if message.role == Role::Assistant {
            h.push_str(&hooks.assistant_header_suffix(message, ctx));
        }
        h
    };

    let mut chunks =
        preprocess_message_parts(hooks, message, hooks.strips_thinking_for(message, ctx))?;
    if is_tool {
        chunks = hooks.wrap_tool_response_chunks(chunks);
    }
    if !message.tool_calls.is_empty() {
        chunks.extend(hooks.format_tool_calls_chunks(message)?);
    }
    let next_is_tool = grouping && ctx.next_message.is_some_and(|m| m.role == Role::Tool);
    if !(is_tool && next_is_tool) {
        // The last response of a grouped run closes the shared turn.
        chunks.push(super::IM_END.to_owned());
    }
    if core.merge_text_chunks && !chunks.is_empty() {
        chunks = vec![chunks.concat()];
    }
    let mut output = chunks
        .iter()
        .map(|c| core.tokenizer.encode(c))
        .collect::<Result<Vec<_>>>()?;

    let prefix = hooks.generation_suffix_in_header(message, ctx);
    if !prefix.is_empty()
        && let Some(rest) = header.strip_prefix(prefix.as_str())
    {
        if !rest.is_empty() {
            output.insert(0, core.tokenizer.encode(rest)?);
        }
        header = prefix;
    }
    Ok(RenderedMessage {
        header: core.tokenizer.encode(&header)?,
        output,
        stop_overlap: Vec::new(),
    })
}

/// `Qwen3_5Renderer.render_message`: the content trimmed by
/// [`Qwen3_5Hooks::trim_content`], then [`render_vl_message`]. For overrides of
/// [`Qwen3_5Hooks::render_message`] that patch the message or context and then call the
/// Qwen3.5 behaviour (Python's `super().render_message`).
pub(crate) fn qwen3_5_render_message<H: Qwen3_5Hooks + ?Sized>(
    hooks: &H,
    message: &Message,
    ctx: &RenderContext<'_>,
) -> Result<RenderedMessage> {
    let mut trimmed = message.clone();
    trimmed.content = hooks.trim_content(&message.content);
    render_vl_message(hooks, &trimmed, ctx)
}

/// `parse_response` of the Qwen3-VL line: [`Qwen3_5Hooks::normalize_response_tokens`], the
/// split on `<|im_end|>`, Qwen3's `<think>` / `<tool_call>` parsing, then (for a clean
/// termination) [`Qwen3_5Hooks::postprocess_parsed_message`].
pub(crate) fn parse_qwen_response<H: Qwen3_5Hooks + ?Sized>(
    hooks: &H,
    tokens: &[TokenId],
) -> Result<(Message, ParseTermination)> {
    let core = hooks.core();
    let tokens = hooks.normalize_response_tokens(tokens)?;
    let (mut message, termination) = parse_qwen3_tokens(
        &core.tokenizer,
        core.end_message_token,
        &tokens,
        hooks.frames_thinking(),
    )?;
    if termination.is_clean() {
        hooks.postprocess_parsed_message(&mut message);
    }
    Ok((message, termination))
}

/// Implements [`MessageFormat`](crate::renderer::MessageFormat) (hence
/// [`Renderer`](crate::Renderer)) for a type implementing [`Qwen3_5Hooks`].
macro_rules! impl_qwen3_message_format {
    ($ty:ty) => {
        impl $crate::renderer::MessageFormat for $ty {
            fn name(&self) -> &str {
                &$crate::renderer::qwen3::Qwen3_5Hooks::core(self).name
            }
            fn tokenizer(&self) -> &$crate::tokenizer::Tokenizer {
                &$crate::renderer::qwen3::Qwen3_5Hooks::core(self).tokenizer
            }
            fn render_message(
                &self,
                message: &$crate::message::Message,
                ctx: &$crate::renderer::RenderContext<'_>,
            ) -> $crate::error::Result<$crate::renderer::RenderedMessage> {
                $crate::renderer::qwen3::Qwen3_5Hooks::render_message(self, message, ctx)
            }
            fn stop(&self) -> $crate::types::StopCondition {
                $crate::types::StopCondition::Tokens(vec![
                    $crate::renderer::qwen3::Qwen3_5Hooks::core(self).end_message_token,
                ])
            }
            fn parse_response(
                &self,
                tokens: &[$crate::types::TokenId],
            ) -> $crate::error::Result<(
                $crate::message::Message,
                $crate::renderer::ParseTermination,
            )> {
                $crate::renderer::qwen3::parse_qwen_response(self, tokens)
            }
            fn generation_suffix(
                &self,
                role: $crate::message::Role,
                ctx: &$crate::renderer::RenderContext<'_>,
            ) -> $crate::error::Result<Vec<$crate::types::TokenId>> {
                $crate::renderer::qwen3::Qwen3_5Hooks::generation_suffix(self, role, ctx)
            }
            fn disables_thinking(&self) -> bool {
                $crate::renderer::qwen3::Qwen3_5Hooks::disables_thinking(self)
            }
            fn has_extension_property(&self) -> bool {
                $crate::renderer::qwen3::Qwen3_5Hooks::has_extension_property(self)
            }
            fn generation_prompt_with(
                &self,
                messages: &[$crate::message::Message],
                role: $crate::message::Role,
                prefill: Option<&str>,
            ) -> $crate::error::Result<$crate::types::ModelInput> {
                let messages =
                    $crate::renderer::qwen3::Qwen3_5Hooks::normalize_messages(self, messages)?;
                $crate::renderer::base::build_generation_prompt(self, &messages, role, prefill)
            }
            fn supervised_example_with(
                &self,
                messages: &[$crate::message::Message],
                train_on: $crate::renderer::TrainOnWhat,
            ) -> $crate::error::Result<($crate::types::ModelInput, Vec<f32>)> {
                let messages =
                    $crate::renderer::qwen3::Qwen3_5Hooks::normalize_messages(self, messages)?;
                $crate::renderer::base::build_supervised_example(self, &messages, train_on)
            }
            fn conversation_prefix_with_tools(
                &self,
                tools: &[$crate::renderer::ToolSpec],
                system_prompt: &str,
            ) -> $crate::error::Result<Vec<$crate::message::Message>> {
                $crate::renderer::qwen3::Qwen3_5Hooks::conversation_prefix_with_tools(
                    self,
                    tools,
                    system_prompt,
                )
            }
        }
    };
}
pub(crate) use impl_qwen3_message_format;

/// The generation suffix of the thinking-off Qwen3.5 / Qwen3.8 renderers:
/// `<|im_start|>{role}\n<think>\n\n</think>\n\n`.
pub(crate) fn closed_think_generation_suffix_str(role: &str, ctx: &RenderContext<'_>) -> String {
    format!(
        "{}<|im_start|>{role}\n<think>\n\n</think>\n\n",
        maybe_newline(ctx)
    )
}

/// `_strip_visible_content`: the template's `content|trim` on a parts list — leading
/// whitespace stripped from the first visible text parts (until one keeps some text),
/// trailing whitespace from the last ones; thinking parts are skipped, a non-text visible
/// part stops the stripping.
pub(crate) fn strip_visible_content(parts: &[ContentPart]) -> Vec<ContentPart> {
    let mut parts = parts.to_vec();
    let visible: Vec<usize> = parts
        .iter()
        .enumerate()
        .filter(|(_, p)| !matches!(p, ContentPart::Thinking { .. }))
        .map(|(i, _)| i)
        .collect();
    type Strip = fn(&str) -> &str;
    let backwards: Vec<usize> = visible.iter().rev().copied().collect();
    let passes: [(&[usize], Strip); 2] = [(&visible, py_lstrip), (&backwards, py_rstrip)];
    for (indices, strip) in passes {
        for &i in indices {
            let ContentPart::Text { text } = &parts[i] else {
                break;
            };
            let stripped = strip(text).to_owned();
            let done = !stripped.is_empty();
            parts[i] = ContentPart::Text { text: stripped };
            if done {
                break;
            }
        }
    }
    parts
}

/// Qwen3.5's `_normalize_response_tokens`: the prefilled `<think>\n` put back in front of a
/// response that contains `</think>` but does not start with `<think>\n`.
pub(crate) fn qwen3_5_normalize_response_tokens(
    tokenizer: &Tokenizer,
    tokens: &[TokenId],
) -> Result<Vec<TokenId>> {
    let prefix = tokenizer.encode("<think>\n")?;
    let suffix = tokenizer.encode("</think>")?;
    let [close] = suffix[..] else {
        return Err(Error::Renderer(format!(
            "`</think>` must be a single token, the tokenizer gives {}",
            suffix.len()
        )));
    };
    let starts_with_think = tokens.len() >= prefix.len() && tokens[..prefix.len()] == prefix[..];
    if !starts_with_think && tokens.contains(&close) {
        let mut out = prefix;
        out.extend_from_slice(tokens);
        return Ok(out);
    }
    Ok(tokens.to_vec())
}

/// Qwen3.5's `_postprocess_parsed_message`, applied to a cleanly terminated parse:
///
/// 1. thinking parts up to the first text after thinking are whitespace-trimmed (the
///    template's `|trim`);
/// 2. that text loses the two separator newlines after `</think>`;
/// 3. `<tool_call>` blocks that failed as JSON but hold `<function=` are parsed as Qwen3.5
///    XML ([`parse_qwen3_5_tool_call_xml`]) and appended to the tool calls; an unterminated
///    block keeps its error.
pub(crate) fn qwen3_5_postprocess_parsed_message(message: &mut Message) {
    if let Content::Parts(parts) = &mut message.content {
        let mut seen_thinking = false;
        let mut first_text = None;
        for (i, part) in parts.iter_mut().enumerate() {
            match part {
                ContentPart::Thinking { thinking } => {
                    *thinking = py_strip(thinking).to_owned();
                    seen_thinking = true;
                }
                ContentPart::Text { .. } if seen_thinking => {
                    first_text = Some(i);
                    break;
                }
                _ => {}
            }
        }
        if let Some(ContentPart::Text { text }) = first_text.map(|i| &mut parts[i])
            && let Some(rest) = text.strip_prefix("\n\n")
        {
            *text = rest.to_owned();
        }
    }

    let mut converted = Vec::new();
    let mut remaining = Vec::new();
    for unparsed in std::mem::take(&mut message.unparsed_tool_calls) {
        if unparsed.error.starts_with(UNTERMINATED_TOOL_BLOCK_ERROR)
            || !unparsed.raw_text.contains("<function=")
        {
            remaining.push(unparsed);
            continue;
        }
        match parse_qwen3_5_tool_call_xml(&unparsed.raw_text) {
            Ok(call) => converted.push(call),
            Err(bad) => remaining.push(bad),
        }
    }
    message.tool_calls.extend(converted);
    message.unparsed_tool_calls = remaining;
}

fn function_block_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(&format!(
            r"(?s)\A{WS}*<tool_call>{WS}*<function=(?P<name>[^>\n]+)>{WS}*(?P<body>.*?){WS}*</function>{WS}*</tool_call>{WS}*\z"
        ))
        .unwrap_or_else(|e| panic!("static regex: {e}"))
    })
}

fn param_block_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(&format!(
            r"(?s)<parameter=(?P<name>[^>\n]+)>{WS}*(?P<value>.*?){WS}*</parameter>"
        ))
        .unwrap_or_else(|e| panic!("static regex: {e}"))
    })
}

/// `_parse_qwen3_5_tool_call_xml`: a raw `<tool_call>…</tool_call>` block in Qwen3.5's XML
/// format as a [`ToolCall`] (each parameter value parsed as JSON when it is JSON, kept as a
/// string otherwise; the arguments are Python's `json.dumps` of the object), or an
/// [`UnparsedToolCall`] saying what is wrong.
pub(crate) fn parse_qwen3_5_tool_call_xml(
    raw_text: &str,
) -> std::result::Result<ToolCall, UnparsedToolCall> {
    let unparsed = |error: &str| UnparsedToolCall {
        raw_text: raw_text.to_owned(),
        error: error.to_owned(),
    };
    let Some(caps) = function_block_regex().captures(raw_text) else {
        return Err(unparsed("Malformed Qwen3.5 tool call XML"));
    };
    let name = py_strip(&caps["name"]);
    if name.is_empty() {
        return Err(unparsed("Missing function name"));
    }
    let body = &caps["body"];
    let mut arguments = serde_json::Map::new();
    let mut pos = 0;
    for param in param_block_regex().captures_iter(body) {
        let whole = param.get(0).expect("group 0 always matches");
        if !py_strip(&body[pos..whole.start()]).is_empty() {
            return Err(unparsed(
                "Unexpected non-parameter content inside <function> block",
            ));
        }
        let param_name = py_strip(&param["name"]);
        let value_text = param["value"].trim_matches('\n');
        if param_name.is_empty() {
            return Err(unparsed("Empty parameter name"));
        }
        let value = serde_json::from_str::<Value>(value_text)
            .unwrap_or_else(|_| Value::String(value_text.to_owned()));
        arguments.insert(param_name.to_owned(), value);
        pos = whole.end();
    }
    if !py_strip(&body[pos..]).is_empty() {
        return Err(unparsed(
            "Unexpected trailing content inside <function> block",
        ));
    }
    Ok(ToolCall::new(
        name,
        python_json_dumps(&Value::Object(arguments)),
    ))
}

/// Qwen3.5's `create_conversation_prefix_with_tools`: one system message with the tools as
/// JSON lines and the XML calling instructions, then the system prompt.
pub(crate) fn qwen3_5_tools_prefix(
    tools: &[ToolSpec],
    system_prompt: &str,
) -> Result<Vec<Message>> {
    let mut tools_text = String::new();
    if !tools.is_empty() {
        let lines = tools
            .iter()
            .map(|t| {
                serde_json::to_value(t)
                    .map(|v| python_json_dumps(&v))
                    .map_err(|e| Error::Renderer(format!("tool `{}`: {e}", t.name)))
            })
            .collect::<Result<Vec<_>>>()?
            .join("\n");
        tools_text = xml_tools_prompt(&lines);
    }
    let content = if tools_text.is_empty() {
        system_prompt.to_owned()
    } else if system_prompt.is_empty() {
        tools_text
    } else {
        format!("{tools_text}\n\n{system_prompt}")
    };
    Ok(vec![Message::system(content)])
}

/// The tool-declaration system text of the Qwen3.5 template (also Nemotron-3's): the
/// declarations (one per line) inside `<tools>`, then the XML calling convention.
pub(crate) fn xml_tools_prompt(declarations: &str) -> String {
    format!(
        "# Tools\n\nYou have access to the following functions:\n\n<tools>\n{declarations}\n</tools>\n\n\
                 If you choose to call a function ONLY reply in the following format with NO suffix:\n\n\
                 <tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n\
                 value_1\n</parameter>\n<parameter=example_parameter_2>\n\
                 This is the value for the second parameter\nthat can span\nmultiple lines\n\
                 </parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n\
                 - Function calls MUST follow the specified format: an inner <function=...></function> \
                 block must be nested within <tool_call></tool_call> XML tags\n\
                 - Required parameters MUST be specified\n\
                 - You may provide optional reasoning for your function call in natural language \
                 BEFORE the function call, but NOT after\n\
                 - If there is no function call available, answer the question like normal with \
                 your current knowledge and do not tell the user about function calls\n\
                 </IMPORTANT>"
    )
}
