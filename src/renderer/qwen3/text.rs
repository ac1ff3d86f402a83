//! The Qwen3 text renderer (`Qwen3Renderer`, `Qwen3DisableThinkingRenderer`,
//! `Qwen3InstructRenderer` of the cookbook's `qwen3.py`).

use crate::error::{Error, Result};
use crate::message::{Content, ContentPart, Message, Role};
use crate::renderer::{MessageFormat, ParseTermination, RenderContext, RenderedMessage, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::types::{StopCondition, TokenId};

use super::{
    frame_thinking, im_end_token, maybe_newline, media_unsupported, parse_qwen3_tokens, qwen_role,
    qwen3_tools_prefix, tool_call_blocks_json,
};

/// Which Qwen3 text model the renderer writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Qwen3Mode {
    /// Hybrid Qwen3 with thinking on (`qwen3`): the produced turn is framed
    /// `<think>\n…\n</think>\n\n`, an empty block when the turn did not reason.
    #[default]
    Thinking,
    /// Hybrid Qwen3 with thinking off (`qwen3_disable_thinking`): the generation prompt ends
    /// with the closed empty block `<think>\n\n</think>\n\n`.
    DisableThinking,
    /// Qwen3 Instruct-2507 (`qwen3_instruct`): no `<think>` framing at all.
    Instruct,
}

/// How a [`Qwen3Renderer`] is configured (the cookbook's constructor arguments and
/// subclasses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qwen3Options {
    /// Thinking, thinking off, or Instruct-2507.
    pub mode: Qwen3Mode,
    /// Drop thinking parts from assistant messages before the last one (the Hugging Face
    /// template's behaviour, the default). `false` keeps them, which gives multi-turn RL the
    /// extension property.
    pub strip_thinking_from_history: bool,
}

impl Default for Qwen3Options {
    fn default() -> Self {
        Qwen3Options {
            mode: Qwen3Mode::Thinking,
            strip_thinking_from_history: true,
        }
    }
}

/// The Qwen3 text renderer: `qwen3`, `qwen3_disable_thinking` and `qwen3_instruct`.
///
/// Matches Hugging Face's Qwen3 chat template token for token:
///
/// ```text
/// <|im_start|>system
/// You are a helpful assistant.<|im_end|>
/// <|im_start|>user
/// What can you help me with?<|im_end|>
/// <|im_start|>assistant
/// <think>
/// [reasoning]
/// </think>
///
/// I can help you with...<|im_end|>
/// ```
///
/// Tool calls are JSON inside `<tool_call>` tags, tool responses go in a `user` turn inside
/// `<tool_response>` tags, sampling stops on `<|im_end|>`. Message content is tokenized
/// with special tokens taken literally (a user typing `<|im_end|>` does not end the turn).
/// Thinking parts of earlier assistant messages are dropped unless
/// [`strip_thinking_from_history`](Qwen3Options::strip_thinking_from_history) is off.
/// Image and audio parts are [`Error::Unsupported`].
///
/// ```
/// use rlvr::{message::{ContentPart, Message}, renderer::{ParseTermination, TrainOnWhat}, Renderer};
/// use rlvr::renderer::qwen3::Qwen3Renderer;
/// # fn main() -> rlvr::Result<()> {
/// // A character-level toy tokenizer with the ChatML special tokens, built inline.
/// let chars: Vec<String> = "abcdefghijklmnopqrstuvwxyz<>/?!.,:+= 0123456789\n"
///     .chars().map(String::from).collect();
/// let vocab: serde_json::Map<String, serde_json::Value> =
///     chars.iter().enumerate().map(|(i, c)| (c.clone(), i.into())).collect();
/// // `<think>` is an added token but not a special one, as in the real Qwen3 vocabulary.
/// let added_tokens = [("<|im_start|>", true), ("<|im_end|>", true), ("<think>", false), ("</think>", false)];
/// let added: Vec<serde_json::Value> = added_tokens.iter().enumerate().map(|(i, (t, special))| {
///     serde_json::json!({
///         "id": chars.len() + i, "content": t, "single_word": false, "lstrip": false,
///         "rstrip": false, "normalized": false, "special": special,
///     })
/// }).collect();
/// let json = serde_json::json!({
///     "version": "1.0", "added_tokens": added, "normalizer": null, "pre_tokenizer": null,
///     "post_processor": null, "decoder": {"type": "Fuse"},
///     "model": {"type": "BPE", "vocab": vocab, "merges": [], "unk_token": " "},
/// });
/// let tokenizer = rlvr::tokenizer::Tokenizer::from_bytes(json.to_string().as_bytes())?;
///
/// let renderer = Qwen3Renderer::new(tokenizer.clone())?;
/// // The same renderer by name: rlvr::renderer::by_name("qwen3", tokenizer.clone())?
/// let chat = [Message::user("1+1?")];
/// let prompt = renderer.generation_prompt(&chat)?;
/// assert_eq!(
///     tokenizer.decode(&prompt.to_tokens())?,
///     "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
/// );
///
/// // The produced turn is framed the way the template frames it.
/// let answer = Message::assistant(vec![
///     ContentPart::thinking("easy"),
///     ContentPart::text("2"),
/// ]);
/// let (input, weights) = renderer.supervised_example(
///     &[chat[0].clone(), answer.clone()],
///     TrainOnWhat::LastAssistantMessage,
/// )?;
/// let text = tokenizer.decode(&input.to_tokens())?;
/// assert!(text.ends_with("<|im_start|>assistant\n<think>\neasy\n</think>\n\n2<|im_end|>"));
/// assert_eq!(weights.iter().filter(|w| **w > 0.0).count(), 12);
///
/// // Parsing the sampled tokens gives the message back.
/// let sampled = tokenizer.encode("<think>\neasy\n</think>\n\n2<|im_end|>")?;
/// let (parsed, termination) = renderer.parse_response(&sampled);
/// assert_eq!(parsed, answer);
/// assert_eq!(termination, ParseTermination::StopSequence);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Qwen3Renderer {
    tokenizer: Tokenizer,
    /// Encodes message content with special tokens taken literally (`_content_tokenizer`).
    content_tokenizer: Tokenizer,
    end_token: TokenId,
    options: Qwen3Options,
}

impl Qwen3Renderer {
    /// The `qwen3` renderer (thinking on, history thinking stripped).
    ///
    /// Errors: [`Error::Tokenizer`] when the tokenizer lacks `<|im_end|>`.
    pub fn new(tokenizer: Tokenizer) -> Result<Self> {
        Self::with_options(tokenizer, Qwen3Options::default())
    }

    /// A renderer configured by `options`.
    ///
    /// Errors: [`Error::Tokenizer`] when the tokenizer lacks `<|im_end|>`.
    pub fn with_options(tokenizer: Tokenizer, options: Qwen3Options) -> Result<Self> {
        let name = Self::name_for(options.mode);
        let end_token = im_end_token(&tokenizer, name)?;
        let mut literal = tokenizer.inner().clone();
        literal.set_encode_special_tokens(true);
        let content_tokenizer =
            Tokenizer::new(literal, tokenizer.bos_token_id(), tokenizer.eos_token_id());
        Ok(Qwen3Renderer {
            tokenizer,
            content_tokenizer,
            end_token,
            options,
        })
    }

    /// The options the renderer was built with.
    pub fn options(&self) -> Qwen3Options {
        self.options
    }

    fn name_for(mode: Qwen3Mode) -> &'static str {
        match mode {
            Qwen3Mode::Thinking => "qwen3",
            Qwen3Mode::DisableThinking => "qwen3_disable_thinking",
            Qwen3Mode::Instruct => "qwen3_instruct",
        }
    }

    /// `frames_thinking`: whether the model uses `<think>` at all.
    fn frames_thinking(&self) -> bool {
        self.options.mode != Qwen3Mode::Instruct
    }

    /// `_frames_produced_turn`: only an assistant turn after the last user message is framed
    /// (the template's `loop.index0 > ns.last_query_index`); with history thinking kept,
    /// every assistant turn is framed alike. Never without a user message.
    fn frames_produced_turn(&self, message: &Message, ctx: &RenderContext<'_>) -> bool {
        if !self.frames_thinking() || message.role != Role::Assistant {
            return false;
        }
        if ctx.last_user_index.is_none() {
            return false;
        }
        ctx.is_last || !self.options.strip_thinking_from_history
    }

    fn output_text(&self, message: &Message, ctx: &RenderContext<'_>) -> Result<String> {
        let frames = self.frames_produced_turn(message, ctx);
        let has_reasoning = message.content.has_thinking();
        let mut output = match &message.content {
            Content::Parts(parts) => {
                let strip = self.options.strip_thinking_from_history
                    && message.role == Role::Assistant
                    && !ctx.is_last;
                let mut out = String::new();
                let mut after_block = false;
                for part in parts {
                    match part {
                        ContentPart::Thinking { thinking } => {
                            if strip {
                                continue;
                            }
                            if frames {
                                out.push_str(&frame_thinking(thinking));
                            } else {
                                out.push_str(&format!("<think>{thinking}</think>"));
                            }
                            after_block = frames;
                        }
                        ContentPart::Text { text } => {
                            out.push_str(if after_block {
                                text.trim_start_matches('\n')
                            } else {
                                text
                            });
                            after_block = false;
                        }
                        other => return Err(media_unsupported(MessageFormat::name(self), other)),
                    }
                }
                out
            }
            Content::Text(s) if frames && s.contains("</think>") => {
                // An inline block is normalized the way the template normalizes it.
                let (reasoning, rest) = s.split_once("</think>").unwrap_or((s, ""));
                let reasoning = reasoning
                    .rsplit_once("<think>")
                    .map_or(reasoning, |(_, after)| after);
                frame_thinking(reasoning) + rest.trim_start_matches('\n')
            }
            Content::Text(s) => s.clone(),
        };
        // The template's separator before tool calls asks about the message's own text, not
        // about the empty block it writes itself.
        let has_text = !output.is_empty();
        if frames && !has_reasoning {
            output = frame_thinking("") + output.trim_start_matches('\n');
        }
        if message.role == Role::Tool {
            output = format!("<tool_response>\n{output}\n</tool_response>");
        }
        if !message.tool_calls.is_empty() {
            if has_text {
                output.push('\n');
            }
            output.push_str(&tool_call_blocks_json(&message.tool_calls)?);
        }
        Ok(output)
    }
}

impl MessageFormat for Qwen3Renderer {
    fn name(&self) -> &str {
        Self::name_for(self.options.mode)
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn render_message(
        &self,
        message: &Message,
        ctx: &RenderContext<'_>,
    ) -> Result<RenderedMessage> {
        if self.options.mode == Qwen3Mode::DisableThinking
            && message.role == Role::Assistant
            && ctx.is_last
            && !message.content.is_empty()
            && ctx.last_user_index.is_none()
        {
            return Err(Error::Renderer(
                "this conversation has no user message, so Qwen3's template writes no empty \
                 think block on the produced turn -- but the generation prompt always opens \
                 one. Add a user message, or render with thinking enabled."
                    .into(),
            ));
        }
        let header = format!(
            "{}<|im_start|>{}\n",
            maybe_newline(ctx),
            qwen_role(message.role)
        );
        let output = self.output_text(message, ctx)?;
        Ok(RenderedMessage {
            header: self.tokenizer.encode(&header)?,
            output: vec![
                self.content_tokenizer.encode(&output)?,
                vec![self.end_token],
            ],
            stop_overlap: Vec::new(),
        })
    }

    fn generation_suffix(&self, role: Role, ctx: &RenderContext<'_>) -> Result<Vec<TokenId>> {
        if self.options.mode == Qwen3Mode::DisableThinking {
            // The empty block is part of the prompt, so sampling starts after it.
            return self.tokenizer.encode(&format!(
                "{}<|im_start|>{}\n<think>\n\n</think>\n\n",
                maybe_newline(ctx),
                role.as_str()
            ));
        }
        Ok(self.render_message(&Message::new(role, ""), ctx)?.header)
    }

    fn stop(&self) -> StopCondition {
        StopCondition::Tokens(vec![self.end_token])
    }

    fn parse_response(&self, tokens: &[TokenId]) -> Result<(Message, ParseTermination)> {
        parse_qwen3_tokens(
            &self.tokenizer,
            self.end_token,
            tokens,
            self.frames_thinking(),
        )
    }

    fn disables_thinking(&self) -> bool {
        self.options.mode == Qwen3Mode::DisableThinking
    }

    fn has_extension_property(&self) -> bool {
        // Instruct-2507 has no thinking to strip from history.
        self.options.mode == Qwen3Mode::Instruct || !self.options.strip_thinking_from_history
    }

    fn conversation_prefix_with_tools(
        &self,
        tools: &[ToolSpec],
        system_prompt: &str,
    ) -> Result<Vec<Message>> {
        qwen3_tools_prefix(tools, system_prompt)
    }
}
