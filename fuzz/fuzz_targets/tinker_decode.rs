//! The Tinker response decoders (protobuf `SampleResponse` / `ForwardBackwardOutput`, JSON,
//! little-endian arrays) on arbitrary bodies: an error or a value, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlvr::backend::tinker::{fuzz_hooks, proto};

fuzz_target!(|data: &[u8]| {
    let _ = fuzz_hooks::decode_sample_response(data);
    let _ = fuzz_hooks::decode_forward_backward(data);
    let _ = fuzz_hooks::decode_json(data);
    let _ = proto::parse_i32_le(data);
    let _ = proto::parse_f32_le(data);
    let _ = proto::parse_i64_le(data);
    let _ = proto::parse_bf16_le(data);
});
