//! `vramlab env`: every `VRAMLAB_*` environment variable the project reads (the table in
//! `crate::environment`), who reads it, its default and what it does, and which are set in
//! this shell. `--markdown` prints the reference page's table
//! (docs/src/reference/environment.md embeds it; a test fails when it is stale).
use crate::environment::{markdown, VARS};
use anyhow::Result;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the table was printed; 1 a failure (writing to stdout); 2 bad \
                  input: an unknown flag."
)]
pub struct Args {
    #[command(flatten)]
    pub format: super::TableFormat,
}

pub fn run(a: Args) -> Result<()> {
    let value = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    if a.format.markdown {
        print!("{}", markdown());
        return Ok(());
    }
    if a.format.json {
        let rows: Vec<serde_json::Value> = VARS
            .iter()
            .map(|v| {
                let mut j = serde_json::to_value(v).expect("plain fields");
                j["value"] = value(v.name).into();
                j
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let width = VARS.iter().map(|v| v.name.len()).max().unwrap_or(0);
    for v in VARS {
        let readers: Vec<&str> = v.read_by.iter().map(|r| r.as_str()).collect();
        let now = match value(v.name) {
            Some(x) => format!(" [set: {x}]"),
            None => String::new(),
        };
        println!(
            "{:<width$}  {:<22} {}{now}",
            v.name,
            readers.join(", "),
            v.meaning
        );
        if !v.default.is_empty() {
            println!("{:<width$}  {:<22} default: {}", "", "", v.default);
        }
    }
    Ok(())
}
