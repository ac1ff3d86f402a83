//! Conversations: [`Message`], its [`Role`], [`Content`] made of parts (text, thinking, …),
//! and [`ToolCall`]s.
//!
//! The shapes follow the cookbook's `Message` (and the OpenAI chat format it is based on):
//! content is either a plain string or a list of typed parts; an assistant message may carry
//! tool calls; a tool message names the call it answers (`tool_call_id`, `name`).
//!
//! ```
//! use rlvr::message::{ContentPart, Message, Role, ToolCall};
//! // Plain text stays as easy as before.
//! let q = Message::user("What is 2 + 2?");
//! assert_eq!(q.text(), "What is 2 + 2?");
//!
//! // A reasoning model's answer: thinking + text. Rewards see the text only.
//! let a = Message::assistant(vec![
//!     ContentPart::thinking("2 + 2 is 4."),
//!     ContentPart::text("\\boxed{4}"),
//! ]);
//! assert_eq!(a.text(), "\\boxed{4}");
//! assert_eq!(a.thinking().as_deref(), Some("2 + 2 is 4."));
//!
//! // Tool use.
//! let call = ToolCall::new("get_weather", r#"{"city": "Paris"}"#).with_id("call_1");
//! let asked = Message::assistant("").with_tool_calls(vec![call]);
//! let answer = Message::tool_response("call_1", "get_weather", "18°C");
//! assert_eq!(answer.role, Role::Tool);
//! assert_eq!(asked.tool_calls[0].name, "get_weather");
//! ```

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The author of a [`Message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Role {
    /// System instructions.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's output (answers an assistant's [`ToolCall`]).
    Tool,
    /// Developer instructions (the Harmony / OpenAI name for system-level instructions).
    Developer,
    /// Tool declarations as their own message (Kimi K2's `tool_declare` turn).
    ToolDeclare,
    /// GPT-OSS (Harmony) model-level system message, rendered verbatim as Harmony's `system`
    /// turn. A [`Role::System`] message holds the user's instructions, which Harmony renders
    /// as a `developer` turn under `# Instructions`. The cookbook's internal
    /// `_gptoss_internal_system` role; [`GptOssRenderer`](crate::renderer::gpt_oss::GptOssRenderer)
    /// produces it for its system prompt and tool prefix.
    #[serde(rename = "_gptoss_internal_system")]
    GptOssSystem,
}

impl Role {
    /// The lower-case name (`"user"`, `"tool_declare"`), as the cookbook spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Developer => "developer",
            Role::ToolDeclare => "tool_declare",
            Role::GptOssSystem => "_gptoss_internal_system",
        }
    }

    /// Parses a role name (`"assistant"`); [`Error::Renderer`] for an unknown one.
    pub fn parse(name: &str) -> Result<Role> {
        Ok(match name {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "developer" => Role::Developer,
            "tool_declare" => Role::ToolDeclare,
            "_gptoss_internal_system" => Role::GptOssSystem,
            other => return Err(Error::Renderer(format!("unknown message role `{other}`"))),
        })
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One part of a message's [`Content`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// Visible text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's reasoning (chain of thought), hidden from rewards by default.
    Thinking {
        /// The reasoning text.
        thinking: String,
    },
    /// An image (URL or data URI). No shipped renderer renders images yet: they return
    /// [`Error::Unsupported`].
    Image {
        /// URL or `data:` URI.
        image: String,
    },
    /// Audio (path or `data:` URI). Not rendered yet ([`Error::Unsupported`]).
    Audio {
        /// Path or `data:` URI.
        audio: String,
    },
}

impl ContentPart {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        ContentPart::Text { text: text.into() }
    }
    /// A thinking part.
    pub fn thinking(thinking: impl Into<String>) -> Self {
        ContentPart::Thinking {
            thinking: thinking.into(),
        }
    }
    /// The part's type name (`"text"`, `"thinking"`, `"image"`, `"audio"`).
    pub fn kind(&self) -> &'static str {
        match self {
            ContentPart::Text { .. } => "text",
            ContentPart::Thinking { .. } => "thinking",
            ContentPart::Image { .. } => "image",
            ContentPart::Audio { .. } => "audio",
        }
    }
}

/// What a message says: a plain string, or a list of [`ContentPart`]s.
///
/// The two forms are not interchangeable for every renderer (the cookbook treats a string
/// that contains `<think>` differently from a thinking part), so the form given is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Typed parts, in order.
    Parts(Vec<ContentPart>),
}

impl Default for Content {
    fn default() -> Self {
        Content::Text(String::new())
    }
}

impl Content {
    /// The text when the content is text only: a string, or exactly one text part (the
    /// cookbook's `ensure_text`); [`Error::Renderer`] otherwise.
    pub fn as_text(&self) -> Result<&str> {
        match self {
            Content::Text(s) => Ok(s),
            Content::Parts(parts) => match parts.as_slice() {
                [ContentPart::Text { text }] => Ok(text),
                _ => Err(Error::Renderer(format!(
                    "expected text content, got multimodal content with {} parts",
                    parts.len()
                ))),
            },
        }
    }

    /// The content as parts; a string becomes one text part (`ensure_list`).
    pub fn parts(&self) -> Cow<'_, [ContentPart]> {
        match self {
            Content::Text(s) => Cow::Owned(vec![ContentPart::text(s.clone())]),
            Content::Parts(p) => Cow::Borrowed(p),
        }
    }

    /// The visible text: a string as it is, or the text parts concatenated (thinking and
    /// media dropped) — the cookbook's `get_text_content`.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Content::Text(s) => Cow::Borrowed(s),
            Content::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    if let ContentPart::Text { text } = p {
                        out.push_str(text);
                    }
                }
                Cow::Owned(out)
            }
        }
    }

    /// Whether the content carries reasoning: a thinking part, or a string with `<think>`
    /// (closed or not) — the cookbook's `has_thinking`.
    pub fn has_thinking(&self) -> bool {
        match self {
            Content::Text(s) => s.contains("<think>"),
            Content::Parts(p) => p.iter().any(|p| matches!(p, ContentPart::Thinking { .. })),
        }
    }

    /// The thinking parts concatenated, if there is any thinking part.
    pub fn thinking(&self) -> Option<String> {
        match self {
            Content::Text(_) => None,
            Content::Parts(parts) => {
                let mut out: Option<String> = None;
                for p in parts {
                    if let ContentPart::Thinking { thinking } = p {
                        out.get_or_insert_with(String::new).push_str(thinking);
                    }
                }
                out
            }
        }
    }

    /// Every part as a string, joined by `separator`: thinking as `<think>…</think>`, images
    /// as `<image>url</image>` (the cookbook's `format_content_as_string`).
    pub fn to_display_string(&self, separator: &str) -> String {
        match self {
            Content::Text(s) => s.clone(),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match p {
                    ContentPart::Text { text } => text.clone(),
                    ContentPart::Thinking { thinking } => format!("<think>{thinking}</think>"),
                    ContentPart::Image { image } => format!("<image>{image}</image>"),
                    ContentPart::Audio { audio } => format!("<audio>{audio}</audio>"),
                })
                .collect::<Vec<_>>()
                .join(separator),
        }
    }

    /// [`to_display_string`](Self::to_display_string), taking the content: plain text is
    /// handed over without a copy.
    ///
    /// ```
    /// use rlvr::message::Content;
    /// assert_eq!(Content::Text("4".into()).into_display_string(""), "4");
    /// ```
    pub fn into_display_string(self, separator: &str) -> String {
        match self {
            Content::Text(s) => s,
            parts => parts.to_display_string(separator),
        }
    }

    /// Whether the content is an empty string or has no parts.
    pub fn is_empty(&self) -> bool {
        match self {
            Content::Text(s) => s.is_empty(),
            Content::Parts(p) => p.is_empty(),
        }
    }

    /// [`Error::Unsupported`] naming the first image or audio part, if any.
    pub fn check_text_only(&self, renderer: &str) -> Result<()> {
        if let Content::Parts(parts) = self
            && let Some(p) = parts
                .iter()
                .find(|p| matches!(p, ContentPart::Image { .. } | ContentPart::Audio { .. }))
        {
            return Err(Error::Unsupported(format!(
                "renderer `{renderer}` does not render {} parts",
                p.kind()
            )));
        }
        Ok(())
    }
}

impl From<&str> for Content {
    fn from(s: &str) -> Self {
        Content::Text(s.to_owned())
    }
}
impl From<String> for Content {
    fn from(s: String) -> Self {
        Content::Text(s)
    }
}
impl From<&String> for Content {
    fn from(s: &String) -> Self {
        Content::Text(s.clone())
    }
}
impl From<Vec<ContentPart>> for Content {
    fn from(p: Vec<ContentPart>) -> Self {
        Content::Parts(p)
    }
}
impl PartialEq<str> for Content {
    fn eq(&self, other: &str) -> bool {
        matches!(self, Content::Text(s) if s == other)
    }
}
impl PartialEq<String> for Content {
    fn eq(&self, other: &String) -> bool {
        matches!(self, Content::Text(s) if s == other)
    }
}
impl PartialEq<&str> for Content {
    fn eq(&self, other: &&str) -> bool {
        matches!(self, Content::Text(s) if s == *other)
    }
}
impl fmt::Display for Content {
    /// The visible text (thinking dropped), as [`Content::text`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

/// A tool invocation by the model (OpenAI `function` call).
///
/// Serialized in the OpenAI shape: `{"type": "function", "id": …, "function": {"name": …,
/// "arguments": "<json>"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "ToolCallWire", try_from = "ToolCallWire")]
pub struct ToolCall {
    /// The call's id, when the format carries one (Kimi, OpenAI); `None` otherwise.
    pub id: Option<String>,
    /// The tool's name.
    pub name: String,
    /// The arguments, as a JSON text (an object).
    pub arguments: String,
}

impl ToolCall {
    /// A call of `name` with `arguments` (a JSON object as text), without an id.
    pub fn new(name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ToolCall {
            id: None,
            name: name.into(),
            arguments: arguments.into(),
        }
    }
    /// Sets the id (builder style).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
    /// The arguments parsed as JSON; [`Error::Renderer`] naming the tool when they are not
    /// valid JSON.
    pub fn arguments_json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.arguments).map_err(|e| {
            Error::Renderer(format!(
                "tool call `{}`: arguments are not valid JSON: {e}",
                self.name
            ))
        })
    }
}

#[derive(Serialize, Deserialize)]
struct ToolCallWire {
    #[serde(rename = "type", default = "function_type")]
    kind: String,
    #[serde(default)]
    id: Option<String>,
    function: FunctionWire,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Serialize, Deserialize)]
struct FunctionWire {
    name: String,
    arguments: String,
}

impl From<ToolCall> for ToolCallWire {
    fn from(c: ToolCall) -> Self {
        ToolCallWire {
            kind: "function".into(),
            id: c.id,
            function: FunctionWire {
                name: c.name,
                arguments: c.arguments,
            },
        }
    }
}

impl TryFrom<ToolCallWire> for ToolCall {
    type Error = String;
    fn try_from(w: ToolCallWire) -> std::result::Result<Self, String> {
        if w.kind != "function" {
            return Err(format!("tool call type `{}` is not `function`", w.kind));
        }
        Ok(ToolCall {
            id: w.id,
            name: w.function.name,
            arguments: w.function.arguments,
        })
    }
}

/// Text that looked like a tool call but could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnparsedToolCall {
    /// The model's text, as sampled.
    pub raw_text: String,
    /// What was wrong with it.
    pub error: String,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// What it says.
    pub content: Content,
    /// Tool calls the model made (assistant messages).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Tool calls the model tried to make but that did not parse.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unparsed_tool_calls: Vec<UnparsedToolCall>,
    /// Per-message training flag, for [`TrainOnWhat::Customized`](crate::renderer::TrainOnWhat::Customized).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainable: Option<bool>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The function a tool message comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A message with `role` and `content` (a string or parts).
    pub fn new(role: Role, content: impl Into<Content>) -> Self {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            unparsed_tool_calls: Vec::new(),
            trainable: None,
            tool_call_id: None,
            name: None,
        }
    }
    /// A system message.
    pub fn system(content: impl Into<Content>) -> Self {
        Self::new(Role::System, content)
    }
    /// A user message.
    pub fn user(content: impl Into<Content>) -> Self {
        Self::new(Role::User, content)
    }
    /// An assistant message.
    pub fn assistant(content: impl Into<Content>) -> Self {
        Self::new(Role::Assistant, content)
    }
    /// A tool's answer to the call `tool_call_id` of function `name`.
    pub fn tool_response(
        tool_call_id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<Content>,
    ) -> Self {
        let mut m = Self::new(Role::Tool, content);
        m.tool_call_id = Some(tool_call_id.into());
        m.name = Some(name.into());
        m
    }
    /// Sets the tool calls (builder style).
    pub fn with_tool_calls(mut self, calls: Vec<ToolCall>) -> Self {
        self.tool_calls = calls;
        self
    }
    /// Sets the per-message training flag (builder style).
    pub fn with_trainable(mut self, trainable: bool) -> Self {
        self.trainable = Some(trainable);
        self
    }
    /// The visible text, thinking removed (the cookbook's `get_text_content`). This is what
    /// reward functions see.
    pub fn text(&self) -> Cow<'_, str> {
        self.content.text()
    }
    /// The reasoning, when the content has thinking parts.
    pub fn thinking(&self) -> Option<String> {
        self.content.thinking()
    }
    /// The answer a reward should grade: [`text`](Self::text) with any `<think>…</think>`
    /// block left in string content removed, including one cut off by the token limit
    /// (`<think>…` to the end). A parsed response keeps its reasoning in thinking parts, so
    /// this differs from `text()` only for responses the renderer could not split — a
    /// response truncated inside its reasoning — where the cookbook would grade the
    /// reasoning itself (and could reward a `\boxed{}` found there).
    ///
    /// ```
    /// use rlvr::message::Message;
    /// assert_eq!(Message::assistant("<think>maybe \\boxed{3}").final_text(), "");
    /// assert_eq!(Message::assistant("<think>a</think>\n\nb").final_text(), "\n\nb");
    /// assert_eq!(Message::assistant("plain").final_text(), "plain");
    /// ```
    pub fn final_text(&self) -> String {
        // Most responses have no `<think>`: one vectorised scan says so (`str::contains`
        // reads a response several times slower).
        static THINK: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new("<think>"));
        let text = self.text();
        if THINK.find(text.as_bytes()).is_none() {
            return text.into_owned();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest: &str = &text;
        while let Some(start) = rest.find("<think>") {
            out.push_str(&rest[..start]);
            let after = &rest[start + "<think>".len()..];
            match after.find("</think>") {
                Some(end) => rest = &after[end + "</think>".len()..],
                None => {
                    rest = "";
                    break;
                }
            }
        }
        out.push_str(rest);
        out
    }
}
