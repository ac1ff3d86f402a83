//! Synthetic grade-school word problems (`+` and `−` on small numbers) for the offline
//! quickstart and the embedded tiny model.
//!
//! Every problem comes from a finite, enumerable space: a template (three additions, three
//! subtractions) × a name × an object × a pair of numbers. [`WordProblems::new`] takes the
//! first `n` entries of a seeded permutation of that space, so the problems of one set are all
//! different, the set is the same on every platform for a given seed
//! ([`shuffled_indices`]), and
//! [`WordProblems::split`] gives a train and a test part that share no question.

use std::collections::BTreeMap;

use crate::dataset::{Dataset, Problem, shuffled_indices};
use crate::error::{Error, Result};

/// Operands run over `1..=MAX_OPERAND`; additions are `a + b`, subtractions `(b + c) − b`.
pub const MAX_OPERAND: u32 = 10;

/// Who acts in a problem, with the pronoun used for them.
const NAMES: [(&str, &str); 8] = [
    ("Tom", "he"),
    ("Anna", "she"),
    ("Ben", "he"),
    ("Lucy", "she"),
    ("Sam", "he"),
    ("Mia", "she"),
    ("Max", "he"),
    ("Emma", "she"),
];

/// What is counted: singular and plural.
const OBJECTS: [(&str, &str); 8] = [
    ("apple", "apples"),
    ("pencil", "pencils"),
    ("sticker", "stickers"),
    ("marble", "marbles"),
    ("cookie", "cookies"),
    ("book", "books"),
    ("card", "cards"),
    ("coin", "coins"),
];

/// Number of templates: the first half add, the second half subtract.
const TEMPLATES: u32 = 6;

/// The arithmetic of one problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `left + right`.
    Add,
    /// `left − right`.
    Sub,
}

impl Operation {
    /// `"+"` or `"-"`.
    pub fn symbol(self) -> &'static str {
        match self {
            Operation::Add => "+",
            Operation::Sub => "-",
        }
    }
}

/// The numbers behind one word problem, kept so that tools (e.g. the tiny model's
/// supervised-data generator) can reason about plausible wrong answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arithmetic {
    /// The first number in the question.
    pub left: u32,
    /// The second number in the question.
    pub right: u32,
    /// What is done with them.
    pub op: Operation,
}

impl Arithmetic {
    /// The correct answer. Never negative: subtractions are built as `(b + c) − b`.
    pub fn answer(&self) -> u32 {
        match self.op {
            Operation::Add => self.left + self.right,
            Operation::Sub => self.left - self.right,
        }
    }

    /// The result of the other operation (`left − right` for an addition, `left + right` for
    /// a subtraction), or `None` when it would be negative.
    pub fn other_operation(&self) -> Option<u32> {
        match self.op {
            Operation::Add => self.left.checked_sub(self.right),
            Operation::Sub => Some(self.left + self.right),
        }
    }
}

/// The assistant's answer to a word problem in the format the embedded model is trained on:
/// `The answer is \boxed{N}.`
///
/// ```
/// assert_eq!(rlvr::dataset::word_problems::answer_text(7), "The answer is \\boxed{7}.");
/// ```
pub fn answer_text(n: u32) -> String {
    format!("The answer is \\boxed{{{n}}}.")
}

/// Decodes an index of the problem space into its question and arithmetic.
fn generate(index: u32) -> (String, Arithmetic) {
    let m = MAX_OPERAND;
    let mut rest = index;
    let x = rest % m + 1;
    rest /= m;
    let y = rest % m + 1;
    rest /= m;
    let object = (rest % OBJECTS.len() as u32) as usize;
    rest /= OBJECTS.len() as u32;
    let name = (rest % NAMES.len() as u32) as usize;
    rest /= NAMES.len() as u32;
    let template = rest % TEMPLATES;

    let (who, pronoun) = NAMES[name];
    let (other, _) = NAMES[(name + 1) % NAMES.len()];
    let (one, many) = OBJECTS[object];
    let count = |n: u32| -> String {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {many}")
        }
    };
    let cap = |s: &str| -> String {
        let mut c = s.chars();
        match c.next() {
            Some(f) => f.to_uppercase().chain(c).collect(),
            None => String::new(),
        }
    };
    let he = cap(pronoun);

    let arithmetic = if template < TEMPLATES / 2 {
        Arithmetic {
            left: x,
            right: y,
            op: Operation::Add,
        }
    } else {
        Arithmetic {
            left: x + y,
            right: x,
            op: Operation::Sub,
        }
    };
    let (a, b) = (arithmetic.left, arithmetic.right);
    let question = match template {
        0 => format!(
            "{who} has {}. {he} buys {b} more. How many {many} does {pronoun} have now?",
            count(a)
        ),
        1 => format!(
            "{who} has {} and {other} has {}. How many {many} do they have together?",
            count(a),
            count(b)
        ),
        2 => format!(
            "There are {} in a box. {who} puts {b} more in. How many {many} are in the box now?",
            count(a)
        ),
        3 => format!(
            "{who} has {}. {he} gives {b} to {other}. How many {many} does {pronoun} have left?",
            count(a)
        ),
        4 => format!(
            "There are {} in a box. {who} takes {b} out. How many {many} are in the box now?",
            count(a)
        ),
        _ => format!(
            "{who} had {}. {he} lost {b} of them. How many {many} does {pronoun} have now?",
            count(a)
        ),
    };
    (question, arithmetic)
}

fn problem(index: u32) -> (Problem, Arithmetic) {
    let (question, arithmetic) = generate(index);
    let mut p = Problem::new(
        format!("word_problems/{index}"),
        question,
        arithmetic.answer().to_string(),
    );
    p.metadata = BTreeMap::from([
        (
            "operands".to_string(),
            serde_json::json!([arithmetic.left, arithmetic.right]),
        ),
        (
            "operation".to_string(),
            serde_json::json!(arithmetic.op.symbol()),
        ),
    ]);
    (p, arithmetic)
}

/// A seeded set of synthetic word problems; implements [`Dataset`].
///
/// Each problem's prompt is the question as a single user message and its answer the number
/// (e.g. `"7"`).
///
/// ```
/// use rlvr::{dataset::word_problems::WordProblems, Dataset};
/// let all = WordProblems::new(0, 1_000)?;
/// let (train, test) = all.split(200)?;
/// assert_eq!((train.len(), test.len()), (800, 200));
/// let p = test.get(0)?;
/// assert_eq!(p.messages.len(), 1);
/// assert!(p.answer.parse::<u32>().is_ok());
/// # Ok::<(), rlvr::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct WordProblems {
    items: Vec<(Problem, Arithmetic)>,
}

impl WordProblems {
    /// `n` distinct problems drawn by `seed` (the same on every platform).
    ///
    /// Fails when `n` exceeds [`space_size`](Self::space_size).
    pub fn new(seed: u64, n: usize) -> Result<Self> {
        let total = Self::space_size();
        if n > total {
            return Err(Error::config(
                "n",
                format!("{n} word problems requested, but only {total} distinct ones exist"),
            ));
        }
        // `shuffled_indices` is pinned to be the same on every platform and rand version.
        let items = shuffled_indices(total, seed)
            .into_iter()
            .take(n)
            .map(|i| problem(i as u32))
            .collect();
        Ok(WordProblems { items })
    }

    /// Number of distinct problems the generator can produce.
    ///
    /// ```
    /// use rlvr::dataset::word_problems::WordProblems;
    /// assert_eq!(WordProblems::space_size(), 6 * 8 * 8 * 10 * 10);
    /// ```
    pub fn space_size() -> usize {
        (TEMPLATES as usize) * NAMES.len() * OBJECTS.len() * (MAX_OPERAND as usize).pow(2)
    }

    /// Splits into `(train, test)`: the first `n_test` problems are the test part, the rest
    /// the train part. The two parts share no question.
    pub fn split(mut self, n_test: usize) -> Result<(WordProblems, WordProblems)> {
        if n_test > self.items.len() {
            return Err(Error::config(
                "n_test",
                format!(
                    "test split of {n_test} problems asked from a set of {}",
                    self.items.len()
                ),
            ));
        }
        let train = self.items.split_off(n_test);
        Ok((WordProblems { items: train }, self))
    }

    /// The problems, in order.
    pub fn problems(&self) -> impl ExactSizeIterator<Item = &Problem> {
        self.items.iter().map(|(p, _)| p)
    }

    /// The arithmetic behind problem `index`, if it exists.
    pub fn arithmetic(&self, index: usize) -> Option<Arithmetic> {
        self.items.get(index).map(|(_, a)| *a)
    }
}

impl Dataset for WordProblems {
    fn len(&self) -> usize {
        self.items.len()
    }

    fn get(&self, index: usize) -> Result<Problem> {
        self.items
            .get(index)
            .map(|(p, _)| p.clone())
            .ok_or_else(|| {
                Error::config(
                    "index",
                    format!(
                        "word problem {index} out of range (set has {})",
                        self.items.len()
                    ),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_index_decodes_to_a_distinct_consistent_question() {
        let mut seen = HashSet::new();
        for i in 0..WordProblems::space_size() as u32 {
            let (q, a) = generate(i);
            assert!(seen.insert(q.clone()), "duplicate question {q}");
            // The two numbers appear in the question in order.
            let numbers: Vec<u32> = q
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            assert_eq!(numbers, vec![a.left, a.right], "{q}");
            match a.op {
                Operation::Add => assert_eq!(a.answer(), a.left + a.right),
                Operation::Sub => {
                    assert!(a.right <= a.left);
                    assert_eq!(a.answer() + a.right, a.left);
                }
            }
        }
    }

    #[test]
    fn singular_object_for_one() {
        // x = 1 (index % 10 == 0), object 0, template 0: "Tom has 1 apple."
        let (q, _) = generate(0);
        assert!(q.starts_with("Tom has 1 apple. He buys 1 more."), "{q}");
    }
}
