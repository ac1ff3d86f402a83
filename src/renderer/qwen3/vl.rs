//! Qwen3-VL (`qwen3_vl.py`): the shared Qwen3-VL render path ([`super::common`]) with its
//! default hooks.

use crate::error::Result;
use crate::message::{Message, Role};
use crate::renderer::{RenderContext, RenderedMessage, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::types::TokenId;

use super::common::{Qwen3_5Hooks, Qwen3Core, render_vl_message};
use super::{impl_qwen3_message_format, qwen3_tools_prefix, tool_call_blocks_json};
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
/// # let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(br#"{"version":"1.0","added_tokens":[
/// #   {"id":10,"content":"<|im_start|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
/// #   {"id":11,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
/// #   "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":{"type":"Fuse"},
/// #   "model":{"type":"BPE","vocab":{"a":0,"b":1,"\n":2,"u":3,"s":4,"e":5,"r":6,"i":7,"t":8,"n":9},
/// #   "merges":[],"unk_token":"a"}}"#)?;
/// use rlvr::renderer::qwen3::Qwen3VlRenderer;
/// use rlvr::{message::Message, Renderer};
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
