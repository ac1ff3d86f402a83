//! Reward-curve plots (feature `plot`): `reward.png` and `reward.svg` from `metrics.jsonl`.
//!
//! Text in the PNG is rasterised with an embedded font (DejaVu Sans, subset, see
//! `src/report/fonts/LICENSE-DejaVu.txt`), registered with plotters' `ab_glyph` support under a
//! private family name, so no system font is needed. The SVG names common sans-serif families
//! and lets the viewer render the text.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::register_font;

use super::{TEST_ACCURACY_KEY, TRAIN_REWARD_KEY, write_atomic};
use crate::error::{Error, Result};
use crate::fsio::{rename_into_place, temp_sibling};

/// Width of the plots, in pixels.
pub const PLOT_WIDTH: u32 = 960;
/// Height of the plots, in pixels.
pub const PLOT_HEIGHT: u32 = 540;

/// The embedded font (about 35 KB).
static FONT_BYTES: &[u8] = include_bytes!("fonts/DejaVuSans-subset.ttf");
/// The family name the font is registered under (private, so a user's own plotters fonts
/// are not replaced).
const FONT: &str = "rlvr-dejavu-sans";
/// What the SVG asks the viewer for instead of the private family.
const SVG_FONT: &str = "DejaVu Sans, Verdana, Arial, sans-serif";

const TRAIN_COLOR: RGBColor = RGBColor(31, 119, 180);
const TRAIN_LIGHT: RGBColor = RGBColor(160, 196, 226);
const TEST_COLOR: RGBColor = RGBColor(230, 120, 20);

type Series = Vec<(i64, f64)>;

/// The data one chart shows.
struct PlotData {
    train: Series,
    test: Series,
    test_key: Option<String>,
}

fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok());
    if ok {
        Ok(())
    } else {
        Err(Error::Unsupported(
            "the embedded plot font could not be parsed".to_string(),
        ))
    }
}

/// Draws both plot files from metrics rows.
pub(crate) fn plot_metrics(
    rows: &[BTreeMap<String, serde_json::Value>],
    png: &Path,
    svg: &Path,
) -> Result<()> {
    ensure_font()?;
    let data = extract(rows);

    // PNG: the bitmap backend picks the encoder from the extension, so the temporary file
    // keeps `.png`.
    let tmp = temp_sibling(png, ".png");
    let drawn = (|| {
        let root = BitMapBackend::new(&tmp, (PLOT_WIDTH, PLOT_HEIGHT)).into_drawing_area();
        draw(&root, &data).map_err(|e| plot_error(png, e))?;
        root.present().map_err(|e| plot_error(png, e))
    })();
    match drawn {
        Ok(()) => rename_into_place(&tmp, png)?,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }

    let mut text = String::new();
    {
        let root =
            SVGBackend::with_string(&mut text, (PLOT_WIDTH, PLOT_HEIGHT)).into_drawing_area();
        draw(&root, &data).map_err(|e| plot_error(svg, e))?;
        root.present().map_err(|e| plot_error(svg, e))?;
    }
    let text = text.replace(
        &format!("font-family=\"{FONT}\""),
        &format!("font-family=\"{SVG_FONT}\""),
    );
    write_atomic(svg, text.as_bytes())
}

fn plot_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::io("drawing", path, std::io::Error::other(e.to_string()))
}

/// The train reward and test accuracy series (finite values only, sorted by step).
fn extract(rows: &[BTreeMap<String, serde_json::Value>]) -> PlotData {
    let test_key = if rows.iter().any(|r| r.contains_key(TEST_ACCURACY_KEY)) {
        Some(TEST_ACCURACY_KEY.to_string())
    } else {
        rows.iter()
            .flat_map(|r| r.keys())
            .filter(|k| k.starts_with("test/") && k.ends_with("correct"))
            .min()
            .cloned()
    };
    let series = |key: &str| -> Series {
        let mut s: Series = rows
            .iter()
            .filter_map(|r| {
                let step = r.get("step")?.as_f64()?;
                let v = r.get(key)?.as_f64()?;
                (step.is_finite() && v.is_finite()).then_some((step as i64, v))
            })
            .collect();
        s.sort_by_key(|p| p.0);
        s
    };
    PlotData {
        train: series(TRAIN_REWARD_KEY),
        test: test_key.as_deref().map(series).unwrap_or_default(),
        test_key,
    }
}

/// Trailing moving average over `window` points.
fn moving_average(points: &[(i64, f64)], window: usize) -> Series {
    let window = window.max(1);
    let mut out = Vec::with_capacity(points.len());
    let mut sum = 0.0;
    for (i, &(x, y)) in points.iter().enumerate() {
        sum += y;
        if i >= window {
            sum -= points.get(i - window).map_or(0.0, |p| p.1);
        }
        out.push((x, sum / (i + 1).min(window) as f64));
    }
    out
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    data: &PlotData,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let all = data.train.iter().chain(&data.test);
    let (mut x_lo, mut x_hi) = (i64::MAX, i64::MIN);
    let (mut y_lo, mut y_hi) = (0.0f64, 1.0f64);
    for &(x, y) in all {
        x_lo = x_lo.min(x);
        x_hi = x_hi.max(x);
        y_lo = y_lo.min(y);
        y_hi = y_hi.max(y);
    }
    if x_lo > x_hi {
        (x_lo, x_hi) = (0, 1);
    }
    // One step of room (or 2%) on the right so the last markers are not cut.
    x_hi += ((x_hi - x_lo) / 50).max(1);
    let pad = (y_hi - y_lo) * 0.05;
    let (y_lo, y_hi) = (y_lo - pad, y_hi + pad);

    let caption = if data.train.is_empty() && data.test.is_empty() {
        "Reward per step (no data yet)"
    } else {
        "Reward per step"
    };
    let mut chart = ChartBuilder::on(root)
        .caption(caption, (FONT, 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("reward / accuracy")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()?;

    let mut labelled = false;
    if !data.train.is_empty() {
        let window = (data.train.len() / 10).clamp(2, 25);
        let raw = data.train.len() < 5;
        chart
            .draw_series(LineSeries::new(
                data.train.iter().copied(),
                ShapeStyle::from(if raw { TRAIN_COLOR } else { TRAIN_LIGHT })
                    .stroke_width(if raw { 2 } else { 1 }),
            ))?
            .label(format!("train reward ({TRAIN_REWARD_KEY})"))
            .legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], TRAIN_LIGHT.stroke_width(2))
            });
        chart.draw_series(
            data.train
                .iter()
                .map(|&p| Circle::new(p, 2, TRAIN_LIGHT.filled())),
        )?;
        if !raw {
            chart
                .draw_series(LineSeries::new(
                    moving_average(&data.train, window),
                    TRAIN_COLOR.stroke_width(3),
                ))?
                .label(format!("train reward, moving average of {window}"))
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], TRAIN_COLOR.stroke_width(3))
                });
        }
        labelled = true;
    }
    if let (false, Some(key)) = (data.test.is_empty(), &data.test_key) {
        chart
            .draw_series(LineSeries::new(
                data.test.iter().copied(),
                TEST_COLOR.stroke_width(2),
            ))?
            .label(format!("test accuracy ({key})"))
            .legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], TEST_COLOR.stroke_width(2))
            });
        chart.draw_series(
            data.test
                .iter()
                .map(|&p| Circle::new(p, 4, TEST_COLOR.filled())),
        )?;
        labelled = true;
    }
    if labelled {
        chart
            .configure_series_labels()
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(190, 190, 190))
            .position(SeriesLabelPosition::LowerRight)
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: u64, key: &str, v: f64) -> BTreeMap<String, serde_json::Value> {
        let mut r = BTreeMap::new();
        r.insert("step".to_string(), serde_json::json!(step));
        r.insert(key.to_string(), serde_json::json!(v));
        r
    }

    #[test]
    fn moving_average_is_trailing() {
        let pts = [(0, 1.0), (1, 3.0), (2, 5.0), (3, 7.0)];
        assert_eq!(
            moving_average(&pts, 2),
            vec![(0, 1.0), (1, 2.0), (2, 4.0), (3, 6.0)]
        );
    }

    #[test]
    fn test_key_fallback() {
        let rows = vec![
            row(0, TRAIN_REWARD_KEY, 0.1),
            row(2, "test/env/gsm8k/correct", 0.3),
            row(1, TRAIN_REWARD_KEY, 0.2),
        ];
        let d = extract(&rows);
        assert_eq!(d.train, vec![(0, 0.1), (1, 0.2)]);
        assert_eq!(d.test_key.as_deref(), Some("test/env/gsm8k/correct"));
        assert_eq!(d.test, vec![(2, 0.3)]);
        let rows = vec![
            row(0, "test/env/gsm8k/correct", 0.3),
            row(0, TEST_ACCURACY_KEY, 0.4),
        ];
        assert_eq!(extract(&rows).test_key.as_deref(), Some(TEST_ACCURACY_KEY));
    }
}
