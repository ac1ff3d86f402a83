//! The GPT-OSS (Harmony) renderers against the cookbook's fixtures.
//!
//! The system prompt of `gpt_oss_{low,medium,high}_reasoning` states today's date, so the
//! fixtures were made with the date fixed (`GPT_OSS_FIXTURE_DATE` in `make_fixtures.py`, the
//! cookbook's `current_date`). Here the same names are registered with renderers that carry
//! that date (a registered name takes precedence over the built-in one), then every record is
//! compared by the shared fixture check. The registrations would change those built-in names
//! for every other test of the process, so each test runs alone in a child process of the
//! test binary (`common::isolate`).

use std::sync::Arc;

use crate::common::renderer_fixtures::assert_family;
use rlvr::renderer::gpt_oss::{GptOssRenderer, ReasoningEffort};
use rlvr::{Renderer, renderer};

/// `GPT_OSS_FIXTURE_DATE` of `tests/fixtures/renderers/make_fixtures.py`.
const FIXTURE_DATE: &str = "2025-08-05";

/// Registers the system-prompt names with renderers dated [`FIXTURE_DATE`].
fn register_with_fixture_date() {
    for (name, effort) in [
        ("gpt_oss_low_reasoning", ReasoningEffort::Low),
        ("gpt_oss_medium_reasoning", ReasoningEffort::Medium),
        ("gpt_oss_high_reasoning", ReasoningEffort::High),
    ] {
        renderer::register(name, move |tok| {
            Ok(
                Arc::new(GptOssRenderer::new(tok, Some(effort))?.with_current_date(FIXTURE_DATE))
                    as Arc<dyn Renderer>,
            )
        });
    }
}

#[test]
fn gpt_oss_family_matches_the_cookbook() {
    if !crate::common::isolate::runs_here(module_path!(), "gpt_oss_family_matches_the_cookbook") {
        return;
    }
    register_with_fixture_date();
    assert_family("gpt_oss");
}

/// Edge cases beyond the shared conversations (`make_gpt_oss_extra.py`): unnamed tool
/// results, dangling tool headers, both stop tokens, Python-only JSON, richer tool schemas.
#[test]
fn gpt_oss_edge_cases_match_the_cookbook() {
    if !crate::common::isolate::runs_here(module_path!(), "gpt_oss_edge_cases_match_the_cookbook") {
        return;
    }
    register_with_fixture_date();
    assert_family("gpt_oss_extra");
}
