package flashspec

// The C side of the engine callbacks: functions exported to C that the
// library calls through the function pointers of engine_params, the
// callback drafter and generate_params, and of the batched engine's
// batch_engine_params and sequence_params. user_data is a runtime/cgo.Handle
// of the Go state. A Go error or panic never unwinds into C: it is stored
// in the state and the trampoline returns a failure code, which makes the
// engine call fail with FLASHSPEC_ERR_CALLBACK.
//
// (A file with //export may only declare C in its preamble; the helpers
// that take these functions' addresses live in engine.go.)

// #cgo pkg-config: flashspec
// #include <stdint.h>
// #include "flashspec.h"
import "C"

import (
	"fmt"
	"runtime/cgo"
	"unsafe"
)

// guard runs fn and turns an error or a panic into a failure code recorded
// in f.
func guard(f *failure, where string, fn func() error) (rc C.int) {
	defer func() {
		if r := recover(); r != nil {
			f.record(where, fmt.Errorf("panic: %v", r))
			rc = 1
		}
	}()
	if err := fn(); err != nil {
		f.record(where, err)
		return 1
	}
	return 0
}

//export flashspecGoTargetForward
func flashspecGoTargetForward(userData unsafe.Pointer, call *C.flashspec_target_call) C.int {
	st := cgo.Handle(uintptr(userData)).Value().(*engineState)
	return guard(&st.failure, "target forward", func() error { return st.forward(call) })
}

//export flashspecGoTargetRollback
func flashspecGoTargetRollback(userData unsafe.Pointer, numKeep C.int32_t) C.int {
	st := cgo.Handle(uintptr(userData)).Value().(*engineState)
	return guard(&st.failure, "target rollback", func() error { return st.rollback(int(numKeep)) })
}

//export flashspecGoTargetKeep
func flashspecGoTargetKeep(userData unsafe.Pointer, numPast C.int32_t, keep *C.int32_t, numKeep C.int32_t) C.int {
	st := cgo.Handle(uintptr(userData)).Value().(*engineState)
	indices := back[int32](unsafe.Pointer(keep), int(numKeep))
	return guard(&st.failure, "target keep", func() error { return st.keep(int(numPast), indices) })
}

//export flashspecGoToken
func flashspecGoToken(userData unsafe.Pointer, token C.int32_t) C.int {
	st := cgo.Handle(uintptr(userData)).Value().(*engineState)
	stop := false
	if rc := guard(&st.failure, "token callback", func() error {
		stop = st.onToken(int32(token))
		return nil
	}); rc != 0 {
		return rc
	}
	if stop {
		return 1
	}
	return 0
}

//export flashspecGoDraft
func flashspecGoDraft(userData unsafe.Pointer, call *C.flashspec_draft_call) C.int {
	st := cgo.Handle(uintptr(userData)).Value().(*drafterState)
	return guard(&st.failure, "draft callback", func() error { return st.draft(call) })
}

//export flashspecGoBatchTargetForward
func flashspecGoBatchTargetForward(userData unsafe.Pointer, call *C.flashspec_batch_target_call) C.int {
	st := cgo.Handle(uintptr(userData)).Value().(*batchEngineState)
	return guard(&st.failure, "target forward", func() error { return st.forward(call) })
}

//export flashspecGoBatchTargetRollback
func flashspecGoBatchTargetRollback(userData unsafe.Pointer, sequenceID C.uint64_t, numKeep C.int32_t) C.int {
	st := cgo.Handle(uintptr(userData)).Value().(*batchEngineState)
	return guard(&st.failure, "target rollback", func() error { return st.back(uint64(sequenceID), int(numKeep)) })
}

//export flashspecGoBatchTargetKeep
func flashspecGoBatchTargetKeep(userData unsafe.Pointer, sequenceID C.uint64_t, numPast C.int32_t, keep *C.int32_t, numKeep C.int32_t) C.int {
	st := cgo.Handle(uintptr(userData)).Value().(*batchEngineState)
	indices := back[int32](unsafe.Pointer(keep), int(numKeep))
	return guard(&st.failure, "target keep", func() error { return st.keep(uint64(sequenceID), int(numPast), indices) })
}

//export flashspecGoSequenceToken
func flashspecGoSequenceToken(userData unsafe.Pointer, sequenceID C.uint64_t, token C.int32_t) C.int {
	seq := cgo.Handle(uintptr(userData)).Value().(*batchSequence)
	stop := false
	// A failure stops this sequence only: the library sees a request to stop.
	if rc := guard(&seq.failure, "token callback", func() error {
		stop = seq.onToken(uint64(sequenceID), int32(token))
		return nil
	}); rc != 0 {
		return rc
	}
	if stop {
		return 1
	}
	return 0
}
