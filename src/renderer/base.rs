//! The message-by-message rendering machinery the cookbook's renderers share.
//!
//! A chat format implements [`MessageFormat`]: how one message renders (header + output, see
//! [`RenderedMessage`]), where sampling stops and how a response parses. The generic
//! [`build_generation_prompt`] and [`build_supervised_example`] assemble whole conversations
//! from that, exactly as the cookbook's `Renderer` base class does (context per message,
//! empty chunks skipped, weights per [`TrainOnWhat`], no loss on what the generation prompt
//! already supplies). Every `MessageFormat` is a [`Renderer`](crate::Renderer).
//!
//! The free functions at the bottom are the cookbook's parsing helpers
//! ([`parse_content_blocks`], [`parse_think_blocks`], [`parse_response_for_stop_token`], …),
//! shared by the family modules.

use std::sync::OnceLock;

use regex::Regex;

use crate::error::{Error, Result};
use crate::message::{ContentPart, Message, Role, ToolCall, UnparsedToolCall};
pub(crate) use crate::python::python_float_repr;
use crate::renderer::{ParseTermination, TrainOnWhat};
use crate::tokenizer::Tokenizer;
use crate::types::{ModelInput, StopCondition, TokenId};

/// One message split for loss masking (the cookbook's `RenderedMessage`).
///
/// A conversation renders as `BOS + header_0 + output_0 + header_1 + output_1 + …`; the
/// header is what introduces a turn (never trained, except with
/// [`TrainOnWhat::AllTokens`]); the output is what the model writes, end-of-turn tokens
/// included. `stop_overlap` is appended only after the last message of a supervised example
/// (role-colon's `"User:"`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderedMessage {
    /// Role identifier and delimiters that introduce the turn.
    pub header: Vec<TokenId>,
    /// What the model generates for this turn, as one or more chunks.
    pub output: Vec<Vec<TokenId>>,
    /// Tokens shared by the stop sequence and the next header (role-colon only).
    pub stop_overlap: Vec<TokenId>,
}

impl RenderedMessage {
    /// A rendered message with a header and one output chunk.
    pub fn new(header: Vec<TokenId>, output: Vec<TokenId>) -> Self {
        RenderedMessage {
            header,
            output: vec![output],
            stop_overlap: Vec::new(),
        }
    }
}

/// Where a message sits in its conversation (the cookbook's `RenderContext`).
#[derive(Debug, Clone, Copy)]
pub struct RenderContext<'a> {
    /// Index of the message (0-based); for a generation suffix, the number of messages.
    pub idx: usize,
    /// Whether this is the last message.
    pub is_last: bool,
    /// The previous message.
    pub prev_message: Option<&'a Message>,
    /// The next message.
    pub next_message: Option<&'a Message>,
    /// Index of the last user message, if any.
    pub last_user_index: Option<usize>,
    /// Whether the message belongs to the turn the model is asked to produce.
    pub in_last_assistant_turn: bool,
}

/// Index of the last message with role user, if any.
pub(crate) fn last_user_index(messages: &[Message]) -> Option<usize> {
    messages.iter().rposition(|m| m.role == Role::User)
}

/// A chat format described message by message, the way the cookbook's renderers are.
///
/// Implement [`render_message`](Self::render_message), [`stop`](Self::stop) and
/// [`parse_response`](Self::parse_response); the provided methods are the cookbook's
/// defaults and can be overridden where a format differs. Every `MessageFormat` is a
/// [`Renderer`](crate::Renderer).
pub trait MessageFormat: Send + Sync {
    /// The renderer's registry name (`"qwen3"`).
    fn name(&self) -> &str;
    /// The tokenizer.
    fn tokenizer(&self) -> &Tokenizer;
    /// Tokens before the first message.
    fn bos_tokens(&self) -> Vec<TokenId> {
        Vec::new()
    }
    /// Renders one message into header / output / stop overlap.
    fn render_message(&self, message: &Message, ctx: &RenderContext<'_>)
    -> Result<RenderedMessage>;
    /// Where sampling stops.
    fn stop(&self) -> StopCondition;
    /// Parses sampled tokens into an assistant message.
    fn parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)>;

    /// Tokens appended to a generation prompt: by default the header of an empty message of
    /// `role`.
    fn generation_suffix(&self, role: Role, ctx: &RenderContext<'_>) -> Result<Vec<TokenId>> {
        Ok(self.render_message(&Message::new(role, ""), ctx)?.header)
    }
    /// Index of the first message of the turn being produced: by default the one after the
    /// last user message.
    fn last_assistant_turn_start_index(&self, messages: &[Message]) -> usize {
        last_user_index(messages).map_or(0, |i| i + 1)
    }
    /// Whether a message's output carries loss.
    fn output_is_trained(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
        train_on: TrainOnWhat,
    ) -> Result<bool> {
        default_output_is_trained(message, ctx, train_on)
    }
    /// Whether the generation prompt closes the think block (a reasoning-off renderer).
    fn disables_thinking(&self) -> bool {
        false
    }
    /// Whether successive generation prompts of a conversation extend each other.
    fn has_extension_property(&self) -> bool {
        false
    }
    /// The generation prompt (override for formats that restructure the conversation).
    fn generation_prompt_with(
        &self,
        messages: &[Message],
        role: Role,
        prefill: Option<&str>,
    ) -> Result<ModelInput> {
        build_generation_prompt(self, messages, role, prefill)
    }
    /// The supervised example (override for formats that restructure the conversation).
    fn supervised_example_with(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)> {
        build_supervised_example(self, messages, train_on)
    }
    /// Messages that declare `tools` (and the system prompt) at the start of a conversation.
    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        let _ = (tools, system_prompt);
        Err(Error::Unsupported(format!(
            "renderer `{}` does not declare tools",
            self.name()
        )))
    }
}

/// A tool the model may call (OpenAI function schema).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolSpec {
    /// The tool's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its parameters.
    pub parameters: serde_json::Value,
}

/// The cookbook's default `_output_is_trained`.
pub(crate) fn default_output_is_trained(
    message: &Message,
    ctx: &RenderContext<'_>,
    train_on: TrainOnWhat,
) -> Result<bool> {
    let is_assistant = message.role == Role::Assistant;
    Ok(match train_on {
        TrainOnWhat::LastAssistantMessage => ctx.is_last && is_assistant,
        TrainOnWhat::LastAssistantTurn => is_assistant && ctx.in_last_assistant_turn,
        TrainOnWhat::AllAssistantMessages => is_assistant,
        TrainOnWhat::AllMessages | TrainOnWhat::AllTokens => true,
        TrainOnWhat::AllUserAndSystemMessages => matches!(message.role, Role::User | Role::System),
        TrainOnWhat::Customized => message.trainable.unwrap_or(false),
    })
}

/// The cookbook's `build_generation_prompt`: BOS, every rendered message (empty chunks
/// skipped), the generation suffix of `role`, then `prefill`.
pub(crate) fn build_generation_prompt<F: MessageFormat + ?Sized>(
    format: &F,
    messages: &[Message],
    role: Role,
    prefill: Option<&str>,
) -> Result<ModelInput> {
    let mut input = ModelInput::from_tokens(format.bos_tokens());
    let last_user = last_user_index(messages);
    let turn_start = format.last_assistant_turn_start_index(messages);
    for (idx, message) in messages.iter().enumerate() {
        let ctx = RenderContext {
            idx,
            is_last: idx + 1 == messages.len(),
            prev_message: idx.checked_sub(1).map(|i| &messages[i]),
            next_message: messages.get(idx + 1),
            last_user_index: last_user,
            in_last_assistant_turn: idx >= turn_start,
        };
        let rendered = format.render_message(message, &ctx)?;
        input.push_tokens(rendered.header);
        for chunk in rendered.output {
            input.push_tokens(chunk);
        }
    }
    let suffix_ctx = RenderContext {
        idx: messages.len(),
        is_last: true,
        prev_message: messages.last(),
        next_message: None,
        last_user_index: last_user,
        in_last_assistant_turn: true,
    };
    input.push_tokens(format.generation_suffix(role, &suffix_ctx)?);
    if let Some(prefill) = prefill.filter(|p| !p.is_empty()) {
        input.push_tokens(format.tokenizer().encode(prefill)?);
    }
    Ok(input)
}

/// The cookbook's `build_supervised_example`: tokens and a 0/1 weight per token.
///
/// Errors: [`Error::Renderer`] for an empty conversation, a `trainable` flag without
/// [`TrainOnWhat::Customized`] (or a missing one with it), and for a reasoning-off renderer
/// given a turn that reasoned.
pub(crate) fn build_supervised_example<F: MessageFormat + ?Sized>(
    format: &F,
    messages: &[Message],
    train_on: TrainOnWhat,
) -> Result<(ModelInput, Vec<f32>)> {
    if messages.is_empty() {
        return Err(Error::Renderer(
            "supervised_example needs at least one message".into(),
        ));
    }
    if train_on == TrainOnWhat::AllAssistantMessages && !format.has_extension_property() {
        tracing::warn!(
            renderer = format.name(),
            "train_on all_assistant_messages with a renderer without the extension property: \
             earlier assistant messages see a different prefix than at sampling time"
        );
    }
    let mut input = ModelInput::new();
    let mut weights: Vec<f32> = Vec::new();
    let mut push = |input: &mut ModelInput, tokens: Vec<TokenId>, w: f32| {
        weights.extend(std::iter::repeat_n(w, tokens.len()));
        input.push_tokens(tokens);
    };
    push(&mut input, format.bos_tokens(), 0.0);
    let last_user = last_user_index(messages);
    let turn_start = format.last_assistant_turn_start_index(&messages[..messages.len() - 1]);
    for (idx, message) in messages.iter().enumerate() {
        check_trainable_flag(message, idx, train_on)?;
        let is_last = idx + 1 == messages.len();
        let ctx = RenderContext {
            idx,
            is_last,
            prev_message: idx.checked_sub(1).map(|i| &messages[i]),
            next_message: messages.get(idx + 1),
            last_user_index: last_user,
            in_last_assistant_turn: idx >= turn_start,
        };
        let rendered = format.render_message(message, &ctx)?;
        let header_w = if train_on == TrainOnWhat::AllTokens {
            1.0
        } else {
            0.0
        };
        push(&mut input, rendered.header, header_w);
        let out_w = if format.output_is_trained(message, &ctx, train_on)? {
            1.0
        } else {
            0.0
        };
        for chunk in rendered.output {
            push(&mut input, chunk, out_w);
        }
        if is_last {
            push(&mut input, rendered.stop_overlap, out_w);
        }
    }
    let weights = train_after_generation_prompt(format, messages, train_on, &input, weights)?;
    Ok((input, weights))
}

/// The `trainable` flag must be present exactly when training on
/// [`TrainOnWhat::Customized`].
pub(crate) fn check_trainable_flag(
    message: &Message,
    idx: usize,
    train_on: TrainOnWhat,
) -> Result<()> {
    match (
        train_on == TrainOnWhat::Customized,
        message.trainable.is_some(),
    ) {
        (true, false) => Err(Error::Renderer(format!(
            "message {idx}: train_on customized needs a `trainable` flag on every message"
        ))),
        (false, true) => Err(Error::Renderer(format!(
            "message {idx} has a `trainable` flag, which only train_on customized uses"
        ))),
        _ => Ok(()),
    }
}

/// The cookbook's `_train_after_the_generation_prompt`: no loss on the tokens the generation
/// prompt for the trained turn already supplies (a prefilled `<think>`, say).
pub(crate) fn train_after_generation_prompt<F: MessageFormat + ?Sized>(
    format: &F,
    messages: &[Message],
    train_on: TrainOnWhat,
    input: &ModelInput,
    mut weights: Vec<f32>,
) -> Result<Vec<f32>> {
    let Some(boundary) = first_trained_message_index(messages, train_on) else {
        return Ok(weights);
    };
    let prompt = format
        .generation_prompt_with(&messages[..boundary], Role::Assistant, None)?
        .to_tokens();
    let tokens = input.to_tokens();
    if tokens.len() < prompt.len() || tokens[..prompt.len()] != prompt[..] {
        if format.disables_thinking() {
            return Err(Error::Renderer(format!(
                "renderer `{}` has thinking turned off (its generation prompt closes the think \
                 block), but the trained turn contains reasoning: use the thinking version of \
                 the renderer or remove the reasoning from the turn",
                format.name()
            )));
        }
        return Ok(weights);
    }
    for w in &mut weights[..prompt.len()] {
        *w = 0.0;
    }
    Ok(weights)
}

/// The message the generation prompt stops before, for the modes that train "the turn
/// sampling would produce"; `None` otherwise.
pub(crate) fn first_trained_message_index(
    messages: &[Message],
    train_on: TrainOnWhat,
) -> Option<usize> {
    let boundary = match train_on {
        TrainOnWhat::LastAssistantMessage => messages.len().checked_sub(1)?,
        TrainOnWhat::LastAssistantTurn => last_user_index(messages).map_or(0, |i| i + 1),
        _ => return None,
    };
    (boundary < messages.len() && messages[boundary].role == Role::Assistant).then_some(boundary)
}

// ---------------------------------------------------------------------------------------------
// Parsing helpers
// ---------------------------------------------------------------------------------------------

/// Prefix of the error of an [`UnparsedToolCall`] for a tool block opened and never closed.
pub(crate) const UNTERMINATED_TOOL_BLOCK_ERROR: &str = "unterminated tool block";

/// Cap on the raw text kept for a dangling tool block.
pub(crate) const PARSE_FAILURE_DETAIL_MAX_CHARS: usize = 16384;

/// Decodes tokens, mapping a decode failure to [`Error::Renderer`].
pub(crate) fn decode(tokenizer: &Tokenizer, tokens: &[TokenId]) -> Result<String> {
    tokenizer
        .decode(tokens)
        .map_err(|e| Error::Renderer(format!("decoding a sampled response: {e}")))
}

/// The id of a special token the format needs; [`Error::Tokenizer`] naming it when the
/// tokenizer lacks it.
pub(crate) fn special_token(tokenizer: &Tokenizer, token: &str, renderer: &str) -> Result<TokenId> {
    tokenizer.token_to_id(token).ok_or_else(|| {
        Error::Tokenizer(format!(
            "renderer `{renderer}` needs the special token `{token}`, which this tokenizer lacks"
        ))
    })
}

/// The cookbook's `parse_response_for_stop_token`: zero stop tokens is malformed, one splits
/// the response, more is an error (the sampler was given the wrong stop condition).
pub(crate) fn parse_response_for_stop_token(
    tokens: &[TokenId],
    tokenizer: &Tokenizer,
    stop_token: TokenId,
) -> Result<(Message, ParseTermination)> {
    let count = tokens.iter().filter(|&&t| t == stop_token).count();
    match count {
        0 => Ok((
            Message::assistant(decode(tokenizer, tokens)?),
            ParseTermination::Malformed,
        )),
        1 => {
            let end = tokens
                .iter()
                .position(|&t| t == stop_token)
                .unwrap_or(tokens.len());
            Ok((
                Message::assistant(decode(tokenizer, &tokens[..end])?),
                ParseTermination::StopSequence,
            ))
        }
        n => Err(Error::Renderer(format!(
            "the response holds the stop token {stop_token} {n} times (expected at most once): \
             sampling probably used the wrong stop condition"
        ))),
    }
}

fn think_or_tool_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(
        &RE,
        r"(?s)<think>(.*?)</think>|<tool_call>(.*?)</tool_call>",
    )
}

fn think_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(&RE, r"(?s)<think>(.*?)</think>")
}

/// A static regex compiled on first use (the patterns are literals, so compiling cannot fail
/// at run time).
pub(crate) fn static_regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| {
        Regex::new(pattern).unwrap_or_else(|e| panic!("static regex {pattern}: {e}"))
    })
}

/// The one token `text` encodes to (the cookbook's `_get_special_token` asserts the same);
/// [`Error::Tokenizer`] naming `renderer` when it is not a single token.
pub(crate) fn single_token(tokenizer: &Tokenizer, text: &str, renderer: &str) -> Result<TokenId> {
    match tokenizer.encode(text)?.as_slice() {
        [token] => Ok(*token),
        other => Err(Error::Tokenizer(format!(
            "renderer `{renderer}` needs `{text}` to be a single token, but this tokenizer \
             encodes it as {other:?}"
        ))),
    }
}

/// The cookbook's `_normalize_response_tokens` of the renderers whose generation prompt
/// prefills a single `<think>` token: a response that closes a think block (`think_close`)
/// without opening it (`think_open` first) gets the prefilled `think_open` put back.
pub(crate) fn restore_think_prefix(
    response: &[TokenId],
    think_open: TokenId,
    think_close: TokenId,
) -> std::borrow::Cow<'_, [TokenId]> {
    if response.first() != Some(&think_open) && response.contains(&think_close) {
        let mut out = Vec::with_capacity(response.len() + 1);
        out.push(think_open);
        out.extend_from_slice(response);
        std::borrow::Cow::Owned(out)
    } else {
        std::borrow::Cow::Borrowed(response)
    }
}

/// Python's `json.dumps` of a JSON value with its default separators (`", "`, `": "`) and
/// `ensure_ascii=True`.
pub(crate) fn python_json_dumps(value: &serde_json::Value) -> String {
    python_json(value, ", ", ": ", true)
}

/// Python's `json.dumps(value, separators=(item, key), ensure_ascii=ascii)`.
pub(crate) fn python_json(value: &serde_json::Value, item: &str, key: &str, ascii: bool) -> String {
    python_json_with(
        value,
        &PyJsonStyle {
            indent: None,
            item_sep: item.to_owned(),
            key_sep: key.to_owned(),
            ensure_ascii: ascii,
            sort_keys: false,
        },
    )
}

/// The arguments of Python's `json.dumps` that change its output.
#[derive(Debug, Clone)]
pub(crate) struct PyJsonStyle {
    /// `indent` as the string repeated per level (`None`: one line).
    pub indent: Option<String>,
    /// The item separator (`", "` by default).
    pub item_sep: String,
    /// The key separator (`": "` by default).
    pub key_sep: String,
    /// `ensure_ascii`.
    pub ensure_ascii: bool,
    /// `sort_keys`.
    pub sort_keys: bool,
}

/// Python's `json.dumps` with the given style, byte for byte.
pub(crate) fn python_json_with(value: &serde_json::Value, style: &PyJsonStyle) -> String {
    let mut out = String::new();
    write_json(&mut out, value, style, 0);
    out
}

/// Python's `json.dumps` layout.
fn write_json(out: &mut String, v: &serde_json::Value, style: &PyJsonStyle, level: usize) {
    use serde_json::Value;
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &style.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match n.as_f64().filter(|_| n.is_f64()) {
            Some(f) => out.push_str(&python_float_repr(f)),
            None => out.push_str(&n.to_string()),
        },
        Value::String(s) => write_json_str(out, s, style.ensure_ascii),
        Value::Array(a) if a.is_empty() => out.push_str("[]"),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, level + 1);
                write_json(out, x, style, level + 1);
            }
            newline(out, level);
            out.push(']');
        }
        Value::Object(o) if o.is_empty() => out.push_str("{}"),
        Value::Object(o) => {
            let mut entries: Vec<(&String, &Value)> = o.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, level + 1);
                write_json_str(out, k, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_json(out, x, style, level + 1);
            }
            newline(out, level);
            out.push('}');
        }
    }
}

fn write_json_str(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Parses the JSON inside a `<tool_call>` block (`{"name": …, "arguments": {…}}`), the
/// cookbook's `_parse_tool_call_json`: the arguments are kept as Python's `json.dumps` of
/// the parsed object.
pub(crate) fn parse_tool_call_json(
    json_text: &str,
    raw_text: &str,
) -> std::result::Result<ToolCall, UnparsedToolCall> {
    let unparsed = |error: String| UnparsedToolCall {
        raw_text: raw_text.to_owned(),
        error,
    };
    let value: serde_json::Value = serde_json::from_str(json_text.trim())
        .map_err(|e| unparsed(format!("Invalid JSON: {e}")))?;
    let serde_json::Value::Object(obj) = value else {
        return Err(unparsed("Tool call is not a JSON object".into()));
    };
    let Some(name) = obj.get("name").and_then(|n| n.as_str()) else {
        return Err(unparsed("Missing or invalid 'name' field".into()));
    };
    let args = match obj.get("arguments") {
        Some(a @ serde_json::Value::Object(_)) => a,
        _ => return Err(unparsed("Missing or invalid 'arguments' field".into())),
    };
    let id = obj.get("id").and_then(|i| i.as_str()).map(str::to_owned);
    Ok(ToolCall {
        id,
        name: name.to_owned(),
        arguments: python_json_dumps(args),
    })
}

/// Parsed tool calls, successful and not, in order.
pub(crate) type ParsedToolCalls = Vec<std::result::Result<ToolCall, UnparsedToolCall>>;

/// The cookbook's `parse_content_blocks`: `<think>…</think>` and `<tool_call>…</tool_call>`
/// blocks split out of `content`; `None` when neither tag appears. Empty thinking blocks
/// and empty text between blocks are dropped; whitespace is kept.
pub(crate) fn parse_content_blocks(content: &str) -> Option<(Vec<ContentPart>, ParsedToolCalls)> {
    if !content.contains("<think>") && !content.contains("<tool_call>") {
        return None;
    }
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut pos = 0;
    for caps in think_or_tool_regex().captures_iter(content) {
        let whole = caps.get(0).expect("group 0 always matches");
        let before = &content[pos..whole.start()];
        if !before.is_empty() {
            parts.push(ContentPart::text(before));
        }
        if let Some(thinking) = caps.get(1) {
            if !thinking.as_str().is_empty() {
                parts.push(ContentPart::thinking(thinking.as_str()));
            }
        } else if let Some(call) = caps.get(2) {
            calls.push(parse_tool_call_json(call.as_str(), whole.as_str()));
        }
        pos = whole.end();
    }
    let rest = &content[pos..];
    if !rest.is_empty() {
        parts.push(ContentPart::text(rest));
    }
    Some((parts, calls))
}

/// The cookbook's `parse_think_blocks`: only `<think>…</think>` blocks; `None` without
/// `<think>`.
pub(crate) fn parse_think_blocks(content: &str) -> Option<Vec<ContentPart>> {
    if !content.contains("<think>") {
        return None;
    }
    let mut parts = Vec::new();
    let mut pos = 0;
    for caps in think_regex().captures_iter(content) {
        let whole = caps.get(0).expect("group 0 always matches");
        let before = &content[pos..whole.start()];
        if !before.is_empty() {
            parts.push(ContentPart::text(before));
        }
        if let Some(t) = caps.get(1).filter(|t| !t.as_str().is_empty()) {
            parts.push(ContentPart::thinking(t.as_str()));
        }
        pos = whole.end();
    }
    let rest = &content[pos..];
    if !rest.is_empty() {
        parts.push(ContentPart::text(rest));
    }
    Some(parts)
}

/// The cookbook's `detect_unterminated_tool_block`: an entry for a tool block opened more
/// often than closed.
pub(crate) fn detect_unterminated_tool_block(
    content: &str,
    open_marker: &str,
    close_marker: &str,
) -> Option<UnparsedToolCall> {
    let opens = content.matches(open_marker).count();
    if opens == 0 || opens <= content.matches(close_marker).count() {
        return None;
    }
    let start = content.rfind(open_marker).unwrap_or(0);
    let raw: String = content[start..]
        .chars()
        .take(PARSE_FAILURE_DETAIL_MAX_CHARS)
        .collect();
    Some(UnparsedToolCall {
        raw_text: raw,
        error: format!(
            "{UNTERMINATED_TOOL_BLOCK_ERROR}: '{open_marker}' opened without a matching '{close_marker}'"
        ),
    })
}

/// Splits parsed tool calls into the message's `tool_calls` and `unparsed_tool_calls`.
pub(crate) fn assign_tool_calls(message: &mut Message, calls: ParsedToolCalls) {
    for c in calls {
        match c {
            Ok(call) => message.tool_calls.push(call),
            Err(bad) => message.unparsed_tool_calls.push(bad),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_prefix_is_restored_only_when_missing() {
        assert_eq!(&*restore_think_prefix(&[5, 2, 7], 1, 2), &[1, 5, 2, 7]);
        assert_eq!(&*restore_think_prefix(&[1, 5, 2], 1, 2), &[1, 5, 2]);
        assert_eq!(&*restore_think_prefix(&[5, 7], 1, 2), &[5, 7]);
        assert!(restore_think_prefix(&[], 1, 2).is_empty());
    }

    #[test]
    fn python_json_matches_json_dumps() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"a": 1, "b": [1.5, "x\"y"], "c": "é😀", "d": null, "e": 1e20, "f": 2.0}"#,
        )
        .unwrap();
        assert_eq!(
            python_json_dumps(&v),
            r#"{"a": 1, "b": [1.5, "x\"y"], "c": "\u00e9\ud83d\ude00", "d": null, "e": 1e+20, "f": 2.0}"#
        );
        assert_eq!(
            python_json(&v, ",", ":", false),
            r#"{"a":1,"b":[1.5,"x\"y"],"c":"é😀","d":null,"e":1e+20,"f":2.0}"#
        );
    }

    #[test]
    fn content_blocks_split_thinking_text_and_calls() {
        let (parts, calls) = parse_content_blocks(
            "<think>step</think>answer<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>more",
        )
        .unwrap();
        assert_eq!(
            parts,
            vec![
                ContentPart::thinking("step"),
                ContentPart::text("answer"),
                ContentPart::text("more")
            ]
        );
        let call = calls[0].clone().unwrap();
        assert_eq!(call.name, "f");
        assert_eq!(call.arguments, "{\"x\": 1}");
        assert!(parse_content_blocks("plain").is_none());
        let (_, bad) = parse_content_blocks("<tool_call>{oops</tool_call>").unwrap();
        assert!(
            bad[0]
                .clone()
                .unwrap_err()
                .error
                .starts_with("Invalid JSON")
        );
    }

    #[test]
    fn unterminated_tool_block_is_reported() {
        let u =
            detect_unterminated_tool_block("a<tool_call>{", "<tool_call>", "</tool_call>").unwrap();
        assert_eq!(u.raw_text, "<tool_call>{");
        assert!(detect_unterminated_tool_block("a", "<tool_call>", "</tool_call>").is_none());
    }
}
