//! The CSV exporter: header once, then each record appended, flushed and synced as it comes.
use super::Exporter;
use crate::error::bad_file;
use crate::record::{Record, SCHEMA_VERSION};
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
    let mut rd =
        csv::Reader::from_path(path).map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
    let mut out = Vec::new();
    for (i, row) in rd.deserialize::<Record>().enumerate() {
        let r = row.map_err(|e| bad_file(path, format!("row {}: {e}", i + 2)))?;
        if r.schema_version != SCHEMA_VERSION {
            return Err(bad_file(
                path,
                format!(
                    "row {}: schema_version {} is not the supported {SCHEMA_VERSION}",
                    i + 2,
                    r.schema_version
                ),
            ));
        }
        out.push(r);
    }
    Ok(out)
}
