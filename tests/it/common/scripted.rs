//! Test helpers for the trainer: a scripted backend that returns fixed samples and records
//! every call, a byte-level renderer, and a tiny tokenizer. Not a product feature.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rlvr::renderer::TrainOnWhat;
use rlvr::{
    PolicyBackend, Renderer, Sampler,
    backend::Pending,
    message::Message,
    renderer::ParseTermination,
    tokenizer::Tokenizer,
    types::{
        AdamParams, CheckpointRef, Datum, ForwardBackwardOutput, LossFn, ModelInput,
        OptimStepOutput, SampledSequence, SamplingParams, StopCondition, StopReason, TensorData,
        TokenId,
    },
};

/// One call seen by the scripted backend, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// `forward_backward` submitted with this many datums.
    SubmitForwardBackward(usize),
    /// `optim_step` submitted.
    SubmitOptim,
    /// A `forward_backward` result awaited.
    AwaitForwardBackward,
    /// An `optim_step` result awaited.
    AwaitOptim,
    /// A sampler created at this policy version.
    NewSampler(u64),
    /// `sample` called at this policy version with this seed (and these sampling params).
    Sample {
        version: u64,
        seed: Option<u64>,
        params: SamplingParams,
    },
    /// `save_state(name)`.
    Save(String),
    /// `load_state(name)`.
    Load(String),
}

/// A completion to return: text bytes (the stop token 0 is appended when `stop`).
#[derive(Debug, Clone)]
pub struct Scripted {
    pub text: String,
    pub logprobs: Vec<f32>,
    pub stop: bool,
}

impl Scripted {
    /// `text` + stop token, with the given logprobs (one per byte + one for the stop).
    pub fn new(text: &str, logprobs: &[f32]) -> Self {
        Scripted {
            text: text.into(),
            logprobs: logprobs.to_vec(),
            stop: true,
        }
    }
    /// A completion cut by `max_tokens` (no stop token), logprob -1 per byte.
    pub fn truncated(text: &str) -> Self {
        Scripted {
            text: text.into(),
            logprobs: vec![-1.0; text.len()],
            stop: false,
        }
    }
    fn to_sequence(&self) -> SampledSequence {
        let mut tokens: Vec<TokenId> = self.text.bytes().map(u32::from).collect();
        if self.stop {
            tokens.push(0);
        }
        let logprobs = if self.logprobs.len() == tokens.len() {
            self.logprobs.clone()
        } else {
            vec![-1.0; tokens.len()]
        };
        SampledSequence {
            tokens,
            logprobs,
            stop_reason: if self.stop {
                StopReason::Stop
            } else {
                StopReason::Length
            },
            sequence_id: None,
        }
    }
}

#[derive(Default)]
pub struct Shared {
    pub events: Vec<Event>,
    /// Datums of each `forward_backward` call.
    pub datums: Vec<Vec<Datum>>,
    /// Saved versions by checkpoint name.
    pub saved: HashMap<String, u64>,
    /// The loss of each `forward_backward` call.
    pub losses: Vec<LossFn>,
    /// `sample` calls that had returned so far.
    pub samples_done: usize,
    /// `samples_done` when each `forward_backward` was submitted.
    pub samples_done_at_fb: Vec<usize>,
}

/// What the sampler returns for a prompt: completions by prompt text (cycled to `n`); a
/// prompt without a script gets `"?"` + stop.
pub type Script = HashMap<String, Vec<Scripted>>;

/// The scripted backend. The policy version is the number of optimizer steps.
#[derive(Clone)]
pub struct ScriptedBackend {
    tokenizer: Tokenizer,
    script: Arc<Script>,
    pub shared: Arc<Mutex<Shared>>,
    version: Arc<AtomicU64>,
    /// Reference logprob returned for every position by the reference sampler.
    pub reference_logprob: f32,
}

impl ScriptedBackend {
    pub fn new(script: Script) -> Self {
        ScriptedBackend {
            tokenizer: tiny_tokenizer(),
            script: Arc::new(script),
            shared: Arc::default(),
            version: Arc::default(),
            reference_logprob: -1.0,
        }
    }
    pub fn events(&self) -> Vec<Event> {
        self.shared.lock().unwrap().events.clone()
    }
    pub fn datums(&self) -> Vec<Vec<Datum>> {
        self.shared.lock().unwrap().datums.clone()
    }
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }
    fn log(&self, e: Event) {
        self.shared.lock().unwrap().events.push(e);
    }
}

pub struct ScriptedSampler {
    script: Arc<Script>,
    shared: Arc<Mutex<Shared>>,
    version: u64,
    reference: Option<f32>,
}

#[async_trait]
impl Sampler for ScriptedSampler {
    async fn sample(
        &self,
        prompt: &ModelInput,
        num_samples: usize,
        params: &SamplingParams,
    ) -> rlvr::Result<Vec<SampledSequence>> {
        self.shared.lock().unwrap().events.push(Event::Sample {
            version: self.version,
            seed: params.seed,
            params: params.clone(),
        });
        let text = bytes_to_text(&prompt.to_tokens());
        if text.starts_with("slow") {
            // A slow prompt: lets a test observe what happens while it is being sampled.
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let fallback = vec![Scripted::new("?", &[-1.0, -1.0])];
        let list = self.script.get(&text).unwrap_or(&fallback);
        let out = (0..num_samples)
            .map(|i| list[i % list.len()].to_sequence())
            .collect();
        self.shared.lock().unwrap().samples_done += 1;
        Ok(out)
    }

    async fn compute_logprobs(&self, input: &ModelInput) -> rlvr::Result<Vec<Option<f32>>> {
        let lp = self.reference.unwrap_or(-1.0);
        Ok((0..input.len())
            .map(|i| if i == 0 { None } else { Some(lp) })
            .collect())
    }
}

#[async_trait]
impl PolicyBackend for ScriptedBackend {
    type Sampler = ScriptedSampler;

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    async fn forward_backward(
        &self,
        data: Vec<Datum>,
        loss: LossFn,
    ) -> rlvr::Result<Pending<ForwardBackwardOutput>> {
        for d in &data {
            d.validate(&loss)?;
        }
        self.log(Event::SubmitForwardBackward(data.len()));
        // The learner's logprobs: the sampler's, shifted by -0.25 on every position.
        let outputs = data
            .iter()
            .map(|d| {
                let lp = d.logprobs().unwrap_or(&[]);
                BTreeMap::from([(
                    "logprobs".to_string(),
                    TensorData::f32(lp.iter().map(|l| l - 0.25).collect()),
                )])
            })
            .collect();
        {
            let mut shared = self.shared.lock().unwrap();
            shared.datums.push(data);
            shared.losses.push(loss);
            let done = shared.samples_done;
            shared.samples_done_at_fb.push(done);
        }
        let shared = Arc::clone(&self.shared);
        Ok(Pending::new(async move {
            shared
                .lock()
                .unwrap()
                .events
                .push(Event::AwaitForwardBackward);
            Ok(ForwardBackwardOutput {
                loss_fn_output_type: "scripted".into(),
                loss_fn_outputs: outputs,
                metrics: BTreeMap::from([("loss:sum".to_string(), 1.5)]),
            })
        }))
    }

    async fn forward(
        &self,
        _data: Vec<Datum>,
        _loss: LossFn,
    ) -> rlvr::Result<Pending<ForwardBackwardOutput>> {
        Err(rlvr::Error::Unsupported("forward".into()))
    }

    async fn optim_step(&self, _params: AdamParams) -> rlvr::Result<Pending<OptimStepOutput>> {
        self.log(Event::SubmitOptim);
        self.version.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::clone(&self.shared);
        Ok(Pending::new(async move {
            shared.lock().unwrap().events.push(Event::AwaitOptim);
            Ok(OptimStepOutput::default())
        }))
    }

    async fn sampler(&self) -> rlvr::Result<ScriptedSampler> {
        let version = self.version();
        self.log(Event::NewSampler(version));
        Ok(ScriptedSampler {
            script: Arc::clone(&self.script),
            shared: Arc::clone(&self.shared),
            version,
            reference: None,
        })
    }

    async fn reference_sampler(&self) -> rlvr::Result<ScriptedSampler> {
        Ok(ScriptedSampler {
            script: Arc::clone(&self.script),
            shared: Arc::clone(&self.shared),
            version: u64::MAX,
            reference: Some(self.reference_logprob),
        })
    }

    async fn save_state(&self, name: &str) -> rlvr::Result<CheckpointRef> {
        self.log(Event::Save(name.into()));
        let v = self.version();
        self.shared.lock().unwrap().saved.insert(name.into(), v);
        Ok(CheckpointRef {
            name: name.into(),
            path: format!("mem://{name}/{v}"),
        })
    }

    async fn load_state(&self, checkpoint: &CheckpointRef) -> rlvr::Result<()> {
        self.log(Event::Load(checkpoint.name.clone()));
        let v: u64 = checkpoint
            .path
            .rsplit('/')
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| rlvr::Error::Checkpoint {
                path: checkpoint.path.clone(),
                message: "bad".into(),
            })?;
        self.version.store(v, Ordering::SeqCst);
        Ok(())
    }
}

fn bytes_to_text(tokens: &[TokenId]) -> String {
    tokens.iter().map(|&t| char::from(t as u8)).collect()
}

/// A renderer with one token per byte: the prompt is the concatenated message contents
/// followed by `>`; responses end with token 0 (the stop token).
#[derive(Debug, Clone, Copy)]
pub struct ByteRenderer;

impl Renderer for ByteRenderer {
    fn generation_prompt(&self, messages: &[Message]) -> rlvr::Result<ModelInput> {
        let mut text: String = messages.iter().map(|m| m.text().into_owned()).collect();
        text.push('>');
        Ok(ModelInput::from_tokens(
            text.bytes().map(u32::from).collect(),
        ))
    }
    fn supervised_example(
        &self,
        _messages: &[Message],
        _train_on: TrainOnWhat,
    ) -> rlvr::Result<(ModelInput, Vec<f32>)> {
        Err(rlvr::Error::Unsupported("supervised".into()))
    }
    fn stop(&self) -> StopCondition {
        StopCondition::Tokens(vec![0])
    }
    fn parse_response(&self, tokens: &[TokenId]) -> (Message, ParseTermination) {
        match tokens.split_last() {
            Some((0, body)) => (
                Message::assistant(bytes_to_text(body)),
                ParseTermination::StopSequence,
            ),
            _ => (
                Message::assistant(bytes_to_text(tokens)),
                ParseTermination::Malformed,
            ),
        }
    }
}

/// A tiny word-level tokenizer (the backend trait needs one; these tests never encode).
pub fn tiny_tokenizer() -> Tokenizer {
    use tokenizers::models::wordlevel::WordLevel;
    let vocab = [("<eos>", 0u32), ("[UNK]", 1), ("a", 2)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v));
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    Tokenizer::new(tokenizers::Tokenizer::new(model), None, Some(0))
}
