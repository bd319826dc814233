//! Text embedders: local all-MiniLM-L6-v2 (candle) and an OpenAI-compatible HTTP endpoint.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokenizers::{Tokenizer, TruncationParams};

use crate::minilm::{BertShape, MiniLm};

/// Env var overriding the model directory.
pub const MODEL_DIR_ENV: &str = "SANDLOT_MODEL_DIR";
/// Model id recorded with every stored vector of the local model.
pub const MINILM_MODEL_ID: &str = "all-MiniLM-L6-v2";
/// Tokens per input; longer inputs are truncated (as sentence-transformers' max_seq_length).
pub const MINILM_MAX_TOKENS: usize = 256;

/// Errors from embedding text.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error(
        "load embedding model from {dir}: {file} is missing; run scripts/setup.d/40-memory.sh \
         (or set {MODEL_DIR_ENV} to a directory holding model.safetensors, tokenizer.json and config.json)"
    )]
    ModelMissing { dir: PathBuf, file: &'static str },
    #[error("load embedding model from {dir}: {reason}")]
    ModelLoad { dir: PathBuf, reason: String },
    #[error("embed {count} texts with {model}: {reason}")]
    Inference {
        model: String,
        count: usize,
        reason: String,
    },
    #[error("embed {count} texts via {url}: {reason}")]
    Http {
        url: String,
        count: usize,
        reason: String,
    },
}

/// Turns texts into unit-length vectors of a fixed dimension. Implementations are shared between
/// threads (the daemon holds one per model).
pub trait Embedder: Send + Sync {
    /// A stable identifier of model and its configuration; vectors are keyed by it.
    fn model_id(&self) -> &str;
    /// Vector dimension.
    fn dim(&self) -> usize;
    /// Embeds `texts`, one L2-normalised vector per text, in order.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;
    /// Embeds one search query while the caller runs other work (BM25) on a second thread: an
    /// embedder that spreads a query over two cores does so only once `other_work_done` is
    /// set, so that the two threads do not compete for the cores. The same vector as
    /// [`Embedder::embed`]; by default, that method.
    fn embed_query(
        &self,
        text: &str,
        other_work_done: &AtomicBool,
    ) -> Result<Vec<f32>, EmbedError> {
        let _ = other_work_done;
        Ok(self.embed(&[text])?.pop().unwrap_or_default())
    }
}

/// The default model directory: `$SANDLOT_MODEL_DIR`, else `~/.cache/sandlot/models/all-MiniLM-L6-v2`.
pub fn default_model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(MODEL_DIR_ENV) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache/sandlot/models/all-MiniLM-L6-v2")
}

/// all-MiniLM-L6-v2 run on the CPU (a direct forward pass, see [`crate::minilm`]): mean pooling
/// over each text's tokens, then L2 normalisation, 384 dimensions — the sentence-transformers
/// semantics of that model.
pub struct MiniLmEmbedder {
    model: MiniLm,
    tokenizer: Tokenizer,
    calls: AtomicU64,
}

impl MiniLmEmbedder {
    /// Loads the model from `dir` (see [`default_model_dir`]).
    pub fn load(dir: &Path) -> Result<MiniLmEmbedder, EmbedError> {
        for file in ["model.safetensors", "tokenizer.json", "config.json"] {
            if !dir.join(file).is_file() {
                return Err(EmbedError::ModelMissing {
                    dir: dir.to_path_buf(),
                    file,
                });
            }
        }
        let load_err = |reason: String| EmbedError::ModelLoad {
            dir: dir.to_path_buf(),
            reason,
        };
        let config_text = std::fs::read_to_string(dir.join("config.json"))
            .map_err(|e| load_err(format!("read config.json: {e}")))?;
        let config: BertShape = serde_json::from_str(&config_text)
            .map_err(|e| load_err(format!("parse config.json: {e}")))?;
        if config.hidden_size != 384 {
            return Err(load_err(format!(
                "expected hidden_size 384 for all-MiniLM-L6-v2, config.json says {}",
                config.hidden_size
            )));
        }
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| load_err(format!("load tokenizer.json: {e}")))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MINILM_MAX_TOKENS.min(config.max_position_embeddings),
                ..Default::default()
            }))
            .map_err(|e| load_err(format!("configure truncation: {e}")))?;
        // Every text is encoded at its own length: the forward pass needs no padding.
        tokenizer.with_padding(None);
        let weights = std::fs::read(dir.join("model.safetensors"))
            .map_err(|e| load_err(format!("read model.safetensors: {e}")))?;
        let model = MiniLm::from_safetensors(&weights, &config).map_err(load_err)?;
        Ok(MiniLmEmbedder {
            model,
            tokenizer,
            calls: AtomicU64::new(0),
        })
    }

    /// Short inputs (search queries) use the f32 weights as well, instead of their 16-bit copy
    /// (which halves the memory a query's forward pass reads, within a cosine of 0.99999 of
    /// the f32 result). The benchmark's peer for the path before the 16-bit weights.
    pub fn with_f32_queries(mut self) -> MiniLmEmbedder {
        self.model.drop_packed_weights();
        self
    }

    /// Loads from [`default_model_dir`].
    pub fn load_default() -> Result<MiniLmEmbedder, EmbedError> {
        MiniLmEmbedder::load(&default_model_dir())
    }

    /// How many texts this embedder has embedded since it was loaded.
    pub fn texts_embedded(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        let encodings = if let [text] = texts {
            vec![self
                .tokenizer
                .encode(*text, true)
                .map_err(|e| format!("tokenize: {e}"))?]
        } else {
            self.tokenizer
                .encode_batch(texts.to_vec(), true)
                .map_err(|e| format!("tokenize: {e}"))?
        };
        let ids: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();
        self.model.embed(&ids, None).map_err(|e| e.to_string())
    }
}

/// Texts per forward pass (sorted by length; bounds the activations' memory).
const MINILM_BATCH: usize = 32;

impl Embedder for MiniLmEmbedder {
    fn model_id(&self) -> &str {
        MINILM_MODEL_ID
    }

    fn dim(&self) -> usize {
        self.model.hidden()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.calls.fetch_add(texts.len() as u64, Ordering::Relaxed);
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for group in order.chunks(MINILM_BATCH) {
            let batch: Vec<&str> = group.iter().map(|&i| texts[i]).collect();
            let vecs = self
                .embed_batch(&batch)
                .map_err(|e| EmbedError::Inference {
                    model: MINILM_MODEL_ID.to_string(),
                    count: texts.len(),
                    reason: e,
                })?;
            for (&i, v) in group.iter().zip(vecs) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    fn embed_query(
        &self,
        text: &str,
        other_work_done: &AtomicBool,
    ) -> Result<Vec<f32>, EmbedError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let err = |reason: String| EmbedError::Inference {
            model: MINILM_MODEL_ID.to_string(),
            count: 1,
            reason,
        };
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| err(format!("tokenize: {e}")))?;
        let mut v = self
            .model
            .embed(&[enc.get_ids()], Some(other_work_done))
            .map_err(|e| err(e.to_string()))?;
        Ok(v.pop().unwrap_or_default())
    }
}

/// An OpenAI-compatible `POST {base}/embeddings` endpoint (`{"model": ..., "input": [...]}` →
/// `{"data": [{"index": i, "embedding": [...]}]}`). Plain HTTP; put a TLS-terminating proxy on
/// loopback in front of a remote endpoint.
pub struct HttpEmbedder {
    url: String,
    model: String,
    model_id: String,
    dim: usize,
    api_key: Option<String>,
    agent: ureq::Agent,
}

impl HttpEmbedder {
    /// `base_url` like `http://127.0.0.1:8080/v1`; `dim` is the model's vector dimension (checked
    /// on every response).
    pub fn new(base_url: &str, model: &str, dim: usize, api_key: Option<String>) -> HttpEmbedder {
        let url = format!("{}/embeddings", base_url.trim_end_matches('/'));
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(60)))
            .http_status_as_error(false)
            .build();
        HttpEmbedder {
            model_id: format!("http:{model}"),
            url,
            model: model.to_string(),
            dim,
            api_key,
            agent: config.into(),
        }
    }
}

#[derive(serde::Serialize)]
struct EmbeddingRequest<'a> {
    model: &'a str,
    input: &'a [&'a str],
}

#[derive(serde::Deserialize)]
struct EmbeddingResponse {
    data: Vec<EmbeddingItem>,
}

#[derive(serde::Deserialize)]
struct EmbeddingItem {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vec<f32>,
}

impl Embedder for HttpEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let err = |reason: String| EmbedError::Http {
            url: self.url.clone(),
            count: texts.len(),
            reason,
        };
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let body = serde_json::to_vec(&EmbeddingRequest {
            model: &self.model,
            input: texts,
        })
        .map_err(|e| err(format!("encode request: {e}")))?;
        let mut req = self
            .agent
            .post(&self.url)
            .header("content-type", "application/json");
        if let Some(k) = &self.api_key {
            req = req.header("authorization", &format!("Bearer {k}"));
        }
        let mut resp = req.send(&body[..]).map_err(|e| err(e.to_string()))?;
        let status = resp.status();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| err(format!("read response: {e}")))?;
        if !status.is_success() {
            let snippet: String = text.chars().take(300).collect();
            return Err(err(format!("status {status}: {snippet}")));
        }
        let parsed: EmbeddingResponse =
            serde_json::from_str(&text).map_err(|e| err(format!("decode response: {e}")))?;
        if parsed.data.len() != texts.len() {
            return Err(err(format!(
                "expected {} embeddings, got {}",
                texts.len(),
                parsed.data.len()
            )));
        }
        let mut out = vec![Vec::new(); texts.len()];
        for (pos, item) in parsed.data.into_iter().enumerate() {
            let i = item.index.unwrap_or(pos);
            if i >= texts.len() || !out[i].is_empty() {
                return Err(err(format!("bad or duplicate index {i} in response")));
            }
            if item.embedding.len() != self.dim {
                return Err(err(format!(
                    "expected dimension {}, got {}",
                    self.dim,
                    item.embedding.len()
                )));
            }
            out[i] = normalize(item.embedding);
        }
        Ok(out)
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn normalize(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
    v
}

/// Dot product (cosine similarity for unit vectors); AVX2 + FMA where the CPU has them.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    crate::kernels::dot(a, b)
}

/// A deterministic bag-of-words hashing embedder. For unit tests only: it has no semantics
/// beyond shared words, so it is never used in end-to-end tests or benchmarks.
#[cfg(test)]
pub(crate) struct HashingEmbedder {
    pub dim: usize,
    pub calls: AtomicU64,
}

#[cfg(test)]
impl HashingEmbedder {
    pub fn new(dim: usize) -> HashingEmbedder {
        HashingEmbedder {
            dim,
            calls: AtomicU64::new(0),
        }
    }
    pub fn texts_embedded(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
impl Embedder for HashingEmbedder {
    fn model_id(&self) -> &str {
        "test-hashing"
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.calls.fetch_add(texts.len() as u64, Ordering::Relaxed);
        Ok(texts
            .iter()
            .map(|t| {
                let mut v = vec![0f32; self.dim];
                for w in t
                    .split(|c: char| !c.is_alphanumeric())
                    .filter(|w| !w.is_empty())
                {
                    let mut h: u64 = 0xcbf29ce484222325;
                    for b in w.to_lowercase().bytes() {
                        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
                    }
                    v[(h % self.dim as u64) as usize] += 1.0;
                }
                normalize(v)
            })
            .collect())
    }
}
