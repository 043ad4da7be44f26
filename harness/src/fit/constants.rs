//! The constants file `vramlab fit` writes and `estimate --constants` reads ([`Constants`],
//! TOML): every fitted group ([`GroupFit`]) with its held-out error and the origin of the
//! measurements. Coefficients are keyed by term name ([`crate::terms::Term::name`]).
use super::groups::{GroupKey, Target};
use super::heldout::{ErrStats, Heldout};
use super::solve::Model;
use super::{generate, reserve};
use crate::vocab::Backend;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A fitted group, as the constants file stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupFit {
    #[serde(flatten)]
    pub key: GroupKey,
    pub target: Target,
    pub rows: usize,
    pub points: usize,
    pub r2: f64,
    pub conservative: bool,
    #[serde(flatten)]
    pub model: Model,
    pub kfold: Option<ErrStats>,
    pub loco: Option<ErrStats>,
}

/// The constants schema this build reads and writes (2: exact terms never fitted, held
/// terms, provenance; 3: each `[[reserve]]` table a per-class model with its held-out error,
/// not a ratio).
pub const CONSTANTS_SCHEMA: u32 = 3;

pub use crate::vocab::Runtime;

/// The constants file `fit` writes and `estimate --constants` reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Constants {
    pub schema: u32,
    pub vramlab_version: String,
    /// Where the constants came from: the runtime, backend and device that measured the rows,
    /// and the models measured.
    pub runtime: Runtime,
    pub backend: Backend,
    pub device: String,
    pub models: Vec<String>,
    /// Held-out error of the fit over all groups (k-fold by point, peak allocated).
    pub fit_error: Option<ErrStats>,
    pub terms: Vec<String>,
    pub sources: Vec<String>,
    pub group: Vec<GroupFit>,
    /// Generation groups (mode = "generate", [`generate`]); absent in files written before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generation: Vec<generate::GenGroupFit>,
    /// The caching allocator's reserve per class of run ([`reserve`]; torch on CUDA only);
    /// absent in files written before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserve: Vec<reserve::ReserveFit>,
}

/// Everything `fit` computes from a set of records.
pub struct FitReport {
    pub constants: Constants,
    /// Held-out predictions over all groups, per target: (k-fold, leave-one-context-out).
    pub heldout: BTreeMap<&'static str, (Vec<Heldout>, Vec<Heldout>)>,
    /// Per target, k-fold held-out predictions of training steps (`step_total` rows) as the
    /// envelope of their forward, backward and optimizer fits: how `estimate` predicts them.
    pub envelope: BTreeMap<&'static str, Vec<Heldout>>,
}

impl Constants {
    /// Reads a constants file written by `vramlab fit`. Every error names `path` on one line
    /// (with the line and key when TOML has them).
    pub fn load(path: &std::path::Path) -> anyhow::Result<Constants> {
        use crate::error::bad_file;
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
        Constants::parse(path, &text)
    }

    /// [`Constants::load`] on text already read; `path` is only used in messages.
    pub fn parse(path: &std::path::Path, text: &str) -> anyhow::Result<Constants> {
        use crate::error::bad_file;
        let schema = toml::from_str::<toml::Table>(text)
            .ok()
            .and_then(|t| t.get("schema").and_then(|v| v.as_integer()));
        if let Some(v) = schema.filter(|&v| v != CONSTANTS_SCHEMA as i64) {
            return Err(bad_file(
                path,
                format!(
                    "constants schema {v} is not the supported {CONSTANTS_SCHEMA} (refit with `vramlab fit`)"
                ),
            ));
        }
        let c: Constants = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().to_string();
            let at = match e.span() {
                Some(sp) => format!(
                    "line {}: ",
                    text[..sp.start.min(text.len())].matches('\n').count() + 1
                ),
                None => String::new(),
            };
            bad_file(path, format!("not a vramlab constants file: {at}{msg}"))
        })?;
        Ok(c)
    }

    /// Errors when the file has no group at all for `architecture` (constants fitted on
    /// another model family say nothing about this one).
    pub fn check_architecture(
        &self,
        path: &std::path::Path,
        architecture: &str,
    ) -> anyhow::Result<()> {
        if self.group.is_empty()
            || self
                .group
                .iter()
                .any(|g| g.key.architecture == architecture)
        {
            return Ok(());
        }
        let mut have: Vec<&str> = self
            .group
            .iter()
            .map(|g| g.key.architecture.as_str())
            .collect();
        have.sort();
        have.dedup();
        Err(crate::error::bad_file(
            path,
            format!(
                "constants fitted for {} cannot estimate a {architecture} model (refit on {architecture} CSVs, or drop --constants)",
                have.join(", ")
            ),
        ))
    }

    /// Whether these constants may answer a query for `runtime` on `backend`: Ok(None) when
    /// they match; a one-line error naming `path` when they do not (their uncertain terms
    /// describe another runtime or device); Ok(Some(warning)) with `allow_transfer`.
    pub fn check_query(
        &self,
        path: &std::path::Path,
        runtime: Runtime,
        backend: Backend,
        allow_transfer: bool,
    ) -> anyhow::Result<Option<String>> {
        if self.runtime == runtime && self.backend == backend {
            return Ok(None);
        }
        let what = format!(
            "constants measured with {} on {} ({}) answer a {} query on {}",
            self.runtime.as_str(),
            self.backend,
            self.device,
            runtime.as_str(),
            backend
        );
        if allow_transfer {
            return Ok(Some(format!(
                "{what} (--allow-transfer: their runtime constant, activations and logits may not hold there)"
            )));
        }
        Err(crate::error::bad_file(
            path,
            format!("{what}; refusing (pass --allow-transfer to use them anyway)"),
        ))
    }

    /// The group fitted for this key and target, if any.
    pub fn find(&self, key: &GroupKey, target: Target) -> Option<&GroupFit> {
        self.group
            .iter()
            .find(|g| &g.key == key && g.target == target)
    }
}
