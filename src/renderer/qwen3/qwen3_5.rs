//! Qwen3.5 (`qwen3_5.py`): the Qwen3-VL layout with the `<think>\n` prefill, empty think
//! blocks on turns after the last user message, trimmed content, grouped tool responses and
//! XML tool calls (`<function=name><parameter=p>value</parameter></function>`).

use crate::error::Result;
use crate::renderer::RenderContext;
use crate::tokenizer::Tokenizer;

use super::common::{Qwen3_5Hooks, Qwen3Core, closed_think_generation_suffix_str};
use super::{impl_qwen3_message_format, maybe_newline};

/// How a [`Qwen3_5Renderer`] is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qwen3_5Options {
    /// Thinking off (`qwen3_5_disable_thinking`): the generation prompt ends with the closed
    /// empty block `<think>\n\n</think>\n\n` instead of the open `<think>\n`.
    pub disable_thinking: bool,
    /// Drop thinking from assistant messages before the last one (default `true`; `false`
    /// is `qwen3_5_preserve_thinking`).
    pub strip_thinking_from_history: bool,
    /// Tokenize a message's text pieces as one string (default `true`).
    pub merge_text_chunks: bool,
}

impl Default for Qwen3_5Options {
    fn default() -> Self {
        Qwen3_5Options {
            disable_thinking: false,
            strip_thinking_from_history: true,
            merge_text_chunks: true,
        }
    }
}

/// The Qwen3.5 renderer, text only: `qwen3_5`, `qwen3_5_disable_thinking`,
/// `qwen3_5_preserve_thinking`.
///
/// Matches the Qwen3.5 Hugging Face template: the generation prompt ends with the prefill
/// `<|im_start|>assistant\n<think>\n` (so sampled tokens start inside the think block, and
/// parsing puts the `<think>\n` back), assistant turns after the last user message that did
/// not reason get `<think>\n\n</think>\n\n`, thinking is written
/// `<think>\n…\n</think>\n\n`, content is trimmed, consecutive tool responses share one user
/// turn, and tool calls are XML:
///
/// ```text
/// <tool_call>
/// <function=get_weather>
/// <parameter=city>
/// Paris
/// </parameter>
/// </function>
/// </tool_call>
/// ```
///
/// The behaviour is the default of the shared Qwen3.5 render path, on which Qwen3.8 (and Nemotron-3)
/// build. Image and audio parts are [`Error::Unsupported`](crate::Error::Unsupported).
///
/// ```
/// # fn main() -> rlvr::Result<()> {
/// # // A toy character-level tokenizer with the ChatML special tokens.
/// # let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(br#"{"version":"1.0","added_tokens":[
/// #   {"id":11,"content":"<|im_start|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
/// #   {"id":12,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
/// #   {"id":13,"content":"<think>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false},
/// #   {"id":14,"content":"</think>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}],
/// #   "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":{"type":"Fuse"},
/// #   "model":{"type":"BPE","vocab":{"a":0,"b":1,"\n":2,"u":3,"s":4,"e":5,"r":6,"i":7,"t":8,"n":9,"?":10},
/// #   "merges":[],"unk_token":"a"}}"#)?;
/// use rlvr::renderer::qwen3::Qwen3_5Renderer;
/// use rlvr::{message::{ContentPart, Message}, renderer::ParseTermination, Renderer};
/// let renderer = Qwen3_5Renderer::new(tokenizer.clone())?;
/// let prompt = renderer.generation_prompt(&[Message::user("ab?")])?;
/// assert_eq!(
///     tokenizer.decode(&prompt.to_tokens())?,
///     "<|im_start|>user\nab?<|im_end|>\n<|im_start|>assistant\n<think>\n"
/// );
/// // Sampling continues inside the think block; parsing restores the prefill.
/// let sampled = tokenizer.encode("ab\n</think>\n\nba<|im_end|>")?;
/// let (message, termination) = renderer.parse_response(&sampled);
/// assert_eq!(termination, ParseTermination::StopSequence);
/// assert_eq!(message, Message::assistant(vec![
///     ContentPart::thinking("ab"),
///     ContentPart::text("ba"),
/// ]));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Qwen3_5Renderer {
    core: Qwen3Core,
    disable_thinking: bool,
}

impl Qwen3_5Renderer {
    /// The `qwen3_5` renderer.
    ///
    /// Errors: [`Error::Tokenizer`](crate::Error::Tokenizer) when the tokenizer lacks
    /// `<|im_end|>`.
    pub fn new(tokenizer: Tokenizer) -> Result<Self> {
        Self::with_options(tokenizer, Qwen3_5Options::default())
    }

    /// A renderer configured by `options`.
    ///
    /// Errors: [`Error::Tokenizer`](crate::Error::Tokenizer) when the tokenizer lacks
    /// `<|im_end|>`.
    pub fn with_options(tokenizer: Tokenizer, options: Qwen3_5Options) -> Result<Self> {
        let name = if options.disable_thinking {
            "qwen3_5_disable_thinking"
        } else if options.strip_thinking_from_history {
            "qwen3_5"
        } else {
            "qwen3_5_preserve_thinking"
        };
        Ok(Qwen3_5Renderer {
            core: Qwen3Core::new(
                name,
                tokenizer,
                options.strip_thinking_from_history,
                options.merge_text_chunks,
            )?,
            disable_thinking: options.disable_thinking,
        })
    }
}

impl Qwen3_5Hooks for Qwen3_5Renderer {
    fn core(&self) -> &Qwen3Core {
        &self.core
    }

    fn disables_thinking(&self) -> bool {
        self.disable_thinking
    }

    fn generation_suffix_str(&self, role: &str, ctx: &RenderContext<'_>) -> String {
        if self.disable_thinking {
            closed_think_generation_suffix_str(role, ctx)
        } else {
            format!("{}<|im_start|>{role}\n<think>\n", maybe_newline(ctx))
        }
    }
}

impl_qwen3_message_format!(Qwen3_5Renderer);
