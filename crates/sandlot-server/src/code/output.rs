//! What a run hands back, and how much of the daemon's memory it may hold. A
//! result's MIME bundle is kept as the JSON text the driver sent, written
//! compactly and checked for what clients cannot parse (never parsed into
//! values, which can take tens of times its text); stream text and results
//! count against the run's caps with an overhead per chunk, result and format;
//! and what the runs of one sandbox hold at once is capped by its
//! [`OutputPool`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sandlot_proto::api::code::{CodeError, CodeEvent, RunStatus};
use serde::de::{Deserializer, Error as _, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Stream text (stdout and stderr together) one run may produce; past it a marker.
pub const MAX_STREAM: usize = 8 << 20;
/// Results one run may produce, in count and in bytes of their bundles.
pub const MAX_RESULTS: usize = 256;
pub const MAX_RESULT_BYTES: usize = 32 << 20;
/// Formats (MIME types) one result may carry; a bundle with more is dropped.
pub const MAX_FORMATS: usize = 64;
/// Exceptions one run sends (its first; later ones are left out).
pub const MAX_EXCEPTIONS: usize = 1;
/// What the runs of one sandbox may hold at once (output produced and not yet
/// sent or answered); past it their output is cut.
pub const MAX_SANDBOX_OUTPUT: usize = 96 << 20;
/// What the runs of all the sandboxes of one tenant may hold at once; past it
/// their output is cut, whatever each sandbox's own pool has left.
pub const MAX_TENANT_OUTPUT: usize = 256 << 20;
/// Counted for each chunk of stream text on top of its text (what holding a
/// chunk costs: its string, its slot in a list, its event), for each result
/// and for each of its formats.
pub const CHUNK_OVERHEAD: usize = 64;
pub const RESULT_OVERHEAD: usize = 256;
pub const FORMAT_OVERHEAD: usize = 64;

/// The marker ending a run's stream text past [`MAX_STREAM`].
pub const TRUNCATED: &str = "\n[output truncated: the cell wrote more than 8 MiB]\n";
/// The marker ending a run's stream text when its sandbox's runs hold too much.
pub const SANDBOX_FULL: &str =
    "\n[output truncated: this sandbox's runs hold 96 MiB of output not yet read]\n";
/// The marker ending a run's stream text when its tenant's runs hold too much.
pub const TENANT_FULL: &str =
    "\n[output truncated: the runs of this tenant's sandboxes hold 256 MiB of output not yet read]\n";

/// How deeply a format's JSON may nest.
pub const MAX_DEPTH: usize = 64;

/// A MIME bundle as the driver sent it: each format's JSON text, never parsed
/// into values, written compactly (see [`compact_json`]). A bundle with a
/// format that JSON refuses is kept empty and marked refused.
#[derive(Debug, Clone, Default)]
pub struct RawBundle(BTreeMap<String, Box<RawValue>>, bool);

/// Why a format's JSON is refused (a client parses a whole answer and fails on
/// any of these).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum JsonRefusal {
    #[error("it nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("a string holds a lone surrogate")]
    LoneSurrogate,
    #[error("a number fits no 64-bit integer and no finite double")]
    Number,
    #[error("it is not one JSON value")]
    Malformed,
}

/// `json` (one JSON value, its syntax already checked) written compactly: no
/// whitespace between tokens (a raw `\r` there splits the lines of clients
/// that split on it), strings and numbers as they came. Refused when it nests
/// deeper than [`MAX_DEPTH`], escapes a lone surrogate in a string, or has a
/// number that no 64-bit integer or finite double holds. Read in one pass,
/// without recursion and without building values.
pub fn compact_json(json: &str) -> Result<String, JsonRefusal> {
    let b = json.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        let end = match b[i] {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(JsonRefusal::TooDeep);
                }
                i + 1
            }
            b']' | b'}' => {
                depth = depth.checked_sub(1).ok_or(JsonRefusal::Malformed)?;
                i + 1
            }
            b',' | b':' => i + 1,
            b'"' => string_end(b, i)?,
            b'-' | b'0'..=b'9' => number_end(json, i)?,
            _ => {
                let e = i + b[i..].iter().take_while(|c| c.is_ascii_lowercase()).count();
                match &b[i..e] {
                    b"true" | b"false" | b"null" => e,
                    _ => return Err(JsonRefusal::Malformed),
                }
            }
        };
        out.extend_from_slice(&b[i..end]);
        i = end;
    }
    if depth != 0 {
        return Err(JsonRefusal::Malformed);
    }
    String::from_utf8(out).map_err(|_| JsonRefusal::Malformed)
}

/// Where the string starting at `start` ends (after its closing quote); a
/// surrogate escape must be a high one followed by a low one.
fn string_end(b: &[u8], start: usize) -> Result<usize, JsonRefusal> {
    let mut i = start + 1;
    // The last escape was a high surrogate: a low one must follow.
    let mut high = false;
    loop {
        match (b.get(i), b.get(i + 1)) {
            (None, _) => return Err(JsonRefusal::Malformed),
            (Some(b'\\'), Some(b'u')) => {
                let unit = b
                    .get(i + 2..i + 6)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u16::from_str_radix(h, 16).ok())
                    .ok_or(JsonRefusal::Malformed)?;
                let low = (0xdc00..0xe000).contains(&unit);
                if high != low {
                    return Err(JsonRefusal::LoneSurrogate);
                }
                high = (0xd800..0xdc00).contains(&unit);
                i += 6;
                continue;
            }
            _ if high => return Err(JsonRefusal::LoneSurrogate),
            (Some(b'"'), _) => return Ok(i + 1),
            (Some(b'\\'), _) => i += 2,
            (Some(_), _) => i += 1,
        }
    }
}

/// Where the number starting at `start` ends, if a 64-bit integer or a finite
/// double holds it.
fn number_end(json: &str, start: usize) -> Result<usize, JsonRefusal> {
    let len = json.as_bytes()[start..]
        .iter()
        .take_while(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        .count();
    let n = &json[start..start + len];
    let fits = if n.contains(['.', 'e', 'E']) {
        n.parse::<f64>().is_ok_and(f64::is_finite)
    } else {
        n.parse::<i64>().is_ok() || n.parse::<u64>().is_ok()
    };
    if fits {
        Ok(start + len)
    } else {
        Err(JsonRefusal::Number)
    }
}

impl RawBundle {
    pub fn get(&self, mime: &str) -> Option<&RawValue> {
        self.0.get(mime).map(|v| &**v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &RawValue)> {
        self.0.iter().map(|(k, v)| (k.as_str(), &**v))
    }

    pub fn contains(&self, mime: &str) -> bool {
        self.0.contains_key(mime)
    }

    /// A format's JSON was refused: the result is left out.
    pub fn refused(&self) -> bool {
        self.1
    }

    /// Bytes it counts for: its text and an overhead per format.
    pub fn cost(&self) -> usize {
        self.0
            .iter()
            .map(|(k, v)| k.len() + v.get().len() + FORMAT_OVERHEAD)
            .sum()
    }
}

impl RawBundle {
    /// Bytes its widest wire form takes: [`RawBundle::cost`], and its
    /// `application/json` once more where a `text/html` comes with it (E2B's
    /// result writes a DataFrame's data as `json` and as `data`).
    pub fn wire_cost(&self) -> usize {
        let twice = match (self.get("application/json"), self.contains("text/html")) {
            (Some(j), true) => j.get().len(),
            _ => 0,
        };
        self.cost() + twice
    }
}

/// The length of `s` written as a JSON string's content (escapes included).
pub fn json_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

impl PartialEq for RawBundle {
    fn eq(&self, o: &RawBundle) -> bool {
        self.1 == o.1
            && self.0.len() == o.0.len()
            && self
                .0
                .iter()
                .zip(&o.0)
                .all(|((k, v), (ok, ov))| k == ok && v.get() == ov.get())
    }
}

impl<'de> Deserialize<'de> for RawBundle {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawBundle, D::Error> {
        struct Formats;
        impl<'de> Visitor<'de> for Formats {
            type Value = RawBundle;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a MIME bundle of at most {MAX_FORMATS} formats")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<RawBundle, A::Error> {
                let mut out = BTreeMap::new();
                let mut formats = 0;
                let mut refused = false;
                while let Some(k) = m.next_key::<String>()? {
                    if formats >= MAX_FORMATS {
                        return Err(A::Error::custom(format!(
                            "a result with more than {MAX_FORMATS} formats"
                        )));
                    }
                    formats += 1;
                    let v: Box<RawValue> = m.next_value()?;
                    if refused {
                        continue;
                    }
                    match compact_json(v.get()) {
                        Ok(c) if c.len() == v.get().len() => {
                            out.insert(k, v);
                        }
                        Ok(c) => {
                            drop(v);
                            out.insert(k, RawValue::from_string(c).map_err(A::Error::custom)?);
                        }
                        Err(e) => {
                            tracing::debug!(len = v.get().len(), "refusing a result's format: {e}");
                            refused = true;
                            out.clear();
                        }
                    }
                }
                Ok(RawBundle(out, refused))
            }
        }
        d.deserialize_map(Formats)
    }
}

impl Serialize for RawBundle {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// One result of a run (the wire form of `sandlot_proto`'s `CodeResult`).
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub is_main_result: bool,
    pub data: RawBundle,
}

/// What a run sends: the native events, with results kept as JSON text
/// (serialized as `CodeEvent`).
#[derive(Debug, Clone)]
pub enum RunEvent {
    Code(CodeEvent),
    Result(RunResult),
}

impl From<CodeEvent> for RunEvent {
    fn from(e: CodeEvent) -> RunEvent {
        RunEvent::Code(e)
    }
}

impl Serialize for RunEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RunEvent::Code(e) => e.serialize(s),
            RunEvent::Result(r) => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("type", "result")?;
                m.serialize_entry("result", r)?;
                m.end()
            }
        }
    }
}

/// The outcome of a run as answered (the wire form of `Execution`), and what it
/// holds of its sandbox's [`OutputPool`] until it is dropped.
#[derive(Debug, Serialize)]
pub struct RunOutput {
    pub results: Vec<RunResult>,
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<CodeError>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<u64>,
    pub status: RunStatus,
    pub restarted: bool,
    pub truncated: bool,
    #[serde(skip)]
    pub held: Held,
}

/// What the runs of one sandbox (or of all a tenant's sandboxes) hold at once,
/// and its cap. A sandbox's pool lies within its tenant's: bytes taken from it
/// are taken from both, and fit only if they fit under both caps.
#[derive(Debug)]
pub struct OutputPool {
    held: AtomicUsize,
    cap: usize,
    /// The marker a run's stream text ends with when this pool is full.
    full: &'static str,
    /// The pool this one lies within (a sandbox's, its tenant's).
    within: Option<Arc<OutputPool>>,
}

impl OutputPool {
    /// A pool of its own (`cap` bytes), full with [`SANDBOX_FULL`].
    pub fn new(cap: usize) -> Arc<OutputPool> {
        OutputPool::nested(cap, SANDBOX_FULL, None)
    }

    /// A tenant's pool: what all its sandboxes' runs hold.
    pub fn tenant() -> Arc<OutputPool> {
        OutputPool::nested(MAX_TENANT_OUTPUT, TENANT_FULL, None)
    }

    /// A sandbox's pool within its tenant's.
    pub fn sandbox(tenant: Arc<OutputPool>) -> Arc<OutputPool> {
        OutputPool::nested(MAX_SANDBOX_OUTPUT, SANDBOX_FULL, Some(tenant))
    }

    fn nested(cap: usize, full: &'static str, within: Option<Arc<OutputPool>>) -> Arc<OutputPool> {
        Arc::new(OutputPool {
            held: AtomicUsize::new(0),
            cap,
            full,
            within,
        })
    }

    /// The pool this one lies within, if any.
    pub fn within(&self) -> Option<&Arc<OutputPool>> {
        self.within.as_ref()
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Takes `n` bytes if they fit under the cap (and under the caps of the
    /// pools this one lies within).
    pub fn take(self: &Arc<Self>, n: usize) -> Option<Held> {
        self.take_or_full(n).ok()
    }

    /// [`OutputPool::take`], or the marker of the pool that had no room.
    pub fn take_or_full(self: &Arc<Self>, n: usize) -> Result<Held, &'static str> {
        self.reserve(n)?;
        Ok(Held {
            pool: Some(self.clone()),
            bytes: n,
        })
    }

    fn reserve(&self, n: usize) -> Result<(), &'static str> {
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| {
                h.checked_add(n).filter(|t| *t <= self.cap)
            })
            .map_err(|_| self.full)?;
        if let Some(outer) = &self.within {
            if let Err(full) = outer.reserve(n) {
                self.held.fetch_sub(n, Ordering::SeqCst);
                return Err(full);
            }
        }
        Ok(())
    }

    fn release(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::SeqCst);
        if let Some(outer) = &self.within {
            outer.release(n);
        }
    }
}

/// The output pools of the daemon's tenants, each alive while a sandbox of its
/// tenant is (a sandbox's pool holds its tenant's).
#[derive(Debug, Default)]
pub struct TenantPools(
    std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<OutputPool>>>,
);

impl TenantPools {
    /// The pool of `tenant`'s sandboxes, made if none of them has one now.
    pub fn of(&self, tenant: &str) -> Arc<OutputPool> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(tenant).and_then(std::sync::Weak::upgrade) {
            return p;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let p = OutputPool::tenant();
        map.insert(tenant.to_string(), Arc::downgrade(&p));
        p
    }
}

/// Bytes taken from an [`OutputPool`], given back when dropped.
#[derive(Debug, Default)]
pub struct Held {
    pool: Option<Arc<OutputPool>>,
    bytes: usize,
}

impl Held {
    /// Takes `n` more bytes of `pool` if they fit.
    pub fn grow(&mut self, pool: &Arc<OutputPool>, n: usize) -> bool {
        match pool.take(n) {
            Some(h) => {
                self.absorb(h);
                true
            }
            None => false,
        }
    }

    /// Holds `other`'s bytes too (of the same pool).
    pub fn absorb(&mut self, mut other: Held) {
        if self.pool.is_none() {
            self.pool = other.pool.take();
        }
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(p) = &self.pool {
            p.release(self.bytes);
        }
    }
}

/// Which stream a chunk of text is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn event(self, text: String) -> CodeEvent {
        match self {
            Stream::Stdout => CodeEvent::Stdout { text },
            Stream::Stderr => CodeEvent::Stderr { text },
        }
    }
}

/// What a run may still produce, and what it has taken from its sandbox's pool.
pub struct Budget {
    pool: Arc<OutputPool>,
    stream: usize,
    results: usize,
    result_bytes: usize,
    stream_cut: bool,
    exceptions: usize,
    /// The stream of the last event sent, if it was stream text: a chunk on the
    /// same stream is merged into it where the run's output is collected.
    last: Option<Stream>,
    /// A cut for lack of room anywhere, or past a cap.
    pub truncated: bool,
}

impl Budget {
    pub fn new(pool: Arc<OutputPool>) -> Budget {
        Budget {
            pool,
            stream: 0,
            results: 0,
            result_bytes: 0,
            stream_cut: false,
            exceptions: 0,
            last: None,
            truncated: false,
        }
    }

    /// The part of `text` within the run's stream cap and its sandbox's and
    /// tenant's pools (the marker once past any), with what it holds of them.
    pub fn stream(&mut self, on: Stream, text: &str) -> Option<(String, Held)> {
        if self.stream_cut || text.is_empty() {
            return None;
        }
        let overhead = if self.last == Some(on) {
            0
        } else {
            CHUNK_OVERHEAD
        };
        let room = MAX_STREAM.saturating_sub(self.stream + overhead);
        let (mut keep, mut marker) = if text.len() <= room {
            (text.len(), None)
        } else {
            (room, Some(TRUNCATED))
        };
        while !text.is_char_boundary(keep) {
            keep -= 1;
        }
        // Counted as written: a control character takes six bytes in JSON.
        let held = match self.pool.take_or_full(json_len(&text[..keep]) + overhead) {
            Ok(h) => h,
            Err(full) => {
                keep = 0;
                marker = Some(full);
                Held::default()
            }
        };
        self.stream += keep + overhead;
        self.last = Some(on);
        let mut t = text[..keep].to_string();
        if let Some(m) = marker {
            self.stream_cut = true;
            self.truncated = true;
            t.push_str(m);
        }
        Some((t, held))
    }

    /// Whether a result fits (and what it holds of the pool); one that does not
    /// is left out and the run marked truncated.
    pub fn result(&mut self, data: &RawBundle) -> Option<Held> {
        let size = data.wire_cost() + RESULT_OVERHEAD;
        if data.refused()
            || self.results >= MAX_RESULTS
            || self.result_bytes + size > MAX_RESULT_BYTES
        {
            self.truncated = true;
            return None;
        }
        let Some(held) = self.pool.take(size) else {
            self.truncated = true;
            return None;
        };
        self.results += 1;
        self.result_bytes += size;
        self.last = None;
        Some(held)
    }

    /// Whether an exception is sent (a run's first only), and what it holds of
    /// the pool: once for its event and once for the copy the run's end
    /// carries. One the pool has no room for is sent without its traceback,
    /// its value cut to 1000 bytes, and the run marked truncated.
    pub fn exception(&mut self, e: &mut CodeError) -> Option<(Held, Held)> {
        if self.exceptions >= MAX_EXCEPTIONS {
            return None;
        }
        self.exceptions += 1;
        self.last = None;
        let size =
            json_len(&e.name) + json_len(&e.value) + json_len(&e.traceback) + RESULT_OVERHEAD;
        if let Some(event) = self.pool.take(size) {
            if let Some(end) = self.pool.take(size) {
                return Some((event, end));
            }
        }
        self.truncated = true;
        e.traceback = String::new();
        let mut keep = e.value.len().min(1000);
        while !e.value.is_char_boundary(keep) {
            keep -= 1;
        }
        e.value.truncate(keep);
        e.value.shrink_to_fit();
        Some((Held::default(), Held::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandlot_proto::api::code::Execution;

    fn bundle(json: &str) -> RawBundle {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn stream_budget_cuts_once_with_a_marker() {
        let pool = OutputPool::new(usize::MAX);
        let mut b = Budget::new(pool.clone());
        let big = "x".repeat(MAX_STREAM - CHUNK_OVERHEAD - 3);
        let (t, _h) = b.stream(Stream::Stdout, &big).unwrap();
        assert_eq!(t.len(), big.len());
        let (t, _h2) = b.stream(Stream::Stdout, "abcdef").unwrap();
        assert!(t.starts_with("abc") && t.ends_with(TRUNCATED), "{t}");
        assert!(b.truncated);
        assert_eq!(b.stream(Stream::Stdout, "more").map(|x| x.0), None);
    }

    #[test]
    fn each_new_chunk_counts_its_overhead_and_empty_text_is_no_chunk() {
        let mut b = Budget::new(OutputPool::new(usize::MAX));
        assert!(b.stream(Stream::Stdout, "").is_none());
        let mut chunks = 0;
        // Alternating streams: every chunk is a new one and pays its overhead.
        while !b.truncated {
            let on = if chunks % 2 == 0 {
                Stream::Stdout
            } else {
                Stream::Stderr
            };
            b.stream(on, "x").unwrap();
            chunks += 1;
        }
        assert!(chunks <= MAX_STREAM / CHUNK_OVERHEAD + 1, "{chunks}");
        // One stream in a row is merged where collected: no overhead after the first.
        let mut b = Budget::new(OutputPool::new(usize::MAX));
        for _ in 0..1000 {
            b.stream(Stream::Stdout, "x").unwrap();
        }
        assert_eq!(b.stream, 1000 + CHUNK_OVERHEAD);
    }

    #[test]
    fn stream_text_is_counted_at_its_length_as_json() {
        let pool = OutputPool::new(usize::MAX);
        let mut b = Budget::new(pool.clone());
        let (t, _held) = b.stream(Stream::Stdout, &"\u{1}".repeat(100)).unwrap();
        assert_eq!(t.len(), 100);
        let written = serde_json::to_string(&t).unwrap().len() - 2;
        assert_eq!(pool.held(), written + CHUNK_OVERHEAD);
        assert_eq!(json_len("a\"\\\n\u{1f}é"), 1 + 2 + 2 + 2 + 6 + 2);
    }

    #[test]
    fn a_dataframe_counts_its_json_twice() {
        let frame = bundle(r#"{"text/html":"<t/>","application/json":{"data":[1]}}"#);
        let json = bundle(r#"{"application/json":{"data":[1]}}"#);
        assert_eq!(frame.wire_cost(), frame.cost() + r#"{"data":[1]}"#.len());
        assert_eq!(json.wire_cost(), json.cost());
    }

    #[test]
    fn a_run_sends_its_first_exception_only_and_counts_it_twice() {
        let pool = OutputPool::new(usize::MAX);
        let mut b = Budget::new(pool.clone());
        let mut e = CodeError {
            name: "ValueError".into(),
            value: "bad".into(),
            traceback: "t".repeat(1000),
        };
        let size = 10 + 3 + 1000 + RESULT_OVERHEAD;
        let held = b.exception(&mut e).unwrap();
        assert_eq!(pool.held(), 2 * size);
        assert!(b.exception(&mut e.clone()).is_none());
        drop(held);
        assert_eq!(pool.held(), 0);
        // No room: sent small, the run marked truncated.
        let mut b = Budget::new(OutputPool::new(1000));
        let mut big = CodeError {
            name: "E".into(),
            value: "v".repeat(5000),
            traceback: "t".repeat(5000),
        };
        assert!(b.exception(&mut big).is_some());
        assert_eq!((big.value.len(), big.traceback.len()), (1000, 0));
        assert!(b.truncated);
    }

    #[test]
    fn result_budget_counts_results_and_their_formats() {
        let mut b = Budget::new(OutputPool::new(usize::MAX));
        let data = bundle(r#"{"text/plain":"1"}"#);
        for _ in 0..MAX_RESULTS {
            assert!(b.result(&data).is_some());
        }
        assert!(b.result(&data).is_none());
        assert!(b.truncated);
        assert_eq!(
            data.cost(),
            "text/plain".len() + "\"1\"".len() + FORMAT_OVERHEAD
        );
    }

    #[test]
    fn a_bundle_is_kept_as_text_and_has_few_formats() {
        let b = bundle(r#"{"application/json": [ {"a":0}, 1.50 ], "text/plain": "x"}"#);
        assert_eq!(
            b.get("application/json").unwrap().get(),
            r#"[{"a":0},1.50]"#
        );
        let many: String = (0..=MAX_FORMATS)
            .map(|i| format!("\"k{i}\":0"))
            .collect::<Vec<_>>()
            .join(",");
        let e = serde_json::from_str::<RawBundle>(&format!("{{{many}}}")).unwrap_err();
        assert!(e.to_string().contains("more than 64 formats"), "{e}");
    }

    /// Whether a bundle with `json` as a format is refused (by the syntax
    /// check or by the compact form).
    fn refused(json: &str) -> bool {
        let text = format!(r#"{{"text/plain":"x","application/json":{json}}}"#);
        match serde_json::from_str::<RawBundle>(&text) {
            Ok(b) => b.refused() && b.iter().next().is_none(),
            Err(_) => true,
        }
    }

    #[test]
    fn a_bundle_is_written_without_whitespace_between_tokens() {
        // Raw carriage returns between tokens would be line breaks to a client
        // splitting on them: an injected `end` line.
        let b = bundle("{\"application/json\":[\r{\"type\":\"end\"}\r,\n\t1 ]}");
        assert_eq!(
            b.get("application/json").unwrap().get(),
            r#"[{"type":"end"},1]"#
        );
        assert!(!b.refused());
        let s = bundle(r#"{"text/plain":" a \r\n b\ud83d\ude00 "}"#);
        assert_eq!(
            s.get("text/plain").unwrap().get(),
            r#"" a \r\n b\ud83d\ude00 ""#
        );
    }

    #[test]
    fn bundles_clients_cannot_parse_are_refused() {
        let deep = |n| format!("{}{}", "[".repeat(n), "]".repeat(n));
        for json in [
            deep(MAX_DEPTH + 1),
            r#""\ud800""#.into(),
            r#""\udc00""#.into(),
            r#""\ud800\u0041""#.into(),
            r#""\ud800x""#.into(),
            r#"{"\ud800":1}"#.into(),
            "1e400".into(),
            "-1e400".into(),
            "123456789012345678901234567890".into(),
            "18446744073709551616".into(),
        ] {
            assert!(refused(&json), "{json}");
        }
        for json in [
            deep(MAX_DEPTH),
            r#""\ud83d\ude00""#.into(),
            "18446744073709551615".into(),
            "-9223372036854775808".into(),
            "1.5e300".into(),
            "1e-400".into(),
        ] {
            assert!(!refused(&json), "{json}");
        }
        assert_eq!(
            compact_json(&deep(MAX_DEPTH + 1)),
            Err(JsonRefusal::TooDeep)
        );
        // A refused bundle is a result left out, the run marked truncated.
        let mut budget = Budget::new(OutputPool::new(usize::MAX));
        assert!(budget
            .result(&bundle(r#"{"text/plain":"x","a/b":1e999}"#))
            .is_none());
        assert!(budget.truncated);
    }

    #[test]
    fn the_sandbox_pool_caps_what_runs_hold_together_and_gets_it_back() {
        let pool = OutputPool::new(1000);
        let mut a = Budget::new(pool.clone());
        let mut b = Budget::new(pool.clone());
        let (t, held_a) = a.stream(Stream::Stdout, &"x".repeat(600)).unwrap();
        assert_eq!(t.len(), 600);
        assert_eq!(pool.held(), 600 + CHUNK_OVERHEAD);
        // The other run finds no room: its text is cut with the sandbox's marker.
        let (t, _) = b.stream(Stream::Stdout, &"y".repeat(600)).unwrap();
        assert_eq!(t, SANDBOX_FULL);
        assert!(b.truncated);
        assert!(b.result(&bundle(r#"{"text/plain":"1"}"#)).is_some());
        let mut all = Held::default();
        all.absorb(held_a);
        drop(all);
        assert!(pool.held() < 600);
        let big = bundle(&format!(r#"{{"text/plain":"{}"}}"#, "z".repeat(2000)));
        assert!(a.result(&big).is_none());
    }

    #[test]
    fn the_tenant_pool_caps_what_the_runs_of_all_its_sandboxes_hold_together() {
        let tenant = OutputPool::nested(1000, TENANT_FULL, None);
        let one = OutputPool::nested(800, SANDBOX_FULL, Some(tenant.clone()));
        let two = OutputPool::nested(800, SANDBOX_FULL, Some(tenant.clone()));
        let (mut a, mut b) = (Budget::new(one.clone()), Budget::new(two.clone()));
        let (t, held_a) = a.stream(Stream::Stdout, &"x".repeat(600)).unwrap();
        assert_eq!(t.len(), 600);
        assert_eq!((one.held(), tenant.held()), (664, 664));
        // The other sandbox's own pool has room; its tenant's does not: cut
        // with the tenant's marker, and nothing is left held anywhere.
        let (t, held_b) = b.stream(Stream::Stdout, &"y".repeat(600)).unwrap();
        assert_eq!(t, TENANT_FULL);
        assert!(b.truncated);
        drop(held_b);
        assert_eq!((two.held(), tenant.held()), (0, 664));
        // A sandbox's own cap still holds within a roomy tenant.
        let mut c = Budget::new(OutputPool::nested(100, SANDBOX_FULL, Some(tenant.clone())));
        assert_eq!(
            c.stream(Stream::Stderr, &"z".repeat(200)).unwrap().0,
            SANDBOX_FULL
        );
        assert_eq!(tenant.held(), 664);
        // What a run gives back is given back to its tenant too.
        drop(held_a);
        assert_eq!((one.held(), tenant.held()), (0, 0));
        let mut d = Budget::new(two.clone());
        assert!(d.result(&bundle(r#"{"text/plain":"1"}"#)).is_some());
    }

    #[test]
    fn a_tenants_pool_lives_while_a_sandbox_of_it_does_and_is_its_own() {
        let pools = TenantPools::default();
        let a = OutputPool::sandbox(pools.of("acme"));
        let b = OutputPool::sandbox(pools.of("acme"));
        let other = OutputPool::sandbox(pools.of("globex"));
        assert!(Arc::ptr_eq(a.within().unwrap(), b.within().unwrap()));
        assert!(!Arc::ptr_eq(a.within().unwrap(), other.within().unwrap()));
        let _held = a.take(10).unwrap();
        assert_eq!(pools.of("acme").held(), 10);
        assert_eq!(pools.of("globex").held(), 0);
        drop((a, b, _held));
        // No sandbox of acme holds its pool: the next is a fresh one.
        assert_eq!(pools.of("acme").held(), 0);
        assert_eq!(pools.0.lock().unwrap().len(), 2);
    }

    #[test]
    fn the_wire_forms_are_the_native_ones() {
        let r = RunResult {
            is_main_result: true,
            data: bundle(r#"{"text/plain":"'a'","application/json":{"k":[1,2]}}"#),
        };
        let ev: CodeEvent =
            serde_json::from_str(&serde_json::to_string(&RunEvent::Result(r.clone())).unwrap())
                .unwrap();
        let CodeEvent::Result { result } = ev else {
            panic!("{ev:?}")
        };
        assert!(result.is_main_result);
        assert_eq!(result.data["application/json"]["k"][1], 2);
        let out = RunOutput {
            results: vec![r],
            stdout: vec!["hi\n".into()],
            stderr: vec![],
            error: None,
            execution_count: Some(3),
            status: RunStatus::Ok,
            restarted: false,
            truncated: false,
            held: Held::default(),
        };
        let x: Execution = serde_json::from_slice(&serde_json::to_vec(&out).unwrap()).unwrap();
        assert_eq!(x.results[0].data["text/plain"], "'a'");
        assert_eq!(
            (x.stdout, x.execution_count),
            (vec!["hi\n".into()], Some(3))
        );
    }
}
