//! GSM8K loading (JSONL, parquet, directory), reference answers, prompt styles, error
//! locations and the deterministic shuffle.

use std::path::{Path, PathBuf};

use rlvr::{
    Dataset, Gsm8k,
    dataset::{
        Gsm8kOptions, Problem, PromptStyle, Shuffled, Split, epoch_indices, shuffled_indices,
    },
};
use rlvr::{Error, message::Role};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gsm8k")
}

fn all(dataset: &impl Dataset) -> Vec<Problem> {
    (0..dataset.len())
        .map(|i| dataset.get(i).unwrap())
        .collect()
}

/// `(file, kind, location, message)` of an [`Error::Data`].
fn data_error(err: Error) -> (PathBuf, &'static str, usize, String) {
    match err {
        Error::Data {
            file,
            location_kind,
            location,
            message,
        } => (file, location_kind, location, message),
        other => panic!("expected Error::Data, got {other:?}"),
    }
}

#[test]
fn jsonl_loads_with_ids_answers_and_solutions() {
    let train = Gsm8k::from_jsonl(fixtures().join("train.jsonl")).unwrap();
    assert_eq!(train.len(), 20);
    assert_eq!(train.split_name(), "train");
    let first = train.get(0).unwrap();
    assert_eq!(first.id, "gsm8k/train/0");
    assert_eq!(first.answer, "72");
    assert!(
        first
            .question
            .starts_with("Natalia sold clips to 48 of her friends in April")
    );
    let solution = first.metadata["solution"].as_str().unwrap();
    assert!(solution.ends_with("#### 72"), "{solution}");
    // Thousands separators are removed, as the cookbook does.
    assert_eq!(train.get(18).unwrap().answer, "1080");
    assert_eq!(train.get(19).unwrap().answer, "850000");
    assert!(matches!(train.get(20), Err(Error::Config { .. })));

    let test = Gsm8k::from_jsonl(fixtures().join("test.jsonl")).unwrap();
    assert_eq!(test.len(), 10);
    let answers: Vec<String> = all(&test).into_iter().map(|p| p.answer).collect();
    assert_eq!(
        answers,
        [
            "18", "3", "70000", "540", "20", "64", "260", "160", "45", "2125"
        ]
    );
    assert_eq!(test.get(9).unwrap().id, "gsm8k/test/9");
}

#[cfg(feature = "parquet")]
#[test]
fn parquet_and_jsonl_give_identical_problems() {
    for split in [Split::Train, Split::Test] {
        let from_jsonl = Gsm8k::from_jsonl(fixtures().join(split.jsonl_path())).unwrap();
        let from_parquet = Gsm8k::from_parquet(fixtures().join(split.parquet_path())).unwrap();
        let from_dir = Gsm8k::from_dir(fixtures(), split).unwrap();
        assert_eq!(from_parquet.split_name(), split.as_str());
        assert!(from_dir.source().ends_with(split.parquet_path()));
        let problems = all(&from_jsonl);
        assert!(!problems.is_empty());
        assert_eq!(problems, all(&from_parquet), "{split}");
        assert_eq!(problems, all(&from_dir), "{split}");
    }
}

#[test]
fn from_dir_falls_back_to_jsonl_and_reports_what_it_tried() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixtures().join("test.jsonl"), dir.path().join("test.jsonl")).unwrap();
    let test = Gsm8k::from_dir(dir.path(), Split::Test).unwrap();
    assert_eq!(test.len(), 10);
    assert_eq!(test.get(0).unwrap().id, "gsm8k/test/0");

    let err = Gsm8k::from_dir(dir.path(), Split::Train).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(text.contains("main/train-00000-of-00001.parquet"), "{text}");
    assert!(text.contains("train.jsonl"), "{text}");
}

#[test]
fn prompt_styles() {
    let path = fixtures().join("test.jsonl");
    let question = Gsm8k::from_jsonl(&path).unwrap().get(0).unwrap().question;
    let tutorial_suffix = " Provide a numerical answer without units, written inside \\boxed{}.";
    let math_env_suffix = " Write your answer in \\boxed{} format.";
    let strawberry = "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a \
                      5) w 6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \
                      \\boxed{3}";

    // Default: the tutorial's prompt.
    let default = Gsm8k::from_jsonl(&path).unwrap().get(0).unwrap();
    let roles: Vec<Role> = default.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
    assert_eq!(
        default.messages[0].content,
        format!("How many r's are in strawberry?{tutorial_suffix}")
    );
    assert_eq!(default.messages[1].content, strawberry);
    assert_eq!(
        default.messages[2].content,
        format!("{question}{tutorial_suffix}")
    );
    assert_eq!(
        default.question, question,
        "the bare question has no suffix"
    );

    // The cookbook MathEnv suffix, in the few-shot turn too.
    let math_env = Gsm8k::from_jsonl(&path)
        .unwrap()
        .with_options(Gsm8kOptions::math_env())
        .get(0)
        .unwrap();
    assert_eq!(
        math_env.messages[0].content,
        format!("How many r's are in strawberry?{math_env_suffix}")
    );
    assert_eq!(math_env.messages[1].content, strawberry);
    assert_eq!(
        math_env.messages[2].content,
        format!("{question}{math_env_suffix}")
    );

    // No few-shot prefix.
    let bare = Gsm8k::from_jsonl(&path)
        .unwrap()
        .with_options(Gsm8kOptions::tutorial().without_few_shot())
        .get(0)
        .unwrap();
    assert_eq!(bare.messages.len(), 1);
    assert_eq!(bare.messages[0].role, Role::User);
    assert_eq!(
        bare.messages[0].content,
        format!("{question}{tutorial_suffix}")
    );

    // A custom suffix.
    let custom = Gsm8k::from_jsonl(&path)
        .unwrap()
        .with_options(Gsm8kOptions {
            style: PromptStyle::Custom("\nAnswer:".into()),
            few_shot: false,
        })
        .get(0)
        .unwrap();
    assert_eq!(custom.messages[0].content, format!("{question}\nAnswer:"));
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn jsonl_errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = r#"{"question": "Q?", "answer": "work\n#### 4"}"#;
    let cases = [
        (
            "bad_json.jsonl",
            format!("{good}\n{good}\n{{\"question\": \n"),
            3,
            "invalid JSON",
        ),
        (
            "not_object.jsonl",
            format!("{good}\n[1, 2]\n"),
            2,
            "expected a JSON object, found an array",
        ),
        (
            "no_question.jsonl",
            format!("{good}\n{{\"answer\": \"#### 1\"}}\n"),
            2,
            "missing field `question`",
        ),
        (
            "no_answer.jsonl",
            "{\"question\": \"Q\"}\n".to_string(),
            1,
            "missing field `answer`",
        ),
        (
            "number.jsonl",
            format!("{good}\n\n{{\"question\": 3, \"answer\": \"#### 1\"}}\n"),
            3,
            "field `question` is a number, not a string",
        ),
        (
            "no_marker.jsonl",
            format!("{good}\n{good}\n{good}\n{{\"question\": \"Q\", \"answer\": \"4\"}}\n"),
            4,
            "no `####` final answer",
        ),
    ];
    for (name, text, line, needle) in cases {
        let path = write(dir.path(), name, &text);
        let err = Gsm8k::from_jsonl(&path).unwrap_err();
        let display = err.to_string();
        let (file, kind, location, message) = data_error(err);
        assert_eq!(file, path, "{name}");
        assert_eq!((kind, location), ("line", line), "{name}: {message}");
        assert!(message.contains(needle), "{name}: {message}");
        assert!(
            display.contains(name) && display.contains(&format!("line {line}")),
            "{display}"
        );
    }

    // Invalid UTF-8 is located too.
    let path = dir.path().join("latin1.jsonl");
    std::fs::write(
        &path,
        [good.as_bytes(), b"\n{\"question\": \"caf\xe9\"}\n"].concat(),
    )
    .unwrap();
    let (_, kind, location, message) = data_error(Gsm8k::from_jsonl(&path).unwrap_err());
    assert_eq!((kind, location), ("line", 2));
    assert!(message.contains("UTF-8"), "{message}");

    // A leading byte-order mark is tolerated.
    let path = write(dir.path(), "bom.jsonl", &format!("\u{feff}{good}\n"));
    assert_eq!(
        Gsm8k::from_jsonl(&path).unwrap().get(0).unwrap().answer,
        "4"
    );

    // Blank lines are not rows; CRLF line ends are fine.
    let path = write(
        dir.path(),
        "crlf.jsonl",
        &format!("{good}\r\n\r\n{good}\r\n"),
    );
    let loaded = Gsm8k::from_jsonl(&path).unwrap();
    assert_eq!(loaded.len(), 2);
    assert_eq!(loaded.get(1).unwrap().id, "gsm8k/crlf/1");

    let missing = dir.path().join("missing.jsonl");
    assert!(matches!(
        Gsm8k::from_jsonl(&missing),
        Err(Error::Io { ref path, .. }) if *path == missing
    ));
}

#[cfg(feature = "parquet")]
mod parquet_files {
    use super::*;
    use std::sync::Arc;

    use arrow_array::types::Int32Type;
    use arrow_array::{
        ArrayRef, DictionaryArray, Int64Array, LargeStringArray, RecordBatch, StringArray,
        StringViewArray,
    };
    use parquet::arrow::ArrowWriter;

    fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) {
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let file = std::fs::File::create(path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    #[test]
    fn large_and_view_strings_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let large = dir.path().join("large.parquet");
        write_parquet(
            &large,
            vec![
                ("id", Arc::new(Int64Array::from(vec![7, 8])) as ArrayRef),
                (
                    "question",
                    Arc::new(LargeStringArray::from(vec!["A?", "B?"])),
                ),
                (
                    "answer",
                    Arc::new(LargeStringArray::from(vec!["x\n#### 1", "#### 2,000"])),
                ),
            ],
        );
        let view = dir.path().join("view.parquet");
        write_parquet(
            &view,
            vec![
                (
                    "answer",
                    Arc::new(StringViewArray::from(vec!["x\n#### 1", "#### 2,000"])) as ArrayRef,
                ),
                (
                    "question",
                    Arc::new(StringViewArray::from(vec!["A?", "B?"])),
                ),
            ],
        );
        for path in [large, view] {
            let loaded = Gsm8k::from_parquet(&path).unwrap();
            let problems = all(&loaded);
            assert_eq!(problems.len(), 2);
            assert_eq!(problems[0].question, "A?");
            assert_eq!(problems[0].answer, "1");
            assert_eq!(problems[1].answer, "2000");
        }
    }

    #[test]
    fn dictionary_encoded_strings_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dict.parquet");
        let questions: DictionaryArray<Int32Type> = vec!["A?", "B?", "A?"].into_iter().collect();
        let answers: DictionaryArray<Int32Type> = vec![Some("#### 3"), Some("x\n#### 2,000"), None]
            .into_iter()
            .collect();
        write_parquet(
            &path,
            vec![
                ("question", Arc::new(questions) as ArrayRef),
                ("answer", Arc::new(answers) as ArrayRef),
            ],
        );
        // Row 3's answer is null: an error naming the row.
        let err = Gsm8k::from_parquet(&path).unwrap_err();
        assert!(
            matches!(err, Error::Data { ref location, ref message, .. } if *location == 3 && message.contains("null")),
            "{err:?}"
        );
        let questions: DictionaryArray<Int32Type> = vec!["A?", "B?", "A?"].into_iter().collect();
        let answers: DictionaryArray<Int32Type> = vec!["#### 3", "x\n#### 2,000", "#### 3"]
            .into_iter()
            .collect();
        write_parquet(
            &path,
            vec![
                ("question", Arc::new(questions) as ArrayRef),
                ("answer", Arc::new(answers) as ArrayRef),
            ],
        );
        let problems = all(&Gsm8k::from_parquet(&path).unwrap());
        let got: Vec<(&str, &str)> = problems
            .iter()
            .map(|p| (p.question.as_str(), p.answer.as_str()))
            .collect();
        assert_eq!(got, [("A?", "3"), ("B?", "2000"), ("A?", "3")]);
    }

    #[test]
    fn parquet_errors_name_the_file_and_row() {
        let dir = tempfile::tempdir().unwrap();

        let no_answer = dir.path().join("no_answer.parquet");
        write_parquet(
            &no_answer,
            vec![(
                "question",
                Arc::new(StringArray::from(vec!["Q"])) as ArrayRef,
            )],
        );
        let (file, kind, location, message) =
            data_error(Gsm8k::from_parquet(&no_answer).unwrap_err());
        assert_eq!((file, kind, location), (no_answer, "row", 0));
        assert!(message.contains("missing column `answer`"), "{message}");

        let numeric = dir.path().join("numeric.parquet");
        write_parquet(
            &numeric,
            vec![
                (
                    "question",
                    Arc::new(StringArray::from(vec!["Q"])) as ArrayRef,
                ),
                ("answer", Arc::new(Int64Array::from(vec![4]))),
            ],
        );
        let (_, _, _, message) = data_error(Gsm8k::from_parquet(&numeric).unwrap_err());
        assert!(
            message.contains("column `answer` has type Int64"),
            "{message}"
        );

        let null = dir.path().join("null.parquet");
        write_parquet(
            &null,
            vec![
                (
                    "question",
                    Arc::new(StringArray::from(vec![Some("Q"), Some("R"), None])) as ArrayRef,
                ),
                (
                    "answer",
                    Arc::new(StringArray::from(vec!["#### 1", "#### 2", "#### 3"])),
                ),
            ],
        );
        let (file, kind, location, message) = data_error(Gsm8k::from_parquet(&null).unwrap_err());
        assert_eq!((file, kind, location), (null, "row", 3));
        assert!(message.contains("`question` is null"), "{message}");

        let no_marker = dir.path().join("no_marker.parquet");
        write_parquet(
            &no_marker,
            vec![
                (
                    "question",
                    Arc::new(StringArray::from(vec!["Q", "R"])) as ArrayRef,
                ),
                (
                    "answer",
                    Arc::new(StringArray::from(vec!["#### 1", "the answer is 2"])),
                ),
            ],
        );
        let err = Gsm8k::from_parquet(&no_marker).unwrap_err();
        assert!(
            err.to_string().contains("no_marker.parquet: row 2"),
            "{err}"
        );
        let (_, kind, location, message) = data_error(err);
        assert_eq!((kind, location), ("row", 2));
        assert!(message.contains("no `####` final answer"), "{message}");

        // A JSONL file is not parquet.
        let not_parquet = dir.path().join("train.parquet");
        std::fs::copy(fixtures().join("train.jsonl"), &not_parquet).unwrap();
        let (file, _, location, message) =
            data_error(Gsm8k::from_parquet(&not_parquet).unwrap_err());
        assert_eq!((file, location), (not_parquet, 0));
        assert!(message.contains("not a readable parquet file"), "{message}");
    }
}

#[test]
fn shuffle_order_is_pinned() {
    // These exact values pin the algorithm (ChaCha8 + Fisher–Yates + rejection sampling).
    // If this test fails, data order changed for every user: do not update it lightly.
    assert_eq!(shuffled_indices(10, 0), PINNED_10_SEED_0);
    assert_eq!(shuffled_indices(10, 1), PINNED_10_SEED_1);
    let big = shuffled_indices(7473, 0);
    assert_eq!(&big[..6], PINNED_7473_SEED_0_HEAD);
    assert_eq!(big[7472], PINNED_7473_SEED_0_LAST);
    assert_eq!(epoch_indices(10, 0, 1), shuffled_indices(10, 1));
    assert_eq!(epoch_indices(10, u64::MAX, 1), shuffled_indices(10, 0));
    assert!(shuffled_indices(0, 3).is_empty());
    assert_eq!(shuffled_indices(1, 3), [0]);
}

// Computed independently by `scripts/shuffle_order.py` (a from-scratch Python ChaCha8).
const PINNED_10_SEED_0: [usize; 10] = [3, 0, 5, 9, 6, 7, 2, 4, 1, 8];
const PINNED_10_SEED_1: [usize; 10] = [5, 6, 9, 0, 8, 4, 3, 2, 1, 7];
const PINNED_7473_SEED_0_HEAD: [usize; 6] = [1400, 5246, 2698, 6053, 6027, 5619];
const PINNED_7473_SEED_0_LAST: usize = 4275;

#[test]
fn shuffled_gsm8k_follows_the_order() {
    let train = Gsm8k::from_jsonl(fixtures().join("train.jsonl")).unwrap();
    let shuffled = train.clone().shuffled(5);
    let order = shuffled_indices(train.len(), 5);
    assert_eq!(shuffled.order(), order.as_slice());
    assert_eq!(shuffled.len(), train.len());
    for (i, &j) in order.iter().enumerate() {
        // Ids keep the original row, so a shuffled problem is traceable.
        assert_eq!(shuffled.get(i).unwrap(), train.get(j).unwrap());
    }
    assert_ne!(order, (0..train.len()).collect::<Vec<_>>());
    let again = Shuffled::new(train, 5);
    assert_eq!(all(&again), all(&shuffled));
    // Debug stays short: no rows, no permutation.
    let debug = format!("{shuffled:?}");
    assert!(
        debug.contains("len: 20") && !debug.contains("Natalia"),
        "{debug}"
    );
}
