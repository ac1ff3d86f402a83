//! The competition-math datasets (MATH, MATH-500, DeepMath, Polaris, DAPO-Math) and the
//! arithmetic environment: loading from parquet and JSONL in each hub schema, skipped and
//! malformed rows, MATH minus MATH-500, hub downloads, NumPy's draws, the arithmetic grader,
//! and prompt tokens equal to the cookbook's (`tests/fixtures/math_datasets/make_fixtures.py`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rlvr::dataset::{
    AdditionProblems, DapoMath, DeepMath, Math, Math500, MathEnvOptions, Polaris, Problem,
};
use rlvr::renderer::ParseTermination;
use rlvr::reward::LastInteger;
use rlvr::{Dataset, Error};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/math_datasets")
}

fn all(dataset: &impl Dataset) -> Vec<Problem> {
    (0..dataset.len())
        .map(|i| dataset.get(i).unwrap())
        .collect()
}

fn ids(dataset: &impl Dataset) -> Vec<String> {
    all(dataset).into_iter().map(|p| p.id).collect()
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

/// The MATH JSONL files in the hub order.
fn math_jsonl_files() -> Vec<PathBuf> {
    Math::CONFIGS
        .iter()
        .flat_map(|c| {
            ["train", "test"].map(|s| fixtures().join(format!("hendrycks_math/{c}/{s}.jsonl")))
        })
        .collect()
}

fn math500() -> Math500 {
    Math500::from_file(fixtures().join("MATH-500/test.jsonl")).unwrap()
}

#[test]
fn math_rows_answers_and_skips() {
    let math = Math::from_files(math_jsonl_files()).unwrap();
    // 18 rows, one solution without a box.
    assert_eq!((math.len(), math.skipped(), math.excluded()), (17, 1, 0));
    assert_eq!(math.sources().len(), 14);
    let by_id: HashMap<String, Problem> =
        all(&math).into_iter().map(|p| (p.id.clone(), p)).collect();
    assert!(
        !by_id.contains_key("math/algebra/test/1"),
        "the unboxed solution is skipped"
    );
    let answer = |id: &str| by_id[id].answer.clone();
    assert_eq!(answer("math/algebra/train/0"), "4");
    assert_eq!(answer("math/algebra/train/1"), "\\frac{29}{2}");
    assert_eq!(
        answer("math/counting_and_probability/test/0"),
        "\\dfrac{1}{4}"
    );
    assert_eq!(answer("math/geometry/test/0"), "7", "brace-less \\boxed 7");
    assert_eq!(answer("math/number_theory/train/0"), "2", "the last box");
    assert_eq!(
        answer("math/precalculus/train/0"),
        "\\begin{pmatrix} 3 \\\\ 8 \\end{pmatrix}"
    );
    let first = &by_id["math/algebra/train/0"];
    assert_eq!(first.question, "What is the value of $x$ if $2x + 3 = 11$?");
    assert_eq!(first.metadata["level"], "Level 1");
    assert_eq!(first.metadata["type"], "Algebra");
    assert!(
        first.metadata["solution"]
            .as_str()
            .unwrap()
            .ends_with("$x = \\boxed{4}$.")
    );
    // The default prompt: MathDatasetBuilder's standard few-shot prefix.
    assert_eq!(math.options(), &MathEnvOptions::standard());
    assert_eq!(first.messages.len(), 3);
    assert_eq!(
        first.messages[2].content,
        "What is the value of $x$ if $2x + 3 = 11$? Write your answer in \\boxed{} format."
    );
}

#[test]
fn math_minus_math500_is_the_training_set() {
    let test = math500();
    let train = Math::from_files(math_jsonl_files())
        .unwrap()
        .excluding(&test);
    assert_eq!((train.len(), train.excluded()), (15, 2));
    let ids = ids(&train);
    assert!(!ids.contains(&"math/algebra/train/1".to_string()));
    assert!(!ids.contains(&"math/prealgebra/test/0".to_string()));
    // Exact text only: a trailing space keeps the problem.
    assert!(ids.contains(&"math/number_theory/train/1".to_string()));
    let held_out: Vec<String> = all(&test).into_iter().map(|p| p.question).collect();
    assert!(all(&train).iter().all(|p| !held_out.contains(&p.question)));
}

#[test]
fn math500_answers_come_from_the_solution() {
    let test = math500();
    assert_eq!((test.len(), test.skipped()), (5, 0));
    let first = test.get(0).unwrap();
    assert_eq!(first.id, "math500/0");
    assert_eq!(first.answer, "\\dfrac{29}{2}");
    assert_eq!(first.metadata["answer"], "\\frac{29}{2}");
    assert_eq!(first.metadata["level"], 3);
    assert_eq!(first.metadata["unique_id"], "test/algebra/101.json");
    assert_eq!(test.get(4).unwrap().answer, "\\text{(A)}");
    assert_eq!(first.messages.len(), 3);
}

#[test]
fn deepmath_skips_empty_rows_and_never_loads_the_solutions() {
    let train = DeepMath::from_file(fixtures().join("DeepMath-103K/train.jsonl")).unwrap();
    assert_eq!((train.len(), train.skipped()), (8, 2));
    assert_eq!(
        ids(&train),
        [
            "deepmath/0",
            "deepmath/1",
            "deepmath/2",
            "deepmath/3",
            "deepmath/6",
            "deepmath/7",
            "deepmath/8",
            "deepmath/9"
        ]
    );
    let p = train.get(3).unwrap();
    assert_eq!(p.answer, "\\dfrac{1}{3}");
    assert_eq!(p.metadata["difficulty"], 2.0);
    assert_eq!(
        p.metadata.keys().collect::<Vec<_>>(),
        ["difficulty", "topic"],
        "r1 solutions are not loaded"
    );
    // DeepMathDatasetBuilder passes no few-shot prefix.
    assert_eq!(p.messages.len(), 1);
    assert_eq!(
        p.messages[0].content,
        "Compute $\\int_0^1 x^2 \\, dx$. Write your answer in \\boxed{} format."
    );
    let with_prefix = train.with_options(MathEnvOptions::standard());
    assert_eq!(with_prefix.get(3).unwrap().messages.len(), 3);
}

#[test]
fn polaris_skips_empty_rows() {
    let train =
        Polaris::from_file(fixtures().join("Polaris-Dataset-53K/polaris-data-53K.jsonl")).unwrap();
    assert_eq!((train.len(), train.skipped()), (4, 2));
    assert_eq!(
        ids(&train),
        ["polaris/0", "polaris/1", "polaris/3", "polaris/5"]
    );
    let p = train.get(2).unwrap();
    assert_eq!(p.answer, "2\\pi");
    assert_eq!(p.metadata["difficulty"], "6/8");
    assert_eq!(p.messages.len(), 1);
}

#[test]
fn dapo_unwraps_dedups_and_counts() {
    let train = DapoMath::from_file(fixtures().join("DAPO-Math-17k/dapo-math-17k.jsonl")).unwrap();
    assert_eq!(
        (
            train.len(),
            train.duplicates(),
            train.skipped(),
            train.unwrapped()
        ),
        (4, 1, 1, 1)
    );
    assert_eq!(
        ids(&train),
        ["dapo_math/0", "dapo_math/1", "dapo_math/3", "dapo_math/5"]
    );
    let p = train.get(1).unwrap();
    assert_eq!(
        p.question,
        "A rectangle has sides $6$ and $8$. If its diagonal is $d$, find $d^2$.\n\nGive the integer value."
    );
    assert_eq!(p.answer, "100");
    assert_eq!(
        p.metadata["extra_info"]["index"],
        "1f0c8f3e-0002-4000-8000-000000000002"
    );
    assert_eq!(
        p.metadata["reward_model"]["style"],
        "rule-lighteval/MATH_v2"
    );
    assert_eq!(p.metadata["data_source"], "math_dapo");
    // Without the wrapper, the message is kept whole.
    assert_eq!(
        train.get(2).unwrap().question,
        "Compute $1 + 2 + \\cdots + 20$."
    );
    assert_eq!(
        train.get(3).unwrap().question,
        "设 $n$ 为正整数，且 $n^2 = 144$。求 $n$。"
    );
    assert_eq!(p.messages.len(), 1);
}

#[cfg(feature = "parquet")]
#[test]
fn parquet_and_jsonl_give_identical_problems() {
    let f = fixtures();
    let math_parquet = Math::from_dir(f.join("hendrycks_math")).unwrap();
    assert!(math_parquet.sources()[0].ends_with("algebra/train-00000-of-00001.parquet"));
    assert_eq!(
        all(&math_parquet),
        all(&Math::from_files(math_jsonl_files()).unwrap())
    );
    assert_eq!(
        all(&Math500::from_file(f.join("MATH-500/test.parquet")).unwrap()),
        all(&math500())
    );
    let deepmath = DeepMath::from_dir(f.join("DeepMath-103K")).unwrap();
    assert_eq!(deepmath.sources().len(), 10);
    assert_eq!(
        all(&deepmath),
        all(&DeepMath::from_file(f.join("DeepMath-103K/train.jsonl")).unwrap())
    );
    assert_eq!(
        all(&Polaris::from_file(f.join("Polaris-Dataset-53K/polaris-data-53K.parquet")).unwrap()),
        all(&Polaris::from_file(f.join("Polaris-Dataset-53K/polaris-data-53K.jsonl")).unwrap())
    );
    let dapo = DapoMath::from_file(f.join("DAPO-Math-17k/data/dapo-math-17k.parquet")).unwrap();
    assert_eq!(
        (dapo.duplicates(), dapo.skipped(), dapo.unwrapped()),
        (1, 1, 1)
    );
    assert_eq!(
        all(&dapo),
        all(&DapoMath::from_file(f.join("DAPO-Math-17k/dapo-math-17k.jsonl")).unwrap())
    );
}

#[cfg(feature = "parquet")]
#[test]
fn bad_parquet_rows_name_file_row_and_field() {
    let bad = fixtures().join("bad");
    let (file, kind, row, message) =
        data_error(Math::from_files([bad.join("math_null_solution.parquet")]).unwrap_err());
    assert!(file.ends_with("math_null_solution.parquet"));
    assert_eq!(
        (kind, row, message.as_str()),
        ("row", 3, "`solution` is null")
    );

    let (_, kind, row, message) =
        data_error(Polaris::from_file(bad.join("polaris_int_answer.parquet")).unwrap_err());
    assert_eq!((kind, row), ("row", 1));
    assert_eq!(message, "field `answer` is a number, not a string");

    let (_, _, row, message) =
        data_error(DeepMath::from_file(bad.join("deepmath_no_final_answer.parquet")).unwrap_err());
    assert_eq!(row, 0, "the whole file");
    assert_eq!(
        message,
        "missing column `final_answer` (columns: question, answer)"
    );

    let (_, _, row, message) =
        data_error(DapoMath::from_file(bad.join("dapo_no_user_message.parquet")).unwrap_err());
    assert_eq!(
        (row, message.as_str()),
        (2, "field `prompt` has no user message")
    );

    let err = Math500::from_file(bad.join("missing.parquet")).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
}

#[test]
fn bad_jsonl_lines_name_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let cases: Vec<(Error, usize, &str)> = vec![
        (
            Math::from_files([write(
                "m.jsonl",
                "{\"problem\": \"Q\", \"solution\": \"\\\\boxed{1}\"}\n\n{\"problem\": \"Q\"}\n",
            )])
            .unwrap_err(),
            3,
            "missing field `solution`",
        ),
        (
            Math500::from_file(write("t.jsonl", "{\"problem\": \"Q\", \"solution\": 5}\n")).unwrap_err(),
            1,
            "field `solution` is a number, not a string",
        ),
        (
            Polaris::from_file(write("p.jsonl", "{\"problem\": [\"Q\"], \"answer\": \"1\"}\n")).unwrap_err(),
            1,
            "field `problem` is an array, not a string",
        ),
        (
            DeepMath::from_file(write("d.jsonl", "[1, 2]\n")).unwrap_err(),
            1,
            "expected a JSON object, found an array",
        ),
        (
            DapoMath::from_file(write(
                "a.jsonl",
                "{\"prompt\": \"Q\", \"reward_model\": {\"ground_truth\": \"1\"}}\n",
            ))
            .unwrap_err(),
            1,
            "field `prompt` is a string, not a list of messages",
        ),
        (
            DapoMath::from_file(write(
                "b.jsonl",
                "{\"prompt\": [{\"role\": \"user\", \"content\": \"Q\"}], \"reward_model\": {\"ground_truth\": 7}}\n",
            ))
            .unwrap_err(),
            1,
            "field `reward_model.ground_truth` is a number, not a string",
        ),
    ];
    for (err, want_line, want_message) in cases {
        let (file, kind, line, message) = data_error(err);
        assert!(file.starts_with(dir.path()), "{}", file.display());
        assert_eq!(
            (kind, line, message.as_str()),
            ("line", want_line, want_message)
        );
    }
    let (_, _, line, message) =
        data_error(Polaris::from_file(write("j.jsonl", "{\"problem\": \n")).unwrap_err());
    assert_eq!(line, 1);
    assert!(message.starts_with("invalid JSON: "), "{message}");
}

#[test]
fn a_directory_without_the_files_says_what_it_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    let err = Math::from_dir(dir.path()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(text.contains("algebra/train.jsonl"), "{text}");
    let err = DeepMath::from_dir(dir.path()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let text = DeepMath::from_dir(dir.path()).unwrap_err().to_string();
    assert!(text.contains("train-*.jsonl"), "{text}");
}

#[test]
fn shuffled_keeps_every_problem() {
    let train =
        Polaris::from_file(fixtures().join("Polaris-Dataset-53K/polaris-data-53K.jsonl")).unwrap();
    let shuffled = train.clone().shuffled(3);
    let mut got = ids(&shuffled);
    got.sort();
    let mut want = ids(&train);
    want.sort();
    assert_eq!(got, want);
}

// ---------------------------------------------------------------------------------------------
// Arithmetic
// ---------------------------------------------------------------------------------------------

#[test]
fn addition_operands_are_numpys_draws() {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("arithmetic.json")).unwrap())
            .unwrap();
    let batch_size = 20;
    let problems = AdditionProblems::new(batch_size, 1 << 32).unwrap();
    let mut checked = 0;
    for batch in doc["batches"].as_array().unwrap() {
        let index = batch["index"].as_u64().unwrap() as usize;
        let draws: Vec<u32> = serde_json::from_value(batch["draws"].clone()).unwrap();
        for k in 0..batch_size {
            let (x, y) = (draws[2 * k], draws[2 * k + 1]);
            let i = index * batch_size + k;
            assert_eq!(
                problems.operands(i),
                Some((x, y)),
                "batch {index} problem {k}"
            );
            checked += 1;
        }
        let p = problems.get(index * batch_size + 1).unwrap();
        assert_eq!(p.id, format!("arithmetic/{index}/1"));
        assert_eq!(p.question, format!("What is {} + {}?", draws[2], draws[3]));
        assert_eq!(p.answer, (draws[2] + draws[3]).to_string());
        assert_eq!(p.metadata["x"], draws[2]);
    }
    assert_eq!(checked, 200);
}

#[test]
fn last_integer_agrees_with_the_arithmetic_env() {
    let text = std::fs::read_to_string(fixtures().join("arithmetic_grader.jsonl")).unwrap();
    let grader = LastInteger::default();
    let mut n = 0;
    for line in text.lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let (answer, response) = (
            case["answer"].as_str().unwrap(),
            case["response"].as_str().unwrap(),
        );
        // `check_answer` raising (int() beyond 4,300 digits) counts as wrong.
        let want = case["correct"].as_bool().unwrap_or(false);
        let reward = grader.score(answer, response, ParseTermination::StopSequence);
        let got = reward.components["correct"] == 1.0;
        assert_eq!(
            got,
            want,
            "{answer} vs {:?}",
            &response[..response.len().min(40)]
        );
        n += 1;
    }
    assert!(n >= 100, "{n}");
}

// ---------------------------------------------------------------------------------------------
// Prompt tokens against the cookbook
// ---------------------------------------------------------------------------------------------

fn prompt_records() -> Vec<Value> {
    let compressed = std::fs::read(fixtures().join("prompts.jsonl.zst")).unwrap();
    let text = String::from_utf8(zstd::decode_all(compressed.as_slice()).unwrap()).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn prompt_tokens_match_the_cookbook() {
    let f = fixtures();
    let mut problems: HashMap<(String, String), Problem> = HashMap::new();
    let mut add = |dataset: &str, d: &dyn Dataset| {
        for i in 0..d.len() {
            let p = d.get(i).unwrap();
            problems.insert((dataset.to_string(), p.id.clone()), p);
        }
    };
    add("math", &Math::from_files(math_jsonl_files()).unwrap());
    add("math500", &math500());
    add(
        "deepmath",
        &DeepMath::from_file(f.join("DeepMath-103K/train.jsonl")).unwrap(),
    );
    add(
        "polaris",
        &Polaris::from_file(f.join("Polaris-Dataset-53K/polaris-data-53K.jsonl")).unwrap(),
    );
    add(
        "dapo_math",
        &DapoMath::from_file(f.join("DAPO-Math-17k/dapo-math-17k.jsonl")).unwrap(),
    );
    add("arithmetic", &AdditionProblems::new(4, 3).unwrap());
    add(
        "arithmetic_no_few_shot",
        &AdditionProblems::new(2, 8).unwrap().without_few_shot(),
    );

    let mut renderers = HashMap::new();
    let (mut compared, mut skipped) = (0, 0);
    for rec in prompt_records() {
        let name = rec["renderer"].as_str().unwrap().to_string();
        let renderer = renderers
            .entry(name.clone())
            .or_insert_with(|| {
                let tok = crate::common::renderer_fixtures::family_tokenizer(&name);
                rlvr::renderer::by_name(&name, tok).unwrap()
            })
            .clone();
        let key = (
            rec["dataset"].as_str().unwrap().to_string(),
            rec["id"].as_str().unwrap().to_string(),
        );
        if rec["skipped"] == true {
            assert!(!problems.contains_key(&key), "{key:?} should be skipped");
            skipped += 1;
            continue;
        }
        let p = problems
            .get(&key)
            .unwrap_or_else(|| panic!("{key:?} missing"));
        assert_eq!(p.answer, rec["answer"].as_str().unwrap(), "{key:?}");
        let last = p.messages.last().unwrap();
        assert_eq!(last.content, rec["question"].as_str().unwrap(), "{key:?}");
        let want: Vec<u32> = serde_json::from_value(rec["tokens"].clone()).unwrap();
        let got = renderer.generation_prompt(&p.messages).unwrap().to_tokens();
        assert_eq!(got, want, "{name} {key:?}");
        compared += 1;
    }
    assert_eq!((compared, skipped), (104, 14));
}

// ---------------------------------------------------------------------------------------------
// The hub
// ---------------------------------------------------------------------------------------------

#[cfg(all(feature = "hub", feature = "parquet"))]
mod hub {
    use std::sync::Arc;

    use super::*;
    use crate::hub::{FakeHub, options, start};

    /// A fake hub serving the fixtures at their hub paths.
    fn fake_hub() -> Arc<FakeHub> {
        let f = fixtures();
        let mut hub = FakeHub::default();
        let mut serve = |repo: &str, file: &str, local: PathBuf| {
            let url = format!("/datasets/{repo}/resolve/main/{file}");
            hub.files.insert(url, std::fs::read(local).unwrap());
        };
        for file in Math::hub_files() {
            serve(Math::HUB_REPO, &file, f.join("hendrycks_math").join(&file));
        }
        serve(
            Math500::HUB_REPO,
            Math500::HUB_FILE,
            f.join("MATH-500/test.jsonl"),
        );
        for file in DeepMath::hub_files() {
            serve(
                DeepMath::HUB_REPO,
                &file,
                f.join("DeepMath-103K").join(&file),
            );
        }
        serve(
            Polaris::HUB_REPO,
            Polaris::HUB_FILE,
            f.join("Polaris-Dataset-53K/polaris-data-53K.jsonl"),
        );
        serve(
            DapoMath::HUB_REPO,
            DapoMath::HUB_FILE,
            f.join("DAPO-Math-17k/data/dapo-math-17k.parquet"),
        );
        Arc::new(hub)
    }

    /// Requests for distinct files (hf-hub sends two per download).
    fn files_requested(hub: &FakeHub) -> usize {
        let mut paths: Vec<String> = hub
            .requests()
            .iter()
            .map(|r| r.split(' ').nth(1).unwrap_or("").to_string())
            .collect();
        paths.sort();
        paths.dedup();
        paths.len()
    }

    #[tokio::test]
    async fn every_dataset_downloads_once_then_loads_from_the_cache() {
        let hub = fake_hub();
        let endpoint = start(hub.clone()).await;
        let cache = tempfile::tempdir().unwrap();
        let opts = options(&endpoint, cache.path());

        let math = Math::download(&opts).await.unwrap();
        assert_eq!((math.len(), math.excluded(), math.skipped()), (15, 2, 1));
        assert_eq!(files_requested(&hub), 15);
        let local = Math::from_dir(fixtures().join("hendrycks_math"))
            .unwrap()
            .excluding(&math500());
        assert_eq!(all(&math), all(&local));
        assert!(math.sources()[0]
            .ends_with("datasets--EleutherAI--hendrycks_math/snapshots/0123456789abcdef0123456789abcdef01234567/algebra/train-00000-of-00001.parquet"));

        let test = Math500::download(&opts).await.unwrap();
        assert_eq!(all(&test), all(&math500()));
        let deepmath = DeepMath::download(&opts).await.unwrap();
        assert_eq!(deepmath.len(), 8);
        let polaris = Polaris::download(&opts).await.unwrap();
        assert_eq!(polaris.len(), 4);
        let dapo = DapoMath::download(&opts).await.unwrap();
        assert_eq!((dapo.len(), dapo.duplicates()), (4, 1));
        let requests = hub.requests().len();
        assert_eq!(files_requested(&hub), 15 + 10 + 1 + 1);

        // Again: the cache alone.
        Math::download(&opts).await.unwrap();
        DeepMath::download(&opts).await.unwrap();
        Polaris::download(&opts).await.unwrap();
        DapoMath::download(&opts).await.unwrap();
        assert_eq!(hub.requests().len(), requests);
    }

    #[tokio::test]
    async fn a_missing_shard_is_a_hub_error_naming_it() {
        let mut hub = FakeHub::default();
        let f = fixtures();
        for file in DeepMath::hub_files().iter().take(9) {
            hub.files.insert(
                format!("/datasets/{}/resolve/main/{file}", DeepMath::HUB_REPO),
                std::fs::read(f.join("DeepMath-103K").join(file)).unwrap(),
            );
        }
        let endpoint = start(Arc::new(hub)).await;
        let cache = tempfile::tempdir().unwrap();
        let err = DeepMath::download(&options(&endpoint, cache.path()))
            .await
            .unwrap_err();
        match err {
            Error::Hub {
                repo,
                file,
                message,
            } => {
                assert_eq!(repo, "zwhe99/DeepMath-103K");
                assert_eq!(file, "data/train-00009-of-00010.parquet");
                assert!(message.contains("404"), "{message}");
            }
            other => panic!("expected Error::Hub, got {other:?}"),
        }
    }
}
