//! DAPO's dynamic sampling (`dynamic_sampling_rounds`): where the extra rounds' problems
//! come from, their sampling seeds, and which groups a step keeps.
//!
//! Round 0 of step `s` is the step's ordinary batch. Extra round `r` (`1..=N`, run only
//! while fewer than `B = batch_size` groups with differing rewards are in) draws `B`
//! problems from a second pass over the dataset: positions `[(s·N + r − 1)·B, … + B)` of an
//! endless stream of permutations seeded apart from the main order ([`pass_seed`]). Each
//! (step, round) owns its positions whether or not it runs, so the batch of a step is a
//! function of (dataset, seed, step, policy) only: the main order of later steps does not
//! depend on how many rounds earlier steps needed, and a resumed run draws the same extra
//! problems with the same seeds. The kept groups are the first `B` whose rewards differ,
//! in (round, group) order ([`select`]); [`decide`] makes the same choice as groups arrive
//! in any order (streamed minibatches).

use crate::error::{Error, Result};

use super::sample::{mix, stream_indices};

/// Seed domain of dynamic sampling (keeps its data order and sampling seeds apart from the
/// main ones).
const DYNAMIC_DOMAIN: u64 = 0x4459_4e53_414d_504c;

/// SplitMix64 of two words, all 64 bits (the second pass's permutation seeds must not meet
/// the main order's `seed + epoch` within any realistic number of epochs).
fn mix64(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of the second pass's permutations (`dataset::epoch_indices(len, pass_seed, epoch)`).
pub(crate) fn pass_seed(seed: u64) -> u64 {
    mix64(seed ^ DYNAMIC_DOMAIN, 0)
}

/// The seed that round `round`'s group seeds are mixed from (`mix(round_seed, step, g)`):
/// `seed` itself for round 0 (the seeds of a run without dynamic sampling), a derived one
/// for every extra round.
pub(crate) fn round_seed(seed: u64, round: usize) -> u64 {
    if round == 0 {
        seed
    } else {
        mix64(seed ^ DYNAMIC_DOMAIN, round as u64)
    }
}

/// The sampling seed of group `g` of round `round` of step `step`.
pub(crate) fn group_seed(seed: u64, step: u64, round: usize, g: usize) -> u64 {
    mix(round_seed(seed, round), step, g as u64)
}

/// The dataset indices of extra round `round` (`1..=rounds`) of step `step`: positions
/// `[(step·rounds + round − 1)·B, … + B)` of the second pass, an endless stream of
/// permutations of `0..len` seeded by [`pass_seed`] (shuffled whatever `shuffle` says, so
/// that an in-order run does not draw its own batch again).
pub(crate) fn extra_indices(
    len: usize,
    batch_size: usize,
    rounds: usize,
    step: u64,
    round: usize,
    seed: u64,
) -> Result<Vec<usize>> {
    const FIELD: &str = "dynamic_sampling_rounds";
    if round == 0 || round > rounds {
        return Err(Error::config(
            FIELD,
            format!("round {round} is not an extra round of 1..={rounds}"),
        ));
    }
    let start = step
        .checked_mul(rounds as u64)
        .and_then(|x| x.checked_add(round as u64 - 1))
        .and_then(|x| x.checked_mul(batch_size as u64))
        .ok_or_else(|| Error::config(FIELD, "the position in the second pass overflows"))?;
    stream_indices(len, start, batch_size, pass_seed(seed), true, FIELD)
}

/// The groups kept from one round: the indices of the first `need` groups whose rewards
/// differ (`mixed[g]`), in group order.
pub(crate) fn select(mixed: &[bool], need: usize) -> Vec<usize> {
    mixed
        .iter()
        .enumerate()
        .filter(|(_, m)| **m)
        .map(|(g, _)| g)
        .take(need)
        .collect()
}

/// What is known of one group of a round while the round's groups arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Not graded yet.
    Pending,
    /// Graded: whether its rewards differ.
    Graded { mixed: bool },
    /// Graded and decided (kept or not): whether its rewards differ.
    Decided { mixed: bool },
}

/// The groups of a round that are now certainly kept, as [`select`] would choose them once
/// every group is in, while the groups arrive in any order. Group `g` (graded, rewards
/// differing) is kept iff fewer than `need` groups below it have differing rewards: it is
/// certainly kept when even every pending group below it having differing rewards would
/// leave that count below `need`, certainly not when the graded ones alone reach `need`.
/// Every group decided (kept or not) is marked [`Arrival::Decided`], and is never returned
/// again; once every group has
/// arrived, every group is decided and the union of the returned indices is `select`'s.
pub(crate) fn decide(round: &mut [Arrival], need: usize) -> Vec<usize> {
    let mut kept = Vec::new();
    // Groups below `g` with differing rewards: certainly (`mixed_below`), and possibly
    // (`pending_below`).
    let (mut mixed_below, mut pending_below) = (0usize, 0usize);
    for (g, a) in round.iter_mut().enumerate() {
        match *a {
            Arrival::Pending => pending_below += 1,
            Arrival::Graded { mixed: false } => *a = Arrival::Decided { mixed: false },
            Arrival::Graded { mixed: true } => {
                if mixed_below + pending_below < need {
                    kept.push(g);
                    *a = Arrival::Decided { mixed: true };
                } else if mixed_below >= need {
                    *a = Arrival::Decided { mixed: true };
                }
                mixed_below += 1;
            }
            Arrival::Decided { mixed } => mixed_below += usize::from(mixed),
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trainer::sample::batch_indices;
    use rand::SeedableRng;
    use rand::seq::SliceRandom;

    #[test]
    fn the_second_pass_is_deterministic_and_apart_from_the_main_order() {
        let (len, b, n) = (10, 5, 2);
        // Same arguments, same draw; every (step, round) its own positions.
        let r = |step, round| extra_indices(len, b, n, step, round, 7).unwrap();
        assert_eq!(r(0, 1), r(0, 1));
        // Step 0 rounds 1-2 cover the second pass's first epoch: a permutation of 0..10.
        let mut first: Vec<usize> = r(0, 1).into_iter().chain(r(0, 2)).collect();
        let in_pass_order = first.clone();
        first.sort_unstable();
        assert_eq!(first, (0..10).collect::<Vec<_>>());
        // It is not the main order's first epoch (which the main batches walk), and an
        // in-order run's second pass is shuffled too.
        let main: Vec<usize> = (0..2)
            .flat_map(|s| batch_indices(len, b, s, 7, true).unwrap())
            .collect();
        assert_ne!(in_pass_order, main);
        assert_ne!(in_pass_order, (0..10).collect::<Vec<_>>());
        // Step 1 starts the next epoch of the second pass: positions (1·2 + 0)·5 = 10.
        let mut next: Vec<usize> = r(1, 1).into_iter().chain(r(1, 2)).collect();
        next.sort_unstable();
        assert_eq!(next, (0..10).collect::<Vec<_>>());
        // The main order is the one without dynamic sampling (it does not depend on it).
        assert_eq!(
            batch_indices(len, b, 3, 7, true).unwrap(),
            batch_indices(len, b, 3, 7, true).unwrap()
        );
        // Another seed, another pass.
        assert_ne!(
            (0..4)
                .flat_map(|s| extra_indices(len, b, n, s, 1, 7).unwrap())
                .collect::<Vec<_>>(),
            (0..4)
                .flat_map(|s| extra_indices(len, b, n, s, 1, 8).unwrap())
                .collect::<Vec<_>>()
        );
        // Round 0 is not an extra round; overflow is an error, not a panic.
        assert!(extra_indices(len, b, n, 0, 0, 7).is_err());
        assert!(extra_indices(len, b, n, 0, 3, 7).is_err());
        assert!(matches!(
            extra_indices(len, b, n, u64::MAX / 2, 1, 7),
            Err(Error::Config { ref field, .. }) if field == "dynamic_sampling_rounds"
        ));
        assert!(extra_indices(0, b, n, 0, 1, 7).is_err());
    }

    #[test]
    fn round_seeds_differ_from_the_main_ones() {
        assert_eq!(round_seed(7, 0), 7);
        assert_eq!(group_seed(7, 3, 0, 2), mix(7, 3, 2));
        let mut seeds: Vec<u64> = (0..4)
            .flat_map(|r| (0..8).map(move |g| group_seed(7, 3, r, g)))
            .collect();
        seeds.sort_unstable();
        seeds.dedup();
        assert_eq!(seeds.len(), 32, "every (round, group) has its own seed");
        assert!(seeds.iter().all(|&s| s < 1 << 31));
        assert_ne!(pass_seed(7), 7);
        assert_ne!(pass_seed(7), pass_seed(8));
    }

    #[test]
    fn select_keeps_the_first_groups_with_differing_rewards() {
        let mixed = [false, true, true, false, true, true];
        assert_eq!(select(&mixed, 3), vec![1, 2, 4]);
        assert_eq!(select(&mixed, 10), vec![1, 2, 4, 5]);
        assert_eq!(select(&mixed, 0), Vec::<usize>::new());
        assert_eq!(select(&[false; 4], 4), Vec::<usize>::new());
    }

    #[test]
    fn decide_in_any_arrival_order_matches_select() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for case in 0..500u64 {
            let n = (case % 9) as usize;
            let mixed: Vec<bool> = (0..n)
                .map(|g| (case >> (g % 7)) & 1 == 1 || g % 3 == 0)
                .collect();
            let need = (case as usize / 9) % (n + 2);
            let mut order: Vec<usize> = (0..n).collect();
            order.shuffle(&mut rng);
            let mut round = vec![Arrival::Pending; n];
            let mut kept = Vec::new();
            for g in order {
                round[g] = Arrival::Graded { mixed: mixed[g] };
                let now = decide(&mut round, need);
                assert!(now.iter().all(|k| !kept.contains(k)), "decided twice");
                kept.extend(now);
            }
            assert!(round.iter().all(|a| matches!(a, Arrival::Decided { .. })));
            kept.sort_unstable();
            assert_eq!(kept, select(&mixed, need), "{mixed:?} need {need}");
        }
        // With room for every group (round 0), a group with differing rewards is kept as
        // soon as it arrives.
        let mut round = vec![Arrival::Pending; 4];
        round[3] = Arrival::Graded { mixed: true };
        assert_eq!(decide(&mut round, 4), vec![3]);
        // With room for one, group 2 waits for groups 0 and 1.
        let mut round = vec![Arrival::Pending; 4];
        round[2] = Arrival::Graded { mixed: true };
        assert_eq!(decide(&mut round, 1), Vec::<usize>::new());
        round[0] = Arrival::Graded { mixed: false };
        assert_eq!(decide(&mut round, 1), Vec::<usize>::new());
        round[1] = Arrival::Graded { mixed: false };
        assert_eq!(decide(&mut round, 1), vec![2]);
    }
}
