package flashspec

// The suffix drafter (SuffixDecoding, flashspec_drafter_create_suffix) and
// its draft trees (flashspec_suffix_drafter_propose_tree).

import (
	"fmt"
	"math"

	"github.com/flashspec/flashspec/bindings/go/internal/capi"
)

// MaxDraftLen is the most drafts one request may carry
// (FLASHSPEC_MAX_DRAFT_LEN), so the most nodes ProposeTree gives.
const MaxDraftLen = capi.FLASHSPEC_MAX_DRAFT_LEN

// SuffixOptions are the suffix drafter's parameters; start from
// DefaultSuffixOptions (the library defaults): every field is passed as
// is, and zero is meaningful for MinProbability, CacheMaxTokens and the
// costs. Ranges (the library checks them): MaxMatchLen and MaxDepth 1..64,
// MinProbability 0..1, CacheMaxTokens 0..2^24 (0: no cache of earlier
// outputs); costs ≥ 0 and finite, in units of one target forward.
type SuffixOptions struct {
	MaxMatchLen         int     // longest suffix of the sequence matched
	MaxDepth            int     // longest path proposed
	MinProbability      float64 // least score of a proposed token
	CacheMaxTokens      int     // tokens of earlier outputs kept
	CallCost, TokenCost float64
	// ProposeTrees: in an engine, draft trees of at most k nodes (the tree
	// of ProposeTree) instead of chains; the engine's forward then sees the
	// tree (NewTreeEngine, BatchForwardCall.Parents).
	ProposeTrees bool
}

// DefaultSuffixOptions are the library's defaults (flashspec_suffix_params_init).
func DefaultSuffixOptions() SuffixOptions {
	p := capi.NewFlashspec_suffix_params()
	defer capi.DeleteFlashspec_suffix_params(p)
	capi.Flashspec_suffix_params_init(p)
	return SuffixOptions{MaxMatchLen: p.GetMax_match_len(), MaxDepth: p.GetMax_depth(),
		MinProbability: p.GetMin_probability(), CacheMaxTokens: p.GetCache_max_tokens(),
		CallCost: p.GetCall_cost(), TokenCost: p.GetToken_cost(), ProposeTrees: p.GetPropose_trees() != 0}
}

// int32Field refuses a Go int that the int32_t field it fills cannot hold:
// the conversion would wrap it, maybe to a value the library accepts.
func int32Field(name string, v int) error {
	if v < math.MinInt32 || v > math.MaxInt32 {
		return &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("%s: %d does not fit in an int32", name, v)}
	}
	return nil
}

// NewSuffixDrafter creates the built-in suffix drafter: counted suffix
// tries over the current sequence and over a bounded cache of its earlier
// generations' outputs, drafting as deep as the counts are confident (see
// flashspec_drafter_create_suffix). An engine hands it each generation's
// final sequence, and a batched engine each finished sequence it served,
// so it learns across generations. o nil takes DefaultSuffixOptions().
// Out-of-range options are the library's ErrOutOfRange (a negative or
// non-finite cost its ErrInvalidArgument), naming the params field.
func (c *Context) NewSuffixDrafter(o *SuffixOptions) (*Drafter, error) {
	if o == nil {
		d := DefaultSuffixOptions()
		o = &d
	}
	for _, f := range []struct {
		name  string
		value int
	}{{"MaxMatchLen", o.MaxMatchLen}, {"MaxDepth", o.MaxDepth}, {"CacheMaxTokens", o.CacheMaxTokens}} {
		if err := int32Field(f.name, f.value); err != nil {
			return nil, err
		}
	}
	p := capi.NewFlashspec_suffix_params()
	defer capi.DeleteFlashspec_suffix_params(p)
	capi.Flashspec_suffix_params_init(p)
	p.SetMax_match_len(o.MaxMatchLen)
	p.SetMax_depth(o.MaxDepth)
	p.SetMin_probability(o.MinProbability)
	p.SetCache_max_tokens(o.CacheMaxTokens)
	p.SetCall_cost(o.CallCost)
	p.SetToken_cost(o.TokenCost)
	if o.ProposeTrees {
		p.SetPropose_trees(1)
	}
	var a arena
	defer a.free()
	slot := out[uintptr](&a, 1)
	if err := c.call(func(raw capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_drafter_create_suffix(raw, p, uintptr(slot))
	}); err != nil {
		return nil, err
	}
	return &Drafter{ctx: c, raw: capi.SwigcptrStruct_SS_flashspec_drafter(readHandle(slot))}, nil
}

// ProposeTree asks a suffix drafter for a draft tree after context (token
// ids ≥ 0, at least one), for a host that verifies trees itself
// (VerifyBatch.DraftParents). Node i has token tokens[i] and parent
// parents[i] in [-1, i) (-1: a child of the last context token): parents
// come before children, and no two children of a node share a token. Nodes
// are added best first, so the first n nodes of a larger budget are the
// tree of budget n; at most maxNodes (0..MaxDraftLen) of them, none when
// nothing matches. The binding sizes the output buffers to maxNodes, so
// the library never writes past them.
//
// A context that extends the one the drafter indexed last costs only its
// new tokens; any other starts a new sequence, and the previous one's
// output enters the cache of earlier outputs (hand a finished sequence's
// last tokens over with one more call on the whole sequence and maxNodes
// 0). Errors: ErrOutOfRange (maxNodes, checked first; the library's for an
// empty context or a negative token), ErrInvalidArgument (d is not a suffix
// drafter, or serves an engine's generation or a batched engine's sequence;
// the library's). Like the Context's methods, it must not run inside a
// callback of an engine on d's Context.
func (d *Drafter) ProposeTree(context []int32, maxNodes int) (tokens, parents []int32, err error) {
	if d.raw == nil {
		return nil, nil, errClosed
	}
	if maxNodes < 0 || maxNodes > MaxDraftLen {
		return nil, nil, &Error{Status: ErrOutOfRange, Message: fmt.Sprintf("maxNodes: must be in [0, %d], got %d", MaxDraftLen, maxNodes)}
	}
	if err := int32Field("context", len(context)); err != nil {
		return nil, nil, err
	}
	if context == nil {
		context = []int32{} // an empty context is the library's context_len error, not a NULL pointer
	}
	var a arena
	defer a.free()
	contextC := in(&a, context)
	tokensC, parentsC, countC := out[int32](&a, maxNodes), out[int32](&a, maxNodes), out[int32](&a, 1)
	if err := d.ctx.call(func(capi.Struct_SS_flashspec_context) capi.Enum_SS_flashspec_status {
		return capi.Flashspec_suffix_drafter_propose_tree(d.raw, contextC, len(context), maxNodes,
			uintptr(tokensC), uintptr(parentsC), uintptr(countC))
	}); err != nil {
		return nil, nil, err
	}
	n := int(back[int32](countC, 1)[0])
	if n < 0 || n > maxNodes {
		panic(fmt.Sprintf("flashspec: propose_tree reported %d nodes for a budget of %d", n, maxNodes))
	}
	return back[int32](tokensC, n), back[int32](parentsC, n), nil
}
