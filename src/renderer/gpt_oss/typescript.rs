//! Harmony tool declarations: JSON-schema tools as TypeScript-like `type name = (_: {…}) =>
//! any;` lines (the cookbook's `_format_tool_definition` and helpers, byte for byte).
//!
//! The schema is read with Python's semantics: a value is "set" when it is truthy (a
//! non-empty string, list or object, a non-zero number, `true`); `title`, `description`
//! print as Python's `str()`; enum values, examples and defaults as `json.dumps`. Where the
//! cookbook raises (a schema that is not an object, `properties` that are not an object, …)
//! this returns [`Error::Renderer`].

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::python::{py_iter, py_str, py_truthy};
use crate::renderer::base::{ToolSpec, python_json_dumps};

fn schema_error(what: &str) -> Error {
    Error::Renderer(format!("gpt_oss tool declaration: {what}"))
}

/// Python truthiness of an optional JSON value (`dict.get` result; `None` is falsy).
fn truthy(v: Option<&Value>) -> bool {
    v.is_some_and(py_truthy)
}

fn as_object<'a>(schema: &'a Value, what: &str) -> Result<&'a Map<String, Value>> {
    schema
        .as_object()
        .ok_or_else(|| schema_error(&format!("{what} is not a JSON object: {schema}")))
}

/// Python's `name in set(required)` for the `required` entry of a schema (`None`: absent).
fn required_contains(required: Option<&Value>, name: &str) -> Result<bool> {
    match required {
        None => Ok(false),
        Some(Value::Array(items)) => {
            let mut found = false;
            for item in items {
                match item {
                    Value::Array(_) | Value::Object(_) => {
                        return Err(schema_error("`required` holds an unhashable value"));
                    }
                    Value::String(s) if s == name => found = true,
                    _ => {}
                }
            }
            Ok(found)
        }
        Some(Value::Object(o)) => Ok(o.contains_key(name)),
        Some(Value::String(s)) => {
            let mut chars = name.chars();
            Ok(match (chars.next(), chars.next()) {
                (Some(c), None) => s.contains(c),
                _ => false,
            })
        }
        Some(other) => Err(schema_error(&format!(
            "`required` is not iterable: {other}"
        ))),
    }
}

/// The cookbook's `_json_type_to_typescript`: one schema as a TypeScript type.
pub(crate) fn json_type_to_typescript(schema: &Value) -> Result<String> {
    let s = as_object(schema, "a schema")?;
    for key in ["oneOf", "anyOf"] {
        if let Some(alternatives) = s.get(key) {
            return Ok(py_iter(alternatives, key)?
                .iter()
                .map(json_type_to_typescript)
                .collect::<Result<Vec<_>>>()?
                .join(" | "));
        }
    }
    let any = Value::String("any".into());
    let json_type = s.get("type").unwrap_or(&any);
    if let Value::Array(types) = json_type {
        return Ok(types
            .iter()
            .map(|t| {
                let mut one = Map::new();
                one.insert("type".into(), t.clone());
                json_type_to_typescript(&Value::Object(one))
            })
            .collect::<Result<Vec<_>>>()?
            .join(" | "));
    }
    let base = match json_type.as_str() {
        Some("string") => {
            if let Some(values) = s.get("enum") {
                return Ok(py_iter(values, "enum")?
                    .iter()
                    .map(python_json_dumps)
                    .collect::<Vec<_>>()
                    .join(" | "));
            }
            "string".to_owned()
        }
        Some("number" | "integer") => "number".to_owned(),
        Some("boolean") => "boolean".to_owned(),
        Some("array") => {
            let empty = Value::Object(Map::new());
            let items = json_type_to_typescript(s.get("items").unwrap_or(&empty))?;
            format!("{items}[]")
        }
        Some("object") => json_schema_to_typescript(schema)?,
        _ => "any".to_owned(),
    };
    Ok(if truthy(s.get("nullable")) {
        format!("{base} | null")
    } else {
        base
    })
}

/// The cookbook's `_json_schema_to_typescript`: an object schema as an inline type.
fn json_schema_to_typescript(schema: &Value) -> Result<String> {
    let s = as_object(schema, "a schema")?;
    if s.get("type").and_then(Value::as_str) != Some("object") {
        return Ok("any".into());
    }
    let empty = Value::Object(Map::new());
    let properties = as_object(s.get("properties").unwrap_or(&empty), "`properties`")?;
    required_contains(s.get("required"), "")?;
    let mut parts = Vec::with_capacity(properties.len());
    for (name, prop) in properties {
        let ty = json_type_to_typescript(prop)?;
        let optional = if required_contains(s.get("required"), name)? {
            ""
        } else {
            "?"
        };
        parts.push(format!("{name}{optional}: {ty}"));
    }
    Ok(format!("{{ {} }}", parts.join(", ")))
}

/// The cookbook's `_schema_comments`: title, description and examples of a property.
fn schema_comments(schema: &Value) -> Result<Vec<String>> {
    let s = as_object(schema, "a property schema")?;
    let mut comments = Vec::new();
    if let Some(title) = s.get("title").filter(|t| truthy(Some(t))) {
        comments.push(py_str(title));
        comments.push(String::new());
    }
    if let Some(description) = s.get("description").filter(|d| truthy(Some(d))) {
        comments.push(py_str(description));
    }
    if let Some(examples) = s.get("examples").filter(|e| truthy(Some(e))) {
        comments.push("Examples:".into());
        for example in py_iter(examples, "`examples`")? {
            comments.push(format!("- {}", python_json_dumps(&example)));
        }
    }
    Ok(comments)
}

/// The cookbook's `_format_parameters_block`: `(_: {…})`, one property a line.
fn format_parameters_block(schema: &Value) -> Result<String> {
    let s = as_object(schema, "`parameters`")?;
    if s.get("type").and_then(Value::as_str) != Some("object") || !truthy(s.get("properties")) {
        return Ok("()".into());
    }
    let mut lines = Vec::new();
    let mut header = "(_:".to_owned();
    if let Some(description) = s.get("description").filter(|d| truthy(Some(d))) {
        header.push_str(&format!(" // {}", py_str(description)));
    }
    lines.push(header);
    lines.push("{".to_owned());
    let empty = Value::Object(Map::new());
    let properties = as_object(s.get("properties").unwrap_or(&empty), "`properties`")?;
    required_contains(s.get("required"), "")?;
    for (name, prop) in properties {
        for comment in schema_comments(prop)? {
            lines.push(format!("// {comment}"));
        }
        let ty = json_type_to_typescript(prop)?;
        let optional = if required_contains(s.get("required"), name)? {
            ""
        } else {
            "?"
        };
        let default = match prop.get("default") {
            Some(d) => format!(" // default: {}", python_json_dumps(d)),
            None => String::new(),
        };
        lines.push(format!("{name}{optional}: {ty},{default}"));
    }
    lines.push("})".to_owned());
    Ok(lines.join("\n"))
}

/// The cookbook's `_format_tool_definition`: `// description` then `type name = (…) => any;`.
pub(crate) fn format_tool_definition(tool: &ToolSpec) -> Result<String> {
    let mut lines = Vec::new();
    if !tool.description.is_empty() {
        lines.push(format!("// {}", tool.description));
    }
    let empty = Value::Object(Map::new());
    let params = if truthy(Some(&tool.parameters)) {
        &tool.parameters
    } else {
        &empty
    };
    lines.push(format!(
        "type {} = {} => any;",
        tool.name,
        format_parameters_block(params)?
    ));
    Ok(lines.join("\n"))
}
