//! The CSV exporter: header once, then each record appended, flushed and synced as it comes.
use super::Exporter;
use crate::error::bad_file;
use crate::record::{Record, OLDEST_SCHEMA_VERSION, SCHEMA_VERSION};
use anyhow::{Context, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

pub struct CsvExporter {
    path: PathBuf,
    w: csv::Writer<File>,
}

impl CsvExporter {
    /// Creates (truncates) `path` and writes the header.
    pub fn create(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = csv::WriterBuilder::new().has_headers(false).from_writer(f);
        w.write_record(crate::record::columns())?;
        w.flush()?;
        Ok(CsvExporter {
            path: path.to_path_buf(),
            w,
        })
    }
}

impl CsvExporter {
    /// Opens an existing vramlab CSV to append rows (no header).
    pub fn append(path: &Path) -> Result<Self> {
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("opening {} to append", path.display()))?;
        let w = csv::WriterBuilder::new().has_headers(false).from_writer(f);
        Ok(CsvExporter {
            path: path.to_path_buf(),
            w,
        })
    }
}

impl Exporter for CsvExporter {
    fn write(&mut self, r: &Record) -> Result<()> {
        self.w
            .serialize(r)
            .with_context(|| format!("writing {}", self.path.display()))?;
        self.w.flush()?;
        self.w.get_ref().sync_data()?;
        Ok(())
    }
}

/// Reads a vramlab CSV back into records, checking the schema version.
pub fn read(path: &Path) -> Result<Vec<Record>> {
    let f = File::open(path).map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
    read_from(path, std::io::BufReader::new(f))
}

/// [`read`] on any reader; `path` is only used in error messages. Every error is an
/// [`crate::error::InputError`] naming `path` and the row.
pub fn read_from<R: std::io::Read>(path: &Path, r: R) -> Result<Vec<Record>> {
    Ok(read_table_from(path, r)?.records)
}

/// A vramlab CSV as read: its header and its rows.
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub columns: Vec<String>,
    pub records: Vec<Record>,
}

/// Reads a vramlab CSV with its header. Any schema version up to [`SCHEMA_VERSION`] is read
/// (columns a version lacks are empty); columns this version does not know are ignored.
pub fn read_table(path: &Path) -> Result<Table> {
    let f = File::open(path).map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
    read_table_from(path, std::io::BufReader::new(f))
}

/// [`read_table`] on any reader; `path` is only used in error messages.
pub fn read_table_from<R: std::io::Read>(path: &Path, r: R) -> Result<Table> {
    let mut rd = csv::Reader::from_reader(r);
    let headers = rd
        .headers()
        .map_err(|e| bad_file(path, format!("cannot read the header row: {e}")))?
        .clone();
    if headers.get(0) != Some("schema_version") {
        return Err(bad_file(
            path,
            "not a vramlab CSV: the first column must be `schema_version`",
        ));
    }
    // A row needs every column of its own schema version; columns added later read as empty.
    let missing = |version: u32| {
        crate::record::columns_of(version)
            .into_iter()
            .find(|c| !headers.iter().any(|h| h == c))
    };
    let mut out = Vec::new();
    for (i, row) in rd.records().enumerate() {
        let line = i + 2;
        let row = row.map_err(|e| bad_file(path, format!("row {line}: {e}")))?;
        // Check the version before the rest, so a CSV of another schema says so rather than
        // failing on whichever column changed.
        if let Some(v) = row.get(0) {
            let known = OLDEST_SCHEMA_VERSION..=SCHEMA_VERSION;
            if !v.trim().parse::<u32>().is_ok_and(|v| known.contains(&v)) {
                return Err(bad_file(
                    path,
                    format!(
                        "row {line}: schema_version `{v}` is not one of the supported {OLDEST_SCHEMA_VERSION}..={SCHEMA_VERSION}"
                    ),
                ));
            }
            if let Some(c) = v.trim().parse::<u32>().ok().and_then(missing) {
                return Err(bad_file(path, format!("row {line}: missing field `{c}`")));
            }
        }
        let mut r: Record = row.deserialize(Some(&headers)).map_err(|e| {
            bad_file(
                path,
                format!("row {line}: {}", describe(&e, &headers, &row)),
            )
        })?;
        r.upgrade();
        out.push(r);
    }
    Ok(Table {
        columns: headers.iter().map(str::to_string).collect(),
        records: out,
    })
}

/// A deserialization error with the column name instead of csv's field index.
fn describe(e: &csv::Error, headers: &csv::StringRecord, row: &csv::StringRecord) -> String {
    if let csv::ErrorKind::Deserialize { err, .. } = e.kind() {
        if let Some(i) = err.field() {
            let col = headers.get(i as usize).unwrap_or("?");
            let val: String = row.get(i as usize).unwrap_or("").chars().take(40).collect();
            return format!("column `{col}` = `{val}`: {}", err.kind());
        }
        return err.kind().to_string();
    }
    e.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_1_rows_read_as_eager_attention() {
        // A version-1 file: no `attention` column.
        let cols: Vec<String> = crate::record::columns()
            .into_iter()
            .filter(|c| c != "attention")
            .collect();
        let mut row = vec![String::new(); cols.len()];
        row[0] = "1".into();
        row[cols.iter().position(|c| c == "param_count").unwrap()] = "5".into();
        row[cols.iter().position(|c| c == "batch").unwrap()] = "1".into();
        row[cols.iter().position(|c| c == "context").unwrap()] = "8".into();
        for (c, v) in [
            ("backend", "cpu"),
            ("mode", "infer"),
            ("precision", "f32"),
            ("kv_cache", "growing"),
            ("optimizer", "none"),
            ("kernels", "reference"),
            ("meter", "cpu-alloc"),
        ] {
            row[cols.iter().position(|n| n == c).unwrap()] = v.into();
        }
        let text = format!("{}\n{}\n", cols.join(","), row.join(","));
        let r = read_from(Path::new("v1.csv"), text.as_bytes()).unwrap();
        assert_eq!(r[0].schema_version, 1);
        assert_eq!(r[0].attention, crate::vocab::Attention::Eager);
        // An inference row before version 3 kept every token.
        assert_eq!(r[0].kv_window, Some(crate::vocab::KvWindow::Full));
    }

    #[test]
    fn reader_errors_name_row_and_column() {
        let p = Path::new("r.csv");
        let cols = crate::record::columns().join(",");
        let mut w = csv::Writer::from_writer(Vec::new());
        w.serialize(Record {
            schema_version: SCHEMA_VERSION,
            ..Default::default()
        })
        .unwrap();
        let good = String::from_utf8(w.into_inner().unwrap()).unwrap();
        assert_eq!(read_from(p, good.as_bytes()).unwrap().len(), 1);
        let row: Vec<&str> = good.lines().nth(1).unwrap().split(',').collect();
        let with = |i: usize, v: &str| {
            let mut r = row.clone();
            r[i] = v;
            format!("{cols}\n{}\n", r.join(","))
        };
        let e = read_from(p, with(0, "7").as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 2: schema_version `7`"), "{e}");
        let e = read_from(p, with(13, "x").as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 2: column `param_count` = `x`"), "{e}");
        let e = read_from(p, &b""[..]).unwrap_err().to_string();
        assert!(e.contains("not a vramlab CSV"), "{e}");
    }
}
