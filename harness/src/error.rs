//! Error kinds the CLI distinguishes. Bad input (a file the user gave us that we cannot use)
//! exits with code 2 and one line naming the file and the problem; everything else exits 1.
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A problem with a file: the path, then what is wrong (with line and key when known).
    #[error("{}: {msg}", path.display())]
    File { path: PathBuf, msg: String },
    /// A problem with a command-line value.
    #[error("{0}")]
    Arg(String),
}

impl InputError {
    pub fn file(path: impl AsRef<Path>, msg: impl std::fmt::Display) -> Self {
        InputError::File {
            path: path.as_ref().to_path_buf(),
            msg: msg.to_string(),
        }
    }
    pub fn arg(msg: impl std::fmt::Display) -> Self {
        InputError::Arg(msg.to_string())
    }
}

/// Shorthand: an `anyhow::Error` carrying an [`InputError::File`].
pub fn bad_file(path: impl AsRef<Path>, msg: impl std::fmt::Display) -> anyhow::Error {
    InputError::file(path, msg).into()
}

/// A run that measured nothing, so it has no verdict (`vramlab emulate`: exit code 3).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NoVerdict(pub String);

/// Exit code for an error: 2 for bad input, 3 for a run with no verdict, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    if err.chain().any(|e| e.downcast_ref::<NoVerdict>().is_some()) {
        return 3;
    }
    if err
        .chain()
        .any(|e| e.downcast_ref::<InputError>().is_some())
    {
        2
    } else {
        1
    }
}

/// A candle error's message without the backtrace candle appends when `RUST_BACKTRACE` is set.
pub fn candle_msg(e: &candle_core::Error) -> String {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } => candle_msg(inner),
        E::Context { inner, context } => format!("{context}: {}", candle_msg(inner)),
        E::WithPath { inner, path } => format!("{}: {}", path.display(), candle_msg(inner)),
        other => other.to_string(),
    }
}

/// One line for the user: the error chain joined with ": ", newlines folded.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in err.chain() {
        // candle appends a backtrace to its errors when RUST_BACKTRACE is set: not for a row.
        let text = match e.downcast_ref::<candle_core::Error>() {
            Some(c) => candle_msg(c),
            None => e.to_string(),
        };
        let s = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::one_line;

    /// A candle error with a captured backtrace (what `RUST_BACKTRACE=1` gives every candle
    /// error) becomes its message alone: a CSV row's `message` holds no backtrace.
    #[test]
    fn one_line_drops_candles_backtrace() {
        let inner = candle_core::Error::Msg("unsupported dtype BF16 for op matmul".into());
        let with_bt = candle_core::Error::WithBacktrace {
            inner: Box::new(inner),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        let err = anyhow::Error::from(with_bt).context("denoise step 1");
        assert_eq!(
            one_line(&err),
            "denoise step 1: unsupported dtype BF16 for op matmul"
        );
    }
}
