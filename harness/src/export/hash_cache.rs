//! A cache of the manifest's weight hashes, so that a sweep does not read every weight file
//! again on every run (98 MB for SmolLM2, gigabytes for real checkpoints).
//!
//! Key: the weight files' canonical paths with their size and modification time (ns).
//! Value: the sha256 of their concatenated bytes and the total size. A cached hash is used
//! only when every file still has the size and mtime it had when it was hashed. The
//! assumption (the same as rsync's quick check and make's): a file whose contents change also
//! changes size or mtime. A file rewritten in place with the same size whose mtime is then
//! set back (`touch -d`, `cp --preserve` over it) would defeat it; delete the cache file, or
//! set `VRAMLAB_HASH_CACHE=off`, to hash everything again. Two guards keep it honest:
//! - a file modified while it was being hashed (size or mtime differ before and after), or
//!   modified within the last 2 s (a coarse-mtime file system could hide a second write in
//!   the same tick), is hashed but not cached;
//! - entries whose files no longer match are dropped whenever the cache is written.
//!
//! Where: `$VRAMLAB_HASH_CACHE` (a file; `off` or empty disables the cache), else
//! `$XDG_CACHE_HOME/vramlab/weight-hashes.json`, else `~/.cache/vramlab/weight-hashes.json`:
//! the user's cache folder, because weights are shared by every clone and every run, and a
//! sweep may run where there is no target folder (a Slurm node, the device machine). The file
//! is written to a temporary name and renamed into place, so concurrent sweeps (shards) never
//! see a torn file; one of two simultaneous updates may be lost, which costs one re-hash.
//! A cache that cannot be read or written is ignored: the hash is then computed.
use super::manifest::hash_files;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A file as the cache keys it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    path: PathBuf,
    size: u64,
    mtime_ns: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    files: Vec<Stamp>,
    sha256: String,
    bytes: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    version: u32,
    entries: Vec<Entry>,
}

const VERSION: u32 = 1;
/// A file modified more recently than this is not cached (see the module's notes).
const SETTLE: Duration = Duration::from_secs(2);

/// Where the cache lives, or None when it is disabled or there is no cache folder.
pub fn default_path() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("VRAMLAB_HASH_CACHE") {
        return (!v.is_empty() && v != "off").then(|| PathBuf::from(v));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("vramlab").join("weight-hashes.json"))
}

fn stamp(f: &Path) -> Result<(Stamp, SystemTime)> {
    let path = std::fs::canonicalize(f)?;
    let meta = std::fs::metadata(&path)?;
    let modified = meta.modified()?;
    let mtime_ns = modified
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    Ok((
        Stamp {
            path,
            size: meta.len(),
            mtime_ns,
        },
        modified,
    ))
}

fn stamps(files: &[PathBuf]) -> Result<Vec<(Stamp, SystemTime)>> {
    files.iter().map(|f| stamp(f)).collect()
}

fn read(cache: &Path) -> CacheFile {
    std::fs::read_to_string(cache)
        .ok()
        .and_then(|t| serde_json::from_str::<CacheFile>(&t).ok())
        .filter(|c| c.version == VERSION)
        .unwrap_or_default()
}

/// True when every file of `e` still has its recorded size and mtime.
fn still_valid(e: &Entry) -> bool {
    e.files
        .iter()
        .all(|s| stamp(&s.path).is_ok_and(|(now, _)| now == *s))
}

fn write(cache: &Path, entry: Entry) -> Result<()> {
    let mut c = read(cache);
    c.version = VERSION;
    c.entries
        .retain(|e| e.files != entry.files && still_valid(e));
    c.entries.push(entry);
    if let Some(dir) = cache.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = cache.with_extension(format!("json.{}.part", std::process::id()));
    std::fs::write(&tmp, serde_json::to_string_pretty(&c)?)?;
    std::fs::rename(&tmp, cache)?;
    Ok(())
}

/// sha256 over the concatenated bytes of `files` and their total size, from `cache` when it
/// holds them at their current size and mtime (then the third value is true), else computed
/// (and stored when `cache` is given and the files are settled).
pub fn hash_files_cached(files: &[PathBuf], cache: Option<&Path>) -> Result<(String, u64, bool)> {
    let Some(cache) = cache else {
        let (sha, bytes) = hash_files(files)?;
        return Ok((sha, bytes, false));
    };
    let before = stamps(files)?;
    let key: Vec<Stamp> = before.iter().map(|(s, _)| s.clone()).collect();
    if let Some(e) = read(cache).entries.into_iter().find(|e| e.files == key) {
        return Ok((e.sha256, e.bytes, true));
    }
    let (sha256, bytes) = hash_files(files)?;
    let after: Vec<Stamp> = stamps(files)?.into_iter().map(|(s, _)| s).collect();
    let now = SystemTime::now();
    let settled = before
        .iter()
        .all(|(_, m)| now.duration_since(*m).is_ok_and(|age| age >= SETTLE));
    if after == key && settled {
        // A cache that cannot be written only costs a re-hash next time.
        let _ = write(
            cache,
            Entry {
                files: key,
                sha256: sha256.clone(),
                bytes,
            },
        );
    }
    Ok((sha256, bytes, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `bytes` to `p` with an mtime `age` in the past.
    fn file(p: &Path, bytes: &[u8], age: Duration) {
        std::fs::write(p, bytes).unwrap();
        let f = std::fs::File::options().write(true).open(p).unwrap();
        f.set_modified(SystemTime::now() - age).unwrap();
    }

    #[test]
    fn second_lookup_is_cached_and_any_change_rehashes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("c/hashes.json");
        let (a, b) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
        file(&a, b"first file", Duration::from_secs(60));
        file(&b, b"second", Duration::from_secs(60));
        let files = vec![a.clone(), b.clone()];
        let direct = hash_files(&files).unwrap();

        let first = hash_files_cached(&files, Some(&cache)).unwrap();
        assert_eq!((first.0.clone(), first.1), direct);
        assert!(!first.2, "nothing cached yet");
        let second = hash_files_cached(&files, Some(&cache)).unwrap();
        assert_eq!(second, (direct.0.clone(), direct.1, true));

        // Another order is another concatenation: its own entry.
        let swapped = vec![b.clone(), a.clone()];
        assert!(!hash_files_cached(&swapped, Some(&cache)).unwrap().2);

        // Same size, new mtime: hashed again, and the new bytes are seen.
        file(&a, b"FIRST FILE", Duration::from_secs(30));
        let changed = hash_files_cached(&files, Some(&cache)).unwrap();
        assert!(!changed.2);
        assert_eq!((changed.0.clone(), changed.1), hash_files(&files).unwrap());
        assert_ne!(changed.0, direct.0);
        // The stale entry was dropped when the new one was written.
        let c = read(&cache);
        assert!(c.entries.iter().all(still_valid), "{c:?}");

        // New size, same mtime as the cached entry's: hashed again.
        let (st, m) = stamp(&b).unwrap();
        std::fs::write(&b, b"second, longer").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&b)
            .unwrap()
            .set_modified(m)
            .unwrap();
        assert_ne!(stamp(&b).unwrap().0.size, st.size);
        assert!(!hash_files_cached(&files, Some(&cache)).unwrap().2);
    }

    #[test]
    fn a_just_written_file_is_not_cached_and_a_torn_cache_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("hashes.json");
        let a = dir.path().join("fresh.bin");
        std::fs::write(&a, b"just written").unwrap();
        let files = vec![a];
        assert!(!hash_files_cached(&files, Some(&cache)).unwrap().2);
        assert!(!hash_files_cached(&files, Some(&cache)).unwrap().2);
        std::fs::write(&cache, "{ not json").unwrap();
        let (sha, bytes, cached) = hash_files_cached(&files, Some(&cache)).unwrap();
        assert!(!cached);
        assert_eq!((sha, bytes), hash_files(&files).unwrap());
    }
}
