//! Registry pull and push end to end, against a real OCI Distribution server on
//! loopback (the Debian package `docker-registry`, started by the test with a
//! temporary storage directory) configured for **token auth**: its realm is a
//! token server this test runs on loopback, issuing RS256 JWTs signed with a key
//! and certificate made by `openssl` at test time (the registry trusts that
//! certificate as its `rootcertbundle`). Nothing but loopback is contacted.
//!
//! Push an image Sandlot imported (an archive the image store built), pull it back
//! under another name: same image id, empty diff, runs in a sandbox; a second pull
//! downloads nothing; wrong credentials are refused; a tampered blob in the
//! registry's storage is refused and leaves no image. Needs root (sandboxes).

mod api_support;
mod img_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_support::{free_port, rt, Daemon};
use base64::Engine;
use serde_json::{json, Value};

const USER: &str = "alice";
const PASSWORD: &str = "pa55-w0rd-registry";
const SERVICE: &str = "sandlot-test-registry";
const ISSUER: &str = "sandlot-test-issuer";

fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// The token service: Basic-authenticates `alice`, grants the scopes asked for,
/// signs with `openssl dgst -sha256 -sign` (RS256).
struct TokenServer {
    port: u16,
    stop: Arc<AtomicBool>,
    issued: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TokenServer {
    fn start(dir: &Path) -> TokenServer {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let issued = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let (s, i, r, dir) = (
            stop.clone(),
            issued.clone(),
            refused.clone(),
            dir.to_path_buf(),
        );
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((c, _)) => {
                        c.set_nonblocking(false).unwrap();
                        serve_token(c, &dir, &i, &r);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        TokenServer {
            port,
            stop,
            issued,
            refused,
            thread: Some(thread),
        }
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_token(c: TcpStream, dir: &Path, issued: &AtomicUsize, refused: &AtomicUsize) {
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut auth = None;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("authorization") {
                auth = Some(v.trim().to_string());
            }
        }
    }
    let want = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    );
    let mut w = c;
    if auth.as_deref() != Some(want.as_str()) {
        refused.fetch_add(1, Ordering::Relaxed);
        let _ = w.write_all(
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        return;
    }
    let query = target.split_once('?').map(|x| x.1).unwrap_or("");
    let mut access = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k == "scope" {
            // repository:NAME:ACTIONS
            let parts: Vec<&str> = v.splitn(3, ':').collect();
            if parts.len() == 3 {
                access.push(json!({"type": parts[0], "name": parts[1],
                    "actions": parts[2].split(',').collect::<Vec<_>>()}));
            }
        }
    }
    let der = std::fs::read(dir.join("cert.der")).unwrap();
    let header = json!({"typ": "JWT", "alg": "RS256",
        "x5c": [base64::engine::general_purpose::STANDARD.encode(der)]});
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({"iss": ISSUER, "sub": USER, "aud": SERVICE, "exp": now + 600,
        "nbf": now - 10, "iat": now, "jti": format!("t{}", issued.load(Ordering::Relaxed)),
        "access": access});
    let signing_input = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let mut sign = Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(dir.join("key.pem"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    sign.stdin
        .take()
        .unwrap()
        .write_all(signing_input.as_bytes())
        .unwrap();
    let out = sign.wait_with_output().unwrap();
    assert!(out.status.success());
    let token = format!("{signing_input}.{}", b64url(&out.stdout));
    issued.fetch_add(1, Ordering::Relaxed);
    let body = json!({"token": token, "expires_in": 600}).to_string();
    let _ = write!(
        w,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// `docker-registry serve` on loopback with token auth; killed on drop.
struct Registry {
    child: Child,
    port: u16,
    storage: PathBuf,
    log: PathBuf,
}

impl Registry {
    fn start(dir: &Path, token_port: u16) -> Registry {
        let bin = Path::new("/usr/bin/docker-registry");
        assert!(
            bin.exists(),
            "the Debian package docker-registry is required: run scripts/setup.d/70-images.sh"
        );
        let port = free_port();
        let storage = dir.join("registry-storage");
        std::fs::create_dir_all(&storage).unwrap();
        let cfg = dir.join("registry.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\nauth:\n  token:\n    realm: http://127.0.0.1:{token_port}/token\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
                storage.display(),
                dir.join("cert.pem").display()
            ),
        )
        .unwrap();
        let log = dir.join("registry.log");
        let child = Command::new(bin)
            .arg("serve")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.join("registry.err")).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            child,
            port,
            storage,
            log,
        }
    }

    fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let mut s = String::new();
            let _ = std::fs::File::open(self.log.with_file_name("registry.err"))
                .and_then(|mut f| f.read_to_string(&mut s));
            eprintln!(
                "registry log (tail):\n{}",
                &s[s.len().saturating_sub(4000)..]
            );
        }
    }
}

/// The NDJSON lines of a pull or push.
async fn stream_lines(c: &sandlot_client::Client, path: &str, body: Value) -> Vec<Value> {
    let mut s = c.post_stream(path, &body).await.unwrap();
    let mut buf = Vec::new();
    while let Some(ch) = s.chunk().await.unwrap() {
        buf.extend_from_slice(&ch);
    }
    buf.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

#[test]
fn registry_push_pull_token_auth_and_tampering() {
    api_support::require_root();
    let work = std::env::temp_dir().join(format!("sandlot-registry-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let ok = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=sandlot-test-token",
        ])
        .arg("-keyout")
        .arg(work.join("key.pem"))
        .arg("-out")
        .arg(work.join("cert.pem"))
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success(), "openssl req");
    let ok = Command::new("openssl")
        .args(["x509", "-outform", "DER", "-in"])
        .arg(work.join("cert.pem"))
        .arg("-out")
        .arg(work.join("cert.der"))
        .status()
        .unwrap();
    assert!(ok.success(), "openssl x509");

    let tokens = TokenServer::start(&work);
    let reg = Registry::start(&work, tokens.port);
    let host = format!("127.0.0.1:{}", reg.port);
    // Credentials for pushes come from a docker-style config file the operator
    // names; pulls below send their own in the request.
    let auth_file = work.join("docker-config.json");
    std::fs::write(
        &auth_file,
        json!({"auths": {host.clone(): {"auth": base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))}}}).to_string(),
    )
    .unwrap();
    let mut d = Daemon::start(Some(&format!(
        "[images]\ninsecure_registries = [\"{host}\"]\nauth_file = \"{}\"\n",
        auth_file.display()
    )));
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 2);
    let (code, out, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let base_id = out.trim().to_string();

    // Push with the CLI (credentials from the daemon's auth file).
    let remote = format!("{host}/sandlot/base:v1");
    let (code, out, err) = d.cli(&["image", "push", "test/base:1", &remote]);
    assert_eq!(code, 0, "push: {out}{err}");
    let manifest_digest = out.trim().to_string();
    assert!(manifest_digest.starts_with("sha256:"), "{out}");
    assert!(
        tokens.issued.load(Ordering::Relaxed) >= 1,
        "the token flow was not used"
    );

    let c = d.client();
    let rt = rt();
    rt.block_on(async {
        // A second push sends no layer again.
        let lines = stream_lines(&c, "/v1/images/test/base:1/push", json!({"reference": remote})).await;
        let last = lines.last().unwrap();
        assert_eq!(last["type"], "done", "{lines:?}");
        assert_eq!(last["digest"], manifest_digest.as_str());
        assert!(lines.iter().all(|l| l["status"] != "start"), "{lines:?}");

        // Wrong credentials in the request: refused by the token service, clearly.
        let lines = stream_lines(
            &c,
            "/v1/images/pull",
            json!({"reference": remote, "tag": "test/nope", "auth": {"username": USER, "password": "wrong"}}),
        )
        .await;
        let last = lines.last().unwrap();
        assert_eq!(last["type"], "error", "{lines:?}");
        assert_eq!(last["code"], "registry_unauthorized", "{last}");
        assert!(!last.to_string().contains("wrong"), "the password leaked: {last}");
        assert!(tokens.refused.load(Ordering::Relaxed) >= 1);

        // Malformed references are refused before anything starts.
        for bad in ["no-registry/app:1", "127.0.0.1:1/App:x", &format!("{host}/a@sha256:12")] {
            let e = c
                .call_json("POST", "/v1/images/pull", Some(&json!({"reference": bad})))
                .await
                .unwrap_err();
            assert_eq!(e.status().unwrap().as_u16(), 400, "{bad}: {e}");
            assert!(e.to_string().contains("reference"), "{e}");
        }
    });

    // Pull it back under another name (credentials in the request, by the CLI
    // from stdin would be the same body): identical content, runs.
    let (code, out, err) = d.cli(&["image", "pull", &remote, "--tag", "test/pulled:1"]);
    assert_eq!(code, 0, "pull: {out}{err}");
    assert_eq!(
        out.trim(),
        base_id,
        "the pulled image id differs from the pushed one"
    );
    rt.block_on(async {
        let diff = c
            .call_json("GET", "/v1/images/diff?a=test/base:1&b=test/pulled:1", None)
            .await
            .unwrap();
        assert_eq!(diff, json!({"added": [], "changed": [], "removed": []}));
        let sb = c
            .call_json("POST", "/v1/sandboxes", Some(&json!({"image": "test/pulled:1"})))
            .await
            .unwrap();
        let id = sb["id"].as_str().unwrap().to_string();
        let o = c.run(&id, &["/bin/sh", "-c", "cat /opt/layers/0 /opt/layers/1; echo $FROM_IMAGE"]).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "layer 0\nlayer 1\nyes\n");
        c.delete_sandbox(&id).await.unwrap();

        // By digest, everything already stored: nothing is downloaded.
        let lines = stream_lines(
            &c,
            "/v1/images/pull",
            json!({"reference": format!("{host}/sandlot/base@{manifest_digest}"), "tag": "test/bydigest:1",
                   "auth": {"username": USER, "password": PASSWORD}}),
        )
        .await;
        let last = lines.last().unwrap();
        assert_eq!(last["type"], "done", "{lines:?}");
        assert_eq!(last["image"]["id"], base_id.as_str());
        let cached = lines.iter().filter(|l| l["type"] == "layer" && l["cached"] == true).count();
        assert_eq!(cached, 3, "{lines:?}");
        assert!(lines.iter().all(|l| l["status"] != "start"), "{lines:?}");
    });

    // Tamper with the top layer's blob in the registry's storage, drop the local
    // copies, pull again: the digest check refuses it and no image is recorded.
    let img = rt
        .block_on(c.call_json("GET", "/v1/images/test/base:1", None))
        .unwrap();
    let top = img["layers"][2]["digest"].as_str().unwrap().to_string();
    let data = reg.blob_data(&top);
    let mut bytes = std::fs::read(&data).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x5a;
    std::fs::write(&data, &bytes).unwrap();
    for t in ["test/base:1", "test/pulled:1", "test/bydigest:1"] {
        let (code, _, err) = d.cli(&["image", "rm", t]);
        assert_eq!(code, 0, "rm {t}: {err}");
    }
    let (code, _, err) = d.cli(&["image", "prune"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = d.cli(&["image", "pull", &remote, "--tag", "test/tampered:1"]);
    assert_ne!(code, 0, "a tampered blob was accepted: {out}");
    assert!(
        err.contains("digest mismatch") && err.contains(&top),
        "{err}"
    );
    let left = rt.block_on(c.call_json("GET", "/v1/images", None)).unwrap();
    assert_eq!(
        left["images"],
        json!([]),
        "a failed pull registered an image"
    );
    let staging: Vec<_> = std::fs::read_dir(d.data_dir().join("images/tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(staging.is_empty(), "staging files left: {staging:?}");

    drop(reg);
    drop(tokens);
    d.shutdown();
    std::fs::remove_dir_all(&work).unwrap();
}

/// Benchmark (ignored by default; `cargo test -p sandlot --no-default-features
/// --test img_registry -- --ignored --nocapture`): push and pull of a ~50 MB image
/// (incompressible layer) through the token-auth loopback registry, 3 rounds,
/// medians; the peer is importing the same image from a local archive.
#[test]
#[ignore]
fn registry_throughput_bench() {
    api_support::require_root();
    let work = std::env::temp_dir().join(format!("sandlot-registry-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    for args in [
        vec![
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=bench",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
        ],
        vec![
            "x509", "-outform", "DER", "-in", "cert.pem", "-out", "cert.der",
        ],
    ] {
        let ok = Command::new("openssl")
            .args(&args)
            .current_dir(&work)
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let tokens = TokenServer::start(&work);
    let reg = Registry::start(&work, tokens.port);
    let host = format!("127.0.0.1:{}", reg.port);
    let auth_file = work.join("docker-config.json");
    std::fs::write(
        &auth_file,
        json!({"auths": {host.clone(): {"auth": base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))}}}).to_string(),
    )
    .unwrap();
    let d = Daemon::start(Some(&format!(
        "[images]\ninsecure_registries = [\"{host}\"]\nauth_file = \"{}\"\n",
        auth_file.display()
    )));
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(tmp.join("big/opt")).unwrap();
    let mut data = vec![0u8; 50 << 20];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut data)
        .unwrap();
    std::fs::write(tmp.join("big/opt/blob"), &data).unwrap();
    let root = tmp.join("rootfs");
    img_support::mini_rootfs(&root);
    let archive = tmp.join("big.tar");
    img_support::archive_of(
        &tmp,
        &[root, tmp.join("big")],
        &Default::default(),
        "bench/big:1",
        &archive,
    );
    let size = std::fs::metadata(&archive).unwrap().len() as f64 / 1e6;
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (mut imp, mut push, mut pull) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        let t = Instant::now();
        let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        imp.push(t.elapsed().as_secs_f64());
        // A new repository each round: the registry links no blob there yet, so
        // every push uploads the whole image.
        let remote = format!("{host}/bench/big{round}:1");
        let t = Instant::now();
        let (code, _, err) = d.cli(&["image", "push", "bench/big:1", &remote]);
        assert_eq!(code, 0, "{err}");
        push.push(t.elapsed().as_secs_f64());
        assert_eq!(d.cli(&["image", "rm", "bench/big:1"]).0, 0);
        assert_eq!(d.cli(&["image", "prune"]).0, 0);
        let t = Instant::now();
        let (code, _, err) = d.cli(&["image", "pull", &remote, "--tag", "bench/pulled:1"]);
        assert_eq!(code, 0, "{err}");
        pull.push(t.elapsed().as_secs_f64());
        assert_eq!(d.cli(&["image", "rm", "bench/pulled:1"]).0, 0);
        assert_eq!(d.cli(&["image", "prune"]).0, 0);
    }
    let (mi, mp, ml) = (median(imp), median(pull), median(push));
    eprintln!(
        "registry bench: image {size:.1} MB, 3 rounds, medians: import from archive (peer) {mi:.3}s ({:.0} MB/s); \
         push {ml:.3}s ({:.0} MB/s); pull {mp:.3}s ({:.0} MB/s); pull/import {:.2}, push/import {:.2}",
        size / mi,
        size / ml,
        size / mp,
        mp / mi,
        ml / mi
    );
    drop(d);
    drop(reg);
    drop(tokens);
    std::fs::remove_dir_all(&work).unwrap();
}
