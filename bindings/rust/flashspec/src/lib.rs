//! Safe Rust API of FlashSpec: a fused LM head and speculative-decoding
//! sampler over libflashspec (`flashspec-sys`).
//!
//! Handles free themselves on drop; LM heads and summaries borrow their
//! [`Context`], so they cannot outlive it. A context is `Send` but not
//! `Sync`: it moves between threads but is used by one at a time, as the C
//! API's `[context-exclusive]` requires. Every failure is an [`Error`] with
//! the library's status and detail message.
//!
//! This crate passes host slices; with the CUDA backend each call waits for
//! its work before returning (device memory goes through `flashspec-sys`).
//!
//! Vocabulary shards (tensor-parallel LM heads, see "Vocabulary shards" in
//! flashspec.h): [`Context::lm_head_shard`] uploads one rank's slice,
//! [`Context::verify_shard`] / [`Context::draft_shard`] write
//! [`SHARD_RECORD_BYTES`] per row into a caller byte buffer, and after the
//! caller's all-gather [`Context::finalize_shards`] /
//! [`Context::draft_from_shards`] emit what the unsharded calls would.
//!
//! The speculative engine ([`Engine`], from [`Context::engine`]) takes the
//! target model and callback drafters as closures; a closure's error or
//! panic fails the generation with a [`GenerateError`] whose `source` is
//! that error, and the engine stays usable. [`BatchEngine`] (from
//! [`Context::batch_engine`]) runs many sequences, each with its own
//! drafters, in one target forward and one verify pass per step.
use std::cell::Cell;
use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;
use std::ptr;

pub use flashspec_sys as sys;

mod controls;
pub use controls::{pack_token_mask, LogitBias, LogitBiasBuf, SamplingControls, TokenMask, MAX_TOP_K, MAX_TOP_LOGPROBS, TOP_K_ALL};
mod batch_engine;
pub use batch_engine::{BatchEngine, BatchEngineOptions, BatchForward, SequenceError, SequenceState, SharedError, StepError};
mod engine;
pub use engine::{Arm, ArmMetrics, BoxError, CallbackDrafterOptions, CallbackPanic, CallbackResult, Canceller, DraftLenRule, DraftTree, Drafter, Engine, EngineMetrics, EngineOptions, FinishReason, GenerateError, GenerateOptions, Generation, NgramOptions, Policy, SuffixOptions, TargetCall};

/// Most draft tokens per request, and most nodes of a proposed tree
/// (FLASHSPEC_MAX_DRAFT_LEN).
pub const MAX_DRAFT_LEN: usize = sys::FLASHSPEC_MAX_DRAFT_LEN as usize;
/// Bytes of one row's record in the shard calls (FLASHSPEC_SHARD_RECORD_BYTES).
pub const SHARD_RECORD_BYTES: usize = sys::FLASHSPEC_SHARD_RECORD_BYTES;
/// The record layout this crate's library writes and reads (FLASHSPEC_SHARD_RECORD_VERSION).
pub const SHARD_RECORD_VERSION: i32 = sys::FLASHSPEC_SHARD_RECORD_VERSION;
/// The most tokens one draft row's sparse support may name
/// (FLASHSPEC_MAX_DRAFT_SUPPORT; see [`DraftSupport`]).
pub const MAX_DRAFT_SUPPORT: usize = sys::FLASHSPEC_MAX_DRAFT_SUPPORT as usize;
/// How far a support row's probabilities may sum from 1
/// (FLASHSPEC_DRAFT_SUPPORT_TOLERANCE).
pub const DRAFT_SUPPORT_TOLERANCE: f64 = sys::FLASHSPEC_DRAFT_SUPPORT_TOLERANCE;

/// The examples of bindings/README.md, run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// A flashspec_status other than OK, with the detail message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The numeric flashspec_status.
    pub status: sys::flashspec_status,
    /// The library's message; it names the argument that was wrong.
    pub message: String,
}

impl Error {
    /// The C name of the status ("FLASHSPEC_ERR_OUT_OF_RANGE").
    pub fn status_name(&self) -> &'static str {
        status_name(self.status)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status_name(), self.message)
    }
}

impl std::error::Error for Error {}

/// Result of every fallible call.
pub type Result<T> = std::result::Result<T, Error>;

fn static_str(p: *const std::os::raw::c_char) -> &'static str {
    // SAFETY: the library returns static, NUL-terminated strings here.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

/// The C name of a status.
pub fn status_name(status: sys::flashspec_status) -> &'static str {
    static_str(unsafe { sys::flashspec_status_name(status) })
}

/// The library's description of a status.
pub fn status_string(status: sys::flashspec_status) -> &'static str {
    static_str(unsafe { sys::flashspec_status_string(status) })
}

/// Version string of the library actually loaded.
pub fn version() -> &'static str {
    static_str(unsafe { sys::flashspec_version_string() })
}

/// MAJOR*10000 + MINOR*100 + PATCH of the library loaded.
pub fn version_number() -> u32 {
    unsafe { sys::flashspec_version_number() }
}

/// ABI version of the library loaded (the crate was built for sys::FLASHSPEC_ABI_VERSION).
pub fn abi_version() -> u32 {
    unsafe { sys::flashspec_abi_version() }
}

/// CUDA devices usable by this build of the library.
pub fn cuda_device_count() -> i32 {
    unsafe { sys::flashspec_cuda_device_count() }
}

/// Philox4x32-10 of (counter, key).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut out = [0u32; 4];
    unsafe { sys::flashspec_philox4x32_10(counter.as_ptr(), key.as_ptr(), out.as_mut_ptr()) };
    out
}

/// The randomness contract's uniform in (0, 1).
pub fn rng_uniform(seed: u64, request_id: u64, step: u64, position: i32, purpose: sys::flashspec_rng_purpose, token: i32) -> f64 {
    unsafe { sys::flashspec_rng_uniform(seed, request_id, step, position, purpose, token) }
}

/// The plugin table for `abi_version` (flashspec_get_api), if served.
pub fn plugin_table(abi_version: u32) -> Option<&'static sys::flashspec_api> {
    // SAFETY: the table is static and lives as long as the library.
    unsafe { sys::flashspec_get_api(abi_version).as_ref() }
}

/// Backend choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// CUDA when built and present, else CPU.
    Auto,
    Cpu,
    Cuda,
}

impl Backend {
    fn raw(self) -> sys::flashspec_backend {
        match self {
            Backend::Auto => sys::FLASHSPEC_BACKEND_AUTO,
            Backend::Cpu => sys::FLASHSPEC_BACKEND_CPU,
            Backend::Cuda => sys::FLASHSPEC_BACKEND_CUDA,
        }
    }
}

/// The element type an LM head stores ([`LmHead::dtype`]); `E4m3` and `I8`
/// are the 8-bit codes of [`Context::lm_head_quantized`] and
/// [`Context::lm_head_codes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    Bf16,
    F16,
    /// fp8 e4m3 ("e4m3fn"): bias 7, 3 mantissa bits, no Inf, largest ±448.
    E4m3,
    /// Two's-complement int8.
    I8,
}

impl Dtype {
    /// The `flashspec_dtype` value.
    pub fn raw(self) -> sys::flashspec_dtype {
        match self {
            Dtype::F32 => sys::FLASHSPEC_DTYPE_F32,
            Dtype::Bf16 => sys::FLASHSPEC_DTYPE_BF16,
            Dtype::F16 => sys::FLASHSPEC_DTYPE_F16,
            Dtype::E4m3 => sys::FLASHSPEC_DTYPE_E4M3,
            Dtype::I8 => sys::FLASHSPEC_DTYPE_I8,
        }
    }

    /// The dtype of a `flashspec_dtype` value, `None` for an unknown one.
    pub fn from_raw(raw: sys::flashspec_dtype) -> Option<Dtype> {
        [Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::E4m3, Dtype::I8].into_iter().find(|d| d.raw() == raw)
    }
}

/// Codes of an already quantised LM head, row-major `[vocab, hidden]`
/// ([`Context::lm_head_codes`]); the variant is the stored dtype.
#[derive(Debug, Clone, Copy)]
pub enum Codes<'a> {
    /// e4m3 bit patterns (0x7f and 0xff, NaN, are refused).
    E4m3(&'a [u8]),
    /// int8 codes (any value).
    I8(&'a [i8]),
}

/// Context parameters; `Default` gives the library's defaults.
#[derive(Debug, Clone)]
pub struct ContextOptions {
    pub backend: Backend,
    pub device: i32,
    pub seed: u64,
    /// 0: one per core.
    pub cpu_threads: i32,
    pub max_rows: i32,
    pub max_requests: i32,
}

impl Default for ContextOptions {
    fn default() -> Self {
        let mut p = std::mem::MaybeUninit::<sys::flashspec_context_params>::zeroed();
        // SAFETY: init fills every field.
        let p = unsafe {
            sys::flashspec_context_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        ContextOptions { backend: Backend::Auto, device: p.device_ordinal, seed: p.seed, cpu_threads: p.cpu_threads, max_rows: p.max_rows, max_requests: p.max_requests }
    }
}

/// A FlashSpec context. `Send`, not `Sync`.
pub struct Context {
    raw: *mut sys::flashspec_context,
    cuda: bool,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the C context may move between threads; `Cell` keeps it !Sync.
unsafe impl Send for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        unsafe { sys::flashspec_context_destroy(self.raw) };
    }
}

impl Context {
    /// Create a context.
    pub fn new(options: &ContextOptions) -> Result<Context> {
        let mut p = std::mem::MaybeUninit::<sys::flashspec_context_params>::zeroed();
        let mut p = unsafe {
            sys::flashspec_context_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        p.backend = options.backend.raw();
        p.device_ordinal = options.device;
        p.seed = options.seed;
        p.cpu_threads = options.cpu_threads;
        p.max_rows = options.max_rows;
        p.max_requests = options.max_requests;
        let mut raw = ptr::null_mut();
        let status = unsafe { sys::flashspec_context_create(&p, &mut raw) };
        check(status, ptr::null())?;
        let cuda = unsafe { sys::flashspec_context_backend(raw) } == sys::FLASHSPEC_BACKEND_CUDA;
        Ok(Context { raw, cuda, _not_sync: PhantomData })
    }

    /// A CPU context with the given seed and otherwise default options.
    pub fn cpu(seed: u64) -> Result<Context> {
        Context::new(&ContextOptions { backend: Backend::Cpu, seed, ..Default::default() })
    }

    /// The raw handle, for flashspec-sys calls (stays owned by self).
    pub fn as_raw(&self) -> *mut sys::flashspec_context {
        self.raw
    }

    /// The backend actually chosen.
    pub fn backend(&self) -> Backend {
        if self.cuda { Backend::Cuda } else { Backend::Cpu }
    }

    /// Detail message of the last failed call on this context.
    pub fn last_error(&self) -> String {
        unsafe { CStr::from_ptr(sys::flashspec_context_last_error(self.raw)) }.to_string_lossy().into_owned()
    }

    /// Wait for all work enqueued on the context.
    pub fn synchronize(&self) -> Result<()> {
        check(unsafe { sys::flashspec_context_synchronize(self.raw) }, self.raw)
    }

    fn finish(&self, status: sys::flashspec_status) -> Result<()> {
        check(status, self.raw)?;
        if self.cuda {
            self.synchronize()?;
        }
        Ok(())
    }

    /// Upload an LM head W, row-major `[vocab, hidden]` f32 (copied).
    pub fn lm_head(&self, weight: &[f32], vocab: usize, hidden: usize) -> Result<LmHead<'_>> {
        if weight.len() != vocab.saturating_mul(hidden) {
            return Err(Error { status: sys::FLASHSPEC_ERR_OUT_OF_RANGE, message: format!("weight: {} values for [{vocab}, {hidden}]", weight.len()) });
        }
        let t = host_tensor(weight, vocab, hidden);
        let mut raw = ptr::null_mut();
        let status = unsafe { sys::flashspec_lm_head_create(self.raw, &t, sys::FLASHSPEC_LM_HEAD_COPY, &mut raw) };
        self.finish(status)?;
        Ok(LmHead { raw, vocab, hidden, _context: PhantomData })
    }

    /// Upload W, row-major `[vocab, hidden]` f32, as an 8-bit LM head
    /// (`flashspec_lm_head_create_quantized`): the library quantises each
    /// vocabulary row v to codes q_v of `stored` ([`Dtype::E4m3`] or
    /// [`Dtype::I8`]) and one scale s_v = amax_v / 448 (e4m3) or amax_v /
    /// 127 (int8), rounding to nearest, ties to even; the head is the
    /// dequantised W = diag(s) · Q. Another `stored` is the library's
    /// `FLASHSPEC_ERR_DTYPE_MISMATCH`.
    pub fn lm_head_quantized(&self, weight: &[f32], vocab: usize, hidden: usize, stored: Dtype) -> Result<LmHead<'_>> {
        self.create_quantized(weight, sys::FLASHSPEC_DTYPE_F32, &[], vocab, hidden, stored)
    }

    /// Upload an LM head already quantised: `codes` (`[vocab, hidden]`,
    /// row-major; their variant is the stored dtype) and `scales`, one
    /// finite, non-negative scale per vocabulary row: row v's weights are
    /// `scales[v]` times its codes' values. The library checks `scales`:
    /// empty (passed as NULL, missing) or not `vocab` long is its
    /// `FLASHSPEC_ERR_INVALID_ARGUMENT` (it is given `scales.len()` rows, so
    /// it never reads past the slice), a negative or non-finite scale or an
    /// e4m3 NaN code its `FLASHSPEC_ERR_NON_FINITE`.
    pub fn lm_head_codes(&self, codes: Codes<'_>, scales: &[f32], vocab: usize, hidden: usize) -> Result<LmHead<'_>> {
        match codes {
            Codes::E4m3(c) => self.create_quantized(c, sys::FLASHSPEC_DTYPE_E4M3, scales, vocab, hidden, Dtype::E4m3),
            Codes::I8(c) => self.create_quantized(c, sys::FLASHSPEC_DTYPE_I8, scales, vocab, hidden, Dtype::I8),
        }
    }

    /// `flashspec_lm_head_create_quantized` of `weight` (elements of
    /// `dtype`, checked against `[vocab, hidden]`) with `scales` (empty:
    /// NULL) as a `[scales.len(), 1]` column.
    fn create_quantized<T>(&self, weight: &[T], dtype: sys::flashspec_dtype, scales: &[f32], vocab: usize, hidden: usize, stored: Dtype) -> Result<LmHead<'_>> {
        if weight.len() != vocab.saturating_mul(hidden) {
            return Err(out_of_range(format!("weight: {} values for [{vocab}, {hidden}]", weight.len())));
        }
        let t = sys::flashspec_tensor { data: weight.as_ptr().cast(), dtype, memory: sys::FLASHSPEC_MEMORY_HOST, rows: vocab as i64, cols: hidden as i64, row_stride: hidden as i64 };
        let s = host_tensor(scales, scales.len(), 1);
        let scales_ptr: *const sys::flashspec_tensor = if scales.is_empty() { ptr::null() } else { &s };
        let mut raw = ptr::null_mut();
        let status = unsafe { sys::flashspec_lm_head_create_quantized(self.raw, &t, scales_ptr, stored.raw(), sys::FLASHSPEC_LM_HEAD_COPY, &mut raw) };
        self.finish(status)?;
        Ok(LmHead { raw, vocab, hidden, _context: PhantomData })
    }

    /// Upload one rank's slice of a vocabulary-sharded LM head: `weight`
    /// holds the rows `slice` (global token ids) of a `[vocab_size, hidden]`
    /// head, row-major (copied). The head serves only the shard calls
    /// ([`Context::verify_shard`], [`Context::draft_shard`]); the library
    /// refuses a slice outside `[0, vocab_size)`.
    pub fn lm_head_shard(&self, weight: &[f32], slice: std::ops::Range<usize>, hidden: usize, vocab_size: usize) -> Result<LmHead<'_>> {
        let rows = slice.end.checked_sub(slice.start).ok_or_else(|| out_of_range(format!("slice: {}..{} ends before it begins", slice.start, slice.end)))?;
        if weight.len() != rows.saturating_mul(hidden) {
            return Err(out_of_range(format!("weight: {} values for the slice {}..{} of {hidden} columns", weight.len(), slice.start, slice.end)));
        }
        // The library adds the slice's rows to vocab_begin in i64.
        let (Ok(begin), Ok(_), Ok(vocab)) = (i64::try_from(slice.start), i64::try_from(slice.end), i64::try_from(vocab_size)) else {
            return Err(out_of_range(format!("slice: {}..{} of {vocab_size} tokens is past i64", slice.start, slice.end)));
        };
        let t = host_tensor(weight, rows, hidden);
        let mut raw = ptr::null_mut();
        let status = unsafe { sys::flashspec_lm_head_create_shard(self.raw, &t, sys::FLASHSPEC_LM_HEAD_COPY, begin, vocab, &mut raw) };
        self.finish(status)?;
        Ok(LmHead { raw, vocab: vocab_size, hidden, _context: PhantomData })
    }

    /// Reserve summaries for [`Context::verify`] / [`Context::finalize`].
    pub fn summaries(&self, max_rows: i32, max_requests: i32) -> Result<Summaries<'_>> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::flashspec_summaries_create(self.raw, max_rows, max_requests, &mut raw) }, self.raw)?;
        Ok(Summaries { raw, _context: PhantomData })
    }

    /// Draft one token per row of `hidden` (`[rows, d]` row-major): the
    /// tokens and their logits (T = 0) or log q(x) (T > 0). With
    /// `options.controls` (per row: per-request slices and mask rows have
    /// one entry per hidden row), T = 0 is the argmax over the controlled
    /// set and T > 0 samples the controlled q.
    pub fn draft(&self, head: &LmHead<'_>, hidden: &[f32], options: &DraftOptions<'_>) -> Result<(Vec<i32>, Vec<f32>)> {
        let rows = rows_of(hidden, head.hidden, "hidden")?;
        let params = options.raw(rows, head.vocab)?;
        let t = host_tensor(hidden, rows, head.hidden);
        let mut tokens = vec![0i32; rows];
        let mut scores = vec![0f32; rows];
        let status = unsafe { sys::flashspec_draft(self.raw, head.raw, &t, &params.params, tokens.as_mut_ptr(), scores.as_mut_ptr()) };
        self.finish(status)?;
        Ok((tokens, scores))
    }

    /// The fused top-k draft (`flashspec_draft_top_k`): per row of
    /// `hidden`, the `k` allowed tokens of largest l + bias in rank order
    /// and their log-probabilities at temperature 1, each `[rows, k]`
    /// row-major; a row with fewer than `k` allowed tokens ends in −1 /
    /// −Inf. `options.controls` may carry bias, repetition penalty and a
    /// mask (top-k, top-p, min-p and typical are INVALID_ARGUMENT); `k`
    /// outside 1..=FLASHSPEC_MAX_DRAFT_TOP_K is the library's OUT_OF_RANGE.
    pub fn draft_top_k(&self, head: &LmHead<'_>, hidden: &[f32], options: &DraftOptions<'_>, k: usize) -> Result<(Vec<i32>, Vec<f32>)> {
        let rows = rows_of(hidden, head.hidden, "hidden")?;
        let params = options.raw(rows, head.vocab)?;
        let t = host_tensor(hidden, rows, head.hidden);
        // An out-of-range k is refused by the library before it writes;
        // the buffers are sized for a valid one.
        let slots = rows * k.min(sys::FLASHSPEC_MAX_DRAFT_TOP_K as usize);
        let mut tokens = vec![0i32; slots];
        let mut logprobs = vec![0f32; slots];
        let k_i32 = i32::try_from(k).unwrap_or(i32::MAX);
        let status = unsafe { sys::flashspec_draft_top_k(self.raw, head.raw, &t, &params.params, k_i32, tokens.as_mut_ptr(), logprobs.as_mut_ptr()) };
        self.finish(status)?;
        Ok((tokens, logprobs))
    }

    /// One rank's draft pass over its slice (`head` from
    /// [`Context::lm_head_shard`]): writes one record per row of `hidden`
    /// to the first `rows × SHARD_RECORD_BYTES` bytes of `records` (refused
    /// before the call when shorter). `options` as for [`Context::draft`],
    /// without controls (UNSUPPORTED). All-gather the records, then
    /// [`Context::draft_from_shards`].
    pub fn draft_shard(&self, head: &LmHead<'_>, hidden: &[f32], options: &DraftOptions<'_>, records: &mut [u8]) -> Result<()> {
        let rows = rows_of(hidden, head.hidden, "hidden")?;
        let params = options.raw(rows, head.vocab)?;
        check_record_room(records, rows, "hidden rows")?;
        let t = host_tensor(hidden, rows, head.hidden);
        self.finish(unsafe { sys::flashspec_draft_shard(self.raw, head.raw, &t, &params.params, records.as_mut_ptr().cast()) })
    }

    /// The drafts from the gathered records of `num_shards` ranks
    /// (`records` is exactly `num_shards × rows × SHARD_RECORD_BYTES`
    /// bytes, rank after rank, each rank's rows in order): the tokens and
    /// scores [`Context::draft`] on the whole head gives for the same
    /// `options`. A gather of another record version, or whose slices do
    /// not tile the vocabulary in rank order, is the library's
    /// INVALID_ARGUMENT naming `records`.
    pub fn draft_from_shards(&self, records: &[u8], num_shards: usize, options: &DraftOptions<'_>) -> Result<(Vec<i32>, Vec<f32>)> {
        let per_shard = SHARD_RECORD_BYTES.saturating_mul(num_shards);
        if num_shards == 0 || records.is_empty() || records.len() % per_shard != 0 {
            return Err(out_of_range(format!("records: {} bytes are not num_shards = {num_shards} ranks of whole {SHARD_RECORD_BYTES}-byte records", records.len())));
        }
        let rows = records.len() / per_shard;
        let (shards_i32, rows_i32) = (i32::try_from(num_shards).unwrap_or(i32::MAX), i32::try_from(rows).unwrap_or(i32::MAX));
        // No head: the controls are checked for their lengths only (the
        // library refuses them for shard calls).
        let params = options.raw(rows, 0)?;
        let mut tokens = vec![0i32; rows];
        let mut scores = vec![0f32; rows];
        let status = unsafe { sys::flashspec_draft_from_shards(self.raw, &params.params, records.as_ptr().cast(), shards_i32, rows_i32, tokens.as_mut_ptr(), scores.as_mut_ptr()) };
        self.finish(status)?;
        Ok((tokens, scores))
    }

    /// Verify the batch and run Algorithm 1 on it.
    pub fn verify_and_finalize(&self, head: &LmHead<'_>, batch: &VerifyBatch<'_>) -> Result<VerifyResult> {
        let parts = batch.raw(head)?;
        let mut out = VerifyResult::sized(batch);
        let result = out.raw();
        let status = unsafe { sys::flashspec_verify_and_finalize(self.raw, head.raw, &parts.batch, &result) };
        self.finish(status)?;
        Ok(out)
    }

    /// One pass over W for the batch, writing only the summaries.
    pub fn verify(&self, head: &LmHead<'_>, batch: &VerifyBatch<'_>, summaries: &mut Summaries<'_>) -> Result<()> {
        let parts = batch.raw(head)?;
        self.finish(unsafe { sys::flashspec_verify(self.raw, head.raw, &parts.batch, summaries.raw) })
    }

    /// One rank's verify pass over its slice (`head` from
    /// [`Context::lm_head_shard`]): writes one record per target row
    /// (`draft_offsets[R] + R`) to the first `rows × SHARD_RECORD_BYTES`
    /// bytes of `records` (refused before the call when shorter). Shard
    /// calls take greedy drafts (chains or trees) without controls or
    /// logprobs (UNSUPPORTED). All-gather the records, then
    /// [`Context::finalize_shards`].
    pub fn verify_shard(&self, head: &LmHead<'_>, batch: &VerifyBatch<'_>, records: &mut [u8]) -> Result<()> {
        let parts = batch.raw(head)?;
        check_record_room(records, parts.target_rows, "target rows")?;
        self.finish(unsafe { sys::flashspec_verify_shard(self.raw, head.raw, &parts.batch, records.as_mut_ptr().cast()) })
    }

    /// Algorithm 1 on the gathered records of `num_shards` ranks for
    /// `batch`: `records` is exactly `num_shards × rows × SHARD_RECORD_BYTES`
    /// bytes (rows = `draft_offsets[R] + R`), rank after rank. Emits what
    /// [`Context::verify_and_finalize`] on the whole head would. `head` is
    /// any rank's shard (it gives the hidden size of `target_hidden`). A
    /// gather of another record version, or whose slices do not tile the
    /// vocabulary in rank order, is the library's INVALID_ARGUMENT naming
    /// `records`.
    pub fn finalize_shards(&self, head: &LmHead<'_>, batch: &VerifyBatch<'_>, records: &[u8], num_shards: usize) -> Result<VerifyResult> {
        let parts = batch.raw(head)?;
        let expected = parts.target_rows.saturating_mul(SHARD_RECORD_BYTES).saturating_mul(num_shards);
        if num_shards == 0 || records.len() != expected {
            return Err(out_of_range(format!("records: {} bytes, not num_shards = {num_shards} × {} rows × {SHARD_RECORD_BYTES} = {expected}", records.len(), parts.target_rows)));
        }
        let mut out = VerifyResult::sized(batch);
        let result = out.raw();
        let shards = i32::try_from(num_shards).unwrap_or(i32::MAX);
        self.finish(unsafe { sys::flashspec_finalize_shards(self.raw, &parts.batch, records.as_ptr().cast(), shards, &result) })?;
        Ok(out)
    }

    /// Algorithm 1 on the summaries of the last verify of `batch`.
    pub fn finalize(&self, head: &LmHead<'_>, batch: &VerifyBatch<'_>, summaries: &Summaries<'_>) -> Result<VerifyResult> {
        let parts = batch.raw(head)?;
        let mut out = VerifyResult::sized(batch);
        let result = out.raw();
        self.finish(unsafe { sys::flashspec_finalize(self.raw, &parts.batch, summaries.raw, &result) })?;
        Ok(out)
    }
}

fn check(status: sys::flashspec_status, ctx: *const sys::flashspec_context) -> Result<()> {
    if status == sys::FLASHSPEC_OK {
        return Ok(());
    }
    let message = unsafe { CStr::from_ptr(sys::flashspec_context_last_error(ctx)) }.to_string_lossy().into_owned();
    Err(Error { status, message })
}

fn out_of_range(message: String) -> Error {
    Error { status: sys::FLASHSPEC_ERR_OUT_OF_RANGE, message }
}

/// Refuses a records buffer the library would write past the end of.
fn check_record_room(records: &[u8], rows: usize, what: &str) -> Result<()> {
    let needed = rows.saturating_mul(SHARD_RECORD_BYTES);
    if records.len() < needed {
        return Err(out_of_range(format!("records: {} bytes, fewer than {rows} {what} × {SHARD_RECORD_BYTES} = {needed}", records.len())));
    }
    Ok(())
}

fn host_tensor(data: &[f32], rows: usize, cols: usize) -> sys::flashspec_tensor {
    sys::flashspec_tensor { data: data.as_ptr().cast(), dtype: sys::FLASHSPEC_DTYPE_F32, memory: sys::FLASHSPEC_MEMORY_HOST, rows: rows as i64, cols: cols as i64, row_stride: cols as i64 }
}

fn rows_of(values: &[f32], cols: usize, name: &str) -> Result<usize> {
    if cols == 0 || values.len() % cols != 0 {
        return Err(Error { status: sys::FLASHSPEC_ERR_OUT_OF_RANGE, message: format!("{name}: {} values are not whole rows of {cols}", values.len()) });
    }
    Ok(values.len() / cols)
}

/// An optional output the batch did not ask for is NULL to the library.
fn ptr_or_null<T>(v: &mut [T]) -> *mut T {
    if v.is_empty() { ptr::null_mut() } else { v.as_mut_ptr() }
}

fn opt_ptr<T>(s: Option<&[T]>) -> *const T {
    s.map_or(ptr::null(), <[T]>::as_ptr)
}

/// An uploaded LM head; borrows its context.
pub struct LmHead<'c> {
    raw: *mut sys::flashspec_lm_head,
    /// The global vocabulary (a shard's too): what draft logits and
    /// controls are sized by.
    vocab: usize,
    hidden: usize,
    _context: PhantomData<&'c Context>,
}

impl Drop for LmHead<'_> {
    fn drop(&mut self) {
        unsafe { sys::flashspec_lm_head_destroy(self.raw) };
    }
}

impl LmHead<'_> {
    /// V.
    pub fn vocab_size(&self) -> usize {
        unsafe { sys::flashspec_lm_head_vocab_size(self.raw) as usize }
    }
    /// d.
    pub fn hidden_size(&self) -> usize {
        unsafe { sys::flashspec_lm_head_hidden_size(self.raw) as usize }
    }
    /// The stored dtype: [`Dtype::F32`] for [`Context::lm_head`], `E4m3` or
    /// `I8` for an 8-bit head.
    pub fn dtype(&self) -> Dtype {
        let raw = unsafe { sys::flashspec_lm_head_dtype(self.raw) };
        Dtype::from_raw(raw).unwrap_or_else(|| panic!("flashspec_lm_head_dtype returned the unknown dtype {raw}"))
    }
    /// The global id of the head's first token (0 unless a shard).
    pub fn vocab_begin(&self) -> usize {
        unsafe { sys::flashspec_lm_head_vocab_begin(self.raw) as usize }
    }
    /// The global vocabulary size (`vocab_size()` unless a shard).
    pub fn global_vocab_size(&self) -> usize {
        unsafe { sys::flashspec_lm_head_global_vocab_size(self.raw) as usize }
    }
}

/// Per-row summaries written by verify and read by finalize.
pub struct Summaries<'c> {
    raw: *mut sys::flashspec_summaries,
    _context: PhantomData<&'c Context>,
}

impl Drop for Summaries<'_> {
    fn drop(&mut self) {
        unsafe { sys::flashspec_summaries_destroy(self.raw) };
    }
}

/// Randomness and temperature of a draft call; `None` takes the library default.
#[derive(Debug, Clone, Default)]
pub struct DraftOptions<'a> {
    pub temperature: f32,
    pub temperatures: Option<&'a [f32]>,
    pub seeds: Option<&'a [u64]>,
    pub request_ids: Option<&'a [u64]>,
    pub steps: Option<&'a [u64]>,
    pub positions: Option<&'a [i32]>,
    /// Per row (typical acceptance is a verify's only).
    pub controls: Option<SamplingControls<'a>>,
}

struct RawDraftParams {
    params: sys::flashspec_draft_params,
    // params.controls points at this.
    _controls: Option<Box<sys::flashspec_sampling_controls>>,
}

impl DraftOptions<'_> {
    /// The C params for `rows` hidden rows over `vocab` tokens, after
    /// checking that the library reads no slice past its end.
    fn raw(&self, rows: usize, vocab: usize) -> Result<RawDraftParams> {
        for (name, len) in [("temperatures", self.temperatures.map(<[f32]>::len)), ("seeds", self.seeds.map(<[u64]>::len)), ("request_ids", self.request_ids.map(<[u64]>::len)), ("steps", self.steps.map(<[u64]>::len)), ("positions", self.positions.map(<[i32]>::len))] {
            if let Some(n) = len.filter(|&n| n < rows) {
                return Err(out_of_range(format!("{name}: {n} entries for {rows} rows")));
            }
        }
        let controls = self.controls.as_ref().map(|c| c.raw("controls", rows, rows, vocab, "rows").map(Box::new)).transpose()?;
        let mut p = std::mem::MaybeUninit::<sys::flashspec_draft_params>::zeroed();
        let mut p = unsafe {
            sys::flashspec_draft_params_init_sized(p.as_mut_ptr(), std::mem::size_of::<sys::flashspec_draft_params>());
            p.assume_init()
        };
        p.temperature = self.temperature;
        p.temperatures = opt_ptr(self.temperatures);
        p.seeds = opt_ptr(self.seeds);
        p.request_ids = opt_ptr(self.request_ids);
        p.steps = opt_ptr(self.steps);
        p.positions = opt_ptr(self.positions);
        p.controls = controls.as_deref().map_or(ptr::null(), |c| c as *const _);
        Ok(RawDraftParams { params: p, _controls: controls })
    }
}

/// A ragged batch (flashspec_verify_batch): request r drafted
/// `draft_tokens[draft_offsets[r]..draft_offsets[r+1]]`; its n_r + 1 target
/// rows start at row `draft_offsets[r] + r` of `target_hidden`.
///
/// `controls` define each request's target distribution (mask: one row per
/// target row, `draft_offsets[R] + R`), `draft_controls` the controls
/// stochastic drafts were sampled under (mask: one row per `draft_logits`
/// row, `draft_offsets[R]`). `logprobs` asks for the emitted tokens'
/// logprobs, `top_logprobs` (≤ [`MAX_TOP_LOGPROBS`]) for each slot's tokens
/// of largest raw logit, in the [`VerifyResult`].
///
/// `draft_parents` (one per draft) verifies each request's drafts as a tree
/// ("Tree verify" in flashspec.h): draft k of request r is node k, its
/// parent `draft_parents[draft_offsets[r] + k]` a node index in `[-1, k)`
/// (-1: the root); target row k + 1 scores the path to node k;
/// [`VerifyResult::nodes`] gives the accepted path. With greedy drafts a
/// node's children are point-mass candidates; with `draft_logits` or a
/// `draft_support` they are stochastic candidates (SpecInfer's multi-step
/// speculative sampling, CPU backend).
///
/// `draft_support` gives each draft row's q as a sparse [`DraftSupport`]
/// instead of `draft_logits` ("Sparse draft distributions" in flashspec.h).
#[derive(Debug, Clone, Default)]
pub struct VerifyBatch<'a> {
    pub draft_offsets: &'a [i32],
    pub draft_tokens: &'a [i32],
    pub target_hidden: &'a [f32],
    /// `None`: greedy drafts; else `[draft_offsets[R], V]`.
    pub draft_logits: Option<&'a [f32]>,
    pub temperatures: Option<&'a [f32]>,
    pub draft_temperatures: Option<&'a [f32]>,
    pub seeds: Option<&'a [u64]>,
    pub request_ids: Option<&'a [u64]>,
    pub steps: Option<&'a [u64]>,
    pub accept_uniforms: Option<&'a [f32]>,
    pub max_draft_len: i32,
    pub controls: Option<SamplingControls<'a>>,
    pub draft_controls: Option<SamplingControls<'a>>,
    pub logprobs: bool,
    pub top_logprobs: usize,
    /// `None`: each request's drafts are a chain; else `[draft_offsets[R]]`.
    pub draft_parents: Option<&'a [i32]>,
    /// `None`: q is `draft_logits` (or a point mass); not with `draft_logits`
    /// or `draft_controls`.
    pub draft_support: Option<DraftSupport<'a>>,
    /// Every request's target is greedy (T = 0), as `temperatures` of 0
    /// make it, without the slice (`temperatures` must then be `None`);
    /// "Greedy batches" in flashspec.h.
    pub greedy: bool,
}

/// Sparse draft distributions, one per draft row (CPU backend): row k's q
/// is `probs[offsets[k]..offsets[k + 1]]` over the tokens
/// `tokens[offsets[k]..offsets[k + 1]]`, 1..=[`MAX_DRAFT_SUPPORT`] distinct
/// ids in `[0, V)` with probabilities ≥ 0 summing to 1 within
/// [`DRAFT_SUPPORT_TOLERANCE`], the drafted token among them with q > 0;
/// q = 0 off the support. Verify is exact when the drafter sampled its
/// token from this truncated, renormalised q. A point-mass draft is the
/// support `{x}` with q = 1, so greedy and stochastic requests share a batch.
///
/// `offsets` needs `draft_offsets[R] + 1` entries, `tokens` and `probs`
/// `offsets[draft_offsets[R]]` each: a shorter slice is an `Error`
/// (OUT_OF_RANGE) naming it before the call. What the library checks
/// (offsets rising from 0, rows of 1..=64 tokens, repeated or out-of-range
/// tokens, probabilities negative, non-finite or not summing to 1, the
/// drafted token outside its support) is its own `Error`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DraftSupport<'a> {
    pub offsets: &'a [i32],
    pub tokens: &'a [i32],
    pub probs: &'a [f32],
}

impl DraftSupport<'_> {
    /// Refuses slices the library would read past: `drafts + 1` offsets,
    /// then as many tokens and probabilities as the last offset says. The
    /// library refuses offsets that do not rise from 0 before it reads a
    /// token, so no earlier offset reaches past the last one.
    fn check(&self, drafts: usize) -> Result<()> {
        let Some(&last) = self.offsets.get(drafts) else {
            return Err(out_of_range(format!("draft_support.offsets: {} entries for draft_offsets[R] + 1 = {}", self.offsets.len(), drafts + 1)));
        };
        let entries = usize::try_from(last).map_err(|_| out_of_range(format!("draft_support.offsets[{drafts}]: {last}, below 0")))?;
        for (name, n) in [("tokens", self.tokens.len()), ("probs", self.probs.len())] {
            if n < entries {
                return Err(out_of_range(format!("draft_support.{name}: {n} entries for draft_support.offsets[{drafts}] = {entries}")));
            }
        }
        Ok(())
    }
}

struct RawBatch {
    batch: sys::flashspec_verify_batch,
    /// `draft_offsets[R] + R`: the rows verify scores and finalize emits.
    target_rows: usize,
    // The batch points at these.
    _hidden: Box<sys::flashspec_tensor>,
    _logits: Option<Box<sys::flashspec_tensor>>,
    _controls: Option<Box<sys::flashspec_sampling_controls>>,
    _draft_controls: Option<Box<sys::flashspec_sampling_controls>>,
}

impl VerifyBatch<'_> {
    fn raw(&self, head: &LmHead<'_>) -> Result<RawBatch> {
        let requests = self.draft_offsets.len().checked_sub(1).ok_or_else(|| Error { status: sys::FLASHSPEC_ERR_OUT_OF_RANGE, message: "draft_offsets: needs R + 1 >= 2 entries".into() })?;
        let rows = rows_of(self.target_hidden, head.hidden, "target_hidden")?;
        let hidden = Box::new(host_tensor(self.target_hidden, rows, head.hidden));
        let logits = match self.draft_logits {
            Some(l) => Some(Box::new(host_tensor(l, rows_of(l, head.vocab, "draft_logits")?, head.vocab))),
            None => None,
        };
        let mut b = std::mem::MaybeUninit::<sys::flashspec_verify_batch>::zeroed();
        let mut b = unsafe {
            sys::flashspec_verify_batch_init_sized(b.as_mut_ptr(), std::mem::size_of::<sys::flashspec_verify_batch>());
            b.assume_init()
        };
        b.num_requests = requests as i32;
        b.draft_offsets = self.draft_offsets.as_ptr();
        b.draft_tokens = self.draft_tokens.as_ptr();
        b.target_hidden = &*hidden;
        b.draft_logits = logits.as_deref().map_or(ptr::null(), |t| t as *const _);
        b.temperatures = opt_ptr(self.temperatures);
        b.draft_temperatures = opt_ptr(self.draft_temperatures);
        b.seeds = opt_ptr(self.seeds);
        b.request_ids = opt_ptr(self.request_ids);
        b.steps = opt_ptr(self.steps);
        b.accept_uniforms = opt_ptr(self.accept_uniforms);
        b.max_draft_len = self.max_draft_len;
        b.greedy = i32::from(self.greedy);
        if let Some((name, n)) = [("temperatures", self.temperatures.map(<[f32]>::len)), ("draft_temperatures", self.draft_temperatures.map(<[f32]>::len)), ("seeds", self.seeds.map(<[u64]>::len)), ("request_ids", self.request_ids.map(<[u64]>::len)), ("steps", self.steps.map(<[u64]>::len))].into_iter().find_map(|(name, n)| n.filter(|&n| n < requests).map(|n| (name, n))) {
            return Err(Error { status: sys::FLASHSPEC_ERR_OUT_OF_RANGE, message: format!("{name}: {n} entries for {requests} requests") });
        }
        let drafts = *self.draft_offsets.last().unwrap();
        if drafts < 0 || self.draft_tokens.len() < drafts as usize || self.accept_uniforms.map_or(false, |u| u.len() < drafts as usize) {
            return Err(Error { status: sys::FLASHSPEC_ERR_OUT_OF_RANGE, message: format!("draft_tokens/accept_uniforms: fewer than draft_offsets[R] = {drafts} entries") });
        }
        if let Some(n) = self.draft_parents.map(<[i32]>::len).filter(|&n| n < drafts as usize) {
            return Err(out_of_range(format!("draft_parents: {n} entries for draft_offsets[R] = {drafts} drafts")));
        }
        b.draft_parents = opt_ptr(self.draft_parents);
        if let Some(support) = &self.draft_support {
            support.check(drafts as usize)?;
            b.draft_support_offsets = support.offsets.as_ptr();
            b.draft_support_tokens = support.tokens.as_ptr();
            b.draft_support_probs = support.probs.as_ptr();
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(Error { status: sys::FLASHSPEC_ERR_OUT_OF_RANGE, message: format!("top_logprobs: {}, at most {MAX_TOP_LOGPROBS}", self.top_logprobs) });
        }
        let drafts = drafts as usize;
        let controls = self.controls.as_ref().map(|c| c.raw("controls", requests, drafts + requests, head.vocab, "requests").map(Box::new)).transpose()?;
        let draft_controls = self.draft_controls.as_ref().map(|c| c.raw("draft_controls", requests, drafts, head.vocab, "requests").map(Box::new)).transpose()?;
        b.controls = controls.as_deref().map_or(ptr::null(), |c| c as *const _);
        b.draft_controls = draft_controls.as_deref().map_or(ptr::null(), |c| c as *const _);
        b.logprobs = i32::from(self.logprobs);
        b.top_logprobs = self.top_logprobs as i32;
        Ok(RawBatch { batch: b, target_rows: drafts + requests, _hidden: hidden, _logits: logits, _controls: controls, _draft_controls: draft_controls })
    }
}

/// What finalize wrote. The logprob vectors are indexed as `emitted_tokens`
/// (slot k of request r at `draft_offsets[r] + r + k`); a slot past a
/// request's tokens holds NaN and -1. Each is empty unless the batch asked
/// for it.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyResult {
    /// `[R]`.
    pub accepted_counts: Vec<i32>,
    /// `[draft_offsets[R] + R]`; entries past a request's tokens are -1.
    pub emitted_tokens: Vec<i32>,
    /// `[R]`: steps + 1.
    pub next_steps: Vec<u64>,
    /// `[draft_offsets[R] + R]` ([`VerifyBatch::logprobs`]): log p(token)
    /// under the controlled target distribution the token was verified
    /// against (0 for a T = 0 row).
    pub logprobs: Vec<f32>,
    /// `[draft_offsets[R] + R]`: log softmax of the raw logits at the token.
    pub raw_logprobs: Vec<f32>,
    /// `[draft_offsets[R] + R, top_n]` ([`VerifyBatch::top_logprobs`]): each
    /// slot's `top_n` tokens of largest raw logit, ties by smaller id.
    pub top_tokens: Vec<i32>,
    /// Their raw logprobs, alike.
    pub top_logprobs: Vec<f32>,
    pub top_n: usize,
    /// `[draft_offsets[R] + R]` for a tree batch ([`VerifyBatch::draft_parents`]),
    /// else empty: slot k < accepted_counts[r] of request r holds the node
    /// index of its k-th accepted node, -1 the rest.
    pub accepted_nodes: Vec<i32>,
    offsets: Vec<i32>,
}

impl VerifyResult {
    /// Outputs for a batch that `VerifyBatch::raw` accepted.
    fn sized(batch: &VerifyBatch<'_>) -> VerifyResult {
        let requests = batch.draft_offsets.len().saturating_sub(1);
        let emitted = batch.draft_offsets.last().map_or(0, |&d| d.max(0) as usize + requests);
        let lp = if batch.logprobs { emitted } else { 0 };
        let top = emitted * batch.top_logprobs;
        VerifyResult {
            accepted_counts: vec![0; requests],
            emitted_tokens: vec![0; emitted],
            next_steps: vec![0; requests],
            logprobs: vec![0.0; lp],
            raw_logprobs: vec![0.0; lp],
            top_tokens: vec![0; top],
            top_logprobs: vec![0.0; top],
            top_n: batch.top_logprobs,
            accepted_nodes: vec![0; if batch.draft_parents.is_some() { emitted } else { 0 }],
            offsets: batch.draft_offsets.to_vec(),
        }
    }

    fn raw(&mut self) -> sys::flashspec_verify_result {
        let mut r = std::mem::MaybeUninit::<sys::flashspec_verify_result>::zeroed();
        let mut r = unsafe {
            sys::flashspec_verify_result_init_sized(r.as_mut_ptr(), std::mem::size_of::<sys::flashspec_verify_result>());
            r.assume_init()
        };
        r.accepted_counts = self.accepted_counts.as_mut_ptr();
        r.emitted_tokens = self.emitted_tokens.as_mut_ptr();
        r.next_steps = self.next_steps.as_mut_ptr();
        r.logprobs = ptr_or_null(&mut self.logprobs);
        r.raw_logprobs = ptr_or_null(&mut self.raw_logprobs);
        r.top_logprobs = ptr_or_null(&mut self.top_logprobs);
        r.top_tokens = ptr_or_null(&mut self.top_tokens);
        r.accepted_nodes = ptr_or_null(&mut self.accepted_nodes);
        r
    }

    fn slots(&self, request: usize) -> std::ops::Range<usize> {
        let start = self.offsets[request] as usize + request;
        start..start + self.accepted_counts[request] as usize + 1
    }

    /// Request r's emitted tokens: accepted drafts, then the recovered or bonus token.
    pub fn tokens(&self, request: usize) -> &[i32] {
        &self.emitted_tokens[self.slots(request)]
    }

    /// The node indices of request r's accepted path, root first; `None`
    /// unless the batch was a tree.
    pub fn nodes(&self, request: usize) -> Option<&[i32]> {
        let slots = self.slots(request);
        (!self.accepted_nodes.is_empty()).then(|| &self.accepted_nodes[slots.start..slots.end - 1])
    }

    /// The logprobs of request r's emitted tokens, under the controlled
    /// target distribution or (`raw`) the raw logits; `None` unless the
    /// batch asked for logprobs.
    pub fn token_logprobs(&self, request: usize, raw: bool) -> Option<&[f32]> {
        let values = if raw { &self.raw_logprobs } else { &self.logprobs };
        (!values.is_empty()).then(|| &values[self.slots(request)])
    }

    /// The top tokens and their raw logprobs of the row of request r's
    /// emitted token k (k ≤ accepted_counts[r]), largest first; empty
    /// unless the batch asked for top logprobs.
    pub fn top(&self, request: usize, k: usize) -> (&[i32], &[f32]) {
        let slot = (self.slots(request).start + k) * self.top_n;
        (&self.top_tokens[slot..slot + self.top_n], &self.top_logprobs[slot..slot + self.top_n])
    }
}
