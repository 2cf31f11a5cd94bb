//! Sampling controls (flashspec_sampling_controls): per-request top-k,
//! top-p, min-p, logit bias with a repetition penalty, allowed-token masks
//! and typical acceptance.
use std::ptr;

use crate::{opt_ptr, sys, Error, Result};

/// Largest top-k that truncates (`FLASHSPEC_MAX_TOP_K`).
pub const MAX_TOP_K: i32 = sys::FLASHSPEC_MAX_TOP_K;
/// A top-k that keeps every token (`FLASHSPEC_TOP_K_ALL`).
pub const TOP_K_ALL: i32 = sys::FLASHSPEC_TOP_K_ALL;
/// Most top logprobs per row ([`crate::VerifyBatch::top_logprobs`]).
pub const MAX_TOP_LOGPROBS: usize = sys::FLASHSPEC_MAX_TOP_LOGPROBS as usize;

/// What turns a row's logits into the distribution a draft samples and a
/// verify verifies against (see "Sampling controls" in `flashspec.h`):
/// penalties and logit bias, token mask, temperature, top-k, top-p, min-p,
/// in that order. Their slices are host memory, so this crate applies them
/// with the CPU backend (the CUDA backend takes controls in device memory
/// through the C API; the crate does not upload them yet).
///
/// Per-request slices have one entry per request of a verify (per hidden
/// row of a draft); `None` leaves the step out. Every slice is checked
/// against the call before the library reads it: per-request slices need
/// R entries, the bias `offsets` R + 1 and its `tokens` and `values`
/// `offsets[R]`, the mask rows × words (else `FLASHSPEC_ERR_OUT_OF_RANGE`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SamplingControls<'a> {
    /// 1..=[`MAX_TOP_K`], or ≥ V / [`TOP_K_ALL`] (no truncation).
    pub top_k: Option<&'a [i32]>,
    /// In (0, 1].
    pub top_p: Option<&'a [f32]>,
    /// In [0, 1].
    pub min_p: Option<&'a [f32]>,
    /// Additive logit bias per request.
    pub logit_bias: Option<LogitBias<'a>>,
    /// r > 0 per request, for the tokens its bias entries name (a value of
    /// 0 names a token for the penalty alone): l becomes l / r if l > 0,
    /// else l · r, before the bias is added. `None`: 1.
    pub repetition_penalty: Option<&'a [f32]>,
    /// Allowed tokens, one row per row the controls apply to: each target
    /// row of a verify (`draft_offsets[R] + R`), each draft-logits row for
    /// `draft_controls` (`draft_offsets[R]`), each hidden row of a draft.
    pub token_mask: Option<TokenMask<'a>>,
    /// ε ∈ (0, 1] turns on Medusa's typical acceptance for a verify's target
    /// controls (not distribution-preserving); 0 leaves Algorithm 1.
    pub typical_epsilon: Option<&'a [f32]>,
    /// δ ≥ 0 of typical acceptance; `None`: √ε.
    pub typical_delta: Option<&'a [f32]>,
}

/// A logit bias in CSR form: request r's entries are
/// `tokens[offsets[r]..offsets[r + 1]]` with `values` alike; entries naming
/// one token add up. [`LogitBiasBuf`] builds one from per-request lists.
#[derive(Debug, Clone, Copy)]
pub struct LogitBias<'a> {
    /// `[R + 1]`, non-decreasing from 0.
    pub offsets: &'a [i32],
    /// `[offsets[R]]` token ids.
    pub tokens: &'a [i32],
    /// `[offsets[R]]` finite biases.
    pub values: &'a [f32],
}

/// Packed allowed-token bits (xgrammar's layout): token i of a row is
/// allowed iff bit i % 32 of word i / 32 of the row is set.
/// [`pack_token_mask`] builds the words from bools.
#[derive(Debug, Clone, Copy)]
pub struct TokenMask<'a> {
    /// `[rows * words_per_row]`.
    pub words: &'a [u32],
    /// Words per row; 0 means ceil(V / 32), the only size the library takes.
    pub words_per_row: usize,
}

impl<'a> TokenMask<'a> {
    /// A mask of ceil(V / 32) words per row.
    pub fn new(words: &'a [u32]) -> TokenMask<'a> {
        TokenMask { words, words_per_row: 0 }
    }
}

/// An owned CSR logit bias.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitBiasBuf {
    pub offsets: Vec<i32>,
    pub tokens: Vec<i32>,
    pub values: Vec<f32>,
}

impl LogitBiasBuf {
    /// One list of `(token, bias)` per request.
    pub fn from_requests<I, B>(requests: I) -> LogitBiasBuf
    where
        I: IntoIterator<Item = B>,
        B: IntoIterator<Item = (i32, f32)>,
    {
        let mut buf = LogitBiasBuf { offsets: vec![0], ..Default::default() };
        for request in requests {
            for (token, value) in request {
                buf.tokens.push(token);
                buf.values.push(value);
            }
            buf.offsets.push(buf.tokens.len() as i32);
        }
        buf
    }

    /// The borrowed form for [`SamplingControls::logit_bias`].
    pub fn as_bias(&self) -> LogitBias<'_> {
        LogitBias { offsets: &self.offsets, tokens: &self.tokens, values: &self.values }
    }
}

/// Packs `allowed` (row-major `[rows, vocab]`, true = allowed) into the
/// mask layout: ceil(vocab / 32) words per row.
pub fn pack_token_mask(allowed: &[bool], vocab: usize) -> Result<Vec<u32>> {
    if vocab == 0 || allowed.len() % vocab != 0 {
        return Err(out_of_range(format!("allowed: {} values are not whole rows of {vocab}", allowed.len())));
    }
    let words = vocab.div_ceil(32);
    let mut mask = vec![0u32; allowed.len() / vocab * words];
    for (row, tokens) in allowed.chunks(vocab).enumerate() {
        for (i, &ok) in tokens.iter().enumerate() {
            if ok {
                mask[row * words + i / 32] |= 1 << (i % 32);
            }
        }
    }
    Ok(mask)
}

fn out_of_range(message: String) -> Error {
    Error { status: sys::FLASHSPEC_ERR_OUT_OF_RANGE, message }
}

impl SamplingControls<'_> {
    /// The C struct for a call of `requests` requests (rows, for a draft)
    /// and `mask_rows` mask rows over `vocab` tokens, after checking that
    /// the library reads no slice past its end. It points into `self`.
    pub(crate) fn raw(&self, name: &str, requests: usize, mask_rows: usize, vocab: usize, per: &str) -> Result<sys::flashspec_sampling_controls> {
        for (field, len) in [("top_k", self.top_k.map(<[i32]>::len)), ("top_p", self.top_p.map(<[f32]>::len)), ("min_p", self.min_p.map(<[f32]>::len)), ("repetition_penalty", self.repetition_penalty.map(<[f32]>::len)), ("typical_epsilon", self.typical_epsilon.map(<[f32]>::len)), ("typical_delta", self.typical_delta.map(<[f32]>::len))] {
            if let Some(n) = len.filter(|&n| n < requests) {
                return Err(out_of_range(format!("{name}.{field}: {n} entries for {requests} {per}")));
            }
        }
        let mut c = std::mem::MaybeUninit::<sys::flashspec_sampling_controls>::zeroed();
        // SAFETY: init fills every field.
        let mut c = unsafe {
            sys::flashspec_sampling_controls_init(c.as_mut_ptr());
            c.assume_init()
        };
        c.top_k = opt_ptr(self.top_k);
        c.top_p = opt_ptr(self.top_p);
        c.min_p = opt_ptr(self.min_p);
        c.repetition_penalty = opt_ptr(self.repetition_penalty);
        c.typical_epsilon = opt_ptr(self.typical_epsilon);
        c.typical_delta = opt_ptr(self.typical_delta);
        if let Some(bias) = self.logit_bias {
            if bias.offsets.len() < requests + 1 {
                return Err(out_of_range(format!("{name}.logit_bias.offsets: {} entries for R + 1 = {}", bias.offsets.len(), requests + 1)));
            }
            // The library checks that the offsets start at 0 and never
            // decrease before it reads offsets[R] entries.
            let entries = bias.offsets[requests];
            for (field, n) in [("tokens", bias.tokens.len()), ("values", bias.values.len())] {
                if (n as i64) < i64::from(entries) {
                    return Err(out_of_range(format!("{name}.logit_bias.{field}: {n} entries for offsets[R] = {entries}")));
                }
            }
            c.bias_offsets = bias.offsets.as_ptr();
            c.bias_tokens = bias.tokens.as_ptr();
            c.bias_values = bias.values.as_ptr();
        }
        if let Some(mask) = self.token_mask {
            // Always passed explicitly: 0 would let the library assume
            // ceil(V / 32) words per row, whatever the slice holds.
            let words = if mask.words_per_row == 0 { vocab.div_ceil(32) } else { mask.words_per_row };
            let words_i32 = i32::try_from(words).map_err(|_| out_of_range(format!("{name}.token_mask.words_per_row: {words}")))?;
            if words == 0 || mask.words.len() / words < mask_rows {
                return Err(out_of_range(format!("{name}.token_mask: {} words for {mask_rows} rows of {words} words", mask.words.len())));
            }
            c.token_mask = mask.words.as_ptr();
            c.mask_words = words_i32;
        } else {
            c.token_mask = ptr::null();
        }
        Ok(c)
    }
}
