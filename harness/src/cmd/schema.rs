//! `vramlab schema`: the CSV schema every writer of a vramlab CSV follows, from the one
//! definition (`crate::record::Record`): the schema version, the oldest version readers accept,
//! and each column in order with the version that added it. `--json` is what the torch probe
//! reads (harness/python/vramlab/probe/schema.json is this output; a test fails when it is stale), so the
//! Python writer has no column list of its own.
use crate::record::{self, OLDEST_SCHEMA_VERSION, SCHEMA_VERSION};
use anyhow::Result;
use serde::Serialize;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the schema was printed; 1 a failure (writing to stdout); 2 bad \
                  input: an unknown flag."
)]
pub struct Args {
    #[command(flatten)]
    pub format: super::TableFormat,
}

/// One column as `--json` prints it.
#[derive(Serialize)]
struct ColumnJson {
    name: String,
    /// The schema version that added the column.
    since: u32,
}

/// The whole schema as `--json` prints it.
#[derive(Serialize)]
struct SchemaJson {
    schema_version: u32,
    oldest_schema_version: u32,
    columns: Vec<ColumnJson>,
}

fn schema() -> SchemaJson {
    SchemaJson {
        schema_version: SCHEMA_VERSION,
        oldest_schema_version: OLDEST_SCHEMA_VERSION,
        columns: record::columns()
            .into_iter()
            .map(|name| ColumnJson {
                since: record::added_in(&name),
                name,
            })
            .collect(),
    }
}

pub fn run(a: Args) -> Result<()> {
    let s = schema();
    if a.format.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    if a.format.markdown {
        println!("| # | column | since version |");
        println!("| ---: | --- | ---: |");
        for (i, c) in s.columns.iter().enumerate() {
            println!("| {} | `{}` | {} |", i + 1, c.name, c.since);
        }
        return Ok(());
    }
    println!(
        "CSV schema version {} ({} columns; readers accept versions {}..={}):",
        s.schema_version,
        s.columns.len(),
        s.oldest_schema_version,
        s.schema_version
    );
    let width = s.columns.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for (i, c) in s.columns.iter().enumerate() {
        println!("{:>3}  {:<width$}  since {}", i + 1, c.name, c.since);
    }
    Ok(())
}
