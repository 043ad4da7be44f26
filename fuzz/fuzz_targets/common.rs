// Shared checks: a parser may reject its input, but only with a bad-input error
// (exit code 2 at the CLI) whose message names the file and fits on one line.
use std::path::Path;

pub fn check_err(path: &Path, e: &anyhow::Error) {
    assert_eq!(
        vramlab::error::exit_code(e),
        2,
        "not an input error: {e:#}"
    );
    let line = vramlab::error::one_line(e);
    assert!(
        line.contains(&path.display().to_string()),
        "message does not name the file: {line}"
    );
}
