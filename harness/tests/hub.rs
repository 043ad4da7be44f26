//! `estimate --model ORG/NAME`: a local stand-in for the Hugging Face Hub (a `tiny_http` server
//! on 127.0.0.1) serves a published config.json (the qwen2.5-7b preset's) with an index, a
//! single-file repository, a gated one, a private-or-missing one and a missing one; the binary
//! reaches it through `HF_ENDPOINT` and caches under a temporary `VRAMLAB_HUB_CACHE`. No test
//! touches the network.
mod common;
use serde_json::Value;
use std::path::Path;
use std::sync::{Arc, Mutex};

const QWEN_CONFIG: &str = include_str!("../presets/qwen2.5-7b/config.json");
/// Qwen2.5-7B's published index's `metadata.total_size` (bf16).
const QWEN_STORED: u64 = 15_231_233_024;
const TOKEN: &str = "hf_test_token";

/// Serves the recorded repositories; every request's method, path and Authorization header go
/// to the log.
struct Hub {
    endpoint: String,
    log: Arc<Mutex<Vec<String>>>,
}

fn hub() -> Hub {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("a local port");
    let endpoint = format!("http://{}", server.server_addr());
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    std::thread::spawn(move || {
        for req in server.incoming_requests() {
            let auth = req
                .headers()
                .iter()
                .find(|h| h.field.equiv("Authorization"))
                .map(|h| h.value.to_string());
            let url = req.url().to_string();
            let authorized = auth.as_deref() == Some(&format!("Bearer {TOKEN}"));
            seen.lock()
                .unwrap()
                .push(format!("{} {url} {auth:?}", req.method()));
            let index =
                format!(r#"{{"metadata": {{"total_size": {QWEN_STORED}}}, "weight_map": {{}}}}"#);
            let header = |k: &str, v: &str| tiny_http::Header::from_bytes(k, v).unwrap();
            let body = |s: String| tiny_http::Response::from_string(s);
            let res = match url.as_str() {
                "/Qwen/Qwen2.5-7B/resolve/main/config.json" => body(QWEN_CONFIG.into()),
                "/Qwen/Qwen2.5-7B/resolve/main/model.safetensors.index.json" => body(index),
                "/org/single/resolve/main/config.json" => body(QWEN_CONFIG.into()),
                // The Hub redirects an LFS file to its storage, saying the size.
                "/org/single/resolve/main/model.safetensors" => body(String::new())
                    .with_status_code(302)
                    .with_header(header("Location", "https://cdn.invalid/blob"))
                    .with_header(header("X-Linked-Size", "1234567")),
                "/gated/model/resolve/main/config.json" if authorized => body(QWEN_CONFIG.into()),
                u if u.starts_with("/gated/model/") && !authorized => body("gated".into())
                    .with_status_code(401)
                    .with_header(header("X-Error-Code", "GatedRepo")),
                u if u.starts_with("/private/model/") => body("not found".into())
                    .with_status_code(401)
                    .with_header(header("X-Error-Code", "RepoNotFound")),
                _ => body("not found".into()).with_status_code(404),
            };
            let _ = req.respond(res);
        }
    });
    Hub { endpoint, log }
}

/// `vramlab estimate` against `endpoint`, caching in `cache`, no token or offline flag unless
/// `env` sets them, and no proxy.
fn estimate(
    endpoint: &str,
    cache: &Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> assert_cmd::Command {
    let mut c = common::vramlab();
    c.arg("estimate")
        .args(args)
        .env("HF_ENDPOINT", endpoint)
        .env("VRAMLAB_HUB_CACHE", cache);
    for v in [
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn json(c: &mut assert_cmd::Command) -> Value {
    let out = c.assert().success().get_output().stdout.clone();
    serde_json::from_slice(&out).expect("--json prints JSON")
}

/// Exit 2 with one line on stderr containing `needle`.
fn fails(c: &mut assert_cmd::Command, needle: &str) {
    let out = c.assert().code(2).get_output().clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{err}");
}

#[test]
fn a_hub_id_estimates_as_its_preset_and_caches_for_offline_runs() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let args = ["--json", "--model", "Qwen/Qwen2.5-7B"];
    let online = json(&mut estimate(&hub.endpoint, cache.path(), &[], &args));
    let preset = json(&mut estimate(
        &hub.endpoint,
        cache.path(),
        &[],
        &["--json", "--model", "qwen2.5-7b"],
    ));
    assert_eq!(online["model"]["name"], "Qwen/Qwen2.5-7B");
    assert_eq!(online["model"]["params"], preset["model"]["params"]);
    assert_eq!(online["model"]["params"], 7_615_616_512u64);
    assert_eq!(online["total_bytes"], preset["total_bytes"]);
    assert_eq!(online["model"]["stored_bytes"], QWEN_STORED);
    assert!(preset["model"].get("stored_bytes").is_none(), "{preset}");

    let dir = cache.path().join("Qwen/Qwen2.5-7B/main");
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert_eq!(config, QWEN_CONFIG);
    assert!(dir.join("model.safetensors.index.json").is_file());
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 2, "no temporary file is left: {files:?}");

    // Offline, against an endpoint that answers nothing: the same estimate from the cache.
    let requests = hub.log.lock().unwrap().len();
    let offline = json(&mut estimate(
        "http://127.0.0.1:9",
        cache.path(),
        &[("HF_HUB_OFFLINE", "1")],
        &args,
    ));
    assert_eq!(offline, online);
    assert_eq!(hub.log.lock().unwrap().len(), requests);

    let text = estimate(
        &hub.endpoint,
        cache.path(),
        &[],
        &["--model", "Qwen/Qwen2.5-7B"],
    )
    .assert()
    .success()
    .get_output()
    .stdout
    .clone();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains(
            "stored checkpoint: 15.2 GB (14.2 GiB) of safetensors on the Hub (2.00 B/param)"
        ),
        "{text}"
    );
}

/// `estimate --json --model MODEL` with `env` against a fresh stand-in and cache: the report
/// and the requests the stand-in saw, one a line.
fn fresh(env: &[(&str, &str)], model: &str) -> (Value, String) {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let v = json(&mut estimate(
        &hub.endpoint,
        cache.path(),
        env,
        &["--json", "--model", model],
    ));
    let log = hub.log.lock().unwrap().join("\n");
    (v, log)
}

#[test]
fn a_single_file_checkpoint_is_sized_by_its_redirect() {
    let (v, log) = fresh(&[], "org/single");
    assert_eq!(v["model"]["stored_bytes"], 1_234_567);
    assert!(
        log.contains("HEAD /org/single/resolve/main/model.safetensors"),
        "{log}"
    );
    assert!(!log.contains("cdn.invalid"), "{log}");
}

#[test]
fn offline_without_the_cache_is_one_line() {
    let cache = tempfile::tempdir().unwrap();
    fails(
        &mut estimate(
            "http://127.0.0.1:9",
            cache.path(),
            &[("HF_HUB_OFFLINE", "1")],
            &["--model", "Qwen/Qwen2.5-7B"],
        ),
        "--model Qwen/Qwen2.5-7B: not in the cache",
    );
}

#[test]
fn gated_missing_and_unreachable_are_one_line_each() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let run = |model: &str| estimate(&hub.endpoint, cache.path(), &[], &["--model", model]);
    fails(
        &mut run("gated/model"),
        "--model gated/model: gated or private: set HF_TOKEN (and accept the licence on the model page)",
    );
    fails(
        &mut run("missing/model"),
        "--model missing/model: no such model (or no config.json at main)",
    );
    fails(
        &mut run("missing/model@v2"),
        "--model missing/model@v2: no such model (or no config.json at v2)",
    );
    fails(
        &mut run("private/model"),
        "--model private/model: no such model (or a private one: set HF_TOKEN)",
    );
    fails(
        &mut estimate("http://127.0.0.1:9", cache.path(), &[], &["--model", "a/b"]),
        "set HF_HUB_OFFLINE=1 to use the cache",
    );
}

#[test]
fn hf_token_goes_as_a_bearer_header() {
    let (v, log) = fresh(&[("HF_TOKEN", TOKEN)], "gated/model");
    assert_eq!(v["model"]["params"], 7_615_616_512u64);
    assert!(
        log.contains(&format!(
            "GET /gated/model/resolve/main/config.json Some(\"Bearer {TOKEN}\")"
        )),
        "{log}"
    );
}

#[test]
fn a_local_path_wins_over_a_hub_id() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("Qwen/Qwen2.5-7B")).unwrap();
    std::fs::write(work.path().join("Qwen/Qwen2.5-7B/config.json"), QWEN_CONFIG).unwrap();
    let v = json(
        estimate(
            &hub.endpoint,
            cache.path(),
            &[],
            &["--json", "--model", "Qwen/Qwen2.5-7B"],
        )
        .current_dir(work.path()),
    );
    assert_eq!(v["model"]["name"], "Qwen2.5-7B");
    assert!(v["model"].get("stored_bytes").is_none());
    assert!(hub.log.lock().unwrap().is_empty());
}
