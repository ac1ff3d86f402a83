//! The integration tests, as one test binary (`cargo test --test it`): one module per topic,
//! the helpers in `common` (and `local_common` for the local backend) compiled once.
//!
//! Every test here runs in one process, side by side with the others (`cargo test` used to
//! run one binary per file, one after the other). A test that needs the process to itself —
//! it counts the process's threads, or registers renderers under built-in names — runs in a
//! child process of this binary filtered to that one test
//! ([`common::isolate::runs_here`]).
//!
//! One module: `cargo test --test it renderers::`; one test:
//! `cargo test --test it -- --exact renderers::llama3_matches_the_cookbook`.

mod common;
#[cfg(feature = "local")]
mod local_common;

mod bad_input;
mod bounded_graders;
#[cfg(feature = "local")]
mod chat_loop;
#[cfg(feature = "chat-template")]
mod chat_template;
#[cfg(feature = "local")]
mod crash_resume;
#[cfg(feature = "local")]
mod custom_loss;
mod dataset;
#[cfg(all(
    feature = "tinker",
    feature = "local",
    feature = "hub",
    feature = "parquet"
))]
mod example_gsm8k;
#[cfg(all(
    feature = "tinker",
    feature = "local",
    feature = "hub",
    feature = "parquet"
))]
mod example_math;
mod grader_agreement;
#[cfg(feature = "hub")]
mod hub;
#[cfg(feature = "local")]
mod local_backend;
#[cfg(feature = "cuda")]
mod local_cuda;
mod math_datasets;
mod math_grader;
mod properties;
mod renderer;
mod renderer_gpt_oss;
mod renderer_mutations;
mod renderers;
mod report;
mod reward;
#[cfg(feature = "tinker")]
mod tinker_download;
#[cfg(feature = "tinker")]
mod tinker_fake;
#[cfg(feature = "tinker")]
mod tinker_peer;
#[cfg(feature = "tinker")]
mod tinker_soak;
#[cfg(feature = "tinker")]
mod tinker_wire;
#[cfg(feature = "local")]
mod tiny_arithmetic;
#[cfg(feature = "local")]
mod tiny_model;
mod tokenizer;
mod trainer;
#[cfg(feature = "weights")]
mod weights;
mod word_problems;
