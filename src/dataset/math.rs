//! The competition-math datasets of the cookbook's `math_rl` recipe, with its `MathEnv` prompt:
//! MATH ([`Math`]), MATH-500 ([`Math500`]), DeepMath-103K ([`DeepMath`]), Polaris-53K
//! ([`Polaris`]), and DAPO-Math-17k ([`DapoMath`], not in the cookbook).
//!
//! Each loads from local files in its Hugging Face repository's own layout — parquet (feature
//! `parquet`) or JSONL with the same column names and types — or from the hub (feature `hub`,
//! and `parquet` for the repositories that hold parquet files), cached. A row becomes a
//! [`Problem`] whose `answer` is the reference answer the cookbook grades against and whose
//! `messages` are the prompt of [`MathEnvOptions`]: an optional few-shot prefix, then the
//! question with `" Write your answer in \boxed{} format."`. The other columns go to
//! `Problem::metadata` under their own names.
//!
//! Rows the cookbook drops (no `\boxed{}` in a MATH solution, an empty question or answer) are
//! left out and counted ([`Math::skipped`] and the like); malformed input (a field of the wrong
//! type, a missing column, invalid JSON) is an [`Error::Data`] naming the file, the line or row
//! and the field.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::dataset::table::{Columns, Record, for_each_record, is_parquet, json_kind};
use crate::dataset::{Dataset, Gsm8kOptions, MATH_ENV_SUFFIX, Problem, Shuffled};
use crate::error::{Error, Result};
use crate::reward::extract_boxed;
use crate::types::Message;

// ---------------------------------------------------------------------------------------------
// The prompt
// ---------------------------------------------------------------------------------------------

/// How a competition-math question becomes a prompt: the cookbook's `MathEnv` with its
/// `convo_prefix`.
///
/// The prompt is [`prefix`](Self::prefix) followed by one user message, the question with
/// [`suffix`](Self::suffix) appended. [`standard`](Self::standard) (the [`Default`]) is
/// `MathEnv.standard_fewshot_prefix()` — the strawberry exchange, whose question carries the
/// suffix too — and [`MATH_ENV_SUFFIX`]; [`without_prefix`](Self::without_prefix) keeps the
/// suffix and drops the exchange. Each dataset starts from its cookbook builder's choice:
/// standard for [`Math`] and [`Math500`] (`MathDatasetBuilder`), no prefix for [`DeepMath`] and
/// [`Polaris`] (their builders pass no `convo_prefix`) and for [`DapoMath`].
///
/// ```
/// use rlvr::dataset::MathEnvOptions;
/// use rlvr::message::Role;
///
/// let messages = MathEnvOptions::standard().messages("What is $1 + 1$?");
/// assert_eq!(messages.len(), 3);
/// assert_eq!(messages[0].content, "How many r's are in strawberry? Write your answer in \\boxed{} format.");
/// assert_eq!(messages[1].role, Role::Assistant);
/// assert_eq!(messages[2].content, "What is $1 + 1$? Write your answer in \\boxed{} format.");
///
/// let bare = MathEnvOptions::without_prefix().messages("What is $1 + 1$?");
/// assert_eq!(bare.len(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MathEnvOptions {
    /// The messages before the question (the cookbook's `convo_prefix`).
    pub prefix: Vec<Message>,
    /// Appended to every question (`MathEnv.question_suffix()`).
    pub suffix: String,
}

impl Default for MathEnvOptions {
    fn default() -> Self {
        Self::standard()
    }
}

impl MathEnvOptions {
    /// The standard few-shot prefix and [`MATH_ENV_SUFFIX`] (`MathDatasetBuilder`'s default).
    pub fn standard() -> Self {
        MathEnvOptions {
            prefix: Self::standard_prefix(),
            suffix: MATH_ENV_SUFFIX.to_string(),
        }
    }

    /// No prefix, [`MATH_ENV_SUFFIX`] (`PolarisDatasetBuilder`, `DeepMathDatasetBuilder`).
    pub fn without_prefix() -> Self {
        MathEnvOptions {
            prefix: Vec::new(),
            suffix: MATH_ENV_SUFFIX.to_string(),
        }
    }

    /// `MathEnv.standard_fewshot_prefix()`: the user asks `How many r's are in strawberry?`
    /// with [`MATH_ENV_SUFFIX`], the assistant spells the word out and answers `\boxed{3}`.
    pub fn standard_prefix() -> Vec<Message> {
        Gsm8kOptions::math_env().prefix_messages()
    }

    /// The same options with another prefix (builder style).
    pub fn with_prefix(mut self, prefix: Vec<Message>) -> Self {
        self.prefix = prefix;
        self
    }

    /// The same options with another suffix, appended verbatim (builder style).
    pub fn with_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.suffix = suffix.into();
        self
    }

    /// The prompt for `question`: the prefix, then the question with the suffix.
    pub fn messages(&self, question: &str) -> Vec<Message> {
        let mut messages = Vec::with_capacity(self.prefix.len() + 1);
        messages.extend(self.prefix.iter().cloned());
        messages.push(Message::user(format!("{question}{}", self.suffix)));
        messages
    }
}

// ---------------------------------------------------------------------------------------------
// What every dataset here shares
// ---------------------------------------------------------------------------------------------

/// One loaded problem.
#[derive(Debug, Clone)]
struct Row {
    id: String,
    question: String,
    answer: String,
    metadata: BTreeMap<String, Value>,
}

/// The loaded rows and the prompt options.
#[derive(Clone)]
struct Core {
    sources: Vec<PathBuf>,
    rows: Arc<Vec<Row>>,
    skipped: usize,
    options: MathEnvOptions,
}

impl Core {
    fn new(sources: Vec<PathBuf>, rows: Vec<Row>, skipped: usize, options: MathEnvOptions) -> Self {
        Core {
            sources,
            rows: Arc::new(rows),
            skipped,
            options,
        }
    }

    fn get(&self, index: usize) -> Result<Problem> {
        let row = self.rows.get(index).ok_or_else(|| {
            Error::config(
                "index",
                format!(
                    "problem {index} out of range (dataset has {})",
                    self.rows.len()
                ),
            )
        })?;
        Ok(Problem {
            id: row.id.clone(),
            question: row.question.clone(),
            answer: row.answer.clone(),
            messages: self.options.messages(&row.question),
            metadata: row.metadata.clone(),
        })
    }

    fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("sources", &self.sources)
            .field("len", &self.rows.len())
            .field("skipped", &self.skipped)
            .field("options", &self.options)
            .finish()
    }
}

/// The accessors every dataset of this module has, and its [`Dataset`] implementation.
macro_rules! common_methods {
    ($name:ident) => {
        impl $name {
            /// The same dataset with other prompt options.
            pub fn with_options(mut self, options: MathEnvOptions) -> Self {
                self.core.options = options;
                self
            }

            /// The prompt options.
            pub fn options(&self) -> &MathEnvOptions {
                &self.core.options
            }

            /// How many rows were left out while loading because the cookbook would not make
            /// a problem of them (see the type's documentation).
            pub fn skipped(&self) -> usize {
                self.core.skipped
            }

            /// The files the rows were loaded from, in order.
            pub fn sources(&self) -> &[PathBuf] {
                &self.core.sources
            }

            /// The dataset in the fixed order of
            /// [`shuffled_indices`](crate::dataset::shuffled_indices) for `seed` (not the
            /// cookbook's order: it shuffles with Hugging Face `datasets`, NumPy's PCG64).
            pub fn shuffled(self, seed: u64) -> Shuffled<Self> {
                Shuffled::new(self, seed)
            }
        }

        impl Dataset for $name {
            fn len(&self) -> usize {
                self.core.rows.len()
            }

            fn get(&self, index: usize) -> Result<Problem> {
                self.core.get(index)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.core.debug(stringify!($name), f)
            }
        }
    };
}

/// A skipped row, logged like the cookbook's warning (once per file).
fn warn_skipped(path: &Path, skipped: usize, why: &str) {
    if skipped > 0 {
        tracing::warn!("{}: skipped {skipped} rows {why}", path.display());
    }
}

/// A string field that may be empty: `None` when missing, null or empty (Python's falsy
/// `x.get(name, "")`).
fn non_empty<'r>(record: &'r Record<'_>, name: &str) -> Result<Option<&'r str>> {
    Ok(record.opt_str(name)?.filter(|s| !s.is_empty()))
}

/// Moves the listed fields of `record` into a metadata map (absent ones are left out).
fn metadata_of(record: &mut Record<'_>, names: &[&str]) -> BTreeMap<String, Value> {
    names
        .iter()
        .filter_map(|&n| record.fields.remove(n).map(|v| (n.to_string(), v)))
        .collect()
}

/// `train-00000-of-00001.parquet` → `train`, `test.jsonl` → `test`.
fn file_stem(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.split(['.', '-'])
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Downloads `files` of `repo` (or finds them in the cache), in order.
#[cfg(all(feature = "hub", feature = "parquet"))]
async fn fetch(
    hub: &crate::hub::Hub,
    repo: &crate::hub::HubRepo,
    files: &[String],
) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::with_capacity(files.len());
    for file in files {
        paths.push(hub.get(repo, file).await?);
    }
    Ok(paths)
}

/// `Error::Io` (not found) for a directory that lacks the expected files.
fn not_found(what: &str, dir: &Path, tried: &[PathBuf]) -> Error {
    let tried: Vec<String> = tried
        .iter()
        .map(|p| p.strip_prefix(dir).unwrap_or(p).display().to_string())
        .collect();
    let parquet_note = if cfg!(feature = "parquet") {
        ""
    } else {
        " (parquet needs the `parquet` feature)"
    };
    Error::io(
        "looking for the files of",
        dir,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{what}: none of {}{parquet_note}", tried.join(", ")),
        ),
    )
}

/// The first of `candidates` (relative to `dir`) that exists; parquet files only with the
/// `parquet` feature.
fn first_existing(dir: &Path, candidates: &[String]) -> Option<PathBuf> {
    candidates
        .iter()
        .map(|c| dir.join(c))
        .find(|p| p.is_file() && (cfg!(feature = "parquet") || !is_parquet(p)))
}

// ---------------------------------------------------------------------------------------------
// MATH
// ---------------------------------------------------------------------------------------------

/// MATH (Hendrycks et al.): 12,500 competition problems in seven subjects, from
/// [`EleutherAI/hendrycks_math`](https://huggingface.co/datasets/EleutherAI/hendrycks_math).
///
/// The cookbook's MATH training set is every row of all seven configurations
/// ([`CONFIGS`](Self::CONFIGS)), train and test splits, minus the problems of MATH-500
/// ([`excluding`](Self::excluding)): 12,000 problems, evaluated on [`Math500`]. Columns
/// `problem`, `level`, `type`, `solution` (strings). Each row becomes a problem with:
///
/// - `id` = `math/{config}/{split}/{row}` (0-based row of its file; for a file outside the hub
///   layout, its directory's name and its name up to the first `.` or `-`);
/// - `question` = `problem`;
/// - `answer` = [`extract_boxed`] of `solution` — a row whose solution has no box is skipped
///   and counted in [`skipped`](Self::skipped) (the cookbook logs "No answer found" and makes
///   no environment for it);
/// - `metadata` = `solution`, `level`, `type`;
/// - `messages` = [`MathEnvOptions::standard`] by default.
///
/// ```
/// use rlvr::dataset::{Math, Math500};
/// use rlvr::Dataset;
///
/// # fn main() -> rlvr::Result<()> {
/// let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/math_datasets");
/// let test = Math500::from_file(format!("{fixtures}/MATH-500/test.jsonl"))?;
/// let train = Math::from_dir(format!("{fixtures}/hendrycks_math"))?.excluding(&test);
/// assert_eq!(train.excluded(), 2);
/// let first = train.get(0)?;
/// assert_eq!(first.id, "math/algebra/train/0");
/// assert_eq!(first.answer, "4");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Math {
    core: Core,
    excluded: usize,
}

common_methods!(Math);

impl Math {
    /// The hub repository.
    pub const HUB_REPO: &'static str = "EleutherAI/hendrycks_math";

    /// The configurations (subjects), in the order the cookbook concatenates them.
    pub const CONFIGS: [&'static str; 7] = [
        "algebra",
        "counting_and_probability",
        "geometry",
        "intermediate_algebra",
        "number_theory",
        "prealgebra",
        "precalculus",
    ];

    /// The parquet files of the hub layout, in the cookbook's order: for each configuration,
    /// `{config}/train-00000-of-00001.parquet` then `{config}/test-00000-of-00001.parquet`.
    pub fn hub_files() -> Vec<String> {
        Self::CONFIGS
            .iter()
            .flat_map(|c| ["train", "test"].map(|s| format!("{c}/{s}-00000-of-00001.parquet")))
            .collect()
    }

    /// Loads MATH files (parquet or JSONL, by extension), concatenated in the order given.
    ///
    /// Errors: [`Error::Io`] if a file cannot be read; [`Error::Data`] naming the file, the
    /// line or row and the field for a missing, null or non-string `problem` or `solution`, or
    /// a missing column.
    pub fn from_files<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> Result<Self> {
        let labelled = paths.into_iter().map(|p| {
            let path = p.as_ref().to_path_buf();
            let dir = path
                .parent()
                .and_then(|d| d.file_name())
                .map(|d| d.to_string_lossy().into_owned())
                .unwrap_or_default();
            let label = match dir.as_str() {
                "" => file_stem(&path),
                dir => format!("{dir}/{}", file_stem(&path)),
            };
            (path, label)
        });
        Self::from_labelled(labelled.collect())
    }

    /// Loads all of MATH from a directory in the hub layout: for each configuration and split,
    /// `{config}/{split}-00000-of-00001.parquet` (feature `parquet`) or else
    /// `{config}/{split}.jsonl`.
    ///
    /// Errors: [`Error::Io`] (not found) naming the first configuration and split without a
    /// file; any error of [`from_files`](Self::from_files).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let mut files = Vec::new();
        for config in Self::CONFIGS {
            for split in ["train", "test"] {
                let candidates = [
                    format!("{config}/{split}-00000-of-00001.parquet"),
                    format!("{config}/{split}.jsonl"),
                ];
                let path = first_existing(dir, &candidates).ok_or_else(|| {
                    let tried: Vec<PathBuf> = candidates.iter().map(|c| dir.join(c)).collect();
                    not_found(&format!("MATH {config} {split}"), dir, &tried)
                })?;
                files.push((path, format!("{config}/{split}")));
            }
        }
        Self::from_labelled(files)
    }

    fn from_labelled(files: Vec<(PathBuf, String)>) -> Result<Self> {
        let columns = Columns {
            required: &["problem", "solution"],
            optional: &["level", "type"],
        };
        let mut rows = Vec::new();
        let mut skipped = 0;
        for (path, label) in &files {
            let mut file_skipped = 0;
            for_each_record(path, &columns, &mut |mut record| {
                let question = record.req_str("problem")?.to_string();
                let solution = record.req_str("solution")?;
                let Some(answer) = extract_boxed(solution) else {
                    file_skipped += 1;
                    return Ok(());
                };
                let id = format!("math/{label}/{}", record.index);
                let metadata = metadata_of(&mut record, &["solution", "level", "type"]);
                rows.push(Row {
                    id,
                    question,
                    answer,
                    metadata,
                });
                Ok(())
            })?;
            warn_skipped(path, file_skipped, "whose solution has no \\boxed{} answer");
            skipped += file_skipped;
        }
        let sources = files.into_iter().map(|(p, _)| p).collect();
        Ok(Math {
            core: Core::new(sources, rows, skipped, MathEnvOptions::standard()),
            excluded: 0,
        })
    }

    /// The same dataset without the problems of `test` (exact `problem` text, as the cookbook
    /// filters): MATH minus MATH-500 is the cookbook's training set.
    pub fn excluding(mut self, test: &Math500) -> Self {
        let held_out: HashSet<&str> = test.problems.iter().map(String::as_str).collect();
        let mut rows = Arc::unwrap_or_clone(std::mem::take(&mut self.core.rows));
        let before = rows.len();
        rows.retain(|r| !held_out.contains(r.question.as_str()));
        self.excluded += before - rows.len();
        self.core.rows = Arc::new(rows);
        self
    }

    /// How many problems [`excluding`](Self::excluding) removed.
    pub fn excluded(&self) -> usize {
        self.excluded
    }

    /// The cookbook's MATH training set from the hub: downloads every file of
    /// [`HUB_REPO`](Self::HUB_REPO) ([`hub_files`](Self::hub_files)) and MATH-500
    /// ([`Math500::download`]) into the cache (or reuses the cached copies without any
    /// request) and removes the MATH-500 problems.
    ///
    /// `options` chooses the endpoint, cache directory and token ([`crate::hub::HubOptions`]).
    ///
    /// Errors: [`Error::Hub`] naming the repository and file when a download fails, or any
    /// error of the loaders.
    #[cfg(all(feature = "hub", feature = "parquet"))]
    pub async fn download(options: &crate::hub::HubOptions) -> Result<Self> {
        let hub = crate::hub::Hub::new(options)?;
        let test =
            Math500::download_from(&hub, &crate::hub::HubRepo::dataset(Math500::HUB_REPO)).await?;
        let all = Self::download_from(&hub, &crate::hub::HubRepo::dataset(Self::HUB_REPO)).await?;
        Ok(all.excluding(&test))
    }

    /// All of MATH (12,500 problems, MATH-500 included) from `repo`, a repository in the layout
    /// of [`HUB_REPO`](Self::HUB_REPO) (e.g. a mirror, or a pinned commit).
    #[cfg(all(feature = "hub", feature = "parquet"))]
    pub async fn download_from(hub: &crate::hub::Hub, repo: &crate::hub::HubRepo) -> Result<Self> {
        let files = Self::hub_files();
        let paths = fetch(hub, repo, &files).await?;
        let labelled = paths
            .into_iter()
            .zip(
                Self::CONFIGS
                    .iter()
                    .flat_map(|c| ["train", "test"].map(|s| format!("{c}/{s}"))),
            )
            .collect();
        Self::from_labelled(labelled)
    }
}

// ---------------------------------------------------------------------------------------------
// MATH-500
// ---------------------------------------------------------------------------------------------

/// MATH-500: the 500 MATH test problems commonly held out for evaluation, from
/// [`HuggingFaceH4/MATH-500`](https://huggingface.co/datasets/HuggingFaceH4/MATH-500)
/// (`test.jsonl`), the cookbook's MATH test set.
///
/// Columns `problem`, `solution`, `answer`, `subject` (strings), `level` (integer),
/// `unique_id` (string). As in the cookbook, the reference answer comes from the solution, not
/// from the `answer` column: each row becomes a problem with
///
/// - `id` = `math500/{row}` (0-based);
/// - `question` = `problem`;
/// - `answer` = [`extract_boxed`] of `solution` (a row without a box is skipped and counted);
/// - `metadata` = `solution`, `answer`, `subject`, `level`, `unique_id`;
/// - `messages` = [`MathEnvOptions::standard`] by default.
///
/// ```
/// use rlvr::dataset::Math500;
/// use rlvr::Dataset;
///
/// # fn main() -> rlvr::Result<()> {
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/math_datasets/MATH-500/test.jsonl");
/// let test = Math500::from_file(path)?;
/// let first = test.get(0)?;
/// assert_eq!(first.answer, "\\dfrac{29}{2}");
/// assert_eq!(first.metadata["answer"], "\\frac{29}{2}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Math500 {
    core: Core,
    /// Every row's `problem`, skipped rows included (what [`Math::excluding`] removes).
    problems: Arc<Vec<String>>,
}

common_methods!(Math500);

impl Math500 {
    /// The hub repository.
    pub const HUB_REPO: &'static str = "HuggingFaceH4/MATH-500";

    /// The file of the hub repository.
    pub const HUB_FILE: &'static str = "test.jsonl";

    /// Loads a MATH-500 file (parquet or JSONL, by extension).
    ///
    /// Errors: [`Error::Io`] if the file cannot be read; [`Error::Data`] naming the file, the
    /// line or row and the field for a missing, null or non-string `problem` or `solution`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let columns = Columns {
            required: &["problem", "solution"],
            optional: &["answer", "subject", "level", "unique_id"],
        };
        let mut rows = Vec::new();
        let mut problems = Vec::new();
        let mut skipped = 0;
        for_each_record(path, &columns, &mut |mut record| {
            let question = record.req_str("problem")?.to_string();
            let solution = record.req_str("solution")?;
            problems.push(question.clone());
            let Some(answer) = extract_boxed(solution) else {
                skipped += 1;
                return Ok(());
            };
            let id = format!("math500/{}", record.index);
            let metadata = metadata_of(
                &mut record,
                &["solution", "answer", "subject", "level", "unique_id"],
            );
            rows.push(Row {
                id,
                question,
                answer,
                metadata,
            });
            Ok(())
        })?;
        warn_skipped(path, skipped, "whose solution has no \\boxed{} answer");
        Ok(Math500 {
            core: Core::new(
                vec![path.to_path_buf()],
                rows,
                skipped,
                MathEnvOptions::standard(),
            ),
            problems: Arc::new(problems),
        })
    }

    /// Downloads [`HUB_FILE`](Self::HUB_FILE) of [`HUB_REPO`](Self::HUB_REPO) into the cache
    /// (or reuses the cached copy without any request) and loads it.
    ///
    /// Errors: [`Error::Hub`] naming the repository and file when the download fails, or any
    /// error of [`from_file`](Self::from_file).
    #[cfg(feature = "hub")]
    pub async fn download(options: &crate::hub::HubOptions) -> Result<Self> {
        let hub = crate::hub::Hub::new(options)?;
        Self::download_from(&hub, &crate::hub::HubRepo::dataset(Self::HUB_REPO)).await
    }

    /// Like [`download`](Self::download), from another repository or revision with the same
    /// layout.
    #[cfg(feature = "hub")]
    pub async fn download_from(hub: &crate::hub::Hub, repo: &crate::hub::HubRepo) -> Result<Self> {
        let path = hub.get(repo, Self::HUB_FILE).await?;
        Self::from_file(path)
    }
}

// ---------------------------------------------------------------------------------------------
// DeepMath-103K
// ---------------------------------------------------------------------------------------------

/// DeepMath-103K: 103,110 hard problems with verifiable answers, from
/// [`zwhe99/DeepMath-103K`](https://huggingface.co/datasets/zwhe99/DeepMath-103K) (ten parquet
/// shards, [`hub_files`](Self::hub_files), about 2 GB: most of it the three R1 solutions of
/// each row, which are not loaded).
///
/// Columns `question`, `final_answer`, `topic`, `r1_solution_1`..`3` (strings), `difficulty`
/// (float). Each row becomes a problem with
///
/// - `id` = `deepmath/{row}` (0-based row of the concatenated files);
/// - `question` = `question`, `answer` = `final_answer` — a row where either is missing, null
///   or empty is skipped and counted, as the cookbook's `DeepMathDataset` does;
/// - `metadata` = `difficulty`, `topic`;
/// - `messages` = [`MathEnvOptions::without_prefix`] by default (`DeepMathDatasetBuilder`
///   passes no few-shot prefix).
///
/// ```
/// use rlvr::dataset::DeepMath;
/// use rlvr::Dataset;
///
/// # fn main() -> rlvr::Result<()> {
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/math_datasets/DeepMath-103K/train.jsonl");
/// let train = DeepMath::from_file(path)?;
/// assert_eq!(train.skipped(), 2);
/// assert_eq!(train.get(0)?.answer, "3");
/// assert_eq!(train.get(0)?.messages.len(), 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DeepMath {
    core: Core,
}

common_methods!(DeepMath);

impl DeepMath {
    /// The hub repository.
    pub const HUB_REPO: &'static str = "zwhe99/DeepMath-103K";

    /// The number of parquet shards of the hub repository.
    pub const HUB_SHARDS: usize = 10;

    /// The parquet shards of the hub repository, in order:
    /// `data/train-0000{i}-of-00010.parquet`.
    pub fn hub_files() -> Vec<String> {
        (0..Self::HUB_SHARDS)
            .map(|i| format!("data/train-{i:05}-of-{:05}.parquet", Self::HUB_SHARDS))
            .collect()
    }

    /// Loads one DeepMath file (parquet or JSONL, by extension).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_files([path])
    }

    /// Loads DeepMath files (parquet or JSONL, by extension), concatenated in the order given.
    ///
    /// Errors: [`Error::Io`] if a file cannot be read; [`Error::Data`] naming the file, the
    /// line or row and the field for a `question` or `final_answer` that is not a string, or
    /// a missing column.
    pub fn from_files<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> Result<Self> {
        let columns = Columns {
            required: &["question", "final_answer"],
            optional: &["difficulty", "topic"],
        };
        let mut rows = Vec::new();
        let mut skipped = 0;
        let mut sources = Vec::new();
        let mut offset = 0;
        for path in paths {
            let path = path.as_ref();
            let mut file_skipped = 0;
            let mut in_file = 0;
            for_each_record(path, &columns, &mut |mut record| {
                in_file += 1;
                let question = non_empty(&record, "question")?.map(str::to_owned);
                let answer = non_empty(&record, "final_answer")?.map(str::to_owned);
                let (Some(question), Some(answer)) = (question, answer) else {
                    file_skipped += 1;
                    return Ok(());
                };
                let id = format!("deepmath/{}", offset + record.index);
                let metadata = metadata_of(&mut record, &["difficulty", "topic"]);
                rows.push(Row {
                    id,
                    question,
                    answer,
                    metadata,
                });
                Ok(())
            })?;
            warn_skipped(path, file_skipped, "with an empty question or final answer");
            skipped += file_skipped;
            offset += in_file;
            sources.push(path.to_path_buf());
        }
        Ok(DeepMath {
            core: Core::new(sources, rows, skipped, MathEnvOptions::without_prefix()),
        })
    }

    /// Loads the shards of a directory in the hub layout: every `data/train-*.parquet` (feature
    /// `parquet`) or, when there is none, every `data/train-*.jsonl`, in name order.
    ///
    /// Errors: [`Error::Io`] when there is no such file, or any error of
    /// [`from_files`](Self::from_files).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let data = dir.join("data");
        let listing = std::fs::read_dir(&data).map_err(|e| Error::io("listing", &data, e))?;
        let mut names = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| Error::io("listing", &data, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        let pick = |ext: &str| -> Vec<PathBuf> {
            names
                .iter()
                .filter(|n| n.starts_with("train-") && n.ends_with(ext))
                .map(|n| data.join(n))
                .collect()
        };
        let mut files = if cfg!(feature = "parquet") {
            pick(".parquet")
        } else {
            Vec::new()
        };
        if files.is_empty() {
            files = pick(".jsonl");
        }
        if files.is_empty() {
            return Err(not_found(
                "DeepMath",
                dir,
                &[data.join("train-*.parquet"), data.join("train-*.jsonl")],
            ));
        }
        Self::from_files(files)
    }

    /// Downloads the shards of [`HUB_REPO`](Self::HUB_REPO) into the cache (or reuses the
    /// cached copies without any request) and loads them.
    ///
    /// Errors: [`Error::Hub`] naming the repository and file when a download fails (a shard
    /// the repository no longer has included), or any error of the loader.
    #[cfg(all(feature = "hub", feature = "parquet"))]
    pub async fn download(options: &crate::hub::HubOptions) -> Result<Self> {
        let hub = crate::hub::Hub::new(options)?;
        Self::download_from(&hub, &crate::hub::HubRepo::dataset(Self::HUB_REPO)).await
    }

    /// Like [`download`](Self::download), from another repository or revision with the same
    /// layout.
    #[cfg(all(feature = "hub", feature = "parquet"))]
    pub async fn download_from(hub: &crate::hub::Hub, repo: &crate::hub::HubRepo) -> Result<Self> {
        let paths = fetch(hub, repo, &Self::hub_files()).await?;
        Self::from_files(paths)
    }
}

// ---------------------------------------------------------------------------------------------
// Polaris-53K
// ---------------------------------------------------------------------------------------------

/// Polaris-Dataset-53K: 53,291 problems filtered by difficulty for RL, from
/// [`POLARIS-Project/Polaris-Dataset-53K`](https://huggingface.co/datasets/POLARIS-Project/Polaris-Dataset-53K)
/// (one JSONL file, [`HUB_FILE`](Self::HUB_FILE)).
///
/// Fields `problem`, `answer`, `difficulty` (strings; the difficulty reads like `"5/8"`). Each
/// row becomes a problem with
///
/// - `id` = `polaris/{row}` (0-based);
/// - `question` = `problem`, `answer` = `answer` — a row where either is missing, null or
///   empty is skipped and counted, as the cookbook's `PolarisDataset` does;
/// - `metadata` = `difficulty` when present;
/// - `messages` = [`MathEnvOptions::without_prefix`] by default (`PolarisDatasetBuilder`
///   passes no few-shot prefix).
///
/// ```
/// use rlvr::dataset::Polaris;
/// use rlvr::Dataset;
///
/// # fn main() -> rlvr::Result<()> {
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/math_datasets/Polaris-Dataset-53K/polaris-data-53K.jsonl");
/// let train = Polaris::from_file(path)?;
/// assert_eq!((train.len(), train.skipped()), (4, 2));
/// assert_eq!(train.get(3)?.id, "polaris/5");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Polaris {
    core: Core,
}

common_methods!(Polaris);

impl Polaris {
    /// The hub repository.
    pub const HUB_REPO: &'static str = "POLARIS-Project/Polaris-Dataset-53K";

    /// The file of the hub repository.
    pub const HUB_FILE: &'static str = "polaris-data-53K.jsonl";

    /// Loads a Polaris file (parquet or JSONL, by extension).
    ///
    /// Errors: [`Error::Io`] if the file cannot be read; [`Error::Data`] naming the file, the
    /// line or row and the field for a `problem` or `answer` that is not a string, or a
    /// missing column.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let columns = Columns {
            required: &["problem", "answer"],
            optional: &["difficulty"],
        };
        let mut rows = Vec::new();
        let mut skipped = 0;
        for_each_record(path, &columns, &mut |mut record| {
            let question = non_empty(&record, "problem")?.map(str::to_owned);
            let answer = non_empty(&record, "answer")?.map(str::to_owned);
            let (Some(question), Some(answer)) = (question, answer) else {
                skipped += 1;
                return Ok(());
            };
            let id = format!("polaris/{}", record.index);
            let metadata = metadata_of(&mut record, &["difficulty"]);
            rows.push(Row {
                id,
                question,
                answer,
                metadata,
            });
            Ok(())
        })?;
        warn_skipped(path, skipped, "with an empty problem or answer");
        Ok(Polaris {
            core: Core::new(
                vec![path.to_path_buf()],
                rows,
                skipped,
                MathEnvOptions::without_prefix(),
            ),
        })
    }

    /// Downloads [`HUB_FILE`](Self::HUB_FILE) of [`HUB_REPO`](Self::HUB_REPO) into the cache
    /// (or reuses the cached copy without any request) and loads it.
    ///
    /// Errors: [`Error::Hub`] naming the repository and file when the download fails, or any
    /// error of [`from_file`](Self::from_file).
    #[cfg(feature = "hub")]
    pub async fn download(options: &crate::hub::HubOptions) -> Result<Self> {
        let hub = crate::hub::Hub::new(options)?;
        Self::download_from(&hub, &crate::hub::HubRepo::dataset(Self::HUB_REPO)).await
    }

    /// Like [`download`](Self::download), from another repository or revision with the same
    /// layout.
    #[cfg(feature = "hub")]
    pub async fn download_from(hub: &crate::hub::Hub, repo: &crate::hub::HubRepo) -> Result<Self> {
        let path = hub.get(repo, Self::HUB_FILE).await?;
        Self::from_file(path)
    }
}

// ---------------------------------------------------------------------------------------------
// DAPO-Math-17k
// ---------------------------------------------------------------------------------------------

/// DAPO-Math-17k: the training set of DAPO (ByteDance Seed and Tsinghua AIR), from
/// [`BytedTsinghua-SIA/DAPO-Math-17k`](https://huggingface.co/datasets/BytedTsinghua-SIA/DAPO-Math-17k)
/// (one parquet file, [`HUB_FILE`](Self::HUB_FILE)). Not part of the cookbook.
///
/// Columns `data_source`, `ability` (strings), `prompt` (a list of `{content, role}`),
/// `reward_model` (`{ground_truth, style}`), `extra_info` (`{index}`). The file holds every
/// problem many times over (1,791,700 rows); a row whose user message repeats an earlier row's
/// is dropped and counted in [`duplicates`](Self::duplicates). Each other row becomes a problem
/// with
///
/// - `id` = `dapo_math/{row}` (0-based row of the file);
/// - `question` = the content of the first `user` message of `prompt`, without DAPO's
///   instruction wrapper: [`PROMPT_PREFIX`](Self::PROMPT_PREFIX) before the problem and
///   [`PROMPT_SUFFIX`](Self::PROMPT_SUFFIX) after it are removed when both are there; a
///   message without them is kept whole and counted in [`unwrapped`](Self::unwrapped);
/// - `answer` = `reward_model.ground_truth`;
/// - a row with no question or answer (missing, null or empty) is skipped and counted;
/// - `metadata` = `data_source`, `ability`, `reward_model`, `extra_info`;
/// - `messages` = [`MathEnvOptions::without_prefix`] by default (like the cookbook's other
///   large RL sets, Polaris and DeepMath).
///
/// A `prompt` that is not a list of messages, or that has no `user` message, is an
/// [`Error::Data`].
///
/// ```
/// use rlvr::dataset::DapoMath;
/// use rlvr::Dataset;
///
/// # fn main() -> rlvr::Result<()> {
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/math_datasets/DAPO-Math-17k/dapo-math-17k.jsonl");
/// let train = DapoMath::from_file(path)?;
/// assert_eq!((train.len(), train.duplicates(), train.skipped(), train.unwrapped()), (4, 1, 1, 1));
/// let first = train.get(0)?;
/// assert_eq!(first.question, "Let $x$ and $y$ be integers with $x + y = 10$ and $x - y = 4$. Find $xy$.");
/// assert_eq!(first.answer, "21");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DapoMath {
    core: Core,
    duplicates: usize,
    unwrapped: usize,
}

common_methods!(DapoMath);

impl DapoMath {
    /// The hub repository.
    pub const HUB_REPO: &'static str = "BytedTsinghua-SIA/DAPO-Math-17k";

    /// The file of the hub repository.
    pub const HUB_FILE: &'static str = "data/dapo-math-17k.parquet";

    /// What DAPO puts before each problem in its user message.
    pub const PROMPT_PREFIX: &'static str = "Solve the following math problem step by step. \
        The last line of your response should be of the form Answer: $Answer (without quotes) \
        where $Answer is the answer to the problem.\n\n";

    /// What DAPO puts after each problem in its user message.
    pub const PROMPT_SUFFIX: &'static str =
        "\n\nRemember to put your answer on its own line after \"Answer:\".";

    /// Loads a DAPO-Math file (parquet or JSONL, by extension).
    ///
    /// Errors: [`Error::Io`] if the file cannot be read; [`Error::Data`] naming the file, the
    /// line or row and the field for a malformed `prompt` or `reward_model` (wrong type, no
    /// user message), or a missing column.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let columns = Columns {
            required: &["prompt", "reward_model"],
            optional: &["data_source", "ability", "extra_info"],
        };
        let mut rows = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        let (mut skipped, mut duplicates, mut unwrapped) = (0, 0, 0);
        for_each_record(path, &columns, &mut |mut record| {
            let content = Self::user_content(&record)?;
            let truth = Self::ground_truth(&record)?;
            let Some(content) = content else {
                skipped += 1;
                return Ok(());
            };
            if !seen.insert(content.clone()) {
                duplicates += 1;
                return Ok(());
            }
            let question = match content
                .strip_prefix(Self::PROMPT_PREFIX)
                .and_then(|rest| rest.strip_suffix(Self::PROMPT_SUFFIX))
            {
                Some(inner) => inner.to_string(),
                None => {
                    unwrapped += 1;
                    content
                }
            };
            let (false, Some(answer)) = (question.is_empty(), truth) else {
                skipped += 1;
                return Ok(());
            };
            let id = format!("dapo_math/{}", record.index);
            let metadata = metadata_of(
                &mut record,
                &["data_source", "ability", "reward_model", "extra_info"],
            );
            rows.push(Row {
                id,
                question,
                answer,
                metadata,
            });
            Ok(())
        })?;
        warn_skipped(path, skipped, "with an empty question or ground truth");
        if unwrapped > 0 {
            tracing::warn!(
                "{}: {unwrapped} prompts without DAPO's instruction wrapper, kept whole",
                path.display()
            );
        }
        Ok(DapoMath {
            core: Core::new(
                vec![path.to_path_buf()],
                rows,
                skipped,
                MathEnvOptions::without_prefix(),
            ),
            duplicates,
            unwrapped,
        })
    }

    /// The content of the first user message of `prompt` (`None` when the prompt or the
    /// content is missing, null or empty).
    fn user_content(record: &Record<'_>) -> Result<Option<String>> {
        let messages = match record.fields.get("prompt") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(messages)) => messages,
            Some(other) => {
                return Err(record.error(format!(
                    "field `prompt` is {}, not a list of messages",
                    json_kind(other)
                )));
            }
        };
        for (i, message) in messages.iter().enumerate() {
            let Value::Object(message) = message else {
                return Err(record.error(format!(
                    "field `prompt[{i}]` is {}, not a message",
                    json_kind(message)
                )));
            };
            if message.get("role").and_then(Value::as_str) != Some("user") {
                continue;
            }
            return match message.get("content") {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(record.error(format!(
                    "field `prompt[{i}].content` is {}, not a string",
                    json_kind(other)
                ))),
            };
        }
        Err(record.error("field `prompt` has no user message"))
    }

    /// `reward_model.ground_truth` (`None` when missing, null or empty).
    fn ground_truth(record: &Record<'_>) -> Result<Option<String>> {
        match record.fields.get("reward_model") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(reward)) => match reward.get("ground_truth") {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok((!s.is_empty()).then(|| s.clone())),
                Some(other) => Err(record.error(format!(
                    "field `reward_model.ground_truth` is {}, not a string",
                    json_kind(other)
                ))),
            },
            Some(other) => Err(record.error(format!(
                "field `reward_model` is {}, not an object",
                json_kind(other)
            ))),
        }
    }

    /// How many rows repeated an earlier row's user message and were dropped.
    pub fn duplicates(&self) -> usize {
        self.duplicates
    }

    /// How many user messages lacked DAPO's instruction wrapper and were kept whole.
    pub fn unwrapped(&self) -> usize {
        self.unwrapped
    }

    /// Downloads [`HUB_FILE`](Self::HUB_FILE) of [`HUB_REPO`](Self::HUB_REPO) into the cache
    /// (or reuses the cached copy without any request) and loads it.
    ///
    /// Errors: [`Error::Hub`] naming the repository and file when the download fails, or any
    /// error of [`from_file`](Self::from_file).
    #[cfg(all(feature = "hub", feature = "parquet"))]
    pub async fn download(options: &crate::hub::HubOptions) -> Result<Self> {
        let hub = crate::hub::Hub::new(options)?;
        Self::download_from(&hub, &crate::hub::HubRepo::dataset(Self::HUB_REPO)).await
    }

    /// Like [`download`](Self::download), from another repository or revision with the same
    /// layout.
    #[cfg(all(feature = "hub", feature = "parquet"))]
    pub async fn download_from(hub: &crate::hub::Hub, repo: &crate::hub::HubRepo) -> Result<Self> {
        let path = hub.get(repo, Self::HUB_FILE).await?;
        Self::from_file(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_files() {
        let math = Math::hub_files();
        assert_eq!(math.len(), 14);
        assert_eq!(math[0], "algebra/train-00000-of-00001.parquet");
        assert_eq!(math[1], "algebra/test-00000-of-00001.parquet");
        assert_eq!(math[13], "precalculus/test-00000-of-00001.parquet");
        let deepmath = DeepMath::hub_files();
        assert_eq!(deepmath.len(), 10);
        assert_eq!(deepmath[0], "data/train-00000-of-00010.parquet");
        assert_eq!(deepmath[9], "data/train-00009-of-00010.parquet");
    }

    #[test]
    fn options() {
        let standard = MathEnvOptions::default();
        assert_eq!(standard, MathEnvOptions::standard());
        assert_eq!(standard.prefix.len(), 2);
        let custom = MathEnvOptions::without_prefix()
            .with_suffix(" Answer:")
            .with_prefix(vec![Message::system("Be brief.")]);
        let m = custom.messages("Q?");
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].content, "Q? Answer:");
    }

    #[test]
    fn file_stems() {
        assert_eq!(
            file_stem(Path::new("a/train-00000-of-00001.parquet")),
            "train"
        );
        assert_eq!(file_stem(Path::new("test.jsonl")), "test");
    }
}
