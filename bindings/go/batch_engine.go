package flashspec

// The batched engine: many sequences in one engine (flashspec_batch_engine),
// the way a server's parallel slots share one model. Each Step calls the
// host's target forward once for the ragged batch of every active sequence
// and verifies them in one pass.
//
// Callbacks reach Go through the //export trampolines of
// engine_callbacks.go, as for Engine. What ends on a failure follows the C
// API: the target forward or rollback failing (error or panic) fails the
// step with a *CallbackError, no sequence emits a token and the next Step
// repeats it; a sequence's own callback drafter failing ends that sequence
// alone (its SequenceState.Err is a *CallbackError); its OnToken panicking
// also ends it alone after that token (the library sees a request to stop,
// the binding reports the failure).
//
// Callbacks run while Step holds the Context: they must not call methods
// of that Context or of this engine (those return ErrInvalidArgument).

// #include <stdint.h>
// #cgo pkg-config: flashspec
// #include "flashspec.h"
// extern int flashspecGoBatchTargetForward(void*, flashspec_batch_target_call*);
// extern int flashspecGoBatchTargetRollback(void*, uint64_t, int32_t);
// extern int flashspecGoBatchTargetKeep(void*, uint64_t, int32_t, int32_t*, int32_t);
// extern int flashspecGoSequenceToken(void*, uint64_t, int32_t);
// static uintptr_t flashspec_go_batch_target_forward_fn(void) { return (uintptr_t)&flashspecGoBatchTargetForward; }
// static uintptr_t flashspec_go_batch_target_rollback_fn(void) { return (uintptr_t)&flashspecGoBatchTargetRollback; }
// static uintptr_t flashspec_go_batch_target_keep_fn(void) { return (uintptr_t)&flashspecGoBatchTargetKeep; }
// static uintptr_t flashspec_go_sequence_token_fn(void) { return (uintptr_t)&flashspecGoSequenceToken; }
import "C"

import (
	"fmt"
	"runtime/cgo"
	"sync"
	"unsafe"

	"github.com/flashspec/flashspec/bindings/go/internal/capi"
)

// BatchForwardCall is one ragged target forward (copies). Sequence s (in
// the order the sequences joined) is SequenceIDs[s]: drop its cached tokens
// beyond NumPast[s] (0: a new sequence), append TokensOf(s), and give the
// hidden rows of its last RowsOf(s) tokens, at rows RowOffsets[s] ..
// RowOffsets[s+1] of the row-major [NumRows(), d] result.
type BatchForwardCall struct {
	SequenceIDs  []uint64
	NumPast      []int32
	TokenOffsets []int32 // len(SequenceIDs) + 1
	Tokens       []int32
	RowOffsets   []int32 // len(SequenceIDs) + 1
	Step         uint64
	// Parents is nil unless a sequence of this step drafted a tree; then
	// one entry per token, per sequence those of TargetCall.Parents for its
	// own tokens (indices from its first token; a chain's all -1). Run the
	// tree steps with tree attention.
	Parents []int32
}

// ParentsOf is sequence s's parents (nil for a step without trees),
// indices into TokensOf(s).
func (c *BatchForwardCall) ParentsOf(s int) []int32 {
	if c.Parents == nil {
		return nil
	}
	return c.Parents[c.TokenOffsets[s]:c.TokenOffsets[s+1]]
}

// TokensOf is the tokens sequence s appends.
func (c *BatchForwardCall) TokensOf(s int) []int32 {
	return c.Tokens[c.TokenOffsets[s]:c.TokenOffsets[s+1]]
}

// RowsOf is the number of hidden rows sequence s wants.
func (c *BatchForwardCall) RowsOf(s int) int { return int(c.RowOffsets[s+1] - c.RowOffsets[s]) }

// NumRows is the number of rows the forward returns.
func (c *BatchForwardCall) NumRows() int { return int(c.RowOffsets[len(c.RowOffsets)-1]) }

// BatchTargetForward is the host's target model over a ragged batch; it
// returns every sequence's rows, row-major [call.NumRows(), d].
type BatchTargetForward func(call *BatchForwardCall) ([]float32, error)

// BatchTargetRollback truncates one sequence's KV cache to its first
// numKeep tokens.
type BatchTargetRollback func(sequenceID uint64, numKeep int) error

// BatchTargetKeep, after a tree step of one sequence, does what TargetKeep
// does to its cache (keep indexes its tokens of the last forward).
type BatchTargetKeep func(sequenceID uint64, numPast int, keep []int32) error

// BatchArm is an arm of the batched engine: an index into the drafters
// each sequence brings (-1 with DraftLen 0: no drafting) and a draft length.
type BatchArm struct {
	Drafter, DraftLen int
}

// BatchEngineOptions configure a batched engine; start from
// DefaultBatchEngineOptions (the library defaults). The fields mean what
// they mean in EngineOptions, applied to each sequence; NumDrafters is the
// number of drafters each sequence brings, MaxSequences bounds the
// sequences in the engine at once (0: as many as the context's workspace
// holds).
type BatchEngineOptions struct {
	Rollback        BatchTargetRollback // optional
	Keep            BatchTargetKeep     // optional: a sequence's cache after its tree steps
	NumDrafters     int
	Arms            []BatchArm // nil: one arm per drafter of length DefaultDraftLen
	DefaultDraftLen int
	Policy          Policy
	BanditSeed      uint64
	UCBExploration  float64
	FixedArm        int
	OracleRewards   []float64
	TargetStepCost  float64
	TargetRowCost   float64
	MaxContext      int
	MaxSequences    int
	DraftLenRule    DraftLenRule // DraftLenAdaptive: each sequence keeps its own estimates per drafter
	DraftLenMemory  float64      // 0: the default (64)
}

// DefaultBatchEngineOptions are the library's defaults
// (flashspec_batch_engine_params_init).
func DefaultBatchEngineOptions() BatchEngineOptions {
	p := capi.NewFlashspec_batch_engine_params()
	defer capi.DeleteFlashspec_batch_engine_params(p)
	capi.Flashspec_batch_engine_params_init(p)
	return BatchEngineOptions{NumDrafters: p.GetNum_drafters(), DefaultDraftLen: p.GetDefault_draft_len(),
		Policy: Policy(p.GetPolicy()), BanditSeed: p.GetBandit_seed(), UCBExploration: p.GetUcb_exploration(),
		FixedArm: p.GetFixed_arm(), TargetStepCost: p.GetTarget_step_cost(), TargetRowCost: p.GetTarget_row_cost(),
		MaxContext: p.GetMax_context(), MaxSequences: p.GetMax_sequences(),
		DraftLenRule: DraftLenRule(p.GetDraft_len_rule()), DraftLenMemory: p.GetDraft_len_memory()}
}

type batchEngineState struct {
	failure  failure
	fwd      BatchTargetForward
	rollback BatchTargetRollback
	keeper   BatchTargetKeep
	hidden   int
	buffer   cbuffer
}

func (st *batchEngineState) forward(call *C.flashspec_batch_target_call) error {
	s := int(call.num_sequences)
	c := &BatchForwardCall{
		SequenceIDs:  back[uint64](unsafe.Pointer(call.sequence_ids), s),
		NumPast:      back[int32](unsafe.Pointer(call.num_past), s),
		TokenOffsets: back[int32](unsafe.Pointer(call.token_offsets), s+1),
		Tokens:       back[int32](unsafe.Pointer(call.tokens), int(call.num_tokens)),
		RowOffsets:   back[int32](unsafe.Pointer(call.row_offsets), s+1),
		Step:         uint64(call.step),
	}
	if call.parents != nil {
		c.Parents = back[int32](unsafe.Pointer(call.parents), int(call.num_tokens))
	}
	rows, err := st.fwd(c)
	if err != nil {
		return err
	}
	if len(rows) == 0 || len(rows)%st.hidden != 0 {
		return fmt.Errorf("returned %d values, not whole rows of d = %d", len(rows), st.hidden)
	}
	call.hidden = hostTensor(st.buffer.hold(rows), len(rows)/st.hidden, st.hidden)
	return nil
}

func (st *batchEngineState) back(sequenceID uint64, numKeep int) error {
	return st.rollback(sequenceID, numKeep)
}

func (st *batchEngineState) keep(sequenceID uint64, numPast int, keep []int32) error {
	return st.keeper(sequenceID, numPast, keep)
}

// batchSequence is what the binding holds for one sequence in the engine.
type batchSequence struct {
	drafters []*Drafter
	onToken  func(sequenceID uint64, token int32) bool
	failure  failure // the first failure of its drafters or OnToken
	handle   cgo.Handle
}

// BatchEngine runs speculative decoding of many sequences at once. Its
// methods are for one goroutine at a time: a call while another runs (or
// from a callback) fails with ErrInvalidArgument.
type BatchEngine struct {
	ctx       *Context
	head      *LMHead
	state     *batchEngineState
	handle    cgo.Handle
	busy      sync.Mutex
	raw       capi.Struct_SS_flashspec_batch_engine
	sequences map[uint64]*batchSequence
	order     []uint64
}

// NewBatchEngine creates a batched engine whose target model has LM head
// head and is run by forward. o nil takes DefaultBatchEngineOptions(). The
// engine borrows the context and head: Close it first.
func (c *Context) NewBatchEngine(head *LMHead, forward BatchTargetForward, o *BatchEngineOptions) (*BatchEngine, error) {
	hr, err := head.handle()
	if err != nil {
		return nil, err
	}
	if forward == nil {
		return nil, &Error{Status: ErrNullPointer, Message: "forward: is nil"}
	}
	if o == nil {
		d := DefaultBatchEngineOptions()
		o = &d
	}
	if o.Policy == PolicyOracle && o.OracleRewards != nil {
		// The library reads one reward per arm: the arms given, else one
		// per drafter (at least one).
		arms := len(o.Arms)
		if arms == 0 {
			arms = o.NumDrafters
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
	p := capi.NewFlashspec_batch_engine_params()
	defer capi.DeleteFlashspec_batch_engine_params(p)
	capi.Flashspec_batch_engine_params_init(p)
	st := &batchEngineState{fwd: forward, rollback: o.Rollback, keeper: o.Keep, hidden: head.hidden}
	h := cgo.NewHandle(st)
	p.SetTarget_forward(uintptr(C.flashspec_go_batch_target_forward_fn()))
	if o.Rollback != nil {
		p.SetTarget_rollback(uintptr(C.flashspec_go_batch_target_rollback_fn()))
	}
	if o.Keep != nil {
		p.SetTarget_keep(uintptr(C.flashspec_go_batch_target_keep_fn()))
	}
	p.SetTarget_user_data(uintptr(h))
	p.SetNum_drafters(o.NumDrafters)
	if o.Arms != nil {
		arms := make([]int32, 0, 2*len(o.Arms))
		for _, arm := range o.Arms {
			arms = append(arms, int32(arm.Drafter), int32(arm.DraftLen))
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
	p.SetMax_sequences(o.MaxSequences)
	if err := setDraftLen(p, o.DraftLenRule, o.DraftLenMemory); err != nil {
		h.Delete()
		return nil, err
	}
	slot := out[uintptr](&a, 1)
	if err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_batch_engine_create(raw, hr, p, uintptr(slot))
	}); err != nil {
		h.Delete()
		return nil, err
	}
	return &BatchEngine{ctx: c, head: head, state: st, handle: h, sequences: map[uint64]*batchSequence{},
		raw: capi.SwigcptrStruct_SS_flashspec_batch_engine(readHandle(slot))}, nil
}

// enter takes the engine for one call: it refuses a concurrent or nested
// one (a callback's), which would otherwise wait for the Context forever.
func (e *BatchEngine) enter() error {
	if !e.busy.TryLock() {
		return &Error{Status: ErrInvalidArgument, Message: "batch engine: is in use (called from its own callback or concurrently)"}
	}
	if e.raw == nil {
		e.busy.Unlock()
		return errClosed
	}
	return nil
}

func (e *BatchEngine) release(seq *batchSequence) {
	for _, d := range seq.drafters {
		d.batch = nil
	}
	seq.handle.Delete()
}

// Close frees the engine and releases every sequence's drafters (close
// them, or give them to another sequence or engine). Closing twice is a
// no-op.
func (e *BatchEngine) Close() error {
	if !e.busy.TryLock() {
		return &Error{Status: ErrInvalidArgument, Message: "batch engine: is in use (called from its own callback or concurrently)"}
	}
	defer e.busy.Unlock()
	if e.raw == nil {
		return nil
	}
	e.ctx.mu.Lock()
	capi.Flashspec_batch_engine_destroy(e.raw)
	e.ctx.mu.Unlock()
	e.raw = nil
	for _, seq := range e.sequences {
		e.release(seq)
	}
	e.sequences, e.order = nil, nil
	e.handle.Delete()
	e.state.buffer.free()
	return nil
}

// SequenceOptions of one sequence: its own drafters (the engine's
// NumDrafters of them, no logits drafters; each serves this sequence until
// it is removed) and what GenerateOptions say for one generation. OnToken
// gets the sequence's id with each token; returning true finishes the
// sequence after it (FinishHostStop).
type SequenceOptions struct {
	Drafters    []*Drafter
	Temperature float32 // target T ≥ 0; 0 = greedy
	Seed        uint64
	RequestID   uint64
	MaxTokens   int // 0: 256
	StopTokens  []int32
	OnToken     func(sequenceID uint64, token int32) (stop bool)
}

// AddSequence adds a sequence with the host's id and prompt; it joins at the
// next Step. o may be nil when the engine has no drafters. On error the
// engine is unchanged.
func (e *BatchEngine) AddSequence(id uint64, prompt []int32, o *SequenceOptions) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.busy.Unlock()
	if o == nil {
		o = &SequenceOptions{}
	}
	maxTokens := o.MaxTokens
	if maxTokens == 0 {
		maxTokens = 256
	}
	var a arena
	defer a.free()
	raws := make([]uintptr, len(o.Drafters))
	for i, d := range o.Drafters {
		if d == nil || d.raw == nil {
			return errClosed
		}
		if d.ctx != e.ctx {
			return &Error{Status: ErrInvalidArgument, Message: fmt.Sprintf("Drafters[%d]: created on another context", i)}
		}
		raws[i] = d.raw.Swigcptr()
	}
	p := capi.NewFlashspec_sequence_params()
	defer capi.DeleteFlashspec_sequence_params(p)
	capi.Flashspec_sequence_params_init(p)
	p.SetDrafters(in(&a, raws))
	p.SetNum_drafters(len(raws))
	p.SetTemperature(o.Temperature)
	p.SetSeed(o.Seed)
	p.SetRequest_id(o.RequestID)
	p.SetMax_tokens(maxTokens)
	p.SetStop_tokens(in(&a, o.StopTokens))
	p.SetNum_stop_tokens(len(o.StopTokens))
	seq := &batchSequence{drafters: append([]*Drafter(nil), o.Drafters...), onToken: o.OnToken}
	seq.handle = cgo.NewHandle(seq)
	if o.OnToken != nil {
		p.SetOn_token(uintptr(C.flashspec_go_sequence_token_fn()))
		p.SetOn_token_user_data(uintptr(seq.handle))
	}
	if err := e.ctx.call(func(capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_batch_engine_add_sequence(e.raw, id, in(&a, prompt), len(prompt), p)
	}); err != nil {
		seq.handle.Delete()
		return err
	}
	for _, d := range seq.drafters {
		d.batch = e
	}
	e.sequences[id] = seq
	e.order = append(e.order, id)
	return nil
}

// RemoveSequence removes a sequence, active (cancelling it) or finished,
// and releases its drafters; its tokens, state and metrics go with it (its
// steps stay in the engine's totals).
func (e *BatchEngine) RemoveSequence(id uint64) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.busy.Unlock()
	if err := e.ctx.call(func(capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_batch_engine_remove_sequence(e.raw, id)
	}); err != nil {
		return err
	}
	if seq := e.sequences[id]; seq != nil {
		e.release(seq)
		delete(e.sequences, id)
		for i, x := range e.order {
			if x == id {
				e.order = append(e.order[:i], e.order[i+1:]...)
				break
			}
		}
	}
	return nil
}

// SequenceIDs are the ids of the sequences in the engine, in the order they
// joined.
func (e *BatchEngine) SequenceIDs() []uint64 { return append([]uint64(nil), e.order...) }

// Step runs one step for every active sequence and returns how many are
// still active. A sequence's own failure ends that sequence (see Sequence)
// and is not returned here. When the step as a whole fails (the target
// forward, rollback or keep failing is a *CallbackError), no sequence emitted a
// token and the next Step repeats it.
func (e *BatchEngine) Step() (int, error) {
	if err := e.enter(); err != nil {
		return 0, err
	}
	defer e.busy.Unlock()
	var a arena
	defer a.free()
	active := out[int32](&a, 1)
	e.state.failure.take()
	craw, err := e.ctx.lock()
	if err != nil {
		return 0, err
	}
	status := capi.Flashspec_batch_engine_step(e.raw, uintptr(active))
	message := ""
	if Status(status) != OK {
		message = capi.Flashspec_context_last_error(craw)
	}
	e.ctx.mu.Unlock()
	// A failing drafter has ended its sequence: keep its error there.
	for _, seq := range e.sequences {
		for _, d := range seq.drafters {
			if d.state != nil {
				if where, err := d.state.failure.take(); err != nil {
					seq.failure.record(where, err)
				}
			}
		}
	}
	if where, cause := e.state.failure.take(); cause != nil {
		return 0, &CallbackError{Status: Status(status), Message: message, Callback: where, Err: cause}
	}
	if Status(status) != OK {
		return 0, &Error{Status: Status(status), Message: message}
	}
	return int(back[int32](active, 1)[0]), nil
}

// Run steps until no sequence is active.
func (e *BatchEngine) Run() error {
	for {
		n, err := e.Step()
		if err != nil || n == 0 {
			return err
		}
	}
}

// SequenceState is where a sequence stands: its emitted tokens, whether
// steps still run it, why it finished (FinishNone while active or after an
// error), the verify steps it took part in, and the error that ended it
// (a *CallbackError when one of its callbacks failed) or nil.
type SequenceState struct {
	Tokens       []int32
	Active       bool
	FinishReason FinishReason
	Steps        int
	Err          error
}

// Sequence reports sequence id; an id not in the engine is ErrOutOfRange.
func (e *BatchEngine) Sequence(id uint64) (*SequenceState, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.busy.Unlock()
	info := capi.NewFlashspec_sequence_info()
	defer capi.DeleteFlashspec_sequence_info(info)
	capi.Flashspec_sequence_info_init(info)
	var a arena
	defer a.free()
	var r SequenceState
	message := ""
	if err := e.ctx.call(func(capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		if s := capi.Flashspec_batch_engine_get_sequence(e.raw, id, 0, 0, info); Status(s) != OK {
			return s
		}
		n := info.GetNum_tokens()
		tokens := out[int32](&a, n)
		if s := capi.Flashspec_batch_engine_get_sequence(e.raw, id, uintptr(tokens), n, info); Status(s) != OK {
			return s
		}
		r.Tokens = back[int32](tokens, n)
		message = capi.Flashspec_batch_engine_sequence_error(e.raw, id)
		return capi.FLASHSPEC_OK
	}); err != nil {
		return nil, err
	}
	r.Active, r.FinishReason, r.Steps = info.GetActive() != 0, FinishReason(info.GetFinish_reason()), info.GetSteps()
	status := Status(info.GetStatus())
	if seq := e.sequences[id]; seq != nil && seq.failure.err != nil {
		if status == OK { // OnToken failed: the library only saw a request to stop
			status, message, r.FinishReason = ErrCallback, seq.failure.where+": reported failure", FinishNone
		}
		r.Err = &CallbackError{Status: status, Message: message, Callback: seq.failure.where, Err: seq.failure.err}
	} else if status != OK {
		r.Err = &Error{Status: status, Message: message}
	}
	return &r, nil
}

// Metrics are the totals over every sequence since the engine was created,
// arms summed over every sequence; the batched engine keeps no
// per-position counts (PositionDrafted and PositionAccepted are empty).
func (e *BatchEngine) Metrics() (*EngineMetrics, error) {
	return e.metrics(func(m capi.Flashspec_engine_metrics) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_batch_engine_get_metrics(e.raw, m)
	}, true)
}

// SequenceMetrics are the metrics of sequence id alone (no arms: the
// library keeps them summed).
func (e *BatchEngine) SequenceMetrics(id uint64) (*EngineMetrics, error) {
	return e.metrics(func(m capi.Flashspec_engine_metrics) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_batch_engine_get_sequence_metrics(e.raw, id, m)
	}, false)
}

func (e *BatchEngine) metrics(get func(capi.Flashspec_engine_metrics) capi.Enum_SS_flashspec_status, arms bool) (*EngineMetrics, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.busy.Unlock()
	m := capi.NewFlashspec_engine_metrics()
	defer capi.DeleteFlashspec_engine_metrics(m)
	capi.Flashspec_engine_metrics_init(m)
	var r EngineMetrics
	if err := e.ctx.call(func(capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		if s := get(m); Status(s) != OK {
			return s
		}
		r = engineMetricsFrom(m)
		if !arms {
			return capi.FLASHSPEC_OK
		}
		var s capi.Enum_SS_flashspec_status
		r.Arms, s = armMetricsOf(m.GetNum_arms(), func(i int, am capi.Flashspec_arm_metrics) capi.Enum_SS_flashspec_status {
			return capi.Flashspec_batch_engine_get_arm_metrics(e.raw, i, am)
		})
		return s
	}); err != nil {
		return nil, err
	}
	return &r, nil
}
