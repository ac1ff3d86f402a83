//! The GLM-5.3 renderers (`glm5_3_max_reasoning`, `glm5_3_high_reasoning`,
//! `glm5_3_low_reasoning`): the cookbook's `Glm5_3Renderer` and its reasoning-effort variants.
//!
//! Format (the zai-org/GLM-5.3 chat template), shown with line breaks that the real format
//! does not have:
//!
//! ```text
//! [gMASK]<sop><|system|>Reasoning Effort: Max<|system|>{system prompt}
//! <|user|>{question}<|assistant|><think>{reasoning}</think>{answer}<|user|>
//! ```
//!
//! - The prompt always starts with `[gMASK]<sop><|system|>Reasoning Effort: {Low|High|Max}`.
//!   There is no way to turn thinking off: generation prompts always end with an open
//!   `<think>`.
//! - There is no end-of-message token: an assistant turn ends with the next role token,
//!   `<|user|>` after a reply, `<|observation|>` after tool calls (or `<|endoftext|>`); those
//!   three are the stop tokens. Each assistant message owns its terminator (it is trained with
//!   the message) and the following message drops the matching role token from its header;
//!   the last assistant message of a supervised example gets it as its stop overlap.
//! - The `<think>` prefill sits in the zero-weight header of every assistant message.
//! - Visible assistant text is stripped of surrounding whitespace; thinking is kept in history
//!   unless [`Glm5Renderer::with_strip_thinking_from_history`] is set.
//! - Tool calls are `<tool_call>{name}<arg_key>{key}</arg_key><arg_value>{value}</arg_value>…
//!   </tool_call>` (string values raw, other values as JSON); consecutive tool responses share
//!   one `<|observation|>` and are re-sorted into tool-call order when the ids allow an
//!   unambiguous match.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use regex::Regex;

use crate::error::{Error, Result};
use crate::message::{Content, ContentPart, Message, Role, ToolCall, UnparsedToolCall};
use crate::python::py_strip;
use crate::renderer::base::{
    build_generation_prompt, build_supervised_example, decode, parse_content_blocks, python_json,
    python_json_dumps, restore_think_prefix, single_token, static_regex,
};
use crate::renderer::{
    MessageFormat, ParseTermination, RenderContext, RenderedMessage, Renderer, ToolSpec,
    TrainOnWhat,
};
use crate::tokenizer::Tokenizer;
use crate::types::{ModelInput, StopCondition, TokenId};

/// The `<think>` prefill every GLM-5.3 generation prompt ends with.
const THINK_PREFILL: &str = "<think>";

/// The GLM-5.3 reasoning effort, written into the `<|system|>Reasoning Effort: …` segment that
/// opens every prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReasoningEffort {
    /// `Reasoning Effort: Low` (`glm5_3_low_reasoning`), the closest GLM-5.3 has to a
    /// non-thinking mode.
    Low,
    /// `Reasoning Effort: High` (`glm5_3_high_reasoning`).
    High,
    /// `Reasoning Effort: Max` (`glm5_3_max_reasoning`), the chat template's default.
    #[default]
    Max,
}

impl ReasoningEffort {
    /// The text of the system segment (`"Max"`).
    pub fn display(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "Low",
            ReasoningEffort::High => "High",
            ReasoningEffort::Max => "Max",
        }
    }

    /// The registry name of the renderer with this effort (`"glm5_3_max_reasoning"`).
    pub fn renderer_name(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "glm5_3_low_reasoning",
            ReasoningEffort::High => "glm5_3_high_reasoning",
            ReasoningEffort::Max => "glm5_3_max_reasoning",
        }
    }

    /// The effort of a registry name of this family.
    pub fn from_renderer_name(name: &str) -> Option<Self> {
        [
            ReasoningEffort::Low,
            ReasoningEffort::High,
            ReasoningEffort::Max,
        ]
        .into_iter()
        .find(|e| e.renderer_name() == name)
    }
}

/// The cookbook's GLM-5.3 renderer (`Glm5_3Renderer` and its high / low reasoning
/// subclasses), one type configured by [`ReasoningEffort`].
///
/// The tokenizer must have `[gMASK]`, `<sop>`, `<|system|>`, `<|user|>`, `<|assistant|>`,
/// `<|observation|>`, `<|endoftext|>`, `<think>` and `</think>` as single tokens
/// ([`Error::Tokenizer`] otherwise). Image and audio parts are [`Error::Unsupported`].
///
/// ```
/// use rlvr::renderer::glm5::{Glm5Renderer, ReasoningEffort};
/// use rlvr::{message::Message, renderer::ParseTermination, types::StopCondition, Renderer};
/// # fn main() -> rlvr::Result<()> {
/// // A character-level toy tokenizer (one token per character) plus GLM's special tokens.
/// let chars: Vec<String> = " ERLHMaefghinorstwx:1+?=2".chars().map(String::from).collect();
/// let mut vocab: serde_json::Map<String, serde_json::Value> =
///     chars.iter().enumerate().map(|(i, c)| (c.clone(), i.into())).collect();
/// let specials = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
///     "<|observation|>", "<|endoftext|>", "<think>", "</think>"];
/// let added: Vec<serde_json::Value> = specials.iter().enumerate().map(|(i, s)| {
///     let id = chars.len() + i;
///     vocab.insert(s.to_string(), id.into());
///     serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false,
///         "rstrip": false, "normalized": false, "special": true})
/// }).collect();
/// let json = serde_json::json!({
///     "version": "1.0", "added_tokens": added, "normalizer": null, "pre_tokenizer": null,
///     "post_processor": null, "decoder": {"type": "Fuse"},
///     "model": {"type": "BPE", "vocab": vocab, "merges": [], "unk_token": " "},
/// });
/// let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(json.to_string().as_bytes())?;
///
/// let renderer = Glm5Renderer::new(tokenizer.clone(), ReasoningEffort::Low)?;
/// let prompt = renderer.generation_prompt(&[Message::user("1+1?")])?;
/// assert_eq!(
///     tokenizer.decode(&prompt.to_tokens())?,
///     "[gMASK]<sop><|system|>Reasoning Effort: Low<|user|>1+1?<|assistant|><think>"
/// );
/// // Sampling stops at the next role token (or <|endoftext|>).
/// let user = tokenizer.token_to_id("<|user|>").unwrap();
/// assert!(matches!(renderer.stop(), StopCondition::Tokens(t) if t.contains(&user)));
/// // The sampled tokens continue after the prefilled <think>.
/// let (message, termination) = renderer.parse_response(&tokenizer.encode("1+1=2</think>2<|user|>")?);
/// assert_eq!(message.thinking().as_deref(), Some("1+1=2"));
/// assert_eq!(message.text(), "2");
/// assert_eq!(termination, ParseTermination::StopSequence);
///
/// // The same renderer by name.
/// let by_name = rlvr::renderer::by_name("glm5_3_max_reasoning", tokenizer)?;
/// assert_eq!(by_name.name(), "glm5_3_max_reasoning");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Glm5Renderer {
    tokenizer: Tokenizer,
    effort: ReasoningEffort,
    strip_thinking_from_history: bool,
    bos: Vec<TokenId>,
    system: TokenId,
    user: TokenId,
    assistant: TokenId,
    observation: TokenId,
    endoftext: TokenId,
    think_open: TokenId,
    think_close: TokenId,
}

impl Glm5Renderer {
    /// A GLM-5.3 renderer with `effort`, keeping thinking in history (the template's
    /// `clear_thinking=False` default).
    pub fn new(tokenizer: Tokenizer, effort: ReasoningEffort) -> Result<Self> {
        let name = effort.renderer_name();
        let tok = |s: &str| single_token(&tokenizer, s, name);
        // The Reasoning Effort segment is always emitted.
        let bos = tokenizer.encode(&format!(
            "[gMASK]<sop><|system|>Reasoning Effort: {}",
            effort.display()
        ))?;
        Ok(Glm5Renderer {
            bos,
            system: tok("<|system|>")?,
            user: tok("<|user|>")?,
            assistant: tok("<|assistant|>")?,
            observation: tok("<|observation|>")?,
            endoftext: tok("<|endoftext|>")?,
            think_open: tok("<think>")?,
            think_close: tok("</think>")?,
            tokenizer,
            effort,
            strip_thinking_from_history: false,
        })
    }

    /// Replace the thinking of assistant messages at or before the last user message with an
    /// empty `<think></think>` (the template's `clear_thinking=True`). This loses the extension
    /// property.
    pub fn with_strip_thinking_from_history(mut self, strip: bool) -> Self {
        self.strip_thinking_from_history = strip;
        self
    }

    /// The reasoning effort.
    pub fn reasoning_effort(&self) -> ReasoningEffort {
        self.effort
    }

    /// Whether thinking is stripped from history.
    pub fn strips_thinking_from_history(&self) -> bool {
        self.strip_thinking_from_history
    }

    fn stop_tokens(&self) -> [TokenId; 3] {
        [self.user, self.observation, self.endoftext]
    }

    /// The cookbook's `_turn_terminator_token`: the token that ends this assistant turn, or
    /// `None` when the next message does not start with it.
    fn turn_terminator(&self, message: &Message, next: Option<&Message>) -> Option<TokenId> {
        let expected = if message.tool_calls.is_empty() {
            self.user
        } else {
            self.observation
        };
        let Some(next) = next else {
            return Some(expected);
        };
        let next_header = match next.role {
            Role::User => Some(self.user),
            Role::Tool => Some(self.observation),
            _ => None,
        };
        (next_header == Some(expected)).then_some(expected)
    }

    /// The cookbook's `_header_supplied_by_previous_turn`.
    fn header_supplied_by_previous_turn(&self, message: &Message, ctx: &RenderContext<'_>) -> bool {
        match ctx.prev_message {
            Some(prev) if prev.role == Role::Assistant => {
                self.turn_terminator(prev, Some(message)).is_some()
            }
            _ => false,
        }
    }

    /// The cookbook's `_parse_response_content` (without the missing-stop short cut's
    /// streaming variant).
    fn parse_normalized(&self, response: &[TokenId]) -> Result<(Message, ParseTermination)> {
        let stops = self.stop_tokens();
        let positions: Vec<usize> = response
            .iter()
            .enumerate()
            .filter(|(_, t)| stops.contains(t))
            .map(|(i, _)| i)
            .collect();
        let (content, termination) = match positions.as_slice() {
            [] => {
                let content = decode(&self.tokenizer, response)?;
                return Ok((Message::assistant(content), ParseTermination::Malformed));
            }
            [stop] => {
                let content = decode(&self.tokenizer, &response[..*stop])?;
                let termination = if response[*stop] == self.endoftext {
                    ParseTermination::Eos
                } else {
                    ParseTermination::StopSequence
                };
                (content, termination)
            }
            many => {
                return Err(Error::Renderer(format!(
                    "When parsing response, expected to split into 1 or 2 pieces using stop \
                     tokens, but got {}. You probably are using the wrong stop tokens when \
                     sampling",
                    many.len()
                )));
            }
        };
        let mut message = Message::assistant(content.as_str());
        if let Some((parts, calls)) = parse_content_blocks(&content) {
            message.content = Content::Parts(parts);
            // parse_content_blocks expects JSON payloads: GLM-format calls come back unparsed
            // and are parsed again here (JSON-parsed calls first, as the cookbook orders them).
            let mut glm_calls = Vec::new();
            for call in calls {
                match call {
                    Ok(call) => message.tool_calls.push(call),
                    Err(unparsed) => glm_calls.push(parse_glm_tool_call(&unparsed.raw_text)),
                }
            }
            for call in glm_calls {
                match call {
                    Ok(call) => message.tool_calls.push(call),
                    Err(unparsed) => message.unparsed_tool_calls.push(unparsed),
                }
            }
        }
        Ok((message, termination))
    }
}

/// The renderer called `name` of this family.
pub(crate) fn build(name: &str, tokenizer: Tokenizer) -> Result<Arc<dyn Renderer>> {
    let effort = ReasoningEffort::from_renderer_name(name)
        .ok_or_else(|| crate::renderer::registry::unknown(name))?;
    Ok(Arc::new(Glm5Renderer::new(tokenizer, effort)?))
}

/// The template's `visible_text`: a string, or the text parts joined; any other part is an
/// error.
fn visible_text(content: &Content) -> Result<String> {
    match content {
        Content::Text(s) => Ok(s.clone()),
        Content::Parts(parts) => {
            let mut out = String::new();
            for part in parts {
                match part {
                    ContentPart::Text { text } => out.push_str(text),
                    other => return Err(unsupported_part(other, " here")),
                }
            }
            Ok(out)
        }
    }
}

fn unsupported_part(part: &ContentPart, where_: &str) -> Error {
    let msg = format!(
        "GLM-5.3 renderer does not support '{}' content parts{where_}",
        part.kind()
    );
    match part {
        ContentPart::Image { .. } | ContentPart::Audio { .. } => Error::Unsupported(msg),
        _ => Error::Renderer(msg),
    }
}

/// The cookbook's `_split_reasoning_and_text`: (reasoning, visible text); reasoning is `None`
/// when the message has none.
fn split_reasoning_and_text(content: &Content) -> Result<(Option<String>, String)> {
    match content {
        Content::Parts(parts) => {
            let mut reasoning: Option<String> = None;
            let mut text = String::new();
            for part in parts {
                match part {
                    ContentPart::Thinking { thinking } => {
                        reasoning.get_or_insert_with(String::new).push_str(thinking)
                    }
                    ContentPart::Text { text: t } => text.push_str(t),
                    other => return Err(unsupported_part(other, "")),
                }
            }
            Ok((reasoning, text))
        }
        Content::Text(s) if s.contains("</think>") => {
            let before_close = s.split("</think>").next().unwrap_or("");
            let reasoning = before_close.rsplit("<think>").next().unwrap_or("");
            let text = s.rsplit("</think>").next().unwrap_or("");
            Ok((Some(reasoning.to_owned()), text.to_owned()))
        }
        Content::Text(s) => Ok((None, s.clone())),
    }
}

/// A tool-call argument value as the template writes it: strings raw, anything else as JSON.
fn format_arg_value(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => python_json(other, ", ", ": ", false),
    }
}

/// The cookbook's `_format_glm_tool_call`.
fn format_tool_call(call: &ToolCall) -> Result<String> {
    let mut out = format!("<tool_call>{}", call.name);
    if !call.arguments.is_empty() {
        match call.arguments_json()? {
            serde_json::Value::Object(args) => {
                for (key, value) in &args {
                    out.push_str(&format!(
                        "<arg_key>{key}</arg_key><arg_value>{}</arg_value>",
                        format_arg_value(value)
                    ));
                }
            }
            _ => {
                return Err(Error::Renderer(format!(
                    "tool call `{}`: arguments are not a JSON object",
                    call.name
                )));
            }
        }
    }
    out.push_str("</tool_call>");
    Ok(out)
}

fn glm_tool_call_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    // Python's \s also matches the information separators \x1c-\x1f.
    static_regex(
        &RE,
        r"(?s)\A[\s\x1c-\x1f]*<tool_call>[\s\x1c-\x1f]*(?P<name>[\w\-\.]+)[\s\x1c-\x1f]*(?P<body>.*?)[\s\x1c-\x1f]*</tool_call>[\s\x1c-\x1f]*\z",
    )
}

fn glm_arg_pair_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(
        &RE,
        r"(?s)<arg_key>(?P<key>.*?)</arg_key>[\s\x1c-\x1f]*<arg_value>(?P<value>.*?)</arg_value>",
    )
}

/// The cookbook's `_parse_glm_tool_call`: a `<tool_call>…</tool_call>` block in GLM's
/// key/value format. Values are parsed as JSON when they are JSON, kept as strings otherwise.
pub(crate) fn parse_glm_tool_call(
    raw_text: &str,
) -> std::result::Result<ToolCall, UnparsedToolCall> {
    let unparsed = |error: &str| UnparsedToolCall {
        raw_text: raw_text.to_owned(),
        error: error.to_owned(),
    };
    let Some(caps) = glm_tool_call_regex().captures(raw_text) else {
        return Err(unparsed("Malformed GLM tool call"));
    };
    let name = caps.name("name").map_or("", |m| m.as_str());
    let body = caps.name("body").map_or("", |m| m.as_str());
    let mut arguments = serde_json::Map::new();
    let mut pos = 0;
    for pair in glm_arg_pair_regex().captures_iter(body) {
        let whole = pair.get(0).expect("group 0 always matches");
        if !py_strip(&body[pos..whole.start()]).is_empty() {
            return Err(unparsed("Unexpected content between tool call arguments"));
        }
        let key = py_strip(pair.name("key").map_or("", |m| m.as_str()));
        if key.is_empty() {
            return Err(unparsed("Empty tool call argument key"));
        }
        let value_text = pair.name("value").map_or("", |m| m.as_str());
        let value = serde_json::from_str::<serde_json::Value>(value_text)
            .unwrap_or_else(|_| serde_json::Value::String(value_text.to_owned()));
        arguments.insert(key.to_owned(), value);
        pos = whole.end();
    }
    if !py_strip(&body[pos..]).is_empty() {
        return Err(unparsed("Unexpected trailing content inside tool call"));
    }
    Ok(ToolCall::new(
        name,
        python_json_dumps(&serde_json::Value::Object(arguments)),
    ))
}

/// The cookbook's `_sort_tool_block`: a block of consecutive tool responses in the order of
/// the preceding assistant message's tool calls, when every id is present, unique and known;
/// as given otherwise.
fn sort_tool_block(block: &[Message], prev: Option<&Message>) -> Vec<Message> {
    let Some(prev) = prev.filter(|p| p.role == Role::Assistant) else {
        return block.to_vec();
    };
    if prev.tool_calls.is_empty() {
        return block.to_vec();
    }
    let call_ids: Option<Vec<&str>> = prev
        .tool_calls
        .iter()
        .map(|c| c.id.as_deref().filter(|id| !id.is_empty()))
        .collect();
    let Some(call_ids) = call_ids.filter(|ids| all_unique(ids)) else {
        return block.to_vec();
    };
    let response_ids: Option<Vec<&str>> = block
        .iter()
        .map(|m| m.tool_call_id.as_deref().filter(|id| !id.is_empty()))
        .collect();
    let Some(response_ids) = response_ids.filter(|ids| all_unique(ids)) else {
        return block.to_vec();
    };
    if !response_ids.iter().all(|id| call_ids.contains(id)) {
        return block.to_vec();
    }
    call_ids
        .iter()
        .filter_map(|id| {
            response_ids
                .iter()
                .position(|r| r == id)
                .map(|i| block[i].clone())
        })
        .collect()
}

fn all_unique(ids: &[&str]) -> bool {
    ids.iter().collect::<HashSet<_>>().len() == ids.len()
}

/// The cookbook's `_reorder_tool_results`: every block of consecutive tool responses sorted
/// by [`sort_tool_block`].
fn reorder_tool_results(messages: &[Message]) -> Vec<Message> {
    let mut out = Vec::with_capacity(messages.len());
    let mut idx = 0;
    while idx < messages.len() {
        if messages[idx].role != Role::Tool {
            out.push(messages[idx].clone());
            idx += 1;
            continue;
        }
        let mut end = idx;
        while end + 1 < messages.len() && messages[end + 1].role == Role::Tool {
            end += 1;
        }
        let prev = idx.checked_sub(1).map(|i| &messages[i]);
        out.extend(sort_tool_block(&messages[idx..=end], prev));
        idx = end + 1;
    }
    out
}

/// The tool-declaration system message of the template (its leading newline included).
fn tools_system_message(tool_lines: &str) -> String {
    format!(
        "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
         {tool_lines}</tools>\n\n\
         For each function call, output the function name and arguments within the following \
         XML format:\n<tool_call>{{function-name}}<arg_key>{{arg-key-1}}</arg_key><arg_value>\
         {{arg-value-1}}</arg_value><arg_key>{{arg-key-2}}</arg_key><arg_value>{{arg-value-2}}\
         </arg_value>...</tool_call>"
    )
}

impl MessageFormat for Glm5Renderer {
    fn name(&self) -> &str {
        self.effort.renderer_name()
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn bos_tokens(&self) -> Vec<TokenId> {
        self.bos.clone()
    }

    fn render_message(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        let mut stop_overlap = Vec::new();
        let mut trailing = Vec::new();
        let (header, output_str) = match message.role {
            Role::System => (vec![self.system], visible_text(&message.content)?),
            Role::User => {
                let header = if self.header_supplied_by_previous_turn(message, ctx) {
                    Vec::new()
                } else {
                    vec![self.user]
                };
                (header, visible_text(&message.content)?)
            }
            Role::Assistant => {
                let (reasoning, text) = split_reasoning_and_text(&message.content)?;
                let keep_thinking = !self.strip_thinking_from_history
                    || ctx.last_user_index.is_none_or(|u| ctx.idx > u);
                let mut output = match reasoning.filter(|_| keep_thinking) {
                    Some(r) => format!("<think>{r}</think>"),
                    None => "<think></think>".to_owned(),
                };
                output.push_str(py_strip(&text));
                for call in &message.tool_calls {
                    output.push_str(&format_tool_call(call)?);
                }
                let mut header = vec![self.assistant];
                if let Some(rest) = output.strip_prefix(THINK_PREFILL) {
                    header.extend(self.tokenizer.encode(THINK_PREFILL)?);
                    output = rest.to_owned();
                }
                let terminator = self.turn_terminator(message, ctx.next_message);
                if ctx.is_last {
                    stop_overlap.extend(terminator);
                } else {
                    trailing.extend(terminator);
                }
                (header, output)
            }
            Role::Tool => {
                let follows_tool = ctx.prev_message.is_some_and(|p| p.role == Role::Tool);
                let header = if follows_tool || self.header_supplied_by_previous_turn(message, ctx)
                {
                    Vec::new()
                } else {
                    vec![self.observation]
                };
                let output = format!(
                    "<tool_response>{}</tool_response>",
                    visible_text(&message.content)?
                );
                (header, output)
            }
            other => return Err(Error::Renderer(format!("Unsupported role: {other}"))),
        };
        let mut output_tokens = self.tokenizer.encode(&output_str)?;
        output_tokens.extend(trailing);
        let output = if output_tokens.is_empty() {
            Vec::new()
        } else {
            vec![output_tokens]
        };
        Ok(RenderedMessage {
            header,
            output,
            stop_overlap,
        })
    }

    fn generation_suffix(&self, role: Role, _ctx: &RenderContext<'_>) -> Result<Vec<TokenId>> {
        let role_token = match role {
            Role::System => self.system,
            Role::User => self.user,
            Role::Assistant => self.assistant,
            Role::Tool => self.observation,
            other => {
                return Err(Error::Renderer(format!(
                    "Unsupported generation role: {other}"
                )));
            }
        };
        let mut suffix = vec![role_token];
        if role == Role::Assistant {
            suffix.extend(self.tokenizer.encode(THINK_PREFILL)?);
        }
        Ok(suffix)
    }

    fn stop(&self) -> StopCondition {
        StopCondition::Tokens(self.stop_tokens().to_vec())
    }

    fn parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        let tokens = restore_think_prefix(tokens, self.think_open, self.think_close);
        self.parse_normalized(&tokens)
    }

    fn has_extension_property(&self) -> bool {
        !self.strip_thinking_from_history
    }

    fn generation_prompt_with(
        &self,
        messages: &[Message],
        role: Role,
        prefill: Option<&str>,
    ) -> Result<ModelInput> {
        build_generation_prompt(self, &reorder_tool_results(messages), role, prefill)
    }

    fn supervised_example_with(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)> {
        build_supervised_example(self, &reorder_tool_results(messages), train_on)
    }

    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        let mut messages = Vec::new();
        if !tools.is_empty() {
            let mut tool_lines = String::new();
            for tool in tools {
                let value = serde_json::to_value(tool).map_err(|e| {
                    Error::Renderer(format!("serializing tool `{}`: {e}", tool.name))
                })?;
                tool_lines.push_str(&python_json(&value, ", ", ": ", false));
                tool_lines.push('\n');
            }
            messages.push(Message::system(tools_system_message(&tool_lines)));
        }
        if !system_prompt.is_empty() {
            messages.push(Message::system(system_prompt));
        }
        Ok(messages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> (String, String) {
        let call = parse_glm_tool_call(raw).unwrap_or_else(|u| panic!("{raw}: {}", u.error));
        (call.name, call.arguments)
    }

    fn err(raw: &str) -> String {
        parse_glm_tool_call(raw).expect_err(raw).error
    }

    /// Expected values printed by the cookbook's `_parse_glm_tool_call`.
    #[test]
    fn glm_tool_calls_parse_like_the_cookbook() {
        assert_eq!(
            ok("<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"),
            ("f".into(), r#"{"a": 1}"#.into())
        );
        assert_eq!(
            ok(
                "<tool_call> f.x-y \n<arg_key> a </arg_key>\n<arg_value> [1, 2] </arg_value>\n</tool_call>"
            ),
            ("f.x-y".into(), r#"{"a": [1, 2]}"#.into())
        );
        assert_eq!(
            ok(
                r#"<tool_call>f<arg_key>a</arg_key><arg_value>hello world</arg_value><arg_key>b</arg_key><arg_value>{"k": 1.0}</arg_value></tool_call>"#
            ),
            (
                "f".into(),
                r#"{"a": "hello world", "b": {"k": 1.0}}"#.into()
            )
        );
        assert_eq!(ok("<tool_call>f</tool_call>"), ("f".into(), "{}".into()));
        // A repeated key keeps its first position and its last value.
        assert_eq!(
            ok(
                r#"<tool_call>f<arg_key>a</arg_key><arg_value>"quoted"</arg_value><arg_key>a</arg_key><arg_value>é</arg_value></tool_call>"#
            ),
            ("f".into(), r#"{"a": "\u00e9"}"#.into())
        );
        assert_eq!(
            err("<tool_call>f junk<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"),
            "Unexpected content between tool call arguments"
        );
        assert_eq!(
            err("<tool_call>f<arg_key> </arg_key><arg_value>1</arg_value></tool_call>"),
            "Empty tool call argument key"
        );
        assert_eq!(
            err("<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>tail</tool_call>"),
            "Unexpected trailing content inside tool call"
        );
        assert_eq!(
            err("<tool_call>{bad</tool_call>"),
            "Malformed GLM tool call"
        );
    }

    #[test]
    fn tool_calls_format_strings_raw_and_the_rest_as_json() {
        let call = ToolCall::new(
            "f",
            r#"{"s": "x y", "n": 2, "l": [1, "é"], "o": {"k": null}}"#,
        );
        assert_eq!(
            format_tool_call(&call).unwrap(),
            "<tool_call>f<arg_key>s</arg_key><arg_value>x y</arg_value>\
             <arg_key>n</arg_key><arg_value>2</arg_value>\
             <arg_key>l</arg_key><arg_value>[1, \"é\"]</arg_value>\
             <arg_key>o</arg_key><arg_value>{\"k\": null}</arg_value></tool_call>"
        );
        assert_eq!(
            format_tool_call(&ToolCall::new("g", "")).unwrap(),
            "<tool_call>g</tool_call>"
        );
        assert!(format_tool_call(&ToolCall::new("g", "[1]")).is_err());
        assert!(format_tool_call(&ToolCall::new("g", "{oops")).is_err());
    }

    #[test]
    fn tool_blocks_are_sorted_only_when_unambiguous() {
        let asked = Message::assistant("").with_tool_calls(vec![
            ToolCall::new("a", "{}").with_id("1"),
            ToolCall::new("b", "{}").with_id("2"),
        ]);
        let r1 = Message::tool_response("1", "a", "one");
        let r2 = Message::tool_response("2", "b", "two");
        let order = |msgs: &[Message]| -> Vec<String> {
            reorder_tool_results(msgs)
                .iter()
                .map(|m| m.text().into_owned())
                .collect()
        };
        let conv = [Message::user("q"), asked.clone(), r2.clone(), r1.clone()];
        assert_eq!(order(&conv), ["q", "", "one", "two"]);
        // A subset of the calls is fine.
        assert_eq!(order(&[asked.clone(), r2.clone()]), ["", "two"]);
        // An unknown id, a missing id or a duplicate keeps the given order.
        let unknown = Message::tool_response("9", "a", "nine");
        assert_eq!(
            order(&[asked.clone(), r2.clone(), unknown]),
            ["", "two", "nine"]
        );
        let mut no_id = r1.clone();
        no_id.tool_call_id = None;
        assert_eq!(
            order(&[asked.clone(), r2.clone(), no_id]),
            ["", "two", "one"]
        );
        assert_eq!(
            order(&[asked.clone(), r2.clone(), r2.clone()]),
            ["", "two", "two"]
        );
        // Not after an assistant message with tool calls: as given.
        assert_eq!(order(&[r2, r1]), ["two", "one"]);
    }

    #[test]
    fn string_content_splits_on_think_tags_like_the_template() {
        let (r, t) =
            split_reasoning_and_text(&Content::from("a<think>b</think>c</think>d")).unwrap();
        assert_eq!((r.as_deref(), t.as_str()), (Some("b"), "d"));
        let (r, t) = split_reasoning_and_text(&Content::from("plain")).unwrap();
        assert_eq!((r, t.as_str()), (None, "plain"));
        assert_eq!(py_strip("\u{1c} x \u{3000}"), "x");
        let image = Content::Parts(vec![ContentPart::Image { image: "u".into() }]);
        assert!(matches!(
            split_reasoning_and_text(&image),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(visible_text(&image), Err(Error::Unsupported(_))));
        let thinking = Content::Parts(vec![ContentPart::thinking("t")]);
        assert!(matches!(visible_text(&thinking), Err(Error::Renderer(_))));
    }
}
