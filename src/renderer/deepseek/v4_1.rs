//! DeepSeek V4.1 (the cookbook's `deepseek_v4_1.py`).

use std::collections::HashMap;
use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

use super::END_OF_SENTENCE;
use crate::error::{Error, Result};
use crate::message::{Content, ContentPart, Message, Role, ToolCall, UnparsedToolCall};
use crate::python::py_strip;
use crate::renderer::base::{
    MessageFormat, RenderContext, RenderedMessage, ToolSpec, build_generation_prompt,
    build_supervised_example, detect_unterminated_tool_block, parse_response_for_stop_token,
    parse_think_blocks, python_json, python_json_dumps, restore_think_prefix, single_token,
    static_regex,
};
use crate::renderer::{ParseTermination, TrainOnWhat};
use crate::tokenizer::Tokenizer;
use crate::types::{ModelInput, StopCondition, TokenId};

/// The system role token (V4.1 only).
pub(crate) const SYSTEM: &str = "<｜System｜>";

const TOOLS_TEMPLATE_HEAD: &str = "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"$TOOL_NAME\">\n<｜DSML｜ parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n";
const TOOLS_TEMPLATE_TAIL: &str = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

const CALLS_OPEN: &str = "<｜DSML｜ calls>";
const CALLS_CLOSE: &str = "</｜DSML｜ calls>";
const DSML: &str = "｜DSML｜";

/// How hard DeepSeek V4.1 thinks: the budget of the system prompt's `Reasoning Effort` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasoningEffort {
    /// Budget 50 (`reasoning_effort='low'`).
    Low,
    /// Budget 75, the HF template's default (`'high'`).
    High,
    /// Budget 100 (`'max'`).
    Max,
}

impl ReasoningEffort {
    /// The budget written into the prompt (1-100).
    pub fn budget(self) -> u32 {
        match self {
            ReasoningEffort::Low => 50,
            ReasoningEffort::High => 75,
            ReasoningEffort::Max => 100,
        }
    }
}

/// The cookbook's DeepSeek V4.1 renderers (`DeepSeekV4_1Renderer` and its low / max /
/// disable-thinking variants): `deepseekv4_1`, `deepseekv4_1_low_reasoning`,
/// `deepseekv4_1_max_reasoning`, `deepseekv4_1_disable_thinking`,
/// `deepseekv4_1_preserve_thinking`.
///
/// `<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (…)\n\n{system}<｜User｜>{question}<｜Assistant｜><think>{reasoning}</think>{answer}<｜end▁of▁sentence｜>`.
/// In thinking mode (a [`ReasoningEffort`]) every prompt opens with `<｜System｜>` and the
/// effort line; in chat mode (`None`) there is no effort line and the assistant header ends
/// in `</think>`. Tool declarations (a `tool_declare` message, see
/// [`conversation_prefix_with_tools`](crate::Renderer::conversation_prefix_with_tools))
/// follow the system text. Tool calls are DSML blocks after the answer, one `parameter` per
/// argument; tool results become `<tool_result>…</tool_result>` blocks of a user turn, in
/// the order of the calls, and consecutive tool and user messages share one user turn.
/// Reasoning before the last user turn is dropped unless tools are declared or
/// [`with_strip_thinking_from_history`](Self::with_strip_thinking_from_history)`(false)`.
///
/// ```
/// use rlvr::renderer::deepseek::{DeepSeekV4_1, ReasoningEffort};
/// use rlvr::{message::Message, Renderer};
/// # fn main() -> rlvr::Result<()> {
/// // A toy tokenizer: DeepSeek's special tokens plus one token per character.
/// let specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜System｜>",
///     "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"];
/// let chars: Vec<String> = " Hi!?ol:\nReasngEft57(r-10,hvmud)".chars().map(String::from).collect();
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
/// let chat = DeepSeekV4_1::new(tokenizer.clone(), None)?;
/// let prompt = chat.generation_prompt(&[Message::user("Hi?")])?;
/// assert_eq!(
///     tokenizer.decode(&prompt.to_tokens())?,
///     "<｜begin▁of▁sentence｜><｜User｜>Hi?<｜Assistant｜></think>"
/// );
///
/// let thinking = DeepSeekV4_1::new(tokenizer.clone(), Some(ReasoningEffort::High))?;
/// let prompt = tokenizer.decode(&thinking.generation_prompt(&[Message::user("Hi?")])?.to_tokens())?;
/// assert!(prompt.starts_with("<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 "));
/// assert!(prompt.ends_with("<｜User｜>Hi?<｜Assistant｜><think>"));
/// let sampled = tokenizer.encode("Hi</think>Hi!<｜end▁of▁sentence｜>")?;
/// let (message, _) = thinking.parse_response(&sampled);
/// assert_eq!(message.thinking().as_deref(), Some("Hi"));
/// assert_eq!(message.text(), "Hi!");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DeepSeekV4_1 {
    tokenizer: Tokenizer,
    reasoning_effort: Option<ReasoningEffort>,
    strip_thinking_from_history: bool,
    bos: Vec<TokenId>,
    end: TokenId,
    /// The `<think>` / `</think>` token ids (thinking mode only).
    think_ids: Option<(TokenId, TokenId)>,
}

impl DeepSeekV4_1 {
    /// Thinking mode with `reasoning_effort`, or chat mode (`None`, the cookbook's
    /// `DeepSeekV4_1DisableThinkingRenderer`), over `tokenizer`; reasoning is dropped from
    /// history as the template does.
    ///
    /// Errors: [`Error::Tokenizer`] when `<｜end▁of▁sentence｜>` (or, in thinking mode,
    /// `<think>` / `</think>`) is not a single token of `tokenizer`.
    pub fn new(tokenizer: Tokenizer, reasoning_effort: Option<ReasoningEffort>) -> Result<Self> {
        let mut r = DeepSeekV4_1 {
            bos: tokenizer.encode(super::BOS)?,
            end: 0,
            think_ids: None,
            reasoning_effort,
            strip_thinking_from_history: true,
            tokenizer,
        };
        r.end = single_token(&r.tokenizer, END_OF_SENTENCE, r.name())?;
        if reasoning_effort.is_some() {
            r.think_ids = Some((
                single_token(&r.tokenizer, "<think>", r.name())?,
                single_token(&r.tokenizer, "</think>", r.name())?,
            ));
        }
        Ok(r)
    }

    /// Whether reasoning before the last user turn is dropped (default `true`, unless tools
    /// are declared); `false` keeps it, giving the extension property for multi-turn RL.
    pub fn with_strip_thinking_from_history(mut self, yes: bool) -> Self {
        self.strip_thinking_from_history = yes;
        self
    }

    /// The reasoning effort; `None` in chat mode.
    pub fn reasoning_effort(&self) -> Option<ReasoningEffort> {
        self.reasoning_effort
    }

    fn thinking(&self) -> bool {
        self.reasoning_effort.is_some()
    }

    fn encode(&self, text: &str) -> Result<Vec<TokenId>> {
        self.tokenizer.encode(text)
    }

    /// `_encode_after`: `prefix + text` encoded as one string, split into (prefix, text)
    /// tokens; a token merged across the boundary goes with the prefix.
    fn encode_after(&self, prefix: &str, text: &str) -> Result<(Vec<TokenId>, Vec<TokenId>)> {
        let mut tokens = self.encode(&format!("{prefix}{text}"))?;
        let prefix_len = prefix.chars().count();
        let mut split = 0;
        while split < tokens.len()
            && self.tokenizer.decode(&tokens[..split])?.chars().count() < prefix_len
        {
            split += 1;
        }
        let rest = tokens.split_off(split);
        Ok((tokens, rest))
    }

    /// `_opening`: text before the first message.
    fn opening(&self, role: Role) -> String {
        match self.reasoning_effort {
            Some(effort) => format!(
                "{SYSTEM}Reasoning Effort: {} (range 1-100, the higher the value, the more \
                 thorough the reasoning)\n\n",
                effort.budget()
            ),
            None if role == Role::System => SYSTEM.to_owned(),
            None => String::new(),
        }
    }

    /// `render_message` of a conversation shaped by [`normalize_messages`];
    /// `drop_through` is the conversation's last user turn when reasoning before it is
    /// dropped (`None` outside a conversation builder, as the cookbook's context variable).
    fn render(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
        drop_through: Option<isize>,
    ) -> Result<RenderedMessage> {
        let role = message.role;
        let opening = if ctx.idx == 0 {
            self.opening(role)
        } else {
            String::new()
        };
        match role {
            Role::System => {
                let prefix = if ctx.idx == 0 {
                    opening
                } else {
                    SYSTEM.to_owned()
                };
                let (header, output) = self.encode_after(&prefix, message.content.as_text()?)?;
                return Ok(RenderedMessage {
                    header,
                    output: if output.is_empty() {
                        vec![]
                    } else {
                        vec![output]
                    },
                    stop_overlap: Vec::new(),
                });
            }
            Role::ToolDeclare => return Ok(RenderedMessage::default()),
            Role::User | Role::Tool => {
                if ctx.prev_message.is_some_and(is_user_turn) {
                    return Ok(RenderedMessage::default());
                }
                let text = self.encode(message.content.as_text()?)?;
                return Ok(RenderedMessage {
                    header: self.encode(&format!("{opening}<｜User｜>"))?,
                    output: if text.is_empty() { vec![] } else { vec![text] },
                    stop_overlap: Vec::new(),
                });
            }
            Role::Assistant => {}
            other => {
                return Err(Error::Renderer(format!(
                    "Unsupported role for DeepSeek V4.1: {other}"
                )));
            }
        }
        let keeps_reasoning = self.thinking() && (ctx.idx as isize) > drop_through.unwrap_or(-1);
        let follows_user_turn = ctx
            .prev_message
            .is_some_and(|p| is_user_turn(p) || (p.role == Role::System && ctx.idx > 1));
        let marker = if keeps_reasoning {
            "<｜Assistant｜><think>"
        } else {
            "<｜Assistant｜></think>"
        };
        let header_text = if follows_user_turn {
            format!("{opening}{marker}")
        } else {
            opening
        };
        let header = if header_text.is_empty() {
            Vec::new()
        } else {
            self.encode(&header_text)?
        };
        let (reasoning, answer) = split_assistant_content(message)?;
        let mut body = if keeps_reasoning {
            format!("{reasoning}</think>{answer}")
        } else {
            answer
        };
        if !message.tool_calls.is_empty() {
            body.push_str(&render_tool_calls(&message.tool_calls));
        }
        let mut output = self.encode(&body)?;
        output.push(self.end);
        Ok(RenderedMessage::new(header, output))
    }

    /// `_conversation`: the normalized conversation and the index through which assistant
    /// messages lose their reasoning (-1: none).
    fn conversation(&self, messages: &[Message]) -> Result<(Vec<Message>, isize)> {
        let normalized = normalize_messages(messages)?;
        let drops = self.strip_thinking_from_history
            && !messages.iter().any(|m| m.role == Role::ToolDeclare);
        let through = if drops {
            drop_reasoning_through(&normalized)
        } else {
            -1
        };
        Ok((normalized, through))
    }

    /// `_parse_tool_calls`: the invokes of one calls block.
    fn parse_tool_calls(block: &str) -> (Vec<ToolCall>, Vec<UnparsedToolCall>) {
        let body = block.strip_prefix("\n\n").unwrap_or(block);
        let body = body.strip_prefix(CALLS_OPEN).unwrap_or(body);
        let body = body.strip_suffix(CALLS_CLOSE).unwrap_or(body);
        let invokes: Vec<regex::Captures<'_>> = invoke_regex().captures_iter(body).collect();
        if invokes.is_empty() || !py_strip(&invoke_regex().replace_all(body, "")).is_empty() {
            return (
                Vec::new(),
                vec![UnparsedToolCall {
                    raw_text: block.to_owned(),
                    error: "Invalid DSML: malformed invoke".into(),
                }],
            );
        }
        let mut calls = Vec::new();
        let mut unparsed = Vec::new();
        for invoke in invokes {
            let raw = invoke.get(0).map_or("", |m| m.as_str());
            let name = invoke.get(1).map_or("", |m| m.as_str());
            let params_text = invoke.get(2).map_or("", |m| m.as_str());
            match parse_invoke(name, params_text) {
                Ok(arguments) => calls.push(ToolCall::new(
                    name,
                    python_json_dumps(&Value::Object(arguments)),
                )),
                Err(e) => unparsed.push(UnparsedToolCall {
                    raw_text: raw.to_owned(),
                    error: format!("Invalid DSML: {e}"),
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

    /// The content part of `_parse_response_content`: the first DSML calls block (anything
    /// after it is malformed), a dangling block or stray DSML marker, then think blocks.
    pub(crate) fn parse_content(mut message: Message) -> Result<Message> {
        let mut content = message.content.as_text()?.to_owned();
        let (calls, mut unparsed) = match calls_block_regex().find(&content) {
            Some(block) => {
                let (calls, mut unparsed) = Self::parse_tool_calls(block.as_str());
                let after = &content[block.end()..];
                if !py_strip(after).is_empty() {
                    unparsed.push(UnparsedToolCall {
                        raw_text: after.to_owned(),
                        error: "Invalid DSML: output after calls block".into(),
                    });
                }
                content.truncate(block.start());
                (calls, unparsed)
            }
            None => (Vec::new(), Vec::new()),
        };
        let dangling =
            detect_unterminated_tool_block(&content, CALLS_OPEN, CALLS_CLOSE).or_else(|| {
                content.contains(DSML).then(|| UnparsedToolCall {
                    raw_text: content.clone(),
                    error: "Invalid DSML: marker outside a calls block".into(),
                })
            });
        unparsed.extend(dangling);
        message.tool_calls = calls;
        message.unparsed_tool_calls = unparsed;
        message.content = match parse_think_blocks(&content) {
            Some(parts) => Content::Parts(parts),
            None => Content::Text(content),
        };
        Ok(message)
    }
}

/// One invoke's parameters as a JSON object, or why they are malformed.
fn parse_invoke(
    name: &str,
    params_text: &str,
) -> std::result::Result<serde_json::Map<String, Value>, String> {
    if py_strip(name).is_empty() {
        return Err("empty function name".into());
    }
    if !py_strip(&param_regex().replace_all(params_text, "")).is_empty() {
        return Err("text outside parameters".into());
    }
    let mut arguments = serde_json::Map::new();
    for param in param_regex().captures_iter(params_text) {
        let key = param.get(1).map_or("", |m| m.as_str());
        let is_string = param.get(2).map_or("", |m| m.as_str()) == "true";
        let value = param.get(3).map_or("", |m| m.as_str());
        if py_strip(key).is_empty() {
            return Err("empty parameter name".into());
        }
        if arguments.contains_key(key) {
            return Err(format!("duplicate parameter '{key}'"));
        }
        let value = if is_string {
            Value::String(value.to_owned())
        } else {
            serde_json::from_str(value).map_err(|e| e.to_string())?
        };
        arguments.insert(key.to_owned(), value);
    }
    Ok(arguments)
}

fn is_user_turn(message: &Message) -> bool {
    matches!(message.role, Role::User | Role::Tool)
}

/// `_split_assistant_content`: (reasoning, answer); reasoning is empty when there is none.
fn split_assistant_content(message: &Message) -> Result<(String, String)> {
    match &message.content {
        Content::Text(s) => Ok((String::new(), s.clone())),
        Content::Parts(parts) => {
            let (mut reasoning, mut text) = (String::new(), String::new());
            for part in parts {
                match part {
                    ContentPart::Thinking { thinking } => reasoning.push_str(thinking),
                    ContentPart::Text { text: t } => text.push_str(t),
                    other => {
                        return Err(Error::Unsupported(format!(
                            "DeepSeek V4.1 renderer does not support '{}' content parts",
                            other.kind()
                        )));
                    }
                }
            }
            Ok((reasoning, text))
        }
    }
}

/// `_arguments_dict`: the arguments as an object (double-encoded JSON tolerated), or
/// `{"arguments": <the text>}` when they are not one.
fn arguments_dict(arguments: &str) -> serde_json::Map<String, Value> {
    let mut parsed = Value::String(arguments.to_owned());
    for _ in 0..2 {
        let Value::String(s) = &parsed else { break };
        match serde_json::from_str::<Value>(s) {
            Ok(v) => parsed = v,
            Err(_) => break,
        }
    }
    match parsed {
        Value::Object(map) => map,
        _ => {
            let mut map = serde_json::Map::new();
            map.insert("arguments".into(), Value::String(arguments.to_owned()));
            map
        }
    }
}

/// `_render_tool_calls`: the DSML calls block, with its leading blank line.
fn render_tool_calls(calls: &[ToolCall]) -> String {
    let invokes: Vec<String> = calls
        .iter()
        .map(|call| {
            let params: Vec<String> = arguments_dict(&call.arguments)
                .iter()
                .map(|(key, value)| match value {
                    Value::String(s) => format!(
                        "<｜DSML｜ parameter name=\"{key}\" string=\"true\">{s}</｜DSML｜ parameter>"
                    ),
                    other => format!(
                        "<｜DSML｜ parameter name=\"{key}\" string=\"false\">{}</｜DSML｜ parameter>",
                        python_json(other, ", ", ": ", false)
                    ),
                })
                .collect();
            format!(
                "<｜DSML｜ invoke name=\"{}\">\n{}\n</｜DSML｜ invoke>",
                call.name,
                params.join("\n")
            )
        })
        .collect();
    format!("\n\n{CALLS_OPEN}\n{}\n{CALLS_CLOSE}", invokes.join("\n"))
}

/// `_tool_declare_specs` + `_render_tools`: the tools section of the system prompt.
fn render_tools(declaration: &Message) -> Result<String> {
    let bad = |what: &str| Error::Renderer(format!("DeepSeek V4.1 tool declaration: {what}"));
    let payload: Value = serde_json::from_str(declaration.content.as_text()?)
        .map_err(|e| bad(&format!("invalid JSON: {e}")))?;
    let Value::Array(tools) = payload else {
        return Err(bad("expected a JSON list of tools"));
    };
    let schemas = tools
        .iter()
        .map(|tool| {
            tool.get("function")
                .map(|spec| python_json(spec, ", ", ": ", false))
                .ok_or_else(|| bad("a tool without `function`"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(format!(
        "{TOOLS_TEMPLATE_HEAD}{}{TOOLS_TEMPLATE_TAIL}",
        schemas.join("\n")
    ))
}

/// `_sort_tool_results`: a user turn's tool results in call order (stable; an unknown id
/// sorts as call 0), in the slots tool messages hold.
fn sort_tool_results<'a>(
    turn: &'a [Message],
    call_order: &HashMap<String, usize>,
) -> Vec<&'a Message> {
    let mut tools: Vec<&Message> = turn.iter().filter(|m| m.role == Role::Tool).collect();
    tools.sort_by_key(|m| {
        call_order
            .get(m.tool_call_id.as_deref().unwrap_or(""))
            .copied()
            .unwrap_or(0)
    });
    let mut tools = tools.into_iter();
    turn.iter()
        .map(|m| {
            if m.role == Role::Tool {
                tools.next().unwrap_or(m)
            } else {
                m
            }
        })
        .collect()
}

/// `_normalize_messages`: the conversation reshaped into the template's turns, every index
/// kept. The tool declaration is folded into the leading system message (or becomes one);
/// consecutive tool and user messages share one user turn, whose first message carries the
/// whole turn's text (tool results sorted into call order, joined by `\n\n`) while the rest
/// render nothing.
fn normalize_messages(messages: &[Message]) -> Result<Vec<Message>> {
    let mut result = messages.to_vec();
    for idx in 0..result.len() {
        if result[idx].role != Role::ToolDeclare {
            continue;
        }
        let tools_text = render_tools(&result[idx])?;
        if idx == 0 {
            result[0].role = Role::System;
            result[0].content = Content::Text(format!("\n\n{tools_text}"));
        } else if idx == 1 && result[0].role == Role::System {
            let system_text = result[0].content.as_text()?.to_owned();
            result[0].content = Content::Text(format!("{system_text}\n\n{tools_text}"));
            result[1].content = Content::Text(String::new());
        } else {
            return Err(Error::Renderer(
                "DeepSeek V4.1 tool declarations must come first or right after the first \
                 system message; use create_conversation_prefix_with_tools"
                    .into(),
            ));
        }
    }

    let mut call_order: HashMap<String, usize> = HashMap::new();
    let mut idx = 0;
    while idx < result.len() {
        if !result[idx].tool_calls.is_empty() {
            call_order = result[idx]
                .tool_calls
                .iter()
                .enumerate()
                .filter_map(|(order, tc)| {
                    tc.id
                        .as_deref()
                        .filter(|id| !id.is_empty())
                        .map(|id| (id.to_owned(), order))
                })
                .collect();
        }
        if !is_user_turn(&result[idx]) {
            idx += 1;
            continue;
        }
        let mut end = idx;
        while end + 1 < result.len() && is_user_turn(&result[end + 1]) {
            end += 1;
        }
        let blocks = sort_tool_results(&result[idx..=end], &call_order)
            .into_iter()
            .map(|m| {
                let text = m.content.as_text()?;
                Ok(if m.role == Role::Tool {
                    format!("<tool_result>{text}</tool_result>")
                } else {
                    text.to_owned()
                })
            })
            .collect::<Result<Vec<String>>>()?;
        result[idx].content = Content::Text(blocks.join("\n\n"));
        for m in &mut result[idx + 1..=end] {
            m.content = Content::Text(String::new());
        }
        idx = end + 1;
    }
    Ok(result)
}

/// `_drop_reasoning_through`: the template's last user turn (user and tool messages, and
/// system messages after the first); -1 when there is none.
fn drop_reasoning_through(messages: &[Message]) -> isize {
    messages
        .iter()
        .enumerate()
        .filter(|(idx, m)| is_user_turn(m) || (m.role == Role::System && *idx > 0))
        .map(|(idx, _)| idx as isize)
        .max()
        .unwrap_or(-1)
}

/// `_last_assistant_turn_start_index`: a later system message counts as a user turn.
fn turn_start(messages: &[Message]) -> usize {
    messages
        .iter()
        .enumerate()
        .filter(|(idx, m)| m.role == Role::User || (m.role == Role::System && *idx > 0))
        .map(|(idx, _)| idx + 1)
        .max()
        .unwrap_or(0)
}

fn calls_block_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(&RE, r"(?s)(?:\n\n)?<｜DSML｜ calls>.*?</｜DSML｜ calls>")
}

fn invoke_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(
        &RE,
        r#"(?s)<｜DSML｜ invoke name="(.*?)">\n(.*?)</｜DSML｜ invoke>"#,
    )
}

fn param_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(
        &RE,
        r#"(?s)<｜DSML｜ parameter name="(.*?)" string="(true|false)">(.*?)</｜DSML｜ parameter>"#,
    )
}

/// The renderer inside a conversation builder: the conversation is normalized and the
/// drop-reasoning index fixed (the cookbook's context variable), so the base class's
/// re-entry (the generation prompt `_train_after_the_generation_prompt` builds) renders a
/// prefix of the same normalized conversation the same way.
struct InConversation<'a> {
    renderer: &'a DeepSeekV4_1,
    drop_through: isize,
}

impl MessageFormat for InConversation<'_> {
    fn name(&self) -> &str {
        self.renderer.name()
    }
    fn tokenizer(&self) -> &Tokenizer {
        &self.renderer.tokenizer
    }
    fn bos_tokens(&self) -> Vec<TokenId> {
        self.renderer.bos.clone()
    }
    fn render_message(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        self.renderer.render(message, ctx, Some(self.drop_through))
    }
    fn stop(&self) -> StopCondition {
        self.renderer.stop()
    }
    fn parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        MessageFormat::parse_response(self.renderer, tokens)
    }
    fn last_assistant_turn_start_index(&self, messages: &[Message]) -> usize {
        turn_start(messages)
    }
    fn has_extension_property(&self) -> bool {
        MessageFormat::has_extension_property(self.renderer)
    }
}

impl MessageFormat for DeepSeekV4_1 {
    fn name(&self) -> &str {
        match (self.reasoning_effort, self.strip_thinking_from_history) {
            (None, _) => "deepseekv4_1_disable_thinking",
            (Some(ReasoningEffort::High), false) => "deepseekv4_1_preserve_thinking",
            (Some(ReasoningEffort::High), true) => "deepseekv4_1",
            (Some(ReasoningEffort::Low), _) => "deepseekv4_1_low_reasoning",
            (Some(ReasoningEffort::Max), _) => "deepseekv4_1_max_reasoning",
        }
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn bos_tokens(&self) -> Vec<TokenId> {
        self.bos.clone()
    }

    /// One message on its own (outside a conversation builder every assistant message
    /// keeps its reasoning in thinking mode, as in the cookbook).
    fn render_message(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        self.render(message, ctx, None)
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

    fn last_assistant_turn_start_index(&self, messages: &[Message]) -> usize {
        turn_start(messages)
    }

    fn has_extension_property(&self) -> bool {
        !(self.thinking() && self.strip_thinking_from_history)
    }

    fn generation_prompt_with(
        &self,
        messages: &[Message],
        role: Role,
        prefill: Option<&str>,
    ) -> Result<ModelInput> {
        let (normalized, drop_through) = self.conversation(messages)?;
        let inner = InConversation {
            renderer: self,
            drop_through,
        };
        build_generation_prompt(&inner, &normalized, role, prefill)
    }

    /// Tool and user messages that share a user turn are trained or masked together, as
    /// one message.
    fn supervised_example_with(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)> {
        let (normalized, drop_through) = self.conversation(messages)?;
        let inner = InConversation {
            renderer: self,
            drop_through,
        };
        build_supervised_example(&inner, &normalized, train_on)
    }

    /// A system message (when `system_prompt` is not empty) and a `tool_declare` message
    /// holding the tools as JSON (`[{"type": "function", "function": {…}}]`); the tools
    /// render after the system prompt in the same `<｜System｜>` turn, and declaring them
    /// keeps reasoning in history.
    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        let mut messages = Vec::new();
        if !system_prompt.is_empty() {
            messages.push(Message::system(system_prompt));
        }
        if !tools.is_empty() {
            let payload: Vec<Value> = tools
                .iter()
                .map(|t| {
                    serde_json::json!({
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.parameters,
                        }
                    })
                })
                .collect();
            messages.push(Message::new(
                Role::ToolDeclare,
                python_json_dumps(&Value::Array(payload)),
            ));
        }
        Ok(messages)
    }
}
