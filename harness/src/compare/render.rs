//! The comparison report as a text table or Markdown.
use super::verdict::{Change, Report, Verdict};
use crate::units::{gb, gib, signed_gb, signed_gib, signed_pct};

fn verdict_word(v: Verdict, cross: bool) -> &'static str {
    match v {
        Verdict::Regression => "REGRESSION",
        Verdict::Improvement => "improvement",
        Verdict::Within => "within margin",
        Verdict::Ungated if cross => "",
        Verdict::Ungated => "not gated",
    }
}

fn cells(c: &Change, cross: bool) -> Vec<String> {
    let step = c.step.map(|s| s.to_string()).unwrap_or_default();
    let phase = c.phase.map(|p| p.to_string()).unwrap_or_default();
    let phase = match c.component {
        Some(comp) => format!("{phase} {comp}"),
        None => phase,
    };
    let margin = c
        .allowed
        .map(|a| {
            if a == 0 {
                "exact".to_string()
            } else {
                format!("±{}", crate::units::human(a))
            }
        })
        .unwrap_or_else(|| "-".into());
    vec![
        c.point_id.clone(),
        phase,
        step,
        c.metric.name().to_string(),
        gb(c.baseline),
        gib(c.baseline),
        gb(c.new),
        gib(c.new),
        signed_gb(c.delta),
        signed_gib(c.delta),
        signed_pct(c.pct),
        margin,
        verdict_word(c.verdict, cross).to_string(),
    ]
}

/// The report as a text table or Markdown.
pub fn render(rep: &Report, title: &str, top: usize, markdown: bool, cross: bool) -> String {
    let (old, new) = if cross {
        ("A", "B")
    } else {
        ("baseline", "new")
    };
    let header: Vec<String> = [
        "point",
        "phase",
        "step",
        "metric",
        &format!("{old} GB"),
        &format!("{old} GiB"),
        &format!("{new} GB"),
        &format!("{new} GiB"),
        "change GB",
        "change GiB",
        "change %",
        "margin",
        "verdict",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = rep
        .changes
        .iter()
        .take(top)
        .map(|c| cells(c, cross))
        .collect();
    let mut s = String::new();
    let summary = format!(
        "{} joined rows: {} regression(s), {} improvement(s) beyond margin, {} changed value(s) in all; {} point(s) only in the {old}, {} only in the {new}",
        rep.joined_rows,
        rep.regressions,
        rep.improvements,
        rep.changes.len(),
        rep.only_in_baseline.len(),
        rep.only_in_new.len()
    );
    if markdown {
        s += &format!("### vramlab compare: {title}\n\n{summary}\n\n");
        if !rows.is_empty() {
            s += &format!("| {} |\n", header.join(" | "));
            s += &format!("|{}\n", "---|".repeat(header.len()));
            for r in &rows {
                s += &format!("| {} |\n", r.join(" | "));
            }
        }
    } else {
        s += &format!("compare {title}\n{summary}\n");
        if !rows.is_empty() {
            let widths: Vec<usize> = (0..header.len())
                .map(|i| {
                    rows.iter()
                        .map(|r| r[i].chars().count())
                        .chain([header[i].chars().count()])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let line = |r: &[String]| {
                let mut l = String::new();
                for (i, c) in r.iter().enumerate() {
                    let w = widths[i];
                    if i < 4 || i + 1 == r.len() {
                        l += &format!("{c:<w$}  ");
                    } else {
                        l += &format!("{c:>w$}  ");
                    }
                }
                l.trim_end().to_string() + "\n"
            };
            s += &line(&header);
            for r in &rows {
                s += &line(r);
            }
        }
    }
    if rep.changes.len() > top {
        s += &format!(
            "({} more changed values; --top or --json shows them)\n",
            rep.changes.len() - top
        );
    }
    let bullet = if markdown { "- " } else { "  " };
    for c in &rep.status_changes {
        s += &format!(
            "{bullet}status {} phase {:?} step {:?}: {:?} → {:?} ({})\n",
            c.point_id,
            c.phase,
            c.step,
            c.baseline,
            c.new,
            verdict_word(c.verdict, cross)
        );
    }
    for (side, list) in [(old, &rep.only_in_baseline), (new, &rep.only_in_new)] {
        for p in list {
            s += &format!(
                "{bullet}only in the {side}: {} ({} rows)\n",
                p.point_id, p.rows
            );
        }
    }
    s
}
