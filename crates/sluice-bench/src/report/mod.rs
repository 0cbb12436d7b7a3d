//! The bench's outputs, all made from a `Results` (so a recorded results.json
//! can be rendered again): results.json (versioned schema), results.csv,
//! figures as SVG and PNG (one set per victim model, one line per
//! configuration), report.html, and the summary table printed at the end.
//! Beside it: [`plot`] (the figures' common parts) and [`fate`] (the
//! per-level chart of where the applied packets went).
pub mod fate;
pub mod plot;

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use plotters::prelude::*;

use crate::scenarios::level::{Ledger, Rtt};
use crate::scenarios::scenario::{ConfigKind, SCHEMA_VERSION};
use crate::scenarios::sweep::{summarise, ModelRun, Point, Results, Stat};

/// Read a results.json, checking its schema version. A version-1 file is
/// upgraded: its per-level summaries are made again from its measurements
/// (version 1 took the upper middle value as the median of an even count),
/// and a probe with no reply gets no round-trip time instead of 0.
pub fn load(path: &Path) -> Result<Results> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let version = v["schema_version"].as_u64().unwrap_or(0);
    if version != SCHEMA_VERSION as u64 && version != 1 {
        bail!("{}: schema version {version}, this sluice reads versions 1 and {SCHEMA_VERSION}", path.display());
    }
    let mut r: Results =
        serde_json::from_value(v).with_context(|| format!("{}: does not match the results schema", path.display()))?;
    if version == 1 {
        upgrade_v1(&mut r);
    }
    Ok(r)
}

fn upgrade_v1(r: &mut Results) {
    r.schema_version = SCHEMA_VERSION;
    for m in &mut r.models {
        for x in m.results.iter_mut().filter(|x| x.legit_replies == 0) {
            x.rtt = Rtt::default();
        }
        let mut configs: Vec<ConfigKind> = vec![];
        let mut multiples: Vec<f64> = vec![];
        for p in &m.points {
            if !configs.contains(&p.config) {
                configs.push(p.config);
            }
            if !multiples.contains(&p.multiple) {
                multiples.push(p.multiple);
            }
        }
        m.points = summarise(&m.results, &configs, &multiples);
    }
}

/// CSV: one row per measurement.
pub fn csv(r: &Results) -> String {
    let mut o = String::from(
        "model,config,multiple,repeat,asked_pps,sent_pps,valid,xdp_seen_pps,delivered_pps,legit_sent,legit_replies,\
         legit_loss,rtt_p50_us,rtt_p90_us,rtt_p99_us,rtt_max_us,cpu_busy,cpu_busy_procstat,ns_per_delivered,",
    );
    o += &Ledger::COLUMNS.join(",");
    o.push('\n');
    for m in &r.models {
        for x in &m.results {
            let _ = write!(
                o,
                "{},{},{},{},{:.0},{:.0},{},{:.0},{:.0},{},{},{:.4},{},{},{},{},{:.4},{:.4},{},",
                m.model.name(),
                x.config.name(),
                x.multiple,
                x.repeat,
                x.asked_pps,
                x.sent_pps,
                x.valid,
                x.xdp_seen_pps,
                x.delivered_pps,
                x.legit_sent,
                x.legit_replies,
                x.legit_loss,
                csv_value(x.rtt.p50_us),
                csv_value(x.rtt.p90_us),
                csv_value(x.rtt.p99_us),
                csv_value(x.rtt.max_us),
                x.cpu_busy,
                x.cpu_busy_procstat,
                csv_value(x.ns_per_delivered),
            );
            let cols: Vec<String> = x.ledger.values().iter().map(i64::to_string).collect();
            let _ = writeln!(o, "{}", cols.join(","));
        }
    }
    o
}

/// A CSV cell: the value with one decimal, or empty where it was not measured.
fn csv_value(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| format!("{v:.1}"))
}

/// The figures of one model: (file stem, title, y label, metric, scale).
/// Each point is the median of the repeats with a bar from min to max; a
/// level whose metric is missing has no point on the line.
type Metric = fn(&Point) -> Stat;
const FIGURES: &[(&str, &str, &str, Metric, f64)] = &[
    ("delivered", "delivered vs applied load", "delivered (datagrams/s)", |p| p.delivered_pps, 1.0),
    ("cpu", "victim CPU vs applied load", "victim CPU busy (%)", |p| p.cpu_busy, 100.0),
    ("ns_per_delivered", "victim CPU per delivered datagram", "ns per delivered datagram", |p| p.ns_per_delivered, 1.0),
    ("legit_p99", "legitimate probe p99 round trip", "p99 RTT (us)", |p| p.legit_p99_us, 1.0),
    ("outbound", "the victim's outbound flow (10 Mb/s sent)", "received (Mb/s)", |p| p.outbound_mbps, 1.0),
    ("ping", "ping from A to the victim", "mean round trip (us)", |p| p.ping_avg_us, 1.0),
];

pub(crate) fn colour(c: ConfigKind) -> RGBColor {
    match c {
        ConfigKind::Off => RGBColor(200, 40, 40),
        ConfigKind::Nft => RGBColor(230, 150, 0),
        ConfigKind::Static => RGBColor(30, 90, 200),
        ConfigKind::Auto => RGBColor(20, 150, 60),
        ConfigKind::AutoPno => RGBColor(140, 60, 170),
        ConfigKind::AutoIdle => RGBColor(90, 90, 90),
    }
}

/// One point of a line: x (sent, median), median, min, max (scaled).
type Xy = (f64, f64, f64, f64);

fn point_of(p: &Point, fig: &(&str, &str, &str, Metric, f64)) -> Option<Xy> {
    let st = (fig.3)(p);
    let scale = fig.4;
    let (y, lo, hi) = (st.median? * scale, st.min? * scale, st.max? * scale);
    [y, lo, hi].iter().all(|v| v.is_finite()).then_some((p.sent_pps.median?.max(1.0), y, lo, hi))
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    m: &ModelRun,
    fig: &(&str, &str, &str, Metric, f64),
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e| anyhow::anyhow!("{e:?}");
    root.fill(&WHITE).map_err(e)?;
    // The legend has its own column, so it never hides a point.
    let (plot, legend) = root.split_horizontally(600);
    let pts: Vec<(&Point, Xy)> = m.points.iter().filter_map(|p| point_of(p, fig).map(|v| (p, v))).collect();
    let x0 = pts.iter().map(|(_, v)| v.0).fold(f64::MAX, f64::min).min(1e9);
    let x1 = pts.iter().map(|(_, v)| v.0).fold(1e3, f64::max);
    let peak_line = (fig.0 == "delivered").then_some(m.peak_pps);
    let y1 = pts.iter().map(|(_, v)| v.3).chain(peak_line).fold(1.0, f64::max) * 1.1;
    let peak = m.peak_pps.max(1.0);
    let mut chart = ChartBuilder::on(&plot)
        .caption(format!("{} ({} model)", fig.1, m.model.name()), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((x0 * 0.8..x1 * 1.25).log_scale(), 0.0..y1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("applied load, packets/s sent (multiple of the calibrated peak)")
        .y_desc(fig.2)
        .x_label_formatter(&|v| {
            // Log-scale ticks come at 1..9 x 10^k: label 1, 2 and 5 only, so labels do not overlap.
            let lead = (v / 10f64.powf(v.log10().floor())).round();
            if [1.0, 2.0, 5.0].contains(&lead) {
                format!("{} ({:.1}x)", sluice::base::fmt::human(*v), v / peak)
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| sluice::base::fmt::human(*v))
        .draw()
        .map_err(e)?;
    if let Some(p) = peak_line {
        let dashed = BLACK.mix(0.6).stroke_width(1);
        chart.draw_series(DashedLineSeries::new([(x0 * 0.8, p), (x1 * 1.25, p)], 6, 4, dashed)).map_err(e)?;
    }
    let mut configs: Vec<ConfigKind> = m.points.iter().map(|p| p.config).collect();
    configs.sort_by_key(|c| c.name());
    configs.dedup();
    for &c in &configs {
        let line: Vec<&(&Point, Xy)> = pts.iter().filter(|(p, _)| p.config == c).collect();
        let col = colour(c);
        chart.draw_series(LineSeries::new(line.iter().map(|(_, v)| (v.0, v.1)), col.stroke_width(2))).map_err(e)?;
        chart
            .draw_series(line.iter().map(|(_, v)| ErrorBar::new_vertical(v.0, v.2, v.1, v.3, col.stroke_width(1), 6)))
            .map_err(e)?;
        for (p, v) in &line {
            // A point whose generator fell short of the asked rate is an X, not a dot.
            if p.valid {
                chart.draw_series(std::iter::once(Circle::new((v.0, v.1), 4, col.filled()))).map_err(e)?;
            } else {
                chart.draw_series(std::iter::once(Cross::new((v.0, v.1), 6, col.stroke_width(2)))).map_err(e)?;
            }
        }
    }
    draw_legend(&legend, &configs, peak_line.is_some())?;
    root.present().map_err(e)?;
    Ok(())
}

/// The legend column: a line per configuration, then what the marks mean.
fn draw_legend<DB: DrawingBackend>(
    legend: &DrawingArea<DB, plotters::coord::Shift>,
    configs: &[ConfigKind],
    peak_line: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e| anyhow::anyhow!("{e:?}");
    let mut y = 50;
    for &c in configs {
        let col = colour(c);
        legend.draw(&PathElement::new(vec![(8, y + 7), (30, y + 7)], col.stroke_width(3))).map_err(e)?;
        legend.draw(&Text::new(c.name().to_string(), (36, y), ("sans-serif", 14))).map_err(e)?;
        y += 22;
    }
    let notes =
        ["dot: median of the repeats", "bar: min to max", "X: generator short of the", "   asked rate (invalid)"];
    let notes = notes.iter().copied().chain(peak_line.then_some("dashed: calibrated peak"));
    for line in notes {
        y += 18;
        legend.draw(&Text::new(line.to_string(), (8, y), ("sans-serif", 12))).map_err(e)?;
    }
    Ok(())
}

/// Write every figure of every model as SVG and PNG into `dir`; returns the SVG file names.
pub fn figures(r: &Results, dir: &Path) -> Result<Vec<String>> {
    crate::report::plot::register_font()?;
    let mut names = Vec::new();
    for m in &r.models {
        for fig in FIGURES {
            let stem = format!("{}-{}", m.model.name(), fig.0);
            names.push(crate::report::plot::svg_and_png!(dir, stem, (760, 460), |root| draw(root, m, fig)));
        }
        names.extend(crate::report::fate::figures(m, dir)?);
    }
    Ok(names)
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// The NAPI study's table for one configuration: the highest level with less than
/// LOSS_FREE lost (delivered against sent, medians), the first level past it
/// with more, and the per-packet cost the loss-free rate implies (1 / its
/// sent rate). None where no level qualifies.
pub fn loss_free(points: &[Point], config: ConfigKind) -> (Option<&Point>, Option<&Point>) {
    let mut ps: Vec<&Point> = points.iter().filter(|p| p.config == config).collect();
    ps.sort_by(|a, b| a.multiple.total_cmp(&b.multiple));
    let lossy = |p: &Point| match (p.sent_pps.median, p.delivered_pps.median) {
        (Some(s), Some(d)) if s > 0.0 => 1.0 - d / s >= crate::scenarios::sweep::LOSS_FREE,
        _ => true,
    };
    let first_lossy = ps.iter().position(|p| lossy(p));
    let highest_free = ps[..first_lossy.unwrap_or(ps.len())].last().copied();
    (highest_free, first_lossy.map(|i| ps[i]))
}

fn loss_free_table(o: &mut String, m: &ModelRun) {
    let _ = writeln!(
        o,
        "  the NAPI study's table from the levels above (their repeats' medians, not the calibration's runs): highest loss-free level (< {}% lost), first lossy level, 1 / loss-free rate",
        crate::scenarios::sweep::LOSS_FREE * 100.0
    );
    let mut configs: Vec<ConfigKind> = m.points.iter().map(|p| p.config).collect();
    configs.sort_by_key(|c| c.name());
    configs.dedup();
    for c in configs {
        let (free, lossy) = loss_free(&m.points, c);
        let level = |p: Option<&Point>| {
            p.and_then(|p| Some(format!("{}x ({}/s)", p.multiple, sluice::base::fmt::human(p.sent_pps.median?))))
                .unwrap_or_else(|| "none".into())
        };
        let cost = free.and_then(|p| p.sent_pps.median).map_or("n/a".into(), |s| format!("{:.0} ns", 1e9 / s));
        let _ = writeln!(
            o,
            "    {:<9} loss-free {:<20} first lossy {:<20} per packet {}",
            c.name(),
            level(free),
            level(lossy),
            cost
        );
    }
}

/// The summary table: per model, configuration and level, the median of the
/// repeats with their range, delivered as a share of the calibrated peak,
/// both CPU meters, cost and the probe's p99. Marks: `NO` in valid (the
/// generator fell short), `!` after cpu (the two meters disagree), `n/a`
/// where a measurement is missing.
pub fn summary(r: &Results) -> String {
    let mut o = String::new();
    for m in &r.models {
        let _ = writeln!(
            o,
            "{} model: peak {}/s delivered; the calibration's MLFRR (< {}% loss, one short run a rate) {}; static rate {}/s; {} repeat(s) per level: median (min-max)",
            m.model.name(),
            sluice::base::fmt::human(m.peak_pps),
            crate::scenarios::sweep::LOSS_FREE * 100.0,
            m.mlfrr_pps.map_or("n/a (no loss-free level)".into(), |x| format!(
                "{}/s ({:.0} ns per packet)",
                sluice::base::fmt::human(x),
                1e9 / x
            )),
            sluice::base::fmt::human(m.static_rate),
            r.scenario.repeats
        );
        let _ = writeln!(
            o,
            "  {:<9} {:>6} {:>8} {:>24} {:>6} {:>11} {:>8} {:>20} {:>6} {:>8} {:>8}",
            "config",
            "level",
            "sent/s",
            "deliv/s",
            "%peak",
            "cpu idle/ps",
            "ns/deliv",
            "p99 us",
            "valid",
            "out Mb/s",
            "ping us"
        );
        for p in &m.points {
            let cpu = format!(
                "{}/{}{}",
                p.cpu_busy.median.map_or("n/a".into(), pct),
                p.cpu_busy_procstat.median.map_or("n/a".into(), pct),
                if p.cpu_meters_disagree > 0 { "!" } else { "" }
            );
            let _ = writeln!(
                o,
                "  {:<9} {:>5}x {:>8} {:>24} {:>6} {:>11} {:>8} {:>20} {:>6} {:>8} {:>8}",
                p.config.name(),
                p.multiple,
                p.sent_pps.median.map_or("n/a".into(), sluice::base::fmt::human),
                p.delivered_pps.show(sluice::base::fmt::human),
                p.delivered_pps.median.map_or("n/a".into(), |d| pct(d / m.peak_pps.max(1.0))),
                cpu,
                p.ns_per_delivered.show(|v| format!("{v:.0}")),
                p.legit_p99_us.show(|v| format!("{v:.0}")),
                if p.valid { "yes" } else { "NO" },
                p.outbound_mbps.median.map_or("n/a".into(), |v| format!("{v:.2}")),
                p.ping_avg_us.median.map_or("n/a".into(), |v| format!("{v:.0}"))
            );
        }
        let _ = writeln!(
            o,
            "  cpu: busy by the idle-thread meter / by /proc/stat; ! = they differ by more than {:.0} points",
            crate::scenarios::level::CPU_METERS_BOUND * 100.0
        );
        loss_free_table(&mut o, m);
    }
    o
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The report's verdict on one model: at the highest level whose cells are
/// all valid (the generator reached the asked rate in each), what the
/// service delivered (of its calibrated peak) in each configuration. A
/// higher level with an invalid cell is named, never quoted.
pub fn verdict(m: &ModelRun) -> Option<String> {
    let mut levels: Vec<f64> = m.points.iter().map(|p| p.multiple).collect();
    levels.sort_by(|a, b| b.total_cmp(a));
    levels.dedup();
    let valid = |level: f64| m.points.iter().filter(|p| p.multiple == level).all(|p| p.valid);
    let top = levels.iter().copied().find(|&l| valid(l))?;
    let skipped: Vec<String> = levels.iter().take_while(|&&l| l > top).map(|l| format!("{l}x")).collect();
    let share = |c: ConfigKind| {
        let p = m.points.iter().find(|p| p.multiple == top && p.config == c)?;
        Some(p.delivered_pps.median.map_or("n/a".into(), |d| pct(d / m.peak_pps.max(1.0))))
    };
    let mut configs: Vec<ConfigKind> = m.points.iter().filter(|p| p.multiple == top).map(|p| p.config).collect();
    configs.dedup();
    // With sluice first, then without.
    let mut parts: Vec<String> = configs
        .iter()
        .filter(|&&c| c != ConfigKind::Off)
        .filter_map(|&c| Some(format!("{} with sluice ({})", share(c)?, c.name())))
        .collect();
    if let Some(off) = share(ConfigKind::Off) {
        parts.push(format!("{off} without sluice"));
    }
    let first = parts.first_mut()?;
    *first = first.replacen(' ', " of its peak ", 1);
    let said = match parts.len() {
        1 => parts[0].clone(),
        n => format!("{}, and {}", parts[..n - 1].join(", "), parts[n - 1]),
    };
    let not_valid = match skipped.len() {
        0 => String::new(),
        _ => {
            format!(" ({} not quoted: the generator fell short of the asked rate in some cell)", skipped.join(" and "))
        }
    };
    Some(format!(
        "{} model: flooded at {top}x what the service can take, it delivered {said}{not_valid}.",
        m.model.name()
    ))
}

/// What `sluice bench demo` wrote beside the report (`dns-demo.json`): its
/// verdict and its table.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct DnsDemo {
    pub verdict: String,
    pub table: String,
}

/// The file `sluice bench demo --out DIR` writes and report.html reads.
pub const DNS_DEMO_FILE: &str = "dns-demo.json";

/// report.html, answer first: the verdicts (the DNS demo's, if it ran into
/// the same folder, then each model's), then each part's figure and table,
/// the ledger per level, and the parameters last.
pub fn html(r: &Results, figures: &[String], dns: Option<&DnsDemo>) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>sluice bench: {}</title>\
         <style>body{{font-family:sans-serif;max-width:1600px;margin:2em}}table{{border-collapse:collapse;font-size:13px}}\
         td,th{{border:1px solid #bbb;padding:2px 6px;text-align:right}}img{{width:760px}}\
         .verdict{{font-size:1.15em}}</style></head><body>",
        esc(&r.scenario.name)
    );
    let _ = write!(o, "<h1>What a flood does to a service, with and without sluice</h1>");
    let mut verdicts: Vec<String> = dns.map(|d| d.verdict.clone()).into_iter().collect();
    verdicts.extend(r.models.iter().filter_map(verdict));
    let _ = write!(
        o,
        "<p class=\"verdict\" id=\"verdict\">{}</p>",
        verdicts.iter().map(|v| esc(v)).collect::<Vec<_>>().join("<br>")
    );
    if let Some(d) = dns {
        let _ = write!(
            o,
            "<h2>A DNS server under a closed-port flood</h2><p>{}</p><pre>{}</pre>",
            esc(&d.verdict),
            esc(&d.table)
        );
    }
    let _ = write!(o, "<h2>The overload testbed: scenario {}</h2>", esc(&r.scenario.name));
    for m in &r.models {
        let _ = write!(o, "<h3>{} model</h3>", m.model.name());
        if let Some(v) = verdict(m) {
            let _ = write!(o, "<p>{}</p>", esc(&v));
        }
        for f in figures.iter().filter(|f| f.starts_with(&format!("{}-", m.model.name()))) {
            let _ = write!(o, "<img src=\"{f}\" alt=\"{f}\">");
        }
        o.push_str("<p>Which CPU runs which stage:</p><ul>");
        for (stage, cpu) in &m.stages {
            let _ = write!(o, "<li>{} on CPU {cpu}</li>", esc(stage));
        }
        o.push_str("</ul>");
    }
    let _ = write!(o, "<h2>Summary</h2><pre>{}</pre>", esc(&summary(r)));
    for m in &r.models {
        let _ = write!(o, "<h3>Ledger, {} model: where the packets of each window went</h3>", m.model.name());
        o.push_str(
            "<table><tr><th>config</th><th>level</th><th>repeat</th>\
             <th>applied</th><th>ring drops</th><th>XDP drops</th><th>nft drops</th><th>backlog drops</th><th>socket drops</th>\
             <th>delivered</th><th>unaccounted</th><th>kernel drops after the gate (traced, by reason)</th>\
             <th>traced unaccounted</th><th>valid</th></tr>",
        );
        for x in &m.results {
            let _ = write!(o, "<tr><td>{}</td><td>{}x</td><td>{}</td>", x.config.name(), x.multiple, x.repeat);
            for v in x.ledger.values() {
                let _ = write!(o, "<td>{v}</td>");
            }
            let kernel: Vec<String> =
                x.ledger.kernel_drops.iter().map(|d| format!("{} {}", d.reason, d.packets)).collect();
            let traced = x.ledger.traced_unaccounted.map_or("n/a".to_string(), |u| u.to_string());
            let _ = write!(o, "<td>{}</td><td>{traced}</td>", esc(&kernel.join(", ")));
            let _ = write!(o, "<td>{}</td></tr>", if x.valid { "yes" } else { "NO" });
        }
        o.push_str(
            "</table><p>unaccounted = applied minus the other columns: packets in flight at the window's edges \
             (tolerance 1% of applied, plus what was sent while each edge's counters were read). traced unaccounted = applied minus ring, XDP, nft, the traced kernel drops \
             and delivered (`sluice trace`'s counts).</p>",
        );
    }
    let _ = write!(
        o,
        "<h2>Parameters</h2><p>Machine: {} CPUs, {}, Linux {}; sluice {}. Results schema version {}.</p><pre>{}</pre>",
        r.machine.cpus,
        esc(&r.machine.cpu),
        esc(&r.machine.kernel),
        esc(&r.machine.sluice),
        r.schema_version,
        esc(&toml::to_string(&r.scenario).unwrap_or_default())
    );
    o.push_str("</body></html>\n");
    o
}

/// Write every output into `dir`.
pub fn write_all(r: &Results, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(r)?)?;
    std::fs::write(dir.join("results.csv"), csv(r))?;
    let figs = figures(r, dir)?;
    // The DNS demo's part, when `sluice bench demo` wrote into the same folder.
    let dns = std::fs::read_to_string(dir.join(DNS_DEMO_FILE)).ok().and_then(|t| serde_json::from_str(&t).ok());
    std::fs::write(dir.join("report.html"), html(r, &figs, dns.as_ref()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(config: ConfigKind, multiple: f64, sent: f64, delivered: f64) -> Point {
        Point {
            config,
            multiple,
            asked_pps: sent,
            sent_pps: Stat::of_all([sent]),
            delivered_pps: Stat::of_all([delivered]),
            legit_replies_pps: Stat::default(),
            legit_loss: Stat::default(),
            legit_p99_us: Stat::default(),
            cpu_busy: Stat::default(),
            cpu_busy_procstat: Stat::default(),
            cpu_meters_disagree: 0,
            ns_per_delivered: Stat::default(),
            valid: true,
            outbound_mbps: Stat::default(),
            ping_avg_us: Stat::default(),
        }
    }

    #[test]
    fn the_loss_free_level_is_the_last_before_the_first_lossy_one() {
        let ps = vec![
            point(ConfigKind::Off, 2.0, 200e3, 150e3),
            point(ConfigKind::Off, 0.5, 50e3, 50e3),
            point(ConfigKind::Off, 1.0, 100e3, 99.9e3),
            point(ConfigKind::Off, 3.0, 300e3, 300e3), // loss-free again past a lossy level: not counted
            point(ConfigKind::Static, 0.5, 50e3, 40e3),
        ];
        let (free, lossy) = loss_free(&ps, ConfigKind::Off);
        assert_eq!(free.map(|p| p.multiple), Some(1.0));
        assert_eq!(lossy.map(|p| p.multiple), Some(2.0));
        let (free, lossy) = loss_free(&ps, ConfigKind::Static);
        assert!(free.is_none());
        assert_eq!(lossy.map(|p| p.multiple), Some(0.5));
        assert_eq!(loss_free(&ps, ConfigKind::Auto), (None, None));
    }

    /// A results file of one model at two levels, off and auto (what the
    /// report's tests render).
    pub(crate) fn fixture() -> Results {
        let points = vec![
            point(ConfigKind::Off, 1.0, 100e3, 95e3),
            point(ConfigKind::Auto, 1.0, 100e3, 97e3),
            point(ConfigKind::Off, 10.0, 1e6, 12e3),
            point(ConfigKind::Auto, 10.0, 1e6, 96e3),
        ];
        let model = ModelRun {
            model: crate::testbed::victim::VictimModel::Nic,
            stages: vec![("service".into(), 1)],
            calibration: vec![],
            peak_pps: 100e3,
            mlfrr_pps: None,
            mlfrr_ns_per_packet: None,
            static_rate: 100e3,
            results: vec![],
            points,
        };
        Results {
            schema_version: SCHEMA_VERSION,
            scenario: crate::scenarios::scenario::load("demo").unwrap(),
            machine: crate::scenarios::sweep::Machine {
                kernel: "6.18".into(),
                cpu: "test".into(),
                cpus: 2,
                sluice: "0".into(),
            },
            started: 0,
            models: vec![model],
        }
    }

    #[test]
    fn the_report_starts_with_its_verdicts_and_ends_with_its_parameters() {
        let dns = DnsDemo { verdict: "DNS: NSD answered 99.78%".into(), table: "phase ...".into() };
        let page = html(&fixture(), &[], Some(&dns));
        let first_p = page.find("<p").unwrap();
        assert!(page[first_p..].starts_with("<p class=\"verdict\""), "the first paragraph is the verdict");
        let verdict = &page[first_p..page[first_p..].find("</p>").unwrap() + first_p];
        assert!(verdict.contains("DNS: NSD answered 99.78%"), "{verdict}");
        let want = "nic model: flooded at 10x what the service can take, it delivered 96% of its peak with sluice (auto), and 12% without sluice.";
        assert!(verdict.contains(want), "{verdict}");
        let (params, summary) = (page.find("<h2>Parameters").unwrap(), page.find("<h2>Summary").unwrap());
        assert!(params > summary && page[params..].contains("<pre>"), "parameters come last");
    }

    /// A level the generator did not reach in some cell is not quoted: the
    /// verdict stands on the highest level whose cells are all valid, and
    /// names the one it passed over (issue 52: `make demo` quoted 118% from
    /// such a cell).
    #[test]
    fn the_verdict_stands_on_the_highest_level_whose_cells_are_all_valid() {
        let mut r = fixture();
        let m = &mut r.models[0];
        m.points.iter_mut().filter(|p| p.multiple == 10.0 && p.config == ConfigKind::Auto).for_each(|p| {
            p.valid = false;
            p.delivered_pps.median = Some(118e3);
        });
        let v = verdict(m).unwrap();
        assert!(v.contains("flooded at 1x") && v.contains("97% of its peak with sluice (auto)"), "{v}");
        assert!(v.contains("10x not quoted") && !v.contains("118%"), "{v}");
        m.points.iter_mut().for_each(|p| p.valid = false);
        assert_eq!(verdict(m), None, "no valid level: no verdict");
    }

    /// The page's text as headless Chromium renders it (`--dump-dom`, tags
    /// stripped): the first thing under the title is the verdict. Chromium
    /// comes with `make test` (chromium-headless-shell).
    #[test]
    fn in_a_browser_the_page_opens_with_the_verdict() {
        let dir = std::env::temp_dir().join(format!("sluice-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let page = dir.join("report.html");
        let dns = DnsDemo { verdict: "DNS: NSD answered 99.78% of its clients' queries".into(), table: "phase".into() };
        std::fs::write(&page, html(&fixture(), &[], Some(&dns))).unwrap();
        let browser = ["chromium-headless-shell", "chromium", "chromium-browser"]
            .into_iter()
            .find(|b| std::process::Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()))
            .expect("no headless Chromium: `make test` installs chromium-headless-shell");
        let out = std::process::Command::new(browser)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
            .arg(format!("file://{}", page.display()))
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "{browser}: {}", String::from_utf8_lossy(&out.stderr));
        let dom = String::from_utf8_lossy(&out.stdout);
        let body = &dom[dom.find("<body").expect("a body")..];
        // The text, tag by tag: drop everything between < and >.
        let mut text = String::new();
        let mut in_tag = false;
        for ch in body.chars() {
            match ch {
                '<' => {
                    in_tag = true;
                    text.push('\n');
                }
                '>' => in_tag = false,
                c if !in_tag => text.push(c),
                _ => {}
            }
        }
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        assert_eq!(lines[0], "What a flood does to a service, with and without sluice", "{lines:?}");
        assert!(lines[1].starts_with("DNS: NSD answered 99.78%"), "the first paragraph is the verdict: {lines:?}");
        assert!(lines[2].starts_with("nic model: flooded at 10x"), "{lines:?}");
    }
}
