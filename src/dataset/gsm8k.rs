//! GSM8K (grade-school math word problems) as a [`Dataset`].
//!
//! Three sources, one result:
//!
//! - JSONL, one `{"question": ..., "answer": ...}` object per line ([`Gsm8k::from_jsonl`]);
//! - the Hugging Face parquet files `main/{train,test}-00000-of-00001.parquet`
//!   ([`Gsm8k::from_parquet`], feature `parquet`);
//! - the `openai/gsm8k` repository on the hub, cached ([`Gsm8k::download`], features `hub`
//!   and `parquet`).
//!
//! Each row becomes a [`Problem`] whose `answer` is the reference answer extracted exactly as
//! the Python cookbook does ([`extract_gsm8k_final_answer`]) and whose `messages` are the
//! prompt: an optional few-shot exchange and the question with an instruction suffix
//! ([`Gsm8kOptions`]). Malformed input is an [`Error::Data`] naming the file and the line or
//! row; nothing is skipped silently.

use std::fmt;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use regex::Regex;

use crate::dataset::{Dataset, Problem, Shuffled};
use crate::error::{Error, Result};
use crate::python::py_strip;
use crate::types::Message;

/// The instruction appended to each question by the Tinker tutorial and `rl_loop.py`
/// (the default).
pub const TUTORIAL_SUFFIX: &str =
    " Provide a numerical answer without units, written inside \\boxed{}.";

/// The instruction the cookbook's `MathEnv` appends (used by its `math_rl` GSM8K recipe).
pub const MATH_ENV_SUFFIX: &str = " Write your answer in \\boxed{} format.";

/// The few-shot question (before its suffix).
const FEW_SHOT_QUESTION: &str = "How many r's are in strawberry?";

/// The few-shot answer, identical in the tutorial and in `MathEnv`.
const FEW_SHOT_ANSWER: &str = "Let's spell the word out and number all the letters: \
1) s 2) t 3) r 4) a 5) w 6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \
\\boxed{3}";

/// The hub repository of GSM8K.
pub const GSM8K_HUB_REPO: &str = "openai/gsm8k";

/// A GSM8K split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// 7,473 problems.
    Train,
    /// 1,319 problems.
    Test,
}

impl Split {
    /// `"train"` or `"test"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "test",
        }
    }

    /// The split's parquet file in the Hugging Face layout:
    /// `main/{split}-00000-of-00001.parquet`.
    pub fn parquet_path(self) -> String {
        format!("main/{}-00000-of-00001.parquet", self.as_str())
    }

    /// The split's JSONL file name: `{split}.jsonl`.
    pub fn jsonl_path(self) -> String {
        format!("{}.jsonl", self.as_str())
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The instruction appended to every question (and to the few-shot question).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PromptStyle {
    /// [`TUTORIAL_SUFFIX`]: `" Provide a numerical answer without units, written inside
    /// \boxed{}."`, as in the Tinker tutorial and `rl_loop.py`.
    #[default]
    Tutorial,
    /// [`MATH_ENV_SUFFIX`]: `" Write your answer in \boxed{} format."`, as in the cookbook's
    /// `MathEnv`.
    MathEnv,
    /// Your own suffix, appended verbatim (include a leading space if you want one).
    Custom(String),
}

impl PromptStyle {
    /// The suffix text.
    pub fn suffix(&self) -> &str {
        match self {
            PromptStyle::Tutorial => TUTORIAL_SUFFIX,
            PromptStyle::MathEnv => MATH_ENV_SUFFIX,
            PromptStyle::Custom(s) => s,
        }
    }
}

/// How GSM8K questions are turned into prompts.
///
/// The default is the Tinker tutorial's: a one-shot example (the strawberry question with
/// the suffix, and its worked answer ending in `\boxed{3}`), then the question with
/// [`TUTORIAL_SUFFIX`].
///
/// ```
/// use rlvr::dataset::{Gsm8kOptions, PromptStyle};
/// use rlvr::message::Role;
///
/// let messages = Gsm8kOptions::default().messages("What is 2 + 2?");
/// assert_eq!(messages.len(), 3);
/// assert_eq!(messages[1].role, Role::Assistant);
/// assert_eq!(
///     messages[2].content,
///     "What is 2 + 2? Provide a numerical answer without units, written inside \\boxed{}."
/// );
///
/// let bare = Gsm8kOptions::math_env().without_few_shot().messages("What is 2 + 2?");
/// assert_eq!(bare.len(), 1);
/// assert_eq!(bare[0].content, "What is 2 + 2? Write your answer in \\boxed{} format.");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gsm8kOptions {
    /// The suffix appended to the questions.
    pub style: PromptStyle,
    /// Whether to prepend the one-shot strawberry exchange.
    pub few_shot: bool,
}

impl Default for Gsm8kOptions {
    fn default() -> Self {
        Self::tutorial()
    }
}

impl Gsm8kOptions {
    /// The tutorial's prompt (the default): few-shot prefix and [`TUTORIAL_SUFFIX`].
    pub fn tutorial() -> Self {
        Gsm8kOptions {
            style: PromptStyle::Tutorial,
            few_shot: true,
        }
    }

    /// The cookbook `MathEnv` prompt: few-shot prefix and [`MATH_ENV_SUFFIX`].
    pub fn math_env() -> Self {
        Gsm8kOptions {
            style: PromptStyle::MathEnv,
            few_shot: true,
        }
    }

    /// The same options without the few-shot prefix.
    pub fn without_few_shot(mut self) -> Self {
        self.few_shot = false;
        self
    }

    /// The same options with another prompt style.
    pub fn with_style(mut self, style: PromptStyle) -> Self {
        self.style = style;
        self
    }

    /// The few-shot messages (empty without few-shot).
    pub fn prefix_messages(&self) -> Vec<Message> {
        if !self.few_shot {
            return Vec::new();
        }
        vec![
            Message::user(format!("{FEW_SHOT_QUESTION}{}", self.style.suffix())),
            Message::assistant(FEW_SHOT_ANSWER),
        ]
    }

    /// The whole prompt conversation for `question`: the prefix, then the question with the
    /// suffix as a user message.
    pub fn messages(&self, question: &str) -> Vec<Message> {
        let mut messages = self.prefix_messages();
        messages.push(Message::user(format!("{question}{}", self.style.suffix())));
        messages
    }
}

/// One loaded row.
struct Row {
    question: String,
    /// The full `answer` field (worked solution ending in `#### N`).
    solution: String,
    /// The extracted final answer.
    answer: String,
}

/// The GSM8K dataset (one split), loaded into memory.
///
/// Problem `i` has the id `gsm8k/{split}/{i}` (0-based row), `question` the bare question,
/// `answer` the final answer ([`extract_gsm8k_final_answer`]), `messages` the prompt
/// ([`Gsm8kOptions`]) and `metadata["solution"]` the full worked solution. Cloning is cheap
/// (the rows are shared).
///
/// ```
/// use rlvr::{Dataset, Gsm8k};
///
/// # fn main() -> rlvr::Result<()> {
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gsm8k/train.jsonl");
/// let train = Gsm8k::from_jsonl(path)?;
/// let first = train.get(0)?;
/// assert_eq!(first.id, "gsm8k/train/0");
/// assert_eq!(first.answer, "72");
/// assert!(first.question.starts_with("Natalia sold clips"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Gsm8k {
    split_name: String,
    source: PathBuf,
    rows: Arc<Vec<Row>>,
    options: Gsm8kOptions,
}

impl fmt::Debug for Gsm8k {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gsm8k")
            .field("split_name", &self.split_name)
            .field("source", &self.source)
            .field("len", &self.rows.len())
            .field("options", &self.options)
            .finish()
    }
}

impl Gsm8k {
    /// Loads a JSONL file: one JSON object per line with string fields `question` and
    /// `answer` (other fields are ignored; blank lines are skipped).
    ///
    /// The split name used in problem ids is the file name up to its first `.` or `-`
    /// (`train.jsonl` → `train`); change it with [`with_split_name`](Self::with_split_name).
    ///
    /// Errors: [`Error::Io`] if the file cannot be read; [`Error::Data`] naming the file and
    /// the 1-based line for invalid JSON or UTF-8, a line that is not an object, a missing or
    /// non-string field, or an answer without a `####` final answer.
    pub fn from_jsonl(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| Error::io("opening", path, e))?;
        let reader = std::io::BufReader::new(file);
        let mut rows = Vec::new();
        for (index, line) in reader.lines().enumerate() {
            let line_no = index + 1;
            let line = line.map_err(|e| {
                if e.kind() == std::io::ErrorKind::InvalidData {
                    Error::data_line(path, line_no, "not valid UTF-8")
                } else {
                    Error::io("reading", path, e)
                }
            })?;
            // A byte-order mark (from some Windows editors) is not part of the JSON.
            let line = match (line_no, line.strip_prefix('\u{feff}')) {
                (1, Some(rest)) => rest.to_string(),
                _ => line,
            };
            if line.trim().is_empty() {
                continue;
            }
            let value: serde_json::Value = serde_json::from_str(&line)
                .map_err(|e| Error::data_line(path, line_no, format!("invalid JSON: {e}")))?;
            let object = value.as_object().ok_or_else(|| {
                Error::data_line(
                    path,
                    line_no,
                    format!("expected a JSON object, found {}", json_kind(&value)),
                )
            })?;
            let field = |name: &str| -> Result<String> {
                match object.get(name) {
                    None => Err(Error::data_line(
                        path,
                        line_no,
                        format!("missing field `{name}`"),
                    )),
                    Some(serde_json::Value::String(s)) => Ok(s.clone()),
                    Some(other) => Err(Error::data_line(
                        path,
                        line_no,
                        format!("field `{name}` is {}, not a string", json_kind(other)),
                    )),
                }
            };
            let question = field("question")?;
            let solution = field("answer")?;
            let answer = extract_gsm8k_final_answer(&solution)
                .ok_or_else(|| Error::data_line(path, line_no, NO_FINAL_ANSWER.to_string()))?;
            rows.push(Row {
                question,
                solution,
                answer,
            });
        }
        Ok(Self::from_rows(path, rows))
    }

    /// Loads a parquet file with string columns `question` and `answer` (`Utf8`, `LargeUtf8`,
    /// `Utf8View` or a dictionary of strings; other columns are ignored), such as the Hugging
    /// Face files `main/{split}-00000-of-00001.parquet`.
    ///
    /// The split name is derived from the file name as in [`from_jsonl`](Self::from_jsonl)
    /// (`train-00000-of-00001.parquet` → `train`).
    ///
    /// Errors: [`Error::Io`] if the file cannot be opened; [`Error::Data`] naming the file
    /// (row 0) for an unreadable file or a missing or non-string column, and the 1-based row
    /// for a null value or an answer without a `####` final answer.
    #[cfg(feature = "parquet")]
    pub fn from_parquet(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let rows = parquet_rows(path)?;
        Ok(Self::from_rows(path, rows))
    }

    /// Loads split `split` from a directory in the Hugging Face layout
    /// (`main/{split}-00000-of-00001.parquet`, needs feature `parquet`) or holding
    /// `{split}.jsonl`. The parquet file is preferred when both exist.
    ///
    /// Errors: [`Error::Io`] (not found) listing the paths tried, or any error of the loader.
    pub fn from_dir(dir: impl AsRef<Path>, split: Split) -> Result<Self> {
        let dir = dir.as_ref();
        #[cfg(feature = "parquet")]
        {
            let parquet = dir.join(split.parquet_path());
            if parquet.is_file() {
                return Ok(Self::from_parquet(&parquet)?.with_split_name(split.as_str()));
            }
        }
        let jsonl = dir.join(split.jsonl_path());
        if jsonl.is_file() {
            return Ok(Self::from_jsonl(&jsonl)?.with_split_name(split.as_str()));
        }
        let parquet_note = if cfg!(feature = "parquet") {
            ""
        } else {
            " (parquet needs the `parquet` feature)"
        };
        Err(Error::io(
            "looking for the GSM8K split in",
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "no {} or {}{parquet_note}",
                    split.parquet_path(),
                    split.jsonl_path()
                ),
            ),
        ))
    }

    /// Downloads split `split` of `openai/gsm8k` (the parquet file) from the hub into the
    /// cache, or reuses the cached copy without any request, and loads it.
    ///
    /// `options` chooses the endpoint, cache directory and token; unset fields follow the
    /// environment like `huggingface_hub` (`HF_ENDPOINT`, `HF_HUB_CACHE`, `HF_HOME`,
    /// `HF_TOKEN`, `HF_HUB_OFFLINE`), see [`crate::hub::HubOptions`].
    ///
    /// Errors: [`Error::Hub`] naming the repository and file when the download fails, or any
    /// error of [`from_parquet`](Self::from_parquet).
    #[cfg(all(feature = "hub", feature = "parquet"))]
    pub async fn download(split: Split, options: &crate::hub::HubOptions) -> Result<Self> {
        let hub = crate::hub::Hub::new(options)?;
        Self::download_from(&hub, &crate::hub::HubRepo::dataset(GSM8K_HUB_REPO), split).await
    }

    /// Like [`download`](Self::download), from another repository or revision with the same
    /// layout (e.g. a mirror, or a pinned commit).
    #[cfg(all(feature = "hub", feature = "parquet"))]
    pub async fn download_from(
        hub: &crate::hub::Hub,
        repo: &crate::hub::HubRepo,
        split: Split,
    ) -> Result<Self> {
        let path = hub.get(repo, &split.parquet_path()).await?;
        Ok(Self::from_parquet(&path)?.with_split_name(split.as_str()))
    }

    fn from_rows(path: &Path, rows: Vec<Row>) -> Self {
        Gsm8k {
            split_name: split_name_of(path),
            source: path.to_path_buf(),
            rows: Arc::new(rows),
            options: Gsm8kOptions::default(),
        }
    }

    /// The same dataset with other prompt options.
    pub fn with_options(mut self, options: Gsm8kOptions) -> Self {
        self.options = options;
        self
    }

    /// The same dataset with another split name in its problem ids (`gsm8k/{name}/{row}`).
    pub fn with_split_name(mut self, name: impl Into<String>) -> Self {
        self.split_name = name.into();
        self
    }

    /// The dataset in the fixed order of [`shuffled_indices`](crate::dataset::shuffled_indices)
    /// for `seed`.
    pub fn shuffled(self, seed: u64) -> Shuffled<Self> {
        Shuffled::new(self, seed)
    }

    /// The prompt options.
    pub fn options(&self) -> &Gsm8kOptions {
        &self.options
    }

    /// The split name used in problem ids.
    pub fn split_name(&self) -> &str {
        &self.split_name
    }

    /// The file the rows were loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }
}

impl Dataset for Gsm8k {
    fn len(&self) -> usize {
        self.rows.len()
    }

    fn get(&self, index: usize) -> Result<Problem> {
        let row = self.rows.get(index).ok_or_else(|| {
            Error::config(
                "index",
                format!(
                    "problem {index} out of range ({} has {} problems)",
                    self.source.display(),
                    self.rows.len()
                ),
            )
        })?;
        let mut problem = Problem::new(
            format!("gsm8k/{}/{index}", self.split_name),
            row.question.clone(),
            row.answer.clone(),
        );
        problem.messages = self.options.messages(&row.question);
        problem.metadata.insert(
            "solution".to_string(),
            serde_json::Value::String(row.solution.clone()),
        );
        Ok(problem)
    }
}

const NO_FINAL_ANSWER: &str = "field `answer` has no `####` final answer";

/// `train.jsonl` → `train`, `test-00000-of-00001.parquet` → `test`.
fn split_name_of(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.split(['.', '-']).next().unwrap_or_default();
    if stem.is_empty() {
        "data".to_string()
    } else {
        stem.to_string()
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(feature = "parquet")]
fn parquet_rows(path: &Path) -> Result<Vec<Row>> {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_schema::DataType;
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let whole_file = |message: String| Error::data_row(path, 0, message);
    let file = std::fs::File::open(path).map_err(|e| Error::io("opening", path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| whole_file(format!("not a readable parquet file: {e}")))?;
    let schema = builder.schema().clone();
    let column_index = |name: &str| -> Result<usize> {
        schema.index_of(name).map_err(|_| {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            whole_file(format!(
                "missing column `{name}` (columns: {})",
                names.join(", ")
            ))
        })
    };
    let question_index = column_index("question")?;
    let answer_index = column_index("answer")?;
    let is_string =
        |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    for (name, index) in [("question", question_index), ("answer", answer_index)] {
        let data_type = schema.field(index).data_type();
        let ok = match data_type {
            DataType::Dictionary(_, values) => is_string(values),
            other => is_string(other),
        };
        if !ok {
            return Err(whole_file(format!(
                "column `{name}` has type {data_type}, expected strings"
            )));
        }
    }
    let mask = ProjectionMask::roots(builder.parquet_schema(), [question_index, answer_index]);
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(|e| whole_file(format!("cannot read: {e}")))?;

    /// A column as optional strings (Utf8 / LargeUtf8 / Utf8View, or a dictionary of them:
    /// each key looked up in the decoded values).
    fn strings(array: &dyn Array) -> std::result::Result<Vec<Option<String>>, String> {
        let own = |it: &mut dyn Iterator<Item = Option<&str>>| -> Vec<Option<String>> {
            it.map(|v| v.map(str::to_owned)).collect()
        };
        match array.data_type() {
            DataType::Utf8 => Ok(own(&mut array.as_string::<i32>().iter())),
            DataType::LargeUtf8 => Ok(own(&mut array.as_string::<i64>().iter())),
            DataType::Utf8View => Ok(own(&mut array.as_string_view().iter())),
            DataType::Dictionary(_, _) => {
                let dict = array.as_any_dictionary_opt().ok_or_else(|| {
                    "a dictionary column that is not a dictionary array".to_string()
                })?;
                let values = strings(dict.values().as_ref())?;
                let keys = dict.normalized_keys();
                (0..array.len())
                    .map(|i| {
                        if array.is_null(i) {
                            return Ok(None);
                        }
                        let key = keys.get(i).copied().unwrap_or(usize::MAX);
                        values
                            .get(key)
                            .cloned()
                            .ok_or_else(|| format!("dictionary key {key} out of range"))
                    })
                    .collect()
            }
            other => Err(format!("unexpected type {other}")),
        }
    }

    let mut rows = Vec::new();
    for batch in reader {
        let first_row = rows.len() + 1;
        let batch =
            batch.map_err(|e| Error::data_row(path, first_row, format!("cannot decode: {e}")))?;
        let column = |name: &str| -> Result<Vec<Option<String>>> {
            let array = batch
                .column_by_name(name)
                .ok_or_else(|| whole_file(format!("missing column `{name}`")))?;
            strings(array.as_ref())
                .map_err(|e| Error::data_row(path, first_row, format!("column `{name}`: {e}")))
        };
        let questions = column("question")?;
        let solutions = column("answer")?;
        for (offset, (question, solution)) in questions.into_iter().zip(solutions).enumerate() {
            let row_no = first_row + offset;
            let question =
                question.ok_or_else(|| Error::data_row(path, row_no, "`question` is null"))?;
            let solution =
                solution.ok_or_else(|| Error::data_row(path, row_no, "`answer` is null"))?;
            let answer = extract_gsm8k_final_answer(&solution)
                .ok_or_else(|| Error::data_row(path, row_no, NO_FINAL_ANSWER))?;
            rows.push(Row {
                question,
                solution,
                answer,
            });
        }
    }
    Ok(rows)
}

/// The final answer of a GSM8K solution, exactly as the cookbook's
/// `extract_gsm8k_final_answer`:
///
/// 1. Scan the lines from the end; on the first line that, stripped, starts with `####`,
///    take the text after `####`, strip it, drop one leading `:` (and strip again), remove
///    every `,`, and strip.
/// 2. Otherwise the last match of `####\s*(.+)`, stripped (commas kept).
/// 3. Otherwise `None` (the Python raises `ValueError`).
///
/// Lines and whitespace follow Python's `str.splitlines` and `str.strip`.
///
/// ```
/// use rlvr::dataset::extract_gsm8k_final_answer;
///
/// assert_eq!(extract_gsm8k_final_answer("...\n#### 1,234").as_deref(), Some("1234"));
/// assert_eq!(extract_gsm8k_final_answer("####: 55").as_deref(), Some("55"));
/// assert_eq!(
///     extract_gsm8k_final_answer("The total is #### 99 dollars.").as_deref(),
///     Some("99 dollars.")
/// );
/// assert_eq!(extract_gsm8k_final_answer("no answer here"), None);
/// ```
pub fn extract_gsm8k_final_answer(text: &str) -> Option<String> {
    for line in py_splitlines(text).into_iter().rev() {
        let stripped = py_strip(line);
        if let Some(rest) = stripped.strip_prefix("####") {
            let mut content = py_strip(rest);
            if let Some(after_colon) = content.strip_prefix(':') {
                content = py_strip(after_colon);
            }
            return Some(py_strip(&content.replace(',', "")).to_string());
        }
    }
    static FALLBACK: OnceLock<Regex> = OnceLock::new();
    let fallback = FALLBACK.get_or_init(|| {
        // Python's `\s` also matches the information separators U+001C..U+001F.
        Regex::new(r"####[\s\x1c-\x1f]*(.+)").expect("constant regex is valid")
    });
    fallback
        .captures_iter(text)
        .last()
        .and_then(|c| c.get(1))
        .map(|m| py_strip(m.as_str()).to_string())
}

/// Python's `str.splitlines()` (without keepends).
fn py_splitlines(text: &str) -> Vec<&str> {
    let is_break = |c: char| {
        matches!(
            c,
            '\n' | '\r'
                | '\u{0b}'
                | '\u{0c}'
                | '\u{1c}'
                | '\u{1d}'
                | '\u{1e}'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        )
    };
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if is_break(c) {
            lines.push(&text[start..i]);
            let mut end = i + c.len_utf8();
            if c == '\r'
                && let Some(&(j, '\n')) = chars.peek()
            {
                chars.next();
                end = j + 1;
            }
            start = end;
        }
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookbook_doc_examples() {
        assert_eq!(
            extract_gsm8k_final_answer("...\n#### 1,234").as_deref(),
            Some("1234")
        );
        assert_eq!(
            extract_gsm8k_final_answer("####: 55").as_deref(),
            Some("55")
        );
        assert_eq!(
            extract_gsm8k_final_answer("The total is #### 99 dollars.").as_deref(),
            Some("99 dollars.")
        );
    }

    #[test]
    fn last_marker_line_wins_and_fallback_keeps_commas() {
        assert_eq!(
            extract_gsm8k_final_answer("#### 1\nwork\n  #### 2  \nmore").as_deref(),
            Some("2")
        );
        // Fallback: the marker is not at a line start; commas are kept.
        assert_eq!(
            extract_gsm8k_final_answer("a #### 1,000\nb #### 2,000 ").as_deref(),
            Some("2,000")
        );
        // Only one colon is dropped.
        assert_eq!(
            extract_gsm8k_final_answer("#### :: 5").as_deref(),
            Some(": 5")
        );
        // `\s*` in the fallback crosses line breaks, as in Python.
        assert_eq!(
            extract_gsm8k_final_answer("total ####\n 42").as_deref(),
            Some("42")
        );
        // A bare marker line gives an empty answer, as in Python.
        assert_eq!(extract_gsm8k_final_answer("x\n####").as_deref(), Some(""));
        assert_eq!(extract_gsm8k_final_answer(""), None);
    }

    #[test]
    fn python_line_breaks_and_whitespace() {
        assert_eq!(py_splitlines("a\r\nb\rc\nd"), vec!["a", "b", "c", "d"]);
        assert_eq!(py_splitlines("a\n"), vec!["a"]);
        assert_eq!(py_splitlines("a\u{2028}b\u{85}c"), vec!["a", "b", "c"]);
        assert_eq!(py_strip("\u{1f} x \u{a0}"), "x");
        assert_eq!(
            extract_gsm8k_final_answer("work\u{2028}#### 7").as_deref(),
            Some("7")
        );
    }

    #[test]
    fn split_names_from_file_names() {
        assert_eq!(split_name_of(Path::new("/d/train.jsonl")), "train");
        assert_eq!(
            split_name_of(Path::new("main/test-00000-of-00001.parquet")),
            "test"
        );
        assert_eq!(split_name_of(Path::new(".hidden")), "data");
    }

    #[test]
    fn prompt_styles() {
        let options = Gsm8kOptions::default();
        let m = options.messages("Q?");
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[0].content,
            format!("How many r's are in strawberry?{TUTORIAL_SUFFIX}")
        );
        assert!(m[1].text().ends_with("positions 3, 8, and 9. \\boxed{3}"));
        assert!(m[1].text().contains("8) r 9) r 10) y."));
        assert_eq!(m[2].content, format!("Q?{TUTORIAL_SUFFIX}"));
        let custom = Gsm8kOptions::tutorial()
            .with_style(PromptStyle::Custom(" Answer:".into()))
            .messages("Q?");
        assert_eq!(custom[0].content, "How many r's are in strawberry? Answer:");
        assert_eq!(custom[2].content, "Q? Answer:");
    }
}
