//! serde for an `Option` of a vocabulary value where no null exists (constants TOML): `None`
//! is written and read as the empty string, a value as its one spelling.
use serde::{de::Error, Deserialize, Deserializer, Serializer};
use std::fmt::Display;
use std::str::FromStr;

pub fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_str(""),
    }
}

pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
where
    T: FromStr,
    T::Err: Display,
    D: Deserializer<'de>,
{
    let text = String::deserialize(d)?;
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|e| D::Error::custom(format!("`{text}`: {e}")))
}
