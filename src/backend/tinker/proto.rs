//! Protobuf messages of the Tinker wire protocol (`tinker_public.proto` of SDK 0.38),
//! written by hand with `prost` derives so no code generation is needed.
//!
//! Field numbers, types, labels and oneofs follow the descriptor embedded in the SDK. Maps
//! use `BTreeMap` so our encoding is deterministic (protobuf does not define map order).
#![allow(missing_docs)]

use std::collections::BTreeMap;

/// `tinker_public.StopReason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum StopReason {
    Stop = 0,
    Length = 1,
}

/// `tinker_public.DType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum DType {
    Unspecified = 0,
    Float32 = 1,
    Int64 = 2,
    Int32 = 3,
    Bfloat16 = 4,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SampleResponse {
    #[prost(message, repeated, tag = "1")]
    pub sequences: Vec<SampledSequence>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub prompt_logprobs: Option<Vec<u8>>,
    #[prost(message, optional, tag = "3")]
    pub topk_prompt_logprobs: Option<TopkLogprobs>,
    #[prost(int32, tag = "4")]
    pub prompt_cache_hit_tokens: i32,
    #[prost(message, optional, tag = "5")]
    pub target_prompt_logprobs: Option<Tensor>,
    #[prost(message, optional, tag = "6")]
    pub prompt_alt_tokens: Option<PromptAltTokens>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PromptAltTokens {
    #[prost(message, optional, tag = "1")]
    pub tokens: Option<Tensor>,
    #[prost(message, optional, tag = "2")]
    pub logprobs: Option<Tensor>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SampledSequence {
    #[prost(enumeration = "StopReason", tag = "1")]
    pub stop_reason: i32,
    // `Bytes`: decoded from a response body held as `Bytes`, these are slices of it (no
    // copy); they are the bulk of a sample response.
    #[prost(bytes = "bytes", tag = "2")]
    pub tokens: bytes::Bytes,
    #[prost(bytes = "bytes", optional, tag = "3")]
    pub logprobs: Option<bytes::Bytes>,
    #[prost(message, optional, tag = "4")]
    pub topk_sampled_logprobs: Option<TopkLogprobs>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TopkLogprobs {
    #[prost(bytes = "vec", tag = "1")]
    pub token_ids: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub logprobs: Vec<u8>,
    #[prost(uint32, tag = "3")]
    pub k: u32,
    #[prost(uint32, tag = "4")]
    pub length: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SparseCsr {
    #[prost(bytes = "vec", tag = "1")]
    pub values: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub crow_indices: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    pub col_indices: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Tensor {
    #[prost(oneof = "tensor::Encoding", tags = "1, 2")]
    pub encoding: Option<tensor::Encoding>,
    #[prost(enumeration = "DType", tag = "3")]
    pub dtype: i32,
    #[prost(int64, repeated, tag = "4")]
    pub shape: Vec<i64>,
}

/// Nested types of [`Tensor`].
pub mod tensor {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Encoding {
        #[prost(bytes, tag = "1")]
        Dense(Vec<u8>),
        #[prost(message, tag = "2")]
        SparseCsr(super::SparseCsr),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchedTensor {
    /// Decoded as a slice of the response body (not a copy).
    #[prost(bytes = "bytes", tag = "1")]
    pub data: bytes::Bytes,
    /// Decoded as a slice of the response body (not a copy).
    #[prost(bytes = "bytes", tag = "2")]
    pub offsets: bytes::Bytes,
    #[prost(enumeration = "DType", tag = "3")]
    pub dtype: i32,
    #[prost(int64, repeated, tag = "4")]
    pub trailing_shape: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ArrayRecord {
    #[prost(string, tag = "1")]
    pub type_tag: String,
    #[prost(btree_map = "string, message", tag = "2")]
    pub fields: BTreeMap<String, BatchedTensor>,
    #[prost(int64, tag = "3")]
    pub num_datums: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardBackwardOutput {
    #[prost(string, tag = "1")]
    pub loss_fn_output_type: String,
    #[prost(message, repeated, tag = "2")]
    pub loss_fn_outputs: Vec<ArrayRecord>,
    #[prost(btree_map = "string, double", tag = "3")]
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardBackwardRequest {
    #[prost(string, tag = "1")]
    pub model_id: String,
    #[prost(int32, tag = "2")]
    pub seq_id: i32,
    #[prost(message, repeated, tag = "3")]
    pub data: Vec<Datum>,
    #[prost(string, tag = "4")]
    pub loss_fn: String,
    #[prost(btree_map = "string, double", tag = "5")]
    pub loss_fn_config: BTreeMap<String, f64>,
    #[prost(bool, tag = "6")]
    pub forward_only: bool,
    #[prost(btree_map = "string, message", tag = "7")]
    pub loss_fn_config_v2: BTreeMap<String, LossConfigValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LossConfigValue {
    #[prost(oneof = "loss_config_value::Value", tags = "1, 2")]
    pub value: Option<loss_config_value::Value>,
}

/// Nested types of [`LossConfigValue`].
pub mod loss_config_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(double, tag = "1")]
        Number(f64),
        #[prost(string, tag = "2")]
        Text(String),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Datum {
    #[prost(message, repeated, tag = "1")]
    pub model_input: Vec<Chunk>,
    #[prost(btree_map = "string, message", tag = "2")]
    pub loss_fn_inputs: BTreeMap<String, Tensor>,
    #[prost(message, repeated, tag = "3")]
    pub model_input_spans: Vec<ProvenanceSpan>,
    #[prost(message, repeated, tag = "4")]
    pub loss_fn_input_spans: Vec<ProvenanceSpan>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProvenanceSpan {
    #[prost(oneof = "provenance_span::Span", tags = "1, 2")]
    pub span: Option<provenance_span::Span>,
}

/// Nested types of [`ProvenanceSpan`].
pub mod provenance_span {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Span {
        #[prost(message, tag = "1")]
        PromptTokens(super::PromptProvenanceSpan),
        #[prost(message, tag = "2")]
        SampledTokens(super::SampledProvenanceSpan),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PromptProvenanceSpan {
    #[prost(string, tag = "1")]
    pub sequence_id: String,
    #[prost(int64, tag = "2")]
    pub offset: i64,
    #[prost(int64, tag = "3")]
    pub length: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SampledProvenanceSpan {
    #[prost(string, tag = "1")]
    pub sequence_id: String,
    #[prost(int64, tag = "2")]
    pub offset: i64,
    #[prost(int64, tag = "3")]
    pub length: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Chunk {
    #[prost(oneof = "chunk::Chunk", tags = "1, 2, 3")]
    pub chunk: Option<chunk::Chunk>,
}

/// Nested types of [`Chunk`].
pub mod chunk {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Chunk {
        #[prost(message, tag = "1")]
        EncodedText(super::EncodedTextChunk),
        #[prost(message, tag = "2")]
        Image(super::ImageChunk),
        #[prost(message, tag = "3")]
        Dmel(super::DmelChunk),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EncodedTextChunk {
    #[prost(bytes = "vec", tag = "1")]
    pub tokens: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageChunk {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(int32, optional, tag = "3")]
    pub expected_tokens: Option<i32>,
    #[prost(message, optional, tag = "4")]
    pub override_dimensions: Option<ImageDimensions>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageDimensions {
    #[prost(uint32, tag = "1")]
    pub width: u32,
    #[prost(uint32, tag = "2")]
    pub height: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DmelChunk {
    #[prost(bytes = "vec", tag = "1")]
    pub dmel: Vec<u8>,
}

// ---------------------------------------------------------------------------------------------
// Little-endian byte helpers
// ---------------------------------------------------------------------------------------------

/// Little-endian bytes of `i32` values.
pub fn i32_le(values: impl IntoIterator<Item = i32>) -> Vec<u8> {
    let values = values.into_iter();
    let mut out = Vec::with_capacity(values.size_hint().0 * 4);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Little-endian bytes of `i64` values.
pub fn i64_le(values: &[i64]) -> Vec<u8> {
    le_bytes(values, |v| v.to_le_bytes())
}

/// Little-endian bytes of `f32` values.
pub fn f32_le(values: &[f32]) -> Vec<u8> {
    le_bytes(values, |v| v.to_le_bytes())
}

/// `values` as consecutive `N`-byte words: one allocation of the exact size and a loop the
/// compiler vectorizes (collecting a `flat_map` grows the vector byte by byte).
pub(crate) fn le_bytes<const N: usize, T: Copy>(
    values: &[T],
    to_le: impl Fn(T) -> [u8; N],
) -> Vec<u8> {
    values
        .iter()
        .map(|&v| to_le(v))
        .collect::<Vec<[u8; N]>>()
        .into_flattened()
}

/// Parses little-endian values of `N` bytes each; `None` when the length is not a multiple
/// of `N`.
fn parse_le<const N: usize, T>(bytes: &[u8], from_le: impl Fn([u8; N]) -> T) -> Option<Vec<T>> {
    if !bytes.len().is_multiple_of(N) {
        return None;
    }
    // `as_chunks` + `map` + `collect`: an exact-size loop the compiler inlines and
    // vectorizes (a function pointer and a `push` per value cost ~10 instructions each).
    let (words, _) = bytes.as_chunks::<N>();
    Some(words.iter().map(|w| from_le(*w)).collect())
}

/// Parses little-endian `i32`s; `None` when the length is not a multiple of 4.
pub fn parse_i32_le(bytes: &[u8]) -> Option<Vec<i32>> {
    parse_le(bytes, i32::from_le_bytes)
}

/// Parses little-endian `u32`s; `None` when the length is not a multiple of 4.
pub fn parse_u32_le(bytes: &[u8]) -> Option<Vec<u32>> {
    parse_le(bytes, u32::from_le_bytes)
}

/// Parses little-endian `f32`s; `None` when the length is not a multiple of 4.
pub fn parse_f32_le(bytes: &[u8]) -> Option<Vec<f32>> {
    parse_le(bytes, f32::from_le_bytes)
}

/// Parses little-endian `i64`s; `None` when the length is not a multiple of 8.
pub fn parse_i64_le(bytes: &[u8]) -> Option<Vec<i64>> {
    parse_le(bytes, i64::from_le_bytes)
}

/// Parses little-endian bfloat16 values, widened to `f32`.
pub fn parse_bf16_le(bytes: &[u8]) -> Option<Vec<f32>> {
    parse_le(bytes, |b: [u8; 2]| {
        f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn little_endian_round_trips_and_rejects_ragged_lengths() {
        assert_eq!(
            parse_i32_le(&i32_le([1, -2, 70_000])),
            Some(vec![1, -2, 70_000])
        );
        assert_eq!(parse_f32_le(&f32_le(&[0.5, -1.25])), Some(vec![0.5, -1.25]));
        let i64s: Vec<u8> = [3i64, -4].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(parse_i64_le(&i64s), Some(vec![3, -4]));
        assert_eq!(parse_i32_le(&[0, 0, 0]), None);
        assert_eq!(parse_i64_le(&[0; 12]), None);
        assert_eq!(parse_bf16_le(&[0]), None);
    }

    #[test]
    fn bfloat16_is_widened_from_the_upper_half() {
        // bf16 0x3FC0 = 1.5, 0xC000 = -2.0 (little-endian bytes).
        assert_eq!(
            parse_bf16_le(&[0xC0, 0x3F, 0x00, 0xC0]),
            Some(vec![1.5, -2.0])
        );
    }
}
