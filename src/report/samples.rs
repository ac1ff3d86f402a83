//! The HTML view of a step's samples.

use std::fmt::Write as _;

use super::SampleRecord;

/// Renders a step's samples as one self-contained HTML page (inline CSS, no scripts, no
/// external resources), grouped by problem: each group shows its prompt once (or per sample
/// when the prompts differ), the mean reward, and for every completion its reward, advantage,
/// reward components, stop reason, parse termination, token count, and the policy version
/// that sampled it (with its staleness when > 0). All text is
/// HTML-escaped.
///
/// ```
/// use std::collections::BTreeMap;
/// use rlvr::report::{render_samples_html, SampleRecord};
/// use rlvr::{ParseTermination, StopReason};
///
/// let s = SampleRecord {
///     problem_id: "p1".into(), group: 0, prompt: "What is 1<2?".into(),
///     completion: "yes & no".into(), reward: 1.0, advantage: 0.5,
///     components: BTreeMap::new(), stop_reason: StopReason::Stop,
///     termination: ParseTermination::StopSequence, tokens: 3,
///     policy_version: 6, staleness: 1,
/// };
/// let html = render_samples_html(7, &[s]);
/// assert!(html.contains("What is 1&lt;2?") && html.contains("yes &amp; no"));
/// assert!(html.contains("policy <b>6</b> (1 stale)"));
/// ```
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

    let mut h = String::with_capacity(4096 + samples.len() * 1024);
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
        if same_prompt {
            if let Some(first) = members.first() {
                let _ = writeln!(
                    h,
                    "<details open><summary>Prompt</summary><pre class=\"prompt\">{}</pre></details>",
                    escape(&first.prompt)
                );
            }
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
                let _ = writeln!(
                    h,
                    "<details><summary>Prompt</summary><pre class=\"prompt\">{}</pre></details>",
                    escape(&s.prompt)
                );
            }
            let _ = writeln!(
                h,
                "<pre class=\"completion\">{}</pre>\n</div>",
                escape(&s.completion)
            );
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

/// Escapes text for HTML element content and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    // Runs between the special characters are copied whole; the specials are ASCII, so
    // every cut falls on a character boundary.
    let mut start = 0;
    for (i, b) in text.bytes().enumerate() {
        let entity = match b {
            b'&' => "&amp;",
            b'<' => "&lt;",
            b'>' => "&gt;",
            b'"' => "&quot;",
            b'\'' => "&#39;",
            _ => continue,
        };
        out.push_str(&text[start..i]);
        out.push_str(entity);
        start = i + 1;
    }
    out.push_str(&text[start..]);
    out
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
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
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
    use super::*;

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

    #[test]
    fn numbers() {
        assert_eq!(fmt_num(1.0), "1");
        assert_eq!(fmt_num(-0.5), "-0.500");
        assert_eq!(fmt_num(f64::NAN), "–");
        assert_eq!(fmt_num(-0.0), "0");
    }
}
