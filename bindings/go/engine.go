package flashspec

// The speculative engine: drafters (n-gram, Go callbacks), arms chosen by a
// bandit policy, the host's target model as Go functions, generation with
// streaming, cancellation and metrics. The engine runs on a CPU context.
//
// Callbacks reach Go through the //export trampolines of
// engine_callbacks.go with a runtime/cgo.Handle as user_data. What a
// callback hands back (hidden rows, draft tokens, draft logits) is copied
// into C buffers the engine or drafter owns, since C may not keep Go
// pointers. A callback's error or panic makes Generate fail with a
// *CallbackError (errors.Is(err, ErrCallback) holds, errors.Unwrap gives
// the callback's error); the engine stays usable.
//
// Callbacks run on the goroutine that called Generate while it holds the
// Context: they must not call methods of that Context or Close the engine
// (use another Context; Cancel is allowed).

// #include <stdint.h>
// #cgo pkg-config: flashspec
// #include <stdlib.h>
// #include "flashspec.h"
// extern int flashspecGoTargetForward(void*, flashspec_target_call*);
// extern int flashspecGoTargetRollback(void*, int32_t);
// extern int flashspecGoTargetKeep(void*, int32_t, int32_t*, int32_t);
// extern int flashspecGoToken(void*, int32_t);
// extern int flashspecGoDraft(void*, flashspec_draft_call*);
// static uintptr_t flashspec_go_target_forward_fn(void) { return (uintptr_t)&flashspecGoTargetForward; }
// static uintptr_t flashspec_go_target_rollback_fn(void) { return (uintptr_t)&flashspecGoTargetRollback; }
// static uintptr_t flashspec_go_target_keep_fn(void) { return (uintptr_t)&flashspecGoTargetKeep; }
// static uintptr_t flashspec_go_token_fn(void) { return (uintptr_t)&flashspecGoToken; }
// static uintptr_t flashspec_go_draft_fn(void) { return (uintptr_t)&flashspecGoDraft; }
import "C"

import (
	"fmt"
	"math"
	"runtime/cgo"
	"sync"
	"unsafe"

	"github.com/flashspec/flashspec/bindings/go/internal/capi"
)

// ---- callback failures ----------------------------------------------------

// failure is the first error a callback reported during one engine call.
type failure struct {
	where string
	err   error
}

func (f *failure) record(where string, err error) {
	if f.err == nil {
		f.where, f.err = where, err
	}
}

func (f *failure) take() (string, error) {
	where, err := f.where, f.err
	f.where, f.err = "", nil
	return where, err
}

// CallbackError is a Generate failure caused by a callback: the status
// (ErrCallback, or the status the library reported), its message, which
// callback failed and the error it returned (or the recovered panic).
type CallbackError struct {
	Status   Status
	Message  string
	Callback string
	Err      error
}

func (e *CallbackError) Error() string {
	return fmt.Sprintf("%s: %s: %s: %v", e.Status.Name(), e.Message, e.Callback, e.Err)
}

// Is matches a Status, so errors.Is(err, ErrCallback) works.
func (e *CallbackError) Is(target error) bool {
	s, ok := target.(Status)
	return ok && s == e.Status
}

// Unwrap gives the callback's own error.
func (e *CallbackError) Unwrap() error { return e.Err }

// cbuffer is a C buffer that grows; the library reads it until the step ends.
type cbuffer struct {
	p     unsafe.Pointer
	bytes uintptr
}

func (b *cbuffer) hold(values []float32) unsafe.Pointer {
	need := uintptr(len(values)) * 4
	if need == 0 {
		need = 4
	}
	if need > b.bytes {
		p := C.realloc(b.p, C.size_t(need))
		if p == nil {
			panic("flashspec: out of memory")
		}
		b.p, b.bytes = p, need
	}
	copy(unsafe.Slice((*float32)(b.p), len(values)), values)
	return b.p
}

func (b *cbuffer) free() {
	C.free(b.p)
	b.p, b.bytes = nil, 0
}

func hostTensor(p unsafe.Pointer, rows, cols int) C.flashspec_tensor {
	return C.flashspec_tensor{data: p, dtype: C.FLASHSPEC_DTYPE_F32, memory: C.FLASHSPEC_MEMORY_HOST,
		rows: C.int64_t(rows), cols: C.int64_t(cols), row_stride: C.int64_t(cols)}
}

// ---- drafters -------------------------------------------------------------

// Drafter proposes draft tokens to one engine at a time.
type Drafter struct {
	ctx    *Context
	raw    capi.Struct_SS_flashspec_drafter
	state  *drafterState // nil for built-in drafters
	handle cgo.Handle
	engine *Engine
	batch  *BatchEngine // the batched engine whose sequence it serves
}

// NgramOptions are the prompt-lookup drafter's parameters; zero MinN/MaxN
// keep the library defaults (1 and 4). Costs are in units of one target
// forward.
type NgramOptions struct {
	MinN, MaxN          int
	CallCost, TokenCost float64
}

// NewNgramDrafter creates the built-in prompt-lookup drafter: it proposes
// the tokens that followed the most recent earlier occurrence of the
// longest matching suffix (MinN..MaxN tokens). o may be nil.
func (c *Context) NewNgramDrafter(o *NgramOptions) (*Drafter, error) {
	p := capi.NewFlashspec_ngram_params()
	defer capi.DeleteFlashspec_ngram_params(p)
	capi.Flashspec_ngram_params_init(p)
	if o != nil {
		if o.MinN != 0 {
			p.SetMin_n(o.MinN)
		}
		if o.MaxN != 0 {
			p.SetMax_n(o.MaxN)
		}
		p.SetCall_cost(o.CallCost)
		p.SetToken_cost(o.TokenCost)
	}
	var a arena
	defer a.free()
	slot := out[uintptr](&a, 1)
	if err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_drafter_create_ngram(raw, p, uintptr(slot))
	}); err != nil {
		return nil, err
	}
	return &Drafter{ctx: c, raw: capi.SwigcptrStruct_SS_flashspec_drafter(readHandle(slot))}, nil
}

// DraftFunc proposes up to maxTokens draft tokens after context (the
// prompt, then the tokens emitted so far; a copy). An empty result means no
// draft this step.
type DraftFunc func(context []int32, maxTokens int) ([]int32, error)

// LogitsDraftFunc proposes tokens it sampled and, row-major, the draft
// logits rows [len(tokens), V] they were sampled from; verification uses
// q = softmax(row / DraftTemperature) over the whole row, so the result
// stays exact.
type LogitsDraftFunc func(context []int32, maxTokens int) (tokens []int32, logits []float32, err error)

// TreeDraftFunc proposes a tree of up to maxNodes point-mass draft tokens
// after context: node i has token tokens[i] and parent parents[i] in
// [-1, i) (-1: a child of the last context token; parents before
// children). Its engine runs tree steps, whose forward sees the tree
// (NewTreeEngine). A parent out of range fails the generation with
// ErrCallback, the message naming the node.
type TreeDraftFunc func(context []int32, maxNodes int) (tokens, parents []int32, err error)

// CallbackDrafterOptions: DraftTemperature (logits drafters; 0 keeps the
// default 1) and the drafter's costs in units of one target forward.
type CallbackDrafterOptions struct {
	DraftTemperature    float32
	CallCost, TokenCost float64
}

type drafterState struct {
	failure failure
	tokens  DraftFunc
	logits  LogitsDraftFunc
	tree    TreeDraftFunc
	buffer  cbuffer
}

func (st *drafterState) draft(call *C.flashspec_draft_call) error {
	context := back[int32](unsafe.Pointer(call.context), int(call.context_len))
	max := int(call.max_tokens)
	var tokens, parents []int32
	var logits []float32
	var err error
	switch {
	case st.logits != nil:
		tokens, logits, err = st.logits(context, max)
	case st.tree != nil:
		tokens, parents, err = st.tree(context, max)
	default:
		tokens, err = st.tokens(context, max)
	}
	if err != nil {
		return err
	}
	n := len(tokens)
	if n > max {
		return fmt.Errorf("returned %d tokens, more than maxTokens = %d", n, max)
	}
	copy(unsafe.Slice((*int32)(unsafe.Pointer(call.tokens)), max), tokens)
	if st.tree != nil {
		if len(parents) != n {
			return fmt.Errorf("returned %d parents for %d tokens", len(parents), n)
		}
		if call.parents == nil {
			return fmt.Errorf("the library passed no parents buffer")
		}
		copy(unsafe.Slice((*int32)(unsafe.Pointer(call.parents)), max), parents)
	}
	if st.logits != nil && n > 0 {
		if len(logits) == 0 || len(logits)%n != 0 {
			return fmt.Errorf("returned %d logits, not whole rows for %d tokens", len(logits), n)
		}
		call.logits = hostTensor(st.buffer.hold(logits), n, len(logits)/n)
	}
	call.num_tokens = C.int32_t(n)
	return nil
}

func (c *Context) newCallbackDrafter(st *drafterState, o *CallbackDrafterOptions) (*Drafter, error) {
	p := capi.NewFlashspec_callback_drafter_params()
	defer capi.DeleteFlashspec_callback_drafter_params(p)
	capi.Flashspec_callback_drafter_params_init(p)
	switch {
	case st.logits != nil:
		p.SetKind(capi.FLASHSPEC_DRAFT_LOGITS)
	case st.tree != nil:
		p.SetKind(capi.FLASHSPEC_DRAFT_TREE)
	default:
		p.SetKind(capi.FLASHSPEC_DRAFT_TOKENS)
	}
	h := cgo.NewHandle(st)
	p.SetDraft(uintptr(C.flashspec_go_draft_fn()))
	p.SetUser_data(uintptr(h))
	if o != nil {
		if o.DraftTemperature != 0 {
			p.SetDraft_temperature(o.DraftTemperature)
		}
		p.SetCall_cost(o.CallCost)
		p.SetToken_cost(o.TokenCost)
	}
	var a arena
	defer a.free()
	slot := out[uintptr](&a, 1)
	if err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_drafter_create_callback(raw, p, uintptr(slot))
	}); err != nil {
		h.Delete()
		return nil, err
	}
	return &Drafter{ctx: c, raw: capi.SwigcptrStruct_SS_flashspec_drafter(readHandle(slot)), state: st, handle: h}, nil
}

// NewCallbackDrafter creates a drafter backed by fn (greedy, tokens-only
// drafts: a draft model decoded greedily, a lookup table, retrieval). o may
// be nil.
func (c *Context) NewCallbackDrafter(fn DraftFunc, o *CallbackDrafterOptions) (*Drafter, error) {
	if fn == nil {
		return nil, &Error{Status: ErrNullPointer, Message: "fn: is nil"}
	}
	return c.newCallbackDrafter(&drafterState{tokens: fn}, o)
}

// NewLogitsDrafter creates a drafter backed by fn that samples its tokens
// and returns the logits they were sampled from. o may be nil.
func (c *Context) NewLogitsDrafter(fn LogitsDraftFunc, o *CallbackDrafterOptions) (*Drafter, error) {
	if fn == nil {
		return nil, &Error{Status: ErrNullPointer, Message: "fn: is nil"}
	}
	return c.newCallbackDrafter(&drafterState{logits: fn}, o)
}

// NewTreeDrafter creates a drafter backed by fn, which proposes trees
// (Medusa / EAGLE-style token trees). o may be nil.
func (c *Context) NewTreeDrafter(fn TreeDraftFunc, o *CallbackDrafterOptions) (*Drafter, error) {
	if fn == nil {
		return nil, &Error{Status: ErrNullPointer, Message: "fn: is nil"}
	}
	return c.newCallbackDrafter(&drafterState{tree: fn}, o)
}

// Close frees the drafter. It fails while an engine that is not closed
// uses it. Closing twice is a no-op.
func (d *Drafter) Close() error {
	if d.raw == nil {
		return nil
	}
	if d.engine != nil || d.batch != nil {
		return &Error{Status: ErrInvalidArgument, Message: "drafter: is used by an engine; close the engine first"}
	}
	d.ctx.mu.Lock()
	capi.Flashspec_drafter_destroy(d.raw)
	d.ctx.mu.Unlock()
	d.raw = nil
	if d.state != nil {
		d.handle.Delete()
		d.state.buffer.free()
	}
	return nil
}

// ---- the engine -----------------------------------------------------------

// TargetForward is the host's target model: drop any cached tokens beyond
// numPast (0: a new sequence), append tokens to the KV cache and return the
// final hidden rows of the last numRows tokens, row-major [numRows, d].
type TargetForward func(tokens []int32, numPast, numRows int) ([]float32, error)

// TargetRollback truncates the target's KV cache to its first numKeep tokens.
type TargetRollback func(numKeep int) error

// TargetCall is one target forward as NewTreeEngine's forward sees it
// (copies): Parents is nil for a chain step; for a tree step it has one
// entry per token, -1 (the token follows the one before it) or the index in
// Tokens of its parent. Run a tree step with tree attention (each token
// sees the cache, the tokens before the first node and its ancestors) and
// return the rows of the last NumRows tokens (the root's, then one per
// node; see Tree steps in flashspec.h).
type TargetCall struct {
	Tokens, Parents []int32
	NumPast         int
	NumRows         int
	Step            uint64
}

// TreeTargetForward is the host's target model for trees and chains.
type TreeTargetForward func(call *TargetCall) ([]float32, error)

// TargetKeep, after a tree step, keeps the cache's first numPast tokens,
// then of the last forward's tokens those at the indices keep (increasing),
// dropping the rest.
type TargetKeep func(numPast int, keep []int32) error

// Policy chooses an arm each step.
type Policy int

// Drafter-selection policies (flashspec_bandit_policy).
const (
	PolicyUCB1     = Policy(C.FLASHSPEC_BANDIT_UCB1)
	PolicyThompson = Policy(C.FLASHSPEC_BANDIT_THOMPSON)
	PolicyFixed    = Policy(C.FLASHSPEC_BANDIT_FIXED)
	PolicyOracle   = Policy(C.FLASHSPEC_BANDIT_ORACLE)
)

// DraftLenRule says how many tokens a step drafts (flashspec_draft_len_rule).
type DraftLenRule int

// Draft length rules.
const (
	// DraftLenArm drafts the played arm's k.
	DraftLenArm = DraftLenRule(C.FLASHSPEC_DRAFT_LEN_ARM)
	// DraftLenAdaptive drafts, each step, the k in [0, the arm's k] that
	// maximises the expected tokens per unit cost, from live per-position
	// acceptance estimates per drafter remembered over about DraftLenMemory
	// steps (see flashspec_draft_len_rule); k = 0 decodes without asking the
	// drafter.
	DraftLenAdaptive = DraftLenRule(C.FLASHSPEC_DRAFT_LEN_ADAPTIVE)
)

// draftLenParams is what flashspec_engine_params and
// flashspec_batch_engine_params share of the draft length options.
type draftLenParams interface {
	SetDraft_len_rule(capi.Enum_SS_flashspec_draft_len_rule)
	SetDraft_len_memory(float64)
}

// setDraftLen fills the draft length options of either engine. A rule the
// C enum cannot hold is refused here (converted, it could wrap to a known
// rule); other unknown rules and memories outside [1, 1e6] are the
// library's ErrInvalidArgument. Memory 0 keeps the library default (64).
func setDraftLen(p draftLenParams, rule DraftLenRule, memory float64) error {
	if int(rule) < math.MinInt32 || int(rule) > math.MaxInt32 {
		return &Error{Status: ErrInvalidArgument, Message: fmt.Sprintf("DraftLenRule: unknown value %d", int(rule))}
	}
	p.SetDraft_len_rule(capi.Enum_SS_flashspec_draft_len_rule(rule))
	if memory != 0 {
		p.SetDraft_len_memory(memory)
	}
	return nil
}

// Arm is a (drafter, draft length) pair; a nil Drafter with DraftLen 0
// decodes without drafting.
type Arm struct {
	Drafter  *Drafter
	DraftLen int
}

// EngineOptions configure an engine; start from DefaultEngineOptions (the
// library defaults), since zero costs are meaningful.
type EngineOptions struct {
	Rollback        TargetRollback // optional
	Keep            TargetKeep     // optional: the cache after a tree step; nil: the path is sent again
	Drafters        []*Drafter     // each serves one engine
	Arms            []Arm          // nil: one arm per drafter of length DefaultDraftLen
	DefaultDraftLen int
	Policy          Policy
	BanditSeed      uint64    // PolicyThompson
	UCBExploration  float64   // PolicyUCB1
	FixedArm        int       // PolicyFixed
	OracleRewards   []float64 // PolicyOracle: expected reward per arm
	TargetStepCost  float64
	TargetRowCost   float64
	MaxContext      int // 0: unlimited
	DraftLenRule    DraftLenRule
	DraftLenMemory  float64 // DraftLenAdaptive: steps remembered, 1..1e6; 0: the default (64)
}

// DefaultEngineOptions are the library's defaults (flashspec_engine_params_init).
func DefaultEngineOptions() EngineOptions {
	p := capi.NewFlashspec_engine_params()
	defer capi.DeleteFlashspec_engine_params(p)
	capi.Flashspec_engine_params_init(p)
	return EngineOptions{DefaultDraftLen: p.GetDefault_draft_len(), Policy: Policy(p.GetPolicy()),
		BanditSeed: p.GetBandit_seed(), UCBExploration: p.GetUcb_exploration(), FixedArm: p.GetFixed_arm(),
		TargetStepCost: p.GetTarget_step_cost(), TargetRowCost: p.GetTarget_row_cost(), MaxContext: p.GetMax_context(),
		DraftLenRule: DraftLenRule(p.GetDraft_len_rule()), DraftLenMemory: p.GetDraft_len_memory()}
}

type engineState struct {
	failure failure
	fwd     TargetForward
	tree    TreeTargetForward
	back    TargetRollback
	keeper  TargetKeep
	onToken func(int32) bool
	hidden  int
	buffer  cbuffer
}

func (st *engineState) forward(call *C.flashspec_target_call) error {
	tokens := back[int32](unsafe.Pointer(call.tokens), int(call.num_tokens))
	var parents []int32
	if call.parents != nil {
		parents = back[int32](unsafe.Pointer(call.parents), int(call.num_tokens))
	}
	var rows []float32
	var err error
	switch {
	case st.tree != nil:
		rows, err = st.tree(&TargetCall{Tokens: tokens, Parents: parents, NumPast: int(call.num_past),
			NumRows: int(call.num_rows), Step: uint64(call.step)})
	case parents != nil:
		return fmt.Errorf("a tree step needs a forward that sees the parents (NewTreeEngine)")
	default:
		rows, err = st.fwd(tokens, int(call.num_past), int(call.num_rows))
	}
	if err != nil {
		return err
	}
	if len(rows) == 0 || len(rows)%st.hidden != 0 {
		return fmt.Errorf("returned %d values, not whole rows of d = %d", len(rows), st.hidden)
	}
	call.hidden = hostTensor(st.buffer.hold(rows), len(rows)/st.hidden, st.hidden)
	return nil
}

func (st *engineState) rollback(numKeep int) error { return st.back(numKeep) }

func (st *engineState) keep(numPast int, keep []int32) error { return st.keeper(numPast, keep) }

// Engine runs speculative decoding of one sequence at a time.
type Engine struct {
	ctx      *Context
	head     *LMHead
	drafters []*Drafter
	state    *engineState
	handle   cgo.Handle
	gen      sync.Mutex // held by Generate
	mu       sync.Mutex // guards raw (Cancel never waits for Generate)
	raw      capi.Struct_SS_flashspec_engine
}

// NewEngine creates an engine whose target model has LM head head and is
// run by forward. o nil takes DefaultEngineOptions(). The context must use
// the CPU backend. The engine borrows the context, head and drafters:
// Close it first.
//
// This forward runs chains only: a tree step (a tree drafter, a suffix
// drafter with ProposeTrees) fails with ErrCallback; see NewTreeEngine.
func (c *Context) NewEngine(head *LMHead, forward TargetForward, o *EngineOptions) (*Engine, error) {
	if forward == nil {
		return nil, &Error{Status: ErrNullPointer, Message: "forward: is nil"}
	}
	return c.newEngine(head, &engineState{fwd: forward}, o)
}

// NewTreeEngine creates an engine whose forward sees each call's tree (see
// TargetCall); it runs chain steps too (Parents nil). Otherwise as
// NewEngine.
func (c *Context) NewTreeEngine(head *LMHead, forward TreeTargetForward, o *EngineOptions) (*Engine, error) {
	if forward == nil {
		return nil, &Error{Status: ErrNullPointer, Message: "forward: is nil"}
	}
	return c.newEngine(head, &engineState{tree: forward}, o)
}

func (c *Context) newEngine(head *LMHead, st *engineState, o *EngineOptions) (*Engine, error) {
	hr, err := head.handle()
	if err != nil {
		return nil, err
	}
	if o == nil {
		d := DefaultEngineOptions()
		o = &d
	}
	if o.Policy == PolicyOracle && o.OracleRewards != nil {
		// The library reads one reward per arm: the arms given, else one
		// per drafter (at least one).
		arms := len(o.Arms)
		if arms == 0 {
			arms = len(o.Drafters)
		}
		if arms == 0 {
			arms = 1
		}
		if len(o.OracleRewards) < arms {
			return nil, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("OracleRewards: %d entries for %d arms", len(o.OracleRewards), arms)}
		}
	}
	var a arena
	defer a.free()
	p := capi.NewFlashspec_engine_params()
	defer capi.DeleteFlashspec_engine_params(p)
	capi.Flashspec_engine_params_init(p)
	st.back, st.keeper, st.hidden = o.Rollback, o.Keep, head.hidden
	h := cgo.NewHandle(st)
	p.SetTarget_forward(uintptr(C.flashspec_go_target_forward_fn()))
	if o.Rollback != nil {
		p.SetTarget_rollback(uintptr(C.flashspec_go_target_rollback_fn()))
	}
	if o.Keep != nil {
		p.SetTarget_keep(uintptr(C.flashspec_go_target_keep_fn()))
	}
	p.SetTarget_user_data(uintptr(h))
	raws := make([]uintptr, len(o.Drafters))
	for i, d := range o.Drafters {
		if d == nil || d.raw == nil {
			h.Delete()
			return nil, errClosed
		}
		if d.ctx != c {
			h.Delete()
			return nil, &Error{Status: ErrInvalidArgument, Message: fmt.Sprintf("Drafters[%d]: created on another context", i)}
		}
		raws[i] = d.raw.Swigcptr()
	}
	if len(raws) > 0 {
		p.SetDrafters(in(&a, raws))
	}
	p.SetNum_drafters(len(raws))
	if o.Arms != nil {
		arms := make([]int32, 0, 2*len(o.Arms))
		for i, arm := range o.Arms {
			index := -1
			for j, d := range o.Drafters {
				if d == arm.Drafter {
					index = j
				}
			}
			if arm.Drafter != nil && index < 0 {
				h.Delete()
				return nil, &Error{Status: ErrInvalidArgument, Message: fmt.Sprintf("Arms[%d]: its drafter is not in Drafters", i)}
			}
			arms = append(arms, int32(index), int32(arm.DraftLen))
		}
		if len(arms) > 0 {
			p.SetArms(in(&a, arms))
		}
		p.SetNum_arms(len(o.Arms))
	}
	p.SetDefault_draft_len(o.DefaultDraftLen)
	p.SetPolicy(capi.Enum_SS_flashspec_bandit_policy(o.Policy))
	p.SetBandit_seed(o.BanditSeed)
	p.SetUcb_exploration(o.UCBExploration)
	p.SetFixed_arm(o.FixedArm)
	p.SetOracle_rewards(in(&a, o.OracleRewards))
	p.SetTarget_step_cost(o.TargetStepCost)
	p.SetTarget_row_cost(o.TargetRowCost)
	p.SetMax_context(o.MaxContext)
	if err := setDraftLen(p, o.DraftLenRule, o.DraftLenMemory); err != nil {
		h.Delete()
		return nil, err
	}
	slot := out[uintptr](&a, 1)
	if err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_engine_create(raw, hr, p, uintptr(slot))
	}); err != nil {
		h.Delete()
		return nil, err
	}
	e := &Engine{ctx: c, head: head, drafters: append([]*Drafter(nil), o.Drafters...), state: st, handle: h,
		raw: capi.SwigcptrStruct_SS_flashspec_engine(readHandle(slot))}
	for _, d := range e.drafters {
		d.engine = e
	}
	return e, nil
}

// Close frees the engine and releases its drafters. It fails while a
// generation is in progress (Cancel it first). Closing twice is a no-op.
func (e *Engine) Close() error {
	if !e.gen.TryLock() {
		return &Error{Status: ErrInvalidArgument, Message: "engine: is generating; Cancel it and Close after Generate returns"}
	}
	defer e.gen.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.raw == nil {
		return nil
	}
	e.ctx.mu.Lock()
	capi.Flashspec_engine_destroy(e.raw)
	e.ctx.mu.Unlock()
	e.raw = nil
	e.handle.Delete()
	e.state.buffer.free()
	for _, d := range e.drafters {
		d.engine = nil
	}
	return nil
}

// Cancel asks the generation in progress (on another goroutine, or from a
// callback) to stop before its next step; Generate then returns an error
// matching ErrCancelled. No effect when idle or closed. Safe from any
// goroutine.
func (e *Engine) Cancel() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.raw != nil {
		capi.Flashspec_engine_cancel(e.raw)
	}
}

// FinishReason says why a generation stopped.
type FinishReason int

// Finish reasons (flashspec_finish_reason).
const (
	FinishNone        = FinishReason(C.FLASHSPEC_FINISH_NONE)
	FinishLength      = FinishReason(C.FLASHSPEC_FINISH_LENGTH)
	FinishStopToken   = FinishReason(C.FLASHSPEC_FINISH_STOP_TOKEN)
	FinishHostStop    = FinishReason(C.FLASHSPEC_FINISH_HOST_STOP)
	FinishContextFull = FinishReason(C.FLASHSPEC_FINISH_CONTEXT_FULL)
	FinishCancelled   = FinishReason(C.FLASHSPEC_FINISH_CANCELLED)
)

func (r FinishReason) String() string {
	switch r {
	case FinishNone:
		return "none"
	case FinishLength:
		return "length"
	case FinishStopToken:
		return "stop_token"
	case FinishHostStop:
		return "host_stop"
	case FinishContextFull:
		return "context_full"
	case FinishCancelled:
		return "cancelled"
	}
	return fmt.Sprintf("FinishReason(%d)", int(r))
}

// GenerateOptions of one generation. The zero value is greedy decoding
// (Temperature 0) of up to 256 tokens with seed 0.
type GenerateOptions struct {
	Temperature float32 // target T ≥ 0; 0 = greedy
	Seed        uint64
	RequestID   uint64
	MaxTokens   int // 0: 256
	StopTokens  []int32
	// OnToken, if set, gets each token as it is emitted; returning true
	// stops the generation after it (FinishHostStop).
	OnToken func(token int32) (stop bool)
}

// Generate runs speculative decoding after prompt and returns the emitted
// tokens and why it stopped. At temperature 0 the tokens are the target's
// greedy tokens whatever the drafters propose. On an error the tokens
// emitted before it are returned with it; a callback's error or panic is a
// *CallbackError. Only one Generate runs per engine at a time (a second,
// concurrent or nested, fails with ErrInvalidArgument).
func (e *Engine) Generate(prompt []int32, o *GenerateOptions) ([]int32, FinishReason, error) {
	if !e.gen.TryLock() {
		return nil, FinishNone, &Error{Status: ErrInvalidArgument, Message: "engine: is already generating"}
	}
	defer e.gen.Unlock()
	e.mu.Lock()
	raw := e.raw
	e.mu.Unlock()
	if raw == nil {
		return nil, FinishNone, errClosed
	}
	if o == nil {
		o = &GenerateOptions{}
	}
	maxTokens := o.MaxTokens
	if maxTokens == 0 {
		maxTokens = 256
	}
	capacity := maxTokens
	if capacity < 0 {
		capacity = 0
	}
	var a arena
	defer a.free()
	p := capi.NewFlashspec_generate_params()
	defer capi.DeleteFlashspec_generate_params(p)
	capi.Flashspec_generate_params_init(p)
	p.SetTemperature(o.Temperature)
	p.SetSeed(o.Seed)
	p.SetRequest_id(o.RequestID)
	p.SetMax_tokens(maxTokens)
	p.SetStop_tokens(in(&a, o.StopTokens))
	p.SetNum_stop_tokens(len(o.StopTokens))
	e.state.onToken = o.OnToken
	defer func() { e.state.onToken = nil }()
	if o.OnToken != nil {
		p.SetOn_token(uintptr(C.flashspec_go_token_fn()))
		p.SetOn_token_user_data(uintptr(e.handle))
	}
	result := capi.NewFlashspec_generate_result()
	defer capi.DeleteFlashspec_generate_result(result)
	capi.Flashspec_generate_result_init(result)
	tokens := out[int32](&a, capacity)

	e.state.failure.take()
	for _, d := range e.drafters {
		if d.state != nil {
			d.state.failure.take()
		}
	}
	craw, err := e.ctx.lock()
	if err != nil {
		return nil, FinishNone, err
	}
	status := capi.Flashspec_engine_generate(raw, in(&a, prompt), len(prompt), p, uintptr(tokens), capacity, result)
	message := ""
	if Status(status) != OK {
		message = capi.Flashspec_context_last_error(craw)
	}
	e.ctx.mu.Unlock()

	emitted := back[int32](tokens, result.GetNum_tokens())
	reason := FinishReason(result.GetFinish_reason())
	where, cause := e.state.failure.take()
	for _, d := range e.drafters {
		if d.state != nil && cause == nil {
			where, cause = d.state.failure.take()
		}
	}
	if cause != nil {
		s := Status(status)
		if s == OK { // OnToken failed: the library only saw a request to stop
			s, message = ErrCallback, where+": reported failure"
		}
		return emitted, reason, &CallbackError{Status: s, Message: message, Callback: where, Err: cause}
	}
	if Status(status) != OK {
		return emitted, reason, &Error{Status: Status(status), Message: message}
	}
	return emitted, reason, nil
}

// ArmMetrics are one arm's statistics; Drafter is -1 for a k = 0 arm.
type ArmMetrics struct {
	Drafter, DraftLen                  int
	Pulls, DraftTokens, AcceptedTokens uint64
	MeanReward, MeanCost               float64
}

// EngineMetrics are the totals since creation or ResetMetrics, with the
// per-position counts: PositionDrafted[j] steps drafted at least j + 1
// tokens, PositionAccepted[j] accepted at least j + 1.
type EngineMetrics struct {
	Steps, Drafts, DraftTokens, AcceptedTokens, EmittedTokens uint64
	AcceptanceRate, MeanAcceptedLength, TokensPerStep         float64
	StepLatencyP50us, StepLatencyP99us                        float64
	PositionDrafted, PositionAccepted                         []uint64
	Arms                                                      []ArmMetrics
}

// PositionAcceptance is the acceptance rate at each draft position.
func (m *EngineMetrics) PositionAcceptance() []float64 {
	r := make([]float64, len(m.PositionDrafted))
	for j := range r {
		if m.PositionDrafted[j] > 0 {
			r[j] = float64(m.PositionAccepted[j]) / float64(m.PositionDrafted[j])
		}
	}
	return r
}

// engineMetricsFrom converts the totals of a flashspec_engine_metrics.
func engineMetricsFrom(m capi.Flashspec_engine_metrics) EngineMetrics {
	return EngineMetrics{Steps: m.GetSteps(), Drafts: m.GetDrafts(), DraftTokens: m.GetDraft_tokens(),
		AcceptedTokens: m.GetAccepted_tokens(), EmittedTokens: m.GetEmitted_tokens(),
		AcceptanceRate: m.GetAcceptance_rate(), MeanAcceptedLength: m.GetMean_accepted_length(),
		TokensPerStep: m.GetTokens_per_step(), StepLatencyP50us: m.GetStep_latency_p50_us(),
		StepLatencyP99us: m.GetStep_latency_p99_us()}
}

// armMetricsOf reads arms 0 .. n-1 with get (the single or the batched
// engine's getter).
func armMetricsOf(n int, get func(int, capi.Flashspec_arm_metrics) capi.Enum_SS_flashspec_status) ([]ArmMetrics, capi.Enum_SS_flashspec_status) {
	am := capi.NewFlashspec_arm_metrics()
	defer capi.DeleteFlashspec_arm_metrics(am)
	var arms []ArmMetrics
	for i := 0; i < n; i++ {
		capi.Flashspec_arm_metrics_init(am)
		if s := get(i, am); Status(s) != OK {
			return nil, s
		}
		arms = append(arms, ArmMetrics{Drafter: am.GetDrafter(), DraftLen: am.GetDraft_len(), Pulls: am.GetPulls(),
			DraftTokens: am.GetDraft_tokens(), AcceptedTokens: am.GetAccepted_tokens(),
			MeanReward: am.GetMean_reward(), MeanCost: am.GetMean_cost()})
	}
	return arms, capi.FLASHSPEC_OK
}

// Metrics is a snapshot of the engine's metrics.
func (e *Engine) Metrics() (*EngineMetrics, error) {
	e.mu.Lock()
	raw := e.raw
	e.mu.Unlock()
	if raw == nil {
		return nil, errClosed
	}
	m := capi.NewFlashspec_engine_metrics()
	defer capi.DeleteFlashspec_engine_metrics(m)
	capi.Flashspec_engine_metrics_init(m)
	var a arena
	defer a.free()
	var r EngineMetrics
	err := e.ctx.call(func(craw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		if s := capi.Flashspec_engine_get_metrics(raw, m); Status(s) != OK {
			return s
		}
		n := m.GetNum_positions()
		drafted, accepted := out[uint64](&a, n), out[uint64](&a, n)
		if s := capi.Flashspec_engine_get_position_metrics(raw, n, uintptr(drafted), uintptr(accepted), 0); Status(s) != OK {
			return s
		}
		r = engineMetricsFrom(m)
		r.PositionDrafted, r.PositionAccepted = back[uint64](drafted, n), back[uint64](accepted, n)
		var s capi.Enum_SS_flashspec_status
		r.Arms, s = armMetricsOf(m.GetNum_arms(), func(i int, am capi.Flashspec_arm_metrics) capi.Enum_SS_flashspec_status {
			return capi.Flashspec_engine_get_arm_metrics(raw, i, am)
		})
		return s
	})
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// ResetMetrics zeroes the metrics (the policy keeps what it learned).
func (e *Engine) ResetMetrics() error {
	e.mu.Lock()
	raw := e.raw
	e.mu.Unlock()
	if raw == nil {
		return errClosed
	}
	return e.ctx.call(func(capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_engine_reset_metrics(raw)
	})
}
