//! The comparison report as a text table or Markdown.
use super::by_phase::by_phase;
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
    let left: Vec<usize> = vec![0, 1, 2, 3, header.len() - 1];
    let mut s = heading(rep, title, markdown, (old, new));
    s += &table(&header, &rows, &left, markdown);
    if rep.changes.len() > top {
        s += &format!(
            "({} more changed values; --top or --json shows them)\n",
            rep.changes.len() - top
        );
    }
    s + &footer(rep, markdown, cross, (old, new))
}

/// The report summed up per (phase, metric) ([`by_phase`]) instead of one row per change.
pub fn render_by_phase(rep: &Report, title: &str, markdown: bool, cross: bool) -> String {
    let sides = if cross {
        ("A", "B")
    } else {
        ("baseline", "new")
    };
    let header: Vec<String> = [
        "phase",
        "metric",
        "changed",
        "beyond margin (up/down)",
        "median change %",
        "largest change GB",
        "largest change GiB",
        "largest change %",
        "largest at (point, step)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = by_phase(rep)
        .iter()
        .map(|p| {
            let l = &p.largest;
            let at = match l.step {
                Some(step) => format!("{} step {step}", l.point_id),
                None => l.point_id.clone(),
            };
            vec![
                p.phase.map(|x| x.to_string()).unwrap_or_default(),
                p.metric.name().to_string(),
                p.changed.to_string(),
                format!("{}/{}", p.regressions, p.improvements),
                signed_pct(p.median_pct),
                signed_gb(l.delta),
                signed_gib(l.delta),
                signed_pct(l.pct),
                at,
            ]
        })
        .collect();
    let mut s = heading(rep, title, markdown, sides);
    s += &table(&header, &rows, &[0, 1, 8], markdown);
    s + &footer(rep, markdown, cross, sides)
}

/// The title and the counts line.
fn heading(rep: &Report, title: &str, markdown: bool, (old, new): (&str, &str)) -> String {
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
        format!("### vramlab compare: {title}\n\n{summary}\n\n")
    } else {
        format!("compare {title}\n{summary}\n")
    }
}

/// `rows` under `header` as a Markdown table, or as text with the `left` columns left-aligned
/// and the others right-aligned. Nothing when there are no rows.
fn table(header: &[String], rows: &[Vec<String>], left: &[usize], markdown: bool) -> String {
    let mut s = String::new();
    if rows.is_empty() {
        return s;
    }
    if markdown {
        s += &format!("| {} |\n", header.join(" | "));
        s += &format!("|{}\n", "---|".repeat(header.len()));
        for r in rows {
            s += &format!("| {} |\n", r.join(" | "));
        }
        return s;
    }
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
            if left.contains(&i) {
                l += &format!("{c:<w$}  ");
            } else {
                l += &format!("{c:>w$}  ");
            }
        }
        l.trim_end().to_string() + "\n"
    };
    s += &line(header);
    for r in rows {
        s += &line(r);
    }
    s
}

/// The status changes and the points present on one side only.
fn footer(rep: &Report, markdown: bool, cross: bool, (old, new): (&str, &str)) -> String {
    let mut s = String::new();
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
