//! One file per subcommand (`estimate`, the largest, is a folder of its own).
pub mod bundle;
pub mod compare;
pub mod decode;
pub mod emulate;
pub mod env;
pub mod estimate;
pub mod fit;
pub mod gpus;
pub mod merge;
pub mod plot;
pub mod report;
pub mod sweep;
pub mod synth_weights;
pub mod validate;
