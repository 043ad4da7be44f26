//! One file per subcommand (`estimate`, the largest, is a folder of its own).
pub mod bundle;
pub mod compare;
pub mod decode;
pub mod emulate;
pub mod env;
pub mod estimate;
pub mod features;
pub mod fit;
pub mod gpus;
pub mod merge;
pub mod plot;
pub mod report;
pub mod schema;
pub mod sweep;
pub mod synth_weights;
pub mod validate;

/// How a reference table prints (`vramlab gpus`, `vramlab env`, `vramlab schema`): aligned text
/// by default.
#[derive(Debug, clap::Args)]
pub struct TableFormat {
    /// Print a GitHub Markdown table (what the reference page embeds).
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Print JSON with integer bytes (and, for `env`, each variable's value here).
    #[arg(long)]
    pub json: bool,
}
