//! Qwen3.8 (`qwen3_8.py`): Qwen3.5 with a reasoning-effort instruction in the system
//! message, thinking kept in history by default, and JSON-serialized tool-call arguments.

use std::borrow::Cow;

use serde_json::Value;

use crate::error::Result;
use crate::message::{Content, ContentPart, Message, Role};
use crate::renderer::RenderContext;
use crate::renderer::base::python_json_dumps;
use crate::tokenizer::Tokenizer;

use super::common::{Qwen3_5Hooks, Qwen3Core, closed_think_generation_suffix_str};
use super::{at_or_before_last_user, impl_qwen3_message_format, maybe_newline};
use crate::python::py_strip;

/// The `reasoning_effort` of the Qwen3.8 template (ignored with thinking off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningEffort {
    /// The template's default: an instruction to think carefully.
    #[default]
    Xhigh,
    /// No instruction.
    Medium,
    /// An instruction to keep thinking brief.
    Low,
}

impl ReasoningEffort {
    /// The template's name (`"xhigh"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::Xhigh => "xhigh",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::Low => "low",
        }
    }

    /// The instruction sentence the template puts in the system message
    /// (`REASONING_EFFORT_INSTRUCTIONS`); empty for medium.
    pub fn instructions(self) -> &'static str {
        match self {
            ReasoningEffort::Xhigh => {
                "Reasoning effort is set to xhigh. Please think carefully through the task, \
                 validate key assumptions, consider plausible alternatives, and prioritize \
                 correctness, consistency, and clarity in the final answer."
            }
            ReasoningEffort::Medium => "",
            ReasoningEffort::Low => {
                "Reasoning effort is set to low. Keep your thinking brief and focused, moving \
                 directly to the conclusion without unnecessary elaboration."
            }
        }
    }
}

/// How a [`Qwen3_8Renderer`] is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qwen3_8Options {
    /// The reasoning effort (default xhigh, the template's default).
    pub reasoning_effort: ReasoningEffort,
    /// Thinking off (`qwen3_8_disable_thinking`): the generation prompt closes the think
    /// block and no reasoning instruction is added.
    pub disable_thinking: bool,
    /// Drop thinking from assistant messages at or before the last user message (the
    /// template's `preserve_thinking=false`). Default `false`: every assistant message keeps
    /// its (possibly empty) think block.
    pub strip_thinking_from_history: bool,
    /// Tokenize a message's text pieces as one string (default `true`).
    pub merge_text_chunks: bool,
}

impl Default for Qwen3_8Options {
    fn default() -> Self {
        Qwen3_8Options {
            reasoning_effort: ReasoningEffort::Xhigh,
            disable_thinking: false,
            strip_thinking_from_history: false,
            merge_text_chunks: true,
        }
    }
}

/// The Qwen3.8 renderer, text only: `qwen3_8_xhigh_reasoning`, `qwen3_8_medium_reasoning`,
/// `qwen3_8_low_reasoning`, `qwen3_8_disable_thinking`.
///
/// [`Qwen3_5Renderer`](super::Qwen3_5Renderer) with the Qwen3.8 template's changes: the
/// reasoning-effort sentence is put at the start of the system message (one is created when
/// the conversation has none), an empty system message is dropped, every assistant message
/// that did not reason gets the empty think block (thinking is preserved in history by
/// default), and non-string tool-call arguments are written as JSON (`true`, `null`).
#[derive(Debug, Clone)]
pub struct Qwen3_8Renderer {
    core: Qwen3Core,
    options: Qwen3_8Options,
}

impl Qwen3_8Renderer {
    /// The `qwen3_8_xhigh_reasoning` renderer.
    ///
    /// Errors: [`Error::Tokenizer`](crate::Error::Tokenizer) when the tokenizer lacks
    /// `<|im_end|>`.
    pub fn new(tokenizer: Tokenizer) -> Result<Self> {
        Self::with_options(tokenizer, Qwen3_8Options::default())
    }

    /// A renderer configured by `options`.
    ///
    /// Errors: [`Error::Tokenizer`](crate::Error::Tokenizer) when the tokenizer lacks
    /// `<|im_end|>`.
    pub fn with_options(tokenizer: Tokenizer, options: Qwen3_8Options) -> Result<Self> {
        let name = if options.disable_thinking {
            "qwen3_8_disable_thinking".to_owned()
        } else {
            format!("qwen3_8_{}_reasoning", options.reasoning_effort.as_str())
        };
        Ok(Qwen3_8Renderer {
            core: Qwen3Core::new(
                name,
                tokenizer,
                options.strip_thinking_from_history,
                options.merge_text_chunks,
            )?,
            options,
        })
    }

    /// The instruction sentence for this effort; empty with thinking off.
    fn reasoning_instructions(&self) -> &'static str {
        if self.options.disable_thinking {
            ""
        } else {
            self.options.reasoning_effort.instructions()
        }
    }
}

impl Qwen3_5Hooks for Qwen3_8Renderer {
    fn core(&self) -> &Qwen3Core {
        &self.core
    }

    fn disables_thinking(&self) -> bool {
        self.options.disable_thinking
    }

    /// `_normalize_messages`: the reasoning instruction prepended to the system message (or
    /// a system message of its own, `trainable=false` when the conversation uses the flag),
    /// an empty system message dropped. Idempotent.
    fn normalize_messages<'a>(&self, messages: &'a [Message]) -> Result<Cow<'a, [Message]>> {
        let instructions = self.reasoning_instructions();
        let Some(first) = messages.first().filter(|m| m.role == Role::System) else {
            if instructions.is_empty() {
                return Ok(Cow::Borrowed(messages));
            }
            let mut synthetic = Message::system(instructions);
            if messages.iter().any(|m| m.trainable.is_some()) {
                synthetic.trainable = Some(false);
            }
            let mut out = Vec::with_capacity(messages.len() + 1);
            out.push(synthetic);
            out.extend_from_slice(messages);
            return Ok(Cow::Owned(out));
        };
        let rest = &messages[1..];
        let with_first = |content: Content| {
            let mut first = first.clone();
            first.content = content;
            let mut out = Vec::with_capacity(messages.len());
            out.push(first);
            out.extend_from_slice(rest);
            Cow::Owned(out)
        };
        let content: String = match &first.content {
            Content::Text(s) => s.clone(),
            Content::Parts(parts) => {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter_map(|p| match p {
                        ContentPart::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                if texts.len() == parts.len() {
                    // Text parts render exactly like their concatenation.
                    texts.concat()
                } else {
                    // Non-text parts (which the template rejects): just prepend.
                    if instructions.is_empty() {
                        return Ok(Cow::Borrowed(messages));
                    }
                    if let Some(ContentPart::Text { text }) = parts.first()
                        && text.starts_with(instructions)
                    {
                        return Ok(Cow::Borrowed(messages));
                    }
                    let mut new_parts = vec![ContentPart::text(format!("{instructions}\n\n"))];
                    new_parts.extend(parts.iter().cloned());
                    return Ok(with_first(Content::Parts(new_parts)));
                }
            }
        };
        let mut content = py_strip(&content).to_owned();
        if content.is_empty() && instructions.is_empty() {
            return Ok(Cow::Owned(rest.to_vec()));
        }
        let already_there =
            content == instructions || content.starts_with(&format!("{instructions}\n\n"));
        if !instructions.is_empty() && !already_there {
            content = if content.is_empty() {
                instructions.to_owned()
            } else {
                format!("{instructions}\n\n{content}")
            };
        }
        Ok(with_first(Content::Text(content)))
    }

    fn format_tool_call_argument(&self, value: &Value) -> String {
        match value {
            Value::String(s) => s.clone(),
            other => python_json_dumps(other),
        }
    }

    /// Only at or before the last user message, as the template strips.
    fn strips_thinking_for(&self, message: &Message, ctx: &RenderContext<'_>) -> bool {
        self.core.strip_thinking_from_history
            && message.role == Role::Assistant
            && at_or_before_last_user(ctx)
    }

    /// The empty block on every assistant message without a thinking part (only after the
    /// last user message when stripping history). An inline `<think>` in a string is
    /// ordinary content for Qwen3.8's template.
    fn assistant_header_suffix(&self, message: &Message, ctx: &RenderContext<'_>) -> String {
        if self.core.strip_thinking_from_history && at_or_before_last_user(ctx) {
            return String::new();
        }
        let has_reasoning = matches!(&message.content, Content::Parts(parts)
            if parts.iter().any(|p| matches!(p, ContentPart::Thinking { .. })));
        if has_reasoning {
            String::new()
        } else {
            "<think>\n\n</think>\n\n".into()
        }
    }

    fn generation_suffix_str(&self, role: &str, ctx: &RenderContext<'_>) -> String {
        if self.options.disable_thinking {
            closed_think_generation_suffix_str(role, ctx)
        } else {
            format!("{}<|im_start|>{role}\n<think>\n", maybe_newline(ctx))
        }
    }
}

impl_qwen3_message_format!(Qwen3_8Renderer);
