//! The embedding path before the direct forward pass: candle's generic BERT model over padded
//! batches. Used by `tests/embed.rs` (the new path must agree with it) and by the benchmark
//! (as the peer of the query embedding). Never used by the library.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use sandlot_memory::embed::MINILM_MODEL_ID;
use sandlot_memory::{EmbedError, Embedder};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

pub struct CandleBert {
    model: BertModel,
    tokenizer: Tokenizer,
}

impl CandleBert {
    pub fn load(dir: &Path) -> CandleBert {
        let config: BertConfig =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: 256,
                ..Default::default()
            }))
            .unwrap();
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..Default::default()
        }));
        let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu).unwrap();
        CandleBert {
            model: BertModel::load(vb, &config).unwrap(),
            tokenizer,
        }
    }

    fn batch(&self, texts: &[&str]) -> candle_core::Result<Vec<Vec<f32>>> {
        let enc = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| candle_core::Error::Msg(format!("tokenize: {e}")))?;
        let n = enc.len();
        let len = enc.first().map(|e| e.get_ids().len()).unwrap_or(0);
        let mut ids = Vec::with_capacity(n * len);
        let mut mask = Vec::with_capacity(n * len);
        for e in &enc {
            ids.extend(e.get_ids().iter().copied());
            mask.extend(e.get_attention_mask().iter().copied());
        }
        let ids = Tensor::from_vec(ids, (n, len), &Device::Cpu)?;
        let mask = Tensor::from_vec(mask, (n, len), &Device::Cpu)?;
        let types = ids.zeros_like()?;
        let hidden = self.model.forward(&ids, &types, Some(&mask))?;
        let maskf = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&maskf)?.sum(1)?;
        let counts = maskf.sum(1)?.clamp(1e-9, f64::MAX)?;
        let mean = summed.broadcast_div(&counts)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
        mean.broadcast_div(&norm)?.to_vec2::<f32>()
    }
}

impl Embedder for CandleBert {
    fn model_id(&self) -> &str {
        MINILM_MODEL_ID
    }

    fn dim(&self) -> usize {
        384
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out = vec![Vec::new(); texts.len()];
        for group in order.chunks(32) {
            let batch: Vec<&str> = group.iter().map(|&i| texts[i]).collect();
            let vecs = self.batch(&batch).map_err(|e| EmbedError::Inference {
                model: "candle-bert".into(),
                count: texts.len(),
                reason: e.to_string(),
            })?;
            for (&i, v) in group.iter().zip(vecs) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}
