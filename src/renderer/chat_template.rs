//! [`ChatTemplate`]: renders any Hugging Face chat model from the Jinja `chat_template` of its
//! `tokenizer_config.json` (or `chat_template.jinja`), as transformers'
//! `apply_chat_template` does.
//!
//! The template runs in [MiniJinja](https://docs.rs/minijinja) configured like transformers'
//! sandbox: `trim_blocks` and `lstrip_blocks` on, a single trailing newline of the template
//! dropped, Python string / dict methods (`.strip()`, `.startswith()`, `.split()`,
//! `.items()`, `.get()`, …), loop controls, `namespace`, and transformers' globals and
//! filters: `raise_exception(message)` (rendering fails with [`Error::Renderer`] carrying
//! exactly `message`), `strftime_now(format)` (the current time, UTC), and `tojson` as
//! Python's `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)` (no HTML escaping; `indent`, `separators`, `sort_keys` and
//! `ensure_ascii` accepted), `truncate` as Jinja2's (positional arguments too), and
//! minijinja-contrib's `striptags`, `cycler`, `joiner`. `{% generation %}` /
//! `{% endgeneration %}` markers (transformers' assistant-mask extension) are accepted and
//! ignored (their whitespace control kept).
//!
//! What the template sees — the variables transformers passes:
//! - `messages`: each [`Message`] as the OpenAI-style dict transformers takes (see
//!   [`template_message`]);
//! - `tools`: the tool schemas of [`ChatTemplateOptions::tools`], or `none`;
//! - `documents`: `none`; `add_generation_prompt`;
//! - the special tokens (`bos_token`, `eos_token`, and `unk_token`, `pad_token`, … when the
//!   tokenizer config has them), then [`ChatTemplateOptions::variables`] (`enable_thinking`,
//!   `date_string`, …), which win over special tokens of the same name.
//!
//! Known differences from Jinja2: a `{% for %}` over `none` loops zero times where Jinja2
//! raises (Hermes 3's tool-use template without tools renders an empty tool list instead of
//! failing), and `x|string` of a dict or list is not Python's `repr`.

use std::path::Path;
use std::sync::OnceLock;

use minijinja::value::Kwargs;
use minijinja::{AutoEscape, Environment, ErrorKind};
use regex::Regex;

use crate::error::{Error, Result};
use crate::message::{Content, ContentPart, Message, Role};
use crate::python::strftime;
use crate::renderer::base::{
    PyJsonStyle, RenderContext, ToolSpec, assign_tool_calls, check_trainable_flag,
    default_output_is_trained, detect_unterminated_tool_block, last_user_index,
    parse_content_blocks, python_json_with, static_regex,
};
use crate::renderer::{ParseTermination, Renderer, TrainOnWhat};
use crate::tokenizer::Tokenizer;
use crate::types::{ModelInput, StopCondition, TokenId};

/// The name the template is registered under in its MiniJinja environment.
const TEMPLATE_NAME: &str = "chat_template";

/// Marks the detail of an error raised by the template's `raise_exception`.
const RAISE_MARKER: &str = "\u{0}raise_exception\u{0}";

/// End-of-turn tokens added to the default stop condition when the tokenizer has them as
/// single tokens and the template text contains them.
pub const END_OF_TURN_TOKENS: [&str; 5] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
];

/// The special-token variables transformers passes to a template (its `special_tokens_map`),
/// read from `tokenizer_config.json`.
const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Settings of a [`ChatTemplate`]: special tokens, extra template variables, tools, stop
/// tokens. Everything left unset comes from the tokenizer config (when loading one) or is
/// absent.
///
/// ```
/// use rlvr::renderer::chat_template::ChatTemplateOptions;
/// let options = ChatTemplateOptions::default()
///     .eos_token("<|im_end|>")
///     .variable("enable_thinking", false);
/// assert_eq!(options.variables["enable_thinking"], serde_json::json!(false));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatTemplateOptions {
    /// The `bos_token` variable (e.g. `"<|begin_of_text|>"`); also the text a supervised
    /// example never trains on when the rendering starts with it.
    pub bos_token: Option<String>,
    /// The `eos_token` variable; also the first stop token by default.
    pub eos_token: Option<String>,
    /// Extra template variables, like transformers' `apply_chat_template(**kwargs)`
    /// (`enable_thinking`, `date_string`, …). They win over special tokens of the same name.
    pub variables: serde_json::Map<String, serde_json::Value>,
    /// Tool schemas passed as `tools` (transformers' `tools=`), in the OpenAI form
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub tools: Option<Vec<serde_json::Value>>,
    /// The stop tokens, replacing the default rule (see [`ChatTemplate::stop_tokens`]). Each
    /// must be a single token of the tokenizer.
    pub stop_tokens: Option<Vec<String>>,
}

impl ChatTemplateOptions {
    /// Sets the `bos_token` (builder style).
    pub fn bos_token(mut self, token: impl Into<String>) -> Self {
        self.bos_token = Some(token.into());
        self
    }
    /// Sets the `eos_token` (builder style).
    pub fn eos_token(mut self, token: impl Into<String>) -> Self {
        self.eos_token = Some(token.into());
        self
    }
    /// Sets one template variable (builder style), e.g. `("enable_thinking", false)`.
    pub fn variable(
        mut self,
        name: impl Into<String>,
        value: impl Into<serde_json::Value>,
    ) -> Self {
        self.variables.insert(name.into(), value.into());
        self
    }
    /// Declares tools (builder style), as `{"type": "function", "function": {"name",
    /// "description", "parameters"}}` each.
    pub fn tools(mut self, tools: &[ToolSpec]) -> Self {
        self.tools = Some(tools.iter().map(tool_schema).collect());
        self
    }
    /// Declares tools as raw JSON schemas (builder style), passed to the template unchanged.
    pub fn tools_json(mut self, tools: Vec<serde_json::Value>) -> Self {
        self.tools = Some(tools);
        self
    }
    /// Replaces the default stop tokens (builder style).
    pub fn stop_tokens<S: Into<String>>(mut self, tokens: impl IntoIterator<Item = S>) -> Self {
        self.stop_tokens = Some(tokens.into_iter().map(Into::into).collect());
        self
    }
}

/// The OpenAI function schema of a [`ToolSpec`], as transformers' templates expect tools.
pub fn tool_schema(tool: &ToolSpec) -> serde_json::Value {
    serde_json::json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        }
    })
}

/// A renderer driven by a model's own Jinja chat template, equal to transformers'
/// `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)` followed by
/// `tokenizer.encode(text, add_special_tokens=False)`.
///
/// - **Generation prompt**: the conversation rendered with `add_generation_prompt=True`,
///   encoded once. A BOS the template writes (`{{ bos_token }}`) is in the text already;
///   nothing else is added.
/// - **Supervised example**: the whole conversation rendered with
///   `add_generation_prompt=False`, encoded once; weights come from where messages start and
///   end in that text. The text of message `i` is what `render(messages[..=i])` adds to
///   `render(messages[..i])`; for a trained assistant message, the part that
///   `render(messages[..i], add_generation_prompt=True)` already produces (its header, e.g.
///   `<|im_start|>assistant\n`) is not trained. Each such boundary the weights need must be
///   a prefix of the whole rendering, or the call fails with [`Error::Renderer`] saying the
///   template is not prefix-preserving at that message (Qwen3, say, drops the reasoning of
///   earlier turns once a new user message follows, so `AllAssistantMessages` fails on a
///   multi-turn chat that reasoned, while `LastAssistantMessage` works). A token straddling
///   a boundary is trained if any of its characters is (transformers' assistant-mask rule);
///   encoding once keeps the ids those of `apply_chat_template(tokenize=True)`. Modes follow
///   the cookbook's [`TrainOnWhat`]; headers exist only for assistant messages, so
///   `AllMessages` trains a user message's delimiters too. `AllTokens` trains everything but
///   a leading `bos_token`.
/// - **Stop**: the tokens of [`stop_tokens`](Self::stop_tokens).
/// - **Parse**: the tokens up to the first stop token, decoded; none is
///   [`ParseTermination::Malformed`]. When the template uses `<think>` or `<tool_call>`,
///   the text is split with `parse_content_blocks` (the cookbook's):
///   `<think>…</think>` becomes a thinking part (a response starting inside the block,
///   after a generation prompt that opened it, counts as if `<think>` had been sampled), the
///   `\n` framing around it is dropped (the reasoning is `strip('\n')`ed, the text after it
///   `lstrip('\n')`ed, empty parts dropped, as Qwen3's template reads them back), and each
///   `<tool_call>{"name": …, "arguments": {…}}</tool_call>` becomes a tool call. Other
///   tool-call syntaxes (Llama's bare JSON, Mistral's `[TOOL_CALLS]`) stay in the text.
///
/// ```
/// use rlvr::renderer::chat_template::{ChatTemplate, ChatTemplateOptions};
/// use rlvr::{message::Message, renderer::{ParseTermination, TrainOnWhat}, types::StopCondition, Renderer};
/// # fn main() -> rlvr::Result<()> {
/// // A character-level toy tokenizer with ChatML's two special tokens, built inline.
/// let chars: Vec<String> = "userasitn12+?\n".chars().map(String::from).collect();
/// let mut vocab: serde_json::Map<String, serde_json::Value> =
///     chars.iter().enumerate().map(|(i, c)| (c.clone(), i.into())).collect();
/// let special = ["<|im_start|>", "<|im_end|>"];
/// let added: Vec<serde_json::Value> = special.iter().enumerate().map(|(i, t)| {
///     vocab.insert(t.to_string(), (chars.len() + i).into());
///     serde_json::json!({"id": chars.len() + i, "content": t, "single_word": false,
///         "lstrip": false, "rstrip": false, "normalized": false, "special": true})
/// }).collect();
/// let json = serde_json::json!({
///     "version": "1.0", "added_tokens": added, "normalizer": null, "pre_tokenizer": null,
///     "post_processor": null, "decoder": {"type": "Fuse"},
///     "model": {"type": "BPE", "vocab": vocab, "merges": [], "unk_token": "?"},
/// });
/// let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(json.to_string().as_bytes())?;
///
/// let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
///                 {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
/// let renderer = ChatTemplate::from_template_str(
///     template, tokenizer.clone(), ChatTemplateOptions::default().eos_token("<|im_end|>"))?;
///
/// let prompt = renderer.generation_prompt(&[Message::user("1+1?")])?;
/// assert_eq!(tokenizer.decode(&prompt.to_tokens())?,
///            "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n");
///
/// let chat = [Message::user("1+1?"), Message::assistant("2")];
/// let (input, weights) = renderer.supervised_example(&chat, TrainOnWhat::LastAssistantMessage)?;
/// let trained: Vec<u32> = input.to_tokens().iter().zip(&weights)
///     .filter(|(_, w)| **w > 0.0).map(|(t, _)| *t).collect();
/// // The header `<|im_start|>assistant\n` is the generation prompt's: not trained.
/// assert_eq!(tokenizer.decode(&trained)?, "2<|im_end|>\n");
///
/// let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
/// assert_eq!(renderer.stop(), StopCondition::Tokens(vec![im_end]));
/// let (message, termination) = renderer.parse_response(&tokenizer.encode("2<|im_end|>")?);
/// assert_eq!(message.content, "2");
/// assert_eq!(termination, ParseTermination::StopSequence);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ChatTemplate {
    tokenizer: Tokenizer,
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    /// Special tokens then user variables, in the order transformers merges them.
    variables: serde_json::Map<String, serde_json::Value>,
    tools: Option<Vec<serde_json::Value>>,
    stop_tokens: Vec<TokenId>,
    /// Whether responses are split into thinking / text / tool-call blocks.
    parses_blocks: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("template_chars", &self.source.len())
            .field("variables", &self.variables)
            .field("tools", &self.tools.as_ref().map(Vec::len))
            .field("stop_tokens", &self.stop_tokens)
            .finish()
    }
}

impl ChatTemplate {
    /// A renderer for the Jinja `template` over `tokenizer`.
    ///
    /// Errors: [`Error::Renderer`] when the template does not compile;
    /// [`Error::Tokenizer`] when a stop token is not a single token of the tokenizer, or when
    /// no stop token can be found (set [`ChatTemplateOptions::stop_tokens`]).
    pub fn from_template_str(
        template: &str,
        tokenizer: Tokenizer,
        options: ChatTemplateOptions,
    ) -> Result<Self> {
        Self::build(template, tokenizer, serde_json::Map::new(), options)
    }

    /// A renderer from a `tokenizer_config.json` file: its `chat_template` (a string, or a
    /// list of named templates: `"tool_use"` when `options` declares tools and the config has
    /// one, otherwise `"default"`), unless a `chat_template.jinja` lies beside it, which wins
    /// (as in transformers). Special tokens (`bos_token`, `eos_token`, …) come from the config
    /// unless `options` sets them.
    ///
    /// Errors: [`Error::Io`] / [`Error::Data`] reading the files,
    /// [`Error::Renderer`] when there is no chat template, and those of
    /// [`from_template_str`](Self::from_template_str).
    pub fn from_tokenizer_config(
        path: impl AsRef<Path>,
        tokenizer: Tokenizer,
        options: ChatTemplateOptions,
    ) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
        let config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::data_line(path, e.line(), e.to_string()))?;
        let beside = path.with_file_name("chat_template.jinja");
        let template = if beside.exists() {
            Some(std::fs::read_to_string(&beside).map_err(|e| Error::io("reading", &beside, e))?)
        } else {
            None
        };
        Self::from_config_parts(&config, template, tokenizer, options)
    }

    /// A renderer from a parsed `tokenizer_config.json` (see
    /// [`from_tokenizer_config`](Self::from_tokenizer_config)).
    pub fn from_tokenizer_config_json(
        config: &serde_json::Value,
        tokenizer: Tokenizer,
        options: ChatTemplateOptions,
    ) -> Result<Self> {
        Self::from_config_parts(config, None, tokenizer, options)
    }

    /// A renderer for a model directory: `tokenizer.json` (required), `tokenizer_config.json`
    /// and `chat_template.jinja` (either must provide the template; the `.jinja` file wins).
    pub fn from_dir(dir: impl AsRef<Path>, options: ChatTemplateOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))?;
        let config_path = dir.join("tokenizer_config.json");
        if config_path.exists() {
            return Self::from_tokenizer_config(config_path, tokenizer, options);
        }
        let jinja = dir.join("chat_template.jinja");
        let template =
            std::fs::read_to_string(&jinja).map_err(|e| Error::io("reading", &jinja, e))?;
        Self::from_template_str(&template, tokenizer, options)
    }

    fn from_config_parts(
        config: &serde_json::Value,
        template: Option<String>,
        tokenizer: Tokenizer,
        options: ChatTemplateOptions,
    ) -> Result<Self> {
        let template = match template {
            Some(t) => t,
            None => config_template(config, options.tools.is_some())?,
        };
        let mut specials = serde_json::Map::new();
        for key in SPECIAL_TOKEN_KEYS {
            if let Some(token) = config.get(key).and_then(token_content) {
                specials.insert(key.to_owned(), token.into());
            }
        }
        Self::build(&template, tokenizer, specials, options)
    }

    fn build(
        template: &str,
        tokenizer: Tokenizer,
        mut variables: serde_json::Map<String, serde_json::Value>,
        options: ChatTemplateOptions,
    ) -> Result<Self> {
        if let Some(bos) = &options.bos_token {
            variables.insert("bos_token".into(), bos.clone().into());
        }
        if let Some(eos) = &options.eos_token {
            variables.insert("eos_token".into(), eos.clone().into());
        }
        let bos_token = variables
            .get("bos_token")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        let eos_token = variables
            .get("eos_token")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        for (k, v) in options.variables {
            variables.insert(k, v);
        }
        let env = environment(template)?;
        let stop_tokens = match &options.stop_tokens {
            Some(names) => names
                .iter()
                .map(|name| single_token(&tokenizer, name))
                .collect::<Result<Vec<_>>>()?,
            None => default_stop_tokens(&tokenizer, template, eos_token.as_deref())?,
        };
        Ok(ChatTemplate {
            parses_blocks: ["<think>", "</think>", "<tool_call>"]
                .iter()
                .any(|t| template.contains(t)),
            tokenizer,
            env,
            source: template.to_owned(),
            bos_token,
            variables,
            tools: options.tools,
            stop_tokens,
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The template's Jinja source.
    pub fn template_source(&self) -> &str {
        &self.source
    }

    /// The stop tokens. Unless [`ChatTemplateOptions::stop_tokens`] sets them: the
    /// `eos_token` (from the options or the tokenizer config; the tokenizer's EOS without
    /// either), then each of [`END_OF_TURN_TOKENS`] (`<|im_end|>`, `<|eot_id|>`,
    /// `<|eom_id|>`, `<|end|>`, `<end_of_turn>`) that is a single token of the tokenizer and
    /// appears in the template text; without duplicates.
    pub fn stop_tokens(&self) -> &[TokenId] {
        &self.stop_tokens
    }

    /// The template's text for `messages`, as transformers'
    /// `apply_chat_template(messages, tokenize=False, add_generation_prompt=…)`.
    ///
    /// Errors: [`Error::Renderer`] for an empty conversation, for the template's
    /// `raise_exception(message)` (with exactly `message`) and for any other rendering error;
    /// [`Error::Unsupported`] for image or audio parts.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::Renderer(
                "cannot apply a chat template to an empty conversation".into(),
            ));
        }
        let dicts = messages
            .iter()
            .map(template_message)
            .collect::<Result<Vec<_>>>()?;
        self.render_dicts(dicts, add_generation_prompt)
    }

    /// Renders messages given as the dicts the template sees (any fields), with the
    /// configured variables and tools.
    pub fn render_dicts(
        &self,
        messages: Vec<serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let mut ctx = serde_json::Map::new();
        ctx.insert("messages".into(), serde_json::Value::Array(messages));
        ctx.insert(
            "tools".into(),
            match &self.tools {
                Some(t) => serde_json::Value::Array(t.clone()),
                None => serde_json::Value::Null,
            },
        );
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            serde_json::Value::Bool(add_generation_prompt),
        );
        for (k, v) in &self.variables {
            ctx.insert(k.clone(), v.clone());
        }
        let ctx = minijinja::Value::from(minijinja::value::Serde(serde_json::Value::Object(ctx)));
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        template.render(ctx).map_err(template_error)
    }

    fn encode(&self, text: &str) -> Result<Vec<TokenId>> {
        self.tokenizer.encode(text)
    }

    fn supervised(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)> {
        if messages.is_empty() {
            return Err(Error::Renderer(
                "supervised_example needs at least one message".into(),
            ));
        }
        for (idx, m) in messages.iter().enumerate() {
            check_trainable_flag(m, idx, train_on)?;
        }
        let n = messages.len();
        let full = self.render(messages, false)?;

        // Segments of the text, each ending at a boundary, with its weight.
        let mut segments: Vec<(Boundary, f32)> = Vec::new();
        if let Some(bos) = self.bos_token.as_deref().filter(|b| !b.is_empty())
            && full.starts_with(bos)
        {
            segments.push((Boundary::Fixed(bos.len()), 0.0));
        }
        let last_user = last_user_index(messages);
        let turn_start = last_user_index(&messages[..n - 1]).map_or(0, |i| i + 1);
        for (idx, message) in messages.iter().enumerate() {
            let ctx = RenderContext {
                idx,
                is_last: idx + 1 == n,
                prev_message: idx.checked_sub(1).map(|i| &messages[i]),
                next_message: messages.get(idx + 1),
                last_user_index: last_user,
                in_last_assistant_turn: idx >= turn_start,
            };
            let trained = default_output_is_trained(message, &ctx, train_on)?;
            if trained && message.role == Role::Assistant && train_on != TrainOnWhat::AllTokens {
                segments.push((Boundary::Prefix(idx, true), 0.0));
            }
            let end = if idx + 1 == n {
                Boundary::Fixed(full.len())
            } else {
                Boundary::Prefix(idx + 1, false)
            };
            segments.push((end, if trained { 1.0 } else { 0.0 }));
        }
        // Only the boundaries where the weight changes need resolving.
        let mut merged: Vec<(Boundary, f32)> = Vec::new();
        for (end, w) in segments {
            match merged.last_mut() {
                Some(last) if last.1 == w => last.0 = end,
                _ => merged.push((end, w)),
            }
        }
        let mut spans: Vec<(usize, usize, f32)> = Vec::new();
        let mut pos = 0usize;
        for (end, w) in merged {
            let end = match end {
                Boundary::Fixed(e) => e,
                Boundary::Prefix(0, _) => pos,
                Boundary::Prefix(upto, agp) => {
                    let prefix = self.render(&messages[..upto], agp)?;
                    if !full.starts_with(&prefix) || prefix.len() < pos {
                        return Err(not_prefix_preserving(upto, agp));
                    }
                    prefix.len()
                }
            };
            spans.push((pos, end, w));
            pos = end;
        }

        let encoding = self.tokenizer.inner().encode(full.as_str(), false)?;
        let ids = encoding.get_ids().to_vec();
        let weights = encoding
            .get_offsets()
            .iter()
            .map(|&(s, e)| {
                let trained = spans
                    .iter()
                    .any(|&(a, b, w)| w > 0.0 && ((s < b && e > a) || (s == e && a <= s && s < b)));
                if trained { 1.0 } else { 0.0 }
            })
            .collect();
        Ok((ModelInput::from_tokens(ids), weights))
    }

    fn parse(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        let stop_at = tokens.iter().position(|t| self.stop_tokens.contains(t));
        let Some(stop_at) = stop_at else {
            let text = decode(&self.tokenizer, tokens)?;
            return Ok((Message::assistant(text), ParseTermination::Malformed));
        };
        if stop_at + 1 < tokens.len() {
            return Err(Error::Renderer(format!(
                "the response goes on for {} tokens after the stop token {}: sampling probably \
                 used the wrong stop condition",
                tokens.len() - stop_at - 1,
                tokens[stop_at]
            )));
        }
        let text = decode(&self.tokenizer, &tokens[..stop_at])?;
        Ok((self.message_from_text(text), ParseTermination::StopSequence))
    }

    /// The assistant message of a decoded response (stop token removed).
    fn message_from_text(&self, text: String) -> Message {
        if !self.parses_blocks {
            return Message::assistant(text);
        }
        // A generation prompt that opened the think block: the response starts inside it.
        let text = match (text.find("</think>"), text.find("<think>")) {
            (Some(close), open) if open.is_none_or(|o| o > close) => format!("<think>{text}"),
            _ => text,
        };
        let unterminated = detect_unterminated_tool_block(&text, "<tool_call>", "</tool_call>");
        let mut message = match parse_content_blocks(&text) {
            Some((parts, calls)) => {
                let mut m = Message::assistant(Content::Parts(unframe_thinking(parts)));
                assign_tool_calls(&mut m, calls);
                m
            }
            None => Message::assistant(text),
        };
        message.unparsed_tool_calls.extend(unterminated);
        message
    }
}

/// Where a segment of the rendered conversation ends.
#[derive(Debug, Clone, Copy)]
enum Boundary {
    /// A fixed byte offset.
    Fixed(usize),
    /// The end of the rendering of the first `n` messages, with the generation prompt or not.
    Prefix(usize, bool),
}

fn not_prefix_preserving(upto: usize, agp: bool) -> Error {
    let what = if agp {
        format!(
            "the generation prompt after the first {upto} messages (the header of message {upto})"
        )
    } else {
        format!("the rendering of the first {upto} messages")
    };
    Error::Renderer(format!(
        "the chat template is not prefix-preserving at message {upto}: {what} is not a prefix of \
         the rendering of the whole conversation, so message {upto} cannot be given its own \
         weights (train on the last assistant message only, or use a cookbook renderer)"
    ))
}

/// The cookbook's `_unframe_thinking`: reasoning `strip('\n')`ed (empty blocks dropped), the
/// text after a block `lstrip('\n')`ed; empty text parts dropped.
fn unframe_thinking(parts: Vec<ContentPart>) -> Vec<ContentPart> {
    let mut out = Vec::new();
    let mut after_block = false;
    for part in parts {
        match part {
            ContentPart::Thinking { thinking } => {
                let reasoning = thinking.trim_matches('\n');
                if !reasoning.is_empty() {
                    out.push(ContentPart::thinking(reasoning));
                }
                after_block = true;
            }
            ContentPart::Text { text } => {
                let text = if after_block {
                    text.trim_start_matches('\n')
                } else {
                    text.as_str()
                };
                if !text.is_empty() {
                    out.push(ContentPart::text(text));
                }
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

fn decode(tokenizer: &Tokenizer, tokens: &[TokenId]) -> Result<String> {
    tokenizer
        .decode(tokens)
        .map_err(|e| Error::Renderer(format!("decoding a sampled response: {e}")))
}

fn single_token(tokenizer: &Tokenizer, token: &str) -> Result<TokenId> {
    tokenizer.token_to_id(token).ok_or_else(|| {
        Error::Tokenizer(format!(
            "stop token `{token}` is not a single token of this tokenizer"
        ))
    })
}

fn default_stop_tokens(
    tokenizer: &Tokenizer,
    template: &str,
    eos_token: Option<&str>,
) -> Result<Vec<TokenId>> {
    let mut stops: Vec<TokenId> = Vec::new();
    match eos_token {
        Some(eos) => stops.push(single_token(tokenizer, eos)?),
        None => stops.extend(tokenizer.eos_token_id()),
    }
    for token in END_OF_TURN_TOKENS {
        if template.contains(token)
            && let Some(id) = tokenizer.token_to_id(token)
            && !stops.contains(&id)
        {
            stops.push(id);
        }
    }
    if stops.is_empty() {
        return Err(Error::Tokenizer(
            "no stop token for this chat template: the tokenizer has no EOS and the template \
             none of the usual end-of-turn tokens; set ChatTemplateOptions::stop_tokens"
                .into(),
        ));
    }
    Ok(stops)
}

/// A special token's text in a tokenizer config: a string or an `AddedToken` dict.
fn token_content(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => {
            o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
        }
        _ => None,
    }
}

/// The `chat_template` of a tokenizer config, as transformers picks it.
fn config_template(config: &serde_json::Value, with_tools: bool) -> Result<String> {
    match config.get("chat_template") {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Array(named)) => {
            let find = |name: &str| {
                named.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == name)
                        .then(|| t.get("template")?.as_str().map(str::to_owned))
                        .flatten()
                })
            };
            with_tools
                .then(|| find("tool_use"))
                .flatten()
                .or_else(|| find("default"))
                .ok_or_else(|| {
                    Error::Renderer(
                        "the tokenizer config has named chat templates but none called \
                         `default`"
                            .into(),
                    )
                })
        }
        _ => Err(Error::Renderer(
            "the tokenizer config has no `chat_template` (and no chat_template.jinja lies \
             beside it)"
                .into(),
        )),
    }
}

/// A message as the OpenAI-style dict transformers passes to templates:
///
/// - `role`: the role name (`"user"`, `"tool"`, …);
/// - `content`: a string content as it is; for parts, the text parts concatenated (so a
///   message with only reasoning has `content: ""`);
/// - `reasoning_content` (and `thinking`, the alias transformers adds for templates that read
///   that name) when the content has thinking parts: those concatenated — what Qwen-style
///   templates render inside `<think>…</think>`;
/// - `tool_calls` when there are any: `[{"type": "function", "id": …, "function": {"name":
///   …, "arguments": {…}}}]`, the arguments parsed from their JSON text into an object (as
///   transformers documents and its templates expect; `id` only when set);
/// - `tool_call_id` and `name` when set (tool responses).
///
/// Keys without a value are left out (transformers drops `None` values), so `'tool_calls' in
/// message` and `message.tool_calls is defined` mean "has tool calls".
///
/// Errors: [`Error::Unsupported`] for image or audio parts; [`Error::Renderer`] for tool-call
/// arguments that are not valid JSON.
pub fn template_message(message: &Message) -> Result<serde_json::Value> {
    use serde_json::Value;
    message.content.check_text_only("chat_template")?;
    let (content, reasoning) = match &message.content {
        Content::Text(s) => (s.clone(), None),
        Content::Parts(_) => (
            message.content.text().into_owned(),
            message.content.thinking(),
        ),
    };
    let mut m = serde_json::Map::new();
    if let Some(r) = &reasoning {
        m.insert("thinking".into(), Value::String(r.clone()));
    }
    m.insert("role".into(), Value::String(message.role.as_str().into()));
    m.insert("content".into(), Value::String(content));
    if let Some(r) = reasoning {
        m.insert("reasoning_content".into(), Value::String(r));
    }
    if !message.tool_calls.is_empty() {
        let calls = message
            .tool_calls
            .iter()
            .map(|c| {
                let mut call = serde_json::Map::new();
                call.insert("type".into(), Value::String("function".into()));
                if let Some(id) = &c.id {
                    call.insert("id".into(), Value::String(id.clone()));
                }
                call.insert(
                    "function".into(),
                    serde_json::json!({"name": c.name, "arguments": c.arguments_json()?}),
                );
                Ok(Value::Object(call))
            })
            .collect::<Result<Vec<_>>>()?;
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &message.tool_call_id {
        m.insert("tool_call_id".into(), Value::String(id.clone()));
    }
    if let Some(name) = &message.name {
        m.insert("name".into(), Value::String(name.clone()));
    }
    Ok(Value::Object(m))
}

impl Renderer for ChatTemplate {
    fn generation_prompt(&self, messages: &[Message]) -> Result<ModelInput> {
        let text = self.render(messages, true)?;
        Ok(ModelInput::from_tokens(self.encode(&text)?))
    }

    fn supervised_example(
        &self,
        messages: &[Message],
        train_on: TrainOnWhat,
    ) -> Result<(ModelInput, Vec<f32>)> {
        self.supervised(messages, train_on)
    }

    fn stop(&self) -> StopCondition {
        StopCondition::Tokens(self.stop_tokens.clone())
    }

    fn parse_response(&self, tokens: &[TokenId]) -> (Message, ParseTermination) {
        match self.parse(tokens) {
            Ok(parsed) => parsed,
            Err(e) => {
                tracing::warn!(renderer = "chat_template", error = %e, "unparseable response");
                let text = self.tokenizer.decode(tokens).unwrap_or_default();
                (Message::assistant(text), ParseTermination::Malformed)
            }
        }
    }

    fn try_parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        self.parse(tokens)
    }

    fn name(&self) -> &str {
        "chat_template"
    }

    /// The assistant generation prompt, with `prefill` appended to the rendered text before
    /// encoding (one encoding, as for training). Other roles are
    /// [`Error::Unsupported`]: templates only know how to open an assistant turn.
    fn generation_prompt_with(
        &self,
        messages: &[Message],
        role: Role,
        prefill: Option<&str>,
    ) -> Result<ModelInput> {
        if role != Role::Assistant {
            return Err(Error::Unsupported(format!(
                "renderer `chat_template` renders generation prompts for the assistant only, \
                 not for {role}"
            )));
        }
        let mut text = self.render(messages, true)?;
        text.push_str(prefill.unwrap_or(""));
        Ok(ModelInput::from_tokens(self.encode(&text)?))
    }

    fn conversation_prefix_with_tools(
        &self,
        _tools: &[ToolSpec],
        _system_prompt: &str,
    ) -> Result<Vec<Message>> {
        Err(Error::Unsupported(
            "renderer `chat_template` declares tools through the template's `tools` variable: \
             set ChatTemplateOptions::tools and keep the system prompt a system message"
                .into(),
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// The MiniJinja environment (transformers' sandbox settings and helpers)
// ---------------------------------------------------------------------------------------------

fn generation_tag_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    static_regex(&RE, r"\{%(-?)\s*(generation|endgeneration)\s*(-?)%\}")
}

/// transformers' `{% generation %}…{% endgeneration %}` as an always-true `if`, so the
/// markers' whitespace control and `trim_blocks` behave as in Jinja2.
fn replace_generation_tags(template: &str) -> String {
    generation_tag_regex()
        .replace_all(template, |caps: &regex::Captures<'_>| {
            let tag = if &caps[2] == "generation" {
                "if true"
            } else {
                "endif"
            };
            format!("{{%{} {tag} {}%}}", &caps[1], &caps[3])
        })
        .into_owned()
}

fn environment(template: &str) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(template_error)?;
    env.set_syntax(syntax);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    // Jinja2's `striptags`, `cycler`, `joiner`, … (the ones below replace theirs).
    minijinja_contrib::add_to_environment(&mut env);
    env.add_filter("tojson", tojson_filter);
    env.add_filter("truncate", truncate_filter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    // transformers' `{% generation %}` extension only marks assistant spans.
    let source = replace_generation_tags(template);
    env.add_template_owned(TEMPLATE_NAME, source)
        .map_err(template_error)?;
    Ok(env)
}

fn template_error(e: minijinja::Error) -> Error {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = cur {
        if let Some(me) = err.downcast_ref::<minijinja::Error>()
            && let Some(message) = me.detail().and_then(|d| d.strip_prefix(RAISE_MARKER))
        {
            return Error::Renderer(message.to_owned());
        }
        cur = err.source();
    }
    Error::Renderer(format!("chat template: {e}"))
}

fn raise_exception(message: String) -> std::result::Result<minijinja::Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISE_MARKER}{message}"),
    ))
}

fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(&format, now).map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e))
}

/// Jinja2's `truncate(s, length=255, killwords=False, end='...', leeway=5)`, with `length`,
/// `killwords` and `end` also positional (MiniJinja's takes keywords only; `leeway` is
/// keyword-only here).
fn truncate_filter(
    value: minijinja::Value,
    length: Option<usize>,
    killwords: Option<bool>,
    end: Option<String>,
    kwargs: Kwargs,
) -> std::result::Result<String, minijinja::Error> {
    let length = kwargs
        .get::<Option<usize>>("length")?
        .or(length)
        .unwrap_or(255);
    let killwords = kwargs
        .get::<Option<bool>>("killwords")?
        .or(killwords)
        .unwrap_or(false);
    let end = kwargs
        .get::<Option<String>>("end")?
        .or(end)
        .unwrap_or_else(|| "...".to_owned());
    let leeway = kwargs.get::<Option<usize>>("leeway")?.unwrap_or(5);
    kwargs.assert_all_used()?;
    let s = value.to_string();
    let chars: Vec<char> = s.chars().collect();
    let end_len = end.chars().count();
    if length < end_len {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            "truncate: length is shorter than the end string",
        ));
    }
    if chars.len() <= length + leeway {
        return Ok(s);
    }
    let head: String = chars[..length - end_len].iter().collect();
    let head = if killwords {
        head
    } else {
        match head.rsplit_once(' ') {
            Some((before, _)) => before.to_owned(),
            None => head,
        }
    };
    Ok(head + &end)
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`.
fn tojson_filter(
    value: minijinja::Value,
    ensure_ascii: Option<bool>,
    kwargs: Kwargs,
) -> std::result::Result<minijinja::Value, minijinja::Error> {
    let ensure_ascii = match kwargs.get::<Option<bool>>("ensure_ascii")? {
        Some(b) => b,
        None => ensure_ascii.unwrap_or(false),
    };
    let indent: Option<minijinja::Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent must be an integer or a string, not {v}"),
                    )
                })?;
                Some(" ".repeat(n.max(0) as usize))
            }
        },
    };
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ));
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let json = serde_json::to_value(&value).map_err(|e| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: value is not JSON-serializable: {e}"),
        )
    })?;
    let style = PyJsonStyle {
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    Ok(minijinja::Value::from(python_json_with(&json, &style)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python() {
        // 2024-07-26 13:05:09 UTC, a Friday (Python: datetime(2024,7,26,13,5,9).strftime(...)).
        let t = 1_721_999_109;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %-d, %y %H:%M:%S %I%p %j %%", t).unwrap(),
            "Friday July 26, 24 13:05:09 01PM 208 %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert_eq!(
            strftime("%Y-%m-%d %a", 951_782_400).unwrap(),
            "2000-02-29 Tue"
        );
        assert!(strftime("%Q", 0).is_err());
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let env = environment(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(sort_keys=true, separators=(',', ':')) }}",
        )
        .unwrap();
        let x = serde_json::json!({"b": [1, 2.0, "é<&>'"], "a": {}, "c": []});
        let out = env
            .get_template(TEMPLATE_NAME)
            .unwrap()
            .render(
                minijinja::context! { x => minijinja::Value::from(minijinja::value::Serde(&x)) },
            )
            .unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.0, \"é<&>'\"], \"a\": {}, \"c\": []}|\
             {\n  \"b\": [\n    1,\n    2.0,\n    \"é<&>'\"\n  ],\n  \"a\": {},\n  \"c\": []\n}|\
             {\"a\":{},\"b\":[1,2.0,\"é<&>'\"],\"c\":[]}"
        );
    }

    #[test]
    fn raise_exception_carries_the_message() {
        let env = environment("{{ raise_exception('no system role') }}").unwrap();
        let err = env
            .get_template(TEMPLATE_NAME)
            .unwrap()
            .render(minijinja::context! {})
            .map_err(template_error)
            .unwrap_err();
        assert!(
            matches!(err, Error::Renderer(ref m) if m == "no system role"),
            "{err:?}"
        );
    }

    #[test]
    fn generation_tags_are_ignored() {
        let env = environment(
            "a{% generation %}b {%- endgeneration %}\nc{%generation-%} d{%endgeneration%}",
        )
        .unwrap();
        let out = env
            .get_template(TEMPLATE_NAME)
            .unwrap()
            .render(minijinja::context! {})
            .unwrap();
        // Jinja2 (transformers' environment) renders "abcd" too.
        assert_eq!(out, "abcd");
    }

    #[test]
    fn unframing_thinking_drops_the_newlines() {
        let (parts, _) = parse_content_blocks("<think>\nwhy\n</think>\n\nbecause").unwrap();
        assert_eq!(
            unframe_thinking(parts),
            vec![ContentPart::thinking("why"), ContentPart::text("because")]
        );
    }
}
