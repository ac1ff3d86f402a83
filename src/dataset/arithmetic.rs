//! The cookbook's `arithmetic` environment as a [`Dataset`]: synthetic "What is x + y?"
//! problems whose operands are drawn exactly as NumPy draws them, offline.

use std::collections::BTreeMap;

use crate::dataset::{Dataset, Problem};
use crate::error::{Error, Result};
use crate::types::Message;

/// Additions of two numbers in `0..=100`, the cookbook's `ArithmeticDataset`, problem for
/// problem.
///
/// The cookbook makes batch `b` of `batch_size` problems by seeding a NumPy `RandomState` with
/// `b` and drawing `x = randint(0, 101)`, `y = randint(0, 101)` for each problem in turn. Here
/// problem `i` is problem `i % batch_size` of batch `i / batch_size`, drawn with the same
/// generator (MT19937 seeded like NumPy's legacy `seed(int)`, and its masked rejection
/// sampling for bounded integers; `tests/it/math_datasets.rs` checks the draws against NumPy).
/// With the trainer's `batch_size` equal to this one and shuffling off
/// (`TrainerConfig::shuffle = false`), step `b` sees the cookbook's batch `b`.
///
/// Each problem has
///
/// - `id` = `arithmetic/{batch}/{k}`;
/// - `question` = `What is {x} + {y}?` (no suffix), `answer` = `x + y`;
/// - `metadata` = `x`, `y` (numbers);
/// - `messages` = the few-shot exchange (the user asks `What is 4 + 5?`, the assistant
///   answers `9`), then the question; [`without_few_shot`](Self::without_few_shot) drops the
///   exchange (the cookbook's `include_fewshot=False`).
///
/// Grade it with [`LastInteger`](crate::reward::LastInteger), the environment's reward.
///
/// ```
/// use rlvr::dataset::AdditionProblems;
/// use rlvr::Dataset;
///
/// # fn main() -> rlvr::Result<()> {
/// let problems = AdditionProblems::new(4, 100)?;
/// assert_eq!(problems.len(), 400);
/// // np.random.RandomState(0): randint(0, 101) gives 44, 47, 64, 67, ...
/// let first = problems.get(0)?;
/// assert_eq!(first.question, "What is 44 + 47?");
/// assert_eq!(first.answer, "91");
/// assert_eq!(problems.get(1)?.question, "What is 64 + 67?");
/// assert_eq!(first.messages.len(), 3);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdditionProblems {
    batch_size: usize,
    n_batches: usize,
    few_shot: bool,
}

impl AdditionProblems {
    /// The largest operand (`randint(0, 101)` draws `0..=100`).
    pub const MAX_OPERAND: u32 = 100;

    /// `n_batches` batches of `batch_size` problems, with the few-shot exchange.
    ///
    /// Errors: [`Error::Config`] for a zero `batch_size` or `n_batches`, more than 2³²
    /// batches (NumPy seeds are 32-bit) or more problems than `usize` holds.
    pub fn new(batch_size: usize, n_batches: usize) -> Result<Self> {
        if batch_size == 0 {
            return Err(Error::config("batch_size", "must be at least 1"));
        }
        if n_batches == 0 {
            return Err(Error::config("n_batches", "must be at least 1"));
        }
        if n_batches as u64 > 1 << 32 {
            return Err(Error::config(
                "n_batches",
                "at most 2^32 batches (a batch index seeds a 32-bit generator)",
            ));
        }
        if batch_size.checked_mul(n_batches).is_none() {
            return Err(Error::config(
                "n_batches",
                "batch_size × n_batches overflows usize",
            ));
        }
        Ok(AdditionProblems {
            batch_size,
            n_batches,
            few_shot: true,
        })
    }

    /// The same problems without the few-shot exchange.
    pub fn without_few_shot(mut self) -> Self {
        self.few_shot = false;
        self
    }

    /// Problems per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Number of batches.
    pub fn n_batches(&self) -> usize {
        self.n_batches
    }

    /// Whether the prompt starts with the few-shot exchange.
    pub fn few_shot(&self) -> bool {
        self.few_shot
    }

    /// The operands `(x, y)` of problem `index`, `None` out of range.
    pub fn operands(&self, index: usize) -> Option<(u32, u32)> {
        if index >= self.len() {
            return None;
        }
        let (batch, k) = (index / self.batch_size, index % self.batch_size);
        let mut rng = Mt19937::new(u32::try_from(batch).ok()?);
        for _ in 0..k {
            rng.below_101();
            rng.below_101();
        }
        Some((rng.below_101(), rng.below_101()))
    }
}

impl Dataset for AdditionProblems {
    fn len(&self) -> usize {
        self.batch_size * self.n_batches
    }

    fn get(&self, index: usize) -> Result<Problem> {
        let (x, y) = self.operands(index).ok_or_else(|| {
            Error::config(
                "index",
                format!("problem {index} out of range (dataset has {})", self.len()),
            )
        })?;
        let question = format!("What is {x} + {y}?");
        let mut messages = Vec::with_capacity(3);
        if self.few_shot {
            messages.push(Message::user("What is 4 + 5?"));
            messages.push(Message::assistant("9"));
        }
        messages.push(Message::user(question.clone()));
        let metadata = BTreeMap::from([
            ("x".to_string(), serde_json::Value::from(x)),
            ("y".to_string(), serde_json::Value::from(y)),
        ]);
        Ok(Problem {
            id: format!(
                "arithmetic/{}/{}",
                index / self.batch_size,
                index % self.batch_size
            ),
            question,
            answer: (x + y).to_string(),
            messages,
            metadata,
        })
    }
}

/// The 32-bit Mersenne Twister (MT19937) as NumPy's legacy `RandomState` runs it.
struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    /// Seeded like `RandomState.seed(seed)` for an integer seed (`init_genrand`).
    fn new(seed: u32) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: 624 }
    }

    /// The next 32-bit output (`genrand_int32`).
    fn next_u32(&mut self) -> u32 {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX_A: u32 = 0x9908_b0df;
        if self.index >= 624 {
            for i in 0..624 {
                let y = (self.state[i] & UPPER) | (self.state[(i + 1) % 624] & LOWER);
                let mut next = self.state[(i + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    next ^= MATRIX_A;
                }
                self.state[i] = next;
            }
            self.index = 0;
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `randint(0, 101)`: NumPy's masked rejection sampling — the low 7 bits of an output
    /// (the smallest all-ones mask covering 100), redrawn while above 100.
    fn below_101(&mut self) -> u32 {
        loop {
            let v = self.next_u32() & 0x7f;
            if v <= AdditionProblems::MAX_OPERAND {
                return v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_reference_outputs() {
        // The reference implementation's first outputs for its default seed 5489.
        let mut rng = Mt19937::new(5489);
        let got: Vec<u32> = (0..5).map(|_| rng.next_u32()).collect();
        assert_eq!(
            got,
            [3499211612, 581869302, 3890346734, 3586334585, 545404204]
        );
    }

    #[test]
    fn numpy_seed_zero() {
        // np.random.RandomState(0).randint(0, 101), six times.
        let mut rng = Mt19937::new(0);
        let got: Vec<u32> = (0..6).map(|_| rng.below_101()).collect();
        assert_eq!(got, [44, 47, 64, 67, 67, 9]);
    }

    #[test]
    fn bad_sizes_are_config_errors() {
        assert!(AdditionProblems::new(0, 1).is_err());
        assert!(AdditionProblems::new(1, 0).is_err());
        assert!(AdditionProblems::new(1, (1usize << 32) + 1).is_err());
        assert!(AdditionProblems::new(usize::MAX, 2).is_err());
        let p = AdditionProblems::new(2, 3).unwrap();
        assert!(p.get(6).is_err());
        assert_eq!(p.operands(6), None);
        assert_eq!(p.get(5).unwrap().id, "arithmetic/2/1");
    }
}
