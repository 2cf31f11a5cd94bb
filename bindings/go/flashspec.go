// Package flashspec is the Go binding of FlashSpec, a fused LM head and
// speculative-decoding sampler (libflashspec). It wraps the SWIG-generated
// raw layer (internal/capi) with error values and Close methods.
//
// Memory: cgo forbids C memory that holds Go pointers, so each call copies
// its Go slices into C buffers and the outputs back. Those copies are of the
// hidden rows and index arrays (the LM-head pass reads V times more); the
// LM head itself is copied once, at NewLMHead. The Go binding runs the
// library on host memory; with the CUDA backend it waits for each call.
package flashspec

// #cgo pkg-config: flashspec
// #include <stdlib.h>
// static unsigned flashspec_go_call_unsigned(void* fn) { return ((unsigned (*)(void))fn)(); }
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/flashspec/flashspec/bindings/go/internal/capi"
)

// Status is a flashspec_status. Statuses other than OK are errors, so
// errors.Is(err, flashspec.ErrOutOfRange) tells what went wrong.
type Status int

// The status codes of flashspec.h (numbers pinned forever).
var (
	OK                   = Status(capi.FLASHSPEC_OK)
	ErrInvalidArgument   = Status(capi.FLASHSPEC_ERR_INVALID_ARGUMENT)
	ErrNullPointer       = Status(capi.FLASHSPEC_ERR_NULL_POINTER)
	ErrStructSize        = Status(capi.FLASHSPEC_ERR_STRUCT_SIZE)
	ErrOutOfRange        = Status(capi.FLASHSPEC_ERR_OUT_OF_RANGE)
	ErrDtypeMismatch     = Status(capi.FLASHSPEC_ERR_DTYPE_MISMATCH)
	ErrDeviceMismatch    = Status(capi.FLASHSPEC_ERR_DEVICE_MISMATCH)
	ErrNonFinite         = Status(capi.FLASHSPEC_ERR_NON_FINITE)
	ErrOutOfMemory       = Status(capi.FLASHSPEC_ERR_OUT_OF_MEMORY)
	ErrWorkspaceExceeded = Status(capi.FLASHSPEC_ERR_WORKSPACE_EXCEEDED)
	ErrUnsupported       = Status(capi.FLASHSPEC_ERR_UNSUPPORTED)
	ErrNoDevice          = Status(capi.FLASHSPEC_ERR_NO_DEVICE)
	ErrCUDA              = Status(capi.FLASHSPEC_ERR_CUDA)
	ErrCallback          = Status(capi.FLASHSPEC_ERR_CALLBACK)
	ErrCancelled         = Status(capi.FLASHSPEC_ERR_CANCELLED)
	ErrInternal          = Status(capi.FLASHSPEC_ERR_INTERNAL)
)

// Name is the C name of the status ("FLASHSPEC_ERR_OUT_OF_RANGE").
func (s Status) Name() string { return capi.Flashspec_status_name(capi.Enum_SS_flashspec_status(s)) }

// Error is the library's description of the status.
func (s Status) Error() string {
	return capi.Flashspec_status_string(capi.Enum_SS_flashspec_status(s))
}

// Error is a failed call: its status and the library's detail message,
// which names the argument that was wrong.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return e.Status.Name() + ": " + e.Message }

// Is matches a Status, so errors.Is(err, ErrOutOfRange) works.
func (e *Error) Is(target error) bool {
	s, ok := target.(Status)
	return ok && s == e.Status
}

// Unwrap gives the Status.
func (e *Error) Unwrap() error { return e.Status }

var nullContext = capi.SwigcptrStruct_SS_flashspec_context(0)

func check(status capi.Enum_SS_flashspec_status, ctx capi.Struct_SS_flashspec_context) error {
	if Status(status) == OK {
		return nil
	}
	return &Error{Status: Status(status), Message: capi.Flashspec_context_last_error(ctx)}
}

// Version is the version string of the library actually loaded.
func Version() string { return capi.Flashspec_version_string() }

// VersionNumber is MAJOR*10000 + MINOR*100 + PATCH of the library loaded.
func VersionNumber() uint { return capi.Flashspec_version_number() }

// ABIVersion is the ABI version of the library loaded; the binding was
// built for ABIVersionCompiled.
func ABIVersion() uint { return capi.Flashspec_abi_version() }

// ABIVersionCompiled is FLASHSPEC_ABI_VERSION of the header the binding was built with.
const ABIVersionCompiled = capi.FLASHSPEC_ABI_VERSION

// CUDADeviceCount is the number of CUDA devices this build can use (0 without CUDA).
func CUDADeviceCount() int { return capi.Flashspec_cuda_device_count() }

// ---- C buffers ------------------------------------------------------------

// arena holds the C buffers of one call.
type arena struct{ blocks []unsafe.Pointer }

func (a *arena) alloc(bytes uintptr) unsafe.Pointer {
	if bytes == 0 {
		bytes = 1
	}
	p := C.malloc(C.size_t(bytes))
	if p == nil {
		panic("flashspec: out of memory")
	}
	a.blocks = append(a.blocks, p)
	return p
}

func (a *arena) free() {
	for _, p := range a.blocks {
		C.free(p)
	}
	a.blocks = nil
}

// in copies s into a C buffer; nil gives 0 (NULL).
func in[T any](a *arena, s []T) uintptr {
	if s == nil {
		return 0
	}
	var zero T
	p := a.alloc(uintptr(len(s)) * unsafe.Sizeof(zero))
	copy(unsafe.Slice((*T)(p), len(s)), s)
	return uintptr(p)
}

// out allocates a C buffer of n elements.
func out[T any](a *arena, n int) unsafe.Pointer {
	var zero T
	return a.alloc(uintptr(n) * unsafe.Sizeof(zero))
}

func back[T any](p unsafe.Pointer, n int) []T {
	s := make([]T, n)
	copy(s, unsafe.Slice((*T)(p), n))
	return s
}

func readHandle(slot unsafe.Pointer) uintptr { return *(*uintptr)(slot) }

// ---- Context --------------------------------------------------------------

// Backend selects where the work runs.
type Backend int

// Backends.
var (
	BackendAuto = Backend(capi.FLASHSPEC_BACKEND_AUTO)
	BackendCPU  = Backend(capi.FLASHSPEC_BACKEND_CPU)
	BackendCUDA = Backend(capi.FLASHSPEC_BACKEND_CUDA)
)

// ContextOptions are the context parameters; the zero value of a field
// keeps the library default (NewContext(nil) takes all defaults).
type ContextOptions struct {
	Backend     Backend // BackendAuto by default
	Device      int
	Seed        uint64
	CPUThreads  int // 0: one per core
	MaxRows     int // 0: the library default (512)
	MaxRequests int // 0: the library default (512)
}

// Context owns a backend, its workspace and the last error message. Its
// methods are serialised by a mutex (the C context is one-thread-at-a-time).
type Context struct {
	mu      sync.Mutex
	raw     capi.Struct_SS_flashspec_context
	backend Backend
}

// NewContext creates a context. Close it when done.
func NewContext(o *ContextOptions) (*Context, error) {
	params := capi.NewFlashspec_context_params()
	defer capi.DeleteFlashspec_context_params(params)
	capi.Flashspec_context_params_init(params)
	if o != nil {
		params.SetBackend(capi.Enum_SS_flashspec_backend(o.Backend))
		params.SetDevice_ordinal(int(o.Device))
		params.SetSeed(o.Seed)
		params.SetCpu_threads(int(o.CPUThreads))
		if o.MaxRows != 0 {
			params.SetMax_rows(int(o.MaxRows))
		}
		if o.MaxRequests != 0 {
			params.SetMax_requests(int(o.MaxRequests))
		}
	}
	var a arena
	defer a.free()
	slot := out[uintptr](&a, 1)
	if err := check(capi.Flashspec_context_create(params, uintptr(slot)), nullContext); err != nil {
		return nil, err
	}
	raw := capi.SwigcptrStruct_SS_flashspec_context(readHandle(slot))
	c := &Context{raw: raw, backend: Backend(capi.Flashspec_context_backend(raw))}
	return c, nil
}

// Close frees the context; LM heads and summaries created on it must be
// closed first. Closing twice is a no-op.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.raw != nil {
		capi.Flashspec_context_destroy(c.raw)
		c.raw = nil
	}
	return nil
}

// Backend is the backend actually chosen (never BackendAuto).
func (c *Context) Backend() Backend { return c.backend }

// LastError is the detail message of the last failed call on c.
func (c *Context) LastError() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.raw == nil {
		return ""
	}
	return capi.Flashspec_context_last_error(c.raw)
}

var errClosed = fmt.Errorf("flashspec: use of a closed object")

func (c *Context) lock() (capi.Struct_SS_flashspec_context, error) {
	c.mu.Lock()
	if c.raw == nil {
		c.mu.Unlock()
		return nil, errClosed
	}
	return c.raw, nil
}

// call runs fn with the context locked and, for the CUDA backend, waits for
// the work, since the outputs are copied back right after.
func (c *Context) call(fn func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status) error {
	raw, err := c.lock()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := check(fn(raw), raw); err != nil {
		return err
	}
	if c.backend == BackendCUDA {
		return check(capi.Flashspec_context_synchronize(raw), raw)
	}
	return nil
}

// ---- LM head --------------------------------------------------------------

// LMHead is an uploaded LM head W, [vocab, hidden], immutable: the whole
// head (NewLMHead) or one rank's vocabulary slice of it (NewLMHeadShard).
type LMHead struct {
	raw capi.Struct_SS_flashspec_lm_head
	// vocab is the global vocabulary (V of a whole head), what token ids,
	// draft logits rows and token masks span; hidden is d.
	vocab, hidden int
}

// NewLMHead uploads W, row-major [vocab, hidden] float32 (copied).
func (c *Context) NewLMHead(w []float32, vocab, hidden int) (*LMHead, error) {
	return c.uploadLMHead(w, vocab, hidden, func(raw capi.Struct_SS_flashspec_context, t capi.Flashspec_tensor, slot uintptr) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_lm_head_create(raw, t, capi.FLASHSPEC_LM_HEAD_COPY, slot)
	})
}

// Dtype is a flashspec_dtype: the element type an LM head stores.
type Dtype int

// Dtypes. DtypeE4M3 and DtypeI8 are the 8-bit codes of a quantised head
// (NewLMHeadQuantized, NewLMHeadE4M3Codes, NewLMHeadInt8Codes).
var (
	DtypeF32  = Dtype(capi.FLASHSPEC_DTYPE_F32)
	DtypeBF16 = Dtype(capi.FLASHSPEC_DTYPE_BF16)
	DtypeF16  = Dtype(capi.FLASHSPEC_DTYPE_F16)
	DtypeE4M3 = Dtype(capi.FLASHSPEC_DTYPE_E4M3) // fp8 e4m3 ("e4m3fn") bit patterns
	DtypeI8   = Dtype(capi.FLASHSPEC_DTYPE_I8)   // two's-complement int8
)

// String is the dtype's name ("f32", "bf16", "f16", "e4m3", "i8").
func (d Dtype) String() string {
	switch d {
	case DtypeF32:
		return "f32"
	case DtypeBF16:
		return "bf16"
	case DtypeF16:
		return "f16"
	case DtypeE4M3:
		return "e4m3"
	case DtypeI8:
		return "i8"
	}
	return fmt.Sprintf("Dtype(%d)", int(d))
}

// NewLMHeadQuantized uploads W, row-major [vocab, hidden] float32, as an
// 8-bit head (flashspec_lm_head_create_quantized): the library quantises
// each vocabulary row v to codes q_v of stored (DtypeE4M3 or DtypeI8) and
// one scale s_v = amax_v / 448 (e4m3) or amax_v / 127 (int8), rounding to
// nearest, ties to even; the head is then the dequantised W = diag(s)·Q.
// Another stored is the library's ErrDtypeMismatch.
func (c *Context) NewLMHeadQuantized(w []float32, vocab, hidden int, stored Dtype) (*LMHead, error) {
	return uploadQuantized(c, w, DtypeF32, nil, vocab, hidden, stored)
}

// NewLMHeadE4M3Codes uploads a head already quantised to e4m3: codes are
// the row-major [vocab, hidden] e4m3 bit patterns (no NaN pattern 0x7f or
// 0xff) and scales the vocab per-row scales (finite, >= 0); row v's weights
// are scales[v] times the codes' values. nil scales are the library's
// ErrInvalidArgument, as are scales of another length (the library is
// given len(scales) rows, so it never reads past the slice); a negative or
// non-finite scale, or a NaN code, is its ErrNonFinite.
func (c *Context) NewLMHeadE4M3Codes(codes []uint8, scales []float32, vocab, hidden int) (*LMHead, error) {
	return uploadQuantized(c, codes, DtypeE4M3, scales, vocab, hidden, DtypeE4M3)
}

// NewLMHeadInt8Codes uploads a head already quantised to int8: codes are
// the row-major [vocab, hidden] int8 codes (any value) and scales the vocab
// per-row scales; row v's weights are scales[v] * codes. Errors as
// NewLMHeadE4M3Codes.
func (c *Context) NewLMHeadInt8Codes(codes []int8, scales []float32, vocab, hidden int) (*LMHead, error) {
	return uploadQuantized(c, codes, DtypeI8, scales, vocab, hidden, DtypeI8)
}

// uploadQuantized checks w against [rows, hidden] and passes it, of dtype
// given, with scales (nil: NULL) to flashspec_lm_head_create_quantized.
func uploadQuantized[T float32 | uint8 | int8](c *Context, w []T, given Dtype, scales []float32, rows, hidden int, stored Dtype) (*LMHead, error) {
	if rows < 0 || hidden < 0 || (hidden != 0 && len(w)/hidden != rows) || len(w) != rows*hidden {
		return nil, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("weight: %d values for [%d, %d]", len(w), rows, hidden)}
	}
	var a arena
	defer a.free()
	t := capi.Flashspec_tensor_make(in(&a, w), capi.Enum_SS_flashspec_dtype(given), capi.FLASHSPEC_MEMORY_HOST, int64(rows), int64(hidden))
	defer capi.DeleteFlashspec_tensor(t)
	var s capi.Flashspec_tensor = capi.SwigcptrFlashspec_tensor(0)
	if scales != nil {
		st := capi.Flashspec_tensor_make(in(&a, scales), capi.FLASHSPEC_DTYPE_F32, capi.FLASHSPEC_MEMORY_HOST, int64(len(scales)), 1)
		defer capi.DeleteFlashspec_tensor(st)
		s = st
	}
	slot := out[uintptr](&a, 1)
	err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_lm_head_create_quantized(raw, t, s, capi.Enum_SS_flashspec_dtype(stored), capi.FLASHSPEC_LM_HEAD_COPY, uintptr(slot))
	})
	if err != nil {
		return nil, err
	}
	return &LMHead{raw: capi.SwigcptrStruct_SS_flashspec_lm_head(readHandle(slot)), vocab: rows, hidden: hidden}, nil
}

// uploadLMHead checks w against [rows, hidden], then creates a head from it
// with create (whole or shard); the head's vocab is rows until the caller
// says otherwise.
func (c *Context) uploadLMHead(w []float32, rows, hidden int,
	create func(raw capi.Struct_SS_flashspec_context, t capi.Flashspec_tensor, slot uintptr) capi.Enum_SS_flashspec_status) (*LMHead, error) {
	// len(w) / hidden == rows rather than len(w) == rows*hidden alone,
	// which wraps for huge sizes.
	if rows < 0 || hidden < 0 || (hidden != 0 && len(w)/hidden != rows) || len(w) != rows*hidden {
		return nil, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("weight: %d values for [%d, %d]", len(w), rows, hidden)}
	}
	var a arena
	defer a.free()
	t := capi.Flashspec_tensor_make(in(&a, w), capi.FLASHSPEC_DTYPE_F32, capi.FLASHSPEC_MEMORY_HOST, int64(rows), int64(hidden))
	defer capi.DeleteFlashspec_tensor(t)
	slot := out[uintptr](&a, 1)
	err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return create(raw, t, uintptr(slot))
	})
	if err != nil {
		return nil, err
	}
	return &LMHead{raw: capi.SwigcptrStruct_SS_flashspec_lm_head(readHandle(slot)), vocab: rows, hidden: hidden}, nil
}

// Close frees the head. Closing twice is a no-op.
func (h *LMHead) Close() error {
	if h.raw != nil {
		capi.Flashspec_lm_head_destroy(h.raw)
		h.raw = nil
	}
	return nil
}

// VocabSize is V, or for a shard head the tokens of its slice.
func (h *LMHead) VocabSize() int { return int(capi.Flashspec_lm_head_vocab_size(h.raw)) }

// HiddenSize is d.
func (h *LMHead) HiddenSize() int { return int(capi.Flashspec_lm_head_hidden_size(h.raw)) }

// Dtype is the head's stored dtype: DtypeF32 for NewLMHead, DtypeE4M3 or
// DtypeI8 for an 8-bit head.
func (h *LMHead) Dtype() Dtype { return Dtype(capi.Flashspec_lm_head_dtype(h.raw)) }

func (h *LMHead) handle() (capi.Struct_SS_flashspec_lm_head, error) {
	if h == nil || h.raw == nil {
		return nil, errClosed
	}
	return h.raw, nil
}

// ---- Draft ----------------------------------------------------------------

// DraftOptions are the per-call randomness and temperature of Draft; nil
// slices take the library defaults (see flashspec_draft_params). Controls
// apply per row: their per-request slices have one entry per hidden row,
// their mask one row per hidden row.
type DraftOptions struct {
	Temperature  float32 // 0: greedy
	Temperatures []float32
	Seeds        []uint64
	RequestIDs   []uint64
	Steps        []uint64
	Positions    []int32
	Controls     *SamplingControls
}

// Draft drafts one token per row of hidden ([rows, d] row-major). scores
// are the token logits (T = 0) or log q(x) (T > 0).
func (c *Context) Draft(head *LMHead, hidden []float32, o *DraftOptions) (tokens []int32, scores []float32, err error) {
	hr, err := head.handle()
	if err != nil {
		return nil, nil, err
	}
	rows, err := rowsOf(hidden, head.hidden, "hidden")
	if err != nil {
		return nil, nil, err
	}
	var a arena
	defer a.free()
	p, release, err := o.cParams(&a, rows, head.vocab)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	t := capi.Flashspec_tensor_make(in(&a, hidden), capi.FLASHSPEC_DTYPE_F32, capi.FLASHSPEC_MEMORY_HOST, int64(rows), int64(head.hidden))
	defer capi.DeleteFlashspec_tensor(t)
	tp, sp := out[int32](&a, rows), out[float32](&a, rows)
	err = c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_draft(raw, hr, t, p, uintptr(tp), uintptr(sp))
	})
	if err != nil {
		return nil, nil, err
	}
	return back[int32](tp, rows), back[float32](sp, rows), nil
}

// cParams checks o (nil: the defaults) for a call over rows hidden rows and
// a vocabulary of vocab tokens, then builds the C params in a's buffers;
// release deletes them.
func (o *DraftOptions) cParams(a *arena, rows, vocab int) (capi.Flashspec_draft_params, func(), error) {
	if o == nil {
		o = &DraftOptions{}
	}
	// The library reads rows entries of each slice given (nil: the default;
	// an empty slice is given, and too short).
	for _, s := range []struct {
		name  string
		given bool
		n     int
	}{{"Temperatures", o.Temperatures != nil, len(o.Temperatures)}, {"Seeds", o.Seeds != nil, len(o.Seeds)},
		{"RequestIDs", o.RequestIDs != nil, len(o.RequestIDs)}, {"Steps", o.Steps != nil, len(o.Steps)},
		{"Positions", o.Positions != nil, len(o.Positions)}} {
		if s.given && s.n < rows {
			return nil, nil, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("%s: %d entries for %d rows", s.name, s.n, rows)}
		}
	}
	words := 0
	if o.Controls != nil {
		var err error
		if words, err = o.Controls.check("Controls", rows, rows, vocab, "rows"); err != nil {
			return nil, nil, err
		}
	}
	p := capi.NewFlashspec_draft_params()
	capi.Flashspec_draft_params_init(p)
	p.SetTemperature(o.Temperature)
	p.SetTemperatures(in(a, o.Temperatures))
	p.SetSeeds(in(a, o.Seeds))
	p.SetRequest_ids(in(a, o.RequestIDs))
	p.SetSteps(in(a, o.Steps))
	p.SetPositions(in(a, o.Positions))
	var controls capi.Flashspec_sampling_controls
	if o.Controls != nil {
		controls = o.Controls.cControls(a, words)
		p.SetControls(controls)
	}
	return p, func() {
		if controls != nil {
			capi.DeleteFlashspec_sampling_controls(controls)
		}
		capi.DeleteFlashspec_draft_params(p)
	}, nil
}

func rowsOf(values []float32, cols int, name string) (int, error) {
	if cols <= 0 || len(values)%cols != 0 {
		return 0, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("%s: %d values are not whole rows of %d", name, len(values), cols)}
	}
	return len(values) / cols, nil
}

// ---- Verify and finalize --------------------------------------------------

// VerifyBatch is a ragged batch of requests (see flashspec_verify_batch):
// request r drafted DraftTokens[DraftOffsets[r]:DraftOffsets[r+1]], and its
// n_r + 1 target hidden rows start at row DraftOffsets[r] + r of
// TargetHidden ([DraftOffsets[R] + R, d] row-major). DraftLogits nil means
// greedy drafts; else [DraftOffsets[R], V]. Nil optional slices take the
// library defaults. Every slice is checked before the library is called:
// DraftTokens and AcceptUniforms need DraftOffsets[R] entries, the
// per-request slices R, TargetHidden DraftOffsets[R] + R rows and
// DraftLogits DraftOffsets[R] rows (a short one is an ErrOutOfRange error).
//
// Controls define each request's target distribution (mask rows: the
// DraftOffsets[R] + R target rows), DraftControls the controls stochastic
// drafts were sampled under (mask rows: the DraftOffsets[R] DraftLogits
// rows); see SamplingControls. Logprobs asks for the emitted tokens'
// logprobs and TopLogprobs (0..MaxTopLogprobs) for each slot's tokens of
// largest raw logit, in the VerifyResult.
//
// DraftParents (nil: each request's drafts are a chain) makes each
// request's drafts a tree: draft k of request r (node k) has parent node
// DraftParents[DraftOffsets[r] + k] in [-1, k) (-1: the root), and target
// row k + 1 of the request is the target after the path to node k. It needs
// DraftOffsets[R] entries; the result's AcceptedNodes give the accepted path
// (see "Tree verify" in flashspec.h). With greedy drafts a node's children
// are point-mass candidates; with DraftLogits or a sparse support they are
// stochastic candidates (SpecInfer's multi-step speculative sampling, CPU
// backend).
//
// DraftSupportOffsets, DraftSupportTokens and DraftSupportProbs give each
// draft row's q as a sparse support instead of DraftLogits (all three or
// none; see "Sparse draft distributions" in flashspec.h): draft row k's
// support is entries [DraftSupportOffsets[k], DraftSupportOffsets[k+1]) of
// the tokens and probabilities, 1..MaxDraftSupport distinct tokens whose
// probabilities sum to 1 within DraftSupportTolerance, the drafted token
// among them. DraftSupportOffsets needs DraftOffsets[R] + 1 entries, the
// tokens and probabilities DraftSupportOffsets[DraftOffsets[R]] each (a short
// one is an ErrOutOfRange error before the call). A point-mass draft is the
// support {x} with q = 1, so greedy and stochastic requests share a batch.
//
// Greedy says every request's target is greedy (T = 0), as Temperatures of
// 0 make it, without the slice (Temperatures must then be nil: an
// ErrInvalidArgument error otherwise); see "Greedy batches" in flashspec.h.
type VerifyBatch struct {
	DraftOffsets      []int32
	DraftTokens       []int32
	TargetHidden      []float32
	DraftLogits       []float32
	Temperatures      []float32
	DraftTemperatures []float32
	Seeds             []uint64
	RequestIDs        []uint64
	Steps             []uint64
	AcceptUniforms    []float32
	MaxDraftLen       int
	Controls          *SamplingControls
	DraftControls     *SamplingControls
	Logprobs          bool
	TopLogprobs       int
	DraftParents      []int32
	// Sparse draft distributions (CPU backend).
	DraftSupportOffsets []int32
	DraftSupportTokens  []int32
	DraftSupportProbs   []float32
	Greedy              bool
}

// VerifyResult is what finalize wrote. The logprob slices are indexed as
// EmittedTokens (slot k of request r at DraftOffsets[r] + r + k); a slot
// past a request's tokens holds NaN and -1. They are nil unless the batch
// asked for them.
type VerifyResult struct {
	AcceptedCounts []int32  // [R]
	EmittedTokens  []int32  // [DraftOffsets[R] + R]; unused entries are -1
	NextSteps      []uint64 // [R]: Steps + 1
	// Logprobs: log p(token) under the controlled target distribution the
	// token was verified against (0 for a T = 0 row); RawLogprobs: under the
	// raw logits. [DraftOffsets[R] + R] each (VerifyBatch.Logprobs).
	Logprobs    []float32
	RawLogprobs []float32
	// TopTokens[slot*TopN+i]: the TopN tokens of largest raw logit of the
	// slot's row (ties: smaller id), TopLogprobs their raw logprobs
	// (VerifyBatch.TopLogprobs).
	TopTokens   []int32
	TopLogprobs []float32
	TopN        int
	// AcceptedNodes [DraftOffsets[R] + R], for a batch with DraftParents:
	// slot k < AcceptedCounts[r] of request r holds the node index of the
	// k-th accepted node, -1 the rest. Nil for a chain batch.
	AcceptedNodes []int32
	offsets       []int32
}

func (r *VerifyResult) slots(request int) (start, count int) {
	return int(r.offsets[request]) + request, int(r.AcceptedCounts[request]) + 1
}

// Tokens are request r's emitted tokens: the accepted drafts, then the
// recovered or bonus token.
func (r *VerifyResult) Tokens(request int) []int32 {
	start, count := r.slots(request)
	return r.EmittedTokens[start : start+count]
}

// Nodes are the node indices of request r's accepted path down its tree
// (the drafts its accepted tokens are); nil for a chain batch.
func (r *VerifyResult) Nodes(request int) []int32 {
	if r.AcceptedNodes == nil {
		return nil
	}
	start, count := r.slots(request)
	return r.AcceptedNodes[start : start+count-1]
}

// TokenLogprobs are the logprobs of request r's emitted tokens (raw: under
// the raw logits); nil unless the batch asked for logprobs.
func (r *VerifyResult) TokenLogprobs(request int, raw bool) []float32 {
	values := r.Logprobs
	if raw {
		values = r.RawLogprobs
	}
	if values == nil {
		return nil
	}
	start, count := r.slots(request)
	return values[start : start+count]
}

// Top is the top tokens and their raw logprobs of the row of request r's
// emitted token k (0 ≤ k ≤ AcceptedCounts[r]), largest first.
func (r *VerifyResult) Top(request, k int) ([]int32, []float32) {
	if r.TopN == 0 {
		return nil, nil
	}
	start, _ := r.slots(request)
	slot := (start + k) * r.TopN
	return r.TopTokens[slot : slot+r.TopN], r.TopLogprobs[slot : slot+r.TopN]
}

// checkSizes makes sure the library reads no slice past its end: it reads
// R + 1 offsets, DraftOffsets[R] draft tokens and uniforms, R entries of
// each per-request slice, the rows of the hidden and logits tensors, and
// the sparse supports (checkSupportSizes).
// It returns the rows of TargetHidden.
func (b *VerifyBatch) checkSizes(head *LMHead) (int, error) {
	if len(b.DraftOffsets) < 2 {
		return 0, &Error{Status: ErrOutOfRange, Message: "DraftOffsets: needs R + 1 ≥ 2 entries"}
	}
	requests := len(b.DraftOffsets) - 1
	drafts := int(b.DraftOffsets[requests])
	rows, err := rowsOf(b.TargetHidden, head.hidden, "TargetHidden")
	if err != nil {
		return 0, err
	}
	if drafts < 0 || rows != drafts+requests {
		return 0, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("TargetHidden: %d rows, expected DraftOffsets[R] + R = %d", rows, drafts+requests)}
	}
	perDraft, perRequest := fmt.Sprintf("DraftOffsets[R] = %d", drafts), fmt.Sprintf("%d requests", requests)
	for _, s := range []struct {
		name    string
		given   bool
		n, want int
		of      string
	}{
		{"DraftTokens", true, len(b.DraftTokens), drafts, perDraft},
		{"AcceptUniforms", b.AcceptUniforms != nil, len(b.AcceptUniforms), drafts, perDraft},
		{"DraftParents", b.DraftParents != nil, len(b.DraftParents), drafts, perDraft},
		{"Temperatures", b.Temperatures != nil, len(b.Temperatures), requests, perRequest},
		{"DraftTemperatures", b.DraftTemperatures != nil, len(b.DraftTemperatures), requests, perRequest},
		{"Seeds", b.Seeds != nil, len(b.Seeds), requests, perRequest},
		{"RequestIDs", b.RequestIDs != nil, len(b.RequestIDs), requests, perRequest},
		{"Steps", b.Steps != nil, len(b.Steps), requests, perRequest},
	} {
		if s.given && s.n < s.want {
			return 0, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("%s: %d entries for %s", s.name, s.n, s.of)}
		}
	}
	if b.DraftLogits != nil {
		lrows, err := rowsOf(b.DraftLogits, head.vocab, "DraftLogits")
		if err != nil {
			return 0, err
		}
		if lrows != drafts {
			return 0, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("DraftLogits: %d rows, expected DraftOffsets[R] = %d", lrows, drafts)}
		}
	}
	if err := b.checkSupportSizes(drafts); err != nil {
		return 0, err
	}
	if b.TopLogprobs < 0 || b.TopLogprobs > MaxTopLogprobs {
		return 0, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("TopLogprobs: %d, outside [0, %d]", b.TopLogprobs, MaxTopLogprobs)}
	}
	if b.Controls != nil {
		if _, err := b.Controls.check("Controls", requests, rows, head.vocab, "requests"); err != nil {
			return 0, err
		}
	}
	if b.DraftControls != nil {
		if _, err := b.DraftControls.check("DraftControls", requests, drafts, head.vocab, "requests"); err != nil {
			return 0, err
		}
	}
	return rows, nil
}

// cBatch checks the batch, then builds the C batch in a's buffers.
func (b *VerifyBatch) cBatch(a *arena, head *LMHead) (capi.Flashspec_verify_batch, func(), error) {
	rows, err := b.checkSizes(head)
	if err != nil {
		return nil, nil, err
	}
	var cleanup []func()
	hidden := capi.Flashspec_tensor_make(in(a, b.TargetHidden), capi.FLASHSPEC_DTYPE_F32, capi.FLASHSPEC_MEMORY_HOST, int64(rows), int64(head.hidden))
	cleanup = append(cleanup, func() { capi.DeleteFlashspec_tensor(hidden) })
	batch := capi.NewFlashspec_verify_batch()
	cleanup = append(cleanup, func() { capi.DeleteFlashspec_verify_batch(batch) })
	capi.Flashspec_verify_batch_init(batch)
	batch.SetNum_requests(len(b.DraftOffsets) - 1)
	batch.SetDraft_offsets(in(a, b.DraftOffsets))
	batch.SetDraft_tokens(in(a, b.DraftTokens))
	batch.SetTarget_hidden(hidden)
	if len(b.DraftLogits) > 0 { // empty: no drafts, nothing to score against
		lrows := len(b.DraftLogits) / head.vocab
		logits := capi.Flashspec_tensor_make(in(a, b.DraftLogits), capi.FLASHSPEC_DTYPE_F32, capi.FLASHSPEC_MEMORY_HOST, int64(lrows), int64(head.vocab))
		cleanup = append(cleanup, func() { capi.DeleteFlashspec_tensor(logits) })
		batch.SetDraft_logits(logits)
	}
	batch.SetTemperatures(in(a, b.Temperatures))
	batch.SetDraft_temperatures(in(a, b.DraftTemperatures))
	batch.SetSeeds(in(a, b.Seeds))
	batch.SetRequest_ids(in(a, b.RequestIDs))
	batch.SetSteps(in(a, b.Steps))
	batch.SetAccept_uniforms(in(a, b.AcceptUniforms))
	batch.SetDraft_parents(in(a, b.DraftParents))
	batch.SetDraft_support_offsets(in(a, b.DraftSupportOffsets))
	batch.SetDraft_support_tokens(in(a, b.DraftSupportTokens))
	batch.SetDraft_support_probs(in(a, b.DraftSupportProbs))
	batch.SetMax_draft_len(b.MaxDraftLen)
	for _, c := range []struct {
		controls *SamplingControls
		name     string
		rows     int
		set      func(capi.Flashspec_sampling_controls)
	}{
		{b.Controls, "Controls", rows, batch.SetControls},
		{b.DraftControls, "DraftControls", rows - (len(b.DraftOffsets) - 1), batch.SetDraft_controls},
	} {
		if c.controls == nil {
			continue
		}
		// checkSizes has checked them; this gives the words per mask row.
		words, _ := c.controls.check(c.name, len(b.DraftOffsets)-1, c.rows, head.vocab, "requests")
		controls := c.controls.cControls(a, words)
		cleanup = append(cleanup, func() { capi.DeleteFlashspec_sampling_controls(controls) })
		c.set(controls)
	}
	if b.Logprobs {
		batch.SetLogprobs(1)
	}
	batch.SetTop_logprobs(b.TopLogprobs)
	if b.Greedy {
		batch.SetGreedy(1)
	}
	return batch, func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}, nil
}

func (c *Context) finalizeWith(b *VerifyBatch, head *LMHead, fn func(raw capi.Struct_SS_flashspec_context, batch capi.Flashspec_verify_batch, result capi.Flashspec_verify_result) capi.Enum_SS_flashspec_status) (*VerifyResult, error) {
	var a arena
	defer a.free()
	batch, release, err := b.cBatch(&a, head)
	if err != nil {
		return nil, err
	}
	defer release()
	// cBatch checked that TargetHidden has DraftOffsets[R] + R rows: the
	// library writes that many emitted tokens.
	requests := len(b.DraftOffsets) - 1
	emitted := int(b.DraftOffsets[requests]) + requests
	result := capi.NewFlashspec_verify_result()
	defer capi.DeleteFlashspec_verify_result(result)
	capi.Flashspec_verify_result_init(result)
	ap, ep, np := out[int32](&a, requests), out[int32](&a, emitted), out[uint64](&a, requests)
	result.SetAccepted_counts(uintptr(ap))
	result.SetEmitted_tokens(uintptr(ep))
	result.SetNext_steps(uintptr(np))
	// checkSizes bounded TopLogprobs by MaxTopLogprobs.
	var lp, rp, ttp, tlp, nodes unsafe.Pointer
	if b.DraftParents != nil {
		nodes = out[int32](&a, emitted)
		result.SetAccepted_nodes(uintptr(nodes))
	}
	if b.Logprobs {
		lp, rp = out[float32](&a, emitted), out[float32](&a, emitted)
		result.SetLogprobs(uintptr(lp))
		result.SetRaw_logprobs(uintptr(rp))
	}
	top := emitted * b.TopLogprobs
	if top > 0 {
		ttp, tlp = out[int32](&a, top), out[float32](&a, top)
		result.SetTop_tokens(uintptr(ttp))
		result.SetTop_logprobs(uintptr(tlp))
	}
	if err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return fn(raw, batch, result)
	}); err != nil {
		return nil, err
	}
	offsets := append([]int32(nil), b.DraftOffsets...)
	res := &VerifyResult{AcceptedCounts: back[int32](ap, requests), EmittedTokens: back[int32](ep, emitted),
		NextSteps: back[uint64](np, requests), offsets: offsets}
	if b.Logprobs {
		res.Logprobs, res.RawLogprobs = back[float32](lp, emitted), back[float32](rp, emitted)
	}
	if nodes != nil {
		res.AcceptedNodes = back[int32](nodes, emitted)
	}
	if top > 0 {
		res.TopTokens, res.TopLogprobs, res.TopN = back[int32](ttp, top), back[float32](tlp, top), b.TopLogprobs
	}
	return res, nil
}

// VerifyAndFinalize verifies the batch and runs Algorithm 1 on it.
func (c *Context) VerifyAndFinalize(head *LMHead, b *VerifyBatch) (*VerifyResult, error) {
	hr, err := head.handle()
	if err != nil {
		return nil, err
	}
	return c.finalizeWith(b, head, func(raw capi.Struct_SS_flashspec_context, batch capi.Flashspec_verify_batch, result capi.Flashspec_verify_result) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_verify_and_finalize(raw, hr, batch, result)
	})
}

// Summaries are the per-row summaries written by Verify and read by Finalize.
type Summaries struct {
	raw capi.Struct_SS_flashspec_summaries
}

// NewSummaries reserves summaries for maxRows target rows and maxRequests requests.
func (c *Context) NewSummaries(maxRows, maxRequests int) (*Summaries, error) {
	var a arena
	defer a.free()
	slot := out[uintptr](&a, 1)
	if err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_summaries_create(raw, maxRows, maxRequests, uintptr(slot))
	}); err != nil {
		return nil, err
	}
	return &Summaries{raw: capi.SwigcptrStruct_SS_flashspec_summaries(readHandle(slot))}, nil
}

// Close frees the summaries. Closing twice is a no-op.
func (s *Summaries) Close() error {
	if s.raw != nil {
		capi.Flashspec_summaries_destroy(s.raw)
		s.raw = nil
	}
	return nil
}

// Verify makes one pass over W for the batch, writing only summaries.
func (c *Context) Verify(head *LMHead, b *VerifyBatch, s *Summaries) error {
	hr, err := head.handle()
	if err != nil {
		return err
	}
	if s == nil || s.raw == nil {
		return errClosed
	}
	var a arena
	defer a.free()
	batch, release, err := b.cBatch(&a, head)
	if err != nil {
		return err
	}
	defer release()
	return c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_verify(raw, hr, batch, s.raw)
	})
}

// Finalize runs Algorithm 1 on the summaries of the last Verify of b.
func (c *Context) Finalize(head *LMHead, b *VerifyBatch, s *Summaries) (*VerifyResult, error) {
	if _, err := head.handle(); err != nil {
		return nil, err
	}
	if s == nil || s.raw == nil {
		return nil, errClosed
	}
	return c.finalizeWith(b, head, func(raw capi.Struct_SS_flashspec_context, batch capi.Flashspec_verify_batch, result capi.Flashspec_verify_result) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_finalize(raw, batch, s.raw, result)
	})
}

// ---- Randomness and the plugin table --------------------------------------

// RNGPurpose is a flashspec_rng_purpose.
type RNGPurpose int

// Purposes of the randomness contract.
var (
	RNGDraftNoise    = RNGPurpose(capi.FLASHSPEC_RNG_DRAFT_NOISE)
	RNGAcceptUniform = RNGPurpose(capi.FLASHSPEC_RNG_ACCEPT_UNIFORM)
	RNGResidualNoise = RNGPurpose(capi.FLASHSPEC_RNG_RESIDUAL_NOISE)
	RNGBonusNoise    = RNGPurpose(capi.FLASHSPEC_RNG_BONUS_NOISE)
)

// Philox4x32_10 is Philox4x32-10 of (counter, key).
func Philox4x32_10(counter [4]uint32, key [2]uint32) [4]uint32 {
	var a arena
	defer a.free()
	o := out[uint32](&a, 4)
	capi.Flashspec_philox4x32_10(in(&a, counter[:]), in(&a, key[:]), uintptr(o))
	var r [4]uint32
	copy(r[:], back[uint32](o, 4))
	return r
}

// RNGUniform is the contract's uniform in (0, 1) for one token and purpose.
func RNGUniform(seed, requestID, step uint64, position int32, purpose RNGPurpose, token int32) float64 {
	return capi.Flashspec_rng_uniform(seed, requestID, step, int(position), capi.Enum_SS_flashspec_rng_purpose(purpose), int(token))
}

// PluginTable describes the flashspec_api table a dlopen host resolves.
type PluginTable struct {
	StructSize uint32
	ABIVersion uint32
	api        capi.Flashspec_api
}

// GetAPI is flashspec_get_api: the table for abiVersion, or ok false.
func GetAPI(abiVersion uint) (table PluginTable, ok bool) {
	api := capi.Flashspec_get_api(abiVersion)
	if api == nil || api.Swigcptr() == 0 {
		return PluginTable{}, false
	}
	return PluginTable{StructSize: uint32(api.GetStruct_size()), ABIVersion: uint32(api.GetAbi_version()), api: api}, true
}

// VersionNumber calls the table's version_number member.
func (t PluginTable) VersionNumber() uint {
	fn := t.api.GetVersion_number()
	return uint(C.flashspec_go_call_unsigned(unsafe.Pointer(fn)))
}
