//! OCI images on disk: the image config, manifests, and import/export of OCI
//! image layouts and `docker save` archives (which since Docker 25 are OCI layouts
//! with a `manifest.json` next to `index.json`; older ones have only the latter).
//!
//! Every blob is verified against its digest on import: configs and layer blobs by
//! the digests the manifest (or their `blobs/sha256/<hex>` name) gives, and
//! uncompressed layers against the config's `rootfs.diff_ids`.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufReader, Read, Write};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::{
    invalid, io_at, media, Digest, ImageConfig, ImageInfo, ImageName, ImageStore, LayerInfo,
    StoreError,
};

/// The OCI architecture name of this host.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        "riscv64" => "riscv64",
        "s390x" => "s390x",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// The OCI image config for `layers` with `cfg`. Deterministic (no timestamps), so
/// the same content always has the same image id.
pub fn config_json(
    layers: &[LayerInfo],
    cfg: &ImageConfig,
    created_by: &str,
    parent: Option<&Digest>,
    owner: Option<&str>,
) -> Vec<u8> {
    let mut labels = BTreeMap::new();
    labels.insert("org.sandlot.created_by".to_string(), created_by.to_string());
    if let Some(p) = parent {
        labels.insert("org.sandlot.parent".to_string(), p.to_string());
    }
    // A tenant's image never has the id of another's or of a shared one made of the
    // same layers and settings: an id names one owner's image.
    if let Some(o) = owner {
        labels.insert(OWNER_LABEL.to_string(), o.to_string());
    }
    if cfg.host_base {
        labels.insert(HOST_BASE_LABEL.to_string(), "host".to_string());
    }
    let mut c = serde_json::Map::new();
    c.insert("Env".into(), json!(cfg.env));
    if let Some(w) = &cfg.workdir {
        c.insert("WorkingDir".into(), json!(w));
    }
    if let Some(u) = &cfg.user {
        c.insert("User".into(), json!(u));
    }
    if !cfg.entrypoint.is_empty() {
        c.insert("Entrypoint".into(), json!(cfg.entrypoint));
    }
    if !cfg.cmd.is_empty() {
        c.insert("Cmd".into(), json!(cfg.cmd));
    }
    c.insert("Labels".into(), json!(labels));
    let v = json!({
        "architecture": host_arch(),
        "os": "linux",
        "config": Value::Object(c),
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.diff_id.to_string()).collect::<Vec<_>>(),
        },
    });
    serde_json::to_vec(&v).expect("json")
}

/// The label of an image whose layers go on top of the built-in `host` image
/// ([`ImageConfig::host_base`]).
pub const HOST_BASE_LABEL: &str = "org.sandlot.base";
/// The label naming the tenant an image was made for (a snapshot, a tenant's build).
pub const OWNER_LABEL: &str = "org.sandlot.owner";

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RawRunConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    /// Read loosely: labels of other tools are not ours to refuse.
    #[serde(default)]
    labels: Option<Value>,
}

#[derive(Deserialize)]
struct RawRootfs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    config: Option<RawRunConfig>,
    rootfs: RawRootfs,
}

/// The run settings of an OCI config.
pub fn parse_config(bytes: &[u8]) -> Result<ImageConfig, StoreError> {
    let raw: RawConfig =
        serde_json::from_slice(bytes).map_err(|e| invalid("config", e.to_string()))?;
    let c = raw.config.unwrap_or_default();
    Ok(ImageConfig {
        env: c.env.unwrap_or_default(),
        workdir: c.working_dir.filter(|w| !w.is_empty()),
        user: c.user.filter(|u| !u.is_empty()),
        entrypoint: c.entrypoint.unwrap_or_default(),
        cmd: c.cmd.unwrap_or_default(),
        host_base: c
            .labels
            .as_ref()
            .and_then(|l| l.get(HOST_BASE_LABEL))
            .is_some_and(|b| b == "host"),
    })
}

pub(crate) fn diff_ids_of(bytes: &[u8]) -> Result<Vec<Digest>, StoreError> {
    let raw: RawConfig =
        serde_json::from_slice(bytes).map_err(|e| invalid("config", e.to_string()))?;
    raw.rootfs
        .diff_ids
        .iter()
        .map(|d| {
            d.parse().map_err(|e: crate::digest::BadDigest| {
                invalid("config rootfs.diff_ids", e.to_string())
            })
        })
        .collect()
}

/// A content descriptor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType")]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Value>,
}

/// An image manifest (OCI or Docker v2 schema 2).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

#[derive(Debug, Clone, Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

/// The OCI media type to publish a stored layer under.
pub fn oci_layer_type(stored: &str) -> &'static str {
    if stored.ends_with("gzip") {
        media::OCI_LAYER_GZIP
    } else {
        media::OCI_LAYER
    }
}

/// The OCI manifest of a stored image (deterministic).
pub fn manifest_json(store: &ImageStore, img: &ImageInfo) -> Result<Vec<u8>, StoreError> {
    let cfg = store.config_bytes(&img.id)?;
    let m = Manifest {
        schema_version: 2,
        media_type: Some(media::OCI_MANIFEST.into()),
        config: Descriptor {
            media_type: media::OCI_CONFIG.into(),
            digest: img.id,
            size: cfg.len() as u64,
            annotations: None,
            platform: None,
        },
        layers: img
            .layers
            .iter()
            .map(|l| Descriptor {
                media_type: oci_layer_type(&l.media_type).into(),
                digest: l.blob,
                size: l.blob_size,
                annotations: None,
                platform: None,
            })
            .collect(),
    };
    Ok(serde_json::to_vec(&m).expect("json"))
}

/// Progress of an import, export, pull or push.
#[derive(Debug, Clone)]
pub enum Progress {
    /// A layer starts: its digest and size.
    Start { layer: Digest, size: u64 },
    /// Bytes of a layer done so far.
    Advance { layer: Digest, done: u64 },
    /// A layer is done (`cached`: it was already in the store).
    Done { layer: Digest, cached: bool },
}

/// Imports every image of an OCI layout directory, an OCI layout tar or a
/// `docker save` tar (optionally gzip-compressed). `tag` overrides the names
/// recorded in the archive (only for single-image archives).
pub fn import(
    store: &ImageStore,
    path: &Path,
    tag: Option<&ImageName>,
    progress: &dyn Fn(Progress),
) -> Result<Vec<ImageInfo>, StoreError> {
    if path.is_dir() {
        return import_layout(store, path, tag, false, progress);
    }
    let staged = store.tmp_path("import");
    fs::create_dir(&staged).map_err(io_at("create", &staged))?;
    let r = extract_archive(path, &staged)
        .and_then(|_| import_layout(store, &staged, tag, true, progress));
    let _ = fs::remove_dir_all(&staged);
    r
}

fn extract_archive(path: &Path, to: &Path) -> Result<(), StoreError> {
    let mut f = fs::File::open(path).map_err(io_at("open", path))?;
    let mut magic = [0u8; 2];
    let gz = f.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
    drop(f);
    let f = BufReader::new(fs::File::open(path).map_err(io_at("open", path))?);
    let r: Box<dyn Read> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(f))
    } else {
        Box::new(f)
    };
    // What cannot be read as a (gzipped) tar is the archive's fault: 400.
    let bad = |e: std::io::Error| invalid("archive", format!("not a readable tar archive: {e}"));
    crate::tar_bound::for_each_entry(
        r,
        |_| {},
        bad,
        |e| {
            let ty = e.header().entry_type();
            // An image archive holds JSON files and blobs; anything else is ignored.
            if !(ty.is_file() || ty.is_dir()) {
                return Ok(());
            }
            let p = e.path().map_err(bad)?.into_owned();
            if p.components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
            {
                return Err(invalid(
                    path.display().to_string(),
                    format!("archive entry {} escapes the archive", p.display()),
                ));
            }
            let dst = to.join(&p);
            if ty.is_dir() {
                fs::create_dir_all(&dst).map_err(io_at("create", &dst))?;
                return Ok(());
            }
            if let Some(parent) = dst.parent() {
                fs::create_dir_all(parent).map_err(io_at("create", parent))?;
            }
            let mut out = fs::File::create(&dst).map_err(io_at("create", &dst))?;
            std::io::copy(e, &mut out).map_err(|err| {
                if err.kind() == std::io::ErrorKind::UnexpectedEof {
                    bad(err)
                } else {
                    io_at("extract", &dst)(err)
                }
            })?;
            Ok(())
        },
    )
}

/// Reads the archive's JSON file `p`; a parse error names it as `name` (its path in
/// the archive, not where the daemon unpacked it).
fn read_json<T: for<'de> Deserialize<'de>>(p: &Path, name: &str) -> Result<T, StoreError> {
    let b = fs::read(p).map_err(io_at("read", p))?;
    serde_json::from_slice(&b).map_err(|e| invalid(name.to_string(), e.to_string()))
}

/// `rel`, a path that a docker archive's `manifest.json` names, inside the archive
/// `root`: relative, without `..`, and with no symbolic link on the way. (It used to be
/// joined as given: `"Layers": ["/etc/x"]` moved a host file into the store.)
fn archive_path(root: &Path, rel: &str) -> Result<PathBuf, StoreError> {
    let what = || format!("manifest.json path {rel:?}");
    let rel = Path::new(rel);
    if rel
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(invalid(what(), "is not a relative path inside the archive"));
    }
    if crate::link_on_the_way(root, rel, true).is_some() {
        return Err(invalid(what(), "goes through a symbolic link"));
    }
    Ok(root.join(rel))
}

/// A file the archive's own index names but does not hold is the archive's fault
/// (400 naming it); other errors are the host's.
fn missing_or_io(e: std::io::Error, what: &str, op: &'static str, p: &Path) -> StoreError {
    if e.kind() == std::io::ErrorKind::NotFound {
        invalid(what.to_string(), "is missing from the archive")
    } else {
        io_at(op, p)(e)
    }
}

fn blob_in(layout: &Path, d: &Digest) -> PathBuf {
    layout.join("blobs/sha256").join(d.hex())
}

/// The digest a `blobs/sha256/<hex>` path names, if it does.
fn digest_of_path(p: &str) -> Option<Digest> {
    let rest = p.strip_prefix("blobs/sha256/")?;
    Digest::from_hex(rest).ok()
}

fn verified_bytes(p: &Path, expected: Option<&Digest>, what: &str) -> Result<Vec<u8>, StoreError> {
    let b = fs::read(p).map_err(|e| missing_or_io(e, what, "read", p))?;
    if let Some(e) = expected {
        let got = Digest::of(&b);
        if got != *e {
            return Err(StoreError::DigestMismatch {
                what: what.to_string(),
                expected: *e,
                actual: got,
            });
        }
    }
    Ok(b)
}

/// Stores one layer file of a layout: blob (verified when `blob` is known), then
/// the unpacked layer (verified against `diff_id`).
fn import_layer(
    store: &ImageStore,
    file: &Path,
    blob: Option<&Digest>,
    media_type: Option<&str>,
    diff_id: &Digest,
    owned: bool,
    progress: &dyn Fn(Progress),
) -> Result<LayerInfo, StoreError> {
    let what = match blob {
        Some(d) => format!("layer {d}"),
        None => format!("layer {}", file.display()),
    };
    let size = fs::metadata(file)
        .map_err(|e| missing_or_io(e, &what, "stat", file))?
        .len();
    if let Some(l) = store.layer(diff_id)? {
        if store.layer_dir(diff_id).is_dir() && store.blob_path(&l.blob).exists() {
            progress(Progress::Done {
                layer: *diff_id,
                cached: true,
            });
            return Ok(l);
        }
    }
    progress(Progress::Start {
        layer: *diff_id,
        size,
    });
    let staged = store.tmp_path("blob");
    if owned {
        fs::rename(file, &staged).map_err(io_at("stage", file))?;
    } else {
        fs::copy(file, &staged).map_err(io_at("copy", file))?;
    }
    let (bd, _) = store.put_blob_file(&staged, blob)?;
    progress(Progress::Advance {
        layer: *diff_id,
        done: size,
    });
    let mt = match media_type {
        Some(m) => m.to_string(),
        None => {
            let mut magic = [0u8; 2];
            let gz = fs::File::open(store.blob_path(&bd))
                .and_then(|mut f| f.read_exact(&mut magic))
                .is_ok()
                && magic == [0x1f, 0x8b];
            if gz {
                media::OCI_LAYER_GZIP
            } else {
                media::OCI_LAYER
            }
            .to_string()
        }
    };
    let l = store.add_layer(&bd, &mt, Some(diff_id))?;
    progress(Progress::Done {
        layer: *diff_id,
        cached: false,
    });
    Ok(l)
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn import_layout(
    store: &ImageStore,
    root: &Path,
    tag: Option<&ImageName>,
    owned: bool,
    progress: &dyn Fn(Progress),
) -> Result<Vec<ImageInfo>, StoreError> {
    let docker = root.join("manifest.json");
    let index = root.join("index.json");
    let mut out = Vec::new();
    if docker.is_file() {
        let entries: Vec<DockerEntry> = read_json(&docker, "manifest.json")?;
        if tag.is_some() && entries.len() != 1 {
            return Err(invalid(
                "archive",
                "holds several images: import it without a tag",
            ));
        }
        for e in entries {
            let cfg_path = archive_path(root, &e.config)?;
            // `<hex>.json` (old format) or `blobs/sha256/<hex>`: either names the digest.
            let cfg_digest = digest_of_path(&e.config).or_else(|| {
                e.config
                    .strip_suffix(".json")
                    .and_then(|h| Digest::from_hex(h).ok())
            });
            let cfg = verified_bytes(
                &cfg_path,
                cfg_digest.as_ref(),
                &format!("config {}", e.config),
            )?;
            let diff_ids = diff_ids_of(&cfg)?;
            if diff_ids.len() != e.layers.len() {
                return Err(invalid(
                    e.config.clone(),
                    format!(
                        "{} layers in the manifest, {} diff ids in the config",
                        e.layers.len(),
                        diff_ids.len()
                    ),
                ));
            }
            let mut layers = Vec::new();
            for (lp, did) in e.layers.iter().zip(&diff_ids) {
                let file = archive_path(root, lp)?;
                let blob = digest_of_path(lp);
                layers.push(import_layer(
                    store,
                    &file,
                    blob.as_ref(),
                    None,
                    did,
                    owned,
                    progress,
                )?);
            }
            let names: Vec<ImageName> = match tag {
                Some(t) => vec![t.clone()],
                None => e
                    .repo_tags
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|t| ImageName::parse(t).ok())
                    .collect(),
            };
            let mut img = store.add_image_raw(&cfg, &layers, None, "import", names.first())?;
            for n in names.iter().skip(1) {
                img = store.tag(&img.id.to_string(), n)?;
            }
            out.push(img);
        }
        return Ok(out);
    }
    if !index.is_file() {
        return Err(invalid(
            "archive",
            "neither an OCI layout (index.json) nor a docker save archive (manifest.json)",
        ));
    }
    let idx: Index = read_json(&index, "index.json")?;
    let mut manifests = Vec::new();
    collect_manifests(root, &idx.manifests, &mut manifests, 0)?;
    if manifests.is_empty() {
        return Err(invalid(
            "index.json",
            format!("no image for linux/{}", host_arch()),
        ));
    }
    if tag.is_some() && manifests.len() != 1 {
        return Err(invalid(
            "layout",
            "holds several images: import it without a tag",
        ));
    }
    for (desc, name) in manifests {
        let mb = verified_bytes(
            &blob_in(root, &desc.digest),
            Some(&desc.digest),
            &format!("manifest {}", desc.digest),
        )?;
        let m: Manifest = serde_json::from_slice(&mb)
            .map_err(|e| invalid(format!("manifest {}", desc.digest), e.to_string()))?;
        let cfg = verified_bytes(
            &blob_in(root, &m.config.digest),
            Some(&m.config.digest),
            &format!("config {}", m.config.digest),
        )?;
        let diff_ids = diff_ids_of(&cfg)?;
        if diff_ids.len() != m.layers.len() {
            return Err(invalid(
                format!("manifest {}", desc.digest),
                format!(
                    "{} layers, {} diff ids in the config",
                    m.layers.len(),
                    diff_ids.len()
                ),
            ));
        }
        let mut layers = Vec::new();
        for (ld, did) in m.layers.iter().zip(&diff_ids) {
            layers.push(import_layer(
                store,
                &blob_in(root, &ld.digest),
                Some(&ld.digest),
                Some(&ld.media_type),
                did,
                owned,
                progress,
            )?);
        }
        let name = tag.cloned().or(name);
        out.push(store.add_image_raw(&cfg, &layers, None, "import", name.as_ref())?);
    }
    Ok(out)
}

/// Manifests of an index for this host's platform (nested indexes followed), each
/// with the name its annotations give.
fn collect_manifests(
    root: &Path,
    descs: &[Descriptor],
    out: &mut Vec<(Descriptor, Option<ImageName>)>,
    depth: u32,
) -> Result<(), StoreError> {
    if depth > 4 {
        return Err(invalid("index.json", "indexes nested too deep"));
    }
    for d in descs {
        if let Some(p) = &d.platform {
            let os = p.get("os").and_then(Value::as_str).unwrap_or("linux");
            let arch = p
                .get("architecture")
                .and_then(Value::as_str)
                .unwrap_or(host_arch());
            if os != "linux" || arch != host_arch() {
                continue;
            }
        }
        match d.media_type.as_str() {
            media::OCI_INDEX | media::DOCKER_LIST => {
                let b = verified_bytes(
                    &blob_in(root, &d.digest),
                    Some(&d.digest),
                    &format!("index {}", d.digest),
                )?;
                let i: Index = serde_json::from_slice(&b)
                    .map_err(|e| invalid(format!("index {}", d.digest), e.to_string()))?;
                collect_manifests(root, &i.manifests, out, depth + 1)?;
            }
            media::OCI_MANIFEST | media::DOCKER_MANIFEST => {
                let ann = d.annotations.clone().unwrap_or_default();
                let name = ann
                    .get("io.containerd.image.name")
                    .and_then(|n| ImageName::parse(n).ok())
                    .or_else(|| {
                        ann.get("org.opencontainers.image.ref.name")
                            .filter(|n| n.contains(':') || n.contains('/'))
                            .and_then(|n| ImageName::parse(n).ok())
                    });
                out.push((d.clone(), name));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Writes an image as a tar holding both an OCI layout (`oci-layout`,
/// `index.json`, `blobs/`) and a `docker save` `manifest.json`, so either
/// `docker load` or OCI tools read it.
pub fn export<W: Write>(
    store: &ImageStore,
    img: &ImageInfo,
    names: &[ImageName],
    out: W,
    progress: &dyn Fn(Progress),
) -> Result<W, StoreError> {
    let cfg = store.config_bytes(&img.id)?;
    let manifest = manifest_json(store, img)?;
    let mdig = Digest::of(&manifest);
    let mut b = tar::Builder::new(out);
    let err = |e: std::io::Error| StoreError::Io {
        op: "write export",
        path: "archive".into(),
        source: e,
    };
    let add = |b: &mut tar::Builder<W>, path: &str, data: &[u8]| -> Result<(), StoreError> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data).map_err(err)
    };
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_uid(0);
    dir.set_gid(0);
    dir.set_mtime(0);
    dir.set_size(0);
    for d in ["blobs/", "blobs/sha256/"] {
        b.append_data(&mut dir.clone(), d, &[][..]).map_err(err)?;
    }
    add(&mut b, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add(&mut b, &format!("blobs/sha256/{}", img.id.hex()), &cfg)?;
    let mut seen = std::collections::HashSet::new();
    for l in &img.layers {
        if !seen.insert(l.blob) {
            continue;
        }
        progress(Progress::Start {
            layer: l.diff_id,
            size: l.blob_size,
        });
        let p = store.blob_path(&l.blob);
        let f = fs::File::open(&p).map_err(io_at("open", &p))?;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(l.blob_size);
        b.append_data(
            &mut h,
            format!("blobs/sha256/{}", l.blob.hex()),
            f.take(l.blob_size),
        )
        .map_err(err)?;
        progress(Progress::Done {
            layer: l.diff_id,
            cached: false,
        });
    }
    add(&mut b, &format!("blobs/sha256/{}", mdig.hex()), &manifest)?;
    let mut ann = serde_json::Map::new();
    if let Some(n) = names.first() {
        ann.insert("io.containerd.image.name".into(), json!(n.to_string()));
        ann.insert("org.opencontainers.image.ref.name".into(), json!(n.tag));
    }
    let index = json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_INDEX,
        "manifests": [{
            "mediaType": media::OCI_MANIFEST,
            "digest": mdig.to_string(),
            "size": manifest.len(),
            "annotations": Value::Object(ann),
        }],
    });
    add(
        &mut b,
        "index.json",
        &serde_json::to_vec(&index).expect("json"),
    )?;
    let docker = json!([{
        "Config": format!("blobs/sha256/{}", img.id.hex()),
        "RepoTags": names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
        "Layers": img.layers.iter().map(|l| format!("blobs/sha256/{}", l.blob.hex())).collect::<Vec<_>>(),
    }]);
    add(
        &mut b,
        "manifest.json",
        &serde_json::to_vec(&docker).expect("json"),
    )?;
    let mut w = b.into_inner().map_err(err)?;
    crate::write_all(&mut w, &[]).map_err(err)?;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether an image goes on top of the `host` image travels in its config's
    /// labels (an export imported again keeps it); labels of other tools that are
    /// not strings are no reason to refuse a config.
    #[test]
    fn the_host_base_survives_the_config_and_foreign_labels_are_ignored() {
        let cfg = ImageConfig {
            env: vec!["A=1".into()],
            host_base: true,
            ..Default::default()
        };
        let back = parse_config(&config_json(&[], &cfg, "test", None, None)).unwrap();
        assert_eq!(back, cfg);
        let plain =
            parse_config(&config_json(&[], &ImageConfig::default(), "t", None, None)).unwrap();
        assert!(!plain.host_base);
        let odd =
            br#"{"config":{"Labels":{"n":1,"org.sandlot.base":"other"}},"rootfs":{"diff_ids":[]}}"#;
        assert!(!parse_config(odd).unwrap().host_base);
    }
}
