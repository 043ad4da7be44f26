//! Exporters: where records go. One trait, one file per format.
pub mod csv;
pub mod hash_cache;
pub mod manifest;

use crate::record::Record;
use anyhow::Result;

pub trait Exporter {
    /// Writes one record and makes it durable before returning.
    fn write(&mut self, r: &Record) -> Result<()>;
}
