//! Renderers of Moonshot AI's Kimi family: K2 (Thinking), K2.5 and K2.6 (the cookbook's
//! `kimi_k2.py`, `kimi_k25.py`, `kimi_k26.py`).
//!
//! One renderer, [`KimiK2Renderer`], configured by [`KimiK2Options`], covers every name, the
//! way the cookbook's classes subclass each other:
//!
//! | name | cookbook class | generation prefill | tool declarations | history thinking |
//! |---|---|---|---|---|
//! | `kimi_k2` | `KimiK2Renderer` | — | JSON | stripped |
//! | `kimi_k25`, `kimi_k26` | `KimiK25Renderer` | `<think>` | TypeScript | stripped |
//! | `kimi_k25_disable_thinking`, `kimi_k26_disable_thinking` | `KimiK25DisableThinkingRenderer` | `<think></think>` | TypeScript | stripped |
//! | `kimi_k26_preserve_thinking` | `KimiK26PreserveThinkingRenderer` | `<think>` | TypeScript | kept |
//!
//! The `kimi_k31_pro_*` names are backed by an external package in the cookbook and are not
//! rendered here (the registry answers [`Error::Unsupported`]).

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use regex::Regex;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::renderer::base::{
    build_generation_prompt, build_supervised_example, detect_unterminated_tool_block,
    parse_response_for_stop_token, parse_think_blocks, python_json, restore_think_prefix,
    single_token, static_regex,
};
use crate::renderer::{
    MessageFormat, ParseTermination, RenderContext, RenderedMessage, Renderer, ToolSpec,
    TrainOnWhat,
};
use crate::tokenizer::Tokenizer;
use crate::types::{
    Content, ContentPart, Message, ModelInput, Role, StopCondition, TokenId, ToolCall,
    UnparsedToolCall,
};

pub(crate) mod tool_declaration_ts;

use crate::python::{PY_SPACE_CLASS, json_loads_check, py_strip};
pub(crate) use tool_declaration_ts::encode_tools_to_typescript_style;

/// The system prompt Kimi's chat template inserts when a conversation has none.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are Kimi, an AI assistant created by Moonshot AI.";

/// The Kimi generation a renderer targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KimiVersion {
    /// Kimi K2 (Thinking): no generation prefill, tools declared as sorted compact JSON.
    K2,
    /// Kimi K2.5 / K2.6: the generation prompt opens a think block (or closes it right away
    /// with thinking disabled), tools declared in TypeScript style, multi-part content
    /// rendered part by part.
    K25,
}

/// How a [`KimiK2Renderer`] renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KimiK2Options {
    /// K2 or K2.5/K2.6.
    pub version: KimiVersion,
    /// K2.5/K2.6 only: prefill `<think></think>` instead of `<think>` (the cookbook's
    /// `KimiK25DisableThinkingRenderer`). Ignored for K2, which has no prefill.
    pub disable_thinking: bool,
    /// Replace the reasoning of assistant messages before the current turn with an empty
    /// `<think></think>` (the default); `false` keeps it (K2.6's `preserve_thinking`).
    pub strip_thinking_from_history: bool,
}

impl KimiK2Options {
    /// `kimi_k2`.
    pub fn k2() -> Self {
        KimiK2Options {
            version: KimiVersion::K2,
            disable_thinking: false,
            strip_thinking_from_history: true,
        }
    }
    /// `kimi_k25` (= `kimi_k26`): thinking on.
    pub fn k25() -> Self {
        KimiK2Options {
            version: KimiVersion::K25,
            ..Self::k2()
        }
    }
    /// `kimi_k25_disable_thinking` (= `kimi_k26_disable_thinking`).
    pub fn k25_disable_thinking() -> Self {
        KimiK2Options {
            disable_thinking: true,
            ..Self::k25()
        }
    }
    /// `kimi_k26_preserve_thinking`: thinking on and kept in history.
    pub fn k26_preserve_thinking() -> Self {
        KimiK2Options {
            strip_thinking_from_history: false,
            ..Self::k25()
        }
    }

    /// The options of a registry name of this family; `None` for other names.
    pub fn by_name(name: &str) -> Option<Self> {
        Some(match name {
            "kimi_k2" => Self::k2(),
            "kimi_k25" | "kimi_k26" => Self::k25(),
            "kimi_k25_disable_thinking" | "kimi_k26_disable_thinking" => {
                Self::k25_disable_thinking()
            }
            "kimi_k26_preserve_thinking" => Self::k26_preserve_thinking(),
            _ => return None,
        })
    }

    /// The registry name these options correspond to (K2.5 names for K2.5/K2.6 without
    /// preserved thinking).
    pub fn canonical_name(&self) -> &'static str {
        match (
            self.version,
            self.disable_thinking,
            self.strip_thinking_from_history,
        ) {
            (KimiVersion::K2, _, _) => "kimi_k2",
            (KimiVersion::K25, false, true) => "kimi_k25",
            (KimiVersion::K25, true, _) => "kimi_k25_disable_thinking",
            (KimiVersion::K25, false, false) => "kimi_k26_preserve_thinking",
        }
    }

    fn is_k25(&self) -> bool {
        self.version == KimiVersion::K25
    }

    fn disables_thinking(&self) -> bool {
        self.is_k25() && self.disable_thinking
    }
}

impl Default for KimiK2Options {
    fn default() -> Self {
        Self::k2()
    }
}

/// The cookbook's Kimi renderers (`KimiK2Renderer` and its K2.5 / K2.6 subclasses).
///
/// ```text
/// <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>
/// <|im_user|>user<|im_middle|>What can you help me with?<|im_end|>
/// <|im_assistant|>assistant<|im_middle|><think>reasoning</think>I can help you with...<|im_end|>
/// ```
///
/// - A conversation without a system message gets [`DEFAULT_SYSTEM_PROMPT`] (after a leading
///   `tool_declare` message), in generation prompts and supervised examples alike.
/// - Assistant messages always start with a think block; reasoning is kept from the turn being
///   produced on (which starts after the last assistant message without tool calls), and in
///   history too with `strip_thinking_from_history: false`; otherwise it is `<think></think>`.
/// - Tool calls: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
///   <|tool_call_argument_begin|>{…}<|tool_call_end|>…<|tool_calls_section_end|>` (a call's
///   own id when it has one); tool results are `<|im_system|>NAME<|im_middle|>## Return of ID\n…`.
/// - Sampling stops at `<|im_end|>`. K2.5/K2.6 prefill `<think>` (thinking) or
///   `<think></think>` (disabled) and [`parse_response`](Renderer::parse_response) puts the
///   prefilled `<think>` back.
/// - Images are not rendered ([`Error::Unsupported`]).
///
/// ```
/// use rlvr::renderer::kimi::{KimiK2Options, KimiK2Renderer};
/// use rlvr::{message::Message, Renderer};
/// # fn main() -> rlvr::Result<()> {
/// // A toy tokenizer: Kimi's special tokens plus one token per character.
/// let specials = ["<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
///                 "<|im_end|>", "<think>", "</think>"];
/// let chars: Vec<String> = (' '..='~').map(String::from).collect();
/// let vocab: serde_json::Map<String, serde_json::Value> =
///     chars.iter().enumerate().map(|(i, c)| (c.clone(), i.into())).collect();
/// let added: Vec<serde_json::Value> = specials.iter().enumerate().map(|(i, s)| serde_json::json!({
///     "id": chars.len() + i, "content": s, "single_word": false, "lstrip": false,
///     "rstrip": false, "normalized": false, "special": true,
/// })).collect();
/// let json = serde_json::json!({
///     "version": "1.0", "added_tokens": added, "normalizer": null, "pre_tokenizer": null,
///     "post_processor": null, "decoder": {"type": "Fuse"},
///     "model": {"type": "BPE", "vocab": vocab, "merges": [], "unk_token": " "},
/// });
/// let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(json.to_string().as_bytes())?;
///
/// let k25 = KimiK2Renderer::new(tokenizer.clone(), KimiK2Options::k25())?;
/// let prompt = k25.generation_prompt(&[Message::user("Hi")])?;
/// assert_eq!(
///     tokenizer.decode(&prompt.to_tokens())?,
///     "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.\
///      <|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>\
///      <|im_assistant|>assistant<|im_middle|><think>"
/// );
/// // The same renderer by name.
/// let by_name = rlvr::renderer::by_name("kimi_k26", tokenizer.clone())?;
/// assert_eq!(by_name.generation_prompt(&[Message::user("Hi")])?, prompt);
///
/// // The sampled continuation (after the prefilled <think>) parses into thinking + text.
/// let sampled = tokenizer.encode("Easy.</think>Hello!<|im_end|>")?;
/// let (message, _) = k25.parse_response(&sampled);
/// assert_eq!(message.thinking().as_deref(), Some("Easy."));
/// assert_eq!(message.text(), "Hello!");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct KimiK2Renderer {
    name: String,
    tokenizer: Tokenizer,
    options: KimiK2Options,
    im_end: TokenId,
    /// `<think>` / `</think>` (K2.5 only).
    think_tokens: Option<(TokenId, TokenId)>,
}

impl KimiK2Renderer {
    /// A renderer over `tokenizer`, named after its options
    /// ([`KimiK2Options::canonical_name`]).
    ///
    /// Errors: [`Error::Tokenizer`] when `<|im_end|>` (and for K2.5 `<think>`, `</think>`)
    /// is not a single token.
    pub fn new(tokenizer: Tokenizer, options: KimiK2Options) -> Result<Self> {
        Self::named(options.canonical_name(), tokenizer, options)
    }

    /// A renderer reporting `name` as its name.
    fn named(name: &str, tokenizer: Tokenizer, options: KimiK2Options) -> Result<Self> {
        let im_end = single_token(&tokenizer, "<|im_end|>", name)?;
        let think_tokens = if options.is_k25() {
            Some((
                single_token(&tokenizer, "<think>", name)?,
                single_token(&tokenizer, "</think>", name)?,
            ))
        } else {
            None
        };
        Ok(KimiK2Renderer {
            name: name.to_owned(),
            tokenizer,
            options,
            im_end,
            think_tokens,
        })
    }

    /// The options.
    pub fn options(&self) -> &KimiK2Options {
        &self.options
    }

    /// The conversation with [`DEFAULT_SYSTEM_PROMPT`] inserted when it has no system message:
    /// first, or right after a leading `tool_declare` message (the HF template's behavior).
    pub fn ensure_system_message<'a>(&self, messages: &'a [Message]) -> Cow<'a, [Message]> {
        let default_system = || Message::system(DEFAULT_SYSTEM_PROMPT);
        match messages.first().map(|m| m.role) {
            None => Cow::Owned(vec![default_system()]),
            Some(Role::ToolDeclare) => {
                if messages.get(1).is_some_and(|m| m.role == Role::System) {
                    Cow::Borrowed(messages)
                } else {
                    let mut out = Vec::with_capacity(messages.len() + 1);
                    out.push(messages[0].clone());
                    out.push(default_system());
                    out.extend_from_slice(&messages[1..]);
                    Cow::Owned(out)
                }
            }
            Some(Role::System) => Cow::Borrowed(messages),
            Some(_) => {
                let mut out = Vec::with_capacity(messages.len() + 1);
                out.push(default_system());
                out.extend_from_slice(messages);
                Cow::Owned(out)
            }
        }
    }

    /// The cookbook's `build_supervised_examples` for Kimi: one example for
    /// [`TrainOnWhat::LastAssistantMessage`] / [`TrainOnWhat::LastAssistantTurn`]; otherwise
    /// one per user turn (each conversation cut before the next user message), trained on its
    /// last turn for [`TrainOnWhat::AllAssistantMessages`] and with `train_on` as given for
    /// the other modes.
    pub fn supervised_examples(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<Vec<(ModelInput, Vec<f32>)>> {
        if matches!(
            train_on,
            TrainOnWhat::LastAssistantMessage | TrainOnWhat::LastAssistantTurn
        ) {
            return Ok(vec![self.supervised_example_with(messages, train_on)?]);
        }
        if train_on != TrainOnWhat::AllAssistantMessages {
            tracing::warn!(
                renderer = self.name.as_str(),
                train_on = train_on.as_str(),
                "the renderer lacks the extension property: the same train_on is applied to \
                 every turn, which may not be what you want"
            );
        }
        let user_idxs: Vec<usize> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Role::User)
            .map(|(i, _)| i)
            .collect();
        let ends = user_idxs
            .iter()
            .skip(1)
            .copied()
            .chain(std::iter::once(messages.len()));
        let mode = if train_on == TrainOnWhat::AllAssistantMessages {
            TrainOnWhat::LastAssistantTurn
        } else {
            train_on
        };
        ends.map(|end| self.supervised_example_with(&messages[..end], mode))
            .collect()
    }

    fn render_header(&self, message: &Message) -> String {
        let role = message.role;
        match role {
            Role::User => format!("<|im_user|>{role}<|im_middle|>"),
            Role::Assistant => format!("<|im_assistant|>{role}<|im_middle|>"),
            Role::Tool => {
                let role_name = match message.name.as_deref() {
                    Some(n) if !n.is_empty() => n,
                    _ => {
                        tracing::warn!(
                            "Tool message missing 'name' field. Using 'tool' as fallback. \
                             Consider setting 'name' to match the tool function name for \
                             better context."
                        );
                        "tool"
                    }
                };
                let tool_call_id = message.tool_call_id.as_deref().unwrap_or("");
                if tool_call_id.is_empty() {
                    tracing::warn!(
                        "Tool message missing 'tool_call_id' field. KimiK2Renderer requires \
                         'tool_call_id' to render tool results correctly."
                    );
                }
                format!("<|im_system|>{role_name}<|im_middle|>## Return of {tool_call_id}\n")
            }
            // system, tool_declare and any other role use the system token.
            _ => format!("<|im_system|>{role}<|im_middle|>"),
        }
    }

    fn render_assistant(&self, message: &Message, ctx: &RenderContext<'_>) -> Result<Vec<TokenId>> {
        let parts = message.content.parts();
        let mut thinking = String::new();
        let mut text = String::new();
        for p in parts.iter() {
            match p {
                ContentPart::Thinking { thinking: t } => thinking.push_str(t),
                ContentPart::Text { text: t } => text.push_str(t),
                // The cookbook ignores other parts of an assistant message.
                _ => {}
            }
        }
        let keep = ctx.in_last_assistant_turn || !self.options.strip_thinking_from_history;
        let mut out = if keep && !thinking.is_empty() {
            format!("<think>{thinking}</think>")
        } else {
            "<think></think>".to_owned()
        };
        out.push_str(&text);
        if !message.tool_calls.is_empty() {
            out.push_str("<|tool_calls_section_begin|>");
            for (idx, call) in message.tool_calls.iter().enumerate() {
                let id = match call.id.as_deref() {
                    Some(id) if !id.is_empty() => id.to_owned(),
                    _ => format!("functions.{}:{idx}", call.name),
                };
                out.push_str(&format!(
                    "<|tool_call_begin|>{id}<|tool_call_argument_begin|>{}<|tool_call_end|>",
                    call.arguments
                ));
            }
            out.push_str("<|tool_calls_section_end|>");
        }
        out.push_str("<|im_end|>");
        self.tokenizer.encode(&out)
    }

    /// Content of several parts (not one text part) of a non-assistant message, `<|im_end|>`
    /// appended: K2 does not render it; K2.5 encodes each text part on its own.
    fn render_multipart(&self, parts: &[ContentPart]) -> Result<Vec<Vec<TokenId>>> {
        if !self.options.is_k25() {
            return Err(Error::Unsupported(
                "Multipart/Image content encoding is not supported for Kimi K2 renderer".into(),
            ));
        }
        let mut chunks = Vec::with_capacity(parts.len() + 1);
        for part in parts {
            match part {
                ContentPart::Text { text } => chunks.push(self.tokenizer.encode(text)?),
                ContentPart::Image { .. } => {
                    return Err(Error::Unsupported(format!(
                        "renderer `{}` does not render image parts",
                        self.name
                    )));
                }
                other => {
                    return Err(Error::Renderer(format!(
                        "Unsupported content type: {}",
                        other.kind()
                    )));
                }
            }
        }
        chunks.push(self.tokenizer.encode("<|im_end|>")?);
        Ok(chunks)
    }

    /// The messages declaring `tools` (K2: sorted compact JSON of the OpenAI tool list; K2.5:
    /// TypeScript style), then the system prompt (the default one when empty).
    fn tools_prefix(&self, tools: &[ToolSpec], system_prompt: &str) -> Result<Vec<Message>> {
        let mut messages = Vec::new();
        if !tools.is_empty() {
            let payload = tools
                .iter()
                .map(|t| {
                    let function = serde_json::to_value(t)
                        .map_err(|e| Error::Renderer(format!("tool `{}` as JSON: {e}", t.name)))?;
                    Ok(serde_json::json!({"type": "function", "function": function}))
                })
                .collect::<Result<Vec<Value>>>()?;
            let declaration = if self.options.is_k25() {
                encode_tools_to_typescript_style(&payload)?
            } else {
                python_json(&sort_keys(&Value::Array(payload)), ",", ":", true)
            };
            messages.push(Message::new(Role::ToolDeclare, declaration));
        }
        let system = if system_prompt.is_empty() {
            DEFAULT_SYSTEM_PROMPT
        } else {
            system_prompt
        };
        messages.push(Message::system(system));
        Ok(messages)
    }
}

/// `json.dumps(…, sort_keys=True)`'s key order, applied recursively.
fn sort_keys(v: &Value) -> Value {
    match v {
        Value::Array(a) => Value::Array(a.iter().map(sort_keys).collect()),
        Value::Object(o) => {
            let mut entries: Vec<(&String, &Value)> = o.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sort_keys(v)))
                    .collect(),
            )
        }
        other => other.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// Tool-call parsing
// ---------------------------------------------------------------------------------------------

fn tool_calls_section_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(
        &RE,
        r"(?s)<\|tool_calls_section_begin\|>(.*?)<\|tool_calls_section_end\|>|<\|tool_call_section_begin\|>(.*?)<\|tool_call_section_end\|>",
    )
}

fn tool_call_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        let s = PY_SPACE_CLASS;
        Regex::new(&format!(
            r"(?s)<\|tool_call_begin\|>{s}*([^<]+:\d+){s}*<\|tool_call_argument_begin\|>{s}*(.*?){s}*<\|tool_call_end\|>"
        ))
        .unwrap_or_else(|e| panic!("static regex: {e}"))
    })
}

/// The text before the first tool-calls section, and the section's inside (either
/// spelling); the text after the section is dropped, as in the cookbook.
fn split_tool_calls_section(content: &str) -> (&str, Option<&str>) {
    match tool_calls_section_regex().captures(content) {
        None => (content, None),
        Some(caps) => {
            let whole = caps.get(0).map_or(0..0, |m| m.range());
            let section = caps
                .get(1)
                .or_else(|| caps.get(2))
                .map_or("", |m| m.as_str());
            (&content[..whole.start], Some(section))
        }
    }
}

/// `functions.get_weather:0` -> `get_weather`.
fn extract_tool_name(tool_id: &str) -> &str {
    let name = tool_id.split(':').next().unwrap_or("");
    match name.split_once('.') {
        Some((_, rest)) => rest,
        None => name,
    }
}

fn parse_tool_calls_section(section: &str) -> (Vec<ToolCall>, Vec<UnparsedToolCall>) {
    let mut calls = Vec::new();
    let mut unparsed = Vec::new();
    for caps in tool_call_regex().captures_iter(section) {
        let raw = caps.get(0).map_or("", |m| m.as_str());
        let tool_id = py_strip(caps.get(1).map_or("", |m| m.as_str()));
        let args = py_strip(caps.get(2).map_or("", |m| m.as_str()));
        match json_loads_check(args) {
            Ok(()) => calls.push(ToolCall {
                id: (!tool_id.is_empty()).then(|| tool_id.to_owned()),
                name: extract_tool_name(tool_id).to_owned(),
                arguments: args.to_owned(),
            }),
            Err(e) => unparsed.push(UnparsedToolCall {
                raw_text: raw.to_owned(),
                error: format!("Invalid JSON: {e}"),
            }),
        }
    }
    (calls, unparsed)
}

/// A tool-calls section or a call opened and never closed.
fn detect_dangling_tool_block(content: &str) -> Option<UnparsedToolCall> {
    [
        ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
        ("<|tool_call_section_begin|>", "<|tool_call_section_end|>"),
        ("<|tool_call_begin|>", "<|tool_call_end|>"),
    ]
    .into_iter()
    .find_map(|(open, close)| detect_unterminated_tool_block(content, open, close))
}

impl MessageFormat for KimiK2Renderer {
    fn name(&self) -> &str {
        &self.name
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn render_message(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        let header = self.tokenizer.encode(&self.render_header(message))?;
        let output = if message.role == Role::Assistant {
            vec![self.render_assistant(message, ctx)?]
        } else {
            match (&message.content, message.content.as_text()) {
                (_, Ok(text)) => vec![self.tokenizer.encode(&format!("{text}<|im_end|>"))?],
                (Content::Parts(parts), Err(_)) => self.render_multipart(parts)?,
                (Content::Text(_), Err(e)) => return Err(e),
            }
        };
        Ok(RenderedMessage {
            header,
            output,
            stop_overlap: Vec::new(),
        })
    }

    fn stop(&self) -> StopCondition {
        StopCondition::Tokens(vec![self.im_end])
    }

    fn parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        // K2.5: put back the `<think>` the generation prompt prefilled.
        let tokens = match self.think_tokens {
            Some((open, close)) => restore_think_prefix(tokens, open, close),
            None => Cow::Borrowed(tokens),
        };
        let (mut message, termination) =
            parse_response_for_stop_token(&tokens, &self.tokenizer, self.im_end)?;
        if !termination.is_clean() {
            return Ok((message, termination));
        }
        let content = message.content.text().into_owned();
        let (text, section) = split_tool_calls_section(&content);
        if let Some(section) = section {
            let (calls, unparsed) = parse_tool_calls_section(section);
            message.tool_calls = calls;
            message.unparsed_tool_calls = unparsed;
        }
        if let Some(dangling) = detect_dangling_tool_block(&content) {
            message.unparsed_tool_calls.push(dangling);
        }
        message.content = match parse_think_blocks(text) {
            Some(parts) => Content::Parts(parts),
            None => Content::Text(text.to_owned()),
        };
        Ok((message, termination))
    }

    fn last_assistant_turn_start_index(&self, messages: &[Message]) -> usize {
        messages
            .iter()
            .rposition(|m| m.role == Role::Assistant && m.tool_calls.is_empty())
            .map_or(0, |i| i + 1)
    }

    fn disables_thinking(&self) -> bool {
        self.options.disables_thinking()
    }

    fn generation_prompt_with(
        &self,
        messages: &[Message],
        role: Role,
        prefill: Option<&str>,
    ) -> Result<ModelInput> {
        let messages = self.ensure_system_message(messages);
        let prefill: Option<Cow<'_, str>> = if !self.options.is_k25() {
            prefill.map(Cow::Borrowed)
        } else {
            let open = if self.options.disable_thinking {
                "<think></think>"
            } else {
                "<think>"
            };
            Some(Cow::Owned(format!("{open}{}", prefill.unwrap_or(""))))
        };
        build_generation_prompt(self, &messages, role, prefill.as_deref())
    }

    fn supervised_example_with(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)> {
        build_supervised_example(self, &self.ensure_system_message(messages), train_on)
    }

    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        self.tools_prefix(tools, system_prompt)
    }
}

/// The renderer called `name` of this family.
pub(crate) fn build(name: &str, tokenizer: Tokenizer) -> Result<Arc<dyn Renderer>> {
    let options =
        KimiK2Options::by_name(name).ok_or_else(|| crate::renderer::registry::unknown(name))?;
    Ok(Arc::new(KimiK2Renderer::named(name, tokenizer, options)?))
}

#[cfg(test)]
mod tests;
