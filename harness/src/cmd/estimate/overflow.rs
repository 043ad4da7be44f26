//! An estimate whose figures exceed 2^64 B, as bad input naming the flags that cause it.
use super::Args;
use crate::error::InputError;
use crate::estimate::Overflow;

/// A flag of the query that can make its figures exceed 64 bits, as the user gave it.
pub struct Size {
    flag: &'static str,
    value: String,
    /// Whether the flag is above its smallest value (or given at all).
    set: bool,
}

impl Size {
    pub fn of(flag: &'static str, value: impl std::fmt::Display, set: bool) -> Size {
        Size {
            flag,
            value: value.to_string(),
            set,
        }
    }
}

/// `--constants`' value, as given.
pub fn constants_flag(a: &Args) -> String {
    a.constants
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// An estimate whose figures exceed 2^64 B, as bad input (exit 2) on one line naming its
/// cause: the set `sizes` each of which, alone brought back to its smallest value (`fits` gets
/// which ones are), makes the estimate representable; else all the set ones, if together
/// they do; else the model.
pub fn overflow_error(
    o: Overflow,
    model: &str,
    sizes: &[Size],
    fits: impl Fn(&[bool]) -> bool,
) -> anyhow::Error {
    let only = |i: usize| -> Vec<bool> { (0..sizes.len()).map(|j| j == i).collect() };
    let set: Vec<bool> = sizes.iter().map(|s| s.set).collect();
    let mut named: Vec<&Size> = (0..sizes.len())
        .filter(|&i| sizes[i].set && fits(&only(i)))
        .map(|i| &sizes[i])
        .collect();
    if named.is_empty() && set.contains(&true) && fits(&set) {
        named = sizes.iter().filter(|s| s.set).collect();
    }
    let flags: Vec<String> = named
        .iter()
        .map(|s| format!("{} {}", s.flag, s.value))
        .collect();
    let flags = if flags.is_empty() {
        format!("--model {model}")
    } else {
        flags.join(" ")
    };
    InputError::arg(format!("{flags}: {o}")).into()
}
