//! The backend traits, re-exported at the crate root: [`PolicyBackend`] and [`Sampler`].

use async_trait::async_trait;

use crate::backend::Pending;
use crate::error::Result;
use crate::tokenizer::Tokenizer;
use crate::types::{
    AdamParams, CheckpointRef, Datum, ForwardBackwardOutput, LossFn, ModelInput, OptimStepOutput,
    SampledSequence, SamplingParams,
};

/// Samples completions from a fixed set of weights.
///
/// Implement it (with [`async_trait`](https://docs.rs/async-trait)) to plug in another
/// sampling engine; the trainer only needs these two calls.
///
/// ```
/// use rlvr::{types::{ModelInput, SampledSequence, SamplingParams, StopReason}, Result, Sampler};
///
/// /// Always answers the prompt's last token, then EOS (token 0), with log-prob −0.5 each.
/// struct Echo;
///
/// #[async_trait::async_trait]
/// impl Sampler for Echo {
///     async fn sample(
///         &self,
///         prompt: &ModelInput,
///         num_samples: usize,
///         _params: &SamplingParams,
///     ) -> Result<Vec<SampledSequence>> {
///         let last = prompt.to_tokens().last().copied().unwrap_or(0);
///         let seq = SampledSequence {
///             tokens: vec![last, 0],
///             logprobs: vec![-0.5, -0.5],
///             stop_reason: StopReason::Stop,
///             sequence_id: None,
///         };
///         Ok(vec![seq; num_samples])
///     }
///
///     async fn compute_logprobs(&self, input: &ModelInput) -> Result<Vec<Option<f32>>> {
///         Ok((0..input.len()).map(|i| (i > 0).then_some(-0.5)).collect())
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let sampler: Box<dyn Sampler> = Box::new(Echo);
/// let prompt = ModelInput::from_tokens(vec![5, 6, 7]);
/// let out = sampler.sample(&prompt, 2, &SamplingParams::default()).await?;
/// assert_eq!(out.len(), 2);
/// assert_eq!(out[0].tokens, vec![7, 0]);
/// let lps = sampler.compute_logprobs(&prompt).await?;
/// assert_eq!(lps, vec![None, Some(-0.5), Some(-0.5)]);
/// # Ok::<(), rlvr::Error>(())
/// # }).unwrap();
/// ```
#[async_trait]
pub trait Sampler: Send + Sync {
    /// Samples `num_samples` completions of `prompt`.
    ///
    /// Each returned sequence includes the tokens that stopped it (stop sequence or EOS) and
    /// the sampler's log-probability of every returned token.
    async fn sample(
        &self,
        prompt: &ModelInput,
        num_samples: usize,
        params: &SamplingParams,
    ) -> Result<Vec<SampledSequence>>;

    /// Log-probabilities of every token of `input` given its prefix. Position 0 has no
    /// prefix and is `None`.
    async fn compute_logprobs(&self, input: &ModelInput) -> Result<Vec<Option<f32>>>;
}

/// A trainable policy: forward/backward passes, optimizer steps, samplers, checkpoints.
///
/// Operations run in the order they were submitted: a call returns once the operation is
/// accepted, and the returned [`Pending`] resolves when it has run.
///
/// One training step written against the trait, run here on a tiny random local model
/// (any backend — Tinker or local — works the same way):
///
/// ```
/// # #[cfg(feature = "local")]
/// # {
/// use rlvr::backend::local::{char_tokenizer, LocalBackend, LocalOptions, Qwen3Config};
/// use rlvr::{types::{AdamParams, Datum, LossFn, ModelInput, SamplingParams, TensorData}, PolicyBackend, Sampler};
///
/// /// Samples from the current policy, then trains on the samples with cross-entropy.
/// async fn sft_on_own_samples<B: PolicyBackend>(backend: &B) -> rlvr::Result<f64> {
///     let sampler = backend.sampler().await?;
///     let prompt = ModelInput::from_tokens(vec![1, 2]);
///     let params = SamplingParams::default().max_tokens(3).seed(1);
///     let mut data = Vec::new();
///     for s in sampler.sample(&prompt, 2, &params).await? {
///         let mut tokens = prompt.to_tokens();
///         tokens.extend(&s.tokens);
///         let n = tokens.len() - 1;
///         data.push(
///             Datum::new(ModelInput::from_tokens(tokens[..n].to_vec()))
///                 .with_target_tokens(tokens[1..].iter().map(|&t| t as i64).collect())
///                 .with_weights(vec![1.0; n]),
///         );
///     }
///     // Submit both, then wait: backends may pipeline them.
///     let fb = backend.forward_backward(data, LossFn::CrossEntropy).await?;
///     let opt = backend.optim_step(AdamParams { learning_rate: 1e-3, ..Default::default() }).await?;
///     let loss = fb.await?.metrics.get("loss:sum").copied().unwrap_or(f64::NAN);
///     opt.await?;
///     Ok(loss)
/// }
///
/// let vocab: Vec<String> = "_abcdef".chars().map(String::from).collect();
/// let tokenizer = char_tokenizer(&vocab, Some(0))?;
/// let config = Qwen3Config::new(vocab.len(), 16, 24, 1, 2, 1, 8, 64);
/// let backend = LocalBackend::random(config, tokenizer, LocalOptions::default().seed(1))?;
/// let loss = tokio::runtime::Builder::new_current_thread()
///     .build()
///     .unwrap()
///     .block_on(sft_on_own_samples(&backend))?;
/// assert!(loss.is_finite());
/// # }
/// # Ok::<(), rlvr::Error>(())
/// ```
#[async_trait]
pub trait PolicyBackend: Send + Sync {
    /// The sampler type this backend hands out.
    type Sampler: Sampler + 'static;

    /// The tokenizer of the model.
    fn tokenizer(&self) -> &Tokenizer;

    /// Submits a forward and backward pass over `data`; gradients accumulate until the next
    /// [`optim_step`](Self::optim_step).
    async fn forward_backward(
        &self,
        data: Vec<Datum>,
        loss: LossFn,
    ) -> Result<Pending<ForwardBackwardOutput>>;

    /// Submits a forward pass only (no gradients): the learner's log-probabilities and the
    /// loss value.
    async fn forward(
        &self,
        data: Vec<Datum>,
        loss: LossFn,
    ) -> Result<Pending<ForwardBackwardOutput>>;

    /// Submits an optimizer step over the accumulated gradients.
    async fn optim_step(&self, params: AdamParams) -> Result<Pending<OptimStepOutput>>;

    /// A sampler over the weights as of now (after every submitted operation).
    async fn sampler(&self) -> Result<Self::Sampler>;

    /// A sampler over the frozen base model (the reference policy for KL penalties).
    async fn reference_sampler(&self) -> Result<Self::Sampler>;

    /// Saves weights and optimizer state under `name`.
    async fn save_state(&self, name: &str) -> Result<CheckpointRef>;

    /// Restores weights and optimizer state saved by [`save_state`](Self::save_state).
    async fn load_state(&self, checkpoint: &CheckpointRef) -> Result<()>;

    /// Tells the backend the run directory of the trainer driving it (called by
    /// [`GrpoTrainer`](crate::GrpoTrainer) before its first checkpoint when
    /// [`TrainerConfig::log_dir`](crate::TrainerConfig) is set). A backend that writes
    /// checkpoints on this machine and was given no place for them keeps them in
    /// `<run_dir>/checkpoints`, beside the run that `export` and resume read. The default
    /// does nothing (Tinker's checkpoints stay on the service).
    fn use_run_dir(&self, _run_dir: &std::path::Path) {}
}
