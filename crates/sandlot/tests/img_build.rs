//! Declarative builds end to end (`sandlot image build`): a TOML spec and a
//! Dockerfile on an imported base image, every `run` step in a real sandbox;
//! an unchanged rebuild is all cache hits with the same image id, changing a
//! copied file rebuilds from that step; bad specs fail naming the problem and tag
//! nothing. No network (the base is an imported archive). Needs root.

mod api_support;
mod img_support;

use std::time::Instant;

use api_support::{rt, Daemon};
use serde_json::json;

fn steps_cached(stderr: &str) -> Vec<bool> {
    stderr
        .lines()
        .filter(|l| l.starts_with("step "))
        .map(|l| l.ends_with("(cached)"))
        .collect()
}

#[test]
fn build_toml_and_dockerfile_with_layer_cache() {
    let mut d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 1);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");

    let ctx = tmp.join("ctx");
    std::fs::create_dir_all(ctx.join("app")).unwrap();
    std::fs::write(ctx.join("app/hello.txt"), "hello\n").unwrap();
    let spec = tmp.join("spec.toml");
    std::fs::write(
        &spec,
        r#"
from = "test/base:1"
[[steps]]
env = { GREETING = "hi there" }
[[steps]]
workdir = "/srv"
[[steps]]
copy = ["app", "/srv/app"]
[[steps]]
run = "cat app/hello.txt > out.txt && echo $GREETING >> out.txt && echo built-by-run"
[[steps]]
user = "1000"
"#,
    )
    .unwrap();
    let build = |extra: &[&str]| {
        let mut a = vec![
            "image",
            "build",
            "-f",
            spec.to_str().unwrap(),
            "--tag",
            "test/built:1",
        ];
        a.extend_from_slice(extra);
        a.push(ctx.to_str().unwrap());
        let t = Instant::now();
        let r = d.cli(&a);
        (r, t.elapsed())
    };
    let ((code, out, err), cold) = build(&[]);
    assert_eq!(code, 0, "{out}{err}");
    let id1 = out.trim().to_string();
    assert!(id1.starts_with("sha256:"), "{out}");
    assert_eq!(steps_cached(&err), vec![false; 5], "{err}");
    assert!(
        err.contains("built-by-run"),
        "the run step's output is not streamed: {err}"
    );

    let c = d.client();
    let rt = rt();
    rt.block_on(async {
        let sb = c
            .call_json(
                "POST",
                "/v1/sandboxes",
                Some(&json!({"image": "test/built:1"})),
            )
            .await
            .unwrap();
        let id = sb["id"].as_str().unwrap().to_string();
        let o = c
            .run(&id, &["/bin/sh", "-c", "cat out.txt; pwd; echo $GREETING"])
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "hello\nhi there\n/srv\nhi there\n"
        );
        let img = c
            .call_json("GET", "/v1/images/test/built:1", None)
            .await
            .unwrap();
        assert_eq!(img["user"], "1000");
        assert_eq!(img["source"], "build");
        // base (2 layers) + copy + run.
        assert_eq!(img["layers"].as_array().unwrap().len(), 4, "{img}");
        c.delete_sandbox(&id).await.unwrap();
    });

    // Unchanged: every step a cache hit, same image.
    let ((code, out, err), warm) = build(&[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), id1);
    assert_eq!(steps_cached(&err), vec![true; 5], "{err}");
    eprintln!(
        "build figures: cold build {:.2}s, cached rebuild {:.3}s",
        cold.as_secs_f64(),
        warm.as_secs_f64()
    );

    // A copied file changes: steps before the copy stay cached, the rest rebuild.
    std::fs::write(ctx.join("app/hello.txt"), "changed\n").unwrap();
    let ((code, out, err), _) = build(&[]);
    assert_eq!(code, 0, "{err}");
    assert_ne!(out.trim(), id1);
    assert_eq!(
        steps_cached(&err),
        vec![true, true, false, false, false],
        "{err}"
    );

    // A Dockerfile on the same base.
    let df = tmp.join("Dockerfile");
    std::fs::write(
        &df,
        "FROM test/base:1\nENV A=1\nCOPY app/hello.txt /etc/hello\nRUN cat /etc/hello > /etc/copied \\\n && echo $A >> /etc/copied\nWORKDIR /etc\n",
    )
    .unwrap();
    let (code, out, err) = d.cli(&[
        "image",
        "build",
        "-f",
        df.to_str().unwrap(),
        "--tag",
        "test/df:1",
        ctx.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    rt.block_on(async {
        let sb = c
            .call_json(
                "POST",
                "/v1/sandboxes",
                Some(&json!({"image": "test/df:1"})),
            )
            .await
            .unwrap();
        let id = sb["id"].as_str().unwrap().to_string();
        let o = c
            .run(&id, &["/bin/sh", "-c", "cat copied; pwd"])
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "changed\n1\n/etc\n");
        c.delete_sandbox(&id).await.unwrap();
    });

    // Bad input: clear errors, nothing tagged.
    let cases: &[(&str, &str, &str)] = &[
        (
            "bad1.Dockerfile",
            "FROM test/base:1\nRUN true\nEXPOSE 80\n",
            "line 3: unsupported instruction EXPOSE",
        ),
        (
            "bad2.Dockerfile",
            "FROM test/base:1\nCOPY nothere /x\n",
            "nothere is not in the build context",
        ),
        (
            "bad3.Dockerfile",
            "FROM test/base:1\nCOPY ../outside /x\n",
            "escapes the build context",
        ),
        (
            "bad4.Dockerfile",
            "FROM test/base:1\nRUN exit 3\n",
            "exit code 3",
        ),
        (
            "bad5.toml",
            "from = \"test/base:1\"\n[[steps]]\napt_install = [\"git\"]\n",
            "needs the network",
        ),
        (
            "bad6.Dockerfile",
            "FROM no/such:image\nRUN true\n",
            "no image no/such:image",
        ),
    ];
    for (name, text, want) in cases {
        let p = tmp.join(name);
        std::fs::write(&p, text).unwrap();
        let (code, out, err) = d.cli(&[
            "image",
            "build",
            "-f",
            p.to_str().unwrap(),
            "--tag",
            "test/bad:1",
            ctx.to_str().unwrap(),
        ]);
        assert_ne!(code, 0, "{name} built: {out}");
        assert!(err.contains(want), "{name}: {err}");
    }
    let imgs = rt.block_on(c.call_json("GET", "/v1/images", None)).unwrap();
    assert!(
        !imgs.to_string().contains("test/bad"),
        "a failed build tagged an image: {imgs}"
    );
    // No build sandbox outlives its step; no context staging is left.
    let left = rt
        .block_on(c.call_json("GET", "/v1/sandboxes", None))
        .unwrap();
    assert_eq!(left["sandboxes"], json!([]), "{left}");
    let staging: Vec<_> = std::fs::read_dir(d.data_dir().join("images/tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(staging.is_empty(), "staging left: {staging:?}");
    d.shutdown();
}

/// The attack: one `COPY` whose first source puts a link in the layer being built
/// (`a/etc -> VICTIM`, standing in for `/etc`) and whose second source has files
/// under the same path (`b/etc/cron.d/x`). The daemon stages copies as root: it
/// used to follow the link, change the modes of the victim directories and write
/// the file into them. The build must fail naming the link, with the victim as it
/// was and nothing staged left behind.
#[test]
fn a_build_context_cannot_write_or_chmod_host_files_through_a_link_it_copies() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 1);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");

    let victim = tmp.join("victim");
    std::fs::create_dir_all(victim.join("cron.d")).unwrap();
    let chmod = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    chmod(&victim, 0o750);
    chmod(&victim.join("cron.d"), 0o755);
    let ctx = tmp.join("ctx");
    std::fs::create_dir_all(ctx.join("a")).unwrap();
    std::os::unix::fs::symlink(&victim, ctx.join("a/etc")).unwrap();
    std::fs::create_dir_all(ctx.join("b/etc/cron.d")).unwrap();
    std::fs::write(ctx.join("b/etc/cron.d/x"), "* * * * * root touch /pwned\n").unwrap();
    chmod(&ctx.join("b/etc"), 0o777);
    chmod(&ctx.join("b/etc/cron.d"), 0o777);
    let df = tmp.join("Dockerfile");
    std::fs::write(&df, "FROM test/base:1\nCOPY a b /\n").unwrap();
    let (code, out, err) = d.cli(&[
        "image",
        "build",
        "-f",
        df.to_str().unwrap(),
        "--tag",
        "test/linked:1",
        ctx.to_str().unwrap(),
    ]);
    assert_ne!(code, 0, "the build went through the link: {out}");
    assert!(
        err.contains("goes through /etc, a symbolic link this copy put in the image"),
        "{err}"
    );
    assert!(!victim.join("cron.d/x").exists(), "a host file was written");
    assert_eq!(
        (mode(&victim), mode(&victim.join("cron.d"))),
        (0o750, 0o755),
        "host directories were chmodded"
    );
    let staging: Vec<_> = std::fs::read_dir(d.data_dir().join("images/tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(staging.is_empty(), "staging left: {staging:?}");
    d.shutdown();
}

/// `WORKDIR` makes its directory, owned by the image's user, as Docker does: the
/// next `RUN` works in it and sandboxes of the image start there (both used to
/// fail: the directory did not exist, exit 127).
#[test]
fn a_dockerfile_workdir_is_made_for_the_steps_after_it() {
    let mut d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 0);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let ctx = tmp.join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    let df = ctx.join("Dockerfile");
    std::fs::write(
        &df,
        "FROM test/base:1\nUSER user\nWORKDIR /newdir/sub\nRUN pwd > here && id -u >> here\n",
    )
    .unwrap();
    let build = |tag: &str| {
        d.cli(&[
            "image",
            "build",
            "-f",
            df.to_str().unwrap(),
            "--tag",
            tag,
            ctx.to_str().unwrap(),
        ])
    };
    let (code, out, err) = build("test/wd:1");
    assert_eq!(code, 0, "{out}{err}");
    let c = d.client();
    rt().block_on(async {
        let sb = c
            .call_json(
                "POST",
                "/v1/sandboxes",
                Some(&json!({"image": "test/wd:1"})),
            )
            .await
            .unwrap();
        let id = sb["id"].as_str().unwrap().to_string();
        let o = c
            .run(&id, &["/bin/sh", "-c", "cat here; pwd; stat -c %u ."])
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "/newdir/sub\n1000\n/newdir/sub\n1000\n",
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        c.delete_sandbox(&id).await.unwrap();
    });
    d.shutdown();
}

/// A step whose command fails is a build failure (`build_failed`, naming the step
/// and its exit status), not a bad request: the spec was fine.
#[test]
fn a_failing_step_is_a_build_failure() {
    let mut d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 0);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let ctx = tmp.join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    let df = ctx.join("Dockerfile");
    std::fs::write(&df, "FROM test/base:1\nRUN echo failing; exit 3\n").unwrap();
    let (code, out, err) = d.cli(&[
        "image",
        "build",
        "-f",
        df.to_str().unwrap(),
        "--tag",
        "test/fails:1",
        ctx.to_str().unwrap(),
    ]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("RUN echo failing; exit 3") && err.contains("exit code 3"),
        "{err}"
    );
    assert!(err.contains("(build_failed)"), "{err}");
    d.shutdown();
}

/// `sandlot ARGS` as the tenant holding `token`, over the daemon's TCP listener.
fn cli_as(d: &Daemon, token: &str, args: &[&str]) -> (i32, String, String) {
    let o = std::process::Command::new(api_support::sandlot())
        .args(args)
        .env("SANDLOT_URL", format!("127.0.0.1:{}", d.port))
        .env("SANDLOT_TOKEN", token)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A tenant builds over TCP: on a shared base, with its images, its tag and its
/// build cache its own; another tenant neither sees them nor gets its cached
/// steps; a debian base is not bootstrapped for a tenant, and a build with the
/// network is held to the operator's ceiling.
#[test]
fn a_tenant_builds_over_tcp_and_owns_what_it_built() {
    let mut d = Daemon::start(Some("[network]\nceiling = \"allow\"\n"));
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 0);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (acme, other) = (d.token("acme"), d.token("other"));
    let ctx = tmp.join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(ctx.join("f"), "from the context\n").unwrap();
    let df = tmp.join("Dockerfile");
    std::fs::write(
        &df,
        "FROM test/base:1\nENV A=1\nCOPY f /f\nRUN cat /f > /g; echo $A >> /g\n",
    )
    .unwrap();
    let build = |token: &str| {
        let (code, out, err) = cli_as(
            &d,
            token,
            &[
                "image",
                "build",
                "-f",
                df.to_str().unwrap(),
                "--tag",
                "mine/app:1",
                ctx.to_str().unwrap(),
            ],
        );
        assert_eq!(code, 0, "{out}{err}");
        (out.trim().to_string(), steps_cached(&err))
    };
    let (id, cached) = build(&acme);
    assert!(id.starts_with("sha256:"), "{id}");
    assert_eq!(cached, vec![false; 3]);

    let rt = rt();
    let (ca, co, op) = (d.tcp(Some(&acme)), d.tcp(Some(&other)), d.client());
    rt.block_on(async {
        let img = ca
            .call_json("GET", "/v1/images/mine/app:1", None)
            .await
            .unwrap();
        assert_eq!(
            (img["id"].as_str(), img["owner"].as_str()),
            (Some(id.as_str()), Some("acme")),
            "{img}"
        );
        assert_eq!(img["tags"], json!(["mine/app:1"]), "{img}");
        let sb = ca
            .call_json(
                "POST",
                "/v1/sandboxes",
                Some(&json!({"image": "mine/app:1"})),
            )
            .await
            .unwrap();
        let sid = sb["id"].as_str().unwrap().to_string();
        let o = ca.run(&sid, &["cat", "/g"]).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "from the context\n1\n");
        ca.delete_sandbox(&sid).await.unwrap();
        // Not another tenant's, by name or id; not the operator's name.
        assert!(co
            .call_json("GET", "/v1/images/mine/app:1", None)
            .await
            .is_err());
        assert!(co
            .call_json("GET", &format!("/v1/images/{id}"), None)
            .await
            .is_err());
        assert!(op
            .call_json("GET", "/v1/images/mine/app:1", None)
            .await
            .is_err());
        let mine = op
            .call_json("GET", &format!("/v1/images/{id}"), None)
            .await
            .unwrap();
        assert_eq!(
            mine["tenant_tags"],
            json!([{"tenant": "acme", "name": "mine/app:1"}]),
            "{mine}"
        );
        // Every step image the build made is the tenant's.
        let all = op.call_json("GET", "/v1/images", None).await.unwrap();
        let built: Vec<_> = all["images"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["source"] == "build")
            .collect();
        assert_eq!(built.len(), 3, "{all}");
        assert!(built.iter().all(|i| i["owner"] == "acme"), "{all}");
    });

    // The other tenant's same build makes its own images, none from acme's cache.
    let (id2, cached) = build(&other);
    assert_eq!(cached, vec![false; 3]);
    assert_ne!(id2, id);
    rt.block_on(async {
        let img = co
            .call_json("GET", "/v1/images/mine/app:1", None)
            .await
            .unwrap();
        assert_eq!(
            (img["id"].as_str(), img["owner"].as_str()),
            (Some(id2.as_str()), Some("other")),
            "{img}"
        );
        let img = ca
            .call_json("GET", "/v1/images/mine/app:1", None)
            .await
            .unwrap();
        assert_eq!(img["id"].as_str(), Some(id.as_str()), "{img}");
    });
    // acme's rebuild: its own cache.
    assert_eq!(build(&acme), (id.clone(), vec![true; 3]));

    // A debian base is the operator's to make; a build with the network is above
    // this daemon's ceiling for a tenant.
    let (bad, net) = (tmp.join("debian.Dockerfile"), tmp.join("net.Dockerfile"));
    std::fs::write(&bad, "FROM debian:nosuchsuite\nRUN true\n").unwrap();
    std::fs::write(&net, "FROM test/base:1\nRUN true\n").unwrap();
    let (code, out, err) = cli_as(
        &d,
        &acme,
        &[
            "image",
            "build",
            "-f",
            bad.to_str().unwrap(),
            ctx.to_str().unwrap(),
        ],
    );
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("the operator makes debian bases"), "{err}");
    let (code, out, err) = cli_as(
        &d,
        &acme,
        &[
            "image",
            "build",
            "--network",
            "-f",
            net.to_str().unwrap(),
            ctx.to_str().unwrap(),
        ],
    );
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("above the operator's ceiling"), "{err}");
    assert!(
        !std::fs::read_dir(d.data_dir().join("images/tmp"))
            .unwrap()
            .any(|_| true),
        "staging left"
    );
    d.shutdown();
}

/// `images.build_timeout` ends a build whose step runs past it, for a tenant as
/// for the operator, and its step's sandbox with it.
#[test]
fn a_build_past_the_operators_time_limit_fails() {
    let mut d = Daemon::start(Some("[images]\nbuild_timeout = \"3s\"\n"));
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 0);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let ctx = tmp.join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    let df = tmp.join("Dockerfile");
    std::fs::write(&df, "FROM test/base:1\nRUN sleep 600\n").unwrap();
    let token = d.token("acme");
    let (code, out, err) = cli_as(
        &d,
        &token,
        &[
            "image",
            "build",
            "-f",
            df.to_str().unwrap(),
            "--tag",
            "slow:1",
            ctx.to_str().unwrap(),
        ],
    );
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("images.build_timeout = 3s") && err.contains("(build_failed)"),
        "{err}"
    );
    let rt = rt();
    let left = rt
        .block_on(
            d.client()
                .call_json("GET", "/v1/sandboxes?state=live", None),
        )
        .unwrap();
    assert_eq!(left["sandboxes"], json!([]), "{left}");
    d.shutdown();
}

/// A tenant runs at most `images.max_builds_per_tenant` builds at once, and a
/// context larger than what it may expand to is refused while it is staged (it
/// was staged whole on the daemon's disk first, whatever its size).
#[test]
fn a_tenants_builds_are_capped_and_their_context_bounded() {
    let mut d = Daemon::start(Some(
        "[images]\nbuild_timeout = \"20s\"\nmax_builds_per_tenant = 1\nmax_expanded_size = \"1M\"\n",
    ));
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 0);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let token = d.token("acme");
    let ctx = tmp.join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    let slow = tmp.join("slow.Dockerfile");
    std::fs::write(&slow, "FROM test/base:1\nRUN sleep 600\n").unwrap();
    let mut first = std::process::Command::new(api_support::sandlot())
        .args([
            "image",
            "build",
            "-f",
            slow.to_str().unwrap(),
            ctx.to_str().unwrap(),
        ])
        .env("SANDLOT_URL", format!("127.0.0.1:{}", d.port))
        .env("SANDLOT_TOKEN", &token)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The first build runs once its step's sandbox does.
    let c = d.client();
    let rt = rt();
    rt.block_on(api_support::eventually(
        15,
        "the first build's step runs",
        || async {
            let l = c.call_json("GET", "/v1/sandboxes", None).await.unwrap();
            !l["sandboxes"].as_array().unwrap().is_empty()
        },
    ));
    let quick = tmp.join("quick.Dockerfile");
    std::fs::write(&quick, "FROM test/base:1\nENV A=1\n").unwrap();
    let (code, out, err) = cli_as(
        &d,
        &token,
        &[
            "image",
            "build",
            "-f",
            quick.to_str().unwrap(),
            ctx.to_str().unwrap(),
        ],
    );
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("images.max_builds_per_tenant = 1"), "{err}");
    // Another tenant is not held back by acme's build.
    let (code, out, err) = cli_as(
        &d,
        &d.token("other"),
        &[
            "image",
            "build",
            "-f",
            quick.to_str().unwrap(),
            ctx.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let _ = first.kill();
    let _ = first.wait();
    // Once acme's build is over, it builds again; a context past what may be
    // expanded is refused while it is sent.
    let big = tmp.join("big");
    std::fs::create_dir_all(&big).unwrap();
    std::fs::write(big.join("blob"), vec![7u8; 2 << 20]).unwrap();
    rt.block_on(api_support::eventually(
        30,
        "acme's first build ends",
        || async {
            let (code, _, err) = cli_as(
                &d,
                &token,
                &[
                    "image",
                    "build",
                    "-f",
                    quick.to_str().unwrap(),
                    big.to_str().unwrap(),
                ],
            );
            code != 0 && err.contains("larger than images.max_expanded_size")
        },
    ));
    d.shutdown();
}

/// A tenant's build context is read by the daemon as root: a tar whose first entry
/// is a GNU long name of gigabytes made the tar reader hold all of it in the
/// daemon's memory. What it holds between entries is bounded: the context is
/// refused naming the bound as soon as that much is read, and the daemon answers on.
#[test]
fn a_build_context_with_a_huge_long_name_is_refused_at_the_bound() {
    let mut d = Daemon::start(None);
    let token = d.token("acme");
    // A GNU long-name header announcing 4 GiB, then 4 MiB of it (all the old reader
    // needed to show it buffers: it read on to the end and failed there).
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
    h.set_entry_type(tar::EntryType::GNULongName);
    h.set_size(4 << 30);
    h.set_mode(0o644);
    h.set_cksum();
    let mut body = h.as_bytes().to_vec();
    body.resize(512 + (4 << 20), b'a');
    let ctx = d.dir.join("bomb.tar");
    std::fs::write(&ctx, &body).unwrap();
    let out = std::process::Command::new("curl")
        .args(["-s", "-X", "POST", "--data-binary"])
        .arg(format!("@{}", ctx.display()))
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-H", "Content-Type: application/x-tar"])
        .arg(format!("http://127.0.0.1:{}/v1/images/build", d.port))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("larger than 1024 KiB"), "{text}");
    assert!(!text.contains(&d.dir.display().to_string()), "{text}");
    // The daemon is still there for the next request.
    let c = d.client();
    let l = rt()
        .block_on(c.call_json("GET", "/v1/sandboxes", None))
        .unwrap();
    assert!(l["sandboxes"].is_array());
    d.shutdown();
}
