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

/// Exit code for an error: 2 for bad input, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    if err
        .chain()
        .any(|e| e.downcast_ref::<InputError>().is_some())
    {
        2
    } else {
        1
    }
}

/// One line for the user: the error chain joined with ": ", newlines folded.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in err.chain() {
        let s = e
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ")
}
