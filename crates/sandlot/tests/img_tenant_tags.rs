//! Image tags are per tenant: a tenant's tag is its own, the operator's names are
//! the operator's, and one tenant never sees or resolves another's. Needs root.

mod api_support;
mod img_support;

use api_support::{rt, Daemon};
use serde_json::{json, Value};

async fn run(c: &sandlot_client::Client, id: &str, cmd: &str) -> String {
    let o = c.run(id, &["/bin/sh", "-c", cmd]).await.unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn create(c: &sandlot_client::Client, image: &str) -> Result<String, sandlot_client::Error> {
    let v = c
        .call_json("POST", "/v1/sandboxes", Some(&json!({"image": image})))
        .await?;
    Ok(v["id"].as_str().unwrap().to_string())
}

/// Ids and tags of the images a principal lists.
async fn listed(c: &sandlot_client::Client) -> Vec<(String, Value)> {
    let l = c.call_json("GET", "/v1/images", None).await.unwrap();
    l["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["id"].as_str().unwrap().to_string(), i["tags"].clone()))
        .collect()
}

/// Found by an outside review: a tenant's `image snapshot --tag ops/base:1` took
/// the operator's tag over: the operator's next create from `ops/base:1` started
/// the tenant's snapshot, and a push of that name would publish it.
#[test]
fn a_tenants_tag_never_takes_the_operators_or_reaches_another_tenant() {
    let mut d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 0);
    let (code, out, err) = d.cli(&[
        "image",
        "import",
        archive.to_str().unwrap(),
        "--tag",
        "ops/base:1",
    ]);
    assert_eq!(code, 0, "{err}");
    let base = out.trim().to_string();
    let op = d.client();
    let alpha = d.tcp(Some(&d.token("alpha")));
    let beta = d.tcp(Some(&d.token("beta")));
    let rt = rt();
    let snap = rt.block_on(async {
        // Alpha plants a file and snapshots under the operator's name, and under
        // a name of its own.
        let sa = create(&alpha, "ops/base:1").await.unwrap();
        run(&alpha, &sa, "echo alpha > /planted").await;
        let snap = alpha
            .call_json(
                "POST",
                &format!("/v1/sandboxes/{sa}/snapshot"),
                Some(&json!({"tag": "ops/base:1"})),
            )
            .await
            .unwrap();
        assert_eq!(snap["tags"], json!(["ops/base:1"]), "{snap}");
        let owner = snap["owner"].clone();
        let snap = snap["id"].as_str().unwrap().to_string();
        alpha
            .call_json(
                "POST",
                &format!("/v1/sandboxes/{sa}/snapshot"),
                Some(&json!({"tag": "alpha/own:1"})),
            )
            .await
            .unwrap();

        // The operator's name is still the operator's image: inspect, create...
        let v = op
            .call_json("GET", "/v1/images/ops/base:1", None)
            .await
            .unwrap();
        assert_eq!(v["id"], base.as_str());
        let so = create(&op, "ops/base:1").await.unwrap();
        assert_eq!(
            run(&op, &so, "cat /planted 2>/dev/null || echo none").await,
            "none\n"
        );
        // ... and the operator sees alpha's tag only as alpha's, on alpha's image.
        assert_eq!(owner, "alpha");
        let v = op
            .call_json("GET", &format!("/v1/images/{snap}"), None)
            .await
            .unwrap();
        assert_eq!(v["tags"], json!([]), "{v}");
        // (The second snapshot of the unchanged sandbox is the same image.)
        assert_eq!(
            v["tenant_tags"],
            json!([
                {"tenant": "alpha", "name": "alpha/own:1"},
                {"tenant": "alpha", "name": "ops/base:1"}
            ]),
            "{v}"
        );

        // Beta never sees or resolves alpha's tags: the operator's image, and no
        // alpha/own.
        let v = beta
            .call_json("GET", "/v1/images/ops/base:1", None)
            .await
            .unwrap();
        assert_eq!(v["id"], base.as_str());
        let sb = create(&beta, "ops/base:1").await.unwrap();
        assert_eq!(
            run(&beta, &sb, "cat /planted 2>/dev/null || echo none").await,
            "none\n"
        );
        let e = beta
            .call_json("GET", "/v1/images/alpha/own:1", None)
            .await
            .unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 404, "{e}");
        let e = create(&beta, "alpha/own:1").await.unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 400, "{e}");
        assert_eq!(listed(&beta).await, [(base.clone(), json!(["ops/base:1"]))]);
        let e = beta
            .call_json("GET", &format!("/v1/images/export?ref={snap}"), None)
            .await
            .unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 404, "{e}");

        // Alpha's name is its own snapshot; the shared one it hides is not shown
        // on the operator's image to alpha.
        let sa2 = create(&alpha, "ops/base:1").await.unwrap();
        assert_eq!(run(&alpha, &sa2, "cat /planted").await, "alpha\n");
        let mine = listed(&alpha).await;
        assert!(mine.contains(&(base.clone(), json!([]))), "{mine:?}");
        assert!(
            mine.contains(&(snap.clone(), json!(["alpha/own:1", "ops/base:1"]))),
            "{mine:?}"
        );
        // Pushing is the operator's, and by the operator's names.
        let e = alpha
            .call_json(
                "POST",
                "/v1/images/ops/base:1/push",
                Some(&json!({"reference": "127.0.0.1:9/ops/base:1"})),
            )
            .await
            .unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 403, "{e}");
        for id in [sa, sa2, sb, so] {
            op.delete_sandbox(&id).await.unwrap();
        }
        snap
    });
    // The operator's push of the name resolves the operator's image (the push
    // itself fails: nothing listens on that port).
    let (code, _, _) = d.cli(&["image", "push", "ops/base:1", "127.0.0.1:9/ops/base:1"]);
    assert_ne!(code, 0);
    let log = d.log();
    let pushed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("127.0.0.1:9/ops/base:1"))
        .collect();
    assert!(pushed.iter().any(|l| l.contains(&base)), "{pushed:?}");
    assert!(!pushed.iter().any(|l| l.contains(&snap)), "{pushed:?}");

    // Removing alpha's snapshot takes its tags and its owner with it: the same
    // image brought back by the operator (an export imported again, as a pull
    // would) is the operator's, shared, and alpha's name is gone.
    let saved = tmp.join("snap.tar");
    let (code, _, err) = d.cli(&["image", "export", &snap, "-o", saved.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let images = rt.block_on(listed(&op));
    for (id, _) in images.iter().filter(|(id, _)| *id != base) {
        // The deleted sandboxes' leases go as their teardown ends.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let (code, _, err) = d.cli(&["image", "rm", id]);
            if code == 0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{err}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    let (code, out, err) = d.cli(&["image", "import", saved.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), snap);
    rt.block_on(async {
        let v = op
            .call_json("GET", &format!("/v1/images/{snap}"), None)
            .await
            .unwrap();
        assert!(
            v.get("owner").is_none() && v.get("tenant_tags").is_none(),
            "{v}"
        );
        let v = beta
            .call_json("GET", &format!("/v1/images/{snap}"), None)
            .await
            .unwrap();
        assert_eq!(v["id"], snap.as_str());
        let v = alpha
            .call_json("GET", "/v1/images/ops/base:1", None)
            .await
            .unwrap();
        assert_eq!(v["id"], base.as_str());
    });
    d.shutdown();
}
