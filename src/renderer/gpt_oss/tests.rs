use super::typescript::format_tool_definition;
use super::*;

fn tool(json: &str) -> ToolSpec {
    serde_json::from_str(json).expect("tool JSON")
}

/// Expected strings printed by the cookbook's `_format_tool_definition` (tinker-cookbook
/// 0.6.1) for the same tools.
#[test]
fn tool_definitions_match_the_cookbook() {
    let search = tool(
        r#"{"name": "search", "description": "Search the web", "parameters": {"type": "object", "description": "Query options", "properties": {"q": {"type": "string", "title": "Query", "description": "What to look for", "examples": ["rust", "\u00e9"]}, "limit": {"type": "integer", "default": 10, "nullable": true}, "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}, "mode": {"oneOf": [{"type": "string"}, {"type": "number"}]}, "filter": {"type": "object", "properties": {"lang": {"type": "string"}, "year": {"type": ["integer", "null"]}}, "required": ["lang"]}, "any": {}, "flag": {"type": "boolean", "default": false, "anyOf": [{"type": "boolean"}, {"type": "null"}]}, "ratio": {"type": "number", "default": 0.5, "title": 5}}, "required": ["q", "tags"]}}"#,
    );
    assert_eq!(
        format_tool_definition(&search).unwrap(),
        "// Search the web\ntype search = (_: // Query options\n{\n// Query\n// \n// What to look for\n// Examples:\n// - \"rust\"\n// - \"\\u00e9\"\nq: string,\nlimit?: number | null, // default: 10\ntags: \"a\" | \"b\"[],\nmode?: string | number,\nfilter?: { lang: string, year?: number | any },\nany?: any,\nflag?: boolean | any, // default: false\n// 5\n// \nratio?: number, // default: 0.5\n}) => any;"
    );
    let noargs = tool(r#"{"name": "noargs", "description": "", "parameters": {}}"#);
    assert_eq!(
        format_tool_definition(&noargs).unwrap(),
        "type noargs = () => any;"
    );
    let empty = tool(
        r#"{"name": "emptyprops", "description": "x", "parameters": {"type": "object", "properties": {}}}"#,
    );
    assert_eq!(
        format_tool_definition(&empty).unwrap(),
        "// x\ntype emptyprops = () => any;"
    );
}

/// Where the cookbook raises, this errs.
#[test]
fn malformed_schemas_are_errors() {
    for bad in [
        r#"{"name": "b", "description": "", "parameters": {"type": "object", "properties": {"x": 5}}}"#,
        r#"{"name": "b", "description": "", "parameters": [1]}"#,
        r#"{"name": "b", "description": "", "parameters": {"type": "object", "properties": {"x": {}}, "required": null}}"#,
    ] {
        assert!(
            matches!(format_tool_definition(&tool(bad)), Err(Error::Renderer(_))),
            "{bad}"
        );
    }
}

#[test]
fn civil_dates() {
    assert_eq!(civil_from_days(0), (1970, 1, 1));
    assert_eq!(civil_from_days(20_305), (2025, 8, 5));
    assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    assert_eq!(civil_from_days(-1), (1969, 12, 31));
    let today = today_utc();
    assert_eq!(today.len(), 10);
    assert!(today.as_str() > "2025-01-01");
}

#[test]
fn harmony_headers() {
    let h = "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json";
    assert_eq!(value_after(h, "<|channel|>"), Some("commentary"));
    assert_eq!(value_after(h, "to="), Some("functions.get_weather"));
    // The regex skips an occurrence with nothing after it and takes the next.
    assert_eq!(
        value_after("<|channel|> x<|channel|>final", "<|channel|>"),
        Some("final")
    );
    assert_eq!(value_after("<|start|>assistant", "<|channel|>"), None);
}

#[test]
fn harmony_output_splits_channels_and_calls() {
    let text = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|> {\"a\": 1} <|call|><|start|>assistant to=functions.g<|channel|>commentary<|message|>{oops";
    let (parts, calls, unparsed) = parse_harmony_output(text);
    assert_eq!(
        parts,
        vec![
            ContentPart::thinking("think"),
            ContentPart::text("Let me look.")
        ]
    );
    assert_eq!(calls, vec![ToolCall::new("f", "{\"a\": 1}")]);
    assert_eq!(unparsed.len(), 1);
    assert!(
        unparsed[0]
            .raw_text
            .starts_with("<|start|>assistant to=functions.g")
    );
    assert!(unparsed[0].error.starts_with("Invalid JSON"));
    assert!(detect_dangling_tool_block(text, 1, 1).is_none());
    let dangling =
        detect_dangling_tool_block("<|start|>assistant to=functions.f<|channel|>", 0, 0).unwrap();
    assert!(dangling.error.starts_with(UNTERMINATED_TOOL_BLOCK_ERROR));
}
