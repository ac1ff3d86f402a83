//! Qwen3.5 (`qwen3_5.py`): the Qwen3-VL layout with the `<think>\n` prefill, empty think
//! blocks on turns after the last user message, trimmed content, grouped tool responses and
//! XML tool calls (`<function=name><parameter=p>value</parameter></function>`).

use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::message::{Content, ContentPart, Message, ToolCall, UnparsedToolCall};
use crate::renderer::base::{python_json_dumps, UNTERMINATED_TOOL_BLOCK_ERROR};
use crate::renderer::{RenderContext, ToolSpec};
use crate::tokenizer::Tokenizer;
use crate::types::TokenId;

use super::vl::{Qwen3Core, Qwen3_5Hooks};
use super::{impl_qwen3_message_format, maybe_newline};
use crate::python::{py_lstrip, py_rstrip, py_strip, PY_SPACE_CLASS as WS};

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
/// The behaviour is the default of [`Qwen3_5Hooks`], on which Qwen3.8 (and Nemotron-3)
/// build. Image and audio parts are [`Error::Unsupported`](crate::Error::Unsupported).
///
/// ```
/// # fn main() -> rlvr::Result<()> {
/// # // A toy character-level tokenizer with the ChatML special tokens.
/// # let tokenizer = rlvr::Tokenizer::from_bytes(br#"{"version":"1.0","added_tokens":[
/// #   {"id":11,"content":"<|im_start|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
/// #   {"id":12,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
/// #   {"id":13,"content":"<think>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false},
/// #   {"id":14,"content":"</think>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}],
/// #   "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":{"type":"Fuse"},
/// #   "model":{"type":"BPE","vocab":{"a":0,"b":1,"\n":2,"u":3,"s":4,"e":5,"r":6,"i":7,"t":8,"n":9,"?":10},
/// #   "merges":[],"unk_token":"a"}}"#)?;
/// use rlvr::renderer::qwen3::Qwen3_5Renderer;
/// use rlvr::{ContentPart, Message, ParseTermination, Renderer};
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

/// The generation suffix of the thinking-off Qwen3.5 / Qwen3.8 renderers:
/// `<|im_start|>{role}\n<think>\n\n</think>\n\n`.
pub(crate) fn closed_think_generation_suffix_str(role: &str, ctx: &RenderContext<'_>) -> String {
    format!(
        "{}<|im_start|>{role}\n<think>\n\n</think>\n\n",
        maybe_newline(ctx)
    )
}

/// `_strip_visible_content`: the template's `content|trim` on a parts list — leading
/// whitespace stripped from the first visible text parts (until one keeps some text),
/// trailing whitespace from the last ones; thinking parts are skipped, a non-text visible
/// part stops the stripping.
pub(crate) fn strip_visible_content(parts: &[ContentPart]) -> Vec<ContentPart> {
    let mut parts = parts.to_vec();
    let visible: Vec<usize> = parts
        .iter()
        .enumerate()
        .filter(|(_, p)| !matches!(p, ContentPart::Thinking { .. }))
        .map(|(i, _)| i)
        .collect();
    type Strip = fn(&str) -> &str;
    let backwards: Vec<usize> = visible.iter().rev().copied().collect();
    let passes: [(&[usize], Strip); 2] = [(&visible, py_lstrip), (&backwards, py_rstrip)];
    for (indices, strip) in passes {
        for &i in indices {
            let ContentPart::Text { text } = &parts[i] else {
                break;
            };
            let stripped = strip(text).to_owned();
            let done = !stripped.is_empty();
            parts[i] = ContentPart::Text { text: stripped };
            if done {
                break;
            }
        }
    }
    parts
}

/// Qwen3.5's `_normalize_response_tokens`: the prefilled `<think>\n` put back in front of a
/// response that contains `</think>` but does not start with `<think>\n`.
pub(crate) fn qwen3_5_normalize_response_tokens(
    tokenizer: &Tokenizer,
    tokens: &[TokenId],
) -> Result<Vec<TokenId>> {
    let prefix = tokenizer.encode("<think>\n")?;
    let suffix = tokenizer.encode("</think>")?;
    let [close] = suffix[..] else {
        return Err(Error::Renderer(format!(
            "`</think>` must be a single token, the tokenizer gives {}",
            suffix.len()
        )));
    };
    let starts_with_think = tokens.len() >= prefix.len() && tokens[..prefix.len()] == prefix[..];
    if !starts_with_think && tokens.contains(&close) {
        let mut out = prefix;
        out.extend_from_slice(tokens);
        return Ok(out);
    }
    Ok(tokens.to_vec())
}

/// Qwen3.5's `_postprocess_parsed_message`, applied to a cleanly terminated parse:
///
/// 1. thinking parts up to the first text after thinking are whitespace-trimmed (the
///    template's `|trim`);
/// 2. that text loses the two separator newlines after `</think>`;
/// 3. `<tool_call>` blocks that failed as JSON but hold `<function=` are parsed as Qwen3.5
///    XML ([`parse_qwen3_5_tool_call_xml`]) and appended to the tool calls; an unterminated
///    block keeps its error.
pub fn qwen3_5_postprocess_parsed_message(message: &mut Message) {
    if let Content::Parts(parts) = &mut message.content {
        let mut seen_thinking = false;
        let mut first_text = None;
        for (i, part) in parts.iter_mut().enumerate() {
            match part {
                ContentPart::Thinking { thinking } => {
                    *thinking = py_strip(thinking).to_owned();
                    seen_thinking = true;
                }
                ContentPart::Text { .. } if seen_thinking => {
                    first_text = Some(i);
                    break;
                }
                _ => {}
            }
        }
        if let Some(ContentPart::Text { text }) = first_text.map(|i| &mut parts[i]) {
            if let Some(rest) = text.strip_prefix("\n\n") {
                *text = rest.to_owned();
            }
        }
    }

    let mut converted = Vec::new();
    let mut remaining = Vec::new();
    for unparsed in std::mem::take(&mut message.unparsed_tool_calls) {
        if unparsed.error.starts_with(UNTERMINATED_TOOL_BLOCK_ERROR)
            || !unparsed.raw_text.contains("<function=")
        {
            remaining.push(unparsed);
            continue;
        }
        match parse_qwen3_5_tool_call_xml(&unparsed.raw_text) {
            Ok(call) => converted.push(call),
            Err(bad) => remaining.push(bad),
        }
    }
    message.tool_calls.extend(converted);
    message.unparsed_tool_calls = remaining;
}

fn function_block_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(&format!(
            r"(?s)\A{WS}*<tool_call>{WS}*<function=(?P<name>[^>\n]+)>{WS}*(?P<body>.*?){WS}*</function>{WS}*</tool_call>{WS}*\z"
        ))
        .unwrap_or_else(|e| panic!("static regex: {e}"))
    })
}

fn param_block_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(&format!(
            r"(?s)<parameter=(?P<name>[^>\n]+)>{WS}*(?P<value>.*?){WS}*</parameter>"
        ))
        .unwrap_or_else(|e| panic!("static regex: {e}"))
    })
}

/// `_parse_qwen3_5_tool_call_xml`: a raw `<tool_call>…</tool_call>` block in Qwen3.5's XML
/// format as a [`ToolCall`] (each parameter value parsed as JSON when it is JSON, kept as a
/// string otherwise; the arguments are Python's `json.dumps` of the object), or an
/// [`UnparsedToolCall`] saying what is wrong.
pub fn parse_qwen3_5_tool_call_xml(
    raw_text: &str,
) -> std::result::Result<ToolCall, UnparsedToolCall> {
    let unparsed = |error: &str| UnparsedToolCall {
        raw_text: raw_text.to_owned(),
        error: error.to_owned(),
    };
    let Some(caps) = function_block_regex().captures(raw_text) else {
        return Err(unparsed("Malformed Qwen3.5 tool call XML"));
    };
    let name = py_strip(&caps["name"]);
    if name.is_empty() {
        return Err(unparsed("Missing function name"));
    }
    let body = &caps["body"];
    let mut arguments = serde_json::Map::new();
    let mut pos = 0;
    for param in param_block_regex().captures_iter(body) {
        let whole = param.get(0).expect("group 0 always matches");
        if !py_strip(&body[pos..whole.start()]).is_empty() {
            return Err(unparsed(
                "Unexpected non-parameter content inside <function> block",
            ));
        }
        let param_name = py_strip(&param["name"]);
        let value_text = param["value"].trim_matches('\n');
        if param_name.is_empty() {
            return Err(unparsed("Empty parameter name"));
        }
        let value = serde_json::from_str::<Value>(value_text)
            .unwrap_or_else(|_| Value::String(value_text.to_owned()));
        arguments.insert(param_name.to_owned(), value);
        pos = whole.end();
    }
    if !py_strip(&body[pos..]).is_empty() {
        return Err(unparsed(
            "Unexpected trailing content inside <function> block",
        ));
    }
    Ok(ToolCall::new(
        name,
        python_json_dumps(&Value::Object(arguments)),
    ))
}

/// Qwen3.5's `create_conversation_prefix_with_tools`: one system message with the tools as
/// JSON lines and the XML calling instructions, then the system prompt.
pub(crate) fn qwen3_5_tools_prefix(
    tools: &[ToolSpec],
    system_prompt: &str,
) -> Result<Vec<Message>> {
    let mut tools_text = String::new();
    if !tools.is_empty() {
        let lines = tools
            .iter()
            .map(|t| {
                serde_json::to_value(t)
                    .map(|v| python_json_dumps(&v))
                    .map_err(|e| Error::Renderer(format!("tool `{}`: {e}", t.name)))
            })
            .collect::<Result<Vec<_>>>()?
            .join("\n");
        tools_text = xml_tools_prompt(&lines);
    }
    let content = if tools_text.is_empty() {
        system_prompt.to_owned()
    } else if system_prompt.is_empty() {
        tools_text
    } else {
        format!("{tools_text}\n\n{system_prompt}")
    };
    Ok(vec![Message::system(content)])
}

/// The tool-declaration system text of the Qwen3.5 template (also Nemotron-3's): the
/// declarations (one per line) inside `<tools>`, then the XML calling convention.
pub(crate) fn xml_tools_prompt(declarations: &str) -> String {
    format!(
        "# Tools\n\nYou have access to the following functions:\n\n<tools>\n{declarations}\n</tools>\n\n\
                 If you choose to call a function ONLY reply in the following format with NO suffix:\n\n\
                 <tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n\
                 value_1\n</parameter>\n<parameter=example_parameter_2>\n\
                 This is the value for the second parameter\nthat can span\nmultiple lines\n\
                 </parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n\
                 - Function calls MUST follow the specified format: an inner <function=...></function> \
                 block must be nested within <tool_call></tool_call> XML tags\n\
                 - Required parameters MUST be specified\n\
                 - You may provide optional reasoning for your function call in natural language \
                 BEFORE the function call, but NOT after\n\
                 - If there is no function call available, answer the question like normal with \
                 your current knowledge and do not tell the user about function calls\n\
                 </IMPORTANT>"
    )
}
