//! vramlab: measure the memory a model needs, per phase, on real weights.
//! See ARCHITECTURE.md §2 for the data flow:
//! scenario → grid → sweep (runner: workload × meter) → records → exporter → CSV.
pub mod bundle;
pub mod checked;
pub mod cli;
pub mod cmd;
pub mod compare;
pub mod device;
pub mod emulate;
pub mod environment;
pub mod error;
pub mod estimate;
pub mod export;
pub mod features;
pub mod fit;
pub mod gpu;
pub mod merge;
pub mod meter;
pub mod model;
pub mod plot;
pub mod progress;
pub mod record;
pub mod scenario;
pub mod sweep;
pub mod terms;
pub mod units;
pub mod validate;
pub mod vocab;
pub mod workload;

/// Every heap allocation of a process linking vramlab is counted (CPU meter, ARCHITECTURE.md §3).
#[global_allocator]
static ALLOC: meter::alloc::CountingAlloc = meter::alloc::CountingAlloc;
