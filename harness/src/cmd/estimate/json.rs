//! The `--json` rendering of a [`Report`].
use super::report::Report;

/// `r` as pretty-printed JSON (without a trailing newline). An LLM report keeps its fields'
/// order; a generation report goes through a [`serde_json::Value`], whose objects sort their
/// keys, the order its JSON has always had.
pub fn render_json(r: &Report) -> serde_json::Result<String> {
    match r {
        Report::Llm(r) => serde_json::to_string_pretty(r),
        Report::Generation(r) => serde_json::to_string_pretty(&serde_json::to_value(r)?),
        Report::Serving(r) => serde_json::to_string_pretty(r),
    }
}
