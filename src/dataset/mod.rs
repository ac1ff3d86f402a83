//! Datasets of problems with verifiable answers.
//!
//! A [`Dataset`] is an indexed collection of [`Problem`]s. [`Gsm8k`](crate::Gsm8k) loads GSM8K from JSONL,
//! from the Hugging Face parquet files (feature `parquet`) or straight from the hub (features
//! `hub` + `parquet`). The competition-math datasets of the cookbook's `math_rl` recipe load
//! the same ways, with its `MathEnv` prompt ([`MathEnvOptions`]): [`Math`], [`Math500`],
//! [`DeepMath`], [`Polaris`] and [`DapoMath`]; [`AdditionProblems`] is its synthetic
//! `arithmetic` environment. [`shuffled_indices`] and [`Shuffled`] give a deterministic order
//! that is the same on every platform and every version of `rand`.

use std::collections::BTreeMap;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::types::Message;

pub(crate) mod api;
pub(crate) mod arithmetic;
pub(crate) mod gsm8k;
pub(crate) mod math;
pub(crate) mod table;
pub mod word_problems;

pub(crate) use api::Dataset;
pub use arithmetic::AdditionProblems;
pub use gsm8k::{
    GSM8K_HUB_REPO, Gsm8kOptions, MATH_ENV_SUFFIX, PromptStyle, Split, TUTORIAL_SUFFIX,
    extract_gsm8k_final_answer,
};
pub use math::{DapoMath, DeepMath, Math, Math500, MathEnvOptions, Polaris};

/// One problem: the conversation to prompt with and the reference answer to grade against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// A stable id (e.g. `gsm8k/train/17`).
    pub id: String,
    /// The bare question.
    pub question: String,
    /// The reference answer (e.g. the number after `####`).
    pub answer: String,
    /// The conversation rendered as the prompt (few-shot prefix, question with suffix).
    pub messages: Vec<Message>,
    /// Anything else a reward function may need.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, serde_json::Value>,
}

impl Problem {
    /// A problem whose prompt is the question as a single user message.
    pub fn new(
        id: impl Into<String>,
        question: impl Into<String>,
        answer: impl Into<String>,
    ) -> Self {
        let question = question.into();
        Problem {
            id: id.into(),
            messages: vec![Message::user(question.clone())],
            question,
            answer: answer.into(),
            metadata: BTreeMap::new(),
        }
    }
}

impl Dataset for Vec<Problem> {
    fn len(&self) -> usize {
        <[Problem]>::len(self)
    }
    fn get(&self, index: usize) -> Result<Problem> {
        self.as_slice().get(index).cloned().ok_or_else(|| {
            crate::Error::config(
                "index",
                format!(
                    "problem {index} out of range (dataset has {})",
                    <[Problem]>::len(self)
                ),
            )
        })
    }
}

/// A permutation of `0..len` determined by `seed` alone.
///
/// The order is a Fisher–Yates shuffle driven by [`ChaCha8Rng`] seeded with the
/// little-endian bytes of `seed` (the rest of the 32-byte key zero), with unbiased bounded
/// draws by rejection. It depends on nothing that may change between `rand` releases, so a
/// seed gives the same order on every platform and every version of this crate; a test pins
/// a few values.
///
/// For several epochs, reshuffle with [`epoch_indices`] (seed + epoch).
///
/// ```
/// let order = rlvr::dataset::shuffled_indices(5, 0);
/// let mut sorted = order.clone();
/// sorted.sort();
/// assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
/// assert_eq!(order, rlvr::dataset::shuffled_indices(5, 0));
/// ```
pub fn shuffled_indices(len: usize, seed: u64) -> Vec<usize> {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(key);
    let mut order: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        let j = uniform_below(&mut rng, i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// The order of epoch `epoch` (0-based) of a run seeded with `seed`:
/// `shuffled_indices(len, seed + epoch)` (wrapping).
pub fn epoch_indices(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    shuffled_indices(len, seed.wrapping_add(epoch))
}

/// A uniform draw from `0..bound` (`bound > 0`) without modulo bias.
fn uniform_below(rng: &mut ChaCha8Rng, bound: u64) -> u64 {
    // Values below `threshold` (= 2^64 mod bound) are rejected, so every residue is equally
    // likely among the accepted ones.
    let threshold = bound.wrapping_neg() % bound;
    loop {
        let x = rng.next_u64();
        if x >= threshold {
            return x % bound;
        }
    }
}

/// A dataset seen through a fixed permutation of its indices ([`shuffled_indices`]).
///
/// ```
/// use rlvr::{dataset::{Problem, Shuffled}, Dataset};
///
/// let problems: Vec<Problem> = (0..4)
///     .map(|i| Problem::new(format!("p/{i}"), format!("q{i}"), i.to_string()))
///     .collect();
/// let shuffled = Shuffled::new(problems, 7);
/// assert_eq!(shuffled.len(), 4);
/// let first = shuffled.get(0).unwrap();
/// assert_eq!(first.id, format!("p/{}", shuffled.order()[0]));
/// ```
#[derive(Clone)]
pub struct Shuffled<D> {
    inner: D,
    seed: u64,
    order: Vec<usize>,
}

impl<D: std::fmt::Debug> std::fmt::Debug for Shuffled<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shuffled")
            .field("inner", &self.inner)
            .field("seed", &self.seed)
            .field("len", &self.order.len())
            .finish()
    }
}

impl<D: Dataset> Shuffled<D> {
    /// Shuffles `inner` with `seed`.
    pub fn new(inner: D, seed: u64) -> Self {
        let order = shuffled_indices(inner.len(), seed);
        Shuffled { inner, seed, order }
    }

    /// The seed of the permutation.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// `order()[i]` is the index in the inner dataset of problem `i`.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The unshuffled dataset.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Gives the unshuffled dataset back.
    pub fn into_inner(self) -> D {
        self.inner
    }
}

impl<D: Dataset> Dataset for Shuffled<D> {
    fn len(&self) -> usize {
        self.order.len()
    }

    fn get(&self, index: usize) -> Result<Problem> {
        let inner_index = self.order.get(index).copied().ok_or_else(|| {
            crate::Error::config(
                "index",
                format!(
                    "problem {index} out of range (dataset has {})",
                    self.order.len()
                ),
            )
        })?;
        self.inner.get(inner_index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffled_indices_is_a_permutation() {
        for len in [0usize, 1, 2, 3, 10, 257] {
            let mut order = shuffled_indices(len, 42);
            order.sort_unstable();
            assert_eq!(order, (0..len).collect::<Vec<_>>());
        }
    }

    #[test]
    fn uniform_below_stays_in_range() {
        let mut rng = ChaCha8Rng::from_seed([3u8; 32]);
        for bound in [1u64, 2, 3, 7, 1 << 40, u64::MAX] {
            for _ in 0..50 {
                assert!(uniform_below(&mut rng, bound) < bound);
            }
        }
    }

    #[test]
    fn shuffled_out_of_range_is_an_error() {
        let problems = vec![Problem::new("a", "q", "1")];
        let shuffled = Shuffled::new(problems, 0);
        assert!(shuffled.get(0).is_ok());
        assert!(matches!(shuffled.get(1), Err(crate::Error::Config { .. })));
    }
}
