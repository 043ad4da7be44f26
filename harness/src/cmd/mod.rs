//! One file per subcommand.
pub mod estimate;
pub mod fit;
pub mod generate;
pub mod summary;
pub mod sweep;
pub mod synth_weights;
