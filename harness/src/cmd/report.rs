//! `vramlab report RESULTS.csv`: a results CSV summarised for a reader. A header (file,
//! scenario, schema, points, rows, runtime; the last from the manifest beside the CSV), the
//! constants file beside it when there is one, and per point its largest peak allocated and
//! peak reserved over its phases, in bytes, with the phase that holds each and the point's
//! status. `--markdown` prints the GitHub Markdown the result pages under docs/src/results
//! embed between `<!-- generated: ... -->` markers (harness/tests/docs_generated.rs keeps
//! them current).
use crate::error::bad_file;
use crate::export::manifest::Manifest;
use crate::record::{Phase, Record};
use anyhow::Result;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the summary was printed; 1 a failure; 2 bad input: a missing, \
unreadable or malformed CSV or manifest (one line naming it)."
)]
pub struct Args {
    /// A results CSV from `vramlab sweep` or `vramlab merge`; its NAME.manifest.json and
    /// NAME.constants.toml are read when they are beside it.
    pub csv: PathBuf,
    /// Print GitHub Markdown tables with links (what the pages under docs/src/results embed)
    /// instead of aligned plain text.
    #[arg(long)]
    pub markdown: bool,
    /// With --markdown: write the links relative to this folder (the page's, e.g.
    /// docs/src/results) instead of the current one.
    #[arg(long, value_name = "DIR", requires = "markdown")]
    pub links_from: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let s = Summary::read(&a.csv)?;
    let text = if a.markdown {
        s.markdown(a.links_from.as_deref().unwrap_or(Path::new("")))
    } else {
        s.text()
    };
    print!("{text}");
    Ok(())
}

/// One point's largest peaks over its phases.
#[derive(Debug)]
struct PointPeaks {
    point_id: String,
    status: String,
    allocated: Option<(u64, String)>,
    reserved: Option<(u64, String)>,
}

/// What the report shows of one CSV.
#[derive(Debug)]
struct Summary {
    csv: PathBuf,
    manifest: Option<PathBuf>,
    constants: Option<PathBuf>,
    scenario: Option<PathBuf>,
    runtime: Option<String>,
    schema: String,
    rows: usize,
    points: Vec<PointPeaks>,
}

impl Summary {
    fn read(csv: &Path) -> Result<Self> {
        let records = crate::export::csv::read(csv)?;
        let mpath = Manifest::path_for(csv);
        let manifest = if mpath.is_file() {
            let text = std::fs::read_to_string(&mpath)
                .map_err(|e| bad_file(&mpath, format!("cannot read: {e}")))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| bad_file(&mpath, format!("not JSON: {e}")))?;
            Some((mpath, v))
        } else {
            None
        };
        let field = |k: &str| {
            manifest
                .as_ref()
                .and_then(|(_, v)| v.get(k)?.as_str().map(str::to_string))
                .filter(|s| !s.is_empty())
        };
        let cpath = csv.with_extension("constants.toml");
        let schemas: BTreeSet<u32> = records.iter().map(|r| r.schema_version).collect();
        Ok(Summary {
            csv: csv.to_path_buf(),
            scenario: field("scenario_path").map(PathBuf::from),
            runtime: field("runtime"),
            manifest: manifest.map(|(p, _)| p),
            constants: cpath.is_file().then_some(cpath),
            schema: schemas
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            rows: records.len(),
            points: per_point(&records),
        })
    }

    /// Aligned plain text.
    fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: scenario {}, schema {}, {} points, {} rows, runtime {}",
            self.csv.display(),
            self.scenario
                .as_ref()
                .map_or("-".into(), |p| p.display().to_string()),
            self.schema,
            self.points.len(),
            self.rows,
            self.runtime.as_deref().unwrap_or("-"),
        );
        if let Some(c) = &self.constants {
            let _ = writeln!(out, "constants: {}", c.display());
        }
        let rows: Vec<[String; 6]> = self.points.iter().map(PointPeaks::cells).collect();
        let head = HEADER.map(str::to_string);
        let width = |i: usize| {
            rows.iter()
                .chain([&head])
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        };
        let w: Vec<usize> = (0..6).map(width).collect();
        for r in std::iter::once(&head).chain(&rows) {
            let line = format!(
                "{:<w0$}  {:<w1$}  {:>w2$}  {:<w3$}  {:>w4$}  {}",
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                r[5],
                w0 = w[0],
                w1 = w[1],
                w2 = w[2],
                w3 = w[3],
                w4 = w[4],
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }

    /// GitHub Markdown, the links relative to the folder `from`.
    fn markdown(&self, from: &Path) -> String {
        let link = |text: &str, p: &Path| format!("[{text}]({})", relative(p, from));
        let name = |p: &Path| {
            p.file_name()
                .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
        };
        let mut file = link(&name(&self.csv), &self.csv);
        if let Some(m) = &self.manifest {
            let _ = write!(file, " ({})", link("manifest", m));
        }
        let scenario = self
            .scenario
            .as_ref()
            .map_or("-".into(), |p| link(&name(p), p));
        let mut out = String::from(
            "| file | scenario | schema | points | rows | runtime |\n\
             | --- | --- | --- | ---: | ---: | --- |\n",
        );
        let _ = writeln!(
            out,
            "| {file} | {scenario} | {} | {} | {} | {} |",
            self.schema,
            self.points.len(),
            self.rows,
            self.runtime.as_deref().unwrap_or("-"),
        );
        if let Some(c) = &self.constants {
            let _ = writeln!(out, "\nConstants: {}.", link(&name(c), c));
        }
        let _ = writeln!(
            out,
            "\nPer point, the largest peak over its phases (bytes) and the phase that holds it:\n\n\
             | {} |\n| --- | --- | ---: | --- | ---: | --- |",
            HEADER.join(" | ")
        );
        for p in &self.points {
            let mut c = p.cells();
            c[0] = format!("`{}`", c[0]);
            let _ = writeln!(out, "| {} |", c.join(" | "));
        }
        out
    }
}

const HEADER: [&str; 6] = [
    "point",
    "status",
    "peak allocated (B)",
    "phase",
    "peak reserved (B)",
    "phase",
];

impl PointPeaks {
    fn cells(&self) -> [String; 6] {
        let split = |v: &Option<(u64, String)>| match v {
            Some((b, ph)) => (b.to_string(), ph.clone()),
            None => ("-".into(), "-".into()),
        };
        let (a, ap) = split(&self.allocated);
        let (r, rp) = split(&self.reserved);
        [self.point_id.clone(), self.status.clone(), a, ap, r, rp]
    }
}

/// One entry per point, in the CSV's order: the largest `peak_allocated` and `peak_reserved`
/// over its rows, each with its phase (the first row holding it, so a part such as `prefill`
/// wins over the `total` envelope that repeats its peak), and its statuses.
fn per_point(records: &[Record]) -> Vec<PointPeaks> {
    let mut out: Vec<PointPeaks> = Vec::new();
    let mut statuses: Vec<BTreeSet<&'static str>> = Vec::new();
    for r in records {
        let i = match out.iter().position(|p| p.point_id == r.point_id) {
            Some(i) => i,
            None => {
                out.push(PointPeaks {
                    point_id: r.point_id.clone(),
                    status: String::new(),
                    allocated: None,
                    reserved: None,
                });
                statuses.push(BTreeSet::new());
                out.len() - 1
            }
        };
        if let Some(s) = r.status {
            statuses[i].insert(s.as_str());
        }
        let p = &mut out[i];
        let label = phase_label(r);
        for (slot, v) in [
            (&mut p.allocated, r.peak_allocated),
            (&mut p.reserved, r.peak_reserved),
        ] {
            if let Some(v) = v {
                if slot.as_ref().is_none_or(|(best, _)| v > *best) {
                    *slot = Some((v, label.clone()));
                }
            }
        }
    }
    for (p, s) in out.iter_mut().zip(statuses) {
        p.status = if s.is_empty() {
            "-".into()
        } else {
            s.into_iter().collect::<Vec<_>>().join("/")
        };
    }
    out
}

/// A row's phase, and for a generation `total` row the phase that holds its peak.
fn phase_label(r: &Record) -> String {
    match (r.phase, r.peak_phase) {
        (Some(Phase::Total), Some(pp)) => format!("total ({pp})"),
        (Some(ph), _) => ph.to_string(),
        (None, _) => "-".into(),
    }
}

/// `p` as a link target relative to the folder `from` (both relative to the current folder,
/// or absolute), with `/` separators.
fn relative(p: &Path, from: &Path) -> String {
    let abs = |q: &Path| {
        let q = if q.is_absolute() {
            q.to_path_buf()
        } else {
            std::env::current_dir().unwrap_or_default().join(q)
        };
        let mut parts: Vec<String> = Vec::new();
        for c in q.components() {
            match c {
                Component::ParentDir => {
                    parts.pop();
                }
                Component::Normal(n) => parts.push(n.to_string_lossy().into()),
                _ => {}
            }
        }
        parts
    };
    let (p, from) = (abs(p), abs(from));
    let common = p.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut out: Vec<String> = vec!["..".into(); from.len() - common];
    out.extend(p[common..].iter().cloned());
    out.join("/")
}

#[cfg(test)]
mod tests {
    use super::relative;
    use std::path::Path;

    #[test]
    fn links_are_relative_to_the_page_folder() {
        let r = relative(
            Path::new("results/cpu/a.csv"),
            Path::new("docs/src/results"),
        );
        assert_eq!(r, "../../../results/cpu/a.csv");
        assert_eq!(relative(Path::new("a/b.csv"), Path::new("")), "a/b.csv");
        assert_eq!(relative(Path::new("a/b.csv"), Path::new("a/./")), "b.csv");
    }
}
