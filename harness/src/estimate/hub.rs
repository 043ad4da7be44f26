//! `--model ORG/NAME[@REVISION]`: a model on the Hugging Face Hub. Its `config.json` and, where
//! the repository has one, `model.safetensors.index.json` come from
//! `$HF_ENDPOINT/ORG/NAME/resolve/REVISION/FILE` (default endpoint `https://huggingface.co`,
//! revision `main`) into vramlab's own cache, laid out as `ORG/NAME/REVISION/FILE` under
//! `$VRAMLAB_HUB_CACHE`, else `$XDG_CACHE_HOME/vramlab/hub`, else `~/.cache/vramlab/hub`.
//! Online, every run fetches again (a branch moves) and replaces the cached files, each written
//! to a temporary file and renamed into place; `HF_HUB_OFFLINE=1` reads the cache only.
//! `HF_TOKEN` goes as a bearer token. Without an index, a HEAD of `model.safetensors` gives a
//! single-file checkpoint's size (the Hub's `x-linked-size`), kept as `model.safetensors.size`.
//! Every failure is bad input: one line naming the id, exit 2
//! (docs/src/guides/estimate.md#models-on-the-hugging-face-hub).
use crate::error::{bad_file, InputError};
use anyhow::Result;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A sharded checkpoint's index: its `metadata.total_size` is the stored bytes.
const INDEX: &str = "model.safetensors.index.json";
/// A single-file checkpoint, and where its size is kept (a decimal byte count).
const SINGLE: &str = "model.safetensors";
const SINGLE_SIZE: &str = "model.safetensors.size";
/// The largest file fetched (an index of thousands of tensors is a few MB).
const MAX_BYTES: u64 = 64 << 20;

/// A Hub repository at a revision, as `--model` named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubId {
    /// `ORG/NAME`.
    pub repo: String,
    /// A branch, tag or commit (default `main`).
    pub revision: String,
    /// What `--model` said (`ORG/NAME` or `ORG/NAME@REVISION`): the model's name.
    pub spec: String,
}

/// The cached `config.json` of a [`HubId`] and its checkpoint's stored bytes, where known.
pub struct Fetched {
    pub config: PathBuf,
    pub stored_bytes: Option<u64>,
}

impl HubId {
    /// `ORG/NAME` or `ORG/NAME@REVISION` in the Hub's characters (ASCII letters, digits, `-`,
    /// `_`, `.`; no part starting or ending with `-` or `.`, no `--` or `..`, at most 96 in
    /// all), else None. `presets/…` and a name ending in `.json`, `.gguf` or `.safetensors`
    /// are paths, never ids.
    pub fn parse(spec: &str) -> Option<HubId> {
        let (repo, revision) = spec.split_once('@').unwrap_or((spec, "main"));
        let (org, name) = repo.split_once('/')?;
        let part = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && !s.starts_with(['-', '.'])
                && !s.ends_with(['-', '.'])
                && !s.contains("--")
                && !s.contains("..")
        };
        let file = [".json", ".gguf", ".safetensors"]
            .iter()
            .any(|e| name.ends_with(e));
        let rev_ok = !revision.is_empty()
            && revision
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
            && !revision.starts_with('/')
            && !revision.contains("..");
        (part(org) && part(name) && repo.len() <= 96 && org != "presets" && !file && rev_ok).then(
            || HubId {
                repo: repo.to_string(),
                revision: revision.to_string(),
                spec: spec.to_string(),
            },
        )
    }

    /// The revision as one path segment (`refs/pr/1` → `refs%2Fpr%2F1`).
    fn revision_segment(&self) -> String {
        self.revision.replace('/', "%2F")
    }

    /// Where this id's files are cached.
    pub fn cache_dir(&self) -> Result<PathBuf> {
        Ok(cache_root()?.join(&self.repo).join(self.revision_segment()))
    }

    /// One line naming the id and `problem` (exit 2).
    fn error(&self, problem: impl std::fmt::Display) -> anyhow::Error {
        InputError::arg(format!("--model {}: {problem}", self.spec)).into()
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `$VRAMLAB_HUB_CACHE`, else `$XDG_CACHE_HOME/vramlab/hub`, else `~/.cache/vramlab/hub`.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(v) = var("VRAMLAB_HUB_CACHE") {
        return Ok(PathBuf::from(v));
    }
    var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|b| b.join("vramlab").join("hub"))
        .ok_or_else(|| {
            InputError::arg("no cache folder for Hub models: set VRAMLAB_HUB_CACHE").into()
        })
}

/// `HF_HUB_OFFLINE` is 1, true, yes or on.
fn offline() -> bool {
    var("HF_HUB_OFFLINE").is_some_and(|v| {
        ["1", "true", "yes", "on"]
            .iter()
            .any(|t| v.trim().eq_ignore_ascii_case(t))
    })
}

/// The config of `id` (fetched unless `HF_HUB_OFFLINE` is set) and its stored bytes.
pub fn fetch(id: &HubId) -> Result<Fetched> {
    let dir = id.cache_dir()?;
    let config = dir.join("config.json");
    if offline() {
        if !config.is_file() {
            return Err(id.error(format!(
                "not in the cache ({}) and HF_HUB_OFFLINE is set",
                dir.display()
            )));
        }
    } else {
        let hub = Hub::new();
        let Some(bytes) = hub.get(id, "config.json")? else {
            return Err(id.error(format!(
                "no such model (or no config.json at {})",
                id.revision
            )));
        };
        save(&dir, "config.json", &bytes)?;
        match hub.get(id, INDEX)? {
            Some(bytes) => {
                save(&dir, INDEX, &bytes)?;
                forget(&dir, SINGLE_SIZE);
            }
            None => {
                forget(&dir, INDEX);
                match hub.head_size(id, SINGLE)? {
                    Some(n) => save(&dir, SINGLE_SIZE, n.to_string().as_bytes())?,
                    None => forget(&dir, SINGLE_SIZE),
                }
            }
        }
    }
    Ok(Fetched {
        config,
        stored_bytes: stored_bytes(&dir)?,
    })
}

/// The index's `metadata.total_size`, else the kept size of a single file.
fn stored_bytes(dir: &Path) -> Result<Option<u64>> {
    let index = dir.join(INDEX);
    if index.is_file() {
        let text = std::fs::read_to_string(&index)
            .map_err(|e| bad_file(&index, format!("cannot read: {e}")))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| bad_file(&index, format!("not valid JSON: {e}")))?;
        let total = v.pointer("/metadata/total_size");
        return Ok(total.and_then(|t| t.as_u64().or_else(|| t.as_f64().map(|f| f as u64))));
    }
    Ok(std::fs::read_to_string(dir.join(SINGLE_SIZE))
        .ok()
        .and_then(|s| s.trim().parse().ok()))
}

/// `bytes` as `dir/file`, through a temporary file renamed into place.
fn save(dir: &Path, file: &str, bytes: &[u8]) -> Result<()> {
    let path = dir.join(file);
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        tmp.write_all(bytes)?;
        tmp.persist(&path).map_err(|e| e.error)?;
        Ok(())
    };
    write().map_err(|e| bad_file(&path, format!("cannot write the Hub cache: {e}")))
}

/// Drops a cached file the Hub no longer has (there may be none).
fn forget(dir: &Path, file: &str) {
    let _ = std::fs::remove_file(dir.join(file));
}

/// The endpoint, the token and an agent that leaves HTTP statuses to us.
struct Hub {
    endpoint: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Hub {
    fn new() -> Hub {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_global(Some(Duration::from_secs(120)))
            // A renamed repository redirects within the Hub: the token goes along.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .user_agent(concat!("vramlab/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Hub {
            endpoint: var("HF_ENDPOINT")
                .map(|e| e.trim().trim_end_matches('/').to_string())
                .unwrap_or_else(|| "https://huggingface.co".into()),
            token: var("HF_TOKEN").map(|t| t.trim().to_string()),
            agent,
        }
    }

    fn url(&self, id: &HubId, file: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{file}",
            self.endpoint,
            id.repo,
            id.revision_segment()
        )
    }

    fn auth<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => r.header("Authorization", format!("Bearer {t}")),
            None => r,
        }
    }

    /// A transport failure, or a status that is neither success nor "not found".
    fn failure(&self, id: &HubId, status: u16, code: Option<&str>) -> anyhow::Error {
        match (status, code) {
            (401 | 403, Some("RepoNotFound")) => {
                id.error("no such model (or a private one: set HF_TOKEN)")
            }
            (401 | 403, _) => id
                .error("gated or private: set HF_TOKEN (and accept the licence on the model page)"),
            _ => id.error(format!("HTTP {status} from {}", self.endpoint)),
        }
    }

    fn unreachable(&self, id: &HubId, e: ureq::Error) -> anyhow::Error {
        id.error(format!(
            "cannot reach {}: {e}; set HF_HUB_OFFLINE=1 to use the cache",
            self.endpoint
        ))
    }

    /// `file`'s bytes, or None where the Hub has no such file (404).
    fn get(&self, id: &HubId, file: &str) -> Result<Option<Vec<u8>>> {
        let url = self.url(id, file);
        let mut resp = self
            .auth(self.agent.get(&url))
            .call()
            .map_err(|e| self.unreachable(id, e))?;
        match resp.status().as_u16() {
            200 => resp
                .body_mut()
                .with_config()
                .limit(MAX_BYTES)
                .read_to_vec()
                .map(Some)
                .map_err(|e| self.unreachable(id, e)),
            404 => Ok(None),
            s => Err(self.failure(id, s, header(&resp, "x-error-code"))),
        }
    }

    /// `file`'s size from a HEAD that follows no redirect: the Hub's `x-linked-size` on the
    /// redirect to its storage, or the length of a file it serves itself; None otherwise.
    fn head_size(&self, id: &HubId, file: &str) -> Result<Option<u64>> {
        let req = self
            .agent
            .head(self.url(id, file))
            .config()
            .max_redirects(0)
            .build();
        let resp = self.auth(req).call().map_err(|e| self.unreachable(id, e))?;
        let size = |h| header(&resp, h).and_then(|v| v.trim().parse().ok());
        Ok(match resp.status().as_u16() {
            200 => size("x-linked-size").or_else(|| size("content-length")),
            300..=399 => size("x-linked-size"),
            _ => None,
        })
    }
}

fn header<'a>(resp: &'a ureq::http::Response<ureq::Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::HubId;

    #[test]
    fn ids_and_not_ids() {
        let id = HubId::parse("Qwen/Qwen3-30B-A3B").unwrap();
        assert_eq!(
            (id.repo.as_str(), id.revision.as_str()),
            ("Qwen/Qwen3-30B-A3B", "main")
        );
        let id = HubId::parse("org/name_1.5@refs/pr/1").unwrap();
        assert_eq!(id.revision_segment(), "refs%2Fpr%2F1");
        for not in [
            "gpt2",
            "a/b/c",
            "./a/b",
            "/a/b",
            "a/config.json",
            "a/m.gguf",
            "presets/gpt2",
            "a/-b",
            "a/b.",
            "a--x/b",
            "a/b@",
            "a/b@../x",
            "a b/c",
            "a/b c",
        ] {
            assert_eq!(HubId::parse(not), None, "{not}");
        }
    }
}
