//! One file per subcommand.
pub mod generate;
pub mod summary;
pub mod sweep;
pub mod synth_weights;
