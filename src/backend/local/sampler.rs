//! The local sampler: a frozen snapshot of the policy, KV-cached batched decoding.
//!
//! A group is sampled as one batch: the prompt is prefilled once (batch 1), the cache is
//! repeated `num_samples` times, then every step decodes one token for each unfinished row
//! (finished rows are dropped from the cache).
//!
//! **Log-probabilities.** The logprob returned for a token is its log-probability under the
//! tempered distribution `softmax(logits / temperature)` *before* top-k / top-p truncation
//! (with temperature 0, greedy, the temperature-1 distribution). At temperature 1 this is
//! exactly the trainer's `lp_θ` for the same weights, which is what importance sampling
//! compares against.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::Qwen3Config;
use super::model::{be, Adapters, KvCache, Mode, Model, Rope, Weights};
use crate::backend::Sampler;
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use crate::types::{
    ModelInput, SampledSequence, SamplingParams, StopCondition, StopReason, TokenId,
};

/// What a backend and its samplers share: configuration, rotary tables, tokenizer, device.
pub(crate) struct Shared {
    pub cfg: Qwen3Config,
    pub rope: Rope,
    pub tokenizer: Tokenizer,
    pub device: Device,
}

impl Shared {
    /// EOS ids: the tokenizer's and the model configuration's.
    pub(crate) fn eos_ids(&self) -> Vec<TokenId> {
        let mut v = self.cfg.eos_token_ids();
        if let Some(e) = self.tokenizer.eos_token_id() {
            if !v.contains(&e) {
                v.push(e);
            }
        }
        v
    }

    /// Checks token ids are inside the vocabulary.
    pub(crate) fn check_tokens(&self, tokens: &[TokenId], what: &str) -> Result<()> {
        if let Some((i, t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= self.cfg.vocab_size)
        {
            return Err(Error::config(
                what,
                format!(
                    "token {t} at position {i} is outside the vocabulary ({})",
                    self.cfg.vocab_size
                ),
            ));
        }
        Ok(())
    }
}

/// A sampler over a frozen snapshot of a [`LocalBackend`](super::LocalBackend)'s weights.
///
/// Cheap to clone. With LoRA the (large) base weights are shared with the backend through an
/// `Arc`; only the small adapter tensors are copied into the snapshot.
#[derive(Clone)]
pub struct LocalSampler {
    pub(crate) shared: Arc<Shared>,
    pub(crate) weights: Arc<Weights>,
    pub(crate) adapters: Option<Arc<Adapters>>,
}

impl std::fmt::Debug for LocalSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSampler")
            .field("adapters", &self.adapters.is_some())
            .finish_non_exhaustive()
    }
}

struct Row {
    tokens: Vec<TokenId>,
    logprobs: Vec<f32>,
    done: Option<StopReason>,
}

/// Stop rules resolved from `SamplingParams::stop` (Tinker semantics).
struct StopRules {
    strings: Vec<String>,
    tokens: HashSet<TokenId>,
}

impl LocalSampler {
    fn model(&self) -> Model<'_> {
        Model {
            cfg: &self.shared.cfg,
            weights: &self.weights,
            adapters: self.adapters.as_deref(),
            rope: &self.shared.rope,
        }
    }

    fn stop_rules(&self, stop: &Option<StopCondition>) -> StopRules {
        match stop {
            None => StopRules {
                strings: Vec::new(),
                tokens: self.shared.eos_ids().into_iter().collect(),
            },
            Some(StopCondition::Strings(s)) => StopRules {
                strings: s.iter().filter(|s| !s.is_empty()).cloned().collect(),
                tokens: HashSet::new(),
            },
            Some(StopCondition::Tokens(t)) => StopRules {
                strings: Vec::new(),
                tokens: t.iter().copied().collect(),
            },
        }
    }

    /// Samples synchronously (the async [`Sampler::sample`] runs this on a blocking thread).
    pub fn sample_blocking(
        &self,
        prompt: &[TokenId],
        num_samples: usize,
        params: &SamplingParams,
    ) -> Result<Vec<SampledSequence>> {
        validate_params(params)?;
        if prompt.is_empty() {
            return Err(Error::config("prompt", "is empty"));
        }
        self.shared.check_tokens(prompt, "prompt")?;
        if num_samples == 0 {
            return Ok(Vec::new());
        }
        let max_pos = self.shared.rope.max_positions();
        if prompt.len() >= max_pos {
            return Err(Error::config(
                "prompt",
                format!(
                    "{} tokens leave no room under max_position_embeddings = {max_pos}",
                    prompt.len()
                ),
            ));
        }
        let room = max_pos - prompt.len();
        let max_new = params
            .max_tokens
            .map(|m| (m as usize).min(room))
            .unwrap_or(room);
        let mut rows: Vec<Row> = (0..num_samples)
            .map(|_| Row {
                tokens: Vec::new(),
                logprobs: Vec::new(),
                done: None,
            })
            .collect();
        if max_new == 0 {
            return Ok(finish(rows, StopReason::Length));
        }
        let rules = self.stop_rules(&params.stop);
        let mut rng =
            ChaCha8Rng::seed_from_u64(params.seed.unwrap_or_else(|| rand::rng().random()));
        let model = self.model();
        let device = &self.shared.device;
        let mut cache = KvCache::new(self.shared.cfg.num_hidden_layers);
        let ids = Tensor::new(prompt, device)
            .and_then(|t| t.unsqueeze(0))
            .map_err(be("prompt tensor"))?;
        let logits = model.forward(&ids, 0, Some(&mut cache), Mode::Infer, true)?;
        let first: Vec<f32> = logits
            .flatten_all()
            .and_then(|t| t.to_vec1())
            .map_err(be("reading logits"))?;
        cache.expand(num_samples)?;
        let mut active: Vec<usize> = (0..num_samples).collect();
        let mut row_logits: Vec<Vec<f32>> = vec![first; num_samples];
        for step in 0..max_new {
            for (slot, &r) in active.iter().enumerate() {
                let (tok, lp) = pick(&row_logits[slot], params, &mut rng)?;
                let row = &mut rows[r];
                row.tokens.push(tok);
                row.logprobs.push(lp);
                if rules.tokens.contains(&tok) {
                    row.done = Some(StopReason::Stop);
                } else if !rules.strings.is_empty() {
                    let text = self.shared.tokenizer.decode(&row.tokens)?;
                    if rules.strings.iter().any(|s| text.contains(s.as_str())) {
                        row.done = Some(StopReason::Stop);
                    }
                }
            }
            if step + 1 == max_new {
                break;
            }
            let keep: Vec<u32> = (0..active.len() as u32)
                .filter(|&s| rows[active[s as usize]].done.is_none())
                .collect();
            if keep.is_empty() {
                break;
            }
            if keep.len() < active.len() {
                cache.select(&keep)?;
                active = keep.iter().map(|&s| active[s as usize]).collect();
            }
            let last: Vec<TokenId> = active
                .iter()
                .map(|&r| rows[r].tokens.last().copied().unwrap_or(0))
                .collect();
            let ids =
                Tensor::from_vec(last, (active.len(), 1), device).map_err(be("decode tensor"))?;
            let logits = model.forward(
                &ids,
                prompt.len() + step,
                Some(&mut cache),
                Mode::Infer,
                false,
            )?;
            row_logits = logits
                .squeeze(1)
                .and_then(|t| t.to_vec2())
                .map_err(be("reading logits"))?;
        }
        Ok(finish(rows, StopReason::Length))
    }

    /// The logits ([position][vocab]) of the model for `tokens`, in one forward pass.
    pub fn logits_blocking(&self, tokens: &[TokenId]) -> Result<Vec<Vec<f32>>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        self.shared.check_tokens(tokens, "tokens")?;
        let ids = Tensor::new(tokens, &self.shared.device)
            .and_then(|t| t.unsqueeze(0))
            .map_err(be("input tensor"))?;
        self.model()
            .forward(&ids, 0, None, Mode::Infer, false)?
            .squeeze(0)
            .and_then(|t| t.to_vec2())
            .map_err(be("reading logits"))
    }

    /// Log-probabilities of every token of `tokens` given its prefix (position 0: `None`).
    pub fn compute_logprobs_blocking(&self, tokens: &[TokenId]) -> Result<Vec<Option<f32>>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        self.shared.check_tokens(tokens, "model_input")?;
        let device = &self.shared.device;
        let ids = Tensor::new(tokens, device)
            .and_then(|t| t.unsqueeze(0))
            .map_err(be("input tensor"))?;
        let logits = self.model().forward(&ids, 0, None, Mode::Infer, false)?;
        let n = tokens.len();
        let mut out = vec![None];
        if n > 1 {
            let lg = logits
                .squeeze(0)
                .and_then(|t| t.narrow(0, 0, n - 1))
                .map_err(be("logits"))?;
            let targets = Tensor::new(&tokens[1..], device).map_err(be("targets"))?;
            let lp: Vec<f32> = super::loss::target_logprobs(&lg, &targets)?
                .to_vec1()
                .map_err(be("logprobs"))?;
            out.extend(lp.into_iter().map(Some));
        }
        Ok(out)
    }
}

fn finish(rows: Vec<Row>, default: StopReason) -> Vec<SampledSequence> {
    rows.into_iter()
        .map(|r| SampledSequence {
            tokens: r.tokens,
            logprobs: r.logprobs,
            stop_reason: r.done.unwrap_or(default),
            sequence_id: None,
        })
        .collect()
}

fn validate_params(p: &SamplingParams) -> Result<()> {
    if !p.temperature.is_finite() || p.temperature < 0.0 {
        return Err(Error::config(
            "sampling_params.temperature",
            format!("{} is not a finite number ≥ 0", p.temperature),
        ));
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return Err(Error::config(
            "sampling_params.top_p",
            format!("{} is not in (0, 1]", p.top_p),
        ));
    }
    if p.top_k == 0 || p.top_k < -1 {
        return Err(Error::config(
            "sampling_params.top_k",
            format!("{} is neither -1 (off) nor positive", p.top_k),
        ));
    }
    Ok(())
}

/// Picks the next token from one row of logits; returns it with its logprob.
fn pick(logits: &[f32], p: &SamplingParams, rng: &mut ChaCha8Rng) -> Result<(TokenId, f32)> {
    if logits.is_empty() {
        return Err(Error::Backend("empty logits".into()));
    }
    let temp = if p.temperature == 0.0 {
        1.0
    } else {
        p.temperature as f64
    };
    // Log-softmax of logits / temperature, in f64.
    let z: Vec<f64> = logits.iter().map(|&l| l as f64 / temp).collect();
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() || z.iter().any(|x| x.is_nan()) {
        return Err(Error::Backend(
            "logits are not finite (NaN or infinite weights?)".into(),
        ));
    }
    let lse = z.iter().map(|&x| (x - max).exp()).sum::<f64>().ln() + max;
    let lsm = |i: usize| (z[i] - lse) as f32;
    if p.temperature == 0.0 {
        let mut best = 0;
        for (i, &x) in z.iter().enumerate() {
            if x > z[best] {
                best = i;
            }
        }
        return Ok((best as TokenId, lsm(best)));
    }
    let probs: Vec<f64> = z.iter().map(|&x| (x - lse).exp()).collect();
    let truncated = p.top_k > 0 || p.top_p < 1.0;
    let tok = if !truncated {
        draw(rng, probs.iter().copied().enumerate())
    } else {
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        if p.top_k > 0 {
            order.truncate(p.top_k as usize);
        }
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = 0;
            for &i in &order {
                cum += probs[i];
                keep += 1;
                if cum >= p.top_p as f64 {
                    break;
                }
            }
            order.truncate(keep.max(1));
        }
        draw(rng, order.iter().map(|&i| (i, probs[i])))
    };
    Ok((tok as TokenId, lsm(tok)))
}

/// Draws an index from (index, weight) pairs (weights need not sum to one).
fn draw(rng: &mut ChaCha8Rng, items: impl Iterator<Item = (usize, f64)> + Clone) -> usize {
    let total: f64 = items.clone().map(|(_, w)| w).sum();
    let mut u = rng.random::<f64>() * total;
    let mut last = 0;
    for (i, w) in items {
        if w > 0.0 {
            last = i;
            if u < w {
                return i;
            }
            u -= w;
        }
    }
    last
}

#[async_trait]
impl Sampler for LocalSampler {
    async fn sample(
        &self,
        prompt: &ModelInput,
        num_samples: usize,
        params: &SamplingParams,
    ) -> Result<Vec<SampledSequence>> {
        let this = self.clone();
        let prompt = prompt.to_tokens();
        let params = params.clone();
        tokio::task::spawn_blocking(move || this.sample_blocking(&prompt, num_samples, &params))
            .await
            .map_err(|e| Error::Backend(format!("sampling task failed: {e}")))?
    }

    async fn compute_logprobs(&self, input: &ModelInput) -> Result<Vec<Option<f32>>> {
        let this = self.clone();
        let tokens = input.to_tokens();
        tokio::task::spawn_blocking(move || this.compute_logprobs_blocking(&tokens))
            .await
            .map_err(|e| Error::Backend(format!("logprob task failed: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SamplingParams {
        SamplingParams::default()
    }

    #[test]
    fn top_k_and_top_p_restrict_the_support_but_not_the_logprob() {
        let logits = [2.0f32, 1.0, 0.5, -1.0, -3.0];
        let lsm = {
            let m = 2.0f64;
            let lse = logits
                .iter()
                .map(|&x| (x as f64 - m).exp())
                .sum::<f64>()
                .ln()
                + m;
            logits
                .iter()
                .map(|&x| (x as f64 - lse) as f32)
                .collect::<Vec<_>>()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            let (t, lp) = pick(&logits, &params().top_k(2), &mut rng).unwrap();
            assert!((lp - lsm[t as usize]).abs() < 1e-6);
            seen[t as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0);
        assert_eq!(seen[2] + seen[3] + seen[4], 0);
        // p(0) ≈ 0.61, p(0)+p(1) ≈ 0.84: top_p 0.7 keeps two tokens.
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            let (t, _) = pick(&logits, &params().top_p(0.7), &mut rng).unwrap();
            seen[t as usize] += 1;
        }
        assert!(seen[0] > seen[1] && seen[1] > 0);
        assert_eq!(seen[2] + seen[3] + seen[4], 0);
        // Untruncated sampling reaches the tail and follows the probabilities.
        let mut seen = [0usize; 5];
        for _ in 0..20000 {
            let (t, _) = pick(&logits, &params(), &mut rng).unwrap();
            seen[t as usize] += 1;
        }
        let p0 = seen[0] as f64 / 20000.0;
        assert!((p0 - (lsm[0] as f64).exp()).abs() < 0.02, "{p0}");
        assert!(seen[3] > 0);
    }

    #[test]
    fn temperature_scales_the_returned_logprob() {
        let logits = [1.0f32, 0.0];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (t, lp) = pick(&logits, &params().temperature(0.5), &mut rng).unwrap();
        let z = [2.0f64, 0.0];
        let lse = (z[0].exp() + z[1].exp()).ln();
        assert!((lp as f64 - (z[t as usize] - lse)).abs() < 1e-6);
        // Greedy returns the temperature-1 logprob of the arg-max.
        let (t, lp) = pick(&logits, &params().temperature(0.0), &mut rng).unwrap();
        assert_eq!(t, 0);
        assert!((lp as f64 - (1.0 - (1f64.exp() + 1.0).ln())).abs() < 1e-6);
    }

    #[test]
    fn non_finite_logits_are_an_error() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert!(pick(&[f32::NAN, 0.0], &params(), &mut rng).is_err());
        assert!(pick(&[], &params(), &mut rng).is_err());
    }
}
