//! The synthetic word-problem data set behind the offline quickstart.

use std::collections::HashSet;

use rlvr::dataset::word_problems::{Operation, answer_text};
use rlvr::message::Role;
use rlvr::{Dataset, dataset::word_problems::WordProblems};

#[test]
fn same_seed_same_problems_other_seed_other_order() {
    let a = WordProblems::new(7, 50).unwrap();
    let b = WordProblems::new(7, 50).unwrap();
    let c = WordProblems::new(8, 50).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn golden_first_problems_are_platform_independent() {
    // `shuffled_indices`: these exact problems on every platform. If this test fails after
    // a dependency upgrade, the committed tiny model's train/test split has moved.
    let set = WordProblems::new(0, 3).unwrap();
    let got: Vec<(String, String, String)> = set
        .problems()
        .map(|p| (p.id.clone(), p.question.clone(), p.answer.clone()))
        .collect();
    assert_eq!(got, golden());
}

fn golden() -> Vec<(String, String, String)> {
    GOLDEN
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

const GOLDEN: [(&str, &str, &str); 3] = [
    (
        "word_problems/21262",
        "Ben has 10 cookies. He gives 3 to Lucy. How many cookies does he have left?",
        "7",
    ),
    (
        "word_problems/14311",
        "There are 2 coins in a box. Anna puts 2 more in. How many coins are in the box now?",
        "4",
    ),
    (
        "word_problems/32372",
        "Tom had 11 marbles. He lost 3 of them. How many marbles does he have now?",
        "8",
    ),
];

#[test]
fn split_parts_are_disjoint_and_cover_the_set() {
    let all = WordProblems::new(3, 2_000).unwrap();
    let questions: HashSet<String> = all.problems().map(|p| p.question.clone()).collect();
    assert_eq!(questions.len(), 2_000, "problems in one set are distinct");
    let (train, test) = all.split(300).unwrap();
    assert_eq!((train.len(), test.len()), (1_700, 300));
    let train_q: HashSet<String> = train.problems().map(|p| p.question.clone()).collect();
    let test_q: HashSet<String> = test.problems().map(|p| p.question.clone()).collect();
    assert!(train_q.is_disjoint(&test_q));
    assert_eq!(train_q.union(&test_q).count(), 2_000);
}

#[test]
fn problems_are_single_user_turns_with_numeric_answers() {
    let set = WordProblems::new(1, 500).unwrap();
    let mut ops = HashSet::new();
    for i in 0..set.len() {
        let p = set.get(i).unwrap();
        assert_eq!(p.messages.len(), 1);
        assert_eq!(p.messages[0].role, Role::User);
        assert_eq!(p.messages[0].content, p.question);
        let arithmetic = set.arithmetic(i).unwrap();
        ops.insert(arithmetic.op);
        let expected = match arithmetic.op {
            Operation::Add => arithmetic.left + arithmetic.right,
            Operation::Sub => arithmetic.left - arithmetic.right,
        };
        assert_eq!(p.answer, expected.to_string(), "{}", p.question);
        assert_eq!(
            p.metadata["operation"],
            serde_json::json!(arithmetic.op.symbol())
        );
    }
    assert_eq!(ops.len(), 2, "both operations occur");
    assert_eq!(answer_text(12), "The answer is \\boxed{12}.");
}

#[test]
fn out_of_range_requests_are_typed_errors() {
    let too_many = WordProblems::space_size() + 1;
    let err = WordProblems::new(0, too_many).unwrap_err();
    assert!(err.to_string().contains("distinct"), "{err}");
    let set = WordProblems::new(0, 10).unwrap();
    let err = set.get(10).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    let err = set.split(11).unwrap_err();
    assert!(err.to_string().contains("n_test"), "{err}");
}
