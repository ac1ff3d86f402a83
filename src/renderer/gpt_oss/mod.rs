//! The GPT-OSS renderers: OpenAI's Harmony format (the cookbook's `GptOssRenderer`).
//!
//! One configurable type, [`GptOssRenderer`]: with or without OpenAI's system prompt, whose
//! [`ReasoningEffort`] (and date) it states. The registry names map onto it:
//!
//! | name | system prompt |
//! |---|---|
//! | `gpt_oss_no_sysprompt` | none |
//! | `gpt_oss_low_reasoning` | `Reasoning: low` |
//! | `gpt_oss_medium_reasoning` | `Reasoning: medium` |
//! | `gpt_oss_high_reasoning` | `Reasoning: high` |

use std::borrow::Cow;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::message::{Content, ContentPart, Message, Role, ToolCall, UnparsedToolCall};
use crate::python::{is_py_space, json_loads_check, py_strip};
use crate::renderer::TrainOnWhat;
use crate::renderer::base::{
    ToolSpec, UNTERMINATED_TOOL_BLOCK_ERROR, build_generation_prompt, build_supervised_example,
    decode, single_token,
};
use crate::renderer::{MessageFormat, ParseTermination, RenderContext, RenderedMessage, Renderer};
use crate::tokenizer::Tokenizer;
use crate::types::{ModelInput, StopCondition, TokenId};

mod typescript;

/// The renderer called `name` of this family.
pub(crate) fn build(name: &str, tokenizer: Tokenizer) -> Result<Arc<dyn Renderer>> {
    let effort = match name {
        "gpt_oss_no_sysprompt" => None,
        "gpt_oss_low_reasoning" => Some(ReasoningEffort::Low),
        "gpt_oss_medium_reasoning" => Some(ReasoningEffort::Medium),
        "gpt_oss_high_reasoning" => Some(ReasoningEffort::High),
        _ => return Err(crate::renderer::registry::unknown(name)),
    };
    Ok(Arc::new(GptOssRenderer::new(tokenizer, effort)?))
}

/// How hard a GPT-OSS model reasons, as its system prompt states it (`Reasoning: low`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasoningEffort {
    /// `Reasoning: low`.
    Low,
    /// `Reasoning: medium`.
    Medium,
    /// `Reasoning: high`.
    High,
}

impl ReasoningEffort {
    /// The word in the system prompt (`"low"`, `"medium"`, `"high"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }
}

/// OpenAI's system prompt; `{date}` and `{effort}` are filled in.
const SYSTEM_PROMPT: &str = "You are ChatGPT, a large language model trained by OpenAI.\n\
Knowledge cutoff: 2024-06\n\
Current date: {date}\n\n\
Reasoning: {effort}\n\n\
# Valid channels: analysis, commentary, final. Channel must be included for every message.";

/// The system message of the tool prefix (Harmony routes function calls to commentary).
const TOOLS_SYSTEM: &str = "Calls to these tools must go to the commentary channel: 'functions'.";

/// The Harmony format of OpenAI's open-weight models (gpt-oss), the cookbook's
/// `GptOssRenderer`.
///
/// Wire format: `<|start|>{role}<|channel|>{channel}<|message|>{content}<|end|>`, no newlines
/// between messages.
///
/// - A [`Role::System`] message is the user's instructions: it renders as a `developer` turn
///   under `# Instructions`. With a [`ReasoningEffort`], OpenAI's own system prompt (model
///   identity, knowledge cutoff, current date, reasoning effort, valid channels) is
///   prepended as a real `system` turn ([`Role::GptOssSystem`]).
/// - An assistant turn writes its thinking to the `analysis` channel, its text to `final`,
///   and ends with `<|return|>` when it is the last message (`<|end|>` in history). With tool
///   calls, the text becomes a `commentary` preamble and each call is
///   `<|start|>assistant to=functions.NAME<|channel|>commentary <|constrain|>json<|message|>{args}<|call|>`.
/// - A tool result is `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>…<|end|>`;
///   the tool's name comes from the message's `name` (`functions.unknown` without one).
/// - Sampling stops at `<|return|>` or `<|call|>`; [`parse_response`](Renderer::parse_response)
///   splits the channels into thinking, text and tool calls.
///
/// The date in the system prompt is today's (UTC) unless fixed with
/// [`with_current_date`](Self::with_current_date) — fix it for reproducible prompts.
///
/// ```
/// use rlvr::renderer::gpt_oss::{GptOssRenderer, ReasoningEffort};
/// use rlvr::{message::{ContentPart, Message}, renderer::ParseTermination, types::StopCondition, Renderer};
/// # fn main() -> rlvr::Result<()> {
/// // A toy tokenizer: one token per ASCII character, plus Harmony's special tokens.
/// let specials = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
///                 "<|return|>", "<|call|>"];
/// let mut chars: Vec<String> = (0x20u8..0x7f).map(|b| (b as char).to_string()).collect();
/// chars.push("\n".into());
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
/// // `gpt_oss_no_sysprompt`, built directly (or by name with `renderer::by_name`).
/// let plain = GptOssRenderer::new(tokenizer.clone(), None)?;
/// let chat = [Message::system("Be brief."), Message::user("1+1?")];
/// let prompt = plain.generation_prompt(&chat)?;
/// assert_eq!(
///     tokenizer.decode(&prompt.to_tokens())?,
///     "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>\
///      <|start|>user<|message|>1+1?<|end|><|start|>assistant"
/// );
/// let stop = StopCondition::Tokens(vec![
///     tokenizer.token_to_id("<|return|>").unwrap(),
///     tokenizer.token_to_id("<|call|>").unwrap(),
/// ]);
/// assert_eq!(plain.stop(), stop);
///
/// // What the model samples after `<|start|>assistant`: analysis, then final.
/// let sampled = tokenizer.encode(
///     "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant\
///      <|channel|>final<|message|>2<|return|>",
/// )?;
/// let (message, termination) = plain.parse_response(&sampled);
/// assert_eq!(termination, ParseTermination::StopSequence);
/// assert_eq!(message.thinking().as_deref(), Some("Easy."));
/// assert_eq!(message.text(), "2");
///
/// // `gpt_oss_low_reasoning` with a fixed date: OpenAI's system prompt comes first.
/// let low = GptOssRenderer::new(tokenizer.clone(), Some(ReasoningEffort::Low))?
///     .with_current_date("2025-08-05");
/// let text = tokenizer.decode(&low.generation_prompt(&chat[1..])?.to_tokens())?;
/// assert!(text.starts_with("<|start|>system<|message|>You are ChatGPT"));
/// assert!(text.contains("Current date: 2025-08-05\n\nReasoning: low\n\n"));
/// assert_eq!(low.name(), "gpt_oss_low_reasoning");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct GptOssRenderer {
    tokenizer: Tokenizer,
    reasoning_effort: Option<ReasoningEffort>,
    current_date: Option<String>,
    return_token: TokenId,
    call_token: TokenId,
}

impl GptOssRenderer {
    /// A Harmony renderer over `tokenizer`: without a system prompt for `None`
    /// (`gpt_oss_no_sysprompt`), with OpenAI's system prompt stating the effort otherwise.
    ///
    /// Errors: [`Error::Tokenizer`] when `<|return|>` or `<|call|>` is not a single token.
    pub fn new(tokenizer: Tokenizer, reasoning_effort: Option<ReasoningEffort>) -> Result<Self> {
        let return_token = single_token(&tokenizer, "<|return|>", "gpt_oss")?;
        let call_token = single_token(&tokenizer, "<|call|>", "gpt_oss")?;
        Ok(GptOssRenderer {
            tokenizer,
            reasoning_effort,
            current_date: None,
            return_token,
            call_token,
        })
    }

    /// Fixes the `Current date:` of the system prompt (`"2025-08-05"`; the cookbook's
    /// `current_date`), instead of today's date.
    pub fn with_current_date(mut self, date: impl Into<String>) -> Self {
        self.current_date = Some(date.into());
        self
    }

    /// The registry name of this configuration (`"gpt_oss_low_reasoning"`).
    pub fn name(&self) -> &'static str {
        match self.reasoning_effort {
            None => "gpt_oss_no_sysprompt",
            Some(ReasoningEffort::Low) => "gpt_oss_low_reasoning",
            Some(ReasoningEffort::Medium) => "gpt_oss_medium_reasoning",
            Some(ReasoningEffort::High) => "gpt_oss_high_reasoning",
        }
    }

    /// The reasoning effort the system prompt states; `None` without a system prompt.
    pub fn reasoning_effort(&self) -> Option<ReasoningEffort> {
        self.reasoning_effort
    }

    /// The system message prepended to every conversation, if any.
    pub fn system_message(&self) -> Option<Message> {
        let effort = self.reasoning_effort?;
        let date = match &self.current_date {
            Some(d) => d.clone(),
            None => today_utc(),
        };
        let content = SYSTEM_PROMPT
            .replace("{date}", &date)
            .replace("{effort}", effort.as_str());
        Some(Message::new(Role::GptOssSystem, content))
    }

    /// `messages` with the system message in front, when there is one.
    fn with_system<'a>(&self, messages: &'a [Message]) -> Cow<'a, [Message]> {
        match self.system_message() {
            Some(system) => {
                if messages.first().is_some_and(|m| m.role == Role::System) {
                    tracing::warn!(
                        renderer = self.name(),
                        "the renderer prepends its own system prompt and the messages already \
                         start with a system message: the prompt will hold two system messages \
                         (use gpt_oss_no_sysprompt or drop the system message)"
                    );
                }
                let mut all = Vec::with_capacity(messages.len() + 1);
                all.push(system);
                all.extend_from_slice(messages);
                Cow::Owned(all)
            }
            None => Cow::Borrowed(messages),
        }
    }

    fn encode(&self, text: &str) -> Result<Vec<TokenId>> {
        self.tokenizer.encode(text)
    }

    fn render_tool_result(&self, message: &Message) -> Result<RenderedMessage> {
        let mut name = message.name.as_deref().unwrap_or("").to_owned();
        if name.is_empty() {
            tracing::warn!(
                "gpt_oss: tool message without a `name`; it renders as functions.unknown \
                 (set the name of the function the result comes from)"
            );
            name = "unknown".into();
        }
        if !name.starts_with("functions.") {
            name = format!("functions.{name}");
        }
        let header = format!("<|start|>{name} to=assistant");
        let output = format!(
            "<|channel|>commentary<|message|>{}<|end|>",
            message.content.as_text()?
        );
        Ok(RenderedMessage::new(
            self.encode(&header)?,
            self.encode(&output)?,
        ))
    }
}

/// Each call as a commentary message to `functions.NAME`, ending in `<|call|>`.
fn render_tool_calls(calls: &[ToolCall]) -> String {
    let mut out = String::new();
    for (i, call) in calls.iter().enumerate() {
        out.push_str(&format!(
            " to=functions.{}<|channel|>commentary <|constrain|>json<|message|>{}<|call|>",
            call.name, call.arguments
        ));
        if i + 1 < calls.len() {
            out.push_str("<|start|>assistant");
        }
    }
    out
}

impl MessageFormat for GptOssRenderer {
    fn name(&self) -> &str {
        GptOssRenderer::name(self)
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn render_message(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        message.content.check_text_only(self.name())?;
        if message.role == Role::Tool {
            return self.render_tool_result(message);
        }
        let role = match message.role {
            Role::GptOssSystem => "system",
            Role::System => "developer",
            other => other.as_str(),
        };
        let header = format!("<|start|>{role}");
        let mut output = String::new();
        match message.role {
            Role::Assistant => {
                let mut text = String::new();
                let mut thinking = String::new();
                for part in message.content.parts().iter() {
                    match part {
                        ContentPart::Text { text: t } => text.push_str(t),
                        ContentPart::Thinking { thinking: t } => thinking.push_str(t),
                        _ => {}
                    }
                }
                if !thinking.is_empty() {
                    output.push_str(&format!(
                        "<|channel|>analysis<|message|>{thinking}<|end|><|start|>assistant"
                    ));
                }
                if message.tool_calls.is_empty() {
                    output.push_str(&format!("<|channel|>final<|message|>{text}"));
                    output.push_str(if ctx.is_last { "<|return|>" } else { "<|end|>" });
                } else {
                    if !text.is_empty() {
                        output.push_str(&format!(
                            "<|channel|>commentary<|message|>{text}<|end|><|start|>assistant"
                        ));
                    }
                    // Each call already ends with <|call|>.
                    output.push_str(&render_tool_calls(&message.tool_calls));
                }
            }
            Role::System => {
                output.push_str(&format!(
                    "<|message|># Instructions\n\n{}\n\n<|end|>",
                    message.content.as_text()?
                ));
            }
            _ => {
                output.push_str(&format!("<|message|>{}<|end|>", message.content.as_text()?));
            }
        }
        Ok(RenderedMessage::new(
            self.encode(&header)?,
            self.encode(&output)?,
        ))
    }

    fn stop(&self) -> StopCondition {
        StopCondition::Tokens(vec![self.return_token, self.call_token])
    }

    fn parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        let count = |t: TokenId| tokens.iter().filter(|&&x| x == t).count();
        let (calls, returns) = (count(self.call_token), count(self.return_token));
        if calls == 0 && returns == 0 {
            return Ok((
                Message::assistant(decode(&self.tokenizer, tokens)?),
                ParseTermination::Malformed,
            ));
        }
        for (n, token) in [(calls, "<|call|>"), (returns, "<|return|>")] {
            if n > 1 {
                return Err(Error::Renderer(format!(
                    "when parsing a response, expected at most one {token} token but got {n}: \
                     sampling probably used the wrong stop tokens"
                )));
            }
        }
        let stop_idx = tokens
            .iter()
            .position(|&t| t == self.return_token || t == self.call_token)
            .unwrap_or(tokens.len());
        let text = decode(&self.tokenizer, &tokens[..stop_idx])?;
        let (parts, tool_calls, mut unparsed) = parse_harmony_output(&text);
        if let Some(dangling) = detect_dangling_tool_block(&text, tool_calls.len(), unparsed.len())
        {
            unparsed.push(dangling);
        }
        let content = if parts.is_empty() {
            Content::Text(text)
        } else {
            Content::Parts(parts)
        };
        let mut message = Message::assistant(content);
        message.tool_calls = tool_calls;
        message.unparsed_tool_calls = unparsed;
        Ok((message, ParseTermination::StopSequence))
    }

    fn generation_prompt_with(
        &self,
        messages: &[Message],
        role: Role,
        prefill: Option<&str>,
    ) -> Result<ModelInput> {
        build_generation_prompt(self, &self.with_system(messages), role, prefill)
    }

    fn supervised_example_with(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)> {
        // As in the cookbook, the generation prompt the base compares against (for
        // the loss after the prompt) prepends the system message once more.
        build_supervised_example(self, &self.with_system(messages), train_on)
    }

    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        let mut messages = Vec::new();
        if !tools.is_empty() {
            messages.push(Message::new(Role::GptOssSystem, TOOLS_SYSTEM));
        }
        let mut sections = Vec::new();
        if !system_prompt.is_empty() {
            sections.push(format!("# Instructions\n\n{system_prompt}"));
        }
        if !tools.is_empty() {
            let defs = tools
                .iter()
                .map(typescript::format_tool_definition)
                .collect::<Result<Vec<_>>>()?;
            sections.push(format!(
                "# Tools\n\n## functions\n\nnamespace functions {{\n\n{}\n\n}} // namespace functions",
                defs.join("\n\n")
            ));
        }
        if !sections.is_empty() {
            messages.push(Message::new(Role::Developer, sections.join("\n\n")));
        }
        Ok(messages)
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

/// The first non-empty run of characters other than whitespace and `<` right after an
/// occurrence of `marker` (the regex `marker([^\s<]+)`, searched left to right).
fn value_after<'a>(header: &'a str, marker: &str) -> Option<&'a str> {
    let mut from = 0;
    while let Some(i) = header[from..].find(marker) {
        let start = from + i + marker.len();
        let rest = &header[start..];
        let len = rest
            .find(|c: char| c == '<' || is_py_space(c))
            .unwrap_or(rest.len());
        if len > 0 {
            return Some(&rest[..len]);
        }
        from = from + i + 1;
    }
    None
}

/// One Harmony message found in sampled text.
struct HarmonyMessage<'a> {
    channel: Option<&'a str>,
    recipient: Option<&'a str>,
    content: &'a str,
    raw_text: &'a str,
}

/// The cookbook's `_parse_harmony_messages`: `[<|start|>]header<|message|>body<end>` pieces.
fn parse_harmony_messages(content: &str) -> Vec<HarmonyMessage<'_>> {
    const MESSAGE: &str = "<|message|>";
    const END_TOKENS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
    let mut out = Vec::new();
    let mut idx = 0;
    while let Some(found) = content[idx..].find(MESSAGE) {
        let message_idx = idx + found;
        let header_start = content[idx..message_idx]
            .rfind("<|start|>")
            .map_or(idx, |i| idx + i);
        let header = &content[header_start..message_idx];
        let content_start = message_idx + MESSAGE.len();
        let mut end_idx = content.len();
        let mut end_token = "";
        for token in END_TOKENS {
            if let Some(i) = content[content_start..].find(token)
                && content_start + i < end_idx
            {
                end_idx = content_start + i;
                end_token = token;
            }
        }
        out.push(HarmonyMessage {
            channel: value_after(header, "<|channel|>"),
            recipient: value_after(header, "to="),
            content: &content[content_start..end_idx],
            raw_text: &content[header_start..end_idx + end_token.len()],
        });
        idx = end_idx + end_token.len();
    }
    out
}

/// The cookbook's `_parse_harmony_output`: analysis as thinking, final and commentary as
/// text, messages to `functions.NAME` as tool calls (arguments must be JSON).
fn parse_harmony_output(content: &str) -> (Vec<ContentPart>, Vec<ToolCall>, Vec<UnparsedToolCall>) {
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut unparsed = Vec::new();
    for msg in parse_harmony_messages(content) {
        let trimmed = py_strip(msg.content);
        if trimmed.is_empty() {
            continue;
        }
        if let Some(name) = msg.recipient.and_then(|r| r.strip_prefix("functions.")) {
            match json_loads_check(msg.content) {
                Ok(()) => calls.push(ToolCall::new(name, trimmed)),
                Err(e) => unparsed.push(UnparsedToolCall {
                    raw_text: msg.raw_text.to_owned(),
                    error: format!("Invalid JSON: {e}"),
                }),
            }
            continue;
        }
        match msg.channel {
            Some("analysis") => parts.push(ContentPart::thinking(msg.content)),
            Some("final" | "commentary") => parts.push(ContentPart::text(msg.content)),
            _ => {}
        }
    }
    (parts, calls, unparsed)
}

/// The cookbook's `_detect_dangling_tool_block`: a `to=functions.` header that produced
/// neither a tool call nor an unparsed one.
fn detect_dangling_tool_block(
    content: &str,
    parsed: usize,
    unparsed: usize,
) -> Option<UnparsedToolCall> {
    if content.matches("to=functions.").count() <= parsed + unparsed {
        return None;
    }
    let start = content.rfind("<|start|>").unwrap_or(0);
    Some(UnparsedToolCall {
        raw_text: content[start..].to_owned(),
        error: format!(
            "{UNTERMINATED_TOOL_BLOCK_ERROR}: 'to=functions.' tool-call header without a \
             parsable arguments payload"
        ),
    })
}

// ---------------------------------------------------------------------------------------------
// Today's date
// ---------------------------------------------------------------------------------------------

/// Today's date (UTC) as `YYYY-MM-DD`.
fn today_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;
