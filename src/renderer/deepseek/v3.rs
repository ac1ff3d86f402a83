//! DeepSeek V3 / V3.1 (the cookbook's `deepseek_v3.py`).

use std::sync::OnceLock;

use regex::Regex;

use super::{ASSISTANT, BOS, END_OF_SENTENCE, USER};
use crate::error::{Error, Result};
use crate::message::{Content, ContentPart, Message, Role, ToolCall, UnparsedToolCall};
use crate::renderer::ParseTermination;
use crate::renderer::base::{
    MessageFormat, RenderContext, RenderedMessage, ToolSpec, build_generation_prompt,
    detect_unterminated_tool_block, parse_response_for_stop_token, parse_think_blocks,
    python_json_dumps, restore_think_prefix, single_token, static_regex,
};
use crate::tokenizer::Tokenizer;
use crate::types::{ModelInput, StopCondition, TokenId};

const TOOL_OUTPUT_BEGIN: &str = "<｜tool▁output▁begin｜>";
const TOOL_OUTPUT_END: &str = "<｜tool▁output▁end｜>";
const TOOL_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const TOOL_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const TOOL_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const TOOL_CALL_END: &str = "<｜tool▁call▁end｜>";
const TOOL_SEP: &str = "<｜tool▁sep｜>";

/// The cookbook's DeepSeek V3 renderers: `DeepSeekV3ThinkingRenderer` and
/// `DeepSeekV3DisableThinkingRenderer` (`deepseekv3`, `deepseekv3_disable_thinking`,
/// `deepseekv3_thinking`).
///
/// `<｜begin▁of▁sentence｜>{system}<｜User｜>{question}<｜Assistant｜>{answer}<｜end▁of▁sentence｜>`:
/// a system message is allowed only first (and has no role token) unless
/// [`with_system_role_as_user`](Self::with_system_role_as_user) turns later ones into user
/// turns. Tool calls are
/// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{args}<｜tool▁call▁end｜><｜tool▁calls▁end｜>`
/// after the answer; a tool result is `<｜tool▁output▁begin｜>…<｜tool▁output▁end｜>`, and the
/// assistant message after it has no role token.
///
/// With thinking off, every assistant turn (not following a tool result) starts with
/// `</think>` (in the header, never trained) and reasoning is dropped. With thinking on, the
/// generation prompt prefills `<think>` (except after a tool result), earlier assistant turns
/// lose their reasoning and start with `</think>` (unless
/// [`with_strip_thinking_from_history`](Self::with_strip_thinking_from_history)`(false)`),
/// and a last turn without reasoning gets an empty `<think></think>`.
///
/// ```
/// use rlvr::renderer::deepseek::DeepSeekV3;
/// use rlvr::{message::Message, renderer::TrainOnWhat, types::StopCondition, Renderer};
/// # fn main() -> rlvr::Result<()> {
/// // A toy tokenizer: DeepSeek's special tokens plus one token per character.
/// let specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
///     "<｜Assistant｜>", "<think>", "</think>"];
/// let chars: Vec<String> = " Hi!?ol".chars().map(String::from).collect();
/// let vocab: serde_json::Map<String, serde_json::Value> =
///     chars.iter().enumerate().map(|(i, c)| (c.clone(), i.into())).collect();
/// let added: Vec<serde_json::Value> = specials.iter().enumerate().map(|(i, s)| serde_json::json!({
///     "id": chars.len() + i, "content": s, "single_word": false, "lstrip": false,
///     "rstrip": false, "normalized": false, "special": true})).collect();
/// let json = serde_json::json!({
///     "version": "1.0", "added_tokens": added, "normalizer": null, "pre_tokenizer": null,
///     "post_processor": null, "decoder": {"type": "Fuse"},
///     "model": {"type": "BPE", "vocab": vocab, "merges": [], "unk_token": " "},
/// });
/// let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(json.to_string().as_bytes())?;
///
/// let renderer = DeepSeekV3::new(tokenizer.clone(), false)?;
/// let eos = tokenizer.token_to_id("<｜end▁of▁sentence｜>").unwrap();
/// assert_eq!(renderer.stop(), StopCondition::Tokens(vec![eos]));
/// let chat = [Message::user("Hi?"), Message::assistant("Hi!")];
/// let prompt = renderer.generation_prompt(&chat[..1])?;
/// assert_eq!(
///     tokenizer.decode(&prompt.to_tokens())?,
///     "<｜begin▁of▁sentence｜><｜User｜>Hi?<｜Assistant｜></think>"
/// );
/// let (input, weights) = renderer.supervised_example(&chat, TrainOnWhat::LastAssistantMessage)?;
/// let trained: Vec<u32> = input.to_tokens().iter().zip(&weights)
///     .filter(|(_, w)| **w > 0.0).map(|(t, _)| *t).collect();
/// assert_eq!(tokenizer.decode(&trained)?, "Hi!<｜end▁of▁sentence｜>");
///
/// // Thinking on: the prompt prefills `<think>`, which parsing puts back.
/// let thinking = DeepSeekV3::new(tokenizer.clone(), true)?;
/// let prompt = thinking.generation_prompt(&chat[..1])?;
/// assert!(tokenizer.decode(&prompt.to_tokens())?.ends_with("<｜Assistant｜><think>"));
/// let sampled = tokenizer.encode("Hi</think>Hi!<｜end▁of▁sentence｜>")?;
/// let (message, _) = thinking.parse_response(&sampled);
/// assert_eq!(message.thinking().as_deref(), Some("Hi"));
/// assert_eq!(message.text(), "Hi!");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DeepSeekV3 {
    tokenizer: Tokenizer,
    name: String,
    thinking: bool,
    system_role_as_user: bool,
    strip_thinking_from_history: bool,
    bos: TokenId,
    end: TokenId,
    user: TokenId,
    assistant: TokenId,
    /// `</think>` encoded as text.
    think_close_text: Vec<TokenId>,
    /// `<think></think>` encoded as text.
    empty_think_block: Vec<TokenId>,
    /// The `<think>` / `</think>` token ids (thinking mode only).
    think_ids: Option<(TokenId, TokenId)>,
}

impl DeepSeekV3 {
    /// The thinking (`thinking = true`, the cookbook's `DeepSeekV3ThinkingRenderer`) or
    /// non-thinking (`DeepSeekV3DisableThinkingRenderer`) renderer over `tokenizer`, with the
    /// cookbook's defaults: later system messages rejected, reasoning stripped from history.
    ///
    /// Errors: [`Error::Tokenizer`] when a role token (or, with thinking, `<think>` /
    /// `</think>`) is not a single token of `tokenizer`.
    pub fn new(tokenizer: Tokenizer, thinking: bool) -> Result<Self> {
        let name = if thinking {
            "deepseekv3_thinking"
        } else {
            "deepseekv3"
        };
        let tok = |s: &str| single_token(&tokenizer, s, name);
        let think_ids = if thinking {
            let id = |s: &str| {
                tokenizer.token_to_id(s).ok_or_else(|| {
                    Error::Tokenizer(format!(
                        "renderer `{name}` needs the token `{s}`, which this tokenizer lacks"
                    ))
                })
            };
            Some((id("<think>")?, id("</think>")?))
        } else {
            None
        };
        Ok(DeepSeekV3 {
            name: name.to_owned(),
            thinking,
            system_role_as_user: false,
            strip_thinking_from_history: true,
            bos: tok(BOS)?,
            end: tok(END_OF_SENTENCE)?,
            user: tok(USER)?,
            assistant: tok(ASSISTANT)?,
            think_close_text: tokenizer.encode("</think>")?,
            empty_think_block: tokenizer.encode("<think></think>")?,
            think_ids,
            tokenizer,
        })
    }

    /// Renders system messages after the first as user turns (otherwise they are an error).
    pub fn with_system_role_as_user(mut self, yes: bool) -> Self {
        self.system_role_as_user = yes;
        self
    }

    /// Whether reasoning is dropped from earlier assistant turns (default `true`, as the HF
    /// template); `false` keeps it, giving the thinking renderer the extension property.
    pub fn with_strip_thinking_from_history(mut self, yes: bool) -> Self {
        self.strip_thinking_from_history = yes;
        self
    }

    /// Whether this is the thinking renderer.
    pub fn thinking(&self) -> bool {
        self.thinking
    }

    pub(crate) fn named(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// The cookbook's `_DeepSeekV3BaseRenderer.render_message`.
    fn render_base(&self, message: &Message, ctx: &RenderContext<'_>) -> Result<RenderedMessage> {
        let follows_tool = ctx.prev_message.is_some_and(|p| p.role == Role::Tool);
        let (header, mut output): (Vec<TokenId>, String) = match message.role {
            Role::System => {
                let text = message.content.as_text()?.to_owned();
                if ctx.idx == 0 {
                    (Vec::new(), text)
                } else if self.system_role_as_user {
                    (vec![self.user], text)
                } else {
                    return Err(Error::Renderer(
                        "DeepSeek only supports system message at start. Use \
                         system_role_as_user=True to convert later system messages to user role."
                            .into(),
                    ));
                }
            }
            Role::User => (vec![self.user], message.content.as_text()?.to_owned()),
            Role::Assistant => {
                let should_strip = self.strip_thinking_from_history
                    && message.tool_calls.is_empty()
                    && !ctx.is_last;
                let body = match &message.content {
                    Content::Text(s) => s.clone(),
                    Content::Parts(parts) => {
                        let mut out = String::new();
                        for p in parts {
                            match p {
                                ContentPart::Thinking { thinking } => {
                                    if !should_strip {
                                        out.push_str("<think>");
                                        out.push_str(thinking);
                                        out.push_str("</think>");
                                    }
                                }
                                ContentPart::Text { text } => out.push_str(text),
                                other => return Err(unsupported_part(&self.name, other)),
                            }
                        }
                        out
                    }
                };
                let header = if follows_tool {
                    Vec::new()
                } else {
                    vec![self.assistant]
                };
                (header, body)
            }
            Role::Tool => (
                self.tokenizer.encode(TOOL_OUTPUT_BEGIN)?,
                format!("{}{TOOL_OUTPUT_END}", message.content.as_text()?),
            ),
            other => return Err(Error::Renderer(format!("Unsupported role: {other}"))),
        };
        if !message.tool_calls.is_empty() {
            output.push_str(TOOL_CALLS_BEGIN);
            for call in &message.tool_calls {
                output.push_str(&format!(
                    "{TOOL_CALL_BEGIN}{}{TOOL_SEP}{}{TOOL_CALL_END}",
                    call.name, call.arguments
                ));
            }
            output.push_str(TOOL_CALLS_END);
        }
        let mut tokens = self.tokenizer.encode(&output)?;
        if message.role == Role::Assistant && !message.content.is_empty() {
            tokens.push(self.end);
        }
        Ok(RenderedMessage::new(header, tokens))
    }

    /// `DeepSeekV3ThinkingRenderer.render_message`.
    fn render_thinking(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        let mut rendered = self.render_base(message, ctx)?;
        let follows_tool = ctx.prev_message.is_some_and(|p| p.role == Role::Tool);
        let assistant_turn = message.role == Role::Assistant && !follows_tool;
        if assistant_turn && self.strip_thinking_from_history && !ctx.is_last {
            rendered.header.extend_from_slice(&self.think_close_text);
        } else if assistant_turn
            && ctx.is_last
            && !message.content.is_empty()
            && !message.content.has_thinking()
            && let Some(first) = rendered.output.first_mut()
        {
            let mut with_block = self.empty_think_block.clone();
            with_block.append(first);
            *first = with_block;
        }
        Ok(rendered)
    }

    /// `DeepSeekV3DisableThinkingRenderer.render_message`.
    fn render_disable_thinking(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        let follows_tool = ctx.prev_message.is_some_and(|p| p.role == Role::Tool);
        if message.role != Role::Assistant || follows_tool {
            return self.render_base(message, ctx);
        }
        let text = match &message.content {
            Content::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    match p {
                        ContentPart::Text { text } => out.push_str(text),
                        ContentPart::Thinking { .. } => {}
                        other => return Err(unsupported_part(&self.name, other)),
                    }
                }
                out
            }
            Content::Text(s) => think_block_regex().replace_all(s, "").into_owned(),
        };
        let mut stripped = message.clone();
        stripped.content = Content::Text(text);
        let mut rendered = self.render_base(&stripped, ctx)?;
        rendered.header.extend_from_slice(&self.think_close_text);
        Ok(rendered)
    }

    /// `_parse_deepseek_tool_calls`: the calls of the first tool-calls section.
    fn parse_tool_calls(content: &str) -> (Vec<ToolCall>, Vec<UnparsedToolCall>) {
        let mut calls = Vec::new();
        let mut unparsed = Vec::new();
        let Some(section) = calls_section_regex().captures(content) else {
            return (calls, unparsed);
        };
        let inner = section.get(1).map_or("", |m| m.as_str());
        for m in call_regex().captures_iter(inner) {
            let raw = m.get(0).map_or("", |m| m.as_str());
            let name = m.get(1).map_or("", |m| m.as_str());
            let args = m.get(2).map_or("", |m| m.as_str()).trim();
            match serde_json::from_str::<serde_json::Value>(args) {
                Ok(_) => calls.push(ToolCall::new(name, args)),
                Err(e) => unparsed.push(UnparsedToolCall {
                    raw_text: raw.to_owned(),
                    error: format!("Invalid JSON: {e}"),
                }),
            }
        }
        (calls, unparsed)
    }

    /// `_parse_response_content` (the batch path: a missing stop token ends parsing).
    fn parse(&self, response: &[TokenId]) -> Result<(Message, ParseTermination)> {
        let (message, termination) =
            parse_response_for_stop_token(response, &self.tokenizer, self.end)?;
        if !termination.is_clean() {
            return Ok((message, termination));
        }
        Ok((Self::parse_content(message)?, termination))
    }

    /// The content part of `_parse_response_content`: tool calls out of the decoded text
    /// (and the calls section removed when there were any), then think blocks.
    pub(crate) fn parse_content(mut message: Message) -> Result<Message> {
        let mut content = message.content.as_text()?.to_owned();
        let (calls, mut unparsed) = Self::parse_tool_calls(&content);
        if let Some(dangling) = [
            (TOOL_CALLS_BEGIN, TOOL_CALLS_END),
            (TOOL_CALL_BEGIN, TOOL_CALL_END),
        ]
        .iter()
        .find_map(|(open, close)| detect_unterminated_tool_block(&content, open, close))
        {
            unparsed.push(dangling);
        }
        if !calls.is_empty() || !unparsed.is_empty() {
            content = strip_calls_regex()
                .replace_all(&content, "")
                .trim()
                .to_owned();
        }
        message.tool_calls = calls;
        message.unparsed_tool_calls = unparsed;
        message.content = match parse_think_blocks(&content) {
            Some(parts) => Content::Parts(parts),
            None => Content::Text(content),
        };
        Ok(message)
    }
}

fn unsupported_part(renderer: &str, part: &ContentPart) -> Error {
    Error::Unsupported(format!(
        "renderer `{renderer}` does not render {} parts",
        part.kind()
    ))
}

fn think_block_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(&RE, r"(?s)<think>.*?</think>")
}

fn calls_section_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(&RE, r"(?s)<｜tool▁calls▁begin｜>(.*?)<｜tool▁calls▁end｜>")
}

fn call_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(
        &RE,
        r"(?s)<｜tool▁call▁begin｜>(\w+)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>",
    )
}

fn strip_calls_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(&RE, r"(?s)\s*<｜tool▁calls▁begin｜>.*?<｜tool▁calls▁end｜>")
}

impl MessageFormat for DeepSeekV3 {
    fn name(&self) -> &str {
        &self.name
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn bos_tokens(&self) -> Vec<TokenId> {
        vec![self.bos]
    }

    fn render_message(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        if self.thinking {
            self.render_thinking(message, ctx)
        } else {
            self.render_disable_thinking(message, ctx)
        }
    }

    fn stop(&self) -> StopCondition {
        StopCondition::Tokens(vec![self.end])
    }

    fn parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        match self.think_ids {
            Some((open, close)) => self.parse(&restore_think_prefix(tokens, open, close)),
            None => self.parse(tokens),
        }
    }

    fn has_extension_property(&self) -> bool {
        !self.thinking || !self.strip_thinking_from_history
    }

    /// With thinking on, the prompt prefills `<think>` (before any `prefill`), except after a
    /// tool result: tool use stays in non-thinking mode.
    fn generation_prompt_with(
        &self,
        messages: &[Message],
        role: Role,
        prefill: Option<&str>,
    ) -> Result<ModelInput> {
        if !self.thinking || messages.last().is_some_and(|m| m.role == Role::Tool) {
            return build_generation_prompt(self, messages, role, prefill);
        }
        let prefill = format!("<think>{}", prefill.unwrap_or(""));
        build_generation_prompt(self, messages, role, Some(&prefill))
    }

    /// One system message: `system_prompt`, then the tools under `## Tools` with their JSON
    /// schemas and the tool-call format (DeepSeek V3.1's model card).
    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        let mut tools_text = String::new();
        if !tools.is_empty() {
            let blocks: Vec<String> = tools
                .iter()
                .map(|t| {
                    format!(
                        "### {}\nDescription: {}\n\nParameters: {}",
                        t.name,
                        t.description,
                        python_json_dumps(&t.parameters)
                    )
                })
                .collect();
            tools_text = format!(
                "\n\n## Tools\nYou have access to the following tools:\n\n{}\n\n\
                 IMPORTANT: ALWAYS adhere to this exact format for tool use:\n\
                 {TOOL_CALLS_BEGIN}{TOOL_CALL_BEGIN}tool_call_name{TOOL_SEP}tool_call_arguments\
                 {TOOL_CALL_END}{TOOL_CALLS_END}\n\n\
                 Where:\n\
                 - `tool_call_name` must be an exact match to one of the available tools\n\
                 - `tool_call_arguments` must be valid JSON that strictly follows the tool's \
                 Parameters Schema\n\
                 - For multiple tool calls, chain them directly without separators or spaces",
                blocks.join("\n")
            );
        }
        Ok(vec![Message::system(format!(
            "{system_prompt}{tools_text}"
        ))])
    }
}
