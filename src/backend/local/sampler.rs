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
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::config::Qwen3Config;
use super::model::{Adapters, KvCache, Mode, Model, Rope, RowPositions, Weights, be};
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
    /// The backend's own thread pool ([`LocalOptions::threads`](super::LocalOptions::threads)).
    pub pool: Option<Arc<rayon::ThreadPool>>,
    /// Pools of one thread each, as many as `pool` has threads (none when it has one), for
    /// work too small to gain from `pool`'s threads: one such piece of work runs on one of
    /// them, and independent pieces (concurrent sampling requests) on several at once.
    pub lanes: Vec<Arc<rayon::ThreadPool>>,
    /// Whether concurrent requests are decoded together
    /// ([`LocalOptions::batch_concurrent_requests`](super::LocalOptions::batch_concurrent_requests)).
    pub batch_requests: bool,
}

impl Shared {
    /// Runs `f` inside the backend's pool (candle's kernels then use its threads), or on
    /// the calling thread with rayon's global pool.
    pub(crate) fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    /// Runs `f` like [`run`](Self::run) for work on `rows` token positions at a time: on the
    /// one-thread pool `lanes[0]` when the work is [small](Self::is_small), where the other
    /// threads' wake-ups and spinning would cost more than they save; else on the backend's
    /// pool. Results do not depend on the choice.
    pub(crate) fn run_sized<R: Send>(&self, rows: usize, f: impl FnOnce() -> R + Send) -> R {
        self.run_sized_on(0, rows, f)
    }

    /// [`run_sized`](Self::run_sized) with small work on the one-thread pool `lane` (modulo
    /// their number), so that independent pieces of small work run side by side.
    pub(crate) fn run_sized_on<R: Send>(
        &self,
        lane: usize,
        rows: usize,
        f: impl FnOnce() -> R + Send,
    ) -> R {
        match self.lanes.get(lane % self.lanes.len().max(1)) {
            Some(single) if self.is_small(rows) => single.install(f),
            _ => self.run(f),
        }
    }

    /// Whether work on `rows` token positions at a time is too small to be split between
    /// the pool's threads: its MLP product has fewer than
    /// [`PAR_MIN_WORK`](super::matmul::PAR_MIN_WORK) multiply-adds per thread.
    pub(crate) fn is_small(&self, rows: usize) -> bool {
        let threads = self.pool.as_ref().map_or(1, |p| p.current_num_threads());
        let work = rows
            .saturating_mul(self.cfg.hidden_size)
            .saturating_mul(self.cfg.intermediate_size);
        work < super::matmul::PAR_MIN_WORK.saturating_mul(threads)
    }

    /// EOS ids: the tokenizer's and the model configuration's.
    pub(crate) fn eos_ids(&self) -> Vec<TokenId> {
        let mut v = self.cfg.eos_token_ids();
        if let Some(e) = self.tokenizer.eos_token_id()
            && !v.contains(&e)
        {
            v.push(e);
        }
        v
    }

    /// Checks token ids are inside the vocabulary.
    pub(crate) fn check_tokens(&self, tokens: &[TokenId], what: &str) -> Result<()> {
        if let Some((i, t)) = tokens
            .iter()
            .enumerate()
            .find(|&(_, &t)| t as usize >= self.cfg.vocab_size)
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
    pub(crate) batcher: Arc<Batcher>,
}

impl std::fmt::Debug for LocalSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSampler")
            .field("adapters", &self.adapters.is_some())
            .finish_non_exhaustive()
    }
}

/// Decoding slots allocated up front; the KV cache doubles beyond.
const INITIAL_DECODE_ROOM: usize = 128;

/// Most KV-cache values (rows × layers × 2 × kv heads × positions × head dim) planned for
/// one batch of concurrent requests (2²⁸ f32 = 1 GiB); requests beyond wait for the next
/// batch (a single request always runs).
const MAX_BATCH_KV: usize = 1 << 28;

/// Requests waiting to be sampled, and the runners sampling them.
#[derive(Default)]
pub(crate) struct Batcher {
    state: Mutex<BatcherState>,
}

#[derive(Default)]
struct BatcherState {
    queue: Vec<(Request, Reply)>,
    /// `busy[l]`: a runner holds lane `l` ([`Shared::lanes`]); runners take lanes from 0.
    busy: Vec<bool>,
    /// The most runners seen at once (tests check that small requests run side by side).
    #[cfg(test)]
    peak: usize,
}

impl BatcherState {
    #[cfg(test)]
    fn runners(&self) -> usize {
        self.busy.iter().filter(|&&b| b).count()
    }

    /// Takes the first free lane below `max`, if any.
    fn take_lane(&mut self, max: usize) -> Option<usize> {
        if self.busy.len() < max {
            self.busy.resize(max, false);
        }
        let lane = self.busy.iter().take(max).position(|&b| !b)?;
        self.busy[lane] = true;
        #[cfg(test)]
        {
            self.peak = self.peak.max(self.runners());
        }
        Some(lane)
    }
}

type Reply = tokio::sync::oneshot::Sender<Result<Vec<SampledSequence>>>;

/// One sampling request.
pub(crate) struct Request {
    pub prompt: Vec<TokenId>,
    pub n: usize,
    pub params: SamplingParams,
}

/// A request's decoding plan.
struct Plan {
    max_new: usize,
    rules: StopRules,
    rng: ChaCha8Rng,
}

/// One sequence being sampled, for request `req`.
struct Row {
    req: usize,
    tokens: Vec<TokenId>,
    logprobs: Vec<f32>,
    done: Option<StopReason>,
}

impl Row {
    fn new(req: usize) -> Self {
        Row {
            req,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            done: None,
        }
    }
}

/// Stop rules resolved from `SamplingParams::stop` (Tinker semantics).
struct StopRules {
    strings: Vec<String>,
    tokens: HashSet<TokenId>,
}

impl StopRules {
    /// Bytes of the longest stop string.
    fn longest(&self) -> usize {
        self.strings.iter().map(String::len).max().unwrap_or(0)
    }
}

/// Bytes of decoded context, beyond a stop string's length, kept before the newest token:
/// the start of a decoded window can differ from the same text decoded in context (a
/// sentence-piece decoder drops the first token's leading space; a byte-level token cut from
/// its multi-byte character decodes to U+FFFD), and this margin keeps such differences out
/// of the part of the window a new match can touch.
const STOP_WINDOW_MARGIN: usize = 16;

/// Whether the decoded completion `tokens` now contains one of the stop strings of `rules`,
/// given that it did not before the last token.
///
/// The same answer as searching the decoding of every token, at a cost independent of the
/// completion's length: a new match ends in the last token's text, so it starts at most
/// `longest - 1` bytes before it. The window of tokens decoded grows (doubling) until the
/// tokens before the last one decode to at least `longest - 1 +` [`STOP_WINDOW_MARGIN`]
/// bytes, or covers the whole completion.
fn stop_string_hit(tokenizer: &Tokenizer, tokens: &[TokenId], rules: &StopRules) -> Result<bool> {
    if rules.strings.is_empty() || tokens.is_empty() {
        return Ok(false);
    }
    let need = rules.longest().saturating_sub(1) + STOP_WINDOW_MARGIN;
    let n = tokens.len();
    // Tokens usually decode to at least one byte each: start with enough of them.
    let mut k = (need + 1).min(n);
    loop {
        if k < n {
            let before = tokenizer.decode(&tokens[n - k..n - 1])?;
            if before.len() < need {
                k = (k * 2).min(n);
                continue;
            }
        }
        let text = tokenizer.decode(&tokens[n - k..])?;
        return Ok(rules.strings.iter().any(|s| text.contains(s.as_str())));
    }
}

impl LocalSampler {
    /// A sampler over `weights` (+ `adapters`).
    pub(crate) fn new(
        shared: Arc<Shared>,
        weights: Arc<Weights>,
        adapters: Option<Arc<Adapters>>,
    ) -> Self {
        LocalSampler {
            shared,
            weights,
            adapters,
            batcher: Arc::new(Batcher::default()),
        }
    }

    /// KV-cache values a request needs, roughly (see [`MAX_BATCH_KV`]).
    fn kv_cost(&self, r: &Request) -> usize {
        let c = &self.shared.cfg;
        let room = r
            .params
            .max_tokens
            .map(|m| m as usize)
            .unwrap_or(usize::MAX);
        let positions = r.prompt.len() + room.min(INITIAL_DECODE_ROOM);
        r.n.max(1)
            .saturating_mul(c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim())
            .saturating_mul(positions)
    }

    /// How many runners may sample this sampler's queue side by side: one when requests are
    /// batched, on a GPU, or when `r` is large enough for the whole pool; else one per lane, each
    /// request then decoded alone on a one-thread pool, so its result is the same whichever
    /// runner takes it.
    fn max_runners(&self, r: &Request) -> usize {
        if self.shared.batch_requests
            || !self.shared.device.is_cpu()
            || !self.shared.is_small(r.n.max(1))
        {
            1
        } else {
            self.shared.lanes.len().max(1)
        }
    }

    /// Runs queued requests, holding lane `lane`, until the queue is empty: in batches when
    /// [`Shared::batch_requests`] is on, else one request at a time (in arrival order).
    fn run_batches(&self, lane: usize) {
        let batching = self.shared.batch_requests;
        if batching {
            // Let concurrent callers (e.g. the other futures of a `join_all`) queue their
            // requests, so they are sampled in the same batch.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        loop {
            let batch: Vec<(Request, Reply)> = {
                let Ok(mut st) = self.batcher.state.lock() else {
                    return;
                };
                if st.queue.is_empty() {
                    if let Some(b) = st.busy.get_mut(lane) {
                        *b = false;
                    }
                    return;
                }
                let mut total = 0usize;
                let mut take = 0;
                for (r, _) in &st.queue {
                    total = total.saturating_add(self.kv_cost(r));
                    if take > 0 && (!batching || total > MAX_BATCH_KV) {
                        break;
                    }
                    take += 1;
                }
                st.queue.drain(..take).collect()
            };
            let (reqs, replies): (Vec<Request>, Vec<Reply>) = batch.into_iter().unzip();
            let results = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.sample_many_on(lane, &reqs)
            }))
            .unwrap_or_else(|_| {
                reqs.iter()
                    .map(|_| Err(Error::Backend("sampling panicked".into())))
                    .collect()
            });
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
    }

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

    /// Samples synchronously, on the calling thread; the same result, bit for bit, as
    /// [`Sampler::sample`] (unless
    /// [`LocalOptions::batch_concurrent_requests`](super::LocalOptions::batch_concurrent_requests)
    /// batched that call with others).
    pub fn sample_blocking(
        &self,
        prompt: &[TokenId],
        num_samples: usize,
        params: &SamplingParams,
    ) -> Result<Vec<SampledSequence>> {
        let req = Request {
            prompt: prompt.to_vec(),
            n: num_samples,
            params: params.clone(),
        };
        self.sample_many(std::slice::from_ref(&req))
            .pop()
            .unwrap_or_else(|| Err(Error::Backend("no result".into())))
    }

    /// Checks a request; returns its decoding plan.
    fn plan(&self, r: &Request) -> Result<Plan> {
        validate_params(&r.params)?;
        if r.prompt.is_empty() {
            return Err(Error::config("prompt", "is empty"));
        }
        self.shared.check_tokens(&r.prompt, "prompt")?;
        let max_pos = self.shared.rope.max_positions();
        if r.prompt.len() >= max_pos {
            return Err(Error::config(
                "prompt",
                format!(
                    "{} tokens leave no room under max_position_embeddings = {max_pos}",
                    r.prompt.len()
                ),
            ));
        }
        let room = max_pos - r.prompt.len();
        let max_new = r
            .params
            .max_tokens
            .map(|m| (m as usize).min(room))
            .unwrap_or(room);
        Ok(Plan {
            max_new,
            rules: self.stop_rules(&r.params.stop),
            rng: ChaCha8Rng::seed_from_u64(r.params.seed.unwrap_or_else(|| rand::rng().random())),
        })
    }

    /// Samples several requests as one batch: each prompt is prefilled once (batch 1), then
    /// every row of every request decodes together, shorter prompts left-padded in the KV
    /// cache and masked. Each request draws from its own seeded generator, but its logits
    /// can differ from a solo run in the last bits (candle's matrix products sum in an order
    /// that depends on the number of rows), and so, rarely, can its tokens: only
    /// [`LocalOptions::batch_concurrent_requests`](super::LocalOptions::batch_concurrent_requests)
    /// passes more than one request.
    pub(crate) fn sample_many(&self, reqs: &[Request]) -> Vec<Result<Vec<SampledSequence>>> {
        self.sample_many_on(0, reqs)
    }

    /// [`sample_many`](Self::sample_many), small work on the one-thread pool `lane`.
    fn sample_many_on(&self, lane: usize, reqs: &[Request]) -> Vec<Result<Vec<SampledSequence>>> {
        let rows = reqs.iter().map(|r| r.n).sum();
        self.shared
            .run_sized_on(lane, rows, || self.sample_many_here(reqs))
    }

    /// [`sample_many`](Self::sample_many) on the current thread and rayon pool.
    fn sample_many_here(&self, reqs: &[Request]) -> Vec<Result<Vec<SampledSequence>>> {
        let mut results: Vec<Option<Result<Vec<SampledSequence>>>> =
            reqs.iter().map(|_| None).collect();
        let mut plans: Vec<Option<Plan>> = Vec::with_capacity(reqs.len());
        for (i, r) in reqs.iter().enumerate() {
            match self.plan(r) {
                Err(e) => {
                    results[i] = Some(Err(e));
                    plans.push(None);
                }
                Ok(p) if r.n == 0 || p.max_new == 0 => {
                    results[i] = Some(Ok(finish(
                        (0..r.n).map(|_| Row::new(i)).collect(),
                        StopReason::Length,
                    )));
                    plans.push(None);
                }
                Ok(p) => plans.push(Some(p)),
            }
        }
        let live: Vec<usize> = (0..reqs.len()).filter(|&i| plans[i].is_some()).collect();
        if !live.is_empty() {
            match self.decode(reqs, &live, &mut plans) {
                Ok(done) => {
                    for (i, seqs) in done {
                        results[i] = Some(Ok(seqs));
                    }
                }
                Err(e) => {
                    for &i in &live {
                        results[i] = Some(Err(Error::Backend(e.to_string())));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Backend("request was not run".into()))))
            .collect()
    }

    /// Decodes the requests `live` (all valid, with work to do) together.
    fn decode(
        &self,
        reqs: &[Request],
        live: &[usize],
        plans: &mut [Option<Plan>],
    ) -> Result<Vec<(usize, Vec<SampledSequence>)>> {
        let model = self.model();
        let device = &self.shared.device;
        let n_layers = self.shared.cfg.num_hidden_layers;
        // Prefill every prompt once.
        let mut prefilled = Vec::with_capacity(live.len());
        for &i in live {
            let prompt = &reqs[i].prompt;
            let mut cache = KvCache::new(n_layers, prompt.len());
            let ids = Tensor::new(prompt.as_slice(), device)
                .and_then(|t| t.unsqueeze(0))
                .map_err(be("prompt tensor"))?;
            let logits = model.forward(&ids, 0, Some(&mut cache), Mode::Infer, true)?;
            let logits: Vec<f32> = logits
                .flatten_all()
                .and_then(|t| t.to_vec1())
                .map_err(be("reading logits"))?;
            prefilled.push((cache, logits));
        }
        let end = live
            .iter()
            .map(|&i| reqs[i].prompt.len())
            .max()
            .unwrap_or(0);
        let max_new = |i: usize| plans[i].as_ref().map(|p| p.max_new).unwrap_or(0);
        let longest = live.iter().map(|&i| max_new(i)).max().unwrap_or(0);
        // Room for the first decoding steps; the cache doubles when it runs out.
        let capacity = end + longest.min(INITIAL_DECODE_ROOM);
        let parts: Vec<(&KvCache, usize, usize)> = live
            .iter()
            .zip(&prefilled)
            .map(|(&i, (c, _))| (c, reqs[i].prompt.len(), reqs[i].n))
            .collect();
        let mut cache = KvCache::stack(&parts, end, capacity)?;
        drop(parts);
        let mut rows: Vec<Row> = Vec::new();
        let mut row_logits: Vec<Vec<f32>> = Vec::new();
        for (&i, (_, logits)) in live.iter().zip(&prefilled) {
            for _ in 0..reqs[i].n {
                rows.push(Row::new(i));
                row_logits.push(logits.clone());
            }
        }
        drop(prefilled);
        let mut active: Vec<usize> = (0..rows.len()).collect();
        for step in 0..longest {
            // Each drawing row's uniform number, in row order from its request's generator
            // (what picking the rows one after the other would take), then every row's pick
            // side by side on the pool (an exponential per vocabulary entry and row): the
            // same tokens on any number of threads.
            let mut uniforms = Vec::with_capacity(active.len());
            for &r in &active {
                let req = rows[r].req;
                let plan = plans[req]
                    .as_mut()
                    .ok_or_else(|| Error::Backend("missing plan".into()))?;
                uniforms.push(draws(&reqs[req].params).then(|| plan.rng.random::<f64>()));
            }
            let picks: Vec<Result<(TokenId, f32)>> = row_logits
                .par_iter()
                .zip(&active)
                .zip(&uniforms)
                .map(|((logits, &r), &u)| {
                    pick_with(logits, &reqs[rows[r].req].params, || u.unwrap_or(0.0))
                })
                .collect();
            for (&r, picked) in active.iter().zip(picks) {
                let req = rows[r].req;
                let plan = plans[req]
                    .as_mut()
                    .ok_or_else(|| Error::Backend("missing plan".into()))?;
                let (tok, lp) = picked?;
                let row = &mut rows[r];
                row.tokens.push(tok);
                row.logprobs.push(lp);
                if plan.rules.tokens.contains(&tok)
                    || stop_string_hit(&self.shared.tokenizer, &row.tokens, &plan.rules)?
                {
                    row.done = Some(StopReason::Stop);
                }
                if row.done.is_none() && row.tokens.len() >= plan.max_new {
                    row.done = Some(StopReason::Length);
                }
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
            let slot = end + step;
            let mut last = Vec::with_capacity(active.len());
            let mut positions = Vec::with_capacity(active.len());
            let mut padded = false;
            for &r in &active {
                let row = &rows[r];
                last.push(row.tokens.last().copied().unwrap_or(0));
                let p = reqs[row.req].prompt.len();
                positions.push((p + step) as u32);
                padded |= p < end;
            }
            let mask = if padded {
                let mut m = Vec::with_capacity(active.len() * (slot + 1));
                for &r in &active {
                    let pad = end - reqs[rows[r].req].prompt.len();
                    m.extend((0..=slot).map(|j| if j < pad { f32::NEG_INFINITY } else { 0.0 }));
                }
                Some(Tensor::from_vec(m, (active.len(), slot + 1), device).map_err(be("mask"))?)
            } else {
                None
            };
            let k = active.len();
            let rows_pos = RowPositions {
                positions: Tensor::from_vec(positions, k, device).map_err(be("positions"))?,
                mask,
            };
            let ids = Tensor::from_vec(last, (k, 1), device).map_err(be("decode tensor"))?;
            let logits = model.forward_rows(&ids, slot, &rows_pos, &mut cache, Mode::Infer)?;
            row_logits = logits
                .squeeze(1)
                .and_then(|t| t.to_vec2())
                .map_err(be("reading logits"))?;
        }
        let mut out: Vec<(usize, Vec<SampledSequence>)> =
            live.iter().map(|&i| (i, Vec::new())).collect();
        for row in rows {
            if let Some(slot) = out.iter_mut().find(|(i, _)| *i == row.req) {
                slot.1.extend(finish(vec![row], StopReason::Length));
            }
        }
        Ok(out)
    }

    /// The logits (one row of vocabulary size per position) of the model for `tokens`, in one forward pass.
    pub fn logits_blocking(&self, tokens: &[TokenId]) -> Result<Vec<Vec<f32>>> {
        self.shared.run(|| self.logits_here(tokens))
    }

    fn logits_here(&self, tokens: &[TokenId]) -> Result<Vec<Vec<f32>>> {
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
        self.shared.run(|| self.compute_logprobs_here(tokens))
    }

    fn compute_logprobs_here(&self, tokens: &[TokenId]) -> Result<Vec<Option<f32>>> {
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

/// [`pick_with`] drawing from `rng` (the unit tests' entry).
#[cfg(test)]
fn pick(logits: &[f32], p: &SamplingParams, rng: &mut ChaCha8Rng) -> Result<(TokenId, f32)> {
    pick_with(logits, p, || rng.random::<f64>())
}

/// Whether a pick with `p` draws a uniform number (every temperature but 0, greedy).
fn draws(p: &SamplingParams) -> bool {
    p.temperature != 0.0
}

/// Picks the next token from one row of logits; returns it with its logprob. The uniform
/// number of the draw (in `[0, 1)`) comes from `uniform`, called once when [`draws`] and
/// not at all otherwise: a decoding step takes its rows' numbers in row order from each
/// request's generator, then picks every row side by side.
fn pick_with(
    logits: &[f32],
    p: &SamplingParams,
    uniform: impl FnOnce() -> f64,
) -> Result<(TokenId, f32)> {
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
    // One exponential per entry: `e[i] = exp(z[i] - max)` gives both the log-sum-exp and
    // the (unnormalised) weights the draw uses; `draw` and the nucleus scale by the sum.
    let e: Vec<f64> = z.iter().map(|&x| (x - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    let lse = sum.ln() + max;
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
    let truncated = p.top_k > 0 || p.top_p < 1.0;
    let tok = if !truncated {
        draw(uniform, e.iter().copied().enumerate())
    } else {
        let mut order: Vec<usize> = (0..e.len()).collect();
        order.sort_by(|&a, &b| e[b].total_cmp(&e[a]).then(a.cmp(&b)));
        if p.top_k > 0 {
            order.truncate(p.top_k as usize);
        }
        if p.top_p < 1.0 {
            let target = p.top_p as f64 * sum;
            let mut cum = 0.0;
            let mut keep = 0;
            for &i in &order {
                cum += e[i];
                keep += 1;
                if cum >= target {
                    break;
                }
            }
            order.truncate(keep.max(1));
        }
        draw(uniform, order.iter().map(|&i| (i, e[i])))
    };
    Ok((tok as TokenId, lsm(tok)))
}

/// Draws an index from (index, weight) pairs (weights need not sum to one) with the
/// uniform number `uniform` gives.
fn draw(uniform: impl FnOnce() -> f64, items: impl Iterator<Item = (usize, f64)> + Clone) -> usize {
    let total: f64 = items.clone().map(|(_, w)| w).sum();
    let mut u = uniform() * total;
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
        let (tx, rx) = tokio::sync::oneshot::channel();
        let req = Request {
            prompt: prompt.to_tokens(),
            n: num_samples,
            params: params.clone(),
        };
        let max = self.max_runners(&req);
        let start = {
            let mut st = self
                .batcher
                .state
                .lock()
                .map_err(|_| Error::Backend("sampler state poisoned".into()))?;
            st.queue.push((req, tx));
            // A new runner when none runs (lane 0 is then free), or when this request may
            // run beside the others.
            st.take_lane(max)
        };
        if let Some(lane) = start {
            // Spawned before the first await, so a dropped caller cannot strand the queue.
            let this = self.clone();
            tokio::task::spawn_blocking(move || this.run_batches(lane));
        }
        rx.await
            .map_err(|_| Error::Cancelled("the sampling batch was dropped".into()))?
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

    /// Qwen's byte-level tokenizer (the integration tests' fixture).
    fn qwen_tokenizer() -> Tokenizer {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/qwen3-tokenizer.json.zst"
        );
        let json = zstd::decode_all(std::fs::read(path).unwrap().as_slice()).unwrap();
        Tokenizer::from_bytes(&json).unwrap()
    }

    #[test]
    fn stop_window_finds_what_decoding_everything_finds() {
        let tok = qwen_tokenizer();
        // Single-byte tokens (Qwen's ids of the bytes are < 256 for printable ASCII), whole
        // words, a multi-byte character cut into byte tokens, a special token.
        let mut pieces: Vec<Vec<TokenId>> = [
            "a",
            "b",
            "c",
            " ",
            "\n",
            "é",
            "日本",
            " the",
            "Answer",
            "<|im_end|>",
        ]
        .iter()
        .map(|t| tok.encode(t).unwrap())
        .collect();
        pieces.push(vec![tok.token_to_id("<|im_end|>").unwrap()]);
        let bytes_of_e: Vec<TokenId> = tok.encode("é").unwrap();
        assert!(!bytes_of_e.is_empty());
        let stops = [
            // Spans many single-character tokens.
            "abcabcabcabcabcabcabcabcabcabcabc".to_string(),
            "c\nb".to_string(),
            "é the".to_string(),
            "日本<|im_end|>".to_string(),
            "Answer a".to_string(),
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut hits = 0;
        for case in 0..300 {
            let rules = StopRules {
                strings: vec![stops[case % stops.len()].clone()],
                tokens: HashSet::new(),
            };
            let mut tokens: Vec<TokenId> = Vec::new();
            for _ in 0..120 {
                // Mostly the characters of the stop string, so it occurs by chance.
                let p = if rng.random::<f64>() < 0.7 {
                    let s = &rules.strings[0];
                    let chars: Vec<char> = s.chars().collect();
                    let c = chars[rng.random_range(0..chars.len())];
                    tok.encode(&c.to_string()).unwrap()
                } else {
                    pieces[rng.random_range(0..pieces.len())].clone()
                };
                let mut found = false;
                for t in p {
                    tokens.push(t);
                    let full = tok.decode(&tokens).unwrap();
                    let want = rules.strings.iter().any(|s| full.contains(s.as_str()));
                    let got = stop_string_hit(&tok, &tokens, &rules).unwrap();
                    assert_eq!(got, want, "{full:?} / {:?}", rules.strings);
                    if want {
                        found = true;
                        break;
                    }
                }
                if found {
                    hits += 1;
                    break;
                }
            }
        }
        // The comparison is not vacuous: many streams meet their stop string (90 of 300 at this seed).
        assert!(hits > 60, "{hits}");
    }

    #[test]
    fn stop_string_split_across_single_character_tokens() {
        let tok = qwen_tokenizer();
        let stop = "0123456789abcdefghij0123456789abcdefghij".to_string();
        let rules = StopRules {
            strings: vec![stop.clone()],
            tokens: HashSet::new(),
        };
        let mut tokens: Vec<TokenId> = tok.encode("x".repeat(50).as_str()).unwrap();
        for (i, c) in stop.chars().enumerate() {
            let ids = tok.encode(&c.to_string()).unwrap();
            assert_eq!(ids.len(), 1);
            tokens.extend(ids);
            let hit = stop_string_hit(&tok, &tokens, &rules).unwrap();
            assert_eq!(hit, i + 1 == stop.len(), "after {} characters", i + 1);
        }
    }

    #[test]
    fn shared_run_uses_the_backend_pool() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let tokenizer = crate::backend::local::char_tokenizer(&["a".to_string()], None).unwrap();
        let cfg = Qwen3Config::new(1, 8, 8, 1, 2, 1, 4, 8);
        let rope = Rope::new(&cfg, &Device::Cpu).unwrap();
        let mut shared = Shared {
            cfg,
            rope,
            tokenizer,
            device: Device::Cpu,
            pool: Some(Arc::new(pool)),
            lanes: Vec::new(),
            batch_requests: false,
        };
        let in_pool = || (rayon::current_thread_index(), rayon::current_num_threads());
        assert_eq!(shared.run(in_pool), (Some(0), 1));
        shared.pool = None;
        assert_eq!(shared.run(in_pool).0, None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_small_requests_run_side_by_side_with_the_results_of_one_thread() {
        use crate::PolicyBackend;
        use crate::backend::local::{LocalBackend, LocalOptions};
        let vocab: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
        let tokenizer = crate::backend::local::char_tokenizer(&vocab, Some(0)).unwrap();
        let cfg = Qwen3Config::new(40, 16, 32, 1, 2, 1, 8, 256).with_eos(Some(0));
        let params = |seed: u64| {
            SamplingParams::default()
                .max_tokens(48)
                .seed(seed)
                .stop(crate::types::StopCondition::Strings(vec![]))
        };
        let mut runs = Vec::new();
        for threads in [1, 3] {
            let opts = LocalOptions::default().threads(threads);
            let backend = LocalBackend::random(cfg.clone(), tokenizer.clone(), opts).unwrap();
            let sampler = backend.sampler().await.unwrap();
            let prompts: Vec<ModelInput> = (0..6)
                .map(|i| ModelInput::from_tokens(vec![1 + i, 2 + i, 3]))
                .collect();
            let seeded: Vec<SamplingParams> = (0..6).map(params).collect();
            let calls = prompts
                .iter()
                .zip(&seeded)
                .map(|(p, s)| sampler.sample(p, 3, s));
            let out: Vec<Vec<SampledSequence>> =
                futures::future::try_join_all(calls).await.unwrap();
            let peak = sampler.batcher.state.lock().unwrap().peak;
            runs.push((threads, out, peak));
        }
        let (_, one, peak_one) = &runs[0];
        let (_, three, peak_three) = &runs[1];
        assert_eq!(*peak_one, 1, "one thread, one runner");
        assert!(
            *peak_three >= 2,
            "3 threads: {peak_three} runner(s) at most"
        );
        assert!(*peak_three <= 3);
        for (a, b) in one.iter().zip(three) {
            assert_eq!(a.len(), 3);
            for (x, y) in a.iter().zip(b) {
                assert_eq!(x.tokens, y.tokens);
                assert_eq!(x.logprobs, y.logprobs);
            }
        }
    }

    #[test]
    fn non_finite_logits_are_an_error() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert!(pick(&[f32::NAN, 0.0], &params(), &mut rng).is_err());
        assert!(pick(&[], &params(), &mut rng).is_err());
    }
}
