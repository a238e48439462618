//! `chart.svg`: throughput per second of the timed requests and its
//! moving average (top panel) and per-process RSS (bottom panel) over
//! elapsed seconds.
//!
//! Drawn with plotters' SVG backend without a font feature: text is
//! emitted as SVG `<text>` elements and laid out by the viewer, so no
//! system fonts are needed at build or run time.

use std::path::Path;

use plotters::prelude::*;

use crate::error::BenchError;
use crate::samples::Sample;
use crate::stats::moving_average;

/// Samples averaged in the smoothed throughput line (one per second).
pub const SMOOTHING_WINDOW: usize = 10;

/// Chart width and height in pixels.
pub const SIZE: (u32, u32) = (1200, 900);

/// Draws `samples` (rows of `samples.csv` for processes `names`) into an
/// SVG file at `path`, titled `title`; `operation` names the timed
/// requests (`UploadPart`, `PutObject`, `GetObject`) in the throughput caption.
///
/// # Errors
/// [`BenchError::Chart`] when drawing or writing the file fails.
pub fn draw(
    path: &Path,
    title: &str,
    operation: &str,
    names: &[String],
    samples: &[Sample],
) -> Result<(), BenchError> {
    draw_inner(path, title, operation, names, samples).map_err(|source| BenchError::Chart {
        path: path.to_owned(),
        source,
    })
}

fn draw_inner(
    path: &Path,
    title: &str,
    operation: &str,
    names: &[String],
    samples: &[Sample],
) -> Result<(), crate::error::BoxError> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let (top, bottom) = root.split_vertically(SIZE.1 / 2 - 20);

    let x_max = samples.iter().map(|s| s.elapsed_s).fold(1.0, f64::max);
    let mean = if samples.is_empty() {
        0.0
    } else {
        samples.iter().map(|s| s.mib_per_s).sum::<f64>() / samples.len() as f64
    };
    let y_max = samples.iter().map(|s| s.mib_per_s).fold(1.0, f64::max) * 1.1;

    let mut throughput = ChartBuilder::on(&top)
        .caption(
            format!("{operation} throughput (mean {mean:.1} MiB/s)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    throughput
        .configure_mesh()
        .x_desc("elapsed (s)")
        .y_desc("MiB/s")
        .draw()?;
    let per_second_color = RGBColor(150, 170, 230);
    throughput
        .draw_series(LineSeries::new(
            samples.iter().map(|s| (s.elapsed_s, s.mib_per_s)),
            per_second_color.stroke_width(1),
        ))?
        .label("per second")
        .legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], per_second_color.stroke_width(2))
        });
    let rates: Vec<f64> = samples.iter().map(|s| s.mib_per_s).collect();
    let smoothed = moving_average(&rates, SMOOTHING_WINDOW);
    throughput
        .draw_series(LineSeries::new(
            samples
                .iter()
                .zip(smoothed)
                .map(|(s, mean)| (s.elapsed_s, mean)),
            BLUE.stroke_width(2),
        ))?
        .label(format!("{SMOOTHING_WINDOW} s moving average"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    throughput
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;

    let rss_max = samples
        .iter()
        .flat_map(|s| s.rss_mib.iter().flatten().copied())
        .fold(1.0, f64::max)
        * 1.1;
    let caption = if names.is_empty() {
        "RSS (no --pids given)"
    } else {
        "RSS per process"
    };
    let mut rss = ChartBuilder::on(&bottom)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..rss_max)?;
    rss.configure_mesh()
        .x_desc("elapsed (s)")
        .y_desc("RSS (MiB)")
        .draw()?;
    for (i, name) in names.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        // A process that exited has no more points: its line simply ends.
        let points: Vec<(f64, f64)> = samples
            .iter()
            .filter_map(|s| {
                s.rss_mib
                    .get(i)
                    .copied()
                    .flatten()
                    .map(|mib| (s.elapsed_s, mib))
            })
            .collect();
        rss.draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    if !names.is_empty() {
        rss.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_labelled_svg() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("chart.svg");
        let names = vec!["gateway".to_owned(), "dn1".to_owned()];
        let samples: Vec<Sample> = (1..=60)
            .map(|t| Sample {
                elapsed_s: f64::from(t),
                mib_per_s: 30.0 + f64::from(t % 7),
                ops_done: u64::from(t as u32) * 3,
                errors: 0,
                // dn1 "exits" after 40 s.
                rss_mib: vec![Some(250.0 + f64::from(t)), (t <= 40).then_some(100.0)],
            })
            .collect();
        draw(&path, "multipart-put test", "UploadPart", &names, &samples).expect("draw");
        let svg = std::fs::read_to_string(&path).expect("read svg");
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        for text in [
            "multipart-put test",
            "UploadPart throughput",
            "MiB/s",
            "elapsed (s)",
            "RSS (MiB)",
            "gateway",
            "dn1",
        ] {
            assert!(svg.contains(text), "missing label {text}");
        }
        assert!(svg.contains("10 s moving average"));
        assert!(svg.matches("<polyline").count() >= 4, "one line per series");
    }

    #[test]
    fn draws_without_samples_or_processes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("chart.svg");
        draw(&path, "empty", "GetObject", &[], &[]).expect("draw");
        let svg = std::fs::read_to_string(&path).expect("read svg");
        assert!(svg.contains("no --pids given"));
        assert!(svg.contains("GetObject throughput"));
    }
}
