//! The one vocabulary: every enum the scenario, the CSV, the fit, the estimate and the CLI
//! share. A leaf module (it uses no other module of the crate). Each enum reads and writes
//! one spelling everywhere: serde (scenario TOML, CSV, JSON), `Display`/`FromStr` (strum) and
//! `as_str`, so no string is ever parsed back into meaning by hand.
//!
//! The enums are grouped by domain, one file each, and re-exported here so every
//! `crate::vocab::X` path names them: `precision` (numeric formats), `training` (what a
//! training point updates and with what), `runtime` (the device, runtime, ops and meter),
//! `point` (what a point runs and what its rows record), `generation` (image pipelines),
//! and [`blank`] (serde for optional values in constants TOML).

/// A vocabulary enum: the shared derives (serde and strum with one spelling, `serialize_all`
/// = serde's `rename_all`), and `as_str`. Extra derives go in the attributes before it.
macro_rules! vocab {
    ($(#[$m:meta])* case = $case:literal; pub enum $name:ident { $($body:tt)* }) => {
        $(#[$m])*
        #[derive(
            Clone,
            Copy,
            Debug,
            PartialEq,
            Eq,
            Hash,
            PartialOrd,
            Ord,
            serde::Serialize,
            serde::Deserialize,
            strum::Display,
            strum::EnumString,
            strum::IntoStaticStr,
            strum::EnumIter,
        )]
        #[serde(rename_all = $case)]
        #[strum(serialize_all = $case)]
        pub enum $name { $($body)* }

        impl $name {
            /// The one spelling (serde, `Display`, `FromStr`).
            pub fn as_str(&self) -> &'static str {
                self.into()
            }
        }
    };
}

/// serde through text for a type with `Display` and `FromStr<Err = String>`: the
/// `TryFrom<String>`/`Into<String>` pair that `#[serde(try_from = "String", into = "String")]`
/// needs.
macro_rules! serde_as_text {
    ($t:ty) => {
        impl TryFrom<String> for $t {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                s.parse()
            }
        }

        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.to_string()
            }
        }
    };
}
pub(crate) use serde_as_text;

pub mod blank;
mod generation;
mod point;
mod precision;
mod runtime;
mod training;

pub use generation::{Component, GenModel, Resolution, VaeDecode};
pub use point::{KvKind, KvWindow, Mode, Phase, Status};
pub use precision::{Compute, Precision, QMatmul, Quantized};
pub use runtime::{
    Attention, Backend, Kernels, KvCacheDtype, MeterKind, Ops, PoolRelease, Runtime, Stack,
};
pub use training::{
    Checkpointing, LoraTarget, LoraTargets, Optimizer, OptimizerImpl, Trainable, TrainableKind,
    MAX_LORA_RANK,
};

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use std::str::FromStr;

    /// serde's spelling (what the CSV and the scenario read) is `Display`'s and `FromStr`'s.
    fn same<T>(values: &[T])
    where
        T: Serialize + std::fmt::Display + FromStr + PartialEq + std::fmt::Debug,
        <T as FromStr>::Err: std::fmt::Debug,
    {
        for v in values {
            let json = serde_json::to_value(v).unwrap();
            assert_eq!(json.as_str().unwrap(), v.to_string(), "{v:?}");
            assert_eq!(&T::from_str(&v.to_string()).unwrap(), v);
        }
    }

    fn all<T: strum::IntoEnumIterator>() -> Vec<T> {
        T::iter().collect()
    }

    #[test]
    fn one_spelling_everywhere() {
        same(&all::<Backend>());
        same(&all::<Mode>());
        same(&all::<Precision>());
        same(&all::<Optimizer>());
        same(&all::<OptimizerImpl>());
        same(&all::<Kernels>());
        same(&all::<Attention>());
        same(&all::<Checkpointing>());
        same(&all::<TrainableKind>());
        same(&all::<Compute>());
        same(&all::<QMatmul>());
        assert_eq!(Precision::Q4_0.as_str(), "q4_0");
        assert_eq!(Precision::Q4k.as_str(), "q4k");
        same(&[
            Trainable::Full,
            Trainable::FrozenEmbeddings,
            Trainable::Lora(8),
            Trainable::Qlora(64),
        ]);
        assert_eq!(Optimizer::Adamw8bit.as_str(), "adamw-8bit");
        assert_eq!(Optimizer::PagedAdamw.as_str(), "paged-adamw");
        assert_eq!(Optimizer::PagedAdamw8bit.as_str(), "paged-adamw-8bit");
        assert!("qlora-r0".parse::<Trainable>().is_err());
        same(&all::<KvKind>());
        same(&all::<KvWindow>());
        same(&all::<PoolRelease>());
        same(&all::<MeterKind>());
        same(&all::<Runtime>());
        same(&all::<Phase>());
        same(&all::<Status>());
        assert_eq!(Phase::StepTotal.as_str(), "step_total");
        assert_eq!(Optimizer::AdamwFused.as_str(), "adamw-fused");
        assert_eq!(Optimizer::AdamwForLoop.as_str(), "adamw-for-loop");
        assert_eq!(Optimizer::None.as_str(), "none");
        assert!("lora-r0".parse::<Trainable>().is_err());
    }
}
