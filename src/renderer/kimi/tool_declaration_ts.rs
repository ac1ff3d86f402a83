//! Kimi K2.5's TypeScript-style tool declarations (the cookbook's
//! `kimi_k2_5_tool_declaration_ts.py`, itself copied from the K2.5 tokenizer repository).
//!
//! Each OpenAI function becomes `type NAME = (_: {…}) => any;` inside `namespace functions`,
//! with descriptions and constraints as `//` comments, required parameters first (each group
//! sorted by name), `$defs` as `interface`s and a self-referencing schema (`$ref: "#"`) as
//! `interface parameters`. The text is what the model sees, so every detail is kept —
//! including where the reference raises (unsupported `$ref`s, enum values of the wrong type,
//! unknown `additionalProperties`), which is an [`Error::Renderer`] here.

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::python::{py_iter, py_number_repr, py_repr, py_str, py_truthy};
use crate::renderer::base::python_json;

const TS_INDENT: &str = "  ";
const TS_FIELD_DELIMITER: &str = ",\n";

fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Renderer(msg.into()))
}

/// `$defs` seen so far (in registration order) and whether a `$ref: "#"` occurred.
#[derive(Default)]
struct SchemaRegistry {
    definitions: Vec<(String, Value)>,
    has_self_ref: bool,
}

enum Resolved {
    SelfRef,
    Definition,
}

impl SchemaRegistry {
    fn register_definitions(&mut self, defs: &Value) -> Result<()> {
        if !py_truthy(defs) {
            return Ok(());
        }
        let Value::Object(defs) = defs else {
            return err(format!("$defs must be an object, got {}", py_repr(defs)));
        };
        for (name, schema) in defs {
            match self.definitions.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = schema.clone(),
                None => self.definitions.push((name.clone(), schema.clone())),
            }
        }
        Ok(())
    }

    fn resolve_ref(&mut self, reference: &Value) -> Result<Resolved> {
        let Value::String(r) = reference else {
            return err(format!(
                "Unsupported reference format: {}",
                py_str(reference)
            ));
        };
        if r == "#" {
            self.has_self_ref = true;
            Ok(Resolved::SelfRef)
        } else if r.starts_with("#/$defs/") {
            let name = r.rsplit('/').next().unwrap_or("");
            if self.definitions.iter().any(|(n, _)| n == name) {
                Ok(Resolved::Definition)
            } else {
                err(format!("Reference not found: {r}"))
            }
        } else {
            err(format!("Unsupported reference format: {r}"))
        }
    }
}

/// `// line` per line of `description` (empty lines stay empty).
fn format_description(description: &str, indent: &str) -> String {
    description
        .split('\n')
        .map(|line| {
            if line.is_empty() {
                String::new()
            } else {
                format!("{indent}// {line}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A description value: Python formats it when truthy, which fails for a non-string.
fn description_text(description: &Value) -> Result<Option<&str>> {
    if !py_truthy(description) {
        return Ok(None);
    }
    match description {
        Value::String(s) => Ok(Some(s)),
        other => err(format!(
            "description must be a string, got {}",
            py_repr(other)
        )),
    }
}

/// What every type keeps besides its kind: the description and the allowed constraints.
struct BaseType {
    description: Value,
    constraints: Vec<(String, Value)>,
}

impl BaseType {
    fn new(extra: &Map<String, Value>, allowed: &[&str]) -> Self {
        BaseType {
            description: extra
                .get("description")
                .cloned()
                .unwrap_or_else(|| Value::String(String::new())),
            constraints: extra
                .iter()
                .filter(|(k, _)| allowed.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    fn empty() -> Self {
        BaseType {
            description: Value::String(String::new()),
            constraints: Vec::new(),
        }
    }

    fn format_docstring(&self, indent: &str) -> Result<String> {
        let mut lines = Vec::new();
        if let Some(d) = description_text(&self.description)? {
            lines.push(format_description(d, indent));
        }
        if !self.constraints.is_empty() {
            let mut sorted: Vec<&(String, Value)> = self.constraints.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            let joined = sorted
                .iter()
                .map(|(k, v)| format!("{k}: {}", py_str(v)))
                .collect::<Vec<_>>()
                .join(", ");
            lines.push(format!("{indent}// {joined}"));
        }
        Ok(lines.into_iter().map(|l| l + "\n").collect())
    }
}

/// `additionalProperties` of an object: validated only when the object is written out.
enum Additional {
    Absent,
    Bool(bool),
    Type(Box<ParamType>),
    Invalid(Value),
}

enum Kind {
    Scalar(String),
    Object {
        properties: Vec<Parameter>,
        additional: Additional,
    },
    Array(Box<ParamType>),
    Enum(Vec<Value>),
    AnyOf(Vec<ParamType>),
    Union(Vec<&'static str>),
    Ref(String),
}

struct ParamType {
    base: BaseType,
    kind: Kind,
}

/// A function parameter or an object field.
struct Parameter {
    ty: ParamType,
    name: String,
    optional: bool,
    default: Option<Value>,
}

fn scalar(ty: &str, extra: Option<&Map<String, Value>>) -> ParamType {
    let allowed: &[&str] = match ty {
        "string" => &["maxLength", "minLength", "pattern"],
        "number" | "integer" => &["maximum", "minimum"],
        _ => &[],
    };
    ParamType {
        base: extra.map_or_else(BaseType::empty, |e| BaseType::new(e, allowed)),
        kind: Kind::Scalar(ty.to_owned()),
    }
}

fn as_object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>> {
    match v {
        Value::Object(o) => Ok(o),
        other => err(format!("{what} must be an object, got {}", py_repr(other))),
    }
}

/// The cookbook's `_ParameterTypeObject(schema, registry)`.
fn parse_object(schema: &Value, registry: &mut SchemaRegistry) -> Result<ParamType> {
    let obj = as_object(schema, "an object schema")?;
    let base = BaseType::new(obj, &[]);
    let mut properties = Vec::new();
    let mut additional = Additional::Absent;
    if obj.is_empty() {
        return Ok(ParamType {
            base,
            kind: Kind::Object {
                properties,
                additional,
            },
        });
    }
    if let Some(defs) = obj.get("$defs") {
        registry.register_definitions(defs)?;
    }
    additional = match obj.get("additionalProperties") {
        None | Some(Value::Null) => Additional::Absent,
        Some(Value::Bool(b)) => Additional::Bool(*b),
        Some(v @ Value::Object(_)) => Additional::Type(Box::new(parse_type(v, registry)?)),
        Some(other) => Additional::Invalid(other.clone()),
    };
    if let Some(props) = obj.get("properties") {
        let props = as_object(props, "properties")?;
        let required: Vec<Value> = match obj.get("required") {
            None => Vec::new(),
            Some(r) => {
                let items = py_iter(r, "required")?;
                if let Some(bad) = items
                    .iter()
                    .find(|v| matches!(v, Value::Array(_) | Value::Object(_)))
                {
                    return err(format!("unhashable required entry {}", py_repr(bad)));
                }
                items
            }
        };
        for (name, prop) in props {
            let optional = !required.iter().any(|r| r.as_str() == Some(name.as_str()));
            let default = match prop {
                Value::Object(p) => p.get("default").filter(|d| !d.is_null()).cloned(),
                _ => None,
            };
            properties.push(Parameter {
                ty: parse_type(prop, registry)?,
                name: name.clone(),
                optional,
                default,
            });
        }
    }
    Ok(ParamType {
        base,
        kind: Kind::Object {
            properties,
            additional,
        },
    })
}

/// The cookbook's `_ParameterTypeEnum`: the values, checked against a declared type.
fn parse_enum(obj: &Map<String, Value>) -> Result<ParamType> {
    let base = BaseType::new(obj, &[]);
    let values = py_iter(obj.get("enum").unwrap_or(&Value::Null), "enum")?;
    if let Some(declared) = obj.get("type") {
        let mut ty = declared.clone();
        if let Value::Array(list) = declared {
            ty = match list.as_slice() {
                [one] => one.clone(),
                [a, b] => {
                    let null = Value::String("null".into());
                    if a != &null && b != &null {
                        return err(format!("Enum type {} is not supported", py_repr(declared)));
                    }
                    if a != &null { a.clone() } else { b.clone() }
                }
                _ => return err(format!("Enum type {} is not supported", py_repr(declared))),
            };
        }
        for val in &values {
            let ok = match (ty.as_str(), val) {
                (_, Value::Null) => true,
                (Some("string"), v) => v.is_string(),
                // bool is an int in Python.
                (Some("number"), v) => v.is_number() || v.is_boolean(),
                (Some("integer"), Value::Number(n)) => !n.is_f64(),
                (Some("integer"), v) => v.is_boolean(),
                (Some("boolean"), v) => v.is_boolean(),
                _ => true,
            };
            if !ok {
                let kind = match ty.as_str() {
                    Some("string") => "a string",
                    Some("number") => "a number",
                    Some("integer") => "an integer",
                    _ => "a boolean",
                };
                return err(format!("Enum value {} is not {kind}", py_str(val)));
            }
        }
    }
    Ok(ParamType {
        base,
        kind: Kind::Enum(values),
    })
}

/// The cookbook's `_parse_parameter_type`.
fn parse_type(schema: &Value, registry: &mut SchemaRegistry) -> Result<ParamType> {
    let obj = match schema {
        Value::Bool(true) => return Ok(scalar("any", None)),
        Value::Bool(false) => {
            tracing::warn!("Boolean schema false is not supported, use null instead");
            return Ok(scalar("null", None));
        }
        Value::Object(o) => o,
        other => {
            return err(format!("Invalid JSON Schema object: {}", py_repr(other)));
        }
    };
    if let Some(reference) = obj.get("$ref") {
        let base = BaseType::new(obj, &[]);
        let name = match registry.resolve_ref(reference)? {
            Resolved::SelfRef => "parameters".to_owned(),
            Resolved::Definition => py_str(reference)
                .rsplit('/')
                .next()
                .unwrap_or("")
                .to_owned(),
        };
        return Ok(ParamType {
            base,
            kind: Kind::Ref(name),
        });
    }
    if let Some(any_of) = obj.get("anyOf") {
        let base = BaseType::new(obj, &[]);
        let types = py_iter(any_of, "anyOf")?
            .iter()
            .map(|t| parse_type(t, registry))
            .collect::<Result<Vec<_>>>()?;
        return Ok(ParamType {
            base,
            kind: Kind::AnyOf(types),
        });
    }
    if obj.contains_key("enum") {
        return parse_enum(obj);
    }
    if let Some(ty) = obj.get("type") {
        return match ty {
            Value::Array(list) => {
                let types = list
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("string") => Ok("string"),
                        Some("number") | Some("integer") => Ok("number"),
                        Some("boolean") => Ok("boolean"),
                        Some("null") => Ok("null"),
                        Some("object") => Ok("{}"),
                        Some("array") => Ok("Array<any>"),
                        _ => err(format!("unknown type {} in a type union", py_repr(t))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(ParamType {
                    base: BaseType::new(obj, &[]),
                    kind: Kind::Union(types),
                })
            }
            Value::String(s) if s == "object" => parse_object(schema, registry),
            Value::String(s) if s == "array" => {
                let base = BaseType::new(obj, &["minItems", "maxItems"]);
                let item = match obj.get("items").filter(|i| py_truthy(i)) {
                    Some(items) => parse_type(items, registry)?,
                    None => scalar("any", None),
                };
                Ok(ParamType {
                    base,
                    kind: Kind::Array(Box::new(item)),
                })
            }
            Value::String(s) => Ok(scalar(s, Some(obj))),
            other => err(format!("unsupported schema type {}", py_repr(other))),
        };
    }
    if obj.is_empty() {
        return Ok(scalar("any", None));
    }
    err(format!("Invalid JSON Schema object: {}", py_repr(schema)))
}

impl ParamType {
    fn format_docstring(&self, indent: &str) -> Result<String> {
        self.base.format_docstring(indent)
    }

    fn to_typescript_style(&self, indent: &str) -> Result<String> {
        let inner = format!("{indent}{TS_INDENT}");
        Ok(match &self.kind {
            Kind::Scalar(t) if t == "integer" => "number".to_owned(),
            Kind::Scalar(t) => t.clone(),
            Kind::Object {
                properties,
                additional,
            } => {
                let mut ordered: Vec<&Parameter> =
                    properties.iter().filter(|p| !p.optional).collect();
                ordered.sort_by(|a, b| a.name.cmp(&b.name));
                let mut optional: Vec<&Parameter> =
                    properties.iter().filter(|p| p.optional).collect();
                optional.sort_by(|a, b| a.name.cmp(&b.name));
                ordered.extend(optional);
                let mut fields = ordered
                    .iter()
                    .map(|p| p.to_typescript_style(&inner))
                    .collect::<Result<Vec<_>>>()?;
                let ap = match additional {
                    Additional::Absent => None,
                    Additional::Bool(true) => Some("any".to_owned()),
                    Additional::Bool(false) => Some("never".to_owned()),
                    Additional::Type(t) => Some(t.to_typescript_style(&inner)?),
                    Additional::Invalid(v) => {
                        return err(format!("Unknown additionalProperties: {}", py_str(v)));
                    }
                };
                if let Some(ap) = ap {
                    fields.push(format!("{inner}[k: string]: {ap}"));
                }
                if fields.is_empty() {
                    return Ok("{}".to_owned());
                }
                format!("{{\n{}\n{indent}}}", fields.join(TS_FIELD_DELIMITER))
            }
            Kind::Array(item) => {
                let doc = item.format_docstring(&inner)?;
                if doc.is_empty() {
                    format!("Array<{}>", item.to_typescript_style(indent)?)
                } else {
                    format!(
                        "Array<\n{doc}{inner}{}\n{indent}>",
                        item.to_typescript_style(&inner)?
                    )
                }
            }
            Kind::Enum(values) => values
                .iter()
                .map(|v| match v {
                    Value::String(s) => format!("\"{s}\""),
                    other => py_str(other),
                })
                .collect::<Vec<_>>()
                .join(" | "),
            Kind::AnyOf(types) => types
                .iter()
                .map(|t| t.to_typescript_style(indent))
                .collect::<Result<Vec<_>>>()?
                .join(" | "),
            Kind::Union(types) => types.join(" | "),
            Kind::Ref(name) => name.clone(),
        })
    }
}

impl Parameter {
    fn to_typescript_style(&self, indent: &str) -> Result<String> {
        let mut comments = self.ty.format_docstring(indent)?;
        if let Some(default) = &self.default {
            let repr = match default {
                Value::Bool(_) => py_repr(default),
                Value::Number(n) => py_number_repr(n),
                other => python_json(other, ", ", ": ", false),
            };
            comments.push_str(&format!("{indent}// Default: {repr}\n"));
        }
        Ok(format!(
            "{comments}{indent}{}{}: {}",
            self.name,
            if self.optional { "?" } else { "" },
            self.ty.to_typescript_style(indent)?
        ))
    }
}

/// One OpenAI function definition (`{"name", "description", "parameters"}`) as TypeScript.
fn function_to_typescript_style(function: &Map<String, Value>) -> Result<String> {
    let mut registry = SchemaRegistry::default();
    let empty = Value::Object(Map::new());
    let parameters = function
        .get("parameters")
        .filter(|p| py_truthy(p))
        .unwrap_or(&empty);
    let parsed = parse_object(parameters, &mut registry)?;

    let mut interfaces = Vec::new();
    let root_interface = registry.has_self_ref;
    if root_interface {
        let Kind::Object { properties, .. } = &parsed.kind else {
            return err("parameters did not parse as an object");
        };
        let fields = properties
            .iter()
            .map(|p| p.to_typescript_style(TS_INDENT))
            .collect::<Result<Vec<_>>>()?
            .join(TS_FIELD_DELIMITER);
        let fields = if fields.is_empty() {
            String::new()
        } else {
            format!("\n{fields}\n")
        };
        interfaces.push(format!("interface parameters {{{fields}}}"));
    }

    let definitions = registry.definitions.clone();
    for (name, schema) in &definitions {
        let ty = parse_type(schema, &mut registry)?;
        let body = ty.to_typescript_style("")?;
        let obj = as_object(schema, "a $defs entry")?;
        let description = match obj.get("description") {
            Some(d) => description_text(d)?
                .map(|d| format_description(d, "") + "\n")
                .unwrap_or_default(),
            None => String::new(),
        };
        interfaces.push(format!("{description}interface {name} {body}"));
    }

    let interface_str = interfaces.join("\n");
    let function_name = function
        .get("name")
        .map_or_else(|| "function".to_owned(), py_str);
    let type_def = if root_interface {
        format!("type {function_name} = (_: parameters) => any;")
    } else {
        format!(
            "type {function_name} = (_: {}) => any;",
            parsed.to_typescript_style("")?
        )
    };
    let description = match function.get("description") {
        Some(d) => description_text(d)?
            .map(|d| format_description(d, ""))
            .unwrap_or_default(),
        None => String::new(),
    };
    Ok([interface_str, description, type_def]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The cookbook's `encode_tools_to_typescript_style`: OpenAI tools
/// (`{"type": "function", "function": {…}}`) as the `# Tools` text Kimi K2.5 declares them
/// with. Tools of another type are skipped; no function at all gives `""`.
///
/// Errors: [`Error::Renderer`] where the reference raises (a `$ref` it cannot resolve, a
/// schema that is not an object, enum values of the wrong type, …).
pub fn encode_tools_to_typescript_style(tools: &[Value]) -> Result<String> {
    let mut functions = Vec::new();
    for tool in tools {
        let Value::Object(tool) = tool else {
            return err(format!("a tool must be an object, got {}", py_repr(tool)));
        };
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            continue;
        }
        let Some(function) = tool.get("function").filter(|f| py_truthy(f)) else {
            continue;
        };
        functions.push(function_to_typescript_style(as_object(
            function,
            "a tool's function",
        )?)?);
    }
    if functions.is_empty() {
        return Ok(String::new());
    }
    Ok(format!(
        "# Tools\n\n## functions\nnamespace functions {{\n{}\n}}\n",
        functions.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_parameters_first_with_constraints_as_comments() {
        let tools = [serde_json::json!({"type": "function", "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {"type": "object", "required": ["a", "b"], "properties": {
                "b": {"type": "integer"}, "a": {"type": "integer", "minimum": 0},
            }},
        }})];
        assert_eq!(
            encode_tools_to_typescript_style(&tools).unwrap(),
            "# Tools\n\n## functions\nnamespace functions {\n// Add two integers\n\
             type add = (_: {\n  // minimum: 0\n  a: number,\n  b: number\n}) => any;\n}\n"
        );
    }
}
