//! Helpers shared by the integration tests.

use std::collections::HashMap;
use std::sync::OnceLock;

use rlvr::tokenizer::Tokenizer;

pub mod isolate;
pub mod renderer_fixtures;
pub mod scripted;

/// The id of `<|endoftext|>` in Qwen's vocabulary (EOS of the base models).
pub const QWEN_ENDOFTEXT: u32 = 151_643;

/// The Qwen3-layout tokenizer (Qwen's 151,643-token byte-level BPE; no BOS, EOS
/// `<|endoftext|>`), decompressed from `tests/fixtures/qwen3-tokenizer.json.zst` once per
/// test process.
pub fn qwen3_tokenizer() -> Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/qwen3-tokenizer.json.zst"
            );
            let compressed = std::fs::read(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
            let json = zstd::decode_all(compressed.as_slice())
                .unwrap_or_else(|e| panic!("decompressing {path}: {e}"));
            Tokenizer::from_bytes(&json).unwrap_or_else(|e| panic!("loading {path}: {e}"))
        })
        .clone()
}

/// A random two-layer Qwen3-shaped model on a character vocabulary (`<eos>`, letters, digits,
/// ` :+=?\n`) with rank-4 LoRA (adapter seed 7) on the local backend, model seed 1; `options`
/// adds to those (a checkpoint directory, threads).
pub fn tiny_lora_backend(
    options: impl FnOnce(rlvr::backend::local::LocalOptions) -> rlvr::backend::local::LocalOptions,
) -> rlvr::backend::local::LocalBackend {
    use rlvr::backend::local::{LocalBackend, LocalOptions, Qwen3Config, char_tokenizer};
    let mut vocab: Vec<String> = vec!["<eos>".into()];
    vocab.extend(
        "abcdefghijklmnopqrstuvwxyzAU0123456789 :+=?\n"
            .chars()
            .map(|c| c.to_string()),
    );
    let tok = char_tokenizer(&vocab, Some(0)).expect("char tokenizer");
    let cfg = Qwen3Config::new(vocab.len(), 16, 24, 1, 2, 1, 8, 128);
    let lora = rlvr::types::LoraConfig {
        rank: 4,
        seed: Some(7),
        ..rlvr::types::LoraConfig::default()
    };
    LocalBackend::random(
        cfg,
        tok,
        options(LocalOptions::default().seed(1).lora(lora)),
    )
    .expect("tiny LoRA backend")
}

/// A tiny character-level BPE tokenizer built in memory: one token per printable ASCII
/// character and `\n`, plus the merges `": "` and `"\n\nU"` — merges that cross the piece
/// boundaries of the role-colon format, so encoding pieces separately gives different ids
/// than encoding the joined text. Has no pre-tokenizer and a fusing decoder, `<s>` (id 0) and
/// `</s>` (id 1) as special tokens; the returned handle has BOS `<s>` and EOS `</s>`.
pub fn tiny_tokenizer() -> Tokenizer {
    use tokenizers::models::bpe::{BPE, Vocab};
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut add = |t: &str| {
        let id = ids.len() as u32;
        ids.entry(t.to_string()).or_insert(id);
    };
    add("<s>");
    add("</s>");
    add("<unk>");
    add("\n");
    for c in ' '..='~' {
        add(&c.to_string());
    }
    add(": ");
    add("\n\n");
    add("\n\nU");
    let merges = vec![
        (":".to_string(), " ".to_string()),
        ("\n".to_string(), "\n".to_string()),
        ("\n\n".to_string(), "U".to_string()),
    ];
    let vocab: Vocab = ids.into_iter().collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .unk_token("<unk>".to_string())
        .build()
        .expect("tiny BPE builds");
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_decoder(Some(tokenizers::decoders::fuse::Fuse::new()));
    inner
        .add_special_tokens([
            tokenizers::AddedToken::from("<s>", true),
            tokenizers::AddedToken::from("</s>", true),
        ])
        .expect("special tokens are added");
    Tokenizer::new(inner, Some(0), Some(1))
}

/// A Tinker `ForwardBackwardOutput` as a fake server answers it: one `ArrayRecord` whose
/// `logprobs` field holds every datum's float32 values (`data`, with `offsets` the byte
/// boundaries between datums), and `metrics`.
#[cfg(feature = "tinker")]
pub fn logprobs_output(
    data: Vec<u8>,
    offsets: &[i64],
    num_datums: usize,
    metrics: &[(&str, f64)],
) -> rlvr::backend::tinker::proto::ForwardBackwardOutput {
    use rlvr::backend::tinker::proto;
    proto::ForwardBackwardOutput {
        loss_fn_output_type: "tinker:ArrayRecord".into(),
        loss_fn_outputs: vec![proto::ArrayRecord {
            type_tag: "ArrayRecord".into(),
            fields: [(
                "logprobs".to_string(),
                proto::BatchedTensor {
                    data: data.into(),
                    offsets: proto::i64_le(offsets).into(),
                    dtype: proto::DType::Float32 as i32,
                    trailing_shape: vec![],
                },
            )]
            .into_iter()
            .collect(),
            num_datums: num_datums as i64,
        }],
        metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

#[cfg(feature = "tinker")]
/// The fake servers' answer to a `forward_backward` of `data`: logprob −0.5 at every input
/// position, `loss:sum` = −Σ advantages, `datums:mean` = the number of datums.
pub fn fake_forward_backward_output(
    data: &[rlvr::backend::tinker::proto::Datum],
) -> rlvr::backend::tinker::proto::ForwardBackwardOutput {
    use rlvr::backend::tinker::proto;
    let n = data.len();
    let mut values = Vec::new();
    let mut offsets = vec![0i64];
    let mut loss = 0.0;
    for d in data {
        let len: usize = d
            .model_input
            .iter()
            .map(|c| match &c.chunk {
                Some(proto::chunk::Chunk::EncodedText(t)) => t.tokens.len() / 4,
                _ => 0,
            })
            .sum();
        if let Some(proto::Tensor {
            encoding: Some(proto::tensor::Encoding::Dense(b)),
            ..
        }) = d.loss_fn_inputs.get("advantages")
        {
            loss -= proto::parse_f32_le(b)
                .unwrap()
                .iter()
                .map(|&a| a as f64)
                .sum::<f64>();
        }
        values.extend(proto::f32_le(&vec![-0.5; len]));
        offsets.push(values.len() as i64);
    }
    logprobs_output(
        values,
        &offsets,
        n,
        &[("loss:sum", loss), ("datums:mean", n as f64)],
    )
}

/// A renderer for fake-server tests: renders a question as its bytes; parses `[id, eos]` as
/// the text `"id"`.
#[cfg(feature = "tinker")]
pub struct IdRenderer {
    /// The end-of-sequence token, the stop token.
    pub eos: u32,
}

#[cfg(feature = "tinker")]
impl rlvr::Renderer for IdRenderer {
    fn generation_prompt(
        &self,
        messages: &[rlvr::message::Message],
    ) -> rlvr::Result<rlvr::types::ModelInput> {
        Ok(rlvr::types::ModelInput::from_tokens(
            messages
                .iter()
                .flat_map(|m| m.text().bytes().map(u32::from).collect::<Vec<_>>())
                .collect(),
        ))
    }
    fn supervised_example(
        &self,
        _: &[rlvr::message::Message],
        _: rlvr::renderer::TrainOnWhat,
    ) -> rlvr::Result<(rlvr::types::ModelInput, Vec<f32>)> {
        Err(rlvr::Error::Unsupported("supervised".into()))
    }
    fn stop(&self) -> rlvr::types::StopCondition {
        rlvr::types::StopCondition::Tokens(vec![self.eos])
    }
    fn parse_response(
        &self,
        tokens: &[u32],
    ) -> (rlvr::message::Message, rlvr::renderer::ParseTermination) {
        let text = tokens.first().map(|t| t.to_string()).unwrap_or_default();
        let term = if tokens.last() == Some(&self.eos) {
            rlvr::renderer::ParseTermination::StopSequence
        } else {
            rlvr::renderer::ParseTermination::Malformed
        };
        (rlvr::message::Message::assistant(text), term)
    }
}

/// Serves `app` on a free loopback port, in a task of the current runtime, and returns its
/// address.
pub async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}
