//! The speculative engine: drafters, arms chosen by a bandit policy, the
//! host's target model as closures, generation with streaming,
//! cancellation and metrics (the engine section of flashspec.h).
//!
//! Closures sit behind `extern "C"` trampolines: a closure's `Err` or a
//! panic (caught with `catch_unwind`, never unwinding into C) becomes a
//! callback failure, the call fails with `FLASHSPEC_ERR_CALLBACK`, and
//! [`GenerateError::source`] gives the closure's error. The engine stays
//! usable. What a closure returns is kept by the engine or drafter until
//! the library is done with it.
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex};

use crate::{check, host_tensor, sys, Context, Error, LmHead, Result};

/// The error type callbacks return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
/// What callbacks return.
pub type CallbackResult<T> = std::result::Result<T, BoxError>;

/// A panic caught in a callback, as an error.
#[derive(Debug)]
pub struct CallbackPanic(pub String);

impl fmt::Display for CallbackPanic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "panicked: {}", self.0)
    }
}

impl std::error::Error for CallbackPanic {}

/// The first failure of a callback during one engine call.
#[derive(Default)]
pub(crate) struct Failure(pub(crate) Option<(&'static str, BoxError)>);

impl Failure {
    pub(crate) fn record(&mut self, where_: &'static str, error: BoxError) {
        if self.0.is_none() {
            self.0 = Some((where_, error));
        }
    }
}

/// Runs `f`; an `Err` or a panic is recorded in `failure` and becomes 1.
pub(crate) fn guarded(failure: &mut Failure, where_: &'static str, f: impl FnOnce() -> CallbackResult<c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(rc)) => rc,
        Ok(Err(e)) => {
            failure.record(where_, e);
            1
        }
        Err(payload) => {
            let text = payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned()).unwrap_or_else(|| "a non-string payload".into());
            failure.record(where_, Box::new(CallbackPanic(text)));
            1
        }
    }
}

pub(crate) fn tensor_of(data: &[f32], rows: usize, cols: usize) -> sys::flashspec_tensor {
    host_tensor(data, rows, cols)
}

// ---- drafters -------------------------------------------------------------------

/// N-gram (prompt lookup) drafter parameters; `Default` gives the library's.
#[derive(Debug, Clone)]
pub struct NgramOptions {
    pub min_n: i32,
    pub max_n: i32,
    /// Costs in units of one target forward.
    pub call_cost: f64,
    pub token_cost: f64,
}

impl Default for NgramOptions {
    fn default() -> Self {
        let mut p = std::mem::MaybeUninit::<sys::flashspec_ngram_params>::zeroed();
        // SAFETY: init fills every field.
        let p = unsafe {
            sys::flashspec_ngram_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        NgramOptions { min_n: p.min_n, max_n: p.max_n, call_cost: p.call_cost, token_cost: p.token_cost }
    }
}

/// Callback drafter parameters: `draft_temperature` (logits drafters) and costs.
#[derive(Debug, Clone)]
pub struct CallbackDrafterOptions {
    pub draft_temperature: f32,
    pub call_cost: f64,
    pub token_cost: f64,
}

impl Default for CallbackDrafterOptions {
    fn default() -> Self {
        let mut p = std::mem::MaybeUninit::<sys::flashspec_callback_drafter_params>::zeroed();
        // SAFETY: init fills every field.
        let p = unsafe {
            sys::flashspec_callback_drafter_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        CallbackDrafterOptions { draft_temperature: p.draft_temperature, call_cost: p.call_cost, token_cost: p.token_cost }
    }
}

/// Suffix drafter parameters (flashspec_suffix_params); `Default` gives
/// the library's.
#[derive(Debug, Clone)]
pub struct SuffixOptions {
    /// Longest suffix of the sequence matched, 1..64.
    pub max_match_len: i32,
    /// Longest path proposed, 1..64.
    pub max_depth: i32,
    /// Least score (estimated acceptance probability of a token and its
    /// path) of a proposed token, 0..1.
    pub min_probability: f64,
    /// Tokens of earlier outputs kept in the cache, 0..2^24 (0: no cache).
    pub cache_max_tokens: i32,
    /// Costs in units of one target forward.
    pub call_cost: f64,
    pub token_cost: f64,
    /// In an engine: draft trees of at most k nodes (the tree of
    /// [`Drafter::propose_tree`]) instead of chains; the engine's forward
    /// then sees the tree ([`Context::tree_engine`]).
    pub propose_trees: bool,
}

fn suffix_params_default() -> sys::flashspec_suffix_params {
    let mut p = std::mem::MaybeUninit::<sys::flashspec_suffix_params>::zeroed();
    // SAFETY: init fills every field.
    unsafe {
        sys::flashspec_suffix_params_init(p.as_mut_ptr());
        p.assume_init()
    }
}

impl Default for SuffixOptions {
    fn default() -> Self {
        let p = suffix_params_default();
        SuffixOptions { max_match_len: p.max_match_len, max_depth: p.max_depth, min_probability: p.min_probability, cache_max_tokens: p.cache_max_tokens, call_cost: p.call_cost, token_cost: p.token_cost, propose_trees: p.propose_trees != 0 }
    }
}

/// A suffix drafter's proposal tree: node `i` has token `tokens[i]` and
/// parent `parents[i]`, a node index in `[-1, i)` (-1: a child of the last
/// context token), best nodes first. `parents` is what
/// `VerifyBatch::draft_parents` takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraftTree {
    pub tokens: Vec<i32>,
    pub parents: Vec<i32>,
}

type TokensFn<'a> = Box<dyn FnMut(&[i32], usize) -> CallbackResult<Vec<i32>> + 'a>;
type LogitsFn<'a> = Box<dyn FnMut(&[i32], usize) -> CallbackResult<(Vec<i32>, Vec<f32>)> + 'a>;
type TreeFn<'a> = Box<dyn FnMut(&[i32], usize) -> CallbackResult<DraftTree> + 'a>;

enum DraftClosure<'a> {
    Tokens(TokensFn<'a>),
    Logits(LogitsFn<'a>),
    Tree(TreeFn<'a>),
}

struct DrafterState<'a> {
    closure: DraftClosure<'a>,
    failure: Failure,
    logits: Vec<f32>, // read by the library until the step ends
}

unsafe extern "C" fn draft_trampoline(user_data: *mut c_void, call: *mut sys::flashspec_draft_call) -> c_int {
    // SAFETY: user_data is the drafter's boxed state, alive while the drafter is.
    let state = unsafe { &mut *(user_data as *mut DrafterState<'_>) };
    let call = unsafe { &mut *call };
    let DrafterState { closure, failure, logits } = state;
    guarded(failure, "draft callback", || {
        // SAFETY: the library passes context_len valid tokens and a buffer of max_tokens.
        let context = unsafe { std::slice::from_raw_parts(call.context, call.context_len.max(0) as usize) };
        let max = call.max_tokens.max(0) as usize;
        let (tokens, rows, parents) = match closure {
            DraftClosure::Tokens(f) => (f(context, max)?, None, None),
            DraftClosure::Logits(f) => {
                let (t, l) = f(context, max)?;
                (t, Some(l), None)
            }
            DraftClosure::Tree(f) => {
                let tree = f(context, max)?;
                (tree.tokens, None, Some(tree.parents))
            }
        };
        if tokens.len() > max {
            return Err(format!("returned {} tokens, more than max_tokens = {max}", tokens.len()).into());
        }
        let buffer = unsafe { std::slice::from_raw_parts_mut(call.tokens, max) };
        buffer[..tokens.len()].copy_from_slice(&tokens);
        if let Some(parents) = parents {
            if parents.len() != tokens.len() {
                return Err(format!("returned {} parents for {} tokens", parents.len(), tokens.len()).into());
            }
            if call.parents.is_null() {
                return Err("the library passed no parents buffer".into());
            }
            // SAFETY: a TREE call's parents buffer holds max_tokens entries.
            let buffer = unsafe { std::slice::from_raw_parts_mut(call.parents, max) };
            buffer[..parents.len()].copy_from_slice(&parents);
        }
        if let (Some(rows), n) = (rows, tokens.len()) {
            if n > 0 {
                if rows.is_empty() || rows.len() % n != 0 {
                    return Err(format!("returned {} logits, not whole rows for {n} tokens", rows.len()).into());
                }
                *logits = rows;
                call.logits = tensor_of(logits, n, logits.len() / n);
            }
        }
        call.num_tokens = tokens.len() as i32;
        Ok(0)
    })
}

/// A drafter; it serves one engine (or one sequence of a batched engine),
/// which owns it while it uses it.
pub struct Drafter<'a> {
    pub(crate) raw: *mut sys::flashspec_drafter,
    state: Option<Box<DrafterState<'a>>>,
    ctx: &'a Context,
}

impl Drop for Drafter<'_> {
    fn drop(&mut self) {
        unsafe { sys::flashspec_drafter_destroy(self.raw) };
    }
}

impl<'a> Drafter<'a> {
    /// A draft tree after `context` from a suffix drafter, of at most
    /// `max_nodes` nodes (0..=[`MAX_DRAFT_LEN`](crate::MAX_DRAFT_LEN)),
    /// for a host that verifies trees itself. The drafter first indexes
    /// `context` (non-empty, token ids ≥ 0): a context that extends the one
    /// it indexed last costs only its new tokens; any other starts a new
    /// sequence and the previous one's output enters the cache of earlier
    /// outputs (see flashspec_suffix_drafter_propose_tree). Nodes come best
    /// first, so the first n nodes of a larger budget are the tree of
    /// budget n; none when nothing matched. Errors: OUT_OF_RANGE
    /// (`max_nodes`, checked here; the context), INVALID_ARGUMENT (not a
    /// suffix drafter).
    pub fn propose_tree(&mut self, context: &[i32], max_nodes: usize) -> Result<DraftTree> {
        if max_nodes > crate::MAX_DRAFT_LEN {
            return Err(crate::out_of_range(format!("max_nodes: {max_nodes} is more than FLASHSPEC_MAX_DRAFT_LEN = {}", sys::FLASHSPEC_MAX_DRAFT_LEN)));
        }
        let context_len = i32::try_from(context.len()).map_err(|_| crate::out_of_range(format!("context: {} tokens do not fit an int32_t", context.len())))?;
        // Buffers of max_nodes entries (at least one, so never NULL): the
        // library writes at most max_nodes of each.
        let (mut tokens, mut parents) = (vec![0i32; max_nodes.max(1)], vec![0i32; max_nodes.max(1)]);
        let mut num_nodes = 0i32;
        // SAFETY: context holds context_len tokens (an empty one passes its
        // non-null, unread pointer, refused as OUT_OF_RANGE context_len);
        // tokens and parents hold max_nodes entries.
        let status = unsafe { sys::flashspec_suffix_drafter_propose_tree(self.raw, context.as_ptr(), context_len, max_nodes as i32, tokens.as_mut_ptr(), parents.as_mut_ptr(), &mut num_nodes) };
        check(status, self.ctx.raw)?;
        let n = (num_nodes.max(0) as usize).min(max_nodes);
        tokens.truncate(n);
        parents.truncate(n);
        Ok(DraftTree { tokens, parents })
    }

    pub(crate) fn take_failure(&mut self) -> Option<(&'static str, BoxError)> {
        self.state.as_mut().and_then(|s| s.failure.0.take())
    }
}

impl Context {
    /// The built-in n-gram (prompt lookup) drafter.
    pub fn ngram_drafter(&self, options: &NgramOptions) -> Result<Drafter<'_>> {
        let mut p = std::mem::MaybeUninit::<sys::flashspec_ngram_params>::zeroed();
        let mut p = unsafe {
            sys::flashspec_ngram_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        p.min_n = options.min_n;
        p.max_n = options.max_n;
        p.call_cost = options.call_cost;
        p.token_cost = options.token_cost;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::flashspec_drafter_create_ngram(self.raw, &p, &mut raw) }, self.raw)?;
        Ok(Drafter { raw, state: None, ctx: self })
    }

    /// The built-in suffix drafter (SuffixDecoding): it indexes the current
    /// sequence and a cache of its earlier generations' outputs, and
    /// drafts as long as the counts are confident. Reuse it across
    /// generations (or sequences of a batched engine) to profit from the
    /// cache; [`Drafter::propose_tree`] gives trees.
    pub fn suffix_drafter(&self, options: &SuffixOptions) -> Result<Drafter<'_>> {
        let mut p = suffix_params_default();
        p.max_match_len = options.max_match_len;
        p.max_depth = options.max_depth;
        p.min_probability = options.min_probability;
        p.cache_max_tokens = options.cache_max_tokens;
        p.call_cost = options.call_cost;
        p.token_cost = options.token_cost;
        p.propose_trees = i32::from(options.propose_trees);
        let mut raw = ptr::null_mut();
        check(unsafe { sys::flashspec_drafter_create_suffix(self.raw, &p, &mut raw) }, self.raw)?;
        Ok(Drafter { raw, state: None, ctx: self })
    }

    fn callback_drafter_with<'a>(&'a self, closure: DraftClosure<'a>, options: &CallbackDrafterOptions) -> Result<Drafter<'a>> {
        let kind = match closure {
            DraftClosure::Tokens(_) => sys::FLASHSPEC_DRAFT_TOKENS,
            DraftClosure::Logits(_) => sys::FLASHSPEC_DRAFT_LOGITS,
            DraftClosure::Tree(_) => sys::FLASHSPEC_DRAFT_TREE,
        };
        let mut state = Box::new(DrafterState { closure, failure: Failure::default(), logits: Vec::new() });
        let mut p = std::mem::MaybeUninit::<sys::flashspec_callback_drafter_params>::zeroed();
        let mut p = unsafe {
            sys::flashspec_callback_drafter_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        p.kind = kind;
        p.draft = Some(draft_trampoline);
        p.user_data = (&mut *state as *mut DrafterState<'a>).cast();
        p.draft_temperature = options.draft_temperature;
        p.call_cost = options.call_cost;
        p.token_cost = options.token_cost;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::flashspec_drafter_create_callback(self.raw, &p, &mut raw) }, self.raw)?;
        Ok(Drafter { raw, state: Some(state), ctx: self })
    }

    /// A drafter backed by `f(context, max_tokens)`, which returns up to
    /// `max_tokens` greedy (point-mass) draft tokens after `context` (the
    /// prompt, then the tokens emitted so far); none: no draft this step.
    pub fn callback_drafter<'a>(&'a self, f: impl FnMut(&[i32], usize) -> CallbackResult<Vec<i32>> + 'a, options: &CallbackDrafterOptions) -> Result<Drafter<'a>> {
        self.callback_drafter_with(DraftClosure::Tokens(Box::new(f)), options)
    }

    /// A drafter backed by `f(context, max_tokens)`, which samples its tokens
    /// and returns them with the draft logits rows (`[tokens, V]`,
    /// row-major) they were sampled from; q = softmax(row /
    /// draft_temperature), and verification stays exact.
    pub fn logits_drafter<'a>(&'a self, f: impl FnMut(&[i32], usize) -> CallbackResult<(Vec<i32>, Vec<f32>)> + 'a, options: &CallbackDrafterOptions) -> Result<Drafter<'a>> {
        self.callback_drafter_with(DraftClosure::Logits(Box::new(f)), options)
    }

    /// A drafter backed by `f(context, max_tokens)`, which returns a tree
    /// of up to `max_tokens` point-mass draft tokens after `context`: node
    /// `i` has token `tokens[i]` and parent `parents[i]` in `[-1, i)` (-1:
    /// a child of the last context token; parents before children). Its
    /// engine runs tree steps, whose forward sees the tree
    /// ([`Context::tree_engine`]). A parent out of range fails the
    /// generation with CALLBACK, the message naming the node.
    pub fn tree_drafter<'a>(&'a self, f: impl FnMut(&[i32], usize) -> CallbackResult<DraftTree> + 'a, options: &CallbackDrafterOptions) -> Result<Drafter<'a>> {
        self.callback_drafter_with(DraftClosure::Tree(Box::new(f)), options)
    }

    /// An engine whose target model has LM head `head` and runs as
    /// `forward(tokens, num_past, num_rows)`: drop cached tokens beyond
    /// `num_past` (0: a new sequence), append `tokens` to the KV cache and
    /// return the final hidden rows of the last `num_rows` tokens,
    /// `[num_rows, d]` row-major. The context must use the CPU backend.
    /// This forward runs chains only: a tree step (a tree drafter) fails
    /// with CALLBACK; use [`Context::tree_engine`] for trees.
    pub fn engine<'a>(&'a self, head: &'a LmHead<'_>, forward: impl FnMut(&[i32], usize, usize) -> CallbackResult<Vec<f32>> + 'a, options: EngineOptions<'a>) -> Result<Engine<'a>> {
        Engine::new(self, head, ForwardFn::Chain(Box::new(forward)), options)
    }

    /// An engine whose forward sees the whole target call, trees included
    /// (flashspec.h, Tree steps): for a tree step `call.parents` holds, per
    /// token, -1 (it follows the token before it) or the index in
    /// `call.tokens` of its parent; run it with tree attention and return
    /// the rows of the last `num_rows` tokens (the root's, then one per
    /// node). Chain steps have `parents: None`.
    pub fn tree_engine<'a>(&'a self, head: &'a LmHead<'_>, forward: impl FnMut(&TargetCall<'_>) -> CallbackResult<Vec<f32>> + 'a, options: EngineOptions<'a>) -> Result<Engine<'a>> {
        Engine::new(self, head, ForwardFn::Tree(Box::new(forward)), options)
    }
}

/// One target forward as [`Context::tree_engine`]'s closure sees it
/// (flashspec_target_call).
#[derive(Debug, Clone, Copy)]
pub struct TargetCall<'c> {
    /// Tokens to append to the KV cache.
    pub tokens: &'c [i32],
    /// A tree step's parents, one per token; `None` for a chain step.
    pub parents: Option<&'c [i32]>,
    /// Tokens the cache must hold before these (drop any beyond; 0: a new sequence).
    pub num_past: usize,
    /// Hidden rows wanted: those of the last `num_rows` tokens.
    pub num_rows: usize,
    /// The engine's step within the generation.
    pub step: u64,
}

// ---- the engine -------------------------------------------------------------------

/// Drafter-selection policy.
#[derive(Debug, Clone, PartialEq)]
pub enum Policy {
    /// UCB1 with this exploration weight (the library default is 1).
    Ucb1 { exploration: f64 },
    /// Thompson sampling with Beta posteriors, deterministic given the seed.
    Thompson { seed: u64 },
    /// Always this arm.
    Fixed(i32),
    /// Always the arm with the largest expected reward (one per arm).
    Oracle(Vec<f64>),
}

/// A (drafter index, draft length) pair; `drafter: None` with length 0
/// decodes without drafting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arm {
    pub drafter: Option<usize>,
    pub draft_len: i32,
}

/// How many tokens a step drafts (flashspec_draft_len_rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftLenRule {
    /// The played arm's k.
    Arm,
    /// Dynamic speculation length: up to the arm's k, the k that maximises
    /// the expected tokens per unit cost under live per-drafter acceptance
    /// estimates (see FLASHSPEC_DRAFT_LEN_ADAPTIVE).
    Adaptive,
}

impl DraftLenRule {
    pub(crate) fn raw(self) -> sys::flashspec_draft_len_rule {
        match self {
            DraftLenRule::Arm => sys::FLASHSPEC_DRAFT_LEN_ARM,
            DraftLenRule::Adaptive => sys::FLASHSPEC_DRAFT_LEN_ADAPTIVE,
        }
    }

    pub(crate) fn from_raw(raw: sys::flashspec_draft_len_rule) -> DraftLenRule {
        if raw == sys::FLASHSPEC_DRAFT_LEN_ADAPTIVE { DraftLenRule::Adaptive } else { DraftLenRule::Arm }
    }
}

/// The arm table the library reads, or `None` for one arm per drafter.
pub(crate) fn arm_table(arms: Option<&[Arm]>) -> Option<Vec<sys::flashspec_arm>> {
    arms.map(|arms| arms.iter().map(|a| sys::flashspec_arm { drafter: a.drafter.map_or(-1, |d| d as i32), draft_len: a.draft_len }).collect())
}

/// Sets the policy fields of flashspec_engine_params or
/// flashspec_batch_engine_params (the same names in both) from a
/// [`Policy`]; `$arms` is the number of arms the library will read oracle
/// rewards for. Evaluates to the oracle rewards, which must outlive the
/// create call, or returns OUT_OF_RANGE when there are too few.
macro_rules! set_policy {
    ($p:expr, $policy:expr, $arms:expr) => {{
        let mut oracle: Vec<f64> = Vec::new();
        match $policy {
            Policy::Ucb1 { exploration } => {
                $p.policy = sys::FLASHSPEC_BANDIT_UCB1;
                $p.ucb_exploration = exploration;
            }
            Policy::Thompson { seed } => {
                $p.policy = sys::FLASHSPEC_BANDIT_THOMPSON;
                $p.bandit_seed = seed;
            }
            Policy::Fixed(arm) => {
                $p.policy = sys::FLASHSPEC_BANDIT_FIXED;
                $p.fixed_arm = arm;
            }
            Policy::Oracle(rewards) => {
                // The library reads one reward per arm. (None at all is
                // passed as NULL, which the library refuses itself.)
                let arms: usize = $arms;
                if !rewards.is_empty() && rewards.len() < arms {
                    return Err(Error { status: sys::FLASHSPEC_ERR_OUT_OF_RANGE, message: format!("oracle rewards: {} entries for {arms} arms", rewards.len()) });
                }
                $p.policy = sys::FLASHSPEC_BANDIT_ORACLE;
                oracle = rewards;
                $p.oracle_rewards = if oracle.is_empty() { ptr::null() } else { oracle.as_ptr() };
            }
        }
        oracle
    }};
}
pub(crate) use set_policy;

type RollbackFn<'a> = Box<dyn FnMut(usize) -> CallbackResult<()> + 'a>;
type KeepFn<'a> = Box<dyn FnMut(usize, &[i32]) -> CallbackResult<()> + 'a>;

enum ForwardFn<'a> {
    Chain(Box<dyn FnMut(&[i32], usize, usize) -> CallbackResult<Vec<f32>> + 'a>),
    Tree(Box<dyn FnMut(&TargetCall<'_>) -> CallbackResult<Vec<f32>> + 'a>),
}

/// Engine parameters; `Default` gives the library's defaults.
pub struct EngineOptions<'a> {
    /// Truncate the target's KV cache to its first `num_keep` tokens (optional).
    pub rollback: Option<RollbackFn<'a>>,
    /// After a tree step, `keep(num_past, keep)`: keep the cache's first
    /// `num_past` tokens, then of the last forward's tokens those at the
    /// indices `keep` (increasing), dropping the rest (optional; without
    /// it the engine sends the accepted path again).
    pub keep: Option<KeepFn<'a>>,
    /// The drafters; the engine owns them.
    pub drafters: Vec<Drafter<'a>>,
    /// `None`: one arm per drafter of length `default_draft_len`.
    pub arms: Option<Vec<Arm>>,
    pub default_draft_len: i32,
    pub policy: Policy,
    /// Costs in units of one target forward (see flashspec_engine_params).
    pub target_step_cost: f64,
    pub target_row_cost: f64,
    /// Most tokens the target's cache holds; 0 = unlimited.
    pub max_context: i32,
    /// How many tokens a step drafts; the library default is [`DraftLenRule::Arm`].
    pub draft_len_rule: DraftLenRule,
    /// [`DraftLenRule::Adaptive`]: steps the acceptance estimates remember,
    /// 1..1e6 (the library default is 64).
    pub draft_len_memory: f64,
}

fn engine_params_default() -> sys::flashspec_engine_params {
    let mut p = std::mem::MaybeUninit::<sys::flashspec_engine_params>::zeroed();
    // SAFETY: init fills every field.
    unsafe {
        sys::flashspec_engine_params_init_sized(p.as_mut_ptr(), std::mem::size_of::<sys::flashspec_engine_params>());
        p.assume_init()
    }
}

impl Default for EngineOptions<'_> {
    fn default() -> Self {
        let p = engine_params_default();
        EngineOptions { rollback: None, keep: None, drafters: Vec::new(), arms: None, default_draft_len: p.default_draft_len, policy: Policy::Ucb1 { exploration: p.ucb_exploration }, target_step_cost: p.target_step_cost, target_row_cost: p.target_row_cost, max_context: p.max_context, draft_len_rule: DraftLenRule::from_raw(p.draft_len_rule), draft_len_memory: p.draft_len_memory }
    }
}

struct EngineState<'a> {
    forward: ForwardFn<'a>,
    rollback: Option<RollbackFn<'a>>,
    keep: Option<KeepFn<'a>>,
    hidden_size: usize,
    hidden: Vec<f32>, // read by the library until the step ends
    failure: Failure,
}

unsafe extern "C" fn forward_trampoline(user_data: *mut c_void, call: *mut sys::flashspec_target_call) -> c_int {
    // SAFETY: user_data is the engine's boxed state, alive while the engine is.
    let state = unsafe { &mut *(user_data as *mut EngineState<'_>) };
    let call = unsafe { &mut *call };
    let EngineState { forward, hidden_size, hidden, failure, .. } = state;
    guarded(failure, "target forward", || {
        let tokens = unsafe { std::slice::from_raw_parts(call.tokens, call.num_tokens.max(0) as usize) };
        // SAFETY: a tree step's parents has num_tokens entries.
        let parents = (!call.parents.is_null()).then(|| unsafe { std::slice::from_raw_parts(call.parents, tokens.len()) });
        let (num_past, num_rows) = (call.num_past.max(0) as usize, call.num_rows.max(0) as usize);
        let rows = match forward {
            ForwardFn::Chain(_) if parents.is_some() => {
                return Err("a tree step needs a forward that sees the parents (Context::tree_engine)".into());
            }
            ForwardFn::Chain(f) => f(tokens, num_past, num_rows)?,
            ForwardFn::Tree(f) => f(&TargetCall { tokens, parents, num_past, num_rows, step: call.step })?,
        };
        if rows.is_empty() || rows.len() % *hidden_size != 0 {
            return Err(format!("returned {} values, not whole rows of d = {hidden_size}", rows.len()).into());
        }
        *hidden = rows;
        call.hidden = tensor_of(hidden, hidden.len() / *hidden_size, *hidden_size);
        Ok(0)
    })
}

unsafe extern "C" fn rollback_trampoline(user_data: *mut c_void, num_keep: i32) -> c_int {
    // SAFETY: as forward_trampoline.
    let state = unsafe { &mut *(user_data as *mut EngineState<'_>) };
    let EngineState { rollback, failure, .. } = state;
    guarded(failure, "target rollback", || {
        (rollback.as_mut().expect("rollback trampoline without a rollback closure"))(num_keep.max(0) as usize)?;
        Ok(0)
    })
}

unsafe extern "C" fn keep_trampoline(user_data: *mut c_void, num_past: i32, keep: *const i32, num_keep: i32) -> c_int {
    // SAFETY: as forward_trampoline; keep holds num_keep indices.
    let state = unsafe { &mut *(user_data as *mut EngineState<'_>) };
    let indices = if num_keep > 0 { unsafe { std::slice::from_raw_parts(keep, num_keep as usize) } } else { &[] };
    let EngineState { keep, failure, .. } = state;
    guarded(failure, "target keep", || {
        (keep.as_mut().expect("keep trampoline without a keep closure"))(num_past.max(0) as usize, indices)?;
        Ok(0)
    })
}

struct TokenSink<'f> {
    on_token: &'f mut dyn FnMut(i32) -> bool,
    failure: Failure,
}

unsafe extern "C" fn token_trampoline(user_data: *mut c_void, token: i32) -> c_int {
    // SAFETY: user_data is the TokenSink on generate's stack.
    let sink = unsafe { &mut *(user_data as *mut TokenSink<'_>) };
    let TokenSink { on_token, failure } = sink;
    guarded(failure, "token callback", || Ok(if on_token(token) { 1 } else { 0 }))
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Not finished: a failure stopped it.
    None,
    Length,
    StopToken,
    HostStop,
    ContextFull,
    Cancelled,
}

impl FinishReason {
    pub(crate) fn from_raw(raw: sys::flashspec_finish_reason) -> FinishReason {
        match raw {
            sys::FLASHSPEC_FINISH_LENGTH => FinishReason::Length,
            sys::FLASHSPEC_FINISH_STOP_TOKEN => FinishReason::StopToken,
            sys::FLASHSPEC_FINISH_HOST_STOP => FinishReason::HostStop,
            sys::FLASHSPEC_FINISH_CONTEXT_FULL => FinishReason::ContextFull,
            sys::FLASHSPEC_FINISH_CANCELLED => FinishReason::Cancelled,
            _ => FinishReason::None,
        }
    }
}

/// Generation parameters; `Default` gives the library's (temperature 1,
/// 256 tokens, seed 0).
#[derive(Debug, Clone)]
pub struct GenerateOptions<'s> {
    /// Target temperature ≥ 0; 0 = greedy.
    pub temperature: f32,
    pub seed: u64,
    pub request_id: u64,
    pub max_tokens: i32,
    pub stop_tokens: &'s [i32],
}

impl Default for GenerateOptions<'_> {
    fn default() -> Self {
        let mut p = std::mem::MaybeUninit::<sys::flashspec_generate_params>::zeroed();
        // SAFETY: init fills every field.
        let p = unsafe {
            sys::flashspec_generate_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        GenerateOptions { temperature: p.temperature, seed: p.seed, request_id: p.request_id, max_tokens: p.max_tokens, stop_tokens: &[] }
    }
}

/// What a generation produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    pub tokens: Vec<i32>,
    pub finish_reason: FinishReason,
    /// Verify steps run.
    pub steps: i32,
}

/// A failed generation: the library's error, the tokens emitted before it,
/// and, when a callback failed, which one and its error (the `source`).
#[derive(Debug)]
pub struct GenerateError {
    pub error: Error,
    pub tokens: Vec<i32>,
    pub finish_reason: FinishReason,
    /// The failing callback ("target forward", "draft callback", ...) and its error.
    pub callback: Option<(&'static str, BoxError)>,
}

impl GenerateError {
    /// The flashspec_status.
    pub fn status(&self) -> sys::flashspec_status {
        self.error.status
    }
}

impl fmt::Display for GenerateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        if let Some((where_, e)) = &self.callback {
            write!(f, " ({where_}: {e})")?;
        }
        Ok(())
    }
}

impl std::error::Error for GenerateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.callback.as_ref().map(|(_, e)| &**e as &(dyn std::error::Error + 'static))
    }
}

impl From<GenerateError> for Error {
    fn from(e: GenerateError) -> Error {
        e.error
    }
}

/// Cancels the generation in progress of one engine from any thread; a
/// no-op once the engine is dropped.
#[derive(Clone)]
pub struct Canceller(Arc<Mutex<EnginePtr>>);

struct EnginePtr(*mut sys::flashspec_engine);
// SAFETY: only flashspec_engine_cancel ([thread-safe]) is called through it,
// under the mutex that Engine::drop takes before destroying the engine.
unsafe impl Send for EnginePtr {}

impl Canceller {
    /// Ask the generation in progress to stop before its next step.
    pub fn cancel(&self) {
        let guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        unsafe { sys::flashspec_engine_cancel(guard.0) };
    }
}

/// Statistics of one arm.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmMetrics {
    /// The arm's drafter index, `None` for a k = 0 arm.
    pub drafter: Option<usize>,
    pub draft_len: i32,
    pub pulls: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    pub mean_reward: f64,
    pub mean_cost: f64,
}

/// Totals since creation or [`Engine::reset_metrics`], per position and per arm:
/// `position_drafted[j]` steps drafted at least j + 1 tokens,
/// `position_accepted[j]` accepted at least j + 1.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineMetrics {
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
    pub position_drafted: Vec<u64>,
    pub position_accepted: Vec<u64>,
    pub arms: Vec<ArmMetrics>,
}

/// Zeroed metrics with struct_size set, for a get_metrics call to fill.
pub(crate) fn metrics_init() -> sys::flashspec_engine_metrics {
    let mut m = std::mem::MaybeUninit::<sys::flashspec_engine_metrics>::zeroed();
    // SAFETY: init fills every field.
    unsafe {
        sys::flashspec_engine_metrics_init(m.as_mut_ptr());
        m.assume_init()
    }
}

/// The statistics of arms 0..num_arms, each read by `get(arm, out)`.
pub(crate) fn arm_metrics(num_arms: i32, mut get: impl FnMut(i32, &mut sys::flashspec_arm_metrics) -> Result<()>) -> Result<Vec<ArmMetrics>> {
    (0..num_arms.max(0))
        .map(|i| {
            let mut a = std::mem::MaybeUninit::<sys::flashspec_arm_metrics>::zeroed();
            let mut a = unsafe {
                sys::flashspec_arm_metrics_init(a.as_mut_ptr());
                a.assume_init()
            };
            get(i, &mut a)?;
            Ok(ArmMetrics { drafter: usize::try_from(a.drafter).ok(), draft_len: a.draft_len, pulls: a.pulls, draft_tokens: a.draft_tokens, accepted_tokens: a.accepted_tokens, mean_reward: a.mean_reward, mean_cost: a.mean_cost })
        })
        .collect()
}

impl EngineMetrics {
    pub(crate) fn from_raw(m: &sys::flashspec_engine_metrics, position_drafted: Vec<u64>, position_accepted: Vec<u64>, arms: Vec<ArmMetrics>) -> EngineMetrics {
        EngineMetrics { steps: m.steps, drafts: m.drafts, draft_tokens: m.draft_tokens, accepted_tokens: m.accepted_tokens, emitted_tokens: m.emitted_tokens, acceptance_rate: m.acceptance_rate, mean_accepted_length: m.mean_accepted_length, tokens_per_step: m.tokens_per_step, step_latency_p50_us: m.step_latency_p50_us, step_latency_p99_us: m.step_latency_p99_us, position_drafted, position_accepted, arms }
    }

    /// The acceptance rate at each draft position.
    pub fn position_acceptance(&self) -> Vec<f64> {
        self.position_drafted.iter().zip(&self.position_accepted).map(|(&d, &a)| if d > 0 { a as f64 / d as f64 } else { 0.0 }).collect()
    }
}

/// Speculative decoding of one sequence at a time. Owns its drafters and
/// borrows its context and target LM head. Not `Send` (it borrows a
/// `!Sync` context); cancel from other threads with [`Engine::canceller`].
pub struct Engine<'a> {
    raw: *mut sys::flashspec_engine,
    ctx: &'a Context,
    state: Box<EngineState<'a>>,
    cancel: Arc<Mutex<EnginePtr>>,
    drafters: Vec<Drafter<'a>>,
    _head: PhantomData<&'a LmHead<'a>>,
    _not_sync: PhantomData<Cell<()>>,
}

impl Drop for Engine<'_> {
    fn drop(&mut self) {
        let mut guard = self.cancel.lock().unwrap_or_else(|e| e.into_inner());
        guard.0 = ptr::null_mut();
        unsafe { sys::flashspec_engine_destroy(self.raw) };
        // The drafters drop after this, once the engine has released them.
    }
}

impl<'a> Engine<'a> {
    fn new(ctx: &'a Context, head: &'a LmHead<'_>, forward: ForwardFn<'a>, options: EngineOptions<'a>) -> Result<Engine<'a>> {
        let EngineOptions { rollback, keep, drafters, arms, default_draft_len, policy, target_step_cost, target_row_cost, max_context, draft_len_rule, draft_len_memory } = options;
        let has_rollback = rollback.is_some();
        let has_keep = keep.is_some();
        let mut state = Box::new(EngineState { forward, rollback, keep, hidden_size: head.hidden, hidden: Vec::new(), failure: Failure::default() });
        let mut p = engine_params_default();
        p.target_forward = Some(forward_trampoline);
        p.target_rollback = if has_rollback { Some(rollback_trampoline) } else { None };
        p.target_keep = if has_keep { Some(keep_trampoline) } else { None };
        p.target_user_data = (&mut *state as *mut EngineState<'a>).cast();
        let raws: Vec<*mut sys::flashspec_drafter> = drafters.iter().map(|d| d.raw).collect();
        p.drafters = if raws.is_empty() { ptr::null() } else { raws.as_ptr() };
        p.num_drafters = raws.len() as i32;
        let arm_table = arm_table(arms.as_deref());
        if let Some(table) = &arm_table {
            p.arms = if table.is_empty() { ptr::null() } else { table.as_ptr() };
            p.num_arms = table.len() as i32;
        }
        p.default_draft_len = default_draft_len;
        // One reward per arm: the arms given, or one per drafter (at least one).
        let _oracle = set_policy!(p, policy, arm_table.as_ref().map_or(raws.len().max(1), |t| t.len()));
        p.target_step_cost = target_step_cost;
        p.target_row_cost = target_row_cost;
        p.max_context = max_context;
        p.draft_len_rule = draft_len_rule.raw();
        p.draft_len_memory = draft_len_memory;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::flashspec_engine_create(ctx.raw, head.raw, &p, &mut raw) }, ctx.raw)?;
        Ok(Engine { raw, ctx, state, cancel: Arc::new(Mutex::new(EnginePtr(raw))), drafters, _head: PhantomData, _not_sync: PhantomData })
    }

    /// A handle that cancels this engine's generation from any thread.
    pub fn canceller(&self) -> Canceller {
        Canceller(self.cancel.clone())
    }

    /// Ask the generation in progress to stop (from a callback, through a
    /// clone of [`Engine::canceller`] moved into it).
    pub fn cancel(&self) {
        unsafe { sys::flashspec_engine_cancel(self.raw) };
    }

    /// Generate up to `options.max_tokens` tokens after `prompt`. At
    /// temperature 0 the tokens are the target's greedy tokens whatever the
    /// drafters propose.
    pub fn generate(&mut self, prompt: &[i32], options: &GenerateOptions<'_>) -> std::result::Result<Generation, GenerateError> {
        self.run(prompt, options, None)
    }

    /// As [`Engine::generate`], calling `on_token` with each token as it is
    /// emitted; returning `true` stops the generation after that token
    /// ([`FinishReason::HostStop`]).
    pub fn generate_streaming(&mut self, prompt: &[i32], options: &GenerateOptions<'_>, mut on_token: impl FnMut(i32) -> bool) -> std::result::Result<Generation, GenerateError> {
        self.run(prompt, options, Some(&mut on_token))
    }

    fn run(&mut self, prompt: &[i32], options: &GenerateOptions<'_>, on_token: Option<&mut dyn FnMut(i32) -> bool>) -> std::result::Result<Generation, GenerateError> {
        let mut p = std::mem::MaybeUninit::<sys::flashspec_generate_params>::zeroed();
        let mut p = unsafe {
            sys::flashspec_generate_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        p.temperature = options.temperature;
        p.seed = options.seed;
        p.request_id = options.request_id;
        p.max_tokens = options.max_tokens;
        p.stop_tokens = if options.stop_tokens.is_empty() { ptr::null() } else { options.stop_tokens.as_ptr() };
        p.num_stop_tokens = options.stop_tokens.len() as i32;
        let mut sink = on_token.map(|f| TokenSink { on_token: f, failure: Failure::default() });
        if let Some(sink) = sink.as_mut() {
            p.on_token = Some(token_trampoline);
            p.on_token_user_data = (sink as *mut TokenSink<'_>).cast();
        }
        let capacity = options.max_tokens.max(0);
        let mut tokens = vec![0i32; capacity as usize];
        let mut result = std::mem::MaybeUninit::<sys::flashspec_generate_result>::zeroed();
        let mut result = unsafe {
            sys::flashspec_generate_result_init(result.as_mut_ptr());
            result.assume_init()
        };
        self.state.failure = Failure::default();
        for d in &mut self.drafters {
            d.take_failure();
        }
        let status = unsafe { sys::flashspec_engine_generate(self.raw, if prompt.is_empty() { ptr::null() } else { prompt.as_ptr() }, prompt.len().min(i32::MAX as usize) as i32, &p, if capacity > 0 { tokens.as_mut_ptr() } else { ptr::null_mut() }, capacity, &mut result) };
        let outcome = check(status, self.ctx.raw);
        tokens.truncate(result.num_tokens.max(0) as usize);
        let finish_reason = FinishReason::from_raw(result.finish_reason);
        let mut callback = self.state.failure.0.take();
        for d in &mut self.drafters {
            if callback.is_none() {
                callback = d.take_failure();
            }
        }
        if callback.is_none() {
            callback = sink.as_mut().and_then(|s| s.failure.0.take());
        }
        match (outcome, callback) {
            (Ok(()), None) => Ok(Generation { tokens, finish_reason, steps: result.steps }),
            (Ok(()), Some(cb)) => {
                // on_token can only ask to stop: its failure is reported here.
                let error = Error { status: sys::FLASHSPEC_ERR_CALLBACK, message: format!("{}: reported failure", cb.0) };
                Err(GenerateError { error, tokens, finish_reason, callback: Some(cb) })
            }
            (Err(error), callback) => Err(GenerateError { error, tokens, finish_reason, callback }),
        }
    }

    /// A snapshot of the metrics.
    pub fn metrics(&self) -> Result<EngineMetrics> {
        let mut m = metrics_init();
        check(unsafe { sys::flashspec_engine_get_metrics(self.raw, &mut m) }, self.ctx.raw)?;
        let n = m.num_positions.max(0) as usize;
        let (mut drafted, mut accepted) = (vec![0u64; n.max(1)], vec![0u64; n.max(1)]);
        check(unsafe { sys::flashspec_engine_get_position_metrics(self.raw, n as i32, drafted.as_mut_ptr(), accepted.as_mut_ptr(), ptr::null_mut()) }, self.ctx.raw)?;
        drafted.truncate(n);
        accepted.truncate(n);
        let arms = arm_metrics(m.num_arms, |i, a| check(unsafe { sys::flashspec_engine_get_arm_metrics(self.raw, i, a) }, self.ctx.raw))?;
        Ok(EngineMetrics::from_raw(&m, drafted, accepted, arms))
    }

    /// Zero the metrics (the policy keeps what it learned).
    pub fn reset_metrics(&mut self) -> Result<()> {
        check(unsafe { sys::flashspec_engine_reset_metrics(self.raw) }, self.ctx.raw)
    }
}
