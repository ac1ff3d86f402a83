//! Tests of the trainer configuration.

use super::*;

#[test]
fn defaults_are_the_tutorials() {
    let c = TrainerConfig::default();
    assert_eq!((c.batch_size, c.group_size, c.max_tokens), (16, 8, 256));
    assert_eq!(c.learning_rate, 4e-5);
    assert_eq!((c.adam_beta1, c.adam_beta2), (0.9, 0.95));
    assert_eq!(c.loss, LossFn::ImportanceSampling);
    assert_eq!(c.temperature, 1.0);
    c.validate().unwrap();
}

#[test]
fn serde_round_trip_and_partial() {
    let c = TrainerConfig::builder()
        .loss(LossFn::ppo())
        .max_steps(7)
        .build()
        .unwrap();
    let text = serde_json::to_string(&c).unwrap();
    let back: TrainerConfig = serde_json::from_str(&text).unwrap();
    assert_eq!(back, c);
    let partial: TrainerConfig = serde_json::from_str(r#"{"group_size": 4}"#).unwrap();
    assert_eq!(partial.group_size, 4);
    assert_eq!(partial.batch_size, 16);
}

#[test]
fn validation_names_the_field() {
    let err = TrainerConfig::builder()
        .learning_rate(-1.0)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::Config { ref field, .. } if field == "learning_rate"));
    let err = TrainerConfig::builder()
        .loss(LossFn::CrossEntropy)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::Config { ref field, .. } if field == "loss"));
    let err = TrainerConfig::builder()
        .eval(EvalConfig {
            group_size: 0,
            ..EvalConfig::default()
        })
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::Config { ref field, .. } if field == "eval.group_size"));
    for g in [0, 1] {
        let err = TrainerConfig::builder().group_size(g).build().unwrap_err();
        assert!(matches!(err, Error::Config { ref field, .. } if field == "group_size"));
        assert!(
            err.to_string().contains("at least 2 samples per problem"),
            "{err}"
        );
    }
    let eval1 = EvalConfig {
        group_size: 1,
        ..EvalConfig::default()
    };
    assert!(TrainerConfig::builder().eval(eval1).build().is_ok());
}

#[test]
fn huge_reward_timeout_is_refused_not_a_panic() {
    for bad in [1e300, f64::INFINITY, f64::NAN, 0.0, -1.0] {
        let err = TrainerConfig::builder()
            .reward_timeout_s(bad)
            .build()
            .unwrap_err();
        assert!(
            matches!(err, Error::Config { ref field, .. } if field == "reward_timeout_s"),
            "{bad}: {err:?}"
        );
    }
    // Set directly (bypassing validation), the accessor still does not panic.
    let c = TrainerConfig {
        reward_timeout_s: 1e300,
        ..TrainerConfig::default()
    };
    assert_eq!(c.reward_timeout(), Duration::MAX);
    let c = TrainerConfig {
        reward_timeout_s: f64::NAN,
        ..TrainerConfig::default()
    };
    assert_eq!(c.reward_timeout(), Duration::ZERO);
}

#[test]
fn grader_pool_settings_default_validate_and_load_from_old_configs() {
    let c = TrainerConfig::default();
    assert_eq!(c.grader_threads, 0, "automatic");
    assert_eq!(
        c.max_consecutive_reward_hangs,
        DEFAULT_MAX_CONSECUTIVE_HANGS
    );
    let pool = c.grader_pool();
    assert_eq!(pool.threads(), GraderPool::default_threads());
    assert_eq!(pool.max_consecutive_hangs(), 16);
    // A config.json written before these fields existed still loads, with the defaults.
    let old: TrainerConfig =
        serde_json::from_str(r#"{"batch_size": 4, "reward_timeout_s": 10.0}"#).unwrap();
    assert_eq!(
        (old.grader_threads, old.max_consecutive_reward_hangs),
        (0, 16)
    );
    let c = TrainerConfig::builder()
        .grader_threads(3)
        .max_consecutive_reward_hangs(0)
        .build()
        .unwrap();
    assert_eq!(
        (
            c.grader_pool().threads(),
            c.grader_pool().max_consecutive_hangs()
        ),
        (3, 0)
    );
    let back: TrainerConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    assert!(
        TrainerConfig::builder()
            .grader_threads(MAX_GRADER_THREADS)
            .build()
            .is_ok()
    );
    let err = TrainerConfig::builder()
        .grader_threads(MAX_GRADER_THREADS + 1)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::Config { ref field, .. } if field == "grader_threads"),
        "{err:?}"
    );
}

#[test]
fn dynamic_sampling_is_off_by_default_and_refused_with_kept_degenerate_groups() {
    assert_eq!(TrainerConfig::default().dynamic_sampling_rounds, 0);
    let on = TrainerConfig::builder()
        .dynamic_sampling_rounds(3)
        .build()
        .unwrap();
    assert_eq!(on.dynamic_sampling_rounds, 3);
    let err = TrainerConfig::builder()
        .dynamic_sampling_rounds(3)
        .keep_degenerate_groups(true)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::Config { ref field, .. } if field == "dynamic_sampling_rounds"),
        "{err}"
    );
    assert!(
        TrainerConfig::builder()
            .keep_degenerate_groups(true)
            .build()
            .is_ok()
    );
    // Configs written before the option existed load with it off.
    let old: TrainerConfig = serde_json::from_str(r#"{"batch_size": 4}"#).unwrap();
    assert_eq!(old.dynamic_sampling_rounds, 0);
    let err = TrainerConfig::builder()
        .dynamic_sampling_rounds(usize::MAX)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::Config { ref field, .. } if field == "dynamic_sampling_rounds"));
}
