//! The batched engine: many sequences in one engine, the way a server's
//! parallel slots share one model (the batched engine section of
//! flashspec.h). Each [`BatchEngine::step`] runs ONE target forward over
//! every active sequence (a ragged [`BatchForward`]) and ONE verify pass.
//!
//! Closures sit behind the same `extern "C"` trampolines as [`Engine`]'s
//! (an `Err` or a panic never unwinds into C), and what ends follows the C
//! API's rule:
//! - the target forward failing fails the whole step: [`BatchEngine::step`]
//!   returns a [`StepError`] whose `source` is the closure's error, no
//!   sequence emits a token in that step, and a later step repeats it;
//! - a sequence's own drafter or the target rollback of that sequence
//!   failing ends that sequence alone (the library's CALLBACK status);
//! - a sequence's `on_token` panicking also ends that sequence alone, after
//!   the token it was given: the library sees a host stop, and the binding
//!   reports the sequence as failed with CALLBACK and the panic.
//!
//! [`Engine`]: crate::Engine
use std::cell::Cell;
use std::collections::HashMap;
use std::error::Error as StdError;
use std::ffi::{c_int, c_void, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;

use crate::engine::{arm_metrics, arm_table, guarded, metrics_init, set_policy, tensor_of, Failure};
use crate::{check, sys, Arm, BoxError, CallbackResult, Context, DraftLenRule, Drafter, EngineMetrics, Error, FinishReason, GenerateOptions, LmHead, Policy, Result};

/// One ragged target forward (flashspec_batch_target_call). Sequence `s`
/// (in the order the sequences joined) is `sequence_ids[s]`: drop its
/// cached tokens beyond `num_past[s]` (0: a new sequence), append
/// [`tokens_of(s)`](BatchForward::tokens_of), and give the hidden rows of
/// its last [`rows_of(s)`](BatchForward::rows_of) tokens; they go at rows
/// `row_offsets[s] .. row_offsets[s + 1]` of the `[num_rows, d]` values the
/// closure returns.
#[derive(Debug, Clone, Copy)]
pub struct BatchForward<'c> {
    pub sequence_ids: &'c [u64],
    pub num_past: &'c [i32],
    /// `[S + 1]`, starting at 0.
    pub token_offsets: &'c [i32],
    pub tokens: &'c [i32],
    /// `[S + 1]`, starting at 0; each sequence has at least one row.
    pub row_offsets: &'c [i32],
    /// The batched engine's step count.
    pub step: u64,
    /// `None` unless a sequence of this step drafted a tree; then
    /// `[num_tokens]`, per sequence those of [`TargetCall`](crate::TargetCall)
    /// for its own tokens (indices from its first token; a chain's all -1).
    /// Run the tree steps with tree attention (flashspec.h, Tree steps).
    pub parents: Option<&'c [i32]>,
}

impl BatchForward<'_> {
    /// The sequences in this forward.
    pub fn num_sequences(&self) -> usize {
        self.sequence_ids.len()
    }

    /// The tokens sequence `s` appends.
    pub fn tokens_of(&self, s: usize) -> &[i32] {
        &self.tokens[self.token_offsets[s] as usize..self.token_offsets[s + 1] as usize]
    }

    /// Sequence `s`'s parents (see `parents`), indices into [`tokens_of(s)`](BatchForward::tokens_of).
    pub fn parents_of(&self, s: usize) -> Option<&[i32]> {
        self.parents.map(|p| &p[self.token_offsets[s] as usize..self.token_offsets[s + 1] as usize])
    }

    /// The hidden rows sequence `s` wants.
    pub fn rows_of(&self, s: usize) -> usize {
        (self.row_offsets[s + 1] - self.row_offsets[s]) as usize
    }

    /// The rows of every sequence together.
    pub fn num_rows(&self) -> usize {
        self.row_offsets.last().copied().unwrap_or(0) as usize
    }
}

type BatchForwardFn<'a> = Box<dyn FnMut(&BatchForward<'_>) -> CallbackResult<Vec<f32>> + 'a>;
type BatchRollbackFn<'a> = Box<dyn FnMut(u64, usize) -> CallbackResult<()> + 'a>;
type BatchKeepFn<'a> = Box<dyn FnMut(u64, usize, &[i32]) -> CallbackResult<()> + 'a>;
type SequenceTokenFn<'a> = Box<dyn FnMut(i32) -> bool + 'a>;

/// Batched engine parameters; `Default` gives the library's defaults.
/// Arms, policy, costs, `max_context` and the draft length rule mean what
/// they mean in [`EngineOptions`](crate::EngineOptions), applied to each
/// sequence: every sequence runs its own bandit and acceptance estimates.
pub struct BatchEngineOptions<'a> {
    /// Truncate sequence `sequence_id`'s KV cache to its first `num_keep`
    /// tokens (optional); its failure ends that sequence.
    pub rollback: Option<BatchRollbackFn<'a>>,
    /// After a tree step of sequence `sequence_id`, `keep(sequence_id,
    /// num_past, keep)` as [`EngineOptions::keep`](crate::EngineOptions)
    /// (indices into its tokens of the last forward; optional); its
    /// failure ends that sequence.
    pub keep: Option<BatchKeepFn<'a>>,
    /// Drafters each sequence brings (`add_sequence`'s `drafters`).
    pub num_drafters: usize,
    /// `None`: one arm per drafter of length `default_draft_len`; an arm's
    /// drafter indexes each sequence's drafters.
    pub arms: Option<Vec<Arm>>,
    pub default_draft_len: i32,
    pub policy: Policy,
    pub target_step_cost: f64,
    pub target_row_cost: f64,
    /// Most tokens a sequence's cache holds; 0 = unlimited.
    pub max_context: i32,
    /// Most sequences at once; 0: as many as the context's workspace holds.
    pub max_sequences: i32,
    pub draft_len_rule: DraftLenRule,
    pub draft_len_memory: f64,
}

fn batch_params_default() -> sys::flashspec_batch_engine_params {
    let mut p = std::mem::MaybeUninit::<sys::flashspec_batch_engine_params>::zeroed();
    // SAFETY: init fills every field.
    unsafe {
        sys::flashspec_batch_engine_params_init(p.as_mut_ptr());
        p.assume_init()
    }
}

impl Default for BatchEngineOptions<'_> {
    fn default() -> Self {
        let p = batch_params_default();
        BatchEngineOptions {
            rollback: None,
            keep: None,
            num_drafters: p.num_drafters.max(0) as usize,
            arms: None,
            default_draft_len: p.default_draft_len,
            policy: Policy::Ucb1 { exploration: p.ucb_exploration },
            target_step_cost: p.target_step_cost,
            target_row_cost: p.target_row_cost,
            max_context: p.max_context,
            max_sequences: p.max_sequences,
            draft_len_rule: DraftLenRule::from_raw(p.draft_len_rule),
            draft_len_memory: p.draft_len_memory,
        }
    }
}

struct BatchState<'a> {
    forward: BatchForwardFn<'a>,
    rollback: Option<BatchRollbackFn<'a>>,
    keep: Option<BatchKeepFn<'a>>,
    hidden_size: usize,
    hidden: Vec<f32>, // read by the library until the step ends
    failure: Failure,
    /// Rollback and keep failures, each of which ends its sequence.
    rollback_failures: Vec<(u64, &'static str, BoxError)>,
}

unsafe extern "C" fn batch_forward_trampoline(user_data: *mut c_void, call: *mut sys::flashspec_batch_target_call) -> c_int {
    // SAFETY: user_data is the engine's boxed state, alive while the engine is.
    let state = unsafe { &mut *(user_data as *mut BatchState<'_>) };
    let call = unsafe { &mut *call };
    let BatchState { forward, hidden_size, hidden, failure, .. } = state;
    guarded(failure, "target forward", || {
        let s = call.num_sequences.max(0) as usize;
        // SAFETY: the library passes arrays of the lengths flashspec_batch_target_call documents.
        let view = unsafe {
            BatchForward {
                sequence_ids: std::slice::from_raw_parts(call.sequence_ids, s),
                num_past: std::slice::from_raw_parts(call.num_past, s),
                token_offsets: std::slice::from_raw_parts(call.token_offsets, s + 1),
                tokens: std::slice::from_raw_parts(call.tokens, call.num_tokens.max(0) as usize),
                row_offsets: std::slice::from_raw_parts(call.row_offsets, s + 1),
                step: call.step,
                parents: (!call.parents.is_null()).then(|| std::slice::from_raw_parts(call.parents, call.num_tokens.max(0) as usize)),
            }
        };
        let rows = forward(&view)?;
        let expected = view.num_rows() * *hidden_size;
        if rows.len() != expected {
            return Err(format!("returned {} values, not num_rows × d = {} × {hidden_size}", rows.len(), view.num_rows()).into());
        }
        *hidden = rows;
        call.hidden = tensor_of(hidden, view.num_rows(), *hidden_size);
        Ok(0)
    })
}

unsafe extern "C" fn batch_rollback_trampoline(user_data: *mut c_void, sequence_id: u64, num_keep: i32) -> c_int {
    // SAFETY: as batch_forward_trampoline.
    let state = unsafe { &mut *(user_data as *mut BatchState<'_>) };
    let mut failure = Failure::default();
    let rollback = state.rollback.as_mut().expect("rollback trampoline without a rollback closure");
    let rc = guarded(&mut failure, "target rollback", || {
        rollback(sequence_id, num_keep.max(0) as usize)?;
        Ok(0)
    });
    if let Some((_, e)) = failure.0 {
        state.rollback_failures.push((sequence_id, "target rollback", e));
    }
    rc
}

unsafe extern "C" fn batch_keep_trampoline(user_data: *mut c_void, sequence_id: u64, num_past: i32, keep: *const i32, num_keep: i32) -> c_int {
    // SAFETY: as batch_forward_trampoline; keep holds num_keep indices.
    let state = unsafe { &mut *(user_data as *mut BatchState<'_>) };
    let indices = if num_keep > 0 { unsafe { std::slice::from_raw_parts(keep, num_keep as usize) } } else { &[] };
    let mut failure = Failure::default();
    let keep = state.keep.as_mut().expect("keep trampoline without a keep closure");
    let rc = guarded(&mut failure, "target keep", || {
        keep(sequence_id, num_past.max(0) as usize, indices)?;
        Ok(0)
    });
    if let Some((_, e)) = failure.0 {
        state.rollback_failures.push((sequence_id, "target keep", e));
    }
    rc
}

struct SequenceSink<'a> {
    on_token: Option<SequenceTokenFn<'a>>,
    failure: Failure,
}

unsafe extern "C" fn sequence_token_trampoline(user_data: *mut c_void, _sequence_id: u64, token: i32) -> c_int {
    // SAFETY: user_data is the sequence's boxed sink, alive while the sequence is in the engine.
    let sink = unsafe { &mut *(user_data as *mut SequenceSink<'_>) };
    let SequenceSink { on_token, failure } = sink;
    let f = on_token.as_mut().expect("token trampoline without a closure");
    guarded(failure, "token callback", || Ok(if f(token) { 1 } else { 0 }))
}

/// A callback's error, shared so that every [`BatchEngine::sequence`]
/// call can report it.
pub type SharedError = Arc<dyn StdError + Send + Sync + 'static>;

/// What the binding holds for one sequence while it is in the engine.
struct Sequence<'a> {
    drafters: Vec<Drafter<'a>>,
    /// The handle array the library was given.
    _raws: Vec<*mut sys::flashspec_drafter>,
    sink: Box<SequenceSink<'a>>,
    /// The first failure of its drafters, rollback or on_token.
    callback: Option<(&'static str, SharedError)>,
}

impl Sequence<'_> {
    fn note(&mut self, failure: Option<(&'static str, BoxError)>) {
        if let (None, Some((where_, e))) = (&self.callback, failure) {
            self.callback = Some((where_, Arc::from(e)));
        }
    }
}

/// The error that ended a sequence: the library's status and message and,
/// when one of its callbacks failed, which one and its error (the `source`).
#[derive(Debug, Clone)]
pub struct SequenceError {
    pub error: Error,
    pub callback: Option<(&'static str, SharedError)>,
}

impl fmt::Display for SequenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        if let Some((where_, e)) = &self.callback {
            write!(f, " ({where_}: {e})")?;
        }
        Ok(())
    }
}

impl StdError for SequenceError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.callback.as_ref().map(|(_, e)| &**e as &(dyn StdError + 'static))
    }
}

/// Where a sequence stands.
#[derive(Debug, Clone)]
pub struct SequenceState {
    /// The tokens emitted so far.
    pub tokens: Vec<i32>,
    /// Whether steps still run it.
    pub active: bool,
    /// [`FinishReason::None`] while active or after an error.
    pub finish_reason: FinishReason,
    /// Verify steps it took part in.
    pub steps: i32,
    /// The error that ended it, if one did.
    pub error: Option<SequenceError>,
}

/// A failed step: the library's error and, when the target forward
/// failed, its error (the `source`). No sequence emitted a token in it.
#[derive(Debug)]
pub struct StepError {
    pub error: Error,
    pub callback: Option<(&'static str, BoxError)>,
}

impl StepError {
    /// The flashspec_status.
    pub fn status(&self) -> sys::flashspec_status {
        self.error.status
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        if let Some((where_, e)) = &self.callback {
            write!(f, " ({where_}: {e})")?;
        }
        Ok(())
    }
}

impl StdError for StepError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.callback.as_ref().map(|(_, e)| &**e as &(dyn StdError + 'static))
    }
}

impl From<StepError> for Error {
    fn from(e: StepError) -> Error {
        e.error
    }
}

impl Context {
    /// A batched engine whose target model has LM head `head` and runs as
    /// `forward(&call)`: for each sequence of the ragged [`BatchForward`],
    /// truncate its cache to `num_past`, append its tokens, and return the
    /// hidden rows of every sequence, exactly `[call.num_rows(), d]`
    /// row-major. The context must use the CPU backend.
    pub fn batch_engine<'a>(&'a self, head: &'a LmHead<'_>, forward: impl FnMut(&BatchForward<'_>) -> CallbackResult<Vec<f32>> + 'a, options: BatchEngineOptions<'a>) -> Result<BatchEngine<'a>> {
        BatchEngine::new(self, head, Box::new(forward), options)
    }
}

/// Speculative decoding of many sequences at once. Borrows its context and
/// target LM head; owns each sequence's drafters while the sequence is in
/// it ([`BatchEngine::remove_sequence`] hands them back). A sequence emits
/// exactly what [`Engine::generate`](crate::Engine::generate) on a fresh
/// engine with the same options, drafters and prompt emits, at any
/// temperature. Not `Send` or `Sync`.
pub struct BatchEngine<'a> {
    raw: *mut sys::flashspec_batch_engine,
    ctx: &'a Context,
    state: Box<BatchState<'a>>,
    num_drafters: usize,
    sequences: HashMap<u64, Sequence<'a>>,
    order: Vec<u64>,
    _head: PhantomData<&'a LmHead<'a>>,
    _not_sync: PhantomData<Cell<()>>,
}

impl Drop for BatchEngine<'_> {
    fn drop(&mut self) {
        unsafe { sys::flashspec_batch_engine_destroy(self.raw) };
        // The sequences' drafters and sinks drop after this, once released.
    }
}

impl<'a> BatchEngine<'a> {
    fn new(ctx: &'a Context, head: &'a LmHead<'_>, forward: BatchForwardFn<'a>, options: BatchEngineOptions<'a>) -> Result<BatchEngine<'a>> {
        let BatchEngineOptions { rollback, keep, num_drafters, arms, default_draft_len, policy, target_step_cost, target_row_cost, max_context, max_sequences, draft_len_rule, draft_len_memory } = options;
        let has_rollback = rollback.is_some();
        let has_keep = keep.is_some();
        let mut state = Box::new(BatchState { forward, rollback, keep, hidden_size: head.hidden, hidden: Vec::new(), failure: Failure::default(), rollback_failures: Vec::new() });
        let mut p = batch_params_default();
        p.target_forward = Some(batch_forward_trampoline);
        p.target_rollback = if has_rollback { Some(batch_rollback_trampoline) } else { None };
        p.target_keep = if has_keep { Some(batch_keep_trampoline) } else { None };
        p.target_user_data = (&mut *state as *mut BatchState<'a>).cast();
        p.num_drafters = i32::try_from(num_drafters).unwrap_or(i32::MAX);
        let arm_table = arm_table(arms.as_deref());
        if let Some(table) = &arm_table {
            p.arms = if table.is_empty() { ptr::null() } else { table.as_ptr() };
            p.num_arms = table.len() as i32;
        }
        p.default_draft_len = default_draft_len;
        // One reward per arm: the arms given, or one per drafter (at least one).
        let _oracle = set_policy!(p, policy, arm_table.as_ref().map_or(num_drafters.max(1), |t| t.len()));
        p.target_step_cost = target_step_cost;
        p.target_row_cost = target_row_cost;
        p.max_context = max_context;
        p.max_sequences = max_sequences;
        p.draft_len_rule = draft_len_rule.raw();
        p.draft_len_memory = draft_len_memory;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::flashspec_batch_engine_create(ctx.raw, head.raw, &p, &mut raw) }, ctx.raw)?;
        Ok(BatchEngine { raw, ctx, state, num_drafters, sequences: HashMap::new(), order: Vec::new(), _head: PhantomData, _not_sync: PhantomData })
    }

    /// Add a sequence with its own `drafters` (as many as the engine's
    /// `num_drafters`), which the engine owns until the sequence is
    /// removed; it joins at the next step. `options` are those of a single
    /// generation. Errors (the engine unchanged, the drafters dropped):
    /// the library's, e.g. INVALID_ARGUMENT for an id already in the
    /// engine, OUT_OF_RANGE for an empty prompt or a token id outside
    /// `[0, V)`, WORKSPACE_EXCEEDED when `max_sequences` are in it.
    pub fn add_sequence(&mut self, sequence_id: u64, prompt: &[i32], drafters: Vec<Drafter<'a>>, options: &GenerateOptions<'_>) -> Result<()> {
        self.add(sequence_id, prompt, drafters, options, None)
    }

    /// As [`BatchEngine::add_sequence`], calling `on_token` with each token
    /// of this sequence as it is emitted; returning `true` finishes the
    /// sequence after that token ([`FinishReason::HostStop`]).
    pub fn add_sequence_streaming(&mut self, sequence_id: u64, prompt: &[i32], drafters: Vec<Drafter<'a>>, options: &GenerateOptions<'_>, on_token: impl FnMut(i32) -> bool + 'a) -> Result<()> {
        self.add(sequence_id, prompt, drafters, options, Some(Box::new(on_token)))
    }

    fn add(&mut self, sequence_id: u64, prompt: &[i32], drafters: Vec<Drafter<'a>>, options: &GenerateOptions<'_>, on_token: Option<SequenceTokenFn<'a>>) -> Result<()> {
        let prompt_len = i32::try_from(prompt.len()).map_err(|_| crate::out_of_range(format!("prompt: {} tokens do not fit an int32_t", prompt.len())))?;
        let mut p = std::mem::MaybeUninit::<sys::flashspec_sequence_params>::zeroed();
        let mut p = unsafe {
            sys::flashspec_sequence_params_init(p.as_mut_ptr());
            p.assume_init()
        };
        let raws: Vec<*mut sys::flashspec_drafter> = drafters.iter().map(|d| d.raw).collect();
        p.drafters = if raws.is_empty() { ptr::null() } else { raws.as_ptr() };
        p.num_drafters = raws.len() as i32;
        p.temperature = options.temperature;
        p.seed = options.seed;
        p.request_id = options.request_id;
        p.max_tokens = options.max_tokens;
        p.stop_tokens = if options.stop_tokens.is_empty() { ptr::null() } else { options.stop_tokens.as_ptr() };
        p.num_stop_tokens = options.stop_tokens.len() as i32;
        let has_on_token = on_token.is_some();
        let mut sink = Box::new(SequenceSink { on_token, failure: Failure::default() });
        if has_on_token {
            p.on_token = Some(sequence_token_trampoline);
            p.on_token_user_data = (&mut *sink as *mut SequenceSink<'a>).cast();
        }
        // An empty prompt passes its (non-null, unread) pointer, so the
        // library refuses it as OUT_OF_RANGE prompt_len, not as a NULL.
        let status = unsafe { sys::flashspec_batch_engine_add_sequence(self.raw, sequence_id, prompt.as_ptr(), prompt_len, &p) };
        check(status, self.ctx.raw)?;
        self.sequences.insert(sequence_id, Sequence { drafters, _raws: raws, sink, callback: None });
        self.order.push(sequence_id);
        Ok(())
    }

    /// Remove a sequence, active (cancelling it) or finished, and hand back
    /// its drafters (a suffix drafter keeps its cache of earlier outputs
    /// for the next sequence); its tokens, state and metrics go with it.
    /// Errors: OUT_OF_RANGE (not in the engine).
    pub fn remove_sequence(&mut self, sequence_id: u64) -> Result<Vec<Drafter<'a>>> {
        check(unsafe { sys::flashspec_batch_engine_remove_sequence(self.raw, sequence_id) }, self.ctx.raw)?;
        self.order.retain(|&id| id != sequence_id);
        Ok(self.sequences.remove(&sequence_id).map(|s| s.drafters).unwrap_or_default())
    }

    /// The sequences in the engine, in the order they joined.
    pub fn sequence_ids(&self) -> &[u64] {
        &self.order
    }

    /// The drafters each sequence brings.
    pub fn num_drafters(&self) -> usize {
        self.num_drafters
    }

    /// One step for every active sequence; returns how many are still
    /// active (0: nothing to do). Errors of one sequence end that sequence
    /// and show in [`BatchEngine::sequence`], not here.
    pub fn step(&mut self) -> std::result::Result<usize, StepError> {
        self.state.failure = Failure::default();
        self.state.rollback_failures.clear();
        let mut active = 0i32;
        let status = unsafe { sys::flashspec_batch_engine_step(self.raw, &mut active) };
        let outcome = check(status, self.ctx.raw);
        for (id, name, e) in std::mem::take(&mut self.state.rollback_failures) {
            if let Some(seq) = self.sequences.get_mut(&id) {
                seq.note(Some((name, e)));
            }
        }
        for seq in self.sequences.values_mut() {
            let failures: Vec<_> = seq.drafters.iter_mut().filter_map(|d| d.take_failure()).collect();
            for f in failures {
                seq.note(Some(f));
            }
            let token_failure = seq.sink.failure.0.take();
            seq.note(token_failure);
        }
        match outcome {
            Ok(()) => Ok(active.max(0) as usize),
            Err(error) => Err(StepError { error, callback: self.state.failure.0.take() }),
        }
    }

    /// Steps until no sequence is active.
    pub fn run(&mut self) -> std::result::Result<(), StepError> {
        while self.step()? > 0 {}
        Ok(())
    }

    /// Where sequence `sequence_id` stands. Errors: OUT_OF_RANGE (not in the engine).
    pub fn sequence(&self, sequence_id: u64) -> Result<SequenceState> {
        let mut info = std::mem::MaybeUninit::<sys::flashspec_sequence_info>::zeroed();
        let mut info = unsafe {
            sys::flashspec_sequence_info_init(info.as_mut_ptr());
            info.assume_init()
        };
        check(unsafe { sys::flashspec_batch_engine_get_sequence(self.raw, sequence_id, ptr::null_mut(), 0, &mut info) }, self.ctx.raw)?;
        let mut tokens = vec![0i32; info.num_tokens.max(0) as usize];
        if !tokens.is_empty() {
            check(unsafe { sys::flashspec_batch_engine_get_sequence(self.raw, sequence_id, tokens.as_mut_ptr(), tokens.len() as i32, ptr::null_mut()) }, self.ctx.raw)?;
        }
        let callback = self.sequences.get(&sequence_id).and_then(|s| s.callback.clone());
        let mut finish_reason = FinishReason::from_raw(info.finish_reason);
        let error = if info.status != sys::FLASHSPEC_OK {
            let text = unsafe { sys::flashspec_batch_engine_sequence_error(self.raw, sequence_id) };
            let message = if text.is_null() { String::new() } else { unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned() };
            Some(SequenceError { error: Error { status: info.status, message }, callback })
        } else if let Some(cb) = callback {
            // on_token can only ask to stop: its failure is reported here.
            finish_reason = FinishReason::None;
            Some(SequenceError { error: Error { status: sys::FLASHSPEC_ERR_CALLBACK, message: format!("{}: reported failure", cb.0) }, callback: Some(cb) })
        } else {
            None
        };
        Ok(SequenceState { tokens, active: info.active != 0, finish_reason, steps: info.steps, error })
    }

    /// Totals over every sequence since the engine was created, arms summed
    /// over every sequence; the batched engine keeps no per-position counts
    /// (`position_drafted` and `position_accepted` are empty).
    pub fn metrics(&self) -> Result<EngineMetrics> {
        let mut m = metrics_init();
        check(unsafe { sys::flashspec_batch_engine_get_metrics(self.raw, &mut m) }, self.ctx.raw)?;
        let arms = arm_metrics(m.num_arms, |i, a| check(unsafe { sys::flashspec_batch_engine_get_arm_metrics(self.raw, i, a) }, self.ctx.raw))?;
        Ok(EngineMetrics::from_raw(&m, Vec::new(), Vec::new(), arms))
    }

    /// The metrics of sequence `sequence_id` alone (no arms: the library
    /// keeps them summed). Errors: OUT_OF_RANGE (not in the engine).
    pub fn sequence_metrics(&self, sequence_id: u64) -> Result<EngineMetrics> {
        let mut m = metrics_init();
        check(unsafe { sys::flashspec_batch_engine_get_sequence_metrics(self.raw, sequence_id, &mut m) }, self.ctx.raw)?;
        Ok(EngineMetrics::from_raw(&m, Vec::new(), Vec::new(), Vec::new()))
    }
}
