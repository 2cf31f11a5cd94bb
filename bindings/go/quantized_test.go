package flashspec

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// e4m3Value is the value of an e4m3 ("e4m3fn") bit pattern: bias 7, 3
// mantissa bits, subnormals below exponent 1.
func e4m3Value(code uint8) float64 {
	sign := 1.0
	if code&0x80 != 0 {
		sign = -1
	}
	exponent, mantissa := int(code>>3)&0xF, float64(code&7)
	if exponent == 0 {
		return sign * mantissa * math.Pow(2, -9)
	}
	return sign * (1 + mantissa/8) * math.Pow(2, float64(exponent-7))
}

// e4m3Round is x rounded to the nearest e4m3 value, ties to even,
// saturating at ±448.
func e4m3Round(x float32) float64 {
	a := math.Abs(float64(x))
	if a == 0 {
		return 0
	}
	exponent := math.Max(math.Floor(math.Log2(a)), -6)
	step := math.Pow(2, exponent-3)
	q := math.Min(math.RoundToEven(a/step)*step, 448)
	if x < 0 {
		return -q
	}
	return q
}

// quantizeRef is the documented rule, in float32 as the library computes
// it: the dequantised [rows, cols] weights, row-major, in float64.
func quantizeRef(w []float32, rows, cols int, stored Dtype) []float64 {
	out := make([]float64, len(w))
	for v := 0; v < rows; v++ {
		row := w[v*cols : (v+1)*cols]
		var amax float32
		for _, x := range row {
			amax = float32(math.Max(float64(amax), math.Abs(float64(x))))
		}
		var scale float32
		if stored == DtypeE4M3 {
			scale = amax / 448
		} else {
			scale = amax / 127
		}
		if !(scale > 0) {
			scale = 1
		}
		for k, x := range row {
			q := x / scale // float32 division, as the library's
			var value float64
			if stored == DtypeE4M3 {
				value = e4m3Round(q)
			} else {
				value = math.Max(-127, math.Min(127, math.RoundToEven(float64(q))))
			}
			out[v*cols+k] = value * float64(scale)
		}
	}
	return out
}

// wellSeparatedHidden gives rows (a scaled vocabulary row plus noise each)
// and checks that every row's float64 logits have a clear winner.
func wellSeparatedHidden(t *testing.T, ref []float64, vocab, cols, rows int, seed int64) ([]float32, []int32) {
	t.Helper()
	r := rand.New(rand.NewSource(seed))
	h := make([]float32, rows*cols)
	want := make([]int32, rows)
	for i := 0; i < rows; i++ {
		pick := r.Intn(vocab)
		amax := 0.0
		for k := 0; k < cols; k++ {
			amax = math.Max(amax, math.Abs(ref[pick*cols+k]))
		}
		for k := 0; k < cols; k++ {
			h[i*cols+k] = float32(3*ref[pick*cols+k]/amax + 0.1*r.NormFloat64())
		}
		best, second := math.Inf(-1), math.Inf(-1)
		for v := 0; v < vocab; v++ {
			l := 0.0
			for k := 0; k < cols; k++ {
				l += float64(h[i*cols+k]) * ref[v*cols+k]
			}
			if l > best {
				best, second, want[i] = l, best, int32(v)
			} else if l > second {
				second = l
			}
		}
		if best-second <= 1e-3*math.Max(1, math.Abs(best)) {
			t.Fatalf("row %d: logits %g and %g are too close", i, best, second)
		}
	}
	return h, want
}

func assertGreedy(t *testing.T, ctx *Context, head *LMHead, ref []float64, seed int64) {
	t.Helper()
	h, want := wellSeparatedHidden(t, ref, testV, testD, 6, seed)
	tokens, _, err := ctx.Draft(head, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !equal(tokens, want) {
		t.Fatalf("greedy draft %v, float64 argmax of the dequantised weights %v", tokens, want)
	}
}

func newCPUContext(t *testing.T) *Context {
	t.Helper()
	ctx, err := NewContext(&ContextOptions{Backend: BackendCPU, Seed: 3, CPUThreads: 2, MaxRows: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

func TestQuantizedHeadsReadBackTheirDtype(t *testing.T) {
	ctx := newCPUContext(t)
	w := randomRows(rand.New(rand.NewSource(1)), testV, testD)
	for _, stored := range []Dtype{DtypeE4M3, DtypeI8} {
		head, err := ctx.NewLMHeadQuantized(w, testV, testD, stored)
		if err != nil {
			t.Fatal(err)
		}
		if head.Dtype() != stored || head.VocabSize() != testV || head.HiddenSize() != testD {
			t.Fatal(head.Dtype(), head.VocabSize(), head.HiddenSize())
		}
		head.Close()
	}
	head, err := ctx.NewLMHead(w, testV, testD)
	if err != nil {
		t.Fatal(err)
	}
	defer head.Close()
	if head.Dtype() != DtypeF32 || DtypeE4M3.String() != "e4m3" || DtypeI8.String() != "i8" {
		t.Fatal(head.Dtype(), DtypeE4M3, DtypeI8)
	}
}

func TestE4M3ReferenceKnowsTheDocumentedCodes(t *testing.T) {
	for code, want := range map[uint8]float64{0x38: 1, 0x40: 2, 0xB8: -1, 0x30: 0.5, 0x7E: 448, 0x01: math.Pow(2, -9)} {
		if got := e4m3Value(code); got != want {
			t.Fatalf("code %#x: %g, want %g", code, got, want)
		}
	}
	if e4m3Round(1.0625) != 1 || e4m3Round(1.1875) != 1.25 || e4m3Round(500) != 448 || e4m3Round(-0.001) != -0.001953125 {
		t.Fatal(e4m3Round(1.0625), e4m3Round(1.1875), e4m3Round(500), e4m3Round(-0.001))
	}
}

func TestGreedyDraftOfQuantisedHeadsMatchesTheDequantisedWeights(t *testing.T) {
	ctx := newCPUContext(t)
	w := randomRows(rand.New(rand.NewSource(4)), testV, testD)
	for i, stored := range []Dtype{DtypeE4M3, DtypeI8} {
		head, err := ctx.NewLMHeadQuantized(w, testV, testD, stored)
		if err != nil {
			t.Fatal(err)
		}
		assertGreedy(t, ctx, head, quantizeRef(w, testV, testD, stored), int64(10+i))
		head.Close()
	}
}

func TestPrequantisedCodesWithScales(t *testing.T) {
	ctx := newCPUContext(t)
	r := rand.New(rand.NewSource(5))
	scales := make([]float32, testV)
	for v := range scales {
		scales[v] = float32(0.001 + 0.01*r.Float64())
	}
	i8 := make([]int8, testV*testD)
	e4 := make([]uint8, testV*testD)
	refI8 := make([]float64, testV*testD)
	refE4 := make([]float64, testV*testD)
	for i := range i8 {
		i8[i] = int8(r.Intn(256) - 128)
		e4[i] = uint8(r.Intn(256))
		if e4[i]&0x7F == 0x7F {
			e4[i] = 0x38 // no NaN pattern
		}
	}
	copy(e4, []uint8{0x38, 0x40, 0xB8, 0x30}) // 1, 2, -1, 0.5
	for i := range i8 {
		s := float64(scales[i/testD])
		refI8[i] = float64(i8[i]) * s
		refE4[i] = e4m3Value(e4[i]) * s
	}
	head, err := ctx.NewLMHeadInt8Codes(i8, scales, testV, testD)
	if err != nil {
		t.Fatal(err)
	}
	defer head.Close()
	if head.Dtype() != DtypeI8 {
		t.Fatal(head.Dtype())
	}
	assertGreedy(t, ctx, head, refI8, 20)
	head8, err := ctx.NewLMHeadE4M3Codes(e4, scales, testV, testD)
	if err != nil {
		t.Fatal(err)
	}
	defer head8.Close()
	if head8.Dtype() != DtypeE4M3 {
		t.Fatal(head8.Dtype())
	}
	assertGreedy(t, ctx, head8, refE4, 21)
}

func TestQuantisedHeadBadInput(t *testing.T) {
	ctx := newCPUContext(t)
	w := randomRows(rand.New(rand.NewSource(6)), testV, testD)
	codes := make([]int8, testV*testD)
	ones := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = 1
		}
		return s
	}
	withScale := func(v float32) []float32 {
		s := ones(testV)
		s[testV/2] = v
		return s
	}
	nanCodes := make([]uint8, testV*testD)
	nanCodes[5] = 0x7F
	cases := []struct {
		name   string
		status Status
		word   string
		call   func() (*LMHead, error)
	}{
		{"stored f32", ErrDtypeMismatch, "stored", func() (*LMHead, error) { return ctx.NewLMHeadQuantized(w, testV, testD, DtypeF32) }},
		{"stored bf16", ErrDtypeMismatch, "stored", func() (*LMHead, error) { return ctx.NewLMHeadQuantized(w, testV, testD, DtypeBF16) }},
		{"scales missing", ErrInvalidArgument, "scales", func() (*LMHead, error) { return ctx.NewLMHeadInt8Codes(codes, nil, testV, testD) }},
		{"scales short", ErrInvalidArgument, "scales", func() (*LMHead, error) { return ctx.NewLMHeadInt8Codes(codes, ones(testV-1), testV, testD) }},
		{"scales long", ErrInvalidArgument, "scales", func() (*LMHead, error) { return ctx.NewLMHeadInt8Codes(codes, ones(testV+1), testV, testD) }},
		{"negative scale", ErrNonFinite, "scales", func() (*LMHead, error) { return ctx.NewLMHeadInt8Codes(codes, withScale(-1), testV, testD) }},
		{"NaN scale", ErrNonFinite, "scales", func() (*LMHead, error) {
			return ctx.NewLMHeadInt8Codes(codes, withScale(float32(math.NaN())), testV, testD)
		}},
		{"Inf scale", ErrNonFinite, "scales", func() (*LMHead, error) {
			return ctx.NewLMHeadInt8Codes(codes, withScale(float32(math.Inf(1))), testV, testD)
		}},
		{"NaN code", ErrNonFinite, "weight", func() (*LMHead, error) { return ctx.NewLMHeadE4M3Codes(nanCodes, ones(testV), testV, testD) }},
		{"codes too short", ErrOutOfRange, "weight", func() (*LMHead, error) { return ctx.NewLMHeadInt8Codes(codes[1:], ones(testV), testV, testD) }},
		{"weights too long", ErrOutOfRange, "weight", func() (*LMHead, error) { return ctx.NewLMHeadQuantized(w, testV-1, testD, DtypeI8) }},
	}
	for _, c := range cases {
		head, err := c.call()
		if err == nil {
			head.Close()
			t.Fatalf("%s: no error", c.name)
		}
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, c.status) || !strings.Contains(e.Message, c.word) {
			t.Fatalf("%s: %v, want %s naming %q", c.name, err, c.status.Name(), c.word)
		}
	}
}
