//! Safetensors files as the exporters read and write them: headers without the data,
//! memory-mapped shards, owned tensors, and the f32 ⇄ bf16/f16 conversions of a merge.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView, View};

use crate::error::{Error, Result};

/// A tensor that owns its bytes (little-endian, row-major, as safetensors stores them).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OwnedTensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl OwnedTensor {
    pub fn from_view(view: &TensorView<'_>) -> Self {
        OwnedTensor {
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            data: view.data().to_vec(),
        }
    }
}

impl View for &OwnedTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// A tensor to write: borrowed from a mapped input file, or made here.
pub(crate) enum Out<'a> {
    Borrowed(TensorView<'a>),
    Owned(OwnedTensor),
}

impl Out<'_> {
    pub fn byte_len(&self) -> usize {
        match self {
            Out::Borrowed(v) => v.data().len(),
            Out::Owned(t) => t.data.len(),
        }
    }
}

impl View for &Out<'_> {
    fn dtype(&self) -> Dtype {
        match self {
            Out::Borrowed(v) => v.dtype(),
            Out::Owned(t) => t.dtype,
        }
    }
    fn shape(&self) -> &[usize] {
        match self {
            Out::Borrowed(v) => v.shape(),
            Out::Owned(t) => &t.shape,
        }
    }
    fn data(&self) -> Cow<'_, [u8]> {
        match self {
            Out::Borrowed(v) => Cow::Borrowed(v.data()),
            Out::Owned(t) => Cow::Borrowed(&t.data),
        }
    }
    fn data_len(&self) -> usize {
        self.byte_len()
    }
}

/// A memory-mapped safetensors file.
pub(crate) struct Mapped {
    pub path: PathBuf,
    map: memmap2::Mmap,
}

impl Mapped {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io("opening", path, e))?;
        // SAFETY: the file is only read; a model file changed by another process while it is
        // exported gives wrong bytes in the output, not undefined behaviour in safe code that
        // copies them (the same contract as candle's and safetensors' own mmap loaders).
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io("mapping", path, e))?;
        Ok(Mapped {
            path: path.to_path_buf(),
            map,
        })
    }

    pub fn tensors(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.map).map_err(|e| weights_error(&self.path, e.to_string()))
    }
}

/// Every tensor's shape in a safetensors file, read from its header only.
pub(crate) fn header_shapes(path: &Path) -> Result<BTreeMap<String, Vec<usize>>> {
    let mapped = Mapped::open(path)?;
    let (_, meta) =
        SafeTensors::read_metadata(&mapped.map).map_err(|e| weights_error(path, e.to_string()))?;
    Ok(meta
        .tensors()
        .into_iter()
        .map(|(name, info)| (name, info.shape.clone()))
        .collect())
}

/// Reads a whole (small) safetensors file into owned tensors, by name.
pub(crate) fn read_all(path: &Path) -> Result<BTreeMap<String, OwnedTensor>> {
    let mapped = Mapped::open(path)?;
    let st = mapped.tensors()?;
    Ok(st
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, OwnedTensor::from_view(&view)))
        .collect())
}

/// Writes `tensors` to `path` with the `{"format": "pt"}` metadata transformers expects.
pub(crate) fn write<'a, V: View + 'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (String, V)>,
) -> Result<()> {
    let metadata = Some(std::collections::HashMap::from([(
        "format".to_string(),
        "pt".to_string(),
    )]));
    safetensors::serialize_to_file(tensors, metadata, path)
        .map_err(|e| weights_error(path, format!("writing: {e}")))
}

/// The values of a float tensor as f32 (`torch.Tensor.float()`).
pub(crate) fn to_f32(
    path_for_errors: &Path,
    name: &str,
    dtype: Dtype,
    data: &[u8],
) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F64 => data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
        other => {
            return Err(weights_error(
                path_for_errors,
                format!(
                    "tensor `{name}` has dtype {other:?}; LoRA merges into f32, f16, bf16 or f64 only"
                ),
            ));
        }
    })
}

/// f32 values cast back to `dtype` (`Tensor.to(dtype)`: round to nearest, ties to even),
/// as little-endian bytes.
pub(crate) fn from_f32(dtype: Dtype, values: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::BF16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        Dtype::F64 => values
            .iter()
            .flat_map(|v| f64::from(*v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// The crate's error for a weights file or directory.
pub(crate) fn weights_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Weights {
        path: path.to_path_buf(),
        message: message.into(),
    }
}
