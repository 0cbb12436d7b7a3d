//! The fate chart: where the applied packets of each level went, as shares
//! of applied, stacked: delivered to the service, refused at the veth ring,
//! dropped by the gate (or nftables), dropped by the kernel after the gate
//! (the tracer's counts by stage: the per-CPU backlog, the socket, any other
//! stage), and unaccounted. Built from the tracer's drop counter (the same
//! counts `sluice trace` and `sluice status` show); a run without it falls
//! back to /proc's backlog and socket counters.
use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use crate::scenarios::level::{Ledger, LevelResult};
use crate::scenarios::scenario::ConfigKind;
use crate::scenarios::sweep::ModelRun;

/// The parts, bottom to top, and their colours.
pub const PARTS: [(&str, RGBColor); 8] = [
    ("delivered", RGBColor(40, 160, 70)),
    ("ring", RGBColor(170, 170, 170)),
    ("gate", RGBColor(40, 90, 200)),
    ("nft", RGBColor(230, 150, 0)),
    ("backlog", RGBColor(140, 60, 170)),
    ("socket", RGBColor(210, 50, 50)),
    ("other kernel", RGBColor(130, 80, 30)),
    ("unaccounted", RGBColor(20, 20, 20)),
];

/// A window's packets split into PARTS (counts; unaccounted never below 0).
pub fn parts(l: &Ledger) -> [f64; 8] {
    let (backlog, socket, other, unaccounted) = match l.traced_unaccounted {
        Some(u) => {
            let kernel: u64 = l.kernel_drops.iter().map(|d| d.packets).sum();
            let (b, s) = (l.kernel_at("backlog"), l.kernel_at("socket"));
            (b, s, kernel - b - s, u)
        }
        None => (l.backlog_drops, l.socket_drops, 0, l.unaccounted),
    };
    [
        l.delivered as f64,
        l.ring_drops as f64,
        l.xdp_drops as f64,
        l.nft_drops as f64,
        backlog as f64,
        socket as f64,
        other as f64,
        unaccounted.max(0) as f64,
    ]
}

/// Per level of one configuration: (multiple, shares of applied summed over repeats).
pub fn shares(results: &[LevelResult], config: ConfigKind) -> Vec<(f64, [f64; 8])> {
    let mut multiples: Vec<f64> = results.iter().filter(|r| r.config == config).map(|r| r.multiple).collect();
    multiples.sort_by(f64::total_cmp);
    multiples.dedup();
    multiples
        .into_iter()
        .map(|m| {
            let mut sum = [0.0; 8];
            let mut applied = 0.0;
            for r in results.iter().filter(|r| r.config == config && r.multiple == m) {
                for (a, b) in sum.iter_mut().zip(parts(&r.ledger)) {
                    *a += b;
                }
                applied += r.ledger.applied as f64;
            }
            (m, sum.map(|x| if applied > 0.0 { x / applied } else { 0.0 }))
        })
        .collect()
}

/// `{model}-fate-{config}.svg/.png` for each configuration; returns the SVG names.
pub fn figures(m: &ModelRun, dir: &Path) -> Result<Vec<String>> {
    let mut configs: Vec<ConfigKind> = m.results.iter().map(|r| r.config).collect();
    configs.sort_by_key(|c| c.name());
    configs.dedup();
    let mut names = Vec::new();
    for c in configs {
        let rows = shares(&m.results, c);
        let stem = format!("{}-fate-{}", m.model.name(), c.name());
        let title = format!("where the applied packets went: {} ({} model)", c.name(), m.model.name());
        names.push(crate::report::plot::svg_and_png!(dir, stem, (760, 460), |root| draw(root, &title, &rows)));
    }
    Ok(names)
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    rows: &[(f64, [f64; 8])],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e| anyhow::anyhow!("{e:?}");
    root.fill(&WHITE).map_err(e)?;
    // The legend gets its own column, so it never covers a bar.
    let (plot, legend) = root.split_horizontally(600);
    let n = rows.len().max(1);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..100.0)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            let at_bar = (x - i).abs() < 1e-6 && i >= 0.0;
            rows.get(i as usize).filter(|_| at_bar).map_or(String::new(), |r| format!("{}x", r.0))
        })
        .x_desc("load level (multiple of the calibrated peak)")
        .y_desc("share of applied packets (%)")
        .draw()
        .map_err(e)?;
    for (i, (_, shares)) in rows.iter().enumerate() {
        let mut bottom = 0.0;
        for (share, (_, colour)) in shares.iter().zip(PARTS) {
            let top = bottom + share * 100.0;
            let bar = Rectangle::new([(i as f64 - 0.35, bottom), (i as f64 + 0.35, top)], colour.filled());
            chart.draw_series(std::iter::once(bar)).map_err(e)?;
            bottom = top;
        }
    }
    for (k, (name, colour)) in PARTS.iter().enumerate() {
        let y = 60 + 24 * k as i32;
        legend.draw(&Rectangle::new([(10, y), (26, y + 14)], colour.filled())).map_err(e)?;
        legend.draw(&Text::new(name.to_string(), (32, y), ("sans-serif", 14))).map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice::surface::trace::fate::Drop;

    #[test]
    fn the_parts_add_up_to_applied_and_use_the_tracer_when_there() {
        let mut l = Ledger { applied: 1000, ring_drops: 100, xdp_drops: 300, delivered: 500, ..Ledger::default() };
        l.backlog_drops = 40; // /proc's figure, used only without the tracer
        l.unaccounted = 60;
        assert_eq!(parts(&l).iter().sum::<f64>(), 1000.0);
        assert_eq!(parts(&l)[4], 40.0);
        l.kernel_drops = vec![
            Drop { stage: "socket".into(), reason: "SOCKET_RCVBUFF".into(), packets: 70 },
            Drop { stage: "transport".into(), reason: "NO_SOCKET".into(), packets: 20 },
        ];
        l.traced_unaccounted = Some(10);
        let p = parts(&l);
        assert_eq!((p[4], p[5], p[6], p[7]), (0.0, 70.0, 20.0, 10.0));
        assert_eq!(p.iter().sum::<f64>(), 1000.0);
    }
}
