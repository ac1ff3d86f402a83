//! Property tests for the crate-private Tinker response decoders: whatever bytes the server
//! sends, decoding gives a value or an `Error::Decode`, never a panic.

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;

use super::http::decode_json;
use super::proto;
use super::sampling::decode_sample_response;
use super::training::decode_forward_backward;

/// The case count: `default`, or `PROPTEST_CASES` for a longer search.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn le_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40),
        prop::collection::vec(any::<i32>(), 0..8).prop_map(proto::i32_le),
        prop::collection::vec(-2i64..40, 0..8).prop_map(|v| proto::i64_le(&v)),
        prop::collection::vec(any::<i64>(), 0..4).prop_map(|v| proto::i64_le(&v)),
    ]
}

fn sample_response() -> impl Strategy<Value = proto::SampleResponse> {
    let seq = (-1i32..3, le_bytes(), prop::option::of(le_bytes())).prop_map(
        |(stop_reason, tokens, logprobs)| proto::SampledSequence {
            stop_reason,
            tokens: tokens.into(),
            logprobs: logprobs.map(Bytes::from),
            topk_sampled_logprobs: None,
        },
    );
    prop::collection::vec(seq, 0..4).prop_map(|sequences| proto::SampleResponse {
        sequences,
        ..Default::default()
    })
}

fn forward_backward_output() -> impl Strategy<Value = proto::ForwardBackwardOutput> {
    let tensor = (
        le_bytes(),
        le_bytes(),
        -1i32..6,
        prop::collection::vec(prop_oneof![-2i64..5, any::<i64>()], 0..3),
    )
        .prop_map(
            |(data, offsets, dtype, trailing_shape)| proto::BatchedTensor {
                data: data.into(),
                offsets: offsets.into(),
                dtype,
                trailing_shape,
            },
        );
    let record = (
        prop::collection::btree_map("[a-z]{1,3}", tensor, 0..3),
        prop_oneof![-2i64..6, any::<i64>()],
    )
        .prop_map(|(fields, num_datums)| proto::ArrayRecord {
            type_tag: "ArrayRecord".into(),
            fields,
            num_datums,
        });
    (
        "[a-z:]{0,12}",
        prop::collection::vec(record, 0..3),
        prop::collection::btree_map("[a-z:]{1,8}", any::<f64>(), 0..3),
    )
        .prop_map(|(loss_fn_output_type, loss_fn_outputs, metrics)| {
            proto::ForwardBackwardOutput {
                loss_fn_output_type,
                loss_fn_outputs,
                metrics,
            }
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..128)) {
        let bytes = Bytes::from(body.clone());
        let _ = decode_sample_response(&bytes, "sample", None);
        let _ = decode_sample_response(&bytes, "sample", Some(&["a".to_string()]));
        let _ = decode_forward_backward(&bytes, "forward_backward");
        let _ = decode_json::<serde_json::Value>(&body, "json");
        let _ = decode_json::<BTreeMap<String, u64>>(&body, "json");
    }

    #[test]
    fn sample_decoder_never_panics_on_structured_messages(msg in sample_response()) {
        let body = Bytes::from(msg.encode_to_vec());
        if let Ok((seqs, _)) = decode_sample_response(&body, "sample", None) {
            prop_assert_eq!(seqs.len(), msg.sequences.len());
            for s in seqs {
                prop_assert_eq!(s.tokens.len(), s.logprobs.len());
            }
        }
    }

    #[test]
    fn forward_backward_decoder_never_panics_on_structured_messages(msg in forward_backward_output()) {
        let body = Bytes::from(msg.encode_to_vec());
        let _ = decode_forward_backward(&body, "forward_backward");
    }
}
