package flashspec

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// Tree steps from Go: a tree drafter whose right child comes after a
// decoy, a target whose forward runs the tree (each node's row from its
// path: its own token and its parent's), with Keep and without; at T = 0
// the engines emit the target's greedy tokens.

const treeV = 16

var treePrompt = []int32{3, 1, 4, 1}

// treeNext is the target's greedy next token after ..., a, b.
func treeNext(context []int32) int32 {
	b := int(context[len(context)-1])
	a := 0
	if len(context) > 1 {
		a = int(context[len(context)-2])
	}
	return int32((3*b + a + 1) % treeV)
}

func treeGreedy(n int) []int32 {
	context := append([]int32(nil), treePrompt...)
	for i := 0; i < n; i++ {
		context = append(context, treeNext(context))
	}
	return context[len(treePrompt):]
}

// decoyTree: per level a decoy (with a child of its own), then the right
// token, whose subtree is the next level.
func decoyTree(context []int32, maxNodes int) ([]int32, []int32, error) {
	var tokens, parents []int32
	path := append([]int32(nil), context...)
	parent := int32(-1)
	for len(tokens)+3 <= maxNodes {
		right := treeNext(path)
		decoy := (right + 5) % treeV
		base := int32(len(tokens))
		tokens = append(tokens, decoy, (decoy+1)%treeV, right)
		parents = append(parents, parent, base, parent)
		parent = base + 2
		path = append(path, right)
	}
	return tokens, parents, nil
}

// treeRows: token t's context is the cache, then its path through the call
// (parents[t], or t - 1); its row is the one-hot of the next token.
func treeRows(cache, tokens, parents []int32, numRows int) []float32 {
	var out []float32
	for t := len(tokens) - numRows; t < len(tokens); t++ {
		var path []int32
		for i := t; i >= 0; {
			path = append(path, tokens[i])
			if parents != nil && parents[i] >= 0 {
				i = int(parents[i])
			} else {
				i--
			}
		}
		context := append([]int32(nil), cache...)
		for i := len(path) - 1; i >= 0; i-- {
			context = append(context, path[i])
		}
		row := make([]float32, treeV)
		row[treeNext(context)] = 1
		out = append(out, row...)
	}
	return out
}

func newTreeFixture(t *testing.T) (*Context, *LMHead) {
	t.Helper()
	ctx, err := NewContext(&ContextOptions{Backend: BackendCPU, Seed: 5, CPUThreads: 1, MaxRows: 64})
	if err != nil {
		t.Fatal(err)
	}
	w := make([]float32, treeV*treeV)
	for v := 0; v < treeV; v++ {
		w[v*treeV+v] = 4
	}
	head, err := ctx.NewLMHead(w, treeV, treeV)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { head.Close(); ctx.Close() })
	return ctx, head
}

func TestTreeEngineGreedyEqualsGreedyDecoding(t *testing.T) {
	ctx, head := newTreeFixture(t)
	for _, withKeep := range []bool{true, false} {
		var cache []int32
		treeForwards, keeps := 0, 0
		forward := func(call *TargetCall) ([]float32, error) {
			if call.NumPast > len(cache) {
				return nil, errors.New("num_past beyond the cache")
			}
			cache = cache[:call.NumPast]
			rows := treeRows(cache, call.Tokens, call.Parents, call.NumRows)
			cache = append(cache, call.Tokens...)
			if call.Parents != nil {
				treeForwards++
			}
			return rows, nil
		}
		drafter, err := ctx.NewTreeDrafter(decoyTree, nil)
		if err != nil {
			t.Fatal(err)
		}
		o := DefaultEngineOptions()
		o.Drafters = []*Drafter{drafter}
		o.Arms = []Arm{{Drafter: drafter, DraftLen: 9}}
		o.Policy = PolicyFixed
		if withKeep {
			o.Keep = func(numPast int, keep []int32) error {
				kept := append([]int32(nil), cache[:numPast]...)
				for _, i := range keep {
					kept = append(kept, cache[numPast+int(i)])
				}
				cache = kept
				keeps++
				return nil
			}
		}
		engine, err := ctx.NewTreeEngine(head, forward, &o)
		if err != nil {
			t.Fatal(err)
		}
		tokens, _, err := engine.Generate(treePrompt, &GenerateOptions{Temperature: 0, MaxTokens: 30})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(tokens, treeGreedy(30)) {
			t.Fatalf("keep %v: %v, want %v", withKeep, tokens, treeGreedy(30))
		}
		m, err := engine.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		// Right children below decoys were accepted: paths deeper than one.
		if m.AcceptedTokens <= m.Steps || uint64(treeForwards) != m.Drafts || (keeps > 0) != withKeep {
			t.Fatalf("keep %v: metrics %+v, %d tree forwards, %d keeps", withKeep, m, treeForwards, keeps)
		}
		engine.Close()
		drafter.Close()
	}
}

func TestChainForwardRefusesATreeStep(t *testing.T) {
	ctx, head := newTreeFixture(t)
	drafter, err := ctx.NewTreeDrafter(decoyTree, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer drafter.Close()
	o := DefaultEngineOptions()
	o.Drafters = []*Drafter{drafter}
	o.DefaultDraftLen = 6
	engine, err := ctx.NewEngine(head, func(tokens []int32, numPast, numRows int) ([]float32, error) {
		return treeRows(nil, tokens, nil, numRows), nil
	}, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	_, _, err = engine.Generate(treePrompt, &GenerateOptions{MaxTokens: 8})
	if !errors.Is(err, ErrCallback) || !strings.Contains(err.Error(), "NewTreeEngine") {
		t.Fatalf("got %v", err)
	}
}

func TestBatchedTreeSequencesEqualGreedyDecoding(t *testing.T) {
	ctx, head := newTreeFixture(t)
	caches := map[uint64][]int32{}
	keeps := 0
	o := DefaultBatchEngineOptions()
	o.NumDrafters = 1
	o.Arms = []BatchArm{{Drafter: 0, DraftLen: 9}}
	o.Policy = PolicyFixed
	o.Keep = func(id uint64, numPast int, keep []int32) error {
		cache := caches[id]
		kept := append([]int32(nil), cache[:numPast]...)
		for _, i := range keep {
			kept = append(kept, cache[numPast+int(i)])
		}
		caches[id] = kept
		keeps++
		return nil
	}
	batch, err := ctx.NewBatchEngine(head, func(call *BatchForwardCall) ([]float32, error) {
		var rows []float32
		for s, id := range call.SequenceIDs {
			cache := caches[id][:call.NumPast[s]]
			rows = append(rows, treeRows(cache, call.TokensOf(s), call.ParentsOf(s), call.RowsOf(s))...)
			caches[id] = append(cache, call.TokensOf(s)...)
		}
		return rows, nil
	}, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer batch.Close()
	for id := uint64(0); id < 2; id++ {
		drafter, err := ctx.NewTreeDrafter(decoyTree, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := batch.AddSequence(id, treePrompt, &SequenceOptions{Drafters: []*Drafter{drafter}, MaxTokens: 20 + int(id)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Run(); err != nil {
		t.Fatal(err)
	}
	for id := uint64(0); id < 2; id++ {
		s, err := batch.Sequence(id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(s.Tokens, treeGreedy(20+int(id))) || s.Err != nil {
			t.Fatalf("sequence %d: %v (%v), want %v", id, s.Tokens, s.Err, treeGreedy(20+int(id)))
		}
	}
	if keeps == 0 {
		t.Fatal("no keep after tree steps")
	}
}
