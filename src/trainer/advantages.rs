//! Phase 3, advantages: each group's rewards become per-completion advantages
//! `A_i = R_i − mean(R_group)` (optionally scaled); a group whose rewards are all equal is
//! degenerate (all advantages 0) and is skipped by the datums phase unless kept on request.

use super::config::AdvantageScaling;
use super::rollout::Group;

/// Phase 3 of a step: the advantages of every group of the batch, in group order (one per
/// completion).
pub(crate) fn group_advantages(groups: &[Group], scaling: AdvantageScaling) -> Vec<Vec<f64>> {
    let rewards: Vec<Vec<f64>> = groups.iter().map(Group::rewards).collect();
    compute_advantages(&rewards, scaling)
}

/// Group-centred advantages `A_i = R_i − mean(R_group)`, optionally divided by a standard
/// deviation (group or batch; a zero deviation leaves the centred values unscaled).
/// A group of one gets advantage 0.
pub(crate) fn compute_advantages(rewards: &[Vec<f64>], scaling: AdvantageScaling) -> Vec<Vec<f64>> {
    let centred: Vec<Vec<f64>> = rewards
        .iter()
        .map(|g| {
            let m = mean(g);
            g.iter().map(|r| r - m).collect()
        })
        .collect();
    match scaling {
        AdvantageScaling::None => centred,
        AdvantageScaling::Group => centred
            .into_iter()
            .zip(rewards)
            .map(|(a, g)| scale(a, std_dev(g)))
            .collect(),
        AdvantageScaling::Batch => {
            let all: Vec<f64> = rewards.iter().flatten().copied().collect();
            let s = std_dev(&all);
            centred.into_iter().map(|a| scale(a, s)).collect()
        }
    }
}

fn scale(a: Vec<f64>, s: f64) -> Vec<f64> {
    if s > 1e-12 {
        a.into_iter().map(|x| x / s).collect()
    } else {
        a
    }
}

pub(crate) fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Population standard deviation.
fn std_dev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64).sqrt()
}

/// Whether all rewards of a group are equal (its centred advantages are all zero).
pub(crate) fn is_degenerate(rewards: &[f64]) -> bool {
    rewards.windows(2).all(|w| w[0] == w[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advantages_centre_per_group() {
        let a = compute_advantages(
            &[vec![1.0, 0.0, 0.0, 1.0], vec![0.5]],
            AdvantageScaling::None,
        );
        assert_eq!(a, vec![vec![0.5, -0.5, -0.5, 0.5], vec![0.0]]);
        let g = compute_advantages(&[vec![1.0, 0.0], vec![2.0, 2.0]], AdvantageScaling::Group);
        assert_eq!(g, vec![vec![1.0, -1.0], vec![0.0, 0.0]]);
        // Batch std of [1, 0, 3, 3] = sqrt(1.6875).
        let b = compute_advantages(&[vec![1.0, 0.0], vec![3.0, 3.0]], AdvantageScaling::Batch);
        let s = 1.6875f64.sqrt();
        assert_eq!(b, vec![vec![0.5 / s, -0.5 / s], vec![0.0, 0.0]]);
    }

    #[test]
    fn degenerate_groups() {
        assert!(is_degenerate(&[1.0, 1.0, 1.0]));
        assert!(is_degenerate(&[0.3]));
        assert!(!is_degenerate(&[1.0, 0.0]));
    }
}
