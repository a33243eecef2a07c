//! The report as text tables, a before/after diff and a self-contained HTML page.
use std::{collections::BTreeSet, fmt::Write as _};

use super::IncidentReport;
use crate::correlate::ServiceId;

fn sparkline(vals: &[f64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = vals.iter().copied().fold(1.0_f64, f64::max);
    // Squash long series to 60 columns by taking the maximum of each bucket.
    let cols = vals.len().clamp(1, 60);
    (0..cols)
        .map(|c| {
            let lo = c * vals.len() / cols;
            let hi = ((c + 1) * vals.len() / cols).max(lo + 1);
            let v = vals
                .get(lo..hi.min(vals.len()))
                .unwrap_or_default()
                .iter()
                .copied()
                .fold(0.0, f64::max);
            let i = ((v / max) * 7.0).round().clamp(0.0, 7.0) as usize;
            BARS.get(i).copied().unwrap_or(' ')
        })
        .collect()
}

pub fn render_text(r: &IncidentReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Incident report for {}", r.dump.path);
    let _ = writeln!(
        s,
        "  node {}  kernel {}  agent {}  reason {}",
        r.dump.node.as_deref().unwrap_or("?"),
        r.dump.kernel.as_deref().unwrap_or("?"),
        r.dump.agent_version.as_deref().unwrap_or("?"),
        r.dump
            .reason
            .as_ref()
            .map_or_else(|| "?".into(), ToString::to_string)
    );
    let _ = writeln!(
        s,
        "  {} records ({} events), dump {}",
        r.dump.records, r.dump.events, r.dump.loss_text
    );
    let _ = writeln!(s, "  source: {}", r.source);
    if let Some(c) = &r.replay_check {
        let _ = writeln!(
            s,
            "  replay vs live: verdicts {} ({} / {}, and {} still pending at the dump's end), decisions {} ({} / {}), edge figures {}",
            if c.verdicts_equal { "equal" } else { "DIFFER" },
            c.replayed_verdicts.saturating_sub(c.judged_at_end),
            c.recorded_verdicts,
            c.judged_at_end,
            if c.decisions_equal { "equal" } else { "DIFFER" },
            c.replayed_decisions,
            c.recorded_decisions,
            if c.edge_snapshots_equal {
                "equal"
            } else {
                "DIFFER"
            },
        );
    }
    for n in &r.notes {
        let _ = writeln!(s, "  note: {n}");
    }
    let _ = writeln!(s, "\nTIMELINE");
    if r.timeline.is_empty() {
        let _ = writeln!(s, "  (nothing happened)");
    }
    for t in &r.timeline {
        let _ = writeln!(
            s,
            "  {:>9.3}s  {:<22} {}",
            t.t_s,
            t.kind.to_string(),
            t.detail
        );
    }
    let _ = writeln!(s, "\nOWNERS (services whose errors were their own)");
    let _ = writeln!(
        s,
        "  {:<24} {:>10} {:>10}",
        "service", "claimed", "unclaimed"
    );
    for o in &r.owners {
        let _ = writeln!(
            s,
            "  {:<24} {:>10} {:>10}",
            o.service.as_str(),
            o.claimed_errors,
            o.unclaimed_errors
        );
    }
    let _ = writeln!(
        s,
        "\nDECISIONS (what each rests on: ownership stops retries, budget capping meters them)"
    );
    if r.decisions.is_empty() {
        let _ = writeln!(s, "  (none)");
    }
    for d in &r.decisions {
        let lifted = d
            .lifted_s
            .map_or_else(|| "in force".to_string(), |t| format!("lifted {t:.3}s"));
        let effect = if d.retries_within_budget {
            "retries pass up to the budget"
        } else {
            "retries stop"
        };
        let _ = writeln!(
            s,
            "  #{:<4} {:>9.3}s  {:<28} {:<17} {:<14} {effect}, {lifted}",
            d.id,
            d.issued_s,
            d.edge,
            d.reason.as_str(),
            d.basis.map_or("(not recorded)", |b| b.as_str()),
        );
        if let Some(e) = &d.evidence {
            let _ = writeln!(s, "         {}", e.summary());
        }
    }
    let _ = writeln!(
        s,
        "\nEDGES (amplification = arrival rate / baseline, per evaluation)"
    );
    let _ = writeln!(
        s,
        "  {:<28} {:>8} {:>8} {:>7} {:>8} {:>6} {:>6}  amplification over time",
        "edge", "requests", "retries", "peak×", "at", "t/o", "nonid"
    );
    for e in &r.edges {
        let series: Vec<f64> = e.series.iter().map(|p| p.1).collect();
        let _ = writeln!(
            s,
            "  {:<28} {:>8} {:>8} {:>7.2} {:>7.1}s {:>6} {:>6}  {}",
            e.edge,
            e.requests,
            e.retries,
            e.peak_amplification,
            e.peak_at_s,
            e.timeout_mismatches,
            e.non_idempotent_retries,
            sparkline(&series)
        );
    }
    let _ = writeln!(s, "\nSUMMARY");
    let verdicts: Vec<String> = r
        .verdicts
        .iter()
        .map(|(claim, n)| format!("{claim} {n}"))
        .collect();
    let _ = writeln!(
        s,
        "  exchanges {}  failed {}  verdicts: {}",
        r.exchanges,
        r.failed_exchanges,
        verdicts.join(", ")
    );
    let links: Vec<String> = r
        .verdict_links
        .iter()
        .map(|(link, n)| format!("{link} {n}"))
        .collect();
    let _ = writeln!(s, "  verdicts linked by: {}", links.join(", "));
    let path: Vec<&str> = r.storm_path.iter().map(ServiceId::as_str).collect();
    let _ = writeln!(
        s,
        "  storm radius (max) {}  path {}",
        r.storm_radius_max,
        path.join(" → ")
    );
    let _ = writeln!(
        s,
        "  retries suppressed {}  requests they would have caused at the owner(s) {:.0}",
        r.retries_suppressed, r.counterfactual_requests
    );
    let _ = writeln!(
        s,
        "  timeout mismatches {}  non-idempotent retries {}",
        r.timeout_mismatches, r.non_idempotent_retries
    );
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A self-contained page: an SVG with per-edge amplification lines and timeline markers.
pub fn render_html(r: &IncidentReport) -> String {
    let (w, h, pad) = (1000.0, 360.0, 40.0);
    let t_max = r
        .edges
        .iter()
        .flat_map(|e| e.series.iter().map(|p| p.0))
        .chain(r.timeline.iter().map(|t| t.t_s))
        .fold(1.0_f64, f64::max);
    let a_max = r
        .edges
        .iter()
        .map(|e| e.peak_amplification)
        .fold(2.0_f64, f64::max);
    let x = |t: f64| pad + (t / t_max) * (w - 2.0 * pad);
    let y = |a: f64| h - pad - (a / a_max) * (h - 2.0 * pad);
    let colours = [
        "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    ];
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        svg,
        r##"<rect width="{w}" height="{h}" fill="#fff"/><line x1="{pad}" y1="{0}" x2="{1}" y2="{0}" stroke="#444"/><line x1="{pad}" y1="{pad}" x2="{pad}" y2="{0}" stroke="#444"/>"##,
        h - pad,
        w - pad
    );
    let _ = write!(
        svg,
        r##"<line x1="{pad}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#bbb" stroke-dasharray="4"/><text x="4" y="{0:.1}">1×</text><text x="4" y="{pad}">{a_max:.1}×</text><text x="{1}" y="{2}" text-anchor="end">{t_max:.1} s</text>"##,
        y(1.0),
        w - pad,
        h - pad + 14.0
    );
    for t in &r.timeline {
        let _ = write!(
            svg,
            r##"<line x1="{0:.1}" y1="{pad}" x2="{0:.1}" y2="{1}" stroke="#999"/><text x="{0:.1}" y="{2}" transform="rotate(-30 {0:.1} {2})">{3}</text>"##,
            x(t.t_s),
            h - pad,
            pad - 4.0,
            esc(&t.kind.to_string())
        );
    }
    for (i, e) in r.edges.iter().enumerate() {
        let c = colours.get(i % colours.len()).copied().unwrap_or("#000");
        let pts: Vec<String> = e
            .series
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{}"><title>{}</title></polyline>"#,
            pts.join(" "),
            esc(&e.edge)
        );
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" fill="{c}">{}</text>"#,
            w - pad - 200.0,
            pad + 14.0 * i as f64,
            esc(&e.edge)
        );
    }
    svg.push_str("</svg>");
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>retry-agent incident report</title></head>\
         <body style=\"font-family:sans-serif\"><h1>Incident report</h1>{svg}<pre>{}</pre></body></html>",
        esc(&render_text(r))
    )
}

pub fn render_diff(a: &IncidentReport, b: &IncidentReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:<34} {:>14} {:>14}", "", "A", "B");
    let row = |s: &mut String, k: &str, x: String, y: String| {
        let _ = writeln!(s, "{k:<34} {x:>14} {y:>14}");
    };
    row(
        &mut s,
        "exchanges",
        a.exchanges.to_string(),
        b.exchanges.to_string(),
    );
    row(
        &mut s,
        "failed exchanges",
        a.failed_exchanges.to_string(),
        b.failed_exchanges.to_string(),
    );
    row(
        &mut s,
        "storm radius (max)",
        a.storm_radius_max.to_string(),
        b.storm_radius_max.to_string(),
    );
    row(
        &mut s,
        "retries suppressed",
        a.retries_suppressed.to_string(),
        b.retries_suppressed.to_string(),
    );
    row(
        &mut s,
        "timeout mismatches",
        a.timeout_mismatches.to_string(),
        b.timeout_mismatches.to_string(),
    );
    row(
        &mut s,
        "non-idempotent retries",
        a.non_idempotent_retries.to_string(),
        b.non_idempotent_retries.to_string(),
    );
    let edges: BTreeSet<&str> = a
        .edges
        .iter()
        .chain(&b.edges)
        .map(|e| e.edge.as_str())
        .collect();
    for e in edges {
        let peak = |r: &IncidentReport| {
            r.edges
                .iter()
                .find(|x| x.edge == e)
                .map_or("-".into(), |x| format!("{:.2}×", x.peak_amplification))
        };
        row(&mut s, &format!("peak amplification {e}"), peak(a), peak(b));
    }
    let owners = |r: &IncidentReport| {
        r.owners
            .iter()
            .map(|o| o.service.as_str().to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    row(&mut s, "owners", owners(a), owners(b));
    s
}
