//! Privileged: the daemon's descriptors against hostile clients. Idle TCP
//! connections must not starve the operator's socket or other tenants, and a create
//! on a host out of descriptors must answer 503 and leave nothing behind. All
//! traffic is on loopback.
//!
//! Run: `cargo test -p sandlot --no-default-features --test api_connections` (root).

mod api_support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use api_support::{block_on_within, spec_body, Daemon};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

/// The sandboxes' run directory of the test daemons (the default).
fn run_sandboxes() -> PathBuf {
    sandlot_runtime::RuntimeConfig::new(PathBuf::new())
        .run_dir
        .join("sandboxes")
}

/// Entries of the run directory that belong to `prefix`'s sandboxes, including
/// directories still being published (`.new-<id>-<pid>`).
fn run_dir_entries(prefix: &str) -> Vec<String> {
    std::fs::read_dir(run_sandboxes())
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix) || n.starts_with(&format!(".new-{prefix}")))
                .collect()
        })
        .unwrap_or_default()
}

/// Lets the test itself open many sockets.
fn raise_own_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    l.current = l.maximum;
    let _ = setrlimit(Resource::Nofile, l);
}

/// `n` TCP connections from each loopback address of `from` to `to` that send
/// nothing: (the connections the daemon kept, the number it answered 503 and
/// closed). All are opened first, then sorted out as the answers come: until no
/// more than `kept` are silent (the answers of the refused ones all read), or
/// for at most 1.5 s, well within the header timeout.
async fn idle_connections(
    from: &[String],
    to: SocketAddr,
    n: usize,
    kept: usize,
) -> (Vec<TcpStream>, usize) {
    let mut silent = Vec::new();
    for f in from {
        for _ in 0..n {
            let s = TcpSocket::new_v4().unwrap();
            s.bind(format!("{f}:0").parse().unwrap()).unwrap();
            silent.push(s.connect(to).await.unwrap());
        }
    }
    // A refused connection is answered at once and closed; a kept one stays silent.
    let mut refused = 0;
    let until = tokio::time::Instant::now() + Duration::from_millis(1500);
    loop {
        let mut still = Vec::new();
        for s in silent {
            let mut buf = vec![0u8; 4096];
            match s.try_read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => still.push(s),
                Ok(n) => {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    assert!(
                        text.starts_with("HTTP/1.1 503 ") && text.contains("\"unavailable\""),
                        "a refused connection is told why: {text:?}"
                    );
                    refused += 1;
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        silent = still;
        if silent.len() <= kept || tokio::time::Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Kept means kept: still open and silent a while later (well within the
    // header timeout).
    tokio::time::sleep(Duration::from_millis(300)).await;
    for s in &silent {
        let mut buf = [0u8; 64];
        match s.try_read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("a kept connection was answered or closed: {other:?}"),
        }
    }
    (silent, refused)
}

/// Waits until every connection of `conns` has been closed by the daemon (end of
/// stream or reset); false if some are still open after `within`.
async fn all_closed(conns: &mut [TcpStream], within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    for s in conns.iter_mut() {
        let mut b = [0u8; 64];
        match tokio::time::timeout_at(deadline, s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(_)) => return false,
            Err(_) => return false,
        }
    }
    true
}

fn metric(text: &str, line_start: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
}

#[test]
fn idle_tcp_connections_cannot_starve_the_operator_or_other_tenants() {
    raise_own_open_file_limit();
    // A daemon with 512 descriptors in all: 256 kept back, 64 for TCP clients. Before
    // the caps, a few hundred idle connections took every descriptor and the Unix
    // socket stopped answering too.
    let d = Daemon::start_with_open_file_limit(
        Some(
            "[connections]\nheader_timeout = \"2s\"\nidle_timeout = \"3s\"\nmax_per_address = 40\n\
             [network]\npool_size = 0\n",
        ),
        512,
    );
    let token = d.token("victim");
    let api: SocketAddr = format!("127.0.0.1:{}", d.port).parse().unwrap();
    let op = d.client();
    let tenant = d.tcp(Some(&token));
    block_on_within(90, "the idle connection flood", async {
        let health = |c: &sandlot_client::Client| {
            let c = c.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(5), c.health())
                    .await
                    .expect("health did not answer within 5 s")
            }
        };

        // One address opens 600 connections and sends nothing: 40 are kept, the rest
        // refused at once. The operator and a tenant from another address are served,
        // a create and a command included.
        let (mut flood, refused) = idle_connections(&["127.0.0.2".into()], api, 600, 40).await;
        assert_eq!(health(&op).await.unwrap().tenant, "*");
        assert_eq!(
            (flood.len(), refused),
            (40, 560),
            "connections.max_per_address"
        );
        assert_eq!(health(&tenant).await.unwrap().tenant, "victim");
        let sb = tenant
            .create_sandbox(&spec_body(serde_json::json!({})))
            .await
            .unwrap();
        // A command that outlasts both timeouts: a request in flight is never cut.
        let out = tenant
            .run(&sb.id, &["sh", "-c", "sleep 4; echo done"])
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
        // The idle ones are closed after the header timeout (2 s).
        assert!(
            all_closed(&mut flood, Duration::from_secs(6)).await,
            "idle connections were not closed after connections.header_timeout"
        );
        drop(flood);

        // Eight addresses together: past connections.max_total (64) new TCP clients
        // are refused, but the operator's socket still answers. (First the tenant's
        // kept-alive connections go, after idle_timeout.)
        api_support::eventually(10, "no TCP connection open", || {
            let op = op.clone();
            async move {
                let m = op.metrics().await.unwrap();
                metric(&m, "sandlot_tcp_connections_open{listener=\"api\"}") == 0
            }
        })
        .await;
        let from: Vec<String> = (2..10).map(|i| format!("127.0.0.{i}")).collect();
        let (mut all, refused_total) = idle_connections(&from, api, 40, 64).await;
        assert_eq!(
            (all.len(), refused_total),
            (64, 256),
            "connections.max_total"
        );
        assert_eq!(health(&op).await.unwrap().tenant, "*");
        // Refused too (a 503, or the reset of a connection closed unread).
        assert!(health(&tenant).await.is_err());
        assert!(all_closed(&mut all, Duration::from_secs(6)).await);
        drop(all);
        // Once they are gone, tenants are served again.
        api_support::eventually(5, "the tenant to be served again", || {
            let t = tenant.clone();
            async move { t.health().await.is_ok() }
        })
        .await;

        // A kept-alive connection that makes no request for idle_timeout is closed.
        let mut s = std::net::TcpStream::connect(api).unwrap();
        write!(
            s,
            "GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n"
        )
        .unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        let t0 = Instant::now();
        assert_eq!(s.read(&mut buf).unwrap_or(0), 0, "closed by the daemon");
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_secs(8),
            "closed after {waited:?}"
        );

        let m = op.metrics().await.unwrap();
        assert!(
            metric(
                &m,
                "sandlot_tcp_connections_refused_total{listener=\"api\",limit=\"address\"}"
            ) >= 260
        );
        assert!(
            metric(
                &m,
                "sandlot_tcp_connections_refused_total{listener=\"api\",limit=\"total\"}"
            ) >= 256
        );
        assert!(
            metric(
                &m,
                "sandlot_tcp_connections_timed_out_total{listener=\"api\",timeout=\"header\"}"
            ) >= 104
        );
        assert!(
            metric(
                &m,
                "sandlot_tcp_connections_timed_out_total{listener=\"api\",timeout=\"idle\"}"
            ) >= 1
        );
        assert_eq!(metric(&m, "sandlot_open_files_limit"), 512);
        assert_eq!(
            metric(&m, "sandlot_descriptors_budget{use=\"tcp_clients\"}"),
            64
        );
        tenant.delete_sandbox(&sb.id).await.unwrap();
    });
    assert!(d.log().contains("open-file limit"), "the limit is logged");
}

/// The metrics address serves a Prometheus scraper without a token, so whoever
/// reaches it may flood it: its connections are held to the same caps and timeouts
/// as the API's (it used to accept without a limit, and 600 idle connections took
/// every descriptor of a 512-descriptor daemon: the operator's socket stopped
/// answering).
#[test]
fn idle_connections_to_the_metrics_address_cannot_starve_the_daemon() {
    raise_own_open_file_limit();
    let port = api_support::free_port();
    let d = Daemon::start_with_open_file_limit(
        Some(&format!(
            "metrics_listen = \"127.0.0.1:{port}\"\n\
             [connections]\nheader_timeout = \"2s\"\nidle_timeout = \"3s\"\nmax_per_address = 40\n\
             [network]\npool_size = 0\n"
        )),
        512,
    );
    let metrics: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let op = d.client();
    block_on_within(90, "the metrics connection flood", async {
        let (mut flood, refused) = idle_connections(&["127.0.0.2".into()], metrics, 600, 40).await;
        let h = tokio::time::timeout(Duration::from_secs(5), op.health())
            .await
            .expect("the operator's socket did not answer within 5 s");
        assert_eq!(h.unwrap().tenant, "*");
        assert_eq!(
            (flood.len(), refused),
            (40, 560),
            "connections.max_per_address on the metrics address"
        );
        // The operator creates and deletes a sandbox; a scraper from another
        // address reads the metrics, which count the refusals.
        let sb = op
            .create_sandbox(&spec_body(serde_json::json!({})))
            .await
            .unwrap();
        op.delete_sandbox(&sb.id).await.unwrap();
        let s = TcpSocket::new_v4().unwrap();
        s.bind("127.0.0.3:0".parse().unwrap()).unwrap();
        let mut c = s.connect(metrics).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(
            &mut c,
            b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
        assert!(
            metric(
                &text,
                "sandlot_tcp_connections_refused_total{listener=\"metrics\",limit=\"address\"}"
            ) >= 560,
            "{text}"
        );
        // The silent ones are closed by the header timeout.
        assert!(all_closed(&mut flood, Duration::from_secs(10)).await);
    });
}

/// The lowest descriptor number `pid` does not have open: with its soft limit set
/// there, it can open nothing more.
fn lowest_free_fd(pid: i32) -> u64 {
    let used: std::collections::BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    (0..).find(|n| !used.contains(n)).unwrap()
}

/// One request on an open Unix connection (kept alive): (status, body).
fn request(
    s: &mut std::os::unix::net::UnixStream,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, rest)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if let Some(len) = len {
                if rest.len() >= len {
                    return (head[9..12].parse().unwrap(), rest[..len].to_string());
                }
            }
        }
    }
}

#[test]
fn a_create_on_a_host_out_of_descriptors_answers_503_and_leaves_nothing() {
    // Nothing made ahead of time: no background work opens descriptors meanwhile.
    let d = Daemon::start(Some(
        "[runtime]\ncgroup_stock = 0\nnetns_stock = 0\n[network]\npool_size = 0\n",
    ));
    let pid = d.pid();
    let mut s = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    assert_eq!(request(&mut s, "GET", "/v1/health", "").0, 200);
    use rustix::process::{prlimit, Pid, Resource, Rlimit};
    let p = Pid::from_raw(pid).unwrap();
    // The daemon raised its soft limit to the hard one it inherited from us.
    let hard = rustix::process::getrlimit(Resource::Nofile).maximum;
    let restore = Rlimit {
        current: hard,
        maximum: hard,
    };
    let low = Rlimit {
        current: Some(lowest_free_fd(pid)),
        maximum: hard,
    };
    prlimit(Some(p), Resource::Nofile, low).unwrap();
    let (status, body) = request(&mut s, "POST", "/v1/sandboxes", "{}");
    prlimit(Some(p), Resource::Nofile, restore).unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(status, 503, "{body}");
    assert_eq!(v["error"]["code"], "host_exhausted", "{body}");
    assert_eq!(
        v["error"]["message"],
        "the host is out of file descriptors; try again later"
    );
    assert!(
        run_dir_entries(&d.prefix).is_empty(),
        "a failed create left {:?} in {}",
        run_dir_entries(&d.prefix),
        run_sandboxes().display()
    );
    // With descriptors back, creates work again.
    block_on_within(60, "a create after the limit is restored", async {
        let c = d.client();
        let sb = c
            .create_sandbox(&spec_body(serde_json::json!({})))
            .await
            .unwrap();
        c.delete_sandbox(&sb.id).await.unwrap();
    });
}

#[test]
fn a_run_directory_a_crash_left_is_swept_on_start() {
    let mut d = Daemon::start(None);
    d.terminate();
    // What a daemon killed in the middle of publishing a sandbox's run directory
    // leaves: a temporary directory with its lock file, named after the dead
    // process; and a published one whose PID 1 is gone.
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let base = run_sandboxes();
    let half = base.join(format!(".new-{}crashed-{dead_pid}", d.prefix));
    let whole = base.join(format!("{}gone", d.prefix));
    for dir in [&half, &whole] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("alive"), "").unwrap();
    }
    d.spawn();
    // Answering requests means the start-up (its reconcile and sweep) is done.
    block_on_within(30, "the restarted daemon", async {
        d.client().health().await.unwrap();
    });
    let left: Vec<&Path> = [half.as_path(), whole.as_path()]
        .into_iter()
        .filter(|p| p.exists())
        .collect();
    for p in &left {
        let _ = std::fs::remove_dir_all(p);
    }
    assert!(left.is_empty(), "not swept on start: {left:?}");
}
