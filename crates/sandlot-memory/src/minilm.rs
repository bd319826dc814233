//! The all-MiniLM-L6-v2 encoder (BERT: 6 layers, 384 wide, 12 heads) as a direct forward pass
//! over plain f32 buffers.
//!
//! Why not a generic tensor library: a search embeds one short query (a dozen tokens), where
//! the work is ~0.25 GFLOP but a general-purpose graph spends most of its time around the
//! arithmetic: one allocation per operation, padding to a batch shape, masks, strided copies for
//! the attention heads, and thread-pool hand-offs for matrices far too small to share. Here a
//! batch is the concatenation of its sequences (no padding, no mask), the projections of a short
//! input run through [`kernels::linear`] (each weight read once, on the calling thread), and long
//! inputs (bulk indexing) through candle's blocked, multi-threaded GEMM.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use crate::kernels;

/// Inputs of at most this many tokens in total use the single-threaded small-matrix kernel;
/// larger ones candle's GEMM (packing and threads pay off there).
const SMALL_ROWS: usize = 64;

struct Dense {
    /// `n_out × n_in`, row-major (PyTorch `Linear` layout).
    w: Vec<f32>,
    b: Vec<f32>,
    n_in: usize,
    /// The same weights in 16 bits, for short inputs (see [`Dense::new`]).
    packed: Option<kernels::PackedWeights>,
}

impl Dense {
    /// A layer with both weight copies: f32 for long inputs (bulk indexing, through candle's
    /// GEMM) and 16-bit for short ones (a search query), whose forward pass is bound by reading
    /// the weights from memory: half the bytes, and the query vector stays within a cosine of
    /// 0.99999 of the f32 pass (tests/forward_pass.rs).
    fn new(w: Vec<f32>, b: Vec<f32>, n_in: usize) -> Dense {
        let packed = if n_in.is_multiple_of(16) {
            kernels::PackedWeights::pack(&w)
        } else {
            None
        };
        Dense { w, b, n_in, packed }
    }

    fn n_out(&self) -> usize {
        self.b.len()
    }

    /// `x` (`m × n_in`) times the weights plus bias: `m × n_out`.
    fn forward(&self, x: &[f32]) -> candle_core::Result<Vec<f32>> {
        let m = x.len() / self.n_in;
        if m <= SMALL_ROWS {
            return Ok(self.rows(x, 0..self.n_out()));
        }
        let cpu = Device::Cpu;
        let xt = Tensor::from_slice(x, (m, self.n_in), &cpu)?;
        let wt = Tensor::from_slice(&self.w, (self.n_out(), self.n_in), &cpu)?;
        let mut out = xt.matmul(&wt.t()?)?.flatten_all()?.to_vec1::<f32>()?;
        for row in out.chunks_exact_mut(self.n_out()) {
            for (v, b) in row.iter_mut().zip(&self.b) {
                *v += b;
            }
        }
        Ok(out)
    }
}

/// [`kernels::attention`] for long sequences: the score and context products as batched GEMMs
/// (one per head).
fn attention_gemm(
    qkv: &[f32],
    heads: usize,
    head_dim: usize,
    ctx: &mut [f32],
) -> candle_core::Result<()> {
    use candle_core::D;
    let len = qkv.len() / (3 * heads * head_dim);
    let all = Tensor::from_slice(qkv, (len, 3, heads, head_dim), &Device::Cpu)?;
    let part = |i: usize| -> candle_core::Result<Tensor> {
        // (len, heads, d) -> (heads, len, d)
        all.narrow(1, i, 1)?
            .squeeze(1)?
            .transpose(0, 1)?
            .contiguous()
    };
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let scores = (q.matmul(&k.t()?)? * (1.0 / (head_dim as f64).sqrt()))?;
    let e = scores
        .broadcast_sub(&scores.max_keepdim(D::Minus1)?)?
        .exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    let out = p.matmul(&v)?.transpose(0, 1)?.contiguous()?.flatten_all()?;
    out.to_vec1::<f32>().map(|v| ctx.copy_from_slice(&v))
}

impl Dense {
    /// Outputs `range` (weight rows) of the small-matrix product for the `m` rows of `x`:
    /// `m × range.len()`.
    fn rows(&self, x: &[f32], range: std::ops::Range<usize>) -> Vec<f32> {
        let k = self.n_in;
        let m = x.len() / k;
        let mut out = vec![0f32; m * range.len()];
        match &self.packed {
            Some(p) => kernels::linear_packed(
                x,
                k,
                &p.words[range.start * k / 2..range.end * k / 2],
                p.scale,
                &self.b[range.clone()],
                &mut out,
            ),
            None => kernels::linear(
                x,
                k,
                &self.w[range.start * k..range.end * k],
                &self.b[range.clone()],
                &mut out,
            ),
        }
        out
    }

    /// Where the weight rows are split between the calling thread and the helper.
    fn split(&self) -> usize {
        self.n_out() / 2 / 4 * 4
    }
}

/// Interleaves the row halves `lo` (`m × half`) and `hi` into one `m × n` matrix.
fn merge(lo: &[f32], hi: &[f32], half: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; lo.len() + hi.len()];
    for ((row, l), h) in out
        .chunks_exact_mut(n)
        .zip(lo.chunks_exact(half))
        .zip(hi.chunks_exact(n - half))
    {
        row[..half].copy_from_slice(l);
        row[half..].copy_from_slice(h);
    }
    out
}

/// Computes one dense layer's product plus bias for the encoder.
type Projection<'w, 'c> = dyn FnMut(&'w Dense, &[f32]) -> candle_core::Result<Vec<f32>> + 'c;

/// Cores available to this process.
static CORES: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
});

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

struct Layer {
    /// Query, key and value projections stacked into one `3h × h` matrix.
    qkv: Dense,
    attn_out: Dense,
    attn_norm: Norm,
    ffn_in: Dense,
    ffn_out: Dense,
    ffn_norm: Norm,
}

/// The encoder's weights and shape.
pub(crate) struct MiniLm {
    hidden: usize,
    heads: usize,
    eps: f32,
    vocab: usize,
    max_positions: usize,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    emb_norm: Norm,
    layers: Vec<Layer>,
}

/// The subset of a BERT `config.json` the forward pass needs.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct BertShape {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub layer_norm_eps: f64,
    pub hidden_act: String,
}

impl MiniLm {
    /// Builds the encoder from a safetensors file's bytes (tensor names as Hugging Face BERT
    /// checkpoints, with or without a `bert.` prefix).
    pub(crate) fn from_safetensors(bytes: &[u8], shape: &BertShape) -> Result<MiniLm, String> {
        if shape.hidden_act != "gelu" {
            return Err(format!(
                "hidden_act {:?} is not supported (all-MiniLM-L6-v2 uses \"gelu\")",
                shape.hidden_act
            ));
        }
        if shape.num_attention_heads == 0
            || !shape.hidden_size.is_multiple_of(shape.num_attention_heads)
        {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                shape.hidden_size, shape.num_attention_heads
            ));
        }
        let tensors: HashMap<String, Tensor> =
            candle_core::safetensors::load_buffer(bytes, &Device::Cpu)
                .map_err(|e| format!("parse model.safetensors: {e}"))?;
        let get = |name: &str, dims: &[usize]| -> Result<Vec<f32>, String> {
            let t = tensors
                .get(name)
                .or_else(|| tensors.get(&format!("bert.{name}")))
                .ok_or_else(|| format!("model.safetensors has no tensor {name}"))?;
            if t.dims() != dims {
                return Err(format!(
                    "tensor {name} has shape {:?}, expected {dims:?}",
                    t.dims()
                ));
            }
            t.to_dtype(DType::F32)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| format!("read tensor {name}: {e}"))
        };
        let h = shape.hidden_size;
        let inter = shape.intermediate_size;
        let dense = |name: &str, n_out: usize, n_in: usize| -> Result<Dense, String> {
            Ok(Dense::new(
                get(&format!("{name}.weight"), &[n_out, n_in])?,
                get(&format!("{name}.bias"), &[n_out])?,
                n_in,
            ))
        };
        let norm = |name: &str| -> Result<Norm, String> {
            Ok(Norm {
                gamma: get(&format!("{name}.weight"), &[h])?,
                beta: get(&format!("{name}.bias"), &[h])?,
            })
        };
        let mut layers = Vec::with_capacity(shape.num_hidden_layers);
        for l in 0..shape.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            let (q, k, v) = (
                dense(&format!("{p}.attention.self.query"), h, h)?,
                dense(&format!("{p}.attention.self.key"), h, h)?,
                dense(&format!("{p}.attention.self.value"), h, h)?,
            );
            let qkv = Dense::new([q.w, k.w, v.w].concat(), [q.b, k.b, v.b].concat(), h);
            layers.push(Layer {
                qkv,
                attn_out: dense(&format!("{p}.attention.output.dense"), h, h)?,
                attn_norm: norm(&format!("{p}.attention.output.LayerNorm"))?,
                ffn_in: dense(&format!("{p}.intermediate.dense"), inter, h)?,
                ffn_out: dense(&format!("{p}.output.dense"), h, inter)?,
                ffn_norm: norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        Ok(MiniLm {
            hidden: h,
            heads: shape.num_attention_heads,
            eps: shape.layer_norm_eps as f32,
            vocab: shape.vocab_size,
            max_positions: shape.max_position_embeddings,
            word: get("embeddings.word_embeddings.weight", &[shape.vocab_size, h])?,
            position: get(
                "embeddings.position_embeddings.weight",
                &[shape.max_position_embeddings, h],
            )?,
            token_type: get("embeddings.token_type_embeddings.weight", &[2, h])?,
            emb_norm: norm("embeddings.LayerNorm")?,
            layers,
        })
    }

    /// Drops the 16-bit weight copies: short inputs then use the f32 weights too.
    pub(crate) fn drop_packed_weights(&mut self) {
        for l in &mut self.layers {
            for d in [&mut l.qkv, &mut l.attn_out, &mut l.ffn_in, &mut l.ffn_out] {
                d.packed = None;
            }
        }
    }

    pub(crate) fn hidden(&self) -> usize {
        self.hidden
    }

    /// Sentence embeddings of token sequences (special tokens included, token type 0): mean of
    /// the last hidden states over each sequence's tokens, L2-normalised.
    ///
    /// A short input uses a second core for the projections; with `gate`, only once the gate is
    /// set (the caller's other thread has finished its work), so the two never compete for
    /// the cores. The result does not depend on the split.
    pub(crate) fn embed(
        &self,
        seqs: &[&[u32]],
        gate: Option<&std::sync::atomic::AtomicBool>,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let total: usize = seqs.iter().map(|s| s.len()).sum();
        if total > SMALL_ROWS || *CORES < 2 {
            return self.encode(seqs, &mut |d: &Dense, x: &[f32]| d.forward(x));
        }
        // A short input (a search query): the products are bound by reading the weights from
        // memory, so a helper thread, started once per call, computes the upper half of every
        // projection's weight rows while this thread does the lower half (each core streams
        // half the weights; every weight is still read once).
        std::thread::scope(|s| {
            let (jobs, job_rx) = std::sync::mpsc::channel::<(&Dense, Vec<f32>)>();
            let (done_tx, done) = std::sync::mpsc::channel::<Vec<f32>>();
            s.spawn(move || {
                for (d, x) in job_rx {
                    if done_tx.send(d.rows(&x, d.split()..d.n_out())).is_err() {
                        break;
                    }
                }
            });
            let out = self.encode(seqs, &mut |d: &Dense, x: &[f32]| {
                let half = d.split();
                let open = gate.is_none_or(|g| g.load(std::sync::atomic::Ordering::Acquire));
                if half == 0 || !open {
                    return Ok(d.rows(x, 0..d.n_out()));
                }
                jobs.send((d, x.to_vec()))
                    .map_err(|_| candle_core::Error::Msg("projection helper stopped".into()))?;
                let lo = d.rows(x, 0..half);
                let hi = done
                    .recv()
                    .map_err(|_| candle_core::Error::Msg("projection helper stopped".into()))?;
                Ok(merge(&lo, &hi, half, d.n_out()))
            });
            drop(jobs);
            out
        })
    }

    /// The encoder, with `project` computing each dense layer's product plus bias.
    fn encode<'a>(
        &'a self,
        seqs: &[&[u32]],
        project: &mut Projection<'a, '_>,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let h = self.hidden;
        let total: usize = seqs.iter().map(|s| s.len()).sum();
        let mut x = vec![0f32; total * h];
        let mut row = 0;
        for s in seqs {
            if s.len() > self.max_positions {
                candle_core::bail!(
                    "sequence of {} tokens exceeds the model's {} positions",
                    s.len(),
                    self.max_positions
                );
            }
            for (p, &id) in s.iter().enumerate() {
                let id = id as usize;
                if id >= self.vocab {
                    candle_core::bail!("token id {id} is outside the vocabulary of {}", self.vocab);
                }
                let out = &mut x[row * h..(row + 1) * h];
                let (w, pe, te) = (
                    &self.word[id * h..(id + 1) * h],
                    &self.position[p * h..(p + 1) * h],
                    &self.token_type[..h],
                );
                for (((o, w), t), p) in out.iter_mut().zip(w).zip(te).zip(pe) {
                    *o = w + t + p;
                }
                row += 1;
            }
        }
        kernels::layer_norm(&mut x, &self.emb_norm.gamma, &self.emb_norm.beta, self.eps);
        let mut ctx = vec![0f32; total * h];
        for layer in &self.layers {
            let qkv = project(&layer.qkv, &x)?;
            let mut at = 0;
            for s in seqs {
                let n = s.len();
                let (qkv, ctx) = (
                    &qkv[at * 3 * h..(at + n) * 3 * h],
                    &mut ctx[at * h..(at + n) * h],
                );
                if n <= SMALL_ROWS {
                    kernels::attention(qkv, self.heads, h / self.heads, ctx);
                } else {
                    attention_gemm(qkv, self.heads, h / self.heads, ctx)?;
                }
                at += n;
            }
            let mut a = project(&layer.attn_out, &ctx)?;
            for (v, r) in a.iter_mut().zip(&x) {
                *v += r;
            }
            kernels::layer_norm(
                &mut a,
                &layer.attn_norm.gamma,
                &layer.attn_norm.beta,
                self.eps,
            );
            let mut f = project(&layer.ffn_in, &a)?;
            kernels::gelu(&mut f);
            let mut o = project(&layer.ffn_out, &f)?;
            for (v, r) in o.iter_mut().zip(&a) {
                *v += r;
            }
            kernels::layer_norm(
                &mut o,
                &layer.ffn_norm.gamma,
                &layer.ffn_norm.beta,
                self.eps,
            );
            x = o;
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for s in seqs {
            let n = s.len();
            let mut mean = vec![0f32; h];
            for r in x[at * h..(at + n) * h].chunks_exact(h) {
                for (m, v) in mean.iter_mut().zip(r) {
                    *m += v;
                }
            }
            let inv = 1.0 / n.max(1) as f32;
            mean.iter_mut().for_each(|m| *m *= inv);
            out.push(crate::embed::normalize(mean));
            at += n;
        }
        Ok(out)
    }
}
