//! File operations through the protocol, as root and as an unprivileged user.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use common::TestAgent;
use sandlot_guest::client::{
    ErrorCode, FileKind, GuestClient, ListDirRequest, MkdirRequest, ReadFileRequest, RemoveRequest,
    RenameRequest, StatRequest, WatchEvent, WatchEventKind, WatchRequest, WriteFileRequest,
};
use sha2::{Digest, Sha256};

fn as_user<T: HasUser>(mut r: T, u: &str) -> T {
    *r.user() = Some(u.to_string());
    r
}

trait HasUser {
    fn user(&mut self) -> &mut Option<String>;
}
macro_rules! has_user {
    ($($t:ty),*) => {$(impl HasUser for $t { fn user(&mut self) -> &mut Option<String> { &mut self.user } })*};
}
has_user!(
    WriteFileRequest,
    ReadFileRequest,
    StatRequest,
    MkdirRequest,
    RemoveRequest,
    RenameRequest,
    ListDirRequest,
    WatchRequest
);

#[tokio::test]
async fn write_read_stat_with_parents_and_modes() {
    let a = TestAgent::start();
    let c = a.client().await;
    let p = a.dir.str("a/b/c/file.txt");
    let n = c
        .write_file_from(WriteFileRequest::new(&p), b"hello world\n")
        .await
        .unwrap();
    assert_eq!(n, 12);
    assert_eq!(std::fs::read(&p).unwrap(), b"hello world\n");
    assert_eq!(c.read_file_to_vec(&p).await.unwrap(), b"hello world\n");
    let st = c.stat(StatRequest::new(&p)).await.unwrap();
    assert_eq!(st.kind, FileKind::File);
    assert_eq!(st.size, 12);
    assert_eq!(st.mode, 0o644);
    // Partial read.
    let mut r = ReadFileRequest::new(&p);
    r.offset = 6;
    r.length = Some(5);
    let part = c.read_file(r).await.unwrap().read_to_end().await.unwrap();
    assert_eq!(part, b"world");
    // Explicit mode; replacing keeps the old mode unless given.
    let mut w = WriteFileRequest::new(&p);
    w.mode = Some(0o600);
    c.write_file_from(w, b"x").await.unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o600);
    c.write_file_from(WriteFileRequest::new(&p), b"y")
        .await
        .unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o600);
    // Append.
    let mut w = WriteFileRequest::new(&p);
    w.append = true;
    c.write_file_from(w, b"z").await.unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"yz");
    // Without parents: a clear not_found.
    let mut w = WriteFileRequest::new(a.dir.str("missing/dir/f"));
    w.create_parents = false;
    let e = c.write_file_from(w, b"x").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    // Errors name the operation and the path.
    let e = c.read_file_to_vec(&a.dir.str("nope")).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    assert!(
        e.to_string().contains("read_file") && e.to_string().contains("nope"),
        "{e}"
    );
    let e = c.read_file_to_vec(&a.dir.str("a")).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::IsADirectory), "{e}");
    let e = c.stat(StatRequest::new("relative/path")).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
    // A FIFO without a writer must not stall the (single-threaded) agent.
    let fifo = a.dir.join("fifo");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    let fifo = fifo.to_string_lossy().into_owned();
    let e = tokio::time::timeout(Duration::from_secs(5), c.read_file_to_vec(&fifo))
        .await
        .expect("no hang on a FIFO")
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
    assert!(e.to_string().contains("not a regular file"), "{e}");
    let mut w = WriteFileRequest::new(&fifo);
    w.append = true;
    let e = tokio::time::timeout(Duration::from_secs(5), c.write_file_from(w, b"x"))
        .await
        .expect("no hang on a FIFO")
        .unwrap_err();
    assert!(e.code().is_some(), "{e}");
    c.ping().await.unwrap();
    a.finish(&c).await;
}

#[tokio::test]
async fn large_files_stream_both_ways() {
    let a = TestAgent::start();
    let c = a.client().await;
    let size = 48 * 1024 * 1024 + 123;
    let data: Vec<u8> = (0..size)
        .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
        .collect();
    let p = a.dir.str("big.bin");
    let mut up = c.write_file(WriteFileRequest::new(&p)).await.unwrap();
    for chunk in data.chunks(1 << 20) {
        up.write(chunk).await.unwrap();
    }
    assert_eq!(up.finish().await.unwrap(), size as u64);
    assert_eq!(
        Sha256::digest(std::fs::read(&p).unwrap()),
        Sha256::digest(&data)
    );
    let mut down = c.read_file(ReadFileRequest::new(&p)).await.unwrap();
    assert_eq!(down.stat().size, size as u64);
    let mut h = Sha256::new();
    let mut n = 0;
    while let Some(b) = down.chunk().await.unwrap() {
        n += b.len();
        h.update(&b);
    }
    assert_eq!(n, size);
    assert_eq!(h.finalize(), Sha256::digest(&data));
    a.finish(&c).await;
}

#[tokio::test]
async fn cancelled_upload_leaves_nothing_behind() {
    let a = TestAgent::start();
    let c = a.client().await;
    let p = a.dir.str("partial");
    std::fs::write(&p, b"original").unwrap();
    let mut up = c.write_file(WriteFileRequest::new(&p)).await.unwrap();
    up.write(&vec![b'x'; 100_000]).await.unwrap();
    drop(up);
    // The agent processes the cancel; the original stays, no temporary remains.
    c.ping().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(std::fs::read(&p).unwrap(), b"original");
    let names: Vec<String> = std::fs::read_dir(a.dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains(".sandlot-")),
        "temporary left behind: {names:?}"
    );
    a.finish(&c).await;
}

#[tokio::test]
async fn files_are_owned_by_and_checked_as_the_user() {
    let a = TestAgent::start();
    let c = a.client().await;
    std::fs::set_permissions(a.dir.path(), PermissionsExt::from_mode(0o777)).unwrap();
    let p = a.dir.str("u/v/owned.txt");
    c.write_file_from(as_user(WriteFileRequest::new(&p), "1000"), b"mine")
        .await
        .unwrap();
    let m = std::fs::metadata(&p).unwrap();
    assert_eq!((m.uid(), m.gid()), (1000, 1000));
    assert_eq!(std::fs::metadata(a.dir.join("u/v")).unwrap().uid(), 1000);
    assert_eq!(std::fs::metadata(a.dir.join("u")).unwrap().uid(), 1000);
    let d = a.dir.str("u/made");
    c.mkdir(as_user(MkdirRequest::new(&d, false), "1000"))
        .await
        .unwrap();
    assert_eq!(std::fs::metadata(&d).unwrap().uid(), 1000);

    // Root's private files stay private, including group-readable ones: the user
    // does not inherit the agent's groups.
    let secret = a.dir.str("secret");
    std::fs::write(&secret, b"s").unwrap();
    for mode in [0o600, 0o640] {
        std::fs::set_permissions(&secret, PermissionsExt::from_mode(mode)).unwrap();
        let e = c
            .read_file(as_user(ReadFileRequest::new(&secret), "1000"))
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Some(ErrorCode::PermissionDenied),
            "mode {mode:o}: {e}"
        );
    }
    let e = c
        .write_file_from(
            as_user(WriteFileRequest::new("/root/not-yours"), "1000"),
            b"x",
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PermissionDenied), "{e}");
    let e = c
        .remove(as_user(RemoveRequest::new(&secret, false), "1000"))
        .await;
    // The directory is world-writable without the sticky bit: removal is allowed
    // by the kernel's rules, which the agent follows rather than re-implements.
    assert!(e.is_ok(), "{e:?}");
    // Root rewriting the user's file keeps the owner.
    c.write_file_from(WriteFileRequest::new(&p), b"root wrote")
        .await
        .unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().uid(), 1000);
    assert_eq!(std::fs::read(&p).unwrap(), b"root wrote");
    a.finish(&c).await;
}

#[tokio::test]
async fn list_mkdir_remove_rename() {
    let a = TestAgent::start();
    let c = a.client().await;
    let base = a.dir.str("tree");
    c.mkdir(MkdirRequest::new(format!("{base}/x/y/z"), true))
        .await
        .unwrap();
    let e = c
        .mkdir(MkdirRequest::new(format!("{base}/x"), false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::AlreadyExists));
    c.mkdir(MkdirRequest::new(format!("{base}/x"), true))
        .await
        .expect("parents=true tolerates an existing directory");
    for f in ["b.txt", "a.txt", "x/y/deep.txt", "x/y/z/deeper.txt"] {
        c.write_file_from(WriteFileRequest::new(format!("{base}/{f}")), f.as_bytes())
            .await
            .unwrap();
    }
    std::os::unix::fs::symlink("a.txt", format!("{base}/link")).unwrap();
    let l1 = c.list_dir(ListDirRequest::new(&base, 1)).await.unwrap();
    let names: Vec<String> = l1.iter().map(|e| e.stat.path.clone()).collect();
    assert_eq!(
        names,
        ["a.txt", "b.txt", "link", "x"]
            .iter()
            .map(|n| format!("{base}/{n}"))
            .collect::<Vec<_>>()
    );
    let link = &l1[2];
    assert_eq!(link.stat.kind, FileKind::Symlink);
    assert_eq!(link.stat.symlink_target.as_deref(), Some("a.txt"));
    let l3 = c.list_dir(ListDirRequest::new(&base, 3)).await.unwrap();
    let deep: Vec<(String, u32)> = l3
        .iter()
        .map(|e| (e.stat.path.trim_start_matches(&base).to_string(), e.depth))
        .collect();
    assert_eq!(
        deep,
        vec![
            ("/a.txt".into(), 1),
            ("/b.txt".into(), 1),
            ("/link".into(), 1),
            ("/x".into(), 1),
            ("/x/y".into(), 2),
            ("/x/y/deep.txt".into(), 3),
            ("/x/y/z".into(), 3),
        ]
    );
    let e = c
        .list_dir(ListDirRequest::new(format!("{base}/a.txt"), 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotADirectory));

    // A listing larger than any window streams fine.
    let many = a.dir.str("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..3000 {
        std::fs::write(format!("{many}/file-with-a-long-name-{i:05}"), b"").unwrap();
    }
    let l = c.list_dir(ListDirRequest::new(&many, 1)).await.unwrap();
    assert_eq!(l.len(), 3000);
    assert!(l[2999].stat.path.ends_with("02999"));

    // Rename, with and without overwrite.
    c.rename(RenameRequest::new(
        format!("{base}/a.txt"),
        format!("{base}/c.txt"),
    ))
    .await
    .unwrap();
    let mut r = RenameRequest::new(format!("{base}/b.txt"), format!("{base}/c.txt"));
    r.overwrite = false;
    let e = c.rename(r).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::AlreadyExists), "{e}");
    assert_eq!(std::fs::read(format!("{base}/c.txt")).unwrap(), b"a.txt");

    // Remove: a non-empty directory needs `recursive`.
    let e = c
        .remove(RemoveRequest::new(format!("{base}/x"), false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::DirectoryNotEmpty), "{e}");
    c.remove(RemoveRequest::new(format!("{base}/x"), true))
        .await
        .unwrap();
    assert!(!std::path::Path::new(&format!("{base}/x")).exists());
    c.remove(RemoveRequest::new(format!("{base}/link"), false))
        .await
        .unwrap();
    assert!(
        std::path::Path::new(&format!("{base}/c.txt")).exists(),
        "symlink target kept"
    );
    let e = c
        .remove(RemoveRequest::new(format!("{base}/gone"), false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    a.finish(&c).await;
}

async fn next_event(w: &mut sandlot_guest::client::Watch) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(5), w.next_event())
        .await
        .expect("a watch event within 5s")
        .unwrap()
        .expect("watch still open")
}

/// Collects events until `pred` matched one, returning all of them.
async fn until(
    w: &mut sandlot_guest::client::Watch,
    pred: impl Fn(&WatchEvent) -> bool,
) -> Vec<WatchEvent> {
    let mut v = Vec::new();
    loop {
        let e = next_event(w).await;
        let done = pred(&e);
        v.push(e);
        if done {
            return v;
        }
    }
}

#[tokio::test]
async fn watch_reports_create_modify_rename_delete() {
    let a = TestAgent::start();
    let c: GuestClient = a.client().await;
    let d = a.dir.str("w");
    std::fs::create_dir(&d).unwrap();
    let mut w = c.watch(WatchRequest::new(&d, false)).await.unwrap();
    let f = format!("{d}/f");
    std::fs::write(&f, b"1").unwrap();
    let evs = until(&mut w, |e| e.kind == WatchEventKind::Modify).await;
    assert_eq!(evs[0].kind, WatchEventKind::Create);
    assert_eq!(evs[0].path.as_deref(), Some(f.as_str()));
    std::fs::rename(&f, format!("{d}/g")).unwrap();
    let e = until(&mut w, |e| e.kind == WatchEventKind::Rename).await;
    let r = e.last().unwrap();
    assert_eq!(r.from.as_deref(), Some(f.as_str()));
    assert_eq!(r.path.as_deref(), Some(format!("{d}/g").as_str()));
    std::fs::remove_file(format!("{d}/g")).unwrap();
    let e = until(&mut w, |e| e.kind == WatchEventKind::Delete).await;
    assert_eq!(
        e.last().unwrap().path.as_deref(),
        Some(format!("{d}/g").as_str())
    );
    // Deleting the watched directory ends the stream.
    std::fs::remove_dir(&d).unwrap();
    let e = until(&mut w, |e| e.kind == WatchEventKind::Delete).await;
    assert_eq!(e.last().unwrap().path.as_deref(), Some(d.as_str()));
    let end = tokio::time::timeout(Duration::from_secs(5), w.next_event())
        .await
        .unwrap()
        .unwrap();
    assert!(end.is_none(), "{end:?}");
    let e = c.watch(WatchRequest::new(&d, false)).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    a.finish(&c).await;
}

#[tokio::test]
async fn recursive_watch_follows_new_directories() {
    let a = TestAgent::start();
    let c = a.client().await;
    let d = a.dir.str("rw");
    std::fs::create_dir_all(format!("{d}/old/inner")).unwrap();
    let mut w = c.watch(WatchRequest::new(&d, true)).await.unwrap();
    // Existing subdirectories are watched.
    std::fs::write(format!("{d}/old/inner/x"), b"1").unwrap();
    until(&mut w, |e| {
        e.kind == WatchEventKind::Create && e.path.as_deref() == Some(&format!("{d}/old/inner/x"))
    })
    .await;
    // New ones too, including what appears in them right away.
    std::fs::create_dir_all(format!("{d}/new/sub")).unwrap();
    std::fs::write(format!("{d}/new/sub/y"), b"2").unwrap();
    let evs = until(&mut w, |e| {
        e.path.as_deref() == Some(&format!("{d}/new/sub/y"))
    })
    .await;
    assert!(
        evs.iter().any(|e| e.kind == WatchEventKind::Create
            && e.dir
            && e.path.as_deref() == Some(&format!("{d}/new"))),
        "{evs:?}"
    );
    // A renamed directory keeps reporting under its new name.
    std::fs::rename(format!("{d}/new"), format!("{d}/renamed")).unwrap();
    until(&mut w, |e| e.kind == WatchEventKind::Rename).await;
    std::fs::write(format!("{d}/renamed/sub/z"), b"3").unwrap();
    until(&mut w, |e| {
        e.kind == WatchEventKind::Create && e.path.as_deref() == Some(&format!("{d}/renamed/sub/z"))
    })
    .await;
    drop(w);
    a.finish(&c).await;
}
