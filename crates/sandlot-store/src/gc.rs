//! What keeps an image alive and what goes: leases held by sandboxes, removal of
//! a reference, and pruning of what nothing references.

use std::fs;

use rusqlite::params;

use crate::{
    dir_size, io_at, now_ms, sql, Digest, ImageName, ImageStore, PruneReport, Removal, StoreError,
};

impl ImageStore {
    /// Records that `holder` (a sandbox id) uses `image`: it cannot be removed and
    /// its layers are not pruned until [`release`](Self::release).
    pub fn lease(&self, holder: &str, image: &Digest) -> Result<(), StoreError> {
        self.db()
            .execute(
                "INSERT INTO leases(holder, image_id, created_at) VALUES(?1,?2,?3)
                 ON CONFLICT(holder) DO UPDATE SET image_id = excluded.image_id",
                params![holder, image.to_string(), now_ms()],
            )
            .map_err(sql("record lease"))?;
        Ok(())
    }

    pub fn release(&self, holder: &str) -> Result<(), StoreError> {
        self.db()
            .execute("DELETE FROM leases WHERE holder = ?1", [holder])
            .map_err(sql("drop lease"))?;
        Ok(())
    }

    /// Records image `reference` as an orphan: its owner let it go while
    /// holders still lease it, and it goes once the last of them lets it go (the
    /// record outlives a restart of the daemon).
    pub fn mark_orphan(&self, reference: &str) -> Result<(), StoreError> {
        self.db()
            .execute(
                "INSERT OR IGNORE INTO orphans(reference) VALUES(?1)",
                [reference],
            )
            .map_err(sql("record orphan"))?;
        Ok(())
    }

    /// Forgets that image `reference` is an orphan (it was removed or named).
    pub fn unmark_orphan(&self, reference: &str) -> Result<(), StoreError> {
        self.db()
            .execute("DELETE FROM orphans WHERE reference = ?1", [reference])
            .map_err(sql("forget orphan"))?;
        Ok(())
    }

    /// Every image recorded as an orphan.
    pub fn orphans(&self) -> Result<Vec<String>, StoreError> {
        let db = self.db();
        let mut st = db
            .prepare("SELECT reference FROM orphans ORDER BY reference")
            .map_err(sql("list orphans"))?;
        let rows = st
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(sql("list orphans"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("list orphans"));
        rows
    }

    /// (holder, image) of every lease.
    pub fn leases(&self) -> Result<Vec<(String, Digest)>, StoreError> {
        let db = self.db();
        let mut st = db
            .prepare("SELECT holder, image_id FROM leases ORDER BY holder")
            .map_err(sql("list leases"))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(sql("list leases"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql("list leases"))?;
        Ok(rows
            .into_iter()
            .filter_map(|(h, i)| i.parse().ok().map(|d| (h, d)))
            .collect())
    }

    /// Removes a tag, or (given an id, or a name that was the image's last tag)
    /// the image. Layers stay until [`prune`](Self::prune). An image a sandbox
    /// uses is refused.
    pub fn remove(&self, reference: &str) -> Result<Removal, StoreError> {
        let img = self.resolve(reference)?;
        let by_name = ImageName::parse(reference)
            .ok()
            .filter(|n| img.tags.contains(&n.to_string()));
        let _l = self.lock()?;
        let mut db = self.db();
        let tx = db.transaction().map_err(sql("begin"))?;
        if let Some(n) = &by_name {
            tx.execute(
                "DELETE FROM image_tags WHERE scope = '' AND name = ?1",
                [n.to_string()],
            )
            .map_err(sql("untag"))?;
            // A tenant's tag keeps the image too.
            if img.tags.len() + img.tenant_tags.len() > 1 {
                tx.commit().map_err(sql("commit"))?;
                return Ok(Removal {
                    image: img,
                    image_removed: false,
                });
            }
        }
        let holders: Vec<String> = {
            let mut st = tx
                .prepare("SELECT holder FROM leases WHERE image_id = ?1 ORDER BY holder")
                .map_err(sql("list leases"))?;
            let r = st
                .query_map([img.id.to_string()], |r| r.get(0))
                .map_err(sql("list leases"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql("list leases"))?;
            r
        };
        if !holders.is_empty() {
            return Err(StoreError::InUse {
                image: reference.to_string(),
                holders,
            });
        }
        // The owner is a column of the image's row: it goes with it, so a later
        // image with the same id (a pull, an import) is not the old owner's.
        for q in [
            "DELETE FROM image_tags WHERE image_id = ?1",
            "DELETE FROM image_layers WHERE image_id = ?1",
            "DELETE FROM build_cache WHERE image_id = ?1",
            "DELETE FROM images WHERE id = ?1",
        ] {
            tx.execute(q, [img.id.to_string()])
                .map_err(sql("remove image"))?;
        }
        tx.commit().map_err(sql("commit"))?;
        Ok(Removal {
            image: img,
            image_removed: true,
        })
    }

    /// Removes those of `layers` that no image uses any more (with their blobs,
    /// when nothing else refers to them): what removing one image frees at once,
    /// without a whole [`prune`](Self::prune). The caller keeps commits out
    /// meanwhile (a commit that found one of them already unpacked would lose
    /// it). Answers the bytes freed.
    pub fn remove_unused_layers(&self, layers: &[crate::LayerInfo]) -> Result<u64, StoreError> {
        let _l = self.lock()?;
        let mut freed = 0;
        for l in layers {
            let (used, blob_used) = {
                let db = self.db();
                let used: bool = db
                    .query_row(
                        "SELECT EXISTS(SELECT 1 FROM image_layers WHERE diff_id = ?1)",
                        [l.diff_id.to_string()],
                        |r| r.get(0),
                    )
                    .map_err(sql("find a layer's images"))?;
                let blob_used: bool = db
                    .query_row(
                        "SELECT EXISTS(SELECT 1 FROM layers WHERE blob = ?1 AND diff_id != ?2)
                         OR EXISTS(SELECT 1 FROM images WHERE id = ?1)",
                        params![l.blob.to_string(), l.diff_id.to_string()],
                        |r| r.get(0),
                    )
                    .map_err(sql("find a blob's users"))?;
                (used, blob_used)
            };
            if used {
                continue;
            }
            let dir = self.layer_dir(&l.diff_id);
            if dir.exists() {
                freed += dir_size(&dir);
                fs::remove_dir_all(&dir).map_err(io_at("remove layer", &dir))?;
            }
            self.db()
                .execute(
                    "DELETE FROM layers WHERE diff_id = ?1",
                    [l.diff_id.to_string()],
                )
                .map_err(sql("forget layer"))?;
            if !blob_used {
                let bp = self.blob_path(&l.blob);
                if let Ok(m) = fs::metadata(&bp) {
                    freed += m.len();
                    fs::remove_file(&bp).map_err(io_at("remove blob", &bp))?;
                }
            }
        }
        Ok(freed)
    }

    /// Removes layers that no image uses (leased images keep theirs: a lease is on
    /// an image, and a leased image cannot be removed), blobs nothing refers to,
    /// and stale staging files.
    pub fn prune(&self) -> Result<PruneReport, StoreError> {
        let _l = self.lock()?;
        let mut rep = PruneReport::default();
        let (dead_layers, live_blobs) = {
            let db = self.db();
            let mut st = db
                .prepare(
                    "SELECT diff_id FROM layers WHERE diff_id NOT IN (SELECT diff_id FROM image_layers)",
                )
                .map_err(sql("find unused layers"))?;
            let dead: Vec<String> = st
                .query_map([], |r| r.get(0))
                .map_err(sql("find unused layers"))?
                .collect::<Result<_, _>>()
                .map_err(sql("find unused layers"))?;
            let mut st = db
                .prepare(
                    "SELECT blob FROM layers WHERE diff_id IN (SELECT diff_id FROM image_layers)
                     UNION SELECT id FROM images",
                )
                .map_err(sql("find used blobs"))?;
            let live: std::collections::HashSet<String> = st
                .query_map([], |r| r.get(0))
                .map_err(sql("find used blobs"))?
                .collect::<Result<_, _>>()
                .map_err(sql("find used blobs"))?;
            (dead, live)
        };
        for d in dead_layers {
            let Ok(dg) = d.parse::<Digest>() else {
                continue;
            };
            let dir = self.layer_dir(&dg);
            if dir.exists() {
                rep.bytes += dir_size(&dir);
                fs::remove_dir_all(&dir).map_err(io_at("remove layer", &dir))?;
            }
            self.db()
                .execute("DELETE FROM layers WHERE diff_id = ?1", [&d])
                .map_err(sql("forget layer"))?;
            rep.layers.push(dg);
        }
        // Layer directories no record knows (an interrupted commit).
        if let Ok(rd) = fs::read_dir(self.root.join("layers")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Ok(dg) = Digest::from_hex(&name) {
                    if self.layer(&dg)?.is_none() {
                        rep.bytes += dir_size(&e.path());
                        let _ = fs::remove_dir_all(e.path());
                        rep.layers.push(dg);
                    }
                }
            }
        }
        let blobs = self.root.join("blobs/sha256");
        if let Ok(rd) = fs::read_dir(&blobs) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Ok(dg) = Digest::from_hex(&name) else {
                    continue;
                };
                if !live_blobs.contains(&dg.to_string()) {
                    rep.bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
                    let _ = fs::remove_file(e.path());
                    rep.blobs.push(dg);
                }
            }
        }
        // Staging older than an hour belongs to a process that died.
        if let Ok(rd) = fs::read_dir(self.root.join("tmp")) {
            for e in rd.flatten() {
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|a| a.as_secs() > 3600);
                if old {
                    let _ = fs::remove_dir_all(e.path()).or_else(|_| fs::remove_file(e.path()));
                }
            }
        }
        Ok(rep)
    }
}
