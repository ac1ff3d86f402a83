//! Rows of a JSONL or parquet file as JSON objects, one at a time: the shared reader of the
//! competition-math datasets.
//!
//! A JSONL line is one JSON object. A parquet row becomes the object of its projected columns,
//! each value converted to JSON the way `datasets` shows it in Python: strings, integers,
//! floats (NaN and infinities as `null`), booleans, lists and structs (as objects), dictionary
//! columns decoded. Every error is an [`Error::Data`] naming the file and the 1-based line or
//! row (row 0 for the whole file).

use std::io::BufRead;
use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Where a record is: a 1-based JSONL line or parquet row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loc {
    Line(usize),
    #[cfg_attr(not(feature = "parquet"), allow(dead_code))]
    Row(usize),
}

impl Loc {
    /// An [`Error::Data`] at this location of `path`.
    pub(crate) fn error(self, path: &Path, message: impl Into<String>) -> Error {
        match self {
            Loc::Line(n) => Error::data_line(path, n, message),
            Loc::Row(n) => Error::data_row(path, n, message),
        }
    }
}

/// One row of a file.
#[derive(Debug)]
pub(crate) struct Record<'p> {
    pub(crate) path: &'p Path,
    pub(crate) loc: Loc,
    /// 0-based index of the record in its file (blank JSONL lines are not records).
    pub(crate) index: usize,
    pub(crate) fields: Map<String, Value>,
}

impl Record<'_> {
    /// An [`Error::Data`] at this record.
    pub(crate) fn error(&self, message: impl Into<String>) -> Error {
        self.loc.error(self.path, message)
    }

    /// Field `name` as a string: `None` when missing or null, an error for any other type.
    pub(crate) fn opt_str(&self, name: &str) -> Result<Option<&str>> {
        str_of(self.fields.get(name), name).map_err(|m| self.error(m))
    }

    /// Field `name` as a string; missing or null is an error.
    pub(crate) fn req_str(&self, name: &str) -> Result<&str> {
        match self.fields.get(name) {
            None => Err(self.error(format!("missing field `{name}`"))),
            Some(Value::Null) => Err(self.error(format!("`{name}` is null"))),
            Some(v) => str_of(Some(v), name)
                .map_err(|m| self.error(m))?
                .ok_or_else(|| self.error(format!("`{name}` is null"))),
        }
    }
}

/// `value` as a string (`None` for missing or null); the error message names `name`.
pub(crate) fn str_of<'v>(
    value: Option<&'v Value>,
    name: &str,
) -> std::result::Result<Option<&'v str>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!(
            "field `{name}` is {}, not a string",
            json_kind(other)
        )),
    }
}

/// `"a string"`, `"a number"`... for messages.
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The columns a dataset reads: `required` must exist in a parquet file (a JSONL line that
/// lacks one simply has no value for it), `optional` are read when present. Records hold
/// these columns only (parquet files are read with only them).
pub(crate) struct Columns<'a> {
    pub(crate) required: &'a [&'a str],
    pub(crate) optional: &'a [&'a str],
}

/// Calls `each` with every record of `path`: parquet when the file name ends in `.parquet`,
/// JSONL otherwise.
///
/// Errors: [`Error::Io`] if the file cannot be read; [`Error::Data`] for malformed input;
/// [`Error::Config`] for a parquet file without the `parquet` feature; whatever `each`
/// returns.
pub(crate) fn for_each_record(
    path: &Path,
    columns: &Columns<'_>,
    each: &mut dyn FnMut(Record<'_>) -> Result<()>,
) -> Result<()> {
    if is_parquet(path) {
        #[cfg(feature = "parquet")]
        return parquet_records(path, columns, each);
        #[cfg(not(feature = "parquet"))]
        return Err(Error::config(
            "parquet",
            format!(
                "reading {} needs the `parquet` feature (or a JSONL copy)",
                path.display()
            ),
        ));
    }
    jsonl_records(path, columns, each)
}

/// Whether `path` names a parquet file.
pub(crate) fn is_parquet(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

fn jsonl_records(
    path: &Path,
    columns: &Columns<'_>,
    each: &mut dyn FnMut(Record<'_>) -> Result<()>,
) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io("opening", path, e))?;
    let reader = std::io::BufReader::new(file);
    let mut index = 0;
    for (i, line) in reader.lines().enumerate() {
        let line_no = i + 1;
        let line = line.map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                Error::data_line(path, line_no, "not valid UTF-8")
            } else {
                Error::io("reading", path, e)
            }
        })?;
        // A byte-order mark (from some Windows editors) is not part of the JSON.
        let text = match (line_no, line.strip_prefix('\u{feff}')) {
            (1, Some(rest)) => rest,
            _ => line.as_str(),
        };
        if text.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::data_line(path, line_no, format!("invalid JSON: {e}")))?;
        let Value::Object(mut fields) = value else {
            return Err(Error::data_line(
                path,
                line_no,
                format!("expected a JSON object, found {}", json_kind(&value)),
            ));
        };
        fields.retain(|k, _| {
            columns.required.contains(&k.as_str()) || columns.optional.contains(&k.as_str())
        });
        each(Record {
            path,
            loc: Loc::Line(line_no),
            index,
            fields,
        })?;
        index += 1;
    }
    Ok(())
}

#[cfg(feature = "parquet")]
fn parquet_records(
    path: &Path,
    columns: &Columns<'_>,
    each: &mut dyn FnMut(Record<'_>) -> Result<()>,
) -> Result<()> {
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let whole_file = |message: String| Error::data_row(path, 0, message);
    let file = std::fs::File::open(path).map_err(|e| Error::io("opening", path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| whole_file(format!("not a readable parquet file: {e}")))?;
    let schema = builder.schema().clone();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let mut wanted = Vec::new();
    for &name in columns.required {
        let index = schema.index_of(name).map_err(|_| {
            whole_file(format!(
                "missing column `{name}` (columns: {})",
                names.join(", ")
            ))
        })?;
        wanted.push(index);
    }
    for &name in columns.optional {
        if let Ok(index) = schema.index_of(name) {
            wanted.push(index);
        }
    }
    let mask = ProjectionMask::roots(builder.parquet_schema(), wanted);
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(|e| whole_file(format!("cannot read: {e}")))?;
    let mut index = 0;
    for batch in reader {
        let first_row = index + 1;
        let batch =
            batch.map_err(|e| Error::data_row(path, first_row, format!("cannot decode: {e}")))?;
        let batch_schema = batch.schema();
        let mut converted = Vec::with_capacity(batch.num_columns());
        for (field, array) in batch_schema.fields().iter().zip(batch.columns()) {
            let values = arrow_json::to_json(array.as_ref(), 0).map_err(|e| {
                Error::data_row(path, first_row, format!("column `{}`: {e}", field.name()))
            })?;
            converted.push((field.name().clone(), values.into_iter()));
        }
        for _ in 0..batch.num_rows() {
            let mut fields = Map::new();
            for (name, values) in converted.iter_mut() {
                fields.insert(name.clone(), values.next().unwrap_or(Value::Null));
            }
            each(Record {
                path,
                loc: Loc::Row(index + 1),
                index,
                fields,
            })?;
            index += 1;
        }
    }
    Ok(())
}

/// Arrow arrays as JSON values.
#[cfg(feature = "parquet")]
mod arrow_json {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
        UInt8Type, UInt16Type, UInt32Type, UInt64Type,
    };
    use arrow_array::{Array, ArrowPrimitiveType, OffsetSizeTrait};
    use arrow_schema::DataType;
    use serde_json::{Map, Number, Value};

    /// Nested lists and structs deeper than this are refused (no schema we read comes close).
    const MAX_DEPTH: usize = 32;

    /// The values of `array`, one per row (`null` for null slots).
    pub(super) fn to_json(array: &dyn Array, depth: usize) -> Result<Vec<Value>, String> {
        if depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        let n = array.len();
        let nullable = |i: usize, v: Value| if array.is_null(i) { Value::Null } else { v };
        Ok(match array.data_type() {
            DataType::Null => vec![Value::Null; n],
            DataType::Boolean => array
                .as_boolean()
                .iter()
                .map(|v| v.map_or(Value::Null, Value::Bool))
                .collect(),
            DataType::Int8 => ints::<Int8Type>(array),
            DataType::Int16 => ints::<Int16Type>(array),
            DataType::Int32 => ints::<Int32Type>(array),
            DataType::Int64 => ints::<Int64Type>(array),
            DataType::UInt8 => ints::<UInt8Type>(array),
            DataType::UInt16 => ints::<UInt16Type>(array),
            DataType::UInt32 => ints::<UInt32Type>(array),
            DataType::UInt64 => ints::<UInt64Type>(array),
            DataType::Float16 => floats::<Float16Type>(array, |v| f64::from(v.to_f32())),
            DataType::Float32 => floats::<Float32Type>(array, f64::from),
            DataType::Float64 => floats::<Float64Type>(array, |v| v),
            DataType::Utf8 => strings(array.as_string::<i32>().iter()),
            DataType::LargeUtf8 => strings(array.as_string::<i64>().iter()),
            DataType::Utf8View => strings(array.as_string_view().iter()),
            DataType::List(_) => lists::<i32>(array, depth)?,
            DataType::LargeList(_) => lists::<i64>(array, depth)?,
            DataType::Struct(fields) => {
                let structs = array.as_struct();
                let mut children = Vec::with_capacity(fields.len());
                for (field, column) in fields.iter().zip(structs.columns()) {
                    let values = to_json(column.as_ref(), depth + 1)
                        .map_err(|e| format!("field `{}`: {e}", field.name()))?;
                    children.push((field.name().clone(), values));
                }
                (0..n)
                    .map(|i| {
                        let object: Map<String, Value> = children
                            .iter()
                            .map(|(name, values)| {
                                (name.clone(), values.get(i).cloned().unwrap_or(Value::Null))
                            })
                            .collect();
                        nullable(i, Value::Object(object))
                    })
                    .collect()
            }
            DataType::Dictionary(_, _) => {
                let dict = array
                    .as_any_dictionary_opt()
                    .ok_or("a dictionary column that is not a dictionary array")?;
                let values = to_json(dict.values().as_ref(), depth + 1)?;
                let keys = dict.normalized_keys();
                (0..n)
                    .map(|i| {
                        if array.is_null(i) {
                            return Ok(Value::Null);
                        }
                        let key = keys.get(i).copied().unwrap_or(usize::MAX);
                        values
                            .get(key)
                            .cloned()
                            .ok_or_else(|| format!("dictionary key {key} out of range"))
                    })
                    .collect::<Result<_, String>>()?
            }
            other => return Err(format!("unsupported type {other}")),
        })
    }

    fn ints<T>(array: &dyn Array) -> Vec<Value>
    where
        T: ArrowPrimitiveType,
        T::Native: Into<Number>,
    {
        array
            .as_primitive::<T>()
            .iter()
            .map(|v| v.map_or(Value::Null, |v| Value::Number(v.into())))
            .collect()
    }

    fn floats<T: ArrowPrimitiveType>(
        array: &dyn Array,
        to_f64: fn(T::Native) -> f64,
    ) -> Vec<Value> {
        array
            .as_primitive::<T>()
            .iter()
            .map(|v| {
                v.and_then(|v| Number::from_f64(to_f64(v)))
                    .map_or(Value::Null, Value::Number)
            })
            .collect()
    }

    fn strings<'a>(values: impl Iterator<Item = Option<&'a str>>) -> Vec<Value> {
        values
            .map(|v| v.map_or(Value::Null, |s| Value::String(s.to_owned())))
            .collect()
    }

    fn lists<O: OffsetSizeTrait>(array: &dyn Array, depth: usize) -> Result<Vec<Value>, String> {
        let list = array.as_list::<O>();
        let values = to_json(list.values().as_ref(), depth + 1)?;
        let offsets = list.value_offsets();
        (0..array.len())
            .map(|i| {
                if array.is_null(i) {
                    return Ok(Value::Null);
                }
                let start = offsets.get(i).and_then(|o| o.to_usize());
                let end = offsets.get(i + 1).and_then(|o| o.to_usize());
                match (start, end) {
                    (Some(s), Some(e)) if s <= e && e <= values.len() => {
                        Ok(Value::Array(values[s..e].to_vec()))
                    }
                    _ => Err(format!("list offsets out of range at row {}", i + 1)),
                }
            })
            .collect()
    }
}
