//! The render path shared by Qwen3-VL, Qwen3.5, Qwen3.8 (and, in the cookbook, Nemotron-3):
//! `Qwen3VLRenderer.render_message` with its override points as the [`Qwen3_5Hooks`] trait.

use std::borrow::Cow;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::message::{Content, ContentPart, Message, Role, ToolCall};
use crate::python::{py_str, py_strip};
use crate::renderer::base::python_json_dumps;
use crate::renderer::{ParseTermination, RenderContext, RenderedMessage, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::types::TokenId;

use super::qwen3_5::{
    qwen3_5_normalize_response_tokens, qwen3_5_postprocess_parsed_message, qwen3_5_tools_prefix,
    strip_visible_content,
};
use super::{
    at_or_before_last_user, im_end_token, maybe_newline, media_unsupported, parse_qwen3_tokens,
    qwen3_tools_prefix, qwen_role, tool_call_blocks_json,
};

/// The state every renderer of the Qwen3-VL line carries (the attributes the cookbook's
/// `Qwen3VLRenderer.__init__` sets).
#[derive(Debug, Clone)]
pub struct Qwen3Core {
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
pub trait Qwen3_5Hooks: Send + Sync {
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
                    )))
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
pub fn render_vl_message<H: Qwen3_5Hooks + ?Sized>(
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
    if !prefix.is_empty() {
        if let Some(rest) = header.strip_prefix(prefix.as_str()) {
            if !rest.is_empty() {
                output.insert(0, core.tokenizer.encode(rest)?);
            }
            header = prefix;
        }
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
pub fn qwen3_5_render_message<H: Qwen3_5Hooks + ?Sized>(
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
pub fn parse_qwen_response<H: Qwen3_5Hooks + ?Sized>(
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

/// How a [`Qwen3VlRenderer`] is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qwen3VlOptions {
    /// Qwen3-VL Instruct (`qwen3_vl_instruct`): no `<think>` framing to undo when parsing.
    pub instruct: bool,
    /// Drop thinking parts from assistant messages before the last one (default `true`).
    pub strip_thinking_from_history: bool,
    /// Tokenize a message's text pieces as one string (default `true`).
    pub merge_text_chunks: bool,
}

impl Default for Qwen3VlOptions {
    fn default() -> Self {
        Qwen3VlOptions {
            instruct: false,
            strip_thinking_from_history: true,
            merge_text_chunks: true,
        }
    }
}

/// The Qwen3-VL renderer, text only: `qwen3_vl` and `qwen3_vl_instruct`.
///
/// The cookbook's `Qwen3VLRenderer` / `Qwen3VLInstructRenderer` without an image
/// processor: the ChatML layout of Qwen3 with thinking parts written inline as
/// `<think>…</think>` (no template framing), tool calls as JSON in `<tool_call>` tags, each
/// tool response in its own `user` turn. Image and audio parts are
/// [`Error::Unsupported`](crate::Error::Unsupported).
///
/// ```
/// # fn main() -> rlvr::Result<()> {
/// # // A toy character-level tokenizer with the ChatML special tokens.
/// # let tokenizer = rlvr::Tokenizer::from_bytes(br#"{"version":"1.0","added_tokens":[
/// #   {"id":10,"content":"<|im_start|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
/// #   {"id":11,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
/// #   "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":{"type":"Fuse"},
/// #   "model":{"type":"BPE","vocab":{"a":0,"b":1,"\n":2,"u":3,"s":4,"e":5,"r":6,"i":7,"t":8,"n":9},
/// #   "merges":[],"unk_token":"a"}}"#)?;
/// use rlvr::renderer::qwen3::Qwen3VlRenderer;
/// use rlvr::{Message, Renderer};
/// let renderer = Qwen3VlRenderer::new(tokenizer.clone())?;
/// let prompt = renderer.generation_prompt(&[Message::user("ab")])?;
/// assert_eq!(
///     tokenizer.decode(&prompt.to_tokens())?,
///     "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Qwen3VlRenderer {
    core: Qwen3Core,
    instruct: bool,
}

impl Qwen3VlRenderer {
    /// The `qwen3_vl` renderer.
    ///
    /// Errors: [`Error::Tokenizer`](crate::Error::Tokenizer) when the tokenizer lacks
    /// `<|im_end|>`.
    pub fn new(tokenizer: Tokenizer) -> Result<Self> {
        Self::with_options(tokenizer, Qwen3VlOptions::default())
    }

    /// A renderer configured by `options`.
    ///
    /// Errors: [`Error::Tokenizer`](crate::Error::Tokenizer) when the tokenizer lacks
    /// `<|im_end|>`.
    pub fn with_options(tokenizer: Tokenizer, options: Qwen3VlOptions) -> Result<Self> {
        let name = if options.instruct {
            "qwen3_vl_instruct"
        } else {
            "qwen3_vl"
        };
        Ok(Qwen3VlRenderer {
            core: Qwen3Core::new(
                name,
                tokenizer,
                options.strip_thinking_from_history,
                options.merge_text_chunks,
            )?,
            instruct: options.instruct,
        })
    }
}

impl Qwen3_5Hooks for Qwen3VlRenderer {
    fn core(&self) -> &Qwen3Core {
        &self.core
    }

    fn has_extension_property(&self) -> bool {
        !self.core.strip_thinking_from_history
    }

    fn frames_thinking(&self) -> bool {
        !self.instruct
    }

    fn groups_consecutive_tool_responses(&self) -> bool {
        false
    }

    fn render_message(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        render_vl_message(self, message, ctx)
    }

    fn assistant_header_suffix(&self, _message: &Message, _ctx: &RenderContext<'_>) -> String {
        String::new()
    }

    fn format_thinking_text(&self, thinking: &str) -> String {
        format!("<think>{thinking}</think>")
    }

    fn format_tool_calls_chunks(&self, message: &Message) -> Result<Vec<String>> {
        Ok(vec![format!(
            "\n{}",
            tool_call_blocks_json(&message.tool_calls)?
        )])
    }

    fn generation_suffix_in_header(&self, _message: &Message, _ctx: &RenderContext<'_>) -> String {
        String::new()
    }

    fn generation_suffix(&self, role: Role, ctx: &RenderContext<'_>) -> Result<Vec<TokenId>> {
        // The cookbook's default: the header of an empty message of `role`.
        Ok(render_vl_message(self, &Message::new(role, ""), ctx)?.header)
    }

    fn normalize_response_tokens(&self, tokens: &[TokenId]) -> Result<Vec<TokenId>> {
        Ok(tokens.to_vec())
    }

    fn postprocess_parsed_message(&self, _message: &mut Message) {}

    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        qwen3_tools_prefix(tools, system_prompt)
    }
}

impl_qwen3_message_format!(Qwen3VlRenderer);
