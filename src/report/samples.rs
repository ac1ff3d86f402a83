//! A step's samples on disk: the JSON lines of `samples/NNNNNN.jsonl` and the HTML view.

use std::fmt::Write as _;

use super::SampleRecord;

/// Renders a step's samples as one self-contained HTML page (inline CSS, no scripts, no
/// external resources), grouped by problem: each group shows its prompt once (or per sample
/// when the prompts differ), the mean reward, and for every completion its reward, advantage,
/// reward components, stop reason, parse termination, token count, and the policy version
/// that sampled it (with its staleness when > 0). All text is
/// HTML-escaped.
pub fn render_samples_html(step: u64, samples: &[SampleRecord]) -> String {
    // Groups in order of first appearance, keyed by (group, problem_id).
    let mut groups: Vec<((usize, &str), Vec<&SampleRecord>)> = Vec::new();
    for s in samples {
        let key = (s.group, s.problem_id.as_str());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(s),
            None => groups.push((key, vec![s])),
        }
    }
    let mean_reward = mean(samples.iter().map(|s| s.reward));

    // Room for the texts (an eighth more for their escapes) and ≈ 900 bytes of markup a
    // sample, so that the page is not copied as it grows.
    let text: usize = samples
        .iter()
        .map(|s| s.completion.len() + s.prompt.len())
        .sum();
    let mut h = String::with_capacity(4096 + samples.len() * 900 + text + text / 8);
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(h, "<title>rlvr samples, step {step}</title>");
    h.push_str(CSS);
    h.push_str("</head>\n<body>\n");
    let _ = writeln!(h, "<h1>Samples, step {step}</h1>");
    let _ = writeln!(
        h,
        "<p class=\"summary\">{} groups, {} samples, mean reward {}</p>",
        groups.len(),
        samples.len(),
        fmt_num(mean_reward)
    );
    if samples.is_empty() {
        h.push_str("<p>No samples were recorded for this step.</p>\n");
    }
    for ((group, problem_id), members) in &groups {
        let group_mean = mean(members.iter().map(|s| s.reward));
        let same_prompt = members.windows(2).all(|w| w[0].prompt == w[1].prompt);
        let _ = writeln!(
            h,
            "<section class=\"group\">\n<h2>Group {group} <span class=\"pid\">problem {}</span></h2>",
            escape(problem_id)
        );
        let _ = writeln!(
            h,
            "<p class=\"summary\">{} samples, mean reward {}</p>",
            members.len(),
            fmt_num(group_mean)
        );
        if same_prompt && let Some(first) = members.first() {
            h.push_str("<details open><summary>Prompt</summary><pre class=\"prompt\">");
            push_escaped(&mut h, &first.prompt);
            h.push_str("</pre></details>\n");
        }
        for (i, s) in members.iter().enumerate() {
            let adv_class = if s.advantage > 0.0 {
                "pos"
            } else if s.advantage < 0.0 {
                "neg"
            } else {
                "zero"
            };
            let _ = writeln!(h, "<div class=\"sample\">");
            let _ = write!(
                h,
                "<div class=\"meta\"><span class=\"idx\">#{i}</span>\
                 <span class=\"badge\">reward <b>{}</b></span>\
                 <span class=\"badge {adv_class}\">advantage <b>{}</b></span>\
                 <span class=\"badge\">stop <b>{}</b></span>\
                 <span class=\"badge{}\">termination <b>{}</b></span>\
                 <span class=\"badge\">tokens <b>{}</b></span>\
                 <span class=\"badge{}\">policy <b>{}</b>{}</span>",
                fmt_num(s.reward),
                fmt_num(s.advantage),
                escape(&enum_name(&s.stop_reason)),
                if s.termination.is_clean() {
                    ""
                } else {
                    " warn"
                },
                escape(&enum_name(&s.termination)),
                s.tokens,
                if s.staleness > 0 { " warn" } else { "" },
                s.policy_version,
                if s.staleness > 0 {
                    format!(" ({} stale)", s.staleness)
                } else {
                    String::new()
                }
            );
            for (name, value) in &s.components {
                let _ = write!(
                    h,
                    "<span class=\"badge comp\">{} <b>{}</b></span>",
                    escape(name),
                    fmt_num(*value)
                );
            }
            h.push_str("</div>\n");
            if !same_prompt {
                h.push_str("<details><summary>Prompt</summary><pre class=\"prompt\">");
                push_escaped(&mut h, &s.prompt);
                h.push_str("</pre></details>\n");
            }
            h.push_str("<pre class=\"completion\">");
            push_escaped(&mut h, &s.completion);
            h.push_str("</pre>\n</div>\n");
        }
        h.push_str("</section>\n");
    }
    h.push_str("</body>\n</html>\n");
    h
}

const CSS: &str = "<style>
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto; max-width: 60em; padding: 0 1em; color: #222; background: #fafafa; }
h1 { font-size: 1.5em; }
h2 { font-size: 1.15em; margin: 0 0 .3em; }
.pid { font-weight: normal; color: #666; font-size: .85em; margin-left: .5em; }
.summary { color: #555; margin: .2em 0 .8em; }
.group { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 1em; margin: 1.2em 0; }
.sample { border-top: 1px solid #eee; padding: .6em 0; }
.meta { display: flex; flex-wrap: wrap; gap: .4em; align-items: center; font-size: .85em; }
.idx { color: #888; min-width: 2em; }
.badge { background: #eef1f5; border-radius: 4px; padding: .1em .5em; }
.badge.pos { background: #dff3e1; }
.badge.neg { background: #f8e0e0; }
.badge.warn { background: #fff0c2; }
.badge.comp { background: #e9e6f7; }
pre { white-space: pre-wrap; word-wrap: break-word; font-family: ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace; font-size: .85em; padding: .6em; border-radius: 4px; margin: .4em 0; }
pre.prompt { background: #f3f3f3; color: #444; }
pre.completion { background: #f5f9ff; }
summary { cursor: pointer; color: #555; font-size: .85em; }
</style>
";

/// `0x01` in every byte of a word.
const ONES: u64 = u64::from_ne_bytes([1; 8]);
/// `0x80` in every byte of a word.
const HIGHS: u64 = ONES << 7;

/// Whether some byte of `word` is `b` (exact: the "has a zero byte" test on `word ^ b…b`).
fn has_byte(word: u64, b: u8) -> bool {
    let x = word ^ (ONES * u64::from(b));
    x.wrapping_sub(ONES) & !x & HIGHS != 0
}

/// Whether some byte of `word` is below `0x20` (exact).
fn has_control(word: u64) -> bool {
    word.wrapping_sub(ONES * 0x20) & !word & HIGHS != 0
}

/// Whether none of the 16 bytes of `block` is one of `specials`, nor (with `controls`)
/// below `0x20`: one SSE2 comparison per special, where the word tests take ≈ 4 operations
/// per special and 8 bytes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn plain16(block: &[u8; 16], specials: &[u8], controls: bool) -> bool {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8, _mm_setzero_si128,
    };
    // SAFETY: SSE2 is part of every x86_64 target; the load reads the 16 bytes of `block`,
    // unaligned loads allowed.
    unsafe {
        let v = _mm_loadu_si128(block.as_ptr().cast::<__m128i>());
        let mut hits = _mm_setzero_si128();
        for &b in specials {
            hits = _mm_or_si128(hits, _mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8)));
        }
        if controls {
            // A byte is below 0x20 exactly when its unsigned maximum with 0x1f is 0x1f.
            let low = _mm_set1_epi8(0x1f);
            hits = _mm_or_si128(hits, _mm_cmpeq_epi8(_mm_max_epu8(v, low), low));
        }
        _mm_movemask_epi8(hits) == 0
    }
}

/// [`plain16`] on other targets: two words of 8 bytes.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn plain16(block: &[u8; 16], specials: &[u8], controls: bool) -> bool {
    block.chunks_exact(8).all(|w| {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        plain8(u64::from_le_bytes(word), specials, controls)
    })
}

/// Whether none of the 8 bytes of `word` is one of `specials`, nor (with `controls`) below
/// `0x20`.
#[inline(always)]
fn plain8(word: u64, specials: &[u8], controls: bool) -> bool {
    !(specials.iter().any(|&b| has_byte(word, b)) || controls && has_control(word))
}

/// Appends `text` to `out`, each byte for which `escape` writes a replacement into its
/// buffer (returning its length) replaced by it: the bytes of `specials` and (with
/// `controls`) every byte below `0x20`, which must be all `escape` replaces. Blocks of 16
/// bytes and words of 8 without one are passed over whole; the specials are ASCII, so
/// every cut falls on a character boundary. (A sample's text is mostly plain: a
/// byte-by-byte loop spent 4–10 instructions a byte on it, word tests ≈ 6.)
fn escape_into(
    out: &mut Vec<u8>,
    text: &str,
    specials: &[u8],
    controls: bool,
    escape: impl Fn(u8, &mut [u8; 8]) -> usize,
) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    let mut start = 0;
    let mut i = 0;
    let mut rep = [0u8; 8];
    while i < bytes.len() {
        if let Some(block) = bytes
            .get(i..i + 16)
            .and_then(|b| <&[u8; 16]>::try_from(b).ok())
            && plain16(block, specials, controls)
        {
            i += 16;
            continue;
        }
        if let Some(word) = bytes.get(i..i + 8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            if plain8(u64::from_le_bytes(w), specials, controls) {
                i += 8;
                continue;
            }
        }
        let n = escape(bytes[i], &mut rep);
        if n > 0 {
            out.extend_from_slice(&bytes[start..i]);
            out.extend_from_slice(&rep[..n]);
            start = i + 1;
        }
        i += 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Writes `text` into `rep` and returns its length.
fn put(rep: &mut [u8; 8], text: &[u8]) -> usize {
    rep[..text.len()].copy_from_slice(text);
    text.len()
}

/// Escapes text for HTML element content and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    push_escaped(&mut out, text);
    out
}

/// Appends `text` to `out`, escaped for HTML element content and attribute values.
fn push_escaped(out: &mut String, text: &str) {
    // SAFETY: what `escape_into` appends is `text` (UTF-8) cut only at ASCII bytes, with
    // ASCII entities in their place: UTF-8 too (no second pass over it to check), and it
    // does not panic while the bytes are borrowed.
    let bytes = unsafe { out.as_mut_vec() };
    escape_into(bytes, text, b"&<>\"'", false, |b, rep| match b {
        b'&' => put(rep, b"&amp;"),
        b'<' => put(rep, b"&lt;"),
        b'>' => put(rep, b"&gt;"),
        b'"' => put(rep, b"&quot;"),
        b'\'' => put(rep, b"&#39;"),
        _ => 0,
    });
}

/// Appends `text` as a JSON string, byte for byte what `serde_json` writes: `"` and `\`
/// escaped, the short escapes `\b \t \n \f \r`, other bytes below `0x20` as `\u00xx`,
/// everything else as is.
fn json_string(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    escape_into(out, text, b"\"\\", true, |b, rep| match b {
        b'"' => put(rep, b"\\\""),
        b'\\' => put(rep, b"\\\\"),
        0x08 => put(rep, b"\\b"),
        b'\t' => put(rep, b"\\t"),
        b'\n' => put(rep, b"\\n"),
        0x0c => put(rep, b"\\f"),
        b'\r' => put(rep, b"\\r"),
        0..=0x1f => put(
            rep,
            &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
            ],
        ),
        _ => 0,
    });
    out.push(b'"');
}

/// Appends `,"name":` (the names are plain ASCII: nothing to escape).
fn key(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
}

/// Appends `,"name":` and `value` as `serde_json` writes it.
fn field(out: &mut Vec<u8>, name: &str, value: &impl serde::Serialize) -> serde_json::Result<()> {
    key(out, name);
    serde_json::to_writer(&mut *out, value)
}

/// Appends `,"name":` and `text` as a JSON string ([`json_string`]).
fn text_field(out: &mut Vec<u8>, name: &str, text: &str) {
    key(out, name);
    json_string(out, text);
}

/// `samples` as JSON lines, each the same bytes as `serde_json::to_writer` of its record
/// followed by `\n` (tested). The samples of a group share their prompt: a prompt equal to
/// the previous line's is copied from that line instead of escaped again.
pub(crate) fn write_json_lines(samples: &[SampleRecord]) -> serde_json::Result<Vec<u8>> {
    // One buffer for all the lines (no string per line).
    let mut out = Vec::with_capacity(samples.len() * 2048);
    let mut last_prompt = None;
    for sample in samples {
        write_json_line(&mut out, sample, &mut last_prompt)?;
        out.push(b'\n');
    }
    Ok(out)
}

/// Appends `record` as one JSON object, the same bytes as `serde_json::to_writer` (tested):
/// the free-text fields go through [`json_string`], the rest through `serde_json`.
/// `last_prompt` is the previous record's prompt and where its escaped form lies in `out`;
/// an equal prompt is copied from there, and this record's prompt is left in its place.
fn write_json_line<'a>(
    out: &mut Vec<u8>,
    record: &'a SampleRecord,
    last_prompt: &mut Option<(&'a str, std::ops::Range<usize>)>,
) -> serde_json::Result<()> {
    let SampleRecord {
        problem_id,
        group,
        prompt,
        completion,
        reward,
        advantage,
        components,
        stop_reason,
        termination,
        tokens,
        policy_version,
        staleness,
    } = record;
    out.extend_from_slice(b"{\"problem_id\":");
    json_string(out, problem_id);
    field(out, "group", group)?;
    key(out, "prompt");
    match last_prompt {
        Some((text, escaped)) if *text == prompt.as_str() => {
            out.extend_from_within(escaped.clone())
        }
        _ => {
            let start = out.len();
            json_string(out, prompt);
            *last_prompt = Some((prompt, start..out.len()));
        }
    }
    text_field(out, "completion", completion);
    field(out, "reward", reward)?;
    field(out, "advantage", advantage)?;
    field(out, "components", components)?;
    field(out, "stop_reason", stop_reason)?;
    field(out, "termination", termination)?;
    field(out, "tokens", tokens)?;
    field(out, "policy_version", policy_version)?;
    field(out, "staleness", staleness)?;
    out.push(b'}');
    Ok(())
}

/// The serde name of a unit enum value (`"stop"`, `"stop_sequence"`...).
fn enum_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::from("?"),
    }
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { f64::NAN } else { sum / n as f64 }
}

fn fmt_num(v: f64) -> String {
    if v.is_nan() {
        "–".to_string()
    } else if v == 0.0 {
        "0".to_string()
    } else if v == v.trunc() && v.abs() < 1e9 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_text_and_shows_the_policy_version() {
        use crate::renderer::ParseTermination;
        use crate::types::StopReason;
        use std::collections::BTreeMap;
        let s = SampleRecord {
            problem_id: "p1".into(),
            group: 0,
            prompt: "What is 1<2?".into(),
            completion: "yes & no".into(),
            reward: 1.0,
            advantage: 0.5,
            components: BTreeMap::new(),
            stop_reason: StopReason::Stop,
            termination: ParseTermination::StopSequence,
            tokens: 3,
            policy_version: 6,
            staleness: 1,
        };
        let html = render_samples_html(7, &[s]);
        assert!(html.contains("What is 1&lt;2?") && html.contains("yes &amp; no"));
        assert!(html.contains("policy <b>6</b> (1 stale)"));
    }

    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn escapes_all_specials() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(escape("é<ü>\u{fffd}&"), "é&lt;ü&gt;\u{fffd}&amp;");
        assert_eq!(escape(""), "");
        assert_eq!(escape("plain"), "plain");
    }

    /// The old byte-by-byte HTML escape, the reference for the word-at-a-time one.
    fn escape_bytewise(text: &str) -> String {
        let mut out = String::new();
        for c in text.chars() {
            match c {
                '&' => out.push_str("&amp;"),
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                '"' => out.push_str("&quot;"),
                '\'' => out.push_str("&#39;"),
                c => out.push(c),
            }
        }
        out
    }

    /// Texts that put every special byte (and its neighbours) at every offset of a word and
    /// of a 16-byte block.
    fn texts() -> Vec<String> {
        let pieces = [
            "a",
            "é",
            "\u{1f600}",
            "&",
            "<",
            ">",
            "\"",
            "'",
            "\\",
            "\n",
            "\t",
            "\r",
            "\u{8}",
            "\u{c}",
            "\u{0}",
            "\u{1f}",
            " ",
            "\u{7f}",
            "!",
            "=",
            "?",
            "[",
            "]",
            "%",
            "\u{80}",
        ];
        let mut out = vec![
            String::new(),
            "plain text of some length, no specials".into(),
        ];
        for (i, p) in pieces.iter().enumerate() {
            for pad in 0..33 {
                let before = "x".repeat(pad);
                out.push(format!("{before}{p}"));
                out.push(format!("{before}{p}{}", pieces[(i + pad) % pieces.len()]));
                out.push(format!("{before}{p}abcdefghijklmnop{p}"));
            }
        }
        out.push(pieces.concat().repeat(3));
        out
    }

    #[test]
    fn word_escapes_equal_the_bytewise_ones() {
        for text in texts() {
            assert_eq!(escape(&text), escape_bytewise(&text), "{text:?}");
            let mut json = Vec::new();
            json_string(&mut json, &text);
            assert_eq!(
                String::from_utf8(json).expect("utf-8"),
                serde_json::to_string(&text).expect("json"),
                "{text:?}"
            );
        }
        // Every byte below 0x80 on its own, at each offset of a word.
        for b in 0u8..0x80 {
            for pad in 0..9 {
                let text = format!("{}{}{}", "y".repeat(pad), char::from(b), "z".repeat(9));
                let mut json = Vec::new();
                json_string(&mut json, &text);
                assert_eq!(json, serde_json::to_vec(&text).expect("json"), "{b:#x}");
                assert_eq!(escape(&text), escape_bytewise(&text), "{b:#x}");
            }
        }
    }

    #[test]
    fn json_lines_are_serde_jsons() {
        use crate::renderer::ParseTermination;
        use crate::types::StopReason;
        let texts = texts();
        let mut records = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let mut components = BTreeMap::new();
            if i % 3 == 0 {
                components.insert(format!("c\"{i}"), 0.5);
                components.insert("format".into(), f64::NAN);
            }
            let record = SampleRecord {
                problem_id: texts[(i + 7) % texts.len()].clone(),
                group: i,
                // Runs of up to three lines share a prompt, as a group's samples do.
                prompt: texts[(i / 3 * 13) % texts.len()].clone(),
                completion: text.clone(),
                reward: if i % 5 == 0 {
                    f64::INFINITY
                } else {
                    i as f64 / 7.0
                },
                advantage: -(i as f64) / 3.0,
                components,
                stop_reason: if i % 2 == 0 {
                    StopReason::Stop
                } else {
                    StopReason::Length
                },
                termination: if i % 2 == 0 {
                    ParseTermination::StopSequence
                } else {
                    ParseTermination::Malformed
                },
                tokens: i * 3,
                policy_version: i as u64,
                staleness: (i % 4) as u64,
            };
            let mut line = Vec::new();
            write_json_line(&mut line, &record, &mut None).expect("writes");
            assert_eq!(line, serde_json::to_vec(&record).expect("json"), "{text:?}");
            records.push(record);
        }
        let mut expected = Vec::new();
        for record in &records {
            serde_json::to_writer(&mut expected, record).expect("json");
            expected.push(b'\n');
        }
        assert_eq!(write_json_lines(&records).expect("writes"), expected);
    }

    #[test]
    fn numbers() {
        assert_eq!(fmt_num(1.0), "1");
        assert_eq!(fmt_num(-0.5), "-0.500");
        assert_eq!(fmt_num(f64::NAN), "–");
        assert_eq!(fmt_num(-0.0), "0");
    }
}
