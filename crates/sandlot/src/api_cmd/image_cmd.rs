//! `sandlot image`, `sandlot volume` and `sandlot secret`: images, snapshots,
//! volumes and secrets through the daemon's API.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bytes::Bytes;
use serde_json::{json, Value};

use super::client_cmds::{report, Conn};
use super::render::{human_bytes, table};

#[derive(Debug, clap::Subcommand)]
pub enum ImageCmd {
    /// List images.
    Ls {
        #[command(flatten)]
        conn: Conn,
        #[arg(long)]
        json: bool,
    },
    /// Show an image (JSON).
    Inspect {
        #[command(flatten)]
        conn: Conn,
        image: String,
    },
    /// Remove images (a name removes that tag; the image goes with its last tag).
    Rm {
        #[command(flatten)]
        conn: Conn,
        #[arg(required = true)]
        images: Vec<String>,
    },
    /// Remove layers no image or live sandbox uses.
    Prune {
        #[command(flatten)]
        conn: Conn,
    },
    /// Import an OCI layout (tar or directory), a `docker save` tar, or a root
    /// filesystem directory (made into a one-layer image).
    Import {
        #[command(flatten)]
        conn: Conn,
        path: PathBuf,
        /// Name the image NAME[:TAG].
        #[arg(long)]
        tag: Option<String>,
    },
    /// Export an image as a tar that is both an OCI layout and a `docker save` archive.
    Export {
        #[command(flatten)]
        conn: Conn,
        image: String,
        /// Output file (`-`: stdout).
        #[arg(short, long)]
        output: PathBuf,
        /// Name recorded in the archive (default: the image's tags).
        #[arg(long)]
        tag: Option<String>,
    },
    /// Files added, changed and removed from image A to image B.
    Diff {
        #[command(flatten)]
        conn: Conn,
        a: String,
        b: String,
        #[arg(long)]
        json: bool,
    },
    /// Pull an image from an OCI registry (HOST[:PORT]/PATH[:TAG] or @sha256:...).
    Pull {
        #[command(flatten)]
        conn: Conn,
        reference: String,
        /// Local name (default: the reference).
        #[arg(long)]
        tag: Option<String>,
        #[command(flatten)]
        auth: RegistryAuthArgs,
    },
    /// Push a local image to an OCI registry under REFERENCE (HOST[:PORT]/PATH[:TAG]).
    Push {
        #[command(flatten)]
        conn: Conn,
        image: String,
        reference: String,
        #[command(flatten)]
        auth: RegistryAuthArgs,
    },
    /// Build an image from a spec (TOML: from/run/copy/env/workdir/user/apt_install/
    /// pip_install steps) or a Dockerfile (FROM, RUN, COPY, ENV, WORKDIR, USER);
    /// every step is cached.
    Build {
        #[command(flatten)]
        conn: Conn,
        /// The spec: `*.toml` is a Sandlot build spec, anything else a Dockerfile.
        #[arg(short = 'f', long = "file", default_value = "Dockerfile")]
        file: PathBuf,
        /// Name the result NAME[:TAG].
        #[arg(long)]
        tag: Option<String>,
        /// Let run steps use the network (apt_install and pip_install need it).
        #[arg(long)]
        network: bool,
        /// The build context (copy sources are relative to it).
        #[arg(default_value = ".")]
        context: PathBuf,
    },
    /// Snapshot a running sandbox's filesystem into a new image.
    Snapshot {
        #[command(flatten)]
        conn: Conn,
        sandbox: String,
        #[arg(long)]
        tag: Option<String>,
    },
}

/// Registry credentials of `pull` and `push` (default: the daemon's
/// `images.auth_file`, else anonymous).
#[derive(Debug, clap::Args)]
pub struct RegistryAuthArgs {
    /// Registry user name (the password is read from stdin).
    #[arg(long)]
    username: Option<String>,
    /// Read the password (or token) from stdin; requires --username.
    #[arg(long, requires = "username")]
    password_stdin: bool,
}

impl RegistryAuthArgs {
    fn body(&self) -> anyhow::Result<Option<Value>> {
        let Some(u) = &self.username else {
            return Ok(None);
        };
        if !self.password_stdin {
            bail!("--username needs --password-stdin (passwords are never taken from the command line)");
        }
        let mut p = String::new();
        std::io::stdin()
            .read_to_string(&mut p)
            .context("read the password from stdin")?;
        let p = p.trim_end_matches(['\n', '\r']).to_string();
        if p.is_empty() {
            bail!("empty password on stdin");
        }
        Ok(Some(json!({ "username": u, "password": p })))
    }
}

/// A line above the bars (plain stderr when there are none: not a terminal).
fn say(multi: &indicatif::MultiProgress, line: impl AsRef<str>) {
    if multi.is_hidden() {
        eprintln!("{}", line.as_ref());
    } else {
        let _ = multi.println(line.as_ref());
    }
}

/// Renders a pull, push or build NDJSON progress stream: per-layer bars,
/// build output. Returns the `done` line, or fails with the `error` line.
pub(crate) async fn follow_progress(
    mut s: sandlot_client::ByteStream,
    verb: &str,
) -> anyhow::Result<Value> {
    use std::collections::HashMap;
    let multi = indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr());
    let mut bars: HashMap<String, indicatif::ProgressBar> = HashMap::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut done: Option<Value> = None;
    let style = indicatif::ProgressStyle::with_template(
        "{prefix} {msg:11} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
    )
    .map(|s| s.progress_chars("=> "))
    .ok();
    let mut handle = |v: Value, multi: &indicatif::MultiProgress| -> anyhow::Result<()> {
        match v["type"].as_str().unwrap_or_default() {
            "manifest" => {
                say(
                    multi,
                    format!(
                        "{verb} {} ({} layers)",
                        v["digest"].as_str().unwrap_or_default(),
                        v["layers"]
                    ),
                );
            }
            "layer" => {
                let d = v["digest"].as_str().unwrap_or_default().to_string();
                let bar = bars.entry(d.clone()).or_insert_with(|| {
                    let b = multi.add(indicatif::ProgressBar::new(0));
                    if let Some(s) = &style {
                        b.set_style(s.clone());
                    }
                    b.set_prefix(short(&d));
                    b
                });
                match v["status"].as_str().unwrap_or_default() {
                    "start" => {
                        bar.set_length(v["size"].as_u64().unwrap_or(0));
                        bar.set_message(verb.to_string());
                    }
                    "progress" => bar.set_position(v["done"].as_u64().unwrap_or(0)),
                    "done" => {
                        if v["cached"].as_bool() == Some(true) {
                            bar.finish_with_message("exists");
                        } else {
                            if let Some(l) = bar.length() {
                                bar.set_position(l);
                            }
                            bar.finish_with_message("done");
                        }
                    }
                    _ => {}
                }
            }
            "step" => {
                say(
                    multi,
                    format!(
                        "step {}: {}{}",
                        v["index"],
                        v["text"].as_str().unwrap_or_default(),
                        if v["cached"].as_bool() == Some(true) {
                            " (cached)"
                        } else {
                            ""
                        }
                    ),
                );
            }
            "log" => {
                say(multi, v["line"].as_str().unwrap_or_default().trim_end());
            }
            "error" => {
                bail!(
                    "{} ({})",
                    v["message"].as_str().unwrap_or("failed"),
                    v["code"].as_str().unwrap_or("error")
                );
            }
            "done" => done = Some(v),
            _ => {}
        }
        Ok(())
    };
    while let Some(c) = s.chunk().await? {
        buf.extend_from_slice(&c);
        while let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let v: Value = serde_json::from_slice(&line).context("a progress line is not JSON")?;
            handle(v, &multi)?;
        }
    }
    done.ok_or_else(|| anyhow::anyhow!("the daemon ended the {verb} stream without a result"))
}

#[derive(Debug, clap::Subcommand)]
pub enum VolumeCmd {
    /// Create a named volume.
    Create {
        #[command(flatten)]
        conn: Conn,
        name: String,
        /// Size limit, e.g. 1G (the volume is then a filesystem of that size).
        #[arg(long)]
        size: Option<String>,
    },
    /// List volumes.
    Ls {
        #[command(flatten)]
        conn: Conn,
        #[arg(long)]
        json: bool,
    },
    /// Remove volumes and their data.
    Rm {
        #[command(flatten)]
        conn: Conn,
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum SecretCmd {
    /// Create a secret; the value is read from stdin (never from the command line).
    Create {
        #[command(flatten)]
        conn: Conn,
        name: String,
        /// Read the value from this file instead of stdin.
        #[arg(long)]
        from_file: Option<PathBuf>,
    },
    /// List secrets (names only).
    Ls {
        #[command(flatten)]
        conn: Conn,
        #[arg(long)]
        json: bool,
    },
    /// Delete secrets.
    Rm {
        #[command(flatten)]
        conn: Conn,
        #[arg(required = true)]
        names: Vec<String>,
    },
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn path_enc(s: &str) -> String {
    // Image names keep their '/' and ':' in the path; everything else is escaped.
    s.split('/')
        .map(enc)
        .collect::<Vec<_>>()
        .join("/")
        .replace("%3A", ":")
}

fn short(id: &str) -> String {
    id.trim_start_matches("sha256:").chars().take(12).collect()
}

fn print_json(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn block_on(f: impl std::future::Future<Output = anyhow::Result<i32>>) -> anyhow::Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match rt.block_on(f) {
        Ok(c) => Ok(c),
        Err(e) => Ok(report(&e)),
    }
}

pub fn run_image(cmd: ImageCmd) -> anyhow::Result<i32> {
    block_on(image(cmd))
}

pub fn run_volume(cmd: VolumeCmd) -> anyhow::Result<i32> {
    block_on(volume(cmd))
}

pub fn run_secret(cmd: SecretCmd) -> anyhow::Result<i32> {
    block_on(secret(cmd))
}

/// A tar of `dir` (an OCI layout) in a temporary file.
fn tar_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    let mut f = tempfile_in_tmp()?;
    {
        let mut b = tar::Builder::new(&mut f);
        b.follow_symlinks(false);
        b.append_dir_all(".", dir)
            .with_context(|| format!("pack {}", dir.display()))?;
        b.finish()?;
    }
    use std::io::Seek;
    f.rewind()?;
    Ok(f)
}

fn tempfile_in_tmp() -> anyhow::Result<std::fs::File> {
    let p = std::env::temp_dir().join(format!(
        "sandlot-image-{}-{}",
        std::process::id(),
        crate::api_cmd::nanos()
    ));
    let f = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&p)
        .with_context(|| format!("create {}", p.display()))?;
    let _ = std::fs::remove_file(&p);
    Ok(f)
}

/// A root filesystem directory as a one-layer image archive, built in a temporary
/// image store.
fn rootfs_archive(dir: &Path, tag: Option<&str>) -> anyhow::Result<std::fs::File> {
    let tmp = std::env::temp_dir().join(format!(
        "sandlot-import-{}-{}",
        std::process::id(),
        crate::api_cmd::nanos()
    ));
    let r = (|| -> anyhow::Result<std::fs::File> {
        let store = sandlot_store::ImageStore::open(&tmp)?;
        let name = tag.map(sandlot_store::ImageName::parse).transpose()?;
        let img = store.import_dir(dir, &sandlot_store::ImageConfig::default(), name.as_ref())?;
        let mut f = tempfile_in_tmp()?;
        sandlot_store::oci::export(&store, &img, name.as_slice(), &mut f, &|_| {})?;
        use std::io::Seek;
        f.rewind()?;
        Ok(f)
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

async fn image(cmd: ImageCmd) -> anyhow::Result<i32> {
    match cmd {
        ImageCmd::Ls { conn, json } => {
            let v = conn.client()?.call_json("GET", "/v1/images", None).await?;
            if json {
                print_json(&v)?;
                return Ok(0);
            }
            let mut rows = Vec::new();
            for i in v["images"].as_array().into_iter().flatten() {
                let mut tags: Vec<String> = i["tags"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect();
                // The operator also sees tenants' own tags, each in its namespace.
                tags.extend(i["tenant_tags"].as_array().into_iter().flatten().map(|t| {
                    format!(
                        "{} ({})",
                        t["name"].as_str().unwrap_or_default(),
                        t["tenant"].as_str().unwrap_or_default()
                    )
                }));
                rows.push(vec![
                    short(i["id"].as_str().unwrap_or_default()),
                    if tags.is_empty() {
                        "<none>".into()
                    } else {
                        tags.join(",")
                    },
                    i["owner"].as_str().unwrap_or("-").to_string(),
                    i["layers"].as_array().map_or(0, Vec::len).to_string(),
                    human_bytes(i["size"].as_u64().unwrap_or(0)),
                    i["source"].as_str().unwrap_or_default().to_string(),
                    i["parent"].as_str().map(short).unwrap_or_default(),
                    i["created_at"].as_str().unwrap_or_default().to_string(),
                ]);
            }
            table(
                &[
                    "ID", "TAGS", "OWNER", "LAYERS", "SIZE", "SOURCE", "PARENT", "CREATED",
                ],
                &rows,
            );
        }
        ImageCmd::Inspect { conn, image } => {
            let v = conn
                .client()?
                .call_json("GET", &format!("/v1/images/{}", path_enc(&image)), None)
                .await?;
            print_json(&v)?;
        }
        ImageCmd::Rm { conn, images } => {
            let c = conn.client()?;
            let mut code = 0;
            for i in images {
                match c
                    .call_json("DELETE", &format!("/v1/images/{}", path_enc(&i)), None)
                    .await
                {
                    Ok(v) => println!("{}", v["id"].as_str().unwrap_or_default()),
                    Err(e) => code = report(&e.into()),
                }
            }
            return Ok(code);
        }
        ImageCmd::Prune { conn } => {
            let v = conn
                .client()?
                .call_json("POST", "/v1/images/prune", None)
                .await?;
            println!(
                "removed {} layers and {} blobs, {} freed",
                v["layers_removed"],
                v["blobs_removed"],
                human_bytes(v["bytes_freed"].as_u64().unwrap_or(0))
            );
        }
        ImageCmd::Import { conn, path, tag } => {
            let file = if path.is_dir() {
                if path.join("index.json").is_file() || path.join("manifest.json").is_file() {
                    tar_dir(&path)?
                } else {
                    rootfs_archive(&path, tag.as_deref())?
                }
            } else {
                std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?
            };
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            let bar = progress_bar(size, &format!("upload {}", path.display()));
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
            let b2 = bar.clone();
            std::thread::spawn(move || {
                let mut f = file;
                let mut buf = vec![0u8; 256 << 10];
                loop {
                    match f.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            b2.inc(n as u64);
                            if tx
                                .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                                .is_err()
                            {
                                break;
                            }
                        }
                        Err(e) => {
                            let _ = tx.blocking_send(Err(e));
                            break;
                        }
                    }
                }
            });
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|i| (i, rx))
            });
            let mut p = "/v1/images/import".to_string();
            if let Some(t) = &tag {
                p.push_str(&format!("?tag={}", enc(t)));
            }
            let v = conn.client()?.upload(&p, stream).await;
            bar.finish_and_clear();
            let v = v?;
            for i in v["images"].as_array().into_iter().flatten() {
                println!("{}", i["id"].as_str().unwrap_or_default());
            }
        }
        ImageCmd::Export {
            conn,
            image,
            output,
            tag,
        } => {
            let mut p = format!("/v1/images/export?ref={}", enc(&image));
            if let Some(t) = &tag {
                p.push_str(&format!("&tag={}", enc(t)));
            }
            let mut s = conn.client()?.download(&p).await?;
            let mut out: Box<dyn Write> = if output == Path::new("-") {
                Box::new(std::io::stdout().lock())
            } else {
                Box::new(std::io::BufWriter::new(
                    std::fs::File::create(&output)
                        .with_context(|| format!("create {}", output.display()))?,
                ))
            };
            let bar = progress_bar(0, &format!("export {image}"));
            while let Some(c) = s.chunk().await? {
                bar.inc(c.len() as u64);
                out.write_all(&c)?;
            }
            out.flush()?;
            bar.finish_and_clear();
        }
        ImageCmd::Diff { conn, a, b, json } => {
            let v = conn
                .client()?
                .call_json(
                    "GET",
                    &format!("/v1/images/diff?a={}&b={}", enc(&a), enc(&b)),
                    None,
                )
                .await?;
            if json {
                print_json(&v)?;
                return Ok(0);
            }
            for (k, sign) in [("added", "A"), ("changed", "C"), ("removed", "D")] {
                for p in v[k].as_array().into_iter().flatten() {
                    println!(
                        "{sign} {}",
                        super::render::printable(p.as_str().unwrap_or_default())
                    );
                }
            }
        }
        ImageCmd::Pull {
            conn,
            reference,
            tag,
            auth,
        } => {
            let mut body = json!({ "reference": reference });
            if let Some(t) = tag {
                body["tag"] = json!(t);
            }
            if let Some(a) = auth.body()? {
                body["auth"] = a;
            }
            let s = conn.client()?.post_stream("/v1/images/pull", &body).await?;
            let v = follow_progress(s, "pull").await?;
            println!("{}", v["image"]["id"].as_str().unwrap_or_default());
        }
        ImageCmd::Push {
            conn,
            image,
            reference,
            auth,
        } => {
            let mut body = json!({ "reference": reference });
            if let Some(a) = auth.body()? {
                body["auth"] = a;
            }
            let s = conn
                .client()?
                .post_stream(&format!("/v1/images/{}/push", path_enc(&image)), &body)
                .await?;
            let v = follow_progress(s, "push").await?;
            println!("{}", v["digest"].as_str().unwrap_or_default());
        }
        ImageCmd::Build {
            conn,
            file,
            tag,
            network,
            context,
        } => {
            if !context.is_dir() {
                bail!("build context {} is not a directory", context.display());
            }
            let spec = std::fs::read(&file)
                .with_context(|| format!("read the build spec {}", file.display()))?;
            let base = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "Dockerfile".into());
            let inner = format!(".sandlot-build/{base}");
            let mut f = tempfile_in_tmp()?;
            {
                let mut b = tar::Builder::new(&mut f);
                b.follow_symlinks(false);
                b.append_dir_all(".", &context)
                    .with_context(|| format!("pack the build context {}", context.display()))?;
                let mut h = tar::Header::new_gnu();
                h.set_size(spec.len() as u64);
                h.set_mode(0o644);
                h.set_entry_type(tar::EntryType::Regular);
                b.append_data(&mut h, &inner, &spec[..])?;
                b.finish()?;
            }
            use std::io::Seek;
            f.rewind()?;
            let stream = file_stream(f, None);
            let mut p = format!("/v1/images/build?file={}", enc(&inner));
            if let Some(t) = &tag {
                p.push_str(&format!("&tag={}", enc(t)));
            }
            if network {
                p.push_str("&network=true");
            }
            let s = conn
                .client()?
                .upload_stream(&p, "application/x-tar", stream)
                .await?;
            let v = follow_progress(s, "build").await?;
            println!("{}", v["image"]["id"].as_str().unwrap_or_default());
        }
        ImageCmd::Snapshot { conn, sandbox, tag } => {
            let body = json!({ "tag": tag });
            let v = conn
                .client()?
                .call_json(
                    "POST",
                    &format!("/v1/sandboxes/{}/snapshot", enc(&sandbox)),
                    Some(&body),
                )
                .await?;
            println!("{}", v["id"].as_str().unwrap_or_default());
        }
    }
    Ok(0)
}

/// A file as a body stream (read on a thread), advancing `bar` when given.
fn file_stream(
    mut f: std::fs::File,
    bar: Option<indicatif::ProgressBar>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 << 10];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if let Some(b) = &bar {
                        b.inc(n as u64);
                    }
                    if tx
                        .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    break;
                }
            }
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|i| (i, rx)) })
}

fn progress_bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let b = if len > 0 {
        indicatif::ProgressBar::new(len)
    } else {
        indicatif::ProgressBar::no_length()
    };
    if let Ok(s) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
    ) {
        b.set_style(s.progress_chars("=> "));
    }
    b.set_message(what.to_string());
    b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    b
}

async fn volume(cmd: VolumeCmd) -> anyhow::Result<i32> {
    match cmd {
        VolumeCmd::Create { conn, name, size } => {
            let mut body = json!({ "name": name });
            if let Some(s) = size {
                body["size_limit"] = json!(s);
            }
            let v = conn
                .client()?
                .call_json("POST", "/v1/volumes", Some(&body))
                .await?;
            println!("{}", v["name"].as_str().unwrap_or_default());
        }
        VolumeCmd::Ls { conn, json } => {
            let v = conn.client()?.call_json("GET", "/v1/volumes", None).await?;
            if json {
                print_json(&v)?;
                return Ok(0);
            }
            let rows: Vec<Vec<String>> = v["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| {
                    vec![
                        x["name"].as_str().unwrap_or_default().to_string(),
                        x["tenant"].as_str().unwrap_or_default().to_string(),
                        x["size_limit"]
                            .as_u64()
                            .map(human_bytes)
                            .unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            table(&["NAME", "TENANT", "SIZE LIMIT"], &rows);
        }
        VolumeCmd::Rm { conn, names } => {
            let c = conn.client()?;
            let mut code = 0;
            for n in names {
                match c
                    .call_json("DELETE", &format!("/v1/volumes/{}", enc(&n)), None)
                    .await
                {
                    Ok(_) => println!("{n}"),
                    Err(e) => code = report(&e.into()),
                }
            }
            return Ok(code);
        }
    }
    Ok(0)
}

async fn secret(cmd: SecretCmd) -> anyhow::Result<i32> {
    match cmd {
        SecretCmd::Create {
            conn,
            name,
            from_file,
        } => {
            let mut value = String::new();
            match from_file {
                Some(p) => {
                    value = std::fs::read_to_string(&p)
                        .with_context(|| format!("read {}", p.display()))?
                }
                None => {
                    std::io::stdin()
                        .read_to_string(&mut value)
                        .context("read the value from stdin")?;
                }
            }
            if value.is_empty() {
                bail!("empty secret value (pipe it on stdin or use --from-file)");
            }
            let body = json!({ "name": name, "value": value });
            let v = conn
                .client()?
                .call_json("POST", "/v1/secrets", Some(&body))
                .await?;
            println!("{}", v["name"].as_str().unwrap_or_default());
        }
        SecretCmd::Ls { conn, json } => {
            let v = conn.client()?.call_json("GET", "/v1/secrets", None).await?;
            if json {
                print_json(&v)?;
                return Ok(0);
            }
            let rows: Vec<Vec<String>> = v["secrets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| {
                    vec![
                        x["name"].as_str().unwrap_or_default().to_string(),
                        x["tenant"].as_str().unwrap_or_default().to_string(),
                    ]
                })
                .collect();
            table(&["NAME", "TENANT"], &rows);
        }
        SecretCmd::Rm { conn, names } => {
            let c = conn.client()?;
            let mut code = 0;
            for n in names {
                match c
                    .call_json("DELETE", &format!("/v1/secrets/{}", enc(&n)), None)
                    .await
                {
                    Ok(_) => println!("{n}"),
                    Err(e) => code = report(&e.into()),
                }
            }
            return Ok(code);
        }
    }
    Ok(0)
}
