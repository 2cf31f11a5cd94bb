//! Raw declarations of the FlashSpec C API (`include/flashspec.h`), written
//! by hand and checked against the header by `tests/header_drift.rs`
//! (function prototypes, struct fields, sizes and offsets, enum values).
//! The safe API is the `flashspec` crate.
#![allow(non_camel_case_types)]
#![no_std]

pub use core::ffi::{c_char, c_int, c_uint, c_void};

pub const FLASHSPEC_VERSION_MAJOR: c_uint = 0;
pub const FLASHSPEC_VERSION_MINOR: c_uint = 2;
pub const FLASHSPEC_VERSION_PATCH: c_uint = 0;
pub const FLASHSPEC_VERSION_NUMBER: c_uint =
    FLASHSPEC_VERSION_MAJOR * 10000 + FLASHSPEC_VERSION_MINOR * 100 + FLASHSPEC_VERSION_PATCH;
pub const FLASHSPEC_ABI_VERSION: c_uint = 0;
pub const FLASHSPEC_MAX_VOCAB: i32 = 1 << 20;
pub const FLASHSPEC_MAX_DRAFT_LEN: i32 = 1023;
pub const FLASHSPEC_MAX_HIDDEN: i32 = 65536;
pub const FLASHSPEC_MAX_TOP_K: i32 = 1024;
pub const FLASHSPEC_TOP_K_ALL: i32 = 0x7fffffff;
pub const FLASHSPEC_MAX_TOP_LOGPROBS: i32 = 20;
pub const FLASHSPEC_SHARD_RECORD_VERSION: i32 = 1;
pub const FLASHSPEC_SHARD_RECORD_BYTES: usize = 48;
pub const FLASHSPEC_MAX_DRAFT_SUPPORT: i32 = 64;
pub const FLASHSPEC_MAX_DRAFT_TOP_K: i32 = 16;
pub const FLASHSPEC_DRAFT_SUPPORT_TOLERANCE: f64 = 1e-3;

// ---- enumerations (C enums: 32-bit, fixed values) -------------------------
pub type flashspec_status = c_uint;
pub const FLASHSPEC_OK: flashspec_status = 0;
pub const FLASHSPEC_ERR_INVALID_ARGUMENT: flashspec_status = 1;
pub const FLASHSPEC_ERR_NULL_POINTER: flashspec_status = 2;
pub const FLASHSPEC_ERR_STRUCT_SIZE: flashspec_status = 3;
pub const FLASHSPEC_ERR_OUT_OF_RANGE: flashspec_status = 4;
pub const FLASHSPEC_ERR_DTYPE_MISMATCH: flashspec_status = 5;
pub const FLASHSPEC_ERR_DEVICE_MISMATCH: flashspec_status = 6;
pub const FLASHSPEC_ERR_NON_FINITE: flashspec_status = 7;
pub const FLASHSPEC_ERR_OUT_OF_MEMORY: flashspec_status = 8;
pub const FLASHSPEC_ERR_WORKSPACE_EXCEEDED: flashspec_status = 9;
pub const FLASHSPEC_ERR_UNSUPPORTED: flashspec_status = 10;
pub const FLASHSPEC_ERR_NO_DEVICE: flashspec_status = 11;
pub const FLASHSPEC_ERR_CUDA: flashspec_status = 12;
pub const FLASHSPEC_ERR_CALLBACK: flashspec_status = 13;
pub const FLASHSPEC_ERR_CANCELLED: flashspec_status = 14;
pub const FLASHSPEC_ERR_INTERNAL: flashspec_status = 15;
pub type flashspec_backend = c_uint;
pub const FLASHSPEC_BACKEND_AUTO: flashspec_backend = 0;
pub const FLASHSPEC_BACKEND_CPU: flashspec_backend = 1;
pub const FLASHSPEC_BACKEND_CUDA: flashspec_backend = 2;
pub type flashspec_dtype = c_uint;
pub const FLASHSPEC_DTYPE_F32: flashspec_dtype = 0;
pub const FLASHSPEC_DTYPE_BF16: flashspec_dtype = 1;
pub const FLASHSPEC_DTYPE_F16: flashspec_dtype = 2;
/// 8-bit LM-head codes, for `flashspec_lm_head_create_quantized` only:
/// fp8 e4m3 ("e4m3fn") bit patterns.
pub const FLASHSPEC_DTYPE_E4M3: flashspec_dtype = 3;
/// 8-bit LM-head codes: two's-complement int8.
pub const FLASHSPEC_DTYPE_I8: flashspec_dtype = 4;
pub type flashspec_memory = c_uint;
pub const FLASHSPEC_MEMORY_HOST: flashspec_memory = 0;
pub const FLASHSPEC_MEMORY_CUDA: flashspec_memory = 1;
pub type flashspec_rng_purpose = c_uint;
pub const FLASHSPEC_RNG_DRAFT_NOISE: flashspec_rng_purpose = 1;
pub const FLASHSPEC_RNG_ACCEPT_UNIFORM: flashspec_rng_purpose = 2;
pub const FLASHSPEC_RNG_RESIDUAL_NOISE: flashspec_rng_purpose = 3;
pub const FLASHSPEC_RNG_BONUS_NOISE: flashspec_rng_purpose = 4;
pub type flashspec_lm_head_flags = c_uint;
pub const FLASHSPEC_LM_HEAD_COPY: flashspec_lm_head_flags = 0;
pub const FLASHSPEC_LM_HEAD_BORROW: flashspec_lm_head_flags = 1;
pub type flashspec_draft_kind = c_uint;
pub const FLASHSPEC_DRAFT_TOKENS: flashspec_draft_kind = 0;
pub const FLASHSPEC_DRAFT_LOGITS: flashspec_draft_kind = 1;
pub const FLASHSPEC_DRAFT_HIDDEN: flashspec_draft_kind = 2;
pub const FLASHSPEC_DRAFT_TREE: flashspec_draft_kind = 3;
pub type flashspec_bandit_policy = c_uint;
pub const FLASHSPEC_BANDIT_UCB1: flashspec_bandit_policy = 0;
pub const FLASHSPEC_BANDIT_THOMPSON: flashspec_bandit_policy = 1;
pub const FLASHSPEC_BANDIT_FIXED: flashspec_bandit_policy = 2;
pub const FLASHSPEC_BANDIT_ORACLE: flashspec_bandit_policy = 3;
pub type flashspec_finish_reason = c_uint;
pub const FLASHSPEC_FINISH_NONE: flashspec_finish_reason = 0;
pub const FLASHSPEC_FINISH_LENGTH: flashspec_finish_reason = 1;
pub const FLASHSPEC_FINISH_STOP_TOKEN: flashspec_finish_reason = 2;
pub const FLASHSPEC_FINISH_HOST_STOP: flashspec_finish_reason = 3;
pub const FLASHSPEC_FINISH_CONTEXT_FULL: flashspec_finish_reason = 4;
pub const FLASHSPEC_FINISH_CANCELLED: flashspec_finish_reason = 5;
pub type flashspec_draft_len_rule = c_uint;
pub const FLASHSPEC_DRAFT_LEN_ARM: flashspec_draft_len_rule = 0;
pub const FLASHSPEC_DRAFT_LEN_ADAPTIVE: flashspec_draft_len_rule = 1;

// ---- opaque handles ---------------------------------------------------------
macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
            _not_send_sync: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
        }
    )*};
}
opaque!(flashspec_context, flashspec_lm_head, flashspec_summaries, flashspec_drafter, flashspec_engine, flashspec_batch_engine);

// ---- callbacks ----------------------------------------------------------------
pub type flashspec_draft_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, call: *mut flashspec_draft_call) -> c_int>;
pub type flashspec_target_forward_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, call: *mut flashspec_target_call) -> c_int>;
pub type flashspec_target_rollback_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, num_keep: i32) -> c_int>;
pub type flashspec_target_keep_fn = Option<
    unsafe extern "C" fn(user_data: *mut c_void, num_past: i32, keep: *const i32, num_keep: i32) -> c_int,
>;
pub type flashspec_token_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, token: i32) -> c_int>;
pub type flashspec_batch_target_forward_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, call: *mut flashspec_batch_target_call) -> c_int>;
pub type flashspec_batch_target_rollback_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, sequence_id: u64, num_keep: i32) -> c_int>;
pub type flashspec_batch_target_keep_fn = Option<
    unsafe extern "C" fn(user_data: *mut c_void, sequence_id: u64, num_past: i32, keep: *const i32, num_keep: i32) -> c_int,
>;
pub type flashspec_sequence_token_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, sequence_id: u64, token: i32) -> c_int>;

// ---- structs --------------------------------------------------------------------
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_tensor {
    pub data: *const c_void,
    pub dtype: flashspec_dtype,
    pub memory: flashspec_memory,
    pub rows: i64,
    pub cols: i64,
    pub row_stride: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_context_params {
    pub struct_size: u32,
    pub backend: flashspec_backend,
    pub device_ordinal: i32,
    pub cuda_stream: *mut c_void,
    pub seed: u64,
    pub cpu_threads: i32,
    pub max_rows: i32,
    pub max_requests: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_draft_params {
    pub struct_size: u32,
    pub memory: flashspec_memory,
    pub temperature: f32,
    pub temperatures: *const f32,
    pub seeds: *const u64,
    pub request_ids: *const u64,
    pub steps: *const u64,
    pub positions: *const i32,
    /* Appended in 0.2. */
    pub controls: *const flashspec_sampling_controls,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_sampling_controls {
    pub struct_size: u32,
    pub top_k: *const i32,
    pub top_p: *const f32,
    pub min_p: *const f32,
    pub bias_offsets: *const i32,
    pub bias_tokens: *const i32,
    pub bias_values: *const f32,
    pub token_mask: *const u32,
    pub mask_words: i32,
    pub typical_epsilon: *const f32,
    pub typical_delta: *const f32,
    pub repetition_penalty: *const f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_verify_batch {
    pub struct_size: u32,
    pub memory: flashspec_memory,
    pub num_requests: i32,
    pub draft_offsets: *const i32,
    pub draft_tokens: *const i32,
    pub target_hidden: *const flashspec_tensor,
    pub draft_logits: *const flashspec_tensor,
    pub temperatures: *const f32,
    pub draft_temperatures: *const f32,
    pub seeds: *const u64,
    pub request_ids: *const u64,
    pub steps: *const u64,
    pub accept_uniforms: *const f32,
    pub max_draft_len: i32,
    /* Appended in 0.2. */
    pub controls: *const flashspec_sampling_controls,
    pub draft_controls: *const flashspec_sampling_controls,
    pub logprobs: i32,
    pub top_logprobs: i32,
    pub draft_parents: *const i32,
    /* Appended in 0.3. */
    pub draft_support_offsets: *const i32,
    pub draft_support_tokens: *const i32,
    pub draft_support_probs: *const f32,
    pub greedy: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_verify_result {
    pub struct_size: u32,
    pub memory: flashspec_memory,
    pub accepted_counts: *mut i32,
    pub emitted_tokens: *mut i32,
    pub next_steps: *mut u64,
    /* Appended in 0.2. */
    pub logprobs: *mut f32,
    pub raw_logprobs: *mut f32,
    pub top_tokens: *mut i32,
    pub top_logprobs: *mut f32,
    pub accepted_nodes: *mut i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_ngram_params {
    pub struct_size: u32,
    pub min_n: i32,
    pub max_n: i32,
    pub call_cost: f64,
    pub token_cost: f64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_suffix_params {
    pub struct_size: u32,
    pub max_match_len: i32,
    pub max_depth: i32,
    pub min_probability: f64,
    pub cache_max_tokens: i32,
    pub call_cost: f64,
    pub token_cost: f64,
    pub propose_trees: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_draft_call {
    pub struct_size: u32,
    pub context: *const i32,
    pub context_len: i32,
    pub drafted: *const i32,
    pub num_drafted: i32,
    pub max_tokens: i32,
    pub step: u64,
    pub tokens: *mut i32,
    pub num_tokens: i32,
    pub logits: flashspec_tensor,
    pub hidden: flashspec_tensor,
    pub parents: *mut i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_callback_drafter_params {
    pub struct_size: u32,
    pub kind: flashspec_draft_kind,
    pub draft: flashspec_draft_fn,
    pub user_data: *mut c_void,
    pub draft_temperature: f32,
    pub head: *const flashspec_lm_head,
    pub call_cost: f64,
    pub token_cost: f64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_target_call {
    pub struct_size: u32,
    pub tokens: *const i32,
    pub num_tokens: i32,
    pub num_past: i32,
    pub num_rows: i32,
    pub step: u64,
    pub hidden: flashspec_tensor,
    pub parents: *const i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_arm {
    pub drafter: i32,
    pub draft_len: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_engine_params {
    pub struct_size: u32,
    pub target_forward: flashspec_target_forward_fn,
    pub target_rollback: flashspec_target_rollback_fn,
    pub target_user_data: *mut c_void,
    pub drafters: *const *mut flashspec_drafter,
    pub num_drafters: i32,
    pub arms: *const flashspec_arm,
    pub num_arms: i32,
    pub default_draft_len: i32,
    pub policy: flashspec_bandit_policy,
    pub bandit_seed: u64,
    pub ucb_exploration: f64,
    pub fixed_arm: i32,
    pub oracle_rewards: *const f64,
    pub target_step_cost: f64,
    pub target_row_cost: f64,
    pub max_context: i32,
    /* Appended in 0.3. */
    pub draft_len_memory: f64,
    pub draft_len_rule: flashspec_draft_len_rule,
    pub target_keep: flashspec_target_keep_fn,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_generate_params {
    pub struct_size: u32,
    pub temperature: f32,
    pub seed: u64,
    pub request_id: u64,
    pub max_tokens: i32,
    pub stop_tokens: *const i32,
    pub num_stop_tokens: i32,
    pub on_token: flashspec_token_fn,
    pub on_token_user_data: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_generate_result {
    pub struct_size: u32,
    pub num_tokens: i32,
    pub finish_reason: flashspec_finish_reason,
    pub steps: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_engine_metrics {
    pub struct_size: u32,
    pub steps: u64,
    pub drafts: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    pub emitted_tokens: u64,
    pub acceptance_rate: f64,
    pub mean_accepted_length: f64,
    pub tokens_per_step: f64,
    pub step_latency_p50_us: f64,
    pub step_latency_p99_us: f64,
    pub num_positions: i32,
    pub num_arms: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_arm_metrics {
    pub struct_size: u32,
    pub drafter: i32,
    pub draft_len: i32,
    pub pulls: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    pub mean_reward: f64,
    pub mean_cost: f64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_batch_target_call {
    pub struct_size: u32,
    pub num_sequences: i32,
    pub sequence_ids: *const u64,
    pub num_past: *const i32,
    pub token_offsets: *const i32,
    pub tokens: *const i32,
    pub row_offsets: *const i32,
    pub num_tokens: i32,
    pub num_rows: i32,
    pub step: u64,
    pub hidden: flashspec_tensor,
    pub parents: *const i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_batch_engine_params {
    pub struct_size: u32,
    pub target_forward: flashspec_batch_target_forward_fn,
    pub target_rollback: flashspec_batch_target_rollback_fn,
    pub target_user_data: *mut c_void,
    pub num_drafters: i32,
    pub arms: *const flashspec_arm,
    pub num_arms: i32,
    pub default_draft_len: i32,
    pub policy: flashspec_bandit_policy,
    pub bandit_seed: u64,
    pub ucb_exploration: f64,
    pub fixed_arm: i32,
    pub oracle_rewards: *const f64,
    pub target_step_cost: f64,
    pub target_row_cost: f64,
    pub max_context: i32,
    pub max_sequences: i32,
    pub draft_len_memory: f64,
    pub draft_len_rule: flashspec_draft_len_rule,
    pub target_keep: flashspec_batch_target_keep_fn,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_sequence_params {
    pub struct_size: u32,
    pub drafters: *const *mut flashspec_drafter,
    pub num_drafters: i32,
    pub temperature: f32,
    pub seed: u64,
    pub request_id: u64,
    pub max_tokens: i32,
    pub stop_tokens: *const i32,
    pub num_stop_tokens: i32,
    pub on_token: flashspec_sequence_token_fn,
    pub on_token_user_data: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_sequence_info {
    pub struct_size: u32,
    pub active: i32,
    pub status: flashspec_status,
    pub finish_reason: flashspec_finish_reason,
    pub num_tokens: i32,
    pub steps: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct flashspec_api {
    pub struct_size: u32,
    pub abi_version: u32,
    pub version_number: Option<unsafe extern "C" fn() -> c_uint>,
    pub version_string: Option<unsafe extern "C" fn() -> *const c_char>,
    pub status_string: Option<unsafe extern "C" fn(flashspec_status) -> *const c_char>,
    pub context_params_init: Option<unsafe extern "C" fn(*mut flashspec_context_params)>,
    pub context_create: Option<unsafe extern "C" fn(*const flashspec_context_params, *mut *mut flashspec_context) -> flashspec_status>,
    pub context_destroy: Option<unsafe extern "C" fn(*mut flashspec_context)>,
    pub context_last_error: Option<unsafe extern "C" fn(*const flashspec_context) -> *const c_char>,
    pub context_synchronize: Option<unsafe extern "C" fn(*mut flashspec_context) -> flashspec_status>,
    pub lm_head_create: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_tensor, flashspec_lm_head_flags, *mut *mut flashspec_lm_head) -> flashspec_status>,
    pub lm_head_destroy: Option<unsafe extern "C" fn(*mut flashspec_lm_head)>,
    pub draft_params_init: Option<unsafe extern "C" fn(*mut flashspec_draft_params)>,
    pub draft: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_lm_head, *const flashspec_tensor, *const flashspec_draft_params, *mut i32, *mut f32) -> flashspec_status>,
    pub verify_batch_init: Option<unsafe extern "C" fn(*mut flashspec_verify_batch)>,
    pub verify_result_init: Option<unsafe extern "C" fn(*mut flashspec_verify_result)>,
    pub summaries_create: Option<unsafe extern "C" fn(*mut flashspec_context, i32, i32, *mut *mut flashspec_summaries) -> flashspec_status>,
    pub summaries_destroy: Option<unsafe extern "C" fn(*mut flashspec_summaries)>,
    pub verify: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_lm_head, *const flashspec_verify_batch, *mut flashspec_summaries) -> flashspec_status>,
    pub finalize: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_verify_batch, *const flashspec_summaries, *const flashspec_verify_result) -> flashspec_status>,
    pub verify_and_finalize: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_lm_head, *const flashspec_verify_batch, *const flashspec_verify_result) -> flashspec_status>,
    pub ngram_params_init: Option<unsafe extern "C" fn(*mut flashspec_ngram_params)>,
    pub drafter_create_ngram: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_ngram_params, *mut *mut flashspec_drafter) -> flashspec_status>,
    pub callback_drafter_params_init: Option<unsafe extern "C" fn(*mut flashspec_callback_drafter_params)>,
    pub drafter_create_callback: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_callback_drafter_params, *mut *mut flashspec_drafter) -> flashspec_status>,
    pub drafter_destroy: Option<unsafe extern "C" fn(*mut flashspec_drafter)>,
    pub engine_params_init: Option<unsafe extern "C" fn(*mut flashspec_engine_params)>,
    pub engine_create: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_lm_head, *const flashspec_engine_params, *mut *mut flashspec_engine) -> flashspec_status>,
    pub engine_destroy: Option<unsafe extern "C" fn(*mut flashspec_engine)>,
    pub generate_params_init: Option<unsafe extern "C" fn(*mut flashspec_generate_params)>,
    pub generate_result_init: Option<unsafe extern "C" fn(*mut flashspec_generate_result)>,
    pub engine_generate: Option<unsafe extern "C" fn(*mut flashspec_engine, *const i32, i32, *const flashspec_generate_params, *mut i32, i32, *mut flashspec_generate_result) -> flashspec_status>,
    pub engine_cancel: Option<unsafe extern "C" fn(*mut flashspec_engine)>,
    pub engine_metrics_init: Option<unsafe extern "C" fn(*mut flashspec_engine_metrics)>,
    pub engine_get_metrics: Option<unsafe extern "C" fn(*const flashspec_engine, *mut flashspec_engine_metrics) -> flashspec_status>,
    pub engine_get_position_metrics: Option<unsafe extern "C" fn(*const flashspec_engine, i32, *mut u64, *mut u64, *mut i32) -> flashspec_status>,
    pub arm_metrics_init: Option<unsafe extern "C" fn(*mut flashspec_arm_metrics)>,
    pub engine_get_arm_metrics: Option<unsafe extern "C" fn(*const flashspec_engine, i32, *mut flashspec_arm_metrics) -> flashspec_status>,
    pub engine_reset_metrics: Option<unsafe extern "C" fn(*mut flashspec_engine) -> flashspec_status>,
    pub abi_version_of_library: Option<unsafe extern "C" fn() -> c_uint>,
    pub status_name: Option<unsafe extern "C" fn(flashspec_status) -> *const c_char>,
    pub tensor_make: Option<unsafe extern "C" fn(*const c_void, flashspec_dtype, flashspec_memory, i64, i64) -> flashspec_tensor>,
    pub context_last_cuda_error: Option<unsafe extern "C" fn(*const flashspec_context) -> c_int>,
    pub context_backend: Option<unsafe extern "C" fn(*const flashspec_context) -> flashspec_backend>,
    pub cuda_device_count: Option<unsafe extern "C" fn() -> c_int>,
    pub lm_head_vocab_size: Option<unsafe extern "C" fn(*const flashspec_lm_head) -> i64>,
    pub lm_head_hidden_size: Option<unsafe extern "C" fn(*const flashspec_lm_head) -> i64>,
    pub philox4x32_10: Option<unsafe extern "C" fn(*const u32, *const u32, *mut u32)>,
    pub rng_uniform: Option<unsafe extern "C" fn(u64, u64, u64, i32, flashspec_rng_purpose, i32) -> f64>,
    /* Appended in 0.2. */
    pub sampling_controls_init: Option<unsafe extern "C" fn(*mut flashspec_sampling_controls)>,
    pub draft_params_init_sized: Option<unsafe extern "C" fn(*mut flashspec_draft_params, usize)>,
    pub verify_batch_init_sized: Option<unsafe extern "C" fn(*mut flashspec_verify_batch, usize)>,
    pub verify_result_init_sized: Option<unsafe extern "C" fn(*mut flashspec_verify_result, usize)>,
    pub lm_head_create_shard: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_tensor, flashspec_lm_head_flags, i64, i64, *mut *mut flashspec_lm_head) -> flashspec_status>,
    pub lm_head_vocab_begin: Option<unsafe extern "C" fn(*const flashspec_lm_head) -> i64>,
    pub lm_head_global_vocab_size: Option<unsafe extern "C" fn(*const flashspec_lm_head) -> i64>,
    pub verify_shard: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_lm_head, *const flashspec_verify_batch, *mut c_void) -> flashspec_status>,
    pub finalize_shards: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_verify_batch, *const c_void, i32, *const flashspec_verify_result) -> flashspec_status>,
    pub draft_shard: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_lm_head, *const flashspec_tensor, *const flashspec_draft_params, *mut c_void) -> flashspec_status>,
    pub draft_from_shards: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_draft_params, *const c_void, i32, i32, *mut i32, *mut f32) -> flashspec_status>,
    /* Appended: the batched engine. */
    pub batch_engine_params_init: Option<unsafe extern "C" fn(*mut flashspec_batch_engine_params)>,
    pub batch_engine_create: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_lm_head, *const flashspec_batch_engine_params, *mut *mut flashspec_batch_engine) -> flashspec_status>,
    pub batch_engine_destroy: Option<unsafe extern "C" fn(*mut flashspec_batch_engine)>,
    pub sequence_params_init: Option<unsafe extern "C" fn(*mut flashspec_sequence_params)>,
    pub batch_engine_add_sequence: Option<unsafe extern "C" fn(*mut flashspec_batch_engine, u64, *const i32, i32, *const flashspec_sequence_params) -> flashspec_status>,
    pub batch_engine_remove_sequence: Option<unsafe extern "C" fn(*mut flashspec_batch_engine, u64) -> flashspec_status>,
    pub batch_engine_step: Option<unsafe extern "C" fn(*mut flashspec_batch_engine, *mut i32) -> flashspec_status>,
    pub sequence_info_init: Option<unsafe extern "C" fn(*mut flashspec_sequence_info)>,
    pub batch_engine_get_sequence: Option<unsafe extern "C" fn(*const flashspec_batch_engine, u64, *mut i32, i32, *mut flashspec_sequence_info) -> flashspec_status>,
    pub batch_engine_sequence_error: Option<unsafe extern "C" fn(*const flashspec_batch_engine, u64) -> *const c_char>,
    pub batch_engine_get_metrics: Option<unsafe extern "C" fn(*const flashspec_batch_engine, *mut flashspec_engine_metrics) -> flashspec_status>,
    pub batch_engine_get_sequence_metrics: Option<unsafe extern "C" fn(*const flashspec_batch_engine, u64, *mut flashspec_engine_metrics) -> flashspec_status>,
    pub batch_engine_get_arm_metrics: Option<unsafe extern "C" fn(*const flashspec_batch_engine, i32, *mut flashspec_arm_metrics) -> flashspec_status>,
    /* Appended in 0.3. */
    pub suffix_params_init: Option<unsafe extern "C" fn(*mut flashspec_suffix_params)>,
    pub drafter_create_suffix: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_suffix_params, *mut *mut flashspec_drafter) -> flashspec_status>,
    pub suffix_drafter_propose_tree: Option<unsafe extern "C" fn(*mut flashspec_drafter, *const i32, i32, i32, *mut i32, *mut i32, *mut i32) -> flashspec_status>,
    pub engine_params_init_sized: Option<unsafe extern "C" fn(*mut flashspec_engine_params, usize)>,
    pub draft_top_k: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_lm_head, *const flashspec_tensor, *const flashspec_draft_params, i32, *mut i32, *mut f32) -> flashspec_status>,
    /* Appended: 8-bit LM heads. */
    pub lm_head_create_quantized: Option<unsafe extern "C" fn(*mut flashspec_context, *const flashspec_tensor, *const flashspec_tensor, flashspec_dtype, flashspec_lm_head_flags, *mut *mut flashspec_lm_head) -> flashspec_status>,
    pub lm_head_dtype: Option<unsafe extern "C" fn(*const flashspec_lm_head) -> flashspec_dtype>,
}

// ---- functions --------------------------------------------------------------
extern "C" {
    pub fn flashspec_version_number() -> c_uint;
    pub fn flashspec_version_string() -> *const c_char;
    pub fn flashspec_abi_version() -> c_uint;
    pub fn flashspec_status_string(status: flashspec_status) -> *const c_char;
    pub fn flashspec_status_name(status: flashspec_status) -> *const c_char;
    pub fn flashspec_tensor_make(data: *const c_void, dtype: flashspec_dtype, memory: flashspec_memory, rows: i64, cols: i64) -> flashspec_tensor;
    pub fn flashspec_context_params_init(params: *mut flashspec_context_params);
    pub fn flashspec_context_create(params: *const flashspec_context_params, out: *mut *mut flashspec_context) -> flashspec_status;
    pub fn flashspec_context_destroy(ctx: *mut flashspec_context);
    pub fn flashspec_context_last_error(ctx: *const flashspec_context) -> *const c_char;
    pub fn flashspec_context_last_cuda_error(ctx: *const flashspec_context) -> c_int;
    pub fn flashspec_context_backend(ctx: *const flashspec_context) -> flashspec_backend;
    pub fn flashspec_context_synchronize(ctx: *mut flashspec_context) -> flashspec_status;
    pub fn flashspec_cuda_device_count() -> c_int;
    pub fn flashspec_lm_head_create(ctx: *mut flashspec_context, weight: *const flashspec_tensor, flags: flashspec_lm_head_flags, out: *mut *mut flashspec_lm_head) -> flashspec_status;
    pub fn flashspec_lm_head_create_quantized(ctx: *mut flashspec_context, weight: *const flashspec_tensor, scales: *const flashspec_tensor, stored: flashspec_dtype, flags: flashspec_lm_head_flags, out: *mut *mut flashspec_lm_head) -> flashspec_status;
    pub fn flashspec_lm_head_dtype(head: *const flashspec_lm_head) -> flashspec_dtype;
    pub fn flashspec_lm_head_destroy(head: *mut flashspec_lm_head);
    pub fn flashspec_lm_head_vocab_size(head: *const flashspec_lm_head) -> i64;
    pub fn flashspec_lm_head_hidden_size(head: *const flashspec_lm_head) -> i64;
    /// Fills the 0.1 layout only: use flashspec_draft_params_init_sized.
    pub fn flashspec_draft_params_init(params: *mut flashspec_draft_params);
    pub fn flashspec_draft(ctx: *mut flashspec_context, head: *const flashspec_lm_head, hidden: *const flashspec_tensor, params: *const flashspec_draft_params, tokens_out: *mut i32, scores_out: *mut f32) -> flashspec_status;
    pub fn flashspec_draft_top_k(ctx: *mut flashspec_context, head: *const flashspec_lm_head, hidden: *const flashspec_tensor, params: *const flashspec_draft_params, k: i32, tokens_out: *mut i32, logprobs_out: *mut f32) -> flashspec_status;
    /// Fills the 0.1 layout only: use flashspec_verify_batch_init_sized.
    pub fn flashspec_verify_batch_init(batch: *mut flashspec_verify_batch);
    pub fn flashspec_summaries_create(ctx: *mut flashspec_context, max_rows: i32, max_requests: i32, out: *mut *mut flashspec_summaries) -> flashspec_status;
    pub fn flashspec_summaries_destroy(summaries: *mut flashspec_summaries);
    /// Fills the 0.1 layout only: use flashspec_verify_result_init_sized.
    pub fn flashspec_verify_result_init(result: *mut flashspec_verify_result);
    pub fn flashspec_verify(ctx: *mut flashspec_context, head: *const flashspec_lm_head, batch: *const flashspec_verify_batch, summaries: *mut flashspec_summaries) -> flashspec_status;
    pub fn flashspec_finalize(ctx: *mut flashspec_context, batch: *const flashspec_verify_batch, summaries: *const flashspec_summaries, result: *const flashspec_verify_result) -> flashspec_status;
    pub fn flashspec_verify_and_finalize(ctx: *mut flashspec_context, head: *const flashspec_lm_head, batch: *const flashspec_verify_batch, result: *const flashspec_verify_result) -> flashspec_status;
    pub fn flashspec_philox4x32_10(counter: *const u32, key: *const u32, out: *mut u32);
    pub fn flashspec_rng_uniform(seed: u64, request_id: u64, step: u64, position: i32, purpose: flashspec_rng_purpose, token: i32) -> f64;
    pub fn flashspec_sampling_controls_init(controls: *mut flashspec_sampling_controls);
    /// Fills `size` bytes (pass `size_of` of the struct); the plain `*_init`
    /// symbols of these three structs fill their 0.1 layout only.
    pub fn flashspec_draft_params_init_sized(params: *mut flashspec_draft_params, size: usize);
    pub fn flashspec_verify_batch_init_sized(batch: *mut flashspec_verify_batch, size: usize);
    pub fn flashspec_verify_result_init_sized(result: *mut flashspec_verify_result, size: usize);
    pub fn flashspec_lm_head_create_shard(ctx: *mut flashspec_context, weight: *const flashspec_tensor, flags: flashspec_lm_head_flags, vocab_begin: i64, vocab_size: i64, out: *mut *mut flashspec_lm_head) -> flashspec_status;
    pub fn flashspec_lm_head_vocab_begin(head: *const flashspec_lm_head) -> i64;
    pub fn flashspec_lm_head_global_vocab_size(head: *const flashspec_lm_head) -> i64;
    pub fn flashspec_verify_shard(ctx: *mut flashspec_context, head: *const flashspec_lm_head, batch: *const flashspec_verify_batch, records: *mut c_void) -> flashspec_status;
    pub fn flashspec_finalize_shards(ctx: *mut flashspec_context, batch: *const flashspec_verify_batch, records: *const c_void, num_shards: i32, result: *const flashspec_verify_result) -> flashspec_status;
    pub fn flashspec_draft_shard(ctx: *mut flashspec_context, head: *const flashspec_lm_head, hidden: *const flashspec_tensor, params: *const flashspec_draft_params, records: *mut c_void) -> flashspec_status;
    pub fn flashspec_draft_from_shards(ctx: *mut flashspec_context, params: *const flashspec_draft_params, records: *const c_void, num_shards: i32, rows: i32, tokens_out: *mut i32, scores_out: *mut f32) -> flashspec_status;
    pub fn flashspec_ngram_params_init(params: *mut flashspec_ngram_params);
    pub fn flashspec_drafter_create_ngram(ctx: *mut flashspec_context, params: *const flashspec_ngram_params, out: *mut *mut flashspec_drafter) -> flashspec_status;
    pub fn flashspec_suffix_params_init(params: *mut flashspec_suffix_params);
    pub fn flashspec_drafter_create_suffix(ctx: *mut flashspec_context, params: *const flashspec_suffix_params, out: *mut *mut flashspec_drafter) -> flashspec_status;
    pub fn flashspec_suffix_drafter_propose_tree(drafter: *mut flashspec_drafter, context: *const i32, context_len: i32, max_nodes: i32, tokens_out: *mut i32, parents_out: *mut i32, num_nodes_out: *mut i32) -> flashspec_status;
    pub fn flashspec_callback_drafter_params_init(params: *mut flashspec_callback_drafter_params);
    pub fn flashspec_drafter_create_callback(ctx: *mut flashspec_context, params: *const flashspec_callback_drafter_params, out: *mut *mut flashspec_drafter) -> flashspec_status;
    pub fn flashspec_drafter_destroy(drafter: *mut flashspec_drafter);
    /// Fills the 0.2 layout only: use flashspec_engine_params_init_sized.
    pub fn flashspec_engine_params_init(params: *mut flashspec_engine_params);
    pub fn flashspec_engine_params_init_sized(params: *mut flashspec_engine_params, size: usize);
    pub fn flashspec_engine_create(ctx: *mut flashspec_context, target_head: *const flashspec_lm_head, params: *const flashspec_engine_params, out: *mut *mut flashspec_engine) -> flashspec_status;
    pub fn flashspec_engine_destroy(engine: *mut flashspec_engine);
    pub fn flashspec_generate_params_init(params: *mut flashspec_generate_params);
    pub fn flashspec_generate_result_init(result: *mut flashspec_generate_result);
    pub fn flashspec_engine_generate(engine: *mut flashspec_engine, prompt: *const i32, prompt_len: i32, params: *const flashspec_generate_params, tokens_out: *mut i32, tokens_capacity: i32, result: *mut flashspec_generate_result) -> flashspec_status;
    pub fn flashspec_engine_cancel(engine: *mut flashspec_engine);
    pub fn flashspec_engine_metrics_init(metrics: *mut flashspec_engine_metrics);
    pub fn flashspec_engine_get_metrics(engine: *const flashspec_engine, out: *mut flashspec_engine_metrics) -> flashspec_status;
    pub fn flashspec_engine_get_position_metrics(engine: *const flashspec_engine, capacity: i32, drafted: *mut u64, accepted: *mut u64, num_positions_out: *mut i32) -> flashspec_status;
    pub fn flashspec_arm_metrics_init(metrics: *mut flashspec_arm_metrics);
    pub fn flashspec_engine_get_arm_metrics(engine: *const flashspec_engine, arm: i32, out: *mut flashspec_arm_metrics) -> flashspec_status;
    pub fn flashspec_engine_reset_metrics(engine: *mut flashspec_engine) -> flashspec_status;
    pub fn flashspec_batch_engine_params_init(params: *mut flashspec_batch_engine_params);
    pub fn flashspec_batch_engine_create(ctx: *mut flashspec_context, target_head: *const flashspec_lm_head, params: *const flashspec_batch_engine_params, out: *mut *mut flashspec_batch_engine) -> flashspec_status;
    pub fn flashspec_batch_engine_destroy(engine: *mut flashspec_batch_engine);
    pub fn flashspec_sequence_params_init(params: *mut flashspec_sequence_params);
    pub fn flashspec_batch_engine_add_sequence(engine: *mut flashspec_batch_engine, sequence_id: u64, prompt: *const i32, prompt_len: i32, params: *const flashspec_sequence_params) -> flashspec_status;
    pub fn flashspec_batch_engine_remove_sequence(engine: *mut flashspec_batch_engine, sequence_id: u64) -> flashspec_status;
    pub fn flashspec_batch_engine_step(engine: *mut flashspec_batch_engine, num_active_out: *mut i32) -> flashspec_status;
    pub fn flashspec_sequence_info_init(info: *mut flashspec_sequence_info);
    pub fn flashspec_batch_engine_get_sequence(engine: *const flashspec_batch_engine, sequence_id: u64, tokens_out: *mut i32, capacity: i32, info: *mut flashspec_sequence_info) -> flashspec_status;
    pub fn flashspec_batch_engine_sequence_error(engine: *const flashspec_batch_engine, sequence_id: u64) -> *const c_char;
    pub fn flashspec_batch_engine_get_metrics(engine: *const flashspec_batch_engine, out: *mut flashspec_engine_metrics) -> flashspec_status;
    pub fn flashspec_batch_engine_get_sequence_metrics(engine: *const flashspec_batch_engine, sequence_id: u64, out: *mut flashspec_engine_metrics) -> flashspec_status;
    pub fn flashspec_batch_engine_get_arm_metrics(engine: *const flashspec_batch_engine, arm: i32, out: *mut flashspec_arm_metrics) -> flashspec_status;
    pub fn flashspec_get_api(abi_version: c_uint) -> *const flashspec_api;
}
