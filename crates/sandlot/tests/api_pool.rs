//! Warm pools through a real daemon: a create of a pooled shape claims a
//! pre-started sandbox, which takes the request's environment, user and working
//! directory, is handed out once only, and is torn down like any other; the pool
//! refills; unclaimed sandboxes leave nothing behind on shutdown or after a
//! `kill -9` of the daemon.

mod api_support;

use std::collections::BTreeSet;

use api_support::{event_kinds, eventually, rt, Daemon};
use sandlot_client::{Client, CreateSandbox, SandboxState};
use serde_json::json;

const POOL: &str = r#"
[quotas]
max_sandboxes = 6

[[pools]]
name = "default"
size = 2

[[pools]]
name = "small"
size = 1
spec = { resources = { memory = "128M" }, hostname = "pooled" }

[[pools]]
name = "net"
size = 1
spec = { network = { mode = "allow" } }
"#;

fn body(v: serde_json::Value) -> CreateSandbox {
    let serde_json::Value::Object(spec) = v else {
        panic!("a JSON object")
    };
    CreateSandbox {
        spec,
        ..Default::default()
    }
}

/// The value of a metric line `name{pool="pool"} V`.
async fn pool_metric(c: &Client, name: &str, pool: &str) -> Option<u64> {
    let text = c.metrics().await.ok()?;
    let key = format!("{name}{{pool=\"{pool}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

async fn wait_ready(c: &Client, pool: &str, n: u64) {
    eventually(30, &format!("pool {pool} to hold {n} ready"), || async {
        pool_metric(c, "sandlot_pool_ready", pool).await == Some(n)
    })
    .await;
}

#[test]
fn pool_claims_are_single_use_and_take_request_defaults() {
    let d = Daemon::start(Some(POOL));
    let c = d.client();
    rt().block_on(async {
        wait_ready(&c, "default", 2).await;
        wait_ready(&c, "small", 1).await;

        // A claim runs with the request's env, workdir and user, not the pool's.
        let sb = c
            .create_sandbox(&body(json!({
                "env": {"GREETING": "from-request"},
                "workdir": "/tmp",
                "user": "65534:65534",
                "timeout": "2m",
            })))
            .await
            .unwrap();
        assert!(sb.id.starts_with(&d.prefix), "{}", sb.id);
        let out = c
            .run(
                &sb.id,
                &[
                    "sh",
                    "-c",
                    "echo $GREETING; pwd; id -u; echo $LANG $HOSTNAME",
                ],
            )
            .await
            .unwrap();
        // The base environment is what a cold start would have (LANG, HOSTNAME).
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!(
                "from-request\n/tmp\n65534\nC.UTF-8 sandlot-{}\n",
                &sb.id[..12.min(sb.id.len())]
            )
        );
        assert_eq!(
            pool_metric(&c, "sandlot_pool_hits_total", "default").await,
            Some(1)
        );
        // A claim that takes the request's settings is recorded running once it
        // has them; the record has its start and the log reads like a cold create's.
        assert_eq!(sb.state, SandboxState::Running);
        assert!(sb.started_at.is_some(), "{sb:?}");
        assert_eq!(event_kinds(&c, &sb.id).await, ["created", "started"]);
        // The other pool's shape (hostname, memory) is served by that pool.
        let small = c
            .create_sandbox(&body(
                json!({"resources": {"memory": "128M"}, "hostname": "pooled"}),
            ))
            .await
            .unwrap();
        let out = c.run(&small.id, &["hostname"]).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "pooled\n");
        // A claim with nothing to change is admitted running, in one commit: the
        // same record and log.
        assert_eq!(small.state, SandboxState::Running);
        assert!(small.started_at.is_some(), "{small:?}");
        assert_eq!(event_kinds(&c, &small.id).await, ["created", "started"]);
        assert_eq!(
            pool_metric(&c, "sandlot_pool_hits_total", "small").await,
            Some(1)
        );

        // A pooled network slot takes the request's allow rules at claim.
        wait_ready(&c, "net", 1).await;
        let net = c
            .create_sandbox(&body(json!({"network": {"mode": "allow",
                "allow": [{"domain": "pooled.test", "ports": [443]}]}})))
            .await
            .unwrap();
        assert_eq!(
            pool_metric(&c, "sandlot_pool_hits_total", "net").await,
            Some(1)
        );
        let policy = c.get_network(&net.id).await.unwrap();
        assert_eq!(policy["mode"], "allow", "{policy}");
        assert_eq!(policy["allow"][0]["domain"], "pooled.test", "{policy}");
        // For the caller that is the policy it was created with, not a change.
        let events = c.events(&net.id).await.unwrap();
        assert!(
            !events.iter().any(|e| e.kind == "network"),
            "a claim is not a policy change: {events:?}"
        );
        c.delete_sandbox(&net.id).await.unwrap();

        // Concurrent claims beyond the pool's size: every sandbox is distinct and
        // sees only its own files (none is handed out twice).
        let creates = (0..4).map(|_| {
            let c = c.clone();
            async move { c.create_sandbox(&CreateSandbox::default()).await }
        });
        let created: Vec<_> = futures_util::future::join_all(creates)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let ids: BTreeSet<_> = created
            .iter()
            .map(|s| s.id.clone())
            .chain([sb.id.clone(), small.id.clone()])
            .collect();
        assert_eq!(ids.len(), 6, "ids: {ids:?}");
        for s in &created {
            c.run(&s.id, &["sh", "-c", &format!("echo {} > /tmp/owner", s.id)])
                .await
                .unwrap();
        }
        for s in &created {
            let out = c.run(&s.id, &["cat", "/tmp/owner"]).await.unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), s.id);
        }
        // The quota counts claimed sandboxes: a seventh is refused, and the pooled
        // sandbox it would have claimed stays in the pool.
        wait_ready(&c, "default", 2).await;
        let e = c
            .create_sandbox(&CreateSandbox::default())
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(429), "{e}");
        assert_eq!(
            pool_metric(&c, "sandlot_pool_ready", "default").await,
            Some(2)
        );
        let misses = pool_metric(&c, "sandlot_pool_misses_total", "default")
            .await
            .unwrap();
        let hits = pool_metric(&c, "sandlot_pool_hits_total", "default")
            .await
            .unwrap();
        assert_eq!(hits + misses, 5, "hits {hits} misses {misses}");

        // A deleted pooled sandbox is gone for good; the pool refills with new ones.
        c.delete_sandbox(&sb.id).await.unwrap();
        let again = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        assert_ne!(again.id, sb.id);
        // A claim that asks for the pool's own defaults skips the agent's
        // `configure`: it still has its own base environment.
        let out = c
            .run(
                &again.id,
                &["sh", "-c", "echo $GREETING; id -u; echo $LANG $HOSTNAME"],
            )
            .await;
        assert_eq!(
            String::from_utf8_lossy(&out.unwrap().stdout),
            format!(
                "\n0\nC.UTF-8 sandlot-{}\n",
                &again.id[..12.min(again.id.len())]
            )
        );
    });
    // Shutdown deletes the claimed sandboxes, stops the daemon (which tears down
    // the unclaimed ones) and asserts nothing of this daemon is left.
    drop(d);
}

#[test]
fn unclaimed_pool_sandboxes_are_swept_after_kill9() {
    let mut d = Daemon::start(Some(POOL));
    let c = d.client();
    let before: Vec<String> = rt().block_on(async {
        wait_ready(&c, "default", 2).await;
        wait_ready(&c, "small", 1).await;
        wait_ready(&c, "net", 1).await;
        d.leftovers()
    });
    let run_dirs = |l: &[String]| -> BTreeSet<String> {
        l.iter()
            .filter(|p| p.starts_with("/run/sandlot/sandboxes/"))
            .cloned()
            .collect()
    };
    let old = run_dirs(&before);
    assert_eq!(old.len(), 4, "four pooled sandboxes: {before:?}");
    d.kill9();
    // They outlive the daemon (nobody claimed them; no record exists)...
    assert_eq!(run_dirs(&d.leftovers()), old);
    d.spawn();
    let c = d.client();
    rt().block_on(async {
        wait_ready(&c, "default", 2).await;
        wait_ready(&c, "small", 1).await;
        wait_ready(&c, "net", 1).await;
        // ...and the restarted daemon removed them and started fresh ones.
        let now = run_dirs(&d.leftovers());
        assert_eq!(now.len(), 4, "{now:?}");
        assert!(now.is_disjoint(&old), "old {old:?} now {now:?}");
        // Nothing shows up as a sandbox of any tenant.
        let listed = c
            .list_sandboxes(&sandlot_client::ListFilter::default())
            .await
            .unwrap();
        assert!(listed.is_empty(), "{listed:?}");
    });
    drop(d);
}

/// An adaptive pool (`max_size`) grows by one per create that found it empty, so
/// that the next burst of the same size is all hits, and shrinks back toward its
/// size once misses stop.
#[test]
fn adaptive_pool_grows_with_misses_and_shrinks_when_idle() {
    let d = Daemon::start(Some(
        "[[pools]]\nname = \"adaptive\"\nsize = 1\nmax_size = 4\nshrink_after = \"2s\"\n\
         spec = { hostname = \"adaptive\" }\n",
    ));
    let c = d.client();
    rt().block_on(async {
        let shaped = || body(json!({"hostname": "adaptive"}));
        wait_ready(&c, "adaptive", 1).await;
        let burst = |c: Client| async move {
            let creates = (0..4).map(|_| {
                let c = c.clone();
                async move { c.create_sandbox(&shaped()).await.unwrap() }
            });
            let made = futures_util::future::join_all(creates).await;
            for sb in made {
                c.delete_sandbox(&sb.id).await.unwrap();
            }
        };
        burst(c.clone()).await;
        assert_eq!(
            pool_metric(&c, "sandlot_pool_misses_total", "adaptive").await,
            Some(3)
        );
        assert_eq!(
            pool_metric(&c, "sandlot_pool_target", "adaptive").await,
            Some(4)
        );
        // Refilled to the grown target: the same burst again is all hits.
        wait_ready(&c, "adaptive", 4).await;
        burst(c.clone()).await;
        assert_eq!(
            pool_metric(&c, "sandlot_pool_hits_total", "adaptive").await,
            Some(5)
        );
        assert_eq!(
            pool_metric(&c, "sandlot_pool_misses_total", "adaptive").await,
            Some(3)
        );
        // No misses for a while: back to its size, extra sandboxes torn down.
        eventually(30, "the adaptive pool to shrink back to 1", || async {
            pool_metric(&c, "sandlot_pool_target", "adaptive").await == Some(1)
                && pool_metric(&c, "sandlot_pool_ready", "adaptive").await == Some(1)
        })
        .await;
    });
}
